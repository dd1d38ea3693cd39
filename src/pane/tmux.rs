//! The tmux backend (ORCH 1.6): the same contract on a private server `tmux -L $MAM_TMUX_SOCKET`.
//! A workspace is a session `mam-<n>` carrying `@mam_cwd`/`@mam_label`; its panes are the panes of
//! its single window. Agents are started by typing their POSIX-quoted command line into a pane that
//! is at a shell; the agent name lives in the pane option `@mam_agent`.
//!
//! tmux has no agent lifecycle: the agent's state is read from its screen with the adapter's marks
//! (`Adapter::state_on`: blocked at a start-up dialog, working while a working mark shows, idle at
//! the input line, else `unknown`) while the agent process lives, `absent` otherwise; a prompt is
//! always `Accepted` (delivery is confirmed by the job's own `started`). The agent process is the
//! pane's foreground process, recognised by the adapter's argv rule (node CLIs run as `node`).
//! Every call runs with the denylisted markers removed, since any call may start the server.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use super::contract::{
    canon, is_shell, Accepted, Agent, Backend, Created, Dir, InputLine, ListOutcome, PaneError, PaneInfo, PaneResult,
    PromptOutcome, StateReport, Status, Workspace,
};
use super::knobs::Knobs;
use super::proc::{no_autostart, run_capture, server_env};
use super::sock;
use crate::agents;
use crate::ctx::Ctx;
use crate::sys;
use crate::text::{display_value, one_line, shell_quote, show_path};

/// Default socket name (1.1).
pub const DEFAULT_SOCKET: &str = "mam";

/// The pane border of mam's own server (issue 21): mam's `@mam_state` of the pane when it has one
/// (red while blocked, green while working), else the pane title. An agent may retitle its pane
/// (OSC 2) at any time; the pane option is mam's alone.
pub const BORDER_FORMAT: &str = "#{?#{@mam_state},#{?#{m:blocked*,#{@mam_state}},#[fg=red],#{?#{m:working*,#{@mam_state}},#[fg=green],}}#[bold] #{@mam_state} #[default],#{pane_title}}";

/// The tmux backend on one socket.
pub struct Tmux {
    ctx: Ctx,
    socket: String,
    knobs: Knobs,
}

/// True when tmux's stderr says there is no server: none was running, its socket is stale, or it
/// exited while this call talked to it (the server ends when its last session is killed, and a
/// `list-sessions` racing that exit reads "server exited unexpectedly"; its panes are gone either way).
fn no_server_text(stderr: &str) -> bool {
    stderr.contains("no server running")
        || stderr.contains("server exited unexpectedly")
        || (stderr.contains("error connecting to")
            && (stderr.contains("No such file") || stderr.contains("Connection refused")))
}

fn base(cmd: &str) -> &str {
    cmd.rsplit('/').next().unwrap_or(cmd)
}

struct PaneRow {
    id: String,
    agent: String,
    kind: String,
    command: String,
    /// The pane's first process (its shell).
    pid: i32,
}

/// The foreground process of the terminal `shell` runs on: the leader of its foreground group.
fn foreground_of(shell: i32) -> Option<i32> {
    let pg = sys::proc_tpgid(shell).ok()?;
    (pg > 1).then_some(pg)
}

/// True when `pid` runs the agent of `kind` (the adapter's argv rule, or an executable named so).
fn runs_kind(pid: i32, kind: &str) -> bool {
    let Ok(argv) = sys::proc_cmdline(pid) else { return false };
    if agents::agent_of_argv(&argv).is_some_and(|a| a.kind == kind || a.executable == kind) {
        return true;
    }
    argv.first().is_some_and(|a0| base(&String::from_utf8_lossy(a0)) == kind)
}

impl PaneRow {
    /// The pane's agent process lives in its foreground.
    fn agent_running(&self) -> bool {
        if self.agent.is_empty() || self.kind.is_empty() {
            return false;
        }
        if base(&self.command) == self.kind {
            return true;
        }
        !is_shell(&self.command) && foreground_of(self.pid).is_some_and(|fg| runs_kind(fg, &self.kind))
    }
}

