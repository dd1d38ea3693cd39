//! The client connections of the readiness loop: `Table` owns every accepted socket (nonblocking,
//! one descriptor each), its read buffer and its bounded outbound queue, frames and decodes what
//! arrives (CONNECT and auth, then packets), and writes queued packets when the socket has room.
//! It also keeps the connections' timers (connect deadline, keepalive, a queue that does not move)
//! and the backpressure rule: a publisher whose message finds a subscriber's queue full reads
//! nothing more until that queue has room, and a queue that stays full for `OVERFLOW_GRACE`
//! disconnects its client. Routing decisions come from `route`; this file locks the state, asks
//! `route`, then encodes and queues what it decided.
//!
//! It is driven by one thread (`server`'s loop) and never blocks: no socket call waits, and no
//! socket is written under the state lock. It never accepts connections or spawns threads.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::codec::{self, Packet};
use super::route::{self, Publish, Refusal};
use super::session::{self, Delivered, Msg, Send, Session};
use super::state::{lock, Client, Link, Out, Shared, State};
use super::topic;
use crate::sys::{Epoll, EPOLL_ERR, EPOLL_IN, EPOLL_OUT};
use crate::text::one_line;

/// Bytes read from one socket per readiness event (into the loop's one scratch buffer).
const READ_CHUNK: usize = 64 * 1024;
/// A connection's own read buffer above this is released once it is empty.
const KEEP_READ_BUFFER: usize = 16 * 1024;
/// Bytes gathered from a queue before one write call.
const WRITE_BATCH: usize = 64 * 1024;
/// A queue with bytes to write that makes no progress this long gives up on its client.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a full outbound queue may stay full (nothing written from it) before its client is
/// disconnected as overflowed.
const OVERFLOW_GRACE: Duration = Duration::from_secs(1);
/// Unacknowledged QoS 1/2 messages a live subscriber may hold before a publisher routing to it
/// waits for its acknowledgements (at most `OVERFLOW_GRACE`; a subscriber that acknowledges nothing
/// for that long is waived until it catches up). This bounds the backlog, hence the delivery
/// latency, of a subscriber slower than its publishers, as mosquitto's in-flight window does.
const ACK_WINDOW: usize = 100;
/// A connection that has sent part of its CONNECT must send the rest within this (issue 29: a client
/// sends its CONNECT in one write; one that dribbles it holds a slot for the whole connect timeout
/// otherwise).
const CONNECT_DRIBBLE: Duration = Duration::from_secs(2);
/// Largest first packet (CONNECT) accepted before the client is authenticated, so a connection
/// that has not authenticated cannot make the broker buffer a max-packet frame.
const CONNECT_MAX: usize = 64 * 1024;

/// Why a connection ended, as the log line's tail (None: a normal end, not logged).
type End = Option<String>;

/// A will message kept for the connection's life.
struct OwnedWill {
    topic: String,
    payload: Vec<u8>,
    qos: u8,
    retain: bool,
}

/// Where a connection stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for CONNECT.
    New,
    /// CONNECT read, its CONNACK held by `stall_connack` (the frame is kept in `stalled`).
    Stalled,
    Connected,
    /// Marked for closing at the loop's next safe point; nothing more is read.
    Ending,
}

struct Conn {
    stream: TcpStream,
    peer: SocketAddr,
    phase: Phase,
    /// Bytes received and not yet handled (empty, without capacity, for an idle client).
    buf: Vec<u8>,
    /// Packets queued and not yet in `wbuf`; "full" past `queue_limit`.
    out: VecDeque<Out>,
    /// Bytes being written, from `woff` on.
    wbuf: Vec<u8>,
    woff: usize,
    /// When the queue last moved (bytes written, or it became non-empty or full).
    moved: Instant,
    /// No CONNECT (before it) or nothing received (after it) by then closes the connection.
    read_deadline: Option<Instant>,
    keep_alive: u16,
    /// The connection's live entry in the timer heap.
    timer_at: Option<Instant>,
    /// Queues that were full when this connection's last message was routed: it reads nothing more
    /// until each has room or is gone.
    paused_on: Vec<u64>,
    /// When `paused_on` last became non-empty.
    paused_since: Instant,
    /// This subscriber let a publisher wait `OVERFLOW_GRACE` for acknowledgements: the window does
    /// not hold publishers back until its unacknowledged messages are down to `ACK_WINDOW`.
    window_waived: bool,
    /// The CONNECT frame held by a stall.
    stalled: Option<Vec<u8>>,
    /// Readiness bits registered with epoll.
    interest: u32,
    dirty: bool,
    end: End,
    client_id: Option<String>,
    /// The frame size limit now: `CONNECT_MAX` until CONNECT is accepted, then `max_packet`.
    frame_limit: usize,
    /// A retained message of this connection was already refused at a cap (logged once).
    retain_refusal_logged: bool,
    /// The CONNECT's will, published unless the client ends with DISCONNECT (MQTT-3.1.2-8).
    will: Option<OwnedWill>,
    /// The client sent DISCONNECT: its will is discarded (MQTT-3.1.2-10).
    graceful: bool,
    /// An acknowledgement read in this round left the window past `ACK_WINDOW`: the socket's
    /// delayed ACK goes out at once after the read (see `Table::readable`).
    quickack: bool,
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

    fn pending_write(&self) -> bool {
        self.woff < self.wbuf.len() || !self.out.is_empty()
    }

    /// The earliest timer of this connection: its read deadline, its queue's, or the end of its
    /// wait for a subscriber's acknowledgements (only while that is still ahead of `now`).
    fn next_timer(&self, queue_limit: usize, now: Instant) -> Option<Instant> {
        let write = self
            .pending_write()
            .then(|| self.moved + if self.out.len() > queue_limit { OVERFLOW_GRACE } else { WRITE_TIMEOUT });
        let pause = Some(self.paused_since + OVERFLOW_GRACE).filter(|t| !self.paused_on.is_empty() && *t > now);
        [self.read_deadline, write, pause].into_iter().flatten().min()
    }

