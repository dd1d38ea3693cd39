//! The wire half shared by every job publisher (CORE 6.2, 6.3 step 5, 7.5, A4, A8): the signed event
//! and state payloads and their topics, the pre-state re-check, and "send the event, then re-check
//! the record and send a freshly built state" over one connection. `mam publish`, the heartbeat
//! timer's wire thread and the operator close of A4 all go through here, with the `Settings` they
//! read from the environment.
//!
//! It never writes a record or a log file and never prints. State bytes are built anew for every
//! send (A8); event bytes are built once by the caller and reused on every attempt.

use std::fmt;
use std::time::Duration;

use serde_json::{Map, Value};

use crate::clock;
use crate::ctx::Ctx;
use crate::knob::{self, ConfigError};
use crate::mqtt::{BrokerBlock, Client, Message, MqttConfig, MqttError, RetryPolicy};
use crate::registry::is_terminal;
use crate::registry::record::Record;
use crate::registry::store::Store;
use crate::sign::{self, CanonError};
use crate::trace;

/// What a job's payloads are signed for: the identity of one attempt and its key.
#[derive(Clone)]
pub struct Job {
    pub job_id: String,
    pub attempt: u64,
    pub dispatch_token: String,
    pub agent_session: String,
    pub topic_prefix: String,
    auth_token: String,
}

impl fmt::Debug for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The auth_token is a secret (A2): never in a debug print either.
        f.debug_struct("Job")
            .field("job_id", &self.job_id)
            .field("attempt", &self.attempt)
            .field("topic_prefix", &self.topic_prefix)
            .finish_non_exhaustive()
    }
}

impl Job {
    /// The identity of the record's current attempt. Fails naming the missing field.
    pub fn from_record(rec: &Record) -> Result<Job, String> {
        let job_id = rec.str("job_id").ok_or("record has no job_id")?.to_string();
        let need = |k: &str| rec.str(k).map(str::to_string).ok_or_else(|| format!("job {job_id}: record has no {k}"));
        let attempt = rec.attempt().ok_or_else(|| format!("job {job_id}: record has no attempt"))?;
        let dispatch_token = need("dispatch_token")?;
        let auth_token = need("auth_token")?;
        if auth_token.is_empty() {
            return Err(format!("job {job_id}: record has an empty auth_token"));
        }
        let topic_prefix = match rec.str("topic_prefix") {
            Some(p) if !p.is_empty() => p.to_string(),
            _ => {
                let root = rec.get("broker").and_then(|b| b.get("topic_root")).and_then(Value::as_str).unwrap_or("mam");
                crate::mqtt::config::job_topic_prefix(root, &job_id)
            }
        };
        Ok(Job {
            agent_session: rec.str("agent_session").unwrap_or("").to_string(),
            job_id,
            attempt,
            dispatch_token,
            topic_prefix,
            auth_token,
        })
    }

    pub fn events_topic(&self) -> String {
        format!("{}/events", self.topic_prefix)
    }

    pub fn state_topic(&self) -> String {
        format!("{}/state", self.topic_prefix)
    }

    fn base(&self, kind: &str) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("v".into(), 1.into());
        m.insert("kind".into(), kind.into());
        m.insert("job_id".into(), self.job_id.clone().into());
        m.insert("attempt".into(), self.attempt.into());
        m.insert("dispatch_token".into(), self.dispatch_token.clone().into());
        m
    }

    /// The signed event payload (CORE 6.2) as canonical bytes, which are both the events.log line
    /// (plus `\n`) and the wire payload.
    pub fn event_bytes(&self, ev: &EventFields<'_>) -> Result<Vec<u8>, CanonError> {
        let mut m = self.base("event");
        m.insert("agent_session".into(), self.agent_session.clone().into());
        m.insert("event".into(), ev.event.into());
        m.insert("seq".into(), ev.seq.into());
        m.insert("ts".into(), ev.ts.into());
        m.insert("heartbeat".into(), ev.heartbeat.into());
        m.insert("message".into(), ev.message.into());
        m.insert("data".into(), Value::Object(ev.data.clone()));
        sign::canonical(&sign::signed(self.auth_token.as_bytes(), m)?)
    }

    /// The signed state payload (CORE 6.2): its `seq` is the seq of the event it follows.
    pub fn state_bytes(&self, status: &str, last_event: &str, seq: u64, ts: &str) -> Result<Vec<u8>, CanonError> {
        let mut m = self.base("state");
        m.insert("status".into(), status.into());
        m.insert("last_event".into(), last_event.into());
        m.insert("seq".into(), seq.into());
        m.insert("ts".into(), ts.into());
        sign::canonical(&sign::signed(self.auth_token.as_bytes(), m)?)
    }

    /// The event as a message: QoS 1, not retained.
    pub fn event_message(&self, bytes: &[u8]) -> Message {
        Message::new(self.events_topic(), bytes.to_vec(), 1, false)
    }

    /// A state as a message: QoS 1, retained.
    pub fn state_message(&self, bytes: Vec<u8>) -> Message {
        Message::new(self.state_topic(), bytes, 1, true)
    }
}

