//! CORE 3 acceptance tests (B1-B9) and the K10 runs against a real mosquitto: the client library
//! in-process, and `mam pub` / `mam sub` as processes next to mosquitto_pub / mosquitto_sub.
//!
//! Scenarios that any conforming broker must pass loop over `TARGETS`; scenarios that need broker
//! misbehaviour use support's fake listener (CONNACK 4, silence, no PINGRESP) or kill and restart
//! mosquitto.

use std::io::Read;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mam::ctx::Ctx;
use mam::mqtt::{
    self, BrokerBlock, Client, Incoming, Message, MqttConfig, MqttError, Persistent, RetryPolicy, Role, Stop,
};

use crate::support::*;

/// A child process killed and reaped on drop.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl ChildGuard {
    /// Waits for exit within `limit`; returns rc and stdout.
    fn finish(mut self, limit: Duration) -> (i32, String) {
        let status = exit_within(&mut self.0, limit).unwrap_or_else(|| panic!("child did not exit within {limit:?}"));
        let mut out = String::new();
        self.0.stdout.take().unwrap().read_to_string(&mut out).unwrap();
        (status.code().unwrap_or(-1), out)
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers

fn ctx(td: &TestDir, vars: &[(&str, &str)]) -> Ctx {
    let mut all: Vec<(String, String)> = vec![
        ("MAM_ENV_FILE".into(), td.path("absent.env").display().to_string()),
        ("HOME".into(), td.path("home").display().to_string()),
        ("PATH".into(), std::env::var("PATH").unwrap_or_default()),
        ("MAM_MQTT_CONNECT_TIMEOUT_S".into(), "3".into()),
    ];
    for (k, v) in vars {
        all.retain(|(k2, _)| k2 != k);
        all.push((k.to_string(), v.to_string()));
    }
    Ctx::with_env(all, &td.ws())
}

fn cfg(td: &TestDir, port: u16, vars: &[(&str, &str)]) -> MqttConfig {
    let port = port.to_string();
    let mut v = vec![("MQTT_PORT", port.as_str())];
    v.extend_from_slice(vars);
    MqttConfig::from_ctx(&ctx(td, &v)).unwrap()
}

fn fast(what: &'static str) -> RetryPolicy {
    RetryPolicy { delays: vec![Duration::from_millis(100), Duration::from_millis(200)], budget: None, what }
}

fn recv_n(c: &mut Client, n: usize) -> Vec<Incoming> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut got = Vec::new();
    while got.len() < n {
        match c.recv(deadline).unwrap() {
            Some(m) => got.push(m),
            None => panic!("only {} of {n} messages arrived: {got:?}", got.len()),
        }
    }
    got
}

fn connect(cfg: &MqttConfig, role: Role) -> Client {
    Client::connect(cfg, role, &Stop::never()).unwrap_or_else(|e| panic!("connect: {e}"))
}

/// Publishes through `with_retry` with fast waits, collecting warnings and attempt count.
fn publish_counting(cfg: &MqttConfig, msg: &Message) -> (Result<(), MqttError>, Vec<String>, u32) {
    let mut warnings = Vec::new();
    let mut attempts = 0;
    let r = mqtt::with_retry(
        &fast("publish"),
        &Stop::never(),
        |w| warnings.push(w),
        |a| {
            attempts = a;
            let mut c = Client::connect(cfg, Role::Pub, &Stop::never())?;
            c.publish(msg)?;
            c.disconnect();
            Ok(())
        },
    );
    (r, warnings, attempts)
}

// ---------------------------------------------------------------------------------------------
// B1-B9

#[test]
fn b1_qos0_qos1_delivery_and_retained_to_late_subscriber() {
    for &t in TARGETS {
        let td = TestDir::new("b1");
        let Some(b) = start_target(t, &td) else { continue };
        let cfg = cfg(&td, b.port(), &[]);
        let root = format!("b1-{}", rand_hex(4));
        let mut sub = connect(&cfg, Role::Sub);
        assert_eq!(sub.subscribe(&[format!("{root}/live/#")], 1).unwrap(), vec![1], "{t:?}");
        let mut publ = connect(&cfg, Role::Pub);
        publ.publish(&Message::new(format!("{root}/live/q0"), "zero", 0, false)).unwrap();
        publ.publish(&Message::new(format!("{root}/live/q1"), b"one\0\nQ\r\n".to_vec(), 1, false)).unwrap();
        let mut got = recv_n(&mut sub, 2);
        got.sort_by(|a, b| a.topic.cmp(&b.topic));
        assert_eq!(got[0].topic, format!("{root}/live/q0"), "{t:?}");
        assert_eq!(got[0].payload, b"zero");
        assert_eq!(got[1].payload, b"one\0\nQ\r\n");
        assert!(got.iter().all(|m| !m.retain), "{t:?}: live messages are not retained: {got:?}");

        publ.publish(&Message::new(format!("{root}/state"), "kept", 1, true)).unwrap();
        publ.disconnect();
        let mut late = connect(&cfg, Role::Sub);
        late.subscribe(&[format!("{root}/state")], 1).unwrap();
        let got = recv_n(&mut late, 1);
        assert_eq!((got[0].payload.as_slice(), got[0].retain), (&b"kept"[..], true), "{t:?}");
        late.disconnect();
        sub.disconnect();
    }
}

