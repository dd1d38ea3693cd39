//! The keeper (issue 30, "faster truth" for the jobs nobody waits for): a job delegated with
//! `--detach`, or whose delegate-job was killed, has no watcher reading its agent's process. Ticked
//! by the board with the open jobs it just read, the keeper does for those what delegate-job does
//! while it waits:
//!
//! - an agent whose recorded processes all ended gets its job closed one grace (1 s) after it was
//!   seen gone: `deadline_timeout` reason `agent_gone` once started, `agent_blocked` before, the
//!   same words delegate-job uses;
//! - a started job whose agent runs its commands in their own PID namespace (codex's sandbox) gets
//!   a heartbeat timer armed outside it, watching the agent's process, while none is alive.
//!
//! The agent's processes are taken from its session's row (`session::AgentLife`) while they live:
//! a row first read after its agent died tells nothing, and the daemon's sweep closes the job after
//! K x N as before. A job with a live watcher is left to it. Closes go through `ops::operator_close`
//! like any watcher's; nothing here prints.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use crate::ctx::Ctx;
use crate::ops::{self, Close};
use crate::pane::proc::Proc;
use crate::registry::engine::Kind;
use crate::registry::store::{Decided, Store};
use crate::session::{self, AgentLife};

/// How long a job stays open after its agent was seen gone (delegate-job's `GONE_GRACE_MS`): a
/// terminal event written just before the exit lands first.
pub const GONE_GRACE: Duration = Duration::from_secs(1);
/// How often the sessions file is read again while an open job's agent is not taken yet.
const RETRY: Duration = Duration::from_secs(1);

/// One open job as the board read it.
#[derive(Debug, Clone)]
pub struct OpenJob {
    pub job_id: String,
    pub session: String,
    pub attempt: u64,
    pub token: String,
    /// `running` (the agent said `started`).
    pub started: bool,
    /// Its watcher (`watcher_pid`) is alive.
    pub watched: bool,
    pub heartbeat_sec: u32,
}

/// What the keeper remembers between ticks.
pub struct Keeper {
    ctx: Ctx,
    store: Store,
    sessions: PathBuf,
    sessions_stamp: Option<(SystemTime, u64)>,
    /// Each session's agent, taken while it lived, with the processes its row recorded then.
    lives: HashMap<String, (Vec<Proc>, AgentLife)>,
    /// Per job: when its agent was first seen gone.
    gone_since: HashMap<String, Instant>,
    /// Per job: when an outside timer was last armed.
    armed_at: HashMap<String, Instant>,
    /// When the sessions file was last read.
    loaded_at: Option<Instant>,
}

impl Keeper {
    pub fn new(ctx: &Ctx, store: Store, sessions: PathBuf) -> Keeper {
        Keeper {
            ctx: ctx.clone(),
            store,
            sessions,
            sessions_stamp: None,
            lives: HashMap::new(),
            gone_since: HashMap::new(),
            armed_at: HashMap::new(),
            loaded_at: None,
        }
    }

    /// Looks after the open jobs nobody watches.
    pub fn tick(&mut self, open: &[OpenJob], log: &mut dyn FnMut(&str)) {
        let ids: HashSet<&str> = open.iter().map(|j| j.job_id.as_str()).collect();
        self.gone_since.retain(|id, _| ids.contains(id.as_str()));
        self.armed_at.retain(|id, _| ids.contains(id.as_str()));
        self.read_lives(open);
        for j in open {
            if j.watched {
                self.gone_since.remove(&j.job_id);
                continue;
            }
            let Some((_, life)) = self.lives.get(&j.session) else { continue };
            if let Some(pid) = life.gone() {
                let since = *self.gone_since.entry(j.job_id.clone()).or_insert_with(Instant::now);
                if since.elapsed() >= GONE_GRACE {
                    self.close_gone(j, pid, log);
                }
                continue;
            }
            self.gone_since.remove(&j.job_id);
            if life.sandboxed && j.started {
                let pid = life.pid();
                self.beat_outside(j, pid, log);
            }
        }
    }

