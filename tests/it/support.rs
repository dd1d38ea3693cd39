//! Test support: a private directory per test, a `mam` command wrapper with a clean environment
//! (A29), waits with deadlines, tool requirements (A30), and an `eqnice!` diff.
//!
//! No test reads or writes the real checkout's `.mam`; every test gets its own control root.

#![allow(dead_code)] // shared by test modules that each use a part of it

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Path of the `mam` binary under test.
pub fn mam_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_mam"))
}

/// The root under which every test directory lives (one per test-binary run).
pub fn base_dir() -> PathBuf {
    static BASE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BASE.get_or_init(|| {
        let root = std::env::var_os("MAM_TEST_TMP").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
        let dir = root.join(format!("mam-it-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    })
    .clone()
}

/// Random lowercase hex, for ids, sessions and secrets that no other process shares.
pub fn rand_hex(n: usize) -> String {
    mam::sys::random_hex(n).unwrap()
}

/// A private per-test directory with its own control root (`ws/.mam`), HOME and absent env file.
#[derive(Debug)]
pub struct TestDir {
    pub root: PathBuf,
}

impl TestDir {
    pub fn new(name: &str) -> TestDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::SeqCst);
        let root = base_dir().join(format!("{name}-{n}"));
        fs::create_dir_all(root.join("ws/.mam")).unwrap();
        fs::create_dir_all(root.join("home")).unwrap();
        TestDir { root }
    }

    /// The control root (holds `.mam/`).
    pub fn ws(&self) -> PathBuf {
        self.root.join("ws")
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// Writes `bytes` at `rel`, creating parents.
    pub fn write(&self, rel: &str, bytes: impl AsRef<[u8]>) -> PathBuf {
        let p = self.root.join(rel);
        if let Some(d) = p.parent() {
            fs::create_dir_all(d).unwrap();
        }
        fs::write(&p, bytes).unwrap();
        p
    }

    /// A `mam` command run in the control root with the harness environment of A29.
    pub fn mam(&self) -> Cmd {
        self.command(mam_bin())
    }

    /// Any program run like `mam()`: clean environment, control root as cwd, no stdin.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Cmd {
        let mut c = Command::new(program);
        c.env_clear();
        for keep in ["PATH", "LANG", "TZ", "TMPDIR", "RUST_BACKTRACE"] {
            if let Some(v) = std::env::var_os(keep) {
                c.env(keep, v);
            }
        }
        c.env("HOME", self.root.join("home"));
        c.env("MAM_ENV_FILE", self.root.join("absent.env"));
        c.env("MAM_NO_SUBSCRIBER_DAEMON", "1");
        c.current_dir(self.ws());
        c.stdin(Stdio::null());
        Cmd { cmd: c }
    }
}

/// A `Command` with a few conveniences; every run has a deadline.
#[derive(Debug)]
pub struct Cmd {
    pub cmd: Command,
}

impl Cmd {
    pub fn args<I, S>(mut self, args: I) -> Cmd
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.cmd.args(args);
        self
    }

    pub fn env(mut self, k: impl AsRef<OsStr>, v: impl AsRef<OsStr>) -> Cmd {
        self.cmd.env(k, v);
        self
    }

    pub fn env_remove(mut self, k: impl AsRef<OsStr>) -> Cmd {
        self.cmd.env_remove(k);
        self
    }

    pub fn cwd(mut self, d: impl AsRef<Path>) -> Cmd {
        self.cmd.current_dir(d);
        self
    }

    /// Runs to completion within 60 s (killed and failed otherwise).
    pub fn run(self) -> Run {
        self.run_within(Duration::from_secs(60))
    }

    pub fn run_within(mut self, limit: Duration) -> Run {
        self.cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let started = Instant::now();
        let child = self.cmd.spawn().expect("spawn mam");
        let out = wait_output(child, limit);
        Run { out, elapsed: started.elapsed() }
    }

    /// Runs with `input` on stdin.
    pub fn run_stdin(mut self, input: &[u8]) -> Run {
        self.cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let started = Instant::now();
        let mut child = self.cmd.spawn().expect("spawn mam");
        child.stdin.take().unwrap().write_all(input).unwrap();
        let out = wait_output(child, Duration::from_secs(60));
        Run { out, elapsed: started.elapsed() }
    }
}

fn wait_output(mut child: std::process::Child, limit: Duration) -> Output {
    // Drain pipes on threads so a chatty child cannot block on a full pipe.
    let mut so = child.stdout.take();
    let mut se = child.stderr.take();
    let t_out = std::thread::spawn(move || {
        let mut v = Vec::new();
        if let Some(s) = so.as_mut() {
            let _ = std::io::Read::read_to_end(s, &mut v);
        }
        v
    });
    let t_err = std::thread::spawn(move || {
        let mut v = Vec::new();
        if let Some(s) = se.as_mut() {
            let _ = std::io::Read::read_to_end(s, &mut v);
        }
        v
    });
    let Some(status) = exit_within(&mut child, limit) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("command did not finish within {limit:?}");
    };
    Output { status, stdout: t_out.join().unwrap(), stderr: t_err.join().unwrap() }
}

/// A finished run.
#[derive(Debug)]
pub struct Run {
    pub out: Output,
    pub elapsed: Duration,
}

impl Run {
    pub fn rc(&self) -> i32 {
        self.out.status.code().unwrap_or(-1)
    }
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.stdout).into_owned()
    }
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }
    /// Asserts the exit code, showing both streams on mismatch.
    pub fn expect_rc(&self, rc: i32) -> &Run {
        assert_eq!(self.rc(), rc, "unexpected exit code\n--- stdout\n{}--- stderr\n{}", self.stdout(), self.stderr());
        self
    }
}

/// How often the deadline helpers look again.
const POLL: Duration = Duration::from_millis(10);

/// The one polling loop: calls `probe` every 10 ms until it yields a value, or gives up after
/// `limit` (one last look at the deadline) and returns `None`. For waits whose timeout needs its own
/// cleanup or message; the others use `wait_for` or `wait_until`.
pub fn poll<T>(limit: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = probe() {
            return Some(v);
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        std::thread::sleep(POLL.min(deadline - now));
    }
}

/// Waits until `probe` yields a value and returns it; fails naming `what` after `limit`.
pub fn wait_for<T>(what: &str, limit: Duration, probe: impl FnMut() -> Option<T>) -> T {
    poll(limit, probe).unwrap_or_else(|| panic!("timed out after {limit:?} waiting for {what}"))
}

/// Waits until `cond` holds, polling every 10 ms, failing after `limit`.
pub fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    wait_for(what, limit, || cond().then_some(()))
}

