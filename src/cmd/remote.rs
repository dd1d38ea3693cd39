//! `mam remote dispatch|run` (CORE 9; A5, A12, A21): the orchestrator publishes a signed, retained
//! dispatch for a remote job; a runner serving that session executes it and reports its events.
//! The logic lives in `remote`; this file parses, loads the environment, checks the secret and maps
//! outcomes to exit codes.
//!
//! Neither side ever prints, logs or passes on MAM_DISPATCH_SECRET.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::cli::{self, Failure, Parsed};
use crate::clock;
use crate::ctx::{ChildRole, Ctx};
use crate::heartbeat::arm;
use crate::knob;
use crate::mqtt::{self, Client, Message, MqttConfig, RetryPolicy, Role, Stop};
use crate::paths;
use crate::registry::store::Store;
use crate::remote::dispatch;
use crate::remote::runner::{self, Runner, RunnerError};
use crate::sys;
use crate::text;
use crate::wire::Settings;

pub const USAGE: &str = "
Usage: mam remote dispatch --job-id ID [--registry-dir D] [--brief-file F]
       mam remote run --session NAME --exec CMD [--registry-dir D] [--timeout S] [--once]

dispatch  publishes the signed, retained dispatch of a remote job's current attempt on
          <topic_prefix>/dispatch/<attempt> (QoS 1). The job needs transport=remote and
          agent_session=remote:<name>. The brief (at most 768 KiB) is --brief-file, else the
          record's brief_path, else <registry>/<job_id>/brief.md, else empty.
run       serves remote:NAME: subscribes to <root>/jobs/+/dispatch/+, mirrors each admitted job
          into the registry, writes <registry>/<job_id>/brief.md, publishes started and arms the
          job's heartbeat timer (heartbeat_sec, watching this runner's pid), runs
          `sh -c CMD` in its own process group (stdin /dev/null; env MAM_JOB_ID MAM_ATTEMPT
          MAM_BRIEF_FILE MAM_REPORT_FILE MAM_REGISTRY_DIR; output to <logs>/<job_id>/exec.log) and
          publishes completed, failed (data.rc) or error (data.reason timeout|interrupted) with the
          last 256 KiB of MAM_REPORT_FILE as data.report; then clears the attempt's dispatch.
          One job at a time. SIGINT/SIGTERM stop a running job's group and exit 0.

Options:
  --job-id ID        the job to dispatch
  --brief-file F     the brief to send inline
  --session NAME     serve dispatches for agent_session remote:NAME
  --exec CMD         the command run for each job (through sh -c)
  --timeout S        a job's time limit when its dispatch says 0 (default 3600)
  --once             serve one job, then exit
  --registry-dir D   the job registry (relative to the cwd); else MAM_JOBS_DIR; else
                     <control root>/.mam/jobs
  -h, --help         print this help

Env: MAM_DISPATCH_SECRET (required on both sides), MQTT_* (CORE 3.1).

Exit codes: 0 ok, 1 runtime error (missing secret, unknown or non-remote job, I/O), 2 usage,
3 broker failure after retries.
";

#[derive(Debug)]
enum Sub {
    Dispatch { job_id: String, brief_file: Option<PathBuf> },
    Run { session: String, exec: String, timeout: Option<u32>, once: bool },
}

#[derive(Debug)]
struct Args {
    registry_dir: Option<PathBuf>,
    sub: Sub,
}

