//! Integration tests: issue 12 items 5-9 and the log half of 10 ("Secrets, replays and bounds" in
//! docs/SECURITY.md). Each test performs the attack as the issue reports it and fails on the code
//! before its fix: secrets in every child's environment, a replayed dispatch run twice, a password
//! sent over a record's plaintext broker block, whole-log reads, an audit flood, raw control
//! characters in log lines.

use std::ffi::OsString;
use std::fs;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::support::*;

// ---------------------------------------------------------------------------------------------
// Helpers: a process's environment from /proc

/// The `NAME=value` entries of a live process's environment.
fn environ(pid: i32) -> Vec<String> {
    let raw = fs::read(format!("/proc/{pid}/environ")).unwrap_or_else(|e| panic!("environ of {pid}: {e}"));
    raw.split(|&b| b == 0).filter(|e| !e.is_empty()).map(|e| String::from_utf8_lossy(e).into_owned()).collect()
}

fn has_var(env: &[String], name: &str) -> bool {
    env.iter().any(|e| e.starts_with(&format!("{name}=")))
}

// ---------------------------------------------------------------------------------------------
// Item 5: secrets reach only the processes that need them

/// A fake-backend delegation: the agent, the heartbeat timer its `started` armed and the wrapper's
/// `mam watch` are all alive; none holds MAM_DISPATCH_SECRET, the agent holds no MQTT_PASSWORD, and
/// watch (a broker client) still has the password.
#[test]
fn i5_a_delegation_gives_no_secret_to_the_agent_and_the_dispatch_secret_to_no_child() {
    let td = TestDir::new("sw_env");
    let Some(broker) = start_target(Target::Embedded, &td) else { return };
    let (pw, ds) = (format!("pw{}", rand_hex(8)), format!("ds{}", rand_hex(8)));
    let own: [(&str, OsString); 5] = [
        ("MAM_PANE_BACKEND", "fake".into()),
        ("MAM_FAKE_PANES_DIR", td.path("panes").into()),
        ("MQTT_USERNAME", "u".into()),
        ("MQTT_PASSWORD", pw.clone().into()),
        ("MAM_DISPATCH_SECRET", ds.clone().into()),
    ];
    let mut env = agent_in_pane_env(broker.port());
    env.extend(own.map(|(k, v)| (k.to_string(), v)));
    let mam = || {
        let mut c = td.mam();
        for (k, v) in &env {
            c = c.env(k, v);
        }
        c
    };
    let script = td.write("w1.script", "work_s=40\n");
    let r = mam()
        .args(["create", "claude", "--name", "w1", "--no-onboard", "--", "test-double", "agent"])
        .env("MAM_FAKE_AGENT_SCRIPT", &script)
        .run();
    r.expect_rc(0);
    let pane = kv(&r.stdout(), "PANE");
    let agent: i32 =
        fs::read_to_string(td.path("panes/panes").join(&pane).join("pid")).unwrap().trim().parse().unwrap();
    struct Reap(i32, PathBuf);
    impl Drop for Reap {
        fn drop(&mut self) {
            let _ = mam::sys::kill(-self.0, 9);
            for e in fs::read_dir(&self.1).into_iter().flatten().flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(id) = name.strip_suffix(".json") {
                    for pid in timer_pids(id) {
                        let _ = mam::sys::kill(pid, 9);
                    }
                }
            }
        }
    }
    let _reap = Reap(agent, td.ws().join(".mam/jobs"));
    let task = td.write("task.md", "Work for a while.\n");
    let args = ["--heartbeat", "1", "--heartbeat-misses", "5", "--ack-timeout", "10", "--timeout", "60"];
    let mut dj =
        mam().args(["delegate-job", "--session", "w1", "--brief-file"]).args([&task]).args(args).spawn_bg(&td, "dj");
    let reg = td.ws().join(".mam/jobs");
    let id = wait_for("a job record", Duration::from_secs(20), || {
        fs::read_dir(&reg)
            .ok()?
            .flatten()
            .find_map(|e| e.file_name().to_string_lossy().strip_suffix(".json").map(str::to_string))
    });
    let timer = wait_for("the job's heartbeat timer", Duration::from_secs(20), || timer_pids(&id).first().copied());
    let watch = wait_for("the wrapper's watch", Duration::from_secs(10), || {
        mam::sys::list_pids().unwrap_or_default().into_iter().find(|&pid| {
            let args: Vec<String> = mam::sys::proc_cmdline(pid)
                .unwrap_or_default()
                .iter()
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            args.iter().any(|a| a == "watch") && args.windows(2).any(|w| w[0] == "--job-id" && w[1] == id)
        })
    });
    for (what, pid) in [("agent", agent), ("timer", timer), ("watch", watch)] {
        let e = environ(pid);
        assert!(!has_var(&e, "MAM_DISPATCH_SECRET"), "MAM_DISPATCH_SECRET reached the {what} (pid {pid})");
        assert!(!e.iter().any(|v| v.contains(&ds)), "the dispatch secret's value reached the {what}");
    }
    let agent_env = environ(agent);
    assert!(!has_var(&agent_env, "MQTT_PASSWORD"), "MQTT_PASSWORD reached the agent");
    assert!(!agent_env.iter().any(|v| v.contains(&pw)), "the password's value reached the agent");
    assert!(has_var(&environ(watch), "MQTT_PASSWORD"), "watch connects to the broker and keeps the password");
    dj.kill();
}