#[test]
fn b2_password_auth_and_the_record_never_holds_it() {
    if !have_tool("mosquitto", "MAM_REQUIRE_MOSQUITTO") || !have_tool("mosquitto_passwd", "MAM_REQUIRE_MOSQUITTO") {
        return;
    }
    let td = TestDir::new("b2");
    let pw_file = td.path("passwd");
    let st = Command::new("mosquitto_passwd").arg("-b").arg("-c").arg(&pw_file).args(["alice", "s3cret"]).status();
    assert!(st.unwrap().success());
    let pw = pw_file.display().to_string();
    let m = Mosquitto::start(&td, |p| format!("listener {p} 127.0.0.1\nallow_anonymous false\npassword_file {pw}\n"));
    let env = cfg(&td, m.port, &[("MQTT_USERNAME", "alice"), ("MQTT_PASSWORD", "s3cret")]);

    // The record's broker block: no password value, no password key; it round-trips through a file.
    let record = serde_json::json!({ "job_id": "b2job", "broker": env.broker_block() });
    let text = serde_json::to_string_pretty(&record).unwrap();
    assert!(!text.contains("s3cret") && !text.contains("password"), "{text}");
    let path = td.write("b2job.json", &text);
    let back: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let block: BrokerBlock = serde_json::from_value(back["broker"].clone()).unwrap();

    // Publishing from the record layers the password back (same host and port) and authenticates.
    let (rcfg, warning) = env.for_block(&block);
    assert_eq!(warning, None);
    let (r, warnings, _) = publish_counting(&rcfg, &Message::new("b2/ok", "x", 1, false));
    r.unwrap_or_else(|e| panic!("authenticated publish failed: {e}"));
    assert!(warnings.is_empty());

    // A record naming another port gets no password: refused, not retried, and the warning names the field.
    let other = BrokerBlock { port: free_port(), ..block.clone() };
    let (_, warning) = env.for_block(&other);
    assert_eq!(
        warning.as_deref(),
        Some("WARNING: broker in record differs from environment (port); connecting without password")
    );
    let wrong = cfg(&td, m.port, &[("MQTT_USERNAME", "alice"), ("MQTT_PASSWORD", "nope")]);
    let (r, warnings, attempts) = publish_counting(&wrong, &Message::new("b2/no", "x", 1, false));
    let e = r.unwrap_err();
    assert!(matches!(e, MqttError::ConnackRefused { code: 4 | 5, .. }), "{e}");
    assert_eq!((attempts, warnings.len()), (1, 0));
    assert!(!e.to_string().contains("nope"));

    // The CLI authenticates with the env password and never shows it.
    let port = m.port.to_string();
    let run = td
        .mam()
        .args(["pub", "-t", "b2/cli", "-m", "hello", "-q", "1"])
        .env("MQTT_PORT", &port)
        .env("MQTT_USERNAME", "alice")
        .env("MQTT_PASSWORD", "s3cret")
        .run();
    run.expect_rc(0);
    let run = td
        .mam()
        .args(["pub", "-t", "b2/cli", "-m", "hello", "-q", "1"])
        .env("MQTT_PORT", &port)
        .env("MQTT_USERNAME", "alice")
        .env("MQTT_PASSWORD", "wr0ng-pw")
        .run();
    run.expect_rc(3);
    assert!(!run.stderr().contains("wr0ng-pw") && !run.stderr().contains("WARNING"), "{}", run.stderr());
    // Four CONNECTs in all (one attempt per refused connect), two of them refused with 5.
    assert_eq!(m.log_count("Sending CONNACK to"), 4, "{}", m.log_text());
    assert_eq!(m.log_count(" (0, 5)"), 2, "{}", m.log_text());
}

