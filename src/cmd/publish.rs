//! `mam publish`: an agent (or a runner on its behalf) reports a signed job event (CORE 6, A8, A31).
//! This file parses, calls `publish::publish`, prints the outcome and arms the heartbeat timer.
//!
//! It never writes a record or a log itself and never prints the auth_token or a password.

use std::ffi::OsString;
use std::time::Instant;

use serde_json::{Map, Value};

use crate::cli::{self, Failure, Parsed};
use crate::clock;
use crate::ctx::Ctx;
use crate::heartbeat::arm::{self, Arm};
use crate::heartbeat::timer::{self, TimerError};
use crate::knob;
use crate::paths;
use crate::publish::{self, Event, Outcome, WireReport};
use crate::registry::record::Record;
use crate::registry::store::Store;
use crate::sign;
use crate::text;
use crate::trace;
use crate::wire::Settings;

pub const USAGE: &str = "
Usage: mam publish --job-id ID --event started|progress|completed|failed|error [--message TEXT]
                   [--data JSON] [--attempt A] [--dispatch-token T] [--registry-dir D]
                   [--logs-dir D] [--heartbeat N [--watch-pid PID]] [--no-state]

Records the event in the job's registry (one engine decision with its seq), appends the signed event
to <registry>/<job_id>/events.log, and only then sends the event and the retained job state over one
broker connection. A terminal event (completed, failed, error) first stops the job's heartbeat timer
and waits for in-flight publishes. The broker is the record's list (MQTT_BROKER when the job was
registered; `mam registry repoint` changes it), walked in order within one connect deadline; events
of the job that an outage kept off the wire go first, in seq order.

