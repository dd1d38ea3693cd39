//! `mam delegate-job` (ORCH 3; A9-A15): hand a job to a session and wait for its verdict and report.
//! Parsing validates only; the flow is `crate::delegate`. This file reads the knobs (flags over env),
//! the brief file, prints the flow's diagnostics as they happen and the last stdout line
//! `JOB_ID=<jid> STATUS=<status> REPORT=<abs>`.

use std::ffi::OsString;
use std::io::Read;
use std::path::PathBuf;

use crate::cli::{self, Failure, Parsed};
use crate::clock;
use crate::ctx::Ctx;
use crate::delegate::{self, DeadlineSource, Request, MAX_TASK};
use crate::knob;
use crate::sys;
use crate::text;

pub const USAGE: &str = "
Usage: mam delegate-job --session NAME|remote:NAME --brief-file PATH [options]

Hands one job to one session and waits, from evidence on disk and on the wire, until it ends:
registers the job (with this process as its watcher), writes <registry>/<jid>/brief.md (the task,
the liveness contract, the absolute report path and the publish commands), starts the job's
subscriber (`mam watch`), injects `Job <jid>: read and follow <brief>. Run first: <start command>`
into the session's pane (a remote:NAME session gets a signed dispatch instead), waits for `started`
within T of the injection, then closes the job when it goes silent for the idle window or passes
its deadline. The report is <registry>/<jid>/report.md.

