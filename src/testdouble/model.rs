//! The scripted model (issue 30): `mam test-double model [--port P] [--log FILE]` serves a model API
//! on 127.0.0.1 so a REAL agent CLI can do a real job offline. It prints `http://127.0.0.1:<port>` on
//! stdout as one line once it listens, and runs until it is signalled (SIGTERM/SIGINT end it).
//!
//! It speaks two wire formats over HTTP/1.1 (one request per connection, `Connection: close`):
//! - the Anthropic Messages API for claude (`ANTHROPIC_BASE_URL=<url>`): `HEAD /`, `POST /v1/messages`
//!   with `"stream": true` answered as server-sent events (message_start, content_block_start/delta/stop,
//!   message_delta with its stop_reason, message_stop), a `tool_use` of the `Bash` tool, the tool's
//!   `tool_result` read from the next request, the title request (no tools) and `count_tokens`;
//! - the OpenAI Responses API for codex (`base_url = "<url>/v1"`, `wire_api = "responses"`):
//!   `POST /v1/responses` streamed as response.created, response.output_item.done and
//!   response.completed, a `function_call` of `exec_command` `{cmd}` (or `shell` `{command}` when the
//!   CLI offers that tool instead), its `function_call_output` read from the next request.
//!
//! The "model" reads the conversation as an agent would. It takes the LAST user message that holds
//! `read and follow <brief>` (mam's prompt), reads that brief (the server runs on the agent's
//! machine), finds the brief's command lines with the parser `delegate::brief` owns, and plays a plan
//! chosen by a phrase of the brief's `## Task` section; the number of tool calls it already made
//! after that prompt is its place in the plan. So one server serves a whole sequence of jobs in one
//! conversation. The phrases (lower case in the task text):
//! - `does the job` (also the default): start, `echo 'mam-model: job <id> worked'`, progress, success,
//!   then a short text answer;
//! - `never runs mam's commands`: a text answer only;
//! - `works long without speaking` [`for <S> s`]: start, `sleep <S>` (default 20), success, text;
//! - `killed mid-command`: start, then `sleep 300` (the test kills the agent meanwhile);
//! - `finishes its turn without completed`: start, then a text answer;
//! - `asks the user a question`: start, then a text answer ending in a question mark;
//! - `needs an approval first`: `touch mam-model-approval` before start (claude's default mode asks
//!   approval for it; the job then waits at the dialog), then the job as `does the job`.
//!
//! With no mam prompt in the conversation (`claude -p "say hi"`, a title request) it answers a line
//! of text. Every request is logged as one JSON line to `--log` (when given): the API, the job, the
//! step, the action and the tool results the CLI sent back, so a test sees what the CLI's shell gave.
//! Every read has a deadline (30 s); a connection is served on its own short-lived thread. Nothing in
//! mam's own flows calls it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use crate::ctx::Ctx;
use crate::delegate::brief::{parse_commands, parse_prompt, parse_report_path};

const READ_DEADLINE: Duration = Duration::from_secs(30);
const MAX_BODY: usize = 64 << 20;

/// One step of a plan: a shell command through the CLI's tool, or a text answer that ends the turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Shell(String),
    /// Write a file: claude's `Write` tool; through the shell elsewhere.
    Write(PathBuf, String),
    Text(String),
}

struct Server {
    log: Option<Mutex<std::fs::File>>,
    ids: AtomicU64,
}

/// `mam test-double model [--port P] [--log FILE]`.
pub fn run(ctx: &Ctx, args: &[String]) -> Result<i32, String> {
    let (mut port, mut log) = (0u16, None);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--port" => {
                let v = it.next().ok_or("test-double model: --port needs a value")?;
                port = v.parse().map_err(|_| format!("test-double model: --port {v:?} is not a port number"))?;
            }
            "--log" => log = Some(PathBuf::from(it.next().ok_or("test-double model: --log needs a file")?)),
            other => return Err(format!("test-double model: unknown argument {other:?} (give --port P, --log FILE)")),
        }
    }
    let listener = TcpListener::bind(("127.0.0.1", port))
        .map_err(|e| format!("test-double model: cannot listen on 127.0.0.1:{port}: {e}"))?;
    let bound = listener.local_addr().map_err(|e| format!("test-double model: local address: {e}"))?;
    let log = match log {
        Some(p) => Some(Mutex::new(
            crate::sys::open_append(&p)
                .map_err(|e| format!("test-double model: cannot open --log {}: {e}", p.display()))?,
        )),
        None => None,
    };
    ctx.say(&format!("http://127.0.0.1:{}", bound.port()));
    let server = Arc::new(Server { log, ids: AtomicU64::new(1) });
    for conn in listener.incoming() {
        let Ok(stream) = conn else { continue };
        let server = Arc::clone(&server);
        // A connection lives for one request; its thread ends with it (the deadline bounds a stalled
        // client), so the handle is not kept.
        std::thread::spawn(move || {
            let _ = serve(&server, stream);
        });
    }
    Ok(0)
}

