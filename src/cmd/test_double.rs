//! `mam test-double herdr|agent` (ORCH 1.8): the mock herdr and the fake agent, compiled into the one
//! binary and hidden from `mam --help`. Test scaffolding only: nothing in mam's own flows calls them.
//!
//! The mock herdr records every call (argv and selected environment) as a JSON line in `MAM_MOCK_LOG`
//! and answers from a JSON state file `MAM_MOCK_STATE` that it also updates. The fake agent follows a
//! key=value script (`MAM_FAKE_AGENT_SCRIPT`) and runs a brief's command lines exactly as written,
//! through `bash -c`, from `/`, without the workspace variables.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Map, Value};

use crate::cli::Failure;
use crate::ctx::Ctx;
use crate::pane::denied;
use crate::sys::{self, Flock, LockMode};

pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let mut it = args.into_iter();
    let which = it.next().and_then(|s| s.into_string().ok()).unwrap_or_default();
    let rest: Vec<String> = it.map(|a| a.to_string_lossy().into_owned()).collect();
    match which.as_str() {
        "herdr" => Ok(mock_herdr(ctx, rest)),
        "agent" => fake_agent(ctx),
        _ => Err(Failure::usage("test-double: give herdr or agent")),
    }
}

// ---------------------------------------------------------------------------------------------
// Mock herdr

/// Environment names whose values the mock log records (every name is listed in `env_names`).
const LOGGED_ENV: &[&str] =
    &["HERDR_SESSION", "HERDR_SOCKET_PATH", "CLAUDE_PROJECT_DIR", "MY_TEST_FLAG", "MAM_NO_AUTOSTART"];

struct Reply {
    out: String,
    err: String,
    rc: i32,
}

fn ok(v: Value) -> Reply {
    Reply { out: json!({"id": "mock", "result": v}).to_string(), err: String::new(), rc: 0 }
}

fn err_doc(code: &str, msg: &str) -> Reply {
    Reply { out: json!({"id": "mock", "error": {"code": code, "message": msg}}).to_string(), err: String::new(), rc: 1 }
}

fn injected(kind: &str) -> Option<Reply> {
    let nsr = json!({"error": {"code": "server_not_running", "message": "herdr server is not running"}}).to_string();
    let unrelated = json!({"error": {"code": "internal_error", "message": "unrelated failure"}}).to_string();
    Some(match kind {
        "server_not_running_stdout" => Reply { out: nsr, err: String::new(), rc: 1 },
        "server_not_running_stderr" => Reply { out: String::new(), err: nsr, rc: 1 },
        "error_doc" => Reply { out: unrelated, err: String::new(), rc: 0 },
        "error_doc_exit1" => Reply { out: unrelated, err: String::new(), rc: 1 },
        "garbage" => Reply { out: "this is not json".into(), err: String::new(), rc: 0 },
        _ => return None,
    })
}

fn opt(args: &[String], flag: &str) -> Option<String> {
    args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned()
}

fn opts(args: &[String], flag: &str) -> Vec<String> {
    args.windows(2).filter(|w| w[0] == flag).map(|w| w[1].clone()).collect()
}

fn arr<'a>(state: &'a mut Value, key: &str) -> &'a mut Vec<Value> {
    if !state.get(key).is_some_and(Value::is_array) {
        state[key] = json!([]);
    }
    state[key].as_array_mut().expect("array just ensured")
}

fn next_id(state: &mut Value, prefix: &str) -> String {
    let n = state.get("next").and_then(Value::as_u64).unwrap_or(1);
    state["next"] = json!(n + 1);
    format!("{prefix}{n}")
}

fn find_pane<'a>(state: &'a mut Value, pane: &str) -> Option<(usize, &'a mut Value)> {
    for (wi, w) in arr(state, "workspaces").iter_mut().enumerate() {
        if let Some(p) = w
            .get_mut("panes")
            .and_then(Value::as_array_mut)
            .and_then(|ps| ps.iter_mut().find(|p| p.get("pane_id").and_then(Value::as_str) == Some(pane)))
        {
            return Some((wi, p));
        }
    }
    None
}

fn agent_mut<'a>(state: &'a mut Value, name: &str) -> Option<&'a mut Value> {
    arr(state, "agents").iter_mut().find(|a| a.get("name").and_then(Value::as_str) == Some(name))
}

