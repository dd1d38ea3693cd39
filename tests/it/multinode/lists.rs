//! Broker lists (issue 19): the grammar of `MQTT_BROKER` and its one-line refusals (naming the value
//! and where it came from) before anything is recorded; a connect that moves on after a refusal, a
//! black hole (a listener whose accept queue is full, so the SYN is never answered), a silent
//! broker (accepted, never a CONNACK) or a name that does not resolve, within the one connect
//! deadline; `mam registry repoint`; topic names a NATS broker cannot carry; the K x N warning.

use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use super::{Machine, NatsCluster};
use crate::support::{free_port, rand_hex, Fake, FakeBroker, MosqSub, Mosquitto, TestDir};

/// A loopback port whose listener never accepts and whose accept queue is full: a connect to it
/// gets no SYN-ACK and times out in the TCP phase. The listener and the connections that fill its
/// queue are held by the returned value.
fn blackhole() -> (u16, (TcpListener, Vec<TcpStream>)) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let addr = ([127, 0, 0, 1], port).into();
    let mut held = Vec::new();
    for _ in 0..1000 {
        match TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            Ok(s) => held.push(s),
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return (port, (l, held)),
            Err(e) => panic!("filling the accept queue: {e}"),
        }
    }
    panic!("the accept queue of port {port} never filled");
}

fn mosquitto(td: &TestDir) -> Option<Mosquitto> {
    crate::support::have_tool("mosquitto", "MAM_REQUIRE_MOSQUITTO")
        .then(|| Mosquitto::start(td, crate::support::anonymous))
}

#[test]
fn a_connect_moves_past_a_refusal_a_black_hole_a_silent_broker_and_an_unknown_name_within_the_deadline() {
    let td = TestDir::new("mn-walk");
    let Some(m) = mosquitto(&td) else { return };
    let (hole, _held) = blackhole();
    let silent = FakeBroker::start(Fake::Silent);
    let refused = free_port();
    let sub = MosqSub::start(m.port, "walk/#");
    for (what, first) in [
        ("refused", format!("127.0.0.1:{refused}")),
        ("black hole", format!("127.0.0.1:{hole}")),
        ("silent", format!("127.0.0.1:{}", silent.port)),
        ("unknown name", format!("nohost-{}.invalid:1883", rand_hex(3))),
    ] {
        let list = format!("{first},127.0.0.1:{}", m.port);
        let r = td
            .mam()
            .env("MQTT_BROKER", &list)
            .env("MAM_MQTT_CONNECT_TIMEOUT_S", "4")
            .args(["pub", "-t", &format!("walk/{}", what.replace(' ', "-")), "-m", what, "-q", "1"])
            .run_within(Duration::from_secs(20));
        r.expect_rc(0);
        assert!(r.stderr().is_empty(), "{what}: one attempt, no retry: {}", r.stderr());
        // The first broker gets at most its half of the 4 s deadline.
        assert!(r.elapsed < Duration::from_millis(3500), "{what}: took {:?}", r.elapsed);
        crate::support::wait_until(what, Duration::from_secs(5), || {
            sub.messages("walk/").iter().any(|(_, p)| p == what)
        });
    }
    assert!(silent.accepts() >= 1, "the silent broker was tried");
}

#[test]
fn a_list_with_no_broker_answering_names_each_one_and_fails_within_the_deadline() {
    let td = TestDir::new("mn-none");
    let (hole, _held) = blackhole();
    let refused = free_port();
    let r = td
        .mam()
        .env("MQTT_BROKER", format!("127.0.0.1:{refused},127.0.0.1:{hole}"))
        .env("MAM_MQTT_CONNECT_TIMEOUT_S", "2")
        .args(["sub", "-t", "x/#", "-C", "1"])
        .run_within(Duration::from_secs(30));
    assert_eq!(r.rc(), 3, "{}", r.stderr());
    let last = r.stderr().lines().last().unwrap_or_default().to_string();
    assert!(last.starts_with("ERROR: no broker of the list answered within the connect timeout ("), "{last}");
    assert!(last.contains(&format!("127.0.0.1:{refused}: Connection refused")), "{last}");
    // The TCP phase timed out (no SYN-ACK), not the CONNACK wait.
    assert!(
        last.contains(&format!("127.0.0.1:{hole}: no CONNACK (its share of the connect timeout expired in connect)")),
        "{last}"
    );
    // Three attempts (CORE 3.3: waits of 1 s and 2 s) of at most one deadline each.
    assert!(r.elapsed < Duration::from_secs(3 * 2 + 3 + 2), "{:?}", r.elapsed);
}

