//! The registry operations behind `mam registry` and every library caller (`delegate-job`, the loop to
//! come): registering a new job with its initial record (CORE 4.1, A5), `submit`'s register-or-
//! re-dispatch (CORE 4.2), the operator closes of A4 with their follow-up (timer stop, close state),
//! and the publish command line an agent runs (CORE 4.5). They sit above both `registry` and
//! `publish` (a close stops the timer and publishes the close state), so they are a module of their
//! own, not a part of `registry`.
//!
//! Every state change goes through the engine via `Store::apply`. Nothing here prints or picks an exit
//! code: results are values, warnings are returned lines, failures are `OpsError`.

use std::fmt;
use std::io;
use std::path::PathBuf;

use serde_json::{Map, Value};

use crate::clock;
use crate::ctx::Ctx;
use crate::knob::{self, ConfigError};
use crate::mqtt::MqttConfig;
use crate::publish::close;
use crate::registry::engine::{Authority, Kind, Request, Tokens};
use crate::registry::record::{NewRecord, Record};
use crate::registry::store::{Decided, Outcome, Store, StoreError};
use crate::registry::{is_terminal, remote_auth_token};
use crate::sys;
use crate::text;

/// Why a registry operation could not reach (or act on) an engine decision. Refusals are not errors:
/// they are `Decided::Refused` in the outcome.
#[derive(Debug)]
pub enum OpsError {
    Store(StoreError),
    /// A knob (timing default, MQTT setting) with an invalid value.
    Config(ConfigError),
    /// `transport remote` without `MAM_DISPATCH_SECRET`.
    MissingSecret,
    Random {
        what: &'static str,
        err: io::Error,
    },
    /// A re-dispatch asked for another job type than the record has.
    TypeMismatch {
        id: String,
        have: String,
        want: String,
    },
    /// The record lacks what the operation needs (named in the message).
    Record(String),
    /// This process's own executable could not be found.
    Exe(io::Error),
}

impl fmt::Display for OpsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpsError::Store(e) => e.fmt(f),
            OpsError::Config(e) => e.fmt(f),
            OpsError::MissingSecret => f.write_str("MAM_DISPATCH_SECRET is required for transport remote"),
            OpsError::Random { what, err } => write!(f, "cannot get random bytes for {what} ({err})"),
            OpsError::TypeMismatch { id, have, want } => write!(f, "job {id} has type '{have}', not '{want}'"),
            OpsError::Record(m) => f.write_str(m),
            OpsError::Exe(e) => write!(f, "cannot find the mam executable ({e})"),
        }
    }
}

impl From<StoreError> for OpsError {
    fn from(e: StoreError) -> OpsError {
        OpsError::Store(e)
    }
}

impl From<ConfigError> for OpsError {
    fn from(e: ConfigError) -> OpsError {
        OpsError::Config(e)
    }
}

/// The timing flags of `register`/`submit` (absent: the env default, CORE 4.1).
#[derive(Debug, Default, Clone)]
pub struct Timing {
    pub timeout: Option<u32>,
    pub heartbeat_sec: Option<u32>,
    pub heartbeat_misses: Option<u32>,
    pub ack_timeout: Option<u32>,
    pub idle_timeout: Option<u32>,
}

/// A job to register or re-dispatch: the flags of `register`/`submit`, and what `delegate-job` asks for.
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
}

pub fn cas_enabled(ctx: &Ctx) -> bool {
    ctx.var("MAM_ENGINE_CAS").as_deref() != Some("0")
}

/// An operator request of `kind` for job `id`, with the engine mode of `MAM_ENGINE_CAS`.
pub fn operator(ctx: &Ctx, kind: Kind, id: &str) -> Request {
    let mut r = Request::new(kind, Authority::Operator, id);
    r.cas = cas_enabled(ctx);
    r
}

/// Runs one request now. An audit that could not be written is in `Outcome::audit_error`; the caller
/// prints it as a WARNING (the exit code stays).
pub fn apply(store: &Store, req: &Request) -> Result<Outcome, OpsError> {
    Ok(store.apply(req, clock::now_ms())?)
}

/// The record's broker block (CORE 3.1) from the effective MQTT configuration. Never a password.
fn broker_block(ctx: &Ctx) -> Result<Value, OpsError> {
    let block = MqttConfig::from_ctx(ctx)?.broker_block();
    Ok(serde_json::to_value(block).expect("a broker block always serialises"))
}

fn dispatch_secret(ctx: &Ctx) -> Option<Vec<u8>> {
    ctx.var_nonempty("MAM_DISPATCH_SECRET").map(String::into_bytes)
}

fn missing_secret() -> OpsError {
    OpsError::MissingSecret
}

fn random(what: &'static str, r: io::Result<String>) -> Result<String, OpsError> {
    r.map_err(|err| OpsError::Random { what, err })
}

