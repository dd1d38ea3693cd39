//! `status` (ORCH 2.6): per row its name, agent, backend/server, pane, cwd, liveness
//! (`running`/`gone`/`unknown`), conversation id and open jobs. Runs under MAM_NO_AUTOSTART=1 and
//! needs no broker. Job lookup order: `MAM_JOBS_DIR`, the row's registry (and for the onboarding job
//! its audit-log mirror), `$WORKSPACE_ROOT/.mam/jobs`, the resolver's default; the first registry
//! holding a job wins. Never prints; never writes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde_json::{json, Value};

use super::reconcile::{list_server_agents, row_target};
use super::{load, Row, SessionError};
use crate::ctx::Ctx;
use crate::joblog;
use crate::paths;
use crate::registry::{
    audit, is_terminal,
    record::{Fields, Picked},
    store::Store,
};
use crate::sys;

/// One job shown with a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobLine {
    pub id: String,
    /// The record's `created_at` (the order jobs are shown in: oldest first).
    pub created_at: String,
    pub job_type: String,
    pub status: String,
    pub registry: PathBuf,
    /// An open job whose agent waits for a person, as the workspace daemon's board saw it
    /// (`waiting for you: approve Bash command: touch x?`, issue 30).
    pub waiting: Option<String>,
}

/// One row's state.
#[derive(Debug, Clone, PartialEq)]
pub struct RowStatus {
    pub row: Row,
    pub backend: String,
    pub server: String,
    pub liveness: &'static str,
    /// The agent's state as its backend knows it (working, idle, done, blocked, unknown), `gone`
    /// when it is not listed, `unknown` when the server's state is.
    pub state: String,
    pub jobs: Vec<JobLine>,
}

/// The whole report.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    pub rows: Vec<RowStatus>,
    pub any_unknown: bool,
}

impl Report {
    /// 0, or 3 when some server's state was unknown (output still printed).
    pub fn rc(&self) -> i32 {
        if self.any_unknown {
            3
        } else {
            0
        }
    }

    /// Text: one line per row (`name agent backend/server pane cwd liveness conversation status`,
    /// tab separated, `-` when unknown), then one indented line per job.
    pub fn lines(&self) -> Vec<String> {
        let dash = |s: Option<&str>| s.filter(|s| !s.is_empty()).unwrap_or("-").to_string();
        let mut out = Vec::new();
        for r in &self.rows {
            out.push(
                [
                    r.row.name.clone(),
                    dash(Some(&r.row.agent)),
                    format!("{}/{}", r.backend, r.server),
                    dash(r.row.pane_id()),
                    dash(r.row.cwd()),
                    r.liveness.to_string(),
                    r.state.clone(),
                    dash(r.row.conversation_id.as_deref()),
                    dash(Some(&r.row.status)),
                ]
                .join("\t"),
            );
            for j in &r.jobs {
                match &j.waiting {
                    Some(w) => out.push(format!("  job {} {} {} ({w})", j.id, j.job_type, j.status)),
                    None => out.push(format!("  job {} {} {}", j.id, j.job_type, j.status)),
                }
            }
        }
        out
    }

    pub fn json(&self) -> Value {
        Value::Array(
            self.rows
                .iter()
                .map(|r| {
                    json!({
                        "name": r.row.name,
                        "agent": r.row.agent,
                        "status": r.row.status,
                        "backend": r.backend,
                        "server": r.server,
                        "pane": r.row.pane_id(),
                        "cwd": r.row.cwd(),
                        "liveness": r.liveness,
                        "state": r.state,
                        "conversation_id": r.row.conversation_id,
                        "jobs": r.jobs.iter().map(|j| json!({
                            "job_id": j.id, "type": j.job_type, "status": j.status,
                            "registry": j.registry.to_string_lossy(), "waiting": j.waiting,
                        })).collect::<Vec<_>>(),
                    })
                })
                .collect(),
        )
    }
}

