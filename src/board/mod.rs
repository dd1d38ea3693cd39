//! The evidence board (issue 21): mam's evidence put where people look. The workspace daemon, the
//! one process that sees every job of its registry, ticks a `Board` once a second (and exactly when
//! a state is due to change): it reads what changed in the registry and in each open job's
//! events.log (the last line, verified with the job's key), judges each session's job (`judge`), and
//!
//! - shows the state on the session's pane, through the backend (herdr's sidebar via `pane
//!   report-agent`, tmux's pane title and border), on every state change and, while the job is
//!   open, at most once per refresh period to age its message; gives the display back when the
//!   daemon stops;
//! - runs the verdict hook (`notify`) for every job it saw end.
//!
//! The agent's side pays nothing: no call is made by the agent, its publisher or its timer.
//! Its `keeper` looks after the open jobs nobody waits for (issue 30): it closes the job of an agent
//! whose process ended and beats for a sandboxed agent, as delegate-job does for its own job.
//!
//! Architecture Invariant: the board only reads the registry (its keeper closes through
//! `ops::operator_close`, like any watcher); every pane call runs with
//! `MAM_NO_AUTOSTART=1` and a deadline, and a failing one is logged once and retried later, never
//! fatal. It prints nothing: log lines go to the daemon's callback.

pub mod judge;
pub mod keeper;

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

use crate::agents;
use crate::clock::{self, parse_ts};
use crate::ctx::Ctx;
use crate::daemon::sweep::idle_ms;
use crate::daemon::Observer;
use crate::joblog;
use crate::notify;
use crate::pane::{self, Backend, StateReport, Status};
use crate::registry::is_terminal;
use crate::registry::record::Record;
use crate::registry::store::Store;
use crate::session::{self, reconcile::row_target};
use crate::text::one_line;
use crate::watch::accept::{Acceptor, Identity, Outcome};
use judge::{Evidence, Facts, Shown};

/// The default tick.
pub const TICK: Duration = Duration::from_secs(1);
/// The default refresh of an open job's message (`MAM_BOARD_REFRESH_S`).
pub const REFRESH_S: u32 = 10;
/// The default of `MAM_WAITING_FOR_YOU_S`.
pub const WAITING_FOR_YOU_S: u32 = 10;
/// A pane whose report failed is tried again after this long.
const RETRY: Duration = Duration::from_secs(10);
/// The whole budget of the releases when the daemon stops (`daemon stop` waits 5 s).
const RELEASE_BUDGET: Duration = Duration::from_secs(3);
/// How much of the end of events.log is searched for its last line.
const LAST_LINE_SCAN: u64 = 1024 * 1024;

/// What the board does.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Show states on panes (`MAM_BOARD` is not `0`).
    pub report: bool,
    /// Run the verdict hook (`MAM_ON_VERDICT` is set).
    pub hooks: bool,
    pub tick: Duration,
    /// How often an open job's message is refreshed while its state holds; `None`: only changes.
    pub refresh: Option<Duration>,
    /// How long an agent stays at its input line with its job open before the job shows "waiting for
    /// you" (`MAM_WAITING_FOR_YOU_S`, issue 30); `None` (0): never.
    pub waiting_after: Option<Duration>,
}

type Stamp = (SystemTime, u64);

fn stamp(p: &Path) -> Option<Stamp> {
    let m = fs::metadata(p).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// One job as the board last read it.
#[derive(Debug)]
struct Entry {
    stamp: Option<Stamp>,
    session: String,
    terminal: bool,
    identity: Option<Identity>,
    log_stamp: Option<Stamp>,
    /// The last events.log line, verified, of the current attempt.
    latest: Option<Evidence>,
    /// Evidence the record itself carries (its agent-written timestamps).
    recorded: Option<Evidence>,
    facts: Facts,
    /// What the keeper needs of an open job (issue 30).
    keep: Option<keeper::OpenJob>,
    watcher_pid: Option<u64>,
}

/// A session's pane.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    session: String,
    backend: String,
    server: String,
    pane: String,
    kind: String,
}

impl Target {
    fn key(&self) -> (String, String, String) {
        (self.backend.clone(), self.server.clone(), self.pane.clone())
    }
}

