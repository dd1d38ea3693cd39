//! The mock herdr (ORCH 1.8): answers the herdr 0.8.0 CLI commands mam uses the way the real binary
//! does (as observed against `../shared/herdr/herdr`, pinned by `tests/it/herdr_contract.rs`), from
//! a JSON state file `MAM_MOCK_STATE` that it also updates, and records every call (argv and
//! selected environment) as a JSON line in `MAM_MOCK_LOG`.
//!
//! What it imitates: successes print `{"id":"cli:<noun>:<verb>","result":{..,"type":..}}` on stdout,
//! or nothing (`pane send-keys|send-text|run`, `server stop`); reads print plain text; errors print a
//! JSON error document on stderr with stdout empty and exit 1; usage errors are plain text, exit 2.
//! Ids are `w1`, `w1:p1`, `w1:t1`, `term_...`; geometry exists only in `pane layout`, computed from a
//! split tree the way herdr halves a pane; `pane list` is in layout (screen) order.
//!
//! Knobs (test-only): `MAM_MOCK_STALL_MS` (default 5000) is how long `agent prompt --wait` waits for
//! a state change before `agent_prompt_stalled`; `MAM_MOCK_WAIT_CAP_MS` caps every wait on a caller's
//! `--timeout` (default: none, the timeout is honoured). State-file knobs are listed at `injected`
//! and `Reaction`. It never runs an agent and keeps one server per state file (the session name is
//! recorded, not used to route). Like the program it imitates it writes its answers itself; nothing
//! in mam's own flows calls it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use crate::ctx::Ctx;
use crate::pane::denied;
use crate::sys::{self, Flock, LockMode};

/// Environment names whose values the mock log records (every name is listed in `env_names`).
const LOGGED_ENV: &[&str] =
    &["HERDR_SESSION", "HERDR_SOCKET_PATH", "CLAUDE_PROJECT_DIR", "MY_TEST_FLAG", "MAM_NO_AUTOSTART"];

const VERSION: &str = "herdr 0.8.0";

/// herdr's headless screen is 80x24; the sidebar takes 26 columns and the tab bar one row.
const AREA: Rect = Rect { x: 26, y: 1, width: 54, height: 23 };

/// The kinds `agent start --kind` accepts (herdr 0.8.0).
const KINDS: &[&str] = &[
    "pi",
    "claude",
    "codex",
    "gemini",
    "cursor",
    "devin",
    "agy",
    "cline",
    "omp",
    "mastracode",
    "opencode",
    "copilot",
    "kimi",
    "kiro",
    "droid",
    "amp",
    "grok",
    "hermes",
    "kilo",
    "qodercli",
    "maki",
];

/// The statuses `agent prompt --wait` and `agent wait` accept by default.
const SETTLED: &[&str] = &["idle", "done", "blocked"];

/// herdr's real stall window; `MAM_MOCK_STALL_MS` shortens it in tests.
const STALL_MS: u64 = 5000;

/// What the real CLI prints when the server goes away in the middle of a request.
const TRANSPORT_ERROR: &str = "Error: Custom { kind: Other, error: EmptyResponse }";

/// One answer: bytes for stdout, a text for stderr, the exit code.
struct Reply {
    out: String,
    err: String,
    rc: i32,
}

impl Reply {
    fn ok(id: &str, result: Value) -> Reply {
        Reply { out: json!({"id": id, "result": result}).to_string() + "\n", err: String::new(), rc: 0 }
    }
    fn silent() -> Reply {
        Reply { out: String::new(), err: String::new(), rc: 0 }
    }
    fn text(lines: &[String]) -> Reply {
        Reply { out: lines.iter().map(|l| format!("{l}\n")).collect(), err: String::new(), rc: 0 }
    }
    fn error(id: &str, code: &str, message: &str) -> Reply {
        let doc = json!({"error": {"code": code, "message": message}, "id": id});
        Reply { out: String::new(), err: doc.to_string(), rc: 1 }
    }
    fn plain(err: &str, rc: i32) -> Reply {
        Reply { out: String::new(), err: err.to_string(), rc }
    }
    fn usage(msg: &str) -> Reply {
        Reply::plain(msg, 2)
    }
}

/// What a command leaves to do once the state is saved and unlocked.
enum Outcome {
    Reply(Reply),
    /// Poll the state until the agent settles (`agent prompt --wait`, `agent wait`).
    Wait(Wait),
    /// Answer after a pause (a start-up that times out).
    After(Duration, Reply),
}

struct Wait {
    id: &'static str,
    result_type: &'static str,
    target: String,
    seq0: u64,
    /// A prompt sent from a non-working state must see `state_change_seq` advance.
    needs_change: bool,
    timeout_ms: Option<u64>,
    until: Vec<String>,
}

// ---------------------------------------------------------------------------------------------
// Arguments

/// One parsed command line: positionals, `--flag value` pairs (in order), bare flags, and the
/// words after `--`.
#[derive(Default)]
struct Args {
    pos: Vec<String>,
    vals: Vec<(String, String)>,
    flags: Vec<String>,
    tail: Vec<String>,
}

impl Args {
    fn parse(words: &[String], valued: &[&str], bare: &[&str]) -> Result<Args, Reply> {
        let mut a = Args::default();
        let mut it = words.iter();
        while let Some(w) = it.next() {
            if w == "--" {
                a.tail = it.cloned().collect();
                break;
            }
            if valued.contains(&w.as_str()) {
                let Some(v) = it.next() else { return Err(Reply::usage(&format!("missing value for {w}"))) };
                a.vals.push((w.clone(), v.clone()));
            } else if bare.contains(&w.as_str()) {
                a.flags.push(w.clone());
            } else if w.starts_with("--") {
                return Err(Reply::usage(&format!("unknown option: {w}")));
            } else {
                a.pos.push(w.clone());
            }
        }
        Ok(a)
    }
    fn val(&self, flag: &str) -> Option<&str> {
        self.vals.iter().rev().find(|(k, _)| k == flag).map(|(_, v)| v.as_str())
    }
    fn all(&self, flag: &str) -> Vec<String> {
        self.vals.iter().filter(|(k, _)| k == flag).map(|(_, v)| v.clone()).collect()
    }
    fn has(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }
    fn need(&self, flag: &str) -> Result<String, Reply> {
        self.val(flag).map(str::to_string).ok_or_else(|| Reply::usage(&format!("missing required {flag}")))
    }
    fn number(&self, flag: &str) -> Result<Option<u64>, Reply> {
        match self.val(flag) {
            None => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| Reply::usage(&format!("invalid value for {flag}: {v}"))),
        }
    }
}

/// herdr key-combo syntax: modifiers joined by `+` before a single character or a key name;
/// legacy `C-x`. Case does not matter.
fn valid_key(key: &str) -> bool {
    const NAMES: &[&str] = &[
        "enter",
        "return",
        "space",
        "tab",
        "esc",
        "escape",
        "backspace",
        "bs",
        "left",
        "right",
        "up",
        "down",
        "minus",
        "plus",
        "backtick",
        "comma",
        "period",
        "slash",
        "semicolon",
        "colon",
        "quote",
        "backslash",
    ];
    const MODS: &[&str] = &["ctrl", "control", "alt", "option", "shift", "cmd", "super", "meta"];
    let k = key.to_lowercase();
    if let Some(rest) = k.strip_prefix("c-") {
        return rest.chars().count() == 1;
    }
    let parts: Vec<&str> = k.split('+').collect();
    let (base, mods) = parts.split_last().expect("split yields one part");
    let base_ok = base.chars().count() == 1 && *base != " "
        || NAMES.contains(base)
        || base.strip_prefix('f').is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
    base_ok && mods.iter().all(|m| MODS.contains(m))
}

