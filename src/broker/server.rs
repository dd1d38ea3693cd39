//! The running broker: `start` binds, restores the state file (`persist`) and spawns the one loop
//! thread, the loop waits on epoll for the listener, the wake-up descriptor and every client socket
//! (through `conn::Table`), accepts within `max_connections`, hands the state file's writer its
//! snapshots, and `BrokerHandle` stops it and joins it, besides offering the test hooks.
//!
//! It never reads or writes a client socket and decides nothing about packets or routing.

use std::collections::VecDeque;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::config::{BrokerConfig, Persist};
use super::conn::Table;
use super::persist::{self, Opened, Saver};
use super::state::{lock, Shared, State};
use crate::sys::{Epoll, EpollEvents, EPOLL_IN};
use crate::text::count;

const LOOP_STACK: usize = 256 * 1024;
const LISTENER: u64 = 0;
const WAKER: u64 = 1;
/// Connections accepted per readiness of the listener, so a connect flood does not starve clients.
const ACCEPT_BATCH: usize = 256;
/// After a failed accept (out of descriptors or similar) the listener rests this long.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// A running broker. Dropping it (or `shutdown`) stops the loop, which closes the listener and
/// every connection, and joins it.
pub struct BrokerHandle {
    shared: Arc<Shared>,
    addr: SocketAddr,
    thread: Option<JoinHandle<()>>,
}

/// Binds `cfg.bind`, restores the state file (with `cfg.persist`) and starts serving; the socket
/// is listening when this returns.
pub fn start(cfg: BrokerConfig) -> io::Result<BrokerHandle> {
    if !cfg.bind.ip().is_loopback() && !cfg.allow_remote {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "refusing to bind non-loopback address without --allow-remote",
        ));
    }
    let listener = TcpListener::bind(cfg.bind)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot bind broker to {}: {e}", cfg.bind)))?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let shared = Arc::new(Shared {
        cfg,
        state: Mutex::new(State::default()),
        active: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        drop_all: AtomicBool::new(false),
        stalled: Mutex::new(Vec::new()),
        waker: crate::sys::Waker::new()?,
        log_ring: Mutex::new(VecDeque::new()),
        changes: AtomicU64::new(0),
    });
    let saver = match &shared.cfg.persist {
        Some(p) => open_state(&shared, p)?,
        None => None,
    };
    let epoll = Epoll::new()?;
    epoll.add(&listener, LISTENER, EPOLL_IN)?;
    epoll.add(&shared.waker, WAKER, EPOLL_IN)?;
    let table = Table::new(shared.clone(), epoll, WAKER + 1);
    let thread = thread::Builder::new()
        .name("broker-loop".into())
        .stack_size(LOOP_STACK)
        .spawn(move || run(table, listener, saver))?;
    Ok(BrokerHandle { shared, addr, thread: Some(thread) })
}

/// Takes the state file's lock and restores what the file holds; the outcome is logged. None when
/// another broker holds the lock: this one runs without persistence.
fn open_state(shared: &Arc<Shared>, p: &Persist) -> io::Result<Option<Saver>> {
    let path = crate::text::show_path(&p.path);
    let (saver, loaded) = match Saver::open(shared, p)? {
        Opened::Ready(saver, loaded) => (saver, loaded),
        Opened::Unlocked(why) => {
            shared.log(format!(
                "WARNING: broker: state file {path} {why}; this broker keeps its state in memory only \
                 (stop the other broker, or start this one with --no-persist)"
            ));
            return Ok(None);
        }
    };
    match loaded {
        Ok(None) => {}
        Ok(Some(snap)) => {
            let r = persist::restore(&mut lock(&shared.state), snap, &shared.cfg);
            shared.log(format!(
                "NOTE: broker: restored {} and {} ({}) from {path}",
                count(r.retained, "retained message"),
                count(r.sessions, "session"),
                count(r.messages, "QoS 1/2 message")
            ));
            if r.dropped_retained + r.dropped_sessions > 0 {
                shared.log(format!(
                    "WARNING: broker: state file {path}: {} and {} over this start's --max-retained-* / \
                     --max-sessions not restored",
                    count(r.dropped_retained, "retained message"),
                    count(r.dropped_sessions, "session")
                ));
                // The file is rewritten without them at the next save.
                shared.changed();
            }
        }
        Err(rej) => {
            let whereto = match &rej.moved {
                Ok(bad) => format!("moved to {}", crate::text::show_path(bad)),
                Err(e) => format!("could not be moved aside ({e}); the next save replaces it"),
            };
            shared.log(format!(
                "WARNING: broker: state file {path} {}: not restored, {whereto}; starting without saved \
                 retained messages and sessions (inspect or delete the set-aside file)",
                crate::text::one_line(&rej.why)
            ));
        }
    }
    Ok(Some(saver))
}

