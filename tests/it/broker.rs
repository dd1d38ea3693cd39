//! Integration tests: the embedded broker (CORE 11.3, K1-K9) over real sockets.
//!
//! A small raw-socket client (packets encoded and decoded with mqttrs) drives the in-process broker;
//! `mosquitto_pub`/`mosquitto_sub` drive the `mam broker` binary (K1); `same_on_both!` runs one
//! scenario against the embedded broker and a real mosquitto and requires the same transcript.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use mam::broker::{self, BrokerConfig, BrokerHandle};
use mqttrs::{QoS, SubscribeReturnCodes};

use crate::support::{have_tool, rand_hex, wait_until, TestDir};

const WAIT: Duration = Duration::from_secs(5);

fn cfg() -> BrokerConfig {
    BrokerConfig { bind: "127.0.0.1:0".parse().unwrap(), ..BrokerConfig::default() }
}

fn start() -> BrokerHandle {
    broker::start(cfg()).unwrap()
}

fn has_log(b: &BrokerHandle, needle: &str) -> bool {
    b.log_lines().iter().any(|l| l.contains(needle))
}

fn wait_log(b: &BrokerHandle, needle: &str) {
    wait_until(&format!("broker log line containing {needle:?}"), WAIT, || has_log(b, needle));
    let line = b.log_lines().into_iter().find(|l| l.contains(needle)).unwrap();
    assert!(!line.contains('\n'), "log lines are one line: {line:?}");
}

// ---------------------------------------------------------------------------------------------
// A raw MQTT test client

/// A packet from the broker, owned.
#[derive(Debug, Clone, PartialEq)]
enum Got {
    Connack { session_present: bool, code: u8 },
    Suback(Vec<u8>),
    Unsuback,
    Publish { topic: String, payload: Vec<u8>, qos: u8, retain: bool, pid: u16 },
    Puback(u16),
    Pingresp,
    Other(String),
}

#[derive(Debug, PartialEq)]
enum Next {
    Packet(Got),
    Closed,
    Timeout,
}

struct Raw {
    s: TcpStream,
    buf: Vec<u8>,
    pid: u16,
}

