//! The job record `<registry>/<job_id>.json` (CORE 4.1) as an ordered JSON object, so fields this
//! version does not know are kept verbatim when a record is rewritten (CORE 0.5).
//!
//! This module parses, serialises (2-space indent, trailing newline, `broker.password` removed on
//! every serialisation) and redacts for display. It does no I/O and never decides a transition.

use serde_json::{Map, Value};

/// One job record. `fields` keeps the on-disk key order; new keys are appended.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub fields: Map<String, Value>,
}

/// What a caller decides about a new record (CORE 4.1, A5); `fields` fills in everything else
/// (pending status, zeroed counters, null lifecycle timestamps). The one place the record's shape is
/// written out, for `registry register` and for a runner's mirror (CORE 9.3) alike.
#[derive(Debug, Clone)]
pub struct NewRecord {
    pub job_id: String,
    pub job_type: String,
    pub attempt: u64,
    pub iteration: u64,
    pub dispatch_token: String,
    pub auth_token: String,
    pub agent_session: String,
    pub transport: String,
    pub heartbeat_sec: u64,
    pub heartbeat_misses: u64,
    pub ack_timeout_sec: u64,
    pub idle_timeout_sec: u64,
    pub idle_timeout_explicit: bool,
    pub timeout_sec: u64,
    pub broker: Value,
    pub topic_prefix: String,
    pub brief_path: Option<String>,
    pub report_path: Option<String>,
    pub parent_job_id: Option<String>,
    pub orchestrator_uuid: Option<String>,
}

impl NewRecord {
    /// A local `task` at attempt 1 and iteration 1 with CORE 4.1's default timings (N 30, K 4, T 300,
    /// idle K×N = 120 not explicit, no wall-clock budget) and no paths, parent or orchestrator. The
    /// tokens, session and topic prefix are empty and the broker block null: the caller sets them
    /// (`NewRecord { .., ..NewRecord::local_task(id) }`). For records made outside `registry
    /// register` (the bench fixture, tests); register takes its timings from the flags and knobs.
    pub fn local_task(job_id: impl Into<String>) -> NewRecord {
        NewRecord {
            job_id: job_id.into(),
            job_type: "task".into(),
            attempt: 1,
            iteration: 1,
            dispatch_token: String::new(),
            auth_token: String::new(),
            agent_session: String::new(),
            transport: "local".into(),
            heartbeat_sec: 30,
            heartbeat_misses: 4,
            ack_timeout_sec: 300,
            idle_timeout_sec: 120,
            idle_timeout_explicit: false,
            timeout_sec: 0,
            broker: Value::Null,
            topic_prefix: String::new(),
            brief_path: None,
            report_path: None,
            parent_job_id: None,
            orchestrator_uuid: None,
        }
    }

    /// The full CORE 4.1 field set, dispatched at `dispatched_ms` (also created and updated then).
    pub fn fields(self, dispatched_ms: u64) -> Map<String, Value> {
        let ts = crate::clock::format_ts(dispatched_ms);
        let v = serde_json::json!({
            "schema": 1,
            "job_id": self.job_id,
            "type": self.job_type,
            "attempt": self.attempt,
            "iteration": self.iteration,
            "dispatch_token": self.dispatch_token,
            "auth_token": self.auth_token,
            "agent_session": self.agent_session,
            "transport": self.transport,
            "status": "pending",
            "reason": null,
            "heartbeat_sec": self.heartbeat_sec,
            "heartbeat_misses": self.heartbeat_misses,
            "ack_timeout_sec": self.ack_timeout_sec,
            "idle_timeout_sec": self.idle_timeout_sec,
            "idle_timeout_explicit": self.idle_timeout_explicit,
            "timeout_sec": self.timeout_sec,
            "deadline_at": deadline_at(dispatched_ms, self.timeout_sec),
            "broker": self.broker,
            "topic_prefix": self.topic_prefix,
            "created_at": ts,
            "updated_at": ts,
            "dispatched_at": ts,
            "claimed_at": null,
            "finished_at": null,
            "last_seq": 0,
            "last_event": null,
            "last_event_at": null,
            "heartbeat_at": null,
            "barrier_attempt": null,
            "transition_seq": 0,
            "brief_path": self.brief_path,
            "report_path": self.report_path,
            "parent_job_id": self.parent_job_id,
            "orchestrator_uuid": self.orchestrator_uuid,
        });
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }
}

