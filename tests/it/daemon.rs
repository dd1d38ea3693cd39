//! The workspace subscriber daemon (CORE 10, A3, A15, A19, A20): D1-D8, the A15 closes, `mam reconcile
//! --subscribe` and the reconcile.sh shim. Every test ends with the leak guard of CORE 10.3: no
//! `daemon run --workspace <test root>` is alive (checked with the selector under test); a guard kills
//! any survivor on drop.

use std::fs;
use std::io::Write;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mam::daemon::select_daemons;
use serde_json::Value;

use crate::support::*;

/// CORE 10.3 leak guard for one workspace root.
struct LeakGuard {
    roots: Vec<PathBuf>,
}

impl LeakGuard {
    fn new(roots: &[PathBuf]) -> LeakGuard {
        LeakGuard { roots: roots.to_vec() }
    }

    /// Fails if a daemon for any root is still alive once the test is done (after a short grace for
    /// daemons that are exiting).
    fn finish(self) {
        let alive = || -> Vec<i32> { self.roots.iter().flat_map(|r| select_daemons(r)).collect() };
        if poll(Duration::from_secs(3), || alive().is_empty().then_some(())).is_none() {
            panic!("leaked daemons {:?} for {:?}", alive(), self.roots);
        }
    }
}

impl Drop for LeakGuard {
    fn drop(&mut self) {
        for r in &self.roots {
            for pid in select_daemons(r) {
                let _ = mam::sys::kill(pid, libc::SIGKILL);
            }
        }
    }
}

/// A `mam daemon run` child with its output in a file; killed and reaped on drop.
struct Daemon {
    child: Option<Child>,
    log: PathBuf,
    status: Option<ExitStatus>,
}

impl Daemon {
    fn spawn(cmd: Cmd, log: PathBuf) -> Daemon {
        let out = fs::File::create(&log).unwrap();
        let mut c = cmd.cmd;
        c.stdout(out.try_clone().unwrap()).stderr(out);
        Daemon { child: Some(c.spawn().expect("spawn mam daemon run")), log, status: None }
    }

    fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    fn text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn wait_log(&self, needle: &str, limit: Duration) {
        if poll(limit, || self.text().contains(needle).then_some(())).is_none() {
            panic!("timed out after {limit:?} waiting for {needle:?} in the daemon log:\n{}", self.text());
        }
    }

    fn signal(&self, sig: i32) {
        mam::sys::kill(self.pid(), sig).unwrap();
    }

