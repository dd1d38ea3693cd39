//! `mam sub`: prints MQTT messages arriving on one or more filters, with flags mirroring
//! `mosquitto_sub`, through the same client and configuration as every subscriber (CORE 3).

use std::ffi::OsString;
use std::time::{Duration, Instant};

use super::pub_::{self, parse_port, parse_qos, target, wire_failure, Mosq};
use crate::cli::{self, Failure, Parsed};
use crate::ctx::Ctx;
use crate::mqtt::{self, codec, MqttConfig, MqttError, Persistent, RetryPolicy, Role, Stop};
use crate::{knob, sys};

pub const USAGE: &str = "
Usage: mam sub -t FILTER [-t FILTER ...] [-v] [-C COUNT] [-W SECONDS] [-q 0|1] [-h HOST] [-p PORT]
               [-L URL] [-u USER] [-i ID | -I PREFIX] [-F FORMAT] [-N] [-R] [-d]

Subscribes (like mosquitto_sub) using the broker settings of CORE 3.1, read after the env file,
and prints each message's payload on its own line (retained messages included).

Options:
  -t, --topic FILTER     subscription filter (`+` and `#` wildcards); repeatable
  -v, --verbose          print `TOPIC PAYLOAD` instead of the payload alone
  -C, --count COUNT      exit 0 after COUNT messages
  -W, --timeout SECONDS  exit 27 when SECONDS pass (counted from start) before COUNT messages
  -q, --qos 0|1          requested subscription QoS (default 1, CORE 3.2)
  -h, --host HOSTS       the brokers instead of MQTT_BROKER: one host (like mosquitto_sub) or a
                         list in MQTT_BROKER's grammar, host[:port],... (help is --help)
  -p, --port PORT        the port of a -h entry without one, else of every broker (MQTT_PORT)
  -L, --url URL          mqtt://[USER@]HOST[:PORT]/FILTER: host, port, user and filter at once
  -u, --username USER    user name instead of MQTT_USERNAME
  -i, --id ID            client id (default a random mam-sub-... id)
  -I, --id-prefix P      client id P followed by random hex
  -F, --format FORMAT    print each message as FORMAT: %t topic, %p payload, %l payload length,
                         %q qos, %r retain (0/1), %% a percent sign; \\n and \\t escapes
  -N                     no newline after each message
  -R                     skip retained messages (stale ones, as mosquitto_sub -R)
  -d, --debug            say on stderr what is received from where
      --help             print this help

The mosquitto_sub flags that mam does not take say what to use instead: -P (a password never goes
on the command line: set MQTT_PASSWORD), -k (MAM_MQTT_KEEPALIVE_S), --cafile (MQTT_TLS=1 and
MQTT_CA_FILE), -V (MQTT 3.1.1 only), -c (always a clean session).

SIGINT/SIGTERM disconnect cleanly and exit 0. A lost connection is made again through the broker
list (from the broker after the lost one), the filters subscribed again (retained messages come
again), with one `NOTE: sub: connection to A lost (...); now connected to B` line on stderr.

Exit codes: 0 count reached or stopped by a signal, 1 env file unreadable, 2 usage or invalid
configuration, 3 broker failure (after 3 connect attempts, or a broker refused the credentials,
the TLS verification or a filter at the first subscription),
27 the -W timeout expired (the value mosquitto_sub uses; stderr says `NOTE: sub: timed out ...`).
";

/// `-W` expiry, the value mosquitto_sub uses.
pub const RC_TIMEOUT: i32 = 27;

#[derive(Debug)]
struct Args {
    filters: Vec<String>,
    verbose: bool,
    count: Option<u32>,
    timeout: Option<u32>,
    qos: u8,
    host: Option<String>,
    port: Option<u16>,
    mosq: Mosq,
    format: Option<String>,
    no_newline: bool,
    skip_retained: bool,
}

