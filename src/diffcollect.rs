//! The review loop's diff collector (ORCH 4.6, A40): the change set of a git repository from a base
//! commit to its working tree (untracked files included, ignored ones not) or to a head commit, as
//! one stable text, with the control-plane directories left out; and the byte cut of
//! `MAM_LOOP_DIFF_MAX_BYTES`.
//!
//! It runs the real `git` through `crate::git` (a cleared environment, every presentation setting
//! pinned on the command line, no hook, filter, external diff or textconv), so neither the caller's,
//! the user's nor the repository's git configuration changes the output or runs anything.
//! Untracked files are made visible through a temporary index (`GIT_INDEX_FILE` in a private temp
//! directory, removed afterwards): the repository's own index, status and refs are never written.
//! It never prints; the command layer renders `DiffError` as the UNAVAILABLE marker. `TempDir` and
//! `exclude_specs` are shared with `review::git`, one floor up.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::ctx::{ChildRole, Ctx};
use crate::git::{Git, RunError};
use crate::sys;
use crate::text::{one_line, show_path};

/// The default of `MAM_LOOP_DIFF_MAX_BYTES` (ORCH 4.1: 512 KiB, decided).
pub const DEFAULT_MAX_BYTES: u32 = 512 * 1024;

/// The output when the change set is empty (ORCH 4.9 test 4).
pub const NO_CHANGES: &str = "(no changes since base commit)\n";

/// How long one collection may take, all git runs together.
pub const BUDGET: Duration = Duration::from_secs(120);

/// What to collect: `head: None` is the two-argument form (base against the working tree).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The repository's top level (absolute).
    pub root: PathBuf,
    pub base: OsString,
    pub head: Option<OsString>,
    /// Absolute paths to leave out wherever they sit under `root` (the control root's `.mam/`, the
    /// registry, the audit-log root); those outside `root` are ignored.
    pub exclude: Vec<PathBuf>,
}

/// Why no diff could be collected. The display is the marker's reason: one line, naming the value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiffError {
    /// `root` is not the top level of a git working tree.
    NotRepo { root: PathBuf, detail: String },
    /// `base` or `head` does not name a commit of the repository.
    BadCommit { which: &'static str, value: String },
    /// git could not be run, timed out, or failed (`what` is the git command).
    Git { what: String, detail: String },
    /// The private temp directory for the temporary index.
    Temp { path: PathBuf, detail: String },
}

impl fmt::Display for DiffError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DiffError::NotRepo { root, detail } => {
                write!(f, "{}: not the top level of a git repository ({})", show_path(root), one_line(detail))
            }
            DiffError::BadCommit { which, value } => write!(f, "{which} '{}': not a commit", one_line(value)),
            DiffError::Git { what, detail } => write!(f, "{what}: {}", one_line(detail)),
            DiffError::Temp { path, detail } => {
                write!(f, "temporary index {}: {}", show_path(path), one_line(detail))
            }
        }
    }
}

/// Collects the diff of `req` (the format is docs/DESIGN.md's "diff-collect output").
pub fn collect(ctx: &Ctx, req: &Request) -> Result<Vec<u8>, DiffError> {
    let deadline = Instant::now() + BUDGET;
    let not_repo = |detail: String| DiffError::NotRepo { root: req.root.clone(), detail };
    if !req.root.is_dir() {
        return Err(not_repo("not a directory".into()));
    }
    let real = req.root.canonicalize().map_err(|e| not_repo(e.to_string()))?;
    let mut git = Git::new(ctx, real.clone(), deadline);
    let top = git.run_ok(&["rev-parse", "--show-toplevel"]).map_err(|e| not_repo(e.detail))?;
    let top = PathBuf::from(String::from_utf8_lossy(top.strip_suffix(b"\n").unwrap_or(&top)).into_owned());
    if top != real {
        return Err(not_repo(format!("its top level is {}", show_path(&top))));
    }
    let base = commit(&mut git, "base", &req.base)?;
    let head = match &req.head {
        Some(h) => Some(commit(&mut git, "head", h)?),
        None => None,
    };
    let excludes = exclude_specs(&real, &req.exclude);
    let (target, body, nested) = match &head {
        Some(h) => {
            let mut args = diff_args();
            args.extend([OsString::from(&base), OsString::from(h)]);
            (h.clone(), git.run_ok(&with_paths(args, &excludes))?, Vec::new())
        }
        None => {
            let tmp = TempDir::create(ctx, "mam-diff")?;
            git.index = Some(tmp.path.join("index"));
            let r = worktree_diff(&mut git, &base, &excludes, &tmp.path);
            git.index = None;
            drop(tmp);
            let (body, nested) = r?;
            ("WORKTREE".to_string(), body, nested)
        }
    };
    Ok(render(&base, &target, &body, &nested))
}

