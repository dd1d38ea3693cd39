//! An MQTT 3.1.1 load generator for comparing brokers on one machine (issue 17's benchmark, the
//! `mam bench` broker rows): one publisher to one subscriber on one topic at QoS 0, 1 or 2, each
//! payload carrying its send time and sequence number so the subscriber measures
//! publish-to-delivery latency and counts every distinct message; and `n` idle clients, each
//! connected and subscribed to a topic of its own, held while the caller reads the broker's
//! resident set or runs a delivery beside them.
//!
//! The publisher and the subscriber are two threads that share nothing on the hot path (no lock, no
//! channel: each owns its socket and its protocol state, and the clock origin is a copied
//! `Instant`), so neither waits for the other and the generator is not what is measured; each
//! thread's own CPU time is returned so the caller can show it. At QoS 1 and 2 the publisher keeps
//! at most `WINDOW` messages unfinished (PUBACK, or PUBREC -> PUBREL -> PUBCOMP) and writes every
//! message the window lets out in one write; at QoS 0 it writes `WINDOW` messages per write for as
//! long as the broker reads them (TCP's backpressure is its only bound). The subscriber answers
//! QoS 1 with PUBACK and QoS 2 with PUBREC, then PUBREL with PUBCOMP, in one write per read.
//! CONNECT and SUBSCRIBE come from `mqtt::codec`; PUBLISH, the four-byte acknowledgements and the
//! frame splitting are written out here so the generator costs both brokers alike, little. Every
//! read and write has a deadline. Nothing here prints.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::mqtt::codec;
use crate::sys;

/// What one delivery run measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Delivery {
    pub qos: u8,
    pub sent: usize,
    /// Distinct messages the subscriber received (a duplicate is counted once).
    pub received: usize,
    /// Messages per second from the first send to the last delivery.
    pub per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// From the first send to the last delivery.
    pub wall: Duration,
    /// CPU time of the publisher's and of the subscriber's thread over the run.
    pub publisher_cpu: Duration,
    pub subscriber_cpu: Duration,
}

impl Delivery {
    /// The busier generator thread's CPU time as a share of one core over the run.
    pub fn busiest_thread(&self) -> f64 {
        self.publisher_cpu.max(self.subscriber_cpu).as_secs_f64() / self.wall.as_secs_f64().max(1e-9)
    }

    /// Both generator threads' CPU time, in cores over the run.
    pub fn generator_cores(&self) -> f64 {
        (self.publisher_cpu + self.subscriber_cpu).as_secs_f64() / self.wall.as_secs_f64().max(1e-9)
    }
}

/// How the publisher hands its messages to its socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writes {
    /// One write per PUBLISH, as a client library's publish call makes one (paho,
    /// `mosquitto_pub -l`): the broker gets the messages as they come.
    PerMessage,
    /// Every PUBLISH the window lets out (at QoS 0: `WINDOW`) in one write.
    Batched,
}

/// Messages the publisher may have unfinished at QoS 1 and 2, and per burst at QoS 0.
pub const WINDOW: usize = 100;
/// Payload bytes per message (the first 8 carry the send time, the next 8 the sequence number).
pub const PAYLOAD: usize = 64;
const TOPIC: &str = "mam-bench/delivery";
/// The subscriber gives up this long after the last message it read once the publisher is done:
/// what did not come by then was lost (a broker may drop QoS 0).
const QUIET: Duration = Duration::from_secs(3);

fn timeout(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, format!("timed out waiting for {what}"))
}

fn read_err(e: io::Error, what: &str) -> io::Error {
    if is_timeout(&e) {
        timeout(what)
    } else {
        e
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)
}