fn valid_agent_name(name: &str) -> bool {
    let mut c = name.chars();
    c.next().is_some_and(|f| f.is_ascii_lowercase())
        && name.len() <= 32
        && c.all(|x| x.is_ascii_lowercase() || x.is_ascii_digit() || x == '-' || x == '_')
}

// ---------------------------------------------------------------------------------------------
// Layout: a split tree per workspace, `{"pane": id}` or `{"split": "right"|"down", "ratio": r,
// "a": tree, "b": tree}`; rects are computed, never stored.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Rect {
    x: i64,
    y: i64,
    width: i64,
    height: i64,
}

impl Rect {
    fn json(&self) -> Value {
        json!({"height": self.height, "width": self.width, "x": self.x, "y": self.y})
    }
    /// Halves (by `ratio`, rounded half up) the way herdr does: 54 -> 27+27, 23 -> 12+11.
    fn split(&self, dir: &str, ratio: f64) -> (Rect, Rect) {
        if dir == "right" {
            let w = ((self.width as f64) * ratio).round() as i64;
            (Rect { width: w, ..*self }, Rect { x: self.x + w, width: self.width - w, ..*self })
        } else {
            let h = ((self.height as f64) * ratio).round() as i64;
            (Rect { height: h, ..*self }, Rect { y: self.y + h, height: self.height - h, ..*self })
        }
    }
}

struct Split {
    id: String,
    direction: String,
    ratio: f64,
    rect: Rect,
}

/// Panes in screen order with their rects, and the splits in pre-order with herdr's ids
/// (`split_<index>_<path>`, the root's path being `root`).
fn walk(tree: &Value, rect: Rect, path: &str, panes: &mut Vec<(String, Rect)>, splits: &mut Vec<Split>) {
    if let Some(p) = tree.get("pane").and_then(Value::as_str) {
        panes.push((p.to_string(), rect));
        return;
    }
    let dir = tree["split"].as_str().unwrap_or("right").to_string();
    let ratio = tree["ratio"].as_f64().unwrap_or(0.5);
    let id = format!("split_{}_{}", splits.len(), if path.is_empty() { "root" } else { path });
    splits.push(Split { id, direction: dir.clone(), ratio, rect });
    let (ra, rb) = rect.split(&dir, ratio);
    walk(&tree["a"], ra, &format!("{path}0"), panes, splits);
    walk(&tree["b"], rb, &format!("{path}1"), panes, splits);
}

fn geometry(tree: &Value) -> (Vec<(String, Rect)>, Vec<Split>) {
    let (mut panes, mut splits) = (Vec::new(), Vec::new());
    walk(tree, AREA, "", &mut panes, &mut splits);
    (panes, splits)
}

/// Replaces the leaf `target` by a split of it and `new`; false when `target` is not in the tree.
fn split_leaf(tree: &mut Value, target: &str, dir: &str, new: &str) -> bool {
    if tree.get("pane").and_then(Value::as_str) == Some(target) {
        *tree = json!({"split": dir, "ratio": 0.5, "a": {"pane": target}, "b": {"pane": new}});
        return true;
    }
    tree.get_mut("a").is_some_and(|a| split_leaf(a, target, dir, new))
        || tree.get_mut("b").is_some_and(|b| split_leaf(b, target, dir, new))
}

/// The tree without the leaf `target` (its sibling takes the parent's place); `None` when empty.
fn remove_leaf(tree: &Value, target: &str) -> Option<Value> {
    if let Some(p) = tree.get("pane").and_then(Value::as_str) {
        return (p != target).then(|| tree.clone());
    }
    match (remove_leaf(&tree["a"], target), remove_leaf(&tree["b"], target)) {
        (Some(a), Some(b)) => {
            let mut t = tree.clone();
            t["a"] = a;
            t["b"] = b;
            Some(t)
        }
        (one, other) => one.or(other),
    }
}

/// A workspace's tree; a state written without one gets its panes chained by right splits.
fn layout_of(ws: &Value) -> Value {
    if let Some(t) = ws.get("layout").filter(|t| t.is_object()) {
        return t.clone();
    }
    let ids: Vec<String> = pane_records(ws).iter().filter_map(|p| p["pane_id"].as_str().map(str::to_string)).collect();
    let mut tree = Value::Null;
    for (i, id) in ids.iter().enumerate() {
        if i == 0 {
            tree = json!({"pane": id});
        } else {
            split_leaf(&mut tree, &ids[i - 1], "right", id);
        }
    }
    tree
}

// ---------------------------------------------------------------------------------------------
// State

fn arr<'a>(state: &'a mut Value, key: &str) -> &'a mut Vec<Value> {
    if !state.get(key).is_some_and(Value::is_array) {
        state[key] = json!([]);
    }
    state[key].as_array_mut().expect("array just ensured")
}

fn pane_records(ws: &Value) -> Vec<Value> {
    ws.get("panes").and_then(Value::as_array).cloned().unwrap_or_default()
}

fn counter(state: &mut Value, key: &str, first: u64) -> u64 {
    let n = state.get(key).and_then(Value::as_u64).unwrap_or(first);
    state[key] = json!(n + 1);
    n
}

fn s(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or_default().to_string()
}

fn terminal_id() -> String {
    format!("term_{}", sys::random_hex(7).unwrap_or_else(|_| "0".repeat(14)))
}

/// (workspace index, pane index) of `pane`.
fn locate(state: &Value, pane: &str) -> Option<(usize, usize)> {
    let wss = state.get("workspaces").and_then(Value::as_array)?;
    wss.iter()
        .enumerate()
        .find_map(|(wi, w)| pane_records(w).iter().position(|p| p["pane_id"].as_str() == Some(pane)).map(|pi| (wi, pi)))
}

fn pane_mut<'a>(state: &'a mut Value, pane: &str) -> Option<&'a mut Value> {
    let (wi, pi) = locate(state, pane)?;
    state["workspaces"][wi]["panes"].get_mut(pi)
}

/// The agent a target names: a live agent's name, or the pane id that hosts it.
fn agent_index(state: &Value, target: &str) -> Option<usize> {
    let agents = state.get("agents").and_then(Value::as_array)?;
    agents
        .iter()
        .position(|a| a["name"].as_str() == Some(target))
        .or_else(|| agents.iter().position(|a| a["pane_id"].as_str() == Some(target)))
}

fn agent_on_pane<'a>(state: &'a Value, pane: &str) -> Option<&'a Value> {
    state.get("agents")?.as_array()?.iter().find(|a| a["pane_id"].as_str() == Some(pane))
}

fn workspace_of(pane: &str) -> String {
    pane.split(':').next().unwrap_or_default().to_string()
}

/// The input line an idle CLI of `kind` shows (the adapter table's ready line).
fn ready_line(kind: &str) -> &'static str {
    crate::agents::adapter_of_started(kind).and_then(|a| a.ready_lines.first().copied()).unwrap_or("")
}

fn push_screen(state: &mut Value, pane: &str, line: &str) {
    if let Some(p) = pane_mut(state, pane) {
        arr(p, "screen").push(json!(line));
    }
}

