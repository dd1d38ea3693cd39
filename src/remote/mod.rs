//! `mam remote`'s library side (CORE 9; A5, A12, A21): the signed dispatch message (`dispatch`),
//! the runner with its queue and process-group handling (`runner`), and `report_event`, the runner's
//! stand-in for the publish library until that branch merges (`report`).
//!
//! Nothing here prints or reads the process environment; the secret is a key only, never output.

pub mod dispatch;
pub mod report;
pub mod runner;
