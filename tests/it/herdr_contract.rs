//! The herdr contract (issue 11): the same scenarios, lists of herdr command lines with placeholders
//! for ids, run against the mock herdr (`mam test-double herdr`) and against the real herdr 0.8.0,
//! comparing what mam sees: exit code, which streams are empty, the JSON documents with volatile
//! values (terminal ids, revision, cwd, scroll, pids, messages) masked, error codes, reads being
//! plain text, and the timing of `agent prompt --wait` outcomes.
//!
//! The mock side always runs and is checked against each step's expectation; the real side runs when
//! `HERDR_BIN` is set or `herdr` is on PATH (required under `MAM_REQUIRE_HERDR=1`), each server with
//! its own HOME and XDG directories under the test's directory, stopped (and any process left behind
//! killed) on drop. `ContractHerdr` is this file's private fixture, to be swapped for the shared one
//! in `support` once it exists.

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::*;

// ---------------------------------------------------------------------------------------------
// The private fixture: one herdr (mock or real) with a private HOME

/// The real herdr binary, or `None` (a failure under `MAM_REQUIRE_HERDR=1`).
fn real_herdr() -> Option<PathBuf> {
    herdr_bin()
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Side {
    Mock,
    Real,
}

/// One herdr to run scenarios against. Private to this file (see the module doc).
struct ContractHerdr {
    side: Side,
    td: TestDir,
    program: PathBuf,
    env: Vec<(String, String)>,
    server: Option<Child>,
}

impl ContractHerdr {
    fn new(side: Side, name: &str, real: Option<&Path>) -> ContractHerdr {
        let td = TestDir::new(name);
        fs::create_dir_all(td.path("proj")).unwrap();
        // The agent kind `claude` is the mam binary; `claude test-double agent` is the fake agent.
        let (bin, path) = claude_is_mam(&td);
        let home = td.path("h");
        let config = home.join(".config");
        let run = td.path("run");
        fs::create_dir_all(config.join("herdr")).unwrap();
        fs::create_dir_all(&run).unwrap();
        fs::set_permissions(&run, fs::Permissions::from_mode(0o700)).unwrap();
        fs::write(
            config.join("herdr/config.toml"),
            "onboarding = false\n[terminal]\ndefault_shell = \"/bin/bash\"\n[update]\nversion_check = false\nmanifest_check = false\n",
        )
        .unwrap();
        let program = match side {
            Side::Real => real.expect("real herdr").to_path_buf(),
            Side::Mock => {
                let script = format!("#!/usr/bin/env bash\nexec '{}' test-double herdr \"$@\"\n", mam_bin().display());
                fs::write(bin.join("herdr"), script).unwrap();
                fs::set_permissions(bin.join("herdr"), fs::Permissions::from_mode(0o755)).unwrap();
                bin.join("herdr")
            }
        };
        let s = |p: &Path| p.to_string_lossy().into_owned();
        let mut env = vec![
            ("PATH".to_string(), path),
            ("HOME".into(), s(&home)),
            ("XDG_CONFIG_HOME".into(), s(&config)),
            ("XDG_STATE_HOME".into(), s(&home.join(".local/state"))),
            ("XDG_CACHE_HOME".into(), s(&home.join(".cache"))),
            ("XDG_DATA_HOME".into(), s(&home.join(".local/share"))),
            ("XDG_RUNTIME_DIR".into(), s(&run)),
            ("HERDR_DISABLE_SOUND".into(), "1".into()),
            ("HERDR_SESSION".into(), format!("c{}", rand_hex(6))),
            // The scenarios' agent never changes state (the mock's default reaction): no working title.
            ("MAM_FAKE_AGENT_SCRIPT".into(), s(&td.write("agent.script", "report_working=0\n"))),
        ];
        if side == Side::Mock {
            env.push(("MAM_MOCK_STATE".into(), s(&td.path("mock-state.json"))));
            env.push(("MAM_MOCK_LOG".into(), s(&td.path("mock-log.jsonl"))));
        }
        ContractHerdr { side, td, program, env, server: None }
    }

    fn session(&self) -> String {
        self.env.iter().find(|(k, _)| k == "HERDR_SESSION").map(|(_, v)| v.clone()).unwrap()
    }

    fn herdr(&self, args: &[String]) -> Run {
        let mut c = self.td.command(&self.program).args(args).cwd(self.td.path("proj"));
        for (k, v) in &self.env {
            c = c.env(k, v);
        }
        c.run_within(Duration::from_secs(60))
    }

    /// `herdr --session NAME server`: the mock records it and returns; the real one stays in the
    /// foreground, so it runs as a child until the CLI answers.
    fn start(&mut self) {
        let args = vec!["--session".to_string(), self.session(), "server".to_string()];
        match self.side {
            Side::Mock => {
                self.herdr(&args).expect_rc(0);
            }
            Side::Real => {
                let mut c = Command::new(&self.program);
                c.args(&args).env_clear().current_dir(self.td.path("proj")).stdin(Stdio::null());
                c.stdout(fs::File::create(self.td.path("server.out")).unwrap());
                c.stderr(fs::File::create(self.td.path("server.err")).unwrap());
                for (k, v) in &self.env {
                    c.env(k, v);
                }
                self.server = Some(c.spawn().expect("spawn herdr server"));
                let list = vec!["agent".to_string(), "list".to_string()];
                wait_until("the herdr server answers", Duration::from_secs(20), || self.herdr(&list).rc() == 0);
            }
        }
    }

    /// Processes whose environment names this fixture's directory: the server, its shells, agents.
    fn leftovers(&self) -> Vec<i32> {
        let needle = self.td.root.to_string_lossy().into_owned();
        let me = std::process::id() as i32;
        mam::sys::list_pids()
            .unwrap_or_default()
            .into_iter()
            .filter(|&pid| pid != me)
            .filter(|pid| {
                fs::read(format!("/proc/{pid}/environ"))
                    .is_ok_and(|e| e.split(|b| *b == 0).any(|kv| String::from_utf8_lossy(kv).contains(&needle)))
            })
            .collect()
    }
}

impl Drop for ContractHerdr {
    fn drop(&mut self) {
        let Some(mut child) = self.server.take() else { return };
        let _ = self.herdr(&["server".to_string(), "stop".to_string()]);
        if exit_within(&mut child, Duration::from_secs(10)).is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let left = self.leftovers();
            if left.is_empty() {
                break;
            }
            for pid in &left {
                let _ = mam::sys::kill(*pid, 9);
            }
            if Instant::now() >= deadline {
                eprintln!("herdr contract: processes left behind after kill: {left:?}");
                break;
            }
            pause_until(Instant::now() + Duration::from_millis(20)); // not a sync: gives SIGKILL time to land
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Steps, observations, expectations

/// What a step must show on both sides.
#[derive(Clone, Copy, Debug)]
enum Expect {
    /// rc 0, a `{"id", "result": {"type": T}}` document on stdout, stderr empty.
    Doc(&'static str),
    /// rc 0, both streams empty.
    Silent,
    /// rc 0, plain (non-JSON, non-empty) text on stdout, stderr empty.
    Text,
    /// rc 1, stdout empty, a JSON error document with this code on stderr.
    Error(&'static str),
    /// stdout empty, plain text on stderr, this exit code (2: usage errors).
    Plain(i32),
}

struct Step {
    args: Vec<&'static str>,
    expect: Expect,
    /// (placeholder, JSON pointer into stdout) captured after the step.
    capture: Vec<(&'static str, &'static str)>,
    /// Retried (within 20 s) until stdout is non-empty: a shell's first prompt takes a moment.
    until_output: bool,
    /// Both sides must answer within this window (ms since the call started).
    within: Option<(u64, u64)>,
}

fn step(args: &[&'static str], expect: Expect) -> Step {
    Step { args: args.to_vec(), expect, capture: Vec::new(), until_output: false, within: None }
}

impl Step {
    fn cap(mut self, name: &'static str, pointer: &'static str) -> Step {
        self.capture.push((name, pointer));
        self
    }
    fn until_output(mut self) -> Step {
        self.until_output = true;
        self
    }
    fn within(mut self, min_ms: u64, max_ms: u64) -> Step {
        self.within = Some((min_ms, max_ms));
        self
    }
}

/// What mam can tell from one stream.
#[derive(Debug, PartialEq, Clone)]
enum Stream {
    Empty,
    Json(Value),
    Text,
}

#[derive(Debug, PartialEq, Clone)]
struct Obs {
    rc: i32,
    out: Stream,
    err: Stream,
}

/// Keys whose values differ between runs; their shape (keys) is kept, their values masked.
const VOLATILE: &[&str] = &[
    "terminal_id",
    "revision",
    "cwd",
    "foreground_cwd",
    "scroll",
    "state_change_seq",
    "foreground_process_group_id",
    "pid",
    "shell_pid",
    "message",
];

fn mask(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(m.iter().map(|(k, v)| (k.clone(), mask(v))).collect()),
        Value::Array(a) => Value::Array(a.iter().map(mask).collect()),
        _ => Value::String("<v>".into()),
    }
}

/// Keys herdr adds from what the pane's program drew (the fake agent sets claude's window titles),
/// which the mock, drawing nothing, does not have: left out on both sides.
const SCREEN_DERIVED: &[&str] = &["terminal_title", "terminal_title_stripped"];

fn normalize(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !SCREEN_DERIVED.contains(&k.as_str()))
                .map(|(k, v)| {
                    let nv = if k == "terminal_id" {
                        let ok = v
                            .as_str()
                            .and_then(|t| t.strip_prefix("term_"))
                            .is_some_and(|h| !h.is_empty() && h.chars().all(|c| c.is_ascii_hexdigit()));
                        Value::String(if ok { "term_<hex>".into() } else { format!("bad terminal id {v}") })
                    } else if VOLATILE.contains(&k.as_str()) {
                        mask(v)
                    } else {
                        normalize(v)
                    };
                    (k.clone(), nv)
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(normalize).collect()),
        _ => v.clone(),
    }
}

fn stream(bytes: &[u8]) -> Stream {
    if bytes.is_empty() {
        return Stream::Empty;
    }
    match serde_json::from_slice::<Value>(bytes) {
        Ok(v) if v.is_object() => Stream::Json(normalize(&v)),
        _ => Stream::Text,
    }
}

fn check(expect: Expect, o: &Obs) -> Result<(), String> {
    let ty = |s: &Stream| match s {
        Stream::Json(v) => v.pointer("/result/type").and_then(Value::as_str).map(str::to_string),
        _ => None,
    };
    let code = |s: &Stream| match s {
        Stream::Json(v) => v.pointer("/error/code").and_then(Value::as_str).map(str::to_string),
        _ => None,
    };
    let envelope = |s: &Stream| match s {
        Stream::Json(v) => v["id"].as_str().is_some_and(|id| id.starts_with("cli:")),
        _ => false,
    };
    let good = match expect {
        Expect::Doc(t) => o.rc == 0 && ty(&o.out).as_deref() == Some(t) && envelope(&o.out) && o.err == Stream::Empty,
        Expect::Silent => o.rc == 0 && o.out == Stream::Empty && o.err == Stream::Empty,
        Expect::Text => o.rc == 0 && o.out == Stream::Text && o.err == Stream::Empty,
        Expect::Error(c) => {
            o.rc == 1 && o.out == Stream::Empty && code(&o.err).as_deref() == Some(c) && envelope(&o.err)
        }
        Expect::Plain(rc) => o.rc == rc && o.out == Stream::Empty && o.err == Stream::Text,
    };
    if good {
        Ok(())
    } else {
        Err(format!("expected {expect:?}, got {o:?}"))
    }
}

/// One side's run of a scenario: an observation and the elapsed time per step.
struct Transcript {
    side: Side,
    steps: Vec<(String, Obs, Duration)>,
    failures: Vec<String>,
}

fn run_scenario(h: &mut ContractHerdr, start_server: bool, steps: &[Step]) -> Transcript {
    if start_server {
        h.start();
    }
    let mut vars: HashMap<&str, String> = HashMap::new();
    vars.insert("proj", h.td.path("proj").to_string_lossy().into_owned());
    let mut t = Transcript { side: h.side, steps: Vec::new(), failures: Vec::new() };
    for (i, st) in steps.iter().enumerate() {
        let args: Vec<String> = st
            .args
            .iter()
            .map(|a| vars.iter().fold(a.to_string(), |acc, (k, v)| acc.replace(&format!("{{{k}}}"), v)))
            .collect();
        let shown = args.join(" ");
        let started = Instant::now();
        let mut r = h.herdr(&args);
        if st.until_output && r.out.stdout.is_empty() {
            r = wait_for(&format!("output of `herdr {shown}`"), Duration::from_secs(20), || {
                let again = h.herdr(&args);
                (!again.out.stdout.is_empty()).then_some(again)
            });
        }
        let elapsed = started.elapsed();
        let obs = Obs { rc: r.rc(), out: stream(&r.out.stdout), err: stream(&r.out.stderr) };
        if let Err(e) = check(st.expect, &obs) {
            t.failures.push(format!(
                "{:?} step {i} `herdr {shown}`: {e}\n  stdout: {}\n  stderr: {}",
                h.side,
                r.stdout(),
                r.stderr()
            ));
        }
        if let Some((lo, hi)) = st.within {
            let ms = elapsed.as_millis() as u64;
            if ms < lo || ms > hi {
                t.failures
                    .push(format!("{:?} step {i} `herdr {shown}`: took {ms} ms, not within {lo}..{hi} ms", h.side));
            }
        }
        let doc: Option<Value> = serde_json::from_slice(&r.out.stdout).ok();
        for (name, ptr) in &st.capture {
            match doc.as_ref().and_then(|d| d.pointer(ptr)).and_then(Value::as_str) {
                Some(v) => {
                    vars.insert(name, v.to_string());
                }
                None => t.failures.push(format!("{:?} step {i} `herdr {shown}`: nothing at {ptr} to capture", h.side)),
            }
        }
        t.steps.push((shown, obs, elapsed));
    }
    t
}

/// Runs `steps` on the mock (always) and on the real herdr (when present); fails on any broken
/// expectation, and on any step whose observation differs between the two.
fn contract(name: &str, start_server: bool, steps: Vec<Step>) {
    let mut mock = ContractHerdr::new(Side::Mock, &format!("{name}-mock"), None);
    let m = run_scenario(&mut mock, start_server, &steps);
    let mut failures = m.failures.clone();
    if let Some(bin) = real_herdr() {
        let mut real = ContractHerdr::new(Side::Real, &format!("{name}-real"), Some(&bin));
        let r = run_scenario(&mut real, start_server, &steps);
        failures.extend(r.failures.iter().cloned());
        for (i, ((cmd, mo, _), (_, ro, _))) in m.steps.iter().zip(&r.steps).enumerate() {
            if mo != ro {
                failures.push(format!(
                    "step {i} `herdr {cmd}`: the mock and herdr differ\n  mock: {}\n  real: {}",
                    show(mo),
                    show(ro)
                ));
            }
        }
        drop(real);
        assert_eq!(r.side, Side::Real);
        let left = mock.leftovers();
        assert!(left.is_empty(), "the mock left processes: {left:?}");
    }
    assert!(failures.is_empty(), "{} contract failure(s):\n{}", failures.len(), failures.join("\n"));
}

fn show(o: &Obs) -> String {
    let s = |x: &Stream| match x {
        Stream::Empty => "empty".to_string(),
        Stream::Text => "text".to_string(),
        Stream::Json(v) => v.to_string(),
    };
    format!("rc {} stdout {} stderr {}", o.rc, s(&o.out), s(&o.err))
}

// ---------------------------------------------------------------------------------------------
// Scenarios

use Expect::*;

#[test]
fn no_server_and_usage() {
    contract(
        "hc_noserver",
        false,
        vec![
            step(&["--version"], Text),
            step(&["agent", "list"], Error("server_not_running")),
            step(&["workspace", "list"], Error("server_not_running")),
            step(&["agent", "get", "a1"], Error("server_not_running")),
            step(&["server", "stop"], Plain(1)),
            step(&["frobnicate"], Plain(2)),
            step(&["pane", "send-keys"], Plain(2)),
            step(&["pane", "split", "w1:p1", "--direction", "left"], Plain(2)),
            step(&["pane", "read", "w1:p1", "--source", "bogus"], Plain(2)),
            step(&["pane", "read", "w1:p1", "--lines", "x"], Plain(2)),
            step(&["pane", "list", "--workspace"], Plain(2)),
            step(&["agent", "start", "a1", "--kind", "bogus", "--pane", "w1:p1"], Plain(2)),
            step(&["agent", "start", "a1", "--kind", "claude"], Plain(2)),
            step(&["agent", "prompt", "a1", "x", "--until", "idle"], Plain(2)),
        ],
    );
}

#[test]
fn topology_layout_and_input() {
    contract(
        "hc_topo",
        true,
        vec![
            step(&["agent", "list"], Doc("agent_list")),
            step(&["workspace", "list"], Doc("workspace_list")),
            step(
                &["workspace", "create", "--cwd", "{proj}", "--label", "lab", "--env", "MY_TEST_FLAG=1", "--no-focus"],
                Doc("workspace_created"),
            )
            .cap("w", "/result/workspace/workspace_id")
            .cap("p1", "/result/root_pane/pane_id"),
            step(&["workspace", "list"], Doc("workspace_list")),
            step(&["pane", "list", "--workspace", "{w}"], Doc("pane_list")),
            step(&["pane", "layout", "--pane", "{p1}"], Doc("pane_layout")),
            step(&["pane", "process-info", "--pane", "{p1}"], Doc("pane_process_info")),
            // The 2x2 grid the way mam packs it: right, then each column down.
            step(
                &["pane", "split", "{p1}", "--direction", "right", "--cwd", "{proj}", "--env", "A=1", "--no-focus"],
                Doc("pane_info"),
            )
            .cap("p2", "/result/pane/pane_id"),
            step(&["pane", "split", "{p1}", "--direction", "down", "--no-focus"], Doc("pane_info"))
                .cap("p3", "/result/pane/pane_id"),
            step(&["pane", "split", "{p2}", "--direction", "down", "--no-focus"], Doc("pane_info"))
                .cap("p4", "/result/pane/pane_id"),
            step(&["pane", "split", "{p3}", "--direction", "right", "--no-focus"], Doc("pane_info"))
                .cap("p5", "/result/pane/pane_id"),
            step(&["pane", "list", "--workspace", "{w}"], Doc("pane_list")),
            step(&["pane", "layout", "--pane", "{p4}"], Doc("pane_layout")),
            step(&["pane", "close", "{p3}"], Doc("ok")),
            step(&["pane", "layout", "--pane", "{p1}"], Doc("pane_layout")),
            step(&["pane", "list"], Doc("pane_list")),
            // Input: key names, no output; text is not a key.
            step(&["pane", "send-keys", "{p1}", "enter"], Silent),
            step(&["pane", "send-keys", "{p1}", "a", "ctrl+c", "C-c", "Enter"], Silent),
            step(&["pane", "send-keys", "{p1}", "hello"], Error("invalid_key")),
            step(&["pane", "send-text", "{p1}", "echo hi"], Silent),
            step(&["pane", "run", "{p1}", "echo ran"], Silent),
            step(&["pane", "read", "{p1}"], Text).until_output(),
            step(&["pane", "read", "{p1}", "--source", "visible", "--lines", "3"], Text).until_output(),
            step(&["pane", "read", "{p1}", "--source", "recent-unwrapped", "--lines", "120"], Text).until_output(),
            // Errors name what is missing.
            step(&["pane", "send-keys", "{w}:p99", "enter"], Error("pane_not_found")),
            step(&["pane", "send-text", "{w}:p99", "x"], Error("pane_not_found")),
            step(&["pane", "run", "{w}:p99", "x"], Error("pane_not_found")),
            step(&["pane", "read", "{w}:p99"], Error("pane_not_found")),
            step(&["pane", "close", "{w}:p99"], Error("pane_not_found")),
            step(&["pane", "split", "{w}:p99", "--direction", "right"], Error("pane_not_found")),
            step(&["pane", "layout", "--pane", "{w}:p99"], Error("pane_not_found")),
            step(&["pane", "process-info", "--pane", "{w}:p99"], Error("pane_not_found")),
            step(&["pane", "list", "--workspace", "w99"], Error("workspace_not_found")),
            step(&["workspace", "rename", "{w}", "newlab"], Doc("workspace_info")),
            step(&["workspace", "rename", "w99", "x"], Error("workspace_not_found")),
            step(&["workspace", "close", "w99"], Error("workspace_not_found")),
            // A second workspace; closing its only pane closes it.
            step(&["workspace", "create", "--cwd", "{proj}", "--no-focus"], Doc("workspace_created"))
                .cap("w2", "/result/workspace/workspace_id")
                .cap("w2p1", "/result/root_pane/pane_id"),
            step(&["workspace", "list"], Doc("workspace_list")),
            step(&["pane", "layout", "--pane", "{w2p1}"], Doc("pane_layout")),
            step(&["pane", "list"], Doc("pane_list")),
            step(&["pane", "close", "{w2p1}"], Doc("ok")),
            step(&["workspace", "list"], Doc("workspace_list")),
            step(&["workspace", "create", "--cwd", "{proj}", "--no-focus"], Doc("workspace_created"))
                .cap("w3", "/result/workspace/workspace_id"),
            step(&["workspace", "close", "{w3}"], Doc("ok")),
            step(&["workspace", "list"], Doc("workspace_list")),
            // The server: already running, then stopped (no output), then gone.
            step(&["server"], Plain(1)),
            step(&["server", "stop"], Silent),
            step(&["agent", "list"], Error("server_not_running")),
        ],
    );
}

#[test]
fn agents_start_read_prompt() {
    contract(
        "hc_agents",
        true,
        vec![
            step(&["workspace", "create", "--cwd", "{proj}", "--no-focus"], Doc("workspace_created"))
                .cap("w", "/result/workspace/workspace_id")
                .cap("p1", "/result/root_pane/pane_id"),
            step(&["pane", "split", "{p1}", "--direction", "right", "--no-focus"], Doc("pane_info"))
                .cap("p2", "/result/pane/pane_id"),
            step(
                &[
                    "agent",
                    "start",
                    "a1",
                    "--kind",
                    "claude",
                    "--pane",
                    "{p1}",
                    "--timeout",
                    "20000",
                    "--",
                    "test-double",
                    "agent",
                ],
                Doc("agent_started"),
            ),
            step(&["agent", "list"], Doc("agent_list")),
            step(&["agent", "get", "a1"], Doc("agent_info")),
            step(&["agent", "get", "{p1}"], Doc("agent_info")),
            step(&["agent", "get", "nosuch"], Error("agent_not_found")),
            step(&["agent", "get", "{p2}"], Error("agent_not_found")),
            step(&["pane", "list", "--workspace", "{w}"], Doc("pane_list")),
            step(&["pane", "process-info", "--pane", "{p1}"], Doc("pane_process_info")),
            // Start refusals.
            step(&["agent", "start", "a1", "--kind", "claude", "--pane", "{p2}"], Error("agent_name_taken")),
            step(&["agent", "start", "a2", "--kind", "claude", "--pane", "{w}:p99"], Error("agent_pane_not_found")),
            step(&["agent", "start", "a2", "--kind", "claude", "--pane", "{p1}"], Error("agent_pane_busy")),
            step(&["agent", "start", "A2", "--kind", "claude", "--pane", "{p2}"], Error("invalid_agent_name")),
            step(
                &["agent", "start", "a2", "--kind", "claude", "--pane", "{p2}", "--timeout", "100"],
                Error("invalid_agent_timeout"),
            ),
            // Reads are plain text.
            step(&["agent", "read", "a1"], Text).until_output(),
            step(&["agent", "read", "a1", "--source", "visible", "--lines", "3"], Text).until_output(),
            step(&["agent", "read", "nosuch"], Error("agent_not_found")),
            step(&["agent", "read", "{p2}"], Error("agent_not_found")),
            step(&["agent", "send-keys", "a1", "enter"], Doc("ok")),
            step(&["agent", "send-keys", "a1", "hello"], Error("invalid_key")),
            step(&["agent", "send-keys", "nosuch", "enter"], Error("agent_not_found")),
            // Prompts: without --wait at once; with --wait the fake agent never changes state, so a
            // short timeout is `timeout` and a long one `agent_prompt_stalled` after 5 s.
            step(&["agent", "prompt", "a1", "hello there"], Doc("agent_prompted")).within(0, 3000),
            step(&["agent", "prompt", "nosuch", "x"], Error("agent_not_found")),
            step(&["agent", "prompt", "a1", "short", "--wait", "--timeout", "2000"], Error("timeout"))
                .within(1900, 4500),
            step(&["agent", "prompt", "a1", "stalls", "--wait", "--timeout", "20000"], Error("agent_prompt_stalled"))
                .within(4900, 8000),
            step(&["pane", "close", "{p1}"], Doc("ok")),
            step(&["agent", "list"], Doc("agent_list")),
            step(&["agent", "get", "a1"], Error("agent_not_found")),
            step(&["server", "stop"], Silent),
        ],
    );
}

/// The mock's stall window is a knob (`MAM_MOCK_STALL_MS`) the other tests shorten; a caller
/// timeout no longer than the window stays a plain `timeout`, as on herdr.
#[test]
fn mock_stall_window_is_a_knob() {
    let mut h = ContractHerdr::new(Side::Mock, "hc_stall", None);
    h.env.push(("MAM_MOCK_STALL_MS".into(), "300".into()));
    let steps = vec![
        step(&["workspace", "create", "--cwd", "{proj}", "--no-focus"], Doc("workspace_created"))
            .cap("p1", "/result/root_pane/pane_id"),
        step(&["agent", "start", "a1", "--kind", "claude", "--pane", "{p1}"], Doc("agent_started")),
        step(&["agent", "prompt", "a1", "x", "--wait", "--timeout", "20000"], Error("agent_prompt_stalled"))
            .within(290, 3000),
        step(&["agent", "prompt", "a1", "x", "--wait", "--timeout", "200"], Error("timeout")).within(190, 3000),
    ];
    let t = run_scenario(&mut h, true, &steps);
    assert!(t.failures.is_empty(), "{}", t.failures.join("\n"));
}
