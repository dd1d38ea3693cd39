//! Integration tests: `mam delegate-job` (ORCH 3; A4, A9-A15, A24, A31) with the fake pane backend and
//! the fake agent (ORCH 1.8), against the embedded broker and a real mosquitto; the remote path with a
//! `mam remote run` runner; bad input; and `scripts/demo.sh` in real tmux panes.
//!
//! Times are scaled down from the spec's (N=1 s, K=2..5, T=2..5 s); each test says how. Every wait
//! polls a condition with a deadline; every process a test starts is killed and reaped (the harness
//! kills the fake agents' process groups and the jobs' heartbeat timers on drop).
//!
//! Every 3.7 test whose behaviour can happen in a real herdr pane also runs there (`Backend::Herdr`: a
//! private `HerdrHome` world, the embedded broker): the same fake agent, started by the real herdr
//! through a `claude SCRIPT ...` wrapper, because a herdr pane inherits the server's environment
//! (fixed at bootstrap) and not the creator's, so each session's script, and any per-session
//! variable (`SCRIPT.env`), travels in argv. herdr_mam.rs has the delegations' verdicts side by side.
//! Skips when herdr is absent, fails when `MAM_REQUIRE_HERDR=1`.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::*;

/// The pane backend of a world.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Backend {
    Fake,
    /// The real herdr (`HERDR_BIN` or PATH).
    Herdr,
}

/// Both backends, for a test that runs on each.
const BACKENDS: &[Backend] = &[Backend::Fake, Backend::Herdr];

/// One world: a control root, a broker (or none), a pane backend, and the sessions in it.
struct H {
    /// The real herdr's world (dropped first: its server and every pane process end with it).
    real: Option<HerdrHome>,
    backend: Backend,
    td: TestDir,
    broker: Option<Broker>,
    root: PathBuf,
    env: Vec<(String, OsString)>,
    /// Pids of the fake agents started (each leads its own process group).
    agents: std::cell::RefCell<Vec<i32>>,
    /// Extra registries whose jobs' timers must be reaped.
    registries: std::cell::RefCell<Vec<PathBuf>>,
}

impl Drop for H {
    fn drop(&mut self) {
        for pid in self.agents.borrow().iter() {
            let _ = mam::sys::kill(-pid, 9);
        }
        let mut regs = self.registries.borrow().clone();
        regs.push(self.registry());
        for reg in regs {
            for id in job_ids_in(&reg) {
                for pid in timer_pids(&id) {
                    let _ = mam::sys::kill(pid, 9);
                }
            }
        }
    }
}

fn job_ids_in(reg: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(reg)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            (!n.starts_with('.')).then(|| n.strip_suffix(".json").map(str::to_string)).flatten()
        })
        .collect();
    v.sort();
    v
}

/// SIGKILLs the job's heartbeat timer once it runs: the agent lives on, and its evidence stops.
fn kill_timers(jid: &str) {
    let timers =
        wait_for("the job's timer", Duration::from_secs(20), || Some(timer_pids(jid)).filter(|p| !p.is_empty()));
    for pid in timers {
        let _ = mam::sys::kill(pid, 9);
    }
}

/// The last stdout line `JOB_ID=<jid> STATUS=<status> REPORT=<abs>`.
fn last_line(stdout: &str) -> (String, String, PathBuf) {
    let l = stdout.lines().last().unwrap_or_else(|| panic!("no stdout: {stdout:?}"));
    let rest = l.strip_prefix("JOB_ID=").unwrap_or_else(|| panic!("bad last line {l:?}"));
    let (jid, rest) = rest.split_once(" STATUS=").unwrap();
    let (status, report) = rest.split_once(" REPORT=").unwrap();
    (jid.to_string(), status.to_string(), PathBuf::from(report))
}

impl H {
    fn new(name: &str, target: Target) -> Option<H> {
        H::on(name, target, Backend::Fake)
    }

    /// A world on `backend`, or `None` (skip) when the broker or herdr is absent and not required.
    fn on(name: &str, target: Target, backend: Backend) -> Option<H> {
        let td = TestDir::new(name);
        let broker = start_target(target, &td)?;
        let port = broker.port();
        let root = td.ws();
        H::build(td, Some(broker), port, root).with(backend)
    }

    /// The world on the real herdr when `backend` says so (`None` when herdr is absent).
    fn with(mut self, backend: Backend) -> Option<H> {
        if backend == Backend::Fake {
            return Some(self);
        }
        let home = HerdrHome::new(&self.td)?;
        home.fake_claude();
        self.env.retain(|(k, _)| k != "MAM_PANE_BACKEND" && k != "MAM_FAKE_PANES_DIR");
        self.env.extend(home.env());
        for (k, v) in [
            ("MAM_PANE_BACKEND", "herdr"),
            ("MAM_SKS_QUIESCE_GAP_MS", "100"),
            ("MAM_SKS_QUIESCE_S", "2"),
            ("MAM_SKS_IDLE_WAIT_S", "10"),
            ("SKS_DELIVERY_GRACE_S", "8"),
            // herdr sees a dialog about 0.5 s after `agent start` returns (ORCH 1.5 step 7).
            ("MAM_STARTUP_DIALOG_SETTLE_MS", "1000"),
        ] {
            self.env.push((k.into(), v.into()));
        }
        self.real = Some(home);
        self.backend = backend;
        Some(self)
    }

    fn real(&self) -> &HerdrHome {
        self.real.as_ref().expect("a real herdr world")
    }

    /// A world with no broker at all (preflight and bad-input tests): MQTT_PORT names a closed port.
    fn offline(name: &str) -> H {
        let td = TestDir::new(name);
        let root = td.ws();
        H::build(td, None, free_port(), root)
    }

    /// A world whose control root is `rel` under the test directory (e.g. with a space).
    fn at_root(name: &str, target: Target, rel: &str, backend: Backend) -> Option<H> {
        let td = TestDir::new(name);
        let broker = start_target(target, &td)?;
        let port = broker.port();
        let root = td.path(rel);
        fs::create_dir_all(root.join(".mam")).unwrap();
        H::build(td, Some(broker), port, root).with(backend)
    }

    fn build(td: TestDir, broker: Option<Broker>, port: u16, root: PathBuf) -> H {
        let env: Vec<(String, OsString)> = vec![
            ("MAM_PANE_BACKEND".into(), "fake".into()),
            ("MAM_FAKE_PANES_DIR".into(), td.path("panes").into()),
            ("MQTT_PORT".into(), port.to_string().into()),
            ("MAM_DISPATCH_SECRET".into(), rand_hex(16).into()),
            ("MAM_SKS_POLL_MS".into(), "50".into()),
            ("MAM_SKS_QUIESCE_GAP_MS".into(), "50".into()),
            ("MAM_WATCH_POLL_MS".into(), "100".into()),
            ("MAM_MQTT_CONNECT_TIMEOUT_S".into(), "2".into()),
            ("MAM_AGENT_START_TIMEOUT_MS".into(), "20000".into()),
        ];
        H {
            real: None,
            backend: Backend::Fake,
            td,
            broker,
            root,
            env,
            agents: Default::default(),
            registries: Default::default(),
        }
    }

    fn mam(&self) -> Cmd {
        let mut c = self.td.mam().cwd(&self.root);
        for (k, v) in &self.env {
            c = c.env(k, v);
        }
        c
    }

    fn registry(&self) -> PathBuf {
        self.root.join(".mam/jobs")
    }

    fn logs(&self) -> PathBuf {
        self.root.join(".mam/delegate_job_logs")
    }

    /// `mam create claude --name S --no-onboard -- test-double agent` with this agent script (the fake
    /// agent inherits the creator's environment, so the script is per session); returns the pane.
    fn create(&self, session: &str, script: &str) -> String {
        self.create_with(session, script, &[])
    }

    fn create_with(&self, session: &str, script: &str, env: &[(&str, &str)]) -> String {
        let sp = self.td.write(&format!("{session}.script"), script);
        if self.backend == Backend::Herdr {
            // The wrapper exports `SCRIPT.env` for the agent (the creator's environment stops at
            // the herdr server).
            let vars: String = env.iter().map(|(k, v)| format!("{k}='{v}'\n")).collect();
            self.td.write(&format!("{session}.script.env"), vars);
            return create_scripted(self.mam(), session, &sp);
        }
        let mut c = self
            .mam()
            .args(["create", "claude", "--name", session, "--no-onboard", "--", "test-double", "agent"])
            .env("MAM_FAKE_AGENT_SCRIPT", &sp);
        for (k, v) in env {
            c = c.env(k, v);
        }
        let r = c.run();
        r.expect_rc(0);
        let pane = kv(&r.stdout(), "PANE");
        let pid: i32 = fs::read_to_string(self.pane_dir(&pane).join("pid")).unwrap().trim().parse().unwrap();
        self.agents.borrow_mut().push(pid);
        pane
    }

    fn pane_dir(&self, pane: &str) -> PathBuf {
        self.td.path("panes/panes").join(pane)
    }