fn type_screen(state: &mut Value, pane: &str, text: &str) {
    if let Some(p) = pane_mut(state, pane) {
        let screen = arr(p, "screen");
        match screen.last_mut() {
            Some(Value::String(last)) => last.push_str(text),
            _ => screen.push(json!(text)),
        }
    }
}

/// The next `state_change_seq` (one counter for the server, above every agent's).
fn bump_seq(state: &mut Value) -> u64 {
    let agents = state.get("agents").and_then(Value::as_array);
    let top = agents.into_iter().flatten().filter_map(|a| a.get("state_change_seq").and_then(Value::as_u64)).max();
    let n = state.get("seq").and_then(Value::as_u64).unwrap_or(1).max(top.unwrap_or(1)) + 1;
    state["seq"] = json!(n);
    n
}

// ---------------------------------------------------------------------------------------------
// Documents, with herdr's field names (keys in herdr's order)

fn status_of(state: &Value, panes: &[String]) -> String {
    let statuses: Vec<String> =
        panes.iter().filter_map(|p| agent_on_pane(state, p)).map(|a| s(a, "agent_status")).collect();
    for want in ["blocked", "working", "done", "idle"] {
        if statuses.iter().any(|x| x == want) {
            return want.to_string();
        }
    }
    "unknown".to_string()
}

fn focused_pane(ws: &Value, order: &[(String, Rect)]) -> String {
    let f = s(ws, "focused_pane");
    if order.iter().any(|(p, _)| *p == f) {
        return f;
    }
    order.first().map(|(p, _)| p.clone()).unwrap_or_default()
}

fn pane_doc(state: &Value, pane: &str) -> Value {
    let Some((wi, pi)) = locate(state, pane) else { return Value::Null };
    let ws = &state["workspaces"][wi];
    let p = &ws["panes"][pi];
    let (order, _) = geometry(&layout_of(ws));
    let rows = order.iter().find(|(id, _)| id == pane).map(|(_, r)| r.height).unwrap_or(AREA.height);
    let wid = s(ws, "workspace_id");
    let mut d = Map::new();
    let agent = agent_on_pane(state, pane);
    if let Some(a) = agent {
        d.insert("agent".into(), a["agent"].clone());
        if let Some(sess) = a.get("agent_session").filter(|v| !v.is_null()) {
            d.insert("agent_session".into(), sess.clone());
        }
    }
    d.insert("agent_status".into(), json!(agent.map(|a| s(a, "agent_status")).unwrap_or("unknown".into())));
    d.insert("cwd".into(), json!(s(p, "cwd")));
    // Only the focused workspace has a focused pane.
    d.insert("focused".into(), json!(wi == 0 && focused_pane(ws, &order) == pane));
    d.insert("foreground_cwd".into(), json!(s(p, "cwd")));
    d.insert("pane_id".into(), json!(pane));
    d.insert("revision".into(), json!(0));
    d.insert("scroll".into(), json!({"max_offset_from_bottom": 0, "offset_from_bottom": 0, "viewport_rows": rows}));
    d.insert("tab_id".into(), json!(format!("{wid}:t1")));
    d.insert("terminal_id".into(), json!(s(p, "terminal_id")));
    d.insert("workspace_id".into(), json!(wid));
    Value::Object(d)
}

fn agent_doc(state: &Value, a: &Value) -> Value {
    let pane = s(a, "pane_id");
    let p = pane_doc(state, &pane);
    let mut d = Map::new();
    d.insert("agent".into(), a["agent"].clone());
    if let Some(sess) = a.get("agent_session").filter(|v| !v.is_null()) {
        d.insert("agent_session".into(), sess.clone());
    }
    d.insert("agent_status".into(), json!(s(a, "agent_status")));
    d.insert("cwd".into(), p["cwd"].clone());
    d.insert("focused".into(), p["focused"].clone());
    d.insert("foreground_cwd".into(), p["foreground_cwd"].clone());
    d.insert("interactive_ready".into(), json!(true));
    if let Some(n) = a.get("name").filter(|v| v.is_string()) {
        d.insert("name".into(), n.clone());
    }
    d.insert("pane_id".into(), json!(pane));
    d.insert("revision".into(), json!(0));
    d.insert("state_change_seq".into(), json!(a.get("state_change_seq").and_then(Value::as_u64).unwrap_or(1)));
    d.insert("tab_id".into(), p["tab_id"].clone());
    d.insert("terminal_id".into(), p["terminal_id"].clone());
    d.insert("workspace_id".into(), p["workspace_id"].clone());
    Value::Object(d)
}

fn workspace_doc(state: &Value, wi: usize) -> Value {
    let ws = &state["workspaces"][wi];
    let wid = s(ws, "workspace_id");
    let panes: Vec<String> = geometry(&layout_of(ws)).0.into_iter().map(|(p, _)| p).collect();
    json!({
        "active_tab_id": format!("{wid}:t1"), "agent_status": status_of(state, &panes), "focused": wi == 0,
        "label": s(ws, "label"), "number": wi + 1, "pane_count": panes.len(), "tab_count": 1, "workspace_id": wid,
    })
}

fn tab_doc(state: &Value, wi: usize) -> Value {
    let ws = &state["workspaces"][wi];
    let wid = s(ws, "workspace_id");
    let panes: Vec<String> = geometry(&layout_of(ws)).0.into_iter().map(|(p, _)| p).collect();
    json!({
        "agent_status": status_of(state, &panes), "focused": wi == 0, "label": "1", "number": 1,
        "pane_count": panes.len(), "tab_id": format!("{wid}:t1"), "workspace_id": wid,
    })
}

// ---------------------------------------------------------------------------------------------
// The process: log, parse, lock, answer, wait

/// Where the real server's socket would be, for messages only.
fn socket_path(ctx: &Ctx, session: &str) -> String {
    let config = ctx
        .path_var("XDG_CONFIG_HOME")
        .or_else(|| ctx.path_var("HOME").map(|h| h.join(".config")))
        .unwrap_or_else(|| PathBuf::from("/"));
    config.join("herdr/sessions").join(session).join("herdr.sock").to_string_lossy().into_owned()
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
    let reply = answer(ctx, &argv);
    if !reply.out.is_empty() {
        ctx.say_raw(reply.out.as_bytes());
    }
    if !reply.err.is_empty() {
        ctx.diag(&reply.err);
    }
    reply.rc
}

struct Env {
    session: String,
    socket: String,
    cwd: String,
    stall_ms: u64,
    wait_cap_ms: Option<u64>,
}

