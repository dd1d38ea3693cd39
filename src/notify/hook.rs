//! One supervised run of the verdict hook (`mam notify run`): `sh -c "$MAM_ON_VERDICT"` in a process
//! group of its own, stdin closed, stdout and stderr drained by two threads that keep only the last
//! `TAIL_BYTES` (a hook that prints 10 MB costs nothing but the reading), a deadline after which the
//! whole group gets SIGTERM, then SIGKILL a second later, and whatever of the group is still there
//! when the shell exits is killed too, so nothing of a hook outlives its run.
//!
//! It prints nothing and writes no file: `run` returns an `End`, and `End::line` is the log line the
//! command layer appends to notify.log.

use std::ffi::OsString;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::sys;
use crate::text::one_line;

/// How much of the hook's output is kept for the log line.
pub const TAIL_BYTES: usize = 2048;
/// The SIGTERM grace before SIGKILL at the deadline.
const TERM_GRACE: Duration = Duration::from_secs(1);
/// How long the drains may take once the group is gone (a descendant that left the group may keep
/// the pipes open; the run does not wait for it).
const DRAIN_WAIT: Duration = Duration::from_secs(1);
const POLL: Duration = Duration::from_millis(20);

/// How a hook run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The shell exited with this code (0: success).
    Exited(i32),
    /// The shell was ended by a signal it did not get from us.
    Signalled(i32),
    /// The deadline passed: the group was killed.
    Killed,
    /// `sh` could not be started.
    NotStarted(String),
}

/// A finished run: its outcome, how long it took, how much it printed and the end of its output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct End {
    pub outcome: Outcome,
    pub elapsed: Duration,
    pub printed: u64,
    pub tail: String,
}

impl End {
    pub fn ok(&self) -> bool {
        self.outcome == Outcome::Exited(0)
    }

    /// `hook exit 0 in 0.1 s` / `hook failed (exit 3) in 0.2 s: <last line>` / `hook killed at its
    /// 2 s deadline` / `hook not started (...)`, with how much it printed when that was a lot.
    pub fn line(&self, deadline: Duration) -> String {
        let took = format!("{:.1} s", self.elapsed.as_secs_f64());
        let last = self.tail.lines().rev().map(str::trim).find(|l| !l.is_empty()).unwrap_or("");
        let last = if last.is_empty() { String::new() } else { format!(": {}", one_line(last)) };
        let mut l = match &self.outcome {
            Outcome::Exited(0) => format!("hook exit 0 in {took}"),
            Outcome::Exited(c) => format!("hook failed (exit {c}) in {took}{last}"),
            Outcome::Signalled(s) => format!("hook failed ({}) in {took}{last}", sys::signal_name(*s)),
            Outcome::Killed => format!("hook killed at its {} s deadline{last}", deadline.as_secs()),
            Outcome::NotStarted(why) => format!("hook not started ({})", one_line(why)),
        };
        if self.printed as usize > TAIL_BYTES {
            l.push_str(&format!(" (printed {} bytes; the last {TAIL_BYTES} kept)", self.printed));
        }
        l
    }
}

/// Reads a pipe to its end, counting every byte and keeping the last `TAIL_BYTES`.
fn drain(mut r: impl Read + Send + 'static, tx: mpsc::Sender<(u64, Vec<u8>)>) -> Option<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("hook-drain".into())
        .spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            let mut tail: Vec<u8> = Vec::new();
            let mut n_total = 0u64;
            while let Ok(n) = r.read(&mut buf) {
                if n == 0 {
                    break;
                }
                n_total += n as u64;
                tail.extend_from_slice(&buf[..n]);
                if tail.len() > TAIL_BYTES {
                    tail.drain(..tail.len() - TAIL_BYTES);
                }
            }
            let _ = tx.send((n_total, tail));
        })
        .ok()
}

fn status_outcome(st: ExitStatus) -> Outcome {
    use std::os::unix::process::ExitStatusExt;
    match (st.code(), st.signal()) {
        (Some(c), _) => Outcome::Exited(c),
        (None, Some(s)) => Outcome::Signalled(s),
        (None, None) => Outcome::Exited(1),
    }
}