    fn wanted_interest(&self) -> u32 {
        let read = matches!(self.phase, Phase::New | Phase::Connected) && self.paused_on.is_empty();
        (if read { EPOLL_IN } else { 0 }) | (if self.pending_write() { EPOLL_OUT } else { 0 })
    }
}

/// What routing one PUBLISH left for its publisher to handle.
struct Routed {
    /// Queues past their limit after this message: the publisher waits for them.
    full: Vec<u64>,
    /// Live subscribers past `ACK_WINDOW` unacknowledged messages: the publisher waits for them too.
    windowed: Vec<u64>,
    refused_retain: Option<route::RetainOver>,
}

/// Every client connection of the loop, with its timers.
pub(super) struct Table {
    shared: Arc<Shared>,
    epoll: Epoll,
    /// Boxed: a table slot is then 16 bytes, not a whole `Conn` (360), so the table's own
    /// capacity (up to twice its length) costs little per idle client.
    conns: HashMap<u64, Box<Conn>>,
    next_id: u64,
    scratch: Vec<u8>,
    timers: BinaryHeap<Reverse<(Instant, u64)>>,
    dirty: Vec<u64>,
    paused: Vec<u64>,
    stalled: Vec<u64>,
    ending: Vec<u64>,
    evicted: usize,
}

impl Table {
    /// `first_id` is the first connection token; smaller ones are the caller's own.
    pub(super) fn new(shared: Arc<Shared>, epoll: Epoll, first_id: u64) -> Table {
        Table {
            shared,
            epoll,
            conns: HashMap::new(),
            next_id: first_id,
            scratch: Vec::new(),
            timers: BinaryHeap::new(),
            dirty: Vec::new(),
            paused: Vec::new(),
            stalled: Vec::new(),
            ending: Vec::new(),
            evicted: 0,
        }
    }

    pub(super) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    pub(super) fn epoll(&self) -> &Epoll {
        &self.epoll
    }

    /// The wait until the earliest connection timer (None: no timer).
    pub(super) fn next_timeout(&self, now: Instant) -> Option<Duration> {
        self.timers.peek().map(|Reverse((t, _))| t.saturating_duration_since(now))
    }

    /// The token the next accepted connection gets (tokens only grow: a smaller one is older).
    pub(super) fn next_token(&self) -> u64 {
        self.next_id
    }

    /// Takes one accepted connection (counted in `active` by the caller).
    pub(super) fn add(&mut self, stream: TcpStream, peer: SocketAddr) -> io::Result<()> {
        stream.set_nonblocking(true)?;
        let _ = stream.set_nodelay(true);
        let id = self.next_id;
        self.next_id += 1;
        self.epoll.add(&stream, id, EPOLL_IN)?;
        let now = Instant::now();
        let conn = Conn {
            stream,
            peer,
            phase: Phase::New,
            buf: Vec::new(),
            out: VecDeque::new(),
            wbuf: Vec::new(),
            woff: 0,
            moved: now,
            read_deadline: Some(now + self.shared.cfg.connect_timeout),
            keep_alive: 0,
            timer_at: None,
            paused_on: Vec::new(),
            paused_since: now,
            window_waived: false,
            stalled: None,
            interest: EPOLL_IN,
            dirty: false,
            end: None,
            client_id: None,
            frame_limit: self.shared.cfg.max_packet.min(CONNECT_MAX),
            retain_refusal_logged: false,
            will: None,
            graceful: false,
            quickack: false,
        };
        self.conns.insert(id, Box::new(conn));
        self.schedule(id);
        Ok(())
    }

    /// Handles readiness `ev` of connection `id`.
    pub(super) fn event(&mut self, id: u64, ev: u32) {
        let Some(c) = self.conns.get(&id) else { return };
        if ev & (EPOLL_IN | EPOLL_ERR) != 0 {
            if c.wanted_interest() & EPOLL_IN != 0 {
                self.readable(id);
            } else if ev & EPOLL_ERR != 0 {
                // Not reading now (paused or stalled) and the peer is gone: level-triggered
                // epoll would report it again on every wait.
                self.end(id, None);
            }
        }
        if ev & EPOLL_OUT != 0 {
            self.flush(id);
        }
    }

    /// The loop's bookkeeping after a round of events: expired timers, connections to close,
    /// publishers whose subscribers have room again, queued output. Returns true when work was
    /// left for another round at once.
    pub(super) fn tick(&mut self) -> bool {
        self.expire(Instant::now());
        for _ in 0..8 {
            self.close_ending();
            self.flush_dirty();
            let resumed = self.resume_paused();
            if !resumed && self.ending.is_empty() && self.dirty.is_empty() {
                return false;
            }
        }
        true
    }

    /// Closes the oldest connection that has not completed CONNECT, to make room for a new one at
    /// the connection cap (issue 29: silent sockets of another user must not keep an authorised
    /// client out; the oldest has had the longest to log in). False when there is none.
    /// Only connections with a token below `before` (accepted in an earlier round) are taken.
    pub(super) fn evict_unauthenticated(&mut self, before: u64) -> bool {
        let oldest = self.conns.iter().filter(|(&id, c)| c.phase == Phase::New && id < before).map(|(&id, _)| id).min();
        let Some(id) = oldest else {
            return false;
        };
        if let Some(c) = self.conns.get_mut(&id) {
            c.phase = Phase::Ending;
            c.end = None;
        }
        self.close(id);
        self.evicted += 1;
        true
    }

    /// Connections closed by `evict_unauthenticated` since the last call (for one log line).
    pub(super) fn take_evicted(&mut self) -> usize {
        std::mem::take(&mut self.evicted)
    }

