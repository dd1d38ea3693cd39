//! The runner (`mam remote run`, CORE 9.3; A12, A21): a reader thread keeps one subscription to
//! `<root>/jobs/+/state` and `<root>/jobs/+/dispatch/+`, remembers which attempts the wire shows as
//! started (a verified state), filters what arrives and queues admitted dispatches in arrival order
//! (at most 100); the calling thread takes them one at a time, drops the stale ones and those whose
//! attempt already has a state (a replay, issue 12 item 6), mirrors the
//! job through the engine, reports `started` and arms the heartbeat timer on the runner's own pid,
//! runs `sh -c CMD` in its own session and process group, reports the terminal event, and clears
//! the attempt's retained dispatch. Events go through the publish library, the one publish path.
//!
//! Owns: the queue, the process-group escalation (TERM, grace, KILL, and only then the `error`
//! event), the report tail (A12). It never prints (lines go to the caller's `Log`), never puts the
//! dispatch secret in a record, argv or a child's environment, and never runs two jobs at once.

use std::collections::{HashMap, VecDeque};
use std::ffi::OsString;
use std::fmt;
use std::fs;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use super::dispatch::{self, Dispatch, Judged};
use crate::clock;
use crate::heartbeat::timer::{self, StartSpec, TimerError};
use crate::mqtt::{self, Client, Message, MqttError, Persistent, RetryPolicy, Role, Stop};
use crate::publish::{self, Event, Outcome};
use crate::registry::engine::{Authority, Kind, Request};
use crate::registry::store::{Decided, Store};
use crate::sys;
use crate::text::{one_line, show_path};
use crate::wire::Settings;

/// A21: the queue bound.
pub const QUEUE_LIMIT: usize = 100;
/// The most jobs whose started attempt the runner remembers (one small entry each).
pub const SEEN_LIMIT: usize = 100_000;
/// A12: the most of MAM_REPORT_FILE a terminal event carries.
pub const MAX_REPORT: usize = 256 * 1024;
/// The `data` limit the runner gives the publish library: the report of A12 once JSON-escaped, with
/// room for the envelope under the embedded broker's 1 MiB packet limit. A report whose escaped
/// form is larger still is cut further (`report_data`). The CLI's `--data` keeps its 64 KiB.
pub const MAX_EVENT_DATA: usize = 768 * 1024;
/// How long the runner waits for a KILLed group to be gone before reporting anyway.
const KILL_WAIT: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(50);
const BACKOFF_FIRST: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Where the runner's log lines go (one line each, no trailing newline).
pub type Log = Arc<dyn Fn(&str) + Send + Sync>;

/// Everything one runner needs.
#[derive(Clone)]
pub struct Runner {
    /// NAME of `remote:NAME`.
    pub session: String,
    pub exec: String,
    pub store: Store,
    /// The broker (its `mqtt`), the wire budget, the drain and `MAM_ENGINE_CAS`, as `mam publish`
    /// reads them.
    pub settings: Settings,
    /// What every job's heartbeat timer is started with (executable, environment without the
    /// dispatch secret, cwd, drain); the job, interval, watched pid and lifetime are filled in.
    pub timer: StartSpec,
    pub secret: Vec<u8>,
    /// `--timeout`: used when a dispatch's `timeout_sec` is 0 (CORE 9.1, default 3600 s).
    pub default_timeout: Duration,
    pub once: bool,
    /// TERM-to-KILL grace (CORE 9.3: 5 s; `MAM_RUNNER_GRACE_MS` shortens it in tests).
    pub grace: Duration,
    /// The environment for `CMD`: the caller's `child_env_for(ChildRole::Agent)` (no secret).
    pub child_env: Vec<(OsString, OsString)>,
}

impl fmt::Debug for Runner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The secret never reaches a log line (A2), not even a debug print.
        f.debug_struct("Runner").field("session", &self.session).field("exec", &self.exec).finish_non_exhaustive()
    }
}

#[derive(Debug)]
pub enum RunnerError {
    /// The initial connect or subscribe failed after retries (rc 3).
    Connect(MqttError),
    /// The reader thread could not be started.
    Thread(std::io::Error),
}

impl fmt::Display for RunnerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunnerError::Connect(e) => write!(f, "{e}"),
            RunnerError::Thread(e) => write!(f, "cannot start the reader thread: {e}"),
        }
    }
}

