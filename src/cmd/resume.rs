//! `mam resume` (ORCH 2.4): resume a stopped session in its own directory with the adapter's resume
//! arguments. Parsing validates only; the flow is `crate::session::resume`.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::cli::{self, Failure, Parsed};
use crate::ctx::Ctx;
use crate::session::resume::{resume, ResumeArgs};
use crate::session::Notes;

pub const USAGE: &str = "
Usage: mam resume <name> [--workspace DIR]

Resumes session <name> in the directory its row records (pane.cwd), with the row's control-plane
binding (which wins over the caller's; each difference is reported). An agent already alive on the
row's server is only recorded. A legacy row without a binding takes the caller's.

Options:
  --workspace DIR   must be the row's directory when the row records one
  -h, --help        print this help

Stdout: SESSION=<name> PANE=<id> WORKSPACE=<id> CWD=<dir> (or SESSION=<name> already running),
then DAEMON_PID=<pid> when a daemon is reported.

Exit codes: 0 resumed or already running, 1 start failure (verified rollback ran) or server state
unknown, 2 refused before any change (unknown row, its directory gone, another --workspace, a
forwarded binding path with whitespace, sessions file not JSON).
";

fn parse_args(args: Vec<OsString>) -> Result<Parsed<ResumeArgs>, Failure> {
    use lexopt::prelude::*;
    let mut a = ResumeArgs::default();
    let mut p = lexopt::Parser::from_args(args);
    while let Some(arg) = p.next()? {
        match arg {
            Short('h') | Long("help") => return Ok(Parsed::Help),
            Value(v) if a.name.is_empty() => a.name = cli::utf8("name", v)?,
            Long("workspace") => a.workspace = Some(PathBuf::from(p.value()?)),
            _ => return Err(arg.unexpected().into()),
        }
    }
    if a.name.is_empty() {
        return Err(Failure::usage("resume: give the session name"));
    }
    Ok(Parsed::Run(a))
}

pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let Some(a) = cli::parse_or_help(ctx, USAGE, args, parse_args)? else {
        return Ok(0);
    };
    cli::load_env(ctx)?;
    cli::need_control_root(ctx, "resume")?;
    let mut notes = Notes::default();
    let r = resume(ctx, &a, &mut notes);
    super::session::finish(ctx, "resume", notes, r)
}
