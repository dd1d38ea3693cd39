//! Integration tests: `mam watch` (CORE 8; A9, A10, A11, A12, A31), W1-W12, as a process against the
//! embedded broker and a real mosquitto.
//!
//! Events are produced by `Emitter`, a stand-in for `mam publish` until that merges: it signs event
//! and state payloads with the record's auth token (`mam::sign`), appends the event to events.log
//! when asked, and publishes the event and the retained state with the mam MQTT client. Seqs are
//! chosen by the test so the watermark rules can be driven exactly.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mam::ctx::Ctx;
use mam::mqtt::{Client, Message, MqttConfig, Role, Stop};
use serde_json::{json, Value};

use crate::support::{pause_until, poll, rand_hex, start_target, Background, Broker, Target, TestDir, TARGETS};

const SECRET_VAR: &str = "MAM_DISPATCH_SECRET";

/// A test's world: its directory, a broker, and a dispatch secret for remote jobs.
pub struct World {
    pub td: TestDir,
    pub broker: Option<Broker>,
    pub port: u16,
    pub secret: String,
}

impl World {
    pub fn new(name: &str, target: Target) -> Option<World> {
        let td = TestDir::new(name);
        let broker = start_target(target, &td)?;
        let port = broker.port();
        Some(World { td, broker: Some(broker), port, secret: rand_hex(16) })
    }

    /// A world whose "broker" is some port of the caller's choosing (a silent listener, nothing).
    pub fn without_broker(name: &str, port: u16) -> World {
        World { td: TestDir::new(name), broker: None, port, secret: rand_hex(16) }
    }

    pub fn registry(&self) -> PathBuf {
        self.td.ws().join(".mam/jobs")
    }

    pub fn logs(&self) -> PathBuf {
        self.td.ws().join(".mam/delegate_job_logs")
    }

    /// `mam` with this world's broker, secret and a fast events.log poll.
    pub fn mam(&self) -> crate::support::Cmd {
        self.td
            .mam()
            .env("MQTT_PORT", self.port.to_string())
            .env(SECRET_VAR, &self.secret)
            .env("MAM_WATCH_POLL_MS", "100")
            .env("MAM_MQTT_CONNECT_TIMEOUT_S", "2")
    }

    /// Registers a job (`extra` adds timing and transport flags) and returns its id.
    pub fn register(&self, extra: &[&str]) -> String {
        self.register_session("w1", extra)
    }

    pub fn register_session(&self, session: &str, extra: &[&str]) -> String {
        let id = format!("w{}", rand_hex(4));
        self.mam().args(["registry", "register", "--session", session, "--job-id", &id]).args(extra).run().expect_rc(0);
        id
    }

    pub fn record(&self, id: &str) -> Value {
        serde_json::from_slice(&fs::read(self.registry().join(format!("{id}.json"))).unwrap()).unwrap()
    }