fn protocol(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// Splits MQTT frames out of a byte stream: `(first byte, body)`. The buffer is allocated once
/// (its pages are touched only as far as reads reach) and never cleared per read.
#[derive(Debug)]
struct Frames {
    buf: Vec<u8>,
    at: usize,
    end: usize,
}

impl Default for Frames {
    fn default() -> Frames {
        Frames { buf: vec![0; 1 << 17], at: 0, end: 0 }
    }
}

impl Frames {
    /// Reads once from `s` into the buffer; `Ok(false)` at the end of the stream.
    fn fill(&mut self, s: &mut TcpStream) -> io::Result<bool> {
        if self.at == self.end {
            (self.at, self.end) = (0, 0);
        } else if self.buf.len() - self.end < 1 << 15 {
            self.buf.copy_within(self.at..self.end, 0);
            (self.at, self.end) = (0, self.end - self.at);
        }
        if self.end == self.buf.len() {
            return Err(protocol("a frame larger than the read buffer".into()));
        }
        let n = s.read(&mut self.buf[self.end..])?;
        self.end += n;
        Ok(n > 0)
    }

    /// The next whole frame, if buffered.
    fn next(&mut self) -> io::Result<Option<(u8, &[u8])>> {
        let b = &self.buf[self.at..self.end];
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
                return Err(protocol("bad remaining length".into()));
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

/// Connects, sends CONNECT and waits for CONNACK 0 (and, with a filter, SUBSCRIBE and SUBACK with
/// the granted QoS).
fn client(addr: SocketAddr, id: &str, filter: Option<(&str, u8)>, limit: Duration) -> io::Result<TcpStream> {
    let mut s = TcpStream::connect_timeout(&addr, limit)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(limit))?;
    s.set_write_timeout(Some(limit))?;
    s.write_all(&codec::connect(id, 600, None, None))?;
    if let Some((f, qos)) = filter {
        s.write_all(&subscribe_frame(f, qos))?;
    }
    let mut frames = Frames::default();
    let mut want = if filter.is_some() { 2 } else { 1 };
    while want > 0 {
        while let Some((h, body)) = frames.next()? {
            match h >> 4 {
                2 if body.get(1) == Some(&0) => want -= 1,
                2 => return Err(io::Error::other(format!("CONNACK {:?} from {addr}", body.get(1)))),
                9 if body.get(2).copied() == filter.map(|(_, q)| q) => want -= 1,
                9 => return Err(io::Error::other(format!("SUBACK {:?} from {addr}", body.get(2)))),
                _ => {}
            }
        }
        if want > 0 && !frames.fill(&mut s).map_err(|e| read_err(e, "CONNACK/SUBACK"))? {
            return Err(io::Error::other(format!("{addr} closed the connection")));
        }
    }
    Ok(s)
}

/// SUBSCRIBE (packet id 1) to one filter at `qos` (`mqtt::codec` asks for 0 or 1 only: mam's own
/// client never subscribes at QoS 2).
fn subscribe_frame(filter: &str, qos: u8) -> Vec<u8> {
    let mut out = vec![0x82];
    push_len(2 + 2 + filter.len() + 1, &mut out);
    out.extend_from_slice(&[0, 1]);
    out.extend_from_slice(&(filter.len() as u16).to_be_bytes());
    out.extend_from_slice(filter.as_bytes());
    out.push(qos);
    out
}

/// An MQTT remaining length.
fn push_len(mut r: usize, out: &mut Vec<u8>) {
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
}

fn publish_frame(qos: u8, pid: u16, sent_ns: u64, seq: u64, out: &mut Vec<u8>) {
    let remaining = 2 + TOPIC.len() + if qos > 0 { 2 } else { 0 } + PAYLOAD;
    out.push(0x30 | (qos << 1));
    push_len(remaining, out);
    out.extend_from_slice(&(TOPIC.len() as u16).to_be_bytes());
    out.extend_from_slice(TOPIC.as_bytes());
    if qos > 0 {
        out.extend_from_slice(&pid.to_be_bytes());
    }
    out.extend_from_slice(&sent_ns.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.resize(out.len() + PAYLOAD - 16, b'x');
}

/// A four-byte acknowledgement (PUBACK 0x40, PUBREC 0x50, PUBREL 0x62, PUBCOMP 0x70).
fn ack(first: u8, pid: u16, out: &mut Vec<u8>) {
    out.extend_from_slice(&[first, 2]);
    out.extend_from_slice(&pid.to_be_bytes());
}

fn pid_of(body: &[u8]) -> io::Result<u16> {
    match body {
        [a, b, ..] => Ok(u16::from_be_bytes([*a, *b])),
        _ => Err(protocol("an acknowledgement without a packet id".into())),
    }
}

/// The packet id of message `i`: 1..=65535, none reused while in flight (`WINDOW` is far smaller).
fn pid_for(i: usize) -> u16 {
    (i % 65535 + 1) as u16
}

/// Where each packet id of the publisher stands.
const FREE: u8 = 0;
const AWAIT_ACK: u8 = 1;
const AWAIT_COMP: u8 = 2;

/// The publisher's side: sends `n` messages at `qos` within the window, answers PUBREC with PUBREL,
/// counts PUBACK/PUBCOMP. Returns when the last one is finished (at QoS 0: written), with the time
/// its first message went out, and its own CPU time.
fn publisher(mut s: TcpStream, qos: u8, n: usize, writes: Writes, origin: Instant) -> io::Result<(Duration, Duration)> {
    let cpu0 = sys::thread_cpu_time();
    let mut frames = Frames::default();
    let mut state = vec![FREE; 65536];
    let mut out = Vec::with_capacity(WINDOW * 96);
    let mut rel = Vec::with_capacity(WINDOW * 4);
    let (mut sent, mut done) = (0usize, 0usize);
    let first = origin.elapsed();
    while done < n {
        let room = if qos == 0 { WINDOW } else { WINDOW - (sent - done) };
        out.clear();
        let now = origin.elapsed().as_nanos() as u64;
        for _ in 0..room.min(n - sent) {
            let pid = pid_for(sent);
            if qos > 0 {
                state[pid as usize] = AWAIT_ACK;
            }
            if writes == Writes::PerMessage {
                out.clear();
                publish_frame(qos, pid, origin.elapsed().as_nanos() as u64, sent as u64, &mut out);
                s.write_all(&out)?;
                out.clear();
            } else {
                publish_frame(qos, pid, now, sent as u64, &mut out);
            }
            sent += 1;
        }
        if !out.is_empty() {
            s.write_all(&out)?;
        }
        if qos == 0 {
            done = sent;
            continue;
        }
        let phase = if qos == 1 { "PUBACK" } else { "PUBREC/PUBCOMP" };
        if !frames.fill(&mut s).map_err(|e| read_err(e, &format!("{phase} ({done} of {n} finished)")))? {
            return Err(io::Error::other("the broker closed the publisher"));
        }
        while let Some((h, body)) = frames.next()? {
            let kind = h >> 4;
            if !matches!(kind, 4 | 5 | 7) {
                continue;
            }
            let pid = pid_of(body)?;
            let st = &mut state[pid as usize];
            match (qos, kind, *st) {
                (1, 4, AWAIT_ACK) | (2, 7, AWAIT_COMP) => {
                    *st = FREE;
                    done += 1;
                }
                (2, 5, AWAIT_ACK) => {
                    *st = AWAIT_COMP;
                    ack(0x62, pid, &mut rel);
                }
                // A PUBREC again for one already released: PUBREL again (MQTT-4.3.3).
                (2, 5, AWAIT_COMP) => ack(0x62, pid, &mut rel),
                _ => return Err(protocol(format!("unexpected packet type {kind} for packet id {pid} at QoS {qos}"))),
            }
        }
        if !rel.is_empty() {
            s.write_all(&rel)?;
            rel.clear();
        }
    }
    Ok((first, sys::thread_cpu_time().saturating_sub(cpu0)))
}

/// What the subscriber saw.
struct Seen {
    /// Latency of each distinct message, nanoseconds.
    lat: Vec<u64>,
    /// When the last distinct message arrived (from the origin).
    last: Duration,
    cpu: Duration,
}

/// The subscriber's side: reads until `n` distinct messages came and every QoS 2 one is released,
/// or, once `published` is set, nothing came for `QUIET`.
fn subscriber(mut s: TcpStream, qos: u8, n: usize, origin: Instant, published: &AtomicBool) -> io::Result<Seen> {
    let cpu0 = sys::thread_cpu_time();
    s.set_read_timeout(Some(QUIET))?;
    let mut lat = Vec::with_capacity(n);
    let mut have = vec![false; n];
    let mut frames = Frames::default();
    let mut acks = Vec::with_capacity(WINDOW * 8);
    let mut releasing = 0usize;
    let mut last = Duration::ZERO;
    while lat.len() < n || releasing > 0 {
        while let Some((h, body)) = frames.next()? {
            match h >> 4 {
                3 => {
                    let q = (h >> 1) & 3;
                    if q != qos {
                        return Err(protocol(format!("a message delivered at QoS {q}, subscribed and sent at {qos}")));
                    }
                    let tlen = u16::from_be_bytes([body[0], body[1]]) as usize;
                    let mut at = 2 + tlen;
                    if q > 0 {
                        let pid = pid_of(&body[at..])?;
                        ack(if q == 1 { 0x40 } else { 0x50 }, pid, &mut acks);
                        releasing += usize::from(q == 2);
                        at += 2;
                    }
                    let p =
                        body.get(at..at + 16).ok_or_else(|| protocol("a PUBLISH shorter than the payload".into()))?;
                    let sent = u64::from_le_bytes(p[..8].try_into().unwrap_or_default());
                    let seq = u64::from_le_bytes(p[8..].try_into().unwrap_or_default()) as usize;
                    let now = origin.elapsed();
                    if seq < n && !have[seq] {
                        have[seq] = true;
                        lat.push((now.as_nanos() as u64).saturating_sub(sent));
                        last = now;
                    }
                }
                6 => {
                    ack(0x70, pid_of(body)?, &mut acks);
                    releasing = releasing.saturating_sub(1);
                }
                _ => {}
            }
        }
        if !acks.is_empty() {
            s.write_all(&acks)?;
            acks.clear();
        }
        if lat.len() == n && releasing == 0 {
            break;
        }
        match frames.fill(&mut s) {
            Ok(true) => {}
            Ok(false) => return Err(io::Error::other("the broker closed the subscriber")),
            Err(e) if is_timeout(&e) && published.load(Ordering::Acquire) && !lat.is_empty() => break,
            Err(e) if is_timeout(&e) && published.load(Ordering::Acquire) => {
                return Err(timeout(&format!("deliveries (none of {n} within {} s)", QUIET.as_secs())));
            }
            Err(e) if is_timeout(&e) => {}
            Err(e) => return Err(e),
        }
    }
    let _ = s.write_all(&codec::disconnect());
    Ok(Seen { lat, last, cpu: sys::thread_cpu_time().saturating_sub(cpu0) })
}

/// One publisher sends `n` messages at `qos` to one subscriber (subscribed at `qos`), written as
/// `writes` says; `limit` bounds connecting and every wait of the publisher.
pub fn delivery(addr: SocketAddr, qos: u8, n: usize, writes: Writes, limit: Duration) -> io::Result<Delivery> {
    if n == 0 || qos > 2 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "a delivery run needs messages and a QoS of 0-2"));
    }
    let tag = format!("{}-{}", std::process::id(), sys::random_hex(4)?);
    let sub = client(addr, &format!("mam-bench-sub-{tag}"), Some((TOPIC, qos)), limit)?;
    let publ = client(addr, &format!("mam-bench-pub-{tag}"), None, limit)?;
    let (sub_stop, mut pub_end) = (sub.try_clone()?, publ.try_clone()?);
    let origin = Instant::now();
    let published = Arc::new(AtomicBool::new(false));
    let receiver = {
        let published = published.clone();
        std::thread::Builder::new()
            .name("bench-sub".into())
            .spawn(move || subscriber(sub, qos, n, origin, &published))?
    };
    let sender =
        std::thread::Builder::new().name("bench-pub".into()).spawn(move || publisher(publ, qos, n, writes, origin))?;
    let sent = sender.join().unwrap_or_else(|_| Err(io::Error::other("the publisher thread panicked")));
    published.store(true, Ordering::Release);
    if sent.is_err() {
        // The subscriber would wait for what never comes.
        let _ = sub_stop.shutdown(Shutdown::Both);
    }
    let got = receiver.join().unwrap_or_else(|_| Err(io::Error::other("the subscriber thread panicked")));
    let _ = pub_end.write_all(&codec::disconnect());
    let (first, publisher_cpu) = sent?;
    let seen = got?;
    let mut lat = seen.lat;
    crate::sort::natural(&mut lat);
    let pct = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)] as f64 / 1e6;
    let wall = seen.last.saturating_sub(first).max(Duration::from_nanos(1));
    Ok(Delivery {
        qos,
        sent: n,
        received: lat.len(),
        per_s: lat.len() as f64 / wall.as_secs_f64(),
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        wall,
        publisher_cpu,
        subscriber_cpu: seen.cpu,
    })
}

