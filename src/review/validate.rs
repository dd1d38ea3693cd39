//! `mam loop`'s validation (ORCH 4.2): the command line, the task and plan files, the sessions, the
//! source root, the base and the admission of remote reviewers, checked before the lock, as a list of
//! checks in the order of their errors. It never locks, writes or delegates: an error here starts
//! nothing (`LoopError::Invalid`, exit 2; `Failed` when the control plane cannot be resolved).

use std::path::{Path, PathBuf};

use super::git;
use crate::ctx::Ctx;
use crate::paths;
use crate::session;
use crate::sys;
use crate::text::{one_line, show_path};

/// The largest task or plan file the loop takes.
pub const MAX_TASK_BYTES: u64 = 1024 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    Tree,
    Env,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteReview {
    Refuse,
    DiffOnly,
}

/// A validated command line (the env knobs already read by the command layer).
#[derive(Debug, Clone)]
pub struct Options {
    pub creator: String,
    pub reviewers: Vec<String>,
    pub task_file: Option<PathBuf>,
    pub plan: bool,
    pub plan_file: Option<PathBuf>,
    pub max_rounds: u32,
    pub worktree: Option<PathBuf>,
    /// `--worktree` came from `MAM_LOOP_WORKTREE`.
    pub worktree_from_env: bool,
    pub base: Option<String>,
    pub review_only: bool,
    pub isolation: Option<Isolation>,
    pub remote_review: Option<RemoteReview>,
    /// 0 = none (A41).
    pub wall_clock_s: u32,
    pub job_timeout_s: u32,
    /// 0 = off.
    pub stall_s: u32,
    pub registry_dir: Option<PathBuf>,
    pub diff_max: u32,
    pub heartbeat_sec: u32,
    pub heartbeat_misses: u32,
    pub ack_timeout_s: u32,
    /// The caller's job (`MAM_PARENT_JOB_ID`, read once by the command layer): every delegation
    /// gets it as `--parent`, and no child inherits the variable (4.3).
    pub parent: Option<String>,
}

/// Why a loop did not start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoopError {
    /// Validation (4.2): exit 2, nothing locked or delegated.
    Invalid(String),
    /// Another loop holds the creator's lock: exit 3.
    Busy(String),
    /// The control plane could not be prepared: exit 1.
    Failed(String),
}

impl std::fmt::Display for LoopError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoopError::Invalid(m) | LoopError::Busy(m) | LoopError::Failed(m) => f.write_str(m),
        }
    }
}

/// Everything validation established (4.2).
pub(super) struct Plan {
    pub(super) control: PathBuf,
    pub(super) source: PathBuf,
    pub(super) resolved: paths::Resolved,
    pub(super) task: Option<String>,
    pub(super) plan_file: Option<PathBuf>,
    /// (full sha, where it came from) when pinned.
    pub(super) base: Option<(String, String)>,
    pub(super) remote: Vec<String>,
    pub(super) isolation: Isolation,
}

fn invalid(msg: impl std::fmt::Display) -> LoopError {
    LoopError::Invalid(format!("loop: {}", one_line(&msg.to_string())))
}

/// Reads a task or plan file: present, non-empty, UTF-8 text without NUL, at most 1 MiB.
fn read_text_file(flag: &str, path: &Path) -> Result<String, LoopError> {
    // The user's own input: a symlink to it is followed (only writes never follow one).
    let bytes = read_following(path, MAX_TASK_BYTES).map_err(|e| {
        invalid(format!("{flag} {}: cannot read ({e}); give an existing text file of at most 1 MiB", show_path(path)))
    })?;
    if bytes.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(invalid(format!("{flag} {}: the file is empty", show_path(path))));
    }
    if bytes.contains(&0) {
        return Err(invalid(format!("{flag} {}: a binary file (NUL bytes); give a text file", show_path(path))));
    }
    String::from_utf8(bytes)
        .map_err(|_| invalid(format!("{flag} {}: not UTF-8 text; give a text file", show_path(path))))
}

