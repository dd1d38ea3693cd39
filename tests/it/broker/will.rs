//! Will messages (MQTT 3.1.1 3.1.2.5-3.1.2.7, CORE 11.2 Connect): a CONNECT with a will is
//! accepted; the will is published when the connection ends without DISCONNECT (closed, or
//! silent past 1.5 x keepalive), at its QoS and with its retain flag, and never after DISCONNECT.

use super::*;

/// A watcher on `<t>/#` at QoS 2.
fn watcher(addr: SocketAddr, t: &str) -> Raw {
    let mut w = Raw::connect(addr, &format!("{t}-watch"));
    w.subscribe(&[(&format!("{t}/#"), 2)]);
    w
}

fn will_client(addr: SocketAddr, t: &str, keep_alive: u16, qos: u8, retain: bool) -> Raw {
    let connect = connect_will(&format!("{t}-w"), keep_alive, true, &format!("{t}/will"), b"gone", qos, retain);
    let (r, code) = Raw::connect_with(addr, &connect);
    assert_eq!(code, 0, "a CONNECT with a will is accepted");
    r
}

/// MQTT-3.1.2-8: the connection closes without DISCONNECT; the will goes out at its QoS 1.
fn abnormal(addr: SocketAddr) -> Vec<String> {
    let t = prefix();
    let mut w = watcher(addr, &t);
    let c = will_client(addr, &t, 60, 1, false);
    drop(c);
    vec![w.expect_publish().replace(&t, "T")]
}

same_on_both!(mqtt_3_1_2_8_the_will_is_published_on_abnormal_disconnect, abnormal, ["publish T/will \"gone\" q1 r0"]);

/// MQTT-3.1.2-10: DISCONNECT discards the will; only the sentinel arrives.
fn graceful(addr: SocketAddr) -> Vec<String> {
    let t = prefix();
    let mut w = watcher(addr, &t);
    let c = will_client(addr, &t, 60, 2, true);
    c.disconnect();
    let mut p = Raw::connect(addr, &format!("{t}-p"));
    p.publish(&format!("{t}/end"), b"", 0, false);
    let mut out = until_sentinel(&mut w, &format!("{t}/end"));
    // A will sent by mistake could come after the sentinel (two connections, no order).
    if let Next::Packet(got) = w.next(Duration::from_millis(300)) {
        out.push(format!("{got:?}"));
    }
    out
}

same_on_both!(mqtt_3_1_2_10_no_will_after_disconnect, graceful, [] as [&str; 0]);

/// Issue 31 item 3: a takeover (the same client id connecting again, MQTT-3.1.4-2) closes the older
/// connection without its will: the will is for an unexpected loss, and the client is back. The
/// watcher sees only the sentinel, then (after the new connection's own abnormal end) its will once.
/// `clean`: the CleanSession flag of both CONNECTs.
fn takeover(addr: SocketAddr, clean: bool) -> Vec<String> {
    let t = prefix();
    let mut w = watcher(addr, &t);
    let id = format!("{t}-w");
    let connect = connect_will(&id, 60, clean, &format!("{t}/will"), b"gone", 1, false);
    let (mut old, code) = Raw::connect_with(addr, &connect);
    assert_eq!(code, 0, "the first CONNECT is accepted");
    let (new, code) = Raw::connect_with(addr, &connect);
    assert_eq!(code, 0, "the second CONNECT with the same id is accepted");
    old.expect_closed(WAIT);
    let mut p = Raw::connect(addr, &format!("{t}-p"));
    p.publish(&format!("{t}/end"), b"", 0, false);
    let mut out: Vec<String> = until_sentinel(&mut w, &format!("{t}/end")).iter().map(|l| l.replace(&t, "T")).collect();
    // A will sent by mistake could come after the sentinel (two connections, no order).
    if let Next::Packet(got) = w.next(Duration::from_millis(300)) {
        out.push(format!("{got:?}").replace(&t, "T"));
    }
    out.push("-- new connection dropped".into());
    drop(new);
    out.push(w.expect_publish().replace(&t, "T"));
    if !clean {
        // Leave no stored session behind.
        Raw::connect(addr, &id).disconnect();
    }
    out
}

same_on_both!(
    takeover_of_a_persistent_session_closes_the_older_connection_without_its_will,
    |addr| takeover(addr, false),
    ["-- new connection dropped", "publish T/will \"gone\" q1 r0"]
);

/// The same with CleanSession=1, where mosquitto 2.0 differs (pinned here): it sends the old will
/// when the takeover ends the session (the old or the new CONNECT has CleanSession=1), and a will
/// watcher of a clean-session client sees a false "gone" at every reconnect. mam never does
/// (docs/DESIGN.md).
#[test]
fn takeover_of_a_clean_session_closes_the_older_connection_without_its_will() {
    let b = start();
    let ours = takeover(b.addr(), true).join("\n");
    eqnice!("-- new connection dropped\npublish T/will \"gone\" q1 r0", ours);
    if have_tool("mosquitto", "MAM_REQUIRE_MOSQUITTO") {
        let td = TestDir::new("mosquitto");
        let m = Mosquitto::start(&td, anonymous);
        let theirs = takeover(m.addr(), true).join("\n");
        eqnice!("publish T/will \"gone\" q1 r0\n-- new connection dropped\npublish T/will \"gone\" q1 r0", theirs);
    }
}