struct Request {
    method: String,
    path: String,
    body: Vec<u8>,
}

fn read_request(stream: &TcpStream) -> std::io::Result<Request> {
    stream.set_read_timeout(Some(READ_DEADLINE))?;
    let mut r = BufReader::new(stream);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let path = parts.next().unwrap_or("").to_string();
    let (mut len, mut chunked) = (0usize, false);
    loop {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            let k = k.trim().to_ascii_lowercase();
            if k == "content-length" {
                len = v.trim().parse().unwrap_or(0);
            } else if k == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked") {
                chunked = true;
            }
        }
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            let mut size = String::new();
            r.read_line(&mut size)?;
            let n = usize::from_str_radix(size.trim().split(';').next().unwrap_or("0"), 16).unwrap_or(0);
            if n == 0 || body.len() + n > MAX_BODY {
                break;
            }
            let mut chunk = vec![0u8; n + 2];
            r.read_exact(&mut chunk)?;
            body.extend_from_slice(&chunk[..n]);
        }
    } else if len > 0 && len <= MAX_BODY {
        body = vec![0u8; len];
        r.read_exact(&mut body)?;
    }
    Ok(Request { method, path, body })
}

fn serve(server: &Server, mut stream: TcpStream) -> std::io::Result<()> {
    let req = read_request(&stream)?;
    stream.set_write_timeout(Some(READ_DEADLINE))?;
    let path = req.path.split('?').next().unwrap_or("").to_string();
    if req.method == "HEAD" {
        return stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    }
    if req.method != "POST" {
        return reply_json(&mut stream, 404, &json!({"error": {"type": "not_found", "message": path}}));
    }
    let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
    if path.ends_with("/count_tokens") {
        return reply_json(&mut stream, 200, &json!({"input_tokens": 100}));
    }
    let n = server.ids.fetch_add(1, Ordering::Relaxed);
    if path.ends_with("/messages") {
        let (action, note) = anthropic_turn(&body);
        server.note("anthropic", &note, &action);
        let stream_it = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
        return anthropic_reply(&mut stream, n, &action, stream_it);
    }
    if path.ends_with("/responses") {
        let (action, note) = responses_turn(&body);
        server.note("responses", &note, &action);
        return responses_reply(&mut stream, n, &action, &tool_names(&body));
    }
    reply_json(&mut stream, 404, &json!({"error": {"type": "not_found", "message": path}}))
}

impl Server {
    fn note(&self, api: &str, note: &Value, action: &Action) {
        let Some(log) = &self.log else { return };
        let path;
        let (kind, text) = match action {
            Action::Shell(c) => ("shell", c),
            Action::Write(p, _) => {
                path = p.display().to_string();
                ("write", &path)
            }
            Action::Text(t) => ("text", t),
        };
        let mut line = json!({"t_ms": crate::clock::now_ms(), "api": api, "action": kind, "text": text});
        if let (Some(m), Some(n)) = (line.as_object_mut(), note.as_object()) {
            m.extend(n.clone());
        }
        if let Ok(mut f) = log.lock() {
            let _ = writeln!(f, "{line}");
        }
    }
}

fn reply_json(stream: &mut TcpStream, status: u16, v: &Value) -> std::io::Result<()> {
    let body = v.to_string();
    let reason = if status == 200 { "OK" } else { "Not Found" };
    write!(
        stream,
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

fn sse_head(stream: &mut TcpStream) -> std::io::Result<()> {
    stream.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n",
    )
}

fn sse(stream: &mut TcpStream, event: &str, data: &Value) -> std::io::Result<()> {
    write!(stream, "event: {event}\ndata: {data}\n\n")
}

/// The text of a message's content: a string, or the `text` of its text blocks joined.
fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => {
            blocks.iter().filter_map(|b| b.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join("\n")
        }
        _ => String::new(),
    }
}

fn is_mam_prompt(text: &str) -> bool {
    text.contains("read and follow ")
}