fn encode(p: &mqttrs::Packet) -> Vec<u8> {
    let mut buf = vec![0u8; 2 * 1024 * 1024];
    let n = mqttrs::encode_slice(p, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

fn connect_bytes(id: &str, keep_alive: u16, clean: bool, user: Option<&str>, pass: Option<&[u8]>) -> Vec<u8> {
    encode(&mqttrs::Packet::Connect(mqttrs::Connect {
        protocol: mqttrs::Protocol::MQTT311,
        keep_alive,
        client_id: id,
        clean_session: clean,
        last_will: None,
        username: user,
        password: pass,
    }))
}

fn qos_of(q: u8) -> QoS {
    match q {
        0 => QoS::AtMostOnce,
        1 => QoS::AtLeastOnce,
        _ => QoS::ExactlyOnce,
    }
}

impl Raw {
    fn open(addr: SocketAddr) -> Raw {
        let s = TcpStream::connect_timeout(&addr, WAIT).unwrap();
        s.set_nodelay(true).unwrap();
        Raw { s, buf: Vec::new(), pid: 0 }
    }

    /// Connects with CleanSession=1 and keepalive 60, expecting CONNACK 0.
    fn connect(addr: SocketAddr, id: &str) -> Raw {
        let (r, code) = Raw::connect_with(addr, &connect_bytes(id, 60, true, None, None));
        assert_eq!(code, 0, "CONNACK for {id}");
        r
    }

    /// Sends `connect` as the first packet; returns the CONNACK code.
    fn connect_with(addr: SocketAddr, connect: &[u8]) -> (Raw, u8) {
        let mut r = Raw::open(addr);
        r.send(connect);
        match r.next(WAIT) {
            Next::Packet(Got::Connack { code, .. }) => (r, code),
            other => panic!("expected CONNACK, got {other:?}"),
        }
    }

    fn send(&mut self, bytes: &[u8]) {
        // A broker that already closed may reset the connection; the reads report it.
        let _ = self.s.write_all(bytes);
    }

    fn next_pid(&mut self) -> u16 {
        self.pid += 1;
        self.pid
    }

    /// The next packet within `within`, or Closed / Timeout.
    fn next(&mut self, within: Duration) -> Next {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(p)) = mqttrs::decode_slice(&self.buf) {
                let got = match p {
                    mqttrs::Packet::Connack(c) => {
                        let code = match c.code {
                            mqttrs::ConnectReturnCode::Accepted => 0,
                            mqttrs::ConnectReturnCode::RefusedProtocolVersion => 1,
                            mqttrs::ConnectReturnCode::RefusedIdentifierRejected => 2,
                            mqttrs::ConnectReturnCode::ServerUnavailable => 3,
                            mqttrs::ConnectReturnCode::BadUsernamePassword => 4,
                            mqttrs::ConnectReturnCode::NotAuthorized => 5,
                        };
                        Got::Connack { session_present: c.session_present, code }
                    }
                    mqttrs::Packet::Suback(s) => Got::Suback(
                        s.return_codes
                            .iter()
                            .map(|c| match c {
                                SubscribeReturnCodes::Success(QoS::AtMostOnce) => 0,
                                SubscribeReturnCodes::Success(QoS::AtLeastOnce) => 1,
                                SubscribeReturnCodes::Success(QoS::ExactlyOnce) => 2,
                                SubscribeReturnCodes::Failure => 0x80,
                            })
                            .collect(),
                    ),
                    mqttrs::Packet::Unsuback(_) => Got::Unsuback,
                    mqttrs::Packet::Publish(p) => Got::Publish {
                        topic: p.topic_name.to_string(),
                        payload: p.payload.to_vec(),
                        qos: match p.qospid.qos() {
                            QoS::AtMostOnce => 0,
                            QoS::AtLeastOnce => 1,
                            QoS::ExactlyOnce => 2,
                        },
                        retain: p.retain,
                        pid: p.qospid.pid().map(|p| p.get()).unwrap_or(0),
                    },
                    mqttrs::Packet::Puback(p) => Got::Puback(p.get()),
                    mqttrs::Packet::Pingresp => Got::Pingresp,
                    other => Got::Other(format!("{other:?}")),
                };
                let (len, hlen) = header_len(&self.buf);
                self.buf.drain(..len + hlen);
                return Next::Packet(got);
            }
            let now = Instant::now();
            if now >= deadline {
                return Next::Timeout;
            }
            self.s.set_read_timeout(Some((deadline - now).max(Duration::from_millis(1)))).unwrap();
            let mut chunk = [0u8; 65536];
            match self.s.read(&mut chunk) {
                Ok(0) => return Next::Closed,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    return Next::Timeout
                }
                Err(_) => return Next::Closed,
            }
        }
    }

    /// The next packet, which must arrive within the default wait.
    fn expect(&mut self) -> Got {
        match self.next(WAIT) {
            Next::Packet(p) => p,
            other => panic!("expected a packet, got {other:?}"),
        }
    }

    /// The next PUBLISH, acknowledging QoS 1 ones; returns a one-line description.
    fn expect_publish(&mut self) -> String {
        match self.expect() {
            Got::Publish { topic, payload, qos, retain, pid } => {
                if qos == 1 {
                    self.send(&encode(&mqttrs::Packet::Puback(mqttrs::Pid::try_from(pid).unwrap())));
                }
                format!("publish {topic} {:?} q{qos} r{}", String::from_utf8_lossy(&payload), u8::from(retain))
            }
            other => panic!("expected PUBLISH, got {other:?}"),
        }
    }

    /// Waits for the broker to close the connection.
    fn expect_closed(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            match self.next(deadline.saturating_duration_since(Instant::now())) {
                Next::Closed => return,
                Next::Timeout => panic!("connection still open after {within:?}"),
                Next::Packet(_) => {}
            }
        }
    }

    fn subscribe(&mut self, filters: &[(&str, u8)]) -> Vec<u8> {
        let pid = mqttrs::Pid::try_from(self.next_pid()).unwrap();
        let topics = filters
            .iter()
            .map(|(f, q)| mqttrs::SubscribeTopic { topic_path: f.to_string(), qos: qos_of(*q) })
            .collect();
        self.send(&encode(&mqttrs::Packet::Subscribe(mqttrs::Subscribe::new(pid, topics))));
        match self.expect() {
            Got::Suback(codes) => codes,
            other => panic!("expected SUBACK, got {other:?}"),
        }
    }

    fn unsubscribe(&mut self, filters: &[&str]) {
        let pid = mqttrs::Pid::try_from(self.next_pid()).unwrap();
        let topics = filters.iter().map(|f| f.to_string()).collect();
        self.send(&encode(&mqttrs::Packet::Unsubscribe(mqttrs::Unsubscribe::new(pid, topics))));
        assert_eq!(self.expect(), Got::Unsuback);
    }

    /// Publishes; for QoS 1 waits for the matching PUBACK.
    fn publish(&mut self, topic: &str, payload: &[u8], qos: u8, retain: bool) {
        let pid = self.next_pid();
        let qospid = match qos {
            0 => mqttrs::QosPid::AtMostOnce,
            1 => mqttrs::QosPid::AtLeastOnce(mqttrs::Pid::try_from(pid).unwrap()),
            _ => mqttrs::QosPid::ExactlyOnce(mqttrs::Pid::try_from(pid).unwrap()),
        };
        let p = mqttrs::Packet::Publish(mqttrs::Publish { dup: false, qospid, retain, topic_name: topic, payload });
        self.send(&encode(&p));
        if qos == 1 {
            match self.expect() {
                Got::Puback(p) => assert_eq!(p, pid),
                other => panic!("expected PUBACK, got {other:?}"),
            }
        }
    }
}

fn header_len(buf: &[u8]) -> (usize, usize) {
    let mut len = 0usize;
    for i in 0..4 {
        let b = buf[1 + i];
        len |= ((b & 0x7f) as usize) << (7 * i);
        if b & 0x80 == 0 {
            return (len, 2 + i);
        }
    }
    unreachable!("checked by mqttrs")
}

// ---------------------------------------------------------------------------------------------
// A real mosquitto for comparisons

