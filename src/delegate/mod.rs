//! delegate-job (ORCH 3; A4, A9-A15, A24): hand one job to one session and know, from evidence on
//! disk and on the wire and never from pane appearance, whether it started, stays alive, finished or
//! died; then collect its report.
//!
//! The flow: preflight of the session (nothing registered on refusal), registration through the
//! registry library (`watcher_pid` recorded, A15), the brief (`brief`), the subscriber started before
//! the injection (`subscriber`, A9), the one-line injection through `pane::send_keys_safe` (or the
//! signed dispatch of `mam remote dispatch` for `remote:` sessions), the wait for `started` within T
//! and the wait loop (`wait`, pure), and every close as an operator `set` through
//! `ops::operator_close`, which also stops the heartbeat timer and publishes the A4 state.
//!
//! Architecture Invariant: the brief's text never appears in any argv (only the one-line prompt with
//! the job id, the brief's path and the start command, A24). This module never prints: diagnostics
//! go to the caller's `diag`, the outcome is a value.

pub mod brief;
pub mod confirm;
pub mod error;
pub mod onboard;
pub mod subscriber;
pub mod wait;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::text::without_error_prefix;
pub use error::DelegateError;

use confirm::{JobRef, JobStarted};

use crate::clock;
use crate::ctx::{ChildRole, Ctx};
use crate::knob;
use crate::notify;
use crate::ops::{self, Close, NewJob, Timing};
use crate::pane::{self, Knobs, ListOutcome, SksOutcome};
use crate::paths;
use crate::registry::engine::{Authority, Kind, Request as EngineRequest};
use crate::registry::record::Record;
use crate::registry::store::{Decided, Store};
use crate::registry::{is_terminal, TYPES};
use crate::remote::dispatch::MAX_BRIEF as MAX_REMOTE_BRIEF;
use crate::session::{self, reconcile::row_target, Row};
use crate::sys;
use crate::text::{one_line, show_path};
use crate::watch::tail::Tail;

use subscriber::{Spec, Subscriber};
use wait::{parse_log_line, parse_sub_line, proves_start, Due, Judge, SubLine};

/// The largest task text a local brief takes (decided): it is read by an agent, not a program.
pub const MAX_TASK: usize = 1024 * 1024;
/// One pass of the wait loop at most; a pass also wakes early on a subscriber line.
const PASS: Duration = Duration::from_millis(200);
/// How often the wait looks at the agent's recorded processes (issue 30).
const AGENT_CHECK: Duration = Duration::from_secs(1);
/// A subscriber that ended early is started again at most this often (3.4: re-probe the broker).
const RESPAWN_GAP: Duration = Duration::from_secs(2);
/// Budget of the closing publish (A4): the record is final before it, so a dead broker must not hold
/// the wrapper for the full one-shot budget.
const CLOSE_PUBLISH_BUDGET_S: &str = "5";
/// Watch budgets when the job has no deadline (`--timeout 0`): ten years, never reached.
const NO_DEADLINE_S: u64 = 315_360_000;
/// Longest wait for `mam remote dispatch`.
const DISPATCH_LIMIT: Duration = Duration::from_secs(60);

/// Which limit the deadline is (A13).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeadlineSource {
    #[default]
    Job,
    WallClock,
}

/// A validated delegation.
#[derive(Debug, Clone)]
pub struct Request {
    /// A local session name, or `remote:<name>`.
    pub session: String,
    /// The task text (the `--brief-file` content), UTF-8 and non-empty.
    pub task: String,
    /// `--timeout` in seconds; 0 means no deadline (A31).
    pub timeout_s: u32,
    pub heartbeat_sec: u32,
    pub heartbeat_misses: u32,
    pub ack_timeout_s: u32,
    /// `--idle-timeout`; `None` or 0 means K x N (A31).
    pub idle_timeout_s: Option<u32>,
    pub registry_dir: Option<PathBuf>,
    pub job_type: String,
    /// `--job-id`: re-dispatch (or register under) this id.
    pub job_id: Option<String>,
    pub parent: Option<String>,
    pub deadline_source: DeadlineSource,
    /// A loop's context block, placed before the task (3.3).
    pub context: Option<String>,
    /// Return as soon as `started` is in (onboarding, ORCH 2.3 step 8): the job runs on under the
    /// daemon's watch (A15).
    pub until_started: bool,
    /// `--detach` (issue 32): return once the prompt is delivered; the job runs on under the
    /// daemon's watch (A15) and `mam wait` gives its verdict.
    pub detach: bool,
    /// `--orchestrator UUID` (A42); else resolved by `orchestrator_for`.
    pub orchestrator: Option<String>,
}

impl Request {
    /// The defaults of 3.1 for a session and a task (env knobs are the caller's business).
    pub fn new(session: &str, task: &str) -> Request {
        Request {
            session: session.to_string(),
            task: task.to_string(),
            timeout_s: 1800,
            heartbeat_sec: 30,
            heartbeat_misses: 4,
            ack_timeout_s: 300,
            idle_timeout_s: None,
            registry_dir: None,
            job_type: "task".into(),
            job_id: None,
            parent: None,
            deadline_source: DeadlineSource::Job,
            context: None,
            until_started: false,
            detach: false,
            orchestrator: None,
        }
    }
}

/// How a registered delegation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    pub job_id: String,
    /// The record's status at the end (non-terminal only for `until_started`, `detach` or an interrupt).
    pub status: String,
    pub report: PathBuf,
    /// The exit code of 3.5.
    pub rc: i32,
    /// Milliseconds from registration to the first proof of `started`, when seen.
    pub started_after_ms: Option<u64>,
}

