//! One client session of the embedded broker (MQTT 3.1.1 section 4.1, CORE 11.2 Sessions and
//! Delivery): its subscriptions, the packet-id state machines of QoS 1 and 2 in both directions
//! (outbound: PUBLISH -> PUBACK, or PUBLISH -> PUBREC -> PUBREL -> PUBCOMP; inbound QoS 2: the
//! packet ids received and not yet released), and the messages queued for a persistent session
//! while its client is away, within the per-session limits.
//!
//! Pure state over explicit inputs: it never touches a socket, a channel, a lock or a clock. The
//! connection code asks it what to send (`Send`) and encodes and queues that itself.

use std::collections::VecDeque;
use std::sync::Arc;

/// Default per-session limit on QoS 1/2 messages unacknowledged or queued (as mosquitto's
/// `max_queued_messages` 1000).
pub const DEFAULT_SESSION_MESSAGES: usize = 1000;
/// Default per-session limit on the payload and topic bytes of those messages.
pub const DEFAULT_SESSION_BYTES: usize = 16 * 1024 * 1024;
/// A connected client may have this many QoS 1/2 messages unacknowledged (the packet-id space
/// less one): a live subscriber that reads but acknowledges late is slowed by the outbound
/// queue's backpressure, not dropped at the away limit.
pub const LIVE_MESSAGES: usize = u16::MAX as usize - 1;
/// ... and at most this many times the away limit's bytes.
pub const LIVE_BYTES_FACTOR: usize = 4;
/// Default broker-wide limit on the QoS 1/2 messages held by every session whose client is away
/// (issue 29: without it 1000 stored sessions could hold 1000 messages each).
pub const DEFAULT_MAX_QUEUED_MESSAGES: usize = 100_000;
/// Default broker-wide limit on the topic and payload bytes of those messages.
pub const DEFAULT_MAX_QUEUED_BYTES: usize = 128 * 1024 * 1024;

/// One message as a session holds it: shared by every session it was routed to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Msg {
    pub topic: Arc<str>,
    pub payload: Arc<[u8]>,
    /// The delivery QoS (already min(published, granted)).
    pub qos: u8,
    /// Set only for a retained message replayed on subscribe (MQTT-3.3.1-8, MQTT-3.3.1-9).
    pub retain: bool,
}

impl Msg {
    fn cost(&self) -> usize {
        self.topic.len() + self.payload.len()
    }
}

/// What the broker must send on the client's connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Send {
    /// A PUBLISH; `pid` is 0 at QoS 0; `dup` marks a re-delivery (MQTT-3.3.1-1).
    Publish { msg: Msg, pid: u16, dup: bool },
    /// PUBREL for an outbound QoS 2 message whose PUBREC arrived (MQTT-4.3.3-2).
    Pubrel(u16),
}

/// Where an outbound QoS 1/2 message stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// PUBLISH sent (or to be re-sent), waiting for PUBACK (QoS 1) or PUBREC (QoS 2).
    Published,
    /// PUBREL sent, waiting for PUBCOMP (QoS 2).
    Released,
}

#[derive(Debug, Clone)]
struct Inflight {
    pid: u16,
    msg: Msg,
    stage: Stage,
}

/// The per-session limits: while the client is away, at most `messages` QoS 1/2 messages
/// unacknowledged or queued, holding at most `bytes` of topic and payload (while it is connected,
/// `LIVE_MESSAGES` and `LIVE_BYTES_FACTOR` x `bytes`). A message past either is dropped (the newest one, as
/// mosquitto does), and the drop is reported so the caller logs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub messages: usize,
    pub bytes: usize,
}