impl Tmux {
    pub fn new(ctx: &Ctx, server: Option<&str>, knobs: Knobs) -> Tmux {
        let socket = server
            .map(str::to_string)
            .or_else(|| ctx.var_nonempty("MAM_TMUX_SOCKET"))
            .unwrap_or_else(|| DEFAULT_SOCKET.to_string());
        Tmux { ctx: ctx.clone(), socket, knobs }
    }

    /// The server name is a plain name and its socket is the user's own (issue 29): checked before
    /// every call, since any call may start or reach a server.
    fn safe(&self) -> PaneResult<()> {
        if let Some(why) = sock::bad_name(&self.socket) {
            return Err(PaneError::Usage(format!("tmux server name '{}' {why}", one_line(&self.socket))));
        }
        sock::check(&sock::tmux_socket(&self.ctx, &self.socket), sys::geteuid())
            .map_err(|e| PaneError::Failed(e.to_string()))
    }

    fn raw(&self, args: &[&str]) -> PaneResult<Output> {
        self.safe()?;
        let mut c = Command::new("tmux");
        c.env_clear().envs(server_env(&self.ctx));
        c.env_remove("TMUX").env_remove("TMUX_PANE");
        // `-u`: without a UTF-8 locale the client prints a format's tabs as `_` (every listing here
        // is tab separated) and the agents' screens lose their `❯` and `›`.
        c.arg("-u").arg("-L").arg(&self.socket).args(args).current_dir(self.ctx.cwd());
        run_capture(&mut c, Duration::from_secs(20), &format!("tmux {}", args.first().copied().unwrap_or("")))
    }

