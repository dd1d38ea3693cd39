//! The one check of `mam worktree remove` (ORCH 5.2 checks 1-8, A44): `gather` looks at a worktree
//! and at what works in it (git, the sessions file, the registries, the loop locks) and returns
//! plain `Facts`; `judge` is the pure decision over those facts: the findings in token order and
//! the removal method. `look` is both; `remove` calls it before anything is touched and again right
//! before the removal, `list` once per worktree.
//!
//! What counts as unsaved work: anything `git status` shows (submodules not ignored, every
//! untracked file); every ignored file or directory of the worktree except a regenerable directory
//! (`REGENERABLE`, issue 29: `git worktree remove` deletes ignored files), unless the user passed
//! `--discard-ignored`; inside a submodule also its ignored files, since a forced removal deletes them;
//! every commit reachable from HEAD or a local ref (tags, notes ...) that no remote-tracking ref
//! reaches, in every initialised submodule and every repository under the worktree's `modules/`;
//! every stash; a repository it cannot read; a commit the worktree's HEAD held that no ref holds.
//! It never changes anything: git runs read-only (`GIT_OPTIONAL_LOCKS=0`), lock probes are
//! non-blocking and released at once.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::{admin_dir, canon, git, is_within, run_error, trim_nl, worktrees, Entry, Repo, CHECK_BUDGET};
use crate::ctx::Ctx;
use crate::git::Git;
use crate::paths::Resolved;
use crate::registry::is_terminal;
use crate::review::checkpoint::Checkpoint;
use crate::session::{self, stop::row_store};
use crate::sys::{self, Flock, LockMode};
use crate::text::{one_line, show_path};

/// The finding tokens of A44, in check order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Token {
    NotLinked,
    MainWorktree,
    Locked,
    SessionsRunning,
    OpenJobs,
    Dirty,
    Ignored,
    StatusFailed,
    SubmoduleDirty,
    Unpushed,
    Stashes,
    UncheckableRepo,
    LoopActive,
    UnreachableHead,
}

impl Token {
    pub fn name(self) -> &'static str {
        match self {
            Token::NotLinked => "not-linked",
            Token::MainWorktree => "main-worktree",
            Token::Locked => "locked",
            Token::SessionsRunning => "sessions-running",
            Token::OpenJobs => "open-jobs",
            Token::Dirty => "dirty",
            Token::Ignored => "ignored",
            Token::StatusFailed => "status-failed",
            Token::SubmoduleDirty => "submodule-dirty",
            Token::Unpushed => "unpushed",
            Token::Stashes => "stashes",
            Token::UncheckableRepo => "uncheckable-repo",
            Token::LoopActive => "loop-active",
            Token::UnreachableHead => "unreachable-head",
        }
    }

    /// What to do about it.
    pub fn advice(self) -> &'static str {
        match self {
            Token::NotLinked => "give the top level of a linked worktree of this repository (see `git worktree list`)",
            Token::MainWorktree => "the main worktree is never removed",
            Token::Locked => "if it may go, unlock it first: git worktree unlock <path>",
            Token::SessionsRunning => "pass --stop to stop them (their open task jobs are cancelled)",
            Token::OpenJobs => "let these jobs finish, or close them (mam registry expire <job>, or stop their loop)",
            Token::Dirty => "commit these files, move them elsewhere, or delete them",
            Token::Ignored => {
                "move it out of the worktree (or commit it); --discard-ignored deletes the ignored files with the worktree"
            }
            Token::StatusFailed => "look at the worktree with git status",
            Token::SubmoduleDirty => {
                "commit, move or delete these files inside the submodule (ignored files count too)"
            }
            Token::Unpushed => "push these commits to a remote (or put a branch of the main repository on them)",
            Token::Stashes => "apply or drop the stash entries (git stash list), or push them as a branch",
            Token::UncheckableRepo => "inspect this directory; move it away if it holds nothing of value",
            Token::LoopActive => "wait for the loop to finish, or stop it first",
            Token::UnreachableHead => "put a branch or tag on the commit: git branch <name> <commit>",
        }
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One reason not to remove: the token, the path it is about and git's evidence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub token: Token,
    pub subject: PathBuf,
    pub evidence: String,
}

impl Finding {
    /// `FINDING=<token> <path>: <evidence>; <what to do>`, one line.
    pub fn line(&self) -> String {
        format!(
            "FINDING={} {}: {}; {}",
            self.token,
            show_path(&self.subject),
            one_line(&self.evidence),
            self.token.advice()
        )
    }
}

/// How the worktree would be removed (ORCH 5.2 check 7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Method {
    /// Not decided (no linked worktree found, or no check ran yet).
    #[default]
    None,
    /// `git worktree remove`.
    Plain,
    /// `git worktree remove --force`, once: the worktree holds submodule state.
    Force,
}

impl Method {
    pub fn name(self) -> &'static str {
        match self {
            Method::None => "none",
            Method::Plain => "plain",
            Method::Force => "force",
        }
    }
}

