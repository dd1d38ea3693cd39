//! The incremental reader behind `mam ui` (issue 22): it keeps the job rows of one registry, the
//! sessions file and the loops' checkpoints in memory and, on each `poll`, re-reads only what a
//! stat says changed, so an idle screen over hundreds of jobs costs a few stats per tick.
//!
//! What it stats: the registry directory (every record write is an atomic rename into it, so its
//! mtime moves), then only when that changed each record file (a rename gives a new inode); the
//! events.log of each live job (appends change its size); the sessions file; the loop root and each
//! loop's checkpoint.json. File timestamps are coarse (a kernel tick): a directory whose mtime is
//! within `SETTLE_MS` of the clock is looked at again on the next poll, and everything is re-read
//! every `FULL_EVERY_MS` whatever the stats say.
//!
//! It reads files only (bounded: the record's shown fields, the last 64 KiB of events.log) and
//! never writes, locks or creates anything.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::registry::record::Record;
use crate::registry::store::Store;
use crate::review::admin;
use crate::review::checkpoint::Checkpoint;
use crate::session::{self, Sessions};
use crate::text;
use crate::view::jobs::{self, Row};

/// A directory whose mtime is this close to the clock may change again within the same timestamp.
pub const SETTLE_MS: u64 = 1_000;

/// Everything is re-listed this often even when no stat moved.
pub const FULL_EVERY_MS: u64 = 10_000;

/// A live job's events.log is looked at this often...
pub const LOOK_EVERY_MS: u64 = 1_000;

/// ...and on every poll once its idle window ends within this.
pub const NEAR_MS: u64 = 1_500;

/// What a stat says about a file: inode, size, mtime and ctime (ns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sig {
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl Sig {
    pub fn of(path: &Path) -> Option<Sig> {
        let m = fs::metadata(path).ok()?;
        Some(Sig {
            ino: m.ino(),
            size: m.size(),
            mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
            ctime_ns: m.ctime() as i128 * 1_000_000_000 + m.ctime_nsec() as i128,
        })
    }

    pub fn mtime_ms(&self) -> u64 {
        (self.mtime_ns.max(0) / 1_000_000) as u64
    }

    pub fn size(&self) -> u64 {
        self.size
    }
}

/// One watched path: its last signature and whether that signature can still be trusted.
#[derive(Debug, Default, Clone)]
pub struct Watch {
    sig: Option<Sig>,
    unsettled: bool,
    seen: bool,
}

impl Watch {
    /// True when `path` changed since the last call (or was never looked at, or was too fresh).
    pub fn changed(&mut self, path: &Path, now_ms: u64) -> bool {
        let sig = Sig::of(path);
        let changed = !self.seen || sig != self.sig || self.unsettled;
        self.seen = true;
        self.sig = sig;
        self.unsettled = sig.is_some_and(|s| now_ms.saturating_sub(s.mtime_ms()) < SETTLE_MS);
        changed
    }

    /// Forget the signature: the next `changed` is true.
    pub fn reset(&mut self) {
        self.seen = false;
    }
}

struct Job {
    record: Option<Sig>,
    events: Option<Sig>,
    events_path: PathBuf,
    /// When its events.log was last looked at.
    looked_ms: u64,
    rec: crate::registry::record::Record,
    heartbeat: Option<u64>,
    row: Row,
}

/// The jobs of one registry.
pub struct Jobs {
    pub store: Store,
    dir: Watch,
    last_full_ms: u64,
    jobs: BTreeMap<String, Job>,
    /// Records that could not be read or parsed on the last listing.
    pub warnings: Vec<String>,
}

impl Jobs {
    pub fn new(store: Store) -> Jobs {
        Jobs { store, dir: Watch::default(), last_full_ms: 0, jobs: BTreeMap::new(), warnings: Vec::new() }
    }

