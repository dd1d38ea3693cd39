//! Liveness under real faults (CORE 7, 8; issue 6), with N=1 and K=3: the agent killed with
//! SIGKILL, the heartbeat timer killed while the agent lives, the broker killed and restarted
//! mid-job, and the watcher killed and restarted. Each fault runs `REPEATS` independent times (own
//! directory, broker and job) in parallel threads, and each test prints its detection latencies
//! (median and max, also as a ratio to K×N) on stderr (`cargo test liveness -- --nocapture`).

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::heartbeat::fake_agent;
use crate::publish::Bg;
use crate::support::{rand_hex, timer_pids, wait_until, Background, Broker, Target, TimerGuard};
use crate::watch::{wait_lines, World};

const N_S: u64 = 1;
const K: u64 = 3;
/// K×N in milliseconds: the idle window every watch here uses.
const KN_MS: u64 = K * N_S * 1000;
const REPEATS: usize = 10;

/// Runs `f(i)` for `0..REPEATS` on parallel threads; a panic in any run fails the test with it.
fn repeat<T: Send>(f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = (0..REPEATS).map(|i| s.spawn(move || f(i))).collect();
        hs.into_iter().map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))).collect()
    })
}

/// `median`, `max` and both as ratios to K×N, one line on stderr; returns (median, max).
fn report(what: &str, mut ms: Vec<u64>) -> (u64, u64) {
    ms.sort_unstable();
    let (med, max) = (ms[ms.len() / 2], ms[ms.len() - 1]);
    let r = |v: u64| v as f64 / KN_MS as f64;
    eprintln!(
        "liveness {what}: n={} median={med}ms ({:.3} KxN) max={max}ms ({:.3} KxN) all={ms:?}",
        ms.len(),
        r(med),
        r(max)
    );
    (med, max)
}

/// A local job with N=1, K=3 in its own world, whose watch is subscribed.
struct Live {
    w: World,
    id: String,
    watch: Background,
    _timers: TimerGuard,
}

impl Live {
    fn new(name: &str, t: Target, extra: &[&str]) -> Option<Live> {
        let w = World::new(name, t)?;
        let mut args = vec!["--heartbeat-sec", "1", "--heartbeat-misses", "3"];
        args.extend_from_slice(extra);
        let id = w.register_session(&format!("s{}", rand_hex(3)), &args);
        let timers = TimerGuard(id.clone());
        let mut watch = w.watch(&id, &[]);
        wait_lines(&mut watch, "subscribed topic=", 2);
        Some(Live { w, id, watch, _timers: timers })
    }