/// Check 1's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Linked {
    /// The control root is no git repository (or git failed listing the worktrees): why.
    NoRepo(String),
    /// Not in `git worktree list`: why (possibly naming the worktree it lies inside).
    NotFound(String),
    Main,
    Linked {
        locked: Option<String>,
    },
}

/// A session whose `pane.cwd` lies inside the worktree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionFact {
    pub name: String,
    pub running: bool,
}

/// A non-terminal job addressed to one of those sessions (or a registry that could not be read:
/// `status` then says so).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobFact {
    pub id: String,
    pub session: String,
    pub kind: String,
    pub status: String,
    pub session_running: bool,
}

/// What one repository (an initialised submodule, or one under `modules/`) holds that could be lost.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RepoFact {
    pub path: PathBuf,
    /// `git status` entries (with ignored files, for submodules).
    pub dirty: Vec<String>,
    /// Commits of the rev set (`<id> <subject>`); `more` when there were more than shown.
    pub unpushed: Vec<String>,
    pub more: bool,
    pub stashes: Vec<String>,
    /// The repository could not be read (a partial repository, a failing git): why.
    pub uncheckable: Option<String>,
}

/// One ignored entry of the worktree as git reports it: its path relative to the worktree, whether
/// git reported a whole directory (`dir/`), and whether it is a symbolic link (`lstat`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IgnoredEntry {
    pub path: String,
    pub dir: bool,
    pub symlink: bool,
}

/// The directory names that hold only what a build or an installer makes again (issue 29). An
/// ignored entry is unsaved work unless it is a directory git reports as ignored as a whole, or a
/// symbolic link (the `.venv` link `prepare` makes), whose own name is one of these.
pub const REGENERABLE: [&str; 13] = [
    ".venv",
    "venv",
    "node_modules",
    "target",
    "build",
    "dist",
    "__pycache__",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".tox",
    ".gradle",
    ".next",
];

/// Whether an ignored entry may go with the worktree without `--discard-ignored`.
pub fn regenerable(e: &IgnoredEntry) -> bool {
    let name = e.path.trim_end_matches('/').rsplit('/').next().unwrap_or("");
    (e.dir || e.symlink) && REGENERABLE.contains(&name)
}

/// The most `ignored` findings shown one by one; the rest are counted in one more.
pub const MAX_IGNORED_SHOWN: usize = 100;

/// A running loop whose source root lies inside the worktree (or whose checkpoint is unreadable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopFact {
    pub id: String,
    pub source: String,
}

/// Everything the checks look at, gathered once per look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    /// The path as given (absolute) and the worktree entry found for it.
    pub path: PathBuf,
    pub linked: Linked,
    pub entry: Option<Entry>,
    /// Why the sessions could not be looked at (the sessions file unreadable).
    pub sessions_error: Option<String>,
    pub sessions: Vec<SessionFact>,
    pub jobs: Vec<JobFact>,
    /// `git status` entries, or why it failed; `None` when there is no linked worktree to ask.
    pub status: Option<Result<Vec<String>, String>>,
    /// The ignored entries of the worktree (`--ignored=matching`: a directory ignored as a whole is
    /// one entry), or why they could not be had.
    pub ignored: Result<Vec<IgnoredEntry>, String>,
    /// The directory is gone (the prune hint).
    pub gone: bool,
    pub submodules: Vec<RepoFact>,
    pub modules: Vec<RepoFact>,
    pub submodule_state: bool,
    pub loops: Vec<LoopFact>,
    /// Commits the worktree's HEAD held (now or in its reflog) that no ref reaches, or why that
    /// could not be told.
    pub unreachable: Result<Vec<String>, String>,
}

impl Facts {
    fn empty(path: PathBuf, linked: Linked) -> Facts {
        Facts {
            path,
            linked,
            entry: None,
            sessions_error: None,
            sessions: Vec::new(),
            jobs: Vec::new(),
            status: None,
            ignored: Ok(Vec::new()),
            gone: false,
            submodules: Vec::new(),
            modules: Vec::new(),
            submodule_state: false,
            loops: Vec::new(),
            unreachable: Ok(Vec::new()),
        }
    }
}

/// One look: the facts, the findings in token order, the method.
#[derive(Debug, Clone)]
pub struct Look {
    pub facts: Facts,
    pub findings: Vec<Finding>,
    pub method: Method,
}

impl Look {
    /// The comma-separated tokens, each once, in check order; `none`.
    pub fn tokens(&self) -> String {
        tokens(&self.findings)
    }

    /// The running sessions `--stop` would stop.
    pub fn running(&self) -> Vec<String> {
        self.facts.sessions.iter().filter(|s| s.running).map(|s| s.name.clone()).collect()
    }
}

