//! Pane backends (ORCH 1): the one contract for placing an agent in a terminal pane, prompting it with
//! delivery confirmation, reading its state and listing what is alive, with three implementations
//! (herdr, tmux, fake). This module owns the contract (`Backend`), the knobs, the placement algorithm
//! of 1.5 and `send_keys_safe` of 1.7 (A24), each written once over the trait.
//!
//! It never prints and never reads the process environment: knobs come from `Ctx`, results are values.
//! Placement and delivery decisions are pure functions (`choose`, `split_plan`, `dialog_step`) so they
//! are unit-tested without any backend.

pub mod fake;
pub mod herdr;
pub mod tmux;

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::cli::Failure;
use crate::ctx::Ctx;
use crate::knob;
use crate::sys;

// ---------------------------------------------------------------------------------------------
// Values of the contract (1.2)

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

/// A backend failure. `NoServer` is the MAM_NO_AUTOSTART refusal of 1.3; `Usage` is bad input
/// detected by the backend (rc 2); everything else is `Failed` (rc 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PaneError {
    NoServer(String),
    Usage(String),
    Failed(String),
}

impl fmt::Display for PaneError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PaneError::NoServer(m) | PaneError::Usage(m) | PaneError::Failed(m) => f.write_str(m),
        }
    }
}

