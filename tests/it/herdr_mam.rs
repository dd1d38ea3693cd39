//! mam's herdr backend on the real herdr 0.8 (issue 11): placement from real geometry (ORCH 1.5),
//! the start-up dialog rule (1.9 test 10), sessions (2.8) and delegations (3.7) in real herdr panes,
//! and faults (the server killed mid-job, an agent that exits at start, a pane closed during a
//! prompt). Each world is a `support::HerdrHome` whose server mam itself bootstraps; the fake agent
//! stands in for claude (herdr classifies it from its window title and dialog).
//!
//! Skips when herdr is absent, fails when `MAM_REQUIRE_HERDR=1` (CI).

use std::ffi::OsString;
use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::*;

/// One world: a private herdr (dropped first: its server and every pane process end with it), a
/// broker when the test delegates, and a control root.
struct W {
    herdr: HerdrHome,
    broker: Option<Broker>,
    td: TestDir,
}

impl W {
    fn new(name: &str, with_broker: bool) -> Option<W> {
        let td = TestDir::new(name);
        let herdr = HerdrHome::new(&td)?;
        herdr.fake_claude();
        let broker = if with_broker { Some(start_target(Target::Embedded, &td)?) } else { None };
        Some(W { herdr, broker, td })
    }

    fn env(&self) -> Vec<(String, OsString)> {
        let port = self.broker.as_ref().map_or_else(free_port, Broker::port);
        let mut env = self.herdr.env();
        env.push(("MAM_PANE_BACKEND".into(), "herdr".into()));
        env.extend(agent_in_pane_env(port));
        env.push(("MAM_NO_SUBSCRIBER_DAEMON".into(), "1".into()));
        env
    }

    fn mam(&self) -> Cmd {
        let mut c = self.td.mam().cwd(self.td.ws());
        for (k, v) in self.env() {
            c = c.env(k, v);
        }
        c.env_remove("HERDR_SOCKET_PATH").env_remove("HERDR_SESSION").env_remove("TMUX")
    }

    fn script(&self, name: &str, text: &str) -> PathBuf {
        self.td.write(&format!("{name}.script"), text)
    }

    /// `mam pane new-session` of a fake agent named `name` driven by `script`; the run.
    fn place(&self, name: &str, script: &str) -> Run {
        let sp = self.script(name, script);
        let cwd = self.td.ws();
        self.mam()
            .args(["pane", "new-session", "--agent", "claude", "--name", name, "--cwd"])
            .args([cwd.as_os_str(), "--".as_ref(), sp.as_os_str(), "test-double".as_ref(), "agent".as_ref()])
            .run_within(Duration::from_secs(60))
    }

    /// `mam create claude --name S --no-onboard -- SCRIPT test-double agent`; the pane.
    fn create(&self, session: &str, script: &str) -> String {
        let sp = self.script(session, script);
        create_scripted(self.mam(), session, &sp)
    }

    /// Pane id -> (x, y) of every pane of `workspace`, from `herdr pane layout`.
    fn layout(&self, any_pane: &str) -> Vec<(String, i64, i64)> {
        let v = self.herdr.herdr_json(&["pane", "layout", "--pane", any_pane]);
        let panes = v["result"]["layout"]["panes"].as_array().unwrap_or_else(|| panic!("no layout: {v}"));
        panes
            .iter()
            .map(|p| {
                let r = &p["rect"];
                (p["pane_id"].as_str().unwrap().to_string(), r["x"].as_i64().unwrap(), r["y"].as_i64().unwrap())
            })
            .collect()
    }

    fn status(&self, target: &str) -> String {
        let r = self.mam().args(["pane", "status", "--target", target]).run();
        r.expect_rc(0);
        r.stdout().trim().to_string()
    }

    fn registry(&self) -> PathBuf {
        self.td.ws().join(".mam/jobs")
    }

    fn record(&self, id: &str) -> Value {
        serde_json::from_slice(&fs::read(self.registry().join(format!("{id}.json"))).unwrap()).unwrap()
    }
}

impl Drop for W {
    fn drop(&mut self) {
        // The agents are gone with the server; a timer ends within N s of its agent, but the test
        // does not wait for that.
        for e in fs::read_dir(self.registry()).into_iter().flatten().flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if let Some(id) = n.strip_suffix(".json") {
                for pid in timer_pids(id) {
                    let _ = mam::sys::kill(pid, 9);
                }
            }
        }
    }
}