#[test]
fn bad_broker_lists_are_refused_in_one_line_before_anything_is_recorded() {
    let td = TestDir::new("mn-bad");
    let hundred = (0..100).map(|i| format!("h{i}")).collect::<Vec<_>>().join(",");
    for (value, why) in [
        ("a,,b", "entry 2 is empty"),
        ("a:1,b:70000", "entry 2: port '70000' is not 1-65535"),
        ("a:0", "entry 1: port '0' is not 1-65535"),
        (hundred.as_str(), "100 entries, at most 16"),
    ] {
        let r = td.mam().env("MQTT_BROKER", value).args(["registry", "register", "--session", "w1"]).run();
        r.expect_rc(2);
        let want = format!(
            "ERROR: MQTT_BROKER: '{value}' from the environment is not a broker list (expected comma-separated \
             host[:port]; {why})\n"
        );
        assert_eq!(r.stderr(), want);
        assert!(!td.ws().join(".mam/jobs").exists(), "nothing recorded");
    }
    // From an env file: the origin is the file and line.
    let env = td.write("broker.env", "MQTT_PORT=1883\nMQTT_BROKER=a,,b\n");
    let r = td.mam().env("MAM_ENV_FILE", &env).args(["publish", "--job-id", "j1", "--event", "started"]).run();
    r.expect_rc(2);
    assert!(r.stderr().contains(&format!("'a,,b' from {}:2 is not a broker list", env.display())), "{}", r.stderr());
    // The same grammar for `repoint --broker`.
    let r = td.mam().args(["registry", "repoint", "--broker", "a,,b"]).run();
    r.expect_rc(2);
    assert!(r.stderr().starts_with("ERROR: --broker: 'a,,b' is not a broker list"), "{}", r.stderr());
}

#[test]
fn repoint_moves_the_open_jobs_to_the_new_list_and_leaves_the_closed_ones() {
    let td = TestDir::new("mn-repoint");
    let Some(new) = mosquitto(&td) else { return };
    let old = free_port();
    let m = Machine::new("mn-repoint-m", format!("127.0.0.1:{old}"));
    let open = m.register(1, 4);
    let closed = m.register(1, 4);
    m.mam().args(["registry", "status", &closed, "--set", "cancelled", "--no-publish"]).run().expect_rc(0);
    let closed_before = std::fs::read(m.registry().join(format!("{closed}.json"))).unwrap();
    let list = format!("127.0.0.1:{},localhost:{}", new.port, new.port);
    let dry = m.mam().args(["registry", "repoint", "--broker", &list, "--dry-run"]).run();
    dry.expect_rc(0);
    assert!(dry.stdout().contains(&format!("would repoint 1 job(s) to {list}")), "{}", dry.stdout());
    assert_eq!(m.record(&open)["broker"]["port"], old, "a dry run writes nothing");
    let r = m.mam().args(["registry", "repoint", "--broker", &list]).run();
    r.expect_rc(0);
    assert!(r.stdout().contains(&format!("  {open}\n")), "{}", r.stdout());
    assert!(r.stdout().contains(&format!("  {closed} skipped (already cancelled)")), "{}", r.stdout());
    let block = &m.record(&open)["broker"];
    assert_eq!(
        block["brokers"],
        serde_json::json!([format!("127.0.0.1:{}", new.port), format!("localhost:{}", new.port)])
    );
    assert_eq!((block["host"].as_str(), block["port"].as_u64()), (Some("127.0.0.1"), Some(new.port as u64)));
    assert!(block.get("password").is_none());
    assert_eq!(std::fs::read(m.registry().join(format!("{closed}.json"))).unwrap(), closed_before);
    // The record wins over the configuration: a publish from the old configuration reaches the new list.
    let sub = MosqSub::start(new.port, &format!("mam/jobs/{open}/events"));
    m.publish(&open, "started", &[]).expect_rc(0);
    crate::support::wait_until("the event on the new broker", Duration::from_secs(5), || {
        !sub.messages("mam/jobs/").is_empty()
    });
    // Again: nothing to do.
    let again = m.mam().args(["registry", "repoint", &open, "--broker", &list]).run();
    assert!(again.stdout().contains("skipped (already on this list)"), "{}", again.stdout());
    let r = m.mam().args(["registry", "repoint", "nosuchjob", "--broker", &list]).run();
    r.expect_rc(1);
}

#[test]
fn a_topic_root_nats_cannot_carry_is_refused_before_anything_is_recorded() {
    let td = TestDir::new("mn-root");
    for root in ["my.team", "my team", "a/+/b"] {
        let r = td.mam().env("MQTT_TOPIC_ROOT", root).args(["registry", "register", "--session", "w1"]).run();
        r.expect_rc(2);
        assert!(
            r.stderr()
                .starts_with(&format!("ERROR: MQTT_TOPIC_ROOT: '{root}' from the environment is not a topic root")),
            "{}",
            r.stderr()
        );
        assert_eq!(r.stderr().lines().count(), 1);
    }
    assert!(!td.ws().join(".mam/jobs").exists(), "nothing recorded");
}