/// The exit code of 3.5 for a terminal status (`completed` with a report; A7 `failed` like `error`).
pub fn exit_code(status: &str, report_ok: bool) -> i32 {
    match status {
        "completed" if report_ok => 0,
        "completed" | "error" | "failed" => 1,
        "agent_blocked" => 3,
        "deadline_timeout" | "wall_clock_timeout" => 4,
        "broker_unavailable" => 5,
        "cancelled" => 6,
        _ => 1,
    }
}

/// Where the job goes.
#[derive(Clone)]
enum Target {
    Local { name: String, backend: String, server: String },
    Remote,
}

/// A context that never bootstraps a pane server (the agent's server is running, or the job is not
/// deliverable).
fn no_autostart(ctx: &Ctx) -> Ctx {
    let mut c = ctx.clone();
    c.set_var("MAM_NO_AUTOSTART", Some("1".as_ref()));
    c
}

/// A registry operation that failed: a bad knob stays a usage error, the rest are operational.
fn ops_failed(e: ops::OpsError) -> DelegateError {
    match e {
        ops::OpsError::Config(c) => DelegateError::Config(c),
        e => DelegateError::Failed(e.to_string()),
    }
}

fn refuse(msg: impl std::fmt::Display) -> DelegateError {
    DelegateError::Refused(one_line(&msg.to_string()))
}

/// 3.2 step 4: `remote:NAME` needs no preflight; a local session must have a `running` row whose
/// agent is listed on its server.
fn preflight(ctx: &Ctx, resolved: &paths::Resolved, session: &str) -> Result<Target, DelegateError> {
    if let Some(name) = session.strip_prefix("remote:") {
        if name.is_empty() || !clock::valid_session(session) {
            return Err(refuse(format!("invalid remote session '{session}'")));
        }
        return Ok(Target::Remote);
    }
    if !pane::valid_name(session) {
        return Err(refuse(format!(
            "invalid session name '{session}' (expected [a-z][a-z0-9_-]{{0,31}} or remote:NAME)"
        )));
    }
    let doc = session::load(&resolved.sessions).map_err(|e| match e {
        e @ session::SessionError::NotJson { .. } => DelegateError::Session(e),
        other => DelegateError::Failed(format!("delegate-job: {other}")),
    })?;
    let Some(row) = doc.row(session) else {
        return Err(refuse(format!("unknown session '{session}' (no row in {})", show_path(&resolved.sessions))));
    };
    if row.remote() {
        return Err(refuse(format!("session {session} is a remote row; address it as remote:{session}")));
    }
    if !row.running() {
        return Err(refuse(format!("session {session} is {}, not running", row.status)));
    }
    let quiet = no_autostart(ctx);
    let Some((backend, server)) = row_target(&quiet, row) else {
        return Err(refuse(format!("session {session}: cannot tell its pane backend")));
    };
    listed(&quiet, row, &backend, &server)?;
    Ok(Target::Local { name: session.to_string(), backend, server })
}

fn listed(ctx: &Ctx, row: &Row, backend: &str, server: &str) -> Result<(), DelegateError> {
    let b = pane::open_named(ctx, backend, Some(server))?;
    match b.list_agents() {
        ListOutcome::Confirmed(list) if list.iter().any(|a| a.name == row.name) => Ok(()),
        ListOutcome::Confirmed(_) | ListOutcome::NoServer => {
            Err(refuse(format!("the agent of session {} is not listed on {backend} server {server}", row.name)))
        }
        ListOutcome::Unknown(d) => {
            Err(refuse(format!("state of {backend} server {server} unknown ({d}); session {} not confirmed", row.name)))
        }
    }
}

/// Which orchestrator a job records when none is given (3.2 step 5, A42): the caller's session id
/// when the sessions file lists it in `orchestrator_uuids`; else the parent job's; else none.
pub fn orchestrator_for(ctx: &Ctx, resolved: &paths::Resolved, store: &Store, parent: Option<&str>) -> Option<String> {
    if let Ok(doc) = session::load(&resolved.sessions) {
        for v in crate::agents::session_id_vars() {
            if let Some(id) = ctx.var_nonempty(v) {
                if doc.orchestrator_uuids.contains(&id) {
                    return Some(id);
                }
            }
        }
    }
    let parent = parent?;
    let rec = store.read(parent).ok().flatten()?;
    rec.str("orchestrator_uuid").map(str::to_string)
}

/// The whole of 3.2-3.5. `Err` is a failure before anything was registered (rc 1 or 2); once the job
/// is registered every path ends in `Finished` (the subscriber reaped, the job closed when due).
pub fn run(ctx: &Ctx, req: &Request, diag: &mut dyn FnMut(&str)) -> Result<Finished, DelegateError> {
    if !TYPES.contains(&req.job_type.as_str()) {
        return Err(DelegateError::Usage(format!("--type: invalid type '{}'", one_line(&req.job_type))));
    }
    let resolved =
        paths::resolve(ctx, req.registry_dir.as_deref()).map_err(|e| DelegateError::Failed(e.to_string()))?;
    let store = Store::from_resolved(&resolved);
    let target = preflight(ctx, &resolved, &req.session)?;
    let remote = matches!(target, Target::Remote);
    if remote && req.task.len() + 8192 > MAX_REMOTE_BRIEF {
        return Err(refuse(format!("the task is {} bytes; a remote brief carries at most 760 KiB", req.task.len())));
    }

    // 5. Register (a generated id that collides is drawn again), with the orchestrator of A42.
    let mut req = req.clone();
    if req.orchestrator.is_none() {
        req.orchestrator = orchestrator_for(ctx, &resolved, &store, req.parent.as_deref());
    }
    let req = &req;
    let rec = register(ctx, &store, req, &resolved, remote, &mut clock::new_job_id, diag)?;
    let start = Instant::now();
    let mut d = Delegation::new(ctx, req, store, rec, start);
    if let Target::Local { name, .. } = &target {
        let doc = session::load(&resolved.sessions).ok();
        d.agent = doc.as_ref().and_then(|doc| doc.row(name)).and_then(session::AgentLife::of);
    }
    let finished = d.drive(&target, diag);
    d.notify_verdict(diag);
    Ok(finished)
}

