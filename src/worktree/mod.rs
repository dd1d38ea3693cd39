//! Worktrees (ORCH 5): a creator's own linked git worktree beside the control root, prepared
//! (`prepare`), looked at (`check`, `list`) and removed only when nothing in it could be lost
//! (`remove`). This file holds what the flows share: the error type, the git runner (`crate::git::Git`:
//! cleared environment, pinned configuration, no hook or filter, a deadline), the parsed
//! `git worktree list`, and path comparison for paths that may not exist yet.
//!
//! Library code: it never prints (stdout lines and notes are returned to `cmd::worktree`) and never
//! reads the process environment. It never deletes a branch, and it removes a directory only in
//! two places: `git worktree remove` after the checks passed twice, and the rollback of a failed
//! `--submodules` attempt, limited to what that attempt created.

pub mod check;
pub mod list;
pub mod prepare;
pub mod remove;

use std::ffi::OsStr;
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::ctx::Ctx;
use crate::git::{failure_detail, Git, RunError};
use crate::text::{one_line, show_path};

/// How long the git runs of one check (one look at one worktree) may take together.
pub const CHECK_BUDGET: Duration = Duration::from_secs(120);

/// How long the git runs of one `prepare` may take together (submodule clones included).
pub const PREPARE_BUDGET: Duration = Duration::from_secs(600);

/// Why a worktree command stopped. `cmd::worktree` renders each with its exit code (ORCH 5.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorktreeError {
    /// rc 2: bad input (a branch git refuses, a path inside the control root, a control root that
    /// is not a git repository); nothing was changed.
    Usage(String),
    /// rc 3: refused, nothing was changed (the path or branch is taken, files below an
    /// uninitialised submodule).
    Refused(String),
    /// rc 1: git failed (a rollback, if any, already ran and the text says what is left), or the
    /// session create failed.
    Failed(String),
}

impl fmt::Display for WorktreeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorktreeError::Usage(m) | WorktreeError::Refused(m) | WorktreeError::Failed(m) => f.write_str(m),
        }
    }
}

/// A git run in `dir` under `deadline` (hooks and filters off, as every run of `crate::git`).
pub(crate) fn git<'a>(ctx: &'a Ctx, dir: &Path, deadline: Instant) -> Git<'a> {
    Git::new(ctx, dir.to_path_buf(), deadline)
}

/// `git <args>` must succeed; the error names the command, the directory and git's last line.
pub(crate) fn git_ok<S: AsRef<OsStr>>(g: &mut Git<'_>, args: &[S]) -> Result<Vec<u8>, String> {
    let dir = g.dir.clone();
    g.run_ok(args).map_err(|e| run_error(&dir, e))
}

pub(crate) fn run_error(dir: &Path, e: RunError) -> String {
    format!("{} in {}: {}", e.what, show_path(dir), one_line(&e.detail))
}

/// The exit status and git's last stderr line of a finished run, for messages.
pub(crate) fn detail(out: &std::process::Output) -> String {
    failure_detail(out)
}

/// git's answer without its final newline.
pub(crate) fn trim_nl(out: &[u8]) -> &[u8] {
    out.strip_suffix(b"\n").unwrap_or(out)
}

/// `p` as a real path: the longest existing ancestor resolved, the rest appended (so a path that
/// does not exist yet, or no longer exists, compares like one that does).
pub fn canon(p: &Path) -> PathBuf {
    let p = crate::sys::normalize(p);
    let mut rest = Vec::new();
    let mut cur = p.as_path();
    loop {
        if let Ok(real) = cur.canonicalize() {
            let mut out = real;
            for c in rest.iter().rev() {
                out.push(c);
            }
            return out;
        }
        match (cur.parent(), cur.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                cur = parent;
            }
            _ => return p,
        }
    }
}

/// `inner` is `outer` or lies below it (both already real paths).
pub fn is_within(inner: &Path, outer: &Path) -> bool {
    inner.starts_with(outer)
}

/// One entry of `git worktree list --porcelain -z`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Entry {
    /// The path git records (absolute), and its real form for comparisons.
    pub path: PathBuf,
    pub real: PathBuf,
    pub head: Option<String>,
    /// `refs/heads/<name>`, or `None` when detached (or bare).
    pub branch: Option<String>,
    pub bare: bool,
    /// `Some(reason)` (possibly empty) when locked.
    pub locked: Option<String>,
    pub prunable: Option<String>,
    /// The first entry is the main worktree.
    pub main: bool,
}

impl Entry {
    /// The short branch name, or `(detached)`.
    pub fn branch_name(&self) -> String {
        match &self.branch {
            Some(b) => b.strip_prefix("refs/heads/").unwrap_or(b).to_string(),
            None => "(detached)".to_string(),
        }
    }
}

