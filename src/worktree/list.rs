//! `mam worktree list`: the control root's linked worktrees, each with its branch, HEAD, whether its
//! tree is clean, the sessions running in it, their unfinished jobs, and what a plain `remove`
//! (without `--stop`) would say: the same check, once per worktree. Never changes anything.

use std::time::Instant;

use super::check::{self, Look};
use super::{repo, worktrees, WorktreeError, CHECK_BUDGET};
use crate::ctx::Ctx;
use crate::paths;

/// One line per linked worktree, the path last (it may hold spaces):
/// `BRANCH=<b> HEAD=<id> TREE=clean|dirty|missing|unknown SESSIONS=<names|-> JOBS=<ids|->
/// METHOD=<m> FINDINGS=<tokens|none> PATH=<path>`.
pub fn list(ctx: &Ctx) -> Result<Vec<String>, WorktreeError> {
    let resolved = paths::resolve(ctx, None).map_err(|e| WorktreeError::Failed(e.to_string()))?;
    let repo = repo(ctx, &resolved.control_root).map_err(WorktreeError::Usage)?;
    let entries = worktrees(ctx, &repo.root, Instant::now() + CHECK_BUDGET).map_err(WorktreeError::Failed)?;
    let repo = Ok(repo);
    Ok(entries
        .iter()
        .filter(|e| !e.main && !e.bare)
        .map(|e| line(e, &check::look(ctx, &repo, &resolved, &e.path, false, false)))
        .collect())
}

fn line(e: &super::Entry, l: &Look) -> String {
    let tree = match &l.facts.status {
        _ if l.facts.gone => "missing",
        Some(Ok(s)) if s.is_empty() => "clean",
        Some(Ok(_)) => "dirty",
        _ => "unknown",
    };
    let or_dash = |v: Vec<String>| if v.is_empty() { "-".to_string() } else { v.join(",") };
    let sessions = or_dash(l.running());
    let jobs = or_dash(l.facts.jobs.iter().map(|j| j.id.clone()).collect());
    format!(
        "BRANCH={} HEAD={} TREE={tree} SESSIONS={sessions} JOBS={jobs} METHOD={} FINDINGS={} PATH={}",
        e.branch_name(),
        e.head.as_deref().unwrap_or("-"),
        l.method.name(),
        l.tokens(),
        super::shown(&e.path)
    )
}
