//! Worktrees (ORCH 5.3 tests 1-18, A43, A44, A57): `mam worktree prepare|remove|list` on real git
//! repositories with real submodules. Submodules come from local paths, allowed only through the
//! `GIT_CONFIG_COUNT/KEY_0/VALUE_0` environment variables (`protocol.file.allow=always`), never a
//! global config. Sessions run on the fake pane backend with the fake agent.
//!
//! Also: each kind of unsaved work one at a time (refused with and without `--stop`, the work
//! byte-for-byte intact), `kill -9` of `prepare --submodules` at several points (a `git` wrapper
//! first on PATH blocks on a fifo when it sees a chosen git command, so the process is killed at
//! that exact point, no sleeps), and bad input. And issue 14's gaps: a failing `remove --stop` on
//! real tmux (a `tmux` wrapper whose `kill-pane` fails), onboarding under `prepare --creator` on the
//! embedded broker with the control root's daemon, and a worktree's creator on the real herdr.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::json;

use crate::support::*;

/// The one way local submodule URLs are allowed, over `support::GIT_ENV` (A55) in every git run.
const SUBMODULE_ALLOW: &[(&str, &str)] =
    &[("GIT_CONFIG_COUNT", "1"), ("GIT_CONFIG_KEY_0", "protocol.file.allow"), ("GIT_CONFIG_VALUE_0", "always")];

const LIMIT: Duration = Duration::from_secs(30);

fn git_out(dir: &Path, args: &[&str]) -> std::process::Output {
    git_output(dir, args, SUBMODULE_ALLOW)
}

/// Runs git in `dir`, asserting success; stdout trimmed.
fn git(dir: &Path, args: &[&str]) -> String {
    git_with(dir, args, SUBMODULE_ALLOW)
}

/// One control root that is a git repository (`app.txt`, a `.gitignore` of `/.mam/`), with the
/// fake pane backend; kills the fake agents it started on drop.
struct W {
    td: TestDir,
    root: PathBuf,
    env: Vec<(String, OsString)>,
}

impl Drop for W {
    fn drop(&mut self) {
        for e in fs::read_dir(self.td.path("panes/panes")).into_iter().flatten().flatten() {
            if let Ok(pid) = fs::read_to_string(e.path().join("pid")).unwrap_or_default().trim().parse::<i32>() {
                let _ = mam::sys::kill(-pid, 9);
            }
        }
    }
}

impl W {
    fn new(name: &str) -> W {
        let td = TestDir::new(name);
        let root = td.ws();
        git(&root, &["init", "-q", "-b", "main"]);
        fs::write(root.join("app.txt"), "version 1\n").unwrap();
        fs::write(root.join(".gitignore"), "/.mam/\n").unwrap();
        git(&root, &["add", "-A"]);
        git(&root, &["commit", "-q", "-m", "initial"]);
        let mut env: Vec<(String, OsString)> = vec![
            ("MAM_PANE_BACKEND".into(), "fake".into()),
            ("MAM_FAKE_PANES_DIR".into(), td.path("panes").into()),
            ("MAM_SKS_POLL_MS".into(), "50".into()),
            ("MAM_SKS_QUIESCE_GAP_MS".into(), "50".into()),
            ("MAM_STARTUP_DIALOG_SETTLE_MS".into(), "50".into()),
            ("MAM_AGENT_START_TIMEOUT_MS".into(), "20000".into()),
            ("MAM_PUBLISH_BUDGET_S".into(), "1".into()),
            // No broker: a stop's closed-state publish goes to a port nobody listens on.
            ("MQTT_PORT".into(), free_port().to_string().into()),
        ];
        for (k, v) in GIT_ENV.iter().chain(SUBMODULE_ALLOW) {
            env.push(((*k).into(), (*v).into()));
        }
        W { td, root, env }
    }

    fn mam(&self) -> Cmd {
        let mut c = self.td.mam().cwd(&self.root);
        for (k, v) in &self.env {
            c = c.env(k, v);
        }
        c
    }

    fn run(&self, args: &[&str]) -> Run {
        self.mam().args(args).run_within(LIMIT)
    }

    fn head(&self) -> String {
        git(&self.root, &["rev-parse", "HEAD"])
    }

    /// A repository at `<td>/src-<name>` with one commit, to be a submodule's origin.
    fn origin(&self, name: &str) -> PathBuf {
        let p = self.td.path(&format!("src-{name}"));
        fs::create_dir_all(&p).unwrap();
        git(&p, &["init", "-q", "-b", "main"]);
        fs::write(p.join("lib.txt"), format!("{name} 1\n")).unwrap();
        git(&p, &["add", "-A"]);
        git(&p, &["commit", "-q", "-m", &format!("{name} initial")]);
        p
    }

    /// Adds submodules (name -> origin) to the control root and commits, then leaves the main
    /// worktree with none of them initialised and no `submodule.*` key in the shared config, so
    /// what a linked worktree's init does is visible.
    fn with_submodules(&self, names: &[&str]) {
        for n in names {
            let o = self.origin(n);
            git(&self.root, &["submodule", "add", "-q", o.to_str().unwrap(), n]);
        }
        git(&self.root, &["commit", "-q", "-m", "submodules"]);
        git(&self.root, &["submodule", "deinit", "-q", "--force", "--all"]);
        for n in names {
            let _ = git_out(&self.root, &["config", "--remove-section", &format!("submodule.{n}")]);
        }
        let _ = fs::remove_dir_all(self.root.join(".git/modules"));
    }

    /// `prepare <branch> [extra]`, expecting rc 0; returns the worktree path.
    fn prepare(&self, branch: &str, extra: &[&str]) -> PathBuf {
        let r = self.mam().args(["worktree", "prepare", branch]).args(extra).run_within(LIMIT);
        r.expect_rc(0);
        PathBuf::from(r.stdout().lines().next().unwrap().strip_prefix("WORKTREE=").unwrap())
    }

    fn remove(&self, path: &Path, extra: &[&str]) -> Run {
        self.mam().args(["worktree", "remove"]).arg_path(path).args(extra).run_within(LIMIT)
    }

    fn config(&self) -> Vec<u8> {
        fs::read(self.root.join(".git/config")).unwrap()
    }

