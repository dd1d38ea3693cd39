//! Job events on disk and on the wire (CORE 6, A4, A8): the non-terminal algorithm of 6.3, the
//! terminal algorithm of 6.4, repeats and late signals of 6.5, and the operator close state of A4.
//!
//! Order of every publish: validation, one engine decision with the seq allocated in the same L1
//! write, the signed event appended to `<registry>/<job_id>/events.log` (L4), and only then the
//! broker: the event and the re-checked retained state over one connection (`wire`). The
//! `published` audit entry always follows the wire. Lock order is L3 -> L2 -> L1; the terminal
//! never holds L2 and an exclusive L3 together.
//!
//! This module never prints: warnings go to the caller's `diag` callback, results are values.

pub mod close;
pub mod overlap;

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use crate::clock;
use crate::forward;
use crate::heartbeat::timer;
use crate::joblog;
use crate::joblog::{
    append_event, events_log_path, inflight_exclusive, inflight_lock_path, inflight_shared, latest_event_line,
    prepare_events_log, JoblogError,
};
use crate::mqtt::{with_retry, Client, Message, MqttConfig, MqttError, Role, Stop};
use crate::registry::audit;
use crate::registry::engine::{Authority, Kind, Request as EngineRequest};
use crate::registry::record::Record;
use crate::registry::store::{Decided, Store, StoreError};
use crate::text::show_path;
use crate::trace;

use crate::wire::{self, EventFields, Job, Progress, Settings};
use overlap::{AuditWorker, PendingAudit, Preconnect};

/// `--message` limit (CORE 6.1).
pub const MAX_MESSAGE: usize = 4096;
/// `--data` limit (CORE 6.1, decided 64 KiB).
pub const MAX_DATA: usize = 64 * 1024;
/// How often the terminal retries the exclusive in-flight lock (CORE 6.4 step 4).
/// What the terminal waits beyond the one-shot budget (A8).
pub const INFLIGHT_GRACE: Duration = Duration::from_secs(5);

/// The event types (CORE 5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    Started,
    Progress,
    Completed,
    Failed,
    Error,
}

impl Event {
    pub const ALL: &'static [&'static str] = &["started", "progress", "completed", "failed", "error"];

    pub fn parse(s: &str) -> Option<Event> {
        Some(match s {
            "started" => Event::Started,
            "progress" => Event::Progress,
            "completed" => Event::Completed,
            "failed" => Event::Failed,
            "error" => Event::Error,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Event::Started => "started",
            Event::Progress => "progress",
            Event::Completed => "completed",
            Event::Failed => "failed",
            Event::Error => "error",
        }
    }

    /// A terminal event maps to the status of the same name.
    pub fn is_terminal(self) -> bool {
        matches!(self, Event::Completed | Event::Failed | Event::Error)
    }
}

/// One `mam publish` request, validated.
#[derive(Debug, Clone)]
pub struct Request {
    pub job_id: String,
    pub event: Event,
    pub message: String,
    pub data: Map<String, Value>,
    pub attempt: Option<u64>,
    pub dispatch_token: Option<String>,
    pub no_state: bool,
}

/// What the wire part of a publish achieved, for the audit entry and the exit code.
#[derive(Debug, Clone, Default)]
pub struct WireReport {
    /// The event was acknowledged (or there was none to send, for a close).
    pub published: bool,
    pub state_published: bool,
    /// Why the state was not sent although asked for (`attempt ended`).
    pub state_skipped: Option<String>,
    pub attempts: u32,
    pub error: Option<String>,
    /// The store-and-forward look of the attempt that sent the event found every earlier event
    /// confirmed, up to this length of events.log (`forward::Look::clean_to`).
    pub clean_to: Option<u64>,
}

impl WireReport {
    /// rc 3 unless everything asked for went out (a skipped state is not a failure).
    pub fn ok(&self) -> bool {
        self.error.is_none()
    }
}

/// The result of a publish that reached a decision.
#[derive(Debug)]
pub enum Outcome {
    /// A new event with its seq.
    Published { seq: u64, report: WireReport },
    /// An idempotent repeat (CORE 6.5): `resent` when the unconfirmed event went out again.
    Repeat { status: String, resent: Option<(u64, WireReport)> },
    /// Refused by the engine (rc 4), nothing sent.
    Refused { reason: String },
}

