//! A15: closing the jobs nobody waits for. Every sweep (10 s by default) the daemon looks at the
//! non-terminal jobs of its registry whose watcher is gone (`watcher_pid` absent, or naming a dead
//! process): past `deadline_at` they are expired; with no evidence for `idle_timeout_sec` + 5 s they
//! get an operator `set deadline_timeout` with reason `unresponsive`.
//!
//! `judge` is pure (record, watcher liveness, events.log mtime, now); `sweep` reads the registry and
//! sends the requests through `registry::store`, the only writer. Nothing here prints.

use std::collections::HashMap;
use std::fs;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::clock::parse_ts;
use crate::registry::engine::{Authority, Kind, Request};
use crate::registry::is_terminal;
use crate::registry::record::{Fields, Record};
use crate::registry::store::{Decided, Store};
use crate::sys;

/// The grace added to the idle window before the daemon closes a silent job (A15).
pub const GRACE_MS: u64 = 5_000;

/// Why the sweep closes a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Close {
    /// `now >= deadline_at`: operator `expire`.
    Expire,
    /// No evidence for idle + 5 s: operator `set deadline_timeout` reason `unresponsive`.
    Unresponsive,
}

/// The newest evidence of life of a job in ms since the epoch: the record's `last_event_at`,
/// `heartbeat_at`, `claimed_at`, `updated_at`, `dispatched_at` and `created_at`, and the mtime of its
/// events.log. `updated_at` counts (conservative: a job that anyone touched is not closed early).
pub fn last_evidence_ms(rec: &dyn Fields, events_mtime_ms: Option<u64>) -> Option<u64> {
    ["last_event_at", "heartbeat_at", "claimed_at", "updated_at", "dispatched_at", "created_at"]
        .iter()
        .filter_map(|k| rec.str(k).and_then(parse_ts))
        .chain(events_mtime_ms)
        .max()
}

/// The idle window of a job in ms: `idle_timeout_sec`, else K x N, else 120 s.
pub fn idle_ms(rec: &dyn Fields) -> u64 {
    let n = rec.u64("heartbeat_sec").unwrap_or(30);
    let k = rec.u64("heartbeat_misses").unwrap_or(4);
    let idle = rec.u64("idle_timeout_sec").filter(|&s| s > 0).unwrap_or(n * k);
    idle * 1000
}

/// The A15 verdict for one record, or `None` to leave it alone.
pub fn judge(rec: &Record, watcher_alive: bool, events_mtime_ms: Option<u64>, now_ms: u64) -> Option<Close> {
    if is_terminal(rec.status()) || watcher_alive {
        return None;
    }
    if rec.str("deadline_at").and_then(parse_ts).is_some_and(|d| now_ms >= d) {
        return Some(Close::Expire);
    }
    let last = last_evidence_ms(rec, events_mtime_ms)?;
    (now_ms >= last + idle_ms(rec) + GRACE_MS).then_some(Close::Unresponsive)
}

/// True when the record's `watcher_pid` names a live process (not a zombie).
pub fn watcher_alive(rec: &Record) -> bool {
    rec.u64("watcher_pid").is_some_and(pid_alive)
}

/// True when `pid` names a live process (not a zombie).
pub fn pid_alive(pid: u64) -> bool {
    let Some(pid) = i32::try_from(pid).ok().filter(|&p| p > 0) else {
        return false;
    };
    match sys::proc_start_ticks(pid) {
        Ok((_, zombie)) => !zombie,
        Err(_) => sys::process_exists(pid),
    }
}

/// mtime of `<registry>/<job_id>/events.log` in ms since the epoch.
pub fn events_mtime_ms(registry: &Path, job_id: &str) -> Option<u64> {
    let m = fs::metadata(registry.join(job_id).join("events.log")).ok()?.modified().ok()?;
    m.duration_since(UNIX_EPOCH).ok().map(|d| d.as_millis() as u64)
}

