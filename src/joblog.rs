//! A job's files below publish and the timer (CORE 6.3, 6.4, 7.5): the events.log path, preparing it
//! and appending one signed line under L4, reading the latest line of an attempt, the in-flight
//! lock L3 that orders one-shot publishes against the terminal, and the bounded backwards line
//! reader every reader of a job's logs uses (issue 12 item 8: a log may be huge or hostile).
//!
//! It knows nothing of the engine, the wire or the timer; it never prints; it never reads a whole
//! log into memory.

use std::fmt;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
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

/// The longest log line the bounded readers hand on; a longer one is skipped whole (no line mam
/// writes comes close: an event's data is at most 768 KiB before escaping).
pub const MAX_LINE: usize = 4 * 1024 * 1024;

/// How much of the end of events.log `latest_event_line` reads at most (the current attempt's
/// lines are at the end; a log bigger than this was not written by mam's own publishes alone).
pub const LATEST_SCAN_BYTES: u64 = 64 * 1024 * 1024;

/// The read size of the backwards reader.
const CHUNK: usize = 64 * 1024;

/// Calls `f` with the lines of `path` from the last one backwards (without their newline; empty
/// lines are skipped), reading `CHUNK` bytes at a time and at most `max_bytes` from the end. A line
/// longer than `max_line` is skipped whole; so is the line cut by the `max_bytes` limit. Stops when
/// `f` returns true. A missing file has no lines. Memory: one chunk plus one line.
pub fn scan_lines_back(path: &Path, max_line: usize, max_bytes: u64, f: impl FnMut(&[u8]) -> bool) -> io::Result<()> {
    scan_lines_back_to(path, 0, max_line, max_bytes, f).map(drop)
}

/// `scan_lines_back` that stops at byte `start`, which the caller knows to be the start of a line
/// (a length the file had before, for an append-only file): the line that begins there is the
/// first one handed to `f`. A `start` past the end reads nothing. Returns the file's length as
/// read.
pub fn scan_lines_back_to(
    path: &Path,
    start: u64,
    max_line: usize,
    max_bytes: u64,
    mut f: impl FnMut(&[u8]) -> bool,
) -> io::Result<u64> {
    let mut file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let len = file.metadata()?.len();
    let floor = len.saturating_sub(max_bytes).max(start);
    if floor >= len {
        return Ok(len);
    }
    let mut pos = len;
    // The end of a line whose start has not been read yet, and whether that line is already too long.
    let mut acc: Vec<u8> = Vec::new();
    let mut skipping = false;
    let mut chunk = vec![0u8; CHUNK.min((len - floor) as usize)];
    while pos > floor {
        let n = (pos - floor).min(CHUNK as u64) as usize;
        pos -= n as u64;
        file.seek(SeekFrom::Start(pos))?;
        file.read_exact(&mut chunk[..n])?;
        let mut piece = &chunk[..n];
        while let Some(i) = piece.iter().rposition(|&b| b == b'\n') {
            let head = &piece[i + 1..];
            if !skipping && head.len() + acc.len() <= max_line && !(head.is_empty() && acc.is_empty()) {
                let stop = if acc.is_empty() {
                    f(head)
                } else {
                    let mut line = Vec::with_capacity(head.len() + acc.len());
                    line.extend_from_slice(head);
                    line.extend_from_slice(&acc);
                    f(&line)
                };
                if stop {
                    return Ok(len);
                }
            }
            acc.clear();
            skipping = false;
            piece = &piece[..i];
        }
        if !skipping {
            if piece.len() + acc.len() > max_line {
                skipping = true;
                acc = Vec::new();
            } else {
                let mut v = Vec::with_capacity(piece.len() + acc.len());
                v.extend_from_slice(piece);
                v.extend_from_slice(&acc);
                acc = v;
            }
        }
    }
    // The first line read (the file's, or the one at `start`), unless the byte limit cut it.
    if (pos == 0 || pos == start) && !skipping && !acc.is_empty() {
        f(&acc);
    }
    Ok(len)
}

