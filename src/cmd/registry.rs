//! `mam registry`: durable job records (CORE 4, A2, A4, A5). Every write is an operator request to the
//! transition engine (`registry::store::apply`); this file only parses, builds requests and prints.
//!
//! It never writes a record itself and never prints a secret: `auth_token` is shown as `<redacted>`,
//! `MQTT_PASSWORD` and `MAM_DISPATCH_SECRET` are never read into output.

use std::ffi::OsString;
use std::path::PathBuf;

use serde_json::{Map, Value};

use crate::cli::{self, Failure, Parsed};
use crate::clock;
use crate::ctx::Ctx;
use crate::knob;
use crate::mqtt::MqttConfig;
use crate::paths;
use crate::publish::close;
use crate::registry::engine::{Authority, Decision, Kind, Request, Tokens};
use crate::registry::record::{NewRecord, Record};
use crate::registry::store::{Outcome, Store, StoreError};
use crate::registry::{self, remote_auth_token, valid_status};
use crate::sys;

pub const USAGE: &str = "
Usage: mam registry <subcommand> [--registry-dir D] [args...]

Subcommands:
  register --session S [--job-id ID] [--type task|loop|discuss] [--transport local|remote]
           [TIMING] [--brief-path P] [--report-path P] [--parent ID] [--orchestrator UUID] [--json]
                 create a pending job (attempt 1, iteration 1); prints the id (or the record)
  submit --type T --session S [--job-id ID] [--iteration I] [register options]
                 register a new job, or re-dispatch an existing one (attempt+1, new tokens);
                 prints `<id> attempt=<a> iteration=<i>`
  show ID        print the record (auth_token redacted)
  list [--status S] [--session S] [--json]
                 one line per job: id, status, attempt, session, updated_at (by created_at)
  status ID      print the status
  status ID --set S [--reason R] [--expected-attempt N] [--no-publish]
                 operator set: `<id> <old> -> <new>`, `<id> already <S>`, or REFUSED (rc 4)
  finalize ID --status S [--reason R] [--expected-attempt N] [--no-publish]
                 operator finalize: any terminal status, also over another terminal one
  expire ID [--expected-attempt N] [--no-publish]
                 close as deadline_timeout (reason deadline) once deadline_at has passed
  set-meta ID KEY=VALUE... [--expected-attempt N]
                 operator metadata merge; KEY:=JSON stores a JSON value (e.g. watcher_pid:=123);
                 status, ids, tokens and seqs are reserved (rc 1)
  scrub-secrets [--dry-run]
                 remove a stored broker.password from every record that holds a non-empty one
  publish-cmd ID print the agent's publish command as one shell line
  paths          print `registry=<abs>` and `logs=<abs>` (creates nothing)

TIMING: --timeout SEC (0 = none) --heartbeat-sec N (MAM_HEARTBEAT_SEC, 30)
        --heartbeat-misses K (MAM_HEARTBEAT_MISSES, 4) --ack-timeout T (MAM_ACK_TIMEOUT_S, 300)
        --idle-timeout SEC (0 or absent: K x N)

Options:
  --registry-dir D   the job registry (relative to the cwd); else MAM_JOBS_DIR; else
                     <control root>/.mam/jobs
  -h, --help         print this help

Env: MAM_ENGINE_CAS=0 selects the legacy permissive engine; MAM_DISPATCH_SECRET is required for
transport remote; MQTT_BROKER, MQTT_PORT, MQTT_TLS, MQTT_USERNAME, MQTT_CA_FILE, MQTT_TOPIC_ROOT
fill the record's broker block (never a password).

Exit codes: 0 ok (also an idempotent repeat), 1 runtime error (unknown job, invalid status, I/O,
missing secret), 2 usage, 4 refused by the transition engine.
";

/// The timing flags of `register`/`submit` (absent: the env default, CORE 4.1).
#[derive(Debug, Default, Clone)]
pub struct Timing {
    pub timeout: Option<u32>,
    pub heartbeat_sec: Option<u32>,
    pub heartbeat_misses: Option<u32>,
    pub ack_timeout: Option<u32>,
    pub idle_timeout: Option<u32>,
}

/// A job to register or re-dispatch: the flags of `register`/`submit` (also the library input of
/// `submit_job`, which `delegate-job` uses).
#[derive(Debug, Default, Clone)]
pub struct NewJob {
    pub session: Option<String>,
    pub job_id: Option<String>,
    pub job_type: Option<String>,
    pub transport: Option<String>,
    pub timing: Timing,
    pub brief_path: Option<PathBuf>,
    pub report_path: Option<PathBuf>,
    pub parent: Option<String>,
    pub orchestrator: Option<String>,
    pub iteration: Option<u32>,
    pub json: bool,
}

#[derive(Debug)]
enum Sub {
    Paths,
    Register(NewJob),
    Submit(NewJob),
    Show { id: String },
    List { status: Option<String>, session: Option<String>, json: bool },
    Status { id: String, set: Option<String>, close: Close },
    Finalize { id: String, status: String, close: Close },
    Expire { id: String, close: Close },
    SetMeta { id: String, fields: Map<String, Value>, expected_attempt: Option<u64> },
    Scrub { dry_run: bool },
    PublishCmd { id: String },
}

