//! Integration tests: the heartbeat timer (CORE 7, A16, A17, A18, A31): H1-H12 at the CLI, the
//! terminal racing a beat held at CONNACK, the fixed cadence that never waits for the broker, and
//! the signal latency. Every test guards its job's timers, so none outlives it.

use std::fs;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mam::broker::BrokerHandle;
use mam::heartbeat::timer_proc::{is_our_timer, lifecycle_lock_path, pidfile_path, Pidfile};
use mam::sys::{Flock, LockMode};
use serde_json::Value;

use crate::publish::{
    assert_nothing_running_after_terminal, audit, events, key, logs, mam_at, new_job, publish, record, registry,
    wire_log, Bg,
};
use crate::support::{
    embedded, free_port, have_tool, independent_verify, start_target, timer_pids, wait_until, Broker, Cmd, MosqSub,
    Run, Target, TestDir, TimerGuard, TARGETS,
};

fn beats(td: &TestDir, id: &str) -> Vec<Value> {
    events(td, id).into_iter().filter(|e| e["heartbeat"] == true).collect()
}

fn pidfile(td: &TestDir, id: &str) -> Option<Pidfile> {
    Pidfile::read(&pidfile_path(&registry(td), id)).unwrap()
}

fn hb_log(td: &TestDir, id: &str) -> String {
    fs::read_to_string(logs(td).join(id).join("heartbeat.log")).unwrap_or_default()
}

fn audit_kinds(td: &TestDir, id: &str) -> Vec<String> {
    audit(td, id).iter().map(|e| e["kind"].as_str().unwrap().to_string()).collect()
}

/// `mam heartbeat start --job-id id --interval 1 --watch-pid 0 [extra]`, rc 0; the timer's pid.
fn start(td: &TestDir, port: u16, id: &str, extra: &[&str]) -> i32 {
    let r = mam_at(td, port)
        .args(["heartbeat", "start", "--job-id", id, "--interval", "1", "--watch-pid", "0"])
        .args(extra)
        .run();
    r.expect_rc(0).stdout().trim().parse().unwrap()
}

fn gone(pid: i32) -> bool {
    !matches!(mam::sys::proc_start_ticks(pid), Ok((_, false)))
}

/// The prologue every test shares: a test directory, a broker `b` (the embedded one, one of
/// `TARGETS`, or `()` for a port nothing listens on), one job registered against it, and a guard
/// that kills the job's timers when the test ends (dropped first).
struct Hb<B> {
    _timers: TimerGuard,
    td: TestDir,
    b: B,
    port: u16,
    id: String,
}

impl<B> Hb<B> {
    fn build(name: &str, start: impl FnOnce(&TestDir) -> Option<(B, u16)>) -> Option<Hb<B>> {
        let td = TestDir::new(name);
        let (b, port) = start(&td)?;
        let id = new_job(&td, port, &[]);
        Some(Hb { _timers: TimerGuard(id.clone()), td, b, port, id })
    }

    /// A `mam` command whose broker is the test's.
    fn mam(&self) -> Cmd {
        mam_at(&self.td, self.port)
    }

    /// `mam publish --job-id <id> --event <event> [extra]`.
    fn publish(&self, event: &str, extra: &[&str]) -> Run {
        publish(&self.td, self.port, &self.id, event, extra)
    }

    /// `mam heartbeat start` for the job (see `start`); the timer's pid.
    fn start(&self, extra: &[&str]) -> i32 {
        start(&self.td, self.port, &self.id, extra)
    }

    fn beats(&self) -> Vec<Value> {
        beats(&self.td, &self.id)
    }

    fn pidfile(&self) -> Option<Pidfile> {
        pidfile(&self.td, &self.id)
    }

    fn hb_log(&self) -> String {
        hb_log(&self.td, &self.id)
    }

    fn audit(&self) -> Vec<Value> {
        audit(&self.td, &self.id)
    }

