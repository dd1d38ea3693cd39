//! The TLS shim (CORE 3.4, A22): an `openssl s_client` child carrying MQTT bytes over its stdin and
//! stdout, with stderr drained on its own thread into a bounded tail for error messages.
//!
//! Verification is always on. The password never appears in the child's argv or environment (it
//! travels only inside CONNECT). The child is ended (stdin shut, up to 1 s grace, kill, reap) on
//! every path, including drop. Spawning goes through `sys::spawn`.

use std::collections::{HashMap, VecDeque};
use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::config::{Endpoint, MqttConfig};
use crate::sys;

/// Lines of stderr kept for error messages.
const TAIL_LINES: usize = 20;

/// Why the shim could not start.
#[derive(Debug)]
pub enum SpawnError {
    NotFound(String),
    Other(String, io::Error),
    /// `s_client -help` did not finish before the connect deadline.
    Timeout(String),
}

/// True when `s_client -help` of `program` lists `-nocommands` (probed once per program and process).
/// The probe runs in its own process group under the connect `deadline`: on expiry the group is
/// killed and reaped and the connect fails in the `openssl probe` phase.
fn supports_nocommands(
    program: &OsString,
    env: &[(OsString, OsString)],
    deadline: Instant,
) -> Result<bool, SpawnError> {
    use std::os::unix::process::CommandExt;
    static PROBED: OnceLock<Mutex<HashMap<OsString, bool>>> = OnceLock::new();
    let map = PROBED.get_or_init(Mutex::default);
    if let Some(v) = map.lock().unwrap_or_else(|e| e.into_inner()).get(program) {
        return Ok(*v);
    }
    let mut cmd = Command::new(program);
    cmd.args(["s_client", "-help"]).env_clear().envs(env.iter().cloned()).process_group(0);
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = sys::spawn(&mut cmd).map_err(|e| spawn_error(program, e))?;
    let (tx, rx) = mpsc::channel::<Vec<u8>>();
    let readers: Vec<Box<dyn Read + Send>> = [
        child.stdout.take().map(|s| Box::new(s) as Box<dyn Read + Send>),
        child.stderr.take().map(|s| Box::new(s) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .flatten()
    .collect();
    let n = readers.len();
    for mut r in readers {
        let tx = tx.clone();
        let _ = std::thread::Builder::new().name("tls-probe".into()).spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            let _ = tx.send(v);
        });
    }
    drop(tx);
    let mut text = Vec::new();
    let mut got = 0;
    let timed_out = loop {
        if got == n {
            break false;
        }
        let now = Instant::now();
        if now >= deadline {
            break true;
        }
        match rx.recv_timeout(deadline - now) {
            Ok(v) => {
                text.extend(v);
                got += 1;
            }
            Err(RecvTimeoutError::Timeout) => break true,
            Err(RecvTimeoutError::Disconnected) => break false,
        }
    };
    if timed_out {
        let _ = sys::kill(-(child.id() as i32), libc::SIGKILL);
        let _ = child.kill();
        let _ = child.wait();
        return Err(SpawnError::Timeout(program.to_string_lossy().into_owned()));
    }
    // Both pipes are at EOF: the probe has exited or is about to; a descendant that keeps running
    // without the pipes is ended with its group.
    let _ = sys::kill(-(child.id() as i32), libc::SIGKILL);
    let _ = child.wait();
    let found = String::from_utf8_lossy(&text).split_whitespace().any(|w| w == "-nocommands");
    map.lock().unwrap_or_else(|e| e.into_inner()).insert(program.clone(), found);
    Ok(found)
}

fn spawn_error(program: &OsString, e: io::Error) -> SpawnError {
    let name = program.to_string_lossy().into_owned();
    if e.kind() == io::ErrorKind::NotFound {
        SpawnError::NotFound(name)
    } else {
        SpawnError::Other(name, e)
    }
}

