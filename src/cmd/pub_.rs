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
use crate::mqtt::config::{parse_broker_list, Endpoint};
use crate::mqtt::{self, codec, Client, Message, MqttConfig, MqttError, RetryPolicy, Role, Stop};
use crate::text;

pub const USAGE: &str = "
Usage: mam pub -t TOPIC (-m MSG | -f FILE | -s | -l | -n) [-q 0|1] [-r] [-h HOST] [-p PORT]
               [-L URL] [-u USER] [-i ID | -I PREFIX] [-d]

Publishes one message (like mosquitto_pub) using the broker settings of CORE 3.1
(MQTT_BROKER, MQTT_PORT, MQTT_TLS, MQTT_USERNAME, MQTT_PASSWORD, MQTT_CA_FILE, ...), read after
the env file. Up to 3 attempts, 1 s then 2 s apart, for retryable failures.

Options:
  -t, --topic TOPIC      topic to publish to (no wildcards)
  -m, --message MSG      the payload
  -f, --file FILE        the payload is the content of FILE
  -s, --stdin-file       the payload is all of stdin
  -l, --stdin-line       one message per line of stdin (one connection)
  -n, --null-message     an empty payload
  -q, --qos 0|1          quality of service (default 0); 1 waits for the broker's PUBACK
  -r, --retain           ask the broker to retain the message
  -h, --host HOSTS       the brokers instead of MQTT_BROKER: one host (like mosquitto_pub) or a
                         list in MQTT_BROKER's grammar, host[:port],... (help is --help)
  -p, --port PORT        the port of a -h entry without one, else of every broker (MQTT_PORT)
  -L, --url URL          mqtt://[USER@]HOST[:PORT]/TOPIC: host, port, user and topic at once
  -u, --username USER    user name instead of MQTT_USERNAME
  -i, --id ID            client id (default a random mam-pub-... id)
  -I, --id-prefix P      client id P followed by random hex
  -d, --debug            say on stderr what is sent where
      --help             print this help

When -h/-p name a different broker than the environment, MQTT_PASSWORD is not sent (CORE 3.1).
The mosquitto_pub flags that mam does not take say what to use instead: -P (a password never goes
on the command line: set MQTT_PASSWORD), -k (MAM_MQTT_KEEPALIVE_S), --cafile (MQTT_TLS=1 and
MQTT_CA_FILE), -V (MQTT 3.1.1 only).

Exit codes: 0 published (QoS 1: acknowledged), 1 env file unreadable or payload file unreadable,
2 usage or invalid configuration, 3 broker failure after retries.
";

#[derive(Debug, PartialEq)]
enum Payload {
    Message(Vec<u8>),
    File(PathBuf),
    Stdin,
    Lines,
}

#[derive(Debug)]
struct Args {
    topic: String,
    payload: Payload,
    qos: u8,
    retain: bool,
    host: Option<String>,
    port: Option<u16>,
    mosq: Mosq,
}

/// The mosquitto_pub/mosquitto_sub flags both commands share (issue 18): taken as mosquitto takes
/// them, or refused with what to use instead.
#[derive(Debug, Default)]
pub(crate) struct Mosq {
    pub id: Option<String>,
    pub id_prefix: Option<String>,
    pub debug: bool,
    pub username: Option<String>,
    /// `-L`: host, port and topic (the path).
    pub url: Option<(String, Option<u16>, String)>,
}

/// `-L mqtt://[user@]host[:port]/topic`. A password in the URL is refused like `-P`.
fn parse_url(cmd: &str, v: &str, mosq: &mut Mosq) -> Result<(String, Option<u16>, String), Failure> {
    let bad = |why: &str| Failure::usage(format!("{cmd}: -L: '{}' {why}", text::one_line(v)));
    if v.starts_with("mqtts://") {
        return Err(bad("uses TLS: set MQTT_TLS=1 (and MQTT_CA_FILE) and give -L mqtt://... or -h/-p"));
    }
    let rest = v.strip_prefix("mqtt://").ok_or_else(|| bad("is not an mqtt:// URL"))?;
    let (authority, topic) = rest.split_once('/').ok_or_else(|| bad("has no /TOPIC"))?;
    let hostport = match authority.rsplit_once('@') {
        Some((user, hp)) => {
            if user.contains(':') {
                return Err(Failure::usage(format!(
                    "{cmd}: -L: a password never goes on the command line; set MQTT_PASSWORD instead"
                )));
            }
            mosq.username = Some(user.to_string());
            hp
        }
        None => authority,
    };
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) => (h, Some(parse_port(&OsString::from(p))?)),
        None => (hostport, None),
    };
    if host.is_empty() || topic.is_empty() {
        return Err(bad("needs a host and a topic"));
    }
    Ok((host.to_string(), port, topic.to_string()))
}

