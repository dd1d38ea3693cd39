//! `mam broker check` (issue 19): the configured broker list (the same `MqttConfig` every command
//! reads after the env file) checked node by node through `mqtt::check`, printed as one block of
//! sentences per node and a summary line (or `--json`), and the idle window K x N (the heartbeat
//! knobs delegate-job uses, or the flags) judged against the failover floor of the engines found.
//! It never prints a password (none of its messages holds one).

use std::ffi::OsString;

use serde_json::{json, Value};

use crate::cli::{self, Failure, Parsed};
use crate::ctx::Ctx;
use crate::knob;
use crate::mqtt::check::{self, Engine, Node, Step, Window};
use crate::mqtt::{MqttConfig, Stop};

/// Some node failed while another passed.
pub const RC_SOME_FAILED: i32 = 6;
/// No node passed.
pub const RC_NONE_PASSED: i32 = 3;

pub const USAGE: &str = "
Usage: mam broker check [--heartbeat N] [--heartbeat-misses K] [--json]

Checks the configured broker list (MQTT_BROKER, MQTT_PORT, MQTT_TLS, MQTT_USERNAME, MQTT_PASSWORD,
MQTT_CA_FILE, MQTT_TOPIC_ROOT, MAM_MQTT_CONNECT_TIMEOUT_S; read after the env file, as every
command reads them) node by node: each entry, and each address a name resolves to (without TLS).
For each node, every step within the connect deadline:
  - the connect (TCP, TLS, CONNECT/CONNACK) and its time;
  - a round trip: a subscription to a unique topic under the topic root, a QoS 1 publish to it,
    the message back, and its time;
  - retained messages: one published retained on a unique topic, replayed to a subscription made
    afterwards (with the retain flag), then cleared with an empty retained publish;
  - the topic root carried: a message on <root>/jobs/<a job-id-like level>/check published on
    this node reaches a subscriber on the next node of the list that answered (on this node when
    it is the only one), as a job's events travel from an agent's node to a watcher's;
  - the engine, with how it was detected: mosquitto and mam's embedded broker name themselves on
    the retained $SYS/broker/version; NATS's MQTT gateway is recognised by refusing '.' in a
    topic; otherwise `unknown`.
Then the idle window K x N (a watcher closes a job after K x N seconds without evidence) is
compared with what the list needs to fail over when a node dies (docs/CLUSTER.md): one broker has
no failover; bridged mosquittos need one beat plus the connect deadline; a NATS cluster (or an
unknown engine: the most conservative floor) 15 s more for the stall when the node leading its
streams dies. A window below the floor is a WARNING (the exit code stays).

Nothing is left on the broker: clean sessions, and the retained test message cleared (a clear
that fails is named). The password is never printed.

Options:
  --heartbeat N         the beat period to judge (default MAM_HEARTBEAT_SEC, else 30)
  --heartbeat-misses K  missed beats before unresponsive (default MAM_HEARTBEAT_MISSES, else 4)
  --json                one JSON object on stdout instead of the sentences
  -h, --help            print this help

Exit codes: 0 every node passed, 6 some node failed and another passed, 3 no node passed,
1 env file unreadable, 2 usage or invalid configuration.
";

#[derive(Debug, Default)]
struct Args {
    heartbeat: Option<u32>,
    misses: Option<u32>,
    json: bool,
}

fn parse_args(args: Vec<OsString>) -> Result<Parsed<Args>, Failure> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let mut a = Args::default();
    while let Some(arg) = p.next()? {
        match arg {
            Long("heartbeat") => a.heartbeat = Some(knob::flag("--heartbeat", &p.value()?, 1)?),
            Long("heartbeat-misses") => a.misses = Some(knob::flag("--heartbeat-misses", &p.value()?, 1)?),
            Long("json") => a.json = true,
            Short('h') | Long("help") => return Ok(Parsed::Help),
            _ => return Err(arg.unexpected().into()),
        }
    }
    Ok(Parsed::Run(a))
}

pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    // The unknown-flag message names the first word of the usage line; this command is two words.
    let parsed = cli::parse_or_help(ctx, USAGE, args, parse_args).map_err(|f| Failure {
        line: f
            .line
            .replace("mam broker:", "mam broker check:")
            .replace("mam broker --help", "mam broker check --help"),
        ..f
    });
    let Some(a) = parsed? else {
        return Ok(0);
    };
    cli::load_env(ctx)?;
    let cfg = MqttConfig::from_ctx(ctx)?;
    let n = match a.heartbeat {
        Some(v) => v,
        None => knob::env_or(ctx, "MAM_HEARTBEAT_SEC", 1, 30)?,
    };
    let k = match a.misses {
        Some(v) => v,
        None => knob::env_or(ctx, "MAM_HEARTBEAT_MISSES", 1, 4)?,
    };
    // An interrupt ends the check after the step under way (each within its deadline), so a retained
    // test message already taken is still cleared.
    crate::sys::install_stop_handlers()
        .map_err(|e| Failure::runtime(format!("cannot install signal handlers: {e}")))?;
    let nodes = check::check(&cfg, &Stop::signals());
    if let Some(sig) = crate::sys::pending_signal() {
        return Ok(128 + sig);
    }
    let seen: Vec<Engine> = nodes.iter().filter(|n| n.connect.ok()).map(|n| n.engine.clone()).collect();
    let window = check::judge_window(nodes.len(), &seen, n.into(), k.into(), cfg.connect_timeout.as_secs());
    let passed = nodes.iter().filter(|n| n.passed()).count();
    let rc = match passed {
        p if p == nodes.len() => 0,
        0 => RC_NONE_PASSED,
        _ => RC_SOME_FAILED,
    };
    if a.json {
        ctx.say(&report_json(&cfg, &nodes, &window, rc).to_string());
    } else {
        for n in &nodes {
            ctx.say(&node_text(n));
        }
        ctx.say(&summary(&nodes, &window));
    }
    if window.short {
        ctx.diag(&window_warning(&window));
    }
    for n in nodes.iter().filter(|n| n.left_behind.is_some()) {
        ctx.diag(&format!(
            "WARNING: broker check: {}: the retained test message may still be on the broker ({}); clear it with \
             `mam pub -r -n -t TOPIC`",
            n.name(),
            n.left_behind.as_deref().unwrap_or_default()
        ));
    }
    Ok(rc)
}

fn step_json(s: &Step) -> Value {
    match s {
        Step::Ok(ms) => json!({"ok": true, "ms": ms}),
        Step::Failed(why) => json!({"ok": false, "error": why}),
        Step::NotRun => json!({"ok": false, "error": "not run"}),
    }
}

fn report_json(cfg: &MqttConfig, nodes: &[Node], w: &Window, rc: i32) -> Value {
    let nodes: Vec<Value> = nodes
        .iter()
        .map(|n| {
            json!({
                "node": n.name(),
                "entry": n.entry.addr(),
                "address": n.address.map(|a| a.to_string()),
                "passed": n.passed(),
                "connect": step_json(&n.connect),
                "round_trip": step_json(&n.round_trip),
                "retained": step_json(&n.retained),
                "topic_root": {"topic": n.carried_topic, "to": n.carried_to, "result": step_json(&n.carried)},
                "engine": {"kind": n.engine.kind(), "version": n.engine.version(), "detected": n.engine.describe()},
            })
        })
        .collect();
    let passed = nodes.iter().filter(|n| n["passed"] == true).count();
    json!({
        "brokers": cfg.addr(),
        "topic_root": cfg.topic_root,
        "tls": cfg.tls,
        "connect_timeout_s": cfg.connect_timeout.as_secs(),
        "nodes": nodes,
        "passed": passed,
        "failed": nodes.len() - passed,
        "window": {"heartbeat_sec": w.n, "heartbeat_misses": w.k, "window_s": w.window_s(),
                   "floor_s": w.floor_s, "basis": w.basis, "short": w.short},
        "rc": rc,
    })
}

