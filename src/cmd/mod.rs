//! One module per subcommand: `USAGE`, `parse_args` (validation only, no I/O) and `run`.

pub mod broker;
pub mod daemon;
pub mod env;
pub mod jobs;
pub mod paths;
pub mod pub_;
pub mod reconcile;
pub mod registry;
pub mod sub;
