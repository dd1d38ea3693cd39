//! ORCH 4.9: the review rounds with real git and fake agents: prompts and their context blocks
//! against golden fixtures (test 4), the empty-change guard (5, 29), the frozen collector (6),
//! pinning (7), refusals (8, 10), review trees (9), staleness (11), the pre-promotion re-check
//! (12), promotion and sidecars (13), self-review (15), identity mismatch (24), challenge and comply
//! (25).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use mam::review::prompt::{self, Change, Review};
use serde_json::json;

use super::*;

/// The golden prompt templates (4.9 test 4): `MAM_UPDATE_FIXTURES=1` rewrites them.
const FIXTURES: &str = "tests/fixtures/loop_prompts";

/// The fixed task every prompt fixture and the integration runs use.
const TASK: &str = "TASK";

fn fixture_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(FIXTURES).join(name)
}

fn updating() -> bool {
    std::env::var_os("MAM_UPDATE_FIXTURES").is_some_and(|v| v == "1")
}

/// Compares `got` with the fixture byte for byte (or rewrites it under `MAM_UPDATE_FIXTURES=1`).
fn golden(name: &str, got: &str) {
    let p = fixture_path(name);
    if updating() {
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, got).unwrap();
        return;
    }
    let want =
        fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}; run with MAM_UPDATE_FIXTURES=1 to write it", p.display()));
    assert!(
        want == got.as_bytes(),
        "prompt differs from {FIXTURES}/{name} (MAM_UPDATE_FIXTURES=1 rewrites it)\n--- fixture\n{}--- now\n{got}",
        String::from_utf8_lossy(&want)
    );
}

fn review_of(change: Change) -> Review<'static> {
    Review {
        round: 1,
        task: Some(TASK),
        change,
        subjobs: None,
        challenged: &[],
        pinned: false,
        own: false,
        env_tmpdir: None,
    }
}

fn unpinned() -> Change {
    Change::Unpinned { root: "ROOT".into(), creator_report: "CREATOR_REPORT".into() }
}

/// Every prompt template with fixed inputs: (fixture name, text).
fn templates() -> Vec<(&'static str, String)> {
    let challenged = [(1, "REASON".to_string())];
    let pinned = Change::DiffFile { diff: "DIFF".into(), tree: "TREE".into() };
    vec![
        // The flag-less forms.
        ("plan.md", prompt::plan(TASK)),
        ("plan_revision.md", prompt::plan_revision(TASK, 1, "FINDINGS")),
        ("plan_review.md", prompt::plan_review(TASK, 1, "PLAN", false)),
        ("plan_self_review.md", prompt::plan_review(TASK, 1, "PLAN", true)),
        ("implement.md", prompt::implement(TASK, None)),
        ("implement_with_plan.md", prompt::implement(TASK, Some("PLAN"))),
        ("review.md", prompt::review(&review_of(unpinned()))),
        ("self_review.md", prompt::review(&Review { own: true, ..review_of(unpinned()) })),
        (
            "review_round2.md",
            prompt::review(&Review {
                round: 2,
                subjobs: Some("SUBJOBS"),
                challenged: &challenged,
                ..review_of(unpinned())
            }),
        ),
        ("correction.md", prompt::correction(Some(TASK), 1, "FINDINGS")),
        ("comply.md", prompt::comply(Some(TASK), 2, "- rv:1: SUSTAINED", Some("FINDINGS"))),
        ("comply_no_new.md", prompt::comply(Some(TASK), 2, "- rv:1: SUSTAINED", None)),
        // The bodies of pinned rounds (the blocks go to the context file).
        ("review_pinned.md", prompt::review(&Review { pinned: true, ..review_of(pinned.clone()) })),
        (
            "review_pinned_env.md",
            prompt::review(&Review { pinned: true, env_tmpdir: Some("ENV_TMPDIR"), ..review_of(pinned.clone()) }),
        ),
        (
            "review_remote_no_task.md",
            prompt::review(&Review {
                pinned: true,
                task: None,
                ..review_of(Change::Inline { diff: "+DIFF\n".into() })
            }),
        ),
        ("correction_no_task.md", prompt::correction(None, 1, "FINDINGS")),
    ]
}

/// 4.9 test 4 (A37): the prompt templates are golden fixtures, byte for byte; the blocks are never
/// part of a body.
#[test]
fn t04_prompt_templates_are_golden_fixtures() {
    let all = templates();
    for (name, text) in &all {
        let header = |l: &str| l == "[worktree context]" || l == "[review identity]";
        assert!(!text.lines().any(header), "{name}: a block in a body: {text}");
        golden(name, text);
    }
    if !updating() {
        // No fixture is left without a template.
        let mut on_disk: Vec<String> = fs::read_dir(fixture_path(""))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        on_disk.sort();
        let mut named: Vec<String> = all.iter().map(|(n, _)| n.to_string()).collect();
        named.sort();
        assert_eq!(on_disk, named, "fixtures without a template under {FIXTURES}");
    }
}

// ---- helpers ----------------------------------------------------------------------------------

fn s(v: &Value) -> String {
    v.as_str().unwrap_or_else(|| panic!("not a string: {v}")).to_string()
}

/// A run's last line, asserting rc and outcome (both streams shown otherwise).
fn expect(r: &Run, rc: i32, outcome: &str) -> String {
    let (id, o, lrc, _) = last_line(&r.stdout());
    assert_eq!((r.rc(), lrc, o.as_str()), (rc, rc, outcome), "--- stdout\n{}--- stderr\n{}", r.stdout(), r.stderr());
    id
}

/// The roles of the loop's delegations, in dispatch order.
fn roles(cp: &Value) -> Vec<String> {
    cp["jobs"].as_array().unwrap().iter().map(|j| s(&j["role"])).collect()
}

/// The prompt body and context file the loop wrote for `name` (`implement-cr`, `r1-review-rv`, ...).
fn prompt_files(dir: &Path, name: &str) -> (String, Option<String>) {
    let all = prompts(dir);
    let body = all
        .iter()
        .find(|(f, _)| f.ends_with(&format!("-{name}.md")) && f.len() == name.len() + 6)
        .unwrap_or_else(|| panic!("no prompt {name} in {:?}", all.iter().map(|p| &p.0).collect::<Vec<_>>()));
    let ctx = all.iter().find(|(f, _)| f.ends_with(&format!("-{name}.context.md")) && f.len() == name.len() + 14);
    (body.1.clone(), ctx.map(|c| c.1.clone()))
}

/// Every file under `<control root>/.agents/reports`, relative to it.
fn promoted(w: &World) -> Vec<String> {
    let dir = w.root.join(".agents/reports");
    let mut v = tree(&dir);
    v.retain(|p| dir.join(p).is_file());
    v
}

fn read_json(p: &Path) -> Value {
    serde_json::from_slice(&fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))).unwrap()
}

fn reviewer_records(w: &World, cp: &Value) -> Vec<String> {
    let creator = s(&cp["creator_jid"]);
    w.job_ids().into_iter().filter(|j| *j != creator).collect()
}

/// A task file holding the fixture task, so an implement body equals the fixture.
fn task(w: &World) -> String {
    w.task(&format!("{TASK}\n")).display().to_string()
}