/// What `deliver` did with one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivered {
    /// Send this now.
    Send(Send),
    /// Kept for the client's return (a persistent session whose client is away).
    Queued,
    /// QoS 0 for a client that is away: not kept (MQTT-3.1.2-5 makes queuing QoS 0 optional).
    Skipped,
    /// Over the session's limits; `first` is true for the first drop since the session was last
    /// under them (the caller logs that one).
    Dropped { first: bool },
    /// For a client that is away, over the broker-wide limits of `Away`: `first` as above, per
    /// session.
    DroppedTotal { first: bool },
}

/// What the sessions of every away client hold together (QoS 1/2 messages in flight when the
/// client left, and queued since), against the broker-wide limits. Only a delivery to an away
/// session adds to it (acknowledgements need a connected client); a client's return or discard
/// takes its session's share out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Away {
    pub messages: usize,
    pub bytes: usize,
}

impl Away {
    /// `s`'s client left (or `s` came back from the state file): its messages count from now on.
    pub fn add(&mut self, s: &Session) {
        self.messages += s.pending();
        self.bytes += s.bytes;
    }

    /// `s`'s client returned, or the away session was discarded.
    pub fn remove(&mut self, s: &Session) {
        self.messages = self.messages.saturating_sub(s.pending());
        self.bytes = self.bytes.saturating_sub(s.bytes);
    }

    /// Whether one more message of `cost` bytes (`Msg::cost`) stays within `max` (messages, bytes).
    fn room(&self, cost: usize, max: &Limits) -> bool {
        self.messages < max.messages && self.bytes + cost <= max.bytes
    }
}

/// A session as `Session::save` exports it and `Session::restore` takes it back.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Saved {
    pub subs: Vec<(String, u8)>,
    pub next_pid: u16,
    /// In the order they were sent.
    pub inflight: Vec<SavedInflight>,
    pub queued: Vec<Msg>,
    pub incoming: Vec<u16>,
}

/// One outbound QoS 1/2 message in flight: `released` once its PUBREC came (PUBREL sent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedInflight {
    pub pid: u16,
    pub msg: Msg,
    pub released: bool,
}

/// One client's session state.
#[derive(Debug)]
pub struct Session {
    pub(super) subs: Vec<(String, u8)>,
    next_pid: u16,
    /// Outbound QoS 1/2 messages sent and not yet completed, in the order they were sent.
    inflight: VecDeque<Inflight>,
    /// Outbound QoS 1/2 messages routed while the client was away, in order.
    queued: VecDeque<Msg>,
    /// Bytes of `inflight` and `queued` (`Msg::cost` summed).
    bytes: usize,
    /// Inbound QoS 2 packet ids whose PUBLISH was routed and whose PUBREL has not come.
    incoming: Vec<u16>,
    /// A message was dropped at the limits and the session has not come under them since.
    over_limit: bool,
}

impl Default for Session {
    fn default() -> Self {
        Session {
            subs: Vec::new(),
            next_pid: 1,
            inflight: VecDeque::new(),
            queued: VecDeque::new(),
            bytes: 0,
            incoming: Vec::new(),
            over_limit: false,
        }
    }
}

impl Session {
    /// A packet id not used by a message in flight: 1, 2, ... 65535, then 1 again (0 is not a
    /// valid packet id; MQTT-2.3.1-2 forbids reusing one that is still in use).
    fn next_pid(&mut self) -> u16 {
        loop {
            let p = self.next_pid;
            self.next_pid = if p == u16::MAX { 1 } else { p + 1 };
            if !self.inflight.iter().any(|m| m.pid == p) {
                return p;
            }
        }
    }

    /// Drops every subscription whose filter is exactly one of `filters` (MQTT-3.10.4-1);
    /// messages already in flight or queued are still completed (MQTT-3.10.4-3).
    pub fn unsubscribe(&mut self, filters: &[&str]) {
        self.subs.retain(|(f, _)| !filters.contains(&f.as_str()));
    }

    /// QoS 1/2 messages unacknowledged or queued.
    pub fn pending(&self) -> usize {
        self.inflight.len() + self.queued.len()
    }