struct Mosquitto {
    child: Child,
    addr: SocketAddr,
    _dir: TestDir,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Mosquitto {
    fn start() -> Mosquitto {
        let dir = TestDir::new("mosquitto");
        for _ in 0..5 {
            let port = free_port();
            let conf = dir.write(
                "mosquitto.conf",
                format!("listener {port} 127.0.0.1\nallow_anonymous true\nuser root\npersistence false\n"),
            );
            let mut child = Command::new("mosquitto")
                .arg("-c")
                .arg(&conf)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
            let deadline = Instant::now() + WAIT;
            while Instant::now() < deadline {
                if child.try_wait().unwrap().is_some() {
                    break; // port taken meanwhile: try another
                }
                if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                    return Mosquitto { child, addr, _dir: dir };
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("mosquitto did not start");
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `scenario` against the embedded broker (its transcript must equal `want`) and, when
/// mosquitto is installed, against mosquitto (same transcript).
macro_rules! same_on_both {
    ($name:ident, $scenario:expr, $want:expr) => {
        #[test]
        fn $name() {
            let scenario: fn(SocketAddr) -> Vec<String> = $scenario;
            let b = start();
            let got = scenario(b.addr()).join("\n");
            eqnice!($want.join("\n"), got);
            if have_tool("mosquitto", "MAM_REQUIRE_MOSQUITTO") {
                let m = Mosquitto::start();
                let theirs = scenario(m.addr).join("\n");
                eqnice!(theirs, got);
            }
        }
    };
}

/// A unique topic prefix per scenario run (mosquitto is shared by nothing, but be safe).
fn prefix() -> String {
    format!("t{}", rand_hex(3))
}

/// Reads publishes until the one on `sentinel`; returns the others.
fn until_sentinel(c: &mut Raw, sentinel: &str) -> Vec<String> {
    let mut out = Vec::new();
    loop {
        let line = c.expect_publish();
        if line.starts_with(&format!("publish {sentinel} ")) {
            return out;
        }
        out.push(line);
    }
}

// ---------------------------------------------------------------------------------------------
// Scenarios run on both brokers

fn retained_scenario(addr: SocketAddr) -> Vec<String> {
    let p = prefix();
    let mut out = Vec::new();
    let mut pubr = Raw::connect(addr, &format!("{p}-pub"));
    pubr.publish(&format!("{p}/a/b"), b"one", 1, true);
    pubr.publish(&format!("{p}/a/b"), b"two", 1, true); // the last one per topic is kept
    pubr.publish(&format!("{p}/a/c"), b"three", 0, true);
    pubr.publish(&format!("{p}/a/d"), b"not retained", 1, false);
    pubr.publish(&format!("{p}/x"), b"wait", 1, false); // QoS 0 above is processed before this PUBACK
    let mut sub = Raw::connect(addr, &format!("{p}-sub"));
    out.push(format!("suback {:?}", sub.subscribe(&[(&format!("{p}/a/+"), 1)])));
    let mut retained = vec![sub.expect_publish(), sub.expect_publish()];
    retained.sort();
    out.extend(retained.into_iter().map(|l| l.replace(&p, "P")));
    pubr.publish(&format!("{p}/a/b"), b"live", 1, true);
    out.push(sub.expect_publish().replace(&p, "P"));
    assert_eq!(sub.next(Duration::from_millis(100)), Next::Timeout, "nothing else arrives");
    out
}

same_on_both!(
    k1_retained_delivery_same_as_mosquitto,
    retained_scenario,
    ["suback [1]", "publish P/a/b \"two\" q1 r1", "publish P/a/c \"three\" q0 r1", "publish P/a/b \"live\" q1 r0",]
);

/// K8's table (filter, topic); the expected match results are in the macro call.
const K8: &[(&str, &str)] = &[
    ("a/+/c", "a/b/c"),
    ("a/+/c", "a//c"),
    ("a/+/c", "a/b/d"),
    ("a/+/c", "a/b/c/d"),
    ("a/#", "a"),
    ("a/#", "a/b/c"),
    ("a/#", "ab"),
    ("#", "a/b"),
    ("#", "$SYS/x"),
    ("+/+", "a/b"),
    ("+/+", "/b"),
    ("+/+", "a"),
    ("+/+", "$SYS/x"),
    ("a//c", "a//c"),
    ("a//c", "a/b/c"),
    ("$q/+", "$q/x"),
];

fn wildcard_scenario(addr: SocketAddr) -> Vec<String> {
    let mut out = Vec::new();
    let mut pubr = Raw::connect(addr, &format!("{}-pub", prefix()));
    for (filter, topic) in K8 {
        // Prefix-free topics keep the `#` and `$` cases honest; a fresh client per case keeps
        // earlier subscriptions out of the way, and the sentinel shows nothing was skipped.
        let mut sub = Raw::connect(addr, &format!("{}-sub", prefix()));
        let sentinel = format!("sentinel/{}", rand_hex(4));
        assert_eq!(sub.subscribe(&[(filter, 0), (&sentinel, 0)]), vec![0, 0]);
        pubr.publish(topic, b"m", 1, false);
        pubr.publish(&sentinel, b"s", 1, false);
        let before = until_sentinel(&mut sub, &sentinel);
        let hit = before.iter().any(|l| l.starts_with(&format!("publish {topic} ")));
        out.push(format!("{filter} {topic} {hit}"));
    }
    out
}

same_on_both!(
    k8_wildcard_table_same_as_mosquitto,
    wildcard_scenario,
    [
        "a/+/c a/b/c true",
        "a/+/c a//c true",
        "a/+/c a/b/d false",
        "a/+/c a/b/c/d false",
        "a/# a true",
        "a/# a/b/c true",
        "a/# ab false",
        "# a/b true",
        "# $SYS/x false",
        "+/+ a/b true",
        "+/+ /b true",
        "+/+ a false",
        "+/+ $SYS/x false",
        "a//c a//c true",
        "a//c a/b/c false",
        "$q/+ $q/x true",
    ]
);

fn zero_length_retained_scenario(addr: SocketAddr) -> Vec<String> {
    let p = prefix();
    let t = format!("{p}/state");
    let mut out = Vec::new();
    let mut pubr = Raw::connect(addr, &format!("{p}-pub"));
    pubr.publish(&t, b"kept", 1, true);
    let mut early = Raw::connect(addr, &format!("{p}-early"));
    early.subscribe(&[(&t, 1)]);
    out.push(format!("early {}", early.expect_publish().replace(&p, "P")));
    pubr.publish(&t, b"", 1, true);
    out.push(format!("early {}", early.expect_publish().replace(&p, "P")));
    let mut late = Raw::connect(addr, &format!("{p}-late"));
    let sentinel = format!("{p}/sentinel");
    late.subscribe(&[(&t, 1), (&sentinel, 1)]);
    pubr.publish(&sentinel, b"s", 1, false);
    out.push(format!("late before sentinel: {:?}", until_sentinel(&mut late, &sentinel)));
    out
}

same_on_both!(
    k7_zero_length_retained_clears_same_as_mosquitto,
    zero_length_retained_scenario,
    ["early publish P/state \"kept\" q1 r1", "early publish P/state \"\" q1 r0", "late before sentinel: []"]
);

fn qos_and_unsubscribe_scenario(addr: SocketAddr) -> Vec<String> {
    let p = prefix();
    let mut out = Vec::new();
    let mut pubr = Raw::connect(addr, &format!("{p}-pub"));
    let mut s0 = Raw::connect(addr, &format!("{p}-s0"));
    let mut s1 = Raw::connect(addr, &format!("{p}-s1"));
    s0.subscribe(&[(&format!("{p}/#"), 0)]);
    s1.subscribe(&[(&format!("{p}/#"), 1)]);
    pubr.publish(&format!("{p}/q1"), b"a", 1, false);
    pubr.publish(&format!("{p}/q0"), b"b", 0, false);
    for (name, c) in [("s0", &mut s0), ("s1", &mut s1)] {
        out.push(format!("{name} {}", c.expect_publish().replace(&p, "P")));
        out.push(format!("{name} {}", c.expect_publish().replace(&p, "P")));
    }
    s1.unsubscribe(&[&format!("{p}/#")]);
    let sentinel = format!("{p}-sentinel");
    s1.subscribe(&[(&sentinel, 0)]);
    pubr.publish(&format!("{p}/after"), b"c", 1, false);
    pubr.publish(&sentinel, b"s", 1, false);
    out.push(format!("s1 after unsubscribe: {:?}", until_sentinel(&mut s1, &sentinel)));
    out
}

same_on_both!(
    k1_qos_min_and_unsubscribe_same_as_mosquitto,
    qos_and_unsubscribe_scenario,
    [
        "s0 publish P/q1 \"a\" q0 r0",
        "s0 publish P/q0 \"b\" q0 r0",
        "s1 publish P/q1 \"a\" q1 r0",
        "s1 publish P/q0 \"b\" q0 r0",
        "s1 after unsubscribe: []",
    ]
);

// ---------------------------------------------------------------------------------------------
// Embedded-broker behaviour (CORE 11.2)

fn raw_connect_level(level: u8) -> Vec<u8> {
    let name: &[u8] = if level == 3 { b"MQIsdp" } else { b"MQTT" };
    let mut body = vec![0, name.len() as u8];
    body.extend_from_slice(name);
    body.extend_from_slice(&[level, 0x02, 0, 60]);
    if level == 5 {
        body.push(0); // properties length
    }
    body.extend_from_slice(&[0, 2, b'c', b'x']);
    let mut out = vec![0x10, body.len() as u8];
    out.extend(body);
    out
}

#[test]
fn k2_other_protocol_levels_get_0x01() {
    let b = start();
    for level in [3u8, 5] {
        let (mut c, code) = Raw::connect_with(b.addr(), &raw_connect_level(level));
        assert_eq!(code, 1, "level {level}");
        c.expect_closed(WAIT);
        wait_log(&b, &format!("unsupported protocol level {level}; only 4 (3.1.1)"));
    }
}

#[test]
fn k3_qos2_publish_closes_and_qos2_subscription_is_granted_1() {
    let b = start();
    let mut s = Raw::connect(b.addr(), "k3-sub");
    assert_eq!(s.subscribe(&[("k3/#", 2), ("k3/x", 0)]), vec![1, 0]);
    let mut c = Raw::connect(b.addr(), "k3-pub");
    c.publish("k3/a", b"x", 2, false);
    c.expect_closed(WAIT);
    wait_log(&b, "QoS 2 is not supported");
    assert!(b.received().is_empty(), "a refused QoS 2 publish is not routed: {:?}", b.received());
    // The subscriber (granted 1) still works and gets QoS 1.
    let mut p = Raw::connect(b.addr(), "k3-pub2");
    p.publish("k3/a", b"y", 1, false);
    assert_eq!(s.expect_publish(), "publish k3/a \"y\" q1 r0");
}

#[test]
fn k4_will_gets_0x03() {
    let b = start();
    let connect = encode(&mqttrs::Packet::Connect(mqttrs::Connect {
        protocol: mqttrs::Protocol::MQTT311,
        keep_alive: 60,
        client_id: "k4",
        clean_session: true,
        last_will: Some(mqttrs::LastWill { topic: "k4/will", message: b"gone", qos: QoS::AtMostOnce, retain: false }),
        username: None,
        password: None,
    }));
    let (mut c, code) = Raw::connect_with(b.addr(), &connect);
    assert_eq!(code, 3);
    c.expect_closed(WAIT);
    wait_log(&b, "will messages are not supported");
    assert!(b.clients().is_empty());
}

#[test]
fn k5_keepalive_1_without_pings_disconnects_within_2s() {
    let b = start();
    let (mut c, code) = Raw::connect_with(b.addr(), &connect_bytes("k5", 1, true, None, None));
    assert_eq!(code, 0);
    let t0 = Instant::now();
    c.expect_closed(Duration::from_secs(3));
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(2), "closed after {took:?}");
    assert!(took >= Duration::from_millis(1400), "closed too early, after {took:?}");
    wait_log(&b, "keepalive timeout");
}

#[test]
fn k5_pings_keep_a_keepalive_1_client_alive() {
    let b = start();
    let (mut c, code) = Raw::connect_with(b.addr(), &connect_bytes("k5-ping", 1, true, None, None));
    assert_eq!(code, 0);
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(3500) {
        c.send(&encode(&mqttrs::Packet::Pingreq));
        assert_eq!(c.expect(), Got::Pingresp);
        assert_eq!(c.next(Duration::from_millis(500)), Next::Timeout);
    }
    assert_eq!(b.clients(), vec!["k5-ping".to_string()]);
}

#[test]
fn k6_auth_codes() {
    let b =
        broker::start(BrokerConfig { username: Some("mam".into()), password: Some("s3cret".into()), ..cfg() }).unwrap();
    type Case<'a> = (Option<&'a str>, Option<&'a [u8]>, u8);
    let cases: &[Case] = &[
        (Some("mam"), Some(b"wrong"), 4),
        (Some("mam"), None, 4),
        (Some("other"), Some(b"s3cret"), 4),
        (None, None, 5),
        (Some("mam"), Some(b"s3cret"), 0),
    ];
    for (i, (user, pass, want)) in cases.iter().enumerate() {
        let (mut c, code) = Raw::connect_with(b.addr(), &connect_bytes(&format!("k6-{i}"), 60, true, *user, *pass));
        assert_eq!(code, *want, "case {i}: user {user:?} pass {pass:?}");
        if *want != 0 {
            c.expect_closed(WAIT);
        } else {
            c.publish("k6/ok", b"x", 1, false);
        }
    }
    assert!(!b.log_lines().join("\n").contains("s3cret"), "logs never show the password");
    assert!(!format!("{:?}", cfg_with_password()).contains("s3cret"), "Debug redacts the password");
}

fn cfg_with_password() -> BrokerConfig {
    BrokerConfig { password: Some("s3cret".into()), ..cfg() }
}

#[test]
fn k9_api_refuses_non_loopback_bind_without_allow_remote() {
    let e = broker::start(BrokerConfig { bind: "0.0.0.0:0".parse().unwrap(), ..cfg() }).err().unwrap();
    assert_eq!(e.to_string(), "refusing to bind non-loopback address without --allow-remote");
}

#[test]
fn empty_client_id_gets_auto_hex() {
    let b = start();
    let _c = Raw::connect(b.addr(), "");
    let ids = b.clients();
    assert_eq!(ids.len(), 1);
    let hex = ids[0].strip_prefix("auto-").expect("auto- prefix");
    assert!(!hex.is_empty() && hex.bytes().all(|c| c.is_ascii_hexdigit()), "{ids:?}");
    assert_eq!(b.connects(), vec![String::new()]);
    assert_eq!(b.connect_count(), 1);
}

#[test]
fn duplicate_client_id_closes_the_older_connection() {
    let b = start();
    let mut old = Raw::connect(b.addr(), "dup");
    old.subscribe(&[("dup/#", 0)]);
    let mut new = Raw::connect(b.addr(), "dup");
    old.expect_closed(WAIT);
    // The new session starts clean: the old subscription is gone, the new connection works.
    new.subscribe(&[("dup/new", 1)]);
    let mut p = Raw::connect(b.addr(), "dup-pub");
    p.publish("dup/new", b"x", 1, false);
    assert_eq!(new.expect_publish(), "publish dup/new \"x\" q1 r0");
    wait_until("the older connection to be forgotten", WAIT, || b.clients() == vec!["dup", "dup-pub"]);
    wait_log(&b, "connected again");
}

#[test]
fn clean_session_0_is_clean_with_a_warning() {
    let b = start();
    let mut r = Raw::open(b.addr());
    r.send(&connect_bytes("persist-me", 60, false, None, None));
    assert_eq!(r.expect(), Got::Connack { session_present: false, code: 0 });
    wait_log(&b, "WARNING: broker: client persist-me");
    assert!(has_log(&b, "CleanSession=0"));
}

#[test]
fn overlapping_filters_give_one_copy_at_the_highest_qos() {
    let b = start();
    let mut s = Raw::connect(b.addr(), "ov-sub");
    assert_eq!(s.subscribe(&[("ov/#", 0), ("ov/+", 1), ("+/x", 0)]), vec![0, 1, 0]);
    let mut p = Raw::connect(b.addr(), "ov-pub");
    p.publish("ov/x", b"1", 1, false);
    p.publish("ov/end", b"2", 1, false);
    assert_eq!(s.expect_publish(), "publish ov/x \"1\" q1 r0");
    assert_eq!(s.expect_publish(), "publish ov/end \"2\" q1 r0");
    assert_eq!(s.next(Duration::from_millis(100)), Next::Timeout);
}

#[test]
fn invalid_filters_get_0x80_and_the_rest_work() {
    let b = start();
    let mut s = Raw::connect(b.addr(), "inv");
    assert_eq!(s.subscribe(&[("a/#/b", 1), ("a+", 0), ("ok/+", 1), ("#/x", 0)]), vec![0x80, 0x80, 1, 0x80]);
    let mut p = Raw::connect(b.addr(), "inv-pub");
    p.publish("ok/1", b"x", 1, false);
    assert_eq!(s.expect_publish(), "publish ok/1 \"x\" q1 r0");
}

#[test]
fn hooks_record_received_and_retained() {
    let b = start();
    let mut p = Raw::connect(b.addr(), "hk");
    p.publish("hk/r", b"kept", 1, true);
    p.publish("hk/n", b"plain", 1, false);
    assert_eq!(b.retained("hk/r"), Some(b"kept".to_vec()));
    assert_eq!(b.retained("hk/n"), None);
    assert_eq!(
        b.received(),
        vec![("hk/r".to_string(), b"kept".to_vec(), true), ("hk/n".to_string(), b"plain".to_vec(), false)]
    );
    p.publish("hk/r", b"", 1, true);
    assert_eq!(b.retained("hk/r"), None);
}

#[test]
fn stall_and_release_connack() {
    let b = start();
    b.stall_connack("slow-");
    let mut r = Raw::open(b.addr());
    r.send(&connect_bytes("slow-1", 60, true, None, None));
    wait_until("the stalled CONNECT to arrive", WAIT, || b.connect_count() == 1);
    assert_eq!(r.next(Duration::from_millis(300)), Next::Timeout, "no CONNACK while stalled");
    // Other clients are not affected.
    let _fast = Raw::connect(b.addr(), "fast-1");
    b.release_connack("slow-");
    assert_eq!(r.expect(), Got::Connack { session_present: false, code: 0 });
}

#[test]
fn drop_connections_closes_clients_and_keeps_listening() {
    let b = start();
    let mut c1 = Raw::connect(b.addr(), "d1");
    let mut c2 = Raw::connect(b.addr(), "d2");
    b.drop_connections();
    c1.expect_closed(WAIT);
    c2.expect_closed(WAIT);
    let mut c3 = Raw::connect(b.addr(), "d1");
    c3.publish("d/x", b"x", 1, false);
}

#[test]
fn shutdown_closes_clients_and_the_listener() {
    let b = start();
    let addr = b.addr();
    let mut c = Raw::connect(addr, "sd");
    b.stall_connack("never-");
    let mut stalled = Raw::open(addr);
    stalled.send(&connect_bytes("never-1", 60, true, None, None));
    let t0 = Instant::now();
    b.shutdown();
    assert!(t0.elapsed() < Duration::from_secs(3), "shutdown took {:?}", t0.elapsed());
    c.expect_closed(WAIT);
    stalled.expect_closed(WAIT);
    assert!(TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err(), "listener closed");
}

#[test]
fn slow_subscriber_overflows_and_does_not_stall_others() {
    let b = broker::start(BrokerConfig { queue_limit: 20, ..cfg() }).unwrap();
    // A subscriber that never reads: its socket buffers fill, then its queue, then it is dropped.
    let mut dead = Raw::connect(b.addr(), "dead");
    dead.subscribe(&[("flood/#", 1)]);
    let mut live = Raw::connect(b.addr(), "live");
    live.subscribe(&[("flood/#", 0)]);
    let reader = std::thread::spawn(move || {
        let mut n = 0;
        while n < 400 {
            match live.next(WAIT) {
                Next::Packet(Got::Publish { .. }) => n += 1,
                other => panic!("live subscriber: {other:?} after {n}"),
            }
        }
        n
    });
    let mut p = Raw::connect(b.addr(), "flooder");
    let payload = vec![b'x'; 64 * 1024];
    let t0 = Instant::now();
    for i in 0..400 {
        p.publish(&format!("flood/{i}"), &payload, 1, false);
    }
    assert!(t0.elapsed() < Duration::from_secs(20), "publisher stalled: {:?}", t0.elapsed());
    assert_eq!(reader.join().unwrap(), 400);
    wait_log(&b, "outbound queue full (20 messages) for 1 s; disconnecting");
    assert!(has_log(&b, "client dead"));
    wait_until("the dead subscriber to be gone", WAIT, || !b.clients().contains(&"dead".to_string()));
    drop(dead);
}

// ---------------------------------------------------------------------------------------------
// Bad input: each case closes only its own connection; a witness pair keeps round-tripping.

struct Witness {
    sub: Raw,
    pubr: Raw,
    n: u64,
}

impl Witness {
    fn new(addr: SocketAddr) -> Witness {
        let mut sub = Raw::connect(addr, "witness-sub");
        sub.subscribe(&[("witness/#", 1)]);
        Witness { sub, pubr: Raw::connect(addr, "witness-pub"), n: 0 }
    }
    fn round_trip(&mut self, after: &str) {
        self.n += 1;
        let payload = format!("{}", self.n);
        self.pubr.publish("witness/rt", payload.as_bytes(), 1, false);
        let got = self.sub.expect_publish();
        assert_eq!(got, format!("publish witness/rt {payload:?} q1 r0"), "round trip after {after}");
    }
}

fn bad_cfg() -> BrokerConfig {
    BrokerConfig { connect_timeout: Duration::from_millis(300), max_packet: 64 * 1024, ..cfg() }
}

fn connected(addr: SocketAddr) -> Raw {
    Raw::connect(addr, &format!("bad-{}", rand_hex(4)))
}

fn vm_rss_kb() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = s.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn bad_input_named_cases_close_only_their_connection() {
    let b = broker::start(bad_cfg()).unwrap();
    let addr = b.addr();
    let mut w = Witness::new(addr);
    let rss_before = vm_rss_kb();

    let valid_connect = connect_bytes("bad-x", 60, true, None, None);
    let mut short_len = valid_connect.clone();
    short_len[1] -= 2; // remaining length two bytes short of the content
    let cases: Vec<(&str, Vec<u8>, bool, &str)> = vec![
        // (name, bytes, connect first, expected log fragment)
        ("truncated CONNECT", valid_connect[..7].to_vec(), false, "closed before CONNECT"),
        ("wrong remaining length", short_len, false, "protocol error"),
        ("256 MiB declared length", vec![0x30, 0xff, 0xff, 0xff, 0x7f], true, "exceeds max-packet 65536"),
        ("2 GB declared length (5-byte varint)", vec![0x30, 0xff, 0xff, 0xff, 0xff, 0x07], true, "protocol error"),
        ("oversized CONNECT", vec![0x10, 0xff, 0xff, 0x7f], false, "exceeds max-packet"),
        ("QoS 2 publish", vec![0x34, 7, 0, 1, b'a', 0, 1, b'h', b'i'], true, "QoS 2 is not supported"),
        ("+ in publish topic", vec![0x30, 5, 0, 3, b'a', b'/', b'+'], true, "invalid publish topic 'a/+'"),
        ("# in publish topic", vec![0x30, 3, 0, 1, b'#'], true, "invalid publish topic '#'"),
        ("empty publish topic", vec![0x30, 3, 0, 0, b'x'], true, "invalid publish topic ''"),
        ("PUBREC", vec![0x50, 2, 0, 1], true, "PUBREC"),
        ("PUBREL", vec![0x62, 2, 0, 1], true, "PUBREL"),
        ("PUBCOMP", vec![0x70, 2, 0, 1], true, "PUBCOMP"),
        ("second CONNECT", valid_connect.clone(), true, "second CONNECT"),
        ("PUBLISH before CONNECT", vec![0x30, 3, 0, 1, b'a'], false, "first packet is not CONNECT"),
        ("reserved packet type", vec![0xf0, 0], true, "reserved packet type"),
        ("unknown protocol name", vec![0x10, 10, 0, 4, b'M', b'Q', b'X', b'X', 4, 2, 0, 60], false, "protocol name"),
    ];
    for (name, bytes, connect_first, log) in cases {
        let mut c = if connect_first { connected(addr) } else { Raw::open(addr) };
        c.send(&bytes);
        if name == "truncated CONNECT" {
            c.s.shutdown(Shutdown::Write).unwrap();
        }
        c.expect_closed(WAIT);
        wait_log(&b, log);
        w.round_trip(name);
    }

    // A client that connects and never speaks.
    let mut silent = Raw::open(addr);
    let t0 = Instant::now();
    silent.expect_closed(WAIT);
    assert!(t0.elapsed() >= Duration::from_millis(250), "closed before the first-packet timeout");
    wait_log(&b, "no CONNECT within 300 ms");
    w.round_trip("silent client");

    let grew = vm_rss_kb().saturating_sub(rss_before);
    assert!(grew < 100 * 1024, "huge declared lengths must not allocate (RSS grew {grew} kB)");
}

#[test]
fn bad_input_10000_random_byte_strings() {
    let b = broker::start(bad_cfg()).unwrap();
    let addr = b.addr();
    let mut w = Witness::new(addr);
    let connect = connect_bytes("rnd", 60, true, None, None);
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for case in 0..10_000u32 {
        let len = (next() % 48) as usize;
        let mut bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        if len >= 2 && next() % 2 == 0 {
            bytes[1] = (len - 2) as u8 & 0x7f; // a consistent length reaches the body decoders
        }
        let after_connect = next() % 2 == 0;
        let mut c = Raw::open(addr);
        if after_connect {
            c.send(&connect);
        }
        c.send(&bytes);
        let _ = c.s.shutdown(Shutdown::Write);
        c.expect_closed(WAIT);
        if case % 500 == 499 {
            w.round_trip(&format!("random case {case}"));
        }
    }
    w.round_trip("all random cases");
    assert_eq!(b.clients(), vec!["witness-pub".to_string(), "witness-sub".to_string()]);
}

// ---------------------------------------------------------------------------------------------
// The `mam broker` binary

/// A `mam broker` child: killed and reaped on drop.
struct BrokerProc {
    child: Child,
    addr: SocketAddr,
    stderr: mpsc::Receiver<String>,
}

impl BrokerProc {
    fn start(td: &TestDir, extra: &[&str]) -> BrokerProc {
        let mut cmd = td.mam().args(["broker", "--port", "0"]).args(extra).cmd;
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(l)) = lines.next() {
                let _ = tx.send(l);
            }
            for _ in lines {}
        });
        let stderr = child.stderr.take().unwrap();
        let (etx, erx) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = etx.send(l);
            }
        });
        let line = match rx.recv_timeout(WAIT) {
            Ok(l) => l,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("no listening line; stderr: {:?}", erx.try_iter().collect::<Vec<_>>());
            }
        };
        let addr = line.strip_prefix("mam broker listening on ").unwrap_or_else(|| panic!("{line:?}"));
        BrokerProc { child, addr: addr.parse().unwrap(), stderr: erx }
    }

    fn port(&self) -> String {
        self.addr.port().to_string()
    }
}

