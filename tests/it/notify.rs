//! Issue 21, verdict notifications: `MAM_ON_VERDICT` runs once per verdict with the verdict in its
//! environment (never a secret), although both the job's wrapper and the daemon see it end; a hook
//! that hangs is killed at its deadline with everything it started, one that fails or prints 10 MB
//! is logged, and none of them changes a verdict or stops the daemon.
//!
//! The fake pane backend and the fake agent, the embedded broker; N = 1 s, K = 2, T = 2 s.

use std::ffi::OsString;
use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::*;

const FAST: &[&str] = &["--heartbeat", "1", "--heartbeat-misses", "2", "--ack-timeout", "2", "--timeout", "30"];

struct World {
    td: TestDir,
    _broker: Broker,
    env: Vec<(String, OsString)>,
    agents: std::cell::RefCell<Vec<i32>>,
}

impl Drop for World {
    fn drop(&mut self) {
        for pid in self.agents.borrow().iter() {
            let _ = mam::sys::kill(-pid, 9);
        }
        for e in fs::read_dir(self.registry()).into_iter().flatten().flatten() {
            if let Some(id) = e.file_name().to_string_lossy().strip_suffix(".json") {
                for pid in timer_pids(id) {
                    let _ = mam::sys::kill(pid, 9);
                }
            }
        }
    }
}

impl World {
    fn new(name: &str, hook: &str) -> Option<World> {
        let td = TestDir::new(name);
        let broker = start_target(Target::Embedded, &td)?;
        let hook = td.write("hook.sh", hook);
        let env = [
            ("MAM_PANE_BACKEND", OsString::from("fake")),
            ("MAM_FAKE_PANES_DIR", td.path("panes").into()),
            ("MQTT_PORT", broker.port().to_string().into()),
            ("MAM_DISPATCH_SECRET", rand_hex(16).into()),
            ("MAM_SKS_POLL_MS", "50".into()),
            ("MAM_SKS_QUIESCE_GAP_MS", "50".into()),
            ("MAM_WATCH_POLL_MS", "100".into()),
            ("MAM_MQTT_CONNECT_TIMEOUT_S", "2".into()),
            ("MAM_AGENT_START_TIMEOUT_MS", "20000".into()),
            ("MAM_ON_VERDICT", format!("sh {}", hook.display()).into()),
            ("MAM_ON_VERDICT_TIMEOUT_S", "2".into()),
            ("HOOK_DIR", td.path("hooks").into()),
        ];
        fs::create_dir_all(td.path("hooks")).unwrap();
        let env = env.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        Some(World { td, _broker: broker, env, agents: Default::default() })
    }

    fn mam(&self) -> Cmd {
        let mut c = self.td.mam();
        for (k, v) in &self.env {
            c = c.env(k, v);
        }
        c
    }

    fn registry(&self) -> PathBuf {
        self.td.ws().join(".mam/jobs")
    }

    fn notify_log(&self) -> String {
        fs::read_to_string(self.td.ws().join(".mam/delegate_job_logs/notify.log")).unwrap_or_default()
    }

    fn record(&self, id: &str) -> Value {
        serde_json::from_slice(&fs::read(self.registry().join(format!("{id}.json"))).unwrap()).unwrap()
    }

    fn create(&self, session: &str, script: &str) {
        let sp = self.td.write(&format!("{session}.script"), script);
        let r = self
            .mam()
            .args(["create", "claude", "--name", session, "--no-onboard", "--", "test-double", "agent"])
            .env("MAM_FAKE_AGENT_SCRIPT", &sp)
            .run();
        r.expect_rc(0);
        let pane = kv(&r.stdout(), "PANE");
        let pid = fs::read_to_string(self.td.path("panes/panes").join(&pane).join("pid")).unwrap();
        self.agents.borrow_mut().push(pid.trim().parse().unwrap());
    }

    fn daemon(&self) -> Background {
        let ws = self.td.ws();
        self.mam().args(["daemon", "run", "--workspace"]).args([ws.as_os_str()]).spawn_bg(&self.td, "daemon")
    }

    /// The lines the hook wrote, one per run: `verdict|job|session|status|reason|report|by`.
    fn hook_lines(&self) -> Vec<String> {
        let text = fs::read_to_string(self.td.path("hooks/runs")).unwrap_or_default();
        text.lines().map(str::to_string).collect()
    }
}