/// The s_client arguments for broker `ep` of `cfg` (CORE 3.4, A22).
pub fn shim_args(cfg: &MqttConfig, ep: &Endpoint, nocommands: bool) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec!["s_client".into(), "-connect".into(), ep.addr().into()];
    if ep.host_is_ip() {
        a.extend(["-verify_ip".into(), ep.host.clone().into()]);
    } else {
        a.extend(["-servername".into(), ep.host.clone().into(), "-verify_hostname".into(), ep.host.clone().into()]);
    }
    a.extend(["-verify_return_error".into(), "-quiet".into()]);
    if nocommands {
        a.push("-nocommands".into());
    }
    if let Some(ca) = &cfg.ca_file {
        a.extend(["-CAfile".into(), ca.into()]);
    }
    a
}

/// A running `openssl s_client`.
pub struct TlsShim {
    child: Child,
    stdin: Option<ChildStdin>,
    rx: Receiver<Vec<u8>>,
    eof: bool,
    pending: VecDeque<u8>,
    tail: Arc<Mutex<VecDeque<String>>>,
    threads: Vec<JoinHandle<()>>,
    closed: bool,
}

impl TlsShim {
    /// Starts the shim; the `-nocommands` probe is bounded by `deadline` (the connect's).
    pub fn spawn(cfg: &MqttConfig, ep: &Endpoint, deadline: Instant) -> Result<TlsShim, SpawnError> {
        let nocommands = supports_nocommands(&cfg.openssl, &cfg.child_env, deadline)?;
        let mut cmd = Command::new(&cfg.openssl);
        cmd.args(shim_args(cfg, ep, nocommands)).env_clear().envs(cfg.child_env.iter().cloned());
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = sys::spawn(&mut cmd).map_err(|e| spawn_error(&cfg.openssl, e))?;
        let stdin = child.stdin.take();
        let mut stdout = child.stdout.take();
        let mut stderr = child.stderr.take();
        let (tx, rx) = mpsc::channel();
        let tail: Arc<Mutex<VecDeque<String>>> = Arc::default();
        let mut threads = Vec::new();
        let out_thread = std::thread::Builder::new().name("tls-shim-out".into()).spawn(move || {
            let Some(out) = stdout.as_mut() else { return };
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                match out.read(&mut buf) {
                    Ok(0) => return,
                    Ok(n) => {
                        if tx.send(buf[..n].to_vec()).is_err() {
                            return;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => return,
                }
            }
        });
        let tail2 = Arc::clone(&tail);
        let err_thread = std::thread::Builder::new().name("tls-shim-err".into()).spawn(move || {
            let Some(err) = stderr.as_mut() else { return };
            let mut acc = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                let n = match err.read(&mut buf) {
                    Ok(0) | Err(_) => 0,
                    Ok(n) => n,
                };
                if n == 0 {
                    if !acc.is_empty() {
                        push_line(&tail2, &acc);
                    }
                    return;
                }
                acc.extend_from_slice(&buf[..n]);
                while let Some(i) = acc.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = acc.drain(..=i).collect();
                    push_line(&tail2, &line[..line.len() - 1]);
                }
                // Bound a line without a newline as well.
                if acc.len() > 4096 {
                    push_line(&tail2, &acc);
                    acc.clear();
                }
            }
        });
        let mut shim = TlsShim {
            child,
            stdin,
            rx,
            eof: false,
            pending: VecDeque::new(),
            tail,
            threads: Vec::new(),
            closed: false,
        };
        for t in [out_thread, err_thread] {
            match t {
                Ok(h) => threads.push(h),
                Err(e) => {
                    shim.threads = threads;
                    shim.close();
                    return Err(SpawnError::Other("thread".into(), e));
                }
            }
        }
        shim.threads = threads;
        Ok(shim)
    }

    /// Reads what is available within `timeout`: `Ok(None)` on timeout, `Ok(Some(0))` at EOF.
    pub fn read_timeout(&mut self, buf: &mut [u8], timeout: Duration) -> io::Result<Option<usize>> {
        if self.pending.is_empty() && !self.eof {
            match self.rx.recv_timeout(timeout) {
                Ok(chunk) => self.pending.extend(chunk),
                Err(RecvTimeoutError::Timeout) => return Ok(None),
                Err(RecvTimeoutError::Disconnected) => self.eof = true,
            }
        }
        if self.pending.is_empty() {
            return Ok(Some(0));
        }
        let n = buf.len().min(self.pending.len());
        for (i, b) in self.pending.drain(..n).enumerate() {
            buf[i] = b;
        }
        Ok(Some(n))
    }

    pub fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self.stdin.as_mut() {
            Some(s) => s.write_all(bytes).and_then(|_| s.flush()),
            None => Err(io::Error::new(io::ErrorKind::NotConnected, "TLS shim closed")),
        }
    }

    /// True when the child's stdout is at EOF and nothing is buffered (non-blocking check).
    pub fn at_eof(&mut self) -> bool {
        if self.pending.is_empty() && !self.eof {
            match self.rx.try_recv() {
                Ok(chunk) => self.pending.extend(chunk),
                Err(mpsc::TryRecvError::Empty) => {}
                Err(mpsc::TryRecvError::Disconnected) => self.eof = true,
            }
        }
        self.eof && self.pending.is_empty()
    }

    /// After the child's stdout ended: waits (bounded) for it to exit and its stderr to drain, then
    /// returns the verification error line if there is one, else the last stderr line.
    pub fn failure_detail(&mut self, limit: Duration) -> (Option<String>, Option<String>) {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                break;
            }
            sys::sleep(Duration::from_millis(10));
        }
        // The stderr thread ends at EOF, which follows the child's exit.
        while Instant::now() < deadline && self.threads.iter().any(|t| !t.is_finished()) {
            sys::sleep(Duration::from_millis(5));
        }
        let tail = self.tail.lock().unwrap_or_else(|e| e.into_inner());
        let verify = tail.iter().find(|l| is_verify_failure(l)).cloned();
        let last = tail.iter().rev().find(|l| !l.trim().is_empty()).cloned();
        (verify, last)
    }

    /// Shuts stdin, waits up to 1 s for the child, then kills and reaps it and joins the threads.
    pub fn close(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut exited = false;
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                exited = true;
                break;
            }
            sys::sleep(Duration::from_millis(5));
        }
        if !exited {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for TlsShim {
    fn drop(&mut self) {
        self.close();
    }
}

fn push_line(tail: &Mutex<VecDeque<String>>, line: &[u8]) {
    let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
    if t.len() == TAIL_LINES {
        t.pop_front();
    }
    t.push_back(crate::text::one_line(String::from_utf8_lossy(line).trim_end_matches('\r')));
}

/// A `verify error` line, or `Verify return code: N` with N != 0 (CORE 3.4).
pub fn is_verify_failure(line: &str) -> bool {
    if line.contains("verify error") {
        return true;
    }
    match line.split_once("Verify return code:") {
        Some((_, rest)) => rest.trim().split(|c: char| !c.is_ascii_digit()).next().is_some_and(|n| n != "0"),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctx::Ctx;

    fn cfg(host: &str, ca: Option<&str>) -> MqttConfig {
        let mut vars = vec![("MQTT_BROKER".to_string(), host.to_string()), ("MQTT_TLS".into(), "1".into())];
        if let Some(ca) = ca {
            vars.push(("MQTT_CA_FILE".into(), ca.into()));
        }
        MqttConfig::from_ctx(&Ctx::with_env(vars, std::path::Path::new("/"))).unwrap()
    }

    #[test]
    fn args_for_names_and_ips() {
        let c = cfg("broker.example", Some("/ca.pem"));
        let a: Vec<String> = shim_args(&c, c.first(), true).iter().map(|s| s.to_string_lossy().into()).collect();
        assert_eq!(
            a.join(" "),
            "s_client -connect broker.example:8883 -servername broker.example -verify_hostname broker.example \
             -verify_return_error -quiet -nocommands -CAfile /ca.pem"
        );
        let c = cfg("127.0.0.1", None);
        let a: Vec<String> = shim_args(&c, c.first(), false).iter().map(|s| s.to_string_lossy().into()).collect();
        assert_eq!(a.join(" "), "s_client -connect 127.0.0.1:8883 -verify_ip 127.0.0.1 -verify_return_error -quiet");
    }

    #[test]
    fn verify_lines() {
        assert!(is_verify_failure("verify error:num=19:self-signed certificate in certificate chain"));
        assert!(is_verify_failure("Verify return code: 62 (hostname mismatch)"));
        assert!(!is_verify_failure("Verify return code: 0 (ok)"));
        assert!(!is_verify_failure("connect:errno=111"));
    }
}