    fn agent_pid(&self, pane: &str) -> i32 {
        if self.backend == Backend::Herdr {
            return self.real().agent_process(pane).0;
        }
        fs::read_to_string(self.pane_dir(pane).join("pid")).unwrap().trim().parse().unwrap()
    }

    /// The agent in `pane` finished its first prompt (fake: its status file; herdr: its screen).
    fn agent_done(&self, pane: &str) -> bool {
        if self.backend == Backend::Herdr {
            return self.real().herdr(&["pane", "read", pane, "--source", "recent"]).stdout().contains("prompt 1 done");
        }
        fs::read_to_string(self.pane_dir(pane).join("status")).is_ok_and(|s| s.trim() == "done")
    }

    fn task(&self, text: &str) -> PathBuf {
        self.td.write(&format!("task-{}.md", rand_hex(3)), text)
    }

    /// `mam delegate-job --session S --brief-file <task> <extra>`.
    fn delegate(&self, session: &str, task: &Path, extra: &[&str]) -> Cmd {
        self.mam().args(["delegate-job", "--session", session, "--brief-file"]).arg_path(task).args(extra)
    }

    fn record(&self, id: &str) -> Value {
        serde_json::from_slice(&fs::read(self.registry().join(format!("{id}.json"))).unwrap()).unwrap()
    }

