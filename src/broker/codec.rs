//! The broker's MQTT 3.1.1 wire format: the fixed header (read before any allocation), a total,
//! bounds-checked decoder for the packets a client may send, and encoders for the packets the
//! broker sends.
//!
//! Decoding never panics and never allocates more than the packet it was given: every length is
//! checked against the bytes present. mqttrs 0.4's decoder indexes past the end of short packets
//! (a panic, and with the release profile's panic=abort, a dead broker), so inbound packets do not
//! go through it; the unit tests below check this decoder against mqttrs's encoder instead.

use std::fmt;

/// The largest remaining length the four-byte varint can express.
pub const MAX_REMAINING: usize = 268_435_455;

/// Why a packet could not be decoded; the text names the packet and the defect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError(pub &'static str);

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// The fixed header at the start of `buf`: `Ok(Some((remaining_length, header_len)))`, `Ok(None)`
/// when more bytes are needed, an error for a length longer than four bytes.
pub fn fixed_header(buf: &[u8]) -> Result<Option<(usize, usize)>, DecodeError> {
    let mut len = 0usize;
    for i in 0..4 {
        let Some(&b) = buf.get(1 + i) else {
            return Ok(None);
        };
        len |= ((b & 0x7f) as usize) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(Some((len, 2 + i)));
        }
    }
    Err(DecodeError("malformed remaining length"))
}

/// The will message of a CONNECT (MQTT 3.1.1 3.1.2.5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Will<'a> {
    pub topic: &'a str,
    pub payload: &'a [u8],
    pub qos: u8,
    pub retain: bool,
}

/// A CONNECT at protocol level 4 (`MQTT`, 3.1.1) or 3 (`MQIsdp`, 3.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connect<'a> {
    /// 4 for MQTT 3.1.1, 3 for MQTT 3.1.
    pub level: u8,
    pub keep_alive: u16,
    pub client_id: &'a str,
    pub clean_session: bool,
    pub will: Option<Will<'a>>,
    pub username: Option<&'a str>,
    pub password: Option<&'a [u8]>,
}

/// A PUBLISH (QoS 0..=2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publish<'a> {
    pub topic: &'a str,
    pub qos: u8,
    pub pid: u16,
    pub retain: bool,
    pub dup: bool,
    pub payload: &'a [u8],
}

/// One decoded client-to-broker packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet<'a> {
    Connect(Connect<'a>),
    /// CONNECT naming `MQTT` at a level other than 4, or `MQIsdp` at one other than 3 (as
    /// mosquitto); the rest is not parsed.
    UnsupportedLevel(u8),
    Publish(Publish<'a>),
    Puback(u16),
    Pubrec(u16),
    Pubrel(u16),
    Pubcomp(u16),
    Subscribe {
        pid: u16,
        filters: Vec<(&'a str, u8)>,
    },
    Unsubscribe {
        pid: u16,
        filters: Vec<&'a str>,
    },
    Pingreq,
    Disconnect,
    /// A packet only a server sends (CONNACK, SUBACK, UNSUBACK, PINGRESP).
    ServerOnly(&'static str),
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Cursor<'a> {
    fn u8(&mut self) -> Result<u8, DecodeError> {
        let b = *self.buf.get(self.pos).ok_or(DecodeError(self.what))?;
        self.pos += 1;
        Ok(b)
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from(self.u8()?) << 8 | u16::from(self.u8()?))
    }
    fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = self.u16()? as usize;
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len()).ok_or(DecodeError(self.what))?;
        let b = &self.buf[self.pos..end];
        self.pos = end;
        Ok(b)
    }
    fn str(&mut self) -> Result<&'a str, DecodeError> {
        std::str::from_utf8(self.bytes()?).map_err(|_| DecodeError(self.what))
    }
    fn pid(&mut self) -> Result<u16, DecodeError> {
        match self.u16()? {
            0 => Err(DecodeError(self.what)),
            p => Ok(p),
        }
    }
    fn rest(&mut self) -> &'a [u8] {
        let r = &self.buf[self.pos.min(self.buf.len())..];
        self.pos = self.buf.len();
        r
    }
    fn at_end(&self) -> bool {
        self.pos >= self.buf.len()
    }
    fn end(&self) -> Result<(), DecodeError> {
        if self.at_end() {
            Ok(())
        } else {
            Err(DecodeError(self.what))
        }
    }
}

