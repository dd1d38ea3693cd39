//! Pane backends (ORCH 1): the one contract for placing an agent in a terminal pane, prompting it with
//! delivery confirmation, reading its state and listing what is alive, with three implementations
//! (herdr, tmux, fake). `contract` is the `Backend` trait and its values, `knobs` the waits,
//! `place` the placement algorithm of 1.5, `sks` `send_keys_safe` of 1.7 (A24), each written once
//! over the trait, and `proc` the process helpers of the CLI-backed backends. This file opens a
//! backend by name and re-exports the parts; the parts never import it.
//!
//! It never prints and never reads the process environment: knobs come from `Ctx`, results are values.
//! Placement and delivery decisions are pure functions (`choose`, `split_plan`, `dialog_step`) so they
//! are unit-tested without any backend.

pub mod contract;
pub mod fake;
pub mod herdr;
pub mod knobs;
pub mod place;
pub mod proc;
pub mod sks;
pub mod sock;
pub mod tmux;

use std::fmt;

pub use contract::*;
pub use knobs::Knobs;
pub use place::*;
pub use proc::{denied, no_autostart, on_path, run_capture, server_env};
pub use sks::{prompt_problem, send_keys_safe, Confirm, SksOutcome, MAX_PROMPT};

use crate::ctx::Ctx;
use crate::knob::ConfigError;
use crate::text::one_line;

/// Why a backend could not be opened: a bad knob, or a backend name this build does not know. Both
/// are usage errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenError {
    Config(ConfigError),
    /// A row's recorded backend that this build does not know.
    UnknownBackend(String),
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::Config(e) => e.fmt(f),
            OpenError::UnknownBackend(b) => write!(f, "unknown pane backend '{}'", one_line(b)),
        }
    }
}

impl From<ConfigError> for OpenError {
    fn from(e: ConfigError) -> OpenError {
        OpenError::Config(e)
    }
}

/// The backend name in use: `MAM_PANE_BACKEND`, else herdr when on PATH, else tmux.
pub fn backend_name(ctx: &Ctx) -> Result<&'static str, OpenError> {
    match ctx.var_nonempty("MAM_PANE_BACKEND").as_deref() {
        Some("herdr") => Ok("herdr"),
        Some("tmux") => Ok("tmux"),
        Some("fake") => Ok("fake"),
        Some(_) => {
            Err(OpenError::Config(ConfigError::var(ctx, "MAM_PANE_BACKEND", "a pane backend", "herdr, tmux or fake")))
        }
        None if on_path(ctx, "herdr").is_some() => Ok("herdr"),
        None => Ok("tmux"),
    }
}

/// Opens the backend chosen by `MAM_PANE_BACKEND` on `server` (default: the backend's default server).
pub fn open(ctx: &Ctx, server: Option<&str>) -> Result<Box<dyn Backend>, OpenError> {
    open_named(ctx, backend_name(ctx)?, server)
}

/// Opens a named backend (a row's recorded `backend`) on `server`.
pub fn open_named(ctx: &Ctx, name: &str, server: Option<&str>) -> Result<Box<dyn Backend>, OpenError> {
    let knobs = Knobs::from_ctx(ctx)?;
    let server = server.filter(|s| !s.is_empty());
    Ok(match name {
        "herdr" => Box::new(herdr::Herdr::new(ctx, server, knobs)),
        "tmux" => Box::new(tmux::Tmux::new(ctx, server, knobs)),
        "fake" => Box::new(fake::Fake::new(ctx, server, knobs)),
        other => return Err(OpenError::UnknownBackend(other.to_string())),
    })
}