/// Step 5: registers the job. A `--job-id` goes through `submit_job` (register or re-dispatch); a
/// generated id from `next_id` only ever registers: a collision with an existing record draws again.
fn register(
    ctx: &Ctx,
    store: &Store,
    req: &Request,
    resolved: &paths::Resolved,
    remote: bool,
    next_id: &mut dyn FnMut() -> std::io::Result<String>,
    diag: &mut dyn FnMut(&str),
) -> Result<Record, DelegateError> {
    let mut tries = 0;
    loop {
        let id = match &req.job_id {
            Some(id) => id.clone(),
            None => next_id().map_err(|e| DelegateError::Failed(format!("cannot draw a job id ({e})")))?,
        };
        let job = new_job(req, resolved, &id, remote);
        let out = if req.job_id.is_some() {
            let (out, warnings) = ops::submit_job(ctx, store, &job).map_err(ops_failed)?;
            warnings.iter().for_each(|w| diag(w));
            out
        } else {
            ops::register_new(ctx, store, &job).map_err(ops_failed)?.1
        };
        out.audit_error.iter().for_each(|w| diag(&format!("WARNING: {w}")));
        match out.decision {
            Decided::Applied(a) => {
                if let Some(w) = ops::window_warning(ctx, &a.record) {
                    diag(&w);
                }
                return Ok(a.record);
            }
            Decided::Refused { reason } if reason == "exists" && req.job_id.is_none() && tries < 5 => tries += 1,
            Decided::Refused { reason } => return Err(DelegateError::JobRefused { id, reason }),
            Decided::Idempotent { status } => return Err(DelegateError::AlreadyDone { id, status }),
        }
    }
}

fn new_job(req: &Request, resolved: &paths::Resolved, id: &str, remote: bool) -> NewJob {
    let dir = resolved.job_dir(id);
    NewJob {
        session: Some(req.session.clone()),
        job_id: Some(id.to_string()),
        job_type: Some(req.job_type.clone()),
        transport: Some(if remote { "remote" } else { "local" }.into()),
        timing: Timing {
            timeout: Some(req.timeout_s),
            heartbeat_sec: Some(req.heartbeat_sec),
            heartbeat_misses: Some(req.heartbeat_misses),
            ack_timeout: Some(req.ack_timeout_s),
            idle_timeout: Some(req.idle_timeout_s.unwrap_or(0)),
        },
        brief_path: Some(dir.join("brief.md")),
        report_path: Some(dir.join("report.md")),
        parent: req.parent.clone(),
        orchestrator: req.orchestrator.clone(),
        iteration: None,
    }
}

/// How the wait ended.
enum End {
    /// The record reached a terminal status of this attempt.
    Terminal,
    /// `until_started`: the agent's `started` is in.
    Started,
    /// SIGINT/SIGTERM: the job stays open (the daemon closes it when nobody waits, A15).
    Signal(i32),
}

/// One registered job being driven to its end.
struct Delegation<'a> {
    ctx: &'a Ctx,
    req: &'a Request,
    store: Store,
    job_id: String,
    attempt: u64,
    token: String,
    brief_path: PathBuf,
    report_path: PathBuf,
    start: Instant,
    judge: Judge,
    event_hw: u64,
    state_hw: u64,
    sub: Option<Subscriber>,
    sub_spawned: Instant,
    sub_warned: bool,
    tail: Tail,
    /// When the prompt was submitted (ms since the start), once it was.
    submitted_ms: Option<u64>,
    /// Where the job went (set by `drive`): an `agent_blocked` close looks at its screen.
    target: Option<Target>,
    /// The session's agent as its row recorded it (a local session whose recorded processes live):
    /// looked at once a second (issue 30: a gone agent, a sandboxed agent's heartbeat).
    agent: Option<session::AgentLife>,
    agent_checked: Option<Instant>,
    /// When this wrapper last armed a timer from outside the agent's sandbox, and whether it warned.
    outside_armed: Option<Instant>,
    outside_warned: bool,
}

impl<'a> Delegation<'a> {
    fn new(ctx: &'a Ctx, req: &'a Request, store: Store, rec: Record, start: Instant) -> Delegation<'a> {
        let job_id = rec.str("job_id").unwrap_or_default().to_string();
        let dir = store.registry.join(&job_id);
        let idle_s = rec
            .u64("idle_timeout_sec")
            .filter(|&s| s > 0)
            .unwrap_or(u64::from(req.heartbeat_sec) * u64::from(req.heartbeat_misses));
        let deadline_ms = (req.timeout_s > 0).then(|| u64::from(req.timeout_s) * 1000);
        Delegation {
            ctx,
            req,
            attempt: rec.attempt().unwrap_or(1),
            token: rec.str("dispatch_token").unwrap_or_default().to_string(),
            brief_path: rec.str("brief_path").map_or_else(|| dir.join("brief.md"), PathBuf::from),
            report_path: rec.str("report_path").map_or_else(|| dir.join("report.md"), PathBuf::from),
            tail: Tail::new(&dir.join("events.log")),
            judge: Judge::new(deadline_ms, u64::from(req.ack_timeout_s) * 1000, idle_s * 1000),
            event_hw: 0,
            state_hw: 0,
            sub: None,
            sub_spawned: start,
            sub_warned: false,
            submitted_ms: None,
            target: None,
            agent: None,
            agent_checked: None,
            outside_armed: None,
            outside_warned: false,
            store,
            job_id,
            start,
        }
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    fn finished(&self, status: &str, rc: i32) -> Finished {
        Finished {
            job_id: self.job_id.clone(),
            status: status.to_string(),
            report: self.report_path.clone(),
            rc,
            started_after_ms: self.judge.started_ms(),
        }
    }

