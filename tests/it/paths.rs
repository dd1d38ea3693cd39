//! Path resolution (CORE 2, A1): P1-P3 and P6 through `mam registry paths` and `mam paths`.
//! P4 and P5 need publish and watch; they live with those suites.

use crate::support::*;

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
