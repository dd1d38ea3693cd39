//! The single integration-test binary: behaviour at stable boundaries (the CLI, the wire, files on
//! disk), named after the spec's acceptance ids.

#[macro_use]
mod support;

mod agents;
mod agents_jobs;
mod agents_real;
mod bench;
mod board;
mod broker;
mod cli;
mod daemon;
mod delegate;
mod diff_collect;
mod envfile;
mod exitcodes;
mod guide;
mod heartbeat;
mod herdr_contract;
mod herdr_mam;
mod herdr_real;
mod install;
mod jobs;
mod liveness;
mod mqtt;
mod multinode;
mod notify;
mod pane;
mod paths;
mod publish;
mod registry;
mod regress;
mod remote;
mod review;
mod security;
mod security_broker;
mod security_git;
mod security_loop;
mod security_wire;
mod session;
mod sign;
mod spec;
mod tidy;
mod ui;
mod userpath;
mod wait;
mod watch;
mod worktree;
