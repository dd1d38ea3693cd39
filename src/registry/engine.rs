//! The transition engine's decision (CORE 5.2, 5.3): one pure function from (record, request, now)
//! to a decision and, when applied, the new record.
//!
//! No I/O, no clock, no randomness: `now` and fresh tokens arrive in the request, so every cell of
//! the table is unit-tested below. Locking and writing belong to `store`; this module never touches
//! a file.

use serde_json::{Map, Value};

use super::record::{self, Record};
use super::{is_terminal, remote_auth_token, status_list, valid_status};
use crate::clock::{format_ts, parse_ts};

/// Request kinds (CORE 5.3). `Scrub` is the operator's scrub-secrets rewrite (CORE 4.2), routed
/// through the engine so that the engine stays the only writer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Register,
    Claim,
    Progress,
    Beat,
    Barrier,
    Terminal,
    Set,
    Expire,
    Redispatch,
    Finalize,
    Metadata,
    Mirror,
    Scrub,
    Unknown(String),
}

impl Kind {
    pub fn parse(s: &str) -> Kind {
        match s {
            "register" => Kind::Register,
            "claim" => Kind::Claim,
            "progress" => Kind::Progress,
            "beat" => Kind::Beat,
            "barrier" => Kind::Barrier,
            "terminal" => Kind::Terminal,
            "set" => Kind::Set,
            "expire" => Kind::Expire,
            "redispatch" => Kind::Redispatch,
            "finalize" => Kind::Finalize,
            "metadata" => Kind::Metadata,
            "mirror" => Kind::Mirror,
            "scrub" => Kind::Scrub,
            other => Kind::Unknown(other.to_string()),
        }
    }

    pub fn name(&self) -> &str {
        match self {
            Kind::Register => "register",
            Kind::Claim => "claim",
            Kind::Progress => "progress",
            Kind::Beat => "beat",
            Kind::Barrier => "barrier",
            Kind::Terminal => "terminal",
            Kind::Set => "set",
            Kind::Expire => "expire",
            Kind::Redispatch => "redispatch",
            Kind::Finalize => "finalize",
            Kind::Metadata => "metadata",
            Kind::Mirror => "mirror",
            Kind::Scrub => "scrub",
            Kind::Unknown(s) => s,
        }
    }

    /// Kinds only the operator may send (CORE 4.3, pre-check 7).
    pub fn is_operator(&self) -> bool {
        matches!(
            self,
            Kind::Register
                | Kind::Set
                | Kind::Expire
                | Kind::Redispatch
                | Kind::Finalize
                | Kind::Metadata
                | Kind::Scrub
        )
    }
}

/// Who sent a request (CORE 4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Authority {
    Operator,
    Agent,
}

/// Keys a `fields` merge may never carry (pre-check 2): only the owning request sets them.
pub const RESERVED: &[&str] = &[
    "status",
    "job_id",
    "attempt",
    "iteration",
    "dispatch_token",
    "auth_token",
    "transition_seq",
    "last_seq",
    "barrier_attempt",
];

/// Fresh identity for a redispatch, made by the caller (randomness stays outside this function).
/// A remote job's auth token is derived from the secret and the new attempt (CORE 9.2).
#[derive(Clone)]
pub struct Tokens {
    pub dispatch_token: String,
    pub local_auth_token: String,
    pub dispatch_secret: Option<Vec<u8>>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Secrets never reach a log line (A2), not even a debug print.
        f.debug_struct("Tokens").field("dispatch_token", &self.dispatch_token).finish_non_exhaustive()
    }
}

/// One engine request (CORE 5.2).
#[derive(Debug, Clone)]
pub struct Request {
    pub kind: Kind,
    pub authority: Authority,
    pub job_id: String,
    pub attempt: Option<u64>,
    pub dispatch_token: Option<String>,
    pub expected_attempt: Option<u64>,
    pub target_status: Option<String>,
    pub reason: Option<String>,
    pub iteration: Option<u64>,
    pub fields: Map<String, Value>,
    pub alloc_seq: bool,
    /// `MAM_ENGINE_CAS` is not the literal `0` (the default).
    pub cas: bool,
    /// register: the initial record; mirror: the orchestrator's record of the dispatched attempt.
    pub record: Option<Map<String, Value>>,
    /// redispatch: the new attempt's tokens.
    pub tokens: Option<Tokens>,
}

impl Request {
    pub fn new(kind: Kind, authority: Authority, job_id: &str) -> Request {
        Request {
            kind,
            authority,
            job_id: job_id.to_string(),
            attempt: None,
            dispatch_token: None,
            expected_attempt: None,
            target_status: None,
            reason: None,
            iteration: None,
            fields: Map::new(),
            alloc_seq: false,
            cas: true,
            record: None,
            tokens: None,
        }
    }

    pub fn with_status(mut self, s: &str) -> Request {
        self.target_status = Some(s.to_string());
        self
    }
}