#[test]
fn b3_identity_differs_uses_a_separate_connection() {
    if !have_tool("mosquitto", "MAM_REQUIRE_MOSQUITTO") {
        return;
    }
    let td = TestDir::new("b3");
    let m = Mosquitto::start(&td, anonymous);
    let a = cfg(&td, m.port, &[("MQTT_USERNAME", "alice-user")]);
    let b = cfg(&td, m.port, &[("MQTT_USERNAME", "bob-user")]);
    let mut sub = connect(&a, Role::Sub);
    sub.subscribe(&["b3/#".to_string()], 1).unwrap();

    let mut p = Persistent::new(a.clone(), Role::Hb, Stop::never());
    p.publish(&a, &[Message::new("b3/a", "1", 1, false)]).unwrap();
    assert_eq!(p.identity_note(&a), None);
    let note = p.identity_note(&b).unwrap();
    assert_eq!(note, "NOTE: connection identity differs (username); using a separate connection");
    p.publish(&b, &[Message::new("b3/b", "2", 1, false)]).unwrap();
    p.publish(&a, &[Message::new("b3/c", "3", 1, false)]).unwrap();
    assert_eq!(p.connects(), 1, "the kept connection is reused for the matching identity");
    let got: Vec<String> = recv_n(&mut sub, 3).into_iter().map(|m| m.topic).collect();
    assert_eq!(got, ["b3/a", "b3/b", "b3/c"]);
    // Three connections reached the broker: the subscriber, the kept one and the one-shot.
    assert_eq!(m.log_count("New client connected"), 3, "{}", m.log_text());

    let tls = cfg(&td, m.port, &[("MQTT_USERNAME", "alice-user"), ("MQTT_TLS", "on")]);
    let note = p.identity_note(&tls).unwrap();
    assert_eq!(note, "NOTE: connection identity differs (tls); using a separate connection");
    assert!(!note.contains("alice") && !note.contains("true"));
    p.drop_connection();
}

#[test]
fn b4_dropped_persistent_connection_fails_once_then_reconnects() {
    if !have_tool("mosquitto", "MAM_REQUIRE_MOSQUITTO") {
        return;
    }
    let td = TestDir::new("b4");
    let mut m = Mosquitto::start(&td, anonymous);
    let c = cfg(&td, m.port, &[]);
    let mut p = Persistent::new(c.clone(), Role::Hb, Stop::never());
    p.publish(&c, &[Message::new("b4/x", "before", 1, false)]).unwrap();
    assert!(p.is_connected());

    m.restart();
    let mut sub = connect(&c, Role::Sub);
    sub.subscribe(&["b4/#".to_string()], 1).unwrap();
    let mut warnings = Vec::new();
    let r = mqtt::with_retry(
        &fast("publish"),
        &Stop::never(),
        |w| warnings.push(w),
        |_| p.publish(&c, &[Message::new("b4/x", "after", 1, false)]),
    );
    r.unwrap_or_else(|e| panic!("publish after the drop: {e}"));
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].starts_with("WARNING: publish attempt 1/3 failed (not connected to broker 127.0.0.1:"),
        "{warnings:?}"
    );
    assert!(warnings[0].ends_with("; retrying in 100ms"), "{warnings:?}");
    assert_eq!(p.connects(), 2);
    assert_eq!(recv_n(&mut sub, 1)[0].payload, b"after");
}

#[test]
fn b5_connack_4_is_a_single_attempt_and_rc_3() {
    let fake = FakeBroker::start(Fake::Connack(4));
    let td = TestDir::new("b5");
    let c = cfg(&td, fake.port, &[]);
    let (r, warnings, attempts) = publish_counting(&c, &Message::new("b5", "x", 1, false));
    let e = r.unwrap_err();
    assert!(matches!(e, MqttError::ConnackRefused { code: 4, .. }), "{e}");
    assert!(e.to_string().contains("CONNACK 4 (bad user name or password)"), "{e}");
    assert_eq!((attempts, warnings.len(), fake.accepts()), (1, 0, 1));

    let run = td.mam().args(["pub", "-t", "b5", "-m", "x", "-q", "1", "-p", &fake.port.to_string()]).run();
    run.expect_rc(3);
    assert_eq!(run.stderr().lines().count(), 1, "{}", run.stderr());
    assert!(run.stderr().starts_with("ERROR: broker 127.0.0.1:"), "{}", run.stderr());
    assert_eq!(fake.accepts(), 2);
}

#[test]
fn b6_silent_listener_gives_no_connack_per_attempt() {
    let fake = FakeBroker::start(Fake::Silent);
    let td = TestDir::new("b6");
    let c = cfg(&td, fake.port, &[("MAM_MQTT_CONNECT_TIMEOUT_S", "1")]);
    let mut starts = Vec::new();
    let mut warnings = Vec::new();
    let t0 = Instant::now();
    let r: Result<(), MqttError> = mqtt::with_retry(
        &fast("publish"),
        &Stop::never(),
        |w| warnings.push(w),
        |_| {
            starts.push(t0.elapsed());
            Client::connect(&c, Role::Pub, &Stop::never()).map(|_| ())
        },
    );
    let total = t0.elapsed();
    let e = r.unwrap_err();
    assert!(e.to_string().starts_with("no CONNACK from broker 127.0.0.1:"), "{e}");
    assert_eq!(starts.len(), 3);
    assert_eq!(warnings.len(), 2);
    assert!(warnings.iter().all(|w| w.contains("(no CONNACK from broker")), "{warnings:?}");
    // Each attempt lasts about one connect timeout (1 s); the waits are 0.1 s and 0.2 s.
    let gaps = [starts[1] - starts[0], starts[2] - starts[1], total - starts[2]];
    for g in gaps {
        assert!(g >= Duration::from_millis(950) && g < Duration::from_millis(1800), "{gaps:?}");
    }
    assert_eq!(fake.accepts(), 3);
}