/// Why bytes are not a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    NotJson(String),
    NotObject,
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParseError::NotJson(e) => write!(f, "not JSON: {e}"),
            ParseError::NotObject => f.write_str("not a JSON object"),
        }
    }
}

impl Record {
    pub fn new(fields: Map<String, Value>) -> Record {
        Record { fields }
    }

    pub fn parse(bytes: &[u8]) -> Result<Record, ParseError> {
        match serde_json::from_slice::<Value>(bytes) {
            Ok(Value::Object(fields)) => Ok(Record { fields }),
            Ok(_) => Err(ParseError::NotObject),
            Err(e) => Err(ParseError::NotJson(crate::text::one_line(&e.to_string()))),
        }
    }

    /// `parse` keeping only the fields named in `keys` (the others are skipped unparsed), as a
    /// `Record` (`Picked::parse` is the same without the map). Bytes that are not a record give
    /// exactly `parse`'s error.
    pub fn parse_only(bytes: &[u8], keys: &[&str]) -> Result<Record, ParseError> {
        let p = Picked::parse(bytes, keys)?;
        Ok(Record { fields: p.members.into_iter().map(|(i, f)| (keys[i].to_string(), f.into_value())).collect() })
    }

    /// The bytes written to disk: `broker.password` is removed whatever its value (CORE 4.1),
    /// 2-space indentation, trailing newline.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut fields = self.fields.clone();
        scrub(&mut fields);
        let mut out = serde_json::to_vec_pretty(&Value::Object(fields)).expect("a JSON map always serialises");
        out.push(b'\n');
        out
    }

    /// The record for display (`show`, `list --json`, `register --json`): `auth_token` is
    /// `"<redacted>"` (A2) and no password key is shown.
    pub fn redacted(&self) -> Value {
        let mut fields = self.fields.clone();
        scrub(&mut fields);
        if fields.contains_key("auth_token") {
            fields.insert("auth_token".into(), Value::String("<redacted>".into()));
        }
        Value::Object(fields)
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.fields.get(key)
    }

    pub fn str(&self, key: &str) -> Option<&str> {
        self.fields.get(key).and_then(Value::as_str)
    }

    pub fn u64(&self, key: &str) -> Option<u64> {
        self.fields.get(key).and_then(Value::as_u64)
    }

    pub fn set(&mut self, key: &str, v: impl Into<Value>) {
        self.fields.insert(key.to_string(), v.into());
    }

    pub fn status(&self) -> &str {
        self.str("status").unwrap_or("")
    }

    pub fn attempt(&self) -> Option<u64> {
        self.u64("attempt")
    }

    pub fn transition_seq(&self) -> u64 {
        self.u64("transition_seq").unwrap_or(0)
    }

    pub fn last_seq(&self) -> u64 {
        self.u64("last_seq").unwrap_or(0)
    }

    /// The stored `broker.password` when it is a non-empty string: the scrub-secrets selection
    /// (CORE 4.2; `null` and `""` are not secrets).
    pub fn has_stored_password(&self) -> bool {
        self.fields.get("broker").and_then(|b| b.get("password")).and_then(Value::as_str).is_some_and(|p| !p.is_empty())
    }
}

impl Fields for Record {
    fn str(&self, key: &str) -> Option<&str> {
        Record::str(self, key)
    }

    fn u64(&self, key: &str) -> Option<u64> {
        Record::u64(self, key)
    }
}

/// Reading a record's fields by name, whatever holds them: a whole `Record`, or the few members
/// of one that a listing keeps (`Picked`).
pub trait Fields {
    /// The field when it is a string.
    fn str(&self, key: &str) -> Option<&str>;

    /// The field when it is an unsigned integer that fits u64.
    fn u64(&self, key: &str) -> Option<u64>;

    fn status(&self) -> &str {
        self.str("status").unwrap_or("")
    }
}

/// The members of one record named in `keys`, in the record's order (a duplicate member: its
/// last value in the place of the first, as `Record::parse` has it): what the listings over
/// 100,000 records read. No map and no hashing; a string without an escape is borrowed from the
/// record's bytes; one allocation.
#[derive(Debug, Clone, PartialEq)]
pub struct Picked<'a> {
    keys: &'a [&'a str],
    /// (index into `keys`, value).
    members: Vec<(usize, Field<'a>)>,
}