    pub fn audit(&self, id: &str) -> Vec<Value> {
        let text = fs::read_to_string(self.logs().join(id).join("audit.jsonl")).unwrap_or_default();
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    pub fn audit_of(&self, id: &str, kind: &str) -> Vec<Value> {
        self.audit(id).into_iter().filter(|e| e["kind"] == kind).collect()
    }

    pub fn watch(&self, id: &str, extra: &[&str]) -> Background {
        self.mam().args(["watch", "--job-id", id]).args(extra).spawn_bg(&self.td, "watch")
    }

    /// Starts a watch and waits until both subscriptions are in place.
    pub fn watch_subscribed(&self, id: &str, extra: &[&str]) -> Background {
        let mut w = self.watch(id, extra);
        w.wait_stdout("subscribed topic=", Duration::from_secs(10));
        wait_lines(&mut w, "subscribed topic=", 2);
        w
    }

    pub fn emitter(&self, id: &str) -> Emitter {
        Emitter::new(self, id)
    }

    /// Stops the broker and starts it again on the same port (retained messages are lost, as with
    /// a mosquitto without persistence).
    pub fn restart_broker(&mut self) {
        match self.broker.take() {
            Some(Broker::Mosquitto(mut m)) => {
                m.restart();
                self.broker = Some(Broker::Mosquitto(m));
            }
            Some(Broker::Embedded(h)) => {
                let addr = h.addr();
                h.shutdown();
                let cfg = mam::broker::BrokerConfig { bind: addr, ..Default::default() };
                self.broker = Some(Broker::Embedded(mam::broker::start(cfg).expect("restart the embedded broker")));
            }
            None => {}
        }
    }
}

/// Waits until `needle` occurs at least `n` times in the background process's stdout.
pub fn wait_lines(p: &mut Background, needle: &str, n: usize) {
    let limit = Duration::from_secs(10);
    // Some(true): seen n times; Some(false): the process exited first; None: timed out.
    let seen = poll(limit, || {
        if p.stdout().matches(needle).count() >= n {
            return Some(true);
        }
        p.exited().then_some(false)
    });
    if seen == Some(true) || p.stdout().matches(needle).count() >= n {
        return;
    }
    let why = if seen.is_some() { "exited early" } else { "timed out" };
    panic!("waiting for {n} x {needle:?} ({why} after {limit:?}):\n{}{}", p.stdout(), p.stderr());
}

/// Produces signed events and states for one job, as `mam publish` would (see the module comment).
pub struct Emitter {
    pub id: String,
    pub attempt: u64,
    pub token: String,
    pub auth: String,
    pub prefix: String,
    pub events_log: PathBuf,
    port: u16,
}

impl Emitter {
    pub fn new(w: &World, id: &str) -> Emitter {
        let r = w.record(id);
        Emitter {
            id: id.to_string(),
            attempt: r["attempt"].as_u64().unwrap(),
            token: r["dispatch_token"].as_str().unwrap().to_string(),
            auth: r["auth_token"].as_str().unwrap().to_string(),
            prefix: r["topic_prefix"].as_str().unwrap().to_string(),
            events_log: w.registry().join(id).join("events.log"),
            port: w.port,
        }
    }

    fn sign(&self, key: &str, v: Value) -> Vec<u8> {
        let signed = mam::sign::signed(key.as_bytes(), v.as_object().unwrap().clone()).unwrap();
        serde_json::to_vec(&signed).unwrap()
    }

    /// An event payload of this job's identity, or of another attempt/token/key.
    pub fn event_as(&self, seq: u64, event: &str, data: Value, attempt: u64, token: &str, key: &str) -> Vec<u8> {
        self.sign(
            key,
            json!({"v": 1, "kind": "event", "job_id": self.id, "attempt": attempt, "dispatch_token": token,
                   "agent_session": "w1", "event": event, "seq": seq, "ts": mam::clock::now_ts(),
                   "heartbeat": false, "message": "", "data": data}),
        )
    }

    pub fn event(&self, seq: u64, event: &str) -> Vec<u8> {
        self.event_as(seq, event, json!({}), self.attempt, &self.token, &self.auth)
    }

    pub fn state(&self, seq: u64, status: &str) -> Vec<u8> {
        let last = if status == "running" { "started" } else { status };
        self.sign(
            &self.auth,
            json!({"v": 1, "kind": "state", "job_id": self.id, "attempt": self.attempt,
                   "dispatch_token": self.token, "status": status, "last_event": last, "seq": seq,
                   "ts": mam::clock::now_ts()}),
        )
    }

    pub fn client(&self) -> Client {
        let ctx = Ctx::with_env([("MQTT_PORT", self.port.to_string())], Path::new("/"));
        let cfg = MqttConfig::from_ctx(&ctx).unwrap();
        Client::connect(&cfg, Role::Pub, &Stop::never()).unwrap()
    }

    pub fn send_event(&self, payload: &[u8]) {
        self.client().publish(&Message::new(format!("{}/events", self.prefix), payload.to_vec(), 1, false)).unwrap();
    }

