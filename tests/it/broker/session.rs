//! Sessions (MQTT 3.1.1 3.1.2.4, 3.2.2.2, 4.1, 4.4; CORE 11.2 Sessions): CleanSession=0 keeps the
//! subscriptions and the QoS 1/2 messages while the client is away, CONNACK reports it, and what
//! was unacknowledged goes again on reconnect with DUP set, in order; the CONNACK return codes.

use super::*;

fn connect_session(addr: SocketAddr, id: &str, clean: bool) -> (Raw, Got) {
    let mut r = Raw::open(addr);
    r.send(&connect_bytes(id, 60, clean, None, None));
    let got = r.expect();
    (r, got)
}

fn connack_line(g: &Got) -> String {
    match g {
        Got::Connack { session_present, code } => format!("connack sp{} rc{code}", u8::from(*session_present)),
        other => format!("{other:?}"),
    }
}

/// MQTT-3.1.3-8: a zero-length client id with CleanSession=0 gets 0x02 and the connection closes.
fn zero_length_id(addr: SocketAddr) -> Vec<String> {
    let (mut r, got) = connect_session(addr, "", false);
    let mut out = vec![connack_line(&got)];
    r.expect_closed(WAIT);
    out.push("closed".into());
    let (_r, got) = connect_session(addr, "", true);
    out.push(connack_line(&got));
    out
}

same_on_both!(
    mqtt_3_1_3_8_a_zero_length_id_with_clean_session_0_gets_0x02,
    zero_length_id,
    ["connack sp0 rc2", "closed", "connack sp0 rc0"]
);

/// MQTT-3.2.2-1, -2, -3 and MQTT-3.1.2-6: session present is 1 only when CleanSession=0 finds a
/// stored session; CleanSession=1 discards it.
fn session_present(addr: SocketAddr) -> Vec<String> {
    let id = format!("{}-sp", prefix());
    let mut out = Vec::new();
    for clean in [false, false, true, false] {
        let (r, got) = connect_session(addr, &id, clean);
        out.push(format!("clean {}: {}", u8::from(clean), connack_line(&got)));
        r.disconnect();
        // The next CONNECT may take over before the DISCONNECT is read: both keep the session.
    }
    out
}

same_on_both!(
    mqtt_3_2_2_session_present_reports_a_stored_session,
    session_present,
    ["clean 0: connack sp0 rc0", "clean 0: connack sp1 rc0", "clean 1: connack sp0 rc0", "clean 0: connack sp0 rc0"]
);

/// MQTT-3.1.2-4, -5: while a CleanSession=0 client is away its subscriptions stay and its QoS 1
/// and 2 messages are queued (QoS 0 ones are not, as mosquitto's default); on return they arrive
/// in order without a new SUBSCRIBE, then live ones.
fn queued_while_away(addr: SocketAddr) -> Vec<String> {
    let t = prefix();
    let id = format!("{t}-away");
    let (mut r, got) = connect_session(addr, &id, false);
    let mut out = vec![connack_line(&got)];
    r.subscribe(&[(&format!("{t}/#"), 2)]);
    r.disconnect();
    let mut p = Raw::connect(addr, &format!("{t}-pub"));
    let (mut w, _) = connect_session(addr, &format!("{t}-w"), true);
    w.subscribe(&[(&format!("{t}/#"), 0)]);
    for (payload, qos) in [("one", 1), ("two", 2), ("zero", 0), ("three", 1)] {
        p.publish(&format!("{t}/m"), payload.as_bytes(), qos, false);
    }
    p.publish(&format!("{t}/end"), b"", 1, false);
    // The witness shows everything was routed before the client returns.
    until_sentinel(&mut w, &format!("{t}/end"));
    let (mut r, got) = connect_session(addr, &id, false);
    out.push(connack_line(&got));
    out.extend(until_sentinel(&mut r, &format!("{t}/end")).into_iter().map(|l| l.replace(&t, "T")));
    p.publish(&format!("{t}/live"), b"now", 1, false);
    out.push(r.expect_publish().replace(&t, "T"));
    out
}

same_on_both!(
    mqtt_3_1_2_4_a_persistent_session_keeps_subscriptions_and_queues_qos_1_and_2,
    queued_while_away,
    [
        "connack sp0 rc0",
        "connack sp1 rc0",
        "publish T/m \"one\" q1 r0",
        "publish T/m \"two\" q2 r0",
        "publish T/m \"three\" q1 r0",
        "publish T/live \"now\" q1 r0"
    ]
);

