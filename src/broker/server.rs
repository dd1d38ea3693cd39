//! The running broker: `start` binds and spawns the acceptor, the acceptor spawns one `conn::serve`
//! thread per connection and keeps its slot, and `BrokerHandle` shuts everything down and joins it,
//! besides offering the test hooks.
//!
//! It never reads or writes a client socket (only shuts them down) and decides nothing about
//! packets or routing.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use super::config::BrokerConfig;
use super::conn;
use super::state::{lock, ConnSlot, Shared, State};

const READER_STACK: usize = 128 * 1024;

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
        active: AtomicUsize::new(0),
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
        let st = lock(&self.shared.state);
        let mut v: Vec<String> = st.clients.iter().filter(|(_, c)| c.link.is_some()).map(|(k, _)| k.clone()).collect();
        v.sort();
        v
    }

    /// Ids of the clients away with a stored persistent session, sorted.
    pub fn sessions(&self) -> Vec<String> {
        let st = lock(&self.shared.state);
        let mut v: Vec<String> = st.clients.iter().filter(|(_, c)| c.link.is_none()).map(|(k, _)| k.clone()).collect();
        v.sort();
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
    // Connections closed at the cap since the last one let in: the first is logged, the rest
    // are counted into one line when a connection is let in again (a flood logs two lines).
    let mut refused = 0usize;
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
        let max = shared.cfg.max_connections;
        if shared.active.load(Ordering::SeqCst) >= max {
            // Closed before a byte is read: no thread, no buffer, one descriptor for an instant.
            drop(stream);
            refused += 1;
            if refused == 1 {
                shared.log(format!(
                    "WARNING: broker: connection from {peer} refused: max-connections {max} reached; closing"
                ));
            }
            continue;
        }
        if refused > 1 {
            shared.log(format!(
                "WARNING: broker: {} more connections were refused at max-connections {max}",
                refused - 1
            ));
        }
        refused = 0;
        shared.active.fetch_add(1, Ordering::SeqCst);
        let _ = stream.set_nodelay(true);
        let id = shared.next_conn.fetch_add(1, Ordering::SeqCst);
        let Ok(registry_copy) = stream.try_clone() else {
            shared.active.fetch_sub(1, Ordering::SeqCst);
            continue;
        };
        let sh = shared.clone();
        let spawned = thread::Builder::new()
            .name("broker-conn".into())
            .stack_size(READER_STACK)
            .spawn(move || conn::serve(sh, id, stream, peer));
        let mut conns = lock(&shared.conns);
        conns.retain(|_, s| !s.thread.as_ref().is_some_and(|t| t.is_finished()) || take_join(s));
        match spawned {
            Ok(t) => {
                conns.insert(id, ConnSlot { stream: Some(registry_copy), thread: Some(t) });
            }
            Err(e) => {
                drop(conns);
                shared.active.fetch_sub(1, Ordering::SeqCst);
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

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::net::TcpStream;
    use std::time::Instant;

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
