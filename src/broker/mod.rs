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
//!
//! This file only declares the modules and re-exports the public API; no file imports it. The
//! others import one way: `server` (start, handle, acceptor) -> `conn` (one connection) ->
//! `state` (shared state, lock, log ring) -> `route` (pure routing) -> `session` (pure per-client
//! QoS state machines and queues) -> `topic`; `conn` also uses `route`, `session` and `codec`,
//! and `server` and `state` use `config`. `codec`, `topic` and `config` are leaves.

mod config;
mod conn;
mod route;
mod server;
mod session;
mod state;

pub mod codec;
pub mod topic;

pub use config::{
    BrokerConfig, LogSink, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_PACKET, DEFAULT_MAX_RETAINED_BYTES,
    DEFAULT_MAX_SESSIONS, DEFAULT_MAX_SUBSCRIPTIONS, FDS_PER_CONNECTION,
};
pub use server::{start, BrokerHandle};
pub use session::{DEFAULT_SESSION_BYTES, DEFAULT_SESSION_MESSAGES};