/// An applied transition: the record to write and what changed.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    pub from: Option<String>,
    pub to: String,
    pub transition_seq: u64,
    pub seq: Option<u64>,
    pub record: Record,
}

/// The engine's answer (CORE 5.2). `Invalid` and `UnknownJob` are rc 1 and write nothing.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Applied(Applied),
    Idempotent { status: String },
    Refused { reason: String },
    Invalid(String),
    UnknownJob,
}

/// What a transaction decided. The engine's other two answers (invalid, unknown job) come back from
/// `Store::apply` as `StoreError`, so they cannot be matched here.
#[derive(Debug)]
pub enum Decided {
    Applied(Applied),
    Idempotent { status: String },
    Refused { reason: String },
}

/// Pre-checks 1 and 2, which need no record and run before L1 is taken (also with
/// `MAM_ENGINE_CAS=0`). Returns the Invalid message.
pub fn precheck_static(req: &Request) -> Option<String> {
    if let Some(s) = &req.target_status {
        if !valid_status(s) {
            return Some(format!("invalid status '{}' (expected one of: {})", crate::text::one_line(s), status_list()));
        }
    }
    if let Some(k) = req.fields.keys().find(|k| RESERVED.contains(&k.as_str())) {
        return Some(format!("field '{k}' is reserved: only the request that owns it may set it"));
    }
    None
}

/// The target status a kind needs, checked after the vocabulary: terminal kinds need a terminal S.
fn target_for(req: &Request) -> Result<Option<&str>, String> {
    let needs_terminal = matches!(req.kind, Kind::Barrier | Kind::Terminal | Kind::Finalize);
    let needs_any = matches!(req.kind, Kind::Set) || needs_terminal;
    match req.target_status.as_deref() {
        None if needs_any => Err(format!("{} needs a target status", req.kind.name())),
        Some(s) if needs_terminal && !is_terminal(s) => {
            Err(format!("{} needs a terminal status, not '{s}'", req.kind.name()))
        }
        other => Ok(other),
    }
}

enum Phase {
    NonTerminal,
    Terminal,
}

fn phase(status: &str) -> Phase {
    // A status outside the vocabulary (a hand-edited or foreign record) counts as non-terminal: the
    // operator can still set or finalize it, and agents are not locked out of a live job.
    if is_terminal(status) {
        Phase::Terminal
    } else {
        Phase::NonTerminal
    }
}

/// A refusal reason in words for a person (issue 18): what happened. Every reason `decide` can give
/// has one; `None` for a reason this table does not know.
pub fn explain(reason: &str) -> Option<&'static str> {
    Some(match reason {
        "late_signal" => "the job has already finished, so this signal came too late",
        "stale_attempt" => "this signal belongs to an earlier attempt or another dispatch (attempt or token differ)",
        "cas_no_attempt" => "the job has not been dispatched yet, so there is no attempt to match",
        "cas_failed" => "the job's attempt is not the one given",
        "not_operator" => "only the operator may do this",
        "exists" => "a job with this id is already registered",
        "conflicting_terminal" => "the job has already finished with another result",
        "pending_owned_by_register" => "a pending job is set by its registration only",
        "terminal_locked" => "a finished job keeps its result",
        "deadline_not_reached" => "the job's deadline has not passed yet",
        "iteration_not_advanced" => "the iteration given is not newer than the job's",
        "barrier_raised" => "the job is being finished, so no more signals are taken for this attempt",
        "mirror_refused" => "the remote state does not fit the local record",
        "unknown_request" => "this request does not apply to a job in this state",
        _ => return None,
    })
}

fn refused(reason: &str) -> Decision {
    Decision::Refused { reason: reason.to_string() }
}

fn idempotent(rec: &Record) -> Decision {
    Decision::Idempotent { status: rec.status().to_string() }
}

/// The decision for `req` against the current `record` at `now_ms` (CORE 5.2 pre-checks in order,
/// then the 5.3 table, or the permissive merge when `req.cas` is false).
pub fn decide(record: Option<&Record>, req: &Request, now_ms: u64) -> Decision {
    if let Some(msg) = precheck_static(req) {
        return Decision::Invalid(msg);
    }
    if let Kind::Unknown(_) = req.kind {
        return refused("unknown_request");
    }
    let target = match target_for(req) {
        Ok(t) => t.map(str::to_string),
        Err(msg) => return Decision::Invalid(msg),
    };
    let Some(rec) = record else {
        return match req.kind {
            Kind::Register | Kind::Mirror => create(req, now_ms),
            _ => Decision::UnknownJob,
        };
    };
    if req.kind == Kind::Mirror {
        return mirror(rec, req, now_ms);
    }
    if !req.cas {
        return permissive(rec, req, target.as_deref(), now_ms);
    }
    // Pre-check 5.
    if req.authority == Authority::Agent {
        let attempt_differs = req.attempt.is_some_and(|a| rec.attempt() != Some(a));
        let token_differs = req.dispatch_token.as_deref().is_some_and(|t| rec.str("dispatch_token") != Some(t));
        if attempt_differs || token_differs {
            return refused("stale_attempt");
        }
    }
    // Pre-check 6: CAS fails closed.
    if let Some(want) = req.expected_attempt {
        match rec.attempt() {
            None => return refused("cas_no_attempt"),
            Some(a) if a != want => return refused("cas_failed"),
            Some(_) => {}
        }
    }
    // Pre-check 7.
    if req.authority == Authority::Agent && req.kind.is_operator() {
        return refused("not_operator");
    }
    table(rec, req, target.as_deref(), now_ms)
}

