//! orc-onboard (ORCH 6.5, A48): register, list and remove the orchestrator's conversation uuid in the
//! sessions file's `orchestrator_uuids`, the remove optionally purging the conversation first
//! (`agents::purge`, before the registry update, so a refusal keeps the registration).
//!
//! The orchestrator has no session row; this is its one path. Writes go through the sessions file's
//! lock (`update`). Never prints: the flows return their stdout lines.

use std::fmt;

use super::{load, update, SessionError};
use crate::agents::{self, purge::PurgeError};
use crate::ctx::Ctx;
use crate::paths;
use crate::text::{one_line_clipped, show_path};

/// What orc-onboard does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Add `uuid`, or the session-id variable of `agent` (else of the nearest agent ancestor's kind).
    Add {
        uuid: Option<String>,
        agent: Option<String>,
    },
    List,
    Remove {
        uuid: String,
        purge: bool,
        yes: bool,
        agent: Option<String>,
    },
}

/// Why orc-onboard stopped; each variant carries its exit code (6.5).
#[derive(Debug)]
pub enum OrcError {
    /// rc 2: bad uuid, unknown kind, no uuid found, purge usage (ambiguous `auto`).
    Usage(String),
    /// rc 4: `--purge-conversation` without `--yes`.
    NeedsYes,
    /// rc 3: removing a uuid that is not registered.
    NotRegistered(String),
    /// rc 5: the purge refused (in use, no artifact); registration kept.
    PurgeRefused(String),
    /// rc 1: the purge left residuals (listed); registration kept. Lines: removed and residual.
    Residual { lines: Vec<String>, why: String },
    /// The sessions file (its own codes).
    Session(SessionError),
}

impl From<SessionError> for OrcError {
    fn from(e: SessionError) -> OrcError {
        OrcError::Session(e)
    }
}

impl fmt::Display for OrcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OrcError::Usage(m) | OrcError::PurgeRefused(m) => f.write_str(m),
            OrcError::NeedsYes => f.write_str("--purge-conversation needs --yes; nothing changed"),
            OrcError::NotRegistered(u) => write!(f, "orchestrator {u} is not registered; nothing changed"),
            OrcError::Residual { why, .. } => f.write_str(why),
            OrcError::Session(e) => e.fmt(f),
        }
    }
}

fn uuid_of(s: &str) -> Result<String, OrcError> {
    agents::canonical_uuid(s)
        .ok_or_else(|| OrcError::Usage(format!("'{}' is not a canonical uuid (8-4-4-4-12 hex)", one_line_clipped(s))))
}

/// The uuid add registers when none is given (A48): the session-id variable of `--agent`'s kind,
/// else of the nearest agent-CLI ancestor's kind (CORE 7.6), read from our own environment.
fn default_uuid(ctx: &Ctx, agent: Option<&str>) -> Result<String, OrcError> {
    let ad = match agent {
        Some(k) => agents::adapter(k).ok_or_else(|| {
            OrcError::Usage(format!(
                "unknown agent kind '{}' (known: {})",
                one_line_clipped(k),
                agents::kinds().join(", ")
            ))
        })?,
        None => match agents::nearest_agent_ancestor(std::process::id() as i32) {
            Some((_, ad)) => ad,
            None => {
                return Err(OrcError::Usage(
                    "no uuid given and no agent CLI ancestor to take it from (pass --agent or a uuid)".into(),
                ))
            }
        },
    };
    if ad.session_vars.is_empty() {
        return Err(OrcError::Usage(format!("no uuid given and {} exports no session-id variable", ad.kind)));
    }
    for v in ad.session_vars {
        if let Some(val) = ctx.var_nonempty(v) {
            return uuid_of(val.trim());
        }
    }
    Err(OrcError::Usage(format!("no uuid given and {} unset", ad.session_vars.join(" and "))))
}

/// The whole of 6.5. Returns the stdout lines.
pub fn run(ctx: &Ctx, action: &Action) -> Result<Vec<String>, OrcError> {
    // Remove's order (6.5): --yes, then the uuid's form, then registration.
    if let Action::Remove { purge: true, yes: false, .. } = action {
        return Err(OrcError::NeedsYes);
    }
    let file = paths::resolve(ctx, None).map_err(SessionError::from)?.sessions;
    match action {
        Action::List => Ok(load(&file)?.orchestrator_uuids),
        Action::Add { uuid, agent } => {
            let uuid = match uuid {
                Some(u) => uuid_of(u)?,
                None => default_uuid(ctx, agent.as_deref())?,
            };
            if load(&file)?.orchestrator_uuids.iter().any(|u| u.eq_ignore_ascii_case(&uuid)) {
                return Ok(vec![format!("Orchestrator {uuid} already registered")]);
            }
            let mut added = false;
            update(&file, |doc| {
                if !doc.orchestrator_uuids.iter().any(|u| u.eq_ignore_ascii_case(&uuid)) {
                    doc.orchestrator_uuids.push(uuid.clone());
                    added = true;
                }
                Ok(())
            })?;
            Ok(vec![if added {
                format!("Successfully added orchestrator {uuid}")
            } else {
                format!("Orchestrator {uuid} already registered")
            }])
        }
        Action::Remove { uuid, purge, agent, .. } => {
            let uuid = uuid_of(uuid)?;
            if !load(&file)?.orchestrator_uuids.iter().any(|u| u.eq_ignore_ascii_case(&uuid)) {
                return Err(OrcError::NotRegistered(uuid));
            }
            let mut lines = Vec::new();
            if *purge {
                match agents::purge::purge(ctx, agent.as_deref().unwrap_or("auto"), &uuid) {
                    Ok(rep) => {
                        lines.extend(rep.removed.iter().map(|p| format!("removed {}", show_path(p))));
                        if !rep.residual.is_empty() {
                            lines.extend(
                                rep.residual.iter().map(|(p, why)| format!("residual {} ({why})", show_path(p))),
                            );
                            return Err(OrcError::Residual {
                                lines,
                                why: format!(
                                    "{} residual artifact(s) of {uuid} left; orchestrator still registered",
                                    rep.residual.len()
                                ),
                            });
                        }
                    }
                    Err(PurgeError::Usage(m)) => {
                        return Err(OrcError::Usage(format!("{m}; orchestrator still registered")))
                    }
                    Err(PurgeError::Refused(m)) => {
                        return Err(OrcError::PurgeRefused(format!("{m}; orchestrator {uuid} still registered")))
                    }
                }
            }
            update(&file, |doc| {
                doc.orchestrator_uuids.retain(|u| !u.eq_ignore_ascii_case(&uuid));
                Ok(())
            })?;
            lines.push(format!("Successfully removed orchestrator {uuid}"));
            Ok(lines)
        }
    }
}
