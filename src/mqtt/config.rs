//! Broker configuration (CORE 3.1): the effective settings read from a `Ctx` after the env file is
//! loaded, the persisted broker block of a record, the password rule for layering it back, the
//! connection identity of CORE 3.5, and client ids (CORE 3.2).
//!
//! The password lives only in a `Secret` (no Display, a redacting Debug) and is never part of the
//! broker block or of any message. Nothing here prints; warnings are returned as values.

use std::ffi::OsString;
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::cred;
use crate::ctx::{ChildRole, Ctx};
use crate::knob::{self, ConfigError};

/// A secret value: compared and sent inside CONNECT, never displayed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Secret {
        Secret(s.into())
    }
    /// The raw value, for the CONNECT packet only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// One broker of a list: a host (name or IP literal, without brackets) and its port.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
}

impl Endpoint {
    pub fn new(host: impl Into<String>, port: u16) -> Endpoint {
        Endpoint { host: host.into(), port }
    }

    /// `host:port`, IPv6 literals bracketed: how the endpoint is named in messages and records.
    pub fn addr(&self) -> String {
        host_port(&self.host, self.port)
    }

    /// True when the host is an IP literal (A22: `-verify_ip` instead of `-servername`).
    pub fn host_is_ip(&self) -> bool {
        self.host.parse::<IpAddr>().is_ok()
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.addr())
    }
}

/// How long a broker cluster may stall when one of its nodes dies (issue 19, docs/CLUSTER.md): the
/// NATS 2.9 cluster of the tests went 7-10.5 s without delivering when the node leading its MQTT
/// streams was killed; 15 s covers that with a margin. Bridged mosquittos do not stall.
pub const CLUSTER_STALL_S: u64 = 15;

/// The shortest idle window (K x N, seconds) that survives the death of a node of a broker list of
/// several entries: the cluster's stall, one beat period `n` and one connect deadline, after which
/// the timer's next beat is through another node.
pub fn window_floor_s(n: u64, connect_s: u64) -> u64 {
    CLUSTER_STALL_S + n + connect_s
}

/// The longest broker list `MQTT_BROKER` may hold (issue 19, decided): a connect shares one deadline
/// among the entries, and a list longer than this would leave each too little of it.
pub const MAX_BROKERS: usize = 16;

/// Parses `MQTT_BROKER`'s broker list (issue 19): comma-separated `host[:port]` entries, ASCII blanks
/// around each ignored; an entry without a port takes `default_port`. An IPv6 literal is written
/// `[addr]` or `[addr]:port` (a bare `addr` has no port). Repeated entries are kept once, in their
/// first place. The error is the problem alone (`entry 2 is empty`), for the caller's message.
pub fn parse_broker_list(raw: &str, default_port: u16) -> Result<Vec<Endpoint>, String> {
    let entries: Vec<&str> = raw.split(',').map(|e| e.trim_matches(|c| c == ' ' || c == '\t')).collect();
    if entries.len() > MAX_BROKERS {
        return Err(format!("{} entries, at most {MAX_BROKERS}", entries.len()));
    }
    let mut out: Vec<Endpoint> = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let n = i + 1;
        if e.is_empty() {
            return Err(format!("entry {n} is empty"));
        }
        let (host, port) = if let Some(rest) = e.strip_prefix('[') {
            let (h, after) = rest.split_once(']').ok_or_else(|| format!("entry {n} has '[' without ']'"))?;
            if h.parse::<std::net::Ipv6Addr>().is_err() {
                return Err(format!("entry {n}: '{h}' in brackets is not an IPv6 address"));
            }
            match after {
                "" => (h, None),
                p => (h, Some(p.strip_prefix(':').ok_or_else(|| format!("entry {n}: expected ':PORT' after ']'"))?)),
            }
        } else if e.matches(':').count() > 1 {
            if e.parse::<std::net::Ipv6Addr>().is_err() {
                return Err(format!("entry {n}: '{e}' is not a host[:port]"));
            }
            (*e, None)
        } else {
            match e.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (*e, None),
            }
        };
        if !valid_host(host) {
            return Err(format!("entry {n}: '{host}' is not a host name or IP address"));
        }
        let port = match port {
            None => default_port,
            Some(p) => knob::parse_u32(p)
                .and_then(|v| u16::try_from(v).ok())
                .filter(|v| *v >= 1)
                .ok_or_else(|| format!("entry {n}: port '{p}' is not 1-65535"))?,
        };
        let ep = Endpoint::new(host, port);
        if !out.contains(&ep) {
            out.push(ep);
        }
    }
    Ok(out)
}

