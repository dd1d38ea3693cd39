//! The broker's shared state: the clients (live link, `Session`; persistent ones also while away), the
//! retained store, the CONNACK stall hooks, the loop's wake-up descriptor and the log ring, with the
//! one lock helper. The loop thread changes it; `BrokerHandle`'s hooks read it from other threads.
//!
//! It decides nothing about routing (`route` does) and never reads or writes a socket.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::config::BrokerConfig;
use super::route::{Publish, RetainedStore};
use super::session::{Away, Limits, Session};
use super::subindex::SubIndex;

/// Records kept for `received()`: at most this many messages and this many payload bytes.
const RECORD_MAX_MESSAGES: usize = 100_000;
const RECORD_MAX_BYTES: usize = 64 * 1024 * 1024;
/// Log lines kept in memory for `log_lines()`.
const LOG_RING: usize = 2000;

/// One item of a client's outbound queue: an encoded packet (a QoS 0 publish is encoded once and
/// shared by every subscriber).
pub(super) enum Out {
    Owned(Vec<u8>),
    Shared(Arc<[u8]>),
}

impl Out {
    pub(super) fn bytes(&self) -> &[u8] {
        match self {
            Out::Owned(v) => v,
            Out::Shared(v) => v,
        }
    }
}

/// A client's live connection: which connection of the loop's table it is.
pub(super) struct Link {
    pub(super) conn: u64,
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
    /// Boxed, as the connection table's entries: a slot is 32 bytes, not 176.
    pub(super) clients: HashMap<String, Box<Client>>,
    /// Every filter of every client in `clients`, kept in step with their sessions (subscribe, unsubscribe,
    /// `unindex_session`, the restore): who may get a topic.
    pub(super) index: SubIndex,
    pub(super) retained: RetainedStore,
    /// Bytes held by `retained` (`route::retained_cost` summed).
    pub(super) retained_bytes: usize,
    /// What the sessions of away clients hold together (`max_queued_*` caps it).
    pub(super) away: Away,
    pub(super) received: VecDeque<(String, Vec<u8>, bool)>,
    pub(super) received_bytes: usize,
    pub(super) connects: Vec<String>,
    pub(super) connect_total: usize,
}

impl State {
    /// Removes every filter of client `cid`'s `session` (being discarded) from the index.
    pub(super) fn unindex_session(&mut self, cid: &str, session: &Session) {
        for (f, _) in &session.subs {
            self.index.remove(f, cid);
        }
    }

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

/// What the loop thread and the handle share.
pub(super) struct Shared {
    pub(super) cfg: BrokerConfig,
    pub(super) state: Mutex<State>,
    /// Connections accepted and not yet ended (the `max_connections` count).
    pub(super) active: AtomicUsize,
    pub(super) stop: AtomicBool,
    /// `drop_connections` asked the loop to close every client connection.
    pub(super) drop_all: AtomicBool,
    pub(super) stalled: Mutex<Vec<String>>,
    /// Wakes the loop for `stop`, `drop_all` and a released stall.
    pub(super) waker: crate::sys::Waker,
    pub(super) log_ring: Mutex<VecDeque<String>>,
    /// Changes to what the state file keeps (retained messages, persistent sessions), counted by
    /// the loop thread; `persist::Saver` writes when it moved.
    pub(super) changes: AtomicU64,
}

/// Locks `m`, ignoring poisoning: a panicked holder leaves plain data, still usable.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    pub(super) fn session_limits(&self) -> Limits {
        Limits { messages: self.cfg.session_messages, bytes: self.cfg.session_bytes }
    }

    /// The broker-wide limits of every away session together.
    pub(super) fn away_limits(&self) -> Limits {
        Limits { messages: self.cfg.max_queued_messages, bytes: self.cfg.max_queued_bytes }
    }

    /// Something the state file keeps changed.
    pub(super) fn changed(&self) {
        self.changes.fetch_add(1, Ordering::Relaxed);
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
}
