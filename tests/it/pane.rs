//! Pane backends (ORCH 1.9). Tests 1-10 exercise the herdr backend against the MOCK herdr
//! (`mam test-double herdr`, installed as `herdr` on a test PATH), whose answers
//! `herdr_contract.rs` compares with the real herdr 0.8.0; the state fixtures here are in the
//! mock's state shape (herdr's field names and ids, a split tree per workspace).
//! Test 11 runs one contract suite (tests 4-8 where applicable) over the fake backend always and over
//! real tmux when it is installed (required under MAM_REQUIRE_TMUX=1), on a random socket per test.
//!
//! On the real herdr (a private `HerdrHome` world; skipped when herdr is absent, required under
//! MAM_REQUIRE_HERDR=1): test 11 (the contract suite, which carries tests 4, 5, 7 and 8 there), tests
//! 1 and 2 (the server's own `/proc/<pid>/environ`), 6 (labels from `herdr workspace list`) and 9 (two
//! servers of one world); test 10 and the 1.5 grid are in herdr_mam.rs. What only the mock's argv log
//! or injected answers can show stays mock-only; each such test says why.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::*;

// ---------------------------------------------------------------------------------------------
// Mock herdr harness

struct Mock {
    td: TestDir,
    bin: PathBuf,
    state: PathBuf,
    log: PathBuf,
}

impl Mock {
    fn new(name: &str, state: Value) -> Mock {
        let td = TestDir::new(name);
        let bin = td.path("bin");
        fs::create_dir_all(&bin).unwrap();
        let script = format!("#!/usr/bin/env bash\nexec '{}' test-double herdr \"$@\"\n", mam_bin().display());
        let herdr = bin.join("herdr");
        fs::write(&herdr, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&herdr, fs::Permissions::from_mode(0o755)).unwrap();
        let state_path = td.path("mock-state.json");
        fs::write(&state_path, state.to_string()).unwrap();
        let log = td.path("mock-log.jsonl");
        Mock { td, bin, state: state_path, log }
    }

    /// `mam pane ...` with the mock first on PATH and short knobs.
    fn pane(&self, args: &[&str]) -> Cmd {
        let path = format!("{}:{}", self.bin.display(), std::env::var("PATH").unwrap_or_default());
        self.td
            .mam()
            .args(["pane"])
            .args(args)
            .env("PATH", path)
            .env("MAM_MOCK_STATE", &self.state)
            .env("MAM_MOCK_LOG", &self.log)
            .env("SKS_DELIVERY_GRACE_S", "2")
            .env("MAM_SKS_IDLE_WAIT_S", "1")
            .env("MAM_SKS_POLL_MS", "50")
            .env("MAM_SKS_QUIESCE_GAP_MS", "20")
            .env("MAM_SKS_QUIESCE_S", "1")
            .env("MAM_STARTUP_DIALOG_SETTLE_MS", "50")
            .env("MAM_SERVER_BOOT_WAIT_S", "5")
            .env("MAM_MOCK_STALL_MS", "300")
            .env("MAM_MOCK_WAIT_CAP_MS", "1000")
    }

    fn state(&self) -> Value {
        serde_json::from_slice(&fs::read(&self.state).unwrap()).unwrap()
    }

