//! `mam diff-collect` and `shims/diff_collect.sh` (ORCH 4.6, 4.9 test 4, A40) against real git: the
//! two-argument golden output, the empty line, commit to commit, the repository left untouched, the
//! byte cut and the UNAVAILABLE marker.

use std::path::Path;

use crate::support::*;

const GOLDEN: &str = "tests/fixtures/diff_collect_worktree.diff";

/// git in the test's control root with a fixed identity and dates, so commit ids are stable.
fn git(td: &TestDir, args: &[&str]) -> String {
    let r = td
        .command("git")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "mam-test")
        .env("GIT_AUTHOR_EMAIL", "mam-test@example.invalid")
        .env("GIT_COMMITTER_NAME", "mam-test")
        .env("GIT_COMMITTER_EMAIL", "mam-test@example.invalid")
        .env("GIT_AUTHOR_DATE", "2024-01-02T03:04:05Z")
        .env("GIT_COMMITTER_DATE", "2024-01-02T03:04:05Z")
        .args(["-c", "init.defaultBranch=main", "-c", "commit.gpgsign=false"])
        .args(args)
        .run();
    r.expect_rc(0);
    r.stdout()
}

/// The fixed repository of the golden fixture: a base commit, then a tracked modification, a
/// deletion, new untracked files (one in a directory with a space), changes under `.mam/` (tracked
/// and not) and an ignored file.
fn fixed_repo(name: &str) -> TestDir {
    let td = TestDir::new(name);
    git(&td, &["init", "-q"]);
    td.write("ws/keep.txt", "one\ntwo\nthree\n");
    td.write("ws/gone.txt", "deleted later\n");
    td.write("ws/.gitignore", "*.log\n");
    td.write("ws/dir with space/old.txt", "old\n");
    td.write("ws/.mam/tracked.txt", "control plane\n");
    git(&td, &["add", "-A"]);
    git(&td, &["commit", "-q", "-m", "base"]);
    td.write("ws/keep.txt", "one\n2\nthree\n");
    std::fs::remove_file(td.path("ws/gone.txt")).unwrap();
    td.write("ws/new.txt", "untracked\n");
    td.write("ws/dir with space/new file.txt", "spaced\n");
    td.write("ws/.mam/tracked.txt", "changed control plane\n");
    td.write("ws/.mam/jobs/j1.json", "{}\n");
    td.write("ws/debug.log", "ignored\n");
    td
}

fn golden() -> Vec<u8> {
    std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join(GOLDEN)).unwrap()
}

/// ORCH 4.9 test 4: the two-argument output is a golden fixture, byte for byte.
#[test]
fn t4_two_argument_output_is_the_golden_fixture() {
    let td = fixed_repo("diffc-golden");
    let r = td.mam().args(["diff-collect", ".", "HEAD"]).run();
    r.expect_rc(0);
    assert_eq!(r.stdout(), String::from_utf8_lossy(&golden()), "diff-collect output differs from {GOLDEN}");
    assert_eq!(r.out.stdout, golden());
    assert_eq!(r.stderr(), "");
}