/// Waits up to `limit` for `child` to exit; `None` if it is still running (left to the caller).
pub fn exit_within(child: &mut std::process::Child, limit: Duration) -> Option<std::process::ExitStatus> {
    poll(limit, || child.try_wait().unwrap())
}

/// Waits for `child` to exit within `limit`, naming `what` on timeout (the child is killed then).
pub fn wait_exit(what: &str, child: &mut std::process::Child, limit: Duration) -> std::process::ExitStatus {
    exit_within(child, limit).unwrap_or_else(|| {
        let _ = child.kill();
        let _ = child.wait();
        panic!("timed out after {limit:?} waiting for {what} to exit")
    })
}

/// A deliberate pause in a scenario (not a synchronisation): sleeps until `at`. Callers say why.
pub fn pause_until(at: Instant) {
    std::thread::sleep(at.saturating_duration_since(Instant::now()));
}

/// The git identity and isolation every git run of a test uses (A55): no user or system config.
pub const GIT_ENV: &[(&str, &str)] = &[
    ("GIT_AUTHOR_NAME", "test"),
    ("GIT_AUTHOR_EMAIL", "test@localhost"),
    ("GIT_COMMITTER_NAME", "test"),
    ("GIT_COMMITTER_EMAIL", "test@localhost"),
    ("GIT_CONFIG_NOSYSTEM", "1"),
    ("GIT_CONFIG_GLOBAL", "/dev/null"),
];

/// `git ARGS` in `dir` with `GIT_ENV` and then `extra`; its output, whatever the exit.
pub fn git_output(dir: &Path, args: &[&str], extra: &[(&str, &str)]) -> Output {
    Command::new("git")
        .args(args)
        .current_dir(dir)
        .envs(GIT_ENV.iter().copied())
        .envs(extra.iter().copied())
        .output()
        .unwrap()
}

/// `git ARGS` in `dir` with `GIT_ENV` and then `extra`, asserting success; stdout trimmed.
pub fn git_with(dir: &Path, args: &[&str], extra: &[(&str, &str)]) -> String {
    let out = git_output(dir, args, extra);
    assert!(out.status.success(), "git {args:?} in {}: {}", dir.display(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `git ARGS` in `dir` with `GIT_ENV`, asserting success; stdout trimmed.
pub fn git_in(dir: &Path, args: &[&str]) -> String {
    git_with(dir, args, &[])
}

/// Kills the private tmux server `sock` and removes its socket file, which tmux leaves behind, also
/// when the server ended with its last session.
pub fn kill_tmux(sock: &str) {
    let _ = Command::new("tmux").args(["-L", sock, "kill-server"]).output();
    let dir = std::env::var_os("TMUX_TMPDIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/tmp"));
    let _ = fs::remove_file(dir.join(format!("tmux-{}", mam::sys::getuid())).join(sock));
}

/// True when `tool` is on PATH. When `MAM_REQUIRE_<VAR>=1` (A30) a missing tool fails the test;
/// otherwise the caller prints `skipped: <why>` and returns.
pub fn have_tool(tool: &str, require_var: &str) -> bool {
    let found =
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file())).unwrap_or(false);
    if !found {
        if std::env::var(require_var).as_deref() == Ok("1") {
            panic!("{tool} is required ({require_var}=1) but not on PATH");
        }
        eprintln!("skipped: {tool} not on PATH (set {require_var}=1 to require it)");
    }
    found
}

/// Lists every file under `dir` (relative paths), sorted.
pub fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    fn walk(base: &Path, d: &Path, out: &mut Vec<String>) {
        let Ok(rd) = fs::read_dir(d) else { return };
        for e in rd.flatten() {
            let p = e.path();
            out.push(p.strip_prefix(base).unwrap().to_string_lossy().into_owned());
            if p.is_dir() && !p.is_symlink() {
                walk(base, &p, out);
            }
        }
    }
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// Lossy `OsString` helper.
pub fn os(s: &str) -> OsString {
    OsString::from(s)
}

/// The value of the first `KEY=VALUE` word of `out` (`SESSION=`, `PANE=` lines of `mam create`).
pub fn kv(out: &str, key: &str) -> String {
    out.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in {out:?}"))
        .to_string()
}

/// `<td>/bin/claude`, a link to the mam binary (A18: with `test-double agent` in its arguments it
/// is the fake agent): that directory and a PATH that has it first.
pub fn claude_is_mam(td: &TestDir) -> (PathBuf, String) {
    let bin = td.path("bin");
    fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(mam_bin(), bin.join("claude")).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    (bin, path)
}

/// `<mam> create claude --name S --no-onboard -- SCRIPT test-double agent`: the fake agent (A18)
/// playing `script`, done within 60 s; the pane id it prints.
pub fn create_scripted(mam: Cmd, session: &str, script: &Path) -> String {
    let r = mam
        .args(["create", "claude", "--name", session, "--no-onboard", "--"])
        .args([script.as_os_str(), "test-double".as_ref(), "agent".as_ref()])
        .run_within(Duration::from_secs(60));
    r.expect_rc(0);
    kv(&r.stdout(), "PANE")
}

/// Compares two strings and prints a line diff on mismatch.
macro_rules! eqnice {
    ($want:expr, $got:expr) => {{
        let want: String = $want.to_string();
        let got: String = $got.to_string();
        if want != got {
            let mut diff = String::new();
            let (w, g): (Vec<&str>, Vec<&str>) = (want.lines().collect(), got.lines().collect());
            for i in 0..w.len().max(g.len()) {
                let (a, b) = (w.get(i).copied(), g.get(i).copied());
                if a != b {
                    diff.push_str(&format!("line {}:\n  want: {:?}\n  got:  {:?}\n", i + 1, a, b));
                }
            }
            panic!("strings differ\n{diff}--- want\n{want}\n--- got\n{got}");
        }
    }};
}

// ---------------------------------------------------------------------------------------------
// Brokers: the embedded one and a real mosquitto, for scenarios that run against both (K10).

use std::net::{TcpListener, TcpStream};
use std::process::Child;

/// The brokers every conforming scenario runs against.
#[derive(Clone, Copy, Debug)]
pub enum Target {
    Mosquitto,
    Embedded,
}

pub const TARGETS: &[Target] = &[Target::Mosquitto, Target::Embedded];

/// A running broker of some target.
pub enum Broker {
    Mosquitto(Mosquitto),
    Embedded(mam::broker::BrokerHandle),
}

impl Broker {
    pub fn port(&self) -> u16 {
        match self {
            Broker::Mosquitto(m) => m.port,
            Broker::Embedded(b) => b.addr().port(),
        }
    }
}

/// The embedded broker on a free loopback port with the default settings.
pub fn embedded() -> mam::broker::BrokerHandle {
    mam::broker::start(mam::broker::BrokerConfig { bind: "127.0.0.1:0".parse().unwrap(), ..Default::default() })
        .unwrap()
}

