//! The heartbeat timer's ownership operations and loop (CORE 7.3-7.5, A16, A17, A31): `start_timer`
//! and `stop_timer` under the lifecycle lock L2, and `run`, the detached `mam heartbeat run` process
//! that sends a signed `progress` beat every N s over one persistent connection.
//!
//! Architecture Invariant: a timer is signalled only after `timer_proc::is_our_timer` held; the
//! pidfile names at most one live timer, and it is written only while L2 is held by the spawner.
//! A beat is on disk (events.log) before a wire thread may send it; the beat cadence never waits
//! on the broker. Nothing here prints: the CLI passes a log callback (heartbeat.log). Once the
//! first beat is through the wire, the timer drops start-up's code pages (issue 20): what comes
//! back is the steady state's code, which the release link lays out together (build.rs).

use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Map};

use super::timer_proc::{self, is_our_timer, lifecycle_lock_path, pidfile_path, Pidfile, Stopped};
use crate::clock;
use crate::ctx::Ctx;
use crate::forward;
use crate::joblog::{append_event, events_log_path, prepare_events_log};
use crate::mqtt::{with_retry, Message, MqttConfig, Persistent, RetryPolicy, Role, Stop};
use crate::registry::audit;
use crate::registry::engine::{Authority, Kind, Request};
use crate::registry::is_terminal;
use crate::registry::store::{Decided, Store, StoreError};
use crate::sys::{self, Flock, LockMode};
use crate::text::show_path;
use crate::wire::{self, EventFields, Job, Progress, Settings};

/// Longest sleep slice of the timer loop (A17: SIGTERM is honoured within 100 ms).
pub const SLICE: Duration = Duration::from_millis(100);
/// How often the watched process and the pidfile are checked (CORE 7.5: at least once per second).
pub const CHECK_EVERY: Duration = Duration::from_secs(1);
/// Default lifetime without a job timeout (CORE 7.1, decided).
pub const DEFAULT_LIFETIME_S: u64 = 86_400;

/// The fault-injection point named by `MAM_FAULT_INJECT`, only in builds with `fault-inject`.
pub fn fault_from_ctx(ctx: &Ctx) -> Option<String> {
    if cfg!(feature = "fault-inject") {
        ctx.var_nonempty("MAM_FAULT_INJECT")
    } else {
        None
    }
}

/// The default lifetime (CORE 7.1): `timeout_sec + idle_timeout_sec` when the job has a timeout.
pub fn default_lifetime(timeout_sec: u64, idle_timeout_sec: u64) -> u64 {
    if timeout_sec > 0 {
        timeout_sec + idle_timeout_sec
    } else {
        DEFAULT_LIFETIME_S
    }
}

fn show_secs(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}", d.as_secs())
    } else {
        format!("{:.3}", d.as_secs_f64()).trim_end_matches('0').to_string()
    }
}

/// CORE 7.4 step 3's warning for a timer that had to be killed.
pub fn stopped_warning(s: &Stopped, drain: Duration) -> Option<String> {
    match s {
        Stopped::Killed { pid } => {
            Some(format!("WARNING: heartbeat timer {pid} did not drain in {}s; killed", show_secs(drain)))
        }
        _ => None,
    }
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> TimerError + 'a {
    move |err| TimerError::Io { what, path: path.to_path_buf(), err }
}

/// Why a timer operation failed.
#[derive(Debug)]
pub enum TimerError {
    /// start_timer step 1: nothing armed (rc 4 for `heartbeat start`).
    AttemptEnded {
        job_id: String,
        why: String,
    },
    Store(StoreError),
    Io {
        what: &'static str,
        path: PathBuf,
        err: io::Error,
    },
}

impl std::fmt::Display for TimerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TimerError::AttemptEnded { job_id, why } => write!(f, "{job_id}: attempt_ended ({why})"),
            TimerError::Store(e) => e.fmt(f),
            TimerError::Io { what, path, err } => write!(f, "{}: {what} ({err})", show_path(path)),
        }
    }
}

impl From<StoreError> for TimerError {
    fn from(e: StoreError) -> TimerError {
        TimerError::Store(e)
    }
}