fn table(rec: &Record, req: &Request, target: Option<&str>, now: u64) -> Decision {
    let cur = rec.status();
    let ph = phase(cur);
    match (&req.kind, ph) {
        (Kind::Register, _) => refused("exists"),
        (Kind::Claim, Phase::NonTerminal) if cur == "running" => idempotent(rec),
        (Kind::Claim, Phase::NonTerminal) => apply(rec, req, now),
        (Kind::Progress | Kind::Beat | Kind::Claim, Phase::Terminal) => refused("late_signal"),
        (Kind::Progress, Phase::NonTerminal) => apply(rec, req, now),
        (Kind::Beat, Phase::NonTerminal) => beat(rec, req, now),
        (Kind::Barrier | Kind::Terminal, Phase::NonTerminal) => apply(rec, req, now),
        (Kind::Barrier | Kind::Terminal, Phase::Terminal) => {
            if Some(cur) == target {
                idempotent(rec)
            } else {
                refused("conflicting_terminal")
            }
        }
        (Kind::Set, Phase::NonTerminal) => match target {
            Some("pending") => refused("pending_owned_by_register"),
            Some("running") if cur == "running" => idempotent(rec),
            _ => apply(rec, req, now),
        },
        (Kind::Set, Phase::Terminal) => {
            if Some(cur) == target {
                idempotent(rec)
            } else {
                refused("terminal_locked")
            }
        }
        (Kind::Expire, Phase::NonTerminal) => {
            let deadline = rec.str("deadline_at").and_then(parse_ts);
            match deadline {
                Some(d) if now >= d => apply(rec, req, now),
                _ => refused("deadline_not_reached"),
            }
        }
        (Kind::Expire, Phase::Terminal) => {
            if cur == "deadline_timeout" {
                idempotent(rec)
            } else {
                refused("late_signal")
            }
        }
        (Kind::Redispatch, _) => {
            let current = rec.u64("iteration").unwrap_or(0);
            let next = req.iteration.unwrap_or(current + 1);
            if next > current {
                apply(rec, req, now)
            } else {
                refused("iteration_not_advanced")
            }
        }
        (Kind::Finalize, Phase::Terminal) if Some(cur) == target => idempotent(rec),
        (Kind::Finalize, _) => apply(rec, req, now),
        (Kind::Metadata, _) => apply(rec, req, now),
        (Kind::Scrub, _) => {
            if rec.has_stored_password() {
                apply(rec, req, now)
            } else {
                idempotent(rec)
            }
        }
        (Kind::Mirror | Kind::Unknown(_), _) => refused("unknown_request"),
    }
}

/// `beat` admission (non-terminal, no barrier for this attempt): a liveness rule that holds in
/// permissive mode too (CORE 5.3).
fn beat(rec: &Record, req: &Request, now: u64) -> Decision {
    if is_terminal(rec.status()) {
        return refused("late_signal");
    }
    if rec.u64("barrier_attempt").is_some() && rec.u64("barrier_attempt") == rec.attempt() {
        return refused("barrier_raised");
    }
    apply(rec, req, now)
}

/// `MAM_ENGINE_CAS=0`: no table and no pre-checks 5-7; status and fields merge unconditionally.
fn permissive(rec: &Record, req: &Request, target: Option<&str>, now: u64) -> Decision {
    match req.kind {
        // Identity is never overwritten, not even in permissive mode (decided).
        Kind::Register => refused("exists"),
        Kind::Beat => beat(rec, req, now),
        Kind::Set | Kind::Finalize | Kind::Terminal if target == Some(rec.status()) && req.fields.is_empty() => {
            idempotent(rec)
        }
        Kind::Scrub if !rec.has_stored_password() => idempotent(rec),
        _ => apply(rec, req, now),
    }
}

