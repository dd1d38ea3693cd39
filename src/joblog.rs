//! A job's files below publish and the timer (CORE 6.3, 6.4, 7.5): the events.log path, preparing it
//! and appending one signed line under L4, reading the latest line of an attempt, and the in-flight
//! lock L3 that orders one-shot publishes against the terminal.
//!
//! It knows nothing of the engine, the wire or the timer; it never prints.

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::sys::{self, Flock, LockMode};
use crate::text::show_path;

/// The poll interval of an exclusive L3 wait (A8).
pub const INFLIGHT_POLL: Duration = Duration::from_millis(50);

/// A job file that could not be prepared, locked or appended to: what failed, on which path.
#[derive(Debug)]
pub struct JoblogError {
    pub what: &'static str,
    pub path: PathBuf,
    pub err: io::Error,
}

impl fmt::Display for JoblogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} ({})", show_path(&self.path), self.what, self.err)
    }
}

/// `<registry>/<job_id>/events.log`.
pub fn events_log_path(registry: &Path, job_id: &str) -> PathBuf {
    registry.join(job_id).join("events.log")
}

/// `<registry>/<job_id>.publish.lock` (L3).
pub fn inflight_lock_path(registry: &Path, job_id: &str) -> PathBuf {
    registry.join(format!("{job_id}.publish.lock"))
}

/// Creates the job directory and opens events.log for appending, so an events.log that cannot take
/// a line (a directory, a read-only registry) fails before the engine changes anything.
pub fn prepare_events_log(path: &Path) -> Result<(), JoblogError> {
    if let Some(dir) = path.parent() {
        sys::create_dir_all(dir).map_err(|err| JoblogError {
            what: "cannot create job directory",
            path: dir.to_path_buf(),
            err,
        })?;
    }
    sys::open_append(path).map(drop).map_err(|err| JoblogError {
        what: "cannot open events.log for appending",
        path: path.to_path_buf(),
        err,
    })
}

/// Appends one signed payload as a line under L4 (one write(2) on an O_APPEND descriptor).
pub fn append_event(path: &Path, payload: &[u8]) -> Result<(), JoblogError> {
    let mut line = Vec::with_capacity(payload.len() + 1);
    line.extend_from_slice(payload);
    line.push(b'\n');
    sys::append_locked(path, &line).map_err(|err| JoblogError {
        what: "cannot append to events.log",
        path: path.to_path_buf(),
        err,
    })
}

/// L3 shared, blocking (CORE 6.3 step 2).
pub fn inflight_shared(registry: &Path, job_id: &str) -> Result<Flock, JoblogError> {
    let path = inflight_lock_path(registry, job_id);
    sys::create_dir_all(registry).map_err(|err| JoblogError {
        what: "cannot create registry directory",
        path: registry.to_path_buf(),
        err,
    })?;
    Flock::lock_path(&path, LockMode::Shared).map_err(|err| JoblogError { what: "cannot lock", path, err })
}

/// L3 exclusive, polling `LOCK_NB` every 50 ms for up to `limit` (CORE 6.4 step 4, A8). `Ok(None)`
/// when the limit passed with the lock still busy.
pub fn inflight_exclusive(registry: &Path, job_id: &str, limit: Duration) -> io::Result<Option<Flock>> {
    let path = inflight_lock_path(registry, job_id);
    let deadline = Instant::now() + limit;
    loop {
        let f = sys::open_lock_file(&path)?;
        if let Some(l) = Flock::try_acquire(f, LockMode::Exclusive)? {
            return Ok(Some(l));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        sys::sleep(INFLIGHT_POLL.min(deadline.saturating_duration_since(Instant::now())));
    }
}

/// The latest events.log line of `attempt` and `event`: its seq and bytes.
pub fn latest_event_line(events: &Path, attempt: u64, event: &str) -> io::Result<Option<(u64, Vec<u8>)>> {
    let text = match fs::read(events) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut found = None;
    for line in text.split(|&b| b == b'\n') {
        let Ok(v) = serde_json::from_slice::<Value>(line) else { continue };
        if v["kind"] == "event" && v["attempt"].as_u64() == Some(attempt) && v["event"] == event {
            if let Some(seq) = v["seq"].as_u64() {
                found = Some((seq, line.to_vec()));
            }
        }
    }
    Ok(found)
}
