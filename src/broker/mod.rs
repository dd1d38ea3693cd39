//! The embedded MQTT 3.1.1 broker (CORE 11): `start(cfg)` binds, spawns one acceptor thread and,
//! per connection, a reader thread (decode, route, reply) and a writer thread fed by a bounded
//! channel, so a slow or dead subscriber never stalls a publisher. Shared state (sessions,
//! subscriptions, retained messages) lives under one Mutex; routing is done under it.
//!
//! It never prints: log lines go to an in-memory ring (`BrokerHandle::log_lines`) and to the
//! caller's `BrokerConfig::log` sink (`mam broker` sends them to stderr). It never panics on network
//! input: `codec` checks every length, and a packet's declared size is checked against
//! `max_packet` before a byte of it is buffered.
//!
//! Test hooks (`stall_connack`, `drop_connections`, `retained`, `received`, `connect_count`, ...)
//! are always compiled: they cost a few counters and one bounded record of received messages that
//! `mam broker` turns off (`record: false`). The `test-hooks` feature is accepted but not needed.

pub mod codec;
mod route;
pub mod topic;

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::text::one_line;
use codec::Packet;
use route::{Publish, Refusal, RetainedStore, Session};

/// Where broker log lines go besides the in-memory ring: called once per line, from any thread.
pub type LogSink = Arc<dyn Fn(&str) + Send + Sync>;

/// Broker settings. `Default` is the CLI's default: `127.0.0.1:1883`, no auth, 1 MiB packets.
#[derive(Clone)]
pub struct BrokerConfig {
    pub bind: SocketAddr,
    /// Required for a non-loopback `bind` (CORE 11.1).
    pub allow_remote: bool,
    /// With a username, every CONNECT must carry it and `password` (CORE 11.2 Auth).
    pub username: Option<String>,
    pub password: Option<String>,
    /// Largest accepted packet, fixed header included.
    pub max_packet: usize,
    pub log: Option<LogSink>,
    /// How long a new connection may take to send CONNECT (10 s; tests shorten it).
    pub connect_timeout: Duration,
    /// Per-client outbound queue bound in packets (1000; tests shorten it).
    pub queue_limit: usize,
    /// Keep a bounded record of received PUBLISHes for `BrokerHandle::received` (off in `mam broker`).
    pub record: bool,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            bind: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 1883),
            allow_remote: false,
            username: None,
            password: None,
            max_packet: 1024 * 1024,
            log: None,
            connect_timeout: Duration::from_secs(10),
            queue_limit: 1000,
            record: true,
        }
    }
}

impl fmt::Debug for BrokerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BrokerConfig")
            .field("bind", &self.bind)
            .field("allow_remote", &self.allow_remote)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("max_packet", &self.max_packet)
            .field("log", &self.log.is_some())
            .field("connect_timeout", &self.connect_timeout)
            .field("queue_limit", &self.queue_limit)
            .field("record", &self.record)
            .finish()
    }
}

/// Records kept for `received()`: at most this many messages and this many payload bytes.
const RECORD_MAX_MESSAGES: usize = 100_000;
const RECORD_MAX_BYTES: usize = 64 * 1024 * 1024;
/// Log lines kept in memory for `log_lines()`.
const LOG_RING: usize = 2000;
const READER_STACK: usize = 128 * 1024;
const WRITER_STACK: usize = 64 * 1024;
const READ_CHUNK: usize = 8 * 1024;
/// Bytes the writer gathers from its queue before one write call.
const WRITE_BATCH: usize = 64 * 1024;
/// A writer blocked this long on one write gives up on the client.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

enum Out {
    Owned(Vec<u8>),
    Shared(Arc<[u8]>),
    Close,
}

struct Client {
    conn: u64,
    tx: SyncSender<Out>,
    stream: TcpStream,
    session: Session,
}

#[derive(Default)]
struct State {
    clients: HashMap<String, Client>,
    retained: RetainedStore,
    received: VecDeque<(String, Vec<u8>, bool)>,
    received_bytes: usize,
    connects: Vec<String>,
    connect_total: usize,
}