/// The record after `req`'s effects: fields merged first, then the kind's own effects (which own
/// their keys), then `updated_at`, `transition_seq` and the optional seq allocation.
fn apply(rec: &Record, req: &Request, now: u64) -> Decision {
    let mut new = rec.clone();
    for (k, v) in &req.fields {
        new.fields.insert(k.clone(), v.clone());
    }
    let ts = format_ts(now);
    let from = rec.status().to_string();
    let target = req.target_status.as_deref();
    match req.kind {
        Kind::Claim => {
            new.set("status", "running");
            new.set("claimed_at", ts.clone());
            new.set("last_event", "started");
            new.set("last_event_at", ts.clone());
        }
        Kind::Progress => {
            new.set("last_event", "progress");
            new.set("last_event_at", ts.clone());
        }
        Kind::Beat => {
            new.set("heartbeat_at", ts.clone());
            new.set("last_event", "progress");
            new.set("last_event_at", ts.clone());
        }
        Kind::Barrier => {
            new.set("barrier_attempt", rec.attempt().map(Value::from).unwrap_or(Value::Null));
        }
        Kind::Terminal => {
            let s = target.unwrap_or_default();
            new.set("status", s);
            new.set("finished_at", ts.clone());
            new.set("last_event", s);
            new.set("last_event_at", ts.clone());
        }
        Kind::Set | Kind::Finalize => {
            let s = target.unwrap_or_default();
            new.set("status", s);
            if is_terminal(s) {
                new.set("finished_at", ts.clone());
                new.set("reason", req.reason.clone().map(Value::from).unwrap_or(Value::Null));
            }
        }
        Kind::Expire => {
            new.set("status", "deadline_timeout");
            new.set("reason", "deadline");
            new.set("finished_at", ts.clone());
        }
        Kind::Redispatch => {
            if let Err(msg) = redispatch(&mut new, rec, req, now) {
                return Decision::Invalid(msg);
            }
        }
        Kind::Metadata | Kind::Scrub => {}
        Kind::Register | Kind::Mirror | Kind::Unknown(_) => return refused("unknown_request"),
    }
    finish(new, Some(from), req, now)
}

fn finish(mut new: Record, from: Option<String>, req: &Request, now: u64) -> Decision {
    let transition_seq = new.transition_seq() + 1;
    new.set("transition_seq", transition_seq);
    new.set("updated_at", format_ts(now));
    let seq = if req.alloc_seq {
        let s = new.last_seq() + 1;
        new.set("last_seq", s);
        Some(s)
    } else {
        None
    };
    Decision::Applied(Applied { from, to: new.status().to_string(), transition_seq, seq, record: new })
}

fn redispatch(new: &mut Record, rec: &Record, req: &Request, now: u64) -> Result<(), String> {
    let Some(tokens) = &req.tokens else {
        return Err("redispatch needs new tokens".into());
    };
    let attempt = rec.attempt().unwrap_or(0) + 1;
    let iteration = req.iteration.unwrap_or(rec.u64("iteration").unwrap_or(0) + 1);
    let auth = if new.str("transport") == Some("remote") {
        let Some(secret) = &tokens.dispatch_secret else {
            return Err("MAM_DISPATCH_SECRET is required for transport remote".into());
        };
        remote_auth_token(secret, &req.job_id, attempt, &tokens.dispatch_token)
    } else {
        tokens.local_auth_token.clone()
    };
    new.set("attempt", attempt);
    new.set("iteration", iteration);
    new.set("dispatch_token", tokens.dispatch_token.clone());
    new.set("auth_token", auth);
    new.set("status", "pending");
    for k in ["barrier_attempt", "claimed_at", "finished_at", "reason"] {
        new.set(k, Value::Null);
    }
    new.set("dispatched_at", format_ts(now));
    let timeout = new.u64("timeout_sec").unwrap_or(0);
    new.set("deadline_at", record::deadline_at(now, timeout));
    if new.get("idle_timeout_explicit") != Some(&Value::Bool(true)) {
        // A changed N or K re-derives a non-explicit idle timeout (CORE 4.1).
        let n = new.u64("heartbeat_sec").unwrap_or(30);
        let k = new.u64("heartbeat_misses").unwrap_or(4);
        new.set("idle_timeout_sec", n * k);
    }
    Ok(())
}

/// `register` (or a first `mirror`) on a missing record: the caller's initial record, pending.
fn create(req: &Request, now: u64) -> Decision {
    let Some(init) = &req.record else {
        return Decision::Invalid(format!("{} needs an initial record", req.kind.name()));
    };
    let mut new = Record::new(init.clone());
    for (k, v) in &req.fields {
        new.fields.insert(k.clone(), v.clone());
    }
    new.set("job_id", req.job_id.clone());
    new.set("status", "pending");
    new.set("transition_seq", 0);
    if new.get("created_at").is_none() {
        new.set("created_at", format_ts(now));
    }
    finish(new, None, req, now)
}

/// Mirror admission on an existing record (CORE 9.3): same token idempotent, older attempt or same
/// attempt with another token refused, strictly newer attempt replaces the record while `last_seq`
/// and `transition_seq` continue.
fn mirror(rec: &Record, req: &Request, now: u64) -> Decision {
    let Some(init) = &req.record else {
        return Decision::Invalid("mirror needs the dispatched record".into());
    };
    let incoming = Record::new(init.clone());
    let (in_attempt, in_token) = (incoming.attempt().unwrap_or(0), incoming.str("dispatch_token"));
    if in_token.is_some() && in_token == rec.str("dispatch_token") {
        return idempotent(rec);
    }
    let cur_attempt = rec.attempt().unwrap_or(0);
    if in_attempt <= cur_attempt {
        return refused("mirror_refused");
    }
    let mut new = incoming;
    new.set("job_id", req.job_id.clone());
    new.set("status", "pending");
    new.set("last_seq", rec.last_seq().max(new.last_seq()));
    new.set("transition_seq", rec.transition_seq());
    if let Some(c) = rec.get("created_at") {
        new.set("created_at", c.clone());
    }
    finish(new, Some(rec.status().to_string()), req, now)
}