#[derive(Debug, Clone)]
struct Reported {
    job_id: String,
    state: Status,
    message: String,
    at: Instant,
    kind: String,
}

/// The board of one registry and sessions file.
pub struct Board {
    ctx: Ctx,
    store: Store,
    sessions: PathBuf,
    settings: Settings,
    started_ms: u64,
    jobs: HashMap<String, Entry>,
    rows_stamp: Option<Option<Stamp>>,
    targets: Vec<Target>,
    backends: HashMap<(String, String), Box<dyn Backend>>,
    shown: HashMap<(String, String, String), Reported>,
    retry_at: HashMap<(String, String, String), Instant>,
    hooks: Vec<Child>,
    next: Instant,
    last_seq: u64,
    warned_registry: bool,
    /// Per session: since when (ms) its agent has been seen at its input line with a job open.
    at_input: HashMap<String, u64>,
    /// Per open job judged "waiting for you": what its waiting file says and when it was written.
    waiting: HashMap<String, (joblog::Waiting, Instant)>,
    keeper: keeper::Keeper,
}

/// The `MAM_BOARD*` knobs and whether a verdict hook is configured.
pub fn settings(ctx: &Ctx) -> Result<Settings, crate::knob::ConfigError> {
    let refresh = crate::knob::env_or(ctx, "MAM_BOARD_REFRESH_S", 0, REFRESH_S)?;
    let waiting = crate::knob::env_or(ctx, "MAM_WAITING_FOR_YOU_S", 0, WAITING_FOR_YOU_S)?;
    Ok(Settings {
        report: ctx.var("MAM_BOARD").as_deref() != Some("0"),
        hooks: notify::configured(ctx),
        tick: TICK,
        refresh: (refresh > 0).then(|| Duration::from_secs(refresh.into())),
        waiting_after: (waiting > 0).then(|| Duration::from_secs(waiting.into())),
    })
}

/// The newest of the record's agent-written timestamps at or after the dispatch (a re-dispatched
/// record keeps the previous attempt's `last_event_at`).
fn recorded_evidence(rec: &Record, dispatched: Option<u64>) -> Option<Evidence> {
    let at = |k: &str| rec.str(k).and_then(parse_ts);
    let word = match rec.str("last_event") {
        Some("progress") if rec.str("heartbeat_at") == rec.str("last_event_at") => "beat",
        Some(w) => w,
        None => "event",
    };
    [(at("claimed_at"), "started"), (at("heartbeat_at"), "beat"), (at("last_event_at"), word)]
        .into_iter()
        .filter_map(|(t, w)| Some((t?, w)))
        .filter(|(t, _)| dispatched.is_none_or(|d| *t >= d))
        .max_by_key(|(t, _)| *t)
        .map(|(at_ms, w)| Evidence { at_ms, what: w.to_string() })
}

/// The last line of `events` when it is a signed event of `id`'s attempt: what it says and when.
fn last_signed_line(events: &Path, id: &Identity) -> Option<Evidence> {
    let mut out = None;
    let _ = joblog::scan_lines_back(events, joblog::MAX_LINE, LAST_LINE_SCAN, |line| {
        if let Outcome::Event { event, .. } = Acceptor::new(id.clone()).offer(line) {
            let v: Value = serde_json::from_slice(line).unwrap_or(Value::Null);
            let at = v.get("ts").and_then(Value::as_str).and_then(parse_ts);
            let beat = v.get("heartbeat") == Some(&Value::Bool(true));
            out = at.map(|at_ms| Evidence { at_ms, what: if beat { "beat".into() } else { event } });
        }
        true
    });
    out
}

fn facts_of(rec: &Record, last: Option<Evidence>) -> Facts {
    Facts {
        job_id: rec.str("job_id").unwrap_or("").to_string(),
        status: rec.status().to_string(),
        reason: rec.str("reason").map(str::to_string),
        last_event: rec.str("last_event").map(str::to_string),
        dispatched_ms: rec.str("dispatched_at").or(rec.str("created_at")).and_then(parse_ts),
        finished_ms: rec.str("finished_at").and_then(parse_ts),
        idle_ms: idle_ms(rec),
        ack_ms: rec.u64("ack_timeout_sec").unwrap_or(300) * 1000,
        last,
        needs_you: None,
    }
}