/// One node as a block of sentences: its name, one line per step, then PASS or FAIL.
fn node_text(n: &Node) -> String {
    let mut lines = vec![format!("node {}", n.name())];
    let mut say = |s: String| lines.push(format!("  {s}"));
    match &n.connect {
        Step::Ok(ms) => say(format!("Connected in {ms} ms.")),
        Step::Failed(why) => say(format!("Did not connect: {why}.")),
        Step::NotRun => say("Not checked (interrupted).".into()),
    }
    if n.connect.ok() {
        say(match &n.round_trip {
            Step::Ok(ms) => format!("A QoS 1 message came back through a subscription in {ms} ms."),
            Step::Failed(why) => format!("The QoS 1 round trip failed: {why}."),
            Step::NotRun => "The QoS 1 round trip was not checked.".into(),
        });
        say(match &n.retained {
            Step::Ok(ms) => {
                format!("Retained messages work: one was replayed to a new subscription in {ms} ms, then cleared.")
            }
            Step::Failed(why) => format!("Retained messages do not work: {why}."),
            Step::NotRun => "Retained messages were not checked.".into(),
        });
        let to = n.carried_to.as_deref().unwrap_or("?");
        let same =
            n.carried_to.as_deref() == Some(n.address.map_or_else(|| n.entry.addr(), |a| a.to_string()).as_str());
        let whereto =
            if same { "this node's own subscriber (no other node answered)".to_string() } else { to.to_string() };
        say(match &n.carried {
            Step::Ok(ms) => format!(
                "The topic root is carried: a message on {} published here reached {whereto} in {ms} ms.",
                n.carried_topic
            ),
            Step::Failed(why) => format!(
                "The topic root is not carried: a message on {} published here did not reach {whereto}: {why}.",
                n.carried_topic
            ),
            Step::NotRun => "The topic root was not checked.".into(),
        });
        say(format!("Engine: {}.", n.engine.describe()));
    }
    lines.push(format!("  {}", if n.passed() { "PASS" } else { "FAIL" }));
    lines.join("\n")
}

/// The last line: how many nodes passed, the engines, and the window against its floor.
fn summary(nodes: &[Node], w: &Window) -> String {
    let passed = nodes.iter().filter(|n| n.passed()).count();
    let failed: Vec<String> = nodes.iter().filter(|n| !n.passed()).map(Node::name).collect();
    let mut kinds: Vec<&str> = nodes.iter().filter(|n| n.connect.ok()).map(|n| n.engine.kind()).collect();
    crate::sort::natural(&mut kinds);
    kinds.dedup();
    let head = if failed.is_empty() {
        format!("{passed} of {} node(s) passed", nodes.len())
    } else {
        format!("{passed} of {} node(s) passed ({} failed)", nodes.len(), failed.join(", "))
    };
    let engines = if kinds.is_empty() { "no engine seen".to_string() } else { format!("engine {}", kinds.join(", ")) };
    let window = match w.floor_s {
        None => format!("K x N = {} x {}s = {}s; {}", w.k, w.n, w.window_s(), w.basis),
        Some(f) => format!(
            "K x N = {} x {}s = {}s, {} the {f}s floor for {}",
            w.k,
            w.n,
            w.window_s(),
            if w.short { "SHORTER than" } else { "at or above" },
            w.basis
        ),
    };
    format!("{head}; {engines}; {window}.")
}

fn window_warning(w: &Window) -> String {
    format!(
        "WARNING: broker check: K x N = {}s is shorter than the {}s floor to fail over for {}; a watcher may \
         close a live job while a node's death is handled: raise MAM_HEARTBEAT_MISSES (or --heartbeat-misses) \
         to at least {}",
        w.window_s(),
        w.floor_s.unwrap_or(0),
        w.basis,
        w.floor_s.unwrap_or(0).div_ceil(w.n.max(1))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags() {
        let Parsed::Run(a) = parse_args(cli::argv(&["--heartbeat", "2", "--heartbeat-misses", "3", "--json"])).unwrap()
        else {
            panic!()
        };
        assert_eq!((a.heartbeat, a.misses, a.json), (Some(2), Some(3), true));
        assert!(matches!(parse_args(cli::argv(&["-h"])).unwrap(), Parsed::Help));
        for bad in [&["--heartbeat", "0"][..], &["--heartbeat-misses", "x"], &["--bogus"], &["node"]] {
            assert_eq!(parse_args(cli::argv(bad)).unwrap_err().rc, 2, "{bad:?}");
        }
    }
}