/// The columns of a layout, left to right, each the panes' ids top to bottom.
fn columns(layout: &[(String, i64, i64)]) -> Vec<Vec<String>> {
    let mut xs: Vec<i64> = layout.iter().map(|p| p.1).collect();
    xs.sort();
    xs.dedup();
    xs.iter()
        .map(|x| {
            let mut col: Vec<&(String, i64, i64)> = layout.iter().filter(|p| p.1 == *x).collect();
            col.sort_by_key(|p| p.2);
            col.iter().map(|p| p.0.clone()).collect()
        })
        .collect()
}

/// ORCH 1.5 with R = 2 on real geometry: 1 to 6 agents in one cwd give, after each placement, the
/// decided grid (second pane right of the root; then the column with fewer panes splits down, ties
/// to the left), and the fifth agent opens a second workspace: 4 + 2, never 4 + 1 + 1.
#[test]
fn o1_5_one_to_six_agents_fill_the_grid_of_real_herdr() {
    let Some(w) = W::new("herdr_grid", false) else { return };
    let script = "report_working=0\n";
    let mut placed: Vec<(String, String)> = Vec::new();
    // Column sizes of the first workspace after 1, 2, 3, 4 agents.
    let want = [vec![1], vec![1, 1], vec![2, 1], vec![2, 2]];
    for i in 0..6 {
        let r = w.place(&format!("g{i}"), script);
        r.expect_rc(0);
        let out = r.stdout();
        assert_eq!(kv(&out, "REUSED"), "0", "{out}");
        placed.push((kv(&out, "PANE"), kv(&out, "WORKSPACE")));
        let first = &placed[0];
        let cols = columns(&w.layout(&first.0));
        if let Some(want) = want.get(i) {
            let sizes: Vec<usize> = cols.iter().map(Vec::len).collect();
            assert_eq!(&sizes, want, "after {} agents: {cols:?}", i + 1);
            assert!(placed.iter().all(|p| p.1 == first.1), "{placed:?}");
        } else {
            assert_eq!(cols.iter().map(Vec::len).sum::<usize>(), 4, "the first workspace stays full");
        }
    }
    // The first workspace's columns, in placement order: root; right; left-bottom; right-bottom.
    let cols = columns(&w.layout(&placed[0].0));
    assert_eq!(cols[0], [placed[0].0.clone(), placed[2].0.clone()], "{cols:?}");
    assert_eq!(cols[1], [placed[1].0.clone(), placed[3].0.clone()], "{cols:?}");
    let second = &placed[4].1;
    assert_ne!(second, &placed[0].1);
    assert_eq!(placed[5].1, *second, "4 + 2, never 4 + 1 + 1: {placed:?}");
    let cols = columns(&w.layout(&placed[4].0));
    assert_eq!(cols, vec![vec![placed[4].0.clone()], vec![placed[5].0.clone()]]);
    // herdr lists all six, under the kind herdr detected.
    let ls = w.mam().args(["pane", "ls"]).run();
    ls.expect_rc(0);
    assert_eq!(ls.stdout().lines().filter(|l| l.contains("\tclaude\t")).count(), 6, "{}", ls.stdout());
}

/// ORCH 1.9 test 10 on real herdr: an agent in a start-up dialog (herdr says `blocked`) gets `enter`
/// until it is ready, at most `MAM_STARTUP_DIALOG_MAX` times; one that stays blocked is a start failure
/// and its pane is rolled back.
#[test]
fn o1_9_10_startup_dialog_is_answered_on_real_herdr() {
    let Some(w) = W::new("herdr_dialog", false) else { return };
    let r = w.place("d1", "startup_blocked=2\nreport_working=0\n");
    r.expect_rc(0);
    let pane = kv(&r.stdout(), "PANE");
    assert_eq!(w.status("d1"), "idle", "the dialog was answered");
    let screen = w.herdr.herdr(&["pane", "read", &pane, "--source", "recent"]).stdout();
    assert!(screen.contains("fake agent ready"), "{screen}");
    // More confirmations needed than allowed: a start failure, nothing left behind. The fake's dialog
    // is claude's trust dialog of the adapter table, which may take three answers per dialog of the
    // kind (six for claude's two), more than MAM_STARTUP_DIALOG_MAX's three for a bare `blocked`.
    let before = w.layout(&pane).len();
    let r = w.place("d2", "startup_blocked=20\nreport_working=0\n");
    assert_eq!(r.rc(), 1, "{}\n{}", r.stdout(), r.stderr());
    assert!(r.stderr().contains("blocked"), "{}", r.stderr());
    assert_eq!(w.layout(&pane).len(), before, "the split pane was closed again");
    assert_eq!(w.status("d2"), "absent");
}