/// A tmux pane: neither the tmux server nor the pane's shell holds a secret.
#[test]
fn i5_a_tmux_pane_and_its_server_hold_no_secret() {
    if !have_tool("tmux", "MAM_REQUIRE_TMUX") {
        return;
    }
    let td = TestDir::new("sw_tmux");
    let (_, path) = claude_is_mam(&td);
    let sock = format!("mam-test-{}", rand_hex(6));
    struct Kill(String);
    impl Drop for Kill {
        fn drop(&mut self) {
            let p = Command::new("tmux").args(["-L", &self.0, "display-message", "-p", "#{socket_path}"]).output();
            let _ = Command::new("tmux").args(["-L", &self.0, "kill-server"]).output();
            if let Ok(out) = p {
                let p = String::from_utf8_lossy(&out.stdout).trim().to_string();
                if p.ends_with(self.0.as_str()) {
                    let _ = fs::remove_file(p);
                }
            }
        }
    }
    let _kill = Kill(sock.clone());
    let proj = td.path("proj");
    fs::create_dir_all(&proj).unwrap();
    let (pw, ds) = (format!("pw{}", rand_hex(8)), format!("ds{}", rand_hex(8)));
    td.write("agent.script", "work_s=30\n");
    td.mam()
        .args(["pane", "new-session", "--agent", "claude", "--name", "a0", "--cwd", proj.to_str().unwrap()])
        .args(["--", "test-double", "agent"])
        .env("PATH", path)
        .env("MAM_PANE_BACKEND", "tmux")
        .env("MAM_TMUX_SOCKET", &sock)
        .env("MAM_FAKE_AGENT_SCRIPT", td.path("agent.script"))
        .env("MAM_AGENT_START_TIMEOUT_MS", "20000")
        .env("MAM_TMUX_STABLE_MS", "200")
        .env("MQTT_PASSWORD", &pw)
        .env("MAM_DISPATCH_SECRET", &ds)
        .run()
        .expect_rc(0);
    let tm = |args: &[&str]| {
        let out = Command::new("tmux").arg("-L").arg(&sock).args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let server: i32 = tm(&["display-message", "-p", "#{pid}"]).parse().unwrap();
    let panes: Vec<i32> = tm(&["list-panes", "-a", "-F", "#{pane_pid}"]).lines().map(|l| l.parse().unwrap()).collect();
    assert!(!panes.is_empty());
    let global = tm(&["show-environment", "-g"]);
    for (what, env) in
        std::iter::once(("tmux server", environ(server))).chain(panes.iter().map(|&p| ("pane shell", environ(p))))
    {
        for (k, v) in [("MQTT_PASSWORD", &pw), ("MAM_DISPATCH_SECRET", &ds)] {
            assert!(!has_var(&env, k) && !env.iter().any(|e| e.contains(v.as_str())), "{k} reached the {what}");
            assert!(!global.contains(v.as_str()), "{k} is in the server's global environment");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Item 6: a replayed dispatch does not run twice

use std::path::Path;
use std::time::Instant;

use mam::mqtt::Stop;

use crate::watch::World;

/// Dispatch, let a runner run it to completion, stop it; a fresh runner of the same session (new
/// process, its own fresh registry) gets the captured dispatch bytes republished, retained, within
/// the staleness window: the job's command (which leaves one marker line per run) runs once.
#[test]
fn i6_a_captured_dispatch_replayed_to_a_fresh_runner_does_not_run_again() {
    let Some(w) = World::new("sw_replay", Target::Embedded) else { return };
    let session = format!("r{}", rand_hex(4));
    let id = w.register_session(
        &format!("remote:{session}"),
        &["--transport", "remote", "--heartbeat-sec", "1", "--heartbeat-misses", "3", "--ack-timeout", "30"],
    );
    let rec = w.record(&id);
    let topic = format!("{}/dispatch/{}", rec["topic_prefix"].as_str().unwrap(), rec["attempt"]);
    // The attacker's capture: a subscriber on the dispatch topic.
    let ctx = mam::ctx::Ctx::with_env([("MQTT_PORT", w.port.to_string())], Path::new("/"));
    let cfg = mam::mqtt::MqttConfig::from_ctx(&ctx).unwrap();
    let mut spy = mam::mqtt::Client::connect(&cfg, mam::mqtt::Role::Sub, &Stop::never()).unwrap();
    spy.subscribe(std::slice::from_ref(&topic), 1).unwrap();
    w.mam().args(["remote", "dispatch", "--job-id", &id]).run().expect_rc(0);
    let captured = wait_for("the captured dispatch", Duration::from_secs(10), || {
        spy.recv(Instant::now() + Duration::from_millis(200)).ok().flatten().filter(|m| !m.payload.is_empty())
    })
    .payload;
    spy.disconnect();

    let marker = w.td.path("marker");
    let exec = format!("echo run >> '{}'", marker.display());
    let runner = |reg: &str, name: &str| {
        let mut r = w
            .mam()
            .args(["remote", "run", "--session", &session, "--exec", &exec, "--registry-dir"])
            .args([w.td.path(reg)])
            .spawn_bg(&w.td, name);
        r.wait_stdout("subscribed topic=", Duration::from_secs(10));
        r
    };
    let mut first = runner("runner1/jobs", "runner1");
    first.wait_stdout("DONE rc=0", Duration::from_secs(20));
    first.wait_stdout("cleared dispatch", Duration::from_secs(10));
    first.signal(libc::SIGTERM);
    assert_eq!(first.wait(Duration::from_secs(10)).0, 0, "{}", first.stderr());
    assert_eq!(fs::read_to_string(&marker).unwrap().lines().count(), 1);
    for pid in timer_pids(&id) {
        let _ = mam::sys::kill(pid, 9);
    }

    let mut fresh = runner("runner2/jobs", "runner2");
    publish_raw(w.port, &topic, &captured, true);
    wait_until("the fresh runner to judge the replay", Duration::from_secs(20), || {
        let out = fresh.stdout();
        out.contains("DONE rc=") || out.contains("not run again")
    });
    // A run that was started would have written its marker by DONE; give nothing else a chance.
    fresh.signal(libc::SIGTERM);
    assert_eq!(fresh.wait(Duration::from_secs(10)).0, 0, "{}", fresh.stderr());
    for pid in timer_pids(&id) {
        let _ = mam::sys::kill(pid, 9);
    }
    let runs = fs::read_to_string(&marker).unwrap().lines().count();
    assert_eq!(runs, 1, "the replayed dispatch ran again:\n{}", fresh.stdout());
    assert!(fresh.stdout().contains(&format!("dispatch already served job={id} attempt=1")), "{}", fresh.stdout());
}

// ---------------------------------------------------------------------------------------------
// Item 7: a record's broker block cannot weaken the transport the password travels over

use std::io::{Read, Write};
use std::sync::{Arc, Mutex};

/// A plain TCP listener that records every CONNECT it receives and answers CONNACK 5.
struct Capture {
    port: u16,
    bytes: Arc<Mutex<Vec<u8>>>,
    _thread: std::thread::JoinHandle<()>,
}

impl Capture {
    fn start() -> Capture {
        let (l, port) = loopback_listener();
        let bytes = Arc::new(Mutex::new(Vec::new()));
        let b2 = bytes.clone();
        // Serves until the test binary exits; each accept is bounded by the client's own timeout.
        let thread = std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { continue };
                s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                let mut buf = [0u8; 1024];
                if let Ok(n) = s.read(&mut buf) {
                    b2.lock().unwrap().extend_from_slice(&buf[..n]);
                }
                let _ = s.write_all(&[0x20, 2, 0, 5]);
            }
        });
        Capture { port, bytes, _thread: thread }
    }

    fn seen(&self) -> Vec<u8> {
        self.bytes.lock().unwrap().clone()
    }
}

#[test]
fn i7_a_record_that_turns_tls_off_does_not_get_the_password() {
    let td = TestDir::new("sw_tls");
    let cap = Capture::start();
    let port = cap.port.to_string();
    // The record's broker block: plaintext (registered without TLS) on the same host and port.
    let id = register_job(&td, &[("MQTT_PORT", port.clone())], &[]);
    assert_eq!(read_record(&td, &id)["broker"]["tls"], false);
    let pw = format!("pw{}", rand_hex(8));
    let r = td
        .mam()
        .args(["publish", "--job-id", &id, "--event", "started"])
        .env("MQTT_PORT", &port)
        .env("MQTT_TLS", "1")
        .env("MQTT_USERNAME", "u")
        .env("MQTT_PASSWORD", &pw)
        .env("MAM_PUBLISH_BUDGET_S", "2")
        .env("MAM_MQTT_CONNECT_TIMEOUT_S", "2")
        .run();
    let seen = cap.seen();
    assert!(!seen.is_empty(), "no CONNECT reached the listener: {}", r.stderr());
    assert!(
        !seen.windows(pw.len()).any(|w| w == pw.as_bytes()),
        "the password was sent in plaintext to a record's tls=false broker"
    );
    assert!(
        r.stderr().contains("WARNING: broker in record differs from environment (tls); connecting without password"),
        "{}",
        r.stderr()
    );
}

// ---------------------------------------------------------------------------------------------
// Item 8: bounded reads of logs and reports

use serde_json::Value;

/// VmHWM (peak resident set) of a live process, in KiB.
fn vm_hwm_kb(pid: i32) -> Option<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Samples a background process's VmHWM until it exits (or `limit`), returning the peak seen in
/// KiB, its rc and how long it ran.
fn run_sampling(mut p: Background, limit: Duration) -> (u64, i32, Duration, Background) {
    let mut peak = 0;
    let started = p.started;
    let _ = poll(limit, || {
        if let Some(kb) = vm_hwm_kb(p.pid()) {
            peak = peak.max(kb);
        }
        p.exited().then_some(())
    });
    let (rc, at) = p.wait(Duration::from_secs(1));
    (peak, rc, at - started, p)
}

/// A sparse file of `size` zero bytes followed by `tail` (written in well under a second).
fn sparse_with_tail(path: &Path, size: u64, tail: &[u8]) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    let f = fs::OpenOptions::new().create(true).write(true).truncate(true).open(path).unwrap();
    f.set_len(size).unwrap();
    let mut f = fs::OpenOptions::new().append(true).open(path).unwrap();
    f.write_all(b"\n").unwrap();
    f.write_all(tail).unwrap();
}

