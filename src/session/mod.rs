//! Sessions (ORCH 2): the sessions file (JSON, 2.2) with its lock, the control-plane binding and the
//! forwarding decision (2.3 steps 2-4), verified rollback, and the flows `create`, `resume`, `stop`,
//! `status`, one-shot `reconcile` and the legacy YAML import, each in its own file.
//!
//! Library code: it never prints (diagnostics are collected in `Notes` for the subcommand to print)
//! and never reads the process environment (everything comes from `Ctx`). Every write of the
//! sessions file is read-modify-write under `<sessions file>.lock` with an atomic rename; readers do
//! not lock (ORCH 0.3).

pub mod create;
pub mod orc;
pub mod reconcile;
pub mod resume;
pub mod status;
pub mod stop;
pub mod yaml;

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::agents;
use crate::ctx::{ChildRole, Ctx};
use crate::knob::ConfigError;
use crate::pane::{self, Backend, ListOutcome, Placed};
use crate::pane::{OpenError, PaneError};
use crate::paths::{self, Resolved};
use crate::sys::{self, Flock, LockMode};
use crate::text::{one_line, show_path};

// ---------------------------------------------------------------------------------------------
// Errors and diagnostics

/// Why a session command stopped. `cmd` renders each variant as one line with its exit code
/// (ORCH 0.4, 2.3-2.7, A3); the exit code is noted on each variant.
#[derive(Debug)]
pub enum SessionError {
    /// rc 2: refused before any change.
    Refused(String),
    /// rc 2: the sessions file is not JSON, or not a sessions document.
    NotJson { path: PathBuf, detail: String },
    /// rc 1: an operational failure (a rollback, if any, already ran; the text says what is left).
    Failed(String),
    /// rc 2: a knob with an invalid value.
    Config(ConfigError),
    /// rc 2: the pane backend could not be opened (a bad backend name).
    Backend(OpenError),
    /// rc 2 for bad input the backend detected, else rc 1.
    Pane(PaneError),
    /// rc 4: `stop --purge-conversation` without `--yes`.
    PurgeNeedsYes,
    /// rc 5: the session stopped, but its conversation was kept (why).
    ConversationKept { name: String, why: String },
}

impl From<crate::paths::Untrusted> for SessionError {
    fn from(e: crate::paths::Untrusted) -> SessionError {
        SessionError::Failed(e.to_string())
    }
}

impl fmt::Display for SessionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SessionError::Refused(m) | SessionError::Failed(m) => f.write_str(m),
            SessionError::NotJson { path, detail } => write!(f, "{} is not JSON ({detail})", show_path(path)),
            SessionError::Config(e) => e.fmt(f),
            SessionError::Backend(e) => e.fmt(f),
            SessionError::Pane(e) => e.fmt(f),
            SessionError::PurgeNeedsYes => f.write_str("--purge-conversation needs --yes"),
            SessionError::ConversationKept { name, why } => {
                write!(f, "{name}: session stopped; conversation kept ({why})")
            }
        }
    }
}

impl From<ConfigError> for SessionError {
    fn from(e: ConfigError) -> SessionError {
        SessionError::Config(e)
    }
}

impl From<OpenError> for SessionError {
    fn from(e: OpenError) -> SessionError {
        SessionError::Backend(e)
    }
}

impl From<PaneError> for SessionError {
    fn from(e: PaneError) -> SessionError {
        SessionError::Pane(e)
    }
}

fn io_failed(what: &str, p: &Path, e: io::Error) -> SessionError {
    SessionError::Failed(format!("cannot {what} {}: {e}", show_path(p)))
}

/// Diagnostic lines (already prefixed `WARNING: `/`NOTE: `) a flow collected for its caller to print.
#[derive(Debug, Default)]
pub struct Notes(pub Vec<String>);

impl Notes {
    pub fn warn(&mut self, msg: impl fmt::Display) {
        self.0.push(format!("WARNING: {}", one_line(&msg.to_string())));
    }
    pub fn note(&mut self, msg: impl fmt::Display) {
        self.0.push(format!("NOTE: {}", one_line(&msg.to_string())));
    }
    /// A line that already carries its prefix (relayed from a child).
    pub fn raw(&mut self, line: impl Into<String>) {
        self.0.push(line.into());
    }
}

// ---------------------------------------------------------------------------------------------
// The sessions file (2.2)

/// The four absolute paths of a row's control plane. Legacy rows may carry only some of them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlPlane {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_root: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_sessions_yaml: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mam_jobs_dir: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delegate_job_logs_dir: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The binding's variable names, in the legacy order.
pub const BINDING_VARS: [&str; 4] = ["WORKSPACE_ROOT", "AGENT_SESSIONS_YAML", "MAM_JOBS_DIR", "DELEGATE_JOB_LOGS_DIR"];

