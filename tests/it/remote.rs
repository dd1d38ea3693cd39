//! Integration tests: `mam remote dispatch|run` (CORE 9; A5, A12, A21), M1-M8, as processes against
//! the embedded broker and a real mosquitto. The orchestrator and the runner use separate registries, as on two
//! machines; `watch --remote` closes the loop on the orchestrator's side.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mam::ctx::Ctx;
use mam::mqtt::{Client, Message, MqttConfig, Role, Stop};
use mam::registry::record::Record;
use serde_json::Value;

use crate::support::{poll, rand_hex, timer_pids, wait_until, Background, Broker, Target, TimerGuard, TARGETS};
use crate::watch::World;

/// The runner's side of a world: its own registry and log root.
fn runner_registry(w: &World) -> PathBuf {
    w.td.path("runner/jobs")
}

fn runner_logs(w: &World) -> PathBuf {
    w.td.path("runner/delegate_job_logs")
}

fn runner_record(w: &World, id: &str) -> Option<Value> {
    fs::read(runner_registry(w).join(format!("{id}.json"))).ok().map(|b| serde_json::from_slice(&b).unwrap())
}

fn runner_record_bytes(w: &World, id: &str) -> Vec<u8> {
    fs::read(runner_registry(w).join(format!("{id}.json"))).unwrap()
}

fn runner_events(w: &World, id: &str) -> Vec<Value> {
    let text = fs::read_to_string(runner_registry(w).join(id).join("events.log")).unwrap_or_default();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn runner_audit(w: &World, id: &str, kind: &str) -> Vec<Value> {
    let text = fs::read_to_string(runner_logs(w).join(id).join("audit.jsonl")).unwrap_or_default();
    text.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()).filter(|e| e["kind"] == kind).collect()
}

/// `mam remote run --session NAME --exec CMD --registry-dir <runner registry> [extra]`.
fn runner(w: &World, session: &str, exec: &str, extra: &[&str]) -> Background {
    let reg = runner_registry(w);
    let mut r = w
        .mam()
        .args(["remote", "run", "--session", session, "--exec", exec, "--registry-dir", reg.to_str().unwrap()])
        .args(extra)
        .spawn_bg(&w.td, "runner");
    r.wait_stdout("subscribed topic=", Duration::from_secs(10));
    r
}

/// Registers a remote job for `remote:<session>` in the orchestrator's registry.
fn remote_job(w: &World, session: &str, extra: &[&str]) -> String {
    let s = format!("remote:{session}");
    let mut args =
        vec!["--transport", "remote", "--heartbeat-sec", "1", "--heartbeat-misses", "3", "--ack-timeout", "10"];
    args.extend_from_slice(extra);
    w.register_session(&s, &args)
}

fn dispatch(w: &World, id: &str, extra: &[&str]) {
    let r = w.mam().args(["remote", "dispatch", "--job-id", id]).args(extra).run();
    r.expect_rc(0);
    assert!(r.stdout().starts_with(&format!("dispatched job={id} attempt=")), "{}", r.stdout());
}

fn client(port: u16) -> Client {
    let ctx = Ctx::with_env([("MQTT_PORT", port.to_string())], Path::new("/"));
    Client::connect(&MqttConfig::from_ctx(&ctx).unwrap(), Role::Pub, &Stop::never()).unwrap()
}

/// Publishes a dispatch the test built itself (as an orchestrator with the given record would).
fn send_dispatch(w: &World, rec: &Record, issued_at_ms: u64, secret: &str) {
    let p = mam::remote::dispatch::payload(rec, "brief", issued_at_ms, secret.as_bytes()).unwrap();
    let topic = mam::remote::dispatch::topic(rec.str("topic_prefix").unwrap(), rec.attempt().unwrap());
    let mut c = client(w.port);
    c.publish(&Message::new(topic, serde_json::to_vec(&p).unwrap(), 1, true)).unwrap();
    c.disconnect();
}

