//! The real agent CLIs doing real jobs (issue 30): claude and codex, in their DEFAULT permission and
//! sandbox modes, talk to the scripted model (`mam test-double model`, src/testdouble/model.rs) on
//! loopback, which reads mam's prompt and brief and runs the brief's commands through the CLI's own
//! shell tool. One session gets job after job: create's onboarding job, a job done, a job that never
//! starts (`agent_blocked`), a job done again; in the default modes then a job waiting at claude's
//! approval dialog (`agent_blocked`, the reason names the command), one the agent leaves without
//! `completed` (open until its deadline) and one whose agent is killed mid-command (unresponsive);
//! then stop.
//!
//! What each CLI does on the way (docs/AGENTS.md "claude", "codex"): claude runs mam's publish lines
//! without an approval prompt because create wrote one allow rule into the project's
//! `.claude/settings.local.json` (stop takes it out again); codex's default sandbox keeps its commands
//! off the loopback broker, so its events reach the broker from disk through the daemon.
//!
//! Like agents_real.rs: skipped without `MAM_AGENTS_BIN` unless `MAM_REQUIRE_AGENTS=1`; a private HOME,
//! self-updates off; every model call goes to the scripted model.

use std::fs;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::agents_real::{agent_procs, Backend, W};
use crate::support::*;

/// What a loaded 2-core machine adds to a measured time.
const SLACK: Duration = Duration::from_secs(2);

/// The scripted model of one test, ended with it.
struct Model {
    bg: Background,
    url: String,
    log: std::path::PathBuf,
}

impl Model {
    fn start(w: &W) -> Model {
        let log = w.td.path("model.log");
        let mut bg =
            w.td.mam().args(["test-double", "model", "--log"]).args([log.as_os_str()]).spawn_bg(&w.td, "model");
        bg.wait_stdout("http://127.0.0.1:", Duration::from_secs(10));
        let url = bg.stdout().trim().to_string();
        Model { bg, url, log }
    }

    /// The tool results the CLI sent back for job `jid`.
    fn results(&self, jid: &str) -> Vec<String> {
        fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["job"] == jid)
            .flat_map(|v| v["tool_results"].as_array().cloned().unwrap_or_default())
            .filter_map(|r| r.as_str().map(str::to_string))
            .collect()
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        self.bg.signal(15);
    }
}

/// One job: its stdout's last line and rc, and how long delegate-job took. It is delegated once the
/// agent is idle at its input line: a prompt tmux typed while claude still ran its last turn after
/// `completed` was lost (not queued, not on screen; issue 30 item 5, which the lead is fixing in the
/// tmux backend; this wait keeps the test about the jobs meanwhile).
fn job(w: &W, session: &str, task: &str, ack: u32) -> (i32, String, String, Duration) {
    job_k(w, session, task, ack, 10)
}

/// `job` with K = `misses` (N is 2 s).
fn job_k(w: &W, session: &str, task: &str, ack: u32, misses: u32) -> (i32, String, String, Duration) {
    let idle = poll(Duration::from_secs(30), || {
        w.mam(["status", session]).run().stdout().contains("\trunning\tidle\t").then_some(())
    });
    if idle.is_none() {
        panic!("{session} not idle: {}\n--- screen\n{}", w.mam(["status", session]).run().stdout(), w.screen(session));
    }
    let f = w.td.write(&format!("task-{}.md", rand_hex(3)), task);
    let t = Instant::now();
    let r = w
        .mam(["delegate-job", "--session", session, "--brief-file"])
        .args([f.as_os_str()])
        .args(["--ack-timeout", &ack.to_string(), "--heartbeat", "2", "--heartbeat-misses", &misses.to_string()])
        .args(["--timeout", "90"])
        .run_within(Duration::from_secs(120));
    let took = t.elapsed();
    let last = r.stdout().lines().last().unwrap_or_default().to_string();
    (r.rc(), last, r.stderr(), took)
}

