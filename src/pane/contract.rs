//! The pane backend contract (ORCH 1.2): the values a backend lists and returns, its error, the
//! `Backend` trait every implementation (herdr, tmux, fake) fulfils, and the name and path rules
//! they share.
//!
//! Pure types and rules: nothing here spawns, reads a file or prints.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::sys;

/// One agent as a backend lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agent {
    pub name: String,
    pub pane: String,
    pub kind: String,
    pub status: String,
}

/// The three outcomes of a list (1.4). `NoServer` is a confirmed empty list; `Unknown` is never one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListOutcome {
    Confirmed(Vec<Agent>),
    NoServer,
    Unknown(String),
}

/// A pane of a workspace, in the backend's pane order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaneInfo {
    pub id: String,
    pub has_agent: bool,
    /// The shell owns the foreground (nothing runs in the pane).
    pub shell_foreground: bool,
    /// Grid position `(column x, row y)` when the backend reports geometry; else the layout is
    /// inferred from the pane order (the split rule of 1.5 step 4).
    pub pos: Option<(i64, i64)>,
}

impl PaneInfo {
    /// Idle: no agent and the shell owns the foreground (1.5 step 3).
    pub fn idle(&self) -> bool {
        !self.has_agent && self.shell_foreground
    }
}

/// A same-cwd workspace with its panes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workspace {
    pub id: String,
    pub label: String,
    pub panes: Vec<PaneInfo>,
}

/// A freshly created workspace and its root pane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Created {
    pub workspace: String,
    pub pane: String,
}

/// Split direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    Right,
    Down,
}

impl Dir {
    pub fn word(self) -> &'static str {
        match self {
            Dir::Right => "right",
            Dir::Down => "down",
        }
    }
}

/// Why an accepted submission has not settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accepted {
    Timeout,
    Stalled,
}

/// The result of one prompt submission (1.2, 1.7 steps 4-6).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptOutcome {
    Settled,
    Accepted(Accepted),
    /// Nothing was submitted: transport error, agent not running, unknown target. The text names it.
    TransportError(String),
}

/// Agent status words of `mam pane status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Working,
    Idle,
    Done,
    Blocked,
    Unknown,
    Absent,
}

impl Status {
    pub fn word(self) -> &'static str {
        match self {
            Status::Working => "working",
            Status::Idle => "idle",
            Status::Done => "done",
            Status::Blocked => "blocked",
            Status::Unknown => "unknown",
            Status::Absent => "absent",
        }
    }

    /// The state once the backend's own reading (the screen, herdr's report) says nothing, for an
    /// agent whose process is in its pane (issue 32: `unknown` only when mam truly cannot tell):
    /// the session's open job decides. No open job: `Idle`; an open job that started (`running`):
    /// `Working`; a job prompted but not started yet leaves `Unknown`. A known reading stays.
    pub fn or_from_open_job(self, open_job: Option<&str>) -> Status {
        match (self, open_job) {
            (Status::Unknown, None) => Status::Idle,
            (Status::Unknown, Some("running")) => Status::Working,
            (s, _) => s,
        }
    }

    /// Lenient mapping of a backend's status text; anything unrecognised is `Unknown`.
    pub fn parse(s: &str) -> Status {
        match s.trim().to_ascii_lowercase().as_str() {
            "working" | "busy" | "running" => Status::Working,
            "idle" | "ready" => Status::Idle,
            "done" | "finished" => Status::Done,
            "blocked" | "waiting" | "needs_input" => Status::Blocked,
            "absent" | "exited" | "gone" => Status::Absent,
            _ => Status::Unknown,
        }
    }
}

/// What an agent's screen shows where a prompt would be typed (issue 30 item 5), read with the
/// adapter table's input lines, working marks and dialogs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputLine {
    /// The agent's own input line, no working mark, no dialog: a prompt may be typed.
    Ready,
    /// Not at its input line: the words say what the screen shows instead (`works`, `waits in a
    /// dialog`, `does not show its empty input line`).
    Busy(&'static str),
    /// The backend has no screen, or the table does not know the kind's input line.
    Unknown,
}

