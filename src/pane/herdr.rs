//! The herdr backend (ORCH 1.3, 1.4): maps the contract onto `herdr` CLI calls, parses their JSON
//! leniently (unknown fields ignored, `serde_json::Value` only), and bootstraps a server only when a
//! mutating call meets a structured `server_not_running`.
//!
//! Every call runs with `HERDR_SESSION=<server>` and without `HERDR_SOCKET_PATH`, so a caller inside a
//! pane of one server can address an agent on another. Error documents are never read as lists.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::contract::{
    canon, is_shell, Accepted, Agent, Backend, Created, Dir, ListOutcome, PaneError, PaneInfo, PaneResult,
    PromptOutcome, Status, Workspace,
};
use super::knobs::Knobs;
use super::proc::{no_autostart, run_capture, server_env};
use crate::ctx::Ctx;
use crate::sys;
use crate::text::{one_line, show_path};

/// Default server for new sessions (1.1).
pub const DEFAULT_SESSION: &str = "multi-agent-mux";

/// What one herdr call answered.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// Exit 0 with a success document: its `result` (or the document itself when it has none).
    Ok(Value),
    /// A structured `server_not_running` on stdout or stderr, whatever the exit code.
    NoServer,
    /// An error document on stdout (any exit code): its code and message.
    Error { code: String, message: String },
    /// Anything else: nonzero exit without a document, non-JSON, a parse failure.
    Bad(String),
}

fn parse_doc(text: &str) -> Option<Value> {
    let t = text.trim();
    if t.is_empty() {
        return None;
    }
    if let Ok(v) = serde_json::from_str::<Value>(t) {
        return Some(v);
    }
    // Some builds print a log line before the document: take the last line that parses.
    t.lines().rev().find_map(|l| serde_json::from_str::<Value>(l.trim()).ok().filter(|v| v.is_object()))
}

fn error_code(v: &Value) -> Option<(String, String)> {
    let e = v.get("error")?;
    match e {
        Value::String(s) => Some((s.clone(), String::new())),
        Value::Object(_) => {
            let code = e.get("code").and_then(Value::as_str).unwrap_or("error").to_string();
            let msg = e.get("message").and_then(Value::as_str).unwrap_or("").to_string();
            Some((code, msg))
        }
        _ => Some(("error".into(), e.to_string())),
    }
}

/// Classifies a finished call (1.4). Pure over the exit code and the two streams.
pub fn classify(code: Option<i32>, stdout: &str, stderr: &str) -> Reply {
    let out_doc = parse_doc(stdout);
    let err_doc = parse_doc(stderr);
    for d in [&out_doc, &err_doc].into_iter().flatten() {
        if error_code(d).is_some_and(|(c, _)| c == "server_not_running") {
            return Reply::NoServer;
        }
    }
    if let Some(d) = &out_doc {
        if let Some((code, message)) = error_code(d) {
            return Reply::Error { code, message };
        }
        if code == Some(0) && d.is_object() {
            return Reply::Ok(d.get("result").cloned().unwrap_or_else(|| d.clone()));
        }
    }
    let first = |s: &str| s.lines().find(|l| !l.trim().is_empty()).unwrap_or("").trim().to_string();
    let detail = if !first(stderr).is_empty() { first(stderr) } else { first(stdout) };
    let exit = code.map(|c| format!("exit {c}")).unwrap_or_else(|| "killed by a signal".into());
    if code == Some(0) {
        Reply::Bad(format!("herdr printed no success document ({exit}): {}", one_line(&detail)))
    } else {
        Reply::Bad(format!("herdr failed ({exit}): {}", one_line(&detail)))
    }
}

/// First string among `keys` in `v`; a nested object contributes its `id`-like field.
fn field(v: &Value, keys: &[&str]) -> Option<String> {
    for k in keys {
        match v.get(*k) {
            Some(Value::String(s)) => return Some(s.clone()),
            Some(Value::Number(n)) => return Some(n.to_string()),
            Some(o @ Value::Object(_)) => {
                if let Some(s) = field(o, &["pane_id", "workspace_id", "id", "name"]) {
                    return Some(s);
                }
            }
            _ => {}
        }
    }
    None
}

