//! Routing decisions of the embedded broker (CORE 11.2 Delivery, Retain, Auth): whether a CONNECT's
//! credentials are accepted (compared in constant time), which client gets a PUBLISH at
//! which QoS, how the retained store changes within its byte caps, and which retained
//! messages a SUBSCRIBE replays within the per-client subscription cap. Pure functions over explicit
//! inputs (each client's `Session`, the retained store, one message, the limits), tested cell by
//! cell below.
//!
//! It never touches a socket, a channel, a thread, a lock or a clock: the connection code calls it
//! under the state lock, hands each delivery to the target's `session::Session` (packet ids, QoS
//! 1/2 state, queuing for a client that is away) and then queues the packets it describes.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::session::Session;
use super::topic;

/// A retained message: the payload and the QoS it was published with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retained {
    /// Shared with the state file's snapshots (`persist`), so taking one copies no payload.
    pub payload: Arc<[u8]>,
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
    /// The topic is empty or holds a wildcard or NUL (MQTT-3.3.2-2, MQTT-4.7.3-1).
    InvalidTopic,
}

/// The retained store's caps (CORE 11.2 Retained, issue 12 item 4): no single retained message
/// larger than `max_message` payload bytes is stored, and the store never holds more than
/// `max_total` bytes (topic plus payload of every entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetainLimits {
    pub max_message: usize,
    pub max_total: usize,
}

/// Why a retained message was not stored (it is still forwarded to current subscribers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetainOver {
    /// The payload alone is larger than `max_message`.
    Message { size: usize, max: usize },
    /// Storing it would take the store past `max_total` (`used` bytes are held now).
    Total { size: usize, used: usize, max: usize },
}

/// What one retained entry costs against `RetainLimits::max_total`.
pub fn retained_cost(topic: &str, r: &Retained) -> usize {
    topic.len() + r.payload.len()
}

/// Applies `op` to `store` unless it breaks `limits`; `used` is the store's byte count
/// (`retained_cost` summed), kept in step. A refused op leaves both unchanged. Clearing is always
/// allowed; replacing a topic's message counts only the difference.
pub fn apply_retain(
    store: &mut RetainedStore,
    used: &mut usize,
    topic: &str,
    op: RetainOp,
    limits: &RetainLimits,
) -> Result<(), RetainOver> {
    let old = store.get(topic).map(|r| retained_cost(topic, r)).unwrap_or(0);
    match op {
        RetainOp::Clear => {
            if store.remove(topic).is_some() {
                *used -= old;
            }
            Ok(())
        }
        RetainOp::Set(r) => {
            if r.payload.len() > limits.max_message {
                return Err(RetainOver::Message { size: r.payload.len(), max: limits.max_message });
            }
            let new = retained_cost(topic, &r);
            let after = *used - old + new;
            if after > limits.max_total {
                return Err(RetainOver::Total { size: new, used: *used, max: limits.max_total });
            }
            store.insert(topic.to_string(), r);
            *used = after;
            Ok(())
        }
    }
}

/// Byte-wise equality that takes the same time wherever the inputs differ (only their lengths
/// show): the broker's password comparison, so a client cannot learn a password prefix by timing.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().max(b.len());
    let mut diff = u8::from(a.len() != b.len());
    for i in 0..n {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= std::hint::black_box(x ^ y);
    }
    std::hint::black_box(diff) == 0
}

/// The CONNACK code for a CONNECT's credentials (CORE 11.2 Auth): 0 accepted, 0x05 no username
/// (or a password without one), 0x04 wrong username or password. `want` is the broker's
/// `(username, password)`; None accepts anyone. Username and password are both compared in
/// constant time, and both are always compared, so the time does not tell which one was wrong.
pub fn authorize(want: Option<(&str, &[u8])>, user: Option<&str>, pass: Option<&[u8]>) -> u8 {
    let Some((want_user, want_pass)) = want else { return 0x00 };
    let Some(user) = user else { return 0x05 };
    let user_ok = constant_time_eq(user.as_bytes(), want_user.as_bytes());
    let pass_ok = constant_time_eq(pass.unwrap_or(b""), want_pass) && pass.is_some();
    if user_ok & pass_ok {
        0x00
    } else {
        0x04
    }
}

/// How a PUBLISH changes the retained store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetainOp {
    /// Store (or replace) the topic's retained message.
    Set(Retained),
    /// An empty retained payload clears the topic's retained message.
    Clear,
}

