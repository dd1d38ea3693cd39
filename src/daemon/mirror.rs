//! Mirroring the wire (and, in the polling fallback, events.log) into the workspace's registry
//! (CORE 10.2 steps 3 and 5, A12): a message for a job with a record here is judged by the CORE 8.3
//! acceptance rules (`watch::accept`, one `Acceptor` per job keyed by attempt and dispatch token)
//! and mirrored with agent authority through `registry::store`: `started` -> `claim`, a terminal
//! event or state -> `terminal S`. The engine audits refusals; drops are audited once per seq,
//! within the per-job budget of `watch::accept::DropBudget`.
//!
//! Nothing here prints or touches the network: callers hand in payloads and get log lines back.

use std::collections::HashMap;
use std::path::Path;

use serde_json::{json, Value};

use super::sweep::TerminalCache;
use crate::joblog;
use crate::registry::audit;
use crate::registry::engine::{Authority, Kind, Request};
use crate::registry::is_terminal;
use crate::registry::record::Record;
use crate::registry::store::{Decided, Store};
use crate::sys;
use crate::watch::accept::{Acceptor, DropAudit, Identity, Outcome, DROP_WINDOW_MS};

/// How much of the end of each events.log a polling pass reads.
pub const POLL_WINDOW: u64 = 8 * 1024 * 1024;

/// The mirror of one workspace registry.
#[derive(Debug)]
pub struct Mirror {
    store: Store,
    topic_root: String,
    cas: bool,
    acceptors: HashMap<String, Acceptor>,
    cache: TerminalCache,
}

/// What a polling pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pass {
    /// Non-terminal jobs looked at.
    pub open: usize,
    /// Log lines for the requests it sent.
    pub lines: Vec<String>,
}

/// `<root>/jobs/<level>/events|state` -> (job_id, "events"|"state"); the level is the id with its
/// `.` carried as `~` (issue 19) or, from an older mam, as is.
pub fn parse_topic<'a>(root: &str, topic: &'a str) -> Option<(String, &'a str)> {
    let rest = topic.strip_prefix(root)?.strip_prefix("/jobs/")?;
    let (level, leaf) = rest.split_once('/')?;
    let id = crate::mqtt::config::job_id_of_level(level);
    (matches!(leaf, "events" | "state") && crate::clock::valid_job_id(&id)).then_some((id, leaf))
}

/// The current attempt's identity from a record, when it has all three parts.
pub fn identity(rec: &Record) -> Option<Identity> {
    Some(Identity {
        attempt: rec.attempt()?,
        dispatch_token: rec.str("dispatch_token")?.to_string(),
        auth_token: rec.str("auth_token")?.to_string(),
    })
}

fn same_identity(a: &Identity, b: &Identity) -> bool {
    a.attempt == b.attempt && a.dispatch_token == b.dispatch_token && a.auth_token == b.auth_token
}

