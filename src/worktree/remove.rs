//! `mam worktree remove` (ORCH 5.2, A44): the check, `--stop` of the sessions in the worktree, the
//! second full check, then `git worktree remove` with the method of the latest look; `--dry-run`
//! stops after the first look. The `RESULT= METHOD= FINDINGS=` summary is built on every path.
//!
//! It never prints, never deletes the branch (rows stay `stopped`), and removes nothing when any
//! look found something: work written, committed or stashed during the stop is kept.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::check::{self, Look, Method};
use super::{git, git_ok, repo, CHECK_BUDGET};
use crate::ctx::Ctx;
use crate::paths;
use crate::session::stop::{stop, StopArgs};
use crate::session::Notes;
use crate::sys;
use crate::text::show_path;

/// Validated arguments of `mam worktree remove`.
#[derive(Debug, Clone, Default)]
pub struct RemoveArgs {
    pub path: PathBuf,
    pub stop: bool,
    pub dry_run: bool,
    /// The user lets the worktree's ignored files go with it (issue 29).
    pub discard_ignored: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Removed,
    Refused,
    WouldRemove,
    Failed,
}

impl Outcome {
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Removed => "removed",
            Outcome::Refused => "refused",
            Outcome::WouldRemove => "would-remove",
            Outcome::Failed => "failed",
        }
    }

    /// ORCH 5.2: 0 removed or would remove, 3 refused, 1 failed.
    pub fn rc(self) -> i32 {
        match self {
            Outcome::Removed | Outcome::WouldRemove => 0,
            Outcome::Refused => 3,
            Outcome::Failed => 1,
        }
    }
}

/// What `remove` did, for the command layer to print.
#[derive(Debug, Clone)]
pub struct Removal {
    /// Stdout lines before the summary: the stop's lines, findings, what a dry run would do.
    pub lines: Vec<String>,
    pub outcome: Outcome,
    pub method: Method,
    /// The tokens of the latest look (`none`).
    pub findings: String,
    /// The stderr line's text after `REFUSED: worktree remove: ` or `ERROR: worktree remove: `.
    pub reason: Option<String>,
    /// The prune hint (`NOTE:` line text), when the directory is gone.
    pub prune: Option<String>,
}

impl Removal {
    fn new() -> Removal {
        Removal {
            lines: Vec::new(),
            outcome: Outcome::Failed,
            method: Method::None,
            findings: "none".into(),
            reason: None,
            prune: None,
        }
    }

    /// The last stdout line, on every path.
    pub fn summary(&self) -> String {
        summary(self.outcome, self.method, &self.findings)
    }
}

pub fn summary(outcome: Outcome, method: Method, findings: &str) -> String {
    format!("RESULT={} METHOD={} FINDINGS={findings}", outcome.name(), method.name())
}

/// The whole of 5.2.
pub fn remove(ctx: &Ctx, a: &RemoveArgs, notes: &mut Notes) -> Removal {
    let mut r = Removal::new();
    let path = sys::normalize(&sys::absolutize(ctx.cwd(), &a.path));
    let resolved = match paths::resolve(ctx, None) {
        Ok(x) => x,
        Err(e) => {
            r.reason = Some(format!("{e}; the worktree was kept"));
            return r;
        }
    };
    let repo = repo(ctx, &resolved.control_root);
    let first = check::look(ctx, &repo, &resolved, &path, a.stop, a.discard_ignored);
    take(&mut r, &first);
    if !first.findings.is_empty() {
        refuse(&mut r, &first, "nothing was changed");
        return r;
    }
    let running = first.running();
    let flag = if r.method == Method::Force { " --force" } else { "" };
    if a.dry_run {
        for s in &running {
            let tasks: Vec<&str> = first
                .facts
                .jobs
                .iter()
                .filter(|j| j.session == *s && j.kind == "task")
                .map(|j| j.id.as_str())
                .collect();
            let tasks = if tasks.is_empty() { "-".to_string() } else { tasks.join(",") };
            r.lines.push(format!("WOULD-STOP={s} CANCEL={tasks}"));
        }
        r.lines.push(format!("WOULD-RUN=git worktree remove{flag} {}", path.to_string_lossy()));
        r.outcome = Outcome::WouldRemove;
        return r;
    }
    let stopped = !running.is_empty();
    if stopped {
        match stop(ctx, &StopArgs { names: running, ..StopArgs::default() }, notes) {
            Ok(done) => r.lines.extend(done.iter().map(|s| s.line())),
            Err(e) => {
                r.reason = Some(format!("stopping the sessions failed ({e}); the worktree was kept"));
                return r;
            }
        }
    }
    // The second full look (A44): nothing written, committed or stashed during the stop is lost.
    let second = check::look(ctx, &repo, &resolved, &path, false, a.discard_ignored);
    take(&mut r, &second);
    if !second.findings.is_empty() {
        let how = if stopped { "sessions were stopped; the worktree was kept" } else { "nothing was changed" };
        refuse(&mut r, &second, how);
        return r;
    }
    let Ok(repo) = repo else {
        r.reason = Some("the control root is no git repository; the worktree was kept".into());
        return r;
    };
    let target = second.facts.entry.as_ref().map(|e| e.path.clone()).unwrap_or(path.clone());
    match remove_tree(ctx, &repo.root, &target, r.method) {
        Ok(()) => r.outcome = Outcome::Removed,
        Err(e) => r.reason = Some(format!("git worktree remove{flag} failed: {e}")),
    }
    r
}

/// Copies the look's method and tokens into the result, and the prune hint when the directory is
/// gone.
fn take(r: &mut Removal, l: &Look) {
    r.method = l.method;
    r.findings = l.tokens();
    r.prune = l.facts.gone.then(|| prune_hint(&l.facts.path));
}

fn refuse(r: &mut Removal, l: &Look, how: &str) {
    r.lines.extend(l.findings.iter().map(|f| f.line()));
    r.outcome = Outcome::Refused;
    r.reason = Some(format!("{}; {how}", l.tokens()));
}

/// The NOTE of check 4 when the worktree's directory is gone.
pub fn prune_hint(path: &Path) -> String {
    format!(
        "worktree remove: {} is gone; `git worktree prune` in the control root drops its registration (the branch stays)",
        show_path(path)
    )
}

fn remove_tree(ctx: &Ctx, root: &Path, path: &Path, method: Method) -> Result<(), String> {
    let mut args: Vec<&OsStr> = vec!["worktree".as_ref(), "remove".as_ref()];
    if method == Method::Force {
        args.push("--force".as_ref());
    }
    args.push("--".as_ref());
    args.push(path.as_os_str());
    git_ok(&mut git(ctx, root, Instant::now() + CHECK_BUDGET), &args).map(|_| ())
}
