//! Path resolution (CORE 2, A1, ORCH 0.2): one resolver for the control root, the job registry, the
//! audit-log root and the sessions file, used by every subcommand.
//!
//! Resolution reads the environment through `Ctx` and the filesystem only to find `.mam/` and
//! `.git`; it never creates anything (creation is lazy, on the first write) and needs no broker.
//!
//! It also owns the control-root trust check of issue 12 (`check`, called by `resolve` and
//! `control_root`): the control root's `.mam/`, the registry, the audit-log root and the sessions
//! file must be the user's (or root's) and not writable by group or others, unless listed in
//! `MAM_TRUSTED_ROOTS`. Every command that reads or writes under a control root gets its paths
//! from here, so none can skip the check.

use std::fmt;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::ctx::Ctx;
use crate::sys::{self, absolutize};
use crate::text::show_path;
use crate::trust::{self, Why};

/// A control-plane path mam refuses to use (issue 12): whose it is or who may write it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Untrusted {
    /// The path judged: the target itself, or the nearest existing directory it would be created in.
    pub path: PathBuf,
    pub why: Why,
}

impl fmt::Display for Untrusted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: refused: {}; trust it with MAM_TRUSTED_ROOTS", show_path(&self.path), self.why)
    }
}

/// The trust check of issue 12 for a control root and the paths under it (registry, audit-log
/// root, sessions file, a daemon's store): `<control_root>/.mam` and each of `paths` must be owned
/// by the user or root and not writable by group or others. A path that does not exist yet is judged
/// by the nearest existing directory above it, where it would be created. A symlink is judged as
/// itself (its owner) and as what it points to. A target at or beneath an entry of
/// `MAM_TRUSTED_ROOTS` (real environment only; `*` trusts all) is not judged.
pub fn check(ctx: &Ctx, control_root: &Path, paths: &[&Path]) -> Result<(), Untrusted> {
    let listed = ctx.env_only("MAM_TRUSTED_ROOTS").map(|l| l.to_string_lossy().into_owned()).unwrap_or_default();
    let me = sys::geteuid();
    let dotmam = control_root.join(".mam");
    for target in std::iter::once(dotmam.as_path()).chain(paths.iter().copied()) {
        if trust::listed(&listed, target) {
            continue;
        }
        judge_path(me, target)?;
    }
    Ok(())
}

fn judge_path(me: u32, target: &Path) -> Result<(), Untrusted> {
    for p in target.ancestors() {
        let lmeta = match std::fs::symlink_metadata(p) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            // Not even searchable (another user's private tree): the operation itself will fail
            // with its own error, so there is nothing to judge here.
            Err(_) => return Ok(()),
        };
        let refuse = |why| Untrusted { path: p.to_path_buf(), why };
        if lmeta.file_type().is_symlink() {
            // A link's own mode means nothing; its owner chose where it points.
            trust::judge(me, lmeta.uid(), 0).map_err(refuse)?;
            return match std::fs::metadata(p) {
                Ok(m) => trust::judge(me, m.uid(), m.mode()).map_err(refuse),
                Err(_) => Ok(()),
            };
        }
        return trust::judge(me, lmeta.uid(), lmeta.mode()).map_err(refuse);
    }
    Ok(())
}

/// The four absolute paths of the control-plane binding, plus the control root they hang from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub control_root: PathBuf,
    pub registry: PathBuf,
    pub logs: PathBuf,
    pub sessions: PathBuf,
}

/// The control root (A1 step 1) after the trust check of its `.mam/` (`check`).
pub fn control_root(ctx: &Ctx) -> Result<PathBuf, Untrusted> {
    let root = find_control_root(ctx);
    check(ctx, &root, &[])?;
    Ok(root)
}

/// The control root (A1 step 1) without the trust check: `WORKSPACE_ROOT` made absolute; else the
/// nearest ancestor of cwd (inclusive) holding `.mam/`; else the git top level of cwd; else cwd.
/// For callers whose control root has already been checked, and for the fake pane backend's
/// default directory (a test double's).
pub fn find_control_root(ctx: &Ctx) -> PathBuf {
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

/// No control root was set up where a command that starts agents or jobs runs (issue 32): no `.mam/`
/// in the cwd or above it and no `WORKSPACE_ROOT`. Such a command would otherwise make the cwd (or its
/// git top level) a control root of its own, with its own `.mam/` and daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoControlRoot {
    pub cwd: PathBuf,
}

impl fmt::Display for NoControlRoot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} is not inside a control root (no .mam/ here or above, no WORKSPACE_ROOT): set one up with \
             `mam install` in your repository (or `mkdir .mam` at its top), or run this from inside one",
            show_path(&self.cwd)
        )
    }
}

/// The check behind `NoControlRoot`: `WORKSPACE_ROOT` is set, or the cwd or an ancestor holds `.mam/`.
pub fn require_control_root(ctx: &Ctx) -> Result<(), NoControlRoot> {
    if ctx.path_var("WORKSPACE_ROOT").is_some() {
        return Ok(());
    }
    let cwd = absolutize(Path::new("/"), ctx.cwd());
    if cwd.ancestors().any(|a| a.join(".mam").is_dir()) {
        return Ok(());
    }
    Err(NoControlRoot { cwd })
}

/// Resolves everything and checks that it may be trusted (`check`). `registry_flag` is
/// `--registry-dir`, relative to cwd (A1 step 4).
pub fn resolve(ctx: &Ctx, registry_flag: Option<&Path>) -> Result<Resolved, Untrusted> {
    let r = resolve_unchecked(ctx, registry_flag);
    check(ctx, &r.control_root, &[&r.registry, &r.logs, &r.sessions])?;
    Ok(r)
}

/// Resolution alone (CORE 2.1), without the trust check: for callers that checked already.
pub fn resolve_unchecked(ctx: &Ctx, registry_flag: Option<&Path>) -> Resolved {
    let root = find_control_root(ctx);
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
