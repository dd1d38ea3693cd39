//! One client connection: the reader (frame, decode, CONNECT and auth, packet handling, keepalive)
//! and the writer thread that drains the client's bounded queue into its socket, with the
//! backpressure and overflow rule between them. Routing decisions come from `route`; this file
//! locks the state, asks `route`, then encodes and queues what it decided.
//!
//! It never writes a socket under the state lock (only the writer thread writes, from the queue),
//! waits for queue room under it only for the CONNACK into a fresh queue, and never spawns
//! anything but its own writer, which it joins before returning.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::codec::{self, Packet};
use super::route::{self, Publish, Refusal};
use super::session::{self, Delivered, Msg, Send, Session};
use super::state::{lock, Client, Link, Out, Shared, State};
use super::topic;
use crate::text::one_line;

const WRITER_STACK: usize = 64 * 1024;
const READ_CHUNK: usize = 8 * 1024;
/// Bytes the writer gathers from its queue before one write call.
const WRITE_BATCH: usize = 64 * 1024;
/// A writer blocked this long on one write gives up on the client.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest first packet (CONNECT) accepted before the client is authenticated, so a connection
/// that has not authenticated cannot make the broker buffer a max-packet frame.
const CONNECT_MAX: usize = 64 * 1024;

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
    /// The frame size limit now: `CONNECT_MAX` until CONNECT is accepted, then `max_packet`.
    frame_limit: usize,
    /// A retained message of this connection was already refused at a cap (logged once).
    retain_refusal_logged: bool,
    /// The CONNECT's will, published unless the client ends with DISCONNECT (MQTT-3.1.2-8).
    will: Option<OwnedWill>,
    /// The client sent DISCONNECT: its will is discarded (MQTT-3.1.2-10).
    graceful: bool,
}

/// A will message kept for the connection's life.
struct OwnedWill {
    topic: String,
    payload: Vec<u8>,
    qos: u8,
    retain: bool,
}

pub(super) fn serve(shared: Arc<Shared>, conn: u64, stream: TcpStream, peer: SocketAddr) {
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
    let frame_limit = shared.cfg.max_packet.min(CONNECT_MAX);
    let mut c = Conn {
        shared,
        conn,
        peer,
        stream,
        tx,
        buf: Vec::new(),
        pos: 0,
        client_id: None,
        frame_limit,
        retain_refusal_logged: false,
        will: None,
        graceful: false,
    };
    let end = c.run();
    if let Some(why) = end {
        let line = c.who(&why);
        c.shared.log(line);
    }
    c.publish_will();
    if let Some(id) = &c.client_id {
        let mut st = lock(&c.shared.state);
        if st.clients.get(id).is_some_and(|cl| cl.is_conn(conn)) {
            let persistent = st.clients.get(id).is_some_and(|cl| cl.persistent);
            if persistent {
                // MQTT-3.1.2-4: the session outlives the connection; queued messages wait for it.
                if let Some(cl) = st.clients.get_mut(id) {
                    cl.link = None;
                    cl.session.shrink();
                }
            } else {
                st.clients.remove(id);
            }
        }
    }
    let _ = c.tx.try_send(Out::Close);
    let Conn { shared, stream, tx, .. } = c;
    drop(tx);
    let _ = writer.join();
    let _ = stream.shutdown(Shutdown::Both);
    forget_conn(&shared, conn);
}