/// Failures before or around the decision (rc 1), each naming its object.
#[derive(Debug)]
pub enum PublishError {
    Store(StoreError),
    Io { what: &'static str, path: PathBuf, err: io::Error },
    Record(String),
}

impl fmt::Display for PublishError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PublishError::Store(e) => e.fmt(f),
            PublishError::Io { what, path, err } => write!(f, "{}: {what} ({err})", show_path(path)),
            PublishError::Record(m) => f.write_str(m),
        }
    }
}

impl From<JoblogError> for PublishError {
    fn from(e: JoblogError) -> PublishError {
        PublishError::Io { what: e.what, path: e.path, err: e.err }
    }
}

impl From<StoreError> for PublishError {
    fn from(e: StoreError) -> PublishError {
        PublishError::Store(e)
    }
}

/// One wire operation: what to send for which job and seq.
#[derive(Debug, Clone)]
pub struct Shot<'a> {
    pub cfg: &'a MqttConfig,
    pub job: &'a Job,
    /// The event bytes (the same on every attempt); `None` for a close (state only).
    pub event: Option<&'a Message>,
    /// The state's `last_event`.
    pub last_event: &'a str,
    pub seq: u64,
    pub with_state: bool,
    /// A8's total wire budget; `None` for none (terminal events).
    pub budget: Option<Duration>,
}

/// Sends the event (if any) and the re-checked state over one connection per attempt, with the
/// retries of CORE 3.3 inside the budget (A8). Event bytes are the same on every attempt; an event
/// the broker acknowledged is not sent again, and the state is rebuilt before every send.
pub fn send_one_shot(settings: &Settings, store: &Store, shot: &Shot<'_>, diag: &mut dyn FnMut(String)) -> WireReport {
    send_one_shot_with(settings, store, shot, diag, None)
}

/// `send_one_shot` whose first attempt takes the connection `pre` opened (or its error), if any.
fn send_one_shot_with(
    settings: &Settings,
    store: &Store,
    shot: &Shot<'_>,
    diag: &mut dyn FnMut(String),
    pre: Option<Preconnect>,
) -> WireReport {
    let mut pre = pre;
    let Shot { cfg, job, event, last_event, seq, with_state, budget } = shot.clone();
    let deadline = budget.map(|b| Instant::now() + b);
    let stop = match deadline {
        Some(d) => Stop::from_fn(move || Instant::now() >= d),
        None => Stop::never(),
    };
    let mut progress = Progress::default();
    let mut last_err: Option<String> = None;
    let recheck = || wire::recheck_state(store, job, last_event, seq);
    // Issue 19: what an outage left on disk goes first, so the wire keeps the seq order.
    let mut replayed = forward::Replayed::default();
    let mut notes: Vec<String> = Vec::new();
    let mut clean_to = None;
    let result = with_retry(&settings.policy(budget), &stop, &mut *diag, |_attempt| {
        progress.attempts += 1;
        let r = (|| {
            let mut c = match pre.take().and_then(|p| p.take(&cfg.addr())) {
                Some(opened) => opened?,
                None => {
                    let t = Instant::now();
                    let c = Client::connect(cfg, Role::Pub, &stop)?;
                    trace::span("connect", t);
                    c
                }
            };
            let t = Instant::now();
            let look = forward::look(store, job, seq, clock::now_ms());
            trace::span("unsent", t);
            clean_to = look.clean_to;
            forward::send(store, job, &mut c, &look.unsent, false, &mut replayed, &mut |w| notes.push(w))?;
            let state: Option<&dyn Fn() -> wire::StateCheck> = if with_state { Some(&recheck) } else { None };
            wire::send_event_then_state(&mut c, event, &mut progress, state, &|| true)?;
            let t = Instant::now();
            c.disconnect();
            trace::span("disconnect", t);
            Ok(())
        })();
        if let Err(e) = &r {
            if !matches!(e, MqttError::Stopped) {
                last_err = Some(e.to_string());
            }
        }
        r
    });
    for n in notes {
        diag(n);
    }
    if !replayed.seqs.is_empty() {
        diag(format!("NOTE: job {}: sent {} earlier event(s) the wire had missed", job.job_id, replayed.seqs.len()));
    }
    let error = match result {
        Ok(()) => None,
        Err(MqttError::Stopped) => Some(format!(
            "wire budget of {}s (MAM_PUBLISH_BUDGET_S) exhausted{}",
            budget.unwrap_or_default().as_secs(),
            last_err.map(|e| format!(": {e}")).unwrap_or_default()
        )),
        Err(e) => Some(e.to_string()),
    };
    WireReport {
        published: progress.event_acked || event.is_none(),
        state_published: progress.state_sent,
        state_skipped: progress.state_skipped,
        attempts: progress.attempts,
        clean_to: clean_to.filter(|_| progress.event_acked && error.is_none()),
        error,
    }
}

