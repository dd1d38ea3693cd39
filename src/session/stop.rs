//! `stop` (ORCH 2.5): cancel the session's open `task` jobs through the transition engine (operator
//! `set cancelled`, reason `session stopped`; each then has its timer stopped and its closed state
//! published, as after any operator close, A4), close its pane and confirm the agent is no longer
//! listed, purge the conversation when asked (after the stop: the live agent is itself a holder),
//! and mark the row `stopped`. What of the agent's processes outlives its pane (the pane's process
//! tree taken before the close, and the processes recorded at start) is ended by pid.
//!
//! Stop never bootstraps a pane server (a server that is down has nothing to close). Never prints.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::reconcile::row_target;
use super::{learn_conversation, load, update, Notes, Row, SessionError};
use crate::agents::{self, purge::PurgeError};
use crate::clock;
use crate::ctx::Ctx;
use crate::pane::{self, ListOutcome};
use crate::paths;
use crate::publish::close;
use crate::registry::engine::{Authority, Kind, Request};
use crate::registry::store::{Decided, Store};
use crate::registry::{is_terminal, record::Record};
use crate::sys;
use crate::text::{one_line, show_path};

/// Validated arguments of `mam stop`.
#[derive(Debug, Clone, Default)]
pub struct StopArgs {
    pub names: Vec<String>,
    pub purge: bool,
    pub yes: bool,
}

/// What stopping one session did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stopped {
    pub name: String,
    pub already: bool,
    pub cancelled: Vec<String>,
    pub purged: bool,
}

impl Stopped {
    pub fn line(&self) -> String {
        let status = if self.already { "already-stopped" } else { "stopped" };
        let c = if self.cancelled.is_empty() { "-".to_string() } else { self.cancelled.join(",") };
        let mut l = format!("SESSION={} STATUS={status} CANCELLED={c}", self.name);
        if self.purged {
            l.push_str(" PURGED=1");
        }
        l
    }
}

/// The registry and log root of 2.5 step 2 (A1): `MAM_JOBS_DIR` > the row's `mam_jobs_dir` >
/// `$WORKSPACE_ROOT/.mam/jobs` > the resolver's default; the caller's `DELEGATE_JOB_LOGS_DIR` > the
/// row's `delegate_job_logs_dir` > the directory beside the registry in use.
pub fn row_store(ctx: &Ctx, row: &Row) -> Store {
    // The control root was checked when `stop` resolved the sessions file (issue 12).
    let root = paths::find_control_root(ctx);
    let cp = row.control_plane.clone().unwrap_or_default();
    let registry = match (ctx.path_var("MAM_JOBS_DIR"), &cp.mam_jobs_dir) {
        (Some(env), _) => sys::absolutize(&root, &env),
        (None, Some(r)) => PathBuf::from(r),
        (None, None) => paths::resolve_unchecked(ctx, None).registry,
    };
    let logs = match (ctx.path_var("DELEGATE_JOB_LOGS_DIR"), &cp.delegate_job_logs_dir) {
        (Some(env), _) => sys::absolutize(&root, &env),
        (None, Some(l)) => PathBuf::from(l),
        (None, None) => paths::logs_beside(&registry),
    };
    Store::new(registry, logs)
}

/// The non-terminal jobs of type `task` addressed to `name` (2.5 step 4), in id order.
pub fn open_task_jobs(store: &Store, name: &str) -> Result<Vec<Record>, SessionError> {
    let mut ids = store.job_ids().map_err(|e| SessionError::Failed(e.to_string()))?;
    crate::sort::natural(&mut ids);
    let mut out = Vec::new();
    for id in ids {
        let Ok(Some(rec)) = store.read(&id) else { continue };
        let task = rec.str("type").is_none_or(|t| t == "task");
        if task && rec.str("agent_session") == Some(name) && !is_terminal(rec.status()) {
            out.push(rec);
        }
    }
    Ok(out)
}

