//! `DelegateError`: why `delegate-job` stopped before a job was registered (ORCH 3.2, 3.6). Once a job
//! is registered every path ends in a `Finished` instead. `cmd` renders each variant as one line with
//! its exit code, noted on each variant.

use std::fmt;

use crate::knob::ConfigError;
use crate::pane::OpenError;
use crate::session::SessionError;

#[derive(Debug)]
pub enum DelegateError {
    /// rc 2 `REFUSED: delegate-job: <why>; nothing registered`: a precondition of 3.2 failed.
    Refused(String),
    /// rc 2 `REFUSED: delegate-job: job <id>: <reason>; nothing dispatched`: the engine refused it.
    JobRefused { id: String, reason: String },
    /// rc 2 `REFUSED: delegate-job: job <id> is already <status>`.
    AlreadyDone { id: String, status: String },
    /// rc 2 `ERROR: <what>`: bad input (`--type`, `MAM_PARENT_JOB_ID`).
    Usage(String),
    /// rc 2: a knob with an invalid value.
    Config(ConfigError),
    /// rc 2: the session's pane backend could not be opened.
    Backend(OpenError),
    /// The sessions file could not be read (rendered as that session error).
    Session(SessionError),
    /// rc 1 `ERROR: <what>`: an operational failure.
    Failed(String),
}

impl fmt::Display for DelegateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DelegateError::Refused(m) | DelegateError::Usage(m) | DelegateError::Failed(m) => f.write_str(m),
            DelegateError::JobRefused { id, reason } => write!(f, "job {id}: {reason}"),
            DelegateError::AlreadyDone { id, status } => write!(f, "job {id} is already {status}"),
            DelegateError::Config(e) => e.fmt(f),
            DelegateError::Backend(e) => e.fmt(f),
            DelegateError::Session(e) => e.fmt(f),
        }
    }
}

impl From<ConfigError> for DelegateError {
    fn from(e: ConfigError) -> DelegateError {
        DelegateError::Config(e)
    }
}

impl From<OpenError> for DelegateError {
    fn from(e: OpenError) -> DelegateError {
        DelegateError::Backend(e)
    }
}
