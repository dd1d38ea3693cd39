//! `mam notify run|test` (issue 21): the verdict hook's supervisor and a way to try a hook.
//! `run` is what mam starts, detached, for one verdict (its values in the `MAM_VERDICT_*`
//! variables): it runs `MAM_ON_VERDICT` with a deadline and appends one line to notify.log. `test`
//! runs the configured hook now, in the foreground, with a made-up verdict or a job's, and prints
//! that line. The logic lives in `crate::notify`.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use crate::cli::{self, Failure, Parsed};
use crate::clock;
use crate::ctx::{ChildRole, Ctx};
use crate::knob;
use crate::notify::{self, hook, Verdict};
use crate::paths;
use crate::registry::store::Store;
use crate::sys;
use crate::text;

pub const USAGE: &str = "
Usage: mam notify test [--job-id ID] [--registry-dir D]
       mam notify run --timeout S --log FILE

A verdict (a job's terminal status: completed, failed, unresponsive, agent_blocked, ...; a review
loop's promotion or stop) runs the command in MAM_ON_VERDICT (environment or .mam.env) once,
through `sh -c`, with MAM_VERDICT (the verdict), MAM_VERDICT_KIND (job|loop), MAM_VERDICT_JOB_ID,
MAM_VERDICT_ATTEMPT, MAM_VERDICT_LOOP_ID, MAM_VERDICT_SESSION, MAM_VERDICT_STATUS,
MAM_VERDICT_REASON, MAM_VERDICT_REPORT, MAM_VERDICT_SUMMARY and MAM_VERDICT_BY in its environment
(no secret is). It runs detached, in a process group of its own, for at most
MAM_ON_VERDICT_TIMEOUT_S seconds (default 30; then the group is killed); its output is read and
dropped, and one line per run goes to <logs>/notify.log. A failing or hanging hook never changes
a verdict.

The workspace daemon also runs it, once per waiting, when an open job's agent begins to wait for a
person: MAM_VERDICT=waiting_for_you, MAM_VERDICT_STATUS the job's open status, MAM_VERDICT_REASON
what it waits for (`approve Bash command: make test?`, `idle at its input line for 10 s`). The job
stays open; filter on MAM_VERDICT for verdicts only.

Subcommands:
  test   run the configured hook now with the verdict of --job-id (its record must be finished),
         else a sample `completed` verdict; print the notify.log line it would get
  run    the supervisor mam starts for one verdict (reads MAM_VERDICT_* and MAM_ON_VERDICT)

Options:
  --job-id ID        test: the job whose verdict to send
  --registry-dir D   test: the job registry; else MAM_JOBS_DIR; else <control root>/.mam/jobs
  --timeout S        run: the deadline in seconds
  --log FILE         run: the log to append the result line to
  -h, --help         print this help

Exit codes: 0 the hook exited 0 (run: always 0), 1 it failed, was killed or no hook is configured
(test), 2 usage.
";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sub {
    Run,
    Test,
}

#[derive(Debug)]
struct Args {
    sub: Sub,
    job_id: Option<String>,
    registry_dir: Option<PathBuf>,
    timeout: u32,
    log: Option<PathBuf>,
}

fn parse_args(args: Vec<OsString>) -> Result<Parsed<Args>, Failure> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let mut sub = None;
    let mut a = Args { sub: Sub::Test, job_id: None, registry_dir: None, timeout: 0, log: None };
    while let Some(arg) = p.next()? {
        match arg {
            Value(v) if sub.is_none() => {
                sub = Some(cli::subcommand("notify", &v, &[("test", Sub::Test), ("run", Sub::Run)])?)
            }
            Long("job-id") => {
                let v = cli::utf8("--job-id", p.value()?)?;
                if !clock::valid_job_id(&v) {
                    return Err(Failure::usage(format!("--job-id: invalid job id '{}'", text::one_line(&v))));
                }
                a.job_id = Some(v);
            }
            Long("registry-dir") => a.registry_dir = Some(p.value()?.into()),
            Long("timeout") => a.timeout = knob::flag("--timeout", &p.value()?, 1)?,
            Long("log") => a.log = Some(p.value()?.into()),
            Short('h') | Long("help") => return Ok(Parsed::Help),
            _ => return Err(arg.unexpected().into()),
        }
    }
    a.sub = sub.ok_or_else(|| Failure::usage("notify: a subcommand is required (test or run)"))?;
    match a.sub {
        Sub::Run if a.timeout == 0 || a.log.is_none() => {
            Err(Failure::usage("notify run: --timeout and --log are required"))
        }
        Sub::Run if a.job_id.is_some() || a.registry_dir.is_some() => {
            Err(Failure::usage("notify run: --job-id and --registry-dir belong to test"))
        }
        Sub::Test if a.timeout > 0 || a.log.is_some() => {
            Err(Failure::usage("notify test: --timeout and --log belong to run"))
        }
        _ => Ok(Parsed::Run(a)),
    }
}

pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let Some(a) = cli::parse_or_help(ctx, USAGE, args, parse_args)? else {
        return Ok(0);
    };
    match a.sub {
        Sub::Run => supervise(ctx, &a),
        Sub::Test => {
            cli::load_env(ctx)?;
            test(ctx, &a)
        }
    }
}

/// The hook's environment: ours without secrets and without the command variables themselves.
fn hook_env(ctx: &Ctx) -> Vec<(OsString, OsString)> {
    ctx.child_env_for(ChildRole::Agent)
        .into_iter()
        .filter(|(k, _)| k != notify::COMMAND_VAR && k != notify::TIMEOUT_VAR)
        .collect()
}

/// `run`: always rc 0 (nobody reads it); the result is the notify.log line.
fn supervise(ctx: &Ctx, a: &Args) -> Result<i32, Failure> {
    let deadline = Duration::from_secs(a.timeout.into());
    let Some(command) = ctx.var_nonempty(notify::COMMAND_VAR) else { return Ok(0) };
    let end = hook::run(&command, &hook_env(ctx), ctx.cwd(), deadline);
    let what = ctx.var("MAM_VERDICT_SUMMARY").unwrap_or_default();
    let line = format!("{} {}: {}\n", clock::now_ts(), text::one_line(&what), end.line(deadline));
    if let Some(log) = &a.log {
        let _ = log.parent().map_or(Ok(()), sys::create_dir_all).and_then(|_| sys::append_locked(log, line.as_bytes()));
    }
    Ok(0)
}

fn test(ctx: &Ctx, a: &Args) -> Result<i32, Failure> {
    let Some(command) = ctx.var_nonempty(notify::COMMAND_VAR) else {
        return Err(Failure::runtime(format!(
            "notify test: {} is not set (environment or .mam.env)",
            notify::COMMAND_VAR
        )));
    };
    let timeout = knob::env_or(ctx, notify::TIMEOUT_VAR, 1, notify::DEFAULT_TIMEOUT_S)?;
    let v = match &a.job_id {
        Some(id) => {
            let resolved = paths::resolve(ctx, a.registry_dir.as_deref())?;
            let rec = Store::from_resolved(&resolved).read_existing(id).map_err(Failure::runtime)?;
            Verdict::of_record(&rec).ok_or_else(|| {
                Failure::runtime(format!("notify test: job {id} is {}, not finished", text::one_line(rec.status())))
            })?
        }
        None => Verdict {
            subject: notify::Subject::Job,
            job_id: "00000000".into(),
            loop_id: None,
            attempt: Some(1),
            session: "test".into(),
            verdict: "completed".into(),
            status: "completed".into(),
            reason: String::new(),
            report: None,
        },
    };
    let mut env = hook_env(ctx);
    env.extend(v.env("notify test").into_iter().map(|(k, val)| (OsString::from(k), OsString::from(val))));
    let deadline = Duration::from_secs(timeout.into());
    let end = hook::run(&command, &env, ctx.cwd(), deadline);
    ctx.say(&format!("{}: {}", v.summary(), end.line(deadline)));
    Ok(if end.ok() { 0 } else { 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_per_subcommand() {
        assert!(matches!(parse_args(cli::argv(&["test"])), Ok(Parsed::Run(Args { sub: Sub::Test, .. }))));
        assert!(matches!(parse_args(cli::argv(&["run", "--timeout", "3", "--log", "/l"])), Ok(Parsed::Run(_))));
        assert_eq!(parse_args(cli::argv(&["run", "--timeout", "3"])).unwrap_err().rc, 2);
        assert_eq!(parse_args(cli::argv(&["test", "--timeout", "3"])).unwrap_err().rc, 2);
        assert_eq!(parse_args(cli::argv(&["test", "--job-id", "a/b"])).unwrap_err().rc, 2);
        assert_eq!(parse_args(cli::argv(&[])).unwrap_err().rc, 2);
        assert_eq!(parse_args(cli::argv(&["bogus"])).unwrap_err().rc, 2);
    }
}
