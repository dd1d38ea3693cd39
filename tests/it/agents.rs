//! Agent adapters, conversation purge and orc-onboard (ORCH 6.6 tests 1-13, A45-A48, A57): every test
//! uses a fresh random uuid and first asserts that no live process names it; artifacts are built in
//! the test's private HOME from literal paths (A47), never from the adapter's table. The in-use check
//! runs against real processes: a helper chain, an agent-named ancestor (`exec -a claude`), a process
//! holding only the presence lock (flock on an inherited fd), and with `lsof` missing from PATH.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::*;

/// One test's world: its directory, HOME and uuid.
struct W {
    td: TestDir,
    u: String,
}

impl W {
    fn new(name: &str) -> W {
        let td = TestDir::new(name);
        let u = fresh_uuid();
        assert_nobody_names(&u);
        W { td, u }
    }

    fn home(&self) -> PathBuf {
        self.td.path("home")
    }

    fn agy(&self) -> PathBuf {
        self.home().join(".gemini/antigravity-cli")
    }

    /// The full agy conversation of ORCH 6.2, as literal paths.
    fn agy_fixture(&self) -> Vec<PathBuf> {
        let u = &self.u;
        let a = self.agy();
        let files = [
            format!("conversations/{u}.db"),
            format!("conversations/{u}.db-wal"),
            format!("conversations/{u}.db-shm"),
            format!("conversations/{u}.db-journal"),
            format!("brain/{u}/plan.md"),
            format!("brain/{u}/sub/notes.txt"),
            format!("annotations/{u}.pbtxt"),
            format!("locks/{u}.lock"),
        ];
        files.iter().map(|f| put(&a.join(f))).collect()
    }

    fn lock(&self) -> PathBuf {
        self.agy().join(format!("locks/{}.lock", self.u))
    }

    fn claude_fixture(&self) -> PathBuf {
        put(&self.home().join(format!(".claude/projects/-work-proj/{}.jsonl", self.u)))
    }

    fn mam(&self) -> Cmd {
        self.td.mam()
    }

    fn purge(&self, agent: &str) -> Run {
        self.mam().args(["agents", "purge", agent, &self.u]).run()
    }

    fn registered(&self) -> Vec<String> {
        let f = self.td.ws().join(".mam/agent_sessions.json");
        let Ok(b) = fs::read(f) else { return Vec::new() };
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
        v["orchestrator_uuids"].as_array().unwrap().iter().map(|x| x.as_str().unwrap().to_string()).collect()
    }
}

fn put(p: &Path) -> PathBuf {
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, b"x").unwrap();
    p.to_path_buf()
}

fn fresh_uuid() -> String {
    let h = rand_hex(16);
    format!("{}-{}-4{}-8{}-{}", &h[..8], &h[8..12], &h[13..16], &h[17..20], &h[20..32])
}

/// No live process has the uuid in its command line (the precondition of every 6.6 test).
fn assert_nobody_names(u: &str) {
    for e in fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(c) = fs::read(e.path().join("cmdline")) {
            assert!(!String::from_utf8_lossy(&c).contains(u), "pid {:?} names {u}", e.file_name());
        }
    }
}

/// A process that holds `path` open and flock'ed on fd 9 while running `sleep`: its arguments name
/// neither the path nor the uuid (the path travels in the environment). Killed on drop.
struct LockHolder(Child);

