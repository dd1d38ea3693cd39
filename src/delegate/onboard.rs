//! Onboarding (ORCH 2.3 step 8): the first job of a new session, delegated like any other through
//! `delegate-job`'s flow, returning once the agent's own `started` is in. `mam create` runs it through
//! the `session::create::Onboard` hook, so the session flows never import the delegation.

use std::path::Path;

use crate::ctx::Ctx;
use crate::pane::Placed;
use crate::paths;
use crate::session::Notes;

/// 2.3 step 8: delegate the onboarding job (section 3: a brief with absolute publish commands,
/// `--registry-dir` and the log root) and return its id once the agent's own `started` is in, within
/// T (`MAM_ACK_TIMEOUT_S`). The job then runs on; nobody waits for it after `create` returns, so the
/// daemon closes it if it goes silent (A15). `Err` makes create run the verified rollback and exit 1
/// (2.8 test 10). The delegation's diagnostics are kept in `notes`.
pub fn onboard(ctx: &Ctx, name: &str, placed: &Placed, notes: &mut Notes) -> Result<Option<String>, String> {
    let root = paths::control_root(ctx).map_err(|e| e.to_string())?;
    let task = onboarding_task(name, &root, &placed.pane);
    let mut req = super::request_from_env(ctx, name, &task).map_err(|e| e.to_string())?;
    req.until_started = true;
    let mut lines = Vec::new();
    let r = super::run(ctx, &req, &mut |l: &str| lines.push(l.to_string()));
    for l in lines {
        notes.raw(l);
    }
    match r {
        Ok(f) if f.rc == 0 => Ok(Some(f.job_id)),
        Ok(f) => Err(format!("onboarding job {} ended {} (exit {})", f.job_id, f.status, f.rc)),
        Err(e) => Err(e.to_string()),
    }
}

/// The onboarding task (decided text): who the agent is, and a first job that proves the liveness
/// contract works from its pane.
fn onboarding_task(name: &str, root: &Path, pane: &str) -> String {
    format!(
        "Onboarding of session {name}.\n\n\
         You are the agent of session `{name}` (pane {pane}) working for the control plane at `{}`. Jobs are \
         delegated to you as briefs like this one: a file to read and follow, a start command to run first, \
         a report to write and a success or error command to finish with.\n\n\
         For this first job: run the start command, then write a short report (your agent kind, your \
         working directory, and that the commands ran), then run the success command.\n",
        root.display()
    )
}
