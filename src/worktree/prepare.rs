//! `mam worktree prepare` (ORCH 5.1, A43): a linked worktree of the control root's repository for
//! one branch, at `<parent of control root>/<control root name>-<branch slug>` unless `--path`
//! says otherwise; reused when it is already there; the `.venv` link and the two shared
//! `info/exclude` lines; `--submodules` with a rollback limited to what the failed attempt itself
//! did (its submodules deinitialised before their git directories go, the shared `submodule.*`
//! configuration restored key by key); `--creator` starting a session in the worktree.
//!
//! Every refusal comes before the first change. It never prints; it never deletes a branch, a
//! submodule it did not initialise, or a file that was there before the attempt.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::io::Write as _;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::{canon, git, git_ok, is_within, repo, run_error, trim_nl, worktrees, Repo, WorktreeError, PREPARE_BUDGET};
use crate::agents;
use crate::ctx::Ctx;
use crate::git::Git;
use crate::pane;
use crate::paths;
use crate::review::git as rgit;
use crate::session::create::{create, CreateArgs, Onboard};
use crate::session::{self, Notes, Row};
use crate::sys;
use crate::text::{one_line, show_path};

/// Validated arguments of `mam worktree prepare`.
#[derive(Debug, Clone, Default)]
pub struct PrepareArgs {
    pub branch: String,
    pub path: Option<PathBuf>,
    pub base: Option<String>,
    pub submodules: bool,
    /// The agent kind of `--creator`.
    pub creator: Option<String>,
    pub name: Option<String>,
    pub onboard: bool,
    pub label: Option<String>,
    pub agent_args: Vec<String>,
}

/// What `prepare` did: stdout lines (also when it failed after the worktree was made, so the
/// caller still learns where it is), and the error, if any.
#[derive(Debug, Default)]
pub struct Prepared {
    pub lines: Vec<String>,
    pub error: Option<WorktreeError>,
}

/// The lines `info/exclude` gets once (ORCH 5.1).
pub const EXCLUDE_LINES: [&str; 2] = ["/.venv", ".pytest_cache/"];

/// The branch with every character outside `[A-Za-z0-9._-]` replaced by `-` (A43).
pub fn slug(branch: &str) -> String {
    branch.chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '-' }).collect()
}

/// `<parent of control root>/<control root name>-<branch slug>` (ORCH 5.1, decided).
pub fn default_path(root: &Path, branch: &str) -> PathBuf {
    let name = root.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    root.parent().unwrap_or(Path::new("/")).join(format!("{name}-{}", slug(branch)))
}

fn has_control_char(p: &Path) -> bool {
    p.as_os_str().as_bytes().iter().any(|b| *b < 0x20 || *b == 0x7f)
}

/// The whole of 5.1.
pub fn prepare(ctx: &Ctx, a: &PrepareArgs, notes: &mut Notes, onboard: Onboard<'_>) -> Prepared {
    let mut out = Prepared::default();
    match run(ctx, a, notes, onboard, &mut out.lines) {
        Ok(()) => {}
        Err(e) => out.error = Some(e),
    }
    out
}

/// What was decided before the first change.
struct Plan {
    repo: Repo,
    sessions: PathBuf,
    path: PathBuf,
    base: String,
    /// `None`: a new branch from `base`; `Some(reused)`: the branch exists, `reused` when the
    /// worktree is already there.
    existing: Option<bool>,
}