pub fn tokens(findings: &[Finding]) -> String {
    let mut t: Vec<Token> = findings.iter().map(|f| f.token).collect();
    crate::sort::natural(&mut t);
    t.dedup();
    if t.is_empty() {
        return "none".into();
    }
    t.iter().map(|t| t.name()).collect::<Vec<_>>().join(",")
}

/// `1 entry`, `2 entries`.
fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Shows the first three items and how many there are.
fn some(items: &[String], more: bool) -> String {
    let mut s = items.iter().take(3).cloned().collect::<Vec<_>>().join(", ");
    let n = items.len();
    if n > 3 || more {
        s.push_str(&format!(" (and {}{} more)", n.saturating_sub(3), if more { "+" } else { "" }));
    }
    s
}

/// The pure decision (checks 1-8 over gathered facts). `allow_running`: the first look of a
/// `--stop` removal, where running sessions and the task jobs their stop cancels are no finding.
/// `discard_ignored`: the user said the ignored files may go (`--discard-ignored`).
pub fn judge(f: &Facts, allow_running: bool, discard_ignored: bool) -> (Vec<Finding>, Method) {
    let mut out = Vec::new();
    let mut add =
        |token, subject: &Path, evidence: String| out.push(Finding { token, subject: subject.to_path_buf(), evidence });
    let path = f.path.as_path();
    match &f.linked {
        Linked::NoRepo(why) | Linked::NotFound(why) => add(Token::NotLinked, path, why.clone()),
        Linked::Main => add(Token::MainWorktree, path, "this is the main worktree of the repository".into()),
        Linked::Linked { locked: Some(why) } => {
            add(Token::Locked, path, if why.is_empty() { "locked".into() } else { format!("locked: {why}") })
        }
        Linked::Linked { locked: None } => {}
    }
    if let Some(e) = &f.sessions_error {
        add(Token::SessionsRunning, path, format!("cannot tell which sessions run here: {e}"));
    }
    let running: Vec<String> = f.sessions.iter().filter(|s| s.running).map(|s| s.name.clone()).collect();
    if !running.is_empty() && !allow_running {
        add(Token::SessionsRunning, path, format!("running session(s) in it: {}", running.join(", ")));
    }
    let open: Vec<String> = f
        .jobs
        .iter()
        .filter(|j| !(allow_running && j.session_running && j.kind == "task"))
        .map(|j| format!("{} ({} job of session {}, {})", j.id, j.kind, j.session, j.status))
        .collect();
    if !open.is_empty() {
        add(Token::OpenJobs, path, format!("unfinished job(s): {}", some(&open, false)));
    }
    match &f.status {
        Some(Ok(entries)) if !entries.is_empty() => add(
            Token::Dirty,
            path,
            format!("git status shows {}: {}", count(entries.len(), "entry", "entries"), some(entries, false)),
        ),
        Some(Err(why)) => add(Token::StatusFailed, path, format!("git status failed: {why}")),
        _ => {}
    }
    match &f.ignored {
        Ok(entries) if !discard_ignored => {
            let lost: Vec<&IgnoredEntry> = entries.iter().filter(|e| !regenerable(e)).collect();
            for e in lost.iter().take(MAX_IGNORED_SHOWN) {
                let what = if e.dir { "a directory git ignores" } else { "a file git ignores" };
                add(
                    Token::Ignored,
                    &path.join(e.path.trim_end_matches('/')),
                    format!("{what}, not a regenerable directory"),
                );
            }
            if lost.len() > MAX_IGNORED_SHOWN {
                let n = lost.len() - MAX_IGNORED_SHOWN;
                add(
                    Token::Ignored,
                    path,
                    format!("{n} more ignored {} not shown", if n == 1 { "entry" } else { "entries" }),
                );
            }
        }
        Err(why) if !discard_ignored => add(Token::StatusFailed, path, format!("git status --ignored failed: {why}")),
        _ => {}
    }
    for r in &f.submodules {
        if !r.dirty.is_empty() {
            add(Token::SubmoduleDirty, &r.path, format!("submodule git status shows: {}", some(&r.dirty, false)));
        }
    }
    for r in f.submodules.iter().chain(&f.modules) {
        if !r.unpushed.is_empty() {
            add(
                Token::Unpushed,
                &r.path,
                format!("commit(s) no remote-tracking ref reaches: {}", some(&r.unpushed, r.more)),
            );
        }
    }
    for r in f.submodules.iter().chain(&f.modules) {
        if !r.stashes.is_empty() {
            add(
                Token::Stashes,
                &r.path,
                format!("{}: {}", count(r.stashes.len(), "stash entry", "stash entries"), some(&r.stashes, false)),
            );
        }
    }
    for r in f.submodules.iter().chain(&f.modules) {
        if let Some(why) = &r.uncheckable {
            add(Token::UncheckableRepo, &r.path, why.clone());
        }
    }
    for l in &f.loops {
        add(Token::LoopActive, path, format!("loop {} is running with source root {}", l.id, l.source));
    }
    match &f.unreachable {
        Ok(c) if !c.is_empty() => {
            add(Token::UnreachableHead, path, format!("commit(s) only this worktree's HEAD held: {}", some(c, false)))
        }
        Err(why) => add(Token::UnreachableHead, path, format!("cannot tell whether HEAD is reachable: {why}")),
        _ => {}
    }
    crate::sort::by_key(&mut out, |f| f.token);
    let method = match f.linked {
        Linked::Linked { .. } if f.submodule_state => Method::Force,
        Linked::Linked { .. } => Method::Plain,
        _ => Method::None,
    };
    (out, method)
}