    fn drive(&mut self, target: &Target, diag: &mut dyn FnMut(&str)) -> Finished {
        self.target = Some(target.clone());
        // A15: the wrapper's pid, so the daemon knows somebody waits for this job.
        self.set_meta(diag);
        if let Err(e) = self.write_brief(target) {
            return self.close_now("error", &format!("brief not written: {e}"), 1, diag);
        }
        if let Err(e) = self.spawn_subscriber() {
            return self.close_now("error", &format!("cannot start the subscriber: {e}"), 1, diag);
        }
        let remote = matches!(target, Target::Remote);
        let injected = match target {
            Target::Local { name, backend, server } => self.inject(name, backend, server, diag),
            Target::Remote => self.dispatch(diag).map(|()| None),
        };
        match injected {
            Err(f) => {
                self.reap();
                return f;
            }
            // Issue 30 item 4: T counts from the moment the prompt was submitted, not from the end
            // of the delivery grace that follows it.
            Ok(submitted) => self.judge.injected(submitted.unwrap_or_else(|| self.now())),
        }
        if self.req.detach {
            self.reap();
            return self.finished(&self.record_status(), 0);
        }
        let end = self.wait(diag);
        self.reap();
        match end {
            End::Signal(sig) => {
                let status = self.record_status();
                diag(&format!(
                    "NOTE: job {}: delegate-job interrupted by {}; the job stays {status} (the daemon closes it once it \
                     goes silent)",
                    self.job_id,
                    sys::signal_name(sig)
                ));
                self.finished(&status, 128 + sig)
            }
            End::Started => self.finished(&self.record_status(), 0),
            End::Terminal => self.collect(remote, diag),
        }
    }

    /// Issue 21: this attempt's verdict runs the verdict hook once (the daemon may have been
    /// first); a hook that cannot start is a WARNING, never the job's outcome.
    fn notify_verdict(&self, diag: &mut dyn FnMut(&str)) {
        let Some(rec) = self.read_record().filter(|r| r.attempt() == Some(self.attempt)) else { return };
        let started = notify::start_for_record(self.ctx, &self.store.registry, &self.store.logs, &rec, "delegate-job");
        if let Err(e) = started {
            diag(&format!("WARNING: job {}: {e}", self.job_id));
        }
    }

    fn set_meta(&self, diag: &mut dyn FnMut(&str)) {
        let mut req = EngineRequest::new(Kind::Metadata, Authority::Operator, &self.job_id);
        req.fields.insert("watcher_pid".into(), Value::from(std::process::id()));
        req.expected_attempt = Some(self.attempt);
        req.cas = cas(self.ctx);
        match self.store.apply(&req, clock::now_ms()) {
            Ok(o) => {
                if let Some(w) = o.audit_error {
                    diag(&format!("WARNING: {w}"));
                }
            }
            Err(e) => diag(&format!("WARNING: job {}: watcher_pid not recorded ({e})", self.job_id)),
        }
    }

    fn write_brief(&self, target: &Target) -> Result<(), String> {
        let rec = self.store.read_existing(&self.job_id).map_err(|e| e.to_string())?;
        let deadline = rec.str("deadline_at").map(str::to_string);
        let report = self.report_path.to_str().ok_or("the report path is not UTF-8")?;
        let idle_s = self.judge.idle_ms / 1000;
        let h = brief::Header {
            job_id: &self.job_id,
            session: &self.req.session,
            job_type: &self.req.job_type,
            attempt: self.attempt,
            parent: self.req.parent.as_deref(),
            deadline: deadline.as_deref(),
            heartbeat_sec: u64::from(self.req.heartbeat_sec),
            heartbeat_misses: u64::from(self.req.heartbeat_misses),
            ack_timeout_sec: u64::from(self.req.ack_timeout_s),
            idle_timeout_sec: idle_s,
            report_path: report,
        };
        let text = match target {
            Target::Remote => brief::remote(&h, self.req.context.as_deref(), &self.req.task),
            Target::Local { .. } => {
                let c = brief::Commands::from_prefix(&self.prefix(&rec)?, u64::from(self.req.heartbeat_sec));
                brief::local(&h, self.req.context.as_deref(), &self.req.task, &c)
            }
        };
        if matches!(target, Target::Remote) && text.len() > MAX_REMOTE_BRIEF {
            return Err(format!("the remote brief is {} bytes (at most {MAX_REMOTE_BRIEF})", text.len()));
        }
        let dir = self.store.registry.join(&self.job_id);
        sys::create_dir_all(&dir).map_err(|e| format!("{}: {e}", show_path(&dir)))?;
        // A re-dispatch must not find the previous attempt's report and call it this one's.
        if self.attempt > 1 && self.report_path.exists() {
            let old = dir.join(format!("report.attempt{}.md", self.attempt - 1));
            fs::rename(&self.report_path, &old).map_err(|e| format!("{}: {e}", show_path(&self.report_path)))?;
        }
        sys::atomic_write(&self.brief_path, text.as_bytes())
            .map_err(|e| format!("{}: {e}", show_path(&self.brief_path)))
    }

