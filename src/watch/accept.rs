//! The acceptance rules of `mam watch` (CORE 8.3) and its budgets (8.1, A9, A31), as pure state
//! machines with `now` passed in: which event or state message counts as evidence, which renews the
//! idle window, which ends the watch, and when silence becomes a verdict.
//!
//! No sockets, files or clocks here: the watch loop, the daemon and the delegate wrapper feed it
//! payloads from the wire and from events.log and act on what it returns.

use std::collections::HashSet;

use serde_json::Value;

use crate::sign;

pub use crate::registry::{is_terminal, TERMINAL};

/// The identity a message must carry to count for this job's current attempt.
#[derive(Debug, Clone)]
pub struct Identity {
    pub attempt: u64,
    pub dispatch_token: String,
    pub auth_token: String,
}

/// Why a message was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// Not JSON, not an object, wrong `v` or `kind`, or missing fields: dropped silently.
    Malformed,
    /// The signature does not verify with the job's auth token.
    BadSig,
    /// A valid message of another attempt or dispatch token.
    StaleAttempt,
}

impl DropReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::Malformed => "malformed",
            DropReason::BadSig => "bad_sig",
            DropReason::StaleAttempt => "stale_attempt",
        }
    }
}

/// What one message did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// An event of the current attempt with a new seq.
    Event {
        seq: u64,
        event: String,
        /// `Some((expected, got))` when seqs were skipped (audit `seq_gap`).
        gap: Option<(u64, u64)>,
        /// The event's status if it is terminal.
        terminal: Option<String>,
    },
    /// A state snapshot of the current attempt.
    State {
        seq: u64,
        status: String,
        /// True when it renewed the idle window (a newer seq than anything seen).
        renewed: bool,
        /// The status if it is terminal: the result regardless of seq.
        terminal: Option<String>,
    },
    /// An event already seen (seq at or below the event watermark): dropped silently.
    Duplicate { seq: u64 },
    /// Dropped; `audit` is true the first time a (reason, seq) pair is seen.
    Dropped { seq: Option<u64>, reason: DropReason, audit: bool },
}

impl Outcome {
    /// True when the message is evidence that renews the idle window and satisfies the ack.
    pub fn is_evidence(&self) -> bool {
        matches!(self, Outcome::Event { .. } | Outcome::State { renewed: true, .. })
            || matches!(self, Outcome::State { terminal: Some(_), .. })
    }

    /// The terminal status this message ends the watch with, if any.
    pub fn terminal(&self) -> Option<&str> {
        match self {
            Outcome::Event { terminal, .. } | Outcome::State { terminal, .. } => terminal.as_deref(),
            _ => None,
        }
    }
}

/// Audit lines for dropped messages one job may write per window (issue 12 item 9).
pub const DROP_AUDITS_PER_WINDOW: u32 = 20;
/// The window of `DROP_AUDITS_PER_WINDOW`.
pub const DROP_WINDOW_MS: u64 = 60_000;
/// The most (reason, seq) pairs remembered for once-per-seq auditing; past it, the budget alone
/// bounds the audit (a forger's distinct seqs must not grow memory without end).
pub const AUDITED_MEMORY: usize = 4096;

/// Whether one audit-worthy drop is written (issue 12 item 9).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropAudit {
    /// Write it; `summary` is the count suppressed in the window that just ended (write that
    /// first, as one `M more dropped` line).
    Write { summary: Option<u64> },
    /// The window's budget is spent: count it, write nothing.
    Suppress,
}

/// A per-job budget of audit lines for dropped messages: at most `per_window` in each window, then
/// one summary of how many more were dropped. Pure: `now` is passed in.
#[derive(Debug, Clone)]
pub struct DropBudget {
    per_window: u32,
    window_ms: u64,
    start: Option<u64>,
    used: u32,
    suppressed: u64,
}

impl DropBudget {
    pub fn new(per_window: u32, window_ms: u64) -> DropBudget {
        DropBudget { per_window, window_ms, start: None, used: 0, suppressed: 0 }
    }