impl Drop for BrokerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run_tool(cmd: &mut Command) -> std::process::Output {
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not finish");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn k1_mosquitto_clients_against_mam_broker() {
    if !have_tool("mosquitto_pub", "MAM_REQUIRE_MOSQUITTO") {
        return;
    }
    let td = TestDir::new("k1");
    let b = BrokerProc::start(&td, &[]);
    let port = b.port();
    // Retained, QoS 1 (mosquitto_pub exits 0 only after the PUBACK).
    for (t, m) in [("k1/a/x", "ax"), ("k1/b/x", "bx"), ("k1/b/y", "by")] {
        let out = run_tool(Command::new("mosquitto_pub").args(["-p", &port, "-q", "1", "-r", "-t", t, "-m", m]));
        assert!(out.status.success(), "mosquitto_pub: {}", String::from_utf8_lossy(&out.stderr));
    }
    // A subscriber on `+` and `#` filters: gets the retained ones, then a live one.
    let mut sub = Command::new("mosquitto_sub")
        .args(["-p", &port, "-q", "1", "-v", "-t", "k1/+/x", "-t", "k1/b/#", "-C", "4", "-W", "10"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = sub.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let mut lines: Vec<String> = (0..3).map(|_| rx.recv_timeout(WAIT).expect("retained line")).collect();
    lines.sort();
    assert_eq!(lines, vec!["k1/a/x ax", "k1/b/x bx", "k1/b/y by"]);
    let out = run_tool(Command::new("mosquitto_pub").args(["-p", &port, "-q", "1", "-t", "k1/c/x", "-m", "live"]));
    assert!(out.status.success());
    assert_eq!(rx.recv_timeout(WAIT).unwrap(), "k1/c/x live");
    let st = sub.wait().unwrap();
    assert!(st.success());
    // A mosquitto_pub with a wildcard topic is refused by the client itself; a v5 one by us.
    let out = run_tool(Command::new("mosquitto_pub").args(["-V", "mqttv5", "-p", &port, "-t", "k1/v5", "-m", "x"]));
    assert!(!out.status.success());
    let line = b.stderr.recv_timeout(WAIT).unwrap();
    assert!(line.starts_with("NOTE: broker: ") && line.contains("unsupported protocol level 5"), "{line}");
}

#[test]
fn mam_broker_auth_with_password_file_and_sigterm() {
    if !have_tool("mosquitto_pub", "MAM_REQUIRE_MOSQUITTO") {
        return;
    }
    let td = TestDir::new("broker-auth");
    let secret = format!("pw-{}", rand_hex(6));
    let pwfile = td.write("pw", format!("{secret}\n"));
    let mut b = BrokerProc::start(&td, &["--username", "mam", "--password-file", pwfile.to_str().unwrap()]);
    let port = b.port();
    let ok = run_tool(
        Command::new("mosquitto_pub").args(["-p", &port, "-u", "mam", "-P", &secret, "-q", "1", "-t", "a", "-m", "x"]),
    );
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    let bad =
        run_tool(Command::new("mosquitto_pub").args(["-p", &port, "-u", "mam", "-P", "nope", "-t", "a", "-m", "x"]));
    assert!(!bad.status.success());
    mam::sys::kill(b.child.id() as i32, 15).unwrap();
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(st) = b.child.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "mam broker ignored SIGTERM");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(status.code(), Some(0));
    let log: Vec<String> = b.stderr.try_iter().collect();
    assert!(log.iter().any(|l| l.contains("bad username or password")), "{log:?}");
    assert!(!log.join("\n").contains(&secret));
}

#[test]
fn mam_broker_sigint_exits_0() {
    let td = TestDir::new("broker-int");
    let mut b = BrokerProc::start(&td, &[]);
    let _c = Raw::connect(b.addr, "held-open");
    mam::sys::kill(b.child.id() as i32, 2).unwrap();
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(st) = b.child.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "mam broker ignored SIGINT");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(status.code(), Some(0));
}

