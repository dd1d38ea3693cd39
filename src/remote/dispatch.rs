//! The dispatch message (CORE 9.2; A5, A12): building the signed payload from an orchestrator's
//! record, judging a received one (CORE 9.3 step 2), and the mirror record a runner admits.
//!
//! Pure functions over explicit inputs (`now` included): no sockets, files or clocks. The secret
//! is only ever a key here; it never appears in a payload, an error or a record.

use serde_json::{json, Map, Value};

use crate::clock;
use crate::registry::record::{NewRecord, Record};
use crate::registry::remote_auth_token;
use crate::sign;

/// The largest inline brief (A12: the broker's packet limit is 1 MiB).
pub const MAX_BRIEF: usize = 768 * 1024;

/// Seconds past `ack_timeout_sec` after which a dispatch is stale (CORE 9.3).
pub const STALE_GRACE_S: u64 = 60;

/// `<prefix>/dispatch/<attempt>`: one topic per attempt, so clearing one cannot erase the next.
pub fn topic(prefix: &str, attempt: u64) -> String {
    format!("{prefix}/dispatch/{attempt}")
}

/// The signed dispatch payload for the record's current attempt (CORE 9.2, A5).
pub fn payload(rec: &Record, brief: &str, issued_at_ms: u64, secret: &[u8]) -> Result<Value, String> {
    let job_id = rec.str("job_id").ok_or("record has no job_id")?;
    let need_u = |k: &str| rec.u64(k).ok_or_else(|| format!("record of job {job_id} has no {k}"));
    let need_s = |k: &str| rec.str(k).ok_or_else(|| format!("record of job {job_id} has no {k}"));
    let opt = |k: &str| rec.get(k).cloned().unwrap_or(Value::Null);
    let v = json!({
        "v": 1,
        "kind": "dispatch",
        "job_id": job_id,
        "attempt": need_u("attempt")?,
        "dispatch_token": need_s("dispatch_token")?,
        "agent_session": need_s("agent_session")?,
        "type": rec.str("type").unwrap_or("task"),
        "iteration": rec.u64("iteration").unwrap_or(1),
        "brief": brief,
        "heartbeat_sec": need_u("heartbeat_sec")?,
        "heartbeat_misses": need_u("heartbeat_misses")?,
        "ack_timeout_sec": need_u("ack_timeout_sec")?,
        "idle_timeout_sec": need_u("idle_timeout_sec")?,
        "timeout_sec": rec.u64("timeout_sec").unwrap_or(0),
        "issued_at": clock::format_ts(issued_at_ms),
        "parent_job_id": opt("parent_job_id"),
        "orchestrator_uuid": opt("orchestrator_uuid"),
    });
    let Value::Object(m) = v else { unreachable!("json! object") };
    sign::signed(secret, m).map_err(|e| format!("cannot sign the dispatch of job {job_id}: {e}"))
}

/// An authenticated dispatch for this runner's session.
#[derive(Debug, Clone, PartialEq)]
pub struct Dispatch {
    pub job_id: String,
    pub attempt: u64,
    pub dispatch_token: String,
    pub agent_session: String,
    pub job_type: String,
    pub iteration: u64,
    pub brief: String,
    pub heartbeat_sec: u64,
    pub heartbeat_misses: u64,
    pub ack_timeout_sec: u64,
    pub idle_timeout_sec: u64,
    pub timeout_sec: u64,
    pub issued_at_ms: u64,
    pub parent_job_id: Option<String>,
    pub orchestrator_uuid: Option<String>,
    /// `<root>/jobs/<job_id>`: the topic the dispatch arrived on, minus `/dispatch/<attempt>`.
    pub topic_prefix: String,
}

/// What the runner does with one message on `<root>/jobs/+/dispatch/+` (CORE 9.3 step 2).
#[derive(Debug, Clone, PartialEq)]
pub enum Judged {
    /// An empty payload: a cleared dispatch. Ignored.
    Cleared,
    /// Not a dispatch at all, or a signed one whose fields do not fit its topic. Logged.
    Malformed(String),
    /// The signature does not verify with the secret: `dropped: bad signature`.
    BadSignature,
    /// Signed for another session: ignored (the runner serves only its own session).
    ForeignSession,
    Ok(Dispatch),
}

