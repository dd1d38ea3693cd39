//! Subscribing: the wildcard table, granted QoS, unsubscribe, overlapping and invalid filters (K1, K8).

use super::*;

/// K8's table (filter, topic); the expected match results are in the macro call.
const K8: &[(&str, &str)] = &[
    ("a/+/c", "a/b/c"),
    ("a/+/c", "a//c"),
    ("a/+/c", "a/b/d"),
    ("a/+/c", "a/b/c/d"),
    ("a/#", "a"),
    ("a/#", "a/b/c"),
    ("a/#", "ab"),
    ("#", "a/b"),
    ("#", "$SYS/x"),
    ("+/+", "a/b"),
    ("+/+", "/b"),
    ("+/+", "a"),
    ("+/+", "$SYS/x"),
    ("a//c", "a//c"),
    ("a//c", "a/b/c"),
    ("$q/+", "$q/x"),
];

fn wildcard_scenario(addr: SocketAddr) -> Vec<String> {
    let mut out = Vec::new();
    let mut pubr = Raw::connect(addr, &format!("{}-pub", prefix()));
    for (filter, topic) in K8 {
        // Prefix-free topics keep the `#` and `$` cases honest; a fresh client per case keeps
        // earlier subscriptions out of the way, and the sentinel shows nothing was skipped.
        let mut sub = Raw::connect(addr, &format!("{}-sub", prefix()));
        let sentinel = format!("sentinel/{}", rand_hex(4));
        assert_eq!(sub.subscribe(&[(filter, 0), (&sentinel, 0)]), vec![0, 0]);
        pubr.publish(topic, b"m", 1, false);
        pubr.publish(&sentinel, b"s", 1, false);
        let before = until_sentinel(&mut sub, &sentinel);
        let hit = before.iter().any(|l| l.starts_with(&format!("publish {topic} ")));
        out.push(format!("{filter} {topic} {hit}"));
    }
    out
}

same_on_both!(
    k8_wildcard_table_same_as_mosquitto,
    wildcard_scenario,
    [
        "a/+/c a/b/c true",
        "a/+/c a//c true",
        "a/+/c a/b/d false",
        "a/+/c a/b/c/d false",
        "a/# a true",
        "a/# a/b/c true",
        "a/# ab false",
        "# a/b true",
        "# $SYS/x false",
        "+/+ a/b true",
        "+/+ /b true",
        "+/+ a false",
        "+/+ $SYS/x false",
        "a//c a//c true",
        "a//c a/b/c false",
        "$q/+ $q/x true",
    ]
);

fn qos_and_unsubscribe_scenario(addr: SocketAddr) -> Vec<String> {
    let p = prefix();
    let mut out = Vec::new();
    let mut pubr = Raw::connect(addr, &format!("{p}-pub"));
    let mut s0 = Raw::connect(addr, &format!("{p}-s0"));
    let mut s1 = Raw::connect(addr, &format!("{p}-s1"));
    s0.subscribe(&[(&format!("{p}/#"), 0)]);
    s1.subscribe(&[(&format!("{p}/#"), 1)]);
    pubr.publish(&format!("{p}/q1"), b"a", 1, false);
    pubr.publish(&format!("{p}/q0"), b"b", 0, false);
    for (name, c) in [("s0", &mut s0), ("s1", &mut s1)] {
        out.push(format!("{name} {}", c.expect_publish().replace(&p, "P")));
        out.push(format!("{name} {}", c.expect_publish().replace(&p, "P")));
    }
    s1.unsubscribe(&[&format!("{p}/#")]);
    let sentinel = format!("{p}-sentinel");
    s1.subscribe(&[(&sentinel, 0)]);
    pubr.publish(&format!("{p}/after"), b"c", 1, false);
    pubr.publish(&sentinel, b"s", 1, false);
    out.push(format!("s1 after unsubscribe: {:?}", until_sentinel(&mut s1, &sentinel)));
    out
}

same_on_both!(
    k1_qos_min_and_unsubscribe_same_as_mosquitto,
    qos_and_unsubscribe_scenario,
    [
        "s0 publish P/q1 \"a\" q0 r0",
        "s0 publish P/q0 \"b\" q0 r0",
        "s1 publish P/q1 \"a\" q1 r0",
        "s1 publish P/q0 \"b\" q0 r0",
        "s1 after unsubscribe: []",
    ]
);