    fn audit(&self, id: &str) -> Vec<Value> {
        let text = fs::read_to_string(self.logs().join(id).join("audit.jsonl")).unwrap_or_default();
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    fn events(&self, id: &str) -> Vec<Value> {
        let text = fs::read_to_string(self.registry().join(id).join("events.log")).unwrap_or_default();
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    /// The one job of this world, once its record exists.
    fn wait_job(&self) -> String {
        let mut id = String::new();
        wait_until("a job record", Duration::from_secs(20), || {
            id = job_ids_in(&self.registry()).into_iter().next().unwrap_or_default();
            !id.is_empty()
        });
        id
    }

    fn wait_status(&self, id: &str, status: &str, limit: Duration) {
        wait_until(&format!("job {id} {status}"), limit, || {
            fs::read(self.registry().join(format!("{id}.json")))
                .ok()
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                .is_some_and(|r| r["status"] == status)
        });
    }

    fn stop_broker(&mut self) {
        match self.broker.take() {
            Some(Broker::Embedded(b)) => b.shutdown(),
            Some(Broker::Mosquitto(mut m)) => m.kill(),
            None => {}
        }
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

fn ts_ms(v: &Value) -> u64 {
    mam::clock::parse_ts(v.as_str().unwrap_or_else(|| panic!("not a timestamp: {v}"))).unwrap()
}

/// Live (non-zombie) `mam watch ... --job-id <id>` processes.
fn watch_pids(id: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for pid in mam::sys::list_pids().unwrap_or_default() {
        let Ok(args) = mam::sys::proc_cmdline(pid) else { continue };
        let args: Vec<String> = args.iter().map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        let is_watch = args.iter().any(|a| a == "watch") && args.windows(2).any(|w| w[0] == "--job-id" && w[1] == id);
        if is_watch && matches!(mam::sys::proc_start_ticks(pid), Ok((_, false))) {
            out.push(pid);
        }
    }
    out
}

const FAST: &[&str] = &["--heartbeat", "1", "--heartbeat-misses", "3", "--ack-timeout", "5", "--timeout", "60"];

// ---------------------------------------------------------------------------------------------
// ORCH 3.7 acceptance tests

/// 3.7 test 1, against both brokers: a control root with a space; every path in the brief and the
/// record is absolute; the fake agent runs the lines from `/` with no workspace variables; the
/// publishes land in the wrapper's registry and log root; the report comes back, exit 0.
#[test]
fn o3_7_1_paths_are_absolute_and_lines_run_anywhere() {
    // Both brokers on the fake backend; the real herdr with the embedded one.
    let worlds = TARGETS.iter().map(|&t| (t, Backend::Fake)).chain([(Target::Embedded, Backend::Herdr)]);
    for (t, b) in worlds {
        let Some(h) = H::at_root("dj_paths", t, "control root", b) else { continue };
        h.create("w1", "work_s=0.5\nreport_text=hello from the fake agent\n");
        let task = h.task("Say hello.\n");
        let r = h.delegate("w1", &task, FAST).run();
        r.expect_rc(0);
        let (jid, status, report) = last_line(&r.stdout());
        assert_eq!(status, "completed");
        let reg = h.registry();
        assert_eq!(report, reg.join(&jid).join("report.md"));
        assert!(fs::read_to_string(&report).unwrap().contains("hello from the fake agent"));
        let rec = h.record(&jid);
        assert_eq!(rec["brief_path"], reg.join(&jid).join("brief.md").to_str().unwrap());
        assert!(rec["watcher_pid"].as_u64().is_some(), "A15 watcher_pid recorded: {rec}");
        let brief = fs::read_to_string(reg.join(&jid).join("brief.md")).unwrap();
        let cmds = mam::delegate::brief::parse_commands(&brief);
        for (k, line) in &cmds {
            // Absolute, quoted paths: the log root, the binary and the registry.
            // Issue 30: the line starts with the binary (an allow rule for it matches), the log root a flag.
            assert!(line.starts_with(&format!("'{}' publish", mam_bin().display())), "{k}: {line}");
            assert!(line.contains(&format!("--logs-dir '{}'", h.logs().display())), "{k}: {line}");
            assert!(line.contains(&format!("--registry-dir '{}'", reg.display())), "{k}: {line}");
        }
        assert!(cmds["start"].ends_with("--event started --heartbeat 1"), "{}", cmds["start"]);
        assert_eq!(mam::delegate::brief::parse_report_path(&brief), Some(reg.join(&jid).join("report.md")), "{brief}");
        // The publishes of the agent reached this registry and this log root.
        let events: Vec<String> = h.events(&jid).iter().map(|e| e["event"].as_str().unwrap().to_string()).collect();
        assert_eq!(events.first().map(String::as_str), Some("started"), "{events:?}");
        assert_eq!(events.last().map(String::as_str), Some("completed"), "{events:?}");
        let published = h.audit(&jid).into_iter().filter(|e| e["kind"] == "published").count();
        assert!(published >= 2, "{:?}", h.audit(&jid));
        assert!(h.logs().join(&jid).join("subscriber.log").is_file());
        assert!(r.stderr().contains(" s after the prompt ("), "{}", r.stderr());
    }
}

/// 3.7 test 2: `MAM_JOBS_DIR=rel/jobs` from a subdirectory resolves against the control root.
#[test]
fn o3_7_2_relative_mam_jobs_dir_resolves_against_the_control_root() {
    for &b in BACKENDS {
        let Some(h) = H::on("dj_rel", Target::Embedded, b) else { continue };
        o3_7_2_body(&h);
    }
}

fn o3_7_2_body(h: &H) {
    let sub = h.root.join("deep/sub");
    fs::create_dir_all(&sub).unwrap();
    let pane = h.create("w1", "work_s=0.2\n");
    let _ = pane;
    let task = h.task("t\n");
    let r = h.delegate("w1", &task, FAST).cwd(&sub).env("MAM_JOBS_DIR", "rel/jobs").run();
    r.expect_rc(0);
    let (jid, _, report) = last_line(&r.stdout());
    let reg = h.root.join("rel/jobs");
    h.registries.borrow_mut().push(reg.clone());
    assert!(reg.join(format!("{jid}.json")).is_file());
    assert_eq!(report, reg.join(&jid).join("report.md"));
    assert!(h.root.join("rel/delegate_job_logs").join(&jid).join("audit.jsonl").is_file());
    assert!(!sub.join("rel").exists() && !h.registry().exists());
}

/// 3.7 test 3, scaled (70 s vs T=300 s becomes 3 s vs T=5 s; `--ack-timeout 60` becomes 2): an agent
/// whose `started` comes late but within T completes; with T shorter than its delay it is closed
/// `agent_blocked` (exit 3) and its later events are refused.
#[test]
fn o3_7_3_late_started_within_t_completes_and_after_t_is_refused() {
    for &b in BACKENDS {
        let Some(h) = H::on("dj_late", Target::Embedded, b) else { continue };
        o3_7_3_body(&h);
    }
}

fn o3_7_3_body(h: &H) {
    h.create("w1", "ack_delay_s=3\nwork_s=0.2\n");
    let task = h.task("t\n");
    let r = h.delegate("w1", &task, &["--heartbeat", "1", "--heartbeat-misses", "3", "--ack-timeout", "5"]).run();
    r.expect_rc(0);
    assert_eq!(last_line(&r.stdout()).1, "completed");

    let pane = h.create("w2", "ack_delay_s=3\nwork_s=0.2\n");
    let r = h.delegate("w2", &task, &["--heartbeat", "1", "--heartbeat-misses", "3", "--ack-timeout", "2"]).run();
    r.expect_rc(3);
    let (jid, status, _) = last_line(&r.stdout());
    assert_eq!(status, "agent_blocked");
    assert!(r.stderr().contains("no started within 2 s (ack timeout 2 s)"), "{}", r.stderr());
    // The agent goes on and reports; every late event is refused, the status stays.
    wait_until("the fake agent to finish its prompt", Duration::from_secs(20), || h.agent_done(&pane));
    let rec = h.record(&jid);
    assert_eq!(rec["status"], "agent_blocked");
    let refused: Vec<Value> = h.audit(&jid).into_iter().filter(|e| e["kind"] == "refused").collect();
    assert!(
        refused.iter().any(|e| e["reason"] == "late_signal" || e["reason"] == "conflicting_terminal"),
        "{refused:?}"
    );
}

/// Issue 30 item 4: T counts from the prompt's submission. With a delivery grace (15 s) longer than T
/// (3 s), an agent that never starts is closed `agent_blocked` at T after the prompt, not after the
/// grace plus T (it came 16-21 s late with the real CLIs), and the NOTE's times count from the prompt.
#[test]
fn t_counts_from_the_prompt_not_from_the_end_of_the_delivery_grace() {
    for &b in BACKENDS {
        let Some(h) = H::on("dj_t_prompt", Target::Embedded, b) else { continue };
        // No working status and a stalled prompt: only the job's own started could confirm delivery.
        h.create("w1", "never_start=1\nreport_working=0\n");
        let task = h.task("t\n");
        let started = Instant::now();
        let r = h
            .delegate("w1", &task, &["--ack-timeout", "3"])
            .env("SKS_DELIVERY_GRACE_S", "15")
            .env("MAM_FAKE_PROMPT_RESULT", "stalled")
            .run();
        let took = started.elapsed();
        r.expect_rc(3);
        assert_eq!(last_line(&r.stdout()).1, "agent_blocked");
        assert!(r.stderr().contains("no started within 3 s"), "{}", r.stderr());
        // The preflight, quiescence (2 s at most here) and submission, then T: far below 15 + 3 s.
        assert!(took < Duration::from_secs(12), "agent_blocked {took:?} after delegate-job began: {}", r.stderr());
    }
}

/// 3.7 test 4: a `started` in events.log carrying another dispatch token does not satisfy step 9.
#[test]
fn o3_7_4_started_with_another_token_does_not_count() {
    for &b in BACKENDS {
        let Some(h) = H::on("dj_token", Target::Embedded, b) else { continue };
        o3_7_4_body(&h);
    }
}

fn o3_7_4_body(h: &H) {
    h.create("w1", "never_start=1\n");
    let task = h.task("t\n");
    let mut bg = h.delegate("w1", &task, &["--ack-timeout", "3"]).spawn_bg(&h.td, "dj");
    let jid = h.wait_job();
    let forged = serde_json::json!({"v":1,"kind":"event","job_id":jid,"attempt":1,
        "dispatch_token":"ffffffffffffffffffffffffffffffff","event":"started","seq":1,"ts":mam::clock::now_ts()});
    let dir = h.registry().join(&jid);
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("events.log"), format!("{forged}\n")).unwrap();
    let (rc, _) = bg.wait(Duration::from_secs(30));
    assert_eq!(rc, 3, "{}", bg.stderr());
    assert_eq!(last_line(&bg.stdout()).1, "agent_blocked");
}

/// 3.7 test 5: when the deadline cuts T, the ack error names the budget actually applied.
#[test]
fn o3_7_5_ack_error_names_the_budget_cut_by_the_deadline() {
    for &b in BACKENDS {
        let Some(h) = H::on("dj_cut", Target::Embedded, b) else { continue };
        o3_7_5_body(&h);
    }
}

fn o3_7_5_body(h: &H) {
    h.create("w1", "never_start=1\n");
    let task = h.task("t\n");
    let r = h.delegate("w1", &task, &["--timeout", "2", "--ack-timeout", "300"]).run();
    r.expect_rc(3);
    let (jid, status, _) = last_line(&r.stdout());
    assert_eq!(status, "agent_blocked");
    // The budget left after the injection: 2 s on the fake backend, less where the injection itself
    // takes time (the real herdr's idle handshake and quiescence).
    let err = r.stderr();
    let within = err.split("no started within ").nth(1).and_then(|t| t.split(' ').next()?.parse::<u64>().ok());
    assert!(within.is_some_and(|n| n <= 2), "{err}");
    assert!(err.contains(" s (ack timeout 300 s cut by the job deadline)"), "{err}");
    assert!(h.record(&jid)["reason"].as_str().unwrap().contains("cut by the job deadline"));
    assert!(r.elapsed < Duration::from_secs(10), "{:?}", r.elapsed);
}

/// 3.7 test 6, scaled (TIMEOUT 20 s and "before 35 s" become 8 s and "before 20 s"): heartbeats keep
/// landing on disk while every broker connection is stalled at CONNACK (the slow probes); the job is
/// closed `deadline_timeout` reason `deadline` at its deadline, and the wrapper ends soon after.
#[test]
fn o3_7_6_disk_heartbeats_and_slow_probes_end_at_the_deadline() {
    for &b in BACKENDS {
        let Some(h) = H::on("dj_slow", Target::Embedded, b) else { continue };
        o3_7_6_body(&h);
    }
}

fn o3_7_6_body(h: &H) {
    h.create_with("w1", "work_s=60\n", &[("MAM_PUBLISH_BUDGET_S", "1")]);
    let Some(Broker::Embedded(b)) = &h.broker else { unreachable!() };
    b.stall_connack("mam-");
    let task = h.task("t\n");
    let r = h
        .delegate("w1", &task, &["--heartbeat", "1", "--heartbeat-misses", "5", "--ack-timeout", "5", "--timeout", "8"])
        .run_within(Duration::from_secs(40));
    b.release_connack("mam-");
    r.expect_rc(4);
    let (jid, status, _) = last_line(&r.stdout());
    assert_eq!(status, "deadline_timeout");
    let rec = h.record(&jid);
    assert_eq!(rec["reason"], "deadline", "{rec}");
    let took = ts_ms(&rec["finished_at"]) - ts_ms(&rec["dispatched_at"]);
    assert!((8000..10_000).contains(&took), "closed {took} ms after dispatch");
    assert!(r.elapsed < Duration::from_secs(20), "{:?}", r.elapsed);
    assert!(h.events(&jid).iter().filter(|e| e["heartbeat"] == true).count() >= 3, "disk beats");
}

/// 3.7 test 7: the heartbeat timer's wire copies never arrive (its CONNACK is stalled), the beats on
/// disk do: the job is not closed for silence although the wire is quiet for longer than IDLE.
#[test]
fn o3_7_7_disk_heartbeats_keep_a_job_alive_when_the_wire_copy_is_late() {
    for &b in BACKENDS {
        let Some(h) = H::on("dj_diskbeat", Target::Embedded, b) else { continue };
        o3_7_7_body(&h);
    }
}

fn o3_7_7_body(h: &H) {
    h.create("w1", "work_s=5\n");
    let Some(Broker::Embedded(b)) = &h.broker else { unreachable!() };
    b.stall_connack("mam-hb-");
    let task = h.task("t\n");
    // IDLE = K x N = 2 s, the work takes 5 s.
    // The subscriber's own events.log tail is slowed down to once a minute, so only the wrapper's
    // reading of the disk can keep the job open.
    let r = h
        .delegate("w1", &task, &["--heartbeat", "1", "--heartbeat-misses", "2", "--ack-timeout", "5"])
        .env("MAM_WATCH_POLL_MS", "60000")
        .run();
    b.release_connack("mam-hb-");
    r.expect_rc(0);
    let (jid, status, _) = last_line(&r.stdout());
    assert_eq!(status, "completed");
    let beats = h.events(&jid).iter().filter(|e| e["heartbeat"] == true).count();
    assert!(beats >= 3, "{beats} beats on disk");
}

/// 3.7 test 8 (A14): after `started`, no further evidence from either source (the agent lives on but
/// its timer is killed; a crashed agent is closed `agent_gone` sooner, o3_7_9): closed
/// `deadline_timeout` reason `unresponsive` no earlier than IDLE and no later than IDLE + 2 s after the
/// last evidence.
#[test]
fn o3_7_8_silence_closes_unresponsive_within_idle_plus_2() {
    for &b in BACKENDS {
        let Some(h) = H::on("dj_silence", Target::Embedded, b) else { continue };
        o3_7_8_body(&h);
    }
}

fn o3_7_8_body(h: &H) {
    h.create("w1", "work_s=60\n");
    let task = h.task("t\n");
    let mut bg = h.delegate("w1", &task, FAST).spawn_bg(&h.td, "dj");
    let jid = h.wait_job();
    kill_timers(&jid);
    let (rc, _) = bg.wait(Duration::from_secs(30));
    assert_eq!(rc, 4, "{}", bg.stderr());
    let (jid, status, report) = last_line(&bg.stdout());
    assert_eq!(status, "deadline_timeout");
    // Issue 30: no report was written, so none is named.
    assert_eq!(report, PathBuf::from("-"));
    let rec = h.record(&jid);
    assert_eq!(rec["reason"], "unresponsive");
    let last = h.events(&jid).iter().map(|e| ts_ms(&e["ts"])).max().unwrap();
    let gap = ts_ms(&rec["finished_at"]) - last;
    assert!((3000..=5000).contains(&gap), "closed {gap} ms after the last evidence (IDLE 3000)");
    assert!(timer_pids(&jid).is_empty());
}

/// 3.7 test 9: killing the agent process stops its heartbeat (the timer watches it) and the job is
/// closed within the idle policy.
#[test]
fn o3_7_9_killing_the_agent_stops_its_heartbeat_and_closes_the_job() {
    for &b in BACKENDS {
        let Some(h) = H::on("dj_kill", Target::Embedded, b) else { continue };
        o3_7_9_body(&h);
    }
}

fn o3_7_9_body(h: &H) {
    let pane = h.create("w1", "work_s=60\n");
    let task = h.task("t\n");
    let mut bg = h.delegate("w1", &task, FAST).spawn_bg(&h.td, "dj");
    let jid = h.wait_job();
    wait_until("two heartbeats on disk", Duration::from_secs(20), || {
        h.events(&jid).iter().filter(|e| e["heartbeat"] == true).count() >= 2
    });
    assert!(!timer_pids(&jid).is_empty(), "a timer beats while the agent lives");
    let killed = Instant::now();
    mam::sys::kill(-h.agent_pid(&pane), 9).unwrap();
    wait_until("the timer to stop (N + 1 s)", Duration::from_secs(3), || timer_pids(&jid).is_empty());
    let (rc, at) = bg.wait(Duration::from_secs(20));
    assert_eq!(rc, 4, "{}", bg.stderr());
    // Issue 30: the wrapper sees the agent's recorded process gone and closes the job within N + 2 s
    // of the death (before: IDLE after the last beat), with a reason that says so.
    assert_eq!(h.record(&jid)["reason"], "agent_gone");
    assert!(bg.stderr().contains("ended with the job open; closed deadline_timeout"), "{}", bg.stderr());
    assert!(at - killed <= Duration::from_secs(3), "{:?}", at - killed);
}

/// 3.7 test 10, against both brokers: the broker goes away after `started`. A completion recorded on
/// disk is honoured (exit 0); with no disk evidence either the job is closed `broker_unavailable`,
/// exit 5, well within the deadline.
#[test]
fn o3_7_10_broker_loss_after_started() {
    // Both brokers on the fake backend; the real herdr with the embedded one.
    let worlds = TARGETS.iter().map(|&t| (t, Backend::Fake)).chain([(Target::Embedded, Backend::Herdr)]);
    for (t, b) in worlds {
        let Some(mut h) = H::on("dj_brokerloss", t, b) else { continue };
        h.create_with("w1", "work_s=3\n", &[("MAM_PUBLISH_BUDGET_S", "1")]);
        let task = h.task("t\n");
        let mut bg = h.delegate("w1", &task, FAST).spawn_bg(&h.td, "dj");
        let jid = h.wait_job();
        h.wait_status(&jid, "running", Duration::from_secs(20));
        h.stop_broker();
        let (rc, _) = bg.wait(Duration::from_secs(40));
        assert_eq!(rc, 0, "{}", bg.stderr());
        assert_eq!(last_line(&bg.stdout()).1, "completed");

        let Some(mut h) = H::on("dj_brokerloss2", t, b) else { continue };
        // No evidence at all after the broker's loss: the agent lives on (a crashed one is closed
        // `agent_gone` within N + 2 s, issue 30), its heartbeat timer is killed.
        h.create_with("w2", "work_s=60\n", &[("MAM_PUBLISH_BUDGET_S", "1")]);
        let mut bg = h.delegate("w2", &task, FAST).spawn_bg(&h.td, "dj");
        let jid = h.wait_job();
        h.wait_status(&jid, "running", Duration::from_secs(20));
        h.stop_broker();
        kill_timers(&jid);
        let (rc, _) = bg.wait(Duration::from_secs(40));
        assert_eq!(rc, 5, "{}", bg.stderr());
        assert_eq!(last_line(&bg.stdout()).1, "broker_unavailable");
        assert!(bg.started.elapsed() < Duration::from_secs(30), "within the 60 s deadline");
        assert!(bg.stderr().contains("broker down"), "{}", bg.stderr());
    }
}

/// 3.7 test 11: an agent that never reports `working` (the submission is only accepted, not settled)
/// but publishes `started` is not closed `agent_blocked`: its own `started` confirms delivery.
/// On the real herdr this is the `quiet` session of herdr_mam.rs's
/// `o3_7_delegations_on_real_herdr_give_the_contract_verdicts` (herdr really answers
/// `agent_prompt_stalled` after 5 s, and the prompt is typed once), not repeated here.
#[test]
fn o3_7_11_no_working_status_but_started_is_not_blocked() {
    let Some(h) = H::new("dj_noworking", Target::Embedded) else { return };
    h.create("w1", "report_working=0\nwork_s=0.3\n");
    let task = h.task("t\n");
    let r =
        h.delegate("w1", &task, FAST).env("MAM_FAKE_PROMPT_RESULT", "stalled").env("SKS_DELIVERY_GRACE_S", "10").run();
    r.expect_rc(0);
    assert_eq!(last_line(&r.stdout()).1, "completed");
    // Issue 18: the delivery line says in words what confirmed it.
    assert!(r.stderr().contains("reported started, which confirms delivery"), "{}", r.stderr());
}

/// 3.7 test 12: after an ack failure no subscriber process remains (it did run: its log exists).
#[test]
fn o3_7_12_no_subscriber_remains_after_an_ack_failure() {
    for &b in BACKENDS {
        let Some(h) = H::on("dj_reap", Target::Embedded, b) else { continue };
        o3_7_12_body(&h);
    }
}

fn o3_7_12_body(h: &H) {
    h.create("w1", "never_start=1\n");
    let task = h.task("t\n");
    let mut bg = h.delegate("w1", &task, &["--ack-timeout", "2"]).spawn_bg(&h.td, "dj");
    let jid = h.wait_job();
    wait_until("the subscriber to run", Duration::from_secs(10), || !watch_pids(&jid).is_empty());
    let (rc, _) = bg.wait(Duration::from_secs(20));
    assert_eq!(rc, 3, "{}", bg.stderr());
    assert!(watch_pids(&jid).is_empty(), "subscriber left behind: {:?}", watch_pids(&jid));
    assert!(h.logs().join(&jid).join("subscriber.log").is_file());
}

/// 3.7 test 13: `remote:NAME` with a runner on the test broker (random session and secret): no pane
/// or herdr call, the brief has no Commands section (A12), the report is written locally, exit 0.
/// With the real herdr on PATH (its calls cannot be logged): no herdr server comes up.
#[test]
fn o3_7_13_remote_session_through_a_runner() {
    for &b in BACKENDS {
        let Some(h) = H::on("dj_remote", Target::Embedded, b) else { continue };
        o3_7_13_body(&h);
    }
}

fn o3_7_13_body(h: &H) {
    let session = format!("r{}", rand_hex(4));
    // A herdr on PATH that records any call: there must be none. Or the real one.
    let bin = h.td.path("bin");
    fs::create_dir_all(&bin).unwrap();
    let herdr_log = h.td.path("herdr-calls.log");
    let script = format!("#!/bin/sh\necho \"$@\" >> '{}'\nexit 1\n", herdr_log.display());
    fs::write(bin.join("herdr"), script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(bin.join("herdr"), fs::Permissions::from_mode(0o755)).unwrap();
    let path = match h.env.iter().find(|(k, _)| k == "PATH") {
        Some((_, p)) if h.backend == Backend::Herdr => p.to_string_lossy().into_owned(),
        _ => format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default()),
    };
    let runner_reg = h.td.path("runner/jobs");
    h.registries.borrow_mut().push(runner_reg.clone());
    let exec = r#"grep -q 'Say hello remotely' "$MAM_BRIEF_FILE" && printf 'remote report\nVERDICT: PASS\n' > "$MAM_REPORT_FILE""#;
    let mut runner = h
        .mam()
        .env("PATH", &path)
        .args(["remote", "run", "--session", &session, "--exec", exec, "--once", "--registry-dir"])
        .args([runner_reg.as_os_str()])
        .spawn_bg(&h.td, "runner");
    runner.wait_stdout("subscribed topic=", Duration::from_secs(10));
    let task = h.task("Say hello remotely.\n");
    let r = h
        .delegate(
            &format!("remote:{session}"),
            &task,
            &["--heartbeat", "1", "--heartbeat-misses", "5", "--ack-timeout", "10"],
        )
        .env("PATH", &path)
        .env("MAM_PANE_BACKEND", "herdr")
        .run();
    r.expect_rc(0);
    let (jid, status, report) = last_line(&r.stdout());
    assert_eq!(status, "completed");
    assert_eq!(fs::read_to_string(&report).unwrap(), "remote report\nVERDICT: PASS\n");
    let brief = fs::read_to_string(h.registry().join(&jid).join("brief.md")).unwrap();
    assert!(!brief.contains("## Commands") && brief.contains("$MAM_REPORT_FILE"), "{brief}");
    assert_eq!(h.record(&jid)["transport"], "remote");
    assert!(!herdr_log.exists(), "herdr was called: {}", fs::read_to_string(&herdr_log).unwrap_or_default());
    let (rc, _) = runner.wait(Duration::from_secs(20));
    assert_eq!(rc, 0, "{}", runner.stderr());
    if h.backend == Backend::Herdr {
        assert!(!h.real().answers(), "a herdr server was bootstrapped");
        assert!(h.real().processes().is_empty(), "{:?}", h.real().processes());
    }
}

/// 3.7 test 14 (A24): while a job runs, no process's argv contains the brief's text.
#[test]
fn o3_7_14_brief_text_never_in_any_argv() {
    for &b in BACKENDS {
        let Some(h) = H::on("dj_argv", Target::Embedded, b) else { continue };
        o3_7_14_body(&h);
    }
}

fn o3_7_14_body(h: &H) {
    h.create("w1", "work_s=2\n");
    let marker = format!("MARKER-{}", rand_hex(8));
    let task = h.task(&format!("Find {marker} and report it.\n"));
    let mut bg = h.delegate("w1", &task, FAST).spawn_bg(&h.td, "dj");
    let mut scans = 0;
    while !bg.exited() {
        for pid in mam::sys::list_pids().unwrap_or_default() {
            let Ok(args) = mam::sys::proc_cmdline(pid) else { continue };
            for a in args {
                assert!(!String::from_utf8_lossy(&a).contains(&marker), "pid {pid} has the brief text in its argv");
            }
        }
        scans += 1;
        assert!(bg.started.elapsed() < Duration::from_secs(30), "delegate-job did not finish");
    }
    let (rc, _) = bg.wait(Duration::from_secs(1));
    assert_eq!(rc, 0, "{}", bg.stderr());
    assert!(scans > 3, "only {scans} scans");
    let jid = last_line(&bg.stdout()).0;
    assert!(fs::read_to_string(h.registry().join(&jid).join("brief.md")).unwrap().contains(&marker));
}

/// 3.7 test 15: stopping the target session cancels the job; delegate-job exits 6.
#[test]
fn o3_7_15_stopping_the_session_exits_6() {
    for &b in BACKENDS {
        let Some(h) = H::on("dj_stop", Target::Embedded, b) else { continue };
        o3_7_15_body(&h);
    }
}

fn o3_7_15_body(h: &H) {
    h.create("w1", "work_s=30\n");
    let task = h.task("t\n");
    let mut bg = h.delegate("w1", &task, FAST).spawn_bg(&h.td, "dj");
    let jid = h.wait_job();
    h.wait_status(&jid, "running", Duration::from_secs(20));
    h.mam().args(["stop", "w1"]).run().expect_rc(0);
    let (rc, _) = bg.wait(Duration::from_secs(20));
    assert_eq!(rc, 6, "{}", bg.stderr());
    assert_eq!(last_line(&bg.stdout()).1, "cancelled");
}

// ---------------------------------------------------------------------------------------------
// Bad input: one documented line and exit code, nothing registered, no process or pane left behind.

fn assert_nothing_registered(h: &H) {
    assert!(job_ids_in(&h.registry()).is_empty(), "registered: {:?}", job_ids_in(&h.registry()));
}

#[test]
fn bad_brief_files_are_refused_before_anything_is_registered() {
    let h = H::offline("dj_badbrief");
    h.create("w1", "never_start=1\n");
    let missing = h.td.path("missing.md");
    let empty = h.td.write("empty.md", " \n\n");
    let binary = h.td.write("binary.md", b"abc\0def\n");
    let latin1 = h.td.write("latin1.md", b"caf\xe9\n");
    let big = h.td.write("big.md", vec![b'a'; 10 * 1024 * 1024]);
    for (p, why) in [
        (&missing, "cannot read"),
        (&empty, "empty"),
        (&binary, "binary content"),
        (&latin1, "not UTF-8"),
        (&big, "larger than"),
        (&h.td.root, "not a regular file"),
    ] {
        let r = h.delegate("w1", p, FAST).run();
        r.expect_rc(2);
        let err = r.stderr();
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with(&format!("ERROR: --brief-file {}: {why}", p.display())), "{err}");
        assert!(err.contains("nothing registered"), "{err}");
        assert!(r.stdout().is_empty());
    }
    assert_nothing_registered(&h);
}

#[test]
fn bad_sessions_are_refused_before_anything_is_registered() {
    let h = H::offline("dj_badsession");
    let task = h.task("t\n");
    for (s, why) in [
        ("nosuch", "unknown session 'nosuch'"),
        ("w1; rm -rf /", "invalid session name"),
        ("$(touch x)", "invalid session name"),
        ("remote:", "invalid remote session"),
    ] {
        let r = h.delegate(s, &task, FAST).run();
        r.expect_rc(2);
        let err = r.stderr();
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with("REFUSED: delegate-job: ") && err.contains(why), "{s}: {err}");
    }
    assert!(!h.root.join("x").exists());
    // A sessions file that is not JSON.
    fs::write(h.root.join(".mam/agent_sessions.json"), "herdr_sessions:\n  - name: w1\n").unwrap();
    let r = h.delegate("w1", &task, FAST).run();
    r.expect_rc(2);
    assert!(r.stderr().contains("is not a JSON sessions file") && r.stderr().contains("import-yaml"), "{}", r.stderr());
    assert_nothing_registered(&h);
}

/// A row whose agent is gone (its fake agent killed) or stopped is refused; knobs are validated.
#[test]
fn sessions_not_running_and_invalid_knobs_are_refused() {
    let h = H::offline("dj_notrunning");
    let pane = h.create("w1", "never_start=1\n");
    let task = h.task("t\n");
    mam::sys::kill(-h.agent_pid(&pane), 9).unwrap();
    wait_until("the fake agent to die", Duration::from_secs(5), || {
        !mam::sys::process_exists(h.agent_pid(&pane))
            || mam::sys::proc_start_ticks(h.agent_pid(&pane)).is_ok_and(|t| t.1)
    });
    let r = h.delegate("w1", &task, FAST).run();
    r.expect_rc(2);
    assert!(r.stderr().contains("is not listed on fake server"), "{}", r.stderr());
    for (k, v) in [("MAM_HEARTBEAT_SEC", "0"), ("MAM_ACK_TIMEOUT_S", "x"), ("MAM_DELEGATE_TIMEOUT_S", "-1")] {
        let r = h.mam().args(["delegate-job", "--session", "w1", "--brief-file"]).arg_path(&task).env(k, v).run();
        r.expect_rc(2);
        assert!(r.stderr().contains(k), "{}", r.stderr());
    }
    assert_nothing_registered(&h);
}

/// A31: `--timeout 0` means no deadline (decided): the record has none, the brief says so, and the job
/// runs to its own verdict.
#[test]
fn timeout_0_means_no_deadline() {
    let Some(h) = H::new("dj_t0", Target::Embedded) else { return };
    h.create("w1", "work_s=0.3\n");
    let task = h.task("t\n");
    let r = h.delegate("w1", &task, &["--timeout", "0", "--heartbeat", "1", "--heartbeat-misses", "3"]).run();
    r.expect_rc(0);
    let jid = last_line(&r.stdout()).0;
    let rec = h.record(&jid);
    assert_eq!((rec["timeout_sec"].as_u64(), rec["deadline_at"].is_null()), (Some(0), true), "{rec}");
    assert!(fs::read_to_string(h.registry().join(&jid).join("brief.md")).unwrap().contains("- Deadline: none"));
}

/// A pane that is no longer at the agent (real tmux: the agent was interrupted, the pane is back at
/// its shell): refused, nothing registered, no pane added or removed.
#[test]
fn tmux_pane_back_at_its_shell_is_refused() {
    if !have_tool("tmux", "MAM_REQUIRE_TMUX") {
        return;
    }
    let mut h = H::offline("dj_tmux");
    let sock = format!("mam-dj-{}", rand_hex(6));
    let (_, path) = claude_is_mam(&h.td);
    h.env.retain(|(k, _)| k != "MAM_PANE_BACKEND");
    h.env.extend([
        ("MAM_PANE_BACKEND".to_string(), OsString::from("tmux")),
        ("MAM_TMUX_SOCKET".into(), sock.clone().into()),
        ("MAM_TMUX_STABLE_MS".into(), "200".into()),
        ("PATH".into(), path.into()),
    ]);
    struct Kill(String);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = std::process::Command::new("tmux").args(["-L", &self.0, "kill-server"]).output();
        }
    }
    let _kill = Kill(sock.clone());
    h.mam().args(["create", "claude", "--name", "t1", "--no-onboard", "--", "test-double", "agent"]).run().expect_rc(0);
    let panes = || {
        let out =
            std::process::Command::new("tmux").args(["-L", &sock, "list-panes", "-a", "-F", "#{pane_id}"]).output();
        String::from_utf8_lossy(&out.unwrap().stdout).lines().map(str::to_string).collect::<Vec<_>>()
    };
    let before = panes();
    assert_eq!(before.len(), 1);
    std::process::Command::new("tmux").args(["-L", &sock, "send-keys", "-t", &before[0], "C-c"]).output().unwrap();
    let cmd = || {
        let out = std::process::Command::new("tmux")
            .args(["-L", &sock, "display-message", "-p", "-t", &before[0], "#{pane_current_command}"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    wait_until("the pane back at its shell", Duration::from_secs(10), || mam::pane::is_shell(&cmd()));
    let task = h.task("t\n");
    let r = h.delegate("t1", &task, FAST).run();
    r.expect_rc(2);
    assert!(r.stderr().contains("is not listed on tmux server"), "{}", r.stderr());
    assert_eq!(panes(), before);
    assert_nothing_registered(&h);
}

// ---------------------------------------------------------------------------------------------
// The demo

/// `scripts/demo.sh` passes (real tmux panes, embedded broker) and leaves nothing behind.
#[test]
fn demo_script_passes() {
    if !have_tool("tmux", "MAM_REQUIRE_TMUX") || !have_tool("bc", "MAM_REQUIRE_TMUX") {
        return;
    }
    let td = TestDir::new("demo");
    // Issue 18: a release build newer than the sources is run as it is; cargo is never asked.
    let bins = DemoBins::new(&td);
    let release = bins.release(true);
    let r = bins.demo(&td, "demo.sh", &[]).run_within(Duration::from_secs(60));
    r.expect_rc(0);
    let out = r.stdout();
    assert!(out.contains(&format!("using the release build {} (newer than the sources)", release.display())), "{out}");
    assert_eq!(bins.cargo_calls(), "", "the demo built again");
    assert!(out.contains("PASS: every verdict as expected"), "{out}");
    for verdict in ["completed", "deadline_timeout (agent_gone)", "agent_blocked"] {
        assert!(out.contains(verdict), "{verdict}: {out}");
    }
    // Issue 18: fake agents are labelled as such, and the figures are said in words.
    assert!(out.contains("(the fake agent, standing in for claude)"), "{out}");
    assert!(out.contains("times the idle window K x N = 3 x 1 s, which it did not wait for"), "{out}");
    assert!(!out.contains("x K*N"), "{out}");
    // The temp world is gone (only the test's own files remain).
    let left: Vec<_> = fs::read_dir(td.path(""))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("mam-demo."))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// Issue 18: a release build or an installed mam older than the sources is passed over, saying
/// which source is newer, and the demo builds (here the recording cargo fails, and the demo says
/// so); an installed mam newer than the sources is used when there is no fresh release build, one
/// of another version is not. `--agent` of a kind that is not installed ends each run right after
/// the binary is chosen.
#[test]
fn demo_script_reuses_a_fresh_binary_and_builds_over_a_stale_one() {
    let td = TestDir::new("demo_bin");
    let bins = DemoBins::new(&td);
    let stop_early = ["--agent", "mam-test-no-such-agent"];
    // Both older than the sources: cargo build --release, in the checkout.
    let release = bins.release(false);
    let installed = bins.installed(false);
    let r = bins.demo(&td, "demo.sh", &stop_early).run_within(Duration::from_secs(30));
    r.expect_rc(1);
    let out = r.stdout();
    assert!(out.contains(&format!("not using the release build {}: ", release.display())), "{out}");
    assert!(out.contains(&format!("not using the installed {}: ", installed.display())), "{out}");
    assert!(out.contains(" is newer") && out.contains("building mam (cargo build --release"), "{out}");
    assert!(r.stderr().ends_with("\nERROR: demo: cargo build failed\n"), "{}", r.stderr());
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).canonicalize().unwrap();
    assert_eq!(bins.cargo_calls(), format!("{}: build --release --quiet\n", here.display()));
    // A fresh installed mam of this version: used, no build.
    let installed = bins.installed(true);
    let r = bins.demo(&td, "demo.sh", &stop_early).run_within(Duration::from_secs(30));
    let out = r.stdout();
    assert!(out.contains(&format!("using the installed {} (mam ", installed.display())), "{out}");
    r.expect_rc(1);
    assert!(out.contains("FAIL: --agent mam-test-no-such-agent: not installed"), "{out}");
    assert_eq!(bins.cargo_calls().lines().count(), 1, "no second build");
    // An installed mam of another version is no stand-in for this checkout.
    fs::remove_file(&installed).unwrap();
    td.write("demo-bin/mam", "#!/bin/sh\necho 'mam 0.0.1-other'\n");
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&installed, fs::Permissions::from_mode(0o755)).unwrap();
    let r = bins.demo(&td, "demo.sh", &stop_early).run_within(Duration::from_secs(30));
    r.expect_rc(1);
    let out = r.stdout();
    assert!(out.contains(&format!("not using the installed {}: it is not mam ", installed.display())), "{out}");
    assert_eq!(bins.cargo_calls().lines().count(), 2, "{}", bins.cargo_calls());
}

