//! Issue 21, the evidence board: the workspace daemon shows each session's job state where people
//! look, on the real herdr (its sidebar state through `pane report-agent`, the state's label and the
//! pane title through `pane report-metadata`) and on real tmux (the pane title and the border's
//! `@mam_state`): working while the job beats, idle once it finished, blocked within its idle window
//! (plus one second) of going silent, and given back when the daemon or the session stops.
//!
//! N = 1 s, K = 3 (idle window 3 s), the message refresh 1 s, the daemon's sweep 1 s. A silent job's
//! wrapper is killed first, so that nobody closes the job at its idle window and what the pane shows
//! is the board's own inference (the sweep closes it 5 s later). Each world has its own herdr or tmux
//! server, broker and daemon; all of them end with the test. Skips when herdr or tmux is absent,
//! fails when `MAM_REQUIRE_HERDR=1` / `MAM_REQUIRE_TMUX=1`.

use std::ffi::OsString;
use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::*;

const IDLE_MS: u64 = 3_000;
const FAST: &[&str] = &["--heartbeat", "1", "--heartbeat-misses", "3", "--ack-timeout", "10", "--timeout", "60"];
const WAIT: Duration = Duration::from_secs(20);

/// One world: a private herdr or a private tmux server, a broker, a control root.
struct World {
    herdr: Option<HerdrHome>,
    tmux: Option<String>,
    _broker: Broker,
    td: TestDir,
    env: Vec<(String, OsString)>,
}

impl Drop for World {
    fn drop(&mut self) {
        for id in self.job_ids() {
            for pid in timer_pids(&id) {
                let _ = mam::sys::kill(pid, 9);
            }
        }
        if let Some(s) = &self.tmux {
            kill_tmux(s);
        }
    }
}

/// The fake agent as `claude SCRIPT ARGS...` (the script travels in argv: a pane inherits its
/// server's environment, not the creator's).
fn fake_claude(bin: &std::path::Path) {
    let wrapper = format!(
        "#!/usr/bin/env bash\nexport MAM_FAKE_AGENT_SCRIPT=\"$1\"\nshift\nexec -a claude '{}' \"$@\"\n",
        mam_bin().display()
    );
    fs::create_dir_all(bin).unwrap();
    fs::write(bin.join("claude"), wrapper).unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(bin.join("claude"), fs::Permissions::from_mode(0o755)).unwrap();
}

fn common_env(port: u16) -> Vec<(String, OsString)> {
    let mut env = agent_in_pane_env(port);
    env.extend([("MAM_BOARD_REFRESH_S", "1"), ("MAM_DAEMON_SWEEP_S", "1")].map(|(k, v)| (k.into(), v.into())));
    env
}

impl World {
    fn herdr(name: &str) -> Option<World> {
        let td = TestDir::new(name);
        let herdr = HerdrHome::new(&td)?;
        herdr.fake_claude();
        let broker = start_target(Target::Embedded, &td)?;
        let mut env = herdr.env();
        env.push(("MAM_PANE_BACKEND".into(), "herdr".into()));
        env.extend(common_env(broker.port()));
        Some(World { herdr: Some(herdr), tmux: None, _broker: broker, td, env })
    }

    fn tmux(name: &str) -> Option<World> {
        if !have_tool("tmux", "MAM_REQUIRE_TMUX") {
            return None;
        }
        let td = TestDir::new(name);
        let broker = start_target(Target::Embedded, &td)?;
        let bin = td.path("bin");
        fake_claude(&bin);
        let sock = format!("mam-test-{}", rand_hex(4));
        let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
        let mut env: Vec<(String, OsString)> = vec![
            ("MAM_PANE_BACKEND".into(), "tmux".into()),
            ("MAM_TMUX_SOCKET".into(), sock.clone().into()),
            ("MAM_TMUX_STABLE_MS".into(), "200".into()),
            ("PATH".into(), path.into()),
        ];
        env.extend(common_env(broker.port()));
        Some(World { herdr: None, tmux: Some(sock), _broker: broker, td, env })
    }