/// ORCH 2.8 on real herdr: create records the row with the herdr pane and server, status sees the
/// agent, stop closes the pane and ends the agent, resume starts it again in a pane.
#[test]
fn o2_8_create_status_stop_resume_on_real_herdr() {
    let Some(w) = W::new("herdr_sessions", false) else { return };
    let pane = w.create("worker", "report_working=0\n");
    let rows: Value = serde_json::from_slice(&fs::read(w.td.ws().join(".mam/agent_sessions.json")).unwrap()).unwrap();
    let row = rows["herdr_sessions"]
        .as_array()
        .and_then(|a| a.iter().find(|r| r["name"] == "worker"))
        .cloned()
        .unwrap_or_else(|| panic!("no row: {rows}"));
    assert_eq!(row["status"], "running");
    assert_eq!(row["backend"], "herdr");
    assert_eq!(row["pane"]["id"], pane.as_str());
    assert_eq!(row["pane"]["server"].as_str().or(row["server"].as_str()), Some(w.herdr.session.as_str()), "{row}");
    let st = w.mam().args(["status"]).run();
    st.expect_rc(0);
    assert!(st.stdout().contains("worker"), "{}", st.stdout());
    assert_eq!(w.status("worker"), "idle");
    w.mam().args(["stop", "worker"]).run_within(Duration::from_secs(60)).expect_rc(0);
    wait_until("the agent is gone", Duration::from_secs(30), || w.status("worker") == "absent");
    let list = w.herdr.herdr_json(&["pane", "list"]);
    assert!(!list.to_string().contains(&format!("\"{pane}\"")), "the pane was closed: {list}");
    let r = w.mam().args(["resume", "worker"]).run_within(Duration::from_secs(60));
    r.expect_rc(0);
    wait_until("the agent is back", Duration::from_secs(30), || w.status("worker") == "idle");
    w.mam().args(["stop", "worker"]).run_within(Duration::from_secs(60)).expect_rc(0);
}

/// The last stdout line of delegate-job: (job id, status).
fn verdict(out: &str) -> (String, String) {
    let l = out.lines().last().unwrap_or_else(|| panic!("no stdout: {out:?}"));
    (kv(l, "JOB_ID"), kv(l, "STATUS"))
}

const FAST: &[&str] = &["--heartbeat", "1", "--heartbeat-misses", "3", "--ack-timeout", "8", "--timeout", "90"];

