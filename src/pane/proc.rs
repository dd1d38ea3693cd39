//! Process helpers of the process-backed backends (ORCH 1.3): the bootstrap environment denylist,
//! `MAM_NO_AUTOSTART`, finding a tool on the context's PATH, the environment a server may inherit,
//! `run_capture`, one bounded run of a backend CLI, and a pane's process tree with `reap`, which
//! ends what of it outlives its pane (gemini ignores SIGHUP; README "What a pane orchestrator must
//! handle" 7).
//!
//! Nothing here knows a backend's commands or a job; it never prints.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::contract::{PaneError, PaneResult};
use crate::ctx::{ChildRole, Ctx};
use crate::sys;

/// True when `name` is a per-session agent runtime marker a bootstrapped server must not inherit
/// (1.3): a session-id variable or another marker of the adapter table (`agents`), exact names, no
/// prefix match, so user configuration such as `CLAUDE_PROJECT_DIR` still passes.
pub fn denied(name: &str) -> bool {
    crate::agents::is_runtime_marker(name)
}

/// One process, named by its pid and its start time (so a reused pid is never taken for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Proc {
    pub pid: i32,
    pub start: u64,
}

impl Proc {
    /// `pid` as it runs now (None: gone, a zombie, or not a process we may judge).
    pub fn now(pid: i32) -> Option<Proc> {
        match sys::proc_start_ticks(pid) {
            Ok((start, false)) if pid > 1 => Some(Proc { pid, start }),
            _ => None,
        }
    }

    /// Still the same live process.
    pub fn alive(self) -> bool {
        Proc::now(self.pid) == Some(self)
    }
}

/// Every live process descended from `roots` (the roots included), never pid 1 or below, never this
/// process or one of its ancestors (a `stop` run from inside the pane it closes).
pub fn tree_of(roots: &[i32]) -> Vec<Proc> {
    let mut mine = vec![std::process::id() as i32];
    let mut cur = mine[0];
    while let Ok(pp) = sys::proc_ppid(cur) {
        if pp <= 1 || mine.contains(&pp) {
            break;
        }
        mine.push(pp);
        cur = pp;
    }
    let parents: Vec<(i32, i32)> =
        sys::list_pids().unwrap_or_default().into_iter().filter_map(|p| Some((p, sys::proc_ppid(p).ok()?))).collect();
    let mut want: Vec<i32> = roots.iter().copied().filter(|p| *p > 1).collect();
    let mut i = 0;
    while i < want.len() {
        let parent = want[i];
        for (p, pp) in &parents {
            if *pp == parent && !want.contains(p) {
                want.push(*p);
            }
        }
        i += 1;
    }
    let mut out: Vec<Proc> = want.into_iter().filter(|p| !mine.contains(p)).filter_map(Proc::now).collect();
    crate::sort::natural(&mut out);
    out.dedup();
    out
}

/// The pane's process tree when its roots are verifiably the pane's: each root runs a shell or an
/// agent CLI and works in `cwd` (the pane's directory). A backend that names pids it does not own
/// (a mock, a stale answer) gets nothing killed.
pub fn pane_tree(roots: &[i32], cwd: &Path) -> Vec<Proc> {
    let want = super::contract::canon(cwd);
    let verified: Vec<i32> = roots
        .iter()
        .copied()
        .filter(|&pid| {
            let Ok(argv) = sys::proc_cmdline(pid) else { return false };
            let shell = argv.first().is_some_and(|a| super::contract::is_shell(&String::from_utf8_lossy(a)));
            let here = sys::proc_cwd(pid).is_ok_and(|c| super::contract::canon(&c) == want);
            (shell || crate::agents::argv_is_agent(&argv)) && here
        })
        .collect();
    tree_of(&verified)
}

/// Ends the processes of `procs` that still live (each checked against its start time): SIGTERM,
/// then SIGKILL for what is left after `grace`, each step confirmed within its deadline. Returns the
/// pids that survived both.
pub fn reap(procs: &[Proc], grace: Duration) -> Vec<i32> {
    let live = |ps: &[Proc]| ps.iter().copied().filter(|p| p.alive()).collect::<Vec<_>>();
    let wait_gone = |ps: &[Proc], limit: Duration| {
        let deadline = Instant::now() + limit;
        let mut left = live(ps);
        while !left.is_empty() && Instant::now() < deadline {
            sys::sleep(Duration::from_millis(20));
            left = live(&left);
        }
        left
    };
    let mut left = live(procs);
    for p in &left {
        let _ = sys::kill(p.pid, libc::SIGTERM);
    }
    left = wait_gone(&left, grace);
    for p in &left {
        let _ = sys::kill(p.pid, libc::SIGKILL);
    }
    wait_gone(&left, grace).into_iter().map(|p| p.pid).collect()
}

