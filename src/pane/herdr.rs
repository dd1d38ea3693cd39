//! The herdr backend (ORCH 1.3, 1.4): maps the contract onto the CLI of herdr 0.8 as the real binary
//! behaves (`docs/DESIGN.md`, "herdr 0.8 as it is"): success documents on stdout, error documents on
//! stderr with stdout empty, commands that succeed silently (`pane send-keys`), plain-text reads,
//! geometry only from `pane layout`. JSON is parsed leniently (unknown fields ignored,
//! `serde_json::Value` only), and a server is bootstrapped only when a mutating call meets a
//! structured `server_not_running`.
//!
//! Every call runs with `HERDR_SESSION=<server>` and without `HERDR_SOCKET_PATH`, so a caller inside a
//! pane of one server can address an agent on another. Error documents are never read as lists. The
//! first call of a process checks `herdr --version`; a herdr other than 0.8 is refused, by name.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::contract::{
    canon, is_shell, Accepted, Agent, Backend, Created, Dir, InputLine, ListOutcome, PaneError, PaneInfo, PaneResult,
    PromptOutcome, StateReport, Status, Workspace,
};
use super::knobs::Knobs;
use super::proc::{no_autostart, on_path, run_capture, server_env};
use super::sock;
use crate::agents;
use crate::ctx::{ChildRole, Ctx};
use crate::sys;
use crate::text::{display_value, one_line, show_path};

/// How long `agent start` is retried while herdr says the new pane has no shell yet.
const PANE_SHELL_WAIT: Duration = Duration::from_secs(10);
/// Default server for new sessions (1.1).
pub const DEFAULT_SESSION: &str = "multi-agent-mux";

/// The herdr versions this backend speaks: the major.minor of herdr 0.8.
pub const SUPPORTED: &str = "0.8";

/// The `--source` of mam's agent-state reports (issue 21).
pub const REPORT_SOURCE: &str = "mam";
/// The deadline of one report call: a status display must never hold its reporter up.
const REPORT_LIMIT: Duration = Duration::from_secs(5);

/// What one herdr call answered.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// Exit 0 with a success document (its `result`, or the document itself when it has none), or
    /// exit 0 with nothing on either stream (`Value::Null`: `pane send-keys` and friends).
    Ok(Value),
    /// A structured `server_not_running` on stdout or stderr, whatever the exit code.
    NoServer,
    /// An error document on stderr or stdout (any exit code): its code and message.
    Error { code: String, message: String },
    /// Our own deadline ended the call: whatever it was doing may have happened.
    TimedOut(String),
    /// Anything else: nonzero exit without a document (a usage error), non-JSON, a parse failure.
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
    // herdr 0.8 writes its error documents to stderr; an older build wrote them to stdout.
    for d in [&out_doc, &err_doc].into_iter().flatten() {
        if let Some((code, message)) = error_code(d) {
            return Reply::Error { code, message };
        }
    }
    if let Some(d) = &out_doc {
        if code == Some(0) && d.is_object() {
            return Reply::Ok(d.get("result").cloned().unwrap_or_else(|| d.clone()));
        }
    }
    if code == Some(0) && stdout.trim().is_empty() && stderr.trim().is_empty() {
        return Reply::Ok(Value::Null);
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

/// `herdr 0.8.0` -> `Ok("0.8.0")` when the major.minor is `SUPPORTED`, else why not (naming both).
pub fn check_version(output: &str) -> Result<String, String> {
    let word = output.split_whitespace().find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()));
    let Some(v) = word else {
        return Err(format!(
            "cannot tell the herdr version from `herdr --version` ({}); mam supports herdr {SUPPORTED}.x",
            one_line(output.trim())
        ));
    };
    let mm: Vec<&str> = v.split('.').take(2).collect();
    if mm.join(".") == SUPPORTED {
        Ok(v.to_string())
    } else {
        Err(format!("herdr {} is not supported: mam supports herdr {SUPPORTED}.x", one_line(v)))
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

/// The pids a `pane process-info` result names: the shell's and every foreground process's.
fn process_info_pids(v: &Value) -> Vec<i32> {
    let info = v.get("process_info").unwrap_or(v);
    let mut out: Vec<i32> = info.get("shell_pid").and_then(Value::as_i64).map(|p| p as i32).into_iter().collect();
    if let Some(list) = info.get("foreground_processes").and_then(Value::as_array) {
        out.extend(list.iter().filter_map(|p| p.get("pid").and_then(Value::as_i64)).map(|p| p as i32));
    }
    out.retain(|p| *p > 1);
    crate::sort::natural(&mut out);
    out.dedup();
    out
}

/// herdr's screen classification of an agent (`agent explain --json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Explained {
    state: Status,
    /// The matched rule read the whole recent buffer (`matched_rule.region`: `whole_recent`), not
    /// the visible bottom: its `working` can be the remains of a start-up box (see `stale_working`).
    whole_recent: bool,
}

