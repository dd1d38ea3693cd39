//! `mam watch`: follows one job on the wire (and on disk for a local job) and reports whether it
//! started, is alive, finished or died (CORE 8; A9, A10, A11, A12, A31). The loop lives in
//! `watch::follow`; this file parses, reads the record, installs the signal handlers before any
//! connection, and maps the verdict to the exit codes of CORE 8.1.
//!
//! It writes the registry only with `--remote` (through the engine) and never prints a secret.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::cli::{self, Failure, Parsed};
use crate::clock;
use crate::ctx::{Ctx, Sink};
use crate::knob;
use crate::mqtt::MqttConfig;
use crate::paths;
use crate::registry::store::Store;
use crate::sys;
use crate::text;
use crate::watch::accept::Silence;
use crate::watch::follow::{self, Job, Output, Settings, Verdict};

pub const USAGE: &str = "
Usage: mam watch --job-id ID [--registry-dir D] [--ack-timeout S] [--idle-timeout S] [--timeout S]
                 [--remote]

Follows one job: subscribes to <topic_prefix>/events and <topic_prefix>/state (QoS 1) and, for a
local job, reads <registry>/<job_id>/events.log, accepting only signed messages of the record's
current attempt and dispatch token. Every line (stdout and <logs>/<job_id>/subscriber.log) is
`<ts> attempt=<a> token=<8hex> <what>`, ending with `result <status|unresponsive|no_started|wall_clock>`.
A local job whose record is already terminal is answered from disk, without a broker.

Options:
  --job-id ID        the job to follow
  --registry-dir D   the job registry (relative to the cwd); else MAM_JOBS_DIR; else
                     <control root>/.mam/jobs
  --ack-timeout S    budget before the first evidence, measured from watch start; without it
                     T + K x N from the subscription
  --idle-timeout S   the silence window after evidence (0: K x N); else the record's idle_timeout_sec
  --timeout S        cap on the whole run (0: none)
  --remote           mirror accepted events into the record (started -> running, terminal) and
                     write a terminal event's data.report to the record's report_path
  -h, --help         print this help

A lost connection is retried with backoff 1, 2, 4 ... 30 s (`broker down` / `broker up` lines);
the budgets keep running meanwhile. SIGINT/SIGTERM print `watch: received SIG<NAME>; disconnecting`.

Exit codes: 0 completed, 10 another terminal status, 11 unresponsive (idle window expired),
12 no event within the ack budget, 13 --timeout reached, 1 runtime error (unknown job, env),
2 usage, 3 initial connect/subscribe failed, 130 SIGINT, 143 SIGTERM.
";

pub const RC_OTHER_TERMINAL: i32 = 10;
pub const RC_UNRESPONSIVE: i32 = 11;
pub const RC_NO_EVENT: i32 = 12;
pub const RC_WALL_CLOCK: i32 = 13;

/// How long after a signal the guard thread waits for the loop to finish on its own (CORE 8.3: the
/// whole exit must happen within 1 s, also when a blocking TCP connect ignores the stop flag).
const SIGNAL_GRACE: Duration = Duration::from_millis(800);

#[derive(Debug)]
struct Args {
    job_id: String,
    registry_dir: Option<PathBuf>,
    ack_timeout: Option<u32>,
    idle_timeout: Option<u32>,
    timeout: Option<u32>,
    remote: bool,
}

fn parse_args(args: Vec<OsString>) -> Result<Parsed<Args>, Failure> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let mut job_id = None;
    let mut a = Args {
        job_id: String::new(),
        registry_dir: None,
        ack_timeout: None,
        idle_timeout: None,
        timeout: None,
        remote: false,
    };
    while let Some(arg) = p.next()? {
        match arg {
            Long("job-id") => {
                let v = cli::utf8("--job-id", p.value()?)?;
                if !clock::valid_job_id(&v) {
                    return Err(Failure::usage(format!("--job-id: invalid job id '{}'", text::one_line(&v))));
                }
                job_id = Some(v);
            }
            Long("registry-dir") => a.registry_dir = Some(PathBuf::from(p.value()?)),
            Long("ack-timeout") => a.ack_timeout = Some(knob::flag("--ack-timeout", &p.value()?, 1)?),
            Long("idle-timeout") => a.idle_timeout = Some(knob::flag("--idle-timeout", &p.value()?, 0)?),
            Long("timeout") => a.timeout = Some(knob::flag("--timeout", &p.value()?, 0)?),
            Long("remote") => a.remote = true,
            Short('h') | Long("help") => return Ok(Parsed::Help),
            _ => return Err(arg.unexpected().into()),
        }
    }
    a.job_id = job_id.ok_or_else(|| Failure::usage("watch: --job-id is required"))?;
    Ok(Parsed::Run(a))
}

pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let Some(a) = cli::parse_or_help(ctx, USAGE, args, parse_args)? else {
        return Ok(0);
    };
    cli::load_env(ctx)?;
    // CORE 8.2: the handlers are in place before any connection is attempted.
    sys::install_stop_handlers().map_err(|e| Failure::runtime(format!("cannot install signal handlers: {e}")))?;
    let guard = SignalGuard::arm(ctx);
    let result = watch(ctx, &a, &guard.printed);
    guard.disarm();
    result
}

