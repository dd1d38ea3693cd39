//! Sessions (ORCH 2.8): create / resume / stop / status / reconcile, the sessions file and the shims.
//! Tests run over the fake backend (`MAM_PANE_BACKEND=fake`, state in the test directory); herdr-only
//! behaviour (`--env` on the pane calls, no mutation, rollback of a created workspace, list outcomes
//! for reconcile) runs against the MOCK herdr (`mam test-double herdr`, compared with the real herdr
//! by `herdr_contract.rs`); the main flow (create -> status -> stop -> resume) and the "pane not at a
//! shell" refusal also run on real tmux with a random socket per test, killed on drop.
//!
//! Every 2.8 test whose behaviour can happen on a real herdr also runs on one (`Kind::RealHerdr`: a
//! private `HerdrHome` world whose server mam bootstraps before the test's first call, so the
//! per-call environment of later calls never becomes the server's). There the mock's argv log is
//! replaced by what the real herdr shows: `/proc/<agent>/environ` for `--env` forwarding, the agent's
//! argv for bare start arguments, `herdr workspace list` / `pane list` for mutations and labels.
//! Skips when herdr is absent, fails when `MAM_REQUIRE_HERDR=1`.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::*;

// ---------------------------------------------------------------------------------------------
// Harness

#[derive(PartialEq, Clone, Copy, Debug)]
enum Kind {
    Fake,
    Tmux,
    /// The MOCK herdr.
    Herdr,
    /// The real herdr (`HERDR_BIN` or PATH), in a private world.
    RealHerdr,
}

/// The variables of a control-plane binding (2.3 step 3).
const BINDING: &[&str] = &["WORKSPACE_ROOT", "AGENT_SESSIONS_YAML", "MAM_JOBS_DIR", "DELEGATE_JOB_LOGS_DIR"];

/// One backend under test with its environment; kills what it started on drop.
struct S {
    /// The real herdr's world (dropped first: its server and every pane process end with it).
    real: Option<HerdrHome>,
    td: TestDir,
    kind: Kind,
    env: Vec<(String, OsString)>,
    tmux: Option<String>,
}

impl Drop for S {
    fn drop(&mut self) {
        if let Some(sock) = &self.tmux {
            kill_tmux(sock);
        }
        // Fake agents lead their own process group.
        for e in fs::read_dir(self.td.path("panes/panes")).into_iter().flatten().flatten() {
            if let Ok(pid) = fs::read_to_string(e.path().join("pid")).unwrap_or_default().trim().parse::<i32>() {
                let _ = mam::sys::kill(-pid, 9);
            }
        }
    }
}

impl S {
    fn new(kind: Kind, name: &str) -> S {
        S::on(kind, name).unwrap_or_else(|| panic!("no {kind:?} backend"))
    }

    /// The world of `kind`, or `None` (skip) when that backend is absent and not required.
    fn on(kind: Kind, name: &str) -> Option<S> {
        if kind == Kind::Tmux && !have_tool("tmux", "MAM_REQUIRE_TMUX") {
            return None;
        }
        let td = TestDir::new(name);
        // The agent executable `claude` is the mam binary (A18); AGENT_ARGS make it the fake agent.
        let (bin, path) = claude_is_mam(&td);
        let mut env: Vec<(String, OsString)> = vec![
            ("PATH".into(), path.into()),
            ("MAM_AGENT_START_TIMEOUT_MS".into(), "20000".into()),
            ("MAM_TMUX_STABLE_MS".into(), "200".into()),
            ("MAM_STARTUP_DIALOG_SETTLE_MS".into(), "50".into()),
            ("MAM_FAKE_AGENT_SCRIPT".into(), td.path("agent.script").into()),
            // `stop` and `finalize` publish a close state (A4); with no broker here one attempt is
            // enough (a failure is a WARNING), instead of 3 s of retries per job.
            ("MAM_PUBLISH_BUDGET_S".into(), "1".into()),
        ];
        let mut tmux = None;
        let mut real = None;
        match kind {
            Kind::Fake => {
                env.push(("MAM_PANE_BACKEND".into(), "fake".into()));
                env.push(("MAM_FAKE_PANES_DIR".into(), td.path("panes").into()));
            }
            Kind::Tmux => {
                let s = format!("mam-test-{}", rand_hex(6));
                env.push(("MAM_PANE_BACKEND".into(), "tmux".into()));
                env.push(("MAM_TMUX_SOCKET".into(), s.clone().into()));
                tmux = Some(s);
            }
            Kind::Herdr => {
                let script = format!("#!/usr/bin/env bash\nexec '{}' test-double herdr \"$@\"\n", mam_bin().display());
                fs::write(bin.join("herdr"), script).unwrap();
                use std::os::unix::fs::PermissionsExt;
                fs::set_permissions(bin.join("herdr"), fs::Permissions::from_mode(0o755)).unwrap();
                env.push(("MAM_PANE_BACKEND".into(), "herdr".into()));
                env.push(("MAM_MOCK_STATE".into(), td.path("mock-state.json").into()));
                env.push(("MAM_MOCK_LOG".into(), td.path("mock-log.jsonl").into()));
                env.push(("MAM_SERVER_BOOT_WAIT_S".into(), "5".into()));
                env.push(("MAM_MOCK_STALL_MS".into(), "300".into()));
                env.push(("MAM_MOCK_WAIT_CAP_MS".into(), "1000".into()));
                td.write("mock-state.json", json!({"running": true}).to_string());
            }
            Kind::RealHerdr => {
                let home = HerdrHome::new(&td)?;
                home.link("claude", &mam_bin());
                env.retain(|(k, _)| k != "PATH" && k != "MAM_STARTUP_DIALOG_SETTLE_MS");
                env.extend(home.env());
                env.push(("MAM_PANE_BACKEND".into(), "herdr".into()));
                // herdr sees a dialog about 0.5 s after `agent start` returns (ORCH 1.5 step 7).
                env.push(("MAM_STARTUP_DIALOG_SETTLE_MS".into(), "1000".into()));
                real = Some(home);
            }
        }
        td.write("agent.script", "");
        let s = S { real, td, kind, env, tmux };
        if kind == Kind::RealHerdr {
            // The server is mam's (its bootstrap, 1.3), started with the harness environment only.
            s.mam(["pane", "server-start"]).run().expect_rc(0);
        }
        Some(s)
    }

    /// The real herdr world (a panic on another kind).
    fn real(&self) -> &HerdrHome {
        self.real.as_ref().expect("a real herdr world")
    }

    /// The real-herdr variant of a test, or `None` (skip) when herdr is absent and not required.
    fn real_herdr(name: &str) -> Option<S> {
        S::on(Kind::RealHerdr, name)
    }

    /// `backend/server` as `status` prints it.
    fn backend_server(&self) -> String {
        match self.kind {
            Kind::Fake => "fake/fake".into(),
            Kind::Tmux => format!("tmux/{}", self.tmux.as_deref().unwrap()),
            Kind::Herdr => "herdr/multi-agent-mux".into(),
            Kind::RealHerdr => format!("herdr/{}", self.real().session),
        }
    }

    /// The backend's panes (fake pane directories, or the real herdr's `pane list`).
    fn panes(&self) -> Vec<String> {
        match self.kind {
            Kind::Fake => self.fake_panes(),
            Kind::RealHerdr => self.real().pane_ids(),
            Kind::Tmux => self.tmux_panes(),
            Kind::Herdr => panic!("the mock's panes are in its state"),
        }
    }

    /// The binding variables the agent in `pane` sees (fake: the pane's env file; real herdr: the
    /// agent process's environment), as a JSON object.
    fn pane_env(&self, pane: &str) -> Value {
        match self.kind {
            Kind::RealHerdr => {
                let (pid, _) = self.real().agent_process(pane);
                let env = environ(pid);
                let mut m = serde_json::Map::new();
                for (k, v) in env.into_iter().filter(|(k, _)| BINDING.contains(&k.as_str())) {
                    m.insert(k, Value::String(v));
                }
                Value::Object(m)
            }
            _ => self.fake_env(pane),
        }
    }

    /// The live agent processes of the backend.
    fn live_agents(&self) -> usize {
        match self.kind {
            Kind::RealHerdr => self.real().processes().iter().filter(|(_, a)| a.starts_with("claude ")).count(),
            _ => self.live_fake_agents().len(),
        }
    }

    fn fake(name: &str) -> S {
        S::new(Kind::Fake, name)
    }

    fn herdr(name: &str, state: Value) -> S {
        let s = S::new(Kind::Herdr, name);
        s.td.write("mock-state.json", state.to_string());
        s
    }

    fn tmux(name: &str) -> Option<S> {
        have_tool("tmux", "MAM_REQUIRE_TMUX").then(|| S::new(Kind::Tmux, name))
    }

    fn mam<I: IntoIterator<Item = T>, T: AsRef<OsStr>>(&self, args: I) -> Cmd {
        let mut c = self.td.mam().args(args);
        for (k, v) in &self.env {
            c = c.env(k, v);
        }
        c
    }

    /// `mam create claude --no-onboard ... -- test-double agent`.
    fn create(&self, extra: &[&str]) -> Cmd {
        let mut a = vec!["create", "claude", "--no-onboard"];
        a.extend_from_slice(extra);
        a.extend_from_slice(&["--", "test-double", "agent"]);
        self.mam(a)
    }

    fn file(&self) -> PathBuf {
        self.td.ws().join(".mam/agent_sessions.json")
    }

    fn doc(&self) -> Value {
        serde_json::from_slice(&fs::read(self.file()).unwrap()).unwrap()
    }