/// A flag as an owned value, so the parser can be asked for its value after the match.
#[derive(Debug)]
pub(crate) enum Key {
    Short(char),
    Long(String),
    Value,
}

impl Key {
    pub(crate) fn of(arg: &lexopt::Arg<'_>) -> Key {
        match arg {
            lexopt::Arg::Short(c) => Key::Short(*c),
            lexopt::Arg::Long(l) => Key::Long(l.to_string()),
            lexopt::Arg::Value(_) => Key::Value,
        }
    }
}

/// One shared mosquitto flag: `Ok(true)` when `arg` was one and is taken, `Err` when it is one mam
/// refuses (with what to use instead), `Ok(false)` when it is none of them.
pub(crate) fn mosquitto_flag(cmd: &str, arg: &Key, p: &mut lexopt::Parser, mosq: &mut Mosq) -> Result<bool, Failure> {
    let instead = |flag: &str, what: &str| Err(Failure::usage(format!("{cmd}: {flag} is not taken: {what}")));
    let name = match arg {
        Key::Short(c) => format!("-{c}"),
        Key::Long(l) => format!("--{l}"),
        Key::Value => return Ok(false),
    };
    match name.as_str() {
        "-i" | "--id" => mosq.id = Some(cli::utf8("-i", p.value()?)?).filter(|s| !s.is_empty()),
        "-I" | "--id-prefix" => mosq.id_prefix = Some(cli::utf8("-I", p.value()?)?),
        "-d" | "--debug" => mosq.debug = true,
        "-u" | "--username" => mosq.username = Some(cli::utf8("-u", p.value()?)?).filter(|s| !s.is_empty()),
        "-L" | "--url" => {
            let v = cli::utf8("-L", p.value()?)?;
            mosq.url = Some(parse_url(cmd, &v, mosq)?);
        }
        "-P" | "--pw" => {
            return instead(
                "-P",
                "a password never goes on the command line (other users can read it); set MQTT_PASSWORD \
                 in the environment or in .mam.env",
            )
        }
        "-k" | "--keepalive" => return instead("-k", "set MAM_MQTT_KEEPALIVE_S (seconds)"),
        "--cafile" | "--capath" => return instead("--cafile", "set MQTT_TLS=1 and MQTT_CA_FILE"),
        "--cert" | "--key" | "--psk" | "--psk-identity" | "--insecure" | "--tls-version" => {
            return instead("TLS client options", "mam speaks TLS with MQTT_TLS=1 and MQTT_CA_FILE only")
        }
        "-V" | "--protocol-version" => {
            let v = p.value()?;
            if !matches!(v.to_str(), Some("mqttv311" | "311")) {
                return instead("-V", "mam speaks MQTT 3.1.1 only (-V mqttv311)");
            }
        }
        "-c" | "--disable-clean-session" => return instead("-c", "mam always connects with a clean session (CORE 3)"),
        "--will-topic" | "--will-payload" | "--will-qos" | "--will-retain" => {
            return instead("--will-*", "mam connects without a will (CORE 3)")
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// The client id the flags ask for, if any.
pub(crate) fn client_id(mosq: &Mosq) -> Result<Option<String>, Failure> {
    match (&mosq.id, &mosq.id_prefix) {
        (Some(id), _) => Ok(Some(id.clone())),
        (None, Some(prefix)) => {
            let hex = crate::sys::random_hex(8).map_err(|e| Failure::runtime(format!("random client id: {e}")))?;
            Ok(Some(format!("{prefix}{hex}")))
        }
        (None, None) => Ok(None),
    }
}

/// Connects with the flags' client id or a random one.
pub(crate) fn connect(cfg: &MqttConfig, role: Role, id: Option<&str>, stop: &Stop) -> Result<Client, MqttError> {
    match id {
        Some(id) => Client::connect_with_id(cfg, id, stop),
        None => Client::connect(cfg, role, stop),
    }
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
    let mut mosq = Mosq::default();
    fn set_payload(payload: &mut Option<Payload>, v: Payload) -> Result<(), Failure> {
        if payload.is_some() {
            return Err(Failure::usage("pub: give only one of -m, -f, -s, -l, -n"));
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
            Short('l') | Long("stdin-line") => set_payload(&mut payload, Payload::Lines)?,
            Short('n') | Long("null-message") => set_payload(&mut payload, Payload::Message(Vec::new()))?,
            Short('q') | Long("qos") => qos = parse_qos(&p.value()?)?,
            Short('r') | Long("retain") => retain = true,
            Short('h') | Long("host") => host = hosts("-h", cli::utf8("-h", p.value()?)?)?,
            Short('p') | Long("port") => port = Some(parse_port(&p.value()?)?),
            Long("help") => return Ok(Parsed::Help),
            other => {
                let key = Key::of(&other);
                let err: Failure = other.unexpected().into();
                if !mosquitto_flag("pub", &key, &mut p, &mut mosq)? {
                    return Err(err);
                }
            }
        }
    }
    if let Some((h, pt, t)) = mosq.url.clone() {
        host = host.or(Some(h));
        port = port.or(pt);
        topic = topic.or(Some(t));
    }
    let topic = topic.ok_or_else(|| Failure::usage("pub: -t TOPIC is required"))?;
    codec::check_topic(&topic).map_err(|e| Failure::usage(format!("-t: {e}")))?;
    let payload = payload.ok_or_else(|| Failure::usage("pub: give one of -m MSG, -f FILE, -s, -l, -n"))?;
    Ok(Parsed::Run(Args { topic, payload, qos, retain, host, port, mosq }))
}

/// `-h`'s value: empty is none; else a broker list in `MQTT_BROKER`'s grammar (issue 19: one host,
/// mosquitto's meaning, is a list of one), checked here, resolved against the ports in `target`.
pub(crate) fn hosts(flag: &str, v: String) -> Result<Option<String>, Failure> {
    if v.is_empty() {
        return Ok(None);
    }
    match parse_broker_list(&v, 1883) {
        Ok(_) => Ok(Some(v)),
        Err(why) => Err(Failure::usage(format!(
            "{flag}: '{}' is not a broker list (expected host[:port],...; {why})",
            text::one_line(&v)
        ))),
    }
}

/// The configuration for an explicit `-h`/`-p`: the environment's, retargeted, with the password
/// withheld when the brokers differ (CORE 3.1's broker-block rule, per entry).
pub(crate) fn target(ctx: &Ctx, env: MqttConfig, host: Option<String>, port: Option<u16>) -> MqttConfig {
    if host.is_none() && port.is_none() {
        return env;
    }
    // `-h` names the brokers (an entry without a port takes `-p`, else the environment's first
    // broker's port); `-p` alone re-ports every broker of the list.
    let list: Vec<Endpoint> = match host {
        Some(h) => {
            let default = port.unwrap_or(env.first().port);
            // `-h` was checked while parsing; a `-L` host that is no list stays one name, as before.
            parse_broker_list(&h, default).unwrap_or_else(|_| vec![Endpoint::new(h, default)])
        }
        None => env.brokers.iter().map(|e| Endpoint::new(e.host.clone(), port.unwrap_or(e.port))).collect(),
    };
    let block = env.broker_block().with_list(&list);
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
    let id = client_id(&a.mosq)?;
    let payloads = match a.payload {
        Payload::Message(m) => vec![m],
        Payload::File(f) => vec![std::fs::read(&f)
            .map_err(|e| Failure::runtime(format!("{}: cannot read ({})", text::show_path(&f), e.kind())))?],
        Payload::Stdin | Payload::Lines => {
            let mut v = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut v)
                .map_err(|e| Failure::runtime(format!("stdin: cannot read ({})", e.kind())))?;
            if a.payload == Payload::Lines {
                let mut lines: Vec<Vec<u8>> = v.split(|b| *b == b'\n').map(<[u8]>::to_vec).collect();
                if lines.last().is_some_and(Vec::is_empty) {
                    lines.pop();
                }
                lines
            } else {
                vec![v]
            }
        }
    };
    let mut cfg = target(ctx, env, a.host, a.port);
    if let Some(u) = a.mosq.username {
        cfg.username = Some(u);
    }
    let msgs: Vec<Message> = payloads.into_iter().map(|p| Message::new(a.topic.clone(), p, a.qos, a.retain)).collect();
    let stop = Stop::never();
    let debug = |line: String| {
        if a.mosq.debug {
            ctx.diag(&format!("NOTE: pub: {line}"));
        }
    };
    let mut sent = 0;
    mqtt::with_retry(
        &RetryPolicy::standard("publish"),
        &stop,
        |w| ctx.diag(&w),
        |_| {
            debug(format!("connecting to {}", cfg.addr()));
            let mut c = connect(&cfg, Role::Pub, id.as_deref(), &stop)?;
            // A retry resends only what the broker has not taken yet.
            while let Some(m) = msgs.get(sent) {
                c.publish(m)?;
                debug(format!("sent {} bytes to '{}' (qos {}, retain {})", m.payload.len(), m.topic, m.qos, m.retain));
                sent += 1;
            }
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

    #[test]
    fn flags() {
        let Parsed::Run(a) =
            parse_args(cli::argv(&["-t", "a/b", "-m", "hi", "-q", "1", "-r", "-h", "h", "-p", "1999"])).unwrap()
        else {
            panic!()
        };
        assert_eq!((a.topic.as_str(), a.qos, a.retain), ("a/b", 1, true));
        assert_eq!(a.payload, Payload::Message(b"hi".to_vec()));
        assert_eq!((a.host.as_deref(), a.port), (Some("h"), Some(1999)));
        // Issue 19: -h takes MQTT_BROKER's list grammar, and refuses what it refuses.
        let Parsed::Run(a) = parse_args(cli::argv(&["-t", "a", "-m", "x", "-h", "a:1,b"])).unwrap() else { panic!() };
        assert_eq!(a.host.as_deref(), Some("a:1,b"));
        let e = parse_args(cli::argv(&["-t", "a", "-m", "x", "-h", "a,,b"])).unwrap_err();
        assert_eq!(e.line, "ERROR: -h: 'a,,b' is not a broker list (expected host[:port],...; entry 2 is empty)");
        assert!(matches!(parse_args(cli::argv(&["--help"])).unwrap(), Parsed::Help));
        for bad in [
            &["-t", "a"][..],
            &["-m", "x"],
            &["-t", "a/#", "-m", "x"],
            &["-t", "a", "-m", "x", "-q", "2"],
            &["-t", "a", "-m", "x", "-p", "0"],
            &["-t", "a", "-m", "x", "-n"],
            &["-t", "a", "-m", "x", "--bogus"],
        ] {
            assert_eq!(parse_args(cli::argv(bad)).unwrap_err().rc, 2, "{bad:?}");
        }
    }

    /// Issue 18: the mosquitto_pub flags people type are taken, or refused with what to use.
    #[test]
    fn mosquitto_flags() {
        let argv = cli::argv(&["-L", "mqtt://bob@example.org:1999/a/b", "-m", "x", "-i", "me", "-d", "-V", "mqttv311"]);
        let Parsed::Run(a) = parse_args(argv).unwrap() else { panic!() };
        assert_eq!((a.topic.as_str(), a.host.as_deref(), a.port), ("a/b", Some("example.org"), Some(1999)));
        assert_eq!((a.mosq.username.as_deref(), a.mosq.id.as_deref(), a.mosq.debug), (Some("bob"), Some("me"), true));
        let Parsed::Run(a) = parse_args(cli::argv(&["-t", "a", "-l", "-u", "u1", "-I", "pre-"])).unwrap() else {
            panic!()
        };
        assert_eq!(
            (a.payload, a.mosq.username.as_deref(), a.mosq.id_prefix.as_deref()),
            (Payload::Lines, Some("u1"), Some("pre-"))
        );
        let e = parse_args(cli::argv(&["-t", "a", "-m", "x", "-P", "hunter2"])).unwrap_err();
        assert_eq!(e.rc, 2);
        assert!(e.line.contains("set MQTT_PASSWORD") && !e.line.contains("hunter2"), "{e}");
        let e = parse_args(cli::argv(&["-L", "mqtt://bob:hunter2@h/t", "-m", "x"])).unwrap_err();
        assert!(e.line.contains("set MQTT_PASSWORD") && !e.line.contains("hunter2"), "{e}");
        let e = parse_args(cli::argv(&["-t", "a", "-m", "x", "-k", "5"])).unwrap_err();
        assert!(e.line.contains("MAM_MQTT_KEEPALIVE_S"), "{e}");
        assert!(parse_args(cli::argv(&["-t", "a", "-m", "x", "-V", "mqttv5"])).unwrap_err().line.contains("3.1.1"));
    }
}
