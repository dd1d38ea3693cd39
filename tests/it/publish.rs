//! Integration tests: `mam publish` (CORE 6, A4, A8): U1-U11, races, bad input and the operator close
//! state. Scenarios that need broker hooks (stall CONNACK, received(), connect_count()) run against
//! the embedded broker; U1 also runs against mosquitto, checked by an independent wire observer
//! (mosquitto_sub) and verifier (python3 json.dumps + openssl dgst).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mam::broker::{BrokerConfig, BrokerHandle};
use serde_json::Value;

use crate::support::{
    embedded, free_port, have_tool, independent_verify, mam_bin, rand_hex, start_target, tree, wait_until, Cmd,
    MosqSub, TestDir, TARGETS,
};

pub(crate) fn registry(td: &TestDir) -> PathBuf {
    td.ws().join(".mam/jobs")
}

pub(crate) fn logs(td: &TestDir) -> PathBuf {
    td.ws().join(".mam/delegate_job_logs")
}

pub(crate) fn record(td: &TestDir, id: &str) -> Value {
    serde_json::from_slice(&fs::read(registry(td).join(format!("{id}.json"))).unwrap()).unwrap()
}

pub(crate) fn record_bytes(td: &TestDir, id: &str) -> Vec<u8> {
    fs::read(registry(td).join(format!("{id}.json"))).unwrap()
}

pub(crate) fn key(td: &TestDir, id: &str) -> String {
    record(td, id)["auth_token"].as_str().unwrap().to_string()
}

/// events.log lines, raw.
pub(crate) fn event_lines(td: &TestDir, id: &str) -> Vec<String> {
    let text = fs::read_to_string(registry(td).join(id).join("events.log")).unwrap_or_default();
    text.lines().map(str::to_string).collect()
}

pub(crate) fn events(td: &TestDir, id: &str) -> Vec<Value> {
    event_lines(td, id).iter().map(|l| serde_json::from_str(l).unwrap()).collect()
}

