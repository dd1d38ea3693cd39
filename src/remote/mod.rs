//! `mam remote`'s library side (CORE 9; A5, A12, A21): the signed dispatch message (`dispatch`) and
//! the runner with its queue and process-group handling (`runner`). The runner's events go through
//! the publish library (`crate::publish`) and its timer through `crate::heartbeat`, like an agent's.
//!
//! Nothing here prints or reads the process environment; the secret is a key only, never output.

pub mod dispatch;
pub mod runner;