/// The next action for a Messages API request, and what the log gets.
fn anthropic_turn(body: &Value) -> (Action, Value) {
    let has_tools = body.get("tools").and_then(Value::as_array).is_some_and(|t| !t.is_empty());
    let msgs = body.get("messages").and_then(Value::as_array).cloned().unwrap_or_default();
    let at = msgs.iter().rposition(|m| {
        m.get("role").and_then(Value::as_str) == Some("user")
            && is_mam_prompt(&content_text(m.get("content").unwrap_or(&Value::Null)))
    });
    let (Some(at), true) = (at, has_tools) else {
        return (Action::Text("Hello from mam's scripted model.".into()), json!({"title_or_chat": true}));
    };
    let prompt = content_text(&msgs[at]["content"]);
    let mut done = 0;
    let mut results = Vec::new();
    for m in &msgs[at + 1..] {
        for b in m.get("content").and_then(Value::as_array).into_iter().flatten() {
            match b.get("type").and_then(Value::as_str) {
                Some("tool_use") => done += 1,
                Some("tool_result") => results.push(content_text(b.get("content").unwrap_or(&Value::Null))),
                _ => {}
            }
        }
    }
    let (action, job) = decide(&prompt, done);
    (action, json!({"job": job, "step": done, "tool_results": results}))
}

/// The next action for a Responses API request, and what the log gets.
fn responses_turn(body: &Value) -> (Action, Value) {
    let items = body.get("input").and_then(Value::as_array).cloned().unwrap_or_default();
    let at = items.iter().rposition(|m| {
        m.get("role").and_then(Value::as_str) == Some("user")
            && is_mam_prompt(&content_text(m.get("content").unwrap_or(&Value::Null)))
    });
    let Some(at) = at else {
        return (Action::Text("Hello from mam's scripted model.".into()), json!({"title_or_chat": true}));
    };
    let prompt = content_text(&items[at]["content"]);
    let mut done = 0;
    let mut results = Vec::new();
    for it in &items[at + 1..] {
        match it.get("type").and_then(Value::as_str) {
            Some("function_call") | Some("local_shell_call") | Some("custom_tool_call") => done += 1,
            Some("function_call_output") | Some("custom_tool_call_output") => {
                let out = it.get("output").cloned().unwrap_or(Value::Null);
                results.push(match out {
                    Value::String(s) => s,
                    other => content_text(&other),
                })
            }
            _ => {}
        }
    }
    let (action, job) = decide(&prompt, done);
    (action, json!({"job": job, "step": done, "tool_results": results}))
}

fn tool_names(body: &Value) -> Vec<String> {
    body.get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|t| t.get("name").and_then(Value::as_str).map(str::to_string))
        .collect()
}

/// The behaviour a brief's task asks for (module header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    DoesTheJob,
    NeverRuns,
    WorksLong(u64),
    KilledMidCommand,
    FinishesWithoutCompleted,
    AsksAQuestion,
    NeedsApproval,
}

/// The behaviour named in the `## Task` section of a brief (the whole text when it has none).
pub fn behaviour(brief: &str) -> Behaviour {
    let task = brief.split_once("## Task").map_or(brief, |(_, t)| t);
    let task = task.split("\n## Commands").next().unwrap_or(task).to_ascii_lowercase();
    if task.contains("never runs mam's commands") {
        Behaviour::NeverRuns
    } else if let Some(i) = task.find("works long without speaking") {
        let rest = &task[i + "works long without speaking".len()..];
        let secs = rest
            .trim_start()
            .strip_prefix("for ")
            .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|d| d.parse().ok())
            .unwrap_or(20);
        Behaviour::WorksLong(secs)
    } else if task.contains("killed mid-command") {
        Behaviour::KilledMidCommand
    } else if task.contains("finishes its turn without completed") {
        Behaviour::FinishesWithoutCompleted
    } else if task.contains("asks the user a question") {
        Behaviour::AsksAQuestion
    } else if task.contains("needs an approval first") {
        Behaviour::NeedsApproval
    } else {
        Behaviour::DoesTheJob
    }
}