fn parse_args(args: Vec<OsString>) -> Result<Parsed<Args>, Failure> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let mut sub: Option<String> = None;
    let (mut job_id, mut brief_file, mut session, mut exec, mut timeout, mut once) =
        (None, None, None, None, None, false);
    let mut registry_dir = None;
    let mut seen: Vec<&'static str> = Vec::new();
    while let Some(arg) = p.next()? {
        match arg {
            Value(v) if sub.is_none() => sub = Some(cli::utf8("subcommand", v)?),
            Long("job-id") => {
                let v = cli::utf8("--job-id", p.value()?)?;
                if !clock::valid_job_id(&v) {
                    return Err(Failure::usage(format!("--job-id: invalid job id '{}'", text::one_line(&v))));
                }
                seen.push("--job-id");
                job_id = Some(v);
            }
            Long("brief-file") => {
                seen.push("--brief-file");
                brief_file = Some(PathBuf::from(p.value()?));
            }
            Long("session") => {
                let v = cli::utf8("--session", p.value()?)?;
                let name = v.strip_prefix("remote:").unwrap_or(&v).to_string();
                if !clock::valid_session(&format!("remote:{name}")) || name.is_empty() {
                    return Err(Failure::usage(format!("--session: invalid session name '{}'", text::one_line(&v))));
                }
                seen.push("--session");
                session = Some(name);
            }
            Long("exec") => {
                seen.push("--exec");
                exec = Some(cli::utf8("--exec", p.value()?)?);
            }
            Long("timeout") => {
                seen.push("--timeout");
                timeout = Some(knob::flag("--timeout", &p.value()?, 1)?);
            }
            Long("once") => {
                seen.push("--once");
                once = true;
            }
            Long("registry-dir") => registry_dir = Some(PathBuf::from(p.value()?)),
            Short('h') | Long("help") => return Ok(Parsed::Help),
            _ => return Err(arg.unexpected().into()),
        }
    }
    let allowed: &[&str] = match sub.as_deref() {
        Some("dispatch") => &["--job-id", "--brief-file"],
        Some("run") => &["--session", "--exec", "--timeout", "--once"],
        Some(other) => {
            return Err(Failure::usage(format!(
                "remote: unknown subcommand '{}' (expected dispatch or run)",
                text::one_line(other)
            )))
        }
        None => return Err(Failure::usage("remote: a subcommand is required (dispatch or run)")),
    };
    if let Some(flag) = seen.iter().find(|f| !allowed.contains(f)) {
        return Err(Failure::usage(format!("remote {}: {flag} is not accepted here", sub.unwrap_or_default())));
    }
    let sub = if sub.as_deref() == Some("dispatch") {
        Sub::Dispatch {
            job_id: job_id.ok_or_else(|| Failure::usage("remote dispatch: --job-id is required"))?,
            brief_file,
        }
    } else {
        Sub::Run {
            session: session.ok_or_else(|| Failure::usage("remote run: --session is required"))?,
            exec: exec.ok_or_else(|| Failure::usage("remote run: --exec is required"))?,
            timeout,
            once,
        }
    };
    Ok(Parsed::Run(Args { registry_dir, sub }))
}

pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let Some(a) = cli::parse_or_help(ctx, USAGE, args, parse_args)? else {
        return Ok(0);
    };
    cli::load_env(ctx)?;
    let secret = ctx
        .var_nonempty("MAM_DISPATCH_SECRET")
        .map(String::into_bytes)
        .ok_or_else(|| Failure::runtime("MAM_DISPATCH_SECRET is not set"))?;
    let resolved = paths::resolve(ctx, a.registry_dir.as_deref())?;
    let store = Store::from_resolved(&resolved);
    match a.sub {
        Sub::Dispatch { job_id, brief_file } => dispatch_job(ctx, &store, &secret, &job_id, brief_file),
        Sub::Run { session, exec, timeout, once } => serve(ctx, store, secret, session, exec, timeout, once),
    }
}

fn dispatch_job(
    ctx: &Ctx,
    store: &Store,
    secret: &[u8],
    job_id: &str,
    brief_file: Option<PathBuf>,
) -> Result<i32, Failure> {
    let rec = store.read_existing(job_id).map_err(Failure::runtime)?;
    let transport = rec.str("transport").unwrap_or("local");
    let session = rec.str("agent_session").unwrap_or("");
    if transport != "remote" || !session.starts_with("remote:") {
        return Err(Failure::runtime(format!(
            "job {job_id} is not a remote job (transport={transport}, agent_session={})",
            text::one_line(session)
        )));
    }
    let brief_path = match brief_file {
        Some(f) => Some(sys::absolutize(ctx.cwd(), &f)),
        None => rec
            .str("brief_path")
            .map(PathBuf::from)
            .filter(|p| p.exists())
            .or_else(|| Some(store.registry.join(job_id).join("brief.md")).filter(|p| p.exists())),
    };
    let brief = match &brief_path {
        Some(p) => {
            let bytes = std::fs::read(p)
                .map_err(|e| Failure::runtime(format!("{}: cannot read the brief ({e})", text::show_path(p))))?;
            if bytes.len() > dispatch::MAX_BRIEF {
                return Err(Failure::usage(format!(
                    "{}: the brief is {} bytes; a dispatch carries at most {} (768 KiB)",
                    text::show_path(p),
                    bytes.len(),
                    dispatch::MAX_BRIEF
                )));
            }
            String::from_utf8(bytes)
                .map_err(|_| Failure::runtime(format!("{}: the brief is not UTF-8", text::show_path(p))))?
        }
        None => String::new(),
    };
    let payload = dispatch::payload(&rec, &brief, clock::now_ms(), secret).map_err(Failure::runtime)?;
    let bytes = serde_json::to_vec(&payload).map_err(|e| Failure::runtime(format!("cannot encode: {e}")))?;
    let attempt = rec.attempt().unwrap_or(1);
    let env_cfg = MqttConfig::from_ctx(ctx)?;
    let cfg = match rec.get("broker").and_then(|b| serde_json::from_value::<mqtt::BrokerBlock>(b.clone()).ok()) {
        Some(block) => {
            let (cfg, warning) = env_cfg.for_block(&block);
            if let Some(w) = warning {
                ctx.diag(&w);
            }
            cfg
        }
        None => env_cfg,
    };
    let prefix = rec.str("topic_prefix").map_or_else(|| format!("{}/jobs/{job_id}", cfg.topic_root), str::to_string);
    let topic = dispatch::topic(&prefix, attempt);
    let sent = mqtt::with_retry(
        &RetryPolicy::standard("publish"),
        &Stop::never(),
        |w| ctx.diag(&w),
        |_| {
            let mut c = Client::connect(&cfg, Role::Dsp, &Stop::never())?;
            c.publish(&Message::new(topic.clone(), bytes.clone(), 1, true))?;
            c.disconnect();
            Ok(())
        },
    );
    match sent {
        Ok(()) => {
            ctx.say(&format!("dispatched job={job_id} attempt={attempt} session={session} topic={topic}"));
            Ok(0)
        }
        Err(e) => Err(Failure::wire(format!("dispatch of job {job_id}: {e}"))),
    }
}