/// A throwaway CA and server certificates made with openssl in `dir`.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn new(dir: &Path) -> Pki {
        std::fs::create_dir_all(dir).unwrap();
        Pki { dir: dir.to_path_buf() }
    }

    fn openssl(&self, args: &[&str]) {
        let out = Command::new("openssl").args(args).current_dir(&self.dir).output().unwrap();
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    fn ca(&self, name: &str) -> PathBuf {
        let (key, crt) = (format!("{name}.key"), format!("{name}.crt"));
        self.openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &crt,
            "-days",
            "2",
            "-subj",
            &format!("/CN={name}"),
        ]);
        self.dir.join(crt)
    }

    /// A server certificate signed by `ca` with the given subjectAltName; returns (cert, key).
    fn server(&self, name: &str, ca: &str, san: &str) -> (PathBuf, PathBuf) {
        let (key, csr, crt, ext) =
            (format!("{name}.key"), format!("{name}.csr"), format!("{name}.crt"), format!("{name}.ext"));
        std::fs::write(self.dir.join(&ext), format!("subjectAltName={san}\n")).unwrap();
        self.openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &format!("/CN={name}"),
        ]);
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &format!("{ca}.crt"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "2",
            "-extfile",
            &ext,
        ]);
        (self.dir.join(crt), self.dir.join(key))
    }
}

/// A TLS test's start when mosquitto and openssl are there (`None`, the skip, when they are not and
/// no MAM_REQUIRE_* asks for them): the test's directory and a PKI in it with the CA `ca` (its
/// certificate is `ca`) and a second CA, `wrong_ca`, that signs nothing the broker serves.
struct Tls {
    td: TestDir,
    pki: Pki,
    ca: PathBuf,
    wrong_ca: PathBuf,
}

impl Tls {
    fn new(name: &str) -> Option<Tls> {
        if !have_tool("mosquitto", "MAM_REQUIRE_MOSQUITTO") || !have_tool("openssl", "MAM_REQUIRE_OPENSSL") {
            return None;
        }
        let td = TestDir::new(name);
        let pki = Pki::new(&td.path("pki"));
        let ca = pki.ca("ca");
        let wrong_ca = pki.ca("wrongca");
        Some(Tls { td, pki, ca, wrong_ca })
    }
}

/// A mosquitto TLS listener on 127.0.0.1:`port` serving `cert` (certificate, key) with the CA file `ca`.
fn tls_listener(port: u16, ca: &Path, cert: &(PathBuf, PathBuf)) -> String {
    format!(
        "listener {port} 127.0.0.1\ncafile {}\ncertfile {}\nkeyfile {}\n",
        ca.display(),
        cert.0.display(),
        cert.1.display()
    )
}

