//! Integration tests: the embedded broker (CORE 11.3, K1-K9) over real sockets.
//!
//! A small raw-socket client (packets encoded and decoded with mqttrs) drives the in-process broker;
//! `mosquitto_pub`/`mosquitto_sub` drive the `mam broker` binary (K1); `same_on_both!` runs one
//! scenario against the embedded broker and a real mosquitto and requires the same transcript.
//! The client and the shared helpers live here; the tests are grouped by protocol area below.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use mam::broker::{self, BrokerConfig, BrokerHandle};
use mqttrs::{QoS, SubscribeReturnCodes};

use crate::support::{anonymous, exit_within, have_tool, poll, rand_hex, wait_exit, wait_until, Mosquitto, TestDir};

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
pub(crate) enum Got {
    Connack { session_present: bool, code: u8 },
    Suback(Vec<u8>),
    Unsuback,
    Publish { topic: String, payload: Vec<u8>, qos: u8, retain: bool, pid: u16, dup: bool },
    Puback(u16),
    Pubrec(u16),
    Pubrel(u16),
    Pubcomp(u16),
    Pingresp,
    Other(String),
}

#[derive(Debug, PartialEq)]
pub(crate) enum Next {
    Packet(Got),
    Closed,
    Timeout,
}

pub(crate) struct Raw {
    s: TcpStream,
    buf: Vec<u8>,
    pid: u16,
    /// Packets read while waiting for a particular one (a PUBREL), returned first by `next`.
    stash: std::collections::VecDeque<Got>,
}