fn serve(
    ctx: &Ctx,
    store: Store,
    secret: Vec<u8>,
    session: String,
    exec: String,
    timeout: Option<u32>,
    once: bool,
) -> Result<i32, Failure> {
    sys::install_stop_handlers().map_err(|e| Failure::runtime(format!("cannot install signal handlers: {e}")))?;
    let grace_ms = knob::env_or(ctx, "MAM_RUNNER_GRACE_MS", 1, 5000)?;
    let settings = Settings::for_registry(ctx, Some(&store.registry))?;
    // The timer signs with the job's auth token (`base_spec` gives it no dispatch secret).
    let timer = arm::base_spec(ctx, &settings).map_err(Failure::runtime)?;
    let r = Runner {
        session,
        exec,
        store,
        settings,
        timer,
        secret,
        default_timeout: Duration::from_secs(timeout.map_or(3600, u64::from)),
        once,
        grace: Duration::from_millis(grace_ms.into()),
        // The job is an agent: it reports through the runner and gets no secret.
        child_env: ctx.child_env_for(ChildRole::Agent),
    };
    let out = ctx.clone();
    let log: runner::Log = Arc::new(move |line: &str| {
        // Diagnostics keep their prefix at the start of the stderr line; the rest is the runner log.
        if ["ERROR: ", "WARNING: ", "REFUSED: ", "NOTE: "].iter().any(|p| line.starts_with(p)) {
            out.diag(line);
        } else {
            out.say(&format!("{} {line}", clock::now_ts()));
        }
    });
    match runner::run(&r, log) {
        Ok(()) => Ok(0),
        Err(RunnerError::Connect(e)) => Err(Failure::wire(format!("remote run: {e}"))),
        Err(e) => Err(Failure::runtime(format!("remote run: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subcommands_and_their_flags() {
        assert_eq!(parse_args(cli::argv(&[])).unwrap_err().rc, 2);
        assert_eq!(parse_args(cli::argv(&["bogus"])).unwrap_err().rc, 2);
        assert_eq!(parse_args(cli::argv(&["dispatch"])).unwrap_err().rc, 2);
        assert_eq!(parse_args(cli::argv(&["dispatch", "--job-id", "j", "--once"])).unwrap_err().rc, 2);
        assert_eq!(parse_args(cli::argv(&["run", "--session", "s"])).unwrap_err().rc, 2);
        assert_eq!(
            parse_args(cli::argv(&["run", "--session", "s", "--exec", "true", "--timeout", "0"])).unwrap_err().rc,
            2
        );
        let Parsed::Run(a) =
            parse_args(cli::argv(&["run", "--session", "remote:box", "--exec", "true", "--once"])).unwrap()
        else {
            panic!("help")
        };
        match a.sub {
            Sub::Run { session, once, .. } => assert_eq!((session.as_str(), once), ("box", true)),
            other => panic!("{other:?}"),
        }
    }
}
