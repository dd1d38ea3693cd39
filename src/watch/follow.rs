//! The watch loop (CORE 8.2, 8.3; A9, A10, A11, A12, A31): one persistent subscription to a job's
//! `events` and `state` topics, plus (for a local job) the job's `events.log`, both judged by the
//! one `Acceptor`, until a terminal status, a silence verdict of `Budgets`, or a signal.
//!
//! It owns the subscriber-log lines (`<ts> attempt=<a> token=<8hex> <what>`, A10), the audit entries
//! `dropped`, `seq_gap` and `reconnected`, the reconnect backoff (1, 2, 4 ... 30 s) and, with
//! `--remote`, the mirror requests (`claim`, `terminal S`) and the report file. It never prints:
//! stdout lines and diagnostics go to the caller's `out`, which decides where they end up. It does
//! not re-implement any acceptance rule or budget: those live in `accept`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::accept::{Acceptor, Budgets, DropAudit, Identity, Outcome, Silence, DROP_WINDOW_MS};
use super::tail::Tail;
use crate::clock;
use crate::mqtt::{self, BrokerBlock, MqttConfig, MqttError, Persistent, RetryPolicy, Role, Stop};
use crate::registry::audit;
use crate::registry::engine::{Authority, Kind, Request};
use crate::registry::record::Record;
use crate::registry::store::{Decided, Store};
use crate::sys;
use crate::text::{one_line, show_path};

/// The first reconnect wait and the cap of the doubling backoff (CORE 8.3).
pub const BACKOFF_FIRST: Duration = Duration::from_secs(1);
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Longest sleep while waiting for a reconnect, so signals and budgets are seen.
const IDLE_SLICE: Duration = Duration::from_millis(100);

/// What watch reads from the record (CORE 8.2).
#[derive(Debug, Clone)]
pub struct Job {
    pub job_id: String,
    pub attempt: u64,
    pub dispatch_token: String,
    pub auth_token: String,
    pub topic_prefix: String,
    pub transport: String,
    pub heartbeat_sec: u64,
    pub heartbeat_misses: u64,
    pub ack_timeout_sec: u64,
    pub idle_timeout_sec: u64,
    pub report_path: Option<PathBuf>,
    /// The record's broker block; `None` when the record has none (then the environment's broker).
    pub broker: Option<BrokerBlock>,
}

impl Job {
    /// The fields of a record watch needs; a missing identity field is an error naming it.
    pub fn from_record(rec: &Record) -> Result<Job, String> {
        let job_id = rec.str("job_id").ok_or("record has no job_id")?.to_string();
        let need = |k: &str| rec.str(k).map(str::to_string).ok_or_else(|| format!("record of job {job_id} has no {k}"));
        let attempt = rec.attempt().ok_or_else(|| format!("record of job {job_id} has no attempt"))?;
        let broker = rec.get("broker").and_then(|b| serde_json::from_value::<BrokerBlock>(b.clone()).ok());
        let topic_prefix = match rec.str("topic_prefix") {
            Some(p) => p.to_string(),
            None => mqtt::config::job_topic_prefix(broker.as_ref().map_or("mam", |b| b.topic_root.as_str()), &job_id),
        };
        let n = rec.u64("heartbeat_sec").unwrap_or(30).max(1);
        let k = rec.u64("heartbeat_misses").unwrap_or(4).max(1);
        Ok(Job {
            dispatch_token: need("dispatch_token")?,
            auth_token: need("auth_token")?,
            transport: rec.str("transport").unwrap_or("local").to_string(),
            heartbeat_sec: n,
            heartbeat_misses: k,
            ack_timeout_sec: rec.u64("ack_timeout_sec").unwrap_or(300),
            idle_timeout_sec: rec.u64("idle_timeout_sec").filter(|&s| s > 0).unwrap_or(n * k),
            report_path: rec.str("report_path").map(PathBuf::from),
            topic_prefix,
            broker,
            attempt,
            job_id,
        })
    }

    /// The first 8 hex digits of the dispatch token, as A10 lines show it.
    pub fn token8(&self) -> &str {
        self.dispatch_token.get(..8).unwrap_or(&self.dispatch_token)
    }
}