/// A host name (RFC 1123 labels, `_` tolerated) or an IP literal.
fn valid_host(h: &str) -> bool {
    if h.parse::<IpAddr>().is_ok() {
        return true;
    }
    !h.is_empty()
        && h.len() <= 253
        && h.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// `a:1,b:2`: a list as one value (messages, `MQTT_BROKER`).
pub fn show_list(list: &[Endpoint]) -> String {
    list.iter().map(Endpoint::addr).collect::<Vec<_>>().join(",")
}

/// The effective broker settings of one invocation (CORE 3.1).
#[derive(Clone, Debug)]
pub struct MqttConfig {
    /// The broker list, in the order connects try it; never empty (issue 19).
    pub brokers: Vec<Endpoint>,
    pub tls: bool,
    pub username: Option<String>,
    pub password: Option<Secret>,
    pub ca_file: Option<String>,
    pub topic_root: String,
    /// One budget for TCP + TLS + CONNACK, and for each PUBACK/SUBACK wait.
    pub connect_timeout: Duration,
    /// Seconds, as sent in CONNECT.
    pub keepalive_s: u16,
    /// The TLS shim executable (`MAM_OPENSSL`, from the real environment only: issue 12).
    pub openssl: OsString,
    /// The environment the TLS shim runs with: the context's child environment minus secrets.
    pub child_env: Vec<(OsString, OsString)>,
}

/// `1/true/yes/on` or `0/false/no/off/""`, case-insensitive (CORE 3.1).
pub fn parse_bool(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" | "" => Some(false),
        _ => None,
    }
}

impl MqttConfig {
    /// Reads CORE 3.1's variables from `ctx` (call after `cli::load_env`). Invalid values name the
    /// variable, never its value (it may come from the env file).
    pub fn from_ctx(ctx: &Ctx) -> Result<MqttConfig, ConfigError> {
        MqttConfig::from_ctx_near(ctx, None)
    }

    /// `from_ctx` for a process that works on `registry`: the embedded broker's credentials are also
    /// looked for in the control root that holds the registry (`<root>/.mam/jobs`), so an agent's
    /// publish line, which runs from anywhere without the workspace variables (ORCH 0.3), still
    /// finds its workspace's broker credentials.
    pub fn from_ctx_near(ctx: &Ctx, registry: Option<&Path>) -> Result<MqttConfig, ConfigError> {
        let (tls, port) = tls_and_port(ctx)?;
        let connect_s = knob::env_or(ctx, "MAM_MQTT_CONNECT_TIMEOUT_S", 1, 10)?;
        let keepalive = knob::env_or(ctx, "MAM_MQTT_KEEPALIVE_S", 1, 60)?;
        let keepalive_s = u16::try_from(keepalive)
            .map_err(|_| ConfigError::var(ctx, "MAM_MQTT_KEEPALIVE_S", "a keepalive", "seconds, 1-65535"))?;
        let child_env = ctx.child_env_for(ChildRole::Tool);
        let brokers = match ctx.var_nonempty("MQTT_BROKER") {
            None => vec![Endpoint::new("127.0.0.1", port)],
            Some(v) => parse_broker_list(&v, port).map_err(|why| {
                ConfigError::var(ctx, "MQTT_BROKER", "a broker list", format!("comma-separated host[:port]; {why}"))
            })?,
        };
        let topic_root = ctx.var_nonempty("MQTT_TOPIC_ROOT").unwrap_or_else(|| "mam".into());
        if let Err(why) = check_topic_root(&topic_root) {
            return Err(ConfigError::var(ctx, "MQTT_TOPIC_ROOT", "a topic root", why));
        }
        let mut username = ctx.var_nonempty("MQTT_USERNAME");
        let mut password = ctx.var_nonempty("MQTT_PASSWORD").map(Secret);
        // The embedded broker's generated credentials go only to the one loopback broker they are for.
        let single_loopback = brokers.len() == 1 && is_loopback(&brokers[0].host);
        // Neither MQTT_BROKER nor MQTT_PORT: the workspace's own broker, on the port its credential
        // file records (issue 32: each repository's broker may listen on its own port).
        let port_named = ctx.var_nonempty("MQTT_BROKER").is_some() || ctx.var_nonempty("MQTT_PORT").is_some();
        let mut brokers = brokers;
        if username.is_none() && password.is_none() && !tls && single_loopback {
            let want = if port_named { Some(brokers[0].port) } else { None };
            if let Some(c) = workspace_creds(ctx, want, registry) {
                brokers[0].port = c.port;
                username = Some(c.username);
                password = Some(Secret(c.password.expose().to_string()));
            }
        }
        Ok(MqttConfig {
            brokers,
            tls,
            username,
            password,
            ca_file: ctx.var_nonempty("MQTT_CA_FILE"),
            topic_root,
            connect_timeout: Duration::from_secs(connect_s.into()),
            keepalive_s,
            openssl: ctx.env_only("MAM_OPENSSL").map_or_else(|| "openssl".into(), PathBuf::into_os_string),
            child_env,
        })
    }