    /// Waits for the exit; panics after `limit`. Returns the status and how long it took.
    fn wait_exit(&mut self, limit: Duration) -> (ExitStatus, Duration) {
        let started = Instant::now();
        let Some(st) = exit_within(self.child.as_mut().unwrap(), limit) else {
            panic!("daemon did not exit within {limit:?}:\n{}", self.text());
        };
        self.status = Some(st);
        (st, started.elapsed())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            if self.status.is_none() {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
    }
}

/// `mam daemon run --workspace <ws>` with the harness env plus `env`.
fn daemon_cmd(td: &TestDir, ws: &Path, env: &[(&str, String)], extra: &[&str]) -> Cmd {
    let mut cmd = td.mam().args(["daemon", "run", "--workspace"]).args([ws]).args(extra);
    for (k, v) in env {
        cmd = cmd.env(k, v);
    }
    cmd
}

fn start_daemon(td: &TestDir, env: &[(&str, String)], extra: &[&str], name: &str) -> Daemon {
    Daemon::spawn(daemon_cmd(td, &td.ws(), env, extra), td.path(&format!("{name}.log")))
}

/// Broker env for a test: the port and a random topic root, so no two tests share topics.
fn broker_env(port: u16) -> Vec<(&'static str, String)> {
    vec![("MQTT_PORT", port.to_string()), ("MQTT_TOPIC_ROOT", format!("t{}", rand_hex(4)))]
}

fn status_of(td: &TestDir, id: &str) -> String {
    read_record(td, id)["status"].as_str().unwrap_or("").to_string()
}

fn wait_status(td: &TestDir, id: &str, want: &str, limit: Duration) {
    wait_until(&format!("job {id} to become {want}"), limit, || status_of(td, id) == want);
}

fn audit_lines(td: &TestDir, id: &str) -> Vec<Value> {
    let p = td.ws().join(".mam/delegate_job_logs").join(id).join("audit.jsonl");
    fs::read_to_string(p).unwrap_or_default().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// The prologue most tests share: a test directory whose workspace the leak guard watches and, unless
/// `bare`, a broker with the env that names it (`broker_env`: its port and a fresh topic root).
struct Fx {
    td: TestDir,
    guard: LeakGuard,
    broker: Option<Broker>,
    /// The env every daemon and `mam` command of the test gets (empty when `bare`).
    env: Vec<(&'static str, String)>,
}

impl Fx {
    /// No broker: the test brings its own (or a down one).
    fn bare(name: &str) -> Fx {
        let td = TestDir::new(name);
        let guard = LeakGuard::new(&[td.ws()]);
        Fx { td, guard, broker: None, env: Vec::new() }
    }

    /// With a broker of target `t`; `None` (skipped) when that target is not installed.
    fn on(name: &str, t: Target) -> Option<Fx> {
        let mut fx = Fx::bare(name);
        let broker = start_target(t, &fx.td)?;
        fx.env = broker_env(broker.port());
        fx.broker = Some(broker);
        Some(fx)
    }

    /// With the embedded broker.
    fn embedded(name: &str) -> Fx {
        Fx::on(name, Target::Embedded).unwrap()
    }

    fn port(&self) -> u16 {
        self.broker.as_ref().expect("a broker").port()
    }

    /// The test's topic root (`MQTT_TOPIC_ROOT`).
    fn root(&self) -> String {
        self.env.iter().find(|(k, _)| *k == "MQTT_TOPIC_ROOT").expect("a topic root").1.clone()
    }

    /// A `mam` command with the test's env.
    fn mam(&self) -> Cmd {
        let mut c = self.td.mam();
        for (k, v) in &self.env {
            c = c.env(k, v);
        }
        c
    }

    /// `mam daemon ensure` with the test's env and the opt-out lifted.
    fn ensure(&self) -> Cmd {
        self.mam().env_remove("MAM_NO_SUBSCRIBER_DAEMON").args(["daemon", "ensure"])
    }

    /// `mam daemon run` for the control root with the test's env.
    fn daemon(&self, extra: &[&str], name: &str) -> Daemon {
        start_daemon(&self.td, &self.env, extra, name)
    }

    /// `daemon`, once it has subscribed.
    fn subscribed(&self, extra: &[&str], name: &str) -> Daemon {
        let d = self.daemon(extra, name);
        d.wait_log("subscribed ", Duration::from_secs(10));
        d
    }

    /// Registers a job with the test's env (so its broker block names the test's broker).
    fn register(&self, extra: &[&str]) -> String {
        register_job(&self.td, &self.env, extra)
    }

    /// Publishes `payload` on `<topic root>/jobs/<id>/<leaf>` through the test's broker.
    fn publish(&self, id: &str, leaf: &str, payload: &[u8], retain: bool) {
        publish_raw(self.port(), &format!("{}/jobs/{id}/{leaf}", self.root()), payload, retain);
    }

    fn record(&self, id: &str) -> Value {
        read_record(&self.td, id)
    }

    fn status(&self, id: &str) -> String {
        status_of(&self.td, id)
    }

    fn wait_status(&self, id: &str, want: &str, limit: Duration) {
        wait_status(&self.td, id, want, limit);
    }

    fn audit(&self, id: &str) -> Vec<Value> {
        audit_lines(&self.td, id)
    }

    /// The CORE 10.3 leak check (the broker stays up until it is done).
    fn finish(self) {
        self.guard.finish();
    }
}

#[test]
fn d1_second_run_is_rc5_and_ensure_prints_the_first_pid() {
    for &t in TARGETS {
        let Some(fx) = Fx::on("d1", t) else { continue };
        let td = &fx.td;
        let mut first = fx.subscribed(&[], "first");
        let pid = first.pid();

        // The lock file names the holder (A20), written in place.
        let info: Value = serde_json::from_slice(&fs::read(td.ws().join(".mam/monitor.lock")).unwrap()).unwrap();
        assert_eq!(info["pid"], pid, "{t:?}");
        assert_eq!(info["workspace"], td.ws().to_str().unwrap());
        assert!(info["started_at"].as_str().is_some_and(|s| s.ends_with('Z')));

        let mut second = daemon_cmd(td, &td.ws(), &fx.env, &[]);
        second = second.env("MQTT_PORT", fx.port().to_string());
        let r = second.run();
        r.expect_rc(5);
        eqnice!(format!("ERROR: daemon already running (pid {pid})\n"), r.stderr());

        let r = td
            .mam()
            .env_remove("MAM_NO_SUBSCRIBER_DAEMON")
            .args(["daemon", "ensure", "--workspace"])
            .args([td.ws()])
            .run();
        r.expect_rc(0);
        assert_eq!(r.stdout(), format!("{pid}\n"), "{t:?}: {}", r.stderr());
        let r = td.mam().args(["daemon", "status", "--workspace"]).args([td.ws()]).run();
        r.expect_rc(0);
        assert_eq!(r.stdout(), format!("{pid}\n"));
        assert_eq!(select_daemons(&td.ws()), vec![pid]);

        let r = td.mam().args(["daemon", "stop", "--workspace"]).args([td.ws()]).run();
        r.expect_rc(0);
        assert_eq!(r.stdout(), format!("stopped daemon {pid}\n"));
        let (st, _) = first.wait_exit(Duration::from_secs(5));
        assert_eq!(st.code(), Some(0), "{}", first.text());
        assert!(first.text().contains("daemon: received SIGTERM; stopping"), "{}", first.text());
        let r = td.mam().args(["daemon", "status", "--workspace"]).args([td.ws()]).run();
        r.expect_rc(0);
        assert_eq!(r.stdout(), "");
        fx.finish();
    }
}

#[test]
fn d1_ensure_starts_one_detached_daemon_with_absolute_paths() {
    let fx = Fx::embedded("d1e");
    let td = &fx.td;
    let ensure = || fx.ensure().env("MAM_JOBS_DIR", "rel/jobs").run();
    let r = ensure();
    r.expect_rc(0);
    let pid: i32 = r.stdout().trim().parse().unwrap_or_else(|_| panic!("no pid: {r:?}"));
    assert_eq!(select_daemons(&td.ws()), vec![pid]);
    // A19: the registry (relative MAM_JOBS_DIR, against the workspace) and log root reach `run` absolute.
    let argv = mam::sys::proc_cmdline(pid).unwrap();
    let argv: Vec<String> = argv.iter().map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    let reg = td.ws().join("rel/jobs");
    let logs = td.ws().join("rel/delegate_job_logs");
    let ws = td.ws();
    let want = ["daemon", "run", "--workspace", ws.to_str().unwrap(), "--registry-dir", reg.to_str().unwrap()];
    assert_eq!(&argv[1..7], &want, "{argv:?}");
    assert_eq!(&argv[7..9], &["--logs-dir", logs.to_str().unwrap()], "{argv:?}");
    // Detached: its own session, output appended to monitor.log.
    let sid = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = sid.rsplit(')').next().unwrap().split_whitespace().collect();
    assert_eq!(fields[3], pid.to_string(), "session id is the daemon's own pid");
    wait_until("monitor.log to show the subscription", Duration::from_secs(10), || {
        fs::read_to_string(td.ws().join(".mam/monitor.log")).unwrap_or_default().contains("subscribed ")
    });
    // A second ensure reuses it.
    let r = ensure();
    r.expect_rc(0);
    assert_eq!(r.stdout(), format!("{pid}\n"));
    assert_eq!(select_daemons(&td.ws()), vec![pid]);
    let r = td.mam().args(["daemon", "stop"]).run();
    r.expect_rc(0);
    assert_eq!(r.stdout(), format!("stopped daemon {pid}\n"));
    let log = fs::read_to_string(td.ws().join(".mam/monitor.log")).unwrap();
    assert!(log.contains("daemon: received SIGTERM; stopping"), "{log}");
    // Nothing to stop any more: a note, rc 0.
    let r = td.mam().args(["daemon", "stop"]).run();
    r.expect_rc(0);
    assert!(r.stderr().starts_with("NOTE: no daemon running"), "{}", r.stderr());
    fx.finish();
}

#[test]
fn d2_deleting_the_workspace_ends_the_daemon_within_2s() {
    let td = TestDir::new("d2");
    let ws = td.path("gone/ws");
    fs::create_dir_all(ws.join(".mam")).unwrap();
    let guard = LeakGuard::new(std::slice::from_ref(&ws));
    let broker = start_target(Target::Embedded, &td).unwrap();
    let mut d = Daemon::spawn(daemon_cmd(&td, &ws, &broker_env(broker.port()), &[]), td.path("d2.log"));
    d.wait_log("subscribed ", Duration::from_secs(10));
    fs::remove_dir_all(td.path("gone")).unwrap();
    let (st, took) = d.wait_exit(Duration::from_secs(5));
    assert_eq!(st.code(), Some(0), "{}", d.text());
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert!(d.text().contains("daemon: workspace gone"), "{}", d.text());
    guard.finish();
}

#[test]
fn d3_replacing_monitor_lock_ends_the_daemon_within_2s() {
    let fx = Fx::embedded("d3");
    let td = &fx.td;
    let mut d = fx.subscribed(&[], "d3");
    let lock = td.ws().join(".mam/monitor.lock");
    let fresh = td.ws().join(".mam/monitor.lock.new");
    fs::write(&fresh, b"{}").unwrap();
    fs::rename(&fresh, &lock).unwrap();
    let (st, took) = d.wait_exit(Duration::from_secs(5));
    assert_eq!(st.code(), Some(0), "{}", d.text());
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert!(d.text().contains("daemon: monitor.lock replaced"), "{}", d.text());
    fx.finish();
}

#[test]
fn d4_sigterm_against_a_silent_listener_is_clean_and_never_polls() {
    let mut fx = Fx::bare("d4");
    let silent = FakeBroker::start(Fake::Silent);
    fx.env = broker_env(silent.port);
    let mut d = fx.daemon(&[], "d4");
    // The daemon is in its CONNACK wait once its connection is accepted (and never answered).
    if poll(Duration::from_secs(10), || (silent.accepts() > 0).then_some(())).is_none() {
        panic!("the daemon never connected:\n{}", d.text());
    }
    d.signal(libc::SIGTERM);
    let (st, took) = d.wait_exit(Duration::from_secs(5));
    assert_eq!(st.code(), Some(0), "{}", d.text());
    assert!(took < Duration::from_secs(1), "{took:?}");
    let text = d.text();
    assert!(text.contains("daemon: received SIGTERM; stopping"), "{text}");
    assert!(!text.contains("polling") && !text.contains("poll pass"), "fell back to polling:\n{text}");
    fx.finish();
}

#[test]
fn d5_sigterm_during_a_pass_lets_the_pass_finish() {
    let fx = Fx::bare("d5");
    let td = &fx.td;
    let ids: Vec<String> = (0..2).map(|_| register_job(td, &[], &[])).collect();
    for id in &ids {
        let rec = read_record(td, id);
        append_events_log(td, id, &signed_event(&rec, "started", 1, false));
    }
    // Hold the registry lock L1: the pass blocks inside its first engine request.
    let l1 =
        mam::sys::Flock::lock_path(&td.ws().join(".mam/jobs/.registry.lock"), mam::sys::LockMode::Exclusive).unwrap();
    let down = FakeBroker::start(Fake::Close); // a broker that is down
    let mut d = start_daemon(td, &[("MQTT_PORT", down.port.to_string())], &["--interval", "1"], "d5");
    d.wait_log("poll pass: 2 open job(s)", Duration::from_secs(15));
    d.signal(libc::SIGTERM);
    // The signal is noted, the pass is still blocked: nothing has been mirrored yet.
    assert!(ids.iter().all(|id| status_of(td, id) == "pending"));
    drop(l1);
    let (st, _) = d.wait_exit(Duration::from_secs(5));
    assert_eq!(st.code(), Some(0), "{}", d.text());
    for id in &ids {
        assert_eq!(status_of(td, id), "running", "{id}: the pass did not finish\n{}", d.text());
    }
    let text = d.text();
    let done = text.find("poll pass done").expect("pass done line");
    let sig = text.find("daemon: received SIGTERM; stopping").expect("signal line");
    assert!(done < sig, "{text}");
    assert_eq!(text.matches("poll pass:").count(), 1, "a second pass ran after the signal:\n{text}");
    fx.finish();
}

#[test]
fn d5_polling_applies_started_and_terminal_lines_of_the_current_attempt_only() {
    let fx = Fx::bare("d5p");
    let td = &fx.td;
    let a = register_job(td, &[], &[]);
    let b = register_job(td, &[], &[]);
    let rec_a = read_record(td, &a);
    append_events_log(td, &a, &signed_event(&rec_a, "started", 1, false));
    append_events_log(td, &a, &signed_event(&rec_a, "completed", 2, false));
    // b: a started line with a foreign token and one with a bad signature do not count.
    let rec_b = read_record(td, &b);
    let mut foreign = rec_b.clone();
    foreign["dispatch_token"] = Value::from("0".repeat(32));
    append_events_log(td, &b, &signed_event(&foreign, "started", 1, false));
    let mut forged = rec_b.clone();
    forged["auth_token"] = Value::from("f".repeat(64));
    append_events_log(td, &b, &signed_event(&forged, "started", 2, false));
    let down = FakeBroker::start(Fake::Close); // a broker that is down
    let mut d = start_daemon(td, &[("MQTT_PORT", down.port.to_string())], &["--interval", "1"], "d5p");
    wait_status(td, &a, "completed", Duration::from_secs(15));
    d.wait_log("poll pass done", Duration::from_secs(5));
    assert_eq!(status_of(td, &b), "pending", "{}", d.text());
    // Evidence arriving later is picked up by a later pass.
    append_events_log(td, &b, &signed_event(&rec_b, "started", 3, false));
    wait_status(td, &b, "running", Duration::from_secs(5));
    d.signal(libc::SIGINT);
    let (st, _) = d.wait_exit(Duration::from_secs(5));
    assert_eq!(st.code(), Some(0));
    assert!(d.text().contains("daemon: received SIGINT; stopping"), "{}", d.text());
    fx.finish();
}

#[test]
fn d6_opt_out_spawns_nothing_and_reports_a_running_daemon() {
    let fx = Fx::bare("d6");
    let td = &fx.td;
    let before = tree(&td.ws());
    let r = td.mam().args(["daemon", "ensure"]).run(); // the harness sets MAM_NO_SUBSCRIBER_DAEMON=1
    r.expect_rc(0);
    assert_eq!(r.stdout(), "");
    eqnice!("NOTE: subscriber daemon disabled (MAM_NO_SUBSCRIBER_DAEMON=1)\n", r.stderr());
    assert!(select_daemons(&td.ws()).is_empty());
    assert_eq!(tree(&td.ws()), before, "ensure under the opt-out wrote files");

    let broker = start_target(Target::Embedded, td).unwrap();
    let d = start_daemon(td, &broker_env(broker.port()), &[], "d6");
    d.wait_log("subscribed ", Duration::from_secs(10));
    let r = td.mam().args(["daemon", "ensure"]).run();
    r.expect_rc(0);
    assert_eq!(r.stdout(), format!("{}\n", d.pid()));
    eqnice!("NOTE: subscriber daemon disabled (MAM_NO_SUBSCRIBER_DAEMON=1)\n", r.stderr());
    assert_eq!(select_daemons(&td.ws()), vec![d.pid()]);
    drop(d);

    // Only the literal 1 opts out.
    let r = td
        .mam()
        .env("MAM_NO_SUBSCRIBER_DAEMON", "true")
        .env("MQTT_PORT", broker.port().to_string())
        .args(["daemon", "ensure"])
        .run();
    r.expect_rc(0);
    let pid: i32 = r.stdout().trim().parse().unwrap();
    assert_eq!(select_daemons(&td.ws()), vec![pid]);
    td.mam().args(["daemon", "stop"]).run().expect_rc(0);
    fx.finish();
}

#[test]
fn d7_selector_finds_a_spaced_root_and_nothing_else() {
    let td = TestDir::new("d7");
    let root = td.path("a b/ws");
    let sibling = td.path("a b/ws-other");
    for r in [&root, &sibling] {
        fs::create_dir_all(r.join(".mam")).unwrap();
    }
    let guard = LeakGuard::new(&[root.clone(), sibling.clone()]);
    let broker = start_target(Target::Embedded, &td).unwrap();
    let env = broker_env(broker.port());
    let d = Daemon::spawn(daemon_cmd(&td, &root, &env, &[]), td.path("d7.log"));
    let other = Daemon::spawn(daemon_cmd(&td, &sibling, &env, &[]), td.path("d7-other.log"));
    // A wrapper that quotes the words inside one argv element.
    let quoted = format!("sleep 30; : {} daemon run --workspace {}", mam_bin().display(), root.display());
    // In its own process group, so its `sleep` child dies with it (also when an assertion fails).
    struct Group(Child);
    impl Drop for Group {
        fn drop(&mut self) {
            let _ = mam::sys::kill(-(self.0.id() as i32), libc::SIGKILL);
            let _ = self.0.wait();
        }
    }
    let wrapper = {
        use std::os::unix::process::CommandExt;
        Group(Command::new("bash").args(["-c", &quoted]).stdin(Stdio::null()).process_group(0).spawn().unwrap())
    };
    d.wait_log("subscribed ", Duration::from_secs(10));
    other.wait_log("subscribed ", Duration::from_secs(10));
    wait_until("the wrapper's argv", Duration::from_secs(5), || {
        mam::sys::proc_cmdline(wrapper.0.id() as i32).is_ok_and(|a| a.len() == 3)
    });
    assert_eq!(select_daemons(&root), vec![d.pid()]);
    assert_eq!(select_daemons(&sibling), vec![other.pid()]);
    assert!(select_daemons(&td.path("a b")).is_empty());
    drop(wrapper);
    drop(d);
    drop(other);
    guard.finish();
}

#[test]
fn d8_wire_events_move_the_record_to_running_then_completed() {
    for &t in TARGETS {
        let Some(fx) = Fx::on("d8", t) else { continue };
        let id = fx.register(&[]);
        // A second job closed on the wire before the daemon started: the retained state is mirrored.
        let early = fx.register(&[]);
        fx.publish(&early, "state", &signed_state(&fx.record(&early), "failed", 4), true);

        let d = fx.subscribed(&[], "d8");
        fx.wait_status(&early, "failed", Duration::from_secs(5));

        let rec = fx.record(&id);
        // Noise first: a forged event and an event for a job this workspace does not have.
        let mut forged = rec.clone();
        forged["auth_token"] = Value::from("e".repeat(64));
        fx.publish(&id, "events", &signed_event(&forged, "started", 1, false), false);
        let mut stranger = rec.clone();
        stranger["job_id"] = Value::from("zz-not-here");
        fx.publish("zz-not-here", "events", &signed_event(&stranger, "started", 1, false), false);

        fx.publish(&id, "events", &signed_event(&rec, "started", 1, false), false);
        fx.wait_status(&id, "running", Duration::from_secs(5));
        let r = fx.record(&id);
        assert!(r["claimed_at"].is_string());
        fx.publish(&id, "events", &signed_event(&rec, "completed", 2, false), false);
        fx.wait_status(&id, "completed", Duration::from_secs(5));
        // The audit is flushed just after the record write.
        wait_until("the terminal transition in the audit", Duration::from_secs(5), || {
            fx.audit(&id).iter().any(|e| e["request"] == "terminal")
        });

        let audit = fx.audit(&id);
        let dropped: Vec<&Value> = audit.iter().filter(|e| e["kind"] == "dropped").collect();
        assert_eq!(dropped.len(), 1, "{audit:?}");
        assert_eq!(dropped[0]["reason"], "bad_sig");
        let transitions: Vec<(&str, &str)> = audit
            .iter()
            .filter(|e| e["kind"] == "transition")
            .map(|e| (e["request"].as_str().unwrap(), e["to"].as_str().unwrap()))
            .collect();
        assert_eq!(transitions, [("claim", "running"), ("terminal", "completed")], "{audit:?}");
        assert!(!fx.td.ws().join(".mam/jobs/zz-not-here.json").exists());
        drop(d);
        fx.finish();
    }
}

#[test]
fn d8_a_late_conflicting_event_is_refused_and_audited() {
    let fx = Fx::embedded("d8r");
    let id = fx.register(&[]);
    fx.td.mam().args(["registry", "status", &id, "--set", "cancelled", "--no-publish"]).run().expect_rc(0);
    let d = fx.subscribed(&[], "d8r");
    fx.publish(&id, "events", &signed_event(&fx.record(&id), "completed", 1, false), false);
    wait_until("the refusal in the audit", Duration::from_secs(5), || {
        fx.audit(&id).iter().any(|e| e["kind"] == "refused" && e["reason"] == "conflicting_terminal")
    });
    assert_eq!(fx.status(&id), "cancelled");
    drop(d);
    fx.finish();
}

#[test]
fn a15_abandoned_jobs_are_closed_and_watched_ones_are_not() {
    let mut fx = Fx::embedded("a15");
    let td = &fx.td;
    // A dead pid: a child that has exited and been reaped.
    let mut gone = Command::new("true").spawn().unwrap();
    let dead = gone.id();
    gone.wait().unwrap();
    let me = std::process::id();

    // Onboarding-like: a deadline of 1 s, the wrapper that recorded itself is dead.
    let onboard = fx.register(&["--timeout", "1"]);
    td.mam().args(["registry", "set-meta", &onboard, &format!("watcher_pid:={dead}")]).run().expect_rc(0);
    // Same deadline, but its watcher (this test process) is alive: left to the watcher.
    let watched = fx.register(&["--timeout", "1", "--idle-timeout", "1"]);
    td.mam().args(["registry", "set-meta", &watched, &format!("watcher_pid:={me}")]).run().expect_rc(0);
    // Silent: started, then nothing; idle 1 s and no watcher at all.
    let silent = fx.register(&["--idle-timeout", "1"]);
    let store = mam::registry::store::Store::new(td.ws().join(".mam/jobs"), td.ws().join(".mam/delegate_job_logs"));
    let rec = fx.record(&silent);
    let mut claim = mam::registry::engine::Request::new(
        mam::registry::engine::Kind::Claim,
        mam::registry::engine::Authority::Agent,
        &silent,
    );
    claim.attempt = rec["attempt"].as_u64();
    claim.dispatch_token = rec["dispatch_token"].as_str().map(String::from);
    store.apply(&claim, mam::clock::now_ms()).unwrap();
    let claimed = Instant::now();

    fx.env.push(("MAM_DAEMON_SWEEP_S", "1".into()));
    let d = fx.daemon(&[], "a15");
    fx.wait_status(&onboard, "deadline_timeout", Duration::from_secs(10));
    assert_eq!(fx.record(&onboard)["reason"], "deadline");
    fx.wait_status(&silent, "deadline_timeout", Duration::from_secs(15));
    let took = claimed.elapsed();
    assert_eq!(fx.record(&silent)["reason"], "unresponsive");
    assert!(took >= Duration::from_secs(6), "closed before idle + 5 s: {took:?}");
    // The watched job stays the watcher's business.
    assert_eq!(fx.status(&watched), "pending", "{}", d.text());
    // Closed with operator authority, through the engine.
    wait_until("the operator close in the audit", Duration::from_secs(5), || {
        fx.audit(&silent)
            .iter()
            .any(|e| e["kind"] == "transition" && e["request"] == "set" && e["reason"] == "unresponsive")
    });
    // A4: the close is announced as a signed retained state with a fresh seq.
    let Some(Broker::Embedded(handle)) = &fx.broker else { unreachable!() };
    let closed = fx.record(&silent);
    let topic = format!("{}/state", closed["topic_prefix"].as_str().unwrap());
    wait_until("the retained close state", Duration::from_secs(5), || handle.retained(&topic).is_some());
    let state: Value = serde_json::from_slice(&handle.retained(&topic).unwrap()).unwrap();
    assert_eq!(state["status"], "deadline_timeout");
    assert_eq!(state["last_event"], "closed");
    assert_eq!(state["seq"], closed["last_seq"]);
    assert!(mam::sign::verify(closed["auth_token"].as_str().unwrap().as_bytes(), &state));
    drop(d);
    fx.finish();
}

#[test]
fn idle_timeout_ends_the_daemon_without_messages() {
    let fx = Fx::embedded("idle");
    let mut d = fx.subscribed(&["--idle-timeout", "1"], "idle");
    let (st, took) = d.wait_exit(Duration::from_secs(5));
    assert_eq!(st.code(), Some(0), "{}", d.text());
    assert!(took < Duration::from_millis(1500), "{took:?}");
    assert!(d.text().contains("idle timeout"), "{}", d.text());
    fx.finish();
}

#[test]
fn reconcile_subscribe_execs_the_control_root_daemon() {
    let mut fx = Fx::bare("rec");
    // Daemon flags without --subscribe are a usage error; plain `reconcile` is the one-shot
    // session reconcile (tests/it/session.rs), which starts no daemon.
    let r = fx.td.mam().args(["reconcile", "--idle-timeout", "2"]).run();
    r.expect_rc(2);
    eqnice!("ERROR: mam reconcile: --idle-timeout and --registry-dir need --subscribe\n", r.stderr());
    fx.td.mam().args(["reconcile"]).run().expect_rc(0);
    assert!(select_daemons(&fx.td.ws()).is_empty());

    let broker = start_target(Target::Embedded, &fx.td).unwrap();
    fx.env = broker_env(broker.port());
    let (td, env) = (&fx.td, &fx.env);
    let sub = td.ws().join("sub");
    fs::create_dir_all(&sub).unwrap();
    for via_shim in [false, true] {
        let mut cmd = if via_shim {
            let shim = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("shims/reconcile.sh");
            td.command(shim).env("MAM_BIN", mam_bin())
        } else {
            td.mam().args(["reconcile"])
        };
        // From a subdirectory: the control root is the nearest ancestor with .mam.
        cmd = cmd.cwd(&sub).args(["--subscribe", "--idle-timeout", "2"]);
        for (k, v) in env {
            cmd = cmd.env(k, v);
        }
        let mut d = Daemon::spawn(cmd, td.path(&format!("rec-{via_shim}.log")));
        d.wait_log("subscribed ", Duration::from_secs(10));
        // exec kept the pid and gave it the daemon's argv shape.
        assert_eq!(select_daemons(&td.ws()), vec![d.pid()], "shim={via_shim}");
        let (st, _) = d.wait_exit(Duration::from_secs(10));
        assert_eq!(st.code(), Some(0), "{}", d.text());
        assert!(d.text().contains(&format!("workspace={}", td.ws().display())), "{}", d.text());
    }
    fx.finish();
}

#[test]
fn fallback_switches_back_to_the_broker_and_survives_a_drop() {
    let mut fx = Fx::bare("back");
    // A port that was just free; the broker comes up on it once the daemon is polling.
    let port = free_port();
    fx.env = broker_env(port);
    let root = fx.root();
    fx.env.push(("MAM_DAEMON_BROKER_RETRY_S", "1".into()));
    let id = fx.register(&[]);
    let d = fx.daemon(&["--interval", "1"], "back");
    d.wait_log("broker unavailable", Duration::from_secs(15));
    let cfg = mam::broker::BrokerConfig { bind: format!("127.0.0.1:{port}").parse().unwrap(), ..Default::default() };
    let broker = mam::broker::start(cfg).expect("bind the freed port");
    d.wait_log("broker up; subscribed", Duration::from_secs(5));
    let rec = fx.record(&id);
    publish_raw(port, &format!("{root}/jobs/{id}/events"), &signed_event(&rec, "started", 1, false), false);
    fx.wait_status(&id, "running", Duration::from_secs(5));

    // A lost connection is logged and re-established; mirroring continues.
    broker.drop_connections();
    d.wait_log("broker down", Duration::from_secs(5));
    wait_until("the daemon to resubscribe", Duration::from_secs(10), || d.text().matches("broker up").count() >= 2);
    publish_raw(port, &format!("{root}/jobs/{id}/events"), &signed_event(&rec, "completed", 2, false), false);
    fx.wait_status(&id, "completed", Duration::from_secs(5));
    drop(d);
    fx.finish();
}

#[test]
fn a12_a_remote_terminal_event_writes_the_report() {
    let mut fx = Fx::embedded("a12");
    fx.env.push(("MAM_DISPATCH_SECRET", rand_hex(16)));
    let report = fx.td.path("reports/r.md");
    let id = fx.register(&["--transport", "remote", "--report-path", report.to_str().unwrap()]);
    let d = fx.subscribed(&[], "a12");
    let rec = fx.record(&id);
    let v = serde_json::json!({
        "v": 1, "kind": "event", "job_id": id, "attempt": 1, "dispatch_token": rec["dispatch_token"],
        "agent_session": rec["agent_session"], "event": "completed", "seq": 1, "ts": mam::clock::now_ts(),
        "heartbeat": false, "message": "", "data": {"report": "all done\nVERDICT: ok\n"}
    });
    let key = rec["auth_token"].as_str().unwrap().as_bytes();
    let payload = serde_json::to_vec(&mam::sign::signed(key, v.as_object().unwrap().clone()).unwrap()).unwrap();
    fx.publish(&id, "events", &payload, false);
    wait_until("the report", Duration::from_secs(5), || {
        fs::read_to_string(&report).is_ok_and(|t| t.ends_with("VERDICT: ok\n"))
    });
    assert_eq!(fx.status(&id), "completed");
    drop(d);
    fx.finish();
}

#[test]
fn concurrent_ensures_agree_on_one_daemon() {
    let fx = Fx::embedded("ens4");
    let runs: Vec<Run> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4).map(|_| s.spawn(|| fx.ensure().run())).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let pids: Vec<String> = runs.iter().map(|r| r.expect_rc(0).stdout()).collect();
    assert!(pids.iter().all(|p| p == &pids[0] && !p.is_empty()), "{pids:?}");
    let pid: i32 = pids[0].trim().parse().unwrap();
    wait_until("the losers to exit", Duration::from_secs(5), || select_daemons(&fx.td.ws()) == vec![pid]);
    fx.td.mam().args(["daemon", "stop"]).run().expect_rc(0);
    fx.finish();
}

/// An A15 close stops the job's heartbeat timer first (CORE 7.4), so no beat of the closed attempt
/// follows the closed state; the watched agent process itself is left alone.
#[test]
fn a15_close_stops_the_jobs_timer() {
    let mut fx = Fx::embedded("a15t");
    let mut agent = Command::new("sleep").arg("60").spawn().unwrap();
    let mut gone = Command::new("true").spawn().unwrap();
    let dead = gone.id();
    gone.wait().unwrap();
    // N = 8 s: a timer left alone would only notice the close at its next beat, 8 s away.
    let id = fx.register(&["--timeout", "2", "--heartbeat-sec", "8"]);
    let _timers = TimerGuard(id.clone());
    fx.td.mam().args(["registry", "set-meta", &id, &format!("watcher_pid:={dead}")]).run().expect_rc(0);
    let publish = fx.mam().args(["publish", "--job-id", &id, "--event", "started", "--heartbeat", "8"]);
    publish.args(["--watch-pid", &agent.id().to_string()]).run().expect_rc(0);
    wait_until("the timer to run", Duration::from_secs(5), || !timer_pids(&id).is_empty());
    fx.env.push(("MAM_DAEMON_SWEEP_S", "1".into()));
    let d = fx.daemon(&[], "a15t");
    fx.wait_status(&id, "deadline_timeout", Duration::from_secs(15));
    wait_until("the timer to be stopped", Duration::from_secs(3), || timer_pids(&id).is_empty());
    assert!(agent.try_wait().unwrap().is_none(), "the agent process was signalled");
    let _ = agent.kill();
    let _ = agent.wait();
    drop(d);
    fx.finish();
}

/// A loopback proxy in front of a broker. While `down` it closes every connection at accept (a
/// broker that is away); once `armed` it cuts the connection that sends the first PUBLISH whose
/// topic ends with `suffix`, without forwarding that frame (a broker that closes mid-publish).
struct CutProxy {
    port: u16,
    down: Arc<AtomicBool>,
    armed: Arc<AtomicBool>,
    cuts: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl CutProxy {
    fn start(upstream: u16, suffix: &str) -> CutProxy {
        let (listener, port) = loopback_listener();
        listener.set_nonblocking(true).unwrap();
        let flags = || Arc::new(AtomicBool::new(false));
        let (down, armed, stop) = (flags(), flags(), flags());
        let cuts = Arc::new(AtomicUsize::new(0));
        let (d, a, c, s, suffix) = (down.clone(), armed.clone(), cuts.clone(), stop.clone(), suffix.to_string());
        let thread = std::thread::spawn(move || {
            let mut pipes = Vec::new();
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((client, _)) if d.load(Ordering::SeqCst) => drop(client),
                    Ok((client, _)) => {
                        client.set_nonblocking(false).unwrap();
                        let server = TcpStream::connect(("127.0.0.1", upstream)).unwrap();
                        let (c2s, s2c) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                        pipes.push(std::thread::spawn(move || copy_until_closed(s2c, c2s)));
                        let (a, c, suffix) = (a.clone(), c.clone(), suffix.clone());
                        pipes.push(std::thread::spawn(move || forward_frames(client, server, &a, &c, &suffix)));
                    }
                    // The proxy's own accept loop: this paces it, it awaits nothing.
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
            for p in pipes {
                let _ = p.join();
            }
        });
        CutProxy { port, down, armed, cuts, stop, thread: Some(thread) }
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Copies `from` to `to` until either side closes (then closes both).
fn copy_until_closed(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = from.shutdown(std::net::Shutdown::Both);
    let _ = to.shutdown(std::net::Shutdown::Both);
}

/// Forwards whole MQTT frames from `client` to `server`; the first PUBLISH on a topic ending with
/// `suffix` while `armed` closes both instead.
fn forward_frames(mut client: TcpStream, mut server: TcpStream, armed: &AtomicBool, cuts: &AtomicUsize, suffix: &str) {
    use std::io::Read;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        // One whole frame: a type byte, a remaining length of up to four 7-bit digits, the rest.
        while let Some((len, body)) = frame_len(&buf) {
            if buf.len() < body + len {
                break;
            }
            let frame: Vec<u8> = buf.drain(..body + len).collect();
            if frame[0] >> 4 == 3 {
                let tl = usize::from(u16::from_be_bytes([frame[body], frame[body + 1]]));
                let topic = String::from_utf8_lossy(&frame[body + 2..body + 2 + tl]).to_string();
                if topic.ends_with(suffix) && armed.swap(false, Ordering::SeqCst) {
                    cuts.fetch_add(1, Ordering::SeqCst);
                    let _ = client.shutdown(std::net::Shutdown::Both);
                    let _ = server.shutdown(std::net::Shutdown::Both);
                    return;
                }
            }
            if server.write_all(&frame).is_err() {
                return;
            }
        }
        match client.read(&mut chunk) {
            Ok(0) | Err(_) => {
                let _ = server.shutdown(std::net::Shutdown::Both);
                return;
            }
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// `(remaining length, where the body starts)` of the frame at the start of `buf`, once its header
/// is complete.
fn frame_len(buf: &[u8]) -> Option<(usize, usize)> {
    let mut len = 0usize;
    for (i, b) in buf.iter().enumerate().skip(1).take(4) {
        len |= usize::from(b & 0x7f) << (7 * (i - 1));
        if b & 0x80 == 0 {
            return Some((len, i + 1));
        }
    }
    None
}

/// Issue 19, store and forward: the daemon's replay of events the outage left unsent is cut by the
/// broker mid-publish; the daemon tries again at its next sweep over a new connection, and a
/// subscriber gets each event once, in seq order, the terminal included.
#[test]
fn a_replay_cut_mid_publish_is_tried_again_at_the_next_sweep() {
    if !have_tool("mosquitto_sub", "MAM_REQUIRE_MOSQUITTO") {
        return;
    }
    for &t in TARGETS {
        let Some(mut fx) = Fx::on("cutfwd", t) else { continue };
        let proxy = CutProxy::start(fx.port(), "/events");
        for (k, v) in fx.env.iter_mut() {
            if *k == "MQTT_PORT" {
                *v = proxy.port.to_string();
            }
        }
        let id = fx.register(&[]);
        let topic = format!("{}/jobs/{id}/events", fx.root());
        let sub = MosqSub::start(fx.port(), &topic);
        // The broker is away: each event is recorded, not sent (rc 3, CORE 6.3).
        proxy.down.store(true, Ordering::SeqCst);
        for event in ["started", "progress", "completed"] {
            let publish =
                fx.mam().env("MAM_PUBLISH_BUDGET_S", "1").args(["publish", "--job-id", &id, "--event", event]);
            publish.run().expect_rc(3);
        }
        assert!(sub.messages(&topic).is_empty(), "{t:?}: {:?}", sub.messages(&topic));
        // Back, but the first replayed event is cut off.
        proxy.armed.store(true, Ordering::SeqCst);
        proxy.down.store(false, Ordering::SeqCst);
        fx.env.push(("MAM_DAEMON_SWEEP_S", "1".into()));
        let d = fx.daemon(&[], "cutfwd");
        d.wait_log("events the wire had missed not sent yet (", Duration::from_secs(15));
        d.wait_log("sent 3 event(s) the wire had missed", Duration::from_secs(15));
        assert_eq!(proxy.cuts.load(Ordering::SeqCst), 1, "{t:?}");
        let want = ["started", "progress", "completed"];
        wait_until("the subscriber to get the three events", Duration::from_secs(5), || {
            sub.messages(&topic).len() >= 3
        });
        let got: Vec<(u64, String)> = sub
            .messages(&topic)
            .iter()
            .map(|(_, p)| {
                let v: Value = serde_json::from_str(p).unwrap();
                (v["seq"].as_u64().unwrap(), v["event"].as_str().unwrap().to_string())
            })
            .collect();
        let want: Vec<(u64, String)> = want.iter().enumerate().map(|(i, e)| (i as u64 + 1, e.to_string())).collect();
        assert_eq!(got, want, "{t:?}:\n{}", d.text());
        let replayed = fx.audit(&id).iter().filter(|e| e["kind"] == "published" && e["replayed"] == true).count();
        assert_eq!(replayed, 3, "{t:?}: {:?}", fx.audit(&id));
        d.signal(libc::SIGTERM);
        drop(d);
        drop(sub);
        fx.finish();
    }
}

/// Issue 32 item 11: `reconcile.sh --subscribe` on SIGTERM exits 143, as the legacy trap did (the
/// shim asks the daemon for it); `mam daemon run` itself still stops with 0.
#[test]
fn reconcile_sh_subscribe_exits_143_on_sigterm() {
    let mut fx = Fx::bare("rec143");
    let broker = start_target(Target::Embedded, &fx.td).unwrap();
    fx.env = broker_env(broker.port());
    let (td, env) = (&fx.td, &fx.env);
    let shim = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("shims/reconcile.sh");
    let mut cmd = td.command(shim).env("MAM_BIN", mam_bin()).args(["--subscribe"]);
    for (k, v) in env {
        cmd = cmd.env(k, v);
    }
    let mut d = Daemon::spawn(cmd, td.path("rec143.log"));
    d.wait_log("subscribed ", Duration::from_secs(10));
    mam::sys::kill(d.pid(), libc::SIGTERM).unwrap();
    let (st, _) = d.wait_exit(Duration::from_secs(10));
    assert_eq!(st.code(), Some(143), "{}", d.text());
    fx.finish();
}
