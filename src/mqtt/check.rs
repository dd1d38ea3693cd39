//! `mam broker check`'s measurements (issue 19): for each node of a broker list (each entry, and
//! each address of a name when no TLS shim resolves it itself) a connect, a QoS 1 round trip, a
//! retained message replayed to a new subscription and then cleared, a job-id-like topic under the
//! topic root carried from this node to another one of the list, and the engine as far as the
//! broker says (its retained `$SYS/broker/version`, as mosquitto and mam's embedded broker answer)
//! or shows (NATS's MQTT gateway refuses `.` in a topic); then the pure judgement of an idle window
//! K x N against the failover floor of the engines found (`judge_window`, docs/CLUSTER.md).
//!
//! QoS 1 subscriptions are made as mam's long-lived subscribers make them (`Client::subscribe_each`:
//! a refused filter asked again for one connect timeout), so a node passes when mam would work with
//! it. Every wait has a deadline of one connect timeout; the nodes are checked in parallel, one thread
//! each, joined before the carry checks. Nothing is left on a broker: the sessions are clean, the
//! retained test message is cleared once it was taken (also when a later step fails), and a
//! `between` stop is only looked at between steps, so an interrupt never skips the clear. Never
//! prints; the password leaves only inside CONNECT.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::client::Client;
use super::codec::{Incoming, Message};
use super::config::{self, Endpoint, MqttConfig, Role};
use super::error::MqttError;
use super::stop::Stop;
use super::transport;

/// How long a node is given to replay `$SYS/broker/version` (a retained message is replayed right
/// after the SUBACK; a broker without it sends nothing, so this is the cost of an unknown engine).
pub const VERSION_WAIT: Duration = Duration::from_millis(1000);

/// The outcome of one step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Done in this many milliseconds.
    Ok(u64),
    /// Failed: why, one line, no secret.
    Failed(String),
    /// Not run (an earlier step failed, or the check was interrupted).
    NotRun,
}

impl Step {
    pub fn ok(&self) -> bool {
        matches!(self, Step::Ok(_))
    }
}

/// What kind of broker a node is, and how that was found out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Engine {
    /// `$SYS/broker/version` said `mosquitto version X`.
    Mosquitto(String),
    /// `$SYS/broker/version` said `mam broker X` (the embedded broker, CORE 11).
    Embedded(String),
    /// No `$SYS/broker/version`, and a SUBSCRIBE to a topic with `.` was refused (0x80), as NATS
    /// 2.9's MQTT gateway refuses it.
    Nats,
    /// `$SYS/broker/version` said something else (the text, cut to one short line).
    Other(String),
    /// Neither sign: no version topic, `.` accepted (or the node was not reached).
    Unknown,
}

impl Engine {
    /// `mosquitto`, `mam`, `nats`, `other`, `unknown`: the engine's name in `--json`.
    pub fn kind(&self) -> &'static str {
        match self {
            Engine::Mosquitto(_) => "mosquitto",
            Engine::Embedded(_) => "mam",
            Engine::Nats => "nats",
            Engine::Other(_) => "other",
            Engine::Unknown => "unknown",
        }
    }

    /// The version the broker gave, if any.
    pub fn version(&self) -> Option<&str> {
        match self {
            Engine::Mosquitto(v) | Engine::Embedded(v) | Engine::Other(v) => Some(v),
            Engine::Nats | Engine::Unknown => None,
        }
    }

    /// The engine in words, with how it was detected.
    pub fn describe(&self) -> String {
        match self {
            Engine::Mosquitto(v) => format!("mosquitto {v} (its retained $SYS/broker/version says so)"),
            Engine::Embedded(v) => format!("mam's embedded broker {v} (its retained $SYS/broker/version says so)"),
            Engine::Nats => "NATS, by its behaviour: no $SYS/broker/version, and a subscription to a topic with '.' \
                             was refused, as NATS's MQTT gateway refuses it"
                .into(),
            Engine::Other(v) => format!("not one mam knows: its $SYS/broker/version says '{v}'"),
            Engine::Unknown => "unknown (no $SYS/broker/version, and '.' in a topic accepted)".into(),
        }
    }

    /// The shortest idle window (s) that outlasts this engine's failover after a node's death, with
    /// beats every `n` s and a connect deadline of `connect_s` s: one beat and one connect deadline,
    /// plus the stall of a NATS cluster (`config::window_floor_s`), which an unknown engine is
    /// assumed to have too (the most conservative floor documented).
    pub fn failover_floor_s(&self, n: u64, connect_s: u64) -> u64 {
        match self {
            Engine::Mosquitto(_) | Engine::Embedded(_) => n + connect_s,
            Engine::Nats | Engine::Other(_) | Engine::Unknown => config::window_floor_s(n, connect_s),
        }
    }
}