impl LockHolder {
    fn start(path: &Path) -> LockHolder {
        let child = Command::new("sh")
            .args(["-c", "exec 9<>\"$LOCKP\"; flock 9; exec sleep 120"])
            .env("LOCKP", path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id();
        wait_until("the lock holder runs sleep", Duration::from_secs(10), || {
            fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.starts_with(b"sleep\0"))
        });
        LockHolder(child)
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for LockHolder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn all_exist(paths: &[PathBuf]) -> bool {
    paths.iter().all(|p| p.exists())
}

/// Every path under `root` whose name carries `u`.
fn carrying(root: &Path, u: &str) -> Vec<String> {
    tree(root).into_iter().filter(|p| p.contains(u)).collect()
}

// ---------------------------------------------------------------------------------------------
// 6.6 acceptance tests

#[test]
fn o6_6_1_agy_purge_removes_database_sidecars_annotation_brain_and_lock() {
    let w = W::new("o661");
    let files = w.agy_fixture();
    let r = w.purge("agy");
    r.expect_rc(0);
    for p in [
        format!("conversations/{}.db", w.u),
        format!("conversations/{}.db-wal", w.u),
        format!("conversations/{}.db-shm", w.u),
        format!("conversations/{}.db-journal", w.u),
        format!("brain/{}", w.u),
        format!("annotations/{}.pbtxt", w.u),
        format!("locks/{}.lock", w.u),
    ] {
        assert!(r.stdout().contains(&format!("removed {}\n", w.agy().join(&p).display())), "{p}: {}", r.stdout());
    }
    // The presence lock is the last removal.
    assert!(r.stdout().trim_end().ends_with(&format!("locks/{}.lock", w.u)), "{}", r.stdout());
    assert!(files.iter().all(|p| !p.exists()));
    assert!(carrying(&w.agy(), &w.u).is_empty(), "residual_artifacts empty");
    // Claude's layout (A47): the transcript and a session file of a dead process naming it.
    let t = w.claude_fixture();
    let dead = w.home().join(".claude/sessions/999999999.json");
    fs::create_dir_all(dead.parent().unwrap()).unwrap();
    fs::write(&dead, format!("{{\"pid\":999999999,\"sessionId\":\"{}\",\"cwd\":\"/work/proj\"}}", w.u)).unwrap();
    let r = w.purge("claude");
    r.expect_rc(0);
    assert!(!t.exists() && !dead.exists(), "{}", r.stdout());
}

#[test]
fn o6_6_2_a_process_holding_only_the_presence_lock_refuses_the_purge() {
    if !have_tool("lsof", "MAM_REQUIRE_LSOF") {
        return;
    }
    let w = W::new("o662");
    let files = w.agy_fixture();
    let holder = LockHolder::start(&w.lock());
    assert_nobody_names(&w.u);
    let r = w.purge("auto");
    r.expect_rc(5);
    assert!(r.stderr().contains(&format!("in use: pid {} (lsof)", holder.pid())), "{}", r.stderr());
    assert!(r.stderr().starts_with("REFUSED: agents purge: "), "{}", r.stderr());
    assert!(all_exist(&files), "nothing removed");
    assert!(r.stdout().is_empty());
}

#[test]
fn o6_6_3_orphaned_leftovers_without_the_database_resolve_to_agy_and_are_purged() {
    let w = W::new("o663");
    let u = &w.u;
    let left = [format!("conversations/{u}.db-wal"), format!("annotations/{u}.pbtxt"), format!("locks/{u}.lock")];
    let files: Vec<PathBuf> = left.iter().map(|f| put(&w.agy().join(f))).collect();
    let r = w.purge("auto");
    r.expect_rc(0);
    assert_eq!(r.stdout().lines().filter(|l| l.starts_with("removed ")).count(), 3, "{}", r.stdout());
    assert!(files.iter().all(|p| !p.exists()));
}

#[test]
fn o6_6_4_helper_chain_excluded_agent_ancestor_counted_session_vars_refuse() {
    let w = W::new("o664");
    let mam = mam_bin().display().to_string();
    // A non-agent helper chain naming the uuid (bash -c '... <uuid>; true') is the purge's own.
    w.agy_fixture();
    let line = format!("'{mam}' agents purge auto {}; true", w.u);
    let r = w.td.command("bash").args(["-c", &line]).run();
    r.expect_rc(0);
    assert!(r.stdout().contains("removed "), "{}", r.stdout());
    // An agent CLI ancestor (argv[0] `claude`, via exec -a) naming the uuid holds it.
    let files = w.agy_fixture();
    let inner = w.td.write("inner.sh", "\"$MAM\" agents purge auto \"$1\"\nexit $?\n");
    let r =
        w.td.command("bash")
            .args(["-c", "exec -a claude bash \"$0\" \"$1\"", inner.to_str().unwrap(), &w.u])
            .env("MAM", &mam)
            .run();
    r.expect_rc(5);
    assert!(r.stderr().contains("(argv)"), "{}", r.stderr());
    assert!(all_exist(&files));
    // Any one of the session-id variables set to the uuid (the five of 6.3 and codex's two, A58).
    for v in [
        "CLAUDE_CODE_SESSION_ID",
        "ANTIGRAVITY_CONVERSATION_ID",
        "HERMES_SESSION_ID",
        "GROK_SESSION_ID",
        "OPENCODE_SESSION_ID",
        "CODEX_THREAD_ID",
        "CODEX_SESSION_ID",
    ] {
        let r = w.mam().args(["agents", "purge", "auto", &w.u]).env(v, w.u.to_uppercase()).run();
        r.expect_rc(5);
        assert!(r.stderr().contains("(session-var)"), "{v}: {}", r.stderr());
        assert!(all_exist(&files), "{v}: nothing removed");
    }
}

#[test]
fn o6_6_5_remove_with_purge_inside_the_orchestrators_own_conversation_is_refused() {
    let w = W::new("o665");
    w.mam().args(["orc-onboard", &w.u]).run().expect_rc(0);
    let files = w.agy_fixture();
    let shim = Path::new(env!("CARGO_MANIFEST_DIR")).join("shims/orc_onboard.sh");
    let r =
        w.td.command(&shim)
            .args(["--remove", &w.u, "--purge-conversation", "--yes"])
            .env("MAM_BIN", mam_bin())
            .env("CLAUDE_CODE_SESSION_ID", &w.u)
            .run();
    r.expect_rc(5);
    assert!(r.stderr().contains("in use: pid ") && r.stderr().contains("(session-var)"), "{}", r.stderr());
    assert_eq!(w.registered(), std::slice::from_ref(&w.u), "still registered");
    assert!(all_exist(&files));
    let r = w.mam().args(["orc-onboard", "--remove", &w.u, "--purge-conversation"]).run();
    r.expect_rc(4);
    assert_eq!(w.registered(), std::slice::from_ref(&w.u));
    // Outside the conversation the purge runs first, then the registration goes.
    let r = w.mam().args(["orc-onboard", "--remove", &w.u, "--purge-conversation", "--yes", "--agent", "agy"]).run();
    r.expect_rc(0);
    assert!(
        r.stdout().contains("removed ")
            && r.stdout().ends_with(&format!("Successfully removed orchestrator {}\n", w.u))
    );
    assert!(w.registered().is_empty() && files.iter().all(|p| !p.exists()));
}

#[test]
fn o6_6_6_add_and_remove_messages_read_added_and_removed() {
    let w = W::new("o666");
    let r = w.mam().args(["orc-onboard", &w.u]).run();
    r.expect_rc(0);
    assert_eq!(r.stdout(), format!("Successfully added orchestrator {}\n", w.u));
    let r = w.mam().args(["orc-onboard", "--remove", &w.u]).run();
    r.expect_rc(0);
    assert_eq!(r.stdout(), format!("Successfully removed orchestrator {}\n", w.u));
    // The uuid defaults to --agent's session-id variable (A48); unset is a refusal naming it.
    let r = w.mam().args(["orc-onboard", "--agent", "claude"]).env("CLAUDE_CODE_SESSION_ID", &w.u).run();
    r.expect_rc(0);
    assert_eq!(w.registered(), std::slice::from_ref(&w.u));
    let r = w.mam().args(["orc-onboard", "--agent", "claude"]).run();
    r.expect_rc(2);
    assert_eq!(r.stderr(), "REFUSED: orc-onboard: no uuid given and CLAUDE_CODE_SESSION_ID unset\n");
    // No --agent: the kind of the nearest agent ancestor (here `claude` via exec -a).
    let v = fresh_uuid();
    let inner = w.td.write("inner.sh", "\"$MAM\" orc-onboard\nexit $?\n");
    let r =
        w.td.command("bash")
            .args(["-c", "exec -a claude bash \"$0\"", inner.to_str().unwrap()])
            .env("MAM", mam_bin())
            .env("CLAUDE_CODE_SESSION_ID", &v)
            .run();
    r.expect_rc(0);
    assert_eq!(r.stdout(), format!("Successfully added orchestrator {v}\n"));
}

#[test]
fn o6_6_7_auto_with_no_artifact_exits_5() {
    let w = W::new("o667");
    let r = w.purge("auto");
    r.expect_rc(5);
    assert!(r.stderr().contains(&format!("no artifact for {}", w.u)), "{}", r.stderr());
    // A kind whose layout is not pinned: exit 5 naming it (A47).
    let r = w.purge("codex");
    r.expect_rc(5);
    assert!(r.stderr().contains("no artifact (purge not supported for codex)"), "{}", r.stderr());
}

#[test]
fn o6_6_8_auto_ambiguous_exits_2_and_touches_nothing() {
    let w = W::new("o668");
    let mut files = w.agy_fixture();
    files.push(w.claude_fixture());
    let r = w.purge("auto");
    r.expect_rc(2);
    assert!(r.stderr().contains("ambiguous") && r.stderr().contains("claude and agy"), "{}", r.stderr());
    assert!(all_exist(&files));
}

#[test]
fn o6_6_9_residuals_exit_1_and_a_symlink_is_never_followed_nor_deleted() {
    let w = W::new("o669");
    w.agy_fixture();
    let stray = put(&w.agy().join(format!("exports/copy-of-{}.txt", w.u)));
    let r = w.purge("agy");
    r.expect_rc(1);
    assert!(r.stdout().contains(&format!("residual {} (still carries the uuid)", stray.display())), "{}", r.stdout());
    assert!(r.stderr().starts_with("ERROR: agents purge: 1 residual artifact(s)"), "{}", r.stderr());
    // An artifact path that is a symlink out of the agent root: not followed, not deleted.
    let outside = put(&w.td.path(&format!("outside/{}.db", w.u)));
    let link = w.agy().join(format!("conversations/{}.db", w.u));
    fs::create_dir_all(link.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&outside, &link).unwrap();
    let r = w.purge("agy");
    r.expect_rc(1);
    assert!(r.stdout().contains("is a symlink, not followed"), "{}", r.stdout());
    assert!(outside.exists() && fs::symlink_metadata(&link).is_ok(), "target and link kept");
    // A symlinked directory on the way: nothing below it is touched either.
    let w2 = W::new("o669b");
    let real = w2.td.path("elsewhere");
    let victim = put(&real.join(format!("{}.pbtxt", w2.u)));
    fs::create_dir_all(w2.agy()).unwrap();
    std::os::unix::fs::symlink(&real, w2.agy().join("annotations")).unwrap();
    put(&w2.agy().join(format!("conversations/{}.db", w2.u)));
    let r = w2.purge("agy");
    r.expect_rc(1);
    assert!(victim.exists(), "{}", r.stdout());
}

#[test]
fn o6_6_10_lsof_missing_scans_proc_fd_and_still_refuses_a_lock_holder() {
    let w = W::new("o6610");
    let files = w.agy_fixture();
    // A PATH with ps but without lsof.
    let bin = w.td.path("nolsof");
    fs::create_dir_all(&bin).unwrap();
    let ps = which("ps");
    std::os::unix::fs::symlink(ps, bin.join("ps")).unwrap();
    let holder = LockHolder::start(&w.lock());
    let r = w.mam().args(["agents", "purge", "auto", &w.u]).env("PATH", &bin).run();
    r.expect_rc(5);
    assert!(r.stderr().contains(&format!("in use: pid {} (proc-fd)", holder.pid())), "{}", r.stderr());
    assert!(all_exist(&files));
    drop(holder);
    let r = w.mam().args(["agents", "purge", "auto", &w.u]).env("PATH", &bin).run();
    r.expect_rc(0);
    assert!(files.iter().all(|p| !p.exists()));
}

fn which(tool: &str) -> PathBuf {
    std::env::split_paths(&std::env::var_os("PATH").unwrap())
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{tool} on PATH"))
}

#[test]
fn o6_6_11_removing_an_unregistered_uuid_exits_3() {
    let w = W::new("o6611");
    let r = w.mam().args(["orc-onboard", "--remove", &w.u]).run();
    r.expect_rc(3);
    assert!(r.stderr().contains("is not registered"), "{}", r.stderr());
    // --yes is checked first: without it the purge flag is exit 4 even for an unknown uuid.
    w.mam().args(["orc-onboard", "--remove", &w.u, "--purge-conversation"]).run().expect_rc(4);
}

#[test]
fn o6_6_12_list_prints_the_registered_uuids() {
    let w = W::new("o6612");
    w.mam().args(["orc-onboard", "--list"]).run().expect_rc(0);
    let v = fresh_uuid();
    w.mam().args(["orc-onboard", &w.u]).run().expect_rc(0);
    w.mam().args(["orc-onboard", &v.to_uppercase()]).run().expect_rc(0);
    let r = w.mam().args(["orc-onboard", "--list"]).run();
    r.expect_rc(0);
    assert_eq!(r.stdout(), format!("{}\n{v}\n", w.u), "stored bare and lowercase");
}

#[test]
fn o6_6_13_adding_twice_keeps_one_entry_and_the_file_unchanged() {
    let w = W::new("o6613");
    w.mam().args(["orc-onboard", &w.u]).run().expect_rc(0);
    let f = w.td.ws().join(".mam/agent_sessions.json");
    let before = fs::read(&f).unwrap();
    let r = w.mam().args(["orc-onboard", &w.u]).run();
    r.expect_rc(0);
    assert_eq!(r.stdout(), format!("Orchestrator {} already registered\n", w.u));
    assert_eq!(fs::read(&f).unwrap(), before);
    assert_eq!(w.registered(), std::slice::from_ref(&w.u));
}

// ---------------------------------------------------------------------------------------------
// Bad input (A45, SECURITY)

#[test]
fn hostile_uuids_and_unknown_kinds_are_refused_with_nothing_touched() {
    let w = W::new("badin");
    let files = w.agy_fixture();
    let bad = [
        format!("{}/..", &w.u[..33]),
        format!("../{}", &w.u[3..]),
        format!("{}*", &w.u[..35]),
        format!("{}\n", &w.u[..35]),
        "*".to_string(),
        String::new(),
    ];
    for b in &bad {
        let r = w.mam().args(["agents", "purge", "agy", b]).run();
        r.expect_rc(2);
        assert!(r.stderr().contains("is not a canonical uuid"), "{b:?}: {}", r.stderr());
        assert_eq!(r.stderr().lines().count(), 1, "one line: {:?}", r.stderr());
        w.mam().args(["orc-onboard", b]).run().expect_rc(2);
        w.mam().args(["orc-onboard", "--remove", b]).run().expect_rc(2);
    }
    assert!(all_exist(&files) && w.registered().is_empty());
    let r = w.purge("nosuchagent");
    r.expect_rc(2);
    assert!(r.stderr().contains("unknown agent kind 'nosuchagent'"), "{}", r.stderr());
    w.mam().args(["orc-onboard", "--agent", "nosuchagent"]).run().expect_rc(2);
    w.mam().args(["agents", "purge", "agy"]).run().expect_rc(2);
    w.mam().args(["agents", "wipe", "agy", &w.u]).run().expect_rc(2);
    assert!(all_exist(&files));
}

#[test]
fn crafted_ids_and_kinds_never_touch_anything_outside_their_directories() {
    // Issue 29: ids shaped as paths (absolute, `../`), with control characters or huge, as an
    // argument or through the session-id variable orc-onboard reads: refused (rc 2), one line that
    // neither echoes a control character nor the huge value in full, and nothing outside changed.
    let w = W::new("crafted");
    let files = w.agy_fixture();
    let outside = w.td.write("outside/keep.txt", "keep\n");
    let huge = "a".repeat(100_000); // under MAX_ARG_STRLEN (128 KiB)
    let ids = [
        "/".to_string(),
        outside.display().to_string(),
        format!("../../outside/{}", &w.u[..20]),
        format!("{}\x1b[2J", &w.u[..32]),
        format!("{}\r", &w.u[..35]),
        huge.clone(),
        format!("{}/{}", &w.u[..17], &w.u[18..]),
    ];
    let check = |what: &str, r: &Run| {
        r.expect_rc(2);
        assert_eq!(r.stderr().lines().count(), 1, "{what}: one line: {:?}", &r.stderr()[..r.stderr().len().min(300)]);
        assert!(!r.stderr().contains('\x1b') && !r.stderr().contains('\r'), "{what}: control character echoed");
        assert!(r.stderr().len() < 4096, "{what}: the huge value echoed ({} bytes)", r.stderr().len());
        assert!(all_exist(&files), "{what}: an artifact was removed");
        assert_eq!(fs::read_to_string(&outside).unwrap(), "keep\n", "{what}");
        assert!(w.registered().is_empty(), "{what}: registered");
    };
    for id in &ids {
        let what = &id[..id.len().min(60)];
        check(what, &w.mam().args(["agents", "purge", "agy", id]).run());
        check(what, &w.mam().args(["agents", "purge", "auto", id]).run());
        check(what, &w.mam().args(["orc-onboard", id]).run());
        check(what, &w.mam().args(["orc-onboard", "--remove", id, "--purge-conversation", "--yes"]).run());
        check(what, &w.mam().args(["orc-onboard", "--agent", "agy"]).env("ANTIGRAVITY_CONVERSATION_ID", id).run());
    }
    for kind in ["../agy", "/etc", "agy/../claude", "agy\x1b[2J", huge.as_str()] {
        let what = &kind[..kind.len().min(60)];
        check(what, &w.mam().args(["agents", "purge", kind, &w.u]).run());
        check(what, &w.mam().args(["orc-onboard", "--agent", kind]).env("ANTIGRAVITY_CONVERSATION_ID", &w.u).run());
    }
}
