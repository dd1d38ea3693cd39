//! `report_event`: what `mam publish` does for one event (CORE 6.3, 6.4; A8), for the runner's
//! `started` and terminal events. It stands in for the publish library, which is written on another
//! branch: TODO(merge) replace the calls in `runner` with the publish library's entry point and
//! delete this file.
//!
//! Order is the spec's: engine decision with seq allocation under L1, then the signed event on
//! disk (events.log under its own lock), then the wire (event, then the retained state), then the
//! `published` audit entry. Terminal events raise the barrier and stop the timer first, and wait
//! out in-flight one-shot publishes on L3. It never prints; warnings go to the caller's `warn`.

use std::fmt;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use crate::clock;
use crate::heartbeat::timer_proc;
use crate::mqtt::{self, Client, Message, MqttConfig, RetryPolicy, Role, Stop};
use crate::registry::audit;
use crate::registry::engine::{Authority, Decision, Kind, Request};
use crate::registry::is_terminal;
use crate::registry::record::Record;
use crate::registry::store::{Store, StoreError};
use crate::sign;
use crate::sys::{self, Flock, LockMode};

/// How long a terminal waits for in-flight one-shot publishes (CORE 6.4 step 4).
const L3_WAIT: Duration = Duration::from_secs(30);
/// A8's default total wire budget of a non-terminal publish.
const PUBLISH_BUDGET: Duration = Duration::from_secs(20);
/// CORE 6.4 step 3's drain (`MAM_HEARTBEAT_DRAIN_S`, default 1).
const DRAIN: Duration = Duration::from_secs(1);

/// What happened to one event.
#[derive(Debug, PartialEq, Eq)]
pub enum Reported {
    /// On disk and on the wire.
    Published { seq: u64 },
    /// On disk; the wire failed after retries (rc 3 for `mam publish`).
    WireFailed { seq: u64, error: String },
    /// An idempotent repeat: no seq, nothing sent.
    Idempotent { status: String },
    /// Refused by the engine (rc 4): nothing written.
    Refused { reason: String },
}

/// Failures before anything reached the wire.
#[derive(Debug)]
pub enum ReportError {
    Store(StoreError),
    Io { what: &'static str, path: std::path::PathBuf, err: std::io::Error },
    Invalid(String),
}

impl fmt::Display for ReportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReportError::Store(e) => write!(f, "{e}"),
            ReportError::Io { what, path, err } => write!(f, "{}: {what} ({err})", crate::cli::show_path(path)),
            ReportError::Invalid(m) => f.write_str(m),
        }
    }
}

impl From<StoreError> for ReportError {
    fn from(e: StoreError) -> ReportError {
        ReportError::Store(e)
    }
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> ReportError + 'a {
    move |err| ReportError::Io { what, path: path.to_path_buf(), err }
}