/// The plan for a brief: shell commands in order, ending in a text answer.
pub fn plan(brief: &str, job: &str) -> Vec<Action> {
    let cmds = parse_commands(brief);
    let report =
        parse_report_path(brief).map(|p| Action::Write(p, format!("# Job {job}\n\nDone by mam's scripted model.\n")));
    let cmd = |k: &str| cmds.get(k).cloned().unwrap_or_else(|| format!("echo 'the brief has no {k} command'"));
    let start = Action::Shell(cmd("start"));
    let success = Action::Shell(cmd("success"));
    let done = Action::Text(format!("Job {job} is done."));
    let b = behaviour(brief);
    let first = (b == Behaviour::NeedsApproval).then(|| Action::Shell("touch mam-model-approval".into()));
    match b {
        Behaviour::DoesTheJob | Behaviour::NeedsApproval => first
            .into_iter()
            .chain([
                start,
                Action::Shell(format!("echo 'mam-model: job {job} worked'")),
                Action::Shell(cmd("progress").replace("WHAT YOU ARE DOING", &format!("job {job} half done"))),
            ])
            .chain(report)
            .chain([success, done])
            .collect(),
        Behaviour::NeverRuns => vec![Action::Text("I read the brief but I will not run its commands.".into())],
        Behaviour::WorksLong(s) => {
            [start, Action::Shell(format!("sleep {s}"))].into_iter().chain(report).chain([success, done]).collect()
        }
        Behaviour::KilledMidCommand => {
            vec![start, Action::Shell("sleep 300".into()), Action::Text("The long command ended.".into())]
        }
        Behaviour::FinishesWithoutCompleted => vec![start, Action::Text("I stopped before the end.".into())],
        Behaviour::AsksAQuestion => {
            vec![start, Action::Text("Which of the two files do you want me to change?".into())]
        }
    }
}

/// The action after `done` tool calls since `prompt`, and the job id the prompt names.
pub fn decide(prompt: &str, done: usize) -> (Action, String) {
    let (brief, job) = parse_prompt(prompt);
    let job = job.unwrap_or_default();
    let Some(text) = brief.and_then(|p| std::fs::read_to_string(p).ok()) else {
        return (Action::Text("I cannot read the brief this prompt names.".into()), job);
    };
    let plan = plan(&text, &job);
    let tools = plan.iter().filter(|a| !matches!(a, Action::Text(_))).count();
    let action = if done < tools {
        plan.iter().filter(|a| !matches!(a, Action::Text(_))).nth(done).cloned()
    } else {
        plan.iter().rev().find(|a| matches!(a, Action::Text(_))).cloned()
    };
    (action.unwrap_or_else(|| Action::Text("Nothing left to do.".into())), job)
}

fn anthropic_reply(stream: &mut TcpStream, n: u64, action: &Action, streaming: bool) -> std::io::Result<()> {
    let id = format!("msg_mam{n:06}");
    let model = "mam-scripted-model";
    let usage = json!({"input_tokens": 100, "output_tokens": 10, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0});
    let (block, stop) = match action {
        Action::Text(t) => (json!({"type": "text", "text": t}), "end_turn"),
        Action::Shell(c) => (
            json!({"type": "tool_use", "id": format!("toolu_mam{n:06}"), "name": "Bash",
                   "input": {"command": c, "description": "Run the command the brief gives", "timeout": 600000}}),
            "tool_use",
        ),
        Action::Write(p, t) => (
            json!({"type": "tool_use", "id": format!("toolu_mam{n:06}"), "name": "Write",
                   "input": {"file_path": p, "content": t}}),
            "tool_use",
        ),
    };
    if !streaming {
        let msg = json!({"id": id, "type": "message", "role": "assistant", "model": model, "content": [block],
                         "stop_reason": stop, "stop_sequence": null, "usage": usage});
        return reply_json(stream, 200, &msg);
    }
    sse_head(stream)?;
    let start = json!({"type": "message_start", "message": {"id": id, "type": "message", "role": "assistant",
        "model": model, "content": [], "stop_reason": null, "stop_sequence": null, "usage": usage}});
    sse(stream, "message_start", &start)?;
    let (empty, delta) = match action {
        Action::Text(t) => (json!({"type": "text", "text": ""}), json!({"type": "text_delta", "text": t})),
        Action::Shell(_) | Action::Write(..) => {
            let mut b = block.clone();
            let input = b["input"].take();
            b["input"] = json!({});
            (b, json!({"type": "input_json_delta", "partial_json": input.to_string()}))
        }
    };
    sse(stream, "content_block_start", &json!({"type": "content_block_start", "index": 0, "content_block": empty}))?;
    sse(stream, "content_block_delta", &json!({"type": "content_block_delta", "index": 0, "delta": delta}))?;
    sse(stream, "content_block_stop", &json!({"type": "content_block_stop", "index": 0}))?;
    sse(
        stream,
        "message_delta",
        &json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null}, "usage": {"output_tokens": 10}}),
    )?;
    sse(stream, "message_stop", &json!({"type": "message_stop"}))?;
    stream.flush()
}