impl ControlPlane {
    /// The four values in `BINDING_VARS` order.
    pub fn values(&self) -> [Option<&str>; 4] {
        [
            self.workspace_root.as_deref(),
            self.agent_sessions_yaml.as_deref(),
            self.mam_jobs_dir.as_deref(),
            self.delegate_job_logs_dir.as_deref(),
        ]
    }

    fn slots(&mut self) -> [&mut Option<String>; 4] {
        [
            &mut self.workspace_root,
            &mut self.agent_sessions_yaml,
            &mut self.mam_jobs_dir,
            &mut self.delegate_job_logs_dir,
        ]
    }

    /// All four present.
    pub fn complete(&self) -> bool {
        self.values().iter().all(Option::is_some)
    }

    /// Fills the fields this binding lacks from `other`, never overwriting one (2.4 step 3).
    pub fn fill_missing(&mut self, other: &ControlPlane) {
        let theirs = other.values();
        for (slot, v) in self.slots().into_iter().zip(theirs) {
            if slot.is_none() {
                *slot = v.map(str::to_string);
            }
        }
    }

    /// The `--env` set forwarded to a pane: all four, as `K=V` pairs (2.3 step 3: all or none).
    pub fn env(&self) -> Vec<(String, String)> {
        BINDING_VARS.iter().zip(self.values()).filter_map(|(k, v)| v.map(|v| (k.to_string(), v.to_string()))).collect()
    }
}

/// A row's `pane` object.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaneRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd_full: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

fn local() -> String {
    "local".into()
}

/// One session (2.2). Fields this version does not know are kept verbatim in `extra`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub name: String,
    #[serde(default)]
    pub agent: String,
    #[serde(default = "local")]
    pub transport: String,
    #[serde(default)]
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pane: Option<PaneRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_command: Option<String>,
    /// The agent arguments given after `--` at create (decided: kept so resume can start the same
    /// command line; `start_command` is their quoted display form).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agent_args: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane: Option<ControlPlane>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub onboard_job: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub herdr_confirmed: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_reconciled_at: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Row {
    pub fn running(&self) -> bool {
        self.status == "running"
    }
    pub fn remote(&self) -> bool {
        self.transport == "remote"
    }
    pub fn pane_id(&self) -> Option<&str> {
        self.pane.as_ref().and_then(|p| p.id.as_deref()).filter(|s| !s.is_empty())
    }
    pub fn server(&self) -> Option<&str> {
        self.pane.as_ref().and_then(|p| p.server.as_deref()).filter(|s| !s.is_empty())
    }
    pub fn cwd(&self) -> Option<&str> {
        self.pane.as_ref().and_then(|p| p.cwd.as_deref()).filter(|s| !s.is_empty())
    }
    /// Identity of one incarnation: a reconcile or a race check compares it before changing a row.
    pub fn incarnation(&self) -> (String, Option<String>, Option<String>, Option<String>) {
        (self.name.clone(), self.pane_id().map(str::to_string), self.created_at.clone(), self.resumed_at.clone())
    }
}

/// Issue 30: before a claude starts in `cwd`, the one allow rule for mam's publish lines goes into
/// `<cwd>/.claude/settings.local.json` (`agents::allow`), so claude's default mode runs the brief's
/// commands without an approval prompt. A failure is a warning: the agent then asks for approval, and
/// `mam status` shows it waiting.
pub fn grant_approval(ctx: &Ctx, kind: &str, cwd: &Path, registry: &Path, notes: &mut Notes) {
    if kind != "claude" {
        return;
    }
    let rule = match crate::ops::mam_exe(ctx) {
        Ok(m) => crate::agents::allow::claude_rules(&m, registry),
        Err(e) => return notes.warn(format!("no allow rule for mam's commands written ({e})")),
    };
    match crate::agents::allow::add(cwd, &rule) {
        // Said once in docs/AGENTS.md, not at every create: a note on every success is noise.
        Ok(_) => {}
        Err(e) => return notes.warn(format!("the agent will ask approval for mam's commands: {e}")),
    }
    if let Err(e) = git_exclude(ctx, cwd) {
        notes.warn(format!("git may list .claude/settings.local.json as untracked: {e}"));
    }
}

