//! `mam attach <session>` (issue 18): brings the person to the agent's pane, from inside tmux
//! (switch-client on the agent's own server, else a nested client in a new window), from a plain
//! terminal (attach-session), or the herdr equivalent (`agent focus` inside herdr, `agent attach`
//! outside). The decision is `crate::attach::plan`; this file finds the row and runs (or prints) it.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

use crate::attach::{self, Here, Step, Target};
use crate::cli::{self, Failure, Parsed};
use crate::ctx::{ChildRole, Ctx};
use crate::paths;
use crate::session;
use crate::text;

pub const USAGE: &str = "
Usage: mam attach <session> [--print]

Brings you to the pane of agent session <session> (see `mam status`):
  tmux, from a plain terminal: select its window and pane, then `tmux -L <server> attach-session`
       (detach with your prefix, then d);
  tmux, inside tmux on the agent's server: `switch-client` to its pane;
  tmux, inside tmux on another server (agents live on their own server, `-L mam` by default,
       docs/DESIGN.md): a new window of yours runs a nested client of the agent's server;
  herdr: `herdr agent focus <pane>` inside herdr, else `herdr agent attach <pane>` (detach with
       ctrl+b q).

Options:
  --print     print the commands instead of running them, one per line
  -h, --help  print this help

Exit codes: 0 attached (or printed), 1 the pane command failed, 2 unknown or stopped session, or
a backend with no pane (the fake one).
";

#[derive(Debug, Default)]
struct Args {
    name: String,
    print: bool,
}

fn parse_args(args: Vec<OsString>) -> Result<Parsed<Args>, Failure> {
    use lexopt::prelude::*;
    let mut a = Args::default();
    let mut p = lexopt::Parser::from_args(args);
    while let Some(arg) = p.next()? {
        match arg {
            Short('h') | Long("help") => return Ok(Parsed::Help),
            Long("print") => a.print = true,
            Value(v) if a.name.is_empty() => a.name = cli::utf8("session", v)?,
            _ => return Err(arg.unexpected().into()),
        }
    }
    if a.name.is_empty() {
        return Err(Failure::usage("attach: give the session name (see mam status)"));
    }
    Ok(Parsed::Run(a))
}

/// Issue 29: the recorded server is checked like every pane call's (`pane::sock`): a plain name, and
/// a socket whose directories only this user (or root) may write, before anything is run or printed.
fn safe_server(ctx: &Ctx, t: &Target) -> Result<(), Failure> {
    use crate::pane::sock;
    if let Some(why) = sock::bad_name(&t.server) {
        return Err(Failure::refused(format!(
            "attach: session {}'s server name '{}' {why}; nothing run",
            text::one_line(&t.name),
            text::one_line(&t.server)
        )));
    }
    let path = match t.backend.as_str() {
        "tmux" => Some(sock::tmux_socket(ctx, &t.server)),
        "herdr" => sock::herdr_socket(ctx, &t.server),
        _ => None,
    };
    if let Some(p) = path {
        sock::check(&p, crate::sys::geteuid()).map_err(|e| Failure::refused(format!("attach: {e}; nothing run")))?;
    }
    Ok(())
}

pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let Some(a) = cli::parse_or_help(ctx, USAGE, args, parse_args)? else {
        return Ok(0);
    };
    cli::load_env(ctx)?;
    let resolved = paths::resolve(ctx, None)?;
    let doc = session::load(&resolved.sessions).map_err(|e| cli::session_failure("attach", &e))?;
    let Some(row) = doc.row(&a.name) else {
        let names: Vec<&str> = doc.herdr_sessions.iter().map(|r| r.name.as_str()).collect();
        let hint = match text::closest(&a.name, names.iter().copied()) {
            Some(c) => format!("; did you mean '{c}'?"),
            None if names.is_empty() => "; there are no sessions (start one with `mam create <agent>`)".into(),
            None => format!(" (sessions: {})", names.join(", ")),
        };
        return Err(Failure::usage(format!(
            "attach: unknown session '{}' in {}{hint}",
            text::one_line(&a.name),
            text::show_path(&resolved.sessions)
        )));
    };
    let target = target(ctx, row)?;
    safe_server(ctx, &target)?;
    let here = Here::from_vars(ctx.var("TMUX").as_deref(), ctx.var("HERDR_ENV").as_deref());
    let plan = attach::plan(&target, &here).map_err(|e| Failure::usage(format!("attach: {e}")))?;
    if a.print {
        for s in &plan.steps {
            ctx.say(&s.to_string());
        }
        return Ok(0);
    }
    // Issue 32: without a terminal the attach client only said tmux's `open terminal failed: not a
    // terminal`. Say what to do instead, before anything runs.
    if plan.takes_terminal && !(crate::sys::is_tty(0) && crate::sys::is_tty(1)) {
        return Err(Failure::usage(format!(
            "attach: {} needs a terminal (stdin and stdout are not one here); run it from a terminal, or \
             print the command with `mam attach {} --print`",
            text::one_line(&a.name),
            text::one_line(&a.name)
        )));
    }
    if let Some(n) = &plan.note {
        ctx.diag(n);
    }
    let (last, before) = plan.steps.split_last().ok_or_else(|| Failure::runtime("attach: empty plan"))?;
    for s in before {
        run_step(ctx, s)?;
    }
    if plan.takes_terminal {
        // The attach client owns this terminal until the person detaches: exec returns only on failure.
        let e = command(ctx, last).exec();
        return Err(Failure::runtime(format!("attach: cannot run {} ({e})", last.argv[0])));
    }
    run_step(ctx, last)?;
    Ok(0)
}

/// Where session `row` is: its backend, server and pane (usage errors for a remote or stopped row,
/// runtime errors when its server or pane is not known). Also `mam ui`'s Enter.
pub fn target(ctx: &Ctx, row: &session::Row) -> Result<Target, Failure> {
    if row.remote() {
        return Err(Failure::usage(format!("attach: session {} runs on a remote runner: no pane here", row.name)));
    }
    if !row.running() {
        return Err(Failure::usage(format!(
            "attach: session {} is {}, not running; start it again with `mam resume {}`",
            row.name,
            if row.status.is_empty() { "not started" } else { &row.status },
            row.name
        )));
    }
    let (backend, server) = session::reconcile::row_target(ctx, row)
        .ok_or_else(|| Failure::runtime(format!("attach: cannot tell which pane server session {} is on", row.name)))?;
    let pane = row
        .pane_id()
        .ok_or_else(|| Failure::runtime(format!("attach: session {} has no pane recorded", row.name)))?
        .to_string();
    Ok(Target { name: row.name.clone(), backend, server, pane })
}

/// The command of one step: the agent-role environment (no secret), the caller's cwd.
pub fn command(ctx: &Ctx, s: &Step) -> Command {
    let mut c = Command::new(&s.argv[0]);
    c.args(&s.argv[1..]).env_clear().envs(ctx.child_env_for(ChildRole::Agent));
    for (k, v) in &s.env {
        c.env(k, v);
    }
    c.current_dir(ctx.cwd());
    c
}

/// Runs one step that returns at once (within 20 s), its output captured.
pub fn run_step(ctx: &Ctx, s: &Step) -> Result<(), Failure> {
    let mut c = command(ctx, s);
    let out = crate::pane::proc::run_capture(&mut c, Duration::from_secs(20), &s.argv.join(" "))
        .map_err(|e| Failure::runtime(format!("attach: {e}")))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(Failure::runtime(format!(
            "attach: `{s}` failed: {} (is the session's pane still there? see `mam status`)",
            text::one_line(err.trim())
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args() {
        let p = |v: &[&str]| parse_args(cli::argv(v));
        assert!(matches!(p(&["w1", "--print"]), Ok(Parsed::Run(Args { print: true, .. }))));
        assert_eq!(p(&[]).unwrap_err().rc, 2);
        assert_eq!(p(&["a", "b"]).unwrap_err().rc, 2);
    }
}