/// What one sweep did to one job.
#[derive(Debug, Clone, PartialEq)]
pub struct Closed {
    pub job_id: String,
    pub close: Close,
    /// `Applied` -> the new status; otherwise the refusal or error text.
    pub result: Result<String, String>,
    /// When applied: the closed record and the seq allocated for its A4 state message.
    pub applied: Option<(Record, u64)>,
}

/// The A4 close notice for an applied close: a signed retained state with the terminal status, the
/// freshly allocated `seq` and `last_event: "closed"`, on `<topic_prefix>/state`. Returns the topic and
/// payload, or `None` when the record lacks what is needed to sign it.
pub fn close_state(rec: &Record, seq: u64, now_ms: u64) -> Option<(String, Vec<u8>)> {
    let prefix = rec.str("topic_prefix")?;
    let key = rec.str("auth_token")?;
    let v = serde_json::json!({
        "v": 1,
        "kind": "state",
        "job_id": rec.str("job_id")?,
        "attempt": rec.attempt()?,
        "dispatch_token": rec.str("dispatch_token")?,
        "status": rec.status(),
        "last_event": "closed",
        "seq": seq,
        "ts": crate::clock::format_ts(now_ms),
    });
    let signed = crate::sign::signed(key.as_bytes(), v.as_object()?.clone()).ok()?;
    Some((format!("{prefix}/state"), serde_json::to_vec(&signed).ok()?))
}

/// Remembers records known to be terminal (by mtime) so a large registry costs a stat per job, not a
/// parse, on every sweep and polling pass.
#[derive(Debug, Default)]
pub struct TerminalCache {
    seen: HashMap<String, SystemTime>,
}

impl TerminalCache {
    /// The job's record when it may still be open: `None` for a record this cache knows is terminal
    /// (same mtime as when it was last read) or that cannot be read.
    pub fn open_record(&mut self, store: &Store, job_id: &str) -> Option<Record> {
        let mtime = fs::metadata(store.record_path(job_id)).and_then(|m| m.modified()).ok();
        if let (Some(m), Some(seen)) = (mtime, self.seen.get(job_id)) {
            if *seen == m {
                return None;
            }
        }
        let rec = store.read(job_id).ok()??;
        if is_terminal(rec.status()) {
            if let Some(m) = mtime {
                self.seen.insert(job_id.to_string(), m);
            }
            return None;
        }
        self.seen.remove(job_id);
        Some(rec)
    }
}

