//! `mam monitor [start|stop|status]` (ORCH 2.1, decided): a thin front over `mam daemon
//! ensure|stop|status --workspace <control root>`, run as a child of this binary so the daemon keeps
//! one implementation. The exit code is the daemon command's; its output is labelled for a person
//! (issue 18): `daemon for <root>: running, pid N` or `... not running (...)`. Scripts that want
//! the bare pid use `mam daemon status|ensure --workspace <root>`.

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
<root>`. Prints `daemon for <root>: running, pid <N>` or `daemon for <root>: not running (start it
with `mam monitor start`)`; `stop` prints `stopped daemon <N>`. For the bare pid, use `mam daemon`.

`stop` also stops each herdr server mam started for this control root (mam bootstrapped it for a
`create`) on which no agent is left, with a NOTE naming it, as `mam stop` does with the last
agent; a server you started, or one an agent still runs on, is never stopped.

Options:
  -h, --help  print this help

Exit codes: 0 ok (also `stop` with no daemon running), 1 runtime error (the env file, the control
root, the daemon failed to start or to stop), 2 usage. Never 5: `start` reports a daemon that
already runs.
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
    for l in out.stderr.lines() {
        ctx.diag(l);
    }
    for l in label(verb, &root, &out.stdout, out.rc) {
        ctx.say(&l);
    }
    if verb == "stop" && out.rc == 0 {
        stop_idle_servers(ctx);
    }
    Ok(out.rc)
}

/// Issue 32: a herdr server mam started for this control root stops with the monitor once none of
/// mam's agents is left on it (`Backend::stop_server_if_ours`: never a server the user started,
/// never one with an agent). One NOTE per stopped server, one WARNING per server that would not
/// stop; the exit code stays the daemon's.
fn stop_idle_servers(ctx: &Ctx) {
    let mut ctx = ctx.clone();
    ctx.set_var("MAM_NO_AUTOSTART", Some("1".as_ref()));
    for server in crate::pane::herdr::servers_mam_started(&ctx) {
        let Ok(b) = crate::pane::open_named(&ctx, "herdr", Some(&server)) else { continue };
        match b.stop_server_if_ours() {
            Ok(true) => ctx.diag(&format!("NOTE: herdr server {server} stopped (mam started it; no agent is left)")),
            Ok(false) => {}
            Err(e) => ctx.diag(&format!("WARNING: herdr server {server}: not stopped ({e})")),
        }
    }
}

/// The daemon command's stdout in words: a bare pid is the running daemon's; no output from
/// `status` means none runs.
fn label(verb: &str, root: &str, stdout: &str, rc: i32) -> Vec<String> {
    let lines: Vec<&str> = stdout.lines().collect();
    let pid = match lines.as_slice() {
        [one] if one.bytes().all(|b| b.is_ascii_digit()) && !one.is_empty() => Some(*one),
        _ => None,
    };
    match (pid, verb) {
        (Some(pid), _) => vec![format!("daemon for {root}: running, pid {pid}")],
        (None, "status") if lines.is_empty() && rc == 0 => {
            vec![format!("daemon for {root}: not running (start it with `mam monitor start`)")]
        }
        _ => lines.into_iter().map(String::from).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::label;

    #[test]
    fn output_is_labelled() {
        assert_eq!(label("status", "/w", "42\n", 0), ["daemon for /w: running, pid 42"]);
        assert_eq!(label("ensure", "/w", "42\n", 0), ["daemon for /w: running, pid 42"]);
        assert_eq!(label("status", "/w", "", 0), ["daemon for /w: not running (start it with `mam monitor start`)"]);
        assert_eq!(label("stop", "/w", "stopped daemon 42\n", 0), ["stopped daemon 42"]);
        assert!(label("ensure", "/w", "", 0).is_empty());
    }
}