#[test]
fn b7_tls_through_the_openssl_shim() {
    let Some(Tls { td, pki, ca, wrong_ca }) = Tls::new("b7") else { return };
    let by_name = pki.server("byname", "ca", "DNS:localhost");
    let by_ip = pki.server("byip", "ca", "IP:127.0.0.1");
    let ip_port = free_port();
    let m = Mosquitto::start(&td, |p| {
        format!("allow_anonymous true\n{}{}", tls_listener(p, &ca, &by_name), tls_listener(ip_port, &ca, &by_ip))
    });
    wait_until("the second TLS listener", Duration::from_secs(5), || {
        TcpStream::connect(("127.0.0.1", ip_port)).is_ok()
    });
    let ca_s = ca.display().to_string();
    let wrong_s = wrong_ca.display().to_string();
    let tls = |host: &str, port: u16, ca: &str| {
        cfg(&td, port, &[("MQTT_TLS", "1"), ("MQTT_BROKER", host), ("MQTT_CA_FILE", ca)])
    };

    // Good CA, by host name and by IP (A22), including bytes that s_client would treat as commands.
    for (host, port) in [("localhost", m.port), ("127.0.0.1", ip_port)] {
        let c = tls(host, port, &ca_s);
        let mut sub = connect(&c, Role::Sub);
        sub.subscribe(&["b7/#".to_string()], 1).unwrap();
        let payload = b"Q\nR\n\0binary\nQ".to_vec();
        let (r, warnings, attempts) = publish_counting(&c, &Message::new("b7/t", payload.clone(), 1, false));
        r.unwrap_or_else(|e| panic!("TLS publish to {host}: {e}"));
        assert_eq!((attempts, warnings.len()), (1, 0));
        assert_eq!(recv_n(&mut sub, 1)[0].payload, payload);
        sub.disconnect();
    }

    // Wrong CA, an IP the certificate does not name, a host name the certificate does not name:
    // one attempt each, a verification error.
    for (host, port, ca) in
        [("localhost", m.port, &wrong_s), ("127.0.0.1", m.port, &ca_s), ("localhost", ip_port, &ca_s)]
    {
        let (r, warnings, attempts) = publish_counting(&tls(host, port, ca), &Message::new("b7/t", "x", 1, false));
        let e = r.unwrap_err();
        assert!(matches!(e, MqttError::TlsVerify { .. }), "{host}: {e}");
        assert!(e.to_string().starts_with(&format!("TLS verification failed for {host}:{port}: ")), "{e}");
        assert!(e.to_string().contains("verify error") || e.to_string().contains("Verify return code"), "{e}");
        assert_eq!((attempts, warnings.len()), (1, 0));
    }

    // No openssl: a clear error, no retry.
    let mut c = tls("localhost", m.port, &ca_s);
    c.openssl = "/nonexistent/openssl".into();
    let (r, warnings, attempts) = publish_counting(&c, &Message::new("b7/t", "x", 1, false));
    let e = r.unwrap_err();
    assert!(matches!(e, MqttError::OpensslNotFound { .. }), "{e}");
    assert!(e.to_string().contains("'/nonexistent/openssl' was not found"), "{e}");
    assert_eq!((attempts, warnings.len()), (1, 0));

    // The CLI over TLS: a retained publish read back by `mam sub`; MAM_OPENSSL=/nonexistent is rc 3 at once.
    let port = m.port.to_string();
    let env = [("MQTT_TLS", "yes"), ("MQTT_BROKER", "localhost"), ("MQTT_PORT", &port), ("MQTT_CA_FILE", &ca_s)];
    let mut run = td.mam().args(["pub", "-t", "b7/cli", "-m", "over tls", "-r", "-q", "1"]);
    for (k, v) in env {
        run = run.env(k, v);
    }
    run.run().expect_rc(0);
    let mut run = td.mam().args(["sub", "-t", "b7/cli", "-C", "1", "-W", "10"]);
    for (k, v) in env {
        run = run.env(k, v);
    }
    let r = run.run();
    r.expect_rc(0);
    assert_eq!(r.stdout(), "over tls\n");
    let mut run = td.mam().args(["pub", "-t", "b7/cli", "-m", "x"]).env("MAM_OPENSSL", "/nonexistent");
    for (k, v) in env {
        run = run.env(k, v);
    }
    let r = run.run();
    r.expect_rc(3);
    assert!(!r.stderr().contains("WARNING") && r.stderr().contains("/nonexistent"), "{}", r.stderr());
}

#[test]
fn b8_keepalive_keeps_an_idle_connection_alive() {
    if !have_tool("mosquitto", "MAM_REQUIRE_MOSQUITTO") {
        return;
    }
    let td = TestDir::new("b8");
    let m = Mosquitto::start(&td, anonymous);
    let c = cfg(&td, m.port, &[("MAM_MQTT_KEEPALIVE_S", "2")]);
    let mut idle = connect(&c, Role::Sub);
    idle.subscribe(&["b8/#".to_string()], 1).unwrap();
    // mosquitto drops a client silent for 1.5 x keepalive (3 s); 5 s idle needs PINGREQs.
    idle.service(Instant::now() + Duration::from_secs(5)).unwrap();
    let pings = m.log_count(&format!("Received PINGREQ from {}", idle.client_id()));
    assert!(pings >= 3, "expected a PINGREQ about every second, saw {pings}\n{}", m.log_text());
    let mut publ = connect(&c, Role::Pub);
    publ.publish(&Message::new("b8/x", "still here", 1, false)).unwrap();
    assert_eq!(recv_n(&mut idle, 1)[0].payload, b"still here");
}

#[test]
fn b8_missing_pingresp_means_connection_lost() {
    let fake = FakeBroker::start(Fake::Connack(0));
    let td = TestDir::new("b8b");
    let c = cfg(&td, fake.port, &[("MAM_MQTT_KEEPALIVE_S", "1")]);
    let mut client = connect(&c, Role::Sub);
    let t0 = Instant::now();
    let e = client.service(Instant::now() + Duration::from_secs(5)).unwrap_err();
    assert!(matches!(e, MqttError::Timeout { phase: "pingresp", .. }), "{e}");
    assert!(e.to_string().starts_with("pingresp timeout"), "{e}");
    assert!(e.retryable());
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
}

#[test]
fn b9_hundred_connections_have_unique_short_ids() {
    let Some(b) = TARGETS.iter().find_map(|&t| start_target(t, &TestDir::new("b9"))) else {
        return;
    };
    let td = TestDir::new("b9c");
    let c = cfg(&td, b.port(), &[]);
    let mut ids = std::collections::HashSet::new();
    for i in 0..100 {
        let role = [Role::Pub, Role::Hb, Role::Sub, Role::Dmn, Role::Rmt, Role::Dsp][i % 6];
        let client = connect(&c, role);
        let id = client.client_id().to_string();
        assert!(id.len() <= 23 && id.starts_with(&format!("mam-{}-", role.as_str())), "{id}");
        assert!(ids.insert(id.clone()), "duplicate {id}");
        client.disconnect();
    }
}