fn lock_l2(registry: &Path, job_id: &str) -> Result<Flock, TimerError> {
    sys::create_dir_all(registry).map_err(io_err("cannot create registry directory", registry))?;
    let path = lifecycle_lock_path(registry, job_id);
    Flock::lock_path(&path, LockMode::Exclusive).map_err(io_err("cannot lock", &path))
}

fn audit_line(store: &Store, job_id: &str, attempt: Option<u64>, kind: &str, rest: serde_json::Value) {
    // Best effort: a timer that cannot write its audit line still stops or starts.
    let e = audit::entry(clock::now_ms(), job_id, attempt, kind, rest);
    let _ = audit::flush(&store.logs, job_id, &[e], None);
}

/// stop_timer with L2 already held: signal, drain, remove the pidfile, audit (CORE 7.4).
fn stop_locked(store: &Store, job_id: &str, drain: Duration) -> Result<Stopped, TimerError> {
    let path = pidfile_path(&store.registry, job_id);
    let attempt = Pidfile::read(&path).ok().flatten().map(|p| p.attempt);
    let stopped = timer_proc::stop(&store.registry, job_id, drain).map_err(io_err("cannot stop timer", &path))?;
    match stopped {
        Stopped::Drained { pid } => audit_line(store, job_id, attempt, "heartbeat_stopped", json!({"pid": pid})),
        Stopped::Killed { pid } => {
            audit_line(
                store,
                job_id,
                attempt,
                "heartbeat_killed",
                json!({"pid": pid, "drain_ms": drain.as_millis() as u64}),
            );
            audit_line(store, job_id, attempt, "heartbeat_stopped", json!({"pid": pid}));
        }
        Stopped::Nothing | Stopped::Stale => {}
    }
    Ok(stopped)
}

/// stop_timer(drain) (CORE 7.4): one ownership operation under L2, released on return.
pub fn stop_timer(store: &Store, job_id: &str, drain: Duration) -> Result<Stopped, TimerError> {
    if !store.registry.is_dir() {
        return Ok(Stopped::Nothing);
    }
    let _l2 = lock_l2(&store.registry, job_id)?;
    stop_locked(store, job_id, drain)
}

/// The pid of the job's live timer, if the pidfile names one that passes `is_our_timer`.
pub fn status(registry: &Path, job_id: &str) -> Option<i32> {
    let pf = Pidfile::read(&pidfile_path(registry, job_id)).ok().flatten()?;
    is_our_timer(&pf).then_some(pf.pid)
}

/// What `start_timer` arms.
#[derive(Debug, Clone)]
pub struct StartSpec {
    /// The caller's attempt and token; `None` takes the record's.
    pub attempt: Option<u64>,
    pub dispatch_token: Option<String>,
    pub interval: u32,
    /// 0 watches nothing.
    pub watch_pid: i32,
    pub lifetime: u64,
    pub drain: Duration,
    /// The `mam` executable the timer runs as.
    pub exe: PathBuf,
    /// The timer's environment (the overlay included) and working directory.
    pub env: Vec<(OsString, OsString)>,
    pub cwd: PathBuf,
    pub fault: Option<String>,
}

/// A timer armed by `start_timer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Started {
    pub pid: i32,
    /// The previous timer that was drained first, if there was one.
    pub replaced: Option<Stopped>,
}