/// One copy of a PUBLISH for one client: `to` is the client's position in the sessions given to
/// `route`, `qos` the delivery QoS (the session assigns the packet id). Forwarded copies never
/// carry the retain flag (MQTT-3.3.1-9: it is set only when replaying a retained message on
/// subscribe).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    pub to: usize,
    pub qos: u8,
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
/// highest grant among its matching filters) (MQTT-3.3.5-1), as mosquitto does.
pub fn route<'s>(sessions: impl IntoIterator<Item = &'s Session>, msg: &Publish<'_>) -> Result<Routed, Refusal> {
    if !topic::valid_topic_name(msg.topic) {
        return Err(Refusal::InvalidTopic);
    }
    let retain = msg.retain.then(|| {
        if msg.payload.is_empty() {
            RetainOp::Clear
        } else {
            RetainOp::Set(Retained { payload: msg.payload.into(), qos: msg.qos })
        }
    });
    let mut deliveries = Vec::new();
    for (to, s) in sessions.into_iter().enumerate() {
        let Some(qos) = topic::delivery_qos(&s.subs, msg.topic, msg.qos) else {
            continue;
        };
        deliveries.push(Delivery { to, qos });
    }
    Ok(Routed { deliveries, retain })
}

/// One retained message a SUBSCRIBE replays, with the retain flag set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replay<'r> {
    pub topic: &'r str,
    pub payload: &'r [u8],
    pub qos: u8,
}

/// What `subscribe` decided for one SUBSCRIBE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscribed<'r> {
    /// SUBACK return codes, one per filter: the granted QoS (the requested one, MQTT-3.9.3-1) or
    /// 0x80 for an invalid filter.
    pub codes: Vec<u8>,
    /// Retained messages to send after the SUBACK, in topic order.
    pub replay: Vec<Replay<'r>>,
    /// Valid filters refused (0x80) because the client already holds `max_subs` subscriptions.
    pub over_cap: usize,
}

/// The one `$SYS` topic the broker answers (issue 19, as mosquitto does): a subscription matching it
/// gets `mam broker <version>` replayed as if retained, which is how `mam broker check` tells the
/// embedded broker from others. Nothing is stored; the subscriber's own grant applies (QoS 0).
pub const VERSION_TOPIC: &str = "$SYS/broker/version";
/// `VERSION_TOPIC`'s payload.
pub const VERSION_TEXT: &str = concat!("mam broker ", env!("CARGO_PKG_VERSION"));

