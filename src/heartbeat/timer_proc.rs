//! The heartbeat timer as a process (CORE 7.2, 7.4, 7.6, A16, A18): its pidfile, the identity check
//! that must hold before any signal, the drain-then-kill stop, and the nearest agent-CLI ancestor.
//!
//! Nothing here signals a process whose argv and start time have not been checked against the
//! pidfile: a recycled pid is never killed.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::sys;

/// `<registry>/<job_id>.heartbeat.pid`.
pub fn pidfile_path(registry: &Path, job_id: &str) -> PathBuf {
    registry.join(format!("{job_id}.heartbeat.pid"))
}

/// `<registry>/<job_id>.heartbeat.lock` (L2).
pub fn lifecycle_lock_path(registry: &Path, job_id: &str) -> PathBuf {
    registry.join(format!("{job_id}.heartbeat.lock"))
}

/// The pidfile's content (CORE 7.2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pidfile {
    pub pid: i32,
    pub job_id: String,
    pub attempt: u64,
    pub dispatch_token: String,
    pub start_ticks: u64,
    pub started_at: String,
}

impl Pidfile {
    /// Reads the pidfile; a missing file is `Ok(None)`, an unparsable one is `Ok(None)` too (a torn
    /// file cannot exist, since it is written atomically, but a foreign one is treated as stale).
    pub fn read(path: &Path) -> io::Result<Option<Pidfile>> {
        match fs::read(path) {
            Ok(b) => Ok(serde_json::from_slice(&b).ok()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes the pidfile atomically.
    pub fn write(&self, path: &Path) -> io::Result<()> {
        let mut bytes = serde_json::to_vec_pretty(self).map_err(io::Error::other)?;
        bytes.push(b'\n');
        sys::atomic_write(path, &bytes)
    }
}

/// True when `args` is a timer for `job_id`: it contains `heartbeat run` and `--job-id <job_id>`.
pub fn argv_is_timer(args: &[Vec<u8>], job_id: &str) -> bool {
    let has_run = args.windows(2).any(|w| w[0] == b"heartbeat" && w[1] == b"run");
    let has_job = args.windows(2).any(|w| w[0] == b"--job-id" && w[1] == job_id.as_bytes());
    has_run && has_job
}

/// `is_our_timer` (CORE 7.2): the process exists and is not a zombie, its argv names this job's
/// timer, and its start time equals the pidfile's.
pub fn is_our_timer(pf: &Pidfile) -> bool {
    let Ok((ticks, zombie)) = sys::proc_start_ticks(pf.pid) else {
        return false;
    };
    if zombie || ticks != pf.start_ticks {
        return false;
    }
    sys::proc_cmdline(pf.pid).is_ok_and(|args| argv_is_timer(&args, &pf.job_id))
}

/// What `stop` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// No pidfile.
    Nothing,
    /// A pidfile that did not name our timer: removed, nothing signalled.
    Stale,
    /// SIGTERM, and the process was gone within the drain.
    Drained { pid: i32 },
    /// Still alive after the drain: SIGKILLed.
    Killed { pid: i32 },
}

fn gone(pf: &Pidfile) -> bool {
    !is_our_timer(pf)
}

/// stop_timer's signal part (CORE 7.4). The caller holds L2. Removes the pidfile in every case
/// where it existed.
pub fn stop(registry: &Path, job_id: &str, drain: Duration) -> io::Result<Stopped> {
    let path = pidfile_path(registry, job_id);
    let Some(pf) = Pidfile::read(&path)? else {
        if path.exists() {
            fs::remove_file(&path)?;
            return Ok(Stopped::Stale);
        }
        return Ok(Stopped::Nothing);
    };
    if !is_our_timer(&pf) {
        remove_if_exists(&path)?;
        return Ok(Stopped::Stale);
    }
    let _ = sys::kill(pf.pid, libc::SIGTERM);
    let deadline = Instant::now() + drain;
    let outcome = loop {
        if gone(&pf) {
            break Stopped::Drained { pid: pf.pid };
        }
        if Instant::now() >= deadline {
            let _ = sys::kill(pf.pid, libc::SIGKILL);
            let kill_deadline = Instant::now() + Duration::from_secs(1);
            while !gone(&pf) && Instant::now() < kill_deadline {
                sys::sleep(Duration::from_millis(10));
            }
            break Stopped::Killed { pid: pf.pid };
        }
        sys::sleep(
            Duration::from_millis(10)
                .min(deadline.saturating_duration_since(Instant::now()))
                .max(Duration::from_millis(1)),
        );
    };
    remove_if_exists(&path)?;
    Ok(outcome)
}

fn remove_if_exists(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// `nearest_agent_ancestor()` (A18): the nearest ancestor of `pid` (exclusive) that is an agent CLI
/// by the adapter table's recognition rule (`agents::agent_of_argv`, CORE 7.6, A58).
pub fn nearest_agent_ancestor(pid: i32) -> Option<i32> {
    crate::agents::nearest_agent_ancestor(pid).map(|(p, _)| p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &[&str]) -> Vec<Vec<u8>> {
        s.iter().map(|a| a.as_bytes().to_vec()).collect()
    }

    #[test]
    fn timer_argv_shape() {
        assert!(argv_is_timer(&argv(&["/x/mam", "heartbeat", "run", "--job-id", "j1", "--attempt", "1"]), "j1"));
        assert!(!argv_is_timer(&argv(&["/x/mam", "heartbeat", "run", "--job-id", "j10"]), "j1"));
        assert!(!argv_is_timer(&argv(&["sleep", "100"]), "j1"));
        assert!(!argv_is_timer(&argv(&["bash", "-c", "mam heartbeat run --job-id j1"]), "j1"));
    }

    #[test]
    fn h12_agent_argv_forms() {
        use crate::agents::argv_is_agent;
        assert!(argv_is_agent(&argv(&["claude", "--resume"])));
        assert!(argv_is_agent(&argv(&["/usr/local/bin/codex"])));
        assert!(argv_is_agent(&argv(&["node", "/opt/lib/node_modules/.bin/claude", "x"])));
        assert!(argv_is_agent(&argv(&["/usr/bin/python3", "/home/u/bin/hermes"])));
        assert!(!argv_is_agent(&argv(&["node", "server.js"])));
        assert!(!argv_is_agent(&argv(&["bash", "claude"])));
        assert!(!argv_is_agent(&argv(&["claudette"])));
        assert!(!argv_is_agent(&[]));
    }

    /// Spawns `bash` under `argv0` running `script`, which prints the pid of a `sleep` it starts.
    fn spawn_as(argv0: &str, script: &str) -> (std::process::Child, i32) {
        use std::io::BufRead;
        let mut child = std::process::Command::new("bash")
            .args(["-c", &format!("exec -a {argv0} bash {script}")])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
        (child, line.trim().parse().unwrap())
    }

    #[test]
    fn h12_nearest_claude_ancestor_is_found_in_both_forms() {
        let dir = std::env::temp_dir().join(format!("mam-h12-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let script = dir.join("claude");
        fs::write(&script, "sleep 30 & echo $!; wait\n").unwrap();
        // argv[0] form: bash renamed to `claude` runs the script.
        let (mut c1, sleep1) = spawn_as("claude", &script.display().to_string());
        // interpreter form: `node <dir>/claude`.
        let (mut c2, sleep2) = spawn_as("node", &script.display().to_string());
        let other = dir.join("helper");
        fs::write(&other, "sleep 30 & echo $!; wait\n").unwrap();
        let (mut c3, sleep3) = spawn_as("node", &other.display().to_string());
        let got = (nearest_agent_ancestor(sleep1), nearest_agent_ancestor(sleep2), nearest_agent_ancestor(sleep3));
        for (c, s) in [(&mut c1, sleep1), (&mut c2, sleep2), (&mut c3, sleep3)] {
            let _ = sys::kill(s, libc::SIGKILL);
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = fs::remove_dir_all(&dir);
        assert_eq!(got.0, Some(c1.id() as i32));
        assert_eq!(got.1, Some(c2.id() as i32));
        // `node helper` is no agent; whatever runs the tests may be one, but never c3 itself.
        assert_ne!(got.2, Some(c3.id() as i32));
    }

    fn fake_timer(job: &str, script: &str) -> (std::process::Child, Pidfile) {
        use std::io::BufRead;
        // The script prints a line once its traps are set, so no signal can arrive before them.
        let mut child = std::process::Command::new("bash")
            .args(["-c", script])
            .args(["heartbeat", "run", "--job-id", job])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut ready = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut ready).unwrap();
        assert_eq!(ready, "ready\n");
        let pid = child.id() as i32;
        // /proc may lag the fork by a moment: read the start ticks once they are there.
        let deadline = Instant::now() + Duration::from_secs(5);
        let ticks = loop {
            if let Ok((t, _)) = sys::proc_start_ticks(pid) {
                if sys::proc_cmdline(pid).is_ok_and(|a| argv_is_timer(&a, job)) {
                    break t;
                }
            }
            assert!(Instant::now() < deadline, "fake timer never appeared");
            std::thread::sleep(Duration::from_millis(5));
        };
        let pf = Pidfile {
            pid,
            job_id: job.into(),
            attempt: 1,
            dispatch_token: "t".into(),
            start_ticks: ticks,
            started_at: "x".into(),
        };
        (child, pf)
    }

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("mam-stop-{name}-{}", std::process::id()));
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn h4_recycled_pid_is_not_signalled_and_pidfile_removed() {
        let reg = scratch("h4");
        let mut sleeper = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = sleeper.id() as i32;
        let (ticks, _) = sys::proc_start_ticks(pid).unwrap();
        let pf = Pidfile {
            pid,
            job_id: "j".into(),
            attempt: 1,
            dispatch_token: "t".into(),
            start_ticks: ticks,
            started_at: "x".into(),
        };
        pf.write(&pidfile_path(&reg, "j")).unwrap();
        assert_eq!(stop(&reg, "j", Duration::from_millis(200)).unwrap(), Stopped::Stale);
        assert!(sleeper.try_wait().unwrap().is_none(), "an unrelated sleep was signalled");
        assert!(!pidfile_path(&reg, "j").exists());
        // Our timer's argv but another start time: also stale, also untouched.
        let (mut t, mut pf) = fake_timer("j", "echo ready; sleep 30; :");
        pf.start_ticks += 1;
        pf.write(&pidfile_path(&reg, "j")).unwrap();
        assert_eq!(stop(&reg, "j", Duration::from_millis(200)).unwrap(), Stopped::Stale);
        assert!(t.try_wait().unwrap().is_none());
        for c in [&mut sleeper, &mut t] {
            let _ = c.kill();
            let _ = c.wait();
        }
        assert_eq!(stop(&reg, "j", Duration::from_millis(200)).unwrap(), Stopped::Nothing);
        let _ = fs::remove_dir_all(&reg);
    }

    #[test]
    fn stop_drains_a_cooperative_timer_and_kills_a_stubborn_one() {
        let reg = scratch("drain");
        let (mut t, pf) = fake_timer("d", "trap 'exit 0' TERM; echo ready; while :; do sleep 0.02; done");
        pf.write(&pidfile_path(&reg, "d")).unwrap();
        // Reap on a thread so the drained process does not linger as a zombie of this test.
        let reaper = std::thread::spawn(move || t.wait());
        let started = Instant::now();
        assert_eq!(stop(&reg, "d", Duration::from_secs(5)).unwrap(), Stopped::Drained { pid: pf.pid });
        assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
        reaper.join().unwrap().unwrap();
        assert!(!pidfile_path(&reg, "d").exists());

        let (t, pf) = fake_timer("k", "trap '' TERM; echo ready; while :; do sleep 0.02; done");
        pf.write(&pidfile_path(&reg, "k")).unwrap();
        let mut t = t;
        let reaper = std::thread::spawn(move || t.wait());
        assert!(is_our_timer(&pf), "not ours before stop");
        assert_eq!(stop(&reg, "k", Duration::from_millis(300)).unwrap(), Stopped::Killed { pid: pf.pid });
        let status = reaper.join().unwrap().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        let _ = fs::remove_dir_all(&reg);
    }
}
