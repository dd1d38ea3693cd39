//! Arming a job's heartbeat timer, the one path behind `mam publish --heartbeat N` (CORE 6.3 step 8)
//! and `mam heartbeat start` (CORE 7.3): the lifetime from the record's budgets, the watched pid
//! (the nearest agent-CLI ancestor, CORE 7.6), the timer's executable and environment, then
//! `start_timer`.
//!
//! It never prints: warnings come back with the result, and the caller decides how a failure reads.

use std::path::PathBuf;

use super::timer::{self, StartSpec, Started, TimerError};
use super::timer_proc;
use crate::ctx::{ChildRole, Ctx};
use crate::registry::record::Record;
use crate::registry::store::Store;
use crate::wire::Settings;

/// What the caller asks of the timer; `None` fields take the defaults of CORE 7.1 and 7.6.
#[derive(Debug, Clone, Default)]
pub struct Arm {
    /// The caller's attempt and token; `None` takes the record's.
    pub attempt: Option<u64>,
    pub dispatch_token: Option<String>,
    pub interval: u32,
    /// `--watch-pid`; `None` finds the nearest agent-CLI ancestor of this process.
    pub watch_pid: Option<i32>,
    /// `--lifetime`; `None` derives it from the record's timeout and idle window.
    pub lifetime: Option<u64>,
}

/// A started timer and the warnings met on the way (no agent ancestor, a replaced timer that had to
/// be killed).
#[derive(Debug)]
pub struct Armed {
    pub started: Started,
    pub warnings: Vec<String>,
}

/// Arms the timer of `rec`'s job. The executable is this process's own (`/proc/self/exe`), so the
/// timer runs the same build as the publisher that armed it.
pub fn arm(
    ctx: &Ctx,
    store: &Store,
    settings: &Settings,
    job_id: &str,
    rec: &Record,
    a: Arm,
) -> Result<Armed, TimerError> {
    let mut warnings = Vec::new();
    let lifetime = a.lifetime.unwrap_or_else(|| {
        timer::default_lifetime(rec.u64("timeout_sec").unwrap_or(0), rec.u64("idle_timeout_sec").unwrap_or(0))
    });
    let watch_pid = match a.watch_pid {
        Some(p) => p,
        None => match timer_proc::nearest_agent_ancestor(std::process::id() as i32) {
            Some(p) => p,
            None => {
                warnings.push(format!(
                    "WARNING: no agent CLI among this process's ancestors; the timer watches nothing and ends after {lifetime}s"
                ));
                0
            }
        },
    };
    let spec = StartSpec {
        attempt: a.attempt,
        dispatch_token: a.dispatch_token,
        interval: a.interval,
        watch_pid,
        lifetime,
        ..base_spec(ctx, settings)?
    };
    let started = timer::start_timer(store, job_id, &spec)?;
    warnings.extend(started.replaced.as_ref().and_then(|s| timer::stopped_warning(s, settings.drain)));
    Ok(Armed { started, warnings })
}

/// Issue 30: a timer armed from outside an agent's sandbox (its commands run in their own PID
/// namespace, where the timer their start command arms sees no agent and ends with the command),
/// for the running attempt `attempt` with `token`, watching the agent's process `pid`. `Ok(None)`:
/// a live timer of the job exists, or the record is not that attempt running any more. Used by
/// delegate-job while it waits and by the daemon's keeper for a job nobody waits for.
pub fn arm_outside(
    ctx: &Ctx,
    store: &Store,
    job_id: &str,
    attempt: u64,
    token: &str,
    interval: u32,
    pid: i32,
) -> Result<Option<Armed>, String> {
    if timer::status(&store.registry, job_id).is_some() {
        return Ok(None);
    }
    let Some(rec) = store
        .read(job_id)
        .map_err(|e| e.to_string())?
        .filter(|r| r.status() == "running" && r.attempt() == Some(attempt) && r.str("dispatch_token") == Some(token))
    else {
        return Ok(None);
    };
    let settings = Settings::from_ctx(ctx).map_err(|e| e.to_string())?;
    let a = Arm {
        attempt: Some(attempt),
        dispatch_token: Some(token.to_string()),
        interval: interval.max(1),
        watch_pid: Some(pid),
        lifetime: None,
    };
    arm(ctx, store, &settings, job_id, &rec, a).map(Some).map_err(|e| e.to_string())
}

/// The parts of a timer's `StartSpec` that come from this process: its executable, environment
/// (the env-file overlay included), working directory, drain and fault point. The remote runner
/// starts every job's timer from one of these.
pub fn base_spec(ctx: &Ctx, settings: &Settings) -> Result<StartSpec, TimerError> {
    let exe = std::env::current_exe().map_err(|err| TimerError::Io {
        what: "cannot find the mam executable to run the timer",
        path: PathBuf::from("/proc/self/exe"),
        err,
    })?;
    Ok(StartSpec {
        attempt: None,
        dispatch_token: None,
        interval: 1,
        watch_pid: 0,
        lifetime: 0,
        drain: settings.drain,
        exe,
        env: ctx.child_env_for(ChildRole::BrokerClient),
        cwd: ctx.cwd().to_path_buf(),
        fault: timer::fault_from_ctx(ctx),
    })
}