/// The `[worktree context]` the loop writes for these facts.
fn context(path: &str, head: &str, base: &str, origin: &str, uncommitted: bool) -> String {
    prompt::context_block(&prompt::Context {
        path: path.into(),
        branch: Some("main".into()),
        head: head.into(),
        base: base.into(),
        base_origin: origin.into(),
        commits: 0,
        uncommitted,
    })
}

fn identity(cp: &Value, round: usize) -> String {
    let r = &cp["review_rounds"][round];
    prompt::identity_block(&prompt::Identity {
        loop_id: s(&cp["loop_id"]),
        base: s(&r["identity"]["base"]),
        head: s(&r["identity"]["head"]),
        tree: s(&r["identity"]["tree"]),
        snapshot_commit: s(&r["snapshot_commit"]),
    })
}

/// 4.9 test 4 (A37), pinned with `--base`: every prompt file has its context file; the context is
/// the `[worktree context]` block (and `[review identity]` for a review), the body the flag-less
/// template for the same inputs; the delegated brief shows the block, then `## Task` and the body.
#[test]
fn t04_a_pinned_run_puts_the_block_before_every_flagless_body() {
    let w = World::new("rounds-t4-pinned");
    w.creator("cr", "");
    w.reviewer("rv", "PASS", "verdict@1=NOT PASS\nreport_text@1=1. app.txt: wrong line\n");
    let base = w.base();
    let t = task(&w);
    let r = w.run_loop(&["--creator", "cr", "--reviewer", "rv", "--task-file", &t, "--base", &base]);
    let id = expect(&r, 0, "promoted");
    let cp = w.checkpoint(&id);
    assert_eq!(roles(&cp), ["implementer", "reviewer", "corrector", "reviewer"]);
    let dir = w.loop_dir(&id);
    let src = s(&cp["source_root"]);
    let origin = format!("--base {base}");
    let tmp = w.td.path("tmp");
    let task_text = format!("{TASK}\n");

    // Every body has its context file, and every context opens with the block.
    let all = prompts(&dir);
    let bodies: Vec<&String> = all.iter().map(|p| &p.0).filter(|n| !n.ends_with(".context.md")).collect();
    assert_eq!(bodies.len(), 4, "{bodies:?}");
    for b in &bodies {
        let c = b.replace(".md", ".context.md");
        let ctx = &all.iter().find(|p| p.0 == c).unwrap_or_else(|| panic!("{b} has no {c}")).1;
        assert!(ctx.starts_with("[worktree context]\n"), "{c}: {ctx}");
    }

    // implement: block + the flag-less body, which is the golden fixture itself.
    let (body, ctx) = prompt_files(&dir, "implement-cr");
    assert_eq!(body.as_bytes(), fs::read(fixture_path("implement.md")).unwrap(), "implement body");
    assert_eq!(body, prompt::implement(&task_text, None));
    assert_eq!(ctx.as_deref(), Some(context(&src, &base, &base, &origin, false).as_str()));

    // The reviews: the block naming the review tree, the identity block, the pinned body.
    for (round, uncommitted) in [(1usize, true), (2, true)] {
        let tree = tmp.join(format!("mam-review-{id}-r{round}")).display().to_string();
        let diff = dir.join(format!("review/r{round}.diff")).display().to_string();
        let (body, ctx) = prompt_files(&dir, &format!("r{round}-review-rv"));
        let want_body = prompt::review(&Review {
            round: round as u32,
            task: Some(&task_text),
            change: Change::DiffFile { diff, tree: tree.clone() },
            subjobs: None,
            challenged: &[],
            pinned: true,
            own: false,
            env_tmpdir: None,
        });
        assert_eq!(body, want_body, "round {round} review body");
        let want_ctx = format!("{}{}", context(&tree, &base, &base, &origin, uncommitted), identity(&cp, round - 1));
        assert_eq!(ctx.as_deref(), Some(want_ctx.as_str()), "round {round} review context");
        if round == 2 {
            // The brief of the reviewer's record is its last dispatch: the block, then the task.
            let jid = s(&cp["review_rounds"][1]["reviewers"][0]["jid"]);
            let brief = fs::read_to_string(w.registry().join(&jid).join("brief.md")).unwrap();
            let want = format!("{}\n\n## Task\n\n{}", want_ctx.trim_end(), want_body.trim_end_matches('\n'));
            assert!(brief.contains(&want), "brief of {jid} lacks block + body:\n{brief}");
        }
    }

    // The correction: the block (the source, now with changes) + the flag-less body.
    let findings = dir.join("review/r1/findings.md").display().to_string();
    let (body, ctx) = prompt_files(&dir, "r1-corrector-cr");
    let want_body = prompt::correction(Some(&task_text), 1, &findings);
    assert_eq!(body, want_body);
    let want_ctx = context(&src, &base, &base, &origin, true);
    assert_eq!(ctx.as_deref(), Some(want_ctx.as_str()));
    let brief = fs::read_to_string(w.registry().join(s(&cp["creator_jid"])).join("brief.md")).unwrap();
    let at_block = brief.find("[worktree context]").expect("brief without the block");
    assert!(at_block < brief.find("## Task").unwrap(), "{brief}");
    let want = format!("{}\n\n## Task\n\n{}", want_ctx.trim_end(), want_body.trim_end_matches('\n'));
    assert!(brief.contains(&want), "creator brief lacks block + body:\n{brief}");
    assert_eq!(brief.matches("## Task\n").count(), 1, "one task heading in the brief:\n{brief}");
}

/// 4.9 test 4 with `--worktree` alone: the base is the merge-base, every prompt opens with the block
/// naming the worktree and its branch.
#[test]
fn t04_a_worktree_run_puts_the_block_in_every_prompt() {
    let w = World::new("rounds-t4-wt");
    let wt = w.td.path("wt-feature");
    w.git(&["worktree", "add", "-q", "-b", "feature", wt.to_str().unwrap()]);
    w.session("cr", &format!("work_s=0.2\nedit={}\n", wt.join("app.txt").display()));
    w.reviewer("rv", "PASS", "");
    let t = task(&w);
    let r = w.run_loop(&["--creator", "cr", "--reviewer", "rv", "--task-file", &t, "--worktree", wt.to_str().unwrap()]);
    let id = expect(&r, 0, "promoted");
    let cp = w.checkpoint(&id);
    let real = wt.canonicalize().unwrap().display().to_string();
    assert_eq!(s(&cp["source_root"]), real);
    let all = prompts(&w.loop_dir(&id));
    let bodies: Vec<&(String, String)> = all.iter().filter(|p| !p.0.ends_with(".context.md")).collect();
    assert_eq!(bodies.len(), 2);
    for (b, text) in bodies {
        let c = b.replace(".md", ".context.md");
        let ctx = &all.iter().find(|p| p.0 == c).unwrap_or_else(|| panic!("{b} has no {c}")).1;
        assert!(ctx.starts_with("[worktree context]\npath: "), "{ctx}");
        assert!(ctx.contains("\nbranch: feature\n"), "{ctx}");
        assert!(ctx.contains(&format!("\nbase: {}\n", w.base())), "{ctx}");
        assert!(ctx.contains("\nbase_origin: merge-base of "), "{ctx}");
        assert!(!text.contains("[worktree context]"), "{b}: the block is not part of the body");
    }
    let (body, ctx) = prompt_files(&w.loop_dir(&id), "implement-cr");
    assert!(ctx.unwrap().contains(&format!("path: {real}\n")));
    assert_eq!(body.as_bytes(), fs::read(fixture_path("implement.md")).unwrap());
}

