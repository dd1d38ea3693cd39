//! `mam heartbeat start|stop|status|run` (CORE 7, A16, A17, A31): the per-job heartbeat timer.
//! This file parses and prints; the ownership operations and the timer loop live in
//! `heartbeat::timer`.
//!
//! It never signals a process itself: every stop goes through `timer_proc`'s identity check.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;

use crate::cli::{self, Failure, Parsed};
use crate::clock;
use crate::ctx::Ctx;
use crate::heartbeat::arm::{self, Arm};
use crate::heartbeat::timer::{self, RunArgs, TimerError};
use crate::heartbeat::timer_proc::Stopped;
use crate::knob;
use crate::paths;
use crate::registry::store::Store;
use crate::sys;
use crate::text;
use crate::wire::{self, Settings};

pub const USAGE: &str = "
Usage: mam heartbeat start --job-id ID [--interval N] [--watch-pid PID] [--lifetime S] [--registry-dir D]
       mam heartbeat stop --job-id ID [--drain S] [--registry-dir D]
       mam heartbeat status --job-id ID [--registry-dir D]
       mam heartbeat run --job-id ID --attempt A --dispatch-token T --interval N --watch-pid P
                         --lifetime S --registry-dir D

start   arm the job's timer (draining a previous one first) and print its pid; REFUSED (rc 4)
        when the attempt has ended (terminal, or the terminal barrier is raised)
stop    stop the job's timer: SIGTERM, up to --drain s (MAM_HEARTBEAT_DRAIN_S, 1), then SIGKILL;
        prints `stopped <pid>`, `killed <pid>` or `none`
status  print the live timer's pid, or `none`
run     the detached timer itself (started by `start`; its argv is part of its identity)

Options:
  --interval N      seconds between beats (default: MAM_HEARTBEAT_SEC, else the record's heartbeat_sec)
  --watch-pid PID   stop when this process is gone; 0 watches nothing (default: the nearest agent CLI
                    among the ancestors of this process)
  --lifetime S      stop after S seconds (default: timeout_sec + idle_timeout_sec, or 86400)
  --drain S         seconds a stopped timer may take before SIGKILL (digits or digits.digits)
  --registry-dir D  the job registry; else MAM_JOBS_DIR; else <control root>/.mam/jobs
  -h, --help        print this help

The timer writes its lines to <logs>/<job_id>/heartbeat.log.

Exit codes: 0 ok, 1 runtime error (unknown job, I/O, spawn or pidfile failure), 2 usage,
4 refused (the attempt has ended).
";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sub {
    Start,
    Stop,
    Status,
    Run,
}

#[derive(Debug)]
struct Args {
    sub: Sub,
    job_id: String,
    registry_dir: Option<PathBuf>,
    interval: Option<u32>,
    watch_pid: Option<i32>,
    lifetime: Option<u64>,
    drain: Option<std::time::Duration>,
    attempt: Option<u64>,
    dispatch_token: Option<String>,
}