/// One node's results.
#[derive(Debug, Clone)]
pub struct Node {
    /// The list entry the node comes from.
    pub entry: Endpoint,
    /// The address checked, when the entry's name resolved to several (each is a node of its own).
    pub address: Option<SocketAddr>,
    pub connect: Step,
    /// Subscribe, publish at QoS 1, receive: from the PUBLISH to the message back.
    pub round_trip: Step,
    /// Publish retained, subscribe, receive it with the retain flag: from the SUBSCRIBE.
    pub retained: Step,
    /// Why the retained test message may still be on the broker (its clear failed), if it may.
    pub left_behind: Option<String>,
    /// The job-id-like topic under the topic root, published here, received at `carried_to`.
    pub carried: Step,
    pub carried_topic: String,
    pub carried_to: Option<String>,
    pub engine: Engine,
}

impl Node {
    /// How the node is named: `host:port`, or `ip:port (host:port)` for one address of a name.
    pub fn name(&self) -> String {
        match self.address {
            Some(a) => format!("{a} ({})", self.entry.addr()),
            None => self.entry.addr(),
        }
    }

    /// The address connects go to: the resolved one, or the entry.
    fn target(&self) -> String {
        self.address.map_or_else(|| self.entry.addr(), |a| a.to_string())
    }

    /// Every step passed.
    pub fn passed(&self) -> bool {
        self.connect.ok() && self.round_trip.ok() && self.retained.ok() && self.carried.ok()
    }
}

/// Checks every node of `cfg`'s list. `between` is looked at between steps only: once set, the
/// steps not begun are `NotRun` (a retained message already taken is still cleared).
pub fn check(cfg: &MqttConfig, between: &Stop) -> Vec<Node> {
    let tag = crate::sys::random_hex(3).unwrap_or_else(|_| format!("{:06x}", std::process::id() & 0xff_ffff));
    let mut nodes = expand(cfg);
    for (i, n) in nodes.iter_mut().enumerate() {
        n.carried_topic = carry_topic(&cfg.topic_root, &tag, i);
    }
    // Phase 1, in parallel: connect, round trip, retained, engine.
    let mut clients: Vec<Option<Client>> = Vec::new();
    std::thread::scope(|s| {
        let handles: Vec<_> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let node = n.clone();
                let tag = tag.clone();
                std::thread::Builder::new()
                    .name("broker-check".into())
                    .stack_size(256 * 1024)
                    .spawn_scoped(s, move || probe(cfg, node, &tag, i, between))
            })
            .collect();
        for (i, h) in handles.into_iter().enumerate() {
            let (node, client) = match h {
                Ok(h) => h.join().unwrap_or_else(|_| (failed(&nodes[i], "the check's thread panicked"), None)),
                Err(e) => (failed(&nodes[i], &format!("no thread to check it on ({e})")), None),
            };
            nodes[i] = node;
            clients.push(client);
        }
    });
    // Phase 2, one node at a time: the topic root carried from each node to the next one that answered.
    let live: Vec<usize> = (0..nodes.len()).filter(|&i| clients[i].is_some()).collect();
    for (k, &i) in live.iter().enumerate() {
        if between.is_set() {
            break;
        }
        let j = live[(k + 1) % live.len()];
        let topic = nodes[i].carried_topic.clone();
        let payload = format!("mam broker check {tag} carry {i}");
        let budget = cfg.connect_timeout;
        let r = if i == j {
            let c = clients[i].as_mut().expect("a live node's client");
            carry(c, None, &topic, &payload, budget)
        } else {
            let (a, b) = two(&mut clients, i, j);
            carry(a, Some(b), &topic, &payload, budget)
        };
        nodes[i].carried = r;
        nodes[i].carried_to = Some(nodes[j].target());
    }
    for c in clients.into_iter().flatten() {
        c.disconnect();
    }
    nodes
}