/// 4.2's checks of the command line alone, in the order they are made: the first that holds is the
/// refusal, with its text.
type FlagCheck = (fn(&Options) -> bool, &'static str);
const FLAG_CHECKS: &[FlagCheck] = &[
    (|o| o.max_rounds < 1, "--max-rounds must be at least 1"),
    (|o| o.review_only && o.base.is_none(), "--review-only needs --base REF (the commit the review starts from)"),
    (
        |o| o.review_only && (o.plan || o.plan_file.is_some()),
        "--review-only reviews an existing change: it takes neither --plan nor --plan-file",
    ),
    (|o| o.plan && o.plan_file.is_some(), "give --plan (write a plan) or --plan-file PATH (use this plan), not both"),
    (|o| !o.review_only && o.task_file.is_none(), "--task-file PATH is required (unless --review-only)"),
    (
        |o| !pinned(o) && o.isolation.is_some(),
        "--review-isolation needs --worktree or --base (an unpinned loop has no review tree)",
    ),
    (
        |o| !pinned(o) && o.remote_review.is_some(),
        "--remote-review needs --worktree or --base (a remote reviewer sees only a pinned diff)",
    ),
];

/// `--worktree` or `--base`: the loop reviews a pinned snapshot (4.6).
fn pinned(o: &Options) -> bool {
    o.worktree.is_some() || o.base.is_some()
}

/// Validation (4.2): every check before the lock, each its own step in the order of its errors.
pub(super) fn validate(ctx: &Ctx, o: &Options) -> Result<Plan, LoopError> {
    if let Some((_, msg)) = FLAG_CHECKS.iter().find(|(bad, _)| bad(o)) {
        return Err(invalid(msg));
    }
    check_reviewer_names(o)?;
    let task = match &o.task_file {
        Some(p) => Some(read_text_file("--task-file", &sys::absolutize(ctx.cwd(), p))?),
        None => None,
    };
    let plan_file = match &o.plan_file {
        Some(p) => {
            let abs = sys::absolutize(ctx.cwd(), p);
            read_text_file("--plan-file", &abs)?;
            Some(abs)
        }
        None => None,
    };
    let resolved = paths::resolve(ctx, o.registry_dir.as_deref()).map_err(|e| LoopError::Failed(e.to_string()))?;
    let control = resolved.control_root.clone();
    let remote = check_sessions(&resolved, o)?;
    let source = source_root(ctx, o, &control)?;
    let base = base_commit(ctx, o, &source, &control)?;
    admit_remote(o, &remote, base.is_some())?;
    Ok(Plan {
        control,
        source,
        resolved,
        task,
        plan_file,
        base,
        remote,
        isolation: o.isolation.unwrap_or(Isolation::Tree),
    })
}

/// The reviewers: not the creator, none twice.
fn check_reviewer_names(o: &Options) -> Result<(), LoopError> {
    let mut seen = Vec::new();
    for r in &o.reviewers {
        if *r == o.creator {
            return Err(invalid(format!(
                "the creator {r} is also listed as a reviewer; without --reviewer it reviews itself"
            )));
        }
        if seen.contains(r) {
            return Err(invalid(format!("reviewer {r} is listed twice")));
        }
        seen.push(r.clone());
    }
    Ok(())
}

/// Sessions: the creator local and running; reviewers known, local ones running. Returns the remote
/// reviewers.
fn check_sessions(resolved: &paths::Resolved, o: &Options) -> Result<Vec<String>, LoopError> {
    let doc = session::load(&resolved.sessions).map_err(|e| invalid(e.to_string()))?;
    let sessions = show_path(&resolved.sessions);
    let Some(c) = doc.row(&o.creator) else {
        return Err(invalid(format!("unknown session '{}' (no row in {sessions})", one_line(&o.creator))));
    };
    if c.remote() {
        return Err(invalid(format!(
            "the creator {} is a remote session; the creator must be a local session",
            c.name
        )));
    }
    if !c.running() {
        return Err(invalid(format!("the creator {} is {}, not running", c.name, c.status)));
    }
    let mut remote = Vec::new();
    for r in &o.reviewers {
        let Some(row) = doc.row(r) else {
            return Err(invalid(format!("unknown session '{}' (no row in {sessions})", one_line(r))));
        };
        if row.remote() {
            remote.push(r.clone());
        } else if !row.running() {
            return Err(invalid(format!("reviewer {r} is {}, not running", row.status)));
        }
    }
    Ok(remote)
}

/// The source root: `--worktree` (the top level of a worktree of the control root's repository),
/// else the control root.
fn source_root(ctx: &Ctx, o: &Options, control: &Path) -> Result<PathBuf, LoopError> {
    let Some(w) = &o.worktree else { return Ok(control.to_path_buf()) };
    let from = if o.worktree_from_env { "MAM_LOOP_WORKTREE" } else { "--worktree" };
    let w = sys::absolutize(ctx.cwd(), w);
    if !w.is_dir() {
        return Err(invalid(format!("{from} {}: no such directory", show_path(&w))));
    }
    let real = w.canonicalize().map_err(|e| invalid(format!("{from} {}: {e}", show_path(&w))))?;
    let top = git::toplevel(ctx, &real)
        .map_err(|e| invalid(format!("{from} {}: not a git worktree ({e})", show_path(&w))))?;
    if top != real {
        return Err(invalid(format!(
            "{from} {}: not the top level of its worktree (that is {})",
            show_path(&w),
            show_path(&top)
        )));
    }
    let mine = git::common_dir(ctx, &real).map_err(|e| invalid(format!("{from} {}: {e}", show_path(&w))))?;
    let theirs = git::common_dir(ctx, control)
        .map_err(|e| invalid(format!("the control root {} is not a git repository ({e})", show_path(control))))?;
    if mine != theirs {
        return Err(invalid(format!(
            "{from} {}: a worktree of another repository (git dir {}, the control root's is {})",
            show_path(&w),
            show_path(&mine),
            show_path(&theirs)
        )));
    }
    Ok(real)
}

/// The base: `--base` (a commit that is an ancestor of the source's HEAD), else with `--worktree`
/// the merge-base of the two HEADs, else none. (full sha, where it came from).
fn base_commit(ctx: &Ctx, o: &Options, source: &Path, control: &Path) -> Result<Option<(String, String)>, LoopError> {
    match (&o.base, &o.worktree) {
        (Some(b), _) => {
            let sha = git::resolve_commit(ctx, source, b).map_err(|e| {
                invalid(format!("--base '{}': not a commit of {} ({e})", one_line(b), show_path(source)))
            })?;
            let head = git::head(ctx, source).map_err(|e| invalid(format!("{}: {e}", show_path(source))))?;
            match git::is_ancestor(ctx, source, &sha, &head) {
                Ok(true) => {}
                Ok(false) => {
                    return Err(invalid(format!(
                        "--base '{}' ({sha}) is not an ancestor of HEAD {head} of {}",
                        one_line(b),
                        show_path(source)
                    )))
                }
                Err(e) => return Err(invalid(format!("--base '{}': {e}", one_line(b)))),
            }
            Ok(Some((sha, format!("--base {}", one_line(b)))))
        }
        (None, Some(_)) => {
            let head = git::head(ctx, source).map_err(|e| invalid(format!("{}: {e}", show_path(source))))?;
            let chead = git::head(ctx, control).map_err(|e| invalid(format!("{}: {e}", show_path(control))))?;
            let mb = git::merge_base(ctx, source, &head, &chead).map_err(|e| {
                invalid(format!("no merge-base of the worktree and the control root ({e}); give --base"))
            })?;
            Ok(Some((mb, "merge-base of the worktree's HEAD and the control root's HEAD".to_string())))
        }
        (None, None) => Ok(None),
    }
}

/// A remote reviewer is admitted only with `--remote-review diff-only` and a base; diff-only without
/// a base is refused either way.
fn admit_remote(o: &Options, remote: &[String], has_base: bool) -> Result<(), LoopError> {
    let diff_only = o.remote_review == Some(RemoteReview::DiffOnly);
    if diff_only && !has_base {
        return Err(invalid("--remote-review diff-only needs a base (--base or --worktree)"));
    }
    match remote.first() {
        Some(r) if !diff_only => Err(invalid(format!(
            "reviewer {r} is a remote session; a remote reviewer sees no checkout: admit it with \
             --remote-review diff-only"
        ))),
        _ => Ok(()),
    }
}

/// Reads a regular file of at most `max` bytes, following symlinks; longer is an error.
fn read_following(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let f = std::fs::File::open(path)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut out = Vec::new();
    f.take(max + 1).read_to_end(&mut out)?;
    if out.len() as u64 > max {
        return Err(std::io::Error::other(format!("longer than {max} bytes")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> Options {
        Options {
            creator: "c".into(),
            reviewers: vec!["r1".into(), "r2".into()],
            task_file: Some("task.md".into()),
            plan: false,
            plan_file: None,
            max_rounds: 3,
            worktree: None,
            worktree_from_env: false,
            base: None,
            review_only: false,
            isolation: None,
            remote_review: None,
            wall_clock_s: 0,
            job_timeout_s: 0,
            stall_s: 0,
            registry_dir: None,
            diff_max: 0,
            heartbeat_sec: 30,
            heartbeat_misses: 4,
            ack_timeout_s: 0,
            parent: None,
        }
    }

    fn first_refusal(o: &Options) -> Option<&'static str> {
        FLAG_CHECKS.iter().find(|(bad, _)| bad(o)).map(|(_, msg)| *msg)
    }

    /// Each flag check refuses its own case; where two apply, the earlier one's text wins.
    #[test]
    fn flag_checks_refuse_each_case_in_order() {
        assert_eq!(first_refusal(&options()), None);
        type Case = (fn(&mut Options), &'static str);
        let cases: [Case; 7] = [
            (|o| o.max_rounds = 0, "--max-rounds must be at least 1"),
            (|o| o.review_only = true, "--review-only needs --base"),
            (
                |o| {
                    o.review_only = true;
                    o.base = Some("HEAD".into());
                    o.plan = true;
                },
                "--review-only reviews an existing change",
            ),
            (
                |o| {
                    o.plan = true;
                    o.plan_file = Some("p.md".into());
                },
                "give --plan (write a plan) or --plan-file",
            ),
            (|o| o.task_file = None, "--task-file PATH is required"),
            (|o| o.isolation = Some(Isolation::Env), "--review-isolation needs --worktree or --base"),
            (|o| o.remote_review = Some(RemoteReview::DiffOnly), "--remote-review needs --worktree or --base"),
        ];
        for (i, (change, want)) in cases.iter().enumerate() {
            let mut o = options();
            change(&mut o);
            let got = first_refusal(&o).unwrap_or("none");
            assert!(got.starts_with(want), "case {i}: {got}");
        }
        // Two at once: --max-rounds 0 is said before the missing task file.
        let mut o = options();
        o.max_rounds = 0;
        o.task_file = None;
        assert_eq!(first_refusal(&o), Some("--max-rounds must be at least 1"));
        // Pinned, the isolation and remote-review flags pass.
        let mut o = options();
        o.base = Some("HEAD".into());
        o.isolation = Some(Isolation::Env);
        o.remote_review = Some(RemoteReview::DiffOnly);
        assert_eq!(first_refusal(&o), None);
    }

    /// Remote reviewers (none, one) x --remote-review (none, refuse, diff-only) x base (no, yes).
    #[test]
    fn admit_remote_walks_every_cell() {
        let mut got = Vec::new();
        for remote in [vec![], vec!["far".to_string()]] {
            for mode in [None, Some(RemoteReview::Refuse), Some(RemoteReview::DiffOnly)] {
                for base in [false, true] {
                    let o = Options { remote_review: mode, ..options() };
                    got.push(match admit_remote(&o, &remote, base) {
                        Ok(()) => "ok".to_string(),
                        Err(e) => e.to_string().split(';').next().unwrap_or_default().to_string(),
                    });
                }
            }
        }
        let needs_base = "loop: --remote-review diff-only needs a base (--base or --worktree)";
        let remote = "loop: reviewer far is a remote session";
        assert_eq!(
            got,
            [
                "ok", "ok", "ok", "ok", needs_base, "ok", // no remote reviewer
                remote, remote, remote, remote, needs_base, "ok", // one remote reviewer
            ]
        );
    }
}