/// start_timer (CORE 7.3): under L2, check the attempt, drain a live timer, spawn the new one
/// detached, write its pidfile, then audit `heartbeat_started`.
pub fn start_timer(store: &Store, job_id: &str, spec: &StartSpec) -> Result<Started, TimerError> {
    let l2 = lock_l2(&store.registry, job_id)?;
    // Step 1: a start after the barrier (or for another attempt) arms nothing.
    let rec = store.read_existing(job_id)?;
    let attempt = rec.attempt().unwrap_or(0);
    let token = rec.str("dispatch_token").unwrap_or("").to_string();
    let ended = |why: String| TimerError::AttemptEnded { job_id: job_id.to_string(), why };
    if is_terminal(rec.status()) {
        return Err(ended(format!("job is {}", rec.status())));
    }
    if rec.u64("barrier_attempt") == Some(attempt) {
        return Err(ended("the terminal barrier is raised".into()));
    }
    if spec.attempt.is_some_and(|a| a != attempt) || spec.dispatch_token.as_deref().is_some_and(|t| t != token) {
        return Err(ended(format!("the record is at attempt {attempt}")));
    }
    // Step 2: the old owner must be gone before the pidfile may name a new one.
    let replaced = match stop_locked(store, job_id, spec.drain)? {
        Stopped::Nothing => None,
        s => Some(s),
    };
    // Step 3: spawn detached, output appended to heartbeat.log.
    let log_dir = audit::job_dir(&store.logs, job_id);
    sys::create_dir_all(&log_dir).map_err(io_err("cannot create log directory", &log_dir))?;
    let log_path = log_dir.join("heartbeat.log");
    let out = sys::open_append(&log_path).map_err(io_err("cannot open heartbeat.log", &log_path))?;
    let err = out.try_clone().map_err(io_err("cannot open heartbeat.log", &log_path))?;
    let mut cmd = Command::new(&spec.exe);
    cmd.arg("heartbeat")
        .arg("run")
        .args(["--job-id", job_id])
        .args(["--attempt", &attempt.to_string()])
        .args(["--dispatch-token", &token])
        .args(["--interval", &spec.interval.to_string()])
        .args(["--watch-pid", &spec.watch_pid.to_string()])
        .args(["--lifetime", &spec.lifetime.to_string()])
        .arg("--registry-dir")
        .arg(&store.registry)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .env("DELEGATE_JOB_LOGS_DIR", &store.logs)
        .current_dir(&spec.cwd)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    sys::set_new_session(&mut cmd);
    if spec.fault.as_deref() == Some("heartbeat_spawn") {
        return Err(TimerError::Io {
            what: "cannot start the heartbeat timer",
            path: spec.exe.clone(),
            err: io::Error::other("fault injected: heartbeat_spawn"),
        });
    }
    let mut child = sys::spawn(&mut cmd).map_err(io_err("cannot start the heartbeat timer", &spec.exe))?;
    let pid = child.id() as i32;
    // Step 4: the pidfile; if it cannot be written, the child must not survive untracked.
    let pf_path = pidfile_path(&store.registry, job_id);
    let written = sys::proc_start_ticks(pid).and_then(|(ticks, _)| {
        if spec.fault.as_deref() == Some("heartbeat_pidfile") {
            return Err(io::Error::other("fault injected: heartbeat_pidfile"));
        }
        Pidfile {
            pid,
            job_id: job_id.to_string(),
            attempt,
            dispatch_token: token.clone(),
            start_ticks: ticks,
            started_at: clock::now_ts(),
        }
        .write(&pf_path)
    });
    if let Err(err) = written {
        let _ = child.kill();
        let _ = child.wait();
        if Pidfile::read(&pf_path).ok().flatten().is_some_and(|p| p.pid == pid) {
            let _ = fs::remove_file(&pf_path);
        }
        drop(l2);
        return Err(TimerError::Io { what: "cannot write the timer pidfile", path: pf_path, err });
    }
    // A long-lived spawner reaps its child; a short-lived one leaves it to init.
    let _ = std::thread::Builder::new().name("hb-reaper".into()).stack_size(32 * 1024).spawn(move || child.wait());
    drop(l2);
    // Step 5.
    audit_line(
        store,
        job_id,
        Some(attempt),
        "heartbeat_started",
        json!({"pid": pid, "interval": spec.interval, "watch_pid": spec.watch_pid}),
    );
    Ok(Started { pid, replaced })
}

// ---------------------------------------------------------------------------------------------
// The timer process (`mam heartbeat run`)

/// The identity and knobs of one timer (its argv).
#[derive(Debug, Clone)]
pub struct RunArgs {
    pub job_id: String,
    pub attempt: u64,
    pub dispatch_token: String,
    pub interval: u32,
    pub watch_pid: i32,
    pub lifetime: u64,
}