/// The scripted model for `kind` in `w`: the environment and (codex) the config that point the CLI at
/// it, onboarding's T of 60 s and a short "waiting for you".
fn with_model(w: &mut W, kind: &str) -> Model {
    let model = Model::start(w);
    // The CLI reaches the model on loopback, never through the (closed) proxy W sets.
    w.env.push(("NO_PROXY".into(), "127.0.0.1,localhost".into()));
    w.env.push(("no_proxy".into(), "127.0.0.1,localhost".into()));
    w.env.push(("ANTHROPIC_BASE_URL".into(), model.url.clone().into()));
    // Onboarding is a job too: T of 60 s (the model answers at once; a prompt waiting for approval
    // would show as agent_blocked here).
    w.env.push(("MAM_ACK_TIMEOUT_S".into(), "60".into()));
    w.env.push(("MAM_WAITING_FOR_YOU_S".into(), "3".into()));
    if kind == "codex" {
        fs::create_dir_all(w.home.join(".codex")).unwrap();
        fs::write(
            w.home.join(".codex/config.toml"),
            format!(
                "model_provider = \"mam\"\nmodel = \"mam-scripted-model\"\n[model_providers.mam]\nname = \"mam\"\n\
                 base_url = \"{}/v1\"\nwire_api = \"responses\"\nenv_key = \"OPENAI_API_KEY\"\n",
                model.url
            ),
        )
        .unwrap();
    }
    model
}