/// Live `mam notify run` processes started from `td`'s control root.
fn supervisors(td: &TestDir) -> Vec<i32> {
    let ws = td.ws();
    let mut out = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(cmd) = fs::read(format!("/proc/{pid}/cmdline")) else { continue };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        let cwd = fs::read_link(format!("/proc/{pid}/cwd")).unwrap_or_default();
        if cmd.contains(" notify run ") && cwd.starts_with(&ws) {
            out.push(pid);
        }
    }
    out
}

fn last_kv(out: &str, key: &str) -> String {
    let l = out.lines().last().unwrap_or("");
    l.split_whitespace().find_map(|w| w.strip_prefix(&format!("{key}="))).unwrap_or("").to_string()
}

/// Three verdicts seen by two watchers each (the wrapper and the daemon): three hook runs, each with
/// its own values, no secret in the environment, one notify.log line each.
#[test]
fn each_verdict_runs_the_hook_once_with_its_values() {
    let hook = "printf '%s|%s|%s|%s|%s|%s|%s\\n' \"$MAM_VERDICT\" \"$MAM_VERDICT_JOB_ID\" \"$MAM_VERDICT_SESSION\" \
                \"$MAM_VERDICT_STATUS\" \"$MAM_VERDICT_REASON\" \"$MAM_VERDICT_REPORT\" \"$MAM_VERDICT_BY\" >>\"$HOOK_DIR/runs\"\n\
                env >\"$HOOK_DIR/env-$MAM_VERDICT_JOB_ID\"\n";
    let Some(w) = World::new("notify_once", hook) else { return };
    w.create("ok", "work_s=0.5\n");
    w.create("silent", "never_start=1\n");
    w.create("crash", "crash_after_s=1\nwork_s=30\n");
    let mut daemon = w.daemon();
    let task = w.td.write("task.md", "Report, then run the success command.\n");
    let jobs: Vec<(&str, Background)> = ["ok", "silent", "crash"]
        .into_iter()
        .map(|s| {
            let bg = w
                .mam()
                .args(["delegate-job", "--session", s, "--brief-file"])
                .args([task.as_os_str()])
                .args(FAST)
                .spawn_bg(&w.td, &format!("dj-{s}"));
            (s, bg)
        })
        .collect();
    let mut ids = Vec::new();
    for (s, mut bg) in jobs {
        let (rc, _) = bg.wait(Duration::from_secs(40));
        ids.push((s, last_kv(&bg.stdout(), "JOB_ID"), rc, bg.stderr()));
    }
    wait_until("three hook runs", Duration::from_secs(10), || w.hook_lines().len() >= 3);
    // Two more daemon ticks: nobody runs a second one.
    pause_until(Instant::now() + Duration::from_millis(2_500));
    let lines = w.hook_lines();
    assert_eq!(lines.len(), 3, "{lines:#?}\n{}", daemon.stdout());
    let want = [
        ("ok", "completed", "completed", ""),
        ("silent", "agent_blocked", "agent_blocked", ""),
        ("crash", "unresponsive", "deadline_timeout", "unresponsive"),
    ];
    for (session, verdict, status, reason) in want {
        let (_, id, _, err) = ids.iter().find(|x| x.0 == session).unwrap();
        let l = lines
            .iter()
            .find(|l| l.split('|').nth(1) == Some(id.as_str()))
            .unwrap_or_else(|| panic!("{id}: {lines:?}\n{err}"));
        let f: Vec<&str> = l.split('|').collect();
        assert_eq!((f[0], f[2], f[3]), (verdict, session, status), "{l}");
        if !reason.is_empty() {
            assert_eq!(f[4], reason, "{l}");
        }
        // Issue 30: a report is named only when the agent wrote one.
        let report = if status == "completed" { w.registry().join(id).join("report.md") } else { Default::default() };
        assert_eq!(f[5], report.to_str().unwrap(), "{l}");
        assert!(f[6] == "daemon" || f[6] == "delegate-job", "{l}");
        assert_eq!(w.record(id)["status"], status);
        let env = fs::read_to_string(w.td.path(&format!("hooks/env-{id}"))).unwrap();
        for secret in ["MAM_DISPATCH_SECRET", "MQTT_PASSWORD", "MAM_ON_VERDICT="] {
            assert!(!env.contains(secret), "{secret} in the hook's environment:\n{env}");
        }
        assert!(env.contains(&format!("MAM_VERDICT_SUMMARY=job {id} ({session}): {verdict}")), "{env}");
    }
    let log = w.notify_log();
    assert_eq!(log.lines().filter(|l| l.contains(": hook exit 0 in ")).count(), 3, "{log}");
    daemon.signal(15);
    assert_eq!(daemon.wait(Duration::from_secs(10)).0, 0);
}

