//! `mam daemon run|ensure|status|stop` (CORE 10, A3, A19, A20): the workspace subscriber daemon's
//! command line. `run` is the daemon itself; `ensure` starts a detached `run` unless one is running;
//! `status` prints the running daemon's pid; `stop` signals it after an identity check.
//!
//! The logic lives in `crate::daemon`; this file parses, resolves paths, spawns and prints. It never
//! signals a process whose argv and start time were not checked against monitor.lock.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::board::{self, Board};
use crate::cli::{self, rc, Failure, Parsed};
use crate::clock;
use crate::ctx::{ChildRole, Ctx};
use crate::daemon::{self, lock, Acquire, Config};
use crate::knob;
use crate::mqtt::{MqttConfig, Stop};
use crate::paths;
use crate::registry::store::Store;
use crate::sys;
use crate::text;

pub const USAGE: &str = "
Usage: mam daemon run --workspace DIR [--registry-dir D] [--logs-dir D] [--idle-timeout S] [--interval S]
       mam daemon ensure [--workspace DIR] [--registry-dir D]
       mam daemon status [--workspace DIR]
       mam daemon stop [--workspace DIR]

The workspace subscriber daemon (CORE 10): one per workspace, holding <DIR>/.mam/monitor.lock.
It subscribes to <topic root>/jobs/+/events and /state and mirrors started and terminal messages of
the jobs in its registry (registry: --registry-dir, else MAM_JOBS_DIR, else <DIR>/.mam/jobs). Every
10 s it closes jobs whose watcher is gone (watcher_pid dead or absent): past deadline_at -> expire;
silent for idle_timeout_sec + 5 s -> deadline_timeout (reason unresponsive). When the broker is
unavailable at start it polls events.log every --interval seconds and retries the broker every 60 s.
It stops (rc 0) on SIGTERM/SIGINT, when DIR disappears, when monitor.lock is replaced, or after
--idle-timeout S seconds without a message (0 = never, the default).

Once a second (and exactly when a state is due) it also shows each running session's job state on
the session's pane (issue 21): herdr's sidebar (`herdr pane report-agent --source mam`, its label
and the pane title), tmux's pane title and border on mam's own server: working while the job's
evidence is fresh, blocked when it is silent past its idle window or was closed for silence, idle
when it finished, unknown while it waits for started; the message names the evidence and whether
the state comes from a signed event or was inferred. It reports on every change and refreshes an
open job's message at most every MAM_BOARD_REFRESH_S s (default 10; 0 = changes only); it gives
the display back when it stops. MAM_BOARD=0 turns this off. It runs MAM_ON_VERDICT for every job
it sees end (once per verdict: see `mam notify --help`).

Subcommands:
  run      the daemon itself; log lines on stdout
  ensure   start a detached `run` (setsid, output appended to <DIR>/.mam/monitor.log) unless one
           is running; wait up to 2 s for its pid in monitor.lock and print it.
           MAM_NO_SUBSCRIBER_DAEMON=1 spawns nothing: prints the pid of a running daemon or
           nothing, and a NOTE on stderr
  status   print the running daemon's pid, or nothing
  stop     send SIGTERM to the daemon named in monitor.lock after checking its argv and start
           time, and wait up to 5 s for it to exit

Options:
  --workspace DIR     the workspace (default for ensure/status/stop: the control root)
  --registry-dir D    the job registry (relative to the cwd)
  --logs-dir D        the audit-log root (default: DELEGATE_JOB_LOGS_DIR, else beside the registry)
  --idle-timeout S    run: exit after S seconds without any message (0 = run forever)
  --interval S        run: polling period of the fallback (default 10, >= 1)
  -h, --help          print this help

Env: MQTT_* (CORE 3.1); MAM_DAEMON_BROKER_RETRY_S (fallback broker retry, default 60);
MAM_DAEMON_SWEEP_S (abandoned-job sweep period, default 10); MAM_NO_SUBSCRIBER_DAEMON; MAM_BOARD,
MAM_BOARD_REFRESH_S; MAM_ON_VERDICT, MAM_ON_VERDICT_TIMEOUT_S; AGENT_SESSIONS_YAML.

Exit codes: 0 ok (also every clean daemon stop), 1 runtime error, 2 usage,
5 run: another daemon holds the workspace lock (`ERROR: daemon already running (pid N)`).
";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sub {
    Run,
    Ensure,
    Status,
    Stop,
}

#[derive(Debug)]
struct Args {
    sub: Sub,
    workspace: Option<PathBuf>,
    registry_dir: Option<PathBuf>,
    logs_dir: Option<PathBuf>,
    idle_timeout: u32,
    interval: u32,
}