/// The output text: the header, git's diff, the nested repositories left out; or `NO_CHANGES`.
pub fn render(base: &str, target: &str, body: &[u8], nested: &[String]) -> Vec<u8> {
    if body.is_empty() && nested.is_empty() {
        return NO_CHANGES.as_bytes().to_vec();
    }
    let mut out = format!("# mam diff-collect: {base}..{target}\n").into_bytes();
    out.extend_from_slice(body);
    if !out.ends_with(b"\n") {
        out.push(b'\n');
    }
    for n in nested {
        out.extend_from_slice(format!("# untracked nested repository not shown: {n}\n").as_bytes());
    }
    out
}

/// The cut of `MAM_LOOP_DIFF_MAX_BYTES` (A40): output longer than `max` bytes keeps its first `max`
/// bytes, a newline if the cut fell inside a line, and the marker line.
pub fn limit(mut out: Vec<u8>, max: usize) -> Vec<u8> {
    if out.len() <= max {
        return out;
    }
    out.truncate(max);
    if !out.ends_with(b"\n") {
        out.push(b'\n');
    }
    out.extend_from_slice(format!("[mam diff TRUNCATED after {max} bytes]\n").as_bytes());
    out
}

/// `mam diff-collect <source> <base> <snapshot>` as the loop runs it, as a child (ORCH 4.6): which
/// binary, the control root it runs in, and the loop's own places the child must know.
#[derive(Debug, Clone, Copy)]
pub struct Child<'a> {
    /// The binary (the loop's frozen copy; `mam bench` runs itself).
    pub exe: &'a Path,
    /// The control root: the child's cwd and `WORKSPACE_ROOT`.
    pub control: &'a Path,
    pub source: &'a Path,
    pub base: &'a str,
    pub snapshot: &'a str,
    /// The loop's registry and audit-log root, wherever they are: the child leaves both out.
    pub registry: &'a Path,
    pub logs: &'a Path,
    /// The child's TMPDIR (its temporary index), `<loop dir>/tmp`, not the user's.
    pub tmp: &'a Path,
    /// `MAM_LOOP_DIFF_MAX_BYTES`.
    pub max_bytes: u32,
}

/// The child's command: a cleared environment with the caller's non-secret variables
/// (`ChildRole::Tool`), then the loop's places over them, no stdin. The caller runs it and reads the
/// output (the loop keeps whatever it printed, a benchmark wants a diff).
pub fn child_command(ctx: &Ctx, c: &Child<'_>) -> std::process::Command {
    let mut cmd = std::process::Command::new(c.exe);
    cmd.arg("diff-collect")
        .arg(c.source)
        .arg(c.base)
        .arg(c.snapshot)
        .current_dir(c.control)
        .env_clear()
        .envs(ctx.child_env_for(ChildRole::Tool))
        .env("WORKSPACE_ROOT", c.control)
        .env("MAM_LOOP_DIFF_MAX_BYTES", c.max_bytes.to_string())
        .env("TMPDIR", c.tmp)
        .env("MAM_JOBS_DIR", c.registry)
        .env("DELEGATE_JOB_LOGS_DIR", c.logs)
        .stdin(std::process::Stdio::null());
    cmd
}

/// The UNAVAILABLE marker line of a failure (A40).
pub fn unavailable(e: &DiffError) -> String {
    format!("[mam diff UNAVAILABLE: {e}]")
}

