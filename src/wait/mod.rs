//! `mam wait`'s library side (issue 21): waits on several jobs at once for their verdicts, reading
//! the evidence `mam watch` reads (one wildcard subscription to the topic root's `jobs/+/events` and
//! `jobs/+/state`, each local job's events.log) plus each job's record, and judging every job with
//! its own `track::Tracker`. Each verdict is reported once, as it happens; the wait ends when the
//! first (`Any`) or every (`All`) job has one, at the timeout, or on a signal.
//!
//! Architecture Invariant: wait only reads. It never writes a record, an audit entry or a log, and
//! never closes a job; a broker it cannot reach is a note and a retry, with events.log and the
//! records still followed. It prints nothing: verdicts and notes go to the caller's `out`.

pub mod track;

use std::collections::HashMap;
use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::clock;
use crate::daemon::mirror::parse_topic;
use crate::mqtt::{MqttConfig, MqttError, Persistent, Role, Stop};
use crate::registry::record::Record;
use crate::registry::store::Store;
use crate::sys;
use crate::watch::tail::Tail;
use track::{verdict_word, Found, Source, Tracker};

/// How often a lost broker is tried again.
const BROKER_RETRY: Duration = Duration::from_secs(5);
/// The longest sleep without looking at signals.
const SLICE: Duration = Duration::from_millis(200);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The first verdict ends the wait.
    Any,
    /// Every job's verdict ends it.
    All,
}

#[derive(Debug, Clone)]
pub struct Settings {
    pub mode: Mode,
    /// The wait ends here at the latest.
    pub timeout: Option<Duration>,
    /// How often events.log and the records are read (1 s; `MAM_WATCH_POLL_MS`).
    pub poll: Duration,
}

/// What the caller is told.
#[derive(Debug)]
pub enum Event<'a> {
    Verdict {
        job: &'a Tracker,
        found: &'a Found,
    },
    /// A `NOTE:` line (broker down, up).
    Note(&'a str),
}

/// Why the wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// `Any`: one verdict is in; `All`: all are.
    Done,
    Timeout,
    Signal(i32),
}

/// The end, with every verdict in order and the jobs still without one.
#[derive(Debug)]
pub struct Outcome {
    pub end: End,
    pub verdicts: Vec<(String, Found)>,
    pub pending: Vec<String>,
}

impl Outcome {
    /// The exit code: 13 at the timeout; else for `Any` the first verdict's code, for `All` the
    /// highest-ranked of all (11 unresponsive, then 12 never started, then 10 another status, then
    /// 0 completed); 128 + the signal.
    pub fn rc(&self, mode: Mode) -> i32 {
        match self.end {
            End::Signal(s) => 128 + s,
            End::Timeout => 13,
            End::Done => {
                let rank = |rc: i32| match rc {
                    11 => 3,
                    12 => 2,
                    10 => 1,
                    _ => 0,
                };
                match mode {
                    Mode::Any => self.verdicts.first().map_or(0, |(_, f)| f.rc()),
                    Mode::All => self.verdicts.iter().map(|(_, f)| f.rc()).max_by_key(|rc| rank(*rc)).unwrap_or(0),
                }
            }
        }
    }
}

type Stamp = (SystemTime, u64);

fn stamp(p: &Path) -> Option<Stamp> {
    let m = fs::metadata(p).ok()?;
    Some((m.modified().ok()?, m.len()))
}

struct Slot {
    t: Tracker,
    tail: Option<Tail>,
    stamp: Option<Stamp>,
    /// events.log as last read: a poll of an unchanged log is one `stat`.
    log_stamp: Option<Stamp>,
    status: String,
}

/// A terminal seen on the wire or in events.log, completed from the record when the record already
/// says more (the reason of an operator close).
fn enrich(store: &Store, slot: &Slot, mut f: Found) -> Found {
    if let Ok(Some(rec)) = store.read(&slot.t.job_id) {
        if rec.attempt() == Some(slot.t.attempt()) && rec.status() == f.status {
            f.reason = rec.str("reason").unwrap_or("").to_string();
            f.verdict = verdict_word(&f.status, &f.reason);
        }
    }
    f
}

