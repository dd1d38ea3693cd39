//! Connecting: protocol levels, authentication, client ids, CleanSession and a held CONNACK (CORE 11.2, K2, K6).

use super::*;

/// A CONNECT naming protocol `name` at `level`, CleanSession=1, keepalive 60, client id `id`.
fn raw_connect(name: &[u8], level: u8, id: &str) -> Vec<u8> {
    let mut body = vec![0, name.len() as u8];
    body.extend_from_slice(name);
    body.extend_from_slice(&[level, 0x02, 0, 60]);
    if level == 5 {
        body.push(0); // properties length
    }
    body.extend_from_slice(&[0, id.len() as u8]);
    body.extend_from_slice(id.as_bytes());
    let mut out = vec![0x10, body.len() as u8];
    out.extend(body);
    out
}

#[test]
fn k2_other_protocol_levels_get_0x01() {
    let b = start();
    for (name, level) in [(&b"MQTT"[..], 5u8), (b"MQTT", 3), (b"MQIsdp", 4)] {
        let (mut c, code) = Raw::connect_with(b.addr(), &raw_connect(name, level, "cx"));
        assert_eq!(code, 1, "{} level {level}", String::from_utf8_lossy(name));
        c.expect_closed(WAIT);
        wait_log(&b, &format!("unsupported protocol level {level}; only 4 (MQTT 3.1.1) and 3 (MQTT 3.1, MQIsdp)"));
    }
}

/// Issue 31 item 4: an MQTT 3.1 client (`MQIsdp`, level 3) is accepted as by mosquitto: it
/// subscribes, publishes and receives like a 3.1.1 client; other levels of either name get 0x01,
/// and an empty 3.1 client id 0x02.
fn mqtt31(addr: SocketAddr) -> Vec<String> {
    let t = prefix();
    let mut out = Vec::new();
    let (mut old, code) = Raw::connect_with(addr, &raw_connect(b"MQIsdp", 3, &format!("{t}-31")));
    out.push(format!("MQIsdp 3: CONNACK {code}"));
    out.push(format!("suback {:?}", old.subscribe(&[(&format!("{t}/a"), 1)])));
    let mut new = Raw::connect(addr, &format!("{t}-311"));
    new.subscribe(&[(&format!("{t}/b"), 1)]);
    new.publish(&format!("{t}/a"), b"from 3.1.1", 1, false);
    out.push(old.expect_publish().replace(&t, "T"));
    old.publish(&format!("{t}/b"), b"from 3.1", 1, false);
    out.push(new.expect_publish().replace(&t, "T"));
    for (name, level, id) in [(&b"MQIsdp"[..], 3u8, ""), (b"MQIsdp", 4, "x"), (b"MQTT", 3, "x")] {
        let (_, code) = Raw::connect_with(addr, &raw_connect(name, level, id));
        out.push(format!("{} {level} id {id:?}: CONNACK {code}", String::from_utf8_lossy(name)));
    }
    out
}

same_on_both!(
    mqtt_3_1_mqisdp_clients_are_accepted,
    mqtt31,
    [
        "MQIsdp 3: CONNACK 0",
        "suback [1]",
        "publish T/a \"from 3.1.1\" q1 r0",
        "publish T/b \"from 3.1\" q1 r0",
        "MQIsdp 3 id \"\": CONNACK 2",
        "MQIsdp 4 id \"x\": CONNACK 1",
        "MQTT 3 id \"x\": CONNACK 1",
    ]
);

#[test]
fn k6_auth_codes() {
    let b =
        broker::start(BrokerConfig { username: Some("mam".into()), password: Some("s3cret".into()), ..cfg() }).unwrap();
    type Case<'a> = (Option<&'a str>, Option<&'a [u8]>, u8);
    let cases: &[Case] = &[
        (Some("mam"), Some(b"wrong"), 4),
        (Some("mam"), None, 4),
        (Some("other"), Some(b"s3cret"), 4),
        (None, None, 5),
        (Some("mam"), Some(b"s3cret"), 0),
    ];
    for (i, (user, pass, want)) in cases.iter().enumerate() {
        let (mut c, code) = Raw::connect_with(b.addr(), &connect_bytes(&format!("k6-{i}"), 60, true, *user, *pass));
        assert_eq!(code, *want, "case {i}: user {user:?} pass {pass:?}");
        if *want != 0 {
            c.expect_closed(WAIT);
        } else {
            c.publish("k6/ok", b"x", 1, false);
        }
    }
    assert!(!b.log_lines().join("\n").contains("s3cret"), "logs never show the password");
    assert!(!format!("{:?}", cfg_with_password()).contains("s3cret"), "Debug redacts the password");
}

fn cfg_with_password() -> BrokerConfig {
    BrokerConfig { password: Some("s3cret".into()), ..cfg() }
}

#[test]
fn empty_client_id_gets_auto_hex() {
    let b = start();
    let _c = Raw::connect(b.addr(), "");
    let ids = b.clients();
    assert_eq!(ids.len(), 1);
    let hex = ids[0].strip_prefix("auto-").expect("auto- prefix");
    assert!(!hex.is_empty() && hex.bytes().all(|c| c.is_ascii_hexdigit()), "{ids:?}");
    assert_eq!(b.connects(), vec![String::new()]);
    assert_eq!(b.connect_count(), 1);
}

#[test]
fn duplicate_client_id_closes_the_older_connection() {
    let b = start();
    let mut old = Raw::connect(b.addr(), "dup");
    old.subscribe(&[("dup/#", 0)]);
    let mut new = Raw::connect(b.addr(), "dup");
    old.expect_closed(WAIT);
    // The new session starts clean: the old subscription is gone, the new connection works.
    new.subscribe(&[("dup/new", 1)]);
    let mut p = Raw::connect(b.addr(), "dup-pub");
    p.publish("dup/new", b"x", 1, false);
    assert_eq!(new.expect_publish(), "publish dup/new \"x\" q1 r0");
    wait_until("the older connection to be forgotten", WAIT, || b.clients() == vec!["dup", "dup-pub"]);
    wait_log(&b, "connected again");
}

#[test]
fn stall_and_release_connack() {
    let b = start();
    b.stall_connack("slow-");
    let mut r = Raw::open(b.addr());
    r.send(&connect_bytes("slow-1", 60, true, None, None));
    wait_until("the stalled CONNECT to arrive", WAIT, || b.connect_count() == 1);
    assert_eq!(r.next(Duration::from_millis(300)), Next::Timeout, "no CONNACK while stalled");
    // Other clients are not affected.
    let _fast = Raw::connect(b.addr(), "fast-1");
    b.release_connack("slow-");
    assert_eq!(r.expect(), Got::Connack { session_present: false, code: 0 });
}
