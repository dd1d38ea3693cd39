//! One module per subcommand: `USAGE`, `parse_args` (validation only, no I/O) and `run`.

pub mod broker;
pub mod create;
pub mod daemon;
pub mod delegate_job;
pub mod diff_collect;
pub mod env;
pub mod heartbeat;
pub mod install;
pub mod jobs;
pub mod loop_;
pub mod monitor;
pub mod pane;
pub mod paths;
pub mod pub_;
pub mod publish;
pub mod reconcile;
pub mod registry;
pub mod remote;
pub mod resume;
pub mod session;
pub mod status;
pub mod stop;
pub mod sub;
pub mod test_double;
pub mod watch;
pub mod worktree;
