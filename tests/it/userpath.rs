//! Issue 18, the user's path: errors that say what to do and state a person can read, at the CLI.

use crate::support::*;

/// A broker that is not running: the error says how to start one or which variable to set.
#[test]
fn broker_not_running_says_how_to_start_one() {
    let td = TestDir::new("nobroker");
    let port = free_port();
    let r = td.mam().args(["pub", "-t", "a/b", "-m", "x", "-p", &port.to_string()]).run();
    r.expect_rc(3);
    let last = r.stderr().lines().last().unwrap_or("").to_string();
    assert!(last.starts_with(&format!("ERROR: cannot connect to broker 127.0.0.1:{port}")), "{last}");
    assert!(last.contains("start one with `mam broker") && last.contains("MQTT_BROKER and MQTT_PORT"), "{last}");
}