/// In a git work tree, makes git ignore `.claude/settings.local.json` through the repository's
/// `info/exclude` (unless something ignores it already), so that mam's rules never show as an
/// untracked file in a worktree check or a review diff. The line stays after stop: it only hides a
/// local settings file. Returns whether the exclude file changed; outside a repository, nothing.
fn git_exclude(ctx: &Ctx, dir: &Path) -> Result<bool, String> {
    // Through the one git runner (issue 29): hooks and filters of the repository never run.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut g = crate::git::Git::new(ctx, dir.to_path_buf(), deadline);
    let Ok(out) = g.run(&["rev-parse", "--git-path", "info/exclude"]) else { return Ok(false) };
    if !out.status.success() {
        return Ok(false);
    }
    let rel = String::from_utf8_lossy(&out.stdout).trim_end_matches(['\n', '\r']).to_string();
    if g.run(&["check-ignore", "-q", crate::agents::allow::SETTINGS]).is_ok_and(|o| o.status.success()) {
        return Ok(false);
    }
    let path = dir.join(rel);
    let mut text = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    if !text.is_empty() && !text.ends_with(b"\n") {
        text.push(b'\n');
    }
    text.extend_from_slice(
        b"# mam: claude's local settings, where mam writes its allow rules\n.claude/settings.local.json\n",
    );
    if let Some(parent) = path.parent() {
        sys::create_dir_all(parent).map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    }
    sys::atomic_write_mode(&path, &text, 0o644).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(true)
}

/// Issue 30: takes mam's allow rule out of `<cwd>/.claude/settings.local.json` once no running claude
/// row of `doc` (other than `except`) works in that directory.
pub fn revoke_approval(ctx: &Ctx, doc: &Sessions, except: &str, cwd: &Path, registry: &Path, notes: &mut Notes) {
    let shared = doc.herdr_sessions.iter().any(|r| {
        r.name != except && r.agent == "claude" && r.running() && r.cwd().is_some_and(|c| same_dir(Path::new(c), cwd))
    });
    if shared {
        return;
    }
    let Ok(m) = crate::ops::mam_exe(ctx) else { return };
    let rule = crate::agents::allow::claude_rules(&m, registry);
    match crate::agents::allow::remove(cwd, &rule) {
        Ok(_) => {}
        Err(e) => notes.warn(format!("mam's allow rule not removed: {e}")),
    }
}

/// The whole file: `{ "version": 1, "herdr_sessions": [...], "orchestrator_uuids": [...] }`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sessions {
    #[serde(default = "one")]
    pub version: u64,
    #[serde(default)]
    pub herdr_sessions: Vec<Row>,
    #[serde(default)]
    pub orchestrator_uuids: Vec<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

fn one() -> u64 {
    1
}

impl Default for Sessions {
    fn default() -> Sessions {
        Sessions { version: 1, herdr_sessions: Vec::new(), orchestrator_uuids: Vec::new(), extra: Map::new() }
    }
}

impl Sessions {
    pub fn row(&self, name: &str) -> Option<&Row> {
        self.herdr_sessions.iter().find(|r| r.name == name)
    }
    pub fn row_mut(&mut self, name: &str) -> Option<&mut Row> {
        self.herdr_sessions.iter_mut().find(|r| r.name == name)
    }

    /// Parses a sessions document. Empty (or blank) text is an empty document.
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<Sessions, SessionError> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Sessions::default());
        }
        let v: Value = serde_json::from_slice(bytes)
            .map_err(|e| SessionError::NotJson { path: path.to_path_buf(), detail: e.to_string() })?;
        if !v.is_object() {
            return Err(SessionError::NotJson { path: path.to_path_buf(), detail: "not a JSON object".into() });
        }
        serde_json::from_value(v).map_err(|e| SessionError::NotJson {
            path: path.to_path_buf(),
            detail: format!("not a sessions document: {e}"),
        })
    }

    /// The bytes written to disk: 2-space indentation, trailing newline.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec_pretty(self).expect("a sessions document always serialises");
        out.push(b'\n');
        out
    }
}

/// `<sessions file>.lock`.
pub fn lock_path(file: &Path) -> PathBuf {
    let mut name = file.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".lock");
    file.with_file_name(name)
}

/// Reads the sessions file without a lock. A missing file is an empty document.
pub fn load(file: &Path) -> Result<Sessions, SessionError> {
    match fs::read(file) {
        Ok(b) => Sessions::parse(file, &b),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Sessions::default()),
        Err(e) => Err(io_failed("read", file, e)),
    }
}

