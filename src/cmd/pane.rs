//! `mam pane <verb>` (ORCH 1.1): ls, new-session, send-keys-safe, status, close, server-start over the
//! backend chosen by `MAM_PANE_BACKEND` (herdr when on PATH, else tmux). Parsing validates only;
//! all pane logic lives in `crate::pane`.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::cli::{self, Failure, Parsed};
use crate::ctx::Ctx;
use crate::delegate::confirm::{JobRef, JobStarted};
use crate::pane::{self, Knobs, ListOutcome, PlaceRequest};
use crate::text::{one_line, show_path};

pub const USAGE: &str = "
Usage: mam pane ls [--server S] [--json]
       mam pane new-session --agent KIND --name N --cwd DIR [--env K=V]... [--server S] [-- ARGS...]
       mam pane send-keys-safe --target T [--server S] --prompt-file F [--job JID --registry-dir D]
       mam pane status --target T [--server S]
       mam pane close --pane P [--server S]
       mam pane server-start [--server S]

Pane backends (ORCH 1): place an agent in a terminal pane, prompt it with delivery confirmation,
read its state, list what is alive.

  ls              one line per agent: name<TAB>pane<TAB>kind<TAB>status (or --json)
  new-session     place (workspace packing, 2 x MAM_WS_ROWS grid) and start an agent; prints
                  PANE= WORKSPACE= SERVER= REUSED=0|1
  send-keys-safe  inject the one-line prompt in F; delivery confirmed by status `working` or the
                  job's own `started` with the current dispatch token
  status          prints one of: working idle done blocked unknown absent
  close           close a pane
  server-start    make sure the server runs (bootstrap unless MAM_NO_AUTOSTART=1)

Environment: MAM_PANE_BACKEND (herdr|tmux|fake), MAM_HERDR_SESSION (multi-agent-mux),
MAM_TMUX_SOCKET (mam), MAM_FAKE_PANES_DIR, MAM_NO_AUTOSTART, MAM_WS_LABEL, MAM_WS_ROWS (2),
SKS_DELIVERY_GRACE_S (15), MAM_SKS_IDLE_WAIT_S (60), MAM_SKS_PROMPT_TIMEOUT_MS (8000),
MAM_AGENT_START_TIMEOUT_MS (60000), MAM_STARTUP_DIALOG_MAX (3).

Exit codes: 0 ok (send-keys-safe: delivered), 1 failure (ls: no server running), 2 usage,
3 ls: state unknown; send-keys-safe: nothing submitted (agent busy, transport error, unknown
target), 4 send-keys-safe: accepted but not confirmed.
";

#[derive(Debug, Default)]
struct Args {
    verb: String,
    server: Option<String>,
    json: bool,
    agent: Option<String>,
    name: Option<String>,
    cwd: Option<PathBuf>,
    env: Vec<(String, String)>,
    args: Vec<String>,
    target: Option<String>,
    prompt_file: Option<PathBuf>,
    job: Option<String>,
    registry_dir: Option<PathBuf>,
    token: Option<String>,
    pane: Option<String>,
}

fn valid_env_key(k: &str) -> bool {
    let b = k.as_bytes();
    !b.is_empty()
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

fn valid_kind(k: &str) -> bool {
    let b = k.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_lowercase()
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"_-".contains(c))
}