fn abs_path(ctx: &Ctx, p: &std::path::Path) -> String {
    sys::absolutize(ctx.cwd(), p).to_string_lossy().into_owned()
}

/// The initial record of a new job (CORE 4.1, A5).
fn initial_record(ctx: &Ctx, job: &NewJob, id: &str, now: u64) -> Result<Map<String, Value>, OpsError> {
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
    // Issue 19: a '.' of the id is carried as '~' (NATS refuses '.' in a topic).
    let topic_prefix = crate::mqtt::config::job_topic_prefix(broker["topic_root"].as_str().unwrap_or("mam"), id);
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

/// Registers a new job; with no `--job-id`, a generated id that collides is drawn again. Returns
/// the id and the engine's outcome (a refusal included); audit warnings are in the outcome.
pub fn register_new(ctx: &Ctx, store: &Store, job: &NewJob) -> Result<(String, Outcome), OpsError> {
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
        let out = store.apply(&req, now)?;
        tries += 1;
        if job.job_id.is_none() && matches!(out.decision, Decided::Refused { .. }) && tries < 5 {
            continue;
        }
        return Ok((id, out));
    }
}

/// The library form of `submit`: registers `job` when its id is new (or absent), else re-dispatches
/// it (attempt+1, new tokens; the old attempt's timer is then stopped with a drain). Returns the
/// engine's outcome and the WARNING lines of the timer stop; refusals are in the outcome.
pub fn submit_job(ctx: &Ctx, store: &Store, job: &NewJob) -> Result<(Outcome, Vec<String>), OpsError> {
    let existing = match &job.job_id {
        Some(id) => store.read(id)?,
        None => None,
    };
    let out = match existing {
        None => {
            let (id, out) = register_new(ctx, store, job)?;
            match out.decision {
                // Someone registered it between our read and our request: re-dispatch instead.
                Decided::Refused { ref reason } if reason == "exists" && job.job_id.is_some() => {
                    let rec = store.read_existing(&id)?;
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
    if let Decided::Applied(a) = &out.decision {
        if a.from.is_some() {
            let id = a.record.str("job_id").unwrap_or_default().to_string();
            warnings = stop_timer_quiet(ctx, store, &id);
        }
    }
    Ok((out, warnings))
}

fn redispatch(ctx: &Ctx, store: &Store, job: &NewJob, id: &str, rec: &Record) -> Result<Outcome, OpsError> {
    if let (Some(want), Some(have)) = (job.job_type.as_deref(), rec.str("type")) {
        if want != have {
            return Err(OpsError::TypeMismatch { id: id.into(), have: have.into(), want: want.into() });
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
    apply(store, &req)
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

/// Issue 19: the WARNING for a job whose idle window (K x N) is shorter than a broker list of
/// several entries needs to survive a node's death (`window_floor_s`, docs/CLUSTER.md): a watcher
/// would close the live job while the cluster fails over. `None` for one broker or a long window.
pub fn window_warning(ctx: &Ctx, rec: &Record) -> Option<String> {
    use crate::mqtt::config::{window_floor_s, BrokerBlock};
    let block = rec.get("broker").and_then(|b| serde_json::from_value::<BrokerBlock>(b.clone()).ok())?;
    let brokers = block.list().len();
    if brokers < 2 {
        return None;
    }
    let n = rec.u64("heartbeat_sec").unwrap_or(30);
    let idle = rec.u64("idle_timeout_sec").unwrap_or(n * rec.u64("heartbeat_misses").unwrap_or(4));
    let connect_s = knob::env_or(ctx, "MAM_MQTT_CONNECT_TIMEOUT_S", 1, 10).unwrap_or(10);
    let floor = window_floor_s(n, connect_s.into());
    (idle < floor).then(|| {
        format!(
            "WARNING: job {}: an idle window of {idle}s is shorter than the {floor}s a list of {brokers} brokers \
             needs to outlast a node's death (docs/CLUSTER.md); a watcher may close the live job: raise \
             --heartbeat-misses or --idle-timeout",
            rec.str("job_id").unwrap_or("?")
        )
    })
}

/// One job `repoint` looked at: its id and what happened.
#[derive(Debug)]
pub struct Repointed {
    pub job_id: String,
    /// `None` when re-pointed (or, in a dry run, when it would be); else why it was left alone.
    pub skipped: Option<String>,
}

/// `mam registry repoint` (issue 19): every open job of the registry (or the ones named) gets `list`
/// as its broker list; TLS, username, CA and topic root stay. One L1 transaction per record (a
/// metadata request on the attempt read, like scrub's), never one lock for the whole registry.
/// Terminal jobs are left alone; a job already on `list` is skipped without a write.
pub fn repoint(
    ctx: &Ctx,
    store: &Store,
    ids: &[String],
    list: &[crate::mqtt::config::Endpoint],
    dry_run: bool,
) -> Result<Vec<Repointed>, OpsError> {
    use crate::mqtt::BrokerBlock;
    let all = if ids.is_empty() { store.job_ids()? } else { ids.to_vec() };
    let mut out = Vec::new();
    for id in all {
        let skip = |why: &str| Repointed { job_id: id.clone(), skipped: Some(why.to_string()) };
        let rec = match store.read(&id)? {
            Some(r) => r,
            None if ids.is_empty() => continue,
            None => {
                out.push(skip("no such job"));
                continue;
            }
        };
        if is_terminal(rec.status()) {
            out.push(skip(&format!("already {}", rec.status())));
            continue;
        }
        let block = match rec.get("broker").map(|b| serde_json::from_value::<BrokerBlock>(b.clone())) {
            Some(Ok(b)) => b,
            // A record without a block connects to the environment's broker; give it the new list.
            _ => MqttConfig::from_ctx(ctx)?.broker_block(),
        };
        if block.list() == list {
            out.push(skip("already on this list"));
            continue;
        }
        if dry_run {
            out.push(Repointed { job_id: id, skipped: None });
            continue;
        }
        let new = serde_json::to_value(block.with_list(list)).expect("a broker block always serialises");
        let mut req = operator(ctx, Kind::Metadata, &id);
        req.fields.insert("broker".into(), new);
        req.expected_attempt = rec.attempt();
        let o = store.apply(&req, clock::now_ms())?;
        out.push(match o.decision {
            Decided::Applied(_) => Repointed { job_id: id, skipped: None },
            Decided::Refused { reason } => skip(&format!("refused: {reason}")),
            Decided::Idempotent { status } => skip(&format!("already {status}")),
        });
    }
    Ok(out)
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
) -> Result<Closed, OpsError> {
    let mut req = operator(ctx, kind.clone(), id);
    req.target_status = target.map(str::to_string);
    req.reason = c.reason.clone();
    req.expected_attempt = c.expected_attempt;
    // A4: a close that will be published takes its fresh seq in the same write.
    let closes = matches!(kind, Kind::Expire | Kind::Finalize) || target.is_some_and(is_terminal);
    req.alloc_seq = closes && !c.no_publish;
    let out = store.apply(&req, clock::now_ms())?;
    let mut warnings = Vec::new();
    if let Some(w) = &out.audit_error {
        warnings.push(format!("WARNING: {w}"));
    }
    if let Decided::Applied(a) = &out.decision {
        if is_terminal(&a.to) {
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

/// The mam executable a command line for an agent names: `MAM_BIN` (absolute; from the real
/// environment only, never the env file: issue 12), else this binary.
pub fn mam_exe(ctx: &Ctx) -> Result<PathBuf, OpsError> {
    match ctx.env_only("MAM_BIN") {
        Some(p) => Ok(sys::absolutize(ctx.cwd(), &p)),
        None => std::env::current_exe().map_err(OpsError::Exe),
    }
}

/// The publish-cmd line of `rec` (CORE 4.5: `<q mam> publish --registry-dir <q registry> --logs-dir <q logs>
/// --job-id <id> --attempt <a> --dispatch-token <t> --event`) without a trailing newline; the caller appends the event
/// and its options. Every path is quoted, so the line runs unchanged from any cwd (ORCH 0.3).
pub fn publish_cmd_line(ctx: &Ctx, store: &Store, rec: &Record) -> Result<Vec<u8>, OpsError> {
    use std::os::unix::ffi::OsStrExt;
    let id = rec.str("job_id").unwrap_or_default();
    let mam = mam_exe(ctx)?;
    let attempt = rec.attempt().ok_or_else(|| OpsError::Record(format!("job {id}: record has no attempt")))?;
    let token = rec
        .str("dispatch_token")
        .filter(|t| t.bytes().all(|b| b.is_ascii_hexdigit()) && !t.is_empty())
        .ok_or_else(|| OpsError::Record(format!("job {id}: record has no valid dispatch_token")))?;
    // No `VAR=value` prefix (issue 30): a command that starts with one matches no allow rule for
    // mam's binary in claude, and an approval saved for it holds the value.
    let mut line = text::shell_quote_bytes(mam.as_os_str().as_bytes());
    line.extend_from_slice(b" publish --registry-dir ");
    line.extend(text::shell_quote_bytes(store.registry.as_os_str().as_bytes()));
    line.extend_from_slice(b" --logs-dir ");
    line.extend(text::shell_quote_bytes(store.logs.as_os_str().as_bytes()));
    line.extend_from_slice(format!(" --job-id {id} --attempt {attempt} --dispatch-token {token} --event").as_bytes());
    Ok(line)
}