    fn mam(&self) -> Cmd {
        let mut c = self.td.mam();
        for (k, v) in &self.env {
            c = c.env(k, v);
        }
        c.env_remove("HERDR_SOCKET_PATH").env_remove("HERDR_SESSION").env_remove("TMUX")
    }

    fn registry(&self) -> PathBuf {
        self.td.ws().join(".mam/jobs")
    }

    fn job_ids(&self) -> Vec<String> {
        fs::read_dir(self.registry())
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_string_lossy().strip_suffix(".json").map(str::to_string))
            .filter(|n| !n.starts_with('.'))
            .collect()
    }

    fn record(&self, id: &str) -> Value {
        serde_json::from_slice(&fs::read(self.registry().join(format!("{id}.json"))).unwrap()).unwrap()
    }

    /// `mam create claude --name S --no-onboard -- SCRIPT test-double agent`; the pane.
    fn create(&self, session: &str, script: &str) -> String {
        let sp = self.td.write(&format!("{session}.script"), script);
        create_scripted(self.mam(), session, &sp)
    }

    fn daemon(&self) -> Background {
        let ws = self.td.ws();
        self.mam().args(["daemon", "run", "--workspace"]).args([ws.as_os_str()]).spawn_bg(&self.td, "daemon")
    }

    fn delegate(&self, session: &str) -> Background {
        let task = self.td.write("task.md", "Do the work, then run the success command.\n");
        self.mam()
            .args(["delegate-job", "--session", session, "--brief-file"])
            .args([task.as_os_str()])
            .args(FAST)
            .spawn_bg(&self.td, &format!("dj-{session}"))
    }

    /// The id of a running job of `session` other than `not`.
    fn running_job(&self, session: &str, not: &[&str]) -> String {
        wait_for("a running job", WAIT, || {
            self.job_ids().into_iter().find(|id| {
                let r = self.record(id);
                !not.contains(&id.as_str()) && r["agent_session"] == session && r["status"] == "running"
            })
        })
    }

    /// The signed time of the last line of the job's events.log, once its timer is gone.
    fn kill_timer(&self, id: &str) -> u64 {
        let pids = wait_for("the job's timer", WAIT, || Some(timer_pids(id)).filter(|p| !p.is_empty()));
        for pid in pids {
            let _ = mam::sys::kill(pid, 9);
        }
        wait_until("the timer gone", WAIT, || timer_pids(id).is_empty());
        last_line_ms(&self.registry().join(id).join("events.log"))
    }
}

fn last_line_ms(events: &std::path::Path) -> u64 {
    let text = fs::read_to_string(events).unwrap();
    let v: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    mam::clock::parse_ts(v["ts"].as_str().unwrap()).unwrap()
}

/// herdr's view of a pane: (agent_status, state_labels, title).
fn herdr_pane(h: &HerdrHome, pane: &str) -> (String, Value, String) {
    let v = h.herdr_json(&["pane", "get", pane]);
    let p = &v["result"]["pane"];
    (
        p["agent_status"].as_str().unwrap_or("").to_string(),
        p["state_labels"].clone(),
        p["title"].as_str().unwrap_or("").to_string(),
    )
}

