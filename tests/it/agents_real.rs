//! The real agent CLIs (issue 15, A58) in real tmux and on the real herdr: `mam create <kind>` passes
//! the CLI's start-up dialogs and detects ready from its own input line; a delegated job's prompt
//! lands and the job closes `agent_blocked` within T while the CLI sits in its network retry (on
//! herdr: whatever herdr's own status says meanwhile); the conversation id is chosen (`--session-id`)
//! or read back (codex's rollout file, opencode's log) and `mam resume` passes it in the CLI's own
//! form (checked in the resumed process's argv in /proc); `mam stop` leaves no process of the CLI
//! behind (gemini's, which outlives its pane, included).
//!
//! What a CLI really does here where that differs (docs/AGENTS.md "Tested against the real CLIs"):
//! gemini cannot resume a conversation whose model call never returned, so resume starts a new one
//! and says so; grok has no conversation to resume; herdr has no qwen kind.
//!
//! The kinds of one backend run in parallel in one test (`lives`), at most `MAM_REAL_PARALLEL`
//! (default 4) lives at once over the file; `MAM_REAL_KINDS=gemini,qwen` narrows the kinds.
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

/// The directory holding the CLI `kind`, or `None` (skip, saying why); a required but missing one fails.
pub(crate) fn agents_bin(kind: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("MAM_AGENTS_BIN").map(PathBuf::from).filter(|d| d.join(kind).exists());
    if dir.is_none() {
        if std::env::var("MAM_REQUIRE_AGENTS").as_deref() == Ok("1") {
            panic!("MAM_REQUIRE_AGENTS=1 but MAM_AGENTS_BIN names no directory with the CLI {kind}");
        }
        eprintln!("SKIP: the real {kind} CLI is absent (MAM_AGENTS_BIN; scripts/install_agents.sh installs it)");
    }
    dir
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    Tmux,
    Herdr,
}

