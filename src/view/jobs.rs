//! One job as the live views show it (`mam jobs`, `mam ui`): its status, session, claim and finish
//! times, the newest evidence of life (record timestamps or the events.log mtime), the last
//! heartbeat (the record's `heartbeat_at`, else the last events.log line with `"heartbeat":true`),
//! its idle window, and whether it is silent past that window (issue 18).
//!
//! It reads files only (no lock, no broker) and creates nothing; reads are bounded (the record's
//! fields of interest, the last 64 KiB of events.log). It never holds or shows a token.

use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::time::UNIX_EPOCH;

use serde_json::Value;

use crate::clock;
use crate::daemon::sweep::{idle_ms, last_evidence_ms};
use crate::registry::record::Record;
use crate::registry::store::{Store, StoreError};
use crate::text;

/// One job.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub job_id: String,
    pub status: String,
    pub attempt: Option<u64>,
    pub session: String,
    pub created_at: String,
    pub evidence_ms: Option<u64>,
    pub heartbeat_ms: Option<u64>,
    /// The claim (else the registration) time.
    pub started_ms: Option<u64>,
    pub finished_ms: Option<u64>,
    /// The idle window (`sweep::idle_ms`).
    pub idle_ms: u64,
    /// The record's `type` (task when absent).
    pub job_type: String,
    /// Why it ended (`reason`), when it says.
    pub reason: Option<String>,
    /// Where its report is written (`report_path`).
    pub report_path: Option<String>,
}

impl Row {
    pub fn finished(&self) -> bool {
        crate::registry::is_terminal(&self.status)
    }

    /// How long a live job has been silent: `Some(ms since the last evidence)` when it is not
    /// finished, not pending, and that is longer than its idle window.
    pub fn silent_ms(&self, now_ms: u64) -> Option<u64> {
        if self.finished() || self.status == "pending" {
            return None;
        }
        let since = now_ms.saturating_sub(self.evidence_ms.or(self.started_ms)?);
        (since > self.idle_ms).then_some(since)
    }

    /// When the job goes silent if nothing new arrives (for a live job with evidence).
    pub fn silent_at_ms(&self) -> Option<u64> {
        if self.finished() || self.status == "pending" {
            return None;
        }
        Some(self.evidence_ms.or(self.started_ms)? + self.idle_ms + 1)
    }

    pub fn elapsed_ms(&self, now_ms: u64) -> Option<u64> {
        Some(self.finished_ms.unwrap_or(now_ms).saturating_sub(self.started_ms?))
    }
}

/// The mtime of `path` in ms since the epoch.
pub fn mtime_ms(path: &Path) -> Option<u64> {
    fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as u64)
}

/// The row of one record; `registry` is where its events.log lives.
pub fn row(rec: &Record, registry: &Path) -> Row {
    let id = rec.str("job_id").unwrap_or("");
    let events = registry.join(id).join("events.log");
    // One stat: most records of a large registry have no events.log, so nothing more is opened.
    let events_mtime = mtime_ms(&events);
    let heartbeat = events_mtime.and_then(|_| last_heartbeat_line_ms(&events));
    row_with(rec, events_mtime, heartbeat)
}

/// The row of one record given what its events.log says: its mtime and its last heartbeat line.
pub fn row_with(rec: &Record, events_mtime: Option<u64>, events_heartbeat: Option<u64>) -> Row {
    let ts = |k: &str| rec.str(k).and_then(clock::parse_ts);
    Row {
        evidence_ms: last_evidence_ms(rec, events_mtime),
        heartbeat_ms: ts("heartbeat_at").or(events_heartbeat),
        started_ms: ts("claimed_at").or_else(|| ts("created_at")),
        finished_ms: ts("finished_at"),
        idle_ms: idle_ms(rec),
        status: rec.status().to_string(),
        attempt: rec.attempt(),
        session: rec.str("agent_session").unwrap_or("").to_string(),
        created_at: rec.str("created_at").unwrap_or("").to_string(),
        job_type: rec.str("type").unwrap_or("task").to_string(),
        reason: rec.str("reason").filter(|r| !r.is_empty()).map(str::to_string),
        report_path: rec.str("report_path").filter(|r| !r.is_empty()).map(str::to_string),
        job_id: rec.str("job_id").unwrap_or("").to_string(),
    }
}

/// The `ts` of the last events.log line with `"heartbeat":true`, looking at the last 64 KiB only.
pub fn last_heartbeat_line_ms(path: &Path) -> Option<u64> {
    const TAIL: u64 = 64 * 1024;
    let mut f = File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    let start = len.saturating_sub(TAIL);
    f.seek(SeekFrom::Start(start)).ok()?;
    let mut buf = Vec::with_capacity((len - start) as usize);
    f.take(TAIL).read_to_end(&mut buf).ok()?;
    let needle = b"\"heartbeat\":true";
    buf.split(|&b| b == b'\n').rev().filter(|l| l.windows(needle.len()).any(|w| w == needle)).find_map(|l| {
        let v: Value = serde_json::from_slice(l).ok()?;
        (v.get("heartbeat") == Some(&Value::Bool(true))).then(|| v.get("ts")?.as_str().and_then(clock::parse_ts))?
    })
}