/// Judges one message for the runner serving `remote:<session>`.
pub fn judge(topic: &str, payload: &[u8], secret: &[u8], session: &str) -> Judged {
    if payload.is_empty() {
        return Judged::Cleared;
    }
    let Ok(v) = serde_json::from_slice::<Value>(payload) else {
        return Judged::Malformed("not JSON".into());
    };
    if v.get("v").and_then(Value::as_u64) != Some(1) || v.get("kind").and_then(Value::as_str) != Some("dispatch") {
        return Judged::Malformed("not a v1 dispatch".into());
    }
    if !sign::verify(secret, &v) {
        return Judged::BadSignature;
    }
    let agent_session = v.get("agent_session").and_then(Value::as_str).unwrap_or("");
    if agent_session.strip_prefix("remote:") != Some(session) {
        return Judged::ForeignSession;
    }
    match parse(topic, &v) {
        Ok(d) => Judged::Ok(d),
        Err(why) => Judged::Malformed(why),
    }
}

fn parse(topic: &str, v: &Value) -> Result<Dispatch, String> {
    let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string).ok_or_else(|| format!("no {k}"));
    let u = |k: &str| v.get(k).and_then(Value::as_u64).ok_or_else(|| format!("no {k}"));
    let o = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    let job_id = s("job_id")?;
    if !clock::valid_job_id(&job_id) {
        return Err("invalid job_id".into());
    }
    let attempt = u("attempt")?;
    // The id's level as issue 19 writes it ('.' as '~'), or as an older mam did.
    let level = crate::mqtt::config::job_topic_level(&job_id);
    let stripped = |l: &str| topic.strip_suffix(&format!("/jobs/{l}/dispatch/{attempt}")).map(|r| (r, l.to_string()));
    let Some((root, level)) = stripped(&level).or_else(|| stripped(&job_id)) else {
        return Err(format!("topic does not match job {job_id} attempt {attempt}"));
    };
    let issued_at = s("issued_at")?;
    let issued_at_ms = clock::parse_ts(&issued_at).ok_or("invalid issued_at")?;
    Ok(Dispatch {
        topic_prefix: format!("{root}/jobs/{level}"),
        dispatch_token: s("dispatch_token")?,
        agent_session: s("agent_session")?,
        job_type: o("type").unwrap_or_else(|| "task".into()),
        iteration: v.get("iteration").and_then(Value::as_u64).unwrap_or(1),
        brief: o("brief").unwrap_or_default(),
        heartbeat_sec: u("heartbeat_sec")?.max(1),
        heartbeat_misses: u("heartbeat_misses")?.max(1),
        ack_timeout_sec: u("ack_timeout_sec")?,
        idle_timeout_sec: u("idle_timeout_sec")?,
        timeout_sec: v.get("timeout_sec").and_then(Value::as_u64).unwrap_or(0),
        parent_job_id: o("parent_job_id"),
        orchestrator_uuid: o("orchestrator_uuid"),
        issued_at_ms,
        attempt,
        job_id,
    })
}

impl Dispatch {
    /// `issued_at` older than `ack_timeout_sec + 60` s (CORE 9.3); checked when the job is taken
    /// from the queue (A21).
    pub fn is_stale(&self, now_ms: u64) -> bool {
        now_ms > self.issued_at_ms.saturating_add((self.ack_timeout_sec + STALE_GRACE_S) * 1000)
    }

    /// The same job, attempt and token: a re-delivery of a dispatch already queued.
    pub fn same_attempt(&self, other: &Dispatch) -> bool {
        self.job_id == other.job_id && self.attempt == other.attempt && self.dispatch_token == other.dispatch_token
    }