/// One world: a control root, an embedded broker, a pane backend, a private HOME for the CLI.
pub(crate) struct W {
    /// The real herdr's world (dropped first: its server and every pane process end with it).
    pub(crate) real: Option<HerdrHome>,
    pub(crate) td: TestDir,
    _broker: Broker,
    pub(crate) env: Vec<(String, OsString)>,
    pub(crate) tmux: Option<String>,
    /// The CLI's HOME (the herdr world's HOME on herdr: a pane inherits the server's).
    pub(crate) home: PathBuf,
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
    pub(crate) fn new(name: &str, backend: Backend, kind: &str) -> Option<W> {
        let bin = agents_bin(kind)?;
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
            // opencode on a loaded 2-core machine takes up to about 55 s to its input line: room for it.
            ("MAM_AGENT_START_TIMEOUT_MS".into(), "120000".into()),
            ("MAM_SKS_POLL_MS".into(), "100".into()),
            ("MAM_SKS_QUIESCE_GAP_MS".into(), "300".into()),
            ("MAM_SKS_QUIESCE_S".into(), "1".into()),
            ("MAM_SKS_IDLE_WAIT_S".into(), "10".into()),
            ("SKS_DELIVERY_GRACE_S".into(), "2".into()),
            ("MAM_SKS_PROMPT_TIMEOUT_MS".into(), "5001".into()),
            ("MAM_WATCH_POLL_MS".into(), "100".into()),
            ("MAM_PUBLISH_BUDGET_S".into(), "1".into()),
            ("ANTHROPIC_API_KEY".into(), "sk-ant-mam-test-not-a-key".into()),
            ("OPENAI_API_KEY".into(), "sk-mam-test-not-a-key".into()),
            ("GEMINI_API_KEY".into(), "mam-test-not-a-key".into()),
            ("GROK_API_KEY".into(), "xai-mam-test-not-a-key".into()),
            ("DISABLE_AUTOUPDATER".into(), "1".into()),
            // opencode: no self-update, and no models.dev fetch (offline it waits about 12 s for a
            // DNS timeout before its input line shows).
            ("OPENCODE_DISABLE_AUTOUPDATE".into(), "1".into()),
            ("OPENCODE_DISABLE_MODELS_FETCH".into(), "1".into()),
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
                h.link(kind, &bin.join(kind));
                env.extend(h.env());
                env.push(("MAM_PANE_BACKEND".into(), "herdr".into()));
                let home = h.home.clone();
                (Some(h), None, home)
            }
        };
        // claude offline exits at its onboarding check unless onboarding is recorded as done; qwen
        // shows an auth chooser unless one is selected, and updates itself unless told not to (README).
        fs::write(home.join(".claude.json"), r#"{"hasCompletedOnboarding":true,"theme":"dark"}"#).unwrap();
        fs::create_dir_all(home.join(".qwen")).unwrap();
        fs::write(
            home.join(".qwen/settings.json"),
            r#"{"security":{"auth":{"selectedType":"openai"}},"model":{"name":"gpt-4o"},"general":{"enableAutoUpdate":false}}"#,
        )
        .unwrap();
        Some(W { real, td, _broker: broker, env, tmux, home })
    }

    pub(crate) fn mam<I: IntoIterator<Item = S>, S: AsRef<std::ffi::OsStr>>(&self, args: I) -> Cmd {
        let mut c = self.td.mam().args(args);
        for (k, v) in &self.env {
            c = c.env(k, v);
        }
        c
    }

    pub(crate) fn row(&self, name: &str) -> Value {
        let v: Value =
            serde_json::from_slice(&fs::read(self.td.ws().join(".mam/agent_sessions.json")).unwrap()).unwrap();
        v["herdr_sessions"].as_array().unwrap().iter().find(|r| r["name"] == name).cloned().unwrap()
    }

    /// The agent's visible screen.
    pub(crate) fn screen(&self, name: &str) -> String {
        self.read(name, "visible")
    }

    /// The agent's screen (tmux: visible; herdr: `source`, `recent` includes its scrollback).
    /// A read that failed or came back blank (a herdr call at load 14 did) is asked again, for up to 5 s.
    pub(crate) fn read(&self, name: &str, source: &str) -> String {
        let pane = self.row(name)["pane"]["id"].as_str().unwrap().to_string();
        let once = || match (&self.tmux, &self.real) {
            (Some(s), _) => {
                let out = std::process::Command::new("tmux")
                    .args(["-u", "-L", s, "capture-pane", "-p", "-J", "-t", &pane])
                    .output()
                    .unwrap();
                (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
            }
            (None, Some(h)) => {
                let r = h.herdr(&["pane", "read", &pane, "--source", source]);
                (r.rc() == 0, r.stdout())
            }
            _ => unreachable!(),
        };
        poll(Duration::from_secs(5), || {
            let (ok, text) = once();
            (ok && !text.trim().is_empty()).then_some(text)
        })
        .unwrap_or_else(|| once().1)
    }

    /// herdr's own status of agent `name` (`agent get`: `agent_status`), as the herdr backend reads it.
    fn herdr_status(&self, name: &str) -> String {
        let v = self.real.as_ref().unwrap().herdr(&["agent", "get", name]).stdout();
        let v: Value = serde_json::from_str(&v).unwrap_or(Value::Null);
        let a = v.pointer("/result/agent").unwrap_or(&Value::Null);
        a["agent_status"].as_str().unwrap_or("?").to_string()
    }
}