/// Where the timer writes its lines (heartbeat.log through its stdout).
pub type Log = Arc<dyn Fn(&str) + Send + Sync>;

/// One beat waiting for the wire.
struct Pending {
    seq: u64,
    msg: Message,
}

/// The hand-over between the beat loop and the wire thread: at most one beat waits.
struct Slot {
    pending: Mutex<Option<Pending>>,
    cv: Condvar,
    stop: AtomicBool,
    /// Beats the wire thread has finished with (sent, skipped or given up), and whether it is
    /// between taking one and finishing it.
    done: AtomicU64,
    busy: AtomicBool,
}

impl Slot {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst) || sys::pending_signal().is_some()
    }

    fn has_pending(&self) -> bool {
        self.pending.lock().map(|p| p.is_some()).unwrap_or(false)
    }

    /// No beat waits and the wire thread is not sending one.
    fn idle(&self) -> bool {
        !self.busy.load(Ordering::SeqCst) && !self.has_pending()
    }
}

/// The watched process by pid and start time, so a recycled pid does not keep the timer alive.
struct Watched {
    pid: i32,
    ticks: u64,
}

impl Watched {
    fn new(pid: i32) -> Option<Watched> {
        if pid <= 0 {
            return None;
        }
        let ticks = sys::proc_start_ticks(pid).map(|(t, _)| t).unwrap_or(u64::MAX);
        Some(Watched { pid, ticks })
    }

    fn gone(&self) -> bool {
        match sys::proc_start_ticks(self.pid) {
            Ok((t, zombie)) => zombie || t != self.ticks,
            Err(_) => !sys::process_exists(self.pid),
        }
    }
}

fn names_me(registry: &Path, job_id: &str) -> bool {
    let me = std::process::id() as i32;
    Pidfile::read(&pidfile_path(registry, job_id)).ok().flatten().is_some_and(|p| p.pid == me)
}

/// `mam heartbeat run` (CORE 7.5). Signal handlers must already be installed. Returns when the
/// timer stops; the caller exits, which also abandons an in-flight wire send (its socket closes).
pub fn run(store: &Store, settings: &Settings, a: &RunArgs, log: Log) -> i32 {
    // Issue 20: the wire thread shares the beat loop's heap instead of getting one of its own.
    sys::one_malloc_arena();
    // A16: the spawner holds L2 until the pidfile is written; run only if it names this process.
    match wait_l2(&store.registry, &a.job_id) {
        Ok(Some(l2)) => {
            let mine = names_me(&store.registry, &a.job_id);
            drop(l2);
            if !mine {
                log("pidfile does not name this timer; exiting");
                return 0;
            }
        }
        Ok(None) => {
            log("stopped before start-up completed");
            return 0;
        }
        Err(e) => {
            log(&format!("cannot take the lifecycle lock: {e}; exiting"));
            return 0;
        }
    }
    let reason = beat_loop(store, settings, a, &log);
    log(&format!("stopping: {reason}"));
    exit_cleanup(store, &a.job_id);
    0
}

/// A16's start-up wait for L2, made signal-aware (A17): `LOCK_NB` every 10 ms until the lock is
/// ours (`Some`) or SIGTERM/SIGINT arrived (`None`). A blocking flock would not return on a signal,
/// so a replacement that took L2 first and then signals this timer would wait for its drain.
fn wait_l2(registry: &Path, job_id: &str) -> Result<Option<Flock>, TimerError> {
    let path = lifecycle_lock_path(registry, job_id);
    loop {
        let f = sys::open_lock_file(&path).map_err(io_err("cannot lock", &path))?;
        if let Some(l) = Flock::try_acquire(f, LockMode::Exclusive).map_err(io_err("cannot lock", &path))? {
            return Ok(Some(l));
        }
        if sys::pending_signal().is_some() {
            return Ok(None);
        }
        sys::sleep(Duration::from_millis(10));
    }
}

