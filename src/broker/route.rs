//! Routing decisions of the embedded broker (CORE 11.2 Delivery, Retain): which connected client
//! gets a PUBLISH at which QoS and packet id, how the retained store changes, and which retained
//! messages a SUBSCRIBE replays. Pure functions over explicit inputs (each client's `Session`, the
//! retained store, one message), tested cell by cell below.
//!
//! It never touches a socket, a channel, a thread, a lock or a clock: the connection code calls it
//! under the state lock and then queues the packets it describes. There are no persistent sessions
//! (CleanSession=0 is treated as clean), so a `Session` lives exactly as long as its connection.

use std::collections::BTreeMap;

use super::topic;

/// One connected client's routing state: its subscriptions (filter, granted QoS) and the packet
/// id its next QoS 1 delivery gets.
#[derive(Debug)]
pub struct Session {
    subs: Vec<(String, u8)>,
    next_pid: u16,
}

impl Default for Session {
    fn default() -> Self {
        Session { subs: Vec::new(), next_pid: 1 }
    }
}

impl Session {
    /// A fresh packet id: 1, 2, ... 65535, then 1 again (0 is not a valid packet id).
    pub fn next_pid(&mut self) -> u16 {
        let p = self.next_pid;
        self.next_pid = if p == u16::MAX { 1 } else { p + 1 };
        p
    }

    /// Drops every subscription whose filter is exactly one of `filters`.
    pub fn unsubscribe(&mut self, filters: &[&str]) {
        self.subs.retain(|(f, _)| !filters.contains(&f.as_str()));
    }
}

/// A retained message: the payload and the QoS it was published with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retained {
    pub payload: Vec<u8>,
    pub qos: u8,
}

/// Retained messages by topic; sorted, so a subscribe replays them in topic order.
pub type RetainedStore = BTreeMap<String, Retained>;

/// One inbound PUBLISH, as decoded.
#[derive(Debug, Clone, Copy)]
pub struct Publish<'a> {
    pub topic: &'a str,
    pub payload: &'a [u8],
    pub qos: u8,
    pub retain: bool,
}

/// Why a PUBLISH is refused; the connection is closed (MQTT 3.1.1 has no negative PUBACK).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// QoS 2 is not supported (CORE 11.2).
    Qos2,
    /// The topic is empty or holds a wildcard or NUL.
    InvalidTopic,
}

/// How a PUBLISH changes the retained store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetainOp {
    /// Store (or replace) the topic's retained message.
    Set(Retained),
    /// An empty retained payload clears the topic's retained message.
    Clear,
}

impl RetainOp {
    pub fn apply(self, store: &mut RetainedStore, topic: &str) {
        match self {
            RetainOp::Set(r) => {
                store.insert(topic.to_string(), r);
            }
            RetainOp::Clear => {
                store.remove(topic);
            }
        }
    }
}

/// One copy of a PUBLISH for one client: `to` is the client's position in the sessions given to
/// `route`; `pid` is 0 at QoS 0. Forwarded copies never carry the retain flag (MQTT 3.1.1
/// 3.3.1.3: it is set only when replaying a retained message on subscribe).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    pub to: usize,
    pub qos: u8,
    pub pid: u16,
}

/// What `route` decided for one PUBLISH.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routed {
    /// In the order of the sessions given, at most one per client.
    pub deliveries: Vec<Delivery>,
    pub retain: Option<RetainOp>,
}

/// Routes one PUBLISH from any client (the sender included, if subscribed: MQTT 3.1.1 has no
/// no-local) to `sessions`. A client whose filters overlap gets one copy at min(published QoS,
/// highest grant among its matching filters), as mosquitto does; QoS 1 copies take the client's
/// next packet id. Nothing changes when the message is refused.
pub fn route<'s>(sessions: impl IntoIterator<Item = &'s mut Session>, msg: &Publish<'_>) -> Result<Routed, Refusal> {
    if msg.qos >= 2 {
        return Err(Refusal::Qos2);
    }
    if !topic::valid_topic_name(msg.topic) {
        return Err(Refusal::InvalidTopic);
    }
    let retain = msg.retain.then(|| {
        if msg.payload.is_empty() {
            RetainOp::Clear
        } else {
            RetainOp::Set(Retained { payload: msg.payload.to_vec(), qos: msg.qos })
        }
    });
    let mut deliveries = Vec::new();
    for (to, s) in sessions.into_iter().enumerate() {
        let Some(qos) = topic::delivery_qos(&s.subs, msg.topic, msg.qos) else {
            continue;
        };
        let pid = if qos > 0 { s.next_pid() } else { 0 };
        deliveries.push(Delivery { to, qos, pid });
    }
    Ok(Routed { deliveries, retain })
}