impl BrokerHandle {
    /// The bound address (the real port when the config asked for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Closes the listener and every connection and joins the loop.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let Some(t) = self.thread.take() else { return };
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.waker.wake();
        let _ = t.join();
    }

    // ---- test hooks (CORE 11.1), always compiled; see the module comment ----

    /// Holds the CONNACK of every client whose id starts with `prefix` until `release_connack`.
    pub fn stall_connack(&self, prefix: &str) {
        lock(&self.shared.stalled).push(prefix.to_string());
    }

    /// Ends a `stall_connack(prefix)`; stalled clients get their CONNACK.
    pub fn release_connack(&self, prefix: &str) {
        lock(&self.shared.stalled).retain(|p| p != prefix);
        self.shared.waker.wake();
    }

    /// Closes every client connection (the listener stays up).
    pub fn drop_connections(&self) {
        self.shared.drop_all.store(true, Ordering::SeqCst);
        self.shared.waker.wake();
    }

    /// The retained payload of `topic`, if any.
    pub fn retained(&self, topic: &str) -> Option<Vec<u8>> {
        lock(&self.shared.state).retained.get(topic).map(|r| r.payload.to_vec())
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
        let st = lock(&self.shared.state);
        let mut v: Vec<String> = st.clients.iter().filter(|(_, c)| c.link.is_some()).map(|(k, _)| k.clone()).collect();
        crate::sort::natural(&mut v);
        v
    }

    /// Ids of the clients away with a stored persistent session, sorted.
    pub fn sessions(&self) -> Vec<String> {
        let st = lock(&self.shared.state);
        let mut v: Vec<String> = st.clients.iter().filter(|(_, c)| c.link.is_none()).map(|(k, _)| k.clone()).collect();
        crate::sort::natural(&mut v);
        v
    }

    /// Connections accepted and not yet ended (what `max_connections` counts).
    pub fn active_connections(&self) -> usize {
        self.shared.active.load(Ordering::SeqCst)
    }

    /// The bytes the retained store holds (what `max_retained_bytes` caps).
    pub fn retained_bytes(&self) -> usize {
        lock(&self.shared.state).retained_bytes
    }

    /// QoS 1/2 messages and their bytes held by the sessions of away clients together (what
    /// `max_queued_messages` and `max_queued_bytes` cap).
    pub fn queued_away(&self) -> (usize, usize) {
        let away = lock(&self.shared.state).away;
        (away.messages, away.bytes)
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

/// What the accept side remembers between readiness events.
#[derive(Default)]
struct Acceptor {
    last_error: Option<io::ErrorKind>,
    /// Connections closed at the cap since the last one let in: the first is logged, the rest
    /// are counted into one line when a connection is let in again (a flood logs two lines).
    refused: usize,
    /// The listener is out of epoll until then after a failed accept.
    resting_until: Option<Instant>,
    /// Unauthenticated connections closed at the cap and not yet logged, and when that was last
    /// logged (at most every `EVICT_LOG_EVERY`).
    evicted: usize,
    evict_logged: Option<Instant>,
}

/// The loop thread: waits, accepts, hands client readiness to the table, runs its timers; on stop
/// closes everything (the listener with this function's end).
fn run(mut table: Table, listener: TcpListener, mut saver: Option<Saver>) {
    let shared = table.shared().clone();
    let mut events = EpollEvents::with_capacity(1024);
    let mut acc = Acceptor::default();
    let mut busy = false;
    loop {
        let now = Instant::now();
        let timeout = if busy {
            Some(Duration::ZERO)
        } else {
            let rest = acc.resting_until.map(|t| t.saturating_duration_since(now));
            let save = saver.as_ref().and_then(|s| s.next_timeout(now));
            [table.next_timeout(now), rest, save].into_iter().flatten().min()
        };
        if let Err(e) = table.epoll().wait(&mut events, timeout) {
            shared.log(format!("WARNING: broker: epoll_wait failed: {e}"));
            crate::sys::sleep(ACCEPT_BACKOFF);
            continue;
        }
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        let (mut woke, mut accept) = (false, false);
        for (token, ev) in events.iter() {
            match token {
                LISTENER => accept = true,
                WAKER => woke = true,
                id => table.event(id, ev),
            }
        }
        // After the clients' input: a CONNECT that arrived is read before a new connection at the
        // cap may take the place of one that has not completed CONNECT.
        if accept {
            accept_ready(&shared, &mut table, &listener, &mut acc);
        }
        if woke {
            shared.waker.drain();
            if shared.drop_all.swap(false, Ordering::SeqCst) {
                table.drop_all();
            }
            table.release_stalls();
        }
        if acc.resting_until.is_some_and(|t| t <= Instant::now()) {
            acc.resting_until = None;
            let _ = table.epoll().add(&listener, LISTENER, EPOLL_IN);
        }
        busy = table.tick();
        if let Some(s) = &mut saver {
            s.tick(&shared, Instant::now());
        }
    }
    table.shutdown();
    if let Some(s) = &mut saver {
        s.finish(&shared);
    }
}

/// How often, at most, the connections closed at the cap to let new ones in are logged (a count).
const EVICT_LOG_EVERY: Duration = Duration::from_secs(10);

fn accept_ready(shared: &Shared, table: &mut Table, listener: &TcpListener, acc: &mut Acceptor) {
    accept_batch(shared, table, listener, acc);
    acc.evicted += table.take_evicted();
    let now = Instant::now();
    if acc.evicted > 0 && acc.evict_logged.is_none_or(|t| t + EVICT_LOG_EVERY <= now) {
        shared.log(format!(
            "WARNING: broker: max-connections {} reached: closed {} that had not completed CONNECT (the \
             oldest first) to let new ones in",
            shared.cfg.max_connections,
            count(acc.evicted, "connection")
        ));
        acc.evicted = 0;
        acc.evict_logged = Some(now);
    }
}

fn accept_batch(shared: &Shared, table: &mut Table, listener: &TcpListener, acc: &mut Acceptor) {
    let max = shared.cfg.max_connections;
    // Only connections from earlier rounds make room: they have had a round to send CONNECT.
    let batch = table.next_token();
    for _ in 0..ACCEPT_BATCH {
        let (stream, peer) = match listener.accept() {
            Ok(x) => x,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                if acc.last_error != Some(e.kind()) {
                    shared.log(format!("WARNING: broker: accept failed: {e}"));
                    acc.last_error = Some(e.kind());
                }
                // Out of descriptors or a similar transient: rest instead of spinning.
                let _ = table.epoll().delete(listener);
                acc.resting_until = Some(Instant::now() + ACCEPT_BACKOFF);
                return;
            }
        };
        acc.last_error = None;
        if shared.active.load(Ordering::SeqCst) >= max && !table.evict_unauthenticated(batch) {
            // Every slot holds a logged-in client: the new one is closed before a byte is read
            // (no buffer, one descriptor for an instant).
            drop(stream);
            acc.refused += 1;
            if acc.refused == 1 {
                shared.log(format!(
                    "WARNING: broker: connection from {peer} refused: max-connections {max} reached, every \
                     connection logged in; closing"
                ));
            }
            continue;
        }
        if acc.refused > 1 {
            shared.log(format!(
                "WARNING: broker: {} more connections were refused at max-connections {max}",
                acc.refused - 1
            ));
        }
        acc.refused = 0;
        shared.active.fetch_add(1, Ordering::SeqCst);
        if let Err(e) = table.add(stream, peer) {
            shared.active.fetch_sub(1, Ordering::SeqCst);
            shared.log(format!("WARNING: broker: connection from {peer}: cannot register it: {e}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::net::TcpStream;

    use super::*;

    /// True once the server side of `s` is closed (EOF or reset) within 5 s.
    fn closed_by_server(s: &mut TcpStream) -> bool {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 64];
        !matches!(s.read(&mut b), Ok(n) if n > 0)
            && !matches!(s.read(&mut b), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    fn wait_active(h: &BrokerHandle, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while h.active_connections() < n {
            assert!(Instant::now() < deadline, "connections were not accepted");
            thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn broker_shutdown_closes_every_connection_and_the_listener() {
        let h = start(BrokerConfig { bind: "127.0.0.1:0".parse().unwrap(), ..Default::default() }).unwrap();
        let addr = h.addr();
        let shared = h.shared.clone();
        let mut before: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(addr).unwrap()).collect();
        wait_active(&h, 3);
        h.shutdown();
        if let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            panic!("connect after shutdown succeeded (loop not joined); closed: {}", closed_by_server(&mut s));
        }
        for s in &mut before {
            assert!(closed_by_server(s), "every connection of the broker is closed after shutdown");
        }
        assert_eq!(shared.active.load(Ordering::SeqCst), 0, "no connection is left");
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
        wait_active(&h, 1);
        drop(h);
        done.store(true, Ordering::SeqCst);
        for s in &mut dialer.join().unwrap() {
            assert!(closed_by_server(s), "every connection of the broker is closed after shutdown");
        }
        assert_eq!(shared.active.load(Ordering::SeqCst), 0, "no connection is left");
    }
}