impl Mirror {
    pub fn new(store: Store, topic_root: &str, cas: bool) -> Mirror {
        Mirror {
            store,
            topic_root: topic_root.to_string(),
            cas,
            acceptors: HashMap::new(),
            cache: TerminalCache::default(),
        }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The subscription filters (CORE 10.2 step 3).
    pub fn filters(&self) -> Vec<String> {
        vec![format!("{}/jobs/+/events", self.topic_root), format!("{}/jobs/+/state", self.topic_root)]
    }

    /// How many jobs have an acceptor (for tests and the RSS benchmark).
    pub fn tracked(&self) -> usize {
        self.acceptors.len()
    }

    /// Judges and mirrors one wire message. `retained` messages never produce a refusal for a job
    /// that is already terminal (a retained snapshot is replayed on every subscribe).
    pub fn on_message(&mut self, topic: &str, payload: &[u8], retained: bool, now_ms: u64) -> Vec<String> {
        let Some((id, _leaf)) = parse_topic(&self.topic_root, topic) else { return Vec::new() };
        let id = id.as_str();
        if payload.is_empty() {
            return Vec::new();
        }
        let rec = match self.store.read(id) {
            Ok(Some(r)) => r,
            Ok(None) => return Vec::new(),
            Err(e) => return vec![format!("{e}; message on {} ignored", crate::text::one_line(topic))],
        };
        let Some(ident) = identity(&rec) else { return Vec::new() };
        let attempt = ident.attempt;
        let acc = self.acceptors.entry(id.to_string()).or_insert_with(|| Acceptor::new(ident.clone()));
        if !same_identity(&acc.id, &ident) {
            *acc = Acceptor::new(ident);
        }
        let outcome = acc.offer(payload);
        let mut lines = Vec::new();
        match &outcome {
            Outcome::Dropped { seq, reason, audit: true } => {
                // Issue 12 item 9: at most DROP_AUDITS_PER_WINDOW audit lines per job and window,
                // then one summary of how many more were dropped.
                if let DropAudit::Write { summary } = acc.drops.admit(now_ms) {
                    let mut entries = Vec::new();
                    if let Some(n) = summary {
                        let rest = json!({"more": n, "window_ms": DROP_WINDOW_MS, "by": "daemon"});
                        entries.push(audit::entry(now_ms, id, Some(attempt), "dropped_summary", rest));
                        lines.push(format!("job {id}: dropped {n} more (not audited one by one)"));
                    }
                    let rest = json!({"reason": reason.as_str(), "seq": seq, "by": "daemon", "topic": topic});
                    entries.push(audit::entry(now_ms, id, Some(attempt), "dropped", rest));
                    if let Err(err) = audit::flush(&self.store.logs, id, &entries, None) {
                        lines.push(format!("job {id}: audit not written ({err})"));
                    }
                    lines.push(format!("job {id}: dropped seq={} reason={}", seq.unwrap_or(0), reason.as_str()));
                }
            }
            Outcome::Event { event, .. } if event == "started" && rec.status() == "pending" => {
                lines.extend(self.request(&rec, id, Kind::Claim, None, now_ms).0);
            }
            _ => {}
        }
        if let Some(s) = outcome.terminal() {
            // The attempt has ended: its acceptor is not needed any more (a later message rebuilds one).
            self.acceptors.remove(id);
            let s = s.to_string();
            let current = rec.status();
            if current != s && !(retained && is_terminal(current)) {
                let (applied, to) = self.request(&rec, id, Kind::Terminal, Some(&s), now_ms);
                lines.extend(applied);
                if to.is_some() && matches!(outcome, Outcome::Event { .. }) {
                    lines.extend(write_report(&rec, id, payload));
                }
            }
        }
        lines
    }

    /// One engine request with agent authority for the record's attempt and token; returns log lines
    /// and, when applied, the new status.
    fn request(
        &mut self,
        rec: &Record,
        id: &str,
        kind: Kind,
        target: Option<&str>,
        now_ms: u64,
    ) -> (Vec<String>, Option<String>) {
        let mut req = Request::new(kind.clone(), Authority::Agent, id);
        req.attempt = rec.attempt();
        req.dispatch_token = rec.str("dispatch_token").map(str::to_string);
        req.target_status = target.map(str::to_string);
        req.cas = self.cas;
        let what = match target {
            Some(s) => format!("{} {s}", kind.name()),
            None => kind.name().to_string(),
        };
        let mut lines = Vec::new();
        let mut applied = None;
        match self.store.apply(&req, now_ms) {
            Ok(o) => {
                if let Some(w) = &o.audit_error {
                    lines.push(format!("job {id}: {w}"));
                }
                match o.decision {
                    Decided::Applied(a) => {
                        lines.push(format!("job {id}: {what}: {} -> {}", a.from.clone().unwrap_or_default(), a.to));
                        if is_terminal(&a.to) {
                            self.acceptors.remove(id);
                        }
                        applied = Some(a.to);
                    }
                    Decided::Idempotent { status } => lines.push(format!("job {id}: {what}: already {status}")),
                    Decided::Refused { reason } => lines.push(format!("job {id}: {what}: refused ({reason})")),
                }
            }
            Err(e) => lines.push(format!("job {id}: {what}: {e}")),
        }
        (lines, applied)
    }

    /// One polling pass (CORE 10.2 step 5): for each non-terminal job, read the end of its events.log
    /// (at most `POLL_WINDOW` bytes) and apply the `started` and terminal lines of the current
    /// attempt and token. Lines go to `log` as they happen, starting with `poll pass: N open job(s)` when there is anything to look at. It runs to
    /// the end once started; signals are the caller's business between passes.
    pub fn poll_pass(&mut self, now_ms: u64, log: &mut dyn FnMut(&str)) -> Pass {
        let mut pass = Pass::default();
        let Ok(ids) = self.store.ids() else { return pass };
        // Only the open jobs are kept: the ids stream from the directory, the terminal ones cost a stat.
        let open: Vec<(String, Record)> = ids
            .map_while(Result::ok)
            .filter_map(|id| self.cache.open_record(&self.store, &id).map(|r| (id, r)))
            .collect();
        pass.open = open.len();
        if open.is_empty() {
            return pass;
        }
        log(&format!("poll pass: {} open job(s)", open.len()));
        for (id, rec) in open {
            let Some(ident) = identity(&rec) else { continue };
            // The last POLL_WINDOW bytes of events.log, whole lines only (issue 12 item 8): the
            // current attempt's lines are at the end, and a huge log must not stall the pass.
            let mut lines_back = Vec::new();
            let events = self.store.registry.join(&id).join("events.log");
            let read = joblog::scan_lines_back(&events, joblog::MAX_LINE, POLL_WINDOW, |l| {
                lines_back.push(l.to_vec());
                false
            });
            if read.is_err() {
                continue;
            }
            // A fresh acceptor per pass: the window is read again every time (CORE 8.2).
            let mut acc = Acceptor::new(ident);
            let (mut started, mut terminal) = (false, None);
            for line in lines_back.iter().rev() {
                let out = acc.offer(line);
                if let Outcome::Event { event, .. } = &out {
                    started |= event == "started";
                }
                if terminal.is_none() {
                    terminal = out.terminal().map(str::to_string);
                }
            }
            let mut lines = Vec::new();
            if started && rec.status() == "pending" {
                lines.extend(self.request(&rec, &id, Kind::Claim, None, now_ms).0);
            }
            if let Some(s) = terminal {
                let rec = self.store.read(&id).ok().flatten().unwrap_or(rec);
                if rec.status() != s {
                    lines.extend(self.request(&rec, &id, Kind::Terminal, Some(&s), now_ms).0);
                }
            }
            for l in &lines {
                log(l);
            }
            pass.lines.extend(lines);
        }
        log(&format!("poll pass done: {} request(s)", pass.lines.len()));
        pass
    }
}

/// A12: a remote job's terminal event carries `data.report`; write it atomically to the record's
/// `report_path`.
fn write_report(rec: &Record, id: &str, payload: &[u8]) -> Option<String> {
    if rec.str("transport") != Some("remote") {
        return None;
    }
    let path = rec.str("report_path")?;
    let v: Value = serde_json::from_slice(payload).ok()?;
    let report = v.get("data")?.get("report")?.as_str()?;
    let path = Path::new(path);
    let result = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => sys::create_dir_all(dir),
        _ => Ok(()),
    }
    .and_then(|_| sys::atomic_write(path, report.as_bytes()));
    Some(match result {
        Ok(()) => format!("job {id}: report written to {}", crate::text::show_path(path)),
        Err(e) => format!("job {id}: cannot write report {} ({e})", crate::text::show_path(path)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics() {
        assert_eq!(parse_topic("mam", "mam/jobs/ab12/events"), Some(("ab12".into(), "events")));
        assert_eq!(parse_topic("a/b", "a/b/jobs/x.y/state"), Some(("x.y".into(), "state")));
        assert_eq!(parse_topic("a/b", "a/b/jobs/x~y/state"), Some(("x.y".into(), "state")));
        assert_eq!(parse_topic("mam", "mam/jobs/ab12/dispatch/1"), None);
        assert_eq!(parse_topic("mam", "mamx/jobs/ab12/events"), None);
        assert_eq!(parse_topic("mam", "mam/jobs//events"), None);
        assert_eq!(parse_topic("mam", "mam/jobs/a/b/events"), None);
    }
}