/// The registries of 2.6 for one row, in lookup order, without repeats.
fn registries(ctx: &Ctx, row: &Row) -> Vec<Store> {
    // The control root was checked when `status` resolved the sessions file (issue 12).
    let root = paths::find_control_root(ctx);
    let mut regs: Vec<PathBuf> = Vec::new();
    if let Some(env) = ctx.path_var("MAM_JOBS_DIR") {
        regs.push(sys::absolutize(&root, &env));
    }
    if let Some(r) = row.control_plane.as_ref().and_then(|c| c.mam_jobs_dir.as_ref()) {
        regs.push(PathBuf::from(r));
    }
    if let Some(ws) = ctx.path_var("WORKSPACE_ROOT") {
        regs.push(sys::absolutize(ctx.cwd(), &ws).join(".mam").join("jobs"));
    }
    regs.push(paths::resolve_unchecked(ctx, None).registry);
    let mut seen = BTreeSet::new();
    regs.retain(|r| seen.insert(r.clone()));
    let row_logs = row.control_plane.as_ref().and_then(|c| c.delegate_job_logs_dir.as_ref()).map(PathBuf::from);
    regs.into_iter()
        .map(|r| {
            let logs = match (&row_logs, row.control_plane.as_ref().and_then(|c| c.mam_jobs_dir.as_ref())) {
                (Some(l), Some(rr)) if r.as_path() == std::path::Path::new(rr) => l.clone(),
                _ => paths::logs_beside(&r),
            };
            Store::new(r, logs)
        })
        .collect()
}

/// One record as status needs it.
#[derive(Debug, Clone)]
struct Lite {
    id: String,
    created_at: String,
    session: Option<String>,
    status: String,
    job_type: String,
    attempt: Option<u64>,
}

/// The records of each registry that some row may show, read once per `status` run however many
/// rows share the registry (100 rows over 10,000 records would otherwise be a million record
/// reads). Only those are kept: an open job of a session in the report, its latest `LATEST`
/// finished ones (issue 32 item 6), or a row's onboarding job (a registry of 100,000 finished jobs
/// keeps `LATEST` per session).
type Cache = BTreeMap<PathBuf, Vec<Lite>>;

/// Which records `status` can show: the rows' names and onboarding jobs.
#[derive(Debug, Default)]
struct Wanted {
    names: BTreeSet<String>,
    onboarding: BTreeSet<String>,
}

impl Wanted {
    fn keeps(&self, id: &str, session: Option<&str>) -> bool {
        self.onboarding.contains(id) || session.is_some_and(|s| self.names.contains(s))
    }
}

/// Finished jobs shown per session besides its open ones (issue 32 item 6: a session's later jobs,
/// not only its onboarding job).
pub const LATEST: usize = 3;

/// `all` cut to what a row may show: every open job, the `LATEST` newest finished jobs of each
/// session, and the onboarding jobs.
fn latest(all: Vec<Lite>, wanted: &Wanted) -> Vec<Lite> {
    let mut finished: BTreeMap<&str, Vec<(&str, &str)>> = BTreeMap::new();
    for l in all.iter().filter(|l| is_terminal(&l.status)) {
        if let Some(s) = l.session.as_deref() {
            finished.entry(s).or_default().push((l.created_at.as_str(), l.id.as_str()));
        }
    }
    let mut keep: BTreeSet<String> = BTreeSet::new();
    for v in finished.values_mut() {
        crate::sort::by(v, |a, b| b.cmp(a));
        keep.extend(v.iter().take(LATEST).map(|(_, id)| id.to_string()));
    }
    all.into_iter()
        .filter(|l| !is_terminal(&l.status) || keep.contains(&l.id) || wanted.onboarding.contains(&l.id))
        .collect()
}

fn records<'c>(cache: &'c mut Cache, store: &Store, wanted: &Wanted) -> &'c [Lite] {
    cache.entry(store.registry.clone()).or_insert_with(|| {
        let parts = store.scan_records(crate::registry::store::listing_threads(), Vec::new, |out, e| {
            let Ok(rec) = e.bytes.map_err(drop).and_then(|b| Picked::parse(b, FIELDS).map_err(drop)) else {
                return;
            };
            if wanted.keeps(e.id, rec.str("agent_session")) {
                out.push(Lite {
                    created_at: rec.str("created_at").unwrap_or("").to_string(),
                    session: rec.str("agent_session").map(str::to_string),
                    status: rec.status().to_string(),
                    job_type: rec.str("type").unwrap_or("task").to_string(),
                    attempt: rec.u64("attempt"),
                    id: e.id.to_string(),
                });
            }
        });
        // The order does not matter: a registry holds one record per id.
        latest(parts.map(|p| p.into_iter().flatten().collect()).unwrap_or_default(), wanted)
    })
}

/// The fields `status` reads from a record.
const FIELDS: &[&str] = &["agent_session", "status", "type", "created_at", "attempt"];