#[derive(Debug)]
struct Args {
    registry_dir: Option<PathBuf>,
    sub: Sub,
}

/// Everything any subcommand accepts; `parse_args` then checks which flags the subcommand allows.
#[derive(Debug, Default)]
struct Raw {
    sub: Option<String>,
    positionals: Vec<String>,
    seen: Vec<&'static str>,
    registry_dir: Option<PathBuf>,
    job: NewJob,
    status: Option<String>,
    set: Option<String>,
    close: Close,
    dry_run: bool,
}

fn job_id_arg(flag: &str, v: &str) -> Result<String, Failure> {
    if clock::valid_job_id(v) {
        Ok(v.to_string())
    } else {
        let mut shown = cli::one_line(v);
        if shown.chars().count() > 80 {
            shown = shown.chars().take(80).collect::<String>() + "...";
        }
        Err(Failure::usage(format!("{flag}: invalid job id '{shown}' (expected ^[A-Za-z0-9][A-Za-z0-9._-]{{0,63}}$)")))
    }
}

fn allowed(sub: &str) -> Option<&'static [&'static str]> {
    const NEW_JOB: &[&str] = &[
        "--session",
        "--job-id",
        "--type",
        "--transport",
        "--timeout",
        "--heartbeat-sec",
        "--heartbeat-misses",
        "--ack-timeout",
        "--idle-timeout",
        "--brief-path",
        "--report-path",
        "--parent",
        "--orchestrator",
        "--json",
    ];
    const SUBMIT: &[&str] = &[
        "--session",
        "--job-id",
        "--type",
        "--transport",
        "--timeout",
        "--heartbeat-sec",
        "--heartbeat-misses",
        "--ack-timeout",
        "--idle-timeout",
        "--brief-path",
        "--report-path",
        "--parent",
        "--orchestrator",
        "--iteration",
    ];
    Some(match sub {
        "paths" | "show" | "publish-cmd" => &[],
        "register" => NEW_JOB,
        "submit" => SUBMIT,
        "list" => &["--status", "--session", "--json"],
        "status" => &["--set", "--reason", "--expected-attempt", "--no-publish"],
        "finalize" => &["--status", "--reason", "--expected-attempt", "--no-publish"],
        "expire" => &["--expected-attempt", "--no-publish"],
        "set-meta" => &["--expected-attempt"],
        "scrub-secrets" => &["--dry-run"],
        _ => return None,
    })
}