/// Read-modify-write under `<file>.lock`: `f` sees the current document; when it returns `Ok` and
/// changed something, the document is written atomically. An `Err` writes nothing. `f` must not
/// spawn or sleep (the lock is held).
pub fn update<T>(file: &Path, f: impl FnOnce(&mut Sessions) -> Result<T, SessionError>) -> Result<T, SessionError> {
    if let Some(dir) = file.parent() {
        sys::create_dir_all(dir).map_err(|e| io_failed("create", dir, e))?;
    }
    let lp = lock_path(file);
    let _lock = Flock::lock_path(&lp, LockMode::Exclusive).map_err(|e| io_failed("lock", &lp, e))?;
    let before = load(file)?;
    let mut doc = before.clone();
    let out = f(&mut doc)?;
    if doc != before {
        sys::atomic_write(file, &doc.to_bytes()).map_err(|e| io_failed("write", file, e))?;
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Names and kinds

/// The adapter of a row's or a request's kind (ORCH 6.1), or the create/resume refusal naming the
/// known kinds.
pub fn adapter_of(kind: &str) -> Result<&'static agents::Adapter, SessionError> {
    agents::adapter(kind).ok_or_else(|| {
        SessionError::Refused(format!(
            "unknown agent kind '{}' (known: {})",
            one_line(kind),
            agents::kinds().join(", ")
        ))
    })
}

/// Before anything is placed: the executable a process-backed backend will start must be on the
/// caller's PATH (the fake backend runs the mam binary itself), and herdr must know the kind.
/// Fails fast naming the executable and the kind instead of a start timeout.
pub fn check_startable(ctx: &Ctx, backend: &str, ad: &agents::Adapter) -> Result<(), SessionError> {
    if backend == "fake" {
        return Ok(());
    }
    if backend == "herdr" && ad.is_builtin() {
        return Err(SessionError::Refused(format!(
            "the {} agent runs in tmux panes only (herdr starts only its own agent kinds); use MAM_PANE_BACKEND=tmux",
            ad.kind
        )));
    }
    if backend == "herdr" && ad.herdr_kind.is_none() {
        return Err(SessionError::Refused(format!(
            "herdr has no agent kind for {}; use MAM_PANE_BACKEND=tmux",
            ad.kind
        )));
    }
    if !ad.is_builtin() && pane::on_path(ctx, ad.executable).is_none() {
        return Err(SessionError::Refused(format!(
            "agent executable '{}' (kind {}) not found on PATH: {}",
            ad.executable,
            ad.kind,
            ad.install_hint()
        )));
    }
    Ok(())
}

/// The kind a backend starts: herdr's own name for it, else the kind.
pub fn backend_kind(backend: &str, ad: &agents::Adapter) -> String {
    match (backend, ad.herdr_kind) {
        ("herdr", Some(k)) => k.to_string(),
        _ => ad.kind.to_string(),
    }
}

/// The conversation id of a started agent when mam could not choose it (2.2, 6.1): the backend's
/// native session reference (herdr `agent_session`), else for codex the uuid of the newest rollout
/// file under the agent's HOME written for `cwd` since `since_ms`, for opencode the newest session
/// its log says it created in `cwd` since then. For codex the rollout one of the agent's processes
/// `pids` holds open comes first (several codex sessions in one directory, issue 30).
pub fn learn_conversation(
    ctx: &Ctx,
    b: &dyn Backend,
    name: &str,
    ad: &agents::Adapter,
    cwd: &Path,
    since_ms: u64,
    pids: &[i32],
) -> Option<String> {
    if matches!(ad.conversation, agents::ConversationId::None | agents::ConversationId::Chosen(_)) {
        return None;
    }
    if let Some(s) = b.agent_session(name).filter(|s| !s.is_empty() && !s.chars().any(char::is_control)) {
        return Some(s);
    }
    match ad.conversation {
        agents::ConversationId::CodexRollout => {
            let home = ctx.path_var("HOME")?;
            agents::artifacts::codex_rollout_held_by(pids, &home)
                .or_else(|| agents::artifacts::codex_rollout_id(&home, cwd, since_ms))
        }
        agents::ConversationId::OpencodeLog => {
            // XDG_DATA_HOME when absolute (the XDG rule), else ~/.local/share.
            let data = ctx
                .path_var("XDG_DATA_HOME")
                .filter(|p| p.is_absolute())
                .or_else(|| ctx.path_var("HOME").map(|h| h.join(".local/share")))?;
            agents::artifacts::opencode_log_id(&data, cwd, since_ms)
        }
        _ => None,
    }
}

/// The pane extra field holding the agent's processes, `[[pid, start ticks], ...]`.
pub const AGENT_PIDS: &str = "agent_pids";

/// The agent's processes right after start: the pane's tree without its shell (verified to be the
/// pane's, `pane::proc::pane_tree`), as recorded in the row's `pane.agent_pids`.
pub fn agent_pids_value(b: &dyn Backend, pane_id: &str, cwd: &Path) -> Option<Value> {
    let roots = b.pane_pids(pane_id);
    let procs: Vec<Value> = pane::proc::pane_tree(&roots, cwd)
        .into_iter()
        .filter(|p| {
            let argv = sys::proc_cmdline(p.pid).unwrap_or_default();
            !argv.first().is_some_and(|a| pane::is_shell(&String::from_utf8_lossy(a)))
        })
        .map(|p| serde_json::json!([p.pid, p.start]))
        .collect();
    (!procs.is_empty()).then_some(Value::Array(procs))
}

/// The processes a row recorded for its agent (`pane.agent_pids`).
pub fn recorded_procs(row: &Row) -> Vec<pane::proc::Proc> {
    let Some(list) = row.pane.as_ref().and_then(|p| p.extra.get(AGENT_PIDS)).and_then(Value::as_array) else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|v| {
            let pid = v.get(0)?.as_i64().filter(|p| *p > 1 && *p <= i32::MAX as i64)? as i32;
            Some(pane::proc::Proc { pid, start: v.get(1)?.as_u64()? })
        })
        .collect()
}