const BIG: u64 = 300 * 1024 * 1024;
/// Peak RSS allowed to a command reading a 300 MB-1 GB file (it needs a few MiB; the code before
/// the fix needed the whole file).
const RSS_BOUND_KB: u64 = 96 * 1024;

/// A repeated `publish` over a 300 MB events.log (the real lines at its end) reads it from the end:
/// peak RSS stays small. The repeat resends to a silent listener, so the process lives long enough
/// to be sampled.
#[test]
fn i8_a_repeated_publish_does_not_read_the_whole_events_log() {
    let td = TestDir::new("sw_pubbig");
    let silent = FakeBroker::start(Fake::Silent);
    let env = [("MQTT_PORT", silent.port.to_string())];
    let id = register_job(&td, &env, &[]);
    let first = td
        .mam()
        .args(["publish", "--job-id", &id, "--event", "started"])
        .env("MQTT_PORT", silent.port.to_string())
        .env("MAM_PUBLISH_BUDGET_S", "1")
        .env("MAM_MQTT_CONNECT_TIMEOUT_S", "1")
        .run();
    first.expect_rc(3);
    let log = td.ws().join(".mam/jobs").join(&id).join("events.log");
    let lines = fs::read(&log).unwrap();
    sparse_with_tail(&log, BIG, &lines);
    let p = td
        .mam()
        .args(["publish", "--job-id", &id, "--event", "started"])
        .env("MQTT_PORT", silent.port.to_string())
        .env("MAM_PUBLISH_BUDGET_S", "2")
        .env("MAM_MQTT_CONNECT_TIMEOUT_S", "2")
        .spawn_bg(&td, "repeat");
    let (peak, rc, took, p) = run_sampling(p, Duration::from_secs(30));
    assert_eq!(rc, 3, "{}", p.stderr());
    assert!(p.stdout().contains("already running"), "{}", p.stdout());
    eprintln!("i8 publish repeat over {} MB: VmHWM {peak} KiB, {took:?}", BIG >> 20);
    assert!(peak < RSS_BOUND_KB, "publish peaked at {peak} KiB reading a {} MB events.log", BIG >> 20);
}