fn newest(a: Option<Evidence>, b: Option<Evidence>) -> Option<Evidence> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if b.at_ms > a.at_ms { b } else { a }),
        (a, b) => a.or(b),
    }
}

impl Board {
    /// A board of `store` and the sessions file `sessions`. `ctx` is the daemon's (the verdict hook
    /// and the pane backends are read from it); pane calls never start a server.
    pub fn new(ctx: &Ctx, store: Store, sessions: PathBuf, settings: Settings) -> Board {
        let mut ctx = ctx.clone();
        ctx.set_var("MAM_NO_AUTOSTART", Some("1".as_ref()));
        let keeper = keeper::Keeper::new(&ctx, store.clone(), sessions.clone());
        Board {
            ctx,
            store,
            sessions,
            settings,
            started_ms: clock::now_ms(),
            jobs: HashMap::new(),
            rows_stamp: None,
            targets: Vec::new(),
            backends: HashMap::new(),
            shown: HashMap::new(),
            retry_at: HashMap::new(),
            hooks: Vec::new(),
            next: Instant::now(),
            last_seq: 0,
            warned_registry: false,
            at_input: HashMap::new(),
            waiting: HashMap::new(),
            keeper,
        }
    }

    /// A strictly increasing report sequence: wall-clock milliseconds, so a restarted daemon's
    /// reports are never older than its predecessor's.
    fn seq(&mut self) -> u64 {
        self.last_seq = clock::now_ms().max(self.last_seq + 1);
        self.last_seq
    }

    /// Reads what changed in the registry; runs the verdict hook for jobs that ended.
    fn scan(&mut self, log: &mut dyn FnMut(&str)) {
        let ids = match self.store.job_ids() {
            Ok(ids) => ids,
            Err(e) => {
                if !self.warned_registry {
                    self.warned_registry = true;
                    log(&format!("board: {e}"));
                }
                return;
            }
        };
        let mut seen = HashSet::with_capacity(ids.len());
        for id in ids {
            let st = stamp(&self.store.record_path(&id));
            let unchanged = self.jobs.get(&id).is_some_and(|e| st.is_some() && e.stamp == st);
            if !unchanged {
                self.read_job(&id, st, log);
            }
            if let Some(e) = self.jobs.get_mut(&id) {
                if !e.terminal {
                    refresh_latest(&self.store.registry, &id, e);
                }
            }
            seen.insert(id);
        }
        self.jobs.retain(|id, _| seen.contains(id));
    }

    fn read_job(&mut self, id: &str, st: Option<Stamp>, log: &mut dyn FnMut(&str)) {
        let Ok(Some(rec)) = self.store.read(id) else { return };
        let was_open = self.jobs.get(id).map(|e| !e.terminal);
        let terminal = is_terminal(rec.status());
        let identity = crate::daemon::mirror::identity(&rec);
        let dispatched = rec.str("dispatched_at").or(rec.str("created_at")).and_then(parse_ts);
        let recorded = recorded_evidence(&rec, dispatched);
        let (log_stamp, latest) = match self.jobs.remove(id) {
            // Same attempt: what was read of events.log stands.
            Some(old) if old.identity.as_ref().map(|i| i.attempt) == identity.as_ref().map(|i| i.attempt) => {
                (old.log_stamp, old.latest)
            }
            _ => (None, None),
        };
        let mut e = Entry {
            stamp: st,
            session: rec.str("agent_session").unwrap_or("").to_string(),
            terminal,
            identity,
            log_stamp,
            latest: latest.clone(),
            recorded: recorded.clone(),
            facts: facts_of(&rec, newest(latest, recorded)),
            keep: None,
            watcher_pid: rec.u64("watcher_pid"),
        };
        if let (false, Some(attempt), Some(token)) = (terminal, rec.attempt(), rec.str("dispatch_token")) {
            e.keep = Some(keeper::OpenJob {
                job_id: id.to_string(),
                session: e.session.clone(),
                attempt,
                token: token.to_string(),
                started: rec.status() == "running",
                watched: false,
                heartbeat_sec: rec.u64("heartbeat_sec").map_or(30, |n| n.clamp(1, u64::from(u32::MAX)) as u32),
            });
        }
        if terminal {
            // A finished job keeps only what its pane may still show (memory: one entry per job).
            e.identity = None;
            e.latest = None;
            e.recorded = None;
            e.log_stamp = None;
        } else {
            refresh_latest(&self.store.registry, id, &mut e);
        }
        self.jobs.insert(id.to_string(), e);
        let ended = match was_open {
            Some(open) => open && terminal,
            None => terminal && rec.str("finished_at").and_then(parse_ts).is_some_and(|t| t >= self.started_ms),
        };
        if ended && self.settings.hooks {
            match notify::start_for_record(&self.ctx, &self.store.registry, &self.store.logs, &rec, "daemon") {
                Ok(Some(child)) => {
                    log(&format!("job {id}: verdict {} hook started (pid {})", rec.status(), child.id()));
                    self.hooks.push(child);
                }
                Ok(None) => {}
                Err(err) => log(&format!("job {id}: verdict hook not run: {err}")),
            }
        }
    }