impl State {
    fn note_connect(&mut self, id: &str, record: bool) {
        self.connect_total += 1;
        if record && self.connects.len() < RECORD_MAX_MESSAGES {
            self.connects.push(id.to_string());
        }
    }
}

struct ConnSlot {
    stream: Option<TcpStream>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    cfg: BrokerConfig,
    state: Mutex<State>,
    conns: Mutex<HashMap<u64, ConnSlot>>,
    next_conn: AtomicU64,
    stop: AtomicBool,
    stalled: Mutex<Vec<String>>,
    stall_cv: Condvar,
    log_ring: Mutex<VecDeque<String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn log(&self, line: String) {
        if let Some(sink) = &self.cfg.log {
            sink(&line);
        }
        let mut ring = lock(&self.log_ring);
        if ring.len() == LOG_RING {
            ring.pop_front();
        }
        ring.push_back(line);
    }

    fn stall_active(&self, client_id: &str) -> bool {
        lock(&self.stalled).iter().any(|p| client_id.starts_with(p.as_str()))
    }

    /// Blocks while a `stall_connack` prefix matches `client_id` (or until shutdown).
    fn wait_stall(&self, client_id: &str) {
        let mut st = lock(&self.stalled);
        while !self.stop.load(Ordering::SeqCst) && st.iter().any(|p| client_id.starts_with(p.as_str())) {
            st = self.stall_cv.wait_timeout(st, Duration::from_millis(100)).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

/// A running broker. Dropping it (or `shutdown`) closes the listener and every connection and
/// joins every thread.
pub struct BrokerHandle {
    shared: Arc<Shared>,
    addr: SocketAddr,
    acceptor: Option<JoinHandle<()>>,
    /// The listening socket (a clone of the acceptor's), shut down to end a blocked accept.
    listener: Option<TcpListener>,
}

/// Binds `cfg.bind` and starts serving; the socket is listening when this returns.
pub fn start(cfg: BrokerConfig) -> io::Result<BrokerHandle> {
    if !cfg.bind.ip().is_loopback() && !cfg.allow_remote {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "refusing to bind non-loopback address without --allow-remote",
        ));
    }
    let listener = TcpListener::bind(cfg.bind)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot bind broker to {}: {e}", cfg.bind)))?;
    let addr = listener.local_addr()?;
    let shared = Arc::new(Shared {
        cfg,
        state: Mutex::new(State::default()),
        conns: Mutex::new(HashMap::new()),
        next_conn: AtomicU64::new(1),
        stop: AtomicBool::new(false),
        stalled: Mutex::new(Vec::new()),
        stall_cv: Condvar::new(),
        log_ring: Mutex::new(VecDeque::new()),
    });
    let sh = shared.clone();
    let listener_copy = listener.try_clone()?;
    let acceptor = thread::Builder::new()
        .name("broker-accept".into())
        .stack_size(READER_STACK)
        .spawn(move || accept_loop(sh, listener))?;
    Ok(BrokerHandle { shared, addr, acceptor: Some(acceptor), listener: Some(listener_copy) })
}

impl BrokerHandle {
    /// The bound address (the real port when the config asked for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Closes the listener and every connection and joins every thread.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let wake = match self.addr.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), self.addr.port()),
            IpAddr::V6(ip) if ip.is_unspecified() => SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), self.addr.port()),
            _ => self.addr,
        };
        self.stop_with_wake(wake);
    }

    /// `stop` with the address of the wake-up connect (a test passes one that fails).
    fn stop_with_wake(&mut self, wake: SocketAddr) {
        let Some(acceptor) = self.acceptor.take() else {
            return;
        };
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.stall_cv.notify_all();
        // End the blocking accept: shutting the listening socket down makes accept fail at once;
        // a connection of our own wakes it too where that is not enough. The acceptor is always
        // joined, so no connection slot can be added after the drain below.
        if let Some(l) = self.listener.take() {
            crate::sys::shutdown_listener(&l);
        }
        let _ = crate::sys::connect(&wake, Duration::from_secs(2));
        let _ = acceptor.join();
        loop {
            let slots: Vec<ConnSlot> = lock(&self.shared.conns).drain().map(|(_, s)| s).collect();
            if slots.is_empty() {
                break;
            }
            for s in &slots {
                if let Some(st) = &s.stream {
                    let _ = st.shutdown(Shutdown::Both);
                }
            }
            for mut s in slots {
                if let Some(t) = s.thread.take() {
                    let _ = t.join();
                }
            }
        }
    }

    // ---- test hooks (CORE 11.1), always compiled; see the module comment ----

    /// Holds the CONNACK of every client whose id starts with `prefix` until `release_connack`.
    pub fn stall_connack(&self, prefix: &str) {
        lock(&self.shared.stalled).push(prefix.to_string());
    }

    /// Ends a `stall_connack(prefix)`; stalled clients get their CONNACK.
    pub fn release_connack(&self, prefix: &str) {
        lock(&self.shared.stalled).retain(|p| p != prefix);
        self.shared.stall_cv.notify_all();
    }

    /// Closes every client connection (the listener stays up).
    pub fn drop_connections(&self) {
        for s in lock(&self.shared.conns).values() {
            if let Some(st) = &s.stream {
                let _ = st.shutdown(Shutdown::Both);
            }
        }
    }

    /// The retained payload of `topic`, if any.
    pub fn retained(&self, topic: &str) -> Option<Vec<u8>> {
        lock(&self.shared.state).retained.get(topic).map(|r| r.payload.clone())
    }

    /// Every accepted PUBLISH in arrival order as `(topic, payload, retain)` (bounded record).
    pub fn received(&self) -> Vec<(String, Vec<u8>, bool)> {
        lock(&self.shared.state).received.iter().cloned().collect()
    }

    /// How many CONNECT packets arrived (refused ones included).
    pub fn connect_count(&self) -> usize {
        lock(&self.shared.state).connect_total
    }

    /// The client id of every CONNECT, in arrival order (before `auto-` assignment: empty stays
    /// empty); kept only with `record`, bounded like `received`.
    pub fn connects(&self) -> Vec<String> {
        lock(&self.shared.state).connects.clone()
    }

    /// Ids of the currently connected clients, sorted.
    pub fn clients(&self) -> Vec<String> {
        let mut v: Vec<String> = lock(&self.shared.state).clients.keys().cloned().collect();
        v.sort();
        v
    }

    /// The most recent log lines (up to 2000), oldest first.
    pub fn log_lines(&self) -> Vec<String> {
        lock(&self.shared.log_ring).iter().cloned().collect()
    }
}

