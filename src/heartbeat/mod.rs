//! The heartbeat timer (CORE 7): signed `progress` beats every N s while the agent process lives.
//! `timer_proc` holds the process side (pidfile, identity, stop, agent ancestor); `timer` holds the
//! ownership operations under L2 (start_timer, stop_timer) and the timer loop itself.

pub mod arm;
pub mod timer;
pub mod timer_proc;