// ---------------------------------------------------------------------------------------------
// K10: the CLI tools next to mosquitto's

fn spawn_mam(td: &TestDir, port: u16, args: &[&str]) -> ChildGuard {
    let mut cmd = td.mam().args(args).env("MQTT_PORT", port.to_string()).cmd;
    cmd.stdout(Stdio::piped()).stderr(Stdio::null());
    ChildGuard(cmd.spawn().unwrap())
}

#[test]
fn k10_mam_pub_and_sub_interoperate_with_mosquitto_clients() {
    if !have_tool("mosquitto", "MAM_REQUIRE_MOSQUITTO") || !have_tool("mosquitto_sub", "MAM_REQUIRE_MOSQUITTO") {
        return;
    }
    let td = TestDir::new("k10");
    let m = Mosquitto::start(&td, anonymous);
    let port = m.port.to_string();
    let wait_subscribes = |n: usize| {
        wait_until("a SUBSCRIBE at the broker", Duration::from_secs(10), || m.log_count("Received SUBSCRIBE") >= n);
    };

    // mam pub -> mosquitto_sub
    let mut ms = Command::new("mosquitto_sub");
    ms.args(["-p", &port, "-t", "k10/a", "-C", "1", "-v"]).stdout(Stdio::piped()).stderr(Stdio::null());
    let ms = ChildGuard(ms.spawn().unwrap());
    wait_subscribes(1);
    td.mam().args(["pub", "-t", "k10/a", "-m", "from mam", "-q", "1"]).env("MQTT_PORT", &port).run().expect_rc(0);
    assert_eq!(ms.finish(Duration::from_secs(10)), (0, "k10/a from mam\n".to_string()));

    // mosquitto_pub -> mam sub (two filters, -v, -C 2)
    let ours = spawn_mam(&td, m.port, &["sub", "-t", "k10/b", "-t", "k10/c/+", "-v", "-C", "2", "-W", "20"]);
    wait_subscribes(2);
    for (t, msg) in [("k10/b", "one"), ("k10/c/d", "two words")] {
        let st = Command::new("mosquitto_pub").args(["-p", &port, "-t", t, "-m", msg, "-q", "1"]).status().unwrap();
        assert!(st.success());
    }
    assert_eq!(ours.finish(Duration::from_secs(10)), (0, "k10/b one\nk10/c/d two words\n".to_string()));

    // mam pub -> mam sub, retained, payload only; then -W expiry is rc 27.
    td.mam().args(["pub", "-t", "k10/r", "-m", "kept", "-r"]).env("MQTT_PORT", &port).run().expect_rc(0);
    let r = td.mam().args(["sub", "-t", "k10/r", "-C", "1"]).env("MQTT_PORT", &port).run();
    r.expect_rc(0);
    assert_eq!(r.stdout(), "kept\n");
    let r = td.mam().args(["sub", "-t", "k10/none", "-W", "1"]).env("MQTT_PORT", &port).run();
    r.expect_rc(27);
    assert!(r.elapsed < Duration::from_secs(3), "{:?}", r.elapsed);
}

#[test]
fn k10_pub_and_sub_usage_errors() {
    let td = TestDir::new("k10u");
    for args in [
        &["pub", "-m", "x"][..],
        &["pub", "-t", "a/#", "-m", "x"],
        &["pub", "-t", "a", "-m", "x", "-q", "2"],
        &["sub"],
        &["sub", "-t", "a/#/b"],
        &["sub", "-t", "a", "-C", "0"],
    ] {
        let r = td.mam().args(args).run();
        r.expect_rc(2);
        assert!(r.stderr().starts_with("ERROR: "), "{args:?}: {}", r.stderr());
    }
    let r = td.mam().args(["pub", "-t", "a", "-m", "x"]).env("MQTT_TLS", "maybe").run();
    r.expect_rc(2);
    assert!(r.stderr().contains("MQTT_TLS"));
    for cmd in ["pub", "sub"] {
        let r = td.mam().args([cmd, "--help"]).run();
        r.expect_rc(0);
        assert!(r.stdout().starts_with(&format!("Usage: mam {cmd} ")), "{}", r.stdout());
    }
}