/// 4.9 test 4 without `--worktree`/`--base`: no context file, every body is the flag-less template
/// (the implement body the fixture itself), and no brief carries a block.
#[test]
fn t04_an_unflagged_run_has_no_block_and_the_flagless_bodies() {
    let w = World::new("rounds-t4-flagless");
    w.creator("cr", "");
    w.reviewer("rv", "PASS", "verdict@1=NOT PASS\nreport_text@1=1. app.txt: wrong line\n");
    let t = task(&w);
    let r = w.run_loop(&["--creator", "cr", "--reviewer", "rv", "--task-file", &t]);
    let id = expect(&r, 0, "promoted");
    let cp = w.checkpoint(&id);
    assert_eq!(roles(&cp), ["implementer", "reviewer", "corrector", "reviewer"]);
    let dir = w.loop_dir(&id);
    let all = prompts(&dir);
    assert!(all.iter().all(|p| !p.0.ends_with(".context.md")), "{:?}", all.iter().map(|p| &p.0).collect::<Vec<_>>());
    assert!(all.iter().all(|p| !p.1.lines().any(|l| l == "[worktree context]" || l == "[review identity]")));
    let task_text = format!("{TASK}\n");
    let src = s(&cp["source_root"]);

    let (body, ctx) = prompt_files(&dir, "implement-cr");
    assert_eq!(ctx, None);
    assert_eq!(body.as_bytes(), fs::read(fixture_path("implement.md")).unwrap(), "implement body");
    let reports = [dir.join("review/implement/cr.md"), dir.join("review/r1/cr.corrector.md")];
    for (round, report) in [(1u32, &reports[0]), (2, &reports[1])] {
        let (body, ctx) = prompt_files(&dir, &format!("r{round}-review-rv"));
        assert_eq!(ctx, None);
        let want = prompt::review(&Review {
            round,
            task: Some(&task_text),
            change: Change::Unpinned { root: src.clone(), creator_report: report.display().to_string() },
            subjobs: None,
            challenged: &[],
            pinned: false,
            own: false,
            env_tmpdir: None,
        });
        assert_eq!(body, want, "round {round}");
    }
    let findings = dir.join("review/r1/findings.md").display().to_string();
    let (body, ctx) = prompt_files(&dir, "r1-corrector-cr");
    assert_eq!(ctx, None);
    assert_eq!(body, prompt::correction(Some(&task_text), 1, &findings));
    for jid in w.job_ids() {
        let brief = fs::read_to_string(w.registry().join(&jid).join("brief.md")).unwrap();
        assert!(!brief.contains("[worktree context]"), "{jid}: {brief}");
    }
    // Unpinned: reports promoted without sidecars.
    assert!(promoted(&w).iter().all(|p| !p.ends_with(".identity.json")), "{:?}", promoted(&w));
}

