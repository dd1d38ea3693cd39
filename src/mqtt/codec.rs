//! MQTT 3.1.1 packets on the client side: encoding through mqttrs, and a framing decoder that
//! validates every frame from the broker before mqttrs sees it, plus the pure keepalive state.
//!
//! mqttrs 0.4.1 indexes its input without bounds checks in several places (packet ids, CONNACK,
//! SUBACK codes, a topic longer than the packet), so malformed broker input would panic it. This
//! module hands mqttrs exactly one frame whose length fits what the packet type needs, and caps the
//! remaining length, so nothing a broker sends can panic the client. No I/O, no clock reads.

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

use mqttrs::{
    decode_slice, encode_slice, Connect, ConnectReturnCode, Packet, Pid, Protocol, QoS, QosPid, Subscribe,
    SubscribeReturnCodes, SubscribeTopic,
};

/// Largest incoming frame accepted (remaining length); above that the connection is dropped.
pub const MAX_INCOMING: usize = 2 * 1024 * 1024;
/// Largest outgoing PUBLISH remaining length (the embedded broker's packet limit is 1 MiB, A12).
pub const MAX_OUTGOING: usize = 1024 * 1024;

/// A message to publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub topic: String,
    pub payload: Vec<u8>,
    /// 0 or 1.
    pub qos: u8,
    pub retain: bool,
}

impl Message {
    pub fn new(topic: impl Into<String>, payload: impl Into<Vec<u8>>, qos: u8, retain: bool) -> Message {
        Message { topic: topic.into(), payload: payload.into(), qos, retain }
    }
}

/// A PUBLISH received from the broker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Incoming {
    pub topic: String,
    pub payload: Vec<u8>,
    pub qos: u8,
    pub retain: bool,
    /// Packet id of a QoS 1 or 2 delivery.
    pub pid: Option<u16>,
}

/// A decoded frame from the broker, reduced to what the client acts on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    Connack {
        code: u8,
    },
    Publish(Incoming),
    Puback(u16),
    Pubrec(u16),
    Pubrel(u16),
    Pubcomp(u16),
    Suback {
        pid: u16,
        codes: Vec<u8>,
    },
    Unsuback(u16),
    Pingresp,
    /// A packet a broker never sends to a client (CONNECT, SUBSCRIBE, PINGREQ, ...).
    Unexpected(&'static str),
}

/// Why a broker frame was rejected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    TooLarge(usize),
    Malformed(String),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::TooLarge(n) => write!(f, "packet of {n} bytes exceeds the {MAX_INCOMING}-byte limit"),
            DecodeError::Malformed(m) => write!(f, "malformed packet ({m})"),
        }
    }
}

/// Why an outgoing message cannot be encoded (never retryable).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EncodeError {
    InvalidTopic(&'static str),
    Oversized(usize),
    BadQos(u8),
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EncodeError::InvalidTopic(why) => write!(f, "invalid topic ({why})"),
            EncodeError::Oversized(n) => write!(f, "payload too large ({n} bytes; limit {MAX_OUTGOING} per packet)"),
            EncodeError::BadQos(q) => write!(f, "unsupported QoS {q} (0 or 1)"),
        }
    }
}

/// Checks a topic name for PUBLISH: non-empty, at most 65535 bytes, no wildcards or NUL.
pub fn check_topic(topic: &str) -> Result<(), EncodeError> {
    if topic.is_empty() {
        return Err(EncodeError::InvalidTopic("empty"));
    }
    if topic.len() > 65535 {
        return Err(EncodeError::InvalidTopic("longer than 65535 bytes"));
    }
    if topic.contains(['+', '#']) {
        return Err(EncodeError::InvalidTopic("wildcard in a topic name"));
    }
    if topic.contains('\0') {
        return Err(EncodeError::InvalidTopic("NUL character"));
    }
    Ok(())
}

/// Checks a subscription filter: non-empty, `#` only as the last level, `+` only as a whole level.
pub fn check_filter(filter: &str) -> Result<(), EncodeError> {
    if filter.is_empty() {
        return Err(EncodeError::InvalidTopic("empty"));
    }
    if filter.len() > 65535 || filter.contains('\0') {
        return Err(EncodeError::InvalidTopic("too long or NUL character"));
    }
    let levels: Vec<&str> = filter.split('/').collect();
    for (i, l) in levels.iter().enumerate() {
        if l.contains('#') && (*l != "#" || i + 1 != levels.len()) {
            return Err(EncodeError::InvalidTopic("'#' must be the last level on its own"));
        }
        if l.contains('+') && *l != "+" {
            return Err(EncodeError::InvalidTopic("'+' must be a whole level"));
        }
    }
    Ok(())
}