/// Cancels each open task job of `name`; returns the ids that became `cancelled`.
pub fn cancel_jobs(ctx: &Ctx, store: &Store, name: &str, notes: &mut Notes) -> Result<Vec<String>, SessionError> {
    let mut done = Vec::new();
    for rec in open_task_jobs(store, name)? {
        let id = rec.str("job_id").unwrap_or_default().to_string();
        let mut req = Request::new(Kind::Set, Authority::Operator, &id).with_status("cancelled");
        req.reason = Some("session stopped".into());
        req.cas = ctx.var("MAM_ENGINE_CAS").as_deref() != Some("0");
        // A4: the closed state carries a fresh seq taken in this same write.
        req.alloc_seq = true;
        match store.apply(&req, clock::now_ms()) {
            Ok(out) => {
                if let Some(w) = &out.audit_error {
                    notes.warn(w);
                }
                match out.decision {
                    Decided::Applied(a) => {
                        after_cancel(ctx, store, &a.record, notes);
                        done.push(id)
                    }
                    Decided::Idempotent { status } | Decided::Refused { reason: status } => {
                        notes.note(format!("job {id} not cancelled ({status})"))
                    }
                }
            }
            Err(e) => notes.warn(format!("job {id} not cancelled ({e})")),
        }
    }
    Ok(done)
}

/// After an applied cancel, as after any operator close: CORE 7.4 stops the job's heartbeat timer
/// with a drain, then A4 publishes the signed retained `closed` state (a failure is a WARNING in
/// `notes`). Runs after L1 is released.
fn after_cancel(ctx: &Ctx, store: &Store, record: &Record, notes: &mut Notes) {
    close::after_close(ctx, store, record, true, &mut |line| notes.raw(line));
}

/// Closes the row's pane and confirms the agent is gone (2.5 step 5).
fn close_and_confirm(ctx: &Ctx, row: &Row, notes: &mut Notes) -> Result<(), SessionError> {
    let Some((backend, server)) = row_target(ctx, row) else {
        return Err(SessionError::Failed(format!("session {}: cannot tell its pane backend", row.name)));
    };
    let b = pane::open_named(ctx, &backend, Some(&server))?;
    // The agent's processes as recorded at start (those still the same processes), so an agent
    // that outlived its pane or server (gemini ignores SIGHUP) is ended too.
    let mut tree = recorded_agent_procs(row);
    let agents = match b.list_agents() {
        ListOutcome::Confirmed(list) => list,
        ListOutcome::NoServer => {
            reap_left(&row.name, &tree, notes);
            return Ok(());
        }
        ListOutcome::Unknown(d) => {
            return Err(SessionError::Failed(format!(
                "session {}: state of server {server} unknown ({}); nothing closed",
                row.name,
                one_line(&d)
            )))
        }
    };
    // The pane the agent is listed in wins over the recorded one; a recorded pane is closed only
    // when no other agent lives in it (pane ids can be reused after a server restart).
    let target = match agents.iter().find(|a| a.name == row.name) {
        Some(a) => Some(a.pane.clone()),
        None => row.pane_id().filter(|p| !agents.iter().any(|a| a.pane == *p)).map(str::to_string),
    };
    if let Some(p) = &target {
        // The pane's process tree, taken before the close: afterwards its orphans have another parent.
        if let Some(cwd) = row.cwd() {
            tree.extend(pane::proc::pane_tree(&b.pane_pids(p), Path::new(cwd)));
        }
        // Issue 21: mam's state display goes first (herdr's sidebar entry, tmux's title).
        let kind = agents::adapter(&row.agent).and_then(|a| a.herdr_kind).unwrap_or(row.agent.as_str());
        if let Err(e) = b.release_state(p, kind, clock::now_ms()) {
            notes.note(format!("session {}: pane {p}: state display not released ({e})", row.name));
        }
        if let Err(e) = b.close_pane(p) {
            notes.warn(format!("session {}: closing pane {p}: {e}", row.name));
        }
    }
    let confirmed = match b.list_agents() {
        ListOutcome::Confirmed(list) if list.iter().any(|a| a.name == row.name) => Err(SessionError::Failed(format!(
            "session {}: agent still listed on server {server} after closing pane {}",
            row.name,
            target.as_deref().unwrap_or("-")
        ))),
        ListOutcome::Unknown(d) => Err(SessionError::Failed(format!(
            "session {}: cannot confirm the agent is gone (state unknown: {})",
            row.name,
            one_line(&d)
        ))),
        _ => Ok(()),
    };
    reap_left(&row.name, &tree, notes);
    if confirmed.is_ok() {
        // Issue 32 item 7: a herdr server mam started goes with mam's last agent on it.
        match b.stop_server_if_ours() {
            Ok(true) => notes.note(format!("{} server {server} stopped (mam started it; no agent is left)", b.name())),
            Ok(false) => {}
            Err(e) => notes.warn(format!("{} server {server}: not stopped ({e})", b.name())),
        }
    }
    confirmed
}

