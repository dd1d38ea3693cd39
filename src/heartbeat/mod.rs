//! The heartbeat timer (CORE 7): signed `progress` beats every N s while the agent process lives.
//! `timer_proc` holds the process side (pidfile, identity, stop, agent ancestor); the timer loop and
//! start_timer come with the publish work (issue 5).

pub mod timer_proc;