/// Reports `event` (`started`, `progress`, `completed`, `failed`, `error`) for the job's current
/// attempt with `data`, as `mam publish --job-id <id> --event <event> --data <data>` would.
pub fn report_event(
    store: &Store,
    cfg: &MqttConfig,
    job_id: &str,
    event: &str,
    data: Map<String, Value>,
    cas: bool,
    warn: &mut dyn FnMut(String),
) -> Result<Reported, ReportError> {
    let rec = store.read_existing(job_id)?;
    let attempt =
        rec.attempt().ok_or_else(|| ReportError::Invalid(format!("record of job {job_id} has no attempt")))?;
    let token = rec
        .str("dispatch_token")
        .ok_or_else(|| ReportError::Invalid(format!("record of job {job_id} has no dispatch_token")))?
        .to_string();
    let request = |kind: Kind, status: Option<&str>, alloc: bool| {
        let mut r = Request::new(kind, Authority::Agent, job_id);
        r.attempt = Some(attempt);
        r.dispatch_token = Some(token.clone());
        r.alloc_seq = alloc;
        r.cas = cas;
        if let Some(s) = status {
            r = r.with_status(s);
        }
        r
    };
    let l3_path = store.registry.join(format!("{job_id}.publish.lock"));
    let terminal = matches!(event, "completed" | "failed" | "error");
    let (decision, l3) = if terminal {
        // CORE 6.4 steps 2-5: barrier, stop the timer under L2, wait out one-shot publishes, decide.
        match store.apply(&request(Kind::Barrier, Some(event), false), clock::now_ms())?.decision {
            Decision::Refused { reason } => return Ok(Reported::Refused { reason }),
            Decision::Idempotent { status } => return Ok(Reported::Idempotent { status }),
            _ => {}
        }
        stop_heartbeat(store, job_id, warn);
        let l3 = exclusive_l3(&l3_path, warn)?;
        (store.apply(&request(Kind::Terminal, Some(event), true), clock::now_ms())?.decision, l3)
    } else {
        let kind = if event == "started" { Kind::Claim } else { Kind::Progress };
        let l3 = Some(Flock::lock_path(&l3_path, LockMode::Shared).map_err(io("cannot lock", &l3_path))?);
        (store.apply(&request(kind, None, true), clock::now_ms())?.decision, l3)
    };
    let applied = match decision {
        Decision::Applied(a) => a,
        Decision::Refused { reason } => return Ok(Reported::Refused { reason }),
        Decision::Idempotent { status } => return Ok(Reported::Idempotent { status }),
        Decision::Invalid(m) => return Err(ReportError::Invalid(m)),
        Decision::UnknownJob => return Err(ReportError::Invalid(format!("unknown job '{job_id}'"))),
    };
    let seq = applied.seq.ok_or_else(|| ReportError::Invalid("the engine allocated no seq".into()))?;
    let auth = rec.str("auth_token").unwrap_or("").to_string();
    let prefix = match rec.str("topic_prefix") {
        Some(p) => p.to_string(),
        None => format!("{}/jobs/{job_id}", cfg.topic_root),
    };
    let ev = json!({
        "v": 1, "kind": "event", "job_id": job_id, "attempt": attempt, "dispatch_token": token,
        "agent_session": rec.str("agent_session").unwrap_or(""), "event": event, "seq": seq,
        "ts": clock::now_ts(), "heartbeat": false, "message": "", "data": Value::Object(data),
    });
    let Value::Object(ev) = ev else { unreachable!("json! object") };
    let ev = sign::signed(auth.as_bytes(), ev).map_err(|e| ReportError::Invalid(e.to_string()))?;
    let ev_bytes = serde_json::to_vec(&ev).map_err(|e| ReportError::Invalid(e.to_string()))?;

    // CORE 6.3 step 4: on disk before the broker is contacted.
    let dir = store.registry.join(job_id);
    sys::create_dir_all(&dir).map_err(io("cannot create directory", &dir))?;
    let log = dir.join("events.log");
    let mut line = ev_bytes.clone();
    line.push(b'\n');
    sys::append_locked(&log, &line).map_err(io("cannot append", &log))?;

    let mut attempts = 0u32;
    let mut state_sent = false;
    let policy = if terminal {
        RetryPolicy::standard("publish")
    } else {
        RetryPolicy::standard("publish").with_budget(PUBLISH_BUDGET)
    };
    let sent = mqtt::with_retry(&policy, &Stop::never(), &mut *warn, |_| {
        attempts += 1;
        let mut c = Client::connect(cfg, Role::Pub, &Stop::never())?;
        c.publish(&Message::new(format!("{prefix}/events"), ev_bytes.clone(), 1, false))?;
        // A8 / CORE 6.3 step 5: the state is rebuilt from a fresh read before every send.
        if let Some(state) = state_payload(store, job_id, event, seq, &auth) {
            c.publish(&Message::new(format!("{prefix}/state"), state, 1, true))?;
            state_sent = true;
        }
        c.disconnect();
        Ok(())
    });
    drop(l3);
    let mut rest = json!({"seq": seq, "event": event, "published": sent.is_ok(), "state_published": state_sent,
                          "attempts": attempts});
    if let Err(e) = &sent {
        rest["error"] = e.to_string().into();
    }
    let entry = audit::entry(clock::now_ms(), job_id, Some(attempt), "published", rest);
    if let Err(e) = audit::flush(&store.logs, job_id, &[entry], None) {
        warn(format!(
            "WARNING: {}: audit not written ({e})",
            crate::cli::show_path(&audit::job_dir(&store.logs, job_id))
        ));
    }
    Ok(match sent {
        Ok(()) => Reported::Published { seq },
        Err(e) => Reported::WireFailed { seq, error: e.to_string() },
    })
}

/// The retained state after `event`, from a fresh read of the record; `None` (with no state sent)
/// when a non-terminal event finds the attempt ended or its barrier raised (CORE 6.3 step 5).
fn state_payload(store: &Store, job_id: &str, event: &str, seq: u64, auth: &str) -> Option<Vec<u8>> {
    let rec: Record = store.read(job_id).ok().flatten()?;
    let terminal_event = matches!(event, "completed" | "failed" | "error");
    if !terminal_event && (is_terminal(rec.status()) || rec.u64("barrier_attempt") == rec.attempt()) {
        return None;
    }
    let st = json!({
        "v": 1, "kind": "state", "job_id": job_id, "attempt": rec.attempt(),
        "dispatch_token": rec.str("dispatch_token"), "status": rec.status(), "last_event": event,
        "seq": seq, "ts": clock::now_ts(),
    });
    let Value::Object(st) = st else { return None };
    let st = sign::signed(auth.as_bytes(), st).ok()?;
    serde_json::to_vec(&st).ok()
}

/// CORE 6.4 step 3 under L2: a timer of this job is drained and stopped before the terminal.
fn stop_heartbeat(store: &Store, job_id: &str, warn: &mut dyn FnMut(String)) {
    let l2_path = timer_proc::lifecycle_lock_path(&store.registry, job_id);
    match Flock::lock_path(&l2_path, LockMode::Exclusive) {
        Ok(_l2) => {
            if let Err(e) = timer_proc::stop(&store.registry, job_id, DRAIN) {
                warn(format!("WARNING: job {job_id}: cannot stop the heartbeat timer ({e})"));
            }
        }
        Err(e) => warn(format!("WARNING: {}: cannot lock ({e})", crate::cli::show_path(&l2_path))),
    }
}

/// CORE 6.4 step 4: L3 exclusive, polled every 50 ms for up to 30 s; after that, go on with a warning.
fn exclusive_l3(path: &Path, warn: &mut dyn FnMut(String)) -> Result<Option<Flock>, ReportError> {
    let until = Instant::now() + L3_WAIT;
    loop {
        let f = sys::open_lock_file(path).map_err(io("cannot open lock", path))?;
        if let Some(l) = Flock::try_acquire(f, LockMode::Exclusive).map_err(io("cannot lock", path))? {
            return Ok(Some(l));
        }
        if Instant::now() >= until {
            warn(format!(
                "WARNING: {}: in-flight publishes still hold the lock after 30s; continuing",
                crate::cli::show_path(path)
            ));
            return Ok(None);
        }
        sys::sleep(Duration::from_millis(50));
    }
}
