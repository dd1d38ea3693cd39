//! The review loop (ORCH 4): `mam loop`'s library side.

pub mod admin;
pub mod checkpoint;
pub mod decide;
pub mod dispatch;
pub mod evidence;
pub mod git;
pub mod prompt;
pub mod run;
pub mod validate;
