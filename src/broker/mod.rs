//! The embedded MQTT 3.1.1 broker (CORE 11): `start(cfg)` binds and spawns one loop thread that
//! waits on epoll for the listener and every client socket (nonblocking, one descriptor per
//! client), with a read buffer and a bounded outbound queue per client, so a slow or dead
//! subscriber never stalls a publisher for longer than its overflow grace. Shared state (sessions,
//! subscriptions, retained messages) lives under one Mutex, which the handle's hooks also read.
//!
//! It never prints: log lines go to an in-memory ring (`BrokerHandle::log_lines`) and to the
//! caller's `BrokerConfig::log` sink (`mam broker` sends them to stderr). It never panics on network
//! input: `codec` checks every length, and a packet's declared size is checked against
//! `max_packet` before a byte of it is buffered.
//!
//! Test hooks (`stall_connack`, `drop_connections`, `retained`, `received`, `connect_count`, ...)
//! are always compiled: they cost a few counters and one bounded record of received messages that
//! `mam broker` turns off (`record: false`). The `test-hooks` feature is accepted but not needed.
//!
//! Retained messages and persistent sessions are kept across restarts in a state file when the
//! config names one (`persist`; `mam broker` does unless `--no-persist`).
//!
//! This file only declares the modules and re-exports the public API; no file imports it. The
//! others import one way: `server` (start, handle, the loop, accept) -> `conn` (the connection table) ->
//! `state` (shared state, lock, log ring) -> `subindex` (which clients a topic's filters name) and
//! `route` (pure routing) -> `session` (pure per-client
//! QoS state machines and queues) -> `topic`; `server` -> `persist` (the state file) -> `state`,
//! `route`, `session`, `topic`; `conn` also uses `route`, `session` and `codec`, and `server`,
//! `persist` and `state` use `config`. `codec`, `topic` and `config` are leaves.

mod config;
mod conn;
mod persist;
mod route;
mod server;
mod session;
mod state;
mod subindex;

pub mod codec;
pub mod topic;

pub use config::{
    BrokerConfig, LogSink, Persist, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_PACKET, DEFAULT_MAX_RETAINED_BYTES,
    DEFAULT_MAX_SESSIONS, DEFAULT_MAX_STATE_BYTES, DEFAULT_MAX_SUBSCRIPTIONS, DEFAULT_PERSIST_INTERVAL,
    FDS_PER_CONNECTION, RESERVED_FDS, STATE_FILE_NAME,
};
pub use server::{start, BrokerHandle};
pub use session::{
    DEFAULT_MAX_QUEUED_BYTES, DEFAULT_MAX_QUEUED_MESSAGES, DEFAULT_SESSION_BYTES, DEFAULT_SESSION_MESSAGES,
};
