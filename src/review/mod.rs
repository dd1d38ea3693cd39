//! The review loop (ORCH 4): `mam loop` drives a creator and reviewers through plan, implement and
//! review rounds to a pinned, promoted PASS. This module only declares its parts; it never prints.

pub mod git;
