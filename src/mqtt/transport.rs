//! The byte pipe under the client: a TCP socket or the TLS shim, behind one interface whose reads
//! take a timeout (at most one slice of 200 ms at a time is the client's rule, CORE 3.2).
//!
//! Opening happens under the caller's deadline; TCP connects go through `sys::connect`. Nothing here
//! knows MQTT.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::config::{Endpoint, MqttConfig};
use super::error::MqttError;
use super::tls::TlsShim;
use crate::sys;

/// An open connection to the broker.
pub enum Transport {
    Tcp(TcpStream),
    Tls(Box<TlsShim>),
}

impl Transport {
    /// Opens TCP to broker `ep` (or starts the TLS shim for it) before `deadline`. A name is resolved
    /// within the deadline; its addresses are tried in turn, each within an equal share of what is
    /// left, so a refused or a silent address moves on to the next (issue 19).
    pub fn open(cfg: &MqttConfig, ep: &Endpoint, deadline: Instant) -> Result<Transport, MqttError> {
        let addr = ep.addr();
        if cfg.tls {
            return match TlsShim::spawn(cfg, ep, deadline) {
                Ok(s) => Ok(Transport::Tls(Box::new(s))),
                Err(super::tls::SpawnError::NotFound(program)) => Err(MqttError::OpensslNotFound { program }),
                Err(super::tls::SpawnError::Timeout(_)) => Err(MqttError::NoConnack { addr, phase: "openssl probe" }),
                Err(super::tls::SpawnError::Other(program, e)) => {
                    Err(MqttError::Internal(format!("cannot start TLS shim {program}: {e}")))
                }
            };
        }
        let addrs = resolve(ep, deadline)?;
        let mut last = None;
        let mut timed_out = false;
        for (k, a) in addrs.iter().enumerate() {
            let now = Instant::now();
            if now >= deadline {
                timed_out = true;
                break;
            }
            let left = (addrs.len() - k) as u32;
            match sys::connect(a, (deadline - now) / left) {
                Ok(s) => {
                    let _ = s.set_nodelay(true);
                    return Ok(Transport::Tcp(s));
                }
                Err(e) if e.kind() == io::ErrorKind::TimedOut || e.kind() == io::ErrorKind::WouldBlock => {
                    timed_out = true;
                }
                Err(e) => last = Some(e),
            }
        }
        match last {
            // A refusal is the more telling error when another address timed out.
            Some(e) => Err(MqttError::Tcp { addr, source: e }),
            None if timed_out => Err(MqttError::NoConnack { addr, phase: "connect" }),
            None => Err(MqttError::Resolve { addr, detail: "no addresses".into(), temporary: false }),
        }
    }

    /// Reads within `timeout`: `Ok(None)` on timeout, `Ok(Some(0))` when the peer closed.
    pub fn read_timeout(&mut self, buf: &mut [u8], timeout: Duration) -> io::Result<Option<usize>> {
        let timeout = timeout.max(Duration::from_millis(1));
        match self {
            Transport::Tcp(s) => {
                s.set_read_timeout(Some(timeout))?;
                match s.read(buf) {
                    Ok(n) => Ok(Some(n)),
                    Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => Ok(None),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(None),
                    Err(e) => Err(e),
                }
            }
            Transport::Tls(t) => t.read_timeout(buf, timeout),
        }
    }

    pub fn write_all(&mut self, bytes: &[u8], timeout: Duration) -> io::Result<()> {
        match self {
            Transport::Tcp(s) => {
                s.set_write_timeout(Some(timeout.max(Duration::from_millis(1))))?;
                s.write_all(bytes)
            }
            Transport::Tls(t) => t.write_all(bytes),
        }
    }

    /// A non-blocking check that the peer has closed (EOF or a reset pending).
    pub fn peer_closed(&mut self) -> bool {
        match self {
            Transport::Tcp(s) => {
                let mut b = [0u8; 1];
                if s.set_nonblocking(true).is_err() {
                    return true;
                }
                let r = s.peek(&mut b);
                let _ = s.set_nonblocking(false);
                match r {
                    Ok(0) => true,
                    Ok(_) => false,
                    Err(e) => e.kind() != io::ErrorKind::WouldBlock,
                }
            }
            Transport::Tls(t) => t.at_eof(),
        }
    }

    /// The TLS shim, for failure details.
    pub fn shim(&mut self) -> Option<&mut TlsShim> {
        match self {
            Transport::Tls(t) => Some(t),
            Transport::Tcp(_) => None,
        }
    }

    /// Shuts down the socket or ends the shim.
    pub fn close(&mut self) {
        match self {
            Transport::Tcp(s) => {
                let _ = s.shutdown(Shutdown::Both);
            }
            Transport::Tls(t) => t.close(),
        }
    }
}

/// The addresses of `ep` before `deadline`. An IP literal needs no lookup; a name is looked up on a
/// helper thread, because getaddrinfo has no timeout. A lookup still running at the deadline is
/// left to finish on its own (it holds nothing but its thread) and the connect fails in the
/// `resolve` phase. Public for `mam broker check`, which checks each address of a name.
pub fn resolve(ep: &Endpoint, deadline: Instant) -> Result<Vec<SocketAddr>, MqttError> {
    let addr = ep.addr();
    if let Ok(ip) = ep.host.parse::<std::net::IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, ep.port)]);
    }
    sys::builtin_host_lookup_only();
    let lookup = |host: &str, port: u16| (host, port).to_socket_addrs().map(|a| a.collect::<Vec<_>>());
    let (tx, rx) = mpsc::channel();
    let (host, port) = (ep.host.clone(), ep.port);
    let spawned = std::thread::Builder::new().name("mqtt-resolve".into()).stack_size(256 * 1024).spawn(move || {
        let _ = tx.send(lookup(&host, port));
    });
    let result = match spawned {
        Ok(handle) => match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(r) => {
                let _ = handle.join();
                r
            }
            Err(_) => return Err(MqttError::NoConnack { addr, phase: "resolve" }),
        },
        // No thread to be had: look up on this one (no deadline, as before issue 19).
        Err(_) => lookup(&ep.host, ep.port),
    };
    match result {
        Ok(a) if a.is_empty() => Err(MqttError::Resolve { addr, detail: "no addresses".into(), temporary: false }),
        Ok(a) => Ok(a),
        Err(e) => Err(MqttError::Resolve { addr, detail: e.to_string(), temporary: is_temporary_dns(&e) }),
    }
}

/// `EAI_AGAIN` (temporary failure in name resolution) is the retryable DNS case (CORE 3.3).
fn is_temporary_dns(e: &io::Error) -> bool {
    let s = e.to_string();
    s.contains("Temporary failure") || s.contains("try again")
}
