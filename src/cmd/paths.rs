//! `mam paths` (A27): prints the control root, registry, audit-log root and sessions file, as lines,
//! as the binding's JSON, or as leading `K=V` shell words.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::cli::{self, Failure, Parsed};
use crate::ctx::Ctx;
use crate::paths;
use crate::text;

pub const USAGE: &str = "
Usage: mam paths [--registry-dir D] [--json | --control-plane-json | --control-plane-prefix]

Prints where this invocation's control plane lives (AMENDMENTS A1, A27). Creates nothing.

Options:
  --registry-dir D         use D as the job registry (relative to the cwd)
  --json                   all paths as one JSON object
  --control-plane-json     the binding: WORKSPACE_ROOT, AGENT_SESSIONS_YAML, MAM_JOBS_DIR,
                           DELEGATE_JOB_LOGS_DIR as a JSON object
  --control-plane-prefix   the binding as POSIX-quoted K=V words for a command line
  -h, --help               print this help

The control root's .mam/, the registry, the audit-log root and the sessions file must be yours (or
root's) and not writable by group or others, unless listed in MAM_TRUSTED_ROOTS (`:`-separated
paths, `*` for all; docs/SECURITY.md): otherwise this prints the refused path and why, and exits 1.

Exit codes: 0 ok, 1 env file unreadable or refused, or a refused path, 2 usage.
";

#[derive(Debug, Default)]
struct Args {
    registry_dir: Option<PathBuf>,
    format: Format,
}

#[derive(Debug, Default, PartialEq)]
enum Format {
    #[default]
    Lines,
    Json,
    BindingJson,
    Prefix,
}

fn parse_args(args: Vec<OsString>) -> Result<Parsed<Args>, Failure> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let mut a = Args::default();
    while let Some(arg) = p.next()? {
        let f = match arg {
            Long("registry-dir") => {
                a.registry_dir = Some(p.value()?.into());
                continue;
            }
            Long("json") => Format::Json,
            Long("control-plane-json") => Format::BindingJson,
            Long("control-plane-prefix") => Format::Prefix,
            Short('h') | Long("help") => return Ok(Parsed::Help),
            _ => return Err(arg.unexpected().into()),
        };
        if a.format != Format::Lines {
            return Err(Failure::usage("paths: give at most one output format"));
        }
        a.format = f;
    }
    Ok(Parsed::Run(a))
}

pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let Some(a) = cli::parse_or_help(ctx, USAGE, args, parse_args)? else {
        return Ok(0);
    };
    cli::load_env(ctx)?;
    let r = paths::resolve(ctx, a.registry_dir.as_deref())?;
    let s = |p: &std::path::Path| p.to_string_lossy().into_owned();
    match a.format {
        Format::Lines => {
            ctx.say(&format!("control_root={}", s(&r.control_root)));
            ctx.say(&format!("registry={}", s(&r.registry)));
            ctx.say(&format!("logs={}", s(&r.logs)));
            ctx.say(&format!("sessions={}", s(&r.sessions)));
        }
        Format::Json => {
            let v = serde_json::json!({
                "control_root": s(&r.control_root),
                "registry": s(&r.registry),
                "logs": s(&r.logs),
                "sessions": s(&r.sessions),
            });
            ctx.say(&v.to_string());
        }
        Format::BindingJson => {
            let mut m = serde_json::Map::new();
            for (k, p) in r.binding() {
                m.insert(k.to_string(), s(p).into());
            }
            ctx.say(&serde_json::Value::Object(m).to_string());
        }
        Format::Prefix => {
            let words: Vec<String> =
                r.binding().iter().map(|(k, p)| format!("{k}={}", text::shell_quote(&s(p)))).collect();
            ctx.say(&words.join(" "));
        }
    }
    Ok(0)
}
