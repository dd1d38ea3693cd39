//! `purge <agent|auto> <uuid>` (ORCH 6.4, A45-A47): validate the uuid, resolve the adapter (`auto`:
//! the one pinned layout with artifacts), check `conversation_in_use` on that adapter's paths,
//! delete sidecars, database, brain and annotation, check again, delete the presence lock last, and
//! walk for residuals. A refusal changes nothing.
//!
//! The one purge of mam: `mam agents purge`, `mam stop --purge-conversation` and `mam orc-onboard
//! --remove --purge-conversation` all call `purge`. Never prints: the report lists what was
//! removed and what is left.

use std::fmt;
use std::path::{Path, PathBuf};

use super::artifacts::{self, Plan};
use super::inuse::conversation_in_use;
use super::{adapter, canonical_uuid, Layout, ADAPTERS};
use crate::ctx::Ctx;
use crate::text::one_line_clipped;

/// Why a purge stopped before deleting anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PurgeError {
    /// rc 2: not a canonical uuid, an unknown kind, `auto` ambiguous, no HOME.
    Usage(String),
    /// rc 5: in use (the holder line), or no artifact.
    Refused(String),
}

impl PurgeError {
    pub fn rc(&self) -> i32 {
        match self {
            PurgeError::Usage(_) => 2,
            PurgeError::Refused(_) => 5,
        }
    }
}

impl fmt::Display for PurgeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PurgeError::Usage(m) | PurgeError::Refused(m) => f.write_str(m),
        }
    }
}

/// What a purge did. `residual` non-empty is exit 1.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub kind: &'static str,
    pub uuid: String,
    pub removed: Vec<PathBuf>,
    /// Paths still there, each with why (a removal error, kept while in use, a symlink, or found
    /// by the residual walk).
    pub residual: Vec<(PathBuf, String)>,
}

impl Report {
    pub fn rc(&self) -> i32 {
        if self.residual.is_empty() {
            0
        } else {
            1
        }
    }
}

/// The canonical form of `uuid` or the A45 usage error.
pub fn check_uuid(uuid: &str) -> Result<String, PurgeError> {
    canonical_uuid(uuid).ok_or_else(|| {
        PurgeError::Usage(format!("'{}' is not a canonical uuid (8-4-4-4-12 hex)", one_line_clipped(uuid)))
    })
}

fn home(ctx: &Ctx) -> Result<PathBuf, PurgeError> {
    ctx.path_var("HOME")
        .filter(|h| h.is_absolute())
        .ok_or_else(|| PurgeError::Usage("HOME is unset or not absolute; the agent roots are under it".into()))
}

/// The adapter a purge acts on: a named kind, or `auto` (6.4 resolver).
fn resolve(agent: &str, home: &Path, uuid: &str) -> Result<(&'static str, Layout, Plan), PurgeError> {
    if agent == "auto" {
        let found: Vec<(&'static str, Layout, Plan)> = ADAPTERS
            .iter()
            .filter_map(|a| artifacts::plan(a.layout, home, uuid).map(|p| (a.kind, a.layout, p)))
            .filter(|(_, _, p)| p.has_artifacts())
            .collect();
        return match found.len() {
            0 => Err(PurgeError::Refused(format!("no artifact for {uuid}"))),
            1 => Ok(found.into_iter().next().expect("one")),
            _ => Err(PurgeError::Usage(format!(
                "auto is ambiguous for {uuid}: artifacts of {} (pass the agent)",
                found.iter().map(|f| f.0).collect::<Vec<_>>().join(" and ")
            ))),
        };
    }
    let Some(a) = adapter(agent) else {
        return Err(PurgeError::Usage(format!(
            "unknown agent kind '{}' (known: {}, or auto)",
            one_line_clipped(agent),
            super::kinds().join(", ")
        )));
    };
    let Some(plan) = artifacts::plan(a.layout, home, uuid) else {
        return Err(PurgeError::Refused(format!("no artifact (purge not supported for {})", a.kind)));
    };
    if !plan.has_artifacts() {
        return Err(PurgeError::Refused(format!("no artifact for {uuid} ({})", a.kind)));
    }
    Ok((a.kind, a.layout, plan))
}

/// The files a holder check asks about: every existing artifact, directories expanded.
fn holder_files(paths: &[PathBuf]) -> Vec<PathBuf> {
    paths.iter().flat_map(|p| artifacts::files_for_holders(p)).collect()
}

/// The whole of 6.4 for `agent` (a kind or `auto`) and `uuid`.
pub fn purge(ctx: &Ctx, agent: &str, uuid: &str) -> Result<Report, PurgeError> {
    let uuid = check_uuid(uuid)?;
    let home = home(ctx)?;
    let (kind, layout, plan) = resolve(agent, &home, &uuid)?;
    // The in-use check on that adapter's paths runs first; a refusal changes nothing.
    let existing = plan.existing();
    if let Some(h) = conversation_in_use(ctx, &uuid, &holder_files(&existing), &plan.session_pids) {
        return Err(PurgeError::Refused(h.to_string()));
    }
    let mut rep = Report { kind, uuid: uuid.clone(), ..Report::default() };
    let remove = |p: &PathBuf, rep: &mut Report| match artifacts::remove(&plan.root, p) {
        Ok(true) => rep.removed.push(p.clone()),
        Ok(false) => {}
        Err(e) => rep.residual.push((p.clone(), e)),
    };
    for p in &plan.first {
        remove(p, &mut rep);
    }
    // Again before the presence lock: a new holder keeps it (listed as residual, exit 1).
    let last: Vec<PathBuf> = plan.last.iter().filter(|p| std::fs::symlink_metadata(p).is_ok()).cloned().collect();
    if !last.is_empty() {
        match conversation_in_use(ctx, &uuid, &holder_files(&last), &plan.session_pids) {
            Some(h) => {
                for p in &last {
                    rep.residual.push((p.clone(), format!("kept: {h}")));
                }
            }
            None => {
                for p in &last {
                    remove(p, &mut rep);
                }
            }
        }
    }
    for p in artifacts::residual(layout, &home, &uuid) {
        if !rep.residual.iter().any(|(q, _)| *q == p) {
            rep.residual.push((p, "still carries the uuid".into()));
        }
    }
    Ok(rep)
}
