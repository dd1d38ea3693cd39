//! ORCH 4.9: validation before the lock (tests 1-3, 14, 23, 27, 28; A41), bad input (issue 13),
//! `mam loop status` and `mam loop prune` (A37), `mam loop --help`, and a first promoted loop.
//!
//! Every refusal is checked the same way (`refused`): the exit code, one stderr line naming the bad
//! value, nothing on stdout, and nothing registered or locked: no loop dir, no lock file (or its
//! content unchanged), no job record.

use std::fs;
use std::path::Path;

use super::*;

/// What a refused loop must leave as it was: whether `<ws>/.mam/loop` exists, every path under it
/// with its content (a lock file keeps its holder), and the job records.
#[derive(Debug, PartialEq)]
struct Footprint {
    loop_root: bool,
    files: Vec<(String, Vec<u8>)>,
    jobs: Vec<String>,
}

fn footprint(w: &World) -> Footprint {
    let dir = w.root.join(".mam/loop");
    let files = tree(&dir).into_iter().map(|p| {
        let content = fs::read(dir.join(&p)).unwrap_or_default();
        (p, content)
    });
    let mut jobs = w.job_ids();
    jobs.sort();
    Footprint { loop_root: dir.exists(), files: files.collect(), jobs }
}

/// `mam loop <args>` with `env` added, expected to end with `rc` before the lock: one stderr line
/// (`NOTE:` lines aside) that is an `ERROR:` line naming each of `names`, no stdout, and the
/// footprint unchanged. Returns the whole stderr.
fn refused_rc(w: &World, env: &[(&str, &str)], args: &[&str], rc: i32, names: &[&str]) -> String {
    let before = footprint(w);
    let mut c = w.mam().args(["loop"]).args(args);
    for (k, v) in env {
        c = c.env(k, v);
    }
    let r = c.run_within(LOOP_LIMIT);
    let err = r.stderr();
    assert_eq!(r.rc(), rc, "mam loop {args:?} (env {env:?})\n--- stdout\n{}--- stderr\n{err}", r.stdout());
    let lines: Vec<&str> = err.lines().filter(|l| !l.starts_with("NOTE: ")).collect();
    assert_eq!(lines.len(), 1, "one error line for mam loop {args:?}:\n{err}");
    assert!(lines[0].starts_with("ERROR: "), "{:?}", lines[0]);
    for n in names {
        assert!(lines[0].contains(n), "{n:?} is not named in {:?} (mam loop {args:?})", lines[0]);
    }
    assert_eq!(r.stdout(), "", "mam loop {args:?}: nothing on stdout before the lock");
    assert_eq!(footprint(w), before, "mam loop {args:?} left something behind");
    err
}