/// The array under one of `keys`, or `v` itself when it is an array.
fn array<'a>(v: &'a Value, keys: &[&str]) -> Option<&'a Vec<Value>> {
    if let Value::Array(a) = v {
        return Some(a);
    }
    keys.iter().find_map(|k| v.get(*k).and_then(Value::as_array))
}

/// Agents of an `agent list` result.
pub fn parse_agents(result: &Value) -> Result<Vec<Agent>, String> {
    let list = array(result, &["agents", "items"]).ok_or("agent list: no agents array in the success document")?;
    let mut out = Vec::new();
    for a in list {
        let name = field(a, &["name", "agent_name", "agent_id", "id"]).ok_or("agent list: an agent without a name")?;
        out.push(Agent {
            name,
            pane: field(a, &["pane_id", "pane"]).unwrap_or_default(),
            kind: field(a, &["kind", "agent_kind", "agent", "type"]).unwrap_or_default(),
            status: field(a, &["status", "agent_status", "state"]).unwrap_or_else(|| "unknown".into()),
        });
    }
    Ok(out)
}

fn pos_of(p: &Value) -> Option<(i64, i64)> {
    let num = |v: &Value, k: &str| v.get(k).and_then(Value::as_i64);
    let src = p.get("position").or_else(|| p.get("geometry")).unwrap_or(p);
    match (num(src, "x").or_else(|| num(src, "col")), num(src, "y").or_else(|| num(src, "row"))) {
        (Some(x), Some(y)) => Some((x, y)),
        _ => None,
    }
}

fn has_agent(p: &Value) -> bool {
    match p.get("agent").or_else(|| p.get("agent_name")) {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Bool(b)) => *b,
        Some(_) => true,
    }
}

fn foreground_name(v: &Value) -> Option<String> {
    for k in ["foreground", "foreground_process", "process", "current_command"] {
        match v.get(k) {
            Some(Value::String(s)) => return Some(s.clone()),
            Some(o @ Value::Object(_)) => {
                if let Some(s) = field(o, &["name", "comm", "command", "exe"]) {
                    return Some(s);
                }
            }
            _ => {}
        }
    }
    field(v, &["name", "comm", "command"])
}

/// The herdr backend on one server (herdr session).
pub struct Herdr {
    ctx: Ctx,
    server: String,
    knobs: Knobs,
}

impl Herdr {
    pub fn new(ctx: &Ctx, server: Option<&str>, knobs: Knobs) -> Herdr {
        let server = server
            .map(str::to_string)
            .or_else(|| ctx.var_nonempty("MAM_HERDR_SESSION"))
            .unwrap_or_else(|| DEFAULT_SESSION.to_string());
        Herdr { ctx: ctx.clone(), server, knobs }
    }

    fn command(&self) -> Command {
        let mut c = Command::new("herdr");
        c.env_clear().envs(self.ctx.child_env());
        c.env_remove("HERDR_SOCKET_PATH");
        c.env("HERDR_SESSION", &self.server);
        c.current_dir(self.ctx.cwd());
        c
    }

    fn run(&self, args: &[&str], limit: Duration) -> Reply {
        let mut c = self.command();
        c.args(args);
        match run_capture(&mut c, limit, &format!("herdr {}", args.first().copied().unwrap_or(""))) {
            Ok(Output { status, stdout, stderr }) => {
                classify(status.code(), &String::from_utf8_lossy(&stdout), &String::from_utf8_lossy(&stderr))
            }
            Err(e) => Reply::Bad(e.to_string()),
        }
    }

    fn query(&self, args: &[&str]) -> Reply {
        self.run(args, Duration::from_secs(30))
    }

    /// A mutating call: a `server_not_running` bootstraps (unless MAM_NO_AUTOSTART=1) and retries once.
    fn mutate(&self, args: &[&str], limit: Duration) -> PaneResult<Value> {
        let mut reply = self.run(args, limit);
        if reply == Reply::NoServer {
            self.bootstrap()?;
            reply = self.run(args, limit);
        }
        self.expect_ok(args, reply)
    }