/// Two distinct clients of `v` at once.
fn two(v: &mut [Option<Client>], i: usize, j: usize) -> (&mut Client, &mut Client) {
    let (lo, hi, swap) = if i < j { (i, j, false) } else { (j, i, true) };
    let (left, right) = v.split_at_mut(hi);
    let (x, y) = (left[lo].as_mut().expect("a live node's client"), right[0].as_mut().expect("a live node's client"));
    if swap {
        (y, x)
    } else {
        (x, y)
    }
}

/// `<root>/jobs/<level>/check`: a job's topic prefix (a job id with a `.`, carried as `~`, CORE 4.1)
/// under a subtopic no watcher, daemon or runner subscribes to.
fn carry_topic(root: &str, tag: &str, i: usize) -> String {
    format!("{}/check", config::job_topic_prefix(root, &format!("chk-{tag}.{i}")))
}

fn blank(entry: Endpoint, address: Option<SocketAddr>) -> Node {
    Node {
        entry,
        address,
        connect: Step::NotRun,
        round_trip: Step::NotRun,
        retained: Step::NotRun,
        left_behind: None,
        carried: Step::NotRun,
        carried_topic: String::new(),
        carried_to: None,
        engine: Engine::Unknown,
    }
}

fn failed(n: &Node, why: &str) -> Node {
    Node { connect: Step::Failed(why.to_string()), ..n.clone() }
}

/// The nodes of `cfg`'s list: one per entry, or one per address when a name resolves to several
/// (without TLS: the shim resolves the name itself, and its certificate check needs the name). A
/// name that does not resolve within the connect deadline is a node whose connect failed.
fn expand(cfg: &MqttConfig) -> Vec<Node> {
    let mut out = Vec::new();
    for ep in &cfg.brokers {
        if cfg.tls || ep.host_is_ip() {
            out.push(blank(ep.clone(), None));
            continue;
        }
        match transport::resolve(ep, Instant::now() + cfg.connect_timeout) {
            Ok(addrs) if addrs.len() > 1 => out.extend(addrs.into_iter().map(|a| blank(ep.clone(), Some(a)))),
            Ok(_) => out.push(blank(ep.clone(), None)),
            Err(e) => out.push(Node { connect: Step::Failed(e.to_string()), ..blank(ep.clone(), None) }),
        }
    }
    out
}

fn ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The configuration for one node: `cfg` with the node as its only broker.
fn node_cfg(cfg: &MqttConfig, n: &Node) -> MqttConfig {
    let ep = match n.address {
        Some(a) => Endpoint::new(a.ip().to_string(), a.port()),
        None => n.entry.clone(),
    };
    MqttConfig { brokers: vec![ep], ..cfg.clone() }
}

/// Phase 1 for one node; the connected client is handed back for the carry checks.
fn probe(cfg: &MqttConfig, mut n: Node, tag: &str, i: usize, between: &Stop) -> (Node, Option<Client>) {
    if !matches!(n.connect, Step::NotRun) || between.is_set() {
        return (n, None);
    }
    let ncfg = node_cfg(cfg, &n);
    let never = Stop::never();
    let t0 = Instant::now();
    let mut c = match Client::connect(&ncfg, Role::Chk, &never) {
        Ok(c) => c,
        Err(e) => {
            n.connect = Step::Failed(e.to_string());
            return (n, None);
        }
    };
    n.connect = Step::Ok(ms(t0));
    let base = format!("{}/check/{tag}/{i}", cfg.topic_root);
    if !between.is_set() {
        n.round_trip = round_trip(&mut c, &base, tag, cfg.connect_timeout);
    }
    if !between.is_set() {
        let (step, left) = retained(&mut c, &format!("{base}/retained"), tag, cfg.connect_timeout);
        n.retained = step;
        n.left_behind = left;
    }
    if !between.is_set() {
        n.engine = engine(&ncfg, &mut c, &base);
    }
    // A client that lost its connection on the way is of no use to the carry check.
    if c.peer_closed() {
        n.carried = Step::Failed("the connection was closed by the broker during the check".into());
        return (n, None);
    }
    (n, Some(c))
}

