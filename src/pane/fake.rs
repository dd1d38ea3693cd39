//! The fake backend (ORCH 1.8, `MAM_PANE_BACKEND=fake`): workspaces and panes are directories under
//! `MAM_FAKE_PANES_DIR` (cwd, env, label as files), `start_agent` spawns the fake agent
//! (`mam test-double agent`, argv[0] set to the kind, A18) detached with the pane's environment,
//! `prompt` appends to the pane's inbox, and the status is read from a file the fake agent writes.
//!
//! Layout: `ws/<wid>/{cwd,label}`, `panes/<pid>/{workspace,cwd,env.json,agent,kind,pid,inbox,status,
//! screen,keys,agent.log}`, `agents/<name>` (holds the pane id), `next` (id counter). Mutations hold
//! `<dir>/.lock`. It must never touch anything outside its directory except the agents it spawned.

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::contract::{
    canon, Accepted, Agent, Backend, Created, Dir, ListOutcome, PaneError, PaneInfo, PaneResult, PromptOutcome, Status,
    Workspace,
};
use super::knobs::Knobs;
use crate::ctx::{ChildRole, Ctx};
use crate::sys::{self, Flock, LockMode};
use crate::text::show_path;

/// The fake backend over one directory.
pub struct Fake {
    ctx: Ctx,
    dir: PathBuf,
    knobs: Knobs,
}

fn io_err(what: &str, p: &Path, e: std::io::Error) -> PaneError {
    PaneError::Failed(format!("fake backend: cannot {what} {}: {e}", show_path(p)))
}

fn read_trim(p: &Path) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

/// True when `pid` is a live, non-zombie process.
fn alive(pid: i32) -> bool {
    sys::process_exists(pid) && !matches!(sys::proc_start_ticks(pid), Ok((_, true)))
}

impl Fake {
    pub fn new(ctx: &Ctx, _server: Option<&str>, knobs: Knobs) -> Fake {
        let dir = match ctx.path_var("MAM_FAKE_PANES_DIR") {
            Some(d) => sys::absolutize(ctx.cwd(), &d),
            None => crate::paths::find_control_root(ctx).join(".mam").join("fake-panes"),
        };
        Fake { ctx: ctx.clone(), dir, knobs }
    }

    fn lock(&self) -> PaneResult<Flock> {
        Flock::lock_path(&self.dir.join(".lock"), LockMode::Exclusive).map_err(|e| io_err("lock", &self.dir, e))
    }

    fn next_id(&self, prefix: &str) -> PaneResult<String> {
        let p = self.dir.join("next");
        let n: u64 = read_trim(&p).and_then(|s| s.parse().ok()).unwrap_or(0) + 1;
        sys::atomic_write(&p, n.to_string().as_bytes()).map_err(|e| io_err("write", &p, e))?;
        Ok(format!("{prefix}{n:06}"))
    }

    fn pane_dir(&self, pane: &str) -> PathBuf {
        self.dir.join("panes").join(pane)
    }

    fn write(&self, p: &Path, bytes: &[u8]) -> PaneResult<()> {
        sys::write_file(p, bytes).map_err(|e| io_err("write", p, e))
    }

