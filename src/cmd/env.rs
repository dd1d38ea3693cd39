//! `mam env`: prints the env file's values as shell exports (`--shell`), the resolved file (`--path`),
//! or checks one integer knob (`--check-int`, A27).

use std::ffi::OsString;

use crate::cli::{self, Failure, Parsed};
use crate::ctx::Ctx;
use crate::text;
use crate::text::show_path;
use crate::{envfile, knob};

pub const USAGE: &str = "
Usage: mam env --shell | --path | --check-int VALUE

Reads the env file (.mam.env) the way every mam entry point does (CORE 1).

Options:
  --shell            print `export KEY='VALUE'` for each value that would be applied
  --path             print the resolved env file, or nothing
  --check-int VALUE  print VALUE normalised by the integer-knob grammar, or exit 2
  -h, --help         print this help

Environment: MAM_ENV_FILE (explicit file; missing means load nothing), WORKSPACE_ROOT.

The file is loaded only when it and its directory are yours (or root's) and not writable by group
or others, and not a symlink (docs/SECURITY.md); MAM_OPENSSL, MAM_BIN, MAM_TRUSTED_ROOTS, PATH,
LD_PRELOAD and LD_LIBRARY_PATH lines are skipped with a warning (environment only).

Exit codes: 0 ok, 1 env file unreadable, undecodable or refused, 2 usage or invalid integer.
";

#[derive(Debug)]
enum Mode {
    Shell,
    Path,
    CheckInt(OsString),
}

fn parse_args(args: Vec<OsString>) -> Result<Parsed<Mode>, Failure> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let mut mode = None;
    while let Some(arg) = p.next()? {
        let m = match arg {
            Long("shell") => Mode::Shell,
            Long("path") => Mode::Path,
            Long("check-int") => Mode::CheckInt(p.value()?),
            Short('h') | Long("help") => return Ok(Parsed::Help),
            _ => return Err(arg.unexpected().into()),
        };
        if mode.is_some() {
            return Err(Failure::usage("env: give exactly one of --shell, --path, --check-int"));
        }
        mode = Some(m);
    }
    mode.map(Parsed::Run).ok_or_else(|| Failure::usage("env: give one of --shell, --path, --check-int"))
}

pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let Some(mode) = cli::parse_or_help(ctx, USAGE, args, parse_args)? else {
        return Ok(0);
    };
    match mode {
        Mode::CheckInt(v) => {
            let n = knob::flag("--check-int", &v, 0)?;
            ctx.say(&n.to_string());
        }
        Mode::Path => {
            if let Some(p) = envfile::resolve(ctx) {
                ctx.say(&show_path(&p));
            }
        }
        Mode::Shell => {
            let Some(path) = envfile::resolve(ctx) else {
                return Ok(0);
            };
            let parsed = envfile::read(&path).map_err(Failure::runtime)?;
            for w in &parsed.warnings {
                ctx.diag(w);
            }
            let mut out = String::new();
            for (k, v) in envfile::applicable(ctx, &parsed) {
                out.push_str(&format!("export {k}={}\n", text::shell_quote(&v)));
            }
            ctx.say_raw(out.as_bytes());
        }
    }
    Ok(0)
}