fn refused(w: &World, args: &[&str], names: &[&str]) -> String {
    refused_rc(w, &[], args, 2, names)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A remote session row in the sessions file (ORCH 2.2: `transport: remote`).
fn remote_row(w: &World, name: &str) {
    let file = w.root.join(".mam/agent_sessions.json");
    let mut doc: Value = match fs::read(&file) {
        Ok(b) => serde_json::from_slice(&b).unwrap(),
        Err(_) => serde_json::json!({"version": 1, "herdr_sessions": [], "orchestrator_uuids": []}),
    };
    doc["herdr_sessions"].as_array_mut().unwrap().push(serde_json::json!({
        "name": name, "agent": "claude", "transport": "remote", "status": "running",
    }));
    fs::write(&file, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
}

/// A linked worktree of the control root at `path` on a new branch, with one committed change, so
/// a review of it since the initial commit has something to review.
fn linked_worktree(w: &World, path: &Path, branch: &str) {
    w.git(&["worktree", "add", "-q", "-b", branch, s(path)]);
    fs::write(path.join("app.txt"), "version 2\n").unwrap();
    git_in(path, &["commit", "-q", "-am", "version 2"]);
}

/// Commits a change in the control root (for `--review-only --base <initial commit>`).
fn commit_change(w: &World) {
    fs::write(w.root.join("app.txt"), "version 2\n").unwrap();
    w.git(&["commit", "-q", "-am", "version 2"]);
}

/// A loop expected to promote: returns its id.
fn promoted(r: &Run) -> String {
    let (id, outcome, rc, _) = last_line(&r.stdout());
    assert_eq!((outcome.as_str(), rc, r.rc()), ("promoted", 0, 0), "{}\n{}", r.stdout(), r.stderr());
    id
}

#[test]
fn a_pinned_loop_with_one_reviewer_promotes_its_pass() {
    let w = World::new("loop-smoke");
    w.creator("cr", "");
    w.reviewer("rv", "PASS", "");
    let task = w.task("Add a line to app.txt.");
    let base = w.base();
    let r =
        w.run_loop(&["--creator", "cr", "--reviewer", "rv", "--task-file", task.to_str().unwrap(), "--base", &base]);
    let (id, outcome, rc, reports) = last_line(&r.stdout());
    assert_eq!((outcome.as_str(), rc), ("promoted", 0), "{}\n{}", r.stdout(), r.stderr());
    r.expect_rc(0);
    let cp = w.checkpoint(&id);
    let round = &cp["review_rounds"][0];
    assert_eq!(round["reviewers"][0]["evidence"], "review-tree");
    let jid = round["reviewers"][0]["jid"].as_str().unwrap();
    let side: Value =
        serde_json::from_slice(&fs::read(format!("{reports}/rv/report-{jid}.identity.json")).unwrap()).unwrap();
    let commit = side["snapshot_commit"].as_str().unwrap();
    assert_eq!(side["tree"].as_str().unwrap(), w.git(&["rev-parse", &format!("{commit}^{{tree}}")]));
    assert!(w.review_trees().is_empty());
}

#[test]
fn t01_a_worktree_missing_not_a_top_level_or_of_another_repository_exits_2_before_the_lock() {
    let w = World::new("loop-t01");
    w.creator("cr", "");
    w.reviewer("rv", "PASS", "");
    let task = w.task("Add a line to app.txt.");
    let wt = w.td.path("wt");
    linked_worktree(&w, &wt, "feat");
    let sub = wt.join("sub");
    fs::create_dir_all(&sub).unwrap();
    let other = w.td.path("other");
    fs::create_dir_all(&other).unwrap();
    git_in(&other, &["init", "-q", "-b", "main"]);
    fs::write(other.join("x.txt"), "x\n").unwrap();
    git_in(&other, &["add", "-A"]);
    git_in(&other, &["commit", "-q", "-m", "other"]);
    let plain = w.td.path("plain");
    fs::create_dir_all(&plain).unwrap();
    let missing = w.td.path("missing");
    for (dir, names) in [
        (&missing, vec![format!("--worktree {}: no such directory", s(&missing))]),
        (&sub, vec![format!("--worktree {}: not the top level of its worktree (that is {})", s(&sub), s(&wt))]),
        (&other, vec![format!("--worktree {}: a worktree of another repository", s(&other))]),
        (&plain, vec![format!("--worktree {}: not a git worktree", s(&plain))]),
    ] {
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        refused(&w, &["--creator", "cr", "--reviewer", "rv", "--task-file", s(&task), "--worktree", s(dir)], &names);
    }
    let odd = w.td.path("missing\nworktree");
    let flag = ["--creator", "cr", "--reviewer", "rv", "--task-file", s(&task), "--worktree", s(&odd)];
    refused(&w, &flag, &[&format!("--worktree {}: no such directory", s(&odd).replace('\n', "\\n"))]);
    // The environment's worktree is checked the same way and named as such.
    let no_flag = ["--creator", "cr", "--reviewer", "rv", "--task-file", s(&task)];
    let err = refused_rc(
        &w,
        &[("MAM_LOOP_WORKTREE", s(&sub))],
        &no_flag,
        2,
        &[&format!("MAM_LOOP_WORKTREE {}: not the top level", s(&sub))],
    );
    assert!(err.contains("NOTE: loop: the worktree") && err.contains("MAM_LOOP_WORKTREE"), "{err}");
    refused_rc(
        &w,
        &[("MAM_LOOP_WORKTREE", s(&other))],
        &no_flag,
        2,
        &[&format!("MAM_LOOP_WORKTREE {}: a worktree of another repository", s(&other))],
    );
    // The flag wins: a valid worktree in the environment does not rescue a missing one on the flag,
    // and no NOTE says the environment was used.
    let flag = [&no_flag[..], &["--worktree", s(&missing)]].concat();
    let err = refused_rc(&w, &[("MAM_LOOP_WORKTREE", s(&wt))], &flag, 2, &[&format!("--worktree {}", s(&missing))]);
    assert!(!err.contains("NOTE"), "{err}");
}

#[test]
fn t01_mam_loop_worktree_is_honoured_with_a_note_and_the_flag_wins_over_it() {
    let w = World::new("loop-t01env");
    w.creator("cr", "");
    w.reviewer("rv", "PASS", "");
    let wt = w.td.path("wt");
    linked_worktree(&w, &wt, "feat");
    let real = wt.canonicalize().unwrap();
    let base = w.base();
    let args = ["--creator", "cr", "--reviewer", "rv", "--review-only", "--base", &base];
    let r = w.mam().args(["loop"]).args(args).env("MAM_LOOP_WORKTREE", &wt).run_within(LOOP_LIMIT);
    let id = promoted(&r);
    let note = format!("NOTE: loop: the worktree {} comes from MAM_LOOP_WORKTREE", s(&wt));
    assert!(r.stderr().lines().any(|l| l == note), "{}", r.stderr());
    let cp = w.checkpoint(&id);
    assert_eq!(cp["source_root"].as_str(), Some(s(&real)));
    // The review saw the worktree's change, not the control root's (which has none).
    let diff = fs::read_to_string(w.loop_dir(&id).join("review/r1.diff")).unwrap_or_default();
    let diffs: String = prompts(&w.loop_dir(&id)).into_iter().map(|(_, t)| t).collect::<String>() + &diff;
    assert!(diffs.contains("version 2"), "the worktree's change is under review:\n{diffs}");

    // The flag wins: with a foreign repository in the environment, the flag's worktree is used and
    // the environment is not even looked at (no NOTE, no refusal).
    let other = w.td.path("other");
    fs::create_dir_all(&other).unwrap();
    git_in(&other, &["init", "-q", "-b", "main"]);
    let r = w
        .mam()
        .args(["loop"])
        .args(args)
        .args(["--worktree", s(&wt)])
        .env("MAM_LOOP_WORKTREE", &other)
        .run_within(LOOP_LIMIT);
    let id = promoted(&r);
    assert!(!r.stderr().contains("MAM_LOOP_WORKTREE"), "{}", r.stderr());
    assert_eq!(w.checkpoint(&id)["source_root"].as_str(), Some(s(&real)));
}

#[test]
fn t02_a_base_that_is_not_an_ancestor_exits_2_and_a_base_in_the_environment_is_ignored() {
    let w = World::new("loop-t02");
    w.creator("cr", "");
    w.reviewer("rv", "PASS", "");
    let task = w.task("Add a line to app.txt.");
    // A child of HEAD that HEAD does not contain.
    let tree = w.git(&["rev-parse", "HEAD^{tree}"]);
    let side = w.git(&["commit-tree", &tree, "-p", "HEAD", "-m", "side"]);
    refused(
        &w,
        &["--creator", "cr", "--reviewer", "rv", "--task-file", s(&task), "--base", &side],
        &[&format!("--base '{side}'"), "not an ancestor"],
    );
    // Never read from the environment: --review-only still lacks a base.
    let env = [("MAM_LOOP_BASE", w.base()), ("BASE", w.base()), ("MAM_BASE", w.base())];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    refused_rc(&w, &env, &["--creator", "cr", "--reviewer", "rv", "--review-only"], 2, &["--review-only", "--base"]);
    // And a loop without --base runs unpinned, whatever base the environment holds (a bad one
    // here: had it been read, the loop would have been refused).
    let r = w
        .mam()
        .args(["loop", "--creator", "cr", "--reviewer", "rv", "--task-file", s(&task)])
        .env("MAM_LOOP_BASE", &side)
        .env("BASE", &side)
        .run_within(LOOP_LIMIT);
    let id = promoted(&r);
    let cp = w.checkpoint(&id);
    assert_eq!((&cp["base"], &cp["base_origin"]), (&Value::Null, &Value::Null), "{cp:#}");
    assert!(cp["review_rounds"][0]["identity"].is_null(), "an unpinned round: {cp:#}");
    for (name, text) in prompts(&w.loop_dir(&id)) {
        assert!(!text.contains("[worktree context]") && !text.contains(&side), "{name}:\n{text}");
    }
}

#[test]
fn t03_review_only_needs_a_base_refuses_a_plan_and_skips_the_implement_phase() {
    let w = World::new("loop-t03");
    w.creator("cr", "");
    w.reviewer("rv", "PASS", "");
    let base = w.base();
    let plan = w.td.write("plan.md", "1. add a line\n");
    let ro = ["--creator", "cr", "--reviewer", "rv", "--review-only"];
    refused(&w, &ro, &["--review-only needs --base"]);
    let with_base = [&ro[..], &["--base", &base]].concat();
    refused(&w, &[&with_base[..], &["--plan"]].concat(), &["--review-only", "--plan"]);
    refused(&w, &[&with_base[..], &["--plan-file", s(&plan)]].concat(), &["--review-only", "--plan-file"]);

    commit_change(&w);
    let app = fs::read_to_string(w.root.join("app.txt")).unwrap();
    let r = w.run_loop(&with_base);
    let id = promoted(&r);
    assert!(
        r.stdout().lines().any(|l| l.starts_with("implement: skipped (--review-only)")),
        "the skip is logged:\n{}",
        r.stdout()
    );
    let cp = w.checkpoint(&id);
    let jobs = cp["jobs"].as_array().unwrap();
    assert!(!jobs.is_empty() && jobs.iter().all(|j| j["role"] == "reviewer" && j["session"] == "rv"), "{cp:#}");
    let names: Vec<String> = prompts(&w.loop_dir(&id)).into_iter().map(|(n, _)| n).collect();
    assert!(names.iter().all(|n| !n.contains("implement")), "{names:?}");
    // The creator was given nothing to do: its script edits app.txt on every job.
    assert_eq!(fs::read_to_string(w.root.join("app.txt")).unwrap(), app);
}

#[test]
fn t14_a_remote_reviewer_is_refused_by_default_before_any_delegation() {
    let w = World::new("loop-t14");
    w.creator("cr", "");
    remote_row(&w, "far");
    let task = w.task("Add a line to app.txt.");
    let base = w.base();
    let args = ["--creator", "cr", "--reviewer", "far", "--task-file", s(&task), "--base", &base];
    refused(&w, &args, &["reviewer far is a remote session", "--remote-review diff-only"]);
    refused(&w, &[&args[..], &["--remote-review", "refuse"]].concat(), &["reviewer far", "--remote-review diff-only"]);
    // Unpinned too: still refused, before anything else is tried.
    refused(&w, &args[..6], &["reviewer far", "--remote-review diff-only"]);
}

#[test]
fn t23_a_second_loop_for_a_busy_creator_exits_3_naming_the_holder() {
    let w = World::new("loop-t23");
    w.creator("cr", "work_s=30");
    w.reviewer("rv", "PASS", "");
    let task = w.task("Add a line to app.txt.");
    let args = ["--creator", "cr", "--reviewer", "rv", "--task-file", s(&task)];
    let lock_path = w.root.join(".mam/loop/cr.lock");

    // A lock held by someone else (here: the test) refuses with exit 3, naming the holder it records.
    fs::create_dir_all(lock_path.parent().unwrap()).unwrap();
    fs::write(&lock_path, "0badf00d\n").unwrap();
    let held =
        mam::sys::Flock::try_acquire(mam::sys::open_lock_file(&lock_path).unwrap(), mam::sys::LockMode::Exclusive)
            .unwrap()
            .expect("the test holds the lock");
    refused_rc(&w, &[], &args, 3, &["creator cr is busy", "loop 0badf00d holds", s(&lock_path)]);
    assert!(w.loop_ids().is_empty());
    drop(held);

    // A real first loop holds it for its whole run: the second one names that loop.
    let mut first = w.spawn_loop(&args);
    first.wait_stdout("implement · implementer cr", Duration::from_secs(30));
    let id = first.stdout().lines().find_map(|l| l.strip_prefix("loop ")?.split(':').next()).unwrap().to_string();
    assert_eq!(fs::read_to_string(&lock_path).unwrap(), format!("{id}\n"));
    // The implement job is registered by its delegate-job child: wait until it runs, so nothing
    // but the second loop could add a record now.
    let creator_jid = w.checkpoint(&id)["creator_jid"].as_str().unwrap().to_string();
    wait_until("the implement job runs", Duration::from_secs(30), || {
        fs::read(w.registry().join(format!("{creator_jid}.json")))
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .is_some_and(|v| v["status"] == "running")
    });
    let before = (w.loop_ids(), fs::read(&lock_path).unwrap());
    let mut jobs = w.job_ids();
    jobs.sort();
    let r = w.run_loop(&args);
    assert_eq!(r.rc(), 3, "{}\n{}", r.stdout(), r.stderr());
    assert_eq!(r.stdout(), "");
    let err = r.stderr();
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].starts_with("ERROR: loop: creator cr is busy: loop ") && lines[0].contains(&id), "{}", lines[0]);
    assert_eq!((w.loop_ids(), fs::read(&lock_path).unwrap()), before);
    let mut after = w.job_ids();
    after.sort();
    assert_eq!(after, jobs, "the refused loop registered nothing");
    first.signal(libc::SIGTERM);
    let (rc, _) = first.wait(Duration::from_secs(30));
    assert_eq!((rc, last_line(&first.stdout()).1.as_str()), (1, "interrupted"), "{}", first.stderr());
}