    /// Brings the rows up to date; true when any row changed.
    pub fn poll(&mut self, now_ms: u64) -> bool {
        self.poll_with(now_ms, false)
    }

    /// `poll`; `eager` looks at every live job's events.log now (a job just reported on the bus).
    /// Otherwise each is looked at every `LOOK_EVERY_MS`, and on every poll from `NEAR_MS` before
    /// its idle window runs out to `LOOK_EVERY_MS` after (so new evidence is seen before the job
    /// is called silent, and soon after).
    pub fn poll_with(&mut self, now_ms: u64, eager: bool) -> bool {
        let mut changed = false;
        let full = now_ms.saturating_sub(self.last_full_ms) >= FULL_EVERY_MS;
        if self.dir.changed(&self.store.registry, now_ms) || full {
            self.last_full_ms = now_ms;
            changed |= self.relist(now_ms);
        }
        for j in self.jobs.values_mut() {
            if j.row.finished() && !full {
                continue; // a finished job's evidence is not shown; its record changes by rename
            }
            // From just before the window runs out until a moment after it did.
            let near = j.row.silent_at_ms().is_some_and(|at| at <= now_ms + NEAR_MS && now_ms <= at + LOOK_EVERY_MS);
            if !(eager || full || near || now_ms.saturating_sub(j.looked_ms) >= LOOK_EVERY_MS) {
                continue;
            }
            j.looked_ms = now_ms;
            let sig = Sig::of(&j.events_path);
            if sig == j.events && !full {
                continue;
            }
            let grew = sig.map(|s| s.size) != j.events.map(|s| s.size);
            j.events = sig;
            if grew || full {
                j.heartbeat = sig.and_then(|_| jobs::last_heartbeat_line_ms(&j.events_path));
            }
            let row = jobs::row(&j.rec, true, || sig.map(|s| s.mtime_ms()), || j.heartbeat);
            if row != j.row {
                j.row = row;
                changed = true;
            }
        }
        changed
    }

    fn relist(&mut self, now_ms: u64) -> bool {
        let mut changed = false;
        self.warnings.clear();
        let ids = match self.store.job_ids() {
            Ok(ids) => ids,
            Err(e) => {
                self.warnings.push(e.to_string());
                return false;
            }
        };
        let keep: std::collections::BTreeSet<&String> = crate::sort::ordered(&ids);
        let before = self.jobs.len();
        self.jobs.retain(|id, _| keep.contains(id));
        changed |= self.jobs.len() != before;
        for id in &ids {
            let path = self.store.record_path(id);
            let sig = Sig::of(&path);
            if sig.is_some() && self.jobs.get(id).is_some_and(|j| j.record == sig) {
                continue;
            }
            match fs::read(&path).ok().and_then(|b| Record::parse_only(&b, jobs::UI_FIELDS).ok()) {
                Some(rec) => {
                    let events = self.store.registry.join(id).join("events.log");
                    let esig = Sig::of(&events);
                    let heartbeat = esig.and_then(|_| jobs::last_heartbeat_line_ms(&events));
                    let row = jobs::row(&rec, true, || esig.map(|s| s.mtime_ms()), || heartbeat);
                    let job =
                        Job { record: sig, events: esig, events_path: events, looked_ms: now_ms, rec, heartbeat, row };
                    self.jobs.insert(id.clone(), job);
                    changed = true;
                }
                None if sig.is_none() => {
                    changed |= self.jobs.remove(id).is_some(); // removed since the listing
                }
                None => self.warnings.push(format!("{}: not a valid job record", text::show_path(&path))),
            }
        }
        changed
    }

    /// Every row, in no particular order.
    pub fn rows(&self) -> impl Iterator<Item = &Row> {
        self.jobs.values().map(|j| &j.row)
    }

    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }
}

/// The sessions file.
pub struct SessionsFile {
    pub path: PathBuf,
    watch: Watch,
    /// The document, or why it cannot be read.
    pub doc: Result<Sessions, String>,
}

