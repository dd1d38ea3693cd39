//! Verdict notifications (issue 21): a verdict (a job's terminal status: completed, failed,
//! unresponsive, agent_blocked, ...; or a review loop's promotion or stop) runs the user's
//! `MAM_ON_VERDICT` command once, with the verdict in `MAM_VERDICT_*` variables.
//!
//! Who runs it: whoever sees the verdict first among the job's delegate-job wrapper (its own job),
//! the workspace daemon (every job of its registry that it saw end) and the loop (its own outcome).
//! Once per verdict, not once per watcher: the first of them creates the verdict's marker file with
//! `O_EXCL` (`<registry>/<job_id>/verdict.<attempt>`, `<loop dir>/verdict`); the others find it and
//! do nothing. The command runs under `mam notify run` (`hook`), a detached supervisor with a
//! deadline, so no caller ever waits for it and a hook that hangs, fails or floods its output
//! changes nothing but its log line.
//!
//! Architecture Invariant: a hook gets the environment of `ChildRole::Agent` (no secret) plus the
//! `MAM_VERDICT_*` values, each one line of text; nothing of the verdict is put in an argv. This
//! module never prints; it returns values and errors.

pub mod hook;

use std::ffi::OsString;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::clock;
use crate::ctx::{ChildRole, Ctx};
use crate::knob::{self, ConfigError};
use crate::registry::is_terminal;
use crate::registry::record::Record;
use crate::sys;
use crate::text::{one_line, show_path};

/// The command variable (env or `.mam.env`).
pub const COMMAND_VAR: &str = "MAM_ON_VERDICT";
/// The hook's word for an open job whose agent waits for a person (issue 30).
pub const WAITING: &str = "waiting_for_you";
/// Its deadline in seconds (default `DEFAULT_TIMEOUT_S`).
pub const TIMEOUT_VAR: &str = "MAM_ON_VERDICT_TIMEOUT_S";
pub const DEFAULT_TIMEOUT_S: u32 = 30;
/// The log of every hook run, under the audit-log root.
pub const LOG_NAME: &str = "notify.log";

/// What a verdict is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    Job,
    Loop,
}

impl Subject {
    pub fn word(self) -> &'static str {
        match self {
            Subject::Job => "job",
            Subject::Loop => "loop",
        }
    }
}

/// One verdict, as the hook sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub subject: Subject,
    /// The job's id; for a loop, the loop job's id (empty when it had none).
    pub job_id: String,
    /// The loop's id (loops only).
    pub loop_id: Option<String>,
    pub attempt: Option<u64>,
    pub session: String,
    /// The verdict word: the terminal status, `unresponsive` for a job closed silent, `promoted` or
    /// `stopped` for a loop.
    pub verdict: String,
    /// The record's status (a loop: its outcome).
    pub status: String,
    pub reason: String,
    pub report: Option<PathBuf>,
}

impl Verdict {
    /// The verdict of a terminal record; `None` while it is open.
    pub fn of_record(rec: &Record) -> Option<Verdict> {
        let status = rec.status();
        if !is_terminal(status) {
            return None;
        }
        let reason = rec.str("reason").unwrap_or("").to_string();
        let verdict = crate::registry::verdict_word(status, &reason);
        Some(Verdict {
            subject: Subject::Job,
            job_id: rec.str("job_id").unwrap_or("").to_string(),
            loop_id: None,
            attempt: rec.attempt(),
            session: rec.str("agent_session").unwrap_or("").to_string(),
            verdict: verdict.to_string(),
            status: status.to_string(),
            reason,
            // Issue 30: only a report that exists is named (a job closed before its agent wrote one
            // has none).
            report: rec.str("report_path").map(PathBuf::from).filter(|p| crate::sys::is_nonempty_file(p)),
        })
    }

    /// Not a verdict: an open job whose agent waits for a person (issue 30), `MAM_VERDICT` is
    /// `waiting_for_you`, the reason what it waits for. The job stays open.
    pub fn waiting(job_id: &str, attempt: u64, session: &str, status: &str, what: &str) -> Verdict {
        Verdict {
            subject: Subject::Job,
            job_id: job_id.to_string(),
            loop_id: None,
            attempt: Some(attempt),
            session: session.to_string(),
            verdict: WAITING.to_string(),
            status: status.to_string(),
            reason: what.strip_prefix("waiting for you: ").unwrap_or(what).to_string(),
            report: None,
        }
    }

    /// A review loop's end: `promoted` for outcome `promoted`, else `stopped`.
    pub fn of_loop(
        loop_id: &str,
        job_id: &str,
        creator: &str,
        outcome: &str,
        reason: &str,
        report: Option<&Path>,
    ) -> Verdict {
        Verdict {
            subject: Subject::Loop,
            job_id: job_id.to_string(),
            loop_id: Some(loop_id.to_string()),
            attempt: None,
            session: creator.to_string(),
            verdict: if outcome == "promoted" { "promoted" } else { "stopped" }.to_string(),
            status: outcome.to_string(),
            reason: reason.to_string(),
            report: report.map(Path::to_path_buf),
        }
    }