#[test]
fn overlapping_filters_give_one_copy_at_the_highest_qos() {
    let b = start();
    let mut s = Raw::connect(b.addr(), "ov-sub");
    assert_eq!(s.subscribe(&[("ov/#", 0), ("ov/+", 1), ("+/x", 0)]), vec![0, 1, 0]);
    let mut p = Raw::connect(b.addr(), "ov-pub");
    p.publish("ov/x", b"1", 1, false);
    p.publish("ov/end", b"2", 1, false);
    assert_eq!(s.expect_publish(), "publish ov/x \"1\" q1 r0");
    assert_eq!(s.expect_publish(), "publish ov/end \"2\" q1 r0");
    assert_eq!(s.next(Duration::from_millis(100)), Next::Timeout);
}

#[test]
fn invalid_filters_get_0x80_and_the_rest_work() {
    let b = start();
    let mut s = Raw::connect(b.addr(), "inv");
    assert_eq!(s.subscribe(&[("a/#/b", 1), ("a+", 0), ("ok/+", 1), ("#/x", 0)]), vec![0x80, 0x80, 1, 0x80]);
    let mut p = Raw::connect(b.addr(), "inv-pub");
    p.publish("ok/1", b"x", 1, false);
    assert_eq!(s.expect_publish(), "publish ok/1 \"x\" q1 r0");
}

/// The subscriptions that route are exactly the ones the sessions hold (mam routes through a
/// filter index kept beside the sessions): a filter of a session discarded by CleanSession=1, or
/// unsubscribed, or of a client that left with CleanSession=1, routes nothing; one of a resumed
/// persistent session routes without a new SUBSCRIBE. Each client's first message shows what it
/// got before its own sentinel (one publisher: its messages arrive in order).
fn routes_what_sessions_hold(addr: SocketAddr) -> Vec<String> {
    let t = prefix();
    let tp = |s: &str| format!("{t}/{s}");
    let connect = |id: &str, clean: bool| {
        let (r, code) = Raw::connect_with(addr, &connect_bytes(&format!("{t}-{id}"), 60, clean, None, None));
        assert_eq!(code, 0);
        r
    };
    // Discarded: subscribed in a persistent session, then back with CleanSession=1.
    let mut a = connect("a", false);
    a.subscribe(&[(&tp("a"), 1)]);
    a.disconnect();
    let mut a = connect("a", true);
    a.subscribe(&[(&tp("a-sentinel"), 1)]);
    // Resumed: its subscription routes with no SUBSCRIBE after the return.
    let mut b = connect("b", false);
    b.subscribe(&[(&tp("b"), 1)]);
    b.disconnect();
    let mut b = connect("b", false);
    // Unsubscribed: of two overlapping filters, the wildcard one is dropped.
    let mut c = connect("c", true);
    c.subscribe(&[(&tp("c"), 1), (&format!("{t}/#"), 1)]);
    c.unsubscribe(&[&format!("{t}/#")]);
    // Left with CleanSession=1: a new client of the same id holds nothing.
    let mut d = connect("d", true);
    d.subscribe(&[(&tp("d"), 1)]);
    d.disconnect();
    let mut d = connect("d", true);
    d.subscribe(&[(&tp("d-sentinel"), 1)]);
    let mut p = Raw::connect(addr, &format!("{t}-p"));
    for topic in ["a", "x", "d", "a-sentinel", "b", "c", "d-sentinel"] {
        p.publish(&tp(topic), topic.as_bytes(), 1, false);
    }
    let mut out = Vec::new();
    for (name, r) in [("a", &mut a), ("b", &mut b), ("c", &mut c), ("d", &mut d)] {
        out.push(format!("{name}: {}", r.expect_publish().replace(&t, "T")));
    }
    out
}

same_on_both!(
    subscriptions_route_exactly_what_the_sessions_hold,
    routes_what_sessions_hold,
    [
        "a: publish T/a-sentinel \"a-sentinel\" q1 r0",
        "b: publish T/b \"b\" q1 r0",
        "c: publish T/c \"c\" q1 r0",
        "d: publish T/d-sentinel \"d-sentinel\" q1 r0"
    ]
);
