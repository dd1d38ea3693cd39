//! QoS 2 in both directions and QoS downgrade (MQTT 3.1.1 4.3.3, 3.3.5; CORE 11.2 Delivery): the
//! PUBLISH/PUBREC/PUBREL/PUBCOMP state machines, exactly-once routing of a duplicate PUBLISH, the
//! delivery QoS min(published, granted), and overlapping subscriptions.

use super::*;

/// A subscriber at QoS 2 and a publisher at QoS 2: both handshakes run (the helpers check each
/// packet) and the message arrives once at QoS 2.
fn qos2_both_directions(addr: SocketAddr) -> Vec<String> {
    let t = prefix();
    let mut s = Raw::connect(addr, &format!("{t}-sub"));
    let mut out = vec![format!("suback {:?}", s.subscribe(&[(&format!("{t}/#"), 2)]))];
    let mut p = Raw::connect(addr, &format!("{t}-pub"));
    p.publish(&format!("{t}/a"), b"exactly", 2, false);
    p.publish(&format!("{t}/end"), b"", 0, false);
    out.extend(until_sentinel(&mut s, &format!("{t}/end")).into_iter().map(|l| l.replace(&t, "T")));
    out
}

same_on_both!(
    mqtt_4_3_3_qos2_publish_pubrec_pubrel_pubcomp_in_both_directions,
    qos2_both_directions,
    ["suback [2]", "publish T/a \"exactly\" q2 r0"]
);

/// MQTT-4.3.3-2 (Method B): the same packet id again before PUBREL, DUP set, is answered with
/// PUBREC but not routed again; after PUBREL the id starts a new message.
fn qos2_duplicate(addr: SocketAddr) -> Vec<String> {
    let t = prefix();
    let mut s = Raw::connect(addr, &format!("{t}-sub"));
    s.subscribe(&[(&format!("{t}/#"), 2)]);
    let mut p = Raw::connect(addr, &format!("{t}-pub"));
    let mut out = Vec::new();
    p.publish_raw(&format!("{t}/d"), b"once", 2, 5, false);
    out.push(format!("{:?}", p.expect()));
    p.publish_raw(&format!("{t}/d"), b"once", 2, 5, true);
    out.push(format!("{:?}", p.expect()));
    p.ack("pubrel", 5);
    out.push(format!("{:?}", p.expect()));
    p.publish_raw(&format!("{t}/d"), b"again", 2, 5, false);
    out.push(format!("{:?}", p.expect()));
    p.ack("pubrel", 5);
    out.push(format!("{:?}", p.expect()));
    p.publish(&format!("{t}/end"), b"", 0, false);
    out.extend(until_sentinel(&mut s, &format!("{t}/end")).into_iter().map(|l| l.replace(&t, "T")));
    out
}

same_on_both!(
    mqtt_4_3_3_2_a_duplicate_qos2_publish_before_pubrel_is_delivered_once,
    qos2_duplicate,
    [
        "Pubrec(5)",
        "Pubrec(5)",
        "Pubcomp(5)",
        "Pubrec(5)",
        "Pubcomp(5)",
        "publish T/d \"once\" q2 r0",
        "publish T/d \"again\" q2 r0"
    ]
);

/// MQTT-3.3.5-1 / 3.8.4: each subscriber gets min(published QoS, granted QoS).
fn downgrade(addr: SocketAddr) -> Vec<String> {
    let t = prefix();
    let mut subs: Vec<Raw> = (0..3).map(|q| Raw::connect(addr, &format!("{t}-s{q}"))).collect();
    for (q, s) in subs.iter_mut().enumerate() {
        s.subscribe(&[(&format!("{t}/#"), q as u8)]);
    }
    let mut p = Raw::connect(addr, &format!("{t}-pub"));
    for q in [2, 1, 0] {
        p.publish(&format!("{t}/m"), format!("sent q{q}").as_bytes(), q, false);
    }
    p.publish(&format!("{t}/end"), b"", 0, false);
    let mut out = Vec::new();
    for (q, s) in subs.iter_mut().enumerate() {
        for l in until_sentinel(s, &format!("{t}/end")) {
            out.push(format!("granted {q}: {}", l.replace(&t, "T")));
        }
    }
    out
}