#[test]
fn k9_cli_refuses_non_loopback_bind_without_allow_remote() {
    let td = TestDir::new("k9");
    for addr in ["0.0.0.0", "10.1.2.3", "::"] {
        let r = td.mam().args(["broker", "--bind", addr, "--port", "0"]).run();
        r.expect_rc(2);
        eqnice!("ERROR: refusing to bind non-loopback address without --allow-remote\n", r.stderr());
        assert_eq!(r.stdout(), "");
    }
}

#[test]
fn cli_usage_errors() {
    let td = TestDir::new("broker-usage");
    for args in [
        &["broker", "--port", "70000"][..],
        &["broker", "--bind", "localhost"],
        &["broker", "--username", "u"],
        &["broker", "--max-packet", "10"],
        &["broker", "--password", "x"],
    ] {
        let r = td.mam().args(args).run();
        r.expect_rc(2);
        assert!(r.stderr().starts_with("ERROR: "), "{args:?}: {}", r.stderr());
    }
    let r = td.mam().args(["broker", "--username", "u", "--password-file", "/nonexistent/pw"]).run();
    r.expect_rc(1);
    assert!(r.stderr().contains("cannot read password file"), "{}", r.stderr());
    td.mam().args(["broker", "--help"]).run().expect_rc(0);
}
