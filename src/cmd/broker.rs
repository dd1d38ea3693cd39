//! `mam broker` (CORE 11.1): parses the flags, refuses a non-loopback bind without
//! `--allow-remote`, reads the password from a file (never argv), starts `broker::start`, prints
//! the listening line, and runs until SIGTERM or SIGINT.
//!
//! Broker log lines go to stderr, one line each. It never holds the password anywhere but the
//! broker config.

use std::ffi::OsString;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::broker::{self, BrokerConfig};
use crate::cli::{self, Failure, Parsed};
use crate::ctx::Ctx;
use crate::text;
use crate::{knob, sys};

pub const USAGE: &str = "
Usage: mam broker [--bind ADDR] [--port N] [--allow-remote] [--username U --password-file F]
                  [--max-packet BYTES]

Runs the embedded MQTT 3.1.1 broker (CORE 11) until SIGTERM or SIGINT. Prints
`mam broker listening on <addr>:<port>` on stdout when ready; log lines go to stderr.

Options:
  --bind ADDR           IP address to listen on (default 127.0.0.1)
  --port N              TCP port (default 1883; 0 picks a free port)
  --allow-remote        allow a non-loopback --bind
  --username U          require this username on every CONNECT (needs --password-file)
  --password-file F     the password: the file's content without its trailing newline
  --max-packet BYTES    largest accepted packet (default 1048576)
  -h, --help            print this help

Exit codes: 0 stopped by a signal, 1 runtime error (bind failed, password file unreadable),
2 usage (including a non-loopback bind without --allow-remote).
";

#[derive(Debug)]
struct Args {
    bind: IpAddr,
    port: u16,
    allow_remote: bool,
    username: Option<String>,
    password_file: Option<PathBuf>,
    max_packet: usize,
}

fn parse_args(args: Vec<OsString>) -> Result<Parsed<Args>, Failure> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let mut a = Args {
        bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
        port: 1883,
        allow_remote: false,
        username: None,
        password_file: None,
        max_packet: 1024 * 1024,
    };
    while let Some(arg) = p.next()? {
        match arg {
            Long("bind") => {
                let v = cli::utf8("--bind", p.value()?)?;
                a.bind = v
                    .trim()
                    .parse()
                    .map_err(|_| Failure::usage(format!("--bind: invalid IP address '{}'", text::one_line(&v))))?;
            }
            Long("port") => {
                let raw = p.value()?;
                let n = knob::flag("--port", &raw, 0)?;
                a.port = u16::try_from(n).map_err(|_| Failure::usage(format!("--port: {n} is above 65535")))?;
            }
            Long("allow-remote") => a.allow_remote = true,
            Long("username") => a.username = Some(cli::utf8("--username", p.value()?)?),
            Long("password-file") => a.password_file = Some(p.value()?.into()),
            Long("max-packet") => {
                // Room for a CONNECT with credentials; smaller limits only confuse clients.
                a.max_packet = knob::flag("--max-packet", &p.value()?, 64)? as usize;
            }
            Short('h') | Long("help") => return Ok(Parsed::Help),
            _ => return Err(arg.unexpected().into()),
        }
    }
    if a.username.is_some() != a.password_file.is_some() {
        return Err(Failure::usage("--username and --password-file go together"));
    }
    if !a.bind.is_loopback() && !a.allow_remote {
        return Err(Failure::usage("refusing to bind non-loopback address without --allow-remote"));
    }
    Ok(Parsed::Run(a))
}

fn read_password(path: &std::path::Path) -> Result<String, Failure> {
    let bytes = std::fs::read(path).map_err(|e| {
        Failure::runtime(format!("{}: cannot read password file ({:?})", text::show_path(path), e.kind()))
    })?;
    let mut s = String::from_utf8(bytes)
        .map_err(|_| Failure::runtime(format!("{}: password file is not UTF-8", text::show_path(path))))?;
    if s.ends_with('\n') {
        s.pop();
        if s.ends_with('\r') {
            s.pop();
        }
    }
    Ok(s)
}

pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let Some(a) = cli::parse_or_help(ctx, USAGE, args, parse_args)? else {
        return Ok(0);
    };
    let password = match &a.password_file {
        Some(p) => Some(read_password(p)?),
        None => None,
    };
    if a.allow_remote && !a.bind.is_loopback() && a.username.is_none() {
        ctx.diag(&format!(
            "WARNING: remote access without authentication: anyone who can reach {} may publish and subscribe",
            a.bind
        ));
    }
    let err = ctx.err.clone();
    let log: broker::LogSink = Arc::new(move |line: &str| match &err {
        crate::ctx::Sink::Std => {
            let mut e = std::io::stderr().lock();
            let _ = writeln!(e, "{line}");
        }
        crate::ctx::Sink::Buffer(b) => {
            let mut b = b.lock().unwrap_or_else(|e| e.into_inner());
            b.extend_from_slice(line.as_bytes());
            b.push(b'\n');
        }
    });
    sys::install_stop_handlers().map_err(|e| Failure::runtime(format!("cannot install signal handlers: {e}")))?;
    let cfg = BrokerConfig {
        bind: SocketAddr::new(a.bind, a.port),
        allow_remote: a.allow_remote,
        username: a.username,
        password,
        max_packet: a.max_packet,
        log: Some(log),
        record: false,
        ..BrokerConfig::default()
    };
    let handle = broker::start(cfg).map_err(|e| Failure::runtime(text::one_line(&e.to_string())))?;
    let addr = handle.addr();
    ctx.say(&format!("mam broker listening on {addr}"));
    while sys::pending_signal().is_none() {
        sys::sleep(Duration::from_millis(100));
    }
    handle.shutdown();
    Ok(0)
}
