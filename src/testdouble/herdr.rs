//! The mock herdr (ORCH 1.8): records every call (argv and selected environment) as a JSON line in
//! `MAM_MOCK_LOG` and answers from a JSON state file `MAM_MOCK_STATE` that it also updates, in the
//! reply shapes of herdr's CLI.
//!
//! A stand-in for an external program: like the program it imitates, it writes its answer to stdout
//! and stderr itself. Nothing in mam's own flows calls it.

use std::path::Path;

use serde_json::{json, Map, Value};

use crate::ctx::Ctx;
use crate::pane::denied;
use crate::sys::{self, Flock, LockMode};

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

/// The mock herdr's main: log the call, answer from the state file, return the exit code.
pub fn run(ctx: &Ctx, argv: Vec<String>) -> i32 {
    if let Some(log) = ctx.path_var("MAM_MOCK_LOG") {
        let names = ctx.var_names();
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