    /// `host:port` (IPv6 literals bracketed) of each broker, comma-separated: the broker address
    /// used in messages about the whole list.
    pub fn addr(&self) -> String {
        show_list(&self.brokers)
    }

    /// The first broker of the list (the list is never empty).
    pub fn first(&self) -> &Endpoint {
        &self.brokers[0]
    }

    /// The broker block to persist in a record (never a password): `host` and `port` name the first
    /// broker (what a reader of one broker uses), `brokers` the whole list when it has more than one.
    pub fn broker_block(&self) -> BrokerBlock {
        BrokerBlock {
            host: self.first().host.clone(),
            port: self.first().port,
            brokers: if self.brokers.len() > 1 {
                self.brokers.iter().map(Endpoint::addr).collect()
            } else {
                Vec::new()
            },
            tls: self.tls,
            username: self.username.clone(),
            ca_file: self.ca_file.clone(),
            topic_root: self.topic_root.clone(),
        }
    }

    /// The configuration for connecting to a record's broker block (CORE 3.1): the block's fields,
    /// this configuration's timeouts and shim, and the password only when the block's host and port
    /// equal this (effective environment) configuration's and its transport is at least as strong:
    /// TLS on whenever the environment's is, and, with TLS, the environment's CA (or the system
    /// store on both sides). Otherwise a warning naming the differing field(s) is returned; it is
    /// only produced when there is a password to withhold.
    pub fn for_block(&self, block: &BrokerBlock) -> (MqttConfig, Option<String>) {
        let list = block.list();
        let mut differs = Vec::new();
        // Issue 19: the password goes only to brokers the environment names itself.
        let known_host = |e: &Endpoint| self.brokers.iter().any(|b| b.host == e.host);
        if !list.iter().all(known_host) {
            differs.push("host");
        }
        if list.iter().any(|e| known_host(e) && !self.brokers.contains(e)) {
            differs.push("port");
        }
        // A record must not turn TLS off (the password would travel in plaintext) ...
        if self.tls && !block.tls {
            differs.push("tls");
        }
        // ... nor name another CA (a broker the environment does not trust would get it).
        if block.tls && block.ca_file != self.ca_file {
            differs.push("ca_file");
        }
        let mut warning = None;
        let password = if differs.is_empty() {
            self.password.clone()
        } else {
            if self.password.is_some() {
                warning = Some(format!(
                    "WARNING: broker in record differs from environment ({}); connecting without password",
                    differs.join(", ")
                ));
            }
            None
        };
        let cfg = MqttConfig {
            brokers: list,
            tls: block.tls,
            username: block.username.clone(),
            password,
            ca_file: block.ca_file.clone(),
            topic_root: block.topic_root.clone(),
            ..self.clone()
        };
        (cfg, warning)
    }

    /// The frozen identity a persistent connection is reused under (CORE 3.5).
    pub fn identity(&self) -> Identity {
        Identity {
            brokers: self.brokers.clone(),
            tls: self.tls,
            ca_file: self.ca_file.clone(),
            username: self.username.clone(),
            password: self.password.clone(),
            keepalive_s: self.keepalive_s,
            topic_root: self.topic_root.clone(),
        }
    }
}

/// `MQTT_TLS` and `MQTT_PORT` (the port of a broker list entry without its own, CORE 3.1).
pub fn tls_and_port(ctx: &Ctx) -> Result<(bool, u16), ConfigError> {
    let tls = match ctx.var("MQTT_TLS") {
        None => false,
        Some(v) => parse_bool(&v)
            .ok_or_else(|| ConfigError::var(ctx, "MQTT_TLS", "a yes/no value", "1/true/yes/on or 0/false/no/off"))?,
    };
    let port = match ctx.var_nonempty("MQTT_PORT") {
        None => default_port(tls),
        Some(v) => knob::parse_u32(&v)
            .and_then(|n| u16::try_from(n).ok())
            .filter(|n| *n >= 1)
            .ok_or_else(|| ConfigError::var(ctx, "MQTT_PORT", "a port", "digits only, 1-65535"))?,
    };
    Ok((tls, port))
}