/// Waits on `records` (each job's record as read at the start). `cfg` is the broker to follow, or
/// `None` for disk only.
pub fn run(
    store: &Store,
    records: Vec<Record>,
    cfg: Option<MqttConfig>,
    s: &Settings,
    out: &mut dyn FnMut(Event<'_>),
) -> Outcome {
    let t0 = Instant::now();
    let hard = s.timeout.map(|t| t0 + t);
    let mut slots: Vec<Slot> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut verdicts: Vec<(String, Found)> = Vec::new();
    for rec in records {
        let Some(mut t) = Tracker::new(&rec) else { continue };
        let status = rec.status().to_string();
        let first = t.record(&rec);
        let tail = (t.transport != "remote").then(|| Tail::new(&store.registry.join(&t.job_id).join("events.log")));
        let id = t.job_id.clone();
        let slot = Slot { stamp: stamp(&store.record_path(&id)), t, tail, log_stamp: None, status };
        if let Some(f) = first {
            out(Event::Verdict { job: &slot.t, found: &f });
            verdicts.push((id.clone(), f));
        }
        index.insert(id, slots.len());
        slots.push(slot);
    }
    let total = slots.len();
    let done = |n: usize| match s.mode {
        Mode::Any => n > 0 || total == 0,
        Mode::All => n == total,
    };

    // The wire: every blocking call gives up at the next wake-up (or on a signal).
    let wake_at = Arc::new(AtomicU64::new(u64::MAX));
    let stop = {
        let w = wake_at.clone();
        Stop::from_fn(move || {
            sys::pending_signal().is_some() || t0.elapsed().as_millis() as u64 >= w.load(Ordering::SeqCst)
        })
    };
    let root = cfg.as_ref().map(|c| c.topic_root.clone()).unwrap_or_default();
    let filters = vec![format!("{root}/jobs/+/events"), format!("{root}/jobs/+/state")];
    let mut conn = cfg.map(|c| Persistent::new(c, Role::Sub, stop));
    let mut connected = false;
    let mut subscribed = false;
    let mut told_down = false;
    let mut next_try = Instant::now();
    let mut next_poll = Instant::now();

    let end = loop {
        if let Some(sig) = sys::pending_signal() {
            break End::Signal(sig);
        }
        if done(verdicts.len()) {
            break End::Done;
        }
        let now = Instant::now();
        if hard.is_some_and(|h| now >= h) {
            break End::Timeout;
        }
        let now_ms = clock::now_ms();
        if now >= next_poll {
            for slot in slots.iter_mut().filter(|sl| sl.t.found.is_none()) {
                let path = store.record_path(&slot.t.job_id);
                let st = stamp(&path);
                let mut found = None;
                if st != slot.stamp {
                    slot.stamp = st;
                    if let Ok(Some(rec)) = store.read(&slot.t.job_id) {
                        slot.status = rec.status().to_string();
                        let had_tail = slot.t.attempt();
                        found = slot.t.record(&rec);
                        if slot.t.attempt() != had_tail {
                            // A new attempt: its lines are read from the start of its window again.
                            slot.tail = slot.tail.as_ref().map(|t| Tail::new(t.path()));
                            slot.log_stamp = None;
                        }
                    }
                }
                let log_st = slot.tail.as_ref().and_then(|t| stamp(t.path()));
                if let Some(tail) = slot.tail.as_mut().filter(|t| log_st != slot.log_stamp || t.more()) {
                    slot.log_stamp = log_st;
                    for line in tail.poll().unwrap_or_default() {
                        if found.is_none() {
                            found = slot.t.offer(&line, Source::EventsLog, now_ms);
                        }
                    }
                }
                if let Some(f) = found {
                    let f = if f.source == Source::Record { f } else { enrich(store, slot, f) };
                    out(Event::Verdict { job: &slot.t, found: &f });
                    verdicts.push((slot.t.job_id.clone(), f));
                }
            }
            next_poll = Instant::now() + s.poll;
            continue;
        }
        for slot in slots.iter_mut().filter(|sl| sl.t.found.is_none()) {
            if let Some(f) = slot.t.check(now_ms, &slot.status) {
                out(Event::Verdict { job: &slot.t, found: &f });
                verdicts.push((slot.t.job_id.clone(), f));
            }
        }
        if done(verdicts.len()) {
            continue;
        }
        // The next instant anything can happen: a poll, a silence budget, the timeout.
        let mut wake = next_poll;
        if let Some(d) = slots.iter().filter(|sl| sl.t.found.is_none()).map(|sl| sl.t.deadline()).min() {
            wake = wake.min(now + Duration::from_millis(d.saturating_sub(now_ms)));
        }
        if let Some(h) = hard {
            wake = wake.min(h);
        }
        wake_at.store(wake.saturating_duration_since(t0).as_millis() as u64, Ordering::SeqCst);
        let Some(c) = conn.as_mut() else {
            sys::sleep(wake.saturating_duration_since(Instant::now()).min(SLICE));
            continue;
        };
        if connected {
            match c.recv(wake) {
                Ok(Some(m)) => {
                    let Some((id, _)) = parse_topic(&root, &m.topic) else { continue };
                    let Some(&i) = index.get(id.as_str()) else { continue };
                    let slot = &mut slots[i];
                    if let Some(f) = slot.t.offer(&m.payload, Source::Wire, clock::now_ms()) {
                        let f = enrich(store, slot, f);
                        out(Event::Verdict { job: &slot.t, found: &f });
                        verdicts.push((slot.t.job_id.clone(), f));
                    }
                }
                Ok(None) | Err(MqttError::Stopped) => {}
                Err(e) => {
                    out(Event::Note(&format!("NOTE: broker down ({e}); following events.log and the records")));
                    told_down = true;
                    c.drop_connection();
                    connected = false;
                    next_try = Instant::now() + BROKER_RETRY;
                }
            }
            continue;
        }
        if Instant::now() >= next_try {
            let r = if subscribed { c.client().map(|_| ()) } else { c.subscribe(&filters, 1).map(|_| ()) };
            match r {
                Ok(()) => {
                    if told_down {
                        out(Event::Note("NOTE: broker up"));
                        told_down = false;
                    }
                    subscribed = true;
                    connected = true;
                }
                Err(MqttError::Stopped) => {}
                Err(e) => {
                    if !told_down {
                        told_down = true;
                        out(Event::Note(&format!(
                            "NOTE: broker unavailable ({e}); following events.log and the records, retrying every {} s",
                            BROKER_RETRY.as_secs()
                        )));
                    }
                    next_try = Instant::now() + BROKER_RETRY;
                }
            }
            continue;
        }
        sys::sleep(wake.min(next_try).saturating_duration_since(Instant::now()).min(SLICE));
    };
    if let Some(c) = conn.as_mut() {
        c.drop_connection();
    }
    let pending = slots.iter().filter(|sl| sl.t.found.is_none()).map(|sl| sl.t.job_id.clone()).collect();
    Outcome { end, verdicts, pending }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(v: &str) -> (String, Found) {
        let f = Found { verdict: v.into(), status: v.into(), reason: String::new(), source: Source::Record, at_ms: 0 };
        ("j".into(), f)
    }

    #[test]
    fn exit_codes_say_which_case_ended_the_wait() {
        let o = |end, v: Vec<(String, Found)>| Outcome { end, verdicts: v, pending: vec![] };
        assert_eq!(o(End::Done, vec![found("completed"), found("completed")]).rc(Mode::All), 0);
        assert_eq!(o(End::Done, vec![found("completed"), found("failed")]).rc(Mode::All), 10);
        assert_eq!(o(End::Done, vec![found("no_started"), found("failed")]).rc(Mode::All), 12);
        assert_eq!(o(End::Done, vec![found("no_started"), found("unresponsive")]).rc(Mode::All), 11);
        assert_eq!(o(End::Done, vec![found("failed"), found("unresponsive")]).rc(Mode::Any), 10);
        assert_eq!(o(End::Timeout, vec![found("completed")]).rc(Mode::All), 13);
        assert_eq!(o(End::Signal(15), vec![]).rc(Mode::Any), 143);
        assert_eq!(o(End::Done, vec![]).rc(Mode::All), 0);
    }
}