/// The next message `want` takes before `deadline`; others are dropped.
fn recv_match(
    c: &mut Client,
    deadline: Instant,
    want: impl Fn(&Incoming) -> bool,
) -> Result<Option<Incoming>, MqttError> {
    loop {
        match c.recv(deadline)? {
            None => return Ok(None),
            Some(m) if want(&m) => return Ok(Some(m)),
            Some(_) => {}
        }
    }
}

fn round_trip(c: &mut Client, topic: &str, tag: &str, budget: Duration) -> Step {
    let payload = format!("mam broker check {tag} round trip");
    let run = |c: &mut Client| -> Result<Step, MqttError> {
        c.subscribe_each(&[topic.to_string()], 1, budget)?;
        let t = Instant::now();
        c.publish(&Message::new(topic, payload.as_bytes(), 1, false))?;
        let got = recv_match(c, t + budget, |m| m.topic == topic && m.payload == payload.as_bytes())?;
        Ok(match got {
            Some(_) => Step::Ok(ms(t)),
            None => Step::Failed(format!(
                "the message to '{topic}' was acknowledged but did not come back within {}s",
                budget.as_secs()
            )),
        })
    };
    run(c).unwrap_or_else(|e| Step::Failed(e.to_string()))
}

/// Publish retained, then subscribe and get it back with the retain flag; then clear it (an empty
/// retained publish), whatever happened in between. The second value says why the message may
/// still be retained on the broker (its clear failed).
fn retained(c: &mut Client, topic: &str, tag: &str, budget: Duration) -> (Step, Option<String>) {
    let payload = format!("mam broker check {tag} retained");
    if let Err(e) = c.publish(&Message::new(topic, payload.as_bytes(), 1, true)) {
        // Not acknowledged: the broker may still have taken it, so clear it all the same.
        let left = c.publish(&Message::new(topic, Vec::new(), 1, true)).err().map(|e2| e2.to_string());
        return (Step::Failed(e.to_string()), left);
    }
    let t = Instant::now();
    // NATS's gateway may also hand the new subscription the message live, without the flag, before
    // or instead of the retained copy (its retained store is updated apart from delivery): a copy
    // without the flag is noted and the retained one waited for within the same budget.
    let unflagged = std::cell::Cell::new(false);
    let step = match c.subscribe_each(&[topic.to_string()], 1, budget).and_then(|_| {
        recv_match(c, Instant::now() + budget, |m| {
            let ours = m.topic == topic && m.payload == payload.as_bytes();
            if ours && !m.retain {
                unflagged.set(true);
            }
            ours && m.retain
        })
    }) {
        Ok(Some(_)) => Step::Ok(ms(t)),
        Ok(None) if unflagged.get() => Step::Failed(format!(
            "the message on '{topic}' came back without the retain flag, and no retained copy within {}s",
            budget.as_secs()
        )),
        Ok(None) => Step::Failed(format!(
            "a retained message on '{topic}' was acknowledged but not replayed to a new subscription within {}s",
            budget.as_secs()
        )),
        Err(e) => Step::Failed(e.to_string()),
    };
    let left = c.publish(&Message::new(topic, Vec::new(), 1, true)).err().map(|e| e.to_string());
    match (step, left) {
        (Step::Ok(_), Some(why)) => {
            (Step::Failed(format!("the retained test message could not be cleared: {why}")), Some(why))
        }
        (s, l) => (s, l),
    }
}

