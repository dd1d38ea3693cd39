//! The real agent CLIs (issue 15, A58) in real tmux and on the real herdr: `mam create <kind>` passes
//! the CLI's start-up dialogs and detects ready from its own input line; a delegated job's prompt
//! lands and the job closes `agent_blocked` within T while the CLI sits in its network retry; the
//! conversation id is chosen (claude `--session-id`) or read back (codex's rollout file) and `mam
//! resume` passes it in the CLI's own form (checked in the resumed process's argv in /proc); `mam
//! stop` leaves no process of the CLI behind.
//!
//! The CLIs come from `scripts/install_agents.sh` (npm, cached): `MAM_AGENTS_BIN` names their
//! `node_modules/.bin`. Without it the tests skip, unless `MAM_REQUIRE_AGENTS=1` (test.sh sets it when
//! the install succeeded). Every test runs the CLI with a private HOME, self-updates off, fake API
//! keys and a proxy on a closed loopback port: every model call fails, as it must here.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::*;

/// The directory holding the CLIs, or `None` (skip); a required but missing one fails.
fn agents_bin() -> Option<PathBuf> {
    let dir = std::env::var_os("MAM_AGENTS_BIN").map(PathBuf::from).filter(|d| d.join("claude").exists());
    if dir.is_none() && std::env::var("MAM_REQUIRE_AGENTS").as_deref() == Ok("1") {
        panic!("MAM_REQUIRE_AGENTS=1 but MAM_AGENTS_BIN names no directory with the CLIs");
    }
    dir
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Tmux,
    Herdr,
}

/// One world: a control root, an embedded broker, a pane backend, a private HOME for the CLI.
struct W {
    /// The real herdr's world (dropped first: its server and every pane process end with it).
    real: Option<HerdrHome>,
    td: TestDir,
    _broker: Broker,
    env: Vec<(String, OsString)>,
    tmux: Option<String>,
    /// The CLI's HOME (the herdr world's HOME on herdr: a pane inherits the server's).
    home: PathBuf,
}

impl Drop for W {
    fn drop(&mut self) {
        if let Some(s) = &self.tmux {
            let _ = std::process::Command::new("tmux").args(["-L", s, "kill-server"]).output();
        }
        for (pid, _) in agent_procs(&self.home) {
            let _ = mam::sys::kill(pid, 9);
        }
    }
}