impl Drop for BrokerHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(shared: Arc<Shared>, listener: TcpListener) {
    let mut last_error: Option<io::ErrorKind> = None;
    loop {
        let accepted = listener.accept();
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        let (stream, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                if last_error != Some(e.kind()) {
                    shared.log(format!("WARNING: broker: accept failed: {e}"));
                    last_error = Some(e.kind());
                }
                // Out of descriptors or a similar transient: back off instead of spinning.
                crate::sys::sleep(Duration::from_millis(50));
                continue;
            }
        };
        last_error = None;
        let _ = stream.set_nodelay(true);
        let id = shared.next_conn.fetch_add(1, Ordering::SeqCst);
        let Ok(registry_copy) = stream.try_clone() else {
            continue;
        };
        let sh = shared.clone();
        let spawned = thread::Builder::new()
            .name("broker-conn".into())
            .stack_size(READER_STACK)
            .spawn(move || serve(sh, id, stream, peer));
        let mut conns = lock(&shared.conns);
        conns.retain(|_, s| !s.thread.as_ref().is_some_and(|t| t.is_finished()) || take_join(s));
        match spawned {
            Ok(t) => {
                conns.insert(id, ConnSlot { stream: Some(registry_copy), thread: Some(t) });
            }
            Err(e) => {
                drop(conns);
                shared.log(format!("WARNING: broker: connection from {peer}: cannot start a thread: {e}"));
            }
        }
    }
}

