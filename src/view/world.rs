//! What `mam ui` shows, assembled (issue 22): the job rows in screen order, each session with its
//! pane, agent state and open job, each loop with its phase, round, reviewers' verdicts and what it
//! promoted, and the broker connection. A pure function of what `view::scan` read, what the pane
//! lister found (`Panes`) and the bus state, so it is tested without files or servers.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::ctx::Ctx;
use crate::joblog::Waiting;
use crate::pane::{Agent, Status};
use crate::review::admin;
use crate::review::checkpoint::Checkpoint;
use crate::session::{self, Sessions};
use crate::view::jobs::Row;

/// What the pane lister found per (backend, server): the agents it lists, or why it could not tell.
pub type Panes = BTreeMap<(String, String), Result<Vec<Agent>, String>>;

/// The (backend, server) of each running local session (`session::reconcile::row_target`).
pub fn targets(ctx: &Ctx, doc: &Sessions) -> BTreeMap<String, (String, String)> {
    crate::sort::ordered(
        doc.herdr_sessions
            .iter()
            .filter(|r| r.running() && !r.remote())
            .filter_map(|r| Some((r.name.clone(), session::reconcile::row_target(ctx, r)?))),
    )
}

/// One session row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionView {
    pub name: String,
    pub agent: String,
    /// tmux, herdr, fake, remote, or `?` when it cannot be told.
    pub backend: String,
    pub server: String,
    pub pane: String,
    /// working, idle, waiting, done, unknown (the backend cannot tell), gone (not listed), stopped
    /// (the row is not running), remote, or `...` before the first listing.
    pub state: String,
    /// The newest open job addressed to it, with its status and claim (else registration) time.
    pub job: Option<(String, String, Option<u64>)>,
    /// Its newest job, open or not (for the report and events keys).
    pub last_job: Option<String>,
}

/// One loop row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopView {
    pub id: String,
    /// running, stopped (its process is gone without an outcome), or the outcome.
    pub state: String,
    pub finished: bool,
    pub phase: String,
    pub round: u32,
    pub max_rounds: u32,
    pub creator: String,
    /// (session, verdict) of the newest round's reviewers (`pending` while a job runs); the
    /// configured reviewers with `-` before any round.
    pub reviewers: Vec<(String, String)>,
    /// The promoted reports, as recorded.
    pub promoted: Vec<String>,
    /// Its newest delegation's job (for the report and events keys).
    pub job: Option<String>,
    /// The loop's own record (the creator's loop job).
    pub loop_job: String,
}

/// The broker connection of the screen's bus reader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bus {
    /// The broker settings are not usable (the reason).
    Unconfigured(String),
    Connecting(String),
    Connected(String),
    /// Not connected: the address and why; it is tried again.
    Down(String, String),
}

/// The whole screen's data.
#[derive(Debug, Clone, PartialEq)]
pub struct World {
    pub registry: PathBuf,
    pub sessions_file: PathBuf,
    /// Live jobs oldest first, then finished ones newest first.
    pub jobs: Vec<Row>,
    pub sessions: Vec<SessionView>,
    pub loops: Vec<LoopView>,
    pub bus: Bus,
    /// Things that could not be read (the sessions file, records), one line each.
    pub problems: Vec<String>,
    /// The open jobs whose agent waits for a person, as the daemon's board saw it (issue 30).
    pub waiting: BTreeMap<String, Waiting>,
}

/// Live jobs first (oldest first), then finished ones (most recently finished first).
pub fn order_jobs(rows: &mut [Row]) {
    crate::sort::by(rows, |a, b| match (a.finished(), b.finished()) {
        (false, true) => std::cmp::Ordering::Less,
        (true, false) => std::cmp::Ordering::Greater,
        (false, false) => (a.created_at(), a.job_id()).cmp(&(b.created_at(), b.job_id())),
        (true, true) => {
            (b.finished_ms.get(), b.created_at(), b.job_id()).cmp(&(a.finished_ms.get(), a.created_at(), a.job_id()))
        }
    });
}

/// The agent state word of a listed agent (the words: working, idle, waiting, gone), its
/// session's open job (its status) deciding when the backend's reading says nothing
/// (`Status::or_from_open_job`).
pub fn state_word(status: &str, open_job: Option<&str>) -> &'static str {
    match Status::parse(status).or_from_open_job(open_job) {
        Status::Blocked => "waiting",
        Status::Absent => "gone",
        s => s.word(),
    }
}