fn env_pairs(args: &[String]) -> Value {
    let m: Map<String, Value> = opts(args, "--env")
        .into_iter()
        .filter_map(|kv| kv.split_once('=').map(|(k, v)| (k.to_string(), json!(v))))
        .collect();
    Value::Object(m)
}

fn public_agent(a: &Value) -> Value {
    json!({
        "name": a["name"], "pane_id": a["pane_id"], "kind": a["kind"], "status": a["status"],
        "agent_session": a.get("agent_session").cloned().unwrap_or(Value::Null),
    })
}

fn mock_herdr(ctx: &Ctx, argv: Vec<String>) -> i32 {
    if let Some(log) = ctx.path_var("MAM_MOCK_LOG") {
        let mut names: Vec<String> =
            ctx.child_env().into_iter().map(|(k, _)| k.to_string_lossy().into_owned()).collect();
        names.sort();
        let mut env = Map::new();
        for k in LOGGED_ENV.iter().copied().chain(names.iter().map(String::as_str).filter(|n| denied(n))) {
            if let Some(v) = ctx.var(k) {
                env.insert(k.to_string(), json!(v));
            }
        }
        let line = json!({"argv": argv, "env": env, "env_names": names}).to_string() + "\n";
        let _ = sys::append_locked(&log, line.as_bytes());
    }
    let Some(state_path) = ctx.path_var("MAM_MOCK_STATE") else {
        ctx.diag("ERROR: mock herdr: MAM_MOCK_STATE is not set");
        return 2;
    };
    let lock = Flock::lock_path(&state_path.with_extension("lock"), LockMode::Exclusive);
    let mut state: Value = std::fs::read(&state_path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_else(|| json!({"running": true}));
    let reply = mock_dispatch(&mut state, &argv);
    let _ = sys::atomic_write(&state_path, serde_json::to_string_pretty(&state).unwrap_or_default().as_bytes());
    drop(lock);
    if !reply.out.is_empty() {
        ctx.say(&reply.out);
    }
    if !reply.err.is_empty() {
        ctx.diag(&reply.err);
    }
    reply.rc
}

fn mock_dispatch(state: &mut Value, argv: &[String]) -> Reply {
    let mut args: Vec<String> = argv.to_vec();
    let mut session = None;
    if args.first().map(String::as_str) == Some("--session") && args.len() >= 2 {
        session = Some(args[1].clone());
        args.drain(..2);
    }
    let verb = args.iter().take(2).cloned().collect::<Vec<_>>().join(" ");
    if args.first().map(String::as_str) == Some("server") {
        state["running"] = json!(true);
        state["server_session"] = json!(session);
        return Reply { out: String::new(), err: String::new(), rc: 0 };
    }
    if state.get("running").and_then(Value::as_bool) == Some(false) {
        let how = state.pointer("/inject/no_server").and_then(Value::as_str).unwrap_or("server_not_running_stdout");
        return injected(how).unwrap_or_else(|| err_doc("server_not_running", "down"));
    }
    if let Some(r) =
        state.pointer(&format!("/inject/{}", verb.replace(' ', "_"))).and_then(Value::as_str).and_then(injected)
    {
        return r;
    }
    let rest = &args[args.len().min(2)..];
    match verb.as_str() {
        "agent list" => {
            let list: Vec<Value> = arr(state, "agents").iter().map(public_agent).collect();
            ok(json!({"type": "agent_list", "agents": list}))
        }
        "agent get" | "agent wait" => match rest.first().and_then(|t| agent_mut(state, t)) {
            Some(a) => ok(json!({"agent": public_agent(a)})),
            None => err_doc("agent_not_found", "no such agent"),
        },
        "agent read" => {
            let changes = state.pointer("/inject/screen_changes").and_then(Value::as_bool) == Some(true);
            match rest.first().and_then(|t| agent_mut(state, t)) {
                Some(a) => {
                    let n = a.get("reads").and_then(Value::as_u64).unwrap_or(0) + 1;
                    a["reads"] = json!(n);
                    let text = if changes { format!("screen tick {n}") } else { "> ready".to_string() };
                    ok(json!({"text": text}))
                }
                None => err_doc("agent_not_found", "no such agent"),
            }
        }
        "agent start" => {
            let Some(name) = rest.first().cloned() else { return err_doc("invalid_request", "name") };
            let kind = opt(rest, "--kind").unwrap_or_default();
            let pane = opt(rest, "--pane").unwrap_or_default();
            let extra: Vec<String> =
                rest.iter().position(|a| a == "--").map(|i| rest[i + 1..].to_vec()).unwrap_or_default();
            if find_pane(state, &pane).is_none() {
                return err_doc("pane_not_found", "no such pane");
            }
            if agent_mut(state, &name).is_some() {
                return err_doc("agent_exists", "name in use");
            }
            let status = state.pointer("/inject/start_status").and_then(Value::as_str).unwrap_or("idle").to_string();
            let never = state.pointer("/inject/never_working").and_then(Value::as_bool).unwrap_or(false);
            if let Some((_, p)) = find_pane(state, &pane) {
                p["agent"] = json!(name);
            }
            arr(state, "agents").push(json!({
                "name": name, "kind": kind, "pane_id": pane, "status": status, "args": extra, "never_working": never,
            }));
            ok(json!({"type": "agent_started", "agent": {"name": name, "pane_id": pane}}))
        }
        "agent prompt" => {
            let Some(target) = rest.first().cloned() else { return err_doc("invalid_request", "target") };
            if agent_mut(state, &target).is_none() {
                return err_doc("agent_not_found", "no such agent");
            }
            if let Some(path) = state.pointer("/inject/on_prompt_append/path").and_then(Value::as_str) {
                let line = state.pointer("/inject/on_prompt_append/line").and_then(Value::as_str).unwrap_or("");
                let _ = sys::append_locked(Path::new(path), format!("{line}\n").as_bytes());
            }
            let mode = state.pointer("/inject/prompt").and_then(Value::as_str).unwrap_or("settled").to_string();
            if mode == "transport_error" {
                return err_doc("transport_error", "socket closed");
            }
            if let Some(a) = agent_mut(state, &target) {
                if a.get("never_working").and_then(Value::as_bool) != Some(true) {
                    a["status"] = json!("working");
                }
                a["prompts"] = json!(a.get("prompts").and_then(Value::as_u64).unwrap_or(0) + 1);
            }
            match mode.as_str() {
                "timeout" => err_doc("timeout", "prompt did not settle"),
                "agent_prompt_stalled" => err_doc("agent_prompt_stalled", "agent did not react"),
                _ => ok(json!({"type": "prompt_settled"})),
            }
        }
        "workspace list" => {
            let list: Vec<Value> = arr(state, "workspaces")
                .iter()
                .map(|w| json!({"workspace_id": w["workspace_id"], "label": w["label"], "cwd": w["cwd"]}))
                .collect();
            ok(json!({"workspaces": list}))
        }
        "workspace create" => {
            let cwd = opt(rest, "--cwd").unwrap_or_default();
            let wid = next_id(state, "w");
            let pid = next_id(state, "p");
            let geometry = state.get("geometry").and_then(Value::as_bool).unwrap_or(false);
            let pane =
                json!({"pane_id": pid, "x": 0, "y": 0, "foreground": "bash", "env": env_pairs(rest), "cwd": cwd});
            arr(state, "workspaces").push(json!({
                "workspace_id": wid, "cwd": cwd, "label": opt(rest, "--label").unwrap_or_default(),
                "geometry": geometry, "panes": [pane],
            }));
            ok(json!({"workspace": {"workspace_id": wid}, "root_pane": {"pane_id": pid}}))
        }
        "workspace rename" => {
            let (Some(id), Some(label)) = (rest.first(), rest.get(1)) else {
                return err_doc("invalid_request", "args");
            };
            match arr(state, "workspaces").iter_mut().find(|w| w["workspace_id"].as_str() == Some(id)) {
                Some(w) => {
                    w["label"] = json!(label);
                    ok(json!({"type": "ok"}))
                }
                None => err_doc("workspace_not_found", "no such workspace"),
            }
        }
        "workspace close" => {
            let id = rest.first().cloned().unwrap_or_default();
            let panes: Vec<String> = arr(state, "workspaces")
                .iter()
                .filter(|w| w["workspace_id"].as_str() == Some(&id))
                .flat_map(|w| w["panes"].as_array().cloned().unwrap_or_default())
                .filter_map(|p| p["pane_id"].as_str().map(str::to_string))
                .collect();
            arr(state, "workspaces").retain(|w| w["workspace_id"].as_str() != Some(&id));
            arr(state, "agents").retain(|a| !panes.iter().any(|p| a["pane_id"].as_str() == Some(p)));
            ok(json!({"type": "ok"}))
        }
        "pane list" => {
            let wid = opt(rest, "--workspace").unwrap_or_default();
            let Some(w) = arr(state, "workspaces").iter().find(|w| w["workspace_id"].as_str() == Some(&wid)).cloned()
            else {
                return err_doc("workspace_not_found", "no such workspace");
            };
            let geometry = w["geometry"].as_bool() == Some(true);
            let mut panes: Vec<Value> = w["panes"].as_array().cloned().unwrap_or_default();
            if geometry {
                // Layout order (column-major), which differs from creation order.
                panes.sort_by_key(|p| (p["x"].as_i64().unwrap_or(0), p["y"].as_i64().unwrap_or(0)));
            }
            let list: Vec<Value> = panes
                .iter()
                .map(|p| {
                    let mut o = json!({"pane_id": p["pane_id"], "workspace_id": wid,
                        "agent": p.get("agent").cloned().unwrap_or(Value::Null)});
                    if geometry {
                        o["x"] = p["x"].clone();
                        o["y"] = p["y"].clone();
                    }
                    o
                })
                .collect();
            ok(json!({"panes": list}))
        }
        "pane process-info" => {
            let pane = opt(rest, "--pane").unwrap_or_default();
            let agent_kind = arr(state, "agents")
                .iter()
                .find(|a| a["pane_id"].as_str() == Some(&pane))
                .and_then(|a| a["kind"].as_str().map(str::to_string));
            match find_pane(state, &pane) {
                Some((_, p)) => {
                    let fg = agent_kind.unwrap_or_else(|| p["foreground"].as_str().unwrap_or("bash").to_string());
                    ok(json!({"pane_id": pane, "foreground": {"name": fg, "pid": 4242}}))
                }
                None => err_doc("pane_not_found", "no such pane"),
            }
        }
        "pane split" => {
            let Some(src) = rest.first().cloned() else { return err_doc("invalid_request", "pane") };
            let dir = opt(rest, "--direction").unwrap_or_default();
            let pid = next_id(state, "p");
            let env = env_pairs(rest);
            let cwd = opt(rest, "--cwd").unwrap_or_default();
            let Some((wi, p)) = find_pane(state, &src) else { return err_doc("pane_not_found", "no such pane") };
            let x = p["x"].as_i64().unwrap_or(0);
            let ws = &mut arr(state, "workspaces")[wi];
            let panes = ws["panes"].as_array_mut().expect("workspace panes");
            let (nx, ny) = if dir == "right" {
                (x + 1, 0)
            } else {
                (
                    x,
                    panes
                        .iter()
                        .filter(|q| q["x"].as_i64() == Some(x))
                        .filter_map(|q| q["y"].as_i64())
                        .max()
                        .unwrap_or(0)
                        + 1,
                )
            };
            panes.push(json!({"pane_id": pid, "x": nx, "y": ny, "foreground": "bash", "env": env, "cwd": cwd}));
            ok(json!({"pane": {"pane_id": pid}}))
        }
        "pane send-keys" => ok(json!({"type": "ok"})),
        "pane close" => {
            let pane = rest.first().cloned().unwrap_or_default();
            for w in arr(state, "workspaces").iter_mut() {
                if let Some(ps) = w["panes"].as_array_mut() {
                    ps.retain(|p| p["pane_id"].as_str() != Some(&pane));
                }
            }
            arr(state, "workspaces").retain(|w| w["panes"].as_array().is_some_and(|p| !p.is_empty()));
            arr(state, "agents").retain(|a| a["pane_id"].as_str() != Some(&pane));
            ok(json!({"type": "ok"}))
        }
        _ => err_doc("unknown_command", &format!("mock herdr does not know '{verb}'")),
    }
}

// ---------------------------------------------------------------------------------------------
// Fake agent

/// The parsed `MAM_FAKE_AGENT_SCRIPT`.
#[derive(Debug, Default, Clone)]
struct Script {
    ack_delay_s: f64,
    never_start: bool,
    work_s: f64,
    report_text: String,
    verdict: Option<String>,
    report_working: bool,
    crash_after_s: Option<f64>,
    touch_during_review: Option<PathBuf>,
    spawn_subjob: Option<String>,
    exit_after: u64,
    startup_blocked: u64,
}

fn parse_script(text: &str) -> Script {
    let mut s = Script { report_working: true, report_text: "fake agent report".into(), ..Script::default() };
    for line in text.lines() {
        let Some((k, v)) = line.split_once('=') else { continue };
        let (k, v) = (k.trim(), v.trim());
        let num = || v.parse::<f64>().unwrap_or(0.0);
        let yes = || matches!(v, "1" | "true" | "yes");
        match k {
            "ack_delay_s" => s.ack_delay_s = num(),
            "never_start" => s.never_start = yes(),
            "work_s" => s.work_s = num(),
            "report_text" => s.report_text = v.replace("\\n", "\n"),
            "verdict" => s.verdict = Some(v.to_string()).filter(|v| !v.is_empty()),
            "report_working" => s.report_working = yes(),
            "crash_after_s" => s.crash_after_s = Some(num()),
            "touch_during_review" => {
                s.touch_during_review = Some(PathBuf::from(v)).filter(|p| !p.as_os_str().is_empty())
            }
            "spawn_subjob" => s.spawn_subjob = Some(v.to_string()).filter(|v| !v.is_empty()),
            "exit_after" => s.exit_after = v.parse().unwrap_or(0),
            "startup_blocked" => s.startup_blocked = v.parse().unwrap_or(0),
            _ => {}
        }
    }
    s
}

/// The command lines of a brief (ORCH 3.3 "Commands"): `start`, `progress`, `success`, `error`,
/// each given as `<label>: <line>` (bullets, bold and backticks tolerated) or as a label line
/// followed by the command in a fenced block. Parsing starts at a `Commands` heading when there is one.
pub fn brief_commands(text: &str) -> BTreeMap<String, String> {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.trim_start().starts_with('#') && l.to_ascii_lowercase().contains("commands"))
        .unwrap_or(0);
    let mut out = BTreeMap::new();
    let mut i = start;
    while i < lines.len() {
        let t = lines[i].trim_start().trim_start_matches(['-', '*', ' ']).trim_start_matches(['*', '`']);
        let lower = t.to_ascii_lowercase();
        for label in ["start", "progress", "success", "error"] {
            let Some(after) = lower.strip_prefix(label) else { continue };
            let after = after.trim_start_matches(" command").trim_start_matches(['*', '`']);
            if !after.starts_with(':') {
                continue;
            }
            let offset = t.len() - after.len() + 1;
            let rest = t[offset..].trim().trim_start_matches("**").trim();
            let cmd = if rest.is_empty() || rest.starts_with("```") {
                lines[i + 1..]
                    .iter()
                    .map(|l| l.trim())
                    .find(|l| !l.is_empty() && !l.starts_with("```"))
                    .unwrap_or("")
                    .to_string()
            } else {
                strip_ticks(rest).to_string()
            };
            if !cmd.is_empty() {
                out.insert(label.to_string(), cmd);
            }
        }
        i += 1;
    }
    out
}