fn encode(p: &mqttrs::Packet) -> Vec<u8> {
    let mut buf = vec![0u8; 2 * 1024 * 1024];
    let n = mqttrs::encode_slice(p, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

pub(crate) fn connect_bytes(
    id: &str,
    keep_alive: u16,
    clean: bool,
    user: Option<&str>,
    pass: Option<&[u8]>,
) -> Vec<u8> {
    connect_packet(id, keep_alive, clean, None, user, pass)
}

fn connect_packet(
    client_id: &str,
    keep_alive: u16,
    clean_session: bool,
    last_will: Option<mqttrs::LastWill>,
    username: Option<&str>,
    password: Option<&[u8]>,
) -> Vec<u8> {
    let protocol = mqttrs::Protocol::MQTT311;
    encode(&mqttrs::Packet::Connect(mqttrs::Connect {
        protocol,
        keep_alive,
        client_id,
        clean_session,
        last_will,
        username,
        password,
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
    pub(crate) fn open(addr: SocketAddr) -> Raw {
        let s = TcpStream::connect_timeout(&addr, WAIT).unwrap();
        s.set_nodelay(true).unwrap();
        Raw { s, buf: Vec::new(), pid: 0, stash: Default::default() }
    }

    /// Connects with CleanSession=1 and keepalive 60, expecting CONNACK 0.
    pub(crate) fn connect(addr: SocketAddr, id: &str) -> Raw {
        let (r, code) = Raw::connect_with(addr, &connect_bytes(id, 60, true, None, None));
        assert_eq!(code, 0, "CONNACK for {id}");
        r
    }

    /// Sends `connect` as the first packet; returns the CONNACK code.
    pub(crate) fn connect_with(addr: SocketAddr, connect: &[u8]) -> (Raw, u8) {
        let mut r = Raw::open(addr);
        r.send(connect);
        match r.next(WAIT) {
            Next::Packet(Got::Connack { code, .. }) => (r, code),
            other => panic!("expected CONNACK, got {other:?}"),
        }
    }

    pub(crate) fn send(&mut self, bytes: &[u8]) {
        // A broker that already closed may reset the connection; the reads report it.
        let _ = self.s.write_all(bytes);
    }

    pub(crate) fn next_pid(&mut self) -> u16 {
        self.pid += 1;
        self.pid
    }

    /// The next packet within `within`, or Closed / Timeout.
    pub(crate) fn next(&mut self, within: Duration) -> Next {
        if let Some(g) = self.stash.pop_front() {
            return Next::Packet(g);
        }
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
                        dup: p.dup,
                    },
                    mqttrs::Packet::Puback(p) => Got::Puback(p.get()),
                    mqttrs::Packet::Pubrec(p) => Got::Pubrec(p.get()),
                    mqttrs::Packet::Pubrel(p) => Got::Pubrel(p.get()),
                    mqttrs::Packet::Pubcomp(p) => Got::Pubcomp(p.get()),
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
                Ok(0) => {
                    eprintln!("the broker closed the connection (end of stream)");
                    return Next::Closed;
                }
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    return Next::Timeout
                }
                // A signal (a read with a timeout is never restarted, signal(7)): read again.
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    eprintln!("reading from the broker failed: {e}");
                    return Next::Closed;
                }
            }
        }
    }

    /// The next packet, which must arrive within the default wait.
    pub(crate) fn expect(&mut self) -> Got {
        match self.next(WAIT) {
            Next::Packet(p) => p,
            other => panic!("expected a packet, got {other:?}"),
        }
    }

    /// The next PUBLISH, acknowledging QoS 1 ones and completing the QoS 2 flow of QoS 2 ones
    /// (PUBREC, then PUBCOMP after the broker's PUBREL); returns a one-line description.
    pub(crate) fn expect_publish(&mut self) -> String {
        match self.expect() {
            Got::Publish { topic, payload, qos, retain, pid, .. } => {
                let p = || mqttrs::Pid::try_from(pid).unwrap();
                if qos == 1 {
                    self.send(&encode(&mqttrs::Packet::Puback(p())));
                }
                if qos == 2 {
                    self.send(&encode(&mqttrs::Packet::Pubrec(p())));
                    self.wait_for(Got::Pubrel(pid));
                    self.send(&encode(&mqttrs::Packet::Pubcomp(p())));
                }
                format!("publish {topic} {:?} q{qos} r{}", String::from_utf8_lossy(&payload), u8::from(retain))
            }
            other => panic!("expected PUBLISH, got {other:?}"),
        }
    }

    /// Reads until `want` arrives (within the default wait); other packets are kept for `next`.
    pub(crate) fn wait_for(&mut self, want: Got) {
        let mut kept = Vec::new();
        loop {
            match self.next(WAIT) {
                Next::Packet(g) if g == want => break,
                Next::Packet(g) => kept.push(g),
                other => panic!("expected {want:?}, got {other:?} (after {kept:?})"),
            }
        }
        // Kept packets come before anything stashed later but after what was stashed before.
        for g in kept.into_iter().rev() {
            self.stash.push_front(g);
        }
    }

    /// Sends one PUBLISH with an explicit packet id and DUP flag; waits for nothing.
    pub(crate) fn publish_raw(&mut self, topic: &str, payload: &[u8], qos: u8, pid: u16, dup: bool) {
        let p = mqttrs::Pid::try_from(pid.max(1)).unwrap();
        let qospid = match qos {
            0 => mqttrs::QosPid::AtMostOnce,
            1 => mqttrs::QosPid::AtLeastOnce(p),
            _ => mqttrs::QosPid::ExactlyOnce(p),
        };
        let pkt = mqttrs::Packet::Publish(mqttrs::Publish { dup, qospid, retain: false, topic_name: topic, payload });
        self.send(&encode(&pkt));
    }

    /// Sends an acknowledgement packet (`kind` "puback", "pubrec", "pubrel" or "pubcomp").
    pub(crate) fn ack(&mut self, kind: &str, pid: u16) {
        let p = mqttrs::Pid::try_from(pid).unwrap();
        let pkt = match kind {
            "puback" => mqttrs::Packet::Puback(p),
            "pubrec" => mqttrs::Packet::Pubrec(p),
            "pubrel" => mqttrs::Packet::Pubrel(p),
            _ => mqttrs::Packet::Pubcomp(p),
        };
        self.send(&encode(&pkt));
    }

    /// Sends DISCONNECT and closes the socket.
    pub(crate) fn disconnect(mut self) {
        self.send(&encode(&mqttrs::Packet::Disconnect));
        let _ = self.s.shutdown(Shutdown::Both);
    }

    /// Waits for the broker to close the connection.
    pub(crate) fn expect_closed(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            match self.next(deadline.saturating_duration_since(Instant::now())) {
                Next::Closed => return,
                Next::Timeout => panic!("connection still open after {within:?}"),
                Next::Packet(_) => {}
            }
        }
    }

    pub(crate) fn subscribe(&mut self, filters: &[(&str, u8)]) -> Vec<u8> {
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

    pub(crate) fn unsubscribe(&mut self, filters: &[&str]) {
        let pid = mqttrs::Pid::try_from(self.next_pid()).unwrap();
        let topics = filters.iter().map(|f| f.to_string()).collect();
        self.send(&encode(&mqttrs::Packet::Unsubscribe(mqttrs::Unsubscribe::new(pid, topics))));
        assert_eq!(self.expect(), Got::Unsuback);
    }

    /// Publishes; for QoS 1 waits for the matching PUBACK, for QoS 2 completes PUBREC/PUBREL/PUBCOMP.
    pub(crate) fn publish(&mut self, topic: &str, payload: &[u8], qos: u8, retain: bool) {
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
        if qos == 2 {
            self.wait_for(Got::Pubrec(pid));
            self.ack("pubrel", pid);
            self.wait_for(Got::Pubcomp(pid));
        }
    }
}