/// The try-lock exit cleanup (CORE 7.5): remove the pidfile only if it names this process and L2
/// is free; a busy L2 means its owner (a stopper or a replacement) handles the file.
fn exit_cleanup(store: &Store, job_id: &str) {
    let path = lifecycle_lock_path(&store.registry, job_id);
    let Ok(f) = sys::open_lock_file(&path) else { return };
    if let Ok(Some(_l2)) = Flock::try_acquire(f, LockMode::Exclusive) {
        if names_me(&store.registry, job_id) {
            let _ = fs::remove_file(pidfile_path(&store.registry, job_id));
        }
    }
}

fn beat_loop(store: &Store, settings: &Settings, a: &RunArgs, log: &Log) -> String {
    let start = Instant::now();
    let period = Duration::from_secs(a.interval.max(1).into());
    let end = start + Duration::from_secs(a.lifetime);
    let watched = Watched::new(a.watch_pid);
    let rec = match store.read_existing(&a.job_id) {
        Ok(r) => r,
        Err(e) => return format!("cannot read the record ({e})"),
    };
    let job = match Job::from_record(&rec) {
        Ok(j) if j.attempt == a.attempt && j.dispatch_token == a.dispatch_token => j,
        Ok(_) => return "the record is at another attempt".into(),
        Err(e) => return e,
    };
    let (mqtt, warning) = settings.mqtt_for(&rec);
    if let Some(w) = warning {
        log(&w);
    }
    let events = events_log_path(&store.registry, &a.job_id);
    let slot = Arc::new(Slot {
        pending: Mutex::new(None),
        cv: Condvar::new(),
        stop: AtomicBool::new(false),
        done: AtomicU64::new(0),
        busy: AtomicBool::new(false),
    });
    let mut start_up_dropped = false;
    let wire = {
        let (slot, store, job, log) = (slot.clone(), store.clone(), job.clone(), log.clone());
        let (cfg, settings) = (mqtt, settings.clone());
        std::thread::Builder::new()
            .name("hb-wire".into())
            .stack_size(256 * 1024)
            .spawn(move || wire_loop(&slot, cfg, &settings, &store, &job, &log))
    };
    if let Err(e) = wire {
        return format!("cannot start the wire thread ({e})");
    }
    let mut k: u64 = 1;
    let mut last_check = start;
    let reason = loop {
        if let Some(sig) = sys::pending_signal() {
            break sys::signal_name(sig).to_string();
        }
        let now = Instant::now();
        if now >= end {
            break format!("lifetime of {}s elapsed", a.lifetime);
        }
        let due = start + period * k as u32;
        if now.duration_since(last_check) >= CHECK_EVERY || now >= due {
            last_check = now;
            if watched.as_ref().is_some_and(Watched::gone) {
                break format!("watched process {} is gone", a.watch_pid);
            }
            if !names_me(&store.registry, &a.job_id) {
                break "the pidfile no longer names this timer".into();
            }
        }
        if now >= due {
            // Fixed cadence: a slot that has already passed is skipped, not sent late.
            let current = (now.duration_since(start).as_millis() / period.as_millis()) as u64;
            if current > k {
                log(&format!("skipped {} missed beat slot(s)", current - k));
                k = current;
            }
            if let Some(stop) = beat(store, a, &job, &events, &slot, log) {
                break stop;
            }
            // Nothing is kept between beats: what the beat allocated goes back to the system.
            sys::release_free_memory();
            k += 1;
            continue;
        }
        // Issue 20: once the first beat is through the wire (connected, earlier events looked
        // for), what start-up ran is no longer needed; only the steady state's code comes back,
        // laid out together by the link (build.rs).
        if !start_up_dropped && slot.done.load(Ordering::SeqCst) > 0 && slot.idle() {
            start_up_dropped = true;
            let _ = sys::drop_file_pages();
        }
        let next = due.min(end).min(last_check + CHECK_EVERY);
        sys::sleep(SLICE.min(next.saturating_duration_since(now)).max(Duration::from_millis(1)));
    };
    slot.stop.store(true, Ordering::SeqCst);
    slot.cv.notify_all();
    reason
}