    fn audit_kinds(&self) -> Vec<String> {
        audit_kinds(&self.td, &self.id)
    }

    /// The job's live timer processes.
    fn timers(&self) -> Vec<i32> {
        timer_pids(&self.id)
    }
}

impl Hb<BrokerHandle> {
    /// On the embedded broker (its hooks: stall CONNACK, received()).
    fn embedded(name: &str) -> Hb<BrokerHandle> {
        Hb::build(name, |_| {
            let b = embedded();
            let port = b.addr().port();
            Some((b, port))
        })
        .unwrap()
    }
}

impl Hb<Broker> {
    /// On a broker of target `t`; `None` (skipped) when it is not installed.
    fn on(name: &str, t: Target) -> Option<Hb<Broker>> {
        Hb::build(name, |td| {
            let b = start_target(t, td)?;
            let port = b.port();
            Some((b, port))
        })
    }
}

impl Hb<()> {
    /// No broker: the job names a port that was free (for tests that never reach the wire).
    fn no_broker(name: &str) -> Hb<()> {
        Hb::build(name, |_| Some(((), free_port()))).unwrap()
    }
}

#[test]
fn h1_beats_every_second_with_valid_sigs_and_rising_seqs() {
    for &t in TARGETS {
        let Some(h) = Hb::on("h1", t) else { continue };
        let id = &h.id;
        let observer = have_tool("mosquitto_sub", "MAM_REQUIRE_MOSQUITTO")
            .then(|| MosqSub::start(h.port, &format!("mam/jobs/{id}/#")));
        let r = h.publish("started", &["--heartbeat", "1", "--watch-pid", "0"]);
        assert_eq!(r.expect_rc(0).stdout(), format!("published started seq=1 job={id}\n"));
        wait_until("three beats on disk", Duration::from_secs(10), || h.beats().len() >= 3);
        let k = key(&h.td, &h.id);
        let bs = h.beats();
        let mut prev: Option<(u64, u64)> = None;
        for e in &bs {
            assert!(mam::sign::verify(k.as_bytes(), e), "{t:?}: beat sig");
            assert_eq!((e["event"].as_str(), e["message"].as_str()), (Some("progress"), Some("")));
            let seq = e["seq"].as_u64().unwrap();
            let ms = mam::clock::parse_ts(e["ts"].as_str().unwrap()).unwrap();
            if let Some((ps, pms)) = prev {
                assert!(seq > ps, "{t:?}: rising seqs");
                let gap = ms - pms;
                assert!((700..=2300).contains(&gap), "{t:?}: beats {gap} ms apart");
            }
            prev = Some((seq, ms));
        }
        let pf = h.pidfile().expect("pidfile");
        assert!(is_our_timer(&pf), "{t:?}: the pidfile passes is_our_timer");
        assert_eq!(h.timers(), [pf.pid]);
        assert_eq!((pf.attempt, pf.job_id.as_str()), (1, id.as_str()));
        if let Some(obs) = observer {
            wait_until("beats on the wire", Duration::from_secs(10), || {
                obs.messages("mam/").iter().filter(|(_, p)| p.contains("\"heartbeat\":true")).count() >= 2
            });
            let wire: Vec<String> = obs.messages("mam/").into_iter().map(|(_, p)| p).collect();
            if have_tool("openssl", "MAM_REQUIRE_OPENSSL") {
                let verdicts = independent_verify(&k, &wire);
                assert!(verdicts.iter().all(|v| v.starts_with("ok ")), "{t:?}: {verdicts:?}");
            }
            let states: Vec<Value> = wire.iter().map(|p| serde_json::from_str::<Value>(p).unwrap()).collect();
            assert!(states.iter().filter(|v| v["kind"] == "state").all(|v| v["status"] == "running"));
        }
        let r = h.mam().args(["heartbeat", "stop", "--job-id", id]).run();
        assert_eq!(r.expect_rc(0).stdout(), format!("stopped {}\n", pf.pid));
        assert!(h.timers().is_empty());
        assert!(h.pidfile().is_none());
        let r = h.mam().args(["heartbeat", "status", "--job-id", id]).run();
        assert_eq!(r.expect_rc(0).stdout(), "none\n");
    }
}