impl SessionsFile {
    pub fn new(path: PathBuf) -> SessionsFile {
        SessionsFile { path, watch: Watch::default(), doc: Ok(Sessions::default()) }
    }

    /// Re-reads the file when it changed; true then.
    pub fn poll(&mut self, now_ms: u64) -> bool {
        if !self.watch.changed(&self.path, now_ms) {
            return false;
        }
        let doc = session::load(&self.path).map_err(|e| e.to_string());
        let changed = match (&doc, &self.doc) {
            (Ok(a), Ok(b)) => a != b,
            (Err(a), Err(b)) => a != b,
            _ => true,
        };
        self.doc = doc;
        changed
    }
}

/// The loops of a control root (`<control root>/.mam/loop/<id>/checkpoint.json`).
pub struct Loops {
    pub control: PathBuf,
    root: Watch,
    dirs: BTreeMap<PathBuf, (Watch, Option<Checkpoint>)>,
    last_full_ms: u64,
}

impl Loops {
    pub fn new(control: PathBuf) -> Loops {
        Loops { control, root: Watch::default(), dirs: BTreeMap::new(), last_full_ms: 0 }
    }

    /// Re-reads what changed; true when a checkpoint did.
    pub fn poll(&mut self, now_ms: u64) -> bool {
        let mut changed = false;
        let root = admin::loop_root(&self.control);
        let full = now_ms.saturating_sub(self.last_full_ms) >= FULL_EVERY_MS;
        if self.root.changed(&root, now_ms) || full {
            self.last_full_ms = now_ms;
            let mut now_dirs = std::collections::BTreeSet::new();
            for e in fs::read_dir(&root).into_iter().flatten().flatten() {
                let name = e.file_name();
                let Some(n) = name.to_str() else { continue };
                if n.len() == 8 && n.bytes().all(|b| b.is_ascii_hexdigit()) && e.path().is_dir() {
                    now_dirs.insert(e.path());
                }
            }
            let before = self.dirs.len();
            self.dirs.retain(|d, _| now_dirs.contains(d));
            changed |= before != self.dirs.len();
            for d in now_dirs {
                self.dirs.entry(d).or_insert_with(|| (Watch::default(), None));
            }
        }
        for (dir, (w, cp)) in self.dirs.iter_mut() {
            let path = dir.join("checkpoint.json");
            if full {
                w.reset();
            }
            if w.changed(&path, now_ms) {
                let new = Checkpoint::read(&path).ok();
                if new != *cp {
                    *cp = new;
                    changed = true;
                }
            }
        }
        changed
    }

    /// The readable checkpoints, oldest first.
    pub fn checkpoints(&self) -> Vec<&Checkpoint> {
        let mut v: Vec<&Checkpoint> = self.dirs.values().filter_map(|(_, c)| c.as_ref()).collect();
        crate::sort::by(&mut v, |a, b| (&a.started_at, &a.loop_id).cmp(&(&b.started_at, &b.loop_id)));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_sees_a_change_and_a_fresh_file_again() {
        let dir = std::env::temp_dir().join(format!("mam-scan-{}", crate::sys::random_hex(4).unwrap()));
        crate::sys::create_dir_all(&dir).unwrap();
        let f = dir.join("x");
        let mut w = Watch::default();
        let now = crate::clock::now_ms();
        assert!(w.changed(&f, now), "first look");
        assert!(!w.changed(&f, now), "absent, still absent");
        crate::sys::write_file(&f, b"a").unwrap();
        assert!(w.changed(&f, now));
        // Just written: its mtime is within SETTLE_MS of now, so it is looked at again.
        let later = now + SETTLE_MS + 1_000;
        assert!(w.changed(&f, later), "the last look was too fresh to trust");
        assert!(!w.changed(&f, later), "settled");
        let _ = fs::remove_dir_all(&dir);
    }
}