    fn expect_ok(&self, args: &[&str], reply: Reply) -> PaneResult<Value> {
        let what = args.iter().take(2).copied().collect::<Vec<_>>().join(" ");
        match reply {
            Reply::Ok(v) => Ok(v),
            Reply::NoServer => Err(PaneError::Failed(format!("server {} not running (herdr {what})", self.server))),
            Reply::Error { code, message } => Err(PaneError::Failed(format!(
                "herdr {what} on server {}: {code}{}",
                self.server,
                if message.is_empty() { String::new() } else { format!(": {}", one_line(&message)) }
            ))),
            Reply::Bad(d) => Err(PaneError::Failed(format!("herdr {what} on server {}: {d}", self.server))),
        }
    }

    /// 1.3: spawn `herdr --session <name> server` detached with the denylisted markers removed, stdio
    /// to the bootstrap log, then poll `agent list` for up to the boot wait.
    fn bootstrap(&self) -> PaneResult<()> {
        if no_autostart(&self.ctx) {
            return Err(PaneError::NoServer(format!("server {} not running (MAM_NO_AUTOSTART=1)", self.server)));
        }
        let logs = crate::paths::control_root(&self.ctx).join(".mam").join("logs");
        let log_path = logs.join(format!("herdr-server-{}.log", self.server));
        sys::create_dir_all(&logs)
            .map_err(|e| PaneError::Failed(format!("cannot create {}: {e}", show_path(&logs))))?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| PaneError::Failed(format!("cannot open {}: {e}", show_path(&log_path))))?;
        let log2 = log.try_clone().map_err(|e| PaneError::Failed(format!("{}: {e}", show_path(&log_path))))?;
        let mut c = Command::new("herdr");
        c.env_clear().envs(server_env(&self.ctx));
        c.args(["--session", &self.server, "server"]);
        c.current_dir(self.ctx.cwd()).stdin(Stdio::null()).stdout(log).stderr(log2);
        sys::set_new_session(&mut c);
        let mut child = sys::spawn(&mut c)
            .map_err(|e| PaneError::Failed(format!("cannot start herdr server {}: {e}", self.server)))?;
        let deadline = Instant::now() + Duration::from_millis(self.knobs.boot_wait_ms);
        loop {
            // A server that forks and exits (or a double) must not stay a zombie of ours.
            let _ = child.try_wait();
            if let ListOutcome::Confirmed(_) = self.list_agents() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(PaneError::Failed(format!(
                    "herdr server {} did not answer within {} s of bootstrap (log {})",
                    self.server,
                    self.knobs.boot_wait_ms / 1000,
                    show_path(&log_path)
                )));
            }
            sys::sleep(Duration::from_millis(100));
        }
    }

    fn agent_pane(&self, target: &str) -> Option<String> {
        match self.query(&["agent", "get", target]) {
            Reply::Ok(v) => field(v.get("agent").unwrap_or(&v), &["pane_id", "pane"]),
            _ => None,
        }
    }
}

fn env_args(env: &[(String, String)]) -> Vec<String> {
    env.iter().flat_map(|(k, v)| ["--env".to_string(), format!("{k}={v}")]).collect()
}