    /// Runs a tmux command that must succeed; returns its stdout.
    fn ok(&self, args: &[&str]) -> PaneResult<String> {
        let out = self.raw(args)?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            if no_server_text(&stderr) {
                return Err(PaneError::Failed(format!("tmux server {} not running", self.socket)));
            }
            return Err(PaneError::Failed(format!(
                "tmux {} on socket {}: {}",
                args.first().copied().unwrap_or(""),
                self.socket,
                one_line(stderr.trim())
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn server_up(&self) -> PaneResult<bool> {
        let out = self.raw(&["list-sessions", "-F", "#{session_name}"])?;
        if out.status.success() {
            return Ok(true);
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        if no_server_text(&stderr) {
            return Ok(false);
        }
        Err(PaneError::Failed(format!("tmux list-sessions on socket {}: {}", self.socket, one_line(stderr.trim()))))
    }

    fn all_panes(&self) -> PaneResult<Vec<PaneRow>> {
        let args =
            ["list-panes", "-a", "-F", "#{pane_id}\t#{@mam_agent}\t#{@mam_kind}\t#{pane_current_command}\t#{pane_pid}"];
        let out = self.raw(&args)?;
        // A server whose last session was just killed lists no session and answers `-a` with "no
        // current target" while it exits (seen in a rollback that closed the only workspace): no panes.
        let text = if out.status.success() {
            String::from_utf8_lossy(&out.stdout).into_owned()
        } else if String::from_utf8_lossy(&out.stderr).contains("no current target") {
            return Ok(Vec::new());
        } else {
            // Asked again for the error in `ok`'s words (no server, or what tmux said).
            self.ok(&args)?
        };
        Ok(text
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split('\t').collect();
                (f.len() >= 5).then(|| PaneRow {
                    id: f[0].into(),
                    agent: f[1].into(),
                    kind: f[2].into(),
                    command: f[3].into(),
                    pid: f[4].trim().parse().unwrap_or(0),
                })
            })
            .collect())
    }

    /// The pane of a live agent named `target` (or `target` itself when it is a pane id with an agent).
    fn find(&self, target: &str) -> Option<PaneRow> {
        self.all_panes().ok()?.into_iter().find(|p| !p.agent.is_empty() && (p.agent == target || p.id == target))
    }

    fn sessions(&self) -> PaneResult<Vec<(u64, String, String, String)>> {
        if !self.server_up()? {
            return Ok(Vec::new());
        }
        let text = self.ok(&["list-sessions", "-F", "#{session_name}\t#{@mam_cwd}\t#{@mam_label}"])?;
        let mut v: Vec<(u64, String, String, String)> = text
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split('\t').collect();
                let n = f.first()?.strip_prefix("mam-")?.parse().ok()?;
                Some((n, f[0].to_string(), f.get(1).unwrap_or(&"").to_string(), f.get(2).unwrap_or(&"").to_string()))
            })
            .collect();
        crate::sort::natural(&mut v);
        Ok(v)
    }

    /// The state the agent's screen shows (`Adapter::state_on`), `unknown` when it shows none.
    fn screen_state(&self, p: &PaneRow) -> Status {
        let Some(ad) = agents::adapter_of_started(&p.kind) else { return Status::Unknown };
        match self.ok(&["capture-pane", "-p", "-t", &p.id]) {
            Ok(screen) => ad.state_on(&screen).map(Status::parse).unwrap_or(Status::Unknown),
            Err(_) => Status::Unknown,
        }
    }

    /// The pane row of `pane` (any pane, agent or not).
    fn pane_row(&self, pane: &str) -> Option<PaneRow> {
        self.all_panes().ok()?.into_iter().find(|p| p.id == pane)
    }

    /// Waits until the screen took a paste in: it changed from `before` and then held still for
    /// 150 ms, at most 1.5 s. An Enter sent right behind a long bracketed paste reaches some CLIs in
    /// the same read and is lost (the real qwen 0.15 kept 1 prompt in 4 unsubmitted in its input).
    fn paste_settle(&self, pane: &str, before: String) {
        let start = Instant::now();
        let (mut last, mut since, mut changed) = (before, Instant::now(), false);
        while start.elapsed() < Duration::from_millis(1500) {
            sys::sleep(Duration::from_millis(50));
            let now = self.ok(&["capture-pane", "-p", "-t", pane]).unwrap_or_default();
            if now != last {
                (last, since, changed) = (now, Instant::now(), true);
            } else if changed && since.elapsed() >= Duration::from_millis(150) {
                return;
            }
        }
    }

    fn pane_command(&self, pane: &str) -> PaneResult<String> {
        Ok(self.ok(&["display-message", "-p", "-t", pane, "#{pane_current_command}"])?.trim().to_string())
    }

    fn env_flags(env: &[(String, String)]) -> Vec<String> {
        env.iter().flat_map(|(k, v)| ["-e".to_string(), format!("{k}={v}")]).collect()
    }
}

impl Backend for Tmux {
    fn name(&self) -> &'static str {
        "tmux"
    }

    fn server(&self) -> String {
        self.socket.clone()
    }

    fn has_lifecycle(&self) -> bool {
        false
    }

    /// The server starts with the first session; nothing to do unless MAM_NO_AUTOSTART forbids that.
    fn ensure_server(&self) -> PaneResult<()> {
        if !self.server_up()? && no_autostart(&self.ctx) {
            return Err(PaneError::NoServer(format!("server {} not running (MAM_NO_AUTOSTART=1)", self.socket)));
        }
        Ok(())
    }

    fn list_agents(&self) -> ListOutcome {
        match self.server_up() {
            Ok(false) => return ListOutcome::NoServer,
            Err(e) => return ListOutcome::Unknown(e.to_string()),
            Ok(true) => {}
        }
        match self.all_panes() {
            Ok(rows) => ListOutcome::Confirmed(
                rows.into_iter()
                    .filter(PaneRow::agent_running)
                    .map(|p| {
                        let status = self.screen_state(&p).word().to_string();
                        Agent { name: p.agent, pane: p.id, kind: p.kind, status }
                    })
                    .collect(),
            ),
            // The server may have exited between the two calls (it ends with its last session):
            // asked once more, a server that is gone is `NoServer`, not unknown.
            Err(e) => match self.server_up() {
                Ok(false) => ListOutcome::NoServer,
                _ => ListOutcome::Unknown(e.to_string()),
            },
        }
    }