fn encode(pkt: &Packet<'_>, size_hint: usize) -> Vec<u8> {
    let mut buf = vec![0u8; size_hint + 8];
    // The size hint always covers the packet (fixed header <= 5 bytes), so encoding cannot fail.
    let n = encode_slice(pkt, &mut buf).unwrap_or(0);
    buf.truncate(n);
    buf
}

/// CONNECT with CleanSession=1 and no Will (CORE 3.2). The password appears only here.
pub fn connect(client_id: &str, keepalive_s: u16, username: Option<&str>, password: Option<&str>) -> Vec<u8> {
    let pkt = Packet::Connect(Connect {
        protocol: Protocol::MQTT311,
        keep_alive: keepalive_s,
        client_id,
        clean_session: true,
        last_will: None,
        username,
        password: password.map(str::as_bytes),
    });
    let hint = 12 + client_id.len() + 2 + username.map_or(0, |u| u.len() + 2) + password.map_or(0, |p| p.len() + 2);
    encode(&pkt, hint)
}

/// PUBLISH for `msg` with packet id `pid` (used only for QoS 1).
pub fn publish(msg: &Message, pid: u16) -> Result<Vec<u8>, EncodeError> {
    check_topic(&msg.topic)?;
    let qospid = match msg.qos {
        0 => QosPid::AtMostOnce,
        1 => QosPid::AtLeastOnce(Pid::try_from(pid).unwrap_or_default()),
        q => return Err(EncodeError::BadQos(q)),
    };
    let remaining = 2 + msg.topic.len() + if msg.qos > 0 { 2 } else { 0 } + msg.payload.len();
    if remaining > MAX_OUTGOING {
        return Err(EncodeError::Oversized(msg.payload.len()));
    }
    let pkt = Packet::Publish(mqttrs::Publish {
        dup: false,
        qospid,
        retain: msg.retain,
        topic_name: &msg.topic,
        payload: &msg.payload,
    });
    Ok(encode(&pkt, remaining))
}

/// SUBSCRIBE for `filters` at `qos`.
pub fn subscribe(pid: u16, filters: &[String], qos: u8) -> Result<Vec<u8>, EncodeError> {
    let mut topics = Vec::new();
    let mut hint = 2;
    for f in filters {
        check_filter(f)?;
        hint += f.len() + 3;
        let qos = if qos == 0 { QoS::AtMostOnce } else { QoS::AtLeastOnce };
        topics.push(SubscribeTopic { topic_path: f.clone(), qos });
    }
    let pkt = Packet::Subscribe(Subscribe::new(Pid::try_from(pid).unwrap_or_default(), topics));
    Ok(encode(&pkt, hint))
}

pub fn puback(pid: u16) -> Vec<u8> {
    vec![0x40, 2, (pid >> 8) as u8, pid as u8]
}

pub fn pubrec(pid: u16) -> Vec<u8> {
    vec![0x50, 2, (pid >> 8) as u8, pid as u8]
}

pub fn pubcomp(pid: u16) -> Vec<u8> {
    vec![0x70, 2, (pid >> 8) as u8, pid as u8]
}

pub fn pingreq() -> Vec<u8> {
    vec![0xC0, 0]
}

pub fn disconnect() -> Vec<u8> {
    vec![0xE0, 0]
}

/// Accumulates bytes from the broker and splits them into validated frames.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
}

impl Decoder {
    pub fn new() -> Decoder {
        Decoder::default()
    }

    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// True when a partial frame is buffered.
    pub fn has_partial(&self) -> bool {
        !self.buf.is_empty()
    }

    /// The next complete frame, `Ok(None)` when more bytes are needed. The remaining length is
    /// checked against `MAX_INCOMING` before anything is buffered beyond the header.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, DecodeError> {
        let Some((header_len, remaining)) = fixed_header(&self.buf)? else {
            return Ok(None);
        };
        if remaining > MAX_INCOMING {
            return Err(DecodeError::TooLarge(remaining));
        }
        let total = header_len + remaining;
        if self.buf.len() < total {
            return Ok(None);
        }
        let frame = decode_frame(&self.buf[..total], remaining);
        self.buf.drain(..total);
        frame.map(Some)
    }
}