fn parse_args(args: Vec<OsString>) -> Result<Parsed<Args>, Failure> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let mut r = Raw::default();
    while let Some(arg) = p.next()? {
        let flag: &'static str = match arg {
            Short('h') | Long("help") => return Ok(Parsed::Help),
            Long("registry-dir") => {
                r.registry_dir = Some(p.value()?.into());
                continue;
            }
            Long("session") => {
                let v = cli::utf8("--session", p.value()?)?;
                if !clock::valid_session(&v) {
                    return Err(Failure::usage(format!(
                        "--session: invalid session '{}' (expected ^[A-Za-z0-9][A-Za-z0-9._:-]{{0,127}}$)",
                        cli::one_line(&v)
                    )));
                }
                // `list --session` filters; register/submit set.
                r.job.session = Some(v);
                "--session"
            }
            Long("job-id") => {
                r.job.job_id = Some(job_id_arg("--job-id", &cli::utf8("--job-id", p.value()?)?)?);
                "--job-id"
            }
            Long("type") => {
                let v = cli::utf8("--type", p.value()?)?;
                if !registry::TYPES.contains(&v.as_str()) {
                    return Err(Failure::usage(format!(
                        "--type: invalid type '{}' (expected task, loop or discuss)",
                        cli::one_line(&v)
                    )));
                }
                r.job.job_type = Some(v);
                "--type"
            }
            Long("transport") => {
                let v = cli::utf8("--transport", p.value()?)?;
                if v != "local" && v != "remote" {
                    return Err(Failure::usage(format!(
                        "--transport: invalid transport '{}' (expected local or remote)",
                        cli::one_line(&v)
                    )));
                }
                r.job.transport = Some(v);
                "--transport"
            }
            Long("timeout") => {
                r.job.timing.timeout = Some(knob::flag("--timeout", &p.value()?, 0)?);
                "--timeout"
            }
            Long("heartbeat-sec") => {
                r.job.timing.heartbeat_sec = Some(knob::flag("--heartbeat-sec", &p.value()?, 1)?);
                "--heartbeat-sec"
            }
            Long("heartbeat-misses") => {
                r.job.timing.heartbeat_misses = Some(knob::flag("--heartbeat-misses", &p.value()?, 1)?);
                "--heartbeat-misses"
            }
            Long("ack-timeout") => {
                r.job.timing.ack_timeout = Some(knob::flag("--ack-timeout", &p.value()?, 1)?);
                "--ack-timeout"
            }
            Long("idle-timeout") => {
                r.job.timing.idle_timeout = Some(knob::flag("--idle-timeout", &p.value()?, 0)?);
                "--idle-timeout"
            }
            Long("iteration") => {
                r.job.iteration = Some(knob::flag("--iteration", &p.value()?, 1)?);
                "--iteration"
            }
            Long("brief-path") => {
                r.job.brief_path = Some(p.value()?.into());
                "--brief-path"
            }
            Long("report-path") => {
                r.job.report_path = Some(p.value()?.into());
                "--report-path"
            }
            Long("parent") => {
                r.job.parent = Some(job_id_arg("--parent", &cli::utf8("--parent", p.value()?)?)?);
                "--parent"
            }
            Long("orchestrator") => {
                let v = cli::utf8("--orchestrator", p.value()?)?;
                if v.is_empty() || v.len() > 128 || !v.bytes().all(|b| b.is_ascii_graphic()) {
                    return Err(Failure::usage(format!(
                        "--orchestrator: invalid value '{}' (expected 1-128 printable ASCII characters)",
                        cli::one_line(&v)
                    )));
                }
                r.job.orchestrator = Some(v);
                "--orchestrator"
            }
            Long("json") => {
                r.job.json = true;
                "--json"
            }
            Long("status") => {
                r.status = Some(cli::utf8("--status", p.value()?)?);
                "--status"
            }
            Long("set") => {
                r.set = Some(cli::utf8("--set", p.value()?)?);
                "--set"
            }
            Long("reason") => {
                let v = cli::utf8("--reason", p.value()?)?;
                if v.chars().any(char::is_control) {
                    return Err(Failure::usage("--reason: control characters are not allowed"));
                }
                r.close.reason = Some(v);
                "--reason"
            }
            Long("expected-attempt") => {
                r.close.expected_attempt = Some(u64::from(knob::flag("--expected-attempt", &p.value()?, 1)?));
                "--expected-attempt"
            }
            Long("no-publish") => {
                r.close.no_publish = true;
                "--no-publish"
            }
            Long("dry-run") => {
                r.dry_run = true;
                "--dry-run"
            }
            Value(v) if r.sub.is_none() => {
                r.sub = Some(cli::utf8("registry", v)?);
                continue;
            }
            Value(v) => {
                r.positionals.push(cli::utf8("registry", v)?);
                continue;
            }
            _ => return Err(arg.unexpected().into()),
        };
        r.seen.push(flag);
    }
    let Some(sub) = r.sub.clone() else {
        return Err(Failure::usage("registry: missing subcommand (see mam registry --help)"));
    };
    let Some(ok) = allowed(&sub) else {
        return Err(Failure::usage(format!("registry: unknown subcommand '{}'", cli::one_line(&sub))));
    };
    if let Some(bad) = r.seen.iter().find(|f| !ok.contains(f)) {
        return Err(Failure::usage(format!("registry {sub}: unexpected option {bad}")));
    }
    let takes_id = matches!(sub.as_str(), "show" | "status" | "finalize" | "expire" | "set-meta" | "publish-cmd");
    let mut pos = r.positionals.into_iter();
    let id = if takes_id {
        let Some(id) = pos.next() else {
            return Err(Failure::usage(format!("registry {sub}: missing job id")));
        };
        job_id_arg(&sub, &id)?
    } else {
        String::new()
    };
    let mut fields = Map::new();
    for extra in pos {
        if sub != "set-meta" {
            return Err(Failure::usage(format!("registry {sub}: unexpected argument '{}'", cli::one_line(&extra))));
        }
        let (k, v) = meta_pair(&extra)?;
        fields.insert(k, v);
    }
    let sub = match sub.as_str() {
        "paths" => Sub::Paths,
        "show" => Sub::Show { id },
        "publish-cmd" => Sub::PublishCmd { id },
        "register" | "submit" => {
            if r.job.session.is_none() {
                return Err(Failure::usage(format!("registry {sub}: --session is required")));
            }
            if sub == "register" {
                Sub::Register(r.job)
            } else {
                if r.job.job_type.is_none() {
                    return Err(Failure::usage("registry submit: --type is required"));
                }
                Sub::Submit(r.job)
            }
        }
        "list" => Sub::List { status: r.status, session: r.job.session, json: r.job.json },
        "status" => {
            if r.set.is_none() && (r.close.reason.is_some() || r.close.expected_attempt.is_some() || r.close.no_publish)
            {
                return Err(Failure::usage(
                    "registry status: --reason, --expected-attempt and --no-publish need --set",
                ));
            }
            Sub::Status { id, set: r.set, close: r.close }
        }
        "finalize" => {
            let Some(status) = r.status else {
                return Err(Failure::usage("registry finalize: --status is required"));
            };
            Sub::Finalize { id, status, close: r.close }
        }
        "expire" => Sub::Expire { id, close: r.close },
        "set-meta" => {
            if fields.is_empty() {
                return Err(Failure::usage("registry set-meta: give at least one KEY=VALUE"));
            }
            Sub::SetMeta { id, fields, expected_attempt: r.close.expected_attempt }
        }
        "scrub-secrets" => Sub::Scrub { dry_run: r.dry_run },
        _ => unreachable!("allowed() lists every subcommand"),
    };
    Ok(Parsed::Run(Args { registry_dir: r.registry_dir, sub }))
}