/// A running session's agent as its row recorded it, judged from outside (issue 30, "faster
/// truth"): the recorded processes still alive when asked, and among them the agent CLIs.
#[derive(Debug, Clone)]
pub struct AgentLife {
    procs: Vec<pane::proc::Proc>,
    clis: Vec<pane::proc::Proc>,
    /// The adapter runs the agent's commands in their own PID namespace (a timer armed from inside
    /// cannot watch the agent).
    pub sandboxed: bool,
}

impl AgentLife {
    /// The row's agent as it runs now; `None` when nothing it recorded still lives (an agent that
    /// restarted itself, a row from before agent pids were recorded): then nothing is judged.
    pub fn of(row: &Row) -> Option<AgentLife> {
        let procs: Vec<pane::proc::Proc> = recorded_procs(row).into_iter().filter(|p| p.alive()).collect();
        if procs.is_empty() {
            return None;
        }
        let clis = procs
            .iter()
            .copied()
            .filter(|p| sys::proc_cmdline(p.pid).is_ok_and(|a| agents::argv_is_agent(&a)))
            .collect();
        let sandboxed = agents::adapter(&row.agent).is_some_and(|a| a.commands_in_own_pid_namespace);
        Some(AgentLife { procs, clis, sandboxed })
    }

    /// The process a timer watches for this agent: the outermost agent CLI, else the first recorded.
    pub fn pid(&self) -> i32 {
        self.clis.first().or(self.procs.first()).map_or(0, |p| p.pid)
    }

    /// When the agent is gone: every agent CLI it ran has ended (or, with none recognised, every
    /// process recorded for it), naming the pid that was watched.
    pub fn gone(&self) -> Option<i32> {
        let ended = |ps: &[pane::proc::Proc]| !ps.is_empty() && ps.iter().all(|p| !p.alive());
        (ended(&self.clis) || ended(&self.procs)).then(|| self.pid())
    }
}

/// `<agent>-NN`: the lowest two-digit suffix no row uses (2.1, decided).
pub fn default_name(doc: &Sessions, kind: &str) -> Option<String> {
    (1..=99).map(|n| format!("{kind}-{n:02}")).find(|n| doc.row(n).is_none())
}

/// The bare agent command for `pane.cmd_full`/`start_command`: the kind and its arguments, quoted.
pub fn command_line(kind: &str, args: &[String]) -> String {
    let mut s = kind.to_string();
    for a in args {
        s.push(' ');
        let plain = !a.is_empty() && a.bytes().all(|c| c.is_ascii_alphanumeric() || b"_./:=@%+,-".contains(&c));
        if plain {
            s.push_str(a);
        } else {
            s.push_str(&crate::text::shell_quote(a));
        }
    }
    s
}

// ---------------------------------------------------------------------------------------------
// Binding (0.1, 2.3 steps 2-4)

/// The binding as persisted: all four paths as UTF-8 strings. Fails when a path cannot be recorded
/// in JSON (not UTF-8) or travel as one `--env` value (a control character).
pub fn binding_of(r: &Resolved) -> Result<ControlPlane, String> {
    let mut cp = ControlPlane::default();
    for ((var, p), slot) in r.binding().into_iter().zip(cp.slots()) {
        let s = p.to_str().ok_or_else(|| format!("{var} path {} is not UTF-8", show_path(p)))?;
        if s.chars().any(char::is_control) {
            return Err(format!("{var} path {} contains a control character", show_path(p)));
        }
        *slot = Some(s.to_string());
    }
    Ok(cp)
}