/// Joins a finished connection thread; returns false so `retain` drops its slot.
fn take_join(s: &mut ConnSlot) -> bool {
    if let Some(t) = s.thread.take() {
        let _ = t.join();
    }
    false
}

fn writer_loop(mut stream: TcpStream, rx: Receiver<Out>) {
    let mut batch: Vec<u8> = Vec::new();
    'outer: while let Ok(first) = rx.recv() {
        let mut closing = false;
        let mut push = |m: Out, batch: &mut Vec<u8>| match m {
            Out::Owned(v) => batch.extend_from_slice(&v),
            Out::Shared(v) => batch.extend_from_slice(&v),
            Out::Close => closing = true,
        };
        push(first, &mut batch);
        while batch.len() < WRITE_BATCH {
            match rx.try_recv() {
                Ok(m) => push(m, &mut batch),
                Err(_) => break,
            }
        }
        if !batch.is_empty() && stream.write_all(&batch).is_err() {
            let _ = stream.shutdown(Shutdown::Both);
            break 'outer;
        }
        batch.clear();
        if batch.capacity() > 4 * WRITE_BATCH {
            batch.shrink_to(WRITE_BATCH);
        }
        if closing {
            break;
        }
    }
    let _ = stream.shutdown(Shutdown::Write);
}

/// Why a connection ended, as the log line's tail (None: a normal end, not logged).
type End = Option<String>;

struct Conn {
    shared: Arc<Shared>,
    conn: u64,
    peer: SocketAddr,
    stream: TcpStream,
    tx: SyncSender<Out>,
    buf: Vec<u8>,
    pos: usize,
    client_id: Option<String>,
}

fn serve(shared: Arc<Shared>, conn: u64, stream: TcpStream, peer: SocketAddr) {
    let (tx, rx) = mpsc::sync_channel::<Out>(shared.cfg.queue_limit.max(1));
    let writer = match stream.try_clone().and_then(|ws| {
        ws.set_write_timeout(Some(WRITE_TIMEOUT))?;
        thread::Builder::new().name("broker-write".into()).stack_size(WRITER_STACK).spawn(move || writer_loop(ws, rx))
    }) {
        Ok(w) => w,
        Err(e) => {
            shared.log(format!("WARNING: broker: connection from {peer}: cannot start a writer: {e}"));
            let _ = stream.shutdown(Shutdown::Both);
            forget_conn(&shared, conn);
            return;
        }
    };
    let mut c = Conn { shared, conn, peer, stream, tx, buf: Vec::new(), pos: 0, client_id: None };
    let end = c.run();
    if let Some(why) = end {
        let line = c.who(&why);
        c.shared.log(line);
    }
    if let Some(id) = &c.client_id {
        let mut st = lock(&c.shared.state);
        if st.clients.get(id).is_some_and(|cl| cl.conn == conn) {
            st.clients.remove(id);
        }
    }
    let _ = c.tx.try_send(Out::Close);
    let Conn { shared, stream, tx, .. } = c;
    drop(tx);
    let _ = writer.join();
    let _ = stream.shutdown(Shutdown::Both);
    forget_conn(&shared, conn);
}

fn forget_conn(shared: &Shared, conn: u64) {
    if let Some(slot) = lock(&shared.conns).get_mut(&conn) {
        slot.stream = None;
    }
}

enum ReadEnd {
    Eof,
    Timeout,
    Io(io::Error),
    TooLarge(usize),
    Malformed(codec::DecodeError),
}

fn short_id(id: &str) -> String {
    let s = one_line(id);
    if s.chars().count() > 64 {
        format!("{}...", s.chars().take(64).collect::<String>())
    } else {
        s
    }
}

impl Conn {
    fn who(&self, msg: &str) -> String {
        let (prefix, msg) = match msg.strip_prefix("WARNING: ") {
            Some(m) => ("WARNING: ", m),
            None => ("NOTE: ", msg),
        };
        match &self.client_id {
            Some(id) => format!("{prefix}broker: client {} ({}): {msg}", short_id(id), self.peer),
            None => format!("{prefix}broker: connection from {}: {msg}", self.peer),
        }
    }

