//! Issue 21, `mam wait`: many jobs at once, one line per verdict as it happens (from events.log,
//! the wire or the record), `--any`/`--all`, `--json`, a timeout that holds, exit codes that say
//! which case ended the wait, a small CPU cost over 200 jobs, and never a change to a job.
//!
//! Jobs are registered through the CLI and their agents stand in as signed events appended to
//! events.log (or published on the wire), the way `mam publish` writes them; the embedded broker.

use std::collections::HashMap;
use std::fs;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::*;

struct World {
    td: TestDir,
    broker: Broker,
}

impl World {
    fn new(name: &str) -> Option<World> {
        let td = TestDir::new(name);
        let broker = start_target(Target::Embedded, &td)?;
        Some(World { td, broker })
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![("MQTT_PORT", self.broker.port().to_string()), ("MAM_WATCH_POLL_MS", "200".into())]
    }

    fn mam(&self) -> Cmd {
        let mut c = self.td.mam();
        for (k, v) in self.env() {
            c = c.env(k, v);
        }
        c
    }

    fn register(&self, session: &str, timing: &[&str]) -> String {
        let mut c = self.mam().args(["registry", "register", "--session", session]).args(timing);
        c = c.env("MAM_HEARTBEAT_SEC", "1");
        let r = c.run();
        r.expect_rc(0);
        r.stdout().trim().to_string()
    }

    fn record(&self, id: &str) -> Value {
        read_record(&self.td, id)
    }

    /// The job's agent writes `event` (seq) to events.log, signed, as `mam publish` does.
    fn event(&self, id: &str, event: &str, seq: u64) {
        append_events_log(&self.td, id, &signed_event(&self.record(id), event, seq, false));
    }

    /// The same on the wire only.
    fn wire_event(&self, id: &str, event: &str, seq: u64) {
        let rec = self.record(id);
        let topic = format!("{}/events", rec["topic_prefix"].as_str().unwrap());
        publish_raw(self.broker.port(), &topic, &signed_event(&rec, event, seq, false), false);
    }
}

/// CPU time (user + system) of `pid` in seconds.
fn cpu_s(pid: i32) -> f64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    let hz = std::process::Command::new("getconf").arg("CLK_TCK").output().unwrap();
    ticks as f64 / String::from_utf8_lossy(&hz.stdout).trim().parse::<f64>().unwrap()
}

/// `JOB_ID=.. VERDICT=..` lines of a wait's stdout by job, with the moment each was first seen.
fn lines_by_job(out: &str) -> HashMap<String, Vec<String>> {
    let mut m: HashMap<String, Vec<String>> = HashMap::new();
    for l in out.lines().filter(|l| l.starts_with("JOB_ID=")) {
        let id = l.split_whitespace().next().unwrap().trim_start_matches("JOB_ID=").to_string();
        m.entry(id).or_default().push(l.to_string());
    }
    m
}