/// Issue 18: `scripts/demo.sh --keep` keeps the agents' panes (their tmux server stays up) and prints
/// how to attach to them and how to clean up.
#[test]
fn demo_script_keep_keeps_the_panes_and_says_how_to_attach() {
    if !have_tool("tmux", "MAM_REQUIRE_TMUX") || !have_tool("bc", "MAM_REQUIRE_TMUX") {
        return;
    }
    let td = TestDir::new("demo_keep");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/demo.sh");
    let r = td
        .command("bash")
        .args([script.as_os_str(), "--keep".as_ref()])
        .env("MAM_BIN", mam_bin())
        .env("TMPDIR", td.path(""))
        .run_within(Duration::from_secs(60));
    let out = r.stdout();
    let sock = out
        .lines()
        .find_map(|l| l.strip_prefix("clean up: tmux -L "))
        .and_then(|l| l.split_whitespace().next())
        .map(str::to_string);
    struct Kill(Option<String>);
    impl Drop for Kill {
        fn drop(&mut self) {
            if let Some(s) = &self.0 {
                let _ = std::process::Command::new("tmux").args(["-L", s, "kill-server"]).output();
            }
        }
    }
    let _kill = Kill(sock.clone());
    r.expect_rc(0);
    let sock = sock.unwrap_or_else(|| panic!("no clean-up line: {out}"));
    assert!(out.contains("attach worker-ok"), "{out}");
    let panes = std::process::Command::new("tmux").args(["-L", &sock, "list-panes", "-a"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&panes.stdout).lines().count(), 3, "{out}");
    // The printed attach line resolves the kept session's pane.
    let line = out.lines().find(|l| l.trim_start().starts_with("WORKSPACE_ROOT=")).unwrap().trim().to_string();
    let r = td.command("bash").args(["-c", &format!("{line} --print")]).run();
    r.expect_rc(0);
    assert!(r.stdout().contains(&format!("tmux -L {sock} attach-session -t %0")), "{}", r.stdout());
}