    fn make_pane(&self, ws: &str, cwd: &Path, env: &[(String, String)]) -> PaneResult<String> {
        if !cwd.is_dir() {
            return Err(PaneError::Usage(format!("no such directory {}", show_path(cwd))));
        }
        let id = self.next_id("f")?;
        let d = self.pane_dir(&id);
        sys::create_dir_all(&d).map_err(|e| io_err("create", &d, e))?;
        let map: serde_json::Map<String, serde_json::Value> =
            env.iter().map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone()))).collect();
        self.write(&d.join("env.json"), serde_json::Value::Object(map).to_string().as_bytes())?;
        self.write(&d.join("cwd"), canon(cwd).to_string_lossy().as_bytes())?;
        self.write(&d.join("workspace"), ws.as_bytes())?;
        Ok(id)
    }

    fn sorted(&self, sub: &str) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(self.dir.join(sub))
            .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        v.retain(|n| !n.starts_with('.'));
        crate::sort::natural(&mut v);
        v
    }

    fn panes_of(&self, ws: &str) -> Vec<String> {
        self.sorted("panes")
            .into_iter()
            .filter(|p| read_trim(&self.pane_dir(p).join("workspace")).as_deref() == Some(ws))
            .collect()
    }

    /// The live agent process of a pane.
    fn agent_pid(&self, pane: &str) -> Option<i32> {
        let pid: i32 = read_trim(&self.pane_dir(pane).join("pid"))?.parse().ok()?;
        alive(pid).then_some(pid)
    }

    /// Agent name -> pane id.
    fn pane_of_agent(&self, name: &str) -> Option<String> {
        // The pane must still host this agent (a reused pane hosts a newer one).
        read_trim(&self.dir.join("agents").join(name))
            .filter(|p| read_trim(&self.pane_dir(p).join("agent")).as_deref() == Some(name))
    }

    fn kill_pane_agent(&self, pane: &str) -> PaneResult<()> {
        let Some(pid) = self.agent_pid(pane) else { return Ok(()) };
        // The agent leads its own session and process group (set_new_session).
        if let Err(e) = sys::kill(-pid, libc::SIGTERM) {
            if e.kind() == std::io::ErrorKind::InvalidInput {
                return Err(PaneError::Failed(format!("fake backend: pane {pane}: {e}")));
            }
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while alive(pid) && Instant::now() < deadline {
            sys::sleep(Duration::from_millis(10));
        }
        if alive(pid) {
            let _ = sys::kill(-pid, libc::SIGKILL);
        }
        Ok(())
    }
}