fn responses_reply(stream: &mut TcpStream, n: u64, action: &Action, tools: &[String]) -> std::io::Result<()> {
    let id = format!("resp_mam{n:06}");
    let q = |s: &str| format!("'{}'", s.replace('\'', "'\\''"));
    let shell = match action {
        Action::Shell(c) => Some(c.clone()),
        // codex has no file tool of this shape: the report is written through its shell.
        Action::Write(p, t) => Some(format!("printf '%s' {} > {}", q(t), q(&p.to_string_lossy()))),
        Action::Text(_) => None,
    };
    let item = match (action, shell) {
        (_, Some(c)) => {
            // A long yield: the model waits for the command's end as a blocking tool would (a sleep
            // of the plan is one step, not a poll).
            let (name, args) = if tools.iter().any(|t| t == "exec_command") || !tools.iter().any(|t| t == "shell") {
                ("exec_command", json!({"cmd": c, "yield_time_ms": 600000}))
            } else {
                ("shell", json!({"command": ["bash", "-lc", c], "timeout_ms": 600000}))
            };
            json!({"type": "function_call", "id": format!("fc_mam{n:06}"), "call_id": format!("call_mam{n:06}"),
                   "name": name, "arguments": args.to_string()})
        }
        (_, None) => {
            let t = if let Action::Text(t) = action { t.as_str() } else { "" };
            json!({"type": "message", "role": "assistant", "id": format!("msg_mam{n:06}"),
                   "content": [{"type": "output_text", "text": t, "annotations": []}]})
        }
    };
    sse_head(stream)?;
    sse(stream, "response.created", &json!({"type": "response.created", "response": {"id": id}}))?;
    sse(
        stream,
        "response.output_item.added",
        &json!({"type": "response.output_item.added", "output_index": 0, "item": item}),
    )?;
    if let Action::Text(t) = action {
        sse(
            stream,
            "response.output_text.delta",
            &json!({"type": "response.output_text.delta", "output_index": 0, "content_index": 0, "delta": t}),
        )?;
    }
    sse(
        stream,
        "response.output_item.done",
        &json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
    )?;
    let usage = json!({"input_tokens": 100, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 10,
        "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 110});
    sse(stream, "response.completed", &json!({"type": "response.completed", "response": {"id": id, "usage": usage}}))?;
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delegate::brief::{local, Commands, Header};

    fn brief(task: &str) -> String {
        let h = Header {
            job_id: "j1",
            session: "w",
            job_type: "task",
            attempt: 1,
            parent: None,
            deadline: None,
            heartbeat_sec: 30,
            heartbeat_misses: 4,
            ack_timeout_sec: 60,
            idle_timeout_sec: 120,
            report_path: "/r/j1/report.md",
        };
        local(&h, None, task, &Commands::from_prefix("/m publish --event", 30))
    }

    #[test]
    fn behaviours_are_read_from_the_task_only() {
        assert_eq!(behaviour(&brief("Say hi.")), Behaviour::DoesTheJob);
        assert_eq!(behaviour(&brief("This agent never runs mam's commands.")), Behaviour::NeverRuns);
        assert_eq!(behaviour(&brief("It works long without speaking for 7 s.")), Behaviour::WorksLong(7));
        assert_eq!(behaviour(&brief("It works long without speaking.")), Behaviour::WorksLong(20));
        assert_eq!(behaviour(&brief("It is killed mid-command.")), Behaviour::KilledMidCommand);
        assert_eq!(behaviour(&brief("It asks the user a question.")), Behaviour::AsksAQuestion);
    }

    #[test]
    fn does_the_job_runs_start_work_progress_success_then_answers() {
        let p = plan(&brief("does the job"), "j1");
        assert_eq!(p[0], Action::Shell("/m publish --event started --heartbeat 30".into()));
        assert_eq!(p[1], Action::Shell("echo 'mam-model: job j1 worked'".into()));
        assert_eq!(p[2], Action::Shell("/m publish --event progress --message 'job j1 half done'".into()));
        assert_eq!(p[3], Action::Write("/r/j1/report.md".into(), "# Job j1\n\nDone by mam's scripted model.\n".into()));
        assert_eq!(p[4], Action::Shell("/m publish --event completed".into()));
        assert!(matches!(p[5], Action::Text(_)));
        // One tool call per request: the place in the plan is the number of calls made.
        let a = plan(&brief("needs an approval first"), "j1");
        assert_eq!(a[0], Action::Shell("touch mam-model-approval".into()));
        assert_eq!(a[1], p[0]);
    }
}
