//! `mam session import-yaml` (ORCH 0.6): the one-time conversion of a legacy YAML sessions file to
//! JSON. Also the shared tail of the session subcommands (`finish`): notes on stderr, then stdout
//! lines, or the one failure line.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::cli::{self, Failure, Parsed};
use crate::ctx::Ctx;
use crate::paths;
use crate::session::yaml::{import, Imported};
use crate::session::{Notes, SessionError};
use crate::sys;
use crate::text;
use crate::text::show_path;

pub const USAGE: &str = "
Usage: mam session import-yaml [FILE]

Converts the legacy YAML sessions file FILE (default: the sessions file, AGENT_SESSIONS_YAML or
<control root>/.mam/agent_sessions.json) once into the JSON sessions file, keeping the original
as <stem>.yaml.bak beside it. A file that already is JSON is left alone.

Options:
  -h, --help  print this help

Exit codes: 0 converted or already JSON, 1 I/O failure, 2 refused (unreadable YAML, a backup
already there, a target that already holds rows); nothing is changed on a refusal.
";

#[derive(Debug, Default)]
struct Args {
    file: Option<PathBuf>,
}

fn parse_args(args: Vec<OsString>) -> Result<Parsed<Args>, Failure> {
    use lexopt::prelude::*;
    let mut a = Args::default();
    let mut verb = None;
    let mut p = lexopt::Parser::from_args(args);
    while let Some(arg) = p.next()? {
        match arg {
            Short('h') | Long("help") => return Ok(Parsed::Help),
            Value(v) if verb.is_none() => verb = Some(cli::utf8("verb", v)?),
            Value(v) if a.file.is_none() => a.file = Some(PathBuf::from(v)),
            _ => return Err(arg.unexpected().into()),
        }
    }
    match verb.as_deref() {
        Some("import-yaml") => Ok(Parsed::Run(a)),
        Some(other) => Err(Failure::usage(format!("session: unknown verb '{}' (import-yaml)", text::one_line(other)))),
        None => Err(Failure::usage("session: give a verb (import-yaml)")),
    }
}

pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let Some(a) = cli::parse_or_help(ctx, USAGE, args, parse_args)? else {
        return Ok(0);
    };
    cli::load_env(ctx)?;
    let target = paths::resolve(ctx, None)?.sessions;
    let source = a.file.map(|f| sys::absolutize(ctx.cwd(), &f)).unwrap_or_else(|| target.clone());
    match import(&source, &target).map_err(|e| crate::cli::session_failure("session import-yaml", &e))? {
        Imported::AlreadyJson => ctx.diag(&format!("NOTE: {} already is JSON; nothing to do", show_path(&target))),
        Imported::Converted { rows, backup } => ctx.say(&format!(
            "imported {rows} row(s) into {} (original kept as {})",
            show_path(&target),
            show_path(&backup)
        )),
    }
    Ok(0)
}

/// Prints a session flow's notes (stderr) and then its stdout lines, or returns its failure line.
pub(crate) fn finish(ctx: &Ctx, cmd: &str, notes: Notes, r: Result<Vec<String>, SessionError>) -> Result<i32, Failure> {
    for n in &notes.0 {
        ctx.diag(n);
    }
    let lines = r.map_err(|e| crate::cli::session_failure(cmd, &e))?;
    for l in lines {
        ctx.say(&l);
    }
    Ok(0)
}