    /// One audit-worthy drop at `now`.
    pub fn admit(&mut self, now: u64) -> DropAudit {
        let mut summary = None;
        if self.start.is_none_or(|s| now >= s.saturating_add(self.window_ms)) {
            summary = self.take_suppressed();
            self.start = Some(now);
            self.used = 0;
        }
        if self.used < self.per_window {
            self.used += 1;
            DropAudit::Write { summary }
        } else {
            self.suppressed += 1;
            DropAudit::Suppress
        }
    }

    /// The drops suppressed since the last summary, if any (for a summary at the end of a watch).
    pub fn take_suppressed(&mut self) -> Option<u64> {
        Some(std::mem::take(&mut self.suppressed)).filter(|&n| n > 0)
    }
}

impl Default for DropBudget {
    fn default() -> DropBudget {
        DropBudget::new(DROP_AUDITS_PER_WINDOW, DROP_WINDOW_MS)
    }
}

/// The two watermarks, the once-per-seq audit memory of CORE 8.3, and the drop-audit budget.
#[derive(Debug)]
pub struct Acceptor {
    pub id: Identity,
    event_hw: u64,
    state_hw: u64,
    audited: HashSet<(DropReason, u64)>,
    /// How many audit lines drops may still produce (issue 12 item 9); the caller asks it.
    pub drops: DropBudget,
}

impl Acceptor {
    pub fn new(id: Identity) -> Acceptor {
        Acceptor { id, event_hw: 0, state_hw: 0, audited: HashSet::new(), drops: DropBudget::default() }
    }

    pub fn event_hw(&self) -> u64 {
        self.event_hw
    }

    pub fn state_hw(&self) -> u64 {
        self.state_hw
    }

    /// Judges one payload (bytes from the wire or one events.log line).
    pub fn offer(&mut self, payload: &[u8]) -> Outcome {
        let Ok(v) = serde_json::from_slice::<Value>(payload) else {
            return self.drop(None, DropReason::Malformed);
        };
        let kind = v.get("kind").and_then(Value::as_str).unwrap_or("");
        let seq = v.get("seq").and_then(Value::as_u64);
        if v.get("v").and_then(Value::as_u64) != Some(1) || !matches!(kind, "event" | "state") || seq.is_none() {
            return self.drop(seq, DropReason::Malformed);
        }
        let seq = seq.unwrap_or(0);
        if !sign::verify(self.id.auth_token.as_bytes(), &v) {
            return self.drop(Some(seq), DropReason::BadSig);
        }
        let attempt = v.get("attempt").and_then(Value::as_u64);
        let token = v.get("dispatch_token").and_then(Value::as_str);
        if attempt != Some(self.id.attempt) || token != Some(self.id.dispatch_token.as_str()) {
            return self.drop(Some(seq), DropReason::StaleAttempt);
        }
        if kind == "event" {
            let Some(event) = v.get("event").and_then(Value::as_str) else {
                return self.drop(Some(seq), DropReason::Malformed);
            };
            self.accept_event(seq, event)
        } else {
            let Some(status) = v.get("status").and_then(Value::as_str) else {
                return self.drop(Some(seq), DropReason::Malformed);
            };
            self.accept_state(seq, status)
        }
    }

    fn drop(&mut self, seq: Option<u64>, reason: DropReason) -> Outcome {
        let key = (reason, seq.unwrap_or(0));
        let audit = reason != DropReason::Malformed
            && if self.audited.len() < AUDITED_MEMORY {
                self.audited.insert(key)
            } else {
                !self.audited.contains(&key)
            };
        Outcome::Dropped { seq, reason, audit }
    }

    /// An authenticated event of the current attempt.
    pub fn accept_event(&mut self, seq: u64, event: &str) -> Outcome {
        if seq <= self.event_hw {
            return Outcome::Duplicate { seq };
        }
        let gap = (self.event_hw > 0 && seq > self.event_hw + 1).then_some((self.event_hw + 1, seq));
        self.event_hw = seq;
        let terminal = matches!(event, "completed" | "failed" | "error").then(|| event.to_string());
        Outcome::Event { seq, event: event.to_string(), gap, terminal }
    }