/// The fields the views show, parsed without building the whole record (10,000 records are read on
/// every `mam jobs --follow` redraw). `None` when the bytes are not a JSON object.
pub fn slim(bytes: &[u8]) -> Option<Record> {
    #[derive(serde::Deserialize)]
    struct Slim {
        job_id: Option<Value>,
        status: Option<Value>,
        attempt: Option<Value>,
        agent_session: Option<Value>,
        created_at: Option<Value>,
        last_event_at: Option<Value>,
        heartbeat_at: Option<Value>,
        claimed_at: Option<Value>,
        updated_at: Option<Value>,
        dispatched_at: Option<Value>,
        finished_at: Option<Value>,
        heartbeat_sec: Option<Value>,
        heartbeat_misses: Option<Value>,
        idle_timeout_sec: Option<Value>,
        #[serde(rename = "type")]
        job_type: Option<Value>,
        reason: Option<Value>,
        report_path: Option<Value>,
    }
    // serde also fills a struct from an array: only an object is a record.
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return None;
    }
    let s: Slim = serde_json::from_slice(bytes).ok()?;
    let mut m = serde_json::Map::new();
    for (k, v) in [
        ("job_id", s.job_id),
        ("status", s.status),
        ("attempt", s.attempt),
        ("agent_session", s.agent_session),
        ("created_at", s.created_at),
        ("last_event_at", s.last_event_at),
        ("heartbeat_at", s.heartbeat_at),
        ("claimed_at", s.claimed_at),
        ("updated_at", s.updated_at),
        ("dispatched_at", s.dispatched_at),
        ("finished_at", s.finished_at),
        ("heartbeat_sec", s.heartbeat_sec),
        ("heartbeat_misses", s.heartbeat_misses),
        ("idle_timeout_sec", s.idle_timeout_sec),
        ("type", s.job_type),
        ("reason", s.reason),
        ("report_path", s.report_path),
    ] {
        if let Some(v) = v {
            m.insert(k.to_string(), v);
        }
    }
    Some(Record::new(m))
}

/// Every job of `store`, sorted by created_at then id. Unreadable records come back as warnings.
pub fn rows(store: &Store) -> Result<(Vec<Row>, Vec<String>), StoreError> {
    let mut out = Vec::new();
    let mut warnings = Vec::new();
    for id in store.job_ids()? {
        let path = store.record_path(&id);
        match fs::read(&path) {
            Ok(bytes) => match slim(&bytes) {
                Some(r) => out.push(row(&r, &store.registry)),
                None => warnings.push(format!("WARNING: {}: not a valid job record; skipped", text::show_path(&path))),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {} // removed since the listing
            Err(e) => warnings.push(format!("WARNING: {}: cannot read record ({e}); skipped", text::show_path(&path))),
        }
    }
    out.sort_by(|a, b| (&a.created_at, &a.job_id).cmp(&(&b.created_at, &b.job_id)));
    Ok((out, warnings))
}

/// `45s`, `3m07s`, `2h05m`, `3d04h`; `-` for none.
pub fn age(then_ms: Option<u64>, now_ms: u64) -> String {
    let Some(t) = then_ms else { return "-".into() };
    let s = now_ms.saturating_sub(t) / 1000;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86_400, (s % 86_400) / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slim_reads_objects_only() {
        assert!(slim(b"[1,2,3,4,5,6,7,8,9,10]").is_none());
        assert!(slim(b"{").is_none());
        let r = slim(br#" {"job_id":"a","status":"running","attempt":2,"type":"review","x":{"deep":[1]}}"#).unwrap();
        assert_eq!((r.str("job_id"), r.status(), r.attempt()), (Some("a"), "running", Some(2)));
        assert_eq!(r.str("type"), Some("review"));
        assert!(r.get("x").is_none());
    }

    #[test]
    fn ages() {
        assert_eq!(age(None, 10), "-");
        assert_eq!(age(Some(1_000), 46_999), "45s");
        assert_eq!(age(Some(0), 187_000), "3m07s");
        assert_eq!(age(Some(0), 7_500_000), "2h05m");
        assert_eq!(age(Some(0), (3 * 86_400 + 4 * 3600) * 1000), "3d04h");
        assert_eq!(age(Some(5_000), 1_000), "0s", "a future timestamp is not negative");
    }

    #[test]
    fn silent_after_the_window() {
        let rec =
            slim(br#"{"job_id":"a","status":"running","claimed_at":"2024-01-01T00:00:00.000Z","idle_timeout_sec":2}"#)
                .unwrap();
        let r = row_with(&rec, None, None);
        let t0 = clock::parse_ts("2024-01-01T00:00:00.000Z").unwrap();
        assert_eq!(r.silent_ms(t0 + 2_000), None);
        assert_eq!(r.silent_ms(t0 + 2_001), Some(2_001));
        assert_eq!(r.silent_at_ms(), Some(t0 + 2_001));
    }
}
