//! `mam wait` (issue 21): waits for the verdicts of several jobs at once and prints one line per
//! verdict as it happens. The waiting lives in `crate::wait`; this file parses, selects the jobs
//! from the registry, installs the signal handlers and prints.
//!
//! It only reads: no record, audit entry or log is written, and no job is closed.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;

use crate::cli::{self, Failure, Parsed};
use crate::clock;
use crate::ctx::Ctx;
use crate::knob;
use crate::mqtt::MqttConfig;
use crate::paths;
use crate::registry::is_terminal;
use crate::registry::store::Store;
use crate::sys;
use crate::text;
use crate::wait::{self, track::Found, End, Event, Mode, Settings};

pub const USAGE: &str = "
Usage: mam wait [JOB...] [--session S]... [--all-open] [--any | --all] [--timeout S] [--json]
                [--registry-dir D]

Waits for the verdicts of several jobs: the JOB ids given, the open jobs of each --session S, or
every open job of the registry (--all-open); these add up. It reads what `mam watch` reads (the
signed events and states of each job's current attempt, on the wire and in a local job's
events.log) and each job's record, and judges every job by watch's budgets: a terminal status is
its verdict; no evidence for its idle window after the last evidence is `unresponsive`; no
evidence within T + K x N of its dispatch is `no_started`. Those two are the wait's verdicts only:
wait never closes or changes a job (the job's watcher or the daemon does).

One line per verdict, as it happens (REPORT and REASON quoted when they need it):
  JOB_ID=<id> SESSION=<s> VERDICT=<verdict> STATUS=<status> SOURCE=<wire|events.log|record|inferred>
  AT=<time> REPORT=<path|-> [REASON=<reason>]
then one line at the end:
  WAIT=<all|any|timeout|signal> VERDICTS=<n> PENDING=<ids|->
With --json each of them is one JSON object per line.

Options:
  JOB               a job id (any number)
  --session S       the jobs of session S that are not finished (repeatable)
  --all-open        every job of the registry that is not finished
  --any             end at the first verdict
  --all             end when every job has its verdict (the default)
  --timeout S       end after S seconds at the latest (0: no limit, the default)
  --json            JSON lines instead of key=value lines
  --registry-dir D  the job registry (relative to the cwd); else MAM_JOBS_DIR; else
                    <control root>/.mam/jobs
  -h, --help        print this help

With nothing to wait for (no JOB given, and the sessions or the registry have no open job) it
says so and exits 14 at once.

Exit codes (which case ended the wait): 0 the verdicts are `completed` (--any: the first one),
10 a verdict is another terminal status (failed, error, cancelled, deadline_timeout, ...),
11 a job is unresponsive, 12 a job never started (no_started, agent_blocked); with --all the
first of 11, 12, 10 that occurs among the verdicts; 13 --timeout came first; 14 nothing to wait for; 1 runtime error
(unknown job, unreadable registry); 2 usage; 130 SIGINT; 143 SIGTERM.
";

/// The exit code of a wait with an empty selection.
pub const NOTHING_TO_WAIT_FOR: i32 = 14;

#[derive(Debug, Default)]
struct Args {
    jobs: Vec<String>,
    sessions: Vec<String>,
    all_open: bool,
    any: Option<bool>,
    timeout: u32,
    json: bool,
    registry_dir: Option<PathBuf>,
}

fn parse_args(args: Vec<OsString>) -> Result<Parsed<Args>, Failure> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let mut a = Args::default();
    while let Some(arg) = p.next()? {
        match arg {
            Value(v) => {
                let id = cli::utf8("JOB", v)?;
                if !clock::valid_job_id(&id) {
                    return Err(Failure::usage(format!("wait: invalid job id '{}'", text::one_line(&id))));
                }
                a.jobs.push(id);
            }
            Long("session") => {
                let s = cli::utf8("--session", p.value()?)?;
                if !clock::valid_session(&s) {
                    return Err(Failure::usage(format!("--session: invalid session '{}'", text::one_line(&s))));
                }
                a.sessions.push(s);
            }
            Long("all-open") => a.all_open = true,
            Long("any") | Long("all") => {
                let any = matches!(arg, Long("any"));
                if a.any.is_some_and(|x| x != any) {
                    return Err(Failure::usage("wait: --any and --all exclude each other"));
                }
                a.any = Some(any);
            }
            Long("timeout") => a.timeout = knob::flag("--timeout", &p.value()?, 0)?,
            Long("json") => a.json = true,
            Long("registry-dir") => a.registry_dir = Some(p.value()?.into()),
            Short('h') | Long("help") => return Ok(Parsed::Help),
            _ => return Err(arg.unexpected().into()),
        }
    }
    if a.jobs.is_empty() && a.sessions.is_empty() && !a.all_open {
        return Err(Failure::usage("wait: name the jobs: JOB..., --session S or --all-open"));
    }
    Ok(Parsed::Run(a))
}

/// A value as one word of a key=value line: bare when it is plain, else POSIX-quoted.
fn word(v: &str) -> String {
    let plain = !v.is_empty() && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.,/:@+-".contains(&b));
    if plain {
        v.to_string()
    } else {
        text::shell_quote(&text::one_line(v))
    }
}

