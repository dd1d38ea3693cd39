//! One job's verdict as `mam wait` judges it (issue 21), a pure state machine with `now` passed in:
//! the same evidence as `mam watch` (signed events and states of the record's current attempt, from
//! the wire and events.log, judged by `watch::accept::Acceptor`) plus the record itself, and the
//! same budgets: the idle window after the last evidence, and before any evidence the ack budget
//! (T + K x N, measured from the dispatch, since a wait may join a job mid-way). Evidence counts at
//! its own signed time (`ts`), so old lines read at start do not look fresh.
//!
//! It never closes anything: a silence is a verdict of the wait only, the job stays as it is.

use serde_json::Value;

use crate::clock::parse_ts;
use crate::daemon::sweep::idle_ms;
use crate::registry::is_terminal;
use crate::registry::record::Record;
use crate::watch::accept::{Acceptor, Identity};

/// Where a verdict was seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Wire,
    EventsLog,
    Record,
    /// No evidence within a budget.
    Inferred,
}

impl Source {
    pub fn word(self) -> &'static str {
        match self {
            Source::Wire => "wire",
            Source::EventsLog => "events.log",
            Source::Record => "record",
            Source::Inferred => "inferred",
        }
    }
}

/// A job's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// `completed`, `failed`, ... (the terminal status), `unresponsive`, `no_started`.
    pub verdict: String,
    /// The record's status when it was seen (`running`/`pending` for a silence).
    pub status: String,
    pub reason: String,
    pub source: Source,
    /// When (ms since the epoch): the event's time, or the end of the budget.
    pub at_ms: u64,
}

impl Found {
    /// How the verdict ranks for the exit code: 0 completed, 10 another terminal status, 11
    /// unresponsive, 12 never started.
    pub fn rc(&self) -> i32 {
        match self.verdict.as_str() {
            "completed" => 0,
            "unresponsive" => 11,
            "no_started" | "agent_blocked" => 12,
            _ => 10,
        }
    }
}

/// The verdict word of a terminal status and reason.
pub fn verdict_word(status: &str, reason: &str) -> String {
    crate::registry::verdict_word(status, reason).to_string()
}

/// The evidence times a record carries from its agent (claim, beat, last event) in this dispatch.
fn recorded_ms(rec: &Record, dispatched: u64) -> Option<u64> {
    ["claimed_at", "heartbeat_at", "last_event_at"]
        .iter()
        .filter_map(|k| rec.str(k).and_then(parse_ts))
        .filter(|t| *t >= dispatched)
        .max()
}

/// One job being waited for.
#[derive(Debug)]
pub struct Tracker {
    pub job_id: String,
    pub session: String,
    pub report: Option<String>,
    pub transport: String,
    acceptor: Acceptor,
    dispatched_ms: u64,
    idle_ms: u64,
    ack_ms: u64,
    last_ms: Option<u64>,
    /// Set once; the tracker says nothing more after it.
    pub found: Option<Found>,
}

impl Tracker {
    /// A tracker of `rec`'s current attempt; `None` when the record lacks its identity.
    pub fn new(rec: &Record) -> Option<Tracker> {
        let identity = Identity {
            attempt: rec.attempt()?,
            dispatch_token: rec.str("dispatch_token")?.to_string(),
            auth_token: rec.str("auth_token")?.to_string(),
        };
        let dispatched_ms = rec.str("dispatched_at").or(rec.str("created_at")).and_then(parse_ts).unwrap_or(0);
        let idle = idle_ms(rec);
        let mut t = Tracker {
            job_id: rec.str("job_id")?.to_string(),
            session: rec.str("agent_session").unwrap_or("").to_string(),
            report: rec.str("report_path").map(str::to_string),
            transport: rec.str("transport").unwrap_or("local").to_string(),
            acceptor: Acceptor::new(identity),
            dispatched_ms,
            idle_ms: idle,
            ack_ms: rec.u64("ack_timeout_sec").unwrap_or(300) * 1000 + idle,
            last_ms: None,
            found: None,
        };
        t.last_ms = recorded_ms(rec, dispatched_ms);
        Some(t)
    }

    pub fn attempt(&self) -> u64 {
        self.acceptor.id.attempt
    }

    fn evidence(&mut self, at_ms: u64) {
        if self.last_ms.is_none_or(|l| at_ms > l) {
            self.last_ms = Some(at_ms);
        }
    }

    fn set(&mut self, f: Found) -> Option<Found> {
        if self.found.is_some() {
            return None;
        }
        self.found = Some(f.clone());
        Some(f)
    }

    /// A payload from the wire or one events.log line. A terminal status seen here is the verdict;
    /// `reason` is read by the caller from the record when it has one.
    pub fn offer(&mut self, payload: &[u8], source: Source, now_ms: u64) -> Option<Found> {
        if self.found.is_some() {
            return None;
        }
        let outcome = self.acceptor.offer(payload);
        if !outcome.is_evidence() {
            return None;
        }
        let ts = serde_json::from_slice::<Value>(payload)
            .ok()
            .and_then(|v| v.get("ts").and_then(Value::as_str).and_then(parse_ts))
            .map_or(now_ms, |t| t.min(now_ms));
        self.evidence(ts);
        let status = outcome.terminal()?.to_string();
        self.set(Found { verdict: status.clone(), status, reason: String::new(), source, at_ms: ts })
    }