    fn calls(&self) -> Vec<Value> {
        fs::read_to_string(&self.log).unwrap_or_default().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    fn argvs(&self) -> Vec<Vec<String>> {
        self.calls()
            .iter()
            .map(|c| c["argv"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect())
            .collect()
    }

    /// Calls whose argv starts with `prefix`.
    fn calls_of(&self, prefix: &[&str]) -> Vec<Vec<String>> {
        self.argvs().into_iter().filter(|a| a.len() >= prefix.len() && a[..prefix.len()] == *prefix).collect()
    }

    fn dir(&self) -> String {
        let d = self.td.path("proj");
        fs::create_dir_all(&d).unwrap();
        fs::canonicalize(&d).unwrap().to_string_lossy().into_owned()
    }

    /// The workspace sizes of the state, in order.
    fn sizes(&self) -> Vec<usize> {
        self.state()["workspaces"].as_array().unwrap().iter().map(|w| w["panes"].as_array().unwrap().len()).collect()
    }
}

/// A mock agent record (herdr's field names: `agent` is the kind, `agent_status` the status).
fn agent(name: &str, pane: &str, status: &str) -> Value {
    json!({"name": name, "pane_id": pane, "agent": "claude", "agent_status": status})
}

/// A mock workspace `id` whose panes `<id>:p1..` (`n` of them, at `cwd`) sit in mam's 2 x 2 grid:
/// p2 right of p1, p3 below p1, p4 below p2.
fn ws_v(id: &str, label: &str, cwd: &str, n: usize) -> Value {
    let p = |i: usize| format!("{id}:p{i}");
    let leaf = |i: usize| json!({"pane": p(i)});
    let col = |top: usize, bottom: usize| {
        if bottom <= n {
            json!({"split": "down", "ratio": 0.5, "a": leaf(top), "b": leaf(bottom)})
        } else {
            leaf(top)
        }
    };
    let layout = if n == 1 { leaf(1) } else { json!({"split": "right", "ratio": 0.5, "a": col(1, 3), "b": col(2, 4)}) };
    let panes: Vec<Value> = (1..=n)
        .map(|i| {
            json!({"pane_id": p(i), "cwd": cwd, "env": {}, "terminal_id": format!("term_{:014x}", i),
                   "shell_pid": 4000 + i, "screen": ["$ "]})
        })
        .collect();
    json!({"workspace_id": id, "label": label, "next_pane": n + 1, "focused_pane": p(1), "layout": layout,
           "panes": panes})
}

const DENIED: &[&str] = &[
    "CLAUDECODE",
    "CLAUDE_CODE_CHILD_SESSION",
    "CLAUDE_CODE_SESSION_ID",
    "CLAUDE_CODE_ENTRYPOINT",
    "ANTIGRAVITY_CONVERSATION_ID",
    "HERMES_SESSION_ID",
    "GROK_SESSION_ID",
    "OPENCODE_SESSION_ID",
];

// ---------------------------------------------------------------------------------------------
// ORCH 1.9 tests 1-10 (mock herdr)

/// On the real herdr: `o1_9_1_2_real_herdr_no_autostart_then_bootstrap_env_denylist`.
#[test]
fn o1_9_1_bootstrap_env_denylist() {
    let m = Mock::new("o1_9_1", json!({"running": false}));
    let mut c =
        m.pane(&["server-start"]).env("CLAUDE_PROJECT_DIR", "/proj/cfg").env("HERDR_SOCKET_PATH", "/tmp/a.sock");
    for d in DENIED {
        c = c.env(d, "marker");
    }
    let r = c.run();
    r.expect_rc(0);
    assert_eq!(r.stdout().trim(), "SERVER=multi-agent-mux");
    let calls = m.calls();
    let server: Vec<&Value> =
        calls.iter().filter(|c| c["argv"].as_array().unwrap().last() == Some(&json!("server"))).collect();
    assert_eq!(server.len(), 1, "exactly one bootstrap: {calls:?}");
    assert_eq!(server[0]["argv"], json!(["--session", "multi-agent-mux", "server"]));
    let names: Vec<&str> = server[0]["env_names"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    for d in DENIED {
        assert!(!names.contains(d), "{d} reached the bootstrapped server");
    }
    assert!(!names.contains(&"HERDR_SOCKET_PATH"));
    assert_eq!(server[0]["env"]["CLAUDE_PROJECT_DIR"], "/proj/cfg");
    assert!(m.td.ws().join(".mam/logs/herdr-server-multi-agent-mux.log").is_file());
    assert_eq!(m.state()["running"], true);
}

/// Mock only: the real herdr cannot be made to answer `agent list` with garbage.
#[test]
fn o1_9_1_bootstrap_only_on_structured_server_not_running() {
    // An unrelated failure of the list is not a reason to start a server.
    let m = Mock::new("o1_9_1b", json!({"running": true, "inject": {"agent_list": "garbage"}}));
    let r = m.pane(&["server-start"]).run();
    r.expect_rc(1);
    assert!(r.stderr().contains("state unknown"), "{}", r.stderr());
    assert!(m.calls_of(&["--session"]).is_empty());
}

/// On the real herdr: `o1_9_1_2_real_herdr_no_autostart_then_bootstrap_env_denylist`.
#[test]
fn o1_9_2_no_autostart_never_spawns_a_server() {
    for where_ in ["server_not_running_stdout", "server_not_running_stderr"] {
        let m = Mock::new("o1_9_2", json!({"running": false, "inject": {"no_server": where_}}));
        let r = m.pane(&["ls"]).run();
        r.expect_rc(1);
        assert_eq!(r.stderr().trim(), "NOTE: no server running");
        assert_eq!(r.stdout(), "");
        let r = m.pane(&["status", "--target", "a1"]).run();
        r.expect_rc(0);
        assert_eq!(r.stdout().trim(), "absent");
        let dir = m.dir();
        let r = m
            .pane(&["new-session", "--agent", "claude", "--name", "a1", "--cwd", &dir])
            .env("MAM_NO_AUTOSTART", "1")
            .run();
        r.expect_rc(1);
        assert!(r.stderr().contains("server multi-agent-mux not running (MAM_NO_AUTOSTART=1)"), "{}", r.stderr());
        assert!(m.calls_of(&["--session"]).is_empty(), "a server was spawned ({where_})");
        assert_eq!(m.state()["running"], false);
    }
}

/// Mock only: the real herdr cannot be made to print garbage or an unrelated error document. The
/// Confirmed half (the exact `ls` line of a live agent) is checked on the real herdr in
/// `o1_9_9_real_herdr_cross_server_calls_reach_the_rows_server`.
#[test]
fn o1_9_3_ls_error_document_or_garbage_is_state_unknown() {
    for inject in ["error_doc", "error_doc_exit1", "garbage"] {
        let m = Mock::new(
            "o1_9_3",
            json!({"running": true, "agents": [agent("a1", "w1:p1", "idle")], "workspaces": [ws_v("w1", "", "/", 1)],
                   "inject": {"agent_list": inject}}),
        );
        let r = m.pane(&["ls"]).run();
        r.expect_rc(3);
        assert!(r.stderr().starts_with("ERROR: state unknown: "), "{inject}: {}", r.stderr());
        assert_eq!(r.stdout(), "", "{inject}: never an (empty) list");
    }
    let m = Mock::new(
        "o1_9_3ok",
        json!({"running": true, "agents": [agent("a1", "w1:p1", "idle")], "workspaces": [ws_v("w1", "", "/", 1)]}),
    );
    let r = m.pane(&["ls"]).run();
    r.expect_rc(0);
    assert_eq!(r.stdout(), "a1\tw1:p1\tclaude\tidle\n");
    let r = m.pane(&["ls", "--json"]).run();
    r.expect_rc(0);
    let v: Value = serde_json::from_str(&r.stdout()).unwrap();
    assert_eq!(v[0]["name"], "a1");
}

/// The split arguments are the mock log's. On the real herdr the packing is the contract suite's
/// (`o1_9_11_contract_real_herdr`) and the geometry herdr_mam.rs's
/// `o1_5_one_to_six_agents_fill_the_grid_of_real_herdr` (read from `pane layout`).
#[test]
fn o1_9_4_packing_six_agents_give_four_and_two() {
    let m = Mock::new("o1_9_4", json!({"running": true}));
    let dir = m.dir();
    for i in 0..6 {
        let name = format!("a{i}");
        let r = m.pane(&["new-session", "--agent", "claude", "--name", &name, "--cwd", &dir]).run();
        r.expect_rc(0);
        assert_eq!(kv(&r.stdout(), "REUSED"), "0");
        assert_eq!(kv(&r.stdout(), "SERVER"), "multi-agent-mux");
    }
    assert_eq!(m.sizes(), [4, 2]);
    // Split layout: root split right, then the left column's bottom pane downward, then the right.
    let splits: Vec<(String, String)> =
        m.calls_of(&["pane", "split"]).iter().map(|a| (a[2].clone(), a[4].clone())).collect();
    assert_eq!(splits[0], ("w1:p1".into(), "right".into()));
    assert_eq!(splits[1], ("w1:p1".into(), "down".into()));
    assert_eq!(splits[2], ("w1:p2".into(), "down".into()));
    // A workspace of another cwd is never used.
    let other = m.td.path("other");
    fs::create_dir_all(&other).unwrap();
    m.pane(&["new-session", "--agent", "claude", "--name", "b0", "--cwd", other.to_str().unwrap()]).run().expect_rc(0);
    assert_eq!(m.sizes(), [4, 2, 1]);
}

/// "No split or create call" is the mock log's; on the real herdr the reuse of the second
/// workspace's idle pane is the contract suite's (`o1_9_11_contract_real_herdr`, agent b0).
#[test]
fn o1_9_5_idle_pane_in_second_workspace_is_reused() {
    let m = Mock::new("o1_9_5", json!({}));
    let dir = m.dir();
    let state = json!({"running": true, "next_workspace": 3,
        "workspaces": [ws_v("w1", "", &dir, 4), ws_v("w2", "", &dir, 2)],
        "agents": [agent("a1","w1:p1","idle"), agent("a2","w1:p2","idle"), agent("a3","w1:p3","idle"),
                   agent("a4","w1:p4","idle"), agent("a5","w2:p1","idle")]});
    fs::write(&m.state, state.to_string()).unwrap();
    let r = m.pane(&["new-session", "--agent", "claude", "--name", "a6", "--cwd", &dir]).run();
    r.expect_rc(0);
    assert_eq!(kv(&r.stdout(), "PANE"), "w2:p2");
    assert_eq!(kv(&r.stdout(), "WORKSPACE"), "w2");
    assert_eq!(kv(&r.stdout(), "REUSED"), "1");
    assert!(m.calls_of(&["pane", "split"]).is_empty());
    assert!(m.calls_of(&["workspace", "create"]).is_empty());
}

/// On the real herdr: `o1_9_6_real_herdr_ws_label_renames_only_the_chosen_workspace`.
#[test]
fn o1_9_6_ws_label_renames_only_the_chosen_workspace() {
    let m = Mock::new("o1_9_6", json!({}));
    let dir = m.dir();
    let state = json!({"running": true, "next_workspace": 3,
        "workspaces": [ws_v("w1", "one", &dir, 4), ws_v("w2", "two", &dir, 1)],
        "agents": [agent("a1","w1:p1","idle"), agent("a2","w1:p2","idle"), agent("a3","w1:p3","idle"),
                   agent("a4","w1:p4","idle"), agent("a5","w2:p1","idle")]});
    fs::write(&m.state, state.to_string()).unwrap();
    m.pane(&["new-session", "--agent", "claude", "--name", "a6", "--cwd", &dir])
        .env("MAM_WS_LABEL", "lbl")
        .run()
        .expect_rc(0);
    assert_eq!(m.calls_of(&["workspace", "rename"]), [vec!["workspace", "rename", "w2", "lbl"]]);
    let labels: Vec<String> =
        m.state()["workspaces"].as_array().unwrap().iter().map(|w| w["label"].as_str().unwrap().to_string()).collect();
    assert_eq!(labels, ["one", "lbl"]);
    // Both full: a created workspace carries the label and nothing is renamed.
    m.pane(&["new-session", "--agent", "claude", "--name", "a7", "--cwd", &dir]).run().expect_rc(0);
    m.pane(&["new-session", "--agent", "claude", "--name", "a8", "--cwd", &dir]).run().expect_rc(0);
    m.pane(&["new-session", "--agent", "claude", "--name", "a9", "--cwd", &dir])
        .env("MAM_WS_LABEL", "new")
        .run()
        .expect_rc(0);
    let creates = m.calls_of(&["workspace", "create"]);
    assert_eq!(creates.len(), 1);
    assert!(creates[0].windows(2).any(|w| w == ["--label", "new"]), "{creates:?}");
    assert_eq!(m.calls_of(&["workspace", "rename"]).len(), 1);
}

/// The `--env` flags of the split/create calls are the mock log's. On the real herdr the contract
/// suite (`o1_9_11_contract_real_herdr`, agent c0) checks what they are for: the idle pane is not used,
/// the agent sees MY_TEST_FLAG, and its argv is the bare command (no `env`, no K=V).
#[test]
fn o1_9_7_env_flags_travel_only_as_env_on_create_or_split() {
    let m = Mock::new("o1_9_7", json!({}));
    let dir = m.dir();
    let state = json!({"running": true, "next_workspace": 2,
        "workspaces": [ws_v("w1", "", &dir, 2)],
        "agents": [agent("a1","w1:p1","idle")]});
    fs::write(&m.state, state.to_string()).unwrap();
    let r = m
        .pane(&[
            "new-session",
            "--agent",
            "claude",
            "--name",
            "a2",
            "--cwd",
            &dir,
            "--env",
            "MY_TEST_FLAG=active",
            "--",
        ])
        .args(["--resume", "abc"])
        .run();
    r.expect_rc(0);
    assert_eq!(kv(&r.stdout(), "REUSED"), "0", "the idle pane is not used with an environment set");
    let splits = m.calls_of(&["pane", "split"]);
    assert_eq!(splits.len(), 1);
    assert!(splits[0].windows(2).any(|w| w == ["--env", "MY_TEST_FLAG=active"]), "{splits:?}");
    let starts = m.calls_of(&["agent", "start"]);
    let after: Vec<&String> = starts[0].iter().skip_while(|a| *a != "--").skip(1).collect();
    assert_eq!(after, ["--resume", "abc"]);
    assert!(after.iter().all(|a| *a != "env" && !a.contains('=')), "{after:?}");
    assert!(!starts[0].iter().any(|a| a.contains("MY_TEST_FLAG")));
    // Without env flags the idle pane is reused.
    let r = m.pane(&["new-session", "--agent", "claude", "--name", "a3", "--cwd", &dir]).run();
    r.expect_rc(0);
    assert_eq!(kv(&r.stdout(), "REUSED"), "1");
    assert_eq!(kv(&r.stdout(), "PANE"), "w1:p2");
    // A fresh workspace gets them on create.
    let m2 = Mock::new("o1_9_7b", json!({"running": true}));
    let d2 = m2.dir();
    m2.pane(&["new-session", "--agent", "claude", "--name", "a1", "--cwd", &d2, "--env", "MY_TEST_FLAG=active"])
        .run()
        .expect_rc(0);
    let creates = m2.calls_of(&["workspace", "create"]);
    assert!(creates[0].windows(2).any(|w| w == ["--env", "MY_TEST_FLAG=active"]), "{creates:?}");
}

/// A registry with job `j1` whose record carries dispatch token `tok1`.
fn registry(td: &TestDir) -> PathBuf {
    let reg = td.path("reg");
    fs::create_dir_all(reg.join("j1")).unwrap();
    fs::write(reg.join("j1.json"), json!({"job_id": "j1", "status": "pending", "dispatch_token": "tok1"}).to_string())
        .unwrap();
    reg
}

fn started_line(token: &str) -> String {
    json!({"event": "started", "attempt": 1, "dispatch_token": token}).to_string()
}

/// Injected prompt results are the mock's. On the real herdr the contract suite
/// (`o1_9_11_contract_real_herdr`) checks a stalled prompt confirmed by the job's `started` (0), one
/// never confirmed although the screen changed (4, typed once) and an unknown target (3); herdr_mam.rs
/// a settled prompt (the `ok` delegation) and a pane closed mid-prompt (the transport lost: 3 or 4).
#[test]
fn o1_9_8_send_keys_safe_outcomes() {
    let case = |name: &str, inject: Value, agent_status: &str, never_working: bool| -> (Mock, PathBuf) {
        let m = Mock::new(name, json!({}));
        let mut a = agent("a1", "w1:p1", agent_status);
        a["never_working"] = json!(never_working);
        let mut inj = inject;
        let reg = registry(&m.td);
        if let Some(tok) = inj.get("started_token").and_then(Value::as_str).map(str::to_string) {
            inj["on_prompt_append"] =
                json!({"path": reg.join("j1/events.log").to_string_lossy(), "line": started_line(&tok)});
        }
        let state = json!({"running": true, "agents": [a], "inject": inj, "workspaces": [ws_v("w1", "", "/", 1)]});
        fs::write(&m.state, state.to_string()).unwrap();
        m.td.write("prompt.txt", "Job j1: read and follow /x/brief.md. Run first: true\n");
        (m, reg)
    };
    let sks = |m: &Mock, reg: &Path| {
        m.pane(&["send-keys-safe", "--target", "a1", "--prompt-file"])
            .args([m.td.path("prompt.txt")])
            .args(["--job", "j1", "--registry-dir"])
            .args([reg])
            .run()
    };
    // An agent that starts working: `agent prompt --wait --until working ...` returns at once -> 0
    // (mam waits for the agent's reaction, not for the end of its turn).
    let (m, reg) = case("o1_9_8a", json!({"prompt": "timeout"}), "idle", false);
    let r = sks(&m, &reg);
    r.expect_rc(0);
    assert!(r.stderr().contains("settled"), "{}", r.stderr());
    let prompt = m.calls_of(&["agent", "prompt"]).pop().unwrap();
    assert!(prompt.windows(2).any(|w| w[0] == "--until" && w[1] == "working"), "{prompt:?}");
    // agent_prompt_stalled + job started with the current token -> 0 (agent never reports working)
    let (m, reg) = case("o1_9_8b", json!({"prompt": "agent_prompt_stalled", "started_token": "tok1"}), "idle", true);
    let r = sks(&m, &reg);
    r.expect_rc(0);
    assert!(r.stderr().contains("job j1 reported started, which confirms delivery"), "{}", r.stderr());
    // started with another token -> 4
    let (m, reg) = case("o1_9_8c", json!({"prompt": "agent_prompt_stalled", "started_token": "other"}), "idle", true);
    let r = sks(&m, &reg);
    r.expect_rc(4);
    assert!(r.elapsed >= Duration::from_secs(2), "the grace was not waited");
    // only pane content change -> 4
    let (m, reg) = case("o1_9_8d", json!({"prompt": "timeout", "screen_changes": true}), "idle", true);
    sks(&m, &reg).expect_rc(4);
    // The CLI lost its server mid-call (herdr's plain-text `EmptyResponse`, exit 1): the text may be
    // in, so it is never typed again; unconfirmed -> 4.
    let (m, reg) = case("o1_9_8e", json!({"prompt": "transport_error"}), "idle", false);
    sks(&m, &reg).expect_rc(4);
    assert_eq!(m.calls_of(&["agent", "prompt"]).len(), 1, "typed once");
    // A24: an agent that stays busy -> rc 3 `agent busy`, nothing submitted.
    let (m, reg) = case("o1_9_8f", json!({}), "working", false);
    let r = sks(&m, &reg);
    r.expect_rc(3);
    assert!(r.stderr().contains("agent busy"), "{}", r.stderr());
    assert!(m.calls_of(&["agent", "prompt"]).is_empty());
    // Unknown target -> 3, nothing submitted.
    let (m, reg) = case("o1_9_8g", json!({}), "idle", false);
    let r = m
        .pane(&["send-keys-safe", "--target", "nosuch", "--prompt-file"])
        .args([m.td.path("prompt.txt")])
        .args(["--job", "j1", "--registry-dir"])
        .args([&reg])
        .run();
    r.expect_rc(3);
    assert!(m.calls_of(&["agent", "prompt"]).is_empty());
}

/// On the real herdr: `o1_9_9_real_herdr_cross_server_calls_reach_the_rows_server`.
#[test]
fn o1_9_9_cross_server_calls_carry_the_rows_server() {
    let m = Mock::new("o1_9_9", json!({}));
    // An agent that reacts to a prompt (works, then settles), so only the routing is in question.
    let mut a = agent("a1", "w1:p1", "idle");
    a["react"] = json!("settle");
    let state = json!({"running": true, "agents": [a], "workspaces": [ws_v("w1", "", "/", 1)]});
    fs::write(&m.state, state.to_string()).unwrap();
    m.td.write("prompt.txt", "hello\n");
    let caller = |c: Cmd| c.env("HERDR_SOCKET_PATH", "/tmp/server-a.sock").env("HERDR_SESSION", "A");
    caller(m.pane(&["ls", "--server", "B"])).run().expect_rc(0);
    caller(m.pane(&["status", "--target", "a1", "--server", "B"])).run().expect_rc(0);
    caller(m.pane(&["send-keys-safe", "--target", "a1", "--server", "B", "--prompt-file"]))
        .args([m.td.path("prompt.txt")])
        .run()
        .expect_rc(0);
    caller(m.pane(&["close", "--pane", "w1:p1", "--server", "B"])).run().expect_rc(0);
    let calls = m.calls();
    assert!(calls.len() >= 5, "{calls:?}");
    for c in calls {
        assert_eq!(c["env"]["HERDR_SESSION"], "B", "{c}");
        assert!(!c["env_names"].as_array().unwrap().contains(&json!("HERDR_SOCKET_PATH")), "{c}");
    }
}

/// On the real herdr: herdr_mam.rs's `o1_9_10_startup_dialog_is_answered_on_real_herdr`.
#[test]
fn o1_9_10_blocked_agent_gets_enter_at_most_three_times() {
    let m = Mock::new("o1_9_10", json!({"running": true, "inject": {"start_status": "blocked"}}));
    let dir = m.dir();
    let r = m.pane(&["new-session", "--agent", "claude", "--name", "a1", "--cwd", &dir]).run();
    r.expect_rc(1);
    assert!(r.stderr().contains("still blocked after 3"), "{}", r.stderr());
    assert_eq!(m.calls_of(&["pane", "send-keys"]).len(), 3);
    assert!(m.calls_of(&["pane", "send-keys"]).iter().all(|a| a[3] == "enter"));
    // Rollback: the workspace this attempt created is closed.
    assert_eq!(m.calls_of(&["workspace", "close"]).len(), 1);
    assert_eq!(m.sizes(), Vec::<usize>::new());
    // MAM_STARTUP_DIALOG_MAX bounds it.
    let m = Mock::new("o1_9_10b", json!({"running": true, "inject": {"start_status": "blocked"}}));
    let dir = m.dir();
    m.pane(&["new-session", "--agent", "claude", "--name", "a1", "--cwd", &dir])
        .env("MAM_STARTUP_DIALOG_MAX", "1")
        .run()
        .expect_rc(1);
    assert_eq!(m.calls_of(&["pane", "send-keys"]).len(), 1);
}

#[test]
fn pane_bad_input_is_refused() {
    let m = Mock::new("pane_bad", json!({"running": true}));
    let dir = m.dir();
    for name in ["a;rm -rf x", "A1", "a$(id)", ""] {
        let r = m.pane(&["new-session", "--agent", "claude", "--name", name, "--cwd", &dir]).run();
        r.expect_rc(2);
    }
    m.pane(&["new-session", "--agent", "claude", "--name", "a1", "--cwd", "/nonexistent/dir"]).run().expect_rc(2);
    m.pane(&["new-session", "--agent", "claude", "--name", "a1", "--cwd", &dir, "--env", "1X=y"]).run().expect_rc(2);
    m.pane(&["frobnicate"]).run().expect_rc(2);
    assert!(m.calls().is_empty(), "refusals happen before any herdr call");
    let r = m.td.mam().args(["--help"]).run();
    assert!(!r.stdout().contains("test-double"));
}

// ---------------------------------------------------------------------------------------------
// ORCH 1.9 test 11: the contract suite over real backends (fake always, tmux when installed)

/// One backend under test: the env that selects it, and cleanup on drop.
struct Harness {
    // Dropped first: stops the real herdr server and everything in its panes.
    herdr: Option<HerdrHome>,
    td: TestDir,
    backend: &'static str,
    env: Vec<(String, String)>,
    tmux_socket: Option<String>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(sock) = &self.tmux_socket {
            let socket_path =
                Command::new("tmux").args(["-L", sock, "display-message", "-p", "#{socket_path}"]).output();
            let _ = Command::new("tmux").args(["-L", sock, "kill-server"]).output();
            // tmux leaves its socket file behind.
            if let Ok(out) = socket_path {
                let p = String::from_utf8_lossy(&out.stdout).trim().to_string();
                if p.ends_with(sock.as_str()) {
                    let _ = fs::remove_file(p);
                }
            }
        }
        // Fake agents lead their own process group.
        for e in fs::read_dir(self.td.path("panes/panes")).into_iter().flatten().flatten() {
            if let Ok(pid) = fs::read_to_string(e.path().join("pid")).unwrap_or_default().trim().parse::<i32>() {
                let _ = mam::sys::kill(-pid, 9);
            }
        }
    }
}

impl Harness {
    /// The real herdr (a private server this test starts through mam and stops), or `None` (skip)
    /// when herdr is absent and not required.
    fn herdr(name: &str) -> Option<Harness> {
        let mut h = Harness::new("herdr", name);
        let home = HerdrHome::new(&h.td)?;
        home.link("claude", &mam_bin());
        h.env.retain(|(k, _)| k != "PATH");
        h.env.extend(home.env().into_iter().map(|(k, v)| (k, v.to_string_lossy().into_owned())));
        // herdr sees a dialog about 0.5 s after `agent start` returns (ORCH 1.5 step 7).
        h.env.push(("MAM_STARTUP_DIALOG_SETTLE_MS".into(), "1000".into()));
        h.herdr = Some(home);
        Some(h)
    }

    fn new(backend: &'static str, name: &str) -> Harness {
        let td = TestDir::new(name);
        // The agent executable `claude` is the mam binary (argv[0] = claude, A18).
        let (_, path) = claude_is_mam(&td);
        let mut env = vec![
            ("PATH".to_string(), path),
            ("MAM_PANE_BACKEND".to_string(), backend.to_string()),
            ("MAM_FAKE_AGENT_SCRIPT".to_string(), td.path("agent.script").to_string_lossy().into_owned()),
            ("MAM_AGENT_START_TIMEOUT_MS".into(), "20000".into()),
            ("MAM_TMUX_STABLE_MS".into(), "200".into()),
            ("SKS_DELIVERY_GRACE_S".into(), "3".into()),
            ("MAM_SKS_IDLE_WAIT_S".into(), "5".into()),
            ("MAM_SKS_POLL_MS".into(), "50".into()),
            ("MAM_SKS_QUIESCE_GAP_MS".into(), "100".into()),
            ("MAM_SKS_QUIESCE_S".into(), "2".into()),
        ];
        let mut tmux_socket = None;
        if backend == "tmux" {
            let s = format!("mam-test-{}", rand_hex(6));
            env.push(("MAM_TMUX_SOCKET".into(), s.clone()));
            tmux_socket = Some(s);
        } else {
            env.push(("MAM_FAKE_PANES_DIR".into(), td.path("panes").to_string_lossy().into_owned()));
        }
        td.write("agent.script", "exit_after=1\n");
        Harness { herdr: None, td, backend, env, tmux_socket }
    }

    fn pane(&self, args: &[&str]) -> Cmd {
        let mut c = self.td.mam().args(["pane"]).args(args);
        for (k, v) in &self.env {
            c = c.env(k, v);
        }
        c
    }

    fn start(&self, name: &str, cwd: &str, extra: &[&str]) -> String {
        let mut a = vec!["new-session", "--agent", "claude", "--name", name, "--cwd", cwd];
        a.extend_from_slice(extra);
        a.extend_from_slice(&["--", "test-double", "agent"]);
        let r = self.pane(&a).run();
        r.expect_rc(0);
        r.stdout()
    }

    fn status(&self, name: &str) -> String {
        let r = self.pane(&["status", "--target", name]).run();
        r.expect_rc(0);
        r.stdout().trim().to_string()
    }

    /// A brief in the registry whose start line appends a `started` with `token` and writes `flag`.
    fn brief(&self, reg: &Path, token: &str) -> PathBuf {
        let events = reg.join("j1/events.log");
        let flag = self.td.path("flag.txt");
        let text = format!(
            "# Job j1\n\n## Commands\n- start: echo '{}' >> '{}'; printf '%s|%s' \"$MY_TEST_FLAG\" \"$PWD\" > '{}'\n- success: echo done >> '{}'\n\n## Output Report Path\n{}\n",
            started_line(token),
            events.display(),
            flag.display(),
            reg.join("done.txt").display(),
            reg.join("j1/report.md").display()
        );
        self.td.write("reg/j1/brief.md", text)
    }

    fn sks(&self, target: &str, reg: &Path, extra_env: &[(&str, &str)]) -> Run {
        // Only a `started` written after this injection may confirm it.
        let _ = fs::remove_file(reg.join("j1/events.log"));
        let prompt = format!("Job j1: read and follow {}. Run first: see the brief", reg.join("j1/brief.md").display());
        let pf = self.td.write("prompt.txt", format!("{prompt}\n"));
        let mut c = self
            .pane(&["send-keys-safe", "--target", target, "--prompt-file"])
            .args([&pf])
            .args(["--job", "j1", "--registry-dir"])
            .args([reg]);
        for (k, v) in extra_env {
            c = c.env(k, v);
        }
        c.run()
    }
}

fn contract_suite(h: &Harness) {
    let proj = h.td.path("proj");
    fs::create_dir_all(&proj).unwrap();
    let dir = proj.to_str().unwrap();
    // Test 4: packing 4 + 2.
    let mut placed = Vec::new();
    for i in 0..6 {
        let out = h.start(&format!("a{i}"), dir, &[]);
        placed.push((kv(&out, "PANE"), kv(&out, "WORKSPACE")));
        assert_eq!(kv(&out, "REUSED"), "0");
    }
    let first = &placed[0].1;
    assert_eq!(placed.iter().filter(|p| &p.1 == first).count(), 4, "{placed:?}");
    assert_eq!(placed.iter().filter(|p| &p.1 != first).count(), 2, "{placed:?}");
    let ls = h.pane(&["ls"]).run();
    ls.expect_rc(0);
    assert_eq!(ls.stdout().lines().count(), 6, "{}", ls.stdout());
    if h.backend == "fake" {
        // A18: the fake agent runs with argv[0] set to its kind, so the ancestor rule finds it.
        let pane_dir = h.td.path("panes/panes").join(&placed[0].0);
        let pid: i32 = fs::read_to_string(pane_dir.join("pid")).unwrap().trim().parse().unwrap();
        assert_eq!(mam::sys::proc_cmdline(pid).unwrap()[0], b"claude");
    }
    let st = h.status("a0");
    assert!(["idle", "unknown"].contains(&st.as_str()), "{st}");
    // Test 8: delivery confirmed by the job's own started with the current token (and the lines run
    // from / with the pane's environment).
    let reg = registry(&h.td);
    h.brief(&reg, "tok1");
    let stalled: &[(&str, &str)] = &[("MAM_FAKE_PROMPT_RESULT", "stalled")];
    let r = h.sks("a5", &reg, stalled);
    r.expect_rc(0);
    wait_until("success line", Duration::from_secs(10), || reg.join("done.txt").exists());
    let flag = fs::read_to_string(h.td.path("flag.txt")).unwrap();
    assert_eq!(flag, "|/", "no MY_TEST_FLAG for a5, and the line ran from /");
    // exit_after=1: a5 is gone and its pane is idle again (herdr notices an exited agent late).
    let gone = Duration::from_secs(if h.backend == "herdr" { 30 } else { 10 });
    wait_until("a5 exits", gone, || h.status("a5") == "absent");
    // Test 5: the idle pane in the second workspace is reused (no env).
    let out = h.start("b0", dir, &[]);
    assert_eq!(kv(&out, "REUSED"), "1");
    assert_eq!(kv(&out, "PANE"), placed[5].0);
    // Test 7: with env flags the idle pane is not used and the agent sees them. Make a4 idle first.
    fs::remove_file(reg.join("done.txt")).unwrap();
    h.sks("a4", &reg, stalled).expect_rc(0);
    wait_until("a4 exits", gone, || h.status("a4") == "absent");
    let out = h.start("c0", dir, &["--env", "MY_TEST_FLAG=active"]);
    assert_eq!(kv(&out, "REUSED"), "0");
    assert_ne!(kv(&out, "PANE"), placed[4].0);
    assert_eq!(kv(&out, "WORKSPACE"), placed[4].1, "the second workspace still has room");
    if let Some(home) = &h.herdr {
        // Test 7 on the real herdr: the env went to the pane, never into the agent's argv.
        assert_eq!(home.agent_process(&kv(&out, "PANE")).1, ["claude", "test-double", "agent"]);
    }
    h.brief(&reg, "tok1");
    h.sks("c0", &reg, stalled).expect_rc(0);
    wait_until("c0 flag", Duration::from_secs(10), || {
        fs::read_to_string(h.td.path("flag.txt")).is_ok_and(|f| f == "active|/")
    });
    // Test 8: a started with another token is not delivery evidence -> 4; unknown target -> 3.
    // A new dispatch of j1 (token tok2): earlier `started` lines carry tok1 only.
    fs::write(reg.join("j1.json"), json!({"job_id": "j1", "status": "pending", "dispatch_token": "tok2"}).to_string())
        .unwrap();
    if h.backend == "fake" {
        h.td.write("agent.script", "exit_after=0\nreport_working=0\n");
        h.start("d0", dir, &[]);
        h.brief(&reg, "other");
        let r = h.sks("d0", &reg, &[("MAM_FAKE_PROMPT_RESULT", "timeout")]);
        r.expect_rc(4);
        h.sks("d0", &reg, &[("MAM_FAKE_PROMPT_RESULT", "transport_error")]).expect_rc(3);
    } else if h.backend == "herdr" {
        // An agent that never shows working and never starts: herdr answers agent_prompt_stalled
        // after 5 s although the text was typed; mam counts it accepted, never types it again, and
        // without the job's started it is unconfirmed.
        h.td.write("agent.script", "exit_after=0\nnever_start=1\nreport_working=0\n");
        h.start("d0", dir, &[]);
        let r = h.sks("d0", &reg, &[]);
        r.expect_rc(4);
        assert!(r.stderr().contains("agent_prompt_stalled"), "{}", r.stderr());
        let screen = h.herdr.as_ref().unwrap().herdr(&["agent", "read", "d0", "--source", "recent"]).stdout();
        // The pane may have hosted an earlier agent: d0's part starts at its last "ready".
        let mine = &screen[screen.rfind("fake agent ready").unwrap_or(0)..];
        assert_eq!(mine.matches("prompt 1: Job j1").count(), 1, "typed once: {screen:?}");
        assert_eq!(mine.matches("prompt 2:").count(), 0, "typed once: {screen:?}");
    } else {
        h.td.write("agent.script", "exit_after=0\nnever_start=1\n");
        h.start("d0", dir, &[]);
        h.sks("d0", &reg, &[]).expect_rc(4);
    }
    h.sks("nosuch", &reg, &[]).expect_rc(3);
    assert_eq!(h.status("nosuch"), "absent");
    // Bad name: refused before anything is placed.
    h.pane(&["new-session", "--agent", "claude", "--name", "x;touch y", "--cwd", dir]).run().expect_rc(2);
    // Close every pane; nothing is left alive.
    let ls = h.pane(&["ls"]).run();
    for line in ls.stdout().lines() {
        let pane = line.split('\t').nth(1).unwrap();
        h.pane(&["close", "--pane", pane]).run().expect_rc(0);
    }
    let ls = h.pane(&["ls"]).run();
    assert!(ls.stdout().is_empty(), "{}", ls.stdout());
}

#[test]
fn o1_9_11_contract_fake_backend() {
    let h = Harness::new("fake", "o1_9_11_fake");
    contract_suite(&h);
    // Fake agents are gone once their panes are closed.
    for e in fs::read_dir(h.td.path("panes/panes")).unwrap().flatten() {
        let pid: i32 = fs::read_to_string(e.path().join("pid")).unwrap().trim().parse().unwrap();
        assert!(!mam::sys::process_exists(pid) || mam::sys::proc_start_ticks(pid).is_ok_and(|t| t.1));
    }
}

#[test]
fn o1_9_11_contract_tmux_backend() {
    if !have_tool("tmux", "MAM_REQUIRE_TMUX") {
        return;
    }
    let h = Harness::new("tmux", "o1_9_11_tmux");
    contract_suite(&h);
}

#[test]
fn o1_9_11_contract_real_herdr() {
    let Some(h) = Harness::herdr("o1_9_11_herdr") else { return };
    contract_suite(&h);
}

/// ORCH 1.9 tests 2 and 1 on the real herdr, in one world: with no server, `MAM_NO_AUTOSTART=1`
/// commands start none (`ls` says `NOTE: no server running`, exit 1); then the server mam bootstraps
/// has, in its own `/proc/<pid>/environ`, none of the denylisted markers and no HERDR_SOCKET_PATH,
/// but the user's CLAUDE_PROJECT_DIR.
#[test]
fn o1_9_1_2_real_herdr_no_autostart_then_bootstrap_env_denylist() {
    let Some(h) = Harness::herdr("o1_9_12_herdr") else { return };
    let home = h.herdr.as_ref().unwrap();
    let proj = h.td.path("proj");
    fs::create_dir_all(&proj).unwrap();
    // Test 2.
    let r = h.pane(&["ls"]).run();
    r.expect_rc(1);
    assert_eq!(r.stderr().trim(), "NOTE: no server running");
    assert_eq!(r.stdout(), "");
    assert_eq!(h.status("a1"), "absent");
    let r = h
        .pane(&["new-session", "--agent", "claude", "--name", "a1", "--cwd", proj.to_str().unwrap()])
        .env("MAM_NO_AUTOSTART", "1")
        .run();
    r.expect_rc(1);
    let want = format!("server {} not running (MAM_NO_AUTOSTART=1)", home.session);
    assert!(r.stderr().contains(&want), "{}", r.stderr());
    let mut st = h.td.mam();
    for (k, v) in &h.env {
        st = st.env(k, v);
    }
    st.args(["status"]).run().expect_rc(0);
    assert!(!home.answers(), "a server was started");
    assert!(home.processes().is_empty(), "{:?}", home.processes());
    // Test 1.
    let mut c = h
        .pane(&["server-start"])
        .env("CLAUDE_PROJECT_DIR", "/proj/cfg")
        .env("HERDR_SOCKET_PATH", "/tmp/a.sock")
        .env("HERDR_SESSION", "other");
    for d in DENIED {
        c = c.env(d, "marker");
    }
    let r = c.run();
    r.expect_rc(0);
    assert_eq!(r.stdout().trim(), format!("SERVER={}", home.session));
    let servers: Vec<i32> = home
        .processes()
        .into_iter()
        .filter(|(_, a)| a.contains(&format!("--session {} server", home.session)))
        .map(|p| p.0)
        .collect();
    assert_eq!(servers.len(), 1, "exactly one server: {:?}", home.processes());
    let env = environ(servers[0]);
    let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
    for d in DENIED {
        assert!(!names.contains(d), "{d} reached the bootstrapped server");
    }
    assert!(!names.contains(&"HERDR_SOCKET_PATH"), "{names:?}");
    assert!(env.iter().any(|(k, v)| k == "CLAUDE_PROJECT_DIR" && v == "/proj/cfg"), "{names:?}");
    let log = h.td.ws().join(format!(".mam/logs/herdr-server-{}.log", home.session));
    assert!(log.is_file(), "{}", log.display());
    assert!(home.answers());
}

/// ORCH 1.9 test 6 on the real herdr: two workspaces of one cwd, the first full (four panes whose
/// foreground is not a shell), the second with room: the agent placed with `MAM_WS_LABEL` renames the
/// second only; once both are full, the workspace created for the next one carries the label and
/// nothing else is renamed (labels from `herdr workspace list`).
#[test]
fn o1_9_6_real_herdr_ws_label_renames_only_the_chosen_workspace() {
    let Some(h) = Harness::herdr("o1_9_6_herdr") else { return };
    let home = h.herdr.as_ref().unwrap();
    let proj = h.td.path("proj");
    fs::create_dir_all(&proj).unwrap();
    let dir = fs::canonicalize(&proj).unwrap().to_string_lossy().into_owned();
    h.pane(&["server-start"]).run().expect_rc(0);
    h.td.write("agent.script", "report_working=0\n");
    // A pane busy with `sleep` (neither an agent nor an idle shell).
    let busy = |pane: &str| {
        home.herdr(&["pane", "run", pane, "sleep 600"]).expect_rc(0);
        wait_until(&format!("sleep in {pane}"), Duration::from_secs(10), || {
            home.pane_processes(pane).iter().any(|(_, a)| a.first().is_some_and(|a0| a0 == "sleep"))
        });
    };
    let workspace = |label: &str| -> String {
        let v = home.herdr_json(&["workspace", "create", "--cwd", &dir, "--label", label, "--no-focus"]);
        v["result"]["root_pane"]["pane_id"].as_str().unwrap_or_else(|| panic!("{v}")).to_string()
    };
    let split = |pane: &str, d: &str| -> String {
        let v = home.herdr_json(&["pane", "split", pane, "--direction", d, "--cwd", &dir, "--no-focus"]);
        v["result"]["pane"]["pane_id"].as_str().unwrap_or_else(|| panic!("{v}")).to_string()
    };
    let p1 = workspace("one");
    let p2 = split(&p1, "right");
    let p3 = split(&p1, "down");
    let p4 = split(&p2, "down");
    for p in [&p1, &p2, &p3, &p4] {
        busy(p);
    }
    let q1 = workspace("two");
    busy(&q1);
    let labels = || home.workspaces().into_iter().map(|w| w.1).collect::<Vec<_>>();
    assert_eq!(labels(), ["one", "two"]);
    let r = h.pane(&["new-session", "--agent", "claude", "--name", "a6", "--cwd", &dir, "--", "test-double", "agent"]);
    let r = r.env("MAM_WS_LABEL", "lbl").run();
    r.expect_rc(0);
    assert_eq!(kv(&r.stdout(), "WORKSPACE"), home.workspaces()[1].0, "{}", r.stdout());
    assert_eq!(labels(), ["one", "lbl"], "only the chosen workspace is renamed");
    // Both full: a created workspace carries the label and nothing is renamed.
    let a6 = kv(&r.stdout(), "PANE");
    let q3 = split(&q1, "down");
    let q4 = split(&a6, "down");
    busy(&q3);
    busy(&q4);
    let r = h.pane(&["new-session", "--agent", "claude", "--name", "a9", "--cwd", &dir, "--", "test-double", "agent"]);
    r.env("MAM_WS_LABEL", "new").run().expect_rc(0);
    assert_eq!(labels(), ["one", "lbl", "new"]);
}

/// ORCH 1.9 test 9 on the real herdr: a caller that sits in server A (its HERDR_SESSION and
/// HERDR_SOCKET_PATH) operating on a row of server B reaches B for every call: B's agent is listed,
/// its status read, a prompt delivered and its pane closed, while A never sees it. (Were A's socket
/// or session used, none of these would find the agent.) Also 1.9 test 3's Confirmed half: the `ls`
/// line of a live agent.
#[test]
fn o1_9_9_real_herdr_cross_server_calls_reach_the_rows_server() {
    let Some(h) = Harness::herdr("o1_9_9_herdr") else { return };
    let home = h.herdr.as_ref().unwrap();
    let b = home.session.clone();
    let a = format!("mam-a-{}", rand_hex(3));
    h.pane(&["server-start", "--server", &a]).run().expect_rc(0);
    let proj = h.td.path("proj");
    fs::create_dir_all(&proj).unwrap();
    let pane = kv(&h.start("a1", proj.to_str().unwrap(), &[]), "PANE");
    let sock = home.config.join("herdr/sessions").join(&a).join("herdr.sock");
    assert!(sock.exists(), "{}", sock.display());
    let caller = |args: &[&str]| h.pane(args).env("HERDR_SOCKET_PATH", &sock).env("HERDR_SESSION", &a);
    let r = caller(&["ls", "--server", &b]).run();
    r.expect_rc(0);
    assert_eq!(r.stdout(), format!("a1\t{pane}\tclaude\tidle\n"));
    let r = caller(&["ls", "--server", &b, "--json"]).run();
    r.expect_rc(0);
    let v: Value = serde_json::from_str(&r.stdout()).unwrap();
    assert_eq!(v[0]["name"], "a1");
    let r = caller(&["status", "--target", "a1", "--server", &b]).run();
    r.expect_rc(0);
    assert_eq!(r.stdout().trim(), "idle");
    let pf = h.td.write("prompt.txt", "hello\n");
    let r = caller(&["send-keys-safe", "--target", "a1", "--server", &b, "--prompt-file"]).args([&pf]).run();
    r.expect_rc(0);
    wait_until("the prompt reached B's agent", Duration::from_secs(10), || {
        home.herdr(&["pane", "read", &pane, "--source", "recent"]).stdout().contains("prompt 1: hello")
    });
    caller(&["close", "--pane", &pane, "--server", &b]).run().expect_rc(0);
    assert!(!home.pane_ids().contains(&pane), "B's pane was closed");
    // Server A never saw the agent.
    let r = h.pane(&["ls", "--server", &a]).run();
    r.expect_rc(0);
    assert_eq!(r.stdout(), "");
}

#[test]
fn tmux_start_refuses_a_pane_that_is_not_at_a_shell() {
    if !have_tool("tmux", "MAM_REQUIRE_TMUX") {
        return;
    }
    let h = Harness::new("tmux", "tmux_not_shell");
    let sock = h.tmux_socket.clone().unwrap();
    let proj = h.td.path("proj");
    fs::create_dir_all(&proj).unwrap();
    let first = h.start("a0", proj.to_str().unwrap(), &[]);
    let pane = kv(&first, "PANE");
    // a0's pane runs the agent, not a shell: starting another agent there is refused.
    let ctx = mam::ctx::Ctx::with_env(h.env.iter().cloned(), &h.td.ws());
    let b = mam::pane::open(&ctx, Some(&sock)).unwrap();
    let e = b.start_agent("a1", "claude", &pane, &[]).unwrap_err();
    assert!(e.to_string().contains("is not at a shell"), "{e}");
    let out = Command::new("tmux").args(["-L", &sock, "list-panes", "-a"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 1);
}

#[test]
fn fake_agent_runs_brief_lines_as_written_without_workspace_variables() {
    let h = Harness::new("fake", "fake_agent_brief");
    let out = h.td.path("out dir");
    fs::create_dir_all(&out).unwrap();
    let q = |name: &str| format!("'{}'", out.join(name).display());
    h.td.write(
        "agent.script",
        format!(
            "verdict=PASS\nreport_text=all good\nspawn_subjob=printf %s \"$MAM_PARENT_JOB_ID\" > {}\ntouch_during_review={}\n",
            q("parent.txt"),
            out.join("touched.txt").display()
        ),
    );
    let proj = h.td.path("proj");
    fs::create_dir_all(&proj).unwrap();
    let mut extra = vec![];
    for kv in [
        "WORKSPACE_ROOT=/bogus",
        "MAM_JOBS_DIR=/bogus/jobs",
        "DELEGATE_JOB_LOGS_DIR=/b",
        "AGENT_SESSIONS_YAML=/b/s.json",
    ] {
        extra.extend(["--env", kv]);
    }
    extra.extend(["--env", "KEEP_ME=1"]);
    h.start("a0", proj.to_str().unwrap(), &extra);
    let reg = registry(&h.td);
    let brief = format!(
        "# Job j1\n\n## Commands\n- start: env > {}\n- success: echo ok > {}\n- error: echo err > {}\n\n## Output Report Path\n{}\n",
        q("env.txt"),
        q("success.txt"),
        q("error.txt"),
        reg.join("j1/report.md").display()
    );
    h.td.write("reg/j1/brief.md", &brief);
    h.sks("a0", &reg, &[]).expect_rc(0);
    wait_until("success line", Duration::from_secs(10), || out.join("success.txt").exists());
    let env = fs::read_to_string(out.join("env.txt")).unwrap();
    assert!(env.lines().any(|l| l == "KEEP_ME=1"), "the pane's env reaches the agent");
    assert!(env.lines().any(|l| l == "PWD=/"), "lines run from an unrelated cwd");
    for k in ["WORKSPACE_ROOT=", "MAM_JOBS_DIR=", "DELEGATE_JOB_LOGS_DIR=", "AGENT_SESSIONS_YAML="] {
        assert!(!env.lines().any(|l| l.starts_with(k)), "{k} reached a brief line");
    }
    assert_eq!(fs::read_to_string(out.join("parent.txt")).unwrap(), "j1");
    assert!(out.join("touched.txt").exists());
    assert_eq!(fs::read_to_string(reg.join("j1/report.md")).unwrap(), "all good\nVERDICT: PASS\n");
    assert!(!out.join("error.txt").exists());
    // verdict=error runs the error line instead.
    h.td.write("agent.script", "verdict=error\n");
    h.start("a1", proj.to_str().unwrap(), &[]);
    h.sks("a1", &reg, &[]).expect_rc(0);
    wait_until("error line", Duration::from_secs(10), || out.join("error.txt").exists());
    // crash_after_s: the agent dies abruptly mid-work and never runs the success line.
    fs::remove_file(out.join("success.txt")).unwrap();
    h.td.write("agent.script", "crash_after_s=0.2\nwork_s=30\n");
    h.start("a2", proj.to_str().unwrap(), &[]);
    h.sks("a2", &reg, &[]).expect_rc(0);
    wait_until("a2 crashed", Duration::from_secs(10), || h.status("a2") == "absent");
    assert!(!out.join("success.txt").exists());
    for a in ["a0", "a1"] {
        let pane = h
            .pane(&["ls"])
            .run()
            .stdout()
            .lines()
            .find(|l| l.starts_with(a))
            .unwrap()
            .split('\t')
            .nth(1)
            .unwrap()
            .to_string();
        h.pane(&["close", "--pane", &pane]).run().expect_rc(0);
    }
}

#[test]
fn o1_9_1_tmux_server_env_denylist_and_no_autostart() {
    if !have_tool("tmux", "MAM_REQUIRE_TMUX") {
        return;
    }
    let h = Harness::new("tmux", "tmux_denylist");
    let sock = h.tmux_socket.clone().unwrap();
    let proj = h.td.path("proj");
    fs::create_dir_all(&proj).unwrap();
    let dir = proj.to_str().unwrap();
    // No server: ls says so; a mutating command under MAM_NO_AUTOSTART=1 starts none.
    let r = h.pane(&["ls"]).run();
    r.expect_rc(1);
    assert_eq!(r.stderr().trim(), "NOTE: no server running");
    let r =
        h.pane(&["new-session", "--agent", "claude", "--name", "a0", "--cwd", dir]).env("MAM_NO_AUTOSTART", "1").run();
    r.expect_rc(1);
    assert!(r.stderr().contains(&format!("server {sock} not running (MAM_NO_AUTOSTART=1)")), "{}", r.stderr());
    assert!(!Command::new("tmux").args(["-L", &sock, "list-sessions"]).output().unwrap().status.success());
    // The server that new-session starts inherits no runtime marker, but user configuration.
    let mut c =
        h.pane(&["new-session", "--agent", "claude", "--name", "a0", "--cwd", dir, "--", "test-double", "agent"]);
    for d in DENIED {
        c = c.env(d, "marker");
    }
    // Issue 30: nor the knobs of the command that started it (every later pane would inherit them).
    let per_command = ["MAM_ACK_TIMEOUT_S", "MAM_SKS_IDLE_WAIT_S", "SKS_DELIVERY_GRACE_S", "MAM_HEARTBEAT_SEC"];
    for k in per_command {
        c = c.env(k, "90");
    }
    c.env("CLAUDE_PROJECT_DIR", "/proj/cfg").run().expect_rc(0);
    let out = Command::new("tmux").args(["-L", &sock, "show-environment", "-g"]).output().unwrap();
    let env = String::from_utf8_lossy(&out.stdout).into_owned();
    for d in DENIED.iter().chain(&per_command) {
        assert!(!env.lines().any(|l| l.starts_with(&format!("{d}="))), "{d} reached the tmux server");
    }
    assert!(env.lines().any(|l| l == "CLAUDE_PROJECT_DIR=/proj/cfg"), "{env}");
}

#[test]
fn fake_backend_ls_without_state_is_no_server() {
    let h = Harness::new("fake", "fake_noserver");
    let r = h.pane(&["ls"]).run();
    r.expect_rc(1);
    assert_eq!(r.stderr().trim(), "NOTE: no server running");
    let proj = h.td.path("proj");
    fs::create_dir_all(&proj).unwrap();
    h.pane(&["new-session", "--agent", "claude", "--name", "a0", "--cwd", proj.to_str().unwrap()])
        .env("MAM_NO_AUTOSTART", "1")
        .run()
        .expect_rc(1);
    assert!(!h.td.path("panes").exists());
}

/// Security (issue 12, item 10): a prompt that carries `\r` or ESC would submit early or end a
/// bracketed paste and type the rest as commands; it is refused before the backend sees it.
#[test]
fn prompts_with_control_characters_never_reach_the_pane() {
    let h = Harness::new("fake", "sks_control_chars");
    let proj = h.td.path("proj");
    fs::create_dir_all(&proj).unwrap();
    h.td.write("agent.script", "exit_after=0\n");
    h.start("a0", proj.to_str().unwrap(), &[]);
    let marker = h.td.path("owned");
    let inbox = h.td.path("panes/panes").join(kv(&h.start("a1", proj.to_str().unwrap(), &[]), "PANE")).join("inbox");
    let before = fs::read(&inbox).unwrap_or_default();
    for (i, bad) in [
        format!("hello\x1b[201~touch {}\r", marker.display()),
        format!("first line\rtouch {}", marker.display()),
        "bell\x07".to_string(),
    ]
    .iter()
    .enumerate()
    {
        let pf = h.td.write(&format!("bad{i}.txt"), format!("{bad}\n"));
        let r = h.pane(&["send-keys-safe", "--target", "a1", "--prompt-file"]).args([&pf]).run();
        r.expect_rc(2);
        assert!(r.stderr().contains("control character"), "{}", r.stderr());
    }
    assert_eq!(fs::read(&inbox).unwrap_or_default(), before, "nothing was typed into the pane");
    assert!(!marker.exists());
    // A CRLF line ending is only a line ending.
    let pf = h.td.write("ok.txt", "just text\r\n");
    let r = h.pane(&["send-keys-safe", "--target", "a1", "--prompt-file"]).args([&pf]).run();
    assert_ne!(r.rc(), 2, "{}", r.stderr());
}

/// The `pane` cases of `exitcodes::exit_codes_every_documented_case_happens`, on the mock: `ls`
/// 0, no server 1, usage 2, state unknown 3; `send-keys-safe` to an unknown target 3, a prompt
/// accepted but never confirmed 4.
pub(crate) fn exit_code_cases(codes: &crate::exitcodes::Codes) {
    let ok = json!({"running": true, "agents": [agent("a1", "w1:p1", "idle")], "workspaces": [ws_v("w1", "", "/", 1)]});
    let m = Mock::new("codes_pane", ok.clone());
    let set = |state: Value| fs::write(&m.state, state.to_string()).unwrap();
    codes.saw("pane", "ls", &m.pane(&["ls"]).run(), 0);
    codes.saw("pane", "unknown flag", &m.pane(&["ls", "--no-such"]).run(), 2);
    let mut garbage = ok.clone();
    garbage["inject"] = json!({"agent_list": "garbage"});
    set(garbage);
    codes.saw("pane", "ls, state unknown", &m.pane(&["ls"]).run(), 3);
    set(json!({"running": false}));
    codes.saw("pane", "ls, no server", &m.pane(&["ls"]).run(), 1);
    let mut changes = ok.clone();
    changes["agents"][0]["never_working"] = json!(true);
    changes["inject"] = json!({"prompt": "timeout", "screen_changes": true});
    set(changes);
    let reg = registry(&m.td);
    m.td.write("prompt.txt", "Job j1: read and follow /x/brief.md. Run first: true\n");
    let sks = |target: &str| {
        m.pane(&["send-keys-safe", "--target", target, "--prompt-file"])
            .args([m.td.path("prompt.txt")])
            .args(["--job", "j1", "--registry-dir"])
            .args([&reg])
            .run()
    };
    codes.saw("pane", "send-keys-safe, unknown target", &sks("nosuch"), 3);
    codes.saw("pane", "send-keys-safe, unconfirmed", &sks("a1"), 4);
}