/// Parses `git worktree list --porcelain -z` (attributes NUL-terminated, entries separated by an
/// empty attribute).
pub fn parse_list(out: &[u8]) -> Vec<Entry> {
    let mut entries = Vec::new();
    let mut cur: Option<Entry> = None;
    for attr in out.split(|b| *b == 0) {
        if attr.is_empty() {
            if let Some(e) = cur.take() {
                entries.push(e);
            }
            continue;
        }
        let (key, value) = match attr.iter().position(|b| *b == b' ') {
            Some(i) => (&attr[..i], &attr[i + 1..]),
            None => (attr, &b""[..]),
        };
        let text = || String::from_utf8_lossy(value).into_owned();
        if key == b"worktree" {
            if let Some(e) = cur.take() {
                entries.push(e);
            }
            let path = PathBuf::from(OsStr::from_bytes(value));
            cur = Some(Entry { real: canon(&path), path, main: entries.is_empty(), ..Entry::default() });
            continue;
        }
        let Some(e) = cur.as_mut() else { continue };
        match key {
            b"HEAD" => e.head = Some(text()),
            b"branch" => e.branch = Some(text()),
            b"bare" => e.bare = true,
            b"locked" => e.locked = Some(text()),
            b"prunable" => e.prunable = Some(text()),
            _ => {}
        }
    }
    if let Some(e) = cur.take() {
        entries.push(e);
    }
    entries
}

/// The worktrees of the repository whose work tree `root` is.
pub fn worktrees(ctx: &Ctx, root: &Path, deadline: Instant) -> Result<Vec<Entry>, String> {
    let out = git_ok(&mut git(ctx, root, deadline), &["worktree", "list", "--porcelain", "-z"])?;
    Ok(parse_list(&out))
}

/// The repository facts every flow starts from: the control root must be the top level of a git
/// work tree; its common dir is where the shared config, `info/exclude` and `worktrees/` live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repo {
    /// The control root (real path).
    pub root: PathBuf,
    /// `git rev-parse --git-common-dir` (real path).
    pub common: PathBuf,
}

/// The control root as a git repository, or why it is none (rc 2 for the caller).
pub fn repo(ctx: &Ctx, control_root: &Path) -> Result<Repo, String> {
    let not = |why: String| format!("control root {} is not a git repository ({why})", show_path(control_root));
    let top = crate::review::git::toplevel(ctx, control_root).map_err(|e| not(e.to_string()))?;
    let real = control_root.canonicalize().map_err(|e| not(e.to_string()))?;
    if top != real {
        return Err(format!(
            "control root {} is not the top level of its git repository ({})",
            show_path(control_root),
            show_path(&top)
        ));
    }
    let common = crate::review::git::common_dir(ctx, &real).map_err(|e| not(e.to_string()))?;
    Ok(Repo { root: real, common })
}

/// The administrative directory (`<common>/worktrees/<id>`) of the linked worktree at `real`,
/// found through each one's `gitdir` file, so it is found also when the directory is gone.
pub fn admin_dir(common: &Path, real: &Path) -> Option<PathBuf> {
    let rd = std::fs::read_dir(common.join("worktrees")).ok()?;
    for e in rd.flatten() {
        let Ok(bytes) = std::fs::read(e.path().join("gitdir")) else { continue };
        let dotgit = PathBuf::from(OsStr::from_bytes(trim_nl(&bytes)));
        if dotgit.parent().is_some_and(|p| canon(p) == *real) {
            return Some(e.path());
        }
    }
    None
}

/// A path shown in a stdout line: control characters escaped so the line stays one line.
pub fn shown(p: &Path) -> String {
    show_path(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_list_reads_every_attribute() {
        let out = b"worktree /r\0HEAD aaaa\0branch refs/heads/main\0\0worktree /w x\0HEAD bbbb\0detached\0locked why\0\0worktree /gone\0HEAD cccc\0branch refs/heads/g\0prunable gitdir file points to non-existent location\0\0";
        let l = parse_list(out);
        assert_eq!(l.len(), 3);
        assert!(l[0].main && !l[1].main && !l[2].main);
        assert_eq!(l[0].branch_name(), "main");
        assert_eq!(l[1].path, PathBuf::from("/w x"));
        assert_eq!(l[1].branch_name(), "(detached)");
        assert_eq!(l[1].locked.as_deref(), Some("why"));
        assert_eq!(l[2].head.as_deref(), Some("cccc"));
        assert!(l[2].prunable.is_some());
    }

    #[test]
    fn canon_keeps_the_missing_tail() {
        let tmp = std::env::temp_dir().canonicalize().unwrap();
        let p = tmp.join("mam-no-such-dir-x").join("y");
        assert_eq!(canon(&p), p);
        assert!(is_within(&tmp.join("a/b"), &tmp));
        assert!(!is_within(&PathBuf::from("/ab"), &PathBuf::from("/a")));
    }
}