/// The variable part of an event payload.
#[derive(Debug, Clone)]
pub struct EventFields<'a> {
    pub event: &'a str,
    pub seq: u64,
    pub ts: &'a str,
    pub heartbeat: bool,
    pub message: &'a str,
    pub data: &'a Map<String, Value>,
}

/// The outcome of the pre-state re-check.
#[derive(Debug)]
pub enum StateCheck {
    /// A freshly signed state to send.
    Send(Message),
    /// No state: the reason for the warning (`attempt ended`, ...).
    Skip(String),
}

/// CORE 6.3 step 5 and A8: re-reads the record and builds a fresh state for `last_event`/`seq`.
///
/// - The record's attempt or token is no longer `job`'s: skip (`attempt ended`).
/// - `last_event` is non-terminal and the record is terminal or carries this attempt's barrier:
///   skip (`attempt ended`), so no `running` state can follow the terminal.
/// - Otherwise the state carries the record's status as it is now.
pub fn recheck_state(store: &Store, job: &Job, last_event: &str, seq: u64) -> StateCheck {
    let rec = match store.read(&job.job_id) {
        Ok(Some(r)) => r,
        Ok(None) => return StateCheck::Skip("record is gone".into()),
        Err(e) => return StateCheck::Skip(format!("record unreadable ({e})")),
    };
    if rec.attempt() != Some(job.attempt) || rec.str("dispatch_token") != Some(job.dispatch_token.as_str()) {
        return StateCheck::Skip("attempt ended".into());
    }
    let status = rec.status().to_string();
    // Only a non-terminal event's state can be "running after the terminal"; a terminal event's
    // and an operator close's (`closed`) state carry the terminal status itself.
    if matches!(last_event, "started" | "progress") {
        let barrier = rec.u64("barrier_attempt").is_some_and(|b| b == job.attempt);
        if is_terminal(&status) || barrier {
            return StateCheck::Skip("attempt ended".into());
        }
    }
    match job.state_bytes(&status, last_event, seq, &clock::now_ts()) {
        Ok(b) => StateCheck::Send(job.state_message(b)),
        Err(e) => StateCheck::Skip(format!("state not signable ({e})")),
    }
}

/// What one or more attempts of `send_event_then_state` achieved so far.
#[derive(Debug, Default, Clone)]
pub struct Progress {
    /// The event was acknowledged by the broker (a later attempt does not send it again).
    pub event_acked: bool,
    /// The state was acknowledged.
    pub state_sent: bool,
    /// The last re-check skipped the state, with its reason.
    pub state_skipped: Option<String>,
    /// Attempts made (connections tried).
    pub attempts: u32,
}

/// Sends `event` (unless an earlier attempt had it acknowledged), then, when `state` is given,
/// runs it (the pre-state re-check) right before sending and sends what it builds. `proceed` is
/// asked once more just before the state goes out, so a stopping timer abandons it.
pub fn send_event_then_state(
    c: &mut Client,
    event: Option<&Message>,
    progress: &mut Progress,
    state: Option<&dyn Fn() -> StateCheck>,
    proceed: &dyn Fn() -> bool,
) -> Result<(), MqttError> {
    if let Some(ev) = event {
        if !progress.event_acked {
            let t = std::time::Instant::now();
            c.publish(ev)?;
            trace::span("event", t);
            progress.event_acked = true;
        }
    }
    let Some(state) = state else {
        return Ok(());
    };
    if progress.state_sent {
        return Ok(());
    }
    let t = std::time::Instant::now();
    let check = state();
    trace::span("recheck", t);
    match check {
        StateCheck::Skip(why) => {
            progress.state_skipped = Some(why);
            Ok(())
        }
        StateCheck::Send(msg) => {
            if !proceed() {
                return Err(MqttError::Stopped);
            }
            progress.state_skipped = None;
            let t = std::time::Instant::now();
            c.publish(&msg)?;
            trace::span("state", t);
            progress.state_sent = true;
            Ok(())
        }
    }
}

/// The knobs a publish reads from the environment (after the env file).
#[derive(Debug, Clone)]
pub struct Settings {
    pub mqtt: MqttConfig,
    /// A8's `MAM_PUBLISH_BUDGET_S`: the wire budget of a non-terminal one-shot.
    pub budget: Duration,
    /// `MAM_HEARTBEAT_DRAIN_S`.
    pub drain: Duration,
    /// `MAM_ENGINE_CAS` is not the literal `0`.
    pub cas: bool,
    /// Retry waits (CORE 3.3: 1 s then 2 s).
    pub delays: Vec<Duration>,
}

impl Settings {
    pub fn from_ctx(ctx: &Ctx) -> Result<Settings, ConfigError> {
        Settings::for_registry(ctx, None)
    }