/// Gathers the facts about `path` and judges them.
pub fn look(
    ctx: &Ctx,
    repo: &Result<Repo, String>,
    resolved: &Resolved,
    path: &Path,
    allow_running: bool,
    discard_ignored: bool,
) -> Look {
    let facts = gather(ctx, repo, resolved, path);
    let (findings, method) = judge(&facts, allow_running, discard_ignored);
    Look { facts, findings, method }
}

/// Every fact the checks need, from git, the sessions file, the registries and the loop locks.
pub fn gather(ctx: &Ctx, repo: &Result<Repo, String>, resolved: &Resolved, path: &Path) -> Facts {
    let deadline = Instant::now() + CHECK_BUDGET;
    let real = canon(path);
    let mut f = Facts::empty(path.to_path_buf(), Linked::NotFound(String::new()));
    f.linked = match repo {
        Err(why) => Linked::NoRepo(why.clone()),
        Ok(repo) => match worktrees(ctx, &repo.root, deadline) {
            Err(e) => Linked::NoRepo(e),
            Ok(list) => match list.iter().find(|e| e.real == real) {
                Some(e) if e.main => Linked::Main,
                Some(e) => {
                    f.entry = Some(e.clone());
                    Linked::Linked { locked: e.locked.clone() }
                }
                None => Linked::NotFound(match list.iter().find(|e| is_within(&real, &e.real) && !e.main) {
                    Some(e) => format!("lies inside the linked worktree {}; give its top level", show_path(&e.path)),
                    None => format!("not a worktree in `git worktree list` of {}", show_path(&repo.root)),
                }),
            },
        },
    };
    sessions(ctx, resolved, &real, &mut f);
    f.loops = loops(&resolved.control_root, &real);
    if let (Ok(repo), Some(entry)) = (repo, f.entry.clone()) {
        git_facts(ctx, repo, &entry, &real, deadline, &mut f);
    }
    f
}

/// Checks 2 and 3: the rows whose `pane.cwd` lies inside, and their unfinished jobs (looked up in
/// the registry `stop` would use, 2.5's order).
fn sessions(ctx: &Ctx, resolved: &Resolved, real: &Path, f: &mut Facts) {
    let doc = match session::load(&resolved.sessions) {
        Ok(d) => d,
        Err(e) => {
            f.sessions_error = Some(e.to_string());
            return;
        }
    };
    for row in &doc.herdr_sessions {
        let Some(cwd) = row.cwd() else { continue };
        if !is_within(&canon(Path::new(cwd)), real) {
            continue;
        }
        f.sessions.push(SessionFact { name: row.name.clone(), running: row.running() });
        let store = row_store(ctx, row);
        let ids = match store.job_ids() {
            Ok(mut ids) => {
                crate::sort::natural(&mut ids);
                ids
            }
            Err(e) => {
                f.jobs.push(JobFact {
                    id: "?".into(),
                    session: row.name.clone(),
                    kind: "?".into(),
                    status: format!("registry unreadable: {e}"),
                    session_running: row.running(),
                });
                continue;
            }
        };
        for id in ids {
            let Ok(Some(rec)) = store.read(&id) else { continue };
            if rec.str("agent_session") != Some(row.name.as_str()) || is_terminal(rec.status()) {
                continue;
            }
            f.jobs.push(JobFact {
                id,
                session: row.name.clone(),
                kind: rec.str("type").unwrap_or("task").to_string(),
                status: rec.status().to_string(),
                session_running: row.running(),
            });
        }
    }
}

/// Check 8, first half: every held `<control root>/.mam/loop/<creator>.lock` whose loop's
/// checkpoint names a source root inside `real`; a held lock whose checkpoint cannot be read counts
/// too (it cannot be told apart).
fn loops(control: &Path, real: &Path) -> Vec<LoopFact> {
    let root = crate::review::admin::loop_root(control);
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(&root) else { return out };
    let mut locks: Vec<PathBuf> =
        rd.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "lock")).collect();
    crate::sort::natural(&mut locks);
    for lock in locks {
        if !std::fs::symlink_metadata(&lock).is_ok_and(|m| m.is_file()) {
            continue;
        }
        let held = match sys::open_lock_file(&lock).and_then(|f| Flock::try_acquire(f, LockMode::Exclusive)) {
            Ok(Some(_)) => false, // released at once on drop
            Ok(None) => true,
            Err(_) => false,
        };
        if !held {
            continue;
        }
        let id = std::fs::read_to_string(&lock).unwrap_or_default().trim().to_string();
        let valid = id.len() == 8 && id.bytes().all(|b| b.is_ascii_hexdigit());
        let cp = if valid {
            Checkpoint::read(&root.join(&id).join("checkpoint.json")).map_err(|e| e.to_string())
        } else {
            Err(format!("lock {} names no loop", show_path(&lock)))
        };
        match cp {
            Ok(cp) if is_within(&canon(Path::new(&cp.source_root)), real) => {
                out.push(LoopFact { id, source: cp.source_root.clone() })
            }
            Ok(_) => {}
            Err(e) => out.push(LoopFact {
                id: if valid { id } else { "?".into() },
                source: format!("unknown (checkpoint unreadable: {e})"),
            }),
        }
    }
    out
}

