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
use crate::ops::{self, Close, NewJob, OpsError};
use crate::paths;
use crate::registry::engine::{Kind, Request};
use crate::registry::record::{Field, Fields, Picked};
use crate::registry::store::{Decided, Outcome, Store, StoreError};
use crate::registry::{self, valid_status};
use crate::text;

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
  repoint [ID...] --broker LIST [--dry-run]
                 give every open job (or the ones named) the broker list LIST (comma-separated
                 host[:port], MQTT_PORT for an entry without one); one record at a time
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

#[derive(Debug)]
enum Sub {
    Paths,
    Register { job: NewJob, json: bool },
    Submit(NewJob),
    Show { id: String },
    List { status: Option<String>, session: Option<String>, json: bool },
    Status { id: String, set: Option<String>, close: Close },
    Finalize { id: String, status: String, close: Close },
    Expire { id: String, close: Close },
    SetMeta { id: String, fields: Map<String, Value>, expected_attempt: Option<u64> },
    Scrub { dry_run: bool },
    Repoint { ids: Vec<String>, broker: String, dry_run: bool },
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
    json: bool,
    broker: Option<String>,
}

fn job_id_arg(flag: &str, v: &str) -> Result<String, Failure> {
    if clock::valid_job_id(v) {
        Ok(v.to_string())
    } else {
        let mut shown = text::one_line(v);
        if shown.chars().count() > 80 {
            shown = shown.chars().take(80).collect::<String>() + "...";
        }
        Err(Failure::usage(format!("{flag}: invalid job id '{shown}' (expected ^[A-Za-z0-9][A-Za-z0-9._-]{{0,63}}$)")))
    }
}

/// The value of `--type` (`registry register`/`submit`, `delegate-job`): one of `registry::TYPES`.
pub(crate) fn type_arg(v: String) -> Result<String, Failure> {
    if !registry::TYPES.contains(&v.as_str()) {
        return Err(Failure::usage(format!(
            "--type: invalid type '{}' (expected task, loop or discuss)",
            text::one_line(&v)
        )));
    }
    Ok(v)
}

