//! `mam orc-onboard` (ORCH 6.5): register, list or remove the orchestrator's conversation uuid, the
//! remove optionally purging the conversation first. Parsing validates only; the flow is
//! `crate::session::orc`.

use std::ffi::OsString;

use crate::cli::{self, Failure, Parsed};
use crate::ctx::Ctx;
use crate::session::orc::{run as orc, Action, OrcError};
use crate::text::one_line;

pub const USAGE: &str = "
Usage: mam orc-onboard [--agent KIND] [<uuid>]
       mam orc-onboard --list
       mam orc-onboard --remove <uuid> [--purge-conversation --yes] [--agent KIND]

Add (the default): stores the bare uuid in the sessions file's orchestrator_uuids (no duplicates).
Without <uuid> it is the session-id variable of --agent's kind, else of the nearest agent CLI
ancestor's kind, read from this process's environment.
--remove: with --purge-conversation the conversation is purged first (`mam agents purge`, KIND or
auto); a refused or incomplete purge keeps the registration.

Options:
  --agent KIND          the kind whose session-id variable (add) or artifacts (purge) to use
  --list                print the registered uuids, one per line
  --remove UUID         unregister UUID
  --purge-conversation  with --remove: purge the conversation first
  --yes                 confirm the purge
  -h, --help            print this help

Exit codes: 0 added, already registered, listed or removed; 1 the purge left residuals
(registration kept); 2 usage (not a canonical uuid, no uuid found, unknown kind, auto ambiguous);
3 --remove of a uuid that is not registered; 4 --purge-conversation without --yes (nothing
changed); 5 the purge was refused (in use or no artifact; registration kept).
";

#[derive(Debug, Default)]
struct Args {
    agent: Option<String>,
    list: bool,
    remove: Option<String>,
    purge: bool,
    yes: bool,
    uuid: Option<String>,
}

fn parse_args(args: Vec<OsString>) -> Result<Parsed<Action>, Failure> {
    use lexopt::prelude::*;
    let mut a = Args::default();
    let mut p = lexopt::Parser::from_args(args);
    while let Some(arg) = p.next()? {
        match arg {
            Short('h') | Long("help") => return Ok(Parsed::Help),
            Long("agent") => a.agent = Some(cli::utf8("--agent", p.value()?)?),
            Long("list") => a.list = true,
            Long("remove") => a.remove = Some(cli::utf8("--remove", p.value()?)?),
            Long("purge-conversation") => a.purge = true,
            Long("yes") => a.yes = true,
            Value(v) if a.uuid.is_none() => a.uuid = Some(cli::utf8("uuid", v)?),
            _ => return Err(arg.unexpected().into()),
        }
    }
    if a.list {
        if a.remove.is_some() || a.uuid.is_some() || a.purge || a.yes || a.agent.is_some() {
            return Err(Failure::usage("orc-onboard: --list takes no other argument"));
        }
        return Ok(Parsed::Run(Action::List));
    }
    if let Some(uuid) = a.remove {
        if a.uuid.is_some() {
            return Err(Failure::usage("orc-onboard: --remove takes its uuid as its value only"));
        }
        return Ok(Parsed::Run(Action::Remove { uuid, purge: a.purge, yes: a.yes, agent: a.agent }));
    }
    if a.purge || a.yes {
        return Err(Failure::usage("orc-onboard: --purge-conversation and --yes go with --remove"));
    }
    Ok(Parsed::Run(Action::Add { uuid: a.uuid, agent: a.agent }))
}

pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let Some(action) = cli::parse_or_help(ctx, USAGE, args, parse_args)? else {
        return Ok(0);
    };
    cli::load_env(ctx)?;
    let refused =
        |rc: i32, e: &OrcError| Failure::new(rc, format!("REFUSED: orc-onboard: {}", one_line(&e.to_string())));
    match orc(ctx, &action) {
        Ok(lines) => {
            for l in lines {
                ctx.say(&l);
            }
            Ok(0)
        }
        Err(e @ OrcError::Usage(_)) => Err(refused(2, &e)),
        Err(e @ OrcError::NeedsYes) => Err(refused(4, &e)),
        Err(e @ OrcError::NotRegistered(_)) => Err(refused(3, &e)),
        Err(e @ OrcError::PurgeRefused(_)) => Err(refused(5, &e)),
        Err(OrcError::Residual { lines, why }) => {
            for l in lines {
                ctx.say(&l);
            }
            Err(Failure::runtime(format!("orc-onboard: {}", one_line(&why))))
        }
        Err(OrcError::Session(e)) => Err(cli::session_failure("orc-onboard", &e)),
    }
}