pub fn start_target(t: Target, td: &TestDir) -> Option<Broker> {
    match t {
        Target::Mosquitto => {
            if !have_tool("mosquitto", "MAM_REQUIRE_MOSQUITTO") {
                return None;
            }
            Some(Broker::Mosquitto(Mosquitto::start(td, anonymous)))
        }
        Target::Embedded => {
            let cfg = mam::broker::BrokerConfig { bind: "127.0.0.1:0".parse().unwrap(), ..Default::default() };
            Some(Broker::Embedded(mam::broker::start(cfg).expect("start the embedded broker")))
        }
    }
}

/// The one free-port picker: a loopback port that was free a moment ago (another process may take
/// it before the caller binds it; `Mosquitto::start` retries for that reason).
pub fn free_port() -> u16 {
    loopback_listener().1
}

/// A listener on a fresh loopback port, held by the caller (for fake brokers that misbehave).
pub fn loopback_listener() -> (TcpListener, u16) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    (l, port)
}

/// What a `FakeBroker` does with each connection it accepts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fake {
    /// Closes it at once, before any CONNACK: a broker that is down.
    Close,
    /// Reads CONNECT and answers with this CONNACK return code, then ignores everything.
    Connack(u8),
    /// Keeps it open and never answers.
    Silent,
    /// Closes the first N before any CONNACK (a NATS node whose cluster is electing a leader of
    /// its sessions stream), then answers CONNACK 0 like `Connack(0)`.
    CloseFirst(usize),
}

/// A loopback listener that misbehaves on purpose; counts connections; held by the test (so no
/// other test's listener takes the port) and joined on drop.
pub struct FakeBroker {
    pub port: u16,
    accepts: std::sync::Arc<AtomicUsize>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeBroker {
    pub fn start(mode: Fake) -> FakeBroker {
        use std::io::Read;
        let (listener, port) = loopback_listener();
        listener.set_nonblocking(true).unwrap();
        let accepts = std::sync::Arc::new(AtomicUsize::new(0));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (a2, s2) = (accepts.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut open = Vec::new();
            while !s2.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((mut s, _)) => {
                        let nth = a2.fetch_add(1, Ordering::SeqCst);
                        s.set_nonblocking(false).unwrap();
                        let mode = match mode {
                            Fake::CloseFirst(n) if nth < n => Fake::Close,
                            Fake::CloseFirst(_) => Fake::Connack(0),
                            m => m,
                        };
                        match mode {
                            Fake::Close | Fake::CloseFirst(_) => continue, // dropped here
                            Fake::Connack(code) => {
                                s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                                let mut buf = [0u8; 256];
                                let _ = s.read(&mut buf);
                                let _ = s.write_all(&[0x20, 2, 0, code]);
                            }
                            Fake::Silent => {}
                        }
                        open.push(s);
                    }
                    // The server's own accept loop, until the drop: this paces it, it awaits nothing.
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        FakeBroker { port, accepts, stop, thread: Some(thread) }
    }

    /// Connections accepted so far.
    pub fn accepts(&self) -> usize {
        self.accepts.load(Ordering::SeqCst)
    }
}

impl Drop for FakeBroker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub fn anonymous(port: u16) -> String {
    format!("listener {port} 127.0.0.1\nallow_anonymous true\n")
}

/// A mosquitto started by the test with a generated config (all logging on, to a file), killed and
/// reaped on drop. The one launcher of mosquitto in the suite.
pub struct Mosquitto {
    child: Option<Child>,
    pub port: u16,
    conf: PathBuf,
    log: PathBuf,
}

impl Mosquitto {
    /// `listeners(port)` gives the listener and auth lines (any extra config too); the primary port
    /// is waited on. A port taken between `free_port` and mosquitto's bind makes it exit at once: it
    /// is tried again on another port.
    pub fn start(td: &TestDir, listeners: impl Fn(u16) -> String) -> Mosquitto {
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port();
            let n = rand_hex(3);
            let log = td.path(&format!("mosquitto-{n}.log"));
            let mut conf = format!("persistence false\nlog_dest file {}\nlog_type all\n", log.display());
            if mam::sys::getuid() == 0 {
                // As root mosquitto would drop to the `mosquitto` user and lose access to test files (CORE 3.4).
                conf.push_str("user root\n");
            }
            conf.push_str(&listeners(port));
            let conf_path = td.write(&format!("mosquitto-{n}.conf"), conf);
            let mut m = Mosquitto { child: None, port, conf: conf_path, log };
            match m.try_launch() {
                Ok(()) => return m,
                Err(e) => last = e,
            }
        }
        panic!("mosquitto did not start: {last}");
    }

    /// The primary listener's address.
    pub fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Starts mosquitto again on the same port and config (after `kill`).
    pub fn launch(&mut self) {
        if let Err(e) = self.try_launch() {
            panic!("mosquitto did not start again: {e}");
        }
    }

    fn try_launch(&mut self) -> Result<(), String> {
        let child = Command::new("mosquitto")
            .arg("-c")
            .arg(&self.conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn mosquitto");
        self.child = Some(child);
        let port = self.port;
        // Some(true): accepting; Some(false): exited (port taken, bad config).
        // The exit is checked first: a port taken by another process would accept the connect.
        let up = poll(Duration::from_secs(10), || {
            let child = self.child.as_mut().unwrap();
            if child.try_wait().unwrap().is_some() {
                return Some(false);
            }
            TcpStream::connect(("127.0.0.1", port)).is_ok().then_some(true)
        });
        match up {
            Some(true) => Ok(()),
            other => {
                self.kill();
                let why = if other.is_some() { "exited" } else { "not accepting after 10 s" };
                Err(format!("{why} on port {port}; log:\n{}", self.log_text()))
            }
        }
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn restart(&mut self) {
        self.kill();
        self.launch();
    }

    /// SIGTERM, then the exit within 10 s: a clean shutdown (mosquitto writes its persistence file).
    pub fn terminate(&mut self) {
        if let Some(mut c) = self.child.take() {
            mam::sys::kill(c.id() as i32, 15).unwrap();
            if exit_within(&mut c, Duration::from_secs(10)).is_none() {
                let _ = c.kill();
                let _ = c.wait();
                panic!("mosquitto ignored SIGTERM for 10 s");
            }
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_count(&self, needle: &str) -> usize {
        self.log_text().matches(needle).count()
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        self.kill();
    }
}

// ---------------------------------------------------------------------------------------------
// Heartbeat timers and wire captures (publish, heartbeat).

/// Pids of live (non-zombie) `mam heartbeat run ... --job-id <job_id>` processes, from /proc.
pub fn timer_pids(job_id: &str) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(rd) = fs::read_dir("/proc") else { return out };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        let Ok(args) = mam::sys::proc_cmdline(pid) else { continue };
        if !mam::heartbeat::timer_proc::argv_is_timer(&args, job_id) {
            continue;
        }
        if matches!(mam::sys::proc_start_ticks(pid), Ok((_, false))) {
            out.push(pid);
        }
    }
    out
}

/// Kills every timer of its job when dropped, so no test leaves one behind.
#[derive(Debug)]
pub struct TimerGuard(pub String);

impl Drop for TimerGuard {
    fn drop(&mut self) {
        for pid in timer_pids(&self.0) {
            let _ = mam::sys::kill(pid, 9);
        }
    }
}

/// `mosquitto_sub -d -v` on `filter`, capturing every line; ready (SUBACK seen) when `start`
/// returns. Killed and reaped on drop. A wire observer that shares no code with mam.
pub struct MosqSub {
    child: Child,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl MosqSub {
    pub fn start(port: u16, filter: &str) -> MosqSub {
        MosqSub::start_with(port, filter, &[])
    }

    /// `start` with a persistent session: CleanSession=0 under client id `id` (`-c -i ID`), so a
    /// broker keeps what is published for it while it is away; mosquitto_sub reconnects by itself.
    pub fn start_persistent(port: u16, filter: &str, id: &str) -> MosqSub {
        MosqSub::start_with(port, filter, &["-c", "-i", id])
    }

    fn start_with(port: u16, filter: &str, extra: &[&str]) -> MosqSub {
        // stdbuf: a piped mosquitto_sub would otherwise block-buffer its lines.
        let mut child = Command::new("stdbuf")
            .args(["-oL", "mosquitto_sub", "-d", "-v", "-q", "1", "-h", "127.0.0.1", "-p", &port.to_string()])
            .args(["-t", filter])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn mosquitto_sub");
        let out = child.stdout.take().unwrap();
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let l2 = lines.clone();
        let reader = std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                l2.lock().unwrap().push(line);
            }
        });
        let s = MosqSub { child, lines, reader: Some(reader) };
        wait_until("mosquitto_sub to subscribe", Duration::from_secs(10), || {
            s.lines.lock().unwrap().iter().any(|l| l.contains("received SUBACK"))
        });
        s
    }

    /// `(topic, payload)` of every message so far, in arrival order.
    pub fn messages(&self, prefix: &str) -> Vec<(String, String)> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.split_once(' ').map(|(t, p)| (t.to_string(), p.to_string())))
            .collect()
    }
}

