//! The broker's settings (`BrokerConfig`) and its log sink type: plain data, shared by the
//! acceptor and every connection.
//!
//! It never opens a socket or reads the environment; `mam broker` fills it from its arguments and
//! tests fill it directly.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

/// Where broker log lines go besides the in-memory ring: called once per line, from any thread.
pub type LogSink = Arc<dyn Fn(&str) + Send + Sync>;

/// Broker settings. `Default` is the CLI's default: `127.0.0.1:1883`, no auth, 1 MiB packets.
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
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            bind: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 1883),
            allow_remote: false,
            username: None,
            password: None,
            max_packet: 1024 * 1024,
            log: None,
            connect_timeout: Duration::from_secs(10),
            queue_limit: 1000,
            record: true,
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
            .finish()
    }
}