/// Checks 4-8 that ask git.
fn git_facts(ctx: &Ctx, repo: &Repo, entry: &Entry, real: &Path, deadline: Instant, f: &mut Facts) {
    f.gone = !real.is_dir();
    f.status = Some(if f.gone {
        Err(format!("{} is gone", show_path(&entry.path)))
    } else {
        let mut g = git(ctx, real, deadline);
        status(&mut g, false)
    });
    if !f.gone {
        f.ignored = ignored(&mut git(ctx, real, deadline), real);
    }
    if !f.gone {
        let mut subs = Vec::new();
        submodules(ctx, real, deadline, &mut subs, 0);
        f.submodules = subs;
    }
    let admin = admin_dir(&repo.common, real);
    if let Some(admin) = &admin {
        let modules = admin.join("modules");
        if modules.is_dir() {
            f.submodule_state = true;
            walk_modules(ctx, &modules, deadline, &mut f.modules, 0);
        }
    }
    if !f.submodules.is_empty() {
        f.submodule_state = true;
    }
    f.unreachable = unreachable(ctx, repo, entry, admin.as_deref(), deadline);
}

/// `git status` entries (porcelain v1, NUL-separated), submodules not ignored, every untracked
/// file shown; with `ignored` also the ignored ones.
fn status(g: &mut Git<'_>, ignored: bool) -> Result<Vec<String>, String> {
    let mut args = vec!["status", "--porcelain=v1", "-z", "--ignore-submodules=none", "--untracked-files=all"];
    if ignored {
        args.push("--ignored=traditional");
    }
    let dir = g.dir.clone();
    let out = g.run(&args).map_err(|e| run_error(&dir, e))?;
    if !out.status.success() {
        return Err(super::detail(&out));
    }
    let mut entries = Vec::new();
    let mut it = out.stdout.split(|b| *b == 0).filter(|e| !e.is_empty());
    while let Some(e) = it.next() {
        let text = String::from_utf8_lossy(e).into_owned();
        // A rename's entry is followed by its source path.
        if e.first().is_some_and(|c| *c == b'R' || *c == b'C') {
            it.next();
        }
        entries.push(text);
    }
    Ok(entries)
}

/// The ignored entries of the worktree itself (submodules have their own check): `matching` reports
/// a directory that an ignore pattern matches as one `dir/` entry, everything else file by file.
fn ignored(g: &mut Git<'_>, real: &Path) -> Result<Vec<IgnoredEntry>, String> {
    let args =
        ["status", "--porcelain=v1", "-z", "--ignored=matching", "--untracked-files=all", "--ignore-submodules=all"];
    let dir = g.dir.clone();
    let out = g.run(&args).map_err(|e| run_error(&dir, e))?;
    if !out.status.success() {
        return Err(super::detail(&out));
    }
    let mut entries = Vec::new();
    for e in out.stdout.split(|b| *b == 0) {
        let Some(p) = e.strip_prefix(b"!! ") else { continue };
        // mam's own allow rules for a claude in the worktree (issue 30): `stop` takes them out.
        if p == crate::agents::allow::SETTINGS.as_bytes() && crate::agents::allow::only_mam_rules(real) {
            continue;
        }
        let rel = Path::new(OsStr::from_bytes(p));
        let symlink = std::fs::symlink_metadata(real.join(rel)).is_ok_and(|m| m.file_type().is_symlink());
        entries.push(IgnoredEntry { path: String::from_utf8_lossy(p).into_owned(), dir: p.ends_with(b"/"), symlink });
    }
    Ok(entries)
}

/// The deepest submodule nesting looked at (a cycle of gitfiles must not recurse forever).
const MAX_DEPTH: usize = 16;