/// The latest events.log line of `attempt` and `event`: its seq and bytes. Reads backwards from the
/// end (at most `LATEST_SCAN_BYTES`) and stops at the first match or at a line of an earlier
/// attempt (attempts only grow along the file).
pub fn latest_event_line(events: &Path, attempt: u64, event: &str) -> io::Result<Option<(u64, Vec<u8>)>> {
    let mut found = None;
    scan_lines_back(events, MAX_LINE, LATEST_SCAN_BYTES, |line| {
        let Ok(v) = serde_json::from_slice::<Value>(line) else { return false };
        if v["kind"] != "event" {
            return false;
        }
        match v["attempt"].as_u64() {
            Some(a) if a < attempt => return true,
            Some(a) if a == attempt && v["event"] == event => {
                if let Some(seq) = v["seq"].as_u64() {
                    found = Some((seq, line.to_vec()));
                    return true;
                }
            }
            _ => {}
        }
        false
    })?;
    Ok(found)
}

/// What an open job's agent waits for, as the workspace daemon's board judged it from the screen
/// (issue 30): kept beside the job's record in `<registry>/<job_id>/waiting.json` so `mam status`
/// and `mam ui` show what herdr's sidebar and tmux's border show. The board writes it when the
/// state begins, again at least every `WAITING_FRESH_MS / 3` while it holds, and removes it when
/// it ends; a reader takes a file not rewritten within `WAITING_FRESH_MS` (a board that stopped)
/// as nothing.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Waiting {
    pub attempt: u64,
    /// When the agent was first seen waiting (ms since the epoch).
    pub since_ms: u64,
    /// When the board last saw it so.
    pub seen_ms: u64,
    /// The approval dialog's question (`Bash command: touch x`); `None`: idle at its input line.
    pub approve: Option<String>,
}

/// A waiting file older than this is a stopped board's leftover.
pub const WAITING_FRESH_MS: u64 = 30_000;
/// The largest waiting file read.
const WAITING_MAX: u64 = 4096;

impl Waiting {
    /// `waiting for you: approve Bash command: touch x?` / `waiting for you: idle at its input
    /// line for 12 s`.
    pub fn text(&self, now_ms: u64) -> String {
        match &self.approve {
            Some(what) => format!("waiting for you: approve {}?", crate::text::one_line(what)),
            None => {
                let secs = now_ms.saturating_sub(self.since_ms) / 1000;
                format!("waiting for you: idle at its input line for {secs} s")
            }
        }
    }
}

/// `<registry>/<job_id>/waiting.json`.
pub fn waiting_path(registry: &Path, job_id: &str) -> PathBuf {
    registry.join(job_id).join("waiting.json")
}

/// Records `w` for `job_id` (atomic, no symlink followed).
pub fn write_waiting(registry: &Path, job_id: &str, w: &Waiting) -> io::Result<()> {
    let path = waiting_path(registry, job_id);
    if let Some(dir) = path.parent() {
        sys::create_dir_all(dir)?;
    }
    let bytes = serde_json::to_vec(w).map_err(io::Error::other)?;
    sys::atomic_write_mirror(&path, &bytes)
}