/// The audit entry `published` (CORE 6.3 step 7), written after the wire.
fn audit_published(store: &Store, job: &Job, event: &str, seq: u64, r: &WireReport, diag: &mut dyn FnMut(String)) {
    let mut rest = json!({
        "seq": seq,
        "event": event,
        "published": r.published,
        "state_published": r.state_published,
        "attempts": r.attempts,
    });
    if let Some(e) = &r.error {
        rest["error"] = e.clone().into();
    }
    if let Some(to) = r.clean_to {
        rest["clean_to"] = to.into();
    }
    let e = audit::entry(clock::now_ms(), &job.job_id, Some(job.attempt), "published", rest);
    if let Err(err) = audit::flush(&store.logs, &job.job_id, &[e], None) {
        diag(format!("WARNING: {}: audit not written ({err})", show_path(&audit::job_dir(&store.logs, &job.job_id))));
    }
}

fn agent_request(kind: Kind, rec: &Record, req: &Request, settings: &Settings) -> EngineRequest {
    let mut r = EngineRequest::new(kind, Authority::Agent, &req.job_id);
    r.attempt = req.attempt.or(rec.attempt());
    r.dispatch_token = req.dispatch_token.clone().or_else(|| rec.str("dispatch_token").map(str::to_string));
    r.cas = settings.cas;
    r
}

/// One engine request: the decision and the record as read under L1 (6.5 works on that record).
fn apply(
    store: &Store,
    r: &EngineRequest,
    now: u64,
    diag: &mut dyn FnMut(String),
) -> Result<(Decided, Option<Record>), PublishError> {
    let out = store.apply(r, now)?;
    if let Some(w) = &out.audit_error {
        diag(format!("WARNING: {w}"));
    }
    Ok((out.decision, out.before))
}

fn before_or_read(before: Option<Record>, store: &Store, job_id: &str) -> Result<Record, PublishError> {
    match before {
        Some(r) => Ok(r),
        None => Ok(store.read_existing(job_id)?),
    }
}

/// The size `data` has in an event: its compact JSON bytes. Never more than the `--data` text it
/// was parsed from, so the CLI's check on that text implies the library's.
pub fn data_len(data: &Map<String, Value>) -> usize {
    serde_json::to_vec(data).map_or(usize::MAX, |v| v.len())
}

/// Called once a non-terminal event is recorded and on disk, before the wire is tried, with the
/// record it produced (issue 18: `--heartbeat N` arms the timer here, so a broker outage at start
/// cannot hold the timer back past the job's idle window). It returns the lines to print.
pub type OnRecorded<'a> = &'a mut dyn FnMut(&Record) -> Vec<String>;

/// `mam publish` (CORE 6.3, 6.4, 6.5) with the `--data` limit of the CLI (`MAX_DATA`). The caller
/// prints the outcome; `on_recorded` (see `OnRecorded`) arms the timer.
pub fn publish(
    store: &Store,
    settings: &Settings,
    req: &Request,
    diag: &mut dyn FnMut(String),
    on_recorded: Option<OnRecorded<'_>>,
) -> Result<Outcome, PublishError> {
    publish_inner(store, settings, req, MAX_DATA, diag, on_recorded)
}