/// One beat: admission and seq (L1), the line in events.log (L4), then the hand-over to the wire.
/// Returns the stop reason when the timer must end.
fn beat(store: &Store, a: &RunArgs, job: &Job, events: &Path, slot: &Slot, log: &Log) -> Option<String> {
    let mut r = Request::new(Kind::Beat, Authority::Agent, &a.job_id);
    r.attempt = Some(a.attempt);
    r.dispatch_token = Some(a.dispatch_token.clone());
    r.alloc_seq = true;
    let now = clock::now_ms();
    let seq = match store.apply(&r, now) {
        Ok(out) => match out.decision {
            Decided::Applied(ap) => ap.seq?,
            Decided::Refused { reason } => return Some(format!("beat refused: {reason}")),
            Decided::Idempotent { .. } => return None,
        },
        Err(StoreError::UnknownJob { .. }) => return Some("the job record is gone".into()),
        Err(e) => {
            log(&format!("beat not recorded: {e}"));
            return None;
        }
    };
    let ts = clock::format_ts(now);
    let data = Map::new();
    let fields = EventFields { event: "progress", seq, ts: &ts, heartbeat: true, message: "", data: &data };
    let bytes = match job.event_bytes(&fields) {
        Ok(b) => b,
        Err(e) => return Some(format!("cannot sign a beat: {e}")),
    };
    // Disk first (CORE 0.8 item 2): a beat that is not in events.log never goes on the wire.
    if let Err(e) = prepare_events_log(events).and_then(|_| append_event(events, &bytes)) {
        log(&format!("beat seq={seq} not written: {e}"));
        return None;
    }
    let msg = job.event_message(&bytes);
    let mut p = slot.pending.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(old) = p.replace(Pending { seq, msg }) {
        log(&format!("beat seq={} dropped from the wire (kept in events.log)", old.seq));
    }
    drop(p);
    slot.cv.notify_all();
    None
}

