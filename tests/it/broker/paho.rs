//! paho-mqtt as a real client (issue 17): the symptoms the issue reported, each run against the
//! embedded broker and mosquitto with `tests/fixtures/paho_client.py` (paho 1.6 or 2.x; every
//! mode ends within its own 15 s deadline). QoS 2 with `loop_start` delivers exactly once and does
//! not reconnect (MQTT-4.3.3), a will reaches a subscriber when its client is killed
//! (MQTT-3.1.2-8), a clean_session=False client gets what was queued while it was away
//! (MQTT-3.1.2-4).

use super::*;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/paho_client.py");

/// The python that runs the client: `MAM_PAHO_PYTHON` (scripts/test.sh sets the one that imports
/// paho: the system python3 where a pyenv python3 comes first on PATH), else `python3`.
fn python() -> String {
    std::env::var("MAM_PAHO_PYTHON").ok().filter(|p| !p.is_empty()).unwrap_or_else(|| "python3".into())
}

/// True when python3 can import paho; without it the tests skip, unless `MAM_REQUIRE_PAHO=1`
/// (scripts/test.sh installs python3-paho-mqtt and sets it), where it is a failure.
fn have_paho() -> bool {
    let ok = Command::new(python())
        .args(["-c", "import paho.mqtt.client"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var("MAM_REQUIRE_PAHO").as_deref() != Ok("1"),
            "MAM_REQUIRE_PAHO=1 but {} cannot import paho.mqtt (apt-get install python3-paho-mqtt; MAM_PAHO_PYTHON names the python)",
            python()
        );
        eprintln!("skipped: python3 with paho-mqtt not found");
    }
    ok
}

fn paho(args: &[&str]) -> Command {
    let mut c = Command::new(python());
    c.arg(SCRIPT).args(args);
    c
}

/// Runs one scenario to its end (20 s at most; the script's own deadline is 15 s) and returns its
/// JSON line.
fn paho_json(args: &[&str]) -> serde_json::Value {
    let mut child = paho(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    wait_exit(&format!("paho_client.py {args:?}"), &mut child, Duration::from_secs(20));
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "paho_client.py {args:?}: {:?}\nstdout {stdout}\nstderr {stderr}", out.status);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout:?} (stderr {stderr})"))
}

/// Runs `scenario` against the embedded broker and against mosquitto; both must give `want`.
fn on_both(scenario: fn(u16) -> serde_json::Value, want: serde_json::Value) {
    if !have_paho() {
        return;
    }
    let same = |side: &str, got: serde_json::Value| {
        // Value equality ignores the order of object keys.
        assert!(got == want, "{side}: want\n{want:#}\ngot\n{got:#}");
    };
    let b = start();
    same("mam", scenario(b.addr().port()));
    if have_tool("mosquitto", "MAM_REQUIRE_MOSQUITTO") {
        let td = TestDir::new("paho-mosquitto");
        let m = Mosquitto::start(&td, anonymous);
        same("mosquitto", scenario(m.port));
    }
}

#[test]
fn mqtt_4_3_3_paho_qos2_with_loop_start_is_delivered_exactly_once_without_reconnecting() {
    let scenario = |port: u16| paho_json(&["qos2", &port.to_string(), &format!("{}/q2", prefix()), "20"]);
    let mut received: serde_json::Map<String, serde_json::Value> =
        (0..20).map(|i| (format!("m{i} q2"), serde_json::json!(1))).collect();
    received.insert("end q2".into(), serde_json::json!(1));
    on_both(
        scenario,
        serde_json::json!({
            "received": received,
            "publisher_connects": 1,
            "publisher_losses": 0,
            "subscriber_connects": 1,
            "subscriber_losses": 0,
        }),
    );
}

#[test]
fn mqtt_3_1_2_4_a_paho_clean_session_false_client_gets_its_queued_messages() {
    let scenario = |port: u16| {
        let t = prefix();
        paho_json(&["session", &port.to_string(), &format!("{t}/s"), &format!("{t}-paho")])
    };
    on_both(
        scenario,
        serde_json::json!({
            "first_session_present": false,
            "session_present": true,
            "messages": ["queued 0 q1 r0", "queued 1 q1 r0", "queued 2 q1 r0"],
        }),
    );
}

/// A paho watcher sees the will of a paho client killed with SIGKILL (no DISCONNECT).
fn will_scenario(port: u16) -> serde_json::Value {
    let topic = format!("{}/will", prefix());
    let port = port.to_string();
    let spawn = |args: &[&str]| {
        let mut c = paho(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
        let lines = BufReader::new(c.stdout.take().unwrap()).lines();
        (ChildGuard(c), lines)
    };
    let (mut watcher, mut seen) = spawn(&["watch", &port, &topic, "1"]);
    let next = |what: &str, lines: &mut std::io::Lines<BufReader<std::process::ChildStdout>>| {
        // Each script exits within its deadline, so this read ends.
        lines.next().and_then(Result::ok).unwrap_or_else(|| panic!("paho_client.py ended before {what}"))
    };
    assert_eq!(next("subscribing", &mut seen), "subscribed");
    let (mut doomed, mut said) = spawn(&["will", &port, &topic]);
    assert_eq!(next("connecting", &mut said), "connected");
    doomed.0.kill().unwrap();
    doomed.0.wait().unwrap();
    let got = next("the will", &mut seen).replace(&topic, "T");
    wait_exit("the paho watcher", &mut watcher.0, Duration::from_secs(20));
    serde_json::json!({ "watcher saw": got })
}

/// Kills and reaps its child on drop.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn mqtt_3_1_2_8_a_paho_clients_will_is_delivered_when_it_is_killed() {
    on_both(will_scenario, serde_json::json!({ "watcher saw": "T paho died q1 r0" }));
}