#[test]
fn t27_mam_loop_py_0_prints_the_note_and_the_one_runner_runs() {
    let w = World::new("loop-t27");
    w.creator("cr", "");
    w.reviewer("rv", "PASS", "");
    let task = w.task("Add a line to app.txt.");
    let note = "NOTE: loop: MAM_LOOP_PY=0 selects nothing: mam has one loop runner";
    let r = w
        .mam()
        .args(["loop", "--creator", "cr", "--reviewer", "rv", "--task-file", s(&task)])
        .env("MAM_LOOP_PY", "0")
        .run_within(LOOP_LIMIT);
    promoted(&r);
    assert_eq!(r.stderr().lines().filter(|l| *l == note).count(), 1, "{}", r.stderr());
    // Any other value selects nothing either, silently.
    let err = refused_rc(
        &w,
        &[("MAM_LOOP_PY", "1")],
        &["--creator", "ghost", "--self-review", "--task-file", s(&task)],
        2,
        &["'ghost'"],
    );
    assert!(!err.contains("MAM_LOOP_PY"), "{err}");
}

#[test]
fn t28_remote_review_diff_only_without_a_base_exits_2() {
    let w = World::new("loop-t28");
    w.creator("cr", "");
    w.reviewer("rv", "PASS", "");
    remote_row(&w, "far");
    let task = w.task("Add a line to app.txt.");
    for reviewer in ["far", "rv"] {
        refused(
            &w,
            &["--creator", "cr", "--reviewer", reviewer, "--task-file", s(&task), "--remote-review", "diff-only"],
            &["--remote-review", "--base"],
        );
    }
}

