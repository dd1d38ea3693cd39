//! `create` (ORCH 2.3): validate, compute the binding and the forwarding decision, place and start the
//! agent (ORCH 1.5), write the row, ensure the control root's daemon (A26), run one reconcile, and
//! delegate the onboarding job. Any failure after the agent was placed runs the verified rollback.
//!
//! It never prints: stdout lines are returned, diagnostics collected in `Notes`.

use std::path::{Path, PathBuf};

use super::{
    adapter_of, agent_pids_value, backend_kind, caller_binding, check_startable, command_line, default_name,
    ensure_daemon, forward_env, grant_approval, learn_conversation, load, revoke_approval, rollback_text, same_dir,
    update, verified_rollback, Notes, PaneRef, Row, SessionError,
};
use crate::agents;
use crate::clock;
use crate::ctx::Ctx;
use crate::pane::{self, Backend, Knobs, PaneError, PlaceFailure, PlaceRequest, Placed};
use crate::paths;
use crate::sys;
use crate::text::show_path;

/// Validated arguments of `mam create`.
#[derive(Debug, Clone, Default)]
pub struct CreateArgs {
    pub kind: String,
    pub name: Option<String>,
    pub workspace: Option<PathBuf>,
    pub onboard: bool,
    pub label: Option<String>,
    pub agent_args: Vec<String>,
}

/// A fresh start's argv after the program: the user's arguments, then the adapter's start arguments
/// with a new conversation id where the CLI lets mam choose it (ORCH 6.1); and that id.
pub fn fresh_start(ad: &agents::Adapter, user_args: &[String]) -> Result<(Vec<String>, Option<String>), SessionError> {
    let chosen = if ad.chooses_id() {
        Some(agents::new_uuid().map_err(|e| SessionError::Failed(format!("random: {e}")))?)
    } else {
        None
    };
    let mut args = user_args.to_vec();
    args.extend(ad.start_with(chosen.as_deref()));
    Ok((args, chosen))
}

/// Maps a failed placement to the session error: bad input the backend found before touching any
/// pane is rc 2; everything else, and anything after a rollback (2.3: "exit 1 either way"), rc 1.
pub fn place_error(b: &dyn Backend, f: &PlaceFailure, name: &str, cwd: &Path) -> SessionError {
    match (&f.partial, &f.error) {
        (None, PaneError::Usage(m)) => SessionError::Refused(m.clone()),
        (None, e) => SessionError::Failed(e.to_string()),
        (Some(p), e) => {
            SessionError::Failed(format!("{e}; {}", rollback_text(&verified_rollback(b, p, name, cwd, None))))
        }
    }
}

/// The whole of 2.3. Returns the stdout lines (`SESSION= PANE= WORKSPACE= CWD=`, then
/// `ONBOARD_JOB=` and `DAEMON_PID=` when there are such values).
/// How 2.3 step 8 onboards a placed agent: its onboarding job id once started, or why not. The
/// command layer passes `delegate::onboard::onboard`; the session flows know no delegation.
pub type Onboard<'a> = &'a mut dyn FnMut(&Ctx, &str, &Placed, &mut Notes) -> Result<Option<String>, String>;