/// `watch --timeout 2` over a 1 GB events.log ends within its timeout plus a small margin and
/// without reading the log into memory; the real line at the end still counts.
#[test]
fn i8_watch_over_a_huge_events_log_keeps_its_deadline_and_memory() {
    let Some(w) = World::new("sw_watchbig", Target::Embedded) else { return };
    let id = w.register(&["--heartbeat-sec", "1", "--heartbeat-misses", "30", "--ack-timeout", "30"]);
    let e = w.emitter(&id);
    let mut started = e.event(1, "started");
    started.push(b'\n');
    sparse_with_tail(&e.events_log, 1024 * 1024 * 1024, &started);
    let p = w.watch(&id, &["--timeout", "2"]);
    let (peak, rc, took, p) = run_sampling(p, Duration::from_secs(60));
    eprintln!("i8 watch over 1 GB: VmHWM {peak} KiB, rc {rc}, {took:?}");
    assert_eq!(rc, 13, "{}{}", p.stdout(), p.stderr());
    assert!(p.stdout().contains("accepted seq=1 event=started"), "{}", p.stdout());
    assert!(took < Duration::from_secs(4), "watch --timeout 2 took {took:?}");
    assert!(peak < RSS_BOUND_KB, "watch peaked at {peak} KiB over a 1 GB events.log");
}