/// `publish` for a caller whose events carry more data than an agent's `--data` may: the remote
/// runner sends up to 256 KiB of report text (A12). Nothing is decided or written when the message
/// or `data` is over its limit.
pub fn publish_with_limit(
    store: &Store,
    settings: &Settings,
    req: &Request,
    max_data: usize,
    diag: &mut dyn FnMut(String),
) -> Result<Outcome, PublishError> {
    publish_inner(store, settings, req, max_data, diag, None)
}

fn publish_inner(
    store: &Store,
    settings: &Settings,
    req: &Request,
    max_data: usize,
    diag: &mut dyn FnMut(String),
    on_recorded: Option<OnRecorded<'_>>,
) -> Result<Outcome, PublishError> {
    if req.message.len() > MAX_MESSAGE {
        return Err(PublishError::Record(format!(
            "job {}: message of {} bytes is more than {MAX_MESSAGE}",
            req.job_id,
            req.message.len()
        )));
    }
    let n = data_len(&req.data);
    if n > max_data {
        return Err(PublishError::Record(format!("job {}: data of {n} bytes is more than {max_data}", req.job_id)));
    }
    let t = Instant::now();
    let rec = store.read_existing(&req.job_id)?;
    trace::span("read", t);
    let events = events_log_path(&store.registry, &req.job_id);
    if req.event.is_terminal() {
        terminal(store, settings, req, &rec, &events, diag)
    } else {
        non_terminal(store, settings, req, &rec, &events, diag, on_recorded)
    }
}

fn non_terminal(
    store: &Store,
    settings: &Settings,
    req: &Request,
    rec: &Record,
    events: &Path,
    diag: &mut dyn FnMut(String),
    on_recorded: Option<OnRecorded<'_>>,
) -> Result<Outcome, PublishError> {
    let t = Instant::now();
    let l3 = inflight_shared(&store.registry, &req.job_id)?;
    prepare_events_log(events)?;
    trace::span("lock", t);
    let kind = if req.event == Event::Started { Kind::Claim } else { Kind::Progress };
    let mut r = agent_request(kind, rec, req, settings);
    r.alloc_seq = true;
    let now = clock::now_ms();
    // Issue 20: the broker connection opens while the record and events.log are written, and the
    // audit half of the transaction finishes while the event goes out (`overlap`).
    let pre = Preconnect::start(&settings.mqtt_for(rec).0, settings.budget);
    let worker = AuditWorker::spawn(&store.logs, &req.job_id);
    let (out, flush) = store.apply_deferred_staging(&r, now, &mut |m| {
        if let Some(w) = &worker {
            w.stage(m);
        }
    })?;
    if let Some(w) = &out.audit_error {
        diag(format!("WARNING: {w}"));
    }
    let (decision, before) = (out.decision, out.before);
    let flush = match decision {
        Decided::Applied(_) => Some(match worker {
            Some(w) => w.start(flush),
            None => PendingAudit::start(flush),
        }),
        _ => {
            if let Some(w) = flush.flush() {
                diag(format!("WARNING: {w}"));
            }
            None
        }
    };
    match decision {
        Decided::Applied(a) => {
            let seq = a.seq.ok_or_else(|| PublishError::Record("engine allocated no seq".into()))?;
            let wire = Overlap { pre, audit: flush };
            let out = emit(
                store,
                settings,
                req,
                &a.record,
                events,
                seq,
                now,
                Some(settings.budget),
                diag,
                on_recorded,
                wire,
            )?;
            drop(l3);
            Ok(out)
        }
        Decided::Idempotent { status } => {
            let before = before_or_read(before, store, &req.job_id)?;
            let out = repeat(store, settings, req, &before, events, status, Some(settings.budget), diag);
            drop(l3);
            out
        }
        Decided::Refused { reason } => Ok(Outcome::Refused { reason }),
    }
}

