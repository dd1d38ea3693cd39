//! Store and forward (issue 19): the events of a job's current attempt that are in events.log but
//! never reached the wire (a broker outage, a failover window), found by comparing events.log with
//! the `published: true` entries of the job's audit, and sent again in seq order over a connection
//! the caller already has, each audited `published` with `replayed: true` once acknowledged.
//!
//! Beats (`heartbeat: true`) are never replayed: a later beat says more than an old one, and a beat
//! the wire thread dropped was never meant to be sent. The replayed bytes are the events.log line
//! itself, so a watcher that saw the event already drops it by seq (CORE 8.3). Callers: every
//! one-shot publish and close (`publish::send_one_shot`, before its own event), the heartbeat
//! timer (before a beat, after a reconnect or when other seqs were allocated since its last beat)
//! and the workspace daemon (for jobs with no live timer and no publish in flight).
//!
//! It never writes a record or events.log, never prints, and reads a bounded tail of each file.

use std::collections::BTreeMap;
use std::collections::HashSet;

use serde_json::{json, Value};

use crate::clock;
use crate::joblog::{self, events_log_path};
use crate::mqtt::{Client, MqttError};
use crate::registry::audit;
use crate::registry::store::Store;
use crate::wire::{self, Job, StateCheck};

/// How much of the end of events.log and of audit.jsonl one look reads at most: unsent events are
/// recent, and a long log must not be read whole on every beat.
pub const SCAN_BYTES: u64 = 4 * 1024 * 1024;
/// At most this many events are replayed by one call (the oldest first); the next call sends the rest.
pub const MAX_REPLAY: usize = 256;

/// One event on disk that no audit entry confirms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsent {
    pub seq: u64,
    pub event: String,
    pub bytes: Vec<u8>,
}

/// How old an event without any `published` audit entry must be before it counts as unsent: its
/// publisher may still be trying (a one-shot's wire budget, A8, is 20 s; a terminal makes three
/// attempts of at most one connect timeout each) or may have died trying.
pub const ORPHAN_AFTER_MS: u64 = 60_000;

/// The current attempt's non-beat events with `seq < below` that did not reach the wire, oldest
/// first (at most `MAX_REPLAY`): those whose publisher audited `published: false` and nothing
/// confirmed since, and those with no `published` entry at all that are older than
/// `ORPHAN_AFTER_MS` at `now_ms` (their publisher died). An event still in flight is neither, so
/// concurrent publishers do not send each other's events twice.
pub fn unsent(store: &Store, job: &Job, below: u64, now_ms: u64) -> Vec<Unsent> {
    look(store, job, below, now_ms).unsent
}

/// What one look at a job's files found.
#[derive(Debug, Default)]
pub struct Look {
    /// What `unsent` returns.
    pub unsent: Vec<Unsent>,
    /// Events not confirmed yet that may still be in flight: a later look may find them unsent.
    pub waiting: usize,
    /// events.log's length as read, when every event of the current attempt in it was confirmed
    /// except the one of seq `below` itself: what a confirmed publish of `below` records as
    /// `clean_to` in its `published` entry, so that later looks start reading there.
    pub clean_to: Option<u64>,
    /// Where this look started reading events.log (the newest `clean_to`), and the lines it read.
    pub from: u64,
    pub lines: usize,
}

/// How many audit lines a look reads back at most to find the newest `clean_to` before it reads
/// events.log from the start of its tail instead.
const CLEAN_SCAN_LINES: usize = 512;

/// The newest `clean_to` of a confirmed publish in the job's audit: every event line before that
/// offset of events.log was confirmed when it was written, so no look needs to read them again
/// (confirmations are never taken back, and events.log is only appended to).
fn clean_floor(audit_path: &std::path::Path) -> u64 {
    let mut floor = 0;
    let mut n = 0;
    let _ = joblog::scan_lines_back(audit_path, joblog::MAX_LINE, SCAN_BYTES, |l| {
        n += 1;
        if contains(l, br#""clean_to""#) {
            if let Ok(v) = serde_json::from_slice::<Value>(l) {
                if let (true, Some(to)) = (v["kind"] == "published" && v["published"] == true, v["clean_to"].as_u64()) {
                    floor = to;
                    return true;
                }
            }
        }
        n >= CLEAN_SCAN_LINES
    });
    floor
}

