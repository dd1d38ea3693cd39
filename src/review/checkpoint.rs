//! The loop's checkpoint (ORCH 4.3, A39): `<loop dir>/checkpoint.json`, rewritten atomically after
//! every step, so `mam loop status` (or a person) can see where a loop is or where it stopped.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::sys;
use crate::text::show_path;

/// One delegation of the loop: a job id may appear once per dispatch.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct JobRow {
    pub jid: String,
    /// planner, plan-reviewer, implementer, reviewer, self-reviewer, corrector, complier (A39).
    pub role: String,
    pub kind: String,
    pub session: String,
    pub round: u32,
    pub status: String,
    /// The copy of the report in the loop dir, once the job ended.
    pub report: Option<String>,
    pub dispatched_at: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RoundIdentity {
    pub loop_id: String,
    pub base: String,
    pub head: String,
    pub tree: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ReviewerRow {
    pub session: String,
    pub jid: String,
    pub transport: String,
    /// `review-tree`, `source-tree`, `diff-only`, or `unpinned`.
    pub evidence: String,
    /// `PASS`, `NOT PASS`, or null while the job runs.
    pub verdict: Option<String>,
    pub synthetic: Option<String>,
    pub report: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Round {
    pub round: u32,
    /// `plan` for a plan round, `review` for a review round.
    pub kind: String,
    pub identity: Option<RoundIdentity>,
    pub snapshot_commit: Option<String>,
    /// `tree`, `env`, `diff-only`, or `none` (unpinned).
    pub isolation: String,
    pub stale: bool,
    pub diff: Option<String>,
    pub reviewers: Vec<ReviewerRow>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Checkpoint {
    pub loop_id: String,
    pub framework_version: String,
    pub pid: u32,
    pub control_root: String,
    pub source_root: String,
    pub registry: String,
    pub base: Option<String>,
    pub base_origin: Option<String>,
    pub creator: String,
    /// The creator's loop record: "the loop job" (A32).
    pub creator_jid: String,
    pub reviewers: Vec<String>,
    /// plan, implement, review, done (A39).
    pub phase: String,
    pub round: u32,
    pub max_rounds: u32,
    pub plan_path: Option<String>,
    /// The frozen binary every child runs (4.3; 4.9 test 6).
    pub collector: String,
    pub started_at: String,
    pub updated_at: String,
    pub wall_clock_s: u32,
    pub jobs: Vec<JobRow>,
    pub review_rounds: Vec<Round>,
    pub promoted: Vec<String>,
    /// promoted, failed, refused, interrupted; null while running.
    pub outcome: Option<String>,
    pub reason: Option<String>,
    pub rc: Option<i32>,
}

/// A checkpoint that could not be written or read.
#[derive(Debug)]
pub struct CheckpointError {
    pub path: PathBuf,
    pub what: &'static str,
    pub detail: String,
}

impl fmt::Display for CheckpointError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "checkpoint {}: {} ({})", show_path(&self.path), self.what, self.detail)
    }
}

/// The most a checkpoint file may hold when read back.
pub const MAX_BYTES: u64 = 16 * 1024 * 1024;

impl Checkpoint {
    pub fn write(&self, path: &Path) -> Result<(), CheckpointError> {
        let mut bytes = serde_json::to_vec_pretty(self).map_err(|e| CheckpointError {
            path: path.to_path_buf(),
            what: "cannot encode",
            detail: e.to_string(),
        })?;
        bytes.push(b'\n');
        sys::atomic_write(path, &bytes).map_err(|e| CheckpointError {
            path: path.to_path_buf(),
            what: "cannot write",
            detail: e.to_string(),
        })
    }

    pub fn read(path: &Path) -> Result<Checkpoint, CheckpointError> {
        let err = |what, detail: String| CheckpointError { path: path.to_path_buf(), what, detail };
        let bytes = read_bounded(path, MAX_BYTES).map_err(|e| err("cannot read", e.to_string()))?;
        serde_json::from_slice(&bytes).map_err(|e| err("not a loop checkpoint", e.to_string()))
    }
}

/// Reads at most `max` bytes of `path` without following a final symlink; longer is an error.
pub fn read_bounded(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let f = sys::open_nofollow_read(path)?;
    let mut out = Vec::new();
    f.take(max + 1).read_to_end(&mut out)?;
    if out.len() as u64 > max {
        return Err(io::Error::other(format!("longer than {max} bytes")));
    }
    Ok(out)
}