fn answer(ctx: &Ctx, argv: &[String]) -> Reply {
    let mut words: Vec<String> = argv.to_vec();
    let mut session = ctx.var_nonempty("HERDR_SESSION");
    if words.first().map(String::as_str) == Some("--session") {
        if words.len() < 2 {
            return Reply::usage("missing value for --session");
        }
        session = Some(words[1].clone());
        words.drain(..2);
    }
    if words.first().map(String::as_str) == Some("--version") {
        return Reply { out: format!("{VERSION}\n"), err: String::new(), rc: 0 };
    }
    let session = session.unwrap_or_else(|| "default".to_string());
    let env = Env {
        socket: socket_path(ctx, &session),
        session,
        cwd: ctx.cwd().to_string_lossy().into_owned(),
        stall_ms: ctx.var("MAM_MOCK_STALL_MS").and_then(|v| v.parse().ok()).unwrap_or(STALL_MS),
        wait_cap_ms: ctx.var("MAM_MOCK_WAIT_CAP_MS").and_then(|v| v.parse().ok()),
    };
    let Some(state_path) = ctx.path_var("MAM_MOCK_STATE") else {
        return Reply::plain("ERROR: mock herdr: MAM_MOCK_STATE is not set", 2);
    };
    let call = match Call::parse(&words) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let outcome = {
        let _lock = Flock::lock_path(&state_path.with_extension("lock"), LockMode::Exclusive);
        let mut state = load(&state_path);
        let outcome = call.exec(&mut state, &env);
        let _ = sys::atomic_write(&state_path, serde_json::to_string_pretty(&state).unwrap_or_default().as_bytes());
        outcome
    };
    match outcome {
        Outcome::Reply(r) => r,
        Outcome::After(d, r) => {
            sys::sleep(d);
            r
        }
        Outcome::Wait(w) => wait(&state_path, &env, w),
    }
}

fn load(path: &Path) -> Value {
    std::fs::read(path).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_else(|| json!({}))
}

fn capped(env: &Env, ms: u64) -> u64 {
    env.wait_cap_ms.map_or(ms, |c| ms.min(c))
}

/// `agent prompt --wait` / `agent wait`: poll the state (unlocked between looks) until the agent's
/// status is one of `until` (after a state change, for a prompt from a non-working state), the
/// stall window passes without a change, or the caller's timeout passes.
fn wait(state_path: &Path, env: &Env, w: Wait) -> Reply {
    let started = Instant::now();
    // herdr: a caller timeout no longer than the stall window keeps the plain `timeout`.
    let stall = w.needs_change && w.timeout_ms.is_none_or(|t| t > env.stall_ms);
    let timeout = w.timeout_ms.map(|t| Duration::from_millis(capped(env, t)));
    loop {
        let state = {
            let _lock = Flock::lock_path(&state_path.with_extension("lock"), LockMode::Shared);
            load(state_path)
        };
        let Some(ai) = agent_index(&state, &w.target) else {
            return Reply::error(w.id, "agent_not_found", &format!("agent target {} not found", w.target));
        };
        let a = &state["agents"][ai];
        let seq = a.get("state_change_seq").and_then(Value::as_u64).unwrap_or(1);
        let status = s(a, "agent_status");
        let changed = seq > w.seq0;
        if (changed || !w.needs_change) && w.until.contains(&status) {
            return Reply::ok(w.id, json!({"agent": agent_doc(&state, a), "type": w.result_type}));
        }
        let elapsed = started.elapsed();
        if timeout.is_some_and(|t| elapsed >= t) {
            return Reply::error(w.id, "timeout", "timed out waiting for agent status");
        }
        if stall && !changed && elapsed >= Duration::from_millis(env.stall_ms) {
            let msg = format!(
                "agent prompt produced no observed state change within {} ms; status is {status} and state_change_seq remained {seq}",
                env.stall_ms
            );
            return Reply::error(w.id, "agent_prompt_stalled", &msg);
        }
        sys::sleep(Duration::from_millis(20));
    }
}

/// A parsed command: noun, verb and arguments, checked for usage errors before any state is read.
struct Call {
    noun: String,
    verb: String,
    args: Args,
}

fn envelope_id(noun: &str, verb: &str) -> &'static str {
    match (noun, verb) {
        ("agent", "list") => "cli:agent:list",
        ("agent", "get") => "cli:agent:get",
        ("agent", "start") => "cli:agent:start",
        ("agent", "prompt") => "cli:agent:prompt",
        ("agent", "read") => "cli:agent:read",
        ("agent", "wait") => "cli:agent:wait",
        ("agent", "send-keys") => "cli:agent:send-keys",
        ("workspace", "list") => "cli:workspace:list",
        ("workspace", "create") => "cli:workspace:create",
        ("workspace", "rename") => "cli:workspace:rename",
        ("workspace", "close") => "cli:workspace:close",
        ("pane", "list") => "cli:pane:list",
        ("pane", "layout") => "cli:pane:layout",
        ("pane", "process-info") => "cli:pane:process_info",
        ("pane", "split") => "cli:pane:split",
        ("pane", "read") => "cli:pane:read",
        ("pane", "close") => "cli:pane:close",
        // The low-level input commands answer errors under a generic id.
        _ => "cli:request",
    }
}

impl Call {
    fn parse(words: &[String]) -> Result<Call, Reply> {
        let noun = words.first().cloned().unwrap_or_default();
        let verb = words.get(1).cloned().unwrap_or_default();
        let rest = &words[words.len().min(2)..];
        let read_flags: (&[&str], &[&str]) = (&["--source", "--lines", "--format"], &["--ansi", "--raw"]);
        let (valued, bare): (&[&str], &[&str]) = match (noun.as_str(), verb.as_str()) {
            ("server", "") => (&[], &[]),
            ("server", "stop") => (&[], &[]),
            ("agent", "list" | "get") | ("workspace", "list" | "rename" | "close") => (&[], &[]),
            ("agent", "start") => (&["--kind", "--pane", "--timeout"], &[]),
            ("agent", "prompt") => (&["--until", "--timeout"], &["--wait"]),
            ("agent", "wait") => (&["--until", "--timeout"], &[]),
            ("agent", "read") | ("pane", "read") => read_flags,
            ("agent" | "pane", "send-keys") | ("pane", "send-text" | "run" | "close") => (&[], &[]),
            ("workspace", "create") => (&["--cwd", "--label", "--env"], &["--focus", "--no-focus"]),
            ("pane", "list") => (&["--workspace"], &[]),
            ("pane", "layout" | "process-info") => (&["--pane"], &["--current"]),
            ("pane", "split") => {
                (&["--pane", "--direction", "--ratio", "--cwd", "--env", "--right-click"], &["--focus", "--no-focus"])
            }
            ("server" | "agent" | "workspace" | "pane", _) => {
                return Err(Reply::usage(&format!(
                    "unknown {noun} command: {verb}\nrun 'herdr {noun} --help' for usage"
                )))
            }
            _ => return Err(Reply::usage(&format!("unknown command: {noun}\nrun 'herdr --help' for usage"))),
        };
        let args = Args::parse(rest, valued, bare)?;
        let call = Call { noun, verb, args };
        call.check()?;
        Ok(call)
    }

