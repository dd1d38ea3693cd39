//! `mam install`, `mam update`, `mam remove` (ORCH 7.7 tests 1-13, issue 16) in real git
//! repositories: the layout and ledgers, the managed `.gitignore` block, update's merge and restore,
//! remove's hash check, SIGKILL at chosen points (the `test-hooks` hook
//! `MAM_TEST_INSTALL_KILL_AFTER=<n>` sends a real SIGKILL to the process after its n-th change),
//! a legacy install taken over, bad input, the skills' command lines against the CLI, and the
//! snapshot of every legacy flag and env name the seeds mention.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::support::*;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A control root that is a git repository's top level.
fn repo(name: &str) -> TestDir {
    let td = TestDir::new(name);
    git(&td, &["init", "-q"]);
    td
}

fn git(td: &TestDir, args: &[&str]) -> String {
    let r = td
        .command("git")
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@t")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@t")
        .run();
    r.expect_rc(0);
    r.stdout()
}

fn read(td: &TestDir, rel: &str) -> String {
    fs::read_to_string(td.ws().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn manifest(td: &TestDir) -> Vec<String> {
    read(td, ".mam/install/manifest.txt").lines().map(str::to_string).collect()
}

const LEDGERS: [&str; 4] = [
    ".mam/install/asset_hashes.txt",
    ".mam/install/version.txt",
    ".mam/install/install_state",
    ".mam/install/manifest.txt",
];

/// Every path under `dir` (`.git` left out) with its bytes (files), `->target` (links) or `/`
/// (directories) and mode: the byte-exact picture a restore must give back.
fn snapshot(dir: &Path) -> BTreeMap<String, (Vec<u8>, u32)> {
    fn walk(base: &Path, d: &Path, out: &mut BTreeMap<String, (Vec<u8>, u32)>) {
        for e in fs::read_dir(d).unwrap().flatten() {
            let p = e.path();
            let rel = p.strip_prefix(base).unwrap().to_string_lossy().into_owned();
            if rel == ".git" {
                continue;
            }
            let m = fs::symlink_metadata(&p).unwrap();
            let mode = m.permissions().mode() & 0o7777;
            if m.file_type().is_symlink() {
                out.insert(rel, (fs::read_link(&p).unwrap().to_string_lossy().into_owned().into_bytes(), 0));
            } else if m.is_dir() {
                out.insert(format!("{rel}/"), (Vec::new(), mode));
                walk(base, &p, out);
            } else {
                out.insert(rel, (fs::read(&p).unwrap(), mode));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

fn diff(a: &BTreeMap<String, (Vec<u8>, u32)>, b: &BTreeMap<String, (Vec<u8>, u32)>) -> Vec<String> {
    let mut d = Vec::new();
    for (k, v) in a {
        match b.get(k) {
            None => d.push(format!("gone: {k}")),
            Some(w) if w != v => d.push(format!("changed: {k}")),
            _ => {}
        }
    }
    for k in b.keys() {
        if !a.contains_key(k) {
            d.push(format!("new: {k}"));
        }
    }
    d
}

/// Files (not directories) under the target that no ledger lists and that were not there before
/// (`before`): what an interrupted run must never leave behind.
#[cfg(feature = "test-hooks")]
fn unledgered(td: &TestDir, before: &BTreeMap<String, (Vec<u8>, u32)>) -> Vec<String> {
    let m: Vec<String> = if td.ws().join(".mam/install/manifest.txt").exists() { manifest(td) } else { Vec::new() };
    snapshot(&td.ws())
        .into_keys()
        .filter(|k| !k.ends_with('/'))
        .filter(|k| !before.contains_key(k) && !m.contains(k) && !LEDGERS.contains(&k.as_str()))
        .filter(|k| !k.starts_with(".mam/removed-") && k != ".gitignore")
        .collect()
}

fn installed(td: &TestDir) {
    td.mam().args(["install"]).run().expect_rc(0);
}

#[test]
fn t1_install_creates_gitignore_with_the_block_and_venv_in_any_form_is_ignored() {
    let td = repo("i-t1");
    let r = td.mam().args(["install"]).run();
    r.expect_rc(0);
    assert!(r.stdout().contains("installed mam"), "{}", r.stdout());
    assert_eq!(read(&td, ".gitignore"), "# >>> mam managed >>>\n/.venv\n/.mam/\n/.mam.env\n# <<< mam managed <<<\n");
    assert!(read(&td, ".mam/install/install_state").contains("gitignore_created=1\n"));
    let status = |td: &TestDir| git(td, &["status", "--porcelain", "--untracked-files=all"]);
    for form in ["dir", "file", "link"] {
        let v = td.ws().join(".venv");
        let _ = fs::remove_dir_all(&v);
        let _ = fs::remove_file(&v);
        match form {
            "dir" => td.write("ws/.venv/bin/python", "x"),
            "file" => td.write("ws/.venv", "x"),
            _ => {
                std::os::unix::fs::symlink(td.path("home"), &v).unwrap();
                v.clone()
            }
        };
        let s = status(&td);
        assert!(!s.contains(".venv"), "{form}: {s}");
    }
    // The layout of 7.2: binary, shims, eight skills, the example, the ledgers.
    for rel in [".mam/bin/mam", ".mam/shims/lib.sh", ".mam/shims/install.sh", ".mam.env.example", ".mam/shim/herdr"] {
        assert!(td.ws().join(rel).is_file(), "{rel}");
    }
    for s in ["create", "resume", "stop", "status", "monitor", "delegate-job", "loop", "orc-onboard"] {
        assert!(td.ws().join(format!(".agents/skills/{s}/SKILL.md")).is_file(), "{s}");
    }
    let mode = fs::metadata(td.ws().join(".mam/bin/mam")).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o755);
    assert_eq!(fs::read(td.ws().join(".mam/bin/mam")).unwrap(), fs::read(mam_bin()).unwrap());
    // Ledgers: sorted, directories end in /, they never list themselves nor .gitignore.
    let m = manifest(&td);
    let mut sorted = m.clone();
    sorted.sort();
    assert_eq!(m, sorted);
    assert!(m.contains(&".mam/shim/".to_string()) && m.contains(&".mam/shim/herdr".to_string()));
    assert!(!m.iter().any(|p| LEDGERS.contains(&p.as_str()) || p == ".gitignore"));
    let hashes = read(&td, ".mam/install/asset_hashes.txt");
    assert!(!hashes.contains(".gitignore") && !hashes.contains(".mam/shim/herdr"));
    // The installed skills are in git status (they are meant to be committed); .mam is not.
    let s = status(&td);
    assert!(s.contains(".agents/") && !s.contains(".mam/"), "{s}");
}

#[test]
fn t2_a_legacy_block_is_replaced_on_update_and_user_lines_stay() {
    let td = repo("i-t2");
    installed(&td);
    let legacy =
        "target/\n# >>> multi-agent-mux managed >>>\n/.venv/\n/.mam/\n# <<< multi-agent-mux managed <<<\n*.log\n";
    td.write("ws/.gitignore", legacy);
    td.mam().args(["update"]).run().expect_rc(0);
    assert_eq!(
        read(&td, ".gitignore"),
        "target/\n# >>> mam managed >>>\n/.venv\n/.mam/\n/.mam.env\n# <<< mam managed <<<\n*.log\n"
    );
    assert!(!read(&td, ".mam/install/manifest.txt").contains(".gitignore"));
    assert!(!read(&td, ".mam/install/asset_hashes.txt").contains(".gitignore"));
}

#[cfg(feature = "test-hooks")]
#[test]
fn t3_update_to_a_new_version_keeps_gitignore_created_and_remove_then_backs_up_nothing() {
    let td = repo("i-t3");
    installed(&td);
    td.mam().args(["update"]).env("MAM_TEST_ASSET_VERSION", "9.8.7").run().expect_rc(0);
    assert!(read(&td, ".mam/install/version.txt").starts_with("9.8.7 "), "{}", read(&td, ".mam/install/version.txt"));
    let state = read(&td, ".mam/install/install_state");
    assert!(state.contains("version=9.8.7\n") && state.contains("gitignore_created=1\n"), "{state}");
    assert!(read(&td, ".agents/skills/loop/SKILL.md").contains("\nversion: 9.8.7\n"));
    // Nothing was modified locally, so update moved nothing aside and remove backs up nothing.
    let r = td.mam().args(["remove"]).run();
    r.expect_rc(0);
    assert!(!r.stdout().contains("local edit"), "{}", r.stdout());
    assert!(!fs::read_dir(td.ws().join(".mam"))
        .unwrap()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with("removed-")));
    assert!(!td.ws().join(".gitignore").exists());
}

#[test]
fn t4_install_state_merge_is_literal_and_skips_lines_without_equals() {
    let td = repo("i-t4");
    installed(&td);
    let p = td.ws().join(".mam/install/install_state");
    let mut s = fs::read_to_string(&p).unwrap();
    // `ver.ion` would match `version` as a pattern; `binary=` is one the fresh file writes.
    s.push_str("ver.ion=kept\nno equals sign here\nbinary=old\ncustom=1");
    fs::write(&p, s).unwrap();
    td.mam().args(["update"]).run().expect_rc(0);
    let m = read(&td, ".mam/install/install_state");
    assert!(m.contains("\nver.ion=kept\n") && m.contains("\ncustom=1\n"), "{m}");
    assert!(!m.contains("no equals") && !m.contains("binary=old"), "{m}");
    assert!(m.ends_with('\n'));
    assert_eq!(m.matches("version=").count(), 1, "{m}");
}

#[cfg(feature = "test-hooks")]
#[test]
fn t5_update_failing_midway_restores_every_file_byte_identical() {
    let td = repo("i-t5");
    installed(&td);
    // A local edit, a user .gitignore line, a mode change: all must come back exactly.
    td.write("ws/.agents/skills/stop/SKILL.md", "my own stop skill\n");
    fs::set_permissions(td.ws().join(".mam/shims/status.sh"), fs::Permissions::from_mode(0o700)).unwrap();
    let mut gi = read(&td, ".gitignore");
    gi.push_str("mine\n");
    td.write("ws/.gitignore", gi);
    let before = snapshot(&td.ws());
    let mut failed = 0;
    for n in [1, 2, 3, 5, 8, 10, 12, 14] {
        let r = td
            .mam()
            .args(["update"])
            .env("MAM_TEST_ASSET_VERSION", "9.9.9")
            .env("MAM_TEST_INSTALL_FAIL_AFTER", n.to_string())
            .run();
        if r.rc() == 0 {
            // n beyond the last step: the update finished; put the picture back for the next n.
            break;
        }
        r.expect_rc(1);
        assert!(r.stderr().contains("restored as it was"), "{n}: {}", r.stderr());
        let d = diff(&before, &snapshot(&td.ws()));
        assert!(d.is_empty(), "after a failure at step {n}: {d:?}");
        failed += 1;
    }
    assert!(failed >= 7, "only {failed} failure points were reached");
}

#[test]
fn t6_remove_keeps_a_modified_skill_and_deletes_pristine_files() {
    let td = repo("i-t6");
    installed(&td);
    td.write("ws/.agents/skills/create/SKILL.md", "edited\n");
    let r = td.mam().args(["remove"]).run();
    r.expect_rc(0);
    let out = r.stdout();
    let line = out
        .lines()
        .find(|l| l.starts_with("kept local edit: .agents/skills/create/SKILL.md -> "))
        .unwrap_or_else(|| panic!("{out}"));
    let aside = line.rsplit(" -> ").next().unwrap();
    assert!(aside.starts_with(".mam/removed-") && aside.ends_with("/.agents/skills/create/SKILL.md"), "{aside}");
    let stamp = &aside[".mam/removed-".len()..aside.find("/.agents").unwrap()];
    assert!(stamp.len() == 16 && stamp.as_bytes()[8] == b'T' && stamp.ends_with('Z'), "{stamp}");
    assert_eq!(read(&td, aside), "edited\n");
    for gone in [".agents", ".mam/bin", ".mam/shims", ".mam/install", ".mam.env.example", ".gitignore"] {
        assert!(!td.ws().join(gone).exists(), "{gone} left");
    }
    // A .gitignore that was there before install keeps its own lines and loses only the block.
    let td = repo("i-t6b");
    td.write("ws/.gitignore", "target/\n");
    installed(&td);
    assert!(!read(&td, ".mam/install/install_state").contains("gitignore_created"));
    td.mam().args(["remove"]).run().expect_rc(0);
    assert_eq!(read(&td, ".gitignore"), "target/\n");
    // Created by install but with a user line added since: kept.
    let td = repo("i-t6c");
    installed(&td);
    let mut gi = read(&td, ".gitignore");
    gi.push_str("*.o\n");
    td.write("ws/.gitignore", gi);
    td.mam().args(["remove"]).run().expect_rc(0);
    assert_eq!(read(&td, ".gitignore"), "*.o\n");
}

#[test]
fn t7_version_values_agree() {
    let td = repo("i-t7");
    installed(&td);
    let v = env!("CARGO_PKG_VERSION");
    let out = td.mam().args(["--version"]).run().stdout();
    let (ver, commit) = out.trim_end().strip_prefix("mam ").unwrap().split_once(' ').unwrap();
    assert_eq!(ver, v);
    assert!(commit.starts_with('(') && commit.ends_with(')'), "{out}");
    let commit = &commit[1..commit.len() - 1];
    assert_eq!(read(&td, ".mam/install/version.txt"), format!("{v} {commit}\n"));
    assert!(read(&td, ".mam/install/install_state").starts_with(&format!("version={v}\n")));
    for s in ["create", "resume", "stop", "status", "monitor", "delegate-job", "loop", "orc-onboard"] {
        let text = read(&td, &format!(".agents/skills/{s}/SKILL.md"));
        assert!(text.starts_with(&format!("---\nname: {s}\n")), "{s}");
        assert!(
            text.lines().take_while(|l| *l != "---" || text.starts_with(l)).any(|l| l == format!("version: {v}")),
            "{s}"
        );
        assert!(text.contains("\ndescription: "), "{s}");
    }
    let r = td
        .command("bash")
        .args(["-c", ". .mam/shims/lib.sh && printf '%s\\n' \"$MAM_VERSION\""])
        .env("WORKSPACE_ROOT", td.ws())
        .run();
    r.expect_rc(0);
    assert_eq!(r.stdout(), format!("{v}\n"));
    // The loop checkpoint's framework_version is the same constant.
    let run_rs = fs::read_to_string(root().join("src/review/run.rs")).unwrap();
    assert!(run_rs.contains("framework_version: crate::version::VERSION.to_string()"));
}

#[test]
fn t8_remove_dry_run_changes_nothing() {
    let td = repo("i-t8");
    installed(&td);
    td.write("ws/.agents/skills/loop/SKILL.md", "mine\n");
    let before = snapshot(&td.ws());
    let r = td.mam().args(["remove", "--dry-run"]).run();
    r.expect_rc(0);
    assert!(r.stdout().contains("would move (locally modified) to .mam/removed-"), "{}", r.stdout());
    assert!(r.stdout().contains("would delete: .mam/bin/mam"));
    assert!(r.stdout().ends_with("dry run: nothing changed\n"));
    assert!(diff(&before, &snapshot(&td.ws())).is_empty());
}

#[test]
fn t9_remove_of_a_target_not_installed_is_rc_2() {
    let td = repo("i-t9");
    let before = snapshot(&td.ws());
    let r = td.mam().args(["remove"]).run();
    r.expect_rc(2);
    assert!(r.stderr().contains("is not installed") && r.stderr().lines().count() == 1, "{}", r.stderr());
    let r = td.mam().args(["update"]).run();
    r.expect_rc(2);
    assert!(diff(&before, &snapshot(&td.ws())).is_empty());
}

#[test]
fn t10_assets_no_longer_shipped_go_when_pristine_and_stay_when_modified() {
    let td = repo("i-t10");
    installed(&td);
    // Two assets of an "older release": listed in both ledgers with their shipped hashes.
    let hash = |b: &[u8]| mam::install::ledger::sha256_hex(b);
    td.write("ws/.mam/shims/old_pristine.sh", "old\n");
    td.write("ws/.mam/shims/old_modified.sh", "edited\n");
    let mut h = read(&td, ".mam/install/asset_hashes.txt");
    h.push_str(&format!(
        "{}  .mam/shims/old_pristine.sh\n{}  .mam/shims/old_modified.sh\n",
        hash(b"old\n"),
        hash(b"old\n")
    ));
    td.write("ws/.mam/install/asset_hashes.txt", h);
    let mut m = read(&td, ".mam/install/manifest.txt");
    m.push_str(".mam/shims/old_pristine.sh\n.mam/shims/old_modified.sh\n");
    td.write("ws/.mam/install/manifest.txt", m);
    let r = td.mam().args(["update"]).run();
    r.expect_rc(0);
    let out = r.stdout();
    assert!(out.contains("removed .mam/shims/old_pristine.sh (no longer shipped)"), "{out}");
    assert!(out.contains("kept .mam/shims/old_modified.sh: modified locally and no longer shipped"), "{out}");
    assert!(!td.ws().join(".mam/shims/old_pristine.sh").exists());
    assert_eq!(read(&td, ".mam/shims/old_modified.sh"), "edited\n");
    assert!(manifest(&td).contains(&".mam/shims/old_modified.sh".to_string()));
    assert!(!manifest(&td).contains(&".mam/shims/old_pristine.sh".to_string()));
    assert!(read(&td, ".mam/install/asset_hashes.txt")
        .contains(&format!("{}  .mam/shims/old_modified.sh\n", hash(b"old\n"))));
    // remove then treats it as a local edit: moved aside, not deleted.
    let r = td.mam().args(["remove"]).run();
    r.expect_rc(0);
    assert!(r.stdout().contains("kept local edit: .mam/shims/old_modified.sh -> .mam/removed-"), "{}", r.stdout());
}

#[test]
fn t11_remove_names_the_kept_state_and_refuses_under_running_work() {
    let td = repo("i-t11");
    installed(&td);
    td.write("ws/.mam/jobs/abc.json", "{}");
    td.write(
        "ws/.mam/agent_sessions.json",
        r#"{"version":1,"herdr_sessions":[{"name":"w1","agent":"claude","status":"running"}],"orchestrator_uuids":[]}"#,
    );
    let before = snapshot(&td.ws());
    let r = td.mam().args(["remove"]).run();
    r.expect_rc(3);
    assert!(r.stderr().starts_with("REFUSED: remove: running work: session w1 is running"), "{}", r.stderr());
    assert!(diff(&before, &snapshot(&td.ws())).is_empty());
    td.write(
        "ws/.mam/agent_sessions.json",
        r#"{"version":1,"herdr_sessions":[{"name":"w1","agent":"claude","status":"stopped"}],"orchestrator_uuids":[]}"#,
    );
    let r = td.mam().args(["remove"]).run();
    r.expect_rc(0);
    let ws = td.ws().to_string_lossy().into_owned();
    for want in [
        format!("kept job registry: {ws}/.mam/jobs\n"),
        format!("kept audit logs: {ws}/.mam/delegate_job_logs (none yet)\n"),
        format!("kept loop state: {ws}/.mam/loop (none yet)\n"),
        format!("kept sessions file: {ws}/.mam/agent_sessions.json\n"),
    ] {
        assert!(r.stdout().contains(&want), "{want}: {}", r.stdout());
    }
    assert!(td.ws().join(".mam/jobs/abc.json").exists() && td.ws().join(".mam/agent_sessions.json").exists());
}

#[test]
fn t11b_remove_refuses_while_the_daemon_lock_is_held() {
    let td = repo("i-t11b");
    installed(&td);
    let f = fs::File::create(td.ws().join(".mam/monitor.lock")).unwrap();
    let lock = mam::sys::Flock::acquire(f, mam::sys::LockMode::Exclusive).unwrap();
    let r = td.mam().args(["remove"]).run();
    r.expect_rc(3);
    assert!(r.stderr().contains("the daemon holds"), "{}", r.stderr());
    drop(lock);
    td.mam().args(["remove"]).run().expect_rc(0);
}

#[test]
fn t12_the_generated_shim_dir_is_removed() {
    let td = repo("i-t12");
    installed(&td);
    // Sourcing the installed lib.sh finds the installed wrapper already right: not rewritten.
    let herdr = fs::read(td.ws().join(".mam/shim/herdr")).unwrap();
    td.command("bash").args(["-c", ". .mam/shims/lib.sh"]).env("WORKSPACE_ROOT", td.ws()).run().expect_rc(0);
    assert_eq!(fs::read(td.ws().join(".mam/shim/herdr")).unwrap(), herdr);
    let text = String::from_utf8(herdr).unwrap();
    assert!(text.contains(&format!("mam='{}/.mam/bin/mam'", fs::canonicalize(td.ws()).unwrap().display())), "{text}");
    td.mam().args(["remove"]).run().expect_rc(0);
    assert!(!td.ws().join(".mam/shim").exists());
}

#[test]
fn t13_mam_env_is_ignored_by_git() {
    let td = repo("i-t13");
    installed(&td);
    td.write("ws/.mam.env", "MQTT_PASSWORD=secret\n");
    let s = git(&td, &["status", "--porcelain", "--untracked-files=all"]);
    assert!(!s.contains(".mam.env\n") && s.contains(".mam.env.example"), "{s}");
    git(&td, &["check-ignore", "-q", ".mam.env"]);
}

#[test]
fn install_on_an_installed_target_updates_and_keeps_local_edits() {
    let td = repo("i-reinstall");
    installed(&td);
    td.write("ws/.agents/skills/monitor/SKILL.md", "mine\n");
    let r = td.mam().args(["install"]).run();
    r.expect_rc(0);
    assert!(r.stdout().contains("updated mam"), "{}", r.stdout());
    let line = r
        .stdout()
        .lines()
        .find(|l| l.starts_with("kept local edit: .agents/skills/monitor/SKILL.md"))
        .unwrap()
        .to_string();
    assert_eq!(read(&td, line.rsplit(" -> ").next().unwrap()), "mine\n");
    assert!(read(&td, ".agents/skills/monitor/SKILL.md").starts_with("---\nname: monitor\n"));
    assert!(r.stderr().is_empty() || !r.stderr().contains("restart the daemon"), "{}", r.stderr());
    assert!(!td.ws().join(".mam/install/update-backup").exists());
}

#[test]
fn update_from_runs_the_other_binarys_install() {
    let td = repo("i-from");
    installed(&td);
    // A stand-in "other release" that records its argv.
    let other = td.write("bin/other-mam", "#!/bin/sh\nprintf '%s\\n' \"$@\" > \"$0.args\"\nexit 7\n");
    fs::set_permissions(&other, fs::Permissions::from_mode(0o755)).unwrap();
    let r = td.mam().args(["update", "--from"]).arg_path(&other).run();
    r.expect_rc(7);
    let ws = fs::canonicalize(td.ws()).unwrap();
    assert_eq!(
        fs::read_to_string(td.path("bin/other-mam.args")).unwrap(),
        format!("install\n--target\n{}\n", ws.display())
    );
}

trait ArgPath {
    fn arg_path(self, p: &Path) -> Self;
}
impl ArgPath for Cmd {
    fn arg_path(self, p: &Path) -> Cmd {
        self.args([p])
    }
}

// ---------------------------------------------------------------------------------------------
// SIGKILL at chosen points

#[cfg(feature = "test-hooks")]
fn killed_at(td: &TestDir, args: &[&str], n: u64, extra: &[(&str, &str)]) -> bool {
    use std::os::unix::process::ExitStatusExt;
    let mut c = td.mam().args(args).env("MAM_TEST_INSTALL_KILL_AFTER", n.to_string());
    for (k, v) in extra {
        c = c.env(k, v);
    }
    let r = c.run();
    match r.out.status.signal() {
        Some(9) => true,
        None => {
            r.expect_rc(0);
            false
        }
        Some(s) => panic!("signal {s}"),
    }
}

#[cfg(feature = "test-hooks")]
#[test]
fn install_killed_at_any_point_is_completed_by_the_next_install() {
    let mut killed = 0;
    for n in [1, 2, 3, 8, 20, 30, 38, 41, 44] {
        let td = repo(&format!("i-kill-inst-{n}"));
        td.write("ws/README", "user file\n");
        let before = snapshot(&td.ws());
        if killed_at(&td, &["install"], n, &[]) {
            killed += 1;
        }
        td.mam().args(["install"]).run().expect_rc(0);
        let left = unledgered(&td, &before);
        assert!(left.is_empty(), "kill after {n}: files in no ledger: {left:?}");
        assert!(!read(&td, ".mam/install/install_state").contains("pending="), "{n}");
        assert!(read(&td, ".mam/install/install_state").contains("gitignore_created=1\n"), "{n}");
        // The completed install is the same as an uninterrupted one.
        let fresh = repo(&format!("i-kill-inst-{n}-ref"));
        fresh.mam().args(["install"]).run().expect_rc(0);
        assert_eq!(manifest(&td), manifest(&fresh));
        assert_eq!(read(&td, ".mam/install/asset_hashes.txt"), read(&fresh, ".mam/install/asset_hashes.txt"));
        td.mam().args(["remove"]).run().expect_rc(0);
        assert!(diff(&before, &snapshot(&td.ws())).is_empty(), "{n}: remove after a completed install");
    }
    assert!(killed >= 7, "only {killed} kill points were reached");
}

#[cfg(feature = "test-hooks")]
#[test]
fn update_killed_at_any_point_is_restored_and_redone_by_the_next_update() {
    let mut killed = 0;
    for n in [1, 2, 3, 5, 8, 10, 12, 14] {
        let td = repo(&format!("i-kill-upd-{n}"));
        installed(&td);
        td.write("ws/.agents/skills/stop/SKILL.md", "my stop\n");
        let before = snapshot(&td.ws());
        if killed_at(&td, &["update"], n, &[("MAM_TEST_ASSET_VERSION", "5.5.5")]) {
            killed += 1;
            assert!(td.ws().join(".mam/install/update-backup").exists() || n == 1, "{n}: no backup to restore from");
        }
        let r = td.mam().args(["update"]).env("MAM_TEST_ASSET_VERSION", "5.5.5").run();
        r.expect_rc(0);
        assert!(!td.ws().join(".mam/install/update-backup").exists());
        let left = unledgered(&td, &before);
        assert!(left.is_empty(), "kill after {n}: files in no ledger: {left:?}");
        assert!(read(&td, ".mam/install/version.txt").starts_with("5.5.5 "), "{n}");
        // The local edit survived: exactly one copy, in a removed-<stamp> directory.
        let copies: Vec<String> = snapshot(&td.ws())
            .into_iter()
            .filter(|(k, (b, _))| k.starts_with(".mam/removed-") && b.as_slice() == b"my stop\n")
            .map(|(k, _)| k)
            .collect();
        assert_eq!(copies.len(), 1, "{n}: {copies:?}");
    }
    assert!(killed >= 6, "only {killed} kill points were reached");
}

#[cfg(feature = "test-hooks")]
#[test]
fn remove_killed_at_any_point_is_completed_by_the_next_remove() {
    let mut killed = 0;
    for n in [1, 2, 10, 25, 35, 38] {
        let td = repo(&format!("i-kill-rm-{n}"));
        td.write("ws/keep.txt", "user\n");
        let before = snapshot(&td.ws());
        installed(&td);
        td.write("ws/.agents/skills/status/SKILL.md", "my status\n");
        if killed_at(&td, &["remove"], n, &[]) {
            killed += 1;
            assert!(td.ws().join(".mam/install/manifest.txt").exists(), "{n}: the manifest goes last");
            td.mam().args(["remove"]).run().expect_rc(0);
        }
        let after = snapshot(&td.ws());
        let extra: Vec<&String> =
            after.keys().filter(|k| !before.contains_key(*k) && !k.starts_with(".mam/removed-")).collect();
        assert!(extra.is_empty(), "{n}: left after remove: {extra:?}");
        assert!(
            after.iter().any(|(k, (b, _))| k.starts_with(".mam/removed-") && b.as_slice() == b"my status\n"),
            "{n}"
        );
    }
    assert!(killed >= 5, "only {killed} kill points were reached");
}

// ---------------------------------------------------------------------------------------------
// A legacy install taken over

/// The legacy layout the seeds describe (src/install/legacy.rs): SKILL_DIR with scripts/ and
/// lib_py/, its stamp files, the eight skills, the state under .mam, the YAML sessions file, a
/// .mam.env, and the legacy .gitignore block.
fn legacy_install(td: &TestDir) {
    let d = "ws/.agents/skills/multi-agent-mux";
    for s in [
        "create_session.sh",
        "resume_session.sh",
        "stop_session.sh",
        "status.sh",
        "reconcile.sh",
        "delegate_job.sh",
        "run_loop.sh",
        "diff_collect.sh",
        "worktree_prepare.sh",
        "worktree_remove.sh",
        "orc_onboard.sh",
        "update.sh",
        "remove.sh",
        "update_yaml_resumed.sh",
    ] {
        td.write(&format!("{d}/scripts/{s}"), "#!/usr/bin/env bash\necho legacy\n");
    }
    td.write(&format!("{d}/scripts/lib.sh"), "legacy_lib=1\n");
    for p in ["registry.py", "publish_event.py", "heartbeat.py", "job_subscriber.py", "remote.py", "envfile.py"] {
        td.write(&format!("{d}/scripts/{p}"), "#!/usr/bin/env python3\nprint('legacy')\n");
    }
    td.write(&format!("{d}/lib_py/delegation/envfile.py"), "print('legacy')\n");
    td.write(&format!("{d}/lib_py/delegation/service.py"), "print('legacy')\n");
    td.write(&format!("{d}/version.txt"), "4.4.4 abc1234\n");
    td.write(&format!("{d}/install_state"), "version=4.4.4\ngitignore_created=1\nlegacy_only=yes\n");
    td.write(&format!("{d}/asset_hashes.txt"), "0000  scripts/lib.sh\n");
    td.write(&format!("{d}/install_manifest.txt"), "scripts/lib.sh\n");
    for s in ["create", "resume", "stop", "status", "monitor", "delegate-job", "loop", "orc-onboard"] {
        td.write(&format!("ws/.agents/skills/{s}/SKILL.md"), format!("---\nname: {s}\nversion: 4.4.4\n---\nlegacy\n"));
    }
    td.write("ws/.mam/jobs/5eb1abcf.json", r#"{"job_id":"5eb1abcf","status":"completed"}"#);
    td.write("ws/.mam/jobs/5eb1abcf/events.log", "{\"event\":\"started\"}\n");
    td.write("ws/.mam/delegate_job_logs/5eb1abcf/audit.jsonl", "{\"a\":1}\n");
    td.write(
        "ws/.mam/agent_sessions.yaml",
        "herdr_sessions:\n  - name: claude-01\n    agent: claude\n    status: stopped\n    cwd: /w\norchestrator_uuids:\n- 123e4567-e89b-12d3-a456-426614174000\n",
    );
    td.write("ws/.mam.env", "MQTT_PORT=1883\n");
    td.write(
        "ws/.gitignore",
        "node_modules/\n# >>> multi-agent-mux managed >>>\n/.venv/\n/.mam/\n# <<< multi-agent-mux managed <<<\n",
    );
}

#[test]
fn a_legacy_install_is_taken_over_and_its_old_paths_run() {
    let td = repo("i-legacy");
    legacy_install(&td);
    let state: Vec<&str> = vec![
        ".mam/jobs/5eb1abcf.json",
        ".mam/jobs/5eb1abcf/events.log",
        ".mam/delegate_job_logs/5eb1abcf/audit.jsonl",
        ".mam/agent_sessions.yaml",
        ".mam.env",
        ".agents/skills/multi-agent-mux/lib_py/delegation/service.py",
    ];
    let before: Vec<Vec<u8>> = state.iter().map(|p| fs::read(td.ws().join(p)).unwrap()).collect();
    let r = td.mam().args(["update"]).run();
    r.expect_rc(0);
    let out = r.stdout();
    assert!(out.contains("took over the legacy install"), "{out}");
    assert!(out.contains("imported the legacy sessions file .mam/agent_sessions.yaml (1 row(s))"), "{out}");
    // Not a byte of the state changed.
    for (p, b) in state.iter().zip(&before) {
        assert_eq!(&fs::read(td.ws().join(p)).unwrap(), b, "{p} changed");
    }
    // The sessions are now read from the JSON file, orchestrator uuid included.
    let json: serde_json::Value = serde_json::from_str(&read(&td, ".mam/agent_sessions.json")).unwrap();
    assert_eq!(json["herdr_sessions"][0]["name"], "claude-01");
    assert_eq!(json["orchestrator_uuids"][0], "123e4567-e89b-12d3-a456-426614174000");
    assert_eq!(read(&td, ".mam/agent_sessions.yaml.bak").as_bytes(), &before[3][..]);
    let st = td.mam().args(["status"]).run();
    st.expect_rc(0);
    assert!(st.stdout().lines().nth(1).is_some_and(|l| l.starts_with("claude-01\t")), "{}", st.stdout());
    // The legacy install_state keys survive; its ledgers and originals are kept aside.
    let s = read(&td, ".mam/install/install_state");
    assert!(
        s.contains("gitignore_created=1\n") && s.contains("legacy_only=yes\n") && s.contains("legacy_paths=1\n"),
        "{s}"
    );
    assert!(!td.ws().join(".agents/skills/multi-agent-mux/version.txt").exists());
    assert!(out.contains("legacy ledger .agents/skills/multi-agent-mux/version.txt kept as .mam/removed-"), "{out}");
    assert!(
        out.contains("kept local edit: .agents/skills/multi-agent-mux/scripts/registry.py -> .mam/removed-"),
        "{out}"
    );
    assert_eq!(
        read(&td, ".gitignore"),
        "node_modules/\n# >>> mam managed >>>\n/.venv\n/.mam/\n/.mam.env\n# <<< mam managed <<<\n"
    );
    // Every old path runs mam: directly, with bash, and (for .py) with python3.
    let scripts = td.ws().join(".agents/skills/multi-agent-mux/scripts");
    let other = td.path("home");
    for (file, usage) in [
        ("registry.py", "Usage: mam registry"),
        ("publish_event.py", "Usage: mam publish"),
        ("job_subscriber.py", "Usage: mam watch"),
        ("envfile.py", "Usage: mam env"),
        ("create_session.sh", "Usage: mam create"),
        ("run_loop.sh", "Usage: mam loop"),
        ("worktree_remove.sh", "Usage: mam worktree remove"),
        ("update.sh", "Usage: mam update"),
    ] {
        let p = scripts.join(file);
        let mut ways = vec![td.command(&p), td.command("bash").args([&p])];
        if file.ends_with(".py") && have_tool("python3", "MAM_REQUIRE_PYTHON3") {
            ways.push(td.command("python3").args([&p]));
        }
        for (i, c) in ways.into_iter().enumerate() {
            let r = c.args(["--help"]).cwd(&other).run();
            r.expect_rc(0);
            assert!(r.stdout().contains(usage), "{file} way {i}: {}", r.stdout());
        }
    }
    let r = td
        .command("bash")
        .args(["-c", ". .agents/skills/multi-agent-mux/scripts/lib.sh && mam_int ' 42 ' && echo \"$MAM_VERSION\""])
        .env("WORKSPACE_ROOT", td.ws())
        .run();
    r.expect_rc(0);
    assert_eq!(r.stdout(), format!("42\n{}\n", env!("CARGO_PKG_VERSION")));
    let p = td.ws().join(".agents/skills/multi-agent-mux/lib_py/delegation/envfile.py");
    let r = td.command(&p).args(["--path"]).cwd(&other).run();
    r.expect_rc(0);
    // A second update is an ordinary one and keeps the legacy paths installed.
    td.mam().args(["update"]).run().expect_rc(0);
    assert!(manifest(&td).contains(&".agents/skills/multi-agent-mux/scripts/registry.py".to_string()));
    // remove takes the legacy-path shims too; the state stays.
    td.mam().args(["remove"]).run().expect_rc(0);
    assert!(!scripts.join("registry.py").exists());
    for (p, b) in state.iter().zip(&before) {
        assert_eq!(&fs::read(td.ws().join(p)).unwrap(), b, "{p} changed by remove");
    }
}

/// Issue 32 item 11: a takeover (`mam update` over a legacy install) failed after every one of its
/// steps in turn leaves the tree exactly as it was (every path, bytes and mode, `.git` aside: the
/// legacy stamps back in place, no ledger of mam, nothing in `.mam/removed-*`), and the run that
/// gets past the last step is an ordinary, whole takeover.
#[cfg(feature = "test-hooks")]
#[test]
fn legacy_takeover_failing_at_each_step_restores_everything_and_the_next_run_succeeds() {
    let td = repo("i-legacy-fail");
    legacy_install(&td);
    // Modes the restore must keep as they were.
    let scripts = td.ws().join(".agents/skills/multi-agent-mux/scripts");
    fs::set_permissions(scripts.join("status.sh"), fs::Permissions::from_mode(0o700)).unwrap();
    fs::set_permissions(scripts.join("registry.py"), fs::Permissions::from_mode(0o751)).unwrap();
    fs::set_permissions(td.ws().join(".gitignore"), fs::Permissions::from_mode(0o640)).unwrap();
    // A link where an asset goes: moved aside by the run (never followed), moved back by the restore.
    let monitor = td.ws().join(".agents/skills/monitor/SKILL.md");
    fs::remove_file(&monitor).unwrap();
    std::os::unix::fs::symlink("../status/SKILL.md", &monitor).unwrap();
    let before = snapshot(&td.ws());
    // `mam install` over a legacy install is the same takeover.
    for n in [2, 7, 25] {
        let r = td.mam().args(["install"]).env("MAM_TEST_INSTALL_FAIL_AFTER", n.to_string()).run();
        r.expect_rc(1);
        let d = diff(&before, &snapshot(&td.ws()));
        assert!(d.is_empty(), "install failed at step {n}: {d:?}");
    }
    let mut n = 1;
    let done = loop {
        let r = td.mam().args(["update"]).env("MAM_TEST_INSTALL_FAIL_AFTER", n.to_string()).run();
        if r.rc() == 0 {
            break r;
        }
        r.expect_rc(1);
        assert!(r.stderr().contains("restored as it was"), "{n}: {}", r.stderr());
        let d = diff(&before, &snapshot(&td.ws()));
        assert!(d.is_empty(), "after a failure at step {n}: {d:?}");
        n += 1;
        assert!(n < 200, "the takeover never got past its last step");
    };
    // Every step of a takeover: 4 stamps, the import, 2 ledgers, every asset, and the finish.
    assert!(n > 40, "only {} failure points were reached", n - 1);
    assert!(done.stdout().contains("took over the legacy install"), "{}", done.stdout());
    assert!(!td.ws().join(".mam/install/update-backup").exists());
    let s = read(&td, ".mam/install/install_state");
    assert!(!s.contains("pending=") && s.contains("legacy_only=yes\n"), "{s}");
    assert!(!td.ws().join(".agents/skills/multi-agent-mux/version.txt").exists());
    let aside: Vec<String> = snapshot(&td.ws())
        .into_keys()
        .filter(|k| k.starts_with(".mam/removed-") && k.ends_with("/multi-agent-mux/version.txt"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    let r = td.command(scripts.join("status.sh")).args(["--help"]).cwd(td.path("home")).run();
    r.expect_rc(0);
    assert!(r.stdout().contains("Usage: mam status"), "{}", r.stdout());
}

/// The same takeover killed (SIGKILL) after each of its steps: the next run restores what the
/// killed one changed and takes the legacy install over as an uninterrupted run does.
#[cfg(feature = "test-hooks")]
#[test]
fn legacy_takeover_killed_at_each_step_is_restored_and_redone_by_the_next_run() {
    let reference = repo("i-legacy-kill-ref");
    legacy_install(&reference);
    reference.mam().args(["update"]).run().expect_rc(0);
    let mut killed = 0;
    for n in (1..60).step_by(4) {
        let td = repo(&format!("i-legacy-kill-{n}"));
        legacy_install(&td);
        if !killed_at(&td, &["update"], n, &[]) {
            break;
        }
        killed += 1;
        let r = td.mam().args(["update"]).run();
        r.expect_rc(0);
        assert!(r.stdout().contains("took over the legacy install"), "{n}: {}", r.stdout());
        assert_eq!(manifest(&td), manifest(&reference), "{n}");
        assert_eq!(read(&td, ".mam/install/asset_hashes.txt"), read(&reference, ".mam/install/asset_hashes.txt"));
        let s = read(&td, ".mam/install/install_state");
        assert!(!s.contains("pending=") && s.contains("legacy_only=yes\n"), "{n}: {s}");
        assert!(!td.ws().join(".mam/install/update-backup").exists(), "{n}");
        // Each legacy stamp is kept once, whatever the killed run had moved.
        let stamps: Vec<String> = snapshot(&td.ws())
            .into_keys()
            .filter(|k| k.starts_with(".mam/removed-") && k.ends_with("/multi-agent-mux/install_state"))
            .collect();
        assert_eq!(stamps.len(), 1, "{n}: {stamps:?}");
        assert!(read(&td, ".mam/agent_sessions.json").contains("claude-01"), "{n}");
    }
    assert!(killed >= 10, "only {killed} kill points were reached");
}

/// Issue 32 item 11: `mam install --legacy-paths` puts every legacy entry point at its legacy path
/// in a repository that never had the legacy install; they are assets like any other (manifest,
/// hashes), an update keeps them, and remove takes them away.
#[test]
fn install_legacy_paths_writes_every_legacy_entry_point_in_a_fresh_repository() {
    let td = repo("i-legacy-paths");
    let r = td.mam().args(["install", "--legacy-paths"]).run();
    r.expect_rc(0);
    let m = manifest(&td);
    let hashes = read(&td, ".mam/install/asset_hashes.txt");
    for e in mam::install::legacy::ENTRY_POINTS {
        let p = e.path();
        let meta = fs::symlink_metadata(td.ws().join(&p)).unwrap_or_else(|err| panic!("{p}: {err}"));
        assert!(meta.is_file(), "{p}");
        let want = if e.kind == mam::install::legacy::Kind::Sourced { 0o644 } else { 0o755 };
        assert_eq!(meta.permissions().mode() & 0o777, want, "{p}");
        assert!(m.contains(&p), "{p} not in the manifest");
        assert!(hashes.contains(&format!("  {p}\n")), "{p} not hashed");
    }
    assert!(read(&td, ".mam/install/install_state").contains("legacy_paths=1\n"));
    let scripts = td.ws().join(".agents/skills/multi-agent-mux/scripts");
    for (file, usage) in [("status.sh", "Usage: mam status"), ("registry.py", "Usage: mam registry")] {
        let r = td.command(scripts.join(file)).args(["--help"]).cwd(td.path("home")).run();
        r.expect_rc(0);
        assert!(r.stdout().contains(usage), "{file}: {}", r.stdout());
    }
    // An update keeps them (legacy_paths=1), and says nothing about a legacy install.
    let r = td.mam().args(["update"]).run();
    r.expect_rc(0);
    assert!(!r.stdout().contains("took over") && !r.stdout().contains("legacy ledger"), "{}", r.stdout());
    assert!(manifest(&td).contains(&".agents/skills/multi-agent-mux/scripts/status.sh".to_string()));
    td.mam().args(["remove"]).run().expect_rc(0);
    for e in mam::install::legacy::ENTRY_POINTS {
        assert!(fs::symlink_metadata(td.ws().join(e.path())).is_err(), "{} left by remove", e.path());
    }
    assert!(!td.ws().join(".agents").exists(), "remove left the emptied directories");
}

/// `--legacy-paths` never writes through a symlink and never replaces a file mam did not write:
/// each case is refused before anything changes, in one line naming the path.
#[test]
fn install_legacy_paths_refuses_a_symlink_or_a_file_mam_does_not_own() {
    let td = repo("i-legacy-paths-link");
    let outside = td.write("outside/status.sh", "precious\n");
    let scripts = td.ws().join(".agents/skills/multi-agent-mux/scripts");
    fs::create_dir_all(&scripts).unwrap();
    std::os::unix::fs::symlink(&outside, scripts.join("status.sh")).unwrap();
    let before = snapshot(&td.ws());
    let r = td.mam().args(["install", "--legacy-paths"]).run();
    r.expect_rc(2);
    let e = r.stderr();
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(
        e.starts_with("REFUSED: install: ") && e.contains("scripts/status.sh") && e.contains("symbolic link"),
        "{e}"
    );
    assert_eq!(fs::read_to_string(&outside).unwrap(), "precious\n");
    assert!(diff(&before, &snapshot(&td.ws())).is_empty(), "{:?}", diff(&before, &snapshot(&td.ws())));

    // A file of the user's at a legacy path (no legacy install here: no scripts/, no stamps).
    let td = repo("i-legacy-paths-mine");
    td.write("ws/.agents/skills/multi-agent-mux/lib_py/delegation/envfile.py", "mine\n");
    let before = snapshot(&td.ws());
    let r = td.mam().args(["install", "--legacy-paths"]).run();
    r.expect_rc(2);
    let e = r.stderr();
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(e.contains("lib_py/delegation/envfile.py") && e.contains("not written by mam"), "{e}");
    assert!(diff(&before, &snapshot(&td.ws())).is_empty());

    // The legacy skill directory itself a symlink: nothing is written into where it points.
    let td = repo("i-legacy-paths-dir");
    let elsewhere = td.path("elsewhere");
    fs::create_dir_all(&elsewhere).unwrap();
    fs::create_dir_all(td.ws().join(".agents/skills")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, td.ws().join(".agents/skills/multi-agent-mux")).unwrap();
    let before = snapshot(&td.ws());
    let r = td.mam().args(["install", "--legacy-paths"]).run();
    r.expect_rc(2);
    assert!(r.stderr().contains("symbolic link"), "{}", r.stderr());
    assert!(fs::read_dir(&elsewhere).unwrap().next().is_none(), "wrote through the link");
    assert!(diff(&before, &snapshot(&td.ws())).is_empty());
}

// ---------------------------------------------------------------------------------------------
// Bad input

#[test]
fn bad_targets_are_refused_with_nothing_changed() {
    // Not a git repository.
    let td = TestDir::new("i-nogit");
    let before = snapshot(&td.ws());
    let r = td.mam().args(["install"]).run();
    r.expect_rc(2);
    assert!(
        r.stderr().starts_with("REFUSED: install: ") && r.stderr().contains("not a git repository"),
        "{}",
        r.stderr()
    );
    assert!(diff(&before, &snapshot(&td.ws())).is_empty());
    // Missing, and a file.
    let r = td.mam().args(["install", "--target", "/nonexistent/mam-target"]).run();
    r.expect_rc(2);
    td.write("afile", "x");
    let r = td.mam().args(["install", "--target"]).arg_path(&td.path("afile")).run();
    r.expect_rc(2);
    assert!(r.stderr().contains("is not a directory"), "{}", r.stderr());
    // .gitignore a directory, .agents a symlink.
    let td = repo("i-gidir");
    fs::create_dir_all(td.ws().join(".gitignore")).unwrap();
    let before = snapshot(&td.ws());
    let r = td.mam().args(["install"]).run();
    r.expect_rc(2);
    assert!(r.stderr().contains(".gitignore is not a regular file"), "{}", r.stderr());
    assert!(diff(&before, &snapshot(&td.ws())).is_empty());
    let td = repo("i-link");
    std::os::unix::fs::symlink(td.path("home"), td.ws().join(".agents")).unwrap();
    let r = td.mam().args(["install"]).run();
    r.expect_rc(2);
    assert!(r.stderr().contains("symbolic link"), "{}", r.stderr());
    assert!(fs::read_dir(td.path("home")).unwrap().next().is_none(), "wrote through the link");
    // Unknown flag.
    td.mam().args(["install", "--bogus"]).run().expect_rc(2);
    td.mam().args(["remove", "--from", "x"]).run().expect_rc(2);
}

#[test]
fn a_read_only_target_is_refused() {
    let td = repo("i-ro");
    let root = mam::sys::geteuid() == 0;
    let cmd = if root {
        if !have_tool("setpriv", "MAM_REQUIRE_SETPRIV") {
            return;
        }
        // root writes anywhere: run as nobody on a root-owned 0755 repository.
        fs::set_permissions(td.ws(), fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(td.path("home"), fs::Permissions::from_mode(0o777)).unwrap();
        td.command("setpriv").args(["--reuid=65534", "--regid=65534", "--clear-groups"]).args([mam_bin()])
    } else {
        fs::set_permissions(td.ws(), fs::Permissions::from_mode(0o555)).unwrap();
        td.mam()
    };
    let before = snapshot(&td.ws());
    let r = cmd.args(["install", "--target"]).arg_path(&td.ws()).env("MAM_TRUSTED_ROOTS", "*").run();
    fs::set_permissions(td.ws(), fs::Permissions::from_mode(0o755)).unwrap();
    r.expect_rc(2);
    assert!(r.stderr().contains("is not writable"), "{}", r.stderr());
    assert!(diff(&before, &snapshot(&td.ws())).is_empty());
}

#[test]
fn gitignore_without_final_newline_or_with_crlf_keeps_its_lines() {
    let td = repo("i-nonl");
    td.write("ws/.gitignore", "target");
    installed(&td);
    assert_eq!(
        read(&td, ".gitignore"),
        "target\n# >>> mam managed >>>\n/.venv\n/.mam/\n/.mam.env\n# <<< mam managed <<<\n"
    );
    td.mam().args(["remove"]).run().expect_rc(0);
    assert_eq!(read(&td, ".gitignore"), "target\n");
    let td = repo("i-crlf");
    td.write("ws/.gitignore", "a\r\nb\r\n");
    installed(&td);
    assert_eq!(
        read(&td, ".gitignore"),
        "a\r\nb\r\n# >>> mam managed >>>\r\n/.venv\r\n/.mam/\r\n/.mam.env\r\n# <<< mam managed <<<\r\n"
    );
    td.mam().args(["update"]).run().expect_rc(0);
    td.mam().args(["remove"]).run().expect_rc(0);
    assert_eq!(read(&td, ".gitignore"), "a\r\nb\r\n");
}

#[test]
fn a_ledger_naming_a_path_outside_the_target_is_refused_and_nothing_is_deleted() {
    for bad in ["../outside.txt", "/OUTSIDE", ".agents/../../outside.txt"] {
        let td = repo("i-ledger");
        installed(&td);
        let outside = td.write("outside.txt", "precious\n");
        let bad = bad.replace("/OUTSIDE", &outside.to_string_lossy());
        let mut m = read(&td, ".mam/install/manifest.txt");
        m.push_str(&format!("{bad}\n"));
        td.write("ws/.mam/install/manifest.txt", m);
        let before = snapshot(&td.ws());
        for cmd in ["remove", "update"] {
            let r = td.mam().args([cmd]).run();
            r.expect_rc(1);
            assert!(
                r.stderr().starts_with(&format!("REFUSED: {cmd}: .mam/install/manifest.txt line "))
                    && r.stderr().contains("nothing deleted"),
                "{bad}: {}",
                r.stderr()
            );
            assert_eq!(fs::read_to_string(&outside).unwrap(), "precious\n");
            assert!(diff(&before, &snapshot(&td.ws())).is_empty(), "{cmd} {bad}");
        }
    }
    // The same in asset_hashes.txt.
    let td = repo("i-ledger2");
    installed(&td);
    let mut h = read(&td, ".mam/install/asset_hashes.txt");
    h.push_str(&format!("{}  ../x\n", "0".repeat(64)));
    td.write("ws/.mam/install/asset_hashes.txt", h);
    td.mam().args(["remove"]).run().expect_rc(1);
    assert!(td.ws().join(".mam/bin/mam").exists());
}

// ---------------------------------------------------------------------------------------------
// Shims, lib.sh, the herdr wrapper

#[test]
fn a_shim_without_a_binary_says_where_it_looked_in_one_line_rc_127() {
    let td = TestDir::new("i-127");
    for shim in ["create_session.sh", "registry", "install.sh", "orc_onboard.sh"] {
        let dir = td.path("lonely/shims");
        fs::create_dir_all(&dir).unwrap();
        fs::copy(root().join("shims").join(shim), dir.join(shim)).unwrap();
        let r = td.command(dir.join(shim)).env("PATH", "/usr/bin:/bin").args(["x"]).run();
        r.expect_rc(127);
        let e = r.stderr();
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(
            e.starts_with(&format!("ERROR: {shim}: mam binary not found (looked at MAM_BIN=<unset>, "))
                && e.contains("/../bin/mam, mam on PATH)"),
            "{e}"
        );
    }
}

#[test]
fn reconcile_once_is_the_one_shot_reconcile() {
    let td = TestDir::new("i-once");
    let r = td.mam().args(["reconcile", "--once"]).run();
    r.expect_rc(0);
    let plain = td.mam().args(["reconcile"]).run();
    assert_eq!(r.stdout(), plain.stdout());
    td.mam().args(["reconcile", "--once", "--subscribe"]).run().expect_rc(2);
    let shim = root().join("shims/reconcile.sh");
    td.command(&shim).env("MAM_BIN", mam_bin()).args(["--once"]).run().expect_rc(0);
}

#[test]
fn lib_sh_takes_every_function_in_its_legacy_argument_forms() {
    let td = repo("i-libsh");
    let bin = td.path("bin");
    fs::create_dir_all(&bin).unwrap();
    // A recording stand-in for mam: prints its argv; answers `paths` and `--version` like mam.
    let fake = td.write(
        "bin/mam",
        format!(
            "#!/usr/bin/env bash\ncase \"$1\" in\n  paths) exec '{real}' \"$@\" ;;\n  --version|install|env) exec '{real}' \"$@\" ;;\nesac\nprintf '<%s>' \"$@\"\n[ \"$1 $2\" = 'pane send-keys-safe' ] && for a; do case $prev in --prompt-file) printf '[%s]' \"$(cat \"$a\")\" ;; esac; prev=$a; done\necho\n",
            real = mam_bin().display()
        ),
    );
    fs::set_permissions(&fake, fs::Permissions::from_mode(0o755)).unwrap();
    let ws = td.ws().to_string_lossy().into_owned();
    fs::create_dir_all(td.ws().join("sub dir")).unwrap();
    let script = format!(
        ". '{lib}'\n\
         mam_abs_workspace 'sub dir'\n\
         mam_abs_workspace /no/such/dir\n\
         mam_abs_workspace\n\
         delegate_logs_dir /r/jobs\n\
         delegate_logs_dir\n\
         send_keys_safe claude-01 'hello world'\n\
         send_keys_safe claude-01 'p' jid1 /r/jobs\n\
         send_keys_safe --target t --prompt-file /f\n\
         start_watchdog\n\
         start_watchdog 'sub dir' /r/jobs\n\
         start_watchdog --registry-dir /r/jobs\n\
         mam_int ' 7 '\n\
         mam_control_plane_prefix >/dev/null && echo prefix-ok\n\
         mam_control_plane_json >/dev/null && echo json-ok\n\
         delegate_publish_cmd --job-id j1\n",
        lib = root().join("shims/lib.sh").display()
    );
    let r = td.command("bash").args(["-c", &script]).env("MAM_BIN", &fake).env("WORKSPACE_ROOT", td.ws()).run();
    r.expect_rc(0);
    let want = [
        format!("{ws}/sub dir"),
        "/no/such/dir".to_string(),
        ws.clone(),
        "/r/delegate_job_logs".to_string(),
        format!("{ws}/.mam/delegate_job_logs"),
        "<pane><send-keys-safe><--target><claude-01><--prompt-file>".to_string(),
        "<pane><send-keys-safe><--target><claude-01><--prompt-file>".to_string(),
        "<pane><send-keys-safe><--target><t><--prompt-file></f>".to_string(),
        format!("<daemon><ensure><--workspace><{ws}>"),
        format!("<daemon><ensure><--workspace><{ws}/sub dir><--registry-dir></r/jobs>"),
        format!("<daemon><ensure><--workspace><{ws}><--registry-dir></r/jobs>"),
        "7".to_string(),
        "prefix-ok".to_string(),
        "json-ok".to_string(),
        "<registry><publish-cmd><--job-id><j1>".to_string(),
    ];
    let stdout = r.stdout();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), want.len(), "{stdout}");
    for (i, (got, w)) in lines.iter().zip(&want).enumerate() {
        assert!(got.starts_with(w.as_str()), "line {i}: {got} (want {w})");
    }
    // The prompt reached the file, not the argv; job and registry were passed on.
    assert!(lines[5].ends_with("[hello world]") && !lines[5].contains("<hello world>"), "{}", lines[5]);
    assert!(lines[6].contains("<--job><jid1><--registry-dir></r/jobs>[p]"), "{}", lines[6]);
}

#[test]
fn the_herdr_wrapper_maps_the_legacy_verbs_and_the_new_session_k_v_form() {
    let td = TestDir::new("i-herdr");
    let fake = td.write("bin/mam", "#!/usr/bin/env bash\nprintf '<%s>' \"$@\"; echo\n");
    fs::set_permissions(&fake, fs::Permissions::from_mode(0o755)).unwrap();
    let realh = td.write("realbin/herdr", "#!/usr/bin/env bash\nprintf 'real:'; printf '<%s>' \"$@\"; echo\n");
    fs::set_permissions(&realh, fs::Permissions::from_mode(0o755)).unwrap();
    let text = mam::install::assets::herdr_shim(&fake.to_string_lossy());
    let w = td.write("ws/.mam/shim/herdr", text);
    fs::set_permissions(&w, fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:{}:/usr/bin:/bin", td.ws().join(".mam/shim").display(), td.path("realbin").display());
    let run = |args: &[&str]| {
        let r = td.command("herdr").args(args).env("PATH", &path).run();
        r.expect_rc(0);
        r.stdout()
    };
    assert_eq!(
        run(&["new-session", "WORKSPACE_ROOT=/a b", "X=1", "--agent", "claude", "--name", "n", "--cwd", "/d"]),
        "<pane><new-session><--env><WORKSPACE_ROOT=/a b><--env><X=1><--agent><claude><--name><n><--cwd></d>\n"
    );
    assert_eq!(run(&["ls", "--json"]), "<pane><ls><--json>\n");
    assert_eq!(run(&["status", "--target", "a"]), "<pane><status><--target><a>\n");
    assert_eq!(run(&["send-keys-safe", "--target", "a"]), "<pane><send-keys-safe><--target><a>\n");
    // Any other verb goes to the real herdr further down PATH, never to the wrapper itself.
    assert_eq!(run(&["agent", "list"]), "real:<agent><list>\n");
}

// ---------------------------------------------------------------------------------------------
// The skills against the CLI

/// Every `mam ...` line in a fenced block of every skill. Lines that only read run for real in a
/// repository; the others run with `--help` (before a `--`), which parses every flag of the line, so
/// a flag the CLI no longer has fails here.
#[test]
fn every_command_line_a_skill_shows_parses_with_todays_cli() {
    let td = repo("i-skills");
    let read_only = [
        "mam status",
        "mam status --json",
        "mam jobs",
        "mam jobs --json",
        "mam monitor status",
        "mam worktree list",
        "mam reconcile --once",
    ];
    let mut n = 0;
    let mut not_yet = Vec::new();
    for e in fs::read_dir(root().join("assets/skills")).unwrap().flatten() {
        let text = fs::read_to_string(e.path().join("SKILL.md")).unwrap();
        let mut fenced = false;
        for l in text.lines() {
            if l.starts_with("```") {
                fenced = !fenced;
                continue;
            }
            if !fenced || !l.starts_with("mam ") {
                continue;
            }
            n += 1;
            let words: Vec<&str> = l.split_whitespace().skip(1).collect();
            if read_only.contains(&l) {
                let r = td.mam().args(&words).run();
                assert_eq!(r.rc(), 0, "{l}: {}", r.stderr());
                continue;
            }
            let mut args: Vec<&str> = words.clone();
            let at = args.iter().position(|w| *w == "--").unwrap_or(args.len());
            args.insert(at, "--help");
            let r = td.mam().args(&args).run();
            assert_eq!(r.rc(), 0, "{l}: {}{}", r.stdout(), r.stderr());
            let out = r.stdout();
            assert!(out.starts_with("Usage: mam "), "{l}: {out}");
            if out.contains("Not yet available in this build") {
                not_yet.push(l.to_string());
                continue;
            }
            for w in &words[..at.min(words.len())] {
                if w.starts_with("--") && *w != "--" {
                    let flag = w.split('=').next().unwrap();
                    assert!(out.contains(flag), "{l}: {flag} is not in the help of {:?}", &words[..2.min(words.len())]);
                }
            }
        }
    }
    assert!(n >= 40, "only {n} command lines found");
    // orc-onboard is built in parallel (ORCH 6.5); until it is merged its lines only parse as a
    // command mam lists. Nothing else may be pending.
    assert!(not_yet.iter().all(|l| l.starts_with("mam orc-onboard")), "{not_yet:?}");
}

#[test]
fn the_skills_carry_the_statements_the_seeds_require() {
    let skill = |s: &str| fs::read_to_string(root().join(format!("assets/skills/{s}/SKILL.md"))).unwrap();
    assert!(skill("loop").contains("Staleness under env isolation"));
    assert!(skill("create").contains("Daemon opt-out") && skill("create").contains("MAM_NO_SUBSCRIBER_DAEMON=1"));
    assert!(
        skill("stop").contains("rev-set rule")
            && skill("stop").contains("HEAD --exclude=refs/stash --all --not --remotes")
    );
    for s in ["stop", "orc-onboard"] {
        assert!(skill(s).contains("Purge holders") || skill(s).contains("Purge"), "{s}");
        assert!(skill(s).contains("ps -eo pid=,ppid=,args="), "{s}: how to find holders");
    }
}

// ---------------------------------------------------------------------------------------------
// Every legacy flag and env name the seeds mention

fn seed_names(dir: &Path) -> Vec<String> {
    let mut names = std::collections::BTreeSet::new();
    for e in fs::read_dir(dir).unwrap().flatten() {
        let text = fs::read_to_string(e.path()).unwrap();
        let b = text.as_bytes();
        let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b'-';
        let mut i = 0;
        while i < b.len() {
            // --flag: not preceded by a word character or '-'.
            if b[i..].starts_with(b"--")
                && (i == 0 || !word(b[i - 1]))
                && b.get(i + 2).is_some_and(|c| c.is_ascii_lowercase())
            {
                let mut j = i + 2;
                while j < b.len() && (b[j].is_ascii_lowercase() || b[j].is_ascii_digit() || b[j] == b'-') {
                    j += 1;
                }
                names.insert(String::from_utf8_lossy(&b[i..j]).into_owned());
                i = j;
                continue;
            }
            // ENV_NAME: an upper-case word with an underscore.
            if b[i].is_ascii_uppercase() && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')) {
                let mut j = i;
                while j < b.len() && (b[j].is_ascii_uppercase() || b[j].is_ascii_digit() || b[j] == b'_') {
                    j += 1;
                }
                let w = &text[i..j];
                let w = w.trim_end_matches('_');
                let next_word = b.get(j).is_some_and(|c| c.is_ascii_lowercase());
                if w.contains('_') && !next_word {
                    names.insert(w.to_string());
                }
                i = j.max(i + 1);
                continue;
            }
            i += 1;
        }
    }
    names.into_iter().collect()
}

#[test]
fn legacy_names_snapshot() {
    let table = fs::read_to_string(root().join("tests/fixtures/legacy_names.txt")).unwrap();
    let rows: Vec<Vec<&str>> =
        table.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).map(|l| l.split('\t').collect()).collect();
    let names: Vec<String> = rows.iter().map(|r| r[0].to_string()).collect();
    // The seeds live beside the repository (../shared/seeds from the main checkout); when they are
    // there the table must list exactly what they mention.
    let seeds = [root().join("../shared/seeds"), root().join("../../shared/seeds")].into_iter().find(|p| p.is_dir());
    if let Some(dir) = seeds {
        let found = seed_names(&dir);
        assert_eq!(found, names, "tests/fixtures/legacy_names.txt differs from what the seeds mention");
    }
    let td = TestDir::new("i-names");
    for r in &rows {
        assert_eq!(r.len(), 3, "{r:?}");
        let (name, check) = (r[0], r[1]);
        if let Some(args) = check.strip_prefix("help:") {
            let mut a: Vec<&str> = args.split(' ').collect();
            a.push("--help");
            let out = td.mam().args(&a).run().stdout();
            assert!(out.contains(name), "{name}: not in `mam {args} --help`");
        } else if let Some(f) = check.strip_prefix("file:") {
            assert!(fs::read_to_string(root().join(f)).unwrap().contains(name), "{name}: not in {f}");
        } else {
            assert_eq!(check, "-", "{name}");
        }
    }
}