/// How long each of SIGTERM and SIGKILL gets to end an agent's leftover processes.
const REAP_GRACE: Duration = Duration::from_secs(3);

/// The processes `create`/`resume` recorded for the row's agent that still run (pid and start time
/// both match).
fn recorded_agent_procs(row: &Row) -> Vec<pane::proc::Proc> {
    super::recorded_procs(row).into_iter().filter(|p| p.alive()).collect()
}

/// Ends what of the agent's process tree outlived its pane; a survivor of SIGKILL is a WARNING.
fn reap_left(name: &str, tree: &[pane::proc::Proc], notes: &mut Notes) {
    let left = pane::proc::reap(tree, REAP_GRACE);
    if !left.is_empty() {
        let pids: Vec<String> = left.iter().map(i32::to_string).collect();
        notes.warn(format!("session {name}: agent process(es) {} still alive after SIGKILL", pids.join(",")));
    }
}

/// 2.5 step 6: the one purge of section 6 (`agents::purge`) for the row's kind and conversation,
/// now that its agent is gone. `Ok(None)`: no conversation recorded. A refusal (in use, no
/// artifact, a kind that does not purge) is `ConversationKept` (rc 5); residuals are rc 1.
fn purge(ctx: &Ctx, row: &Row, notes: &mut Notes) -> Result<Option<Vec<PathBuf>>, SessionError> {
    let Some(uuid) = row.conversation_id.as_deref().filter(|u| !u.is_empty()) else {
        return Ok(None);
    };
    let kept = |why: String| SessionError::ConversationKept { name: row.name.clone(), why };
    match agents::purge::purge(ctx, &row.agent, uuid) {
        Ok(rep) if rep.residual.is_empty() => Ok(Some(rep.removed)),
        Ok(rep) => {
            for p in &rep.removed {
                notes.note(format!("session {}: removed {}", row.name, show_path(p)));
            }
            let left: Vec<String> = rep.residual.iter().map(|(p, why)| format!("{} ({why})", show_path(p))).collect();
            Err(SessionError::Failed(format!(
                "{}: session stopped; conversation {uuid} purged with residuals: {}",
                row.name,
                left.join(", ")
            )))
        }
        Err(e @ PurgeError::Refused(_)) => Err(kept(e.to_string())),
        Err(e @ PurgeError::Usage(_)) => Err(kept(e.to_string())),
    }
}

/// Records the conversation id of a row that has none when the backend or the CLI's files can tell
/// it now (codex writes its rollout only once it works), so a later resume resumes it.
fn learn_before_close(ctx: &Ctx, file: &Path, row: &Row) {
    if row.conversation_id.is_some() || row.remote() {
        return;
    }
    let (Some(ad), Some((backend, server)), Some(cwd)) = (agents::adapter(&row.agent), row_target(ctx, row), row.cwd())
    else {
        return;
    };
    let Ok(b) = pane::open_named(ctx, &backend, Some(&server)) else { return };
    let since = row.resumed_at.as_deref().or(row.created_at.as_deref()).and_then(clock::parse_ts).unwrap_or(0);
    let pids: Vec<i32> = super::recorded_procs(row).iter().filter(|p| p.alive()).map(|p| p.pid).collect();
    if let Some(c) = learn_conversation(ctx, b.as_ref(), &row.name, ad, Path::new(cwd), since, &pids) {
        let _ = update(file, |doc| {
            if let Some(r) = doc.row_mut(&row.name) {
                if r.conversation_id.is_none() {
                    r.conversation_id = Some(c.clone());
                }
            }
            Ok(())
        });
    }
}