    /// The record as read now: a terminal status of this attempt is the verdict; a newer attempt
    /// starts the tracker over (the old one is gone); agent timestamps are evidence.
    pub fn record(&mut self, rec: &Record) -> Option<Found> {
        if self.found.is_some() {
            return None;
        }
        if rec.attempt().is_some_and(|a| a != self.attempt()) {
            if let Some(fresh) = Tracker::new(rec) {
                *self = fresh;
            }
            return None;
        }
        if let Some(t) = recorded_ms(rec, self.dispatched_ms) {
            self.evidence(t);
        }
        let status = rec.status();
        if !is_terminal(status) {
            return None;
        }
        let reason = rec.str("reason").unwrap_or("").to_string();
        let at_ms = rec.str("finished_at").and_then(parse_ts).unwrap_or(0);
        let verdict = verdict_word(status, &reason);
        self.set(Found { verdict, status: status.to_string(), reason, source: Source::Record, at_ms })
    }

    /// The instant (ms) at which silence becomes a verdict.
    pub fn deadline(&self) -> u64 {
        match self.last_ms {
            Some(l) => l + self.idle_ms,
            None => self.dispatched_ms + self.ack_ms,
        }
    }

    /// A silence verdict at `now_ms`; `status` is the record's status to show with it.
    pub fn check(&mut self, now_ms: u64, status: &str) -> Option<Found> {
        if self.found.is_some() || now_ms < self.deadline() {
            return None;
        }
        let verdict = if self.last_ms.is_some() { "unresponsive" } else { "no_started" };
        let at_ms = self.deadline();
        self.set(Found {
            verdict: verdict.into(),
            status: status.to_string(),
            reason: String::new(),
            source: Source::Inferred,
            at_ms,
        })
    }

    /// How long the job has been silent at its silence verdict (for the line).
    pub fn silent_ms(&self) -> u64 {
        match self.last_ms {
            Some(_) => self.idle_ms,
            None => self.ack_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::format_ts;
    use crate::sign;
    use serde_json::json;

    const NOW: u64 = 1_800_000_000_000;
    const KEY: &str = "k3y";

    fn rec(status: &str) -> Record {
        Record::new(
            json!({"job_id": "j1", "attempt": 1, "dispatch_token": "t0k", "auth_token": KEY, "status": status,
                   "dispatched_at": format_ts(NOW - 10_000), "heartbeat_sec": 1, "heartbeat_misses": 3,
                   "ack_timeout_sec": 2, "agent_session": "w1"})
            .as_object()
            .unwrap()
            .clone(),
        )
    }

    fn ev(seq: u64, e: &str, at: u64) -> Vec<u8> {
        let m = json!({"v":1,"kind":"event","job_id":"j1","attempt":1,"dispatch_token":"t0k","seq":seq,
                       "event":e,"ts":format_ts(at)});
        serde_json::to_vec(&sign::signed(KEY.as_bytes(), m.as_object().unwrap().clone()).unwrap()).unwrap()
    }

    #[test]
    fn silence_after_evidence_is_unresponsive_and_before_any_is_no_started() {
        let mut t = Tracker::new(&rec("pending")).unwrap();
        // T + K x N = 2 + 3 s from the dispatch, 10 s ago: already past.
        assert_eq!(t.deadline(), NOW - 5_000);
        let f = t.check(NOW, "pending").unwrap();
        assert_eq!((f.verdict.as_str(), f.source, f.rc()), ("no_started", Source::Inferred, 12));
        assert!(t.check(NOW + 1, "pending").is_none(), "once");

        let mut t = Tracker::new(&rec("running")).unwrap();
        assert!(t.offer(&ev(1, "started", NOW - 1_000), Source::EventsLog, NOW).is_none());
        assert_eq!(t.deadline(), NOW + 2_000, "the event's own time starts the idle window");
        assert!(t.check(NOW + 1_999, "running").is_none());
        assert_eq!(t.check(NOW + 2_000, "running").unwrap().verdict, "unresponsive");
    }

    #[test]
    fn terminal_events_records_and_redispatches() {
        let mut t = Tracker::new(&rec("running")).unwrap();
        let f = t.offer(&ev(2, "completed", NOW), Source::Wire, NOW).unwrap();
        assert_eq!((f.verdict.as_str(), f.source, f.rc()), ("completed", Source::Wire, 0));
        // A forged line changes nothing.
        let mut t = Tracker::new(&rec("running")).unwrap();
        let mut bad: Value = serde_json::from_slice(&ev(3, "failed", NOW)).unwrap();
        bad["event"] = json!("completed");
        assert!(t.offer(&serde_json::to_vec(&bad).unwrap(), Source::Wire, NOW).is_none());
        let mut closed = rec("deadline_timeout");
        closed.set("reason", "unresponsive");
        let f = t.record(&closed).unwrap();
        assert_eq!((f.verdict.as_str(), f.status.as_str(), f.rc()), ("unresponsive", "deadline_timeout", 11));
        // A re-dispatch: the tracker follows the new attempt.
        let mut t = Tracker::new(&rec("running")).unwrap();
        let mut again = rec("pending");
        again.set("attempt", 2);
        again.set("dispatched_at", format_ts(NOW));
        assert!(t.record(&again).is_none());
        assert_eq!((t.attempt(), t.deadline()), (2, NOW + 5_000));
    }
}