/// The jobs shown for a row, oldest first: its open jobs, its latest finished ones, and its
/// onboarding job whatever its status.
fn jobs_of(ctx: &Ctx, row: &Row, cache: &mut Cache, wanted: &Wanted) -> Vec<JobLine> {
    let mut found: BTreeMap<String, JobLine> = BTreeMap::new();
    let stores = registries(ctx, row);
    let now_ms = crate::clock::now_ms();
    for store in &stores {
        for rec in records(cache, store, wanted) {
            if found.contains_key(&rec.id) {
                continue;
            }
            let onboarding = row.onboard_job.as_deref() == Some(rec.id.as_str());
            if rec.session.as_deref() != Some(row.name.as_str()) && !onboarding {
                continue;
            }
            found.insert(
                rec.id.clone(),
                JobLine {
                    id: rec.id.clone(),
                    created_at: rec.created_at.clone(),
                    job_type: rec.job_type.clone(),
                    status: rec.status.clone(),
                    registry: store.registry.clone(),
                    waiting: (!is_terminal(&rec.status))
                        .then(|| joblog::read_waiting(&store.registry, &rec.id, rec.attempt, now_ms))
                        .flatten()
                        .map(|w| w.text(now_ms)),
                },
            );
        }
    }
    // An onboarding job no registry holds any more: its audit-log mirror still tells its status.
    if let Some(j) = row.onboard_job.as_ref().filter(|j| !found.contains_key(*j)) {
        for store in &stores {
            let p = audit::job_dir(&store.logs, j).join("status.json");
            let Some(v) = std::fs::read(&p).ok().and_then(|b| serde_json::from_slice::<Value>(&b).ok()) else {
                continue;
            };
            let get = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            found.insert(
                j.clone(),
                JobLine {
                    id: j.clone(),
                    created_at: get("created_at"),
                    job_type: get("type"),
                    status: get("status"),
                    registry: store.registry.clone(),
                    waiting: None,
                },
            );
            break;
        }
    }
    let mut jobs: Vec<JobLine> = found.into_values().collect();
    crate::sort::by_key(&mut jobs, |j| (j.created_at.clone(), j.id.clone()));
    jobs
}

/// 2.6 for all rows, or for `only`. An unknown name is refused (rc 2).
pub fn status(ctx: &Ctx, only: Option<&str>) -> Result<Report, SessionError> {
    let mut ctx = ctx.clone();
    ctx.set_var("MAM_NO_AUTOSTART", Some("1".as_ref()));
    let file = paths::resolve(&ctx, None)?.sessions;
    let doc = load(&file)?;
    let rows: Vec<Row> = match only {
        Some(n) => vec![doc.row(n).cloned().ok_or_else(|| {
            SessionError::Refused(format!(
                "unknown session '{}' (no row in {})",
                crate::text::one_line(n),
                crate::text::show_path(&file)
            ))
        })?],
        None => doc.herdr_sessions.clone(),
    };
    let mut lists: BTreeMap<(String, String), Result<Vec<crate::pane::Agent>, String>> = BTreeMap::new();
    let mut report = Report::default();
    let mut cache = Cache::new();
    let wanted = Wanted {
        names: crate::sort::ordered(rows.iter().map(|r| r.name.clone())),
        onboarding: crate::sort::ordered(rows.iter().filter_map(|r| r.onboard_job.clone())),
    };
    for row in rows {
        let jobs = jobs_of(&ctx, &row, &mut cache, &wanted);
        let unknown = || ("unknown", "unknown".to_string());
        let (backend, server, (liveness, state)) = if row.remote() {
            ("remote".to_string(), "-".to_string(), unknown())
        } else {
            match row_target(&ctx, &row) {
                None => ("?".to_string(), "?".to_string(), unknown()),
                Some((backend, server)) => {
                    let listed = lists
                        .entry((backend.clone(), server.clone()))
                        .or_insert_with(|| list_server_agents(&ctx, &backend, &server));
                    let l = match listed {
                        Ok(list) => match list.iter().find(|a| a.name == row.name) {
                            Some(a) => {
                                let open = jobs.iter().rev().find(|j| !crate::registry::is_terminal(&j.status));
                                let seen = crate::pane::Status::parse(&a.status);
                                let state = seen.or_from_open_job(open.map(|j| j.status.as_str()));
                                ("running", state.word().to_string())
                            }
                            None => ("gone", "gone".to_string()),
                        },
                        Err(_) => {
                            report.any_unknown = true;
                            unknown()
                        }
                    };
                    (backend, server, l)
                }
            }
        };
        report.rows.push(RowStatus { row, backend, server, liveness, state, jobs });
    }
    Ok(report)
}
