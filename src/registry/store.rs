//! The engine transaction (CORE 5.4): pre-checks 1-2 outside any lock, then under the registry lock
//! L1 exactly one read, one `engine::decide`, and at most one atomic record write; the audit entries
//! are flushed after L1 is released.
//!
//! Architecture Invariant: this is the only code that writes `<registry>/<job_id>.json`. While L1 is
//! held it spawns nothing, opens no socket, sleeps not, waits on no other lock and writes no other
//! file (the lock is marked with `mark_registry` so the `lockcheck` feature can prove it).
//!
//! Lock order (decided, DESIGN): the job's audit lock L5 is taken *before* L1 and held through the
//! flush, so one job's audit lines appear in transition_seq order. L5 is never taken while L1 is
//! held, which is the rule of CORE 0.6; the order L3 -> L2 -> L5 -> L1 has no cycle because nobody
//! holding L1 or L5 waits for L2 or L3.

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::audit;
pub use super::engine::Decided;
use super::engine::{self, Decision, Kind, Request};
use super::record::Record;
use crate::clock;
use crate::paths::Resolved;
use crate::sys::{self, Flock, LockMode};
use crate::text::show_path;

/// A registry and its audit-log root (both absolute, from `paths::resolve`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Store {
    pub registry: PathBuf,
    pub logs: PathBuf,
}

/// Why a request produced no decision to report (all rc 1 at the CLI).
#[derive(Debug)]
pub enum StoreError {
    /// Pre-checks 1-2 and other malformed requests; nothing was written.
    Invalid(String),
    /// Pre-check 4: no record and the kind does not create one.
    UnknownJob { job_id: String, registry: PathBuf },
    /// The record exists but is not a JSON object.
    Corrupt { path: PathBuf, why: String },
    /// An I/O failure on `path` while doing `what`.
    Io { what: &'static str, path: PathBuf, err: io::Error },
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Invalid(msg) => f.write_str(msg),
            StoreError::UnknownJob { job_id, registry } => {
                write!(f, "unknown job '{job_id}' (no record in {})", show_path(registry))
            }
            StoreError::Corrupt { path, why } => write!(f, "{}: not a valid job record ({why})", show_path(path)),
            StoreError::Io { what, path, err } => write!(f, "{}: {what} ({err})", show_path(path)),
        }
    }
}

/// What `apply` did.
#[derive(Debug)]
pub struct Outcome {
    pub decision: Decided,
    /// The record as read under L1, before the decision.
    pub before: Option<Record>,
    /// The audit flush failed after the decision (the record write, if any, stands).
    pub audit_error: Option<String>,
}

impl Outcome {
    /// The record after the request: the new one when applied, else the one read.
    pub fn record(&self) -> Option<&Record> {
        match &self.decision {
            Decided::Applied(a) => Some(&a.record),
            _ => self.before.as_ref(),
        }
    }
}

impl Store {
    pub fn new(registry: PathBuf, logs: PathBuf) -> Store {
        Store { registry, logs }
    }

    pub fn from_resolved(r: &Resolved) -> Store {
        Store { registry: r.registry.clone(), logs: r.logs.clone() }
    }

    pub fn record_path(&self, job_id: &str) -> PathBuf {
        self.registry.join(format!("{job_id}.json"))
    }

    /// Reads a record without a lock (the atomic rename guarantees a whole file). Missing is `None`.
    pub fn read(&self, job_id: &str) -> Result<Option<Record>, StoreError> {
        read_record(&self.record_path(job_id))
    }

    /// Reads a record that must exist.
    pub fn read_existing(&self, job_id: &str) -> Result<Record, StoreError> {
        self.read(job_id)?
            .ok_or_else(|| StoreError::UnknownJob { job_id: job_id.to_string(), registry: self.registry.clone() })
    }

