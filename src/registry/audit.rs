//! The per-job audit log and status mirror (CORE 5.5): `<logs>/<job_id>/audit.jsonl` lines and
//! `<logs>/<job_id>/status.json`, both written under the per-job audit lock L5
//! (`<logs>/<job_id>/.audit.lock`).
//!
//! This module builds audit entries from engine decisions and flushes them. It must never be
//! called while the registry lock L1 is held (CORE 0.6); it never writes a job record.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use super::engine::{Decided, Kind, Request};
use super::record::Record;
use crate::clock::format_ts;
use crate::sys::{self, Flock, LockMode};

/// The directory of one job's logs.
pub fn job_dir(logs: &Path, job_id: &str) -> PathBuf {
    logs.join(job_id)
}

/// Writes `entries` (`(seq, published)`) as the whole audit.jsonl of `job_id`: the bare `published`
/// lines the readers of confirmations look for, for their unit tests.
#[cfg(test)]
pub fn write_published_for_test(logs: &Path, job_id: &str, entries: &[(u64, bool)]) {
    let lines: String = entries
        .iter()
        .map(|(seq, ok)| format!("{{\"kind\":\"published\",\"seq\":{seq},\"published\":{ok}}}\n"))
        .collect();
    fs::write(job_dir(logs, job_id).join("audit.jsonl"), lines).unwrap();
}

/// One audit line: `{"ts","job_id","attempt","kind",...rest}`.
pub fn entry(now_ms: u64, job_id: &str, attempt: Option<u64>, kind: &str, rest: Value) -> Value {
    let mut m = Map::new();
    m.insert("ts".into(), format_ts(now_ms).into());
    m.insert("job_id".into(), job_id.into());
    m.insert("attempt".into(), attempt.map(Value::from).unwrap_or(Value::Null));
    m.insert("kind".into(), kind.into());
    if let Value::Object(rest) = rest {
        m.extend(rest);
    }
    Value::Object(m)
}

/// The audit entries of one engine decision (CORE 5.5): `registered`, `transition`,
/// `mirror_admitted`, `scrubbed`, `idempotent`, `refused` or `mirror_refused`. Invalid requests and
/// unknown jobs write nothing.
pub fn entries_for(req: &Request, before: Option<&Record>, decision: &Decided, now_ms: u64) -> Vec<Value> {
    let rec_attempt = before.and_then(Record::attempt);
    let request = req.kind.name();
    match decision {
        // Beats write no per-beat audit (CORE 7.5, decided); the status mirror still advances.
        Decided::Applied(_) if req.kind == Kind::Beat => Vec::new(),
        Decided::Applied(a) => {
            let attempt = a.record.attempt();
            let kind = match req.kind {
                Kind::Register => "registered",
                Kind::Mirror => "mirror_admitted",
                Kind::Scrub => "scrubbed",
                _ => "transition",
            };
            let mut rest = json!({"transition_seq": a.transition_seq, "request": request, "from": a.from, "to": a.to});
            if let Some(seq) = a.seq {
                rest["seq"] = seq.into();
            }
            if let Some(r) = &req.reason {
                rest["reason"] = r.clone().into();
            }
            if !req.fields.is_empty() {
                // Key names only: values are the record's business, not the log's.
                rest["fields"] = req.fields.keys().cloned().collect::<Vec<_>>().into();
            }
            vec![entry(now_ms, &req.job_id, attempt, kind, rest)]
        }
        Decided::Idempotent { status } => {
            vec![entry(now_ms, &req.job_id, rec_attempt, "idempotent", json!({"request": request, "status": status}))]
        }
        Decided::Refused { reason } => {
            let kind = if req.kind == Kind::Mirror { "mirror_refused" } else { "refused" };
            let mut rest = json!({
                "request": request,
                "status": before.map(|r| r.status().to_string()),
                "reason": reason,
            });
            if let Some(a) = req.attempt {
                rest["request_attempt"] = a.into();
            }
            if let Some(s) = &req.target_status {
                rest["target_status"] = s.clone().into();
            }
            vec![entry(now_ms, &req.job_id, rec_attempt, kind, rest)]
        }
    }
}

