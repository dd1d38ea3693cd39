//! The one place mam runs git (issue 29): `Git`, a bounded runner in one directory under one
//! deadline, used by diff-collect, the review loop's git layer and the worktree commands. No other
//! file spawns git (a tidy test keeps it so).
//!
//! A repository is data, never code: every run has a cleared environment (only `PATH`, the pinned
//! variables and the caller's `GIT_CONFIG_COUNT`/`GIT_CONFIG_KEY_<n>`/`GIT_CONFIG_VALUE_<n>` reach
//! git), no user or system configuration, hooks off (`core.hooksPath=/dev/null`), no fsmonitor, no
//! signature program, no external diff or textconv (`--no-ext-diff --no-textconv` on every diff-family
//! command), and no attribute-driven filter: attributes come from the empty tree (`GIT_ATTR_SOURCE`,
//! git >= 2.40; older git ignores it), no system or global attributes file, and every filter driver
//! the configuration names at the time of the run (`git config --list` just before) is emptied with
//! `-c`, which git reads last, so neither the repository's configuration nor the caller's
//! `GIT_CONFIG_*` turns these back on. What this does not defend (a race against the listing, the
//! network settings of a submodule fetch) is in docs/SECURITY.md "Git configuration".
//! It never prints; a failure is a `RunError` naming the git command.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use crate::ctx::Ctx;
use crate::pane;

/// The settings every run carries (after the caller's `GIT_CONFIG_*`, so these win).
const PINNED: [&str; 17] = [
    // Presentation: the same output whatever the repository's configuration says.
    "core.quotepath=off",
    "core.untrackedCache=false",
    "color.ui=never",
    "diff.suppressBlankEmpty=false",
    "diff.autoRefreshIndex=true",
    // No code from the repository: hooks, the fsmonitor hook, attribute files outside the tree.
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.attributesFile=/dev/null",
    // No signature program (a commit-tree that signs, a log that verifies).
    "commit.gpgSign=false",
    "tag.gpgSign=false",
    "log.showSignature=false",
    "gpg.program=gpg",
    "gpg.ssh.program=ssh-keygen",
    "gpg.x509.program=gpgsm",
    // A submodule fetch: the ssh from PATH, no askpass program, no ext:: transport.
    "core.sshCommand=ssh",
    "core.askPass=",
    "protocol.ext.allow=never",
];

/// Subcommands that take `--no-ext-diff` and `--no-textconv`.
const DIFF_FAMILY: [&str; 6] = ["diff", "diff-files", "diff-index", "diff-tree", "log", "show"];

/// The empty tree, the attribute source, per object format.
const EMPTY_TREE_SHA1: &str = "4b825dc642cb6eb9a060e54bf8d69288fbee4904";
const EMPTY_TREE_SHA256: &str = "6ef19b41225c5369f1c104d45d8d85efa9b057b53b14b4b9b939dd74decc5321";

/// A git run that failed: could not be started, timed out, or exited non-zero (`what` is the git
/// command, `detail` the exit status and git's last stderr line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunError {
    pub(crate) what: String,
    pub(crate) detail: String,
}

/// One bounded git invocation after another, in `dir`, under one deadline (see the module doc for
/// what every run carries).
pub(crate) struct Git<'a> {
    pub(crate) ctx: &'a Ctx,
    pub(crate) dir: PathBuf,
    /// `GIT_INDEX_FILE`: a temporary index instead of the repository's own.
    pub(crate) index: Option<PathBuf>,
    pub(crate) deadline: Instant,
    /// More variables for every run (the snapshot commit's identity).
    pub(crate) extra_env: Vec<(&'static str, String)>,
    /// Leading arguments for every run, before the subcommand (`-c` settings).
    pub(crate) extra_args: Vec<&'static str>,
}

/// What the configuration says right before a run: the filter drivers it defines and the object
/// format (for the empty tree's name).
#[derive(Debug, Default, PartialEq, Eq)]
struct Listing {
    filters: BTreeSet<String>,
    sha256: bool,
}