#[test]
fn a41_bad_session_lists_and_flags_exit_2_before_the_lock() {
    let w = World::new("loop-a41");
    w.creator("cr", "");
    w.reviewer("rv", "PASS", "");
    w.reviewer("gone", "PASS", "");
    w.mam().args(["stop", "gone"]).run().expect_rc(0);
    let task = w.task("Add a line to app.txt.");
    let t = s(&task);
    let base = w.base();
    let plan = w.td.write("plan.md", "1. add a line\n");
    let empty = w.td.write("empty-plan.md", "");
    let blank = w.td.write("blank-plan.md", " \n\t\n");
    let missing = w.td.path("no-plan.md");
    let cases: Vec<(Vec<&str>, Vec<String>)> = vec![
        (
            vec!["--creator", "cr", "--reviewer", "cr", "--task-file", t],
            vec!["the creator cr is also listed as a reviewer".into()],
        ),
        (
            vec!["--creator", "cr", "--reviewer", "rv", "--reviewer", "rv", "--task-file", t],
            vec!["reviewer rv is listed twice".into()],
        ),
        (
            vec!["--creator", "cr", "--reviewer", "gone", "--task-file", t],
            vec!["reviewer gone is stopped, not running".into()],
        ),
        (
            vec!["--creator", "gone", "--reviewer", "rv", "--task-file", t],
            vec!["the creator gone is stopped, not running".into()],
        ),
        (
            vec!["--creator", "cr", "--self-review", "--task-file", t, "--review-isolation", "env"],
            vec!["--review-isolation needs --worktree or --base".into()],
        ),
        (
            vec!["--creator", "cr", "--self-review", "--task-file", t, "--remote-review", "diff-only"],
            vec!["--remote-review needs --worktree or --base".into()],
        ),
        (
            vec!["--creator", "cr", "--self-review", "--task-file", t, "--max-rounds", "0"],
            vec!["--max-rounds".into(), "'0'".into()],
        ),
        (
            vec!["--creator", "cr", "--self-review", "--task-file", t, "--plan", "--plan-file", s(&plan)],
            vec!["--plan".into(), "--plan-file".into(), "not both".into()],
        ),
        (
            vec!["--creator", "cr", "--self-review", "--task-file", t, "--plan-file", s(&empty)],
            vec![format!("--plan-file {}: the file is empty", s(&empty))],
        ),
        (
            vec!["--creator", "cr", "--self-review", "--task-file", t, "--plan-file", s(&blank)],
            vec![format!("--plan-file {}: the file is empty", s(&blank))],
        ),
        (
            vec!["--creator", "cr", "--self-review", "--task-file", t, "--plan-file", s(&missing)],
            vec![format!("--plan-file {}: cannot read", s(&missing))],
        ),
        (
            vec![
                "--creator",
                "cr",
                "--reviewer",
                "rv",
                "--task-file",
                t,
                "--base",
                &base,
                "--review-isolation",
                "sandbox",
            ],
            vec!["--review-isolation".into(), "'sandbox'".into()],
        ),
    ];
    for (args, names) in &cases {
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        refused(&w, args, &names);
    }
}