/// The daemon's polling pass over a job with a 1 GB events.log reads only its end: the pass
/// applies the real `started` at the end, and peak RSS stays small.
#[test]
fn i8_a_daemon_poll_pass_reads_only_the_end_of_a_huge_log() {
    let td = TestDir::new("sw_dmnbig");
    let id = register_job(&td, &[], &[]);
    let rec = read_record(&td, &id);
    let mut started = signed_event(&rec, "started", 1, false);
    started.push(b'\n');
    sparse_with_tail(&td.ws().join(".mam/jobs").join(&id).join("events.log"), 1024 * 1024 * 1024, &started);
    let down = FakeBroker::start(Fake::Close);
    let d = td
        .mam()
        .args(["daemon", "run", "--workspace"])
        .args([td.ws()])
        .args(["--interval", "1"])
        .env("MQTT_PORT", down.port.to_string())
        .spawn_bg(&td, "daemon");
    let mut peak = 0;
    wait_until("a poll pass to mark the job running", Duration::from_secs(30), || {
        peak = peak.max(vm_hwm_kb(d.pid()).unwrap_or(0));
        read_record(&td, &id)["status"] == "running"
    });
    wait_until("the pass to end", Duration::from_secs(10), || {
        peak = peak.max(vm_hwm_kb(d.pid()).unwrap_or(0));
        d.stdout().contains("poll pass done") || d.stderr().contains("poll pass done")
    });
    eprintln!("i8 daemon pass over 1 GB: VmHWM {peak} KiB");
    d.signal(libc::SIGTERM);
    assert!(peak < RSS_BOUND_KB, "the daemon peaked at {peak} KiB polling a 1 GB events.log");
}

