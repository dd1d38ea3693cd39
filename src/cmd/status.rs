//! `mam status` (ORCH 2.6): show sessions, their liveness and open jobs. Never starts a pane server
//! (MAM_NO_AUTOSTART=1) and needs no broker. Parsing validates only; the logic is
//! `crate::session::status`.

use std::ffi::OsString;

use crate::cli::{self, Failure, Parsed};
use crate::ctx::Ctx;
use crate::session::status::status;

pub const USAGE: &str = "
Usage: mam status [<name>] [--json]

A header row (NAME AGENT SERVER PANE CWD LIVENESS STATE CONVERSATION STATUS), then one line per
session (tab separated; `-` when there is no value), then `  job <id> <type> <status>` for each
of its jobs, oldest first: every open job, the latest 3 finished ones, and its onboarding job.
An open job whose agent waits for a person gets `(waiting for you: approve <action>?)` or
`(waiting for you: idle at its input line for <t>)`, as the workspace daemon judged it from the
agent's screen (`mam daemon --help`).
Jobs are looked up in MAM_JOBS_DIR, the row's registry, $WORKSPACE_ROOT/.mam/jobs, then the
default registry; the first holding a job wins.

The words:
  SERVER        the pane backend and its server: tmux/<socket>, herdr/<session>
                (`HERDR_SESSION=<session> herdr ...` reaches it), fake/fake, remote/-
  LIVENESS      is the agent's process in its pane?  running: yes;  gone: its pane or
                process is not there any more (`mam reconcile` tidies the row);  unknown:
                the server did not answer (exit 3)
  STATE         what the agent is doing:  working: busy with a prompt;  idle: at its input
                line, waiting for the next one;  done: finished its turn (herdr, fake);
                blocked: waiting for a person (a dialog, a permission question);  gone: not
                running;  unknown: the server did not answer (LIVENESS unknown too), or the
                agent runs but neither its screen nor its jobs tell: a job was prompted and
                has not started.  When the screen shows none of mam's rules for the agent
                (e.g. a CLI mam has no screen rules for), its jobs decide: no open job is
                idle, a started open job is working
  CONVERSATION  the agent CLI's conversation id (what `mam resume` resumes)
  STATUS        the session's record in the sessions file: running, or stopped after
                `mam stop` (a stopped row stays until `mam reconcile` or a new create)
  job status    registered, running, completed, failed, cancelled, agent_blocked,
                unresponsive, ... (docs/spec/CORE.md 5; `mam jobs` shows their evidence)
With no sessions at all it prints `no sessions (start one with `mam create <agent>`)`.

Options:
  --json      one JSON array instead
  -h, --help  print this help

Exit codes: 0 ok, 1 runtime error (the env file unreadable), 2 usage, unknown session or sessions
file not JSON, 3 some server's state is unknown (output still printed).
";

/// The header row of the text output (issue 18), tab separated like the rows.
const HEADER: &str = "NAME\tAGENT\tSERVER\tPANE\tCWD\tLIVENESS\tSTATE\tCONVERSATION\tSTATUS";

#[derive(Debug, Default)]
struct Args {
    name: Option<String>,
    json: bool,
}

fn parse_args(args: Vec<OsString>) -> Result<Parsed<Args>, Failure> {
    use lexopt::prelude::*;
    let mut a = Args::default();
    let mut p = lexopt::Parser::from_args(args);
    while let Some(arg) = p.next()? {
        match arg {
            Short('h') | Long("help") => return Ok(Parsed::Help),
            Value(v) if a.name.is_none() => a.name = Some(cli::utf8("name", v)?),
            Long("json") => a.json = true,
            _ => return Err(arg.unexpected().into()),
        }
    }
    Ok(Parsed::Run(a))
}

pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let Some(a) = cli::parse_or_help(ctx, USAGE, args, parse_args)? else {
        return Ok(0);
    };
    ctx.set_var("MAM_NO_AUTOSTART", Some("1".as_ref()));
    cli::load_env(ctx)?;
    let report = status(ctx, a.name.as_deref()).map_err(|e| crate::cli::session_failure("status", &e))?;
    if a.json {
        ctx.say(&report.json().to_string());
    } else if report.rows.is_empty() {
        ctx.say("no sessions (start one with `mam create <agent>`)");
    } else {
        ctx.say(HEADER);
        for l in report.lines() {
            ctx.say(&l);
        }
    }
    if report.any_unknown {
        ctx.diag("WARNING: status: some server's state is unknown; its rows show liveness `unknown`");
    }
    Ok(report.rc())
}