    /// `drop_connections`: every client connection ends as if its peer had gone.
    pub(super) fn drop_all(&mut self) {
        let ids: Vec<u64> = self.conns.keys().copied().collect();
        for id in ids {
            self.end(id, None);
        }
    }

    /// A `release_connack`: stalled connections whose prefix is no longer held go on.
    pub(super) fn release_stalls(&mut self) {
        let ids = std::mem::take(&mut self.stalled);
        for id in ids {
            let Some(c) = self.conns.get_mut(&id) else { continue };
            let held = c.client_id.as_deref().is_some_and(|cid| self.shared.stall_active(cid));
            if held || c.phase != Phase::Stalled {
                if c.phase == Phase::Stalled {
                    self.stalled.push(id);
                }
                continue;
            }
            let frame = c.stalled.take().unwrap_or_default();
            match self.connect_finish(id, &frame) {
                Ok(()) => self.handle_input(id),
                Err(end) => self.end(id, end),
            }
            self.update_interest(id);
        }
    }

    /// Broker shutdown: every connection closes at once, without wills or log lines.
    pub(super) fn shutdown(&mut self) {
        let ids: Vec<u64> = self.conns.keys().copied().collect();
        for id in ids {
            if let Some(c) = self.conns.get_mut(&id) {
                c.will = None;
                c.end = None;
            }
            self.close(id);
        }
    }

    // ---- timers ----

    /// Makes sure the heap holds an entry no later than connection `id`'s earliest timer.
    fn schedule(&mut self, id: u64) {
        let limit = self.shared.cfg.queue_limit;
        let Some(c) = self.conns.get_mut(&id) else { return };
        if let Some(t) = c.next_timer(limit, Instant::now()) {
            if c.timer_at.is_none_or(|at| t < at) {
                c.timer_at = Some(t);
                self.timers.push(Reverse((t, id)));
            }
        }
    }

    fn expire(&mut self, now: Instant) {
        let limit = self.shared.cfg.queue_limit;
        while let Some(&Reverse((t, id))) = self.timers.peek() {
            if t > now {
                break;
            }
            self.timers.pop();
            let Some(c) = self.conns.get_mut(&id) else { continue };
            if c.timer_at != Some(t) {
                continue; // stale: a later entry replaced it
            }
            c.timer_at = None;
            if c.phase == Phase::Ending {
                continue;
            }
            if c.read_deadline.is_some_and(|d| d <= now) {
                let why = if c.phase == Phase::Connected {
                    let ka = c.keep_alive;
                    format!("keepalive timeout (nothing for 1.5 x {ka} s); closing")
                } else {
                    format!("no CONNECT within {} ms; closing", self.shared.cfg.connect_timeout.as_millis())
                };
                self.end(id, Some(why));
                continue;
            }
            if c.pending_write() && c.out.len() > limit && c.moved + OVERFLOW_GRACE <= now {
                self.end(id, Some(overflow_msg(limit)));
                continue;
            }
            if c.pending_write() && c.moved + WRITE_TIMEOUT <= now {
                let why = format!("nothing could be written for {} s; closing", WRITE_TIMEOUT.as_secs());
                self.end(id, Some(why));
                continue;
            }
            self.schedule(id);
        }
    }

    // ---- reading ----

    fn readable(&mut self, id: u64) {
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.resize(READ_CHUNK, 0);
        let Some(c) = self.conns.get_mut(&id) else {
            self.scratch = scratch;
            return;
        };
        let got = loop {
            match c.stream.read(&mut scratch) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => break r,
            }
        };
        match got {
            Ok(0) => {
                let end = if c.phase == Phase::New { Some("closed before CONNECT".to_string()) } else { None };
                self.scratch = scratch;
                self.end(id, end);
            }
            Ok(n) => {
                c.buf.extend_from_slice(&scratch[..n]);
                self.scratch = scratch;
                if c.phase == Phase::Connected && c.keep_alive > 0 {
                    c.read_deadline = Some(Instant::now() + keepalive_limit(c.keep_alive));
                }
                if c.phase == Phase::New {
                    // Its first bytes: the rest of the CONNECT is due soon (`CONNECT_DRIBBLE`).
                    let soon = Instant::now() + CONNECT_DRIBBLE;
                    if c.read_deadline.is_none_or(|d| soon < d) {
                        c.read_deadline = Some(soon);
                        c.timer_at = None;
                        self.schedule(id);
                    }
                }
                self.handle_input(id);
                self.ack_now(id);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.scratch = scratch,
            Err(e) => {
                self.scratch = scratch;
                let end = match e.kind() {
                    io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe => None,
                    _ => Some(format!("read failed: {e}")),
                };
                self.end(id, end);
            }
        }
        self.update_interest(id);
    }