/// Parses the fixed header: `(header bytes, remaining length)`, `None` when incomplete.
fn fixed_header(buf: &[u8]) -> Result<Option<(usize, usize)>, DecodeError> {
    let mut len = 0usize;
    for i in 0..4 {
        let Some(&b) = buf.get(1 + i) else {
            return Ok(None);
        };
        len |= ((b & 0x7F) as usize) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(Some((2 + i, len)));
        }
    }
    Err(DecodeError::Malformed("remaining length longer than 4 bytes".into()))
}

fn malformed(what: impl Into<String>) -> DecodeError {
    DecodeError::Malformed(what.into())
}

/// Decodes one complete frame after checking the length its type requires.
fn decode_frame(frame: &[u8], remaining: usize) -> Result<Frame, DecodeError> {
    let first = frame[0];
    let body = &frame[frame.len() - remaining..];
    let kind = first >> 4;
    let need = |ok: bool, what: &str| if ok { Ok(()) } else { Err(malformed(format!("bad {what} length"))) };
    match kind {
        2 => need(remaining == 2, "CONNACK")?,
        4..=7 | 11 => need(remaining == 2, "acknowledgement")?,
        9 => need(remaining >= 3, "SUBACK")?,
        13 => need(remaining == 0, "PINGRESP")?,
        3 => {
            let qos = (first >> 1) & 3;
            let tlen = body
                .get(..2)
                .map(|b| (b[0] as usize) << 8 | b[1] as usize)
                .ok_or_else(|| malformed("short PUBLISH"))?;
            let min = 2 + tlen + if qos > 0 { 2 } else { 0 };
            need(remaining >= min, "PUBLISH")?;
        }
        1 => return Ok(Frame::Unexpected("CONNECT")),
        8 => return Ok(Frame::Unexpected("SUBSCRIBE")),
        10 => return Ok(Frame::Unexpected("UNSUBSCRIBE")),
        12 => return Ok(Frame::Unexpected("PINGREQ")),
        14 => return Ok(Frame::Unexpected("DISCONNECT")),
        _ => return Err(malformed(format!("reserved packet type {kind}"))),
    }
    // CONNACK return codes above 5 are rejected by mqttrs; keep the raw code for the message.
    if kind == 2 {
        if first & 0x0F != 0 {
            return Err(malformed("bad CONNACK flags"));
        }
        return Ok(Frame::Connack { code: body[1] });
    }
    let pkt = decode_slice(frame).map_err(|e| malformed(format!("{e:?}")))?.ok_or_else(|| malformed("incomplete"))?;
    Ok(match pkt {
        Packet::Publish(p) => Frame::Publish(Incoming {
            topic: p.topic_name.to_string(),
            payload: p.payload.to_vec(),
            qos: match p.qospid.qos() {
                QoS::AtMostOnce => 0,
                QoS::AtLeastOnce => 1,
                QoS::ExactlyOnce => 2,
            },
            retain: p.retain,
            pid: p.qospid.pid().map(Pid::get),
        }),
        Packet::Puback(p) => Frame::Puback(p.get()),
        Packet::Pubrec(p) => Frame::Pubrec(p.get()),
        Packet::Pubrel(p) => Frame::Pubrel(p.get()),
        Packet::Pubcomp(p) => Frame::Pubcomp(p.get()),
        Packet::Unsuback(p) => Frame::Unsuback(p.get()),
        Packet::Suback(s) => Frame::Suback {
            pid: s.pid.get(),
            codes: s
                .return_codes
                .iter()
                .map(|c| match c {
                    SubscribeReturnCodes::Failure => 0x80,
                    SubscribeReturnCodes::Success(QoS::AtMostOnce) => 0,
                    SubscribeReturnCodes::Success(QoS::AtLeastOnce) => 1,
                    SubscribeReturnCodes::Success(QoS::ExactlyOnce) => 2,
                })
                .collect(),
        },
        Packet::Pingresp => Frame::Pingresp,
        other => return Err(malformed(format!("unexpected {:?}", other.get_type()))),
    })
}

/// CONNACK return code meanings (MQTT 3.1.1 table 3.1).
pub fn connack_reason(code: u8) -> &'static str {
    match ConnectReturnCode::from_u8_opt(code) {
        Some(ConnectReturnCode::Accepted) => "accepted",
        Some(ConnectReturnCode::RefusedProtocolVersion) => "unacceptable protocol version",
        Some(ConnectReturnCode::RefusedIdentifierRejected) => "identifier rejected",
        Some(ConnectReturnCode::ServerUnavailable) => "server unavailable",
        Some(ConnectReturnCode::BadUsernamePassword) => "bad user name or password",
        Some(ConnectReturnCode::NotAuthorized) => "not authorized",
        None => "unknown return code",
    }
}