/// The whole sequence for `kind` started with the user's `args` (a permission mode) and `env`.
fn jobs(backend: Backend, kind: &str, args: &[&str], env: &[(&str, &str)]) {
    let tag = if args.is_empty() { "default".to_string() } else { rand_hex(2) };
    let Some(mut w) = W::new(&format!("jobs_{kind}_{backend:?}_{tag}"), backend, kind) else { return };
    for (k, v) in env {
        w.env.push((k.to_string(), v.into()));
    }
    let model = with_model(&mut w, kind);
    // The workspace daemon, as a user's create starts it (the harness turns the autostart off): its
    // board shows "waiting for you" (step 5) and it forwards a sandbox's events from disk.
    let ws = w.td.ws();
    fs::create_dir_all(ws.join(".mam")).unwrap();
    let daemon = w.mam(["daemon", "run", "--workspace"]).args([ws.as_os_str()]).spawn_bg(&w.td, "daemon");
    let t0 = Instant::now();
    // 1. create, with its onboarding job done by the agent.
    let r = w.mam(["create", kind, "--name", "j1", "--"]).args(args).run_within(Duration::from_secs(150));
    let created = t0.elapsed();
    assert_eq!(r.rc(), 0, "{kind}: create: {}\n{}\n--- screen\n{}", r.stdout(), r.stderr(), w.screen("j1"));
    let onboard = kv(&r.stdout(), "ONBOARD_JOB");
    let settings = w.td.ws().join(".claude/settings.local.json");
    if kind == "claude" {
        let v: Value = serde_json::from_str(&fs::read_to_string(&settings).unwrap()).unwrap();
        let bash = format!("Bash({} publish *)", mam_bin().display());
        let report = format!("Edit(/{}/*/report.md)", w.td.ws().join(".mam/jobs").display());
        assert_eq!(v["permissions"]["allow"], serde_json::json!([bash, report]), "{v}");
    }
    // 2. A job done: started, a real shell command, progress, completed.
    let (rc, last, err, t_done) = job(&w, "j1", "This agent does the job.\n", 30);
    assert_eq!(rc, 0, "{kind}: {last}\n{err}\n--- screen\n{}", w.screen("j1"));
    let jid = kv(&last, "JOB_ID");
    assert!(last.contains("STATUS=completed"), "{last}");
    // Issue 30: delegate-job returns within 1 s of the verdict (the agent's `completed` on disk).
    let returned = mam::clock::now_ms();
    let log = fs::read_to_string(w.td.ws().join(".mam/jobs").join(&jid).join("events.log")).unwrap();
    let completed_ms = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["event"] == "completed")
        .and_then(|v| mam::clock::parse_ts(v["ts"].as_str()?))
        .unwrap_or_else(|| panic!("no completed in {log}"));
    let after = returned.saturating_sub(completed_ms);
    eprintln!("{kind} on {backend:?}: delegate-job returned {after} ms after the agent's completed");
    assert!(after <= 1000 + SLACK.as_millis() as u64, "{kind}: returned {after} ms after completed");
    let worked = format!("mam-model: job {jid} worked");
    assert!(model.results(&jid).iter().any(|r| r.contains(&worked)), "{kind}: {:?}", model.results(&jid));
    // What the CLI's shell gave back for mam's own lines (codex's sandbox: the broker is out of reach).
    let mut seen = model.results(&jid);
    seen.dedup();
    seen.sort();
    seen.dedup();
    for r in seen.iter().filter(|r| r.contains("published") || r.contains("WARNING") || r.contains("ERROR")) {
        eprintln!("{kind}: {jid}: {}", r.replace('\n', " | "));
    }
    // 3. A job that never starts: agent_blocked, T after the prompt (plus the delivery grace the lead
    // is taking out of T's start: asserted loosely here, issue 30 item 4).
    let (rc, last, err, t_blocked) = job(&w, "j1", "This agent never runs mam's commands.\n", 5);
    assert_eq!(rc, 3, "{kind}: {last}\n{err}\n--- screen\n{}", w.screen("j1"));
    assert!(last.contains("STATUS=agent_blocked"), "{last}");
    assert!(t_blocked < Duration::from_secs(30), "{kind}: agent_blocked after {t_blocked:?}");
    // 4. Done again: the session is not locked out by the verdict before.
    let (rc, last, err, t_again) = job(&w, "j1", "This agent does the job again.\n", 30);
    assert_eq!(rc, 0, "{kind}: {last}\n{err}\n--- screen\n{}", w.screen("j1"));
    assert!(last.contains("STATUS=completed"), "{last}");
    // 4b. A long command without a word (12 s, K x N = 6 s): the heartbeat keeps the job alive; codex's
    // comes from outside its sandbox, whose commands see no agent to watch.
    let (rc, last, err, _) = job_k(&w, "j1", "This agent works long without speaking for 12 s.\n", 30, 3);
    assert_eq!(rc, 0, "{kind}: {last}\n{err}\n--- screen\n{}", w.screen("j1"));
    assert!(last.contains("STATUS=completed"), "{last}");
    let sandboxed = kind == "codex" && args.is_empty();
    assert_eq!(err.contains("its heartbeat comes from a timer outside it"), sandboxed, "{kind}: {err}");
    if sandboxed {
        // 4c. The same with `--detach`: nobody waits, so the daemon's keeper arms the timer outside
        // the sandbox, and `mam wait` gives the verdict.
        let f = w.td.write("detached.md", "This agent works long without speaking for 12 s.\n");
        let r = w
            .mam(["delegate-job", "--session", "j1", "--brief-file"])
            .args([f.as_os_str()])
            // K x N = 10 s: still shorter than the 12 s of silence (without the keeper's timer the
            // job is unresponsive), with room for the keeper's 1 s tick on a loaded machine.
            .args(["--ack-timeout", "30", "--heartbeat", "2", "--heartbeat-misses", "5", "--timeout", "90", "--detach"])
            .run_within(Duration::from_secs(60));
        assert_eq!(r.rc(), 0, "{kind}: {}\n{}", r.stdout(), r.stderr());
        let jid = kv(r.stdout().lines().last().unwrap_or_default(), "JOB_ID");
        let v = w.mam(["wait", &jid, "--timeout", "60"]).run_within(Duration::from_secs(70));
        assert_eq!(v.rc(), 0, "{kind}: {}{}\n--- daemon\n{}", v.stdout(), v.stderr(), daemon.stdout());
        assert!(v.stdout().contains("VERDICT=completed"), "{}", v.stdout());
        let said =
            format!("job {jid}: nobody waits for it; its sandboxed agent's heartbeat comes from a timer outside");
        assert!(daemon.stdout().contains(&said), "{kind}: {}", daemon.stdout());
    }
    if args.is_empty() {
        // 5. The agent returns to its input line without `completed`: its timer beats while it lives, so
        // the job stays open until its deadline (the lead's "waiting for you" state comes on top).
        let f = w.td.write("nocompleted.md", "This agent finishes its turn without completed.\n");
        let t = Instant::now();
        let mut bg = w
            .mam(["delegate-job", "--session", "j1", "--brief-file"])
            .args([f.as_os_str()])
            .args(["--ack-timeout", "30", "--heartbeat", "2", "--heartbeat-misses", "3", "--timeout", "12"])
            .spawn_bg(&w.td, "nocompleted");
        // Meanwhile the board shows the job waiting for the person (MAM_WAITING_FOR_YOU_S=3).
        let pane = w.row("j1")["pane"]["id"].as_str().unwrap().to_string();
        let shown = || match (&w.tmux, &w.real) {
            (Some(sock), _) => String::from_utf8_lossy(
                &std::process::Command::new("tmux")
                    .args(["-L", sock, "display", "-p", "-t", &pane, "#{@mam_state}"])
                    .output()
                    .unwrap()
                    .stdout,
            )
            .to_string(),
            (None, Some(h)) => h.herdr(&["pane", "get", &pane]).stdout(),
            _ => unreachable!(),
        };
        let waiting =
            poll(Duration::from_secs(11), || shown().contains("waiting for you: idle at its input line").then_some(()));
        assert!(
            waiting.is_some(),
            "{kind}: {}\n--- daemon\n{}\n--- screen\n{}",
            shown(),
            daemon.stdout(),
            w.screen("j1")
        );
        let (rc, _) = bg.wait(Duration::from_secs(60));
        let r = bg;
        assert_eq!(rc, 4, "{kind}: {}\n{}", r.stdout(), r.stderr());
        // codex in its sandbox too: its heartbeat comes from a timer mam arms outside the sandbox.
        assert!(r.stderr().contains("deadline of 12 s reached"), "{kind}: {}", r.stderr());
        let t_open = t.elapsed();
        // 6. (claude, default mode) A command mam did not allow waits at claude's approval dialog: the job
        // closes agent_blocked, and the reason says which approval the agent waits for.
        if kind == "claude" && args.is_empty() {
            let (rc, last, err, _) = job(&w, "j1", "This agent needs an approval first.\n", 5);
            assert_eq!(rc, 3, "{kind}: {last}\n{err}\n--- screen\n{}", w.screen("j1"));
            assert!(
                err.contains("the agent waits for an approval (Bash command: touch mam-model-approval)"),
                "{err}\n--- screen\n{}",
                w.screen("j1")
            );
            assert!(!w.td.ws().join("mam-model-approval").exists(), "nothing approved it");
            // The user says no (Esc), and the agent waits at its input line again.
            let pane = w.row("j1")["pane"]["id"].as_str().unwrap().to_string();
            match (&w.tmux, &w.real) {
                (Some(sock), _) => {
                    std::process::Command::new("tmux")
                        .args(["-L", sock, "send-keys", "-t", &pane, "Escape"])
                        .output()
                        .unwrap();
                }
                (None, Some(h)) => {
                    h.herdr(&["pane", "send-keys", &pane, "Escape"]);
                }
                _ => unreachable!(),
            }
        }
        // 7. The agent is killed mid-command: no heartbeat without it; unresponsive after K x N.
        wait_until("j1 idle at its input line", Duration::from_secs(30), || {
            w.mam(["status", "j1"]).run().stdout().contains("\trunning\tidle\t")
        });
        let f = w.td.write("killed.md", "This agent is killed mid-command.\n");
        let mut bg = w
            .mam(["delegate-job", "--session", "j1", "--brief-file"])
            .args([f.as_os_str()])
            .args(["--ack-timeout", "30", "--heartbeat", "2", "--heartbeat-misses", "3", "--timeout", "90"])
            .spawn_bg(&w.td, "killed");
        wait_until("the agent runs `sleep 300`", Duration::from_secs(30), || {
            fs::read_to_string(&model.log).unwrap_or_default().contains("\"text\":\"sleep 300\"")
        });
        let before: Vec<i32> = agent_procs(&w.home).iter().map(|p| p.0).collect();
        let killed = Instant::now();
        for &p in &before {
            let _ = mam::sys::kill(p, 9);
        }
        let (rc, _) = bg.wait(Duration::from_secs(60));
        let t_dead = killed.elapsed();
        assert_eq!(rc, 4, "{kind}: {}\n{}", bg.stdout(), bg.stderr());
        assert!(bg.stderr().contains("ended with the job open; closed deadline_timeout"), "{}", bg.stderr());
        // Closed within N + 2 s of the death (N = 2 s here), not K x N after the last beat.
        assert!(t_dead <= Duration::from_secs(4) + SLACK, "{kind}: closed {t_dead:?} after the kill");
        // The command the agent ran outlives it (an orphaned `sleep 300`): end it here.
        for p in mam::sys::list_pids().unwrap_or_default() {
            let argv = mam::sys::proc_cmdline(p).unwrap_or_default();
            let ours = mam::sys::proc_environ_var(p, "HOME").ok().flatten().as_deref()
                == Some(w.home.as_os_str().as_encoded_bytes());
            if ours && argv.first().is_some_and(|a| a.ends_with(b"sleep")) {
                let _ = mam::sys::kill(p, 9);
            }
        }
        eprintln!(
            "{kind} on {backend:?}: no completed: deadline after {t_open:?}; killed: closed {t_dead:?} after the kill"
        );
    }
    daemon.signal(15);
    // 8. stop: the CLI is gone, and so is mam's allow rule (the file mam created with it).
    w.mam(["stop", "j1"]).run_within(Duration::from_secs(30)).expect_rc(0);
    wait_until(&format!("no {kind} process left"), Duration::from_secs(10), || agent_procs(&w.home).is_empty());
    assert!(!settings.exists(), "{kind}: {:?}", fs::read_to_string(&settings));
    eprintln!(
        "{kind} {args:?} on {backend:?}: create+onboard {created:?} ({onboard}), done {t_done:?}, agent_blocked (T=5) \
         {t_blocked:?}, done {t_again:?}, all {:?}",
        t0.elapsed()
    );
}