/// What `enqueue` did.
#[derive(Debug, PartialEq)]
pub enum Enqueued {
    /// The same job, attempt and token is already waiting.
    Duplicate,
    /// Queued; `dropped` is the entry pushed out of a full queue (the oldest stale one, else the
    /// oldest).
    Queued { dropped: Option<Dispatch> },
}

/// A21's queue rule, pure: arrival order, one entry per attempt, bounded at `limit`.
pub fn enqueue(q: &mut VecDeque<Dispatch>, d: Dispatch, now_ms: u64, limit: usize) -> Enqueued {
    if q.iter().any(|x| x.same_attempt(&d)) {
        return Enqueued::Duplicate;
    }
    let mut dropped = None;
    if q.len() >= limit {
        let i = q.iter().position(|x| x.is_stale(now_ms)).unwrap_or(0);
        dropped = q.remove(i);
    }
    q.push_back(d);
    Enqueued::Queued { dropped }
}

/// A12: the last `limit` bytes of a report, cut forward to a UTF-8 character boundary, and how many
/// bytes were dropped when it was cut (so a trailing `VERDICT:` line survives).
pub fn report_tail(bytes: &[u8], limit: usize) -> (String, Option<u64>) {
    if bytes.len() <= limit {
        return (String::from_utf8_lossy(bytes).into_owned(), None);
    }
    let mut start = bytes.len() - limit;
    while start < bytes.len() && bytes[start] & 0xC0 == 0x80 {
        start += 1;
    }
    (String::from_utf8_lossy(&bytes[start..]).into_owned(), Some(start as u64))
}

/// The latest attempt of a job the wire shows a verified state for: that attempt was claimed (or
/// closed) somewhere, so its dispatch must not run again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub attempt: u64,
    pub dispatch_token: String,
    pub status: String,
}

/// A state message for a remote job, verified with the auth token the dispatch secret derives
/// (CORE 9.2): `(job_id, what it shows)`, or `None` for anything else (a local job's state, a
/// forgery, a cleared topic). Pure.
pub fn verified_state(topic: &str, payload: &[u8], secret: &[u8]) -> Option<(String, Seen)> {
    let v: Value = serde_json::from_slice(payload).ok()?;
    if v.get("v").and_then(Value::as_u64) != Some(1) || v.get("kind").and_then(Value::as_str) != Some("state") {
        return None;
    }
    let job_id = v.get("job_id")?.as_str()?;
    let level = crate::mqtt::config::job_topic_level(job_id);
    let on_topic = |l: &str| topic.ends_with(&format!("/jobs/{l}/state"));
    if !crate::clock::valid_job_id(job_id) || !(on_topic(&level) || on_topic(job_id)) {
        return None;
    }
    let attempt = v.get("attempt")?.as_u64()?;
    let token = v.get("dispatch_token")?.as_str()?;
    let key = crate::registry::remote_auth_token(secret, job_id, attempt, token);
    if !crate::sign::verify(key.as_bytes(), &v) {
        return None;
    }
    let status = v.get("status")?.as_str()?.to_string();
    Some((job_id.to_string(), Seen { attempt, dispatch_token: token.to_string(), status }))
}

/// True when `seen` shows the dispatch's attempt as started or superseded (issue 12 item 6).
pub fn already_served(seen: Option<&Seen>, d: &Dispatch) -> bool {
    seen.is_some_and(|s| s.attempt > d.attempt || (s.attempt == d.attempt && s.dispatch_token == d.dispatch_token))
}

