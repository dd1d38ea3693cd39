//! `mam jobs`: the table and `--json` over a generated registry, with no broker, creating nothing;
//! `--follow` redraws until a signal.

use std::fs;
use std::process::Stdio;
use std::time::{Duration, Instant};

use mam::registry::engine::{Authority, Kind, Request};
use mam::registry::store::Store;
use serde_json::Value;

use crate::support::*;

fn store(td: &TestDir) -> Store {
    Store::new(td.ws().join(".mam/jobs"), td.ws().join(".mam/delegate_job_logs"))
}

fn agent(td: &TestDir, kind: Kind, id: &str) {
    let rec = read_record(td, id);
    let mut req = Request::new(kind, Authority::Agent, id);
    req.attempt = rec["attempt"].as_u64();
    req.dispatch_token = rec["dispatch_token"].as_str().map(String::from);
    req.alloc_seq = true;
    store(td).apply(&req, mam::clock::now_ms()).unwrap();
}

/// Four jobs: pending; running with a heartbeat only in events.log; running with `heartbeat_at` in
/// the record; cancelled. Registered with a broker address nothing listens on.
fn generate(td: &TestDir) -> [String; 4] {
    let env = [("MQTT_PORT", "1".to_string())];
    let ids = [(); 4].map(|_| register_job(td, &env, &[]));
    agent(td, Kind::Claim, &ids[1]);
    let rec = read_record(td, &ids[1]);
    append_events_log(td, &ids[1], &signed_event(&rec, "started", 1, false));
    append_events_log(td, &ids[1], &signed_event(&rec, "progress", 2, true));
    agent(td, Kind::Claim, &ids[2]);
    agent(td, Kind::Beat, &ids[2]);
    td.mam().args(["registry", "status", &ids[3], "--set", "cancelled", "--no-publish"]).run().expect_rc(0);
    ids
}

#[test]
fn jobs_table_and_json_over_a_generated_registry() {
    let td = TestDir::new("jobs");
    let ids = generate(&td);
    let mut order: Vec<(String, String)> =
        ids.iter().map(|id| (read_record(&td, id)["created_at"].as_str().unwrap().to_string(), id.clone())).collect();
    order.sort();
    let before = tree(&td.ws());

    let r = td.mam().env("MQTT_PORT", "1").args(["jobs"]).run();
    r.expect_rc(0);
    assert_eq!(r.stderr(), "");
    let out = r.stdout();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 6, "{out}");
    // Issue 18: the header names the registry read.
    let reg = td.ws().join(".mam/jobs");
    assert!(lines[0].starts_with(&format!("registry {}: 4 job(s) at ", reg.display())), "{out}");
    let head: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(head, ["JOB", "STATUS", "ATTEMPT", "SESSION", "ELAPSED", "FINISHED", "EVIDENCE", "HEARTBEAT"]);
    let rows: Vec<Vec<&str>> = lines[2..].iter().map(|l| l.split_whitespace().collect()).collect();
    let listed: Vec<&str> = rows.iter().map(|r| r[0]).collect();
    let want: Vec<&str> = order.iter().map(|(_, id)| id.as_str()).collect();
    assert_eq!(listed, want, "{out}");
    let row = |id: &str| rows.iter().find(|r| r[0] == id).unwrap().clone();
    let is_age = |s: &str| s.ends_with('s') && s[..s.len() - 1].bytes().all(|b| b.is_ascii_digit());
    for (id, status, hb) in [
        (&ids[0], "pending", false),
        (&ids[1], "running", true),
        (&ids[2], "running", true),
        (&ids[3], "cancelled", false),
    ] {
        let r = row(id);
        assert_eq!(r[1], status, "{out}");
        assert_eq!(r[2], "1");
        assert!(r[3].starts_with("w-"));
        assert!(is_age(r[4]), "elapsed of {id}: {out}");
        // A finished job has a finish time and no evidence age (it would mean nothing).
        let finished = status == "cancelled";
        assert_eq!(r[5] != "-", finished, "finish time of {id}: {out}");
        assert_eq!(is_age(r[6]), !finished, "evidence age of {id}: {out}");
        assert_eq!(is_age(r[7]), hb, "heartbeat of {id}: {out}");
        if !hb {
            assert_eq!(r[7], "-");
        }
    }

    let r = td.mam().env("MQTT_PORT", "1").args(["jobs", "--json"]).run();
    r.expect_rc(0);
    let v: Value = serde_json::from_str(&r.stdout()).unwrap();
    let arr = v.as_array().unwrap();
    assert_eq!(arr.len(), 4);
    assert_eq!(arr.iter().map(|e| e["job_id"].as_str().unwrap()).collect::<Vec<_>>(), want);
    for e in arr {
        let id = e["job_id"].as_str().unwrap();
        assert!(e["evidence_age_s"].as_u64().is_some_and(|a| a < 60), "{e}");
        assert!(e["last_evidence_at"].as_str().is_some_and(|t| mam::clock::parse_ts(t).is_some()));
        let has_hb = id == ids[1] || id == ids[2];
        assert_eq!(e["heartbeat_age_s"].is_u64(), has_hb, "{e}");
        assert_eq!(e["heartbeat_at"].is_string(), has_hb, "{e}");
        assert_eq!(e["attempt"], 1);
    }
    // The events.log heartbeat is the line's own ts.
    let hb_line: Value = serde_json::from_slice(
        fs::read(td.ws().join(".mam/jobs").join(&ids[1]).join("events.log"))
            .unwrap()
            .split(|&b| b == b'\n')
            .nth(1)
            .unwrap(),
    )
    .unwrap();
    let e1 = arr.iter().find(|e| e["job_id"] == ids[1].as_str()).unwrap();
    assert_eq!(e1["heartbeat_at"], hb_line["ts"]);
    // No token of any record is printed.
    for id in &ids {
        let rec = read_record(&td, id);
        for k in ["auth_token", "dispatch_token"] {
            assert!(!r.stdout().contains(rec[k].as_str().unwrap()), "{k} of {id} printed");
            assert!(!out.contains(rec[k].as_str().unwrap()));
        }
    }
    assert_eq!(tree(&td.ws()), before, "mam jobs wrote files");
}

