//! Path resolution (CORE 2, A1, ORCH 0.2): one resolver for the control root, the job registry, the
//! audit-log root and the sessions file, used by every subcommand.
//!
//! Resolution reads the environment through `Ctx` and the filesystem only to find `.mam/` and
//! `.git`; it never creates anything (creation is lazy, on the first write) and needs no broker.

use std::path::{Path, PathBuf};

use crate::ctx::Ctx;
use crate::sys::absolutize;

/// The four absolute paths of the control-plane binding, plus the control root they hang from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub control_root: PathBuf,
    pub registry: PathBuf,
    pub logs: PathBuf,
    pub sessions: PathBuf,
}

/// The control root (A1 step 1): `WORKSPACE_ROOT` made absolute; else the nearest ancestor of cwd
/// (inclusive) holding `.mam/`; else the git top level of cwd; else cwd.
pub fn control_root(ctx: &Ctx) -> PathBuf {
    if let Some(ws) = ctx.path_var("WORKSPACE_ROOT") {
        return absolutize(ctx.cwd(), &ws);
    }
    let cwd = absolutize(Path::new("/"), ctx.cwd());
    if let Some(found) = cwd.ancestors().find(|a| a.join(".mam").is_dir()) {
        return found.to_path_buf();
    }
    // The git top level is the nearest ancestor with a `.git` entry (a directory, or the file a
    // linked worktree has); no git process is spawned.
    if let Some(found) = cwd.ancestors().find(|a| a.join(".git").exists()) {
        return found.to_path_buf();
    }
    cwd
}

/// Resolves everything. `registry_flag` is `--registry-dir`, relative to cwd (A1 step 4).
pub fn resolve(ctx: &Ctx, registry_flag: Option<&Path>) -> Resolved {
    let root = control_root(ctx);
    let registry = match (registry_flag, ctx.path_var("MAM_JOBS_DIR")) {
        (Some(flag), _) => absolutize(ctx.cwd(), flag),
        (None, Some(env)) => absolutize(&root, &env),
        (None, None) => root.join(".mam").join("jobs"),
    };
    let logs = match ctx.path_var("DELEGATE_JOB_LOGS_DIR") {
        Some(env) => absolutize(&root, &env),
        None => logs_beside(&registry),
    };
    let sessions = match ctx.path_var("AGENT_SESSIONS_YAML") {
        Some(env) => absolutize(&root, &env),
        None => root.join(".mam").join("agent_sessions.json"),
    };
    Resolved { control_root: root, registry, logs, sessions }
}

/// The audit-log root beside a registry: `dirname(registry)/delegate_job_logs`.
pub fn logs_beside(registry: &Path) -> PathBuf {
    registry.parent().unwrap_or(Path::new("/")).join("delegate_job_logs")
}

impl Resolved {
    /// The binding as (variable, path) pairs, in the legacy order.
    pub fn binding(&self) -> [(&'static str, &Path); 4] {
        [
            ("WORKSPACE_ROOT", &self.control_root),
            ("AGENT_SESSIONS_YAML", &self.sessions),
            ("MAM_JOBS_DIR", &self.registry),
            ("DELEGATE_JOB_LOGS_DIR", &self.logs),
        ]
    }

    pub fn record(&self, job_id: &str) -> PathBuf {
        self.registry.join(format!("{job_id}.json"))
    }

    pub fn job_dir(&self, job_id: &str) -> PathBuf {
        self.registry.join(job_id)
    }

    pub fn job_logs(&self, job_id: &str) -> PathBuf {
        self.logs.join(job_id)
    }
}