    /// The fan-in stall (issue 31): a subscriber past `ACK_WINDOW` holds its publishers until it
    /// acknowledges, and a client that does not set TCP_NODELAY (mosquitto_sub) writes its second
    /// PUBACK only once its first is ACKed at the TCP level; with the publishers held the broker has
    /// nothing to send it that would carry that ACK, so the kernel's delayed-ACK timer (40 ms) paced
    /// every window. After a read whose acknowledgements still leave the window full, the ACK goes
    /// out at once.
    fn ack_now(&mut self, id: u64) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        if std::mem::take(&mut c.quickack) {
            let _ = crate::sys::tcp_quickack(&c.stream);
        }
    }

    /// Handles the complete frames in connection `id`'s buffer while it may read.
    fn handle_input(&mut self, id: u64) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        let buf = std::mem::take(&mut c.buf);
        let mut pos = 0;
        let mut end = None;
        while let Some(c) = self.conns.get(&id) {
            if !matches!(c.phase, Phase::New | Phase::Connected) || !c.paused_on.is_empty() {
                break;
            }
            let avail = &buf[pos..];
            let total = match codec::fixed_header(avail) {
                Err(e) => {
                    end = Some(Some(format!("protocol error: {e}; closing")));
                    break;
                }
                Ok(None) => break,
                Ok(Some((remaining, hlen))) => hlen + remaining,
            };
            if total > c.frame_limit {
                end = Some(Some(if c.phase == Phase::New {
                    format!("first packet of {total} bytes exceeds the CONNECT limit {}; closing", c.frame_limit)
                } else {
                    // MQTT 3.1.1 has no reason code or DISCONNECT from the server: closing is the
                    // only answer it allows, so the reason goes to the log.
                    let kind = if avail[0] >> 4 == 3 { "PUBLISH" } else { "packet" };
                    format!(
                        "WARNING: {kind} of {total} bytes exceeds max-packet {}; closing the connection, the \
                         message is not delivered (MQTT 3.1.1 gives a broker no way to tell the client why; \
                         start the broker with a larger --max-packet to accept it)",
                        self.shared.cfg.max_packet
                    )
                }));
                break;
            }
            if avail.len() < total {
                break;
            }
            let frame = &buf[pos..pos + total];
            pos += total;
            let r = if c.phase == Phase::New { self.connect(id, frame) } else { self.packet(id, frame) };
            if let Err(e) = r {
                end = Some(e);
                break;
            }
        }
        if let Some(c) = self.conns.get_mut(&id) {
            let mut buf = buf;
            if pos == buf.len() {
                buf.clear();
                if buf.capacity() > KEEP_READ_BUFFER {
                    buf = Vec::new();
                }
            } else if pos > 0 {
                buf.drain(..pos);
            }
            // Frames handled above may have added nothing to `c.buf` (it was taken); keep order.
            buf.append(&mut c.buf);
            c.buf = buf;
        }
        if let Some(e) = end {
            self.end(id, e);
        }
    }

    /// The first packet: decode, count, the 0x02 check, the client id, then the stall hook.
    fn connect(&mut self, id: u64, frame: &[u8]) -> Result<(), End> {
        let pkt = codec::decode(frame).map_err(|e| Some(format!("protocol error: {e}; closing")))?;
        let c = match pkt {
            Packet::Connect(c) => c,
            Packet::UnsupportedLevel(n) => {
                lock(&self.shared.state).note_connect("", self.shared.cfg.record);
                self.push(id, Out::Owned(codec::connack(false, 0x01)));
                return Err(Some(format!(
                    "unsupported protocol level {n}; only 4 (MQTT 3.1.1) and 3 (MQTT 3.1, MQIsdp)"
                )));
            }
            _ => return Err(Some("protocol error: first packet is not CONNECT; closing".into())),
        };
        lock(&self.shared.state).note_connect(c.client_id, self.shared.cfg.record);
        if c.client_id.is_empty() && !c.clean_session {
            // MQTT-3.1.3-8: a zero-length id needs CleanSession=1.
            self.push(id, Out::Owned(codec::connack(false, 0x02)));
            return Err(Some("zero-length client id with CleanSession=0; identifier rejected (0x02)".into()));
        }
        if c.client_id.is_empty() && c.level == 3 {
            // MQTT 3.1 has no server-assigned ids (3.1 requires 1-23 characters; mosquitto refuses
            // the empty one alike and takes longer ones, as this broker does).
            self.push(id, Out::Owned(codec::connack(false, 0x02)));
            return Err(Some("zero-length client id in an MQTT 3.1 CONNECT; identifier rejected (0x02)".into()));
        }
        let cid = if c.client_id.is_empty() {
            format!("auto-{}", crate::sys::random_hex(8).unwrap_or_else(|_| format!("{id:016x}")))
        } else {
            c.client_id.to_string()
        };
        let stall = self.shared.stall_active(&cid);
        let Some(conn) = self.conns.get_mut(&id) else { return Err(None) };
        conn.client_id = Some(cid);
        if stall {
            // Held until `release_connack`, with no deadline (as a blocked reader was before).
            conn.phase = Phase::Stalled;
            conn.stalled = Some(frame.to_vec());
            conn.read_deadline = None;
            self.stalled.push(id);
            return Ok(());
        }
        self.connect_finish(id, frame)
    }

    /// The rest of CONNECT once no stall holds it: will topic, auth, session, CONNACK, resends.
    fn connect_finish(&mut self, id: u64, frame: &[u8]) -> Result<(), End> {
        let pkt = codec::decode(frame).map_err(|e| Some(format!("protocol error: {e}; closing")))?;
        let Packet::Connect(c) = pkt else { return Err(None) };
        let Some(cid) = self.conns.get(&id).and_then(|c| c.client_id.clone()) else { return Err(None) };
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
                self.push(id, Out::Owned(codec::connack(false, 0x05)));
                return Err(Some("no username; not authorized (0x05)".into()));
            }
            code => {
                self.push(id, Out::Owned(codec::connack(false, code)));
                return Err(Some("bad username or password (0x04)".into()));
            }
        }
        let (old, out) = {
            let mut st = lock(&self.shared.state);
            let old = st.clients.remove(&cid);
            if let Some(cl) = old.as_ref().filter(|cl| cl.link.is_none()) {
                // Back (or discarded): its messages no longer count as held for an away client.
                st.away.remove(&cl.session);
            }
            if !c.clean_session || old.as_ref().is_some_and(|cl| cl.persistent) {
                // A persistent session is created, resumed (its resends change it) or discarded.
                self.shared.changed();
            }
            let (session, present, old_link) = match old {
                // MQTT-3.2.2-2: a stored session is resumed and reported.
                Some(cl) if !c.clean_session && cl.persistent => (cl.session, true, cl.link),
                // MQTT-3.1.2-6: CleanSession=1 discards any previous session.
                Some(cl) => {
                    st.unindex_session(&cid, &cl.session);
                    (Session::default(), false, cl.link)
                }
                None => {
                    let stored = st.clients.values().filter(|cl| cl.link.is_none()).count();
                    if !c.clean_session && stored >= self.shared.cfg.max_sessions {
                        drop(st);
                        self.push(id, Out::Owned(codec::connack(false, 0x03)));
                        return Err(Some(format!(
                            "WARNING: max-sessions {} persistent sessions stored; server unavailable (0x03)",
                            self.shared.cfg.max_sessions
                        )));
                    }
                    (Session::default(), false, None)
                }
            };
            let mut client = Client { link: Some(Link { conn: id }), session, persistent: !c.clean_session };
            let mut out = vec![Out::Owned(codec::connack(present, 0x00))];
            // MQTT-4.4.0-1: unacknowledged PUBLISH and PUBREL packets go again, in order.
            out.extend(client.session.resume().iter().map(|s| Out::Owned(encode(s))));
            st.clients.insert(cid.clone(), Box::new(client));
            (old_link, out)
        };
        let keep_alive = c.keep_alive;
        let will = c.will.as_ref().map(|w| OwnedWill {
            topic: w.topic.to_string(),
            payload: w.payload.to_vec(),
            qos: w.qos,
            retain: w.retain,
        });
        if let Some(conn) = self.conns.get_mut(&id) {
            conn.will = will;
            conn.phase = Phase::Connected;
            conn.frame_limit = self.shared.cfg.max_packet;
            conn.keep_alive = keep_alive;
            conn.read_deadline = (keep_alive > 0).then(|| Instant::now() + keepalive_limit(keep_alive));
            // A deadline that moved earlier than the CONNECT one needs its own heap entry.
            conn.timer_at = None;
        }
        self.schedule(id);
        if let Some(old) = old.filter(|l| l.conn != id) {
            // The older connection ends without its will (issue 31, as mosquitto): the will is for
            // an unexpected loss, and the client is back; MQTT 3.1.1 does not list a takeover
            // among the will's causes (3.1.2.5).
            if let Some(c) = self.conns.get_mut(&old.conn) {
                c.will = None;
            }
            self.end(old.conn, None);
            if let Some(conn) = self.conns.get(&id) {
                let line = conn.who("client id connected again; closed the older connection");
                self.shared.log(line);
            }
        }
        self.reply_all(id, out);
        Ok(())
    }

    /// Runs `f` on connection `id`'s session; None when another connection took the client id.
    fn with_session<R>(&self, id: u64, f: impl FnOnce(&mut Session) -> R) -> Option<R> {
        let cid = self.conns.get(&id)?.client_id.as_deref()?;
        let mut st = lock(&self.shared.state);
        let cl = st.clients.get_mut(cid).filter(|cl| cl.is_conn(id))?;
        if cl.persistent {
            self.shared.changed();
        }
        Some(f(&mut cl.session))
    }

    fn packet(&mut self, id: u64, frame: &[u8]) -> Result<(), End> {
        let pkt = codec::decode(frame).map_err(|e| Some(format!("protocol error: {e}; closing")))?;
        match pkt {
            Packet::Publish(p) => {
                let msg = Publish { topic: p.topic, payload: p.payload, qos: p.qos, retain: p.retain };
                // QoS 2, Method B (MQTT-4.3.3-2): routed once; a duplicate before PUBREL is not.
                let new = p.qos < 2 || self.with_session(id, |s| s.incoming_qos2(p.pid)).ok_or(None)?;
                let mut full = Vec::new();
                if new {
                    let routed = self.publish(&msg)?;
                    if let Some(line) = self.conns.get_mut(&id).and_then(|c| retain_refusal(c, msg.topic, &routed)) {
                        self.shared.log(line);
                    }
                    full = routed.full;
                    // A client's own subscription never holds it back: its acknowledgements are
                    // behind the publish it is paused on.
                    full.extend(routed.windowed.iter().copied().filter(|&t| t != id));
                }
                match p.qos {
                    1 => full.extend(self.push_full(id, Out::Owned(codec::puback(p.pid)))),
                    2 => full.extend(self.push_full(id, Out::Owned(codec::pubrec(p.pid)))),
                    _ => {}
                }
                self.pause(id, full);
                Ok(())
            }
            Packet::Puback(pid) => self.acked(id, |s| s.puback(pid)),
            Packet::Pubrec(pid) => {
                if let Some(rel) = self.with_session(id, |s| s.pubrec(pid)).ok_or(None)? {
                    self.reply(id, encode(&rel));
                }
                Ok(())
            }
            Packet::Pubrel(pid) => {
                self.with_session(id, |s| s.incoming_release(pid)).ok_or(None)?;
                self.reply(id, codec::pubcomp(pid));
                Ok(())
            }
            Packet::Pubcomp(pid) => self.acked(id, |s| s.pubcomp(pid)),
            Packet::Subscribe { pid, filters } => self.subscribe(id, pid, &filters),
            Packet::Unsubscribe { pid, filters } => {
                self.unsubscribe(id, &filters).ok_or(None)?;
                self.reply(id, codec::unsuback(pid));
                Ok(())
            }
            Packet::Pingreq => {
                self.reply(id, codec::pingresp());
                Ok(())
            }
            Packet::Disconnect => {
                if let Some(c) = self.conns.get_mut(&id) {
                    c.graceful = true;
                }
                Err(None)
            }
            Packet::Connect(_) | Packet::UnsupportedLevel(_) => {
                Err(Some("protocol error: second CONNECT; closing".into()))
            }
            Packet::ServerOnly(name) => Err(Some(format!("protocol error: client sent {name}; closing"))),
        }
    }

    /// Drops `filters` from connection `id`'s session and the index; None when another connection
    /// took the client id.
    fn unsubscribe(&mut self, id: u64, filters: &[&str]) -> Option<()> {
        let cid = self.conns.get(&id)?.client_id.as_deref()?;
        let mut st = lock(&self.shared.state);
        let State { clients, index, .. } = &mut *st;
        let cl = clients.get_mut(cid).filter(|cl| cl.is_conn(id))?;
        if cl.persistent {
            self.shared.changed();
        }
        for f in filters.iter().filter(|f| cl.session.subs.iter().any(|(sf, _)| sf == *f)) {
            index.remove(f, cid);
        }
        cl.session.unsubscribe(filters);
        Some(())
    }

    fn subscribe(&mut self, id: u64, pid: u16, filters: &[(&str, u8)]) -> Result<(), End> {
        let Some(cid) = self.conns.get(&id).and_then(|c| c.client_id.clone()) else { return Err(None) };
        let max_subs = self.shared.cfg.max_subscriptions;
        let lim = self.shared.session_limits();
        let (out, over_cap, dropped) = {
            let mut st = lock(&self.shared.state);
            let State { clients, retained, index, .. } = &mut *st;
            let Some(cl) = clients.get_mut(&cid).filter(|cl| cl.is_conn(id)) else {
                return Err(None);
            };
            if cl.persistent {
                self.shared.changed();
            }
            let decided = route::subscribe(&mut cl.session, retained, max_subs, filters);
            for (&(f, _), &code) in filters.iter().zip(&decided.codes) {
                if code != 0x80 {
                    index.add(f, &cid);
                }
            }
            let mut out = vec![Out::Owned(codec::suback(pid, &decided.codes))];
            let mut dropped = false;
            for r in decided.replay {
                let msg = Msg { topic: r.topic.into(), payload: r.payload.into(), qos: r.qos, retain: true };
                match cl.session.deliver(msg, true, &lim) {
                    Delivered::Send(s) => out.push(Out::Owned(encode(&s))),
                    Delivered::Dropped { first } => dropped |= first,
                    Delivered::Queued | Delivered::Skipped | Delivered::DroppedTotal { .. } => {}
                }
            }
            (out, decided.over_cap, dropped)
        };
        if let Some(c) = self.conns.get(&id) {
            if dropped {
                self.shared.log(c.who(&format!("WARNING: {}", session_full_text(&lim))));
            }
            if over_cap > 0 {
                self.shared.log(c.who(&format!(
                    "WARNING: {over_cap} filter(s) refused (0x80): max-subscriptions {max_subs} per client reached"
                )));
            }
        }
        // The SUBACK and the retained replay go in order, ahead of any later live message (one
        // thread queues both); a replay larger than the queue holds this client's input.
        self.reply_all(id, out);
        Ok(())
    }

    /// A subscriber's acknowledgement that ends a QoS 1/2 delivery (PUBACK, PUBCOMP): `ack` takes
    /// it off connection `id`'s session; once no more than `ACK_WINDOW` messages are unacknowledged,
    /// its window holds publishers back again. `Err(None)` when another connection took the client
    /// id.
    fn acked(&mut self, id: u64, ack: impl FnOnce(&mut Session)) -> Result<(), End> {
        let pending = self
            .with_session(id, |s| {
                ack(s);
                s.pending()
            })
            .ok_or(None)?;
        if let Some(c) = self.conns.get_mut(&id) {
            if pending <= ACK_WINDOW {
                c.window_waived = false;
            } else {
                c.quickack = true;
            }
        }
        Ok(())
    }

    /// Queues a reply to connection `id`'s own packet; a full queue holds its input.
    fn reply(&mut self, id: u64, bytes: Vec<u8>) {
        let full = self.push_full(id, Out::Owned(bytes));
        self.pause(id, full.into_iter().collect());
    }

    /// `reply` with several packets, queued in order.
    fn reply_all(&mut self, id: u64, out: Vec<Out>) {
        let mut full = false;
        for o in out {
            full |= self.push(id, o);
        }
        if full {
            self.pause(id, vec![id]);
        }
    }

    /// Stores and forwards one PUBLISH (`route::route` decides, this queues). `Err` when the
    /// message is refused.
    fn publish(&mut self, msg: &Publish<'_>) -> Result<Routed, End> {
        let shared = self.shared.clone();
        let lim = shared.session_limits();
        let total = shared.away_limits();
        let mut sends: Vec<(u64, Out)> = Vec::new();
        let mut windowed: Vec<u64> = Vec::new();
        let mut full_sessions: Vec<(String, String)> = Vec::new();
        let refused_retain = {
            let mut st = lock(&shared.state);
            let State { clients, retained, retained_bytes, index, away, .. } = &mut *st;
            // The clients that may get it: those with a filter matching the topic, once each (the
            // index may name more; `route` decides from each session's own filters).
            let mut targets: Vec<&str> = Vec::new();
            if topic::valid_topic_name(msg.topic) {
                index.candidates(msg.topic, &mut targets);
                targets.sort_unstable();
                targets.dedup();
                targets.retain(|cid| clients.contains_key(*cid));
            }
            let routed = route::route(targets.iter().filter_map(|cid| clients.get(*cid).map(|cl| &cl.session)), msg)
                .map_err(|r| {
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
                if refused_retain.is_none() {
                    shared.changed();
                }
            }
            let mut qos0: Option<Arc<[u8]>> = None;
            // The message as sessions keep it, built once for every QoS 1/2 copy.
            let mut kept: Option<(Arc<str>, Arc<[u8]>)> = None;
            for d in routed.deliveries {
                let cid = targets[d.to];
                let Some(cl) = clients.get_mut(cid) else { continue };
                let out = if d.qos == 0 {
                    if cl.link.is_none() {
                        continue;
                    }
                    Out::Shared(
                        qos0.get_or_insert_with(|| codec::publish(t, payload, 0, 0, false, false).into()).clone(),
                    )
                } else {
                    let (topic, body) = kept.get_or_insert_with(|| (t.into(), payload.into())).clone();
                    let m = Msg { topic, payload: body, qos: d.qos, retain: false };
                    let d = if cl.link.is_some() {
                        cl.session.deliver(m, true, &lim)
                    } else {
                        cl.session.deliver_away(m, &lim, away, &total)
                    };
                    if cl.persistent && matches!(d, Delivered::Send(_) | Delivered::Queued) {
                        shared.changed();
                    }
                    match d {
                        Delivered::Send(s) => {
                            if cl.session.pending() > ACK_WINDOW {
                                windowed.extend(cl.link.as_ref().map(|l| l.conn));
                            }
                            Out::Owned(encode(&s))
                        }
                        Delivered::Dropped { first: true } => {
                            full_sessions.push((cid.to_string(), session_full_text(&lim)));
                            continue;
                        }
                        Delivered::DroppedTotal { first: true } => {
                            full_sessions.push((cid.to_string(), queued_full_text(&total, away)));
                            continue;
                        }
                        Delivered::Dropped { .. }
                        | Delivered::DroppedTotal { .. }
                        | Delivered::Queued
                        | Delivered::Skipped => continue,
                    }
                };
                if let Some(link) = &cl.link {
                    sends.push((link.conn, out));
                }
            }
            if shared.cfg.record {
                st.note_received(msg);
            }
            refused_retain
        };
        for (cid, why) in full_sessions {
            shared.log(format!("WARNING: broker: client {}: {why}", short_id(&cid)));
        }
        let mut full = Vec::new();
        for (to, out) in sends {
            full.extend(self.push_full(to, out));
        }
        windowed.retain(|t| self.conns.get(t).is_some_and(|c| !c.window_waived));
        Ok(Routed { full, windowed, refused_retain })
    }

    // ---- writing ----

    /// `push`, returning `to` when its queue is past the limit.
    fn push_full(&mut self, to: u64, out: Out) -> Option<u64> {
        self.push(to, out).then_some(to)
    }

    /// Queues `out` for connection `to` (dropped when it is gone or closing); true when its queue
    /// is past `queue_limit` even after a write was tried.
    fn push(&mut self, to: u64, out: Out) -> bool {
        let limit = self.shared.cfg.queue_limit;
        let Some(c) = self.conns.get_mut(&to) else { return false };
        if !c.pending_write() {
            c.moved = Instant::now();
        }
        c.out.push_back(out);
        if !c.dirty {
            c.dirty = true;
            self.dirty.push(to);
        }
        if c.out.len() == limit + 1 {
            // Full now: the grace starts here, and a write is tried at once.
            c.moved = Instant::now();
            self.flush(to);
            let over = self.conns.get(&to).is_some_and(|c| c.out.len() > limit);
            if over {
                self.schedule(to);
            }
            return over;
        }
        c.out.len() > limit
    }

    /// Writes what connection `id` has queued until the socket is full or the queue empty.
    fn flush(&mut self, id: u64) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        let mut failed = None;
        loop {
            if c.woff == c.wbuf.len() {
                c.wbuf.clear();
                c.woff = 0;
                if c.wbuf.capacity() > 4 * WRITE_BATCH {
                    c.wbuf = Vec::new();
                }
                while c.wbuf.len() < WRITE_BATCH {
                    let Some(o) = c.out.pop_front() else { break };
                    c.wbuf.extend_from_slice(o.bytes());
                }
                if c.wbuf.is_empty() {
                    c.wbuf = Vec::new();
                    break;
                }
            }
            match c.stream.write(&c.wbuf[c.woff..]) {
                Ok(0) => {
                    failed = Some(None);
                    break;
                }
                Ok(n) => {
                    c.woff += n;
                    c.moved = Instant::now();
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    failed = Some(match e.kind() {
                        io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe => None,
                        _ => Some(format!("write failed: {e}")),
                    });
                    break;
                }
            }
        }
        if let Some(why) = failed {
            c.out.clear();
            c.wbuf = Vec::new();
            c.woff = 0;
            if c.phase != Phase::Ending {
                self.end(id, why);
            }
        }
        self.schedule(id);
        self.update_interest(id);
    }

    fn flush_dirty(&mut self) {
        for id in std::mem::take(&mut self.dirty) {
            if let Some(c) = self.conns.get_mut(&id) {
                c.dirty = false;
                self.flush(id);
            }
        }
    }

    fn update_interest(&mut self, id: u64) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        let want = c.wanted_interest();
        if want != c.interest && self.epoll.modify(&c.stream, id, want).is_ok() {
            c.interest = want;
        }
    }

    // ---- backpressure ----

    /// Connection `id` reads nothing more until each queue of `on` has room (or is gone).
    fn pause(&mut self, id: u64, on: Vec<u64>) {
        if on.is_empty() {
            return;
        }
        let Some(c) = self.conns.get_mut(&id) else { return };
        if c.paused_on.is_empty() {
            self.paused.push(id);
            c.paused_since = Instant::now();
        }
        c.paused_on.extend(on);
        self.schedule(id);
    }

    /// Paused connections whose queues have room (and whose subscribers acknowledged enough, or
    /// were waited for `OVERFLOW_GRACE`) read again; true when one did.
    fn resume_paused(&mut self) -> bool {
        if self.paused.is_empty() {
            return false;
        }
        let limit = self.shared.cfg.queue_limit;
        let now = Instant::now();
        let shared = self.shared.clone();
        let st = lock(&shared.state);
        let window_full = |t: u64, tc: &Conn| {
            !tc.window_waived
                && tc
                    .client_id
                    .as_deref()
                    .and_then(|cid| st.clients.get(cid))
                    .is_some_and(|cl| cl.is_conn(t) && cl.session.pending() > ACK_WINDOW)
        };
        let mut go_on = Vec::new();
        let mut waive = Vec::new();
        for id in std::mem::take(&mut self.paused) {
            let Some(c) = self.conns.get(&id) else { continue };
            let overdue = c.paused_since + OVERFLOW_GRACE <= now;
            let mut waiting = Vec::new();
            for &t in &c.paused_on {
                let Some(tc) = self.conns.get(&t) else { continue };
                if tc.phase == Phase::Ending {
                    continue;
                }
                if tc.out.len() > limit {
                    waiting.push(t);
                } else if window_full(t, tc) {
                    if overdue {
                        waive.push(t);
                    } else {
                        waiting.push(t);
                    }
                }
            }
            let Some(c) = self.conns.get_mut(&id) else { continue };
            if waiting.is_empty() {
                c.paused_on.clear();
                go_on.push(id);
            } else {
                c.paused_on = waiting;
                self.paused.push(id);
            }
        }
        drop(st);
        for t in waive {
            if let Some(tc) = self.conns.get_mut(&t) {
                tc.window_waived = true;
            }
        }
        let resumed = !go_on.is_empty();
        for id in go_on {
            self.handle_input(id);
            self.update_interest(id);
        }
        resumed
    }

    // ---- ending ----

    /// Marks connection `id` for closing at the next safe point (the first reason wins).
    fn end(&mut self, id: u64, why: End) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        if c.phase == Phase::Ending {
            return;
        }
        c.phase = Phase::Ending;
        c.end = why;
        self.ending.push(id);
        self.update_interest(id);
    }

    fn close_ending(&mut self) {
        while let Some(id) = self.ending.pop() {
            self.close(id);
        }
    }

    /// Closes connection `id`: log line, will (after an abnormal end, MQTT-3.1.2-8), session kept
    /// or dropped, a last nonblocking write of what is queued (a refusing CONNACK), the socket.
    fn close(&mut self, id: u64) {
        self.flush(id);
        let Some(mut c) = self.conns.remove(&id) else { return };
        if let Some(why) = c.end.take() {
            self.shared.log(c.who(&why));
        }
        if let Some(w) = c.will.take() {
            // At its QoS and with its retain flag (MQTT-3.1.2-15, -17); not after DISCONNECT or
            // while the broker shuts down.
            if !c.graceful && !self.shared.stop.load(Ordering::SeqCst) {
                let msg = Publish { topic: &w.topic, payload: &w.payload, qos: w.qos, retain: w.retain };
                if let Some(line) = self.publish(&msg).ok().and_then(|r| retain_refusal(&mut c, &w.topic, &r)) {
                    self.shared.log(line);
                }
            }
        }
        if let Some(cid) = &c.client_id {
            let mut st = lock(&self.shared.state);
            if st.clients.get(cid).is_some_and(|cl| cl.is_conn(id)) {
                let persistent = st.clients.get(cid).is_some_and(|cl| cl.persistent);
                if persistent {
                    // MQTT-3.1.2-4: the session outlives the connection; queued messages wait for it.
                    let State { clients, away, .. } = &mut *st;
                    if let Some(cl) = clients.get_mut(cid) {
                        cl.link = None;
                        cl.session.shrink();
                        away.add(&cl.session);
                    }
                } else if let Some(cl) = st.clients.remove(cid) {
                    st.unindex_session(cid, &cl.session);
                }
            }
        }
        let _ = self.epoll.delete(&c.stream);
        let _ = c.stream.shutdown(Shutdown::Both);
        drop(c);
        if self.shared.active.fetch_sub(1, Ordering::SeqCst) == 1 {
            // The last connection ended: hand the freed buffers back (issue 17, memory after
            // clients leave).
            self.conns.shrink_to_fit();
            self.scratch = Vec::new();
            self.timers.shrink_to_fit();
            for v in [&mut self.dirty, &mut self.paused, &mut self.stalled, &mut self.ending] {
                v.shrink_to_fit();
            }
            // The client table keeps only the away sessions now; its buckets for thousands of
            // clients were most of what stayed after they left.
            let mut st = lock(&self.shared.state);
            st.clients.shrink_to_fit();
            st.index.shrink();
            crate::sys::release_free_memory();
        }
    }
}

