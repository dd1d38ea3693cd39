//! Integration tests: the job registry and the transition engine (CORE 4, 5; A2, A4, A5).
//! Operator requests go through `mam registry` as a process; agent requests (claim, progress,
//! barrier, terminal) go through `registry::store::Store::apply` in-process until `mam publish`
//! exists.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use mam::registry::engine::{Authority, Kind, Request};
use mam::registry::store::{Decided, Store};
use serde_json::Value;

use crate::support::{mam_bin, rand_hex, tree, wait_exit, TestDir};

fn registry(td: &TestDir) -> PathBuf {
    td.ws().join(".mam/jobs")
}

fn logs(td: &TestDir) -> PathBuf {
    td.ws().join(".mam/delegate_job_logs")
}

fn store(td: &TestDir) -> Store {
    Store::new(registry(td), logs(td))
}

fn record(td: &TestDir, id: &str) -> Value {
    let bytes = fs::read(registry(td).join(format!("{id}.json"))).unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

fn record_bytes(td: &TestDir, id: &str) -> Vec<u8> {
    fs::read(registry(td).join(format!("{id}.json"))).unwrap()
}

fn audit(td: &TestDir, id: &str) -> Vec<Value> {
    let text = fs::read_to_string(logs(td).join(id).join("audit.jsonl")).unwrap_or_default();
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn audit_kinds(td: &TestDir, id: &str) -> Vec<String> {
    audit(td, id).iter().map(|e| e["kind"].as_str().unwrap().to_string()).collect()
}

/// `mam registry register --session w1 --job-id <id> [extra]`, rc 0.
fn register(td: &TestDir, id: &str, extra: &[&str]) {
    td.mam().args(["registry", "register", "--session", "w1", "--job-id", id]).args(extra).run().expect_rc(0);
}

fn agent(kind: Kind, id: &str) -> Request {
    Request::new(kind, Authority::Agent, id)
}

fn now() -> u64 {
    mam::clock::now_ms()
}

fn show(d: &Decided) -> String {
    match d {
        Decided::Applied(a) => format!("applied {}->{}", a.from.as_deref().unwrap_or("none"), a.to),
        Decided::Idempotent { status } => format!("idempotent {status}"),
        Decided::Refused { reason } => format!("refused {reason}"),
    }
}

const FIELDS_4_1: &[&str] = &[
    "schema",
    "job_id",
    "type",
    "attempt",
    "iteration",
    "dispatch_token",
    "auth_token",
    "agent_session",
    "transport",
    "status",
    "reason",
    "heartbeat_sec",
    "heartbeat_misses",
    "ack_timeout_sec",
    "idle_timeout_sec",
    "idle_timeout_explicit",
    "timeout_sec",
    "deadline_at",
    "broker",
    "topic_prefix",
    "created_at",
    "updated_at",
    "dispatched_at",
    "claimed_at",
    "finished_at",
    "last_seq",
    "last_event",
    "last_event_at",
    "heartbeat_at",
    "barrier_attempt",
    "transition_seq",
    "brief_path",
    "report_path",
    "parent_job_id",
    "orchestrator_uuid",
];

#[test]
fn r1_bare_register_has_every_field() {
    let td = TestDir::new("r1");
    let r = td.mam().args(["registry", "register", "--session", "w1"]).run();
    r.expect_rc(0);
    let id = r.stdout().trim().to_string();
    assert!(mam::clock::valid_job_id(&id) && id.len() == 8, "{id}");
    let rec = record(&td, &id);
    for f in FIELDS_4_1 {
        assert!(rec.get(f).is_some(), "missing {f}: {rec}");
    }
    assert_eq!(rec["status"], "pending");
    assert_eq!((rec["attempt"].as_u64(), rec["iteration"].as_u64()), (Some(1), Some(1)));
    assert_eq!((rec["idle_timeout_sec"].as_u64(), &rec["idle_timeout_explicit"]), (Some(120), &Value::Bool(false)));
    assert_eq!(rec["type"], "task");
    assert_eq!(rec["transport"], "local");
    assert_eq!(rec["ack_timeout_sec"], 300);
    assert_eq!(rec["topic_prefix"], format!("mam/jobs/{id}"));
    assert_eq!(
        rec["broker"],
        serde_json::json!({"host":"127.0.0.1","port":1883,"tls":false,"username":null,"ca_file":null,"topic_root":"mam"})
    );
    assert_eq!(rec["dispatch_token"].as_str().unwrap().len(), 32);
    assert_eq!(rec["auth_token"].as_str().unwrap().len(), 64);
    assert_eq!(rec["deadline_at"], Value::Null);
    assert_eq!(rec["transition_seq"], 1);

    let r = td.mam().args(["registry", "register", "--session", "w1", "--idle-timeout", "50"]).run();
    let rec = record(&td, r.expect_rc(0).stdout().trim());
    assert_eq!((rec["idle_timeout_sec"].as_u64(), &rec["idle_timeout_explicit"]), (Some(50), &Value::Bool(true)));

    let r = td
        .mam()
        .args(["registry", "register", "--session", "w1"])
        .env("MAM_HEARTBEAT_SEC", "10")
        .env("MAM_HEARTBEAT_MISSES", "3")
        .run();
    let rec = record(&td, r.expect_rc(0).stdout().trim());
    assert_eq!((rec["heartbeat_sec"].as_u64(), rec["idle_timeout_sec"].as_u64()), (Some(10), Some(30)));

    // Flags win over env; A5 fields; timeout gives a deadline; paths become absolute.
    let r = td
        .mam()
        .args(["registry", "register", "--session", "w2", "--job-id", "child1", "--type", "loop"])
        .args(["--heartbeat-sec", "5", "--heartbeat-misses", "2", "--ack-timeout", "7", "--timeout", "60"])
        .args(["--parent", "boss1", "--orchestrator", "0f6c-uuid", "--brief-path", "b.md"])
        .env("MAM_HEARTBEAT_SEC", "10")
        .env("MQTT_TLS", "on")
        .env("MQTT_TOPIC_ROOT", "root2")
        .run();
    r.expect_rc(0);
    let rec = record(&td, "child1");
    assert_eq!(rec["type"], "loop");
    assert_eq!((rec["heartbeat_sec"].as_u64(), rec["idle_timeout_sec"].as_u64()), (Some(5), Some(10)));
    assert_eq!(rec["ack_timeout_sec"], 7);
    assert_eq!((rec["parent_job_id"].as_str(), rec["orchestrator_uuid"].as_str()), (Some("boss1"), Some("0f6c-uuid")));
    let deadline = mam::clock::parse_ts(rec["deadline_at"].as_str().unwrap()).unwrap();
    let dispatched = mam::clock::parse_ts(rec["dispatched_at"].as_str().unwrap()).unwrap();
    assert_eq!(deadline - dispatched, 60_000);
    assert_eq!(rec["brief_path"], td.ws().join("b.md").to_string_lossy().as_ref());
    assert_eq!((rec["broker"]["port"].as_u64(), &rec["broker"]["tls"]), (Some(8883), &Value::Bool(true)));
    assert_eq!(rec["topic_prefix"], "root2/jobs/child1");

    // An existing id is refused with rc 4 and audited.
    let r = td.mam().args(["registry", "register", "--session", "w1", "--job-id", "child1"]).run();
    r.expect_rc(4);
    assert_eq!(
        r.stderr(),
        "REFUSED: child1: exists: a job with this id is already registered; the record is unchanged\n"
    );
    assert_eq!(audit_kinds(&td, "child1"), ["registered", "refused"]);
}

#[test]
fn r2_reader_sees_whole_records_while_20_writers_write() {
    let td = TestDir::new("r2");
    register(&td, "r2job", &[]);
    let path = registry(&td).join("r2job.json");
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicUsize::new(0));
    let reader = {
        let (stop, reads, path) = (stop.clone(), reads.clone(), path.clone());
        std::thread::spawn(move || {
            // At least 1000 reads, and keep reading until the writers are done.
            while reads.load(Ordering::SeqCst) < 1000 || !stop.load(Ordering::SeqCst) {
                let bytes = fs::read(&path).unwrap();
                let v: Value = serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("partial read ({e})"));
                assert_eq!(v["job_id"], "r2job");
                reads.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    let writers: Vec<_> = (0..20)
        .map(|i| {
            td.mam()
                .args(["registry", "set-meta", "r2job", &format!("w{i}:={i}")])
                .cmd
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut w in writers {
        assert!(w.wait().unwrap().success());
    }
    stop.store(true, Ordering::SeqCst);
    reader.join().unwrap();
    assert!(reads.load(Ordering::SeqCst) >= 1000);
    let rec = record(&td, "r2job");
    for i in 0..20 {
        assert_eq!(rec[format!("w{i}")], i, "writer {i} lost");
    }
    assert_eq!(rec["transition_seq"], 21);
    let temps: Vec<String> = tree(&td.ws()).into_iter().filter(|p| p.ends_with(".tmp")).collect();
    assert!(temps.is_empty(), "{temps:?}");
}

#[test]
fn r3_scrub_selects_only_a_stored_non_empty_password() {
    let td = TestDir::new("r3");
    for (id, pw) in [("pwx", "\"x\""), ("pwnull", "null"), ("pwempty", "\"\"")] {
        register(&td, id, &[]);
        let p = registry(&td).join(format!("{id}.json"));
        let text = fs::read_to_string(&p).unwrap();
        let text =
            text.replace("\"topic_root\": \"mam\"", &format!("\"topic_root\": \"mam\",\n    \"password\": {pw}"));
        fs::write(&p, text).unwrap();
    }
    let snapshot = |id: &str| {
        let p = registry(&td).join(format!("{id}.json"));
        (fs::read(&p).unwrap(), fs::metadata(&p).unwrap().modified().unwrap())
    };
    let before: Vec<_> = ["pwx", "pwnull", "pwempty"].iter().map(|id| snapshot(id)).collect();

    let r = td.mam().args(["registry", "scrub-secrets", "--dry-run"]).run();
    r.expect_rc(0);
    assert_eq!(r.stdout(), "would scrub 1 record(s)\n  pwx\n");
    let after: Vec<_> = ["pwx", "pwnull", "pwempty"].iter().map(|id| snapshot(id)).collect();
    assert_eq!(before, after, "dry run wrote");

    let r = td.mam().args(["registry", "scrub-secrets"]).run();
    r.expect_rc(0);
    assert_eq!(r.stdout(), "scrubbed 1 record(s)\n");
    assert!(!String::from_utf8(snapshot("pwx").0).unwrap().contains("password"));
    assert_eq!(snapshot("pwnull"), before[1]);
    assert_eq!(snapshot("pwempty"), before[2]);
    assert!(audit_kinds(&td, "pwx").contains(&"scrubbed".to_string()));
    let r = td.mam().args(["registry", "scrub-secrets", "--dry-run"]).run();
    assert_eq!(r.stdout(), "would scrub 0 record(s)\n");
}

#[test]
fn r4_engine_write_drops_a_null_password() {
    let td = TestDir::new("r4");
    register(&td, "r4job", &[]);
    let p = registry(&td).join("r4job.json");
    let text = fs::read_to_string(&p)
        .unwrap()
        .replace("\"topic_root\": \"mam\"", "\"topic_root\": \"mam\", \"password\": null");
    fs::write(&p, text).unwrap();
    td.mam().args(["registry", "status", "r4job", "--set", "running"]).run().expect_rc(0);
    let text = fs::read_to_string(&p).unwrap();
    assert!(!text.contains("password"), "{text}");
    assert!(text.starts_with("{\n  \"schema\": 1,\n") && text.ends_with("}\n"), "2-space indent, trailing newline");
}

#[test]
fn r5_invalid_status_leaves_the_record_byte_identical() {
    let td = TestDir::new("r5");
    register(&td, "r5job", &[]);
    let before = record_bytes(&td, "r5job");
    for cas in ["1", "0"] {
        let r = td.mam().args(["registry", "status", "r5job", "--set", "bogus"]).env("MAM_ENGINE_CAS", cas).run();
        r.expect_rc(1);
        assert_eq!(
            r.stderr(),
            "ERROR: invalid status 'bogus' (expected one of: pending, running, completed, failed, error, cancelled, \
             agent_blocked, deadline_timeout, wall_clock_timeout, broker_unavailable)\n"
        );
        assert_eq!(record_bytes(&td, "r5job"), before);
    }
    td.mam().args(["registry", "finalize", "r5job", "--status", "bogus"]).run().expect_rc(1);
    td.mam().args(["registry", "list", "--status", "bogus"]).run().expect_rc(1);
    assert_eq!(record_bytes(&td, "r5job"), before);
    assert_eq!(audit_kinds(&td, "r5job"), ["registered"], "invalid requests write no audit");
}

#[test]
fn r6_set_completed_twice_is_rc0_already() {
    let td = TestDir::new("r6");
    register(&td, "r6job", &[]);
    // --no-publish throughout: no broker here, and the A4 close state is tested in publish.rs.
    let r = td.mam().args(["registry", "status", "r6job", "--set", "completed", "--no-publish"]).run();
    assert_eq!(r.expect_rc(0).stdout(), "r6job pending -> completed\n");
    let r = td.mam().args(["registry", "status", "r6job", "--set", "completed"]).run();
    assert_eq!(r.expect_rc(0).stdout(), "r6job already completed\n");
    let r = td.mam().args(["registry", "status", "r6job", "--set", "failed", "--reason", "x"]).run();
    r.expect_rc(4);
    assert_eq!(r.stderr(), "REFUSED: r6job: cannot set failed over completed (terminal_locked: a finished job keeps its result); the record is unchanged\n");
    let r = td.mam().args(["registry", "status", "r6job"]).run();
    assert_eq!(r.expect_rc(0).stdout(), "completed\n");
    assert_eq!(audit_kinds(&td, "r6job"), ["registered", "transition", "idempotent", "refused"]);
}

#[test]
fn r7_submit_loop_redispatches_and_refuses_the_same_iteration() {
    let td = TestDir::new("r7");
    let r = td.mam().args(["registry", "submit", "--type", "loop", "--session", "w1", "--job-id", "r7job"]).run();
    assert_eq!(r.expect_rc(0).stdout(), "r7job attempt=1 iteration=1\n");
    td.mam().args(["registry", "status", "r7job", "--set", "completed", "--no-publish"]).run().expect_rc(0);
    let old = record(&td, "r7job");
    let r = td
        .mam()
        .args(["registry", "submit", "--type", "loop", "--session", "w1", "--job-id", "r7job", "--iteration", "2"])
        .run();
    assert_eq!(r.expect_rc(0).stdout(), "r7job attempt=2 iteration=2\n");
    let new = record(&td, "r7job");
    assert_eq!(new["status"], "pending");
    assert_ne!(new["dispatch_token"], old["dispatch_token"]);
    assert_ne!(new["auth_token"], old["auth_token"]);
    assert_eq!(new["finished_at"], Value::Null);
    let r = td
        .mam()
        .args(["registry", "submit", "--type", "loop", "--session", "w1", "--job-id", "r7job", "--iteration", "2"])
        .run();
    r.expect_rc(4);
    assert_eq!(r.stderr(), "REFUSED: r7job: iteration_not_advanced: the iteration given is not newer than the job's; the record is unchanged\n");
    // Default iteration is current + 1.
    let r = td.mam().args(["registry", "submit", "--type", "loop", "--session", "w1", "--job-id", "r7job"]).run();
    assert_eq!(r.expect_rc(0).stdout(), "r7job attempt=3 iteration=3\n");
    // A type mismatch is an error, not a re-dispatch.
    td.mam().args(["registry", "submit", "--type", "task", "--session", "w1", "--job-id", "r7job"]).run().expect_rc(1);
    assert_eq!(record(&td, "r7job")["attempt"], 3);
}

#[test]
fn r8_finalize_over_completed_applies_but_agent_failed_is_refused() {
    let td = TestDir::new("r8");
    register(&td, "r8job", &[]);
    let s = store(&td);
    let d = s.apply(&agent(Kind::Terminal, "r8job").with_status("completed"), now()).unwrap().decision;
    assert_eq!(show(&d), "applied pending->completed");
    let d = s.apply(&agent(Kind::Terminal, "r8job").with_status("failed"), now()).unwrap().decision;
    assert_eq!(show(&d), "refused conflicting_terminal");
    let r = td
        .mam()
        .args(["registry", "finalize", "r8job", "--status", "failed", "--reason", "review", "--no-publish"])
        .run();
    assert_eq!(r.expect_rc(0).stdout(), "r8job completed -> failed\n");
    let rec = record(&td, "r8job");
    assert_eq!((rec["status"].as_str(), rec["reason"].as_str()), (Some("failed"), Some("review")));
    let r = td.mam().args(["registry", "finalize", "r8job", "--status", "failed", "--no-publish"]).run();
    assert_eq!(r.expect_rc(0).stdout(), "r8job already failed\n");
}

#[test]
fn x1_started_twice_is_applied_then_idempotent() {
    let td = TestDir::new("x1");
    register(&td, "x1job", &[]);
    let s = store(&td);
    let mut claim = agent(Kind::Claim, "x1job");
    claim.alloc_seq = true;
    let out = s.apply(&claim, now()).unwrap();
    let Decided::Applied(a) = &out.decision else { panic!("{:?}", out.decision) };
    assert_eq!((a.to.as_str(), a.seq), ("running", Some(1)));
    assert!(record(&td, "x1job")["claimed_at"].is_string());
    let out = s.apply(&claim, now()).unwrap();
    assert_eq!(show(&out.decision), "idempotent running");
    assert_eq!(record(&td, "x1job")["last_seq"], 1, "an idempotent repeat allocates no seq");
    assert_eq!(audit_kinds(&td, "x1job"), ["registered", "transition", "idempotent"]);
}

#[test]
fn x2_completed_then_agent_failed_is_refused_and_audited() {
    let td = TestDir::new("x2");
    register(&td, "x2job", &[]);
    let s = store(&td);
    s.apply(&agent(Kind::Terminal, "x2job").with_status("completed"), now()).unwrap();
    let out = s.apply(&agent(Kind::Terminal, "x2job").with_status("failed"), now()).unwrap();
    assert_eq!(show(&out.decision), "refused conflicting_terminal");
    let last = audit(&td, "x2job").pop().unwrap();
    assert_eq!((last["kind"].as_str(), last["reason"].as_str()), (Some("refused"), Some("conflicting_terminal")));
    assert_eq!((last["request"].as_str(), last["status"].as_str()), (Some("terminal"), Some("completed")));
    assert_eq!(record(&td, "x2job")["status"], "completed");
}

#[test]
fn x3_started_after_completed_is_a_late_signal() {
    let td = TestDir::new("x3");
    register(&td, "x3job", &[]);
    let s = store(&td);
    s.apply(&agent(Kind::Terminal, "x3job").with_status("completed"), now()).unwrap();
    let before = record_bytes(&td, "x3job");
    for kind in [Kind::Claim, Kind::Progress, Kind::Beat] {
        let out = s.apply(&agent(kind, "x3job"), now()).unwrap();
        assert_eq!(show(&out.decision), "refused late_signal");
    }
    assert_eq!(record_bytes(&td, "x3job"), before);
    let st: Value = serde_json::from_slice(&fs::read(logs(&td).join("x3job/status.json")).unwrap()).unwrap();
    assert_eq!(st["status"], "completed");
}

#[test]
fn x4_attempt_1_event_after_redispatch_is_stale() {
    let td = TestDir::new("x4");
    td.mam().args(["registry", "submit", "--type", "task", "--session", "w1", "--job-id", "x4job"]).run().expect_rc(0);
    let token1 = record(&td, "x4job")["dispatch_token"].as_str().unwrap().to_string();
    td.mam().args(["registry", "submit", "--type", "task", "--session", "w1", "--job-id", "x4job"]).run().expect_rc(0);
    let s = store(&td);
    let mut req = agent(Kind::Progress, "x4job");
    req.attempt = Some(1);
    req.dispatch_token = Some(token1);
    assert_eq!(show(&s.apply(&req, now()).unwrap().decision), "refused stale_attempt");
    let mut req = agent(Kind::Progress, "x4job");
    req.attempt = Some(2);
    req.dispatch_token = Some(record(&td, "x4job")["dispatch_token"].as_str().unwrap().to_string());
    assert_eq!(show(&s.apply(&req, now()).unwrap().decision), "applied pending->pending");
}

#[test]
fn x5_cas_fails_closed_without_attempt() {
    let td = TestDir::new("x5");
    register(&td, "x5job", &[]);
    let p = registry(&td).join("x5job.json");
    let mut v = record(&td, "x5job");
    v.as_object_mut().unwrap().shift_remove("attempt");
    fs::write(&p, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    let before = fs::read(&p).unwrap();
    let r = td.mam().args(["registry", "status", "x5job", "--set", "completed", "--expected-attempt", "1"]).run();
    r.expect_rc(4);
    assert_eq!(r.stderr(), "REFUSED: x5job: cannot set completed over pending (cas_no_attempt: the job has not been dispatched yet, so there is no attempt to match); the record is unchanged\n");
    assert_eq!(fs::read(&p).unwrap(), before);
    // And a mismatching attempt on a normal record is cas_failed.
    register(&td, "x5b", &[]);
    let r = td.mam().args(["registry", "finalize", "x5b", "--status", "cancelled", "--expected-attempt", "2"]).run();
    r.expect_rc(4);
    assert_eq!(
        r.stderr(),
        "REFUSED: x5b: cas_failed: the job's attempt is not the one given; the record is unchanged\n"
    );
}

#[test]
fn x6_status_in_fields_is_invalid() {
    let td = TestDir::new("x6");
    register(&td, "x6job", &[]);
    let before = record_bytes(&td, "x6job");
    let mut req = agent(Kind::Progress, "x6job");
    req.fields.insert("status".into(), "completed".into());
    let err = store(&td).apply(&req, now()).unwrap_err();
    assert!(err.to_string().contains("'status' is reserved"), "{err}");
    let r = td.mam().args(["registry", "set-meta", "x6job", "status=completed"]).run();
    r.expect_rc(1);
    assert_eq!(r.stderr(), "ERROR: field 'status' is reserved: only the request that owns it may set it\n");
    assert_eq!(record_bytes(&td, "x6job"), before);
}

#[test]
fn x7_unknown_request_kind_is_refused() {
    let td = TestDir::new("x7");
    register(&td, "x7job", &[]);
    let out = store(&td).apply(&agent(Kind::parse("frobnicate"), "x7job"), now()).unwrap();
    assert_eq!(show(&out.decision), "refused unknown_request");
    assert_eq!(audit(&td, "x7job").pop().unwrap()["request"], "frobnicate");
}

#[test]
fn x8_registry_lock_is_released_after_every_outcome() {
    // The lockcheck feature proves no spawn/connect/sleep under L1 (`cargo test --features
    // lockcheck`); this checks the marked lock never leaks past a request, whatever its outcome.
    let td = TestDir::new("x8");
    register(&td, "x8job", &[]);
    let s = store(&td);
    let reqs = [
        agent(Kind::Claim, "x8job"),
        agent(Kind::Claim, "x8job"),
        agent(Kind::Terminal, "x8job").with_status("bogus"),
        agent(Kind::Progress, "nosuch"),
        agent(Kind::Terminal, "x8job").with_status("completed"),
        agent(Kind::Progress, "x8job"),
    ];
    for r in &reqs {
        let _ = s.apply(r, now());
        assert!(!mam::sys::holds_registry_lock(), "{:?}", r.kind);
    }
}

#[test]
fn x9_status_mirror_never_goes_backwards() {
    let td = TestDir::new("x9");
    let l = logs(&td);
    let line = |seq: u64| {
        mam::registry::audit::entry(now(), "x9job", Some(1), "transition", serde_json::json!({"transition_seq": seq}))
    };
    let mirror = |seq: u64| serde_json::json!({"job_id":"x9job","attempt":1,"status":"running","last_event":null,"last_seq":0,"transition_seq":seq,"updated_at":"t"});
    mam::registry::audit::flush(&l, "x9job", &[line(6)], Some(&mirror(6))).unwrap();
    mam::registry::audit::flush(&l, "x9job", &[line(5)], Some(&mirror(5))).unwrap();
    let st: Value = serde_json::from_slice(&fs::read(l.join("x9job/status.json")).unwrap()).unwrap();
    assert_eq!(st["transition_seq"], 6);
    let seqs: Vec<u64> = audit(&td, "x9job").iter().map(|e| e["transition_seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, [6, 5]);
}

#[test]
fn x10_expire_before_and_after_the_deadline() {
    let td = TestDir::new("x10");
    register(&td, "x10job", &["--timeout", "3600"]);
    let r = td.mam().args(["registry", "expire", "x10job"]).run();
    r.expect_rc(4);
    assert_eq!(
        r.stderr(),
        "REFUSED: x10job: deadline_not_reached: the job's deadline has not passed yet; the record is unchanged\n"
    );
    // Move the deadline into the past (deadline_at is operator metadata, not a reserved key).
    let past = mam::clock::format_ts(now() - 1000);
    td.mam().args(["registry", "set-meta", "x10job", &format!("deadline_at={past}")]).run().expect_rc(0);
    let r = td.mam().args(["registry", "expire", "x10job", "--no-publish"]).run();
    assert_eq!(r.expect_rc(0).stdout(), "x10job pending -> deadline_timeout\n");
    let rec = record(&td, "x10job");
    assert_eq!((rec["status"].as_str(), rec["reason"].as_str()), (Some("deadline_timeout"), Some("deadline")));
    let r = td.mam().args(["registry", "expire", "x10job"]).run();
    assert_eq!(r.expect_rc(0).stdout(), "x10job already deadline_timeout\n");
}

#[test]
fn x11_two_concurrent_claims_give_one_transition_and_one_idempotent() {
    let td = TestDir::new("x11");
    register(&td, "x11job", &[]);
    let s = Arc::new(store(&td));
    let gate = Arc::new(Barrier::new(2));
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let (s, gate) = (s.clone(), gate.clone());
            std::thread::spawn(move || {
                gate.wait();
                show(&s.apply(&agent(Kind::Claim, "x11job"), now()).unwrap().decision)
            })
        })
        .collect();
    let mut got: Vec<String> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    got.sort();
    assert_eq!(got, ["applied pending->running", "idempotent running"]);
    assert_eq!(audit_kinds(&td, "x11job"), ["registered", "transition", "idempotent"]);
}

#[test]
fn a2_auth_token_is_redacted_in_every_print() {
    let td = TestDir::new("a2");
    let r = td.mam().args(["registry", "register", "--session", "w1", "--job-id", "a2job", "--json"]).run();
    let printed: Value = serde_json::from_str(&r.expect_rc(0).stdout()).unwrap();
    assert_eq!(printed["auth_token"], "<redacted>");
    let token = record(&td, "a2job")["auth_token"].as_str().unwrap().to_string();
    let show = td.mam().args(["registry", "show", "a2job"]).run();
    let list = td.mam().args(["registry", "list", "--json"]).run();
    for out in [r.stdout(), show.expect_rc(0).stdout(), list.expect_rc(0).stdout()] {
        assert!(!out.contains(&token));
        assert!(out.contains("\"auth_token\": \"<redacted>\""), "{out}");
    }
}

#[test]
fn remote_transport_needs_the_secret_and_derives_the_token() {
    let td = TestDir::new("remote");
    let r = td.mam().args(["registry", "register", "--session", "remote:box", "--transport", "remote"]).run();
    r.expect_rc(1);
    assert_eq!(r.stderr(), "ERROR: MAM_DISPATCH_SECRET is required for transport remote\n");
    assert!(!registry(&td).exists(), "nothing created");
    let secret = rand_hex(16);
    let r = td
        .mam()
        .args(["registry", "register", "--session", "remote:box", "--transport", "remote", "--job-id", "rj1"])
        .env("MAM_DISPATCH_SECRET", &secret)
        .run();
    r.expect_rc(0);
    let rec = record(&td, "rj1");
    let want = mam::registry::remote_auth_token(secret.as_bytes(), "rj1", 1, rec["dispatch_token"].as_str().unwrap());
    assert_eq!(rec["auth_token"], want.as_str());
    // A re-dispatch derives the token for attempt 2, and needs the secret too.
    let submit = ["registry", "submit", "--type", "task", "--session", "remote:box", "--job-id", "rj1"];
    td.mam().args(submit).run().expect_rc(1);
    td.mam().args(submit).env("MAM_DISPATCH_SECRET", &secret).run().expect_rc(0);
    let rec = record(&td, "rj1");
    let want = mam::registry::remote_auth_token(secret.as_bytes(), "rj1", 2, rec["dispatch_token"].as_str().unwrap());
    assert_eq!(rec["auth_token"], want.as_str());
    let all = tree(&td.root)
        .iter()
        .filter_map(|p| fs::read(td.root.join(p)).ok())
        .any(|b| String::from_utf8_lossy(&b).contains(&secret));
    assert!(!all, "the dispatch secret reached a file");
}

#[test]
fn read_only_subcommands_create_nothing() {
    let td = TestDir::new("lazy");
    let before = tree(&td.root);
    td.mam().args(["registry", "show", "nojob"]).run().expect_rc(1);
    td.mam().args(["registry", "status", "nojob"]).run().expect_rc(1);
    td.mam().args(["registry", "publish-cmd", "nojob"]).run().expect_rc(1);
    td.mam().args(["registry", "list"]).run().expect_rc(0);
    td.mam().args(["registry", "list", "--json"]).run().expect_rc(0);
    td.mam().args(["registry", "scrub-secrets", "--dry-run"]).run().expect_rc(0);
    td.mam().args(["registry", "paths"]).run().expect_rc(0);
    // Writes on an unknown job are rc 1 and create nothing either.
    let r = td.mam().args(["registry", "status", "nojob", "--set", "running"]).run();
    r.expect_rc(1);
    assert_eq!(r.stderr(), format!("ERROR: unknown job 'nojob' (no record in {})\n", registry(&td).display()));
    td.mam().args(["registry", "set-meta", "nojob", "a=b"]).run().expect_rc(1);
    assert_eq!(tree(&td.root), before);
}

#[test]
fn list_filters_sorts_and_ignores_temp_files() {
    let td = TestDir::new("list");
    register(&td, "l1", &[]);
    td.mam().args(["registry", "register", "--session", "w2", "--job-id", "l2"]).run().expect_rc(0);
    td.mam().args(["registry", "status", "l2", "--set", "running"]).run().expect_rc(0);
    fs::write(registry(&td).join(".l1.json.999999.0123456789abcdef.tmp"), "{").unwrap();
    fs::write(registry(&td).join("junk.tmp"), "{").unwrap();
    let r = td.mam().args(["registry", "list"]).run();
    let lines: Vec<Vec<String>> =
        r.expect_rc(0).stdout().lines().map(|l| l.split('\t').map(String::from).collect()).collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0][..4], ["l1", "pending", "1", "w1"]);
    assert_eq!(lines[1][..4], ["l2", "running", "1", "w2"]);
    let r = td.mam().args(["registry", "list", "--status", "running"]).run();
    assert!(r.stdout().starts_with("l2\trunning\t1\tw2\t"));
    let r = td.mam().args(["registry", "list", "--session", "w1"]).run();
    assert!(r.stdout().starts_with("l1\t") && r.stdout().lines().count() == 1);
}

/// Issue 20: a registry larger than one chunk of the threaded scan (256 records) lists every
/// record once, sorted by created_at then id whichever thread read it, `--json` streams the same
/// records in the same order, and a corrupt record among them is one warning.
#[test]
fn list_over_more_records_than_one_scan_chunk_is_whole_and_sorted() {
    let td = TestDir::new("list-many");
    register(&td, "tmpl", &[]);
    let tmpl = record(&td, "tmpl");
    fs::remove_file(registry(&td).join("tmpl.json")).unwrap();
    let n = 700;
    let mut want = Vec::new();
    for i in 0..n {
        let mut r = tmpl.clone();
        let id = format!("m{i:04}");
        // Creation times out of id order, and some shared, so both keys matter.
        let ts = format!("2026-11-{:02}T00:00:00.000Z", 1 + (i * 7919) % 28);
        r["job_id"] = id.clone().into();
        r["created_at"] = ts.clone().into();
        r["agent_session"] = if i % 3 == 0 { "w3" } else { "w1" }.into();
        fs::write(registry(&td).join(format!("{id}.json")), serde_json::to_vec_pretty(&r).unwrap()).unwrap();
        want.push((ts, id));
    }
    fs::write(registry(&td).join("bad.json"), "{").unwrap();
    want.sort();
    let r = td.mam().args(["registry", "list"]).run();
    let got: Vec<String> = r.expect_rc(0).stdout().lines().map(|l| l.split('\t').next().unwrap().to_string()).collect();
    assert_eq!(got, want.iter().map(|(_, id)| id.clone()).collect::<Vec<_>>());
    assert_eq!(r.stderr().lines().count(), 1, "{}", r.stderr());
    assert!(r.stderr().contains("bad.json: not a valid job record"), "{}", r.stderr());
    let r = td.mam().args(["registry", "list", "--json", "--session", "w3"]).run();
    let v: Value = serde_json::from_str(&r.expect_rc(0).stdout()).unwrap();
    let ids: Vec<&str> = v.as_array().unwrap().iter().map(|x| x["job_id"].as_str().unwrap()).collect();
    let want3: Vec<&str> =
        want.iter().filter(|(_, id)| id[1..].parse::<usize>().unwrap() % 3 == 0).map(|(_, id)| id.as_str()).collect();
    assert_eq!(ids, want3);
    assert!(v.as_array().unwrap().iter().all(|x| x["auth_token"] == "<redacted>"));
    // `mam jobs` reads through the same scan: every job once, in the same order.
    let r = td.mam().args(["jobs"]).run();
    let out = r.expect_rc(0).stdout();
    assert!(out.lines().next().unwrap().contains(&format!(": {n} job(s) at ")), "{out}");
    let got: Vec<&str> = out.lines().skip(2).map(|l| l.split(' ').next().unwrap()).collect();
    assert_eq!(got, want.iter().map(|(_, id)| id.as_str()).collect::<Vec<_>>());
    assert!(r.stderr().contains("bad.json: not a valid job record; skipped"), "{}", r.stderr());
}

#[test]
fn publish_cmd_is_one_quoted_line() {
    let td = TestDir::new("pubcmd");
    let reg = td.path("a b/it's/jobs");
    let reg_s = reg.to_str().unwrap();
    td.mam()
        .args(["registry", "register", "--session", "w1", "--job-id", "pc1", "--registry-dir", reg_s])
        .run()
        .expect_rc(0);
    let r =
        td.mam().args(["registry", "publish-cmd", "pc1", "--registry-dir", reg_s]).env("MAM_BIN", "/opt/m m/mam").run();
    let rec: Value = serde_json::from_slice(&fs::read(reg.join("pc1.json")).unwrap()).unwrap();
    let q = |s: &str| mam::text::shell_quote(s);
    let logs = td.path("a b/it's/delegate_job_logs");
    let want = format!(
        "{} publish --registry-dir {} --logs-dir {} --job-id pc1 --attempt 1 --dispatch-token {} --event\n",
        q("/opt/m m/mam"),
        q(reg_s),
        q(logs.to_str().unwrap()),
        rec["dispatch_token"].as_str().unwrap()
    );
    assert_eq!(r.expect_rc(0).stdout(), want);
}

#[test]
fn bad_job_ids_are_usage_errors() {
    let td = TestDir::new("badid");
    let long = "a".repeat(200);
    for bad in ["a/b", "..", "+", "#", "a\nb", long.as_str()] {
        for args in [vec!["registry", "show", bad], vec!["registry", "register", "--session", "w1", "--job-id", bad]] {
            let r = td.mam().args(&args).run();
            r.expect_rc(2);
            assert_eq!(r.stderr().lines().count(), 1, "{:?}", r.stderr());
            assert!(r.stderr().starts_with("ERROR: "));
        }
    }
    assert!(!registry(&td).exists());
}

#[test]
fn corrupt_record_is_rc1_one_line_and_untouched() {
    let td = TestDir::new("corrupt");
    register(&td, "cj", &[]);
    let p = registry(&td).join("cj.json");
    for bad in [&b"{\"job_id\": \"cj\", \"sta"[..], b"not json at all", b"[1, 2]", b""] {
        fs::write(&p, bad).unwrap();
        for args in [
            vec!["registry", "show", "cj"],
            vec!["registry", "status", "cj"],
            vec!["registry", "status", "cj", "--set", "running"],
            vec!["registry", "set-meta", "cj", "a=b"],
        ] {
            let r = td.mam().args(&args).run();
            r.expect_rc(1);
            let err = r.stderr();
            assert_eq!(err.lines().count(), 1, "{err}");
            assert!(err.starts_with(&format!("ERROR: {}: not a valid job record (", p.display())), "{err}");
        }
        assert_eq!(fs::read(&p).unwrap(), bad);
    }
    // list skips it with a warning and still lists the others.
    register(&td, "ok1", &[]);
    let r = td.mam().args(["registry", "list"]).run();
    assert!(r.expect_rc(0).stdout().starts_with("ok1\t"));
    assert!(r.stderr().starts_with("WARNING: "));
}

#[test]
fn registry_dir_that_is_a_file() {
    let td = TestDir::new("regfile");
    let f = td.write("afile", "x");
    let fs_ = f.to_str().unwrap();
    let r = td.mam().args(["registry", "register", "--session", "w1", "--job-id", "j", "--registry-dir", fs_]).run();
    r.expect_rc(1);
    assert!(r.stderr().starts_with(&format!("ERROR: {fs_}: cannot create registry directory (")), "{}", r.stderr());
    assert_eq!(r.stderr().lines().count(), 1);
    let r = td.mam().args(["registry", "list", "--registry-dir", fs_]).run();
    r.expect_rc(1);
    assert!(r.stderr().starts_with(&format!("ERROR: {fs_}: cannot list registry (")), "{}", r.stderr());
    td.mam().args(["registry", "show", "j", "--registry-dir", fs_]).run().expect_rc(1);
    assert_eq!(fs::read(&f).unwrap(), b"x");
    assert!(!td.path("delegate_job_logs").exists());
}

#[test]
fn read_only_registry_dir() {
    let td = TestDir::new("rodir");
    register(&td, "roj", &[]);
    let reg = registry(&td);
    let before = record_bytes(&td, "roj");
    let root = mam::sys::getuid() == 0;
    let run = |args: &[&str]| {
        let mut c = td.mam().args(args);
        if root {
            // Root bypasses permissions: run as nobody (A31), which can read but not write.
            let mut inner = Command::new("setpriv");
            inner.args(["--reuid=65534", "--regid=65534", "--clear-groups", mam_bin().to_str().unwrap()]);
            inner.args(args);
            inner.env_clear().envs(c.cmd.get_envs().filter_map(|(k, v)| v.map(|v| (k.to_owned(), v.to_owned()))));
            inner.current_dir(td.ws());
            c.cmd = inner;
        }
        c.run()
    };
    if root {
        // nobody can traverse the tree and read the record (TestDir dirs are 0755), but not write.
        fs::set_permissions(&reg, fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(reg.join("roj.json"), fs::Permissions::from_mode(0o644)).unwrap();
    } else {
        fs::set_permissions(&reg, fs::Permissions::from_mode(0o555)).unwrap();
    }
    let r = run(&["registry", "status", "roj"]);
    assert_eq!(r.expect_rc(0).stdout(), "pending\n");
    let r = run(&["registry", "status", "roj", "--set", "running"]);
    r.expect_rc(1);
    assert_eq!(r.stderr().lines().count(), 1, "{}", r.stderr());
    assert!(r.stderr().starts_with("ERROR: ") && r.stderr().contains("Permission denied"), "{}", r.stderr());
    let r = run(&["registry", "register", "--session", "w1", "--job-id", "new1"]);
    r.expect_rc(1);
    assert_eq!(r.stderr().lines().count(), 1, "{}", r.stderr());
    fs::set_permissions(&reg, fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(record_bytes(&td, "roj"), before);
    assert!(!reg.join("new1.json").exists());
}

/// Unmounts on drop.
struct Mount(PathBuf);
impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn full_disk_fails_the_write_and_keeps_the_record() {
    let td = TestDir::new("full");
    let mnt = td.path("small");
    fs::create_dir_all(&mnt).unwrap();
    let mounted = mam::sys::getuid() == 0
        && Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
            .arg(&mnt)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipped: cannot mount a small tmpfs (needs root)");
        return;
    }
    let _guard = Mount(mnt.clone());
    // A fresh tmpfs is 1777, which mam refuses to write under (issue 12): make it the user's own.
    fs::set_permissions(&mnt, fs::Permissions::from_mode(0o755)).unwrap();
    let reg = mnt.join("jobs");
    let reg_s = reg.to_str().unwrap();
    td.mam()
        .args(["registry", "register", "--session", "w1", "--job-id", "fj", "--registry-dir", reg_s])
        .run()
        .expect_rc(0);
    let before = fs::read(reg.join("fj.json")).unwrap();
    // Fill the file system.
    let filler = mnt.join("filler");
    let mut f = fs::File::create(&filler).unwrap();
    let chunk = vec![0u8; 4096];
    while std::io::Write::write_all(&mut f, &chunk).is_ok() {}
    drop(f);
    let big = "v".repeat(8192);
    let r = td.mam().args(["registry", "set-meta", "fj", &format!("big={big}"), "--registry-dir", reg_s]).run();
    r.expect_rc(1);
    assert_eq!(
        r.stderr().lines().next().unwrap_or(""),
        format!(
            "ERROR: {}: cannot write record (No space left on device (os error 28))",
            reg.join("fj.json").display()
        )
    );
    assert_eq!(r.stderr().lines().count(), 1, "{}", r.stderr());
    assert_eq!(fs::read(reg.join("fj.json")).unwrap(), before);
    let temps: Vec<String> = tree(&mnt).into_iter().filter(|p| p.ends_with(".tmp")).collect();
    assert!(temps.is_empty(), "{temps:?}");
    // After space comes back, the next write works.
    fs::remove_file(&filler).unwrap();
    td.mam().args(["registry", "set-meta", "fj", "small=1", "--registry-dir", reg_s]).run().expect_rc(0);
}

#[test]
fn secrets_never_reach_registry_files_and_modes_are_private() {
    let td = TestDir::new("secrets");
    let pw = format!("pw-{}", rand_hex(8));
    for id in ["s1", "s2"] {
        td.mam()
            .args(["registry", "register", "--session", "w1", "--job-id", id])
            .env("MQTT_PASSWORD", &pw)
            .env("MQTT_USERNAME", "alice")
            .run()
            .expect_rc(0);
    }
    // The close tries the wire with the password (no broker here): one attempt (budget 1 s), and
    // nothing of it may reach a file either.
    td.mam()
        .args(["registry", "status", "s1", "--set", "completed"])
        .env("MQTT_PASSWORD", &pw)
        .env("MAM_PUBLISH_BUDGET_S", "1")
        .run()
        .expect_rc(0);
    td.mam()
        .args(["registry", "submit", "--type", "task", "--session", "w1", "--job-id", "s2"])
        .env("MQTT_PASSWORD", &pw)
        .run()
        .expect_rc(0);
    assert_eq!(record(&td, "s1")["broker"]["username"], "alice");
    for rel in tree(&td.root) {
        let p = td.root.join(&rel);
        let meta = fs::symlink_metadata(&p).unwrap();
        if meta.is_file() {
            assert!(!String::from_utf8_lossy(&fs::read(&p).unwrap()).contains(&pw), "{rel} holds the password");
        }
        if rel.contains(".mam/jobs") || rel.contains("delegate_job_logs") {
            let mode = meta.permissions().mode() & 0o777;
            let want = if meta.is_dir() { 0o700 } else { 0o600 };
            assert_eq!(mode, want, "{rel}: {mode:o}");
        }
    }
}

#[test]
fn reused_ctx_runs_registry_twice() {
    let td = TestDir::new("ctx");
    let mut ctx = mam::ctx::Ctx::with_env([("MAM_ENV_FILE", td.path("absent.env"))], &td.ws());
    for id in ["c1", "c2"] {
        let args = ["register", "--session", "w1", "--job-id", id].map(std::ffi::OsString::from).to_vec();
        assert_eq!(mam::cmd::registry::run(&mut ctx, args), Ok(0));
    }
    assert_eq!(ctx.out.text(), "c1\nc2\n");
    assert_eq!(record(&td, "c2")["status"], "pending");
}

#[test]
fn shim_execs_the_binary_with_arguments_untouched() {
    let td = TestDir::new("shim");
    let shim = Path::new(env!("CARGO_MANIFEST_DIR")).join("shims/registry");
    let out = Command::new(&shim)
        .args(["register", "--session", "w1", "--job-id", "shimjob"])
        .env("MAM_BIN", mam_bin())
        .env("MAM_ENV_FILE", td.path("absent.env"))
        .env_remove("MAM_JOBS_DIR")
        .env_remove("WORKSPACE_ROOT")
        .env_remove("DELEGATE_JOB_LOGS_DIR")
        .current_dir(td.ws())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.stdout, b"shimjob\n");
    assert!(registry(&td).join("shimjob.json").exists());
}

/// 16 processes x 200 mixed requests (metadata on a shared job and on their own job, status sets on
/// the shared job) while a reader loops.
#[test]
fn concurrent_writers_lose_nothing_and_audit_in_order() {
    let td = TestDir::new("conc");
    register(&td, "shared", &[]);
    const PROCS: usize = 16;
    const ROUNDS: usize = 100; // two requests per round: 200 per process
    for i in 0..PROCS {
        register(&td, &format!("own{i}"), &[]);
    }
    let path = registry(&td).join("shared.json");
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (stop, path) = (stop.clone(), path.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            let mut last_ts = 0;
            while !stop.load(Ordering::SeqCst) {
                let v: Value = serde_json::from_slice(&fs::read(&path).unwrap()).expect("every read parses");
                let ts = v["transition_seq"].as_u64().unwrap();
                assert!(ts >= last_ts, "record went backwards");
                last_ts = ts;
                n += 1;
                // Leave the CPU to the writers (2 cores); this paces the reader, it synchronises nothing.
                std::thread::sleep(Duration::from_millis(1));
            }
            n
        })
    };
    let script = r#"
        i=$1; m=$2
        j=0
        while [ $j -lt $ROUNDS ]; do
            "$m" registry set-meta shared "w$i:=$j" >/dev/null || exit 1
            if [ $((j % 2)) -eq 0 ]; then
                "$m" registry status shared --set running >/dev/null || exit 1
            else
                "$m" registry set-meta "own$i" "n:=$j" >/dev/null || exit 1
            fi
            j=$((j + 1))
        done
    "#;
    let started = Instant::now();
    let procs: Vec<_> = (0..PROCS)
        .map(|i| {
            let base = td.mam().cmd;
            let mut sh = Command::new("sh");
            sh.args(["-c", script, "sh", &i.to_string(), mam_bin().to_str().unwrap()]);
            sh.env_clear().envs(base.get_envs().filter_map(|(k, v)| v.map(|v| (k.to_owned(), v.to_owned()))));
            sh.env("ROUNDS", ROUNDS.to_string()).current_dir(td.ws()).stdin(Stdio::null());
            sh.spawn().unwrap()
        })
        .collect();
    for mut p in procs {
        let st = wait_exit("a writer", &mut p, Duration::from_secs(120));
        assert!(st.success(), "a writer failed");
    }
    let elapsed = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    let reads = reader.join().unwrap();
    eprintln!("concurrency: {} requests in {elapsed:?}, {reads} reads", PROCS * ROUNDS * 2);

    let rec = record(&td, "shared");
    for i in 0..PROCS {
        assert_eq!(rec[format!("w{i}")], ROUNDS - 1, "writer {i}");
        assert_eq!(record(&td, &format!("own{i}"))["n"], ROUNDS - 1);
    }
    // register + PROCS*ROUNDS metadata + the one applied `running`; the other sets are idempotent.
    let want_seq = (1 + PROCS * ROUNDS + 1) as u64;
    assert_eq!(rec["transition_seq"].as_u64(), Some(want_seq));
    let entries = audit(&td, "shared");
    let seqs: Vec<u64> = entries.iter().filter_map(|e| e["transition_seq"].as_u64()).collect();
    assert_eq!(seqs, (1..=want_seq).collect::<Vec<_>>(), "audit in strictly increasing order, each once");
    let idem = entries.iter().filter(|e| e["kind"] == "idempotent").count();
    assert_eq!(idem, PROCS * ROUNDS / 2 - 1);
    let st: Value = serde_json::from_slice(&fs::read(logs(&td).join("shared/status.json")).unwrap()).unwrap();
    for k in ["job_id", "attempt", "status", "last_event", "last_seq", "transition_seq", "updated_at"] {
        assert_eq!(st[k], rec[k], "status.json {k}");
    }
}

/// kill -9 a writer at random moments 300 times: every record parses, `list` ignores the temp files
/// left behind, and the next write of that job removes them.
#[test]
fn kill9_during_writes_leaves_whole_records() {
    let td = TestDir::new("kill9");
    register(&td, "kj", &[]);
    register(&td, "kj.json.5", &[]); // an id that extends the other's temp prefix is left alone
    let path = registry(&td).join("kj.json");
    let mut rnd = [0u8; 300];
    mam::sys::random_bytes(&mut rnd).unwrap();
    let mut killed_early = 0;
    for (n, r) in rnd.iter().enumerate() {
        let mut child = td
            .mam()
            .args(["registry", "set-meta", "kj", &format!("n:={n}")])
            .cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Fault injection, not synchronisation: a random delay of 0-2.5 ms before SIGKILL.
        std::thread::sleep(Duration::from_micros(u64::from(*r) * 10));
        let _ = child.kill();
        let st = child.wait().unwrap();
        if !st.success() {
            killed_early += 1;
        }
        let v: Value = serde_json::from_slice(&fs::read(&path).unwrap()).expect("whole record after kill -9");
        assert_eq!(v["job_id"], "kj");
    }
    eprintln!("kill9: {killed_early} of 300 writers killed before finishing");
    // A sibling job's temp file (its id extends this one's temp prefix) must survive the cleanup.
    let sibling_tmp = registry(&td).join(".kj.json.5.json.999999.0123456789abcdef.tmp");
    fs::write(&sibling_tmp, "{").unwrap();
    let r = td.mam().args(["registry", "list"]).run();
    let ids: Vec<String> = r.expect_rc(0).stdout().lines().map(|l| l.split('\t').next().unwrap().to_string()).collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    // Plant a temp file of a dead writer, then write once: both it and any left by the kills go.
    fs::write(registry(&td).join(".kj.json.999999.0123456789abcdef.tmp"), "{").unwrap();
    td.mam().args(["registry", "set-meta", "kj", "final=1"]).run().expect_rc(0);
    let left: Vec<String> = fs::read_dir(registry(&td))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert_eq!(left, [sibling_tmp.file_name().unwrap().to_string_lossy().into_owned()]);
    assert_eq!(record(&td, "kj")["final"], "1");
}

#[test]
fn m4_mirror_admission_through_the_store() {
    let td = TestDir::new("mirror");
    let s = store(&td);
    let dispatched = |attempt: u64, token: &str, last_seq: u64| {
        let mut r = agent(Kind::Mirror, "mj");
        let v = serde_json::json!({"schema": 1, "attempt": attempt, "dispatch_token": token,
            "agent_session": "remote:box", "transport": "remote", "last_seq": last_seq, "transition_seq": 0});
        r.record = Some(v.as_object().unwrap().clone());
        r
    };
    assert_eq!(show(&s.apply(&dispatched(2, "t2", 0), now()).unwrap().decision), "applied none->pending");
    let mut claim = agent(Kind::Claim, "mj");
    claim.alloc_seq = true;
    s.apply(&claim, now()).unwrap();
    let mut done = agent(Kind::Terminal, "mj").with_status("completed");
    done.alloc_seq = true;
    s.apply(&done, now()).unwrap();
    let before = record_bytes(&td, "mj");
    // Same token after completion: idempotent, nothing written.
    assert_eq!(show(&s.apply(&dispatched(2, "t2", 0), now()).unwrap().decision), "idempotent completed");
    // Older attempt, or same attempt with another token: refused, nothing written.
    assert_eq!(show(&s.apply(&dispatched(1, "t1", 0), now()).unwrap().decision), "refused mirror_refused");
    assert_eq!(show(&s.apply(&dispatched(2, "tX", 0), now()).unwrap().decision), "refused mirror_refused");
    assert_eq!(record_bytes(&td, "mj"), before);
    // A newer attempt replaces the record; seqs continue above the old last_seq.
    assert_eq!(show(&s.apply(&dispatched(3, "t3", 0), now()).unwrap().decision), "applied completed->pending");
    let rec = record(&td, "mj");
    assert_eq!((rec["attempt"].as_u64(), rec["last_seq"].as_u64()), (Some(3), Some(2)));
    let kinds = audit_kinds(&td, "mj");
    assert_eq!(kinds.iter().filter(|k| *k == "mirror_refused").count(), 2);
    assert_eq!(kinds.iter().filter(|k| *k == "mirror_admitted").count(), 2);
}