fn run(
    ctx: &Ctx,
    a: &PrepareArgs,
    notes: &mut Notes,
    onboard: Onboard<'_>,
    lines: &mut Vec<String>,
) -> Result<(), WorktreeError> {
    let deadline = Instant::now() + PREPARE_BUDGET;
    let plan = decide(ctx, a, notes, deadline)?;
    let root = &plan.repo.root;
    let branch = &a.branch;
    match plan.existing {
        Some(true) => {
            notes.note(format!("worktree {} of branch {branch} already exists; reused", show_path(&plan.path)))
        }
        Some(false) => {
            let path = plan.path.as_os_str();
            git_ok(
                &mut git(ctx, root, deadline),
                &[OsStr::new("worktree"), "add".as_ref(), "--".as_ref(), path, branch.as_ref()],
            )
            .map_err(|e| WorktreeError::Failed(format!("cannot add the worktree: {e}")))?;
        }
        None => {
            let args: [&OsStr; 7] = [
                "worktree".as_ref(),
                "add".as_ref(),
                "-b".as_ref(),
                branch.as_ref(),
                "--".as_ref(),
                plan.path.as_os_str(),
                plan.base.as_ref(),
            ];
            git_ok(&mut git(ctx, root, deadline), &args)
                .map_err(|e| WorktreeError::Failed(format!("cannot add the worktree: {e}")))?;
        }
    }
    let wt = plan
        .path
        .canonicalize()
        .map_err(|e| WorktreeError::Failed(format!("worktree {} made but not readable: {e}", show_path(&plan.path))))?;
    link_venv(root, &wt, notes);
    if let Err(e) = exclude_lines(&plan.repo.common) {
        notes.warn(format!("info/exclude of {} not updated: {e}", show_path(&plan.repo.common)));
    }
    if a.submodules {
        submodules(ctx, &plan.repo, &wt, deadline, notes)?;
    }
    lines.push(format!("WORKTREE={}", wt.to_string_lossy()));
    lines.push(format!("BRANCH={branch}"));
    lines.push(format!("BASE={}", plan.base));
    if let Some(kind) = &a.creator {
        lines.extend(creator(ctx, a, kind, &plan.sessions, &wt, notes, onboard)?);
    }
    Ok(())
}

/// Every check of 5.1 that can refuse, before anything is changed.
fn decide(ctx: &Ctx, a: &PrepareArgs, notes: &mut Notes, deadline: Instant) -> Result<Plan, WorktreeError> {
    let usage = WorktreeError::Usage;
    if let Some(kind) = &a.creator {
        if agents::adapter(kind).is_none() {
            return Err(usage(format!(
                "unknown agent kind '{}' (known: {})",
                one_line(kind),
                agents::kinds().join(", ")
            )));
        }
    }
    if let Some(n) = &a.name {
        if !pane::valid_name(n) {
            return Err(usage(format!("invalid session name '{}' (expected [a-z][a-z0-9_-]{{0,31}})", one_line(n))));
        }
    }
    let resolved = paths::resolve(ctx, None).map_err(|e| WorktreeError::Failed(e.to_string()))?;
    let repo = repo(ctx, &resolved.control_root).map_err(usage)?;
    let root = repo.root.clone();
    let branch = &a.branch;
    if branch.is_empty() || branch.starts_with('-') || branch.contains('\0') {
        return Err(usage(format!("'{}' is not a branch name", one_line(branch))));
    }
    let mut g = git(ctx, &root, deadline);
    let ok = g
        .run(&["check-ref-format", &format!("refs/heads/{branch}")])
        .map_err(|e| WorktreeError::Failed(run_error(&root, e)))?;
    if !ok.status.success() {
        return Err(usage(format!("'{}' is not a valid branch name (git check-ref-format)", one_line(branch))));
    }
    let path = match &a.path {
        Some(p) => sys::normalize(&sys::absolutize(ctx.cwd(), p)),
        None => default_path(&root, branch),
    };
    if has_control_char(&path) {
        return Err(usage(format!("path {} has a control character", show_path(&path))));
    }
    let real = canon(&path);
    if is_within(&real, &root) {
        return Err(usage(format!("path {} is inside the control root {}", show_path(&path), show_path(&root))));
    }
    let base_ref = a.base.as_deref().unwrap_or("HEAD");
    let base_commit = rgit::resolve_commit(ctx, &root, base_ref).map_err(|e| usage(format!("--base: {e}")))?;
    let list = worktrees(ctx, &root, deadline).map_err(WorktreeError::Failed)?;
    let refname = format!("refs/heads/{branch}");
    let exists = g
        .run(&["show-ref", "--verify", "--quiet", &refname])
        .map_err(|e| WorktreeError::Failed(run_error(&root, e)))?
        .status
        .success();
    let refused = WorktreeError::Refused;
    let gone =
        |e: &super::Entry| if e.prunable.is_some() { "; its directory is gone: run `git worktree prune`" } else { "" };
    let at_path = list.iter().find(|e| e.real == real);
    let of_branch = list.iter().find(|e| e.branch.as_deref() == Some(refname.as_str()));
    let reused = match (at_path, of_branch) {
        (Some(e), _) if e.branch.as_deref() == Some(refname.as_str()) => {
            if e.prunable.is_some() || !real.is_dir() {
                return Err(refused(format!(
                    "worktree {} of branch {branch} is registered but its directory is gone; run `git worktree prune`",
                    show_path(&path)
                )));
            }
            true
        }
        (Some(e), _) => {
            return Err(refused(format!(
                "path {} is the worktree of {}, not of branch {branch}",
                show_path(&path),
                if e.branch.is_some() { format!("branch {}", e.branch_name()) } else { "a detached HEAD".into() }
            )))
        }
        (None, Some(e)) => {
            return Err(refused(format!("branch {branch} is checked out at {}{}", show_path(&e.path), gone(e))))
        }
        (None, None) => {
            if let Ok(m) = std::fs::symlink_metadata(&path) {
                let what = if !m.is_dir() {
                    Some("exists and is not a directory")
                } else if std::fs::read_dir(&path).map(|mut d| d.next().is_some()).unwrap_or(true) {
                    Some("is a non-empty directory")
                } else {
                    None
                };
                if let Some(what) = what {
                    return Err(refused(format!(
                        "path {} {what}, not a worktree of branch {branch}",
                        show_path(&path)
                    )));
                }
            }
            false
        }
    };
    // A43: for an existing branch, BASE is its merge-base with the base ref, not a start point.
    let base = if exists {
        let mb = rgit::merge_base(ctx, &root, &refname, &base_commit).map_err(|e| usage(e.to_string()))?;
        if let Some(b) = &a.base {
            notes.warn(format!(
                "branch {branch} exists, so --base {} is not its start point; BASE={mb} is the merge-base of {branch} and {}",
                one_line(b),
                one_line(b)
            ));
        }
        mb
    } else {
        base_commit
    };
    Ok(Plan { repo, sessions: resolved.sessions, path, base, existing: exists.then_some(reused) })
}