    /// The publish-cmd prefix (CORE 4.5) as text.
    fn prefix(&self, rec: &Record) -> Result<String, String> {
        let bytes = ops::publish_cmd_line(self.ctx, &self.store, rec).map_err(|e| e.to_string())?;
        String::from_utf8(bytes).map_err(|_| "a path of the publish command is not UTF-8".to_string())
    }

    fn remaining_s(&self) -> Option<u64> {
        self.judge.deadline_ms.map(|d| d.saturating_sub(self.now()).div_ceil(1000))
    }

    fn spawn_subscriber(&mut self) -> Result<(), String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find the mam binary: {e}"))?;
        let rem = self.remaining_s().map(|r| r.max(1));
        let spec = Spec {
            exe,
            env: self.ctx.child_env_for(ChildRole::BrokerClient),
            job_id: self.job_id.clone(),
            registry: self.store.registry.clone(),
            logs: self.store.logs.clone(),
            // A9: the remaining wall clock to the deadline; the wrapper judges T itself.
            ack_timeout_s: rem.unwrap_or(NO_DEADLINE_S),
            // The wrapper judges idleness from both sources; watch must not end first.
            idle_timeout_s: rem.unwrap_or(NO_DEADLINE_S),
            timeout_s: rem.map(|r| r + 5),
            remote: self.req.session.starts_with("remote:"),
        };
        self.sub = Some(Subscriber::spawn(&spec).map_err(|e| e.to_string())?);
        self.sub_spawned = Instant::now();
        Ok(())
    }

    fn reap(&mut self) {
        if let Some(mut s) = self.sub.take() {
            s.reap();
        }
    }

    /// 3.2 step 8: the one-line prompt through `send_keys_safe`, every wait cut by the deadline.
    /// `Ok` carries when the prompt was submitted (ms since the start), when it was.
    fn inject(
        &mut self,
        name: &str,
        backend: &str,
        server: &str,
        diag: &mut dyn FnMut(&str),
    ) -> Result<Option<u64>, Finished> {
        let quiet = no_autostart(self.ctx);
        let b = match pane::open_named(&quiet, backend, Some(server)) {
            Ok(b) => b,
            Err(f) => return Err(self.close_now("agent_blocked", &format!("not submitted ({f})"), 3, diag)),
        };
        let mut k = match Knobs::from_ctx(self.ctx) {
            Ok(k) => k,
            Err(f) => return Err(self.close_now("agent_blocked", &format!("not submitted ({f})"), 3, diag)),
        };
        // The delivery grace runs from the submission, like T: past T the job is agent_blocked
        // whatever the grace would still wait for (issue 30 item 4).
        k.grace_ms = k.grace_ms.min(self.judge.ack_ms);
        if let Some(ms) = self.judge.deadline_ms.map(|d| d.saturating_sub(self.now())) {
            k.idle_wait_ms = k.idle_wait_ms.min(ms);
            k.grace_ms = k.grace_ms.min(ms);
            k.quiesce_max_ms = k.quiesce_max_ms.min(ms);
        }
        let brief = self.brief_path.to_string_lossy().into_owned();
        let rec = self.store.read_existing(&self.job_id).ok();
        let start_line = rec
            .as_ref()
            .and_then(|r| self.prefix(r).ok())
            .map(|p| brief::Commands::from_prefix(&p, u64::from(self.req.heartbeat_sec)).start);
        let mut text = brief::prompt(&self.job_id, &brief, start_line.as_deref());
        if text.len() > pane::MAX_PROMPT {
            text = brief::prompt(&self.job_id, &brief, None);
        }
        let mut confirm = JobStarted::new(JobRef {
            registry: self.store.registry.clone(),
            job_id: self.job_id.clone(),
            token: Some(self.token.clone()),
        });
        let out = pane::send_keys_safe(b.as_ref(), name, &text, Some(&mut confirm), &k);
        let since_start = |t: Instant| t.saturating_duration_since(self.start).as_millis() as u64;
        let submitted = confirm.submitted().map(since_start);
        self.submitted_ms = submitted;
        if let Some(seen) = confirm.started().map(since_start) {
            self.judge.injected(submitted.unwrap_or(seen));
            self.note_start(seen, "events.log started", diag);
        }
        match out {
            SksOutcome::NotSubmitted(why) => {
                Err(self.close_now("agent_blocked", &format!("not submitted: {why}"), 3, diag))
            }
            SksOutcome::Delivered(d) => {
                // Issue 32 item 5: the started NOTE says the job began; the delivery only when it
                // took an unusual path.
                if d.notable {
                    diag(&format!("NOTE: job {}: prompt delivered to {name}: {}", self.job_id, d.how));
                }
                Ok(submitted)
            }
            SksOutcome::Unconfirmed(why) => {
                diag(&format!("NOTE: job {}: {why}; waiting for started", self.job_id));
                Ok(submitted)
            }
        }
    }

    /// 3.6: the signed retained dispatch through `mam remote dispatch` (the brief travels inside it,
    /// read from the brief file; it never appears in an argv).
    fn dispatch(&mut self, diag: &mut dyn FnMut(&str)) -> Result<(), Finished> {
        let reg = self.store.registry.to_string_lossy().into_owned();
        let limit = self.judge.deadline_ms.map_or(DISPATCH_LIMIT, |d| {
            Duration::from_millis(d.saturating_sub(self.now()).max(1000)).min(DISPATCH_LIMIT)
        });
        let mut child_ctx = self.ctx.clone();
        child_ctx.set_var("DELEGATE_JOB_LOGS_DIR", Some(self.store.logs.as_os_str()));
        match session::run_self(
            &child_ctx,
            ChildRole::Dispatcher,
            &["remote", "dispatch", "--job-id", &self.job_id, "--registry-dir", &reg],
            limit,
        ) {
            Ok(out) if out.rc == 0 => {
                diag(&format!("NOTE: job {}: dispatched to {}", self.job_id, self.req.session));
                Ok(())
            }
            Ok(out) => {
                let last = out.stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim().to_string();
                let why = format!(
                    "dispatch failed (mam remote dispatch exit {}: {})",
                    out.rc,
                    one_line(without_error_prefix(&last))
                );
                Err(if out.rc == 3 {
                    self.close_now("broker_unavailable", &why, 5, diag)
                } else {
                    self.close_now("error", &why, 1, diag)
                })
            }
            Err(e) => Err(self.close_now("error", &format!("dispatch failed ({e})"), 1, diag)),
        }
    }

    /// 3.2 step 9 and 3.4: one pass at most every `PASS`, waking early on a subscriber line; every
    /// pass reads the clock, the subscriber, events.log and the record, then judges.
    fn wait(&mut self, diag: &mut dyn FnMut(&str)) -> End {
        loop {
            if let Some(sig) = sys::pending_signal() {
                return End::Signal(sig);
            }
            self.read_subscriber(diag);
            self.read_events_log(diag);
            match self.read_record() {
                Some(rec) if rec.attempt() != Some(self.attempt) => {
                    diag(&format!(
                        "WARNING: job {}: re-dispatched as attempt {} by someone else; no longer waiting",
                        self.job_id,
                        rec.attempt().unwrap_or(0)
                    ));
                    return End::Terminal;
                }
                Some(rec) if is_terminal(rec.status()) => {
                    self.saw_start(&format!("record {}", rec.status()), diag);
                    return End::Terminal;
                }
                Some(rec) if rec.status() == "running" && rec.str("dispatch_token") == Some(&self.token) => {
                    self.saw_start("record running", diag);
                }
                _ => {}
            }
            if self.req.until_started && self.judge.is_started() {
                return End::Started;
            }
            self.look_at_agent(diag);
            let now = self.now();
            if let Some(due) = self.judge.due(now) {
                self.close_due(&due, diag);
                return End::Terminal;
            }
            let sleep = Duration::from_millis(self.judge.next_check(now) - now).min(PASS);
            match self.sub.as_mut() {
                Some(s) => {
                    if let Some(line) = s.next_line(sleep) {
                        self.on_sub_line(&line, diag);
                    }
                }
                None => sys::sleep(sleep),
            }
        }
    }

    /// Issue 30, once a second: an agent whose process has ended is noted (the judge closes the job
    /// one grace later, within N + 2 s of the death instead of K x N); a living agent whose commands
    /// run in their own PID namespace gets its heartbeat from a timer armed here, outside the sandbox,
    /// watching the agent's recorded process (the one its own start command armed ends with the
    /// command's namespace, and sees no agent to watch).
    fn look_at_agent(&mut self, diag: &mut dyn FnMut(&str)) {
        let Some(life) = self.agent.as_ref() else { return };
        if self.agent_checked.is_some_and(|t| t.elapsed() < AGENT_CHECK) {
            return;
        }
        self.agent_checked = Some(Instant::now());
        if let Some(pid) = life.gone() {
            let now = self.now();
            self.judge.agent_gone(now, pid);
            return;
        }
        if !life.sandboxed || !self.judge.is_started() {
            return;
        }
        let pid = life.pid();
        let every = Duration::from_secs(u64::from(self.req.heartbeat_sec.max(1)));
        if self.outside_armed.is_some_and(|t| t.elapsed() < every) {
            return;
        }
        let armed = crate::heartbeat::arm::arm_outside(
            self.ctx,
            &self.store,
            &self.job_id,
            self.attempt,
            &self.token,
            self.req.heartbeat_sec,
            pid,
        );
        if matches!(armed, Ok(None)) {
            return;
        }
        self.outside_armed = Some(Instant::now());
        match armed {
            Ok(None) => {}
            Ok(Some(a)) if !self.outside_warned => {
                self.outside_warned = true;
                diag(&format!(
                    "NOTE: job {}: the agent runs its commands in a sandbox; its heartbeat comes from a timer \
                     outside it (pid {}) that watches the agent's process {pid}",
                    self.job_id, a.started.pid
                ));
            }
            Ok(Some(_)) => {}
            Err(e) if !self.outside_warned => {
                self.outside_warned = true;
                diag(&format!("WARNING: job {}: cannot beat for the sandboxed agent ({e})", self.job_id));
            }
            Err(_) => {}
        }
    }

    fn saw_start(&mut self, what: &str, diag: &mut dyn FnMut(&str)) {
        let now = self.now();
        self.note_start(now, what, diag);
    }

    /// The first proof of `started`, seen at `at` (ms since the start): the NOTE counts from the
    /// prompt's submission, like T (issue 30 item 7), else from the registration.
    fn note_start(&mut self, at: u64, what: &str, diag: &mut dyn FnMut(&str)) {
        if self.judge.is_started() {
            return;
        }
        self.judge.started(at);
        let (from, since) = match self.submitted_ms {
            Some(s) => (at.saturating_sub(s), "after the prompt"),
            None => (at, "after registration"),
        };
        diag(&format!("NOTE: job {}: started {:.1} s {since} ({what})", self.job_id, from as f64 / 1000.0));
    }

    fn read_subscriber(&mut self, diag: &mut dyn FnMut(&str)) {
        let mut lines = Vec::new();
        if let Some(s) = self.sub.as_mut() {
            while let Some(l) = s.next_line(Duration::ZERO) {
                lines.push(l);
            }
        }
        for l in lines {
            self.on_sub_line(&l, diag);
        }
        let Some(s) = self.sub.as_mut() else { return };
        let Some(rc) = s.exited() else { return };
        // Drain what it wrote before it ended.
        let mut rest = Vec::new();
        while let Some(l) = s.next_line(Duration::ZERO) {
            rest.push(l);
        }
        let last = s.last_error();
        for l in rest {
            self.on_sub_line(&l, diag);
        }
        if rc == 3 {
            // The initial connect failed: the broker is down from the subscriber's point of view.
            self.judge.broker_down(self.now());
        }
        if !self.sub_warned && rc != 0 && rc != 10 {
            self.sub_warned = true;
            // One message: what it died of, not its retries' warnings joined (issue 32).
            let what = if rc == 3 { "no broker answers".to_string() } else { format!("subscriber exited {rc}") };
            diag(&format!(
                "WARNING: job {}: {what} ({}); following events.log, re-probing the broker every {} s",
                self.job_id,
                one_line(&last),
                RESPAWN_GAP.as_secs()
            ));
        }
        if self.sub_spawned.elapsed() >= RESPAWN_GAP {
            self.reap();
            if let Err(e) = self.spawn_subscriber() {
                diag(&format!("WARNING: job {}: cannot restart the subscriber ({e})", self.job_id));
            }
        }
    }

    fn on_sub_line(&mut self, line: &str, diag: &mut dyn FnMut(&str)) {
        let token8 = self.token.get(..8).unwrap_or(&self.token).to_string();
        let Some(l) = parse_sub_line(line, self.attempt, &token8) else { return };
        let now = self.now();
        match l {
            SubLine::Accepted { seq, event } => {
                if seq > self.event_hw {
                    self.event_hw = seq;
                    self.judge.evidence(now);
                }
                if proves_start(&event) {
                    self.saw_start(&format!("wire {event}"), diag);
                }
            }
            SubLine::AcceptedState { seq, status } => {
                if seq > self.event_hw.max(self.state_hw) {
                    self.judge.evidence(now);
                }
                self.state_hw = self.state_hw.max(seq);
                if proves_start(&status) {
                    self.saw_start(&format!("wire state {status}"), diag);
                }
            }
            SubLine::Advanced { status } if proves_start(&status) => self.saw_start(&format!("wire {status}"), diag),
            SubLine::BrokerDown => {
                if !self.judge.is_broker_down() {
                    diag(&format!("NOTE: job {}: broker down; following events.log", self.job_id));
                }
                self.judge.broker_down(now);
            }
            SubLine::BrokerUp | SubLine::Subscribed => {
                if self.judge.is_broker_down() {
                    diag(&format!("NOTE: job {}: broker up", self.job_id));
                }
                self.judge.broker_up();
            }
            _ => {}
        }
    }

    fn read_events_log(&mut self, diag: &mut dyn FnMut(&str)) {
        let lines = match self.tail.poll() {
            Ok(l) => l,
            Err(e) => {
                if !self.sub_warned {
                    diag(&format!("WARNING: {}: cannot read ({e})", show_path(self.tail.path())));
                }
                return;
            }
        };
        for l in lines {
            let Some((seq, event)) = parse_log_line(&l, self.attempt, &self.token) else { continue };
            if seq > self.event_hw {
                self.event_hw = seq;
                self.judge.evidence(self.now());
            }
            if proves_start(&event) {
                self.saw_start(&format!("events.log {event}"), diag);
            }
        }
    }

    fn read_record(&self) -> Option<Record> {
        self.store.read(&self.job_id).ok().flatten()
    }

    fn record_status(&self) -> String {
        self.read_record().map_or_else(|| "unknown".into(), |r| r.status().to_string())
    }

    /// Issue 30: the action an approval dialog on the agent's screen waits for, if one does.
    fn approval_waiting(&self) -> Option<String> {
        let Some(Target::Local { name, backend, server }) = &self.target else { return None };
        let b = pane::open_named(&no_autostart(self.ctx), backend, Some(server)).ok()?;
        crate::agents::approval_on(&b.read_detection(name).ok()?)
    }

    fn close_due(&mut self, due: &Due, diag: &mut dyn FnMut(&str)) {
        let (status, mut reason) = due.status_reason(self.req.deadline_source == DeadlineSource::WallClock);
        if let (Due::AgentBlocked { .. }, Some(what)) = (due, self.approval_waiting()) {
            reason = format!("{reason}; the agent waits for an approval ({what})");
        }
        let msg = match due {
            Due::AgentBlocked { .. } => reason.clone(),
            Due::Deadline => format!("deadline of {} s reached", self.req.timeout_s),
            Due::Unresponsive => {
                format!("no event for {} s after the last evidence (unresponsive)", self.judge.idle_ms / 1000)
            }
            Due::BrokerUnavailable => {
                format!("broker unreachable and no event on disk for {} s", self.judge.idle_ms / 1000)
            }
            Due::AgentGone { .. } => due.message(),
        };
        if self.close(status, &reason, diag) {
            diag(&format!("ERROR: job {}: {msg}; closed {status}", self.job_id));
        }
    }

    /// Closes the job now (a failure on the way to the wait) and returns its end.
    fn close_now(&mut self, status: &str, reason: &str, rc: i32, diag: &mut dyn FnMut(&str)) -> Finished {
        self.reap();
        if self.close(status, reason, diag) {
            diag(&format!("ERROR: job {}: {reason}; closed {status}", self.job_id));
        }
        let actual = self.record_status();
        if actual == status {
            self.finished(&actual, rc)
        } else {
            let report_ok = report_ok(&self.report_path);
            self.finished(&actual, exit_code(&actual, report_ok))
        }
    }

    /// Operator `set` through the registry library (A4: timer stopped, close state published), with
    /// the attempt as CAS so a re-dispatched job is never closed by the old wrapper. A refusal means
    /// the job reached another terminal status first; the record tells which. True when applied.
    fn close(&mut self, status: &str, reason: &str, diag: &mut dyn FnMut(&str)) -> bool {
        let mut ctx = self.ctx.clone();
        if ctx.var_nonempty("MAM_PUBLISH_BUDGET_S").is_none() {
            ctx.set_var("MAM_PUBLISH_BUDGET_S", Some(CLOSE_PUBLISH_BUDGET_S.as_ref()));
        }
        let c = Close { reason: Some(reason.to_string()), expected_attempt: Some(self.attempt), no_publish: false };
        match ops::operator_close(&ctx, &self.store, &self.job_id, Kind::Set, Some(status), &c) {
            Ok(closed) => {
                closed.warnings.iter().for_each(|w| diag(w));
                match closed.outcome.decision {
                    Decided::Applied(_) => true,
                    Decided::Refused { reason } => {
                        diag(&format!("NOTE: job {}: close as {status} refused ({reason})", self.job_id));
                        false
                    }
                    _ => false,
                }
            }
            Err(f) => {
                diag(&format!("ERROR: job {}: close as {status} failed ({f})", self.job_id));
                false
            }
        }
    }

    /// 3.5: the record's status decides; `completed` needs a non-empty report.
    fn collect(&mut self, remote: bool, diag: &mut dyn FnMut(&str)) -> Finished {
        let status = self.record_status();
        let ok = report_ok(&self.report_path);
        if status == "completed" && !ok && remote {
            // A12: the report arrives with the terminal event; give the writer a moment.
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline && !report_ok(&self.report_path) {
                sys::sleep(Duration::from_millis(50));
            }
        }
        let ok = report_ok(&self.report_path);
        if status == "completed" && !ok {
            diag(&format!("ERROR: job {}: completed without report ({})", self.job_id, show_path(&self.report_path)));
        }
        self.finished(&status, exit_code(&status, ok))
    }
}