    pub fn send_state(&self, payload: &[u8]) {
        self.client().publish(&Message::new(format!("{}/state", self.prefix), payload.to_vec(), 1, true)).unwrap();
    }

    pub fn append_log(&self, payload: &[u8]) {
        fs::create_dir_all(self.events_log.parent().unwrap()).unwrap();
        let mut line = payload.to_vec();
        line.push(b'\n');
        mam::sys::append_locked(&self.events_log, &line).unwrap();
    }

    /// What `mam publish --event E` does for a local job: events.log first, then the event and the
    /// retained state over one connection.
    pub fn publish(&self, seq: u64, event: &str, status: &str) {
        let e = self.event(seq, event);
        self.append_log(&e);
        let mut c = self.client();
        c.publish_raw(&[
            Message::new(format!("{}/events", self.prefix), e, 1, false),
            Message::new(format!("{}/state", self.prefix), self.state(seq, status), 1, true),
        ])
        .unwrap();
        c.disconnect();
    }

    /// The same over the wire only (events.log untouched).
    pub fn publish_wire(&self, seq: u64, event: &str, status: &str) {
        let mut c = self.client();
        c.publish_raw(&[
            Message::new(format!("{}/events", self.prefix), self.event(seq, event), 1, false),
            Message::new(format!("{}/state", self.prefix), self.state(seq, status), 1, true),
        ])
        .unwrap();
        c.disconnect();
    }
}

/// Every stdout line has the A10 shape for this attempt and token.
fn assert_a10(out: &str, attempt: u64, token: &str) {
    let tag = format!(" attempt={attempt} token={} ", &token[..8]);
    for l in out.lines() {
        let (ts, rest) = l.split_once(' ').unwrap();
        assert!(mam::clock::parse_ts(ts).is_some(), "timestamp in {l:?}");
        assert!(format!(" {rest}").starts_with(&tag), "{l:?} lacks {tag:?}");
    }
}

fn whats(out: &str) -> Vec<String> {
    out.lines().map(|l| l.splitn(4, ' ').nth(3).unwrap_or("").to_string()).collect()
}

const FAST: &[&str] = &["--heartbeat-sec", "1", "--heartbeat-misses", "3", "--ack-timeout", "5"];

#[test]
fn w1_started_then_completed() {
    for &t in TARGETS {
        let Some(w) = World::new("w1", t) else { continue };
        let id = w.register(FAST);
        let mut watch = w.watch_subscribed(&id, &[]);
        let e = w.emitter(&id);
        e.publish(1, "started", "running");
        e.publish(2, "completed", "completed");
        let (rc, _) = watch.wait(Duration::from_secs(10));
        assert_eq!(rc, 0, "{t:?}\n{}{}", watch.stdout(), watch.stderr());
        let out = watch.stdout();
        assert_a10(&out, 1, &e.token);
        let prefix = &e.prefix;
        eqnice!(
            [
                format!("subscribed topic={prefix}/events"),
                format!("subscribed topic={prefix}/state"),
                "accepted seq=1 event=started".into(),
                "advanced status=running".into(),
                "accepted seq=2 event=completed".into(),
                "advanced status=completed".into(),
                "result completed".into(),
            ]
            .join("\n"),
            whats(&out).into_iter().filter(|l| !l.starts_with("accepted-state")).collect::<Vec<_>>().join("\n")
        );
        // The same lines went to subscriber.log (A10), and the record was not touched without --remote.
        let log = fs::read_to_string(w.logs().join(&id).join("subscriber.log")).unwrap();
        assert_eq!(log, out, "{t:?}");
        assert_eq!(w.record(&id)["status"], "pending");
    }
}

#[test]
fn w2_silence_after_started_is_unresponsive() {
    let Some(w) = World::new("w2", Target::Embedded) else { return };
    let id = w.register(&["--heartbeat-sec", "1", "--heartbeat-misses", "3", "--ack-timeout", "30"]);
    let mut watch = w.watch_subscribed(&id, &[]);
    let e = w.emitter(&id);
    e.publish_wire(1, "started", "running");
    let sent = Instant::now();
    let (rc, at) = watch.wait(Duration::from_secs(10));
    let after = at - sent;
    assert_eq!(rc, 11, "{}{}", watch.stdout(), watch.stderr());
    assert!(after >= Duration::from_millis(3000) && after <= Duration::from_millis(4500), "{after:?}");
    assert!(watch.stdout().ends_with("result unresponsive\n"), "{}", watch.stdout());
    assert!(watch.stderr().contains("unresponsive"), "{}", watch.stderr());
}

#[test]
fn idle_timeout_flag_overrides_the_window() {
    let Some(w) = World::new("widle", Target::Embedded) else { return };
    let id = w.register(&["--heartbeat-sec", "1", "--heartbeat-misses", "5", "--ack-timeout", "30"]);
    let mut watch = w.watch_subscribed(&id, &["--idle-timeout", "1"]);
    let e = w.emitter(&id);
    e.publish(1, "started", "running");
    let sent = Instant::now();
    let (rc, at) = watch.wait(Duration::from_secs(10));
    assert_eq!(rc, 11, "{}{}", watch.stdout(), watch.stderr());
    assert!(at - sent < Duration::from_millis(2500), "{:?}: the record's 5 s window was used", at - sent);
}

#[test]
fn w3_ack_budget_and_the_wall_clock() {
    let Some(w) = World::new("w3", Target::Embedded) else { return };
    let id = w.register(FAST);
    let mut watch = w.watch(&id, &["--ack-timeout", "2"]);
    let (rc, at) = watch.wait(Duration::from_secs(10));
    let took = at - watch.started;
    assert_eq!(rc, 12, "{}{}", watch.stdout(), watch.stderr());
    assert!(took >= Duration::from_millis(1900) && took < Duration::from_millis(3000), "{took:?}");
    assert!(watch.stderr().contains("no event within 2s (ack budget 2s)"), "{}", watch.stderr());
    assert!(watch.stdout().ends_with("result no_started\n"), "{}", watch.stdout());

    // A31: the wall clock ends it first, and the message says it cut the budget.
    let mut watch = w.watch(&id, &["--timeout", "1", "--ack-timeout", "5"]);
    let (rc, at) = watch.wait(Duration::from_secs(10));
    let took = at - watch.started;
    assert_eq!(rc, 13, "{}{}", watch.stdout(), watch.stderr());
    assert!(took < Duration::from_millis(2000), "{took:?}");
    assert!(watch.stderr().contains("no event within 1s (ack budget 5s cut by the wall clock)"), "{}", watch.stderr());
    assert!(watch.stdout().ends_with("result wall_clock\n"), "{}", watch.stdout());
}

#[test]
fn w4_default_budget_is_t_plus_k_n_from_subscription() {
    let Some(w) = World::new("w4", Target::Embedded) else { return };
    let id = w.register(&["--heartbeat-sec", "1", "--heartbeat-misses", "1", "--ack-timeout", "2"]);
    let mut watch = w.watch(&id, &[]);
    watch.wait_stdout("subscribed topic=", Duration::from_secs(10));
    let subscribed = Instant::now();
    let (rc, at) = watch.wait(Duration::from_secs(10));
    let took = at - subscribed;
    assert_eq!(rc, 12, "{}{}", watch.stdout(), watch.stderr());
    assert!(took >= Duration::from_millis(2800) && took < Duration::from_millis(3800), "{took:?}");
    assert!(watch.stderr().contains("(ack budget 3s)"), "{}", watch.stderr());
}

#[test]
fn w5_retained_terminal_state_alone() {
    for &t in TARGETS {
        let Some(w) = World::new("w5", t) else { continue };
        let id = w.register(FAST);
        let e = w.emitter(&id);
        // Published before the watch exists, on the wire only: the retained state is all it can see.
        e.publish_wire(1, "started", "running");
        e.publish_wire(2, "completed", "completed");
        let mut watch = w.watch(&id, &[]);
        let (rc, _) = watch.wait(Duration::from_secs(10));
        assert_eq!(rc, 0, "{t:?}\n{}{}", watch.stdout(), watch.stderr());
        let out = watch.stdout();
        assert!(out.contains("accepted-state seq=2 status=completed"), "{out}");
        assert!(!out.contains("accepted seq="), "{out}");
        assert!(out.ends_with("result completed\n"), "{out}");
    }
}

#[test]
fn w6_stale_state_does_not_renew_but_a_stale_terminal_ends() {
    for &t in TARGETS {
        let Some(w) = World::new("w6", t) else { continue };
        let id = w.register(&["--heartbeat-sec", "1", "--heartbeat-misses", "2", "--ack-timeout", "30"]);
        let e = w.emitter(&id);
        let mut watch = w.watch_subscribed(&id, &[]);
        e.send_event(&e.event(5, "progress"));
        watch.wait_stdout("accepted seq=5 event=progress", Duration::from_secs(5));
        let accepted = Instant::now();
        // The redelivered snapshot arrives half-way through the 2 s idle window; had it renewed the
        // window, the verdict would come no earlier than 3 s after the event (a deliberate pause).
        pause_until(accepted + Duration::from_millis(1000));
        e.send_state(&e.state(3, "running"));
        let (rc, at) = watch.wait(Duration::from_secs(10));
        assert_eq!(rc, 11, "{t:?}\n{}{}", watch.stdout(), watch.stderr());
        assert!(watch.stdout().contains("accepted-state seq=3 status=running"), "{}", watch.stdout());
        assert!(at - accepted < Duration::from_millis(2700), "{:?}", at - accepted);

        let mut watch = w.watch_subscribed(&id, &[]);
        e.send_event(&e.event(5, "progress"));
        watch.wait_stdout("accepted seq=5 event=progress", Duration::from_secs(5));
        e.send_state(&e.state(3, "completed"));
        let (rc, _) = watch.wait(Duration::from_secs(10));
        assert_eq!(rc, 0, "{t:?}\n{}{}", watch.stdout(), watch.stderr());
    }
}

#[test]
fn w7_state_before_its_event_does_not_drop_the_event() {
    for &t in TARGETS {
        let Some(w) = World::new("w7", t) else { continue };
        let id = w.register(FAST);
        let e = w.emitter(&id);
        let mut watch = w.watch_subscribed(&id, &[]);
        e.send_state(&e.state(5, "running"));
        watch.wait_stdout("accepted-state seq=5 status=running", Duration::from_secs(5));
        e.send_event(&e.event(5, "progress"));
        watch.wait_stdout("accepted seq=5 event=progress", Duration::from_secs(5));
        e.publish_wire(6, "completed", "completed");
        let (rc, _) = watch.wait(Duration::from_secs(10));
        assert_eq!(rc, 0, "{t:?}\n{}{}", watch.stdout(), watch.stderr());
    }
}

#[test]
fn w8_seq_gap_is_audited() {
    for &t in TARGETS {
        let Some(w) = World::new("w8gap", t) else { continue };
        let id = w.register(FAST);
        let e = w.emitter(&id);
        let mut watch = w.watch_subscribed(&id, &[]);
        e.publish(1, "started", "running");
        e.publish(2, "progress", "running");
        e.publish(4, "progress", "running");
        e.publish(5, "completed", "completed");
        let (rc, _) = watch.wait(Duration::from_secs(10));
        assert_eq!(rc, 0, "{t:?}\n{}{}", watch.stdout(), watch.stderr());
        let gaps = w.audit_of(&id, "seq_gap");
        assert_eq!(gaps.len(), 1, "{t:?} {gaps:?}");
        assert_eq!((gaps[0]["expected"].as_u64(), gaps[0]["got"].as_u64()), (Some(3), Some(4)));
        assert_eq!(gaps[0]["attempt"], 1);
    }
}

#[test]
fn w8_broker_restart_reconnects_then_w1_passes() {
    for &t in TARGETS {
        let Some(mut w) = World::new("w8restart", t) else { continue };
        let id = w.register(&["--heartbeat-sec", "1", "--heartbeat-misses", "3", "--ack-timeout", "30"]);
        let e = w.emitter(&id);
        let mut watch = w.watch_subscribed(&id, &[]);
        w.restart_broker();
        watch.wait_stdout("broker down", Duration::from_secs(5));
        watch.wait_stdout("broker up", Duration::from_secs(10));
        let rec = w.audit_of(&id, "reconnected");
        assert_eq!(rec.len(), 1, "{t:?} {rec:?}");
        assert!(rec[0]["downtime_ms"].as_u64().unwrap() >= 900, "{rec:?}");
        assert_eq!(rec[0]["attempt_no"], 1, "{rec:?}");
        // Wire only: the job's events.log stays empty, so the verdict must come over the new connection.
        e.publish_wire(1, "started", "running");
        e.publish_wire(2, "completed", "completed");
        let (rc, _) = watch.wait(Duration::from_secs(10));
        assert_eq!(rc, 0, "{t:?}\n{}{}", watch.stdout(), watch.stderr());
        let out = whats(&watch.stdout());
        let pos = |s: &str| out.iter().position(|l| l == s).unwrap_or_else(|| panic!("{s} in {out:?}"));
        assert!(pos("broker down") < pos("broker up") && pos("broker up") < pos("accepted seq=1 event=started"));
        assert!(!fs::exists(&e.events_log).unwrap());
    }
}

#[test]
fn w9_signal_during_connack_wait_exits_within_a_second() {
    for (sig, rc, name) in [(libc::SIGTERM, 143, "SIGTERM"), (libc::SIGINT, 130, "SIGINT")] {
        // A listener that is never served: the kernel completes the handshake, nothing answers.
        let (_listener, port) = crate::support::loopback_listener();
        let w = World::without_broker("w9", port);
        let id = w.register(FAST);
        let mut watch =
            w.mam().env("MAM_MQTT_CONNECT_TIMEOUT_S", "30").args(["watch", "--job-id", &id]).spawn_bg(&w.td, "watch");
        // The spec's scenario: the signal is sent 0.5 s in, while watch waits for a CONNACK (a
        // deliberate pause, not a synchronisation).
        pause_until(watch.started + Duration::from_millis(500));
        assert!(!watch.exited(), "{}", watch.stderr());
        let sent = Instant::now();
        watch.signal(sig);
        let (got, at) = watch.wait(Duration::from_secs(5));
        assert_eq!(got, rc, "{}", watch.stderr());
        assert!(at - sent < Duration::from_secs(1), "{:?}", at - sent);
        assert!(watch.stderr().contains(&format!("watch: received {name}; disconnecting")), "{}", watch.stderr());
    }
}

#[test]
fn w9_signal_while_subscribed_disconnects_cleanly() {
    let Some(w) = World::new("w9sub", Target::Embedded) else { return };
    let id = w.register(FAST);
    let mut watch = w.watch_subscribed(&id, &[]);
    let Some(Broker::Embedded(b)) = &w.broker else { unreachable!() };
    assert_eq!(b.clients().iter().filter(|c| c.starts_with("mam-sub-")).count(), 1);
    let sent = Instant::now();
    watch.signal(libc::SIGTERM);
    let (rc, at) = watch.wait(Duration::from_secs(5));
    assert_eq!(rc, 143, "{}", watch.stderr());
    assert!(at - sent < Duration::from_secs(1));
    // DISCONNECT was sent: the embedded broker logs an ended connection only when it was not clean.
    crate::support::wait_until("the broker to drop the client", Duration::from_secs(2), || b.clients().is_empty());
    let log = b.log_lines().join("\n");
    assert!(!log.contains("mam-sub-"), "{log}");
}

#[test]
fn w10_remote_mirrors_running_then_completed_and_writes_the_report() {
    for &t in TARGETS {
        let Some(w) = World::new("w10", t) else { continue };
        let report = w.td.path("out/report.md");
        let id = w.register(&[
            "--transport",
            "remote",
            "--report-path",
            report.to_str().unwrap(),
            "--heartbeat-sec",
            "1",
            "--heartbeat-misses",
            "3",
            "--ack-timeout",
            "5",
        ]);
        let e = w.emitter(&id);
        let mut watch = w.watch_subscribed(&id, &["--remote"]);
        e.publish_wire(1, "started", "running");
        crate::support::wait_until("the record to be running", Duration::from_secs(5), || {
            w.record(&id)["status"] == "running"
        });
        let text = "# Report\nVERDICT: ok é\n";
        let done = e.event_as(2, "completed", json!({"report": text}), e.attempt, &e.token, &e.auth);
        e.send_event(&done);
        let (rc, _) = watch.wait(Duration::from_secs(10));
        assert_eq!(rc, 0, "{t:?}\n{}{}", watch.stdout(), watch.stderr());
        let r = w.record(&id);
        assert_eq!(r["status"], "completed");
        assert!(r["claimed_at"].is_string() && r["finished_at"].is_string());
        assert_eq!(fs::read_to_string(&report).unwrap(), text);
        let transitions: Vec<String> =
            w.audit_of(&id, "transition").iter().map(|e| e["request"].as_str().unwrap().to_string()).collect();
        assert_eq!(transitions, ["claim", "terminal"], "{t:?}");
    }
}

#[test]
fn w10_stale_attempt_is_refused_and_audited() {
    let Some(w) = World::new("w10stale", Target::Embedded) else { return };
    let id =
        w.register(&["--transport", "remote", "--heartbeat-sec", "1", "--heartbeat-misses", "3", "--ack-timeout", "5"]);
    let old = w.emitter(&id);
    let mut watch = w.watch_subscribed(&id, &["--remote"]);
    // The orchestrator re-dispatches while the watch still follows attempt 1.
    w.mam().args(["registry", "submit", "--type", "task", "--session", "w1", "--job-id", &id]).run().expect_rc(0);
    assert_eq!(w.record(&id)["attempt"], 2);
    old.publish_wire(1, "started", "running");
    watch.wait_stdout("accepted seq=1 event=started", Duration::from_secs(5));
    crate::support::wait_until("the refusal audit", Duration::from_secs(5), || {
        w.audit_of(&id, "refused").iter().any(|e| e["reason"] == "stale_attempt" && e["request"] == "claim")
    });
    assert!(!watch.exited(), "watching continues after a refusal");
    old.publish_wire(2, "completed", "completed");
    let (rc, _) = watch.wait(Duration::from_secs(10));
    assert_eq!(rc, 0, "{}{}", watch.stdout(), watch.stderr());
    let r = w.record(&id);
    assert_eq!((r["status"].as_str(), r["attempt"].as_u64()), (Some("pending"), Some(2)));
    let refused = w.audit_of(&id, "refused");
    assert!(refused.iter().any(|e| e["request"] == "terminal" && e["reason"] == "stale_attempt"), "{refused:?}");
    assert!(watch.stderr().contains("refused"), "{}", watch.stderr());
}

#[test]
fn w11_bad_sig_and_foreign_token_are_dropped_and_audited_once() {
    for &t in TARGETS {
        let Some(w) = World::new("w11", t) else { continue };
        let id = w.register(FAST);
        let e = w.emitter(&id);
        let mut watch = w.watch_subscribed(&id, &["--ack-timeout", "2"]);
        let forged = e.event_as(1, "started", json!({}), e.attempt, &e.token, &"0".repeat(64));
        let foreign = e.event_as(2, "started", json!({}), e.attempt, &rand_hex(16), &e.auth);
        e.send_event(&forged);
        e.send_event(&forged);
        e.send_event(&foreign);
        let (rc, _) = watch.wait(Duration::from_secs(10));
        assert_eq!(rc, 12, "{t:?}\n{}{}", watch.stdout(), watch.stderr());
        let out = whats(&watch.stdout());
        assert_eq!(out.iter().filter(|l| *l == "dropped seq=1 reason=bad_sig").count(), 1, "{out:?}");
        assert_eq!(out.iter().filter(|l| *l == "dropped seq=2 reason=stale_attempt").count(), 1, "{out:?}");
        assert!(!out.iter().any(|l| l.starts_with("accepted")), "{out:?}");
        let dropped = w.audit_of(&id, "dropped");
        let reasons: Vec<(&str, u64)> =
            dropped.iter().map(|e| (e["reason"].as_str().unwrap(), e["seq"].as_u64().unwrap())).collect();
        assert_eq!(reasons, [("bad_sig", 1), ("stale_attempt", 2)], "{t:?}");
    }
}

#[test]
fn w12_events_log_started_with_an_old_token_does_not_ack() {
    let Some(w) = World::new("w12", Target::Embedded) else { return };
    let id = w.register(FAST);
    let old = w.emitter(&id);
    w.mam().args(["registry", "submit", "--type", "task", "--session", "w1", "--job-id", &id]).run().expect_rc(0);
    let cur = w.emitter(&id);
    assert_eq!(cur.attempt, 2);
    // Attempt 1's own line, and a line claiming the current attempt with the old token.
    old.append_log(&old.event(1, "started"));
    cur.append_log(&cur.event_as(2, "started", json!({}), 2, &old.token, &cur.auth));
    let mut watch = w.watch(&id, &["--ack-timeout", "2"]);
    let (rc, _) = watch.wait(Duration::from_secs(10));
    assert_eq!(rc, 12, "{}{}", watch.stdout(), watch.stderr());
    assert!(!watch.stdout().contains("accepted"), "{}", watch.stdout());
    // History lines are skipped silently: nothing dropped, nothing audited.
    assert!(w.audit_of(&id, "dropped").is_empty());

    // The current attempt's own line does count (the tail reads from the start of the file).
    cur.append_log(&cur.event(3, "completed"));
    let mut watch = w.watch(&id, &["--ack-timeout", "5"]);
    let (rc, _) = watch.wait(Duration::from_secs(10));
    assert_eq!(rc, 0, "{}{}", watch.stdout(), watch.stderr());
}

#[test]
fn initial_connect_failure_is_rc3() {
    let port = crate::support::free_port();
    let w = World::without_broker("wrc3", port);
    let id = w.register(FAST);
    let r = w.mam().args(["watch", "--job-id", &id]).run_within(Duration::from_secs(20));
    r.expect_rc(3);
    assert!(r.stderr().contains("WARNING: subscribe attempt 1/3 failed"), "{}", r.stderr());
    assert!(
        r.stderr().contains(&format!("ERROR: watch {id}: cannot connect to broker 127.0.0.1:{port}")),
        "{}",
        r.stderr()
    );
}

#[test]
fn unknown_job_is_rc1_and_help_is_rc0() {
    let w = World::without_broker("wunknown", crate::support::free_port());
    let r = w.mam().args(["watch", "--job-id", "nosuchjob"]).run();
    r.expect_rc(1);
    assert!(r.stderr().starts_with("ERROR: unknown job 'nosuchjob'"), "{}", r.stderr());
    let r = w.mam().args(["watch", "--help"]).run();
    r.expect_rc(0);
    assert!(r.stdout().contains("--ack-timeout S"));
    w.mam().args(["watch", "--job-id", "x", "--timeout", "-1"]).run().expect_rc(2);
}
