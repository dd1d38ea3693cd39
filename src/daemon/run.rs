//! The daemon's loop (CORE 10.2, A15): subscribe and mirror, check presence once a second, sweep for
//! abandoned jobs, fall back to polling events.log while the broker is unavailable, and stop cleanly
//! on a signal, on a vanished workspace or replaced lock, or after the idle timeout.
//!
//! Every blocking step has a deadline and honours the stop condition within 200 ms. A signal in any
//! phase ends the loop; a daemon that has received one never starts polling. A polling pass that has
//! begun runs to its end. This module prints nothing: log lines go to the caller's callback.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::lock::MonitorLock;
use super::mirror::Mirror;
use super::sweep::{self, Close, TerminalCache};
use crate::clock;
use crate::mqtt::{with_retry, BrokerBlock, Message, MqttConfig, MqttError, Persistent, RetryPolicy, Role, Stop};
use crate::registry::record::Record;
use crate::registry::store::Store;
use crate::sys;

/// Everything one daemon run needs, resolved by the caller (A19: absolute registry and log root).
#[derive(Debug, Clone)]
pub struct Config {
    pub workspace: PathBuf,
    pub store: Store,
    pub mqtt: MqttConfig,
    /// `MAM_ENGINE_CAS` is not `0`.
    pub cas: bool,
    /// Exit after this long without any message; `None` runs forever (`--idle-timeout 0`).
    pub idle_timeout: Option<Duration>,
    /// The polling period of the fallback (`--interval`, default 10 s).
    pub interval: Duration,
    /// How often the fallback retries the broker (default 60 s).
    pub broker_retry: Duration,
    /// How often abandoned jobs are closed (A15, default 10 s).
    pub sweep_every: Duration,
}

/// Why the daemon stopped. Every exit is rc 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// SIGTERM or SIGINT (the number), or the caller's stop condition (0).
    Signal(i32),
    WorkspaceGone,
    LockReplaced,
    Idle,
}

/// Someone the daemon lets look at its registry now and then (issue 21: the evidence board and the
/// verdict hooks, which the command layer wires in): `tick` when `next_tick` is reached, `stop` once
/// when the daemon stops. Both get the daemon's log.
pub trait Observer {
    fn next_tick(&self) -> Instant;
    fn tick(&mut self, log: &mut dyn FnMut(&str));
    fn stop(&mut self, log: &mut dyn FnMut(&str));
}

/// No observer.
pub struct Nobody;

impl Observer for Nobody {
    fn next_tick(&self) -> Instant {
        Instant::now() + Duration::from_secs(3600)
    }
    fn tick(&mut self, _log: &mut dyn FnMut(&str)) {}
    fn stop(&mut self, _log: &mut dyn FnMut(&str)) {}
}

/// Longest sleep between checks of the stop condition while polling.
const SLICE: Duration = Duration::from_millis(100);
/// Presence check period (CORE 10.2 step 4).
const PRESENCE: Duration = Duration::from_secs(1);
/// Reconnect backoff cap after a lost connection (as watch, CORE 8.3).
const BACKOFF_CAP: Duration = Duration::from_secs(30);

#[derive(Clone)]
struct Presence {
    workspace: PathBuf,
    lock: PathBuf,
    identity: (u64, u64),
}

impl Presence {
    fn check(&self) -> Option<Exit> {
        if !self.workspace.is_dir() {
            return Some(Exit::WorkspaceGone);
        }
        if sys::path_identity(&self.lock).ok() != Some(self.identity) {
            return Some(Exit::LockReplaced);
        }
        None
    }
}

fn signalled(stop: &Stop) -> Option<Exit> {
    match sys::pending_signal() {
        Some(sig) => Some(Exit::Signal(sig)),
        None if stop.is_set() => Some(Exit::Signal(0)),
        None => None,
    }
}