/// The session rows: from the document, the targets, the lister's findings and the job rows.
pub fn sessions(
    doc: &Sessions,
    targets: &BTreeMap<String, (String, String)>,
    panes: &Panes,
    jobs: &[Row],
) -> Vec<SessionView> {
    doc.herdr_sessions
        .iter()
        .map(|r| {
            let (backend, server) = if r.remote() {
                ("remote".to_string(), "-".to_string())
            } else {
                match targets.get(&r.name) {
                    Some((b, s)) => (b.clone(), s.clone()),
                    None => (r.backend.clone().unwrap_or_else(|| "?".into()), r.server().unwrap_or("?").to_string()),
                }
            };
            let mine: Vec<&Row> = jobs.iter().filter(|j| j.session() == r.name).collect();
            let key = |j: &&&Row| (j.created_at().to_string(), j.job_id().to_string());
            let open = mine.iter().filter(|j| !j.finished()).max_by_key(key).copied();
            let last = mine.iter().max_by_key(key).copied();
            let state = if r.remote() {
                "remote".to_string()
            } else if !r.running() {
                if r.status.is_empty() {
                    "-".to_string()
                } else {
                    r.status.clone()
                }
            } else if !targets.contains_key(&r.name) {
                "unknown".to_string()
            } else {
                match panes.get(&(backend.clone(), server.clone())) {
                    None => "...".to_string(),
                    Some(Err(_)) => "unknown".to_string(),
                    Some(Ok(list)) => match list.iter().find(|a| a.name == r.name) {
                        Some(a) => state_word(&a.status, open.map(|j| j.status())).to_string(),
                        None => "gone".to_string(),
                    },
                }
            };
            SessionView {
                name: r.name.clone(),
                agent: r.agent.clone(),
                backend,
                server,
                pane: r.pane_id().unwrap_or("-").to_string(),
                state,
                job: open.map(|j| (j.job_id().to_string(), j.status().to_string(), j.started_ms.get())),
                last_job: last.map(|j| j.job_id().to_string()),
            }
        })
        .collect()
}

/// One loop's row. `alive` says whether a process still runs it (see `loop_alive`).
pub fn loop_view(cp: &Checkpoint, alive: bool) -> LoopView {
    let (state, finished) = match &cp.outcome {
        Some(o) => (o.clone(), true),
        None if alive => ("running".to_string(), false),
        None => ("stopped".to_string(), true),
    };
    let reviewers = match cp.review_rounds.last() {
        Some(r) if !r.reviewers.is_empty() => r
            .reviewers
            .iter()
            .map(|x| (x.session.clone(), x.verdict.clone().unwrap_or_else(|| "pending".into())))
            .collect(),
        _ => cp.reviewers.iter().map(|s| (s.clone(), "-".to_string())).collect(),
    };
    LoopView {
        id: cp.loop_id.clone(),
        state,
        finished,
        phase: cp.phase.clone(),
        round: cp.round,
        max_rounds: cp.max_rounds,
        creator: cp.creator.clone(),
        reviewers,
        promoted: cp.promoted.clone(),
        job: cp.jobs.last().map(|j| j.jid.clone()),
        loop_job: cp.creator_jid.clone(),
    }
}

/// Whether a loop without an outcome is still run by a process: its creator's lock file names it
/// and the pid of its checkpoint lives. Unlike `mam loop status` this takes no lock (a screen that
/// looks every few seconds must never make a loop's own try-lock fail).
pub fn loop_alive(control: &Path, cp: &Checkpoint) -> bool {
    if cp.outcome.is_some() {
        return false;
    }
    let lock = admin::loop_root(control).join(format!("{}.lock", cp.creator));
    let holder = std::fs::read_to_string(&lock).unwrap_or_default();
    holder.trim() == cp.loop_id && i32::try_from(cp.pid).is_ok_and(|p| p > 1 && crate::sys::process_exists(p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::Row as SRow;

    fn job(id: &str, session: &str, status: &str, created: &str, finished: Option<u64>) -> Row {
        let mut r = Row::new(id, status, session, created);
        r.attempt = Some(1);
        r.started_ms = Some(0).into();
        r.finished_ms = finished.into();
        r.idle_ms = 1000;
        r
    }

    #[test]
    fn live_jobs_first_then_the_newest_finished() {
        let mut v = vec![
            job("a", "w", "completed", "1", Some(5)),
            job("b", "w", "running", "2", None),
            job("c", "w", "failed", "3", Some(9)),
            job("d", "w", "pending", "0", None),
        ];
        order_jobs(&mut v);
        let ids: Vec<&str> = v.iter().map(|r| r.job_id()).collect();
        assert_eq!(ids, ["d", "b", "c", "a"]);
    }

    #[test]
    fn session_state_and_open_job() {
        let mut doc = Sessions::default();
        for (name, status) in [("w1", "running"), ("w2", "running"), ("w3", "stopped"), ("w4", "running")] {
            doc.herdr_sessions.push(SRow {
                name: name.into(),
                agent: "claude".into(),
                status: status.into(),
                transport: "local".into(),
                ..Default::default()
            });
        }
        let t = |n: &str| (n.to_string(), ("tmux".to_string(), "mam".to_string()));
        let targets: BTreeMap<_, _> = [t("w1"), t("w2")].into_iter().collect();
        let mut panes = Panes::new();
        let agent =
            |n: &str, s: &str| Agent { name: n.into(), pane: "%1".into(), kind: "claude".into(), status: s.into() };
        panes.insert(("tmux".into(), "mam".into()), Ok(vec![agent("w1", "blocked")]));
        let jobs = vec![job("j1", "w1", "completed", "1", Some(1)), job("j2", "w1", "running", "2", None)];
        let v = sessions(&doc, &targets, &panes, &jobs);
        assert_eq!(v[0].state, "waiting");
        assert_eq!(v[0].job.as_ref().map(|j| j.0.as_str()), Some("j2"));
        assert_eq!(v[0].last_job.as_deref(), Some("j2"));
        assert_eq!(v[1].state, "gone", "listed server, agent not there");
        assert_eq!(v[2].state, "stopped");
        assert_eq!(v[3].state, "unknown", "no pane server known");
        panes.clear();
        assert_eq!(sessions(&doc, &targets, &panes, &jobs)[0].state, "...", "no listing yet");
    }
}