/// Live processes of a CLI run with `home` as HOME (its argv is an agent's, or its executable lives
/// in an npm tree), with their argv.
pub(crate) fn agent_procs(home: &Path) -> Vec<(i32, Vec<String>)> {
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
pub(crate) fn cli_argv(home: &Path, kind: &str) -> Option<Vec<String>> {
    agent_procs(home).into_iter().map(|(_, a)| a).find(|a| {
        let raw: Vec<Vec<u8>> = a.iter().map(|s| s.as_bytes().to_vec()).collect();
        mam::agents::agent_of_argv(&raw).is_some_and(|ad| ad.kind == kind)
    })
}

/// The arguments after the CLI's script or executable in `argv` (node and its flags skipped).
fn cli_args(argv: &[String], kind: &str) -> Vec<String> {
    let at = argv.iter().position(|a| a.rsplit('/').next() == Some(kind)).unwrap_or(argv.len());
    argv.get(at + 1..).unwrap_or_default().to_vec()
}

/// What herdr's own status of a kind is while its model call fails (observed; the verdict is mam's
/// either way: `agent_blocked`, since the CLI never ran the brief).
fn herdr_says_during_retry(kind: &str) -> &'static [&'static str] {
    match kind {
        // Retrying (claude "Retrying in Ns", codex "Reconnecting...") or thinking with no end
        // (gemini): herdr calls each of them working.
        "claude" | "codex" | "gemini" => &["working"],
        // opencode retries too ("Cannot connect to API … [retrying in Ns attempt #N]"): herdr says
        // working while an attempt runs (its progress_bar_working rule) and idle (no rule, the known
        // agent fallback) while it counts down to the next, so either may be last.
        "opencode" => &["idle", "working"],
        // grok's error comes back within 2 s, and it waits at its input line again.
        "grok" => &["idle"],
        _ => &[],
    }
}

