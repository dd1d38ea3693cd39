//! `mam broker` (CORE 11.1): parses the flags, refuses a non-loopback bind without
//! `--allow-remote`, settles the credentials (the operator's `--username`/`--password-file`, none
//! with `--allow-anonymous`, else the workspace's generated ones in `<control root>/.mam/broker.cred`),
//! keeps the connection cap under the descriptor limit, names the state file
//! (`<control root>/.mam/broker.state` unless `--no-persist`), starts `broker::start`, writes the
//! credential file with the bound port, prints the listening line and the credential file's path,
//! and runs until SIGTERM or SIGINT (the broker's shutdown writes the state file).
//!
//! `mam broker check` goes to `cmd::broker_check`.
//!
//! Broker log lines go to stderr, one line each. It never holds the password anywhere but the
//! broker config and the 0600 credential file; it never prints it.

use std::ffi::OsString;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::broker::{self, BrokerConfig, Persist};
use crate::cli::{self, Failure, Parsed};
use crate::ctx::Ctx;
use crate::mqtt::cred::{self, Creds, ReadError};
use crate::text;
use crate::{knob, paths, sys};

pub const USAGE: &str = "
Usage: mam broker [--bind ADDR] [--port N] [--allow-remote]
                  [--allow-anonymous | --username U --password-file F] [--max-packet BYTES]
                  [--max-connections N] [--max-subscriptions N] [--max-retained-bytes BYTES]
                  [--max-retained-message BYTES] [--max-sessions N]
                  [--max-queued-messages N] [--max-queued-bytes BYTES]
                  [--no-persist | --persist-interval SECS] [--max-state-bytes BYTES]

       mam broker check [--heartbeat N] [--heartbeat-misses K] [--json]   (see its --help)

Runs the embedded MQTT 3.1.1 broker (CORE 11) until SIGTERM or SIGINT. Prints
`mam broker listening on <addr>:<port>` on stdout when ready, then `credentials in <path>`
unless it runs anonymous; log lines go to stderr.