    /// Bytes those messages hold.
    #[cfg(test)]
    pub fn pending_bytes(&self) -> usize {
        self.bytes
    }

    /// Takes one routed message for this client whose client is away, within the session's limits
    /// `lim` and the limits `total` of every away session together (`away` holds their count and is
    /// updated when the message is queued). Past the total the newest message is dropped, as past
    /// the session's own limits: what was queued first is what its client gets.
    pub fn deliver_away(&mut self, msg: Msg, lim: &Limits, away: &mut Away, total: &Limits) -> Delivered {
        if msg.qos != 0 && !away.room(msg.cost(), total) {
            let first = !self.over_limit;
            self.over_limit = true;
            return Delivered::DroppedTotal { first };
        }
        let cost = msg.cost();
        let d = self.deliver(msg, false, lim);
        if d == Delivered::Queued {
            away.messages += 1;
            away.bytes += cost;
        }
        d
    }

    /// Takes one routed message for this client; `online` is whether its client is connected.
    pub fn deliver(&mut self, msg: Msg, online: bool, lim: &Limits) -> Delivered {
        if msg.qos == 0 {
            return if online {
                Delivered::Send(Send::Publish { msg, pid: 0, dup: false })
            } else {
                Delivered::Skipped
            };
        }
        let cost = msg.cost();
        let (max_n, max_b) = if online {
            (LIVE_MESSAGES, lim.bytes.saturating_mul(LIVE_BYTES_FACTOR))
        } else {
            (lim.messages, lim.bytes)
        };
        if self.pending() >= max_n || self.bytes + cost > max_b {
            let first = !self.over_limit;
            self.over_limit = true;
            return Delivered::Dropped { first };
        }
        self.over_limit = false;
        self.bytes += cost;
        if !online {
            self.queued.push_back(msg);
            return Delivered::Queued;
        }
        let pid = self.next_pid();
        self.inflight.push_back(Inflight { pid, msg: msg.clone(), stage: Stage::Published });
        Delivered::Send(Send::Publish { msg, pid, dup: false })
    }

    fn complete(&mut self, i: usize) {
        if let Some(m) = self.inflight.remove(i) {
            self.bytes -= m.msg.cost();
        }
    }

    /// A PUBACK from the client: completes the QoS 1 message `pid` (MQTT-4.3.2-1); an unknown
    /// id is ignored.
    pub fn puback(&mut self, pid: u16) {
        if let Some(i) = self.inflight.iter().position(|m| m.pid == pid && m.msg.qos == 1) {
            self.complete(i);
        }
    }

    /// A PUBREC from the client: the QoS 2 message `pid` is received; the answer is PUBREL
    /// (MQTT-4.3.3-1: the message is not re-sent after this). A PUBREC for an id that is not a
    /// QoS 2 message in flight gets no answer.
    pub fn pubrec(&mut self, pid: u16) -> Option<Send> {
        let m = self.inflight.iter_mut().find(|m| m.pid == pid && m.msg.qos == 2)?;
        m.stage = Stage::Released;
        Some(Send::Pubrel(pid))
    }

    /// A PUBCOMP from the client: the QoS 2 message `pid` is done and its id free again.
    pub fn pubcomp(&mut self, pid: u16) {
        if let Some(i) = self.inflight.iter().position(|m| m.pid == pid && m.stage == Stage::Released) {
            self.complete(i);
        }
    }

    /// An inbound QoS 2 PUBLISH with `pid`: true when it is new and must be routed, false for a
    /// duplicate whose PUBREL has not come yet (routed once only: MQTT-4.3.3-2, Method B). The
    /// answer is PUBREC either way.
    pub fn incoming_qos2(&mut self, pid: u16) -> bool {
        if self.incoming.contains(&pid) {
            return false;
        }
        self.incoming.push(pid);
        true
    }