impl InputLine {
    /// The verdict of an adapter on one screen. `strict`: a screen without the input line is busy
    /// (tmux, where the screen is the only lifecycle); else it is left to the backend's own status
    /// (herdr, whose screen rules already judged idleness).
    pub fn of(adapter: &crate::agents::Adapter, screen: &str, strict: bool) -> InputLine {
        if !adapter.has_ready_line() {
            return InputLine::Unknown;
        }
        match adapter.state_on(screen) {
            Some("idle") => InputLine::Ready,
            Some("working") => InputLine::Busy("works (a working mark is on screen)"),
            Some("blocked") => InputLine::Busy("waits in a dialog"),
            _ if strict => {
                InputLine::Busy("does not show its empty input line (text typed there, or a screen mam does not know)")
            }
            _ => InputLine::Unknown,
        }
    }
}

/// mam's view of an agent's job for the backend's own status display (issue 21): the semantic
/// state (`Working`, `Idle`, `Blocked` or `Unknown`), a one-line message naming the evidence and its
/// source, the pane title, how long the display may stand unrefreshed (`None`: until replaced), and
/// the report's sequence number (strictly increasing per pane; herdr ignores a stale one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateReport {
    pub state: Status,
    pub message: String,
    pub title: String,
    pub ttl_ms: Option<u64>,
    pub seq: u64,
}

/// A backend failure. `NoServer` is the MAM_NO_AUTOSTART refusal of 1.3; `Usage` is bad input
/// detected by the backend (rc 2); everything else is `Failed` (rc 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PaneError {
    NoServer(String),
    Usage(String),
    Failed(String),
    /// The agent's process ended during start (back at the shell, or gone from the backend): the CLI
    /// refused its arguments (`--resume` of a conversation it cannot resume) or could not run.
    Exited(String),
}

impl fmt::Display for PaneError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PaneError::NoServer(m) | PaneError::Usage(m) | PaneError::Failed(m) | PaneError::Exited(m) => {
                f.write_str(m)
            }
        }
    }
}

pub type PaneResult<T> = Result<T, PaneError>;