impl Drop for MosqSub {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

/// Verifies each payload's `sig` with a verifier that shares no code with mam: python3's
/// `json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=True)` for the canonical bytes
/// and `openssl dgst -sha256 -hmac <key>` for the HMAC. Returns one `ok|bad <kind> <seq>` per payload.
pub fn independent_verify(key: &str, payloads: &[String]) -> Vec<String> {
    const SCRIPT: &str = r#"
import json, subprocess, sys
key = sys.argv[1]
for line in sys.stdin.read().splitlines():
    o = json.loads(line)
    sig = o.pop("sig")
    canon = json.dumps(o, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    out = subprocess.run(["openssl", "dgst", "-sha256", "-hmac", key], input=canon,
                         capture_output=True, check=True).stdout.decode().split()[-1]
    print("ok" if out == sig else "bad", o.get("kind"), o.get("seq"))
"#;
    let mut child = Command::new("python3")
        .args(["-c", SCRIPT, key])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn python3");
    let input = payloads.join("\n");
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = wait_output(child, Duration::from_secs(60));
    assert!(out.status.success(), "verifier failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().map(str::to_string).collect()
}

// ---------------------------------------------------------------------------------------------
// Background processes (watch, remote): output to files so a test can poll it while the process
// runs; killed and reaped on drop.

impl Cmd {
    /// Starts the command in the background with stdout and stderr going to files in `td`.
    pub fn spawn_bg(mut self, td: &TestDir, name: &str) -> Background {
        let n = rand_hex(3);
        let out = td.path(&format!("{name}-{n}.out"));
        let err = td.path(&format!("{name}-{n}.err"));
        self.cmd.stdout(fs::File::create(&out).unwrap()).stderr(fs::File::create(&err).unwrap());
        let started = Instant::now();
        let child = self.cmd.spawn().expect("spawn background process");
        Background { child: Some(child), out, err, started, status: None }
    }
}

/// A process started with `Cmd::spawn_bg`.
pub struct Background {
    child: Option<Child>,
    pub out: PathBuf,
    pub err: PathBuf,
    pub started: Instant,
    status: Option<std::process::ExitStatus>,
}

impl Background {
    pub fn pid(&self) -> i32 {
        self.child.as_ref().map(|c| c.id() as i32).unwrap_or(0)
    }

    pub fn stdout(&self) -> String {
        fs::read_to_string(&self.out).unwrap_or_default()
    }

    pub fn stderr(&self) -> String {
        fs::read_to_string(&self.err).unwrap_or_default()
    }

    /// Sends `sig` to the process (no-op once it was reaped).
    pub fn signal(&self, sig: i32) {
        if self.child.is_some() && self.status.is_none() {
            let _ = mam::sys::kill(self.pid(), sig);
        }
    }

    /// Waits until stdout contains `needle`, failing (with both streams) after `limit` or when the
    /// process exits first.
    pub fn wait_stdout(&mut self, needle: &str, limit: Duration) {
        // Some(true): seen; Some(false): the process exited first; None: timed out.
        let seen = poll(limit, || {
            if self.stdout().contains(needle) {
                return Some(true);
            }
            self.try_status().map(|_| false)
        });
        // One more look: the line may have landed just before the exit.
        if seen == Some(true) || self.stdout().contains(needle) {
            return;
        }
        panic!(
            "waiting for {needle:?}: {}\n--- stdout\n{}--- stderr\n{}",
            if seen.is_some() { "process exited" } else { "timed out" },
            self.stdout(),
            self.stderr()
        );
    }

    fn try_status(&mut self) -> Option<std::process::ExitStatus> {
        if self.status.is_none() {
            if let Some(c) = self.child.as_mut() {
                self.status = c.try_wait().unwrap();
            }
        }
        self.status
    }

    /// True once the process has exited (it is reaped then).
    pub fn exited(&mut self) -> bool {
        self.try_status().is_some()
    }

    /// Waits for the exit within `limit` (killing it and failing otherwise); returns the exit code
    /// (128 + signal for a signal death) and the instant it was seen.
    pub fn wait(&mut self, limit: Duration) -> (i32, Instant) {
        let Some(st) = poll(limit, || self.try_status()) else {
            self.kill();
            panic!("process did not exit within {limit:?}\n--- stdout\n{}--- stderr\n{}", self.stdout(), self.stderr());
        };
        use std::os::unix::process::ExitStatusExt;
        let rc = st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0));
        (rc, Instant::now())
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            if self.status.is_none() {
                let _ = c.kill();
                self.status = c.wait().ok();
            }
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.kill();
    }
}

// ---------------------------------------------------------------------------------------------
// Jobs on disk and on the wire (daemon and jobs tests): register through the CLI, read records, and
// sign payloads with `mam::sign` the way `mam publish` will.

/// Registers a job in `<ws>/.mam/jobs` with `extra` flags and `env`; returns its id.
pub fn register_job(td: &TestDir, env: &[(&str, String)], extra: &[&str]) -> String {
    let session = format!("w-{}", rand_hex(3));
    let mut cmd = td.mam().args(["registry", "register", "--session", &session]).args(extra);
    for (k, v) in env {
        cmd = cmd.env(k, v);
    }
    let r = cmd.run();
    r.expect_rc(0);
    r.stdout().trim().to_string()
}

/// The record of `id` in the default registry of `td`.
pub fn read_record(td: &TestDir, id: &str) -> serde_json::Value {
    let bytes = fs::read(td.ws().join(".mam/jobs").join(format!("{id}.json"))).unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

/// A signed event payload for the record's current attempt (CORE 6.2), as `mam publish` signs it.
pub fn signed_event(rec: &serde_json::Value, event: &str, seq: u64, heartbeat: bool) -> Vec<u8> {
    let v = serde_json::json!({
        "v": 1, "kind": "event", "job_id": rec["job_id"], "attempt": rec["attempt"],
        "dispatch_token": rec["dispatch_token"], "agent_session": rec["agent_session"],
        "event": event, "seq": seq, "ts": mam::clock::now_ts(), "heartbeat": heartbeat,
        "message": "", "data": {}
    });
    let key = rec["auth_token"].as_str().unwrap().as_bytes();
    serde_json::to_vec(&mam::sign::signed(key, v.as_object().unwrap().clone()).unwrap()).unwrap()
}

/// A signed state payload for the record's current attempt.
pub fn signed_state(rec: &serde_json::Value, status: &str, seq: u64) -> Vec<u8> {
    let v = serde_json::json!({
        "v": 1, "kind": "state", "job_id": rec["job_id"], "attempt": rec["attempt"],
        "dispatch_token": rec["dispatch_token"], "status": status, "last_event": status,
        "seq": seq, "ts": mam::clock::now_ts()
    });
    let key = rec["auth_token"].as_str().unwrap().as_bytes();
    serde_json::to_vec(&mam::sign::signed(key, v.as_object().unwrap().clone()).unwrap()).unwrap()
}

/// Publishes `payload` on `topic` at QoS 1 through mam's own client (stands in for `mam publish`
/// until that command merges).
pub fn publish_raw(port: u16, topic: &str, payload: &[u8], retain: bool) {
    let ctx = mam::ctx::Ctx::with_env([("MQTT_PORT", port.to_string())], Path::new("/"));
    let cfg = mam::mqtt::MqttConfig::from_ctx(&ctx).unwrap();
    let mut c = mam::mqtt::Client::connect(&cfg, mam::mqtt::Role::Pub, &mam::mqtt::Stop::never()).unwrap();
    c.publish(&mam::mqtt::Message::new(topic, payload.to_vec(), 1, retain)).unwrap();
    c.disconnect();
}

/// Appends `line` and a newline to `<ws>/.mam/jobs/<id>/events.log`.
pub fn append_events_log(td: &TestDir, id: &str, line: &[u8]) {
    let dir = td.ws().join(".mam/jobs").join(id);
    fs::create_dir_all(&dir).unwrap();
    let mut f = fs::OpenOptions::new().append(true).create(true).open(dir.join("events.log")).unwrap();
    f.write_all(line).unwrap();
    f.write_all(b"\n").unwrap();
}

// ---------------------------------------------------------------------------------------------
// The real herdr (issue 11): found through HERDR_BIN or PATH, run in a private world per test.

/// The real herdr binary (absolute), from `HERDR_BIN` (a path) or else `herdr` on PATH. `None` when
/// there is none (the caller prints `skipped: ...` and returns); a panic when `MAM_REQUIRE_HERDR=1`.
pub fn herdr_bin() -> Option<PathBuf> {
    // MAM_SKIP_REAL_HERDR=1: a quick local run without the real herdr's seconds per agent start.
    if std::env::var("MAM_SKIP_REAL_HERDR").as_deref() == Ok("1") {
        return None;
    }
    let found = match std::env::var_os("HERDR_BIN").filter(|v| !v.is_empty()) {
        Some(p) => Some(PathBuf::from(p)).filter(|p| is_executable(p)),
        None => std::env::var_os("PATH")
            .and_then(|p| std::env::split_paths(&p).map(|d| d.join("herdr")).find(|p| is_executable(p))),
    };
    let found = found.map(|p| fs::canonicalize(&p).unwrap_or(p));
    if found.is_none() {
        let why = match std::env::var_os("HERDR_BIN").filter(|v| !v.is_empty()) {
            Some(p) => format!("HERDR_BIN={} is not an executable file", Path::new(&p).display()),
            None => "herdr is not on PATH and HERDR_BIN is unset".to_string(),
        };
        if std::env::var("MAM_REQUIRE_HERDR").as_deref() == Ok("1") {
            panic!("the real herdr is required (MAM_REQUIRE_HERDR=1) but {why}");
        }
        eprintln!("skipped: {why} (set MAM_REQUIRE_HERDR=1 to require it)");
    }
    found
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(p).map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false)
}

/// The longest path a Unix socket address holds (sun_path is 108 bytes with its NUL).
const SUN_PATH_MAX: usize = 107;

/// The knobs of a test that starts the fake agent in a pane (herdr, tmux or the fake backend) and
/// talks to a broker at `port`: room for a slow agent start and the start-up dialog's settle, quick
/// send-keys polls and quiesce, short watch polls, connect deadline and publish budget.
pub fn agent_in_pane_env(port: u16) -> Vec<(String, OsString)> {
    [
        ("MQTT_PORT", port.to_string()),
        ("MAM_AGENT_START_TIMEOUT_MS", "20000".into()),
        ("MAM_SKS_POLL_MS", "50".into()),
        ("MAM_SKS_QUIESCE_GAP_MS", "100".into()),
        ("MAM_SKS_QUIESCE_S", "2".into()),
        ("MAM_SKS_IDLE_WAIT_S", "10".into()),
        ("SKS_DELIVERY_GRACE_S", "8".into()),
        ("MAM_WATCH_POLL_MS", "100".into()),
        ("MAM_MQTT_CONNECT_TIMEOUT_S", "2".into()),
        ("MAM_PUBLISH_BUDGET_S", "2".into()),
        ("MAM_STARTUP_DIALOG_SETTLE_MS", "1000".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), OsString::from(v)))
    .collect()
}