/// A hook that hangs (with a child of its own), one that fails and one that prints 10 MB, all
/// started by the daemon for operator closes: the verdicts stand, the hanging one and its child are
/// killed at the 2 s deadline, the failure and the flood are logged, and the daemon goes on.
#[test]
fn a_hook_that_hangs_fails_or_floods_is_killed_logged_and_the_verdict_stands() {
    let hook = "case \"$MAM_VERDICT_REASON\" in\n\
                hang) echo $$ >\"$HOOK_DIR/hang.pid\"; sleep 60 & echo $! >\"$HOOK_DIR/hang.child\"; sleep 60 ;;\n\
                fail) echo 'the hook broke' >&2; exit 7 ;;\n\
                flood) head -c 10485760 /dev/zero ;;\n\
                esac\n";
    let Some(w) = World::new("notify_faults", hook) else { return };
    let mut daemon = w.daemon();
    let ids: Vec<String> = (0..3).map(|_| register_job(&w.td, &[], &[])).collect();
    // The daemon has seen them open before they end.
    wait_until("the daemon's first tick", Duration::from_secs(10), || daemon.stdout().contains("daemon: connecting"));
    pause_until(Instant::now() + Duration::from_millis(1_500));
    let closed_at = Instant::now();
    for (id, reason) in ids.iter().zip(["hang", "fail", "flood"]) {
        w.mam()
            .args(["registry", "status", id, "--set", "failed", "--reason", reason, "--no-publish"])
            .run()
            .expect_rc(0);
    }
    wait_until("three notify.log lines", Duration::from_secs(15), || w.notify_log().lines().count() >= 3);
    let took = closed_at.elapsed();
    let log = w.notify_log();
    let line = |id: &str| {
        log.lines().find(|l| l.contains(&format!("job {id} "))).unwrap_or_else(|| panic!("{id}: {log}")).to_string()
    };
    assert!(line(&ids[0]).ends_with("hook killed at its 2 s deadline"), "{log}");
    assert!(line(&ids[1]).contains("hook failed (exit 7) in ") && line(&ids[1]).ends_with(": the hook broke"), "{log}");
    assert!(
        line(&ids[2]).contains("hook exit 0 in ")
            && line(&ids[2]).contains("(printed 10485760 bytes; the last 2048 kept)"),
        "{log}"
    );
    assert!(took < Duration::from_secs(8), "the deadline held: {took:?}");
    for id in &ids {
        assert_eq!(w.record(id)["status"], "failed", "the verdict stands");
    }
    for f in ["hang.pid", "hang.child"] {
        let pid: i32 = fs::read_to_string(w.td.path(&format!("hooks/{f}"))).unwrap().trim().parse().unwrap();
        wait_until(&format!("{f} {pid} gone"), Duration::from_secs(5), || {
            mam::sys::proc_start_ticks(pid).map_or(true, |(_, zombie)| zombie)
        });
    }
    // Nor is any supervisor left: each `mam notify run` ended after its line.
    wait_until("no mam notify run left", Duration::from_secs(5), || supervisors(&w.td).is_empty());
    assert!(!daemon.exited(), "the daemon goes on:\n{}", daemon.stdout());
    let out = daemon.stdout();
    assert_eq!(out.matches("hook started").count(), 3, "{out}");
    daemon.signal(15);
    assert_eq!(daemon.wait(Duration::from_secs(10)).0, 0);
}