    /// The usage errors (exit 2, plain text) herdr reports before it talks to a server.
    fn check(&self) -> Result<(), Reply> {
        let a = &self.args;
        let need_pos = |n: usize, usage: &str| {
            if a.pos.len() < n {
                Err(Reply::usage(&format!("usage: herdr {usage}")))
            } else {
                Ok(())
            }
        };
        match (self.noun.as_str(), self.verb.as_str()) {
            ("agent", "get") => need_pos(1, "agent get <target>")?,
            ("agent", "start") => {
                need_pos(1, "agent start <name> --kind KIND --pane ID [--timeout MS] [-- <agent-args...>]")?;
                let kind = a.need("--kind")?;
                if !KINDS.contains(&kind.as_str()) {
                    return Err(Reply::usage(&format!("unsupported interactive agent kind: {kind}")));
                }
                a.need("--pane")?;
                a.number("--timeout")?;
            }
            ("agent", "prompt") => {
                need_pos(2, "agent prompt <target> <text> [--wait] [--until STATUS]... [--timeout MS]")?;
                if !a.all("--until").is_empty() && !a.has("--wait") {
                    return Err(Reply::usage("--until requires --wait"));
                }
                a.number("--timeout")?;
            }
            ("agent", "wait") => {
                need_pos(1, "agent wait <target> [--until STATUS]... [--timeout MS]")?;
                a.number("--timeout")?;
            }
            ("agent" | "pane", "read") => {
                need_pos(1, &format!("{} read <target> [--source S] [--lines N]", self.noun))?;
                if let Some(src) = a.val("--source") {
                    if !["visible", "recent", "recent-unwrapped", "detection"].contains(&src) {
                        return Err(Reply::usage(&format!("invalid read source: {src}")));
                    }
                }
                a.number("--lines")?;
            }
            ("agent", "send-keys") => need_pos(2, "agent send-keys <target> <key> [key ...]")?,
            ("pane", "send-keys") => need_pos(2, "pane send-keys <pane_id> <key> [key ...]")?,
            ("pane", "send-text") => need_pos(2, "pane send-text <pane_id> <text>")?,
            ("pane", "run") => need_pos(2, "pane run <pane_id> <command>")?,
            ("pane", "close") => need_pos(1, "pane close <pane_id>")?,
            ("workspace", "rename") => need_pos(2, "workspace rename <workspace_id> <label>")?,
            ("workspace", "close") => need_pos(1, "workspace close <workspace_id>")?,
            ("workspace", "create") | ("pane", "split") => {
                if self.verb == "split" {
                    let dir = a.need("--direction")?;
                    if dir != "right" && dir != "down" {
                        return Err(Reply::usage(&format!("invalid split direction: {dir}")));
                    }
                    if a.pos.is_empty() && a.val("--pane").is_none() {
                        return Err(Reply::usage("usage: herdr pane split <pane_id> --direction right|down"));
                    }
                }
                if let Some(bad) = a.all("--env").into_iter().find(|kv| !kv.contains('=')) {
                    return Err(Reply::usage(&format!("invalid --env value: {bad} (expected KEY=VALUE)")));
                }
            }
            ("pane", "layout" | "process-info") if a.val("--pane").is_none() && !a.has("--current") => {
                return Err(Reply::usage("missing required --pane"));
            }
            _ => {}
        }
        Ok(())
    }

