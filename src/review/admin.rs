//! `mam loop status` and `mam loop prune` (ORCH 4.1, A37): reading loops back from their
//! checkpoints, and removing finished loop dirs older than an age.
//!
//! A checkpoint is read back as untrusted text (issue 29): its strings reach the status text only
//! through `text::one_line`, and a creator name that is not one plain path component never becomes
//! a lock path. Prune removes only real directories with a loop id's name directly under a
//! `.mam/loop` that is itself a real directory (no link followed, no `..`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::checkpoint::{Checkpoint, CheckpointError};
use crate::clock;
use crate::registry::store::Store;
use crate::sys::{self, Flock, LockMode};
use crate::text::one_line;

/// `<control root>/.mam/loop`.
pub fn loop_root(control: &Path) -> PathBuf {
    control.join(".mam").join("loop")
}

/// Whether `.mam/loop` is a real directory (a link there is never followed).
fn root_is_dir(root: &Path) -> bool {
    std::fs::symlink_metadata(root).is_ok_and(|m| m.is_dir())
}

/// Every loop dir with a readable checkpoint, oldest first (by `started_at`).
pub fn list(control: &Path) -> Vec<(PathBuf, Result<Checkpoint, CheckpointError>)> {
    let root = loop_root(control);
    if !root_is_dir(&root) {
        return Vec::new();
    }
    let Ok(rd) = std::fs::read_dir(&root) else { return Vec::new() };
    let mut out: Vec<(PathBuf, Result<Checkpoint, CheckpointError>)> = Vec::new();
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(n) = name.to_str() else { continue };
        if n.len() != 8 || !n.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        if !e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            continue;
        }
        let dir = e.path();
        let cp = Checkpoint::read(&dir.join("checkpoint.json"));
        out.push((dir, cp));
    }
    crate::sort::by(&mut out, |a, b| {
        let ka = a.1.as_ref().map(|c| c.started_at.clone()).unwrap_or_default();
        let kb = b.1.as_ref().map(|c| c.started_at.clone()).unwrap_or_default();
        ka.cmp(&kb)
    });
    out
}

/// Is a loop still running? Its creator's lock is held and names it.
pub fn running(control: &Path, cp: &Checkpoint) -> bool {
    if cp.outcome.is_some() || !plain_name(&cp.creator) {
        return false;
    }
    let lock = loop_root(control).join(format!("{}.lock", cp.creator));
    let holder = std::fs::read_to_string(&lock).unwrap_or_default();
    if holder.trim() != cp.loop_id {
        return false;
    }
    match sys::open_lock_file(&lock).and_then(|f| Flock::try_acquire(f, LockMode::Exclusive)) {
        Ok(Some(_)) => false,
        Ok(None) => true,
        Err(_) => false,
    }
}

/// One path component that stays where it is joined: not empty, no `/`, not `.` or `..`, no NUL.
fn plain_name(s: &str) -> bool {
    !s.is_empty() && s != "." && s != ".." && !s.contains(['/', '\0'])
}

/// The status text of one loop: phase, round, each job with its live status and evidence age.
pub fn render(control: &Path, cp: &Checkpoint, now_ms: u64) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let state = match (&cp.outcome, running(control, cp)) {
        (Some(o), _) => format!("finished: {o} (rc {})", cp.rc.unwrap_or(1)),
        (None, true) => "running".to_string(),
        (None, false) => "stopped without an outcome (the process is gone)".to_string(),
    };
    let _ = writeln!(s, "loop {}: {}", one_line(&cp.loop_id), one_line(&state));
    let _ = writeln!(
        s,
        "  creator {} (loop job {}), reviewers {}",
        one_line(&cp.creator),
        one_line(&cp.creator_jid),
        if cp.reviewers.is_empty() { "none (self-review)".to_string() } else { one_line(&cp.reviewers.join(", ")) }
    );
    let _ = writeln!(
        s,
        "  phase {}, round {} of {}, started {}",
        one_line(&cp.phase),
        cp.round,
        cp.max_rounds,
        one_line(&cp.started_at)
    );
    if let Some(r) = &cp.reason {
        let _ = writeln!(s, "  reason: {}", one_line(r));
    }
    let store = Store::new(PathBuf::from(&cp.registry), PathBuf::from(&cp.registry));
    let _ = writeln!(s, "  jobs:");
    for j in &cp.jobs {
        let rec = if plain_name(&j.jid) { store.read(&j.jid).ok().flatten() } else { None };
        let live = rec.as_ref().map(|r| r.status().to_string()).unwrap_or_else(|| "no record".into());
        let age = rec
            .as_ref()
            .and_then(|r| r.str("last_event_at").or(r.str("dispatched_at")).and_then(clock::parse_ts))
            .map(|t| format!("{} s ago", now_ms.saturating_sub(t) / 1000))
            .unwrap_or_else(|| "never".into());
        let _ = writeln!(
            s,
            "    round {} {} {} job {}: {} (record now {}; last evidence {age})",
            j.round,
            one_line(&j.role),
            one_line(&j.session),
            one_line(&j.jid),
            one_line(&j.status),
            one_line(&live)
        );
    }
    for r in &cp.review_rounds {
        let v: Vec<String> = r
            .reviewers
            .iter()
            .map(|x| format!("{} {}", one_line(&x.session), one_line(x.verdict.as_deref().unwrap_or("pending"))))
            .collect();
        let _ = writeln!(
            s,
            "  {} round {}: {}{}",
            one_line(&r.kind),
            r.round,
            if v.is_empty() { "no verdicts".into() } else { v.join(", ") },
            if r.stale { " (stale)" } else { "" }
        );
    }
    for p in &cp.promoted {
        let _ = writeln!(s, "  promoted: {}", one_line(p));
    }
    s
}

/// What prune did with one loop dir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pruned {
    Removed(PathBuf),
    KeptRunning(PathBuf),
    Failed(PathBuf, String),
}

/// Removes the loop dirs whose checkpoint is older than `age` and that are not running.
pub fn prune(control: &Path, age: Duration, now_ms: u64) -> Vec<Pruned> {
    let mut out = Vec::new();
    let root = loop_root(control);
    if std::fs::symlink_metadata(&root).is_ok_and(|m| !m.is_dir()) {
        out.push(Pruned::Failed(root, "not a directory (a link is never followed); remove it by hand".into()));
        return out;
    }
    for (dir, cp) in list(control) {
        let updated = match &cp {
            Ok(c) => clock::parse_ts(&c.updated_at),
            Err(_) => None,
        };
        let updated = updated.or_else(|| {
            std::fs::metadata(&dir)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_millis() as u64)
        });
        let Some(updated) = updated else { continue };
        if now_ms.saturating_sub(updated) < age.as_millis() as u64 {
            continue;
        }
        if let Ok(c) = &cp {
            if running(control, c) {
                out.push(Pruned::KeptRunning(dir));
                continue;
            }
        }
        // The dir is ours (under the control root's .mam) and remove_dir_all does not follow links.
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => out.push(Pruned::Removed(dir)),
            Err(e) => out.push(Pruned::Failed(dir, e.to_string())),
        }
    }
    out
}
