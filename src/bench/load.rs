//! An MQTT 3.1.1 load generator for comparing brokers on one machine (issue 17's benchmark, the
//! `mam bench` rows): one publisher to one subscriber on one topic, QoS 0 or 1 with at most 100
//! messages unacknowledged, each payload carrying its send time so the subscriber measures
//! publish-to-delivery latency; and `n` idle clients, each connected and subscribed, held while
//! the caller reads the broker's resident set. CONNECT and SUBSCRIBE come from `mqtt::codec`; the
//! PUBLISH and the frame splitting are written out here so the generator costs both brokers
//! alike, little. Every read has a deadline. Nothing here prints.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::mqtt::codec;

/// What one delivery run measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Delivery {
    pub messages: usize,
    /// Messages per second from the first send to the last delivery.
    pub per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// Messages the publisher may have unacknowledged at QoS 1.
pub const WINDOW: usize = 100;
/// Payload bytes per message (the first 8 carry the send time).
pub const PAYLOAD: usize = 64;
const TOPIC: &str = "mam-bench/delivery";

fn timeout(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, format!("timed out waiting for {what}"))
}

/// Splits MQTT frames out of a byte stream: `(first byte, body)`.
#[derive(Debug, Default)]
struct Frames {
    buf: Vec<u8>,
    at: usize,
}

impl Frames {
    /// Reads once from `s` into the buffer; `Ok(false)` at the end of the stream.
    fn fill(&mut self, s: &mut TcpStream) -> io::Result<bool> {
        if self.at > 0 && self.at == self.buf.len() {
            self.buf.clear();
            self.at = 0;
        } else if self.at > 1 << 16 {
            self.buf.drain(..self.at);
            self.at = 0;
        }
        let mut chunk = [0u8; 1 << 16];
        let n = s.read(&mut chunk)?;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n > 0)
    }

    /// The next whole frame, if buffered.
    fn next(&mut self) -> io::Result<Option<(u8, &[u8])>> {
        let b = &self.buf[self.at..];
        if b.len() < 2 {
            return Ok(None);
        }
        let (mut len, mut mult, mut i) = (0usize, 1usize, 1);
        loop {
            let Some(&byte) = b.get(i) else { return Ok(None) };
            len += (byte & 0x7f) as usize * mult;
            i += 1;
            if byte & 0x80 == 0 {
                break;
            }
            mult *= 128;
            if i > 4 {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "bad remaining length"));
            }
        }
        if b.len() < i + len {
            return Ok(None);
        }
        let start = self.at;
        self.at += i + len;
        Ok(Some((self.buf[start], &self.buf[start + i..start + i + len])))
    }
}

/// Connects, sends CONNECT and waits for CONNACK 0 (and, with a filter, SUBSCRIBE and SUBACK).
fn client(addr: SocketAddr, id: &str, filter: Option<(&str, u8)>, limit: Duration) -> io::Result<TcpStream> {
    let mut s = TcpStream::connect_timeout(&addr, limit)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(limit))?;
    s.write_all(&codec::connect(id, 600, None, None))?;
    if let Some((f, qos)) = filter {
        s.write_all(&codec::subscribe(1, &[f.to_string()], qos).map_err(|e| io::Error::other(e.to_string()))?)?;
    }
    let mut frames = Frames::default();
    let mut want = if filter.is_some() { 2 } else { 1 };
    while want > 0 {
        while let Some((h, body)) = frames.next()? {
            match h >> 4 {
                2 if body.get(1) == Some(&0) => want -= 1,
                2 => return Err(io::Error::other(format!("CONNACK {:?} from {addr}", body.get(1)))),
                9 => want -= 1,
                _ => {}
            }
        }
        if want > 0 && !frames.fill(&mut s).map_err(|e| read_err(e, "CONNACK/SUBACK"))? {
            return Err(io::Error::other(format!("{addr} closed the connection")));
        }
    }
    Ok(s)
}

fn read_err(e: io::Error, what: &str) -> io::Error {
    if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) {
        timeout(what)
    } else {
        e
    }
}

fn publish_frame(qos: u8, pid: u16, sent_ns: u64, out: &mut Vec<u8>) {
    let remaining = 2 + TOPIC.len() + if qos > 0 { 2 } else { 0 } + PAYLOAD;
    out.push(if qos > 0 { 0x32 } else { 0x30 });
    let mut r = remaining;
    loop {
        let mut b = (r % 128) as u8;
        r /= 128;
        if r > 0 {
            b |= 0x80;
        }
        out.push(b);
        if r == 0 {
            break;
        }
    }
    out.extend_from_slice(&(TOPIC.len() as u16).to_be_bytes());
    out.extend_from_slice(TOPIC.as_bytes());
    if qos > 0 {
        out.extend_from_slice(&pid.to_be_bytes());
    }
    out.extend_from_slice(&sent_ns.to_le_bytes());
    out.resize(out.len() + PAYLOAD - 8, b'x');
}