fn parse_args(mut raw: Vec<OsString>) -> Result<Parsed<Args>, Failure> {
    use lexopt::prelude::*;
    let mut a = Args::default();
    if let Some(i) = raw.iter().position(|x| x == "--") {
        a.args = raw.split_off(i).into_iter().skip(1).map(|x| x.to_string_lossy().into_owned()).collect();
    }
    let mut p = lexopt::Parser::from_args(raw);
    while let Some(arg) = p.next()? {
        match arg {
            Short('h') | Long("help") => return Ok(Parsed::Help),
            Value(v) if a.verb.is_empty() => a.verb = cli::utf8("verb", v)?,
            Long("server") => a.server = Some(cli::utf8("--server", p.value()?)?),
            Long("json") => a.json = true,
            Long("agent") => a.agent = Some(cli::utf8("--agent", p.value()?)?),
            Long("name") => a.name = Some(cli::utf8("--name", p.value()?)?),
            Long("cwd") => a.cwd = Some(p.value()?.into()),
            Long("env") => {
                let kv = cli::utf8("--env", p.value()?)?;
                match kv.split_once('=') {
                    Some((k, v)) if valid_env_key(k) => a.env.push((k.to_string(), v.to_string())),
                    _ => return Err(Failure::usage(format!("--env: expected K=V, got '{}'", one_line(&kv)))),
                }
            }
            Long("target") => a.target = Some(cli::utf8("--target", p.value()?)?),
            Long("prompt-file") => a.prompt_file = Some(p.value()?.into()),
            Long("job") => a.job = Some(cli::utf8("--job", p.value()?)?),
            Long("registry-dir") => a.registry_dir = Some(p.value()?.into()),
            Long("token") => a.token = Some(cli::utf8("--token", p.value()?)?),
            Long("pane") => a.pane = Some(cli::utf8("--pane", p.value()?)?),
            _ => return Err(arg.unexpected().into()),
        }
    }
    let need = |v: &Option<String>, flag: &str| -> Result<(), Failure> {
        match v {
            Some(s) if !s.is_empty() => Ok(()),
            _ => Err(Failure::usage(format!("pane {}: {flag} is required", a.verb))),
        }
    };
    match a.verb.as_str() {
        "" => {
            return Err(Failure::usage(
                "pane: give a verb (ls, new-session, send-keys-safe, status, close, server-start)",
            ))
        }
        "ls" | "server-start" => {}
        "new-session" => {
            need(&a.agent, "--agent")?;
            need(&a.name, "--name")?;
            if a.cwd.is_none() {
                return Err(Failure::usage("pane new-session: --cwd is required"));
            }
            let kind = a.agent.as_deref().unwrap_or("");
            if !valid_kind(kind) {
                return Err(Failure::usage(format!("pane new-session: invalid agent kind '{}'", one_line(kind))));
            }
            let name = a.name.as_deref().unwrap_or("");
            if !pane::valid_name(name) {
                return Err(Failure::usage(format!(
                    "pane new-session: invalid session name '{}' (expected [a-z][a-z0-9_-]{{0,31}})",
                    one_line(name)
                )));
            }
        }
        "send-keys-safe" => {
            need(&a.target, "--target")?;
            if a.prompt_file.is_none() {
                return Err(Failure::usage("pane send-keys-safe: --prompt-file is required"));
            }
            if a.job.is_some() != a.registry_dir.is_some() {
                return Err(Failure::usage("pane send-keys-safe: --job and --registry-dir go together"));
            }
        }
        "status" => need(&a.target, "--target")?,
        "close" => need(&a.pane, "--pane")?,
        other => return Err(Failure::usage(format!("pane: unknown verb '{}'", one_line(other)))),
    }
    if !a.args.is_empty() && a.verb != "new-session" {
        return Err(Failure::usage(format!("pane {}: takes no arguments after --", a.verb)));
    }
    Ok(Parsed::Run(a))
}

pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let Some(a) = cli::parse_or_help(ctx, USAGE, args, parse_args)? else {
        return Ok(0);
    };
    match a.verb.as_str() {
        "ls" => ls(ctx, &a),
        "new-session" => new_session(ctx, &a),
        "send-keys-safe" => send_keys_safe(ctx, &a),
        "status" => {
            // Query-only: never bootstraps (1.3).
            ctx.set_var("MAM_NO_AUTOSTART", Some("1".as_ref()));
            let b = pane::open(ctx, a.server.as_deref())?;
            ctx.say(b.agent_status(a.target.as_deref().unwrap_or("")).word());
            Ok(0)
        }
        "close" => {
            let b = pane::open(ctx, a.server.as_deref())?;
            b.close_pane(a.pane.as_deref().unwrap_or("")).map_err(Failure::from)?;
            Ok(0)
        }
        "server-start" => {
            let b = pane::open(ctx, a.server.as_deref())?;
            b.ensure_server().map_err(Failure::from)?;
            ctx.say(&format!("SERVER={}", b.server()));
            Ok(0)
        }
        _ => unreachable!("verbs are validated by parse_args"),
    }
}