/// `.venv` in the worktree becomes a link to the control root's, when that exists and the
/// worktree has none. A failure is a warning: the worktree is usable without it.
fn link_venv(root: &Path, wt: &Path, notes: &mut Notes) {
    let theirs = root.join(".venv");
    let ours = wt.join(".venv");
    if std::fs::symlink_metadata(&theirs).is_err() || std::fs::symlink_metadata(&ours).is_ok() {
        return;
    }
    if let Err(e) = std::os::unix::fs::symlink(&theirs, &ours) {
        notes.warn(format!("cannot link {} to {}: {e}", show_path(&ours), show_path(&theirs)));
    }
}

/// Appends the `EXCLUDE_LINES` missing from the shared `<common dir>/info/exclude`, in one write.
pub fn exclude_lines(common: &Path) -> std::io::Result<()> {
    let info = common.join("info");
    sys::create_dir_all(&info)?;
    let file = info.join("exclude");
    let text = match std::fs::read(&file) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e),
    };
    let have: Vec<&[u8]> = text.split(|b| *b == b'\n').map(|l| l.trim_ascii_end()).collect();
    let mut add = Vec::new();
    if !text.is_empty() && !text.ends_with(b"\n") {
        add.push(b'\n');
    }
    let missing: Vec<&str> = EXCLUDE_LINES.iter().copied().filter(|l| !have.contains(&l.as_bytes())).collect();
    if missing.is_empty() {
        return Ok(());
    }
    for l in missing {
        add.extend_from_slice(l.as_bytes());
        add.push(b'\n');
    }
    sys::open_append(&file)?.write_all(&add)
}

// ---------------------------------------------------------------------------------------------
// --submodules

/// The gitlinks of the worktree's index, in index order (paths relative to it).
fn gitlinks(g: &mut Git<'_>) -> Result<Vec<PathBuf>, String> {
    let out = git_ok(g, &["ls-files", "-s", "-z"])?;
    Ok(out
        .split(|b| *b == 0)
        .filter(|e| e.starts_with(b"160000 "))
        .filter_map(|e| e.iter().position(|b| *b == b'\t').map(|i| PathBuf::from(OsStr::from_bytes(&e[i + 1..]))))
        .collect())
}