    /// `job 1abbcdef (worker): completed` / `loop 7f.. (creator): stopped (failed: wall_clock)`.
    pub fn summary(&self) -> String {
        let id = match (self.subject, &self.loop_id) {
            (Subject::Loop, Some(l)) => l.as_str(),
            _ => self.job_id.as_str(),
        };
        let mut s = format!("{} {id}", self.subject.word());
        if !self.session.is_empty() {
            s.push_str(&format!(" ({})", self.session));
        }
        s.push_str(&format!(": {}", self.verdict));
        let detail = match (self.status != self.verdict, self.reason.is_empty()) {
            (true, false) => format!("{}: {}", self.status, self.reason),
            (true, true) => self.status.clone(),
            (false, false) => self.reason.clone(),
            (false, true) => String::new(),
        };
        if !detail.is_empty() {
            s.push_str(&format!(" ({detail})"));
        }
        one_line(&s)
    }

    /// The `MAM_VERDICT_*` variables, every value one line; `by` says who ran the hook.
    pub fn env(&self, by: &str) -> Vec<(String, String)> {
        let mut v = vec![
            ("MAM_VERDICT", self.verdict.clone()),
            ("MAM_VERDICT_KIND", self.subject.word().to_string()),
            ("MAM_VERDICT_JOB_ID", self.job_id.clone()),
            ("MAM_VERDICT_SESSION", self.session.clone()),
            ("MAM_VERDICT_STATUS", self.status.clone()),
            ("MAM_VERDICT_REASON", self.reason.clone()),
            ("MAM_VERDICT_REPORT", self.report.as_ref().map(|p| p.to_string_lossy().into_owned()).unwrap_or_default()),
            ("MAM_VERDICT_SUMMARY", self.summary()),
            ("MAM_VERDICT_BY", by.to_string()),
        ];
        if let Some(a) = self.attempt {
            v.push(("MAM_VERDICT_ATTEMPT", a.to_string()));
        }
        if let Some(l) = &self.loop_id {
            v.push(("MAM_VERDICT_LOOP_ID", l.clone()));
        }
        v.into_iter().map(|(k, val)| (k.to_string(), one_line(&val))).collect()
    }
}

/// Why a hook could not be started.
#[derive(Debug)]
pub enum NotifyError {
    /// `MAM_ON_VERDICT_TIMEOUT_S` is not a valid knob.
    Config(ConfigError),
    /// The marker could not be created for another reason than "already there".
    Marker {
        path: PathBuf,
        err: io::Error,
    },
    Spawn(io::Error),
}

impl fmt::Display for NotifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotifyError::Config(e) => e.fmt(f),
            NotifyError::Marker { path, err } => {
                write!(f, "{}: cannot create the verdict marker ({err}); hook not run", show_path(path))
            }
            NotifyError::Spawn(e) => write!(f, "cannot start the verdict hook supervisor ({e})"),
        }
    }
}

/// The marker of a job verdict: `<registry>/<job_id>/verdict.<attempt>`.
pub fn job_marker(registry: &Path, job_id: &str, attempt: u64) -> PathBuf {
    registry.join(job_id).join(format!("verdict.{attempt}"))
}

/// The marker of a loop verdict: `<loop dir>/verdict`.
pub fn loop_marker(loop_dir: &Path) -> PathBuf {
    loop_dir.join("verdict")
}

