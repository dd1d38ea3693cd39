//! `mam install`, `mam update`, `mam remove` (ORCH 7, A49-A54): the library side. Puts the binary,
//! the shims, the eight skills and `.mam.env.example` into a repository with four ledgers, upgrades
//! them keeping local edits and state (update's backup and byte-exact restore), takes a legacy install
//! over, and takes everything out again without destroying an edit. Never prints: the command layer
//! renders the `Report` and the `InstallError`.
//!
//! Crash safety (issue 16): every file is written by temp + rename; install records the whole
//! manifest and a `pending=install` state before its first asset, update commits its backup (an
//! `index` written last) before its first change (so does the takeover of a legacy install), remove
//! deletes the manifest last. The next run of the same command sees what was interrupted and
//! completes it (install, remove) or restores and redoes it (update, takeover); stray temp files of
//! an interrupted write are deleted.
//!
//! - `install::assets`: the embedded assets, the SKILL.md version line, the herdr wrapper's text.
//! - `install::ledger`: the ledgers' formats and path rule, the `install_state` merge, stamps.
//! - `install::gitignore`: the managed block.
//! - `install::legacy`: the legacy layout and the legacy-path map.
//! - `install::fsops`: the filesystem steps (no link followed, temp cleanup, the step counter).
//! - `install::run`: install and update (with the legacy takeover and the restore).
//! - `install::remove`: remove.

pub mod assets;
pub mod fsops;
pub mod gitignore;
pub mod ledger;
pub mod legacy;
pub mod remove;
pub mod run;
pub mod tree;

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use crate::text::show_path;

/// Test hooks (ORCH 8 item 8; set only by the `test-hooks` build): fail, or SIGKILL this process,
/// right after the n-th change.
#[derive(Debug, Clone, Copy, Default)]
pub struct Hooks {
    pub fail_after: Option<u64>,
    pub kill_after: Option<u64>,
}

/// What one run needs, all decided by the command layer.
#[derive(Debug, Clone)]
pub struct Options {
    /// The target: its absolute, canonical path and its directory, opened once.
    pub target: tree::Tree,
    /// The bytes of the binary to install (the running executable).
    pub binary: Vec<u8>,
    /// The version the assets carry (the release's unless `MAM_TEST_ASSET_VERSION`).
    pub version: String,
    pub commit: String,
    /// UTC timestamp of this run (`installed_at`, the `removed-<stamp>` name).
    pub now_ts: String,
    pub hooks: Hooks,
    /// `mam install --legacy-paths` (issue 32): the legacy entry points at their legacy paths even
    /// where no legacy install was taken over (recorded as `legacy_paths=1`, so updates keep them).
    pub legacy_paths: bool,
}

/// What a run did: stdout lines and stderr notes (`NOTE:`/`WARNING:` lines, prefix included).
#[derive(Debug, Default, Clone)]
pub struct Report {
    pub out: Vec<String>,
    pub notes: Vec<String>,
}

impl Report {
    pub fn say(&mut self, line: impl Into<String>) {
        self.out.push(line.into());
    }
    pub fn note(&mut self, line: impl fmt::Display) {
        self.notes.push(format!("NOTE: {line}"));
    }
    pub fn warn(&mut self, line: impl fmt::Display) {
        self.notes.push(format!("WARNING: {line}"));
    }
}

/// Every way install, update and remove fail.
#[derive(Debug)]
pub enum InstallError {
    /// The target cannot take an install (missing, not a directory, not a repository, not writable,
    /// a `.gitignore` or `.mam` that is not what it must be): rc 2, nothing changed.
    BadTarget(String),
    /// `remove`/`update` on a target with no manifest: rc 2.
    NotInstalled(PathBuf),
    /// remove under running work (sessions `running`, the daemon lock held): rc 3, nothing changed.
    Running(Vec<String>),
    /// A file or directory under `.mam/`, or `.gitignore`, that is not the user's or root's, or is
    /// writable by group or others (issue 29): rc 2, refused before it is used.
    Untrusted { path: PathBuf, why: crate::trust::Why },
    /// A ledger line that is unusable or names a path outside the target: refused, nothing deleted.
    Ledger(ledger::BadEntry),
    /// A filesystem step failed.
    Io { what: &'static str, path: PathBuf, err: io::Error },
    /// `MAM_TEST_INSTALL_FAIL_AFTER=<n>`.
    Injected(u64),
    /// The sessions import of a legacy takeover failed.
    Sessions(String),
    /// update failed and every backed-up file was restored (rc 1); the cause, and what could not
    /// be restored (empty when all of it was).
    Restored { cause: Box<InstallError>, left: Vec<String> },
}

impl InstallError {
    pub fn io(what: &'static str, path: &Path, err: io::Error) -> InstallError {
        InstallError::Io { what, path: path.to_path_buf(), err }
    }
}

impl fmt::Display for InstallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InstallError::BadTarget(m) => write!(f, "{m}; nothing changed"),
            InstallError::NotInstalled(t) => {
                write!(f, "{} is not installed (no {})", show_path(t), ledger::MANIFEST)
            }
            InstallError::Running(what) => {
                write!(f, "running work: {}; stop it first; nothing changed", what.join(", "))
            }
            InstallError::Untrusted { path, why } => write!(
                f,
                "{}: {why}; install, update and remove use only your own (or root's) files there: check who made it, then remove or chown it, or trust it with MAM_TRUSTED_ROOTS",
                show_path(path)
            ),
            InstallError::Ledger(b) => {
                write!(f, "{} line {}: {}; refused, nothing deleted or changed", b.ledger, b.line, b.reason)
            }
            InstallError::Io { what, path, err } => write!(f, "cannot {what} {}: {err}", show_path(path)),
            InstallError::Injected(n) => write!(f, "failure injected after step {n} (MAM_TEST_INSTALL_FAIL_AFTER)"),
            InstallError::Sessions(m) => write!(f, "legacy sessions import: {m}"),
            InstallError::Restored { cause, left } if left.is_empty() => {
                write!(f, "{cause}; every file was restored as it was before the update")
            }
            InstallError::Restored { cause, left } => {
                write!(f, "{cause}; restore incomplete, left: {}", left.join(", "))
            }
        }
    }
}

impl From<ledger::BadEntry> for InstallError {
    fn from(b: ledger::BadEntry) -> InstallError {
        InstallError::Ledger(b)
    }
}