pub fn create(ctx: &Ctx, a: &CreateArgs, notes: &mut Notes, onboard: Onboard<'_>) -> Result<Vec<String>, SessionError> {
    // 1. Validation: nothing is spawned or written before it passes.
    let ad = adapter_of(&a.kind)?;
    let w = sys::absolutize(ctx.cwd(), a.workspace.as_deref().unwrap_or(ctx.cwd()));
    if !w.is_dir() {
        return Err(SessionError::Refused(format!("--workspace {} is not a directory", show_path(&w))));
    }
    let resolved = paths::resolve(ctx, None)?;
    let file = resolved.sessions.clone();
    let doc = load(&file)?;
    let name = match &a.name {
        Some(n) => n.clone(),
        None => default_name(&doc, &a.kind)
            .ok_or_else(|| SessionError::Refused(format!("no free name {}-01..99; pass --name", a.kind)))?,
    };
    if !pane::valid_name(&name) {
        return Err(SessionError::Refused(format!(
            "invalid session name '{}' (expected [a-z][a-z0-9_-]{{0,31}})",
            crate::text::one_line(&name)
        )));
    }
    if doc.row(&name).is_some_and(Row::running) {
        return Err(SessionError::Refused(format!("session {name} is already running")));
    }
    let knobs = Knobs::from_ctx(ctx)?;

    // 2-4. Binding and forwarding.
    let is_root = same_dir(&w, &resolved.control_root);
    let binding = match caller_binding(ctx) {
        Ok(b) => Some(b),
        Err(e) if is_root => {
            notes.warn(format!("control-plane binding not computed ({e}); the row records none"));
            None
        }
        Err(e) => {
            return Err(SessionError::Refused(format!(
                "cannot compute the control-plane binding for workspace {} ({e})",
                show_path(&w)
            )))
        }
    };
    let env = match &binding {
        Some(b) => forward_env(ctx, b, &w).map_err(SessionError::Refused)?.unwrap_or_default(),
        None => Vec::new(),
    };

    // 5. Place and start, with the adapter's start arguments (the conversation id chosen where the
    // CLI lets mam choose it, ORCH 6.1). A missing executable fails here, before any pane exists.
    // herdr starts only its own kinds: a kind mam runs itself (the pretend agent) goes to tmux unless
    // MAM_PANE_BACKEND chose a backend (issue 32).
    let b = match ctx.var_nonempty("MAM_PANE_BACKEND") {
        None if ad.is_builtin() => pane::open_named(ctx, "tmux", None)?,
        _ => pane::open(ctx, None)?,
    };
    check_startable(ctx, b.name(), ad)?;
    let (args, chosen) = fresh_start(ad, &a.agent_args)?;
    grant_approval(ctx, ad.kind, &w, &resolved.registry, notes);
    let started_ms = clock::now_ms();
    let req = PlaceRequest {
        name: name.clone(),
        kind: backend_kind(b.name(), ad),
        cwd: w.clone(),
        env,
        args,
        label: a.label.clone().or_else(|| ctx.var_nonempty("MAM_WS_LABEL")),
    };
    let placed = match pane::place_and_start(b.as_ref(), &req, &knobs) {
        Ok(p) => p,
        Err(f) => {
            revoke_approval(ctx, &doc, &name, &w, &resolved.registry, notes);
            return Err(place_error(b.as_ref(), &f, &name, &w));
        }
    };
    let fail_after = |what: String, row_written: bool, notes: &mut Notes| -> SessionError {
        let left = verified_rollback(b.as_ref(), &placed, &name, &w, row_written.then_some(file.as_path()));
        revoke_approval(ctx, &load(&file).unwrap_or_else(|_| doc.clone()), &name, &w, &resolved.registry, notes);
        SessionError::Failed(format!("{what}; {}", rollback_text(&left)))
    };

    let conversation = chosen.or_else(|| {
        let pids: Vec<i32> = pane::proc::tree_of(&b.pane_pids(&placed.pane)).iter().map(|p| p.pid).collect();
        learn_conversation(ctx, b.as_ref(), &name, ad, &w, started_ms, &pids)
    });
    // Issue 30: a rolled-back create names the conversation the agent already wrote (it holds the
    // prompt), so the user can resume or purge it.
    let kept_conversation = conversation.clone();
    let fail_after = |what: String, row_written: bool, notes: &mut Notes| -> SessionError {
        match fail_after(what, row_written, notes) {
            SessionError::Failed(m) => SessionError::Failed(match &kept_conversation {
                Some(id) => format!(
                    "{m}; the agent's conversation {id} stays on disk (`mam agents purge {} {id}` deletes it)",
                    ad.kind
                ),
                None => m,
            }),
            e => e,
        }
    };

    // 6. The row; B is persisted whenever it was computed, forwarded or not.
    let now = clock::now_ts();
    let cmd = command_line(&a.kind, &a.agent_args);
    let row = Row {
        name: name.clone(),
        agent: a.kind.clone(),
        transport: "local".into(),
        status: "running".into(),
        backend: Some(b.name().to_string()),
        pane: Some(PaneRef {
            id: Some(placed.pane.clone()),
            server: Some(placed.server.clone()),
            workspace_id: Some(placed.workspace.clone()),
            cwd: Some(w.to_string_lossy().into_owned()),
            cmd_full: Some(cmd.clone()),
            extra: agent_pids_value(b.as_ref(), &placed.pane, &w)
                .map(|v| [(super::AGENT_PIDS.to_string(), v)].into_iter().collect())
                .unwrap_or_default(),
        }),
        start_command: Some(cmd),
        agent_args: a.agent_args.clone(),
        conversation_id: conversation,
        control_plane: binding,
        created_at: Some(now),
        herdr_confirmed: Some(true),
        ..Row::default()
    };
    let written = update(&file, |doc| {
        if doc.row(&name).is_some_and(Row::running) {
            return Err(SessionError::Failed(format!("session {name} was created by someone else meanwhile")));
        }
        // A stopped or exited row of the same name is replaced by the new incarnation.
        doc.herdr_sessions.retain(|r| r.name != name);
        doc.herdr_sessions.push(row.clone());
        Ok(())
    });
    if let Err(e) = written {
        return Err(fail_after(format!("cannot record session {name}: {e}"), false, notes));
    }

    // 7. The control root's daemon (A26), then one reconcile against the control root.
    let daemon_pid = ensure_daemon(ctx, &resolved.control_root, notes);
    reconcile_after(ctx, &resolved.control_root, notes);

    // 8. Onboarding.
    let onboard_job = if a.onboard {
        match onboard(ctx, &name, &placed, notes) {
            Ok(job) => job,
            Err(e) => return Err(fail_after(format!("onboarding of {name} failed: {e}"), true, notes)),
        }
    } else {
        None
    };
    if let Some(job) = &onboard_job {
        let recorded = update(&file, |doc| {
            if let Some(r) = doc.row_mut(&name) {
                r.onboard_job = Some(job.clone());
            }
            Ok(())
        });
        if let Err(e) = recorded {
            notes.warn(format!("onboard job {job} not recorded on row {name}: {e}"));
        }
    }

    // 9. Stdout.
    let mut lines =
        vec![format!("SESSION={name} PANE={} WORKSPACE={} CWD={}", placed.pane, placed.workspace, w.to_string_lossy())];
    if let Some(j) = onboard_job {
        lines.push(format!("ONBOARD_JOB={j}"));
    }
    if let Some(p) = daemon_pid {
        lines.push(p);
    }
    Ok(lines)
}

/// The immediate one-shot reconcile of 2.3 step 7, in-process (the control root's own binary is the
/// one running). Its findings are notes; it never fails the create.
pub fn reconcile_after(ctx: &Ctx, root: &Path, notes: &mut Notes) {
    let mut sub = ctx.clone();
    sub.set_var("WORKSPACE_ROOT", Some(root.as_os_str()));
    match super::reconcile::reconcile_once(&sub) {
        Ok(r) => {
            for l in r.changes() {
                notes.note(format!("reconcile: {l}"));
            }
        }
        Err(e) => notes.warn(format!("reconcile after create: {e}")),
    }
}