/// One publisher sends `n` messages at `qos` to one subscriber; `limit` bounds every wait.
pub fn delivery(addr: SocketAddr, qos: u8, n: usize, limit: Duration) -> io::Result<Delivery> {
    let tag = std::process::id();
    let mut sub = client(addr, &format!("mam-bench-sub-{tag}"), Some((TOPIC, qos)), limit)?;
    let mut publ = client(addr, &format!("mam-bench-pub-{tag}"), None, limit)?;
    let origin = Instant::now();
    // The subscriber: acknowledges QoS 1, records each message's latency, stops after n.
    let receiver = std::thread::Builder::new().name("bench-sub".into()).spawn(move || -> io::Result<_> {
        let mut lat = Vec::with_capacity(n);
        let mut frames = Frames::default();
        let mut acks = Vec::new();
        while lat.len() < n {
            while let Some((h, body)) = frames.next()? {
                if h >> 4 != 3 {
                    continue;
                }
                let tlen = u16::from_be_bytes([body[0], body[1]]) as usize;
                let mut at = 2 + tlen;
                if (h >> 1) & 3 > 0 {
                    acks.extend_from_slice(&codec::puback(u16::from_be_bytes([body[at], body[at + 1]])));
                    at += 2;
                }
                let mut t = [0u8; 8];
                t.copy_from_slice(&body[at..at + 8]);
                let now = origin.elapsed().as_nanos() as u64;
                lat.push(now.saturating_sub(u64::from_le_bytes(t)));
            }
            if !acks.is_empty() {
                sub.write_all(&acks)?;
                acks.clear();
            }
            let got = lat.len();
            if got < n
                && !frames.fill(&mut sub).map_err(|e| read_err(e, &format!("deliveries ({got} of {n} so far)")))?
            {
                return Err(io::Error::other("the broker closed the subscriber"));
            }
        }
        let _ = sub.write_all(&codec::disconnect());
        Ok((lat, origin.elapsed()))
    })?;
    // The publisher's acknowledgements, counted on their own thread.
    let acked = Arc::new((Mutex::new(0usize), Condvar::new()));
    let acker = {
        let (acked, mut s) = (acked.clone(), publ.try_clone()?);
        std::thread::Builder::new().name("bench-ack".into()).spawn(move || -> io::Result<()> {
            let mut frames = Frames::default();
            let mut seen = 0;
            while qos > 0 && seen < n {
                while let Some((h, _)) = frames.next()? {
                    if h >> 4 == 4 {
                        seen += 1;
                    }
                }
                let (m, cv) = &*acked;
                *m.lock().unwrap_or_else(|e| e.into_inner()) = seen;
                cv.notify_all();
                if seen < n && !frames.fill(&mut s).map_err(|e| read_err(e, "PUBACK"))? {
                    return Err(io::Error::other("the broker closed the publisher"));
                }
            }
            Ok(())
        })?
    };
    let started = origin.elapsed();
    let mut out = Vec::with_capacity(128);
    let mut send = || -> io::Result<()> {
        for i in 0..n {
            if qos > 0 && i >= WINDOW {
                let (m, cv) = &*acked;
                let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
                let end = Instant::now() + limit;
                while i - *g >= WINDOW {
                    let left = end.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(timeout("PUBACK"));
                    }
                    g = cv.wait_timeout(g, left).unwrap_or_else(|e| e.into_inner()).0;
                }
            }
            out.clear();
            publish_frame(qos, (i % 65535 + 1) as u16, origin.elapsed().as_nanos() as u64, &mut out);
            publ.write_all(&out)?;
        }
        Ok(())
    };
    let sent = send();
    if sent.is_err() {
        // Unblock both readers: their sockets close.
        let _ = publ.shutdown(std::net::Shutdown::Both);
    }
    let acks = acker.join().unwrap_or_else(|_| Err(io::Error::other("the acknowledgement thread panicked")));
    let got = receiver.join().unwrap_or_else(|_| Err(io::Error::other("the subscriber thread panicked")));
    let _ = publ.write_all(&codec::disconnect());
    sent?;
    acks?;
    let (mut lat, last) = got?;
    crate::sort::natural(&mut lat);
    let pct = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)] as f64 / 1e6;
    let secs = (last - started).as_secs_f64().max(1e-9);
    Ok(Delivery { messages: n, per_s: n as f64 / secs, p50_ms: pct(0.50), p99_ms: pct(0.99) })
}

/// `n` clients connected and each subscribed to its own topic, held until dropped.
pub fn idle_clients(addr: SocketAddr, n: usize, limit: Duration) -> io::Result<Vec<TcpStream>> {
    let tag = std::process::id();
    (0..n)
        .map(|i| client(addr, &format!("mam-bench-idle-{tag}-{i}"), Some((&format!("mam-bench/idle/{i}"), 0)), limit))
        .collect()
}