/// Base against the working tree through the temporary index: the base's tree is read into it,
/// every file git would not ignore and the index does not hold is added intent-to-add, then the
/// working tree is diffed against the base. Returns git's diff and the untracked nested
/// repositories (git lists them as `dir/`; their content is not part of this repository).
fn worktree_diff(
    git: &mut Git<'_>,
    base: &str,
    excludes: &[OsString],
    tmp: &Path,
) -> Result<(Vec<u8>, Vec<String>), DiffError> {
    git.run_ok(&["read-tree", base])?;
    let others = git.run_ok(&with_paths(
        ["ls-files", "-z", "--others", "--exclude-standard"].map(OsString::from).to_vec(),
        excludes,
    ))?;
    let mut files = Vec::new();
    let mut nested = Vec::new();
    for name in others.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        if name.ends_with(b"/") {
            nested.push(String::from_utf8_lossy(name).into_owned());
        } else {
            files.extend_from_slice(name);
            files.push(0);
        }
    }
    if !files.is_empty() {
        let list = tmp.join("untracked");
        sys::write_file(&list, &files).map_err(|e| DiffError::Temp { path: list.clone(), detail: e.to_string() })?;
        let from = OsString::from(format!("--pathspec-from-file={}", list.to_string_lossy()));
        let args =
            [OsString::from("--literal-pathspecs"), "add".into(), "-N".into(), from, "--pathspec-file-nul".into()];
        git.run_ok(&args)?;
    }
    // Stat data for the entries read-tree wrote, so unchanged files are not reported as changed.
    git.run(&["update-index", "-q", "--refresh"])?;
    let mut args = diff_args();
    args.push(base.into());
    Ok((git.run_ok(&with_paths(args, excludes))?, nested))
}

/// `git diff` with every presentation choice pinned (docs/DESIGN.md), so that neither a git
/// configuration nor a git default that changed between versions alters the output.
fn diff_args() -> Vec<OsString> {
    [
        "diff",
        "--no-color",
        "--no-ext-diff",
        "--no-textconv",
        "--no-renames",
        "--full-index",
        "--unified=3",
        "--inter-hunk-context=0",
        "--diff-algorithm=myers",
        "--indent-heuristic",
        "--src-prefix=a/",
        "--dst-prefix=b/",
        "--no-relative",
        "--submodule=short",
        "--ignore-submodules=none",
        "-O/dev/null",
    ]
    .map(OsString::from)
    .to_vec()
}

/// `args -- . <excludes>`.
fn with_paths(mut args: Vec<OsString>, excludes: &[OsString]) -> Vec<OsString> {
    args.push("--".into());
    args.push(".".into());
    args.extend(excludes.iter().cloned());
    args
}

/// `:(exclude,literal)<rel>` for each excluded path that lies strictly beneath `top`, sorted.
pub(crate) fn exclude_specs(top: &Path, exclude: &[PathBuf]) -> Vec<OsString> {
    let mut rels: Vec<PathBuf> = exclude
        .iter()
        .filter_map(|p| {
            let p = sys::normalize(p);
            // The control plane may sit behind a symlinked prefix; compare real paths when it exists.
            let p = p.canonicalize().unwrap_or(p);
            p.strip_prefix(top).ok().filter(|r| !r.as_os_str().is_empty()).map(Path::to_path_buf)
        })
        .collect();
    crate::sort::natural(&mut rels);
    rels.dedup();
    rels.into_iter()
        .map(|r| {
            let mut s = OsString::from(":(exclude,literal)");
            s.push(r.as_os_str());
            s
        })
        .collect()
}

impl From<RunError> for DiffError {
    fn from(e: RunError) -> DiffError {
        DiffError::Git { what: e.what, detail: e.detail }
    }
}

/// Resolves `value` to a full commit id.
fn commit(git: &mut Git<'_>, which: &'static str, value: &OsStr) -> Result<String, DiffError> {
    let bad = || DiffError::BadCommit { which, value: value.to_string_lossy().into_owned() };
    let mut spec = value.to_os_string();
    spec.push("^{commit}");
    let args = [OsString::from("rev-parse"), "--verify".into(), "--quiet".into(), "--end-of-options".into(), spec];
    let out = git.run(&args)?;
    let id = String::from_utf8_lossy(&out.stdout).trim_end().to_string();
    if !out.status.success() || id.is_empty() || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad());
    }
    Ok(id)
}

/// A private temp directory (0700, a fresh random name) removed on drop; shared with `review::git`.
pub(crate) struct TempDir {
    pub(crate) path: PathBuf,
}

/// The temp directory could not be made (`path` is the one tried, or the base when no name could
/// be drawn).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TempError {
    pub(crate) path: PathBuf,
    pub(crate) detail: String,
}

impl From<TempError> for DiffError {
    fn from(e: TempError) -> DiffError {
        DiffError::Temp { path: e.path, detail: e.detail }
    }
}

