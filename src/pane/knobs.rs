//! The pane knobs (ORCH 1.1): every wait, poll interval and grace of placement and `send_keys_safe`,
//! read once through the one integer grammar, with the spec's defaults and the short test knobs.

use crate::ctx::Ctx;
use crate::knob::{self, ConfigError};

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
    /// Reads every knob through the one integer grammar; invalid values name the variable.
    pub fn from_ctx(ctx: &Ctx) -> Result<Knobs, ConfigError> {
        let d = Knobs::default();
        let s = |name: &str, min: u32, def_ms: u64| -> Result<u64, ConfigError> {
            Ok(knob::env(ctx, name, min)?.map(|v| v as u64 * 1000).unwrap_or(def_ms))
        };
        let ms = |name: &str, min: u32, def: u64| -> Result<u64, ConfigError> {
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