fn parse_args(args: Vec<OsString>) -> Result<Parsed<Args>, Failure> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let mut a = Args {
        filters: Vec::new(),
        verbose: false,
        count: None,
        timeout: None,
        qos: 1,
        host: None,
        port: None,
        mosq: Mosq::default(),
        format: None,
        no_newline: false,
        skip_retained: false,
    };
    while let Some(arg) = p.next()? {
        match arg {
            Short('t') | Long("topic") => {
                let f = cli::utf8("-t", p.value()?)?;
                codec::check_filter(&f).map_err(|e| Failure::usage(format!("-t: {e}")))?;
                a.filters.push(f);
            }
            Short('v') | Long("verbose") => a.verbose = true,
            Short('C') | Long("count") => a.count = Some(knob::flag("-C", &p.value()?, 1)?),
            Short('W') | Long("timeout") => a.timeout = Some(knob::flag("-W", &p.value()?, 1)?),
            Short('q') | Long("qos") => a.qos = parse_qos(&p.value()?)?,
            Short('h') | Long("host") => a.host = super::pub_::hosts("-h", cli::utf8("-h", p.value()?)?)?,
            Short('p') | Long("port") => a.port = Some(parse_port(&p.value()?)?),
            Short('F') | Long("format") => a.format = Some(cli::utf8("-F", p.value()?)?),
            Short('N') => a.no_newline = true,
            Short('R') | Long("no-retained") => a.skip_retained = true,
            Long("help") => return Ok(Parsed::Help),
            other => {
                let key = pub_::Key::of(&other);
                let err: Failure = other.unexpected().into();
                if !pub_::mosquitto_flag("sub", &key, &mut p, &mut a.mosq)? {
                    return Err(err);
                }
            }
        }
    }
    if let Some((h, pt, f)) = a.mosq.url.clone() {
        codec::check_filter(&f).map_err(|e| Failure::usage(format!("-L: {e}")))?;
        a.host = a.host.or(Some(h));
        a.port = a.port.or(pt);
        a.filters.push(f);
    }
    if a.filters.is_empty() {
        return Err(Failure::usage("sub: at least one -t FILTER is required"));
    }
    Ok(Parsed::Run(a))
}

pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let Some(a) = cli::parse_or_help(ctx, USAGE, args, parse_args)? else {
        return Ok(0);
    };
    let started = Instant::now();
    cli::load_env(ctx)?;
    let env = MqttConfig::from_ctx(ctx)?;
    let id = pub_::client_id(&a.mosq)?;
    let mut cfg = target(ctx, env, a.host.clone(), a.port);
    if let Some(u) = a.mosq.username.clone() {
        cfg.username = Some(u);
    }
    let debug = |line: String| {
        if a.mosq.debug {
            ctx.diag(&format!("NOTE: sub: {line}"));
        }
    };
    sys::install_stop_handlers().map_err(|e| Failure::runtime(format!("cannot install signal handlers: {e}")))?;
    let deadline = a.timeout.map(|s| started + Duration::from_secs(s.into()));
    let stop = match deadline {
        // The -W clock also bounds connecting and subscribing.
        Some(d) => Stop::from_fn(move || sys::pending_signal().is_some() || Instant::now() >= d),
        None => Stop::signals(),
    };
    debug(format!("connecting to {}", cfg.addr()));
    let mut conn = Persistent::new(cfg, Role::Sub, stop.clone());
    if let Some(id) = id {
        conn = conn.with_client_id(id);
    }
    let connected = mqtt::with_retry(
        &RetryPolicy::standard("subscribe"),
        &stop,
        |w| ctx.diag(&w),
        |_| conn.subscribe_once(&a.filters, a.qos).map(|_| ()),
    );
    if connected.is_ok() {
        let to = conn.connected_to().unwrap_or_default().to_string();
        debug(format!("subscribed to {} (qos {}) through {to}", a.filters.join(", "), a.qos));
    }
    let mut received = 0u32;
    // Like mosquitto_sub's `Timed out`: rc 27 alone does not tell a person what happened.
    let timed_out_with = |received: u32| {
        let of = a.count.map(|c| format!(" of {c}")).unwrap_or_default();
        ctx.diag(&format!(
            "NOTE: sub: timed out after {} s (-W) with {received}{of} message(s) received",
            a.timeout.unwrap_or(0)
        ));
        RC_TIMEOUT
    };
    match connected {
        Ok(()) => {}
        Err(MqttError::Stopped) => return Ok(stopped_rc(&|| timed_out_with(0))),
        Err(e) if deadline.is_some_and(|d| Instant::now() >= d) && e.retryable() => return Ok(timed_out_with(0)),
        Err(e) => return Err(wire_failure(e)),
    }
    loop {
        if a.count.is_some_and(|c| received >= c) {
            conn.drop_connection();
            return Ok(0);
        }
        let wait_until = deadline.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        match conn.recv(wait_until) {
            Ok(Some(m)) if a.skip_retained && m.retain => {
                debug(format!("skipped a retained message on '{}' (-R)", m.topic));
            }
            Ok(Some(m)) => {
                debug(format!(
                    "received {} bytes on '{}' (qos {}, retain {})",
                    m.payload.len(),
                    m.topic,
                    m.qos,
                    m.retain
                ));
                let mut line = match &a.format {
                    Some(f) => render(f, &m),
                    None => {
                        let mut line = Vec::with_capacity(m.topic.len() + m.payload.len() + 2);
                        if a.verbose {
                            line.extend_from_slice(m.topic.as_bytes());
                            line.push(b' ');
                        }
                        line.extend_from_slice(&m.payload);
                        line
                    }
                };
                if !a.no_newline {
                    line.push(b'\n');
                }
                ctx.say_raw(&line);
                if ctx.out_closed() {
                    // The reader is gone (or stdout failed): disconnect cleanly; main sets the rc.
                    conn.drop_connection();
                    return Ok(0);
                }
                received += 1;
            }
            Ok(None) if deadline.is_some_and(|d| Instant::now() >= d) => {
                conn.drop_connection();
                return Ok(timed_out_with(received));
            }
            Ok(None) => {}
            Err(MqttError::Stopped) => {
                conn.drop_connection();
                return Ok(stopped_rc(&|| timed_out_with(received)));
            }
            // Issue 31: a lost connection is made again through the list, however long it takes;
            // only a signal, -W, or a broker's final answer (credentials, TLS) ends the command.
            Err(e) if keeps_trying(&e) => match reconnect(&mut conn, &stop, &mut |l| debug(l)) {
                Ok(moved) => ctx.diag(&format!("NOTE: sub: {}", moved.describe())),
                Err(MqttError::Stopped) => {
                    conn.drop_connection();
                    return Ok(stopped_rc(&|| timed_out_with(received)));
                }
                Err(e) => return Err(wire_failure(e)),
            },
            Err(e) => return Err(wire_failure(e)),
        }
    }
}