    fn id(&self) -> &'static str {
        envelope_id(&self.noun, &self.verb)
    }

    fn exec(&self, state: &mut Value, env: &Env) -> Outcome {
        if self.noun == "server" {
            return Outcome::Reply(self.server(state, env));
        }
        if state.get("running").and_then(Value::as_bool) != Some(true) {
            let msg = format!(
                "no herdr server is running at {}; run `herdr session attach {}` to start or attach it",
                env.socket, env.session
            );
            let doc = json!({"id": format!("cli:{}:{}", self.noun, self.verb), "error": {"code": "server_not_running", "message": msg}});
            return Outcome::Reply(Reply::plain(&doc.to_string(), 1));
        }
        let key = format!("{}_{}", self.noun, self.verb.replace('-', "_"));
        if let Some(r) =
            state.pointer(&format!("/inject/{key}")).and_then(Value::as_str).and_then(|k| injected(k, self.id()))
        {
            return Outcome::Reply(r);
        }
        let a = &self.args;
        let pos = |i: usize| a.pos.get(i).cloned().unwrap_or_default();
        let r = match (self.noun.as_str(), self.verb.as_str()) {
            ("agent", "list") => {
                let agents: Vec<Value> = arr(state, "agents").clone();
                let list: Vec<Value> = agents.iter().map(|x| agent_doc(state, x)).collect();
                Reply::ok(self.id(), json!({"agents": list, "type": "agent_list"}))
            }
            ("agent", "get") => match agent_index(state, &pos(0)) {
                Some(i) => {
                    Reply::ok(self.id(), json!({"agent": agent_doc(state, &state["agents"][i]), "type": "agent_info"}))
                }
                None => self.no_agent(&pos(0)),
            },
            ("agent", "start") => return self.agent_start(state, env),
            ("agent", "prompt") => return self.agent_prompt(state),
            ("agent", "wait") => {
                if agent_index(state, &pos(0)).is_none() {
                    return Outcome::Reply(self.no_agent(&pos(0)));
                }
                return Outcome::Wait(Wait {
                    id: self.id(),
                    result_type: "agent_info",
                    target: pos(0),
                    seq0: 0,
                    needs_change: false,
                    timeout_ms: a.number("--timeout").ok().flatten(),
                    until: until(a),
                });
            }
            ("agent", "read") => match agent_index(state, &pos(0)) {
                Some(i) => {
                    let pane = s(&state["agents"][i], "pane_id");
                    self.read(state, &pane)
                }
                None => self.no_agent(&pos(0)),
            },
            ("agent", "send-keys") => match agent_index(state, &pos(0)) {
                Some(i) => {
                    let pane = s(&state["agents"][i], "pane_id");
                    match self.keys(state, &pane, &a.pos[1..]) {
                        Ok(()) => Reply::ok(self.id(), json!({"type": "ok"})),
                        Err(r) => r,
                    }
                }
                None => self.no_agent(&pos(0)),
            },
            ("workspace", "list") => {
                let n = arr(state, "workspaces").len();
                let list: Vec<Value> = (0..n).map(|i| workspace_doc(state, i)).collect();
                Reply::ok(self.id(), json!({"type": "workspace_list", "workspaces": list}))
            }
            ("workspace", "create") => self.workspace_create(state, env),
            ("workspace", "rename") => match ws_index(state, &pos(0)) {
                Some(i) => {
                    state["workspaces"][i]["label"] = json!(pos(1));
                    Reply::ok(self.id(), json!({"type": "workspace_info", "workspace": workspace_doc(state, i)}))
                }
                None => self.no_workspace(&pos(0)),
            },
            ("workspace", "close") => match ws_index(state, &pos(0)) {
                Some(i) => {
                    let gone: Vec<String> =
                        pane_records(&state["workspaces"][i]).iter().map(|p| s(p, "pane_id")).collect();
                    arr(state, "workspaces").remove(i);
                    arr(state, "agents").retain(|x| !gone.contains(&s(x, "pane_id")));
                    Reply::ok(self.id(), json!({"type": "ok"}))
                }
                None => self.no_workspace(&pos(0)),
            },
            ("pane", "list") => {
                let wss: Vec<usize> = match a.val("--workspace") {
                    Some(w) => match ws_index(state, w) {
                        Some(i) => vec![i],
                        None => return Outcome::Reply(self.no_workspace(w)),
                    },
                    None => (0..arr(state, "workspaces").len()).collect(),
                };
                let mut list = Vec::new();
                for wi in wss {
                    for (p, _) in geometry(&layout_of(&state["workspaces"][wi])).0 {
                        list.push(pane_doc(state, &p));
                    }
                }
                Reply::ok(self.id(), json!({"panes": list, "type": "pane_list"}))
            }
            ("pane", "layout") => self.pane_layout(state),
            ("pane", "process-info") => self.process_info(state),
            ("pane", "split") => self.pane_split(state),
            ("pane", "send-keys") => {
                if locate(state, &pos(0)).is_none() {
                    return Outcome::Reply(self.no_pane(&pos(0)));
                }
                match self.keys(state, &pos(0), &a.pos[1..]) {
                    Ok(()) => Reply::silent(),
                    Err(r) => r,
                }
            }
            ("pane", "send-text" | "run") => {
                if locate(state, &pos(0)).is_none() {
                    return Outcome::Reply(self.no_pane(&pos(0)));
                }
                type_screen(state, &pos(0), &a.pos[1..].join(" "));
                if self.verb == "run" {
                    push_screen(state, &pos(0), "");
                }
                Reply::silent()
            }
            ("pane", "read") => {
                if locate(state, &pos(0)).is_none() {
                    return Outcome::Reply(self.no_pane(&pos(0)));
                }
                self.read(state, &pos(0))
            }
            ("pane", "close") => self.pane_close(state, &pos(0)),
            _ => Reply::usage(&format!("unknown command: {} {}", self.noun, self.verb)),
        };
        Outcome::Reply(r)
    }

    fn no_agent(&self, target: &str) -> Reply {
        Reply::error(self.id(), "agent_not_found", &format!("agent target {target} not found"))
    }
    fn no_workspace(&self, id: &str) -> Reply {
        Reply::error(self.id(), "workspace_not_found", &format!("workspace {id} not found"))
    }
    fn no_pane(&self, id: &str) -> Reply {
        Reply::error(self.id(), "pane_not_found", &format!("pane {id} not found"))
    }

    fn server(&self, state: &mut Value, env: &Env) -> Reply {
        let running = state.get("running").and_then(Value::as_bool) == Some(true);
        if self.verb == "stop" {
            if !running {
                let msg = format!(
                    "server is not running or cannot be reached at {}: No such file or directory (os error 2)",
                    env.socket
                );
                return Reply::plain(&msg, 1);
            }
            // The server's panes and agents end with it.
            state["running"] = json!(false);
            state["workspaces"] = json!([]);
            state["agents"] = json!([]);
            return Reply::silent();
        }
        if running {
            return Reply::plain(&format!("error: herdr server is already running\napi socket: {}", env.socket), 1);
        }
        // The real server stays in the foreground; the mock marks its state running and returns.
        state["running"] = json!(true);
        state["server_session"] = json!(env.session);
        Reply::plain(
            &format!(
                "herdr server running; you can use any herdr CLI command in another terminal.\napi socket: {}",
                env.socket
            ),
            0,
        )
    }

    fn workspace_create(&self, state: &mut Value, env: &Env) -> Reply {
        let a = &self.args;
        let cwd = a.val("--cwd").map(str::to_string).unwrap_or_else(|| env.cwd.clone());
        let label = a.val("--label").map(str::to_string).unwrap_or_else(|| {
            Path::new(&cwd).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| cwd.clone())
        });
        let n = counter(state, "next_workspace", 1);
        let wid = format!("w{n}");
        let pid = format!("{wid}:p1");
        let pane = new_pane(state, &pid, &cwd, &a.all("--env"));
        arr(state, "workspaces").push(json!({
            "workspace_id": wid, "label": label, "next_pane": 2, "focused_pane": pid,
            "layout": {"pane": pid}, "panes": [pane],
        }));
        let wi = arr(state, "workspaces").len() - 1;
        Reply::ok(
            self.id(),
            json!({"root_pane": pane_doc(state, &pid), "tab": tab_doc(state, wi), "type": "workspace_created",
                   "workspace": workspace_doc(state, wi)}),
        )
    }

    fn pane_split(&self, state: &mut Value) -> Reply {
        let a = &self.args;
        let src = a.pos.first().map(String::as_str).or(a.val("--pane")).unwrap_or_default().to_string();
        let Some((wi, pi)) = locate(state, &src) else {
            return Reply::error(self.id(), "pane_not_found", "pane not found");
        };
        let dir = a.val("--direction").unwrap_or("right").to_string();
        let cwd = a.val("--cwd").map(str::to_string).unwrap_or_else(|| s(&state["workspaces"][wi]["panes"][pi], "cwd"));
        let ws = &mut state["workspaces"][wi];
        let n = counter(ws, "next_pane", 2);
        let pid = format!("{}:p{n}", s(ws, "workspace_id"));
        let mut tree = layout_of(ws);
        split_leaf(&mut tree, &src, &dir, &pid);
        ws["layout"] = tree;
        let pane = new_pane(state, &pid, &cwd, &a.all("--env"));
        arr(&mut state["workspaces"][wi], "panes").push(pane);
        Reply::ok(self.id(), json!({"pane": pane_doc(state, &pid), "type": "pane_info"}))
    }

    fn pane_close(&self, state: &mut Value, pane: &str) -> Reply {
        let Some((wi, _)) = locate(state, pane) else { return self.no_pane(pane) };
        let ws = &mut state["workspaces"][wi];
        let tree = remove_leaf(&layout_of(ws), pane);
        arr(ws, "panes").retain(|p| s(p, "pane_id") != pane);
        match tree {
            Some(t) => ws["layout"] = t,
            // The last pane closes its tab, and the last tab its workspace.
            None => {
                arr(state, "workspaces").remove(wi);
            }
        }
        arr(state, "agents").retain(|x| s(x, "pane_id") != pane);
        Reply::ok(self.id(), json!({"type": "ok"}))
    }

    fn pane_layout(&self, state: &mut Value) -> Reply {
        let pane = self.args.val("--pane").unwrap_or_default().to_string();
        let Some((wi, _)) = locate(state, &pane) else {
            return Reply::error(self.id(), "pane_not_found", "pane not found");
        };
        let ws = &state["workspaces"][wi];
        let wid = s(ws, "workspace_id");
        let (order, splits) = geometry(&layout_of(ws));
        let focused = focused_pane(ws, &order);
        let panes: Vec<Value> =
            order.iter().map(|(p, r)| json!({"focused": *p == focused, "pane_id": p, "rect": r.json()})).collect();
        let splits: Vec<Value> = splits
            .iter()
            .map(|x| json!({"direction": x.direction, "id": x.id, "ratio": x.ratio, "rect": x.rect.json()}))
            .collect();
        Reply::ok(
            self.id(),
            json!({"layout": {"area": AREA.json(), "focused_pane_id": focused, "panes": panes, "splits": splits,
                              "tab_id": format!("{wid}:t1"), "workspace_id": wid, "zoomed": false},
                   "type": "pane_layout"}),
        )
    }

    fn process_info(&self, state: &mut Value) -> Reply {
        let pane = self.args.val("--pane").unwrap_or_default().to_string();
        let Some((wi, pi)) = locate(state, &pane) else {
            return Reply::error(self.id(), "pane_not_found", "pane not found");
        };
        let p = state["workspaces"][wi]["panes"][pi].clone();
        let cwd = s(&p, "cwd");
        let shell_pid = p.get("shell_pid").and_then(Value::as_u64).unwrap_or(1);
        let (argv, pid): (Vec<String>, u64) = if let Some(a) = agent_on_pane(state, &pane) {
            let mut argv = vec![s(a, "agent")];
            argv.extend(
                a.get("args")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .map(str::to_string),
            );
            (argv, a.get("pid").and_then(Value::as_u64).unwrap_or(shell_pid + 1))
        } else if let Some(fg) = p.get("foreground").and_then(Value::as_str) {
            (fg.split_whitespace().map(str::to_string).collect(), shell_pid + 1)
        } else {
            (vec!["/bin/bash".to_string()], shell_pid)
        };
        let name = Path::new(argv.first().map(String::as_str).unwrap_or("bash"))
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        Reply::ok(
            self.id(),
            json!({"process_info": {"foreground_process_group_id": pid,
                "foreground_processes": [{"argv": argv, "cmdline": argv.join(" "), "cwd": cwd, "name": name, "pid": pid}],
                "pane_id": pane, "shell_pid": shell_pid}, "type": "pane_process_info"}),
        )
    }

    /// Validates every key before any is delivered; `enter` starts a new screen line and counts
    /// towards an agent's `blocked_enters`.
    fn keys(&self, state: &mut Value, pane: &str, keys: &[String]) -> Result<(), Reply> {
        if let Some(bad) = keys.iter().find(|k| !valid_key(k)) {
            return Err(Reply::error(self.id(), "invalid_key", &format!("unsupported key {bad}")));
        }
        for k in keys {
            let lk = k.to_lowercase();
            if lk == "enter" || lk == "return" {
                push_screen(state, pane, "");
                let ai = state
                    .get("agents")
                    .and_then(Value::as_array)
                    .and_then(|v| v.iter().position(|a| s(a, "pane_id") == pane));
                let Some(ai) = ai else { continue };
                let Some(n) = state["agents"][ai].get("blocked_enters").and_then(Value::as_u64) else { continue };
                if n <= 1 {
                    let ready = ready_line(&s(&state["agents"][ai], "agent"));
                    push_screen(state, pane, ready);
                    let seq = bump_seq(state);
                    let a = &mut state["agents"][ai];
                    a["blocked_enters"] = Value::Null;
                    a["agent_status"] = json!("idle");
                    a["state_change_seq"] = json!(seq);
                } else {
                    state["agents"][ai]["blocked_enters"] = json!(n - 1);
                }
            }
        }
        Ok(())
    }

    /// Plain text, like herdr: the screen is the pane's rows (its content from the top, blank rows
    /// below). `recent` (the default) takes the last `--lines` rows (80), blank ones included, then
    /// drops trailing blank rows, so a few rows of a mostly empty pane read as nothing; `visible`
    /// and `detection` drop trailing blank rows first and then keep the last `--lines` lines.
    fn read(&self, state: &mut Value, pane: &str) -> Reply {
        if state.pointer("/inject/screen_changes").and_then(Value::as_bool) == Some(true) {
            let n = counter(state, "screen_ticks", 1);
            push_screen(state, pane, &format!("screen tick {n}"));
        }
        let mut rows: Vec<String> = pane_mut(state, pane)
            .and_then(|p| p.get("screen").and_then(Value::as_array).cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|l| l.as_str().map(str::to_string))
            .collect();
        let height = locate(state, pane)
            .and_then(|(wi, _)| geometry(&layout_of(&state["workspaces"][wi])).0.into_iter().find(|(p, _)| p == pane))
            .map_or(AREA.height, |(_, r)| r.height) as usize;
        while rows.len() < height {
            rows.push(String::new());
        }
        let lines = self.args.number("--lines").ok().flatten();
        let trim = |v: &[String]| {
            let end = v.iter().rposition(|l| !l.trim().is_empty()).map_or(0, |i| i + 1);
            v[..end].to_vec()
        };
        let source = self.args.val("--source").unwrap_or("recent");
        let text = if source.starts_with("recent") {
            let n = lines.unwrap_or(80) as usize;
            trim(&rows[rows.len().saturating_sub(n)..])
        } else {
            let kept = trim(&rows[rows.len().saturating_sub(height)..]);
            let n = lines.map_or(kept.len(), |n| n as usize);
            kept[kept.len().saturating_sub(n)..].to_vec()
        };
        Reply::text(&text)
    }

    fn agent_start(&self, state: &mut Value, env: &Env) -> Outcome {
        let a = &self.args;
        let name = a.pos[0].clone();
        let kind = a.val("--kind").unwrap_or_default().to_string();
        let pane = a.val("--pane").unwrap_or_default().to_string();
        let timeout = a.number("--timeout").ok().flatten();
        let fail = |code: &str, msg: &str| Outcome::Reply(Reply::error(self.id(), code, msg));
        if !valid_agent_name(&name) {
            return fail(
                "invalid_agent_name",
                "agent name must start with a lowercase letter and contain only lowercase letters, digits, '-' or '_' (1-32 characters)",
            );
        }
        if timeout.is_some_and(|t| !(3001..=300_000).contains(&t)) {
            return fail(
                "invalid_agent_timeout",
                "agent start timeout must be greater than 3000ms and at most 300000ms",
            );
        }
        if let Some(i) = agent_index(state, &name).filter(|i| s(&state["agents"][*i], "name") == name) {
            let other = s(&state["agents"][i], "pane_id");
            return fail(
                "agent_name_taken",
                &format!("agent name {name} is already used; candidates: pane_id={other}"),
            );
        }
        let Some((wi, pi)) = locate(state, &pane) else {
            return fail("agent_pane_not_found", &format!("agent target pane {pane} not found"));
        };
        let busy = state["workspaces"][wi]["panes"][pi].get("foreground").is_some_and(|f| f.is_string());
        if busy || agent_on_pane(state, &pane).is_some() {
            return fail("agent_pane_busy", &format!("agent target pane {pane} is not an available shell"));
        }
        let mut argv = vec![kind.clone()];
        argv.extend(a.tail.iter().cloned());
        type_screen(state, &pane, &argv.join(" "));
        // An agent that never becomes ready (it exited, or hangs): herdr answers after the timeout.
        if state.pointer("/inject/start").and_then(Value::as_str) == Some("timeout") {
            let ms = capped(env, timeout.unwrap_or(30_000));
            let r = Reply::error(self.id(), "timeout", "timed out waiting for agent startup");
            return Outcome::After(Duration::from_millis(ms), r);
        }
        push_screen(state, &pane, &format!("{kind} ready"));
        let status = state.pointer("/inject/start_status").and_then(Value::as_str).unwrap_or("idle").to_string();
        // An idle CLI shows its own input line (the adapter table's ready line, A58).
        if status != "blocked" {
            push_screen(state, &pane, ready_line(&kind));
        }
        let never = state.pointer("/inject/never_working").and_then(Value::as_bool).unwrap_or(false);
        let seq = bump_seq(state);
        let shell_pid = state["workspaces"][wi]["panes"][pi]["shell_pid"].as_u64().unwrap_or(1);
        let rec = json!({"name": name, "agent": kind, "pane_id": pane, "agent_status": status, "args": a.tail,
            "state_change_seq": seq, "never_working": never, "pid": shell_pid + 1});
        arr(state, "agents").push(rec.clone());
        Outcome::Reply(Reply::ok(
            self.id(),
            json!({"agent": agent_doc(state, &rec), "argv": argv, "type": "agent_started"}),
        ))
    }

    fn agent_prompt(&self, state: &mut Value) -> Outcome {
        let a = &self.args;
        let target = a.pos[0].clone();
        let Some(ai) = agent_index(state, &target) else { return Outcome::Reply(self.no_agent(&target)) };
        let pane = s(&state["agents"][ai], "pane_id");
        type_screen(state, &pane, &a.pos[1]);
        push_screen(state, &pane, "");
        if let Some(path) = state.pointer("/inject/on_prompt_append/path").and_then(Value::as_str) {
            let line = state.pointer("/inject/on_prompt_append/line").and_then(Value::as_str).unwrap_or("");
            let _ = sys::append_locked(Path::new(path), format!("{line}\n").as_bytes());
        }
        let forced = state.pointer("/inject/prompt").and_then(Value::as_str).unwrap_or("").to_string();
        if forced == "transport_error" {
            return Outcome::Reply(Reply::plain(TRANSPORT_ERROR, 1));
        }
        let reaction = Reaction::of(&state["agents"][ai], &forced);
        let before = state["agents"][ai].clone();
        let seq0 = before.get("state_change_seq").and_then(Value::as_u64).unwrap_or(1);
        let prompts = before.get("prompts").and_then(Value::as_u64).unwrap_or(0) + 1;
        let seq = match reaction {
            Reaction::Settle => {
                bump_seq(state);
                bump_seq(state)
            }
            Reaction::Work => bump_seq(state),
            Reaction::None => seq0,
        };
        let ag = &mut state["agents"][ai];
        ag["prompts"] = json!(prompts);
        ag["state_change_seq"] = json!(seq);
        match reaction {
            Reaction::Settle => ag["agent_status"] = json!("idle"),
            Reaction::Work => ag["agent_status"] = json!("working"),
            Reaction::None => {}
        }
        if !a.has("--wait") {
            let doc = agent_doc(state, &state["agents"][ai]);
            return Outcome::Reply(Reply::ok(self.id(), json!({"agent": doc, "type": "agent_prompted"})));
        }
        Outcome::Wait(Wait {
            id: self.id(),
            result_type: "agent_prompted",
            target: s(&state["agents"][ai], "name"),
            seq0,
            needs_change: s(&before, "agent_status") != "working",
            timeout_ms: a.number("--timeout").ok().flatten(),
            until: until(a),
        })
    }
}