/// The node's engine: NATS when a subscription to a topic with `.` is refused (asked on a
/// connection of its own: a broker may close one after a refused subscription), else what the
/// retained `$SYS/broker/version` says, if anything within `VERSION_WAIT`.
fn engine(cfg: &MqttConfig, c: &mut Client, base: &str) -> Engine {
    let dotted = format!("{base}/dot.probe");
    if let Ok(mut d) = Client::connect(cfg, Role::Chk, &Stop::never()) {
        let refused = matches!(d.subscribe(&[dotted], 0), Err(MqttError::SubackRefused { .. }));
        d.disconnect();
        if refused {
            return Engine::Nats;
        }
    }
    let topic = "$SYS/broker/version";
    let wait = VERSION_WAIT.min(cfg.connect_timeout);
    let got =
        c.subscribe(&[topic.to_string()], 0).and_then(|_| recv_match(c, Instant::now() + wait, |m| m.topic == topic));
    match got {
        Ok(Some(m)) => engine_of_version(&String::from_utf8_lossy(&m.payload)),
        _ => Engine::Unknown,
    }
}

/// What a `$SYS/broker/version` payload names.
pub fn engine_of_version(text: &str) -> Engine {
    let t = crate::text::one_line(text.trim());
    if let Some(v) = t.strip_prefix("mosquitto version ") {
        Engine::Mosquitto(v.to_string())
    } else if let Some(v) = t.strip_prefix("mam broker ") {
        Engine::Embedded(v.to_string())
    } else {
        Engine::Other(t.chars().take(60).collect())
    }
}

/// Publish on `from` (QoS 1), receive on `to` (or on `from` itself when it is the only node).
fn carry(from: &mut Client, to: Option<&mut Client>, topic: &str, payload: &str, budget: Duration) -> Step {
    let across = to.is_some();
    let run = |from: &mut Client, to: Option<&mut Client>| -> Result<Step, MqttError> {
        let filters = [topic.to_string()];
        let t;
        let got = match to {
            Some(to) => {
                to.subscribe_each(&filters, 1, budget)?;
                t = Instant::now();
                from.publish(&Message::new(topic, payload.as_bytes(), 1, false))?;
                recv_match(to, t + budget, |m| m.topic == topic && m.payload == payload.as_bytes())?
            }
            None => {
                from.subscribe_each(&filters, 1, budget)?;
                t = Instant::now();
                from.publish(&Message::new(topic, payload.as_bytes(), 1, false))?;
                recv_match(from, t + budget, |m| m.topic == topic && m.payload == payload.as_bytes())?
            }
        };
        Ok(match got {
            Some(_) => Step::Ok(ms(t)),
            None if across => Step::Failed(format!(
                "acknowledged but not delivered within {}s: these nodes do not carry the topic root between them \
                 (not one cluster, or a bridge whose topics leave it out)",
                budget.as_secs()
            )),
            None => Step::Failed(format!("acknowledged but not delivered within {}s", budget.as_secs())),
        })
    };
    run(from, to).unwrap_or_else(|e| Step::Failed(e.to_string()))
}

/// An idle window judged against the failover floor of the engines of a list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    pub n: u64,
    pub k: u64,
    pub connect_s: u64,
    /// The floor K x N must reach, `None` with one node (nothing to fail over to).
    pub floor_s: Option<u64>,
    /// Whose floor it is and what it is made of, in words (docs/CLUSTER.md), after `for`.
    pub basis: String,
    /// K x N is below the floor.
    pub short: bool,
}

impl Window {
    pub fn window_s(&self) -> u64 {
        self.n * self.k
    }
}