fn strip_ticks(s: &str) -> &str {
    let s = s.trim();
    if s.len() >= 2 && s.starts_with('`') && s.ends_with('`') {
        s.trim_matches('`').trim()
    } else {
        s
    }
}

/// The absolute report path named by a brief's `Output Report Path` line.
pub fn brief_report_path(text: &str) -> Option<PathBuf> {
    let lines: Vec<&str> = text.lines().collect();
    let i = lines.iter().position(|l| l.to_ascii_lowercase().contains("output report path"))?;
    let after = lines[i].split_once(':').map(|(_, r)| r.trim()).unwrap_or("");
    let raw = if after.is_empty() {
        lines[i + 1..].iter().map(|l| l.trim()).find(|l| !l.is_empty() && !l.starts_with("```"))?
    } else {
        after
    };
    let p = strip_ticks(raw.trim_start_matches(['-', '*', ' '])).trim_end_matches('.');
    Some(PathBuf::from(p)).filter(|p| p.is_absolute())
}

/// The brief file a prompt names (`... read and follow <abs path>. Run first: ...`) and the job id.
pub fn prompt_brief(prompt: &str) -> (Option<PathBuf>, Option<String>) {
    let job = prompt.split_whitespace().skip_while(|w| *w != "Job").nth(1).map(|w| w.trim_end_matches(':').to_string());
    let words: Vec<&str> = prompt.split_whitespace().collect();
    let after = prompt.find("read and follow ").map(|i| &prompt[i + "read and follow ".len()..]);
    // The whole path up to ". Run first:" (a path may hold spaces), else the first word.
    let whole = after
        .map(|r| r.split_once(". Run first:").map_or(r, |(p, _)| p))
        .map(|p| PathBuf::from(p.trim().trim_end_matches('.')));
    let named = after.and_then(|r| r.split_whitespace().next()).map(|w| PathBuf::from(w.trim_end_matches('.')));
    let brief = whole.filter(|p| p.is_file()).or_else(|| named.filter(|p| p.is_file())).or_else(|| {
        words
            .iter()
            .map(|w| PathBuf::from(w.trim_end_matches(['.', ',', ';'])))
            .find(|p| p.is_absolute() && p.is_file() && p.extension().is_some_and(|e| e == "md"))
    });
    (brief, job)
}