/// The connection has ended: its slot no longer holds a socket and it leaves the
/// `max_connections` count. Called exactly once per `serve`.
fn forget_conn(shared: &Shared, conn: u64) {
    if let Some(slot) = lock(&shared.conns).get_mut(&conn) {
        slot.stream = None;
    }
    if shared.active.fetch_sub(1, Ordering::SeqCst) == 1 {
        // The last connection ended: hand the freed buffers back (issue 17, memory after clients
        // leave).
        crate::sys::release_free_memory();
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
                    if total > self.frame_limit {
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
            ReadEnd::TooLarge(n) if self.client_id.is_none() => {
                Some(format!("first packet of {n} bytes exceeds the CONNECT limit {}; closing", self.frame_limit))
            }
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
        self.frame_limit = self.shared.cfg.max_packet;
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
                let _ = self.send(codec::connack(false, 0x01));
                return Err(Some(format!("unsupported protocol level {n}; only 4 (3.1.1)")));
            }
            _ => return Err(Some("protocol error: first packet is not CONNECT; closing".into())),
        };
        lock(&self.shared.state).note_connect(c.client_id, self.shared.cfg.record);
        if c.client_id.is_empty() && !c.clean_session {
            // MQTT-3.1.3-8: a zero-length id needs CleanSession=1.
            let _ = self.send(codec::connack(false, 0x02));
            return Err(Some("zero-length client id with CleanSession=0; identifier rejected (0x02)".into()));
        }
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
        if let Some(w) = &c.will {
            if !topic::valid_topic_name(w.topic) {
                return Err(Some(format!(
                    "protocol error: invalid will topic '{}' (empty or wildcard); closing",
                    short_id(w.topic)
                )));
            }
        }
        let cfg = &self.shared.cfg;
        let want = cfg.username.as_deref().map(|u| (u, cfg.password.as_deref().unwrap_or("").as_bytes()));
        match route::authorize(want, c.username, c.password) {
            0x00 => {}
            0x05 => {
                let _ = self.send(codec::connack(false, 0x05));
                return Err(Some("no username; not authorized (0x05)".into()));
            }
            code => {
                let _ = self.send(codec::connack(false, code));
                return Err(Some("bad username or password (0x04)".into()));
            }
        }
        self.will = c.will.as_ref().map(|w| OwnedWill {
            topic: w.topic.to_string(),
            payload: w.payload.to_vec(),
            qos: w.qos,
            retain: w.retain,
        });
        let clone = self.stream.try_clone().map_err(|e| Some(format!("cannot register: {e}")))?;
        let (old, pending) = {
            let mut st = lock(&self.shared.state);
            let old = st.clients.remove(&id);
            let (session, present, old_link) = match old {
                // MQTT-3.2.2-2: a stored session is resumed and reported.
                Some(cl) if !c.clean_session && cl.persistent => (cl.session, true, cl.link),
                // MQTT-3.1.2-6: CleanSession=1 discards any previous session.
                Some(cl) => (Session::default(), false, cl.link),
                None => {
                    let stored = st.clients.values().filter(|cl| cl.link.is_none()).count();
                    if !c.clean_session && stored >= self.shared.cfg.max_sessions {
                        drop(st);
                        let _ = self.send(codec::connack(false, 0x03));
                        return Err(Some(format!(
                            "WARNING: max-sessions {} persistent sessions stored; server unavailable (0x03)",
                            self.shared.cfg.max_sessions
                        )));
                    }
                    (Session::default(), false, None)
                }
            };
            let link = Link { conn: self.conn, tx: self.tx.clone(), stream: clone };
            let mut client = Client { link: Some(link), session, persistent: !c.clean_session };
            self.send(codec::connack(present, 0x00)).map_err(Some)?;
            // MQTT-4.4.0-1: unacknowledged PUBLISH and PUBREL packets go again, in order.
            let resend: Vec<Out> = client.session.resume().iter().map(|s| Out::Owned(encode(s))).collect();
            let pending = queue_now(&self.tx, resend);
            st.clients.insert(id.clone(), client);
            (old_link, pending)
        };
        if let Some(old) = old {
            let _ = old.stream.shutdown(Shutdown::Both);
            let line = self.who("client id connected again; closed the older connection");
            self.shared.log(line);
        }
        for p in pending {
            if !send_with_grace(&self.tx, p, &self.shared.stop) {
                return Err(Some(overflow_msg(self.shared.cfg.queue_limit)));
            }
        }
        Ok(c.keep_alive)
    }

    /// Runs `f` on this connection's session; None when another connection took the client id.
    fn with_session<R>(&self, f: impl FnOnce(&mut Session) -> R) -> Option<R> {
        let mut st = lock(&self.shared.state);
        let id = self.client_id.as_deref().unwrap_or("");
        st.clients.get_mut(id).filter(|cl| cl.is_conn(self.conn)).map(|cl| f(&mut cl.session))
    }

    /// Publishes the will after an abnormal end (MQTT-3.1.2-8), at its QoS and with its retain
    /// flag (MQTT-3.1.2-15, -17); not after DISCONNECT or while the broker shuts down.
    fn publish_will(&mut self) {
        let Some(w) = self.will.take() else { return };
        if self.graceful || self.shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let msg = Publish { topic: &w.topic, payload: &w.payload, qos: w.qos, retain: w.retain };
        let _ = self.publish(&msg);
    }

    fn packet(&mut self, frame: &[u8]) -> Result<(), End> {
        let pkt = codec::decode(frame).map_err(|e| Some(format!("protocol error: {e}; closing")))?;
        match pkt {
            Packet::Publish(p) => {
                let msg = Publish { topic: p.topic, payload: p.payload, qos: p.qos, retain: p.retain };
                // QoS 2, Method B (MQTT-4.3.3-2): routed once; a duplicate before PUBREL is not.
                let new = p.qos < 2 || self.with_session(|s| s.incoming_qos2(p.pid)).ok_or(None)?;
                if new {
                    if let Some(line) = self.publish(&msg)? {
                        return Err(Some(line));
                    }
                }
                match p.qos {
                    1 => self.send(codec::puback(p.pid)).map_err(Some),
                    2 => self.send(codec::pubrec(p.pid)).map_err(Some),
                    _ => Ok(()),
                }
            }
            Packet::Puback(pid) => self.with_session(|s| s.puback(pid)).ok_or(None),
            Packet::Pubrec(pid) => match self.with_session(|s| s.pubrec(pid)).ok_or(None)? {
                Some(rel) => self.send(encode(&rel)).map_err(Some),
                None => Ok(()),
            },
            Packet::Pubrel(pid) => {
                self.with_session(|s| s.incoming_release(pid)).ok_or(None)?;
                self.send(codec::pubcomp(pid)).map_err(Some)
            }
            Packet::Pubcomp(pid) => self.with_session(|s| s.pubcomp(pid)).ok_or(None),
            Packet::Subscribe { pid, filters } => self.subscribe(pid, &filters),
            Packet::Unsubscribe { pid, filters } => {
                let mut st = lock(&self.shared.state);
                let id = self.client_id.as_deref().unwrap_or("");
                match st.clients.get_mut(id) {
                    Some(cl) if cl.is_conn(self.conn) => cl.session.unsubscribe(&filters),
                    _ => return Err(None),
                }
                drop(st);
                self.send(codec::unsuback(pid)).map_err(Some)
            }
            Packet::Pingreq => self.send(codec::pingresp()).map_err(Some),
            Packet::Disconnect => {
                self.graceful = true;
                Err(None)
            }
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
        let Some(cl) = clients.get_mut(id).filter(|cl| cl.is_conn(self.conn)) else {
            return Err(None);
        };
        let max_subs = self.shared.cfg.max_subscriptions;
        let lim = self.shared.session_limits();
        let decided = route::subscribe(&mut cl.session, retained, max_subs, filters);
        let over_cap = decided.over_cap;
        let mut out = vec![Out::Owned(codec::suback(pid, &decided.codes))];
        let mut dropped = false;
        for r in decided.replay {
            let msg = Msg { topic: r.topic.into(), payload: r.payload.into(), qos: r.qos, retain: true };
            match cl.session.deliver(msg, true, &lim) {
                Delivered::Send(s) => out.push(Out::Owned(encode(&s))),
                Delivered::Dropped { first } => dropped |= first,
                Delivered::Queued | Delivered::Skipped => {}
            }
        }
        // Queue under the lock while there is room, so no live message overtakes a retained one;
        // a burst larger than the queue waits for room after the lock is released.
        let pending = queue_now(&self.tx, out);
        drop(st);
        if dropped {
            let line = self.who(&format!("WARNING: {}", session_full_text(&lim)));
            self.shared.log(line);
        }
        if over_cap > 0 {
            let line = self.who(&format!(
                "WARNING: {over_cap} filter(s) refused (0x80): max-subscriptions {max_subs} per client reached"
            ));
            self.shared.log(line);
        }
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
        if st.clients.get(id).is_some_and(|cl| cl.is_conn(conn)) {
            if let Some(cl) = st.clients.get_mut(id) {
                if let Some(link) = cl.link.take() {
                    let _ = link.stream.shutdown(Shutdown::Both);
                }
                if !cl.persistent {
                    st.clients.remove(id);
                }
            }
            return true;
        }
        false
    }

    /// Stores and forwards one PUBLISH (`route::route` decides, this queues). `Err` when the
    /// message is refused; `Ok(Some(line))` when this very client overflowed.
    fn publish(&mut self, msg: &Publish<'_>) -> Result<Option<String>, End> {
        let shared = self.shared.clone();
        let mut st = lock(&shared.state);
        let State { clients, retained, retained_bytes, .. } = &mut *st;
        let mut targets: Vec<(&String, &mut Client)> = clients.iter_mut().collect();
        let routed = route::route(targets.iter().map(|(_, cl)| &cl.session), msg).map_err(|r| {
            Some(match r {
                Refusal::InvalidTopic => format!(
                    "protocol error: invalid publish topic '{}' (empty or wildcard); closing",
                    short_id(msg.topic)
                ),
            })
        })?;
        let (t, payload) = (msg.topic, msg.payload);
        let mut refused_retain = None;
        if let Some(op) = routed.retain {
            let limits = route::RetainLimits {
                max_message: shared.cfg.max_retained_message,
                max_total: shared.cfg.max_retained_bytes,
            };
            refused_retain = route::apply_retain(retained, retained_bytes, t, op, &limits).err();
        }
        let mut qos0: Option<Arc<[u8]>> = None;
        // The message as sessions keep it, built once for every QoS 1/2 copy.
        let mut kept: Option<(Arc<str>, Arc<[u8]>)> = None;
        let lim = shared.session_limits();
        let mut full: Vec<String> = Vec::new();
        let mut blocked: Vec<(String, u64, SyncSender<Out>, Out)> = Vec::new();
        for d in routed.deliveries {
            let (id, cl) = &mut targets[d.to];
            let out = if d.qos == 0 {
                if cl.link.is_none() {
                    continue;
                }
                Out::Shared(qos0.get_or_insert_with(|| codec::publish(t, payload, 0, 0, false, false).into()).clone())
            } else {
                let (topic, body) = kept.get_or_insert_with(|| (t.into(), payload.into())).clone();
                let m = Msg { topic, payload: body, qos: d.qos, retain: false };
                match cl.session.deliver(m, cl.link.is_some(), &lim) {
                    Delivered::Send(s) => Out::Owned(encode(&s)),
                    Delivered::Dropped { first: true } => {
                        full.push((*id).clone());
                        continue;
                    }
                    Delivered::Dropped { .. } | Delivered::Queued | Delivered::Skipped => continue,
                }
            };
            let Some(link) = &cl.link else { continue };
            if let Err(TrySendError::Full(out)) = link.tx.try_send(out) {
                blocked.push(((*id).clone(), link.conn, link.tx.clone(), out));
            }
        }
        if shared.cfg.record {
            st.note_received(msg);
        }
        drop(st);
        for id in full {
            shared.log(format!("WARNING: broker: client {}: {}", short_id(&id), session_full_text(&lim)));
        }
        if let Some(over) = refused_retain {
            if !self.retain_refusal_logged {
                self.retain_refusal_logged = true;
                let why = match over {
                    route::RetainOver::Message { size, max } => {
                        format!("{size} bytes exceed max-retained-message {max}")
                    }
                    route::RetainOver::Total { size, used, max } => {
                        format!("{size} more bytes would exceed max-retained-bytes {max} ({used} held)")
                    }
                };
                let line = self.who(&format!(
                    "WARNING: retained message on '{}' not stored: {why}; forwarded only (further refusals of this connection are not logged)",
                    short_id(t)
                ));
                shared.log(line);
            }
        }
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

/// The packet bytes of one `Send`.
fn encode(s: &Send) -> Vec<u8> {
    match s {
        Send::Publish { msg, pid, dup } => codec::publish(&msg.topic, &msg.payload, msg.qos, *pid, msg.retain, *dup),
        Send::Pubrel(pid) => codec::pubrel(*pid),
    }
}

/// Queues `out` in order while the queue has room; returns what did not fit, in order.
fn queue_now(tx: &SyncSender<Out>, out: Vec<Out>) -> Vec<Out> {
    let mut rest = out.into_iter();
    let mut pending = Vec::new();
    for p in rest.by_ref() {
        if let Err(TrySendError::Full(p)) = tx.try_send(p) {
            pending.push(p);
            break;
        }
    }
    pending.extend(rest);
    pending
}

fn session_full_text(lim: &session::Limits) -> String {
    format!(
        "session full ({} QoS 1/2 messages or {} bytes unacknowledged or queued); dropping new messages for it until it drains",
        lim.messages, lim.bytes
    )
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