/// True for a host that names this machine: `localhost`, `127.0.0.0/8`, `::1`.
pub fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The embedded broker's generated credentials for `port` from the workspace's credential file
/// (`<control root>/.mam/broker.cred`, issue 12 item 4), if it is there, trustworthy and names this
/// port (any port when `port` is None: nothing named one). An untrustworthy or broken file is ignored with one WARNING per file and process.
fn workspace_creds(ctx: &Ctx, port: Option<u16>, registry: Option<&Path>) -> Option<cred::Creds> {
    // An untrusted control root (another user's) gives no credentials.
    let mut roots: Vec<PathBuf> = crate::paths::control_root(ctx).ok().into_iter().collect();
    // The control root that holds the registry: the parent of its nearest `.mam` ancestor.
    if let Some(root) = registry.and_then(|r| r.ancestors().find(|a| a.file_name().is_some_and(|n| n == ".mam"))) {
        roots.extend(root.parent().map(Path::to_path_buf));
    }
    roots.dedup();
    roots.iter().find_map(|root| {
        let path = cred::path(root);
        match cred::read(&path) {
            Ok(c) if port.is_none_or(|p| c.port == p) => Some(c),
            Ok(_) | Err(cred::ReadError::Missing) => None,
            Err(e) => {
                static WARNED: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
                let mut warned = WARNED.lock().unwrap_or_else(|e| e.into_inner());
                if !warned.contains(&path) {
                    warned.push(path.clone());
                    ctx.diag(&format!(
                        "WARNING: {}: broker credentials ignored ({e}); connecting without them",
                        crate::text::show_path(&path)
                    ));
                }
                None
            }
        }
    })
}

/// 1883, or 8883 with TLS.
pub fn default_port(tls: bool) -> u16 {
    if tls {
        8883
    } else {
        1883
    }
}

/// `host:port`, bracketing IPv6 literals.
pub fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The broker block of a record (CORE 3.1). Deliberately has no password field. `brokers` holds the
/// whole list (`host:port` each) when it has more than one entry; `host` and `port` are its first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerBlock {
    pub host: String,
    pub port: u16,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub brokers: Vec<String>,
    pub tls: bool,
    pub username: Option<String>,
    pub ca_file: Option<String>,
    pub topic_root: String,
}

impl BrokerBlock {
    /// The block's broker list: `brokers` when it parses (each entry with its port), else `host`/`port`.
    pub fn list(&self) -> Vec<Endpoint> {
        if !self.brokers.is_empty() {
            if let Ok(l) = parse_broker_list(&self.brokers.join(","), self.port) {
                if !l.is_empty() {
                    return l;
                }
            }
        }
        vec![Endpoint::new(self.host.trim_start_matches('[').trim_end_matches(']'), self.port)]
    }

    /// The block re-pointed at `list` (issue 19, `mam registry repoint`): everything else kept.
    pub fn with_list(&self, list: &[Endpoint]) -> BrokerBlock {
        let first = &list[0];
        BrokerBlock {
            host: first.host.clone(),
            port: first.port,
            brokers: if list.len() > 1 { list.iter().map(Endpoint::addr).collect() } else { Vec::new() },
            ..self.clone()
        }
    }
}

/// What NATS's MQTT gateway cannot carry in a topic level (issue 19): `.` and blanks (refused by
/// nats-server 2.9; 2.10 maps `.` to `//`, which mosquitto peers would not see the same way),
/// NATS's wildcards `*` and `>` as a whole level, MQTT's `+` and `#`, and control characters.
/// `None` when `level` is carried by every broker mam supports, else the reason.
pub fn topic_level_problem(level: &str) -> Option<&'static str> {
    if level.is_empty() {
        return Some("an empty level");
    }
    if level.contains('.') {
        return Some("'.' (NATS separates subject tokens with it)");
    }
    if level.chars().any(char::is_whitespace) {
        return Some("a blank (NATS refuses it)");
    }
    if level.chars().any(char::is_control) {
        return Some("a control character");
    }
    if level.contains('+') || level.contains('#') {
        return Some("an MQTT wildcard ('+' or '#')");
    }
    if level == "*" || level == ">" {
        return Some("a NATS wildcard ('*' or '>')");
    }
    if level.starts_with('$') {
        return Some("a leading '$' (reserved by brokers)");
    }
    None
}

/// The topic level that carries job id `id` (issue 19): the id with each `.` as `~`, a character
/// job ids never hold (CORE 0.4), so the mapping is one to one and every broker carries the result.
pub fn job_topic_level(id: &str) -> String {
    id.replace('.', "~")
}