Options:
  --job-id ID            the job (see `mam registry publish-cmd ID` for the whole line)
  --event E              started, progress, completed, failed or error
  --message TEXT         free text, at most 4096 bytes
  --data JSON            a JSON object of at most 64 KiB; a number that is not an integer (0.5,
                         1e3) is sent as its decimal text in a string, since signed payloads
                         carry integers only (a NOTE says so)
  --attempt A            must match the record (default: the record's attempt)
  --dispatch-token T     must match the record (default: the record's token)
  --registry-dir D       the job registry; else MAM_JOBS_DIR; else <control root>/.mam/jobs
  --logs-dir D           the audit-log root; else DELEGATE_JOB_LOGS_DIR; else beside the registry
  --heartbeat N          after a started/progress event, arm the heartbeat timer with N s beats
  --watch-pid PID        the process the timer watches (0 = none; default: the nearest agent
                         CLI among this process's ancestors); needs --heartbeat
  --no-state             send no retained state message
  -h, --help             print this help

Env: MQTT_* (CORE 3.1), MAM_PUBLISH_BUDGET_S (20: wire budget of a non-terminal publish),
MAM_HEARTBEAT_DRAIN_S (1: how long a stopped timer may take), MAM_ENGINE_CAS; MAM_TRACE=1 adds
one stderr line `mam-trace: <step>=<start ms>+<ms> ...` of where the time went (`mam bench publish`).

Output: `published <event> seq=<n> job=<id>`; a repeat prints `already <status>; nothing new to
publish`.

Exit codes: 0 sent (or an idempotent repeat), 1 env, I/O or unknown job, 2 usage, 3 recorded locally
but the broker failed after retries, 4 refused by the transition engine.
";

#[derive(Debug)]
struct Args {
    req: publish::Request,
    registry_dir: Option<std::path::PathBuf>,
    logs_dir: Option<std::path::PathBuf>,
    heartbeat: Option<u32>,
    watch_pid: Option<i32>,
    /// `--data` numbers sent as strings, as (path, text), for the NOTE.
    data_notes: Vec<(String, String)>,
}

fn parse_args(args: Vec<OsString>) -> Result<Parsed<Args>, Failure> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let (mut job_id, mut event, mut message, mut data) = (None, None, String::new(), Map::new());
    let mut data_notes = Vec::new();
    let mut logs_dir: Option<std::path::PathBuf> = None;
    let (mut attempt, mut token, mut registry_dir, mut heartbeat, mut watch_pid, mut no_state) =
        (None, None, None, None, None, false);
    while let Some(arg) = p.next()? {
        match arg {
            Short('h') | Long("help") => return Ok(Parsed::Help),
            Long("job-id") => {
                let v = cli::utf8("--job-id", p.value()?)?;
                if !clock::valid_job_id(&v) {
                    return Err(Failure::usage(format!(
                        "--job-id: invalid job id '{}' (expected ^[A-Za-z0-9][A-Za-z0-9._-]{{0,63}}$)",
                        short(&v)
                    )));
                }
                job_id = Some(v);
            }
            Long("event") => {
                let v = cli::utf8("--event", p.value()?)?;
                event = Some(Event::parse(&v).ok_or_else(|| {
                    Failure::usage(format!(
                        "--event: invalid event '{}' (expected one of: {})",
                        short(&v),
                        Event::ALL.join(", ")
                    ))
                })?);
            }
            Long("message") => {
                let v = cli::utf8("--message", p.value()?)?;
                if v.len() > publish::MAX_MESSAGE {
                    return Err(Failure::usage(format!(
                        "--message: {} bytes is more than {}",
                        v.len(),
                        publish::MAX_MESSAGE
                    )));
                }
                message = v;
            }
            Long("data") => (data, data_notes) = parse_data(p.value()?)?,
            Long("attempt") => attempt = Some(u64::from(knob::flag("--attempt", &p.value()?, 1)?)),
            Long("dispatch-token") => {
                let v = cli::utf8("--dispatch-token", p.value()?)?;
                if v.is_empty() || v.len() > 128 || !v.bytes().all(|b| b.is_ascii_alphanumeric()) {
                    return Err(Failure::usage(format!("--dispatch-token: invalid token '{}'", short(&v))));
                }
                token = Some(v);
            }
            Long("registry-dir") => registry_dir = Some(p.value()?.into()),
            Long("logs-dir") => logs_dir = Some(p.value()?.into()),
            Long("heartbeat") => heartbeat = Some(knob::flag("--heartbeat", &p.value()?, 1)?),
            Long("watch-pid") => {
                let n = knob::flag("--watch-pid", &p.value()?, 0)?;
                watch_pid = Some(i32::try_from(n).map_err(|_| Failure::usage("--watch-pid: not a pid"))?);
            }
            Long("no-state") => no_state = true,
            _ => return Err(arg.unexpected().into()),
        }
    }
    let job_id = job_id.ok_or_else(|| Failure::usage("publish: --job-id is required"))?;
    let event = event.ok_or_else(|| Failure::usage("publish: --event is required"))?;
    if heartbeat.is_some() && event.is_terminal() {
        return Err(Failure::usage(format!(
            "publish: --heartbeat cannot be used with a terminal event ({})",
            event.name()
        )));
    }
    if watch_pid.is_some() && heartbeat.is_none() {
        return Err(Failure::usage("publish: --watch-pid needs --heartbeat"));
    }
    Ok(Parsed::Run(Args {
        req: publish::Request { job_id, event, message, data, attempt, dispatch_token: token, no_state },
        registry_dir,
        logs_dir,
        heartbeat,
        watch_pid,
        data_notes,
    }))
}

fn short(v: &str) -> String {
    let s = text::one_line(v);
    if s.chars().count() > 80 {
        s.chars().take(80).collect::<String>() + "..."
    } else {
        s
    }
}

/// Replaces every number that is not an integer with its decimal text (issue 18: `--data` takes
/// any JSON number, and the canonical bytes of CORE 4 hold integers only), noting each (path, text).
fn stringify_floats(v: &mut Value, path: &str, notes: &mut Vec<(String, String)>) {
    match v {
        Value::Number(n) if !n.is_i64() && !n.is_u64() => {
            let t = n.to_string();
            notes.push((path.to_string(), t.clone()));
            *v = Value::String(t);
        }
        Value::Array(a) => {
            for (i, x) in a.iter_mut().enumerate() {
                stringify_floats(x, &format!("{path}[{i}]"), notes);
            }
        }
        Value::Object(m) => {
            for (k, x) in m.iter_mut() {
                stringify_floats(x, &format!("{path}.{k}"), notes);
            }
        }
        _ => {}
    }
}

/// `--data`: a JSON object of at most 64 KiB that has canonical bytes once its non-integer numbers
/// are strings.
type Data = (Map<String, Value>, Vec<(String, String)>);
fn parse_data(raw: OsString) -> Result<Data, Failure> {
    let v = cli::utf8("--data", raw)?;
    if v.len() > publish::MAX_DATA {
        return Err(Failure::usage(format!("--data: {} bytes is more than {}", v.len(), publish::MAX_DATA)));
    }
    let parsed: Value = serde_json::from_str(&v)
        .map_err(|e| Failure::usage(format!("--data: invalid JSON ({})", text::one_line(&e.to_string()))))?;
    let Value::Object(_) = parsed else {
        return Err(Failure::usage("--data: must be a JSON object"));
    };
    let mut parsed = parsed;
    let mut notes = Vec::new();
    stringify_floats(&mut parsed, "data", &mut notes);
    if let Err(e) = sign::canonical(&parsed) {
        return Err(Failure::usage(format!("--data: {e}")));
    }
    let Value::Object(m) = parsed else { unreachable!("checked above") };
    Ok((m, notes))
}

/// Entry point.
pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let t = Instant::now();
    let Some(a) = cli::parse_or_help(ctx, USAGE, args, parse_args)? else {
        return Ok(0);
    };
    cli::load_env(ctx)?;
    if ctx.var("MAM_TRACE").as_deref() == Some("1") {
        trace::enable_at(t);
    }
    let rc = publish_cmd(ctx, a, t);
    if trace::on() {
        ctx.diag(&trace::line(&trace::take()));
    }
    rc
}

fn publish_cmd(ctx: &Ctx, a: Args, t: Instant) -> Result<i32, Failure> {
    for (path, t) in &a.data_notes {
        ctx.diag(&format!(
            "NOTE: publish: --data: {path} = {t} is not an integer; sent as the string \"{t}\" (signed payloads carry integers only)"
        ));
    }
    // Issue 30: the agent's command lines name the log root as a flag, not as a `VAR=value` prefix,
    // so that one allow rule for mam's binary matches them all (docs/AGENTS.md "claude").
    let mut resolved = paths::resolve_unchecked(ctx, a.registry_dir.as_deref());
    if let Some(l) = &a.logs_dir {
        resolved.logs = crate::sys::absolutize(ctx.cwd(), l);
    }
    paths::check(ctx, &resolved.control_root, &[&resolved.registry, &resolved.logs, &resolved.sessions])?;
    let store = Store::from_resolved(&resolved);
    let settings = Settings::for_registry(ctx, Some(&store.registry))?;
    trace::span("parse", t);
    let id = a.req.job_id.clone();
    let event = a.req.event.name();
    let mut diag = |line: String| ctx.diag(&line);
    // Issue 18: the timer is armed as soon as the event is recorded, before the wire is tried, so
    // a broker outage at start cannot hold it back past the job's idle window.
    let mut arm_failure: Option<Failure> = None;
    let mut armed_early = false;
    let mut hook = |rec: &Record| match a.heartbeat {
        Some(n) => {
            armed_early = true;
            let (lines, fail) = arm_timer(ctx, &store, &settings, &a, n, rec);
            arm_failure = fail;
            lines
        }
        None => Vec::new(),
    };
    let outcome = publish::publish(&store, &settings, &a.req, &mut diag, Some(&mut hook)).map_err(Failure::runtime)?;
    let t = Instant::now();
    if let Some(f) = &arm_failure {
        ctx.diag(&f.line);
    }
    let mut rc = arm_failure.map_or(0, |f| f.rc);
    let arm = match &outcome {
        Outcome::Published { seq, report } => {
            let wire = report_rc(ctx, report, &format!("job {id}: {event} seq={seq}"));
            if wire == 0 && rc == 0 {
                ctx.say(&format!("published {event} seq={seq} job={id}"));
            }
            if wire != 0 {
                rc = wire;
            }
            trace::span("print", t);
            !armed_early
        }
        Outcome::Repeat { status, resent } => {
            ctx.say(&format!("already {status}; nothing new to publish"));
            if let Some((seq, report)) = resent {
                rc = report_rc(ctx, report, &format!("job {id}: {event} seq={seq} (resent)"));
            }
            // A31: an idempotent `started --heartbeat N` re-arms the timer when none is alive.
            timer::status(&store.registry, &id).is_none()
        }
        Outcome::Refused { reason } => return Err(cli::job_refused(&id, reason)),
    };
    if let (Some(n), true) = (a.heartbeat, arm) {
        let rec = store.read_existing(&a.req.job_id).map_err(Failure::runtime)?;
        let (lines, fail) = arm_timer(ctx, &store, &settings, &a, n, &rec);
        for l in lines {
            ctx.diag(&l);
        }
        if let Some(f) = fail {
            ctx.diag(&f.line);
            if rc == 0 {
                rc = f.rc;
            }
        }
    }
    Ok(rc)
}

/// Prints the warnings of a wire report; rc 3 with one ERROR line when the wire failed.
fn report_rc(ctx: &Ctx, r: &WireReport, what: &str) -> i32 {
    if let Some(why) = &r.state_skipped {
        ctx.diag(&format!("WARNING: state not published: {why}"));
    }
    match &r.error {
        None => 0,
        Some(e) => {
            ctx.diag(&format!("ERROR: {what} recorded in events.log but not published ({e})"));
            cli::rc::WIRE
        }
    }
}

/// CORE 6.3 step 8: start_timer after a non-terminal event. An ended attempt is a WARNING only.
/// Returns the lines to print and, when the timer could not be started, the failure.
///
/// A `--heartbeat N` that disagrees with the record's `heartbeat_sec` M is not applied (issue 18,
/// docs/DESIGN.md): the timer beats every M s, the cadence the job's idle window (K x M) and every
/// watcher count on, and a WARNING says so. Before, the timer beat every N s while the warning said
/// the record kept M: both at once.
fn arm_timer(
    ctx: &Ctx,
    store: &Store,
    settings: &Settings,
    a: &Args,
    n: u32,
    rec: &Record,
) -> (Vec<String>, Option<Failure>) {
    let mut lines = Vec::new();
    let interval = match rec.u64("heartbeat_sec").and_then(|m| u32::try_from(m).ok()).filter(|m| *m >= 1) {
        Some(m) if m != n => {
            lines.push(format!(
                "WARNING: --heartbeat {n} is not this job's heartbeat_sec {m}; the timer beats every {m} s, as the record \
                 says (its idle window counts on {m})"
            ));
            m
        }
        _ => n,
    };
    let req = Arm {
        attempt: a.req.attempt,
        dispatch_token: a.req.dispatch_token.clone(),
        interval,
        watch_pid: a.watch_pid,
        lifetime: None,
    };
    match arm::arm(ctx, store, settings, &a.req.job_id, rec, req) {
        Ok(armed) => {
            lines.extend(armed.warnings);
            (lines, None)
        }
        Err(TimerError::AttemptEnded { why, .. }) => {
            lines.push(format!("WARNING: heartbeat timer not armed: attempt ended ({why})"));
            (lines, None)
        }
        Err(e) => (lines, Some(Failure::runtime(format!("heartbeat timer not started: {e}")))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation() {
        let base = ["--job-id", "j1", "--event"];
        let ok = |extra: &[&str]| {
            let mut v: Vec<&str> = base.to_vec();
            v.extend_from_slice(extra);
            parse_args(cli::argv(&v))
        };
        assert!(matches!(ok(&["started", "--heartbeat", "5", "--watch-pid", "0"]), Ok(Parsed::Run(_))));
        assert_eq!(ok(&["completed", "--heartbeat", "5"]).unwrap_err().rc, 2);
        assert_eq!(ok(&["progress", "--watch-pid", "1"]).unwrap_err().rc, 2);
        assert_eq!(ok(&["beat"]).unwrap_err().rc, 2);
        assert_eq!(ok(&["progress", "--data", "[1]"]).unwrap_err().line, "ERROR: --data: must be a JSON object");
        // Issue 18: any JSON number; a non-integer travels as its decimal text.
        let Ok(Parsed::Run(a)) = ok(&["progress", "--data", "{\"r\":0.5,\"n\":[1,2.5e3],\"i\":-3}"]) else { panic!() };
        assert_eq!(Value::Object(a.req.data), serde_json::json!({"r": "0.5", "n": [1, "2500.0"], "i": -3}));
        assert_eq!(a.data_notes, [("data.r".to_string(), "0.5".to_string()), ("data.n[1]".into(), "2500.0".into())]);
        let big = format!("{{\"a\":\"{}\"}}", "x".repeat(64 * 1024));
        assert_eq!(ok(&["progress", "--data", &big]).unwrap_err().rc, 2);
        let msg = "m".repeat(4097);
        assert_eq!(ok(&["progress", "--message", &msg]).unwrap_err().rc, 2);
        assert_eq!(parse_args(cli::argv(&["--event", "started"])).unwrap_err().rc, 2);
        assert_eq!(parse_args(cli::argv(&["--job-id", "a/b", "--event", "started"])).unwrap_err().rc, 2);
        assert_eq!(ok(&["started", "--dispatch-token", "a b"]).unwrap_err().rc, 2);
    }
}