#[test]
fn bad_input_a_task_file_missing_empty_binary_or_10_mb_exits_2_naming_it() {
    let w = World::new("loop-badtask");
    w.creator("cr", "");
    w.reviewer("rv", "PASS", "");
    let missing = w.td.path("absent-task.md");
    let empty = w.td.write("empty-task.md", "");
    let blank = w.td.write("blank-task.md", "\n  \n");
    let binary = w.td.write("binary-task.md", b"add a line\0\x01\x02 to app.txt\n");
    let latin1 = w.td.write("latin1-task.md", b"caf\xe9\n");
    let big = w.td.write("big-task.md", "add a line to app.txt\n".repeat(10 * 1024 * 1024 / 22 + 1));
    assert!(fs::metadata(&big).unwrap().len() >= 10 * 1024 * 1024);
    let dir = w.td.path("tmp");
    for (file, why) in [
        (&missing, "cannot read"),
        (&empty, "the file is empty"),
        (&blank, "the file is empty"),
        (&binary, "a binary file (NUL bytes)"),
        (&latin1, "not UTF-8 text"),
        (&big, "cannot read"),
        (&dir, "cannot read"),
    ] {
        refused(
            &w,
            &["--creator", "cr", "--reviewer", "rv", "--task-file", s(file)],
            &[&format!("--task-file {}: {why}", s(file))],
        );
    }
    // --task-file is required unless --review-only.
    refused(&w, &["--creator", "cr", "--reviewer", "rv"], &["--task-file"]);
}