impl PaneError {
    pub fn failure(&self) -> Failure {
        match self {
            PaneError::Usage(m) => Failure::usage(m),
            PaneError::NoServer(m) | PaneError::Failed(m) => Failure::runtime(m),
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
    /// The text a quiescence check compares (the agent's visible screen).
    fn read_detection(&self, target: &str) -> PaneResult<String>;
    fn send_keys(&self, target: &str, keys: &str) -> PaneResult<()>;
    fn close_pane(&self, pane: &str) -> PaneResult<()>;
    fn close_workspace(&self, id: &str) -> PaneResult<()>;
    /// False when `agent_status` can only say `unknown`/`absent` (tmux): `send_keys_safe` then skips
    /// the idle handshake and relies on quiescence (A24).
    fn has_lifecycle(&self) -> bool {
        true
    }
}

// ---------------------------------------------------------------------------------------------
// Knobs (1.1) and the ones added so tests run in seconds

/// Every wait, poll interval and grace of this section. Defaults are the spec's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Knobs {
    /// `MAM_WS_ROWS` (R of the 2 x R grid, A23).
    pub ws_rows: u32,
    /// `MAM_STARTUP_DIALOG_MAX`.
    pub dialog_max: u32,
    /// `MAM_STARTUP_DIALOG_SETTLE_MS` (added): how long a re-check after `enter` waits for the
    /// status to leave `blocked`.
    pub dialog_settle_ms: u64,
    /// `MAM_AGENT_START_TIMEOUT_MS`.
    pub start_timeout_ms: u32,
    /// `MAM_SKS_IDLE_WAIT_S`, in ms.
    pub idle_wait_ms: u64,
    /// `MAM_SKS_PROMPT_TIMEOUT_MS` (> 5000 so herdr's stalled and timeout stay distinguishable).
    pub prompt_timeout_ms: u32,
    /// `SKS_DELIVERY_GRACE_S`, in ms.
    pub grace_ms: u64,
    /// `MAM_SKS_POLL_MS` (added): poll interval of the idle wait and the delivery grace (1 s).
    pub poll_ms: u64,
    /// `MAM_SKS_QUIESCE_GAP_MS` (added): gap between the two detection reads (1 s).
    pub quiesce_gap_ms: u64,
    /// `MAM_SKS_QUIESCE_S`, in ms (added): how long quiescence is tried (10 s).
    pub quiesce_max_ms: u64,
    /// `MAM_TMUX_STABLE_MS` (added): how long a tmux screen must stay unchanged to be ready (2 s).
    pub tmux_stable_ms: u64,
    /// `MAM_SERVER_BOOT_WAIT_S`, in ms (added): how long a bootstrap polls the new server (10 s).
    pub boot_wait_ms: u64,
}

impl Default for Knobs {
    fn default() -> Knobs {
        Knobs {
            ws_rows: 2,
            dialog_max: 3,
            dialog_settle_ms: 2000,
            start_timeout_ms: 60_000,
            idle_wait_ms: 60_000,
            prompt_timeout_ms: 8000,
            grace_ms: 15_000,
            poll_ms: 1000,
            quiesce_gap_ms: 1000,
            quiesce_max_ms: 10_000,
            tmux_stable_ms: 2000,
            boot_wait_ms: 10_000,
        }
    }
}

impl Knobs {
    /// Reads every knob through the one integer grammar; invalid values are rc 2 naming the variable.
    pub fn from_ctx(ctx: &Ctx) -> Result<Knobs, Failure> {
        let d = Knobs::default();
        let s = |name: &str, min: u32, def_ms: u64| -> Result<u64, Failure> {
            Ok(knob::env(ctx, name, min)?.map(|v| v as u64 * 1000).unwrap_or(def_ms))
        };
        let ms = |name: &str, min: u32, def: u64| -> Result<u64, Failure> {
            Ok(knob::env(ctx, name, min)?.map(|v| v as u64).unwrap_or(def))
        };
        Ok(Knobs {
            ws_rows: knob::env_or(ctx, "MAM_WS_ROWS", 1, d.ws_rows)?,
            dialog_max: knob::env_or(ctx, "MAM_STARTUP_DIALOG_MAX", 0, d.dialog_max)?,
            dialog_settle_ms: ms("MAM_STARTUP_DIALOG_SETTLE_MS", 0, d.dialog_settle_ms)?,
            start_timeout_ms: knob::env_or(ctx, "MAM_AGENT_START_TIMEOUT_MS", 1, d.start_timeout_ms)?,
            idle_wait_ms: s("MAM_SKS_IDLE_WAIT_S", 0, d.idle_wait_ms)?,
            prompt_timeout_ms: knob::env_or(ctx, "MAM_SKS_PROMPT_TIMEOUT_MS", 5001, d.prompt_timeout_ms)?,
            grace_ms: s("SKS_DELIVERY_GRACE_S", 0, d.grace_ms)?,
            poll_ms: ms("MAM_SKS_POLL_MS", 10, d.poll_ms)?,
            quiesce_gap_ms: ms("MAM_SKS_QUIESCE_GAP_MS", 10, d.quiesce_gap_ms)?,
            quiesce_max_ms: s("MAM_SKS_QUIESCE_S", 0, d.quiesce_max_ms)?,
            tmux_stable_ms: ms("MAM_TMUX_STABLE_MS", 0, d.tmux_stable_ms)?,
            boot_wait_ms: s("MAM_SERVER_BOOT_WAIT_S", 1, d.boot_wait_ms)?,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Backend choice

/// The per-session agent runtime markers a bootstrapped server must not inherit (1.3): exact names,
/// no prefix match, so user configuration such as `CLAUDE_PROJECT_DIR` still passes. The claude
/// CLI's messaging/bridge/parent markers are listed by the names it is known to export.
pub const BOOTSTRAP_DENYLIST: &[&str] = &[
    "CLAUDECODE",
    "CLAUDE_CODE_CHILD_SESSION",
    "CLAUDE_CODE_SESSION_ID",
    "CLAUDE_CODE_ENTRYPOINT",
    "CLAUDE_CODE_SSE_PORT",
    "CLAUDE_CODE_PARENT_PID",
    "CLAUDE_CODE_IPC_SOCKET",
    "CLAUDE_CODE_BRIDGE_PORT",
    "ANTIGRAVITY_CONVERSATION_ID",
    "HERMES_SESSION_ID",
    "GROK_SESSION_ID",
    "OPENCODE_SESSION_ID",
];

/// True when `name` is a denylisted marker.
pub fn denied(name: &str) -> bool {
    BOOTSTRAP_DENYLIST.contains(&name)
}

/// MAM_NO_AUTOSTART=1 (only the literal `1`).
pub fn no_autostart(ctx: &Ctx) -> bool {
    ctx.var("MAM_NO_AUTOSTART").as_deref() == Some("1")
}

/// True when `tool` is an executable file on the context's PATH.
pub fn on_path(ctx: &Ctx, tool: &str) -> Option<PathBuf> {
    let path = ctx.var("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(tool)).find(|p| p.is_file())
}

/// The backend name in use: `MAM_PANE_BACKEND`, else herdr when on PATH, else tmux.
pub fn backend_name(ctx: &Ctx) -> Result<&'static str, Failure> {
    match ctx.var_nonempty("MAM_PANE_BACKEND").as_deref() {
        Some("herdr") => Ok("herdr"),
        Some("tmux") => Ok("tmux"),
        Some("fake") => Ok("fake"),
        Some(other) => Err(Failure::usage(format!(
            "MAM_PANE_BACKEND: unknown backend '{}' (herdr, tmux or fake)",
            crate::text::one_line(other)
        ))),
        None if on_path(ctx, "herdr").is_some() => Ok("herdr"),
        None => Ok("tmux"),
    }
}

/// Opens the backend chosen by `MAM_PANE_BACKEND` on `server` (default: the backend's default server).
pub fn open(ctx: &Ctx, server: Option<&str>) -> Result<Box<dyn Backend>, Failure> {
    open_named(ctx, backend_name(ctx)?, server)
}

/// Opens a named backend (a row's recorded `backend`) on `server`.
pub fn open_named(ctx: &Ctx, name: &str, server: Option<&str>) -> Result<Box<dyn Backend>, Failure> {
    let knobs = Knobs::from_ctx(ctx)?;
    let server = server.filter(|s| !s.is_empty());
    Ok(match name {
        "herdr" => Box::new(herdr::Herdr::new(ctx, server, knobs)),
        "tmux" => Box::new(tmux::Tmux::new(ctx, server, knobs)),
        "fake" => Box::new(fake::Fake::new(ctx, server, knobs)?),
        other => return Err(Failure::usage(format!("unknown pane backend '{}'", crate::text::one_line(other)))),
    })
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

// ---------------------------------------------------------------------------------------------
// Placement (1.5), pure decisions

/// Where a new agent goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// Reuse the idle pane of workspace `ws` (index into the list).
    Reuse { ws: usize, pane: String },
    /// Split `from` in direction `dir` inside workspace `ws`.
    Split { ws: usize, from: String, dir: Dir },
    /// Every same-cwd workspace is full.
    Create,
}

/// 1.5 steps 2-3: the first workspace with an idle pane (only when the environment set is empty) or
/// room in its 2 x `rows` grid. An idle pane counts toward the pane count.
pub fn choose(workspaces: &[Workspace], env_empty: bool, rows: u32) -> Choice {
    let capacity = 2 * rows.max(1) as usize;
    for (i, ws) in workspaces.iter().enumerate() {
        if env_empty {
            if let Some(p) = ws.panes.iter().find(|p| p.idle()) {
                return Choice::Reuse { ws: i, pane: p.id.clone() };
            }
        }
        if !ws.panes.is_empty() && ws.panes.len() < capacity {
            let (from, dir) = split_plan(&ws.panes);
            return Choice::Split { ws: i, from, dir };
        }
    }
    Choice::Create
}

/// 1.5 step 4: the second pane splits the root to the right; later panes split the bottom pane of
/// the column holding fewer panes downward, ties to the left column.
pub fn split_plan(panes: &[PaneInfo]) -> (String, Dir) {
    let [left, right] = columns(panes);
    if right.is_empty() {
        return (left.first().map(|p| p.id.clone()).unwrap_or_default(), Dir::Right);
    }
    let col = if right.len() < left.len() { &right } else { &left };
    (col.last().map(|p| p.id.clone()).unwrap_or_default(), Dir::Down)
}

/// The two grid columns, each top to bottom. With geometry: the leftmost x is the left column.
/// Without: the panes are taken in creation order and placed by the rule itself.
fn columns(panes: &[PaneInfo]) -> [Vec<&PaneInfo>; 2] {
    let mut cols: [Vec<&PaneInfo>; 2] = [Vec::new(), Vec::new()];
    if !panes.is_empty() && panes.iter().all(|p| p.pos.is_some()) {
        let min_x = panes.iter().filter_map(|p| p.pos).map(|(x, _)| x).min().unwrap_or(0);
        for p in panes {
            let (x, _) = p.pos.unwrap_or((0, 0));
            cols[usize::from(x != min_x)].push(p);
        }
        for c in &mut cols {
            c.sort_by_key(|p| p.pos.map(|(_, y)| y).unwrap_or(0));
        }
        return cols;
    }
    for (i, p) in panes.iter().enumerate() {
        let c = match i {
            0 => 0,
            1 => 1,
            _ => usize::from(cols[1].len() < cols[0].len()),
        };
        cols[c].push(p);
    }
    cols
}

/// One step of the start-up dialog rule (1.5 step 7): given the status after start and the number of
/// `enter`s already sent, what to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DialogStep {
    Ready,
    SendEnter,
    Fail,
}

pub fn dialog_step(status: Status, enters_sent: u32, max: u32) -> DialogStep {
    match status {
        Status::Blocked if enters_sent < max => DialogStep::SendEnter,
        Status::Blocked => DialogStep::Fail,
        _ => DialogStep::Ready,
    }
}

/// What `place_and_start` needs.
#[derive(Debug, Clone)]
pub struct PlaceRequest {
    pub name: String,
    pub kind: String,
    pub cwd: PathBuf,
    /// The environment set E (1.5 step 1); reaches the agent only on create/split.
    pub env: Vec<(String, String)>,
    pub args: Vec<String>,
    /// `MAM_WS_LABEL`.
    pub label: Option<String>,
}

/// Where the agent landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub pane: String,
    pub workspace: String,
    pub server: String,
    pub reused: bool,
    /// This attempt created the workspace (a rollback may close it).
    pub created_workspace: bool,
}

/// A placement that failed after it touched a pane: what to roll back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlaceFailure {
    pub error: PaneError,
    pub partial: Option<Placed>,
}

/// 1.5 in full: ensure the server, choose a pane, create/split/reuse, rename the chosen workspace,
/// start the agent and clear start-up dialogs. On failure after a pane was chosen, `partial` says
/// which pane (and whether its workspace is new) so the caller can roll back.
pub fn place_and_start(b: &dyn Backend, req: &PlaceRequest, knobs: &Knobs) -> Result<Placed, PlaceFailure> {
    let early = |e: PaneError| PlaceFailure { error: e, partial: None };
    if !valid_name(&req.name) {
        return Err(early(PaneError::Usage(format!(
            "invalid session name '{}' (expected [a-z][a-z0-9_-]{{0,31}})",
            crate::text::one_line(&req.name)
        ))));
    }
    b.ensure_server().map_err(early)?;
    let workspaces = b.list_workspaces(&req.cwd).map_err(early)?;
    let choice = choose(&workspaces, req.env.is_empty(), knobs.ws_rows);
    let placed = match choice {
        Choice::Reuse { ws, pane } => Placed {
            pane,
            workspace: workspaces[ws].id.clone(),
            server: b.server(),
            reused: true,
            created_workspace: false,
        },
        Choice::Split { ws, from, dir } => {
            let pane = b.split(&from, dir, &req.cwd, &req.env).map_err(early)?;
            Placed {
                pane,
                workspace: workspaces[ws].id.clone(),
                server: b.server(),
                reused: false,
                created_workspace: false,
            }
        }
        Choice::Create => {
            let c = b.create_workspace(&req.cwd, req.label.as_deref(), &req.env).map_err(early)?;
            Placed { pane: c.pane, workspace: c.workspace, server: b.server(), reused: false, created_workspace: true }
        }
    };
    let fail = |e: PaneError| PlaceFailure { error: e, partial: Some(placed.clone()) };
    if let (Some(label), false) = (&req.label, placed.created_workspace) {
        b.rename_workspace(&placed.workspace, label).map_err(fail)?;
    }
    b.start_agent(&req.name, &req.kind, &placed.pane, &req.args).map_err(fail)?;
    clear_startup_dialogs(b, &req.name, knobs).map_err(fail)?;
    Ok(placed)
}

/// Undoes what a placement created: the workspace when this attempt created it, else the split pane;
/// a reused pane is left as it was found. Sessions' verified rollback (ORCH 2.3) starts here.
pub fn rollback(b: &dyn Backend, p: &Placed) -> PaneResult<()> {
    if p.created_workspace {
        b.close_workspace(&p.workspace)
    } else if !p.reused {
        b.close_pane(&p.pane)
    } else {
        Ok(())
    }
}

/// 1.5 step 7: a `blocked` agent after start gets `enter`, at most `dialog_max` times; still blocked
/// is a start failure. Agent-agnostic: no screen matching.
pub fn clear_startup_dialogs(b: &dyn Backend, name: &str, knobs: &Knobs) -> PaneResult<()> {
    let mut sent = 0;
    let mut status = b.agent_status(name);
    loop {
        match dialog_step(status, sent, knobs.dialog_max) {
            DialogStep::Ready => return Ok(()),
            DialogStep::Fail => {
                return Err(PaneError::Failed(format!(
                    "agent {name} still blocked after {sent} start-up dialog enter(s) (MAM_STARTUP_DIALOG_MAX={})",
                    knobs.dialog_max
                )))
            }
            DialogStep::SendEnter => {
                b.send_keys(name, "enter")?;
                sent += 1;
                let deadline = Instant::now() + Duration::from_millis(knobs.dialog_settle_ms);
                loop {
                    status = b.agent_status(name);
                    if status != Status::Blocked || Instant::now() >= deadline {
                        break;
                    }
                    sys::sleep(Duration::from_millis(knobs.poll_ms.clamp(10, 200)));
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// send_keys_safe (1.7, A24)

/// The job whose own `started` confirms delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRef {
    pub registry: PathBuf,
    pub job_id: String,
    /// The current dispatch token; `None` reads it from the record before submitting.
    pub token: Option<String>,
}

/// The outcome of `send_keys_safe`, with its exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SksOutcome {
    /// rc 0: settled, or accepted and confirmed (the text says by what).
    Delivered(String),
    /// rc 3: nothing submitted (agent busy, transport error, agent not running, unknown target).
    NotSubmitted(String),
    /// rc 4: accepted but not confirmed within the grace (fail closed).
    Unconfirmed(String),
}

impl SksOutcome {
    pub fn rc(&self) -> i32 {
        match self {
            SksOutcome::Delivered(_) => 0,
            SksOutcome::NotSubmitted(_) => 3,
            SksOutcome::Unconfirmed(_) => 4,
        }
    }
}

/// The longest prompt `send_keys_safe` accepts (1.7: longer content goes in a file the prompt names).
pub const MAX_PROMPT: usize = 4096;

/// 1.7 with A24: idle handshake (skipped for backends without lifecycle), quiescence, submit, and
/// delivery confirmed only by `working` or the job's own `started` with the current token.
pub fn send_keys_safe(b: &dyn Backend, target: &str, text: &str, job: Option<&JobRef>, k: &Knobs) -> SksOutcome {
    let poll = Duration::from_millis(k.poll_ms);
    // 1. Idle handshake.
    if b.has_lifecycle() {
        let deadline = Instant::now() + Duration::from_millis(k.idle_wait_ms);
        loop {
            match b.agent_status(target) {
                Status::Idle | Status::Done => break,
                Status::Absent => return SksOutcome::NotSubmitted(format!("agent {target} is not running")),
                _ => {}
            }
            if Instant::now() >= deadline {
                return SksOutcome::NotSubmitted(format!(
                    "agent busy: {target} not idle within {} s (MAM_SKS_IDLE_WAIT_S); nothing submitted",
                    k.idle_wait_ms / 1000
                ));
            }
            sys::sleep(poll.min(remaining(deadline)).max(Duration::from_millis(1)));
        }
    } else if b.agent_status(target) == Status::Absent {
        return SksOutcome::NotSubmitted(format!("agent {target} is not running"));
    }
    // 2. Quiescence: two identical reads a gap apart, tried for a while, then submit anyway.
    let deadline = Instant::now() + Duration::from_millis(k.quiesce_max_ms);
    let mut last = match b.read_detection(target) {
        Ok(t) => t,
        Err(e) => return SksOutcome::NotSubmitted(format!("cannot read {target}: {e}")),
    };
    while Instant::now() < deadline {
        sys::sleep(Duration::from_millis(k.quiesce_gap_ms).min(remaining(deadline)));
        let now = match b.read_detection(target) {
            Ok(t) => t,
            Err(e) => return SksOutcome::NotSubmitted(format!("cannot read {target}: {e}")),
        };
        if now == last {
            break;
        }
        last = now;
    }
    // The token is read before the submission so a later re-dispatch cannot be mistaken for ours.
    let token = job.and_then(|j| j.token.clone().or_else(|| record_token(j)));
    // 3-6. Submit and judge.
    let why = match b.prompt(target, text, k.prompt_timeout_ms) {
        PromptOutcome::Settled => return SksOutcome::Delivered("settled".into()),
        PromptOutcome::TransportError(e) => return SksOutcome::NotSubmitted(format!("{e}; nothing submitted")),
        PromptOutcome::Accepted(Accepted::Timeout) => "timeout",
        PromptOutcome::Accepted(Accepted::Stalled) => "agent_prompt_stalled",
    };
    let deadline = Instant::now() + Duration::from_millis(k.grace_ms);
    loop {
        if b.agent_status(target) == Status::Working {
            return SksOutcome::Delivered(format!("accepted ({why}), confirmed by status working"));
        }
        if let (Some(j), Some(t)) = (job, token.as_deref()) {
            if job_started(j, t) {
                return SksOutcome::Delivered(format!("accepted ({why}), confirmed by job {} started", j.job_id));
            }
        }
        if Instant::now() >= deadline {
            return SksOutcome::Unconfirmed(format!(
                "prompt to {target} accepted ({why}) but delivery not confirmed within {} s (SKS_DELIVERY_GRACE_S)",
                k.grace_ms / 1000
            ));
        }
        sys::sleep(poll.min(remaining(deadline)).max(Duration::from_millis(1)));
    }
}

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
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
    if let Ok(text) = std::fs::read_to_string(j.registry.join(&j.job_id).join("events.log")) {
        for line in text.lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { continue };
            if v.get("event").and_then(|e| e.as_str()) == Some("started")
                && v.get("dispatch_token").and_then(|e| e.as_str()) == Some(token)
            {
                return true;
            }
        }
    }
    read_json(&j.registry.join(format!("{}.json", j.job_id))).is_some_and(|rec| {
        rec.get("status").and_then(|s| s.as_str()) == Some("running")
            && rec.get("dispatch_token").and_then(|s| s.as_str()) == Some(token)
    })
}

// ---------------------------------------------------------------------------------------------
// Shared helpers for the process-backed backends

/// The environment for a child that may start a server: the context's minus the denylist and the
/// herdr addressing variables (1.3).
pub fn server_env(ctx: &Ctx) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    ctx.child_env()
        .into_iter()
        .filter(|(k, _)| {
            let k = k.to_string_lossy();
            !denied(&k) && k != "HERDR_SOCKET_PATH" && k != "HERDR_SESSION"
        })
        .collect()
}

/// Runs `cmd` to completion within `limit`, draining both pipes; a timeout kills it and names `what`.
/// The child leads its own process group, so a descendant that still holds a pipe at the deadline is
/// killed with it (a daemon that left the group and closed its pipes is not touched); the readers
/// are waited for under the same deadline, never longer.
pub fn run_capture(cmd: &mut std::process::Command, limit: Duration, what: &str) -> PaneResult<std::process::Output> {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    use std::sync::mpsc;
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    let deadline = Instant::now() + limit;
    let mut child = sys::spawn(cmd).map_err(|e| PaneError::Failed(format!("cannot run {what}: {e}")))?;
    // (stream, bytes) per read; an empty chunk is that stream's end.
    let (tx, rx) = mpsc::channel::<(usize, Vec<u8>)>();
    let streams: [Option<Box<dyn Read + Send>>; 2] = [
        child.stdout.take().map(|s| Box::new(s) as Box<dyn Read + Send>),
        child.stderr.take().map(|s| Box::new(s) as Box<dyn Read + Send>),
    ];
    let mut open = [false, false];
    for (i, s) in streams.into_iter().enumerate() {
        let Some(mut s) = s else { continue };
        let tx = tx.clone();
        open[i] = std::thread::Builder::new()
            .name("pane-capture".into())
            .spawn(move || {
                let mut buf = [0u8; 8192];
                loop {
                    match s.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => {
                            if tx.send((i, buf[..n].to_vec())).is_err() {
                                return;
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(_) => break,
                    }
                }
                let _ = tx.send((i, Vec::new()));
            })
            .is_ok();
    }
    drop(tx);
    let pgid = child.id() as i32;
    let mut bufs: [Vec<u8>; 2] = [Vec::new(), Vec::new()];
    let mut status = None;
    let mut take = |msg: (usize, Vec<u8>), open: &mut [bool; 2]| {
        if msg.1.is_empty() {
            open[msg.0] = false;
        } else {
            bufs[msg.0].extend_from_slice(&msg.1);
        }
    };
    loop {
        if status.is_none() {
            match child.try_wait() {
                Ok(st) => status = st,
                Err(e) => {
                    let _ = sys::kill(-pgid, libc::SIGKILL);
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(PaneError::Failed(format!("{what}: wait failed: {e}")));
                }
            }
        }
        if status.is_some() && !open.contains(&true) {
            break;
        }
        let now = Instant::now();
        if now >= deadline {
            // The child, or a descendant in its group holding a pipe, outlived the limit.
            let _ = sys::kill(-pgid, libc::SIGKILL);
            if status.is_none() {
                let _ = child.kill();
                let _ = child.wait();
                return Err(PaneError::Failed(format!("{what}: timed out after {} ms", limit.as_millis())));
            }
            // The child finished: keep what its readers got until the group is gone (bounded).
            let grace = Instant::now() + Duration::from_millis(200);
            while open.contains(&true) {
                match rx.recv_timeout(grace.saturating_duration_since(Instant::now())) {
                    Ok(m) => take(m, &mut open),
                    Err(_) => break,
                }
            }
            break;
        }
        match rx.recv_timeout((deadline - now).min(Duration::from_millis(5))) {
            Ok(m) => take(m, &mut open),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => open = [false, false],
        }
    }
    let [stdout, stderr] = bufs;
    Ok(std::process::Output { status: status.expect("the child was reaped"), stdout, stderr })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `run_capture` on a thread, failing (not hanging) the test if it takes over 10 s.
    fn capture_within(script: &str, limit: Duration) -> (PaneResult<std::process::Output>, Duration) {
        let script = script.to_string();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let started = Instant::now();
            let mut c = std::process::Command::new("sh");
            c.args(["-c", &script]);
            let r = run_capture(&mut c, limit, "sh");
            let _ = tx.send((r, started.elapsed()));
        });
        rx.recv_timeout(Duration::from_secs(10)).expect("run_capture returned within 10 s")
    }