/// Creates `marker` (O_EXCL, no symlink followed): true when this caller is the first, false when
/// somebody already claimed the verdict.
pub fn claim(marker: &Path, by: &str) -> io::Result<bool> {
    if let Some(dir) = marker.parent() {
        sys::create_dir_all(dir)?;
    }
    match sys::create_new(marker) {
        Ok(f) => {
            use std::io::Write;
            let mut f = f;
            let _ = writeln!(f, "{} {by} pid={}", clock::now_ts(), std::process::id());
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    }
}

/// True when a hook is configured (`MAM_ON_VERDICT` set and not empty).
pub fn configured(ctx: &Ctx) -> bool {
    ctx.var_nonempty(COMMAND_VAR).is_some_and(|c| !c.trim().is_empty())
}

/// Where hook runs are logged: `<logs>/notify.log`.
pub fn log_path(logs: &Path) -> PathBuf {
    logs.join(LOG_NAME)
}

/// Runs the configured hook for `v` once: claims `marker`, then starts `mam notify run` detached
/// (setsid, no stdio, from the control root). `Ok(None)`: no hook configured, or the verdict was claimed already. The
/// returned child is the supervisor; a long-lived caller reaps it (`try_wait`), a short-lived one
/// may drop it.
pub fn start(ctx: &Ctx, v: &Verdict, marker: &Path, logs: &Path, by: &str) -> Result<Option<Child>, NotifyError> {
    if !configured(ctx) {
        return Ok(None);
    }
    let timeout = knob::env_or(ctx, TIMEOUT_VAR, 1, DEFAULT_TIMEOUT_S).map_err(NotifyError::Config)?;
    match claim(marker, by) {
        Ok(true) => {}
        Ok(false) => return Ok(None),
        Err(err) => return Err(NotifyError::Marker { path: marker.to_path_buf(), err }),
    }
    let exe = std::env::current_exe().map_err(NotifyError::Spawn)?;
    let mut c = Command::new(exe);
    c.arg("notify").arg("run").arg("--timeout").arg(timeout.to_string()).arg("--log").arg(log_path(logs));
    c.env_clear().envs(ctx.child_env_for(ChildRole::Agent));
    for (k, val) in v.env(by) {
        c.env(k, OsString::from(val));
    }
    // From the control root, whoever saw the verdict (a recipe may name `.mam/on-verdict.sh`).
    let root = crate::paths::find_control_root(ctx);
    let cwd = if root.is_dir() { root } else { ctx.cwd().to_path_buf() };
    c.current_dir(cwd).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    sys::set_new_session(&mut c);
    sys::spawn(&mut c).map(Some).map_err(NotifyError::Spawn)
}

/// `start` for a terminal job record: its marker, its registry's log root. `Ok(None)` also for a
/// record that is still open.
pub fn start_for_record(
    ctx: &Ctx,
    registry: &Path,
    logs: &Path,
    rec: &Record,
    by: &str,
) -> Result<Option<Child>, NotifyError> {
    let Some(v) = Verdict::of_record(rec) else { return Ok(None) };
    let marker = job_marker(registry, &v.job_id, v.attempt.unwrap_or(0));
    start(ctx, &v, &marker, logs, by)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rec(v: serde_json::Value) -> Record {
        Record::new(v.as_object().unwrap().clone())
    }

    #[test]
    fn a_record_verdict_names_unresponsive_and_keeps_every_value_on_one_line() {
        let dir = std::env::temp_dir().join(format!("mam-notify-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let report = dir.join("report.md");
        std::fs::write(&report, "# r\n").unwrap();
        let r = rec(json!({"job_id": "1abbcdef", "attempt": 2, "status": "deadline_timeout",
            "reason": "unresponsive", "agent_session": "worker", "report_path": report}));
        let v = Verdict::of_record(&r).unwrap();
        assert_eq!((v.verdict.as_str(), v.status.as_str()), ("unresponsive", "deadline_timeout"));
        assert_eq!(v.summary(), "job 1abbcdef (worker): unresponsive (deadline_timeout: unresponsive)");
        let env = v.env("daemon");
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("MAM_VERDICT_ATTEMPT"), Some("2"));
        assert_eq!(get("MAM_VERDICT_REPORT"), report.to_str());
        std::fs::remove_dir_all(&dir).unwrap();
        let none = rec(json!({"job_id": "j", "status": "agent_blocked", "report_path": "/nonexistent/report.md"}));
        let env = Verdict::of_record(&none).unwrap().env("daemon");
        let got = env.iter().find(|(n, _)| n == "MAM_VERDICT_REPORT").map(|(_, v)| v.as_str());
        assert_eq!(got, Some(""), "no report is named when none was written");
        assert_eq!(get("MAM_VERDICT_BY"), Some("daemon"));
        assert!(Verdict::of_record(&rec(json!({"status": "running"}))).is_none());
        let r = rec(json!({"job_id": "j", "status": "failed", "reason": "bad\nline\u{1b}[31m"}));
        let v = Verdict::of_record(&r).unwrap();
        assert!(v.env("x").iter().all(|(_, val)| !val.contains('\n') && !val.contains('\u{1b}')), "{:?}", v.env("x"));
        let l = Verdict::of_loop("L1", "j1", "creator", "failed", "wall_clock", None);
        assert_eq!(l.summary(), "loop L1 (creator): stopped (failed: wall_clock)");
        assert_eq!(Verdict::of_loop("L1", "j1", "c", "promoted", "", None).summary(), "loop L1 (c): promoted");
    }

    #[test]
    fn a_verdict_is_claimed_once() {
        let dir = std::env::temp_dir().join(format!("mam-notify-{}", sys::random_hex(4).unwrap()));
        let m = job_marker(&dir, "j1", 1);
        assert!(claim(&m, "a").unwrap());
        assert!(!claim(&m, "b").unwrap());
        assert!(std::fs::read_to_string(&m).unwrap().contains(" a pid="));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