/// `KEY=VALUE` (a string) or `KEY:=JSON` (any JSON value). Keys are `[A-Za-z_][A-Za-z0-9_.-]*`.
fn meta_pair(s: &str) -> Result<(String, Value), Failure> {
    let bad = || Failure::usage(format!("set-meta: expected KEY=VALUE or KEY:=JSON, got '{}'", cli::one_line(s)));
    let (k, v) = s.split_once('=').ok_or_else(bad)?;
    let (key, json) = match k.strip_suffix(':') {
        Some(key) => (key, true),
        None => (k, false),
    };
    let kb = key.as_bytes();
    if kb.is_empty()
        || !(kb[0].is_ascii_alphabetic() || kb[0] == b'_')
        || !kb.iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
    {
        return Err(bad());
    }
    let value = if json {
        serde_json::from_str(v)
            .map_err(|e| Failure::usage(format!("set-meta: {key}: invalid JSON ({})", cli::one_line(&e.to_string()))))?
    } else {
        Value::String(v.to_string())
    };
    Ok((key.to_string(), value))
}

/// Entry point. Safe to call repeatedly with one `Ctx` (E13): nothing is cached between calls
/// except what `cli::load_env` records in the `Ctx` after a successful load.
pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let Some(a) = cli::parse_or_help(ctx, USAGE, args, parse_args)? else {
        return Ok(0);
    };
    cli::load_env(ctx)?;
    let resolved = paths::resolve(ctx, a.registry_dir.as_deref());
    let store = Store::from_resolved(&resolved);
    match a.sub {
        Sub::Paths => {
            ctx.say(&format!("registry={}", resolved.registry.to_string_lossy()));
            ctx.say(&format!("logs={}", resolved.logs.to_string_lossy()));
            Ok(0)
        }
        Sub::Register(job) => register(ctx, &store, job),
        Sub::Submit(job) => submit(ctx, &store, job),
        Sub::Show { id } => {
            let rec = store.read_existing(&id).map_err(store_failure)?;
            ctx.say(&pretty(&rec.redacted()));
            Ok(0)
        }
        Sub::List { status, session, json } => list(ctx, &store, status, session, json),
        Sub::Status { id, set: None, .. } => {
            let rec = store.read_existing(&id).map_err(store_failure)?;
            ctx.say(rec.status());
            Ok(0)
        }
        Sub::Status { id, set: Some(s), close } => close_job(ctx, &store, &id, Kind::Set, Some(s), close),
        Sub::Finalize { id, status, close } => close_job(ctx, &store, &id, Kind::Finalize, Some(status), close),
        Sub::Expire { id, close } => close_job(ctx, &store, &id, Kind::Expire, None, close),
        Sub::SetMeta { id, fields, expected_attempt } => {
            let mut req = operator(ctx, Kind::Metadata, &id);
            req.fields = fields;
            req.expected_attempt = expected_attempt;
            let out = apply(ctx, &store, &req)?;
            match &out.decision {
                Decision::Applied(a) => {
                    let keys: Vec<&str> = req.fields.keys().map(String::as_str).collect();
                    ctx.say(&format!("{id} updated {} transition_seq={}", keys.join(","), a.transition_seq));
                    Ok(0)
                }
                Decision::Refused { reason } => Err(Failure::refused(format!("{id}: {reason}"))),
                _ => Ok(0),
            }
        }
        Sub::Scrub { dry_run } => scrub(ctx, &store, dry_run),
        Sub::PublishCmd { id } => publish_cmd(ctx, &store, &id),
    }
}

fn store_failure(e: StoreError) -> Failure {
    Failure::runtime(e)
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).expect("a JSON value always serialises")
}

fn cas_enabled(ctx: &Ctx) -> bool {
    ctx.var("MAM_ENGINE_CAS").as_deref() != Some("0")
}

fn operator(ctx: &Ctx, kind: Kind, id: &str) -> Request {
    let mut r = Request::new(kind, Authority::Operator, id);
    r.cas = cas_enabled(ctx);
    r
}

/// Runs one request, printing a WARNING when the audit could not be written (the rc stays).
fn apply(ctx: &Ctx, store: &Store, req: &Request) -> Result<Outcome, Failure> {
    let out = store.apply(req, clock::now_ms()).map_err(store_failure)?;
    if let Some(w) = &out.audit_error {
        ctx.diag(&format!("WARNING: {w}"));
    }
    Ok(out)
}

/// The record's broker block (CORE 3.1) from the effective MQTT configuration. Never a password.
fn broker_block(ctx: &Ctx) -> Result<Value, Failure> {
    let block = MqttConfig::from_ctx(ctx)?.broker_block();
    Ok(serde_json::to_value(block).expect("a broker block always serialises"))
}

fn dispatch_secret(ctx: &Ctx) -> Option<Vec<u8>> {
    ctx.var_nonempty("MAM_DISPATCH_SECRET").map(String::into_bytes)
}

fn missing_secret() -> Failure {
    Failure::runtime("MAM_DISPATCH_SECRET is required for transport remote")
}

fn random(what: &str, r: std::io::Result<String>) -> Result<String, Failure> {
    r.map_err(|e| Failure::runtime(format!("cannot get random bytes for {what} ({e})")))
}

fn abs_path(ctx: &Ctx, p: &std::path::Path) -> String {
    sys::absolutize(ctx.cwd(), p).to_string_lossy().into_owned()
}

