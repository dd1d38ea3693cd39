//! `mam agents purge <agent|auto> <uuid>` (ORCH 6.4): delete one conversation's artifacts when
//! nothing alive uses it. Parsing validates only; the flow is `crate::agents::purge`.

use std::ffi::OsString;

use crate::agents::purge::{purge, PurgeError};
use crate::cli::{self, Failure, Parsed};
use crate::ctx::Ctx;
use crate::text::{one_line, show_path};

pub const USAGE: &str = "
Usage: mam agents purge <agent|auto> <uuid>

Deletes the conversation <uuid> of <agent> (claude, agy; other kinds keep no pinned artifacts)
once nothing alive uses it: not one of the caller's session-id variables, no live process outside
this command's own helper chain naming it (ps), no holder of any artifact path (lsof, else the
/proc/*/fd scan; neither available = in use). `auto` takes the one kind with artifacts for it.
Order: in-use check, sidecars, database, brain, annotation, in-use check again, presence lock
last, then a walk for residual paths carrying the uuid. No symlink is followed or deleted through.

Options:
  -h, --help  print this help

Stdout: `removed <path>` per removed path, `residual <path> (<why>)` per path left.

Exit codes: 0 purged, 1 residuals left or a removal failed, 2 usage (not a canonical
8-4-4-4-12 hex uuid, unknown kind, auto ambiguous; nothing touched), 5 refused (in use: pid <p>
(<reason>), or no artifact; nothing touched).
";

#[derive(Debug, Default)]
struct Args {
    agent: String,
    uuid: String,
}

fn parse_args(args: Vec<OsString>) -> Result<Parsed<Args>, Failure> {
    use lexopt::prelude::*;
    let mut pos = Vec::new();
    let mut p = lexopt::Parser::from_args(args);
    while let Some(arg) = p.next()? {
        match arg {
            Short('h') | Long("help") => return Ok(Parsed::Help),
            Value(v) if pos.len() < 3 => pos.push(cli::utf8("argument", v)?),
            _ => return Err(arg.unexpected().into()),
        }
    }
    match pos.as_slice() {
        [verb, agent, uuid] if verb == "purge" => Ok(Parsed::Run(Args { agent: agent.clone(), uuid: uuid.clone() })),
        [verb, ..] if verb != "purge" => {
            Err(Failure::usage(format!("agents: unknown verb '{}' (purge)", one_line(verb))))
        }
        _ => Err(Failure::usage("agents purge: give <agent|auto> <uuid>")),
    }
}

pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let Some(a) = cli::parse_or_help(ctx, USAGE, args, parse_args)? else {
        return Ok(0);
    };
    match purge(ctx, &a.agent, &a.uuid) {
        Ok(rep) => {
            for p in &rep.removed {
                ctx.say(&format!("removed {}", show_path(p)));
            }
            for (p, why) in &rep.residual {
                ctx.say(&format!("residual {} ({})", show_path(p), one_line(why)));
            }
            if rep.residual.is_empty() {
                Ok(0)
            } else {
                Err(Failure::runtime(format!(
                    "agents purge: {} residual artifact(s) of {} left",
                    rep.residual.len(),
                    rep.uuid
                )))
            }
        }
        Err(e @ PurgeError::Usage(_)) => {
            Err(Failure::new(2, format!("REFUSED: agents purge: {}; nothing changed", one_line(&e.to_string()))))
        }
        Err(e @ PurgeError::Refused(_)) => {
            Err(Failure::new(5, format!("REFUSED: agents purge: {}; nothing changed", one_line(&e.to_string()))))
        }
    }
}
