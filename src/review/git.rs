//! The review loop's git layer (ORCH 4.2, 4.6, A33, A39): the facts validation and the context
//! block ask for (top level, common dir, commits, ancestry, merge base, branch, commit count,
//! uncommitted changes); the snapshot pin and the fingerprint, computed in a temporary index; the
//! fail-closed empty-change guard; and the review trees (`git worktree add --detach`, removal).
//!
//! Every run goes through `crate::git::Git`: a cleared environment, no user or system
//! configuration, a deadline, no hook, filter, external diff or textconv. It never writes the repository's own index, never moves a
//! ref or HEAD (the snapshot commit is ref-less), never follows a symlink while walking or removing
//! a tree, and never prints. Control-plane paths (`Repo::exclude`) are left out of every check.

use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::ctx::Ctx;
use crate::diffcollect::{exclude_specs, TempDir, TempError};
use crate::git::{failure_detail, Git, RunError};
use crate::sys;
use crate::text::{one_line, show_path};

/// How long one operation (a pin, a guard, a tree) may take, all its git runs together.
pub const BUDGET: Duration = Duration::from_secs(120);

/// The most directory entries the nested-repository walk looks at before it gives up (fails closed).
pub const WALK_LIMIT: usize = 2_000_000;

/// The snapshot commit's author and committer (ORCH 4.6, decided address).
pub const SNAPSHOT_NAME: &str = "mam-loop";
pub const SNAPSHOT_EMAIL: &str = "mam-loop@localhost";

/// A git fact could not be had. The display is one line naming the value and git's last stderr line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GitError {
    /// A directory that is missing or whose real path cannot be taken.
    Path { path: PathBuf, detail: String },
    /// `value` does not name a commit, or looks like an option.
    BadRev { value: String, detail: String },
    /// git could not be run, timed out, failed or answered nonsense (`what` is the git command).
    Git { what: String, dir: PathBuf, detail: String },
    /// A review tree is still there after every removal attempt.
    Remove { path: PathBuf, detail: String },
}

impl fmt::Display for GitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GitError::Path { path, detail } => write!(f, "{}: {}", show_path(path), one_line(detail)),
            GitError::BadRev { value, detail } if detail.is_empty() => {
                write!(f, "'{}': not a commit", one_line(value))
            }
            GitError::BadRev { value, detail } => {
                write!(f, "'{}': not a commit ({})", one_line(value), one_line(detail))
            }
            GitError::Git { what, dir, detail } => write!(f, "{what} in {}: {}", show_path(dir), one_line(detail)),
            GitError::Remove { path, detail } => {
                write!(f, "review tree {}: not removed ({})", show_path(path), one_line(detail))
            }
        }
    }
}

/// Why no snapshot or fingerprint could be taken (ORCH 4.6 refusals, A39).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PinError {
    /// A `.git` entry under the root that is neither the root's own nor a registered submodule's.
    NestedRepo(PathBuf),
    /// A checked-out submodule with modified or untracked content.
    DirtySubmodule(PathBuf),
    Git(GitError),
    /// The private directory of the temporary index.
    Temp {
        path: PathBuf,
        detail: String,
    },
    /// The nested-repository walk could not read a directory or met too many entries.
    Walk {
        path: PathBuf,
        detail: String,
    },
}

impl fmt::Display for PinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PinError::NestedRepo(p) => write!(f, "untracked nested repository {}", show_path(p)),
            PinError::DirtySubmodule(p) => {
                write!(f, "submodule {} has modified or untracked content", show_path(p))
            }
            PinError::Git(e) => write!(f, "{e}"),
            PinError::Temp { path, detail } => write!(f, "temporary index {}: {}", show_path(path), one_line(detail)),
            PinError::Walk { path, detail } => {
                write!(f, "looking for nested repositories in {}: {}", show_path(path), one_line(detail))
            }
        }
    }
}

impl From<GitError> for PinError {
    fn from(e: GitError) -> PinError {
        PinError::Git(e)
    }
}

impl From<TempError> for PinError {
    fn from(e: TempError) -> PinError {
        PinError::Temp { path: e.path, detail: e.detail }
    }
}

/// A worktree of the source and the control-plane paths to leave out of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repo {
    /// A worktree's top level (absolute).
    pub root: PathBuf,
    /// Absolute control-plane paths (the control root's `.mam`, the registry, the audit-log root,
    /// the review trees): left out wherever they sit under `root`; others are ignored.
    pub exclude: Vec<PathBuf>,
}

/// What the re-measure compares (ORCH 4.6 staleness): HEAD and the working state's tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint {
    pub head: String,
    pub tree: String,
}

/// A pinned working state: `commit` is HEAD itself when the tree equals HEAD's, else a ref-less
/// commit on HEAD authored by `mam-loop`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub head: String,
    pub tree: String,
    pub commit: String,
}

/// The empty-change guard's answer, from `git diff --quiet`'s exit status alone (ORCH 4.5 b).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Guard {
    /// Exit 1: the change set is not empty.
    Changes,
    /// Exit 0: nothing changed between base and snapshot.
    Empty,
    /// Any other exit, or git could not be run: the reason.
    Undeterminable(String),
}

/// A runner in `dir` with its own deadline. Submodule recursion is off (a review tree's checkout
/// must not reach into submodules); hooks and filters are off in every run of `crate::git`.
fn git<'a>(ctx: &'a Ctx, dir: &Path) -> Git<'a> {
    let mut g = Git::new(ctx, dir.to_path_buf(), Instant::now() + BUDGET);
    g.extra_args = vec!["-c", "submodule.recurse=false"];
    g
}

fn failed(dir: &Path) -> impl Fn(RunError) -> GitError + '_ {
    move |e| GitError::Git { what: e.what, dir: dir.to_path_buf(), detail: e.detail }
}

/// git's answer without its final newline.
fn line(out: &[u8]) -> &[u8] {
    out.strip_suffix(b"\n").unwrap_or(out)
}