/// One member's value in a `Picked`.
#[derive(Debug, Clone, PartialEq)]
pub enum Field<'a> {
    /// A string with no escape, as written in the record.
    Str(&'a str),
    /// Anything else, built.
    Value(Value),
}

impl Field<'_> {
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Field::Str(s) => Some(s),
            Field::Value(v) => v.as_str(),
        }
    }

    pub fn into_value(self) -> Value {
        match self {
            Field::Str(s) => Value::String(s.to_string()),
            Field::Value(v) => v,
        }
    }
}

impl<'a> Picked<'a> {
    /// `Record::parse` keeping only the members named in `keys`, the others skipped unparsed.
    /// Bytes that are not a record give exactly `Record::parse`'s error.
    pub fn parse(bytes: &'a [u8], keys: &'a [&'a str]) -> Result<Picked<'a>, ParseError> {
        if let Some(members) = scan_only(bytes, keys) {
            return Ok(Picked { keys, members });
        }
        // Whatever the scanner does not take (a `\u` escape, a malformed or deeply nested
        // document): a full parse, so the result and the error are exactly `parse`'s.
        let fields = Record::parse(bytes)?.fields;
        let members = fields
            .into_iter()
            .filter_map(|(k, v)| Some((keys.iter().position(|x| *x == k)?, Field::Value(v))))
            .collect();
        Ok(Picked { keys, members })
    }

    pub fn get(&self, key: &str) -> Option<&Field<'a>> {
        let i = self.keys.iter().position(|k| *k == key)?;
        self.members.iter().find(|(j, _)| *j == i).map(|(_, f)| f)
    }
}

impl Fields for Picked<'_> {
    fn str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Field::as_str)
    }

    fn u64(&self, key: &str) -> Option<u64> {
        match self.get(key)? {
            Field::Value(v) => v.as_u64(),
            Field::Str(_) => None,
        }
    }
}

/// `Picked::parse`'s fast path: one pass over the bytes that checks the whole document as strictly as
/// serde_json does (or more so) and builds only the kept members. Not through serde's generic
/// deserializer on purpose: that code is compiled at mam's size-optimised release level
/// (docs/DESIGN.md "Release opt-level"), where it ran the listings of 100,000 records at half
/// the speed. A kept value other than a plain string, a literal or an unsigned integer that fits
/// u64 is built by serde_json from its bytes. `None` for anything it does not take, which
/// `Picked::parse` hands to the full parse: a `\u` escape anywhere, an escape in a member name,
/// nesting deeper than 100, and every malformed document. Duplicate members: the last value, in
/// the place of the first, as `serde_json::Map` (insertion-ordered) has them. The members come
/// as (index into `keys`, value).
fn scan_only<'a>(b: &'a [u8], keys: &[&str]) -> Option<Vec<(usize, Field<'a>)>> {
    // UTF-8 checked once for the whole document (std's loop, built at full speed), not string
    // by string: everything outside the strings must be ASCII anyway.
    let mut s = Scan { b, t: std::str::from_utf8(b).ok()?, i: 0 };
    let mut out: Vec<(usize, Field<'a>)> = Vec::with_capacity(keys.len());
    s.ws();
    s.eat(b'{')?;
    s.ws();
    if s.peek() == Some(b'}') {
        s.i += 1;
    } else {
        loop {
            s.ws();
            let (key, escaped) = s.string()?;
            if escaped {
                return None;
            }
            s.ws();
            s.eat(b':')?;
            s.ws();
            let start = s.i;
            let kind = s.value(0)?;
            // The length and the first byte before the whole name: most members are not kept.
            let first = key.first();
            if let Some(k) =
                keys.iter().position(|k| k.len() == key.len() && k.as_bytes().first() == first && k.as_bytes() == key)
            {
                let v = s.kept(start, kind)?;
                match out.iter_mut().find(|(j, _)| *j == k) {
                    Some(m) => m.1 = v,
                    None => out.push((k, v)),
                }
            }
            s.ws();
            match s.peek()? {
                b',' => s.i += 1,
                b'}' => {
                    s.i += 1;
                    break;
                }
                _ => return None,
            }
        }
    }
    s.ws();
    (s.i == b.len()).then_some(out)
}

/// What `Scan::value` found.
enum Kind {
    /// A string; `true` when it has an escape.
    Str(bool),
    /// Digits only.
    Uint,
    /// null, true or false.
    Lit,
    /// A negative or fractional number, an array, an object.
    Other,
}

/// A cursor over JSON bytes for `scan_only`.
struct Scan<'a> {
    b: &'a [u8],
    /// `b`, checked to be UTF-8.
    t: &'a str,
    i: usize,
}