    /// An inbound PUBREL: the packet id is released (the answer is PUBCOMP, known id or not:
    /// MQTT-4.3.3-2 needs PUBCOMP also after a reconnect lost the state).
    pub fn incoming_release(&mut self, pid: u16) {
        self.incoming.retain(|&p| p != pid);
    }

    /// The client has (re)connected to this session: everything in flight is re-sent with its
    /// original packet id, unacknowledged PUBLISHes with DUP set and PUBRELs as PUBREL
    /// (MQTT-4.4.0-1), then the queued messages in order.
    pub fn resume(&mut self) -> Vec<Send> {
        let mut out: Vec<Send> = self
            .inflight
            .iter()
            .map(|m| match m.stage {
                Stage::Published => Send::Publish { msg: m.msg.clone(), pid: m.pid, dup: true },
                Stage::Released => Send::Pubrel(m.pid),
            })
            .collect();
        while let Some(msg) = self.queued.pop_front() {
            let pid = self.next_pid();
            self.inflight.push_back(Inflight { pid, msg: msg.clone(), stage: Stage::Published });
            out.push(Send::Publish { msg, pid, dup: false });
        }
        out
    }

    /// The session as the state file keeps it (`persist`): everything but the drop episode flag.
    pub fn save(&self) -> Saved {
        Saved {
            subs: self.subs.clone(),
            next_pid: self.next_pid,
            inflight: self
                .inflight
                .iter()
                .map(|m| SavedInflight { pid: m.pid, msg: m.msg.clone(), released: m.stage == Stage::Released })
                .collect(),
            queued: self.queued.iter().cloned().collect(),
            incoming: self.incoming.clone(),
        }
    }

    /// A session back from the state file. What `save` kept comes back as it was; an in-flight
    /// entry whose packet id repeats one before it, or is 0, is queued instead (a fresh id on resume).
    pub fn restore(saved: Saved) -> Session {
        let mut s = Session { subs: saved.subs, next_pid: saved.next_pid.max(1), ..Session::default() };
        for m in saved.inflight {
            s.bytes += m.msg.cost();
            if m.pid == 0 || s.inflight.iter().any(|i| i.pid == m.pid) {
                s.queued.push_back(m.msg);
                continue;
            }
            let stage = if m.released && m.msg.qos == 2 { Stage::Released } else { Stage::Published };
            s.inflight.push_back(Inflight { pid: m.pid, msg: m.msg, stage });
        }
        for m in saved.queued {
            s.bytes += m.cost();
            s.queued.push_back(m);
        }
        s.incoming = saved.incoming;
        crate::sort::natural(&mut s.incoming);
        s.incoming.dedup();
        s
    }