/// The initial record of a new job (CORE 4.1, A5).
fn initial_record(ctx: &Ctx, job: &NewJob, id: &str, now: u64) -> Result<Map<String, Value>, Failure> {
    let t = &job.timing;
    let n = match t.heartbeat_sec {
        Some(v) => v,
        None => knob::env_or(ctx, "MAM_HEARTBEAT_SEC", 1, 30)?,
    };
    let k = match t.heartbeat_misses {
        Some(v) => v,
        None => knob::env_or(ctx, "MAM_HEARTBEAT_MISSES", 1, 4)?,
    };
    let ack = match t.ack_timeout {
        Some(v) => v,
        None => knob::env_or(ctx, "MAM_ACK_TIMEOUT_S", 1, 300)?,
    };
    // A31: `--idle-timeout 0` means K x N outside the daemon.
    let (idle, explicit) = match t.idle_timeout {
        Some(v) if v > 0 => (u64::from(v), true),
        _ => (u64::from(n) * u64::from(k), false),
    };
    let timeout = u64::from(t.timeout.unwrap_or(0));
    let broker = broker_block(ctx)?;
    let topic_prefix = format!("{}/jobs/{id}", broker["topic_root"].as_str().unwrap_or("mam"));
    let transport = job.transport.clone().unwrap_or_else(|| "local".into());
    let token = random("dispatch_token", clock::new_dispatch_token())?;
    let auth = if transport == "remote" {
        remote_auth_token(&dispatch_secret(ctx).ok_or_else(missing_secret)?, id, 1, &token)
    } else {
        random("auth_token", clock::new_auth_token())?
    };
    let abs = |p: &Option<PathBuf>| p.as_ref().map(|p| abs_path(ctx, p));
    let rec = NewRecord {
        job_id: id.to_string(),
        job_type: job.job_type.clone().unwrap_or_else(|| "task".into()),
        attempt: 1,
        iteration: job.iteration.map(u64::from).unwrap_or(1),
        dispatch_token: token,
        auth_token: auth,
        agent_session: job.session.clone().unwrap_or_default(),
        transport,
        heartbeat_sec: u64::from(n),
        heartbeat_misses: u64::from(k),
        ack_timeout_sec: u64::from(ack),
        idle_timeout_sec: idle,
        idle_timeout_explicit: explicit,
        timeout_sec: timeout,
        broker,
        topic_prefix,
        brief_path: abs(&job.brief_path),
        report_path: abs(&job.report_path),
        parent_job_id: job.parent.clone(),
        orchestrator_uuid: job.orchestrator.clone(),
    };
    Ok(rec.fields(now))
}

/// Registers a new job; with no `--job-id`, a generated id that collides is drawn again.
/// Registers a new job only (never a re-dispatch): an existing `job.job_id` is refused `exists`.
pub fn register_new(ctx: &Ctx, store: &Store, job: &NewJob) -> Result<(String, Outcome), Failure> {
    if job.transport.as_deref() == Some("remote") && dispatch_secret(ctx).is_none() {
        return Err(missing_secret());
    }
    let mut tries = 0;
    loop {
        let id = match &job.job_id {
            Some(id) => id.clone(),
            None => random("job id", clock::new_job_id())?,
        };
        let now = clock::now_ms();
        let mut req = operator(ctx, Kind::Register, &id);
        req.record = Some(initial_record(ctx, job, &id, now)?);
        let out = store.apply(&req, now).map_err(store_failure)?;
        if let Some(w) = &out.audit_error {
            ctx.diag(&format!("WARNING: {w}"));
        }
        tries += 1;
        if job.job_id.is_none() && matches!(out.decision, Decision::Refused { .. }) && tries < 5 {
            continue;
        }
        return Ok((id, out));
    }
}

fn register(ctx: &Ctx, store: &Store, job: NewJob) -> Result<i32, Failure> {
    let (id, out) = register_new(ctx, store, &job)?;
    match &out.decision {
        Decision::Applied(a) => {
            if job.json {
                ctx.say(&pretty(&a.record.redacted()));
            } else {
                ctx.say(&id);
            }
            Ok(0)
        }
        Decision::Refused { reason } => Err(Failure::refused(format!("{id}: {reason}"))),
        Decision::Idempotent { status } => {
            ctx.say(&format!("{id} already {status}"));
            Ok(0)
        }
        Decision::Invalid(_) | Decision::UnknownJob => Ok(1),
    }
}

/// The library form of `submit`: registers `job` when its id is new (or absent), else re-dispatches
/// it (attempt+1, new tokens; the old attempt's timer is then stopped with a drain). Returns the
/// engine's outcome and the WARNING lines of the timer stop; refusals are in the outcome.
pub fn submit_job(ctx: &Ctx, store: &Store, job: &NewJob) -> Result<(Outcome, Vec<String>), Failure> {
    let existing = match &job.job_id {
        Some(id) => store.read(id).map_err(store_failure)?,
        None => None,
    };
    let out = match existing {
        None => {
            let (id, out) = register_new(ctx, store, job)?;
            match out.decision {
                // Someone registered it between our read and our request: re-dispatch instead.
                Decision::Refused { ref reason } if reason == "exists" && job.job_id.is_some() => {
                    let rec = store.read_existing(&id).map_err(store_failure)?;
                    redispatch(ctx, store, job, &id, &rec)?
                }
                _ => out,
            }
        }
        Some(rec) => {
            let id = job.job_id.clone().unwrap_or_default();
            redispatch(ctx, store, job, &id, &rec)?
        }
    };
    let mut warnings = Vec::new();
    if let Decision::Applied(a) = &out.decision {
        if a.from.is_some() {
            let id = a.record.str("job_id").unwrap_or_default().to_string();
            warnings = stop_timer_quiet(ctx, store, &id);
        }
    }
    Ok((out, warnings))
}

