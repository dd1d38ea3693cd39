//! `MqttError`: everything that can go wrong on the wire, each message naming the broker address and
//! the phase, topic or filter, never a secret, with CORE 3.3's retryable classification.

use std::fmt;
use std::io;

use super::codec;
use crate::text::one_line;

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
    /// No broker of a list of several answered (issue 19): each one's address and error, in the
    /// order they were tried.
    NoBroker {
        failures: Vec<(String, MqttError)>,
    },
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
            // Another round may find one of them back.
            MqttError::NoBroker { failures } => failures.iter().any(|(_, e)| e.retryable()),
        }
    }

    /// Whether a connect walking a broker list tries the next broker after this failure: after any
    /// but a stop, a missing or unstartable openssl, or an internal error (which the next broker
    /// would meet too). A refused CONNACK or a failed TLS verification is one broker's answer.
    pub fn moves_on(&self) -> bool {
        !matches!(self, MqttError::Stopped | MqttError::OpensslNotFound { .. } | MqttError::Internal(_))
    }

    /// The broker answered but was not ready for a session: it closed the connection before CONNACK
    /// or answered CONNACK 3 (server unavailable). A NATS node does both while its cluster fails
    /// over (issue 31); asked again a moment later, it answers.
    pub fn not_ready(&self) -> bool {
        matches!(self, MqttError::ClosedBeforeConnack { .. } | MqttError::ConnackRefused { code: 3, .. })
    }

    /// The failure without the broker address and without advice: one item of `NoBroker`'s list.
    pub fn brief(&self) -> String {
        match self {
            MqttError::Tcp { source, .. } => source.to_string(),
            MqttError::Resolve { detail, .. } => format!("cannot resolve ({detail})"),
            MqttError::NoConnack { phase, .. } => {
                format!("no CONNACK (its share of the connect timeout expired in {phase})")
            }
            MqttError::ClosedBeforeConnack { .. } => "closed the connection before CONNACK".into(),
            MqttError::ConnackRefused { code, .. } => {
                format!("refused the connection: CONNACK {code} ({})", codec::connack_reason(*code))
            }
            other => other.to_string(),
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
            MqttError::Tcp { addr, source } if source.kind() == io::ErrorKind::ConnectionRefused => write!(
                f,
                "cannot connect to broker {addr}: {source}; no broker is running there: start one with \
                 `mam broker` (see mam broker --help) or set MQTT_BROKER and MQTT_PORT to yours"
            ),
            MqttError::Tcp { addr, source } => write!(f, "cannot connect to broker {addr}: {source}"),
            MqttError::Resolve { addr, detail, .. } => write!(f, "cannot resolve broker {addr}: {detail}"),
            MqttError::NoConnack { addr, phase } => {
                write!(f, "no CONNACK from broker {addr} (connect timeout expired in {phase})")
            }
            MqttError::ClosedBeforeConnack { addr } => write!(f, "broker {addr} closed the connection before CONNACK"),
            MqttError::ConnackRefused { addr, code } => {
                write!(f, "broker {addr} refused the connection: CONNACK {code} ({})", codec::connack_reason(*code))?;
                if matches!(code, 4 | 5) {
                    // Issue 32: most often another repository's broker on the default port.
                    f.write_str(
                        "; if it is not this repository's broker, start this one's with `mam broker` (its port \
                         and credentials go to .mam/broker.cred, where mam finds them), else set MQTT_USERNAME \
                         and MQTT_PASSWORD",
                    )?;
                }
                Ok(())
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
                write!(f, "TLS needs openssl but '{}' was not found (set MAM_OPENSSL)", one_line(program))
            }
            MqttError::Encode { topic, err } => {
                write!(f, "cannot publish to '{}': {err}", one_line(topic))
            }
            MqttError::SubackRefused { filter } => {
                write!(f, "broker refused the subscription to '{}' (SUBACK 0x80)", one_line(filter))
            }
            MqttError::Protocol { addr, detail } => write!(f, "protocol error from broker {addr}: {detail}"),
            MqttError::Stopped => f.write_str("stopped"),
            MqttError::Internal(m) => write!(f, "internal error: {m}"),
            MqttError::NoBroker { failures } => {
                let each: Vec<String> = failures.iter().map(|(a, e)| format!("{a}: {}", e.brief())).collect();
                write!(f, "no broker of the list answered within the connect timeout ({})", each.join("; "))
            }
        }
    }
}

impl std::error::Error for MqttError {}