    fn list_workspaces(&self, cwd: &Path) -> PaneResult<Vec<Workspace>> {
        let want = canon(cwd).to_string_lossy().into_owned();
        let mut out = Vec::new();
        for (_, name, wcwd, label) in self.sessions()? {
            if wcwd != want {
                continue;
            }
            let target = name.clone();
            let text = self.ok(&[
                "list-panes",
                "-t",
                &target,
                "-F",
                "#{pane_id}\t#{@mam_agent}\t#{pane_current_command}\t#{pane_left}\t#{pane_top}",
            ])?;
            let panes = text
                .lines()
                .filter_map(|l| {
                    let f: Vec<&str> = l.split('\t').collect();
                    if f.len() < 5 {
                        return None;
                    }
                    let shell = is_shell(f[2]);
                    let pos = f[3].parse().ok().zip(f[4].parse().ok());
                    Some(PaneInfo {
                        id: f[0].into(),
                        has_agent: !f[1].is_empty() && !shell,
                        shell_foreground: shell,
                        pos,
                    })
                })
                .collect();
            out.push(Workspace { id: name, label, panes });
        }
        Ok(out)
    }

    fn create_workspace(&self, cwd: &Path, label: Option<&str>, env: &[(String, String)]) -> PaneResult<Created> {
        self.ensure_server()?;
        if !cwd.is_dir() {
            return Err(PaneError::Usage(format!("no such directory {}", show_path(cwd))));
        }
        let n = self.sessions()?.iter().map(|s| s.0).max().unwrap_or(0) + 1;
        let name = format!("mam-{n}");
        let dir = cwd.to_string_lossy().into_owned();
        let mut args: Vec<String> = ["new-session", "-d", "-s", &name, "-x", "200", "-y", "50", "-c", &dir]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(Self::env_flags(env));
        args.extend(["-P".into(), "-F".into(), "#{pane_id}".into()]);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let pane = self.ok(&refs)?.trim().to_string();
        let target = name.clone();
        self.ok(&["set-option", "-t", &target, "@mam_cwd", &canon(cwd).to_string_lossy()])?;
        self.ok(&["set-option", "-t", &target, "@mam_label", label.unwrap_or("")])?;
        Ok(Created { workspace: name, pane })
    }

    fn split(&self, pane: &str, dir: Dir, cwd: &Path, env: &[(String, String)]) -> PaneResult<String> {
        let d = cwd.to_string_lossy().into_owned();
        let flag = if dir == Dir::Right { "-h" } else { "-v" };
        let mut args: Vec<String> =
            ["split-window", "-d", "-t", pane, flag, "-c", &d].iter().map(|s| s.to_string()).collect();
        args.extend(Self::env_flags(env));
        args.extend(["-P".into(), "-F".into(), "#{pane_id}".into()]);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        Ok(self.ok(&refs)?.trim().to_string())
    }

    fn rename_workspace(&self, id: &str, label: &str) -> PaneResult<()> {
        self.ok(&["set-option", "-t", id, "@mam_label", label]).map(|_| ())
    }