/// The log line for a retained message of connection `c` refused at a cap (the first one only).
fn retain_refusal(c: &mut Conn, t: &str, routed: &Routed) -> Option<String> {
    let over = routed.refused_retain.as_ref()?;
    if c.retain_refusal_logged {
        return None;
    }
    c.retain_refusal_logged = true;
    let why = match over {
        route::RetainOver::Message { size, max } => format!("{size} bytes exceed max-retained-message {max}"),
        route::RetainOver::Total { size, used, max } => {
            format!("{size} more bytes would exceed max-retained-bytes {max} ({used} held)")
        }
    };
    Some(c.who(&format!(
        "WARNING: retained message on '{}' not stored: {why}; forwarded only (further refusals of this connection are not logged)",
        short_id(t)
    )))
}

fn keepalive_limit(keep_alive: u16) -> Duration {
    Duration::from_millis(u64::from(keep_alive) * 1500)
}

/// The packet bytes of one `Send`.
fn encode(s: &Send) -> Vec<u8> {
    match s {
        Send::Publish { msg, pid, dup } => codec::publish(&msg.topic, &msg.payload, msg.qos, *pid, msg.retain, *dup),
        Send::Pubrel(pid) => codec::pubrel(*pid),
    }
}

fn session_full_text(lim: &session::Limits) -> String {
    format!(
        "session full ({} QoS 1/2 messages or {} bytes unacknowledged or queued); dropping new messages for it until it drains",
        lim.messages, lim.bytes
    )
}

fn queued_full_text(total: &session::Limits, held: &session::Away) -> String {
    format!(
        "away sessions hold {} QoS 1/2 messages, {} bytes (max-queued-messages {}, max-queued-bytes {}); \
         dropping new messages for this away client until it queues again",
        held.messages, held.bytes, total.messages, total.bytes
    )
}

fn overflow_msg(limit: usize) -> String {
    format!("WARNING: outbound queue full ({limit} messages) for {} s; disconnecting", OVERFLOW_GRACE.as_secs())
}