trait FromU8Opt: Sized {
    fn from_u8_opt(code: u8) -> Option<Self>;
}

impl FromU8Opt for ConnectReturnCode {
    fn from_u8_opt(code: u8) -> Option<Self> {
        Some(match code {
            0 => ConnectReturnCode::Accepted,
            1 => ConnectReturnCode::RefusedProtocolVersion,
            2 => ConnectReturnCode::RefusedIdentifierRejected,
            3 => ConnectReturnCode::ServerUnavailable,
            4 => ConnectReturnCode::BadUsernamePassword,
            5 => ConnectReturnCode::NotAuthorized,
            _ => return None,
        })
    }
}

/// Packet ids for QoS 1 publishes and subscribes: 1..=65535, wrapping, never 0.
#[derive(Debug, Default)]
pub struct PidGen(u16);

impl PidGen {
    pub fn next_pid(&mut self) -> u16 {
        self.0 = self.0.checked_add(1).unwrap_or(1);
        self.0
    }
}

/// What the keepalive clock asks for at `now` (CORE 3.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeepaliveAction {
    Nothing,
    SendPing,
    /// No PINGRESP within keepalive/2 of the PINGREQ: the connection is lost.
    Lost,
}

/// Keepalive bookkeeping: PINGREQ after keepalive/2 without a sent packet; a PINGRESP is due within
/// keepalive/2 of it. Pure: every method takes `now`.
#[derive(Clone, Debug)]
pub struct Keepalive {
    half: Duration,
    last_sent: Instant,
    ping_sent: Option<Instant>,
}

impl Keepalive {
    pub fn new(keepalive_s: u16, now: Instant) -> Keepalive {
        let half = (Duration::from_secs(keepalive_s.into()) / 2).max(Duration::from_millis(500));
        Keepalive { half, last_sent: now, ping_sent: None }
    }

    pub fn half(&self) -> Duration {
        self.half
    }

    pub fn on_sent(&mut self, now: Instant) {
        self.last_sent = now;
    }

    pub fn on_pingresp(&mut self) {
        self.ping_sent = None;
    }

    pub fn poll(&mut self, now: Instant) -> KeepaliveAction {
        if let Some(t) = self.ping_sent {
            return if now.duration_since(t) >= self.half { KeepaliveAction::Lost } else { KeepaliveAction::Nothing };
        }
        if now.duration_since(self.last_sent) >= self.half {
            self.ping_sent = Some(now);
            self.last_sent = now;
            return KeepaliveAction::SendPing;
        }
        KeepaliveAction::Nothing
    }

    /// When `poll` next has something to do (bounds a read wait).
    pub fn next_due(&self) -> Instant {
        match self.ping_sent {
            Some(t) => t + self.half,
            None => self.last_sent + self.half,
        }
    }
}