/// Issue 18: a registry that does not exist is an error naming it (not an empty table), and it
/// still creates nothing.
#[test]
fn jobs_on_a_missing_registry_is_an_error_and_creates_nothing() {
    let td = TestDir::new("jobs-none");
    let reg = td.path("nowhere/jobs");
    let r = td.mam().args(["jobs", "--registry-dir"]).args([&reg]).run();
    r.expect_rc(1);
    assert_eq!(r.stdout(), "");
    assert!(r.stderr().starts_with(&format!("ERROR: jobs: no registry at {} (", reg.display())), "{}", r.stderr());
    assert!(r.stderr().contains("mam paths"), "{}", r.stderr());
    let r = td.mam().env("MAM_JOBS_DIR", &reg).args(["jobs", "--json"]).run();
    r.expect_rc(1);
    assert_eq!(r.stdout(), "");
    assert!(!td.path("nowhere").exists());
    // The default registry of a control root that exists is only empty so far.
    let r = td.mam().args(["jobs"]).run();
    r.expect_rc(0);
    assert!(r.stdout().starts_with("registry ") && r.stdout().contains(": 0 job(s) at "), "{}", r.stdout());
    // A directory that is no control root at all has no registry.
    fs::create_dir_all(td.path("elsewhere")).unwrap();
    td.mam().cwd(td.path("elsewhere")).args(["jobs"]).run().expect_rc(1);
    assert_eq!(tree(&td.ws()), vec![".mam".to_string()]);
    let r = td.mam().args(["jobs", "--bogus"]).run();
    r.expect_rc(2);
}

#[test]
fn jobs_follow_redraws_until_sigterm() {
    let td = TestDir::new("jobs-follow");
    let id = register_job(&td, &[], &[]);
    let out = td.path("follow.out");
    let mut cmd = td.mam().args(["jobs", "--follow"]).cmd;
    cmd.stdout(fs::File::create(&out).unwrap()).stderr(Stdio::null());
    let mut child = cmd.spawn().unwrap();
    let text = || fs::read_to_string(&out).unwrap_or_default();
    // Issue 32: to a file (not a terminal) each refresh is plain text, no clear-screen codes.
    wait_until("two redraws", Duration::from_secs(10), || text().matches("registry ").count() >= 2);
    assert!(text().contains(&id));
    assert!(!text().contains('\x1b'), "{:?}", text());
    mam::sys::kill(child.id() as i32, libc::SIGTERM).unwrap();
    let t = Instant::now();
    let st = wait_exit("mam jobs --follow after SIGTERM", &mut child, Duration::from_secs(2));
    assert_eq!(st.code(), Some(0));
    assert!(t.elapsed() < Duration::from_secs(1));
}

/// Issue 18: a running job with no evidence for longer than its idle window shows as silent, with
/// how long, when no daemon runs to close it.
#[test]
fn jobs_shows_a_silent_job_as_silent() {
    let td = TestDir::new("jobs-silent");
    let env = [("MQTT_PORT", "1".to_string())];
    let id = register_job(&td, &env, &["--heartbeat-sec", "1", "--idle-timeout", "1"]);
    agent(&td, Kind::Claim, &id);
    // Evidence older than the 1 s window: rewrite the record's timestamps into the past.
    let path = td.ws().join(".mam/jobs").join(format!("{id}.json"));
    let mut rec = read_record(&td, &id);
    let past = mam::clock::format_ts(mam::clock::now_ms() - 125_000);
    for k in ["created_at", "claimed_at", "updated_at", "last_event_at", "dispatched_at", "heartbeat_at"] {
        if rec.get(k).is_some_and(|v| v.is_string()) {
            rec[k] = Value::String(past.clone());
        }
    }
    fs::write(&path, serde_json::to_vec(&rec).unwrap()).unwrap();
    let r = td.mam().args(["jobs"]).run();
    r.expect_rc(0);
    let line = r.stdout().lines().find(|l| l.starts_with(&id)).unwrap().to_string();
    let status = line.split_whitespace().nth(1).unwrap().to_string();
    assert!(status == "silent(2m05s)" || status == "silent(2m06s)", "{line}");
    let v: Value = serde_json::from_str(&td.mam().args(["jobs", "--json"]).run().stdout()).unwrap();
    assert!(v[0]["silent_s"].as_u64().is_some_and(|s| (125..=127).contains(&s)), "{v}");
}