/// `scripts/demo.sh --backend herdr` gives the same three verdicts on a private real herdr server and
/// leaves nothing behind (issue 11).
#[test]
fn demo_script_passes_on_real_herdr() {
    let Some(herdr) = herdr_bin() else { return };
    if !have_tool("bc", "MAM_REQUIRE_TMUX") {
        return;
    }
    let td = TestDir::new("demo_herdr");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/demo.sh");
    // The run's base is short: herdr's socket path must fit in 107 bytes.
    let r = td
        .command("bash")
        .args([script.as_os_str(), "--backend".as_ref(), "herdr".as_ref()])
        .env("MAM_BIN", mam_bin())
        .env("HERDR_BIN", &herdr)
        .env("TMPDIR", base_dir())
        .env_remove("HERDR_SESSION")
        .env_remove("HERDR_SOCKET_PATH")
        .run_within(Duration::from_secs(90));
    r.expect_rc(0);
    let out = r.stdout();
    assert!(out.contains("PASS: every verdict as expected"), "{out}");
    assert!(out.contains("herdr pane w1:p1"), "{out}");
    for verdict in ["completed", "deadline_timeout (agent_gone)", "agent_blocked"] {
        assert!(out.contains(verdict), "{verdict}: {out}");
    }
    // Its temp world (named in the first line) is gone, and no herdr of it is left.
    let root = out.split("control root ").nth(1).and_then(|r| r.split(';').next()).unwrap().to_string();
    let tmp = Path::new(&root).parent().unwrap().to_path_buf();
    assert!(!tmp.exists(), "{} left behind", tmp.display());
    let left: Vec<i32> = mam::sys::list_pids()
        .unwrap_or_default()
        .into_iter()
        .filter(|p| {
            mam::sys::proc_cmdline(*p).is_ok_and(|a| a.iter().any(|x| String::from_utf8_lossy(x).contains("mam-demo-")))
        })
        .collect();
    assert!(left.is_empty(), "demo processes left: {left:?}");
}