#[test]
fn h2_completed_stops_the_timer_before_the_terminal_seq() {
    for &t in TARGETS {
        let Some(h) = Hb::on("h2", t) else { continue };
        let id = &h.id;
        let observer = have_tool("mosquitto_sub", "MAM_REQUIRE_MOSQUITTO")
            .then(|| MosqSub::start(h.port, &format!("mam/jobs/{id}/#")));
        h.publish("started", &["--heartbeat", "1", "--watch-pid", "0"]).expect_rc(0);
        wait_until("two beats", Duration::from_secs(10), || h.beats().len() >= 2);
        let r = h.publish("completed", &[]);
        r.expect_rc(0);
        assert!(r.stderr().is_empty(), "{t:?}: {}", r.stderr());
        assert!(h.timers().is_empty(), "{t:?}: the timer is gone when the terminal returns");
        let ev = events(&h.td, &h.id);
        let last = ev.last().unwrap();
        assert_eq!(last["event"], "completed");
        let term_seq = last["seq"].as_u64().unwrap();
        assert!(ev[..ev.len() - 1].iter().all(|e| e["seq"].as_u64().unwrap() < term_seq));
        let kinds = h.audit_kinds();
        let stopped = kinds.iter().position(|k| k == "heartbeat_stopped").expect("heartbeat_stopped");
        let terminal = h.audit().iter().position(|e| e["request"] == "terminal").unwrap();
        assert!(stopped < terminal, "{t:?}: {kinds:?}");
        if let Broker::Embedded(handle) = &h.b {
            assert_nothing_running_after_terminal(&wire_log(handle, &h.id), "completed");
        }
        if let Some(obs) = observer {
            wait_until("the terminal state on the wire", Duration::from_secs(10), || {
                obs.messages("mam/").iter().any(|(_, p)| p.contains("\"status\":\"completed\""))
            });
            let log: Vec<(String, String, u64)> = obs
                .messages("mam/")
                .into_iter()
                .map(|(_, p)| {
                    let v: Value = serde_json::from_str(&p).unwrap();
                    let what = if v["kind"] == "state" { v["status"].clone() } else { v["event"].clone() };
                    (v["kind"].as_str().unwrap().into(), what.as_str().unwrap().into(), v["seq"].as_u64().unwrap())
                })
                .collect();
            assert_nothing_running_after_terminal(&log, "completed");
        }
    }
}

#[test]
fn h2b_terminal_races_a_beat_held_at_connack() {
    let h = Hb::embedded("h2b");
    h.b.stall_connack("mam-hb-");
    h.publish("started", &["--heartbeat", "1", "--watch-pid", "0"]).expect_rc(0);
    wait_until("a beat on disk held at CONNACK", Duration::from_secs(10), || {
        !h.beats().is_empty() && h.b.connects().iter().any(|c| c.starts_with("mam-hb-"))
    });
    let t = Instant::now();
    let r = h.publish("completed", &[]);
    r.expect_rc(0);
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "a beat on the wire does not hold up the terminal: {:?}",
        t.elapsed()
    );
    assert!(!r.stderr().contains("did not drain"), "{}", r.stderr());
    assert!(h.timers().is_empty());
    h.b.release_connack("mam-hb-");
    assert_nothing_running_after_terminal(&wire_log(&h.b, &h.id), "completed");
    assert!(h.b.received().iter().all(|(_, p, _)| !String::from_utf8_lossy(p).contains("\"heartbeat\":true")));
}