    fn events(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(self.w.registry().join(&self.id).join("events.log")).unwrap_or_default();
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    fn beats(&self) -> Vec<Value> {
        self.events().into_iter().filter(|e| e["heartbeat"] == true).collect()
    }

    /// The wall-clock ms of the latest beat on disk.
    fn last_beat_ms(&self) -> u64 {
        let bs = self.beats();
        bs.iter().map(|e| mam::clock::parse_ts(e["ts"].as_str().unwrap()).unwrap()).max().expect("a beat")
    }

    /// A `claude` agent that publishes `started --heartbeat 1` and then lives until killed.
    fn claude(&self) -> Bg {
        let script = format!(
            "\"$MAM\" publish --job-id {} --event started --heartbeat 1 > /dev/null 2>&1 || exit 9\nwhile :; do sleep 0.05; done\n",
            self.id
        );
        fake_agent(&self.w.td, "claude", "agent.sh", &script, self.w.port)
    }

    fn wait_beats(&self, n: usize) {
        wait_until("beats on disk", Duration::from_secs(10), || self.beats().len() >= n);
    }

    /// Waits for the watch to end: its rc and the wall-clock ms at which the exit was seen.
    fn watch_end(&mut self) -> (i32, u64) {
        let (rc, _) = self.watch.wait(Duration::from_secs(20));
        (rc, mam::clock::now_ms())
    }

    fn watch_out(&self) -> String {
        format!("--- watch stdout\n{}--- watch stderr\n{}", self.watch.stdout(), self.watch.stderr())
    }
}

/// One run of H3's second half: a `claude` agent arms the timer with `publish started --heartbeat
/// 1`, is killed with SIGKILL, and the watch ends unresponsive (rc 11). Returns the time from the
/// last beat on disk to the watch's exit, in ms.
pub(crate) fn agent_sigkill_once(name: &str, t: Target) -> Option<u64> {
    let mut l = Live::new(name, t, &[])?;
    let mut agent = l.claude();
    l.wait_beats(2);
    let timer = timer_pids(&l.id);
    assert_eq!(timer.len(), 1, "one timer");
    assert!(agent.running());
    mam::sys::kill(agent.pid() as i32, libc::SIGKILL).unwrap();
    let (rc, end) = l.watch_end();
    assert_eq!(rc, 11, "{}", l.watch_out());
    // The timer ended with its agent (N+1 s), so the beats on disk are final.
    wait_until("the timer to end", Duration::from_secs(5), || timer_pids(&l.id).is_empty());
    assert!(l.watch.stdout().contains("result unresponsive"), "{}", l.watch_out());
    let latency = end.saturating_sub(l.last_beat_ms());
    drop(agent);
    Some(latency)
}

fn assert_detected_within_kn_plus_1(what: &str, latencies: Vec<u64>) {
    let all = latencies.clone();
    let (_, max) = report(what, latencies);
    let min = *all.iter().min().unwrap();
    // The ms-rounded `ts` of the beat may trail the instant the watch took as evidence by < 1 ms.
    assert!(min + 1 >= KN_MS, "{what}: detected {min} ms after the last beat, before K*N: {all:?}");
    assert!(max <= KN_MS + 1000, "{what}: detected {max} ms after the last beat, later than K*N+1 s: {all:?}");
}

#[test]
fn agent_sigkill_is_unresponsive_between_kn_and_kn_plus_1() {
    let lat = repeat(|i| agent_sigkill_once(&format!("lv-agent{i}"), Target::Embedded).unwrap());
    assert_detected_within_kn_plus_1("agent SIGKILL", lat);
}

#[test]
fn timer_sigkill_while_the_agent_lives_is_unresponsive() {
    let lat = repeat(|i| {
        let mut l = Live::new(&format!("lv-timer{i}"), Target::Embedded, &[]).unwrap();
        let mut agent = l.claude();
        l.wait_beats(2);
        let timers = timer_pids(&l.id);
        assert_eq!(timers.len(), 1);
        mam::sys::kill(timers[0], libc::SIGKILL).unwrap();
        wait_until("the timer to die", Duration::from_secs(5), || timer_pids(&l.id).is_empty());
        let (rc, end) = l.watch_end();
        assert_eq!(rc, 11, "{}", l.watch_out());
        assert!(agent.running(), "the agent lives on; only its beats stopped");
        end.saturating_sub(l.last_beat_ms())
    });
    assert_detected_within_kn_plus_1("timer SIGKILL", lat);
}

#[test]
fn broker_restart_mid_job_loses_no_event_and_ends_right() {
    if !crate::support::have_tool("mosquitto", "MAM_REQUIRE_MOSQUITTO") {
        return;
    }
    let downtimes = repeat(|i| {
        let mut l = Live::new(&format!("lv-broker{i}"), Target::Mosquitto, &[]).unwrap();
        let publish = |l: &Live, event: &str, extra: &[&str]| {
            l.w.mam()
                .env("MAM_PUBLISH_BUDGET_S", "1")
                .args(["publish", "--job-id", &l.id, "--event", event])
                .args(extra)
                .run()
        };
        publish(&l, "started", &["--heartbeat", "1", "--watch-pid", "0"]).expect_rc(0);
        l.wait_beats(2);
        let Some(Broker::Mosquitto(m)) = l.w.broker.as_mut() else { unreachable!() };
        m.kill();
        let down = Instant::now();
        // While the broker is down: an event (rc 3: recorded, not sent) and a beat reach the disk.
        let r = publish(&l, "progress", &["--message", "during the outage"]);
        r.expect_rc(3);
        let beats = l.beats().len();
        wait_until("a beat during the outage", Duration::from_secs(5), || l.beats().len() > beats);
        let Some(Broker::Mosquitto(m)) = l.w.broker.as_mut() else { unreachable!() };
        m.launch();
        let downtime = down.elapsed().as_millis() as u64;
        l.watch.wait_stdout("broker up", Duration::from_secs(10));
        publish(&l, "completed", &[]).expect_rc(0);
        let (rc, _) = l.watch_end();
        assert_eq!(rc, 0, "the watch ends with the terminal, not a silence verdict\n{}", l.watch_out());
        assert!(l.watch.stdout().contains("result completed"), "{}", l.watch_out());
        // No event lost: events.log holds every seq the engine allocated, in order, the outage's
        // progress included, and the watch accepted each non-beat event.
        let ev = l.events();
        let seqs: Vec<u64> = ev.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
        let rec = l.w.record(&l.id);
        let last = rec["last_seq"].as_u64().unwrap();
        assert_eq!(seqs, (1..=last).collect::<Vec<u64>>(), "events.log seqs");
        assert_eq!(rec["status"], "completed");
        for e in ev.iter().filter(|e| e["heartbeat"] != true) {
            let line = format!("accepted seq={} event={}", e["seq"], e["event"].as_str().unwrap());
            assert!(l.watch.stdout().contains(&line), "{line}\n{}", l.watch_out());
        }
        assert!(ev.iter().any(|e| e["message"] == "during the outage"));
        // The restarted broker (no persistence) holds the terminal state again.
        let state = retained(l.w.port, &format!("mam/jobs/{}/state", l.id)).expect("a retained state");
        assert_eq!((state["status"].as_str(), state["seq"].as_u64()), (Some("completed"), Some(last)));
        downtime
    });
    let mut d = downtimes;
    d.sort_unstable();
    eprintln!("liveness broker restart: downtime ms {d:?} (all ended completed, no event lost)");
}

#[test]
fn watcher_killed_and_restarted_recovers_the_terminal_from_the_retained_state() {
    let recoveries = repeat(|i| {
        // A remote-transport job: watch reads only the wire (no events.log tail), so what the new
        // watch finds can only be the retained state.
        let w = World::new(&format!("lv-watch{i}"), Target::Embedded).unwrap();
        let args = ["--transport", "remote", "--heartbeat-sec", "1", "--heartbeat-misses", "3"];
        let id = w.register_session(&format!("remote:r{}", rand_hex(3)), &args);
        let mut first = w.watch(&id, &[]);
        wait_lines(&mut first, "subscribed topic=", 2);
        w.mam().args(["publish", "--job-id", &id, "--event", "started"]).run().expect_rc(0);
        first.wait_stdout("accepted seq=1 event=started", Duration::from_secs(10));
        first.signal(libc::SIGKILL);
        assert_eq!(first.wait(Duration::from_secs(5)).0, 128 + libc::SIGKILL);
        w.mam().args(["publish", "--job-id", &id, "--event", "completed"]).run().expect_rc(0);
        let seq = w.record(&id)["last_seq"].as_u64().unwrap();
        let started = Instant::now();
        let mut second = w.watch(&id, &[]);
        let (rc, _) = second.wait(Duration::from_secs(10));
        let took = started.elapsed().as_millis() as u64;
        let out = second.stdout();
        assert_eq!(rc, 0, "{out}{}", second.stderr());
        assert!(out.contains(&format!("accepted-state seq={seq} status=completed")), "{out}");
        assert!(!out.contains("accepted seq="), "no event was replayed: {out}");
        assert!(out.contains("result completed"), "{out}");
        took
    });
    let mut r = recoveries;
    r.sort_unstable();
    eprintln!("liveness watcher restart: recovery ms (new watch start to exit) {r:?}");
    assert!(r[r.len() - 1] < 5000, "{r:?}");
}

/// The retained message on `topic` (waits up to 5 s), parsed.
fn retained(port: u16, topic: &str) -> Option<Value> {
    let ctx = mam::ctx::Ctx::with_env([("MQTT_PORT", port.to_string())], std::path::Path::new("/"));
    let cfg = mam::mqtt::MqttConfig::from_ctx(&ctx).unwrap();
    let mut c = mam::mqtt::Client::connect(&cfg, mam::mqtt::Role::Sub, &mam::mqtt::Stop::never()).unwrap();
    c.subscribe(&[topic.to_string()], 1).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Some(m) = c.recv(deadline).unwrap() {
            if m.topic == topic && !m.payload.is_empty() {
                return serde_json::from_slice(&m.payload).ok();
            }
        }
    }
    None
}