/// A job that leaves a 300 MB report: the runner reads only its tail, says it was truncated, and
/// keeps the trailing VERDICT line.
#[test]
fn i8_the_runner_reads_only_the_tail_of_a_huge_report() {
    let Some(w) = World::new("sw_report", Target::Embedded) else { return };
    let session = format!("r{}", rand_hex(4));
    let id = w.register_session(
        &format!("remote:{session}"),
        &["--transport", "remote", "--heartbeat-sec", "1", "--heartbeat-misses", "3", "--ack-timeout", "30"],
    );
    let exec = r#"truncate -s 300M "$MAM_REPORT_FILE" && echo "VERDICT: ok" >> "$MAM_REPORT_FILE""#;
    let reg = w.td.path("runner/jobs");
    let r = w
        .mam()
        .args(["remote", "run", "--session", &session, "--exec", exec, "--registry-dir"])
        .args([&reg])
        .spawn_bg(&w.td, "runner");
    let mut peak = 0;
    let sample = |peak: &mut u64| *peak = (*peak).max(vm_hwm_kb(r.pid()).unwrap_or(0));
    wait_until("the runner to subscribe", Duration::from_secs(10), || {
        sample(&mut peak);
        r.stdout().contains("subscribed topic=")
    });
    w.mam().args(["remote", "dispatch", "--job-id", &id]).run().expect_rc(0);
    wait_until("the job to end", Duration::from_secs(60), || {
        sample(&mut peak);
        r.stdout().contains("DONE rc=")
    });
    sample(&mut peak);
    r.signal(libc::SIGTERM);
    for pid in timer_pids(&id) {
        let _ = mam::sys::kill(pid, 9);
    }
    eprintln!("i8 runner with a 300 MB report: VmHWM {peak} KiB");
    assert!(r.stdout().contains("DONE rc=0"), "{}{}", r.stdout(), r.stderr());
    assert!(peak < RSS_BOUND_KB, "the runner peaked at {peak} KiB reading a 300 MB report");
    let events = fs::read_to_string(reg.join(&id).join("events.log")).unwrap();
    let done: Value = events
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|e| e["event"] == "completed")
        .expect("a completed event");
    assert!(done["data"]["report"].as_str().unwrap().ends_with("VERDICT: ok\n"));
    assert!(
        done["data"]["report_truncated"].as_u64().unwrap() > 299 * 1024 * 1024,
        "{}",
        done["data"]["report_truncated"]
    );
}

// ---------------------------------------------------------------------------------------------
// Item 9: a flood of forged events writes a bounded audit

use mam::mqtt::Message;
use serde_json::json;