/// A4: an operator close is published as a signed retained state, here over the daemon's own
/// connection when the record's broker and topic root are the daemon's. Returns a line to log when
/// the notice was not sent (a failed publish leaves the record, already final, alone).
fn publish_close(cfg: &Config, conn: &mut Persistent, connected: bool, rec: &Record, seq: u64) -> Option<String> {
    let block = rec.get("broker").and_then(|b| serde_json::from_value::<BrokerBlock>(b.clone()).ok());
    let prefix = format!("{}/jobs/", cfg.mqtt.topic_root);
    // Issue 19: a broker the daemon's list shares with the record's reaches the record's watchers.
    let shared = block.is_some_and(|b| b.list().iter().any(|e| cfg.mqtt.brokers.contains(e)));
    let ours = shared && rec.str("topic_prefix").is_some_and(|p| p.starts_with(&prefix));
    if !ours {
        return Some("close not published (the record names another broker or topic root)".into());
    }
    if !connected {
        return Some("close not published (broker unavailable)".into());
    }
    let (topic, payload) = sweep::close_state(rec, seq, clock::now_ms())?;
    match conn.publish(&cfg.mqtt, &[Message::new(topic, payload, 1, true)]) {
        Ok(()) => None,
        Err(e) => Some(format!("close not published ({e})")),
    }
}

/// Issue 19, store and forward: events of the registry's jobs that are on disk but never reached the
/// wire are sent over the daemon's connection, for jobs whose record shares a broker with the
/// daemon's list and topic root, that have no live heartbeat timer (the timer forwards its own job's)
/// and no publish in flight (L3 is tried, never waited for). A job whose events.log has not grown
/// since it was last found complete is not read again. Returns the lines to log.
fn forward_unsent(cfg: &Config, conn: &mut Persistent, done: &mut HashMap<String, u64>) -> Vec<String> {
    let mut lines = Vec::new();
    let Ok(ids) = cfg.store.job_ids() else { return lines };
    let prefix = format!("{}/jobs/", cfg.mqtt.topic_root);
    for id in ids {
        let events = crate::joblog::events_log_path(&cfg.store.registry, &id);
        let len = std::fs::metadata(&events).map(|m| m.len()).unwrap_or(0);
        if len == 0 || done.get(&id) == Some(&len) {
            continue;
        }
        let Ok(Some(rec)) = cfg.store.read(&id) else { continue };
        let block = rec.get("broker").and_then(|b| serde_json::from_value::<BrokerBlock>(b.clone()).ok());
        let shared = block.is_some_and(|b| b.list().iter().any(|e| cfg.mqtt.brokers.contains(e)));
        if !shared || !rec.str("topic_prefix").is_some_and(|p| p.starts_with(&prefix)) {
            done.insert(id, len);
            continue;
        }
        if crate::heartbeat::timer::status(&cfg.store.registry, &id).is_some() {
            continue;
        }
        let Ok(Some(_l3)) = crate::joblog::inflight_exclusive(&cfg.store.registry, &id, Duration::ZERO) else {
            continue;
        };
        let Ok(job) = crate::wire::Job::from_record(&rec) else {
            done.insert(id, len);
            continue;
        };
        let look = crate::forward::look(&cfg.store, &job, u64::MAX, clock::now_ms());
        let list = look.unsent;
        if list.is_empty() {
            // Something still in flight is looked at again at the next sweep.
            if look.waiting == 0 {
                done.insert(id, len);
            }
            continue;
        }
        let mut replayed = crate::forward::Replayed::default();
        let mut notes = Vec::new();
        let r = conn.with_client(|c| {
            crate::forward::send(&cfg.store, &job, c, &list, true, &mut replayed, &mut |w| notes.push(w))
        });
        lines.extend(notes);
        match r {
            Ok(()) => {
                lines.push(format!(
                    "job {id}: sent {} event(s) the wire had missed: seq {:?}",
                    list.len(),
                    replayed.seqs
                ));
                if list.len() < crate::forward::MAX_REPLAY && look.waiting == 0 {
                    done.insert(id, len);
                }
            }
            Err(e) => {
                lines.push(format!("job {id}: events the wire had missed not sent yet ({e})"));
                break;
            }
        }
    }
    lines
}