/// A private herdr world for one test: its own HOME and XDG directories (XDG_RUNTIME_DIR 0700), the
/// config.toml of `../shared/herdr/README.md` (no onboarding, /bin/bash, no version or manifest
/// checks), a `bin/` with `herdr` linked to the real binary (first on PATH) and a unique session name.
/// Nothing of the outer environment's `HERDR_SOCKET_PATH`, `HERDR_SESSION` or `TMUX` reaches it.
///
/// Everything lives under the test's directory except the config directory, which holds herdr's
/// sockets (`<config>/herdr/sessions/<name>/herdr-client.sock`) and so must stay within a socket
/// address's 107 bytes: it is a short `hc-<hex>` directory directly under `base_dir()` (still under
/// the run's base, where the leak guard looks).
///
/// Drop stops every server of the world (each session under the config directory, by `server stop`),
/// reaps the servers it started itself, then kills whatever process is left whose environment or argv
/// names the world's HOME or config directory, and waits until none is: no herdr, pane shell or agent
/// outlives the test.
pub struct HerdrHome {
    /// The real herdr binary.
    pub herdr: PathBuf,
    /// The world's root under the test directory (`<td>/herdr`).
    pub root: PathBuf,
    pub home: PathBuf,
    /// XDG_CONFIG_HOME: herdr's config.toml and its sockets.
    pub config: PathBuf,
    pub runtime: PathBuf,
    /// Prepended to PATH: `herdr`, and whatever `link` adds (a fake agent's `claude`).
    pub bin: PathBuf,
    /// The session name (`mam-test-<hex>`), given to mam as `MAM_HERDR_SESSION`.
    pub session: String,
    cwd: PathBuf,
    servers: Vec<Child>,
}