fn parse_args(args: Vec<OsString>) -> Result<Parsed<Args>, Failure> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let mut sub = None;
    let mut a =
        Args { sub: Sub::Status, workspace: None, registry_dir: None, logs_dir: None, idle_timeout: 0, interval: 10 };
    let mut seen: Vec<&'static str> = Vec::new();
    while let Some(arg) = p.next()? {
        match arg {
            Value(v) if sub.is_none() => {
                let subs = [("run", Sub::Run), ("ensure", Sub::Ensure), ("status", Sub::Status), ("stop", Sub::Stop)];
                sub = Some(cli::subcommand("daemon", &v, &subs)?)
            }
            Long("workspace") => {
                a.workspace = Some(nonempty("--workspace", p.value()?)?);
                seen.push("--workspace");
            }
            Long("registry-dir") => {
                a.registry_dir = Some(nonempty("--registry-dir", p.value()?)?);
                seen.push("--registry-dir");
            }
            Long("logs-dir") => {
                a.logs_dir = Some(nonempty("--logs-dir", p.value()?)?);
                seen.push("--logs-dir");
            }
            Long("idle-timeout") => {
                a.idle_timeout = knob::flag("--idle-timeout", &p.value()?, 0)?;
                seen.push("--idle-timeout");
            }
            Long("interval") => {
                a.interval = knob::flag("--interval", &p.value()?, 1)?;
                seen.push("--interval");
            }
            Short('h') | Long("help") => return Ok(Parsed::Help),
            _ => return Err(arg.unexpected().into()),
        }
    }
    let Some(sub) = sub else {
        return Err(Failure::usage("daemon: a subcommand is required (run, ensure, status or stop)"));
    };
    a.sub = sub;
    let allowed: &[&str] = match sub {
        Sub::Run => &["--workspace", "--registry-dir", "--logs-dir", "--idle-timeout", "--interval"],
        Sub::Ensure => &["--workspace", "--registry-dir"],
        Sub::Status | Sub::Stop => &["--workspace"],
    };
    if let Some(bad) = seen.iter().find(|f| !allowed.contains(f)) {
        let name = format!("{sub:?}").to_lowercase();
        return Err(Failure::usage(format!("daemon {name}: {bad} is not accepted here")));
    }
    if sub == Sub::Run && a.workspace.is_none() {
        return Err(Failure::usage("daemon run: --workspace is required"));
    }
    Ok(Parsed::Run(a))
}

fn nonempty(flag: &str, v: OsString) -> Result<PathBuf, Failure> {
    if v.is_empty() {
        return Err(Failure::usage(format!("{flag}: empty value")));
    }
    Ok(PathBuf::from(v))
}

pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let Some(a) = cli::parse_or_help(ctx, USAGE, args, parse_args)? else {
        return Ok(0);
    };
    cli::load_env(ctx)?;
    let workspace = match &a.workspace {
        Some(w) => sys::absolutize(ctx.cwd(), w),
        None => paths::find_control_root(ctx),
    };
    // Issue 12: every daemon verb reads or writes under <workspace>/.mam (monitor.lock names a pid
    // that `stop` signals), so each checks it first.
    paths::check(ctx, &workspace, &[])?;
    match a.sub {
        Sub::Run => run_daemon(ctx, &a, &workspace),
        Sub::Ensure => ensure(ctx, &a, &workspace),
        Sub::Status => {
            if let Some(pid) = lock::running_pid(&workspace) {
                ctx.say(&pid.to_string());
            }
            Ok(0)
        }
        Sub::Stop => stop(ctx, &workspace),
    }
}

/// A19: the registry is `--registry-dir` (against the cwd), else `MAM_JOBS_DIR` (against the
/// workspace), else `<workspace>/.mam/jobs`; the log root is `--logs-dir`, else
/// `DELEGATE_JOB_LOGS_DIR` (against the workspace), else beside the registry. All absolute, and
/// trusted (`paths::check`, issue 12).
pub fn resolve_store(
    ctx: &Ctx,
    workspace: &Path,
    registry_dir: Option<&Path>,
    logs_dir: Option<&Path>,
) -> Result<Store, Failure> {
    let registry = match (registry_dir, ctx.path_var("MAM_JOBS_DIR")) {
        (Some(flag), _) => sys::absolutize(ctx.cwd(), flag),
        (None, Some(env)) => sys::absolutize(workspace, &env),
        (None, None) => workspace.join(".mam").join("jobs"),
    };
    let logs = match (logs_dir, ctx.path_var("DELEGATE_JOB_LOGS_DIR")) {
        (Some(flag), _) => sys::absolutize(ctx.cwd(), flag),
        (None, Some(env)) => sys::absolutize(workspace, &env),
        (None, None) => paths::logs_beside(&registry),
    };
    paths::check(ctx, workspace, &[&registry, &logs])?;
    Ok(Store::new(registry, logs))
}