fn tmux_show(sock: &str, pane: &str, format: &str) -> String {
    let out =
        std::process::Command::new("tmux").args(["-L", sock, "display", "-p", "-t", pane, format]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Job 1 beats (working), then completes (idle); job 2 beats, its timer is killed while the agent
/// lives on: blocked within the idle window plus one second, the label naming the silence; the
/// daemon's stop gives the pane back (mam's labels gone); the session's stop closes the pane.
#[test]
fn herdr_sidebar_shows_working_idle_then_blocked_and_the_daemon_stop_releases() {
    let Some(w) = World::herdr("board_herdr") else { return };
    let h = w.herdr.as_ref().unwrap();
    let pane = w.create("sb", "work_s=3\nwork_s@2=60\n");
    let mut daemon = w.daemon();
    let mut job1 = w.delegate("sb");
    let id1 = w.running_job("sb", &[]);
    let working = format!("job {id1}: ");
    // `herdr agent get`, as a person or a script asks herdr about the agent.
    let seen = poll(WAIT, || {
        let a = h.herdr_json(&["agent", "get", "sb"])["result"]["agent"].clone();
        let label = a["state_labels"]["working"].as_str().unwrap_or("").to_string();
        let title = a["title"].as_str().unwrap_or("").to_string();
        (a["agent_status"] == "working" && label.starts_with(&working) && label.ends_with("ago (signed)"))
            .then_some((label, title))
    });
    let (label, title) =
        seen.unwrap_or_else(|| panic!("never working: {:?}\n{}", herdr_pane(h, &pane), daemon.stdout()));
    assert!(title.starts_with(&format!("mam working: job {id1}: ")), "{title}");
    assert!(label.contains(" ago (signed)"), "{label}");
    // The agent's own screen detection says idle meanwhile (the fake agent's title): mam's report is
    // what herdr shows.
    let (rc, _) = job1.wait(Duration::from_secs(40));
    assert_eq!(rc, 0, "{}", job1.stderr());
    let done = format!("job {id1}: completed (signed)");
    let idle = poll(WAIT, || {
        let (st, labels, _) = herdr_pane(h, &pane);
        // herdr shows an unviewed pane that went from working to idle as `done`.
        ((st == "idle" || st == "done") && labels["idle"] == done.as_str()).then_some(st)
    });
    assert!(idle.is_some(), "never idle: {:?}\n{}", herdr_pane(h, &pane), daemon.stdout());

    let mut job2 = w.delegate("sb");
    let id2 = w.running_job("sb", &[&id1]);
    let working = format!("job {id2}: ");
    let up = poll(WAIT, || {
        let (st, labels, _) = herdr_pane(h, &pane);
        (st == "working" && labels["working"].as_str().unwrap_or("").starts_with(&working)).then_some(())
    });
    assert!(up.is_some(), "job 2 never working: {:?}\n{}", herdr_pane(h, &pane), daemon.stdout());
    // Nobody waits for it any more (the wrapper is gone), so nothing closes it at once: the board
    // infers the silence itself; the daemon's sweep closes it 5 s later (A15).
    job2.kill();
    let last = w.kill_timer(&id2);
    let blocked = poll(WAIT, || {
        let (st, labels, _) = herdr_pane(h, &pane);
        (st == "blocked").then(|| (mam::clock::now_ms(), labels["blocked"].as_str().unwrap_or("").to_string()))
    });
    let (at, _) = blocked.unwrap_or_else(|| panic!("never blocked: {:?}\n{}", herdr_pane(h, &pane), daemon.stdout()));
    // The label follows in the second call of the same report.
    let label = wait_for("the blocked label", WAIT, || herdr_pane(h, &pane).1["blocked"].as_str().map(str::to_string));
    let after = at.saturating_sub(last);
    assert!(after >= IDLE_MS - 100, "blocked {after} ms after the last beat, before the idle window");
    assert!(after <= IDLE_MS + 1_000 + 150, "blocked {after} ms after the last beat (window {IDLE_MS} ms + 1 s)");
    assert!(label.starts_with(&format!("job {id2}: no evidence for ")) && label.ends_with(" s (inferred)"), "{label}");
    eprintln!("board: blocked {after} ms after the last beat");
    assert_eq!(w.record(&id2)["status"], "running", "the board never closes a job");
    wait_until("the sweep's close", WAIT, || {
        herdr_pane(h, &pane).1["blocked"].as_str().unwrap_or("").contains("closed unresponsive")
    });
    assert_eq!(w.record(&id2)["reason"], "unresponsive");

    // The daemon stops: herdr gets the pane back (no mam label, no mam title).
    daemon.signal(15);
    let (rc, _) = daemon.wait(Duration::from_secs(10));
    assert_eq!(rc, 0, "{}", daemon.stdout());
    let (_, labels, title) = herdr_pane(h, &pane);
    assert!(labels.as_object().is_none_or(|m| m.is_empty()), "labels left: {labels}");
    assert_eq!(title, "", "title left");
    assert!(
        daemon.stdout().contains(&format!("board: session sb pane {pane}: blocked: job {id2}")),
        "{}",
        daemon.stdout()
    );
    w.mam().args(["stop", "sb"]).run_within(Duration::from_secs(60)).expect_rc(0);
    let list = h.herdr_json(&["pane", "list"]);
    assert!(!list.to_string().contains(&format!("\"{pane}\"")), "the pane was closed: {list}");
}

/// An agent that is killed while nobody waits for its job: herdr forgets the agent of a pane whose
/// process exited (and ignores lifecycle reports for it), so the pane's title says it. The daemon's
/// keeper sees the agent's recorded process gone and closes the job `agent_gone` within N + 2 s of
/// the death (issue 30; before, the sweep closed it unresponsive 5 s after its idle window), and the
/// title says the agent's process ended. The session's stop with the daemon running closes the pane
/// and the daemon stops reporting to it.
#[test]
fn herdr_pane_of_a_killed_agent_nobody_waits_for_shows_its_job_closed_agent_gone() {
    let Some(w) = World::herdr("board_killed") else { return };
    let h = w.herdr.as_ref().unwrap();
    let pane = w.create("sk", "crash_after_s=3\nwork_s=60\n");
    let mut daemon = w.daemon();
    let mut job = w.delegate("sk");
    let id = w.running_job("sk", &[]);
    wait_until("working", WAIT, || herdr_pane(h, &pane).0 == "working");
    // Nobody waits for the job: what closes it and what the title says are the daemon's.
    job.kill();
    wait_until("the agent gone", WAIT, || h.herdr(&["agent", "get", "sk"]).rc() != 0);
    let gone = mam::clock::now_ms();
    let seen = poll(WAIT, || {
        let title = herdr_pane(h, &pane).2;
        title.starts_with("mam blocked: ").then(|| (mam::clock::now_ms(), title))
    });
    let (_, title) =
        seen.unwrap_or_else(|| panic!("no blocked title: {:?}\n{}", herdr_pane(h, &pane), daemon.stdout()));
    assert!(title.starts_with(&format!("mam blocked: job {id}: closed, the agent's process ended")), "{title}");
    let rec = w.record(&id);
    assert_eq!(rec["reason"], "agent_gone", "{}", daemon.stdout());
    let closed = mam::clock::parse_ts(rec["finished_at"].as_str().unwrap()).unwrap();
    // N = 1 s: within N + 2 s of the death (seen by herdr a little after it).
    assert!(closed <= gone + 3_000, "closed {} ms after herdr saw the agent gone", closed.saturating_sub(gone));
    wait_until("the timer gone", WAIT, || timer_pids(&id).is_empty());
    w.mam().args(["stop", "sk"]).run_within(Duration::from_secs(60)).expect_rc(0);
    let list = h.herdr_json(&["pane", "list"]);
    assert!(!list.to_string().contains(&format!("\"{pane}\"")), "the pane was closed: {list}");
    // Two more ticks: nothing is reported to the closed pane.
    let lines = daemon.stdout().lines().count();
    pause_until(Instant::now() + Duration::from_millis(2_500));
    let out = daemon.stdout();
    let new: Vec<&str> = out.lines().skip(lines).collect();
    assert!(new.iter().all(|l| !l.contains(&pane)), "reports after the stop: {new:?}");
    daemon.signal(15);
    assert_eq!(daemon.wait(Duration::from_secs(10)).0, 0);
}

/// tmux: the same transitions in the pane title (`#{pane_title}`) and the border's `@mam_state` on
/// mam's own server; the daemon's stop clears both.
#[test]
fn tmux_pane_title_shows_working_idle_then_blocked() {
    let Some(w) = World::tmux("board_tmux") else { return };
    let sock = w.tmux.clone().unwrap();
    let pane = w.create("tb", "work_s=5\nwork_s@2=60\n");
    let mut daemon = w.daemon();
    let title = || tmux_show(&sock, &pane, "#{pane_title}");
    let mut job1 = w.delegate("tb");
    let id1 = w.running_job("tb", &[]);
    let want = format!("mam working: job {id1}: ");
    let seen = poll(WAIT, || title().starts_with(&want).then_some(()));
    assert!(seen.is_some(), "title {:?}\n{}", title(), daemon.stdout());
    let state = tmux_show(&sock, &pane, "#{@mam_state}");
    assert!(state.starts_with(&format!("working: job {id1}: ")), "{state}");
    let format =
        std::process::Command::new("tmux").args(["-L", &sock, "show", "-gv", "pane-border-format"]).output().unwrap();
    assert!(String::from_utf8_lossy(&format.stdout).contains("@mam_state"), "border format");
    assert_eq!(job1.wait(Duration::from_secs(40)).0, 0, "{}", job1.stderr());
    let done = format!("mam idle: job {id1}: completed (signed)");
    assert!(poll(WAIT, || (title() == done).then_some(())).is_some(), "title {:?}\n{}", title(), daemon.stdout());

    let mut job2 = w.delegate("tb");
    let id2 = w.running_job("tb", &[&id1]);
    let want = format!("mam working: job {id2}: ");
    assert!(poll(WAIT, || title().starts_with(&want).then_some(())).is_some(), "title {:?}", title());
    job2.kill();
    let last = w.kill_timer(&id2);
    let blocked = poll(WAIT, || {
        let t = title();
        t.starts_with("mam blocked: ").then(|| (mam::clock::now_ms(), t))
    });
    let (at, t) = blocked.unwrap_or_else(|| panic!("never blocked: {:?}\n{}", title(), daemon.stdout()));
    assert!(t.starts_with(&format!("mam blocked: job {id2}: no evidence for")), "{t}");
    let after = at.saturating_sub(last);
    assert!(after <= IDLE_MS + 1_000 + 150, "blocked {after} ms after the last beat");
    assert!(tmux_show(&sock, &pane, "#{@mam_state}").starts_with("blocked: "));
    daemon.signal(15);
    assert_eq!(daemon.wait(Duration::from_secs(10)).0, 0);
    assert_eq!(tmux_show(&sock, &pane, "#{@mam_state}"), "");
    assert!(!title().starts_with("mam "), "{}", title());
    w.mam().args(["stop", "tb"]).run_within(Duration::from_secs(60)).expect_rc(0);
}

/// Issue 30, "waiting for you": an agent that started its job and went back to its input line
/// without `completed` keeps its job open (its timer beats while it lives), and after
/// `MAM_WAITING_FOR_YOU_S` (2 s here) at the input line the board shows the job as waiting for the
/// person, from the screen; on herdr as the `blocked` sidebar state with the label, on tmux in the
/// title and border.
#[test]
fn an_agent_back_at_its_input_line_with_its_job_open_shows_waiting_for_you() {
    for w in [World::tmux("board_wait_tmux"), World::herdr("board_wait_herdr")].into_iter().flatten() {
        let mut w = w;
        w.env.push(("MAM_WAITING_FOR_YOU_S".into(), "2".into()));
        let hook = format!(
            "echo \"$MAM_VERDICT $MAM_VERDICT_JOB_ID $MAM_VERDICT_STATUS $MAM_VERDICT_REASON\" >>'{}'",
            w.td.path("hook.txt").display()
        );
        w.env.push(("MAM_ON_VERDICT".into(), hook.into()));
        let pane = w.create("wy", "no_completed=1\nwork_s=0.2\n");
        let mut daemon = w.daemon();
        let mut job = w.delegate("wy");
        let id = w.running_job("wy", &[]);
        let want = format!("job {id}: waiting for you: idle at its input line for ");
        let shown = || match (&w.tmux, &w.herdr) {
            (Some(sock), _) => tmux_show(sock, &pane, "#{@mam_state}"),
            (None, Some(h)) => {
                let (st, labels, _) = herdr_pane(h, &pane);
                format!("{st}: {}", labels["blocked"].as_str().unwrap_or(""))
            }
            _ => unreachable!(),
        };
        let seen = poll(WAIT, || shown().starts_with(&format!("blocked: {want}")).then_some(()));
        assert!(seen.is_some(), "{:?}\n{}", shown(), daemon.stdout());
        assert!(shown().ends_with(" (screen)"), "{}", shown());
        assert_eq!(w.record(&id)["status"], "running", "the job stays open; its deadline still ends it");
        // status and ui show it too, and the hook ran once with MAM_VERDICT=waiting_for_you.
        let status = w.mam().args(["status", "wy"]).run_within(WAIT);
        let line = format!("  job {id} task running (waiting for you: idle at its input line for ");
        assert!(status.stdout().lines().any(|l| l.starts_with(&line)), "{}", status.stdout());
        let ui = w.mam().args(["ui", "--snapshot", "160x30"]).run_within(WAIT).stdout();
        let row = ui.lines().find(|l| l.trim_start_matches(['>', ' ']).starts_with(&id[..8])).unwrap_or("");
        assert!(row.contains("waiting for you: idle at its input"), "{ui}");
        let sess = ui.lines().find(|l| l.contains(" wy ") && l.contains("claude")).unwrap_or("");
        assert!(sess.contains(" waiting "), "the session's state: {ui}");
        let hooked = w.td.path("hook.txt");
        let said = wait_for("the waiting hook", WAIT, || fs::read_to_string(&hooked).ok().filter(|t| !t.is_empty()));
        assert!(said.starts_with(&format!("waiting_for_you {id} running idle at its input line for ")), "{said}");
        // The job's end takes the waiting state down.
        w.mam().args(["registry", "status", &id, "--set", "cancelled", "--no-publish"]).run_within(WAIT).expect_rc(0);
        let waiting = w.registry().join(&id).join("waiting.json");
        wait_until("waiting.json removed", WAIT, || !waiting.exists());
        let status = w.mam().args(["status", "wy"]).run_within(WAIT);
        assert!(!status.stdout().contains("waiting for you"), "{}", status.stdout());
        let text = fs::read_to_string(&hooked).unwrap();
        assert_eq!(text.lines().filter(|l| l.starts_with("waiting_for_you ")).count(), 1, "one per waiting: {text}");
        job.kill();
        daemon.signal(15);
        assert_eq!(daemon.wait(Duration::from_secs(10)).0, 0);
        w.mam().args(["stop", "wy"]).run_within(Duration::from_secs(60)).expect_rc(0);
    }
}

/// Issue 29 item 3: a state report whose text an agent forged (terminal escapes, a newline, a leading
/// `--help`, 500 characters) reaches the real herdr as one plain bounded line: the report succeeds and
/// the pane's title and state label carry no control character.
#[test]
fn i29_a_forged_report_text_reaches_the_real_herdr_as_one_plain_bounded_line() {
    let td = TestDir::new("i29-report");
    let Some(mut h) = HerdrHome::new(&td) else { return };
    h.start_server();
    let v = h.herdr_json(&["workspace", "create", "--cwd", td.ws().to_str().unwrap()]);
    let pane = v["result"]["root_pane"]["pane_id"].as_str().unwrap_or_else(|| panic!("no root pane: {v}")).to_string();
    let ctx = mam::ctx::Ctx::with_env(h.env(), &td.ws());
    let b = mam::pane::open_named(&ctx, "herdr", Some(&h.session)).unwrap_or_else(|e| panic!("{e}"));
    let forged = format!("--help\x1b]0;owned\x07\x1b[2J\nline two\r{}", "x".repeat(500));
    let r = mam::pane::StateReport {
        state: mam::pane::Status::Blocked,
        message: forged.clone(),
        title: forged,
        ttl_ms: None,
        seq: 1,
    };
    b.report_state(&pane, "claude", &r).unwrap_or_else(|e| panic!("the report failed: {e}"));
    let (_, labels, title) = herdr_pane(&h, &pane);
    let labels = labels.to_string();
    assert!(!labels.contains("\\u001b") && !labels.contains("\\n") && !labels.contains("\\u0007"), "{labels}");
    assert!(labels.contains("--help ]0;owned  [2J line two x"), "{labels}");
    // herdr trims the space mam puts before a leading `-`.
    assert!(title.trim_start().starts_with("--help ]0;owned  [2J line two x"), "{title:?}");
    assert!(!title.chars().any(char::is_control) && title.chars().count() <= 80, "{title:?}");
}
