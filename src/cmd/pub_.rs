//! `mam pub`: publishes one MQTT message, with flags mirroring `mosquitto_pub`, through the same
//! client, configuration and retries as every other publisher (CORE 3).
//!
//! Startup stays lean because it is benchmarked against `mosquitto_pub` as a whole process: no
//! registry, no paths, and the openssl probe only when TLS is on.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;

use crate::cli::{self, Failure, Parsed};
use crate::ctx::Ctx;
use crate::knob;
use crate::mqtt::{self, codec, Client, Message, MqttConfig, MqttError, RetryPolicy, Role, Stop};
use crate::text;

pub const USAGE: &str = "
Usage: mam pub -t TOPIC (-m MSG | -f FILE | -s | -n) [-q 0|1] [-r] [-h HOST] [-p PORT]

Publishes one message (like mosquitto_pub) using the broker settings of CORE 3.1
(MQTT_BROKER, MQTT_PORT, MQTT_TLS, MQTT_USERNAME, MQTT_PASSWORD, MQTT_CA_FILE, ...), read after
the env file. Up to 3 attempts, 1 s then 2 s apart, for retryable failures.

Options:
  -t, --topic TOPIC      topic to publish to (no wildcards)
  -m, --message MSG      the payload
  -f, --file FILE        the payload is the content of FILE
  -s, --stdin-file       the payload is all of stdin
  -n, --null-message     an empty payload
  -q, --qos 0|1          quality of service (default 0); 1 waits for the broker's PUBACK
  -r, --retain           ask the broker to retain the message
  -h, --host HOST        broker host instead of MQTT_BROKER (like mosquitto_pub; help is --help)
  -p, --port PORT        broker port instead of MQTT_PORT
      --help             print this help

When -h/-p name a different broker than the environment, MQTT_PASSWORD is not sent (CORE 3.1).

Exit codes: 0 published (QoS 1: acknowledged), 1 env file unreadable or payload file unreadable,
2 usage or invalid configuration, 3 broker failure after retries.
";

#[derive(Debug, PartialEq)]
enum Payload {
    Message(Vec<u8>),
    File(PathBuf),
    Stdin,
}

#[derive(Debug)]
struct Args {
    topic: String,
    payload: Payload,
    qos: u8,
    retain: bool,
    host: Option<String>,
    port: Option<u16>,
}

/// `-q`: 0 or 1 (QoS 2 is not supported, CORE 3.2).
pub(crate) fn parse_qos(v: &OsString) -> Result<u8, Failure> {
    match v.to_str() {
        Some("0") => Ok(0),
        Some("1") => Ok(1),
        _ => Err(Failure::usage(format!(
            "-q: invalid value '{}' (expected 0 or 1)",
            text::one_line(&v.to_string_lossy())
        ))),
    }
}

/// `-p`: 1-65535 by the integer-knob grammar.
pub(crate) fn parse_port(v: &OsString) -> Result<u16, Failure> {
    let n = knob::flag("-p", v, 1)?;
    u16::try_from(n).map_err(|_| Failure::usage(format!("-p: invalid value '{n}' (expected 1-65535)")))
}

fn parse_args(args: Vec<OsString>) -> Result<Parsed<Args>, Failure> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let (mut topic, mut payload, mut qos, mut retain, mut host, mut port) = (None, None, 0, false, None, None);
    fn set_payload(payload: &mut Option<Payload>, v: Payload) -> Result<(), Failure> {
        if payload.is_some() {
            return Err(Failure::usage("pub: give only one of -m, -f, -s, -n"));
        }
        *payload = Some(v);
        Ok(())
    }
    while let Some(arg) = p.next()? {
        match arg {
            Short('t') | Long("topic") => topic = Some(cli::utf8("-t", p.value()?)?),
            Short('m') | Long("message") => set_payload(&mut payload, Payload::Message(p.value()?.into_vec()))?,
            Short('f') | Long("file") => set_payload(&mut payload, Payload::File(p.value()?.into()))?,
            Short('s') | Long("stdin-file") => set_payload(&mut payload, Payload::Stdin)?,
            Short('n') | Long("null-message") => set_payload(&mut payload, Payload::Message(Vec::new()))?,
            Short('q') | Long("qos") => qos = parse_qos(&p.value()?)?,
            Short('r') | Long("retain") => retain = true,
            Short('h') | Long("host") => host = Some(cli::utf8("-h", p.value()?)?).filter(|h| !h.is_empty()),
            Short('p') | Long("port") => port = Some(parse_port(&p.value()?)?),
            Long("help") => return Ok(Parsed::Help),
            _ => return Err(arg.unexpected().into()),
        }
    }
    let topic = topic.ok_or_else(|| Failure::usage("pub: -t TOPIC is required"))?;
    codec::check_topic(&topic).map_err(|e| Failure::usage(format!("-t: {e}")))?;
    let payload = payload.ok_or_else(|| Failure::usage("pub: give one of -m MSG, -f FILE, -s, -n"))?;
    Ok(Parsed::Run(Args { topic, payload, qos, retain, host, port }))
}