Supported: MQTT 3.1.1 (protocol level 4) for one broker, with any 3.1.1 client (mosquitto_pub
and mosquitto_sub, paho, mam's own), and MQTT 3.1 clients (`MQIsdp`, level 3) alike:
  - QoS 0, 1 and 2 in both directions (an inbound QoS 2 message is routed once, on PUBLISH;
    packet ids in flight are never reused);
  - retained messages (an empty retained payload clears the topic), replayed with retain=1 to
    a new subscription;
  - will messages, sent when the connection ends without DISCONNECT (the socket closed, a
    protocol error, 1.5 x keepalive of silence), with their QoS and retain flag; not when the
    same client id connects again (a takeover closes the older connection without its will);
  - persistent sessions (CleanSession=0): subscriptions and QoS 1/2 messages kept while the
    client is away, at most 1000 messages or 16 MiB per absent client and 100000 messages or
    128 MiB for all absent clients together (the newest dropped past either, logged once per
    client until it queues again); unacknowledged PUBLISHes re-sent with DUP=1, and PUBRELs, on reconnect;
  - `+` and `#` filters (not matching `$` topics at the first level); overlapping filters of
    one client give one copy at the highest QoS granted;
  - every CONNACK return code: 0x01 protocol level, 0x02 empty client id with CleanSession=0,
    0x03 --max-sessions reached, 0x04 bad username or password, 0x05 no username;
  - persistence (on unless --no-persist): retained messages and persistent sessions are saved
    to <control root>/.mam/broker.state (0600, written atomically) at most --persist-interval
    seconds after a change and at SIGTERM/SIGINT, and restored at start; a kill -9 loses the
    changes of at most the last interval. A file that cannot be trusted or read (a symlink,
    not yours, open to group or others, over --max-state-bytes, truncated or damaged) is moved
    to broker.state.bad with a WARNING, and the broker starts without it.
Not supported: MQTT 5 (CONNACK 0x01); TLS and websockets (put a proxy in front);
bridges and clusters; per-topic ACLs (one username for every client); $SYS topics but
$SYS/broker/version (`mam broker <version>`, replayed as if retained, as mosquitto does); QoS 0
messages for absent clients (not queued, as mosquitto's default); retransmission on a live
connection (3.1.1 resends on reconnect only); two brokers on one state file (a second broker in
the same control root keeps its state in memory only, with a WARNING).

Every client must authenticate. By default the broker uses the workspace's credential file
<control root>/.mam/broker.cred (username mam, a random password; created 0600 on first start,
kept across restarts, rewritten with the bound port). Every mam command of the workspace that has
no MQTT_USERNAME/MQTT_PASSWORD and a loopback MQTT_BROKER without TLS reads it; without MQTT_PORT
and MQTT_BROKER it also takes the port from it.

One repository, one broker: a broker that uses the credential file holds the lock
<control root>/.mam/broker.pid (its pid and port) while it runs; a second such `mam broker` in
the same repository is refused (exit 2, nothing started) with that pid and port. A broker that
died left the lock free: the next one starts as usual.

Several repositories on one machine: each runs its own broker. Without --port and MQTT_PORT the
broker listens on the port its credential file recorded last, else 1883; when that port is taken
(another repository's broker) it listens on a free port instead, with a NOTE, and records it in
the credential file, where that repository's mam commands find it. A port named by --port or
MQTT_PORT is that port or an error saying what to do. The file is also a
mosquitto client options file: `cp .mam/broker.cred ~/.config/mosquitto_sub` (or mosquitto_pub)
lets those clients in without the password on their command line. Delete it to rotate.

Options:
  --bind ADDR                   IP address to listen on (default 127.0.0.1)
  --port N                      TCP port (default: MQTT_PORT, else the recorded port or 1883,
                                else a free one; 0 picks a free port)
  --allow-remote                allow a non-loopback --bind
  --allow-anonymous             accept clients without credentials (no credential file)
  --username U                  the operator's credentials instead of the generated ones
  --password-file F             (together) the password: the file's content without its
                                trailing newline; no credential file is written
  --max-packet BYTES            largest accepted packet (default 1048576)
  --max-connections N           open connections (default: every descriptor the open-file
                                limit leaves after a reserve of 16, one each; a larger N is
                                lowered to that); at the cap a new connection closes the
                                oldest one that has not completed CONNECT, else it is closed
  --max-subscriptions N         subscriptions per client; more get 0x80 (default 100)
  --max-retained-bytes BYTES    retained topics and payloads in all (default 67108864)
  --max-retained-message BYTES  largest retained payload kept (default 1048576); a retained
                                message over either cap is forwarded but not stored
  --max-sessions N              persistent sessions kept for absent clients (default 1000);
                                a CONNECT that would store one more gets CONNACK 0x03
  --max-queued-messages N       QoS 1/2 messages held for all absent clients together
                                (default 100000); past it a new message for an absent
                                client is dropped (connected clients are not affected)
  --max-queued-bytes BYTES      their topic and payload bytes (default 134217728); as above
  --no-persist                  keep retained messages and sessions in memory only
  --persist-interval SECS       write a change to the state file at most SECS after it
                                (default 5)
  --max-state-bytes BYTES       largest state file written or read (default 268435456);
                                what does not fit is left out (queued messages first), logged
  -h, --help                    print this help

Exit codes: 0 stopped by a signal, 1 runtime error (bind failed, password file unreadable,
credential file not writable, the control root's .mam/ not trustworthy), 2 usage (including a
non-loopback bind without --allow-remote) or this repository's broker already runs.
";

#[derive(Debug)]
struct Args {
    bind: IpAddr,
    /// `--port`; None: MQTT_PORT, else the workspace's recorded port or 1883 with a free port as
    /// the fallback (issue 32).
    port: Option<u16>,
    allow_remote: bool,
    username: Option<String>,
    password_file: Option<PathBuf>,
    allow_anonymous: bool,
    max_packet: usize,
    /// None: as many as the open-file limit allows.
    max_connections: Option<usize>,
    max_subscriptions: usize,
    max_retained_bytes: usize,
    max_retained_message: usize,
    max_sessions: usize,
    max_queued_messages: usize,
    max_queued_bytes: usize,
    persist: bool,
    persist_interval: u32,
    max_state_bytes: usize,
}

fn parse_args(args: Vec<OsString>) -> Result<Parsed<Args>, Failure> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let mut a = Args {
        bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
        port: None,
        allow_remote: false,
        username: None,
        password_file: None,
        allow_anonymous: false,
        max_packet: broker::DEFAULT_MAX_PACKET,
        max_connections: None,
        max_subscriptions: broker::DEFAULT_MAX_SUBSCRIPTIONS,
        max_retained_bytes: broker::DEFAULT_MAX_RETAINED_BYTES,
        max_retained_message: broker::DEFAULT_MAX_PACKET,
        max_sessions: broker::DEFAULT_MAX_SESSIONS,
        max_queued_messages: broker::DEFAULT_MAX_QUEUED_MESSAGES,
        max_queued_bytes: broker::DEFAULT_MAX_QUEUED_BYTES,
        persist: true,
        persist_interval: broker::DEFAULT_PERSIST_INTERVAL.as_secs() as u32,
        max_state_bytes: broker::DEFAULT_MAX_STATE_BYTES,
    };
    let mut interval_given = false;
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
                a.port = Some(u16::try_from(n).map_err(|_| Failure::usage(format!("--port: {n} is above 65535")))?);
            }
            Long("allow-remote") => a.allow_remote = true,
            Long("username") => a.username = Some(cli::utf8("--username", p.value()?)?),
            Long("password-file") => a.password_file = Some(p.value()?.into()),
            Long("max-packet") => {
                // Room for a CONNECT with credentials; smaller limits only confuse clients.
                a.max_packet = knob::flag("--max-packet", &p.value()?, 64)? as usize;
            }
            Long("allow-anonymous") => a.allow_anonymous = true,
            Long("max-connections") => {
                a.max_connections = Some(knob::flag("--max-connections", &p.value()?, 1)? as usize)
            }
            Long("max-subscriptions") => {
                a.max_subscriptions = knob::flag("--max-subscriptions", &p.value()?, 1)? as usize;
            }
            Long("max-retained-bytes") => {
                a.max_retained_bytes = knob::flag("--max-retained-bytes", &p.value()?, 0)? as usize;
            }
            Long("max-retained-message") => {
                a.max_retained_message = knob::flag("--max-retained-message", &p.value()?, 0)? as usize;
            }
            Long("max-sessions") => a.max_sessions = knob::flag("--max-sessions", &p.value()?, 0)? as usize,
            Long("max-queued-messages") => {
                a.max_queued_messages = knob::flag("--max-queued-messages", &p.value()?, 0)? as usize;
            }
            Long("max-queued-bytes") => {
                a.max_queued_bytes = knob::flag("--max-queued-bytes", &p.value()?, 0)? as usize;
            }
            Long("no-persist") => a.persist = false,
            Long("persist-interval") => {
                a.persist_interval = knob::flag("--persist-interval", &p.value()?, 1)?;
                interval_given = true;
            }
            Long("max-state-bytes") => {
                // Room for the empty file (header, counts, checksum).
                a.max_state_bytes = knob::flag("--max-state-bytes", &p.value()?, 64)? as usize;
            }
            Short('h') | Long("help") => return Ok(Parsed::Help),
            _ => return Err(arg.unexpected().into()),
        }
    }
    if a.username.is_some() != a.password_file.is_some() {
        return Err(Failure::usage("--username and --password-file go together"));
    }
    if a.allow_anonymous && a.username.is_some() {
        return Err(Failure::usage("--allow-anonymous and --username exclude each other"));
    }
    if !a.persist && interval_given {
        return Err(Failure::usage("--no-persist and --persist-interval exclude each other"));
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

/// The workspace's credentials: the file's when it is trustworthy, else fresh ones (the file is
/// replaced once the broker is bound). A file that cannot be trusted is named in a NOTE.
fn workspace_creds(ctx: &Ctx, path: &std::path::Path) -> Result<Creds, Failure> {
    if let Some(dir) = path.parent() {
        cred::check_dir(dir).map_err(|e| Failure::runtime(format!("broker credentials: {}", text::one_line(&e))))?;
    }
    match cred::read(path) {
        Ok(c) => return Ok(c),
        Err(ReadError::Missing) => {}
        Err(e) => {
            ctx.diag(&format!("NOTE: broker: {}: {e}; generating new credentials in its place", text::show_path(path)))
        }
    }
    Creds::generate(0).map_err(|e| Failure::runtime(format!("broker credentials: no random bytes ({e})")))
}

/// The lock file, next to the credential file, that the broker serving the workspace's
/// credential file holds for its life; it holds `<pid> <port>` once the broker is bound.
pub const BROKER_PID: &str = "broker.pid";

/// Takes the workspace broker's lock (see `BROKER_PID`), or refuses (rc 2, before any change)
/// naming the broker that holds it. A broker that died released it with its descriptor.
fn claim_workspace(cred_path: &std::path::Path) -> Result<sys::Flock, Failure> {
    let path = cred_path.with_file_name(BROKER_PID);
    let shown = text::show_path(&path);
    let file = sys::open_lock_file(&path)
        .map_err(|e| Failure::runtime(format!("broker: cannot open the lock {shown} ({e}); check .mam/")))?;
    match sys::Flock::try_acquire(file, sys::LockMode::Exclusive) {
        Ok(Some(lock)) => Ok(lock),
        Ok(None) => {
            let held = std::fs::read_to_string(&path).unwrap_or_default();
            let mut words = held.split_whitespace();
            let (who, how) = match (words.next(), words.next()) {
                (Some(pid), Some(port)) => (format!("pid {pid}, port {port}"), format!("`kill {pid}` first")),
                _ => ("starting, pid not yet recorded".to_string(), "stop it first".to_string()),
            };
            Err(Failure::new(
                cli::rc::USAGE,
                format!(
                    "REFUSED: mam broker: this repository's broker already runs ({who}; {shown}) and its \
                     mam commands use it; to restart it, {how}; nothing started"
                ),
            ))
        }
        Err(e) => Err(Failure::runtime(format!("broker: cannot lock {shown} ({e})"))),
    }
}

/// The port `mam broker` listens on (issue 32): one the user named is bound or the start fails;
/// the workspace's own (its recorded port, else 1883) falls back to a free port when taken, and
/// the credential file records it for the workspace's clients.
enum PortChoice {
    /// `--port N` or `MQTT_PORT`: this one or none; the `&str` names where it came from.
    Named(u16, &'static str),
    /// The workspace's recorded port or 1883, with a free port as the fallback.
    Preferred(u16),
}

impl PortChoice {
    fn port(&self) -> u16 {
        match self {
            PortChoice::Named(p, _) | PortChoice::Preferred(p) => *p,
        }
    }
}

fn choose_port(ctx: &Ctx, a: &Args, creds: Option<&Creds>) -> Result<PortChoice, Failure> {
    if let Some(p) = a.port {
        return Ok(PortChoice::Named(p, "--port"));
    }
    if ctx.var_nonempty("MQTT_PORT").is_some() {
        let (_, p) = crate::mqtt::config::tls_and_port(ctx)?;
        return Ok(PortChoice::Named(p, "MQTT_PORT"));
    }
    match creds {
        // Without a credential file nobody could find a fallback port: 1883 or nothing.
        None => Ok(PortChoice::Named(crate::mqtt::config::default_port(false), "the default port")),
        Some(c) if c.port != 0 => Ok(PortChoice::Preferred(c.port)),
        Some(_) => Ok(PortChoice::Preferred(crate::mqtt::config::default_port(false))),
    }
}

/// Starts the broker on `choice`'s port; a taken preferred port moves to a free one with a NOTE,
/// a taken named port is an error that says what to do.
fn bind(
    ctx: &Ctx,
    cfg: BrokerConfig,
    choice: &PortChoice,
    cred_file: Option<&std::path::Path>,
) -> Result<broker::BrokerHandle, Failure> {
    let in_use = |e: &std::io::Error| e.kind() == std::io::ErrorKind::AddrInUse;
    let fail = |e: std::io::Error| Failure::runtime(text::one_line(&e.to_string()));
    match (broker::start(cfg.clone()), choice) {
        (Ok(h), _) => Ok(h),
        (Err(e), PortChoice::Preferred(p)) if in_use(&e) => {
            let file = cred_file.map_or_else(|| "the credential file".to_string(), text::show_path);
            ctx.diag(&format!(
                "NOTE: broker: port {p} is taken (another repository's broker?); listening on a free port, \
                 recorded in {file} for this workspace's mam commands"
            ));
            let any = BrokerConfig { bind: SocketAddr::new(cfg.bind.ip(), 0), ..cfg };
            broker::start(any).map_err(fail)
        }
        (Err(e), PortChoice::Named(p, from)) if in_use(&e) => {
            let how = match (*from, cred_file.is_some()) {
                ("MQTT_PORT", true) => "remove MQTT_PORT (env file or environment) and mam picks a free port",
                ("--port", true) => "leave out --port and mam picks a free port",
                _ => "pass a free --port N",
            };
            Err(Failure::runtime(format!(
                "{}; another broker (another repository's?) listens on port {p} ({from}): stop it, or {how}",
                text::one_line(&e.to_string())
            )))
        }
        (Err(e), _) => Err(fail(e)),
    }
}

/// Raises the soft open-file limit to the hard one; the connections that fit it then (one
/// descriptor each, after those open now and `broker::RESERVED_FDS` for the broker's own files) are
/// the cap, or `max` when given and smaller, with a NOTE when a given `max` had to be lowered
/// (issue 31: every descriptor the limit allows serves a client, as with mosquitto).
fn fit_descriptor_limit(ctx: &Ctx, max: Option<usize>) -> usize {
    let limit = sys::raise_nofile_limit().unwrap_or_else(|e| {
        ctx.diag(&format!("NOTE: broker: cannot raise the open-file limit: {e}"));
        sys::nofile_limit()
    });
    let Some(limit) = limit else { return max.unwrap_or(broker::DEFAULT_MAX_CONNECTIONS) };
    let open = sys::proc_fd_count(std::process::id() as i32).unwrap_or(8);
    let used = open + broker::RESERVED_FDS;
    let room = (usize::try_from(limit).unwrap_or(usize::MAX).saturating_sub(used) / broker::FDS_PER_CONNECTION).max(1);
    let Some(max) = max else { return room };
    if max <= room {
        return max;
    }
    ctx.diag(&format!("NOTE: broker: max-connections lowered from {max} to {room} to fit the open-file limit {limit}"));
    room
}

pub fn run(ctx: &mut Ctx, mut args: Vec<OsString>) -> Result<i32, Failure> {
    // `mam broker check` is the one subcommand; everything else is the broker's own flags.
    if args.first().is_some_and(|a| a == "check") {
        args.remove(0);
        return super::broker_check::run(ctx, args);
    }
    if let Some(word) = args.first().and_then(|a| a.to_str()).filter(|a| !a.starts_with('-')) {
        let hint = match text::closest(word, ["check"]) {
            Some(c) => format!("; did you mean 'mam broker {c}'?"),
            None => String::new(),
        };
        return Err(Failure::usage(format!(
            "mam broker: unknown subcommand '{}'{hint} (see mam broker --help)",
            text::one_line(word)
        )));
    }
    let Some(a) = cli::parse_or_help(ctx, USAGE, args, parse_args)? else {
        return Ok(0);
    };
    cli::load_env(ctx)?;
    // The credentials: the operator's, none, or the workspace's (reused or generated).
    let (username, password, cred_file) = match (&a.username, &a.password_file) {
        (Some(u), Some(p)) => (Some(u.clone()), Some(read_password(p)?), None),
        _ if a.allow_anonymous => (None, None, None),
        _ => {
            let path = cred::path(&paths::control_root(ctx)?);
            let creds = workspace_creds(ctx, &path)?;
            (Some(creds.username.clone()), Some(creds.password.expose().to_string()), Some((path, creds)))
        }
    };
    // One broker serves the workspace's credential file (issue 32): a second one is refused
    // before it changes anything, while a dead one's lock is free and this one starts.
    let claim = match &cred_file {
        Some((path, _)) => Some(claim_workspace(path)?),
        None => None,
    };
    let choice = choose_port(ctx, &a, cred_file.as_ref().map(|(_, c)| c))?;
    let persist = if a.persist {
        let dir = paths::control_root(ctx)?.join(".mam");
        cred::check_dir(&dir).map_err(|e| {
            Failure::runtime(format!("broker state: {}; fix it, or start with --no-persist", text::one_line(&e)))
        })?;
        Some(Persist {
            path: dir.join(broker::STATE_FILE_NAME),
            interval: Duration::from_secs(u64::from(a.persist_interval)),
            max_bytes: a.max_state_bytes,
        })
    } else {
        None
    };
    let max_connections = fit_descriptor_limit(ctx, a.max_connections);
    if a.allow_remote && !a.bind.is_loopback() && username.is_none() {
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
    // Memory back after clients leave (issue 17): see the function.
    sys::fix_malloc_thresholds();
    sys::install_stop_handlers().map_err(|e| Failure::runtime(format!("cannot install signal handlers: {e}")))?;
    let cfg = BrokerConfig {
        bind: SocketAddr::new(a.bind, choice.port()),
        allow_remote: a.allow_remote,
        username,
        password,
        max_packet: a.max_packet,
        log: Some(log),
        record: false,
        max_connections,
        max_subscriptions: a.max_subscriptions,
        max_retained_bytes: a.max_retained_bytes,
        max_retained_message: a.max_retained_message,
        max_sessions: a.max_sessions,
        max_queued_messages: a.max_queued_messages,
        max_queued_bytes: a.max_queued_bytes,
        persist,
        ..BrokerConfig::default()
    };
    let handle = bind(ctx, cfg, &choice, cred_file.as_ref().map(|(p, _)| p.as_path()))?;
    let addr = handle.addr();
    // The file names the bound port, and is in place before anyone is told the broker is up.
    if let Some(lock) = &claim {
        let line = format!("{} {}\n", std::process::id(), addr.port());
        if let Err(e) = sys::write_in_place(&lock.file, line.as_bytes()) {
            ctx.diag(&format!("NOTE: broker: cannot record pid and port in {BROKER_PID} ({e})"));
        }
    }
    if let Some((path, creds)) = &cred_file {
        let creds = Creds { port: addr.port(), ..creds.clone() };
        cred::write(path, &creds)
            .map_err(|e| Failure::runtime(format!("broker credentials: {}", text::one_line(&e))))?;
    }
    ctx.say(&format!("mam broker listening on {addr}"));
    if let Some((path, _)) = &cred_file {
        ctx.say(&format!("credentials in {}", text::show_path(path)));
    }
    while sys::pending_signal().is_none() {
        sys::sleep(Duration::from_millis(100));
    }
    handle.shutdown();
    Ok(0)
}