#[test]
fn b4_persistent_subscriber_resubscribes_after_a_drop() {
    if !have_tool("mosquitto", "MAM_REQUIRE_MOSQUITTO") {
        return;
    }
    let td = TestDir::new("b4s");
    let mut m = Mosquitto::start(&td, anonymous);
    let c = cfg(&td, m.port, &[]);
    let mut p = Persistent::new(c.clone(), Role::Dmn, Stop::never());
    p.subscribe(&["b4s/#".to_string()], 1).unwrap();
    m.restart();
    let e = p.recv(Instant::now() + Duration::from_secs(2)).unwrap_err();
    assert!(e.retryable(), "{e}");
    // The next operation reconnects and subscribes again before waiting.
    let mut got = None;
    let mut publ = connect(&c, Role::Pub);
    wait_until("the resubscribed connection to deliver", Duration::from_secs(10), || {
        publ.publish(&Message::new("b4s/x", "again", 1, false)).unwrap();
        got = p.recv(Instant::now() + Duration::from_millis(300)).unwrap();
        got.is_some()
    });
    assert_eq!(got.unwrap().payload, b"again");
    assert_eq!(p.connects(), 2);
}

#[test]
fn stop_flag_is_seen_within_a_read_slice() {
    let fake = FakeBroker::start(Fake::Silent);
    let td = TestDir::new("stop");
    let c = cfg(&td, fake.port, &[("MAM_MQTT_CONNECT_TIMEOUT_S", "10")]);
    let flag = Arc::new(AtomicBool::new(false));
    let f2 = Arc::clone(&flag);
    let setter = std::thread::spawn(move || {
        // The scenario: the flag is raised 300 ms into the CONNACK wait (a deliberate delay).
        std::thread::sleep(Duration::from_millis(300));
        f2.store(true, Ordering::SeqCst);
    });
    let t0 = Instant::now();
    let r = Client::connect(&c, Role::Sub, &Stop::flag(flag));
    setter.join().unwrap();
    assert!(matches!(r, Err(MqttError::Stopped)));
    assert!(t0.elapsed() < Duration::from_millis(700), "{:?}", t0.elapsed());
}

/// B4 on the embedded broker with its drop hook (A30: tests needing broker hooks use it).
#[test]
fn b4_embedded_drop_connections_fails_once_then_reconnects() {
    let td = TestDir::new("b4e");
    let b = embedded();
    let c = cfg(&td, b.addr().port(), &[]);
    let mut p = Persistent::new(c.clone(), Role::Hb, Stop::never());
    p.publish(&c, &[Message::new("b4/x", "before", 1, false)]).unwrap();
    b.drop_connections();
    // The drop is seen by the persistent client's next operation, not before.
    wait_until("the broker to forget the client", Duration::from_secs(5), || b.clients().is_empty());
    let mut warnings = Vec::new();
    mqtt::with_retry(
        &fast("publish"),
        &Stop::never(),
        |w| warnings.push(w),
        |_| p.publish(&c, &[Message::new("b4/x", "after", 1, false)]),
    )
    .unwrap_or_else(|e| panic!("publish after the drop: {e}"));
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("not connected to broker"), "{warnings:?}");
    assert_eq!(p.connects(), 2);
    let got: Vec<Vec<u8>> = b.received().into_iter().filter(|(t, _, _)| t == "b4/x").map(|(_, p, _)| p).collect();
    assert_eq!(got, vec![b"before".to_vec(), b"after".to_vec()]);
}

/// K1: `mam pub` and `mam sub` against `mam broker` run as a process, both started by the test in
/// the same workspace: the clients find the broker's generated credentials with no configuration.
#[test]
fn k1_mam_pub_and_sub_against_mam_broker_process() {
    let td = TestDir::new("k1p");
    let broker = crate::broker::BrokerProc::start(&td, &[]);
    let ps = broker.port();
    td.mam().args(["pub", "-t", "k1/r", "-m", "kept", "-r", "-q", "1"]).env("MQTT_PORT", &ps).run().expect_rc(0);
    let r = td.mam().args(["sub", "-t", "k1/#", "-v", "-C", "1", "-W", "10"]).env("MQTT_PORT", &ps).run();
    r.expect_rc(0);
    assert_eq!(r.stdout(), "k1/r kept\n");
    drop(broker);
}