    fn start_agent(&self, name: &str, kind: &str, pane: &str, args: &[String]) -> PaneResult<()> {
        let now = self.pane_command(pane)?;
        if !is_shell(&now) {
            return Err(PaneError::Failed(format!(
                "pane {pane} is not at a shell (it runs '{}'); refusing to type into it",
                one_line(&now)
            )));
        }
        if self.find(name).is_some_and(|p| p.agent_running()) {
            return Err(PaneError::Usage(format!("agent name {name} is already in use on socket {}", self.socket)));
        }
        let exe_base = base(kind).to_string();
        self.ok(&["set-option", "-p", "-t", pane, "@mam_agent", name])?;
        self.ok(&["set-option", "-p", "-t", pane, "@mam_kind", &exe_base])?;
        // Resolved on the caller's PATH: tmux panes run login shells, whose profile may reset PATH.
        let builtin = agents::adapter_of_started(kind).filter(|a| a.is_builtin());
        let exe = match builtin {
            // The pretend agent is this very binary (issue 32).
            Some(_) => std::env::current_exe()
                .map_err(|e| PaneError::Failed(format!("cannot find the mam binary: {e}")))?
                .to_string_lossy()
                .into_owned(),
            None => super::proc::on_path(&self.ctx, kind)
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or(kind.to_string()),
        };
        let mut line = shell_quote(&exe);
        if builtin.is_some() {
            line.push(' ');
            line.push_str(agents::PRETEND_SUBCOMMAND);
        }
        for a in args {
            line.push(' ');
            line.push_str(&shell_quote(a));
        }
        self.ok(&["send-keys", "-t", pane, "-l", &line])?;
        self.ok(&["send-keys", "-t", pane, "Enter"])?;
        let deadline = Instant::now() + Duration::from_millis(self.knobs.start_timeout_ms as u64);
        let stable_for = Duration::from_millis(self.knobs.tmux_stable_ms);
        // A kind whose input line is known is ready at that line: placement reads the screen until it
        // shows it, answering the start-up dialogs on the way (A58). Here: its process is up.
        let by_screen = agents::adapter_of_started(kind).is_some_and(|a| a.has_ready_line());
        let mut last: Option<(String, Instant)> = None;
        let mut seen = false;
        loop {
            let row = self.pane_row(pane);
            if row.as_ref().is_some_and(PaneRow::agent_running) {
                seen = true;
                if by_screen {
                    return Ok(());
                }
                let screen = self.ok(&["capture-pane", "-p", "-t", pane])?;
                match &last {
                    Some((s, since)) if *s == screen => {
                        if since.elapsed() >= stable_for {
                            return Ok(());
                        }
                    }
                    _ => last = Some((screen, Instant::now())),
                }
            } else {
                last = None;
                // Back at the shell after the agent ran: it exited (claude offline without its
                // onboarding state exits within 3 s). Fail now with its last words.
                if seen && row.as_ref().is_some_and(|r| is_shell(&r.command)) {
                    let screen = self.ok(&["capture-pane", "-p", "-t", pane]).unwrap_or_default();
                    return Err(PaneError::Exited(format!(
                        "agent {name} ({kind}) exited during start in pane {pane}; last screen lines: {}",
                        crate::text::screen_tail(&screen, 5)
                    )));
                }
            }
            if Instant::now() >= deadline {
                return Err(PaneError::Failed(format!(
                    "agent {name} not ready in pane {pane} within {} ms (MAM_AGENT_START_TIMEOUT_MS)",
                    self.knobs.start_timeout_ms
                )));
            }
            sys::sleep(Duration::from_millis(50));
        }
    }

    fn prompt(&self, target: &str, text: &str, _wait_ms: u32) -> PromptOutcome {
        let Some(p) = self.find(target).filter(PaneRow::agent_running) else {
            return PromptOutcome::TransportError(format!("agent {target} is not running on socket {}", self.socket));
        };
        let tmpdir = self.ctx.path_var("TMPDIR").unwrap_or_else(|| std::path::PathBuf::from("/tmp"));
        let tmp = tmpdir.join(format!("mam-prompt-{}", sys::random_hex(8).unwrap_or_default()));
        let buffer = format!("mam-{}", sys::random_hex(6).unwrap_or_default());
        if let Err(e) = sys::atomic_write(&tmp, text.as_bytes()) {
            return PromptOutcome::TransportError(format!("cannot write {}: {e}", show_path(&tmp)));
        }
        let tmp_s = tmp.to_string_lossy().into_owned();
        let before = self.ok(&["capture-pane", "-p", "-t", &p.id]).unwrap_or_default();
        let r = self
            .ok(&["load-buffer", "-b", &buffer, &tmp_s])
            .and_then(|_| self.ok(&["paste-buffer", "-p", "-d", "-b", &buffer, "-t", &p.id]))
            .map(|_| self.paste_settle(&p.id, before))
            .and_then(|_| self.ok(&["send-keys", "-t", &p.id, "Enter"]));
        let _ = std::fs::remove_file(&tmp);
        match r {
            Ok(_) => PromptOutcome::Accepted(Accepted::Timeout),
            Err(e) => PromptOutcome::TransportError(e.to_string()),
        }
    }