// ---------------------------------------------------------------------------------------------
// Onboarding (ORCH 2.3 step 8, 2.8 test 10): `create` delegates it and returns once `started` is in.

#[test]
fn create_onboards_and_returns_once_started() {
    let Some(h) = H::new("dj_onboard", Target::Embedded) else { return };
    let sp = h.td.write("ob.script", "work_s=1\n");
    let r = h
        .mam()
        .args(["create", "claude", "--name", "ob1", "--", "test-double", "agent"])
        .env("MAM_FAKE_AGENT_SCRIPT", &sp)
        .env("MAM_HEARTBEAT_SEC", "1")
        .env("MAM_ACK_TIMEOUT_S", "10")
        .run();
    r.expect_rc(0);
    let pane = kv(&r.stdout(), "PANE");
    h.agents.borrow_mut().push(h.agent_pid(&pane));
    let job = r.stdout().lines().find_map(|l| l.strip_prefix("ONBOARD_JOB=")).unwrap().to_string();
    // create returned at `started`; the job runs on and completes on its own.
    assert!(r.stdout().lines().count() >= 2, "{}", r.stdout());
    h.wait_status(&job, "completed", Duration::from_secs(20));
    assert!(fs::read_to_string(h.registry().join(&job).join("report.md")).is_ok_and(|t| !t.is_empty()));
    assert!(watch_pids(&job).is_empty(), "no subscriber outlives create");
}