/// The command line's choices (CORE 8.1).
#[derive(Debug, Clone)]
pub struct Settings {
    /// `--ack-timeout S`: the budget before the first evidence, measured from watch start (A9).
    pub ack_timeout_s: Option<u64>,
    /// `--idle-timeout S`: overrides the record's idle window; 0 means K x N (A31).
    pub idle_timeout_s: Option<u64>,
    /// `--timeout S`: caps the whole run; 0 means none.
    pub timeout_s: Option<u64>,
    /// `--remote`: mirror accepted events into the record and write the report (CORE 8.3, A12).
    pub remote: bool,
    /// How often events.log is polled (1 s; `MAM_WATCH_POLL_MS` shortens it in tests).
    pub poll: Duration,
    /// `MAM_ENGINE_CAS` is not `0`.
    pub cas: bool,
    /// The environment's broker configuration, to connect to a record re-pointed during the watch
    /// (issue 19) under the same password rule; `None` follows the first broker list only.
    pub env: Option<MqttConfig>,
}

/// How a watch ended.
#[derive(Debug)]
pub enum Verdict {
    /// A terminal status of the current attempt (rc 0 for `completed`, else 10).
    Terminal(String),
    /// A budget ran out (rc 11, 12, 13).
    Silence(Silence),
    /// SIGINT or SIGTERM (rc 130, 143).
    Signal(i32),
    /// The initial connect or subscribe failed after retries (rc 3).
    Connect(MqttError),
}

/// Something for the caller to show: a line (already in subscriber.log) for stdout, a diagnostic
/// with its prefix for stderr, or the signal line of CORE 8.3 (stderr; the caller prints it once).
#[derive(Debug)]
pub enum Output<'a> {
    Line(&'a str),
    Diag(&'a str),
    Signal(&'a str),
}

/// The connection state after the initial subscription.
struct Down {
    since: Instant,
    attempts: u32,
    backoff: Duration,
    next_try: Instant,
}

struct Watch<'o> {
    job: Job,
    store: Store,
    settings: Settings,
    out: &'o mut dyn FnMut(Output<'_>),
    acceptor: Acceptor,
    t0: Instant,
    /// Milliseconds after `t0` at which blocking calls give up (the next budget deadline).
    deadline: Arc<AtomicU64>,
    log_path: PathBuf,
    log_warned: bool,
    advanced: Option<String>,
}