/// Decodes exactly one complete packet (`frame` is the fixed header plus the remaining length
/// that `fixed_header` announced).
pub fn decode(frame: &[u8]) -> Result<Packet<'_>, DecodeError> {
    let (remaining, hlen) = fixed_header(frame)?.ok_or(DecodeError("truncated packet"))?;
    if frame.len() != hlen + remaining {
        return Err(DecodeError("remaining length does not match the packet"));
    }
    let first = frame[0];
    let (kind, flags) = (first >> 4, first & 0x0f);
    let body = &frame[hlen..];
    let fixed_flags = |want: u8, what: &'static str| if flags == want { Ok(()) } else { Err(DecodeError(what)) };
    let mut c = Cursor { buf: body, pos: 0, what: "malformed packet" };
    match kind {
        1 => {
            fixed_flags(0, "malformed CONNECT: reserved flags set")?;
            c.what = "malformed CONNECT";
            decode_connect(&mut c)
        }
        3 => {
            c.what = "malformed PUBLISH";
            let qos = (flags >> 1) & 3;
            if qos == 3 {
                return Err(DecodeError("malformed PUBLISH: QoS 3"));
            }
            let dup = flags & 8 != 0;
            if dup && qos == 0 {
                // MQTT-3.3.1-2: DUP must be 0 for QoS 0.
                return Err(DecodeError("malformed PUBLISH: DUP set at QoS 0"));
            }
            let topic = c.str()?;
            let pid = if qos > 0 { c.pid()? } else { 0 };
            let payload = c.rest();
            Ok(Packet::Publish(Publish { topic, qos, pid, retain: flags & 1 == 1, dup, payload }))
        }
        4..=7 => {
            // MQTT-3.6.1-1: PUBREL's flags are 0010; the others' are 0.
            let want = if kind == 6 { 2 } else { 0 };
            if flags != want || body.len() != 2 {
                return Err(DecodeError("malformed acknowledgement packet"));
            }
            c.what = "malformed acknowledgement packet";
            let pid = c.pid()?;
            Ok(match kind {
                4 => Packet::Puback(pid),
                5 => Packet::Pubrec(pid),
                6 => Packet::Pubrel(pid),
                _ => Packet::Pubcomp(pid),
            })
        }
        8 => {
            fixed_flags(2, "malformed SUBSCRIBE: reserved flags")?;
            c.what = "malformed SUBSCRIBE";
            let pid = c.pid()?;
            let mut filters = Vec::new();
            while !c.at_end() {
                let f = c.str()?;
                let q = c.u8()?;
                if q > 2 {
                    return Err(DecodeError("malformed SUBSCRIBE: requested QoS above 2"));
                }
                filters.push((f, q));
            }
            if filters.is_empty() {
                return Err(DecodeError("malformed SUBSCRIBE: no filters"));
            }
            Ok(Packet::Subscribe { pid, filters })
        }
        10 => {
            fixed_flags(2, "malformed UNSUBSCRIBE: reserved flags")?;
            c.what = "malformed UNSUBSCRIBE";
            let pid = c.pid()?;
            let mut filters = Vec::new();
            while !c.at_end() {
                filters.push(c.str()?);
            }
            if filters.is_empty() {
                return Err(DecodeError("malformed UNSUBSCRIBE: no filters"));
            }
            Ok(Packet::Unsubscribe { pid, filters })
        }
        12 | 14 => {
            if flags != 0 || !body.is_empty() {
                return Err(DecodeError("malformed PINGREQ or DISCONNECT"));
            }
            Ok(if kind == 12 { Packet::Pingreq } else { Packet::Disconnect })
        }
        2 => Ok(Packet::ServerOnly("CONNACK")),
        9 => Ok(Packet::ServerOnly("SUBACK")),
        11 => Ok(Packet::ServerOnly("UNSUBACK")),
        13 => Ok(Packet::ServerOnly("PINGRESP")),
        _ => Err(DecodeError("reserved packet type")),
    }
}