    /// The running sessions with a local pane, reread when the sessions file changed.
    fn load_targets(&mut self, log: &mut dyn FnMut(&str)) {
        let st = stamp(&self.sessions);
        if self.rows_stamp == Some(st) {
            return;
        }
        self.rows_stamp = Some(st);
        let doc = match session::load(&self.sessions) {
            Ok(d) => d,
            Err(e) => {
                log(&format!("board: {e}"));
                return;
            }
        };
        let mut targets = Vec::new();
        for row in doc.herdr_sessions.iter().filter(|r| r.running() && !r.remote()) {
            let (Some(pane), Some((backend, server))) = (row.pane_id(), row_target(&self.ctx, row)) else { continue };
            let kind = agents::adapter(&row.agent).and_then(|a| a.herdr_kind).unwrap_or(row.agent.as_str());
            targets.push(Target {
                session: row.name.clone(),
                backend,
                server,
                pane: pane.to_string(),
                kind: kind.to_string(),
            });
        }
        // A pane no running session names any more is forgotten (its session's stop gave it back).
        let keys: HashSet<_> = targets.iter().map(Target::key).collect();
        self.shown.retain(|k, _| keys.contains(k));
        self.retry_at.retain(|k, _| keys.contains(k));
        self.targets = targets;
    }

    fn backend(&mut self, t: &Target) -> Option<&dyn Backend> {
        let key = (t.backend.clone(), t.server.clone());
        if !self.backends.contains_key(&key) {
            let b = pane::open_named(&self.ctx, &t.backend, Some(&t.server)).ok()?;
            self.backends.insert(key.clone(), b);
        }
        self.backends.get(&key).map(|b| b.as_ref())
    }

    /// Shows each session's state where it changed (or its message is due a refresh); returns the
    /// earliest instant a shown state changes by itself.
    fn report(&mut self, now_ms: u64, log: &mut dyn FnMut(&str)) -> Option<u64> {
        let mut due_at: Option<u64> = None;
        let mut waiting_now = HashSet::new();
        for t in self.targets.clone() {
            let Some(f) = judge::pick(self.jobs.values().filter(|e| e.session == t.session).map(|e| &e.facts)) else {
                continue;
            };
            let job_id = f.job_id.clone();
            let mut f = f.clone();
            if !is_terminal(&f.status) && f.last.is_some() {
                f.needs_you = self.needs_you(&t, now_ms);
            } else {
                self.at_input.remove(&t.session);
            }
            let s = judge::judge(&f, now_ms);
            if let Some(since_ms) = judge::waiting_since(&f, now_ms) {
                waiting_now.insert(job_id.clone());
                self.keep_waiting(&t, &f, since_ms, now_ms, log);
            }
            if let Some(u) = s.until_ms {
                due_at = Some(due_at.map_or(u, |d| d.min(u)));
            }
            let key = t.key();
            let changed = match self.shown.get(&key) {
                None => true,
                Some(r) => r.job_id != job_id || r.state != s.state || (!s.open && r.message != s.message),
            };
            // An open job's message ages; a title the pane's program may overwrite (tmux) is
            // asserted again, whatever the state.
            let shared = self.backend(&t).is_some_and(|b| b.shared_title());
            let refresh = !changed
                && self.shown.get(&key).is_some_and(|r| {
                    (shared || (s.open && r.message != s.message))
                        && self.settings.refresh.is_some_and(|p| r.at.elapsed() >= p)
                });
            if !(changed || refresh) || self.retry_at.get(&key).is_some_and(|at| Instant::now() < *at) {
                continue;
            }
            self.send(&t, &job_id, &s, changed, log);
        }
        let ended: Vec<String> = self.waiting.keys().filter(|id| !waiting_now.contains(*id)).cloned().collect();
        for id in ended {
            self.waiting.remove(&id);
            if let Err(e) = joblog::clear_waiting(&self.store.registry, &id) {
                log(&format!("board: job {id}: waiting state not removed ({e})"));
            }
        }
        due_at
    }