/// MQTT-3.1.2-17: a will with retain=1 is published as a retained message: live subscribers get
/// it with retain 0 (MQTT-3.3.1-9), a later subscriber with retain 1; QoS 2 is honoured.
fn retained_will(addr: SocketAddr) -> Vec<String> {
    let t = prefix();
    let mut w = watcher(addr, &t);
    drop(will_client(addr, &t, 60, 2, true));
    let mut out = vec![w.expect_publish().replace(&t, "T")];
    let mut late = Raw::connect(addr, &format!("{t}-late"));
    late.subscribe(&[(&format!("{t}/will"), 2)]);
    out.push(late.expect_publish().replace(&t, "T"));
    // Clean up the retained will (mosquitto is shared by nothing, but keep the store empty).
    Raw::connect(addr, &format!("{t}-clr")).publish(&format!("{t}/will"), b"", 0, true);
    out
}

same_on_both!(
    mqtt_3_1_2_17_a_retained_will_is_retained_and_its_qos_honoured,
    retained_will,
    ["publish T/will \"gone\" q2 r0", "publish T/will \"gone\" q2 r1"]
);

/// MQTT-3.1.2-24: a client silent for 1.5 x keepalive (1 s) is disconnected and its will sent.
/// Returns the will and how long it took, or what came instead.
fn keepalive_will(addr: SocketAddr, within: Duration) -> Result<(String, Duration), String> {
    let t = prefix();
    let mut w = watcher(addr, &t);
    let started = Instant::now();
    let _silent = will_client(addr, &t, 1, 0, false);
    let got = match w.next(within) {
        Next::Packet(Got::Publish { topic, payload, .. }) => {
            format!("{} {}", topic.replace(&t, "T"), String::from_utf8_lossy(&payload))
        }
        other => return Err(format!("no will within {within:?}: {other:?}")),
    };
    Ok((got, started.elapsed()))
}

/// mam follows the standard: the will comes between 1 and 1.5 s (plus scheduling slack).
/// mosquitto 2.0 checks keepalives coarsely and sends it late (measured 5.8 s): it gets 10 s.
#[test]
fn mqtt_3_1_2_24_the_will_is_published_when_keepalive_expires() {
    let b = start();
    let (got, took) = keepalive_will(b.addr(), WAIT)
        .unwrap_or_else(|e| panic!("mam: {e}; the broker's log:\n{}", b.log_lines().join("\n")));
    assert_eq!(got, "T/will gone");
    assert!(took >= Duration::from_millis(900) && took < Duration::from_millis(2500), "mam: the will after {took:?}");
    if have_tool("mosquitto", "MAM_REQUIRE_MOSQUITTO") {
        let td = TestDir::new("mosquitto");
        let m = Mosquitto::start(&td, anonymous);
        let (theirs, took) =
            keepalive_will(m.addr(), Duration::from_secs(10)).unwrap_or_else(|e| panic!("mosquitto: {e}"));
        assert_eq!(theirs, got);
        assert!(took >= Duration::from_millis(900), "mosquitto: the will after {took:?}");
    }
}

/// A will topic with a wildcard is a protocol error: the connection is closed, no CONNACK 0 (mam
/// closes without CONNACK, as mosquitto does).
#[test]
fn mqtt_3_1_2_9_a_will_topic_with_a_wildcard_closes_the_connection() {
    let b = start();
    let mut r = Raw::open(b.addr());
    r.send(&connect_will("wild", 60, true, "w/#", b"x", 0, false));
    r.expect_closed(WAIT);
    wait_log(&b, "invalid will topic 'w/#'");
    assert!(b.clients().is_empty());
}

/// The issue: `mosquitto_sub --will-topic` could not connect. It connects, receives, and when it
/// is killed its will reaches another subscriber.
#[test]
fn mosquitto_sub_with_a_will_connects_and_its_will_is_published_when_killed() {
    if !have_tool("mosquitto_sub", "MAM_REQUIRE_MOSQUITTO") {
        return;
    }
    let b = start();
    let port = b.addr().port().to_string();
    let mut w = watcher(b.addr(), "msw");
    Raw::connect(b.addr(), "msw-r").publish("msw/ready", b"ready", 1, true);
    let (mut sub, lines) = sub_lines(&[
        "-p",
        &port,
        "-t",
        "msw/ready",
        "-v",
        "-i",
        "msw-sub",
        "--will-topic",
        "msw/will",
        "--will-payload",
        "sub died",
        "--will-qos",
        "1",
    ]);
    wait_line(&lines, "msw/ready ready");
    assert_eq!(w.expect_publish(), "publish msw/ready \"ready\" q1 r0");
    sub.kill().unwrap();
    sub.wait().unwrap();
    assert_eq!(w.expect_publish(), "publish msw/will \"sub died\" q1 r0");
}