fn decode_connect<'a>(c: &mut Cursor<'a>) -> Result<Packet<'a>, DecodeError> {
    let name = c.bytes()?;
    if name != b"MQTT" && name != b"MQIsdp" {
        return Err(DecodeError("malformed CONNECT: unknown protocol name"));
    }
    let level = c.u8()?;
    // MQTT 3.1 (`MQIsdp`, level 3) has the same CONNECT layout as 3.1.1; mosquitto accepts both.
    let v31 = name == b"MQIsdp";
    if level != if v31 { 3 } else { 4 } {
        return Ok(Packet::UnsupportedLevel(level));
    }
    let flags = c.u8()?;
    // MQTT-3.1.2-3 is 3.1.1's: 3.1 did not reserve the bit (mosquitto checks it for 3.1.1 only).
    if flags & 1 != 0 && !v31 {
        return Err(DecodeError("malformed CONNECT: reserved flag set"));
    }
    let has_will = flags & 0x04 != 0;
    let will_qos = (flags >> 3) & 3;
    let will_retain = flags & 0x20 != 0;
    // MQTT-3.1.2-13, -14, -15: will QoS 3 is malformed; without a will, QoS and retain are 0.
    if will_qos == 3 || (!has_will && (will_qos != 0 || will_retain)) {
        return Err(DecodeError("malformed CONNECT: will flags"));
    }
    let keep_alive = c.u16()?;
    let client_id = c.str()?;
    let will = if has_will {
        let topic = c.str()?;
        let payload = c.bytes()?;
        Some(Will { topic, payload, qos: will_qos, retain: will_retain })
    } else {
        None
    };
    let username = if flags & 0x80 != 0 { Some(c.str()?) } else { None };
    let password = if flags & 0x40 != 0 { Some(c.bytes()?) } else { None };
    c.end()?;
    Ok(Packet::Connect(Connect {
        level,
        keep_alive,
        client_id,
        clean_session: flags & 0x02 != 0,
        will,
        username,
        password,
    }))
}

fn push_remaining(out: &mut Vec<u8>, mut n: usize) {
    loop {
        let mut b = (n % 128) as u8;
        n /= 128;
        if n > 0 {
            b |= 0x80;
        }
        out.push(b);
        if n == 0 {
            break;
        }
    }
}

/// CONNACK with return code `code`; session-present only with code 0 (MQTT-3.2.2-4).
pub fn connack(session_present: bool, code: u8) -> Vec<u8> {
    vec![0x20, 2, u8::from(session_present && code == 0), code]
}

fn ack(first: u8, pid: u16) -> Vec<u8> {
    let p = pid.to_be_bytes();
    vec![first, 2, p[0], p[1]]
}

/// PUBACK for `pid`.
pub fn puback(pid: u16) -> Vec<u8> {
    ack(0x40, pid)
}

/// PUBREC for `pid`.
pub fn pubrec(pid: u16) -> Vec<u8> {
    ack(0x50, pid)
}

/// PUBREL for `pid` (fixed header flags 0010: MQTT-3.6.1-1).
pub fn pubrel(pid: u16) -> Vec<u8> {
    ack(0x62, pid)
}

/// PUBCOMP for `pid`.
pub fn pubcomp(pid: u16) -> Vec<u8> {
    ack(0x70, pid)
}

/// UNSUBACK for `pid`.
pub fn unsuback(pid: u16) -> Vec<u8> {
    let p = pid.to_be_bytes();
    vec![0xb0, 2, p[0], p[1]]
}

/// PINGRESP.
pub fn pingresp() -> Vec<u8> {
    vec![0xd0, 0]
}

