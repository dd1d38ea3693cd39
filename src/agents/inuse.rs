//! `conversation_in_use(uuid)` (ORCH 6.3, A46): a conversation is in use when one of the caller's
//! session-id variables equals it, when a live process outside the purge's own helper chain names
//! it in its arguments (POSIX `ps -eo pid=,ppid=,args=`), when a live claude session file names it,
//! or when something holds any of its artifact paths open (`lsof -t -- <paths>`, else on Linux a
//! `/proc/*/fd` scan, else fail closed).
//!
//! The helper chain is the purge's own process and its ancestors up to, not including, the nearest
//! agent-CLI ancestor (CORE 7.6): that ancestor and everything above it count, so an orchestrator
//! cannot purge its own live conversation. The decisions are pure functions over the process table
//! (`argv_holder`) and lsof's answer (`lsof_verdict`); the runs of `ps` and `lsof` are bounded.
//! Never prints.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{agent_of_argv, session_id_vars};
use crate::ctx::Ctx;
use crate::sys;

/// Why a conversation is in use: the holder's pid (when known) and the rule that found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub pid: Option<i32>,
    /// `argv`, `session-var`, `session-file`, `lsof`, `proc-fd`, or why the check failed closed.
    pub reason: String,
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.pid {
            Some(p) => write!(f, "in use: pid {p} ({})", self.reason),
            None => write!(f, "in use: pid - ({})", self.reason),
        }
    }
}

fn held(pid: Option<i32>, reason: impl Into<String>) -> Holder {
    Holder { pid, reason: reason.into() }
}

/// How long one `ps` or `lsof` run may take.
const TOOL_LIMIT: Duration = Duration::from_secs(10);

/// Runs `cmd` with stdout captured (stderr discarded) within `limit`: (exit code, stdout).
fn capture(cmd: &mut Command, limit: Duration) -> std::io::Result<(Option<i32>, String)> {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null());
    let mut child = sys::spawn(cmd)?;
    let mut out = child.stdout.take().expect("piped stdout");
    let reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = out.read_to_end(&mut buf);
        buf
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out"));
        }
        sys::sleep(Duration::from_millis(5));
    };
    let buf = reader.join().unwrap_or_default();
    Ok((status.code(), String::from_utf8_lossy(&buf).into_owned()))
}

/// The tool's path on the context's PATH.
fn tool(ctx: &Ctx, name: &str) -> Option<PathBuf> {
    let path = ctx.var("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

/// One line of `ps -eo pid=,ppid=,args=`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proc {
    pub pid: i32,
    pub ppid: i32,
    pub args: String,
}

/// Parses `ps -eo pid=,ppid=,args=` output (lines that do not parse are skipped).
pub fn parse_ps(text: &str) -> Vec<Proc> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.trim_start().splitn(2, char::is_whitespace);
            let pid = it.next()?.parse().ok()?;
            let rest = it.next()?.trim_start();
            let mut it = rest.splitn(2, char::is_whitespace);
            let ppid = it.next()?.parse().ok()?;
            let args = it.next().unwrap_or("").trim().to_string();
            Some(Proc { pid, ppid, args })
        })
        .collect()
}

fn is_agent_args(args: &str) -> bool {
    let v: Vec<Vec<u8>> = args.split_whitespace().map(|s| s.as_bytes().to_vec()).collect();
    agent_of_argv(&v).is_some()
}

/// The purge's helper chain: `own` and its ancestors up to, not including, the nearest agent CLI.
pub fn helper_chain(procs: &[Proc], own: i32) -> BTreeSet<i32> {
    let by_pid: BTreeMap<i32, &Proc> = crate::sort::ordered(procs.iter().map(|p| (p.pid, p)));
    let mut chain = BTreeSet::new();
    let mut cur = own;
    for _ in 0..128 {
        if cur <= 1 || !chain.insert(cur) {
            break;
        }
        let Some(p) = by_pid.get(&cur) else { break };
        let parent = p.ppid;
        if by_pid.get(&parent).is_some_and(|pp| is_agent_args(&pp.args)) {
            break;
        }
        cur = parent;
    }
    chain
}

/// 6.3 rule 2 over a process table: the first process outside the helper chain whose arguments
/// contain the uuid (case-insensitive).
pub fn argv_holder(procs: &[Proc], own: i32, uuid: &str) -> Option<i32> {
    let chain = helper_chain(procs, own);
    let u = uuid.to_ascii_lowercase();
    procs.iter().find(|p| !chain.contains(&p.pid) && p.args.to_ascii_lowercase().contains(&u)).map(|p| p.pid)
}

/// lsof's answer (A46): rc 0 with pids = in use, rc 1 with no output = free, anything else = in use.
pub fn lsof_verdict(rc: Option<i32>, stdout: &str, own: i32) -> Option<Holder> {
    let pids: Vec<i32> = stdout.split_whitespace().filter_map(|s| s.parse().ok()).filter(|p| *p != own).collect();
    match rc {
        // lsof exits 1 also when it found holders of some paths but not of others.
        Some(_) if !pids.is_empty() => Some(held(pids.first().copied(), "lsof")),
        // Only our own pid: nothing else holds them.
        Some(0) if !stdout.trim().is_empty() => None,
        Some(1) if stdout.trim().is_empty() => None,
        Some(c) => Some(held(pids.first().copied(), format!("lsof exit {c}"))),
        None => Some(held(None, "lsof killed by a signal")),
    }
}