fn is_object_id(s: &str) -> bool {
    (s.len() == 40 || s.len() == 64) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A revision argument git could read as an option (or as nothing).
fn check_rev(value: &str) -> Result<(), GitError> {
    if value.is_empty() || value.starts_with('-') || value.contains('\0') {
        return Err(GitError::BadRev { value: value.to_string(), detail: "not a revision".into() });
    }
    Ok(())
}

/// `dir` made absolute against the ctx's cwd and resolved to its real path; it must be a directory.
fn real_dir(ctx: &Ctx, dir: &Path) -> Result<PathBuf, GitError> {
    let abs = sys::absolutize(ctx.cwd(), dir);
    let err = |detail: String| GitError::Path { path: abs.clone(), detail };
    if !abs.is_dir() {
        return Err(err("not a directory".into()));
    }
    abs.canonicalize().map_err(|e| err(e.to_string()))
}

fn canonical(p: &Path) -> Result<PathBuf, GitError> {
    p.canonicalize().map_err(|e| GitError::Path { path: p.to_path_buf(), detail: e.to_string() })
}

/// `git rev-parse --show-toplevel` of `dir`, as a real path.
pub fn toplevel(ctx: &Ctx, dir: &Path) -> Result<PathBuf, GitError> {
    let dir = real_dir(ctx, dir)?;
    let out = git(ctx, &dir).run_ok(&["rev-parse", "--show-toplevel"]).map_err(failed(&dir))?;
    let top = line(&out);
    if top.is_empty() {
        let detail = "no working tree (a bare repository, or inside .git)".into();
        return Err(GitError::Git { what: "git rev-parse".into(), dir, detail });
    }
    canonical(Path::new(OsStr::from_bytes(top)))
}

/// `git rev-parse --git-common-dir` of `dir` (a relative answer is relative to `dir`), as a real
/// path: the main repository's `.git` for every linked worktree of it.
pub fn common_dir(ctx: &Ctx, dir: &Path) -> Result<PathBuf, GitError> {
    let dir = real_dir(ctx, dir)?;
    let out = git(ctx, &dir).run_ok(&["rev-parse", "--git-common-dir"]).map_err(failed(&dir))?;
    let answer = line(&out);
    if answer.is_empty() {
        return Err(GitError::Git { what: "git rev-parse".into(), dir, detail: "no common dir".into() });
    }
    canonical(&dir.join(OsStr::from_bytes(answer)))
}

/// The full id of the commit `rev` names (a branch, tag, short id ...); a non-commit object or an
/// option-like value is `BadRev`.
pub fn resolve_commit(ctx: &Ctx, root: &Path, rev: &str) -> Result<String, GitError> {
    check_rev(rev)?;
    let spec = format!("{rev}^{{commit}}");
    let out =
        git(ctx, root).run(&["rev-parse", "--verify", "--quiet", "--end-of-options", &spec]).map_err(failed(root))?;
    let id = String::from_utf8_lossy(line(&out.stdout)).into_owned();
    if !out.status.success() || !is_object_id(&id) {
        let err = String::from_utf8_lossy(&out.stderr);
        let detail = err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").to_string();
        return Err(GitError::BadRev { value: rev.to_string(), detail });
    }
    Ok(id)
}

/// `git merge-base --is-ancestor`: exit 0 true, 1 false, anything else an error.
pub fn is_ancestor(ctx: &Ctx, root: &Path, ancestor: &str, of: &str) -> Result<bool, GitError> {
    check_rev(ancestor)?;
    check_rev(of)?;
    let out =
        git(ctx, root).run(&["merge-base", "--is-ancestor", "--end-of-options", ancestor, of]).map_err(failed(root))?;
    match out.status.code() {
        Some(0) => Ok(true),
        Some(1) => Ok(false),
        _ => Err(GitError::Git { what: "git merge-base".into(), dir: root.into(), detail: failure_detail(&out) }),
    }
}

/// The best common ancestor of `a` and `b`; none is an error.
pub fn merge_base(ctx: &Ctx, root: &Path, a: &str, b: &str) -> Result<String, GitError> {
    check_rev(a)?;
    check_rev(b)?;
    let out = git(ctx, root).run(&["merge-base", "--end-of-options", a, b]).map_err(failed(root))?;
    let id = String::from_utf8_lossy(line(&out.stdout)).into_owned();
    if out.status.success() && is_object_id(&id) {
        return Ok(id);
    }
    let detail = if out.status.code() == Some(1) && out.stderr.is_empty() {
        format!("'{a}' and '{b}' have no common ancestor")
    } else {
        failure_detail(&out)
    };
    Err(GitError::Git { what: "git merge-base".into(), dir: root.into(), detail })
}

/// The full id of HEAD's commit.
pub fn head(ctx: &Ctx, root: &Path) -> Result<String, GitError> {
    resolve_commit(ctx, root, "HEAD")
}

/// The short name of the checked-out branch; `None` when HEAD is detached.
pub fn branch(ctx: &Ctx, root: &Path) -> Result<Option<String>, GitError> {
    let out = git(ctx, root).run(&["symbolic-ref", "--quiet", "--short", "HEAD"]).map_err(failed(root))?;
    match out.status.code() {
        Some(0) => Ok(Some(String::from_utf8_lossy(line(&out.stdout)).into_owned())),
        Some(1) => Ok(None),
        _ => Err(GitError::Git { what: "git symbolic-ref".into(), dir: root.into(), detail: failure_detail(&out) }),
    }
}

/// `git rev-list --count base..head`.
pub fn count_commits(ctx: &Ctx, root: &Path, base: &str, head: &str) -> Result<u64, GitError> {
    check_rev(base)?;
    check_rev(head)?;
    let range = format!("{base}..{head}");
    let out = git(ctx, root).run_ok(&["rev-list", "--count", "--end-of-options", &range]).map_err(failed(root))?;
    let text = String::from_utf8_lossy(line(&out)).into_owned();
    text.parse().map_err(|_| GitError::Git {
        what: "git rev-list".into(),
        dir: root.into(),
        detail: format!("not a count: '{text}'"),
    })
}

/// `args -- . <excludes>`.
fn with_paths(args: &[&str], excludes: &[OsString]) -> Vec<OsString> {
    let mut v: Vec<OsString> = args.iter().map(OsString::from).collect();
    v.push("--".into());
    v.push(".".into());
    v.extend(excludes.iter().cloned());
    v
}

/// `git status` of everything under the pathspecs, untracked files included, ignored ones and the
/// repository's submodule `ignore` settings not: empty means clean. With `GIT_OPTIONAL_LOCKS=0`
/// (the runner's) status does not refresh the index it reads.
fn status_porcelain(g: &mut Git<'_>, excludes: &[OsString]) -> Result<Vec<u8>, GitError> {
    let args = with_paths(
        &["status", "--porcelain=v1", "-z", "--untracked-files=normal", "--ignore-submodules=none"],
        excludes,
    );
    let dir = g.dir.clone();
    g.run_ok(&args).map_err(failed(&dir))
}

impl Repo {
    fn real_root(&self) -> Result<PathBuf, GitError> {
        canonical(&self.root)
    }

    /// Any change against HEAD (staged, unstaged, untracked and not ignored, submodule changes),
    /// outside the excluded paths.
    pub fn has_uncommitted(&self, ctx: &Ctx) -> Result<bool, GitError> {
        let root = self.real_root()?;
        let excludes = exclude_specs(&root, &self.exclude);
        Ok(!status_porcelain(&mut git(ctx, &root), &excludes)?.is_empty())
    }

    /// ORCH 4.6 Pin: the working state as a tree of a temporary index, and a ref-less commit of it on
    /// HEAD unless it is HEAD's own tree. Refuses nested repositories and dirty submodules first.
    pub fn pin(&self, ctx: &Ctx, loop_id: &str) -> Result<Snapshot, PinError> {
        let (root, m) = self.measure(ctx)?;
        if m.tree == m.head_tree {
            return Ok(Snapshot { commit: m.head.clone(), head: m.head, tree: m.tree });
        }
        let mut g = git(ctx, &root);
        g.extra_env = ["GIT_AUTHOR_NAME", "GIT_COMMITTER_NAME"]
            .into_iter()
            .map(|k| (k, SNAPSHOT_NAME.to_string()))
            .chain(["GIT_AUTHOR_EMAIL", "GIT_COMMITTER_EMAIL"].into_iter().map(|k| (k, SNAPSHOT_EMAIL.to_string())))
            .collect();
        let msg = format!("mam loop {loop_id} snapshot");
        let out =
            g.run_ok(&["commit-tree", "--no-gpg-sign", &m.tree, "-p", &m.head, "-m", &msg]).map_err(failed(&root))?;
        let commit = String::from_utf8_lossy(line(&out)).into_owned();
        if !is_object_id(&commit) {
            let detail = format!("not an object id: '{commit}'");
            return Err(GitError::Git { what: "git commit-tree".into(), dir: root, detail }.into());
        }
        Ok(Snapshot { head: m.head, tree: m.tree, commit })
    }

    /// ORCH 4.6 staleness: HEAD and the tree `pin` would write (same refusals), without a commit.
    pub fn fingerprint(&self, ctx: &Ctx) -> Result<Fingerprint, PinError> {
        let (_, m) = self.measure(ctx)?;
        Ok(Fingerprint { head: m.head, tree: m.tree })
    }

    /// ORCH 4.5 b, the fail-closed guard: `git diff --quiet <base> <commit>` outside the excluded
    /// paths, judged from the exit status alone.
    pub fn guard(&self, ctx: &Ctx, base: &str, commit: &str) -> Guard {
        if let Err(e) = check_rev(base).and_then(|_| check_rev(commit)) {
            return Guard::Undeterminable(e.to_string());
        }
        let root = match self.real_root() {
            Ok(r) => r,
            Err(e) => return Guard::Undeterminable(e.to_string()),
        };
        let excludes = exclude_specs(&root, &self.exclude);
        let diff =
            ["diff", "--quiet", "--no-ext-diff", "--no-textconv", "--ignore-submodules=none", "--end-of-options"];
        let args = with_paths(&[&diff[..], &[base, commit]].concat(), &excludes);
        match git(ctx, &root).run(&args) {
            Ok(out) => match out.status.code() {
                Some(1) => Guard::Changes,
                Some(0) => Guard::Empty,
                _ => Guard::Undeterminable(format!("git diff --quiet: {}", one_line(&failure_detail(&out)))),
            },
            Err(e) => Guard::Undeterminable(format!("{}: {}", e.what, one_line(&e.detail))),
        }
    }

    /// The refusals, then HEAD, HEAD's tree and the working state's tree from a temporary index:
    /// HEAD's tree read into it, `git add -A` of everything outside the excluded paths, written.
    fn measure(&self, ctx: &Ctx) -> Result<(PathBuf, Measure), PinError> {
        let root = self.real_root()?;
        let mut g = git(ctx, &root);
        let head = resolve_commit(ctx, &root, "HEAD")?;
        let tree_spec = format!("{head}^{{tree}}");
        let out = g.run_ok(&["rev-parse", "--verify", "--end-of-options", &tree_spec]).map_err(failed(&root))?;
        let head_tree = String::from_utf8_lossy(line(&out)).into_owned();
        let links = gitlinks(&mut g, &head)?;
        let skip = excluded_beneath(&root, &self.exclude);
        if let Some(nested) = find_nested(&root, &skip, &links, g.deadline)? {
            return Err(PinError::NestedRepo(nested));
        }
        for link in &links {
            let sub = root.join(link);
            // Only a checkout can hold content; a registered but uninitialised path is empty.
            let checked_out = std::fs::symlink_metadata(&sub).is_ok_and(|m| m.is_dir())
                && std::fs::symlink_metadata(sub.join(".git")).is_ok();
            if !checked_out {
                continue;
            }
            let sub_real = canonical(&sub)?;
            let excludes = exclude_specs(&sub_real, &self.exclude);
            if !status_porcelain(&mut git(ctx, &sub_real), &excludes)?.is_empty() {
                return Err(PinError::DirtySubmodule(sub));
            }
        }
        let excludes = exclude_specs(&root, &self.exclude);
        let tmp = TempDir::create(ctx, "mam-pin")?;
        g.index = Some(tmp.path.join("index"));
        let tree = temp_tree(&mut g, &head, &excludes);
        g.index = None;
        drop(tmp);
        let tree = tree.map_err(failed(&root))?;
        if !is_object_id(&tree) {
            let detail = format!("not an object id: '{tree}'");
            return Err(GitError::Git { what: "git write-tree".into(), dir: root, detail }.into());
        }
        Ok((root, Measure { head, head_tree, tree }))
    }
}

struct Measure {
    head: String,
    head_tree: String,
    tree: String,
}

/// In the temporary index: `read-tree <head>`, `add -A` outside the excludes, `write-tree`.
fn temp_tree(g: &mut Git<'_>, head: &str, excludes: &[OsString]) -> Result<String, RunError> {
    g.run_ok(&["read-tree", head])?;
    // An exclusion naming an ignored path makes `git add` fail ("paths are ignored"); such a path is
    // left out by `add -A` anyway, so only the exclusions of paths git would add are passed.
    let ignored = ignored_excludes(g, excludes);
    let keep: Vec<OsString> = excludes.iter().zip(ignored).filter(|(_, ign)| !ign).map(|(s, _)| s.clone()).collect();
    g.run_ok(&with_paths(&["add", "-A"], &keep))?;
    let out = g.run_ok(&["write-tree"])?;
    Ok(String::from_utf8_lossy(line(&out)).into_owned())
}

/// For each exclusion spec, whether git ignores its path (`git check-ignore`; a failed check
/// counts as not ignored). One run asks for all of them: git prints the ignored ones as given, one
/// a line, exit 0 (some) or 1 (none). A name git would quote (a control character, `"`, `\`) or
/// that is not UTF-8, or a run failing as a whole (exit 128: a path beyond a symlink), falls back
/// to one run per path.
fn ignored_excludes(g: &mut Git<'_>, excludes: &[OsString]) -> Vec<bool> {
    let rel = |spec: &OsString| {
        let s = spec.to_string_lossy();
        s.strip_prefix(":(exclude,literal)").unwrap_or(&s).to_string()
    };
    let plain =
        |s: &OsStr| s.to_str().is_some_and(|s| !s.bytes().any(|b| b < 0x20 || b == 0x7f || b == b'"' || b == b'\\'));
    let rels: Vec<String> = excludes.iter().map(rel).collect();
    if rels.is_empty() {
        return Vec::new();
    }
    if excludes.iter().all(|s| plain(s)) {
        let args: Vec<&str> = ["check-ignore", "--"].into_iter().chain(rels.iter().map(String::as_str)).collect();
        if let Ok(out) = g.run(&args) {
            let listed: Option<BTreeSet<&[u8]>> = match out.status.code() {
                Some(0) => Some(crate::sort::ordered(out.stdout.split(|b| *b == b'\n').filter(|l| !l.is_empty()))),
                Some(1) => Some(BTreeSet::new()),
                _ => None,
            };
            if let Some(listed) = listed {
                return rels.iter().map(|r| listed.contains(r.as_bytes())).collect();
            }
        }
    }
    rels.iter().map(|r| g.run(&["check-ignore", "-q", "--", r.as_str()]).is_ok_and(|o| o.status.success())).collect()
}

/// The registered submodule paths (mode 160000) of `head` and of the repository's own index
/// (read, never written), relative to the root.
fn gitlinks(g: &mut Git<'_>, head: &str) -> Result<BTreeSet<PathBuf>, GitError> {
    let dir = g.dir.clone();
    let mut links = BTreeSet::new();
    // `<mode> <type> <id>\t<path>` and `<mode> <id> <stage>\t<path>`, NUL-terminated.
    let tree = g.run_ok(&["ls-tree", "-r", "-z", "--full-tree", head]).map_err(failed(&dir))?;
    let index = g.run_ok(&["ls-files", "-s", "-z"]).map_err(failed(&dir))?;
    for entry in tree.split(|b| *b == 0).chain(index.split(|b| *b == 0)) {
        let Some(tab) = entry.iter().position(|b| *b == b'\t') else { continue };
        if entry.starts_with(b"160000 ") {
            links.insert(PathBuf::from(OsStr::from_bytes(&entry[tab + 1..])));
        }
    }
    Ok(links)
}

/// The excluded paths beneath `root` (real paths where they exist), relative to it.
fn excluded_beneath(root: &Path, exclude: &[PathBuf]) -> BTreeSet<PathBuf> {
    crate::sort::ordered(exclude.iter().filter_map(|p| {
        let p = sys::normalize(p);
        let p = p.canonicalize().unwrap_or(p);
        p.strip_prefix(root).ok().filter(|r| !r.as_os_str().is_empty()).map(Path::to_path_buf)
    }))
}

/// The first (in name order, depth first) directory under `root` holding a `.git` entry of any
/// kind that is not the root's own: an untracked nested repository. Symlinks are not followed;
/// excluded paths, registered submodule paths and the root's `.git` are not entered.
fn find_nested(
    root: &Path,
    skip: &BTreeSet<PathBuf>,
    links: &BTreeSet<PathBuf>,
    deadline: Instant,
) -> Result<Option<PathBuf>, PinError> {
    let mut stack = vec![PathBuf::new()];
    let mut seen = 0usize;
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        let walk_err = |detail: String| PinError::Walk { path: dir.clone(), detail };
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(|e| walk_err(e.to_string()))? {
            let entry = entry.map_err(|e| walk_err(e.to_string()))?;
            seen += 1;
            if seen > WALK_LIMIT {
                return Err(PinError::Walk { path: root.into(), detail: format!("more than {WALK_LIMIT} entries") });
            }
            if seen % 4096 == 0 && Instant::now() >= deadline {
                return Err(PinError::Walk { path: root.into(), detail: "timed out".into() });
            }
            // The entry's own type: a symlink is a symlink, never what it points at.
            let is_dir = entry.file_type().map_err(|e| walk_err(e.to_string()))?.is_dir();
            names.push((entry.file_name(), is_dir));
        }
        if !rel.as_os_str().is_empty() && names.iter().any(|(n, _)| n == ".git") {
            return Ok(Some(dir));
        }
        crate::sort::natural(&mut names);
        // Reversed onto the stack so the smallest name is walked first.
        for (name, is_dir) in names.into_iter().rev() {
            let child = rel.join(&name);
            if is_dir && name != ".git" && !skip.contains(&child) && !links.contains(&child) {
                stack.push(child);
            }
        }
    }
    Ok(None)
}

