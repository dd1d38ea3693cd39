//! `mam jobs`: one table of the jobs in a registry (named in a header line): id, status (a live job
//! silent past its idle window shows as `silent(<for how long>)`), attempt, session, elapsed time,
//! finish time, the age of the last evidence (the newest record timestamp or the events.log mtime) and of the last heartbeat (the
//! record's `heartbeat_at`, else the last events.log line with `"heartbeat":true`). `--follow`
//! redraws every second until SIGINT/SIGTERM; `--json` is for scripts.
//!
//! It reads files only: no broker, no lock, and it creates nothing (CORE 2.1 read-only rule). It
//! never prints a token.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::cli::{self, Failure, Parsed};
use crate::clock;
use crate::ctx::{Ctx, OutBuf};
use crate::paths;
use crate::registry::store::Store;
use crate::sys;
use crate::text;
use crate::view::jobs::{age, rows, Ms, Row};

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
        let (rows, warnings) = rows(&store, a.json).map_err(Failure::runtime)?;
        let now = clock::now_ms();
        let mut out = OutBuf::new(ctx);
        if a.json {
            write_json(&rows, now, !a.follow, &mut out).map_err(|e| Failure::runtime(format!("jobs: {e}")))?;
            out.line("");
        } else {
            // Issue 32: piped (`mam jobs --follow | cat`, `mam ui | cat`), plain text: one table per
            // refresh, no clear-screen codes.
            let clear = if a.follow && sys::is_tty(1) { "\x1b[H\x1b[2J" } else { "" };
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
    fn table_is_aligned() {
        let r = |id: &str, st: &str| {
            let mut r = Row::new(id, st, "w", "");
            r.attempt = Some(1);
            r.evidence_ms = Some(0).into();
            r.started_ms = Some(0).into();
            r.finished_ms = (st == "completed").then_some(3_000).into();
            r.idle_ms = 120_000;
            r
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
        let mut r = Row::new("a", "running", "w", "");
        r.attempt = Some(1);
        r.evidence_ms = Some(0).into();
        r.started_ms = Some(0).into();
        r.idle_ms = 120_000;
        assert!(!table(std::slice::from_ref(&r), 120_000).contains("silent"), "inside the window");
        assert!(table(std::slice::from_ref(&r), 302_000).lines().nth(1).unwrap().contains("silent(5m02s)"));
    }
}