#[derive(Default)]
struct Shared {
    queue: Mutex<VecDeque<Dispatch>>,
    /// Per job: the latest attempt with a verified state on the wire.
    seen: Mutex<HashMap<String, Seen>>,
    cv: Condvar,
    shutdown: AtomicBool,
    initial: Mutex<Option<Result<(), MqttError>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Serves dispatches until a signal (or, with `--once`, until one job ran). Returns after the
/// reader thread is joined; a job in progress when a signal arrives is stopped and reported first.
pub fn run(r: &Runner, log: Log) -> Result<(), RunnerError> {
    let shared = Arc::new(Shared::default());
    let reader = {
        let (sh, r2, lg) = (shared.clone(), r.clone(), log.clone());
        thread::Builder::new()
            .name("remote-reader".into())
            .spawn(move || read_loop(&sh, &r2, &lg))
            .map_err(RunnerError::Thread)?
    };
    let initial = {
        let mut g = lock(&shared.initial);
        while g.is_none() {
            g = shared.cv.wait_timeout(g, POLL).map(|(g, _)| g).unwrap_or_else(|e| e.into_inner().0);
        }
        g.take()
    };
    if let Some(Err(e)) = initial {
        let _ = reader.join();
        // A signal while connecting is a request to stop, not a broker failure.
        if sys::pending_signal().is_some() {
            return Ok(());
        }
        return Err(RunnerError::Connect(e));
    }
    loop {
        if sys::pending_signal().is_some() {
            break;
        }
        let next = {
            let mut q = lock(&shared.queue);
            if q.is_empty() {
                q = shared
                    .cv
                    .wait_timeout(q, Duration::from_millis(200))
                    .map(|(g, _)| g)
                    .unwrap_or_else(|e| e.into_inner().0);
            }
            q.pop_front()
        };
        let Some(d) = next else { continue };
        // A21: staleness is judged when the job is taken, not when it arrived.
        if d.is_stale(clock::now_ms()) {
            log(&format!("stale dispatch ignored job={} attempt={}", d.job_id, d.attempt));
            continue;
        }
        // Issue 12 item 6: a captured dispatch replayed to a runner without the mirror record (a
        // fresh registry) must not run again: the wire's retained state shows the attempt began.
        // With a local record, the mirror admission decides (and audits) as before.
        let no_record = matches!(r.store.read(&d.job_id), Ok(None));
        if let Some(s) = lock(&shared.seen).get(&d.job_id).filter(|s| no_record && already_served(Some(s), &d)) {
            log(&format!(
                "dispatch already served job={} attempt={} (state {} of attempt {} on the wire); not run again",
                d.job_id,
                d.attempt,
                one_line(&s.status),
                s.attempt
            ));
            continue;
        }
        match serve(r, &d, &log) {
            Served::Skipped => {}
            Served::Ran { interrupted } => {
                if interrupted || r.once {
                    break;
                }
            }
        }
    }
    shared.shutdown.store(true, Ordering::SeqCst);
    shared.cv.notify_all();
    let _ = reader.join();
    Ok(())
}

/// The broker side (A21): its own thread and connection, so dispatches are read while a job runs.
fn read_loop(shared: &Arc<Shared>, r: &Runner, log: &Log) {
    let stop = {
        let sh = shared.clone();
        Stop::from_fn(move || sys::pending_signal().is_some() || sh.shutdown.load(Ordering::SeqCst))
    };
    let filter = format!("{}/jobs/+/dispatch/+", r.settings.mqtt.topic_root);
    // States first: a broker replays retained messages filter by filter, so a job's retained state
    // is known before its retained dispatch is queued.
    let filters = [format!("{}/jobs/+/state", r.settings.mqtt.topic_root), filter.clone()];
    let mut conn = Persistent::new(r.settings.mqtt.clone(), Role::Rmt, stop.clone());
    let subscribed =
        mqtt::with_retry(&RetryPolicy::standard("subscribe"), &stop, |w| log(&w), |_| conn.subscribe(&filters, 1));
    let ok = subscribed.is_ok();
    *lock(&shared.initial) = Some(subscribed.map(|_| ()));
    shared.cv.notify_all();
    if !ok {
        return;
    }
    log(&format!("subscribed topic={filter} session=remote:{}", r.session));
    let mut down: Option<(Instant, Duration, Instant)> = None;
    while !stop.is_set() {
        match down.as_mut() {
            None => match conn.recv(Instant::now() + Duration::from_millis(200)) {
                Ok(Some(m)) => on_message(shared, r, log, &m.topic, &m.payload),
                Ok(None) | Err(MqttError::Stopped) => {}
                Err(e) => {
                    log(&format!("broker down ({e}); reconnecting"));
                    conn.drop_connection();
                    let now = Instant::now();
                    down = Some((now, BACKOFF_FIRST, now + BACKOFF_FIRST));
                }
            },
            Some((since, backoff, next_try)) => {
                let now = Instant::now();
                if now < *next_try {
                    sys::sleep((*next_try - now).min(Duration::from_millis(100)));
                    continue;
                }
                match conn.client().map(|_| ()) {
                    Ok(()) => {
                        log(&format!("broker up after {}ms", since.elapsed().as_millis()));
                        down = None;
                    }
                    Err(MqttError::Stopped) => {}
                    Err(_) => {
                        *backoff = (*backoff * 2).min(BACKOFF_MAX);
                        *next_try = Instant::now() + *backoff;
                    }
                }
            }
        }
    }
    conn.drop_connection();
}

fn on_message(shared: &Shared, r: &Runner, log: &Log, topic: &str, payload: &[u8]) {
    if topic.ends_with("/state") {
        if let Some((id, s)) = verified_state(topic, payload, &r.secret) {
            let mut seen = lock(&shared.seen);
            let newer = seen.get(&id).is_none_or(|old| s.attempt >= old.attempt);
            if newer && (seen.len() < SEEN_LIMIT || seen.contains_key(&id)) {
                seen.insert(id, s);
            }
        }
        return;
    }
    match dispatch::judge(topic, payload, &r.secret, &r.session) {
        Judged::Cleared | Judged::ForeignSession => {}
        // The topic is the sender's text: one escaped line (issue 12 item 10).
        Judged::BadSignature => log(&format!("dropped: bad signature topic={}", one_line(topic))),
        Judged::Malformed(why) => log(&format!("dropped: {} topic={}", one_line(&why), one_line(topic))),
        Judged::Ok(d) => {
            let (id, attempt) = (d.job_id.clone(), d.attempt);
            let res = enqueue(&mut lock(&shared.queue), d, clock::now_ms(), QUEUE_LIMIT);
            match res {
                Enqueued::Duplicate => {}
                Enqueued::Queued { dropped } => {
                    if let Some(x) = dropped {
                        log(&format!("queue full: dropped dispatch job={} attempt={}", x.job_id, x.attempt));
                    }
                    log(&format!("queued job={id} attempt={attempt}"));
                    shared.cv.notify_all();
                }
            }
        }
    }
}

enum Served {
    Skipped,
    Ran { interrupted: bool },
}

enum End {
    Exited(ExitStatus),
    Timeout(ExitStatus),
    Interrupted(Option<ExitStatus>),
    SpawnFailed(String),
}

fn serve(r: &Runner, d: &Dispatch, log: &Log) -> Served {
    let id = d.job_id.as_str();
    // CORE 9.3 step 3: mirror admission, one engine transaction, before any other write.
    let broker = serde_json::to_value(r.settings.mqtt.broker_block()).unwrap_or(Value::Null);
    let mut req = Request::new(Kind::Mirror, Authority::Agent, id);
    req.record = Some(d.mirror_record(broker, &r.store.registry, &r.secret));
    req.cas = r.settings.cas;
    match r.store.apply(&req, clock::now_ms()) {
        Ok(o) => {
            if let Some(w) = o.audit_error {
                log(&format!("WARNING: {w}"));
            }
            match o.decision {
                Decided::Applied(_) => log(&format!("admitted job={id} attempt={}", d.attempt)),
                Decided::Idempotent { .. } => {
                    log(&format!("already admitted job={id} attempt={}; not run again", d.attempt));
                    return Served::Skipped;
                }
                Decided::Refused { reason } => {
                    log(&format!("mirror refused job={id} attempt={} ({reason})", d.attempt));
                    return Served::Skipped;
                }
            }
        }
        Err(e) => {
            log(&format!("ERROR: job {id}: {e}"));
            return Served::Skipped;
        }
    }

    let dir = r.store.registry.join(id);
    let brief = dir.join("brief.md");
    let report = dir.join("report.md");
    let written = sys::create_dir_all(&dir).and_then(|_| sys::atomic_write(&brief, d.brief.as_bytes()));
    if let Err(e) = written {
        log(&format!("ERROR: {}: cannot write the brief ({e})", show_path(&brief)));
    }
    // A report left by an earlier attempt must not be sent as this attempt's.
    let _ = fs::remove_file(&report);

    let timeout = if d.timeout_sec > 0 { Duration::from_secs(d.timeout_sec) } else { r.default_timeout };
    if send_event(r, log, d, Event::Started, Map::new()) {
        arm_heartbeat(r, d, timeout, log);
    }

    let end = if sys::pending_signal().is_some() {
        End::Interrupted(None)
    } else {
        match spawn(r, d, &brief, &report) {
            Ok(child) => supervise(child, timeout, r.grace),
            Err(e) => End::SpawnFailed(e),
        }
    };

    let mut data = Map::new();
    let (event, rc, interrupted) = match &end {
        End::Exited(st) if st.success() => ("completed", 0, false),
        End::Exited(st) => {
            let rc = exit_code(st);
            data.insert("rc".into(), rc.into());
            ("failed", rc, false)
        }
        End::Timeout(st) => {
            data.insert("reason".into(), "timeout".into());
            ("error", exit_code(st), false)
        }
        End::Interrupted(st) => {
            data.insert("reason".into(), "interrupted".into());
            ("error", st.as_ref().map_or(128 + i64::from(sys::pending_signal().unwrap_or(15)), exit_code), true)
        }
        End::SpawnFailed(e) => {
            log(&format!("ERROR: job {id}: {e}"));
            data.insert("reason".into(), "spawn_failed".into());
            ("error", 127, false)
        }
    };
    if let Some((bytes, skipped)) = read_report(&report) {
        report_data(&mut data, &bytes, skipped, MAX_EVENT_DATA);
    }
    let event = Event::parse(event).unwrap_or(Event::Error);
    send_event(r, log, d, event, data);
    log(&format!("DONE rc={rc} job={id}"));
    clear_dispatch(r, d, log);
    Served::Ran { interrupted }
}

fn exit_code(st: &ExitStatus) -> i64 {
    use std::os::unix::process::ExitStatusExt;
    st.code().map_or_else(|| 128 + i64::from(st.signal().unwrap_or(0)), i64::from)
}

/// The last `MAX_REPORT` bytes of the job's report and how many bytes before them were not read
/// (issue 12 item 8: a job may leave a report of any size; only its tail is ever read). Anything
/// but a regular file (a FIFO, a device behind a link) is no report.
fn read_report(path: &Path) -> Option<(Vec<u8>, u64)> {
    use std::io::{Read, Seek, SeekFrom};
    if !fs::metadata(path).ok()?.is_file() {
        return None;
    }
    let mut f = fs::File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    let start = len.saturating_sub(MAX_REPORT as u64);
    f.seek(SeekFrom::Start(start)).ok()?;
    let mut bytes = Vec::with_capacity((len - start) as usize);
    f.take(MAX_REPORT as u64).read_to_end(&mut bytes).ok()?;
    Some((bytes, start))
}

/// A12 inside the event limit: the report's last `MAX_REPORT` bytes (`bytes`, read after
/// `skipped` bytes that were left unread), cut further (halving) while the JSON-escaped `data`
/// would exceed `max_data`, with `report_truncated` (all bytes dropped) when anything was cut.
pub fn report_data(data: &mut Map<String, Value>, bytes: &[u8], skipped: u64, max_data: usize) {
    // Reading started at an arbitrary byte: a cut character's continuation bytes go too.
    let mut lead = 0;
    if skipped > 0 {
        while lead < bytes.len() && bytes[lead] & 0xC0 == 0x80 {
            lead += 1;
        }
    }
    let (bytes, skipped) = (&bytes[lead..], skipped + lead as u64);
    let mut limit = MAX_REPORT;
    loop {
        let (text, cut) = report_tail(bytes, limit);
        data.insert("report".into(), text.into());
        match skipped + cut.unwrap_or(0) {
            0 => data.remove("report_truncated"),
            n => data.insert("report_truncated".into(), n.into()),
        };
        if publish::data_len(data) <= max_data || limit == 0 {
            return;
        }
        limit /= 2;
    }
}

/// CORE 9.3 step 4: the `--heartbeat N` half of `started`. The timer beats every N s for this
/// attempt and watches the runner's own pid, so a runner killed with SIGKILL stops beating within
/// N+1 s (M7). Its lifetime is the job's timeout plus its idle window (CORE 7.1).
fn arm_heartbeat(r: &Runner, d: &Dispatch, timeout: Duration, log: &Log) {
    let id = d.job_id.as_str();
    let interval = match u32::try_from(d.heartbeat_sec) {
        Ok(n) if n > 0 => n,
        _ => {
            log(&format!("WARNING: job {id}: heartbeat_sec {} is not usable; no heartbeat timer", d.heartbeat_sec));
            return;
        }
    };
    let mut spec = r.timer.clone();
    spec.attempt = Some(d.attempt);
    spec.dispatch_token = Some(d.dispatch_token.clone());
    spec.interval = interval;
    spec.watch_pid = std::process::id() as i32;
    spec.lifetime = timer::default_lifetime(timeout.as_secs().max(1), d.idle_timeout_sec);
    match timer::start_timer(&r.store, id, &spec) {
        Ok(started) => {
            if let Some(w) = started.replaced.as_ref().and_then(|s| timer::stopped_warning(s, spec.drain)) {
                log(&w);
            }
            log(&format!("heartbeat armed job={id} pid={} interval={interval}s", started.pid));
        }
        Err(TimerError::AttemptEnded { why, .. }) => {
            log(&format!("WARNING: job {id}: heartbeat timer not armed: attempt ended ({why})"))
        }
        Err(e) => log(&format!("WARNING: job {id}: heartbeat timer not started ({e})")),
    }
}

/// `sh -c CMD` in its own session and process group, stdin /dev/null, output appended to
/// `<logs>/<job_id>/exec.log`, and the job's variables (CORE 9.3 step 5). The dispatch secret is
/// not passed on: the command reports with the job's auth token, which the mirror record holds.
fn spawn(r: &Runner, d: &Dispatch, brief: &Path, report: &Path) -> Result<Child, String> {
    let log_dir = r.store.logs.join(&d.job_id);
    let log_path = log_dir.join("exec.log");
    let out = sys::create_dir_all(&log_dir)
        .and_then(|_| sys::open_append(&log_path))
        .map_err(|e| format!("{}: cannot open ({e})", show_path(&log_path)))?;
    let err = out.try_clone().map_err(|e| format!("{}: cannot open ({e})", show_path(&log_path)))?;
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(&r.exec)
        .env_clear()
        .envs(r.child_env.iter().cloned())
        .env("MAM_JOB_ID", &d.job_id)
        .env("MAM_ATTEMPT", d.attempt.to_string())
        .env("MAM_BRIEF_FILE", brief)
        .env("MAM_REPORT_FILE", report)
        .env("MAM_REGISTRY_DIR", &r.store.registry)
        .env("DELEGATE_JOB_LOGS_DIR", &r.store.logs)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    sys::set_new_session(&mut cmd);
    sys::spawn(&mut cmd).map_err(|e| format!("cannot run sh -c for job {}: {e}", d.job_id))
}

/// Waits for the job's shell; on timeout or a signal to the runner, stops its whole group.
fn supervise(mut child: Child, timeout: Duration, grace: Duration) -> End {
    let deadline = Instant::now() + timeout;
    let pgid = child.id() as i32;
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return End::Exited(st),
            Ok(None) => {}
            Err(_) => return End::Exited(stop_group(&mut child, pgid, grace)),
        }
        if sys::pending_signal().is_some() {
            return End::Interrupted(Some(stop_group(&mut child, pgid, grace)));
        }
        if Instant::now() >= deadline {
            return End::Timeout(stop_group(&mut child, pgid, grace));
        }
        sys::sleep(POLL);
    }
}

