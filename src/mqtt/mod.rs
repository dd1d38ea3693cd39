//! The blocking MQTT 3.1.1 client, its configuration and the openssl TLS shim (CORE 3, A2, A8, A22).
//!
//! `config` reads CORE 3.1's settings and owns the broker block, the connection identity and client
//! ids; `codec` is the pure packet layer over mqttrs; `transport` and `tls` move bytes; `client` is
//! one connection (connect, publish, subscribe, receive, keepalive, close) plus the persistent
//! connection of CORE 3.5; `retry` is `with_retry` and the retryable classification of CORE 3.3.
//!
//! This module never prints and never reads the process environment: warnings and notes are
//! returned as values, configuration comes from a `Ctx`. No message it builds contains a password.

pub mod client;
pub mod codec;
pub mod config;
pub mod retry;
pub mod tls;
pub mod transport;

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub use client::{Client, Persistent};
pub use codec::{Incoming, Message};
pub use config::{BrokerBlock, Identity, MqttConfig, Role, Secret};
pub use retry::{with_retry, RetryPolicy};

/// A caller's stop condition, checked between read slices of at most 200 ms.
#[derive(Clone, Default)]
pub struct Stop(Option<Arc<dyn Fn() -> bool + Send + Sync>>);

impl Stop {
    /// Never stops.
    pub fn never() -> Stop {
        Stop(None)
    }
    /// Stops once `flag` is set.
    pub fn flag(flag: Arc<AtomicBool>) -> Stop {
        Stop(Some(Arc::new(move || flag.load(Ordering::SeqCst))))
    }
    /// Stops once SIGTERM or SIGINT arrived (after `sys::install_stop_handlers`).
    pub fn signals() -> Stop {
        Stop(Some(Arc::new(|| crate::sys::pending_signal().is_some())))
    }
    pub fn from_fn(f: impl Fn() -> bool + Send + Sync + 'static) -> Stop {
        Stop(Some(Arc::new(f)))
    }
    pub fn is_set(&self) -> bool {
        self.0.as_ref().is_some_and(|f| f())
    }
}

impl fmt::Debug for Stop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() { "Stop(fn)" } else { "Stop(never)" })
    }
}

/// Everything that can go wrong on the wire. Messages are one line, name the broker address and the
/// topic or filter, and never contain a secret. `retryable` is CORE 3.3's classification.
#[derive(Debug)]
pub enum MqttError {
    /// TCP connect failed (refused, reset, unreachable, ...).
    Tcp {
        addr: String,
        source: io::Error,
    },
    /// Name resolution failed; `temporary` for EAI_AGAIN.
    Resolve {
        addr: String,
        detail: String,
        temporary: bool,
    },
    /// The connect deadline expired; `phase` is where (connect or connack).
    NoConnack {
        addr: String,
        phase: &'static str,
    },
    ClosedBeforeConnack {
        addr: String,
    },
    ConnackRefused {
        addr: String,
        code: u8,
    },
    /// A PUBACK, SUBACK or PINGRESP did not arrive in time.
    Timeout {
        addr: String,
        phase: &'static str,
        what: String,
    },
    /// The connection broke after CONNACK.
    Lost {
        addr: String,
        during: &'static str,
        detail: String,
    },
    /// A persistent connection found dropped; it is re-established by the next operation.
    NotConnected {
        addr: String,
    },
    TlsVerify {
        addr: String,
        line: String,
    },
    /// The TLS shim ended before the handshake completed, without a verification error.
    TlsExited {
        addr: String,
        detail: String,
    },
    OpensslNotFound {
        program: String,
    },
    Encode {
        topic: String,
        err: codec::EncodeError,
    },
    SubackRefused {
        filter: String,
    },
    /// The broker sent something that is not valid MQTT for a client.
    Protocol {
        addr: String,
        detail: String,
    },
    /// The caller's stop condition fired.
    Stopped,
    Internal(String),
}

impl MqttError {
    /// CORE 3.3: which failures another attempt may cure.
    pub fn retryable(&self) -> bool {
        match self {
            MqttError::Tcp { source, .. } => is_retryable_io(source),
            MqttError::Resolve { temporary, .. } => *temporary,
            MqttError::NoConnack { .. } | MqttError::ClosedBeforeConnack { .. } => true,
            MqttError::ConnackRefused { code, .. } => *code == 3,
            MqttError::Timeout { .. }
            | MqttError::Lost { .. }
            | MqttError::NotConnected { .. }
            | MqttError::TlsExited { .. } => true,
            MqttError::TlsVerify { .. }
            | MqttError::OpensslNotFound { .. }
            | MqttError::Encode { .. }
            | MqttError::SubackRefused { .. }
            | MqttError::Protocol { .. }
            | MqttError::Stopped
            | MqttError::Internal(_) => false,
        }
    }
}

fn is_retryable_io(e: &io::Error) -> bool {
    use io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionRefused | ConnectionReset | ConnectionAborted | TimedOut | HostUnreachable | NetworkUnreachable
    ) || matches!(e.raw_os_error(), Some(libc::EHOSTUNREACH | libc::ENETUNREACH | libc::ENETDOWN | libc::EHOSTDOWN))
}

impl fmt::Display for MqttError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MqttError::Tcp { addr, source } => write!(f, "cannot connect to broker {addr}: {source}"),
            MqttError::Resolve { addr, detail, .. } => write!(f, "cannot resolve broker {addr}: {detail}"),
            MqttError::NoConnack { addr, phase } => {
                write!(f, "no CONNACK from broker {addr} (connect timeout expired in {phase})")
            }
            MqttError::ClosedBeforeConnack { addr } => write!(f, "broker {addr} closed the connection before CONNACK"),
            MqttError::ConnackRefused { addr, code } => {
                write!(f, "broker {addr} refused the connection: CONNACK {code} ({})", codec::connack_reason(*code))
            }
            MqttError::Timeout { addr, phase, what } => write!(f, "{phase} timeout: broker {addr} {what}"),
            MqttError::Lost { addr, during, detail } => {
                write!(f, "connection to broker {addr} lost during {during} ({detail})")
            }
            MqttError::NotConnected { addr } => {
                write!(f, "not connected to broker {addr} (connection dropped; reconnecting)")
            }
            MqttError::TlsVerify { addr, line } => write!(f, "TLS verification failed for {addr}: {line}"),
            MqttError::TlsExited { addr, detail } => {
                write!(f, "TLS shim for {addr} ended before the handshake ({detail})")
            }
            MqttError::OpensslNotFound { program } => {
                write!(f, "TLS needs openssl but '{}' was not found (set MAM_OPENSSL)", crate::text::one_line(program))
            }
            MqttError::Encode { topic, err } => {
                write!(f, "cannot publish to '{}': {err}", crate::text::one_line(topic))
            }
            MqttError::SubackRefused { filter } => {
                write!(f, "broker refused the subscription to '{}' (SUBACK 0x80)", crate::text::one_line(filter))
            }
            MqttError::Protocol { addr, detail } => write!(f, "protocol error from broker {addr}: {detail}"),
            MqttError::Stopped => f.write_str("stopped"),
            MqttError::Internal(m) => write!(f, "internal error: {m}"),
        }
    }
}

impl std::error::Error for MqttError {}
