//! The command-line frame shared by every subcommand: the `Failure` value that `main` turns into one
//! stderr line and an exit code (CORE 0.2, 0.3, A3), and the lexopt glue.
//!
//! Library modules never print; subcommands return `Result<i32, Failure>` and `main` owns the policy.

use std::ffi::OsString;
use std::fmt;

use crate::ctx::Ctx;
use crate::delegate::DelegateError;
use crate::envfile;
use crate::knob::ConfigError;
use crate::pane::{OpenError, PaneError};
use crate::session::SessionError;
use crate::text::{one_line, show_path};

/// Exit codes (CORE 0.2).
pub mod rc {
    pub const OK: i32 = 0;
    pub const RUNTIME: i32 = 1;
    pub const USAGE: i32 = 2;
    pub const WIRE: i32 = 3;
    pub const REFUSED: i32 = 4;
    pub const LOCKED: i32 = 5;
}

/// A fatal outcome: the exact stderr line and the exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub rc: i32,
    pub line: String,
}

impl Failure {
    pub fn new(rc: i32, line: impl Into<String>) -> Failure {
        Failure { rc, line: line.into() }
    }
    /// rc 2 `ERROR: <msg>`.
    pub fn usage(msg: impl fmt::Display) -> Failure {
        Failure::new(rc::USAGE, format!("ERROR: {msg}"))
    }
    /// rc 1 `ERROR: <msg>`.
    pub fn runtime(msg: impl fmt::Display) -> Failure {
        Failure::new(rc::RUNTIME, format!("ERROR: {msg}"))
    }
    /// rc 3 `ERROR: <msg>`.
    pub fn wire(msg: impl fmt::Display) -> Failure {
        Failure::new(rc::WIRE, format!("ERROR: {msg}"))
    }
    /// rc 4 `REFUSED: <msg>`.
    pub fn refused(msg: impl fmt::Display) -> Failure {
        Failure::new(rc::REFUSED, format!("REFUSED: {msg}"))
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.line)
    }
}

impl From<ConfigError> for Failure {
    fn from(e: ConfigError) -> Failure {
        Failure::usage(e)
    }
}

impl From<OpenError> for Failure {
    fn from(e: OpenError) -> Failure {
        Failure::usage(e)
    }
}

impl From<PaneError> for Failure {
    fn from(e: PaneError) -> Failure {
        match e {
            PaneError::Usage(m) => Failure::usage(m),
            PaneError::NoServer(m) | PaneError::Failed(m) | PaneError::Exited(m) => Failure::runtime(m),
        }
    }
}

/// rc 4 for an engine refusal of job `id`: the reason, what it means in words, and that the record
/// did not change (issue 18): `REFUSED: <id>: late_signal: the job has already finished, so this
/// signal came too late; the record is unchanged`.
pub fn job_refused(id: &str, reason: &str) -> Failure {
    match crate::registry::engine::explain(reason) {
        Some(words) => Failure::refused(format!("{id}: {reason}: {words}; the record is unchanged")),
        None => Failure::refused(format!("{id}: {reason}; the record is unchanged")),
    }
}

/// The one stderr line and exit code of `delegate-job` stopping before a job was registered.
pub fn delegate_failure(e: DelegateError) -> Failure {
    match e {
        DelegateError::Refused(m) => Failure::new(rc::USAGE, format!("REFUSED: delegate-job: {m}; nothing registered")),
        e @ DelegateError::JobRefused { .. } => {
            Failure::new(rc::USAGE, format!("REFUSED: delegate-job: {e}; nothing dispatched"))
        }
        e @ DelegateError::AlreadyDone { .. } => Failure::new(rc::USAGE, format!("REFUSED: delegate-job: {e}")),
        DelegateError::Usage(m) => Failure::usage(m),
        DelegateError::Config(c) => c.into(),
        DelegateError::Backend(b) => b.into(),
        DelegateError::Session(s) => session_failure("delegate-job", &s),
        DelegateError::Failed(m) => Failure::runtime(m),
    }
}