/// The job id a topic level carries: `job_topic_level` undone (a level written by an older mam,
/// with its `.` as is, is its own id).
pub fn job_id_of_level(level: &str) -> String {
    level.replace('~', ".")
}

/// `<root>/jobs/<level>`: a new job's topic prefix (CORE 4.1, issue 19).
pub fn job_topic_prefix(root: &str, id: &str) -> String {
    format!("{root}/jobs/{}", job_topic_level(id))
}

/// `MQTT_TOPIC_ROOT`'s rule: one or more `/`-separated levels, each carried by every broker.
pub fn check_topic_root(root: &str) -> Result<(), String> {
    for level in root.split('/') {
        if let Some(why) = topic_level_problem(level) {
            return Err(format!(
                "levels separated by '/', each of letters, digits, '_', '-' or ':'; this one has {why}"
            ));
        }
    }
    Ok(())
}

/// Every field a persistent connection must share with a publish to be reused (CORE 3.5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub brokers: Vec<Endpoint>,
    pub tls: bool,
    pub ca_file: Option<String>,
    pub username: Option<String>,
    pub password: Option<Secret>,
    pub keepalive_s: u16,
    pub topic_root: String,
}

impl Identity {
    /// The first field that differs, by name only (never a value).
    pub fn differs(&self, other: &Identity) -> Option<&'static str> {
        let hosts = |i: &Identity| i.brokers.iter().map(|e| e.host.clone()).collect::<Vec<_>>();
        if hosts(self) != hosts(other) {
            Some("host")
        } else if self.brokers != other.brokers {
            Some("port")
        } else if self.tls != other.tls {
            Some("tls")
        } else if self.ca_file != other.ca_file {
            Some("ca_file")
        } else if self.username != other.username {
            Some("username")
        } else if self.password != other.password {
            Some("password")
        } else if self.keepalive_s != other.keepalive_s {
            Some("keepalive")
        } else if self.topic_root != other.topic_root {
            Some("topic_root")
        } else {
            None
        }
    }
}

/// Who is connecting; the role is part of the client id (CORE 3.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Pub,
    Hb,
    Sub,
    Dmn,
    Rmt,
    Dsp,
    /// `mam broker check` (issue 19).
    Chk,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Pub => "pub",
            Role::Hb => "hb",
            Role::Sub => "sub",
            Role::Dmn => "dmn",
            Role::Rmt => "rmt",
            Role::Dsp => "dsp",
            Role::Chk => "chk",
        }
    }
}

/// Longest client id a 3.1.1 broker must accept.
pub const MAX_CLIENT_ID: usize = 23;

/// `mam-<role>-<pid>-<6hex>` with fresh random hex, at most 23 bytes (CORE 3.2).
pub fn client_id(role: Role) -> std::io::Result<String> {
    Ok(client_id_from(role, std::process::id(), &crate::sys::random_hex(3)?))
}