/// A fake agent: bash running `script` with argv[0] = `argv0` (the A18 forms).
pub(crate) fn fake_agent(td: &TestDir, argv0: &str, name: &str, script: &str, port: u16) -> Bg {
    let path = td.write(name, script);
    let c = td
        .command("bash")
        .env("MAM", crate::support::mam_bin())
        .env("MQTT_PORT", port.to_string())
        .args(["-c", &format!("exec -a {argv0} bash {}", path.display())]);
    Bg::spawn(c)
}

#[test]
fn h3_h12_timer_watches_the_nearest_agent_and_ends_with_it() {
    for (&t, (argv0, name)) in TARGETS
        .iter()
        .zip([("claude", "agent.sh"), ("node", "claude")])
        .chain(TARGETS.iter().zip([("node", "claude"), ("claude", "agent.sh")]))
    {
        let Some(h) = Hb::on("h3", t) else { continue };
        let id = &h.id;
        let script = format!(
            "\"$MAM\" publish --job-id {id} --event started --heartbeat 1 > /dev/null 2>&1 || exit 9\nwhile :; do sleep 0.05; done\n"
        );
        let mut agent = fake_agent(&h.td, argv0, name, &script, h.port);
        wait_until("the timer and its audit line", Duration::from_secs(10), || {
            h.timers().len() == 1 && h.audit_kinds().contains(&"heartbeat_started".to_string())
        });
        let started = h.audit().into_iter().find(|e| e["kind"] == "heartbeat_started").unwrap();
        assert_eq!(started["watch_pid"].as_u64(), Some(agent.pid() as u64), "{argv0}: the agent is watched");
        assert!(agent.running());
        let timer = h.timers()[0];
        mam::sys::kill(agent.pid() as i32, libc::SIGKILL).unwrap();
        let killed = Instant::now();
        wait_until("the timer to end with its agent", Duration::from_secs(5), || gone(timer));
        assert!(killed.elapsed() <= Duration::from_secs(2), "N+1 s: {:?}", killed.elapsed());
        assert!(h.hb_log().contains(&format!("watched process {} is gone", agent.pid())));
        assert!(h.pidfile().is_none(), "the exit cleanup removed its own pidfile");
        drop(agent);
    }
}

#[test]
fn h3_killed_agent_makes_watch_unresponsive_after_k_n() {
    // N=1, K=3: the watch ends with rc 11 between 3 and 4.5 s after the last beat it could see.
    for &t in TARGETS {
        let Some(ms) = crate::liveness::agent_sigkill_once("h3watch", t) else { continue };
        assert!((3000..=4500).contains(&ms), "{t:?}: rc 11 came {ms} ms after the last beat");
    }
}

#[test]
fn h4_recycled_pid_is_not_signalled() {
    let h = Hb::no_broker("h4");
    let id = &h.id;
    let mut sleeper = Command::new("sleep").arg("30").stdin(Stdio::null()).spawn().unwrap();
    let pid = sleeper.id() as i32;
    let (ticks, _) = mam::sys::proc_start_ticks(pid).unwrap();
    let pf = Pidfile {
        pid,
        job_id: id.clone(),
        attempt: 1,
        dispatch_token: "t".into(),
        start_ticks: ticks,
        started_at: "x".into(),
    };
    pf.write(&pidfile_path(&registry(&h.td), id)).unwrap();
    let r = h.mam().args(["heartbeat", "status", "--job-id", id]).run();
    assert_eq!(r.expect_rc(0).stdout(), "none\n");
    let r = h.mam().args(["heartbeat", "stop", "--job-id", id]).run();
    assert_eq!(r.expect_rc(0).stdout(), "none\n");
    assert!(sleeper.try_wait().unwrap().is_none(), "the unrelated sleep was signalled");
    assert!(h.pidfile().is_none(), "the stale pidfile is removed");
    let _ = sleeper.kill();
    let _ = sleeper.wait();
}