/// Adds (or re-grants: MQTT-3.8.4-3) `filters` to `session` at the requested QoS, and picks the retained messages to
/// replay: one copy per topic even when several filters match it, at min(retained QoS, highest
/// grant among those filters of this SUBSCRIBE). A new filter beyond `max_subs` subscriptions of
/// this client is refused with 0x80 (re-granting a filter it holds is always allowed).
pub fn subscribe<'r>(
    session: &mut Session,
    retained: &'r RetainedStore,
    max_subs: usize,
    filters: &[(&str, u8)],
) -> Subscribed<'r> {
    let mut codes = Vec::with_capacity(filters.len());
    let mut over_cap = 0;
    // Retained messages to deliver: topic -> granted QoS (one copy per topic, highest QoS).
    let mut deliver: BTreeMap<&str, u8> = BTreeMap::new();
    let mut version = false;
    for &(f, q) in filters {
        if !topic::valid_filter(f) {
            codes.push(0x80);
            continue;
        }
        let g = q.min(2);
        let held = session.subs.len();
        match session.subs.iter_mut().find(|(sf, _)| sf == f) {
            Some(s) => s.1 = g,
            None if held >= max_subs => {
                codes.push(0x80);
                over_cap += 1;
                continue;
            }
            None => session.subs.push((f.to_string(), g)),
        }
        codes.push(g);
        version |= topic::matches(f, VERSION_TOPIC);
        for (t, _) in retained.iter().filter(|(t, _)| topic::matches(f, t)) {
            let e = deliver.entry(t.as_str()).or_insert(g);
            *e = (*e).max(g);
        }
    }
    let mut replay = Vec::with_capacity(deliver.len());
    for (t, g) in deliver {
        if t == VERSION_TOPIC {
            continue; // the broker's own answer below, whatever a client stored there
        }
        let r = &retained[t];
        replay.push(Replay { topic: t, payload: &r.payload, qos: r.qos.min(g) });
    }
    if version {
        replay.push(Replay { topic: VERSION_TOPIC, payload: VERSION_TEXT.as_bytes(), qos: 0 });
    }
    Subscribed { codes, replay, over_cap }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(subs: &[(&str, u8)]) -> Session {
        let mut s = Session::default();
        s.subs = subs.iter().map(|(f, q)| (f.to_string(), *q)).collect();
        s
    }

    fn publish<'a>(topic: &'a str, payload: &'a [u8], qos: u8, retain: bool) -> Publish<'a> {
        Publish { topic, payload, qos, retain }
    }

    /// (client position, qos) of each delivery.
    fn routed(sessions: &mut [Session], msg: Publish<'_>) -> Vec<(usize, u8)> {
        let r = route(sessions.iter(), &msg).unwrap();
        r.deliveries.iter().map(|d| (d.to, d.qos)).collect()
    }

    fn store(items: &[(&str, &[u8], u8)]) -> RetainedStore {
        items.iter().map(|(t, p, q)| (t.to_string(), Retained { payload: (*p).into(), qos: *q })).collect()
    }

    #[test]
    fn no_subscribers_no_deliveries() {
        assert_eq!(routed(&mut [], publish("a", b"x", 1, false)), vec![]);
        let mut s = [session(&[("b", 1)]), session(&[])];
        assert_eq!(routed(&mut s, publish("a", b"x", 1, false)), vec![]);
    }

    #[test]
    fn mqtt_3_3_5_1_overlapping_filters_give_one_copy_at_the_highest_grant() {
        let mut s = [session(&[("a/#", 0), ("a/+", 1), ("a/b", 0)])];
        assert_eq!(routed(&mut s, publish("a/b", b"x", 1, false)), vec![(0, 1)]);
        // Only the matching filters count: a/+ does not match a/b/c.
        assert_eq!(routed(&mut s, publish("a/b/c", b"x", 1, false)), vec![(0, 0)]);
    }

    #[test]
    fn qos_is_downgraded_to_the_grant_and_never_raised() {
        let mut s = [session(&[("t", 0)]), session(&[("t", 1)]), session(&[("t", 2)])];
        assert_eq!(routed(&mut s, publish("t", b"x", 2, false)), vec![(0, 0), (1, 1), (2, 2)]);
        assert_eq!(routed(&mut s, publish("t", b"x", 1, false)), vec![(0, 0), (1, 1), (2, 1)]);
        assert_eq!(routed(&mut s, publish("t", b"x", 0, false)), vec![(0, 0), (1, 0), (2, 0)]);
    }

    #[test]
    fn wildcards_plus_and_hash() {
        let mut s = [session(&[("a/+/c", 1)]), session(&[("a/#", 1)]), session(&[("#", 1)]), session(&[("+", 1)])];
        assert_eq!(routed(&mut s, publish("a/b/c", b"x", 0, false)), vec![(0, 0), (1, 0), (2, 0)]);
        assert_eq!(routed(&mut s, publish("a", b"x", 0, false)), vec![(1, 0), (2, 0), (3, 0)]);
        assert_eq!(routed(&mut s, publish("a/b/c/d", b"x", 0, false)), vec![(1, 0), (2, 0)]);
        assert_eq!(routed(&mut s, publish("b/x", b"x", 0, false)), vec![(2, 0)]);
    }

    #[test]
    fn mqtt_4_7_2_1_dollar_topics_are_not_matched_by_leading_wildcards() {
        let mut s = [session(&[("#", 1)]), session(&[("+/x", 1)]), session(&[("$SYS/#", 1)])];
        assert_eq!(routed(&mut s, publish("$SYS/x", b"x", 1, false)), vec![(2, 1)]);
    }

    #[test]
    fn the_sender_gets_its_own_message_when_subscribed() {
        // Sessions do not know who sent the message: MQTT 3.1.1 has no no-local, so the
        // publishing client's own matching subscription is served like any other.
        let mut s = [session(&[("t", 1)])];
        assert_eq!(routed(&mut s, publish("t", b"x", 1, false)), vec![(0, 1)]);
    }

    #[test]
    fn retained_set_replace_and_clear_by_empty_payload() {
        let mut st = RetainedStore::new();
        let mut used = 0;
        let big = RetainLimits { max_message: 1 << 20, max_total: 1 << 20 };
        let mut apply =
            |op: RetainOp, st: &mut RetainedStore, t: &str| apply_retain(st, &mut used, t, op, &big).unwrap();
        let r = route([], &publish("t", b"one", 1, true)).unwrap();
        assert_eq!(r.retain, Some(RetainOp::Set(Retained { payload: b"one"[..].into(), qos: 1 })));
        apply(r.retain.unwrap(), &mut st, "t");
        assert_eq!(st, store(&[("t", b"one", 1)]));
        let r = route([], &publish("t", b"two", 0, true)).unwrap();
        apply(r.retain.unwrap(), &mut st, "t");
        assert_eq!(st, store(&[("t", b"two", 0)]), "a new retained message replaces the old, QoS included");
        assert_eq!(route([], &publish("t", b"live", 1, false)).unwrap().retain, None, "retain=0 leaves the store");
        let r = route([], &publish("t", b"", 0, true)).unwrap();
        assert_eq!(r.retain, Some(RetainOp::Clear));
        apply(r.retain.unwrap(), &mut st, "t");
        assert!(st.is_empty(), "an empty retained payload clears the topic");
        // Clearing a topic with nothing retained is not an error.
        apply(RetainOp::Clear, &mut st, "t");
        assert!(st.is_empty());
    }

    #[test]
    fn a_retained_publish_is_forwarded_without_the_retain_flag_to_current_subscribers() {
        // Forwarded copies are plain deliveries (the caller encodes retain=0); a clearing publish
        // still reaches current subscribers, as mosquitto does.
        let mut s = [session(&[("t", 1)])];
        assert_eq!(routed(&mut s, publish("t", b"x", 1, true)), vec![(0, 1)]);
        assert_eq!(routed(&mut s, publish("t", b"", 0, true)), vec![(0, 0)]);
    }

    #[test]
    fn refusals_change_nothing() {
        let s = [session(&[("#", 1)])];
        for bad in ["", "a/+", "a/#", "a\0b"] {
            assert_eq!(route(s.iter(), &publish(bad, b"x", 1, true)), Err(Refusal::InvalidTopic), "{bad:?}");
        }
    }

    #[test]
    fn mqtt_3_9_3_subscribe_grants_the_requested_qos_and_refuses_invalid_filters() {
        let mut s = Session::default();
        let st = RetainedStore::new();
        let r = subscribe(&mut s, &st, 100, &[("a", 0), ("b", 1), ("c", 2), ("a/#/b", 1), ("", 0)]);
        assert_eq!(r.codes, vec![0, 1, 2, 0x80, 0x80]);
        assert_eq!(s.subs, vec![("a".to_string(), 0), ("b".to_string(), 1), ("c".to_string(), 2)]);
        assert!(r.replay.is_empty());
        // Subscribing to the same filter again replaces its grant instead of adding a filter.
        subscribe(&mut s, &st, 100, &[("a", 1)]);
        assert_eq!(s.subs[0], ("a".to_string(), 1));
        assert_eq!(s.subs.len(), 3);
        s.unsubscribe(&["a", "zzz"]);
        assert_eq!(s.subs, vec![("b".to_string(), 1), ("c".to_string(), 2)]);
    }

    /// Issue 19: `$SYS/broker/version` names the embedded broker, as mosquitto's names mosquitto,
    /// whatever a client retained there, and `#` does not reach it ($-topics need a $ filter).
    #[test]
    fn a_subscription_to_sys_broker_version_gets_the_brokers_own_version() {
        let st = store(&[(VERSION_TOPIC, b"forged", 1)]);
        let mut s = Session::default();
        for f in [VERSION_TOPIC, "$SYS/broker/+", "$SYS/#"] {
            let r = subscribe(&mut s, &st, 100, &[(f, 1)]);
            let got: Vec<(&str, &[u8], u8)> = r.replay.iter().map(|p| (p.topic, p.payload, p.qos)).collect();
            assert_eq!(got, vec![(VERSION_TOPIC, VERSION_TEXT.as_bytes(), 0)], "{f}");
        }
        assert!(VERSION_TEXT.starts_with("mam broker ") && VERSION_TEXT.ends_with(env!("CARGO_PKG_VERSION")));
        assert!(subscribe(&mut Session::default(), &st, 100, &[("#", 1)]).replay.is_empty());
        // Refused over the cap: nothing replayed.
        let mut full = session(&[("x", 0)]);
        assert!(subscribe(&mut full, &st, 1, &[(VERSION_TOPIC, 0)]).replay.is_empty());
    }

    #[test]
    fn subscribe_replays_matching_retained_once_per_topic_at_the_lower_qos() {
        let st = store(&[("a/1", b"p1", 1), ("a/2", b"p2", 0), ("b", b"pb", 1), ("$SYS/x", b"sys", 1)]);
        let mut s = Session::default();
        // a/1 matches both filters: one copy at the higher grant. a/2 was retained at QoS 0.
        let r = subscribe(&mut s, &st, 100, &[("a/#", 0), ("a/1", 1), ("#", 0)]);
        assert_eq!(r.codes, vec![0, 1, 0]);
        let got: Vec<(&str, &[u8], u8)> = r.replay.iter().map(|p| (p.topic, p.payload, p.qos)).collect();
        assert_eq!(got, vec![("a/1", &b"p1"[..], 1), ("a/2", &b"p2"[..], 0), ("b", &b"pb"[..], 0)]);
        // A subscription granted QoS 0 downgrades a QoS 1 retained message; $-topics need a $ filter.
        let mut s = Session::default();
        let r = subscribe(&mut s, &st, 100, &[("$SYS/+", 0)]);
        assert_eq!(r.replay, vec![Replay { topic: "$SYS/x", payload: b"sys", qos: 0 }]);
    }

    #[test]
    fn subscriptions_beyond_the_cap_are_refused_but_regrants_are_not() {
        let mut s = Session::default();
        let st = RetainedStore::new();
        let r = subscribe(&mut s, &st, 2, &[("a", 1), ("b", 1), ("c", 1), ("", 0)]);
        assert_eq!((r.codes, r.over_cap), (vec![1, 1, 0x80, 0x80], 1));
        let r = subscribe(&mut s, &st, 2, &[("a", 0), ("d", 1)]);
        assert_eq!((r.codes, r.over_cap), (vec![0, 0x80], 1), "a held filter is re-granted at the cap");
        s.unsubscribe(&["b"]);
        assert_eq!(subscribe(&mut s, &st, 2, &[("d", 1)]).codes, vec![1], "room again after an unsubscribe");
    }

    #[test]
    fn retained_caps_refuse_without_changing_the_store() {
        let limits = RetainLimits { max_message: 4, max_total: 10 };
        let (mut st, mut used) = (RetainedStore::new(), 0);
        let set = |p: &[u8]| RetainOp::Set(Retained { payload: p.into(), qos: 1 });
        assert_eq!(apply_retain(&mut st, &mut used, "t", set(b"abcd"), &limits), Ok(()));
        assert_eq!(used, 5);
        assert_eq!(
            apply_retain(&mut st, &mut used, "u", set(b"abcde"), &limits),
            Err(RetainOver::Message { size: 5, max: 4 })
        );
        assert_eq!(apply_retain(&mut st, &mut used, "u", set(b"abc"), &limits), Ok(()));
        assert_eq!(used, 9);
        assert_eq!(
            apply_retain(&mut st, &mut used, "v", set(b"ab"), &limits),
            Err(RetainOver::Total { size: 3, used: 9, max: 10 })
        );
        assert_eq!((st.len(), used), (2, 9), "a refused message changes nothing");
        // Replacing counts the difference; clearing frees the entry's bytes.
        assert_eq!(apply_retain(&mut st, &mut used, "t", set(b"a"), &limits), Ok(()));
        assert_eq!(used, 6);
        assert_eq!(apply_retain(&mut st, &mut used, "u", RetainOp::Clear, &limits), Ok(()));
        assert_eq!(apply_retain(&mut st, &mut used, "zz", RetainOp::Clear, &limits), Ok(()));
        assert_eq!((st.len(), used), (1, 2));
    }

    #[test]
    fn credentials_are_compared_in_full() {
        assert!(constant_time_eq(b"", b"") && constant_time_eq(b"s3cret", b"s3cret"));
        for (a, b) in [(&b"s3cret"[..], &b"s3creT"[..]), (b"s3cret", b"s3cre"), (b"s3cret", b"s3cret\0"), (b"", b"x")] {
            assert!(!constant_time_eq(a, b) && !constant_time_eq(b, a), "{a:?} {b:?}");
        }
        let want = Some(("mam", &b"pw"[..]));
        assert_eq!(authorize(None, None, None), 0);
        assert_eq!(authorize(want, Some("mam"), Some(b"pw")), 0);
        assert_eq!(authorize(want, None, None), 5);
        assert_eq!(authorize(want, None, Some(b"pw")), 5);
        assert_eq!(authorize(want, Some("mam"), None), 4);
        assert_eq!(authorize(want, Some("mam"), Some(b"pX")), 4);
        assert_eq!(authorize(want, Some("mAm"), Some(b"pw")), 4);
        // An empty configured password still needs the password field.
        assert_eq!(authorize(Some(("u", b"")), Some("u"), None), 4);
        assert_eq!(authorize(Some(("u", b"")), Some("u"), Some(b"")), 0);
    }
}