/// 6.3 as a whole for `uuid` (canonical), given the artifact files that exist and the pids live
/// claude session files name. `None`: free.
pub fn conversation_in_use(ctx: &Ctx, uuid: &str, files: &[PathBuf], session_pids: &[i32]) -> Option<Holder> {
    let own = std::process::id() as i32;
    // 1. The caller's session-id variables.
    for v in session_id_vars() {
        if ctx.var(v).is_some_and(|x| x.trim().eq_ignore_ascii_case(uuid)) {
            let pid = super::nearest_agent_ancestor(own).map(|(p, _)| p).unwrap_or(own);
            return Some(held(Some(pid), "session-var"));
        }
    }
    // 2. Live processes naming it, outside the helper chain.
    let Some(ps) = tool(ctx, "ps") else { return Some(held(None, "no ps on PATH")) };
    let mut c = Command::new(ps);
    c.args(["-eo", "pid=,ppid=,args="]).env_clear().env("LC_ALL", "C").env("COLUMNS", "100000");
    match capture(&mut c, TOOL_LIMIT) {
        Ok((Some(0), text)) => {
            if let Some(pid) = argv_holder(&parse_ps(&text), own, uuid) {
                return Some(held(Some(pid), "argv"));
            }
        }
        Ok((rc, _)) => return Some(held(None, format!("ps exit {}", rc.map_or("?".into(), |c| c.to_string())))),
        Err(e) => return Some(held(None, format!("ps failed: {e}"))),
    }
    // A live claude session file naming the uuid.
    if let Some(p) = session_pids.iter().find(|p| **p > 1 && sys::process_exists(**p) && !zombie(**p)) {
        return Some(held(Some(*p), "session-file"));
    }
    // 3. Holders of any artifact path.
    if files.is_empty() {
        return None;
    }
    match tool(ctx, "lsof") {
        Some(lsof) => {
            let mut c = Command::new(lsof);
            c.arg("-t").arg("--").args(files).env_clear().env("LC_ALL", "C");
            match capture(&mut c, TOOL_LIMIT) {
                Ok((rc, out)) => lsof_verdict(rc, &out, own),
                Err(e) => Some(held(None, format!("lsof failed: {e}"))),
            }
        }
        None => proc_fd_holder(files, own),
    }
}

fn zombie(pid: i32) -> bool {
    sys::proc_start_ticks(pid).is_ok_and(|(_, z)| z)
}

/// Without lsof (A46): on Linux, every `/proc/<pid>/fd/*` link compared with the artifact files;
/// elsewhere (no `/proc`) fail closed.
fn proc_fd_holder(files: &[PathBuf], own: i32) -> Option<Holder> {
    let Ok(pids) = sys::list_pids() else {
        return Some(held(None, "no lsof and no /proc to scan"));
    };
    if !Path::new("/proc/self/fd").is_dir() {
        return Some(held(None, "no lsof and no /proc to scan"));
    }
    let want: BTreeSet<PathBuf> = crate::sort::ordered(
        files.iter().flat_map(|f| [f.clone(), std::fs::canonicalize(f).unwrap_or_else(|_| f.clone())]),
    );
    for pid in pids.into_iter().filter(|p| *p != own) {
        let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { continue };
        for e in rd.flatten() {
            if std::fs::read_link(e.path()).is_ok_and(|t| want.contains(&t)) {
                return Some(held(Some(pid), "proc-fd"));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const U: &str = "0123abcd-89ab-4def-8123-456789abcdef";

    fn p(pid: i32, ppid: i32, args: &str) -> Proc {
        Proc { pid, ppid, args: args.into() }
    }

    #[test]
    fn ps_lines_parse() {
        let t = "    1     0 /sbin/init\n  42     1 bash -c mam agents purge auto x\n bad line\n  7 1\n";
        assert_eq!(parse_ps(t), vec![p(1, 0, "/sbin/init"), p(42, 1, "bash -c mam agents purge auto x"), p(7, 1, "")]);
    }

    #[test]
    fn the_helper_chain_stops_below_the_nearest_agent() {
        // init <- claude --resume U <- bash -c "... U" <- mam (own)
        let procs = vec![
            p(1, 0, "/sbin/init"),
            p(10, 1, &format!("claude --resume {U}")),
            p(20, 10, &format!("bash -c mam agents purge auto {U}")),
            p(30, 20, &format!("mam agents purge auto {U}")),
        ];
        assert_eq!(helper_chain(&procs, 30), BTreeSet::from([20, 30]));
        assert_eq!(argv_holder(&procs, 30, U), Some(10));
        // Without the agent ancestor the whole chain is the helper's own.
        let procs: Vec<Proc> = procs
            .into_iter()
            .filter(|x| x.pid != 10)
            .map(|mut x| {
                if x.pid == 20 {
                    x.ppid = 1;
                }
                x
            })
            .collect();
        assert_eq!(argv_holder(&procs, 30, U), None);
        // Another process naming it (uppercase too) holds it.
        let mut more = procs.clone();
        more.push(p(99, 1, &format!("vim /x/{}.db", U.to_uppercase())));
        assert_eq!(argv_holder(&more, 30, U), Some(99));
    }

    #[test]
    fn lsof_rules() {
        assert_eq!(lsof_verdict(Some(1), "", 5), None);
        assert_eq!(lsof_verdict(Some(0), "77\n", 5).unwrap().to_string(), "in use: pid 77 (lsof)");
        assert_eq!(lsof_verdict(Some(1), "garbage", 5).unwrap().reason, "lsof exit 1");
        assert_eq!(lsof_verdict(Some(1), "78\n", 5).unwrap().to_string(), "in use: pid 78 (lsof)");
        assert_eq!(lsof_verdict(Some(2), "", 5).unwrap().to_string(), "in use: pid - (lsof exit 2)");
        assert_eq!(lsof_verdict(None, "", 5).unwrap().pid, None);
    }
}