fn secs_knob(ctx: &Ctx, name: &str, default: u32) -> Result<Duration, Failure> {
    Ok(Duration::from_secs(knob::env_or(ctx, name, 1, default)?.into()))
}

fn run_daemon(ctx: &mut Ctx, a: &Args, workspace: &Path) -> Result<i32, Failure> {
    let mqtt = MqttConfig::from_ctx(ctx)?;
    let broker_retry = secs_knob(ctx, "MAM_DAEMON_BROKER_RETRY_S", 60)?;
    let sweep_every = secs_knob(ctx, "MAM_DAEMON_SWEEP_S", 10)?;
    let board_settings = board::settings(ctx)?;
    // Signal handlers go in before anything that can block (CORE 10.2 step 2).
    sys::install_stop_handlers().map_err(|e| Failure::runtime(format!("cannot install signal handlers: {e}")))?;
    let held = match daemon::acquire(workspace) {
        Ok(Acquire::Held(l)) => l,
        Ok(Acquire::Busy(pid)) => return Err(already_running(workspace, pid)),
        Err(e) => {
            return Err(Failure::runtime(format!(
                "{}: cannot take the monitor lock ({e})",
                text::show_path(&lock::lock_path(workspace))
            )))
        }
    };
    let store = resolve_store(ctx, workspace, a.registry_dir.as_deref(), a.logs_dir.as_deref())?;
    let cfg = Config {
        workspace: workspace.to_path_buf(),
        store,
        mqtt,
        cas: ctx.var("MAM_ENGINE_CAS").as_deref() != Some("0"),
        idle_timeout: (a.idle_timeout > 0).then(|| Duration::from_secs(a.idle_timeout.into())),
        interval: Duration::from_secs(a.interval.into()),
        broker_retry,
        sweep_every,
    };
    let mut log = |line: &str| ctx.say(&format!("{} daemon: {line}", clock::now_ts()));
    log(&format!(
        "started pid={} workspace={} registry={} logs={}",
        std::process::id(),
        text::show_path(&cfg.workspace),
        text::show_path(&cfg.store.registry),
        text::show_path(&cfg.store.logs)
    ));
    // Issue 21: the board of the workspace's sessions and the verdict hooks.
    let sessions = match ctx.path_var("AGENT_SESSIONS_YAML") {
        Some(p) => sys::absolutize(workspace, &p),
        None => workspace.join(".mam").join("agent_sessions.json"),
    };
    if board_settings.report || board_settings.hooks {
        let mut board = Board::new(ctx, cfg.store.clone(), sessions, board_settings);
        daemon::run_with(&cfg, &held, Stop::never(), &mut board, &mut log);
    } else {
        daemon::run(&cfg, &held, Stop::never(), &mut log);
    }
    drop(held);
    // The legacy `reconcile.sh --subscribe` trap exited 128 + the signal (issue 32 item 11); its
    // shim asks for that, `mam daemon run` itself stops with 0.
    if let Some(sig) = sys::pending_signal().filter(|_| ctx.var("MAM_LEGACY_SIGNAL_RC").as_deref() == Some("1")) {
        return Ok(128 + sig);
    }
    Ok(0)
}

/// rc 5 `ERROR: daemon already running (pid N)` (A3). The holder may not have written its pid yet
/// (A20): wait up to 1 s for it.
fn already_running(workspace: &Path, mut pid: Option<i32>) -> Failure {
    let deadline = Instant::now() + Duration::from_secs(1);
    while pid.is_none() && Instant::now() < deadline {
        sys::sleep(Duration::from_millis(20));
        pid = lock::read_info(workspace).map(|i| i.pid);
    }
    let shown = pid.map_or_else(|| "unknown".to_string(), |p| p.to_string());
    Failure::new(rc::LOCKED, format!("ERROR: daemon already running (pid {shown})"))
}