/// Submodule path -> name from the worktree's `.gitmodules` (a path without an entry is its own name).
fn names(g: &mut Git<'_>) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let Ok(o) = g.run(&["config", "-z", "--file", ".gitmodules", "--get-regexp", r"^submodule\..*\.path$"]) else {
        return out;
    };
    for item in o.stdout.split(|b| *b == 0).filter(|i| !i.is_empty()) {
        let Some(nl) = item.iter().position(|b| *b == b'\n') else { continue };
        let key = String::from_utf8_lossy(&item[..nl]);
        if let Some(name) = key.strip_prefix("submodule.").and_then(|k| k.strip_suffix(".path")) {
            out.insert(PathBuf::from(OsStr::from_bytes(&item[nl + 1..])), name.to_string());
        }
    }
    out
}

/// Every `submodule.*` key of the shared config file with its values, in file order.
type Config = BTreeMap<String, Vec<OsString>>;

fn read_config(g: &mut Git<'_>, file: &Path) -> Result<Config, String> {
    let f = file.as_os_str();
    let o = g
        .run(&[
            OsStr::new("config"),
            "-z".as_ref(),
            "--file".as_ref(),
            f,
            "--get-regexp".as_ref(),
            r"^submodule\.".as_ref(),
        ])
        .map_err(|e| run_error(file, e))?;
    match o.status.code() {
        Some(0) | Some(1) => {}
        _ => return Err(format!("git config --file {}: {}", show_path(file), super::detail(&o))),
    }
    let mut out: Config = BTreeMap::new();
    for item in o.stdout.split(|b| *b == 0).filter(|i| !i.is_empty()) {
        let (k, v) = match item.iter().position(|b| *b == b'\n') {
            Some(i) => (&item[..i], OsStr::from_bytes(&item[i + 1..]).to_os_string()),
            None => (item, OsString::new()),
        };
        out.entry(String::from_utf8_lossy(k).into_owned()).or_default().push(v);
    }
    Ok(out)
}

/// `submodule.<name>` of a `submodule.<name>.<var>` key.
fn section(key: &str) -> &str {
    key.rfind('.').map(|i| &key[..i]).unwrap_or(key)
}

/// Puts the `submodule.*` keys of `file` back to `before`: keys the attempt added are deleted
/// (a section that had no key before goes whole, header included), changed values get their old
/// values. Returns what could not be restored.
fn restore_config(g: &mut Git<'_>, file: &Path, before: &Config) -> Vec<String> {
    let mut left = Vec::new();
    let after = match read_config(g, file) {
        Ok(c) => c,
        Err(e) => return vec![e],
    };
    if &after == before {
        return left;
    }
    let f = file.as_os_str();
    let mut run = |args: &[&OsStr]| {
        let mut full: Vec<&OsStr> = vec!["config".as_ref(), "--file".as_ref(), f];
        full.extend_from_slice(args);
        if let Err(e) = git_ok(g, &full) {
            left.push(e);
        }
    };
    let sections_before: Vec<&str> = before.keys().map(|k| section(k)).collect();
    let mut removed = Vec::new();
    for k in after.keys() {
        let s = section(k);
        if !sections_before.contains(&s) && !removed.contains(&s) {
            run(&["--remove-section".as_ref(), s.as_ref()]);
            removed.push(s);
        }
    }
    let keys: std::collections::BTreeSet<&String> = crate::sort::ordered(before.keys().chain(after.keys()));
    for k in keys {
        if removed.contains(&section(k)) || before.get(k) == after.get(k) {
            continue;
        }
        if after.contains_key(k) {
            run(&["--unset-all".as_ref(), k.as_ref()]);
        }
        for v in before.get(k).into_iter().flatten() {
            run(&["--add".as_ref(), k.as_ref(), v.as_os_str()]);
        }
    }
    left
}

fn is_empty_dir(p: &Path) -> bool {
    std::fs::read_dir(p).map(|mut d| d.next().is_none()).unwrap_or(false)
}