    /// `from_ctx` for a publisher of `registry`'s jobs (the broker credentials of the workspace that
    /// holds the registry are found too: `MqttConfig::from_ctx_near`).
    pub fn for_registry(ctx: &Ctx, registry: Option<&std::path::Path>) -> Result<Settings, ConfigError> {
        Ok(Settings {
            mqtt: MqttConfig::from_ctx_near(ctx, registry)?,
            budget: Duration::from_secs(knob::env_or(ctx, "MAM_PUBLISH_BUDGET_S", 1, 20)?.into()),
            drain: drain_from_ctx(ctx)?,
            cas: ctx.var("MAM_ENGINE_CAS").as_deref() != Some("0"),
            delays: RetryPolicy::standard("publish").delays,
        })
    }

    /// The connection settings for a record's broker block (CORE 3.1): the block's broker, and the
    /// password only when it is the environment's broker. Returns the warning when withheld.
    pub fn mqtt_for(&self, rec: &Record) -> (MqttConfig, Option<String>) {
        match rec.get("broker").and_then(|b| serde_json::from_value::<BrokerBlock>(b.clone()).ok()) {
            Some(block) => self.mqtt.for_block(&block),
            None => (self.mqtt.clone(), None),
        }
    }

    pub fn policy(&self, budget: Option<Duration>) -> RetryPolicy {
        RetryPolicy { delays: self.delays.clone(), budget, what: "publish" }
    }
}

/// `MAM_HEARTBEAT_DRAIN_S` (default 1; `digits` or `digits.digits`, CORE 1.6).
pub fn drain_from_ctx(ctx: &Ctx) -> Result<Duration, ConfigError> {
    match ctx.var_nonempty("MAM_HEARTBEAT_DRAIN_S") {
        None => Ok(Duration::from_secs(1)),
        Some(v) => knob::parse_decimal_ms(&v)
            .map(Duration::from_millis)
            .ok_or_else(|| ConfigError::var(ctx, "MAM_HEARTBEAT_DRAIN_S", "a duration", "seconds, e.g. 1 or 0.5")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drain_grammar() {
        let ctx = |v: &str| Ctx::with_env([("MAM_HEARTBEAT_DRAIN_S", v)], std::path::Path::new("/"));
        assert_eq!(drain_from_ctx(&ctx("0.25")).unwrap(), Duration::from_millis(250));
        assert_eq!(drain_from_ctx(&ctx("")).unwrap(), Duration::from_secs(1));
        let e = drain_from_ctx(&ctx("-1")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "MAM_HEARTBEAT_DRAIN_S: '-1' from the environment is not a duration (expected seconds, e.g. 1 or 0.5)"
        );
    }
    use serde_json::json;

    fn rec() -> Record {
        let v = json!({"job_id": "j1", "attempt": 2, "dispatch_token": "ab", "auth_token": "k".repeat(64),
                       "agent_session": "w1", "topic_prefix": "mam/jobs/j1", "status": "running"});
        Record::new(v.as_object().unwrap().clone())
    }

    #[test]
    fn payloads_are_signed_canonical_and_complete() {
        let job = Job::from_record(&rec()).unwrap();
        let data = Map::new();
        let ev = EventFields {
            event: "progress",
            seq: 7,
            ts: "2026-01-01T00:00:00.000Z",
            heartbeat: true,
            message: "é",
            data: &data,
        };
        let bytes = job.event_bytes(&ev).unwrap();
        assert!(bytes.is_ascii());
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(sign::canonical(&v).unwrap(), bytes, "wire bytes are canonical");
        assert!(sign::verify("k".repeat(64).as_bytes(), &v));
        for k in [
            "v",
            "kind",
            "job_id",
            "attempt",
            "dispatch_token",
            "agent_session",
            "event",
            "seq",
            "ts",
            "heartbeat",
            "message",
            "data",
            "sig",
        ] {
            assert!(v.get(k).is_some(), "missing {k}");
        }
        assert_eq!((v["kind"].as_str(), v["seq"].as_u64(), v["attempt"].as_u64()), (Some("event"), Some(7), Some(2)));
        let st: Value = serde_json::from_slice(&job.state_bytes("running", "progress", 7, "t").unwrap()).unwrap();
        assert_eq!(st.as_object().unwrap().len(), 10);
        assert!(sign::verify("k".repeat(64).as_bytes(), &st));
        assert!(!format!("{job:?}").contains("kkkk"));
        assert_eq!(job.state_topic(), "mam/jobs/j1/state");
    }

    #[test]
    fn topic_prefix_falls_back_to_the_broker_root() {
        let mut r = rec();
        r.fields.remove("topic_prefix");
        r.set("broker", json!({"topic_root": "t"}));
        assert_eq!(Job::from_record(&r).unwrap().events_topic(), "t/jobs/j1/events");
        r.fields.remove("auth_token");
        assert!(Job::from_record(&r).unwrap_err().contains("auth_token"));
    }
}
