//! Issue 29, item 5: a repository is data, never code. A repository with hostile git
//! configuration (hooks that git runs on an index write or a checkout, clean/smudge/process filters
//! bound through `.gitattributes` and `info/attributes`, a textconv and an external diff driver)
//! must run none of them when mam's diff-collect, review layer or worktree commands work on it,
//! also when the user has marked it safe through `GIT_CONFIG_COUNT` as the docs say; as root the
//! repository belongs to uid 65534. Every git found on PATH (/usr/local/bin's and Debian's) is tried:
//! before 2.40 git has no attribute source, so only the emptied drivers stop the filters.

use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::*;

/// The user marks every directory safe, as docs/SECURITY.md tells users to hand git settings.
const SAFE: &[(&str, &str)] =
    &[("GIT_CONFIG_COUNT", "1"), ("GIT_CONFIG_KEY_0", "safe.directory"), ("GIT_CONFIG_VALUE_0", "*")];

/// The directories holding a git on this machine, each tried first on PATH.
fn git_dirs() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for d in ["/usr/local/bin", "/usr/bin"] {
        if Path::new(d).join("git").is_file() {
            out.push(PathBuf::from(d));
        }
    }
    assert!(!out.is_empty(), "no git found");
    out
}

/// PATH with `dir` first.
fn path_with(dir: &Path) -> OsString {
    let mut p = OsString::from(dir);
    p.push(":");
    p.push(std::env::var_os("PATH").unwrap_or_default());
    p
}

fn git(dir: &Path, args: &[&str]) -> String {
    git_with(dir, args, SAFE)
}

/// Where the hostile hooks and filters leave their marks.
fn markers(td: &TestDir) -> PathBuf {
    let m = td.path("markers");
    fs::create_dir_all(&m).unwrap();
    fs::set_permissions(&m, fs::Permissions::from_mode(0o777)).unwrap();
    m
}

