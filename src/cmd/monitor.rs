//! `mam monitor [start|stop|status]` (ORCH 2.1, decided): a thin front over `mam daemon
//! ensure|stop|status --workspace <control root>`, run as a child of this binary so the daemon keeps
//! one implementation. Output and exit code are the daemon command's.

use std::ffi::OsString;
use std::time::Duration;

use crate::cli::{self, Failure, Parsed};
use crate::ctx::{ChildRole, Ctx};
use crate::paths;
use crate::session::run_self;
use crate::text;

pub const USAGE: &str = "
Usage: mam monitor [start | stop | status]

The control root's subscriber daemon: `start` is `mam daemon ensure --workspace <root>`, `stop` is
`mam daemon stop --workspace <root>`, `status` (the default) is `mam daemon status --workspace
<root>`. Prints what the daemon command prints.

Options:
  -h, --help  print this help

Exit codes: those of `mam daemon` (2 usage).
";

fn parse_args(args: Vec<OsString>) -> Result<Parsed<&'static str>, Failure> {
    use lexopt::prelude::*;
    let mut verb = None;
    let mut p = lexopt::Parser::from_args(args);
    while let Some(arg) = p.next()? {
        match arg {
            Short('h') | Long("help") => return Ok(Parsed::Help),
            Value(v) if verb.is_none() => {
                verb = Some(match v.to_str() {
                    Some("start") => "ensure",
                    Some("stop") => "stop",
                    Some("status") => "status",
                    _ => {
                        return Err(Failure::usage(format!(
                            "monitor: unknown verb '{}' (start, stop, status)",
                            text::one_line(&v.to_string_lossy())
                        )))
                    }
                })
            }
            _ => return Err(arg.unexpected().into()),
        }
    }
    Ok(Parsed::Run(verb.unwrap_or("status")))
}

/// How long the daemon command may take.
const LIMIT: Duration = Duration::from_secs(60);

pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let Some(verb) = cli::parse_or_help(ctx, USAGE, args, parse_args)? else {
        return Ok(0);
    };
    cli::load_env(ctx)?;
    let root = paths::control_root(ctx)?.to_string_lossy().into_owned();
    let out = run_self(ctx, ChildRole::BrokerClient, &["daemon", verb, "--workspace", &root], LIMIT)
        .map_err(|e| Failure::runtime(format!("monitor: {e}")))?;
    ctx.say_raw(out.stdout.as_bytes());
    for l in out.stderr.lines() {
        ctx.diag(l);
    }
    Ok(out.rc)
}