fn orch_record(w: &World, id: &str) -> Record {
    Record::parse(&fs::read(w.registry().join(format!("{id}.json"))).unwrap()).unwrap()
}

/// Alive and not a zombie.
fn alive(pid: i32) -> bool {
    mam::sys::process_exists(pid) && !mam::sys::proc_start_ticks(pid).map(|(_, z)| z).unwrap_or(true)
}

fn read_pid(p: &Path) -> Option<i32> {
    fs::read_to_string(p).ok().and_then(|s| s.trim().parse().ok())
}

#[test]
fn m1_end_to_end_with_watch_remote() {
    for &t in TARGETS {
        let Some(w) = World::new("m1", t) else { continue };
        let session = format!("r{}", rand_hex(4));
        let id = remote_job(&w, &session, &["--parent", "p-1", "--orchestrator", "orc-uuid-1"]);
        let brief = w.td.write("brief.txt", "Do the thing.\n");
        let mut watch = w.watch_subscribed(&id, &["--remote"]);
        dispatch(&w, &id, &["--brief-file", brief.to_str().unwrap()]);
        let exec = r#"{ cat "$MAM_BRIEF_FILE"; echo "job=$MAM_JOB_ID attempt=$MAM_ATTEMPT secret=${MAM_DISPATCH_SECRET:-none}"; echo "VERDICT: ok"; } > "$MAM_REPORT_FILE""#;
        let mut run = runner(&w, &session, exec, &["--once"]);
        let (rc, _) = watch.wait(Duration::from_secs(20));
        assert_eq!(rc, 0, "{t:?}\n{}{}\n--- runner\n{}{}", watch.stdout(), watch.stderr(), run.stdout(), run.stderr());
        let (rrc, _) = run.wait(Duration::from_secs(10));
        assert_eq!(rrc, 0, "{}{}", run.stdout(), run.stderr());
        let log = run.stdout();
        for needle in [
            format!("admitted job={id} attempt=1"),
            format!("published started job={id}"),
            format!("published completed job={id}"),
            "DONE rc=0".to_string(),
        ] {
            assert!(log.contains(&needle), "{needle} in\n{log}");
        }
        // The orchestrator's record is completed and holds the report (A12).
        let r = w.record(&id);
        assert_eq!(r["status"], "completed", "{t:?}");
        let report = fs::read_to_string(w.registry().join(&id).join("report.md")).unwrap();
        assert_eq!(report, format!("Do the thing.\njob={id} attempt=1 secret=none\nVERDICT: ok\n"));
        // The runner's registry holds the mirror (A5 fields kept), its brief and its events.
        let m = runner_record(&w, &id).unwrap();
        assert_eq!(m["status"], "completed");
        assert_eq!(m["dispatch_token"], r["dispatch_token"]);
        assert_eq!(m["agent_session"], format!("remote:{session}"));
        assert_eq!((m["parent_job_id"].as_str(), m["orchestrator_uuid"].as_str()), (Some("p-1"), Some("orc-uuid-1")));
        assert_eq!(fs::read_to_string(runner_registry(&w).join(&id).join("brief.md")).unwrap(), "Do the thing.\n");
        // Beats of the runner's timer (CORE 9.3 step 4) may come between them when the host is slow.
        let events: Vec<String> = runner_events(&w, &id)
            .iter()
            .filter(|e| e["heartbeat"] != true)
            .map(|e| e["event"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(events, ["started", "completed"]);
        assert_eq!(runner_audit(&w, &id, "published").len(), 2);
        // No secret in any file the runner wrote.
        for f in crate::support::tree(&w.td.path("runner")) {
            let p = w.td.path("runner").join(&f);
            if p.is_file() {
                assert!(!fs::read_to_string(&p).unwrap_or_default().contains(&w.secret), "secret in {f}");
            }
        }
    }
}

#[test]
fn m2_wrong_secret_foreign_session_and_stale_dispatch_are_not_served() {
    for &t in TARGETS {
        let Some(w) = World::new("m2", t) else { continue };
        let session = format!("r{}", rand_hex(4));
        let id = remote_job(&w, &session, &[]);
        dispatch(&w, &id, &[]);
        // A runner with another secret: the signature does not verify.
        let mut bad = w
            .mam()
            .env("MAM_DISPATCH_SECRET", rand_hex(16))
            .args(["remote", "run", "--session", &session, "--exec", "true"])
            .args(["--registry-dir", runner_registry(&w).to_str().unwrap()])
            .spawn_bg(&w.td, "runner-bad");
        bad.wait_stdout("dropped: bad signature", Duration::from_secs(10));
        bad.signal(libc::SIGTERM);
        assert_eq!(bad.wait(Duration::from_secs(5)).0, 0, "{}", bad.stderr());
        assert!(runner_record(&w, &id).is_none());

        // A runner of another session never queues it; a stale dispatch of its own is logged and
        // skipped; its fresh own job is served.
        let other = format!("r{}", rand_hex(4));
        let stale = remote_job(&w, &other, &[]);
        send_dispatch(&w, &orch_record(&w, &stale), mam::clock::now_ms() - 75_000, &w.secret);
        let mut run = runner(&w, &other, "true", &[]);
        run.wait_stdout(&format!("stale dispatch ignored job={stale} attempt=1"), Duration::from_secs(10));
        let own = remote_job(&w, &other, &[]);
        dispatch(&w, &own, &[]);
        run.wait_stdout("DONE rc=0", Duration::from_secs(10));
        run.signal(libc::SIGTERM);
        assert_eq!(run.wait(Duration::from_secs(5)).0, 0, "{}", run.stderr());
        let log = run.stdout();
        assert!(!log.contains(&format!("job={id}")), "{t:?} foreign job seen:\n{log}");
        assert!(runner_record(&w, &id).is_none() && runner_record(&w, &stale).is_none());
        assert_eq!(runner_record(&w, &own).unwrap()["status"], "completed");
    }
}

#[test]
fn m3_an_earlier_sessions_retained_dispatch_is_left_alone() {
    for &t in TARGETS {
        let Some(w) = World::new("m3", t) else { continue };
        let old = remote_job(&w, "A", &[]);
        dispatch(&w, &old, &[]);
        let fresh = format!("r{}", rand_hex(4));
        let mine = remote_job(&w, &fresh, &[]);
        dispatch(&w, &mine, &[]);
        let mut run = runner(&w, &fresh, "true", &["--once"]);
        assert_eq!(run.wait(Duration::from_secs(15)).0, 0, "{}{}", run.stdout(), run.stderr());
        assert_eq!(runner_record(&w, &mine).unwrap()["status"], "completed");
        assert!(runner_record(&w, &old).is_none());
        assert!(!run.stdout().contains(&old), "{}", run.stdout());
        if let Some(Broker::Embedded(b)) = &w.broker {
            let topic = format!("mam/jobs/{old}/dispatch/1");
            assert!(b.retained(&topic).is_some_and(|p| !p.is_empty()), "A's dispatch is still retained");
        }
    }
}

#[test]
fn m4_mirror_admission() {
    for &t in TARGETS {
        let Some(w) = World::new("m4", t) else { continue };
        let session = format!("r{}", rand_hex(4));
        // N=30: no beat takes a seq, so the seqs below are exactly the runner's events.
        let id = remote_job(&w, &session, &["--heartbeat-sec", "30"]);
        let remote_session = format!("remote:{session}");
        let submit = || {
            let args = ["registry", "submit", "--type", "task", "--job-id", &id, "--session", &remote_session];
            w.mam().args(args).run().expect_rc(0);
        };
        let rec1 = orch_record(&w, &id);
        submit();
        let rec2 = orch_record(&w, &id);
        submit();
        let rec3 = orch_record(&w, &id);
        let runs = w.td.path("runs.txt");
        let exec = format!("echo \"$MAM_ATTEMPT\" >> '{}'", runs.display());
        let mut run = runner(&w, &session, &exec, &[]);
        let runs_done = |run: &mut Background, n: usize| {
            if poll(Duration::from_secs(10), || (run.stdout().matches("DONE rc=0").count() >= n).then_some(()))
                .is_none()
            {
                panic!("timed out waiting for {n} x DONE rc=0\n{}{}", run.stdout(), run.stderr());
            }
        };

        send_dispatch(&w, &rec2, mam::clock::now_ms(), &w.secret);
        runs_done(&mut run, 1);
        run.wait_stdout(&format!("cleared dispatch topic=mam/jobs/{id}/dispatch/2"), Duration::from_secs(5));
        let after2 = runner_record_bytes(&w, &id);
        let m: Value = serde_json::from_slice(&after2).unwrap();
        assert_eq!(
            (m["attempt"].as_u64(), m["status"].as_str(), m["last_seq"].as_u64()),
            (Some(2), Some("completed"), Some(2))
        );

        // The same token again after completion: idempotent, not run again.
        send_dispatch(&w, &rec2, mam::clock::now_ms(), &w.secret);
        run.wait_stdout(&format!("already admitted job={id} attempt=2; not run again"), Duration::from_secs(10));
        // Attempt 1 after a local attempt 2, and attempt 2 with another token: refused, no write.
        send_dispatch(&w, &rec1, mam::clock::now_ms(), &w.secret);
        run.wait_stdout(&format!("mirror refused job={id} attempt=1"), Duration::from_secs(10));
        let mut other = rec2.clone();
        other.set("dispatch_token", rand_hex(16));
        send_dispatch(&w, &other, mam::clock::now_ms(), &w.secret);
        wait_until("the second refusal", Duration::from_secs(10), || {
            run.stdout().matches(&format!("mirror refused job={id} attempt=")).count() == 2
        });
        assert_eq!(runner_record_bytes(&w, &id), after2, "a refusal writes nothing");
        assert_eq!(runner_audit(&w, &id, "mirror_refused").len(), 2);

        // Attempt 3 replaces the record; events.log keeps the old lines and seqs go on.
        send_dispatch(&w, &rec3, mam::clock::now_ms(), &w.secret);
        runs_done(&mut run, 2);
        let m = runner_record(&w, &id).unwrap();
        assert_eq!((m["attempt"].as_u64(), m["status"].as_str()), (Some(3), Some("completed")));
        let seqs: Vec<(u64, u64)> = runner_events(&w, &id)
            .iter()
            .map(|e| (e["attempt"].as_u64().unwrap(), e["seq"].as_u64().unwrap()))
            .collect();
        assert_eq!(seqs, [(2, 1), (2, 2), (3, 3), (3, 4)], "{t:?}");
        assert_eq!(fs::read_to_string(&runs).unwrap(), "2\n3\n", "each admitted attempt ran exactly once");
        run.signal(libc::SIGTERM);
        assert_eq!(run.wait(Duration::from_secs(5)).0, 0);
    }
}

/// Kills (SIGKILL) whatever pids the stubborn exec recorded, so a failing test leaks nothing.
struct PidFiles(PathBuf);

impl PidFiles {
    fn new(dir: PathBuf) -> PidFiles {
        fs::create_dir_all(&dir).unwrap();
        PidFiles(dir)
    }
}

impl Drop for PidFiles {
    fn drop(&mut self) {
        for f in ["sh.pid", "gc.pid"] {
            if let Some(p) = read_pid(&self.0.join(f)) {
                if alive(p) {
                    let _ = mam::sys::kill(p, libc::SIGKILL);
                }
            }
        }
    }
}

/// An exec whose shell records its pid and starts a grandchild that ignores SIGTERM.
fn stubborn_exec(dir: &Path) -> String {
    format!(
        "echo $$ > '{d}/sh.pid'; sh -c 'trap \"\" TERM; echo $$ > \"{d}/gc.pid\"; while :; do sleep 0.1; done' & wait",
        d = dir.display()
    )
}

/// A client subscribed to a job's events.
fn events_client(port: u16, prefix: &str) -> Client {
    let mut c = client(port);
    c.subscribe(&[format!("{prefix}/events")], 1).unwrap();
    c
}

/// For the first event named `event` on `c`: its payload and whether each of `pids` was already
/// dead when it arrived.
fn await_event(mut c: Client, event: &str, pids: impl Fn() -> Vec<i32>, limit: Duration) -> (Value, bool) {
    let deadline = Instant::now() + limit;
    loop {
        assert!(Instant::now() < deadline, "no {event} event within {limit:?}");
        let Some(m) = c.recv(deadline).unwrap() else { continue };
        let v: Value = serde_json::from_slice(&m.payload).unwrap();
        if v["event"] == event {
            let all_dead = pids().iter().all(|&p| !alive(p));
            return (v, all_dead);
        }
    }
}

#[test]
fn m5_timeout_kills_the_whole_group_before_error() {
    let Some(w) = World::new("m5", Target::Embedded) else { return };
    let session = format!("r{}", rand_hex(4));
    let id = remote_job(&w, &session, &["--timeout", "2"]);
    let dir = w.td.path("m5");
    let _guard = PidFiles::new(dir.clone());
    let mut run = runner(&w, &session, &stubborn_exec(&dir), &["--once"]);
    let prefix = format!("mam/jobs/{id}");
    let pids = {
        let dir = dir.clone();
        move || -> Vec<i32> {
            [read_pid(&dir.join("sh.pid")), read_pid(&dir.join("gc.pid"))].into_iter().flatten().collect()
        }
    };
    let waiter = {
        let c = events_client(w.port, &prefix);
        let pids = pids.clone();
        std::thread::spawn(move || await_event(c, "error", pids, Duration::from_secs(20)))
    };
    dispatch(&w, &id, &[]);
    wait_until("the job's processes to start", Duration::from_secs(10), || pids().len() == 2);
    let started = Instant::now();
    let (ev, all_dead) = waiter.join().unwrap();
    let took = started.elapsed();
    assert_eq!(ev["data"]["reason"], "timeout", "{ev}");
    assert!(all_dead, "error/timeout was published while a process of the group still ran");
    assert!(took >= Duration::from_secs(2) && took <= Duration::from_secs(8), "{took:?}");
    for p in pids() {
        assert!(!alive(p), "pid {p} survived");
    }
    assert_eq!(run.wait(Duration::from_secs(10)).0, 0, "{}{}", run.stdout(), run.stderr());
    assert!(run.stdout().contains(&format!("published error job={id}")), "{}", run.stdout());
}

#[test]
fn m6_sigterm_to_a_busy_runner() {
    let Some(w) = World::new("m6", Target::Embedded) else { return };
    let session = format!("r{}", rand_hex(4));
    let id = remote_job(&w, &session, &[]);
    let dir = w.td.path("m6");
    let _guard = PidFiles::new(dir.clone());
    let mut watch = w.watch_subscribed(&id, &["--remote"]);
    let mut run = w
        .mam()
        .env("MAM_RUNNER_GRACE_MS", "1000")
        .args(["remote", "run", "--session", &session, "--exec", &stubborn_exec(&dir)])
        .args(["--registry-dir", runner_registry(&w).to_str().unwrap()])
        .spawn_bg(&w.td, "runner");
    dispatch(&w, &id, &[]);
    run.wait_stdout(&format!("published started job={id}"), Duration::from_secs(10));
    let pids: Vec<i32> = {
        wait_until("the job's processes", Duration::from_secs(10), || {
            read_pid(&dir.join("sh.pid")).is_some() && read_pid(&dir.join("gc.pid")).is_some()
        });
        vec![read_pid(&dir.join("sh.pid")).unwrap(), read_pid(&dir.join("gc.pid")).unwrap()]
    };
    run.signal(libc::SIGTERM);
    let (rc, _) = run.wait(Duration::from_secs(15));
    assert_eq!(rc, 0, "{}{}", run.stdout(), run.stderr());
    for p in &pids {
        assert!(!alive(*p), "pid {p} survived");
    }
    let (wrc, _) = watch.wait(Duration::from_secs(10));
    assert_eq!(wrc, 10, "{}{}", watch.stdout(), watch.stderr());
    assert_eq!(w.record(&id)["status"], "error");
    let last = runner_events(&w, &id).pop().unwrap();
    assert_eq!((last["event"].as_str(), last["data"]["reason"].as_str()), (Some("error"), Some("interrupted")));
    assert!(run.stdout().contains("DONE rc="), "{}", run.stdout());
}

#[test]
fn m8_the_attempts_dispatch_is_cleared_after_the_terminal() {
    let Some(w) = World::new("m8", Target::Embedded) else { return };
    let session = format!("r{}", rand_hex(4));
    let id = remote_job(&w, &session, &[]);
    dispatch(&w, &id, &[]);
    let topic = format!("mam/jobs/{id}/dispatch/1");
    let Some(Broker::Embedded(b)) = &w.broker else { unreachable!() };
    assert!(b.retained(&topic).is_some());
    let mut run = runner(&w, &session, "exit 3", &["--once"]);
    assert_eq!(run.wait(Duration::from_secs(15)).0, 0, "{}{}", run.stdout(), run.stderr());
    assert!(b.retained(&topic).is_none(), "the attempt's dispatch is still retained");
    let last = runner_events(&w, &id).pop().unwrap();
    assert_eq!((last["event"].as_str(), last["data"]["rc"].as_u64()), (Some("failed"), Some(3)));
    assert!(run.stdout().contains("DONE rc=3"), "{}", run.stdout());
}

#[test]
fn a12_long_report_keeps_its_tail_and_a_large_brief_travels() {
    let Some(w) = World::new("a12", Target::Embedded) else { return };
    let session = format!("r{}", rand_hex(4));
    let id = remote_job(&w, &session, &[]);
    let brief = "b".repeat(700 * 1024);
    let brief_file = w.td.write("big-brief.md", &brief);
    let mut watch = w.watch_subscribed(&id, &["--remote"]);
    dispatch(&w, &id, &["--brief-file", brief_file.to_str().unwrap()]);
    // 300 000 two-byte characters, then the verdict: 600 009 bytes, cut to the last 256 KiB.
    let exec = r#"awk 'BEGIN { for (i = 0; i < 300000; i++) printf "é"; print ""; print "VERDICT: ok" }' > "$MAM_REPORT_FILE""#;
    let mut run = runner(&w, &session, exec, &["--once"]);
    assert_eq!(watch.wait(Duration::from_secs(20)).0, 0, "{}{}", watch.stdout(), watch.stderr());
    assert_eq!(run.wait(Duration::from_secs(10)).0, 0);
    assert_eq!(fs::read_to_string(runner_registry(&w).join(&id).join("brief.md")).unwrap(), brief);
    let report = fs::read(w.registry().join(&id).join("report.md")).unwrap();
    let full = fs::metadata(runner_registry(&w).join(&id).join("report.md")).unwrap().len();
    assert!(report.len() <= 256 * 1024 && report.len() >= 256 * 1024 - 3, "{}", report.len());
    assert!(std::str::from_utf8(&report).unwrap().ends_with("\nVERDICT: ok\n"));
    let last = runner_events(&w, &id).pop().unwrap();
    assert_eq!(last["data"]["report_truncated"].as_u64(), Some(full - report.len() as u64));

    let huge = w.td.write("huge-brief.md", "x".repeat(768 * 1024 + 1));
    let r = w.mam().args(["remote", "dispatch", "--job-id", &id, "--brief-file", huge.to_str().unwrap()]).run();
    r.expect_rc(2);
    assert!(r.stderr().contains("at most 786432"), "{}", r.stderr());
}

#[test]
fn secret_is_required_and_local_jobs_are_not_dispatched() {
    let w = World::without_broker("rsecret", crate::support::free_port());
    for args in [&["remote", "run", "--session", "x", "--exec", "true"][..], &["remote", "dispatch", "--job-id", "j1"]]
    {
        let r = w.td.mam().args(args).run();
        r.expect_rc(1);
        assert_eq!(r.stderr(), "ERROR: MAM_DISPATCH_SECRET is not set\n");
    }
    let id = w.register(&[]);
    let r = w.mam().args(["remote", "dispatch", "--job-id", &id]).run();
    r.expect_rc(1);
    assert!(r.stderr().contains("is not a remote job (transport=local"), "{}", r.stderr());
    w.mam().args(["remote", "--help"]).run().expect_rc(0);
}

#[test]
fn a21_dispatches_queue_in_arrival_order_while_a_job_runs() {
    let Some(w) = World::new("a21q", Target::Embedded) else { return };
    let session = format!("r{}", rand_hex(4));
    let ids: Vec<String> = (0..3).map(|_| remote_job(&w, &session, &[])).collect();
    let go = w.td.path("go");
    let order = w.td.path("order.txt");
    let exec = format!(
        "if [ \"$MAM_JOB_ID\" = {first} ]; then while [ ! -e '{go}' ]; do sleep 0.05; done; fi; echo \"$MAM_JOB_ID\" >> '{order}'",
        first = ids[0],
        go = go.display(),
        order = order.display()
    );
    let mut run = runner(&w, &session, &exec, &[]);
    dispatch(&w, &ids[0], &[]);
    run.wait_stdout(&format!("published started job={}", ids[0]), Duration::from_secs(10));
    // The first job is busy; the reader still takes the next dispatches off the wire.
    for id in &ids[1..] {
        dispatch(&w, id, &[]);
        run.wait_stdout(&format!("queued job={id} attempt=1"), Duration::from_secs(10));
    }
    assert!(!run.stdout().contains(&format!("admitted job={}", ids[1])), "one job at a time:\n{}", run.stdout());
    fs::write(&go, "").unwrap();
    wait_until("three jobs done", Duration::from_secs(15), || run.stdout().matches("DONE rc=0").count() == 3);
    assert_eq!(fs::read_to_string(&order).unwrap(), format!("{}\n", ids.join("\n")));
    run.signal(libc::SIGINT);
    assert_eq!(run.wait(Duration::from_secs(5)).0, 0);
}

#[test]
fn runner_reconnects_after_a_broker_restart() {
    for &t in TARGETS {
        let Some(mut w) = World::new("rrestart", t) else { continue };
        let session = format!("r{}", rand_hex(4));
        let mut run = runner(&w, &session, "true", &[]);
        w.restart_broker();
        run.wait_stdout("broker down", Duration::from_secs(5));
        run.wait_stdout("broker up", Duration::from_secs(10));
        let id = remote_job(&w, &session, &[]);
        dispatch(&w, &id, &[]);
        run.wait_stdout(&format!("DONE rc=0 job={id}"), Duration::from_secs(10));
        run.signal(libc::SIGTERM);
        assert_eq!(run.wait(Duration::from_secs(5)).0, 0, "{t:?}");
        assert_eq!(runner_record(&w, &id).unwrap()["status"], "completed");
    }
}

#[test]
fn m7_a_killed_runners_timer_stops_within_n_plus_1_s() {
    let Some(w) = World::new("m7", Target::Embedded) else { return };
    let session = format!("r{}", rand_hex(4));
    let id = remote_job(&w, &session, &[]);
    let _timers = TimerGuard(id.clone());
    let dir = w.td.path("m7");
    let _guard = PidFiles::new(dir.clone());
    let exec = format!("echo $$ > '{}/sh.pid'; while :; do sleep 0.1; done", dir.display());
    let mut run = runner(&w, &session, &exec, &[]);
    dispatch(&w, &id, &[]);
    run.wait_stdout(&format!("heartbeat armed job={id}"), Duration::from_secs(10));
    wait_until("two beats in the runner's events.log", Duration::from_secs(10), || {
        runner_events(&w, &id).iter().filter(|e| e["heartbeat"] == true).count() >= 2
    });
    let timers = timer_pids(&id);
    assert_eq!(timers.len(), 1, "{}", run.stdout());
    let timer = timers[0];
    let started = runner_audit(&w, &id, "heartbeat_started");
    assert_eq!(started[0]["watch_pid"].as_i64(), Some(i64::from(run.pid())), "the timer watches the runner");
    assert_eq!(started[0]["interval"].as_u64(), Some(1));
    let environ = fs::read(format!("/proc/{timer}/environ")).unwrap();
    assert!(!String::from_utf8_lossy(&environ).contains(&w.secret), "the dispatch secret reached the timer");
    // The beats are the job's own: signed with the mirror's auth token, for the dispatched attempt.
    let m = runner_record(&w, &id).unwrap();
    let key = m["auth_token"].as_str().unwrap().as_bytes().to_vec();
    for e in runner_events(&w, &id) {
        assert!(mam::sign::verify(&key, &e), "{e}");
        assert_eq!((e["attempt"].as_u64(), &e["dispatch_token"]), (Some(1), &m["dispatch_token"]));
    }

    run.signal(libc::SIGKILL);
    let killed = Instant::now();
    run.wait(Duration::from_secs(5));
    wait_until("the timer to stop", Duration::from_secs(5), || !alive(timer));
    let took = killed.elapsed();
    assert!(took <= Duration::from_secs(2), "N+1 s with N=1: the timer took {took:?}");
    let hb_log = fs::read_to_string(runner_logs(&w).join(&id).join("heartbeat.log")).unwrap_or_default();
    assert!(hb_log.contains(&format!("watched process {} is gone", run.pid())), "{hb_log}");
}

/// Two runners with separate registry dirs and random session names on one broker: each runs its
/// own job only, and neither mirrors the other's.
#[test]
fn two_runners_on_one_broker_serve_only_their_own_sessions() {
    for &t in TARGETS {
        let Some(w) = World::new("two", t) else { continue };
        let (s1, s2) = (format!("r{}", rand_hex(4)), format!("r{}", rand_hex(4)));
        let regs = [w.td.path("runner-one/jobs"), w.td.path("runner-two/jobs")];
        let mut runners: Vec<Background> = [&s1, &s2]
            .iter()
            .zip(&regs)
            .map(|(s, reg)| {
                let mut r = w
                    .mam()
                    .args(["remote", "run", "--session", s, "--exec", "true", "--once"])
                    .args(["--registry-dir", reg.to_str().unwrap()])
                    .spawn_bg(&w.td, "runner-pair");
                r.wait_stdout("subscribed topic=", Duration::from_secs(10));
                r
            })
            .collect();
        let (j1, j2) = (remote_job(&w, &s1, &[]), remote_job(&w, &s2, &[]));
        dispatch(&w, &j1, &[]);
        dispatch(&w, &j2, &[]);
        for r in runners.iter_mut() {
            assert_eq!(r.wait(Duration::from_secs(15)).0, 0, "{}{}", r.stdout(), r.stderr());
        }
        let has = |reg: &std::path::Path, id: &str| reg.join(format!("{id}.json")).exists();
        assert!(has(&regs[0], &j1) && !has(&regs[0], &j2), "{t:?}: runner one mirrored the wrong jobs");
        assert!(has(&regs[1], &j2) && !has(&regs[1], &j1), "{t:?}: runner two mirrored the wrong jobs");
        assert!(!runners[0].stdout().contains(&j2) && !runners[1].stdout().contains(&j1));
    }
}