#[test]
fn nats_carries_a_job_whose_id_holds_dots() {
    let td = TestDir::new("mn-dots");
    let Some(c) = NatsCluster::start(&td) else { return };
    let a = Machine::new("mn-dots-a", c.list(&[0, 1]));
    let w = Machine::new("mn-dots-c", c.list(&[2]));
    let id = format!("fix-{}.v1.2", rand_hex(2));
    a.mam().args(["registry", "register", "--session", "w1", "--job-id", &id]).run().expect_rc(0);
    let prefix = a.record(&id)["topic_prefix"].as_str().unwrap().to_string();
    assert_eq!(prefix, format!("mam/jobs/{}", id.replace('.', "~")));
    w.adopt(&a, &id);
    let mut watch = w.watch(&id);
    a.publish(&id, "started", &[]).expect_rc(0);
    a.publish(&id, "completed", &[]).expect_rc(0);
    let (rc, _) = watch.wait(Duration::from_secs(15));
    assert_eq!(rc, 0, "{}{}", watch.stdout(), watch.stderr());
    // The daemon finds the job from the topic's level.
    assert_eq!(mam::daemon::mirror::parse_topic("mam", &format!("{prefix}/events")).unwrap().0, id);
}

#[test]
fn a_short_window_on_a_list_of_several_brokers_is_warned_about() {
    let td = TestDir::new("mn-window");
    let r = td
        .mam()
        .env("MQTT_BROKER", "a:1,b:2")
        .args(["registry", "register", "--session", "w1", "--heartbeat-sec", "2", "--heartbeat-misses", "3"])
        .run();
    r.expect_rc(0);
    let floor = mam::mqtt::config::window_floor_s(2, 10);
    assert!(
        r.stderr().starts_with(&format!(
            "WARNING: job {}: an idle window of 6s is shorter than the {floor}s",
            r.stdout().trim()
        )),
        "{}",
        r.stderr()
    );
    // One broker, or a window long enough: no warning.
    let one = td
        .mam()
        .env("MQTT_BROKER", "a:1")
        .args(["registry", "register", "--session", "w1", "--heartbeat-sec", "2"])
        .run();
    assert_eq!(one.stderr(), "");
    let long = td.mam().env("MQTT_BROKER", "a:1,b:2").args(["registry", "register", "--session", "w1"]).run();
    assert_eq!(long.stderr(), "", "K x N = 120 s is above the floor");
}

/// `mam pub -h` and `mam sub -h` take a broker list in `MQTT_BROKER`'s grammar (a single host, as
/// mosquitto's `-h`, is a list of one); `-p` is the port of an entry without one. Before issue 19's
/// fix `-h` named one host, so a list was looked up as one name and failed to resolve (rc 3).
#[test]
fn pub_and_sub_take_a_broker_list_after_h_like_mqtt_broker() {
    let td = TestDir::new("mn-hlist");
    let Some(m) = mosquitto(&td) else { return };
    let dead = free_port();
    let list = format!("127.0.0.1:{dead},127.0.0.1:{}", m.port);
    let sub = MosqSub::start(m.port, "hlist/#");
    // The environment names a dead broker: -h alone decides.
    let mam = || td.mam().env("MQTT_BROKER", format!("127.0.0.1:{dead}")).env("MAM_MQTT_CONNECT_TIMEOUT_S", "4");
    let r = mam()
        .args(["pub", "-h", &list, "-t", "hlist/a", "-m", "via a list", "-q", "1"])
        .run_within(Duration::from_secs(20));
    r.expect_rc(0);
    assert!(r.stderr().is_empty(), "one attempt: {}", r.stderr());
    // An entry without a port takes -p.
    let no_port = format!("127.0.0.1:{dead},localhost");
    let port = m.port.to_string();
    mam()
        .args(["pub", "-h", &no_port, "-p", &port, "-t", "hlist/b", "-m", "via -p", "-q", "1"])
        .run_within(Duration::from_secs(20))
        .expect_rc(0);
    crate::support::wait_until("both messages", Duration::from_secs(5), || sub.messages("hlist/").len() == 2);
    assert_eq!(
        sub.messages("hlist/"),
        [("hlist/a".to_string(), "via a list".to_string()), ("hlist/b".to_string(), "via -p".to_string())]
    );
    // mam sub -h takes the same list.
    mam().args(["pub", "-h", &list, "-t", "hlist/r", "-m", "kept", "-r", "-q", "1"]).run().expect_rc(0);
    let r =
        mam().args(["sub", "-h", &list, "-t", "hlist/r", "-C", "1", "-W", "10"]).run_within(Duration::from_secs(20));
    r.expect_rc(0);
    assert_eq!(r.stdout(), "kept\n");
    mam().args(["pub", "-h", &list, "-t", "hlist/r", "-n", "-r", "-q", "1"]).run().expect_rc(0);
    // A bad list is refused like MQTT_BROKER's, in one line, before any connect.
    for cmd in ["pub", "sub"] {
        let r = td.mam().args([cmd, "-h", "a,,b", "-t", "x"]).run();
        r.expect_rc(2);
        assert_eq!(
            r.stderr(),
            "ERROR: -h: 'a,,b' is not a broker list (expected host[:port],...; entry 2 is empty)\n",
            "{cmd}"
        );
    }
}