/// A CONNECT with a will (and CleanSession `clean`).
pub(crate) fn connect_will(
    id: &str,
    keep_alive: u16,
    clean: bool,
    topic: &str,
    msg: &[u8],
    qos: u8,
    retain: bool,
) -> Vec<u8> {
    let will = mqttrs::LastWill { topic, message: msg, qos: qos_of(qos), retain };
    connect_packet(id, keep_alive, clean, Some(will), None, None)
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
                let td = TestDir::new("mosquitto");
                let m = Mosquitto::start(&td, anonymous);
                let theirs = scenario(m.addr()).join("\n");
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

/// Runs a client tool to its end (10 s at most) and returns its output.
pub(crate) fn run_tool(cmd: &mut Command) -> std::process::Output {
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    wait_exit(&format!("{cmd:?}"), &mut child, Duration::from_secs(10));
    child.wait_with_output().unwrap()
}

/// Runs `mosquitto_sub` with `args` (stdout lines to the receiver, read on a thread of its own).
fn sub_lines(args: &[&str]) -> (Child, mpsc::Receiver<String>) {
    let mut sub = Command::new("mosquitto_sub")
        .args(["-h", "127.0.0.1"])
        .args(args)
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
    (sub, rx)
}

/// Waits for a line containing `needle`; the lines before it are skipped.
fn wait_line(rx: &mpsc::Receiver<String>, needle: &str) {
    let deadline = Instant::now() + WAIT;
    let mut seen = Vec::new();
    loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(l) if l.contains(needle) => return,
            Ok(l) => seen.push(l),
            Err(_) => panic!("no line containing {needle:?} within {WAIT:?}; got {seen:#?}"),
        }
    }
}

/// A `mam broker` child in `td`'s workspace (its control root, so its state file is
/// `<ws>/.mam/broker.state`): killed and reaped on drop.
pub(crate) struct BrokerProc {
    child: Child,
    pub(crate) addr: SocketAddr,
    /// Every stdout line: the listening line, then `credentials in <path>` when it made them.
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

/// How long `BrokerProc` waits for its listening line and for a log line (a loaded machine).
const PROC_WAIT: Duration = Duration::from_secs(10);

impl BrokerProc {
    pub(crate) fn start(td: &TestDir, extra: &[&str]) -> BrokerProc {
        BrokerProc::start_under(td, &[], extra)
    }

