//! `mam jobs`: one table of the jobs in a registry (named in a header line): id, status (a live job
//! silent past its idle window shows as `silent(<for how long>)`), attempt, session, elapsed time,
//! finish time, the age of the last evidence (the newest record timestamp or the events.log mtime) and of the last heartbeat (the
//! record's `heartbeat_at`, else the last events.log line with `"heartbeat":true`). `--follow`
//! redraws every second until SIGINT/SIGTERM; `--json` is for scripts.
//!
//! It reads files only: no broker, no lock, and it creates nothing (CORE 2.1 read-only rule). It
//! never prints a token.

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::cli::{self, Failure, Parsed};
use crate::clock;
use crate::ctx::Ctx;
use crate::daemon::sweep::last_evidence_ms;
use crate::paths;
use crate::registry::record::Record;
use crate::registry::store::Store;
use crate::sys;
use crate::text;

pub const USAGE: &str = "
Usage: mam jobs [--registry-dir D] [--json] [--follow]

Prints a header line naming the registry read, then one line per job, oldest first:
  JOB  STATUS  ATTEMPT  SESSION  ELAPSED  FINISHED  EVIDENCE  HEARTBEAT
STATUS is the record's; a job that is not finished and has shown no sign of life for longer than
its idle window (idle_timeout_sec, else heartbeat_sec x heartbeat_misses) shows `silent(<how long>)`,
whether or not a daemon is there to close it. ELAPSED runs from the claim (else the registration)
to the finish (else now); FINISHED is the finish time (UTC; HH:MM:SS today, else the date).
EVIDENCE is the age of the newest sign of life (record timestamps such as last_event_at and
updated_at, or the mtime of events.log); HEARTBEAT the age of the last heartbeat (heartbeat_at, or
the last events.log line with \"heartbeat\":true); both are `-` for a finished job, where an age
means nothing. `-` means none. Reads files only: works with no broker and creates nothing. A
registry that does not exist is an error (see `mam paths`), except the default one of a control
root whose .mam/ exists (nothing registered yet: an empty table).

Options:
  --registry-dir D   the job registry (relative to the cwd); else MAM_JOBS_DIR; else
                     <control root>/.mam/jobs
  --json             a JSON array (ages in whole seconds, timestamps as stored)
  --follow           redraw every second until SIGINT or SIGTERM (with --json: one array per line)
  -h, --help         print this help

Exit codes: 0 ok (also when stopped by a signal in --follow), 1 registry missing or unreadable,
2 usage.
";

#[derive(Debug, Default)]
struct Args {
    registry_dir: Option<PathBuf>,
    json: bool,
    follow: bool,
}

fn parse_args(args: Vec<OsString>) -> Result<Parsed<Args>, Failure> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let mut a = Args::default();
    while let Some(arg) = p.next()? {
        match arg {
            Long("registry-dir") => a.registry_dir = Some(p.value()?.into()),
            Long("json") => a.json = true,
            Long("follow") => a.follow = true,
            Short('h') | Long("help") => return Ok(Parsed::Help),
            _ => return Err(arg.unexpected().into()),
        }
    }
    Ok(Parsed::Run(a))
}

/// One line of the table.
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
}

impl Row {
    fn finished(&self) -> bool {
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

    fn elapsed_ms(&self, now_ms: u64) -> Option<u64> {
        Some(self.finished_ms.unwrap_or(now_ms).saturating_sub(self.started_ms?))
    }
}

/// `HH:MM:SS` when `ms` is on the UTC day of `now_ms`, else `YYYY-MM-DD`.
fn clock_cell(ms: Option<u64>, now_ms: u64) -> String {
    let Some(ms) = ms else { return "-".into() };
    let ts = clock::format_ts(ms);
    if ms / 86_400_000 == now_ms / 86_400_000 {
        ts[11..19].to_string()
    } else {
        ts[..10].to_string()
    }
}

/// The row of one record; `registry` is where its events.log lives.
pub fn row(rec: &Record, registry: &Path) -> Row {
    let id = rec.str("job_id").unwrap_or("").to_string();
    let events = registry.join(&id).join("events.log");
    // One stat: most records of a large registry have no events.log, so nothing more is opened.
    let events_mtime = fs::metadata(&events)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as u64);
    let heartbeat_ms = rec
        .str("heartbeat_at")
        .and_then(clock::parse_ts)
        .or_else(|| events_mtime.and_then(|_| last_heartbeat_line_ms(&events)));
    let ts = |k: &str| rec.str(k).and_then(clock::parse_ts);
    Row {
        evidence_ms: last_evidence_ms(rec, events_mtime),
        heartbeat_ms,
        started_ms: ts("claimed_at").or_else(|| ts("created_at")),
        finished_ms: ts("finished_at"),
        idle_ms: crate::daemon::sweep::idle_ms(rec),
        status: rec.status().to_string(),
        attempt: rec.attempt(),
        session: rec.str("agent_session").unwrap_or("").to_string(),
        created_at: rec.str("created_at").unwrap_or("").to_string(),
        job_id: id,
    }
}