/// How long `mam sub` waits between two walks of its broker list that found no broker.
const RECONNECT_PAUSE: Duration = Duration::from_secs(1);

/// A failure after which `mam sub` reconnects: anything the next broker or a later moment may
/// answer differently (a filter refused on a reconnect included: a cluster's failover); not a
/// refused CONNACK 1, 2, 4, 5, a failed TLS verification or a missing openssl.
fn keeps_trying(e: &MqttError) -> bool {
    match e {
        MqttError::SubackRefused { .. } => true,
        MqttError::NoBroker { failures } => failures.iter().any(|(_, e)| keeps_trying(e)),
        e => e.retryable(),
    }
}

/// Connects `conn` again (it re-subscribes its filters), walking its list every `RECONNECT_PAUSE`
/// until a broker answers; the move it made.
fn reconnect(
    conn: &mut Persistent,
    stop: &Stop,
    debug: &mut dyn FnMut(String),
) -> Result<mqtt::client::Moved, MqttError> {
    loop {
        match conn.client().map(|_| ()) {
            Ok(()) => {
                let to = conn.connected_to().unwrap_or_default().to_string();
                let unknown = || mqtt::client::Moved { from: String::new(), why: "lost".into(), to: to.clone() };
                return Ok(conn.take_move().unwrap_or_else(unknown));
            }
            Err(e) if keeps_trying(&e) && !stop.is_set() => debug(format!("reconnect failed ({e}); trying again")),
            Err(e) if stop.is_set() => {
                return Err(if matches!(e, MqttError::Stopped) { e } else { MqttError::Stopped })
            }
            Err(e) => return Err(e),
        }
        let until = Instant::now() + RECONNECT_PAUSE;
        while Instant::now() < until {
            if stop.is_set() {
                return Err(MqttError::Stopped);
            }
            sys::sleep(Duration::from_millis(100));
        }
    }
}

/// A signal ends the subscription with 0 (like mosquitto_sub); the -W clock with 27.
fn stopped_rc(timed_out: &dyn Fn() -> i32) -> i32 {
    if sys::pending_signal().is_some() {
        0
    } else {
        timed_out()
    }
}

/// One message through a `-F` format (mosquitto_sub's `%t %p %l %q %r %%`, `\n \t \\`).
fn render(format: &str, m: &crate::mqtt::Incoming) -> Vec<u8> {
    let mut out = Vec::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        match c {
            '%' => match chars.next() {
                Some('t') => out.extend_from_slice(m.topic.as_bytes()),
                Some('p') => out.extend_from_slice(&m.payload),
                Some('l') => out.extend_from_slice(m.payload.len().to_string().as_bytes()),
                Some('q') => out.extend_from_slice(m.qos.to_string().as_bytes()),
                Some('r') => out.push(if m.retain { b'1' } else { b'0' }),
                Some('%') => out.push(b'%'),
                Some(o) => out.extend_from_slice(format!("%{o}").as_bytes()),
                None => out.push(b'%'),
            },
            '\\' => match chars.next() {
                Some('n') => out.push(b'\n'),
                Some('t') => out.push(b'\t'),
                Some('\\') => out.push(b'\\'),
                Some(o) => out.extend_from_slice(format!("\\{o}").as_bytes()),
                None => out.push(b'\\'),
            },
            c => out.extend_from_slice(c.to_string().as_bytes()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_renders_mosquitto_escapes() {
        let m = crate::mqtt::Incoming { topic: "a/b".into(), payload: b"hi".to_vec(), qos: 1, retain: true, pid: None };
        assert_eq!(render("%t %p %l %q %r 100%% %x\\t.", &m), b"a/b hi 2 1 1 100% %x\t.".to_vec());
    }
}
