//! The review loop (ORCH 4): `mam loop`'s library side.

pub mod evidence;