impl TempDir {
    /// `$TMPDIR/<prefix>-<16 hex>` (`/tmp` when TMPDIR is unset or relative).
    pub(crate) fn create(ctx: &Ctx, prefix: &str) -> Result<TempDir, TempError> {
        let base = ctx.path_var("TMPDIR").filter(|p| p.is_absolute()).unwrap_or_else(|| PathBuf::from("/tmp"));
        let name = sys::random_hex(8).map_err(|e| TempError { path: base.clone(), detail: e.to_string() })?;
        let path = base.join(format!("{prefix}-{name}"));
        if path.exists() {
            return Err(TempError { path, detail: "already exists".into() });
        }
        sys::create_dir_all(&path).map_err(|e| TempError { path: path.clone(), detail: e.to_string() })?;
        Ok(TempDir { path })
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One builder for the loop and `mam bench`: the loop's places win over the caller's values, a
    /// secret is not passed, the cwd and argv are the collector's.
    #[test]
    fn child_command_sets_the_loops_places() {
        let ctx = Ctx::with_env(
            [("MAM_JOBS_DIR", "/elsewhere"), ("TMPDIR", "/user-tmp"), ("MQTT_PASSWORD", "s3cret"), ("LANG", "C")],
            Path::new("/w"),
        );
        let p = |s: &str| PathBuf::from(s);
        let (exe, control, source, reg, logs, tmp) =
            (p("/bin/mam"), p("/w"), p("/w-feat"), p("/w/.mam/jobs"), p("/w/.mam/logs"), p("/w/.mam/loop/l/tmp"));
        let c = Child {
            exe: &exe,
            control: &control,
            source: &source,
            base: "b1",
            snapshot: "s1",
            registry: &reg,
            logs: &logs,
            tmp: &tmp,
            max_bytes: 99,
        };
        let cmd = child_command(&ctx, &c);
        assert_eq!(cmd.get_program(), "/bin/mam");
        let args: Vec<&OsStr> = cmd.get_args().collect();
        assert_eq!(args, ["diff-collect", "/w-feat", "b1", "s1"]);
        assert_eq!(cmd.get_current_dir(), Some(Path::new("/w")));
        // The last value of a key is what the child gets.
        let mut env: std::collections::BTreeMap<&OsStr, Option<&OsStr>> = Default::default();
        for (k, v) in cmd.get_envs() {
            env.insert(k, v);
        }
        let get = |k: &str| env.get(OsStr::new(k)).copied().flatten().map(|v| v.to_string_lossy().into_owned());
        assert_eq!(get("MAM_JOBS_DIR").as_deref(), Some("/w/.mam/jobs"));
        assert_eq!(get("DELEGATE_JOB_LOGS_DIR").as_deref(), Some("/w/.mam/logs"));
        assert_eq!(get("TMPDIR").as_deref(), Some("/w/.mam/loop/l/tmp"));
        assert_eq!(get("WORKSPACE_ROOT").as_deref(), Some("/w"));
        assert_eq!(get("MAM_LOOP_DIFF_MAX_BYTES").as_deref(), Some("99"));
        assert_eq!(get("LANG").as_deref(), Some("C"));
        assert_eq!(get("MQTT_PASSWORD"), None, "no secret");
    }

    #[test]
    fn limit_cuts_and_marks() {
        assert_eq!(limit(b"abc\n".to_vec(), 4), b"abc\n");
        assert_eq!(limit(b"abc\ndef\n".to_vec(), 4), b"abc\n[mam diff TRUNCATED after 4 bytes]\n");
        assert_eq!(limit(b"abcdef\n".to_vec(), 3), b"abc\n[mam diff TRUNCATED after 3 bytes]\n");
    }

    #[test]
    fn render_empty_is_the_one_line() {
        assert_eq!(render("b", "WORKTREE", b"", &[]), NO_CHANGES.as_bytes());
        let out = render("b", "WORKTREE", b"x\n", &["n/".into()]);
        assert_eq!(out, b"# mam diff-collect: b..WORKTREE\nx\n# untracked nested repository not shown: n/\n");
    }

    #[test]
    fn excludes_only_beneath_top() {
        let top = Path::new("/nonexistent-top");
        let ex = [top.join(".mam"), top.to_path_buf(), PathBuf::from("/elsewhere/.mam"), top.join("a/../.mam")];
        assert_eq!(exclude_specs(top, &ex), [OsString::from(":(exclude,literal).mam")]);
    }
}