    /// Keeps `f`'s waiting file (status and ui read it) and, when this waiting begins, runs the
    /// verdict hook with `MAM_VERDICT=waiting_for_you` (issue 30).
    fn keep_waiting(&mut self, t: &Target, f: &judge::Facts, since_ms: u64, now_ms: u64, log: &mut dyn FnMut(&str)) {
        let Some(attempt) = self.jobs.get(&f.job_id).and_then(|e| e.identity.as_ref()).map(|i| i.attempt) else {
            return;
        };
        let approve = match &f.needs_you {
            Some(judge::NeedsYou::Approval(what)) => Some(what.clone()),
            _ => None,
        };
        let prev = self.waiting.get(&f.job_id).filter(|(old, _)| old.attempt == attempt && old.approve == approve);
        if prev.is_some_and(|(_, at)| at.elapsed() < Duration::from_millis(joblog::WAITING_FRESH_MS / 3)) {
            return;
        }
        let fresh_episode = prev.is_none();
        let since_ms = prev.map_or(since_ms, |(old, _)| old.since_ms);
        let w = joblog::Waiting { attempt, since_ms, seen_ms: now_ms, approve };
        if let Err(e) = joblog::write_waiting(&self.store.registry, &f.job_id, &w) {
            log(&format!("board: job {}: waiting state not recorded ({e})", f.job_id));
        }
        if fresh_episode && self.settings.hooks {
            let v = notify::Verdict::waiting(&f.job_id, attempt, &t.session, &f.status, &w.text(now_ms));
            let marker = notify::job_marker(&self.store.registry, &f.job_id, attempt)
                .with_file_name(format!("waiting.{attempt}.{since_ms}"));
            match notify::start(&self.ctx, &v, &marker, &self.store.logs, "daemon") {
                Ok(Some(child)) => {
                    log(&format!("job {}: waiting for you, hook started (pid {})", f.job_id, child.id()));
                    self.hooks.push(child);
                }
                Ok(None) => {}
                Err(err) => log(&format!("job {}: waiting hook not run: {err}", f.job_id)),
            }
        }
        self.waiting.insert(f.job_id.clone(), (w, Instant::now()));
    }

    /// What the agent of `t`'s open, started job waits for, from its screen (issue 30): an approval
    /// dialog at once; its empty input line once it has held `waiting_after`.
    fn needs_you(&mut self, t: &Target, now_ms: u64) -> Option<judge::NeedsYou> {
        let after = self.settings.waiting_after?;
        let (approval, ready) = {
            let b = self.backend(t)?;
            let screen = b.read_detection(&t.session).ok()?;
            match agents::approval_on(&screen) {
                Some(what) => (Some(what), false),
                None => (None, b.input_line(&t.session) == pane::InputLine::Ready),
            }
        };
        if let Some(what) = approval {
            self.at_input.remove(&t.session);
            return Some(judge::NeedsYou::Approval(what));
        }
        if !ready {
            self.at_input.remove(&t.session);
            return None;
        }
        let since_ms = *self.at_input.entry(t.session.clone()).or_insert(now_ms);
        Some(judge::NeedsYou::AtInputLine { since_ms, after_ms: after.as_millis() as u64 })
    }