/// SUBACK for `pid` with one return code per filter (0, 1, 2 or 0x80).
pub fn suback(pid: u16, codes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(codes.len() + 6);
    out.push(0x90);
    push_remaining(&mut out, 2 + codes.len());
    out.extend_from_slice(&pid.to_be_bytes());
    out.extend_from_slice(codes);
    out
}

/// PUBLISH; `pid` is used only when `qos` > 0, `dup` only then too (MQTT-3.3.1-2). Topic length
/// fits u16 because it came off the wire.
pub fn publish(topic: &str, payload: &[u8], qos: u8, pid: u16, retain: bool, dup: bool) -> Vec<u8> {
    let remaining = 2 + topic.len() + if qos > 0 { 2 } else { 0 } + payload.len();
    let mut out = Vec::with_capacity(remaining + 5);
    out.push(0x30 | (u8::from(dup && qos > 0) << 3) | (qos << 1) | u8::from(retain));
    push_remaining(&mut out, remaining);
    out.extend_from_slice(&(topic.len() as u16).to_be_bytes());
    out.extend_from_slice(topic.as_bytes());
    if qos > 0 {
        out.extend_from_slice(&pid.to_be_bytes());
    }
    out.extend_from_slice(payload);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(p: &mqttrs::Packet) -> Vec<u8> {
        let mut buf = vec![0u8; 4096];
        let n = mqttrs::encode_slice(p, &mut buf).unwrap();
        buf.truncate(n);
        buf
    }

    #[test]
    fn header_lengths() {
        assert_eq!(fixed_header(&[0x30]), Ok(None));
        assert_eq!(fixed_header(&[0x30, 0]), Ok(Some((0, 2))));
        assert_eq!(fixed_header(&[0x30, 0x80, 0x01]), Ok(Some((128, 3))));
        assert_eq!(fixed_header(&[0x30, 0xff, 0xff, 0xff, 0x7f]), Ok(Some((MAX_REMAINING, 5))));
        assert!(fixed_header(&[0x30, 0xff, 0xff, 0xff, 0xff, 0x01]).is_err());
        let mut v = Vec::new();
        push_remaining(&mut v, 2_000_000);
        assert_eq!(fixed_header(&[&[0x30][..], &v].concat()), Ok(Some((2_000_000, 1 + v.len()))));
    }

    #[test]
    fn decodes_what_mqttrs_encodes() {
        let connect = mqttrs::Packet::Connect(mqttrs::Connect {
            protocol: mqttrs::Protocol::MQTT311,
            keep_alive: 30,
            client_id: "c1",
            clean_session: true,
            last_will: None,
            username: Some("u"),
            password: Some(b"p"),
        });
        assert_eq!(
            decode(&enc(&connect)),
            Ok(Packet::Connect(Connect {
                level: 4,
                keep_alive: 30,
                client_id: "c1",
                clean_session: true,
                will: None,
                username: Some("u"),
                password: Some(b"p"),
            }))
        );
        let pid = mqttrs::Pid::try_from(7).unwrap();
        let publish = mqttrs::Packet::Publish(mqttrs::Publish {
            dup: false,
            qospid: mqttrs::QosPid::AtLeastOnce(pid),
            retain: true,
            topic_name: "a/b",
            payload: b"hi",
        });
        assert_eq!(
            decode(&enc(&publish)),
            Ok(Packet::Publish(Publish { topic: "a/b", qos: 1, pid: 7, retain: true, dup: false, payload: b"hi" }))
        );
        let sub = mqttrs::Packet::Subscribe(mqttrs::Subscribe::new(
            pid,
            vec![
                mqttrs::SubscribeTopic { topic_path: "a/#".into(), qos: mqttrs::QoS::ExactlyOnce },
                mqttrs::SubscribeTopic { topic_path: "+".into(), qos: mqttrs::QoS::AtMostOnce },
            ],
        ));
        assert_eq!(decode(&enc(&sub)), Ok(Packet::Subscribe { pid: 7, filters: vec![("a/#", 2), ("+", 0)] }));
        let unsub = mqttrs::Packet::Unsubscribe(mqttrs::Unsubscribe::new(pid, vec!["x".into()]));
        assert_eq!(decode(&enc(&unsub)), Ok(Packet::Unsubscribe { pid: 7, filters: vec!["x"] }));
        assert_eq!(decode(&enc(&mqttrs::Packet::Pingreq)), Ok(Packet::Pingreq));
        assert_eq!(decode(&enc(&mqttrs::Packet::Disconnect)), Ok(Packet::Disconnect));
        assert_eq!(decode(&enc(&mqttrs::Packet::Puback(pid))), Ok(Packet::Puback(7)));
        assert_eq!(decode(&enc(&mqttrs::Packet::Pubrel(pid))), Ok(Packet::Pubrel(7)));
        assert_eq!(decode(&enc(&mqttrs::Packet::Pubrec(pid))), Ok(Packet::Pubrec(7)));
        assert_eq!(decode(&enc(&mqttrs::Packet::Pubcomp(pid))), Ok(Packet::Pubcomp(7)));
        let with_will = mqttrs::Packet::Connect(mqttrs::Connect {
            protocol: mqttrs::Protocol::MQTT311,
            keep_alive: 5,
            client_id: "w",
            clean_session: false,
            last_will: Some(mqttrs::LastWill {
                topic: "w/t",
                message: b"bye",
                qos: mqttrs::QoS::ExactlyOnce,
                retain: true,
            }),
            username: None,
            password: None,
        });
        match decode(&enc(&with_will)) {
            Ok(Packet::Connect(c)) => {
                assert_eq!(c.will, Some(Will { topic: "w/t", payload: b"bye", qos: 2, retain: true }));
                assert!(!c.clean_session);
            }
            other => panic!("{other:?}"),
        }
        let dup = mqttrs::Packet::Publish(mqttrs::Publish {
            dup: true,
            qospid: mqttrs::QosPid::ExactlyOnce(pid),
            retain: false,
            topic_name: "d",
            payload: b"",
        });
        assert!(matches!(decode(&enc(&dup)), Ok(Packet::Publish(Publish { dup: true, qos: 2, pid: 7, .. }))));
    }

    #[test]
    fn mqttrs_decodes_what_we_encode() {
        let p = publish("t/x", b"payload", 2, 9, true, true);
        match mqttrs::decode_slice(&p).unwrap().unwrap() {
            mqttrs::Packet::Publish(m) => assert!(m.dup && m.qospid.qos() == mqttrs::QoS::ExactlyOnce),
            other => panic!("{other:?}"),
        }
        for (bytes, want) in [(pubrec(3), "Pubrec"), (pubrel(3), "Pubrel"), (pubcomp(3), "Pubcomp")] {
            let got = format!("{:?}", mqttrs::decode_slice(&bytes).unwrap().unwrap());
            assert!(got.starts_with(want), "{got}");
        }
        assert_eq!(connack(true, 0), vec![0x20, 2, 1, 0]);
        assert_eq!(connack(true, 2), vec![0x20, 2, 0, 2], "session present is 0 with a refusal");
        let p = publish("t/x", b"payload", 1, 9, true, false);
        match mqttrs::decode_slice(&p).unwrap().unwrap() {
            mqttrs::Packet::Publish(m) => {
                assert_eq!((m.topic_name, m.payload, m.retain), ("t/x", &b"payload"[..], true));
                assert_eq!(m.qospid.pid().unwrap().get(), 9);
            }
            other => panic!("{other:?}"),
        }
        let big = vec![7u8; 300_000];
        let p = publish("t", &big, 0, 0, false, false);
        match mqttrs::decode_slice(&p).unwrap().unwrap() {
            mqttrs::Packet::Publish(m) => assert_eq!(m.payload.len(), 300_000),
            other => panic!("{other:?}"),
        }
        match mqttrs::decode_slice(&suback(3, &[0, 1, 0x80])).unwrap().unwrap() {
            mqttrs::Packet::Suback(s) => assert_eq!(s.return_codes.len(), 3),
            other => panic!("{other:?}"),
        }
        assert!(matches!(mqttrs::decode_slice(&connack(false, 4)).unwrap().unwrap(), mqttrs::Packet::Connack(_)));
        assert!(matches!(mqttrs::decode_slice(&unsuback(2)).unwrap().unwrap(), mqttrs::Packet::Unsuback(_)));
        assert!(matches!(mqttrs::decode_slice(&pingresp()).unwrap().unwrap(), mqttrs::Packet::Pingresp));
    }

    #[test]
    fn connect_levels_and_flags() {
        let mut level5 = vec![0x10, 10, 0, 4, b'M', b'Q', b'T', b'T', 5, 2, 0, 60];
        assert_eq!(decode(&level5), Ok(Packet::UnsupportedLevel(5)));
        level5[8] = 3;
        assert_eq!(decode(&level5), Ok(Packet::UnsupportedLevel(3)));
        let mut mqisdp = vec![0x10, 14, 0, 6, b'M', b'Q', b'I', b's', b'd', b'p', 3, 2, 0, 60, 0, 0];
        assert!(matches!(decode(&mqisdp), Ok(Packet::Connect(Connect { level: 3, .. }))), "MQTT 3.1 is accepted");
        mqisdp[10] = 4;
        assert_eq!(decode(&mqisdp), Ok(Packet::UnsupportedLevel(4)), "MQIsdp goes with level 3 only");
        let bad_name = [0x10, 10, 0, 4, b'M', b'Q', b'T', b'X', 4, 2, 0, 60];
        assert!(decode(&bad_name).is_err());
        // Level 4, reserved flag bit set.
        let reserved = [0x10, 12, 0, 4, b'M', b'Q', b'T', b'T', 4, 3, 0, 60, 0, 0];
        assert!(decode(&reserved).is_err());
        // Trailing bytes after the client id.
        let trailing = [0x10, 13, 0, 4, b'M', b'Q', b'T', b'T', 4, 2, 0, 60, 0, 0, 9];
        assert!(decode(&trailing).is_err());
    }

    #[test]
    fn malformed_packets_are_errors() {
        for bad in [
            &[0x30, 2, 0, 5][..],            // topic longer than the packet
            &[0x32, 3, 0, 1, b'a'],          // QoS 1 without packet id
            &[0x36, 5, 0, 1, b'a', 0, 1],    // QoS 3
            &[0x82, 2, 0, 1],                // SUBSCRIBE without filters
            &[0x80, 6, 0, 1, 0, 1, b'a', 0], // SUBSCRIBE with wrong flags
            &[0x82, 6, 0, 1, 0, 1, b'a', 3], // requested QoS 3
            &[0x82, 6, 0, 0, 0, 1, b'a', 0], // packet id 0
            &[0xa2, 2, 0, 1],                // UNSUBSCRIBE without filters
            &[0x40, 3, 0, 1, 0],             // PUBACK too long
            &[0xc0, 1, 0],                   // PINGREQ with a body
            &[0xf0, 0],                      // reserved type
            &[0x00, 0],                      // reserved type
            &[0x30, 5, 0, 1, b'a'],          // shorter than announced
            &[0x30, 2, 0, 0, 1],             // longer than announced
            &[0x30, 4, 0, 2, 0xff, 0xfe],    // topic not UTF-8
            &[0x38, 3, 0, 1, b'a'],          // DUP at QoS 0
            &[0x60, 2, 0, 1],                // PUBREL with flags 0
        ] {
            assert!(decode(bad).is_err(), "{bad:?} should not decode");
        }
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..200_000 {
            let len = (next() % 40) as usize;
            let mut v: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            // Half the cases get a consistent remaining length, so the body decoders run.
            if len >= 2 && next() % 2 == 0 {
                v[1] = (len - 2) as u8;
            }
            let _ = fixed_header(&v);
            let _ = decode(&v);
        }
    }
}