/// `n` clients connected and each subscribed to its own topic, held until dropped.
pub fn idle_clients(addr: SocketAddr, n: usize, limit: Duration) -> io::Result<Vec<TcpStream>> {
    let mut v = Vec::with_capacity(n);
    add_idle_clients(addr, &mut v, n, limit)?;
    Ok(v)
}

/// Connects and subscribes idle clients until `clients` holds `n`.
pub fn add_idle_clients(addr: SocketAddr, clients: &mut Vec<TcpStream>, n: usize, limit: Duration) -> io::Result<()> {
    let tag = format!("{}-{}", std::process::id(), sys::random_hex(4)?);
    while clients.len() < n {
        let i = clients.len();
        let c = client(addr, &format!("mam-bench-idle-{tag}-{i}"), Some((&format!("mam-bench/idle/{i}"), 0)), limit)
            .map_err(|e| io::Error::new(e.kind(), format!("idle client {} of {n}: {e}", i + 1)))?;
        clients.push(c);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_a_stream_and_acks_are_four_bytes() {
        let mut out = Vec::new();
        publish_frame(2, 7, 1234, 5, &mut out);
        ack(0x62, 7, &mut out);
        let end = out.len();
        let mut f = Frames { buf: out, at: 0, end };
        let (h, body) = f.next().unwrap().unwrap();
        assert_eq!(h, 0x34);
        assert_eq!(body.len(), 2 + TOPIC.len() + 2 + PAYLOAD);
        let at = 2 + TOPIC.len();
        assert_eq!(pid_of(&body[at..]).unwrap(), 7);
        assert_eq!(u64::from_le_bytes(body[at + 2..at + 10].try_into().unwrap()), 1234);
        assert_eq!(u64::from_le_bytes(body[at + 10..at + 18].try_into().unwrap()), 5);
        let (h, body) = f.next().unwrap().unwrap();
        assert_eq!((h, body), (0x62, &[0u8, 7][..]));
        assert!(f.next().unwrap().is_none());
        let sub = subscribe_frame("a/b", 2);
        assert_eq!(sub, [0x82, 8, 0, 1, 0, 3, b'a', b'/', b'b', 2]);
        assert_eq!(pid_for(65534), 65535);
        assert_eq!(pid_for(65535), 1);
    }

    /// Through the embedded broker in this process: every message arrives once at each QoS and
    /// each write pattern (at QoS 2 the publisher's PUBREC -> PUBREL -> PUBCOMP and the
    /// subscriber's PUBREC, PUBREL -> PUBCOMP complete, or the run would time out), and idle
    /// clients stay connected beside it.
    #[test]
    fn every_message_arrives_once_at_each_qos() {
        let cfg = crate::broker::BrokerConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            record: false,
            ..Default::default()
        };
        let b = crate::broker::start(cfg).unwrap();
        let limit = Duration::from_secs(10);
        let idle = idle_clients(b.addr(), 20, limit).unwrap();
        for qos in 0..=2 {
            for writes in [Writes::PerMessage, Writes::Batched] {
                let n = 250 + 37 * qos as usize;
                let d = delivery(b.addr(), qos, n, writes, limit).unwrap();
                assert_eq!((d.qos, d.sent, d.received), (qos, n, n), "{writes:?}");
                assert!(d.p50_ms > 0.0 && d.p99_ms >= d.p50_ms && d.per_s > 0.0, "{d:?}");
                assert!(d.publisher_cpu > Duration::ZERO && d.busiest_thread() > 0.0, "{d:?}");
            }
        }
        assert_eq!(idle.len(), 20);
    }
}