#[cfg(test)]
mod explain_tests {
    /// Issue 18: every reason `decide` gives is explained in words.
    #[test]
    fn every_refusal_reason_has_words() {
        let src = include_str!("engine.rs");
        let mut n = 0;
        for part in src.split("refused(\"").skip(1) {
            let reason = part.split('"').next().unwrap();
            assert!(super::explain(reason).is_some(), "no words for {reason}");
            n += 1;
        }
        assert!(n >= 15, "{n}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: u64 = 1_757_725_323_456;

    fn rec(status: &str) -> Record {
        let v = json!({
            "schema": 1, "job_id": "j1", "type": "task", "attempt": 1, "iteration": 1,
            "dispatch_token": "tok1", "auth_token": "a".repeat(64), "agent_session": "w1",
            "transport": "local", "status": status, "reason": null, "heartbeat_sec": 30,
            "heartbeat_misses": 4, "idle_timeout_sec": 120, "idle_timeout_explicit": false,
            "timeout_sec": 0, "deadline_at": null, "last_seq": 7, "barrier_attempt": null,
            "transition_seq": 3, "claimed_at": null, "finished_at": null, "x_unknown": {"keep": true}
        });
        Record::new(v.as_object().unwrap().clone())
    }

    fn req(kind: &str, auth: Authority) -> Request {
        let mut r = Request::new(Kind::parse(kind), auth, "j1");
        if kind == "redispatch" {
            r.tokens =
                Some(Tokens { dispatch_token: "tok2".into(), local_auth_token: "b".repeat(64), dispatch_secret: None });
        }
        if kind == "register" || kind == "mirror" {
            r.record = Some(rec("pending").fields);
        }
        r
    }

    fn agent(kind: &str) -> Request {
        req(kind, Authority::Agent)
    }

    fn op(kind: &str) -> Request {
        req(kind, Authority::Operator)
    }

    /// A compact rendering of a decision for table tests.
    fn show(d: &Decision) -> String {
        match d {
            Decision::Applied(a) => format!("applied {}->{}", a.from.as_deref().unwrap_or("none"), a.to),
            Decision::Idempotent { status } => format!("idempotent {status}"),
            Decision::Refused { reason } => format!("refused {reason}"),
            Decision::Invalid(_) => "invalid".into(),
            Decision::UnknownJob => "unknown".into(),
        }
    }

    /// Runs one request against: no record, pending, running, terminal X==S (completed), and a
    /// terminal X!=S (failed). S is `completed` where a kind takes a status.
    fn row(r: Request) -> [String; 5] {
        let states = [None, Some(rec("pending")), Some(rec("running")), Some(rec("completed")), Some(rec("failed"))];
        states.map(|s| show(&decide(s.as_ref(), &r, NOW)))
    }

    #[test]
    fn table_register() {
        assert_eq!(
            row(op("register")),
            ["applied none->pending", "refused exists", "refused exists", "refused exists", "refused exists"]
        );
    }

    #[test]
    fn table_claim() {
        assert_eq!(
            row(agent("claim")),
            ["unknown", "applied pending->running", "idempotent running", "refused late_signal", "refused late_signal"]
        );
    }

    #[test]
    fn table_progress() {
        assert_eq!(
            row(agent("progress")),
            [
                "unknown",
                "applied pending->pending",
                "applied running->running",
                "refused late_signal",
                "refused late_signal"
            ]
        );
    }

    #[test]
    fn table_beat() {
        assert_eq!(
            row(agent("beat")),
            [
                "unknown",
                "applied pending->pending",
                "applied running->running",
                "refused late_signal",
                "refused late_signal"
            ]
        );
        for s in ["pending", "running"] {
            let mut r = rec(s);
            r.set("barrier_attempt", 1);
            assert_eq!(show(&decide(Some(&r), &agent("beat"), NOW)), "refused barrier_raised");
            // A barrier of an older attempt does not block this attempt's beats.
            r.set("barrier_attempt", 0);
            assert!(matches!(decide(Some(&r), &agent("beat"), NOW), Decision::Applied(_)));
        }
    }

    #[test]
    fn table_barrier() {
        let d = decide(Some(&rec("running")), &agent("barrier").with_status("completed"), NOW);
        let Decision::Applied(a) = &d else { panic!("{d:?}") };
        assert_eq!(a.record.u64("barrier_attempt"), Some(1));
        assert_eq!(a.to, "running");
        assert_eq!(
            row(agent("barrier").with_status("completed")),
            [
                "unknown",
                "applied pending->pending",
                "applied running->running",
                "idempotent completed",
                "refused conflicting_terminal"
            ]
        );
    }

    #[test]
    fn table_terminal() {
        assert_eq!(
            row(agent("terminal").with_status("completed")),
            [
                "unknown",
                "applied pending->completed",
                "applied running->completed",
                "idempotent completed",
                "refused conflicting_terminal"
            ]
        );
        let Decision::Applied(a) = decide(Some(&rec("running")), &agent("terminal").with_status("failed"), NOW) else {
            panic!()
        };
        assert_eq!(a.record.str("finished_at"), Some("2025-09-13T01:02:03.456Z"));
        assert_eq!(a.record.str("last_event"), Some("failed"));
    }

    #[test]
    fn table_set() {
        assert_eq!(
            row(op("set").with_status("completed")),
            [
                "unknown",
                "applied pending->completed",
                "applied running->completed",
                "idempotent completed",
                "refused terminal_locked"
            ]
        );
        assert_eq!(
            row(op("set").with_status("pending")),
            [
                "unknown",
                "refused pending_owned_by_register",
                "refused pending_owned_by_register",
                "refused terminal_locked",
                "refused terminal_locked"
            ]
        );
        assert_eq!(
            row(op("set").with_status("running")),
            [
                "unknown",
                "applied pending->running",
                "idempotent running",
                "refused terminal_locked",
                "refused terminal_locked"
            ]
        );
        let mut r = op("set").with_status("agent_blocked");
        r.reason = Some("stuck".into());
        let Decision::Applied(a) = decide(Some(&rec("running")), &r, NOW) else { panic!() };
        assert_eq!(a.record.str("reason"), Some("stuck"));
    }

    #[test]
    fn x10_table_expire() {
        let past = format_ts(NOW - 1);
        let future = format_ts(NOW + 1000);
        for (deadline, want) in [
            (Value::Null, "refused deadline_not_reached"),
            (future.clone().into(), "refused deadline_not_reached"),
            (past.clone().into(), "applied running->deadline_timeout"),
            (format_ts(NOW).into(), "applied running->deadline_timeout"),
        ] {
            let mut r = rec("running");
            r.set("deadline_at", deadline);
            assert_eq!(show(&decide(Some(&r), &op("expire"), NOW)), want);
        }
        let mut p = rec("pending");
        p.set("deadline_at", past);
        let Decision::Applied(a) = decide(Some(&p), &op("expire"), NOW) else { panic!() };
        assert_eq!(a.record.str("reason"), Some("deadline"));
        let mut d = rec("deadline_timeout");
        d.set("deadline_at", future);
        assert_eq!(show(&decide(Some(&d), &op("expire"), NOW)), "idempotent deadline_timeout");
        assert_eq!(show(&decide(None, &op("expire"), NOW)), "unknown");
        assert_eq!(show(&decide(Some(&rec("completed")), &op("expire"), NOW)), "refused late_signal");
    }

    #[test]
    fn table_redispatch() {
        assert_eq!(
            row(op("redispatch")),
            [
                "unknown",
                "applied pending->pending",
                "applied running->pending",
                "applied completed->pending",
                "applied failed->pending"
            ]
        );
        let mut same = op("redispatch");
        same.iteration = Some(1);
        assert_eq!(
            row(same),
            [
                "unknown",
                "refused iteration_not_advanced",
                "refused iteration_not_advanced",
                "refused iteration_not_advanced",
                "refused iteration_not_advanced"
            ]
        );
    }

    #[test]
    fn r7_redispatch_effects() {
        let mut r = rec("completed");
        r.set("claimed_at", "x");
        r.set("finished_at", "y");
        r.set("reason", "z");
        r.set("barrier_attempt", 1);
        r.set("timeout_sec", 60);
        r.set("heartbeat_sec", 10);
        let mut q = op("redispatch");
        q.iteration = Some(5);
        q.fields.insert("heartbeat_misses".into(), 3.into());
        let Decision::Applied(a) = decide(Some(&r), &q, NOW) else { panic!() };
        let n = &a.record;
        assert_eq!((n.attempt(), n.u64("iteration"), n.status()), (Some(2), Some(5), "pending"));
        assert_eq!(n.str("dispatch_token"), Some("tok2"));
        assert_eq!(n.str("auth_token"), Some("b".repeat(64).as_str()));
        for k in ["claimed_at", "finished_at", "reason", "barrier_attempt"] {
            assert_eq!(n.get(k), Some(&Value::Null), "{k}");
        }
        assert_eq!(n.str("dispatched_at"), Some(format_ts(NOW).as_str()));
        assert_eq!(n.str("deadline_at"), Some(format_ts(NOW + 60_000).as_str()));
        assert_eq!(n.u64("idle_timeout_sec"), Some(30), "N=10, K=3 re-derived");
        assert_eq!(n.last_seq(), 7, "last_seq kept");
        assert_eq!(n.transition_seq(), 4);
        assert_eq!(n.get("x_unknown"), Some(&json!({"keep": true})));

        // An explicit idle timeout is kept.
        r.set("idle_timeout_explicit", true);
        r.set("idle_timeout_sec", 50);
        let Decision::Applied(a) = decide(Some(&r), &q, NOW) else { panic!() };
        assert_eq!(a.record.u64("idle_timeout_sec"), Some(50));
    }

    #[test]
    fn redispatch_of_a_remote_job_derives_the_auth_token() {
        let mut r = rec("completed");
        r.set("transport", "remote");
        let mut q = op("redispatch");
        assert_eq!(show(&decide(Some(&r), &q, NOW)), "invalid", "no secret");
        q.tokens.as_mut().unwrap().dispatch_secret = Some(b"sec".to_vec());
        let Decision::Applied(a) = decide(Some(&r), &q, NOW) else { panic!() };
        assert_eq!(a.record.str("auth_token").unwrap(), remote_auth_token(b"sec", "j1", 2, "tok2"));
    }

    #[test]
    fn table_finalize() {
        assert_eq!(
            row(op("finalize").with_status("completed")),
            [
                "unknown",
                "applied pending->completed",
                "applied running->completed",
                "idempotent completed",
                "applied failed->completed"
            ]
        );
        // R8: finalize failed over completed is applied.
        assert_eq!(
            show(&decide(Some(&rec("completed")), &op("finalize").with_status("failed"), NOW)),
            "applied completed->failed"
        );
        assert_eq!(show(&decide(Some(&rec("running")), &op("finalize").with_status("running"), NOW)), "invalid");
    }

    #[test]
    fn table_metadata() {
        let mut q = op("metadata");
        q.fields.insert("watcher_pid".into(), 42.into());
        assert_eq!(
            row(q.clone()),
            [
                "unknown",
                "applied pending->pending",
                "applied running->running",
                "applied completed->completed",
                "applied failed->failed"
            ]
        );
        let Decision::Applied(a) = decide(Some(&rec("running")), &q, NOW) else { panic!() };
        assert_eq!(a.record.u64("watcher_pid"), Some(42));
        assert_eq!(a.transition_seq, 4);
        assert_eq!(a.record.str("updated_at"), Some(format_ts(NOW).as_str()));
    }

    #[test]
    fn table_mirror() {
        let mut q = agent("mirror");
        // No record: created pending.
        assert_eq!(show(&decide(None, &q, NOW)), "applied none->pending");
        // Same token: idempotent, whatever the local status.
        assert_eq!(show(&decide(Some(&rec("completed")), &q, NOW)), "idempotent completed");
        // Same attempt, another token; older attempt: refused.
        let mut other = rec("pending");
        other.set("dispatch_token", "tokX");
        q.record = Some(other.fields.clone());
        assert_eq!(show(&decide(Some(&rec("running")), &q, NOW)), "refused mirror_refused");
        let mut local2 = rec("running");
        local2.set("attempt", 2);
        local2.set("dispatch_token", "tok2");
        assert_eq!(show(&decide(Some(&local2), &q, NOW)), "refused mirror_refused");
        // Newer attempt replaces; seqs continue.
        let mut newer = rec("pending");
        newer.set("attempt", 3);
        newer.set("dispatch_token", "tok3");
        newer.set("last_seq", 0);
        q.record = Some(newer.fields);
        let Decision::Applied(a) = decide(Some(&local2), &q, NOW) else { panic!() };
        assert_eq!((a.record.attempt(), a.record.last_seq(), a.transition_seq), (Some(3), 7, 4));
        assert_eq!(a.to, "pending");
    }

    #[test]
    fn table_scrub() {
        let mut r = rec("completed");
        r.set("broker", json!({"host": "h", "password": "x"}));
        assert_eq!(show(&decide(Some(&r), &op("scrub"), NOW)), "applied completed->completed");
        r.set("broker", json!({"host": "h", "password": null}));
        assert_eq!(show(&decide(Some(&r), &op("scrub"), NOW)), "idempotent completed");
    }

    #[test]
    fn alloc_seq_takes_the_next_seq_in_the_same_write() {
        let mut q = agent("claim");
        q.alloc_seq = true;
        let Decision::Applied(a) = decide(Some(&rec("pending")), &q, NOW) else { panic!() };
        assert_eq!((a.seq, a.record.last_seq()), (Some(8), 8));
        // An idempotent repeat allocates nothing.
        assert_eq!(show(&decide(Some(&a.record), &q, NOW)), "idempotent running");
    }

    #[test]
    fn precheck_order() {
        // 1 before 2: an invalid status wins over a reserved field.
        let mut q = op("set").with_status("bogus");
        q.fields.insert("status".into(), "completed".into());
        let Decision::Invalid(msg) = decide(Some(&rec("running")), &q, NOW) else { panic!() };
        assert!(msg.starts_with("invalid status 'bogus' (expected one of: pending, running"), "{msg}");
        // 2 before 3: a reserved field in an unknown kind is Invalid.
        let mut q = op("frobnicate");
        q.fields.insert("auth_token".into(), "x".into());
        assert_eq!(show(&decide(Some(&rec("running")), &q, NOW)), "invalid");
        // 3 before 4: an unknown kind on a missing record is refused, not unknown job (X7).
        assert_eq!(show(&decide(None, &op("frobnicate"), NOW)), "refused unknown_request");
        // 4 before 5: a stale agent request on a missing record is an unknown job.
        let mut q = agent("progress");
        q.attempt = Some(9);
        assert_eq!(show(&decide(None, &q, NOW)), "unknown");
        // 5 before 6: stale attempt wins over a failing CAS.
        q.expected_attempt = Some(9);
        assert_eq!(show(&decide(Some(&rec("running")), &q, NOW)), "refused stale_attempt");
        let mut q = agent("progress");
        q.dispatch_token = Some("other".into());
        assert_eq!(show(&decide(Some(&rec("running")), &q, NOW)), "refused stale_attempt");
        // 6 before 7: an agent's operator request with a failing CAS is cas_failed.
        let mut q = agent("set").with_status("completed");
        q.expected_attempt = Some(2);
        assert_eq!(show(&decide(Some(&rec("running")), &q, NOW)), "refused cas_failed");
        q.expected_attempt = Some(1);
        assert_eq!(show(&decide(Some(&rec("running")), &q, NOW)), "refused not_operator");
        // X5: CAS fails closed on a record without attempt.
        let mut r = rec("running");
        r.fields.shift_remove("attempt");
        let mut q = op("set").with_status("completed");
        q.expected_attempt = Some(1);
        assert_eq!(show(&decide(Some(&r), &q, NOW)), "refused cas_no_attempt");
        // Then the table.
        q.expected_attempt = Some(1);
        assert_eq!(show(&decide(Some(&rec("completed")), &q, NOW)), "idempotent completed");
    }

    #[test]
    fn x6_reserved_fields_are_invalid() {
        for k in RESERVED {
            let mut q = agent("progress");
            q.fields.insert(k.to_string(), "x".into());
            assert_eq!(show(&decide(Some(&rec("running")), &q, NOW)), "invalid", "{k}");
            q.cas = false;
            assert_eq!(show(&decide(Some(&rec("running")), &q, NOW)), "invalid", "{k} permissive");
        }
    }

    #[test]
    fn x4_stale_attempt() {
        let mut r = rec("running");
        r.set("attempt", 2);
        let mut q = agent("progress");
        q.attempt = Some(1);
        assert_eq!(show(&decide(Some(&r), &q, NOW)), "refused stale_attempt");
    }

    #[test]
    fn permissive_mode_merges_unconditionally() {
        let mut q = agent("terminal").with_status("failed");
        q.cas = false;
        q.attempt = Some(9);
        assert_eq!(show(&decide(Some(&rec("completed")), &q, NOW)), "applied completed->failed");
        let mut q = op("set").with_status("running");
        q.cas = false;
        assert_eq!(show(&decide(Some(&rec("completed")), &q, NOW)), "applied completed->running");
        let mut q = op("set").with_status("completed");
        q.cas = false;
        assert_eq!(show(&decide(Some(&rec("completed")), &q, NOW)), "idempotent completed");
        // Beat admission still applies.
        let mut q = agent("beat");
        q.cas = false;
        assert_eq!(show(&decide(Some(&rec("completed")), &q, NOW)), "refused late_signal");
        let mut r = rec("running");
        r.set("barrier_attempt", 1);
        assert_eq!(show(&decide(Some(&r), &q, NOW)), "refused barrier_raised");
        // R5 with CAS=0: invalid status is still invalid.
        let mut q = op("set").with_status("bogus");
        q.cas = false;
        assert_eq!(show(&decide(Some(&rec("running")), &q, NOW)), "invalid");
        // Register never overwrites.
        let mut q = op("register");
        q.cas = false;
        assert_eq!(show(&decide(Some(&rec("running")), &q, NOW)), "refused exists");
        // No iteration check on redispatch.
        let mut q = op("redispatch");
        q.cas = false;
        q.iteration = Some(1);
        assert_eq!(show(&decide(Some(&rec("completed")), &q, NOW)), "applied completed->pending");
    }

    #[test]
    fn missing_or_wrong_target_is_invalid() {
        for k in ["set", "finalize", "terminal", "barrier"] {
            assert_eq!(show(&decide(Some(&rec("running")), &req(k, Authority::Operator), NOW)), "invalid", "{k}");
        }
        assert_eq!(show(&decide(Some(&rec("running")), &agent("terminal").with_status("running"), NOW)), "invalid");
    }

    #[test]
    fn applied_writes_bump_transition_seq_and_keep_unknown_fields() {
        let Decision::Applied(a) = decide(Some(&rec("pending")), &agent("claim"), NOW) else { panic!() };
        assert_eq!(a.transition_seq, 4);
        assert_eq!(a.record.get("x_unknown"), Some(&json!({"keep": true})));
        assert_eq!(a.record.str("claimed_at"), Some(format_ts(NOW).as_str()));
    }
}