/// Nothing in the repository's index, status or refs changes, and no temp directory is left.
#[test]
fn worktree_diff_leaves_index_status_and_refs_untouched() {
    let td = fixed_repo("diffc-untouched");
    let tmp = td.path("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let index = std::fs::read(td.path("ws/.git/index")).unwrap();
    let status = git(&td, &["status", "--porcelain", "--untracked-files=all"]);
    let refs = git(&td, &["for-each-ref"]);
    td.mam().env("TMPDIR", &tmp).args(["diff-collect", ".", "HEAD"]).run().expect_rc(0);
    assert_eq!(std::fs::read(td.path("ws/.git/index")).unwrap(), index, "the real index was written");
    assert_eq!(git(&td, &["status", "--porcelain", "--untracked-files=all"]), status);
    assert_eq!(git(&td, &["for-each-ref"]), refs);
    assert!(status.contains("?? new.txt"), "{status}");
    assert_eq!(tree(&tmp), Vec::<String>::new(), "the temporary index was removed");
}

/// ORCH 4.9 test 4: the empty output is the single line.
#[test]
fn t4_no_change_is_the_single_line() {
    let td = TestDir::new("diffc-empty");
    git(&td, &["init", "-q"]);
    td.write("ws/a.txt", "a\n");
    git(&td, &["add", "a.txt"]);
    git(&td, &["commit", "-q", "-m", "base"]);
    // Only control-plane and ignored-by-rule changes: still no change.
    td.write("ws/.mam/x", "x\n");
    let r = td.mam().args(["diff-collect", ".", "HEAD"]).run();
    r.expect_rc(0);
    assert_eq!(r.stdout(), "(no changes since base commit)\n");
    let r = td.mam().args(["diff-collect", ".", "HEAD", "HEAD"]).run();
    r.expect_rc(0);
    assert_eq!(r.stdout(), "(no changes since base commit)\n");
}

/// Three arguments: commit to commit; the working tree and untracked files play no part.
#[test]
fn three_arguments_diff_commit_to_commit() {
    let td = fixed_repo("diffc-three");
    let base = git(&td, &["rev-parse", "HEAD"]).trim().to_string();
    git(&td, &["add", "keep.txt"]);
    git(&td, &["commit", "-q", "-m", "head"]);
    let head = git(&td, &["rev-parse", "HEAD"]).trim().to_string();
    let r = td.mam().args(["diff-collect", ".", &base, "HEAD"]).run();
    r.expect_rc(0);
    let want = format!("# mam diff-collect: {base}..{head}\ndiff --git a/keep.txt b/keep.txt\nindex 4cb29ea");
    let out = r.stdout();
    assert!(out.starts_with(&want), "{out}");
    assert!(out.contains("-two\n+2\n"), "{out}");
    assert!(!out.contains("new.txt") && !out.contains("gone.txt") && !out.contains(".mam"), "{out}");
}

/// A40: output beyond MAM_LOOP_DIFF_MAX_BYTES is cut and ends with the marker line; rc stays 0.
#[test]
fn a40_truncated_output_ends_with_the_marker() {
    let td = fixed_repo("diffc-cut");
    let r = td.mam().env("MAM_LOOP_DIFF_MAX_BYTES", "100").args(["diff-collect", ".", "HEAD"]).run();
    r.expect_rc(0);
    let g = golden();
    let mut want = g[..100].to_vec();
    if !want.ends_with(b"\n") {
        want.push(b'\n');
    }
    want.extend_from_slice(b"[mam diff TRUNCATED after 100 bytes]\n");
    assert_eq!(r.stdout(), String::from_utf8_lossy(&want));
    // At exactly the output's size nothing is cut.
    let n = g.len().to_string();
    let r = td.mam().env("MAM_LOOP_DIFF_MAX_BYTES", &n).args(["diff-collect", ".", "HEAD"]).run();
    assert_eq!(r.out.stdout, g);
    let r = td.mam().env("MAM_LOOP_DIFF_MAX_BYTES", "0").args(["diff-collect", ".", "HEAD"]).run();
    r.expect_rc(2);
    // Issue 18: the value and where it came from are named.
    assert!(
        r.stderr().starts_with("ERROR: MAM_LOOP_DIFF_MAX_BYTES: '0' from the environment is not"),
        "{}",
        r.stderr()
    );
}

/// A40: no repository, or a base that is no commit: the marker on stdout, one ERROR line, rc 1.
#[test]
fn a40_unavailable_for_a_non_repository_and_a_bad_base() {
    let td = TestDir::new("diffc-unavail");
    let plain = td.path("plain");
    std::fs::create_dir_all(&plain).unwrap();
    let r = td.mam().args(["diff-collect", plain.to_str().unwrap(), "HEAD"]).run();
    r.expect_rc(1);
    let want = format!("[mam diff UNAVAILABLE: {}: not the top level of a git repository (", plain.display());
    assert!(r.stdout().starts_with(&want) && r.stdout().ends_with(")]\n"), "{}", r.stdout());
    assert_eq!(r.stdout().lines().count(), 1);
    let err = r.stderr();
    assert!(err.starts_with(&format!("ERROR: diff-collect: {}: not the top level", plain.display())), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");

    git(&td, &["init", "-q"]);
    td.write("ws/a.txt", "a\n");
    git(&td, &["add", "a.txt"]);
    git(&td, &["commit", "-q", "-m", "base"]);
    let r = td.mam().args(["diff-collect", ".", "no-such-base"]).run();
    r.expect_rc(1);
    assert_eq!(r.stdout(), "[mam diff UNAVAILABLE: base 'no-such-base': not a commit]\n");
    assert_eq!(r.stderr(), "ERROR: diff-collect: base 'no-such-base': not a commit\n");
    let r = td.mam().args(["diff-collect", ".", "HEAD", "HEAD~5"]).run();
    r.expect_rc(1);
    assert_eq!(r.stdout(), "[mam diff UNAVAILABLE: head 'HEAD~5': not a commit]\n");
    // A subdirectory is not the repository's top level.
    std::fs::create_dir_all(td.path("ws/sub")).unwrap();
    td.mam().args(["diff-collect", "sub", "HEAD"]).run().expect_rc(1);
}

/// Usage errors are rc 2 and print no marker.
#[test]
fn usage_errors_are_rc_2() {
    let td = TestDir::new("diffc-usage");
    for args in [
        &["diff-collect"][..],
        &["diff-collect", "."],
        &["diff-collect", ".", "a", "b", "c"],
        &["diff-collect", ".", ""],
        &["diff-collect", "--bogus", ".", "a"],
    ] {
        let r = td.mam().args(args).run();
        r.expect_rc(2);
        assert_eq!(r.stdout(), "", "{args:?}");
        assert!(r.stderr().starts_with("ERROR: "), "{args:?}: {}", r.stderr());
    }
}

/// The legacy shim, run from another directory, passes `<root> <base>` through.
#[test]
fn shim_diff_collect_from_another_directory() {
    let td = fixed_repo("diffc-shim");
    let shim = Path::new(env!("CARGO_MANIFEST_DIR")).join("shims/diff_collect.sh");
    let r = td.command(&shim).env("MAM_BIN", mam_bin()).cwd("/").args([td.ws().to_str().unwrap(), "HEAD"]).run();
    r.expect_rc(0);
    assert_eq!(r.out.stdout, golden());
}