fn ls(ctx: &mut Ctx, a: &Args) -> Result<i32, Failure> {
    ctx.set_var("MAM_NO_AUTOSTART", Some("1".as_ref()));
    let b = pane::open(ctx, a.server.as_deref())?;
    match b.list_agents() {
        ListOutcome::Confirmed(agents) => {
            if a.json {
                let list: Vec<serde_json::Value> = agents
                    .iter()
                    .map(|g| serde_json::json!({"name": g.name, "pane": g.pane, "kind": g.kind, "status": g.status}))
                    .collect();
                ctx.say(&serde_json::Value::Array(list).to_string());
            } else {
                for g in agents {
                    ctx.say(&format!("{}\t{}\t{}\t{}", g.name, g.pane, g.kind, g.status));
                }
            }
            Ok(0)
        }
        ListOutcome::NoServer => {
            ctx.diag("NOTE: no server running");
            Ok(1)
        }
        ListOutcome::Unknown(d) => Err(Failure::wire(format!("state unknown: {}", one_line(&d)))),
    }
}

fn new_session(ctx: &mut Ctx, a: &Args) -> Result<i32, Failure> {
    let cwd = crate::sys::absolutize(ctx.cwd(), a.cwd.as_deref().unwrap_or(ctx.cwd()));
    if !cwd.is_dir() {
        return Err(Failure::usage(format!("pane new-session: --cwd {} is not a directory", show_path(&cwd))));
    }
    let knobs = Knobs::from_ctx(ctx)?;
    let b = pane::open(ctx, a.server.as_deref())?;
    let req = PlaceRequest {
        name: a.name.clone().unwrap_or_default(),
        kind: a.agent.clone().unwrap_or_default(),
        cwd,
        env: a.env.clone(),
        args: a.args.clone(),
        label: ctx.var_nonempty("MAM_WS_LABEL"),
    };
    match pane::place_and_start(b.as_ref(), &req, &knobs) {
        Ok(p) => {
            ctx.say(&format!(
                "PANE={} WORKSPACE={} SERVER={} REUSED={}",
                p.pane,
                p.workspace,
                p.server,
                u8::from(p.reused)
            ));
            Ok(0)
        }
        Err(f) => {
            // Roll back what this attempt created; a reused pane stays as it was found.
            if let Some(p) = &f.partial {
                if let Err(e) = pane::rollback(b.as_ref(), p) {
                    ctx.diag(&format!("WARNING: rollback left pane {} of workspace {}: {e}", p.pane, p.workspace));
                }
            }
            Err(f.error.clone().into())
        }
    }
}

fn send_keys_safe(ctx: &mut Ctx, a: &Args) -> Result<i32, Failure> {
    let path = crate::sys::absolutize(ctx.cwd(), a.prompt_file.as_deref().unwrap_or(ctx.cwd()));
    // Read at most one byte past the limit (a huge file is refused without being read whole).
    let mut raw = Vec::new();
    std::fs::File::open(&path)
        .and_then(|f| std::io::Read::read_to_end(&mut std::io::Read::take(f, pane::MAX_PROMPT as u64 + 3), &mut raw))
        .map_err(|e| Failure::usage(format!("pane send-keys-safe: cannot read {}: {e}", show_path(&path))))?;
    let text = String::from_utf8(raw)
        .map_err(|_| Failure::usage(format!("pane send-keys-safe: {} is not UTF-8", show_path(&path))))?;
    let text = text.strip_suffix("\r\n").or_else(|| text.strip_suffix('\n')).unwrap_or(&text);
    if let Some(why) = pane::prompt_problem(text) {
        return Err(Failure::usage(format!(
            "pane send-keys-safe: {}: {why} (one line of at most {} bytes; put longer content in a file the prompt names)",
            show_path(&path),
            pane::MAX_PROMPT
        )));
    }
    let knobs = Knobs::from_ctx(ctx)?;
    let b = pane::open(ctx, a.server.as_deref())?;
    let mut job = a.job.as_ref().map(|j| {
        JobStarted::new(JobRef {
            registry: crate::sys::absolutize(ctx.cwd(), a.registry_dir.as_deref().unwrap_or(ctx.cwd())),
            job_id: j.clone(),
            token: a.token.clone(),
        })
    });
    let target = a.target.as_deref().unwrap_or("");
    let confirm = job.as_mut().map(|j| j as &mut dyn pane::Confirm);
    let outcome = pane::send_keys_safe(b.as_ref(), target, text, confirm, &knobs);
    match &outcome {
        pane::SksOutcome::Delivered(d) => ctx.diag(&format!("NOTE: prompt delivered to {target}: {}", d.how)),
        pane::SksOutcome::NotSubmitted(why) | pane::SksOutcome::Unconfirmed(why) => {
            ctx.diag(&format!("ERROR: {}", one_line(why)))
        }
    }
    Ok(outcome.rc())
}