#[test]
fn real_claude_does_jobs_on_tmux() {
    jobs(Backend::Tmux, "claude", &[], &[]);
}

#[test]
fn real_codex_does_jobs_on_tmux() {
    jobs(Backend::Tmux, "codex", &[], &[]);
}

/// Every mode a user may choose passes create's ready check (claude's footer is no longer `? for
/// shortcuts`) and does the jobs; bypass's warning dialog is answered because the user asked for the
/// mode. As root claude refuses bypass unless IS_SANDBOX=1 (docs/AGENTS.md).
#[test]
fn real_claude_does_jobs_in_the_modes_a_user_chooses() {
    jobs(Backend::Tmux, "claude", &["--permission-mode", "acceptEdits"], &[]);
    jobs(Backend::Tmux, "claude", &["--permission-mode", "bypassPermissions"], &[("IS_SANDBOX", "1")]);
    jobs(Backend::Tmux, "claude", &["--dangerously-skip-permissions"], &[("IS_SANDBOX", "1")]);
}

#[test]
fn real_codex_does_jobs_without_its_sandbox() {
    jobs(Backend::Tmux, "codex", &["--dangerously-bypass-approvals-and-sandbox"], &[]);
}

#[test]
fn real_claude_does_jobs_on_real_herdr() {
    jobs(Backend::Herdr, "claude", &[], &[]);
}