impl W {
    fn new(name: &str, backend: Backend) -> Option<W> {
        let bin = agents_bin()?;
        if backend == Backend::Tmux && !have_tool("tmux", "MAM_REQUIRE_TMUX") {
            return None;
        }
        let td = TestDir::new(name);
        let broker = start_target(Target::Embedded, &td)?;
        let closed = free_port();
        let proxy = format!("http://127.0.0.1:{closed}");
        let mut env: Vec<(String, OsString)> = vec![
            ("MQTT_PORT".into(), broker.port().to_string().into()),
            ("MAM_DISPATCH_SECRET".into(), rand_hex(16).into()),
            ("MAM_AGENT_START_TIMEOUT_MS".into(), "25000".into()),
            ("MAM_SKS_POLL_MS".into(), "100".into()),
            ("MAM_SKS_QUIESCE_GAP_MS".into(), "300".into()),
            ("MAM_SKS_QUIESCE_S".into(), "3".into()),
            ("MAM_SKS_IDLE_WAIT_S".into(), "10".into()),
            ("SKS_DELIVERY_GRACE_S".into(), "5".into()),
            ("MAM_WATCH_POLL_MS".into(), "100".into()),
            ("MAM_PUBLISH_BUDGET_S".into(), "1".into()),
            ("ANTHROPIC_API_KEY".into(), "sk-ant-mam-test-not-a-key".into()),
            ("OPENAI_API_KEY".into(), "sk-mam-test-not-a-key".into()),
            ("DISABLE_AUTOUPDATER".into(), "1".into()),
            ("NPM_CONFIG_PREFIX".into(), td.path("npm-prefix").into()),
            ("HTTPS_PROXY".into(), proxy.clone().into()),
            ("HTTP_PROXY".into(), proxy.clone().into()),
            ("https_proxy".into(), proxy.clone().into()),
            ("http_proxy".into(), proxy.into()),
            ("NO_PROXY".into(), "".into()),
        ];
        let (real, tmux, home) = match backend {
            Backend::Tmux => {
                let sock = format!("mam-real-{}", rand_hex(6));
                let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
                env.push(("PATH".into(), path.into()));
                env.push(("MAM_PANE_BACKEND".into(), "tmux".into()));
                env.push(("MAM_TMUX_SOCKET".into(), sock.clone().into()));
                (None, Some(sock), td.path("home"))
            }
            Backend::Herdr => {
                let h = HerdrHome::new(&td)?;
                for k in ["claude", "codex"] {
                    h.link(k, &bin.join(k));
                }
                env.extend(h.env());
                env.push(("MAM_PANE_BACKEND".into(), "herdr".into()));
                let home = h.home.clone();
                (Some(h), None, home)
            }
        };
        // claude offline exits at its onboarding check unless onboarding is recorded as done (README).
        fs::write(home.join(".claude.json"), r#"{"hasCompletedOnboarding":true,"theme":"dark"}"#).unwrap();
        Some(W { real, td, _broker: broker, env, tmux, home })
    }

    fn mam<I: IntoIterator<Item = S>, S: AsRef<std::ffi::OsStr>>(&self, args: I) -> Cmd {
        let mut c = self.td.mam().args(args);
        for (k, v) in &self.env {
            c = c.env(k, v);
        }
        c
    }

    fn row(&self, name: &str) -> Value {
        let v: Value =
            serde_json::from_slice(&fs::read(self.td.ws().join(".mam/agent_sessions.json")).unwrap()).unwrap();
        v["herdr_sessions"].as_array().unwrap().iter().find(|r| r["name"] == name).cloned().unwrap()
    }

    /// The agent's visible screen.
    fn screen(&self, name: &str) -> String {
        let pane = self.row(name)["pane"]["id"].as_str().unwrap().to_string();
        match (&self.tmux, &self.real) {
            (Some(s), _) => {
                let out = std::process::Command::new("tmux")
                    .args(["-u", "-L", s, "capture-pane", "-p", "-J", "-t", &pane])
                    .output()
                    .unwrap();
                String::from_utf8_lossy(&out.stdout).into_owned()
            }
            (None, Some(h)) => h.herdr(&["pane", "read", &pane, "--source", "recent"]).stdout(),
            _ => unreachable!(),
        }
    }
}

/// Live processes of a CLI run with `home` as HOME (its argv is an agent's, or its executable lives
/// in an npm tree), with their argv.
fn agent_procs(home: &Path) -> Vec<(i32, Vec<String>)> {
    let want = home.as_os_str().as_encoded_bytes().to_vec();
    mam::sys::list_pids()
        .unwrap_or_default()
        .into_iter()
        .filter(|&pid| mam::sys::proc_environ_var(pid, "HOME").ok().flatten().as_deref() == Some(&want[..]))
        .filter(|&pid| !matches!(mam::sys::proc_start_ticks(pid), Ok((_, true)) | Err(_)))
        .filter_map(|pid| {
            let argv = mam::sys::proc_cmdline(pid).ok()?;
            let exe = fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
            let ours = mam::agents::argv_is_agent(&argv) || exe.to_string_lossy().contains("node_modules");
            ours.then(|| (pid, argv.iter().map(|a| String::from_utf8_lossy(a).into_owned()).collect()))
        })
        .collect()
}

/// The argv of the running CLI of `kind` (its first process the adapter recognises).
fn cli_argv(home: &Path, kind: &str) -> Option<Vec<String>> {
    agent_procs(home).into_iter().map(|(_, a)| a).find(|a| {
        let raw: Vec<Vec<u8>> = a.iter().map(|s| s.as_bytes().to_vec()).collect();
        mam::agents::agent_of_argv(&raw).is_some_and(|ad| ad.kind == kind)
    })
}

fn kv(stdout: &str, key: &str) -> String {
    stdout
        .split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")).map(str::to_string))
        .unwrap_or_else(|| panic!("no {key}= in {stdout:?}"))
}

/// The whole life of one real CLI in a pane: create, a delegated job, stop, resume, stop.
fn life(backend: Backend, kind: &str) {
    let Some(w) = W::new(&format!("real_{kind}_{backend:?}"), backend) else { return };
    let t0 = Instant::now();
    // 1. create: the dialogs pass (claude: trust, API key; codex: login chooser, API key, trust) and
    // ready is the CLI's own input line.
    let r = w.mam(["create", kind, "--name", "r1", "--no-onboard"]).run_within(Duration::from_secs(40));
    r.expect_rc(0);
    let created = t0.elapsed();
    let screen = w.screen("r1");
    let ready = mam::agents::adapter(kind).unwrap().ready_line;
    assert!(screen.contains(ready), "{kind} on {backend:?}: no input line '{ready}' after create:\n{screen}");
    let st = w.mam(["status", "r1"]).run();
    st.expect_rc(0);
    assert!(st.stdout().contains("\trunning\tidle\t"), "{}", st.stdout());
    // The conversation id: claude's is chosen and passed as --session-id.
    let argv = cli_argv(&w.home, kind).unwrap_or_else(|| panic!("no {kind} process: {:?}", agent_procs(&w.home)));
    if kind == "claude" {
        let conv = w.row("r1")["conversation_id"].as_str().unwrap().to_string();
        assert!(mam::agents::canonical_uuid(&conv).is_some(), "{conv}");
        assert!(argv.windows(2).any(|p| p[0] == "--session-id" && p[1] == conv), "{argv:?}");
    } else {
        assert!(argv.iter().any(|a| a == "--no-daemon"), "{argv:?}");
    }

    // 2. A delegated job: the prompt lands, the CLI sits in its network retry, and the job closes
    // agent_blocked once T passes without `started`.
    let task = w.td.write("task.md", "Say hello.\n");
    let t1 = Instant::now();
    let r = w
        .mam(["delegate-job", "--session", "r1", "--brief-file"])
        .args([task.as_os_str()])
        .args(["--ack-timeout", "8", "--heartbeat", "1", "--heartbeat-misses", "3", "--timeout", "60"])
        .run_within(Duration::from_secs(40));
    let job_time = t1.elapsed();
    assert_eq!(r.rc(), 3, "{kind} on {backend:?}: {}\n{}", r.stdout(), r.stderr());
    let last = r.stdout().lines().last().unwrap_or_default().to_string();
    assert!(last.contains("STATUS=agent_blocked"), "{last}");
    assert!(job_time < Duration::from_secs(25), "{job_time:?}");
    let jid = kv(&last, "JOB_ID");
    let screen = w.screen("r1");
    assert!(screen.contains(&jid), "the prompt of {jid} landed in {kind}:\n{screen}");
    // The CLI is alive, retrying its model call.
    assert!(cli_argv(&w.home, kind).is_some(), "{kind} still runs");

    // 3. stop: nothing of the CLI is left; codex's conversation id is read back from its rollout.
    w.mam(["stop", "r1"]).run_within(Duration::from_secs(30)).expect_rc(0);
    wait_until(&format!("no {kind} process left"), Duration::from_secs(10), || agent_procs(&w.home).is_empty());
    let conv = w.row("r1")["conversation_id"].as_str().map(str::to_string);
    let conv = conv.unwrap_or_else(|| panic!("{kind}: no conversation id recorded: {}", w.row("r1")));
    assert!(mam::agents::canonical_uuid(&conv).is_some(), "{conv}");

    // 4. resume passes the id in the CLI's own form.
    w.mam(["resume", "r1"]).run_within(Duration::from_secs(40)).expect_rc(0);
    let argv = cli_argv(&w.home, kind).unwrap_or_else(|| panic!("no resumed {kind}: {:?}", agent_procs(&w.home)));
    let form = if kind == "claude" { "--resume" } else { "resume" };
    assert!(argv.windows(2).any(|p| p[0] == form && p[1] == conv), "{argv:?}");
    w.mam(["stop", "r1"]).run_within(Duration::from_secs(30)).expect_rc(0);
    wait_until(&format!("no {kind} process left"), Duration::from_secs(10), || agent_procs(&w.home).is_empty());
    eprintln!("{kind} on {backend:?}: create {created:?}, job {job_time:?}, all {:?}", t0.elapsed());
}

#[test]
fn real_claude_on_tmux() {
    life(Backend::Tmux, "claude");
}

#[test]
fn real_codex_on_tmux() {
    life(Backend::Tmux, "codex");
}

#[test]
fn real_claude_on_real_herdr() {
    life(Backend::Herdr, "claude");
}

#[test]
fn real_codex_on_real_herdr() {
    life(Backend::Herdr, "codex");
}