    fn agent_status(&self, target: &str) -> Status {
        match self.find(target) {
            Some(p) if p.agent_running() => self.screen_state(&p),
            _ => Status::Absent,
        }
    }

    fn input_line(&self, target: &str) -> InputLine {
        let Some(p) = self.find(target).filter(PaneRow::agent_running) else { return InputLine::Unknown };
        let Some(ad) = agents::adapter_of_started(&p.kind) else { return InputLine::Unknown };
        match self.ok(&["capture-pane", "-p", "-t", &p.id]) {
            Ok(screen) => InputLine::of(ad, &screen, true),
            Err(_) => InputLine::Unknown,
        }
    }

    fn read_detection(&self, target: &str) -> PaneResult<String> {
        let p = self
            .find(target)
            .ok_or_else(|| PaneError::Failed(format!("no agent {target} on socket {}", self.socket)))?;
        self.ok(&["capture-pane", "-p", "-t", &p.id])
    }

    fn send_keys(&self, target: &str, keys: &str) -> PaneResult<()> {
        let pane = self.find(target).map(|p| p.id).unwrap_or_else(|| target.to_string());
        let key = if keys.eq_ignore_ascii_case("enter") { "Enter" } else { keys };
        self.ok(&["send-keys", "-t", &pane, key]).map(|_| ())
    }

    fn read_pane(&self, pane: &str) -> Option<String> {
        self.ok(&["capture-pane", "-p", "-J", "-t", pane]).ok()
    }

    fn pane_pids(&self, pane: &str) -> Vec<i32> {
        self.pane_row(pane).map(|p| vec![p.pid]).unwrap_or_default()
    }

    fn close_pane(&self, pane: &str) -> PaneResult<()> {
        self.ok(&["kill-pane", "-t", pane]).map(|_| ())
    }

    fn close_workspace(&self, id: &str) -> PaneResult<()> {
        self.ok(&["kill-session", "-t", id]).map(|_| ())
    }

    fn shared_title(&self) -> bool {
        true
    }

    /// One tmux call: the border shows `@mam_state` (set on this server only, every time: the server
    /// may be new), the pane gets `@mam_state` and its title. `select-pane -T` does not change the
    /// active pane. Never starts a server.
    fn report_state(&self, pane: &str, _kind: &str, r: &StateReport) -> PaneResult<()> {
        if !self.server_up()? {
            return Err(PaneError::Failed(format!("tmux server {} not running", self.socket)));
        }
        // What agents wrote, shown on the border and in the title (issue 29): `text::display_value`.
        let text = display_value(&format!("{}: {}", r.state.word(), r.message), 200);
        let title = display_value(&r.title, 80);
        self.ok(&[
            "set-option",
            "-g",
            "pane-border-status",
            "top",
            ";",
            "set-option",
            "-g",
            "pane-border-format",
            BORDER_FORMAT,
            ";",
            "set-option",
            "-p",
            "-t",
            pane,
            "@mam_state",
            &text,
            ";",
            "select-pane",
            "-t",
            pane,
            "-T",
            &title,
        ])
        .map(|_| ())
    }

    fn release_state(&self, pane: &str, _kind: &str, _seq: u64) -> PaneResult<()> {
        if !self.server_up()? {
            return Ok(());
        }
        self.ok(&["set-option", "-p", "-u", "-t", pane, "@mam_state", ";", "select-pane", "-t", pane, "-T", ""])
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::no_server_text;

    #[test]
    fn a_server_that_is_gone_or_going_is_no_server() {
        assert!(no_server_text("no server running on /tmp/tmux-0/x\n"));
        assert!(no_server_text("server exited unexpectedly\n"));
        assert!(no_server_text("error connecting to /tmp/tmux-0/x (No such file or directory)\n"));
        assert!(no_server_text("error connecting to /tmp/tmux-0/x (Connection refused)\n"));
        assert!(!no_server_text("error connecting to /tmp/tmux-0/x (Permission denied)\n"));
        assert!(!no_server_text("can't find pane: %9\n"));
    }
}