/// Kills what is left of group `pgid`: TERM, up to `grace` for it to go, then KILL.
fn end_group(child: &mut Child, pgid: i32, grace: Duration) {
    if !sys::group_alive(pgid) {
        return;
    }
    let _ = sys::kill(-pgid, libc::SIGTERM);
    let until = Instant::now() + grace;
    while sys::group_alive(pgid) && Instant::now() < until {
        let _ = child.try_wait();
        sys::sleep(POLL);
    }
    if sys::group_alive(pgid) {
        let _ = sys::kill(-pgid, libc::SIGKILL);
        let until = Instant::now() + Duration::from_secs(2);
        while sys::group_alive(pgid) && Instant::now() < until {
            let _ = child.try_wait();
            sys::sleep(POLL);
        }
    }
}

/// Runs `command` through `sh -c` with exactly `env`, from `cwd`, for at most `deadline`.
pub fn run(command: &str, env: &[(OsString, OsString)], cwd: &Path, deadline: Duration) -> End {
    let started = Instant::now();
    let mut c = Command::new("sh");
    c.arg("-c").arg(command).env_clear().envs(env.iter().cloned()).current_dir(cwd);
    c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    sys::set_new_session(&mut c);
    let mut child = match sys::spawn(&mut c) {
        Ok(ch) => ch,
        Err(e) => {
            return End {
                outcome: Outcome::NotStarted(format!("sh: {e}")),
                elapsed: started.elapsed(),
                printed: 0,
                tail: String::new(),
            }
        }
    };
    let pgid = child.id() as i32;
    let (tx, rx) = mpsc::channel();
    let mut drains = Vec::new();
    if let Some(out) = child.stdout.take() {
        drains.extend(drain(out, tx.clone()));
    }
    if let Some(err) = child.stderr.take() {
        drains.extend(drain(err, tx.clone()));
    }
    drop(tx);
    let until = started + deadline;
    let outcome = loop {
        match child.try_wait() {
            Ok(Some(st)) => break status_outcome(st),
            Ok(None) if Instant::now() >= until => {
                end_group(&mut child, pgid, TERM_GRACE);
                let _ = child.kill();
                let _ = child.wait();
                break Outcome::Killed;
            }
            Ok(None) => sys::sleep(POLL),
            Err(e) => break Outcome::NotStarted(format!("wait: {e}")),
        }
    };
    // The shell is gone; what it left behind in its group goes too.
    end_group(&mut child, pgid, Duration::from_millis(200));
    let elapsed = started.elapsed();
    let mut printed = 0;
    let mut tail = Vec::new();
    let wait_until = Instant::now() + DRAIN_WAIT;
    for _ in 0..drains.len() {
        match rx.recv_timeout(wait_until.saturating_duration_since(Instant::now())) {
            Ok((n, t)) => {
                printed += n;
                tail.extend_from_slice(&t);
            }
            Err(_) => break,
        }
    }
    for d in drains {
        if d.is_finished() {
            let _ = d.join();
        }
    }
    let keep = tail.len().saturating_sub(TAIL_BYTES);
    End { outcome, elapsed, printed, tail: String::from_utf8_lossy(&tail[keep..]).into_owned() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> Vec<(OsString, OsString)> {
        vec![("PATH".into(), "/usr/bin:/bin".into()), ("X".into(), "one".into())]
    }

    #[test]
    fn exit_codes_output_and_the_deadline() {
        let e = run("printf '%s' \"$X\"", &env(), Path::new("/"), Duration::from_secs(10));
        assert_eq!((e.outcome.clone(), e.tail.as_str()), (Outcome::Exited(0), "one"));
        assert!(e.ok() && e.line(Duration::from_secs(10)).starts_with("hook exit 0 in "));
        let e = run("echo oops >&2; exit 3", &env(), Path::new("/"), Duration::from_secs(10));
        assert_eq!(e.outcome, Outcome::Exited(3));
        assert!(e.line(Duration::from_secs(10)).ends_with(": oops"), "{}", e.line(Duration::from_secs(10)));
        let t = Instant::now();
        let e = run("sleep 30 & sleep 30", &env(), Path::new("/"), Duration::from_millis(300));
        assert_eq!(e.outcome, Outcome::Killed);
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert_eq!(e.line(Duration::from_secs(2)), "hook killed at its 2 s deadline");
        let e = run("head -c 300000 /dev/zero | tr '\\0' x", &env(), Path::new("/"), Duration::from_secs(10));
        assert_eq!((e.printed, e.tail.len()), (300_000, TAIL_BYTES));
        assert!(e.line(Duration::from_secs(1)).contains("printed 300000 bytes"));
    }
}
