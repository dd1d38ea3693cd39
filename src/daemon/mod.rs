//! The workspace subscriber daemon (CORE 10, A3, A15, A19, A20): one long-lived process per workspace
//! that mirrors the workspace's jobs from the wire into its registry, closes the jobs nobody waits
//! for, and leaves nothing behind when it stops.
//!
//! `lock` owns the monitor lock L6 and the identity check behind `status`/`stop`; `select` is the
//! argv-shape selector of CORE 10.3; `mirror` judges messages (CORE 8.3 via `watch::accept`) and
//! applies them through the engine; `sweep` is A15; `run` is the loop. Nothing here prints: the
//! `mam daemon` command turns log lines and exits into output.
//!
//! Architecture Invariant: the daemon writes records only through `registry::store::apply`, with
//! agent authority for mirrored events and operator authority for A15 closes.

pub mod lock;
pub mod mirror;
pub mod run;
pub mod select;
pub mod sweep;

pub use lock::{acquire, running_pid, Acquire, MonitorLock};
pub use run::{run, run_with, Config, Exit, Observer};
pub use select::select_daemons;
