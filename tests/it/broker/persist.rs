//! Persistence across a restart (CORE 11.2 Persistence; MQTT-3.1.2-4 across a broker restart):
//! `mam broker` keeps retained messages and persistent sessions in `<control root>/.mam/broker.state`,
//! written at most `--persist-interval` after a change and at SIGTERM, read at start without
//! following a symlink; a file it cannot use is set aside as `broker.state.bad`.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use super::*;

fn state_file(td: &TestDir) -> PathBuf {
    td.ws().join(".mam/broker.state")
}

/// A broker that can be stopped cleanly and started again with its state: `mam broker` in a
/// workspace, or mosquitto with `persistence true`.
enum Restartable<'a> {
    Mam(&'a TestDir, Option<BrokerProc>),
    Mosquitto(Mosquitto),
}

impl Restartable<'_> {
    fn port(&self) -> String {
        match self {
            Restartable::Mam(_, b) => b.as_ref().unwrap().port(),
            Restartable::Mosquitto(m) => m.port.to_string(),
        }
    }

    /// SIGTERM, wait for the exit, start again on the same state.
    fn restart(&mut self) {
        match self {
            Restartable::Mam(td, b) => {
                let log = b.take().unwrap().terminate();
                assert!(log.iter().any(|l| l.contains("NOTE: broker: saved ")), "{log:#?}");
                let again = BrokerProc::start(td, &["--allow-anonymous"]);
                again.wait_log("NOTE: broker: restored ");
                *b = Some(again);
            }
            Restartable::Mosquitto(m) => {
                m.terminate();
                m.launch();
            }
        }
    }
}

/// `mosquitto_sub -c -i <id>` away across a restart: what was published while it was away
/// (QoS 1 and 2, and a retained message) arrives when it returns to the restarted broker, first
/// the queued messages in order, then the retained replay of its SUBSCRIBE (sorted: the order of a
/// replay is not the standard's business).
fn session_across_restart(b: &mut Restartable<'_>) -> Vec<String> {
    let t = prefix();
    let id = format!("{t}-away");
    let filter = format!("{t}/#");
    let tool = |args: &[&str], port: &str| {
        let out = run_tool(Command::new(args[0]).args(["-h", "127.0.0.1", "-p", port]).args(&args[1..]));
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).replace(&t, "T")
    };
    let port = b.port();
    tool(&["mosquitto_pub", "-q", "1", "-r", "-t", &format!("{t}/ready"), "-m", "ready"], &port);
    // Subscribed once the retained message arrived; -C 1 leaves with DISCONNECT, the session stays.
    let first = tool(&["mosquitto_sub", "-c", "-i", &id, "-q", "1", "-t", &filter, "-C", "1", "-W", "10", "-v"], &port);
    let mut out = vec![first.trim_end().to_string()];
    tool(&["mosquitto_pub", "-q", "1", "-t", &format!("{t}/m"), "-m", "one"], &port);
    tool(&["mosquitto_pub", "-q", "2", "-t", &format!("{t}/m"), "-m", "two"], &port);
    tool(&["mosquitto_pub", "-q", "1", "-r", "-t", &format!("{t}/keep"), "-m", "kept"], &port);
    b.restart();
    let port = b.port();
    let fmt = "%t %p q%q r%r";
    let back =
        tool(&["mosquitto_sub", "-c", "-i", &id, "-q", "1", "-t", &filter, "-C", "5", "-W", "10", "-F", fmt], &port);
    let lines: Vec<String> = back.lines().map(String::from).collect();
    out.extend(lines.iter().take(3).cloned());
    let mut replay: Vec<String> = lines.into_iter().skip(3).collect();
    replay.sort();
    out.extend(replay);
    // A new client gets the retained message too.
    out.push(tool(&["mosquitto_sub", "-t", &format!("{t}/keep"), "-C", "1", "-W", "10", "-F", fmt], &port));
    out.iter().map(|l| l.trim_end().to_string()).collect()
}

#[test]
fn persist_retained_and_a_mosquitto_sub_c_session_survive_a_sigterm_restart() {
    if !have_tool("mosquitto_sub", "MAM_REQUIRE_MOSQUITTO") {
        return;
    }
    let want = [
        "T/ready ready",
        "T/m one q1 r0",
        "T/m two q1 r0",
        "T/keep kept q1 r0",
        "T/keep kept q1 r1",
        "T/ready ready q1 r1",
        "T/keep kept q0 r1",
    ];
    let td = TestDir::new("persist-restart");
    let mut mam = Restartable::Mam(&td, Some(BrokerProc::start(&td, &["--allow-anonymous"])));
    let got = session_across_restart(&mut mam);
    eqnice!(want.join("\n"), got.join("\n"));
    let meta = std::fs::symlink_metadata(state_file(&td)).unwrap();
    assert!(meta.is_file(), "the state file is a regular file");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600, "and private");
    let mdir = td.path("mosquitto-db");
    std::fs::create_dir_all(&mdir).unwrap();
    let conf =
        move |port: u16| format!("{}persistence true\npersistence_location {}/\n", anonymous(port), mdir.display());
    let mut mosq = Restartable::Mosquitto(Mosquitto::start(&td, conf));
    let theirs = session_across_restart(&mut mosq);
    eqnice!(want.join("\n"), theirs.join("\n"));
}