#[test]
fn h5_replacement_drains_the_old_timer_first() {
    let h = Hb::embedded("h5");
    h.publish("started", &[]).expect_rc(0);
    let old = h.start(&[]);
    let held = format!("mam-hb-{old}-");
    h.b.stall_connack(&held);
    wait_until("the old timer's beat recorded and held at CONNACK", Duration::from_secs(10), || {
        !h.beats().is_empty() && h.b.connects().iter().any(|c| c.starts_with(&held))
    });
    let new = h.start(&[]);
    assert_ne!(old, new);
    assert!(gone(old), "the old timer exited before the pidfile named its successor");
    let old_seqs: Vec<u64> = h.beats().iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(h.pidfile().unwrap().pid, new);
    let a = h.audit();
    let stop_old = a.iter().position(|e| e["kind"] == "heartbeat_stopped" && e["pid"] == old).unwrap();
    let start_new = a.iter().position(|e| e["kind"] == "heartbeat_started" && e["pid"] == new).unwrap();
    assert!(stop_old < start_new);
    assert!(!a.iter().any(|e| e["kind"] == "heartbeat_killed"), "drained, not killed");
    h.publish("completed", &[]).expect_rc(0);
    h.b.release_connack(&held);
    assert!(h.timers().is_empty());
    for (_, p, _) in h.b.received() {
        let v: Value = serde_json::from_slice(&p).unwrap();
        if v["kind"] == "event" {
            assert!(!old_seqs.contains(&v["seq"].as_u64().unwrap()), "the old timer's beat reached the wire: {v}");
        }
    }
    assert_nothing_running_after_terminal(&wire_log(&h.b, &h.id), "completed");
}

#[test]
fn h6_concurrent_starts_leave_one_tracked_timer() {
    let h = Hb::embedded("h6");
    let id = &h.id;
    h.publish("started", &[]).expect_rc(0);
    let starts: Vec<Bg> = (0..8)
        .map(|_| Bg::spawn(h.mam().args(["heartbeat", "start", "--job-id", id, "--interval", "1", "--watch-pid", "0"])))
        .collect();
    for s in starts {
        let (rc, out, err) = s.finish(Duration::from_secs(60));
        assert_eq!(rc, 0, "{err}");
        assert!(out.trim().parse::<i32>().is_ok(), "{out}");
        assert!(!err.contains("did not drain"), "{err}");
    }
    let pf = h.pidfile().unwrap();
    assert_eq!(h.timers(), [pf.pid], "exactly one live timer, the tracked one");
    h.publish("completed", &[]).expect_rc(0);
    assert!(h.timers().is_empty());
}

#[test]
fn h7_start_after_the_barrier_is_refused_and_spawns_nothing() {
    let h = Hb::no_broker("h7");
    let id = &h.id;
    let path = registry(&h.td).join(format!("{id}.json"));
    let mut rec = record(&h.td, &h.id);
    rec["barrier_attempt"] = 1.into();
    fs::write(&path, serde_json::to_vec_pretty(&rec).unwrap()).unwrap();
    let r = h.mam().args(["heartbeat", "start", "--job-id", id, "--watch-pid", "0"]).run();
    r.expect_rc(4);
    assert_eq!(r.stderr(), format!("REFUSED: {id}: attempt_ended (the terminal barrier is raised)\n"));
    assert!(h.timers().is_empty());
    assert!(h.pidfile().is_none());
    // publish --heartbeat after the barrier: the event is refused? No: progress is admitted, the
    // timer is not armed, and that is a WARNING only.
    let r = h.publish("progress", &["--heartbeat", "1", "--watch-pid", "0", "--no-state"]);
    assert!(r.stderr().contains("WARNING: heartbeat timer not armed: attempt ended"), "{}", r.stderr());
    assert!(h.timers().is_empty());
}