impl HerdrHome {
    /// The world for `td`, or `None` (skip) when the real herdr is absent and not required.
    pub fn new(td: &TestDir) -> Option<HerdrHome> {
        let herdr = herdr_bin()?;
        let root = td.path("herdr");
        let home = root.join("home");
        let config = base_dir().join(format!("hc-{}", rand_hex(3)));
        let runtime = root.join("run");
        let bin = root.join("bin");
        let session = format!("mam-test-{}", rand_hex(3));
        let longest = config.join("herdr/sessions").join(&session).join("herdr-client.sock");
        let len = longest.as_os_str().len();
        assert!(
            len <= SUN_PATH_MAX,
            "herdr's socket path {} is {len} bytes, over the {SUN_PATH_MAX} a socket address holds: \
             use a shorter MAM_TEST_TMP",
            longest.display()
        );
        for d in [&home, &runtime, &bin, &config.join("herdr")] {
            fs::create_dir_all(d).unwrap();
        }
        for d in [".local/state", ".cache", ".local/share"] {
            fs::create_dir_all(home.join(d)).unwrap();
        }
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&runtime, fs::Permissions::from_mode(0o700)).unwrap();
        fs::write(
            config.join("herdr/config.toml"),
            "onboarding = false\n[terminal]\ndefault_shell = \"/bin/bash\"\n\
             [update]\nversion_check = false\nmanifest_check = false\n",
        )
        .unwrap();
        std::os::unix::fs::symlink(&herdr, bin.join("herdr")).unwrap();
        // Found from the test directory too.
        let _ = std::os::unix::fs::symlink(&config, root.join("config"));
        Some(HerdrHome { herdr, root, home, config, runtime, bin, session, cwd: td.ws(), servers: Vec::new() })
    }

    /// `bin/claude` as the fake agent driven by a script named in argv: `claude SCRIPT ARGS...` runs
    /// `mam ARGS...` as `claude` with `MAM_FAKE_AGENT_SCRIPT=SCRIPT` and the variables of `SCRIPT.env`
    /// when that file exists (a herdr pane inherits the server's environment, fixed when it started,
    /// so what differs per session travels in argv); `claude die` exits at once (an agent that never
    /// comes up).
    pub fn fake_claude(&self) {
        let wrapper = format!(
            "#!/usr/bin/env bash\n[ \"$1\" = die ] && exit 3\nexport MAM_FAKE_AGENT_SCRIPT=\"$1\"\n\
             [ -f \"$1.env\" ] && {{ set -a; . \"$1.env\"; set +a; }}\nshift\nexec -a claude '{}' \"$@\"\n",
            mam_bin().display()
        );
        let claude = self.bin.join("claude");
        fs::write(&claude, wrapper).unwrap();
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&claude, fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// Links `bin/<name>` to `target` (e.g. `claude` to the mam binary for the fake agent).
    pub fn link(&self, name: &str, target: &Path) {
        std::os::unix::fs::symlink(target, self.bin.join(name)).unwrap();
    }

    /// The pairs a test passes to `mam` (and that a server mam bootstraps inherits from it): the
    /// world's HOME and XDG directories, `HERDR_DISABLE_SOUND=1`, PATH with `bin/` first and
    /// `MAM_HERDR_SESSION=<session>`. No `HERDR_SESSION`: mam sets that itself from its server name.
    pub fn env(&self) -> Vec<(String, OsString)> {
        let path = match std::env::var_os("PATH") {
            Some(p) => {
                let mut all = vec![self.bin.clone()];
                all.extend(std::env::split_paths(&p));
                std::env::join_paths(all).unwrap()
            }
            None => self.bin.clone().into_os_string(),
        };
        vec![
            ("HOME".into(), self.home.clone().into()),
            ("XDG_CONFIG_HOME".into(), self.config.clone().into()),
            ("XDG_STATE_HOME".into(), self.home.join(".local/state").into()),
            ("XDG_CACHE_HOME".into(), self.home.join(".cache").into()),
            ("XDG_DATA_HOME".into(), self.home.join(".local/share").into()),
            ("XDG_RUNTIME_DIR".into(), self.runtime.clone().into()),
            ("HERDR_DISABLE_SOUND".into(), "1".into()),
            ("PATH".into(), path),
            ("MAM_HERDR_SESSION".into(), self.session.clone().into()),
        ]
    }

    /// `cmd` with the world's environment, and without the outer herdr and tmux variables.
    pub fn apply(&self, mut cmd: Cmd) -> Cmd {
        for (k, v) in self.env() {
            cmd = cmd.env(k, v);
        }
        cmd.env_remove("HERDR_SOCKET_PATH").env_remove("HERDR_SESSION").env_remove("TMUX")
    }

    /// A `herdr` command of `session` in this world: clean environment, `HERDR_SESSION=session`.
    fn herdr_cmd(&self, session: Option<&str>) -> Command {
        let mut c = Command::new(&self.herdr);
        c.env_clear();
        for keep in ["LANG", "TZ", "TMPDIR"] {
            if let Some(v) = std::env::var_os(keep) {
                c.env(keep, v);
            }
        }
        c.envs(self.env());
        if let Some(s) = session {
            c.env("HERDR_SESSION", s);
        }
        c.current_dir(&self.cwd).stdin(Stdio::null());
        c
    }

    /// Runs the real `herdr ARGS` against this world's session, within 30 s.
    pub fn herdr<S: AsRef<OsStr>>(&self, args: &[S]) -> Run {
        self.herdr_within(args, Duration::from_secs(30))
    }

    /// Runs the real `herdr ARGS` against this world's session, killed and failed after `limit`.
    pub fn herdr_within<S: AsRef<OsStr>>(&self, args: &[S], limit: Duration) -> Run {
        let mut c = self.herdr_cmd(Some(&self.session));
        c.args(args);
        Cmd { cmd: c }.run_within(limit)
    }

    /// `herdr ARGS` that must succeed; its stdout parsed as JSON.
    pub fn herdr_json<S: AsRef<OsStr>>(&self, args: &[S]) -> serde_json::Value {
        // A list of a server that is not running is empty (see `herdr_json_or_none`).
        if args.get(1).is_some_and(|a| a.as_ref() == "list") {
            return self.herdr_json_or_none(args);
        }
        let r = self.herdr(args);
        r.expect_rc(0);
        serde_json::from_str(&r.stdout())
            .unwrap_or_else(|e| panic!("herdr printed no JSON ({e}):\n--- stdout\n{}", r.stdout()))
    }

    /// The foreground processes of `pane` (pid, argv), from `herdr pane process-info`.
    pub fn pane_processes(&self, pane: &str) -> Vec<(i32, Vec<String>)> {
        let v = self.herdr_json(&["pane", "process-info", "--pane", pane]);
        let procs = v["result"]["process_info"]["foreground_processes"].as_array().cloned().unwrap_or_default();
        procs
            .iter()
            .filter_map(|p| {
                let pid = p["pid"].as_i64()? as i32;
                let argv = p["argv"].as_array()?.iter().filter_map(|a| a.as_str().map(str::to_string)).collect();
                Some((pid, argv))
            })
            .collect()
    }

    /// The agent process of `pane` (argv[0] `claude`): its pid and argv; a panic when there is none.
    pub fn agent_process(&self, pane: &str) -> (i32, Vec<String>) {
        wait_for(&format!("the agent process of pane {pane}"), Duration::from_secs(10), || {
            self.pane_processes(pane).into_iter().find(|(_, a)| a.first().is_some_and(|a0| a0 == "claude"))
        })
    }

    /// `herdr_json`, or `Null` when the server is not running (issue 32 item 7: mam stops a server
    /// it started with its last agent, so a world after `mam stop` may have none: no panes, no
    /// workspaces).
    fn herdr_json_or_none<S: AsRef<OsStr>>(&self, args: &[S]) -> serde_json::Value {
        let r = self.herdr(args);
        if r.rc() != 0 && r.stderr().contains("server_not_running") {
            return serde_json::Value::Null;
        }
        r.expect_rc(0);
        serde_json::from_str(&r.stdout())
            .unwrap_or_else(|e| panic!("herdr printed no JSON ({e}):\n--- stdout\n{}", r.stdout()))
    }

    /// Pane ids of every workspace of this world's server, sorted (none without a server).
    pub fn pane_ids(&self) -> Vec<String> {
        let v = self.herdr_json_or_none(&["pane", "list"]);
        let mut ids: Vec<String> = v["result"]["panes"]
            .as_array()
            .map(|a| a.iter().filter_map(|p| p["pane_id"].as_str().map(str::to_string)).collect())
            .unwrap_or_default();
        ids.sort();
        ids
    }

    /// (workspace id, label) of every workspace, in herdr's order.
    pub fn workspaces(&self) -> Vec<(String, String)> {
        let v = self.herdr_json_or_none(&["workspace", "list"]);
        v["result"]["workspaces"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|w| {
                        let s = |k: &str| w[k].as_str().unwrap_or_default().to_string();
                        (s("workspace_id"), s("label"))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// True when this world's server answers `herdr agent list`.
    pub fn answers(&self) -> bool {
        self.herdr_within(&["agent", "list"], Duration::from_secs(10)).rc() == 0
    }

    /// Starts `herdr --session <session> server` detached (its own session, output to
    /// `<root>/server-<n>.log`) and waits up to 20 s until it answers.
    pub fn start_server(&mut self) {
        let log = self.root.join(format!("server-{}.log", self.servers.len()));
        let mut c = self.herdr_cmd(None);
        c.args(["--session", &self.session, "server"]);
        let f = fs::File::create(&log).unwrap();
        c.stdout(f.try_clone().unwrap()).stderr(f);
        mam::sys::set_new_session(&mut c);
        self.servers.push(c.spawn().expect("spawn herdr server"));
        let ok = poll(Duration::from_secs(20), || {
            if self.answers() {
                return Some(true);
            }
            self.servers.last_mut().unwrap().try_wait().unwrap().map(|_| false)
        });
        if ok != Some(true) {
            let why = if ok.is_some() { "exited" } else { "did not answer within 20 s" };
            panic!("herdr server {} {why}; log:\n{}", self.session, fs::read_to_string(&log).unwrap_or_default());
        }
    }

    /// What identifies this world's processes, kept for a look after the drop.
    pub fn marks(&self) -> HerdrMarks {
        HerdrMarks { root: self.root.clone(), home: self.home.clone(), config: self.config.clone() }
    }

    /// Live (non-zombie) processes of this world.
    pub fn processes(&self) -> Vec<(i32, String)> {
        self.marks().processes()
    }

    /// Stops every server of the world and every process left of it (what Drop does); idempotent.
    /// Err names what was still alive after the deadline.
    pub fn shutdown(&mut self) -> Result<(), String> {
        let mut sessions: Vec<Option<String>> = Vec::new();
        if let Ok(rd) = fs::read_dir(self.config.join("herdr/sessions")) {
            sessions.extend(rd.flatten().map(|e| Some(e.file_name().to_string_lossy().into_owned())));
        }
        if self.config.join("herdr/herdr.sock").exists() {
            sessions.push(None); // the default session
        }
        for s in &sessions {
            let mut c = self.herdr_cmd(None);
            if let Some(s) = s {
                c.args(["--session", s]);
            }
            c.args(["server", "stop"]);
            // A session without a server answers server_not_running: nothing to stop.
            let _ = Cmd { cmd: c }.run_within(Duration::from_secs(10));
        }
        let mut servers = std::mem::take(&mut self.servers);
        for s in &mut servers {
            if exit_within(s, Duration::from_secs(5)).is_none() {
                let _ = s.kill();
                let _ = s.wait();
            }
        }
        // Pane shells and agents end with their PTYs; whatever did not gets TERM after 2 s, then KILL.
        let started = Instant::now();
        let mut termed = false;
        let gone = poll(Duration::from_secs(10), || {
            let left = self.processes();
            if left.is_empty() {
                return Some(());
            }
            let t = started.elapsed();
            if t >= Duration::from_secs(3) {
                left.iter().for_each(|(pid, _)| drop(mam::sys::kill(*pid, libc::SIGKILL)));
            } else if t >= Duration::from_secs(2) && !termed {
                left.iter().for_each(|(pid, _)| drop(mam::sys::kill(*pid, libc::SIGTERM)));
                termed = true;
            }
            None
        });
        if gone.is_some() {
            return Ok(());
        }
        let list: Vec<String> = self.processes().iter().map(|(p, a)| format!("pid {p}: {a}")).collect();
        if list.is_empty() {
            return Ok(());
        }
        Err(format!("herdr world {} outlived its test: {}", self.root.display(), list.join("; ")))
    }
}

/// The environment of process `pid` (from `/proc/<pid>/environ`), in order.
pub fn environ(pid: i32) -> Vec<(String, String)> {
    let raw = fs::read(format!("/proc/{pid}/environ")).unwrap_or_else(|e| panic!("environ of {pid}: {e}"));
    raw.split(|&b| b == 0)
        .filter_map(|kv| {
            let kv = String::from_utf8_lossy(kv);
            kv.split_once('=').map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect()
}

/// The paths that mark a herdr world's processes (its HOME and config dir in their environment, or
/// its root or config dir in their argv).
#[derive(Clone, Debug)]
pub struct HerdrMarks {
    pub root: PathBuf,
    pub home: PathBuf,
    pub config: PathBuf,
}

impl HerdrMarks {
    /// Live (non-zombie) processes of the world, with their argv; never the test process itself.
    pub fn processes(&self) -> Vec<(i32, String)> {
        let me = std::process::id() as i32;
        let home = format!("HOME={}", self.home.display()).into_bytes();
        let conf = format!("XDG_CONFIG_HOME={}", self.config.display()).into_bytes();
        let marks = [self.root.to_string_lossy().into_owned(), self.config.to_string_lossy().into_owned()];
        let mut out = Vec::new();
        for pid in mam::sys::list_pids().unwrap_or_default() {
            if pid == me || !matches!(mam::sys::proc_start_ticks(pid), Ok((_, false))) {
                continue;
            }
            let Ok(args) = mam::sys::proc_cmdline(pid) else { continue };
            let argv = args.iter().map(|a| String::from_utf8_lossy(a)).collect::<Vec<_>>().join(" ");
            // Readable for the same user; a process of another user is no test's.
            let environ = fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let by_env = environ.split(|&b| b == 0).any(|kv| kv == home.as_slice() || kv == conf.as_slice());
            if by_env || marks.iter().any(|m| argv.contains(m.as_str())) {
                out.push((pid, argv));
            }
        }
        out
    }
}

impl Drop for HerdrHome {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            if std::thread::panicking() {
                eprintln!("{e}");
            } else {
                panic!("{e}");
            }
        }
    }
}

/// The binaries a demo script may pick (scripts/demo_bin.sh), in a test's directory: a release
/// build under `<td>/target` (the `CARGO_TARGET_DIR` to pass), an installed `mam` in `<td>/demo-bin`,
/// each a symlink to the binary under test whose own modification time says how old it is, and a
/// `cargo` there that records its calls and fails, so a demo that would build says so and stops.
pub struct DemoBins {
    pub target: PathBuf,
    pub bin: PathBuf,
    log: PathBuf,
}

impl DemoBins {
    pub fn new(td: &TestDir) -> DemoBins {
        let target = td.path("target");
        let bin = td.path("demo-bin");
        fs::create_dir_all(target.join("release")).unwrap();
        fs::create_dir_all(&bin).unwrap();
        let log = td.path("cargo-calls.log");
        let cargo = bin.join("cargo");
        fs::write(
            &cargo,
            format!(
                "#!/bin/sh\necho \"$PWD: $*\" >>'{}'\necho 'cargo: not run by the test' >&2\nexit 101\n",
                log.display()
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&cargo, fs::Permissions::from_mode(0o755)).unwrap();
        DemoBins { target, bin, log }
    }

    /// Links `at` to the binary under test, newer than every source (`fresh`) or from 2001.
    fn link(at: &Path, fresh: bool) {
        let _ = fs::remove_file(at);
        std::os::unix::fs::symlink(mam_bin(), at).unwrap();
        let when = if fresh { "now" } else { "2001-01-01" };
        let ok = Command::new("touch").args(["-h", "-d", when]).arg(at).status().unwrap();
        assert!(ok.success());
    }

    /// `<target>/release/mam`, the release build the demo looks for.
    pub fn release(&self, fresh: bool) -> PathBuf {
        let p = self.target.join("release/mam");
        DemoBins::link(&p, fresh);
        p
    }

    /// `<bin>/mam`, an installed mam of this version.
    pub fn installed(&self, fresh: bool) -> PathBuf {
        let p = self.bin.join("mam");
        DemoBins::link(&p, fresh);
        p
    }

    /// PATH for the demo: `<bin>` first, then the test's PATH without any directory that holds a
    /// `mam` (so only the installed one of `installed` can be found).
    pub fn path(&self) -> OsString {
        let outer = std::env::var_os("PATH").unwrap_or_default();
        let mut all = vec![self.bin.clone()];
        all.extend(std::env::split_paths(&outer).filter(|d| !d.join("mam").exists()));
        std::env::join_paths(all).unwrap()
    }

    /// What `cargo` was asked, one `<cwd>: <args>` line per call ("" when it was never run).
    pub fn cargo_calls(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A demo command: `bash <script> args` with this PATH and target directory, without MAM_BIN.
    pub fn demo(&self, td: &TestDir, script: &str, args: &[&str]) -> Cmd {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts").join(script);
        td.command("bash")
            .args([script.as_os_str()])
            .args(args)
            .env("PATH", self.path())
            .env("CARGO_TARGET_DIR", &self.target)
            .env("TMPDIR", td.path(""))
            .env_remove("MAM_BIN")
    }
}