fn terminal(
    store: &Store,
    settings: &Settings,
    req: &Request,
    rec: &Record,
    events: &Path,
    diag: &mut dyn FnMut(String),
) -> Result<Outcome, PublishError> {
    prepare_events_log(events)?;
    let status = req.event.name();
    // Step 2: the attempt-scoped barrier; every later beat of this attempt is refused.
    let mut b = agent_request(Kind::Barrier, rec, req, settings);
    b.target_status = Some(status.to_string());
    let (decision, before) = apply(store, &b, clock::now_ms(), diag)?;
    match decision {
        Decided::Applied(_) => {}
        Decided::Idempotent { status } => {
            let before = before_or_read(before, store, &req.job_id)?;
            return repeat(store, settings, req, &before, events, status, None, diag);
        }
        Decided::Refused { reason } => return Ok(Outcome::Refused { reason }),
    }
    // Step 3: stop the timer under L2 (released before L3 is taken).
    match timer::stop_timer(store, &req.job_id, settings.drain) {
        Ok(s) => {
            if let Some(w) = timer::stopped_warning(&s, settings.drain) {
                diag(w);
            }
        }
        Err(e) => diag(format!("WARNING: job {}: cannot stop the heartbeat timer ({e})", req.job_id)),
    }
    // Step 4: wait out in-flight one-shot publishes (A8: their budget plus 5 s).
    let wait = settings.budget + INFLIGHT_GRACE;
    let l3 = match inflight_exclusive(&store.registry, &req.job_id, wait) {
        Ok(Some(l)) => Some(l),
        Ok(None) => {
            diag(format!(
                "WARNING: job {}: in-flight publishes still running after {}s; continuing",
                req.job_id,
                wait.as_secs()
            ));
            None
        }
        Err(err) => {
            return Err(PublishError::Io {
                what: "cannot lock",
                path: inflight_lock_path(&store.registry, &req.job_id),
                err,
            })
        }
    };
    // Step 5: the terminal takes its seq.
    let mut t = agent_request(Kind::Terminal, rec, req, settings);
    t.target_status = Some(status.to_string());
    t.alloc_seq = true;
    let now = clock::now_ms();
    let (decision, before) = apply(store, &t, now, diag)?;
    let out = match decision {
        Decided::Applied(a) => {
            let seq = a.seq.ok_or_else(|| PublishError::Record("engine allocated no seq".into()))?;
            emit(store, settings, req, &a.record, events, seq, now, None, diag, None, Overlap::default())
        }
        Decided::Idempotent { status } => {
            let before = before_or_read(before, store, &req.job_id)?;
            repeat(store, settings, req, &before, events, status, None, diag)
        }
        Decided::Refused { reason } => Ok(Outcome::Refused { reason }),
    };
    drop(l3);
    out
}

/// Steps 5-7 of CORE 6.3 for event bytes already on disk: send the event and the state over one
/// connection, then audit `published`. Used by a new event and by a repeat's resend alike.
#[allow(clippy::too_many_arguments)] // the send's inputs; a struct would only rename them
fn send_and_audit(
    store: &Store,
    settings: &Settings,
    req: &Request,
    rec: &Record,
    job: &Job,
    seq: u64,
    bytes: &[u8],
    budget: Option<Duration>,
    diag: &mut dyn FnMut(String),
    overlap: Overlap,
) -> WireReport {
    let (cfg, warning) = settings.mqtt_for(rec);
    if let Some(w) = warning {
        diag(w);
    }
    let msg = job.event_message(bytes);
    let shot = Shot {
        cfg: &cfg,
        job,
        event: Some(&msg),
        last_event: req.event.name(),
        seq,
        with_state: !req.no_state,
        budget,
    };
    let report = send_one_shot_with(settings, store, &shot, diag, overlap.pre);
    // The transition's entries are in audit.jsonl before the `published` one.
    if let Some(w) = overlap.audit.and_then(PendingAudit::finish) {
        diag(format!("WARNING: {w}"));
    }
    let t = Instant::now();
    audit_published(store, job, req.event.name(), seq, &report, diag);
    trace::span("published", t);
    report
}

