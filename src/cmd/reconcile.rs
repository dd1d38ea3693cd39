//! `mam reconcile` (A19, ORCH 2.1, 2.7): with `--subscribe [--idle-timeout S]` it becomes the
//! control root's subscriber daemon by exec'ing `mam daemon run --workspace <control root> ...`, so
//! the process keeps its pid and has the one argv shape that `daemon status|stop` and the test
//! reaper recognise (CORE 10.3). Without `--subscribe` it is the one-shot session reconcile of
//! ORCH 2.7 (`session::reconcile::reconcile_once`); this file only prints its lines.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::Command;

use crate::cli::{self, Failure, Parsed};
use crate::ctx::{ChildRole, Ctx};
use crate::{knob, paths};

pub const USAGE: &str = "
Usage: mam reconcile [--once]
       mam reconcile --subscribe [--idle-timeout S] [--registry-dir D]

Without --subscribe: the one-shot reconcile of the sessions file (ORCH 2.7). Every pane server
that a running local row names is listed without starting it (MAM_NO_AUTOSTART=1); a row whose
agent is missing from a confirmed list (or whose server is down) becomes `exited`; a server whose
state is unknown changes no status. Prints one line per server, then one per row that changed.

With --subscribe, runs the subscriber daemon for the control root (the legacy
`reconcile.sh --subscribe`): exactly `mam daemon run --workspace <control root>` with the registry
and log root resolved here (absolute). --idle-timeout S exits after S seconds without a message
(0 = run forever, the default). See `mam daemon --help`.

Options:
  --once              the one-shot reconcile, said explicitly (the legacy `reconcile.sh --once`)
  --subscribe         run the subscriber daemon for the control root
  --idle-timeout S    exit after S seconds without any message (0 = never)
  --registry-dir D    the job registry (relative to the cwd)
  -h, --help          print this help

Exit codes: one-shot: 0 done, 1 I/O, 2 usage or a sessions file that is not JSON, 3 some server's
state was unknown. --subscribe: as `mam daemon run`: 0 clean stop, 5 another daemon holds the
lock; with MAM_LEGACY_SIGNAL_RC=1 (the reconcile.sh shim sets it) a signal ends it as the legacy
trap did: 130 SIGINT, 143 SIGTERM; 2 usage.
";

#[derive(Debug, Default)]
struct Args {
    subscribe: bool,
    once: bool,
    idle_timeout: Option<u32>,
    registry_dir: Option<std::path::PathBuf>,
}

fn parse_args(args: Vec<OsString>) -> Result<Parsed<Args>, Failure> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let mut a = Args::default();
    while let Some(arg) = p.next()? {
        match arg {
            Long("subscribe") => a.subscribe = true,
            Long("once") => a.once = true,
            Long("idle-timeout") => a.idle_timeout = Some(knob::flag("--idle-timeout", &p.value()?, 0)?),
            Long("registry-dir") => a.registry_dir = Some(p.value()?.into()),
            Short('h') | Long("help") => return Ok(Parsed::Help),
            _ => return Err(arg.unexpected().into()),
        }
    }
    if a.once && a.subscribe {
        return Err(Failure::usage("mam reconcile: --once is the one-shot reconcile; it excludes --subscribe"));
    }
    if !a.subscribe && (a.idle_timeout.is_some() || a.registry_dir.is_some()) {
        return Err(Failure::usage("mam reconcile: --idle-timeout and --registry-dir need --subscribe"));
    }
    Ok(Parsed::Run(a))
}

pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let Some(a) = cli::parse_or_help(ctx, USAGE, args, parse_args)? else {
        return Ok(0);
    };
    cli::load_env(ctx)?;
    if !a.subscribe {
        let r =
            crate::session::reconcile::reconcile_once(ctx).map_err(|e| crate::cli::session_failure("reconcile", &e))?;
        for l in r.lines() {
            ctx.say(&l);
        }
        // Issue 18: silence is not an answer a person can read.
        if r.servers.is_empty() {
            ctx.say("nothing to do: no sessions to reconcile");
        } else if r.exited.is_empty() && !r.any_unknown() {
            ctx.say("nothing to do: every session matches its pane");
        }
        return Ok(r.rc());
    }
    let root = paths::control_root(ctx)?;
    let store = super::daemon::resolve_store(ctx, &root, a.registry_dir.as_deref(), None)?;
    let exe = std::env::current_exe().map_err(|e| Failure::runtime(format!("cannot find the mam binary ({e})")))?;
    let mut cmd = Command::new(exe);
    cmd.arg("daemon")
        .arg("run")
        .arg("--workspace")
        .arg(&root)
        .arg("--registry-dir")
        .arg(&store.registry)
        .arg("--logs-dir")
        .arg(&store.logs)
        .arg("--idle-timeout")
        .arg(a.idle_timeout.unwrap_or(0).to_string())
        .env_clear()
        .envs(ctx.child_env_for(ChildRole::BrokerClient));
    // The reconcile.sh shim's request for the legacy exit code on a signal (143 on SIGTERM).
    if ctx.var("MAM_LEGACY_SIGNAL_RC").as_deref() == Some("1") {
        cmd.env("MAM_LEGACY_SIGNAL_RC", "1");
    }
    // exec only returns on failure.
    let e = cmd.exec();
    Err(Failure::runtime(format!("cannot exec mam daemon run ({e})")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn daemon_flags_need_subscribe() {
        assert!(matches!(parse_args(vec![]).unwrap(), Parsed::Run(Args { subscribe: false, .. })));
        let e = parse_args(vec!["--idle-timeout".into(), "5".into()]).unwrap_err();
        assert_eq!(e.rc, 2);
        assert_eq!(e.line, "ERROR: mam reconcile: --idle-timeout and --registry-dir need --subscribe");
        let ok = parse_args(vec!["--subscribe".into(), "--idle-timeout".into(), "5".into()]).unwrap();
        assert!(matches!(ok, Parsed::Run(Args { subscribe: true, idle_timeout: Some(5), .. })));
    }
}
