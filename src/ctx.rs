//! The configuration overlay and call context (CORE 0.7, ORCH 0.6).
//!
//! `Ctx` is built once by `main` from the real process (environment snapshot, cwd, stdout and
//! stderr) or by a test from explicit values. Nothing below `main` reads the process environment:
//! lookups go through `Ctx::var`, which checks the real environment first and the env-file overlay
//! second. Values from the env file are never written into the process environment; children get
//! them through `Ctx::child_env_for`, which is also the one place that decides which secrets a child
//! receives (its `ChildRole`).

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The variables that hold secrets (A2). A child gets one only when its `ChildRole` needs it.
pub const SECRET_VARS: &[&str] = &["MQTT_PASSWORD", "MAM_DISPATCH_SECRET"];

/// What a child process is, which decides the secrets it is given (docs/SECURITY.md "Secrets,
/// replays and bounds"). Anything that is not a mam process talking to the broker gets none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChildRole {
    /// An agent, a pane backend call or pane server (tmux, herdr, the fake agent), a remote job's
    /// `sh -c`, `mam agents purge`: no secret.
    Agent,
    /// A helper program that is not mam (the TLS shim): no secret.
    Tool,
    /// A mam process that connects to the broker and signs no dispatch: the heartbeat timer, `mam
    /// watch`, the daemon (`daemon ensure`, `monitor`, `reconcile --subscribe`): `MQTT_PASSWORD`.
    BrokerClient,
    /// `mam remote dispatch` (and register/submit `--transport remote`, which derive the remote
    /// auth token): `MQTT_PASSWORD` and `MAM_DISPATCH_SECRET`.
    Dispatcher,
    /// `mam remote run`: `MQTT_PASSWORD` and `MAM_DISPATCH_SECRET`.
    Runner,
}

impl ChildRole {
    /// The secret variables a child of this role keeps.
    pub fn secrets(self) -> &'static [&'static str] {
        match self {
            ChildRole::Agent | ChildRole::Tool => &[],
            ChildRole::BrokerClient => &["MQTT_PASSWORD"],
            ChildRole::Dispatcher | ChildRole::Runner => SECRET_VARS,
        }
    }
}

/// Where a command's stdout or stderr lines go.
#[derive(Clone, Debug)]
pub enum Sink {
    /// The process's own stream.
    Std,
    /// A buffer, for in-process tests.
    Buffer(Arc<Mutex<Vec<u8>>>),
}

impl Sink {
    fn write(&self, bytes: &[u8], stdout: bool) -> io::Result<()> {
        match self {
            Sink::Std if stdout => {
                let mut out = io::stdout().lock();
                out.write_all(bytes)?;
                out.flush()
            }
            Sink::Std => io::stderr().lock().write_all(bytes),
            Sink::Buffer(buf) => {
                buf.lock().unwrap_or_else(|e| e.into_inner()).extend_from_slice(bytes);
                Ok(())
            }
        }
    }

    /// The buffered text (empty for `Std`).
    pub fn text(&self) -> String {
        match self {
            Sink::Std => String::new(),
            Sink::Buffer(buf) => String::from_utf8_lossy(&buf.lock().unwrap_or_else(|e| e.into_inner())).into_owned(),
        }
    }
}

/// Per-invocation context: environment, env-file overlay, cwd and output sinks.
#[derive(Clone, Debug)]
pub struct Ctx {
    env: BTreeMap<OsString, OsString>,
    overlay: BTreeMap<String, String>,
    /// Where each overlay value came from (`<file>:<line>`), for knob errors (issue 18).
    origin: BTreeMap<String, String>,
    loaded: bool,
    cwd: PathBuf,
    pub out: Sink,
    pub err: Sink,
    /// The first stdout write error, shared by clones; later writes are dropped once it is set.
    out_error: Arc<Mutex<Option<io::Error>>>,
}

impl Ctx {
    /// The real process: a snapshot of its environment and cwd, writing to stdout/stderr.
    pub fn from_process() -> Ctx {
        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
        Ctx {
            env: crate::sort::ordered(std::env::vars_os()),
            overlay: BTreeMap::new(),
            origin: BTreeMap::new(),
            loaded: false,
            cwd,
            out: Sink::Std,
            err: Sink::Std,
            out_error: Arc::default(),
        }
    }

    /// An explicit environment and cwd with buffered output, for in-process tests.
    pub fn with_env<I, K, V>(vars: I, cwd: &Path) -> Ctx
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<OsString>,
        V: Into<OsString>,
    {
        Ctx {
            env: crate::sort::ordered(vars.into_iter().map(|(k, v)| (k.into(), v.into()))),
            overlay: BTreeMap::new(),
            origin: BTreeMap::new(),
            loaded: false,
            cwd: cwd.to_path_buf(),
            out: Sink::Buffer(Arc::default()),
            err: Sink::Buffer(Arc::default()),
            out_error: Arc::default(),
        }
    }