/// The one stderr line and exit code of a session command `cmd` that stopped with `e`.
pub fn session_failure(cmd: &str, e: &SessionError) -> Failure {
    match e {
        SessionError::Refused(m) => {
            Failure::new(rc::USAGE, format!("REFUSED: {cmd}: {}; nothing changed", one_line(m)))
        }
        SessionError::NotJson { path, detail } => Failure::new(
            rc::USAGE,
            format!(
                "REFUSED: {cmd}: {} is not a JSON sessions file ({}); convert it once with `mam session import-yaml`",
                show_path(path),
                one_line(detail)
            ),
        ),
        SessionError::Failed(m) => Failure::runtime(format!("{cmd}: {}", one_line(m))),
        SessionError::Config(c) => c.clone().into(),
        SessionError::Backend(b) => b.clone().into(),
        SessionError::Pane(p) => p.clone().into(),
        SessionError::PurgeNeedsYes => {
            Failure::refused(format!("{cmd}: --purge-conversation needs --yes; nothing changed"))
        }
        // 5: ORCH 2.5 and 6.4 give "conversation kept" its own code.
        e @ SessionError::ConversationKept { .. } => Failure::new(5, format!("REFUSED: {cmd}: {e}")),
    }
}

impl From<crate::paths::Untrusted> for Failure {
    fn from(e: crate::paths::Untrusted) -> Failure {
        Failure::runtime(e)
    }
}

/// rc 2 `REFUSED: <cmd>: ...; nothing changed` when no control root was set up (issue 32): for the
/// commands that start agents or jobs, before they change anything.
pub fn need_control_root(ctx: &Ctx, cmd: &str) -> Result<(), Failure> {
    crate::paths::require_control_root(ctx)
        .map_err(|e| Failure::new(rc::USAGE, format!("REFUSED: {cmd}: {e}; nothing changed")))
}

impl From<lexopt::Error> for Failure {
    fn from(e: lexopt::Error) -> Failure {
        Failure::usage(one_line(&e.to_string()))
    }
}

/// The result of parsing: run with these arguments, or print the usage text.
#[derive(Debug)]
pub enum Parsed<A> {
    Run(A),
    Help,
}

/// A subcommand entry point: arguments after the subcommand name.
pub type Entry = fn(&mut Ctx, Vec<OsString>) -> Result<i32, Failure>;

/// Runs a parse function and prints `usage` on `--help`. An unknown flag is named with the command,
/// the closest flag of `usage` and where the help is (issue 18).
pub fn parse_or_help<A>(
    ctx: &Ctx,
    usage: &str,
    args: Vec<OsString>,
    parse: fn(Vec<OsString>) -> Result<Parsed<A>, Failure>,
) -> Result<Option<A>, Failure> {
    match parse(args).map_err(|f| explain_unknown_flag(usage, f))? {
        Parsed::Run(a) => Ok(Some(a)),
        Parsed::Help => {
            ctx.say_raw(usage.trim_start_matches('\n').as_bytes());
            Ok(None)
        }
    }
}

/// The command a USAGE text is for (`Usage: mam <cmd> ...`).
fn usage_command(usage: &str) -> Option<&str> {
    usage.split("Usage: mam ").nth(1)?.split_whitespace().next()
}

/// The flags a USAGE text lists (`--name`, `-t`), in order of first mention.
pub fn usage_flags(usage: &str) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    let word = |c: char| c.is_ascii_alphanumeric() || c == '-';
    for (i, _) in usage.match_indices('-') {
        let before = usage[..i].chars().next_back();
        if before.is_some_and(word) {
            continue;
        }
        let rest = &usage[i..];
        let end = rest.char_indices().find(|(_, c)| !word(*c)).map_or(rest.len(), |(j, _)| j);
        let f = &rest[..end];
        let ok = match f.strip_prefix("--") {
            Some(long) => long.len() >= 2 && long.starts_with(|c: char| c.is_ascii_lowercase()),
            None => f.len() == 2 && f[1..].starts_with(|c: char| c.is_ascii_alphabetic()),
        };
        if ok && !out.contains(&f) {
            out.push(f);
        }
    }
    out
}