    /// An authenticated state of the current attempt. A state never touches the event watermark,
    /// so it cannot cause its own event to be dropped (W7).
    pub fn accept_state(&mut self, seq: u64, status: &str) -> Outcome {
        let terminal = is_terminal(status).then(|| status.to_string());
        let renewed = seq > self.event_hw.max(self.state_hw);
        self.state_hw = self.state_hw.max(seq);
        Outcome::State { seq, status: status.to_string(), renewed, terminal }
    }
}

/// Why a watch ended without a terminal status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Silence {
    /// No evidence within the idle window after the last evidence (rc 11).
    Unresponsive,
    /// No evidence within the ack budget (rc 12).
    NoStarted,
    /// The wall clock (`--timeout`) ended the watch (rc 13).
    WallClock,
}

/// The clocks of one watch, in milliseconds on a monotonic scale chosen by the caller.
#[derive(Debug, Clone)]
pub struct Budgets {
    /// When the ack budget runs out (absolute).
    pub ack_deadline: u64,
    /// The ack budget's length, for the rc 12 message.
    pub ack_budget_ms: u64,
    /// The idle window after each piece of evidence.
    pub idle_ms: u64,
    /// When `--timeout` ends the watch (absolute), if given.
    pub wall_deadline: Option<u64>,
    /// When the watch started, for the "no event within" message.
    pub started: u64,
    last_evidence: Option<u64>,
}

impl Budgets {
    /// `ack_from`: the instant the ack budget is measured from (watch start for an explicit
    /// `--ack-timeout`, A9; subscription otherwise, CORE 8.1).
    pub fn new(started: u64, ack_from: u64, ack_budget_ms: u64, idle_ms: u64, wall_ms: Option<u64>) -> Budgets {
        Budgets {
            ack_deadline: ack_from + ack_budget_ms,
            ack_budget_ms,
            idle_ms,
            wall_deadline: wall_ms.map(|w| started + w),
            started,
            last_evidence: None,
        }
    }

    /// Records evidence at `now`: satisfies the ack and restarts the idle window.
    pub fn evidence(&mut self, now: u64) {
        self.last_evidence = Some(now);
    }

    pub fn acked(&self) -> bool {
        self.last_evidence.is_some()
    }

    pub fn last_evidence(&self) -> Option<u64> {
        self.last_evidence
    }

    /// The next instant at which `check` may return a verdict.
    pub fn next_deadline(&self) -> u64 {
        let silence = match self.last_evidence {
            Some(t) => t + self.idle_ms,
            None => self.ack_deadline,
        };
        self.wall_deadline.map_or(silence, |w| w.min(silence))
    }

    /// The silence verdict at `now`, if any. The wall clock wins a tie: it is the caller's cap.
    pub fn check(&self, now: u64) -> Option<Silence> {
        if self.wall_deadline.is_some_and(|w| now >= w) {
            return Some(Silence::WallClock);
        }
        match self.last_evidence {
            Some(t) if now >= t + self.idle_ms => Some(Silence::Unresponsive),
            None if now >= self.ack_deadline => Some(Silence::NoStarted),
            _ => None,
        }
    }