struct Agent {
    pane_dir: Option<PathBuf>,
    env: Vec<(OsString, OsString)>,
}

impl Agent {
    fn status(&self, s: &str) {
        if let Some(d) = &self.pane_dir {
            let _ = sys::atomic_write(&d.join("status"), s.as_bytes());
        }
    }

    fn screen(&self, line: &str) {
        match &self.pane_dir {
            Some(d) => {
                let _ = sys::append_locked(&d.join("screen"), format!("{line}\n").as_bytes());
            }
            None => println!("{line}"),
        }
    }

    /// Runs one brief line exactly as written through `bash -c` from `/` without the workspace
    /// variables; returns its exit code.
    fn run_line(&self, line: &str, extra: &[(&str, &str)]) -> i32 {
        let mut c = Command::new("bash");
        c.arg("-c").arg(line).current_dir("/").env_clear().envs(self.env.iter().cloned());
        for k in ["WORKSPACE_ROOT", "AGENT_SESSIONS_YAML", "MAM_JOBS_DIR", "DELEGATE_JOB_LOGS_DIR"] {
            c.env_remove(k);
        }
        c.envs(extra.iter().copied()).stdin(Stdio::null());
        match sys::spawn(&mut c).and_then(|mut ch| ch.wait()) {
            Ok(st) => st.code().unwrap_or(-1),
            Err(e) => {
                eprintln!("fake agent: cannot run bash: {e}");
                -1
            }
        }
    }
}