/// `git` in `dir` with the test identity and, for this command only, `protocol.file.allow=always`
/// (a local submodule needs it; set through `GIT_CONFIG_*`, never in a config file).
fn git_file_allowed(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .envs(GIT_ENV.iter().copied())
        .envs([
            ("GIT_CONFIG_COUNT", "1"),
            ("GIT_CONFIG_KEY_0", "protocol.file.allow"),
            ("GIT_CONFIG_VALUE_0", "always"),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A change in the working tree (for `--review-only` runs, which have no implement job).
fn dirty(w: &World) {
    fs::write(w.root.join("app.txt"), "version 2\n").unwrap();
}

/// The refused round: rc 1, `OUTCOME=refused`, the one REFUSED line naming round and cause.
fn expect_refused(r: &Run, round: u32, cause: &str) -> String {
    let id = expect(r, 1, "refused");
    let want = format!("REFUSED: loop: round {round}: {cause}: ");
    assert!(r.stderr().lines().any(|l| l.starts_with(&want)), "no {want:?} line:\n{}", r.stderr());
    id
}

// ---- 5, 29: the empty-change guard ----------------------------------------------------------------

/// 4.9 test 5: the change was committed outside the loop and `--base` names that commit, so
/// base..snapshot is empty: rc 1 before any review is requested; the empty `review/` is removed.
#[test]
fn t05_an_empty_change_set_ends_the_loop_before_any_review() {
    let w = World::new("rounds-t5-empty");
    w.creator("cr", "");
    w.reviewer("rv", "PASS", "");
    fs::write(w.root.join("app.txt"), "committed outside the loop\n").unwrap();
    w.git(&["commit", "-q", "-am", "out of the loop"]);
    let r = w.run_loop(&["--creator", "cr", "--reviewer", "rv", "--review-only", "--base", "HEAD"]);
    let id = expect(&r, 1, "failed");
    let cp = w.checkpoint(&id);
    assert_eq!(cp["reason"], "empty_change_set", "{cp}");
    assert!(r.stderr().contains("nothing changed from the base"), "{}", r.stderr());
    assert_eq!(roles(&cp), Vec::<String>::new());
    assert!(w.job_ids().is_empty(), "a job was dispatched: {:?}", w.job_ids());
    assert_eq!(cp["review_rounds"], json!([]));
    assert!(!w.loop_dir(&id).join("review").exists(), "the empty review/ dir was left");
    assert!(w.review_trees().is_empty());
}

/// 4.9 test 5: a guard whose `git diff --quiet` fails (the base's tree object is gone, while the
/// base commit itself still validates) is undeterminable: rc 1, no review job.
#[test]
fn t05_a_git_failure_in_the_guard_ends_the_loop() {
    let w = World::new("rounds-t5-gitfail");
    w.creator("cr", "");
    w.reviewer("rv", "PASS", "");
    let base = w.base();
    fs::write(w.root.join("app.txt"), "version 2\n").unwrap();
    w.git(&["commit", "-q", "-am", "two"]);
    let tree = w.git(&["rev-parse", &format!("{base}^{{tree}}")]);
    fs::remove_file(w.root.join(".git/objects").join(&tree[..2]).join(&tree[2..])).unwrap();
    let r = w.run_loop(&["--creator", "cr", "--reviewer", "rv", "--review-only", "--base", &base]);
    let id = expect(&r, 1, "failed");
    assert!(r.stderr().contains("cannot tell whether anything changed"), "{}", r.stderr());
    assert_eq!(w.checkpoint(&id)["reason"], "empty_change_set");
    assert!(w.job_ids().is_empty(), "a job was dispatched: {:?}", w.job_ids());
    assert!(w.review_trees().is_empty());
}

/// 4.9 test 29: the guard runs before a self-review round too: no self-review record.
#[test]
fn t29_the_empty_change_guard_runs_before_self_review() {
    let w = World::new("rounds-t29");
    w.session("cr", "work_s=0.2\nidentity=echo\nverdict=PASS\n");
    let r = w.run_loop(&["--creator", "cr", "--self-review", "--review-only", "--base", "HEAD"]);
    let id = expect(&r, 1, "failed");
    let cp = w.checkpoint(&id);
    assert_eq!(cp["reason"], "empty_change_set");
    assert!(w.job_ids().is_empty(), "a self-review was dispatched: {:?}", w.job_ids());
    assert!(prompts(&w.loop_dir(&id)).is_empty());
    // The same loop with a change does self-review (the guard, not the setup, stopped it).
    dirty(&w);
    let r = w.run_loop(&["--creator", "cr", "--self-review", "--review-only", "--base", "HEAD"]);
    let id = expect(&r, 0, "promoted");
    assert_eq!(roles(&w.checkpoint(&id)), ["self-reviewer"]);
}

// ---- 6: the frozen collector ---------------------------------------------------------------------

/// `mam` from `bin` with the world's environment, in its control root.
fn mam_from(w: &World, bin: &Path) -> Cmd {
    let mut c = w.td.command(bin).cwd(&w.root);
    for (k, v) in &w.env {
        c = c.env(k, v);
    }
    c
}

/// 4.9 test 6 (A56): the loop runs from a copy of mam; once it has dispatched, the copy is replaced
/// by a script; the loop still finishes promoted, every child having been the frozen
/// `<loop dir>/bin/mam` (the checkpoint's `collector`), and a `mam` in the tree under review is never
/// run.
#[test]
fn t06_the_collector_is_the_frozen_control_side_binary() {
    let w = World::new("rounds-t6");
    let app = w.root.join("app.txt");
    w.session("cr", &format!("work_s=0.2\nwork_s@1=3\nedit={}\n", app.display()));
    w.reviewer("rv", "PASS", "");
    let ran = w.td.path("a-swapped-mam-ran");
    let script = format!("#!/bin/sh\necho ran >>'{}'\nexit 99\n", ran.display());
    // A modified `mam` in the tree under review.
    fs::write(w.root.join("mam"), &script).unwrap();
    let copy = w.td.path("bin/mam");
    fs::create_dir_all(copy.parent().unwrap()).unwrap();
    fs::copy(mam_bin(), &copy).unwrap();
    let t = task(&w);
    let base = w.base();
    let mut bg = mam_from(&w, &copy)
        .args(["loop", "--creator", "cr", "--reviewer", "rv", "--task-file", &t, "--base", &base])
        .spawn_bg(&w.td, "loop");
    bg.wait_stdout("dispatched", Duration::from_secs(30));
    let swap = w.td.path("bin/mam.new");
    fs::write(&swap, &script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&swap, fs::Permissions::from_mode(0o755)).unwrap();
    fs::rename(&swap, &copy).unwrap();
    assert!(!bg.stdout().contains("pinned"), "the swap came too late to matter:\n{}", bg.stdout());
    let (rc, _) = bg.wait(LOOP_LIMIT);
    let (id, outcome, lrc, _) = last_line(&bg.stdout());
    assert_eq!((rc, lrc, outcome.as_str()), (0, 0, "promoted"), "{}\n{}", bg.stdout(), bg.stderr());
    let cp = w.checkpoint(&id);
    let frozen = w.loop_dir(&id).join("bin/mam");
    assert_eq!(s(&cp["collector"]), frozen.display().to_string());
    assert_eq!(fs::read(&frozen).unwrap(), fs::read(mam_bin()).unwrap(), "the frozen copy is the original");
    // The diff was collected after the swap, by the frozen copy: a real diff, the tree's `mam` in it.
    let diff = fs::read_to_string(w.loop_dir(&id).join("review/r1.diff")).unwrap();
    assert!(!diff.contains("UNAVAILABLE") && diff.contains("app.txt") && diff.contains("b/mam"), "{diff}");
    // Every child's command lines name the frozen copy, never the swapped one.
    for jid in w.job_ids() {
        let brief = fs::read_to_string(w.registry().join(&jid).join("brief.md")).unwrap();
        assert!(brief.contains(&format!("'{}' publish ", frozen.display())), "{jid}: {brief}");
        assert!(!brief.contains(&copy.display().to_string()), "{jid}: {brief}");
    }
    assert!(!ran.exists(), "the swapped or the tree's mam ran");
}

// ---- 7: pinning leaves the source alone ----------------------------------------------------------

/// What pinning must not change: status, the index bytes, every ref, HEAD, the worktree list.
fn source_state(w: &World) -> (String, Vec<u8>, String, String, String, String) {
    (
        w.git(&["--no-optional-locks", "status", "--porcelain=v1", "--untracked-files=all"]),
        fs::read(w.root.join(".git/index")).unwrap(),
        w.git(&["for-each-ref"]),
        w.git(&["rev-parse", "HEAD"]),
        w.git(&["symbolic-ref", "HEAD"]),
        w.git(&["--no-optional-locks", "worktree", "list", "--porcelain"]),
    )
}

/// 4.9 test 7: a tree with staged, unstaged and untracked changes is pinned to a ref-less commit by
/// `mam-loop`; status, index, refs and HEAD are as they were.
#[test]
fn t07_pinning_a_dirty_tree_leaves_status_index_and_refs_unchanged() {
    let w = World::new("rounds-t7");
    w.creator("cr", "");
    w.reviewer("rv", "PASS", "");
    fs::write(w.root.join("b.txt"), "b one\n").unwrap();
    w.git(&["add", "b.txt"]);
    w.git(&["commit", "-q", "-m", "b"]);
    fs::write(w.root.join("app.txt"), "staged\n").unwrap();
    w.git(&["add", "app.txt"]);
    fs::write(w.root.join("app.txt"), "staged then changed\n").unwrap();
    fs::write(w.root.join("b.txt"), "b unstaged\n").unwrap();
    fs::write(w.root.join("new.txt"), "untracked\n").unwrap();
    w.git(&["update-index", "-q", "--refresh"]);
    let before = source_state(&w);
    assert!(before.0.contains("MM app.txt") && before.0.contains(" M b.txt") && before.0.contains("?? new.txt"));
    let base = w.base();
    let r = w.run_loop(&["--creator", "cr", "--reviewer", "rv", "--review-only", "--base", &base]);
    let id = expect(&r, 0, "promoted");
    assert_eq!(source_state(&w), before, "the pinning changed the source's status, index, refs or HEAD");
    let cp = w.checkpoint(&id);
    let commit = s(&cp["review_rounds"][0]["snapshot_commit"]);
    assert_ne!(commit, before.3, "a dirty tree is not HEAD");
    let who = w.git(&["log", "-1", "--format=%an <%ae>%n%cn <%ce>", &commit]);
    assert_eq!(who, "mam-loop <mam-loop@localhost>\nmam-loop <mam-loop@localhost>");
    assert_eq!(w.git(&["rev-parse", &format!("{commit}^")]), before.3, "the snapshot's parent is HEAD");
    assert_eq!(w.git(&["show", &format!("{commit}:app.txt")]), "staged then changed");
    assert_eq!(w.git(&["show", &format!("{commit}:b.txt")]), "b unstaged");
    assert_eq!(w.git(&["show", &format!("{commit}:new.txt")]), "untracked");
    assert_eq!(s(&cp["review_rounds"][0]["identity"]["tree"]), w.git(&["rev-parse", &format!("{commit}^{{tree}}")]));
}

// ---- 8: refusals ----------------------------------------------------------------------------------

/// 4.9 test 8 (A39): an untracked repository nested in the source refuses round 1: nothing delegated
/// for it, the loop job `failed` with `refused:nested_repository`.
#[test]
fn t08_an_untracked_nested_repository_refuses_the_round() {
    let w = World::new("rounds-t8-nested");
    w.creator("cr", "");
    w.reviewer("rv", "PASS", "");
    let inner = w.root.join("vendor/inner");
    fs::create_dir_all(&inner).unwrap();
    git_in(&inner, &["init", "-q"]);
    fs::write(inner.join("lib.txt"), "inner\n").unwrap();
    let t = task(&w);
    let base = w.base();
    let r = w.run_loop(&["--creator", "cr", "--reviewer", "rv", "--task-file", &t, "--base", &base]);
    let id = expect_refused(&r, 1, "nested_repository");
    let cp = w.checkpoint(&id);
    assert_eq!(cp["reason"], "refused:nested_repository");
    assert_eq!(roles(&cp), ["implementer"], "only the implement job was delegated");
    assert_eq!(reviewer_records(&w, &cp), Vec::<String>::new());
    assert_eq!(cp["review_rounds"], json!([]));
    let job = w.record(&s(&cp["creator_jid"]));
    assert_eq!((job["status"].as_str(), job["reason"].as_str()), (Some("failed"), Some("refused:nested_repository")));
    assert!(w.review_trees().is_empty());
    assert!(promoted(&w).is_empty());
}

/// 4.9 test 8: a registered submodule with untracked or modified content refuses the round at the
/// pin; content appearing in it during the review makes the round stale at the re-measure.
#[test]
fn t08_dirty_submodule_content_is_refused_at_pin_and_stale_at_remeasure() {
    let w = World::new("rounds-t8-submodule");
    let sub = w.td.path("subsrc");
    fs::create_dir_all(&sub).unwrap();
    git_in(&sub, &["init", "-q", "-b", "main"]);
    fs::write(sub.join("a.txt"), "a\n").unwrap();
    git_in(&sub, &["add", "-A"]);
    git_in(&sub, &["commit", "-q", "-m", "sub"]);
    git_file_allowed(&w.root, &["submodule", "add", "-q", sub.to_str().unwrap(), "libs/sm"]);
    w.git(&["commit", "-q", "-m", "a submodule"]);
    let sm = w.root.join("libs/sm");
    w.creator("cr", "");
    w.reviewer("rv", "PASS", &format!("touch_during_review@1={}\n", sm.join("a.txt").display()));
    let base = w.base();
    let args = ["--creator", "cr", "--reviewer", "rv", "--review-only", "--base", &base, "--max-rounds", "1"];

    fs::write(sm.join("untracked.txt"), "x\n").unwrap();
    let r = w.run_loop(&args);
    let id = expect_refused(&r, 1, "dirty_submodule");
    assert_eq!(w.checkpoint(&id)["reason"], "refused:dirty_submodule");
    assert!(!w.loop_dir(&id).join("review").exists(), "the empty review/ dir was left");
    fs::remove_file(sm.join("untracked.txt")).unwrap();
    fs::write(sm.join("a.txt"), "modified\n").unwrap();
    expect_refused(&w.run_loop(&args), 1, "dirty_submodule");
    git_in(&sm, &["checkout", "-q", "a.txt"]);
    assert!(w.job_ids().is_empty(), "a refused round delegated: {:?}", w.job_ids());

    // Clean at the pin, dirty after the review: stale, and stale on the last round is rc 1.
    let r = w.run_loop(&args);
    let id = expect(&r, 1, "failed");
    let cp = w.checkpoint(&id);
    assert_eq!(cp["reason"], "stale_last_round", "{cp}");
    assert_eq!(cp["review_rounds"][0]["stale"], true);
    assert!(fs::read_to_string(sm.join("a.txt")).unwrap().contains("touched"), "the reviewer did not touch it");
    assert!(promoted(&w).is_empty());
}

// ---- 9, 10: review trees ---------------------------------------------------------------------------

/// Waits for the loop's review tree of `round` under TMPDIR, checked out; returns the loop id.
fn wait_tree(w: &World, bg: &mut Background, round: u32) -> String {
    let found = poll(Duration::from_secs(60), || {
        let id = w.loop_ids().into_iter().next()?;
        let name = format!("mam-review-{id}-r{round}");
        let checked_out = w.td.path("tmp").join(&name).join("app.txt").is_file();
        (w.review_trees().contains(&name) && checked_out).then_some(id)
    });
    found.unwrap_or_else(|| {
        bg.kill();
        panic!("no review tree appeared\n--- stdout\n{}--- stderr\n{}", bg.stdout(), bg.stderr())
    })
}

fn finish(bg: &mut Background) -> (String, String, i32) {
    let (rc, _) = bg.wait(LOOP_LIMIT);
    let (id, outcome, lrc, _) = last_line(&bg.stdout());
    assert_eq!(rc, lrc, "{}\n{}", bg.stdout(), bg.stderr());
    (id, outcome, rc)
}

/// 4.9 test 9: the review tree `$TMPDIR/mam-review-<id>-r1` is a checkout of the snapshot while a
/// slow reviewer runs, and it is gone after a promoted exit, after a failure and after SIGTERM.
#[test]
fn t09_the_review_tree_exists_during_the_round_and_is_gone_after_every_exit() {
    let w = World::new("rounds-t9");
    w.creator("cr", "");
    w.reviewer("slow", "PASS", "work_s=3\n");
    dirty(&w);
    let base = w.base();
    let worktrees = w.git(&["worktree", "list", "--porcelain"]);

    // Promoted.
    let mut bg = w.spawn_loop(&["--creator", "cr", "--reviewer", "slow", "--review-only", "--base", &base]);
    let id = wait_tree(&w, &mut bg, 1);
    let tree = w.td.path("tmp").join(format!("mam-review-{id}-r1"));
    assert_eq!(fs::read_to_string(tree.join("app.txt")).unwrap(), "version 2\n", "the tree holds the snapshot");
    assert!(tree.join(".git").is_file(), "a git worktree");
    let (id2, outcome, rc) = finish(&mut bg);
    assert_eq!((id2.as_str(), outcome.as_str(), rc), (id.as_str(), "promoted", 0), "{}", bg.stderr());
    assert!(w.review_trees().is_empty(), "left after a promoted exit: {:?}", w.review_trees());
    assert!(w.loop_dir(&id).join("review").is_dir(), "review/ holds the round's files");
    assert_eq!(w.git(&["worktree", "list", "--porcelain"]), worktrees);
    fs::remove_dir_all(w.root.join(".mam/loop").join(&id)).unwrap();

    // Failed (rounds exhausted).
    w.reviewer("no", "NOT PASS", "work_s=1\n");
    let mut bg =
        w.spawn_loop(&["--creator", "cr", "--reviewer", "no", "--review-only", "--base", &base, "--max-rounds", "1"]);
    let id = wait_tree(&w, &mut bg, 1);
    let (_, outcome, rc) = finish(&mut bg);
    assert_eq!((outcome.as_str(), rc), ("failed", 1), "{}", bg.stderr());
    assert_eq!(w.checkpoint(&id)["reason"], "rounds_exhausted");
    assert!(w.review_trees().is_empty(), "left after a failure: {:?}", w.review_trees());
    fs::remove_dir_all(w.root.join(".mam/loop").join(&id)).unwrap();

    // SIGTERM while the reviewer works.
    let mut bg = w.spawn_loop(&["--creator", "cr", "--reviewer", "slow", "--review-only", "--base", &base]);
    let id = wait_tree(&w, &mut bg, 1);
    bg.wait_stdout("reviewer slow · job", Duration::from_secs(30));
    bg.signal(libc::SIGTERM);
    let (_, outcome, rc) = finish(&mut bg);
    assert_eq!((outcome.as_str(), rc), ("interrupted", 1), "{}", bg.stderr());
    assert!(w.review_trees().is_empty(), "left after SIGTERM: {:?}", w.review_trees());
    let cp = w.checkpoint(&id);
    assert_eq!(cp["outcome"], "interrupted", "{cp}");
    let jid = cp["jobs"][0]["jid"].as_str().unwrap_or_else(|| panic!("{cp}")).to_string();
    assert_eq!(w.record(&jid)["status"], "cancelled");
    assert_eq!(w.git(&["worktree", "list", "--porcelain"]), worktrees);
}

/// 4.9 test 10 (A56): an unwritable TMPDIR (its parent is a regular file, which stops root too)
/// refuses round 1 at the review tree (the pin's temporary index lives in the loop dir); the loop
/// never falls back to env isolation: no reviewer is dispatched.
#[test]
fn t10_an_unwritable_tmpdir_refuses_the_round_without_falling_back_to_env() {
    let w = World::new("rounds-t10-tmpdir");
    w.creator("cr", "");
    w.reviewer("rv", "PASS", "");
    dirty(&w);
    w.td.write("a-file", "not a directory\n");
    let bad = w.td.path("a-file/tmp");
    let base = w.base();
    let r = w
        .mam()
        .env("TMPDIR", &bad)
        .args(["loop", "--creator", "cr", "--reviewer", "rv", "--review-only", "--base", &base])
        .run_within(LOOP_LIMIT);
    let (id, outcome, rc, _) = last_line(&r.stdout());
    assert_eq!((outcome.as_str(), rc, r.rc()), ("refused", 1, 1), "{}\n{}", r.stdout(), r.stderr());
    assert!(r.stderr().contains("REFUSED: loop: round 1: "), "{}", r.stderr());
    let cp = w.checkpoint(&id);
    assert_eq!(cp["reason"], "refused:review_tree", "{cp}");
    assert!(w.job_ids().is_empty(), "dispatched: {:?}", w.job_ids());
    assert!(!r.stdout().contains("source-tree") && !r.stdout().contains("VERDICT"), "{}", r.stdout());
}

/// 4.9 test 10: the review tree's own path cannot be created (a file stands there): the round is
/// refused `review_tree` after the pin, with no review dispatched and no env fallback.
#[test]
fn t10_a_failed_tree_creation_refuses_the_round_without_falling_back_to_env() {
    let w = World::new("rounds-t10-tree");
    let app = w.root.join("app.txt");
    w.session("cr", &format!("work_s=3\nedit={}\n", app.display()));
    w.reviewer("rv", "PASS", "");
    let t = task(&w);
    let base = w.base();
    let mut bg = w.spawn_loop(&["--creator", "cr", "--reviewer", "rv", "--task-file", &t, "--base", &base]);
    bg.wait_stdout("dispatched", Duration::from_secs(30));
    let id = w.loop_ids().into_iter().next().unwrap();
    w.td.write(&format!("tmp/mam-review-{id}-r1"), "in the way\n");
    let (_, outcome, rc) = finish(&mut bg);
    assert_eq!((outcome.as_str(), rc), ("refused", 1), "{}\n{}", bg.stdout(), bg.stderr());
    assert!(bg.stderr().contains("REFUSED: loop: round 1: review_tree: "), "{}", bg.stderr());
    assert!(bg.stderr().contains("no fallback to env"), "{}", bg.stderr());
    let cp = w.checkpoint(&id);
    assert_eq!(cp["reason"], "refused:review_tree");
    assert_eq!(roles(&cp), ["implementer"]);
    assert_eq!(reviewer_records(&w, &cp), Vec::<String>::new());
    assert_eq!(w.record(&s(&cp["creator_jid"]))["reason"], "refused:review_tree");
}

// ---- 11, 12: staleness and the re-check --------------------------------------------------------------

/// 4.9 test 11: a reviewer touching the source during round 1 makes it stale: no correction job,
/// round 2 re-reviews and is promoted; on the last round a stale round is rc 1.
#[test]
fn t11_a_source_touched_during_review_makes_the_round_stale() {
    let w = World::new("rounds-t11");
    let app = w.root.join("app.txt");
    w.creator("cr", "");
    w.reviewer("rv", "PASS", &format!("touch_during_review@1={}\n", app.display()));
    let t = task(&w);
    let base = w.base();
    let r = w.run_loop(&["--creator", "cr", "--reviewer", "rv", "--task-file", &t, "--base", &base]);
    let id = expect(&r, 0, "promoted");
    let cp = w.checkpoint(&id);
    assert_eq!(roles(&cp), ["implementer", "reviewer", "reviewer"], "no correction job after a stale round");
    assert_eq!(cp["review_rounds"][0]["stale"], true);
    assert_eq!(cp["review_rounds"][1]["stale"], false);
    assert!(r.stdout().contains("round 1: STALE"), "{}", r.stdout());
    let jid = s(&cp["review_rounds"][1]["reviewers"][0]["jid"]);
    let side = read_json(&w.root.join(format!(".agents/reports/rv/report-{jid}.identity.json")));
    assert_eq!(side["round"], 2, "the stale round is not promoted");

    // The last round stale: rc 1, nothing promoted.
    fs::remove_dir_all(w.root.join(".agents")).unwrap();
    w.reviewer("rv2", "PASS", &format!("touch_during_review@1={}\n", app.display()));
    let r =
        w.run_loop(&["--creator", "cr", "--reviewer", "rv2", "--review-only", "--base", &base, "--max-rounds", "1"]);
    let id = expect(&r, 1, "failed");
    assert_eq!(w.checkpoint(&id)["reason"], "stale_last_round");
    assert!(promoted(&w).is_empty(), "{:?}", promoted(&w));
    assert!(w.review_trees().is_empty());
}

/// 4.9 test 12 (A56): the loop paused before promotion; the source changes; nothing is promoted, rc 1.
#[cfg(feature = "test-hooks")]
#[test]
fn t12_a_change_after_approval_promotes_nothing() {
    use std::os::unix::fs::OpenOptionsExt;
    let w = World::new("rounds-t12");
    w.creator("cr", "");
    w.reviewer("rv", "PASS", "");
    dirty(&w);
    let fifo = w.td.path("pause.fifo");
    let st = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(st.success());
    let base = w.base();
    let mut bg = w
        .mam()
        .env("MAM_TEST_LOOP_PAUSE", format!("before-promote:{}", fifo.display()))
        .args(["loop", "--creator", "cr", "--reviewer", "rv", "--review-only", "--base", &base])
        .spawn_bg(&w.td, "loop");
    // Opening for writing blocks until the loop opens the fifo at the pause.
    let (tx, rx) = std::sync::mpsc::channel();
    let f2 = fifo.clone();
    let writer = std::thread::spawn(move || {
        let f = fs::OpenOptions::new().write(true).open(&f2);
        let _ = tx.send(());
        f
    });
    if rx.recv_timeout(LOOP_LIMIT).is_err() {
        // Release the writer (a reader that does not block), then fail.
        let _r = fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&fifo);
        let _ = writer.join();
        bg.kill();
        panic!("the loop never reached the pause\n{}\n{}", bg.stdout(), bg.stderr());
    }
    let f = writer.join().unwrap().unwrap();
    assert!(bg.stdout().contains("VERDICT: PASS"), "paused before the approval:\n{}", bg.stdout());
    fs::write(w.root.join("app.txt"), "changed after the approval\n").unwrap();
    drop(f);
    let (id, outcome, rc) = finish(&mut bg);
    assert_eq!((outcome.as_str(), rc), ("failed", 1), "{}\n{}", bg.stdout(), bg.stderr());
    assert_eq!(w.checkpoint(&id)["reason"], "changed_after_approval");
    assert!(promoted(&w).is_empty(), "{:?}", promoted(&w));
    assert_eq!(w.checkpoint(&id)["promoted"], json!([]));
}

// ---- 13: promotion -------------------------------------------------------------------------------

const SIDECAR_KEYS: [&str; 12] = [
    "base",
    "evidence",
    "head",
    "jid",
    "loop_id",
    "promoted_at",
    "round",
    "session",
    "snapshot_commit",
    "transport",
    "tree",
    "verdict",
];

/// Checks a promoted reviewer report and its sidecar against round `round` of the checkpoint.
fn check_sidecar(w: &World, cp: &Value, round: usize, session: &str, evidence: &str) {
    let r = &cp["review_rounds"][round];
    let row = r["reviewers"].as_array().unwrap().iter().find(|x| x["session"] == session).unwrap();
    let jid = s(&row["jid"]);
    let dir = w.root.join(".agents/reports").join(session);
    let side = read_json(&dir.join(format!("report-{jid}.identity.json")));
    let mut keys: Vec<&str> = side.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(keys, SIDECAR_KEYS, "{side}");
    let commit = s(&r["snapshot_commit"]);
    let want = json!({
        "loop_id": cp["loop_id"], "round": round + 1, "session": session, "jid": jid,
        "transport": "local", "evidence": evidence, "base": cp["base"], "head": r["identity"]["head"],
        "tree": w.git(&["rev-parse", &format!("{commit}^{{tree}}")]), "snapshot_commit": commit,
        "verdict": "PASS", "promoted_at": side["promoted_at"],
    });
    assert_eq!(side, want);
    assert!(!s(&side["promoted_at"]).is_empty());
    assert_eq!(row["transport"], "local");
    assert_eq!(row["evidence"], evidence);
    assert_eq!(
        fs::read(dir.join(format!("report-{jid}.md"))).unwrap(),
        fs::read(s(&row["report"])).unwrap(),
        "the promoted report is the round's copy"
    );
}

/// 4.9 test 13: two reviewers, a NOT PASS round, then both PASS: their round-2 reports promoted with
/// `review-tree` sidecars, the creator's final report without one; the checkpoint lists both rounds
/// with transport and evidence.
#[test]
fn t13_promotion_writes_reports_and_sidecars_with_the_evidence() {
    let w = World::new("rounds-t13");
    w.creator("cr", "");
    w.reviewer("ra", "PASS", "verdict@1=NOT PASS\nreport_text@1=1. app.txt: wrong\n");
    w.reviewer("rb", "PASS", "");
    let t = task(&w);
    let base = w.base();
    let r =
        w.run_loop(&["--creator", "cr", "--reviewer", "ra", "--reviewer", "rb", "--task-file", &t, "--base", &base]);
    let id = expect(&r, 0, "promoted");
    let cp = w.checkpoint(&id);
    let rounds = cp["review_rounds"].as_array().unwrap();
    assert_eq!(rounds.len(), 2);
    for (i, round) in rounds.iter().enumerate() {
        assert_eq!(round["round"], i + 1);
        assert_eq!(round["isolation"], "tree");
        let rows = round["reviewers"].as_array().unwrap();
        assert_eq!(rows.len(), 2, "{round}");
        for row in rows {
            assert_eq!((row["transport"].as_str(), row["evidence"].as_str()), (Some("local"), Some("review-tree")));
        }
    }
    check_sidecar(&w, &cp, 1, "ra", "review-tree");
    check_sidecar(&w, &cp, 1, "rb", "review-tree");
    let cjid = s(&cp["creator_jid"]);
    assert_eq!(w.record(&cjid)["status"], "completed", "the loop job after promotion");
    let files = promoted(&w);
    assert_eq!(files.len(), 5, "{files:?}");
    assert!(files.contains(&format!("cr/report-{cjid}.md")), "{files:?}");
    assert!(!files.iter().any(|f| f.starts_with("cr/") && f.ends_with(".identity.json")), "{files:?}");
    assert_eq!(
        fs::read(w.root.join(format!(".agents/reports/cr/report-{cjid}.md"))).unwrap(),
        fs::read(w.loop_dir(&id).join("review/r1/cr.corrector.md")).unwrap(),
        "the creator's final report"
    );
    // Nothing of round 1 (ra's NOT PASS) is promoted: each record's file is its round-2 copy.
    assert_eq!(cp["promoted"].as_array().unwrap().len(), 5);
}

/// 4.9 test 13 with `--review-isolation env`: evidence `source-tree`, no review tree, the prompt
/// names the source root and a per-round TMPDIR.
#[test]
fn t13_env_isolation_promotes_source_tree_evidence() {
    let w = World::new("rounds-t13-env");
    w.creator("cr", "");
    w.reviewer("rv", "PASS", "");
    dirty(&w);
    let base = w.base();
    let r = w.run_loop(&[
        "--creator",
        "cr",
        "--reviewer",
        "rv",
        "--review-only",
        "--base",
        &base,
        "--review-isolation",
        "env",
    ]);
    let id = expect(&r, 0, "promoted");
    let cp = w.checkpoint(&id);
    assert_eq!(cp["review_rounds"][0]["isolation"], "env");
    check_sidecar(&w, &cp, 0, "rv", "source-tree");
    let (body, ctx) = prompt_files(&w.loop_dir(&id), "r1-review-rv");
    let tmp = w.loop_dir(&id).join("tmp/r1");
    assert!(body.contains(&format!("Use {} as your TMPDIR", tmp.display())), "{body}");
    assert!(ctx.unwrap().contains(&format!("path: {} (source root, env isolation)\n", s(&cp["source_root"]))));
    assert!(!r.stdout().contains("mam-review-") && !r.stderr().contains("mam-review-"), "{}", r.stdout());
    assert!(w.review_trees().is_empty());
}

// ---- 15: self-review -------------------------------------------------------------------------------

/// 4.9 test 15: with `--base` and no reviewers the creator's own review is pinned and promoted with an
/// identity sidecar; its NOT PASS re-reviews without a correction job.
#[test]
fn t15_self_review_is_pinned_and_its_not_pass_re_reviews() {
    let w = World::new("rounds-t15");
    let app = w.root.join("app.txt");
    // The creator edits only in its implement job (prompt 1); prompts 2.. are its self-reviews.
    w.session("cr", &format!("work_s=0.2\nedit@1={}\nidentity=echo\nverdict=PASS\n", app.display()));
    w.session(
        "cn",
        &format!("work_s=0.2\nedit@1={}\nidentity=echo\nverdict=PASS\nverdict@2=NOT PASS\n", app.display()),
    );
    let t = task(&w);
    let base = w.base();

    let r = w.run_loop(&["--creator", "cr", "--self-review", "--task-file", &t, "--base", &base]);
    let id = expect(&r, 0, "promoted");
    let cp = w.checkpoint(&id);
    assert_eq!(roles(&cp), ["implementer", "self-reviewer"]);
    let row = &cp["review_rounds"][0]["reviewers"][0];
    assert_eq!(row["session"], "cr");
    assert_ne!(row["jid"], cp["creator_jid"], "the self-review has its own record");
    check_sidecar(&w, &cp, 0, "cr", "review-tree");
    let cjid = s(&cp["creator_jid"]);
    assert!(w.root.join(format!(".agents/reports/cr/report-{cjid}.md")).is_file());
    assert!(!w.root.join(format!(".agents/reports/cr/report-{cjid}.identity.json")).exists());
    let (body, ctx) = prompt_files(&w.loop_dir(&id), "r1-review-cr");
    assert!(body.contains("review your own change") && body.contains("IDENTITY: <tree>"), "{body}");
    assert!(ctx.unwrap().contains("[review identity]\n"));

    let r = w.run_loop(&["--creator", "cn", "--self-review", "--task-file", &t, "--base", &base]);
    let id = expect(&r, 0, "promoted");
    let cp = w.checkpoint(&id);
    assert_eq!(roles(&cp), ["implementer", "self-reviewer", "self-reviewer"], "no correction job");
    assert_eq!(cp["review_rounds"][0]["reviewers"][0]["verdict"], "NOT PASS");
    check_sidecar(&w, &cp, 1, "cn", "review-tree");
}

// ---- 24, 25: findings --------------------------------------------------------------------------------

/// 4.9 test 24 (A57): a wrong IDENTITY line is a synthetic finding: NOT PASS, a correction job.
#[test]
fn t24_an_identity_mismatch_is_a_synthetic_finding() {
    let w = World::new("rounds-t24");
    w.creator("cr", "");
    w.reviewer("rv", "PASS", "identity@1=wrong\n");
    let t = task(&w);
    let base = w.base();
    let r = w.run_loop(&["--creator", "cr", "--reviewer", "rv", "--task-file", &t, "--base", &base]);
    let id = expect(&r, 0, "promoted");
    let cp = w.checkpoint(&id);
    assert_eq!(roles(&cp), ["implementer", "reviewer", "corrector", "reviewer"]);
    let r1 = &cp["review_rounds"][0];
    let row = &r1["reviewers"][0];
    assert_eq!(row["verdict"], "NOT PASS", "a PASS with the wrong identity");
    let want = s(&r1["identity"]["tree"]);
    let got: String = want.chars().map(|c| if c == '0' { '1' } else { '0' }).collect();
    let line = format!("SYNTHETIC: identity mismatch {want} {got}");
    assert_eq!(s(&row["synthetic"]), line);
    let findings = fs::read_to_string(w.loop_dir(&id).join("review/r1/findings.md")).unwrap();
    assert!(findings.contains(&format!("## rv ({})\n", s(&row["jid"]))), "{findings}");
    assert!(findings.contains(&format!("\n{line}\n")), "{findings}");
    assert!(r.stdout().contains("VERDICT: NOT PASS (SYNTHETIC: identity mismatch"), "{}", r.stdout());
    let (body, _) = prompt_files(&w.loop_dir(&id), "r1-corrector-cr");
    assert!(body.contains(&w.loop_dir(&id).join("review/r1/findings.md").display().to_string()), "{body}");
}

/// The round-1 finding of the challenge tests.
const FINDING: &str = "app.txt: the new line is wrong.";

/// 4.9 test 25 (A34, A57): the creator challenges a finding; the reviewer is asked to rule on it and
/// sustains it; the next creator job is a comply job quoting it; round 3 passes.
#[test]
fn t25_a_sustained_challenge_becomes_a_comply_job() {
    let w = World::new("rounds-t25-sustained");
    w.creator("cr", "report_text@2=Kept the line.\\nCHALLENGE rv:1: not a bug\n");
    w.reviewer(
        "rv",
        "PASS",
        &format!(
            "verdict@1=NOT PASS\nreport_text@1=Findings:\\n1. {FINDING}\nverdict@2=NOT PASS\nreport_text@2=SUSTAINED 1\n"
        ),
    );
    let t = task(&w);
    let base = w.base();
    let r = w.run_loop(&["--creator", "cr", "--reviewer", "rv", "--task-file", &t, "--base", &base]);
    let id = expect(&r, 0, "promoted");
    let cp = w.checkpoint(&id);
    assert_eq!(roles(&cp), ["implementer", "reviewer", "corrector", "reviewer", "complier", "reviewer"]);
    let dir = w.loop_dir(&id);
    let (r2, _) = prompt_files(&dir, "r2-review-rv");
    assert!(r2.contains("- 1: not a bug\n"), "{r2}");
    assert!(r2.contains("`SUSTAINED <n>`") && r2.contains("`WITHDRAWN <n>`"), "{r2}");
    let (r1, _) = prompt_files(&dir, "r1-review-rv");
    assert!(!r1.contains("SUSTAINED"), "round 1 has nothing to rule on");
    let (comply, _) = prompt_files(&dir, "r2-complier-cr");
    let findings = dir.join("review/r2/findings.md").display().to_string();
    let want = prompt::comply(Some(&format!("{TASK}\n")), 2, &format!("- rv:1: {FINDING}\n"), Some(&findings));
    assert_eq!(comply, want);
    assert!(comply.contains("no further challenge"));
    assert_eq!(cp["review_rounds"].as_array().unwrap().len(), 3);
    check_sidecar(&w, &cp, 2, "rv", "review-tree");
}

/// 4.9 test 25: the reviewer withdraws the challenged finding and passes: promoted in round 2, no
/// comply job.
#[test]
fn t25_a_withdrawn_challenge_passes() {
    let w = World::new("rounds-t25-withdrawn");
    w.creator("cr", "report_text@2=Kept the line.\\nCHALLENGE rv:1: not a bug\n");
    w.reviewer(
        "rv",
        "PASS",
        &format!("verdict@1=NOT PASS\nreport_text@1=Findings:\\n1. {FINDING}\nreport_text@2=WITHDRAWN 1\n"),
    );
    let t = task(&w);
    let base = w.base();
    let r = w.run_loop(&["--creator", "cr", "--reviewer", "rv", "--task-file", &t, "--base", &base]);
    let id = expect(&r, 0, "promoted");
    let cp = w.checkpoint(&id);
    assert_eq!(roles(&cp), ["implementer", "reviewer", "corrector", "reviewer"]);
    let (r2, _) = prompt_files(&w.loop_dir(&id), "r2-review-rv");
    assert!(r2.contains("- 1: not a bug\n"), "{r2}");
    check_sidecar(&w, &cp, 1, "rv", "review-tree");
}