/// An `agent explain --json` document: its `state` and the matched rule's region. `None` when it is
/// not one, or when screen detection was skipped (a lifecycle integration is the authority).
fn parse_explain(text: &str) -> Option<Explained> {
    let v: Value = serde_json::from_str(text.trim()).ok()?;
    if v.get("screen_detection_skipped").and_then(Value::as_bool) == Some(true) {
        return None;
    }
    let state = Status::parse(v.get("state")?.as_str()?);
    let region = v.get("matched_rule").and_then(|r| r.get("region")).and_then(Value::as_str);
    Some(Explained { state, whole_recent: region == Some("whole_recent") })
}

/// True when a `pane process-info` result says the pane's shell owns the foreground (1.5 step 3):
/// the foreground process group is the shell's and every foreground process is a shell. The group
/// alone is not enough: a shell that `exec`ed a program keeps its pid as the group.
pub fn shell_owns_foreground(result: &Value) -> bool {
    let info = result.get("process_info").unwrap_or(result);
    let num = |k: &str| info.get(k).and_then(Value::as_i64);
    if let (Some(pgid), Some(shell)) = (num("foreground_process_group_id"), num("shell_pid")) {
        if pgid != shell {
            return false;
        }
    }
    let Some(procs) = info.get("foreground_processes").and_then(Value::as_array) else { return false };
    !procs.is_empty()
        && procs.iter().all(|p| field(p, &["name"]).or_else(|| field(p, &["cmdline"])).is_some_and(|n| is_shell(&n)))
}

/// `pane_id -> (x, y)` of a `pane layout` result (`layout.panes[].rect`).
pub fn layout_positions(result: &Value) -> Vec<(String, (i64, i64))> {
    let layout = result.get("layout").unwrap_or(result);
    let Some(panes) = layout.get("panes").and_then(Value::as_array) else { return Vec::new() };
    panes
        .iter()
        .filter_map(|p| {
            let id = field(p, &["pane_id", "id"])?;
            let rect = p.get("rect")?;
            Some((id, (rect.get("x")?.as_i64()?, rect.get("y")?.as_i64()?)))
        })
        .collect()
}

/// The longest message and state label a report shows in herdr's sidebar (characters).
const REPORT_TEXT_MAX: usize = 200;
/// The longest pane title (herdr's cap).
const REPORT_TITLE_MAX: usize = 80;