#[test]
fn h8_stopping_an_idle_timer_is_quick_with_a_long_drain() {
    let h = Hb::embedded("h8");
    let id = &h.id;
    h.publish("started", &[]).expect_rc(0);
    let pid = h.start(&[]);
    let t = Instant::now();
    let r = h.mam().env("MAM_HEARTBEAT_DRAIN_S", "10").args(["heartbeat", "stop", "--job-id", id]).run();
    assert_eq!(r.expect_rc(0).stdout(), format!("stopped {pid}\n"));
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert_eq!(r.stderr(), "");
    assert!(!h.audit_kinds().contains(&"heartbeat_killed".to_string()));
}

fn fault_inject_available() -> bool {
    if cfg!(feature = "fault-inject") {
        return true;
    }
    if std::env::var("MAM_REQUIRE_FAULT_INJECT").as_deref() == Ok("1") {
        panic!("MAM_REQUIRE_FAULT_INJECT=1 but the suite was built without --features fault-inject");
    }
    eprintln!("skipped: built without --features fault-inject");
    false
}

fn l2_is_free(td: &TestDir, id: &str) -> bool {
    let f = mam::sys::open_lock_file(&lifecycle_lock_path(&registry(td), id)).unwrap();
    Flock::try_acquire(f, LockMode::Exclusive).unwrap().is_some()
}

#[test]
fn h9_pidfile_failure_leaves_no_survivor() {
    if !fault_inject_available() {
        return;
    }
    let h = Hb::no_broker("h9");
    let id = &h.id;
    let r = h
        .mam()
        .env("MAM_FAULT_INJECT", "heartbeat_pidfile")
        .args(["heartbeat", "start", "--job-id", id, "--watch-pid", "0"])
        .run();
    r.expect_rc(1);
    assert!(
        r.stderr().starts_with("ERROR: ") && r.stderr().contains("cannot write the timer pidfile"),
        "{}",
        r.stderr()
    );
    wait_until("no timer process", Duration::from_secs(5), || h.timers().is_empty());
    // A child that survived would have reached A16's check once L2 was free and logged its exit.
    assert!(!h.hb_log().contains("pidfile does not name this timer"), "the child survived the spawner");
    assert!(h.pidfile().is_none());
    assert!(l2_is_free(&h.td, &h.id));
}

#[test]
fn h10_spawn_failure_leaves_nothing_and_the_next_start_works() {
    if !fault_inject_available() {
        return;
    }
    let h = Hb::embedded("h10");
    let id = &h.id;
    let r = h
        .mam()
        .env("MAM_FAULT_INJECT", "heartbeat_spawn")
        .args(["heartbeat", "start", "--job-id", id, "--watch-pid", "0"])
        .run();
    r.expect_rc(1);
    assert!(r.stderr().contains("cannot start the heartbeat timer"), "{}", r.stderr());
    assert!(h.timers().is_empty() && h.pidfile().is_none() && l2_is_free(&h.td, &h.id));
    let pid = h.start(&[]);
    assert_eq!(h.timers(), [pid]);
}

#[test]
fn h11_lifetime_and_redispatch_end_the_timer() {
    let h = Hb::embedded("h11");
    let id = &h.id;
    let t = Instant::now();
    let pid = h.start(&["--lifetime", "3"]);
    wait_until("the lifetime to end the timer", Duration::from_secs(8), || gone(pid));
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(2900) && took < Duration::from_secs(5), "{took:?}");
    assert!(h.hb_log().contains("lifetime of 3s elapsed"));
    assert!(h.pidfile().is_none());

    let pid = h.start(&[]);
    let r = h.mam().args(["registry", "submit", "--type", "task", "--session", "w1", "--job-id", id]).run();
    assert_eq!(r.expect_rc(0).stdout(), format!("{id} attempt=2 iteration=2\n"));
    assert!(gone(pid), "the redispatch stopped the old attempt's timer");
    assert!(h.timers().is_empty());

    // An operator close stops the timer too (CORE 7.4).
    let pid = h.start(&[]);
    h.mam().args(["registry", "finalize", id, "--status", "cancelled"]).run().expect_rc(0);
    assert!(gone(pid), "finalize stopped the timer");
    assert!(h.timers().is_empty());
}