    /// The record a runner admits (CORE 9.3 step 3, A5): the orchestrator's identity and timings,
    /// the derived auth token, the runner's broker block and paths.
    pub fn mirror_record(&self, broker: Value, registry: &std::path::Path, secret: &[u8]) -> Map<String, Value> {
        let dir = registry.join(&self.job_id);
        NewRecord {
            job_id: self.job_id.clone(),
            job_type: self.job_type.clone(),
            attempt: self.attempt,
            iteration: self.iteration,
            dispatch_token: self.dispatch_token.clone(),
            auth_token: remote_auth_token(secret, &self.job_id, self.attempt, &self.dispatch_token),
            agent_session: self.agent_session.clone(),
            transport: "remote".into(),
            heartbeat_sec: self.heartbeat_sec,
            heartbeat_misses: self.heartbeat_misses,
            ack_timeout_sec: self.ack_timeout_sec,
            idle_timeout_sec: self.idle_timeout_sec,
            idle_timeout_explicit: self.idle_timeout_sec != self.heartbeat_sec * self.heartbeat_misses,
            timeout_sec: self.timeout_sec,
            broker,
            topic_prefix: self.topic_prefix.clone(),
            brief_path: Some(dir.join("brief.md").to_string_lossy().into_owned()),
            report_path: Some(dir.join("report.md").to_string_lossy().into_owned()),
            parent_job_id: self.parent_job_id.clone(),
            orchestrator_uuid: self.orchestrator_uuid.clone(),
        }
        .fields(self.issued_at_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"s3cret";

    fn rec() -> Record {
        let v = json!({
            "job_id": "j1", "attempt": 2, "dispatch_token": "t".repeat(32), "agent_session": "remote:box",
            "type": "task", "iteration": 2, "heartbeat_sec": 1, "heartbeat_misses": 3, "ack_timeout_sec": 5,
            "idle_timeout_sec": 3, "timeout_sec": 0, "parent_job_id": "p0", "orchestrator_uuid": null
        });
        Record::new(v.as_object().unwrap().clone())
    }

    fn bytes(v: &Value) -> Vec<u8> {
        serde_json::to_vec(v).unwrap()
    }

    #[test]
    fn payload_round_trips_through_judge() {
        let now = 1_757_725_323_456;
        let p = payload(&rec(), "do it", now, SECRET).unwrap();
        assert!(p["sig"].is_string());
        assert_eq!(p["parent_job_id"], "p0");
        let topic = "mam/jobs/j1/dispatch/2";
        let Judged::Ok(d) = judge(topic, &bytes(&p), SECRET, "box") else { panic!("not admitted") };
        assert_eq!((d.job_id.as_str(), d.attempt, d.brief.as_str()), ("j1", 2, "do it"));
        assert_eq!(d.topic_prefix, "mam/jobs/j1");
        assert_eq!(d.issued_at_ms, now);
        assert!(!d.is_stale(now + 65_000));
        assert!(d.is_stale(now + 65_001));
        let m = d.mirror_record(json!({"host": "h"}), std::path::Path::new("/r"), SECRET);
        assert_eq!(m["auth_token"], remote_auth_token(SECRET, "j1", 2, &"t".repeat(32)));
        assert_eq!(m["brief_path"], "/r/j1/brief.md");
        assert_eq!(m["idle_timeout_explicit"], false);
        assert!(!serde_json::to_string(&m).unwrap().contains("s3cret"));
    }

    #[test]
    fn judge_filters() {
        let p = payload(&rec(), "", 0, SECRET).unwrap();
        let topic = "mam/jobs/j1/dispatch/2";
        assert_eq!(judge(topic, b"", SECRET, "box"), Judged::Cleared);
        assert_eq!(judge(topic, &bytes(&p), b"wrong", "box"), Judged::BadSignature);
        assert_eq!(judge(topic, &bytes(&p), SECRET, "other"), Judged::ForeignSession);
        assert!(matches!(judge("mam/jobs/j1/dispatch/3", &bytes(&p), SECRET, "box"), Judged::Malformed(_)));
        assert!(matches!(judge(topic, b"{}", SECRET, "box"), Judged::Malformed(_)));
        let mut tampered = p.clone();
        tampered["brief"] = "rm -rf".into();
        assert_eq!(judge(topic, &bytes(&tampered), SECRET, "box"), Judged::BadSignature);
    }
}