impl Backend for Herdr {
    fn name(&self) -> &'static str {
        "herdr"
    }

    fn server(&self) -> String {
        self.server.clone()
    }

    fn ensure_server(&self) -> PaneResult<()> {
        match self.list_agents() {
            ListOutcome::Confirmed(_) => Ok(()),
            ListOutcome::NoServer => self.bootstrap(),
            ListOutcome::Unknown(d) => Err(PaneError::Failed(format!("server {}: state unknown: {d}", self.server))),
        }
    }

    fn list_agents(&self) -> ListOutcome {
        match self.query(&["agent", "list"]) {
            Reply::Ok(v) => match parse_agents(&v) {
                Ok(a) => ListOutcome::Confirmed(a),
                Err(e) => ListOutcome::Unknown(e),
            },
            Reply::NoServer => ListOutcome::NoServer,
            Reply::Error { code, message } => {
                ListOutcome::Unknown(one_line(format!("error document {code}: {message}").trim_end_matches(": ")))
            }
            Reply::Bad(d) => ListOutcome::Unknown(d),
        }
    }

    fn list_workspaces(&self, cwd: &Path) -> PaneResult<Vec<Workspace>> {
        let want = canon(cwd);
        let v = self.expect_ok(&["workspace", "list"], self.query(&["workspace", "list"]))?;
        let list = array(&v, &["workspaces", "items"])
            .ok_or_else(|| PaneError::Failed("herdr workspace list: no workspaces array".into()))?;
        let mut out = Vec::new();
        for w in list {
            let Some(id) = field(w, &["workspace_id", "id"]) else { continue };
            let ws_cwd = field(w, &["cwd", "path", "dir", "directory"]);
            if ws_cwd.as_ref().is_some_and(|c| canon(Path::new(c)) != want) {
                continue;
            }
            let args = ["pane", "list", "--workspace", id.as_str()];
            let pv = self.expect_ok(&args, self.query(&args))?;
            let panes = array(&pv, &["panes", "items"])
                .ok_or_else(|| PaneError::Failed(format!("herdr pane list --workspace {id}: no panes array")))?;
            // A workspace listed without its cwd is judged by its root pane's cwd.
            if ws_cwd.is_none() {
                let root = panes.first().and_then(|p| field(p, &["cwd", "path"]));
                if root.is_none_or(|c| canon(Path::new(&c)) != want) {
                    continue;
                }
            }
            let mut infos = Vec::new();
            for p in panes {
                let Some(pid) = field(p, &["pane_id", "id"]) else { continue };
                let agent = has_agent(p);
                let shell_foreground = !agent && {
                    let args = ["pane", "process-info", "--pane", pid.as_str()];
                    match self.query(&args) {
                        Reply::Ok(fv) => foreground_name(&fv).is_some_and(|n| is_shell(&n)),
                        _ => false,
                    }
                };
                infos.push(PaneInfo { id: pid, has_agent: agent, shell_foreground, pos: pos_of(p) });
            }
            out.push(Workspace { id, label: field(w, &["label", "name"]).unwrap_or_default(), panes: infos });
        }
        Ok(out)
    }

    fn create_workspace(&self, cwd: &Path, label: Option<&str>, env: &[(String, String)]) -> PaneResult<Created> {
        let dir = cwd.to_string_lossy().into_owned();
        let mut args: Vec<String> = vec!["workspace".into(), "create".into(), "--cwd".into(), dir];
        if let Some(l) = label {
            args.extend(["--label".into(), l.to_string()]);
        }
        args.push("--no-focus".into());
        args.extend(env_args(env));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let v = self.mutate(&refs, Duration::from_secs(30))?;
        let pane = v
            .get("root_pane")
            .and_then(|r| field(r, &["pane_id", "id"]))
            .ok_or_else(|| PaneError::Failed("herdr workspace create: no result.root_pane.pane_id".into()))?;
        let workspace = v
            .get("workspace")
            .and_then(|w| field(w, &["workspace_id", "id"]))
            .or_else(|| field(&v, &["workspace_id"]))
            .unwrap_or_default();
        Ok(Created { workspace, pane })
    }

    fn split(&self, pane: &str, dir: Dir, cwd: &Path, env: &[(String, String)]) -> PaneResult<String> {
        let d = cwd.to_string_lossy().into_owned();
        let mut args: Vec<String> = ["pane", "split", pane, "--direction", dir.word(), "--cwd", &d, "--no-focus"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(env_args(env));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let v = self.mutate(&refs, Duration::from_secs(30))?;
        v.get("pane")
            .and_then(|p| field(p, &["pane_id", "id"]))
            .ok_or_else(|| PaneError::Failed(format!("herdr pane split {pane}: no result.pane.pane_id")))
    }

    fn rename_workspace(&self, id: &str, label: &str) -> PaneResult<()> {
        self.mutate(&["workspace", "rename", id, label], Duration::from_secs(30)).map(|_| ())
    }

    fn start_agent(&self, name: &str, kind: &str, pane: &str, args: &[String]) -> PaneResult<()> {
        // herdr accepts 3001..300000 ms.
        let ms = self.knobs.start_timeout_ms.clamp(3001, 300_000).to_string();
        let mut argv: Vec<&str> = vec!["agent", "start", name, "--kind", kind, "--pane", pane, "--timeout", &ms];
        if !args.is_empty() {
            argv.push("--");
            argv.extend(args.iter().map(String::as_str));
        }
        let limit = Duration::from_millis(self.knobs.start_timeout_ms.clamp(3001, 300_000) as u64 + 10_000);
        self.mutate(&argv, limit).map(|_| ())
    }

    fn prompt(&self, target: &str, text: &str, wait_ms: u32) -> PromptOutcome {
        let ms = wait_ms.to_string();
        let args = ["agent", "prompt", target, text, "--wait", "--timeout", &ms];
        match self.run(&args, Duration::from_millis(wait_ms as u64 + 10_000)) {
            Reply::Ok(_) => PromptOutcome::Settled,
            Reply::Error { code, .. } if code == "timeout" => PromptOutcome::Accepted(Accepted::Timeout),
            Reply::Error { code, .. } if code == "agent_prompt_stalled" => PromptOutcome::Accepted(Accepted::Stalled),
            Reply::Error { code, message } => {
                PromptOutcome::TransportError(one_line(&format!("herdr agent prompt {target}: {code} {message}")))
            }
            Reply::NoServer => PromptOutcome::TransportError(format!("server {} not running", self.server)),
            Reply::Bad(d) => PromptOutcome::TransportError(format!("herdr agent prompt {target}: {d}")),
        }
    }

    fn agent_status(&self, target: &str) -> Status {
        match self.query(&["agent", "get", target]) {
            Reply::Ok(v) => {
                let a = v.get("agent").unwrap_or(&v);
                field(a, &["status", "agent_status", "state"]).map(|s| Status::parse(&s)).unwrap_or(Status::Unknown)
            }
            Reply::NoServer => Status::Absent,
            Reply::Error { code, .. } if code.contains("not_found") || code == "agent_not_running" => Status::Absent,
            _ => Status::Unknown,
        }
    }

    fn read_detection(&self, target: &str) -> PaneResult<String> {
        let args = ["agent", "read", target, "--source", "visible"];
        let v = self.expect_ok(&args, self.query(&args))?;
        Ok(match &v {
            Value::String(s) => s.clone(),
            _ => field(&v, &["text", "content", "output"])
                .or_else(|| {
                    array(&v, &["lines"]).map(|l| l.iter().filter_map(Value::as_str).collect::<Vec<_>>().join("\n"))
                })
                .unwrap_or_else(|| v.to_string()),
        })
    }

    fn send_keys(&self, target: &str, keys: &str) -> PaneResult<()> {
        let pane = self.agent_pane(target).unwrap_or_else(|| target.to_string());
        self.mutate(&["pane", "send-keys", &pane, keys], Duration::from_secs(30)).map(|_| ())
    }

    fn close_pane(&self, pane: &str) -> PaneResult<()> {
        let args = ["pane", "close", pane];
        self.expect_ok(&args, self.query(&args)).map(|_| ())
    }

    fn close_workspace(&self, id: &str) -> PaneResult<()> {
        let args = ["workspace", "close", id];
        self.expect_ok(&args, self.query(&args)).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_the_three_list_outcomes() {
        let ok =
            r#"{"id":"1","result":{"agents":[{"name":"a","pane_id":"p1","kind":"claude","status":"idle","x":1}]}}"#;
        let Reply::Ok(v) = classify(Some(0), ok, "") else { panic!() };
        assert_eq!(parse_agents(&v).unwrap()[0].pane, "p1");
        let nsr = r#"{"error":{"code":"server_not_running","message":"no server"}}"#;
        assert_eq!(classify(Some(1), nsr, ""), Reply::NoServer);
        assert_eq!(classify(Some(1), "", nsr), Reply::NoServer);
        assert_eq!(classify(Some(0), "", &format!("warn\n{nsr}")), Reply::NoServer);
        let other = r#"{"error":{"code":"internal","message":"boom"}}"#;
        for rc in [0, 1] {
            assert!(matches!(classify(Some(rc), other, ""), Reply::Error { .. }));
        }
        assert!(matches!(classify(Some(0), "garbage", ""), Reply::Bad(_)));
        assert!(matches!(classify(Some(2), "", "oops"), Reply::Bad(_)));
        // A success document without an agents array is not an empty list.
        let Reply::Ok(v) = classify(Some(0), r#"{"result":{}}"#, "") else { panic!() };
        assert!(parse_agents(&v).is_err());
    }
}