/// The `ts` of the last events.log line with `"heartbeat":true`, looking at the last 64 KiB only.
fn last_heartbeat_line_ms(path: &Path) -> Option<u64> {
    const TAIL: u64 = 64 * 1024;
    let mut f = File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    let start = len.saturating_sub(TAIL);
    f.seek(SeekFrom::Start(start)).ok()?;
    let mut buf = Vec::with_capacity((len - start) as usize);
    f.read_to_end(&mut buf).ok()?;
    let needle = b"\"heartbeat\":true";
    buf.split(|&b| b == b'\n').rev().filter(|l| l.windows(needle.len()).any(|w| w == needle)).find_map(|l| {
        let v: Value = serde_json::from_slice(l).ok()?;
        (v.get("heartbeat") == Some(&Value::Bool(true))).then(|| v.get("ts")?.as_str().and_then(clock::parse_ts))?
    })
}

/// The fields the table shows, parsed without building the whole record (10,000 records are read on
/// every `--follow` redraw). `None` when the bytes are not a JSON object.
fn slim(bytes: &[u8]) -> Option<Record> {
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
    ] {
        if let Some(v) = v {
            m.insert(k.to_string(), v);
        }
    }
    Some(Record::new(m))
}

/// Every job of `store`, sorted by created_at then id. Unreadable records come back as warnings.
pub fn rows(store: &Store) -> Result<(Vec<Row>, Vec<String>), Failure> {
    let mut out = Vec::new();
    let mut warnings = Vec::new();
    for id in store.job_ids().map_err(Failure::runtime)? {
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

/// The table as text (header plus one line per row, columns padded).
pub fn table(rows: &[Row], now_ms: u64) -> String {
    let mut cells: Vec<[String; 8]> =
        vec![["JOB", "STATUS", "ATTEMPT", "SESSION", "ELAPSED", "FINISHED", "EVIDENCE", "HEARTBEAT"].map(String::from)];
    for r in rows {
        let status = match r.silent_ms(now_ms) {
            Some(ms) => format!("silent({})", age(Some(0), ms)),
            None => text::one_line(&r.status),
        };
        let (evidence, heartbeat) = if r.finished() {
            ("-".into(), "-".into())
        } else {
            (age(r.evidence_ms, now_ms), age(r.heartbeat_ms, now_ms))
        };
        cells.push([
            text::one_line(&r.job_id),
            status,
            r.attempt.map_or_else(|| "-".into(), |a| a.to_string()),
            if r.session.is_empty() { "-".into() } else { text::one_line(&r.session) },
            r.elapsed_ms(now_ms).map_or_else(|| "-".into(), |e| age(Some(0), e)),
            clock_cell(r.finished_ms, now_ms),
            evidence,
            heartbeat,
        ]);
    }
    let mut width = [0usize; 8];
    for c in &cells {
        for (w, s) in width.iter_mut().zip(c) {
            *w = (*w).max(s.chars().count());
        }
    }
    let mut out = String::new();
    for c in &cells {
        let mut line = String::new();
        for (i, s) in c.iter().enumerate() {
            if i + 1 == c.len() {
                line.push_str(s);
            } else {
                line.push_str(&format!("{s:<w$}  ", w = width[i]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The `--json` array.
pub fn to_json(rows: &[Row], now_ms: u64) -> Value {
    let age_s = |t: Option<u64>| t.map(|t| now_ms.saturating_sub(t) / 1000);
    let ts = |t: Option<u64>| t.map(clock::format_ts);
    Value::Array(
        rows.iter()
            .map(|r| {
                json!({
                    "job_id": r.job_id,
                    "status": r.status,
                    "attempt": r.attempt,
                    "session": r.session,
                    "last_evidence_at": ts(r.evidence_ms),
                    "evidence_age_s": age_s(r.evidence_ms),
                    "heartbeat_at": ts(r.heartbeat_ms),
                    "heartbeat_age_s": age_s(r.heartbeat_ms),
                    "silent_s": r.silent_ms(now_ms).map(|m| m / 1000),
                    "elapsed_s": r.elapsed_ms(now_ms).map(|m| m / 1000),
                    "finished_at": ts(r.finished_ms),
                })
            })
            .collect(),
    )
}

pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let Some(a) = cli::parse_or_help(ctx, USAGE, args, parse_args)? else {
        return Ok(0);
    };
    cli::load_env(ctx)?;
    let resolved = paths::resolve(ctx, a.registry_dir.as_deref())?;
    let store = Store::from_resolved(&resolved);
    // The default registry of a control root that exists is merely empty so far; any other
    // registry that does not exist is a wrong path (another root, a typo), not an empty table.
    let fresh_default = a.registry_dir.is_none()
        && ctx.path_var("MAM_JOBS_DIR").is_none()
        && resolved.control_root.join(".mam").is_dir();
    if !store.registry.is_dir() && !fresh_default {
        return Err(Failure::runtime(format!(
            "jobs: no registry at {} (nothing registered there yet, or another control root: see `mam paths`; \
             --registry-dir or MAM_JOBS_DIR name another)",
            text::show_path(&store.registry)
        )));
    }
    if a.follow {
        sys::install_stop_handlers().map_err(|e| Failure::runtime(format!("cannot install signal handlers: {e}")))?;
    }
    loop {
        let (rows, warnings) = rows(&store)?;
        let now = clock::now_ms();
        if a.json {
            let v = to_json(&rows, now);
            ctx.say(&if a.follow { v.to_string() } else { serde_json::to_string_pretty(&v).unwrap_or_default() });
        } else {
            let head = format!(
                "registry {}: {} job(s) at {}\n",
                text::show_path(&store.registry),
                rows.len(),
                clock::format_ts(now)
            );
            let clear = if a.follow { "\x1b[H\x1b[2J" } else { "" };
            ctx.say_raw(format!("{clear}{head}{}", table(&rows, now)).as_bytes());
        }
        if !a.follow {
            for w in warnings {
                ctx.diag(&w);
            }
            return Ok(0);
        }
        let next = Instant::now() + Duration::from_secs(1);
        while Instant::now() < next {
            if sys::pending_signal().is_some() {
                return Ok(0);
            }
            sys::sleep(Duration::from_millis(50));
        }
        if sys::pending_signal().is_some() {
            return Ok(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slim_reads_objects_only() {
        assert!(slim(b"[1,2,3,4,5,6,7,8,9,10]").is_none());
        assert!(slim(b"{").is_none());
        let r = slim(br#" {"job_id":"a","status":"running","attempt":2,"x":{"deep":[1]}}"#).unwrap();
        assert_eq!((r.str("job_id"), r.status(), r.attempt()), (Some("a"), "running", Some(2)));
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
    fn table_is_aligned() {
        let r = |id: &str, st: &str| Row {
            job_id: id.into(),
            status: st.into(),
            attempt: Some(1),
            session: "w".into(),
            created_at: String::new(),
            evidence_ms: Some(0),
            heartbeat_ms: None,
            started_ms: Some(0),
            finished_ms: (st == "completed").then_some(3_000),
            idle_ms: 120_000,
        };
        let t = table(&[r("a", "running"), r("bbbbbbbbbb", "completed")], 5_000);
        assert_eq!(
            t,
            "JOB         STATUS     ATTEMPT  SESSION  ELAPSED  FINISHED  EVIDENCE  HEARTBEAT\n\
             a           running    1        w        5s       -         5s        -\n\
             bbbbbbbbbb  completed  1        w        3s       00:00:03  -         -\n"
        );
    }

    /// Issue 18: a live job silent past its idle window says so, with how long, daemon or not.
    #[test]
    fn silent_jobs_are_shown_as_silent() {
        let r = Row {
            job_id: "a".into(),
            status: "running".into(),
            attempt: Some(1),
            session: "w".into(),
            created_at: String::new(),
            evidence_ms: Some(0),
            heartbeat_ms: None,
            started_ms: Some(0),
            finished_ms: None,
            idle_ms: 120_000,
        };
        assert_eq!(r.silent_ms(120_000), None, "inside the window");
        assert_eq!(r.silent_ms(302_000), Some(302_000));
        assert!(table(std::slice::from_ref(&r), 302_000).lines().nth(1).unwrap().contains("silent(5m02s)"));
        let done = Row { status: "completed".into(), ..r.clone() };
        assert_eq!(done.silent_ms(999_000), None);
        let pending = Row { status: "pending".into(), ..r };
        assert_eq!(pending.silent_ms(999_000), None);
    }
}