/// A scripted broker for `subscribe_each`: CONNACK 0 to every CONNECT, SUBACK 0x80 to the first
/// `refusals` SUBSCRIBEs and QoS 1 to the rest; counts connections and SUBSCRIBEs. Joined on drop.
struct Refuser {
    port: u16,
    conns: Arc<std::sync::atomic::AtomicUsize>,
    subscribes: Arc<std::sync::atomic::AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Refuser {
    fn start(refusals: usize) -> Refuser {
        use std::io::Write;
        let (listener, port) = loopback_listener();
        listener.set_nonblocking(true).unwrap();
        let conns = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let subscribes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (c2, s2, st2) = (conns.clone(), subscribes.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !st2.load(Ordering::SeqCst) {
                let Ok((mut s, _)) = listener.accept() else {
                    // The fake's own accept loop, until the drop: this paces it, it awaits nothing.
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                c2.fetch_add(1, Ordering::SeqCst);
                s.set_nonblocking(false).unwrap();
                s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
                let mut buf = Vec::new();
                'conn: while !st2.load(Ordering::SeqCst) {
                    let mut chunk = [0u8; 1024];
                    match s.read(&mut chunk) {
                        Ok(0) => break,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        Err(_) => continue,
                    }
                    // Whole packets: type byte, remaining length (one byte suffices here), body.
                    while buf.len() >= 2 && buf.len() >= 2 + buf[1] as usize {
                        let (kind, body) = (buf[0] & 0xf0, buf[2..2 + buf[1] as usize].to_vec());
                        buf.drain(..2 + body.len());
                        let reply = match kind {
                            0x10 => vec![0x20, 2, 0, 0],
                            0x80 => {
                                let n = s2.fetch_add(1, Ordering::SeqCst);
                                let (mut i, mut codes) = (2, Vec::new());
                                while i + 2 <= body.len() {
                                    i += 2 + usize::from(u16::from_be_bytes([body[i], body[i + 1]])) + 1;
                                    codes.push(if n < refusals { 0x80 } else { 1 });
                                }
                                [vec![0x90, 2 + codes.len() as u8, body[0], body[1]], codes].concat()
                            }
                            0xc0 => vec![0xd0, 0],
                            _ => break 'conn, // DISCONNECT
                        };
                        if s.write_all(&reply).is_err() {
                            break 'conn;
                        }
                    }
                }
            }
        });
        Refuser { port, conns, subscribes, stop, thread: Some(thread) }
    }
}

impl Drop for Refuser {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Issue 19: a long-lived subscriber's filter refused (SUBACK 0x80) and granted when asked again
/// on the same connection, as NATS 2.9 does while a crashed peer is still part of new consumers'
/// groups, is subscribed without a new connection, each filter in its own SUBSCRIBE; a filter
/// that stays refused fails once its patience (one connect timeout) is spent.
#[test]
fn a_filter_refused_then_granted_is_asked_again_on_the_same_connection() {
    let cfg = |port: u16| {
        let vars = [("MQTT_BROKER", format!("127.0.0.1:{port}")), ("MAM_MQTT_CONNECT_TIMEOUT_S", "2".into())];
        MqttConfig::from_ctx(&Ctx::with_env(vars, Path::new("/"))).unwrap()
    };
    let r = Refuser::start(2);
    let mut p = Persistent::new(cfg(r.port), Role::Sub, Stop::never());
    let granted = p.subscribe(&["a/b".to_string(), "c/d".to_string()], 1).expect("granted the third time");
    assert_eq!(granted, [1, 1]);
    assert_eq!(r.conns.load(Ordering::SeqCst), 1, "one connection");
    assert_eq!(r.subscribes.load(Ordering::SeqCst), 4, "a/b asked three times, c/d once");
    p.drop_connection();
    let never = Refuser::start(usize::MAX);
    let mut p = Persistent::new(cfg(never.port), Role::Sub, Stop::never());
    let t = Instant::now();
    match p.subscribe(&["a/b".to_string()], 1) {
        Err(MqttError::SubackRefused { filter }) => assert_eq!(filter, "a/b"),
        other => panic!("expected the refusal, got {other:?}"),
    }
    assert!(t.elapsed() >= Duration::from_secs(1) && t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
}

/// Issue 19: `mam broker check` connects as every command does, TLS through the shim included: with
/// the broker's CA the node passes (one node for the name: the shim resolves it and checks the
/// certificate against it); with another CA it fails with the verification error, and the check
/// says no node passed.
#[test]
fn broker_check_over_tls_passes_with_the_ca_and_fails_with_another() {
    let Some(Tls { td, pki, ca, wrong_ca }) = Tls::new("chk-tls") else { return };
    let by_name = pki.server("byname", "ca", "DNS:localhost");
    let m = Mosquitto::start(&td, |p| format!("allow_anonymous true\n{}", tls_listener(p, &ca, &by_name)));
    let check = |ca: &Path| {
        td.mam()
            .env("MQTT_TLS", "1")
            .env("MQTT_BROKER", format!("localhost:{}", m.port))
            .env("MQTT_CA_FILE", ca)
            .env("MAM_MQTT_CONNECT_TIMEOUT_S", "5")
            .args(["broker", "check"])
            .run_within(Duration::from_secs(30))
    };
    let r = check(&ca);
    assert_eq!(r.rc(), 0, "{}{}", r.stdout(), r.stderr());
    assert!(r.stdout().starts_with(&format!("node localhost:{}\n", m.port)), "{}", r.stdout());
    assert!(r.stdout().contains("Engine: mosquitto "), "{}", r.stdout());
    let r = check(&wrong_ca);
    assert_eq!(r.rc(), 3, "{}{}", r.stdout(), r.stderr());
    assert!(r.stdout().contains("  Did not connect: ") && r.stdout().contains("verif"), "{}", r.stdout());
}