#[test]
fn bad_input_a_remote_creator_and_unknown_sessions_exit_2_naming_them() {
    let w = World::new("loop-badsess");
    w.creator("cr", "");
    remote_row(&w, "far");
    let task = w.task("Add a line to app.txt.");
    let t = s(&task);
    refused(&w, &["--creator", "far", "--self-review", "--task-file", t], &["the creator far is a remote session"]);
    refused(
        &w,
        &["--creator", "ghost", "--self-review", "--task-file", t],
        &["unknown session 'ghost'", "agent_sessions.json"],
    );
    refused(&w, &["--creator", "cr", "--reviewer", "ghost", "--task-file", t], &["unknown session 'ghost'"]);
    // Names that cannot be sessions, a remote address among them, are refused while parsing.
    refused(&w, &["--creator", "cr", "--reviewer", "remote:far", "--task-file", t], &["'remote:far'"]);
    refused(&w, &["--creator", "Not A Name", "--self-review", "--task-file", t], &["'Not A Name'"]);
    refused(&w, &["--task-file", t], &["--creator"]);
}

#[test]
fn bad_input_a_base_that_is_not_a_commit_exits_2_and_a_tag_or_a_short_sha_works() {
    let w = World::new("loop-badbase");
    w.creator("cr", "");
    w.reviewer("rv", "PASS", "");
    let base = w.base();
    let tree = w.git(&["rev-parse", "HEAD^{tree}"]);
    let blob = w.git(&["rev-parse", "HEAD:app.txt"]);
    w.git(&["tag", "-a", "v1", "-m", "v1"]);
    w.git(&["tag", "light"]);
    commit_change(&w);
    let ro = |b: &str| -> Vec<String> {
        ["--creator", "cr", "--reviewer", "rv", "--review-only", "--base", b].map(String::from).to_vec()
    };
    for bad in [tree.as_str(), blob.as_str(), "no-such-branch", "HEAD~5", "-x", "main:app.txt", "a b"] {
        let a = ro(bad);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        refused(&w, &a, &[&format!("--base '{bad}': not a commit")]);
    }
    refused(&w, &["--creator", "cr", "--self-review", "--review-only", "--base", ""], &["--base"]);
    // A value with a line break is still one line, escaped.
    refused(&w, &ro("v1\nmain").iter().map(String::as_str).collect::<Vec<_>>(), &["--base 'v1\\nmain': not a commit"]);
    for (good, origin) in
        [("v1", "--base v1"), ("light", "--base light"), (&base[..7], &format!("--base {}", &base[..7]))]
    {
        let a = ro(good);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        let id = promoted(&w.run_loop(&a));
        let cp = w.checkpoint(&id);
        assert_eq!((cp["base"].as_str(), cp["base_origin"].as_str()), (Some(base.as_str()), Some(origin)), "{cp:#}");
        assert_eq!(cp["review_rounds"][0]["identity"]["base"].as_str(), Some(base.as_str()));
    }
}

#[test]
fn bad_input_a_worktree_path_with_spaces_and_quotes_works() {
    let w = World::new("loop-quotes");
    w.creator("cr", "");
    w.reviewer("rv", "PASS", "");
    let wt = w.td.path("it's a \"work tree\" $HOME `x`");
    linked_worktree(&w, &wt, "feat");
    let base = w.base();
    let r =
        w.run_loop(&["--creator", "cr", "--reviewer", "rv", "--review-only", "--base", &base, "--worktree", s(&wt)]);
    let id = promoted(&r);
    let cp = w.checkpoint(&id);
    assert_eq!(cp["source_root"].as_str(), Some(s(&wt.canonicalize().unwrap())));
    let ctx: Vec<(String, String)> =
        prompts(&w.loop_dir(&id)).into_iter().filter(|(n, _)| n.ends_with(".context.md")).collect();
    assert!(!ctx.is_empty());
    let head = git_in(&wt, &["rev-parse", "HEAD"]);
    assert_eq!(cp["review_rounds"][0]["identity"]["head"].as_str(), Some(head.as_str()), "{cp:#}");
    assert!(w.review_trees().is_empty());
    // Reviewers working in that source root (env isolation) are given the path intact.
    let r = w.run_loop(&[
        "--creator",
        "cr",
        "--reviewer",
        "rv",
        "--review-only",
        "--base",
        &base,
        "--worktree",
        s(&wt),
        "--review-isolation",
        "env",
    ]);
    let id = promoted(&r);
    let cp = w.checkpoint(&id);
    assert_eq!(cp["review_rounds"][0]["reviewers"][0]["evidence"], "source-tree", "{cp:#}");
    let text: String = prompts(&w.loop_dir(&id)).into_iter().map(|(_, t)| t).collect();
    assert!(text.contains(s(&wt.canonicalize().unwrap())), "{text}");
}