impl<'a> Scan<'a> {
    #[inline(always)]
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    #[inline(always)]
    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.i += 1)
    }

    #[inline(always)]
    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    /// A string at the cursor: its content as written and whether it has an escape (none of
    /// them `\u`); no control character in it.
    fn string(&mut self) -> Option<(&'a [u8], bool)> {
        self.eat(b'"')?;
        let (b, start) = (self.b, self.i);
        let mut i = start;
        let mut escaped = false;
        loop {
            match *b.get(i)? {
                b'"' => break,
                b'\\' => {
                    escaped = true;
                    i += 1;
                    if !matches!(*b.get(i)?, b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') {
                        return None;
                    }
                }
                0..=0x1f => return None,
                _ => {}
            }
            i += 1;
        }
        self.i = i + 1;
        Some((&b[start..i], escaped))
    }

    /// Digits at the cursor (at least one; no leading zero).
    fn digits(&mut self, leading_zero_ok: bool) -> Option<()> {
        let start = self.i;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.i += 1;
        }
        let n = self.i - start;
        (n > 0 && (leading_zero_ok || n == 1 || self.b[start] != b'0')).then_some(())
    }

    /// One value at the cursor, checked and passed over.
    fn value(&mut self, depth: usize) -> Option<Kind> {
        if depth > 100 {
            return None;
        }
        match self.peek()? {
            b'"' => self.string().map(|(_, e)| Kind::Str(e)),
            b'{' | b'[' => {
                let close = if self.peek()? == b'{' { b'}' } else { b']' };
                self.i += 1;
                self.ws();
                if self.peek()? == close {
                    self.i += 1;
                    return Some(Kind::Other);
                }
                loop {
                    self.ws();
                    if close == b'}' {
                        self.string()?;
                        self.ws();
                        self.eat(b':')?;
                        self.ws();
                    }
                    self.value(depth + 1)?;
                    self.ws();
                    match self.peek()? {
                        b',' => self.i += 1,
                        c if c == close => {
                            self.i += 1;
                            return Some(Kind::Other);
                        }
                        _ => return None,
                    }
                }
            }
            c @ (b't' | b'f' | b'n') => {
                let lit: &[u8] = match c {
                    b't' => b"true",
                    b'f' => b"false",
                    _ => b"null",
                };
                self.b[self.i..].starts_with(lit).then(|| self.i += lit.len())?;
                Some(Kind::Lit)
            }
            b'-' | b'0'..=b'9' => {
                let negative = self.peek()? == b'-';
                if negative {
                    self.i += 1;
                }
                self.digits(false)?;
                let mut plain = !negative;
                if self.peek() == Some(b'.') {
                    self.i += 1;
                    self.digits(true)?;
                    plain = false;
                }
                if matches!(self.peek(), Some(b'e' | b'E')) {
                    self.i += 1;
                    if matches!(self.peek(), Some(b'+' | b'-')) {
                        self.i += 1;
                    }
                    self.digits(true)?;
                    plain = false;
                }
                Some(if plain { Kind::Uint } else { Kind::Other })
            }
            _ => None,
        }
    }

    /// The value that `value` passed over from `start`: a plain string borrowed, a literal and
    /// an unsigned integer that fits u64 built here, anything else by serde_json.
    fn kept(&self, start: usize, kind: Kind) -> Option<Field<'a>> {
        let text = &self.b[start..self.i];
        let plain = match kind {
            // The content between the quotes (ASCII, so both are char boundaries).
            Kind::Str(false) => return self.t.get(start + 1..self.i - 1).map(Field::Str),
            Kind::Uint => self.t[start..self.i].parse::<u64>().ok().map(Value::from),
            Kind::Lit => Some(match text[0] {
                b't' => Value::Bool(true),
                b'f' => Value::Bool(false),
                _ => Value::Null,
            }),
            Kind::Str(true) | Kind::Other => None,
        };
        plain.or_else(|| serde_json::from_slice(text).ok()).map(Field::Value)
    }
}