/// Check 5: every initialised submodule below `dir`, recursively: status (with ignored files),
/// the rev set, stashes.
fn submodules(ctx: &Ctx, dir: &Path, deadline: Instant, out: &mut Vec<RepoFact>, depth: usize) {
    if depth >= MAX_DEPTH {
        return;
    }
    let mut g = git(ctx, dir, deadline);
    let Ok(ls) = g.run(&["ls-files", "-s", "-z"]) else { return };
    let links: Vec<PathBuf> = ls
        .stdout
        .split(|b| *b == 0)
        .filter(|e| e.starts_with(b"160000 "))
        .filter_map(|e| e.iter().position(|b| *b == b'\t').map(|i| PathBuf::from(OsStr::from_bytes(&e[i + 1..]))))
        .collect();
    for p in links {
        let full = dir.join(&p);
        if std::fs::symlink_metadata(full.join(".git")).is_err() {
            continue;
        }
        let mut fact = RepoFact { path: full.clone(), ..RepoFact::default() };
        let mut sg = git(ctx, &full, deadline);
        match status(&mut sg, true) {
            Ok(d) => fact.dirty = d,
            Err(e) => fact.uncheckable = Some(format!("git status failed: {e}")),
        }
        rev_set(&mut sg, &[], &mut fact);
        out.push(fact);
        submodules(ctx, &full, deadline, out, depth + 1);
    }
}

/// Names whose presence makes a directory resemble a git directory.
const GIT_MARKERS: [&str; 6] = ["HEAD", "objects", "refs", "config", "packed-refs", "index"];

/// Check 6: every repository under `dir` (the worktree's `modules/`), nested ones included,
/// checked directly with `--git-dir`. A directory that has some of a repository's parts but not
/// HEAD, objects/ and refs/ is uncheckable; so is any other file in the tree.
fn walk_modules(ctx: &Ctx, dir: &Path, deadline: Instant, out: &mut Vec<RepoFact>, depth: usize) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        out.push(RepoFact {
            path: dir.into(),
            uncheckable: Some("cannot read the directory".into()),
            ..Default::default()
        });
        return;
    };
    let mut entries: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
    crate::sort::natural(&mut entries);
    for p in entries {
        let Ok(m) = std::fs::symlink_metadata(&p) else { continue };
        if !m.is_dir() {
            let why = "a file where only submodule git directories belong".to_string();
            out.push(RepoFact { path: p, uncheckable: Some(why), ..Default::default() });
            continue;
        }
        let has = |n: &str| std::fs::symlink_metadata(p.join(n)).ok();
        let whole = has("HEAD").is_some_and(|m| m.is_file())
            && has("objects").is_some_and(|m| m.is_dir())
            && has("refs").is_some_and(|m| m.is_dir());
        if whole {
            let mut fact = RepoFact { path: p.clone(), ..RepoFact::default() };
            let mut g = git(ctx, &p, deadline);
            let mut gd = OsString::from("--git-dir=");
            gd.push(p.as_os_str());
            rev_set(&mut g, &[gd], &mut fact);
            out.push(fact);
            let nested = p.join("modules");
            if nested.is_dir() && depth + 1 < MAX_DEPTH {
                walk_modules(ctx, &nested, deadline, out, depth + 1);
            }
        } else if GIT_MARKERS.iter().any(|n| has(n).is_some()) {
            let present: Vec<&str> = GIT_MARKERS.iter().copied().filter(|n| has(n).is_some()).collect();
            let why = format!("a partial git directory (has {}, lacks HEAD, objects/ or refs/)", present.join(", "));
            out.push(RepoFact { path: p, uncheckable: Some(why), ..Default::default() });
        } else if depth + 1 < MAX_DEPTH {
            // A submodule name with slashes: an intermediate directory.
            walk_modules(ctx, &p, deadline, out, depth + 1);
        }
    }
}

/// The most commits listed per repository.
const MAX_COMMITS: usize = 100;

/// The rev set of checks 5 and 6 (`HEAD --exclude=refs/stash --all --not --remotes`) and the stash
/// with the reflog behind it. `pre` are git options before the subcommand (`--git-dir=`).
fn rev_set(g: &mut Git<'_>, pre: &[OsString], fact: &mut RepoFact) {
    let with = |args: &[&str]| -> Vec<OsString> {
        let mut v: Vec<OsString> = pre.to_vec();
        v.extend(args.iter().map(OsString::from));
        v
    };
    let max = format!("--max-count={}", MAX_COMMITS + 1);
    let log =
        with(&["log", "--format=%H %s", &max, "HEAD", "--exclude=refs/stash", "--all", "--not", "--remotes", "--"]);
    match g.run(&log) {
        Ok(o) if o.status.success() => {
            let mut commits: Vec<String> = String::from_utf8_lossy(&o.stdout).lines().map(str::to_string).collect();
            if commits.len() > MAX_COMMITS {
                commits.truncate(MAX_COMMITS);
                fact.more = true;
            }
            fact.unpushed = commits;
        }
        Ok(o) => {
            fact.uncheckable.get_or_insert(format!("git log of its commits failed: {}", super::detail(&o)));
        }
        Err(e) => {
            fact.uncheckable.get_or_insert(format!("git log of its commits failed: {}", e.detail));
        }
    }
    match g.run(&with(&["rev-parse", "--verify", "--quiet", "refs/stash"])) {
        Ok(o) if o.status.success() => {
            let id = String::from_utf8_lossy(trim_nl(&o.stdout)).into_owned();
            let mut entries: Vec<String> =
                match g.run(&with(&["reflog", "show", "--format=%gd %H %gs", "refs/stash", "--"])) {
                    Ok(r) if r.status.success() => {
                        String::from_utf8_lossy(&r.stdout).lines().map(str::to_string).collect()
                    }
                    _ => Vec::new(),
                };
            if entries.is_empty() {
                entries.push(format!("refs/stash {id}"));
            }
            fact.stashes = entries;
        }
        Ok(o) if o.status.code() == Some(1) => {}
        Ok(o) => {
            fact.uncheckable.get_or_insert(format!("git rev-parse refs/stash failed: {}", super::detail(&o)));
        }
        Err(e) => {
            fact.uncheckable.get_or_insert(format!("git rev-parse refs/stash failed: {}", e.detail));
        }
    }
}