/// The argv of one state report: `pane report-agent ...` and `pane report-metadata ...`. The message
/// and title carry what agents wrote (a job's reason, its events), so they go through
/// `text::display_value` (issue 29): no terminal escapes or newlines in herdr's sidebar, bounded,
/// never read as a flag.
pub fn report_args(pane: &str, kind: &str, r: &StateReport) -> (Vec<String>, Vec<String>) {
    let message = display_value(&r.message, REPORT_TEXT_MAX);
    let seq = r.seq.to_string();
    let word = r.state.word();
    let agent = ["pane", "report-agent", pane, "--source", REPORT_SOURCE, "--agent", kind, "--state", word];
    let mut agent: Vec<String> = agent.iter().map(|s| s.to_string()).collect();
    agent.extend(["--message".into(), message.clone(), "--seq".into(), seq.clone()]);
    let label = display_value(&format!("{word}={message}"), REPORT_TEXT_MAX);
    let title = display_value(&r.title, REPORT_TITLE_MAX);
    let mut meta: Vec<String> = ["pane", "report-metadata", pane, "--source", REPORT_SOURCE, "--state-label"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    meta.extend([label, "--title".into(), title, "--seq".into(), seq]);
    if let Some(t) = r.ttl_ms {
        meta.extend(["--ttl-ms".into(), t.clamp(1, 86_400_000).to_string()]);
    }
    (agent, meta)
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
        c.env_clear().envs(self.ctx.child_env_for(ChildRole::Agent));
        c.env_remove("HERDR_SOCKET_PATH");
        c.env("HERDR_SESSION", &self.server);
        c.current_dir(self.ctx.cwd());
        c
    }

    /// The server name is a plain name and its socket is the user's own (issue 29): checked before
    /// every call, since any call may start or reach a server.
    fn safe(&self) -> Result<(), String> {
        if let Some(why) = sock::bad_name(&self.server) {
            return Err(format!("herdr server name '{}' {why}", one_line(&self.server)));
        }
        match sock::herdr_socket(&self.ctx, &self.server) {
            Some(path) => sock::check(&path, sys::geteuid()).map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }

    /// One call, raw: the exit code and both streams, or the reply that ended it early (an unsupported
    /// version, a spawn failure, our deadline).
    fn call(&self, args: &[&str], limit: Duration) -> Result<Output, Reply> {
        if let Err(why) = self.version().and_then(|()| self.safe()) {
            return Err(Reply::Bad(why));
        }
        let mut c = self.command();
        c.args(args);
        let what = format!("herdr {}", args.iter().take(2).copied().collect::<Vec<_>>().join(" "));
        let started = Instant::now();
        run_capture(&mut c, limit, &what).map_err(|e| {
            if started.elapsed() >= limit {
                Reply::TimedOut(e.to_string())
            } else {
                Reply::Bad(e.to_string())
            }
        })
    }

    fn run(&self, args: &[&str], limit: Duration) -> Reply {
        match self.call(args, limit) {
            Ok(Output { status, stdout, stderr }) => {
                classify(status.code(), &String::from_utf8_lossy(&stdout), &String::from_utf8_lossy(&stderr))
            }
            Err(r) => r,
        }
    }

    /// A read (`agent read`, `pane read`): herdr prints the terminal text itself, not a document.
    fn read_text(&self, args: &[&str]) -> PaneResult<String> {
        match self.call(args, Duration::from_secs(30)) {
            Ok(Output { status, stdout, .. }) if status.success() => Ok(String::from_utf8_lossy(&stdout).into_owned()),
            Ok(Output { status, stdout, stderr }) => {
                let r = classify(status.code(), &String::from_utf8_lossy(&stdout), &String::from_utf8_lossy(&stderr));
                self.expect_ok(args, r).map(|_| String::new())
            }
            Err(r) => self.expect_ok(args, r).map(|_| String::new()),
        }
    }

    /// `herdr --version`, once per process and herdr executable: the supported version or why not.
    fn version(&self) -> Result<(), String> {
        static CHECKED: std::sync::Mutex<Vec<(String, Result<(), String>)>> = std::sync::Mutex::new(Vec::new());
        let exe = on_path(&self.ctx, "herdr").map_or_else(|| "herdr".to_string(), |p| p.to_string_lossy().into_owned());
        let mut seen = CHECKED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, r)) = seen.iter().find(|(e, _)| *e == exe) {
            return r.clone();
        }
        let mut c = self.command();
        c.arg("--version");
        let r = match run_capture(&mut c, Duration::from_secs(10), "herdr --version") {
            Ok(out) if out.status.success() => check_version(&String::from_utf8_lossy(&out.stdout)).map(|_| ()),
            Ok(out) => Err(format!(
                "`herdr --version` failed ({}); mam supports herdr {SUPPORTED}.x",
                one_line(String::from_utf8_lossy(&out.stderr).trim())
            )),
            Err(e) => Err(e.to_string()),
        };
        seen.push((exe, r.clone()));
        r
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
            Reply::Bad(d) | Reply::TimedOut(d) => {
                Err(PaneError::Failed(format!("herdr {what} on server {}: {d}", self.server)))
            }
        }
    }

    /// True when herdr's `working` for agent `target` of `kind` is a stale match: its rule read the
    /// whole recent buffer (`agent explain`: `region=whole_recent`), while the visible screen shows the
    /// kind's input line and none of its working marks. Seen with gemini: its API-key box ("Esc to
    /// cancel") stays in herdr's recent buffer after start-up and keeps the bundled esc_cancel_working
    /// rule on for a gemini idle at its input line, so no job could be delivered to it. A working
    /// status from anything else (a title, the visible bottom) stands.
    fn stale_working(&self, target: &str, kind: &str) -> bool {
        let Some(ad) = agents::adapter_of_started(kind).filter(|a| a.has_ready_line() && !a.working_marks.is_empty())
        else {
            return false;
        };
        self.read_detection(target).is_ok_and(|s| ad.state_on(&s) == Some("idle"))
    }

    /// What herdr's screen detection classifies for `target` now (`agent explain --json`), whatever
    /// a reporter said: `None` when herdr cannot explain it (an older server, a mock without
    /// `explain`) or when a full lifecycle integration made the screen non-authoritative.
    fn screen_state(&self, target: &str) -> Option<Explained> {
        let out = self.call(&["agent", "explain", target, "--json"], Duration::from_secs(30)).ok()?;
        if !out.status.success() {
            return None;
        }
        parse_explain(&String::from_utf8_lossy(&out.stdout))
    }

    /// `agent start` while watching the pane: herdr waits its whole `--timeout` for an agent that
    /// exited at once (gemini `--resume` of a conversation it cannot resume prints its error and exits
    /// within seconds; herdr then says `timeout` after 30 s). Once the pane ran something other than
    /// its shell and then shows the shell alone on two looks 400 ms apart, the call is ended and the
    /// start fails as `Exited` with the pane's last lines.
    fn start_watching(&self, args: &[&str], limit: Duration, pane: &str) -> PaneResult<Value> {
        use std::os::unix::process::CommandExt;
        if let Err(why) = self.version().and_then(|()| self.safe()) {
            return Err(PaneError::Failed(format!("herdr agent start on server {}: {why}", self.server)));
        }
        let mut c = self.command();
        c.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
        let mut child = sys::spawn(&mut c)
            .map_err(|e| PaneError::Failed(format!("cannot run herdr agent start on server {}: {e}", self.server)))?;
        let end = |child: &mut std::process::Child| {
            let _ = sys::kill(-(child.id() as i32), libc::SIGTERM);
            let _ = child.wait();
        };
        let deadline = Instant::now() + limit;
        let (mut ran, mut back_since, mut looked) = (false, None::<Instant>, Instant::now());
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) => {}
                Err(e) => {
                    end(&mut child);
                    return Err(PaneError::Failed(format!("herdr agent start on server {}: {e}", self.server)));
                }
            }
            if Instant::now() >= deadline {
                end(&mut child);
                return Err(PaneError::Failed(format!(
                    "herdr agent start on server {}: no answer within {} ms",
                    self.server,
                    limit.as_millis()
                )));
            }
            if looked.elapsed() >= Duration::from_millis(400) {
                looked = Instant::now();
                if let Reply::Ok(v) = self.query(&["pane", "process-info", "--pane", pane]) {
                    if !shell_owns_foreground(&v) {
                        (ran, back_since) = (true, None);
                    } else if ran {
                        match back_since {
                            Some(at) if at.elapsed() >= Duration::from_millis(400) => {
                                end(&mut child);
                                let screen = self.read_text(&[
                                    "pane",
                                    "read",
                                    pane,
                                    "--source",
                                    "recent-unwrapped",
                                    "--lines",
                                    "20",
                                ]);
                                return Err(PaneError::Exited(format!(
                                    "agent {} exited during start in pane {pane}; last screen lines: {}",
                                    args.get(2).copied().unwrap_or("?"),
                                    crate::text::screen_tail(&screen.unwrap_or_default(), 5)
                                )));
                            }
                            Some(_) => {}
                            None => back_since = Some(Instant::now()),
                        }
                    }
                }
            }
            sys::sleep(Duration::from_millis(50));
        }
        let out = child.wait_with_output().map_err(|e| PaneError::Failed(format!("herdr agent start: {e}")))?;
        let reply =
            classify(out.status.code(), &String::from_utf8_lossy(&out.stdout), &String::from_utf8_lossy(&out.stderr));
        if reply == Reply::NoServer {
            return self.mutate(args, limit);
        }
        self.expect_ok(args, reply)
    }

    /// 1.3: spawn `herdr --session <name> server` detached with the denylisted markers removed, stdio
    /// to the bootstrap log, then poll `agent list` for up to the boot wait.
    fn bootstrap(&self) -> PaneResult<()> {
        if no_autostart(&self.ctx) {
            return Err(PaneError::NoServer(format!("server {} not running (MAM_NO_AUTOSTART=1)", self.server)));
        }
        // The name is part of the log's path, and the server's socket goes where it says.
        self.safe().map_err(PaneError::Failed)?;
        let logs = crate::paths::control_root(&self.ctx)
            .map_err(|e| PaneError::Failed(e.to_string()))?
            .join(".mam")
            .join("logs");
        let log_path = logs.join(format!("herdr-server-{}.log", self.server));
        sys::create_dir_all(&logs)
            .map_err(|e| PaneError::Failed(format!("cannot create {}: {e}", show_path(&logs))))?;
        let log = sys::open_append(&log_path)
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
                // Issue 32 item 7: mam started this server, so mam stops it with its last agent.
                let marker = started_marker(&logs, &self.server);
                if let Err(e) = sys::atomic_write(&marker, format!("{}\n", child.id()).as_bytes()) {
                    return Err(PaneError::Failed(format!("cannot write {}: {e}", show_path(&marker))));
                }
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

/// `<control root>/.mam/logs/herdr-server-<server>.started`: written when mam bootstrapped the
/// server, removed when mam stopped it; without it mam never stops a server.
fn started_marker(logs: &Path, server: &str) -> std::path::PathBuf {
    logs.join(format!("herdr-server-{server}.started"))
}

/// The herdr servers (by session name) mam started for this control root and has not stopped:
/// those with a `started_marker` (issue 32: `mam monitor stop` looks at each). Sorted; empty when
/// there is no control root or no logs directory.
pub fn servers_mam_started(ctx: &Ctx) -> Vec<String> {
    let Ok(root) = crate::paths::control_root(ctx) else { return Vec::new() };
    let Ok(dir) = std::fs::read_dir(root.join(".mam").join("logs")) else { return Vec::new() };
    let mut names: Vec<String> = dir
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            Some(name.strip_prefix("herdr-server-")?.strip_suffix(".started")?.to_string())
        })
        .filter(|n| !n.is_empty())
        .collect();
    crate::sort::natural(&mut names);
    names
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

    fn stop_server_if_ours(&self) -> PaneResult<bool> {
        let Ok(root) = crate::paths::control_root(&self.ctx) else { return Ok(false) };
        let marker = started_marker(&root.join(".mam").join("logs"), &self.server);
        if !marker.exists() {
            return Ok(false);
        }
        match self.list_agents() {
            ListOutcome::Confirmed(list) if list.is_empty() => {}
            ListOutcome::NoServer => {
                let _ = std::fs::remove_file(&marker);
                return Ok(false);
            }
            _ => return Ok(false),
        }
        match self.query(&["server", "stop"]) {
            Reply::Ok(_) | Reply::NoServer => {
                let _ = std::fs::remove_file(&marker);
                Ok(true)
            }
            Reply::Error { code, message } => {
                Err(PaneError::Failed(one_line(&format!("herdr server stop: {code} {message}"))))
            }
            Reply::Bad(d) | Reply::TimedOut(d) => Err(PaneError::Failed(format!("herdr server stop: {d}"))),
        }
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
                Ok(mut list) => {
                    for a in list.iter_mut() {
                        // Issue 30: herdr lists mam's own report once the daemon's board reported
                        // the pane's job; the agent's state is what herdr's screen detection says.
                        if let Some(own) = self.screen_state(&a.name) {
                            a.status = own.state.word().to_string();
                        }
                        if a.status == "working" && self.stale_working(&a.name, &a.kind) {
                            a.status = "idle".into();
                        }
                    }
                    ListOutcome::Confirmed(list)
                }
                Err(e) => ListOutcome::Unknown(e),
            },
            Reply::NoServer => ListOutcome::NoServer,
            Reply::Error { code, message } => {
                ListOutcome::Unknown(one_line(format!("error document {code}: {message}").trim_end_matches(": ")))
            }
            Reply::Bad(d) | Reply::TimedOut(d) => ListOutcome::Unknown(d),
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
            // `pane list` is in screen order without positions; the geometry is `pane layout`'s.
            let positions = match panes.first().and_then(|p| field(p, &["pane_id", "id"])) {
                Some(first) => match self.query(&["pane", "layout", "--pane", first.as_str()]) {
                    Reply::Ok(lv) => layout_positions(&lv),
                    _ => Vec::new(),
                },
                None => Vec::new(),
            };
            let mut infos = Vec::new();
            for p in panes {
                let Some(pid) = field(p, &["pane_id", "id"]) else { continue };
                let agent = has_agent(p);
                let shell_foreground = !agent && {
                    let args = ["pane", "process-info", "--pane", pid.as_str()];
                    match self.query(&args) {
                        Reply::Ok(fv) => shell_owns_foreground(&fv),
                        _ => false,
                    }
                };
                let pos = positions.iter().find(|(id, _)| *id == pid).map(|(_, xy)| *xy).or_else(|| pos_of(p));
                infos.push(PaneInfo { id: pid, has_agent: agent, shell_foreground, pos });
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
        // A pane created a moment ago may not run its shell yet (a loaded machine starts bash slowly),
        // and herdr then refuses with `agent_pane_busy` ("not an available shell") having started
        // nothing: asked again for up to PANE_SHELL_WAIT, every 250 ms.
        let since = std::time::Instant::now();
        loop {
            match self.start_watching(&argv, limit, pane) {
                Err(PaneError::Failed(m)) if m.contains("agent_pane_busy") && since.elapsed() < PANE_SHELL_WAIT => {
                    crate::sys::sleep(Duration::from_millis(250));
                }
                r => return r.map(|_| ()),
            }
        }
    }

    fn prompt(&self, target: &str, text: &str, wait_ms: u32) -> PromptOutcome {
        let ms = wait_ms.to_string();
        // Delivery is confirmed by the agent reacting: return on the first status after activity,
        // `working` included, instead of waiting out the agent's whole turn.
        let args = [
            "agent",
            "prompt",
            target,
            text,
            "--wait",
            "--until",
            "working",
            "--until",
            "idle",
            "--until",
            "done",
            "--until",
            "blocked",
            "--timeout",
            &ms,
        ];
        let (code, reply) = match self.call(&args, Duration::from_millis(wait_ms as u64 + 10_000)) {
            Ok(Output { status, stdout, stderr }) => (
                status.code(),
                classify(status.code(), &String::from_utf8_lossy(&stdout), &String::from_utf8_lossy(&stderr)),
            ),
            Err(r) => (None, r),
        };
        match reply {
            Reply::Ok(_) => PromptOutcome::Settled,
            // Both mean the text was typed and submitted: herdr only could not see the agent react
            // (stalled: no state change within 5 s). Never retried, so a prompt is never typed twice.
            Reply::Error { code, .. } if code == "timeout" => PromptOutcome::Accepted(Accepted::Timeout),
            Reply::Error { code, .. } if code == "agent_prompt_stalled" => PromptOutcome::Accepted(Accepted::Stalled),
            // Our deadline ended the call mid-wait, or the CLI failed without a document (the server
            // went away mid-call: `EmptyResponse`): the text may be in; accepted, unconfirmed.
            Reply::TimedOut(_) => PromptOutcome::Accepted(Accepted::Timeout),
            Reply::Bad(_) if code == Some(1) => PromptOutcome::Accepted(Accepted::Timeout),
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
                let reported = field(a, &["status", "agent_status", "state"])
                    .map(|s| Status::parse(&s))
                    .unwrap_or(Status::Unknown);
                // Issue 30: herdr's status is mam's own report once the daemon reported this pane's
                // job (`pane report-agent --source mam`), so it is never read back as the agent's:
                // the agent's own state is what herdr's screen detection classifies.
                let Some(own) = self.screen_state(target) else { return reported };
                if own.state == Status::Working && own.whole_recent {
                    let kind = a.get("agent").and_then(Value::as_str).unwrap_or_default();
                    if self.stale_working(target, kind) {
                        return Status::Idle;
                    }
                }
                own.state
            }
            Reply::NoServer => Status::Absent,
            Reply::Error { code, .. } if code.contains("not_found") || code == "agent_not_running" => Status::Absent,
            _ => Status::Unknown,
        }
    }

    fn agent_session(&self, target: &str) -> Option<String> {
        let Reply::Ok(v) = self.query(&["agent", "get", target]) else { return None };
        let a = v.get("agent").filter(|a| a.is_object()).unwrap_or(&v);
        a.get("agent_session")?.get("value")?.as_str().map(str::to_string)
    }

    fn input_line(&self, target: &str) -> InputLine {
        let Reply::Ok(v) = self.query(&["agent", "get", target]) else { return InputLine::Unknown };
        let a = v.get("agent").filter(|a| a.is_object()).unwrap_or(&v);
        let kind = a.get("agent").and_then(Value::as_str).unwrap_or_default();
        let Some(ad) = agents::adapter_of_started(kind) else { return InputLine::Unknown };
        match self.read_detection(target) {
            Ok(screen) => InputLine::of(ad, &screen, false),
            Err(_) => InputLine::Unknown,
        }
    }

    fn read_detection(&self, target: &str) -> PaneResult<String> {
        // Plain terminal text (herdr 0.8 prints reads as they are, never as a document).
        self.read_text(&["agent", "read", target, "--source", "visible"])
    }

    fn send_keys(&self, target: &str, keys: &str) -> PaneResult<()> {
        let pane = self.agent_pane(target).unwrap_or_else(|| target.to_string());
        self.mutate(&["pane", "send-keys", &pane, keys], Duration::from_secs(30)).map(|_| ())
    }

    fn read_pane(&self, pane: &str) -> Option<String> {
        self.read_text(&["pane", "read", pane, "--source", "recent-unwrapped", "--lines", "20"]).ok()
    }

    fn pane_pids(&self, pane: &str) -> Vec<i32> {
        let Reply::Ok(v) = self.query(&["pane", "process-info", "--pane", pane]) else { return Vec::new() };
        process_info_pids(&v)
    }

    fn close_pane(&self, pane: &str) -> PaneResult<()> {
        let args = ["pane", "close", pane];
        self.expect_ok(&args, self.query(&args)).map(|_| ())
    }

    fn close_workspace(&self, id: &str) -> PaneResult<()> {
        let args = ["workspace", "close", id];
        self.expect_ok(&args, self.query(&args)).map(|_| ())
    }

    /// `pane report-agent` (the semantic state herdr's sidebar, waits and rollups use), then `pane
    /// report-metadata` (the same message as the state's label, and the pane title): herdr keeps a
    /// report's message to itself, and it ignores lifecycle reports for a pane whose agent process
    /// exited, while metadata still shows there (docs/DESIGN.md). Never bootstraps a server.
    fn report_state(&self, pane: &str, kind: &str, r: &StateReport) -> PaneResult<()> {
        let (agent, meta) = report_args(pane, kind, r);
        let agent: Vec<&str> = agent.iter().map(String::as_str).collect();
        self.expect_ok(&agent, self.run(&agent, REPORT_LIMIT))?;
        let meta: Vec<&str> = meta.iter().map(String::as_str).collect();
        self.expect_ok(&meta, self.run(&meta, REPORT_LIMIT)).map(|_| ())
    }

    fn release_state(&self, pane: &str, kind: &str, seq: u64) -> PaneResult<()> {
        let seq = seq.to_string();
        let release = ["pane", "release-agent", pane, "--source", REPORT_SOURCE, "--agent", kind, "--seq", &seq];
        let released = self.expect_ok(&release, self.run(&release, REPORT_LIMIT));
        let clear =
            ["pane", "report-metadata", pane, "--source", REPORT_SOURCE, "--clear-title", "--clear-state-labels"];
        let mut clear = clear.to_vec();
        clear.extend(["--seq", &seq]);
        let cleared = self.expect_ok(&clear, self.run(&clear, REPORT_LIMIT));
        released.and(cleared).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 29 item 3: a forged job reason with terminal escapes, newlines and a leading `--`
    /// reaches herdr's sidebar as one plain, bounded line that no flag parser takes for a flag.
    #[test]
    fn i29_a_forged_report_text_reaches_herdr_without_escapes_newlines_or_a_flag() {
        let forged = format!("--help\x1b]0;owned\x07\x1b[2J\nline two\r{}", "x".repeat(500));
        let r = StateReport { state: Status::Blocked, message: forged.clone(), title: forged, ttl_ms: None, seq: 7 };
        let (agent, meta) = report_args("p_1", "claude", &r);
        let at = |v: &[String], flag: &str| v[v.iter().position(|a| a == flag).unwrap() + 1].clone();
        for (v, flag, max) in [(&agent, "--message", 200), (&meta, "--state-label", 200), (&meta, "--title", 80)] {
            let text = at(v, flag);
            assert!(!text.starts_with('-'), "{flag} {text:?}");
            assert!(!text.chars().any(char::is_control), "{flag} {text:?}");
            assert!(text.chars().count() <= max, "{flag}: {} characters", text.chars().count());
        }
        assert!(
            at(&agent, "--message").starts_with(" --help ]0;owned  [2J line two "),
            "{:?}",
            at(&agent, "--message")
        );
        assert_eq!(agent.iter().filter(|a| a.starts_with("--")).count(), 5, "the flags are mam's: {agent:?}");
    }

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

    /// What herdr 0.8.0 printed here (see docs/DESIGN.md), one call per line.
    const AGENT_LIST: &str = r#"{"id":"cli:agent:list","result":{"agents":[{"agent":"claude","agent_status":"idle","cwd":"/tmp/hx","focused":true,"interactive_ready":true,"name":"a1","pane_id":"w1:p1","revision":0,"state_change_seq":1,"tab_id":"w1:t1","terminal_id":"term_66193def70c251","workspace_id":"w1"}],"type":"agent_list"}}"#;
    const NOT_FOUND: &str =
        r#"{"error":{"code":"agent_not_found","message":"agent target nobody not found"},"id":"cli:agent:get"}"#;
    const STALLED: &str = r#"{"error":{"code":"agent_prompt_stalled","message":"agent prompt produced no observed state change within 5000 ms; status is idle and state_change_seq remained 1"},"id":"cli:agent:prompt"}"#;
    #[test]
    fn a_working_status_from_the_whole_recent_buffer_is_stale_when_the_screen_is_idle() {
        // Observed on herdr 0.8.0 with gemini 0.61.0 right after its start-up dialogs.
        let explain = r#"{"agent":"gemini","state":"working","screen_detection_skipped":false,
            "matched_rule":{"id":"esc_cancel_working","priority":100,"region":"whole_recent","state":"working"}}"#;
        assert_eq!(parse_explain(explain), Some(Explained { state: Status::Working, whole_recent: true }));
        let title = r#"{"state":"working","matched_rule":{"id":"osc_title_working","region":"osc_title"}}"#;
        assert_eq!(parse_explain(title), Some(Explained { state: Status::Working, whole_recent: false }));
        assert_eq!(parse_explain(r#"{"state":"idle","matched_rule":null}"#).map(|e| e.state), Some(Status::Idle));
        assert_eq!(parse_explain(r#"{"state":"working","screen_detection_skipped":true}"#), None);
        assert_eq!(parse_explain("agent: gemini\nstate: idle\n"), None, "the text form is not read");
        let g = agents::adapter("gemini").unwrap();
        let idle = " Shift+Tab to accept edits\n >   Type your message or @path/to/file\n workspace (/directory)\n";
        let thinking = " ⠧ Thinking... (esc to cancel, 4s)\n >   Type your message or @path/to/file\n";
        assert_eq!(g.state_on(idle), Some("idle"));
        assert_eq!(g.state_on(thinking), Some("working"));
        // CI, at load: gemini drew its UI over the top of its key box, whose bottom ("Esc to cancel")
        // stayed on the visible screen below the footer; herdr kept saying working.
        let remains = " Shift+Tab to accept edits\n >   Type your message or @path/to/file\n \
                       workspace (/directory)       sandbox         /model\n\n\n\
                       │ (Press Enter to submit, Esc to cancel, Ctrl+C to  │\n│ clear stored key)   │\n\
                       ╰─────────────────────╯\n";
        assert_eq!(g.state_on(remains), Some("idle"));
    }

    #[test]
    fn process_info_names_the_shell_and_the_foreground() {
        let v: Value = serde_json::from_str(PROCESS_INFO).unwrap();
        assert_eq!(process_info_pids(&v["result"]), [16461]);
        assert!(process_info_pids(&serde_json::json!({"process_info": {"shell_pid": 1}})).is_empty());
    }

    const PROCESS_INFO: &str = r#"{"id":"cli:pane:process_info","result":{"process_info":{"foreground_process_group_id":16461,"foreground_processes":[{"argv":["/bin/bash"],"cmdline":"/bin/bash","cwd":"/tmp/hx","name":"bash","pid":16461}],"pane_id":"w1:p1","shell_pid":16461},"type":"pane_process_info"}}"#;
    const LAYOUT: &str = r#"{"id":"cli:pane:layout","result":{"layout":{"area":{"height":23,"width":54,"x":26,"y":1},"focused_pane_id":"w1:p1","panes":[{"focused":true,"pane_id":"w1:p1","rect":{"height":23,"width":27,"x":26,"y":1}},{"focused":false,"pane_id":"w1:p2","rect":{"height":12,"width":27,"x":53,"y":1}},{"focused":false,"pane_id":"w1:p3","rect":{"height":11,"width":27,"x":53,"y":13}}],"splits":[],"tab_id":"w1:t1","workspace_id":"w1","zoomed":false},"type":"pane_layout"}}"#;

    #[test]
    fn real_herdr_outputs_are_read_as_the_binary_means_them() {
        let Reply::Ok(v) = classify(Some(0), AGENT_LIST, "") else { panic!() };
        let a = &parse_agents(&v).unwrap()[0];
        assert_eq!(
            (a.name.as_str(), a.pane.as_str(), a.kind.as_str(), a.status.as_str()),
            ("a1", "w1:p1", "claude", "idle")
        );
        // Errors: a document on stderr, stdout empty, exit 1.
        assert_eq!(
            classify(Some(1), "", NOT_FOUND),
            Reply::Error { code: "agent_not_found".into(), message: "agent target nobody not found".into() }
        );
        assert!(matches!(classify(Some(1), "", STALLED), Reply::Error { code, .. } if code == "agent_prompt_stalled"));
        // send-keys, send-text, run: exit 0 and no output at all is a success.
        assert_eq!(classify(Some(0), "", ""), Reply::Ok(Value::Null));
        // A usage error is plain text with exit 2.
        assert!(matches!(classify(Some(2), "", "error: unexpected argument"), Reply::Bad(_)));
        // The foreground belongs to the shell; a foreground command does not.
        let Reply::Ok(pi) = classify(Some(0), PROCESS_INFO, "") else { panic!() };
        assert!(shell_owns_foreground(&pi));
        let busy = serde_json::json!({"process_info": {"foreground_process_group_id": 9, "shell_pid": 8,
            "foreground_processes": [{"name": "claude", "pid": 9}]}});
        assert!(!shell_owns_foreground(&busy));
        let names_only = serde_json::json!({"process_info": {"foreground_processes": [{"name": "bash"}]}});
        assert!(shell_owns_foreground(&names_only));
        // `exec sleep 100` in the pane: the group is still the shell's pid, but no shell is there.
        let execd = serde_json::json!({"process_info": {"foreground_process_group_id": 8, "shell_pid": 8,
            "foreground_processes": [{"name": "sleep", "pid": 8}]}});
        assert!(!shell_owns_foreground(&execd));
        // Geometry comes from `pane layout`.
        let Reply::Ok(lv) = classify(Some(0), LAYOUT, "") else { panic!() };
        assert_eq!(
            layout_positions(&lv),
            vec![("w1:p1".into(), (26, 1)), ("w1:p2".into(), (53, 1)), ("w1:p3".into(), (53, 13))]
        );
    }

    #[test]
    fn only_herdr_0_8_is_spoken() {
        assert_eq!(check_version("herdr 0.8.0\n").unwrap(), "0.8.0");
        assert_eq!(check_version("herdr 0.8.12").unwrap(), "0.8.12");
        let e = check_version("herdr 0.9.0").unwrap_err();
        assert!(e.contains("herdr 0.9.0 is not supported") && e.contains("0.8.x"), "{e}");
        assert!(check_version("herdr 1.8.0").is_err());
        assert!(check_version("something else").unwrap_err().contains("cannot tell the herdr version"));
    }
}