/// The whole life of one real CLI in a pane: create, a delegated job, stop, resume, stop.
fn life(backend: Backend, kind: &str) {
    let Some(w) = W::new(&format!("real_{kind}_{backend:?}"), backend, kind) else { return };
    let ad = mam::agents::adapter(kind).unwrap();
    let t0 = Instant::now();
    // 1. create: the dialogs pass (claude: trust, API key; codex: login chooser, API key, trust;
    // gemini: trust, auth, key box) and ready is the CLI's own input line.
    let mut r = w.mam(["create", kind, "--name", "r1", "--no-onboard"]).run_within(Duration::from_secs(140));
    // A CLI that crashes by itself during start (codex once, at load 5, printed a backtrace of
    // `<unknown>` frames and was back at the shell): mam said so and rolled back; one more try.
    if r.rc() == 1 && r.stderr().contains("exited during start") && r.stderr().contains("confirmed: nothing left") {
        eprintln!("{kind} on {backend:?}: the CLI exited during start, trying once more: {}", r.stderr().trim());
        assert!(agent_procs(&w.home).is_empty(), "{:?}", agent_procs(&w.home));
        r = w.mam(["create", kind, "--name", "r1", "--no-onboard"]).run_within(Duration::from_secs(140));
    }
    r.expect_rc(0);
    let created = t0.elapsed();
    let screen = w.screen("r1");
    assert!(ad.ready_on(&screen), "{kind} on {backend:?}: no input line {}:\n{screen}", ad.ready_text());
    // No dialog waits: what is left of one (gemini redraws under the remains of its auth box) lies
    // above the input line.
    let input_at = ad.input_line_at(&screen).unwrap_or(0);
    for d in ad.dialogs {
        let waiting = screen.rfind(d.screen).is_some_and(|at| at > input_at);
        assert!(!waiting, "{kind} on {backend:?}: dialog '{}' waits below the input line:\n{screen}", d.screen);
    }
    // herdr may call the agent working for a moment after its start-up screens (gemini: its key box's
    // "Esc to cancel" in the recent buffer); idle within seconds.
    let mut st = w.mam(["status", "r1"]).run();
    let t = Instant::now();
    while !st.stdout().contains("\trunning\tidle\t") && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(300));
        st = w.mam(["status", "r1"]).run();
    }
    st.expect_rc(0);
    if !st.stdout().contains("\trunning\tidle\t") {
        let why = w.real.as_ref().map(|h| h.herdr(&["agent", "explain", "r1"]).stdout()).unwrap_or_default();
        panic!("{kind} on {backend:?}: {}\n{why}\n--- visible\n{}", st.stdout(), w.screen("r1"));
    }
    // The conversation id mam chose is the CLI's --session-id.
    let argv = cli_argv(&w.home, kind).unwrap_or_else(|| panic!("no {kind} process: {:?}", agent_procs(&w.home)));
    let args = cli_args(&argv, kind);
    let chosen = w.row("r1")["conversation_id"].as_str().map(str::to_string);
    if ad.chooses_id() {
        let conv = chosen.clone().unwrap_or_else(|| panic!("{kind}: no chosen id: {}", w.row("r1")));
        assert!(mam::agents::canonical_uuid(&conv).is_some(), "{conv}");
        assert_eq!(args, ["--session-id", conv.as_str()], "{argv:?}");
    } else {
        assert_eq!(args, ad.start_args, "{kind}: {argv:?}");
    }

    // 2. A delegated job: the prompt lands, the CLI sits in its network retry, and the job closes
    // agent_blocked once T passes without `started`, whatever herdr says meanwhile.
    let task = w.td.write("task.md", "Say hello.\n");
    let t1 = Instant::now();
    let mut job = w
        .mam(["delegate-job", "--session", "r1", "--brief-file"])
        .args([task.as_os_str()])
        .args(["--ack-timeout", "4", "--heartbeat", "1", "--heartbeat-misses", "3", "--timeout", "60"])
        .spawn_bg(&w.td, "job");
    let jid = wait_for("the job's id", Duration::from_secs(20), || {
        job.stdout().split_whitespace().find_map(|x| x.strip_prefix("JOB_ID=").map(str::to_string))
    });
    // Until the verdict, and 2 s beyond while the CLI is still in its retry: has the prompt landed,
    // and (on herdr) what does herdr's own status say once it has.
    let mut landed = false;
    let mut herdr_said: Vec<String> = Vec::new();
    let mut rules: Vec<String> = Vec::new();
    let mut closed: Option<(i32, Instant)> = None;
    // A loaded machine may show the prompt only after the verdict (opencode draws its session view
    // late; it shows "[Pasted ~1 lines]" in its input until then): up to 20 s more for that.
    let after = if w.real.is_some() { Duration::from_secs(2) } else { Duration::ZERO };
    let mut landed_at: Option<Instant> = None;
    while closed.is_none_or(|(_, at)| {
        let since = landed_at.map_or(Duration::ZERO, |l| l.elapsed());
        (landed_at.is_none() && at.elapsed() < Duration::from_secs(20)) || (landed_at.is_some() && since < after)
    }) {
        landed = landed || w.read("r1", "recent").contains(&jid);
        if landed && landed_at.is_none() {
            landed_at = Some(Instant::now());
        }
        if let (true, Some(h)) = (landed, &w.real) {
            let s = w.herdr_status("r1");
            if herdr_said.last() != Some(&s) {
                let why = h.herdr(&["agent", "explain", "r1"]).stdout();
                let rule = why.lines().find(|l| l.starts_with("rule:")).unwrap_or("").to_string();
                rules.push(format!("{s} ({rule}) at {:?}", t1.elapsed()));
                herdr_said.push(s);
            }
        }
        if closed.is_none() && job.exited() {
            closed = Some(job.wait(Duration::from_secs(1)));
        }
        assert!(t1.elapsed() < Duration::from_secs(60), "{kind}: the job did not close: {}", job.stdout());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(landed, "the prompt of {jid} never showed in {kind}:\n{}", w.screen("r1"));
    let (rc, at) = closed.unwrap();
    let job_time = at - t1;
    assert_eq!(rc, 3, "{kind} on {backend:?}: {}\n{}", job.stdout(), job.stderr());
    let last = job.stdout().lines().last().unwrap_or_default().to_string();
    assert!(last.contains("STATUS=agent_blocked") && kv(&last, "JOB_ID") == jid, "{last}");
    assert!(job_time < Duration::from_secs(25), "{job_time:?}");
    if let Some(h) = &w.real {
        // What herdr said last, with the CLI in its retry past the verdict, is the kind's observed status.
        let want = herdr_says_during_retry(kind);
        let said = herdr_said.last().map(String::as_str).unwrap_or("?");
        let why = h.herdr(&["agent", "explain", "r1"]).stdout();
        assert!(
            want.contains(&said) && herdr_said.iter().all(|s| want.contains(&s.as_str())),
            "{kind}: herdr said {rules:?} once the prompt landed (expected {want:?} at the end)\n{why}"
        );
        // mam's status shows herdr's word (its STATE column), while its verdict stayed the evidence:
        // no `started` within T.
        let st = w.mam(["status", "r1"]).run();
        let state =
            st.stdout().lines().find(|l| l.starts_with("r1\t")).and_then(|l| l.split('\t').nth(6)).map(str::to_string);
        assert!(state.as_deref().is_some_and(|s| want.contains(&s)), "{kind}: {}", st.stdout());
    }
    // The CLI is alive, retrying its model call (or back at its input line after the error).
    assert!(cli_argv(&w.home, kind).is_some(), "{kind} still runs");

    // A learnt id exists once the CLI wrote it (opencode logs the session it creates for the prompt,
    // codex writes its rollout, a moment later; on a loaded machine after the verdict): wait for it.
    if kind == "opencode" {
        let data = w.home.join(".local/share");
        wait_until("opencode logs the session it created", Duration::from_secs(20), || {
            mam::agents::artifacts::opencode_log_id(&data, &w.td.ws(), 0).is_some()
        });
    }
    if kind == "codex" {
        wait_until("codex writes its rollout file", Duration::from_secs(20), || {
            mam::agents::artifacts::codex_rollout_id(&w.home, &w.td.ws(), 0).is_some()
        });
    }
    // 3. stop: nothing of the CLI is left; a learnt id is read back before the pane closes.
    w.mam(["stop", "r1"]).run_within(Duration::from_secs(30)).expect_rc(0);
    wait_until(&format!("no {kind} process left"), Duration::from_secs(10), || agent_procs(&w.home).is_empty());
    let conv = w.row("r1")["conversation_id"].as_str().map(str::to_string);
    match kind {
        "codex" => assert!(conv.as_deref().and_then(mam::agents::canonical_uuid).is_some(), "{conv:?}"),
        "opencode" => {
            let c = conv.as_deref().unwrap_or_else(|| panic!("opencode: no id read back: {}", w.row("r1")));
            assert!(c.starts_with("ses_") && c.len() > 10, "{c}");
        }
        "grok" => assert_eq!(conv, None),
        _ => assert_eq!(conv, chosen),
    }

    // 4. resume passes the id in the CLI's own form.
    let r = w.mam(["resume", "r1"]).run_within(Duration::from_secs(140));
    r.expect_rc(0);
    let argv = cli_argv(&w.home, kind).unwrap_or_else(|| panic!("no resumed {kind}: {:?}", agent_procs(&w.home)));
    let args = cli_args(&argv, kind);
    let now = w.row("r1")["conversation_id"].as_str().map(str::to_string);
    match (kind, conv.as_deref()) {
        // gemini saves a conversation only with a model reply, so here it refuses `--resume <id>`
        // ("No previous sessions found for this project.", rc 42): resume says so and starts anew.
        ("gemini", Some(c)) => {
            let note = r.stderr();
            // The CLI's own words, its lines rejoined where a narrow pane wrapped them.
            assert!(
                note.contains(&format!("NOTE: gemini could not resume conversation {c} ('gemini' --resume {c})"))
                    && note.replace(" | ", "").contains("No previous sessions found for this project"),
                "{note}"
            );
            let new = now.clone().unwrap();
            assert_ne!(new, c);
            assert_eq!(args, ["--session-id", new.as_str()], "{argv:?}");
        }
        (_, Some(c)) => {
            assert_eq!(args, ad.resume_with(c), "{kind}: {argv:?}\n{}", r.stderr());
            assert_eq!(now.as_deref(), Some(c));
        }
        // grok: nothing to resume, a fresh start.
        (_, None) => assert_eq!(args, ad.start_args, "{kind}: {argv:?}"),
    }
    let screen = w.screen("r1");
    assert!(ad.ready_on(&screen), "{kind} on {backend:?}: resumed, no input line:\n{screen}");
    w.mam(["stop", "r1"]).run_within(Duration::from_secs(30)).expect_rc(0);
    wait_until(&format!("no {kind} process left"), Duration::from_secs(10), || agent_procs(&w.home).is_empty());
    eprintln!(
        "{kind} on {backend:?}: create {created:?}, job {job_time:?} (herdr said {rules:?}), all {:?}",
        t0.elapsed()
    );
}