fn verdict_line(job: &wait::track::Tracker, f: &Found, json_out: bool) -> String {
    // Issue 30: only a report that exists is named (a job closed before its agent wrote one has none).
    let report =
        job.report.clone().filter(|p| crate::sys::is_nonempty_file(std::path::Path::new(p))).unwrap_or_default();
    if json_out {
        return json!({
            "job_id": job.job_id, "session": job.session, "verdict": f.verdict, "status": f.status,
            "source": f.source.word(), "at": clock::format_ts(f.at_ms),
            "report": (!report.is_empty()).then_some(report), "reason": (!f.reason.is_empty()).then_some(&f.reason),
        })
        .to_string();
    }
    let mut l = format!(
        "JOB_ID={} SESSION={} VERDICT={} STATUS={} SOURCE={} AT={} REPORT={}",
        job.job_id,
        word(if job.session.is_empty() { "-" } else { &job.session }),
        word(&f.verdict),
        word(&f.status),
        f.source.word(),
        clock::format_ts(f.at_ms),
        if report.is_empty() { "-".to_string() } else { word(&report) }
    );
    if !f.reason.is_empty() {
        l.push_str(&format!(" REASON={}", word(&f.reason)));
    }
    l
}

pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let Some(a) = cli::parse_or_help(ctx, USAGE, args, parse_args)? else {
        return Ok(0);
    };
    cli::load_env(ctx)?;
    sys::install_stop_handlers().map_err(|e| Failure::runtime(format!("cannot install signal handlers: {e}")))?;
    let poll_ms = knob::env_or(ctx, "MAM_WATCH_POLL_MS", 1, 1000)?;
    let resolved = paths::resolve(ctx, a.registry_dir.as_deref())?;
    let cfg = MqttConfig::from_ctx_near(ctx, Some(&resolved.registry))?;
    let store = Store::from_resolved(&resolved);

    // The selection, each job once, in id order.
    let mut ids: BTreeSet<String> = crate::sort::ordered(a.jobs.iter().cloned());
    let mut records = Vec::new();
    for id in &a.jobs {
        records.push(store.read_existing(id).map_err(Failure::runtime)?);
    }
    if !a.sessions.is_empty() || a.all_open {
        let mut all = store.job_ids().map_err(Failure::runtime)?;
        crate::sort::natural(&mut all);
        for id in all {
            if ids.contains(&id) {
                continue;
            }
            let Ok(Some(rec)) = store.read(&id) else { continue };
            let ours = a.all_open || rec.str("agent_session").is_some_and(|s| a.sessions.iter().any(|x| x == s));
            if ours && !is_terminal(rec.status()) {
                ids.insert(id);
                records.push(rec);
            }
        }
    }
    // Issue 32: nothing to wait for is not a verdict (it used to end at once with rc 0).
    if records.is_empty() {
        let which = if a.all_open {
            "the registry has no open job".to_string()
        } else {
            format!("session {} has no open job", a.sessions.join(", "))
        };
        return Err(Failure::new(
            NOTHING_TO_WAIT_FOR,
            format!("ERROR: wait: nothing to wait for: {which} (see `mam jobs`)"),
        ));
    }
    let mode = if a.any == Some(true) { Mode::Any } else { Mode::All };
    let settings = Settings {
        mode,
        timeout: (a.timeout > 0).then(|| Duration::from_secs(a.timeout.into())),
        poll: Duration::from_millis(poll_ms.into()),
    };
    let json_out = a.json;
    let mut out = |e: Event<'_>| match e {
        Event::Verdict { job, found } => ctx.say(&verdict_line(job, found, json_out)),
        Event::Note(n) => ctx.diag(n),
    };
    let o = wait::run(&store, records, Some(cfg), &settings, &mut out);
    let how = match o.end {
        End::Done if mode == Mode::Any => "any",
        End::Done => "all",
        End::Timeout => "timeout",
        End::Signal(_) => "signal",
    };
    let rc = o.rc(mode);
    if json_out {
        ctx.say(&json!({"wait": how, "verdicts": o.verdicts.len(), "pending": o.pending, "rc": rc}).to_string());
    } else {
        let pending = if o.pending.is_empty() { "-".to_string() } else { o.pending.join(",") };
        ctx.say(&format!("WAIT={how} VERDICTS={} PENDING={pending}", o.verdicts.len()));
    }
    if let End::Signal(sig) = o.end {
        ctx.diag(&format!("NOTE: wait: received {}; the jobs are unchanged", sys::signal_name(sig)));
    }
    Ok(rc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_selection_is_required_and_any_all_exclude_each_other() {
        assert_eq!(parse_args(cli::argv(&[])).unwrap_err().rc, 2);
        assert_eq!(parse_args(cli::argv(&["--any"])).unwrap_err().rc, 2);
        assert_eq!(parse_args(cli::argv(&["a/b"])).unwrap_err().rc, 2);
        assert_eq!(parse_args(cli::argv(&["--all-open", "--any", "--all"])).unwrap_err().rc, 2);
        assert_eq!(parse_args(cli::argv(&["--all-open", "--timeout", "x"])).unwrap_err().rc, 2);
        let Parsed::Run(a) =
            parse_args(cli::argv(&["1abbcdef", "--session", "w1", "--any", "--timeout", "5", "--json"])).unwrap()
        else {
            panic!("help")
        };
        assert_eq!((a.jobs.len(), a.sessions.len(), a.any, a.timeout, a.json), (1, 1, Some(true), 5, true));
    }

    #[test]
    fn values_are_one_word() {
        assert_eq!(word("/r/report.md"), "/r/report.md");
        assert_eq!(word("session stopped"), "'session stopped'");
        assert_eq!(word("a\nb"), "'a\\nb'");
    }
}
