//! `resume` (ORCH 2.4): directory checks, the binding (the row's wins; a legacy row takes the
//! caller's, missing fields only), the liveness check on the row's own server, and the spawn path
//! with the adapter's resume arguments, forwarding decided exactly as for create.
//!
//! Never prints: stdout lines are returned, diagnostics collected in `Notes`.

use std::path::PathBuf;

use super::create::{fresh_start, place_error};
use super::reconcile::row_target;
use super::{
    adapter_of, backend_kind, caller_binding, check_startable, command_line, ensure_daemon, forward_env,
    learn_conversation, load, rollback_text, same_dir, update, verified_rollback, Notes, PaneRef, SessionError,
    BINDING_VARS,
};
use crate::clock;
use crate::ctx::Ctx;
use crate::pane::{self, Knobs, ListOutcome, PlaceRequest};
use crate::paths;
use crate::sys;
use crate::text::{one_line, show_path};

/// Validated arguments of `mam resume`.
#[derive(Debug, Clone, Default)]
pub struct ResumeArgs {
    pub name: String,
    pub workspace: Option<PathBuf>,
}

/// The whole of 2.4. Returns the stdout lines.
pub fn resume(ctx: &Ctx, a: &ResumeArgs, notes: &mut Notes) -> Result<Vec<String>, SessionError> {
    let resolved = paths::resolve(ctx, None)?;
    let file = resolved.sessions.clone();
    let doc = load(&file)?;
    // 1. The row.
    let Some(row) = doc.row(&a.name).cloned() else {
        return Err(SessionError::Refused(format!(
            "unknown session '{}' (no row in {})",
            one_line(&a.name),
            show_path(&file)
        )));
    };
    if row.remote() {
        return Err(SessionError::Refused(format!("session {} is remote; its runner resumes it", row.name)));
    }
    if !pane::valid_name(&row.name) {
        return Err(SessionError::Refused(format!("row name '{}' is not a valid agent name", one_line(&row.name))));
    }
    let flag_w = a.workspace.as_ref().map(|w| sys::absolutize(ctx.cwd(), w));
    // 2. The directory: existence first (normalisation keeps a missing path), then --workspace.
    let w = match row.cwd() {
        Some(c) => {
            let c = PathBuf::from(c);
            if !c.is_dir() {
                return Err(SessionError::Refused(format!(
                    "session {}: its directory {} no longer exists",
                    row.name,
                    show_path(&c)
                )));
            }
            if let Some(fw) = &flag_w {
                if !same_dir(fw, &c) {
                    return Err(SessionError::Refused(format!(
                        "session {} lives in {}, not --workspace {}",
                        row.name,
                        show_path(&c),
                        show_path(fw)
                    )));
                }
            }
            c
        }
        None => flag_w.clone().unwrap_or_else(|| ctx.cwd().to_path_buf()),
    };
    if !w.is_dir() {
        return Err(SessionError::Refused(format!("--workspace {} is not a directory", show_path(&w))));
    }
    let knobs = Knobs::from_ctx(ctx)?;

    // 3. The binding, before the liveness check.
    let caller = caller_binding(ctx).ok();
    let binding = match (&row.control_plane, &caller) {
        (Some(rowb), _) => {
            let mut b = rowb.clone();
            if let Some(c) = &caller {
                for ((var, mine), theirs) in BINDING_VARS.iter().zip(rowb.values()).zip(c.values()) {
                    if let (Some(m), Some(t)) = (mine, theirs) {
                        if m != t {
                            notes.note(format!("resume {}: {var}: the row's {m} wins over the caller's {t}", row.name));
                        }
                    }
                }
                b.fill_missing(c);
            }
            Some(b)
        }
        (None, Some(c)) => Some(c.clone()),
        (None, None) => None,
    };
    let record_binding = |status_running: bool| {
        update(&file, |doc| {
            if let Some(r) = doc.row_mut(&row.name) {
                if let Some(b) = &binding {
                    match &mut r.control_plane {
                        Some(cp) => cp.fill_missing(b),
                        None => r.control_plane = Some(b.clone()),
                    }
                }
                if status_running {
                    r.status = "running".into();
                }
            }
            Ok(())
        })
    };

    // 4. Liveness on the row's own server, never bootstrapping it for the check.
    let (backend, server) = row_target(ctx, &row)
        .ok_or_else(|| SessionError::Failed(format!("session {}: cannot tell its pane backend", row.name)))?;
    let mut quiet = ctx.clone();
    quiet.set_var("MAM_NO_AUTOSTART", Some("1".as_ref()));
    match pane::open_named(&quiet, &backend, Some(&server))?.list_agents() {
        ListOutcome::Confirmed(list) if list.iter().any(|g| g.name == row.name) => {
            record_binding(true)?;
            return Ok(vec![format!("SESSION={} already running", row.name)]);
        }
        ListOutcome::Unknown(d) => {
            return Err(SessionError::Failed(format!(
                "session {}: state of server {server} unknown ({}); nothing started",
                row.name,
                one_line(&d)
            )))
        }
        _ => {}
    }

    // 5. Spawn with the adapter's resume arguments.
    let env = match &binding {
        Some(b) => forward_env(ctx, b, &w).map_err(SessionError::Refused)?.unwrap_or_default(),
        None => Vec::new(),
    };
    // The adapter's resume arguments for the recorded conversation; without one (or for a kind that
    // cannot resume) a fresh start, whose id is chosen or learnt like create's.
    let ad = adapter_of(&row.agent)?;
    let b = pane::open_named(ctx, &backend, Some(&server))?;
    check_startable(ctx, b.name(), ad)?;
    let recorded = row.conversation_id.clone().filter(|c| !c.is_empty());
    let fresh = || fresh_start(ad, &row.agent_args);
    let resuming = recorded.as_deref().filter(|c| !ad.resume_with(c).is_empty());
    let (args, mut conversation) = match resuming {
        Some(c) => {
            let mut args = row.agent_args.clone();
            args.extend(ad.resume_with(c));
            (args, recorded.clone())
        }
        None => fresh()?,
    };
    super::grant_approval(ctx, ad.kind, &w, &super::stop::row_store(ctx, &row).registry, notes);
    let mut started_ms = clock::now_ms();
    let mut req = PlaceRequest {
        name: row.name.clone(),
        kind: backend_kind(b.name(), ad),
        cwd: w.clone(),
        env,
        args,
        label: ctx.var_nonempty("MAM_WS_LABEL"),
    };
    let placed = match pane::place_and_start(b.as_ref(), &req, &knobs) {
        Ok(p) => p,
        // The CLI itself refused the conversation and exited (claude `--resume` of one it never wrote
        // because no prompt reached it; gemini's of one that never got a model reply): roll back, say
        // so, and start a new conversation instead of failing every later resume the same way.
        Err(f) if resuming.is_some() && matches!(f.error, pane::PaneError::Exited(_)) => {
            if let Some(p) = &f.partial {
                let left = verified_rollback(b.as_ref(), p, &row.name, &w, None);
                if !left.is_empty() {
                    return Err(SessionError::Failed(format!("{}; {}", f.error, rollback_text(&left))));
                }
            }
            let (args, chosen) = fresh()?;
            notes.note(format!(
                "{} could not resume conversation {} ('{}' {}): {}; started a new conversation{}",
                ad.kind,
                resuming.unwrap_or_default(),
                ad.kind,
                req.args.join(" "),
                f.error,
                chosen.as_deref().map(|c| format!(" {c}")).unwrap_or_default()
            ));
            req.args = args;
            conversation = chosen;
            started_ms = clock::now_ms();
            match pane::place_and_start(b.as_ref(), &req, &knobs) {
                Ok(p) => p,
                Err(f) => return Err(place_error(b.as_ref(), &f, &row.name, &w)),
            }
        }
        Err(f) => return Err(place_error(b.as_ref(), &f, &row.name, &w)),
    };
    let conversation = conversation.or_else(|| {
        let pids: Vec<i32> = pane::proc::tree_of(&b.pane_pids(&placed.pane)).iter().map(|p| p.pid).collect();
        learn_conversation(ctx, b.as_ref(), &row.name, ad, &w, started_ms, &pids)
    });
    let pids = super::agent_pids_value(b.as_ref(), &placed.pane, &w);
    let now = clock::now_ts();
    let cmd = command_line(&row.agent, &row.agent_args);
    let written = update(&file, |doc| {
        let Some(r) = doc.row_mut(&row.name) else {
            return Err(SessionError::Failed(format!("row {} vanished meanwhile", row.name)));
        };
        if r.incarnation() != row.incarnation() {
            return Err(SessionError::Failed(format!("row {} was changed meanwhile", row.name)));
        }
        let mut extra = r.pane.as_ref().map(|p| p.extra.clone()).unwrap_or_default();
        match &pids {
            Some(v) => extra.insert(super::AGENT_PIDS.to_string(), v.clone()),
            None => extra.remove(super::AGENT_PIDS),
        };
        r.pane = Some(PaneRef {
            id: Some(placed.pane.clone()),
            server: Some(placed.server.clone()),
            workspace_id: Some(placed.workspace.clone()),
            cwd: Some(w.to_string_lossy().into_owned()),
            cmd_full: Some(cmd.clone()),
            extra,
        });
        r.backend = Some(backend.clone());
        r.start_command = Some(cmd.clone());
        r.status = "running".into();
        r.resumed_at = Some(now.clone());
        r.conversation_id = conversation.clone();
        r.herdr_confirmed = Some(true);
        if let Some(bd) = &binding {
            match &mut r.control_plane {
                Some(cp) => cp.fill_missing(bd),
                None => r.control_plane = Some(bd.clone()),
            }
        }
        Ok(())
    });
    if let Err(e) = written {
        let left = verified_rollback(b.as_ref(), &placed, &row.name, &w, None);
        return Err(SessionError::Failed(format!("cannot record session {}: {e}; {}", row.name, rollback_text(&left))));
    }
    let mut lines = vec![format!(
        "SESSION={} PANE={} WORKSPACE={} CWD={}",
        row.name,
        placed.pane,
        placed.workspace,
        w.to_string_lossy()
    )];
    // The daemon of the control plane the session is bound to (the row's binding wins).
    let root = binding.as_ref().and_then(|b| b.workspace_root.as_ref()).map(PathBuf::from);
    if let Some(p) = ensure_daemon(ctx, root.as_deref().unwrap_or(&resolved.control_root), notes) {
        lines.push(p);
    }
    Ok(lines)
}
