//! The `mam broker` binary: mosquitto's clients against it, auth with a password file, signals and
//! usage errors (K1, K9).

use super::*;

#[test]
fn k1_mosquitto_clients_against_mam_broker() {
    if !have_tool("mosquitto_pub", "MAM_REQUIRE_MOSQUITTO") {
        return;
    }
    let td = TestDir::new("k1");
    // The protocol subset with third-party clients; credentials are security_broker's business.
    let b = BrokerProc::start(&td, &["--allow-anonymous"]);
    let port = b.port();
    // Retained, QoS 1 (mosquitto_pub exits 0 only after the PUBACK).
    for (t, m) in [("k1/a/x", "ax"), ("k1/b/x", "bx"), ("k1/b/y", "by")] {
        let out = run_tool(Command::new("mosquitto_pub").args(["-p", &port, "-q", "1", "-r", "-t", t, "-m", m]));
        assert!(out.status.success(), "mosquitto_pub: {}", String::from_utf8_lossy(&out.stderr));
    }
    // A subscriber on `+` and `#` filters: gets the retained ones, then a live one.
    let (mut sub, rx) =
        sub_lines(&["-p", &port, "-q", "1", "-v", "-t", "k1/+/x", "-t", "k1/b/#", "-C", "4", "-W", "10"]);
    let mut lines: Vec<String> = (0..3).map(|_| rx.recv_timeout(WAIT).expect("retained line")).collect();
    lines.sort();
    assert_eq!(lines, vec!["k1/a/x ax", "k1/b/x bx", "k1/b/y by"]);
    let out = run_tool(Command::new("mosquitto_pub").args(["-p", &port, "-q", "1", "-t", "k1/c/x", "-m", "live"]));
    assert!(out.status.success());
    assert_eq!(rx.recv_timeout(WAIT).unwrap(), "k1/c/x live");
    let st = sub.wait().unwrap();
    assert!(st.success());
    // A mosquitto_pub with a wildcard topic is refused by the client itself; a v5 one by us.
    let out = run_tool(Command::new("mosquitto_pub").args(["-V", "mqttv5", "-p", &port, "-t", "k1/v5", "-m", "x"]));
    assert!(!out.status.success());
    let line = b.wait_log("unsupported protocol level 5");
    assert!(line.starts_with("NOTE: broker: "), "{line}");
}

#[test]
fn mam_broker_auth_with_password_file_and_sigterm() {
    if !have_tool("mosquitto_pub", "MAM_REQUIRE_MOSQUITTO") {
        return;
    }
    let td = TestDir::new("broker-auth");
    let secret = format!("pw-{}", rand_hex(6));
    let pwfile = td.write("pw", format!("{secret}\n"));
    let b = BrokerProc::start(&td, &["--username", "mam", "--password-file", pwfile.to_str().unwrap()]);
    let port = b.port();
    let ok = run_tool(
        Command::new("mosquitto_pub").args(["-p", &port, "-u", "mam", "-P", &secret, "-q", "1", "-t", "a", "-m", "x"]),
    );
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    let bad =
        run_tool(Command::new("mosquitto_pub").args(["-p", &port, "-u", "mam", "-P", "nope", "-t", "a", "-m", "x"]));
    assert!(!bad.status.success());
    let log = b.terminate();
    assert!(log.iter().any(|l| l.contains("bad username or password")), "{log:?}");
    assert!(!log.join("\n").contains(&secret));
}

#[test]
fn mam_broker_sigint_exits_0() {
    let td = TestDir::new("broker-int");
    let b = BrokerProc::start(&td, &["--allow-anonymous"]);
    let _c = Raw::connect(b.addr, "held-open");
    b.stop_with(2);
}

#[test]
fn k9_cli_refuses_non_loopback_bind_without_allow_remote() {
    let td = TestDir::new("k9");
    for addr in ["0.0.0.0", "10.1.2.3", "::"] {
        let r = td.mam().args(["broker", "--bind", addr, "--port", "0"]).run();
        r.expect_rc(2);
        eqnice!("ERROR: refusing to bind non-loopback address without --allow-remote\n", r.stderr());
        assert_eq!(r.stdout(), "");
    }
}

#[test]
fn cli_usage_errors() {
    let td = TestDir::new("broker-usage");
    for args in [
        &["broker", "--port", "70000"][..],
        &["broker", "--bind", "localhost"],
        &["broker", "--username", "u"],
        &["broker", "--max-packet", "10"],
        &["broker", "--password", "x"],
        &["broker", "--allow-anonymous", "--username", "u", "--password-file", "/dev/null"],
        &["broker", "--max-connections", "0"],
        &["broker", "--max-subscriptions", "0"],
        &["broker", "--max-retained-bytes", "-1"],
        &["broker", "--persist-interval", "0"],
        &["broker", "--no-persist", "--persist-interval", "3"],
        &["broker", "--max-state-bytes", "10"],
    ] {
        let r = td.mam().args(args).run();
        r.expect_rc(2);
        assert!(r.stderr().starts_with("ERROR: "), "{args:?}: {}", r.stderr());
    }
    let r = td.mam().args(["broker", "--username", "u", "--password-file", "/nonexistent/pw"]).run();
    r.expect_rc(1);
    assert!(r.stderr().contains("cannot read password file"), "{}", r.stderr());
    td.mam().args(["broker", "--help"]).run().expect_rc(0);
}

/// Issue 17: `mam broker --help` states what is supported and what is not.
#[test]
fn broker_help_states_what_is_supported_and_what_is_not() {
    let td = TestDir::new("broker-help");
    let r = td.mam().args(["broker", "--help"]).run();
    r.expect_rc(0);
    let help = r.stdout();
    let (yes, no) = help.split_once("Not supported:").expect("a Not supported: paragraph");
    for want in [
        "Supported: MQTT 3.1.1",
        "QoS 0, 1 and 2 in both directions",
        "retained messages",
        "will messages",
        "persistent sessions (CleanSession=0)",
        "every CONNACK return code",
        "persistence (on unless --no-persist)",
        "<control root>/.mam/broker.state",
    ] {
        assert!(yes.contains(want), "supported: {want:?} missing from\n{help}");
    }
    for want in ["MQTT 5", "TLS", "websockets", "bridges", "ACLs", "$SYS", "QoS 0"] {
        assert!(no.split("\n\n").next().unwrap().contains(want), "not supported: {want:?} missing from\n{help}");
    }
}