impl Backend for Fake {
    fn name(&self) -> &'static str {
        "fake"
    }

    fn server(&self) -> String {
        "fake".into()
    }

    fn ensure_server(&self) -> PaneResult<()> {
        if self.dir.is_dir() {
            return Ok(());
        }
        if super::proc::no_autostart(&self.ctx) {
            return Err(PaneError::NoServer(format!("server {} not running (MAM_NO_AUTOSTART=1)", self.server())));
        }
        for sub in ["ws", "panes", "agents"] {
            let d = self.dir.join(sub);
            sys::create_dir_all(&d).map_err(|e| io_err("create", &d, e))?;
        }
        Ok(())
    }

    fn list_agents(&self) -> ListOutcome {
        if !self.dir.is_dir() {
            return ListOutcome::NoServer;
        }
        let mut out = Vec::new();
        for name in self.sorted("agents") {
            let Some(pane) = self.pane_of_agent(&name) else { continue };
            if self.agent_pid(&pane).is_none() {
                continue;
            }
            out.push(Agent {
                kind: read_trim(&self.pane_dir(&pane).join("kind")).unwrap_or_default(),
                status: self.agent_status(&name).word().to_string(),
                name,
                pane,
            });
        }
        ListOutcome::Confirmed(out)
    }

    fn list_workspaces(&self, cwd: &Path) -> PaneResult<Vec<Workspace>> {
        let want = canon(cwd);
        let mut out = Vec::new();
        for ws in self.sorted("ws") {
            let wd = self.dir.join("ws").join(&ws);
            if read_trim(&wd.join("cwd")).map(PathBuf::from) != Some(want.clone()) {
                continue;
            }
            let panes = self
                .panes_of(&ws)
                .into_iter()
                .map(|p| {
                    let busy = self.agent_pid(&p).is_some();
                    PaneInfo { id: p, has_agent: busy, shell_foreground: !busy, pos: None }
                })
                .collect();
            out.push(Workspace { id: ws, label: read_trim(&wd.join("label")).unwrap_or_default(), panes });
        }
        Ok(out)
    }

    fn create_workspace(&self, cwd: &Path, label: Option<&str>, env: &[(String, String)]) -> PaneResult<Created> {
        self.ensure_server()?;
        let _l = self.lock()?;
        let id = self.next_id("w")?;
        let wd = self.dir.join("ws").join(&id);
        sys::create_dir_all(&wd).map_err(|e| io_err("create", &wd, e))?;
        self.write(&wd.join("cwd"), canon(cwd).to_string_lossy().as_bytes())?;
        self.write(&wd.join("label"), label.unwrap_or("").as_bytes())?;
        let pane = self.make_pane(&id, cwd, env)?;
        Ok(Created { workspace: id, pane })
    }

    fn split(&self, pane: &str, _dir: Dir, cwd: &Path, env: &[(String, String)]) -> PaneResult<String> {
        let _l = self.lock()?;
        let ws = read_trim(&self.pane_dir(pane).join("workspace"))
            .ok_or_else(|| PaneError::Failed(format!("fake backend: no pane {pane}")))?;
        self.make_pane(&ws, cwd, env)
    }

    fn rename_workspace(&self, id: &str, label: &str) -> PaneResult<()> {
        let wd = self.dir.join("ws").join(id);
        if !wd.is_dir() {
            return Err(PaneError::Failed(format!("fake backend: no workspace {id}")));
        }
        self.write(&wd.join("label"), label.as_bytes())
    }

    fn start_agent(&self, name: &str, kind: &str, pane: &str, args: &[String]) -> PaneResult<()> {
        let d = self.pane_dir(pane);
        if !d.is_dir() {
            return Err(PaneError::Failed(format!("fake backend: no pane {pane}")));
        }
        if self.agent_pid(pane).is_some() {
            return Err(PaneError::Failed(format!("fake backend: pane {pane} already runs an agent")));
        }
        if self.pane_of_agent(name).is_some_and(|p| self.agent_pid(&p).is_some()) {
            return Err(PaneError::Usage(format!("agent name {name} is already in use")));
        }
        let env: Vec<(String, String)> = fs::read(d.join("env.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&b).ok())
            .map(|m| m.into_iter().filter_map(|(k, v)| v.as_str().map(|v| (k, v.to_string()))).collect())
            .unwrap_or_default();
        let cwd = read_trim(&d.join("cwd")).map(PathBuf::from).unwrap_or_else(|| self.ctx.cwd().to_path_buf());
        for f in ["status", "inbox", "keys", "screen"] {
            let _ = fs::remove_file(d.join(f));
        }
        self.write(&d.join("inbox"), b"")?;
        let exe = std::env::current_exe().map_err(|e| PaneError::Failed(format!("cannot find the mam binary: {e}")))?;
        let _ = fs::remove_file(d.join("agent.log"));
        let log = sys::create_new(&d.join("agent.log")).map_err(|e| io_err("create", &d.join("agent.log"), e))?;
        let log2 = log.try_clone().map_err(|e| io_err("open", &d.join("agent.log"), e))?;
        let mut c = Command::new(exe);
        c.arg0(kind).args(["test-double", "agent", "--"]).args(args);
        c.env_clear().envs(self.ctx.child_env_for(ChildRole::Agent)).envs(env);
        c.env("MAM_FAKE_PANE_DIR", &d).env("MAM_FAKE_AGENT_NAME", name);
        c.current_dir(&cwd).stdin(Stdio::null()).stdout(log).stderr(log2);
        sys::set_new_session(&mut c);
        let child =
            sys::spawn(&mut c).map_err(|e| PaneError::Failed(format!("cannot start fake agent {name}: {e}")))?;
        self.write(&d.join("pid"), child.id().to_string().as_bytes())?;
        self.write(&d.join("kind"), kind.as_bytes())?;
        self.write(&d.join("agent"), name.as_bytes())?;
        let ad = self.dir.join("agents");
        sys::create_dir_all(&ad).map_err(|e| io_err("create", &ad, e))?;
        sys::atomic_write(&ad.join(name), pane.as_bytes()).map_err(|e| io_err("write", &ad.join(name), e))?;
        let deadline = Instant::now() + Duration::from_millis(self.knobs.start_timeout_ms as u64);
        let pid = child.id() as i32;
        drop(child);
        loop {
            if d.join("status").exists() {
                return Ok(());
            }
            if !alive(pid) {
                return Err(PaneError::Exited(format!(
                    "fake agent {name} exited during start (see {})",
                    show_path(&d.join("agent.log"))
                )));
            }
            if Instant::now() >= deadline {
                return Err(PaneError::Failed(format!(
                    "agent {name} not ready within {} ms (MAM_AGENT_START_TIMEOUT_MS)",
                    self.knobs.start_timeout_ms
                )));
            }
            sys::sleep(Duration::from_millis(10));
        }
    }

    fn prompt(&self, target: &str, text: &str, _wait_ms: u32) -> PromptOutcome {
        let Some(pane) = self.pane_of_agent(target).filter(|p| self.agent_pid(p).is_some()) else {
            return PromptOutcome::TransportError(format!("agent {target} is not running"));
        };
        // MAM_FAKE_PROMPT_RESULT selects what the submission answers (contract tests of 1.7).
        let mode = self.ctx.var_nonempty("MAM_FAKE_PROMPT_RESULT").unwrap_or_else(|| "settled".into());
        if mode == "transport_error" {
            return PromptOutcome::TransportError(format!("fake transport error for {target}"));
        }
        let inbox = self.pane_dir(&pane).join("inbox");
        let mut line = text.replace('\n', " ").into_bytes();
        line.push(b'\n');
        if let Err(e) = sys::append_locked(&inbox, &line) {
            return PromptOutcome::TransportError(format!("cannot write {}: {e}", show_path(&inbox)));
        }
        match mode.as_str() {
            "timeout" => PromptOutcome::Accepted(Accepted::Timeout),
            "stalled" | "agent_prompt_stalled" => PromptOutcome::Accepted(Accepted::Stalled),
            _ => PromptOutcome::Settled,
        }
    }

    fn agent_status(&self, target: &str) -> Status {
        let Some(pane) = self.pane_of_agent(target) else { return Status::Absent };
        if self.agent_pid(&pane).is_none() {
            return Status::Absent;
        }
        read_trim(&self.pane_dir(&pane).join("status")).map(|s| Status::parse(&s)).unwrap_or(Status::Unknown)
    }

    fn read_detection(&self, target: &str) -> PaneResult<String> {
        let pane = self.pane_of_agent(target).ok_or_else(|| PaneError::Failed(format!("no agent {target}")))?;
        Ok(fs::read_to_string(self.pane_dir(&pane).join("screen")).unwrap_or_default())
    }

    fn pane_pids(&self, pane: &str) -> Vec<i32> {
        self.agent_pid(pane).into_iter().collect()
    }

    fn shows_screen(&self) -> bool {
        false
    }

    fn send_keys(&self, target: &str, keys: &str) -> PaneResult<()> {
        let pane = self.pane_of_agent(target).unwrap_or_else(|| target.to_string());
        let d = self.pane_dir(&pane);
        if !d.is_dir() {
            return Err(PaneError::Failed(format!("fake backend: no pane or agent {target}")));
        }
        sys::append_locked(&d.join("keys"), format!("{keys}\n").as_bytes()).map_err(|e| io_err("write", &d, e))
    }

    fn close_pane(&self, pane: &str) -> PaneResult<()> {
        let d = self.pane_dir(pane);
        if !d.is_dir() {
            return Err(PaneError::Failed(format!("fake backend: no pane {pane}")));
        }
        self.kill_pane_agent(pane)?;
        if let Some(name) = read_trim(&d.join("agent")) {
            if read_trim(&self.dir.join("agents").join(&name)).as_deref() == Some(pane) {
                let _ = fs::remove_file(self.dir.join("agents").join(&name));
            }
        }
        fs::remove_dir_all(&d).map_err(|e| io_err("remove", &d, e))
    }

    fn close_workspace(&self, id: &str) -> PaneResult<()> {
        let wd = self.dir.join("ws").join(id);
        if !wd.is_dir() {
            return Err(PaneError::Failed(format!("fake backend: no workspace {id}")));
        }
        for p in self.panes_of(id) {
            self.close_pane(&p)?;
        }
        fs::remove_dir_all(&wd).map_err(|e| io_err("remove", &wd, e))
    }
}
