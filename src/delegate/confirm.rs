//! Delivery confirmation by a job's own `started` (ORCH 1.7, A24): after a prompt was accepted,
//! `send_keys_safe` counts it delivered when the job's events.log has a `started` line with the
//! current dispatch token, or its record is `running` with that token. The token is read right
//! before the submission, so a later re-dispatch cannot be mistaken for ours.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::joblog;
use crate::pane::Confirm;

/// The job whose own `started` confirms delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRef {
    pub registry: PathBuf,
    pub job_id: String,
    /// The current dispatch token; `None` reads it from the record before submitting.
    pub token: Option<String>,
}

/// `JobRef` as a `send_keys_safe` confirmer.
#[derive(Debug)]
pub struct JobStarted {
    pub job: JobRef,
    token: Option<String>,
    /// When the prompt was submitted: T counts from here (issue 30 item 4).
    submitted: Option<Instant>,
    /// When the job's own `started` was first seen here.
    started: Option<Instant>,
}

impl JobStarted {
    pub fn new(job: JobRef) -> JobStarted {
        JobStarted { job, token: None, submitted: None, started: None }
    }

    /// The moment right before the prompt was submitted, once it was.
    pub fn submitted(&self) -> Option<Instant> {
        self.submitted
    }

    /// The moment this confirmer saw the job's own `started`, if it did.
    pub fn started(&self) -> Option<Instant> {
        self.started
    }
}

impl Confirm for JobStarted {
    fn before_submit(&mut self) {
        self.token = self.job.token.clone().or_else(|| record_token(&self.job));
        self.submitted = Some(Instant::now());
    }
    fn confirmed(&mut self) -> Option<String> {
        let t = self.token.as_deref()?;
        let seen = job_started(&self.job, t);
        if seen {
            self.started.get_or_insert_with(Instant::now);
        }
        seen.then(|| format!("job {} reported started", self.job.job_id))
    }
}

fn read_json(p: &Path) -> Option<serde_json::Value> {
    serde_json::from_slice(&std::fs::read(p).ok()?).ok()
}

/// The record's current dispatch token.
pub fn record_token(j: &JobRef) -> Option<String> {
    let rec = read_json(&j.registry.join(format!("{}.json", j.job_id)))?;
    rec.get("dispatch_token")?.as_str().map(str::to_string)
}

/// True when the job's own `started` carries `token`: an `events.log` line with event `started` and
/// that token, or the record `running` with that token.
pub fn job_started(j: &JobRef, token: &str) -> bool {
    // Backwards and bounded (issue 12 item 8): this attempt's `started` is near the end.
    let mut seen = false;
    let events = joblog::events_log_path(&j.registry, &j.job_id);
    let _ = joblog::scan_lines_back(&events, joblog::MAX_LINE, joblog::LATEST_SCAN_BYTES, |line| {
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(line) else { return false };
        seen = v.get("event").and_then(|e| e.as_str()) == Some("started")
            && v.get("dispatch_token").and_then(|e| e.as_str()) == Some(token);
        seen
    });
    if seen {
        return true;
    }
    read_json(&j.registry.join(format!("{}.json", j.job_id))).is_some_and(|rec| {
        rec.get("status").and_then(|s| s.as_str()) == Some("running")
            && rec.get("dispatch_token").and_then(|s| s.as_str()) == Some(token)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn started_with_the_current_token_confirms() {
        let dir = std::env::temp_dir().join(format!("mam-sks-{}", crate::sys::random_hex(6).unwrap()));
        std::fs::create_dir_all(dir.join("j1")).unwrap();
        let job = JobRef { registry: dir.clone(), job_id: "j1".into(), token: Some("t1".into()) };
        let mut c = JobStarted::new(job.clone());
        c.before_submit();
        assert_eq!(c.confirmed(), None, "no started yet");
        // The job's own started with the current token confirms it; another token does not.
        std::fs::write(dir.join("j1/events.log"), "{\"event\":\"started\",\"attempt\":1,\"dispatch_token\":\"t0\"}\n")
            .unwrap();
        assert_eq!(c.confirmed(), None);
        std::fs::write(dir.join("j1/events.log"), "not json\n{\"event\":\"started\",\"dispatch_token\":\"t1\"}\n")
            .unwrap();
        assert_eq!(c.confirmed().as_deref(), Some("job j1 reported started"));
        // The record `running` with the token also counts; the token is read from the record, once,
        // before the submission.
        std::fs::remove_file(dir.join("j1/events.log")).unwrap();
        std::fs::write(dir.join("j1.json"), r#"{"status":"running","dispatch_token":"t9"}"#).unwrap();
        let mut c = JobStarted::new(JobRef { token: None, ..job });
        c.before_submit();
        std::fs::write(dir.join("j1.json"), r#"{"status":"running","dispatch_token":"t9"}"#).unwrap();
        assert_eq!(c.confirmed().as_deref(), Some("job j1 reported started"));
        // A re-dispatch after the submission (a new token) is not ours.
        std::fs::write(dir.join("j1.json"), r#"{"status":"running","dispatch_token":"t10"}"#).unwrap();
        assert_eq!(c.confirmed(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