/// 200 open jobs: three complete (through events.log, the wire and the record), one goes silent,
/// one never starts. Each verdict is printed once within its window, the rest are pending when the
/// 10 s timeout ends the wait (rc 13) on time, the wait's CPU stays under 1 % of a core, and no job
/// was changed by it.
#[test]
fn over_200_jobs_each_verdict_once_within_its_window_and_the_timeout_holds() {
    let Some(w) = World::new("wait_200") else { return };
    let long = ["--ack-timeout", "600", "--heartbeat-misses", "3"];
    // Registered four at a time (the CLI costs a process each).
    let mut ids: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|t| {
                let w = &w;
                s.spawn(move || (0..49).map(|i| w.register(&format!("s{t}-{i}"), &long)).collect::<Vec<_>>())
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let (c1, c2, c3) = (ids[0].clone(), ids[1].clone(), ids[2].clone());
    ids.extend((0..2).map(|i| w.register(&format!("x{i}"), &long)));
    let silent = w.register("silent", &["--ack-timeout", "600", "--idle-timeout", "3"]);
    // T + K x N = 3 + 2 s from its dispatch, registered last, just before the wait starts.
    let never = w.register("never", &["--ack-timeout", "3", "--heartbeat-misses", "2"]);
    let never_due = mam::clock::parse_ts(w.record(&never)["dispatched_at"].as_str().unwrap()).unwrap() + 5_000;
    ids.extend([silent.clone(), never.clone()]);
    assert_eq!(ids.len(), 200);

    let mut bg = w.mam().args(["wait", "--all-open", "--timeout", "10"]).spawn_bg(&w.td, "wait");
    let t0 = Instant::now();
    // The wire is subscribed once the wait says nothing about it; give it its first poll.
    pause_until(t0 + Duration::from_millis(1_500));
    let cpu_from = cpu_s(bg.pid());
    let cpu_t = Instant::now();
    w.event(&silent, "started", 1);
    let silent_at = mam::clock::now_ms();
    w.event(&c1, "started", 1);
    w.event(&c1, "completed", 2);
    let c1_at = Instant::now();
    w.wire_event(&c2, "completed", 1);
    let c2_at = Instant::now();
    w.mam().args(["registry", "status", &c3, "--set", "completed", "--no-publish"]).run().expect_rc(0);
    let c3_at = Instant::now();
    let mut seen: HashMap<String, (Instant, u64)> = HashMap::new();
    while !bg.exited() && t0.elapsed() < Duration::from_secs(15) {
        for id in lines_by_job(&bg.stdout()).keys() {
            seen.entry(id.clone()).or_insert((Instant::now(), mam::clock::now_ms()));
        }
        std::thread::sleep(Duration::from_millis(50));
        // The CPU sample ends before the exit.
        if t0.elapsed() >= Duration::from_millis(9_000) && !seen.contains_key("cpu") {
            let used = cpu_s(bg.pid()) - cpu_from;
            let over = cpu_t.elapsed().as_secs_f64();
            eprintln!("wait: {used:.3} s CPU over {over:.1} s for 200 jobs ({:.2} %)", 100.0 * used / over);
            assert!(used / over < 0.01, "wait used {used:.3} s CPU in {over:.1} s");
            seen.insert("cpu".into(), (Instant::now(), 0));
        }
    }
    let (rc, ended) = bg.wait(Duration::from_secs(5));
    let out = bg.stdout();
    assert_eq!(rc, 13, "{out}\n{}", bg.stderr());
    let took = ended.duration_since(t0);
    assert!(
        took >= Duration::from_millis(9_900) && took < Duration::from_secs(11),
        "the timeout ended it after {took:?}"
    );
    let by = lines_by_job(&out);
    assert_eq!(by.len(), 5, "{out}");
    assert!(by.values().all(|v| v.len() == 1), "each verdict once: {by:#?}");
    let has = |id: &str, want: &str| by[id][0].contains(want);
    assert!(has(&c1, "VERDICT=completed STATUS=completed SOURCE=events.log"), "{:?}", by[&c1]);
    assert!(has(&c2, "VERDICT=completed STATUS=completed SOURCE=wire"), "{:?}", by[&c2]);
    assert!(has(&c3, "VERDICT=completed STATUS=completed SOURCE=record"), "{:?}", by[&c3]);
    assert!(has(&silent, "VERDICT=unresponsive STATUS=pending SOURCE=inferred"), "{:?}", by[&silent]);
    // Issue 30: no report is named where none was written.
    assert!(has(&silent, " REPORT=-"), "{:?}", by[&silent]);
    assert!(has(&never, "VERDICT=no_started STATUS=pending SOURCE=inferred"), "{:?}", by[&never]);
    // Within their windows: a poll (200 ms) for what is on disk or the wire, the budget for silence.
    for (id, at) in [(&c1, c1_at), (&c2, c2_at), (&c3, c3_at)] {
        let d = seen[id.as_str()].0.duration_since(at);
        assert!(d < Duration::from_millis(1_200), "{id} printed {d:?} after its verdict");
    }
    let s = seen[silent.as_str()].1 as i64 - (silent_at as i64 + 3_000);
    assert!((-100..=1_200).contains(&s), "unresponsive printed {s} ms off its idle window");
    let n = seen[never.as_str()].1 as i64 - never_due as i64;
    assert!((-100..=1_200).contains(&n), "no_started printed {n} ms off its ack budget");
    let last = out.lines().last().unwrap();
    assert!(last.starts_with("WAIT=timeout VERDICTS=5 PENDING="), "{last}");
    assert_eq!(last.split("PENDING=").nth(1).unwrap().split(',').count(), 195, "{last}");
    // Never closes anything: the silent and the never-started jobs are as they were.
    assert_eq!(w.record(&silent)["status"], "pending");
    assert_eq!(w.record(&never)["status"], "pending");
}

/// `--any` ends at the first verdict (rc from it), `--all` at the last (the highest of 11, 12, 10),
/// `--json` lines, `--session`, an unknown job, a selection missing.
#[test]
fn any_all_json_sessions_and_exit_codes() {
    let Some(w) = World::new("wait_modes") else { return };
    let t = ["--ack-timeout", "600", "--idle-timeout", "2"];
    let (a, b, c) = (w.register("wa", &t), w.register("wb", &t), w.register("wc", &t));
    let mut any = w.mam().args(["wait", &a, &b, "--any", "--json", "--timeout", "20"]).spawn_bg(&w.td, "any");
    let mut all = w.mam().args(["wait", &a, &b, &c, "--all", "--timeout", "20"]).spawn_bg(&w.td, "all");
    let mut by_session = w.mam().args(["wait", "--session", "wb", "--timeout", "20"]).spawn_bg(&w.td, "sess");
    pause_until(Instant::now() + Duration::from_millis(800));
    w.event(&a, "started", 1);
    w.event(&a, "completed", 2);
    let (rc, _) = any.wait(Duration::from_secs(10));
    let out = any.stdout();
    assert_eq!(rc, 0, "{out}{}", any.stderr());
    let lines: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert_eq!((lines[0]["job_id"].as_str(), lines[0]["verdict"].as_str()), (Some(a.as_str()), Some("completed")));
    assert_eq!(lines[0]["source"], "events.log");
    assert_eq!(lines[0]["session"], "wa");
    assert_eq!(lines[1]["wait"], "any");
    assert_eq!(lines[1]["pending"], serde_json::json!([b.clone()]));
    assert_eq!(lines[1]["rc"], 0);
    // b fails (an operator close, seen in its record), c goes silent: --all ends with 11.
    w.event(&c, "started", 1);
    w.mam()
        .args(["registry", "status", &b, "--set", "failed", "--reason", "broke down", "--no-publish"])
        .run()
        .expect_rc(0);
    let (rc, _) = by_session.wait(Duration::from_secs(10));
    let out = by_session.stdout();
    assert_eq!(rc, 10, "{out}");
    assert!(
        out.lines()
            .next()
            .unwrap()
            .contains(&format!("JOB_ID={b} SESSION=wb VERDICT=failed STATUS=failed SOURCE=record")),
        "{out}"
    );
    assert!(out.lines().next().unwrap().ends_with("REASON='broke down'"), "{out}");
    let (rc, _) = all.wait(Duration::from_secs(10));
    let out = all.stdout();
    assert_eq!(rc, 11, "{out}");
    let by = lines_by_job(&out);
    assert_eq!((by.len(), by.values().all(|v| v.len() == 1)), (3, true), "{out}");
    assert!(by[&c][0].contains("VERDICT=unresponsive"), "{out}");
    assert!(out.lines().last().unwrap().starts_with("WAIT=all VERDICTS=3 PENDING=-"), "{out}");
    assert_eq!(w.record(&c)["status"], "pending", "wait never closes a job");
    // A job that never starts: 12.
    let d = w.register("wd", &["--ack-timeout", "1", "--idle-timeout", "1"]);
    let r = w.mam().args(["wait", &d, "--timeout", "10"]).run();
    assert_eq!(r.rc(), 12, "{}", r.stdout());
    assert!(r.stdout().contains("VERDICT=no_started"), "{}", r.stdout());
    // Nothing open for a session: at once, said, rc 14 (issue 32: it was rc 0). An unknown job:
    // rc 1. No selection: rc 2.
    let r = w.mam().args(["wait", "--session", "nobody"]).run();
    assert_eq!((r.rc(), r.stdout().trim()), (14, ""));
    assert_eq!(r.stderr(), "ERROR: wait: nothing to wait for: session nobody has no open job (see `mam jobs`)\n");
    assert_eq!(w.mam().args(["wait", "0badc0de"]).run().rc(), 1);
    let r = w.mam().args(["wait"]).run();
    assert_eq!(r.rc(), 2);
    assert!(r.stderr().contains("--all-open"), "{}", r.stderr());
}
