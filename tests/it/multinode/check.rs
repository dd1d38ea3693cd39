//! `mam broker check` (issue 19) against real brokers: the embedded one (with credentials, so a
//! password that must never be printed is in play), a real mosquitto, bridged mosquittos, two
//! brokers that are not one bus, a list with a dead port and a name that does not resolve (within
//! the deadline), and the 3-node NATS cluster, where a short K x N is warned about. After every run
//! nothing the check published is left retained on the brokers.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::{Bridged, NatsCluster, CONNECT_S};
use crate::support::{embedded, free_port, rand_hex, Run, TestDir};
use mam::mqtt::{Client, Message, MqttConfig, Role, Stop};

/// The topics under `root` that `addr` holds retained: a subscription to `root/#` gets them
/// replayed right after its SUBACK, before a live message published afterwards on the same
/// connection, so everything before that probe's return is the whole retained set.
fn retained_left(addr: &str, root: &str, env: &[(&str, &str)]) -> Vec<String> {
    let mut vars: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    vars.push(("MQTT_BROKER".into(), addr.into()));
    vars.push(("MAM_MQTT_CONNECT_TIMEOUT_S".into(), CONNECT_S.to_string()));
    let ctx = mam::ctx::Ctx::with_env(vars, std::path::Path::new("/"));
    let cfg = MqttConfig::from_ctx(&ctx).unwrap();
    let mut c = Client::connect(&cfg, Role::Sub, &Stop::never()).expect("connect to look at the retained set");
    c.subscribe(&[format!("{root}/#")], 1).unwrap();
    let probe = format!("{root}/probe-{}", rand_hex(3));
    c.publish(&Message::new(probe.as_str(), &b"p"[..], 1, false)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(CONNECT_S);
    let mut left = Vec::new();
    loop {
        let m = c.recv(deadline).unwrap().expect("the probe came back");
        if m.topic == probe {
            break;
        }
        if m.retain {
            left.push(m.topic);
        }
    }
    c.disconnect();
    left
}

/// `mam broker check ARGS` against the broker list `brokers` with a `connect_s` connect deadline,
/// within 20 s.
fn broker_check(td: &TestDir, brokers: &str, connect_s: u64, args: &[&str]) -> Run {
    td.mam()
        .env("MQTT_BROKER", brokers)
        .env("MAM_MQTT_CONNECT_TIMEOUT_S", connect_s.to_string())
        .args(["broker", "check"])
        .args(args)
        .run_within(Duration::from_secs(20))
}

fn json(out: &str) -> Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// Every node of a `--json` report passed every step.
fn all_passed(v: &Value) {
    for n in v["nodes"].as_array().unwrap() {
        assert_eq!(n["passed"], true, "{n}");
        for step in ["connect", "round_trip", "retained"] {
            assert_eq!(n[step]["ok"], true, "{step}: {n}");
            assert!(n[step]["ms"].is_u64(), "{n}");
        }
        assert_eq!(n["topic_root"]["result"]["ok"], true, "{n}");
    }
}

#[test]
fn broker_check_passes_on_the_embedded_broker_names_it_and_never_prints_the_password() {
    let td = TestDir::new("chk-emb");
    let pw = format!("pw-{}", rand_hex(8));
    let cfg = mam::broker::BrokerConfig {
        bind: "127.0.0.1:0".parse().unwrap(),
        username: Some("u".into()),
        password: Some(pw.clone()),
        ..Default::default()
    };
    let b = mam::broker::start(cfg).unwrap();
    let port = b.addr().port().to_string();
    let env = [("MQTT_PORT", port.as_str()), ("MQTT_USERNAME", "u"), ("MQTT_PASSWORD", pw.as_str())];
    let run = |extra: &[&str]| {
        let mut cmd = td.mam();
        for (k, v) in env {
            cmd = cmd.env(k, v);
        }
        cmd.args(["broker", "check"]).args(extra).run_within(Duration::from_secs(20))
    };
    let r = run(&[]);
    let (out, err) = (r.stdout(), r.stderr());
    assert_eq!(r.rc(), 0, "{out}{err}");
    assert!(out.starts_with(&format!("node 127.0.0.1:{port}\n  Connected in ")), "{out}");
    for want in [
        "A QoS 1 message came back through a subscription in ",
        "Retained messages work: one was replayed to a new subscription in ",
        "The topic root is carried: a message on mam/jobs/chk-",
        "Engine: mam's embedded broker ",
        "  PASS\n",
        "1 of 1 node(s) passed; engine mam; K x N = 4 x 30s = 120s; one broker: no failover.",
    ] {
        assert!(out.contains(want), "{want:?} in\n{out}");
    }
    assert_eq!(err, "", "one broker: nothing to warn about");
    assert!(!out.contains(&pw) && !err.contains(&pw), "the password is never printed");
    // --json: the same in fields; the engine with its version.
    let r = run(&["--json"]);
    assert_eq!(r.rc(), 0, "{}{}", r.stdout(), r.stderr());
    let v = json(&r.stdout());
    all_passed(&v);
    assert_eq!(v["nodes"][0]["engine"]["kind"], "mam");
    assert_eq!(v["nodes"][0]["engine"]["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!((v["passed"].as_u64(), v["failed"].as_u64(), v["rc"].as_i64()), (Some(1), Some(0), Some(0)));
    assert_eq!(v["window"]["floor_s"], Value::Null);
    assert!(!r.stdout().contains(&pw));
    // Nothing left behind: no retained message, no session.
    assert_eq!(b.retained_bytes(), 0, "the retained test messages were cleared");
    assert!(retained_left(&format!("127.0.0.1:{port}"), "mam", &env[1..]).is_empty());
}

#[test]
fn broker_check_names_mosquitto_and_leaves_nothing_retained() {
    let td = TestDir::new("chk-mosq");
    if !crate::support::have_tool("mosquitto", "MAM_REQUIRE_MOSQUITTO") {
        return;
    }
    let m = crate::support::Mosquitto::start(&td, crate::support::anonymous);
    let addr = format!("127.0.0.1:{}", m.port);
    let r = td
        .mam()
        .env("MQTT_BROKER", &addr)
        .env("MQTT_TOPIC_ROOT", "team-a/mam")
        .args(["broker", "check", "--json"])
        .run_within(Duration::from_secs(20));
    assert_eq!(r.rc(), 0, "{}{}", r.stdout(), r.stderr());
    let v = json(&r.stdout());
    all_passed(&v);
    let node = &v["nodes"][0];
    assert_eq!(node["engine"]["kind"], "mosquitto", "{node}");
    assert!(node["engine"]["version"].as_str().unwrap().starts_with('2'), "{node}");
    let topic = node["topic_root"]["topic"].as_str().unwrap();
    assert!(topic.starts_with("team-a/mam/jobs/chk-") && topic.ends_with("~0/check"), "{topic}");
    assert!(m.log_count("team-a/mam/check/") >= 1, "the round trip went under the topic root");
    assert!(retained_left(&addr, "team-a", &[]).is_empty());
}

#[test]
fn broker_check_with_a_dead_port_and_an_unresolvable_name_fails_those_nodes_within_the_deadline() {
    let td = TestDir::new("chk-dead");
    let b = embedded();
    let (dead, live) = (free_port(), b.addr().port());
    let nohost = format!("nohost-{}.invalid", rand_hex(3));
    let list = format!("127.0.0.1:{dead},{nohost}:1883,127.0.0.1:{live}");
    let r = broker_check(&td, &list, 2, &[]);
    let (out, err) = (r.stdout(), r.stderr());
    assert_eq!(r.rc(), 6, "some node failed and one passed\n{out}{err}");
    // One block per node, in the list's order.
    let blocks: Vec<&str> = out.split("\nnode ").collect();
    assert_eq!(blocks.len(), 3, "{out}");
    assert!(blocks[0].starts_with(&format!("node 127.0.0.1:{dead}\n  Did not connect: cannot connect to broker")));
    assert!(blocks[0].contains("Connection refused") && blocks[0].ends_with("  FAIL"), "{}", blocks[0]);
    assert!(blocks[1].starts_with(&format!("{nohost}:1883\n  Did not connect: ")), "{}", blocks[1]);
    assert!(blocks[1].contains("resolve"), "{}", blocks[1]);
    assert!(blocks[2].contains("  PASS\n"), "{}", blocks[2]);
    assert!(
        out.contains(&format!("1 of 3 node(s) passed (127.0.0.1:{dead}, {nohost}:1883 failed); engine mam;")),
        "{out}"
    );
    // Two connect deadlines at most: the resolve's and the live node's steps.
    assert!(r.elapsed < Duration::from_secs(2 * 2 + 3), "{:?}", r.elapsed);
    // The live broker alone but its list of three: the window is judged (mam's engine: N + D).
    assert!(out.contains("at or above the 32s floor for bridged mosquittos, which do not stall"), "{out}");
    // None passes: rc 3.
    let r = broker_check(&td, &format!("127.0.0.1:{dead},{nohost}"), 2, &["--json"]);
    assert_eq!(r.rc(), 3, "{}{}", r.stdout(), r.stderr());
    let v = json(&r.stdout());
    assert_eq!((v["passed"].as_u64(), v["failed"].as_u64(), v["rc"].as_i64()), (Some(0), Some(2), Some(3)));
    assert!(r.elapsed < Duration::from_secs(2 + 3), "{:?}", r.elapsed);
    // Usage: rc 2, one line.
    let r = td.mam().args(["broker", "check", "--heartbeat", "0"]).run();
    r.expect_rc(2);
    let r = td.mam().args(["broker", "check", "--heartbeat-mises", "3"]).run();
    r.expect_rc(2);
    assert_eq!(
        r.stderr(),
        "ERROR: mam broker check: unknown flag '--heartbeat-mises'; did you mean '--heartbeat-misses'? (see mam \
         broker check --help)\n"
    );
    let r = td.mam().args(["broker", "chek"]).run();
    r.expect_rc(2);
    assert!(r.stderr().contains("unknown subcommand 'chek'; did you mean 'mam broker check'?"), "{}", r.stderr());
    let r = td.mam().env("MQTT_BROKER", "a,,b").args(["broker", "check"]).run();
    r.expect_rc(2);
    assert_eq!(r.stderr().lines().count(), 1, "{}", r.stderr());
}

#[test]
fn broker_check_fails_two_brokers_that_are_not_one_bus() {
    let td = TestDir::new("chk-apart");
    let (a, b) = (embedded(), embedded());
    let list = format!("127.0.0.1:{},127.0.0.1:{}", a.addr().port(), b.addr().port());
    let r = broker_check(&td, &list, 2, &[]);
    let out = r.stdout();
    assert_eq!(r.rc(), 3, "{out}{}", r.stderr());
    assert_eq!(out.matches("these nodes do not carry the topic root between them").count(), 2, "{out}");
    assert_eq!(out.matches("Retained messages work").count(), 2, "each broker works on its own\n{out}");
    assert_eq!((a.retained_bytes(), b.retained_bytes()), (0, 0));
}

#[test]
fn broker_check_on_bridged_mosquittos_carries_across_and_judges_the_window_by_one_beat() {
    let td = TestDir::new("chk-bridge");
    let Some(br) = Bridged::start(&td) else { return };
    let r = broker_check(&td, &br.list(true), CONNECT_S, &["--json", "--heartbeat", "1", "--heartbeat-misses", "3"]);
    assert_eq!(r.rc(), 0, "{}{}", r.stdout(), r.stderr());
    let v = json(&r.stdout());
    all_passed(&v);
    let nodes = v["nodes"].as_array().unwrap();
    assert_eq!(nodes[0]["topic_root"]["to"], format!("127.0.0.1:{}", br.b.port));
    assert_eq!(nodes[1]["topic_root"]["to"], format!("127.0.0.1:{}", br.a.port));
    // Mosquittos do not stall: one beat plus the connect deadline, and 3 s is below it.
    assert_eq!(v["window"]["floor_s"], 1 + CONNECT_S);
    assert_eq!(v["window"]["short"], true);
    assert!(
        r.stderr()
            .starts_with("WARNING: broker check: K x N = 3s is shorter than the 6s floor to fail over for bridged"),
        "{}",
        r.stderr()
    );
    for port in [br.a.port, br.b.port] {
        assert!(retained_left(&format!("127.0.0.1:{port}"), "mam", &[]).is_empty());
    }
}

/// The 3-node NATS cluster: every node passes, is recognised as NATS, carries the topic root to the
/// next node; the defaults' 120 s are above NATS's floor, a short K x N is warned about. The
/// figures are printed for docs/CLUSTER.md.
#[test]
fn nats_broker_check_passes_every_node_and_warns_about_a_short_window() {
    let td = TestDir::new("chk-nats");
    let Some(c) = NatsCluster::start(&td) else { return };
    let list = c.list(&[0, 1, 2]);
    let check = |extra: &[&str]| {
        td.mam()
            .env("MQTT_BROKER", &list)
            .env("MAM_MQTT_CONNECT_TIMEOUT_S", CONNECT_S.to_string())
            .args(["broker", "check"])
            .args(extra)
            .run_within(Duration::from_secs(30))
    };
    let r = check(&["--json"]);
    assert_eq!(r.rc(), 0, "{}{}", r.stdout(), r.stderr());
    eprintln!("nats check: the whole check took {} ms", r.elapsed.as_millis());
    assert_eq!(r.stderr(), "", "120 s is above the floor");
    let v = json(&r.stdout());
    all_passed(&v);
    let nodes = v["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 3);
    for (i, n) in nodes.iter().enumerate() {
        assert_eq!(n["engine"]["kind"], "nats", "{n}");
        assert_eq!(n["topic_root"]["to"], c.nodes[(i + 1) % 3].addr(), "carried to the next node");
        eprintln!(
            "nats check: {} connect {} ms, round trip {} ms, retained {} ms, carried to the next node {} ms",
            n["node"], n["connect"]["ms"], n["round_trip"]["ms"], n["retained"]["ms"], n["topic_root"]["result"]["ms"]
        );
    }
    let floor = mam::mqtt::config::window_floor_s(30, CONNECT_S);
    assert_eq!((v["window"]["floor_s"].as_u64(), v["window"]["short"].as_bool()), (Some(floor), Some(false)));
    let r = check(&["--heartbeat", "1", "--heartbeat-misses", "3"]);
    assert_eq!(r.rc(), 0, "a warning leaves the exit code alone\n{}{}", r.stdout(), r.stderr());
    let floor = mam::mqtt::config::window_floor_s(1, CONNECT_S);
    assert!(
        r.stderr().starts_with(&format!(
            "WARNING: broker check: K x N = 3s is shorter than the {floor}s floor to fail over for a NATS cluster: \
             a stall of up to 15s"
        )),
        "{}",
        r.stderr()
    );
    assert!(r.stderr().ends_with(&format!("--heartbeat-misses) to at least {floor}\n")), "{}", r.stderr());
    assert!(r.stdout().contains(&format!("K x N = 3 x 1s = 3s, SHORTER than the {floor}s floor")), "{}", r.stdout());
    assert_eq!(r.stdout().matches("Engine: NATS, by its behaviour").count(), 3, "{}", r.stdout());
    for i in 0..3 {
        assert!(retained_left(&c.nodes[i].addr(), "mam", &[]).is_empty(), "node {i}");
    }
}

/// A name is checked per address when it resolves to several (each a node of its own, named with
/// its entry), as one node when it resolves to one. Which applies depends on the machine's
/// `localhost`; both are asserted by what it resolves to.
#[test]
fn broker_check_checks_each_address_of_a_name() {
    use std::net::ToSocketAddrs;
    let td = TestDir::new("chk-addrs");
    let b = embedded();
    let port = b.addr().port();
    let addrs: Vec<std::net::SocketAddr> = ("localhost", port).to_socket_addrs().unwrap().collect();
    let r = broker_check(&td, &format!("localhost:{port}"), 2, &["--json"]);
    let v = json(&r.stdout());
    let nodes = v["nodes"].as_array().unwrap();
    if addrs.len() == 1 {
        assert_eq!(r.rc(), 0, "{}", r.stdout());
        assert_eq!((nodes.len(), nodes[0]["node"].as_str()), (1, Some(format!("localhost:{port}").as_str())));
        assert_eq!(nodes[0]["address"], Value::Null);
    } else {
        assert_eq!(nodes.len(), addrs.len(), "{}", r.stdout());
        for (n, a) in nodes.iter().zip(&addrs) {
            assert_eq!(n["node"], format!("{a} (localhost:{port})"));
            let listening = a.ip() == std::net::IpAddr::from([127, 0, 0, 1]);
            assert_eq!(n["passed"], listening, "the broker listens on 127.0.0.1 only: {n}");
        }
    }
}
