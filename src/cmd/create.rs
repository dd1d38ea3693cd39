//! `mam create` (ORCH 2.3): start a named agent session in a pane bound to this control plane.
//! Parsing validates only; the flow is `crate::session::create`.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::cli::{self, Failure, Parsed};
use crate::ctx::Ctx;
use crate::delegate::onboard;
use crate::mqtt::MqttConfig;
use crate::session::create::{create, CreateArgs};
use crate::session::Notes;
use crate::text;

/// How long `mam create` waits for a broker to answer before it warns.
const PROBE: std::time::Duration = std::time::Duration::from_secs(2);

pub const USAGE: &str = "
Usage: mam create <agent> [--name N] [--workspace DIR] [--onboard | --no-onboard] [--label L]
                  [-- AGENT_ARGS...]

Starts agent <agent> in a pane (workspace packing of `mam pane new-session`) and records it in the sessions file with its control-plane binding. When
DIR is not the control root, the binding (WORKSPACE_ROOT, AGENT_SESSIONS_YAML, MAM_JOBS_DIR,
DELEGATE_JOB_LOGS_DIR) is forwarded to the pane as --env on the pane creation.
Then ensures the control root's daemon (`mam daemon ensure`) and onboards the agent.

Agents: {KINDS}. `pretend` is mam's own pretend agent, to try mam without an agent CLI
(`mam pretend-agent --help`); a missing CLI is refused with the way to install it. Outside a control
root (no .mam/ here or above, no WORKSPACE_ROOT) create is refused: set one up with `mam install`.

Options:
  --name N          session name [a-z][a-z0-9_-]{0,31} (default <agent>-NN, lowest free NN)
  --workspace DIR   the agent's directory (default: the cwd)
  --onboard         delegate the onboarding job (default)
  --no-onboard      skip onboarding
  --label L         workspace label (default MAM_WS_LABEL)
  -h, --help        print this help

Stdout: SESSION=<name> PANE=<id> WORKSPACE=<id> CWD=<dir>, then ONBOARD_JOB=<jid> and
DAEMON_PID=<pid> when there are such values. When no broker answers within 2 s, one WARNING says
so and how to start one (the session works; its jobs are followed through events.log only).
Stderr ends with a NOTE naming `mam attach <name>`, the way to look at the agent's pane.

Environment: WORKSPACE_ROOT, AGENT_SESSIONS_YAML, MAM_JOBS_DIR, DELEGATE_JOB_LOGS_DIR,
MAM_NO_SUBSCRIBER_DAEMON (only `1` opts out), MAM_NO_AUTOSTART, MAM_WS_LABEL, MAM_PANE_BACKEND.

Exit codes: 0 created, 1 start failure (verified rollback ran), 2 refused before any change
(unknown agent, agent CLI not installed, no control root, bad or running name, missing
directory, binding not computable for a worktree, a forwarded binding path with whitespace,
sessions file not JSON).
";

fn parse_args(mut raw: Vec<OsString>) -> Result<Parsed<CreateArgs>, Failure> {
    use lexopt::prelude::*;
    let mut a = CreateArgs { onboard: true, ..CreateArgs::default() };
    if let Some(i) = raw.iter().position(|x| x == "--") {
        for x in raw.split_off(i).into_iter().skip(1) {
            a.agent_args.push(cli::utf8("AGENT_ARGS", x)?);
        }
    }
    let mut p = lexopt::Parser::from_args(raw);
    while let Some(arg) = p.next()? {
        match arg {
            Short('h') | Long("help") => return Ok(Parsed::Help),
            Value(v) if a.kind.is_empty() => a.kind = cli::utf8("agent", v)?,
            Long("name") => a.name = Some(cli::utf8("--name", p.value()?)?),
            Long("workspace") => a.workspace = Some(PathBuf::from(p.value()?)),
            Long("onboard") => a.onboard = true,
            Long("no-onboard") => a.onboard = false,
            Long("label") => a.label = Some(cli::utf8("--label", p.value()?)?),
            _ => return Err(arg.unexpected().into()),
        }
    }
    if a.kind.is_empty() {
        return Err(Failure::usage("create: give the agent kind (see mam create --help)"));
    }
    Ok(Parsed::Run(a))
}

pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    // The kinds come from the adapter table (issue 32: the help listed six of them).
    let usage = USAGE.replace("{KINDS}", &crate::agents::kinds().join(", "));
    let Some(a) = cli::parse_or_help(ctx, &usage, args, parse_args)? else {
        return Ok(0);
    };
    cli::load_env(ctx)?;
    cli::need_control_root(ctx, "create")?;
    let mut notes = Notes::default();
    let r = create(ctx, &a, &mut notes, &mut onboard::onboard);
    // Issue 18: say how to look at the agent (stdout stays KEY=VALUE lines for scripts).
    let name = r.as_ref().ok().and_then(|lines| {
        lines.iter().find_map(|l| l.strip_prefix("SESSION=")?.split_whitespace().next()).map(str::to_string)
    });
    let rc = super::session::finish(ctx, "create", notes, r)?;
    if name.is_some() {
        warn_without_broker(ctx);
    }
    if let Some(name) = name {
        ctx.diag(&format!(
            "NOTE: look at the agent's pane with `mam attach {name}` (`mam attach {name} --print` shows the command)"
        ));
    }
    Ok(rc)
}

/// Issue 32 item 4: a session whose jobs no broker will carry says so, in one line, with how to
/// start one (jobs still work, followed through events.log, but nothing reaches the wire).
fn warn_without_broker(ctx: &Ctx) {
    let Ok(cfg) = MqttConfig::from_ctx(ctx) else { return };
    if let Err(e) = crate::mqtt::client::probe(&cfg, PROBE) {
        ctx.diag(&format!(
            "WARNING: no broker answers at {} ({}); jobs are followed through events.log only: start one \
             with `mam broker &` in this repository, or set MQTT_BROKER",
            cfg.addr(),
            text::one_line(&e.brief())
        ));
    }
}