fn ensure(ctx: &Ctx, a: &Args, workspace: &Path) -> Result<i32, Failure> {
    if !workspace.is_dir() {
        return Err(Failure::runtime(format!("{}: workspace directory does not exist", text::show_path(workspace))));
    }
    // CORE 10.1: under the opt-out the NOTE is always printed; a running daemon is still reported.
    if ctx.var("MAM_NO_SUBSCRIBER_DAEMON").as_deref() == Some("1") {
        ctx.diag("NOTE: subscriber daemon disabled (MAM_NO_SUBSCRIBER_DAEMON=1)");
        if let Some(pid) = lock::running_pid(workspace) {
            ctx.say(&pid.to_string());
        }
        return Ok(0);
    }
    if let Some(pid) = lock::running_pid(workspace) {
        ctx.say(&pid.to_string());
        return Ok(0);
    }
    let store = resolve_store(ctx, workspace, a.registry_dir.as_deref(), None)?;
    let exe = std::env::current_exe().map_err(|e| Failure::runtime(format!("cannot find the mam binary ({e})")))?;
    let log_path = lock::log_path(workspace);
    let log_file = sys::create_dir_all(&workspace.join(".mam"))
        .and_then(|_| sys::open_append(&log_path))
        .map_err(|e| Failure::runtime(format!("{}: cannot open ({e})", text::show_path(&log_path))))?;
    let log_err =
        log_file.try_clone().map_err(|e| Failure::runtime(format!("cannot duplicate log descriptor ({e})")))?;
    let mut cmd = Command::new(&exe);
    cmd.arg("daemon")
        .arg("run")
        .arg("--workspace")
        .arg(workspace)
        .arg("--registry-dir")
        .arg(&store.registry)
        .arg("--logs-dir")
        .arg(&store.logs)
        .env_clear()
        .envs(ctx.child_env_for(ChildRole::BrokerClient))
        .current_dir(workspace)
        .stdin(Stdio::null())
        .stdout(log_file)
        .stderr(log_err);
    sys::set_new_session(&mut cmd);
    let mut child = sys::spawn(&mut cmd).map_err(|e| Failure::runtime(format!("cannot start the daemon ({e})")))?;
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        if let Some(pid) = lock::running_pid(workspace) {
            ctx.say(&pid.to_string());
            return Ok(0);
        }
        if let Ok(Some(status)) = child.try_wait() {
            // rc 5: another ensure won the race; its pid shows up in the lock file.
            if status.code() != Some(rc::LOCKED) {
                return Err(Failure::runtime(format!(
                    "the daemon exited at start ({status}); see {}",
                    text::show_path(&log_path)
                )));
            }
        }
        if Instant::now() >= deadline {
            break;
        }
        sys::sleep(Duration::from_millis(10));
    }
    ctx.diag(&format!("WARNING: daemon {} did not show its pid in monitor.lock within 2s", child.id()));
    ctx.say(&child.id().to_string());
    Ok(0)
}

fn stop(ctx: &Ctx, workspace: &Path) -> Result<i32, Failure> {
    let Some(info) = lock::read_info(workspace).filter(|i| lock::is_daemon_for(i, workspace)) else {
        ctx.diag(&format!("NOTE: no daemon running for {}", text::show_path(workspace)));
        return Ok(0);
    };
    sys::kill(info.pid, libc::SIGTERM)
        .map_err(|e| Failure::runtime(format!("cannot signal daemon {} ({e})", info.pid)))?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while lock::is_daemon_for(&info, workspace) {
        if Instant::now() >= deadline {
            return Err(Failure::runtime(format!("daemon {} did not stop within 5s of SIGTERM", info.pid)));
        }
        sys::sleep(Duration::from_millis(20));
    }
    ctx.say(&format!("stopped daemon {}", info.pid));
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_per_subcommand() {
        assert!(matches!(
            parse_args(cli::argv(&["run", "--workspace", "/w", "--idle-timeout", "0"])),
            Ok(Parsed::Run(_))
        ));
        assert_eq!(parse_args(cli::argv(&["run"])).unwrap_err().line, "ERROR: daemon run: --workspace is required");
        assert_eq!(
            parse_args(cli::argv(&["status", "--interval", "1"])).unwrap_err().line,
            "ERROR: daemon status: --interval is not accepted here"
        );
        assert_eq!(parse_args(cli::argv(&[])).unwrap_err().rc, 2);
        assert_eq!(parse_args(cli::argv(&["bogus"])).unwrap_err().rc, 2);
        assert_eq!(parse_args(cli::argv(&["run", "--workspace", "/w", "--interval", "0"])).unwrap_err().rc, 2);
        assert_eq!(parse_args(cli::argv(&["run", "--workspace", ""])).unwrap_err().rc, 2);
        assert!(matches!(parse_args(cli::argv(&["ensure"])), Ok(Parsed::Run(Args { sub: Sub::Ensure, .. }))));
    }
}
