//! The broker's shared state: the clients (live link, `Session`; persistent ones also while away), the
//! retained store, the connection slots the acceptor joins, the CONNACK stall hooks and the log
//! ring, with the one lock helper every thread uses.
//!
//! It decides nothing about routing (`route` does) and never reads or writes a socket: it only
//! holds handles that `conn` and `server` use.

use std::collections::{HashMap, VecDeque};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use super::config::BrokerConfig;
use super::route::{Publish, RetainedStore};
use super::session::{Limits, Session};

/// Records kept for `received()`: at most this many messages and this many payload bytes.
const RECORD_MAX_MESSAGES: usize = 100_000;
const RECORD_MAX_BYTES: usize = 64 * 1024 * 1024;
/// Log lines kept in memory for `log_lines()`.
const LOG_RING: usize = 2000;

/// One item of a client's outbound queue: encoded packets (a QoS 0 publish is encoded once and
/// shared by every subscriber) or the end of the queue.
pub(super) enum Out {
    Owned(Vec<u8>),
    Shared(Arc<[u8]>),
    Close,
}

/// A client's live connection: which connection it is, its outbound queue and a handle on its
/// socket (to close it from another thread).
pub(super) struct Link {
    pub(super) conn: u64,
    pub(super) tx: SyncSender<Out>,
    pub(super) stream: TcpStream,
}

/// A client the broker knows: connected (`link`), or away with a persistent session
/// (CleanSession=0) that keeps its subscriptions and QoS 1/2 messages until it returns.
pub(super) struct Client {
    pub(super) link: Option<Link>,
    pub(super) session: Session,
    pub(super) persistent: bool,
}

impl Client {
    /// The client's queue when it is connected through connection `conn`.
    pub(super) fn is_conn(&self, conn: u64) -> bool {
        self.link.as_ref().is_some_and(|l| l.conn == conn)
    }
}

/// Everything under the state lock.
#[derive(Default)]
pub(super) struct State {
    pub(super) clients: HashMap<String, Client>,
    pub(super) retained: RetainedStore,
    /// Bytes held by `retained` (`route::retained_cost` summed).
    pub(super) retained_bytes: usize,
    pub(super) received: VecDeque<(String, Vec<u8>, bool)>,
    pub(super) received_bytes: usize,
    pub(super) connects: Vec<String>,
    pub(super) connect_total: usize,
}

impl State {
    pub(super) fn note_connect(&mut self, id: &str, record: bool) {
        self.connect_total += 1;
        if record && self.connects.len() < RECORD_MAX_MESSAGES {
            self.connects.push(id.to_string());
        }
    }

    /// Adds an accepted PUBLISH to the bounded record behind `BrokerHandle::received`, dropping
    /// the oldest beyond `RECORD_MAX_MESSAGES` or `RECORD_MAX_BYTES`.
    pub(super) fn note_received(&mut self, msg: &Publish<'_>) {
        self.received.push_back((msg.topic.to_string(), msg.payload.to_vec(), msg.retain));
        self.received_bytes += msg.payload.len();
        while self.received.len() > RECORD_MAX_MESSAGES || self.received_bytes > RECORD_MAX_BYTES {
            match self.received.pop_front() {
                Some((_, p, _)) => self.received_bytes -= p.len(),
                None => break,
            }
        }
    }
}

/// One accepted connection as the acceptor tracks it: a socket handle to shut it down with (None
/// once the connection has ended) and its thread to join.
pub(super) struct ConnSlot {
    pub(super) stream: Option<TcpStream>,
    pub(super) thread: Option<JoinHandle<()>>,
}

/// What the acceptor, every connection and the handle share.
pub(super) struct Shared {
    pub(super) cfg: BrokerConfig,
    pub(super) state: Mutex<State>,
    pub(super) conns: Mutex<HashMap<u64, ConnSlot>>,
    pub(super) next_conn: AtomicU64,
    /// Connections accepted and not yet ended (the `max_connections` count).
    pub(super) active: AtomicUsize,
    pub(super) stop: AtomicBool,
    pub(super) stalled: Mutex<Vec<String>>,
    pub(super) stall_cv: Condvar,
    pub(super) log_ring: Mutex<VecDeque<String>>,
}

/// Locks `m`, ignoring poisoning: a panicked holder leaves plain data, still usable.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    pub(super) fn session_limits(&self) -> Limits {
        Limits { messages: self.cfg.session_messages, bytes: self.cfg.session_bytes }
    }

    pub(super) fn log(&self, line: String) {
        if let Some(sink) = &self.cfg.log {
            sink(&line);
        }
        let mut ring = lock(&self.log_ring);
        if ring.len() == LOG_RING {
            ring.pop_front();
        }
        ring.push_back(line);
    }

    pub(super) fn stall_active(&self, client_id: &str) -> bool {
        lock(&self.stalled).iter().any(|p| client_id.starts_with(p.as_str()))
    }

    /// Blocks while a `stall_connack` prefix matches `client_id` (or until shutdown).
    pub(super) fn wait_stall(&self, client_id: &str) {
        let mut st = lock(&self.stalled);
        while !self.stop.load(Ordering::SeqCst) && st.iter().any(|p| client_id.starts_with(p.as_str())) {
            st = self.stall_cv.wait_timeout(st, Duration::from_millis(100)).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}