/// The value of `--orchestrator`: 1-128 printable ASCII characters.
pub(crate) fn orchestrator_arg(v: String) -> Result<String, Failure> {
    if v.is_empty() || v.len() > 128 || !v.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Failure::usage(format!(
            "--orchestrator: invalid value '{}' (expected 1-128 printable ASCII characters)",
            text::one_line(&v)
        )));
    }
    Ok(v)
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
        "repoint" => &["--broker", "--dry-run"],
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
                        text::one_line(&v)
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
                r.job.job_type = Some(type_arg(cli::utf8("--type", p.value()?)?)?);
                "--type"
            }
            Long("transport") => {
                let v = cli::utf8("--transport", p.value()?)?;
                if v != "local" && v != "remote" {
                    return Err(Failure::usage(format!(
                        "--transport: invalid transport '{}' (expected local or remote)",
                        text::one_line(&v)
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
                let v = orchestrator_arg(cli::utf8("--orchestrator", p.value()?)?)?;
                r.job.orchestrator = Some(v);
                "--orchestrator"
            }
            Long("json") => {
                r.json = true;
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
            Long("broker") => {
                let v = cli::utf8("--broker", p.value()?)?;
                // The grammar now; the ports of entries without one once MQTT_PORT is known.
                if let Err(why) = crate::mqtt::config::parse_broker_list(&v, 1) {
                    return Err(Failure::usage(format!(
                        "--broker: '{}' is not a broker list (expected comma-separated host[:port]; {why})",
                        text::one_line(&v)
                    )));
                }
                r.broker = Some(v);
                "--broker"
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
        return Err(Failure::usage(format!("registry: unknown subcommand '{}'", text::one_line(&sub))));
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
    let mut ids = Vec::new();
    for extra in pos {
        if sub == "repoint" {
            ids.push(job_id_arg("repoint", &extra)?);
            continue;
        }
        if sub != "set-meta" {
            return Err(Failure::usage(format!("registry {sub}: unexpected argument '{}'", text::one_line(&extra))));
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
                Sub::Register { job: r.job, json: r.json }
            } else {
                if r.job.job_type.is_none() {
                    return Err(Failure::usage("registry submit: --type is required"));
                }
                Sub::Submit(r.job)
            }
        }
        "list" => Sub::List { status: r.status, session: r.job.session, json: r.json },
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
        "repoint" => {
            let Some(broker) = r.broker else {
                return Err(Failure::usage("registry repoint: --broker LIST is required"));
            };
            Sub::Repoint { ids, broker, dry_run: r.dry_run }
        }
        _ => unreachable!("allowed() lists every subcommand"),
    };
    Ok(Parsed::Run(Args { registry_dir: r.registry_dir, sub }))
}

/// `KEY=VALUE` (a string) or `KEY:=JSON` (any JSON value). Keys are `[A-Za-z_][A-Za-z0-9_.-]*`.
fn meta_pair(s: &str) -> Result<(String, Value), Failure> {
    let bad = || Failure::usage(format!("set-meta: expected KEY=VALUE or KEY:=JSON, got '{}'", text::one_line(s)));
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
        serde_json::from_str(v).map_err(|e| {
            Failure::usage(format!("set-meta: {key}: invalid JSON ({})", text::one_line(&e.to_string())))
        })?
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
    let resolved = paths::resolve(ctx, a.registry_dir.as_deref())?;
    let store = Store::from_resolved(&resolved);
    match a.sub {
        Sub::Paths => {
            ctx.say(&format!("registry={}", resolved.registry.to_string_lossy()));
            ctx.say(&format!("logs={}", resolved.logs.to_string_lossy()));
            Ok(0)
        }
        Sub::Register { job, json } => register(ctx, &store, job, json),
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
            let mut req = ops::operator(ctx, Kind::Metadata, &id);
            req.fields = fields;
            req.expected_attempt = expected_attempt;
            let out = apply(ctx, &store, &req)?;
            match &out.decision {
                Decided::Applied(a) => {
                    let keys: Vec<&str> = req.fields.keys().map(String::as_str).collect();
                    ctx.say(&format!("{id} updated {} transition_seq={}", keys.join(","), a.transition_seq));
                    Ok(0)
                }
                Decided::Refused { reason } => Err(cli::job_refused(&id, reason)),
                _ => Ok(0),
            }
        }
        Sub::Scrub { dry_run } => scrub(ctx, &store, dry_run),
        Sub::Repoint { ids, broker, dry_run } => repoint(ctx, &store, &ids, &broker, dry_run),
        Sub::PublishCmd { id } => publish_cmd(ctx, &store, &id),
    }
}

fn store_failure(e: StoreError) -> Failure {
    Failure::runtime(e)
}

fn ops_failure(e: OpsError) -> Failure {
    match e {
        OpsError::Config(c) => c.into(),
        e => Failure::runtime(e),
    }
}

/// Runs one request, printing a WARNING when the audit could not be written (the rc stays).
fn apply(ctx: &Ctx, store: &Store, req: &Request) -> Result<Outcome, Failure> {
    let out = ops::apply(store, req).map_err(ops_failure)?;
    audit_warning(ctx, &out);
    Ok(out)
}

fn audit_warning(ctx: &Ctx, out: &Outcome) {
    if let Some(w) = &out.audit_error {
        ctx.diag(&format!("WARNING: {w}"));
    }
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).expect("a JSON value always serialises")
}

fn register(ctx: &Ctx, store: &Store, job: NewJob, json: bool) -> Result<i32, Failure> {
    let (id, out) = ops::register_new(ctx, store, &job).map_err(ops_failure)?;
    audit_warning(ctx, &out);
    match &out.decision {
        Decided::Applied(a) => {
            if let Some(w) = ops::window_warning(ctx, &a.record) {
                ctx.diag(&w);
            }
            if json {
                ctx.say(&pretty(&a.record.redacted()));
            } else {
                ctx.say(&id);
            }
            Ok(0)
        }
        Decided::Refused { reason } => Err(cli::job_refused(&id, reason)),
        Decided::Idempotent { status } => {
            ctx.say(&format!("{id} already {status}"));
            Ok(0)
        }
    }
}

fn submit(ctx: &Ctx, store: &Store, job: NewJob) -> Result<i32, Failure> {
    let (out, warnings) = ops::submit_job(ctx, store, &job).map_err(ops_failure)?;
    audit_warning(ctx, &out);
    let id = out.record().and_then(|r| r.str("job_id")).unwrap_or_default().to_string();
    match &out.decision {
        Decided::Applied(a) => {
            let r = &a.record;
            if let Some(w) = ops::window_warning(ctx, r) {
                ctx.diag(&w);
            }
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
        Decided::Refused { reason } => Err(cli::job_refused(&id, reason)),
        Decided::Idempotent { status } => {
            ctx.say(&format!("{id} already {status}"));
            Ok(0)
        }
    }
}

/// `status --set`, `finalize` and `expire`: operator closes (A4).
fn close_job(ctx: &Ctx, store: &Store, id: &str, kind: Kind, target: Option<String>, c: Close) -> Result<i32, Failure> {
    let closed = ops::operator_close(ctx, store, id, kind.clone(), target.as_deref(), &c).map_err(ops_failure)?;
    for w in &closed.warnings {
        ctx.diag(w);
    }
    let out = closed.outcome;
    match &out.decision {
        Decided::Applied(a) => {
            ctx.say(&format!("{id} {} -> {}", a.from.as_deref().unwrap_or(""), a.to));
            Ok(0)
        }
        Decided::Idempotent { status } => {
            ctx.say(&format!("{id} already {status}"));
            Ok(0)
        }
        Decided::Refused { reason } => {
            let current = out.before.as_ref().map(|r| r.status().to_string()).unwrap_or_default();
            match (kind, target) {
                (Kind::Set, Some(s)) => {
                    let words = crate::registry::engine::explain(reason).unwrap_or("refused");
                    Err(Failure::refused(format!(
                        "{id}: cannot set {s} over {current} ({reason}: {words}); the record is unchanged"
                    )))
                }
                _ => Err(cli::job_refused(id, reason)),
            }
        }
    }
}

/// The fields `registry list` reads from each record (its filters, sort key and columns).
const LIST_FIELDS: &[&str] = &["job_id", "status", "attempt", "agent_session", "updated_at", "created_at"];

/// One listed record, kept small: its sort key (created_at, job_id) and what is printed for it
/// (the text line, or for `--json` the file's id, read again when its turn comes), in one string.
struct Listed {
    buf: Box<str>,
    created: u32,
    id: u32,
}

impl Listed {
    fn new(created: &str, id: &str, payload: &str) -> Listed {
        let mut s = String::with_capacity(created.len() + id.len() + payload.len());
        s.push_str(created);
        s.push_str(id);
        s.push_str(payload);
        Listed { buf: s.into_boxed_str(), created: created.len() as u32, id: id.len() as u32 }
    }

    fn payload(&self) -> &str {
        &self.buf[(self.created + self.id) as usize..]
    }

    /// `(key, payload)` as bytes, for the sort: the same order as the strings' (both compare byte
    /// by byte), without a char-boundary check per comparison (100,000 records sort in about
    /// 1.7 million comparisons).
    fn sort_key(&self) -> (&[u8], &[u8], &[u8]) {
        let (c, i) = (self.created as usize, (self.created + self.id) as usize);
        let b = self.buf.as_bytes();
        (&b[..c], &b[c..i], &b[i..])
    }
}

/// `registry list`: one pass over the records reading only `LIST_FIELDS`, keeping a `Listed` per
/// match (a few dozen bytes, not the record), sorted by created_at then id. `--json` reads each listed record again, in order, one at a time, and streams
/// the array out.
fn list(ctx: &Ctx, store: &Store, status: Option<String>, session: Option<String>, json: bool) -> Result<i32, Failure> {
    if let Some(s) = &status {
        if !valid_status(s) {
            return Err(Failure::runtime(format!(
                "invalid status '{}' (expected one of: {})",
                text::one_line(s),
                registry::status_list()
            )));
        }
    }
    let wanted = |r: &dyn Fields| {
        status.as_deref().is_none_or(|s| r.status() == s)
            && session.as_deref().is_none_or(|s| r.str("agent_session") == Some(s))
    };
    let parts = store
        .scan_records(
            crate::registry::store::listing_threads(),
            || (Vec::new(), Vec::new()),
            |(listed, warnings): &mut (Vec<Listed>, Vec<String>), e| {
                let parsed = e.bytes.and_then(|b| {
                    Picked::parse(b, LIST_FIELDS)
                        .map_err(|why| StoreError::Corrupt { path: store.record_path(e.id), why: why.to_string() })
                });
                let r = match parsed {
                    Ok(r) => r,
                    Err(err) => return warnings.push(format!("WARNING: {err}; skipped")),
                };
                if !wanted(&r) {
                    return;
                }
                let created = r.str("created_at").unwrap_or("");
                let id = r.str("job_id").unwrap_or("");
                listed.push(Listed::new(created, id, if json { e.id.to_string() } else { list_line(&r) }.as_str()));
            },
        )
        .map_err(store_failure)?;
    let mut listed = Vec::new();
    for (part, warnings) in parts {
        for w in warnings {
            ctx.diag(&w);
        }
        if listed.is_empty() {
            listed = part;
        } else {
            listed.extend(part);
        }
    }
    // Then by what is printed: records that agree on both keys still come in one order.
    listed.sort_unstable_by(|a, b| a.sort_key().cmp(&b.sort_key()));
    let mut out = crate::ctx::OutBuf::new(ctx);
    if !json {
        for l in &listed {
            out.line(l.payload());
        }
        return Ok(0);
    }
    let records = listed.iter().filter_map(|l| match store.read(l.payload()) {
        Ok(Some(r)) if wanted(&r) => Some(r.redacted()),
        Ok(_) => None, // removed or changed since the first pass
        Err(e) => {
            ctx.diag(&format!("WARNING: {e}; skipped"));
            None
        }
    });
    let mut ser = serde_json::Serializer::pretty(&mut out);
    serde::Serializer::collect_seq(&mut ser, records).map_err(|e| Failure::runtime(format!("registry list: {e}")))?;
    out.line("");
    Ok(0)
}

/// One `registry list` line: id, status, attempt, session, updated_at, tab separated.
fn list_line(r: &Picked) -> String {
    let text = |k: &str| match r.get(k) {
        Some(f @ (Field::Str(_) | Field::Value(Value::String(_)))) => text::one_line(f.as_str().unwrap_or("")),
        Some(Field::Value(Value::Null)) | None => String::new(),
        Some(Field::Value(v)) => v.to_string(),
    };
    format!(
        "{}\t{}\t{}\t{}\t{}",
        text("job_id"),
        text("status"),
        text("attempt"),
        text("agent_session"),
        text("updated_at")
    )
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
    crate::sort::natural(&mut selected);
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
        let out = apply(ctx, store, &ops::operator(ctx, Kind::Scrub, id))?;
        if let Decided::Applied(_) = out.decision {
            n += 1;
        }
    }
    ctx.say(&format!("scrubbed {n} record(s)"));
    Ok(0)
}

/// `repoint`: one line per job re-pointed (or skipped, with why), then the count.
fn repoint(ctx: &Ctx, store: &Store, ids: &[String], broker: &str, dry_run: bool) -> Result<i32, Failure> {
    let (_, port) = crate::mqtt::config::tls_and_port(ctx)?;
    let list = crate::mqtt::config::parse_broker_list(broker, port).map_err(|why| {
        Failure::usage(format!("--broker: '{}' is not a broker list ({why})", text::one_line(broker)))
    })?;
    let shown = crate::mqtt::config::show_list(&list);
    let done = ops::repoint(ctx, store, ids, &list, dry_run).map_err(ops_failure)?;
    let mut n = 0;
    for r in &done {
        match &r.skipped {
            None => {
                n += 1;
                ctx.say(&format!("  {}", r.job_id));
            }
            Some(why) => ctx.say(&format!("  {} skipped ({why})", r.job_id)),
        }
    }
    let verb = if dry_run { "would repoint" } else { "repointed" };
    ctx.say(&format!("{verb} {n} job(s) to {shown}"));
    // A named job that could not be re-pointed is the caller's to know about.
    let missing = done.iter().any(|r| r.skipped.as_deref() == Some("no such job"));
    Ok(if missing { 1 } else { 0 })
}

/// CORE 4.5: `<q abs-mam> publish --registry-dir <q registry> --logs-dir <q logs> --job-id <id>
/// --attempt <a> --dispatch-token <t> --event`.
fn publish_cmd(ctx: &Ctx, store: &Store, id: &str) -> Result<i32, Failure> {
    let rec = store.read_existing(id).map_err(store_failure)?;
    let mut line = ops::publish_cmd_line(ctx, store, &rec).map_err(ops_failure)?;
    line.push(b'\n');
    ctx.say_raw(&line);
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `registry register`/`submit` and `delegate-job` share these two checks and their lines.
    #[test]
    fn type_and_orchestrator_values() {
        assert_eq!(type_arg("loop".into()).unwrap(), "loop");
        assert_eq!(
            type_arg("big\njob".into()).unwrap_err().line,
            "ERROR: --type: invalid type 'big\\njob' (expected task, loop or discuss)"
        );
        assert_eq!(orchestrator_arg("ses_abc123".into()).unwrap(), "ses_abc123");
        for bad in ["", "two words", &"x".repeat(129)] {
            let e = orchestrator_arg(bad.into()).unwrap_err();
            assert!(e.line.ends_with("(expected 1-128 printable ASCII characters)") && e.rc == 2, "{bad:?}");
        }
        assert!(orchestrator_arg("x".repeat(128)).is_ok());
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
        assert!(matches!(parse_args(cli::argv(&["show", "j1"])), Ok(Parsed::Run(_))));
        assert_eq!(
            parse_args(cli::argv(&["show", "j1", "--set", "running"])).unwrap_err().line,
            "ERROR: registry show: unexpected option --set"
        );
        assert_eq!(
            parse_args(cli::argv(&["register"])).unwrap_err().line,
            "ERROR: registry register: --session is required"
        );
        assert_eq!(
            parse_args(cli::argv(&["submit", "--session", "w"])).unwrap_err().line,
            "ERROR: registry submit: --type is required"
        );
        assert_eq!(parse_args(cli::argv(&["bogus"])).unwrap_err().rc, 2);
        assert_eq!(parse_args(cli::argv(&[])).unwrap_err().rc, 2);
        assert_eq!(parse_args(cli::argv(&["show"])).unwrap_err().line, "ERROR: registry show: missing job id");
        assert_eq!(parse_args(cli::argv(&["show", "a", "b"])).unwrap_err().rc, 2);
        assert_eq!(parse_args(cli::argv(&["status", "a", "--reason", "x"])).unwrap_err().rc, 2);
        for bad in ["a/b", "..", "+", "#", "a\nb"] {
            let e = parse_args(cli::argv(&["show", bad])).unwrap_err();
            assert_eq!(e.rc, 2, "{bad}");
            assert!(!e.line.contains('\n'));
        }
        let long = "a".repeat(200);
        let e = parse_args(cli::argv(&["show", &long])).unwrap_err();
        assert!(e.line.len() < 200, "{}", e.line);
    }

    #[test]
    fn e14_timing_flags_use_the_knob_grammar() {
        for flag in ["--heartbeat-sec", "--heartbeat-misses", "--ack-timeout", "--idle-timeout", "--timeout"] {
            for bad in ["\u{2003} 30\u{2003}", "３０", "+30", "-1", "3x", ""] {
                let e = parse_args(cli::argv(&["register", "--session", "w", flag, bad])).unwrap_err();
                assert_eq!(e.rc, 2, "{flag} {bad:?}");
            }
            assert!(matches!(parse_args(cli::argv(&["register", "--session", "w", flag, " 30 "])), Ok(Parsed::Run(_))));
        }
    }
}