    /// A lookup: the real environment first, then the overlay. Non-UTF-8 values are returned lossily.
    pub fn var(&self, key: &str) -> Option<String> {
        match self.env.get(OsStr::new(key)) {
            Some(v) => Some(v.to_string_lossy().into_owned()),
            None => self.overlay.get(key).cloned(),
        }
    }

    /// Like `var`, but an empty value counts as unset.
    pub fn var_nonempty(&self, key: &str) -> Option<String> {
        self.var(key).filter(|v| !v.is_empty())
    }

    /// Like `var_nonempty`, as a path (kept byte-exact for non-UTF-8 environment values).
    pub fn path_var(&self, key: &str) -> Option<PathBuf> {
        match self.env.get(OsStr::new(key)) {
            Some(v) if !v.is_empty() => Some(PathBuf::from(v)),
            Some(_) => None,
            None => self.overlay.get(key).filter(|v| !v.is_empty()).map(PathBuf::from),
        }
    }

    /// A program path or trust setting (`MAM_OPENSSL`, `MAM_BIN`, `MAM_TRUSTED_ROOTS`): the real
    /// environment only, never the env-file overlay (issue 12; `envfile::ENV_ONLY` skips those lines
    /// too). An empty value counts as unset.
    pub fn env_only(&self, key: &str) -> Option<PathBuf> {
        self.env.get(OsStr::new(key)).filter(|v| !v.is_empty()).map(PathBuf::from)
    }

    /// True when `key` exists in the real environment, even with an empty value (CORE 1.2 rule 11).
    pub fn in_real_env(&self, key: &str) -> bool {
        self.env.contains_key(OsStr::new(key))
    }

    /// Where `key`'s value comes from, for an error that names it (issue 18): `the environment`,
    /// `<env file>:<line>`, or `None` when unset.
    pub fn var_origin(&self, key: &str) -> Option<String> {
        if self.env.contains_key(OsStr::new(key)) {
            return Some("the environment".into());
        }
        if self.overlay.contains_key(key) {
            return Some(self.origin.get(key).cloned().unwrap_or_else(|| "the env file".into()));
        }
        None
    }

    /// Records where overlay values came from (`envfile::ensure_env_loaded`).
    pub(crate) fn note_origins(&mut self, origins: Vec<(String, String)>) {
        for (k, o) in origins {
            self.origin.entry(k).or_insert(o);
        }
    }

    /// The cwd this invocation resolves relative paths against.
    pub fn cwd(&self) -> &Path {
        &self.cwd
    }

    pub fn env_loaded(&self) -> bool {
        self.loaded
    }

    /// Applies env-file values (callers have already filtered keys present in the real environment)
    /// and marks the file as loaded. Called only by `envfile::ensure_env_loaded` after success.
    pub(crate) fn apply_overlay(&mut self, values: Vec<(String, String)>) {
        for (k, v) in values {
            self.overlay.entry(k).or_insert(v);
        }
        self.loaded = true;
    }

    /// The environment a child of `role` receives: the real environment plus the overlay, minus the
    /// secrets that role does not need (`ChildRole::secrets`). Every spawn site goes through here, so
    /// a new one has to say what its child is.
    pub fn child_env_for(&self, role: ChildRole) -> Vec<(OsString, OsString)> {
        let keep = role.secrets();
        let withheld = |k: &OsStr| SECRET_VARS.iter().any(|s| k == *s) && !keep.iter().any(|s| k == *s);
        let mut all: Vec<(OsString, OsString)> =
            self.env.iter().filter(|(k, _)| !withheld(k)).map(|(k, v)| (k.clone(), v.clone())).collect();
        for (k, v) in &self.overlay {
            if !self.env.contains_key(OsStr::new(k)) && !withheld(OsStr::new(k)) {
                all.push((k.into(), v.into()));
            }
        }
        all
    }