/// The status mirror of a record (CORE 5.5 step 4).
pub fn mirror_of(rec: &Record) -> Value {
    let g = |k: &str| rec.get(k).cloned().unwrap_or(Value::Null);
    json!({
        "job_id": g("job_id"),
        "attempt": g("attempt"),
        "status": g("status"),
        "last_event": g("last_event"),
        "last_seq": g("last_seq"),
        "transition_seq": g("transition_seq"),
        "updated_at": g("updated_at"),
    })
}

/// A held L5 for one job. Creating it creates `<logs>/<job_id>/` (mode 0700) lazily.
#[derive(Debug)]
pub struct AuditLock {
    dir: PathBuf,
    _lock: Flock,
}

/// Takes L5 for `job_id`, blocking. Must not be called while L1 is held.
pub fn lock(logs: &Path, job_id: &str) -> io::Result<AuditLock> {
    debug_assert!(!sys::holds_registry_lock(), "L5 taken under L1 (CORE 0.6)");
    let dir = job_dir(logs, job_id);
    sys::create_dir_all(&dir)?;
    let lock = Flock::lock_path(&dir.join(".audit.lock"), LockMode::Exclusive)?;
    Ok(AuditLock { dir, _lock: lock })
}

impl AuditLock {
    /// Appends `entries` (one write) and writes `mirror` to status.json only when its
    /// transition_seq is greater than the stored one, so the mirror never goes backwards.
    pub fn flush(&self, entries: &[Value], mirror: Option<&Value>) -> io::Result<()> {
        self.flush_staged(entries, mirror, None)
    }

    /// `flush` that renames `staged` (status.json for `mirror`, written ahead by `stage_mirror`)
    /// into place instead of writing it now; an unused one is removed.
    pub fn flush_staged(
        &self,
        entries: &[Value],
        mirror: Option<&Value>,
        staged: Option<StagedMirror>,
    ) -> io::Result<()> {
        if !entries.is_empty() {
            let mut buf = Vec::new();
            for e in entries {
                serde_json::to_writer(&mut buf, e).map_err(io::Error::other)?;
                buf.push(b'\n');
            }
            sys::append_locked(&self.dir.join("audit.jsonl"), &buf)?;
        }
        if let Some(m) = mirror {
            let path = self.dir.join("status.json");
            let stored = match fs::read(&path) {
                Ok(b) => serde_json::from_slice::<Value>(&b)
                    .ok()
                    .and_then(|v| v.get("transition_seq").and_then(Value::as_u64))
                    .unwrap_or(0),
                Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
                Err(e) => return Err(e),
            };
            let new = m.get("transition_seq").and_then(Value::as_u64).unwrap_or(0);
            if new > stored {
                match staged.filter(|s| s.mirror == *m && s.file.target() == path) {
                    // A mirror of the record: no directory fsync (sys::atomic_write_mirror).
                    Some(s) => s.file.commit(false)?,
                    None => sys::atomic_write_mirror(&path, &mirror_bytes(m)?)?,
                }
            }
        }
        Ok(())
    }
}

/// status.json's bytes for `mirror`.
fn mirror_bytes(mirror: &Value) -> io::Result<Vec<u8>> {
    let mut bytes = serde_json::to_vec_pretty(mirror).map_err(io::Error::other)?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// status.json for `mirror`, written and fsynced under a temp name ahead of the flush that renames
/// it into place (issue 20: while the record is written, so the two fsyncs overlap). The flush
/// still decides, under L5, whether it moves the mirror forward; if not, the temp file goes.
#[derive(Debug)]
pub struct StagedMirror {
    mirror: Value,
    file: sys::Staged,
}

/// Stages status.json for `mirror` in `job_id`'s log directory, which must exist (L5 is held).
pub fn stage_mirror(logs: &Path, job_id: &str, mirror: Value) -> io::Result<StagedMirror> {
    let file = sys::Staged::write(&job_dir(logs, job_id).join("status.json"), &mirror_bytes(&mirror)?, 0o600)?;
    Ok(StagedMirror { mirror, file })
}

/// Takes L5, flushes, releases (CORE 5.5 steps 1-5). For writers other than the engine (publish's
/// `published` entries, the timer's `heartbeat_*` entries) pass `mirror: None`.
pub fn flush(logs: &Path, job_id: &str, entries: &[Value], mirror: Option<&Value>) -> io::Result<()> {
    lock(logs, job_id)?.flush(entries, mirror)
}