/// Steps 4-7 of CORE 6.3 for a freshly allocated seq: sign, append, send, audit.
#[allow(clippy::too_many_arguments)] // the steps' inputs; a struct would only rename them
fn emit(
    store: &Store,
    settings: &Settings,
    req: &Request,
    rec: &Record,
    events: &Path,
    seq: u64,
    now: u64,
    budget: Option<Duration>,
    diag: &mut dyn FnMut(String),
    on_recorded: Option<OnRecorded<'_>>,
    overlap: Overlap,
) -> Result<Outcome, PublishError> {
    let t = Instant::now();
    let job = Job::from_record(rec).map_err(PublishError::Record)?;
    let ts = clock::format_ts(now);
    let fields =
        EventFields { event: req.event.name(), seq, ts: &ts, heartbeat: false, message: &req.message, data: &req.data };
    let bytes = job.event_bytes(&fields).map_err(|e| PublishError::Record(format!("cannot sign the event: {e}")))?;
    trace::span("sign", t);
    let t = Instant::now();
    append_event(events, &bytes)?;
    trace::span("events.log", t);
    if let Some(hook) = on_recorded {
        let t = Instant::now();
        for line in hook(rec) {
            diag(line);
        }
        trace::span("hook", t);
    }
    let report = send_and_audit(store, settings, req, rec, &job, seq, &bytes, budget, diag, overlap);
    Ok(Outcome::Published { seq, report })
}

/// What `emit` may find already under way (`overlap`): a connection for its first attempt, the
/// transition's audit flush to wait for before the `published` entry.
#[derive(Debug, Default)]
struct Overlap {
    pre: Option<Preconnect>,
    audit: Option<PendingAudit>,
}

/// How much of the end of audit.jsonl `audit_confirms` reads at most: the entry of a repeat's seq
/// is recent, and a flooded audit must not be read whole (issue 12 item 8).
pub const AUDIT_SCAN_BYTES: u64 = 16 * 1024 * 1024;

/// True when the job's audit has `published: true` for `seq` (read backwards, bounded).
pub fn audit_confirms(logs: &Path, job_id: &str, seq: u64) -> bool {
    let mut confirmed = false;
    let path = audit::job_dir(logs, job_id).join("audit.jsonl");
    let _ = joblog::scan_lines_back(&path, joblog::MAX_LINE, AUDIT_SCAN_BYTES, |l| {
        let Ok(v) = serde_json::from_slice::<Value>(l) else { return false };
        confirmed = v["kind"] == "published" && v["seq"].as_u64() == Some(seq) && v["published"] == Value::Bool(true);
        confirmed
    });
    confirmed
}

/// CORE 6.5: an idempotent repeat allocates no seq. The unconfirmed latest line of this attempt and
/// event goes out again with the current state; a confirmed one sends nothing.
#[allow(clippy::too_many_arguments)] // the repeat's inputs; a struct would only rename them
fn repeat(
    store: &Store,
    settings: &Settings,
    req: &Request,
    rec: &Record,
    events: &Path,
    status: String,
    budget: Option<Duration>,
    diag: &mut dyn FnMut(String),
) -> Result<Outcome, PublishError> {
    let job = Job::from_record(rec).map_err(PublishError::Record)?;
    let line = latest_event_line(events, job.attempt, req.event.name()).map_err(|err| PublishError::Io {
        what: "cannot read events.log",
        path: events.to_path_buf(),
        err,
    })?;
    let Some((seq, bytes)) = line else {
        return Ok(Outcome::Repeat { status, resent: None });
    };
    if audit_confirms(&store.logs, &job.job_id, seq) {
        return Ok(Outcome::Repeat { status, resent: None });
    }
    let report = send_and_audit(store, settings, req, rec, &job, seq, &bytes, budget, diag, Overlap::default());
    Ok(Outcome::Repeat { status, resent: Some((seq, report)) })
}