fn submit(ctx: &Ctx, store: &Store, job: NewJob) -> Result<i32, Failure> {
    let (out, warnings) = submit_job(ctx, store, &job)?;
    let id = out.record().and_then(|r| r.str("job_id")).unwrap_or_default().to_string();
    match &out.decision {
        Decision::Applied(a) => {
            let r = &a.record;
            ctx.say(&format!(
                "{id} attempt={} iteration={}",
                r.u64("attempt").unwrap_or(0),
                r.u64("iteration").unwrap_or(0)
            ));
            for w in &warnings {
                ctx.diag(w);
            }
            Ok(0)
        }
        Decision::Refused { reason } => Err(Failure::refused(format!("{id}: {reason}"))),
        Decision::Idempotent { status } => {
            ctx.say(&format!("{id} already {status}"));
            Ok(0)
        }
        Decision::Invalid(_) | Decision::UnknownJob => Ok(1),
    }
}

fn redispatch(ctx: &Ctx, store: &Store, job: &NewJob, id: &str, rec: &Record) -> Result<Outcome, Failure> {
    if let (Some(want), Some(have)) = (job.job_type.as_deref(), rec.str("type")) {
        if want != have {
            return Err(Failure::runtime(format!("job {id} has type '{have}', not '{want}'")));
        }
    }
    let remote = job.transport.as_deref() == Some("remote") || rec.str("transport") == Some("remote");
    let secret = dispatch_secret(ctx);
    if remote && secret.is_none() {
        return Err(missing_secret());
    }
    let mut req = operator(ctx, Kind::Redispatch, id);
    req.iteration = job.iteration.map(u64::from);
    req.tokens = Some(Tokens {
        dispatch_token: random("dispatch_token", clock::new_dispatch_token())?,
        local_auth_token: random("auth_token", clock::new_auth_token())?,
        dispatch_secret: secret,
    });
    // Only what the caller gave explicitly changes on a re-dispatch (env defaults do not).
    let f = &mut req.fields;
    let t = &job.timing;
    if let Some(s) = &job.session {
        f.insert("agent_session".into(), s.clone().into());
    }
    if let Some(tr) = &job.transport {
        f.insert("transport".into(), tr.clone().into());
    }
    for (k, v) in [
        ("heartbeat_sec", t.heartbeat_sec),
        ("heartbeat_misses", t.heartbeat_misses),
        ("ack_timeout_sec", t.ack_timeout),
        ("timeout_sec", t.timeout),
    ] {
        if let Some(v) = v {
            f.insert(k.into(), v.into());
        }
    }
    match t.idle_timeout {
        Some(0) => {
            f.insert("idle_timeout_explicit".into(), false.into());
        }
        Some(v) => {
            f.insert("idle_timeout_sec".into(), v.into());
            f.insert("idle_timeout_explicit".into(), true.into());
        }
        None => {}
    }
    if let Some(p) = &job.brief_path {
        f.insert("brief_path".into(), abs_path(ctx, p).into());
    }
    if let Some(p) = &job.report_path {
        f.insert("report_path".into(), abs_path(ctx, p).into());
    }
    if let Some(p) = &job.parent {
        f.insert("parent_job_id".into(), p.clone().into());
    }
    if let Some(o) = &job.orchestrator {
        f.insert("orchestrator_uuid".into(), o.clone().into());
    }
    apply(ctx, store, &req)
}

/// `status --set`, `finalize` and `expire`: operator closes (A4).
fn close_job(ctx: &Ctx, store: &Store, id: &str, kind: Kind, target: Option<String>, c: Close) -> Result<i32, Failure> {
    let closed = operator_close(ctx, store, id, kind.clone(), target.as_deref(), &c)?;
    for w in &closed.warnings {
        ctx.diag(w);
    }
    let out = closed.outcome;
    match &out.decision {
        Decision::Applied(a) => {
            ctx.say(&format!("{id} {} -> {}", a.from.as_deref().unwrap_or(""), a.to));
            Ok(0)
        }
        Decision::Idempotent { status } => {
            ctx.say(&format!("{id} already {status}"));
            Ok(0)
        }
        Decision::Refused { reason } => {
            let current = out.before.as_ref().map(|r| r.status().to_string()).unwrap_or_default();
            match (kind, target) {
                (Kind::Set, Some(s)) => {
                    Err(Failure::refused(format!("{id}: cannot set {s} over {current} ({reason})")))
                }
                _ => Err(Failure::refused(format!("{id}: {reason}"))),
            }
        }
        Decision::Invalid(_) | Decision::UnknownJob => Ok(1),
    }
}