same_on_both!(
    mqtt_3_3_5_qos_is_downgraded_to_the_subscription_and_never_raised,
    downgrade,
    [
        "granted 0: publish T/m \"sent q2\" q0 r0",
        "granted 0: publish T/m \"sent q1\" q0 r0",
        "granted 0: publish T/m \"sent q0\" q0 r0",
        "granted 1: publish T/m \"sent q2\" q1 r0",
        "granted 1: publish T/m \"sent q1\" q1 r0",
        "granted 1: publish T/m \"sent q0\" q0 r0",
        "granted 2: publish T/m \"sent q2\" q2 r0",
        "granted 2: publish T/m \"sent q1\" q1 r0",
        "granted 2: publish T/m \"sent q0\" q0 r0"
    ]
);

/// MQTT-3.3.5-1: overlapping subscriptions of one client: the message goes at the highest QoS of
/// the matching ones (one copy; the standard also allows one per subscription, non-normatively).
fn overlapping(addr: SocketAddr) -> Vec<String> {
    let t = prefix();
    let mut s = Raw::connect(addr, &format!("{t}-sub"));
    s.subscribe(&[(&format!("{t}/#"), 0), (&format!("{t}/+"), 2), (&format!("{t}/x"), 1)]);
    let mut p = Raw::connect(addr, &format!("{t}-pub"));
    p.publish(&format!("{t}/x"), b"both", 2, false);
    p.publish(&format!("{t}/x/y"), b"hash only", 2, false);
    p.publish(&format!("{t}/end"), b"", 0, false);
    until_sentinel(&mut s, &format!("{t}/end")).into_iter().map(|l| l.replace(&t, "T")).collect()
}

/// mam follows the standard (QoS 2, the highest of q0, q2, q1). mosquitto 2.0 differs: it sends
/// one copy at the QoS of one matching subscription (q1 here, the exact filter's), below the
/// maximum MQTT-3.3.5-1 requires; the test pins both so a change on either side shows.
#[test]
fn mqtt_3_3_5_1_overlapping_subscriptions_get_the_highest_matching_qos() {
    let b = start();
    eqnice!(
        ["publish T/x \"both\" q2 r0", "publish T/x/y \"hash only\" q0 r0"].join("\n"),
        overlapping(b.addr()).join("\n")
    );
    if have_tool("mosquitto", "MAM_REQUIRE_MOSQUITTO") {
        let td = TestDir::new("mosquitto");
        let m = Mosquitto::start(&td, anonymous);
        let theirs = overlapping(m.addr()).join("\n");
        eqnice!(["publish T/x \"both\" q1 r0", "publish T/x/y \"hash only\" q0 r0"].join("\n"), theirs);
    }
}

/// `mosquitto_pub -q 2` delivers (the issue: it lost its message) and `mosquitto_sub -q 2`
/// receives at QoS 2 (with `-d` it prints the flow: PUBREC sent, PUBREL received, PUBCOMP sent).
#[test]
fn mosquitto_pub_and_sub_at_qos_2() {
    if !have_tool("mosquitto_pub", "MAM_REQUIRE_MOSQUITTO") {
        return;
    }
    let b = start();
    let port = b.addr().port().to_string();
    // A retained message first: its arrival shows the subscription is in place.
    Raw::connect(b.addr(), "mq2-r").publish("mq2/ready", b"ready", 1, true);
    let (mut sub, lines) = sub_lines(&["-p", &port, "-t", "mq2/#", "-q", "2", "-C", "2", "-v", "-d", "-i", "mq2-sub"]);
    wait_line(&lines, "mq2/ready ready");
    let st = run_tool(Command::new("mosquitto_pub").args(["-p", &port, "-t", "mq2/x", "-q", "2", "-m", "two", "-d"]));
    assert!(st.status.success(), "mosquitto_pub -q 2: {}", String::from_utf8_lossy(&st.stderr));
    let out = String::from_utf8_lossy(&st.stdout);
    assert!(out.contains("received PUBREC") && out.contains("received PUBCOMP"), "mosquitto_pub -d: {out}");
    wait_line(&lines, "received PUBLISH (d0, q2");
    wait_line(&lines, "received PUBREL");
    wait_line(&lines, "mq2/x two");
    assert!(wait_exit("mosquitto_sub", &mut sub, WAIT).success());
    assert_eq!(b.received().iter().filter(|(t, _, _)| t == "mq2/x").count(), 1);
}