fn parse_args(args: Vec<OsString>) -> Result<Parsed<Args>, Failure> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let mut sub = None;
    let mut seen: Vec<&'static str> = Vec::new();
    let mut a = Args {
        sub: Sub::Status,
        job_id: String::new(),
        registry_dir: None,
        interval: None,
        watch_pid: None,
        lifetime: None,
        drain: None,
        attempt: None,
        dispatch_token: None,
    };
    let mut job_id = None;
    while let Some(arg) = p.next()? {
        let flag: &'static str = match arg {
            Short('h') | Long("help") => return Ok(Parsed::Help),
            Value(v) if sub.is_none() => {
                let subs = [("start", Sub::Start), ("stop", Sub::Stop), ("status", Sub::Status), ("run", Sub::Run)];
                sub = Some(cli::subcommand("heartbeat", &v, &subs)?);
                continue;
            }
            Long("job-id") => {
                let v = cli::utf8("--job-id", p.value()?)?;
                if !clock::valid_job_id(&v) {
                    return Err(Failure::usage(format!("--job-id: invalid job id '{}'", text::one_line(&v))));
                }
                job_id = Some(v);
                "--job-id"
            }
            Long("registry-dir") => {
                a.registry_dir = Some(p.value()?.into());
                "--registry-dir"
            }
            Long("interval") => {
                a.interval = Some(knob::flag("--interval", &p.value()?, 1)?);
                "--interval"
            }
            Long("watch-pid") => {
                let n = knob::flag("--watch-pid", &p.value()?, 0)?;
                a.watch_pid = Some(i32::try_from(n).map_err(|_| Failure::usage("--watch-pid: not a pid"))?);
                "--watch-pid"
            }
            Long("lifetime") => {
                a.lifetime = Some(knob::flag("--lifetime", &p.value()?, 1)?.into());
                "--lifetime"
            }
            Long("drain") => {
                let raw = p.value()?;
                let ms = raw.to_str().and_then(knob::parse_decimal_ms).ok_or_else(|| {
                    Failure::usage(format!(
                        "--drain: invalid value '{}' (expected seconds, e.g. 1 or 0.5)",
                        text::one_line(&raw.to_string_lossy())
                    ))
                })?;
                a.drain = Some(std::time::Duration::from_millis(ms));
                "--drain"
            }
            Long("attempt") => {
                a.attempt = Some(knob::flag("--attempt", &p.value()?, 1)?.into());
                "--attempt"
            }
            Long("dispatch-token") => {
                let v = cli::utf8("--dispatch-token", p.value()?)?;
                if v.is_empty() || !v.bytes().all(|b| b.is_ascii_alphanumeric()) {
                    return Err(Failure::usage("--dispatch-token: invalid token"));
                }
                a.dispatch_token = Some(v);
                "--dispatch-token"
            }
            _ => return Err(arg.unexpected().into()),
        };
        seen.push(flag);
    }
    let Some(sub) = sub else {
        return Err(Failure::usage("heartbeat: missing subcommand (start, stop, status or run)"));
    };
    a.sub = sub;
    let allowed: &[&str] = match sub {
        Sub::Start => &["--job-id", "--registry-dir", "--interval", "--watch-pid", "--lifetime"],
        Sub::Stop => &["--job-id", "--registry-dir", "--drain"],
        Sub::Status => &["--job-id", "--registry-dir"],
        Sub::Run => {
            &["--job-id", "--registry-dir", "--interval", "--watch-pid", "--lifetime", "--attempt", "--dispatch-token"]
        }
    };
    let name = format!("{sub:?}").to_lowercase();
    if let Some(bad) = seen.iter().find(|f| !allowed.contains(f)) {
        return Err(Failure::usage(format!("heartbeat {name}: unexpected option {bad}")));
    }
    if sub == Sub::Run {
        if let Some(missing) = allowed.iter().find(|f| !seen.contains(f)) {
            return Err(Failure::usage(format!("heartbeat run: {missing} is required")));
        }
    }
    a.job_id = job_id.ok_or_else(|| Failure::usage(format!("heartbeat {name}: --job-id is required")))?;
    Ok(Parsed::Run(a))
}