#[test]
fn a37_loop_status_shows_a_finished_loop_and_prune_keeps_a_running_one() {
    let w = World::new("loop-admin");
    w.creator("cr", "");
    w.reviewer("rv", "PASS", "");
    w.creator("slow", "work_s=30");
    let task = w.task("Add a line to app.txt.");
    // No loop yet.
    let r = w.mam().args(["loop", "status"]).run();
    assert_eq!((r.rc(), r.stderr().lines().count()), (1, 1), "{}", r.stderr());
    assert!(r.stderr().starts_with("ERROR: loop status: no loop under "), "{}", r.stderr());
    let r = w.mam().args(["loop", "prune", "--older-than", "0"]).run();
    r.expect_rc(0);
    assert!(r.stdout().starts_with("nothing to prune"), "{}", r.stdout());

    let done = promoted(&w.run_loop(&["--creator", "cr", "--reviewer", "rv", "--task-file", s(&task)]));
    let cp = w.checkpoint(&done);
    let jobs = cp["jobs"].as_array().unwrap();
    assert!(jobs.len() >= 2, "{cp:#}");

    // The newest loop, and the same loop by id: outcome, each job with its record's live status.
    for args in [vec!["loop", "status"], vec!["loop", "status", done.as_str()]] {
        let r = w.mam().args(&args).run();
        r.expect_rc(0);
        let out = r.stdout();
        assert!(out.starts_with(&format!("loop {done}: finished: promoted (rc 0)\n")), "{out}");
        assert!(out.lines().any(|l| l.starts_with("  phase done, round 1 of 3, started ")), "{out}");
        for j in jobs {
            let (jid, role, session) =
                (j["jid"].as_str().unwrap(), j["role"].as_str().unwrap(), j["session"].as_str().unwrap());
            let status = w.record(jid)["status"].as_str().unwrap().to_string();
            assert!(
                out.lines().any(|l| l.contains(&format!("{role} {session} job {jid}: "))
                    && l.contains(&format!("(record now {status}; last evidence "))
                    && l.ends_with(" s ago)")),
                "job {jid} ({role} {session}, record {status}) in:\n{out}"
            );
        }
        assert!(out.contains(&format!("checkpoint: {}", s(&w.loop_dir(&done).join("checkpoint.json")))), "{out}");
    }
    let r = w.mam().args(["loop", "status", &done, "--json"]).run();
    r.expect_rc(0);
    let json: Value = serde_json::from_str(&r.stdout()).unwrap();
    assert_eq!(json, cp);
    let r = w.mam().args(["loop", "status", "0123abcd"]).run();
    assert_eq!(r.rc(), 1, "{}", r.stderr());
    assert_eq!(r.stderr().lines().count(), 1, "{}", r.stderr());
    assert!(r.stderr().starts_with("ERROR: loop status: no loop 0123abcd"), "{}", r.stderr());
    let r = w.mam().args(["loop", "status", "nothex!!"]).run();
    assert_eq!(r.rc(), 2, "{}", r.stderr());
    assert!(r.stderr().contains("'nothex!!'"), "{}", r.stderr());

    // A running loop: shown as running, kept by prune; the finished one is removed.
    let mut running = w.spawn_loop(&["--creator", "slow", "--self-review", "--task-file", s(&task)]);
    running.wait_stdout("implement · implementer slow", Duration::from_secs(30));
    let id = running.stdout().lines().find_map(|l| l.strip_prefix("loop ")?.split(':').next()).unwrap().to_string();
    let r = w.mam().args(["loop", "status", &id]).run();
    r.expect_rc(0);
    assert!(r.stdout().starts_with(&format!("loop {id}: running\n")), "{}", r.stdout());
    let r = w.mam().args(["loop", "prune", "--older-than", "0"]).run();
    r.expect_rc(0);
    assert!(r.stdout().lines().any(|l| l == format!("removed {}", s(&w.loop_dir(&done)))), "{}", r.stdout());
    assert!(
        r.stdout().lines().any(|l| l == format!("kept {} (the loop is running)", s(&w.loop_dir(&id)))),
        "{}",
        r.stdout()
    );
    assert_eq!(w.loop_ids(), vec![id.clone()]);
    // An age keeps every loop younger than it.
    let r = w.mam().args(["loop", "prune", "--older-than", "3600"]).run();
    r.expect_rc(0);
    assert!(r.stdout().starts_with("nothing to prune"), "{}", r.stdout());

    running.signal(libc::SIGTERM);
    let (rc, _) = running.wait(Duration::from_secs(30));
    assert_eq!(rc, 1, "{}", running.stderr());
    // Interrupted is finished: pruned now.
    let r = w.mam().args(["loop", "prune", "--older-than", "0"]).run();
    r.expect_rc(0);
    assert!(w.loop_ids().is_empty(), "{}", r.stdout());
}