#[test]
fn real_codex_does_jobs_on_real_herdr() {
    jobs(Backend::Herdr, "codex", &[], &[]);
}

/// Issue 30 item 7: two codex sessions in one directory each keep their own conversation at stop
/// (before, both got the newest rollout's id): the rollout a session's codex holds open is its own.
#[test]
fn real_codex_sessions_in_one_directory_keep_their_own_conversations() {
    let Some(mut w) = W::new("codex_two", Backend::Tmux, "codex") else { return };
    let _model = with_model(&mut w, "codex");
    let mut onboard = Vec::new();
    for name in ["c1", "c2"] {
        let r = w.mam(["create", "codex", "--name", name]).run_within(Duration::from_secs(150));
        assert_eq!(r.rc(), 0, "create {name}: {}\n{}", r.stdout(), r.stderr());
        onboard.push(kv(&r.stdout(), "ONBOARD_JOB"));
    }
    for name in ["c1", "c2"] {
        w.mam(["stop", name]).run_within(Duration::from_secs(30)).expect_rc(0);
    }
    let ids: Vec<String> = ["c1", "c2"]
        .iter()
        .map(|n| w.row(n)["conversation_id"].as_str().unwrap_or_else(|| panic!("{n}: no conversation")).to_string())
        .collect();
    assert_ne!(ids[0], ids[1], "both sessions got one conversation");
    // Each id's rollout holds its own session's onboarding prompt.
    for (id, job) in ids.iter().zip(&onboard) {
        let rollout = walk(&w.home.join(".codex/sessions"))
            .into_iter()
            .find(|p| p.to_string_lossy().ends_with(&format!("{id}.jsonl")))
            .unwrap_or_else(|| panic!("no rollout for {id}"));
        let text = fs::read_to_string(&rollout).unwrap();
        assert!(text.contains(&format!("Job {job}:")), "{id}'s rollout lacks job {job}");
    }
}

/// Every file under `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