/// `killpg` TERM, up to `grace` for the group to go, then KILL; returns once the group is gone
/// (or `KILL_WAIT` passed) so the `error` event is published only after the processes died.
fn stop_group(child: &mut Child, pgid: i32, grace: Duration) -> ExitStatus {
    let _ = sys::kill(-pgid, libc::SIGTERM);
    let mut status = None;
    let gone = |status: &mut Option<ExitStatus>, child: &mut Child| {
        if status.is_none() {
            *status = child.try_wait().ok().flatten();
        }
        status.is_some() && !sys::group_alive(pgid)
    };
    let until = Instant::now() + grace;
    while !gone(&mut status, child) && Instant::now() < until {
        sys::sleep(POLL);
    }
    if !gone(&mut status, child) {
        let _ = sys::kill(-pgid, libc::SIGKILL);
        let until = Instant::now() + KILL_WAIT;
        while !gone(&mut status, child) && Instant::now() < until {
            sys::sleep(Duration::from_millis(20));
        }
    }
    match status {
        Some(st) => st,
        None => child.wait().unwrap_or_else(|_| {
            use std::os::unix::process::ExitStatusExt;
            ExitStatus::from_raw(libc::SIGKILL)
        }),
    }
}

/// Reports one event for the dispatch's attempt through the publish library, as `mam publish
/// --job-id <id> --event <event> --attempt A --dispatch-token T --data <data>` would (with the
/// runner's larger data limit), and logs `published <event> job=<id> seq=<n>`. True when the event
/// is recorded for this attempt (new or a repeat), so a timer may be armed after `started`.
fn send_event(r: &Runner, log: &Log, d: &Dispatch, event: Event, data: Map<String, Value>) -> bool {
    let (id, name) = (d.job_id.as_str(), event.name());
    let req = publish::Request {
        job_id: id.to_string(),
        event,
        message: String::new(),
        data,
        attempt: Some(d.attempt),
        dispatch_token: Some(d.dispatch_token.clone()),
        no_state: false,
    };
    let mut warn = |w: String| log(&w);
    match publish::publish_with_limit(&r.store, &r.settings, &req, MAX_EVENT_DATA, &mut warn) {
        Ok(Outcome::Published { seq, report }) => {
            if let Some(why) = &report.state_skipped {
                log(&format!("WARNING: state not published: {why}"));
            }
            match &report.error {
                None => log(&format!("published {name} job={id} seq={seq}")),
                Some(e) => log(&format!("WARNING: {name} of job {id} recorded (seq={seq}) but not published: {e}")),
            }
            true
        }
        Ok(Outcome::Repeat { status, resent }) => {
            log(&format!("already {status}; nothing new to publish job={id}"));
            if let Some((seq, rep)) = resent {
                if let Some(e) = &rep.error {
                    log(&format!("WARNING: {name} of job {id} seq={seq} (resent) not published: {e}"));
                }
            }
            true
        }
        Ok(Outcome::Refused { reason }) => {
            log(&format!("REFUSED: {id}: {name} ({reason})"));
            false
        }
        Err(e) => {
            log(&format!("ERROR: {name} of job {id}: {e}"));
            false
        }
    }
}