/// The caller's binding B.
pub fn caller_binding(ctx: &Ctx) -> Result<ControlPlane, String> {
    binding_of(&paths::resolve(ctx, None).map_err(|e| e.to_string())?)
}

/// The implied binding I of 2.3 step 3: what 0.2 yields for a process started in `w` with none of
/// the four variables set. `None` when even that cannot be recorded.
pub fn implied_binding(ctx: &Ctx, w: &Path) -> Option<ControlPlane> {
    let env = ctx.child_env_for(ChildRole::Agent).into_iter().filter(|(k, _)| !BINDING_VARS.iter().any(|v| k == v));
    let sub = Ctx::with_env(env, w);
    binding_of(&paths::resolve(&sub, None).ok()?).ok()
}

/// The forwarding decision (2.3 steps 3-4): `Ok(None)` when `b` is what `w` implies anyway,
/// `Ok(Some(env))` with all four when any differs, `Err` when a forwarded value has whitespace.
pub fn forward_env(ctx: &Ctx, b: &ControlPlane, w: &Path) -> Result<Option<Vec<(String, String)>>, String> {
    let implied = implied_binding(ctx, w);
    if implied.as_ref().is_some_and(|i| i.values() == b.values()) {
        return Ok(None);
    }
    let env = b.env();
    if let Some((k, v)) = env.iter().find(|(_, v)| v.chars().any(char::is_whitespace)) {
        return Err(format!("the binding must be forwarded to the pane but {k}={} contains whitespace", one_line(v)));
    }
    Ok(Some(env))
}

/// Same directory, compared canonically (1.5 step 2).
pub fn same_dir(a: &Path, b: &Path) -> bool {
    pane::canon(a) == pane::canon(b)
}

// ---------------------------------------------------------------------------------------------
// Verified rollback (2.3)

/// Closes the pane the agent was started in (the workspace only when this attempt created it),
/// removes the row when `sessions` names the file it was written to, then lists again. Returns the
/// leftovers (empty: confirmed gone).
pub fn verified_rollback(b: &dyn Backend, p: &Placed, name: &str, cwd: &Path, sessions: Option<&Path>) -> Vec<String> {
    let mut left = Vec::new();
    let closed = if p.created_workspace { b.close_workspace(&p.workspace) } else { b.close_pane(&p.pane) };
    if let Err(e) = closed {
        left.push(format!("close failed: {e}"));
    }
    if let Some(file) = sessions {
        let removed = update(file, |doc| {
            doc.herdr_sessions.retain(|r| !(r.name == name && r.pane_id() == Some(p.pane.as_str())));
            Ok(())
        });
        if let Err(e) = removed {
            left.push(format!("row {name} ({e})"));
        }
    }
    match b.list_agents() {
        ListOutcome::Confirmed(list) if list.iter().any(|a| a.name == name) => left.push(format!("agent {name}")),
        ListOutcome::Unknown(d) => left.push(format!("agent {name}? (state unknown: {d})")),
        _ => {}
    }
    match b.list_workspaces(cwd) {
        Ok(wss) => {
            for ws in &wss {
                if ws.panes.iter().any(|q| q.id == p.pane) {
                    left.push(format!("pane {}", p.pane));
                }
                if p.created_workspace && ws.id == p.workspace {
                    left.push(format!("workspace {}", p.workspace));
                }
            }
        }
        Err(e) => left.push(format!("pane {}? ({e})", p.pane)),
    }
    left
}

/// The tail of a failure line after a rollback.
pub fn rollback_text(left: &[String]) -> String {
    if left.is_empty() {
        "rolled back (confirmed: nothing left)".into()
    } else {
        format!("rollback incomplete, left: {}", left.join(", "))
    }
}

// ---------------------------------------------------------------------------------------------
// Children of this binary (daemon ensure, monitor, purge)

/// A finished child of the current binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildOut {
    pub rc: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `mam <args>` (this very binary) with the context's environment, within `limit`. Output goes
