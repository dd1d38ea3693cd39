//! Path resolution (CORE 2, A1): P1-P6 through `mam registry paths`, `mam paths`, and the
//! register -> publish (and its heartbeat child) -> watch round trip against the embedded broker.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::support::*;

fn lines_of(p: &Path) -> Vec<Value> {
    fs::read_to_string(p).unwrap_or_default().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn paths(r: &Run) -> (String, String) {
    let out = r.stdout();
    let get = |k: &str| out.lines().find_map(|l| l.strip_prefix(k)).unwrap_or_default().to_string();
    (get("registry="), get("logs="))
}

#[test]
fn p1_precedence_jobs_dir_then_workspace_then_cwd() {
    let td = TestDir::new("p1");
    let ws = td.path("other");
    std::fs::create_dir_all(&ws).unwrap();
    let jobs = td.path("x/jobs");
    let r = td.mam().env("MAM_JOBS_DIR", &jobs).env("WORKSPACE_ROOT", &ws).args(["registry", "paths"]).run();
    r.expect_rc(0);
    assert_eq!(paths(&r).0, jobs.display().to_string());
    let r = td.mam().env("WORKSPACE_ROOT", &ws).args(["registry", "paths"]).run();
    assert_eq!(paths(&r).0, ws.join(".mam/jobs").display().to_string());
    let r = td.mam().args(["registry", "paths"]).run();
    assert_eq!(paths(&r).0, td.ws().join(".mam/jobs").display().to_string());
    // From a subdirectory, the nearest ancestor holding .mam/ is the control root (A1).
    std::fs::create_dir_all(td.ws().join("deep/er")).unwrap();
    let r = td.mam().cwd(td.ws().join("deep/er")).args(["registry", "paths"]).run();
    assert_eq!(paths(&r).0, td.ws().join(".mam/jobs").display().to_string());
    // An empty MAM_JOBS_DIR counts as unset.
    let r = td.mam().env("MAM_JOBS_DIR", "").args(["registry", "paths"]).run();
    assert_eq!(paths(&r).0, td.ws().join(".mam/jobs").display().to_string());
}

#[test]
fn p2_audit_log_root_is_beside_the_registry() {
    let td = TestDir::new("p2");
    let r = td.mam().env("MAM_JOBS_DIR", "/t/x/jobs").args(["registry", "paths"]).run();
    assert_eq!(paths(&r), ("/t/x/jobs".into(), "/t/x/delegate_job_logs".into()));
    let r = td
        .mam()
        .env("MAM_JOBS_DIR", "/t/x/jobs")
        .env("DELEGATE_JOB_LOGS_DIR", "/t/logs")
        .args(["registry", "paths"])
        .run();
    assert_eq!(paths(&r).1, "/t/logs");
    let r = td.mam().env("MAM_JOBS_DIR", "/t/x/jobs").args(["registry", "paths", "--registry-dir", "/t/y/jobs"]).run();
    assert_eq!(paths(&r), ("/t/y/jobs".into(), "/t/y/delegate_job_logs".into()));
    // A relative --registry-dir is taken against the cwd.
    let r = td.mam().args(["registry", "paths", "--registry-dir", "r/jobs"]).run();
    assert_eq!(paths(&r).0, td.ws().join("r/jobs").display().to_string());
}

#[test]
fn p3_relative_jobs_dir_resolves_against_control_root() {
    let td = TestDir::new("p3");
    std::fs::create_dir_all(td.ws().join("sub")).unwrap();
    // cwd is a subdirectory; the control root is ws (it holds .mam/), so rel/jobs is ws/rel/jobs.
    let r = td.mam().cwd(td.ws().join("sub")).env("MAM_JOBS_DIR", "rel/jobs").args(["registry", "paths"]).run();
    assert_eq!(paths(&r).0, td.ws().join("rel/jobs").display().to_string());
    let r = td.mam().cwd(td.ws().join("sub")).env("MAM_JOBS_DIR", "rel/../rel/./jobs").args(["paths", "--json"]).run();
    let v: serde_json::Value = serde_json::from_str(&r.stdout()).unwrap();
    assert_eq!(v["registry"], td.ws().join("rel/jobs").display().to_string());
    assert_eq!(v["logs"], td.ws().join("rel/delegate_job_logs").display().to_string());
}

#[test]
fn p6_read_only_commands_create_nothing() {
    let td = TestDir::new("p6");
    let other = td.path("other-tree");
    std::fs::create_dir_all(&other).unwrap();
    for args in [&["registry", "paths"][..], &["paths"], &["paths", "--control-plane-json"], &["env", "--shell"]] {
        td.mam()
            .env("WORKSPACE_ROOT", &other)
            .env("MAM_JOBS_DIR", td.path("pinned/jobs"))
            .env("DELEGATE_JOB_LOGS_DIR", td.path("pinned/logs"))
            .args(args)
            .run()
            .expect_rc(0);
    }
    assert!(tree(&other).is_empty(), "{:?}", tree(&other));
    assert!(!td.path("pinned").exists());
    assert_eq!(tree(&td.ws()), vec![".mam".to_string()]);
}

#[test]
fn control_plane_binding_and_prefix() {
    let td = TestDir::new("binding");
    let r = td.mam().args(["paths", "--control-plane-json"]).run();
    r.expect_rc(0);
    let v: serde_json::Value = serde_json::from_str(&r.stdout()).unwrap();
    let ws = td.ws().display().to_string();
    assert_eq!(v["WORKSPACE_ROOT"], ws);
    assert_eq!(v["AGENT_SESSIONS_YAML"], format!("{ws}/.mam/agent_sessions.json"));
    assert_eq!(v["MAM_JOBS_DIR"], format!("{ws}/.mam/jobs"));
    assert_eq!(v["DELEGATE_JOB_LOGS_DIR"], format!("{ws}/.mam/delegate_job_logs"));
    // The prefix is shell words: evaluating it with `env` reproduces the paths, quotes included.
    let spaced = td.path("it's a dir");
    std::fs::create_dir_all(spaced.join(".mam")).unwrap();
    let prefix = td.mam().cwd(&spaced).args(["paths", "--control-plane-prefix"]).run().stdout();
    let r = td.command("sh").args(["-c", &format!("{} env", prefix.trim_end())]).run();
    assert!(r.stdout().lines().any(|l| l == format!("WORKSPACE_ROOT={}", spaced.display())), "{}", r.stdout());
}

#[test]
fn p3_heartbeat_child_keeps_the_absolute_registry_after_its_cwd_goes() {
    let td = TestDir::new("p3hb");
    let b = embedded();
    let port = b.addr().port().to_string();
    let sub = td.ws().join("sub");
    fs::create_dir_all(&sub).unwrap();
    let reg = td.ws().join("rel/jobs");
    let id = format!("p{}", rand_hex(4));
    let _g = TimerGuard(id.clone());
    let mam = || td.mam().cwd(&sub).env("MAM_JOBS_DIR", "rel/jobs").env("MQTT_PORT", &port);
    mam().args(["registry", "register", "--session", "w1", "--job-id", &id, "--heartbeat-sec", "1"]).run().expect_rc(0);
    assert!(reg.join(format!("{id}.json")).is_file(), "the record is under the control root, not the cwd");
    mam()
        .args(["publish", "--job-id", &id, "--event", "started", "--heartbeat", "1", "--watch-pid", "0"])
        .run()
        .expect_rc(0);
    wait_until("the timer", Duration::from_secs(10), || timer_pids(&id).len() == 1);
    let pid = timer_pids(&id)[0];
    let argv = mam::sys::proc_cmdline(pid).unwrap();
    let flag = argv.iter().position(|a| a == b"--registry-dir").expect("--registry-dir in the timer's argv");
    assert_eq!(argv[flag + 1], reg.to_str().unwrap().as_bytes(), "the timer's registry is absolute");
    assert_eq!(fs::read_link(format!("/proc/{pid}/cwd")).unwrap(), sub, "the timer runs in the caller's cwd");
    let beats =
        |reg: &Path| lines_of(&reg.join(&id).join("events.log")).iter().filter(|e| e["heartbeat"] == true).count();
    wait_until("a beat under <root>/rel/jobs", Duration::from_secs(10), || beats(&reg) >= 1);
    // The child's directory goes away; its beats still land in the absolute registry.
    fs::remove_dir(&sub).unwrap();
    let before = beats(&reg);
    wait_until("two more beats after the cwd is gone", Duration::from_secs(10), || beats(&reg) >= before + 2);
    assert!(!td.ws().join("sub/rel").exists() && !td.path("rel").exists());
    mam().cwd(td.ws()).args(["publish", "--job-id", &id, "--event", "completed"]).run().expect_rc(0);
    assert!(timer_pids(&id).is_empty());
}

#[test]
fn p4_printed_publish_line_works_from_slash_under_a_spaced_root() {
    let td = TestDir::new("p4");
    let b = embedded();
    let port = b.addr().port().to_string();
    let root = td.path("a b/ws");
    fs::create_dir_all(root.join(".mam")).unwrap();
    let id = format!("p{}", rand_hex(4));
    let here = || td.mam().cwd(&root).env("MQTT_PORT", &port);
    here().args(["registry", "register", "--session", "w1", "--job-id", &id]).run().expect_rc(0);
    let line = here().args(["registry", "publish-cmd", &id]).run();
    let line = line.expect_rc(0).stdout().trim_end().to_string();
    assert!(line.ends_with(" --event"), "{line}");
    // From `/`, with no binding variable and no broker variable: the line alone addresses the job.
    for event in ["started", "completed"] {
        let r = td
            .command("sh")
            .cwd("/")
            .env_remove("WORKSPACE_ROOT")
            .env_remove("MAM_JOBS_DIR")
            .env_remove("DELEGATE_JOB_LOGS_DIR")
            .args(["-c", &format!("{line} {event}")])
            .run();
        r.expect_rc(0);
        assert_eq!(r.stdout(), format!("published {event} seq={} job={id}\n", if event == "started" { 1 } else { 2 }));
    }
    let r = here().args(["watch", "--job-id", &id]).run_within(Duration::from_secs(20));
    r.expect_rc(0);
    assert!(r.stdout().contains("result completed"), "{}", r.stdout());
    let reg = root.join(".mam/jobs");
    let logs = root.join(".mam/delegate_job_logs");
    let rec: Value = serde_json::from_slice(&fs::read(reg.join(format!("{id}.json"))).unwrap()).unwrap();
    assert_eq!(rec["status"], "completed");
    let events: Vec<String> =
        lines_of(&reg.join(&id).join("events.log")).iter().map(|e| e["event"].as_str().unwrap().to_string()).collect();
    assert_eq!(events, ["started", "completed"]);
    let audit = lines_of(&logs.join(&id).join("audit.jsonl"));
    assert_eq!(audit.iter().filter(|e| e["kind"] == "published").count(), 2, "{audit:?}");
    assert!(logs.join(&id).join("subscriber.log").is_file());
    // The wire carried it too: the retained state is the terminal one.
    let st: Value = serde_json::from_slice(&b.retained(&format!("mam/jobs/{id}/state")).unwrap()).unwrap();
    assert_eq!(st["status"], "completed");
    // Nothing landed in the test's other control root.
    assert_eq!(tree(&td.ws()), vec![".mam".to_string()]);
}

/// Extra environment variables of one P5 case.
type Env = Vec<(&'static str, String)>;

#[test]
fn p5_watch_finds_the_record_register_created_in_the_same_environment() {
    let td = TestDir::new("p5");
    let b = embedded();
    let port = b.addr().port().to_string();
    let other = td.path("elsewhere");
    fs::create_dir_all(td.ws().join("one")).unwrap();
    fs::create_dir_all(td.ws().join("two")).unwrap();
    fs::create_dir_all(&other).unwrap();
    // Three environments, each used by register, publish and watch alike (cwds differ).
    let envs: Vec<(&str, Env, PathBuf, PathBuf)> = vec![
        ("default", vec![], td.ws().join("one"), td.ws().join("two")),
        ("relative MAM_JOBS_DIR", vec![("MAM_JOBS_DIR", "rel/jobs".into())], td.ws().join("one"), td.ws().join("two")),
        ("WORKSPACE_ROOT", vec![("WORKSPACE_ROOT", td.ws().display().to_string())], other.clone(), td.root.clone()),
    ];
    for (what, env, reg_cwd, watch_cwd) in envs {
        let cmd = |cwd: &Path| {
            let mut c = td.mam().cwd(cwd).env("MQTT_PORT", &port);
            for (k, v) in &env {
                c = c.env(k, v);
            }
            c
        };
        let id = format!("p{}", rand_hex(4));
        cmd(&reg_cwd).args(["registry", "register", "--session", "w1", "--job-id", &id]).run().expect_rc(0);
        for event in ["started", "completed"] {
            cmd(&reg_cwd).args(["publish", "--job-id", &id, "--event", event]).run().expect_rc(0);
        }
        let r = cmd(&watch_cwd).args(["watch", "--job-id", &id]).run_within(Duration::from_secs(20));
        assert_eq!(r.rc(), 0, "{what}: {}{}", r.stdout(), r.stderr());
        assert!(r.stdout().contains("result completed"), "{what}: {}", r.stdout());
    }
    assert!(tree(&other).is_empty(), "{:?}", tree(&other));
}