/// MAM_NO_AUTOSTART=1 (only the literal `1`).
pub fn no_autostart(ctx: &Ctx) -> bool {
    ctx.var("MAM_NO_AUTOSTART").as_deref() == Some("1")
}

/// True when `tool` is an executable file on the context's PATH.
pub fn on_path(ctx: &Ctx, tool: &str) -> Option<PathBuf> {
    let path = ctx.var("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(tool)).find(|p| p.is_file())
}

/// The knobs of one orchestrating command (a delegation's budgets and delivery, create's start-up,
/// the board, the verdict hook, the review loop): a server a `create` starts must not keep them,
/// or every later pane of that server would inherit one command's settings (issue 30: a
/// `MAM_ACK_TIMEOUT_S=90 mam create` was seen in the tmux server's environment).
const PER_COMMAND: &[&str] = &[
    "MAM_ACK_TIMEOUT_S",
    "MAM_DELEGATE_TIMEOUT_S",
    "MAM_HEARTBEAT_SEC",
    "MAM_HEARTBEAT_MISSES",
    "MAM_INJECT_ACK_GRACE_S",
    "SKS_DELIVERY_GRACE_S",
    "MAM_AGENT_START_TIMEOUT_MS",
    "MAM_WAITING_FOR_YOU_S",
    "MAM_BOARD",
    "MAM_BOARD_REFRESH_S",
    "MAM_ON_VERDICT",
    "MAM_ON_VERDICT_TIMEOUT_S",
];
const PER_COMMAND_PREFIXES: &[&str] = &["MAM_SKS_", "MAM_STARTUP_DIALOG_", "MAM_LOOP_", "MAM_VERDICT_"];

/// True for a knob of one orchestrating command (`PER_COMMAND`).
pub fn per_command_knob(name: &str) -> bool {
    PER_COMMAND.contains(&name) || PER_COMMAND_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// The environment for a child that may start a server: the context's minus the secrets (an agent
/// pane inherits the server's environment), the denylist, the herdr addressing variables (1.3) and
/// the knobs of the orchestrating command that starts it.
pub fn server_env(ctx: &Ctx) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    ctx.child_env_for(ChildRole::Agent)
        .into_iter()
        .filter(|(k, _)| {
            let k = k.to_string_lossy();
            !denied(&k) && k != "HERDR_SOCKET_PATH" && k != "HERDR_SESSION" && !per_command_knob(&k)
        })
        .collect()
}

/// Runs `cmd` to completion within `limit`, draining both pipes; a timeout kills it and names `what`.
/// The child leads its own process group, so a descendant that still holds a pipe at the deadline is
/// killed with it (a daemon that left the group and closed its pipes is not touched); the readers
/// are waited for under the same deadline, never longer.
pub fn run_capture(cmd: &mut std::process::Command, limit: Duration, what: &str) -> PaneResult<std::process::Output> {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    use std::sync::mpsc;
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    let deadline = Instant::now() + limit;
    let mut child = sys::spawn(cmd).map_err(|e| PaneError::Failed(format!("cannot run {what}: {e}")))?;
    // (stream, bytes) per read; an empty chunk is that stream's end.
    let (tx, rx) = mpsc::channel::<(usize, Vec<u8>)>();
    let streams: [Option<Box<dyn Read + Send>>; 2] = [
        child.stdout.take().map(|s| Box::new(s) as Box<dyn Read + Send>),
        child.stderr.take().map(|s| Box::new(s) as Box<dyn Read + Send>),
    ];
    let mut open = [false, false];
    for (i, s) in streams.into_iter().enumerate() {
        let Some(mut s) = s else { continue };
        let tx = tx.clone();
        open[i] = std::thread::Builder::new()
            .name("pane-capture".into())
            .spawn(move || {
                let mut buf = [0u8; 8192];
                loop {
                    match s.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => {
                            if tx.send((i, buf[..n].to_vec())).is_err() {
                                return;
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(_) => break,
                    }
                }
                let _ = tx.send((i, Vec::new()));
            })
            .is_ok();
    }
    drop(tx);
    let pgid = child.id() as i32;
    let mut bufs: [Vec<u8>; 2] = [Vec::new(), Vec::new()];
    let mut status = None;
    let mut take = |msg: (usize, Vec<u8>), open: &mut [bool; 2]| {
        if msg.1.is_empty() {
            open[msg.0] = false;
        } else {
            bufs[msg.0].extend_from_slice(&msg.1);
        }
    };
    loop {
        if status.is_none() {
            match child.try_wait() {
                Ok(st) => status = st,
                Err(e) => {
                    let _ = sys::kill(-pgid, libc::SIGKILL);
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(PaneError::Failed(format!("{what}: wait failed: {e}")));
                }
            }
        }
        if status.is_some() && !open.contains(&true) {
            break;
        }
        let now = Instant::now();
        if now >= deadline {
            // The child, or a descendant in its group holding a pipe, outlived the limit.
            let _ = sys::kill(-pgid, libc::SIGKILL);
            if status.is_none() {
                let _ = child.kill();
                let _ = child.wait();
                return Err(PaneError::Failed(format!("{what}: timed out after {} ms", limit.as_millis())));
            }
            // The child finished: keep what its readers got until the group is gone (bounded).
            let grace = Instant::now() + Duration::from_millis(200);
            while open.contains(&true) {
                match rx.recv_timeout(grace.saturating_duration_since(Instant::now())) {
                    Ok(m) => take(m, &mut open),
                    Err(_) => break,
                }
            }
            break;
        }
        match rx.recv_timeout((deadline - now).min(Duration::from_millis(5))) {
            Ok(m) => take(m, &mut open),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => open = [false, false],
        }
    }
    let [stdout, stderr] = bufs;
    Ok(std::process::Output { status: status.expect("the child was reaped"), stdout, stderr })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_is_reaped_and_never_includes_us() {
        // sh (root) -> sleep, plus a sleep that ignores SIGTERM: both end, the root too.
        let mut c = std::process::Command::new("sh");
        c.args(["-c", "trap '' TERM; sleep 30 & sleep 30; wait"]);
        let mut child = sys::spawn(&mut c).unwrap();
        let root = child.id() as i32;
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut tree = tree_of(&[root]);
        while tree.len() < 3 && Instant::now() < deadline {
            sys::sleep(Duration::from_millis(20));
            tree = tree_of(&[root]);
        }
        assert_eq!(tree.len(), 3, "{tree:?}");
        assert!(tree_of(&[std::process::id() as i32, 1, 0]).iter().all(|p| p.pid != std::process::id() as i32));
        let t0 = Instant::now();
        assert!(reap(&tree, Duration::from_millis(500)).is_empty());
        assert!(t0.elapsed() < Duration::from_secs(3));
        let _ = child.wait();
        assert!(tree.iter().all(|p| !p.alive()));
    }

    fn capture_within(script: &str, limit: Duration) -> (PaneResult<std::process::Output>, Duration) {
        let script = script.to_string();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let started = Instant::now();
            let mut c = std::process::Command::new("sh");
            c.args(["-c", &script]);
            let r = run_capture(&mut c, limit, "sh");
            let _ = tx.send((r, started.elapsed()));
        });
        rx.recv_timeout(Duration::from_secs(10)).expect("run_capture returned within 10 s")
    }

    fn gone(pid: i32) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if !matches!(sys::proc_start_ticks(pid), Ok((_, false))) {
                return true;
            }
            sys::sleep(Duration::from_millis(10));
        }
        false
    }

    #[test]
    fn run_capture_is_bounded_when_a_descendant_holds_the_pipe() {
        // The child exits at once; a backgrounded sleep keeps its stdout open.
        let (r, took) = capture_within("sleep 30 & echo $!; echo done", Duration::from_secs(1));
        let out = r.unwrap();
        assert!(took < Duration::from_secs(3), "took {took:?}");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success() && text.ends_with("done\n"), "{text:?}");
        let sleeper: i32 = text.lines().next().unwrap().parse().unwrap();
        assert!(gone(sleeper), "the sleep holding the pipe was killed");
        // The child itself hangs: a timeout, and its whole group is gone.
        let (r, took) = capture_within("sleep 30 & echo $!; sleep 30", Duration::from_secs(1));
        let e = r.expect_err("timed out");
        assert!(e.to_string().contains("timed out after 1000 ms"), "{e}");
        assert!(took < Duration::from_secs(3), "took {took:?}");
    }

    #[test]
    fn denylist_is_exact() {
        assert!(denied("CLAUDECODE"));
        assert!(!denied("CLAUDE_PROJECT_DIR"));
        assert!(!denied("CLAUDECODE_X"));
    }
}