/// A4: after an operator close (`set`, `finalize`, `expire` applied to a terminal status, with the
/// seq allocated in that same write), publish the signed retained state with the new status, that
/// seq and `last_event: "closed"`. No event is sent. Waits out in-flight one-shots like the
/// terminal does, so no `running` state follows. Returns the WARNING line of a failure.
pub fn close_state(
    store: &Store,
    settings: &Settings,
    rec: &Record,
    diag: &mut dyn FnMut(String),
) -> Result<WireReport, String> {
    let job = Job::from_record(rec).map_err(|e| format!("close state not published: {e}"))?;
    let seq = rec.last_seq();
    let wait = settings.budget + INFLIGHT_GRACE;
    let l3 = match inflight_exclusive(&store.registry, &job.job_id, wait) {
        Ok(l) => l,
        Err(e) => {
            diag(format!("WARNING: job {}: cannot take the in-flight lock ({e}); publishing anyway", job.job_id));
            None
        }
    };
    let (cfg, warning) = settings.mqtt_for(rec);
    if let Some(w) = warning {
        diag(w);
    }
    let shot = Shot {
        cfg: &cfg,
        job: &job,
        event: None,
        last_event: "closed",
        seq,
        with_state: true,
        budget: Some(settings.budget),
    };
    let report = send_one_shot(settings, store, &shot, diag);
    drop(l3);
    match (&report.error, &report.state_skipped) {
        (Some(e), _) => Err(format!("job {}: close state not published ({e})", job.job_id)),
        (None, Some(why)) => Err(format!("job {}: close state not published: {why}", job.job_id)),
        (None, None) => Ok(report),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctx::Ctx;

    #[test]
    fn events_parse_and_classify() {
        for name in Event::ALL {
            let e = Event::parse(name).unwrap();
            assert_eq!(e.name(), *name);
            assert_eq!(e.is_terminal(), crate::registry::is_terminal(name));
        }
        assert!(Event::parse("beat").is_none());
    }

    #[test]
    fn data_over_the_callers_limit_is_refused_before_the_record_is_read() {
        let store = Store::new("/nonexistent/mam/jobs".into(), "/nonexistent/mam/logs".into());
        let ctx = Ctx::with_env([("MQTT_PORT", "1")], Path::new("/"));
        let settings = Settings::from_ctx(&ctx).unwrap();
        let mut data = Map::new();
        data.insert("report".into(), "x".repeat(MAX_DATA).into());
        let req = Request {
            job_id: "j1".into(),
            event: Event::Completed,
            message: String::new(),
            data,
            attempt: None,
            dispatch_token: None,
            no_state: false,
        };
        let mut diag = |_: String| {};
        let e = publish(&store, &settings, &req, &mut diag, None).unwrap_err().to_string();
        assert_eq!(e, format!("job j1: data of {} bytes is more than {MAX_DATA}", MAX_DATA + 13));
        // A larger limit passes the check and gets as far as the (missing) record.
        let e = publish_with_limit(&store, &settings, &req, 4 * MAX_DATA, &mut diag).unwrap_err().to_string();
        assert!(e.contains("j1") && !e.contains("data of"), "{e}");
    }

    #[test]
    fn latest_line_and_audit_confirmation() {
        use std::fs;
        let dir = std::env::temp_dir().join(format!("mam-pubunit-{}", std::process::id()));
        fs::create_dir_all(dir.join("logs/j")).unwrap();
        let ev = dir.join("events.log");
        fs::write(
            &ev,
            concat!(
                r#"{"kind":"event","attempt":1,"event":"started","seq":1}"#,
                "\n",
                "not json\n",
                r#"{"kind":"event","attempt":2,"event":"started","seq":4}"#,
                "\n",
                r#"{"kind":"event","attempt":2,"event":"progress","seq":5}"#,
                "\n",
            ),
        )
        .unwrap();
        assert_eq!(latest_event_line(&ev, 2, "started").unwrap().unwrap().0, 4);
        assert_eq!(latest_event_line(&ev, 1, "started").unwrap().unwrap().0, 1);
        assert!(latest_event_line(&ev, 3, "started").unwrap().is_none());
        assert!(latest_event_line(&dir.join("none"), 1, "x").unwrap().is_none());
        audit::write_published_for_test(&dir.join("logs"), "j", &[(4, false), (5, true)]);
        assert!(!audit_confirms(&dir.join("logs"), "j", 4));
        assert!(audit_confirms(&dir.join("logs"), "j", 5));
        let _ = fs::remove_dir_all(&dir);
    }
}