/// through temp files, not pipes, so a daemon the child leaves behind cannot hold us up.
pub fn run_self(ctx: &Ctx, role: ChildRole, args: &[&str], limit: Duration) -> Result<ChildOut, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the mam binary: {e}"))?;
    let tmp = ctx.path_var("TMPDIR").unwrap_or_else(|| PathBuf::from("/tmp"));
    let tag = sys::random_hex(8).map_err(|e| format!("random: {e}"))?;
    let out_p = tmp.join(format!(".mam-child-{tag}.out"));
    let err_p = tmp.join(format!(".mam-child-{tag}.err"));
    let open = |p: &Path| sys::create_new(p).map_err(|e| format!("cannot create {}: {e}", show_path(p)));
    let (out_f, err_f) = (open(&out_p)?, open(&err_p)?);
    let mut c = Command::new(&exe);
    c.args(args).env_clear().envs(ctx.child_env_for(role)).current_dir(ctx.cwd());
    c.stdin(Stdio::null()).stdout(out_f).stderr(err_f);
    let what = format!("mam {}", args.first().copied().unwrap_or(""));
    let res = (|| {
        let mut child = sys::spawn(&mut c).map_err(|e| format!("cannot run {what}: {e}"))?;
        let deadline = Instant::now() + limit;
        loop {
            match child.try_wait() {
                Ok(Some(st)) => return Ok(st.code().unwrap_or(1)),
                Ok(None) if Instant::now() >= deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!("{what}: timed out after {} ms", limit.as_millis()));
                }
                Ok(None) => sys::sleep(Duration::from_millis(5)),
                Err(e) => return Err(format!("{what}: wait failed: {e}")),
            }
        }
    })();
    let stdout = fs::read_to_string(&out_p).unwrap_or_default();
    let stderr = fs::read_to_string(&err_p).unwrap_or_default();
    let _ = fs::remove_file(&out_p);
    let _ = fs::remove_file(&err_p);
    Ok(ChildOut { rc: res?, stdout, stderr })
}

/// How long `mam daemon ensure` may take.
const DAEMON_ENSURE_LIMIT: Duration = Duration::from_secs(30);

/// 2.3 step 7 (A26): make sure the control root's daemon runs, via `mam daemon ensure --workspace
/// <root>`. Returns the `DAEMON_PID=` line to print, if any. A failing ensure is a WARNING, never a
/// failure of the session command.
pub fn ensure_daemon(ctx: &Ctx, root: &Path, notes: &mut Notes) -> Option<String> {
    let root_s = root.to_string_lossy().into_owned();
    match run_self(ctx, ChildRole::BrokerClient, &["daemon", "ensure", "--workspace", &root_s], DAEMON_ENSURE_LIMIT) {
        Ok(out) => {
            let (pid, lines) = daemon_relay(&out, root);
            for l in lines {
                notes.raw(l);
            }
            pid
        }
        Err(e) => {
            notes.warn(format!("daemon for {} not ensured: {e}", show_path(root)));
            None
        }
    }
}

