//! `mam sub`: prints MQTT messages arriving on one or more filters, with flags mirroring
//! `mosquitto_sub`, through the same client and configuration as every subscriber (CORE 3).

use std::ffi::OsString;
use std::time::{Duration, Instant};

use super::pub_::{parse_port, parse_qos, target, wire_failure};
use crate::cli::{self, Failure, Parsed};
use crate::ctx::Ctx;
use crate::mqtt::{self, codec, Client, MqttConfig, MqttError, RetryPolicy, Role, Stop};
use crate::{knob, sys};

pub const USAGE: &str = "
Usage: mam sub -t FILTER [-t FILTER ...] [-v] [-C COUNT] [-W SECONDS] [-q 0|1] [-h HOST] [-p PORT]

Subscribes (like mosquitto_sub) using the broker settings of CORE 3.1, read after the env file,
and prints each message's payload on its own line (retained messages included).

Options:
  -t, --topic FILTER     subscription filter (`+` and `#` wildcards); repeatable
  -v, --verbose          print `TOPIC PAYLOAD` instead of the payload alone
  -C, --count COUNT      exit 0 after COUNT messages
  -W, --timeout SECONDS  exit 27 when SECONDS pass (counted from start) before COUNT messages
  -q, --qos 0|1          requested subscription QoS (default 1, CORE 3.2)
  -h, --host HOST        broker host instead of MQTT_BROKER (like mosquitto_sub; help is --help)
  -p, --port PORT        broker port instead of MQTT_PORT
      --help             print this help

SIGINT/SIGTERM disconnect cleanly and exit 0. A lost connection is not re-established: exit 3.

Exit codes: 0 count reached or stopped by a signal, 1 env file unreadable, 2 usage or invalid
configuration, 3 broker failure (after 3 connect attempts, or the connection was lost),
27 the -W timeout expired (the value mosquitto_sub uses).
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
}

fn parse_args(args: Vec<OsString>) -> Result<Parsed<Args>, Failure> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let mut a =
        Args { filters: Vec::new(), verbose: false, count: None, timeout: None, qos: 1, host: None, port: None };
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
            Short('h') | Long("host") => a.host = Some(cli::utf8("-h", p.value()?)?).filter(|h| !h.is_empty()),
            Short('p') | Long("port") => a.port = Some(parse_port(&p.value()?)?),
            Long("help") => return Ok(Parsed::Help),
            _ => return Err(arg.unexpected().into()),
        }
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
    let cfg = target(ctx, env, a.host, a.port);
    sys::install_stop_handlers().map_err(|e| Failure::runtime(format!("cannot install signal handlers: {e}")))?;
    let deadline = a.timeout.map(|s| started + Duration::from_secs(s.into()));
    let stop = match deadline {
        // The -W clock also bounds connecting and subscribing.
        Some(d) => Stop::from_fn(move || sys::pending_signal().is_some() || Instant::now() >= d),
        None => Stop::signals(),
    };
    let connected = mqtt::with_retry(
        &RetryPolicy::standard("subscribe"),
        &stop,
        |w| ctx.diag(&w),
        |_| {
            let mut c = Client::connect(&cfg, Role::Sub, &stop)?;
            c.subscribe(&a.filters, a.qos)?;
            Ok(c)
        },
    );
    let mut client = match connected {
        Ok(c) => c,
        Err(MqttError::Stopped) => return Ok(stopped_rc()),
        Err(e) if deadline.is_some_and(|d| Instant::now() >= d) && e.retryable() => return Ok(RC_TIMEOUT),
        Err(e) => return Err(wire_failure(e)),
    };
    let mut received = 0u32;
    loop {
        if a.count.is_some_and(|c| received >= c) {
            client.disconnect();
            return Ok(0);
        }
        let wait_until = deadline.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        match client.recv(wait_until) {
            Ok(Some(m)) => {
                let mut line = Vec::with_capacity(m.topic.len() + m.payload.len() + 2);
                if a.verbose {
                    line.extend_from_slice(m.topic.as_bytes());
                    line.push(b' ');
                }
                line.extend_from_slice(&m.payload);
                line.push(b'\n');
                ctx.say_raw(&line);
                if ctx.out_closed() {
                    // The reader is gone (or stdout failed): disconnect cleanly; main sets the rc.
                    client.disconnect();
                    return Ok(0);
                }
                received += 1;
            }
            Ok(None) if deadline.is_some_and(|d| Instant::now() >= d) => {
                client.disconnect();
                return Ok(RC_TIMEOUT);
            }
            Ok(None) => {}
            Err(MqttError::Stopped) => {
                client.disconnect();
                return Ok(stopped_rc());
            }
            Err(e) => return Err(wire_failure(e)),
        }
    }
}

/// A signal ends the subscription with 0 (like mosquitto_sub); the -W clock with 27.
fn stopped_rc() -> i32 {
    if sys::pending_signal().is_some() {
        0
    } else {
        RC_TIMEOUT
    }
}