/// Removes what lies below `dir` (the directory itself stays, as a checkout leaves it), never
/// following a symlink.
fn clear_dir(dir: &Path) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        let m = std::fs::symlink_metadata(&p)?;
        if m.is_dir() {
            std::fs::remove_dir_all(&p)?;
        } else {
            std::fs::remove_file(&p)?;
        }
    }
    Ok(())
}

/// `--submodules`: each submodule not yet initialised is initialised and checked out, one at a
/// time (`git submodule update --init --recursive -- <path>`); on the first failure, the rollback.
fn submodules(ctx: &Ctx, repo: &Repo, wt: &Path, deadline: Instant, notes: &mut Notes) -> Result<(), WorktreeError> {
    let failed = WorktreeError::Failed;
    let mut g = git(ctx, wt, deadline);
    let gitdir = git_ok(&mut g, &["rev-parse", "--absolute-git-dir"]).map_err(failed)?;
    let modules = PathBuf::from(OsStr::from_bytes(trim_nl(&gitdir))).join("modules");
    let links = gitlinks(&mut g).map_err(failed)?;
    if links.is_empty() {
        notes.note(format!("worktree {} has no submodules", show_path(wt)));
        return Ok(());
    }
    let names = names(&mut g);
    let name_of = |p: &Path| names.get(p).cloned().unwrap_or_else(|| p.to_string_lossy().into_owned());
    // Before any change: an uninitialised path holding files would make a rollback unable to
    // tell the attempt's files from the user's (A43).
    let mut todo = Vec::new();
    for p in &links {
        let full = wt.join(p);
        if full.join(".git").exists() {
            continue;
        }
        match std::fs::symlink_metadata(&full) {
            Err(_) => {}
            Ok(m) if m.is_dir() && is_empty_dir(&full) => {}
            Ok(_) => {
                return Err(WorktreeError::Refused(format!(
                    "submodule path {} is not initialised but already holds files; move them away first",
                    show_path(&full)
                )))
            }
        }
        todo.push(p.clone());
    }
    if todo.is_empty() {
        notes.note("every submodule is initialised already; left as it is");
        return Ok(());
    }
    let config = repo.common.join("config");
    let before = read_config(&mut g, &config).map_err(failed)?;
    let modules_existed = modules.exists();
    let existed: Vec<bool> = todo.iter().map(|p| modules.join(name_of(p)).exists()).collect();
    for p in &todo {
        // `--checkout` overrides a `submodule.<name>.update` the configuration sets (`!command` runs
        // a shell command).
        let mut args: Vec<OsString> =
            ["submodule", "update", "--init", "--checkout", "--recursive", "--"].map(OsString::from).to_vec();
        args.push(p.as_os_str().to_os_string());
        if let Err(e) = git_ok(&mut g, &args) {
            let what = format!("submodule {}: {e}", show_path(p));
            let report = rollback(&mut g, wt, &modules, modules_existed, &todo, &existed, &name_of, &config, &before);
            return Err(failed(format!("{what}; {report}")));
        }
    }
    Ok(())
}