/// What of a `daemon ensure` child reaches our output: the pid it prints (CORE 10.1: a bare pid line)
/// as our `DAEMON_PID=<pid>` line and, on success, its diagnostics (under the opt-out, its one NOTE);
/// on failure one WARNING naming the last line.
pub fn daemon_relay(out: &ChildOut, root: &Path) -> (Option<String>, Vec<String>) {
    let pid = out
        .stdout
        .lines()
        .map(str::trim)
        .find_map(|l| l.parse::<u32>().ok().filter(|p| *p > 1))
        .map(|p| format!("DAEMON_PID={p}"));
    if out.rc == 0 {
        let lines = out.stderr.lines().filter(|l| !l.trim().is_empty()).map(str::to_string).collect();
        return (pid, lines);
    }
    let last = out.stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim();
    let warning = format!(
        "WARNING: daemon for {} not ensured (mam daemon ensure exit {}: {})",
        show_path(root),
        out.rc,
        one_line(last)
    );
    (pid, vec![warning])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_survive_and_defaults_apply() {
        let src = br#"{"version": 1, "herdr_sessions": [{"name": "a", "zz": [1], "pane": {"id": "p", "q": true}}],
            "orchestrator_uuids": [], "top": "kept"}"#;
        let doc = Sessions::parse(Path::new("f"), src).unwrap();
        let r = doc.row("a").unwrap();
        assert_eq!(r.transport, "local");
        assert_eq!(r.extra["zz"], serde_json::json!([1]));
        let back: Value = serde_json::from_slice(&doc.to_bytes()).unwrap();
        assert_eq!(back["top"], "kept");
        assert_eq!(back["herdr_sessions"][0]["pane"]["q"], true);
        assert_eq!(back["herdr_sessions"][0]["zz"], serde_json::json!([1]));
    }

    #[test]
    fn not_json_is_named() {
        for bad in [&b"herdr_sessions:\n  - name: a\n"[..], b"[1]", b"{\"herdr_sessions\": 3}"] {
            let e = Sessions::parse(Path::new("/x/s.json"), bad).unwrap_err();
            let f = crate::cli::session_failure("status", &e);
            assert_eq!(f.rc, 2);
            assert!(f.line.starts_with("REFUSED: status: /x/s.json is not a JSON sessions file"), "{}", f.line);
            assert!(f.line.ends_with("`mam session import-yaml`"), "{}", f.line);
        }
        assert_eq!(Sessions::parse(Path::new("f"), b" \n").unwrap(), Sessions::default());
    }

    #[test]
    fn default_name_takes_the_lowest_free_suffix() {
        let mut doc = Sessions::default();
        assert_eq!(default_name(&doc, "claude").unwrap(), "claude-01");
        for n in ["claude-01", "claude-03"] {
            doc.herdr_sessions.push(Row { name: n.into(), ..Row::default() });
        }
        assert_eq!(default_name(&doc, "claude").unwrap(), "claude-02");
    }

    #[test]
    fn fill_missing_never_overwrites() {
        let mut row = ControlPlane { mam_jobs_dir: Some("/row/jobs".into()), ..ControlPlane::default() };
        let caller = ControlPlane {
            workspace_root: Some("/c".into()),
            agent_sessions_yaml: Some("/c/s.json".into()),
            mam_jobs_dir: Some("/c/jobs".into()),
            delegate_job_logs_dir: Some("/c/logs".into()),
            extra: Map::new(),
        };
        row.fill_missing(&caller);
        assert_eq!(row.values(), [Some("/c"), Some("/c/s.json"), Some("/row/jobs"), Some("/c/logs")]);
        assert_eq!(row.env().len(), 4);
        assert_eq!(row.env()[0], ("WORKSPACE_ROOT".to_string(), "/c".to_string()));
    }

    #[test]
    fn daemon_relay_passes_the_pid_and_warns_on_failure() {
        // `mam daemon ensure` prints the bare pid (CORE 10.1).
        let ok = ChildOut { rc: 0, stdout: "42\n".into(), stderr: String::new() };
        assert_eq!(daemon_relay(&ok, Path::new("/w")), (Some("DAEMON_PID=42".into()), vec![]));
        let opt_out = ChildOut { rc: 0, stdout: String::new(), stderr: "NOTE: opted out\n".into() };
        assert_eq!(daemon_relay(&opt_out, Path::new("/w")), (None, vec!["NOTE: opted out".to_string()]));
        let bad = ChildOut { rc: 2, stdout: String::new(), stderr: "ERROR: mam daemon: not yet available\n".into() };
        let (pid, lines) = daemon_relay(&bad, Path::new("/w"));
        assert_eq!(pid, None);
        assert_eq!(lines.len(), 1);
        assert!(lines[0].starts_with("WARNING: daemon for /w not ensured (mam daemon ensure exit 2: ERROR:"));
    }

    #[test]
    fn forwarding_is_all_or_none_and_refuses_whitespace() {
        let base = std::env::temp_dir().join(format!("mam-fwd-{}", sys::random_hex(6).unwrap()));
        let root = base.join("root");
        let wt = base.join("wt");
        fs::create_dir_all(root.join(".mam")).unwrap();
        fs::create_dir_all(&wt).unwrap();
        fs::write(wt.join(".git"), "gitdir: x\n").unwrap();
        let ctx = |vars: Vec<(&str, PathBuf)>| Ctx::with_env(vars, &root);
        // From the control root with nothing set: what W implies anyway.
        let c = ctx(vec![]);
        let b = caller_binding(&c).unwrap();
        assert_eq!(forward_env(&c, &b, &root).unwrap(), None);
        // A worktree implies itself as the control root: all four are forwarded.
        let env = forward_env(&c, &b, &wt).unwrap().unwrap();
        assert_eq!(env.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), BINDING_VARS);
        assert_eq!(env[0].1, root.to_str().unwrap());
        // One differing variable forwards all four; whitespace in any forwarded value is refused.
        let c = ctx(vec![("MAM_JOBS_DIR", base.join("jobs"))]);
        let b = caller_binding(&c).unwrap();
        assert_eq!(forward_env(&c, &b, &root).unwrap().unwrap().len(), 4);
        let c = ctx(vec![("DELEGATE_JOB_LOGS_DIR", base.join("a b"))]);
        let b = caller_binding(&c).unwrap();
        assert!(forward_env(&c, &b, &root).unwrap_err().contains("DELEGATE_JOB_LOGS_DIR="));
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn lock_path_appends_lock() {
        assert_eq!(lock_path(Path::new("/a/s.json")), PathBuf::from("/a/s.json.lock"));
    }

    #[test]
    fn command_line_is_bare_and_quoted() {
        assert_eq!(command_line("claude", &["--model".into(), "a b".into()]), "claude --model 'a b'");
        assert_eq!(command_line("codex", &[]), "codex");
    }
}