impl<'a> Git<'a> {
    pub(crate) fn new(ctx: &'a Ctx, dir: PathBuf, deadline: Instant) -> Git<'a> {
        Git { ctx, dir, index: None, deadline, extra_env: Vec::new(), extra_args: Vec::new() }
    }

    /// Runs git and requires exit 0; returns its stdout.
    pub(crate) fn run_ok<S: AsRef<OsStr>>(&mut self, args: &[S]) -> Result<Vec<u8>, RunError> {
        let out = self.run(args)?;
        if out.status.success() {
            return Ok(out.stdout);
        }
        Err(RunError { what: what(args), detail: failure_detail(&out) })
    }

    /// Runs git to its end (any exit status) within the deadline: first the configuration listing,
    /// then the command with every filter driver the listing names emptied.
    pub(crate) fn run<S: AsRef<OsStr>>(&mut self, args: &[S]) -> Result<std::process::Output, RunError> {
        // The command's own leading options (`--git-dir=`) apply to the listing too.
        let mut list_args: Vec<&OsStr> =
            args.iter().map(AsRef::as_ref).take_while(|a| a.to_string_lossy().starts_with('-')).collect();
        list_args.extend(["config", "--list", "-z"].map(OsStr::new));
        let listed = self.spawn(&list_args, &Listing::default())?;
        let listing = match listed.status.code() {
            Some(0) => parse_listing(&listed.stdout),
            // `git config --list` exits 1 when there is no configuration at all.
            Some(1) if listed.stdout.is_empty() => Listing::default(),
            _ => return Err(RunError { what: "git config --list".into(), detail: failure_detail(&listed) }),
        };
        if let Some(bad) = listing.filters.iter().find(|n| n.is_empty() || n.contains('=')) {
            let detail = format!("filter driver '{}' cannot be switched off on the command line; remove it from the repository's configuration", crate::text::one_line(bad));
            return Err(RunError { what: what(args), detail });
        }
        self.spawn(args, &listing)
    }

    fn spawn<S: AsRef<OsStr>>(&self, args: &[S], listing: &Listing) -> Result<std::process::Output, RunError> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        let mut cmd = Command::new("git");
        cmd.env_clear().current_dir(&self.dir);
        if let Some(path) = self.ctx.var("PATH") {
            cmd.env("PATH", path);
        }
        // HOME points at nothing readable so no user configuration applies; the system one is off.
        let tree = if listing.sha256 { EMPTY_TREE_SHA256 } else { EMPTY_TREE_SHA1 };
        cmd.envs([
            ("LC_ALL", "C"),
            ("HOME", "/nonexistent"),
            ("GIT_CONFIG_NOSYSTEM", "1"),
            ("GIT_CONFIG_GLOBAL", "/dev/null"),
            ("GIT_ATTR_NOSYSTEM", "1"),
            ("GIT_ATTR_SOURCE", tree),
            ("GIT_OPTIONAL_LOCKS", "0"),
            ("GIT_TERMINAL_PROMPT", "0"),
            ("GIT_PAGER", "cat"),
            ("PAGER", "cat"),
        ]);
        for name in self.ctx.var_names() {
            let passed = name == "GIT_CONFIG_COUNT"
                || name.starts_with("GIT_CONFIG_KEY_")
                || name.starts_with("GIT_CONFIG_VALUE_");
            if let (true, Some(v)) = (passed, self.ctx.var(&name)) {
                cmd.env(&name, v);
            }
        }
        cmd.envs(self.extra_env.iter().map(|(k, v)| (k, v)));
        if let Some(index) = &self.index {
            cmd.env("GIT_INDEX_FILE", index);
        }
        for setting in PINNED {
            cmd.args(["-c", setting]);
        }
        for name in &listing.filters {
            for key in ["clean", "smudge", "process"] {
                cmd.arg("-c").arg(format!("filter.{name}.{key}="));
            }
            cmd.arg("-c").arg(format!("filter.{name}.required=false"));
        }
        cmd.arg("--no-pager");
        cmd.args(&self.extra_args);
        cmd.args(with_diff_guards(args));
        pane::run_capture(&mut cmd, left, "git").map_err(|e| RunError { what: what(args), detail: e.to_string() })
    }
}

/// `args` with `--no-ext-diff --no-textconv` right after a diff-family subcommand (the first
/// argument that is not an option).
fn with_diff_guards<S: AsRef<OsStr>>(args: &[S]) -> Vec<&OsStr> {
    let mut out: Vec<&OsStr> = Vec::with_capacity(args.len() + 2);
    let mut seen = false;
    for a in args {
        let a = a.as_ref();
        out.push(a);
        if !seen && !a.to_string_lossy().starts_with('-') {
            seen = true;
            if DIFF_FAMILY.iter().any(|d| a == *d) {
                out.extend([OsStr::new("--no-ext-diff"), OsStr::new("--no-textconv")]);
            }
        }
    }
    out
}

/// The filter drivers (`filter.<name>.<key>`, the name as written) and the object format of a
/// `git config --list -z` answer (`<key>\n<value>\0` records; section and key come lowercased).
fn parse_listing(out: &[u8]) -> Listing {
    let mut l = Listing::default();
    for rec in out.split(|b| *b == 0).filter(|r| !r.is_empty()) {
        let (key, value) = match rec.iter().position(|b| *b == b'\n') {
            Some(i) => (&rec[..i], &rec[i + 1..]),
            None => (rec, &rec[..0]),
        };
        let key = String::from_utf8_lossy(key);
        if key == "extensions.objectformat" {
            l.sha256 = value.eq_ignore_ascii_case(b"sha256");
            continue;
        }
        let Some(rest) = key.strip_prefix("filter.") else { continue };
        // Anything with a driver name counts, whatever its key: a key this version of mam does
        // not know may be one a later git reads.
        if let Some(dot) = rest.rfind('.') {
            l.filters.insert(rest[..dot].to_string());
        }
    }
    l
}

/// The exit status and git's last non-empty stderr line, for messages.
pub(crate) fn failure_detail(out: &std::process::Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no message");
    format!("{}: {last}", out.status)
}

/// `git <first word>` for messages.
fn what<S: AsRef<OsStr>>(args: &[S]) -> String {
    let word = args.iter().map(|a| a.as_ref().to_string_lossy()).find(|a| !a.starts_with('-'));
    format!("git {}", word.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listing_names_every_filter_driver_as_written() {
        let out = b"core.bare\nfalse\0filter.X.clean\ntouch m\0filter.a.b.process\np\0filter.y.required\ntrue\0extensions.objectformat\nsha256\0filter.q\0";
        let l = parse_listing(out);
        assert_eq!(l.filters.into_iter().collect::<Vec<_>>(), ["X", "a.b", "y"]);
        assert!(l.sha256);
        assert_eq!(parse_listing(b""), Listing::default());
    }

    #[test]
    fn diff_family_commands_get_the_guards_after_the_subcommand() {
        let got = with_diff_guards(&["--literal-pathspecs", "diff", "--quiet", "log"]);
        assert_eq!(got, ["--literal-pathspecs", "diff", "--no-ext-diff", "--no-textconv", "--quiet", "log"]);
        let got = with_diff_guards(&["status", "diff"]);
        assert_eq!(got, ["status", "diff"]);
    }
}