    /// Memory back after a burst: the queues' capacity shrinks to their contents.
    pub fn shrink(&mut self) {
        self.inflight.shrink_to_fit();
        self.queued.shrink_to_fit();
        self.incoming.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIM: Limits = Limits { messages: 3, bytes: 100 };

    fn msg(p: &str, qos: u8) -> Msg {
        Msg { topic: "t".into(), payload: p.as_bytes().into(), qos, retain: false }
    }

    fn sent(d: Delivered) -> (String, u16, bool) {
        match d {
            Delivered::Send(Send::Publish { msg, pid, dup }) => {
                (String::from_utf8_lossy(&msg.payload).into(), pid, dup)
            }
            other => panic!("expected a send, got {other:?}"),
        }
    }

    #[test]
    fn mqtt_2_3_1_2_packet_ids_skip_zero_and_ids_in_flight() {
        let mut s = Session::default();
        assert_eq!(sent(s.deliver(msg("a", 1), true, &LIM)).1, 1);
        assert_eq!(sent(s.deliver(msg("b", 1), true, &LIM)).1, 2);
        s.puback(2);
        s.next_pid = u16::MAX;
        assert_eq!(sent(s.deliver(msg("c", 1), true, &LIM)).1, u16::MAX);
        // 1 is still in flight: the next id is 2.
        assert_eq!(sent(s.deliver(msg("d", 1), true, &LIM)).1, 2);
        assert_eq!(sent(s.deliver(msg("e", 0), true, &LIM)).1, 0, "QoS 0 takes no packet id");
    }

    #[test]
    fn mqtt_4_3_2_qos1_completes_on_puback_only_for_its_id() {
        let mut s = Session::default();
        s.deliver(msg("a", 1), true, &LIM);
        s.puback(7);
        assert_eq!(s.pending(), 1);
        s.puback(1);
        assert_eq!((s.pending(), s.pending_bytes()), (0, 0));
    }

    #[test]
    fn mqtt_4_3_3_qos2_outbound_publish_pubrec_pubrel_pubcomp() {
        let mut s = Session::default();
        assert_eq!(sent(s.deliver(msg("a", 2), true, &LIM)).1, 1);
        s.puback(1);
        assert_eq!(s.pending(), 1, "a PUBACK does not complete a QoS 2 message");
        s.pubcomp(1);
        assert_eq!(s.pending(), 1, "PUBCOMP before PUBREC changes nothing");
        assert_eq!(s.pubrec(1), Some(Send::Pubrel(1)));
        assert_eq!(s.pubrec(9), None);
        // After PUBREC a reconnect re-sends PUBREL, not the PUBLISH.
        assert_eq!(s.resume(), vec![Send::Pubrel(1)]);
        s.pubcomp(1);
        assert_eq!(s.pending(), 0);
        assert!(s.resume().is_empty());
    }

    #[test]
    fn mqtt_4_3_3_2_inbound_qos2_is_routed_once_until_pubrel() {
        let mut s = Session::default();
        assert!(s.incoming_qos2(5));
        assert!(!s.incoming_qos2(5), "a duplicate before PUBREL is not routed again");
        assert!(s.incoming_qos2(6));
        s.incoming_release(5);
        assert!(s.incoming_qos2(5), "after PUBREL the id is a new message");
    }

    #[test]
    fn mqtt_4_4_0_1_resume_resends_unacked_with_dup_then_queued_in_order() {
        let mut s = Session::default();
        s.deliver(msg("a", 1), true, &LIM);
        s.deliver(msg("b", 2), true, &LIM);
        s.pubrec(2);
        assert_eq!(s.deliver(msg("c", 1), false, &LIM), Delivered::Queued);
        assert_eq!(s.deliver(msg("q0", 0), false, &LIM), Delivered::Skipped);
        let r = s.resume();
        assert_eq!(
            r,
            vec![
                Send::Publish { msg: msg("a", 1), pid: 1, dup: true },
                Send::Pubrel(2),
                Send::Publish { msg: msg("c", 1), pid: 3, dup: false },
            ]
        );
        assert_eq!(s.pending(), 3);
    }

    #[test]
    fn the_session_limits_drop_the_newest_and_report_the_first_drop() {
        let mut s = Session::default();
        for p in ["a", "b", "c"] {
            assert_eq!(s.deliver(msg(p, 1), false, &LIM), Delivered::Queued);
        }
        assert_eq!(s.deliver(msg("d", 1), false, &LIM), Delivered::Dropped { first: true });
        assert_eq!(s.deliver(msg("e", 1), false, &LIM), Delivered::Dropped { first: false });
        assert_eq!(s.deliver(msg("f", 0), true, &LIM), sent_q0("f"), "QoS 0 to a live client is not counted");
        let r = s.resume();
        assert_eq!(r.len(), 3, "the oldest three are kept");
        s.puback(1);
        assert_eq!(s.deliver(msg("g", 1), false, &LIM), Delivered::Queued, "room again after an ack");
        let big = Msg { payload: vec![0u8; 200].into(), ..msg("", 1) };
        assert_eq!(s.deliver(big.clone(), false, &LIM), Delivered::Dropped { first: true }, "the byte limit holds");
        // A connected client gets more room: the packet-id space and 4 x the bytes.
        assert!(matches!(s.deliver(big.clone(), true, &LIM), Delivered::Send(_)));
        assert_eq!(s.deliver(big, true, &LIM), Delivered::Dropped { first: true }, "4 x 100 bytes at most");
    }

    #[test]
    fn issue_29_away_sessions_together_stay_within_the_total_and_drop_the_newest() {
        let total = Limits { messages: 4, bytes: 1000 };
        let mut away = Away::default();
        let (mut a, mut b) = (Session::default(), Session::default());
        for p in ["a1", "a2", "a3"] {
            assert_eq!(a.deliver_away(msg(p, 1), &LIM, &mut away, &total), Delivered::Queued);
        }
        assert_eq!(b.deliver_away(msg("b1", 2), &LIM, &mut away, &total), Delivered::Queued);
        assert_eq!(away, Away { messages: 4, bytes: 12 });
        assert_eq!(b.deliver_away(msg("b2", 1), &LIM, &mut away, &total), Delivered::DroppedTotal { first: true });
        assert_eq!(b.deliver_away(msg("b3", 1), &LIM, &mut away, &total), Delivered::DroppedTotal { first: false });
        assert_eq!(b.deliver_away(msg("q0", 0), &LIM, &mut away, &total), Delivered::Skipped, "QoS 0 is never held");
        // a's client returns: its share is out of the total, and b queues again.
        away.remove(&a);
        assert_eq!(away, Away { messages: 1, bytes: 3 });
        assert_eq!(a.resume().len(), 3, "what was queued first is delivered");
        assert_eq!(b.deliver_away(msg("b4", 1), &LIM, &mut away, &total), Delivered::Queued);
        // ... and when it leaves again with those three unacknowledged, they count again.
        away.add(&a);
        assert_eq!(away, Away { messages: 5, bytes: 15 });
        let byte_cap = Limits { messages: 100, bytes: 18 };
        let big = Msg { payload: vec![0u8; 3].into(), ..msg("", 1) };
        assert_eq!(
            b.deliver_away(big, &LIM, &mut away, &byte_cap),
            Delivered::DroppedTotal { first: true },
            "bytes too"
        );
    }

    #[test]
    fn save_and_restore_keep_subscriptions_in_flight_stages_queue_and_incoming_ids() {
        let mut s = Session { subs: vec![("a/#".into(), 2)], ..Session::default() };
        s.deliver(msg("a", 1), true, &LIM);
        s.deliver(msg("b", 2), true, &LIM);
        s.pubrec(2);
        s.deliver(msg("c", 1), false, &LIM);
        s.incoming_qos2(9);
        let saved = s.save();
        let mut back = Session::restore(saved.clone());
        assert_eq!(back.save(), saved);
        assert_eq!(back.pending_bytes(), s.pending_bytes());
        assert!(!back.incoming_qos2(9), "an inbound QoS 2 id awaiting PUBREL stays known");
        assert_eq!(back.resume(), s.resume(), "the same resends, ids and order");
        // A repeated or zero packet id is queued for a fresh one instead.
        let bad = Saved {
            inflight: vec![
                SavedInflight { pid: 4, msg: msg("x", 1), released: false },
                SavedInflight { pid: 4, msg: msg("y", 1), released: false },
                SavedInflight { pid: 0, msg: msg("z", 1), released: true },
            ],
            ..Saved::default()
        };
        let mut r = Session::restore(bad);
        let pids: Vec<u16> = r
            .resume()
            .into_iter()
            .map(|s| match s {
                Send::Publish { pid, .. } => pid,
                Send::Pubrel(p) => panic!("no PUBREL for a QoS 1 message ({p})"),
            })
            .collect();
        assert_eq!(pids, vec![4, 1, 2]);
    }

    fn sent_q0(p: &str) -> Delivered {
        Delivered::Send(Send::Publish { msg: msg(p, 0), pid: 0, dup: false })
    }
}