/// The retained payload of `topic` on the broker at `addr`, if it has one (a fresh subscriber).
fn retained_on(addr: SocketAddr, topic: &str) -> Option<String> {
    let mut r = Raw::connect(addr, &format!("probe-{}", rand_hex(3)));
    r.subscribe(&[(topic, 1)]);
    match r.next(Duration::from_millis(300)) {
        Next::Packet(Got::Publish { payload, retain: true, .. }) => Some(String::from_utf8_lossy(&payload).into()),
        _ => None,
    }
}

fn file_contains(path: &std::path::Path, needle: &str) -> bool {
    std::fs::read(path).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes()))
}

/// The write policy (CORE 11.2 Persistence): a change is on disk within `--persist-interval`
/// (1 s here), so a kill -9 after that loses nothing; a kill -9 before the interval ends loses
/// that change (a 3600 s interval: the change is never written before the kill).
#[test]
fn persist_kill_9_loses_at_most_the_changes_of_the_last_interval() {
    let td = TestDir::new("persist-kill");
    let file = state_file(&td);
    let b = BrokerProc::start(&td, &["--allow-anonymous", "--persist-interval", "1"]);
    let started = Instant::now();
    Raw::connect(b.addr, "k-pub").publish("k/a", b"written-within-1s", 1, true);
    wait_until("the change in the state file", WAIT, || file_contains(&file, "written-within-1s"));
    let took = started.elapsed();
    assert!(took < Duration::from_millis(3000), "written after {took:?} (interval 1 s)");
    b.kill9();
    let b = BrokerProc::start(&td, &["--allow-anonymous", "--persist-interval", "3600"]);
    b.wait_log("NOTE: broker: restored 1 retained message and 0 sessions (0 QoS 1/2 messages)");
    assert_eq!(retained_on(b.addr, "k/a").as_deref(), Some("written-within-1s"));
    Raw::connect(b.addr, "k-pub").publish("k/b", b"lost", 1, true);
    assert_eq!(retained_on(b.addr, "k/b").as_deref(), Some("lost"), "retained while the broker runs");
    b.kill9();
    assert!(!file_contains(&file, "lost"), "not written before the interval ended");
    let b = BrokerProc::start(&td, &["--allow-anonymous"]);
    assert_eq!(retained_on(b.addr, "k/a").as_deref(), Some("written-within-1s"));
    assert_eq!(retained_on(b.addr, "k/b"), None, "the change of the last interval is lost");
    // --no-persist: nothing read, nothing written.
    b.terminate();
    let before = std::fs::read(&file).unwrap();
    let b = BrokerProc::start(&td, &["--allow-anonymous", "--no-persist"]);
    assert_eq!(retained_on(b.addr, "k/a"), None, "--no-persist restores nothing");
    Raw::connect(b.addr, "k-pub").publish("k/c", b"memory only", 1, true);
    let log = b.terminate();
    assert!(log.iter().all(|l| !l.contains("state")), "{log:#?}");
    assert_eq!(std::fs::read(&file).unwrap(), before, "--no-persist writes nothing");
}

/// Makes a valid state file holding the retained message `topic` = `payload` in a workspace of
/// its own, and returns that workspace.
fn foreign_state(topic: &str, payload: &[u8]) -> TestDir {
    let other = TestDir::new("persist-foreign");
    let b = BrokerProc::start(&other, &["--allow-anonymous"]);
    Raw::connect(b.addr, "f-pub").publish(topic, payload, 1, true);
    b.terminate();
    assert!(file_contains(&state_file(&other), std::str::from_utf8(payload).unwrap()));
    other
}

/// A symlink planted at the state file's path is not read (a valid state file behind it is not
/// restored; the link is moved aside), and one planted while the broker runs is not written
/// through (the save replaces the link; its target is unchanged). A state file open to group or
/// others is set aside too.
#[test]
fn persist_a_planted_symlink_at_the_state_file_is_not_followed() {
    let other = foreign_state("f/t", b"foreign");
    let target = state_file(&other);
    let target_bytes = std::fs::read(&target).unwrap();
    let td = TestDir::new("persist-link");
    let file = state_file(&td);
    std::os::unix::fs::symlink(&target, &file).unwrap();
    let b = BrokerProc::start(&td, &["--allow-anonymous"]);
    let line = b.wait_log("is a symbolic link (not followed)");
    assert!(line.starts_with("WARNING: broker: state file ") && line.contains("broker.state.bad"), "{line}");
    assert_eq!(retained_on(b.addr, "f/t"), None, "the file behind the link was not restored");
    let bad = td.ws().join(".mam/broker.state.bad");
    assert!(std::fs::symlink_metadata(&bad).unwrap().file_type().is_symlink(), "the link itself was set aside");
    // Planted again while the broker runs: the save replaces the link instead of writing through it.
    std::os::unix::fs::symlink(&target, &file).unwrap();
    Raw::connect(b.addr, "m-pub").publish("m/t", b"mine", 1, true);
    b.terminate();
    assert_eq!(std::fs::read(&target).unwrap(), target_bytes, "the link's target is untouched");
    let meta = std::fs::symlink_metadata(&file).unwrap();
    assert!(meta.is_file() && meta.permissions().mode() & 0o777 == 0o600, "{meta:?}");
    assert!(file_contains(&file, "mine"));

    // A state file others may write is not trusted either.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
    let b = BrokerProc::start(&td, &["--allow-anonymous"]);
    b.wait_log("has mode 0666: open to group or others");
    assert_eq!(retained_on(b.addr, "m/t"), None);
}