fn report_ok(p: &Path) -> bool {
    sys::is_nonempty_file(p)
}

fn cas(ctx: &Ctx) -> bool {
    ctx.var("MAM_ENGINE_CAS").as_deref() != Some("0")
}

/// The env knobs of 3.1 for a request built by another flow (onboarding): `MAM_DELEGATE_TIMEOUT_S`,
/// `MAM_HEARTBEAT_SEC`, `MAM_HEARTBEAT_MISSES`, `MAM_ACK_TIMEOUT_S`, `MAM_PARENT_JOB_ID`.
pub fn request_from_env(ctx: &Ctx, session: &str, task: &str) -> Result<Request, DelegateError> {
    let mut r = Request::new(session, task);
    r.timeout_s = knob::env_or(ctx, "MAM_DELEGATE_TIMEOUT_S", 0, 1800)?;
    r.heartbeat_sec = knob::env_or(ctx, "MAM_HEARTBEAT_SEC", 1, 30)?;
    r.heartbeat_misses = knob::env_or(ctx, "MAM_HEARTBEAT_MISSES", 1, 4)?;
    r.ack_timeout_s = knob::env_or(ctx, "MAM_ACK_TIMEOUT_S", 1, 300)?;
    if let Some(p) = ctx.var_nonempty("MAM_PARENT_JOB_ID") {
        if !clock::valid_job_id(&p) {
            return Err(DelegateError::Usage("MAM_PARENT_JOB_ID: invalid job id".into()));
        }
        r.parent = Some(p);
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_of_3_5() {
        assert_eq!(exit_code("completed", true), 0);
        assert_eq!(exit_code("completed", false), 1);
        assert_eq!(exit_code("failed", true), 1);
        assert_eq!(exit_code("error", true), 1);
        assert_eq!(exit_code("agent_blocked", false), 3);
        assert_eq!(exit_code("deadline_timeout", false), 4);
        assert_eq!(exit_code("wall_clock_timeout", false), 4);
        assert_eq!(exit_code("broker_unavailable", false), 5);
        assert_eq!(exit_code("cancelled", false), 6);
    }
    #[test]
    fn generated_job_id_collision_draws_a_new_id() {
        let dir = std::env::temp_dir().join(format!("mam-u-collide-{}", sys::random_hex(4).unwrap()));
        fs::create_dir_all(dir.join(".mam")).unwrap();
        let ctx = Ctx::with_env([("WORKSPACE_ROOT", dir.as_os_str())], &dir);
        let resolved = paths::resolve(&ctx, None).unwrap();
        let store = Store::from_resolved(&resolved);
        let req = Request::new("w1", "the task");
        let mut plant = || Ok("aaaaaaaa".to_string());
        let planted = register(&ctx, &store, &req, &resolved, false, &mut plant, &mut |_| {}).unwrap();
        assert_eq!(planted.u64("attempt"), Some(1));
        let planted_token = planted.str("dispatch_token").unwrap().to_string();

        let mut ids = vec!["bbbbbbbb".to_string(), "aaaaaaaa".to_string()];
        let mut next = || Ok(ids.pop().unwrap());
        let rec = register(&ctx, &store, &req, &resolved, false, &mut next, &mut |_| {}).unwrap();
        assert_eq!(rec.str("job_id"), Some("bbbbbbbb"), "a colliding generated id is drawn again");
        assert_eq!(rec.u64("attempt"), Some(1));
        let old = store.read_existing("aaaaaaaa").unwrap();
        assert_eq!(old.u64("attempt"), Some(1), "the old job was not re-dispatched");
        assert_eq!(old.str("dispatch_token"), Some(planted_token.as_str()));
        let _ = fs::remove_dir_all(&dir);
    }
}
