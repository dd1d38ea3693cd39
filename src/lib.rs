//! mam: a toolset for running several coding agents in terminal panes and knowing, from evidence on
//! disk and on an MQTT bus, whether each job started, is alive, finished or died.
//!
//! The binary (`src/main.rs`) is a thin dispatcher; every subcommand is a library function in `cmd`
//! taking an explicit `Ctx`, so tests can call entry points in-process.

pub mod agents;
pub mod attach;
pub mod bench;
pub mod board;
pub mod broker;
pub mod cli;
pub mod clock;
pub mod cmd;
pub mod ctx;
pub mod daemon;
pub mod delegate;
pub mod diffcollect;
pub mod envfile;
pub mod forward;
pub mod git;
pub mod heartbeat;
pub mod install;
pub mod joblog;
pub mod knob;
pub mod mqtt;
pub mod notify;
pub mod ops;
pub mod pane;
pub mod paths;
pub mod publish;
pub mod registry;
pub mod remote;
pub mod review;
pub mod session;
pub mod sign;
pub mod sort;
pub mod sys;
pub mod testdouble;
pub mod text;
pub mod trace;
pub mod trust;
pub mod ui;
pub mod version;
pub mod view;
pub mod wait;
pub mod watch;
pub mod wire;
pub mod worktree;