/// The backend contract of ORCH 1.2. One value addresses one server (herdr session, tmux socket,
/// fake directory); a row's later calls open the backend on the row's recorded server.
pub trait Backend {
    /// `herdr`, `tmux` or `fake` (recorded in the row's `backend`).
    fn name(&self) -> &'static str;
    /// The server this value addresses (recorded in `pane.server`).
    fn server(&self) -> String;
    /// Reachable, or bootstrapped (1.3) unless MAM_NO_AUTOSTART=1.
    fn ensure_server(&self) -> PaneResult<()>;
    fn list_agents(&self) -> ListOutcome;
    /// Same-cwd workspaces (canonical paths) in backend order, panes in pane order.
    fn list_workspaces(&self, cwd: &Path) -> PaneResult<Vec<Workspace>>;
    fn create_workspace(&self, cwd: &Path, label: Option<&str>, env: &[(String, String)]) -> PaneResult<Created>;
    fn split(&self, pane: &str, dir: Dir, cwd: &Path, env: &[(String, String)]) -> PaneResult<String>;
    fn rename_workspace(&self, id: &str, label: &str) -> PaneResult<()>;
    /// Returns once the agent is ready; a timeout is an error naming the phase.
    fn start_agent(&self, name: &str, kind: &str, pane: &str, args: &[String]) -> PaneResult<()>;
    fn prompt(&self, target: &str, text: &str, wait_ms: u32) -> PromptOutcome;
    fn agent_status(&self, target: &str) -> Status;
    /// The agent's native conversation reference as the backend knows it (herdr's `agent_session`
    /// value), for kinds whose id mam cannot choose (ORCH 2.2). `None` when unknown.
    fn agent_session(&self, _target: &str) -> Option<String> {
        None
    }
    /// What the agent's screen shows where a prompt would be typed (issue 30 item 5). The default
    /// (the fake backend, which has no screen) cannot tell.
    fn input_line(&self, _target: &str) -> InputLine {
        InputLine::Unknown
    }
    /// The text a quiescence check compares (the agent's visible screen).
    fn read_detection(&self, target: &str) -> PaneResult<String>;
    fn send_keys(&self, target: &str, keys: &str) -> PaneResult<()>;
    fn close_pane(&self, pane: &str) -> PaneResult<()>;
    fn close_workspace(&self, id: &str) -> PaneResult<()>;
    /// Stops the server when mam started it and no agent is left on it (issue 32 item 7); true when
    /// it stopped it. A server the user started is never stopped. The default: nothing to stop
    /// (tmux's server ends with its last session by itself).
    fn stop_server_if_ours(&self) -> PaneResult<bool> {
        Ok(false)
    }
    /// The pane's own processes (its shell, the processes in its foreground), the roots of the tree
    /// `stop` ends after closing the pane. Empty when the backend cannot tell.
    fn pane_pids(&self, _pane: &str) -> Vec<i32> {
        Vec::new()
    }
    /// The pane's recent text without soft wraps, whatever runs in it (an agent that exited left its
    /// last words there), or `None` when the backend has no terminal or cannot read it.
    fn read_pane(&self, _pane: &str) -> Option<String> {
        None
    }
    /// True when `read_detection` is the agent's terminal screen, so start-up dialogs and the ready
    /// line can be read from it (A58). The fake backend has no terminal: its agent reports a dialog
    /// through its status (1.8), and start-up follows the status rule of 1.5 step 7.
    fn shows_screen(&self) -> bool {
        true
    }
    /// False when `agent_status` can only say `unknown`/`absent` (tmux): `send_keys_safe` then skips
    /// the idle handshake and relies on quiescence (A24).
    fn has_lifecycle(&self) -> bool {
        true
    }
    /// Shows mam's view of the agent's job on `pane` (issue 21): herdr's sidebar state and label,
    /// tmux's pane title and border. `kind` is the agent's herdr kind. Never starts a server. The
    /// default (the fake backend) has nothing to show it on.
    fn report_state(&self, _pane: &str, _kind: &str, _report: &StateReport) -> PaneResult<()> {
        Ok(())
    }
    /// True when a program in the pane can overwrite the title `report_state` set (tmux: OSC 2), so
    /// a reporter re-asserts it now and then; herdr keeps its metadata title apart.
    fn shared_title(&self) -> bool {
        false
    }
    /// Gives `pane`'s status display back to the backend (herdr: `release-agent`, mam's labels
    /// cleared; tmux: mam's title and border text cleared).
    fn release_state(&self, _pane: &str, _kind: &str, _seq: u64) -> PaneResult<()> {
        Ok(())
    }
}

/// Agent names (= herdr agent names, 1.3): `[a-z][a-z0-9_-]{0,31}`.
pub fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 32
        && b[0].is_ascii_lowercase()
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_' || *c == b'-')
}

/// Shell basenames: a pane whose foreground is one of these is "at a shell".
pub fn is_shell(cmd: &str) -> bool {
    let base = cmd.rsplit('/').next().unwrap_or(cmd).trim_start_matches('-');
    matches!(base, "bash" | "sh" | "dash" | "zsh" | "fish" | "ksh" | "mksh" | "tcsh" | "csh" | "ash")
}

/// Canonical form of a directory for same-cwd comparisons (1.5 step 2); a path that cannot be
/// canonicalised is compared lexically.
pub fn canon(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| sys::normalize(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_shells() {
        assert!(valid_name("claude-01"));
        assert!(!valid_name("Claude"));
        assert!(!valid_name("a;rm -rf"));
        assert!(!valid_name(&"a".repeat(33)));
        assert!(is_shell("-bash") && is_shell("/bin/sh") && !is_shell("claude"));
    }

    /// Issue 32: the open job decides only what the backend's reading leaves `Unknown`.
    #[test]
    fn state_from_the_open_job_only_when_the_reading_is_unknown() {
        use Status::*;
        let cells: &[(Status, Option<&str>, Status)] = &[
            (Unknown, None, Idle),
            (Unknown, Some("running"), Working),
            (Unknown, Some("pending"), Unknown),
            (Idle, Some("running"), Idle),
            (Working, None, Working),
            (Blocked, None, Blocked),
            (Done, Some("running"), Done),
            (Absent, None, Absent),
        ];
        for (seen, job, want) in cells {
            assert_eq!(seen.or_from_open_job(*job), *want, "{seen:?} with {job:?}");
        }
    }
}