/// The wire thread: sends the latest waiting beat and its re-checked state over the persistent
/// connection; retries stop as soon as a newer beat waits or the timer stops. Before a beat it
/// sends what an outage left unsent (issue 19, `forward`) whenever the connection is new or other
/// seqs were allocated since the previous beat; while disconnected it follows a re-pointed record
/// (`mam registry repoint`) to its new broker list.
fn wire_loop(slot: &Arc<Slot>, cfg: MqttConfig, settings: &Settings, store: &Store, job: &Job, log: &Log) {
    let conn_stop = {
        let s = slot.clone();
        Stop::from_fn(move || s.stopped())
    };
    let mut conn = Persistent::new(cfg, Role::Hb, conn_stop.clone());
    let policy = RetryPolicy { delays: settings.delays.clone(), budget: None, what: "beat" };
    let mut serviced = Instant::now();
    // The connection count and beat seq of the last look for unsent events (`None`: never looked).
    let mut looked: Option<(u32, u64)> = None;
    // The last look found events still in flight (a publish of another process, no audit entry
    // yet): the next beats look again until they are confirmed, failed or orphaned. Without this,
    // an event whose publish failed after the look was never sent while the connection stayed up.
    let mut waiting = false;
    let mut broker: Option<String> = None;
    let mut delivered = false;
    loop {
        let beat = loop {
            {
                let mut p = slot.pending.lock().unwrap_or_else(|e| e.into_inner());
                if slot.stopped() {
                    return;
                }
                if p.is_none() {
                    p = slot.cv.wait_timeout(p, SLICE).unwrap_or_else(|e| e.into_inner()).0;
                }
                if let Some(b) = p.take() {
                    slot.busy.store(true, Ordering::SeqCst);
                    break b;
                }
            }
            // Keepalive while idle between beats, so a period longer than the keepalive does not
            // cost a reconnect per beat. A failure drops the connection; the next beat reconnects.
            if serviced.elapsed() >= CHECK_EVERY {
                serviced = Instant::now();
                let _ = conn.service(Instant::now() + Duration::from_millis(5));
                // Issue 31: a second connection to another broker of the list, ready before the
                // kept one's broker dies (a new session may then wait seconds for the cluster).
                let idle_stop = {
                    let s = slot.clone();
                    Stop::from_fn(move || s.stopped() || s.has_pending())
                };
                // A failed try is tried again later; only a new standby is worth a line.
                let before = conn.standby_to().map(str::to_string);
                let _ = conn.keep_standby(&idle_stop);
                if let Some(to) = conn.standby_to().filter(|to| before.as_deref() != Some(*to)) {
                    log(&format!("standby connection to broker {to}"));
                }
            }
        };
        // A kept connection whose broker is gone is dropped now, so this beat's first attempt goes
        // through the standby (or a new connection) instead of failing and waiting a retry delay.
        if conn.is_connected() {
            let _ = conn.service(Instant::now() + Duration::from_millis(5));
        }
        if !conn.is_connected() {
            if let Ok(Some(rec)) = store.read(&job.job_id) {
                let (fresh, _) = settings.mqtt_for(&rec);
                if fresh.identity() != *conn.identity() {
                    log(&format!("broker list of the record is now {}; reconnecting there", fresh.addr()));
                    conn = Persistent::new(fresh, Role::Hb, conn_stop.clone());
                }
            }
        }
        let retry_stop = {
            let s = slot.clone();
            Stop::from_fn(move || s.stopped() || s.has_pending())
        };
        let mut progress = Progress::default();
        let recheck = || wire::recheck_state(store, job, "progress", beat.seq);
        let proceed = || !slot.stopped();
        let mut replayed = forward::Replayed::default();
        let mut notes = Vec::new();
        let r = with_retry(
            &policy,
            &retry_stop,
            |w| log(&w),
            |_| {
                progress.attempts += 1;
                // Look when the connection is (or will be) new, someone else took seqs since, or the
                // last look found an event still in flight.
                let look = !conn.is_connected()
                    || waiting
                    || looked.is_none_or(|(n, seq)| n != conn.connects() || beat.seq != seq + 1);
                conn.with_client(|c| {
                    let fresh = c.addr().to_string();
                    if broker.as_deref() != Some(fresh.as_str()) {
                        log(&format!("connected to broker {fresh}"));
                        broker = Some(fresh.clone());
                        delivered = false;
                    }
                    if look {
                        let found = forward::look(store, job, beat.seq, clock::now_ms());
                        waiting = found.waiting > 0;
                        forward::send(store, job, c, &found.unsent, false, &mut replayed, &mut |w| notes.push(w))?;
                    }
                    wire::send_event_then_state(c, Some(&beat.msg), &mut progress, Some(&recheck), &proceed)?;
                    // The first beat a broker acknowledged: when a failover completed (issue 19).
                    if !delivered {
                        delivered = true;
                        log(&format!("beat seq={} delivered through broker {fresh}", beat.seq));
                    }
                    Ok(())
                })
            },
        );
        for n in notes.drain(..) {
            log(&n);
        }
        if !replayed.seqs.is_empty() {
            log(&format!("sent earlier event(s) the wire had missed: seq {:?}", replayed.seqs));
        }
        match r {
            Ok(()) => {
                looked = Some((conn.connects(), beat.seq));
                if let Some(why) = &progress.state_skipped {
                    log(&format!("beat seq={}: state not published: {why}", beat.seq));
                }
            }
            Err(e) if slot.stopped() => {
                log(&format!("beat seq={} abandoned on stop ({e})", beat.seq));
                return;
            }
            Err(e) => {
                looked = None;
                log(&format!("beat seq={} not published: {e}", beat.seq))
            }
        }
        slot.done.fetch_add(1, Ordering::SeqCst);
        slot.busy.store(false, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifetime_default_and_drain_warning() {
        assert_eq!(default_lifetime(0, 120), DEFAULT_LIFETIME_S);
        assert_eq!(default_lifetime(600, 120), 720);
        assert_eq!(
            stopped_warning(&Stopped::Killed { pid: 7 }, Duration::from_millis(1500)).unwrap(),
            "WARNING: heartbeat timer 7 did not drain in 1.5s; killed"
        );
        assert!(stopped_warning(&Stopped::Drained { pid: 7 }, Duration::from_secs(1)).is_none());
    }
}