fn scrub(fields: &mut Map<String, Value>) {
    if let Some(Value::Object(b)) = fields.get_mut("broker") {
        b.shift_remove("password");
    }
}

/// `deadline_at` for a wall-clock budget: `dispatched_at + timeout_sec`, or null when 0 (none).
pub fn deadline_at(dispatched_ms: u64, timeout_sec: u64) -> Value {
    if timeout_sec == 0 {
        Value::Null
    } else {
        Value::String(crate::clock::format_ts(dispatched_ms + timeout_sec * 1000))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_and_order_survive_a_rewrite() {
        let src = b"{\n  \"zeta\": 1,\n  \"job_id\": \"a\",\n  \"x_custom\": {\"k\": [1, 2]}\n}\n";
        let r = Record::parse(src).unwrap();
        let out = String::from_utf8(r.to_bytes()).unwrap();
        assert_eq!(out, "{\n  \"zeta\": 1,\n  \"job_id\": \"a\",\n  \"x_custom\": {\n    \"k\": [\n      1,\n      2\n    ]\n  }\n}\n");
    }

    #[test]
    fn r4_password_removed_whatever_its_value() {
        for pw in ["null", "\"\"", "\"x\""] {
            let src = format!("{{\"broker\": {{\"host\": \"h\", \"password\": {pw}}}}}");
            let r = Record::parse(src.as_bytes()).unwrap();
            assert_eq!(r.has_stored_password(), pw == "\"x\"");
            let out = String::from_utf8(r.to_bytes()).unwrap();
            assert!(!out.contains("password"), "{out}");
            assert!(out.contains("\"host\": \"h\""));
            assert!(!r.redacted().to_string().contains("password"));
        }
    }

    #[test]
    fn redaction_hides_auth_token() {
        let r = Record::parse(br#"{"auth_token": "abcd"}"#).unwrap();
        assert_eq!(r.redacted()["auth_token"], "<redacted>");
        assert_eq!(r.str("auth_token"), Some("abcd"));
    }

    #[test]
    fn parse_only_keeps_the_named_fields_and_parse_errors() {
        let src = br#"{"a": 1, "skip": {"deep": [1, "x\"y"]}, "b": "two", "a": 3}"#;
        let r = Record::parse_only(src, &["b", "a"]).unwrap();
        // Order and duplicates as a full parse has them (the last value wins, the first place).
        assert_eq!(r.fields, Record::parse(src).unwrap().fields.into_iter().filter(|(k, _)| k != "skip").collect());
        assert_eq!(serde_json::to_string(&r.fields).unwrap(), r#"{"a":3,"b":"two"}"#);
        for bad in [&b"[1]"[..], b"{\"a\": ", b"{} x", b"7"] {
            assert_eq!(Record::parse_only(bad, &["a"]), Record::parse(bad), "{bad:?}");
        }
    }

    /// The scanner's members as the map they stand for.
    fn scanned(bytes: &[u8], keys: &[&str]) -> Option<Map<String, Value>> {
        let members = scan_only(bytes, keys)?;
        Some(members.into_iter().map(|(i, f)| (keys[i].to_string(), f.into_value())).collect())
    }

    /// The full parse with the other members dropped: what `parse_only` must give.
    fn oracle(bytes: &[u8], keys: &[&str]) -> Option<Map<String, Value>> {
        let mut fields = Record::parse(bytes).ok()?.fields;
        fields.retain(|k, _| keys.contains(&k.as_str()));
        Some(fields)
    }

    /// The scanner takes a document only when serde_json does, and then builds the same members
    /// (values, order, duplicates); every prefix and every one-byte change of records with escapes,
    /// unicode, nesting and numbers of every shape is checked against the full parse.
    #[test]
    fn the_scanner_agrees_with_serde_json() {
        let keys = ["job_id", "status", "attempt", "n", "f", "u", "e", "x", "neg", "big", "dup", "b", "nil"];
        let docs: &[&[u8]] = &[
            br#"{"job_id":"j1","status":"running","attempt":2}"#,
            b" \t\r\n{ \"job_id\" : \"\xc3\xa9t\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x98\x80\" , \"skip\": \"\xe6\x97\xa5\" }\n ",
            br#"{"e":"a\"b\\c\/d\b\f\n\r\t","u":"\u00e9\ud83d\ude00","skip":"\u0041"}"#,
            br#"{"n":0,"f":1.5e-3,"neg":-7,"big":18446744073709551616,"x":{"deep":[1,{"a":[[]]},"s",true,null]}}"#,
            br#"{"dup":1,"b":true,"dup":"two","nil":null,"attempt":18446744073709551615,"n":-0}"#,
            br#"{"x":[],"skip":{},"f":0.0,"e":"","n":10E+2,"neg":-0.5e5}"#,
            br#"{}"#,
            br#"{"k\u0065y":1,"job_id":"a"}"#,
            br#"{"job\tid":1,"status":"s"}"#,
        ];
        let (mut checked, mut picked) = (0, 0);
        for doc in docs {
            let mut variants: Vec<Vec<u8>> = (0..doc.len()).map(|n| doc[..n].to_vec()).collect();
            for i in 0..doc.len() {
                for c in [
                    b'"', b'\\', b'{', b'}', b'[', b']', b',', b':', b'0', b'-', b'.', b'e', b'u', b'x', b' ', 0x01,
                    0xff, 0xc3,
                ] {
                    let mut v = doc.to_vec();
                    v[i] = c;
                    variants.push(v);
                }
                let mut v = doc.to_vec();
                v.remove(i);
                variants.push(v);
            }
            variants.push(doc.to_vec());
            for v in variants {
                let want = oracle(&v, &keys);
                if let Some(got) = scanned(&v, &keys) {
                    assert_eq!(Some(&got), want.as_ref(), "{}", String::from_utf8_lossy(&v));
                    // The order too (a map compares without it).
                    assert_eq!(got.keys().collect::<Vec<_>>(), want.as_ref().unwrap().keys().collect::<Vec<_>>());
                    checked += 1;
                }
                let only = Record::parse_only(&v, &keys);
                assert_eq!(only.as_ref().ok().map(|r| &r.fields), want.as_ref());
                assert_eq!(only.err(), Record::parse(&v).err());
                // What a listing reads through `Fields` is what the whole record says.
                match (Picked::parse(&v, &keys), Record::parse(&v)) {
                    (Ok(p), Ok(full)) => {
                        for k in keys.iter().chain(&["skip", "absent"]) {
                            let kept = keys.contains(k);
                            let (s, n) =
                                (Fields::str(&full, k).filter(|_| kept), Fields::u64(&full, k).filter(|_| kept));
                            assert_eq!((p.str(k), p.u64(k)), (s, n), "{k} {}", String::from_utf8_lossy(&v));
                            assert_eq!(p.get(k).cloned().map(Field::into_value), full.get(k).filter(|_| kept).cloned());
                        }
                        assert_eq!(Fields::status(&p), full.status());
                        picked += 1;
                    }
                    (p, full) => assert_eq!(p.err(), full.err(), "{}", String::from_utf8_lossy(&v)),
                }
            }
        }
        assert!(checked > 500 && picked > checked, "{checked} {picked}");
        // What the fast path takes: records as mam writes them, unicode and simple escapes.
        for doc in &docs[..2] {
            assert!(scan_only(doc, &keys).is_some());
        }
        let p = Picked::parse(docs[0], &keys).unwrap();
        assert!(matches!(p.get("status"), Some(Field::Str("running"))), "borrowed: {p:?}");
        let rec = NewRecord {
            dispatch_token: "d".into(),
            auth_token: "t".into(),
            agent_session: "w \"one\"\n".into(),
            timeout_sec: 60,
            broker: serde_json::json!({"host": "h", "port": 1883}),
            topic_prefix: "mam/jobs/j".into(),
            brief_path: Some("/b.md".into()),
            ..NewRecord::local_task("j\u{e9}")
        };
        let bytes = Record::new(rec.fields(1_800_000_000_000)).to_bytes();
        let full = Record::parse(&bytes).unwrap().fields;
        let all: Vec<&str> = full.keys().map(String::as_str).collect();
        assert_eq!(scanned(&bytes, &all).expect("a record as written takes the fast path"), full);
    }

    #[test]
    fn parse_errors_are_named() {
        assert_eq!(Record::parse(b"[1]"), Err(ParseError::NotObject));
        assert!(matches!(Record::parse(b"{\"a\": "), Err(ParseError::NotJson(_))));
    }
}
