//! The loop's delegations (ORCH 4.3, 4.4, 4.7): each job is a child `<loop dir>/bin/mam delegate-job
//! --job-id <jid> ...` of the frozen binary, its prompt a file under `prompts/`, several at once for
//! the reviewers of a round. Here: the child's command line and environment, its budget (the job
//! timeout or the remaining wall clock, naming which), the stall watcher's reading of a job's
//! events.log, and the reaping of a child that must go.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::clock;
use crate::ctx::{ChildRole, Ctx};
use crate::joblog;
use crate::sys;

/// The budget of one delegation (4.7, A13, A36).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// `--timeout` for delegate-job (0 = none).
    pub timeout_s: u32,
    /// True when the remaining wall clock is the smaller limit (a tie names the job's own).
    pub wall_clock: bool,
}

/// `min(--job-timeout, remaining wall clock)`; `remaining` None = no wall clock; a job timeout of 0
/// means none of its own.
pub fn budget(job_timeout_s: u32, remaining: Option<u64>) -> Budget {
    match remaining {
        None => Budget { timeout_s: job_timeout_s, wall_clock: false },
        Some(left) => {
            let left = left.min(u32::MAX as u64) as u32;
            if job_timeout_s == 0 || left < job_timeout_s {
                Budget { timeout_s: left, wall_clock: true }
            } else {
                Budget { timeout_s: job_timeout_s, wall_clock: false }
            }
        }
    }
}

/// What the child is given.
#[derive(Debug, Clone)]
pub struct ChildSpec<'a> {
    pub frozen: &'a Path,
    pub control_root: &'a Path,
    pub registry: &'a Path,
    /// A local session name or `remote:<name>`.
    pub session: &'a str,
    pub jid: &'a str,
    pub body: &'a Path,
    pub context: Option<&'a Path>,
    pub budget: Budget,
    pub heartbeat_sec: u32,
    pub heartbeat_misses: u32,
    pub ack_timeout_s: u32,
    /// The loop's caller's orchestrator (A42), passed to every delegation.
    pub orchestrator: Option<&'a str>,
    /// The caller's own job (its `MAM_PARENT_JOB_ID`), passed as `--parent` (4.3).
    pub parent: Option<&'a str>,
    pub stdout: &'a Path,
    pub stderr: &'a Path,
}

/// The argv after the program: `delegate-job ...` (no prompt text: only paths; 4.9 test 18).
pub fn delegate_args(s: &ChildSpec<'_>) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec!["delegate-job".into(), "--session".into(), s.session.into()];
    a.extend(["--brief-file".into(), s.body.as_os_str().to_os_string()]);
    if let Some(c) = s.context {
        a.extend(["--context-file".into(), c.as_os_str().to_os_string()]);
    }
    a.extend(["--type".into(), "loop".into(), "--job-id".into(), s.jid.into()]);
    a.extend(["--registry-dir".into(), s.registry.as_os_str().to_os_string()]);
    a.extend(["--timeout".into(), s.budget.timeout_s.to_string().into()]);
    a.extend(["--deadline-source".into(), if s.budget.wall_clock { "wall-clock" } else { "job" }.into()]);
    a.extend(["--heartbeat".into(), s.heartbeat_sec.to_string().into()]);
    a.extend(["--heartbeat-misses".into(), s.heartbeat_misses.to_string().into()]);
    a.extend(["--ack-timeout".into(), s.ack_timeout_s.to_string().into()]);
    if let Some(p) = s.parent {
        a.extend(["--parent".into(), p.into()]);
    }
    if let Some(o) = s.orchestrator {
        a.extend(["--orchestrator".into(), o.into()]);
    }
    a
}

/// Starts the child: the frozen binary, from the control root, with `MAM_BIN` set to it and no
/// inherited parent job (4.3: the loop passes `--parent` itself, and never inherits it), in a
/// session of its own.
pub fn spawn(ctx: &Ctx, s: &ChildSpec<'_>) -> std::io::Result<Child> {
    let out = sys::create_new(s.stdout)?;
    let err = sys::create_new(s.stderr)?;
    let mut c = Command::new(s.frozen);
    c.args(delegate_args(s))
        .current_dir(s.control_root)
        .env_clear()
        .envs(ctx.child_env_for(ChildRole::Dispatcher))
        .env("MAM_BIN", s.frozen)
        .env("WORKSPACE_ROOT", s.control_root)
        .env_remove("MAM_PARENT_JOB_ID")
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err));
    // Its own session: a Ctrl-C at the loop's terminal reaches the loop only, which cancels every
    // job through the engine; a loop killed outright still takes its children with it.
    sys::set_new_session(&mut c);
    sys::set_parent_death_signal(&mut c, libc::SIGTERM);
    sys::spawn(&mut c)
}

/// The `JOB_ID=<jid> STATUS=<status> REPORT=<abs>` line of a delegate-job stdout: the status.
pub fn status_of(stdout: &str) -> Option<String> {
    let line = stdout.lines().rev().find(|l| l.starts_with("JOB_ID="))?;
    line.split(' ').find_map(|w| w.strip_prefix("STATUS=")).map(str::to_string)
}

/// The last non-empty line of a child's stderr, for a failure message.
pub fn last_line(text: &str) -> String {
    text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim().to_string()
}

/// Waits for a child up to `limit`, then SIGTERM, then SIGKILL; always reaps it.
pub fn reap(child: &mut Child, limit: Duration) {
    let until = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return,
            Ok(None) if Instant::now() >= until => break,
            Ok(None) => sys::sleep(Duration::from_millis(50)),
        }
    }
    let _ = sys::kill(child.id() as i32, libc::SIGTERM);
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        sys::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The time (ms since the epoch) of the latest event of `jid` other than a heartbeat, read backwards
/// from its events.log (bounded); None when there is none.
pub fn last_non_heartbeat_ms(registry: &Path, jid: &str) -> Option<u64> {
    let path: PathBuf = joblog::events_log_path(registry, jid);
    let mut found = None;
    let _ = joblog::scan_lines_back(&path, 64 * 1024, 4 * 1024 * 1024, |line| {
        let Ok(v) = serde_json::from_slice::<Value>(line) else { return false };
        if v["kind"] != "event" || v["heartbeat"] == Value::Bool(true) {
            return false;
        }
        found = v["ts"].as_str().and_then(clock::parse_ts);
        found.is_some()
    });
    found
}

/// The stall line (A40): `<ts> STALL jid=<jid> session=<s> quiet=<n>s`.
pub fn stall_line(now_ms: u64, jid: &str, session: &str, quiet_s: u64) -> String {
    format!("{} STALL jid={jid} session={session} quiet={quiet_s}s", clock::format_ts(now_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_smaller_budget_binds_and_a_tie_names_the_job() {
        assert_eq!(budget(1800, None), Budget { timeout_s: 1800, wall_clock: false });
        assert_eq!(budget(1800, Some(100)), Budget { timeout_s: 100, wall_clock: true });
        assert_eq!(budget(100, Some(100)), Budget { timeout_s: 100, wall_clock: false });
        assert_eq!(budget(100, Some(5000)), Budget { timeout_s: 100, wall_clock: false });
        assert_eq!(budget(0, Some(60)), Budget { timeout_s: 60, wall_clock: true });
    }

    #[test]
    fn the_status_comes_from_the_last_job_line() {
        assert_eq!(status_of("x\nJOB_ID=ab STATUS=completed REPORT=/r\n").as_deref(), Some("completed"));
        assert_eq!(status_of("nothing"), None);
    }
}
