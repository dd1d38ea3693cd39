//! `mam registry`: durable job records (CORE 4). `paths` is here now; the record subcommands come
//! with the registry work (issue 4).

use std::ffi::OsString;
use std::path::PathBuf;

use crate::cli::{self, Failure, Parsed};
use crate::ctx::Ctx;
use crate::paths;

pub const USAGE: &str = "
Usage: mam registry <subcommand> [--registry-dir D] [args...]

Subcommands:
  paths        print `registry=<abs>` and `logs=<abs>` (creates nothing)

Options:
  --registry-dir D   the job registry (relative to the cwd); else MAM_JOBS_DIR; else
                     <control root>/.mam/jobs
  -h, --help         print this help

Exit codes: 0 ok, 1 runtime error, 2 usage, 4 refused by the transition engine.
";

#[derive(Debug)]
enum Sub {
    Paths { registry_dir: Option<PathBuf> },
}

fn parse_args(args: Vec<OsString>) -> Result<Parsed<Sub>, Failure> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let mut sub: Option<String> = None;
    let mut registry_dir = None;
    while let Some(arg) = p.next()? {
        match arg {
            Long("registry-dir") => registry_dir = Some(p.value()?.into()),
            Short('h') | Long("help") => return Ok(Parsed::Help),
            Value(v) if sub.is_none() => sub = Some(cli::utf8("registry", v)?),
            _ => return Err(arg.unexpected().into()),
        }
    }
    match sub.as_deref() {
        Some("paths") => Ok(Parsed::Run(Sub::Paths { registry_dir })),
        Some(other) => Err(Failure::usage(format!("registry: unknown subcommand '{}'", cli::one_line(other)))),
        None => Err(Failure::usage("registry: missing subcommand (see mam registry --help)")),
    }
}

pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let Some(sub) = cli::parse_or_help(ctx, USAGE, args, parse_args)? else {
        return Ok(0);
    };
    cli::load_env(ctx)?;
    match sub {
        Sub::Paths { registry_dir } => {
            let r = paths::resolve(ctx, registry_dir.as_deref());
            ctx.say(&format!("registry={}", r.registry.to_string_lossy()));
            ctx.say(&format!("logs={}", r.logs.to_string_lossy()));
            Ok(0)
        }
    }
}