/// ORCH 3.7 on real herdr, the three verdicts of the main job at once: an agent that completes with
/// a report (test 1; herdr sees it working), one that shows no working status but starts (test 11,
/// herdr answers `agent_prompt_stalled`: delivered by the job's own started, never typed twice), one
/// that is killed mid-work (test 9: its heartbeat stops, the job closes unresponsive), and one that
/// never starts (`agent_blocked` after T).
#[test]
fn o3_7_delegations_on_real_herdr_give_the_contract_verdicts() {
    let Some(w) = W::new("herdr_delegate", true) else { return };
    w.create("ok", "work_s=1\nreport_text=done on herdr\n");
    w.create("quiet", "report_working=0\nwork_s=0.5\n");
    w.create("crash", "crash_after_s=2\nwork_s=60\n");
    w.create("silent", "never_start=1\nreport_working=0\n");
    let task = w.td.write("task.md", "Say hello in the report, then run the success command.\n");
    let spawn = |session: &str| {
        w.mam()
            .args(["delegate-job", "--session", session, "--brief-file"])
            .args([task.as_os_str()])
            .args(FAST)
            .spawn_bg(&w.td, &format!("dj-{session}"))
    };
    let started = Instant::now();
    let jobs: Vec<(&str, Background)> = ["ok", "quiet", "crash", "silent"].into_iter().map(|s| (s, spawn(s))).collect();
    let mut seen = Vec::new();
    for (session, mut bg) in jobs {
        let (rc, _) = bg.wait(Duration::from_secs(120));
        let (out, err) = (bg.stdout(), bg.stderr());
        let (id, status) = verdict(&out);
        seen.push((session, rc, status.clone(), id.clone(), err));
    }
    let find = |s: &str| seen.iter().find(|v| v.0 == s).unwrap();
    let (_, rc, status, id, err) = find("ok");
    assert_eq!((*rc, status.as_str()), (0, "completed"), "{err}");
    let report = fs::read_to_string(w.registry().join(id).join("report.md")).unwrap();
    assert!(report.contains("done on herdr"), "{report}");
    let (_, rc, status, id, err) = find("quiet");
    assert_eq!((*rc, status.as_str()), (0, "completed"), "{err}");
    let screen = w.herdr.herdr(&["agent", "read", "quiet", "--source", "recent", "--lines", "200"]).stdout();
    assert_eq!(screen.matches(&format!("Job {id}:")).count(), 2, "echoed once, read once: {screen}");
    let (_, rc, status, id, err) = find("crash");
    assert_eq!((*rc, status.as_str()), (4, "deadline_timeout"), "{err}");
    // Issue 30: the crashed agent's process is seen gone (before: K x N of silence).
    assert_eq!(w.record(id)["reason"], "agent_gone");
    let (_, rc, status, _, err) = find("silent");
    assert_eq!((*rc, status.as_str()), (3, "agent_blocked"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(100), "{:?}", started.elapsed());
}

/// Faults on real herdr: the herdr server killed mid-job (the agent dies with its pane, the job
/// closes by the contract within K x N plus the idle margin, nothing hangs, the session reads as
/// gone), and a pane closed by hand during a prompt (send-keys-safe returns within its deadline).
#[test]
fn herdr_server_killed_mid_job_closes_the_job_by_the_contract() {
    let Some(w) = W::new("herdr_killed", true) else { return };
    w.create("victim", "work_s=120\n");
    let task = w.td.write("task.md", "Work for a long time.\n");
    let mut bg = w
        .mam()
        .args(["delegate-job", "--session", "victim", "--brief-file"])
        .args([task.as_os_str()])
        .args(FAST)
        .spawn_bg(&w.td, "dj-victim");
    let id = wait_for("the job to start", Duration::from_secs(40), || {
        let ids: Vec<String> = fs::read_dir(w.registry())
            .ok()?
            .flatten()
            .filter_map(|e| e.file_name().to_string_lossy().strip_suffix(".json").map(str::to_string))
            .collect();
        ids.into_iter().find(|id| w.record(id)["status"] == "running")
    });
    // The server dies at once (SIGKILL); its ptys close and the pane processes get SIGHUP.
    let killed_at = Instant::now();
    let servers: Vec<i32> = w
        .herdr
        .processes()
        .into_iter()
        .filter(|(_, cmd)| cmd.contains("herdr") && cmd.contains(" server"))
        .map(|p| p.0)
        .collect();
    assert!(!servers.is_empty(), "no herdr server among {:?}", w.herdr.processes());
    for pid in servers {
        let _ = mam::sys::kill(pid, 9);
    }
    let (rc, _) = bg.wait(Duration::from_secs(60));
    let (out, err) = (bg.stdout(), bg.stderr());
    let took = killed_at.elapsed();
    let (jid, status) = verdict(&out);
    assert_eq!(jid, id);
    assert_eq!((rc, status.as_str()), (4, "deadline_timeout"), "{err}");
    // The server's death takes its panes' agents with it: their processes are seen gone.
    assert_eq!(w.record(&id)["reason"], "agent_gone");
    // N + 2 s: far below the job's 90 s budget.
    assert!(took < Duration::from_secs(20), "closed {took:?} after the kill");
    // The server is gone: mam says so instead of hanging or bootstrapping (status never autostarts).
    let st = w.mam().args(["pane", "status", "--target", "victim"]).env("MAM_NO_AUTOSTART", "1").run();
    st.expect_rc(0);
    assert_eq!(st.stdout().trim(), "absent");
}

#[test]
fn herdr_agent_that_exits_at_start_and_a_pane_closed_mid_prompt() {
    let Some(w) = W::new("herdr_faults", false) else { return };
    // An agent that exits at once: `agent start` never sees it ready; mam fails and rolls back.
    let cwd = w.td.ws();
    let r = w
        .mam()
        .args(["pane", "new-session", "--agent", "claude", "--name", "dies", "--cwd"])
        .args([cwd.as_os_str(), "--".as_ref(), "die".as_ref()])
        .env("MAM_AGENT_START_TIMEOUT_MS", "4000")
        .run_within(Duration::from_secs(60));
    assert_eq!(r.rc(), 1, "{}\n{}", r.stdout(), r.stderr());
    assert_eq!(w.status("dies"), "absent");
    let panes = w.herdr.herdr_json(&["pane", "list"]);
    assert_eq!(panes["result"]["panes"].as_array().map_or(0, Vec::len), 0, "rolled back: {panes}");
    // A pane closed while mam waits on its prompt (the agent never reacts, so herdr waits 5 s).
    let r = w.place("p1", "report_working=0\nnever_start=1\n");
    r.expect_rc(0);
    let pane = kv(&r.stdout(), "PANE");
    let prompt = w.td.write("prompt.txt", "Job j9: read and follow /nonexistent/brief.md. Run first: x\n");
    let reg = w.td.path("reg");
    fs::create_dir_all(reg.join("j9")).unwrap();
    let mut sks = w
        .mam()
        .args(["pane", "send-keys-safe", "--target", "p1", "--prompt-file"])
        .args([prompt.as_os_str()])
        .args(["--job", "j9", "--token", "t9", "--registry-dir"])
        .args([reg.as_os_str()])
        .spawn_bg(&w.td, "sks");
    wait_until("the prompt is typed", Duration::from_secs(20), || {
        w.herdr.herdr(&["pane", "read", &pane, "--source", "recent"]).stdout().contains("prompt 1: Job j9")
    });
    w.herdr.herdr(&["pane", "close", &pane]).expect_rc(0);
    let (rc, _) = sks.wait(Duration::from_secs(40));
    let err = sks.stderr();
    assert!(rc == 3 || rc == 4, "rc {rc}: {err}");
    assert_eq!(w.status("p1"), "absent");
}

/// Issue 30 item 1: once the daemon's board reported a job's state on a pane (`pane report-agent
/// --source mam`, here `blocked` after an `agent_blocked` verdict), herdr's `agent get` answers with
/// that report. mam never reads it back as the agent's own: the idle check follows herdr's screen
/// detection, so the next job is delivered to the agent idle at its input line instead of being
/// refused "not idle" (which was a new `agent_blocked`, and so a new `blocked` report, forever).
#[test]
fn a_session_stays_deliverable_after_mam_reported_it_blocked_on_real_herdr() {
    let Some(w) = W::new("herdr_own_report", true) else { return };
    let pane = w.create("again", "work_s=0.5\nreport_text=second job done\n");
    wait_until("the agent idle", Duration::from_secs(20), || w.status("again") == "idle");
    for state in ["blocked", "working"] {
        let seq = if state == "blocked" { "1" } else { "2" };
        let r = w.herdr.herdr(&[
            "pane",
            "report-agent",
            &pane,
            "--source",
            "mam",
            "--agent",
            "claude",
            "--state",
            state,
            "--message",
            "no started for 8 s",
            "--seq",
            seq,
        ]);
        r.expect_rc(0);
        let v = w.herdr.herdr_json(&["agent", "get", "again"]);
        assert_eq!(v["result"]["agent"]["agent_status"], state, "herdr answers with mam's report: {v}");
        assert_eq!(w.status("again"), "idle", "the agent's own state, not mam's {state} report");
    }
    let task = w.td.write("task.md", "Say hello in the report, then run the success command.\n");
    let r = w
        .mam()
        .env("MAM_SKS_IDLE_WAIT_S", "5")
        .args(["delegate-job", "--session", "again", "--brief-file"])
        .args([task.as_os_str()])
        .args(FAST)
        .run_within(Duration::from_secs(90));
    let (id, status) = verdict(&r.stdout());
    assert_eq!((r.rc(), status.as_str()), (0, "completed"), "{}", r.stderr());
    let report = fs::read_to_string(w.registry().join(id).join("report.md")).unwrap();
    assert!(report.contains("second job done"), "{report}");
}