    fn row(&self, name: &str) -> Value {
        self.doc()["herdr_sessions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no row {name}"))
    }

    fn edit_row(&self, name: &str, f: impl FnOnce(&mut Value)) {
        let mut doc = self.doc();
        let row = doc["herdr_sessions"].as_array_mut().unwrap().iter_mut().find(|r| r["name"] == name).unwrap();
        f(row);
        fs::write(self.file(), serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
    }

    /// Fake panes that exist (directories under panes/panes).
    fn fake_panes(&self) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(self.td.path("panes/panes"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    fn fake_env(&self, pane: &str) -> Value {
        serde_json::from_slice(&fs::read(self.td.path("panes/panes").join(pane).join("env.json")).unwrap()).unwrap()
    }

    /// The live processes of fake agents.
    fn live_fake_agents(&self) -> Vec<i32> {
        let mut out = Vec::new();
        for e in fs::read_dir(self.td.path("panes/panes")).into_iter().flatten().flatten() {
            if let Ok(pid) = fs::read_to_string(e.path().join("pid")).unwrap_or_default().trim().parse::<i32>() {
                if mam::sys::process_exists(pid) && !mam::sys::proc_start_ticks(pid).is_ok_and(|t| t.1) {
                    out.push(pid);
                }
            }
        }
        out
    }

    fn tmux_panes(&self) -> Vec<String> {
        let sock = self.tmux.as_deref().unwrap();
        let out = Command::new("tmux").args(["-L", sock, "list-panes", "-a", "-F", "#{pane_id}"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
    }

    /// Mock herdr argv of every call.
    fn argvs(&self) -> Vec<Vec<String>> {
        fs::read_to_string(self.td.path("mock-log.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                v["argv"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect()
            })
            .collect()
    }

    fn calls_of(&self, verb: &[&str]) -> Vec<Vec<String>> {
        self.argvs().into_iter().filter(|a| a.len() >= verb.len() && a[..verb.len()] == *verb).collect()
    }

    fn mutations(&self) -> Vec<Vec<String>> {
        let muts: &[&[&str]] = &[
            &["workspace", "create"],
            &["pane", "split"],
            &["agent", "start"],
            &["workspace", "rename"],
            &["pane", "close"],
            &["workspace", "close"],
        ];
        self.argvs()
            .into_iter()
            .filter(|a| {
                muts.iter().any(|m| a.len() >= 2 && a[..2] == **m) || a.last().map(String::as_str) == Some("server")
            })
            .collect()
    }

    fn mock_state(&self) -> Value {
        serde_json::from_slice(&fs::read(self.td.path("mock-state.json")).unwrap()).unwrap()
    }

    /// A job registered in `reg` for `session`.
    fn job(&self, reg: &Path, id: &str, session: &str, typ: &str) {
        self.mam(["registry", "register", "--job-id", id, "--session", session, "--type", typ, "--registry-dir"])
            .args([reg])
            .run()
            .expect_rc(0);
    }

    fn job_status(&self, reg: &Path, id: &str) -> Value {
        serde_json::from_slice(&fs::read(reg.join(format!("{id}.json"))).unwrap()).unwrap()
    }
}

/// `--env` values of one argv.
fn env_flags(argv: &[String]) -> Vec<String> {
    argv.windows(2).filter(|w| w[0] == "--env").map(|w| w[1].clone()).collect()
}

/// A linked git worktree: a directory with a `.git` file (its own git top level).
fn worktree(td: &TestDir, name: &str) -> PathBuf {
    let w = td.path(name);
    fs::create_dir_all(&w).unwrap();
    fs::write(w.join(".git"), "gitdir: /nowhere/.git/worktrees/x\n").unwrap();
    w
}

fn s(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

/// The binding of the test's control root, as the row records it.
fn root_binding(td: &TestDir) -> Value {
    let ws = s(&td.ws());
    json!({
        "workspace_root": ws,
        "agent_sessions_yaml": format!("{ws}/.mam/agent_sessions.json"),
        "mam_jobs_dir": format!("{ws}/.mam/jobs"),
        "delegate_job_logs_dir": format!("{ws}/.mam/delegate_job_logs"),
    })
}

// ---------------------------------------------------------------------------------------------
// ORCH 2.8 acceptance tests

#[test]
fn o2_8_1_create_from_control_root_records_binding_without_forwarding() {
    for kind in [Kind::Fake, Kind::Herdr, Kind::RealHerdr] {
        let Some(h) = S::on(kind, "o2_8_1") else { continue };
        let r = h.create(&[]).run();
        r.expect_rc(0);
        let out = r.stdout();
        assert!(out.starts_with("SESSION=claude-01 PANE="), "{out}");
        assert!(out.lines().next().unwrap().ends_with(&format!(" CWD={}", h.td.ws().display())), "{out}");
        let row = h.row("claude-01");
        assert_eq!(row["control_plane"], root_binding(&h.td));
        assert_eq!(row["status"], "running");
        assert_eq!(row["agent"], "claude");
        assert_eq!(row["pane"]["cwd"], s(&h.td.ws()));
        assert_eq!(row["pane"]["id"], kv(&out, "PANE"));
        assert_eq!(row["pane"]["cmd_full"], "claude test-double agent");
        assert_eq!(row["start_command"], "claude test-double agent");
        if h.kind == Kind::Herdr {
            let creates = h.calls_of(&["workspace", "create"]);
            assert_eq!(creates.len(), 1, "{:?}", h.argvs());
            assert!(env_flags(&creates[0]).is_empty(), "no --env: {:?}", creates[0]);
            let start = &h.calls_of(&["agent", "start"])[0];
            let after: Vec<&String> = start.iter().skip_while(|a| *a != "--").skip(1).collect();
            // The user's arguments, then the adapter's start arguments (the chosen conversation id).
            let conv = row["conversation_id"].as_str().unwrap();
            assert_eq!(after, ["test-double", "agent", "--session-id", conv], "bare agent args: {start:?}");
        } else {
            let panes = h.panes();
            assert_eq!(panes.len(), 1);
            assert_eq!(h.pane_env(&panes[0]), json!({}), "nothing forwarded");
            if h.kind == Kind::RealHerdr {
                // The agent's own argv is the bare command: nothing after `--` of `agent start`
                // but the agent's arguments.
                let conv = row["conversation_id"].as_str().unwrap();
                assert_eq!(
                    h.real().agent_process(&panes[0]).1,
                    ["claude", "test-double", "agent", "--session-id", conv]
                );
            }
            // Default names take the lowest free suffix.
            h.create(&[]).run().expect_rc(0);
            h.row("claude-02");
            h.mam(["stop", "claude-01", "claude-02"]).run().expect_rc(0);
            assert_eq!(h.live_agents(), 0);
        }
    }
}

#[test]
fn o2_8_2_worktree_create_forwards_all_four_on_pane_creation() {
    let h = S::herdr("o2_8_2", json!({"running": true}));
    let wt = worktree(&h.td, "wt");
    let want: Vec<String> = {
        let b = root_binding(&h.td);
        vec![
            format!("WORKSPACE_ROOT={}", b["workspace_root"].as_str().unwrap()),
            format!("AGENT_SESSIONS_YAML={}", b["agent_sessions_yaml"].as_str().unwrap()),
            format!("MAM_JOBS_DIR={}", b["mam_jobs_dir"].as_str().unwrap()),
            format!("DELEGATE_JOB_LOGS_DIR={}", b["delegate_job_logs_dir"].as_str().unwrap()),
        ]
    };
    // Fresh pane: the workspace creation carries the binding.
    h.create(&["--name", "wa", "--workspace", &s(&wt)]).run().expect_rc(0);
    let creates = h.calls_of(&["workspace", "create"]);
    assert_eq!(creates.len(), 1);
    assert_eq!(env_flags(&creates[0]), want);
    // Packing path: the split carries it too; agent start never does.
    h.create(&["--name", "wb", "--workspace", &s(&wt)]).run().expect_rc(0);
    let splits = h.calls_of(&["pane", "split"]);
    assert_eq!(splits.len(), 1, "{:?}", h.argvs());
    assert_eq!(env_flags(&splits[0]), want);
    for start in h.calls_of(&["agent", "start"]) {
        assert!(!start.iter().any(|a| a.contains('=')), "no K=V on agent start: {start:?}");
    }
    for n in ["wa", "wb"] {
        let row = h.row(n);
        assert_eq!(row["control_plane"], root_binding(&h.td));
        assert_eq!(row["pane"]["cwd"], s(&wt));
    }
    // The rows live in the control root's sessions file, not the worktree's.
    assert!(!wt.join(".mam").exists());
    // Stop closes both panes on the mock; nothing is left listed.
    h.mam(["stop", "wa", "wb"]).run().expect_rc(0);
    assert_eq!(h.calls_of(&["pane", "close"]).len(), 2);
    assert_eq!(h.mock_state()["agents"], json!([]));
    // Same over the fake backend and the real herdr: the agent's environment holds the four, in a
    // fresh pane (workspace create) and in a split one (packing), and its argv no K=V.
    for kind in [Kind::Fake, Kind::RealHerdr] {
        let Some(f) = S::on(kind, "o2_8_2f") else { continue };
        let wt = worktree(&f.td, "wt");
        let b = root_binding(&f.td);
        let want = json!({
            "WORKSPACE_ROOT": b["workspace_root"], "AGENT_SESSIONS_YAML": b["agent_sessions_yaml"],
            "MAM_JOBS_DIR": b["mam_jobs_dir"], "DELEGATE_JOB_LOGS_DIR": b["delegate_job_logs_dir"],
        });
        for n in ["wa", "wb"] {
            let r = f.create(&["--name", n, "--workspace", &s(&wt)]).run();
            r.expect_rc(0);
            let pane = kv(&r.stdout(), "PANE");
            assert_eq!(f.pane_env(&pane), want, "{kind:?} {n}");
            if kind == Kind::RealHerdr {
                assert!(!f.real().agent_process(&pane).1.iter().any(|a| a.contains('=')), "no K=V in argv");
            }
        }
        assert_eq!(f.panes().len(), 2);
        f.mam(["stop", "wa", "wb"]).run().expect_rc(0);
        assert!(f.panes().is_empty(), "{kind:?}: both panes closed");
    }
}

#[test]
fn o2_8_3_whitespace_in_a_forwarded_binding_is_refused_not_otherwise() {
    let h = S::herdr("o2_8_3", json!({"running": true}));
    let spaced = h.td.path("with space/jobs");
    let r = h.create(&["--name", "sp"]).env("MAM_JOBS_DIR", &spaced).run();
    r.expect_rc(2);
    assert!(r.stderr().starts_with("REFUSED: create: the binding must be forwarded"), "{}", r.stderr());
    assert!(r.stderr().contains("MAM_JOBS_DIR=") && r.stderr().trim_end().ends_with("nothing changed"));
    assert!(h.mutations().is_empty(), "no herdr mutation: {:?}", h.mutations());
    assert!(!h.file().exists(), "no row");
    // A control root with a space used as its own workspace: nothing to forward, so fine.
    let root = h.td.path("my ws");
    fs::create_dir_all(root.join(".mam")).unwrap();
    let r = h.create(&["--name", "ok", "--label", "lab"]).cwd(&root).run();
    r.expect_rc(0);
    let creates = h.calls_of(&["workspace", "create"]);
    assert_eq!(creates.len(), 1);
    assert!(env_flags(&creates[0]).is_empty());
    assert!(creates[0].windows(2).any(|w| w == ["--label", "lab"]), "{:?}", creates[0]);
    let doc: Value = serde_json::from_slice(&fs::read(root.join(".mam/agent_sessions.json")).unwrap()).unwrap();
    assert_eq!(doc["herdr_sessions"][0]["control_plane"]["workspace_root"], s(&root));
    // The real herdr: no workspace or pane appears for the refusal; the control root with a space
    // gets a workspace with the label and an agent without forwarded variables.
    let Some(h) = S::real_herdr("o2_8_3r") else { return };
    let r = h.create(&["--name", "sp"]).env("MAM_JOBS_DIR", h.td.path("with space/jobs")).run();
    r.expect_rc(2);
    assert!(r.stderr().starts_with("REFUSED: create: the binding must be forwarded"), "{}", r.stderr());
    assert!(h.real().workspaces().is_empty(), "no herdr mutation: {:?}", h.real().workspaces());
    assert!(!h.file().exists(), "no row");
    let root = h.td.path("my ws");
    fs::create_dir_all(root.join(".mam")).unwrap();
    let r = h.create(&["--name", "ok", "--label", "lab"]).cwd(&root).run();
    r.expect_rc(0);
    let ws = h.real().workspaces();
    assert_eq!(ws.iter().map(|w| w.1.as_str()).collect::<Vec<_>>(), ["lab"], "{ws:?}");
    assert_eq!(h.pane_env(&kv(&r.stdout(), "PANE")), json!({}));
    let doc: Value = serde_json::from_slice(&fs::read(root.join(".mam/agent_sessions.json")).unwrap()).unwrap();
    assert_eq!(doc["herdr_sessions"][0]["control_plane"]["workspace_root"], s(&root));
}

#[test]
fn o2_8_4_binding_failure_refuses_a_worktree_and_warns_at_the_root() {
    for kind in [Kind::Fake, Kind::RealHerdr] {
        let Some(h) = S::on(kind, "o2_8_4") else { continue };
        o2_8_4_body(&h);
    }
}

fn o2_8_4_body(h: &S) {
    // A registry path that cannot be recorded (not UTF-8) makes the binding fail.
    let mut bad = h.td.root.as_os_str().as_bytes().to_vec();
    bad.extend_from_slice(b"/jobs-\xff");
    let bad = OsStr::from_bytes(&bad).to_os_string();
    let wt = worktree(&h.td, "wt");
    let r = h.create(&["--workspace", &s(&wt)]).env("MAM_JOBS_DIR", &bad).run();
    r.expect_rc(2);
    assert!(r.stderr().starts_with("REFUSED: create: cannot compute the control-plane binding"), "{}", r.stderr());
    assert!(!h.file().exists());
    assert!(h.panes().is_empty(), "nothing spawned");
    // At the control root: a warning, and a row without control_plane.
    let r = h.create(&[]).env("MAM_JOBS_DIR", &bad).run();
    r.expect_rc(0);
    assert!(r.stderr().contains("WARNING: control-plane binding not computed"), "{}", r.stderr());
    let row = h.row("claude-01");
    assert!(row.get("control_plane").is_none(), "{row}");
    assert_eq!(h.pane_env(&h.panes()[0]), json!({}));
}

#[test]
fn o2_8_5_resume_checks_the_directory_first() {
    for kind in [Kind::Fake, Kind::RealHerdr] {
        let Some(h) = S::on(kind, "o2_8_5") else { continue };
        o2_8_5_body(&h);
    }
}

fn o2_8_5_body(h: &S) {
    let (p1, p2, other) = (h.td.path("p1"), h.td.path("p2"), h.td.path("other"));
    for d in [&p1, &p2, &other] {
        fs::create_dir_all(d).unwrap();
    }
    h.create(&["--name", "s1", "--workspace", &s(&p1)]).run().expect_rc(0);
    h.create(&["--name", "s2", "--workspace", &s(&p2)]).run().expect_rc(0);
    h.mam(["stop", "s1", "s2"]).run().expect_rc(0);
    let before = fs::read(h.file()).unwrap();
    let r = h.mam(["resume", "s1", "--workspace", &s(&other)]).run();
    r.expect_rc(2);
    assert!(r.stderr().contains(&format!("lives in {}, not --workspace", p1.display())), "{}", r.stderr());
    fs::remove_dir_all(&p2).unwrap();
    let r = h.mam(["resume", "s2", "--workspace", &s(&other)]).run();
    r.expect_rc(2);
    assert!(r.stderr().contains("no longer exists"), "the cwd is checked first: {}", r.stderr());
    assert_eq!(fs::read(h.file()).unwrap(), before, "nothing changed");
    // The same directory given explicitly is fine.
    let r = h.mam(["resume", "s1", "--workspace", &s(&p1)]).run();
    r.expect_rc(0);
    assert_eq!(h.row("s1")["status"], "running");
    assert!(h.row("s1")["resumed_at"].is_string());
    // A row without pane.cwd: no check; it starts where --workspace says.
    let mut doc = h.doc();
    doc["herdr_sessions"].as_array_mut().unwrap().push(
        json!({"name": "legacy1", "agent": "claude", "status": "stopped", "agent_args": ["test-double", "agent"]}),
    );
    fs::write(h.file(), doc.to_string()).unwrap();
    let r = h.mam(["resume", "legacy1", "--workspace", &s(&other)]).run();
    r.expect_rc(0);
    assert_eq!(h.row("legacy1")["pane"]["cwd"], s(&other));
    assert_eq!(h.row("legacy1")["backend"], h.backend_server().split('/').next().unwrap());
}

#[test]
fn o2_8_6_resume_binding_rules() {
    for kind in [Kind::Fake, Kind::RealHerdr] {
        let Some(h) = S::on(kind, "o2_8_6") else { continue };
        o2_8_6_body(&h);
    }
}

fn o2_8_6_body(h: &S) {
    h.create(&["--name", "s1"]).run().expect_rc(0);
    // An alive legacy row records the caller's binding without spawning.
    h.edit_row("s1", |r| {
        r.as_object_mut().unwrap().remove("control_plane");
    });
    let panes = h.panes();
    let r = h.mam(["resume", "s1"]).run();
    r.expect_rc(0);
    assert_eq!(r.stdout().trim(), "SESSION=s1 already running");
    assert_eq!(h.row("s1")["control_plane"], root_binding(&h.td));
    assert_eq!(h.panes(), panes, "no spawn");
    // Missing fields only, never overwriting.
    h.edit_row("s1", |r| r["control_plane"] = json!({"mam_jobs_dir": "/row/jobs"}));
    h.mam(["resume", "s1"]).run().expect_rc(0);
    let cp = h.row("s1")["control_plane"].clone();
    assert_eq!(cp["mam_jobs_dir"], "/row/jobs");
    assert_eq!(cp["workspace_root"], root_binding(&h.td)["workspace_root"]);
    // A row bound elsewhere: the row's binding wins, the difference is reported and forwarded again.
    let rowjobs = h.td.path("rowjobs");
    h.create(&["--name", "s2"]).env("MAM_JOBS_DIR", &rowjobs).run().expect_rc(0);
    h.mam(["stop", "s2"]).run().expect_rc(0);
    let r = h.mam(["resume", "s2"]).run();
    r.expect_rc(0);
    let note = format!("MAM_JOBS_DIR: the row's {} wins over the caller's", rowjobs.display());
    assert!(r.stderr().contains(&note), "{}", r.stderr());
    let pane = kv(&r.stdout(), "PANE");
    let env = h.pane_env(&pane);
    assert_eq!(env["MAM_JOBS_DIR"], s(&rowjobs));
    assert_eq!(env.as_object().unwrap().len(), 4);
    assert_eq!(h.row("s2")["control_plane"]["mam_jobs_dir"], s(&rowjobs));
}

#[test]
fn o2_8_7_stop_cancels_open_task_jobs_in_the_rows_registry() {
    for kind in [Kind::Fake, Kind::RealHerdr] {
        let Some(h) = S::on(kind, "o2_8_7") else { continue };
        o2_8_7_body(&h);
    }
}

fn o2_8_7_body(h: &S) {
    let rowlogs = h.td.path("rowlogs");
    let reg = h.td.ws().join("rel/jobs");
    h.create(&["--name", "s1"])
        .env("MAM_JOBS_DIR", "rel/jobs")
        .env("DELEGATE_JOB_LOGS_DIR", &rowlogs)
        .run()
        .expect_rc(0);
    assert_eq!(h.row("s1")["control_plane"]["mam_jobs_dir"], s(&reg), "relative resolves against the root");
    h.job(&reg, "t1", "s1", "task");
    h.job(&reg, "t2", "s1", "task");
    h.mam(["registry", "status", "t2", "--set", "running", "--registry-dir"]).args([&reg]).run().expect_rc(0);
    h.job(&reg, "l1", "s1", "loop");
    h.job(&reg, "o1", "other", "task");
    h.job(&reg, "c1", "s1", "task");
    h.mam(["registry", "finalize", "c1", "--status", "completed", "--registry-dir"]).args([&reg]).run().expect_rc(0);
    // The caller has no binding variables: the row's registry and log root are used.
    let r = h.mam(["stop", "s1"]).run();
    r.expect_rc(0);
    assert_eq!(r.stdout().trim(), "SESSION=s1 STATUS=stopped CANCELLED=t1,t2");
    for (id, want) in
        [("t1", "cancelled"), ("t2", "cancelled"), ("l1", "pending"), ("o1", "pending"), ("c1", "completed")]
    {
        assert_eq!(h.job_status(&reg, id)["status"], want, "{id}");
    }
    assert_eq!(h.job_status(&reg, "t1")["reason"], "session stopped");
    let audit = fs::read_to_string(rowlogs.join("t1/audit.jsonl")).unwrap();
    assert!(audit.contains("\"to\":\"cancelled\"") && audit.contains("session stopped"), "{audit}");
    assert!(!h.td.ws().join(".mam/delegate_job_logs/t1").exists());
    let row = h.row("s1");
    assert_eq!(row["status"], "stopped");
    assert!(row["stopped_at"].is_string());
    assert_eq!(row["pane"]["cwd"], s(&h.td.ws()), "kept for resume");
    assert_eq!(h.live_agents(), 0);
    assert!(h.panes().is_empty(), "pane closed");
    // A stopped row: no-op.
    let r = h.mam(["stop", "s1"]).run();
    r.expect_rc(0);
    assert_eq!(r.stdout().trim(), "SESSION=s1 STATUS=already-stopped CANCELLED=-");
    // The caller's DELEGATE_JOB_LOGS_DIR wins for the audit.
    h.create(&["--name", "s2"])
        .env("MAM_JOBS_DIR", "rel/jobs")
        .env("DELEGATE_JOB_LOGS_DIR", &rowlogs)
        .run()
        .expect_rc(0);
    h.job(&reg, "t3", "s2", "task");
    let callerlogs = h.td.path("callerlogs");
    h.mam(["stop", "s2"]).env("DELEGATE_JOB_LOGS_DIR", &callerlogs).run().expect_rc(0);
    assert!(callerlogs.join("t3/audit.jsonl").is_file());
    assert!(!rowlogs.join("t3").exists());
    // A relative MAM_JOBS_DIR of the caller resolves against the control root, not the cwd.
    h.create(&["--name", "s3"]).run().expect_rc(0);
    h.job(&reg, "t4", "s3", "task");
    let sub = h.td.ws().join("sub");
    fs::create_dir_all(&sub).unwrap();
    let r = h.mam(["stop", "s3"]).env("MAM_JOBS_DIR", "rel/jobs").cwd(&sub).run();
    r.expect_rc(0);
    assert_eq!(kv(&r.stdout(), "CANCELLED"), "t4");
    assert!(!sub.join("rel").exists());
}

#[test]
fn stop_closes_a_running_job_on_the_wire_and_stops_its_timer() {
    let h = S::fake("stopclose");
    let cfg = mam::broker::BrokerConfig { bind: "127.0.0.1:0".parse().unwrap(), ..Default::default() };
    let b = mam::broker::start(cfg).unwrap();
    let port = b.addr().port().to_string();
    h.create(&["--name", "s1"]).run().expect_rc(0);
    let id = format!("t{}", rand_hex(4));
    let _g = TimerGuard(id.clone());
    h.mam(["registry", "register", "--job-id", &id, "--session", "s1", "--type", "task", "--heartbeat-sec", "1"])
        .env("MQTT_PORT", &port)
        .run()
        .expect_rc(0);
    h.mam(["publish", "--job-id", &id, "--event", "started", "--heartbeat", "1", "--watch-pid", "0"])
        .env("MQTT_PORT", &port)
        .run()
        .expect_rc(0);
    wait_until("the job's timer", Duration::from_secs(10), || timer_pids(&id).len() == 1);
    let r = h.mam(["stop", "s1"]).env("MQTT_PORT", &port).run();
    r.expect_rc(0);
    assert_eq!(kv(&r.stdout(), "CANCELLED"), id);
    assert!(!r.stderr().contains("WARNING"), "{}", r.stderr());
    // CORE 7.4: the timer is gone when stop returns, pidfile included.
    assert!(timer_pids(&id).is_empty(), "the timer outlived the cancel");
    let reg = h.td.ws().join(".mam/jobs");
    assert!(!reg.join(format!("{id}.heartbeat.pid")).exists());
    // A4: the retained state is the signed closed state with the seq the cancel allocated.
    let rec = h.job_status(&reg, &id);
    assert_eq!(rec["status"], "cancelled");
    let state = b.retained(&format!("mam/jobs/{id}/state")).expect("a retained state");
    let v: Value = serde_json::from_slice(&state).unwrap();
    assert_eq!((v["status"].as_str(), v["last_event"].as_str()), (Some("cancelled"), Some("closed")), "{v}");
    assert_eq!(v["seq"], rec["last_seq"]);
    assert!(mam::sign::verify(rec["auth_token"].as_str().unwrap().as_bytes(), &v));
    b.shutdown();
}

#[test]
fn o2_8_8_status_finds_a_job_only_in_the_rows_registry() {
    for kind in [Kind::Fake, Kind::RealHerdr] {
        let Some(h) = S::on(kind, "o2_8_8") else { continue };
        o2_8_8_body(&h);
    }
}

fn o2_8_8_body(h: &S) {
    let reg = h.td.path("rowjobs");
    h.create(&["--name", "s1"]).env("MAM_JOBS_DIR", &reg).run().expect_rc(0);
    h.job(&reg, "j1", "s1", "task");
    h.job(&reg, "j2", "s1", "task");
    h.mam(["registry", "finalize", "j2", "--status", "completed", "--registry-dir"]).args([&reg]).run().expect_rc(0);
    let r = h.mam(["status"]).run();
    r.expect_rc(0);
    let lines: Vec<String> = r.stdout().lines().map(str::to_string).collect();
    let pane = h.row("s1")["pane"]["id"].as_str().unwrap().to_string();
    let backend = h.backend_server();
    let conv = h.row("s1")["conversation_id"].as_str().unwrap().to_string();
    // Issue 18: a header row names the columns; the agent's state as the backend knows it: the fake
    // agent and herdr both say idle at its prompt.
    assert_eq!(lines[0], "NAME\tAGENT\tSERVER\tPANE\tCWD\tLIVENESS\tSTATE\tCONVERSATION\tSTATUS");
    assert_eq!(
        lines[1],
        format!("s1\tclaude\t{backend}\t{pane}\t{}\trunning\tidle\t{conv}\trunning", h.td.ws().display())
    );
    // Issue 32 item 6 (A65): open jobs and the latest finished ones, oldest first.
    assert_eq!(lines[2..], ["  job j1 task pending", "  job j2 task completed"]);
    let r = h.mam(["status", "s1", "--json"]).run();
    r.expect_rc(0);
    let v: Value = serde_json::from_str(&r.stdout()).unwrap();
    assert_eq!(v[0]["jobs"][0]["job_id"], "j1");
    assert_eq!(v[0]["jobs"][0]["registry"], s(&reg));
    assert_eq!(v[0]["liveness"], "running");
    // After a stop the liveness is `gone` and nothing is open.
    h.mam(["stop", "s1"]).run().expect_rc(0);
    let r = h.mam(["status", "s1"]).run();
    r.expect_rc(0);
    assert_eq!(r.stdout().lines().count(), 4, "{}", r.stdout());
    assert!(r.stdout().contains("  job j1 task cancelled"), "{}", r.stdout());
    assert!(r.stdout().contains("\tgone\tgone\t"), "{}", r.stdout());
}

#[test]
fn o2_8_9_daemon_step_under_the_opt_out() {
    for kind in [Kind::Fake, Kind::RealHerdr] {
        let Some(h) = S::on(kind, "o2_8_9") else { continue };
        o2_8_9_body(&h);
    }
}

fn o2_8_9_body(h: &S) {
    let wt = worktree(&h.td, "wt");
    for extra in [vec![], vec!["--workspace", wt.to_str().unwrap()]] {
        let r = h.create(&extra).run();
        r.expect_rc(0);
        assert!(!r.stdout().contains("DAEMON_PID="), "{}", r.stdout());
        assert_eq!(r.stdout().lines().count(), 1, "{}", r.stdout());
        // Issue 18: the last line says how to look at the pane.
        let mut lines: Vec<String> = r.stderr().lines().map(str::to_string).collect();
        assert!(
            lines.pop().is_some_and(|l| l.starts_with("NOTE: look at the agent's pane with `mam attach ")),
            "{lines:?}"
        );
        // Issue 32: no broker runs here, which create says in one WARNING.
        lines.retain(|l| !l.starts_with("WARNING: no broker answers at "));
        assert_eq!(lines.len(), 1, "exactly one stderr line before it: {lines:?}");
        assert!(lines[0].contains("daemon"), "{lines:?}");
        // The control root's daemon, never the worktree's.
        assert!(!lines[0].contains(wt.to_str().unwrap()), "{lines:?}");
    }
}

#[test]
fn create_onboards_by_default_through_delegate_job() {
    // 2.3 step 8: --onboard (the default) delegates the onboarding job and returns once the agent's
    // own `started` is in (delegate-job's own tests cover the job; see tests/it/delegate.rs).
    let h = S::fake("onboard_hook");
    let r = h.mam(["create", "claude", "--", "test-double", "agent"]).env("MAM_ACK_TIMEOUT_S", "10").run();
    r.expect_rc(0);
    let job = r.stdout().lines().find_map(|l| l.strip_prefix("ONBOARD_JOB=")).map(str::to_string);
    let job = job.unwrap_or_else(|| panic!("no ONBOARD_JOB= line: {}\n{}", r.stdout(), r.stderr()));
    assert_eq!(h.row("claude-01")["onboard_job"], job.as_str());
    let rec: Value =
        serde_json::from_slice(&fs::read(h.td.ws().join(".mam/jobs").join(format!("{job}.json"))).unwrap()).unwrap();
    assert_eq!((rec["agent_session"].as_str(), rec["type"].as_str()), (Some("claude-01"), Some("task")));
    assert!(rec["status"] == "running" || rec["status"] == "completed", "{rec}");
    let brief = fs::read_to_string(h.td.ws().join(".mam/jobs").join(&job).join("brief.md")).unwrap();
    assert!(brief.contains("Onboarding of session claude-01"), "{brief}");
    let r = h.mam(["create", "claude", "--onboard", "--no-onboard", "--", "test-double", "agent"]).run();
    r.expect_rc(0);
    assert!(!r.stdout().contains("ONBOARD_JOB="), "the last flag wins: {}", r.stdout());
    h.mam(["stop", "claude-01", "claude-02"]).run().expect_rc(0);
    for pid in timer_pids(&job) {
        let _ = mam::sys::kill(pid, 9);
    }
}

#[test]
fn o2_8_10_start_failure_runs_the_verified_rollback() {
    let real = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".mam");
    let real_before = tree(&real);
    // Fake backend and real herdr: an agent stuck in a start-up dialog, then a row that cannot be
    // written.
    for kind in [Kind::Fake, Kind::RealHerdr] {
        let Some(h) = S::on(kind, "o2_8_10") else { continue };
        o2_8_10_body(&h);
    }
    // Mock herdr: the workspace this attempt created is closed again.
    let m = S::herdr("o2_8_10h", json!({"running": true, "inject": {"start_status": "blocked"}}));
    let r = m.create(&["--name", "s1"]).env("MAM_STARTUP_DIALOG_MAX", "2").run();
    r.expect_rc(1);
    assert!(r.stderr().contains("rolled back (confirmed: nothing left)"), "{}", r.stderr());
    assert_eq!(m.calls_of(&["workspace", "close"]).len(), 1);
    assert_eq!(m.mock_state()["workspaces"], json!([]));
    assert_eq!(m.mock_state()["agents"], json!([]));
    assert!(!m.file().exists());
    // The sandboxed runs left the real checkout's .mam alone.
    assert_eq!(tree(&real), real_before);
}

fn o2_8_10_body(h: &S) {
    h.td.write("agent.script", "startup_blocked=99\n");
    let r = h.create(&["--name", "s1"]).env("MAM_STARTUP_DIALOG_MAX", "1").run();
    r.expect_rc(1);
    assert!(r.stderr().starts_with("ERROR: create: agent s1 still blocked"), "{}", r.stderr());
    assert!(r.stderr().contains("rolled back (confirmed: nothing left)"), "{}", r.stderr());
    assert!(h.panes().is_empty());
    wait_until("the fake agent exits", Duration::from_secs(10), || h.live_agents() == 0);
    assert!(!h.file().exists(), "no row");
    // The row cannot be written (its lock is a directory): the placed agent is rolled back.
    h.td.write("agent.script", "");
    fs::create_dir_all(h.td.ws().join(".mam/agent_sessions.json.lock")).unwrap();
    let r = h.create(&["--name", "s2"]).run();
    r.expect_rc(1);
    assert!(r.stderr().starts_with("ERROR: create: cannot record session s2: cannot lock"), "{}", r.stderr());
    assert!(r.stderr().contains("rolled back (confirmed: nothing left)"), "{}", r.stderr());
    assert!(h.panes().is_empty());
    wait_until("the fake agent exits", Duration::from_secs(10), || h.live_agents() == 0);
    assert!(!h.file().exists(), "no row");
}

#[test]
fn o2_8_11_reconcile_noserver_and_unknown() {
    for kind in [Kind::Herdr, Kind::RealHerdr] {
        let Some(h) = S::on(kind, "o2_8_11") else { continue };
        o2_8_11_body(&h);
    }
}

impl S {
    /// The agent `name` leaves its server's list by hand (mock: its record is removed; real herdr:
    /// its pane is closed and the test waits until herdr no longer lists it).
    fn drop_agent(&self, name: &str) {
        if self.kind == Kind::RealHerdr {
            let pane = self.row(name)["pane"]["id"].as_str().unwrap().to_string();
            self.real().herdr(&["pane", "close", &pane]).expect_rc(0);
            wait_until(&format!("herdr no longer lists {name}"), Duration::from_secs(30), || {
                !self.real().herdr(&["agent", "list"]).stdout().contains(&format!("\"name\":\"{name}\""))
            });
        } else {
            let mut st = self.mock_state();
            st["inject"] = json!({});
            st["agents"].as_array_mut().unwrap().retain(|a| a["name"] != name);
            self.td.write("mock-state.json", st.to_string());
        }
    }

    /// The server goes down (mock: `running=false`; real herdr: `server stop`, until it no longer
    /// answers).
    fn stop_server(&self) {
        if self.kind == Kind::RealHerdr {
            self.real().herdr(&["server", "stop"]).expect_rc(0);
            wait_until("the herdr server is down", Duration::from_secs(20), || !self.real().answers());
        } else {
            let mut st = self.mock_state();
            st["running"] = json!(false);
            self.td.write("mock-state.json", st.to_string());
        }
    }

    /// Whether the server runs (and so whether anything bootstrapped one).
    fn server_running(&self) -> bool {
        if self.kind == Kind::RealHerdr {
            self.real().answers()
        } else {
            assert!(self.argvs().iter().all(|a| a.last().map(String::as_str) != Some("server")));
            self.mock_state()["running"] == true
        }
    }
}

fn o2_8_11_body(h: &S) {
    let server = h.backend_server();
    h.create(&["--name", "a1"]).run().expect_rc(0);
    h.create(&["--name", "a2"]).run().expect_rc(0);
    let ctx = || {
        let mut vars: Vec<(OsString, OsString)> = h.env.iter().map(|(k, v)| (k.into(), v.clone())).collect();
        if h.kind != Kind::RealHerdr {
            vars.push(("HOME".into(), h.td.path("home").into()));
        }
        vars.push(("MAM_ENV_FILE".into(), h.td.path("absent.env").into()));
        mam::ctx::Ctx::with_env(vars, &h.td.ws())
    };
    // Confirmed: both listed, nothing changes.
    let r = mam::session::reconcile::reconcile_once(&ctx()).unwrap();
    assert_eq!(r.rc(), 0);
    assert!(r.exited.is_empty());
    // Unknown: no status changes, herdr_confirmed=false, rc 3. The real herdr cannot be made to
    // answer garbage or an unrelated error document, so this part runs on the mock only.
    if h.kind == Kind::Herdr {
        o2_8_11_unknown(h, &ctx);
    }
    // Drift A: a2 vanished from a confirmed list.
    h.drop_agent("a2");
    let r = mam::session::reconcile::reconcile_once(&ctx()).unwrap();
    assert_eq!(r.exited, ["a2"]);
    assert_eq!(h.row("a2")["status"], "exited");
    assert_eq!(h.row("a1")["status"], "running");
    assert_eq!(h.row("a1")["herdr_confirmed"], true);
    // NoServer: every running row on that server becomes exited; no server is started.
    h.stop_server();
    let r = mam::session::reconcile::reconcile_once(&ctx()).unwrap();
    assert_eq!(r.exited, ["a1"]);
    assert_eq!(h.row("a1")["herdr_confirmed"], true);
    assert!(h.row("a1")["last_reconciled_at"].is_string());
    assert!(!h.server_running(), "MAM_NO_AUTOSTART: nothing bootstrapped");
    let lines = r.lines();
    assert!(lines[0].starts_with(&format!("server {server}: confirmed, 0 agent(s)")), "{lines:?}");
    // status against the down server: `gone`, exit 0, still no bootstrap.
    h.mam(["status"]).run().expect_rc(0);
    assert!(!h.server_running());
}

fn o2_8_11_unknown(h: &S, ctx: &dyn Fn() -> mam::ctx::Ctx) {
    let mut st = h.mock_state();
    st["inject"] = json!({"agent_list": "garbage"});
    h.td.write("mock-state.json", st.to_string());
    let r = mam::session::reconcile::reconcile_once(&ctx()).unwrap();
    assert_eq!(r.rc(), 3);
    for n in ["a1", "a2"] {
        assert_eq!(h.row(n)["status"], "running");
        assert_eq!(h.row(n)["herdr_confirmed"], false);
    }
    // status shows `unknown` and exits 3, output still printed.
    let out = h.mam(["status"]).run();
    out.expect_rc(3);
    assert_eq!(out.stdout().lines().filter(|l| l.contains("\tunknown\t")).count(), 2, "{}", out.stdout());
}

#[test]
fn reconcile_cli_and_shim_run_the_one_shot_reconcile() {
    let h = S::herdr("rec1", json!({"running": true}));
    h.create(&["--name", "a1"]).run().expect_rc(0);
    h.create(&["--name", "a2"]).run().expect_rc(0);
    let mut st = h.mock_state();
    st["agents"].as_array_mut().unwrap().retain(|a| a["name"] != "a2");
    h.td.write("mock-state.json", st.to_string());
    let r = h.mam(["reconcile"]).run();
    r.expect_rc(0);
    eqnice!(
        "server herdr/multi-agent-mux: confirmed, 1 agent(s) listed\nsession a2: running -> exited (agent not listed)\n",
        r.stdout()
    );
    assert_eq!(h.row("a2")["status"], "exited");
    assert_eq!(h.row("a1")["herdr_confirmed"], true);
    // Through the legacy shim, with the server's state unknown: rc 3, rows unchanged.
    let mut st = h.mock_state();
    st["inject"] = json!({"agent_list": "garbage"});
    h.td.write("mock-state.json", st.to_string());
    let shim = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("shims/reconcile.sh");
    let mut cmd = h.td.command(shim).env("MAM_BIN", mam_bin());
    for (k, v) in &h.env {
        cmd = cmd.env(k, v);
    }
    let r = cmd.run();
    r.expect_rc(3);
    assert!(r.stdout().starts_with("server herdr/multi-agent-mux: state unknown ("), "{}", r.stdout());
    assert_eq!(h.row("a1")["status"], "running");
    assert_eq!(h.row("a1")["herdr_confirmed"], false);
    assert_eq!(h.mock_state()["running"], true);
    assert!(h.argvs().iter().all(|a| a.last().map(String::as_str) != Some("server")), "nothing bootstrapped");
    // A sessions file that is not JSON: REFUSED, rc 2.
    fs::write(h.file(), "herdr_sessions: []\n").unwrap();
    let r = h.mam(["reconcile"]).run();
    r.expect_rc(2);
    assert!(r.stderr().starts_with("REFUSED: reconcile: "), "{}", r.stderr());
}

// ---------------------------------------------------------------------------------------------
// Real tmux: the main flow, and a pane that is not at a shell

#[test]
fn tmux_create_status_stop_resume() {
    let Some(h) = S::tmux("tmux_flow") else { return };
    let r = h.create(&["--name", "t1"]).run();
    r.expect_rc(0);
    let pane = kv(&r.stdout(), "PANE");
    assert_eq!(h.row("t1")["backend"], "tmux");
    assert_eq!(h.row("t1")["pane"]["server"], h.tmux.clone().unwrap());
    assert_eq!(h.tmux_panes(), std::slice::from_ref(&pane));
    let st = h.mam(["status", "t1"]).run();
    st.expect_rc(0);
    assert!(st.stdout().contains(&format!("\ttmux/{}\t{pane}\t", h.tmux.as_deref().unwrap())), "{}", st.stdout());
    // tmux reads the state from the screen: the fake claude shows claude's input line, so idle.
    assert!(st.stdout().contains("\trunning\tidle\t"), "{}", st.stdout());
    let ls = h.mam(["pane", "ls"]).run();
    ls.expect_rc(0);
    assert_eq!(ls.stdout(), format!("t1\t{pane}\tclaude\tidle\n"));
    h.mam(["stop", "t1"]).run().expect_rc(0);
    assert!(h.tmux_panes().is_empty(), "no pane left");
    assert!(h.mam(["status", "t1"]).run().stdout().contains("\tgone\t"));
    let r = h.mam(["resume", "t1"]).run();
    r.expect_rc(0);
    assert_eq!(h.tmux_panes(), [kv(&r.stdout(), "PANE")]);
    assert!(h.mam(["status", "t1"]).run().stdout().contains("\trunning\t"));
    h.mam(["stop", "t1"]).run().expect_rc(0);
    assert!(h.tmux_panes().is_empty());
}

/// `stop` leaves nothing of the agent behind: a process of its tree that ignores SIGHUP (as gemini
/// does) outlives the closed pane, and stop ends it by pid.
#[test]
fn tmux_stop_ends_an_agent_process_that_outlives_its_pane() {
    let Some(h) = S::tmux("tmux_orphan") else { return };
    let claude = h.td.path("bin/claude");
    fs::remove_file(&claude).unwrap();
    let pidfile = h.td.path("orphan.pid");
    h.td.write(
        "bin/claude",
        format!(
            "#!/usr/bin/env bash\ntrap '' HUP\nsleep 300 &\necho $! > '{}'\nexec -a claude '{}' \"$@\"\n",
            pidfile.display(),
            mam_bin().display()
        ),
    );
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&claude, fs::Permissions::from_mode(0o755)).unwrap();
    h.create(&["--name", "t1"]).run().expect_rc(0);
    let row = h.row("t1");
    assert!(row["pane"]["agent_pids"].as_array().is_some_and(|a| !a.is_empty()), "{row}");
    let orphan: i32 = fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
    assert!(mam::sys::process_exists(orphan));
    let t0 = std::time::Instant::now();
    h.mam(["stop", "t1"]).run().expect_rc(0);
    assert!(h.tmux_panes().is_empty());
    wait_until("the orphan is gone", Duration::from_secs(5), || {
        !mam::sys::process_exists(orphan) || matches!(mam::sys::proc_start_ticks(orphan), Ok((_, true)))
    });
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());
}

#[test]
fn tmux_create_in_a_pane_not_at_a_shell_is_rolled_back() {
    let Some(h) = S::tmux("tmux_not_shell") else { return };
    let sock = h.tmux.clone().unwrap();
    // A server whose new panes run a non-shell program (`pager`, which becomes `sleep`).
    let pager = h.td.write("bin/pager", "#!/bin/sh\nexec sleep 600\n");
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&pager, fs::Permissions::from_mode(0o755)).unwrap();
    let tm = |args: &[&str]| {
        let out = Command::new("tmux").arg("-L").arg(&sock).args(args).output().unwrap();
        assert!(out.status.success(), "tmux {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    tm(&["-f", "/dev/null", "new-session", "-d", "-s", "keep"]);
    tm(&["set-option", "-g", "default-shell", pager.to_str().unwrap()]);
    let keep = h.tmux_panes();
    assert_eq!(keep.len(), 1);
    let r = h.create(&["--name", "t1"]).run();
    r.expect_rc(1);
    assert!(r.stderr().starts_with("ERROR: create: pane %"), "{}", r.stderr());
    assert!(r.stderr().contains("is not at a shell"), "{}", r.stderr());
    assert!(r.stderr().contains("rolled back (confirmed: nothing left)"), "{}", r.stderr());
    assert_eq!(h.tmux_panes(), keep, "no pane left behind");
    assert!(!h.file().exists(), "nothing half-written");
}

// ---------------------------------------------------------------------------------------------
// Bad input

#[test]
fn create_refuses_bad_input_before_any_change() {
    let h = S::fake("create_bad");
    let cases: &[(&[&str], &str)] = &[
        (&["create", "claude", "--name", "a;touch pwned"], "REFUSED: create: invalid session name 'a;touch pwned'"),
        (&["create", "claude", "--name", "$(id)"], "REFUSED: create: invalid session name"),
        (&["create", "vim"], "REFUSED: create: unknown agent kind 'vim'"),
        (&["create", "claude", "--workspace", "/nonexistent/dir"], "REFUSED: create: --workspace /nonexistent/dir"),
    ];
    for (args, want) in cases {
        let r = h.mam(*args).run();
        r.expect_rc(2);
        assert!(r.stderr().starts_with(want), "{args:?}: {}", r.stderr());
        assert!(r.stderr().trim_end().ends_with("; nothing changed"), "{}", r.stderr());
        assert_eq!(r.stdout(), "");
    }
    assert!(!h.td.path("panes").exists(), "no pane");
    assert!(!h.file().exists(), "no row");
    assert!(!h.td.ws().join("pwned").exists());
    h.mam(["create"]).run().expect_rc(2);
    h.mam(["create", "claude", "--bogus"]).run().expect_rc(2);
    // A running name is refused; nothing is added.
    h.create(&["--name", "s1"]).run().expect_rc(0);
    let before = fs::read(h.file()).unwrap();
    let panes = h.fake_panes();
    let r = h.create(&["--name", "s1"]).run();
    r.expect_rc(2);
    assert!(r.stderr().starts_with("REFUSED: create: session s1 is already running"), "{}", r.stderr());
    assert_eq!(fs::read(h.file()).unwrap(), before);
    assert_eq!(h.fake_panes(), panes);
}

#[test]
fn unknown_or_hostile_names_are_refused_by_stop_resume_status() {
    let h = S::fake("names_bad");
    h.create(&["--name", "s1"]).run().expect_rc(0);
    let before = fs::read(h.file()).unwrap();
    for name in ["nosuch", "s1;rm -rf /", "$(touch x)"] {
        for cmd in ["stop", "resume", "status"] {
            let r = h.mam([cmd, name]).run();
            r.expect_rc(2);
            let want = format!("REFUSED: {cmd}: unknown session '{name}'");
            assert!(r.stderr().starts_with(&want), "{}", r.stderr());
        }
    }
    // stop validates every name before stopping any.
    let r = h.mam(["stop", "s1", "nosuch"]).run();
    r.expect_rc(2);
    assert_eq!(fs::read(h.file()).unwrap(), before, "nothing changed");
    assert_eq!(h.live_fake_agents().len(), 1);
    // --purge-conversation without --yes: 4, nothing changed.
    let r = h.mam(["stop", "s1", "--purge-conversation"]).run();
    r.expect_rc(4);
    assert_eq!(r.stderr().trim(), "REFUSED: stop: --purge-conversation needs --yes; nothing changed");
    assert_eq!(fs::read(h.file()).unwrap(), before);
    // A refused purge: the session is stopped, the conversation kept, exit 5.
    h.edit_row("s1", |r| r["conversation_id"] = json!("123e4567-e89b-12d3-a456-426614174000"));
    let r = h.mam(["stop", "s1", "--purge-conversation", "--yes"]).run();
    r.expect_rc(5);
    assert!(r.stderr().starts_with("REFUSED: stop: s1: session stopped; conversation kept"), "{}", r.stderr());
    let row = h.row("s1");
    assert_eq!(row["status"], "stopped");
    assert_eq!(row["conversation_id"], "123e4567-e89b-12d3-a456-426614174000");
    assert!(row["pane"]["cwd"].is_string());
    assert!(h.live_fake_agents().is_empty());
    assert!(!h.td.ws().join("x").exists());
}

#[test]
fn sessions_file_not_json_is_refused_then_imported_once() {
    let h = S::fake("not_json");
    let yaml = "# legacy\nherdr_sessions:\n  - name: old-01\n    agent: claude\n    status: stopped\n    pane_id: '7'\n    herdr_session: multi-agent-mux\n    cwd: /tmp\norchestrator_uuids: []\n";
    h.td.write("ws/.mam/agent_sessions.json", yaml);
    for args in
        [vec!["create", "claude", "--no-onboard"], vec!["status"], vec!["stop", "old-01"], vec!["resume", "old-01"]]
    {
        let r = h.mam(&args).run();
        r.expect_rc(2);
        let want = format!("REFUSED: {}: {} is not a JSON sessions file", args[0], h.file().display());
        assert!(r.stderr().starts_with(&want), "{}", r.stderr());
        assert!(r.stderr().contains("`mam session import-yaml`"), "{}", r.stderr());
        assert_eq!(fs::read_to_string(h.file()).unwrap(), yaml, "untouched");
    }
    assert!(!h.td.path("panes").exists(), "no pane");
    // Reconcile (library) refuses it too.
    let ctx = mam::ctx::Ctx::with_env([("WORKSPACE_ROOT", h.td.ws())], &h.td.ws());
    let e = mam::session::reconcile::reconcile_once(&ctx).unwrap_err();
    assert!(matches!(e, mam::session::SessionError::NotJson { .. }), "{e:?}");
    assert_eq!(mam::cli::session_failure("reconcile", &e).rc, 2);
    // Import: JSON with the pane fields folded in, the original kept as agent_sessions.yaml.bak.
    let r = h.mam(["session", "import-yaml"]).run();
    r.expect_rc(0);
    assert!(r.stdout().starts_with("imported 1 row(s)"), "{}", r.stdout());
    let bak = h.td.ws().join(".mam/agent_sessions.yaml.bak");
    assert_eq!(fs::read_to_string(&bak).unwrap(), yaml);
    let row = h.row("old-01");
    assert_eq!(row["pane"], json!({"id": "7", "server": "multi-agent-mux", "cwd": "/tmp"}));
    assert_eq!(h.doc()["version"], 1);
    let r = h.mam(["session", "import-yaml"]).run();
    r.expect_rc(0);
    assert!(r.stderr().contains("already is JSON"), "{}", r.stderr());
    h.mam(["status"]).run().expect_rc(0);
    // Garbage is refused with its line; nothing changes.
    let bad = h.td.write("legacy.yaml", "herdr_sessions:\n  - name: &a x\n");
    let before = fs::read(h.file()).unwrap();
    let r = h.mam(["session", "import-yaml"]).args([&bad]).run();
    r.expect_rc(2);
    assert!(r.stderr().contains("line 2: unsupported YAML construct"), "{}", r.stderr());
    assert_eq!(fs::read(h.file()).unwrap(), before);
    h.mam(["session", "bogus"]).run().expect_rc(2);
}

// ---------------------------------------------------------------------------------------------
// monitor, shims, lib.sh

#[test]
fn monitor_is_a_front_over_the_daemon() {
    let h = S::fake("monitor");
    for (verb, daemon) in [("start", "ensure"), ("stop", "stop"), ("status", "status")] {
        let m = h.mam(["monitor", verb]).run();
        let d = h.mam(["daemon", daemon, "--workspace", &s(&h.td.ws())]).run();
        assert_eq!(m.rc(), d.rc(), "monitor {verb}: {} / {}", m.stderr(), d.stderr());
        // Issue 18: monitor labels what the daemon command prints bare.
        let root = s(&h.td.ws());
        let want = match d.stdout().trim() {
            "" if verb == "status" => format!("daemon for {root}: not running (start it with `mam monitor start`)\n"),
            pid if !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()) => {
                format!("daemon for {root}: running, pid {pid}\n")
            }
            _ => d.stdout(),
        };
        assert_eq!(m.stdout(), want, "monitor {verb}");
    }
    let m = h.mam(["monitor"]).run();
    assert_eq!(m.rc(), h.mam(["daemon", "status", "--workspace", &s(&h.td.ws())]).run().rc());
    let r = h.mam(["monitor", "restart"]).run();
    r.expect_rc(2);
    assert!(r.stderr().contains("unknown verb 'restart'"), "{}", r.stderr());
}

#[test]
fn shims_exec_the_session_subcommands() {
    let h = S::fake("shims");
    let shims = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("shims");
    let r = h.td.command(shims.join("create_session.sh")).env("MAM_BIN", mam_bin());
    let mut r = r;
    for (k, v) in &h.env {
        r = r.env(k, v);
    }
    r.args(["claude", "--no-onboard", "--name", "sh1"]).run().expect_rc(0);
    let st = h.td.command(shims.join("status.sh")).env("MAM_BIN", mam_bin());
    let mut st = st;
    for (k, v) in &h.env {
        st = st.env(k, v);
    }
    let out = st.args(["sh1"]).run();
    out.expect_rc(0);
    assert!(out.stdout().lines().nth(1).is_some_and(|l| l.starts_with("sh1\tclaude\tfake/fake\t")), "{}", out.stdout());
    let mut stop = h.td.command(shims.join("stop_session.sh")).env("MAM_BIN", mam_bin());
    for (k, v) in &h.env {
        stop = stop.env(k, v);
    }
    stop.args(["sh1"]).run().expect_rc(0);
    let mut resume = h.td.command(shims.join("resume_session.sh")).env("MAM_BIN", mam_bin());
    for (k, v) in &h.env {
        resume = resume.env(k, v);
    }
    resume.args(["sh1"]).run().expect_rc(0);
    h.mam(["stop", "sh1"]).run().expect_rc(0);
    assert!(h.live_fake_agents().is_empty());
}

#[test]
fn lib_sh_wrappers_and_the_herdr_shim() {
    let td = TestDir::new("lib_sh");
    let lib = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("shims/lib.sh");
    let script = format!(
        "source '{}' || exit 9\n\
         printf 'version=%s\\n' \"$MAM_VERSION\"\n\
         printf 'int=%s\\n' \"$(mam_int ' 42 ')\"\n\
         mam_int x 2>/dev/null; printf 'bad=%s\\n' $?\n\
         printf 'root=%s\\n' \"$(mam_abs_workspace)\"\n\
         printf 'logs=%s\\n' \"$(delegate_logs_dir)\"\n\
         printf 'json=%s\\n' \"$(mam_control_plane_json)\"\n\
         printf 'prefix=%s\\n' \"$(mam_control_plane_prefix)\"\n\
         type send_keys_safe delegate_publish_cmd start_watchdog >/dev/null && echo defined\n",
        lib.display()
    );
    let run = || {
        td.command("bash")
            .args(["-c", &script])
            .env("MAM_BIN", mam_bin())
            .env("WORKSPACE_ROOT", td.ws())
            .cwd(td.path("home"))
            .run()
    };
    let r = run();
    r.expect_rc(0);
    let out = r.stdout();
    let ws = s(&td.ws());
    assert!(out.contains(&format!("version={}\n", env!("CARGO_PKG_VERSION"))), "{out}");
    assert!(out.contains("int=42\n") && out.contains("bad=2\n"), "{out}");
    assert!(out.contains(&format!("root={ws}\n")), "{out}");
    assert!(out.contains(&format!("logs={ws}/.mam/delegate_job_logs\n")), "{out}");
    assert!(out.contains(&format!("\"MAM_JOBS_DIR\":\"{ws}/.mam/jobs\"")), "{out}");
    assert!(out.contains(&format!("prefix=WORKSPACE_ROOT='{ws}' ")), "{out}");
    assert!(out.ends_with("defined\n"), "{out}");
    // The one side effect: the herdr wrapper at the pinned control root (the text of `mam install
    // --print-herdr-shim`, naming the binary's absolute path), executable.
    let shim = td.ws().join(".mam/shim/herdr");
    let want = mam::install::assets::herdr_shim(&fs::canonicalize(mam_bin()).unwrap().to_string_lossy());
    assert_eq!(fs::read_to_string(&shim).unwrap(), want);
    use std::os::unix::fs::PermissionsExt;
    assert!(fs::metadata(&shim).unwrap().permissions().mode() & 0o111 != 0);
    // A stale shim is rewritten; a current one is left alone.
    fs::write(&shim, "stale\n").unwrap();
    run().expect_rc(0);
    assert_eq!(fs::read_to_string(&shim).unwrap(), want);
    let mtime = fs::metadata(&shim).unwrap().modified().unwrap();
    run().expect_rc(0);
    assert_eq!(fs::metadata(&shim).unwrap().modified().unwrap(), mtime);
    // It works: `herdr ls` through the shim is `mam pane ls`.
    let r = td
        .command(&shim)
        .args(["ls"])
        .env("MAM_PANE_BACKEND", "fake")
        .env("MAM_FAKE_PANES_DIR", td.path("panes"))
        .run();
    r.expect_rc(1);
    assert_eq!(r.stderr().trim(), "NOTE: no server running");
}

// ---------------------------------------------------------------------------------------------
// Conversation ids and the adapter table (ORCH 2.2, 2.4 step 5, 2.5 step 6, 6.1)

/// argv of a live process.
fn argv_of(pid: i32) -> Vec<String> {
    fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

impl S {
    /// The arguments the agent of `pane` was started with (fake: the agent process; tmux: the child
    /// of the pane's shell; mock herdr: the last `agent start` call after `--`).
    fn agent_argv(&self, pane: &str) -> Vec<String> {
        match self.kind {
            Kind::Fake => {
                let pid = fs::read_to_string(self.td.path("panes/panes").join(pane).join("pid")).unwrap();
                argv_of(pid.trim().parse().unwrap())
            }
            Kind::Tmux => {
                let sock = self.tmux.as_deref().unwrap();
                let out = Command::new("tmux")
                    .args(["-L", sock, "display-message", "-p", "-t", pane, "#{pane_pid}"])
                    .output()
                    .unwrap();
                let shell: i32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
                let child = wait_for("the agent under the pane's shell", Duration::from_secs(10), || {
                    mam::sys::list_pids().unwrap().into_iter().find(|p| mam::sys::proc_ppid(*p).ok() == Some(shell))
                });
                argv_of(child)
            }
            Kind::Herdr => self.calls_of(&["agent", "start"]).last().cloned().unwrap_or_default(),
            Kind::RealHerdr => self.real().agent_process(pane).1,
        }
    }
}

fn conversation_kept_across_stop_and_resume(h: &S) {
    let r = h.create(&["--name", "c1"]).run();
    r.expect_rc(0);
    let pane = kv(&r.stdout(), "PANE");
    let conv = h.row("c1")["conversation_id"].as_str().expect("create records the chosen id").to_string();
    assert!(mam::agents::canonical_uuid(&conv).as_deref() == Some(conv.as_str()), "{conv}");
    let argv = h.agent_argv(&pane);
    let w = argv.windows(2).any(|w| w[0] == "--session-id" && w[1] == conv);
    assert!(w, "start arguments choose the id: {argv:?}");
    h.mam(["stop", "c1"]).run().expect_rc(0);
    assert_eq!(h.row("c1")["conversation_id"], conv.as_str(), "stop keeps it");
    let r = h.mam(["resume", "c1"]).run();
    r.expect_rc(0);
    let argv = h.agent_argv(&kv(&r.stdout(), "PANE"));
    assert!(argv.windows(2).any(|w| w[0] == "--resume" && w[1] == conv), "resume passes it: {argv:?}");
    assert!(!argv.iter().any(|a| a == "--session-id"), "no new conversation: {argv:?}");
    assert_eq!(h.row("c1")["conversation_id"], conv.as_str());
    h.mam(["stop", "c1"]).run().expect_rc(0);
}

#[test]
fn create_stop_resume_keeps_the_conversation_id_on_the_fake_backend() {
    conversation_kept_across_stop_and_resume(&S::fake("conv_fake"));
}

#[test]
fn create_stop_resume_keeps_the_conversation_id_on_the_mock_herdr() {
    conversation_kept_across_stop_and_resume(&S::herdr("conv_herdr", json!({"running": true})));
}

#[test]
fn create_stop_resume_keeps_the_conversation_id_on_tmux() {
    let Some(h) = S::tmux("conv_tmux") else { return };
    conversation_kept_across_stop_and_resume(&h);
}

/// The CLI refuses the recorded conversation and exits (claude `--resume` of one no prompt ever
/// reached): resume sees the exit at once, rolls the pane back and starts a new conversation, saying so.
fn resume_starts_a_new_conversation_when_the_cli_refuses_the_old_one(h: &S) {
    let r = h.create(&["--name", "c1"]).run();
    r.expect_rc(0);
    let old = h.row("c1")["conversation_id"].as_str().unwrap().to_string();
    h.mam(["stop", "c1"]).run().expect_rc(0);
    h.td.write("agent.script", "refuse_arg=--resume\n");
    let t = std::time::Instant::now();
    let r = h.mam(["resume", "c1"]).run();
    r.expect_rc(0);
    assert!(t.elapsed() < Duration::from_secs(8), "the exit is seen at once: {:?}", t.elapsed());
    let new = h.row("c1")["conversation_id"].as_str().unwrap().to_string();
    assert_ne!(new, old);
    assert!(mam::agents::canonical_uuid(&new).is_some(), "{new}");
    let note = r.stderr();
    assert!(
        note.contains(&format!(
            "NOTE: claude could not resume conversation {old} ('claude' test-double agent --resume {old})"
        )) && note.contains("exited during start")
            && note.contains(&format!("started a new conversation {new}")),
        "{note}"
    );
    let argv = h.agent_argv(&kv(&r.stdout(), "PANE"));
    assert!(argv.windows(2).any(|w| w[0] == "--session-id" && w[1] == new), "{argv:?}");
    h.mam(["stop", "c1"]).run().expect_rc(0);
}

#[test]
fn resume_starts_a_new_conversation_when_the_cli_refuses_the_old_one_on_the_fake_backend() {
    resume_starts_a_new_conversation_when_the_cli_refuses_the_old_one(&S::fake("refuse_fake"));
}

#[test]
fn resume_starts_a_new_conversation_when_the_cli_refuses_the_old_one_on_tmux() {
    let Some(h) = S::tmux("refuse_tmux") else { return };
    resume_starts_a_new_conversation_when_the_cli_refuses_the_old_one(&h);
}

#[test]
fn create_fails_fast_naming_the_executable_and_kind_when_it_is_not_on_path() {
    for backend in ["tmux", "herdr"] {
        let h = S::herdr(&format!("fast_{backend}"), json!({"running": true}));
        let started = std::time::Instant::now();
        let r = h.mam(["create", "codex", "--no-onboard"]).env("MAM_PANE_BACKEND", backend).run();
        r.expect_rc(2);
        assert!(started.elapsed() < Duration::from_secs(1), "{backend}: took {:?}", started.elapsed());
        assert!(
            r.stderr().starts_with("REFUSED: create: agent executable 'codex' (kind codex) not found on PATH"),
            "{backend}: {}",
            r.stderr()
        );
        assert!(!h.file().exists(), "no row");
    }
}

#[test]
fn stop_purge_conversation_purges_through_the_adapter() {
    let h = S::fake("stop_purge");
    let r = h.create(&["--name", "p1"]).run();
    r.expect_rc(0);
    let conv = h.row("p1")["conversation_id"].as_str().unwrap().to_string();
    // claude's transcript as the CLI writes it (A47), in the test's HOME.
    let t = h.td.write(&format!("home/.claude/projects/-work-p/{conv}.jsonl"), "{}\n");
    h.mam(["stop", "p1", "--purge-conversation"]).run().expect_rc(4);
    assert!(t.exists() && h.row("p1")["status"] == "running", "nothing changed without --yes");
    let r = h.mam(["stop", "p1", "--purge-conversation", "--yes"]).run();
    r.expect_rc(0);
    assert!(r.stdout().contains("SESSION=p1 STATUS=stopped") && r.stdout().contains("PURGED=1"), "{}", r.stdout());
    assert!(!t.exists(), "the transcript is gone");
    assert!(h.row("p1").get("conversation_id").is_none(), "cleared by the successful purge");
    // A kind whose artifacts are not pinned keeps its conversation: exit 5 naming why.
    h.edit_row("p1", |r| {
        r["agent"] = json!("codex");
        r["conversation_id"] = json!("0193aaaa-bbbb-7ccc-8ddd-eeeeeeeeeeee");
    });
    let r = h.mam(["stop", "p1", "--purge-conversation", "--yes"]).run();
    r.expect_rc(5);
    assert!(r.stderr().contains("conversation kept (no artifact (purge not supported for codex))"), "{}", r.stderr());
    // A hostile conversation id on the row is refused before any change (A45).
    h.edit_row("p1", |r| r["conversation_id"] = json!("../../etc"));
    let r = h.mam(["stop", "p1", "--purge-conversation", "--yes"]).run();
    r.expect_rc(2);
    assert!(r.stderr().contains("is not a canonical uuid"), "{}", r.stderr());
}

/// Issue 18: `mam create` says how to look at the pane; `mam attach` prints (`--print`) and runs
/// the way there: attach-session from a plain terminal, and from inside another tmux server a new
/// window of that server running a nested client of the agent's server (checked on real tmux).
#[test]
fn tmux_attach_prints_and_brings_the_user_to_the_pane() {
    let Some(h) = S::tmux("tmux_attach") else { return };
    let r = h.create(&["--name", "t1"]).run();
    r.expect_rc(0);
    assert!(r.stderr().contains("NOTE: look at the agent's pane with `mam attach t1`"), "{}", r.stderr());
    let pane = kv(&r.stdout(), "PANE");
    let sock = h.tmux.clone().unwrap();
    let r = h.mam(["attach", "t1", "--print"]).env_remove("TMUX").run();
    r.expect_rc(0);
    eqnice!(
        format!(
            "tmux -L {sock} select-window -t {pane}\ntmux -L {sock} select-pane -t {pane}\ntmux -L {sock} attach-session -t {pane}\n"
        ),
        r.stdout()
    );
    // Issue 32: without a terminal it says what to do, not tmux's `open terminal failed`.
    let r = h.mam(["attach", "t1"]).env_remove("TMUX").run();
    r.expect_rc(2);
    eqnice!(
        "ERROR: attach: t1 needs a terminal (stdin and stdout are not one here); run it from a terminal, or print \
         the command with `mam attach t1 --print`\n",
        r.stderr()
    );
    // The person's own tmux server (a second private one), and `mam attach` run "inside" it.
    let user = format!("user-{}", rand_hex(4));
    struct Kill(String);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = Command::new("tmux").args(["-L", &self.0, "kill-server"]).output();
        }
    }
    let _kill = Kill(user.clone());
    let st = Command::new("tmux").args(["-L", &user, "new-session", "-d", "-x", "80", "-y", "24"]).status().unwrap();
    assert!(st.success());
    let out = Command::new("tmux").args(["-L", &user, "display-message", "-p", "#{socket_path}"]).output().unwrap();
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let tmux_var = format!("{path},1,0");
    let r = h.mam(["attach", "t1", "--print"]).env("TMUX", &tmux_var).run();
    r.expect_rc(0);
    assert!(
        r.stdout()
            .ends_with(&format!("tmux new-window -n mam:t1 'env -u TMUX tmux -L {sock} attach-session -t {pane}'\n")),
        "{}",
        r.stdout()
    );
    let r = h.mam(["attach", "t1"]).env("TMUX", &tmux_var).run();
    r.expect_rc(0);
    assert!(r.stderr().contains("nested client"), "{}", r.stderr());
    let windows = Command::new("tmux").args(["-L", &user, "list-windows", "-F", "#{window_name}"]).output().unwrap();
    assert!(String::from_utf8_lossy(&windows.stdout).lines().any(|w| w == "mam:t1"), "{windows:?}");
    wait_until("a client on the agent's server", Duration::from_secs(10), || {
        let c = Command::new("tmux").args(["-L", &sock, "list-clients", "-F", "#{client_name}"]).output().unwrap();
        !String::from_utf8_lossy(&c.stdout).trim().is_empty()
    });
    drop(_kill);
    h.mam(["stop", "t1"]).run().expect_rc(0);
}

/// Issue 18: `mam attach` names an unknown session's closest name, and the fake backend has no pane.
#[test]
fn attach_refuses_unknown_sessions_and_the_fake_backend() {
    let h = S::fake("attach_fake");
    h.create(&["--name", "s1"]).run().expect_rc(0);
    let r = h.mam(["attach", "s2"]).run();
    r.expect_rc(2);
    assert!(r.stderr().contains("unknown session 's2'") && r.stderr().contains("did you mean 's1'?"), "{}", r.stderr());
    let r = h.mam(["attach", "s1", "--print"]).run();
    r.expect_rc(2);
    assert!(r.stderr().contains("no pane to look at"), "{}", r.stderr());
    h.mam(["stop", "s1"]).run().expect_rc(0);
}

/// Issue 32 item 7: a herdr server mam started (bootstrapped for `create`) is stopped when mam's
/// last agent on it stops, with a NOTE naming it; `mam status` names the herdr session.
#[test]
fn a_herdr_server_mam_started_stops_with_its_last_agent() {
    let Some(h) = S::on(Kind::RealHerdr, "herdr_srv") else { return };
    let session = h.real().session.clone();
    let r = h.create(&["--name", "s1"]).run();
    r.expect_rc(0);
    let marker = h.td.ws().join(format!(".mam/logs/herdr-server-{session}.started"));
    assert!(marker.is_file(), "mam notes that it started the server");
    let st = h.mam(["status"]).run();
    assert!(st.stdout().contains(&format!("\therdr/{session}\t")), "{}", st.stdout());
    assert_eq!(h.real().herdr(&["agent", "list"]).rc(), 0, "the server runs");
    let r = h.mam(["stop", "s1"]).run();
    r.expect_rc(0);
    assert!(r.stderr().contains(&format!("NOTE: herdr server {session} stopped (mam started it")), "{}", r.stderr());
    wait_until("the herdr server to end", std::time::Duration::from_secs(10), || {
        h.real().herdr(&["agent", "list"]).rc() != 0
    });
    assert!(!marker.exists());
}

/// Issue 32 item 7, the second half: `mam monitor stop` stops a herdr server mam started once
/// none of mam's agents is left on it (here the agent died behind mam's back: no `mam stop`), with
/// the NOTE `mam stop` gives; while an agent runs on it, the server stays.
#[test]
fn i32_monitor_stop_stops_a_herdr_server_mam_started_once_no_agent_is_left() {
    let Some(h) = S::on(Kind::RealHerdr, "herdr_mon") else { return };
    let session = h.real().session.clone();
    let r = h.create(&["--name", "s1"]).run();
    r.expect_rc(0);
    let pane = kv(&r.stdout(), "PANE");
    let marker = h.td.ws().join(format!(".mam/logs/herdr-server-{session}.started"));
    assert!(marker.is_file(), "mam notes that it started the server");
    // An agent runs on it: monitor stop leaves the server alone.
    let r = h.mam(["monitor", "stop"]).run();
    r.expect_rc(0);
    assert!(!r.stderr().contains("herdr server"), "{}", r.stderr());
    let l = h.real().herdr(&["agent", "list"]);
    assert!(l.rc() == 0 && l.stdout().contains("\"s1\""), "the server runs on, with s1: {}", l.stdout());
    assert!(marker.is_file());
    // The agent dies (no `mam stop`): the next monitor stop takes the server with it.
    let (pid, _) = h.real().agent_process(&pane);
    let _ = mam::sys::kill(pid, 9);
    wait_until("herdr to see the agent gone", std::time::Duration::from_secs(20), || {
        let l = h.real().herdr(&["agent", "list"]);
        l.rc() == 0 && !l.stdout().contains("\"s1\"")
    });
    let r = h.mam(["monitor", "stop"]).run();
    r.expect_rc(0);
    assert!(r.stderr().contains(&format!("NOTE: herdr server {session} stopped (mam started it")), "{}", r.stderr());
    wait_until("the herdr server to end", std::time::Duration::from_secs(10), || {
        h.real().herdr(&["agent", "list"]).rc() != 0
    });
    assert!(!marker.exists());
}

/// Issue 32 item 6: `unknown` only when mam cannot tell. A pretend agent (`mam create pretend`) on
/// tmux shows `idle` at its input line, `working` while its job runs (it used to show `idle`, its
/// old input line still on the screen) and `idle` again after; never `unknown`. `mam status --help`
/// explains every state word.
#[test]
fn i32_a_pretend_session_shows_a_real_state() {
    use std::time::Duration;
    let Some(h) = S::on(Kind::Tmux, "pretend_state") else { return };
    let r = h.mam(["create", "pretend", "--name", "p1", "--no-onboard", "--", "--work", "4"]).run();
    r.expect_rc(0);
    let state = || {
        let out = h.mam(["status", "p1"]).run().stdout();
        let row = out.lines().find(|l| l.starts_with("p1\t")).unwrap_or_else(|| panic!("{out}")).to_string();
        let cols: Vec<&str> = row.split('\t').collect();
        (cols[5].to_string(), cols[6].to_string())
    };
    assert_eq!(state(), ("running".to_string(), "idle".to_string()));
    h.td.write("ws/t.md", "Say hello.\n");
    let r = h.mam(["delegate-job", "--session", "p1", "--brief-file", "t.md", "--detach"]).run();
    r.expect_rc(0);
    let jid = kv(&r.stdout(), "JOB_ID");
    let mut seen = Vec::new();
    wait_until("p1 to show working", Duration::from_secs(20), || {
        let s = state().1;
        seen.push(s.clone());
        s == "working"
    });
    let w = h.mam(["wait", &jid, "--timeout", "30"]).run_within(Duration::from_secs(40));
    w.expect_rc(0);
    wait_until("p1 to show idle again", Duration::from_secs(10), || {
        let s = state().1;
        seen.push(s.clone());
        s == "idle"
    });
    assert!(!seen.iter().any(|s| s == "unknown"), "{seen:?}");
    let help = h.mam(["status", "--help"]).run().stdout();
    for word in ["running:", "gone:", "unknown:", "working:", "idle:", "done:", "blocked:", "stopped"] {
        assert!(help.contains(word), "--help explains `{word}`: {help}");
    }
    h.mam(["stop", "p1"]).run().expect_rc(0);
}

/// The `status`, `reconcile` and `stop` cases of `exitcodes::exit_codes_every_documented_case_happens`,
/// on the mock herdr (the one whose state can be made unknown).
pub(crate) fn exit_code_cases(codes: &crate::exitcodes::Codes) {
    let h = S::herdr("codes_sessions", json!({"running": true}));
    h.create(&["--name", "a1"]).run().expect_rc(0);
    h.create(&["--name", "a2"]).run().expect_rc(0);
    let env_dir = h.td.path("");
    for cmd in ["status", "reconcile"] {
        codes.saw(cmd, "ok", &h.mam([cmd]).run(), 0);
        codes.saw(cmd, "env unreadable", &h.mam([cmd]).env("MAM_ENV_FILE", &env_dir).run(), 1);
    }
    codes.saw("status", "unknown session", &h.mam(["status", "nosuch"]).run(), 2);
    codes.saw("reconcile", "unknown flag", &h.mam(["reconcile", "--no-such"]).run(), 2);
    codes.saw("stop", "unknown session", &h.mam(["stop", "nosuch"]).run(), 2);
    codes.saw("stop", "env unreadable", &h.mam(["stop", "a2"]).env("MAM_ENV_FILE", &env_dir).run(), 1);
    codes.saw("stop", "purge without --yes", &h.mam(["stop", "a1", "--purge-conversation"]).run(), 4);
    let ok = h.mock_state();
    let mut garbage = ok.clone();
    garbage["inject"] = json!({"agent_list": "garbage"});
    h.td.write("mock-state.json", garbage.to_string());
    codes.saw("status", "server unknown", &h.mam(["status"]).run(), 3);
    codes.saw("reconcile", "server unknown", &h.mam(["reconcile"]).run(), 3);
    codes.saw("stop", "state unknown", &h.mam(["stop", "a2"]).run(), 1);
    h.td.write("mock-state.json", ok.to_string());
    codes.saw("stop", "stopped", &h.mam(["stop", "a2"]).run(), 0);
    h.edit_row("a1", |r| r["conversation_id"] = json!("123e4567-e89b-12d3-a456-426614174000"));
    codes.saw("stop", "purge refused", &h.mam(["stop", "a1", "--purge-conversation", "--yes"]).run(), 5);
}
