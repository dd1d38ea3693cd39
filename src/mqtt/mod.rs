//! The blocking MQTT 3.1.1 client, its configuration and the openssl TLS shim (CORE 3, A2, A8, A22).
//!
//! `config` reads CORE 3.1's settings and owns the broker block, the connection identity and client
//! ids; `codec` is the pure packet layer over mqttrs; `transport` and `tls` move bytes; `client` is
//! one connection (connect, publish, subscribe, receive, keepalive, close) plus the persistent
//! connection of CORE 3.5; `retry` is `with_retry` and the retryable classification of CORE 3.3;
//! `error` and `stop` are the types every part shares; `cred` is the embedded broker's credential
//! file (written by `mam broker`, read by `config`); `check` is `mam broker check`'s measurements over
//! `client`. This file only declares and re-exports.
//!
//! This module never prints and never reads the process environment: warnings and notes are
//! returned as values, configuration comes from a `Ctx`. The one exception is the warning about an
//! untrustworthy credential file, which `config` writes through `Ctx::diag` once per file and
//! process (every command reads its configuration through `from_ctx`, so no caller is missed). No
//! message it builds contains a password.

pub mod check;
pub mod client;
pub mod codec;
pub mod config;
pub mod cred;
pub mod error;
pub mod retry;
pub mod stop;
pub mod tls;
pub mod transport;

pub use client::{Client, Persistent};
pub use codec::{Incoming, Message};
pub use config::{BrokerBlock, Identity, MqttConfig, Role, Secret};
pub use error::MqttError;
pub use retry::{with_retry, RetryPolicy};
pub use stop::Stop;