/// Entry point.
pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let Some(a) = cli::parse_or_help(ctx, USAGE, args, parse_args)? else {
        return Ok(0);
    };
    if a.sub == Sub::Run {
        // CORE 7.5: the handlers come first, so a stop that arrives during start-up is honoured.
        sys::install_stop_handlers().map_err(|e| Failure::runtime(format!("cannot install signal handlers ({e})")))?;
    }
    cli::load_env(ctx)?;
    let resolved = paths::resolve(ctx, a.registry_dir.as_deref())?;
    let store = Store::from_resolved(&resolved);
    match a.sub {
        Sub::Status => {
            ctx.say(&timer::status(&store.registry, &a.job_id).map_or("none".into(), |p| p.to_string()));
            Ok(0)
        }
        Sub::Stop => {
            let drain = match a.drain {
                Some(d) => d,
                None => wire::drain_from_ctx(ctx)?,
            };
            let s = timer::stop_timer(&store, &a.job_id, drain).map_err(Failure::runtime)?;
            if let Some(w) = timer::stopped_warning(&s, drain) {
                ctx.diag(&w);
            }
            ctx.say(&match s {
                Stopped::Drained { pid } => format!("stopped {pid}"),
                Stopped::Killed { pid } => format!("killed {pid}"),
                Stopped::Nothing | Stopped::Stale => "none".into(),
            });
            Ok(0)
        }
        Sub::Start => start(ctx, &store, &Settings::for_registry(ctx, Some(&store.registry))?, &a),
        Sub::Run => {
            let settings = Settings::for_registry(ctx, Some(&store.registry))?;
            let out = ctx.clone();
            let pid = std::process::id();
            let log: timer::Log = Arc::new(move |line: &str| out.say(&format!("{} hb[{pid}] {line}", clock::now_ts())));
            let args = RunArgs {
                job_id: a.job_id.clone(),
                attempt: a.attempt.unwrap_or(0),
                dispatch_token: a.dispatch_token.clone().unwrap_or_default(),
                interval: a.interval.unwrap_or(30),
                watch_pid: a.watch_pid.unwrap_or(0),
                lifetime: a.lifetime.unwrap_or(timer::DEFAULT_LIFETIME_S),
            };
            log(&format!(
                "timer for job {} attempt {} every {}s, watching {}, lifetime {}s",
                args.job_id, args.attempt, args.interval, args.watch_pid, args.lifetime
            ));
            Ok(timer::run(&store, &settings, &args, log))
        }
    }
}

fn start(ctx: &Ctx, store: &Store, settings: &Settings, a: &Args) -> Result<i32, Failure> {
    let rec = store.read_existing(&a.job_id).map_err(Failure::runtime)?;
    let interval = match a.interval {
        Some(n) => n,
        None => match knob::env(ctx, "MAM_HEARTBEAT_SEC", 1)? {
            Some(n) => n,
            None => rec.u64("heartbeat_sec").and_then(|n| u32::try_from(n).ok()).filter(|n| *n >= 1).unwrap_or(30),
        },
    };
    let req = Arm { interval, watch_pid: a.watch_pid, lifetime: a.lifetime, ..Arm::default() };
    match arm::arm(ctx, store, settings, &a.job_id, &rec, req) {
        Ok(armed) => {
            for w in &armed.warnings {
                ctx.diag(w);
            }
            ctx.say(&armed.started.pid.to_string());
            Ok(0)
        }
        Err(e @ TimerError::AttemptEnded { .. }) => Err(Failure::refused(e)),
        Err(e) => Err(Failure::runtime(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_per_subcommand() {
        assert!(matches!(parse_args(cli::argv(&["status", "--job-id", "j"])), Ok(Parsed::Run(_))));
        assert!(matches!(parse_args(cli::argv(&["stop", "--job-id", "j", "--drain", "0.5"])), Ok(Parsed::Run(_))));
        assert_eq!(parse_args(cli::argv(&["status", "--job-id", "j", "--drain", "1"])).unwrap_err().rc, 2);
        assert_eq!(parse_args(cli::argv(&["start"])).unwrap_err().line, "ERROR: heartbeat start: --job-id is required");
        assert_eq!(parse_args(cli::argv(&["run", "--job-id", "j"])).unwrap_err().rc, 2);
        assert_eq!(parse_args(cli::argv(&["start", "--job-id", "j", "--interval", "0"])).unwrap_err().rc, 2);
        assert_eq!(parse_args(cli::argv(&["bogus"])).unwrap_err().rc, 2);
        assert_eq!(parse_args(cli::argv(&[])).unwrap_err().rc, 2);
        assert_eq!(parse_args(cli::argv(&["stop", "--job-id", "j", "--drain", "x"])).unwrap_err().rc, 2);
    }
}