/// What `operator_close` did: the engine's outcome and the WARNING lines (audit, timer, publish)
/// for the caller to print. The exit code never depends on a warning (A4).
#[derive(Debug)]
pub struct Closed {
    pub outcome: Outcome,
    pub warnings: Vec<String>,
}

/// The options of an operator close (`--reason`, `--expected-attempt`, `--no-publish`).
#[derive(Debug, Default, Clone)]
pub struct Close {
    pub reason: Option<String>,
    pub expected_attempt: Option<u64>,
    pub no_publish: bool,
}

/// The library form of `status --set`, `finalize` and `expire` (A4, CORE 7.4): one operator request
/// through the engine; when it applied a terminal status, the job's heartbeat timer is stopped with a
/// drain and the signed retained close state is published (unless `no_publish`). Never prints.
/// `delegate-job` closes its jobs through this very function.
pub fn operator_close(
    ctx: &Ctx,
    store: &Store,
    id: &str,
    kind: Kind,
    target: Option<&str>,
    c: &Close,
) -> Result<Closed, Failure> {
    let mut req = operator(ctx, kind.clone(), id);
    req.target_status = target.map(str::to_string);
    req.reason = c.reason.clone();
    req.expected_attempt = c.expected_attempt;
    // A4: a close that will be published takes its fresh seq in the same write.
    let closes = matches!(kind, Kind::Expire | Kind::Finalize) || target.is_some_and(registry::is_terminal);
    req.alloc_seq = closes && !c.no_publish;
    let out = store.apply(&req, clock::now_ms()).map_err(store_failure)?;
    let mut warnings = Vec::new();
    if let Some(w) = &out.audit_error {
        warnings.push(format!("WARNING: {w}"));
    }
    if let Decision::Applied(a) = &out.decision {
        if registry::is_terminal(&a.to) {
            // CORE 7.4 then A4, unless --no-publish: the one implementation in publish::close.
            close::after_close(ctx, store, &a.record, !c.no_publish, &mut |l| warnings.push(l));
        }
    }
    Ok(Closed { outcome: out, warnings })
}

/// CORE 4.2 / 7.4: stop the job's heartbeat timer with a drain after an applied re-dispatch; returns
/// the warning lines. Runs after L1 is released (it takes L2 and may sleep).
fn stop_timer_quiet(ctx: &Ctx, store: &Store, job_id: &str) -> Vec<String> {
    let mut out = Vec::new();
    close::stop_job_timer(ctx, store, job_id, &mut |l| out.push(l));
    out
}

fn list(ctx: &Ctx, store: &Store, status: Option<String>, session: Option<String>, json: bool) -> Result<i32, Failure> {
    if let Some(s) = &status {
        if !valid_status(s) {
            return Err(Failure::runtime(format!(
                "invalid status '{}' (expected one of: {})",
                cli::one_line(s),
                registry::status_list()
            )));
        }
    }
    let mut recs = Vec::new();
    for id in store.job_ids().map_err(store_failure)? {
        match store.read(&id) {
            Ok(Some(r)) => recs.push(r),
            Ok(None) => {} // removed since the listing
            Err(e) => ctx.diag(&format!("WARNING: {e}; skipped")),
        }
    }
    recs.retain(|r| status.as_deref().is_none_or(|s| r.status() == s));
    recs.retain(|r| session.as_deref().is_none_or(|s| r.str("agent_session") == Some(s)));
    recs.sort_by(|a, b| {
        (a.str("created_at").unwrap_or(""), a.str("job_id").unwrap_or(""))
            .cmp(&(b.str("created_at").unwrap_or(""), b.str("job_id").unwrap_or("")))
    });
    if json {
        let all: Vec<Value> = recs.iter().map(Record::redacted).collect();
        ctx.say(&pretty(&Value::Array(all)));
        return Ok(0);
    }
    for r in &recs {
        let text = |k: &str| match r.get(k) {
            Some(Value::String(s)) => cli::one_line(s),
            Some(Value::Null) | None => String::new(),
            Some(v) => v.to_string(),
        };
        ctx.say(&format!(
            "{}\t{}\t{}\t{}\t{}",
            text("job_id"),
            text("status"),
            text("attempt"),
            text("agent_session"),
            text("updated_at")
        ));
    }
    Ok(0)
}

fn scrub(ctx: &Ctx, store: &Store, dry_run: bool) -> Result<i32, Failure> {
    let mut selected = Vec::new();
    for id in store.job_ids().map_err(store_failure)? {
        match store.read(&id) {
            Ok(Some(r)) if r.has_stored_password() => selected.push(id),
            Ok(_) => {}
            Err(e) => ctx.diag(&format!("WARNING: {e}; skipped")),
        }
    }
    selected.sort();
    if dry_run {
        ctx.say(&format!("would scrub {} record(s)", selected.len()));
        for id in &selected {
            ctx.say(&format!("  {id}"));
        }
        return Ok(0);
    }
    let mut n = 0;
    for id in &selected {
        // One L1 transaction per record, never one lock for the whole registry (CORE 4.2).
        let out = apply(ctx, store, &operator(ctx, Kind::Scrub, id))?;
        if let Decision::Applied(_) = out.decision {
            n += 1;
        }
    }
    ctx.say(&format!("scrubbed {n} record(s)"));
    Ok(0)
}