#[test]
fn loop_help_names_every_flag_and_variable_of_the_orch_4_1_table() {
    let spec = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/spec/ORCH.md")).unwrap();
    let table = spec.split("### 4.1").nth(1).unwrap().split("### 4.2").next().unwrap();
    let mut names = Vec::new();
    for row in table.lines().filter(|l| l.starts_with("| ")) {
        for cell in row.split('|').skip(1).take(2) {
            for tick in cell.split('`').skip(1).step_by(2) {
                let word = tick.split([' ', '|']).next().unwrap();
                if word.starts_with("--") || word.starts_with("MAM_") {
                    names.push(word.to_string());
                }
            }
        }
    }
    assert!(names.len() >= 20, "the table was read: {names:?}");
    let td = TestDir::new("loop-help");
    let r = td.mam().args(["loop", "--help"]).run();
    r.expect_rc(0);
    let help = r.stdout();
    // As a whole word: `--plan` inside `--plan-file` does not count.
    let word = |n: &str| {
        help.match_indices(n).any(|(i, _)| {
            let next = help[i + n.len()..].chars().next().unwrap_or(' ');
            let prev = help[..i].chars().next_back().unwrap_or(' ');
            let joined = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
            !joined(next) && !joined(prev)
        })
    };
    let missing: Vec<&String> = names.iter().filter(|n| !word(n)).collect();
    assert!(missing.is_empty(), "mam loop --help does not mention {missing:?}:\n{help}");
    for word in ["mam loop status", "mam loop prune", "--older-than", "tree|env", "refuse|diff-only", "Exit codes"] {
        assert!(help.contains(word), "{word:?} in:\n{help}");
    }
    for code in ["0 promoted", "1 any failure", "2 validation", "3 another loop holds the creator's lock"] {
        assert!(help.replace('\n', " ").contains(code), "{code:?} in:\n{help}");
    }
}

/// A task file reached through a symlink is the user's own input: it is read (only writes never
/// follow a link, docs/DESIGN.md "The review loop").
#[test]
fn a_task_file_behind_a_symlink_is_read() {
    let w = World::new("loop-task-link");
    w.creator("cr", "");
    w.reviewer("rv", "PASS", "");
    let task = w.task("Add a line to app.txt.");
    let link = w.td.path("task-link.md");
    std::os::unix::fs::symlink(&task, &link).unwrap();
    let base = w.base();
    let r = w.run_loop(&["--creator", "cr", "--reviewer", "rv", "--task-file", s(&link), "--base", &base]);
    promoted(&r);
}

/// 4.3: the loop passes `--parent` explicitly: run inside a job (its `MAM_PARENT_JOB_ID`), every
/// delegation is that job's sub-job; an invalid value is exit 2 before anything starts.
#[test]
fn a_loop_run_inside_a_job_makes_every_delegation_its_sub_job() {
    let w = World::new("loop-parent");
    w.creator("cr", "");
    w.reviewer("rv", "PASS", "");
    let r = w.mam().args(["registry", "register", "--session", "outer"]).run();
    r.expect_rc(0);
    let outer = r.stdout().trim().to_string();
    let task = w.task("Add a line to app.txt.");
    let base = w.base();
    let r = w
        .mam()
        .env("MAM_PARENT_JOB_ID", &outer)
        .args(["loop", "--creator", "cr", "--reviewer", "rv", "--task-file", s(&task), "--base", &base])
        .run_within(LOOP_LIMIT);
    let id = promoted(&r);
    let cp = w.checkpoint(&id);
    for j in cp["jobs"].as_array().unwrap() {
        let rec = w.record(j["jid"].as_str().unwrap());
        assert_eq!(rec["parent_job_id"], outer.as_str(), "{rec}");
    }
    let r = w
        .mam()
        .env("MAM_PARENT_JOB_ID", "no/such")
        .args(["loop", "--creator", "cr", "--reviewer", "rv", "--task-file", s(&task)])
        .run();
    r.expect_rc(2);
    assert!(r.stderr().contains("MAM_PARENT_JOB_ID: invalid job id 'no/such'"), "{}", r.stderr());
}