    /// `start` with `mam` run by `wrapper` (a program and its arguments, `mam ...` appended; the
    /// same environment and directory), e.g. `prlimit --nofile=1024:1024 --`.
    pub(crate) fn start_under(td: &TestDir, wrapper: &[&str], extra: &[&str]) -> BrokerProc {
        let mam = td.mam().args(["broker", "--port", "0"]).args(extra).cmd;
        let mut cmd = match wrapper.split_first() {
            None => mam,
            Some((prog, args)) => {
                let mut c = Command::new(prog);
                c.args(args).arg(mam.get_program()).args(mam.get_args()).env_clear().stdin(Stdio::null());
                for (k, v) in mam.get_envs() {
                    if let Some(v) = v {
                        c.env(k, v);
                    }
                }
                if let Some(d) = mam.get_current_dir() {
                    c.current_dir(d);
                }
                c
            }
        };
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let (stdout, stderr) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(Vec::new())));
        let (out, err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
        let (o, e) = (stdout.clone(), stderr.clone());
        std::thread::spawn(move || {
            BufReader::new(out).lines().map_while(Result::ok).for_each(|l| o.lock().unwrap().push(l))
        });
        let reader = std::thread::spawn(move || {
            BufReader::new(err).lines().map_while(Result::ok).for_each(|l| e.lock().unwrap().push(l))
        });
        let Some(line) = poll(PROC_WAIT, || stdout.lock().unwrap().first().cloned()) else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("no listening line; stderr: {:?}", stderr.lock().unwrap());
        };
        let addr = line.strip_prefix("mam broker listening on ").unwrap_or_else(|| panic!("{line:?}"));
        BrokerProc { child, addr: addr.parse().unwrap(), stdout, stderr, reader: Some(reader) }
    }

    pub(crate) fn port(&self) -> String {
        self.addr.port().to_string()
    }

    pub(crate) fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Whether it still runs.
    pub(crate) fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// The stdout lines so far.
    pub(crate) fn stdout(&self) -> Vec<String> {
        self.stdout.lock().unwrap().clone()
    }

    /// The stderr lines so far.
    pub(crate) fn log(&self) -> Vec<String> {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits for a stderr line containing `needle` and returns it.
    pub(crate) fn wait_log(&self, needle: &str) -> String {
        let found = poll(PROC_WAIT, || self.log().into_iter().find(|l| l.contains(needle)));
        found
            .unwrap_or_else(|| panic!("no broker log line with {needle:?} within {PROC_WAIT:?}; got {:#?}", self.log()))
    }

    /// Sends `sig`, requires exit 0 within the default wait, returns every stderr line.
    pub(crate) fn stop_with(mut self, sig: i32) -> Vec<String> {
        mam::sys::kill(self.child.id() as i32, sig).unwrap();
        let status = exit_within(&mut self.child, WAIT)
            .unwrap_or_else(|| panic!("mam broker ignored signal {sig} for {WAIT:?}; log {:#?}", self.log()));
        assert_eq!(status.code(), Some(0), "signal {sig}: {:#?}", self.log());
        // Its stderr is at EOF now: the reader ends.
        if let Some(r) = self.reader.take() {
            r.join().unwrap();
        }
        self.log()
    }

    /// SIGTERM (the clean shutdown that writes the state file).
    pub(crate) fn terminate(self) -> Vec<String> {
        self.stop_with(15)
    }

    /// SIGKILL: no shutdown at all.
    pub(crate) fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for BrokerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// The tests, by protocol area (declared after `same_on_both!` so they can use it).
mod bad_input;
mod cli;
mod connect;
mod keepalive;
mod lifecycle;
mod paho;
mod persist;
mod publish;
mod qos2;
mod retain;
mod session;
mod subscribe;
mod will;