/// `unsent`, also counting the events that may still be in flight.
pub fn look(store: &Store, job: &Job, below: u64, now_ms: u64) -> Look {
    let audit_path = audit::job_dir(&store.logs, &job.job_id).join("audit.jsonl");
    look_from(store, job, &audit_path, below, now_ms, clean_floor(&audit_path))
}

fn look_from(store: &Store, job: &Job, audit_path: &std::path::Path, below: u64, now_ms: u64, from: u64) -> Look {
    let events = events_log_path(&store.registry, &job.job_id);
    // Every event of the current attempt after `from` but the one of seq `below`, and whether it is
    // one that `unsent` may return (seq < below) and an orphan by its age.
    let mut found: BTreeMap<u64, (Unsent, bool)> = BTreeMap::new();
    let mut lines = 0;
    let scanned = joblog::scan_lines_back_to(&events, from, joblog::MAX_LINE, SCAN_BYTES, |line| {
        lines += 1;
        // Most lines are beats: events.log holds canonical JSON, so they are told by their bytes
        // and never parsed (a beat of an earlier attempt is passed over, the next event stops).
        if contains(line, br#""heartbeat":true"#) {
            return false;
        }
        let Ok(v) = serde_json::from_slice::<Value>(line) else { return false };
        if v["kind"] != "event" {
            return false;
        }
        match v["attempt"].as_u64() {
            // Attempts only grow along the file: everything before is history.
            Some(a) if a < job.attempt => return true,
            Some(a) if a > job.attempt => return false,
            None => return false,
            Some(_) => {}
        }
        if v["dispatch_token"].as_str() != Some(job.dispatch_token.as_str()) || v["heartbeat"] == Value::Bool(true) {
            return false;
        }
        if let (Some(seq), Some(event)) = (v["seq"].as_u64(), v["event"].as_str()) {
            if seq != below {
                let orphan = v["ts"].as_str().and_then(clock::parse_ts).is_some_and(|t| now_ms >= t + ORPHAN_AFTER_MS);
                found.insert(seq, (Unsent { seq, event: event.to_string(), bytes: line.to_vec() }, orphan));
            }
        }
        false
    });
    let Ok(scanned) = scanned else { return Look { from, lines, ..Look::default() } };
    if scanned < from {
        // Shorter than a confirmed publish saw it: not the same file; read its tail whole.
        return look_from(store, job, audit_path, below, now_ms, 0);
    }
    if found.is_empty() {
        return Look { clean_to: Some(scanned), from, lines, ..Look::default() };
    }
    let mut pending: HashSet<u64> = found.keys().copied().collect();
    let mut failed: HashSet<u64> = HashSet::new();
    let _ = joblog::scan_lines_back(audit_path, joblog::MAX_LINE, SCAN_BYTES, |l| {
        if !contains(l, br#""published""#) {
            return false;
        }
        let Ok(v) = serde_json::from_slice::<Value>(l) else { return false };
        if v["kind"] == "published" {
            if let Some(seq) = v["seq"].as_u64() {
                if v["published"] == Value::Bool(true) {
                    pending.remove(&seq);
                } else if pending.contains(&seq) {
                    failed.insert(seq);
                }
            }
        }
        pending.is_empty()
    });
    let mut out = Look { from, lines, ..Look::default() };
    if pending.is_empty() {
        out.clean_to = Some(scanned);
    }
    for (u, orphan) in found.into_values().filter(|(u, _)| u.seq < below && pending.contains(&u.seq)) {
        if failed.contains(&u.seq) || orphan {
            if out.unsent.len() < MAX_REPLAY {
                out.unsent.push(u);
            }
        } else {
            out.waiting += 1;
        }
    }
    out
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// What one replay achieved.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Replayed {
    /// The seqs acknowledged by the broker, in order.
    pub seqs: Vec<u64>,
    /// The retained state sent after them (`with_state`).
    pub state_sent: bool,
}