    fn send(&mut self, t: &Target, job_id: &str, s: &Shown, changed: bool, log: &mut dyn FnMut(&str)) {
        let ttl = self.settings.refresh.filter(|_| s.open).map(|p| (p * 3).as_millis() as u64);
        let seq = self.seq();
        let r = StateReport { state: s.state, message: s.message.clone(), title: judge::title(s), ttl_ms: ttl, seq };
        let key = t.key();
        let result = match self.backend(t) {
            Some(b) => b.report_state(&t.pane, &t.kind, &r),
            None => Err(pane::PaneError::Failed(format!("unknown pane backend '{}'", one_line(&t.backend)))),
        };
        match result {
            Ok(()) => {
                if changed || self.retry_at.contains_key(&key) {
                    log(&format!("board: session {} pane {}: {}: {}", t.session, t.pane, s.state.word(), s.message));
                }
                self.retry_at.remove(&key);
                let at = Instant::now();
                let rep = Reported {
                    job_id: job_id.into(),
                    state: s.state,
                    message: s.message.clone(),
                    at,
                    kind: t.kind.clone(),
                };
                self.shown.insert(key, rep);
            }
            Err(e) => {
                if !self.retry_at.contains_key(&key) {
                    log(&format!(
                        "board: session {} pane {}: not shown ({e}); retrying every {} s",
                        t.session,
                        t.pane,
                        RETRY.as_secs()
                    ));
                }
                self.retry_at.insert(key, Instant::now() + RETRY);
            }
        }
    }

    /// Reaps the hook supervisors that ended.
    fn reap(&mut self) {
        self.hooks.retain_mut(|c| !matches!(c.try_wait(), Ok(Some(_)) | Err(_)));
    }
}

/// Rereads the last events.log line of an open job when the file changed.
fn refresh_latest(registry: &Path, id: &str, e: &mut Entry) {
    let path = joblog::events_log_path(registry, id);
    let st = stamp(&path);
    if st == e.log_stamp {
        return;
    }
    e.log_stamp = st;
    let Some(ident) = &e.identity else { return };
    if let Some(ev) = last_signed_line(&path, ident) {
        if e.latest.as_ref().is_none_or(|l| ev.at_ms >= l.at_ms) {
            e.latest = Some(ev);
        }
    }
    e.facts.last = newest(e.latest.clone(), e.recorded.clone());
}

impl Observer for Board {
    fn next_tick(&self) -> Instant {
        self.next
    }

    fn tick(&mut self, log: &mut dyn FnMut(&str)) {
        self.reap();
        self.scan(log);
        let open: Vec<keeper::OpenJob> = self
            .jobs
            .values()
            .filter(|e| !e.terminal && !e.session.is_empty())
            .filter_map(|e| {
                let mut j = e.keep.clone()?;
                j.watched = e.watcher_pid.is_some_and(crate::daemon::sweep::pid_alive);
                Some(j)
            })
            .collect();
        self.keeper.tick(&open, log);
        let mut next = Instant::now() + self.settings.tick;
        if self.settings.report {
            self.load_targets(log);
            let now = clock::now_ms();
            if let Some(at) = self.report(now, log) {
                // A state due before the next tick is judged right then.
                next = next.min(Instant::now() + Duration::from_millis(at.saturating_sub(now) + 1));
            }
        }
        self.next = next;
    }

    fn stop(&mut self, log: &mut dyn FnMut(&str)) {
        let until = Instant::now() + RELEASE_BUDGET;
        let shown: Vec<_> = self.shown.drain().collect();
        for ((backend, server, pane), r) in shown {
            if Instant::now() >= until {
                log(&format!("board: pane {pane} not released (out of time)"));
                continue;
            }
            let t = Target { session: String::new(), backend, server, pane: pane.clone(), kind: r.kind.clone() };
            let seq = self.seq();
            if let Some(b) = self.backend(&t) {
                if let Err(e) = b.release_state(&pane, &r.kind, seq) {
                    log(&format!("board: pane {pane} not released ({e})"));
                }
            }
        }
        self.reap();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn recorded_evidence_is_the_newest_agent_timestamp_of_this_dispatch() {
        let ts = clock::format_ts;
        let rec = Record::new(
            json!({"claimed_at": ts(1_000), "heartbeat_at": ts(5_000), "last_event_at": ts(5_000),
                   "last_event": "progress"})
            .as_object()
            .unwrap()
            .clone(),
        );
        assert_eq!(recorded_evidence(&rec, Some(500)), Some(Evidence { at_ms: 5_000, what: "beat".into() }));
        // A re-dispatch after all of it: nothing of the old attempt counts.
        assert_eq!(recorded_evidence(&rec, Some(6_000)), None);
    }
}