/// How an agent reacts to a prompt. State knobs: the agent's `react` (`settle`, `work`, `none`),
/// else `never_working: true` (none), else `inject.prompt`: `timeout` (works and never settles),
/// `settled` (works, then idle), `transport_error` (the CLI loses the server). The default is none:
/// that is what real herdr does with mam's fake agent, which it never sees working.
enum Reaction {
    /// Working, then idle at once: `--wait` answers `agent_prompted`.
    Settle,
    /// Working until the state file says otherwise: `--wait` ends in `timeout`.
    Work,
    /// No state change: `--wait` ends in `agent_prompt_stalled` after the stall window.
    None,
}

impl Reaction {
    fn of(agent: &Value, forced: &str) -> Reaction {
        match agent.get("react").and_then(Value::as_str) {
            Some("settle") => return Reaction::Settle,
            Some("work") => return Reaction::Work,
            Some("none") => return Reaction::None,
            _ => {}
        }
        if agent.get("never_working").and_then(Value::as_bool) == Some(true) {
            return Reaction::None;
        }
        match forced {
            "timeout" => Reaction::Work,
            "settled" => Reaction::Settle,
            // mam's fake agent, the only agent tests run, never changes state on real herdr.
            _ => Reaction::None,
        }
    }
}

fn until(a: &Args) -> Vec<String> {
    let u = a.all("--until");
    if u.is_empty() {
        SETTLED.iter().map(|x| x.to_string()).collect()
    } else {
        u
    }
}

