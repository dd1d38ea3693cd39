//! The broker's settings (`BrokerConfig`) and its log sink type: plain data, shared by the
//! loop and every connection.
//!
//! It never opens a socket or reads the environment; `mam broker` fills it from its arguments and
//! tests fill it directly.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Where broker log lines go besides the in-memory ring: called once per line, from any thread.
pub type LogSink = Arc<dyn Fn(&str) + Send + Sync>;

/// Default `max_connections` of the library (`mam broker` takes every descriptor its open-file limit
/// allows instead); each connection holds one descriptor and no thread.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1000;
/// Default `max_subscriptions` per client (mam's own clients hold at most a handful).
pub const DEFAULT_MAX_SUBSCRIPTIONS: usize = 100;
/// Default `max_retained_bytes`: topic plus payload of every retained message.
pub const DEFAULT_MAX_RETAINED_BYTES: usize = 64 * 1024 * 1024;
/// Default `max_retained_message` and `max_packet`: 1 MiB, room for a 768 KiB inline brief (A12).
pub const DEFAULT_MAX_PACKET: usize = 1024 * 1024;
/// Default `max_sessions`: persistent sessions kept for clients that are away.
pub const DEFAULT_MAX_SESSIONS: usize = 1000;
/// Descriptors one connection holds (its socket; the loop's epoll and wake-up descriptors are
/// shared): `mam broker` keeps `max_connections` under the descriptor limit with this.
pub const FDS_PER_CONNECTION: usize = 1;

/// Descriptors `mam broker` keeps beyond those open at its start for its own files (listener,
/// epoll, wake-up, state lock, a save's file and directory, the one a connection accepted at the
/// cap holds while it takes an unauthenticated connection's place) when it sizes `max_connections`
/// from the open-file limit.
pub const RESERVED_FDS: usize = 16;

/// Default `Persist::interval`: a change is on disk at most this long after it happens.
pub const DEFAULT_PERSIST_INTERVAL: Duration = Duration::from_secs(5);
/// Default `Persist::max_bytes`: the largest state file written or read.
pub const DEFAULT_MAX_STATE_BYTES: usize = 256 * 1024 * 1024;
/// The state file's name in `<control root>/.mam/` (`mam broker` without `--no-persist`).
pub const STATE_FILE_NAME: &str = "broker.state";

/// Persistence of retained messages and persistent sessions across restarts (`persist`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Persist {
    /// The state file; its directory must exist. `<path>.lock` keeps a second broker off it.
    pub path: PathBuf,
    /// A change is written at most this long after it happens (and at shutdown).
    pub interval: Duration,
    /// The largest file written (what does not fit is left out, logged) or read (larger: set aside).
    pub max_bytes: usize,
}

/// Broker settings. `Default` is the library and test default: `127.0.0.1:1883`, **no
/// authentication** (anonymous clients accepted, as the in-process test broker needs), 1 MiB
/// packets and the caps above. `mam broker` does not use this default for auth: it requires a
/// username and password unless started with `--allow-anonymous` (CORE 11.1).
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
    /// Open connections beyond this are closed as soon as they are accepted, before any byte is
    /// read (as mosquitto does with `max_connections`).
    pub max_connections: usize,
    /// Subscriptions one client may hold; more filters get 0x80 in the SUBACK.
    pub max_subscriptions: usize,
    /// Bytes the retained store may hold (topic plus payload per message).
    pub max_retained_bytes: usize,
    /// Largest retained payload stored; a larger one is forwarded but not retained.
    pub max_retained_message: usize,
    /// Persistent sessions (CleanSession=0) kept while their clients are away; a CONNECT that
    /// would create one more gets CONNACK 0x03.
    pub max_sessions: usize,
    /// Per-session limits on QoS 1/2 messages unacknowledged or queued (count and bytes); past
    /// either, new messages for that session are dropped and the first drop is logged.
    pub session_messages: usize,
    pub session_bytes: usize,
    /// Broker-wide limits on the QoS 1/2 messages held by every session whose client is away
    /// (count and topic plus payload bytes, each session's copy counted); past either, a new
    /// message for an away session is dropped (the newest, as past a session's own limits), one
    /// WARNING per session until it queues again. Connected clients are not affected.
    pub max_queued_messages: usize,
    pub max_queued_bytes: usize,
    /// Keep retained messages and persistent sessions in a file across restarts (None: memory only,
    /// the library and test default).
    pub persist: Option<Persist>,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            bind: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 1883),
            allow_remote: false,
            username: None,
            password: None,
            max_packet: DEFAULT_MAX_PACKET,
            log: None,
            connect_timeout: Duration::from_secs(10),
            queue_limit: 1000,
            record: true,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_subscriptions: DEFAULT_MAX_SUBSCRIPTIONS,
            max_retained_bytes: DEFAULT_MAX_RETAINED_BYTES,
            max_retained_message: DEFAULT_MAX_PACKET,
            max_sessions: DEFAULT_MAX_SESSIONS,
            session_messages: super::session::DEFAULT_SESSION_MESSAGES,
            session_bytes: super::session::DEFAULT_SESSION_BYTES,
            max_queued_messages: super::session::DEFAULT_MAX_QUEUED_MESSAGES,
            max_queued_bytes: super::session::DEFAULT_MAX_QUEUED_BYTES,
            persist: None,
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
            .field("max_connections", &self.max_connections)
            .field("max_subscriptions", &self.max_subscriptions)
            .field("max_retained_bytes", &self.max_retained_bytes)
            .field("max_retained_message", &self.max_retained_message)
            .field("max_sessions", &self.max_sessions)
            .field("session_messages", &self.session_messages)
            .field("session_bytes", &self.session_bytes)
            .field("max_queued_messages", &self.max_queued_messages)
            .field("max_queued_bytes", &self.max_queued_bytes)
            .field("persist", &self.persist)
            .finish()
    }
}