/// Issue 31: a broker of the list that is up but not ready (it closes the connection before
/// CONNACK, as a NATS node does while its cluster elects a leader of its sessions stream) is asked
/// again within the one connect deadline, the list walked again: one connect, no retry of
/// CORE 3.3. Before, the walk ended after one round (the other broker refused) and the publish
/// needed the retries' 1 s and 2 s waits.
#[test]
fn a_connect_walks_the_list_again_while_a_broker_is_up_but_not_ready() {
    let td = TestDir::new("mn-rewalk");
    let dead = free_port();
    let busy = FakeBroker::start(Fake::CloseFirst(2));
    let list = format!("127.0.0.1:{dead},127.0.0.1:{}", busy.port);
    let vars = [("MQTT_BROKER", list), ("MAM_MQTT_CONNECT_TIMEOUT_S", "4".to_string())];
    let ctx = mam::ctx::Ctx::with_env(vars, &td.ws());
    let cfg = mam::mqtt::MqttConfig::from_ctx(&ctx).unwrap();
    let started = std::time::Instant::now();
    let r = mam::mqtt::Client::connect_from(&cfg, "mam-t-rewalk", &mam::mqtt::Stop::never(), 0);
    let took = started.elapsed();
    let (c, i) = r.unwrap_or_else(|e| panic!("no connect: {e}"));
    assert_eq!((i, c.addr().to_string()), (1, format!("127.0.0.1:{}", busy.port)));
    assert_eq!(busy.accepts(), 3, "closed twice, answered the third time");
    assert!(took < Duration::from_secs(2), "two pauses of 250 ms, not a deadline: {took:?}");
    c.disconnect();
    // A list of dead brokers still fails at once: nothing there may answer later.
    let vars = [("MQTT_BROKER", format!("127.0.0.1:{dead},127.0.0.1:{}", free_port()))];
    let cfg = mam::mqtt::MqttConfig::from_ctx(&mam::ctx::Ctx::with_env(vars, &td.ws())).unwrap();
    let started = std::time::Instant::now();
    assert!(mam::mqtt::Client::connect_from(&cfg, "mam-t-rewalk", &mam::mqtt::Stop::never(), 0).is_err());
    assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());
}

/// Issue 31: `mam sub` with a broker list follows it when its broker dies, like every long-lived
/// client: it reconnects to the next broker, subscribes again, says so in one line on stderr and
/// goes on printing; a signal still ends it with 0. Before, it exited 3 on the lost connection.
#[test]
fn mam_sub_reconnects_through_its_list_when_its_broker_dies() {
    let td = TestDir::new("mn-subre");
    let start = || {
        let bind = "127.0.0.1:0".parse().unwrap();
        mam::broker::start(mam::broker::BrokerConfig { bind, ..Default::default() }).unwrap()
    };
    let (a, b) = (start(), start());
    let (pa, pb) = (a.addr().port(), b.addr().port());
    let mut sub = td
        .mam()
        .env("MQTT_BROKER", format!("127.0.0.1:{pa},127.0.0.1:{pb}"))
        .args(["sub", "-d", "-v", "-t", "re/#"])
        .spawn_bg(&td, "sub");
    crate::support::wait_until("mam sub to subscribe", Duration::from_secs(10), || {
        sub.stderr().contains("subscribed to")
    });
    crate::support::publish_raw(pa, "re/1", b"one", false);
    sub.wait_stdout("re/1 one", Duration::from_secs(10));
    a.shutdown();
    let moved = format!("NOTE: sub: connection to 127.0.0.1:{pa} lost");
    crate::support::wait_until("mam sub to move", Duration::from_secs(10), || {
        sub.stderr().lines().any(|l| l.starts_with(&moved) && l.ends_with(&format!("now connected to 127.0.0.1:{pb}")))
    });
    crate::support::publish_raw(pb, "re/2", b"two", false);
    sub.wait_stdout("re/2 two", Duration::from_secs(10));
    assert_eq!(sub.stderr().lines().filter(|l| l.contains("now connected to")).count(), 1, "{}", sub.stderr());
    sub.signal(libc::SIGTERM);
    let (rc, _) = sub.wait(Duration::from_secs(10));
    assert_eq!(rc, 0, "{}", sub.stderr());
}
