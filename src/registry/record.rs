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

    /// `parse` keeping only the fields named in `keys` (the others are skipped unparsed): what a
    /// listing over 100,000 records needs without building each whole record. Bytes that are not
    /// a record give exactly `parse`'s error.
    pub fn parse_only(bytes: &[u8], keys: &[&str]) -> Result<Record, ParseError> {
        let mut de = serde_json::Deserializer::from_slice(bytes);
        match serde::de::DeserializeSeed::deserialize(Only(keys), &mut de).and_then(|m| de.end().map(|_| m)) {
            Ok(fields) => Ok(Record { fields }),
            // The slow path only to name the problem the way `parse` does (or to accept what a
            // full parse accepts).
            Err(_) => Record::parse(bytes).map(|r| {
                let mut fields = r.fields;
                fields.retain(|k, _| keys.contains(&k.as_str()));
                Record { fields }
            }),
        }
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

/// A JSON object's members named in the list, as a `Map` in their order; the rest is skipped
/// with `IgnoredAny` (no allocation for what is not kept).
struct Only<'k>(&'k [&'k str]);

impl<'de> serde::de::DeserializeSeed<'de> for Only<'_> {
    type Value = Map<String, Value>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Only<'_> {
    type Value = Map<String, Value>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = m.next_key_seed(Key(self.0))? {
            match key {
                Some(i) => {
                    out.insert(self.0[i].to_string(), m.next_value()?);
                }
                None => {
                    m.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok(out)
    }
}

/// A member name: its index in the list, or `None` for one not kept.
struct Key<'k>(&'k [&'k str]);

impl<'de> serde::de::DeserializeSeed<'de> for Key<'_> {
    type Value = Option<usize>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Key<'_> {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a member name")
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(self.0.iter().position(|k| *k == v))
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

    #[test]
    fn parse_errors_are_named() {
        assert_eq!(Record::parse(b"[1]"), Err(ParseError::NotObject));
        assert!(matches!(Record::parse(b"{\"a\": "), Err(ParseError::NotJson(_))));
    }
}