/// Messages queued while waiting for an acknowledgement.
pub type Inbox = VecDeque<Incoming>;

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(bytes: &[u8]) -> Vec<Result<Option<Frame>, DecodeError>> {
        let mut d = Decoder::new();
        d.push(bytes);
        let mut out = Vec::new();
        loop {
            let f = d.next_frame();
            let stop = !matches!(f, Ok(Some(_)));
            out.push(f);
            if stop {
                break;
            }
        }
        out
    }

    #[test]
    fn round_trip_publish_and_acks() {
        let msg = Message::new("mam/jobs/x", b"a\0b\nQ".to_vec(), 1, true);
        let bytes = publish(&msg, 7).unwrap();
        let mut d = Decoder::new();
        // Byte by byte: a partial frame never decodes early.
        for (i, b) in bytes.iter().enumerate() {
            d.push(&[*b]);
            let f = d.next_frame().unwrap();
            if i + 1 < bytes.len() {
                assert_eq!(f, None);
            } else {
                assert_eq!(
                    f,
                    Some(Frame::Publish(Incoming {
                        topic: "mam/jobs/x".into(),
                        payload: b"a\0b\nQ".to_vec(),
                        qos: 1,
                        retain: true,
                        pid: Some(7)
                    }))
                );
            }
        }
        assert_eq!(frames(&[0x40, 2, 0, 9])[0], Ok(Some(Frame::Puback(9))));
        assert_eq!(frames(&[0x20, 2, 0, 4])[0], Ok(Some(Frame::Connack { code: 4 })));
        assert_eq!(frames(&[0x20, 2, 0, 9])[0], Ok(Some(Frame::Connack { code: 9 })));
        assert_eq!(frames(&[0x90, 3, 0, 1, 0x80])[0], Ok(Some(Frame::Suback { pid: 1, codes: vec![0x80] })));
        assert_eq!(frames(&[0xD0, 0])[0], Ok(Some(Frame::Pingresp)));
    }

    #[test]
    fn malformed_input_is_an_error_not_a_panic() {
        let cases: &[&[u8]] = &[
            &[0x40, 1, 0],
            &[0x40, 0],
            &[0x20, 0],
            &[0x90, 2, 0, 1],
            &[0x30, 3, 0, 9, b'a'],
            &[0x32, 4, 0, 2, b'a', b'b'],
            &[0x30, 1, 0],
            &[0x36, 2, 0, 0],
            &[0x00, 0],
            &[0xF0, 0],
            &[0x40, 0xFF, 0xFF, 0xFF, 0xFF, 0x01],
            &[0x90, 3, 0, 0, 1],
            &[0x30, 4, 0, 2, 0xC3, 0x28],
        ];
        for c in cases {
            let r = frames(c);
            assert!(r.iter().any(|f| f.is_err()), "{c:?} gave {r:?}");
        }
        // A huge remaining length is refused from the header alone.
        let mut d = Decoder::new();
        d.push(&[0x30, 0xFF, 0xFF, 0xFF, 0x7F]);
        assert_eq!(d.next_frame(), Err(DecodeError::TooLarge(268_435_455)));
    }

    #[test]
    fn random_garbage_never_panics() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..200_000 {
            let mut bytes = Vec::new();
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            // A random first byte and a small, usually consistent, remaining length.
            let n = (seed % 10) as usize;
            bytes.push((seed >> 8) as u8);
            bytes.push(if seed & 1 == 0 { n as u8 } else { (seed >> 16) as u8 % 12 });
            for i in 0..n {
                bytes.push((seed >> (i * 5 + 3)) as u8);
            }
            let _ = frames(&bytes);
        }
    }

    #[test]
    fn topics_and_sizes() {
        assert!(publish(&Message::new("a/+", "x", 0, false), 1).is_err());
        assert!(publish(&Message::new("", "x", 0, false), 1).is_err());
        assert!(matches!(
            publish(&Message::new("a", vec![0u8; MAX_OUTGOING], 0, false), 1),
            Err(EncodeError::Oversized(_))
        ));
        assert!(check_filter("a/#").is_ok() && check_filter("a/+/b").is_ok());
        assert!(check_filter("a/#/b").is_err() && check_filter("a+").is_err());
    }

    #[test]
    fn connect_carries_credentials_only_inside() {
        let c = connect("mam-pub-1-abcdef", 60, Some("u"), Some("pw"));
        assert_eq!(c[0], 0x10);
        assert!(c.windows(2).any(|w| w == b"pw"));
    }

    #[test]
    fn keepalive_schedule() {
        let t0 = Instant::now();
        let mut k = Keepalive::new(2, t0);
        assert_eq!(k.poll(t0 + Duration::from_millis(900)), KeepaliveAction::Nothing);
        assert_eq!(k.poll(t0 + Duration::from_millis(1000)), KeepaliveAction::SendPing);
        assert_eq!(k.poll(t0 + Duration::from_millis(1500)), KeepaliveAction::Nothing);
        k.on_pingresp();
        assert_eq!(k.poll(t0 + Duration::from_millis(1900)), KeepaliveAction::Nothing);
        assert_eq!(k.poll(t0 + Duration::from_millis(2000)), KeepaliveAction::SendPing);
        assert_eq!(k.poll(t0 + Duration::from_millis(3000)), KeepaliveAction::Lost);
        let mut k = Keepalive::new(60, t0);
        k.on_sent(t0 + Duration::from_secs(29));
        assert_eq!(k.poll(t0 + Duration::from_secs(30)), KeepaliveAction::Nothing);
        assert_eq!(k.next_due(), t0 + Duration::from_secs(59));
    }

    #[test]
    fn pids_wrap_and_skip_zero() {
        let mut p = PidGen(65534);
        assert_eq!((p.next_pid(), p.next_pid(), p.next_pid()), (65535, 1, 2));
    }
}