fn ws_index(state: &mut Value, id: &str) -> Option<usize> {
    arr(state, "workspaces").iter().position(|w| s(w, "workspace_id") == id)
}

fn new_pane(state: &mut Value, pid: &str, cwd: &str, env: &[String]) -> Value {
    // Above any pid_max (2^22): a pid of the mock never names a real process that `stop` could end.
    let shell_pid = counter(state, "next_pid", 40_000) * 10 + 4_200_000;
    let env: Map<String, Value> =
        env.iter().filter_map(|kv| kv.split_once('=').map(|(k, v)| (k.to_string(), json!(v)))).collect();
    json!({"pane_id": pid, "cwd": cwd, "env": env, "terminal_id": terminal_id(), "shell_pid": shell_pid,
           "screen": [format!("mock@herdr:{cwd}$ ")], "workspace_id": workspace_of(pid)})
}

/// Fault injection per command (`inject.<noun>_<verb>`, dashes as underscores):
/// `error_doc` / `error_doc_exit1` an unrelated error (stderr, exit 1), `server_not_running`,
/// `transport_error` (the server went away mid-call), `garbage` (stdout that is not JSON, exit 0;
/// no real herdr does this, it stands for a broken install).
fn injected(kind: &str, id: &str) -> Option<Reply> {
    Some(match kind {
        "error_doc" | "error_doc_exit1" => Reply::error(id, "internal_error", "unrelated failure"),
        "server_not_running" => Reply::error(id, "server_not_running", "no herdr server is running"),
        "transport_error" => Reply::plain(TRANSPORT_ERROR, 1),
        "garbage" => Reply { out: "this is not json\n".into(), err: String::new(), rc: 0 },
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_halve_like_herdr() {
        // Observed on herdr 0.8.0: root right, left down, right down, then the left bottom right
        // and its right half down.
        let mut t = json!({"pane": "w1:p1"});
        for (src, dir, new) in [
            ("w1:p1", "right", "w1:p2"),
            ("w1:p1", "down", "w1:p3"),
            ("w1:p2", "down", "w1:p4"),
            ("w1:p3", "right", "w1:p5"),
            ("w1:p5", "down", "w1:p6"),
        ] {
            assert!(split_leaf(&mut t, src, dir, new));
        }
        let (panes, splits) = geometry(&t);
        let got: Vec<(&str, i64, i64, i64, i64)> =
            panes.iter().map(|(p, r)| (p.as_str(), r.x, r.y, r.width, r.height)).collect();
        assert_eq!(
            got,
            [
                ("w1:p1", 26, 1, 27, 12),
                ("w1:p3", 26, 13, 14, 11),
                ("w1:p5", 40, 13, 13, 6),
                ("w1:p6", 40, 19, 13, 5),
                ("w1:p2", 53, 1, 27, 12),
                ("w1:p4", 53, 13, 27, 11),
            ]
        );
        let ids: Vec<&str> = splits.iter().map(|x| x.id.as_str()).collect();
        assert_eq!(ids, ["split_0_root", "split_1_0", "split_2_01", "split_3_011", "split_4_1"]);
        // Closing w1:p3: its sibling subtree takes the parent's rect.
        let t = remove_leaf(&t, "w1:p3").unwrap();
        let (panes, splits) = geometry(&t);
        assert_eq!(panes[1], ("w1:p5".to_string(), Rect { x: 26, y: 13, width: 27, height: 6 }));
        let ids: Vec<&str> = splits.iter().map(|x| x.id.as_str()).collect();
        assert_eq!(ids, ["split_0_root", "split_1_0", "split_2_01", "split_3_1"]);
    }

    #[test]
    fn keys_follow_herdr_combo_syntax() {
        for k in ["enter", "Enter", "ctrl+c", "C-c", "a", "esc", "f12", "shift+tab", "control+j", "minus", "é"] {
            assert!(valid_key(k), "{k}");
        }
        for k in ["hello", "home", "pgup", "C-enter", "M-x", "ctrl+", "a+b", " "] {
            assert!(!valid_key(k), "{k}");
        }
    }
}