    /// The rc 12 / rc 13-before-ack message of CORE 8.1: the effective budget, and whether the
    /// wall clock cut it.
    pub fn no_event_message(&self) -> String {
        let effective = self.wall_deadline.map_or(self.ack_deadline, |w| w.min(self.ack_deadline));
        let secs = |ms: u64| ms.div_ceil(1000);
        let within = secs(effective.saturating_sub(self.started));
        if self.wall_deadline.is_some_and(|w| w < self.ack_deadline) {
            format!("no event within {within}s (ack budget {}s cut by the wall clock)", secs(self.ack_budget_ms))
        } else {
            format!("no event within {within}s (ack budget {}s)", secs(self.ack_budget_ms))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const KEY: &str = "k3y";

    fn id() -> Identity {
        Identity { attempt: 2, dispatch_token: "t0k".into(), auth_token: KEY.into() }
    }

    fn msg(kind: &str, seq: u64, what: &str, attempt: u64, token: &str, key: &str) -> Vec<u8> {
        let mut m = json!({"v":1,"kind":kind,"job_id":"j","attempt":attempt,"dispatch_token":token,"seq":seq,"ts":"x"});
        let field = if kind == "event" { "event" } else { "status" };
        m[field] = json!(what);
        let signed = sign::signed(key.as_bytes(), m.as_object().unwrap().clone()).unwrap();
        serde_json::to_vec(&signed).unwrap()
    }

    fn ev(seq: u64, e: &str) -> Vec<u8> {
        msg("event", seq, e, 2, "t0k", KEY)
    }

    fn st(seq: u64, s: &str) -> Vec<u8> {
        msg("state", seq, s, 2, "t0k", KEY)
    }

    #[test]
    fn events_advance_and_duplicates_drop() {
        let mut a = Acceptor::new(id());
        assert!(matches!(a.offer(&ev(1, "started")), Outcome::Event { seq: 1, gap: None, terminal: None, .. }));
        assert_eq!(a.offer(&ev(1, "started")), Outcome::Duplicate { seq: 1 });
        let o = a.offer(&ev(2, "completed"));
        assert_eq!(o.terminal(), Some("completed"));
    }

    #[test]
    fn w8_gap_is_reported() {
        let mut a = Acceptor::new(id());
        a.offer(&ev(1, "started"));
        a.offer(&ev(2, "progress"));
        match a.offer(&ev(4, "progress")) {
            Outcome::Event { gap, .. } => assert_eq!(gap, Some((3, 4))),
            o => panic!("{o:?}"),
        }
        // The first event of a watch never reports a gap, whatever its seq.
        let mut b = Acceptor::new(id());
        assert!(matches!(b.offer(&ev(9, "progress")), Outcome::Event { gap: None, .. }));
    }

    #[test]
    fn w6_stale_state_does_not_renew_but_terminal_state_ends() {
        let mut a = Acceptor::new(id());
        a.offer(&ev(5, "progress"));
        let o = a.offer(&st(3, "running"));
        assert!(matches!(o, Outcome::State { renewed: false, terminal: None, .. }));
        assert!(!o.is_evidence());
        let o = a.offer(&st(3, "completed"));
        assert_eq!(o.terminal(), Some("completed"));
        assert!(o.is_evidence());
    }

    #[test]
    fn w7_state_before_its_event_does_not_drop_the_event() {
        let mut a = Acceptor::new(id());
        assert!(a.offer(&st(5, "running")).is_evidence());
        assert_eq!(a.state_hw(), 5);
        assert!(matches!(a.offer(&ev(5, "progress")), Outcome::Event { seq: 5, .. }));
        // A state at the same seq as the event watermark is not newer.
        assert!(matches!(a.offer(&st(5, "running")), Outcome::State { renewed: false, .. }));
        assert!(matches!(a.offer(&st(6, "running")), Outcome::State { renewed: true, .. }));
    }

    #[test]
    fn w11_bad_sig_and_foreign_token_are_dropped_and_audited_once() {
        let mut a = Acceptor::new(id());
        let forged = msg("event", 1, "started", 2, "t0k", "other-key");
        assert_eq!(a.offer(&forged), Outcome::Dropped { seq: Some(1), reason: DropReason::BadSig, audit: true });
        assert_eq!(a.offer(&forged), Outcome::Dropped { seq: Some(1), reason: DropReason::BadSig, audit: false });
        let foreign = msg("event", 2, "started", 2, "other", KEY);
        assert_eq!(a.offer(&foreign), Outcome::Dropped { seq: Some(2), reason: DropReason::StaleAttempt, audit: true });
        let old = msg("event", 3, "completed", 1, "t0k", KEY);
        assert!(matches!(a.offer(&old), Outcome::Dropped { reason: DropReason::StaleAttempt, .. }));
        // Nothing moved the watermark.
        assert_eq!(a.event_hw(), 0);
        // A tampered byte fails verification.
        let mut t = ev(4, "progress");
        let pos = t.windows(8).position(|w| w == b"progress").unwrap();
        t[pos] = b'P';
        assert!(matches!(a.offer(&t), Outcome::Dropped { reason: DropReason::BadSig, .. }));
    }

    #[test]
    fn malformed_payloads_drop_silently() {
        let mut a = Acceptor::new(id());
        for p in
            [&b"not json"[..], b"[]", br#"{"v":2,"kind":"event","seq":1}"#, br#"{"v":1,"kind":"dispatch","seq":1}"#]
        {
            assert!(
                matches!(a.offer(p), Outcome::Dropped { reason: DropReason::Malformed, audit: false, .. }),
                "{p:?}"
            );
        }
    }

    #[test]
    fn budgets_ack_then_idle_then_wall() {
        // W4 shape: T=2 s, K x N = 1 s from subscription at t=100.
        let b = Budgets::new(0, 100, 3000, 1000, None);
        assert_eq!(b.check(3099), None);
        assert_eq!(b.check(3100), Some(Silence::NoStarted));
        // W2 shape: evidence at 500, idle 3 s.
        let mut b = Budgets::new(0, 0, 10_000, 3000, None);
        b.evidence(500);
        assert_eq!(b.next_deadline(), 3500);
        assert_eq!(b.check(3499), None);
        assert_eq!(b.check(3500), Some(Silence::Unresponsive));
        b.evidence(3400);
        assert_eq!(b.check(3500), None);
        // Wall clock cuts an ack budget (A31 W3: --timeout 1 --ack-timeout 5 is rc 13).
        let b = Budgets::new(0, 0, 5000, 3000, Some(1000));
        assert_eq!(b.next_deadline(), 1000);
        assert_eq!(b.check(1000), Some(Silence::WallClock));
        assert_eq!(b.no_event_message(), "no event within 1s (ack budget 5s cut by the wall clock)");
        let b = Budgets::new(0, 0, 2000, 3000, None);
        assert_eq!(b.no_event_message(), "no event within 2s (ack budget 2s)");
    }

    #[test]
    fn drop_budget_writes_n_per_window_then_one_summary() {
        let mut b = DropBudget::new(3, 1000);
        let t0 = 5_000;
        for i in 0..3 {
            assert_eq!(b.admit(t0 + i), DropAudit::Write { summary: None });
        }
        for i in 0..10 {
            assert_eq!(b.admit(t0 + 10 + i), DropAudit::Suppress);
        }
        // The next window: the first drop carries the summary of the last one.
        assert_eq!(b.admit(t0 + 1000), DropAudit::Write { summary: Some(10) });
        assert_eq!(b.take_suppressed(), None);
        b.admit(t0 + 1001);
        b.admit(t0 + 1002);
        assert_eq!(b.admit(t0 + 1003), DropAudit::Suppress);
        assert_eq!(b.take_suppressed(), Some(1), "the end of a watch writes what is left");
    }

    #[test]
    fn once_per_seq_memory_is_bounded() {
        let mut a = Acceptor::new(Identity { attempt: 1, dispatch_token: "t".into(), auth_token: "k".into() });
        for seq in 0..(AUDITED_MEMORY as u64 + 100) {
            let p = format!(r#"{{"v":1,"kind":"event","seq":{seq},"sig":"00"}}"#);
            assert!(matches!(a.offer(p.as_bytes()), Outcome::Dropped { audit: true, .. }));
        }
        assert_eq!(a.audited.len(), AUDITED_MEMORY);
        let p = r#"{"v":1,"kind":"event","seq":1,"sig":"00"}"#;
        assert!(matches!(a.offer(p.as_bytes()), Outcome::Dropped { audit: false, .. }), "remembered seqs stay once");
    }
}
