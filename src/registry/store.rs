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
use std::time::Instant;

use super::audit;
pub use super::engine::Decided;
use super::engine::{self, Decision, Kind, Request};
use super::record::Record;
use crate::clock;
use crate::paths::Resolved;
use crate::sys::{self, Flock, LockMode};
use crate::text::show_path;
use crate::trace;

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
        self.ids()?.collect()
    }

    /// `job_ids` as a stream over the directory: nothing is collected, so a sweep over 100,000
    /// records holds one id at a time.
    pub fn ids(&self) -> Result<JobIds, StoreError> {
        let rd = match fs::read_dir(&self.registry) {
            Ok(rd) => Some(rd),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(err) => return Err(StoreError::Io { what: "cannot list registry", path: self.registry.clone(), err }),
        };
        Ok(JobIds { rd, registry: self.registry.clone() })
    }

    /// Calls `f` with every record's id and bytes, in directory order, one record at a time (one
    /// buffer reused, each file opened relative to the registry). A record removed since the
    /// listing is skipped; one that cannot be read comes as `Err`. A missing registry has none.
    pub fn for_each_record(&self, mut f: impl FnMut(Entry<'_>)) -> Result<(), StoreError> {
        let ids = self.ids()?;
        if ids.rd.is_none() {
            return Ok(());
        }
        let dir = self.open_dir()?;
        let mut err = None;
        let ids = ids.map_while(|r| r.map_err(|e| err = Some(e)).ok());
        self.read_each(&dir, ids, &mut Vec::with_capacity(8192), &mut f);
        err.map_or(Ok(()), Err)
    }

    /// `for_each_record` on up to `threads` threads, each with its own accumulator from `init`
    /// (returned, the calling thread's first), for listings of large registries: reading and parsing
    /// 100,000 records is half system time, half parsing, and every core can take a share. Ids are
    /// handed out 256 at a time, so `f` does not see records in directory order; a registry of at
    /// most 256 records is read on the calling thread alone.
    pub fn scan_records<A: Send>(
        &self,
        threads: usize,
        init: impl Fn() -> A + Sync,
        f: impl Fn(&mut A, Entry<'_>) + Sync,
    ) -> Result<Vec<A>, StoreError> {
        const CHUNK: usize = 256;
        let mut ids = self.ids()?;
        if ids.rd.is_none() {
            return Ok(vec![init()]);
        }
        let dir = self.open_dir()?;
        let first: Vec<String> = ids.by_ref().take(CHUNK).collect::<Result<_, _>>()?;
        let threads = if first.len() < CHUNK { 1 } else { threads.max(1) };
        // The directory stream, the first chunk (already read), the first listing error.
        let shared = std::sync::Mutex::new((ids, Some(first), None::<StoreError>));
        let next_chunk = || -> Option<Vec<String>> {
            let mut g = shared.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(first) = g.1.take() {
                return Some(first);
            }
            let mut chunk = Vec::with_capacity(CHUNK);
            while chunk.len() < CHUNK {
                match g.0.next() {
                    Some(Ok(id)) => chunk.push(id),
                    Some(Err(e)) => {
                        g.2.get_or_insert(e);
                        break;
                    }
                    None => break,
                }
            }
            (!chunk.is_empty()).then_some(chunk)
        };
        let work = || {
            let mut acc = init();
            let mut buf = Vec::with_capacity(8192);
            while let Some(chunk) = next_chunk() {
                self.read_each(&dir, chunk.into_iter(), &mut buf, &mut |e| f(&mut acc, e));
            }
            acc
        };
        let accs = std::thread::scope(|s| {
            let others: Vec<_> = (1..threads).map(|_| s.spawn(work)).collect();
            let mut accs = vec![work()];
            for h in others {
                // A panic in `f` is a bug; it is passed on as it would be on this thread.
                accs.push(h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
            }
            accs
        });
        match shared.into_inner().unwrap_or_else(|e| e.into_inner()).2 {
            Some(e) => Err(e),
            None => Ok(accs),
        }
    }

    fn open_dir(&self) -> Result<sys::DirHandle, StoreError> {
        sys::DirHandle::open(&self.registry).map_err(|err| StoreError::Io {
            what: "cannot list registry",
            path: self.registry.clone(),
            err,
        })
    }

    /// Reads the records of `ids` one by one into `buf` and hands each to `f`.
    fn read_each(
        &self,
        dir: &sys::DirHandle,
        ids: impl Iterator<Item = String>,
        buf: &mut Vec<u8>,
        f: &mut dyn FnMut(Entry<'_>),
    ) {
        let mut name = String::new();
        for id in ids {
            name.clear();
            name.push_str(&id);
            name.push_str(".json");
            let bytes = match dir.read_into(name.as_ref(), buf) {
                Ok(true) => Ok(&buf[..]),
                Ok(false) => continue, // removed since the listing
                Err(err) => Err(StoreError::Io { what: "cannot read record", path: self.record_path(&id), err }),
            };
            f(Entry { id: &id, bytes, dir });
        }
    }

    /// One engine transaction (CORE 5.4) for `req` at `now_ms`.
    pub fn apply(&self, req: &Request, now_ms: u64) -> Result<Outcome, StoreError> {
        let (mut out, audit) = self.apply_deferred(req, now_ms)?;
        if let Some(e) = audit.flush() {
            out.audit_error = Some(e);
        }
        Ok(out)
    }

    /// `apply` up to the durable record write: the decision is made and the record written (and
    /// fsynced) under L1; the audit entries and status.json are left to `AuditFlush::flush`, which
    /// still holds L5, so whatever the caller does meanwhile (`mam publish` sends its event, issue
    /// 20) no other audit line of this job can come before them.
    pub fn apply_deferred(&self, req: &Request, now_ms: u64) -> Result<(Outcome, AuditFlush), StoreError> {
        self.apply_deferred_staging(req, now_ms, &mut |_| {})
    }

    /// `apply_deferred` that hands the mirror of an applied decision to `decided` (under L1, just
    /// before the record is written), so status.json can be staged on another thread meanwhile
    /// (`audit::stage_mirror`); `decided` must not do I/O itself (CORE 5.4).
    pub fn apply_deferred_staging(
        &self,
        req: &Request,
        now_ms: u64,
        decided: &mut dyn FnMut(serde_json::Value),
    ) -> Result<(Outcome, AuditFlush), StoreError> {
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

        let t = Instant::now();
        let (before, decision) = {
            let lock_path = self.registry.join(".registry.lock");
            let _l1 = Flock::lock_path(&lock_path, LockMode::Exclusive)
                .map_err(|err| StoreError::Io { what: "cannot lock registry", path: lock_path.clone(), err })?
                .mark_registry();
            let before = read_record(&path)?;
            let decision = engine::decide(before.as_ref(), req, now_ms);
            if let Decision::Applied(a) = &decision {
                if audit_lock.is_some() {
                    decided(audit::mirror_of(&a.record));
                }
                sys::atomic_write(&path, &a.record.to_bytes()).map_err(|err| StoreError::Io {
                    what: "cannot write record",
                    path: path.clone(),
                    err,
                })?;
            }
            (before, decision)
            // L1 released here.
        };
        trace::span("record", t);

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
        let flush = AuditFlush {
            lock: audit_lock,
            entries,
            mirror,
            applied: matches!(decision, Decided::Applied(_)),
            // Listing the registry costs 40 ms at 100,000 records: not on every progress and beat.
            sweep_registry: !matches!(req.kind, Kind::Progress | Kind::Beat),
            registry: self.registry.clone(),
            logs: self.logs.clone(),
            job_id: req.job_id.clone(),
        };
        Ok((Outcome { decision, before, audit_error }, flush))
    }
}

/// The audit half of one transaction (CORE 5.5), held under the job's L5 until `flush`.
#[derive(Debug)]
pub struct AuditFlush {
    lock: Option<audit::AuditLock>,
    entries: Vec<serde_json::Value>,
    mirror: Option<serde_json::Value>,
    applied: bool,
    /// Also look for a dead writer's temp files of the record in the registry directory.
    sweep_registry: bool,
    registry: PathBuf,
    logs: PathBuf,
    job_id: String,
}

impl AuditFlush {
    /// Appends the entries, writes status.json, releases L5, removes a dead writer's temp files;
    /// returns the warning when the audit could not be written (the record write stands).
    pub fn flush(self) -> Option<String> {
        self.flush_staged(None)
    }

    /// `flush` with status.json already staged (`audit::stage_mirror`).
    pub fn flush_staged(self, staged: Option<audit::StagedMirror>) -> Option<String> {
        let t = Instant::now();
        let mut err = None;
        if let Some(l) = &self.lock {
            if let Err(e) = l.flush_staged(&self.entries, self.mirror.as_ref(), staged) {
                err =
                    Some(format!("{}: audit not written ({e})", show_path(&audit::job_dir(&self.logs, &self.job_id))));
            }
        }
        drop(self.lock);
        trace::span("audit", t);
        if self.applied && self.sweep_registry {
            clean_stale_temps(&self.registry, &format!("{}.json", self.job_id));
        }
        if self.applied {
            clean_stale_temps(&audit::job_dir(&self.logs, &self.job_id), "status.json");
        }
        err
    }
}

/// How many threads a listing of a large registry reads with: the cores, at most 4.
pub fn listing_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
}

/// The ids of `Store::ids`, read from the directory as they are asked for.
#[derive(Debug)]
pub struct JobIds {
    rd: Option<fs::ReadDir>,
    registry: PathBuf,
}

impl Iterator for JobIds {
    type Item = Result<String, StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        let rd = self.rd.as_mut()?;
        for e in rd.by_ref() {
            let e = match e {
                Ok(e) => e,
                Err(err) => {
                    self.rd = None;
                    return Some(Err(StoreError::Io {
                        what: "cannot list registry",
                        path: self.registry.clone(),
                        err,
                    }));
                }
            };
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with('.') || name.ends_with(".tmp") {
                continue;
            }
            if let Some(id) = name.strip_suffix(".json") {
                if clock::valid_job_id(id) {
                    return Some(Ok(id.to_string()));
                }
            }
        }
        None
    }
}

/// One record met by `Store::for_each_record`.
#[derive(Debug)]
pub struct Entry<'a> {
    pub id: &'a str,
    /// The file's bytes, or why it could not be read.
    pub bytes: Result<&'a [u8], StoreError>,
    dir: &'a sys::DirHandle,
}

impl Entry<'_> {
    /// The mtime (ms since the epoch) of `rel`, relative to the registry, e.g. `<id>/events.log`.
    pub fn mtime_ms(&self, rel: &Path) -> Option<u64> {
        self.dir.mtime_ms(rel)
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