/// Check 8, second half (A44): the worktree's HEAD and every commit its HEAD reflog names (the
/// reflog starts when the worktree was made) must be reachable from some ref. Asked in the control
/// root with `--glob=*`, so no worktree's HEAD counts as a ref; objects already gone are skipped.
fn unreachable(
    ctx: &Ctx,
    repo: &Repo,
    entry: &Entry,
    admin: Option<&Path>,
    deadline: Instant,
) -> Result<Vec<String>, String> {
    let mut commits: Vec<String> = entry.head.iter().cloned().collect();
    if let Some(log) = admin.map(|a| a.join("logs").join("HEAD")) {
        if let Ok(text) = std::fs::read(&log) {
            for line in text.split(|b| *b == b'\n') {
                let mut words = line.split(|b| *b == b' ');
                let (_, Some(new)) = (words.next(), words.next()) else { continue };
                let new = String::from_utf8_lossy(new).into_owned();
                if new.len() >= 40 && new.bytes().all(|b| b.is_ascii_hexdigit()) && !new.bytes().all(|b| b == b'0') {
                    commits.push(new);
                }
            }
        }
    }
    commits.retain(|c| c.len() >= 40 && c.bytes().all(|b| b.is_ascii_hexdigit()) && !c.bytes().all(|b| b == b'0'));
    crate::sort::natural(&mut commits);
    commits.dedup();
    if commits.is_empty() {
        return Ok(Vec::new());
    }
    let mut args: Vec<String> = vec!["rev-list".into(), "--ignore-missing".into()];
    args.extend(commits.iter().cloned());
    args.extend(["--not".into(), "--glob=*".into(), "--".into()]);
    let mut g = git(ctx, &repo.root, deadline);
    let out = g.run(&args).map_err(|e| run_error(&repo.root, e))?;
    if !out.status.success() {
        return Err(super::detail(&out));
    }
    let listed: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect();
    // Name the tips (HEAD and reflog commits) first; their ancestors follow from them.
    let mut tips: Vec<String> = commits.iter().filter(|c| listed.contains(c)).cloned().collect();
    if tips.is_empty() {
        tips = listed;
    }
    Ok(tips)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn linked() -> Facts {
        Facts::empty(PathBuf::from("/w"), Linked::Linked { locked: None })
    }

    fn names(f: &[Finding]) -> String {
        tokens(f)
    }

    #[test]
    fn a_clean_linked_worktree_has_no_finding_and_a_plain_method() {
        let mut f = linked();
        f.status = Some(Ok(vec![]));
        let (found, m) = judge(&f, false, false);
        assert!(found.is_empty(), "{found:?}");
        assert_eq!(m, Method::Plain);
        f.submodule_state = true;
        assert_eq!(judge(&f, false, false).1, Method::Force);
    }

    #[test]
    fn check_one_cells() {
        let f = Facts::empty(PathBuf::from("/w"), Linked::NotFound("x".into()));
        assert_eq!(
            judge(&f, false, false),
            (vec![Finding { token: Token::NotLinked, subject: "/w".into(), evidence: "x".into() }], Method::None)
        );
        let f = Facts::empty(PathBuf::from("/w"), Linked::NoRepo("no".into()));
        assert_eq!(names(&judge(&f, false, false).0), "not-linked");
        let f = Facts::empty(PathBuf::from("/w"), Linked::Main);
        assert_eq!(names(&judge(&f, false, false).0), "main-worktree");
        let f = Facts::empty(PathBuf::from("/w"), Linked::Linked { locked: Some(String::new()) });
        let (found, m) = judge(&f, false, false);
        assert_eq!((names(&found).as_str(), m), ("locked", Method::Plain));
    }

    #[test]
    fn running_sessions_and_their_task_jobs_pass_only_the_first_look_of_a_stop() {
        let mut f = linked();
        f.sessions = vec![SessionFact { name: "s".into(), running: true }];
        let job = |kind: &str| JobFact {
            id: format!("j-{kind}"),
            session: "s".into(),
            kind: kind.into(),
            status: "running".into(),
            session_running: true,
        };
        f.jobs = vec![job("task")];
        assert_eq!(names(&judge(&f, false, false).0), "sessions-running,open-jobs");
        assert_eq!(names(&judge(&f, true, false).0), "none");
        f.jobs.push(job("loop"));
        assert_eq!(names(&judge(&f, true, false).0), "open-jobs");
        f.sessions[0].running = false;
        f.jobs = vec![JobFact { session_running: false, ..job("task") }];
        assert_eq!(names(&judge(&f, true, false).0), "open-jobs");
    }

    #[test]
    fn every_token_in_check_order_each_once() {
        let mut f = Facts::empty(PathBuf::from("/w"), Linked::Linked { locked: Some("x".into()) });
        f.sessions_error = Some("bad".into());
        f.jobs = vec![JobFact {
            id: "j".into(),
            session: "s".into(),
            kind: "loop".into(),
            status: "pending".into(),
            session_running: false,
        }];
        f.status = Some(Ok(vec!["?? a".into()]));
        f.ignored = Ok(vec![IgnoredEntry { path: ".env".into(), dir: false, symlink: false }]);
        let r = |p: &str| RepoFact {
            path: p.into(),
            dirty: vec!["!! x".into()],
            unpushed: vec!["c1 s".into()],
            more: false,
            stashes: vec!["stash@{0}".into()],
            uncheckable: Some("partial".into()),
        };
        f.submodules = vec![r("/w/a"), r("/w/b")];
        f.modules = vec![r("/m/a")];
        f.loops = vec![LoopFact { id: "0123abcd".into(), source: "/w".into() }];
        f.unreachable = Ok(vec!["c".into()]);
        let (found, _) = judge(&f, false, false);
        assert_eq!(
            tokens(&found),
            "locked,sessions-running,open-jobs,dirty,ignored,submodule-dirty,unpushed,stashes,uncheckable-repo,loop-active,unreachable-head"
        );
        let mut sorted = found.clone();
        sorted.sort_by_key(|f| f.token);
        assert_eq!(found, sorted);
        f.status = Some(Err("gone".into()));
        assert!(tokens(&judge(&f, false, false).0).contains("status-failed"));
        f.unreachable = Err("git failed".into());
        assert!(tokens(&judge(&f, false, false).0).ends_with("unreachable-head"));
    }

    /// Issue 29: an ignored entry is unsaved work unless it is a wholly ignored directory (or a
    /// link) with a regenerable name; `--discard-ignored` lets them all go; each is its own finding.
    #[test]
    fn ignored_entries_cells() {
        let e = |path: &str, dir: bool, symlink: bool| IgnoredEntry { path: path.into(), dir, symlink };
        for (entry, free) in [
            (e("notes.local", false, false), false),
            (e(".env", false, false), false),
            (e(".mam.env", false, false), false),
            (e(".venv/", true, false), true),
            (e(".venv", false, true), true),
            (e("sub/node_modules/", true, false), true),
            (e("target/", true, false), true),
            (e("target/x.o", false, false), false),
            (e("target", false, false), false),
            (e("cache/", true, false), false),
            (e("notes", false, true), false),
            (e("build.log/", true, false), false),
        ] {
            assert_eq!(regenerable(&entry), free, "{entry:?}");
        }
        let mut f = linked();
        f.status = Some(Ok(vec![]));
        f.ignored = Ok(vec![e("notes.local", false, false), e(".venv/", true, false), e("keep/", true, false)]);
        let (found, _) = judge(&f, false, false);
        let lines: Vec<String> = found.iter().map(Finding::line).collect();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].starts_with("FINDING=ignored /w/notes.local: a file git ignores"), "{lines:?}");
        assert!(lines[1].starts_with("FINDING=ignored /w/keep: a directory git ignores"), "{lines:?}");
        assert_eq!(names(&judge(&f, false, true).0), "none");
        f.ignored = Ok((0..MAX_IGNORED_SHOWN + 2).map(|i| e(&format!("f{i}"), false, false)).collect());
        let (found, _) = judge(&f, false, false);
        assert_eq!(found.len(), MAX_IGNORED_SHOWN + 1);
        assert!(found[MAX_IGNORED_SHOWN].line().starts_with("FINDING=ignored /w: 2 more ignored entries not shown"));
        f.ignored = Err("boom".into());
        assert_eq!(names(&judge(&f, false, false).0), "status-failed");
        assert_eq!(names(&judge(&f, false, true).0), "none");
    }

    #[test]
    fn a_finding_line_names_path_evidence_and_advice() {
        let f = Finding { token: Token::Stashes, subject: "/w/sub".into(), evidence: "stash@{0}: WIP\non x".into() };
        assert_eq!(
            f.line(),
            "FINDING=stashes /w/sub: stash@{0}: WIP\\non x; apply or drop the stash entries (git stash list), or push them as a branch"
        );
    }
}