/// `invalid option '--x'` from lexopt, rewritten to name the command, the closest flag and the help;
/// `unexpected argument "x"` to name the command and the help (issue 32).
fn explain_unknown_flag(usage: &str, f: Failure) -> Failure {
    let cmd = usage_command(usage).unwrap_or("");
    if let Some(arg) = f.line.strip_prefix("ERROR: unexpected argument ") {
        return Failure::usage(format!("mam {cmd}: unexpected argument {arg} (see mam {cmd} --help)"));
    }
    let Some(opt) = f.line.strip_prefix("ERROR: invalid option '").and_then(|r| r.strip_suffix('\'')) else {
        return f;
    };
    let flags = usage_flags(usage);
    let hint = match crate::text::closest(opt, flags.iter().copied()) {
        Some(c) => format!("; did you mean '{c}'?"),
        None => String::new(),
    };
    Failure::usage(format!("mam {cmd}: unknown flag '{opt}'{hint} (see mam {cmd} --help)"))
}

/// Loads the env file once (CORE 1.4), printing its warnings; an unreadable file is rc 1 with
/// exactly `ERROR: <path>: cannot read (<kind>)` (CORE 1.3), and an untrusted one rc 1 with
/// `ERROR: <path>: refused: <why>` (issue 12): fatal for every command, never silently skipped.
pub fn load_env(ctx: &mut Ctx) -> Result<(), Failure> {
    match envfile::ensure_env_loaded(ctx) {
        Ok(warnings) => {
            for w in warnings {
                ctx.diag(&w);
            }
            Ok(())
        }
        Err(e) => Err(Failure::runtime(e)),
    }
}

/// The subcommand `v` names among `subs` (its name, its value); else a usage error naming `cmd`
/// and listing the names in their order.
pub fn subcommand<S: Copy>(cmd: &str, v: &std::ffi::OsStr, subs: &[(&str, S)]) -> Result<S, Failure> {
    if let Some(&(_, s)) = subs.iter().find(|(name, _)| v.to_str() == Some(name)) {
        return Ok(s);
    }
    let names: Vec<&str> = subs.iter().map(|(name, _)| *name).collect();
    let expected = match names.split_last() {
        Some((last, [])) => last.to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    };
    Err(Failure::usage(format!("{cmd}: unknown subcommand '{}' (expected {expected})", one_line(&v.to_string_lossy()))))
}

/// A value as a `String`, or a usage error naming the flag.
pub fn utf8(flag: &str, v: OsString) -> Result<String, Failure> {
    v.into_string()
        .map_err(|v| Failure::usage(format!("{flag}: value is not UTF-8: {}", one_line(&v.to_string_lossy()))))
}

/// String arguments as a command's `parse_args` takes them: how the commands' unit tests call it.
#[cfg(test)]
pub fn argv(args: &[&str]) -> Vec<OsString> {
    args.iter().map(OsString::from).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subcommands_are_named_or_listed() {
        let subs = [("run", 1), ("ensure", 2), ("status", 3)];
        assert_eq!(subcommand("daemon", "ensure".as_ref(), &subs).unwrap(), 2);
        let e = subcommand("daemon", "bogus\n".as_ref(), &subs).unwrap_err();
        assert_eq!(e.rc, rc::USAGE);
        assert_eq!(e.line, "ERROR: daemon: unknown subcommand 'bogus\\n' (expected run, ensure or status)");
        let e = subcommand("x", "y".as_ref(), &[("test", 0), ("run", 1)]).unwrap_err();
        assert!(e.line.ends_with("(expected test or run)"), "{}", e.line);
    }
}
