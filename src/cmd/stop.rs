//! `mam stop` (ORCH 2.5): cancel a session's open task jobs, close its pane, mark it stopped.
//! Parsing validates only; the flow is `crate::session::stop`.

use std::ffi::OsString;

use crate::cli::{self, Failure, Parsed};
use crate::ctx::Ctx;
use crate::session::stop::{stop, StopArgs};
use crate::session::Notes;

pub const USAGE: &str = "
Usage: mam stop <name>... [--purge-conversation --yes]

For each session: every non-terminal job of type `task` addressed to it is set `cancelled`
(reason `session stopped`) through the transition engine, in the registry MAM_JOBS_DIR > the
row's mam_jobs_dir > $WORKSPACE_ROOT/.mam/jobs, with the audit under DELEGATE_JOB_LOGS_DIR > the
row's delegate_job_logs_dir; then its pane is closed and the agent confirmed gone; the row becomes
`stopped` (pane.cwd and conversation_id kept for resume). Stopping a stopped row does nothing.

Options:
  --purge-conversation   after the stop, purge the conversation (`mam agents purge`)
  --yes                  confirm the purge
  -h, --help             print this help

Stdout: one line per session: SESSION=<name> STATUS=stopped|already-stopped CANCELLED=<ids|->.

Exit codes: 0 stopped, 1 the agent is still listed or its state is unknown, 2 unknown session or
sessions file not JSON (nothing changed), 4 --purge-conversation without --yes (nothing changed),
5 session stopped but the purge was refused (conversation kept).
";

fn parse_args(args: Vec<OsString>) -> Result<Parsed<StopArgs>, Failure> {
    use lexopt::prelude::*;
    let mut a = StopArgs::default();
    let mut p = lexopt::Parser::from_args(args);
    while let Some(arg) = p.next()? {
        match arg {
            Short('h') | Long("help") => return Ok(Parsed::Help),
            Value(v) => a.names.push(cli::utf8("name", v)?),
            Long("purge-conversation") => a.purge = true,
            Long("yes") => a.yes = true,
            _ => return Err(arg.unexpected().into()),
        }
    }
    if a.names.is_empty() {
        return Err(Failure::usage("stop: give at least one session name"));
    }
    Ok(Parsed::Run(a))
}

pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let Some(a) = cli::parse_or_help(ctx, USAGE, args, parse_args)? else {
        return Ok(0);
    };
    cli::load_env(ctx)?;
    let mut notes = Notes::default();
    let r = stop(ctx, &a, &mut notes).map(|done| done.iter().map(|s| s.line()).collect());
    super::session::finish(ctx, "stop", notes, r)
}