/// Runs the daemon until it exits; `lock` must be held by the caller for the whole call.
pub fn run(cfg: &Config, lock: &MonitorLock, stop: Stop, log: &mut dyn FnMut(&str)) -> Exit {
    run_with(cfg, lock, stop, &mut Nobody, log)
}

/// `run` with an `Observer` ticked inside the loop.
pub fn run_with(
    cfg: &Config,
    lock: &MonitorLock,
    stop: Stop,
    observer: &mut dyn Observer,
    log: &mut dyn FnMut(&str),
) -> Exit {
    let presence =
        Presence { workspace: cfg.workspace.clone(), lock: lock.path().to_path_buf(), identity: lock.identity() };
    let (p, s) = (presence.clone(), stop.clone());
    // The wire gives up as soon as a signal arrives or the workspace is gone, in every phase.
    let wire_stop = Stop::from_fn(move || sys::pending_signal().is_some() || s.is_set() || p.check().is_some());
    let mut mirror = Mirror::new(cfg.store.clone(), &cfg.mqtt.topic_root, cfg.cas);
    let filters = mirror.filters();
    let mut conn = Persistent::new(cfg.mqtt.clone(), Role::Dmn, wire_stop.clone());
    let mut cache = TerminalCache::default();
    let mut forwarded: HashMap<String, u64> = HashMap::new();

    let end = |exit: Exit, conn: &mut Persistent, observer: &mut dyn Observer, log: &mut dyn FnMut(&str)| {
        observer.stop(log);
        let what = match exit {
            Exit::Signal(0) => "stop requested; stopping".to_string(),
            Exit::Signal(sig) => format!("received {}; stopping", sys::signal_name(sig)),
            Exit::WorkspaceGone => "workspace gone; stopping".to_string(),
            Exit::LockReplaced => "monitor.lock replaced; stopping".to_string(),
            Exit::Idle => {
                format!("no message for {}s (idle timeout); stopping", cfg.idle_timeout.map_or(0, |d| d.as_secs()))
            }
        };
        log(&what);
        // DISCONNECT after the line, before the exit code (CORE 10.2 step 2).
        conn.drop_connection();
        exit
    };

    log(&format!("connecting to broker {} (topic root {})", cfg.mqtt.addr(), cfg.mqtt.topic_root));
    let first = with_retry(&RetryPolicy::standard("connect"), &wire_stop, |w| log(&w), |_| conn.subscribe(&filters, 1));
    let mut subscribed = first.is_ok();
    let mut connected = match first {
        Ok(_) => {
            for f in &filters {
                log(&format!("subscribed {f}"));
            }
            true
        }
        Err(e) => {
            if let Some(exit) = signalled(&stop).or_else(|| presence.check()) {
                return end(exit, &mut conn, observer, log);
            }
            log(&format!(
                "broker unavailable ({e}); polling every {}s, retrying the broker every {}s",
                cfg.interval.as_secs(),
                cfg.broker_retry.as_secs()
            ));
            false
        }
    };

    let now = Instant::now();
    let mut last_message = now;
    let mut next_presence = now + PRESENCE;
    let mut next_sweep = now;
    let mut next_pass = now;
    let mut backoff = cfg.broker_retry;
    let mut next_broker = now + backoff;
    loop {
        if let Some(exit) = signalled(&stop) {
            return end(exit, &mut conn, observer, log);
        }
        let now = Instant::now();
        if now >= next_presence {
            if let Some(exit) = presence.check() {
                return end(exit, &mut conn, observer, log);
            }
            next_presence = now + PRESENCE;
        }
        if now >= next_sweep {
            for c in sweep::sweep(&cfg.store, &mut cache, cfg.cas, clock::now_ms()) {
                let why = match c.close {
                    Close::Expire => "expire (deadline passed, watcher gone)",
                    Close::Unresponsive => "set deadline_timeout reason unresponsive (silent, watcher gone)",
                };
                match c.result {
                    Ok(to) => log(&format!("job {}: {why}: {to}", c.job_id)),
                    Err(e) => log(&format!("job {}: {why}: {e}", c.job_id)),
                }
                if let Some((rec, seq)) = &c.applied {
                    // CORE 7.4 before A4: no beat of the closed attempt may follow the closed state.
                    // The default drain (MAM_HEARTBEAT_DRAIN_S's 1 s): the daemon has no caller env.
                    let drain = std::time::Duration::from_secs(1);
                    match crate::heartbeat::timer::stop_timer(&cfg.store, &c.job_id, drain) {
                        Ok(s) => {
                            if let Some(w) = crate::heartbeat::timer::stopped_warning(&s, drain) {
                                log(&format!("job {}: {w}", c.job_id));
                            }
                        }
                        Err(e) => log(&format!("job {}: cannot stop the heartbeat timer ({e})", c.job_id)),
                    }
                    if let Some(line) = publish_close(cfg, &mut conn, connected, rec, *seq) {
                        log(&format!("job {}: {line}", c.job_id));
                    }
                }
            }
            if connected {
                for line in forward_unsent(cfg, &mut conn, &mut forwarded) {
                    log(&line);
                }
            }
            next_sweep = Instant::now() + cfg.sweep_every;
        }
        if Instant::now() >= observer.next_tick() {
            observer.tick(log);
        }
        let idle_deadline = cfg.idle_timeout.map(|d| last_message + d);
        if idle_deadline.is_some_and(|d| now >= d) {
            return end(Exit::Idle, &mut conn, observer, log);
        }
        let mut wake = next_presence.min(next_sweep).min(observer.next_tick());
        if let Some(d) = idle_deadline {
            wake = wake.min(d);
        }

        if connected {
            match conn.recv(wake) {
                Ok(Some(m)) => {
                    last_message = Instant::now();
                    for line in mirror.on_message(&m.topic, &m.payload, m.retain, clock::now_ms()) {
                        log(&line);
                    }
                }
                Ok(None) => {}
                // A signal or a presence failure: the checks at the top decide.
                Err(MqttError::Stopped) => next_presence = Instant::now(),
                Err(e) => {
                    log(&format!("broker down ({e})"));
                    conn.drop_connection();
                    connected = false;
                    backoff = Duration::from_secs(1);
                    next_broker = Instant::now() + backoff;
                    next_pass = Instant::now();
                }
            }
            continue;
        }

        if now >= next_pass {
            mirror.poll_pass(clock::now_ms(), log);
            next_pass = Instant::now() + cfg.interval;
            continue;
        }
        if now >= next_broker {
            let r = if subscribed { conn.client().map(|_| ()) } else { conn.subscribe(&filters, 1).map(|_| ()) };
            match r {
                Ok(()) => {
                    subscribed = true;
                    connected = true;
                    log(&format!("broker up; subscribed {}", filters.join(" ")));
                    // What the outage left unsent goes out now, not at the next sweep.
                    next_sweep = Instant::now();
                }
                Err(MqttError::Stopped) => next_presence = Instant::now(),
                Err(e) => {
                    if backoff < cfg.broker_retry {
                        backoff = (backoff * 2).min(BACKOFF_CAP);
                    }
                    log(&format!("broker still unavailable ({e}); next try in {}s", backoff.as_secs()));
                    next_broker = Instant::now() + backoff;
                }
            }
            continue;
        }
        let until = wake.min(next_pass).min(next_broker);
        let rest = until.saturating_duration_since(Instant::now());
        if !rest.is_zero() {
            sys::sleep(rest.min(SLICE));
        }
    }
}
