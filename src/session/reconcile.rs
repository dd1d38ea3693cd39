//! One-shot reconcile (ORCH 2.7): under MAM_NO_AUTOSTART=1, list every server the running local rows
//! name; `Confirmed` or `NoServer` turns a running row whose agent is not listed into `exited`
//! (drift A) and sets `herdr_confirmed=true`; `Unknown` changes no status and sets
//! `herdr_confirmed=false`.
//!
//! The listing happens without the sessions lock (it spawns backend processes); the rows are then
//! changed under the lock only when the same incarnation is still there, so a session created or
//! resumed meanwhile is never marked exited by a list taken before it existed. Never prints.
//!
//! `mam reconcile` without `--subscribe` (src/cmd/reconcile.rs) prints `lines()` and exits with
//! `rc()` (0, or 3 when a server's state was unknown; a sessions file that is not JSON is rc 2).

use std::collections::BTreeMap;

use super::{load, update, Row, SessionError};
use crate::clock;
use crate::ctx::Ctx;
use crate::pane::{self, ListOutcome};
use crate::paths;

/// What one server's list said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerState {
    /// Confirmed list or no server: the names listed (empty for no server).
    Listed(Vec<String>),
    /// The state is unknown; the diagnostic says why.
    Unknown(String),
}

/// One server referenced by rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerReport {
    pub backend: String,
    pub server: String,
    pub state: ServerState,
}

/// The result of one reconcile.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reconciled {
    pub servers: Vec<ServerReport>,
    /// Rows turned `exited` (drift A).
    pub exited: Vec<String>,
}

impl Reconciled {
    /// Exit code: 0, or 3 when some server's state was unknown.
    pub fn rc(&self) -> i32 {
        if self.any_unknown() {
            3
        } else {
            0
        }
    }

    pub fn any_unknown(&self) -> bool {
        self.servers.iter().any(|s| matches!(s.state, ServerState::Unknown(_)))
    }

    /// Stdout lines: one per server, then one per exited row.
    pub fn lines(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .servers
            .iter()
            .map(|s| match &s.state {
                ServerState::Listed(names) => {
                    format!("server {}/{}: confirmed, {} agent(s) listed", s.backend, s.server, names.len())
                }
                ServerState::Unknown(d) => {
                    format!("server {}/{}: state unknown ({}); rows unchanged", s.backend, s.server, d)
                }
            })
            .collect();
        out.extend(self.changes());
        out
    }

    /// One line per row that changed status.
    pub fn changes(&self) -> Vec<String> {
        self.exited.iter().map(|n| format!("session {n}: running -> exited (agent not listed)")).collect()
    }
}

/// The backend and server a row's later calls address.
pub fn row_target(ctx: &Ctx, r: &Row) -> Option<(String, String)> {
    let backend = match &r.backend {
        Some(b) => b.clone(),
        None => pane::backend_name(ctx).ok()?.to_string(),
    };
    let server = match r.server() {
        Some(s) => s.to_string(),
        None => pane::open_named(ctx, &backend, None).ok()?.server(),
    };
    Some((backend, server))
}

/// Lists `(backend, server)` under MAM_NO_AUTOSTART=1 (set on the given context by the caller).
pub fn list_server(ctx: &Ctx, backend: &str, server: &str) -> ServerState {
    match list_server_agents(ctx, backend, server) {
        Ok(list) => ServerState::Listed(list.into_iter().map(|a| a.name).collect()),
        Err(d) => ServerState::Unknown(d),
    }
}

/// The agents a server lists with the state the backend knows for each (herdr's own status, tmux's
/// read from the screen); no server is an empty list, an unknown state the diagnostic.
pub fn list_server_agents(ctx: &Ctx, backend: &str, server: &str) -> Result<Vec<pane::Agent>, String> {
    let b = pane::open_named(ctx, backend, Some(server)).map_err(|e| e.to_string())?;
    match b.list_agents() {
        ListOutcome::Confirmed(list) => Ok(list),
        ListOutcome::NoServer => Ok(Vec::new()),
        ListOutcome::Unknown(d) => Err(d),
    }
}

/// 2.7 against the sessions file `paths::resolve(ctx)` names. Sets MAM_NO_AUTOSTART=1 for itself.
pub fn reconcile_once(ctx: &Ctx) -> Result<Reconciled, SessionError> {
    let mut ctx = ctx.clone();
    ctx.set_var("MAM_NO_AUTOSTART", Some("1".as_ref()));
    let file = paths::resolve(&ctx, None)?.sessions;
    let doc = load(&file)?;
    // Server -> incarnations of the running local rows on it.
    let mut groups: BTreeMap<(String, String), Vec<Row>> = BTreeMap::new();
    for r in doc.herdr_sessions.iter().filter(|r| r.running() && !r.remote()) {
        if let Some(t) = row_target(&ctx, r) {
            groups.entry(t).or_default().push(r.clone());
        }
    }
    let mut report = Reconciled::default();
    let mut verdicts = Vec::new();
    for ((backend, server), rows) in groups {
        let state = list_server(&ctx, &backend, &server);
        verdicts.push((state.clone(), rows));
        report.servers.push(ServerReport { backend, server, state });
    }
    if verdicts.is_empty() {
        return Ok(report);
    }
    let now = clock::now_ts();
    let exited = update(&file, |doc| {
        let mut exited = Vec::new();
        for (state, rows) in &verdicts {
            for seen in rows {
                let Some(r) = doc.row_mut(&seen.name) else { continue };
                if r.incarnation() != seen.incarnation() || !r.running() {
                    continue;
                }
                match state {
                    ServerState::Listed(names) => {
                        if !names.contains(&r.name) {
                            r.status = "exited".into();
                            exited.push(r.name.clone());
                        }
                        r.herdr_confirmed = Some(true);
                    }
                    ServerState::Unknown(_) => r.herdr_confirmed = Some(false),
                }
                r.last_reconciled_at = Some(now.clone());
            }
        }
        Ok(exited)
    })?;
    report.exited = exited;
    Ok(report)
}