/// CORE 9.3 step 7: an empty retained payload on the attempt's dispatch topic.
fn clear_dispatch(r: &Runner, d: &Dispatch, log: &Log) {
    let topic = dispatch::topic(&d.topic_prefix, d.attempt);
    let cleared = mqtt::with_retry(
        &RetryPolicy::standard("publish"),
        &Stop::never(),
        |w| log(&w),
        |_| {
            let mut c = Client::connect(&r.settings.mqtt, Role::Rmt, &Stop::never())?;
            c.publish(&Message::new(topic.clone(), Vec::new(), 1, true))?;
            c.disconnect();
            Ok(())
        },
    );
    match cleared {
        Ok(()) => log(&format!("cleared dispatch topic={topic}")),
        Err(e) => log(&format!("WARNING: cannot clear the dispatch on {topic}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(id: &str, issued: u64) -> Dispatch {
        Dispatch {
            job_id: id.into(),
            attempt: 1,
            dispatch_token: "t".into(),
            agent_session: "remote:x".into(),
            job_type: "task".into(),
            iteration: 1,
            brief: String::new(),
            heartbeat_sec: 1,
            heartbeat_misses: 1,
            ack_timeout_sec: 0,
            idle_timeout_sec: 1,
            timeout_sec: 0,
            issued_at_ms: issued,
            parent_job_id: None,
            orchestrator_uuid: None,
            topic_prefix: format!("mam/jobs/{id}"),
        }
    }

    #[test]
    fn a21_queue_keeps_order_drops_duplicates_and_the_oldest_stale_when_full() {
        let mut q = VecDeque::new();
        let now = 1_000_000;
        assert_eq!(enqueue(&mut q, d("a", now), now, 3), Enqueued::Queued { dropped: None });
        assert_eq!(enqueue(&mut q, d("a", now), now, 3), Enqueued::Duplicate);
        enqueue(&mut q, d("stale", 0), now, 3);
        enqueue(&mut q, d("b", now), now, 3);
        let Enqueued::Queued { dropped: Some(x) } = enqueue(&mut q, d("c", now), now, 3) else { panic!() };
        assert_eq!(x.job_id, "stale");
        let ids: Vec<&str> = q.iter().map(|x| x.job_id.as_str()).collect();
        assert_eq!(ids, ["a", "b", "c"]);
        let Enqueued::Queued { dropped: Some(x) } = enqueue(&mut q, d("e", now), now, 3) else { panic!() };
        assert_eq!(x.job_id, "a", "no stale entry: the oldest goes");
    }

    #[test]
    fn a12_report_data_fits_the_event_limit() {
        let mut data = Map::new();
        data.insert("rc".into(), 1.into());
        report_data(&mut data, b"ok\n", 0, MAX_EVENT_DATA);
        assert_eq!((data["report"].as_str(), data.get("report_truncated")), (Some("ok\n"), None));
        // Control characters escape to six bytes each: 256 KiB of them is cut until it fits.
        let ctl = vec![1u8; 300 * 1024];
        report_data(&mut data, &ctl, 0, MAX_EVENT_DATA);
        assert!(publish::data_len(&data) <= MAX_EVENT_DATA);
        let kept = data["report"].as_str().unwrap().len();
        assert!((64 * 1024..MAX_REPORT).contains(&kept), "{kept}");
        assert_eq!(data["report_truncated"].as_u64(), Some((ctl.len() - kept) as u64));
        assert_eq!(data["rc"], 1);
        // Plain text keeps the whole 256 KiB tail, well over the CLI's 64 KiB.
        report_data(&mut data, &vec![b'x'; 300 * 1024], 0, MAX_EVENT_DATA);
        assert_eq!(data["report"].as_str().unwrap().len(), MAX_REPORT);
        // Bytes left unread before the tail count as dropped; a cut character at the start goes.
        let mut tail = "é".as_bytes()[1..].to_vec();
        tail.extend_from_slice(b"VERDICT: ok\n");
        report_data(&mut data, &tail, 3_000_000_000, MAX_EVENT_DATA);
        assert_eq!(data["report"].as_str(), Some("VERDICT: ok\n"));
        assert_eq!(data["report_truncated"].as_u64(), Some(3_000_000_001));
    }

    #[test]
    fn a12_report_tail_cuts_on_a_char_boundary() {
        assert_eq!(report_tail(b"short", 10), ("short".to_string(), None));
        let text = "ééé\nVERDICT: ok\n"; // each é is 2 bytes
        assert_eq!(text.len(), 19);
        let (tail, cut) = report_tail(text.as_bytes(), 15);
        assert_eq!((tail.as_str(), cut), ("é\nVERDICT: ok\n", Some(4)));
        let (tail, cut) = report_tail(text.as_bytes(), 14);
        assert_eq!((tail.as_str(), cut), ("\nVERDICT: ok\n", Some(6)), "a split é is skipped, not mangled");
    }

    #[test]
    fn a_verified_state_marks_its_attempt_served() {
        let secret = b"s3cret";
        let state = |id: &str, attempt: u64, token: &str, key: &str| {
            let v = serde_json::json!({"v": 1, "kind": "state", "job_id": id, "attempt": attempt,
                "dispatch_token": token, "status": "completed", "last_event": "completed", "seq": 2,
                "ts": "2026-01-01T00:00:00.000Z"});
            serde_json::to_vec(&crate::sign::signed(key.as_bytes(), v.as_object().unwrap().clone()).unwrap()).unwrap()
        };
        let key = crate::registry::remote_auth_token(secret, "a", 1, "t");
        let (id, seen) = verified_state("mam/jobs/a/state", &state("a", 1, "t", &key), secret).unwrap();
        assert_eq!((id.as_str(), seen.attempt, seen.status.as_str()), ("a", 1, "completed"));
        // A local job's key, another job's topic, a cleared topic: not evidence.
        assert!(verified_state("mam/jobs/a/state", &state("a", 1, "t", "local-token"), secret).is_none());
        assert!(verified_state("mam/jobs/b/state", &state("a", 1, "t", &key), secret).is_none());
        assert!(verified_state("mam/jobs/a/state", b"", secret).is_none());
        let mut disp = d("a", 0);
        assert!(already_served(Some(&seen), &disp));
        disp.attempt = 2;
        assert!(!already_served(Some(&seen), &disp), "a newer attempt runs");
        disp.attempt = 1;
        disp.dispatch_token = "other".into();
        assert!(!already_served(Some(&seen), &disp), "another token of the attempt is the engine's to refuse");
        assert!(!already_served(None, &disp));
    }
}