    /// Reads one complete packet; returns its byte range in `self.buf`. The declared size is
    /// checked against `max_packet` before the body is buffered.
    fn next_frame(&mut self) -> Result<std::ops::Range<usize>, ReadEnd> {
        loop {
            let avail = &self.buf[self.pos..];
            let need = match codec::fixed_header(avail) {
                Err(e) => return Err(ReadEnd::Malformed(e)),
                Ok(Some((remaining, hlen))) => {
                    let total = hlen + remaining;
                    if total > self.shared.cfg.max_packet {
                        return Err(ReadEnd::TooLarge(total));
                    }
                    if avail.len() >= total {
                        let r = self.pos..self.pos + total;
                        self.pos += total;
                        return Ok(r);
                    }
                    total - avail.len()
                }
                Ok(None) => 1,
            };
            if self.pos > 0 {
                self.buf.drain(..self.pos);
                self.pos = 0;
            }
            if self.buf.is_empty() && self.buf.capacity() > 8 * READ_CHUNK {
                self.buf = Vec::new();
            }
            let old = self.buf.len();
            self.buf.resize(old + need.max(READ_CHUNK), 0);
            let n = loop {
                match self.stream.read(&mut self.buf[old..]) {
                    Ok(n) => break n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        self.buf.truncate(old);
                        return Err(match e.kind() {
                            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => ReadEnd::Timeout,
                            _ => ReadEnd::Io(e),
                        });
                    }
                }
            };
            self.buf.truncate(old + n);
            if n == 0 {
                return Err(ReadEnd::Eof);
            }
        }
    }

    fn send(&self, bytes: Vec<u8>) -> Result<(), String> {
        if send_with_grace(&self.tx, Out::Owned(bytes), &self.shared.stop) {
            Ok(())
        } else {
            Err(overflow_msg(self.shared.cfg.queue_limit))
        }
    }

    fn read_end(&self, e: ReadEnd, phase_timeout: &str) -> End {
        match e {
            ReadEnd::Eof => self.client_id.is_none().then(|| "closed before CONNECT".to_string()),
            ReadEnd::Timeout => Some(phase_timeout.to_string()),
            ReadEnd::Io(_) if self.shared.stop.load(Ordering::SeqCst) => None,
            ReadEnd::Io(e) => match e.kind() {
                io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe => None,
                _ => Some(format!("read failed: {e}")),
            },
            ReadEnd::TooLarge(n) => {
                Some(format!("packet of {n} bytes exceeds max-packet {}; closing", self.shared.cfg.max_packet))
            }
            ReadEnd::Malformed(e) => Some(format!("protocol error: {e}; closing")),
        }
    }

    fn run(&mut self) -> End {
        let timeout = self.shared.cfg.connect_timeout;
        if self.stream.set_read_timeout(Some(timeout.max(Duration::from_millis(1)))).is_err() {
            return Some("cannot set a read timeout".into());
        }
        let first = match self.next_frame() {
            Ok(r) => r,
            Err(e) => {
                return self.read_end(e, &format!("no CONNECT within {} ms; closing", timeout.as_millis()));
            }
        };
        let buf = std::mem::take(&mut self.buf);
        let r = self.connect(&buf[first]);
        self.buf = buf;
        let keep_alive = match r {
            Ok(k) => k,
            Err(end) => return end,
        };
        let limit = (keep_alive > 0).then(|| Duration::from_millis(u64::from(keep_alive) * 1500));
        if self.stream.set_read_timeout(limit).is_err() {
            return Some("cannot set a read timeout".into());
        }
        let ka_msg = format!("keepalive timeout (nothing for 1.5 x {keep_alive} s); closing");
        loop {
            let range = match self.next_frame() {
                Ok(r) => r,
                Err(e) => return self.read_end(e, &ka_msg),
            };
            let buf = std::mem::take(&mut self.buf);
            let r = self.packet(&buf[range]);
            self.buf = buf;
            if let Err(end) = r {
                return end;
            }
        }
    }

    /// Handles the first packet; `Ok(keep_alive)` when the client is connected.
    fn connect(&mut self, frame: &[u8]) -> Result<u16, End> {
        let pkt = codec::decode(frame).map_err(|e| Some(format!("protocol error: {e}; closing")))?;
        let c = match pkt {
            Packet::Connect(c) => c,
            Packet::UnsupportedLevel(n) => {
                lock(&self.shared.state).note_connect("", self.shared.cfg.record);
                let _ = self.send(codec::connack(0x01));
                return Err(Some(format!("unsupported protocol level {n}; only 4 (3.1.1)")));
            }
            _ => return Err(Some("protocol error: first packet is not CONNECT; closing".into())),
        };
        lock(&self.shared.state).note_connect(c.client_id, self.shared.cfg.record);
        let id = if c.client_id.is_empty() {
            format!("auto-{}", crate::sys::random_hex(8).unwrap_or_else(|_| format!("{:016x}", self.conn)))
        } else {
            c.client_id.to_string()
        };
        self.client_id = Some(id.clone());
        if self.shared.stall_active(&id) {
            self.shared.wait_stall(&id);
            if self.shared.stop.load(Ordering::SeqCst) {
                return Err(None);
            }
        }
        if c.will {
            let _ = self.send(codec::connack(0x03));
            return Err(Some("will messages are not supported".into()));
        }
        if let Some(want_user) = &self.shared.cfg.username {
            let Some(user) = c.username else {
                let _ = self.send(codec::connack(0x05));
                return Err(Some("no username; not authorized (0x05)".into()));
            };
            let want_pass = self.shared.cfg.password.as_deref().unwrap_or("").as_bytes();
            if user != want_user || c.password != Some(want_pass) {
                let _ = self.send(codec::connack(0x04));
                return Err(Some("bad username or password (0x04)".into()));
            }
        }
        if !c.clean_session {
            let line = self.who("WARNING: CleanSession=0 requested; treating the session as clean");
            self.shared.log(line);
        }
        let clone = self.stream.try_clone().map_err(|e| Some(format!("cannot register: {e}")))?;
        let old = {
            let mut st = lock(&self.shared.state);
            let old = st.clients.insert(
                id.clone(),
                Client { conn: self.conn, tx: self.tx.clone(), stream: clone, session: Session::default() },
            );
            self.send(codec::connack(0x00)).map_err(Some)?;
            old
        };
        if let Some(old) = old {
            let _ = old.stream.shutdown(Shutdown::Both);
            let line = self.who("client id connected again; closed the older connection");
            self.shared.log(line);
        }
        Ok(c.keep_alive)
    }

    fn packet(&mut self, frame: &[u8]) -> Result<(), End> {
        let pkt = codec::decode(frame).map_err(|e| Some(format!("protocol error: {e}; closing")))?;
        match pkt {
            Packet::Publish(p) => {
                let msg = Publish { topic: p.topic, payload: p.payload, qos: p.qos, retain: p.retain };
                if let Some(line) = self.publish(&msg)? {
                    return Err(Some(line));
                }
                if p.qos == 1 {
                    self.send(codec::puback(p.pid)).map_err(Some)?;
                }
                Ok(())
            }
            Packet::Puback(_) => Ok(()),
            Packet::Subscribe { pid, filters } => self.subscribe(pid, &filters),
            Packet::Unsubscribe { pid, filters } => {
                let mut st = lock(&self.shared.state);
                let id = self.client_id.as_deref().unwrap_or("");
                match st.clients.get_mut(id) {
                    Some(cl) if cl.conn == self.conn => cl.session.unsubscribe(&filters),
                    _ => return Err(None),
                }
                drop(st);
                self.send(codec::unsuback(pid)).map_err(Some)
            }
            Packet::Pingreq => self.send(codec::pingresp()).map_err(Some),
            Packet::Disconnect => Err(None),
            Packet::Qos2Flow(name) => Err(Some(format!("protocol error: {name} (QoS 2 is not supported); closing"))),
            Packet::Connect(_) | Packet::UnsupportedLevel(_) => {
                Err(Some("protocol error: second CONNECT; closing".into()))
            }
            Packet::ServerOnly(name) => Err(Some(format!("protocol error: client sent {name}; closing"))),
        }
    }

    fn subscribe(&mut self, pid: u16, filters: &[(&str, u8)]) -> Result<(), End> {
        let mut st = lock(&self.shared.state);
        let State { clients, retained, .. } = &mut *st;
        let id = self.client_id.as_deref().unwrap_or("");
        let Some(cl) = clients.get_mut(id).filter(|cl| cl.conn == self.conn) else {
            return Err(None);
        };
        let decided = route::subscribe(&mut cl.session, retained, filters);
        let mut out = vec![codec::suback(pid, &decided.codes)];
        for r in decided.replay {
            out.push(codec::publish(r.topic, r.payload, r.qos, r.pid, true));
        }
        // Queue under the lock while there is room, so no live message overtakes a retained one;
        // a burst larger than the queue waits for room after the lock is released.
        let mut rest = out.into_iter().map(Out::Owned);
        let mut pending = Vec::new();
        for p in rest.by_ref() {
            if let Err(TrySendError::Full(p)) = cl.tx.try_send(p) {
                pending.push(p);
                break;
            }
        }
        pending.extend(rest);
        drop(st);
        for p in pending {
            if !send_with_grace(&self.tx, p, &self.shared.stop) {
                self.evict(id, self.conn);
                return Err(Some(overflow_msg(self.shared.cfg.queue_limit)));
            }
        }
        Ok(())
    }

    /// Removes client `id` (if it is still connection `conn`) and closes its socket.
    fn evict(&self, id: &str, conn: u64) -> bool {
        let mut st = lock(&self.shared.state);
        if st.clients.get(id).is_some_and(|cl| cl.conn == conn) {
            if let Some(cl) = st.clients.remove(id) {
                let _ = cl.stream.shutdown(Shutdown::Both);
            }
            return true;
        }
        false
    }

    /// Stores and forwards one PUBLISH (`route::route` decides, this queues). `Err` when the
    /// message is refused; `Ok(Some(line))` when this very client overflowed.
    fn publish(&self, msg: &Publish<'_>) -> Result<Option<String>, End> {
        let shared = &self.shared;
        let mut st = lock(&shared.state);
        let State { clients, retained, received, received_bytes, .. } = &mut *st;
        let mut targets: Vec<(&String, &mut Client)> = clients.iter_mut().collect();
        let routed = route::route(targets.iter_mut().map(|(_, cl)| &mut cl.session), msg).map_err(|r| {
            Some(match r {
                Refusal::Qos2 => "QoS 2 is not supported; closing".to_string(),
                Refusal::InvalidTopic => format!(
                    "protocol error: invalid publish topic '{}' (empty or wildcard); closing",
                    short_id(msg.topic)
                ),
            })
        })?;
        let (t, payload) = (msg.topic, msg.payload);
        if shared.cfg.record {
            received.push_back((t.to_string(), payload.to_vec(), msg.retain));
            *received_bytes += payload.len();
            while received.len() > RECORD_MAX_MESSAGES || *received_bytes > RECORD_MAX_BYTES {
                match received.pop_front() {
                    Some((_, p, _)) => *received_bytes -= p.len(),
                    None => break,
                }
            }
        }
        if let Some(op) = routed.retain {
            op.apply(retained, t);
        }
        let mut qos0: Option<Arc<[u8]>> = None;
        let mut blocked: Vec<(String, u64, SyncSender<Out>, Out)> = Vec::new();
        for d in routed.deliveries {
            let (id, cl) = &targets[d.to];
            let out = if d.qos == 0 {
                Out::Shared(qos0.get_or_insert_with(|| codec::publish(t, payload, 0, 0, false).into()).clone())
            } else {
                Out::Owned(codec::publish(t, payload, d.qos, d.pid, false))
            };
            if let Err(TrySendError::Full(out)) = cl.tx.try_send(out) {
                blocked.push(((*id).clone(), cl.conn, cl.tx.clone(), out));
            }
        }
        drop(st);
        // Backpressure: a full queue makes this publisher wait (outside the lock) for room; a
        // queue that stays full for OVERFLOW_GRACE is an overflow and the client is dropped.
        let mut mine = None;
        for (id, conn, tx, out) in blocked {
            if send_with_grace(&tx, out, &shared.stop) || !self.evict(&id, conn) {
                continue;
            }
            if conn == self.conn {
                mine = Some(overflow_msg(shared.cfg.queue_limit));
            } else {
                shared.log(format!(
                    "WARNING: broker: client {}: {}",
                    short_id(&id),
                    overflow_text(shared.cfg.queue_limit)
                ));
            }
        }
        Ok(mine)
    }
}