#[test]
fn i9_a_flood_of_forged_events_grows_the_audit_by_a_bounded_amount() {
    let Some(w) = World::new("sw_flood", Target::Embedded) else { return };
    let id = w.register(&["--heartbeat-sec", "1", "--heartbeat-misses", "60", "--ack-timeout", "60"]);
    let mut watch = w.watch_subscribed(&id, &["--timeout", "120"]);
    let e = w.emitter(&id);
    let topic = format!("{}/events", e.prefix);
    const N: u64 = 20_000;
    let mut c = e.client();
    for seq in 1..=N {
        let forged = e.event_as(seq, "progress", json!({}), e.attempt, &e.token, "not-the-auth-token");
        c.publish(&Message::new(topic.clone(), forged, 0, false)).unwrap();
    }
    // The last forgery went out at QoS 1: once it is acknowledged, the broker has routed them all.
    let last = e.event_as(N + 1, "progress", json!({}), e.attempt, &e.token, "not-the-auth-token");
    c.publish(&Message::new(topic.clone(), last, 1, false)).unwrap();
    c.disconnect();
    // A real event is still accepted after the flood.
    e.send_event(&e.event(1, "started"));
    watch.wait_stdout("accepted seq=1 event=started", Duration::from_secs(60));
    let audit = w.logs().join(&id).join("audit.jsonl");
    let dropped = w.audit_of(&id, "dropped").len();
    let size = fs::metadata(&audit).map(|m| m.len()).unwrap_or(0);
    eprintln!("i9 {N} forged events: {dropped} dropped audit lines, audit.jsonl {size} bytes");
    assert!(dropped >= 1, "the first forgeries are audited");
    assert!(dropped <= 40, "{dropped} dropped lines for {N} forgeries");
    assert!(size < 64 * 1024, "audit.jsonl grew to {size} bytes");
    let sublog = fs::metadata(w.logs().join(&id).join("subscriber.log")).map(|m| m.len()).unwrap_or(0);
    assert!(sublog < 64 * 1024, "subscriber.log grew to {sublog} bytes");
    // Ending the watch writes the summary of what was not audited one by one.
    watch.signal(libc::SIGTERM);
    watch.wait(Duration::from_secs(5));
    let summary = w.audit_of(&id, "dropped_summary");
    assert_eq!(summary.len(), 1, "{summary:?}");
    assert!(summary[0]["more"].as_u64().unwrap() > N / 2, "{summary:?}");
}

// ---------------------------------------------------------------------------------------------
// Item 10, second half: wire text reaches log lines as one escaped line

/// A dispatch topic with a newline and ESC in the runner's log, and a signed state whose status
/// carries a newline, ESC and a fake `result` line in watch's subscriber.log: each is one line, the
/// control characters escaped.
#[test]
fn i10_topics_and_statuses_are_logged_as_one_escaped_line() {
    let Some(w) = World::new("sw_oneline", Target::Embedded) else { return };
    let session = format!("r{}", rand_hex(4));
    let mut r = w
        .mam()
        .args(["remote", "run", "--session", &session, "--exec", "true", "--registry-dir"])
        .args([w.td.path("runner/jobs")])
        .spawn_bg(&w.td, "runner");
    r.wait_stdout("subscribed topic=", Duration::from_secs(10));
    let evil = "mam/jobs/x\n2026-01-01T00:00:00Z DONE rc=0 \u{1b}[2K/dispatch/1";
    let forged = json!({"v": 1, "kind": "dispatch", "sig": "00"}).to_string();
    publish_raw(w.port, evil, forged.as_bytes(), false);
    r.wait_stdout("dropped: bad signature", Duration::from_secs(10));
    let out = r.stdout();
    assert!(!out.contains('\u{1b}'), "ESC reached the runner log:\n{out:?}");
    assert!(!out.lines().any(|l| l.starts_with("2026-01-01T00:00:00Z DONE")), "a forged line in the log:\n{out}");
    assert!(out.contains("topic=mam/jobs/x\\n2026-01-01T00:00:00Z DONE rc=0 \\u{1b}[2K/dispatch/1"), "{out}");
    r.signal(libc::SIGTERM);

    let id = w.register(&["--heartbeat-sec", "1", "--heartbeat-misses", "30", "--ack-timeout", "30"]);
    let mut watch = w.watch_subscribed(&id, &["--timeout", "30"]);
    let e = w.emitter(&id);
    let token8 = &e.token[..8];
    let status = format!("running\n2026-01-01T00:00:00.000Z attempt=1 token={token8} result completed\u{1b}[2K");
    e.send_state(&e.state(1, &status));
    watch.wait_stdout("accepted-state seq=1", Duration::from_secs(10));
    watch.signal(libc::SIGTERM);
    watch.wait(Duration::from_secs(5));
    let log = fs::read_to_string(w.logs().join(&id).join("subscriber.log")).unwrap();
    for text in [log.as_str(), watch.stdout().as_str()] {
        assert!(!text.contains('\u{1b}'), "ESC reached a watch line:\n{text:?}");
        assert!(!text.lines().any(|l| l.starts_with("2026-01-01T00:00:00.000Z")), "a forged line:\n{text}");
        assert!(text.contains("status=running\\n2026-01-01T00:00:00.000Z attempt=1"), "{text}");
    }
}