#[test]
fn o2_8_10_onboarding_without_started_within_t_rolls_back() {
    let Some(h) = H::new("dj_onboard_fail", Target::Embedded) else { return };
    let sp = h.td.write("ob.script", "never_start=1\n");
    let r = h
        .mam()
        .args(["create", "claude", "--name", "ob2", "--", "test-double", "agent"])
        .env("MAM_FAKE_AGENT_SCRIPT", &sp)
        .env("MAM_ACK_TIMEOUT_S", "2")
        .run();
    r.expect_rc(1);
    assert!(r.stderr().contains("onboarding of ob2 failed"), "{}", r.stderr());
    // Issue 30: the conversation the agent already wrote is named, with how to delete it.
    assert!(r.stderr().contains("the agent's conversation "), "{}", r.stderr());
    assert!(r.stderr().contains("stays on disk (`mam agents purge claude "), "{}", r.stderr());
    let doc = fs::read_to_string(h.root.join(".mam/agent_sessions.json")).unwrap_or_default();
    assert!(!doc.contains("\"ob2\""), "the row was removed: {doc}");
    let panes: Vec<_> = fs::read_dir(h.td.path("panes/panes")).into_iter().flatten().flatten().collect();
    assert!(panes.is_empty(), "the pane was closed: {panes:?}");
    let jobs = job_ids_in(&h.registry());
    assert_eq!(jobs.len(), 1);
    assert_eq!(h.record(&jobs[0])["status"], "agent_blocked");
    assert!(watch_pids(&jobs[0]).is_empty());
}

// ---------------------------------------------------------------------------------------------
// The other verdicts of 3.5 and the interrupt.

/// A13: `--deadline-source wall-clock` closes a job past its deadline as `wall_clock_timeout` (exit 4).
#[test]
fn a13_wall_clock_deadline_source() {
    let Some(h) = H::new("dj_wall", Target::Embedded) else { return };
    h.create("w1", "work_s=60\n");
    let task = h.task("t\n");
    let extra = ["--heartbeat", "1", "--heartbeat-misses", "3", "--timeout", "2", "--deadline-source", "wall-clock"];
    let r = h.delegate("w1", &task, &extra).run();
    r.expect_rc(4);
    let (jid, status, _) = last_line(&r.stdout());
    assert_eq!(status, "wall_clock_timeout");
    assert!(timer_pids(&jid).is_empty(), "the close stopped the timer");
}

/// An agent that runs the error command: `error`, exit 1. A `completed` without a report file: exit
/// 1, `completed without report`, the status stays `completed`.
#[test]
fn error_and_completed_without_report_exit_1() {
    let Some(h) = H::new("dj_error", Target::Embedded) else { return };
    h.create("w1", "verdict=error\n");
    let task = h.task("t\n");
    let r = h.delegate("w1", &task, FAST).run();
    r.expect_rc(1);
    assert_eq!(last_line(&r.stdout()).1, "error");

    h.create("w2", "work_s=0.2\n");
    // The report path is a directory, so the agent cannot write its report.
    let jid = format!("j{}", rand_hex(4));
    fs::create_dir_all(h.registry().join(&jid).join("report.md")).unwrap();
    let r = h.delegate("w2", &task, FAST).args(["--job-id", &jid]).run();
    r.expect_rc(1);
    // Issue 30: no report was written, so none is named.
    assert_eq!(last_line(&r.stdout()), (jid.clone(), "completed".into(), PathBuf::from("-")));
    assert!(r.stderr().contains("completed without report"), "{}", r.stderr());
}

/// SIGTERM to delegate-job: exit 143, the subscriber reaped, the job left open for the daemon (A15).
#[test]
fn interrupt_reaps_the_subscriber_and_leaves_the_job_open() {
    let Some(h) = H::new("dj_sigterm", Target::Embedded) else { return };
    h.create("w1", "work_s=30\n");
    let task = h.task("t\n");
    let mut bg = h.delegate("w1", &task, FAST).spawn_bg(&h.td, "dj");
    let jid = h.wait_job();
    h.wait_status(&jid, "running", Duration::from_secs(20));
    wait_until("the subscriber", Duration::from_secs(10), || !watch_pids(&jid).is_empty());
    bg.signal(15);
    let (rc, _) = bg.wait(Duration::from_secs(5));
    assert_eq!(rc, 143, "{}", bg.stderr());
    assert_eq!(last_line(&bg.stdout()).1, "running");
    assert!(watch_pids(&jid).is_empty());
    assert_eq!(h.record(&jid)["status"], "running");
}