    fn submodule_keys(&self) -> String {
        let out = git_out(&self.root, &["config", "--file", ".git/config", "--get-regexp", "^submodule"]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A session of the fake agent in `dir` (script lines `key=value`).
    fn session(&self, name: &str, dir: &Path, script: &str) {
        let sp = self.td.write(&format!("{name}.script"), script);
        self.mam()
            .args(["create", "claude", "--name", name, "--no-onboard", "--workspace"])
            .arg_path(dir)
            .args(["--", "test-double", "agent"])
            .env("MAM_FAKE_AGENT_SCRIPT", &sp)
            .run_within(LIMIT)
            .expect_rc(0);
    }

    fn row_status(&self, name: &str) -> String {
        let doc: serde_json::Value =
            serde_json::from_slice(&fs::read(self.root.join(".mam/agent_sessions.json")).unwrap()).unwrap();
        doc["herdr_sessions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .map(|r| r["status"].as_str().unwrap_or("").to_string())
            .unwrap_or_default()
    }

    /// The worktree's administrative directory `<root>/.git/worktrees/<id>`.
    fn admin(&self, wt: &Path) -> PathBuf {
        PathBuf::from(git(wt, &["rev-parse", "--absolute-git-dir"]))
    }

    fn worktree_count(&self) -> usize {
        git(&self.root, &["worktree", "list", "--porcelain"]).lines().filter(|l| l.starts_with("worktree ")).count()
    }
}

trait ArgPath {
    fn arg_path(self, p: &Path) -> Cmd;
}

impl ArgPath for Cmd {
    fn arg_path(self, p: &Path) -> Cmd {
        self.args([p.as_os_str()])
    }
}

/// `RESULT=.. METHOD=.. FINDINGS=..` must be the last stdout line: (result, method, findings).
fn summary(r: &Run) -> (String, String, String) {
    let out = r.stdout();
    let last = out.lines().last().unwrap_or_else(|| panic!("no stdout\n{}", r.stderr())).to_string();
    let get = |k: &str| {
        last.split(' ')
            .find_map(|w| w.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("{k} in {last}"))
            .to_string()
    };
    (get("RESULT"), get("METHOD"), get("FINDINGS"))
}

/// Every file below `dir` with its bytes (symlinks as their target text), for "byte-for-byte".
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    fn walk(base: &Path, d: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        let Ok(rd) = fs::read_dir(d) else { return };
        for e in rd.flatten() {
            let p = e.path();
            let m = fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(base).unwrap().to_path_buf();
            if m.is_symlink() {
                out.insert(rel, fs::read_link(&p).unwrap().into_os_string().into_encoded_bytes());
            } else if m.is_dir() {
                walk(base, &p, out);
            } else {
                out.insert(rel, fs::read(&p).unwrap());
            }
        }
    }
    walk(dir, dir, &mut out);
    out
}

// ---------------------------------------------------------------------------------------------
// A git wrapper first on PATH: blocks on a fifo (after writing its pid to `reached`) when every
// word of `block-on` is one of its arguments, or fails when every word of `fail-on` is.

struct Wrapper {
    dir: PathBuf,
}

impl Wrapper {
    fn new(w: &W) -> Wrapper {
        let dir = w.td.path("gitwrap");
        fs::create_dir_all(&dir).unwrap();
        let real =
            String::from_utf8(Command::new("sh").args(["-c", "command -v git"]).output().unwrap().stdout).unwrap();
        let script = format!(
            r#"#!/usr/bin/env bash
d="${{BASH_SOURCE[0]%/*}}"
all() {{ local w a f; for w in $1; do f=; for a in "${{@:2}}"; do [ "$a" = "$w" ] && f=1; done; [ -n "$f" ] || return 1; done; }}
if [ -f "$d/fail-on" ] && all "$(cat "$d/fail-on")" "$@"; then echo "fatal: failing on purpose (test wrapper)" >&2; exit 1; fi
if [ -f "$d/block-on" ] && all "$(cat "$d/block-on")" "$@"; then echo $$ > "$d/reached.tmp"; mv "$d/reached.tmp" "$d/reached"; cat "$d/fifo" > /dev/null; fi
exec {} "$@"
"#,
            real.trim()
        );
        fs::write(dir.join("git"), script).unwrap();
        fs::set_permissions(dir.join("git"), fs::Permissions::from_mode(0o755)).unwrap();
        assert!(Command::new("mkfifo").arg(dir.join("fifo")).status().unwrap().success());
        Wrapper { dir }
    }

    fn path_var(&self) -> OsString {
        let mut p = self.dir.clone().into_os_string();
        p.push(":");
        p.push(std::env::var_os("PATH").unwrap_or_default());
        p
    }

    fn block_on(&self, words: &str) {
        let _ = fs::remove_file(self.dir.join("reached"));
        fs::write(self.dir.join("block-on"), words).unwrap();
    }

    fn fail_on(&self, words: &str) {
        fs::write(self.dir.join("fail-on"), words).unwrap();
    }

    fn clear(&self) {
        let _ = fs::remove_file(self.dir.join("block-on"));
        let _ = fs::remove_file(self.dir.join("fail-on"));
        let _ = fs::remove_file(self.dir.join("reached"));
    }

    /// The blocked wrapper's pid, once it blocked.
    fn reached(&self, bg: &mut Background) -> i32 {
        let p = self.dir.join("reached");
        let pid = poll(LIMIT, || fs::read_to_string(&p).ok().and_then(|s| s.trim().parse::<i32>().ok()));
        match pid {
            Some(pid) => pid,
            None => panic!("the wrapper never blocked\n--- stdout\n{}--- stderr\n{}", bg.stdout(), bg.stderr()),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 5.3 tests 1-18

#[test]
fn t1_prepare_twice_same_output_one_worktree_inside_root_refused_existing_branch_base_warns() {
    let w = W::new("wt-t1");
    let a = w.run(&["worktree", "prepare", "feat/one"]);
    a.expect_rc(0);
    let b = w.run(&["worktree", "prepare", "feat/one"]);
    b.expect_rc(0);
    assert_eq!(a.stdout(), b.stdout());
    assert!(b.stderr().contains("reused"), "{}", b.stderr());
    assert_eq!(w.worktree_count(), 2);
    let lines: Vec<String> = a.stdout().lines().map(str::to_string).collect();
    assert_eq!(lines.len(), 3);
    assert!(
        lines[0].starts_with("WORKTREE=/") && lines[1] == "BRANCH=feat/one" && lines[2] == format!("BASE={}", w.head())
    );

    let inside = w.root.join("sub/wt");
    let r = w.mam().args(["worktree", "prepare", "feat/two", "--path"]).arg_path(&inside).run();
    r.expect_rc(2);
    assert!(r.stderr().starts_with("REFUSED: worktree prepare: ") && r.stderr().contains("inside the control root"));
    assert!(!inside.exists());
    assert_eq!(w.worktree_count(), 2);
    assert!(git_out(&w.root, &["rev-parse", "--verify", "refs/heads/feat/two"]).status.code() != Some(0));

    git(&w.root, &["branch", "old"]);
    let r = w.run(&["worktree", "prepare", "old", "--base", "main"]);
    r.expect_rc(0);
    assert!(r.stderr().contains("WARNING: ") && r.stderr().contains("not its start point"), "{}", r.stderr());
}

#[test]
fn t2_venv_link_and_both_exclude_lines_once() {
    let w = W::new("wt-t2");
    fs::create_dir_all(w.root.join(".venv/bin")).unwrap();
    let wt = w.prepare("feat", &[]);
    assert_eq!(fs::read_link(wt.join(".venv")).unwrap(), w.root.join(".venv"));
    w.prepare("feat", &[]);
    let other = w.prepare("other", &[]);
    assert!(fs::symlink_metadata(other.join(".venv")).unwrap().is_symlink());
    let ex = fs::read_to_string(w.root.join(".git/info/exclude")).unwrap();
    assert_eq!(ex.lines().filter(|l| *l == "/.venv").count(), 1, "{ex}");
    assert_eq!(ex.lines().filter(|l| *l == ".pytest_cache/").count(), 1, "{ex}");
    // The link is ignored, so it does not make the worktree dirty.
    assert_eq!(git(&wt, &["status", "--porcelain"]), "");
}

// ---------------------------------------------------------------------------------------------
// Issue 29 item 4: ignored files are unsaved work unless they lie in a regenerable directory

/// A worktree of a control root whose committed `.gitignore` ignores the usual local files and
/// build output.
fn with_ignores(name: &str) -> (W, PathBuf) {
    let w = W::new(name);
    let ignores = "/.mam/\nnotes.local\n.env\n.mam.env\n.venv/\ntarget/\nnode_modules\n";
    fs::write(w.root.join(".gitignore"), ignores).unwrap();
    git(&w.root, &["commit", "-q", "-am", "ignores"]);
    let wt = w.prepare("ign", &[]);
    (w, wt)
}

/// `notes.local`, `.env` and `.mam.env` are ignored, so git status is clean; `remove` used to
/// delete them and print `RESULT=removed FINDINGS=none`. Now: one `FINDING=ignored` line each,
/// refused, nothing deleted; `--dry-run` says the same.
#[test]
fn ignored_local_files_are_refused_with_a_finding_each_and_kept() {
    let (w, wt) = with_ignores("wt-ign-refused");
    for f in ["notes.local", ".env", ".mam.env"] {
        fs::write(wt.join(f), format!("only here: {f}\n")).unwrap();
    }
    assert_eq!(git(&wt, &["status", "--porcelain"]), "", "git status alone sees nothing");
    let before = snapshot(&wt);
    for extra in [&[][..], &["--dry-run"][..], &["--stop"][..]] {
        let r = w.remove(&wt, extra);
        r.expect_rc(3);
        assert_eq!(summary(&r), ("refused".into(), "plain".into(), "ignored".into()), "{extra:?}");
        let found: Vec<String> = r.stdout().lines().filter(|l| l.starts_with("FINDING=")).map(str::to_string).collect();
        assert_eq!(found.len(), 3, "{found:?}");
        for f in [".env", ".mam.env", "notes.local"] {
            let want = format!("FINDING=ignored {}: a file git ignores", wt.join(f).display());
            assert!(found.iter().any(|l| l.starts_with(&want)), "{want}\n{found:?}");
        }
        assert!(r.stderr().contains("nothing was changed"), "{}", r.stderr());
        assert!(snapshot(&wt) == before, "{extra:?}: the worktree changed");
    }
    let r = w.run(&["worktree", "list"]);
    r.expect_rc(0);
    assert!(r.stdout().contains("FINDINGS=ignored "), "{}", r.stdout());
}

/// `--discard-ignored` is the explicit way to let them go.
#[test]
fn discard_ignored_removes_a_worktree_with_ignored_files() {
    let (w, wt) = with_ignores("wt-ign-discard");
    for f in ["notes.local", ".env", ".mam.env"] {
        fs::write(wt.join(f), "x\n").unwrap();
    }
    let r = w.remove(&wt, &["--dry-run", "--discard-ignored"]);
    r.expect_rc(0);
    assert_eq!(summary(&r).0, "would-remove");
    assert!(wt.join(".env").exists());
    let r = w.remove(&wt, &["--discard-ignored"]);
    r.expect_rc(0);
    assert_eq!(summary(&r), ("removed".into(), "plain".into(), "none".into()));
    assert!(!wt.exists());
}

/// A wholly ignored regenerable directory (`.venv/` full of files, `target/`, a nested
/// `node_modules/`) and the `.venv` link prepare makes go without the flag.
#[test]
fn regenerable_ignored_directories_go_without_the_flag() {
    let (w, wt) = with_ignores("wt-ign-regen");
    for f in [".venv/lib/python3/site.py", ".venv/bin/python", "target/debug/app", "web/node_modules/p/i.js"] {
        let p = wt.join(f);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, "generated\n").unwrap();
    }
    let r = w.remove(&wt, &["--dry-run"]);
    r.expect_rc(0);
    assert_eq!(summary(&r), ("would-remove".into(), "plain".into(), "none".into()), "{}", r.stdout());
    let r = w.remove(&wt, &[]);
    r.expect_rc(0);
    assert_eq!(summary(&r).0, "removed", "{}", r.stdout());
    assert!(!wt.exists());

    // prepare's `.venv` link to the control root's `.venv` (excluded through info/exclude).
    fs::create_dir_all(w.root.join(".venv/bin")).unwrap();
    let wt = w.prepare("linked", &[]);
    assert!(fs::symlink_metadata(wt.join(".venv")).unwrap().is_symlink());
    let r = w.remove(&wt, &[]);
    r.expect_rc(0);
    assert!(w.root.join(".venv/bin").is_dir(), "the link's target stays");
}

#[test]
fn t3_second_submodule_failing_after_the_first_cloned_rolls_back_then_prepare_and_plain_remove_work() {
    let w = W::new("wt-t3");
    w.with_submodules(&["a", "b"]);
    let config = w.config();
    let wt = w.prepare("feat", &[]);
    let admin = w.admin(&wt);
    let away = w.td.path("src-b.away");
    fs::rename(w.td.path("src-b"), &away).unwrap();
    let r = w.run(&["worktree", "prepare", "feat", "--submodules"]);
    r.expect_rc(1);
    let err = r.stderr();
    assert!(err.contains("ERROR: worktree prepare: submodule b") && err.contains("rolled back"), "{err}");
    assert!(err.contains("the checkout is usable"), "{err}");
    assert!(!admin.join("modules").exists(), "modules/ left behind");
    assert_eq!(String::from_utf8_lossy(&w.config()), String::from_utf8_lossy(&config));
    assert!(git_out(&wt, &["status"]).status.success());
    assert_eq!(fs::read_dir(wt.join("a")).unwrap().count(), 0, "a's checkout left behind");
    // Without submodule state the worktree is removed plainly.
    let rm = w.remove(&wt, &["--dry-run"]);
    rm.expect_rc(0);
    assert_eq!(summary(&rm), ("would-remove".into(), "plain".into(), "none".into()));
    fs::rename(&away, w.td.path("src-b")).unwrap();
    w.prepare("feat", &["--submodules"]);
    assert!(wt.join("a/lib.txt").is_file() && wt.join("b/lib.txt").is_file());
    let rm = w.remove(&wt, &[]);
    rm.expect_rc(0);
    assert_eq!(summary(&rm), ("removed".into(), "force".into(), "none".into()));
    let wt2 = w.prepare("feat2", &[]);
    let rm = w.remove(&wt2, &[]);
    rm.expect_rc(0);
    assert_eq!(summary(&rm).1, "plain");
    assert!(!wt.exists() && !wt2.exists());
}

#[test]
fn t4_a_failing_retry_keeps_an_earlier_submodule_init_and_its_config_value() {
    let w = W::new("wt-t4");
    w.with_submodules(&["a", "b"]);
    let wt = w.prepare("feat", &[]);
    // The user initialised a earlier, from a mirror URL of their own, and switched b off.
    let mirror = w.td.path("src-a").to_string_lossy().into_owned();
    git(&wt, &["submodule", "init", "--", "a"]);
    git(&w.root, &["config", "submodule.a.url", &mirror]);
    git(&wt, &["submodule", "update", "--", "a"]);
    git(&w.root, &["config", "submodule.b.active", "false"]);
    let keys = w.submodule_keys();
    let a_head = git(&wt.join("a"), &["rev-parse", "HEAD"]);
    fs::rename(w.td.path("src-b"), w.td.path("src-b.away")).unwrap();
    let r = w.run(&["worktree", "prepare", "feat", "--submodules"]);
    r.expect_rc(1);
    assert!(r.stderr().contains("submodule b"), "{}", r.stderr());
    assert_eq!(w.submodule_keys(), keys);
    assert!(w.submodule_keys().contains(&format!("submodule.a.url {mirror}")));
    assert_eq!(git(&wt.join("a"), &["rev-parse", "HEAD"]), a_head);
    assert!(w.admin(&wt).join("modules/a").is_dir());
    assert!(!w.admin(&wt).join("modules/b").exists());
}

#[test]
fn t5_uninitialised_submodule_path_with_files_refused_files_intact() {
    let w = W::new("wt-t5");
    w.with_submodules(&["a"]);
    let wt = w.prepare("feat", &[]);
    fs::write(wt.join("a/mine.txt"), "precious\n").unwrap();
    let keys = w.submodule_keys();
    let r = w.run(&["worktree", "prepare", "feat", "--submodules"]);
    r.expect_rc(3);
    assert!(
        r.stderr().contains("not initialised but already holds files") && r.stderr().ends_with("nothing was changed\n")
    );
    assert_eq!(fs::read_to_string(wt.join("a/mine.txt")).unwrap(), "precious\n");
    assert_eq!(w.submodule_keys(), keys);
    assert!(!w.admin(&wt).join("modules").exists());
}

#[test]
fn t6_remove_refuses_a_dirty_tree_a_running_session_without_stop_and_an_open_loop_job() {
    let w = W::new("wt-t6");
    let wt = w.prepare("feat", &[]);
    fs::write(wt.join("new.txt"), "x\n").unwrap();
    let r = w.remove(&wt, &[]);
    r.expect_rc(3);
    assert_eq!(summary(&r), ("refused".into(), "plain".into(), "dirty".into()));
    assert!(r.stdout().contains("FINDING=dirty ") && r.stdout().contains("new.txt"));
    assert_eq!(r.stderr(), "REFUSED: worktree remove: dirty; nothing was changed\n");
    fs::remove_file(wt.join("new.txt")).unwrap();

    w.session("s6", &wt, "work_s=0\n");
    let r = w.remove(&wt, &[]);
    r.expect_rc(3);
    assert_eq!(summary(&r).2, "sessions-running");
    assert!(r.stdout().contains("s6") && r.stderr().contains("nothing was changed"));
    assert_eq!(w.row_status("s6"), "running");

    let job = w.run(&["registry", "register", "--session", "s6", "--type", "loop"]);
    job.expect_rc(0);
    let jid = job.stdout().trim().to_string();
    let r = w.remove(&wt, &["--stop"]);
    r.expect_rc(3);
    assert_eq!(summary(&r).2, "open-jobs");
    assert!(r.stdout().contains(&jid), "{}", r.stdout());
    assert!(r.stderr().contains("nothing was changed"));
    assert_eq!(w.row_status("s6"), "running");
    assert!(wt.is_dir());
}

#[cfg(feature = "test-hooks")]
#[test]
fn t7_a_file_written_by_the_session_during_stop_keeps_the_worktree_and_the_file() {
    let w = W::new("wt-t7");
    let wt = w.prepare("feat", &[]);
    let file = wt.join("written-on-stop.txt");
    w.session("s7", &wt, &format!("on_stop_write={}\n", file.display()));
    let task = w.run(&["registry", "register", "--session", "s7"]);
    task.expect_rc(0);
    let jid = task.stdout().trim().to_string();
    let r = w.remove(&wt, &["--stop"]);
    r.expect_rc(3);
    // The stop's own warnings (no broker for the closed state) come first; the refusal is last.
    assert_eq!(
        r.stderr().lines().last(),
        Some("REFUSED: worktree remove: dirty; sessions were stopped; the worktree was kept")
    );
    assert!(r.stdout().contains("SESSION=s7 STATUS=stopped") && r.stdout().contains(&jid), "{}", r.stdout());
    assert_eq!(summary(&r), ("refused".into(), "plain".into(), "dirty".into()));
    assert_eq!(fs::read_to_string(&file).unwrap(), "stopped\n");
    assert_eq!(w.row_status("s7"), "stopped");
    let rec: serde_json::Value =
        serde_json::from_slice(&fs::read(w.root.join(format!(".mam/jobs/{jid}.json"))).unwrap()).unwrap();
    assert_eq!(rec["status"], "cancelled");
    // The branch is never deleted; once the file is dealt with, the stopped session is no finding.
    fs::remove_file(&file).unwrap();
    let r = w.remove(&wt, &["--stop"]);
    r.expect_rc(0);
    assert_eq!(summary(&r).0, "removed");
    assert_eq!(w.row_status("s7"), "stopped");
    git(&w.root, &["rev-parse", "--verify", "refs/heads/feat"]);
}

/// A worktree of branch `b` with submodule `a` initialised (through prepare).
fn with_sub(w: &W, b: &str) -> PathBuf {
    w.prepare(b, &["--submodules"])
}

#[test]
fn t8_submodule_stash_and_tag_only_commits_are_refused() {
    let w = W::new("wt-t8");
    w.with_submodules(&["a"]);
    // A stash in the initialised submodule.
    let wt = with_sub(&w, "stash");
    fs::write(wt.join("a/lib.txt"), "changed\n").unwrap();
    git(&wt.join("a"), &["stash", "-q"]);
    let r = w.remove(&wt, &[]);
    r.expect_rc(3);
    assert_eq!(summary(&r).2, "stashes");
    assert!(r.stdout().contains("stash@{0}"), "{}", r.stdout());

    for (b, annotated) in [("light", false), ("annot", true)] {
        let wt = with_sub(&w, b);
        let sub = wt.join("a");
        fs::write(sub.join("lib.txt"), format!("{b}\n")).unwrap();
        git(&sub, &["commit", "-q", "-am", "tag only"]);
        let c = git(&sub, &["rev-parse", "HEAD"]);
        if annotated {
            git(&sub, &["tag", "-a", "-m", "t", "keep"]);
        } else {
            git(&sub, &["tag", "keep"]);
        }
        git(&sub, &["checkout", "-q", "--detach", "HEAD~1"]);
        // The superproject records the original commit again: the tree is clean.
        assert_eq!(git(&wt, &["status", "--porcelain"]), "");
        let r = w.remove(&wt, &[]);
        r.expect_rc(3);
        assert_eq!(summary(&r).2, "unpushed", "{b}");
        assert!(r.stdout().contains(&c), "{}", r.stdout());
        // Deinitialised, the tag-only commit still lives in modules/a: still refused.
        git(&wt, &["submodule", "deinit", "-q", "--force", "a"]);
        let r = w.remove(&wt, &[]);
        r.expect_rc(3);
        assert_eq!(summary(&r), ("refused".into(), "force".into(), "unpushed".into()), "{b}");
        assert!(r.stdout().contains("modules/a"), "{}", r.stdout());
    }
}

#[test]
fn t9_deinitialised_submodule_stash_or_unpushed_commit_and_a_partial_repository_are_refused() {
    let w = W::new("wt-t9");
    w.with_submodules(&["a"]);
    let wt = with_sub(&w, "st");
    fs::write(wt.join("a/lib.txt"), "changed\n").unwrap();
    git(&wt.join("a"), &["stash", "-q"]);
    git(&wt, &["submodule", "deinit", "-q", "--force", "a"]);
    let r = w.remove(&wt, &[]);
    r.expect_rc(3);
    assert_eq!(summary(&r).2, "stashes");

    let wt = with_sub(&w, "up");
    fs::write(wt.join("a/lib.txt"), "committed\n").unwrap();
    git(&wt.join("a"), &["commit", "-q", "-am", "local"]);
    let c = git(&wt.join("a"), &["rev-parse", "HEAD"]);
    git(&wt, &["submodule", "deinit", "-q", "--force", "a"]);
    let r = w.remove(&wt, &[]);
    r.expect_rc(3);
    assert_eq!(summary(&r).2, "unpushed");
    assert!(r.stdout().contains(&c));

    let wt = w.prepare("partial", &[]);
    let part = w.admin(&wt).join("modules/x");
    fs::create_dir_all(part.join("objects")).unwrap();
    fs::write(part.join("config"), "[core]\n").unwrap();
    let r = w.remove(&wt, &[]);
    r.expect_rc(3);
    assert_eq!(summary(&r), ("refused".into(), "force".into(), "uncheckable-repo".into()));
    assert!(r.stdout().contains("partial git directory"), "{}", r.stdout());
    assert!(part.join("config").is_file());
}

#[test]
fn t10_a_deleted_worktree_directory_exit_3_with_the_prune_hint_with_and_without_dry_run() {
    let w = W::new("wt-t10");
    let wt = w.prepare("feat", &[]);
    fs::remove_dir_all(&wt).unwrap();
    for extra in [&[][..], &["--dry-run"][..]] {
        let r = w.remove(&wt, extra);
        r.expect_rc(3);
        assert_eq!(summary(&r), ("refused".into(), "plain".into(), "status-failed".into()));
        let err = r.stderr();
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 2, "{err}");
        assert_eq!(lines[0], "REFUSED: worktree remove: status-failed; nothing was changed");
        assert!(lines[1].starts_with("NOTE: ") && lines[1].contains("git worktree prune"), "{err}");
    }
    assert_eq!(w.worktree_count(), 2);
}

#[test]
fn t11_a_clean_worktree_with_submodules_is_removed_with_one_force_without_plainly() {
    let w = W::new("wt-t11");
    w.with_submodules(&["a"]);
    let plain = w.prepare("plain", &[]);
    let sub = with_sub(&w, "sub");
    let r = w.remove(&sub, &[]);
    r.expect_rc(0);
    assert_eq!(summary(&r), ("removed".into(), "force".into(), "none".into()));
    let r = w.remove(&plain, &[]);
    r.expect_rc(0);
    assert_eq!(summary(&r), ("removed".into(), "plain".into(), "none".into()));
    assert!(!plain.exists() && !sub.exists());
    assert_eq!(w.worktree_count(), 1);
    for b in ["plain", "sub"] {
        git(&w.root, &["rev-parse", "--verify", &format!("refs/heads/{b}")]);
    }
}

#[test]
fn t12_prepare_creator_starts_a_session_in_the_worktree_bound_to_the_control_plane() {
    let w = W::new("wt-t12");
    let r = w.run(&[
        "worktree",
        "prepare",
        "feat",
        "--creator",
        "claude",
        "--name",
        "c12",
        "--no-onboard",
        "--",
        "test-double",
        "agent",
    ]);
    r.expect_rc(0);
    let lines: Vec<String> = r.stdout().lines().map(str::to_string).collect();
    let wt = PathBuf::from(lines[0].strip_prefix("WORKTREE=").unwrap());
    assert_eq!(lines[1], "BRANCH=feat");
    assert!(lines[2].starts_with("BASE="));
    assert!(
        lines[3].starts_with("SESSION=c12 PANE=") && lines[3].ends_with(&format!("CWD={}", wt.display())),
        "{lines:?}"
    );
    let doc: serde_json::Value =
        serde_json::from_slice(&fs::read(w.root.join(".mam/agent_sessions.json")).unwrap()).unwrap();
    let row = &doc["herdr_sessions"][0];
    assert_eq!(row["pane"]["cwd"], wt.to_str().unwrap());
    assert_eq!(row["control_plane"]["workspace_root"], w.root.to_str().unwrap());
    // A rerun reuses the running row.
    let again = w.run(&[
        "worktree",
        "prepare",
        "feat",
        "--creator",
        "claude",
        "--name",
        "c12",
        "--no-onboard",
        "--",
        "test-double",
        "agent",
    ]);
    again.expect_rc(0);
    assert_eq!(again.stdout().lines().nth(3), Some(lines[3].as_str()));
    assert!(again.stderr().contains("reused"));
    // A create failure (the name runs elsewhere) keeps the new worktree and exits 1.
    let r = w.run(&[
        "worktree",
        "prepare",
        "other",
        "--creator",
        "claude",
        "--name",
        "c12",
        "--no-onboard",
        "--",
        "test-double",
        "agent",
    ]);
    r.expect_rc(1);
    assert!(
        r.stderr().contains("session create failed") && r.stderr().contains("the worktree is kept"),
        "{}",
        r.stderr()
    );
    let other = PathBuf::from(r.stdout().lines().next().unwrap().strip_prefix("WORKTREE=").unwrap());
    assert!(other.is_dir() && wt.is_dir());
}

#[test]
fn t13_base_for_an_existing_branch_is_the_merge_base() {
    let w = W::new("wt-t13");
    let first = w.head();
    git(&w.root, &["branch", "topic"]);
    fs::write(w.root.join("app.txt"), "version 2\n").unwrap();
    git(&w.root, &["commit", "-q", "-am", "main moves on"]);
    let r = w.run(&["worktree", "prepare", "topic"]);
    r.expect_rc(0);
    assert_eq!(r.stdout().lines().nth(2), Some(format!("BASE={first}").as_str()));
    assert!(!r.stderr().contains("WARNING"));
    let r = w.run(&["worktree", "prepare", "topic", "--base", "main"]);
    r.expect_rc(0);
    assert_eq!(r.stdout().lines().nth(2), Some(format!("BASE={first}").as_str()));
    assert!(r.stderr().contains(&format!("BASE={first} is the merge-base")), "{}", r.stderr());
    // A new branch starts at --base, and BASE is that commit.
    let r = w.run(&["worktree", "prepare", "fresh", "--base", &first]);
    r.expect_rc(0);
    assert_eq!(r.stdout().lines().nth(2), Some(format!("BASE={first}").as_str()));
    assert_eq!(git(&w.root, &["rev-parse", "fresh"]), first);
}

#[test]
fn t14_the_default_path_is_beside_the_control_root_with_the_branch_slug() {
    let w = W::new("wt-t14");
    let wt = w.prepare("feat/a+b@c", &[]);
    assert_eq!(wt, w.td.root.canonicalize().unwrap().join("ws-feat-a-b-c"));
    let r = w.run(&["worktree", "prepare", "feat/a b+c"]);
    r.expect_rc(2);
    assert!(r.stderr().contains("not a valid branch name"));
    let wt = w.prepare("x.y_z-1", &[]);
    assert!(wt.ends_with("ws-x.y_z-1"));
}

#[test]
fn t15_a_locked_or_the_main_worktree_is_refused() {
    let w = W::new("wt-t15");
    let wt = w.prepare("feat", &[]);
    git(&w.root, &["worktree", "lock", "--reason", "busy", wt.to_str().unwrap()]);
    let r = w.remove(&wt, &[]);
    r.expect_rc(3);
    assert_eq!(summary(&r).2, "locked");
    assert!(r.stdout().contains("busy"));
    let r = w.remove(&w.root, &[]);
    r.expect_rc(3);
    assert_eq!(summary(&r), ("refused".into(), "none".into(), "main-worktree".into()));
    let r = w.remove(&w.td.path("nowhere"), &[]);
    r.expect_rc(3);
    assert_eq!(summary(&r), ("refused".into(), "none".into(), "not-linked".into()));
    assert!(wt.is_dir());
}

#[test]
fn t16_dry_run_says_would_remove_and_changes_nothing() {
    let w = W::new("wt-t16");
    let wt = w.prepare("feat", &[]);
    w.session("s16", &wt, "work_s=0\n");
    let r = w.remove(&wt, &["--stop", "--dry-run"]);
    r.expect_rc(0);
    assert_eq!(summary(&r), ("would-remove".into(), "plain".into(), "none".into()));
    assert!(r.stdout().contains("WOULD-STOP=s16") && r.stdout().contains("WOULD-RUN=git worktree remove "));
    assert_eq!(w.row_status("s16"), "running");
    assert!(wt.is_dir());
}

#[test]
fn t17_a_removal_failure_exits_1_and_keeps_the_worktree() {
    let w = W::new("wt-t17");
    let wt = w.prepare("feat", &[]);
    let wrap = Wrapper::new(&w);
    wrap.fail_on("worktree remove");
    let r = w.mam().env("PATH", wrap.path_var()).args(["worktree", "remove"]).arg_path(&wt).run_within(LIMIT);
    r.expect_rc(1);
    assert_eq!(summary(&r), ("failed".into(), "plain".into(), "none".into()));
    assert!(r.stderr().starts_with("ERROR: worktree remove: git worktree remove failed"), "{}", r.stderr());
    assert!(wt.is_dir());
}

#[test]
fn t18_a_detached_head_commit_is_unreachable_head() {
    let w = W::new("wt-t18");
    let wt = w.prepare("feat", &[]);
    git(&wt, &["checkout", "-q", "--detach"]);
    fs::write(wt.join("app.txt"), "detached work\n").unwrap();
    git(&wt, &["commit", "-q", "-am", "detached"]);
    let c = git(&wt, &["rev-parse", "HEAD"]);
    // Moving HEAD back leaves the commit in the HEAD reflog only.
    git(&wt, &["checkout", "-q", "feat"]);
    let r = w.remove(&wt, &[]);
    r.expect_rc(3);
    assert_eq!(summary(&r).2, "unreachable-head");
    assert!(r.stdout().contains(&c), "{}", r.stdout());
    git(&w.root, &["tag", "kept", &c]);
    w.remove(&wt, &[]).expect_rc(0);
}

// ---------------------------------------------------------------------------------------------
// Each kind of unsaved work, one at a time

/// One kind of unsaved work in a fresh worktree (with submodule `a` initialised when `subs`) with a
/// running session: `remove` and `remove --stop` both refuse with `token`, nothing was changed, the
/// session still runs, and the worktree and its git directory are byte-for-byte as before.
fn unsaved(kind: &str, subs: bool, setup: fn(&W, &Path), token: &str) {
    let w = W::new(&format!("wt-kind-{kind}"));
    if subs {
        w.with_submodules(&["a"]);
    }
    let wt = if subs { with_sub(&w, "k") } else { w.prepare("k", &[]) };
    setup(&w, &wt);
    w.session("ks", &wt, "work_s=0\n");
    let admin = w.admin(&wt);
    let before = (snapshot(&wt), snapshot(&admin));
    for extra in [&[][..], &["--stop"][..]] {
        let r = w.remove(&wt, extra);
        r.expect_rc(3);
        let (result, _, found) = summary(&r);
        assert_eq!(result, "refused", "{kind}");
        let found: Vec<&str> = found.split(',').collect();
        assert!(found.contains(&token), "{kind} {extra:?}: {found:?}\n{}", r.stdout());
        assert_eq!(found.contains(&"sessions-running"), extra.is_empty(), "{kind}: {found:?}");
        assert!(r.stderr().contains("nothing was changed"), "{kind}: {}", r.stderr());
        assert!(r.stdout().contains(&format!("FINDING={token} ")), "{kind}: {}", r.stdout());
        assert_eq!(w.row_status("ks"), "running", "{kind}");
    }
    let after = (snapshot(&wt), snapshot(&admin));
    assert!(before.0 == after.0, "{kind}: the worktree changed");
    assert!(before.1 == after.1, "{kind}: its git directory changed");
    assert!(wt.is_dir());
}

#[test]
fn unsaved_untracked_file() {
    unsaved("untracked", false, |_, wt| fs::write(wt.join("u.txt"), "u\n").unwrap(), "dirty");
}

#[test]
fn unsaved_ignored_file_inside_a_submodule() {
    unsaved(
        "ignored",
        true,
        |_, wt| {
            let exclude = git(&wt.join("a"), &["rev-parse", "--git-path", "info/exclude"]);
            fs::write(wt.join("a").join(exclude), "*.log\n").unwrap();
            fs::write(wt.join("a/build.log"), "only here\n").unwrap();
            assert_eq!(git(wt, &["status", "--porcelain"]), "");
        },
        "submodule-dirty",
    );
}

#[test]
fn unsaved_commit_only_on_a_detached_head() {
    unsaved(
        "detached",
        false,
        |_, wt| {
            git(wt, &["checkout", "-q", "--detach"]);
            fs::write(wt.join("app.txt"), "d\n").unwrap();
            git(wt, &["commit", "-q", "-am", "detached"]);
        },
        "unreachable-head",
    );
}

/// A commit in submodule `a` that only a tag holds (HEAD moved back to the recorded commit).
fn tag_only(wt: &Path, annotated: bool) {
    let s = wt.join("a");
    fs::write(s.join("lib.txt"), "t\n").unwrap();
    git(&s, &["commit", "-q", "-am", "t"]);
    if annotated {
        git(&s, &["tag", "-a", "-m", "m", "at"]);
    } else {
        git(&s, &["tag", "lt"]);
    }
    git(&s, &["checkout", "-q", "--detach", "HEAD~1"]);
}

#[test]
fn unsaved_lightweight_tag() {
    unsaved("light", true, |_, wt| tag_only(wt, false), "unpushed");
}

#[test]
fn unsaved_annotated_tag() {
    unsaved("annot", true, |_, wt| tag_only(wt, true), "unpushed");
}

#[test]
fn unsaved_note() {
    unsaved(
        "note",
        true,
        |_, wt| {
            git(&wt.join("a"), &["notes", "add", "-m", "a local note", "HEAD"]);
        },
        "unpushed",
    );
}

#[test]
fn unsaved_stash() {
    unsaved(
        "stash",
        true,
        |_, wt| {
            fs::write(wt.join("a/lib.txt"), "s\n").unwrap();
            git(&wt.join("a"), &["stash", "-q"]);
        },
        "stashes",
    );
}

#[test]
fn unsaved_commit_in_a_deinitialised_submodules_repository() {
    unsaved(
        "deinit",
        true,
        |_, wt| {
            fs::write(wt.join("a/lib.txt"), "c\n").unwrap();
            git(&wt.join("a"), &["commit", "-q", "-am", "c"]);
            git(wt, &["submodule", "deinit", "-q", "--force", "a"]);
        },
        "unpushed",
    );
}

#[test]
fn unsaved_partial_repository_under_modules() {
    unsaved(
        "partial",
        false,
        |w, wt| {
            let p = w.admin(wt).join("modules/half");
            fs::create_dir_all(p.join("refs/heads")).unwrap();
            fs::write(p.join("HEAD"), "ref: refs/heads/main\n").unwrap();
        },
        "uncheckable-repo",
    );
}

// ---------------------------------------------------------------------------------------------
// kill -9 of prepare --submodules

#[test]
fn kill_9_of_prepare_submodules_at_several_points_leaves_a_state_the_next_command_reads() {
    let w = W::new("wt-kill");
    w.with_submodules(&["a", "b"]);
    let wrap = Wrapper::new(&w);
    // (point, break b's origin first so the attempt reaches the rollback)
    for (i, (point, break_b)) in [("update a", false), ("update b", false), ("deinit a", true)].iter().enumerate() {
        let branch = format!("kill{i}");
        let wt = w.prepare(&branch, &[]);
        if *break_b {
            fs::rename(w.td.path("src-b"), w.td.path("src-b.away")).unwrap();
        }
        wrap.block_on(point);
        let mut bg = w
            .mam()
            .env("PATH", wrap.path_var())
            .args(["worktree", "prepare", &branch, "--submodules"])
            .spawn_bg(&w.td, "prepare");
        let blocked = wrap.reached(&mut bg);
        bg.signal(9);
        let (rc, _) = bg.wait(LIMIT);
        assert_eq!(rc, 137, "{point}");
        let _ = mam::sys::kill(-blocked, 9);
        wrap.clear();
        if *break_b {
            fs::rename(w.td.path("src-b.away"), w.td.path("src-b")).unwrap();
        }
        // The checkout is usable, and remove reads the state and says what it would do.
        assert!(git_out(&wt, &["status"]).status.success(), "{point}");
        let r = w.remove(&wt, &["--dry-run"]);
        let (result, method, found) = summary(&r);
        match r.rc() {
            0 => assert_eq!(result, "would-remove", "{point}"),
            3 => {
                assert_eq!(result, "refused");
                assert!(r.stdout().lines().any(|l| l.starts_with("FINDING=")), "{point}: {}", r.stdout());
            }
            rc => panic!("{point}: rc {rc}\n{}{}", r.stdout(), r.stderr()),
        }
        let expect_force = *point != "update a";
        assert_eq!(method == "force", expect_force, "{point}: {method} {found}");
        // The next prepare completes the submodules; then the worktree goes with one --force.
        let r = w.run(&["worktree", "prepare", &branch, "--submodules"]);
        r.expect_rc(0);
        assert!(wt.join("a/lib.txt").is_file() && wt.join("b/lib.txt").is_file(), "{point}");
        let r = w.remove(&wt, &[]);
        r.expect_rc(0);
        assert_eq!(summary(&r), ("removed".into(), "force".into(), "none".into()), "{point}");
    }
}

// ---------------------------------------------------------------------------------------------
// Bad input, list, shims

#[test]
fn bad_input_is_refused_before_any_change() {
    let w = W::new("wt-bad");
    // A leading dash reads as an option: a usage error.
    w.run(&["worktree", "prepare", "-x"]).expect_rc(2);
    for b in ["a..b", "has space", "end.lock", "@{-1}", "x~1"] {
        let r = w.run(&["worktree", "prepare", b]);
        r.expect_rc(2);
        assert!(
            r.stderr().contains("REFUSED: worktree prepare:") && r.stderr().contains("nothing was changed"),
            "{b}: {}",
            r.stderr()
        );
    }
    let file = w.td.write("a-file", "x\n");
    let r = w.mam().args(["worktree", "prepare", "f1", "--path"]).arg_path(&file).run();
    r.expect_rc(3);
    assert!(r.stderr().contains("not a directory"), "{}", r.stderr());
    assert_eq!(fs::read_to_string(&file).unwrap(), "x\n");
    let full = w.td.path("full");
    fs::create_dir_all(&full).unwrap();
    fs::write(full.join("keep"), "k\n").unwrap();
    w.mam().args(["worktree", "prepare", "f2", "--path"]).arg_path(&full).run().expect_rc(3);
    let nl = w.td.path("new\nline");
    let r = w.mam().args(["worktree", "prepare", "f3", "--path"]).arg_path(&nl).run();
    r.expect_rc(2);
    assert!(!nl.exists());
    assert_eq!(w.worktree_count(), 1);
    for b in ["f1", "f2", "f3"] {
        assert!(!git_out(&w.root, &["rev-parse", "--verify", &format!("refs/heads/{b}")]).status.success());
    }
    // Spaces are fine; a path with a newline made by git itself is still removed.
    let sp = w.td.path("with space");
    let r = w.mam().args(["worktree", "prepare", "f4", "--path"]).arg_path(&sp).run();
    r.expect_rc(0);
    assert!(r.stdout().starts_with(&format!("WORKTREE={}\n", sp.canonicalize().unwrap().display())));
    w.remove(&sp, &[]).expect_rc(0);
    git(&w.root, &["worktree", "add", "-q", "-b", "f5", nl.to_str().unwrap()]);
    let r = w.remove(&nl, &[]);
    r.expect_rc(0);
    assert!(!nl.exists());
    // A control root that is no git repository.
    let plain = TestDir::new("wt-bad-plain");
    let r = plain.mam().args(["worktree", "prepare", "x"]).run();
    r.expect_rc(2);
    assert!(r.stderr().contains("git repository"), "{}", r.stderr());
    let r = plain.mam().args(["worktree", "remove", "/tmp"]).run();
    r.expect_rc(3);
    assert_eq!(summary(&r), ("refused".into(), "none".into(), "not-linked".into()));
    plain.mam().args(["worktree", "list"]).run().expect_rc(2);
    // Usage errors of remove still end in the summary.
    let r = w.run(&["worktree", "remove"]);
    r.expect_rc(2);
    assert_eq!(summary(&r), ("refused".into(), "none".into(), "none".into()));
    w.run(&["worktree", "remove", "x", "--bogus"]).expect_rc(2);
}

#[test]
fn list_shows_each_linked_worktree_and_what_remove_would_say() {
    let w = W::new("wt-list");
    let clean = w.prepare("clean", &[]);
    let dirty = w.prepare("dirty", &[]);
    fs::write(dirty.join("d.txt"), "d\n").unwrap();
    w.session("l1", &dirty, "work_s=0\n");
    let jid = w.run(&["registry", "register", "--session", "l1"]).stdout().trim().to_string();
    let r = w.run(&["worktree", "list"]);
    r.expect_rc(0);
    let out = r.stdout();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    let c = lines.iter().find(|l| l.ends_with(&format!("PATH={}", clean.display()))).unwrap();
    assert!(
        c.starts_with("BRANCH=clean HEAD=") && c.contains("TREE=clean SESSIONS=- JOBS=- METHOD=plain FINDINGS=none"),
        "{c}"
    );
    let d = lines.iter().find(|l| l.ends_with(&format!("PATH={}", dirty.display()))).unwrap();
    assert!(
        d.contains(&format!(
            "TREE=dirty SESSIONS=l1 JOBS={jid} METHOD=plain FINDINGS=sessions-running,open-jobs,dirty"
        )),
        "{d}"
    );
}

#[test]
fn the_shims_pass_the_legacy_arguments_untouched() {
    let w = W::new("wt-shims");
    let shims = Path::new(env!("CARGO_MANIFEST_DIR")).join("shims");
    let r = w
        .command(shims.join("worktree_prepare.sh"))
        .env("MAM_BIN", mam_bin())
        .envs_from(&w.env)
        .args(["feat", "--base", "HEAD"])
        .run_within(LIMIT);
    r.expect_rc(0);
    let wt = PathBuf::from(r.stdout().lines().next().unwrap().strip_prefix("WORKTREE=").unwrap());
    let r = w
        .command(shims.join("worktree_remove.sh"))
        .env("MAM_BIN", mam_bin())
        .envs_from(&w.env)
        .args([wt.to_str().unwrap(), "--dry-run"])
        .run_within(LIMIT);
    r.expect_rc(0);
    assert_eq!(summary(&r).0, "would-remove");
}

trait Envs {
    fn envs_from(self, env: &[(String, OsString)]) -> Cmd;
}

impl Envs for Cmd {
    fn envs_from(mut self, env: &[(String, OsString)]) -> Cmd {
        for (k, v) in env {
            self = self.env(k, v);
        }
        self
    }
}

impl W {
    fn command(&self, program: PathBuf) -> Cmd {
        self.td.command(program).cwd(&self.root)
    }
}

/// The loop-active finding: a held creator lock whose checkpoint's source root is the worktree.
#[test]
fn a_running_loop_on_the_worktree_is_loop_active() {
    let w = W::new("wt-loop");
    let wt = w.prepare("feat", &[]);
    let loops = w.root.join(".mam/loop");
    let id = "0123abcd";
    fs::create_dir_all(loops.join(id)).unwrap();
    let cp = json!({
        "loop_id": id, "framework_version": "x", "pid": 1, "control_root": w.root, "source_root": wt,
        "registry": w.root.join(".mam/jobs"), "base": null, "base_origin": null, "creator": "c",
        "creator_jid": "j", "reviewers": [], "phase": "review", "round": 1, "max_rounds": 3,
        "plan_path": null, "collector": "", "started_at": "", "updated_at": "", "wall_clock_s": 0,
        "jobs": [], "review_rounds": [], "promoted": [], "outcome": null, "reason": null, "rc": null
    });
    fs::write(loops.join(id).join("checkpoint.json"), serde_json::to_vec(&cp).unwrap()).unwrap();
    let lock_path = loops.join("c.lock");
    fs::write(&lock_path, id).unwrap();
    let f = mam::sys::open_lock_file(&lock_path).unwrap();
    let held = mam::sys::Flock::try_acquire(f, mam::sys::LockMode::Exclusive).unwrap().unwrap();
    let r = w.remove(&wt, &[]);
    r.expect_rc(3);
    assert_eq!(summary(&r).2, "loop-active");
    assert!(r.stdout().contains(id));
    drop(held);
    w.remove(&wt, &[]).expect_rc(0);
}

// ---------------------------------------------------------------------------------------------
// Issue 14's gaps: a failing stop, onboarding under --creator, the real tmux and herdr

/// `bin/claude` in `dir`: the fake agent as `claude`, its script the first argument (a pane
/// inherits its server's environment, not the creator's, so the script travels in argv).
#[cfg(feature = "test-hooks")]
fn fake_claude_in(dir: &Path) {
    fs::create_dir_all(dir).unwrap();
    let claude = dir.join("claude");
    fs::write(
        &claude,
        format!(
            "#!/usr/bin/env bash\nexport MAM_FAKE_AGENT_SCRIPT=\"$1\"\nshift\nexec -a claude '{}' \"$@\"\n",
            mam_bin().display()
        ),
    )
    .unwrap();
    fs::set_permissions(&claude, fs::Permissions::from_mode(0o755)).unwrap();
}

/// Kills a private tmux server (and removes its socket file) on drop.
#[cfg(feature = "test-hooks")]
struct TmuxServer(String);

#[cfg(feature = "test-hooks")]
impl Drop for TmuxServer {
    fn drop(&mut self) {
        kill_tmux(&self.0);
    }
}

#[cfg(feature = "test-hooks")]
fn tmux_panes(sock: &str) -> Vec<String> {
    let out = Command::new("tmux").args(["-L", sock, "list-panes", "-a", "-F", "#{pane_id}"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
}

/// ORCH 5.2 / A44, a failed stop: on real tmux, with a `tmux` wrapper first on PATH whose
/// `kill-pane` fails, `remove --stop` cannot close the session's pane and the agent is still listed
/// after the close: exit 1, `RESULT=failed`, nothing removed, the row not `stopped`. The stop's
/// clean-up of the agent's recorded processes then ends the agent, which saves a file on its way
/// out: it is kept with the rest of the worktree byte for byte, and the next `remove --stop` finds
/// it and refuses; once the file is dealt with, the stop completes and the worktree goes.
#[cfg(feature = "test-hooks")]
#[test]
fn a_failing_stop_is_result_failed_and_keeps_the_worktree_and_what_was_saved() {
    if !have_tool("tmux", "MAM_REQUIRE_TMUX") {
        return;
    }
    let mut w = W::new("wt-stopfail");
    let wt = w.prepare("feat", &[]);
    fs::write(wt.join("app.txt"), "committed work\n").unwrap();
    git(&wt, &["commit", "-q", "-am", "work on feat"]);
    let bin = w.td.path("tmuxbin");
    fake_claude_in(&bin);
    let real = String::from_utf8(Command::new("sh").args(["-c", "command -v tmux"]).output().unwrap().stdout).unwrap();
    let fault = w.td.path("fail-kill-pane");
    fs::write(
        bin.join("tmux"),
        format!(
            "#!/usr/bin/env bash\nfor a in \"$@\"; do\n  if [ \"$a\" = kill-pane ] && [ -e '{}' ]; then \
             echo 'tmux: kill-pane failing on purpose (test wrapper)' >&2; exit 1; fi\ndone\nexec '{}' \"$@\"\n",
            fault.display(),
            real.trim()
        ),
    )
    .unwrap();
    fs::set_permissions(bin.join("tmux"), fs::Permissions::from_mode(0o755)).unwrap();
    let sock = format!("mam-wt-{}", rand_hex(4));
    let _server = TmuxServer(sock.clone());
    let mut path = bin.clone().into_os_string();
    path.push(":");
    path.push(std::env::var_os("PATH").unwrap_or_default());
    w.env.retain(|(k, _)| k != "MAM_PANE_BACKEND");
    w.env.extend([
        ("MAM_PANE_BACKEND".to_string(), OsString::from("tmux")),
        ("MAM_TMUX_SOCKET".into(), sock.clone().into()),
        ("MAM_TMUX_STABLE_MS".into(), "200".into()),
        ("PATH".into(), path),
    ]);
    let saved = wt.join("saved-on-the-way-out.txt");
    let sp = w.td.write("s1.script", format!("on_stop_write={}\n", saved.display()));
    w.mam()
        .args(["create", "claude", "--name", "s1", "--no-onboard", "--workspace"])
        .arg_path(&wt)
        .args(["--".as_ref(), sp.as_os_str(), "test-double".as_ref(), "agent".as_ref()])
        .run_within(LIMIT)
        .expect_rc(0);
    assert_eq!(tmux_panes(&sock).len(), 1);
    let before = snapshot(&wt);
    let branch = git(&w.root, &["rev-parse", "feat"]);

    fs::write(&fault, "").unwrap();
    let r = w.remove(&wt, &["--stop"]);
    r.expect_rc(1);
    assert_eq!(summary(&r), ("failed".into(), "plain".into(), "none".into()));
    assert!(
        r.stderr().contains("stopping the sessions failed (")
            && r.stderr().contains("agent still listed")
            && r.stderr().contains("the worktree was kept"),
        "{}",
        r.stderr()
    );
    assert!(!r.stdout().contains("RESULT=removed") && !r.stdout().contains("SESSION=s1 STATUS=stopped"));
    assert_eq!(w.row_status("s1"), "running", "a failed stop leaves the row as it was");
    // Nothing removed: the worktree, its registration and branch, and what the agent saved.
    assert!(wt.is_dir() && w.worktree_count() == 2);
    assert_eq!(git(&w.root, &["rev-parse", "feat"]), branch);
    assert_eq!(fs::read_to_string(&saved).unwrap(), "stopped\n");
    let mut after = snapshot(&wt);
    after.remove(Path::new("saved-on-the-way-out.txt"));
    assert_eq!(after, before, "the worktree is byte for byte as it was, plus the saved file");

    // The fault gone, the saved file is what the next look finds: refused, nothing changed.
    fs::remove_file(&fault).unwrap();
    let r = w.remove(&wt, &["--stop"]);
    r.expect_rc(3);
    assert_eq!(summary(&r), ("refused".into(), "plain".into(), "dirty".into()));
    assert!(r.stdout().contains("saved-on-the-way-out.txt"), "{}", r.stdout());
    assert!(r.stderr().contains("nothing was changed"), "{}", r.stderr());
    assert_eq!(fs::read_to_string(&saved).unwrap(), "stopped\n");
    // Once it is dealt with, the stop completes and the worktree goes.
    fs::remove_file(&saved).unwrap();
    let r = w.remove(&wt, &["--stop"]);
    r.expect_rc(0);
    assert!(r.stdout().contains("SESSION=s1 STATUS=stopped"), "{}", r.stdout());
    assert_eq!(summary(&r).0, "removed");
    assert_eq!(w.row_status("s1"), "stopped");
    assert!(!wt.exists() && tmux_panes(&sock).is_empty());
    assert_eq!(git(&w.root, &["rev-parse", "feat"]), branch, "the branch is never deleted");
}

/// Stops the control root's daemon on drop (the test started it through `create`).
struct Daemon(Cmd);

impl Drop for Daemon {
    fn drop(&mut self) {
        let c = std::mem::replace(&mut self.0, Cmd { cmd: Command::new("true") });
        let _ = c.args(["monitor", "stop"]).run_within(LIMIT);
    }
}

/// ORCH 5.1 `--creator` with onboarding (2.3 steps 7-9): the session in the worktree is onboarded
/// against the control root's control plane (its registry, its daemon, which no creator
/// suppresses), create's `ONBOARD_JOB=` and `DAEMON_PID=` lines follow `WORKTREE= BRANCH= BASE=`
/// and the session's line, the job completes with its report in the control root's registry, and
/// nothing of it lands in the worktree, which `remove --stop` then takes away.
#[test]
fn prepare_creator_onboards_the_session_against_the_control_root() {
    let mut w = W::new("wt-onboard");
    let Some(broker) = start_target(Target::Embedded, &w.td) else { return };
    w.env.retain(|(k, _)| k != "MQTT_PORT");
    w.env.extend([
        ("MQTT_PORT".to_string(), OsString::from(broker.port().to_string())),
        ("MAM_HEARTBEAT_SEC".into(), "1".into()),
        ("MAM_ACK_TIMEOUT_S".into(), "10".into()),
        ("MAM_WATCH_POLL_MS".into(), "100".into()),
    ]);
    let sp = w.td.write("c1.script", "work_s=0.5\nreport_text=claude in its worktree, the commands ran\n");
    let _daemon = Daemon(w.mam());
    let r = w
        .mam()
        .env_remove("MAM_NO_SUBSCRIBER_DAEMON")
        .env("MAM_FAKE_AGENT_SCRIPT", &sp)
        .args(["worktree", "prepare", "feat", "--creator", "claude", "--name", "c1", "--", "test-double", "agent"])
        .run_within(LIMIT);
    r.expect_rc(0);
    let lines: Vec<String> = r.stdout().lines().map(str::to_string).collect();
    let wt = PathBuf::from(lines[0].strip_prefix("WORKTREE=").unwrap());
    assert_eq!(lines[1], "BRANCH=feat");
    assert!(lines[2].starts_with("BASE=") && lines[3].starts_with("SESSION=c1 PANE="), "{lines:?}");
    let job = lines[4].strip_prefix("ONBOARD_JOB=").unwrap_or_else(|| panic!("{lines:?}")).to_string();
    let daemon: i32 = lines[5].strip_prefix("DAEMON_PID=").unwrap_or_else(|| panic!("{lines:?}")).parse().unwrap();
    assert_eq!(lines.len(), 6, "{lines:?}");
    assert!(mam::sys::proc_cmdline(daemon).is_ok(), "the daemon {daemon} runs");
    // The daemon is the control root's, not the worktree's.
    let status = |ws: &Path| {
        let r = w.mam().args(["daemon", "status", "--workspace"]).arg_path(ws).run_within(LIMIT);
        r.stdout().trim().to_string()
    };
    assert_eq!(status(&w.root), daemon.to_string());
    assert_eq!(status(&wt), "", "no daemon for the worktree");
    // The job: in the control root's registry, addressed to c1, briefed with the root's registry.
    let reg = w.root.join(".mam/jobs");
    let rec = || -> serde_json::Value {
        serde_json::from_slice(&fs::read(reg.join(format!("{job}.json"))).unwrap()).unwrap()
    };
    assert_eq!((rec()["agent_session"].as_str(), rec()["type"].as_str()), (Some("c1"), Some("task")));
    let brief = fs::read_to_string(reg.join(&job).join("brief.md")).unwrap();
    assert!(brief.contains(&format!("--registry-dir '{}'", reg.display())), "{brief}");
    assert!(!brief.contains(wt.to_str().unwrap()), "nothing of the brief points into the worktree: {brief}");
    assert!(brief.contains(&format!("control plane at `{}`", w.root.display())), "{brief}");
    wait_until("the onboarding job completes", LIMIT, || rec()["status"] == "completed");
    let report = fs::read_to_string(reg.join(&job).join("report.md")).unwrap();
    assert!(report.contains("claude in its worktree"), "{report}");
    // Nothing of the control plane in the worktree: no .mam, a clean status.
    assert!(!wt.join(".mam").exists());
    assert_eq!(git(&wt, &["status", "--porcelain", "--untracked-files=all"]), "");
    let r = w.remove(&wt, &["--stop"]);
    r.expect_rc(0);
    assert!(r.stdout().contains("SESSION=c1 STATUS=stopped CANCELLED=-"), "{}", r.stdout());
    assert_eq!(summary(&r).0, "removed");
}

/// Worktrees on the real herdr: `prepare --creator` starts the session in a herdr pane whose cwd
/// is the worktree, `list` shows it running, `remove --stop` closes that pane (herdr no longer
/// lists it or the agent), marks the row stopped and removes the worktree.
#[test]
fn worktree_with_a_creator_on_the_real_herdr() {
    let mut w = W::new("wt-herdr");
    let Some(herdr) = HerdrHome::new(&w.td) else { return };
    herdr.fake_claude();
    w.env.retain(|(k, _)| k != "MAM_PANE_BACKEND" && k != "MAM_FAKE_PANES_DIR");
    w.env.extend(herdr.env());
    for (k, v) in [
        ("MAM_PANE_BACKEND", "herdr"),
        ("MAM_SKS_QUIESCE_GAP_MS", "100"),
        ("MAM_SKS_QUIESCE_S", "2"),
        ("MAM_STARTUP_DIALOG_SETTLE_MS", "1000"),
    ] {
        w.env.retain(|(x, _)| x != k);
        w.env.push((k.into(), v.into()));
    }
    let sp = w.td.write("h1.script", "report_working=0\n");
    let run = |args: &[&OsStr]| {
        w.mam().env_remove("HERDR_SOCKET_PATH").env_remove("HERDR_SESSION").env_remove("TMUX").args(args)
    };
    let r = run(&[
        "worktree".as_ref(),
        "prepare".as_ref(),
        "feat".as_ref(),
        "--creator".as_ref(),
        "claude".as_ref(),
        "--name".as_ref(),
        "h1".as_ref(),
        "--no-onboard".as_ref(),
        "--".as_ref(),
        sp.as_os_str(),
        "test-double".as_ref(),
        "agent".as_ref(),
    ])
    .run_within(Duration::from_secs(60));
    r.expect_rc(0);
    let wt = PathBuf::from(r.stdout().lines().next().unwrap().strip_prefix("WORKTREE=").unwrap());
    let session = r.stdout().lines().nth(3).unwrap().to_string();
    let pane = session.split(' ').find_map(|x| x.strip_prefix("PANE=")).unwrap().to_string();
    assert!(session.ends_with(&format!("CWD={}", wt.display())), "{session}");
    assert!(herdr.pane_ids().contains(&pane), "{pane} in {:?}", herdr.pane_ids());
    let (agent_pid, _) = herdr.agent_process(&pane);
    let cwd = fs::read_link(format!("/proc/{agent_pid}/cwd")).unwrap();
    assert_eq!(cwd, wt, "the agent works in the worktree");
    let l = run(&["worktree".as_ref(), "list".as_ref()]).run_within(LIMIT);
    l.expect_rc(0);
    assert!(l.stdout().contains("SESSIONS=h1") && l.stdout().contains("FINDINGS=sessions-running"), "{}", l.stdout());
    let r = run(&["worktree".as_ref(), "remove".as_ref(), wt.as_os_str(), "--stop".as_ref()])
        .run_within(Duration::from_secs(60));
    r.expect_rc(0);
    assert!(r.stdout().contains("SESSION=h1 STATUS=stopped"), "{}", r.stdout());
    assert_eq!(summary(&r), ("removed".into(), "plain".into(), "none".into()));
    assert!(!herdr.pane_ids().contains(&pane), "the herdr pane is closed: {:?}", herdr.pane_ids());
    let agents = herdr.herdr_json(&["agent", "list"]);
    assert!(!agents.to_string().contains("\"h1\""), "herdr lists no h1: {agents}");
    wait_until("the agent process ends", Duration::from_secs(10), || mam::sys::proc_cmdline(agent_pid).is_err());
    assert_eq!(w.row_status("h1"), "stopped");
    assert!(!wt.exists());
}