/// At most this many lives at once over the whole file (`MAM_REAL_PARALLEL`, default 4): the CLIs
/// mostly wait (for T, for their retries, for the pane), but their start-ups are CPU-bound.
fn slots() -> usize {
    std::env::var("MAM_REAL_PARALLEL").ok().and_then(|v| v.parse().ok()).filter(|n| *n > 0).unwrap_or(4)
}

static RUNNING: std::sync::Mutex<usize> = std::sync::Mutex::new(0);
static FREED: std::sync::Condvar = std::sync::Condvar::new();

/// One slot of `slots()`, held while it lives.
struct Slot;

impl Slot {
    fn take() -> Slot {
        let mut n = RUNNING.lock().unwrap_or_else(|p| p.into_inner());
        while *n >= slots() {
            n = FREED.wait(n).unwrap_or_else(|p| p.into_inner());
        }
        *n += 1;
        Slot
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        *RUNNING.lock().unwrap_or_else(|p| p.into_inner()) -= 1;
        FREED.notify_one();
    }
}

/// Every kind's life on `backend`, in parallel within `slots()`, slowest first; `MAM_REAL_KINDS`
/// (comma-separated) narrows the kinds. Fails naming each kind that failed, with its message.
fn lives(backend: Backend, kinds: &[&'static str]) {
    let only = std::env::var("MAM_REAL_KINDS").ok();
    let kinds: Vec<&'static str> =
        kinds.iter().copied().filter(|k| only.as_deref().is_none_or(|o| o.split(',').any(|x| x == *k))).collect();
    let handles: Vec<_> = kinds
        .iter()
        .map(|&kind| {
            let h = std::thread::Builder::new()
                .name(format!("{kind}-{backend:?}"))
                .spawn(move || {
                    let _slot = Slot::take();
                    life(backend, kind)
                })
                .unwrap();
            (kind, h)
        })
        .collect();
    let mut failed = Vec::new();
    for (kind, h) in handles {
        if let Err(p) = h.join() {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failed.push(format!("{kind} on {backend:?}: {msg}"));
        }
    }
    assert!(failed.is_empty(), "{} of {} failed:\n{}", failed.len(), kinds.len(), failed.join("\n\n"));
}

/// claude, codex, gemini, qwen, grok and opencode on real tmux.
#[test]
fn real_clis_on_tmux() {
    lives(Backend::Tmux, &["opencode", "gemini", "codex", "qwen", "grok", "claude"]);
}

/// claude, codex, gemini, grok and opencode on the real herdr (it has no qwen kind: below).
#[test]
fn real_clis_on_real_herdr() {
    lives(Backend::Herdr, &["opencode", "gemini", "codex", "grok", "claude"]);
}

/// herdr has no qwen kind: create refuses at once, naming the way out, and starts nothing.
#[test]
fn real_qwen_on_real_herdr_is_refused() {
    let Some(w) = W::new("real_qwen_Herdr", Backend::Herdr, "qwen") else { return };
    let t = Instant::now();
    let r = w.mam(["create", "qwen", "--name", "r1", "--no-onboard"]).run_within(Duration::from_secs(10));
    r.expect_rc(2);
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(r.stderr().contains("herdr has no agent kind for qwen; use MAM_PANE_BACKEND=tmux"), "{}", r.stderr());
    assert!(agent_procs(&w.home).is_empty());
}