    /// Takes each running session's agent from its row while it lives (every session, not only
    /// those with an open job, so an agent that dies right after a `--detach` was taken before): a
    /// row recording other processes (a resume) gives a new one, a row whose agent is gone keeps
    /// what was taken, a session no longer running drops it. The sessions file is read again when
    /// it changed, or every `RETRY` while an open job's session has no agent taken yet.
    fn read_lives(&mut self, open: &[OpenJob]) {
        let stamp = std::fs::metadata(&self.sessions).ok().and_then(|m| Some((m.modified().ok()?, m.len())));
        let lacking = open.iter().any(|j| !self.lives.contains_key(&j.session));
        let retry = lacking && self.loaded_at.is_none_or(|t| t.elapsed() >= RETRY);
        if stamp == self.sessions_stamp && !retry {
            return;
        }
        self.loaded_at = Some(Instant::now());
        let Ok(doc) = session::load(&self.sessions) else { return };
        self.sessions_stamp = stamp;
        let rows: Vec<&session::Row> = doc.herdr_sessions.iter().filter(|r| r.running() && !r.remote()).collect();
        self.lives.retain(|name, _| rows.iter().any(|r| &r.name == name));
        for row in rows {
            let recorded = session::recorded_procs(row);
            if self.lives.get(&row.name).is_some_and(|(had, _)| *had == recorded) {
                continue;
            }
            if let Some(life) = AgentLife::of(row) {
                self.lives.insert(row.name.clone(), (recorded, life));
            }
        }
    }

    fn close_gone(&mut self, j: &OpenJob, pid: i32, log: &mut dyn FnMut(&str)) {
        self.gone_since.remove(&j.job_id);
        let (status, reason) = if j.started {
            ("deadline_timeout", crate::registry::AGENT_GONE.to_string())
        } else {
            ("agent_blocked", format!("the agent's process (pid {pid}) ended before started"))
        };
        let c = Close { reason: Some(reason), expected_attempt: Some(j.attempt), no_publish: false };
        match ops::operator_close(&self.ctx, &self.store, &j.job_id, Kind::Set, Some(status), &c) {
            Ok(closed) => {
                closed.warnings.iter().for_each(|w| log(&format!("job {}: {w}", j.job_id)));
                match closed.outcome.decision {
                    Decided::Applied(_) => log(&format!(
                        "job {}: closed {status}: the agent's process (pid {pid}) ended and nobody waits for the job",
                        j.job_id
                    )),
                    Decided::Refused { reason } => {
                        log(&format!("job {}: close as {status} refused ({reason})", j.job_id))
                    }
                    _ => {}
                }
            }
            Err(e) => log(&format!("job {}: close as {status} failed ({e})", j.job_id)),
        }
    }

    fn beat_outside(&mut self, j: &OpenJob, pid: i32, log: &mut dyn FnMut(&str)) {
        let every = Duration::from_secs(u64::from(j.heartbeat_sec.max(1)));
        if self.armed_at.get(&j.job_id).is_some_and(|t| t.elapsed() < every) {
            return;
        }
        let armed = crate::heartbeat::arm::arm_outside(
            &self.ctx,
            &self.store,
            &j.job_id,
            j.attempt,
            &j.token,
            j.heartbeat_sec,
            pid,
        );
        match armed {
            Ok(None) => {}
            Ok(Some(a)) => {
                self.armed_at.insert(j.job_id.clone(), Instant::now());
                log(&format!(
                    "job {}: nobody waits for it; its sandboxed agent's heartbeat comes from a timer outside (pid {}) \
                     watching the agent's process {pid}",
                    j.job_id, a.started.pid
                ));
            }
            Err(e) => {
                self.armed_at.insert(j.job_id.clone(), Instant::now());
                log(&format!("job {}: cannot beat for the sandboxed agent ({e})", j.job_id));
            }
        }
    }
}