/// Removes `job_id`'s waiting file; none is fine.
pub fn clear_waiting(registry: &Path, job_id: &str) -> io::Result<()> {
    match std::fs::remove_file(waiting_path(registry, job_id)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// `job_id`'s waiting state of `attempt` at `now_ms`: `None` when there is none, it is of another
/// attempt, stale, a link, too long or not the format.
pub fn read_waiting(registry: &Path, job_id: &str, attempt: Option<u64>, now_ms: u64) -> Option<Waiting> {
    let f = sys::open_nofollow_read(&waiting_path(registry, job_id)).ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut bytes = Vec::new();
    f.take(WAITING_MAX + 1).read_to_end(&mut bytes).ok()?;
    if bytes.len() as u64 > WAITING_MAX {
        return None;
    }
    let w: Waiting = serde_json::from_slice(&bytes).ok()?;
    let fresh = now_ms.saturating_sub(w.seen_ms) < WAITING_FRESH_MS;
    (fresh && attempt.is_none_or(|a| a == w.attempt)).then_some(w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn tmp(name: &str, bytes: &[u8]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("mam-joblog-{}", crate::sys::random_hex(6).unwrap()));
        fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        fs::write(&p, bytes).unwrap();
        p
    }

    fn back(p: &Path, max_line: usize, max_bytes: u64) -> Vec<String> {
        let mut v = Vec::new();
        scan_lines_back(p, max_line, max_bytes, |l| {
            v.push(String::from_utf8_lossy(l).into_owned());
            false
        })
        .unwrap();
        v
    }

    #[test]
    fn scan_lines_back_reads_lines_in_reverse_across_chunks_and_skips_long_ones() {
        let p = tmp("a.log", b"one\ntwo\n\nthree");
        assert_eq!(back(&p, 100, u64::MAX), ["three", "two", "one"]);
        // Lines that span chunk boundaries, and one too long to keep.
        let long = "x".repeat(CHUNK * 2 + 17);
        let mid = "m".repeat(CHUNK + 3);
        let text = format!("first\n{long}\n{mid}\nlast\n");
        let p = tmp("b.log", text.as_bytes());
        assert_eq!(back(&p, CHUNK * 2, u64::MAX), ["last".to_string(), mid.clone(), "first".to_string()]);
        assert_eq!(back(&p, usize::MAX, u64::MAX), ["last".to_string(), mid.clone(), long, "first".to_string()]);
        // The byte limit: only whole lines inside it.
        assert_eq!(back(&p, usize::MAX, 6), ["last"]);
        assert_eq!(back(&p, usize::MAX, 5), Vec::<String>::new(), "its start is not inside the limit");
        // Stopping early, and a missing file.
        let mut n = 0;
        scan_lines_back(&p, usize::MAX, u64::MAX, |_| {
            n += 1;
            true
        })
        .unwrap();
        assert_eq!(n, 1);
        assert!(back(&p.with_file_name("none"), 10, 10).is_empty());
    }

    #[test]
    fn scan_lines_back_to_starts_at_a_known_line_start() {
        let mid = "m".repeat(CHUNK + 3);
        let text = format!("first\n{mid}\nthird\nlast\n");
        let p = tmp("c.log", text.as_bytes());
        let to = |start: u64, max_bytes: u64| {
            let mut v = Vec::new();
            let len = scan_lines_back_to(&p, start, usize::MAX, max_bytes, |l| {
                v.push(String::from_utf8_lossy(l).into_owned());
                false
            })
            .unwrap();
            assert_eq!(len, text.len() as u64);
            v
        };
        // The line that begins at `start` is read whole, across a chunk boundary too.
        assert_eq!(to(6, u64::MAX), [String::from("last"), "third".into(), mid.clone()]);
        let third = (6 + mid.len() + 1) as u64;
        assert_eq!(to(third, u64::MAX), ["last", "third"]);
        assert_eq!(to(0, u64::MAX).len(), 4);
        // At or past the end: nothing; the byte limit still cuts a line that starts before it.
        assert!(to(text.len() as u64, u64::MAX).is_empty());
        assert!(to(text.len() as u64 + 10, u64::MAX).is_empty());
        assert_eq!(to(6, 7), ["last"]);
    }

    #[test]
    fn latest_event_line_skips_a_huge_line_and_stops_at_an_earlier_attempt() {
        let ev = |a: u64, e: &str, seq: u64| format!(r#"{{"kind":"event","attempt":{a},"event":"{e}","seq":{seq}}}"#);
        let junk = "\0".repeat(MAX_LINE + 1);
        let text = format!("{}\n{junk}\n{}\n{}\n", ev(1, "started", 1), ev(2, "started", 2), ev(2, "progress", 3));
        let p = tmp("events.log", text.as_bytes());
        assert_eq!(latest_event_line(&p, 2, "started").unwrap().map(|x| x.0), Some(2));
        assert_eq!(latest_event_line(&p, 1, "started").unwrap().map(|x| x.0), Some(1));
        assert_eq!(latest_event_line(&p, 2, "completed").unwrap(), None);
    }
}