/// The client id from explicit parts: the pid keeps its last digits when the id would be too long.
pub fn client_id_from(role: Role, pid: u32, hex6: &str) -> String {
    let fixed = "mam-".len() + role.as_str().len() + 2 + hex6.len();
    let pid = pid.to_string();
    let room = MAX_CLIENT_ID.saturating_sub(fixed);
    let pid = &pid[pid.len().saturating_sub(room)..];
    format!("mam-{}-{pid}-{hex6}", role.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn ctx(vars: &[(&str, &str)]) -> Ctx {
        Ctx::with_env(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())), Path::new("/"))
    }

    #[test]
    fn defaults() {
        let c = MqttConfig::from_ctx(&ctx(&[])).unwrap();
        assert_eq!((c.addr().as_str(), c.tls, c.topic_root.as_str()), ("127.0.0.1:1883", false, "mam"));
        assert_eq!(c.connect_timeout, Duration::from_secs(10));
        assert_eq!(c.keepalive_s, 60);
        assert_eq!(c.openssl, "openssl");
        let c = MqttConfig::from_ctx(&ctx(&[("MQTT_TLS", "YES")])).unwrap();
        assert_eq!((c.tls, c.first().port), (true, 8883));
        let c = MqttConfig::from_ctx(&ctx(&[("MQTT_TLS", ""), ("MQTT_PORT", " 1999 ")])).unwrap();
        assert_eq!((c.tls, c.first().port), (false, 1999));
    }

    #[test]
    fn invalid_values_are_usage_errors_naming_value_and_origin() {
        for (k, v) in [
            ("MQTT_TLS", "maybe"),
            ("MQTT_PORT", "0"),
            ("MQTT_PORT", "65536"),
            ("MQTT_PORT", "x1"),
            ("MAM_MQTT_KEEPALIVE_S", "70000"),
            ("MAM_MQTT_CONNECT_TIMEOUT_S", "0"),
        ] {
            let e = MqttConfig::from_ctx(&ctx(&[(k, v)])).unwrap_err();
            assert_eq!(e.name, k, "{k}={v}");
            // Issue 18: the value and where it came from are named (none of these is a secret).
            assert!(e.to_string().contains(&format!("'{v}' from the environment")), "{e}");
        }
    }

    /// Issue 19: `MQTT_BROKER` is a list of `host[:port]`; `MQTT_PORT` is the port of an entry
    /// without one.
    #[test]
    fn broker_lists_parse_in_order_with_their_ports() {
        let c = MqttConfig::from_ctx(&ctx(&[
            ("MQTT_BROKER", " a.example , 10.0.0.2:1999,[::1]:7,::2,[fe80::1]"),
            ("MQTT_PORT", "1884"),
        ]))
        .unwrap();
        assert_eq!(c.addr(), "a.example:1884,10.0.0.2:1999,[::1]:7,[::2]:1884,[fe80::1]:1884");
        assert_eq!(c.brokers[2], Endpoint::new("::1", 7));
        // A repeated entry is kept once; a single host is a list of one, as before issue 19.
        let c = MqttConfig::from_ctx(&ctx(&[("MQTT_BROKER", "h:1,h:1,h")])).unwrap();
        assert_eq!(c.addr(), "h:1,h:1883");
        assert_eq!(MqttConfig::from_ctx(&ctx(&[("MQTT_BROKER", "h")])).unwrap().brokers, [Endpoint::new("h", 1883)]);
        // The record keeps the whole list; a single broker's block is what it was before.
        let c = MqttConfig::from_ctx(&ctx(&[("MQTT_BROKER", "a:1,b:2")])).unwrap();
        let json = serde_json::to_value(c.broker_block()).unwrap();
        assert_eq!((json["host"].as_str(), json["port"].as_u64()), (Some("a"), Some(1)));
        assert_eq!(json["brokers"], serde_json::json!(["a:1", "b:2"]));
        assert_eq!(c.broker_block().list(), c.brokers);
        let one = serde_json::to_value(MqttConfig::from_ctx(&ctx(&[])).unwrap().broker_block()).unwrap();
        assert!(one.get("brokers").is_none(), "{one}");
        let old: BrokerBlock = serde_json::from_value(serde_json::json!({"host": "h", "port": 5, "tls": false,
            "username": null, "ca_file": null, "topic_root": "mam"}))
        .unwrap();
        assert_eq!(old.list(), [Endpoint::new("h", 5)]);
    }

    #[test]
    fn bad_broker_lists_name_the_value_its_origin_and_the_entry() {
        let hundred = (0..100).map(|i| format!("h{i}")).collect::<Vec<_>>().join(",");
        for (v, why) in [
            ("a,,b", "entry 2 is empty"),
            ("a,", "entry 2 is empty"),
            ("a:0", "entry 1: port '0' is not 1-65535"),
            ("a:1,b:65536", "entry 2: port '65536' is not 1-65535"),
            ("a:x", "entry 1: port 'x' is not 1-65535"),
            ("a b", "entry 1: 'a b' is not a host name or IP address"),
            ("[::1", "entry 1 has '[' without ']'"),
            ("a/b:1", "entry 1: 'a/b' is not a host name or IP address"),
            (hundred.as_str(), "100 entries, at most 16"),
        ] {
            let e = MqttConfig::from_ctx(&ctx(&[("MQTT_BROKER", v)])).unwrap_err();
            assert_eq!(e.name, "MQTT_BROKER");
            assert_eq!(
                e.to_string(),
                format!("MQTT_BROKER: '{v}' from the environment is not a broker list (expected comma-separated host[:port]; {why})")
            );
        }
    }

    /// Issue 19: a topic root NATS's MQTT gateway cannot carry is refused before anything is recorded.
    #[test]
    fn topic_roots_every_broker_carries() {
        for ok in ["mam", "team-a/mam", "a_b:c/x"] {
            assert!(MqttConfig::from_ctx(&ctx(&[("MQTT_TOPIC_ROOT", ok)])).is_ok(), "{ok}");
        }
        for (bad, why) in [
            ("my.team", "'.'"),
            ("my team", "a blank"),
            ("a//b", "an empty level"),
            ("a/+", "an MQTT wildcard"),
            ("a/>", "a NATS wildcard"),
            ("$SYS", "a leading '$'"),
        ] {
            let e = MqttConfig::from_ctx(&ctx(&[("MQTT_TOPIC_ROOT", bad)])).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("MQTT_TOPIC_ROOT: '{bad}' from the environment is not a topic root")),
                "{e}"
            );
            assert!(e.contains(why), "{e}");
        }
    }

    #[test]
    fn the_password_goes_only_to_brokers_the_environment_names() {
        let env = MqttConfig::from_ctx(&ctx(&[("MQTT_PASSWORD", "s3cret"), ("MQTT_BROKER", "a:1,b:2,c:3")])).unwrap();
        let sub = env.broker_block().with_list(&[Endpoint::new("c", 3), Endpoint::new("a", 1)]);
        let (c, w) = env.for_block(&sub);
        assert!(c.password.is_some() && w.is_none());
        assert_eq!(c.addr(), "c:3,a:1", "the record's order");
        let (c, w) = env.for_block(&env.broker_block().with_list(&[Endpoint::new("a", 1), Endpoint::new("d", 1)]));
        assert!(c.password.is_none());
        assert!(w.unwrap().contains("(host)"));
        let (_, w) = env.for_block(&env.broker_block().with_list(&[Endpoint::new("a", 9)]));
        assert!(w.unwrap().contains("(port)"));
    }

    #[test]
    fn secrets_stay_out_of_debug_block_and_shim_env() {
        let c = MqttConfig::from_ctx(&ctx(&[("MQTT_PASSWORD", "s3cret"), ("MAM_DISPATCH_SECRET", "d1")])).unwrap();
        assert!(!format!("{c:?}").contains("s3cret"));
        assert!(c.child_env.iter().all(|(k, _)| k != "MQTT_PASSWORD" && k != "MAM_DISPATCH_SECRET"));
        let json = serde_json::to_string(&c.broker_block()).unwrap();
        assert!(!json.contains("s3cret") && !json.contains("password"), "{json}");
    }

    #[test]
    fn block_password_rule() {
        let env = MqttConfig::from_ctx(&ctx(&[("MQTT_PASSWORD", "s3cret"), ("MQTT_USERNAME", "u")])).unwrap();
        let block = env.broker_block();
        let (c, w) = env.for_block(&block);
        assert_eq!(c.password.as_ref().map(Secret::expose), Some("s3cret"));
        assert!(w.is_none());
        let other = BrokerBlock { host: "10.0.0.9".into(), ..block.clone() };
        let (c, w) = env.for_block(&other);
        assert!(c.password.is_none());
        assert_eq!(
            w.as_deref(),
            Some("WARNING: broker in record differs from environment (host); connecting without password")
        );
        let other = BrokerBlock { port: 1999, ..block };
        let (_, w) = env.for_block(&other);
        assert!(w.unwrap().contains("(port)"));
    }

    /// Issue 12 item 7: a block cannot weaken the transport the password travels over.
    #[test]
    fn block_cannot_turn_tls_off_or_swap_the_ca_and_keep_the_password() {
        let vars = [("MQTT_PASSWORD", "s3cret"), ("MQTT_TLS", "1"), ("MQTT_CA_FILE", "/etc/ca.pem")];
        let env = MqttConfig::from_ctx(&ctx(&vars)).unwrap();
        let block = env.broker_block();
        let (c, w) = env.for_block(&block);
        assert_eq!((c.password.as_ref().map(Secret::expose), w), (Some("s3cret"), None));
        let plain = BrokerBlock { tls: false, ..block.clone() };
        let (c, w) = env.for_block(&plain);
        assert!(c.password.is_none() && !c.tls);
        assert_eq!(
            w.as_deref(),
            Some("WARNING: broker in record differs from environment (tls); connecting without password")
        );
        for ca in [Some("/tmp/evil.pem".to_string()), None] {
            let swapped = BrokerBlock { ca_file: ca, ..block.clone() };
            let (c, w) = env.for_block(&swapped);
            assert!(c.password.is_none());
            assert!(w.unwrap().contains("(ca_file)"));
        }
        // No CA in the environment: the block may not bring one either.
        let env = MqttConfig::from_ctx(&ctx(&[("MQTT_PASSWORD", "s3cret"), ("MQTT_TLS", "1")])).unwrap();
        let (c, _) = env.for_block(&env.broker_block());
        assert!(c.password.is_some());
        let (c, w) = env.for_block(&BrokerBlock { ca_file: Some("/tmp/evil.pem".into()), ..env.broker_block() });
        assert!(c.password.is_none() && w.unwrap().contains("(ca_file)"));
        // Turning TLS on is stronger, not weaker; with TLS off in both, the CA does not matter.
        let env = MqttConfig::from_ctx(&ctx(&[("MQTT_PASSWORD", "s3cret"), ("MQTT_PORT", "8883")])).unwrap();
        let (c, _) = env.for_block(&BrokerBlock { tls: true, ..env.broker_block() });
        assert!(c.password.is_some());
        let (c, _) = env.for_block(&BrokerBlock { ca_file: Some("/x.pem".into()), ..env.broker_block() });
        assert!(c.password.is_some());
    }

    #[test]
    fn identity_names_the_field_only() {
        let a = MqttConfig::from_ctx(&ctx(&[("MQTT_USERNAME", "alice")])).unwrap();
        let b = MqttConfig::from_ctx(&ctx(&[("MQTT_USERNAME", "bob")])).unwrap();
        assert_eq!(a.identity().differs(&b.identity()), Some("username"));
        let t = MqttConfig::from_ctx(&ctx(&[("MQTT_USERNAME", "alice"), ("MQTT_TLS", "1"), ("MQTT_PORT", "1883")]))
            .unwrap();
        assert_eq!(a.identity().differs(&t.identity()), Some("tls"));
        assert_eq!(a.identity().differs(&a.identity()), None);
    }

    #[test]
    fn b9_client_ids_unique_and_short() {
        let mut seen = std::collections::HashSet::new();
        for role in [Role::Pub, Role::Hb, Role::Sub, Role::Dmn, Role::Rmt, Role::Dsp, Role::Chk] {
            for _ in 0..100 {
                let id = client_id(role).unwrap();
                assert!(id.len() <= MAX_CLIENT_ID, "{id}");
                assert!(id.starts_with(&format!("mam-{}-{}-", role.as_str(), std::process::id() % 100_000_000)));
                assert!(seen.insert(id.clone()), "duplicate {id}");
            }
        }
        let long = client_id_from(Role::Dmn, u32::MAX, "abcdef");
        assert_eq!(long, "mam-dmn-94967295-abcdef");
        assert_eq!(long.len(), 23);
    }

    #[test]
    fn workspace_credentials_are_used_only_for_a_loopback_plain_broker_on_their_port() {
        use std::os::unix::fs::PermissionsExt;
        let root = std::env::temp_dir().join(format!("mam-cfg-cred-{}", crate::sys::random_hex(6).unwrap()));
        let creds = cred::Creds::generate(1999).unwrap();
        let file = cred::path(&root);
        cred::write(&file, &creds).unwrap();
        let at = |vars: &[(&str, &str)]| {
            let c = Ctx::with_env(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())), &root);
            let cfg = MqttConfig::from_ctx(&c).unwrap();
            (cfg.username, cfg.password.map(|p| p.expose().to_string()), c.err.text())
        };
        let want = (Some("mam".to_string()), Some(creds.password.expose().to_string()), String::new());
        assert_eq!(at(&[("MQTT_PORT", "1999")]), want);
        assert_eq!(at(&[("MQTT_PORT", "1999"), ("MQTT_BROKER", "localhost")]), want);
        // Issue 32: nothing names a port: the workspace's broker on the port its file records.
        assert_eq!(at(&[]), want);
        let c = Ctx::with_env(std::iter::empty::<(String, String)>(), &root);
        assert_eq!(MqttConfig::from_ctx(&c).unwrap().addr(), "127.0.0.1:1999");
        for vars in [
            &[("MQTT_PORT", "1883")][..],
            &[("MQTT_PORT", "1999"), ("MQTT_BROKER", "10.0.0.9")],
            &[("MQTT_PORT", "1999"), ("MQTT_TLS", "1")],
        ] {
            assert_eq!(at(vars), (None, None, String::new()), "{vars:?}");
        }
        // Configured credentials win: none of the file's is mixed in.
        assert_eq!(at(&[("MQTT_PORT", "1999"), ("MQTT_USERNAME", "bob")]).1, None);
        assert_eq!(at(&[("MQTT_PORT", "1999"), ("MQTT_PASSWORD", "pw")]).0, None);
        // A file readable by others is ignored with one warning naming it, never its content.
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
        let (u, p, err) = at(&[("MQTT_PORT", "1999")]);
        assert_eq!((u, p), (None, None));
        assert!(err.starts_with("WARNING: ") && err.contains("broker.cred") && err.contains("0640"), "{err}");
        assert!(!err.contains(creds.password.expose()));
        assert_eq!(at(&[("MQTT_PORT", "1999")]).2, "", "warned once per file");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