/// K x N against the failover floor of a list of `nodes` nodes whose reached ones run `seen`. One
/// node has no failover. With several, the floor is the highest of the engines' seen
/// (`Engine::failover_floor_s`): NATS's for a NATS node or one whose engine is unknown (also when
/// no node was reached), one beat plus the connect deadline for mosquitto and the embedded broker.
pub fn judge_window(nodes: usize, seen: &[Engine], n: u64, k: u64, connect_s: u64) -> Window {
    let mut w = Window { n, k, connect_s, floor_s: None, basis: String::new(), short: false };
    let unknown = [Engine::Unknown];
    let engines = if seen.is_empty() { &unknown[..] } else { seen };
    if nodes < 2 {
        w.basis = "one broker: no failover. While it is down nothing reaches a watcher on another machine; \
                   events wait in events.log and go out once it is back (store and forward), and a watcher \
                   closes a live job after K x N"
            .into();
        return w;
    }
    let worst = engines.iter().max_by_key(|e| e.failover_floor_s(n, connect_s)).unwrap_or(&Engine::Unknown);
    let floor = worst.failover_floor_s(n, connect_s);
    w.floor_s = Some(floor);
    w.short = n * k < floor;
    w.basis = match worst {
        Engine::Nats => format!(
            "a NATS cluster: a stall of up to {}s when a node leading its MQTT streams dies (measured 7-10.5s), \
             one beat ({n}s) and the connect deadline ({connect_s}s)",
            config::CLUSTER_STALL_S
        ),
        Engine::Unknown | Engine::Other(_) => format!(
            "an unknown engine, so the most conservative floor documented, NATS's: a stall of up to {}s, one beat \
             ({n}s) and the connect deadline ({connect_s}s)",
            config::CLUSTER_STALL_S
        ),
        Engine::Mosquitto(_) | Engine::Embedded(_) => {
            format!("bridged mosquittos, which do not stall: one beat ({n}s) and the connect deadline ({connect_s}s)")
        }
    };
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engines_from_their_version_text() {
        assert_eq!(engine_of_version("mosquitto version 2.0.11"), Engine::Mosquitto("2.0.11".into()));
        assert_eq!(engine_of_version("mam broker 0.1.0\n"), Engine::Embedded("0.1.0".into()));
        assert_eq!(engine_of_version("emqx 5"), Engine::Other("emqx 5".into()));
        assert_eq!(engine_of_version(&"x".repeat(200)), Engine::Other("x".repeat(60)));
    }

    #[test]
    fn one_node_has_no_failover_and_no_floor() {
        let w = judge_window(1, &[Engine::Nats], 1, 1, 10);
        assert_eq!((w.floor_s, w.short), (None, false));
        assert!(w.basis.starts_with("one broker: no failover"), "{}", w.basis);
        assert_eq!(judge_window(1, &[], 30, 4, 10).floor_s, None);
    }

    #[test]
    fn the_floor_is_the_worst_engines_seen() {
        let m = Engine::Mosquitto("2".into());
        let w = judge_window(2, &[m.clone(), m.clone()], 2, 3, 5);
        assert_eq!((w.floor_s, w.short), (Some(7), true));
        assert!(w.basis.contains("bridged mosquittos"), "{}", w.basis);
        assert!(!judge_window(2, &[m.clone(), m.clone()], 2, 4, 5).short, "8 s >= 2 + 5");
        // A node that was not reached does not change the engine of the others.
        assert_eq!(judge_window(3, std::slice::from_ref(&m), 2, 4, 5).floor_s, Some(7));
        // A NATS node (or an unknown one, or none reached) brings the stall in.
        let w = judge_window(2, &[m.clone(), Engine::Nats], 30, 4, 10);
        assert_eq!((w.floor_s, w.short), (Some(config::window_floor_s(30, 10)), false));
        assert!(w.basis.contains("NATS cluster"), "{}", w.basis);
        let w = judge_window(2, &[Engine::Unknown, m], 1, 10, 5);
        assert_eq!((w.floor_s, w.short), (Some(config::CLUSTER_STALL_S + 1 + 5), true));
        assert!(w.basis.contains("most conservative"), "{}", w.basis);
        assert_eq!(w.window_s(), 10);
        assert_eq!(judge_window(2, &[], 1, 1, 5).floor_s, Some(config::window_floor_s(1, 5)));
    }

    #[test]
    fn the_carry_topic_is_a_job_prefix_every_broker_carries() {
        let t = carry_topic("team/mam", "a1b2c3", 2);
        assert_eq!(t, "team/mam/jobs/chk-a1b2c3~2/check");
        assert!(t.split('/').all(|l| config::topic_level_problem(l).is_none()), "{t}");
    }
}