fn watch(ctx: &Ctx, a: &Args, printed: &AtomicBool) -> Result<i32, Failure> {
    let poll_ms = knob::env_or(ctx, "MAM_WATCH_POLL_MS", 1, 1000)?;
    let resolved = paths::resolve(ctx, a.registry_dir.as_deref())?;
    // The embedded broker's credentials of the control root that holds the registry, too: delegate-job
    // starts this subscriber from `/`, and without WORKSPACE_ROOT its own control root is none
    // (issue 18: found by running docs/GUIDE.md, where the watch was refused with CONNACK 4).
    let env_cfg = MqttConfig::from_ctx_near(ctx, Some(&resolved.registry))?;
    let store = Store::from_resolved(&resolved);
    let rec = store.read_existing(&a.job_id).map_err(Failure::runtime)?;
    let job = Job::from_record(&rec).map_err(Failure::runtime)?;
    let cfg = match &job.broker {
        Some(block) => {
            let (cfg, warning) = env_cfg.for_block(block);
            if let Some(w) = warning {
                ctx.diag(&w);
            }
            cfg
        }
        None => env_cfg.clone(),
    };
    let settings = Settings {
        ack_timeout_s: a.ack_timeout.map(u64::from),
        idle_timeout_s: a.idle_timeout.map(u64::from),
        timeout_s: a.timeout.map(u64::from),
        remote: a.remote,
        poll: Duration::from_millis(poll_ms.into()),
        cas: ctx.var("MAM_ENGINE_CAS").as_deref() != Some("0"),
        env: Some(env_cfg),
    };
    let mut out = |o: Output<'_>| match o {
        Output::Line(l) => ctx.say(l),
        Output::Diag(d) => ctx.diag(d),
        // Printed once, by the loop or by the guard, whichever is first.
        Output::Signal(d) => {
            if !printed.swap(true, Ordering::SeqCst) {
                ctx.diag(d);
            }
        }
    };
    let verdict = follow::run(job, store, settings, cfg, &mut out);
    Ok(match verdict {
        Verdict::Terminal(s) if s == "completed" => 0,
        Verdict::Terminal(_) => RC_OTHER_TERMINAL,
        Verdict::Silence(Silence::Unresponsive) => RC_UNRESPONSIVE,
        Verdict::Silence(Silence::NoStarted) => RC_NO_EVENT,
        Verdict::Silence(Silence::WallClock) => RC_WALL_CLOCK,
        Verdict::Signal(sig) => 128 + sig,
        Verdict::Connect(e) => return Err(Failure::wire(format!("watch {}: {e}", a.job_id))),
    })
}

/// Guarantees CORE 8.3's "within 1 s in any phase": every wait in the loop honours the stop flag
/// within 200 ms, but a TCP connect to a black-holed address does not. When a signal is still
/// unanswered after `SIGNAL_GRACE`, this thread prints the line and ends the process (nothing is
/// connected then, so there is nothing to DISCONNECT). Armed only for the real process: an
/// in-process caller (a test with buffered sinks) must not be exited.
struct SignalGuard {
    printed: Arc<AtomicBool>,
    done: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl SignalGuard {
    fn arm(ctx: &Ctx) -> SignalGuard {
        let printed = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicBool::new(false));
        let thread = if matches!(ctx.err, Sink::Std) {
            let (p, d, c) = (printed.clone(), done.clone(), ctx.clone());
            std::thread::Builder::new().name("watch-signal-guard".into()).spawn(move || guard_loop(&c, &p, &d)).ok()
        } else {
            None
        };
        SignalGuard { printed, done, thread }
    }

    fn disarm(mut self) {
        self.done.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn guard_loop(ctx: &Ctx, printed: &AtomicBool, done: &AtomicBool) {
    let mut seen: Option<(i32, Instant)> = None;
    while !done.load(Ordering::SeqCst) {
        match (seen, sys::pending_signal()) {
            (None, Some(sig)) => seen = Some((sig, Instant::now())),
            (Some((sig, at)), _) if at.elapsed() >= SIGNAL_GRACE => {
                if !printed.swap(true, Ordering::SeqCst) {
                    ctx.diag(&follow::signal_line(sig));
                }
                std::process::exit(128 + sig);
            }
            _ => {}
        }
        sys::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_validated() {
        assert!(parse_args(cli::argv(&[])).is_err());
        assert_eq!(parse_args(cli::argv(&["--job-id", "a/b"])).unwrap_err().rc, 2);
        assert_eq!(parse_args(cli::argv(&["--job-id", "j", "--ack-timeout", "0"])).unwrap_err().rc, 2);
        assert_eq!(parse_args(cli::argv(&["--job-id", "j", "--bogus"])).unwrap_err().rc, 2);
        let Parsed::Run(a) =
            parse_args(cli::argv(&["--job-id", "j", "--idle-timeout", "0", "--timeout", "0", "--remote"])).unwrap()
        else {
            panic!("help")
        };
        assert_eq!((a.idle_timeout, a.timeout, a.remote), (Some(0), Some(0), true));
    }
}