/// The whole of 2.5 for every name. On the first failure the rest are not attempted.
pub fn stop(ctx: &Ctx, a: &StopArgs, notes: &mut Notes) -> Result<Vec<Stopped>, SessionError> {
    if a.purge && !a.yes {
        return Err(SessionError::PurgeNeedsYes);
    }
    if a.purge {
        // A45: a recorded conversation id that is not a canonical uuid is refused before any change.
        let file = paths::resolve(ctx, None)?.sessions;
        let doc = load(&file)?;
        for n in &a.names {
            if let Some(c) = doc.row(n).and_then(|r| r.conversation_id.as_deref()).filter(|c| !c.is_empty()) {
                if agents::canonical_uuid(c).is_none() {
                    return Err(SessionError::Refused(format!(
                        "session {n}: conversation id '{}' is not a canonical uuid; not purged",
                        one_line(c)
                    )));
                }
            }
        }
    }
    let mut ctx = ctx.clone();
    ctx.set_var("MAM_NO_AUTOSTART", Some("1".as_ref()));
    let file = paths::resolve(&ctx, None)?.sessions;
    let doc = load(&file)?;
    for n in &a.names {
        if doc.row(n).is_none() {
            return Err(SessionError::Refused(format!(
                "unknown session '{}' (no row in {})",
                one_line(n),
                show_path(&file)
            )));
        }
    }
    let mut out = Vec::new();
    for n in &a.names {
        out.push(stop_one(&ctx, &file, n, a.purge, notes)?);
    }
    Ok(out)
}

fn stop_one(ctx: &Ctx, file: &Path, name: &str, purge_too: bool, notes: &mut Notes) -> Result<Stopped, SessionError> {
    let row = load(file)?
        .row(name)
        .cloned()
        .ok_or_else(|| SessionError::Failed(format!("session {name} vanished from {}", show_path(file))))?;
    let mut s = Stopped { name: name.to_string(), ..Stopped::default() };
    if row.status == "stopped" {
        s.already = true;
    } else {
        let store = row_store(ctx, &row);
        s.cancelled = cancel_jobs(ctx, &store, name, notes)?;
        learn_before_close(ctx, file, &row);
        if !row.remote() {
            close_and_confirm(ctx, &row, notes)?;
        }
        let now = clock::now_ts();
        update(file, |doc| {
            if let Some(r) = doc.row_mut(name) {
                r.status = "stopped".into();
                r.stopped_at = Some(now);
            }
            Ok(())
        })?;
        if let (Some(cwd), "claude") = (row.cwd(), row.agent.as_str()) {
            super::revoke_approval(ctx, &load(file)?, name, Path::new(cwd), &store.registry, notes);
        }
    }
    if purge_too {
        let row = load(file)?.row(name).cloned().unwrap_or(row);
        match purge(ctx, &row, notes)? {
            None => notes.note(format!("session {name}: no conversation id recorded; nothing to purge")),
            Some(removed) => {
                for p in &removed {
                    notes.note(format!("session {name}: removed {}", show_path(p)));
                }
                s.purged = true;
                update(file, |doc| {
                    if let Some(r) = doc.row_mut(name) {
                        r.conversation_id = None;
                        if let Some(p) = r.pane.as_mut() {
                            p.cwd = None;
                        }
                    }
                    Ok(())
                })?;
            }
        }
    }
    Ok(s)
}