/// `git worktree add --detach <path> <commit>` (the review tree of ORCH 4.6 isolation `tree`).
pub fn add_review_tree(ctx: &Ctx, root: &Path, path: &Path, commit: &str) -> Result<(), GitError> {
    check_rev(commit)?;
    let path = sys::absolutize(ctx.cwd(), path);
    let args = [
        OsString::from("worktree"),
        "add".into(),
        "--detach".into(),
        "--end-of-options".into(),
        path.into_os_string(),
        commit.into(),
    ];
    git(ctx, root).run_ok(&args).map_err(failed(root))?;
    Ok(())
}

/// Removes a review tree: `git worktree remove --force <path>`; only when that fails, the directory
/// itself (symlinks removed, never followed) and then `git worktree prune`. Ok once `path` is gone.
pub fn remove_review_tree(ctx: &Ctx, root: &Path, path: &Path) -> Result<(), GitError> {
    let path = sys::absolutize(ctx.cwd(), path);
    let gone = |p: &Path| std::fs::symlink_metadata(p).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound);
    let root_abs = sys::absolutize(ctx.cwd(), root);
    if root_abs.starts_with(&path) || root_abs.canonicalize().is_ok_and(|r| r.starts_with(&path)) {
        return Err(GitError::Remove { path, detail: "it holds the repository itself".into() });
    }
    let args = [OsString::from("worktree"), "remove".into(), "--force".into(), path.clone().into_os_string()];
    let first = match git(ctx, root).run_ok(&args) {
        Ok(_) if gone(&path) => return Ok(()),
        Ok(_) => "git worktree remove left it".to_string(),
        Err(e) => format!("{}: {}", e.what, e.detail),
    };
    // `remove_dir_all` does not follow symlinks: a link is removed, not what it points at.
    let removed = match std::fs::symlink_metadata(&path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(&path),
        Ok(_) => std::fs::remove_file(&path),
        Err(e) => Err(e),
    };
    let pruned = git(ctx, root).run_ok(&["worktree", "prune"]);
    if gone(&path) {
        return Ok(());
    }
    let mut detail = first;
    if let Err(e) = removed {
        detail.push_str(&format!("; {e}"));
    }
    if let Err(e) = pruned {
        detail.push_str(&format!("; {}: {}", e.what, e.detail));
    }
    Err(GitError::Remove { path, detail })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// A test directory (a real path, removed on drop) with `tmp/` for the ctx's TMPDIR.
    struct Td(PathBuf);

    impl Td {
        fn new(name: &str) -> Td {
            let dir = std::env::temp_dir().join(format!("mam-rgit-{name}-{}", sys::random_hex(6).unwrap()));
            std::fs::create_dir_all(dir.join("tmp")).unwrap();
            Td(dir.canonicalize().unwrap())
        }
        fn p(&self, rel: &str) -> PathBuf {
            self.0.join(rel)
        }
        fn ctx(&self) -> Ctx {
            self.ctx_with(&[])
        }
        fn ctx_with(&self, extra: &[(&str, &str)]) -> Ctx {
            let path = Ctx::from_process().var("PATH").unwrap_or_default();
            let tmp = self.p("tmp").to_string_lossy().into_owned();
            let mut vars = vec![("PATH".to_string(), path), ("TMPDIR".to_string(), tmp)];
            vars.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
            Ctx::with_env(vars, &self.0)
        }
        fn write(&self, rel: &str, text: &str) {
            let p = self.p(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        /// A repository at `rel` with one commit of `a.txt`, `b.txt` and a `.gitignore` of `*.log`.
        fn repo(&self, rel: &str) -> PathBuf {
            let root = self.p(rel);
            std::fs::create_dir_all(&root).unwrap();
            sh(&root, &["init", "-q"]);
            self.write(&format!("{rel}/a.txt"), "a\n");
            self.write(&format!("{rel}/b.txt"), "b\n");
            self.write(&format!("{rel}/.gitignore"), "*.log\n");
            sh(&root, &["add", "-A"]);
            sh(&root, &["commit", "-q", "-m", "base"]);
            root
        }
        /// The control-plane exclusion every loop passes: `<root>/.mam`.
        fn repo_obj(&self, root: &Path) -> Repo {
            Repo { root: root.to_path_buf(), exclude: vec![root.join(".mam"), PathBuf::from("/elsewhere/.mam")] }
        }
        fn temp_left(&self) -> Vec<String> {
            std::fs::read_dir(self.p("tmp")).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect()
        }
    }

    impl Drop for Td {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// The test's own git, with a fixed identity and no user configuration.
    fn sh(dir: &Path, args: &[&str]) -> String {
        let out = Command::new("git")
            .current_dir(dir)
            .env_remove("GIT_DIR")
            .env_remove("GIT_WORK_TREE")
            .env_remove("GIT_INDEX_FILE")
            // The test's own `git status` must not refresh the index the test compares.
            .env("GIT_OPTIONAL_LOCKS", "0")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_AUTHOR_NAME", "mam-test")
            .env("GIT_AUTHOR_EMAIL", "mam-test@example.invalid")
            .env("GIT_COMMITTER_NAME", "mam-test")
            .env("GIT_COMMITTER_EMAIL", "mam-test@example.invalid")
            .args(["-c", "init.defaultBranch=main", "-c", "commit.gpgsign=false", "-c", "protocol.file.allow=always"])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    fn sh1(dir: &Path, args: &[&str]) -> String {
        sh(dir, args).trim_end().to_string()
    }

    /// Everything pinning must leave alone: status, the index's bytes and mtime, refs, HEAD, reflog.
    fn untouched_state(root: &Path) -> (String, Vec<u8>, std::time::SystemTime, String, String, Vec<u8>) {
        let index = root.join(".git/index");
        (
            sh(root, &["status", "--porcelain", "--untracked-files=all"]),
            std::fs::read(&index).unwrap(),
            std::fs::metadata(&index).unwrap().modified().unwrap(),
            sh(root, &["for-each-ref"]),
            std::fs::read_to_string(root.join(".git/HEAD")).unwrap(),
            std::fs::read(root.join(".git/logs/HEAD")).unwrap(),
        )
    }

    #[test]
    fn pin_of_a_clean_tree_is_head() {
        let td = Td::new("clean");
        let root = td.repo("ws");
        let head = sh1(&root, &["rev-parse", "HEAD"]);
        let snap = td.repo_obj(&root).pin(&td.ctx(), "0123abcd").unwrap();
        assert_eq!(snap.commit, head);
        assert_eq!(snap.head, head);
        assert_eq!(snap.tree, sh1(&root, &["rev-parse", "HEAD^{tree}"]));
        // A write into the excluded control dir and an ignored file keep it clean.
        td.write("ws/.mam/loop/x/checkpoint.json", "{}\n");
        td.write("ws/debug.log", "ignored\n");
        assert_eq!(td.repo_obj(&root).pin(&td.ctx(), "0123abcd").unwrap().commit, head);
        assert_eq!(td.temp_left(), Vec::<String>::new(), "the temporary index dir was left");
    }

    /// ORCH 4.9 test 7: a dirty tree (staged, unstaged, untracked) pins to a ref-less commit by
    /// mam-loop on HEAD, holding the working state minus ignored files and the control plane, and
    /// leaves status, the index, refs, HEAD and its reflog as they were.
    #[test]
    fn t7_pin_of_a_dirty_tree_leaves_status_index_and_refs() {
        let td = Td::new("dirty");
        let root = td.repo("ws");
        td.write("ws/.mam/tracked.txt", "control\n");
        sh(&root, &["add", "-A"]);
        sh(&root, &["commit", "-q", "-m", "control"]);
        let head = sh1(&root, &["rev-parse", "HEAD"]);
        td.write("ws/a.txt", "a staged\n");
        sh(&root, &["add", "a.txt"]);
        td.write("ws/a.txt", "a staged then edited\n");
        td.write("ws/b.txt", "b unstaged\n");
        td.write("ws/dir with space/new.txt", "untracked\n");
        td.write("ws/debug.log", "ignored\n");
        td.write("ws/.mam/tracked.txt", "control changed\n");
        td.write("ws/.mam/jobs/j.json", "{}\n");
        // Let a later index rewrite show in the mtime.
        std::thread::sleep(Duration::from_millis(20));
        let before = untouched_state(&root);

        let repo = td.repo_obj(&root);
        let snap = repo.pin(&td.ctx(), "0123abcd").unwrap();
        assert_eq!(untouched_state(&root), before, "pinning changed status, index, refs or HEAD");
        assert_eq!(td.temp_left(), Vec::<String>::new(), "the temporary index dir was left");

        assert_eq!(snap.head, head);
        assert_ne!(snap.commit, head);
        assert_eq!(sh1(&root, &["rev-parse", &format!("{}^{{tree}}", snap.commit)]), snap.tree);
        assert_eq!(sh1(&root, &["rev-parse", &format!("{}^", snap.commit)]), head);
        let who = sh1(&root, &["log", "-1", "--format=%an <%ae>|%cn <%ce>|%s", &snap.commit]);
        assert_eq!(who, "mam-loop <mam-loop@localhost>|mam-loop <mam-loop@localhost>|mam loop 0123abcd snapshot");
        assert!(!sh(&root, &["for-each-ref", "--contains", &snap.commit]).contains("refs/"), "a ref holds it");
        let files = sh(&root, &["ls-tree", "-r", "--name-only", &snap.commit]);
        let files: Vec<&str> = files.lines().collect();
        assert_eq!(files, [".gitignore", ".mam/tracked.txt", "a.txt", "b.txt", "dir with space/new.txt"]);
        assert_eq!(sh(&root, &["show", &format!("{}:a.txt", snap.commit)]), "a staged then edited\n");
        assert_eq!(sh(&root, &["show", &format!("{}:b.txt", snap.commit)]), "b unstaged\n");
        // The control plane keeps HEAD's version.
        assert_eq!(sh(&root, &["show", &format!("{}:.mam/tracked.txt", snap.commit)]), "control\n");

        let fp = repo.fingerprint(&td.ctx()).unwrap();
        assert_eq!(fp, Fingerprint { head: snap.head.clone(), tree: snap.tree.clone() });
        // Pinning the same state again gives the same tree.
        assert_eq!(repo.pin(&td.ctx(), "0123abcd").unwrap().tree, snap.tree);
        assert_eq!(repo.guard(&td.ctx(), &head, &snap.commit), Guard::Changes);
    }

    /// ORCH 4.9 test 8: an untracked nested repository (a `.git` dir or file) is refused; one inside
    /// an excluded path, or reached only through a symlink, is not.
    #[test]
    fn t8_untracked_nested_repository_is_refused() {
        let td = Td::new("nested");
        let root = td.repo("ws");
        let other = td.repo("other");
        std::os::unix::fs::symlink(&other, root.join("link-to-other")).unwrap();
        td.write("ws/.mam/review/tree/.git", "gitdir: /nonexistent\n");
        let repo = td.repo_obj(&root);
        let snap = repo.pin(&td.ctx(), "0123abcd").unwrap();
        // The symlink itself is part of the working state, as git add -A records it.
        assert_ne!(snap.commit, snap.head);

        sh(&root.join("deep/er").tap_mkdir(), &["init", "-q"]);
        let e = repo.pin(&td.ctx(), "0123abcd").unwrap_err();
        assert_eq!(e, PinError::NestedRepo(root.join("deep/er")));
        assert_eq!(e.to_string(), format!("untracked nested repository {}", root.join("deep/er").display()));
        assert_eq!(repo.fingerprint(&td.ctx()).unwrap_err(), PinError::NestedRepo(root.join("deep/er")));
        std::fs::remove_dir_all(root.join("deep")).unwrap();

        // A `.git` file (a worktree's or a submodule's pointer) counts too.
        td.write("ws/x/.git", "gitdir: /nonexistent\n");
        assert_eq!(repo.pin(&td.ctx(), "0123abcd").unwrap_err(), PinError::NestedRepo(root.join("x")));
        assert_eq!(td.temp_left(), Vec::<String>::new());
    }

    trait TapMkdir {
        fn tap_mkdir(self) -> Self;
    }

    impl TapMkdir for PathBuf {
        fn tap_mkdir(self) -> PathBuf {
            std::fs::create_dir_all(&self).unwrap();
            self
        }
    }

    /// ORCH 4.9 test 8, A39: a registered submodule is not a nested repository; with modified or
    /// untracked content it is refused even under `ignore = all`; a new checked-out commit in it is
    /// not dirty content (the new gitlink is recorded).
    #[test]
    fn t8_dirty_submodule_is_refused_whatever_its_ignore_setting() {
        let td = Td::new("submod");
        let sub_src = td.repo("subsrc");
        let root = td.repo("ws");
        sh(&root, &["submodule", "add", "-q", sub_src.to_str().unwrap(), "libs/sm"]);
        sh(&root, &["config", "-f", ".gitmodules", "submodule.libs/sm.ignore", "all"]);
        sh(&root, &["add", "-A"]);
        sh(&root, &["commit", "-q", "-m", "submodule"]);
        let head = sh1(&root, &["rev-parse", "HEAD"]);
        let repo = td.repo_obj(&root);
        let ctx = td.ctx();
        assert_eq!(repo.pin(&ctx, "0123abcd").unwrap().commit, head, "a clean submodule is accepted");

        let sm = root.join("libs/sm");
        td.write("ws/libs/sm/untracked.txt", "x\n");
        assert_eq!(repo.pin(&ctx, "0123abcd").unwrap_err(), PinError::DirtySubmodule(sm.clone()));
        assert_eq!(repo.fingerprint(&ctx).unwrap_err(), PinError::DirtySubmodule(sm.clone()));
        assert_eq!(
            PinError::DirtySubmodule(sm.clone()).to_string(),
            format!("submodule {} has modified or untracked content", sm.display())
        );
        std::fs::remove_file(sm.join("untracked.txt")).unwrap();
        td.write("ws/libs/sm/a.txt", "modified\n");
        assert_eq!(repo.pin(&ctx, "0123abcd").unwrap_err(), PinError::DirtySubmodule(sm.clone()));
        // Ignored files in the submodule are not content.
        sh(&sm, &["checkout", "-q", "a.txt"]);
        td.write("ws/libs/sm/debug.log", "ignored\n");
        assert_eq!(repo.pin(&ctx, "0123abcd").unwrap().commit, head);

        // A new commit checked out in the submodule: the snapshot records the new gitlink.
        td.write("ws/libs/sm/a.txt", "next\n");
        sh(&sm, &["commit", "-q", "-am", "next"]);
        let snap = repo.pin(&ctx, "0123abcd").unwrap();
        assert_ne!(snap.commit, head);
        let link = sh1(&root, &["rev-parse", &format!("{}:libs/sm", snap.commit)]);
        assert_eq!(link, sh1(&sm, &["rev-parse", "HEAD"]));
    }

    #[test]
    fn guard_changes_empty_and_undeterminable() {
        let td = Td::new("guard");
        let root = td.repo("ws");
        let c1 = sh1(&root, &["rev-parse", "HEAD"]);
        td.write("ws/.mam/only-control.txt", "x\n");
        sh(&root, &["add", "-A"]);
        sh(&root, &["commit", "-q", "-m", "control only"]);
        let c2 = sh1(&root, &["rev-parse", "HEAD"]);
        td.write("ws/a.txt", "changed\n");
        sh(&root, &["commit", "-q", "-am", "change"]);
        let c3 = sh1(&root, &["rev-parse", "HEAD"]);
        let repo = td.repo_obj(&root);
        let ctx = td.ctx();
        assert_eq!(repo.guard(&ctx, &c1, &c3), Guard::Changes);
        assert_eq!(repo.guard(&ctx, &c3, &c3), Guard::Empty);
        assert_eq!(repo.guard(&ctx, &c1, &c2), Guard::Empty, "a control-plane-only change is no change");
        let unexcluded = Repo { root: root.clone(), exclude: vec![] };
        assert_eq!(unexcluded.guard(&ctx, &c1, &c2), Guard::Changes);
        let bad = "0".repeat(40);
        assert!(matches!(repo.guard(&ctx, &c1, &bad), Guard::Undeterminable(r) if r.contains("git diff")));
        assert!(matches!(repo.guard(&ctx, "--help", &c1), Guard::Undeterminable(_)));
        let gone = Repo { root: td.p("missing"), exclude: vec![] };
        assert!(matches!(gone.guard(&ctx, &c1, &c3), Guard::Undeterminable(_)));
    }

    /// The exclusions of ignored paths are not given to `git add` (it would fail), those of other
    /// paths are: checked in one `check-ignore` run, or one per path for a name git would quote.
    #[test]
    fn exclusions_of_ignored_and_unignored_paths_in_one_check_or_one_each() {
        let td = Td::new("ignx");
        let root = td.repo("ws");
        td.write("ws/.gitignore", "*.log\n/.mam/\n*.ign\n");
        td.write("ws/ctl/tracked.txt", "control\n");
        sh(&root, &["add", "-A"]);
        sh(&root, &["commit", "-q", "-m", "control"]);
        td.write("ws/ctl/tracked.txt", "control changed\n");
        td.write("ws/ctl/new.txt", "control new\n");
        td.write("ws/.mam/jobs/j.json", "{}\n");
        td.write("ws/we\"ird.ign/x.txt", "ignored\n");
        td.write("ws/a.txt", "edited\n");
        let plain = vec![root.join(".mam"), root.join(".mam/jobs"), root.join("ctl")];
        let quoted = [plain.clone(), vec![root.join("we\"ird.ign")]].concat();
        let mut trees = Vec::new();
        for exclude in [plain, quoted] {
            let repo = Repo { root: root.clone(), exclude };
            let snap = repo.pin(&td.ctx(), "0123abcd").unwrap_or_else(|e| panic!("{:?}: {e}", repo.exclude));
            let files = sh(&root, &["ls-tree", "-r", "--name-only", &snap.commit]);
            assert_eq!(files.lines().collect::<Vec<_>>(), [".gitignore", "a.txt", "b.txt", "ctl/tracked.txt"]);
            assert_eq!(sh(&root, &["show", &format!("{}:ctl/tracked.txt", snap.commit)]), "control\n");
            assert_eq!(sh(&root, &["show", &format!("{}:a.txt", snap.commit)]), "edited\n");
            trees.push(snap.tree);
        }
        assert_eq!(trees[0], trees[1]);
    }

    #[test]
    fn fingerprint_follows_edits_but_not_the_control_plane() {
        let td = Td::new("fp");
        let root = td.repo("ws");
        let repo = td.repo_obj(&root);
        let ctx = td.ctx();
        let f1 = repo.fingerprint(&ctx).unwrap();
        assert_eq!(f1.tree, sh1(&root, &["rev-parse", "HEAD^{tree}"]));
        td.write("ws/.mam/jobs/j/report.md", "a report\n");
        td.write("ws/x.log", "ignored\n");
        assert_eq!(repo.fingerprint(&ctx).unwrap(), f1);
        td.write("ws/new.txt", "untracked\n");
        let f2 = repo.fingerprint(&ctx).unwrap();
        assert_eq!(f2.head, f1.head);
        assert_ne!(f2.tree, f1.tree);
        td.write("ws/a.txt", "edited\n");
        let f3 = repo.fingerprint(&ctx).unwrap();
        assert_ne!(f3.tree, f2.tree);
        sh(&root, &["add", "a.txt", "new.txt"]);
        sh(&root, &["commit", "-q", "-m", "c"]);
        let f4 = repo.fingerprint(&ctx).unwrap();
        assert_eq!(f4.tree, f3.tree, "the same working state after a commit");
        assert_ne!(f4.head, f3.head);
    }

    #[test]
    fn has_uncommitted_sees_untracked_but_not_ignored_or_excluded() {
        let td = Td::new("dirtyq");
        let root = td.repo("ws");
        let repo = td.repo_obj(&root);
        let ctx = td.ctx();
        assert!(!repo.has_uncommitted(&ctx).unwrap());
        td.write("ws/.mam/state.json", "{}\n");
        td.write("ws/x.log", "ignored\n");
        assert!(!repo.has_uncommitted(&ctx).unwrap());
        td.write("ws/some.tmp", "untracked\n");
        assert!(repo.has_uncommitted(&ctx).unwrap());
        // GIT_CONFIG_COUNT/KEY/VALUE from the ctx reach git (here: an excludes file ignoring *.tmp).
        td.write("ignore-tmp", "*.tmp\n");
        let file = td.p("ignore-tmp").to_string_lossy().into_owned();
        let cfg = [("GIT_CONFIG_COUNT", "1"), ("GIT_CONFIG_KEY_0", "core.excludesFile"), ("GIT_CONFIG_VALUE_0", &file)];
        assert!(!repo.has_uncommitted(&td.ctx_with(&cfg)).unwrap());
        std::fs::remove_file(root.join("some.tmp")).unwrap();
        td.write("ws/b.txt", "edited\n");
        assert!(repo.has_uncommitted(&ctx).unwrap());
        sh(&root, &["add", "b.txt"]);
        assert!(repo.has_uncommitted(&ctx).unwrap(), "a staged change is uncommitted");
    }

    #[test]
    fn resolve_commit_takes_tags_and_short_ids_and_refuses_the_rest() {
        let td = Td::new("resolve");
        let root = td.repo("ws");
        let ctx = td.ctx();
        let c1 = sh1(&root, &["rev-parse", "HEAD"]);
        sh(&root, &["tag", "-a", "v1", "-m", "v1"]);
        sh(&root, &["tag", "light"]);
        assert_eq!(resolve_commit(&ctx, &root, "v1").unwrap(), c1);
        assert_eq!(resolve_commit(&ctx, &root, "light").unwrap(), c1);
        assert_eq!(resolve_commit(&ctx, &root, &c1[..7]).unwrap(), c1);
        assert_eq!(resolve_commit(&ctx, &root, "main").unwrap(), c1);
        assert_eq!(head(&ctx, &root).unwrap(), c1);
        let tree = sh1(&root, &["rev-parse", "HEAD^{tree}"]);
        let blob = sh1(&root, &["rev-parse", "HEAD:a.txt"]);
        for bad in [tree.as_str(), blob.as_str(), "--help", "-q", "", "nonexistent", "HEAD~5"] {
            let e = resolve_commit(&ctx, &root, bad).unwrap_err();
            assert!(matches!(&e, GitError::BadRev { value, .. } if value == bad), "{bad}: {e:?}");
            assert!(e.to_string().starts_with(&format!("'{bad}': not a commit")), "{e}");
        }
        assert!(matches!(resolve_commit(&ctx, &td.p("tmp"), "HEAD"), Err(GitError::BadRev { detail, .. })
            if detail.contains("not a git repository")));
    }

    #[test]
    fn ancestry_merge_base_counts_and_branch() {
        let td = Td::new("anc");
        let root = td.repo("ws");
        let ctx = td.ctx();
        let c1 = sh1(&root, &["rev-parse", "HEAD"]);
        td.write("ws/a.txt", "2\n");
        sh(&root, &["commit", "-q", "-am", "two"]);
        td.write("ws/a.txt", "3\n");
        sh(&root, &["commit", "-q", "-am", "three"]);
        let c3 = sh1(&root, &["rev-parse", "HEAD"]);
        sh(&root, &["checkout", "-q", "-b", "side", &c1]);
        td.write("ws/b.txt", "side\n");
        sh(&root, &["commit", "-q", "-am", "side"]);
        let s1 = sh1(&root, &["rev-parse", "HEAD"]);
        assert!(is_ancestor(&ctx, &root, &c1, &c3).unwrap());
        assert!(!is_ancestor(&ctx, &root, &c3, &c1).unwrap());
        assert!(!is_ancestor(&ctx, &root, &s1, &c3).unwrap());
        assert!(is_ancestor(&ctx, &root, &"0".repeat(40), &c3).is_err());
        assert!(is_ancestor(&ctx, &root, "--help", &c3).is_err());
        assert_eq!(merge_base(&ctx, &root, &s1, &c3).unwrap(), c1);
        assert_eq!(merge_base(&ctx, &root, "main", "side").unwrap(), c1);
        assert_eq!(count_commits(&ctx, &root, &c1, &c3).unwrap(), 2);
        assert_eq!(count_commits(&ctx, &root, &c3, &c3).unwrap(), 0);
        assert!(count_commits(&ctx, &root, "--all", &c3).is_err());
        assert_eq!(branch(&ctx, &root).unwrap().as_deref(), Some("side"));
        sh(&root, &["checkout", "-q", "--detach"]);
        assert_eq!(branch(&ctx, &root).unwrap(), None);
        // Unrelated histories have no merge base.
        sh(&root, &["checkout", "-q", "--orphan", "lonely"]);
        sh(&root, &["commit", "-q", "-m", "lonely"]);
        let e = merge_base(&ctx, &root, "lonely", "main").unwrap_err();
        assert!(e.to_string().contains("no common ancestor"), "{e}");
    }

    #[test]
    fn toplevel_and_common_dir_of_a_linked_worktree() {
        let td = Td::new("linked");
        let root = td.repo("ws");
        let ctx = td.ctx();
        sh(&root, &["worktree", "add", "-q", "-b", "other", td.p("wt").to_str().unwrap()]);
        std::fs::create_dir_all(td.p("wt/sub")).unwrap();
        assert_eq!(toplevel(&ctx, &td.p("wt")).unwrap(), td.p("wt"));
        assert_eq!(toplevel(&ctx, &td.p("wt/sub")).unwrap(), td.p("wt"));
        assert_eq!(toplevel(&ctx, Path::new("ws")).unwrap(), root, "relative to the ctx's cwd");
        assert_eq!(common_dir(&ctx, &root).unwrap(), root.join(".git"));
        assert_eq!(common_dir(&ctx, &td.p("wt")).unwrap(), root.join(".git"));
        assert_eq!(common_dir(&ctx, &td.p("wt/sub")).unwrap(), root.join(".git"));
        assert!(matches!(toplevel(&ctx, &td.p("tmp")), Err(GitError::Git { .. })));
        assert!(matches!(toplevel(&ctx, &td.p("missing")), Err(GitError::Path { .. })));
        assert!(common_dir(&ctx, &td.p("tmp")).is_err());
    }

    #[test]
    fn review_trees_come_and_go() {
        let td = Td::new("trees");
        let root = td.repo("ws");
        let ctx = td.ctx();
        td.write("ws/a.txt", "dirty\n");
        let snap = td.repo_obj(&root).pin(&ctx, "0123abcd").unwrap();
        let list_before = sh(&root, &["worktree", "list", "--porcelain"]);
        let refs = sh(&root, &["for-each-ref"]);

        let tree = td.p("tmp/mam-review-0123abcd-r1");
        add_review_tree(&ctx, &root, &tree, &snap.commit).unwrap();
        assert_eq!(std::fs::read_to_string(tree.join("a.txt")).unwrap(), "dirty\n");
        assert_eq!(sh1(&tree, &["rev-parse", "HEAD"]), snap.commit);
        assert!(sh(&root, &["worktree", "list", "--porcelain"]).contains(tree.to_str().unwrap()));
        assert_eq!(sh(&root, &["for-each-ref"]), refs, "a detached tree adds no ref");
        assert!(add_review_tree(&ctx, &root, &tree, &snap.commit).is_err(), "the path is taken");
        assert!(add_review_tree(&ctx, &root, &td.p("tmp/t2"), "--help").is_err());

        // A reviewer's leftovers and a symlink pointing out of the tree: the target survives.
        td.write("outside.txt", "keep\n");
        td.write("tmp/mam-review-0123abcd-r1/scratch.txt", "x\n");
        std::os::unix::fs::symlink(td.p("outside.txt"), tree.join("link")).unwrap();
        remove_review_tree(&ctx, &root, &tree).unwrap();
        assert!(std::fs::symlink_metadata(&tree).is_err(), "the review tree is still there");
        assert_eq!(sh(&root, &["worktree", "list", "--porcelain"]), list_before);
        assert_eq!(std::fs::read_to_string(td.p("outside.txt")).unwrap(), "keep\n");

        // git no longer knows the tree: the directory is removed by hand, then pruned.
        let tree2 = td.p("tmp/mam-review-0123abcd-r2");
        add_review_tree(&ctx, &root, &tree2, &snap.commit).unwrap();
        std::os::unix::fs::symlink(td.p("outside.txt"), tree2.join("link")).unwrap();
        std::fs::write(tree2.join(".git"), "gitdir: /nonexistent\n").unwrap();
        remove_review_tree(&ctx, &root, &tree2).unwrap();
        assert!(std::fs::symlink_metadata(&tree2).is_err());
        assert_eq!(sh(&root, &["worktree", "list", "--porcelain"]), list_before, "not pruned");
        assert_eq!(std::fs::read_to_string(td.p("outside.txt")).unwrap(), "keep\n");

        // Already gone is fine; the repository itself is never removed.
        remove_review_tree(&ctx, &root, &tree2).unwrap();
        assert!(matches!(remove_review_tree(&ctx, &root, &td.0), Err(GitError::Remove { .. })));
        assert!(matches!(remove_review_tree(&ctx, &root, &root), Err(GitError::Remove { .. })));
        assert!(root.join("a.txt").exists());
    }

    #[test]
    fn errors_are_one_line_and_name_the_value() {
        let e =
            GitError::Git { what: "git diff".into(), dir: "/r".into(), detail: "exit status: 128: fatal:\nx".into() };
        assert_eq!(e.to_string().lines().count(), 1);
        assert!(e.to_string().starts_with("git diff in /r: "), "{e}");
        let e = GitError::BadRev { value: "v9".into(), detail: String::new() };
        assert_eq!(e.to_string(), "'v9': not a commit");
        let e = PinError::Temp { path: "/t/mam-pin-1".into(), detail: "Permission denied".into() };
        assert_eq!(e.to_string(), "temporary index /t/mam-pin-1: Permission denied");
    }
}
