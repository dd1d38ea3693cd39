//! `mam jobs`: one table of the jobs in a registry (named in a header line): id, status (a live job
//! silent past its idle window shows as `silent(<for how long>)`), attempt, session, elapsed time,
//! finish time, the age of the last evidence (the newest record timestamp or the events.log mtime) and of the last heartbeat (the
//! record's `heartbeat_at`, else the last events.log line with `"heartbeat":true`). `--follow`
//! redraws every second until SIGINT/SIGTERM; `--json` is for scripts.
//!
//! It reads files only: no broker, no lock, and it creates nothing (CORE 2.1 read-only rule). It
//! never prints a token.

use std::ffi::OsString;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::cli::{self, Failure, Parsed};
use crate::clock;
use crate::ctx::{Ctx, OutBuf};
use crate::daemon::sweep::last_evidence_ms;
use crate::paths;
use crate::registry::record::Record;
use crate::registry::store::{Store, StoreError};
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

/// A time in ms since the epoch, or none, in 8 bytes (a row is kept per job: 100,000 of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ms(u64);

impl Ms {
    const NONE: Ms = Ms(u64::MAX);

    pub fn get(self) -> Option<u64> {
        (self != Ms::NONE).then_some(self.0)
    }
}

impl From<Option<u64>> for Ms {
    fn from(v: Option<u64>) -> Ms {
        v.filter(|&ms| ms != u64::MAX).map_or(Ms::NONE, Ms)
    }
}

/// One line of the table, kept small: a registry of 100,000 jobs holds 100,000 of these while
/// they are sorted. The four strings share one allocation.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// job_id, status, session, created_at, one after the other.
    text: Box<str>,
    ends: [u32; 3],
    pub attempt: Option<u64>,
    pub evidence_ms: Ms,
    pub heartbeat_ms: Ms,
    /// The claim (else the registration) time.
    pub started_ms: Ms,
    pub finished_ms: Ms,
    /// The idle window (`sweep::idle_ms`).
    pub idle_ms: u64,
}

impl Row {
    pub fn new(job_id: &str, status: &str, session: &str, created_at: &str) -> Row {
        let text = [job_id, status, session, created_at].concat().into_boxed_str();
        let a = job_id.len();
        let b = a + status.len();
        let c = b + session.len();
        Row {
            text,
            ends: [a as u32, b as u32, c as u32],
            attempt: None,
            evidence_ms: Ms::NONE,
            heartbeat_ms: Ms::NONE,
            started_ms: Ms::NONE,
            finished_ms: Ms::NONE,
            idle_ms: 0,
        }
    }

    pub fn job_id(&self) -> &str {
        &self.text[..self.ends[0] as usize]
    }

    pub fn status(&self) -> &str {
        &self.text[self.ends[0] as usize..self.ends[1] as usize]
    }

    pub fn session(&self) -> &str {
        &self.text[self.ends[1] as usize..self.ends[2] as usize]
    }

    pub fn created_at(&self) -> &str {
        &self.text[self.ends[2] as usize..]
    }

    fn finished(&self) -> bool {
        crate::registry::is_terminal(self.status())
    }

    /// How long a live job has been silent: `Some(ms since the last evidence)` when it is not
    /// finished, not pending, and that is longer than its idle window.
    pub fn silent_ms(&self, now_ms: u64) -> Option<u64> {
        if self.finished() || self.status() == "pending" {
            return None;
        }
        let since = now_ms.saturating_sub(self.evidence_ms.get().or(self.started_ms.get())?);
        (since > self.idle_ms).then_some(since)
    }