/// The rollback of a failed `--submodules` attempt (ORCH 5.1, later fix wins): every submodule
/// whose git directory this attempt created is deinitialised, then loses its git directory; what
/// the attempt left below the paths it initialised goes (they were empty before: checked); the
/// shared config is restored; then `git status` says whether the checkout is usable.
#[allow(clippy::too_many_arguments)] // the attempt's whole before-state, passed once
fn rollback(
    g: &mut Git<'_>,
    wt: &Path,
    modules: &Path,
    modules_existed: bool,
    todo: &[PathBuf],
    existed: &[bool],
    name_of: &dyn Fn(&Path) -> String,
    config: &Path,
    before: &Config,
) -> String {
    let mut left = Vec::new();
    let mut undone = Vec::new();
    for (p, was) in todo.iter().zip(existed) {
        let gitdir = modules.join(name_of(p));
        let full = wt.join(p);
        if *was {
            continue;
        }
        if gitdir.exists() || full.join(".git").exists() {
            let mut args: Vec<OsString> = ["submodule", "deinit", "--force", "--"].map(OsString::from).to_vec();
            args.push(p.as_os_str().to_os_string());
            // A deinit that fails (a half-made submodule) is followed by the same clean-up by hand.
            let _ = g.run(&args);
            undone.push(p.to_string_lossy().into_owned());
        }
        if full.is_dir() && !full.is_symlink() {
            if let Err(e) = clear_dir(&full) {
                left.push(format!("{} ({e})", show_path(&full)));
            }
        }
        if gitdir.exists() {
            if let Err(e) = std::fs::remove_dir_all(&gitdir) {
                left.push(format!("{} ({e})", show_path(&gitdir)));
            }
            // Names with slashes leave empty parents below modules/.
            let mut d = gitdir.parent();
            while let Some(dir) = d.filter(|d| d.starts_with(modules) && *d != modules) {
                if std::fs::remove_dir(dir).is_err() {
                    break;
                }
                d = dir.parent();
            }
        }
    }
    if !modules_existed && modules.is_dir() && is_empty_dir(modules) {
        let _ = std::fs::remove_dir(modules);
    }
    left.extend(restore_config(g, config, before));
    let status = g.run(&["status", "--porcelain"]);
    let usable = matches!(&status, Ok(o) if o.status.success());
    let undone = if undone.is_empty() { "none".to_string() } else { undone.join(", ") };
    let mut s =
        format!("rolled back the submodules this attempt initialised ({undone}) and the shared submodule config");
    if !left.is_empty() {
        s.push_str(&format!("; not undone: {}", left.join(", ")));
    }
    if usable {
        s.push_str("; git status works: the checkout is usable");
    } else {
        let why = match status {
            Ok(o) => super::detail(&o),
            Err(e) => e.detail,
        };
        s.push_str(&format!(
            "; git status fails ({}): look at {} and {}",
            one_line(&why),
            show_path(wt),
            show_path(modules)
        ));
    }
    s
}

// ---------------------------------------------------------------------------------------------
// --creator

/// A running row of this worktree is reused (A43); else `create` runs with the worktree as its
/// workspace, recorded in the control root's sessions file.
fn creator(
    ctx: &Ctx,
    a: &PrepareArgs,
    kind: &str,
    sessions: &Path,
    wt: &Path,
    notes: &mut Notes,
    onboard: Onboard<'_>,
) -> Result<Vec<String>, WorktreeError> {
    let kept = |why: String| {
        WorktreeError::Failed(format!(
            "session create failed ({}); the worktree is kept at {}",
            one_line(&why),
            show_path(wt)
        ))
    };
    let doc = session::load(sessions).map_err(|e| kept(e.to_string()))?;
    let fits = |r: &&Row| {
        r.running()
            && r.cwd().is_some_and(|c| session::same_dir(Path::new(c), wt))
            && match &a.name {
                Some(n) => r.name == *n,
                None => r.agent == kind,
            }
    };
    if let Some(r) = doc.herdr_sessions.iter().find(fits) {
        notes.note(format!("session {} already runs in {}; reused", r.name, show_path(wt)));
        let pane = r.pane.clone().unwrap_or_default();
        return Ok(vec![format!(
            "SESSION={} PANE={} WORKSPACE={} CWD={}",
            r.name,
            pane.id.unwrap_or_default(),
            pane.workspace_id.unwrap_or_default(),
            wt.to_string_lossy()
        )]);
    }
    let args = CreateArgs {
        kind: kind.to_string(),
        name: a.name.clone(),
        workspace: Some(wt.to_path_buf()),
        onboard: a.onboard,
        label: a.label.clone(),
        agent_args: a.agent_args.clone(),
    };
    create(ctx, &args, notes, onboard).map_err(|e| kept(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slug_replaces_everything_outside_the_set() {
        assert_eq!(slug("feat/x y"), "feat-x-y");
        assert_eq!(slug("a.b_c-D9"), "a.b_c-D9");
        assert_eq!(slug("ü"), "-");
        assert_eq!(default_path(Path::new("/w/repo"), "f/1"), PathBuf::from("/w/repo-f-1"));
    }

    #[test]
    fn section_of_a_key_keeps_dotted_names() {
        assert_eq!(section("submodule.a.b.url"), "submodule.a.b");
        assert_eq!(section("submodule.x.active"), "submodule.x");
    }
}