fn marks(m: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        fs::read_dir(m).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

/// Makes `repo` hostile: hooks, filters (one per attribute source, one with a name git lowercases
/// nowhere), textconv and an external diff, each touching `<m>/<what>` when run. The filters pass
/// the content through, so a run that uses them would still succeed.
fn make_hostile(repo: &Path, m: &Path) {
    let hooks = repo.join(".git/hooks");
    fs::create_dir_all(&hooks).unwrap();
    for h in ["post-index-change", "post-checkout", "reference-transaction", "pre-commit", "pre-auto-gc"] {
        let p = hooks.join(h);
        fs::write(&p, format!("#!/bin/sh\ntouch '{}/hook-{h}'\n", m.display())).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let touch = |what: &str| format!("touch '{}/{what}'; cat", m.display());
    let set = |k: &str, v: &str| git(repo, &["config", k, v]);
    set("filter.Evil.clean", &touch("filter-clean"));
    set("filter.Evil.smudge", &touch("filter-smudge"));
    set("filter.info.clean", &touch("filter-info-clean"));
    set("filter.info.smudge", &touch("filter-info-smudge"));
    set("filter.proc.process", &format!("sh -c \"touch '{}/filter-process'; exit 1\"", m.display()));
    set("diff.tc.textconv", &touch("textconv"));
    set("diff.tc.command", &touch("ext-diff"));
    set("diff.external", &touch("diff-external"));
    fs::write(repo.join(".gitattributes"), "*.txt filter=Evil diff=tc\n*.dat filter=proc\n").unwrap();
    fs::create_dir_all(repo.join(".git/info")).unwrap();
    fs::write(repo.join(".git/info/attributes"), "*.md filter=info\n").unwrap();
}

/// A repository at `<td>/victim` with committed files of each kind, made hostile after the commit
/// (so setting it up ran nothing), then changed with the sizes kept: git must read the content.
fn hostile_repo(td: &TestDir, m: &Path) -> PathBuf {
    let repo = td.path("victim");
    fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    fs::write(repo.join("a.txt"), "base\n").unwrap();
    fs::write(repo.join("b.md"), "base\n").unwrap();
    fs::write(repo.join("c.dat"), "base\n").unwrap();
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-q", "-m", "base"]);
    make_hostile(&repo, m);
    for f in ["a.txt", "b.md", "c.dat"] {
        fs::write(repo.join(f), "edit\n").unwrap();
    }
    fs::write(repo.join("new.txt"), "new\n").unwrap();
    repo
}

fn chown_nobody(p: &Path) {
    let st = Command::new("chown").args(["-R", "65534:65534"]).arg(p).status().unwrap();
    assert!(st.success(), "chown {}", p.display());
}

/// Issue 29 item 5: `mam diff-collect` on a hostile repository (another user's, when root) runs no
/// hook, filter, textconv or external diff with any git on PATH, and still shows the raw change.
#[test]
fn diff_collect_runs_no_hook_or_filter_of_a_hostile_repository() {
    for dir in git_dirs() {
        let td = TestDir::new("sec-git-diff");
        let m = markers(&td);
        let repo = hostile_repo(&td, &m);
        if mam::sys::getuid() == 0 {
            chown_nobody(&repo);
        }
        let mut c = td.mam().env("PATH", path_with(&dir));
        for (k, v) in SAFE {
            c = c.env(k, v);
        }
        let r = c.args(["diff-collect".as_ref(), repo.as_os_str(), "HEAD".as_ref()]).run();
        r.expect_rc(0);
        assert_eq!(marks(&m), Vec::<String>::new(), "git in {}: hostile code ran\n{}", dir.display(), r.stdout());
        let out = r.stdout();
        for f in ["a.txt", "b.md", "c.dat", "new.txt"] {
            assert!(out.contains(&format!("+++ b/{f}\n")), "git in {}: {f} missing\n{out}", dir.display());
        }
        assert!(out.contains("-base\n+edit\n"), "{out}");
    }
}

/// The same repository through the review loop's git layer: the fingerprint and pin (a temporary
/// index, `add -A`, `write-tree`, `commit-tree`), the guard (`diff --quiet`) and a review tree
/// (`worktree add --detach`, a checkout), then its removal.
#[test]
fn review_git_layer_runs_no_hook_or_filter_of_a_hostile_repository() {
    for dir in git_dirs() {
        let td = TestDir::new("sec-git-review");
        let m = markers(&td);
        let repo = hostile_repo(&td, &m);
        if mam::sys::getuid() == 0 {
            chown_nobody(&repo);
        }
        let tmp = td.path("tmp");
        fs::create_dir_all(&tmp).unwrap();
        let mut vars: Vec<(String, OsString)> = vec![("PATH".into(), path_with(&dir)), ("TMPDIR".into(), tmp.into())];
        vars.extend(SAFE.iter().map(|(k, v)| (k.to_string(), OsString::from(v))));
        let ctx = mam::ctx::Ctx::with_env(vars, &repo);
        let r = mam::review::git::Repo { root: repo.clone(), exclude: Vec::new() };
        assert!(r.has_uncommitted(&ctx).unwrap());
        let base = mam::review::git::head(&ctx, &repo).unwrap();
        let snap = r.pin(&ctx, "0123abcd").unwrap();
        assert_ne!(snap.commit, base, "the edits are pinned");
        assert!(matches!(r.guard(&ctx, &base, &snap.commit), mam::review::git::Guard::Changes));
        let tree = td.path("review-tree");
        mam::review::git::add_review_tree(&ctx, &repo, &tree, &snap.commit).unwrap();
        assert_eq!(fs::read(tree.join("a.txt")).unwrap(), b"edit\n", "the tree holds the pinned bytes");
        mam::review::git::remove_review_tree(&ctx, &repo, &tree).unwrap();
        assert_eq!(marks(&m), Vec::<String>::new(), "git in {}: hostile code ran", dir.display());
    }
}

/// The worktree commands on a control root with the same hostile configuration (owned by root: mam
/// refuses another user's control root before git runs): prepare (a checkout), list and remove (git
/// status reading changed content, `git worktree remove`).
#[test]
fn worktree_commands_run_no_hook_or_filter_of_a_hostile_repository() {
    for dir in git_dirs() {
        let td = TestDir::new("sec-git-wt");
        let m = markers(&td);
        let root = td.ws();
        git(&root, &["init", "-q", "-b", "main"]);
        fs::write(root.join(".gitignore"), "/.mam/\n").unwrap();
        for f in ["a.txt", "b.md", "c.dat"] {
            fs::write(root.join(f), "base\n").unwrap();
        }
        // The attributes are committed (the checkout reads them) before the drivers exist.
        fs::write(root.join(".gitattributes"), "*.txt filter=Evil diff=tc\n*.dat filter=proc\n").unwrap();
        git(&root, &["add", "-A"]);
        git(&root, &["commit", "-q", "-m", "base"]);
        make_hostile(&root, &m);
        assert_eq!(marks(&m), Vec::<String>::new(), "the set-up ran nothing");
        let mam = |args: &[&str]| {
            let mut c = td.mam().env("PATH", path_with(&dir)).env("MAM_PANE_BACKEND", "fake");
            for (k, v) in GIT_ENV.iter().chain(SAFE) {
                c = c.env(k, v);
            }
            c.args(args).run()
        };
        let r = mam(&["worktree", "prepare", "feat"]);
        r.expect_rc(0);
        let wt = PathBuf::from(r.stdout().lines().next().unwrap().strip_prefix("WORKTREE=").unwrap());
        assert_eq!(fs::read(wt.join("a.txt")).unwrap(), b"base\n");
        for f in ["a.txt", "b.md", "c.dat"] {
            fs::write(wt.join(f), "edit\n").unwrap();
        }
        let r = mam(&["worktree", "list"]);
        r.expect_rc(0);
        assert!(r.stdout().contains("dirty"), "{}", r.stdout());
        let r = mam(&["worktree", "remove", wt.to_str().unwrap()]);
        r.expect_rc(3);
        assert_eq!(marks(&m), Vec::<String>::new(), "git in {}: hostile code ran", dir.display());
        // The committed bytes back (raw: the filters are off), so the next remove finds it clean.
        for f in ["a.txt", "b.md", "c.dat"] {
            fs::write(wt.join(f), "base\n").unwrap();
        }
        let r = mam(&["worktree", "remove", wt.to_str().unwrap()]);
        assert_eq!(r.rc(), 0, "{}{}", r.stdout(), r.stderr());
        assert!(!wt.exists());
        assert_eq!(marks(&m), Vec::<String>::new(), "git in {}: hostile code ran", dir.display());
    }
}

/// The attribute source is the empty tree of the repository's own object format: a SHA-256
/// repository (whose empty tree has another name) still diffs, with a hostile filter still off.
#[test]
fn diff_collect_of_a_sha256_repository_uses_its_empty_tree() {
    for dir in git_dirs() {
        let td = TestDir::new("sec-git-sha256");
        let m = markers(&td);
        let repo = td.path("victim");
        fs::create_dir_all(&repo).unwrap();
        git(&repo, &["init", "-q", "--object-format=sha256", "-b", "main"]);
        fs::write(repo.join("a.txt"), "base\n").unwrap();
        git(&repo, &["add", "-A"]);
        git(&repo, &["commit", "-q", "-m", "base"]);
        make_hostile(&repo, &m);
        fs::write(repo.join("a.txt"), "edit\n").unwrap();
        let mut c = td.mam().env("PATH", path_with(&dir));
        for (k, v) in SAFE {
            c = c.env(k, v);
        }
        let r = c.args(["diff-collect".as_ref(), repo.as_os_str(), "HEAD".as_ref()]).run();
        r.expect_rc(0);
        assert!(r.stdout().contains("-base\n+edit\n"), "git in {}: {}", dir.display(), r.stdout());
        assert_eq!(marks(&m), Vec::<String>::new(), "git in {}: hostile code ran", dir.display());
    }
}

/// A filter driver whose name `-c` cannot carry (`a=b`: git would split the setting at its first
/// `=`) fails the run closed, naming the driver, instead of leaving it on.
#[test]
fn a_filter_driver_named_with_an_equals_sign_fails_closed() {
    let td = TestDir::new("sec-git-eq");
    let m = markers(&td);
    let repo = hostile_repo(&td, &m);
    git(&repo, &["config", "filter.a=b.clean", &format!("touch '{}/filter-eq'; cat", m.display())]);
    fs::write(repo.join(".gitattributes"), "*.txt filter=a=b\n").unwrap();
    let mut c = td.mam();
    for (k, v) in SAFE {
        c = c.env(k, v);
    }
    let r = c.args(["diff-collect".as_ref(), repo.as_os_str(), "HEAD".as_ref()]).run();
    assert!(r.stdout().starts_with("[mam diff UNAVAILABLE: "), "{}", r.stdout());
    assert!(r.stdout().contains("filter driver 'a=b' cannot be switched off"), "{}", r.stdout());
    assert_eq!(marks(&m), Vec::<String>::new());
}