fn pause(secs: f64) {
    if secs > 0.0 {
        sys::sleep(Duration::from_secs_f64(secs));
    }
}

fn fake_agent(ctx: &Ctx) -> Result<i32, Failure> {
    let script = ctx
        .path_var("MAM_FAKE_AGENT_SCRIPT")
        .and_then(|p| std::fs::read_to_string(p).ok())
        .map(|t| parse_script(&t))
        .unwrap_or_else(|| parse_script(""));
    let agent = Agent { pane_dir: ctx.path_var("MAM_FAKE_PANE_DIR"), env: ctx.child_env() };
    // Start-up dialog: blocked until enough `enter` keys arrived.
    if script.startup_blocked > 0 {
        if let Some(d) = &agent.pane_dir {
            agent.status("blocked");
            loop {
                let n = std::fs::read_to_string(d.join("keys")).map(|t| t.lines().count() as u64).unwrap_or(0);
                if n >= script.startup_blocked || !d.is_dir() {
                    break;
                }
                sys::sleep(Duration::from_millis(20));
            }
        }
    }
    agent.status("idle");
    agent.screen("fake agent ready");
    let mut handled = 0u64;
    match &agent.pane_dir {
        Some(d) => {
            let inbox = d.join("inbox");
            let mut offset = 0usize;
            loop {
                if !d.is_dir() {
                    return Ok(0);
                }
                let data = std::fs::read(&inbox).unwrap_or_default();
                if data.len() > offset {
                    let chunk = String::from_utf8_lossy(&data[offset..]).into_owned();
                    let Some(end) = chunk.rfind('\n') else {
                        sys::sleep(Duration::from_millis(20));
                        continue;
                    };
                    offset += end + 1;
                    for line in chunk[..end].lines() {
                        if handle_prompt(&agent, &script, line, &mut handled) {
                            return Ok(0);
                        }
                    }
                } else {
                    sys::sleep(Duration::from_millis(20));
                }
            }
        }
        None => {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                if handle_prompt(&agent, &script, &line, &mut handled) {
                    return Ok(0);
                }
            }
            Ok(0)
        }
    }
}

