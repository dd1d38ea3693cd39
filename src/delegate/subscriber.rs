//! The job's subscriber (ORCH 3.2 step 7, A9, A10): a `mam watch` child started before the injection,
//! whose stdout lines reach the wrapper through a channel, so a pass can sleep until the next line or
//! its own next check. The wrapper, not the subscriber, judges delivery and idleness; watch gets
//! budgets large enough never to end on its own first.
//!
//! Architecture Invariant: a `Subscriber` is reaped on every path (TERM, then KILL, confirmed gone)
//! by `reap` or by `Drop`, and it dies with the wrapper's thread (`PR_SET_PDEATHSIG`) when the wrapper
//! itself is killed. It never prints: watch's stderr is kept as a short tail for diagnostics.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::{self, BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::sys;

/// How long a TERMed subscriber may take before KILL (watch honours TERM within 1 s, CORE 8.3).
const TERM_GRACE: Duration = Duration::from_secs(2);
/// Lines of watch's stderr kept for a diagnostic.
const STDERR_TAIL: usize = 8;

/// What to start: `mam watch --job-id ID --registry-dir D --ack-timeout A --idle-timeout I
/// [--timeout W] [--remote]` with `DELEGATE_JOB_LOGS_DIR` pinned to the wrapper's log root.
#[derive(Debug, Clone)]
pub struct Spec {
    pub exe: PathBuf,
    pub env: Vec<(OsString, OsString)>,
    pub job_id: String,
    pub registry: PathBuf,
    pub logs: PathBuf,
    pub ack_timeout_s: u64,
    pub idle_timeout_s: u64,
    pub timeout_s: Option<u64>,
    pub remote: bool,
}

impl Spec {
    pub fn argv(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = vec!["watch".into(), "--job-id".into(), self.job_id.clone().into()];
        a.push("--registry-dir".into());
        a.push(self.registry.clone().into());
        a.push("--ack-timeout".into());
        a.push(self.ack_timeout_s.clamp(1, u32::MAX as u64).to_string().into());
        a.push("--idle-timeout".into());
        a.push(self.idle_timeout_s.clamp(1, u32::MAX as u64).to_string().into());
        if let Some(t) = self.timeout_s {
            a.push("--timeout".into());
            a.push(t.clamp(1, u32::MAX as u64).to_string().into());
        }
        if self.remote {
            a.push("--remote".into());
        }
        a
    }
}

/// One message from the stdout reader.
#[derive(Debug)]
pub enum Msg {
    Line(String),
    /// stdout closed: the subscriber exited (or is about to).
    Eof,
}

/// A running `mam watch` child.
pub struct Subscriber {
    child: Option<Child>,
    rx: Receiver<Msg>,
    readers: Vec<JoinHandle<()>>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    eof: bool,
    status: Option<i32>,
}

impl Subscriber {
    pub fn spawn(spec: &Spec) -> io::Result<Subscriber> {
        let mut c = Command::new(&spec.exe);
        c.args(spec.argv()).env_clear().envs(spec.env.iter().cloned());
        c.env("DELEGATE_JOB_LOGS_DIR", &spec.logs);
        c.current_dir("/").stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        sys::set_parent_death_signal(&mut c, libc::SIGTERM);
        let mut child = sys::spawn(&mut c)?;
        let (tx, rx) = mpsc::channel();
        let mut readers = Vec::new();
        if let Some(out) = child.stdout.take() {
            readers.push(std::thread::spawn(move || {
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(Msg::Line(line)).is_err() {
                        return;
                    }
                }
                let _ = tx.send(Msg::Eof);
            }));
        }
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        if let Some(err) = child.stderr.take() {
            let tail = stderr.clone();
            readers.push(std::thread::spawn(move || {
                let mut r = BufReader::new(err);
                let mut buf = Vec::new();
                loop {
                    buf.clear();
                    match r.by_ref().take(64 * 1024).read_until(b'\n', &mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {
                            let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
                            if t.len() == STDERR_TAIL {
                                t.pop_front();
                            }
                            t.push_back(String::from_utf8_lossy(&buf).trim_end().to_string());
                        }
                    }
                }
            }));
        }
        Ok(Subscriber { child: Some(child), rx, readers, stderr, eof: false, status: None })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Waits up to `limit` for the next line; `None` on timeout or after the end of its output.
    pub fn next_line(&mut self, limit: Duration) -> Option<String> {
        if self.eof {
            if !limit.is_zero() {
                sys::sleep(limit);
            }
            return None;
        }
        match self.rx.recv_timeout(limit) {
            Ok(Msg::Line(l)) => Some(l),
            Ok(Msg::Eof) | Err(RecvTimeoutError::Disconnected) => {
                self.eof = true;
                None
            }
            Err(RecvTimeoutError::Timeout) => None,
        }
    }

    /// The exit code once the subscriber has ended on its own (128 + signal for a signal death).
    pub fn exited(&mut self) -> Option<i32> {
        if self.status.is_none() {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    use std::os::unix::process::ExitStatusExt;
                    self.status = Some(st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0)));
                }
            }
        }
        self.status
    }

    /// The last non-empty stderr line, without its `ERROR: ` and `watch <id>: ` prefixes: what the
    /// subscriber died of, as one message (issue 32: not its retries' warnings joined).
    pub fn last_error(&self) -> String {
        let t = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
        let last = t.iter().rev().find(|l| !l.trim().is_empty()).map_or("", |l| l.trim());
        let msg = crate::text::without_error_prefix(last);
        let msg = msg.strip_prefix("watch ").and_then(|m| m.split_once(": ")).map_or(msg, |(_, rest)| rest);
        msg.to_string()
    }

    /// TERM, then KILL after a grace, and wait: returns true once the process is confirmed gone.
    pub fn reap(&mut self) -> bool {
        let Some(mut c) = self.child.take() else { return true };
        let gone = match c.try_wait() {
            Ok(Some(_)) => true,
            _ => {
                let _ = sys::kill(c.id() as i32, libc::SIGTERM);
                let deadline = Instant::now() + TERM_GRACE;
                loop {
                    match c.try_wait() {
                        Ok(Some(_)) => break true,
                        Ok(None) if Instant::now() < deadline => sys::sleep(Duration::from_millis(10)),
                        _ => {
                            let _ = c.kill();
                            break c.wait().is_ok();
                        }
                    }
                }
            }
        };
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        gone
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        self.reap();
    }
}