/// One retained message a SUBSCRIBE replays, with the retain flag set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replay<'r> {
    pub topic: &'r str,
    pub payload: &'r [u8],
    pub qos: u8,
    pub pid: u16,
}

/// What `subscribe` decided for one SUBSCRIBE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscribed<'r> {
    /// SUBACK return codes, one per filter: the granted QoS (0 or 1) or 0x80 for an invalid filter.
    pub codes: Vec<u8>,
    /// Retained messages to send after the SUBACK, in topic order.
    pub replay: Vec<Replay<'r>>,
}

/// Adds (or re-grants) `filters` to `session`, QoS capped at 1, and picks the retained messages to
/// replay: one copy per topic even when several filters match it, at min(retained QoS, highest
/// grant among those filters of this SUBSCRIBE).
pub fn subscribe<'r>(session: &mut Session, retained: &'r RetainedStore, filters: &[(&str, u8)]) -> Subscribed<'r> {
    let mut codes = Vec::with_capacity(filters.len());
    // Retained messages to deliver: topic -> granted QoS (one copy per topic, highest QoS).
    let mut deliver: BTreeMap<&str, u8> = BTreeMap::new();
    for &(f, q) in filters {
        if !topic::valid_filter(f) {
            codes.push(0x80);
            continue;
        }
        let g = q.min(1);
        codes.push(g);
        match session.subs.iter_mut().find(|(sf, _)| sf == f) {
            Some(s) => s.1 = g,
            None => session.subs.push((f.to_string(), g)),
        }
        for (t, _) in retained.iter().filter(|(t, _)| topic::matches(f, t)) {
            let e = deliver.entry(t.as_str()).or_insert(g);
            *e = (*e).max(g);
        }
    }
    let mut replay = Vec::with_capacity(deliver.len());
    for (t, g) in deliver {
        let r = &retained[t];
        let qos = r.qos.min(g);
        let pid = if qos > 0 { session.next_pid() } else { 0 };
        replay.push(Replay { topic: t, payload: &r.payload, qos, pid });
    }
    Subscribed { codes, replay }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(subs: &[(&str, u8)]) -> Session {
        Session { subs: subs.iter().map(|(f, q)| (f.to_string(), *q)).collect(), ..Session::default() }
    }

    fn publish<'a>(topic: &'a str, payload: &'a [u8], qos: u8, retain: bool) -> Publish<'a> {
        Publish { topic, payload, qos, retain }
    }

    /// (client position, qos, pid) of each delivery.
    fn routed(sessions: &mut [Session], msg: Publish<'_>) -> Vec<(usize, u8, u16)> {
        let r = route(sessions.iter_mut(), &msg).unwrap();
        r.deliveries.iter().map(|d| (d.to, d.qos, d.pid)).collect()
    }

    fn store(items: &[(&str, &[u8], u8)]) -> RetainedStore {
        items.iter().map(|(t, p, q)| (t.to_string(), Retained { payload: p.to_vec(), qos: *q })).collect()
    }

    #[test]
    fn no_subscribers_no_deliveries() {
        assert_eq!(routed(&mut [], publish("a", b"x", 1, false)), vec![]);
        let mut s = [session(&[("b", 1)]), session(&[])];
        assert_eq!(routed(&mut s, publish("a", b"x", 1, false)), vec![]);
    }

    #[test]
    fn overlapping_filters_give_one_copy_at_the_highest_grant() {
        let mut s = [session(&[("a/#", 0), ("a/+", 1), ("a/b", 0)])];
        assert_eq!(routed(&mut s, publish("a/b", b"x", 1, false)), vec![(0, 1, 1)]);
        // Only the matching filters count: a/+ does not match a/b/c.
        assert_eq!(routed(&mut s, publish("a/b/c", b"x", 1, false)), vec![(0, 0, 0)]);
    }

    #[test]
    fn qos_is_downgraded_to_the_grant_and_never_raised() {
        let mut s = [session(&[("t", 0)]), session(&[("t", 1)])];
        assert_eq!(routed(&mut s, publish("t", b"x", 1, false)), vec![(0, 0, 0), (1, 1, 1)]);
        assert_eq!(routed(&mut s, publish("t", b"x", 0, false)), vec![(0, 0, 0), (1, 0, 0)]);
    }

    #[test]
    fn wildcards_plus_and_hash() {
        let mut s = [session(&[("a/+/c", 1)]), session(&[("a/#", 1)]), session(&[("#", 1)]), session(&[("+", 1)])];
        assert_eq!(routed(&mut s, publish("a/b/c", b"x", 0, false)), vec![(0, 0, 0), (1, 0, 0), (2, 0, 0)]);
        assert_eq!(routed(&mut s, publish("a", b"x", 0, false)), vec![(1, 0, 0), (2, 0, 0), (3, 0, 0)]);
        assert_eq!(routed(&mut s, publish("a/b/c/d", b"x", 0, false)), vec![(1, 0, 0), (2, 0, 0)]);
        assert_eq!(routed(&mut s, publish("b/x", b"x", 0, false)), vec![(2, 0, 0)]);
    }

    #[test]
    fn dollar_topics_are_not_matched_by_leading_wildcards() {
        let mut s = [session(&[("#", 1)]), session(&[("+/x", 1)]), session(&[("$SYS/#", 1)])];
        assert_eq!(routed(&mut s, publish("$SYS/x", b"x", 1, false)), vec![(2, 1, 1)]);
    }

    #[test]
    fn the_sender_gets_its_own_message_when_subscribed() {
        // Sessions do not know who sent the message: MQTT 3.1.1 has no no-local, so the
        // publishing client's own matching subscription is served like any other.
        let mut s = [session(&[("t", 1)])];
        assert_eq!(routed(&mut s, publish("t", b"x", 1, false)), vec![(0, 1, 1)]);
    }

    #[test]
    fn packet_ids_are_per_client_and_skip_zero() {
        let mut s = [session(&[("t", 1)]), session(&[("t", 1)])];
        assert_eq!(routed(&mut s, publish("t", b"x", 1, false)), vec![(0, 1, 1), (1, 1, 1)]);
        // QoS 0 copies take no packet id.
        assert_eq!(routed(&mut s, publish("t", b"x", 0, false)), vec![(0, 0, 0), (1, 0, 0)]);
        assert_eq!(routed(&mut s[1..], publish("t", b"x", 1, false)), vec![(0, 1, 2)]);
        assert_eq!(routed(&mut s, publish("t", b"x", 1, false)), vec![(0, 1, 2), (1, 1, 3)]);
        s[0].next_pid = u16::MAX;
        assert_eq!(routed(&mut s[..1], publish("t", b"x", 1, false)), vec![(0, 1, u16::MAX)]);
        assert_eq!(routed(&mut s[..1], publish("t", b"x", 1, false)), vec![(0, 1, 1)]);
    }

    #[test]
    fn retained_set_replace_and_clear_by_empty_payload() {
        let mut st = RetainedStore::new();
        let r = route([], &publish("t", b"one", 1, true)).unwrap();
        assert_eq!(r.retain, Some(RetainOp::Set(Retained { payload: b"one".to_vec(), qos: 1 })));
        r.retain.unwrap().apply(&mut st, "t");
        assert_eq!(st, store(&[("t", b"one", 1)]));
        let r = route([], &publish("t", b"two", 0, true)).unwrap();
        r.retain.unwrap().apply(&mut st, "t");
        assert_eq!(st, store(&[("t", b"two", 0)]), "a new retained message replaces the old, QoS included");
        assert_eq!(route([], &publish("t", b"live", 1, false)).unwrap().retain, None, "retain=0 leaves the store");
        let r = route([], &publish("t", b"", 0, true)).unwrap();
        assert_eq!(r.retain, Some(RetainOp::Clear));
        r.retain.unwrap().apply(&mut st, "t");
        assert!(st.is_empty(), "an empty retained payload clears the topic");
        // Clearing a topic with nothing retained is not an error.
        RetainOp::Clear.apply(&mut st, "t");
        assert!(st.is_empty());
    }

    #[test]
    fn a_retained_publish_is_forwarded_without_the_retain_flag_to_current_subscribers() {
        // Forwarded copies are plain deliveries (the caller encodes retain=0); a clearing publish
        // still reaches current subscribers, as mosquitto does.
        let mut s = [session(&[("t", 1)])];
        assert_eq!(routed(&mut s, publish("t", b"x", 1, true)), vec![(0, 1, 1)]);
        assert_eq!(routed(&mut s, publish("t", b"", 0, true)), vec![(0, 0, 0)]);
    }

    #[test]
    fn refusals_change_nothing() {
        let mut s = [session(&[("#", 1)])];
        assert_eq!(route(s.iter_mut(), &publish("t", b"x", 2, true)), Err(Refusal::Qos2));
        for bad in ["", "a/+", "a/#", "a\0b"] {
            assert_eq!(route(s.iter_mut(), &publish(bad, b"x", 1, true)), Err(Refusal::InvalidTopic), "{bad:?}");
        }
        // QoS 2 is refused before the topic is looked at.
        assert_eq!(route(s.iter_mut(), &publish("a/#", b"x", 2, false)), Err(Refusal::Qos2));
        assert_eq!(s[0].next_pid, 1, "no packet id was taken");
    }

    #[test]
    fn subscribe_grants_at_most_qos_1_and_refuses_invalid_filters() {
        let mut s = Session::default();
        let st = RetainedStore::new();
        let r = subscribe(&mut s, &st, &[("a", 0), ("b", 1), ("c", 2), ("a/#/b", 1), ("", 0)]);
        assert_eq!(r.codes, vec![0, 1, 1, 0x80, 0x80]);
        assert_eq!(s.subs, vec![("a".to_string(), 0), ("b".to_string(), 1), ("c".to_string(), 1)]);
        assert!(r.replay.is_empty());
        // Subscribing to the same filter again replaces its grant instead of adding a filter.
        subscribe(&mut s, &st, &[("a", 1)]);
        assert_eq!(s.subs[0], ("a".to_string(), 1));
        assert_eq!(s.subs.len(), 3);
        s.unsubscribe(&["a", "zzz"]);
        assert_eq!(s.subs, vec![("b".to_string(), 1), ("c".to_string(), 1)]);
    }

    #[test]
    fn subscribe_replays_matching_retained_once_per_topic_at_the_lower_qos() {
        let st = store(&[("a/1", b"p1", 1), ("a/2", b"p2", 0), ("b", b"pb", 1), ("$SYS/x", b"sys", 1)]);
        let mut s = Session::default();
        // a/1 matches both filters: one copy at the higher grant. a/2 was retained at QoS 0.
        let r = subscribe(&mut s, &st, &[("a/#", 0), ("a/1", 1), ("#", 0)]);
        assert_eq!(r.codes, vec![0, 1, 0]);
        let got: Vec<(&str, &[u8], u8, u16)> = r.replay.iter().map(|p| (p.topic, p.payload, p.qos, p.pid)).collect();
        assert_eq!(got, vec![("a/1", &b"p1"[..], 1, 1), ("a/2", &b"p2"[..], 0, 0), ("b", &b"pb"[..], 0, 0)]);
        // Live routing continues the same packet id sequence.
        assert_eq!(routed(std::slice::from_mut(&mut s), publish("a/1", b"x", 1, false)), vec![(0, 1, 2)]);
        // A subscription granted QoS 0 downgrades a QoS 1 retained message; $-topics need a $ filter.
        let mut s = Session::default();
        let r = subscribe(&mut s, &st, &[("$SYS/+", 0)]);
        assert_eq!(r.replay, vec![Replay { topic: "$SYS/x", payload: b"sys", qos: 0, pid: 0 }]);
    }
}