/// How long a full outbound queue may stay full (no packet leaves it) before its client is
/// disconnected as overflowed.
const OVERFLOW_GRACE: Duration = Duration::from_secs(1);

/// Queues `out`, waiting up to `OVERFLOW_GRACE` for room; false when the queue stayed full.
fn send_with_grace(tx: &SyncSender<Out>, mut out: Out, stop: &AtomicBool) -> bool {
    let deadline = Instant::now() + OVERFLOW_GRACE;
    let mut pause = Duration::from_micros(50);
    loop {
        match tx.try_send(out) {
            Ok(()) | Err(TrySendError::Disconnected(_)) => return true,
            Err(TrySendError::Full(o)) => {
                if Instant::now() >= deadline || stop.load(Ordering::SeqCst) {
                    return false;
                }
                out = o;
                crate::sys::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(5));
            }
        }
    }
}

fn overflow_msg(limit: usize) -> String {
    format!("WARNING: {}", overflow_text(limit))
}

fn overflow_text(limit: usize) -> String {
    format!("outbound queue full ({limit} messages) for {} s; disconnecting", OVERFLOW_GRACE.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// True once the server side of `s` is closed (EOF or reset) within 5 s.
    fn closed_by_server(s: &mut TcpStream) -> bool {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 64];
        !matches!(s.read(&mut b), Ok(n) if n > 0)
            && !matches!(s.read(&mut b), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    #[test]
    fn broker_shutdown_joins_the_acceptor_even_when_the_wake_connect_fails() {
        let mut h = start(BrokerConfig { bind: "127.0.0.1:0".parse().unwrap(), ..Default::default() }).unwrap();
        let addr = h.addr();
        let mut before: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(addr).unwrap()).collect();
        wait_slots(&h, 3);
        // A wake-up connect that fails: a port nobody listens on.
        let dead = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        h.stop_with_wake(dead);
        // The listener went with its joined acceptor: a later connect is refused.
        if let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            panic!("connect after shutdown succeeded (acceptor not joined); closed: {}", closed_by_server(&mut s));
        }
        for s in &mut before {
            assert!(closed_by_server(s), "every connection of the broker is closed after shutdown");
        }
        assert!(lock(&h.shared.conns).is_empty(), "no connection slot is left");
    }

    #[test]
    fn broker_shutdown_closes_connections_accepted_during_the_drain() {
        let h = start(BrokerConfig { bind: "127.0.0.1:0".parse().unwrap(), ..Default::default() }).unwrap();
        let addr = h.addr();
        let shared = h.shared.clone();
        // Clients keep connecting while the broker shuts down.
        let done = Arc::new(AtomicBool::new(false));
        let d2 = done.clone();
        let dialer = thread::spawn(move || {
            let mut v = Vec::new();
            while !d2.load(Ordering::SeqCst) && v.len() < 200 {
                if let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
                    v.push(s);
                }
            }
            v
        });
        wait_slots(&h, 1);
        drop(h);
        done.store(true, Ordering::SeqCst);
        for s in &mut dialer.join().unwrap() {
            assert!(closed_by_server(s), "every connection of the broker is closed after shutdown");
        }
        assert!(lock(&shared.conns).is_empty(), "no connection slot is left");
    }

    fn wait_slots(h: &BrokerHandle, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while lock(&h.shared.conns).len() < n {
            assert!(Instant::now() < deadline, "connections were not accepted");
            thread::sleep(Duration::from_millis(5));
        }
    }
}