/// A42 (3.2 step 5): the orchestrator a job records: `--orchestrator`; else the caller's session
/// id when `orchestrator_uuids` lists it; else the parent job's; else none.
#[test]
fn a42_which_orchestrator_a_job_records() {
    let h = H::new("dj_orchestrator", Target::Embedded).unwrap();
    h.create("w1", "work_s=0.1\n");
    let task = h.task("Say hello.\n");
    let uuid = "123e4567-e89b-12d3-a456-426614174000";
    // The sessions file lists the orchestrator (as `mam orc-onboard` would).
    let file = h.root.join(".mam/agent_sessions.json");
    let mut doc: Value = serde_json::from_slice(&fs::read(&file).unwrap()).unwrap();
    doc["orchestrator_uuids"] = serde_json::json!([uuid]);
    fs::write(&file, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
    let orch = |r: &Run| h.record(&last_line(&r.stdout()).0)["orchestrator_uuid"].clone();
    // None: no session id in the environment, no parent.
    let r = h.delegate("w1", &task, FAST).run();
    r.expect_rc(0);
    assert_eq!(orch(&r), Value::Null);
    let plain = last_line(&r.stdout()).0;
    // The caller's session id, listed.
    let r = h.delegate("w1", &task, FAST).env("CLAUDE_CODE_SESSION_ID", uuid).run();
    r.expect_rc(0);
    let from_env = last_line(&r.stdout()).0;
    assert_eq!(orch(&r), uuid);
    // A session id that is not listed names nobody.
    let r = h.delegate("w1", &task, FAST).env("CLAUDE_CODE_SESSION_ID", "ffffffff-e89b-12d3-a456-426614174000").run();
    r.expect_rc(0);
    assert_eq!(orch(&r), Value::Null);
    // The parent's value, when the caller has none of its own.
    let r = h.delegate("w1", &task, &[FAST, &["--parent", &from_env]].concat()).run();
    r.expect_rc(0);
    assert_eq!(orch(&r), uuid);
    let r = h.delegate("w1", &task, &[FAST, &["--parent", &plain]].concat()).run();
    r.expect_rc(0);
    assert_eq!(orch(&r), Value::Null);
    // The flag wins; a bad value is a usage error before anything is registered.
    let r = h.delegate("w1", &task, &[FAST, &["--orchestrator", "ses_abc123"]].concat()).run();
    r.expect_rc(0);
    assert_eq!(orch(&r), "ses_abc123");
    let r = h.delegate("w1", &task, &[FAST, &["--orchestrator", "two words"]].concat()).run();
    r.expect_rc(2);
    assert!(r.stderr().contains("--orchestrator: invalid value 'two words'"), "{}", r.stderr());
}

/// Issue 32 item 9: `--detach` registers, delivers, prints `JOB_ID=` and returns before the agent
/// has finished; `mam wait <id>` then gives the verdict.
#[test]
fn i32_detach_returns_after_delivery_and_wait_gives_the_verdict() {
    let Some(h) = H::new("dj_detach", Target::Embedded) else { return };
    h.create("w1", "work_s=3\nreport_text=hello from the detached job\n");
    let task = h.task("Say hello.\n");
    let r = h.delegate("w1", &task, &[FAST, &["--detach"]].concat()).run();
    assert_eq!(r.rc(), 0, "{}", r.stderr());
    let (jid, status, named) = last_line(&r.stdout());
    assert_ne!(status, "completed", "it returned before the job's 3 s of work: {}", r.stdout());
    assert_eq!(named, PathBuf::from("-"), "no report yet");
    let report = h.registry().join(&jid).join("report.md");
    assert!(h.registry().join(&jid).join("brief.md").is_file());
    let w = h.mam().args(["wait", &jid, "--timeout", "30"]).run_within(Duration::from_secs(40));
    assert_eq!(w.rc(), 0, "{}{}", w.stdout(), w.stderr());
    assert!(w.stdout().contains(&format!("JOB_ID={jid} SESSION=w1 VERDICT=completed")), "{}", w.stdout());
    assert!(fs::read_to_string(&report).unwrap().contains("hello from the detached job"));
}

/// Issue 32 item 3: several repositories on one machine. Two control roots each start `mam broker`
/// with no port at all while 1883 is taken (by the first of them, or by anyone): each broker falls
/// back to a free port with a NOTE and records it in its `.mam/broker.cred`, and each repository's
/// delegation (no MQTT_PORT anywhere) reaches its own broker and completes. A port named with
/// `--port` that is taken is an error that says what to do.
#[test]
fn two_repositories_on_one_machine_each_get_their_own_broker() {
    // 1883 taken for the whole test: ours when free, else someone's already.
    let _hold = std::net::TcpListener::bind("127.0.0.1:1883").ok();
    let mut brokers = Vec::new();
    let mut worlds = Vec::new();
    for name in ["two_repos_a", "two_repos_b"] {
        let td = TestDir::new(name);
        let root = td.ws();
        let mut h = H::build(td, None, 0, root);
        h.env.retain(|(k, _)| k != "MQTT_PORT");
        let mut b = h.mam().args(["broker"]).spawn_bg(&h.td, "broker");
        b.wait_stdout("mam broker listening on 127.0.0.1:", Duration::from_secs(20));
        let err = b.stderr();
        assert!(err.contains("NOTE: broker: port 1883 is taken") && err.contains("broker.cred"), "{err}");
        let port: u16 = b.stdout().lines().next().unwrap().rsplit(':').next().unwrap().parse().unwrap();
        assert_ne!(port, 1883);
        let cred = fs::read_to_string(h.root.join(".mam/broker.cred")).unwrap();
        assert!(cred.contains(&format!("-p {port}\n")), "{cred}");
        brokers.push(b);
        worlds.push(h);
    }
    for h in &worlds {
        h.create("w1", "work_s=0.2\nreport_text=hello from my own repository\n");
        let r = h.delegate("w1", &h.task("Say hello.\n"), FAST).run();
        r.expect_rc(0);
        let (jid, status, report) = last_line(&r.stdout());
        assert_eq!(status, "completed", "{}", r.stderr());
        assert!(fs::read_to_string(report).unwrap().contains("hello from my own repository"));
        let published = h.audit(&jid).into_iter().filter(|e| e["kind"] == "published").count();
        assert!(published >= 2, "the agent's events went over this repository's broker: {:?}", h.audit(&jid));
    }
    for mut b in brokers {
        b.signal(15);
        b.wait(Duration::from_secs(10));
    }
    // A named port that is taken: the error says what to do (after this repository's broker
    // stopped: while it runs, a second one is refused before it tries any port).
    let taken = worlds[1].mam().args(["broker"]).env("MQTT_PORT", "1883").run();
    taken.expect_rc(1);
    let err = taken.stderr();
    assert!(err.contains("cannot bind broker to 127.0.0.1:1883") && err.contains("remove MQTT_PORT"), "{err}");
}

/// The `delegate-job` cases of `exitcodes::exit_codes_every_documented_case_happens`: every verdict's
/// code (N=1 s, K=3, T and deadlines of a few seconds), the usage error and both interruptions.
pub(crate) fn exit_code_cases(codes: &crate::exitcodes::Codes) {
    let Some(mut h) = H::new("codes_dj", Target::Embedded) else { return };
    let task = h.task("t\n");
    let cmd = "delegate-job";
    let mut session = 0;
    let mut fresh = |h: &H, script: &str| {
        session += 1;
        let name = format!("w{session}");
        h.create(&name, script);
        name
    };
    let w = fresh(&h, "work_s=0.2\n");
    codes.saw(cmd, "completed", &h.delegate(&w, &task, FAST).run(), 0);
    let w = fresh(&h, "work_s=0.2\nverdict=error\n");
    codes.saw(cmd, "error", &h.delegate(&w, &task, FAST).run(), 1);
    codes.saw(cmd, "unknown flag", &h.delegate(&w, &task, &["--no-such"]).run(), 2);
    let w = fresh(&h, "never_start=1\n");
    codes.saw(cmd, "agent_blocked", &h.delegate(&w, &task, &["--ack-timeout", "2"]).run(), 3);
    let w = fresh(&h, "work_s=60\n");
    let deadline = ["--heartbeat", "1", "--heartbeat-misses", "3", "--ack-timeout", "5", "--timeout", "4"];
    codes.saw(cmd, "deadline_timeout", &h.delegate(&w, &task, &deadline).run_within(Duration::from_secs(30)), 4);
    // Cancelled by `mam stop`, then interrupted by SIGINT and SIGTERM.
    for (what, rc) in [("cancelled", 6), ("SIGINT", 130), ("SIGTERM", 143)] {
        let w = fresh(&h, "work_s=30\n");
        let mut bg = h.delegate(&w, &task, FAST).spawn_bg(&h.td, "dj");
        let mut jid = String::new();
        wait_until("the job's record", Duration::from_secs(20), || {
            jid = job_ids_in(&h.registry())
                .into_iter()
                .find(|id| h.record(id)["agent_session"] == w.as_str())
                .unwrap_or_default();
            !jid.is_empty()
        });
        h.wait_status(&jid, "running", Duration::from_secs(20));
        match rc {
            6 => {
                h.mam().args(["stop", &w]).run().expect_rc(0);
            }
            130 => bg.signal(2),
            _ => bg.signal(15),
        };
        let (got, _) = bg.wait(Duration::from_secs(20));
        assert_eq!(got, rc, "delegate-job {what}: {}", bg.stderr());
        codes.rc(cmd, rc);
    }
    // The broker goes and no evidence comes: broker_unavailable.
    let w = fresh(&h, "work_s=60\n");
    let mut bg = h.delegate(&w, &task, FAST).env("MAM_PUBLISH_BUDGET_S", "1").spawn_bg(&h.td, "dj");
    let mut jid = String::new();
    wait_until("the job's record", Duration::from_secs(20), || {
        jid = job_ids_in(&h.registry())
            .into_iter()
            .find(|id| h.record(id)["agent_session"] == w.as_str())
            .unwrap_or_default();
        !jid.is_empty()
    });
    h.wait_status(&jid, "running", Duration::from_secs(20));
    h.stop_broker();
    kill_timers(&jid);
    let (got, _) = bg.wait(Duration::from_secs(40));
    assert_eq!(got, 5, "delegate-job broker_unavailable: {}", bg.stderr());
    codes.rc(cmd, 5);
}

/// Issue 30, "faster truth" for a job nobody waits for: delegated with `--detach`, its agent killed
/// mid-job. The workspace daemon's keeper sees the agent's recorded process gone and closes the job
/// `deadline_timeout`/`agent_gone` within N + 2 s of the death (before: nobody looked at the agent,
/// and the sweep closed it unresponsive K x N + 5 s after the last beat; K x N is 20 s here and the
/// sweep runs once a minute).
#[test]
fn i30_a_detached_job_whose_agent_dies_is_closed_agent_gone_by_the_daemon() {
    let Some(h) = H::new("dj_detach_gone", Target::Embedded) else { return };
    let pane = h.create("w1", "work_s=60\n");
    let mut daemon = h
        .mam()
        .env("MAM_DAEMON_SWEEP_S", "60")
        .args(["daemon", "run", "--workspace"])
        .arg_path(&h.root)
        .spawn_bg(&h.td, "daemon");
    let task = h.task("t\n");
    let slow = ["--heartbeat", "1", "--heartbeat-misses", "20", "--ack-timeout", "5", "--timeout", "120", "--detach"];
    let r = h.delegate("w1", &task, &slow).run();
    assert_eq!(r.rc(), 0, "{}", r.stderr());
    let (jid, _, _) = last_line(&r.stdout());
    h.wait_status(&jid, "running", Duration::from_secs(20));
    let killed = Instant::now();
    mam::sys::kill(-h.agent_pid(&pane), 9).unwrap();
    h.wait_status(&jid, "deadline_timeout", Duration::from_secs(15));
    let took = killed.elapsed();
    assert_eq!(h.record(&jid)["reason"], "agent_gone", "{}", daemon.stdout());
    println!("closed {took:?} after the death");
    assert!(took <= Duration::from_secs(3), "closed {took:?} after the death (N + 2 = 3 s)");
    let said =
        poll(Duration::from_secs(10), || daemon.stdout().contains("ended and nobody waits for the job").then_some(()));
    assert!(said.is_some(), "{}", daemon.stdout());
    daemon.signal(15);
    assert_eq!(daemon.wait(Duration::from_secs(10)).0, 0);
}