#[test]
fn a31_idempotent_started_rearms_a_dead_timer_only() {
    let h = Hb::embedded("a31");
    h.publish("started", &["--heartbeat", "1", "--watch-pid", "0"]).expect_rc(0);
    let first = h.pidfile().unwrap().pid;
    // A repeat while the timer lives leaves it alone.
    let r = h.publish("started", &["--heartbeat", "1", "--watch-pid", "0"]);
    assert_eq!(r.expect_rc(0).stdout(), "already running; nothing new to publish\n");
    assert_eq!(h.timers(), [first]);
    // The timer dies; the repeat re-arms it.
    mam::sys::kill(first, libc::SIGKILL).unwrap();
    wait_until("the timer to die", Duration::from_secs(5), || gone(first));
    h.publish("started", &["--heartbeat", "1", "--watch-pid", "0"]).expect_rc(0);
    let second = h.pidfile().unwrap().pid;
    assert_ne!(first, second);
    assert_eq!(h.timers(), [second]);
}

#[test]
fn a16_a17_a_timer_not_named_in_the_pidfile_exits_and_sigterm_is_quick() {
    let h = Hb::embedded("a16");
    let id = &h.id;
    let rec = record(&h.td, &h.id);
    let reg = registry(&h.td);
    // A16: a `run` whose pid is not in the pidfile exits at once and beats nothing.
    let r = h
        .mam()
        .args(["heartbeat", "run", "--job-id", id, "--attempt", "1"])
        .args(["--dispatch-token", rec["dispatch_token"].as_str().unwrap()])
        .args(["--interval", "1", "--watch-pid", "0", "--lifetime", "60", "--registry-dir"])
        .args([reg.as_os_str()])
        .run_within(Duration::from_secs(10));
    r.expect_rc(0);
    assert!(r.stdout().contains("pidfile does not name this timer; exiting"), "{}", r.stdout());
    assert!(h.beats().is_empty());

    // A17: SIGTERM straight to the timer is honoured within 100 ms (with slack for a busy machine);
    // the exit cleanup then removes its own pidfile since L2 is free.
    let pid = h.start(&[]);
    let t = Instant::now();
    mam::sys::kill(pid, libc::SIGTERM).unwrap();
    wait_until("the timer to exit on SIGTERM", Duration::from_secs(5), || gone(pid));
    assert!(t.elapsed() < Duration::from_millis(500), "{:?}", t.elapsed());
    assert!(h.pidfile().is_none());
    assert!(h.hb_log().contains("stopping: SIGTERM"));
}

#[test]
fn cadence_never_waits_for_the_broker() {
    let h = Hb::embedded("hb-cadence");
    let id = &h.id;
    h.b.stall_connack("mam-hb-");
    let pid = h.start(&[]);
    wait_until("four beats on disk while the wire is held", Duration::from_secs(10), || h.beats().len() >= 4);
    let bs = h.beats();
    let ts: Vec<u64> = bs.iter().map(|e| mam::clock::parse_ts(e["ts"].as_str().unwrap()).unwrap()).collect();
    for w in ts.windows(2) {
        assert!((700..=2300).contains(&(w[1] - w[0])), "cadence kept: {ts:?}");
    }
    assert!(h.hb_log().contains("dropped from the wire (kept in events.log)"), "{}", h.hb_log());
    let t = Instant::now();
    let r = h.mam().args(["heartbeat", "stop", "--job-id", id]).run();
    assert_eq!(r.expect_rc(0).stdout(), format!("stopped {pid}\n"));
    assert!(t.elapsed() < Duration::from_secs(1), "a stalled wire does not delay the stop: {:?}", t.elapsed());
    h.b.release_connack("mam-hb-");
    assert!(h.b.received().is_empty());
}