    /// The job ids with a record, in directory order. Dotfiles (locks, temp files) and non-`.json`
    /// names are ignored. A missing registry has no jobs.
    pub fn job_ids(&self) -> Result<Vec<String>, StoreError> {
        let rd = match fs::read_dir(&self.registry) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(err) => return Err(StoreError::Io { what: "cannot list registry", path: self.registry.clone(), err }),
        };
        let mut ids = Vec::new();
        for e in rd {
            let e =
                e.map_err(|err| StoreError::Io { what: "cannot list registry", path: self.registry.clone(), err })?;
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with('.') || name.ends_with(".tmp") {
                continue;
            }
            if let Some(id) = name.strip_suffix(".json") {
                if clock::valid_job_id(id) {
                    ids.push(id.to_string());
                }
            }
        }
        Ok(ids)
    }

    /// One engine transaction (CORE 5.4) for `req` at `now_ms`.
    pub fn apply(&self, req: &Request, now_ms: u64) -> Result<Outcome, StoreError> {
        if let Some(msg) = engine::precheck_static(req) {
            return Err(StoreError::Invalid(msg));
        }
        if !clock::valid_job_id(&req.job_id) {
            return Err(StoreError::Invalid(format!("invalid job id '{}'", crate::text::one_line(&req.job_id))));
        }
        let path = self.record_path(&req.job_id);
        // Pre-check 4 without creating anything: a request that cannot create a record on a job that
        // has none leaves the disk alone (read-only when it is an unknown job, CORE 2.1).
        if !matches!(req.kind, Kind::Register | Kind::Mirror | Kind::Unknown(_)) && !exists(&path) {
            return Err(StoreError::UnknownJob { job_id: req.job_id.clone(), registry: self.registry.clone() });
        }
        sys::create_dir_all(&self.registry).map_err(|err| StoreError::Io {
            what: "cannot create registry directory",
            path: self.registry.clone(),
            err,
        })?;
        let mut audit_error = None;
        let audit_lock = match audit::lock(&self.logs, &req.job_id) {
            Ok(l) => Some(l),
            Err(e) => {
                audit_error =
                    Some(format!("{}: audit not written ({e})", show_path(&audit::job_dir(&self.logs, &req.job_id))));
                None
            }
        };

        let (before, decision) = {
            let lock_path = self.registry.join(".registry.lock");
            let _l1 = Flock::lock_path(&lock_path, LockMode::Exclusive)
                .map_err(|err| StoreError::Io { what: "cannot lock registry", path: lock_path.clone(), err })?
                .mark_registry();
            let before = read_record(&path)?;
            let decision = engine::decide(before.as_ref(), req, now_ms);
            if let Decision::Applied(a) = &decision {
                sys::atomic_write(&path, &a.record.to_bytes()).map_err(|err| StoreError::Io {
                    what: "cannot write record",
                    path: path.clone(),
                    err,
                })?;
            }
            (before, decision)
            // L1 released here.
        };

        let decision = match decision {
            Decision::Applied(a) => Decided::Applied(a),
            Decision::Idempotent { status } => Decided::Idempotent { status },
            Decision::Refused { reason } => Decided::Refused { reason },
            Decision::Invalid(msg) => return Err(StoreError::Invalid(msg)),
            Decision::UnknownJob => {
                return Err(StoreError::UnknownJob { job_id: req.job_id.clone(), registry: self.registry.clone() })
            }
        };
        let entries = audit::entries_for(req, before.as_ref(), &decision, now_ms);
        let mirror = match &decision {
            Decided::Applied(a) => Some(audit::mirror_of(&a.record)),
            _ => None,
        };
        if let Some(l) = &audit_lock {
            if let Err(e) = l.flush(&entries, mirror.as_ref()) {
                audit_error =
                    Some(format!("{}: audit not written ({e})", show_path(&audit::job_dir(&self.logs, &req.job_id))));
            }
        }
        drop(audit_lock);
        if let Decided::Applied(_) = decision {
            clean_stale_temps(&self.registry, &format!("{}.json", req.job_id));
            clean_stale_temps(&audit::job_dir(&self.logs, &req.job_id), "status.json");
        }
        Ok(Outcome { decision, before, audit_error })
    }
}

fn exists(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok()
}

fn read_record(path: &Path) -> Result<Option<Record>, StoreError> {
    match fs::read(path) {
        Ok(bytes) => Record::parse(&bytes)
            .map(Some)
            .map_err(|e| StoreError::Corrupt { path: path.to_path_buf(), why: e.to_string() }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(StoreError::Io { what: "cannot read record", path: path.to_path_buf(), err }),
    }
}

/// Removes `.<name>.<pid>.<16hex>.tmp` files in `dir` whose writer is dead (a writer killed between
/// creating its temp file and the rename). The pattern is matched exactly, so another job whose id
/// extends this one's is never touched; a live pid (even a reused one) keeps its file.
pub fn clean_stale_temps(dir: &Path, name: &str) {
    let Ok(rd) = fs::read_dir(dir) else { return };
    let prefix = format!(".{name}.");
    for e in rd.flatten() {
        let file = e.file_name();
        let Some(file) = file.to_str() else { continue };
        let Some(middle) = file.strip_prefix(&prefix).and_then(|m| m.strip_suffix(".tmp")) else { continue };
        let Some((pid, hex)) = middle.split_once('.') else { continue };
        let pid_ok = !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit());
        let hex_ok = hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit());
        if !(pid_ok && hex_ok) {
            continue;
        }
        let Ok(pid) = pid.parse::<i32>() else { continue };
        if pid != std::process::id() as i32 && !sys::process_exists(pid) {
            let _ = fs::remove_file(e.path());
        }
    }
}
