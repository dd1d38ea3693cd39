//! Test doubles compiled into the one binary and reached through the hidden `mam test-double`
//! (ORCH 1.8): `herdr`, the mock herdr, and `agent`, the fake agent, and `model`, a scripted model API on loopback for the real agent CLIs. They stand in for external
//! programs in tests and the demo; mam's own flows never call them.

pub mod agent;
pub mod herdr;
pub mod model;