/// CORE 4.5: `DELEGATE_JOB_LOGS_DIR=<q logs> <q abs-mam> publish --registry-dir <q registry>
/// --job-id <id> --attempt <a> --dispatch-token <t> --event`.
fn publish_cmd(ctx: &Ctx, store: &Store, id: &str) -> Result<i32, Failure> {
    let rec = store.read_existing(id).map_err(store_failure)?;
    let mut line = publish_cmd_line(ctx, store, &rec)?;
    line.push(b'\n');
    ctx.say_raw(&line);
    Ok(0)
}

/// The mam executable a command line for an agent names: `MAM_BIN` (absolute), else this binary.
pub fn mam_exe(ctx: &Ctx) -> Result<PathBuf, Failure> {
    match ctx.path_var("MAM_BIN") {
        Some(p) => Ok(sys::absolutize(ctx.cwd(), &p)),
        None => std::env::current_exe().map_err(|e| Failure::runtime(format!("cannot find the mam executable ({e})"))),
    }
}

/// The publish-cmd line of `rec` (CORE 4.5) without a trailing newline; the caller appends the event
/// and its options. Every path is quoted, so the line runs unchanged from any cwd (ORCH 0.3).
pub fn publish_cmd_line(ctx: &Ctx, store: &Store, rec: &Record) -> Result<Vec<u8>, Failure> {
    use std::os::unix::ffi::OsStrExt;
    let id = rec.str("job_id").unwrap_or_default();
    let mam = mam_exe(ctx)?;
    let attempt = rec.attempt().ok_or_else(|| Failure::runtime(format!("job {id}: record has no attempt")))?;
    let token = rec
        .str("dispatch_token")
        .filter(|t| t.bytes().all(|b| b.is_ascii_hexdigit()) && !t.is_empty())
        .ok_or_else(|| Failure::runtime(format!("job {id}: record has no valid dispatch_token")))?;
    let mut line = b"DELEGATE_JOB_LOGS_DIR=".to_vec();
    line.extend(cli::shell_quote_bytes(store.logs.as_os_str().as_bytes()));
    line.push(b' ');
    line.extend(cli::shell_quote_bytes(mam.as_os_str().as_bytes()));
    line.extend_from_slice(b" publish --registry-dir ");
    line.extend(cli::shell_quote_bytes(store.registry.as_os_str().as_bytes()));
    line.extend_from_slice(format!(" --job-id {id} --attempt {attempt} --dispatch-token {token} --event").as_bytes());
    Ok(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Parsed<Args>, Failure> {
        parse_args(args.iter().map(OsString::from).collect())
    }

    #[test]
    fn meta_pairs() {
        assert_eq!(meta_pair("a=b=c").unwrap(), ("a".into(), Value::from("b=c")));
        assert_eq!(meta_pair("watcher_pid:=12").unwrap(), ("watcher_pid".into(), Value::from(12)));
        assert_eq!(meta_pair("x:=null").unwrap(), ("x".into(), Value::Null));
        for bad in ["novalue", "=v", "1a=b", "a b=c", "x:=nojson"] {
            assert_eq!(meta_pair(bad).unwrap_err().rc, 2, "{bad}");
        }
    }

    #[test]
    fn flags_are_checked_per_subcommand() {
        assert!(matches!(parse(&["show", "j1"]), Ok(Parsed::Run(_))));
        assert_eq!(
            parse(&["show", "j1", "--set", "running"]).unwrap_err().line,
            "ERROR: registry show: unexpected option --set"
        );
        assert_eq!(parse(&["register"]).unwrap_err().line, "ERROR: registry register: --session is required");
        assert_eq!(
            parse(&["submit", "--session", "w"]).unwrap_err().line,
            "ERROR: registry submit: --type is required"
        );
        assert_eq!(parse(&["bogus"]).unwrap_err().rc, 2);
        assert_eq!(parse(&[]).unwrap_err().rc, 2);
        assert_eq!(parse(&["show"]).unwrap_err().line, "ERROR: registry show: missing job id");
        assert_eq!(parse(&["show", "a", "b"]).unwrap_err().rc, 2);
        assert_eq!(parse(&["status", "a", "--reason", "x"]).unwrap_err().rc, 2);
        for bad in ["a/b", "..", "+", "#", "a\nb"] {
            let e = parse(&["show", bad]).unwrap_err();
            assert_eq!(e.rc, 2, "{bad}");
            assert!(!e.line.contains('\n'));
        }
        let long = "a".repeat(200);
        let e = parse(&["show", &long]).unwrap_err();
        assert!(e.line.len() < 200, "{}", e.line);
    }

    #[test]
    fn e14_timing_flags_use_the_knob_grammar() {
        for flag in ["--heartbeat-sec", "--heartbeat-misses", "--ack-timeout", "--idle-timeout", "--timeout"] {
            for bad in ["\u{2003} 30\u{2003}", "３０", "+30", "-1", "3x", ""] {
                let e = parse(&["register", "--session", "w", flag, bad]).unwrap_err();
                assert_eq!(e.rc, 2, "{flag} {bad:?}");
            }
            assert!(matches!(parse(&["register", "--session", "w", flag, " 30 "]), Ok(Parsed::Run(_))));
        }
    }
}