Options:
  --session NAME        a running session of the sessions file, or remote:NAME (a remote runner)
  --brief-file PATH     the task text (UTF-8, not empty, at most 1 MiB; 760 KiB for remote:)
  --timeout S           the job's deadline in seconds (MAM_DELEGATE_TIMEOUT_S, 1800); 0 = none
  --heartbeat N         heartbeat interval (MAM_HEARTBEAT_SEC, 30)
  --heartbeat-misses K  missed beats before unresponsive (MAM_HEARTBEAT_MISSES, 4)
  --ack-timeout T       seconds for `started` after the injection (MAM_ACK_TIMEOUT_S, 300)
  --idle-timeout S      the idle window (0 or absent: K x N)
  --registry-dir D      the job registry (relative to the cwd); else MAM_JOBS_DIR; else
                        <control root>/.mam/jobs
  --type task|loop|discuss
                        the job type (default task)
  --job-id JID          re-dispatch this job (next iteration through the engine), or register it
  --parent JID          the parent job (MAM_PARENT_JOB_ID)
  --deadline-source job|wall-clock
                        which limit the deadline is: deadline_timeout (job) or wall_clock_timeout
  --orchestrator ID     the orchestrator the record names (else the caller's session id when
                        listed in orchestrator_uuids, else the parent's; A42)
  --context-file PATH   a block rendered in brief.md before the task (the review loop's
                        [worktree context]; same limits as --brief-file)
  --detach              return once the prompt is delivered (rc 0, the last line's STATUS is the
                        job's status then); the job runs on under the control root's daemon
                        (which closes it within N + 2 s when its agent's process ends, and beats
                        for a sandboxed agent) and `mam wait <JOB_ID>` gives its verdict
  -h, --help            print this help

Also read: SKS_DELIVERY_GRACE_S and the other send-keys-safe knobs of `mam pane`,
DELEGATE_JOB_LOGS_DIR, WORKSPACE_ROOT, AGENT_SESSIONS_YAML, MQTT_*, MAM_DISPATCH_SECRET (remote),
the env file. MAM_INJECT_ACK_GRACE_S is accepted and has no effect (T decides).

Stdout (last line): JOB_ID=<jid> STATUS=<status> REPORT=<abs report path, or - when the agent
wrote none>

Exit codes: 0 completed with a report (--detach: delivered), 1 error or failed, completed without report, env-file or
internal failure, 2 usage, invalid knob, brief file refused, session refused (nothing registered),
3 agent_blocked (not submitted, or no started within T), 4 deadline_timeout (deadline or
unresponsive) or wall_clock_timeout, 5 broker_unavailable, 6 cancelled (the session was stopped),
130/143 interrupted by SIGINT/SIGTERM (the job stays open; the daemon closes it when silent).
";

#[derive(Debug, Default)]
struct Args {
    session: Option<String>,
    brief_file: Option<PathBuf>,
    timeout: Option<u32>,
    heartbeat: Option<u32>,
    misses: Option<u32>,
    ack: Option<u32>,
    idle: Option<u32>,
    registry_dir: Option<PathBuf>,
    job_type: Option<String>,
    job_id: Option<String>,
    parent: Option<String>,
    deadline_source: DeadlineSource,
    context_file: Option<PathBuf>,
    orchestrator: Option<String>,
    detach: bool,
}

fn job_id_flag(flag: &str, v: OsString) -> Result<String, Failure> {
    let v = cli::utf8(flag, v)?;
    if clock::valid_job_id(&v) {
        Ok(v)
    } else {
        Err(Failure::usage(format!("{flag}: invalid job id '{}'", text::one_line(&v))))
    }
}

fn parse_args(args: Vec<OsString>) -> Result<Parsed<Args>, Failure> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let mut a = Args::default();
    while let Some(arg) = p.next()? {
        match arg {
            Short('h') | Long("help") => return Ok(Parsed::Help),
            Long("session") => a.session = Some(cli::utf8("--session", p.value()?)?),
            Long("brief-file") => a.brief_file = Some(PathBuf::from(p.value()?)),
            Long("timeout") => a.timeout = Some(knob::flag("--timeout", &p.value()?, 0)?),
            Long("heartbeat") => a.heartbeat = Some(knob::flag("--heartbeat", &p.value()?, 1)?),
            Long("heartbeat-misses") => a.misses = Some(knob::flag("--heartbeat-misses", &p.value()?, 1)?),
            Long("ack-timeout") => a.ack = Some(knob::flag("--ack-timeout", &p.value()?, 1)?),
            Long("idle-timeout") => a.idle = Some(knob::flag("--idle-timeout", &p.value()?, 0)?),
            Long("registry-dir") => a.registry_dir = Some(PathBuf::from(p.value()?)),
            Long("type") => a.job_type = Some(super::registry::type_arg(cli::utf8("--type", p.value()?)?)?),
            Long("orchestrator") => {
                a.orchestrator = Some(super::registry::orchestrator_arg(cli::utf8("--orchestrator", p.value()?)?)?)
            }
            Long("detach") => a.detach = true,
            Long("context-file") => a.context_file = Some(PathBuf::from(p.value()?)),
            Long("job-id") => a.job_id = Some(job_id_flag("--job-id", p.value()?)?),
            Long("parent") => a.parent = Some(job_id_flag("--parent", p.value()?)?),
            Long("deadline-source") => {
                a.deadline_source = match cli::utf8("--deadline-source", p.value()?)?.as_str() {
                    "job" => DeadlineSource::Job,
                    "wall-clock" => DeadlineSource::WallClock,
                    other => {
                        return Err(Failure::usage(format!(
                            "--deadline-source: invalid value '{}' (expected job or wall-clock)",
                            text::one_line(other)
                        )))
                    }
                }
            }
            _ => return Err(arg.unexpected().into()),
        }
    }
    if a.session.is_none() {
        return Err(Failure::usage("delegate-job: --session is required"));
    }
    if a.brief_file.is_none() {
        return Err(Failure::usage("delegate-job: --brief-file is required"));
    }
    Ok(Parsed::Run(a))
}

/// The task text: a readable regular file, UTF-8 without NUL, not blank, at most `MAX_TASK` bytes.
/// Every refusal is rc 2 naming the file; nothing is registered.
fn read_task(ctx: &Ctx, flag: &str, path: &std::path::Path) -> Result<String, Failure> {
    let abs = sys::absolutize(ctx.cwd(), path);
    let shown = text::show_path(&abs);
    let refuse = |why: String| Failure::usage(format!("{flag} {shown}: {why}; nothing registered"));
    let f = std::fs::File::open(&abs).map_err(|e| refuse(format!("cannot read ({e})")))?;
    let meta = f.metadata().map_err(|e| refuse(format!("cannot read ({e})")))?;
    if !meta.is_file() {
        return Err(refuse("not a regular file".into()));
    }
    let mut bytes = Vec::new();
    f.take(MAX_TASK as u64 + 1).read_to_end(&mut bytes).map_err(|e| refuse(format!("cannot read ({e})")))?;
    if bytes.len() > MAX_TASK {
        return Err(refuse(format!(
            "larger than {} bytes (1 MiB); put bulky material in files the brief names",
            MAX_TASK
        )));
    }
    if bytes.contains(&0) {
        return Err(refuse("binary content (NUL bytes); a brief is text".into()));
    }
    let text = String::from_utf8(bytes).map_err(|_| refuse("not UTF-8 text".into()))?;
    if text.trim().is_empty() {
        return Err(refuse("empty".into()));
    }
    Ok(text)
}

pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let Some(a) = cli::parse_or_help(ctx, USAGE, args, parse_args)? else {
        return Ok(0);
    };
    cli::load_env(ctx)?;
    cli::need_control_root(ctx, "delegate-job")?;
    let session = a.session.clone().unwrap_or_default();
    let mut req = Request::new(&session, "");
    req.timeout_s = match a.timeout {
        Some(v) => v,
        None => knob::env_or(ctx, "MAM_DELEGATE_TIMEOUT_S", 0, 1800)?,
    };
    req.heartbeat_sec = match a.heartbeat {
        Some(v) => v,
        None => knob::env_or(ctx, "MAM_HEARTBEAT_SEC", 1, 30)?,
    };
    req.heartbeat_misses = match a.misses {
        Some(v) => v,
        None => knob::env_or(ctx, "MAM_HEARTBEAT_MISSES", 1, 4)?,
    };
    req.ack_timeout_s = match a.ack {
        Some(v) => v,
        None => knob::env_or(ctx, "MAM_ACK_TIMEOUT_S", 1, 300)?,
    };
    req.idle_timeout_s = a.idle;
    req.registry_dir = a.registry_dir.clone();
    req.job_type = a.job_type.clone().unwrap_or_else(|| "task".into());
    req.job_id = a.job_id.clone();
    req.deadline_source = a.deadline_source;
    req.orchestrator = a.orchestrator.clone();
    req.detach = a.detach;
    req.parent = match a.parent.clone() {
        Some(p) => Some(p),
        None => match ctx.var_nonempty("MAM_PARENT_JOB_ID") {
            Some(p) if clock::valid_job_id(&p) => Some(p),
            Some(_) => return Err(Failure::usage("MAM_PARENT_JOB_ID: invalid job id")),
            None => None,
        },
    };
    if ctx.var_nonempty("MAM_INJECT_ACK_GRACE_S").is_some() {
        ctx.diag("NOTE: MAM_INJECT_ACK_GRACE_S is deprecated and has no effect (the ack timeout T decides)");
    }
    req.task = read_task(ctx, "--brief-file", a.brief_file.as_deref().unwrap_or(std::path::Path::new("")))?;
    if let Some(c) = &a.context_file {
        req.context = Some(read_task(ctx, "--context-file", c)?);
    }
    sys::install_stop_handlers().map_err(|e| Failure::runtime(format!("cannot install signal handlers: {e}")))?;
    let out = ctx.clone();
    let mut diag = |l: &str| out.diag(l);
    let f = delegate::run(ctx, &req, &mut diag).map_err(cli::delegate_failure)?;
    // Issue 30: `-` when the agent wrote no report (a job closed before it did).
    let report = if sys::is_nonempty_file(&f.report) { f.report.to_string_lossy() } else { "-".into() };
    ctx.say(&format!("JOB_ID={} STATUS={} REPORT={report}", f.job_id, f.status));
    Ok(f.rc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_validated_before_anything_runs() {
        assert_eq!(parse_args(cli::argv(&[])).unwrap_err().rc, 2);
        assert_eq!(
            parse_args(cli::argv(&["--session", "w"])).unwrap_err().line,
            "ERROR: delegate-job: --brief-file is required"
        );
        let ok = ["--session", "w", "--brief-file", "b"];
        assert!(matches!(parse_args(cli::argv(&ok)), Ok(Parsed::Run(_))));
        for bad in [
            &["--timeout", "-1"][..],
            &["--heartbeat", "0"],
            &["--heartbeat-misses", "x"],
            &["--ack-timeout", "0"],
            &["--type", "bogus"],
            &["--job-id", "a/b"],
            &["--parent", "#"],
            &["--deadline-source", "moon"],
            &["--bogus"],
        ] {
            let mut v: Vec<&str> = ok.to_vec();
            v.extend_from_slice(bad);
            assert_eq!(parse_args(cli::argv(&v)).unwrap_err().rc, 2, "{bad:?}");
        }
        let mut v = ok.to_vec();
        v.extend_from_slice(&["--timeout", "0", "--idle-timeout", "0", "--deadline-source", "wall-clock"]);
        let Parsed::Run(a) = parse_args(cli::argv(&v)).unwrap() else { panic!("help") };
        assert_eq!((a.timeout, a.idle, a.deadline_source), (Some(0), Some(0), DeadlineSource::WallClock));
    }
}