pub(crate) fn audit(td: &TestDir, id: &str) -> Vec<Value> {
    let text = fs::read_to_string(logs(td).join(id).join("audit.jsonl")).unwrap_or_default();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// A `mam` command whose broker is 127.0.0.1:`port`.
pub(crate) fn mam_at(td: &TestDir, port: u16) -> Cmd {
    td.mam().env("MQTT_PORT", port.to_string()).env("MQTT_BROKER", "127.0.0.1")
}

/// Registers a fresh job whose broker block names `port`; returns its id.
pub(crate) fn new_job(td: &TestDir, port: u16, extra: &[&str]) -> String {
    let id = format!("j{}", rand_hex(4));
    mam_at(td, port)
        .args(["registry", "register", "--session", "w1", "--job-id", &id, "--heartbeat-sec", "1"])
        .args(extra)
        .run()
        .expect_rc(0);
    id
}

/// `mam publish --job-id <id> --event <event> [extra]` against `port`.
pub(crate) fn publish(td: &TestDir, port: u16, id: &str, event: &str, extra: &[&str]) -> crate::support::Run {
    mam_at(td, port).args(["publish", "--job-id", id, "--event", event]).args(extra).run()
}

pub(crate) fn embedded_at(port: u16) -> BrokerHandle {
    let bind = format!("127.0.0.1:{port}").parse().unwrap();
    mam::broker::start(BrokerConfig { bind, ..Default::default() }).unwrap()
}

/// Payloads the broker received on `topic`, in order.
pub(crate) fn on_topic(b: &BrokerHandle, topic: &str) -> Vec<Value> {
    b.received()
        .into_iter()
        .filter(|(t, _, _)| t == topic)
        .map(|(_, p, _)| serde_json::from_slice(&p).unwrap())
        .collect()
}

/// Every received message of a job as (kind, status-or-event, seq), in arrival order.
pub(crate) fn wire_log(b: &BrokerHandle, id: &str) -> Vec<(String, String, u64)> {
    let prefix = format!("mam/jobs/{id}/");
    b.received()
        .into_iter()
        .filter(|(t, _, _)| t.starts_with(&prefix))
        .map(|(_, p, _)| {
            let v: Value = serde_json::from_slice(&p).unwrap();
            let what = if v["kind"] == "state" { v["status"].clone() } else { v["event"].clone() };
            (v["kind"].as_str().unwrap().into(), what.as_str().unwrap().into(), v["seq"].as_u64().unwrap())
        })
        .collect()
}

/// Asserts the invariant of CORE 6.4: once the terminal state is on the wire, no `running` state
/// and no non-terminal event follows it.
pub(crate) fn assert_nothing_running_after_terminal(log: &[(String, String, u64)], terminal: &str) {
    let Some(i) = log.iter().position(|(k, s, _)| k == "state" && s == terminal) else {
        panic!("no {terminal} state on the wire: {log:?}");
    };
    for (k, s, seq) in &log[i + 1..] {
        assert!(!(k == "state" && s == "running"), "running state seq={seq} after the terminal: {log:?}");
        assert!(!(k == "event" && (s == "progress" || s == "started")), "{s} seq={seq} after the terminal: {log:?}");
    }
}

/// A `mam` process running in the background; killed and reaped on drop.
pub(crate) struct Bg {
    child: Option<Child>,
}

impl Bg {
    pub(crate) fn spawn(mut c: Cmd) -> Bg {
        c.cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        Bg { child: Some(c.cmd.spawn().unwrap()) }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    pub(crate) fn running(&mut self) -> bool {
        self.child.as_mut().unwrap().try_wait().unwrap().is_none()
    }

    /// Waits up to `limit` and returns (rc, stdout, stderr).
    pub(crate) fn finish(mut self, limit: Duration) -> (i32, String, String) {
        let mut child = self.child.take().unwrap();
        crate::support::wait_exit("the background mam", &mut child, limit);
        let out = child.wait_with_output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

impl Drop for Bg {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn retained_via_mosquitto_sub(port: u16, topic: &str) -> String {
    let out = Command::new("mosquitto_sub")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-t", topic, "-C", "1", "-W", "5"])
        .output()
        .unwrap();
    assert!(out.status.success(), "no retained message on {topic}");
    String::from_utf8(out.stdout).unwrap().trim_end().to_string()
}

#[test]
fn u1_started_event_and_state_on_disk_and_wire() {
    for &t in TARGETS {
        let td = TestDir::new("u1");
        let Some(b) = start_target(t, &td) else { continue };
        let port = b.port();
        let id = new_job(&td, port, &[]);
        let observer = have_tool("mosquitto_sub", "MAM_REQUIRE_MOSQUITTO")
            .then(|| MosqSub::start(port, &format!("mam/jobs/{id}/#")));
        let r = publish(&td, port, &id, "started", &[]);
        assert_eq!(r.expect_rc(0).stdout(), format!("published started seq=1 job={id}\n"), "{t:?}");
        assert_eq!(r.stderr(), "");
        let k = key(&td, &id);
        let lines = event_lines(&td, &id);
        assert_eq!(lines.len(), 1, "{t:?}");
        let ev: Value = serde_json::from_str(&lines[0]).unwrap();
        assert!(mam::sign::verify(k.as_bytes(), &ev));
        assert_eq!(
            (ev["event"].as_str(), ev["seq"].as_u64(), ev["heartbeat"].as_bool()),
            (Some("started"), Some(1), Some(false))
        );
        let rec = record(&td, &id);
        assert_eq!((rec["status"].as_str(), rec["last_seq"].as_u64()), (Some("running"), Some(1)));
        let retained = match &b {
            crate::support::Broker::Embedded(h) => {
                String::from_utf8(h.retained(&format!("mam/jobs/{id}/state")).expect("retained state")).unwrap()
            }
            crate::support::Broker::Mosquitto(_) => retained_via_mosquitto_sub(port, &format!("mam/jobs/{id}/state")),
        };
        let st: Value = serde_json::from_str(&retained).unwrap();
        assert!(mam::sign::verify(k.as_bytes(), &st));
        assert_eq!(
            (st["kind"].as_str(), st["status"].as_str(), st["last_event"].as_str(), st["seq"].as_u64()),
            (Some("state"), Some("running"), Some("started"), Some(1)),
            "{t:?}"
        );
        let Some(obs) = observer else { continue };
        wait_until("the observer to see event and state", Duration::from_secs(10), || obs.messages("mam/").len() >= 2);
        let msgs = obs.messages("mam/");
        assert_eq!(msgs[0], (format!("mam/jobs/{id}/events"), lines[0].clone()), "the wire carries the disk bytes");
        assert_eq!(msgs[1].0, format!("mam/jobs/{id}/state"));
        if have_tool("openssl", "MAM_REQUIRE_OPENSSL") {
            let payloads = vec![msgs[0].1.clone(), msgs[1].1.clone(), retained.clone()];
            assert_eq!(independent_verify(&k, &payloads), ["ok event 1", "ok state 1", "ok state 1"], "{t:?}");
            // The verifier can fail: a foreign key does not verify.
            assert_eq!(independent_verify(&rand_hex(32), &payloads[..1]), ["bad event 1"]);
        }
    }
}

#[test]
fn u2_event_is_on_disk_while_connack_is_held() {
    let td = TestDir::new("u2");
    let b = embedded();
    let port = b.addr().port();
    let id = new_job(&td, port, &[]);
    b.stall_connack("mam-pub-");
    let mut p = Bg::spawn(mam_at(&td, port).args(["publish", "--job-id", &id, "--event", "started"]));
    wait_until("the event line while CONNACK is held", Duration::from_secs(10), || event_lines(&td, &id).len() == 1);
    wait_until("the publisher's CONNECT", Duration::from_secs(10), || {
        b.connects().iter().any(|c| c.starts_with(&format!("mam-pub-{}-", p.pid())))
    });
    assert!(p.running(), "publish finished while its CONNACK was held");
    assert!(b.received().is_empty());
    b.release_connack("mam-pub-");
    let (rc, out, err) = p.finish(Duration::from_secs(30));
    assert_eq!((rc, out.as_str()), (0, format!("published started seq=1 job={id}\n").as_str()), "{err}");
    assert_eq!(event_lines(&td, &id).len(), 1, "the line appears once");
    assert_eq!(wire_log(&b, &id), [("event".into(), "started".into(), 1), ("state".into(), "running".into(), 1)]);
}

#[test]
fn u3_u9_unreachable_broker_then_repeats_resend_once() {
    let td = TestDir::new("u3");
    let port = free_port();
    let id = new_job(&td, port, &[]);
    let started = Instant::now();
    let r = publish(&td, port, &id, "completed", &[]);
    r.expect_rc(3);
    assert!(started.elapsed() >= Duration::from_secs(3), "1 s and 2 s between three attempts");
    assert_eq!(r.stdout(), "");
    let err = r.stderr();
    assert_eq!(err.matches("WARNING: publish attempt").count(), 2, "{err}");
    assert!(
        err.contains(&format!("ERROR: job {id}: completed seq=1 recorded in events.log but not published")),
        "{err}"
    );
    assert_eq!(event_lines(&td, &id).len(), 1);
    assert_eq!(record(&td, &id)["status"], "completed", "the transition was applied");
    let published: Vec<Value> = audit(&td, &id).into_iter().filter(|e| e["kind"] == "published").collect();
    assert_eq!(published.len(), 1);
    assert_eq!((published[0]["published"].as_bool(), published[0]["attempts"].as_u64()), (Some(false), Some(3)));
    assert!(published[0]["error"].as_str().unwrap().contains(&format!("127.0.0.1:{port}")));

    // U9: the broker comes back; the repeat sends the same bytes with the same seq, once.
    let b = embedded_at(port);
    let r = publish(&td, port, &id, "completed", &[]);
    assert_eq!(r.expect_rc(0).stdout(), "already completed; nothing new to publish\n");
    let got = on_topic(&b, &format!("mam/jobs/{id}/events"));
    assert_eq!(got.len(), 1);
    assert_eq!(serde_json::to_string(&got[0]).unwrap().len(), event_lines(&td, &id)[0].len());
    assert_eq!(got[0], serde_json::from_str::<Value>(&event_lines(&td, &id)[0]).unwrap(), "the same payload");
    assert_eq!(wire_log(&b, &id).last().unwrap(), &("state".into(), "completed".into(), 1));
    let n = b.received().len();
    let r = publish(&td, port, &id, "completed", &[]);
    assert_eq!(r.expect_rc(0).stdout(), "already completed; nothing new to publish\n");
    assert_eq!(b.received().len(), n, "the third repeat sends nothing");
    assert_eq!(event_lines(&td, &id).len(), 1);
    assert_eq!(record(&td, &id)["last_seq"], 1, "repeats allocate no seq");
}

#[test]
fn u4_no_state_leaves_the_retained_state() {
    let td = TestDir::new("u4");
    let b = embedded();
    let port = b.addr().port();
    let id = new_job(&td, port, &[]);
    publish(&td, port, &id, "started", &[]).expect_rc(0);
    let before = b.retained(&format!("mam/jobs/{id}/state")).unwrap();
    let r = publish(&td, port, &id, "progress", &["--no-state", "--message", "half way"]);
    assert_eq!(r.expect_rc(0).stdout(), format!("published progress seq=2 job={id}\n"));
    assert_eq!(b.retained(&format!("mam/jobs/{id}/state")).unwrap(), before);
    let log = wire_log(&b, &id);
    assert_eq!(log.last().unwrap(), &("event".into(), "progress".into(), 2));
    assert_eq!(log.iter().filter(|(k, _, _)| k == "state").count(), 1);
    let published = audit(&td, &id).into_iter().rfind(|e| e["kind"] == "published").unwrap();
    assert_eq!(published["state_published"], false);
}

#[test]
fn u5_terminal_with_heartbeat_is_usage_and_changes_nothing() {
    let td = TestDir::new("u5");
    let port = free_port();
    let id = new_job(&td, port, &[]);
    let before = (tree(&td.ws()), record_bytes(&td, &id));
    let r = publish(&td, port, &id, "completed", &["--heartbeat", "5"]);
    r.expect_rc(2);
    assert_eq!(r.stderr(), "ERROR: publish: --heartbeat cannot be used with a terminal event (completed)\n");
    assert_eq!((tree(&td.ws()), record_bytes(&td, &id)), before);
    publish(&td, port, &id, "progress", &["--watch-pid", "1"]).expect_rc(2);
    assert_eq!((tree(&td.ws()), record_bytes(&td, &id)), before);
}

#[test]
fn u6_twenty_concurrent_progress_publishes_get_contiguous_seqs() {
    let td = TestDir::new("u6");
    let b = embedded();
    let port = b.addr().port();
    let id = new_job(&td, port, &[]);
    publish(&td, port, &id, "started", &[]).expect_rc(0);
    let procs: Vec<Bg> = (0..20)
        .map(|i| {
            Bg::spawn(mam_at(&td, port).args([
                "publish",
                "--job-id",
                &id,
                "--event",
                "progress",
                "--message",
                &format!("p{i}"),
            ]))
        })
        .collect();
    let mut seqs = Vec::new();
    for p in procs {
        let (rc, out, err) = p.finish(Duration::from_secs(60));
        assert_eq!(rc, 0, "{err}");
        let seq = out.trim().split("seq=").nth(1).unwrap().split(' ').next().unwrap().parse::<u64>().unwrap();
        seqs.push(seq);
    }
    seqs.sort();
    assert_eq!(seqs, (2..=21).collect::<Vec<u64>>());
    let mut disk: Vec<u64> = events(&td, &id).iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    disk.sort();
    assert_eq!(disk, (1..=21).collect::<Vec<u64>>());
    assert_eq!(on_topic(&b, &format!("mam/jobs/{id}/events")).len(), 21);
    assert_eq!(record(&td, &id)["last_seq"], 21);
}

#[test]
fn u7_no_running_after_terminal_when_a_progress_is_held_at_connack() {
    let td = TestDir::new("u7");
    let b = embedded();
    let port = b.addr().port();
    let id = new_job(&td, port, &[]);
    publish(&td, port, &id, "started", &[]).expect_rc(0);
    // Hold every publisher, then only the progress one once its CONNECT is in.
    b.stall_connack("mam-pub-");
    let mut prog = Bg::spawn(mam_at(&td, port).args(["publish", "--job-id", &id, "--event", "progress"]));
    let held = format!("mam-pub-{}-", prog.pid());
    wait_until("the progress CONNECT", Duration::from_secs(10), || b.connects().iter().any(|c| c.starts_with(&held)));
    b.stall_connack(&held);
    b.release_connack("mam-pub-");
    let mut term = Bg::spawn(mam_at(&td, port).args(["publish", "--job-id", &id, "--event", "completed"]));
    wait_until("the barrier", Duration::from_secs(10), || record(&td, &id)["barrier_attempt"] == 1);
    assert!(term.running() && prog.running(), "the terminal waits for the in-flight progress (L3)");
    assert_eq!(record(&td, &id)["status"], "running", "no terminal seq while a progress is in flight");
    b.release_connack(&held);
    let (rc, out, err) = prog.finish(Duration::from_secs(30));
    assert_eq!((rc, out.trim()), (0, format!("published progress seq=2 job={id}").as_str()), "{err}");
    assert!(err.contains("WARNING: state not published: attempt ended"), "{err}");
    let (rc, out, err) = term.finish(Duration::from_secs(30));
    assert_eq!((rc, out.trim()), (0, format!("published completed seq=3 job={id}").as_str()), "{err}");
    let st: Value = serde_json::from_slice(&b.retained(&format!("mam/jobs/{id}/state")).unwrap()).unwrap();
    assert_eq!((st["status"].as_str(), st["seq"].as_u64()), (Some("completed"), Some(3)));
    assert_nothing_running_after_terminal(&wire_log(&b, &id), "completed");
    let disk: Vec<String> = events(&td, &id).iter().map(|e| e["event"].as_str().unwrap().to_string()).collect();
    assert_eq!(disk, ["started", "progress", "completed"]);
}

#[test]
fn u8_one_connect_for_an_event_and_its_state() {
    let td = TestDir::new("u8");
    let b = embedded();
    let port = b.addr().port();
    let id = new_job(&td, port, &[]);
    publish(&td, port, &id, "started", &[]).expect_rc(0);
    let n = b.connect_count();
    publish(&td, port, &id, "progress", &[]).expect_rc(0);
    assert_eq!(b.connect_count(), n + 1);
    assert_eq!(b.received().len(), 4, "two events and two states");
}

#[test]
fn u10_bad_event_is_usage_and_a_changed_byte_fails_verification() {
    let td = TestDir::new("u10");
    let b = embedded();
    let port = b.addr().port();
    let id = new_job(&td, port, &[]);
    let r = publish(&td, port, &id, "finished", &[]);
    r.expect_rc(2);
    assert_eq!(
        r.stderr(),
        "ERROR: --event: invalid event 'finished' (expected one of: started, progress, completed, failed, error)\n"
    );
    assert!(!registry(&td).join(&id).exists());
    publish(&td, port, &id, "started", &["--message", "ok"]).expect_rc(0);
    let k = key(&td, &id);
    let (_, payload, _) = b.received().into_iter().next().unwrap();
    assert!(mam::sign::verify(k.as_bytes(), &serde_json::from_slice(&payload).unwrap()));
    let mut tampered = payload.clone();
    let at = payload.windows(4).position(|w| w == b"\"ok\"").unwrap() + 1;
    tampered[at] = b'O';
    let v: Value = serde_json::from_slice(&tampered).unwrap();
    assert!(!mam::sign::verify(k.as_bytes(), &v));
}

#[test]
fn bad_input_lines_and_nothing_half_written() {
    let td = TestDir::new("pub-bad");
    let port = free_port();
    let id = new_job(&td, port, &[]);
    let snapshot = || (tree(&td.ws()), record_bytes(&td, &id));
    let before = snapshot();
    let cases: &[(&[&str], &str)] = &[
        (&["--data", "[1,2]"], "ERROR: --data: must be a JSON object\n"),
        (&["--data", "{nope"], ""),
        (&["--message", &"m".repeat(4097)], "ERROR: --message: 4097 bytes is more than 4096\n"),
    ];
    for (extra, line) in cases {
        let r = publish(&td, port, &id, "progress", extra);
        r.expect_rc(2);
        if !line.is_empty() {
            assert_eq!(r.stderr(), *line);
        }
        assert_eq!(snapshot(), before, "{extra:?}");
    }
    let big = format!("{{\"a\":\"{}\"}}", "x".repeat(65 * 1024));
    let r = publish(&td, port, &id, "progress", &["--data", &big]);
    r.expect_rc(2);
    assert_eq!(r.stderr(), format!("ERROR: --data: {} bytes is more than 65536\n", big.len()));
    assert_eq!(snapshot(), before);

    // Wrong dispatch token: refused by pre-check 5, nothing on disk but the refusal's audit line.
    let r = publish(&td, port, &id, "started", &["--dispatch-token", &rand_hex(16)]);
    r.expect_rc(4);
    assert_eq!(r.stderr(), format!("REFUSED: {id}: stale_attempt: this signal belongs to an earlier attempt or another dispatch (attempt or token differ); the record is unchanged\n"));
    assert_eq!(record_bytes(&td, &id), before.1);
    assert!(event_lines(&td, &id).is_empty());
    assert_eq!(audit(&td, &id).last().unwrap()["reason"], "stale_attempt");

    // Missing record: rc 1, nothing created.
    let r = publish(&td, port, "nosuchjob", "started", &[]);
    r.expect_rc(1);
    assert_eq!(r.stderr(), format!("ERROR: unknown job 'nosuchjob' (no record in {})\n", registry(&td).display()));
    assert!(!registry(&td).join("nosuchjob").exists());

    // events.log is a directory: rc 1 before any decision, for a non-terminal and a terminal.
    let id2 = new_job(&td, port, &[]);
    fs::create_dir_all(registry(&td).join(&id2).join("events.log")).unwrap();
    let rec2 = record_bytes(&td, &id2);
    for ev in ["started", "completed"] {
        let r = publish(&td, port, &id2, ev, &[]);
        r.expect_rc(1);
        let path = registry(&td).join(&id2).join("events.log");
        assert!(
            r.stderr().starts_with(&format!("ERROR: {}: cannot open events.log for appending (", path.display())),
            "{}",
            r.stderr()
        );
        assert_eq!(r.stderr().lines().count(), 1);
        assert_eq!(record_bytes(&td, &id2), rec2, "{ev}: the record is untouched");
    }
}

/// A command running as uid 65534 when the suite runs as root (A31), or None when the test tree or
/// the binary is not reachable for that user.
pub(crate) fn as_nobody(td: &TestDir) -> Option<Cmd> {
    let bin = mam_bin();
    let dirs = std::iter::successors(Some(td.root.as_path()), |p| p.parent())
        .chain(std::iter::successors(bin.parent(), |p| p.parent()));
    for dir in dirs {
        if fs::metadata(dir).unwrap().permissions().mode() & 0o001 == 0 {
            eprintln!("skipped: {} is not searchable by others", dir.display());
            return None;
        }
    }
    Some(td.command("setpriv").args(["--reuid=65534", "--regid=65534", "--clear-groups"]).args([bin]))
}

#[test]
fn read_only_registry_is_rc1_with_nothing_written() {
    let td = TestDir::new("pub-ro");
    let port = free_port();
    let id = new_job(&td, port, &[]);
    let reg = registry(&td);
    let root = mam::sys::getuid() == 0;
    if root && !have_tool("setpriv", "MAM_REQUIRE_SETPRIV") {
        return;
    }
    if root {
        // The registry belongs to nobody, who may read but not write it.
        let st = Command::new("chown").args(["-R", "65534:65534"]).arg(td.ws().join(".mam")).status().unwrap();
        assert!(st.success());
    }
    fs::set_permissions(reg.join(format!("{id}.json")), fs::Permissions::from_mode(0o400)).unwrap();
    fs::set_permissions(&reg, fs::Permissions::from_mode(0o500)).unwrap();
    let before = (tree(&td.ws()), record_bytes(&td, &id));
    for ev in ["started", "completed"] {
        let cmd = if root {
            let Some(c) = as_nobody(&td) else { return };
            c
        } else {
            td.mam()
        };
        let r = cmd.env("MQTT_PORT", port.to_string()).args(["publish", "--job-id", &id, "--event", ev]).run();
        r.expect_rc(1);
        let err = r.stderr();
        assert!(err.starts_with("ERROR: ") && err.lines().count() == 1, "{err}");
        assert!(err.contains("Permission denied"), "{err}");
        assert_eq!((tree(&td.ws()), record_bytes(&td, &id)), before, "{ev}: nothing written");
    }
    fs::set_permissions(&reg, fs::Permissions::from_mode(0o700)).unwrap();
}

#[test]
fn x3_late_started_after_completed_is_refused_and_sends_nothing() {
    let td = TestDir::new("pub-x3");
    let b = embedded();
    let port = b.addr().port();
    let id = new_job(&td, port, &[]);
    publish(&td, port, &id, "started", &[]).expect_rc(0);
    publish(&td, port, &id, "completed", &[]).expect_rc(0);
    let n = b.received().len();
    for ev in ["started", "progress"] {
        let r = publish(&td, port, &id, ev, &[]);
        r.expect_rc(4);
        assert_eq!(r.stderr(), format!("REFUSED: {id}: late_signal: the job has already finished, so this signal came too late; the record is unchanged\n"));
    }
    assert_eq!(b.received().len(), n);
    let r = publish(&td, port, &id, "failed", &[]);
    r.expect_rc(4);
    assert_eq!(r.stderr(), format!("REFUSED: {id}: conflicting_terminal: the job has already finished with another result; the record is unchanged\n"));
    let st: Value = serde_json::from_slice(&b.retained(&format!("mam/jobs/{id}/state")).unwrap()).unwrap();
    assert_eq!(st["status"], "completed");
    assert_eq!(events(&td, &id).len(), 2);
}

#[test]
fn a4_operator_close_publishes_a_signed_closed_state() {
    let td = TestDir::new("pub-a4");
    let b = embedded();
    let port = b.addr().port();
    let id = new_job(&td, port, &[]);
    publish(&td, port, &id, "started", &[]).expect_rc(0);
    let r = mam_at(&td, port).args(["registry", "status", &id, "--set", "cancelled", "--reason", "operator"]).run();
    assert_eq!(r.expect_rc(0).stdout(), format!("{id} running -> cancelled\n"));
    assert_eq!(r.stderr(), "");
    let rec = record(&td, &id);
    assert_eq!(rec["last_seq"], 2, "the close allocated a fresh seq");
    let st: Value = serde_json::from_slice(&b.retained(&format!("mam/jobs/{id}/state")).unwrap()).unwrap();
    assert!(mam::sign::verify(key(&td, &id).as_bytes(), &st));
    assert_eq!(
        (st["status"].as_str(), st["last_event"].as_str(), st["seq"].as_u64()),
        (Some("cancelled"), Some("closed"), Some(2))
    );
    assert_eq!(on_topic(&b, &format!("mam/jobs/{id}/events")).len(), 1, "no event for a close");
    assert_eq!(events(&td, &id).len(), 1);

    // --no-publish: nothing on the wire, no seq.
    let id2 = new_job(&td, port, &[]);
    let n = b.received().len();
    mam_at(&td, port).args(["registry", "finalize", &id2, "--status", "failed", "--no-publish"]).run().expect_rc(0);
    assert_eq!(b.received().len(), n);
    assert_eq!(record(&td, &id2)["last_seq"], 0);

    // A broker that is down: a WARNING, and the exit code stays 0.
    let id3 = new_job(&td, free_port(), &[]);
    let r =
        td.mam().env("MAM_PUBLISH_BUDGET_S", "1").args(["registry", "status", &id3, "--set", "agent_blocked"]).run();
    r.expect_rc(0);
    assert!(r.stderr().contains(&format!("WARNING: job {id3}: close state not published (")), "{}", r.stderr());
    assert_eq!(record(&td, &id3)["status"], "agent_blocked");
}

#[test]
fn shim_publish_event_execs_mam_publish() {
    let td = TestDir::new("pub-shim");
    let shim = concat!(env!("CARGO_MANIFEST_DIR"), "/shims/publish_event");
    let r = td.command(shim).env("MAM_BIN", mam_bin()).args(["--help"]).run();
    assert!(r.expect_rc(0).stdout().starts_with("Usage: mam publish"));
    let r = td.command(shim).env("MAM_BIN", mam_bin()).args(["--job-id", "x", "--event", "nope"]).run();
    r.expect_rc(2);
    let shim = concat!(env!("CARGO_MANIFEST_DIR"), "/shims/heartbeat");
    let r = td.command(shim).env("MAM_BIN", mam_bin()).args(["status", "--job-id", "x"]).run();
    assert_eq!(r.expect_rc(0).stdout(), "none\n");
}

#[test]
fn a8_wire_budget_bounds_a_non_terminal_publish() {
    let td = TestDir::new("pub-a8");
    let b = embedded();
    let port = b.addr().port();
    let id = new_job(&td, port, &[]);
    b.stall_connack("mam-pub-");
    let t = Instant::now();
    let r = mam_at(&td, port)
        .env("MAM_PUBLISH_BUDGET_S", "2")
        .env("MAM_MQTT_CONNECT_TIMEOUT_S", "30")
        .args(["publish", "--job-id", &id, "--event", "started"])
        .run();
    let took = t.elapsed();
    r.expect_rc(3);
    assert!(took >= Duration::from_secs(2) && took < Duration::from_secs(5), "{took:?}");
    assert!(r.stderr().contains("wire budget of 2s (MAM_PUBLISH_BUDGET_S) exhausted"), "{}", r.stderr());
    assert_eq!(event_lines(&td, &id).len(), 1, "the record and the line stay");
    assert_eq!(record(&td, &id)["status"], "running");
    b.release_connack("mam-pub-");
}

/// Issue 20: a confirmed publish whose look found every earlier event confirmed records how far
/// events.log is confirmed (`clean_to`), so the next look reads only what follows; after an outage
/// the failed event is still replayed once, and only the publish after that is clean again.
#[test]
fn a_clean_publish_records_how_far_events_log_is_confirmed_and_an_outage_still_replays() {
    let td = TestDir::new("clean_to");
    let port = free_port();
    let b = embedded_at(port);
    let id = new_job(&td, port, &[]);
    let events_len = || fs::metadata(registry(&td).join(&id).join("events.log")).unwrap().len();
    let last_published = || audit(&td, &id).into_iter().rfind(|e| e["kind"] == "published").unwrap();
    publish(&td, port, &id, "started", &[]).expect_rc(0);
    for _ in 0..3 {
        publish(&td, port, &id, "progress", &[]).expect_rc(0);
        let e = last_published();
        assert_eq!(e["clean_to"].as_u64(), Some(events_len()), "{e}");
    }
    b.shutdown();
    let in_outage = || {
        let c = mam_at(&td, port).env("MAM_PUBLISH_BUDGET_S", "1");
        c.args(["publish", "--job-id", &id, "--event", "progress"]).run().expect_rc(3);
    };
    in_outage();
    let failed = last_published();
    assert_eq!((failed["seq"].as_u64(), failed["published"].as_bool()), (Some(5), Some(false)));
    assert!(failed.get("clean_to").is_none(), "{failed}");
    let b = embedded_at(port);
    let r = publish(&td, port, &id, "progress", &[]);
    assert!(r.expect_rc(0).stderr().contains("sent 1 earlier event(s) the wire had missed"), "{}", r.stderr());
    assert!(last_published().get("clean_to").is_none(), "the look that found seq 5 unsent is not clean");
    publish(&td, port, &id, "progress", &[]).expect_rc(0);
    assert_eq!(last_published()["clean_to"].as_u64(), Some(events_len()));
    let seqs: Vec<u64> =
        on_topic(&b, &format!("mam/jobs/{id}/events")).iter().filter_map(|v| v["seq"].as_u64()).collect();
    assert_eq!(seqs, [5, 6, 7], "the replayed event once, then the new ones, in order");
    // And a look from that floor still finds an event left unsent after it.
    b.shutdown();
    in_outage();
    let b = embedded_at(port);
    publish(&td, port, &id, "progress", &[]).expect_rc(0);
    let seqs: Vec<u64> =
        on_topic(&b, &format!("mam/jobs/{id}/events")).iter().filter_map(|v| v["seq"].as_u64()).collect();
    assert_eq!(seqs, [8, 9]);
}