/// Sends `list` over `c` in order, each audited `published` (`replayed: true`) once acknowledged;
/// with `with_state`, then the re-checked retained state of the last one (CORE 6.3 step 5), so a
/// watcher that connects later still recovers a replayed terminal. Stops at the first wire error,
/// which is returned; what was acknowledged before it is in `done`.
pub fn send(
    store: &Store,
    job: &Job,
    c: &mut Client,
    list: &[Unsent],
    with_state: bool,
    done: &mut Replayed,
    diag: &mut dyn FnMut(String),
) -> Result<(), MqttError> {
    for u in list {
        if done.seqs.contains(&u.seq) {
            continue;
        }
        c.publish(&job.event_message(&u.bytes))?;
        done.seqs.push(u.seq);
        let rest = json!({"seq": u.seq, "event": u.event, "published": true, "state_published": false,
                          "attempts": 1, "replayed": true, "broker": c.addr()});
        let e = audit::entry(clock::now_ms(), &job.job_id, Some(job.attempt), "published", rest);
        if let Err(err) = audit::flush(&store.logs, &job.job_id, &[e], None) {
            diag(format!(
                "WARNING: {}: audit not written ({err})",
                crate::text::show_path(&audit::job_dir(&store.logs, &job.job_id))
            ));
        }
    }
    if let (true, Some(last)) = (with_state && !done.state_sent, list.last()) {
        if let StateCheck::Send(msg) = wire::recheck_state(store, job, &last.event, last.seq) {
            c.publish(&msg)?;
        }
        done.state_sent = true;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::record::Record;
    use std::fs;

    fn job() -> Job {
        let v = json!({"job_id": "j1", "attempt": 2, "dispatch_token": "tok", "auth_token": "k".repeat(64),
                       "agent_session": "w1", "topic_prefix": "mam/jobs/j1", "status": "running"});
        Job::from_record(&Record::new(v.as_object().unwrap().clone())).unwrap()
    }

    fn line(attempt: u64, token: &str, seq: u64, event: &str, beat: bool) -> String {
        format!(
            "{}\n",
            json!({"kind": "event", "attempt": attempt, "dispatch_token": token, "seq": seq, "event": event,
                   "heartbeat": beat, "ts": "2026-01-01T00:00:00.000Z"})
        )
    }

    /// A fresh directory with job j1's registry and log directories, and its store.
    fn job_dirs() -> (std::path::PathBuf, Store) {
        let dir = std::env::temp_dir().join(format!("mam-forward-{}", crate::sys::random_hex(4).unwrap()));
        fs::create_dir_all(dir.join("jobs/j1")).unwrap();
        fs::create_dir_all(dir.join("logs/j1")).unwrap();
        let store = Store::new(dir.join("jobs"), dir.join("logs"));
        (dir, store)
    }

    #[test]
    fn unsent_is_the_current_attempts_unconfirmed_non_beat_events_in_order() {
        let (dir, store) = job_dirs();
        let log = [
            line(1, "old", 1, "started", false),
            line(2, "tok", 2, "started", false),
            line(2, "tok", 3, "progress", true),
            line(2, "other", 4, "progress", false),
            line(2, "tok", 5, "progress", false),
            line(2, "tok", 6, "completed", false),
        ]
        .concat();
        fs::write(dir.join("jobs/j1/events.log"), log).unwrap();
        let t0 = clock::parse_ts("2026-01-01T00:00:00.000Z").unwrap();
        let later = t0 + ORPHAN_AFTER_MS;
        let seqs = |below, now| unsent(&store, &job(), below, now).iter().map(|u| u.seq).collect::<Vec<_>>();
        // No audit entry at all: in flight until ORPHAN_AFTER_MS, then a publisher that died.
        assert_eq!(seqs(u64::MAX, t0 + 1000), Vec::<u64>::new());
        assert_eq!(seqs(u64::MAX, later), [2, 5, 6]);
        assert_eq!(seqs(6, later), [2, 5]);
        audit::write_published_for_test(&dir.join("logs"), "j1", &[(2, true), (6, false)]);
        // A failed publish is unsent at once; a confirmed one never.
        assert_eq!(seqs(u64::MAX, t0 + 1000), [6]);
        assert_eq!(seqs(u64::MAX, later), [5, 6]);
        let u = unsent(&store, &job(), u64::MAX, later);
        assert_eq!(u[1].event, "completed");
        assert_eq!(u[1].bytes, line(2, "tok", 6, "completed", false).trim_end().as_bytes());
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_look_starts_after_the_newest_clean_publish_and_only_a_clean_look_says_clean() {
        let (dir, store) = job_dirs();
        let events = dir.join("jobs/j1/events.log");
        let audit_path = dir.join("logs/j1/audit.jsonl");
        let head: String = (2..=40).map(|seq| line(2, "tok", seq, "progress", false)).collect();
        fs::write(&events, &head).unwrap();
        let t0 = clock::parse_ts("2026-01-01T00:00:00.000Z").unwrap();
        let later = t0 + ORPHAN_AFTER_MS;
        // Nothing confirmed: every line is read, 2..=39 are orphans, and the look is not clean.
        let l = look(&store, &job(), 40, later);
        assert_eq!((l.from, l.lines, l.unsent.len(), l.clean_to), (0, 39, 38, None));
        // All confirmed: clean up to the length read.
        let all: Vec<(u64, bool)> = (2..=39).map(|s| (s, true)).collect();
        audit::write_published_for_test(&dir.join("logs"), "j1", &all);
        let l = look(&store, &job(), 40, later);
        assert_eq!((l.unsent.len(), l.waiting, l.clean_to), (0, 0, Some(head.len() as u64)));
        // A later line of someone else's publish still in flight (seq above ours): not clean.
        let mut with_41 = head.clone();
        with_41.push_str(&line(2, "tok", 41, "progress", false));
        fs::write(&events, &with_41).unwrap();
        let l = look(&store, &job(), 40, t0);
        assert_eq!((l.unsent.len(), l.waiting, l.clean_to), (0, 0, None));
        // The publish of 40 confirmed with clean_to: the next look reads only what follows.
        let mut text = fs::read_to_string(&audit_path).unwrap();
        text.push_str(&format!(
            "{{\"kind\":\"published\",\"seq\":40,\"published\":true,\"clean_to\":{}}}\n",
            head.len()
        ));
        fs::write(&audit_path, &text).unwrap();
        let l = look(&store, &job(), u64::MAX, later);
        assert_eq!((l.from, l.lines), (head.len() as u64, 1));
        assert_eq!(l.unsent.iter().map(|u| u.seq).collect::<Vec<_>>(), [41], "an orphan after the floor is found");
        // A failed publish with clean_to is no floor; nor is a clean_to past the end of the file.
        fs::write(
            &audit_path,
            format!("{text}{{\"kind\":\"published\",\"seq\":41,\"published\":false,\"clean_to\":9}}\n"),
        )
        .unwrap();
        assert_eq!(look(&store, &job(), u64::MAX, later).from, head.len() as u64);
        fs::write(&audit_path, "{\"kind\":\"published\",\"seq\":40,\"published\":true,\"clean_to\":999999}\n").unwrap();
        let l = look(&store, &job(), u64::MAX, later);
        assert_eq!((l.from, l.lines, l.unsent.len()), (0, 40, 39), "read whole again");
        let _ = fs::remove_dir_all(&dir);
    }
}
