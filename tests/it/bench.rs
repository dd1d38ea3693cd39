//! `mam bench` (issue 20): the table runs end to end on tiny sizes and has every row; timings are
//! never asserted (they belong to docs/PERFORMANCE.md, not to a test).

use std::time::Duration;

use serde_json::Value;

use crate::support::{have_tool, TestDir};

/// `mam bench --quick --json` over registries of 20 and 40 records: one JSON object with the
/// machine's load and every row of the table, each either measured or saying why not.
#[test]
fn bench_quick_json_has_every_row() {
    let td = TestDir::new("bench");
    let mosquitto =
        have_tool("mosquitto", "MAM_REQUIRE_MOSQUITTO") && have_tool("mosquitto_pub", "MAM_REQUIRE_MOSQUITTO");
    let r = td
        .mam()
        .env("TMPDIR", td.path(""))
        .args(["bench", "--quick", "--json", "--sizes", "20,40", "--runs", "2"])
        .run_within(Duration::from_secs(60));
    let v: Value = serde_json::from_str(&r.expect_rc(0).stdout()).unwrap_or_else(|e| panic!("{e}: {}", r.stdout()));
    assert_eq!(v["command"], "mam bench --quick");
    for k in ["load_start", "load_end"] {
        assert_eq!(v["machine"][k].as_array().map(Vec::len), Some(3), "{k}: {}", v["machine"]);
    }
    let rows = v["rows"].as_array().unwrap();
    let ids: Vec<&str> = rows.iter().map(|r| r["id"].as_str().unwrap()).collect();
    let mut want = vec!["binary_size", "version", "publish", "publish_tmpfs", "pub", "timer_rss"];
    let sized: Vec<String> = ["20", "40"]
        .iter()
        .flat_map(|n| {
            ["registry_list", "jobs", "status"]
                .iter()
                .flat_map(move |c| [format!("{c}_{n}_time"), format!("{c}_{n}_rss")])
        })
        .collect();
    want.extend(sized.iter().map(String::as_str));
    want.extend(["registry_list_growth", "broker_throughput", "broker_p50", "broker_p99", "broker_rss_idle"]);
    assert_eq!(ids, want);
    for row in rows {
        let id = row["id"].as_str().unwrap();
        for k in ["measure", "target", "note"] {
            assert!(row[k].is_string(), "{id}: {k}: {row}");
        }
        // Measured, or not measured with the reason in the note.
        match row["now"]["value"].as_f64() {
            Some(x) => assert!(x.is_finite() && x >= 0.0, "{id}: {row}"),
            None => assert!(!row["note"].as_str().unwrap().is_empty() && row["pass"].is_null(), "{id}: {row}"),
        }
        let shm = std::path::Path::new("/dev/shm").is_dir();
        if mosquitto && (shm || id != "publish_tmpfs") {
            assert!(row["now"].is_object(), "{id} not measured with mosquitto installed: {row}");
        }
        if row["target"] != "-" && row["now"].is_object() && !(id == "binary_size" && row["pass"].is_null()) {
            assert!(row["pass"].is_boolean(), "{id}: a row with a target says met or not: {row}");
        }
    }
    // Everything it wrote is gone.
    let left: Vec<_> = std::fs::read_dir(td.path(""))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().starts_with("mam-bench"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn bench_usage_errors() {
    let td = TestDir::new("bench-usage");
    for (args, needle) in [
        (&["bench", "--sizes", "0"][..], "--sizes"),
        (&["bench", "--sizes", "1,x"], "--sizes"),
        (&["bench", "nosuch"], "unknown benchmark 'nosuch'"),
        (&["bench", "loop-round", "--quick"], "unexpected option --quick"),
        (&["bench", "--repo", "."], "belong to loop-round"),
    ] {
        let r = td.mam().args(args).run();
        r.expect_rc(2);
        assert!(r.stderr().contains(needle), "{args:?}: {}", r.stderr());
    }
}

/// `mam bench publish`: every step of a traced `mam publish` is reported, and the trace shows the
/// durability order: the record written and the event appended to events.log before the event's
/// PUBLISH starts.
#[test]
fn bench_publish_breakdown_has_the_steps_in_durable_order() {
    let td = TestDir::new("bench-publish");
    let r = td
        .mam()
        .env("TMPDIR", td.path(""))
        .args(["bench", "publish", "--runs", "3", "--json"])
        .run_within(Duration::from_secs(60));
    let v: Value = serde_json::from_str(&r.expect_rc(0).stdout()).unwrap_or_else(|e| panic!("{e}: {}", r.stdout()));
    let steps = v["steps"].as_array().unwrap();
    let get = |name: &str| {
        let s = steps.iter().find(|s| s["step"] == name).unwrap_or_else(|| panic!("no step {name}: {v}"));
        (s["start_ms"].as_f64().unwrap(), s["ms"].as_f64().unwrap())
    };
    for name in [
        "parse",
        "read",
        "lock",
        "record",
        "audit",
        "sign",
        "events.log",
        "connect",
        "event",
        "recheck",
        "state",
        "published",
        "print",
    ] {
        get(name);
    }
    let (log_start, log_len) = get("events.log");
    let (rec_start, rec_len) = get("record");
    let (event_start, _) = get("event");
    assert!(rec_start + rec_len <= log_start + 1e-3, "record after events.log: {v}");
    assert!(log_start + log_len <= event_start + 1e-3, "the event went out before events.log had it: {v}");
    assert!(v["wall_ms"].as_f64().unwrap() >= v["traced_ms"].as_f64().unwrap());
}
