//! The monitor lock L6 `<workspace>/.mam/monitor.lock` (CORE 0.6, 10.2, A3, A20): one daemon per
//! workspace, held with `flock(LOCK_EX|LOCK_NB)` for the daemon's whole life, its JSON content written
//! in place through the locked descriptor, and the identity check that must hold before anyone
//! reports or signals the pid it names.
//!
//! The lock file is created on demand and never deleted or renamed by mam (deleting it would defeat
//! flock). Readers take no lock: a missing, empty or partial JSON means "pid not yet known".

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::select;
use crate::clock;
use crate::sys::{self, Flock, LockMode};

/// `<workspace>/.mam/monitor.lock`.
pub fn lock_path(workspace: &Path) -> PathBuf {
    workspace.join(".mam").join("monitor.lock")
}

/// `<workspace>/.mam/monitor.log`: where `ensure` sends a detached daemon's output.
pub fn log_path(workspace: &Path) -> PathBuf {
    workspace.join(".mam").join("monitor.log")
}

/// The lock file's content. `start_ticks` (decided, beyond CORE 10.2's three fields) makes the
/// start-time half of `daemon stop`'s identity check exact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Info {
    pub pid: i32,
    pub workspace: String,
    pub started_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_ticks: Option<u64>,
}

/// A held monitor lock and the `(st_dev, st_ino)` of the file it locks.
#[derive(Debug)]
pub struct MonitorLock {
    lock: Flock,
    path: PathBuf,
    identity: (u64, u64),
}

/// The outcome of trying to become the workspace's daemon.
#[derive(Debug)]
pub enum Acquire {
    Held(MonitorLock),
    /// Another descriptor holds the lock; the pid it has written so far, if any.
    Busy(Option<i32>),
}

/// Takes L6 without blocking and, when it is ours, writes `Info` for this process in place.
/// Creates `<workspace>/.mam` (0700) when missing; the workspace itself must exist.
pub fn acquire(workspace: &Path) -> io::Result<Acquire> {
    if !workspace.is_dir() {
        return Err(io::Error::new(io::ErrorKind::NotFound, "workspace directory does not exist"));
    }
    sys::create_dir_all(&workspace.join(".mam"))?;
    let path = lock_path(workspace);
    let file = sys::open_lock_file(&path)?;
    let Some(lock) = Flock::try_acquire(file, LockMode::Exclusive)? else {
        return Ok(Acquire::Busy(read_info(workspace).map(|i| i.pid)));
    };
    let pid = std::process::id() as i32;
    let info = Info {
        pid,
        workspace: workspace.to_string_lossy().into_owned(),
        started_at: clock::now_ts(),
        start_ticks: sys::proc_start_ticks(pid).ok().map(|(t, _)| t),
    };
    let mut bytes = serde_json::to_vec(&info).map_err(io::Error::other)?;
    bytes.push(b'\n');
    sys::write_in_place(&lock.file, &bytes)?;
    let identity = sys::file_identity(&lock.file)?;
    Ok(Acquire::Held(MonitorLock { lock, path, identity }))
}

impl MonitorLock {
    /// True while stat of the lock path still gives the inode this daemon holds (CORE 10.2 step 4).
    pub fn still_ours(&self) -> bool {
        sys::path_identity(&self.path).is_ok_and(|id| id == self.identity)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The descriptor's `(st_dev, st_ino)`.
    pub fn identity(&self) -> (u64, u64) {
        self.identity
    }

    /// Keeps the lock object alive in the caller's scope (the lock is released on drop).
    pub fn file(&self) -> &fs::File {
        &self.lock.file
    }
}

/// The lock file's content; `None` when missing, empty or partial (A20: "pid not yet known").
pub fn read_info(workspace: &Path) -> Option<Info> {
    let bytes = fs::read(lock_path(workspace)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The pid of the daemon running for `workspace`, after the identity check: the pid in the lock file
/// is alive and not a zombie, its argv has `daemon run` and `--workspace <workspace>` as separate
/// elements, and its start time equals the recorded one. Takes no lock, so it cannot make a starting
/// daemon see L6 busy.
pub fn running_pid(workspace: &Path) -> Option<i32> {
    let info = read_info(workspace)?;
    is_daemon_for(&info, workspace).then_some(info.pid)
}

/// The identity check of `running_pid` for a given `Info`.
pub fn is_daemon_for(info: &Info, workspace: &Path) -> bool {
    let Ok((ticks, zombie)) = sys::proc_start_ticks(info.pid) else {
        return false;
    };
    if zombie || info.start_ticks.is_some_and(|t| t != ticks) {
        return false;
    }
    let Ok(args) = sys::proc_cmdline(info.pid) else {
        return false;
    };
    let cwd = sys::proc_cwd(info.pid).unwrap_or_else(|_| PathBuf::from("/"));
    select::argv_names_workspace(&args, workspace, &cwd)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_ws(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "mam-lock-{name}-{}-{}",
            std::process::id(),
            sys::random_hex(4).unwrap()
        ));
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn l6_is_exclusive_written_in_place_and_notices_replacement() {
        let ws = temp_ws("l6");
        // A longer stale content must not survive the in-place write.
        fs::create_dir_all(ws.join(".mam")).unwrap();
        fs::write(lock_path(&ws), vec![b'x'; 4096]).unwrap();
        let ino_before = sys::path_identity(&lock_path(&ws)).unwrap();
        let Acquire::Held(held) = acquire(&ws).unwrap() else { panic!("lock should be free") };
        assert_eq!(held.identity(), ino_before, "written in place, never renamed (A20)");
        let info = read_info(&ws).expect("whole JSON");
        assert_eq!(info.pid, std::process::id() as i32);
        assert_eq!(info.workspace, ws.to_string_lossy());
        assert!(info.start_ticks.is_some());
        // flock is per open file description: a second open in this process sees it busy.
        match acquire(&ws).unwrap() {
            Acquire::Busy(pid) => assert_eq!(pid, Some(info.pid)),
            Acquire::Held(_) => panic!("second holder"),
        }
        assert!(held.still_ours());
        // The test binary is no `mam daemon run`: the identity check refuses it.
        assert_eq!(running_pid(&ws), None);
        let fresh = ws.join(".mam/fresh");
        fs::write(&fresh, b"{}").unwrap();
        fs::rename(&fresh, lock_path(&ws)).unwrap();
        assert!(!held.still_ours());
        drop(held);
        // Partial JSON is "pid not yet known".
        fs::write(lock_path(&ws), br#"{"pid": 12"#).unwrap();
        assert_eq!(read_info(&ws), None);
        assert!(acquire(&ws.join("missing")).is_err());
        let _ = fs::remove_dir_all(&ws);
    }
}