    fn elapsed_ms(&self, now_ms: u64) -> Option<u64> {
        Some(self.finished_ms.get().unwrap_or(now_ms).saturating_sub(self.started_ms.get()?))
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

/// The fields the table shows, read from each record (the rest is skipped unparsed: 10,000
/// records are read on every `--follow` redraw).
const FIELDS: &[&str] = &[
    "job_id",
    "status",
    "attempt",
    "agent_session",
    "created_at",
    "last_event_at",
    "heartbeat_at",
    "claimed_at",
    "updated_at",
    "dispatched_at",
    "finished_at",
    "heartbeat_sec",
    "heartbeat_misses",
    "idle_timeout_sec",
];

/// The row of one record. `events_mtime` gives the mtime of its events.log (`<registry>/<id>/`)
/// when asked; it is asked only when the row shows it: a finished job's ages are `-` in the table,
/// so with `ages_of_finished` false its events.log is not looked at (most of a large registry).
pub fn row(rec: &Record, registry: &Path, ages_of_finished: bool, events_mtime: impl FnOnce() -> Option<u64>) -> Row {
    let id = rec.str("job_id").unwrap_or("");
    let status = rec.status();
    let ts = |k: &str| rec.str(k).and_then(clock::parse_ts);
    let mut r = Row::new(id, status, rec.str("agent_session").unwrap_or(""), rec.str("created_at").unwrap_or(""));
    r.attempt = rec.attempt();
    r.started_ms = ts("claimed_at").or_else(|| ts("created_at")).into();
    r.finished_ms = ts("finished_at").into();
    r.idle_ms = crate::daemon::sweep::idle_ms(rec);
    if ages_of_finished || !crate::registry::is_terminal(status) {
        // One stat: most records of a large registry have no events.log, so nothing more is opened.
        let events_mtime = events_mtime();
        r.evidence_ms = last_evidence_ms(rec, events_mtime).into();
        r.heartbeat_ms = ts("heartbeat_at")
            .or_else(|| events_mtime.and_then(|_| last_heartbeat_line_ms(&registry.join(id).join("events.log"))))
            .into();
    }
    r
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

/// Every job of `store`, sorted by created_at then id, read one record at a time (only `FIELDS`
/// parsed). Unreadable records come back as warnings. `ages_of_finished`: see `row`.
pub fn rows(store: &Store, ages_of_finished: bool) -> Result<(Vec<Row>, Vec<String>), Failure> {
    let parts = store
        .scan_records(
            crate::registry::store::listing_threads(),
            || (Vec::new(), Vec::new(), PathBuf::new()),
            |(out, warnings, rel): &mut (Vec<Row>, Vec<String>, PathBuf), e| {
                let path = || text::show_path(&store.record_path(e.id));
                match e.bytes {
                    Ok(bytes) => match Record::parse_only(bytes, FIELDS) {
                        Ok(r) => {
                            let events_mtime = || {
                                rel.clear();
                                rel.push(r.str("job_id").unwrap_or(""));
                                rel.push("events.log");
                                e.mtime_ms(rel)
                            };
                            out.push(row(&r, &store.registry, ages_of_finished, events_mtime))
                        }
                        Err(_) => warnings.push(format!("WARNING: {}: not a valid job record; skipped", path())),
                    },
                    Err(StoreError::Io { err, .. }) => {
                        warnings.push(format!("WARNING: {}: cannot read record ({err}); skipped", path()))
                    }
                    Err(other) => warnings.push(format!("WARNING: {other}; skipped")),
                }
            },
        )
        .map_err(Failure::runtime)?;
    let (mut out, mut warnings) = (Vec::new(), Vec::new());
    for (rows, w, _) in parts {
        if out.is_empty() {
            out = rows;
        } else {
            out.extend(rows);
        }
        warnings.extend(w);
    }
    // The whole text last: records that agree on both keys still come in one order.
    out.sort_unstable_by(|a, b| (a.created_at(), a.job_id(), &a.text).cmp(&(b.created_at(), b.job_id(), &b.text)));
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

const HEADER: [&str; 8] = ["JOB", "STATUS", "ATTEMPT", "SESSION", "ELAPSED", "FINISHED", "EVIDENCE", "HEARTBEAT"];

/// The eight cells of one row.
fn cells(r: &Row, now_ms: u64) -> [String; 8] {
    let status = match r.silent_ms(now_ms) {
        Some(ms) => format!("silent({})", age(Some(0), ms)),
        None => text::one_line(r.status()),
    };
    let (evidence, heartbeat) = if r.finished() {
        ("-".into(), "-".into())
    } else {
        (age(r.evidence_ms.get(), now_ms), age(r.heartbeat_ms.get(), now_ms))
    };
    [
        text::one_line(r.job_id()),
        status,
        r.attempt.map_or_else(|| "-".into(), |a| a.to_string()),
        if r.session().is_empty() { "-".into() } else { text::one_line(r.session()) },
        r.elapsed_ms(now_ms).map_or_else(|| "-".into(), |e| age(Some(0), e)),
        clock_cell(r.finished_ms.get(), now_ms),
        evidence,
        heartbeat,
    ]
}

/// The table (header plus one line per row, columns padded), written as it is made: one pass for
/// the column widths, one for the lines; no cell is kept between them.
pub fn write_table(rows: &[Row], now_ms: u64, out: &mut impl std::io::Write) -> std::io::Result<()> {
    let mut width = HEADER.map(str::len);
    for r in rows {
        for (w, s) in width.iter_mut().zip(&cells(r, now_ms)) {
            *w = (*w).max(s.chars().count());
        }
    }
    let mut line = String::new();
    let mut emit = |c: &[&str; 8], out: &mut dyn std::io::Write| {
        line.clear();
        for (i, s) in c.iter().enumerate() {
            if i + 1 == c.len() {
                line.push_str(s);
            } else {
                line.push_str(s);
                let pad = width[i].saturating_sub(s.chars().count()) + 2;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        let kept = line.trim_end().len();
        line.truncate(kept);
        line.push('\n');
        out.write_all(line.as_bytes())
    };
    emit(&HEADER, out)?;
    for r in rows {
        let c = cells(r, now_ms);
        emit(&c.each_ref().map(String::as_str), out)?;
    }
    Ok(())
}

/// The table as text (`write_table` into a string).
pub fn table(rows: &[Row], now_ms: u64) -> String {
    let mut out = Vec::new();
    let _ = write_table(rows, now_ms, &mut out);
    String::from_utf8(out).unwrap_or_default()
}

/// One element of the `--json` array.
fn json_row(r: &Row, now_ms: u64) -> Value {
    let age_s = |t: Ms| t.get().map(|t| now_ms.saturating_sub(t) / 1000);
    let ts = |t: Ms| t.get().map(clock::format_ts);
    json!({
        "job_id": r.job_id(),
        "status": r.status(),
        "attempt": r.attempt,
        "session": r.session(),
        "last_evidence_at": ts(r.evidence_ms),
        "evidence_age_s": age_s(r.evidence_ms),
        "heartbeat_at": ts(r.heartbeat_ms),
        "heartbeat_age_s": age_s(r.heartbeat_ms),
        "silent_s": r.silent_ms(now_ms).map(|m| m / 1000),
        "elapsed_s": r.elapsed_ms(now_ms).map(|m| m / 1000),
        "finished_at": ts(r.finished_ms),
    })
}

/// The `--json` array (pretty, or on one line), written one element at a time.
pub fn write_json(rows: &[Row], now_ms: u64, pretty: bool, out: &mut impl std::io::Write) -> serde_json::Result<()> {
    let elems = rows.iter().map(|r| json_row(r, now_ms));
    if pretty {
        serde::Serializer::collect_seq(&mut serde_json::Serializer::pretty(out), elems)
    } else {
        serde::Serializer::collect_seq(&mut serde_json::Serializer::new(out), elems)
    }
}

/// The registry `mam jobs` (and `mam ui`) reads: `--registry-dir`, else the resolved default.
pub fn registry(ctx: &Ctx, flag: Option<&std::path::Path>) -> Result<Store, Failure> {
    let resolved = paths::resolve(ctx, flag)?;
    let store = Store::from_resolved(&resolved);
    // The default registry of a control root that exists is merely empty so far; any other
    // registry that does not exist is a wrong path (another root, a typo), not an empty table.
    let fresh_default =
        flag.is_none() && ctx.path_var("MAM_JOBS_DIR").is_none() && resolved.control_root.join(".mam").is_dir();
    if !store.registry.is_dir() && !fresh_default {
        return Err(Failure::runtime(format!(
            "jobs: no registry at {} (nothing registered there yet, or another control root: see `mam paths`; \
             --registry-dir or MAM_JOBS_DIR name another)",
            text::show_path(&store.registry)
        )));
    }
    Ok(store)
}

pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let Some(a) = cli::parse_or_help(ctx, USAGE, args, parse_args)? else {
        return Ok(0);
    };
    cli::load_env(ctx)?;
    let store = registry(ctx, a.registry_dir.as_deref())?;
    if a.follow {
        sys::install_stop_handlers().map_err(|e| Failure::runtime(format!("cannot install signal handlers: {e}")))?;
    }
    loop {
        let (rows, warnings) = rows(&store, a.json)?;
        let now = clock::now_ms();
        let mut out = OutBuf::new(ctx);
        if a.json {
            write_json(&rows, now, !a.follow, &mut out).map_err(|e| Failure::runtime(format!("jobs: {e}")))?;
            out.line("");
        } else {
            let clear = if a.follow { "\x1b[H\x1b[2J" } else { "" };
            out.line(&format!(
                "{clear}registry {}: {} job(s) at {}",
                text::show_path(&store.registry),
                rows.len(),
                clock::format_ts(now)
            ));
            let _ = write_table(&rows, now, &mut out);
        }
        drop(out);
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
    fn only_objects_are_read_and_only_the_shown_fields() {
        assert!(Record::parse_only(b"[1,2,3,4,5,6,7,8,9,10]", FIELDS).is_err());
        assert!(Record::parse_only(b"{", FIELDS).is_err());
        let r =
            Record::parse_only(br#" {"job_id":"a","status":"running","attempt":2,"x":{"deep":[1]}}"#, FIELDS).unwrap();
        assert_eq!((r.str("job_id"), r.status(), r.attempt()), (Some("a"), "running", Some(2)));
        assert!(r.get("x").is_none());
    }

    /// A finished job's events.log is not looked at for the table (its ages show `-`), only for
    /// `--json`, which prints them.
    #[test]
    fn finished_rows_skip_the_events_stat_unless_asked() {
        let done =
            Record::parse(br#"{"job_id":"a","status":"completed","created_at":"2026-01-01T00:00:00.000Z"}"#).unwrap();
        let p = Path::new("/nonexistent");
        let r = row(&done, p, false, || panic!("stat asked for a finished job"));
        assert_eq!((r.job_id(), r.status(), r.evidence_ms.get()), ("a", "completed", None));
        let r = row(&done, p, true, || Some(1_767_225_600_500));
        assert_eq!(r.evidence_ms.get(), Some(1_767_225_600_500));
        let open = Record::parse(br#"{"job_id":"b","status":"running"}"#).unwrap();
        assert_eq!(row(&open, p, false, || Some(7)).evidence_ms.get(), Some(7));
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
            attempt: Some(1),
            evidence_ms: Some(0).into(),
            started_ms: Some(0).into(),
            finished_ms: (st == "completed").then_some(3_000).into(),
            idle_ms: 120_000,
            ..Row::new(id, st, "w", "")
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
            attempt: Some(1),
            evidence_ms: Some(0).into(),
            started_ms: Some(0).into(),
            idle_ms: 120_000,
            ..Row::new("a", "running", "w", "")
        };
        assert_eq!(r.silent_ms(120_000), None, "inside the window");
        assert_eq!(r.silent_ms(302_000), Some(302_000));
        assert!(table(std::slice::from_ref(&r), 302_000).lines().nth(1).unwrap().contains("silent(5m02s)"));
        let like_r = |status: &str| {
            let n = Row::new("a", status, "w", "");
            Row { text: n.text, ends: n.ends, ..r.clone() }
        };
        let done = like_r("completed");
        assert_eq!(done.silent_ms(999_000), None);
        let pending = like_r("pending");
        assert_eq!(pending.silent_ms(999_000), None);
    }
}