    fn gone(pid: i32) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if !matches!(sys::proc_start_ticks(pid), Ok((_, false))) {
                return true;
            }
            sys::sleep(Duration::from_millis(10));
        }
        false
    }

    #[test]
    fn run_capture_is_bounded_when_a_descendant_holds_the_pipe() {
        // The child exits at once; a backgrounded sleep keeps its stdout open.
        let (r, took) = capture_within("sleep 30 & echo $!; echo done", Duration::from_secs(1));
        let out = r.unwrap();
        assert!(took < Duration::from_secs(3), "took {took:?}");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success() && text.ends_with("done\n"), "{text:?}");
        let sleeper: i32 = text.lines().next().unwrap().parse().unwrap();
        assert!(gone(sleeper), "the sleep holding the pipe was killed");
        // The child itself hangs: a timeout, and its whole group is gone.
        let (r, took) = capture_within("sleep 30 & echo $!; sleep 30", Duration::from_secs(1));
        let e = r.expect_err("timed out");
        assert!(e.to_string().contains("timed out after 1000 ms"), "{e}");
        assert!(took < Duration::from_secs(3), "took {took:?}");
    }

    fn pane(id: &str, agent: bool) -> PaneInfo {
        PaneInfo { id: id.into(), has_agent: agent, shell_foreground: !agent, pos: None }
    }

    fn ws(id: &str, panes: Vec<PaneInfo>) -> Workspace {
        Workspace { id: id.into(), label: String::new(), panes }
    }

    #[test]
    fn split_layout_second_right_then_fewer_column_down() {
        let mut panes = vec![pane("p0", true)];
        assert_eq!(split_plan(&panes), ("p0".into(), Dir::Right));
        panes.push(pane("p1", true));
        // Tie: left column, its bottom pane, downward.
        assert_eq!(split_plan(&panes), ("p0".into(), Dir::Down));
        panes.push(pane("p2", true));
        assert_eq!(split_plan(&panes), ("p1".into(), Dir::Down));
        panes.push(pane("p3", true));
        assert_eq!(split_plan(&panes), ("p2".into(), Dir::Down));
    }

    #[test]
    fn split_layout_uses_geometry_when_reported() {
        let g =
            |id: &str, x, y| PaneInfo { id: id.into(), has_agent: true, shell_foreground: false, pos: Some((x, y)) };
        // Pane order differs from creation order; geometry decides.
        let panes = vec![g("a", 0, 0), g("b", 0, 1), g("c", 1, 0)];
        assert_eq!(split_plan(&panes), ("c".into(), Dir::Down));
        let panes = vec![g("a", 0, 0), g("c", 1, 0), g("d", 1, 1)];
        assert_eq!(split_plan(&panes), ("a".into(), Dir::Down));
    }

    #[test]
    fn o1_9_4_packing_four_then_two() {
        // Simulate six placements with K = 2: 4 + 2.
        let mut wss: Vec<Workspace> = Vec::new();
        for n in 0..6 {
            match choose(&wss, true, 2) {
                Choice::Create => wss.push(ws(&format!("w{n}"), vec![pane(&format!("p{n}"), true)])),
                Choice::Split { ws, .. } => wss[ws].panes.push(pane(&format!("p{n}"), true)),
                Choice::Reuse { .. } => panic!("no idle pane exists"),
            }
        }
        let sizes: Vec<usize> = wss.iter().map(|w| w.panes.len()).collect();
        assert_eq!(sizes, [4, 2]);
    }

    #[test]
    fn o1_9_5_idle_pane_in_second_workspace_is_reused() {
        let full = ws("w1", (0..4).map(|i| pane(&format!("a{i}"), true)).collect());
        let second = ws("w2", vec![pane("b0", true), pane("b1", false)]);
        assert_eq!(choose(&[full.clone(), second.clone()], true, 2), Choice::Reuse { ws: 1, pane: "b1".into() });
        // With an environment set the idle pane is not used: the workspace still has room, so split.
        assert!(matches!(choose(&[full, second], false, 2), Choice::Split { ws: 1, .. }));
    }

    #[test]
    fn idle_pane_counts_toward_room() {
        let mut panes: Vec<PaneInfo> = (0..3).map(|i| pane(&format!("a{i}"), true)).collect();
        panes.push(pane("idle", false));
        assert_eq!(choose(&[ws("w1", panes)], false, 2), Choice::Create);
    }

    #[test]
    fn o1_9_10_dialog_rule_bounded() {
        assert_eq!(dialog_step(Status::Idle, 0, 3), DialogStep::Ready);
        assert_eq!(dialog_step(Status::Blocked, 0, 3), DialogStep::SendEnter);
        assert_eq!(dialog_step(Status::Blocked, 2, 3), DialogStep::SendEnter);
        assert_eq!(dialog_step(Status::Blocked, 3, 3), DialogStep::Fail);
        assert_eq!(dialog_step(Status::Blocked, 0, 0), DialogStep::Fail);
    }

    #[test]
    fn names_and_shells() {
        assert!(valid_name("claude-01"));
        assert!(!valid_name("Claude"));
        assert!(!valid_name("a;rm -rf"));
        assert!(!valid_name(&"a".repeat(33)));
        assert!(is_shell("-bash") && is_shell("/bin/sh") && !is_shell("claude"));
    }

    /// A scripted backend for the decision logic of `send_keys_safe`.
    struct Scripted {
        lifecycle: bool,
        status: Status,
        after_prompt: Status,
        outcome: PromptOutcome,
        prompts: std::cell::Cell<u32>,
    }

    impl Backend for Scripted {
        fn name(&self) -> &'static str {
            "scripted"
        }
        fn server(&self) -> String {
            "s".into()
        }
        fn ensure_server(&self) -> PaneResult<()> {
            Ok(())
        }
        fn list_agents(&self) -> ListOutcome {
            ListOutcome::NoServer
        }
        fn list_workspaces(&self, _: &Path) -> PaneResult<Vec<Workspace>> {
            Ok(Vec::new())
        }
        fn create_workspace(&self, _: &Path, _: Option<&str>, _: &[(String, String)]) -> PaneResult<Created> {
            Err(PaneError::Failed("no".into()))
        }
        fn split(&self, _: &str, _: Dir, _: &Path, _: &[(String, String)]) -> PaneResult<String> {
            Err(PaneError::Failed("no".into()))
        }
        fn rename_workspace(&self, _: &str, _: &str) -> PaneResult<()> {
            Ok(())
        }
        fn start_agent(&self, _: &str, _: &str, _: &str, _: &[String]) -> PaneResult<()> {
            Ok(())
        }
        fn prompt(&self, _: &str, _: &str, _: u32) -> PromptOutcome {
            self.prompts.set(self.prompts.get() + 1);
            self.outcome.clone()
        }
        fn agent_status(&self, _: &str) -> Status {
            if self.prompts.get() > 0 {
                self.after_prompt
            } else {
                self.status
            }
        }
        fn read_detection(&self, _: &str) -> PaneResult<String> {
            Ok("same".into())
        }
        fn send_keys(&self, _: &str, _: &str) -> PaneResult<()> {
            Ok(())
        }
        fn close_pane(&self, _: &str) -> PaneResult<()> {
            Ok(())
        }
        fn close_workspace(&self, _: &str) -> PaneResult<()> {
            Ok(())
        }
        fn has_lifecycle(&self) -> bool {
            self.lifecycle
        }
    }

    fn fast() -> Knobs {
        Knobs {
            idle_wait_ms: 100,
            grace_ms: 150,
            poll_ms: 10,
            quiesce_gap_ms: 10,
            quiesce_max_ms: 50,
            ..Knobs::default()
        }
    }

    fn scripted(lifecycle: bool, status: Status, after: Status, outcome: PromptOutcome) -> Scripted {
        Scripted { lifecycle, status, after_prompt: after, outcome, prompts: std::cell::Cell::new(0) }
    }

    #[test]
    fn a24_busy_agent_is_rc3_and_nothing_is_submitted() {
        let b = scripted(true, Status::Working, Status::Working, PromptOutcome::Settled);
        let o = send_keys_safe(&b, "a", "hi", None, &fast());
        assert_eq!(o.rc(), 3);
        assert!(matches!(&o, SksOutcome::NotSubmitted(m) if m.contains("agent busy")));
        assert_eq!(b.prompts.get(), 0);
    }

    #[test]
    fn a24_backend_without_lifecycle_skips_the_idle_wait_and_needs_started() {
        let dir = std::env::temp_dir().join(format!("mam-sks-{}", crate::sys::random_hex(6).unwrap()));
        std::fs::create_dir_all(dir.join("j1")).unwrap();
        let job = JobRef { registry: dir.clone(), job_id: "j1".into(), token: Some("t1".into()) };
        let accepted = PromptOutcome::Accepted(Accepted::Timeout);
        // Status only `unknown`: submitted anyway, and not confirmed without `started`.
        let b = scripted(false, Status::Unknown, Status::Unknown, accepted.clone());
        assert_eq!(send_keys_safe(&b, "a", "hi", Some(&job), &fast()).rc(), 4);
        assert_eq!(b.prompts.get(), 1);
        // The job's own started with the current token confirms it; another token does not.
        std::fs::write(dir.join("j1/events.log"), "{\"event\":\"started\",\"attempt\":1,\"dispatch_token\":\"t0\"}\n")
            .unwrap();
        assert_eq!(send_keys_safe(&b, "a", "hi", Some(&job), &fast()).rc(), 4);
        std::fs::write(dir.join("j1/events.log"), "not json\n{\"event\":\"started\",\"dispatch_token\":\"t1\"}\n")
            .unwrap();
        assert_eq!(send_keys_safe(&b, "a", "hi", Some(&job), &fast()).rc(), 0);
        // The record `running` with the token also counts; the token is read from the record.
        std::fs::remove_file(dir.join("j1/events.log")).unwrap();
        std::fs::write(dir.join("j1.json"), r#"{"status":"running","dispatch_token":"t9"}"#).unwrap();
        let job = JobRef { token: None, ..job };
        assert_eq!(send_keys_safe(&b, "a", "hi", Some(&job), &fast()).rc(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
        // `working` after an accepted submission confirms delivery.
        let b = scripted(true, Status::Idle, Status::Working, PromptOutcome::Accepted(Accepted::Stalled));
        assert_eq!(send_keys_safe(&b, "a", "hi", None, &fast()).rc(), 0);
        // A transport error submits nothing.
        let b = scripted(true, Status::Idle, Status::Idle, PromptOutcome::TransportError("x".into()));
        assert_eq!(send_keys_safe(&b, "a", "hi", None, &fast()).rc(), 3);
    }

    #[test]
    fn denylist_is_exact() {
        assert!(denied("CLAUDECODE"));
        assert!(!denied("CLAUDE_PROJECT_DIR"));
        assert!(!denied("CLAUDECODE_X"));
    }
}