/// Follows `job` until a verdict. `cfg` is the broker to use (the record's block, resolved by the
/// caller against the environment's password rule).
pub fn run(job: Job, store: Store, settings: Settings, cfg: MqttConfig, out: &mut dyn FnMut(Output<'_>)) -> Verdict {
    let identity = Identity {
        attempt: job.attempt,
        dispatch_token: job.dispatch_token.clone(),
        auth_token: job.auth_token.clone(),
    };
    let log_path = audit::job_dir(&store.logs, &job.job_id).join("subscriber.log");
    let mut w = Watch {
        acceptor: Acceptor::new(identity),
        t0: Instant::now(),
        deadline: Arc::new(AtomicU64::new(u64::MAX)),
        log_path,
        log_warned: false,
        advanced: None,
        job,
        store,
        settings,
        out,
    };
    w.follow(cfg)
}

impl Watch<'_> {
    fn ms(&self) -> u64 {
        self.t0.elapsed().as_millis() as u64
    }

    fn at(&self, ms: u64) -> Instant {
        self.t0 + Duration::from_millis(ms)
    }

    fn idle_ms(&self) -> u64 {
        let s = match self.settings.idle_timeout_s {
            Some(0) => self.job.heartbeat_sec * self.job.heartbeat_misses,
            Some(s) => s,
            None => self.job.idle_timeout_sec,
        };
        s * 1000
    }

    fn wall_ms(&self) -> Option<u64> {
        self.settings.timeout_s.filter(|&s| s > 0).map(|s| s * 1000)
    }

    /// A stop condition for every blocking call: a signal, or the current budget deadline.
    fn stop(&self) -> Stop {
        let (t0, dl) = (self.t0, self.deadline.clone());
        Stop::from_fn(move || {
            sys::pending_signal().is_some() || t0.elapsed().as_millis() as u64 >= dl.load(Ordering::SeqCst)
        })
    }

    fn diag(&mut self, line: &str) {
        (self.out)(Output::Diag(line));
    }

    /// One A10 line to subscriber.log and stdout.
    fn line(&mut self, what: &str) {
        let l = format!("{} attempt={} token={} {what}", clock::now_ts(), self.job.attempt, self.job.token8());
        let mut bytes = l.clone().into_bytes();
        bytes.push(b'\n');
        let written = self
            .log_path
            .parent()
            .map_or(Ok(()), sys::create_dir_all)
            .and_then(|_| sys::append_locked(&self.log_path, &bytes));
        if let Err(e) = written {
            if !self.log_warned {
                self.log_warned = true;
                let msg = format!("WARNING: {}: cannot append ({e})", show_path(&self.log_path));
                self.diag(&msg);
            }
        }
        (self.out)(Output::Line(&l));
    }

    fn audit(&mut self, kind: &str, rest: Value) {
        let e = audit::entry(clock::now_ms(), &self.job.job_id, Some(self.job.attempt), kind, rest);
        if let Err(err) = audit::flush(&self.store.logs, &self.job.job_id, &[e], None) {
            let dir = audit::job_dir(&self.store.logs, &self.job.job_id);
            let msg = format!("WARNING: {}: audit not written ({err})", show_path(&dir));
            self.diag(&msg);
        }
    }

    /// Issue 19: a job whose record already holds a terminal status of this attempt is answered
    /// from disk (its events.log, else the record), without a broker.
    fn answer_from_disk(&mut self) -> Option<Verdict> {
        let rec = self.store.read(&self.job.job_id).ok().flatten()?;
        let current = rec.attempt() == Some(self.job.attempt)
            && rec.str("dispatch_token") == Some(self.job.dispatch_token.as_str());
        let status = rec.status().to_string();
        // A remote job's record on this machine is only what was mirrored; its wire decides.
        if !current || !crate::registry::is_terminal(&status) || self.job.transport == "remote" {
            return None;
        }
        {
            let mut tail = Tail::new(&self.store.registry.join(&self.job.job_id).join("events.log"));
            let mut budgets = Budgets::new(0, 0, u64::MAX / 4, u64::MAX / 4, None);
            loop {
                let lines = tail.poll().unwrap_or_default();
                for l in lines {
                    if let Some(v) = self.on_log_line(&l, &mut budgets) {
                        self.flush_drops();
                        if let Verdict::Terminal(s) = &v {
                            self.line(&format!("result {s}"));
                        }
                        return Some(v);
                    }
                }
                if !tail.more() {
                    break;
                }
            }
        }
        self.advance(&status);
        self.line(&format!("result {status}"));
        Some(Verdict::Terminal(status))
    }

    fn follow(&mut self, cfg: MqttConfig) -> Verdict {
        if let Some(v) = self.answer_from_disk() {
            return v;
        }
        let explicit_ack = self.settings.ack_timeout_s.map(|s| s * 1000);
        let wall = self.wall_ms();
        // Before the subscription only the wall clock and an explicit ack budget (both measured from
        // watch start) can end the watch.
        let pre = wall.unwrap_or(u64::MAX).min(explicit_ack.unwrap_or(u64::MAX));
        self.deadline.store(pre, Ordering::SeqCst);
        let stop = self.stop();
        let mut conn = Persistent::new(cfg, Role::Sub, stop.clone());
        let filters = vec![format!("{}/events", self.job.topic_prefix), format!("{}/state", self.job.topic_prefix)];
        let out = &mut self.out;
        let subscribed = mqtt::with_retry(
            &RetryPolicy::standard("subscribe"),
            &stop,
            |w| out(Output::Diag(&w)),
            |_| conn.subscribe(&filters, 1),
        );
        if let Err(e) = subscribed {
            if let Some(sig) = sys::pending_signal() {
                return self.signal(sig, &mut conn);
            }
            let now = self.ms();
            let early = Budgets::new(0, 0, explicit_ack.unwrap_or(u64::MAX / 4), self.idle_ms(), wall);
            if let Some(s) = early.check(now) {
                return self.silence(s, &early, &mut conn);
            }
            return Verdict::Connect(e);
        }
        let sub_ms = self.ms();
        let ack_budget = explicit_ack.unwrap_or(self.job.ack_timeout_sec * 1000 + self.idle_ms());
        let ack_from = if explicit_ack.is_some() { 0 } else { sub_ms };
        let mut budgets = Budgets::new(0, ack_from, ack_budget, self.idle_ms(), wall);
        for f in &filters {
            self.line(&format!("subscribed topic={f}"));
        }

        let mut tail = (self.job.transport != "remote")
            .then(|| Tail::new(&self.store.registry.join(&self.job.job_id).join("events.log")));
        let mut next_poll = Instant::now();
        let mut down: Option<Down> = None;
        loop {
            if let Some(sig) = sys::pending_signal() {
                return self.signal(sig, &mut conn);
            }
            if let Some(s) = budgets.check(self.ms()) {
                return self.silence(s, &budgets, &mut conn);
            }
            self.deadline.store(budgets.next_deadline(), Ordering::SeqCst);
            if let Some(t) = tail.as_mut() {
                if Instant::now() >= next_poll {
                    let lines = match t.poll() {
                        Ok(l) => l,
                        Err(e) => {
                            let msg = format!("WARNING: {}: cannot read ({e})", show_path(t.path()));
                            self.diag(&msg);
                            Vec::new()
                        }
                    };
                    // A long log is read in bounded pieces: the next one right after the
                    // deadlines and signals above were checked again (issue 12 item 8).
                    next_poll = if t.more() { Instant::now() } else { Instant::now() + self.settings.poll };
                    for l in lines {
                        if let Some(v) = self.on_log_line(&l, &mut budgets) {
                            return self.end(v, &mut conn);
                        }
                    }
                    continue;
                }
            }
            let mut wake = self.at(budgets.next_deadline());
            if tail.is_some() {
                wake = wake.min(next_poll);
            }
            match down.as_mut() {
                None => match conn.recv(wake) {
                    Ok(Some(m)) => {
                        if let Some(v) = self.on_payload(&m.payload, "wire", &mut budgets) {
                            return self.end(v, &mut conn);
                        }
                    }
                    Ok(None) | Err(MqttError::Stopped) => {}
                    Err(e) => {
                        self.line("broker down");
                        let msg = format!("NOTE: {e}; reconnecting");
                        self.diag(&msg);
                        conn.drop_connection();
                        let now = Instant::now();
                        down = Some(Down {
                            since: now,
                            attempts: 0,
                            backoff: BACKOFF_FIRST,
                            next_try: now + BACKOFF_FIRST,
                        });
                    }
                },
                Some(d) => {
                    let now = Instant::now();
                    if now < d.next_try {
                        sys::sleep(IDLE_SLICE.min(d.next_try - now).min(wake.saturating_duration_since(now)));
                        continue;
                    }
                    d.attempts += 1;
                    // Issue 19: a record re-pointed meanwhile (`mam registry repoint`) is followed.
                    if let Some(fresh) = self.repointed(&conn) {
                        let line = format!("NOTE: job {}: broker list is now {}", self.job.job_id, fresh.addr());
                        self.diag(&line);
                        let subs = filters.clone();
                        conn = Persistent::new(fresh, Role::Sub, stop.clone());
                        if let Err(e) = conn.subscribe(&subs, 1) {
                            if !matches!(e, MqttError::Stopped) {
                                d.backoff = (d.backoff * 2).min(BACKOFF_MAX);
                                d.next_try = Instant::now() + d.backoff;
                            } else {
                                d.attempts -= 1;
                            }
                            continue;
                        }
                    }
                    match conn.client().map(|_| ()) {
                        Ok(()) => {
                            let rest = json!({
                                "downtime_ms": d.since.elapsed().as_millis() as u64,
                                "attempt_no": d.attempts,
                            });
                            down = None;
                            self.audit("reconnected", rest);
                            self.line("broker up");
                            // Issue 31: one line when the watch moved to another broker of its list.
                            if let Some(m) = conn.take_move().filter(|m| m.from != m.to) {
                                let msg = format!("NOTE: watch: job {}: {}", self.job.job_id, m.describe());
                                self.diag(&msg);
                            }
                        }
                        Err(MqttError::Stopped) => d.attempts -= 1,
                        Err(_) => {
                            d.backoff = (d.backoff * 2).min(BACKOFF_MAX);
                            d.next_try = Instant::now() + d.backoff;
                        }
                    }
                }
            }
        }
    }

    /// The record's broker when it no longer is the one `conn` uses (a `repoint`), resolved against
    /// the environment like the first one was (`env`).
    fn repointed(&self, conn: &Persistent) -> Option<MqttConfig> {
        let env = self.settings.env.as_ref()?;
        let rec = self.store.read(&self.job.job_id).ok().flatten()?;
        let block = rec.get("broker").and_then(|b| serde_json::from_value::<BrokerBlock>(b.clone()).ok())?;
        let (cfg, _) = env.for_block(&block);
        (cfg.identity().brokers != conn.identity().brokers).then_some(cfg)
    }

    /// An events.log line: only lines of the current attempt and token count (CORE 8.2); the
    /// others are history (an earlier attempt of a loop job) and are skipped without a word.
    fn on_log_line(&mut self, line: &[u8], budgets: &mut Budgets) -> Option<Verdict> {
        let v: Value = serde_json::from_slice(line).ok()?;
        if v.get("attempt").and_then(Value::as_u64) != Some(self.job.attempt)
            || v.get("dispatch_token").and_then(Value::as_str) != Some(self.job.dispatch_token.as_str())
        {
            return None;
        }
        self.on_payload(line, "events.log", budgets)
    }

    /// One payload through the acceptance rules; returns the verdict when it ends the watch.
    fn on_payload(&mut self, payload: &[u8], source: &str, budgets: &mut Budgets) -> Option<Verdict> {
        let outcome = self.acceptor.offer(payload);
        match outcome {
            Outcome::Event { seq, ref event, gap, ref terminal } => {
                // Wire text reaches a log line only through the one-line sanitiser (issue 12 item 10).
                self.line(&format!("accepted seq={seq} event={}", one_line(event)));
                if let Some((expected, got)) = gap {
                    self.audit("seq_gap", json!({"expected": expected, "got": got, "source": source}));
                }
                budgets.evidence(self.ms());
                if self.settings.remote && event == "started" {
                    self.mirror(Kind::Claim, None);
                }
                match terminal {
                    Some(s) => {
                        if self.settings.remote {
                            self.write_report(payload);
                            self.mirror(Kind::Terminal, Some(s));
                        }
                        self.advance(s);
                        Some(Verdict::Terminal(s.clone()))
                    }
                    None => {
                        self.advance("running");
                        None
                    }
                }
            }
            Outcome::State { seq, ref status, ref terminal, .. } => {
                self.line(&format!("accepted-state seq={seq} status={}", one_line(status)));
                if !outcome.is_evidence() {
                    return None;
                }
                budgets.evidence(self.ms());
                if let Some(s) = terminal {
                    if self.settings.remote {
                        self.mirror(Kind::Terminal, Some(s));
                    }
                    self.advance(s);
                    return Some(Verdict::Terminal(s.clone()));
                }
                self.advance(status);
                None
            }
            Outcome::Duplicate { .. } => None,
            Outcome::Dropped { seq, reason, audit } => {
                if audit {
                    // Issue 12 item 9: a flood of forged messages writes a bounded audit.
                    if let DropAudit::Write { summary } = self.acceptor.drops.admit(clock::now_ms()) {
                        if let Some(n) = summary {
                            self.drop_summary(n);
                        }
                        let shown = seq.map_or_else(|| "?".to_string(), |s| s.to_string());
                        self.line(&format!("dropped seq={shown} reason={}", reason.as_str()));
                        self.audit("dropped", json!({"reason": reason.as_str(), "seq": seq, "source": source}));
                    }
                }
                None
            }
        }
    }

    /// One line and one audit entry for `n` drops the budget kept out of the audit.
    fn drop_summary(&mut self, n: u64) {
        self.line(&format!("dropped {n} more (not audited one by one)"));
        self.audit("dropped_summary", json!({"more": n, "window_ms": DROP_WINDOW_MS}));
    }

    /// At the end of a watch: the summary of drops still unreported.
    fn flush_drops(&mut self) {
        if let Some(n) = self.acceptor.drops.take_suppressed() {
            self.drop_summary(n);
        }
    }

    fn advance(&mut self, status: &str) {
        if self.advanced.as_deref() != Some(status) {
            self.advanced = Some(status.to_string());
            self.line(&format!("advanced status={}", one_line(status)));
        }
    }

    /// `--remote`: an accepted `started` becomes `claim`, a terminal becomes `terminal S`, with
    /// agent authority and this attempt's identity (CORE 8.3). A refusal is audited by the engine
    /// and watching continues.
    fn mirror(&mut self, kind: Kind, status: Option<&str>) {
        let mut req = Request::new(kind, Authority::Agent, &self.job.job_id);
        req.attempt = Some(self.job.attempt);
        req.dispatch_token = Some(self.job.dispatch_token.clone());
        req.cas = self.settings.cas;
        if let Some(s) = status {
            req = req.with_status(s);
        }
        let what = match status {
            Some(s) => format!("{} {s}", req.kind.name()),
            None => req.kind.name().to_string(),
        };
        match self.store.apply(&req, clock::now_ms()) {
            Ok(o) => {
                if let Some(w) = o.audit_error {
                    self.diag(&format!("WARNING: {w}"));
                }
                if let Decided::Refused { reason } = o.decision {
                    let msg = format!("NOTE: mirror {what} refused for job {} ({reason})", self.job.job_id);
                    self.diag(&msg);
                }
            }
            Err(e) => {
                let msg = format!("WARNING: mirror {what} for job {} failed: {e}", self.job.job_id);
                self.diag(&msg);
            }
        }
    }

    /// A12: a terminal event's `data.report` goes atomically to the record's report path (or
    /// `<registry>/<job_id>/report.md` when the record names none), before the terminal is mirrored
    /// so a reader that sees the status also finds the report.
    fn write_report(&mut self, payload: &[u8]) {
        let Ok(v) = serde_json::from_slice::<Value>(payload) else { return };
        let Some(report) = v.get("data").and_then(|d| d.get("report")).and_then(Value::as_str) else { return };
        let path = self
            .job
            .report_path
            .clone()
            .unwrap_or_else(|| self.store.registry.join(&self.job.job_id).join("report.md"));
        let written =
            path.parent().map_or(Ok(()), sys::create_dir_all).and_then(|_| sys::atomic_write(&path, report.as_bytes()));
        if let Err(e) = written {
            let msg = format!("WARNING: {}: cannot write the report ({e})", show_path(&path));
            self.diag(&msg);
        }
    }

    fn end(&mut self, v: Verdict, conn: &mut Persistent) -> Verdict {
        self.flush_drops();
        if let Verdict::Terminal(s) = &v {
            self.line(&format!("result {s}"));
        }
        conn.drop_connection();
        v
    }

    fn silence(&mut self, s: Silence, budgets: &Budgets, conn: &mut Persistent) -> Verdict {
        self.flush_drops();
        let result = match s {
            Silence::Unresponsive => "unresponsive",
            Silence::NoStarted => "no_started",
            Silence::WallClock => "wall_clock",
        };
        self.line(&format!("result {result}"));
        let id = self.job.job_id.clone();
        let msg = match s {
            Silence::NoStarted => format!("ERROR: job {id}: {}", budgets.no_event_message()),
            Silence::WallClock if !budgets.acked() => format!("ERROR: job {id}: {}", budgets.no_event_message()),
            Silence::WallClock => format!(
                "ERROR: job {id}: --timeout reached after {}s",
                budgets.wall_deadline.map_or(0, |w| w.div_ceil(1000))
            ),
            Silence::Unresponsive => {
                format!(
                    "ERROR: job {id}: no event for {}s after the last evidence (unresponsive)",
                    budgets.idle_ms / 1000
                )
            }
        };
        self.diag(&msg);
        conn.drop_connection();
        Verdict::Silence(s)
    }

    /// CORE 8.3 Signals: the line, then DISCONNECT if connected.
    fn signal(&mut self, sig: i32, conn: &mut Persistent) -> Verdict {
        self.flush_drops();
        let msg = signal_line(sig);
        (self.out)(Output::Signal(&msg));
        conn.drop_connection();
        Verdict::Signal(sig)
    }
}

/// `watch: received SIG<NAME>; disconnecting` (CORE 8.3).
pub fn signal_line(sig: i32) -> String {
    format!("watch: received {}; disconnecting", sys::signal_name(sig))
}