/// A truncated state file (the checksum does not match) is set aside as broker.state.bad, with a
/// WARNING that names it and what to do; the broker starts without it and writes a good one.
#[test]
fn persist_a_truncated_state_file_is_set_aside_and_the_broker_starts_without_it() {
    let td = TestDir::new("persist-trunc");
    let file = state_file(&td);
    let b = BrokerProc::start(&td, &["--allow-anonymous"]);
    Raw::connect(b.addr, "t-pub").publish("t/a", b"before the damage", 1, true);
    b.terminate();
    let whole = std::fs::read(&file).unwrap();
    std::fs::write(&file, &whole[..whole.len() - 10]).unwrap();
    let b = BrokerProc::start(&td, &["--allow-anonymous"]);
    let line = b.wait_log("checksum mismatch: truncated or damaged");
    assert!(line.contains("not restored, moved to ") && line.contains("inspect or delete"), "{line}");
    assert_eq!(std::fs::read(td.ws().join(".mam/broker.state.bad")).unwrap(), &whole[..whole.len() - 10]);
    assert!(!file.exists());
    assert_eq!(retained_on(b.addr, "t/a"), None);
    Raw::connect(b.addr, "t-pub").publish("t/b", b"after", 1, true);
    b.terminate();
    let b = BrokerProc::start(&td, &["--allow-anonymous"]);
    b.wait_log("restored 1 retained message");
    assert_eq!(retained_on(b.addr, "t/b").as_deref(), Some("after"));
}

/// One state file, one broker: a second `mam broker` of the same control root keeps its state in
/// memory only and says so; the first one's file is left to the first.
#[test]
fn persist_a_second_broker_of_the_control_root_runs_without_the_state_file() {
    let td = TestDir::new("persist-two");
    let first = BrokerProc::start(&td, &["--allow-anonymous"]);
    let second = BrokerProc::start(&td, &["--allow-anonymous"]);
    let line = second.wait_log("is in use by another mam broker");
    assert!(line.starts_with("WARNING: broker: state file ") && line.contains("--no-persist"), "{line}");
    Raw::connect(second.addr, "s-pub").publish("s/t", b"second", 1, true);
    let log = second.terminate();
    assert!(!log.iter().any(|l| l.contains("saved")), "{log:#?}");
    assert!(!file_contains(&state_file(&td), "second"));
    Raw::connect(first.addr, "f-pub").publish("f/t", b"first", 1, true);
    first.terminate();
    assert!(file_contains(&state_file(&td), "first"));
}

/// A restored session routes from its restored subscriptions (no SUBSCRIBE after the restart):
/// a message published after the restart while the client is still away is queued for it, and
/// a QoS 2 message it had not acknowledged before the restart comes again with DUP=1.
#[test]
fn persist_a_restored_session_routes_and_resends_without_a_new_subscribe() {
    let td = TestDir::new("persist-routes");
    let b = BrokerProc::start(&td, &["--allow-anonymous"]);
    let (mut r, code) = Raw::connect_with(b.addr, &connect_bytes("rs-away", 60, false, None, None));
    assert_eq!(code, 0);
    r.subscribe(&[("rs/#", 2)]);
    Raw::connect(b.addr, "rs-pub").publish("rs/before", b"unacknowledged", 2, false);
    let pid = match r.expect() {
        Got::Publish { topic, pid, dup: false, .. } if topic == "rs/before" => pid,
        other => panic!("expected the first delivery, got {other:?}"),
    };
    // Gone without acknowledging it; the shutdown keeps the session either way.
    drop(r);
    b.terminate();
    let b = BrokerProc::start(&td, &["--allow-anonymous"]);
    b.wait_log("restored 0 retained messages and 1 session (1 QoS 1/2 message)");
    Raw::connect(b.addr, "rs-pub").publish("rs/after", b"routed after the restart", 1, false);
    let (mut r, code) = Raw::connect_with(b.addr, &connect_bytes("rs-away", 60, false, None, None));
    assert_eq!(code, 0);
    match r.expect() {
        Got::Publish { topic, pid: again, dup, qos, .. } => {
            assert_eq!((topic.as_str(), again, dup, qos), ("rs/before", pid, true, 2))
        }
        other => panic!("expected the resend, got {other:?}"),
    }
    r.ack("pubrec", pid);
    // The queued message may come before the PUBREL (both follow the CONNACK at once).
    r.wait_for(Got::Pubrel(pid));
    r.ack("pubcomp", pid);
    assert_eq!(r.expect_publish(), "publish rs/after \"routed after the restart\" q1 r0");
}