/// MQTT-4.4.0-1, MQTT-3.3.1-1: PUBLISHes not acknowledged when the connection dropped are sent
/// again on reconnect with their packet ids and DUP=1, in order; a QoS 2 message whose PUBREC
/// was sent gets its PUBREL again (not the PUBLISH).
fn retransmit(addr: SocketAddr) -> Vec<String> {
    let t = prefix();
    let id = format!("{t}-rt");
    let (mut r, _) = connect_session(addr, &id, false);
    r.subscribe(&[(&format!("{t}/#"), 2)]);
    let mut p = Raw::connect(addr, &format!("{t}-pub"));
    p.publish(&format!("{t}/a"), b"q1", 1, false);
    p.publish(&format!("{t}/b"), b"q2", 2, false);
    p.publish(&format!("{t}/c"), b"q2 rec", 2, false);
    let mut pids = Vec::new();
    for _ in 0..3 {
        match r.expect() {
            Got::Publish { pid, dup, .. } => {
                assert!(!dup, "a first delivery has DUP=0");
                pids.push(pid);
            }
            other => panic!("expected PUBLISH, got {other:?}"),
        }
    }
    r.ack("pubrec", pids[2]);
    assert_eq!(r.expect(), Got::Pubrel(pids[2]));
    // The connection drops without any other acknowledgement.
    drop(r);
    let (mut r, got) = connect_session(addr, &id, false);
    let mut out = vec![connack_line(&got)];
    let mut again = Vec::new();
    for _ in 0..3 {
        match r.expect() {
            Got::Publish { topic, payload, qos, pid, dup, .. } => {
                again.push(pid);
                out.push(format!(
                    "{} {:?} q{qos} dup{}",
                    topic.replace(&t, "T"),
                    String::from_utf8_lossy(&payload),
                    u8::from(dup)
                ));
            }
            Got::Pubrel(pid) => {
                again.push(pid);
                out.push("pubrel".into());
            }
            other => out.push(format!("{other:?}")),
        }
    }
    let mut sorted_then = pids.clone();
    sorted_then.sort();
    let mut sorted_again = again.clone();
    sorted_again.sort();
    out.push(format!("same packet ids: {}", sorted_then == sorted_again));
    out
}

same_on_both!(
    mqtt_4_4_0_1_unacknowledged_messages_are_resent_with_dup_on_reconnect,
    retransmit,
    ["connack sp1 rc0", "T/a \"q1\" q1 dup1", "T/b \"q2\" q2 dup1", "pubrel", "same packet ids: true"]
);

/// mam's per-session limit (CORE 11.2 Sessions): past `session_messages` the newest messages
/// are dropped, once logged; the oldest ones are kept and delivered.
#[test]
fn a_session_past_its_limit_drops_the_newest_and_logs_once() {
    let b = broker::start(BrokerConfig { session_messages: 2, ..cfg() }).unwrap();
    let (mut r, _) = connect_session(b.addr(), "lim", false);
    r.subscribe(&[("lim/#", 1)]);
    r.disconnect();
    wait_until("the session to be stored", WAIT, || b.sessions() == vec!["lim"]);
    let mut p = Raw::connect(b.addr(), "lim-pub");
    for n in 1..=4 {
        p.publish("lim/m", format!("{n}").as_bytes(), 1, false);
    }
    wait_log(&b, "WARNING: broker: client lim: session full (2 QoS 1/2 messages");
    let count = b.log_lines().iter().filter(|l| l.contains("session full")).count();
    assert_eq!(count, 1, "the drop is logged once");
    let (mut r, got) = connect_session(b.addr(), "lim", false);
    assert_eq!(got, Got::Connack { session_present: true, code: 0 });
    assert_eq!(r.expect_publish(), "publish lim/m \"1\" q1 r0");
    assert_eq!(r.expect_publish(), "publish lim/m \"2\" q1 r0");
    assert_eq!(r.next(Duration::from_millis(200)), Next::Timeout, "3 and 4 were dropped");
}

/// CONNACK 0x03 when mam stores `max_sessions` persistent sessions already (a refusal mosquitto
/// does not have); a clean client still gets in.
#[test]
fn a_persistent_session_beyond_max_sessions_gets_0x03() {
    let b = broker::start(BrokerConfig { max_sessions: 1, ..cfg() }).unwrap();
    let (r, _) = connect_session(b.addr(), "ms-1", false);
    r.disconnect();
    wait_until("ms-1 to be stored", WAIT, || b.sessions() == vec!["ms-1"]);
    let (mut r, got) = connect_session(b.addr(), "ms-2", false);
    assert_eq!(got, Got::Connack { session_present: false, code: 3 });
    r.expect_closed(WAIT);
    wait_log(&b, "max-sessions 1");
    let (_r, got) = connect_session(b.addr(), "ms-3", true);
    assert_eq!(got, Got::Connack { session_present: false, code: 0 });
    let (_r, got) = connect_session(b.addr(), "ms-1", false);
    assert_eq!(got, Got::Connack { session_present: true, code: 0 }, "the stored session resumes");
}