/// One A15 sweep over `store` at `now_ms`. `cas` is `MAM_ENGINE_CAS` not being `0`.
pub fn sweep(store: &Store, cache: &mut TerminalCache, cas: bool, now_ms: u64) -> Vec<Closed> {
    let mut out = Vec::new();
    // Streamed from the directory: a registry of 100,000 finished jobs costs a stat each (the
    // cache) and no list of them.
    let Ok(ids) = store.ids() else { return out };
    for id in ids.map_while(Result::ok) {
        let Some(rec) = cache.open_record(store, &id) else { continue };
        let alive = watcher_alive(&rec);
        let Some(close) = judge(&rec, alive, events_mtime_ms(&store.registry, &id), now_ms) else { continue };
        let mut req = match close {
            Close::Expire => Request::new(Kind::Expire, Authority::Operator, &id),
            Close::Unresponsive => {
                let mut r = Request::new(Kind::Set, Authority::Operator, &id).with_status("deadline_timeout");
                r.reason = Some("unresponsive".into());
                r
            }
        };
        req.cas = cas;
        req.alloc_seq = true;
        // Close only the attempt that was judged: a redispatch in between makes this a cas_failed refusal.
        req.expected_attempt = rec.attempt();
        let mut applied = None;
        let result = match store.apply(&req, now_ms) {
            Ok(o) => match o.decision {
                Decided::Applied(a) => {
                    applied = a.seq.map(|seq| (a.record.clone(), seq));
                    Ok(a.to)
                }
                Decided::Idempotent { status } => Ok(status),
                Decided::Refused { reason } => Err(format!("refused ({reason})")),
            },
            Err(e) => Err(e.to_string()),
        };
        out.push(Closed { job_id: id, close, result, applied });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::format_ts;
    use serde_json::json;

    const NOW: u64 = 1_757_725_323_456;

    fn rec(v: serde_json::Value) -> Record {
        Record::new(v.as_object().unwrap().clone())
    }

    fn base(status: &str) -> serde_json::Value {
        json!({"job_id": "j", "status": status, "attempt": 1, "idle_timeout_sec": 10,
               "created_at": format_ts(NOW - 60_000), "dispatched_at": format_ts(NOW - 60_000),
               "updated_at": format_ts(NOW - 60_000), "deadline_at": null})
    }

    #[test]
    fn a15_deadline_then_silence() {
        let mut v = base("running");
        v["deadline_at"] = json!(format_ts(NOW - 1));
        assert_eq!(judge(&rec(v.clone()), false, None, NOW), Some(Close::Expire));
        // A live watcher owns the job; a terminal job is left alone.
        assert_eq!(judge(&rec(v.clone()), true, None, NOW), None);
        v["status"] = json!("completed");
        assert_eq!(judge(&rec(v), false, None, NOW), None);

        // Silent for 60 s with idle 10 s: unresponsive. Evidence 14 s ago is inside 10 + 5.
        assert_eq!(judge(&rec(base("pending")), false, None, NOW), Some(Close::Unresponsive));
        let mut v = base("running");
        v["heartbeat_at"] = json!(format_ts(NOW - 14_000));
        assert_eq!(judge(&rec(v.clone()), false, None, NOW), None);
        assert_eq!(judge(&rec(v), false, None, NOW + 1_000), Some(Close::Unresponsive));
        // events.log mtime is evidence too.
        assert_eq!(judge(&rec(base("running")), false, Some(NOW - 2_000), NOW), None);
        // A future deadline is not reached.
        let mut v = base("running");
        v["deadline_at"] = json!(format_ts(NOW + 1));
        v["last_event_at"] = json!(format_ts(NOW));
        assert_eq!(judge(&rec(v), false, None, NOW), None);
    }

    #[test]
    fn idle_window_falls_back_to_k_times_n() {
        assert_eq!(idle_ms(&rec(json!({"heartbeat_sec": 2, "heartbeat_misses": 3}))), 6_000);
        assert_eq!(idle_ms(&rec(json!({"idle_timeout_sec": 0, "heartbeat_sec": 2, "heartbeat_misses": 3}))), 6_000);
        assert_eq!(idle_ms(&rec(json!({}))), 120_000);
    }

    #[test]
    fn a4_close_state_is_signed_with_the_job_key() {
        let mut v = base("deadline_timeout");
        v["topic_prefix"] = json!("mam/jobs/j");
        v["auth_token"] = json!("k".repeat(64));
        v["dispatch_token"] = json!("t".repeat(32));
        let (topic, payload) = close_state(&rec(v.clone()), 9, NOW).unwrap();
        assert_eq!(topic, "mam/jobs/j/state");
        let p: serde_json::Value = serde_json::from_slice(&payload).unwrap();
        assert_eq!(
            (p["status"].as_str(), p["last_event"].as_str(), p["seq"].as_u64()),
            (Some("deadline_timeout"), Some("closed"), Some(9))
        );
        assert!(crate::sign::verify("k".repeat(64).as_bytes(), &p));
        v.as_object_mut().unwrap().remove("auth_token");
        assert!(close_state(&rec(v), 9, NOW).is_none());
    }

    #[test]
    fn watcher_liveness() {
        let me = std::process::id();
        assert!(watcher_alive(&rec(json!({"watcher_pid": me}))));
        assert!(!watcher_alive(&rec(json!({}))));
        assert!(!watcher_alive(&rec(json!({"watcher_pid": null}))));
        assert!(!watcher_alive(&rec(json!({"watcher_pid": 0}))));
        assert!(!watcher_alive(&rec(json!({"watcher_pid": "123"}))));
    }
}