    /// The names of every variable this context sees (real environment and overlay), sorted; for
    /// test doubles that report what they were given.
    pub fn var_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.env.keys().map(|k| k.to_string_lossy().into_owned()).collect();
        names.extend(self.overlay.keys().filter(|k| !self.env.contains_key(OsStr::new(k.as_str()))).cloned());
        crate::sort::natural(&mut names);
        names
    }

    /// Sets or removes a variable in this context's environment (for children and later lookups).
    pub fn set_var(&mut self, key: &str, value: Option<&OsStr>) {
        match value {
            Some(v) => self.env.insert(key.into(), v.to_os_string()),
            None => self.env.remove(OsStr::new(key)),
        };
    }

    /// Prints one line on stdout. A write error is remembered (see `out_closed`), never a panic or
    /// an exit from here: `main` ends the process after the command unwound (a closed pipe rc 0,
    /// any other error rc 1).
    pub fn say(&self, line: &str) {
        let mut bytes = Vec::with_capacity(line.len() + 1);
        bytes.extend_from_slice(line.as_bytes());
        bytes.push(b'\n');
        self.say_raw(&bytes);
    }

    /// Writes bytes on stdout as they are; nothing more is written after a write error.
    pub fn say_raw(&self, bytes: &[u8]) {
        let mut failed = self.out_error.lock().unwrap_or_else(|e| e.into_inner());
        if failed.is_some() {
            return;
        }
        if let Err(e) = self.out.write(bytes, true) {
            *failed = Some(e);
        }
    }

    /// True once a stdout write failed (the reader is gone, or the device is full): a command that
    /// keeps printing should end.
    pub fn out_closed(&self) -> bool {
        self.out_error.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    /// True when the stdout write error is a closed pipe (EPIPE).
    pub fn out_broken_pipe(&self) -> bool {
        let e = self.out_error.lock().unwrap_or_else(|e| e.into_inner());
        e.as_ref().is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe)
    }

    /// The stdout write error, if one happened (taken once, by `main`).
    pub fn take_out_error(&self) -> Option<io::Error> {
        self.out_error.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Prints one diagnostic line on stderr (the caller includes the `ERROR: `-style prefix).
    pub fn diag(&self, line: &str) {
        let mut bytes = Vec::with_capacity(line.len() + 1);
        bytes.extend_from_slice(line.as_bytes());
        bytes.push(b'\n');
        let _ = self.err.write(&bytes, false);
    }
}

/// Stdout for a command that prints many lines (a listing of 100,000 records): the bytes go out
/// through `Ctx::say_raw` (so the write-error policy is the same) in writes of 64 KiB, the rest on
/// `flush` or drop, instead of one write per line or one string of the whole output.
#[derive(Debug)]
pub struct OutBuf<'a> {
    ctx: &'a Ctx,
    buf: Vec<u8>,
}

impl<'a> OutBuf<'a> {
    const CHUNK: usize = 64 * 1024;

    pub fn new(ctx: &'a Ctx) -> OutBuf<'a> {
        OutBuf { ctx, buf: Vec::with_capacity(Self::CHUNK) }
    }

    /// One line (a newline is added).
    pub fn line(&mut self, line: &str) {
        self.buf.extend_from_slice(line.as_bytes());
        self.buf.push(b'\n');
        self.spill();
    }

    fn spill(&mut self) {
        if self.buf.len() >= Self::CHUNK {
            self.ctx.say_raw(&self.buf);
            self.buf.clear();
        }
    }
}

impl Write for OutBuf<'_> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(bytes);
        self.spill();
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if !self.buf.is_empty() {
            self.ctx.say_raw(&self.buf);
            self.buf.clear();
        }
        Ok(())
    }
}

impl Drop for OutBuf<'_> {
    fn drop(&mut self) {
        let _ = self.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(ctx: &Ctx, role: ChildRole) -> Vec<String> {
        ctx.child_env_for(role).into_iter().map(|(k, _)| k.to_string_lossy().into_owned()).collect()
    }

    /// Issue 12 item 5: the role decides which secrets a child gets, from the environment and the
    /// env-file overlay alike.
    #[test]
    fn each_role_gets_only_its_secrets() {
        let mut ctx = Ctx::with_env([("MQTT_PASSWORD", "pw"), ("PATH", "/bin")], Path::new("/"));
        ctx.apply_overlay(vec![("MAM_DISPATCH_SECRET".into(), "ds".into()), ("MQTT_PORT".into(), "1".into())]);
        let all = ["MAM_DISPATCH_SECRET", "MQTT_PASSWORD", "MQTT_PORT", "PATH"];
        let mut got = names(&ctx, ChildRole::Runner);
        got.sort();
        assert_eq!(got, all);
        let mut got = names(&ctx, ChildRole::Dispatcher);
        got.sort();
        assert_eq!(got, all);
        let mut got = names(&ctx, ChildRole::BrokerClient);
        got.sort();
        assert_eq!(got, ["MQTT_PASSWORD", "MQTT_PORT", "PATH"]);
        for role in [ChildRole::Agent, ChildRole::Tool] {
            let mut got = names(&ctx, role);
            got.sort();
            assert_eq!(got, ["MQTT_PORT", "PATH"], "{role:?}");
        }
        assert_eq!(ctx.var_names(), all);
    }
}