/// Handles one prompt; true when the script says to exit now.
fn handle_prompt(agent: &Agent, s: &Script, prompt: &str, handled: &mut u64) -> bool {
    let prompt = prompt.trim();
    if prompt.is_empty() {
        return false;
    }
    *handled += 1;
    if s.report_working {
        agent.status("working");
    }
    agent.screen(&format!("prompt {}: {}", handled, prompt));
    if let Some(after) = s.crash_after_s {
        std::thread::spawn(move || {
            pause(after);
            let _ = sys::kill(std::process::id() as i32, libc::SIGKILL);
        });
    }
    pause(s.ack_delay_s);
    let (brief, job) = prompt_brief(prompt);
    if let Some(brief) = brief {
        let text = std::fs::read_to_string(&brief).unwrap_or_default();
        let cmds = brief_commands(&text);
        let job = job.unwrap_or_default();
        if !s.never_start {
            if let Some(l) = cmds.get("start") {
                agent.run_line(l, &[]);
            }
            if let Some(p) = &s.touch_during_review {
                let _ = sys::append_locked(p, b"touched by the fake agent during review\n");
            }
            if let Some(sub) = &s.spawn_subjob {
                agent.run_line(sub, &[("MAM_PARENT_JOB_ID", job.as_str())]);
            }
            pause(s.work_s);
            if s.verdict.as_deref().is_some_and(|v| v.eq_ignore_ascii_case("error")) {
                if let Some(l) = cmds.get("error") {
                    agent.run_line(l, &[]);
                }
            } else {
                if let Some(rp) = brief_report_path(&text) {
                    let mut body = s.report_text.clone();
                    if let Some(v) = &s.verdict {
                        body.push_str(&format!("\nVERDICT: {v}"));
                    }
                    body.push('\n');
                    if let Some(parent) = rp.parent() {
                        let _ = sys::create_dir_all(parent);
                    }
                    let _ = std::fs::write(&rp, body);
                }
                if let Some(l) = cmds.get("success") {
                    agent.run_line(l, &[]);
                }
            }
        }
    } else {
        pause(s.work_s);
    }
    agent.status("done");
    agent.screen(&format!("prompt {handled} done"));
    s.exit_after > 0 && *handled >= s.exit_after
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brief_commands_are_found_in_the_commands_section() {
        let brief = "# Job j1\nRun the start command first.\nStart: this prose is before the section\n\
            ## Commands\n- start: `echo s >> /tmp/x`\n- **progress**: echo p\n\
            - success:\n```\necho ok 'a b'\n```\n- error: echo 'e r'\n\
            ## Output Report Path\n`/abs/report.md`\n";
        let c = brief_commands(brief);
        assert_eq!(c["start"], "echo s >> /tmp/x");
        assert_eq!(c["progress"], "echo p");
        assert_eq!(c["success"], "echo ok 'a b'");
        assert_eq!(c["error"], "echo 'e r'");
        assert_eq!(brief_report_path(brief), Some(PathBuf::from("/abs/report.md")));
        assert_eq!(brief_report_path("Output Report Path: /r/x.md\n"), Some(PathBuf::from("/r/x.md")));
    }

    #[test]
    fn prompt_names_job() {
        let (_, job) = prompt_brief("Job j-42: read and follow /nonexistent/brief.md. Run first: x");
        assert_eq!(job.as_deref(), Some("j-42"));
    }

    #[test]
    fn script_defaults() {
        let s = parse_script("work_s=0.5\nverdict=PASS\nreport_working=0\n");
        assert!(!s.report_working);
        assert_eq!(s.verdict.as_deref(), Some("PASS"));
        assert!((s.work_s - 0.5).abs() < 1e-9);
    }
}