/// A review loop's promotion and its stop are verdicts too: one hook run each, kind `loop`, with
/// the loop's id, outcome and where to look (the reports, or the checkpoint).
#[test]
fn a_loop_promotion_and_a_loop_stop_run_the_hook_once_each() {
    let mut w = crate::review::World::new("notify_loop");
    let hooks = w.td.path("hooks");
    fs::create_dir_all(&hooks).unwrap();
    let hook = w.td.write(
        "hook.sh",
        "printf '%s|%s|%s|%s|%s|%s\\n' \"$MAM_VERDICT_KIND\" \"$MAM_VERDICT\" \"$MAM_VERDICT_LOOP_ID\" \
         \"$MAM_VERDICT_STATUS\" \"$MAM_VERDICT_SESSION\" \"$MAM_VERDICT_REPORT\" >>\"$HOOK_DIR/runs\"\n",
    );
    w.env.push(("MAM_ON_VERDICT".into(), format!("sh {}", hook.display()).into()));
    w.env.push(("HOOK_DIR".into(), hooks.clone().into()));
    w.creator("cr", "");
    w.reviewer("rv", "PASS", "verdict@2=FAIL\n");
    let task = w.task("Add a line to app.txt.");
    let base = w.base();
    let args = ["--creator", "cr", "--reviewer", "rv", "--task-file", task.to_str().unwrap(), "--base", &base];
    let r = w.run_loop(&args);
    let (id1, outcome, _, reports) = crate::review::last_line(&r.stdout());
    assert_eq!(outcome, "promoted", "{}\n{}", r.stdout(), r.stderr());
    // The second loop's reviewer says FAIL and one round is all it gets: the loop stops.
    let r = w.run_loop(&[&args[..], &["--max-rounds", "1"]].concat());
    let (id2, outcome, _, _) = crate::review::last_line(&r.stdout());
    assert_ne!(outcome, "promoted", "{}\n{}", r.stdout(), r.stderr());
    let runs = || fs::read_to_string(hooks.join("runs")).unwrap_or_default();
    wait_until("both loops' hook runs", Duration::from_secs(10), || runs().matches("loop|").count() >= 2);
    pause_until(Instant::now() + Duration::from_millis(500));
    let text = runs();
    let loops: Vec<&str> = text.lines().filter(|l| l.starts_with("loop|")).collect();
    assert_eq!(loops.len(), 2, "{text}");
    assert_eq!(loops[0], format!("loop|promoted|{id1}|promoted|cr|{reports}"), "{text}");
    let cp = w.loop_dir(&id2).join("checkpoint.json");
    assert_eq!(loops[1], format!("loop|stopped|{id2}|{outcome}|cr|{}", cp.display()), "{text}");
    // Each delegation of the loops ended with a job verdict of its own.
    assert!(text.lines().any(|l| l.starts_with("job|completed|")), "{text}");
}

/// docs/GUIDE.md's two recipes, as written there: the desktop one (a `notify-send` on PATH that
/// records its arguments stands in for libnotify's) and herdr's own notification on the real herdr,
/// both through `mam notify test`.
#[test]
fn the_guide_recipes_notify() {
    let guide = fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/GUIDE.md")).unwrap();
    let section = &guide[guide.find("## Notifications").unwrap()..];
    let value = |line: &str| {
        let l = line.trim().strip_prefix("echo '").unwrap().strip_suffix("' >>.mam.env").unwrap();
        l.strip_prefix("MAM_ON_VERDICT=").unwrap().to_string()
    };
    // The line per verdict in a file (issue 32: the guide's walk runs it too).
    let recipe = value(section.lines().find(|l| l.contains("MAM_ON_VERDICT=echo")).unwrap());
    let td = TestDir::new("notify_recipes");
    fs::create_dir_all(td.ws().join(".mam")).unwrap();
    let r = td.mam().args(["notify", "test"]).env("MAM_ON_VERDICT", &recipe).run();
    assert_eq!(r.rc(), 0, "{}{}", r.stdout(), r.stderr());
    assert!(r.stdout().contains("hook exit 0"), "{}", r.stdout());
    let file = td.ws().join(".mam/verdicts.txt");
    let got = poll(Duration::from_secs(10), || fs::read_to_string(&file).ok()).unwrap_or_default();
    assert_eq!(got, "mam: completed: job 00000000 (test): completed\n");

    // herdr's: the script between its heredoc lines, the command of its echo line.
    let Some(mut h) = HerdrHome::new(&td) else { return };
    h.start_server();
    let start = section.find("<<'EOF'\n").unwrap() + "<<'EOF'\n".len();
    let script = &section[start..start + section[start..].find("\nEOF\n").unwrap() + 1];
    td.write("ws/.mam/on-verdict.sh", script);
    let cmd = value(section.lines().find(|l| l.contains("MAM_ON_VERDICT=sh .mam/on-verdict.sh")).unwrap());
    let run = |session: &str| {
        h.apply(td.mam()).args(["notify", "test"]).env("MAM_ON_VERDICT", &cmd).env("MAM_HERDR_SESSION", session).run()
    };
    let r = run(&h.session);
    assert_eq!(r.rc(), 0, "{}{}", r.stdout(), r.stderr());
    // A session with no server: herdr refuses, the hook fails, and the line says so.
    let r = run("mam-test-none");
    assert_eq!(r.rc(), 1, "{}", r.stdout());
    assert!(r.stdout().contains("hook failed (exit 1)"), "{}", r.stdout());
}