/// The configuration for an explicit `-h`/`-p`: the environment's, retargeted, with the password
/// withheld when the broker differs (CORE 3.1's broker-block rule).
pub(crate) fn target(ctx: &Ctx, env: MqttConfig, host: Option<String>, port: Option<u16>) -> MqttConfig {
    if host.is_none() && port.is_none() {
        return env;
    }
    let mut block = env.broker_block();
    if let Some(h) = host {
        block.host = h;
    }
    if let Some(p) = port {
        block.port = p;
    }
    let (cfg, warning) = env.for_block(&block);
    if let Some(w) = warning {
        ctx.diag(&w);
    }
    cfg
}

/// A wire error as the command's failure: encoding problems are usage (rc 2), the rest rc 3.
pub(crate) fn wire_failure(e: MqttError) -> Failure {
    match e {
        MqttError::Encode { .. } => Failure::usage(e),
        _ => Failure::wire(e),
    }
}

pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let Some(a) = cli::parse_or_help(ctx, USAGE, args, parse_args)? else {
        return Ok(0);
    };
    cli::load_env(ctx)?;
    let env = MqttConfig::from_ctx(ctx)?;
    let payload = match a.payload {
        Payload::Message(m) => m,
        Payload::File(f) => std::fs::read(&f)
            .map_err(|e| Failure::runtime(format!("{}: cannot read ({})", text::show_path(&f), e.kind())))?,
        Payload::Stdin => {
            let mut v = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut v)
                .map_err(|e| Failure::runtime(format!("stdin: cannot read ({})", e.kind())))?;
            v
        }
    };
    let cfg = target(ctx, env, a.host, a.port);
    let msg = Message::new(a.topic, payload, a.qos, a.retain);
    let stop = Stop::never();
    mqtt::with_retry(
        &RetryPolicy::standard("publish"),
        &stop,
        |w| ctx.diag(&w),
        |_| {
            let mut c = Client::connect(&cfg, Role::Pub, &stop)?;
            c.publish(&msg)?;
            c.disconnect();
            Ok(())
        },
    )
    .map_err(wire_failure)?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: &[&str]) -> Result<Parsed<Args>, Failure> {
        parse_args(v.iter().map(OsString::from).collect())
    }

    #[test]
    fn flags() {
        let Parsed::Run(a) = parse(&["-t", "a/b", "-m", "hi", "-q", "1", "-r", "-h", "h", "-p", "1999"]).unwrap()
        else {
            panic!()
        };
        assert_eq!((a.topic.as_str(), a.qos, a.retain), ("a/b", 1, true));
        assert_eq!(a.payload, Payload::Message(b"hi".to_vec()));
        assert_eq!((a.host.as_deref(), a.port), (Some("h"), Some(1999)));
        assert!(matches!(parse(&["--help"]).unwrap(), Parsed::Help));
        for bad in [
            &["-t", "a"][..],
            &["-m", "x"],
            &["-t", "a/#", "-m", "x"],
            &["-t", "a", "-m", "x", "-q", "2"],
            &["-t", "a", "-m", "x", "-p", "0"],
            &["-t", "a", "-m", "x", "-n"],
            &["-t", "a", "-m", "x", "--bogus"],
        ] {
            assert_eq!(parse(bad).unwrap_err().rc, 2, "{bad:?}");
        }
    }
}
