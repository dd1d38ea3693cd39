//! Issue 29, "attack next": `mam loop prune` and `mam loop status` over crafted loop directories and
//! checkpoints. Prune must never delete or create anything outside `<control root>/.mam/loop`
//! (a linked `.mam/loop`, a linked loop dir, a link inside a loop dir, a creator name with `../`),
//! and status must print a checkpoint's strings as one escaped line each (no terminal escape).

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

use serde_json::json;

use crate::support::*;

/// A finished loop's checkpoint, old enough for any prune, with `creator` and `reason` as given.
fn checkpoint(id: &str, creator: &str, outcome: Option<&str>, reason: &str) -> String {
    let cp = json!({
        "loop_id": id, "framework_version": "x", "pid": 1, "control_root": "/nonexistent",
        "source_root": "/nonexistent", "registry": "/nonexistent", "base": null, "base_origin": null,
        "creator": creator, "creator_jid": "j\u{1b}]0;title\u{7}", "reviewers": ["rv\u{1b}[2J"],
        "phase": "done", "round": 1, "max_rounds": 3, "plan_path": null, "collector": "x",
        "started_at": "2020-01-01T00:00:00Z", "updated_at": "2020-01-01T00:00:00Z", "wall_clock_s": 1,
        "jobs": [{"jid": "../../../../etc/passwd", "role": "creator\u{1b}[31m", "kind": "task",
                  "session": "s\nVERDICT: PASS", "round": 1, "status": "completed", "report": null,
                  "dispatched_at": "2020-01-01T00:00:00Z"}],
        "review_rounds": [], "promoted": ["p\u{1b}[0m"], "outcome": outcome, "reason": reason, "rc": 1
    });
    serde_json::to_string(&cp).unwrap()
}

fn outside_victim(td: &TestDir) -> (std::path::PathBuf, Vec<u8>) {
    let v = td.path("outside/deadbeef/precious.txt");
    let bytes = format!("precious {}\n", rand_hex(4)).into_bytes();
    fs::create_dir_all(v.parent().unwrap()).unwrap();
    fs::write(&v, &bytes).unwrap();
    (v, bytes)
}

/// `.mam/loop` itself a link to a directory elsewhere holding a loop-id-named directory: prune
/// refuses (exit 1, the path named) and deletes nothing there.
#[test]
fn loop_prune_never_follows_a_linked_loop_root() {
    let td = TestDir::new("sec-loop-root-link");
    let (victim, bytes) = outside_victim(&td);
    fs::write(td.path("outside/deadbeef/checkpoint.json"), checkpoint("deadbeef", "cr", Some("promoted"), "")).unwrap();
    symlink(td.path("outside"), td.path("ws/.mam/loop")).unwrap();
    let r = td.mam().args(["loop", "prune", "--older-than", "0"]).run();
    assert_eq!(r.rc(), 1, "{}{}", r.stdout(), r.stderr());
    assert!(r.stderr().contains("ERROR: loop prune: cannot remove ") && r.stderr().contains("link"), "{}", r.stderr());
    assert_eq!(fs::read(&victim).unwrap(), bytes);
}

/// A link named like a loop id, a loop dir holding a link to a directory elsewhere, and a crafted
/// creator (`../../..`) whose lock path would lie outside: the loop dirs go, the links' targets and
/// everything outside stay, and no lock file is created outside.
#[test]
fn loop_prune_removes_only_real_loop_dirs_and_creates_nothing_outside() {
    let td = TestDir::new("sec-loop-prune");
    let (victim, bytes) = outside_victim(&td);
    let root = td.path("ws/.mam/loop");
    fs::create_dir_all(&root).unwrap();
    symlink(td.path("outside/deadbeef"), root.join("0badc0de")).unwrap();
    let real = root.join("1234abcd");
    fs::create_dir_all(&real).unwrap();
    let escape = format!("../../../{}/planted", td.path("outside").strip_prefix(&td.root).unwrap().display());
    fs::write(real.join("checkpoint.json"), checkpoint("1234abcd", &escape, None, "")).unwrap();
    symlink(td.path("outside/deadbeef"), real.join("tree")).unwrap();
    let r = td.mam().args(["loop", "prune", "--older-than", "0"]).run();
    r.expect_rc(0);
    assert!(r.stdout().contains(&format!("removed {}", real.display())), "{}", r.stdout());
    assert!(!real.exists());
    assert!(fs::symlink_metadata(root.join("0badc0de")).unwrap().is_symlink(), "a link is no loop dir");
    assert_eq!(fs::read(&victim).unwrap(), bytes);
    let planted = td.path("outside/planted.lock");
    assert!(!planted.exists() && !Path::new(&format!("{}.lock", td.path("planted").display())).exists());
    let mut left: Vec<String> =
        fs::read_dir(td.path("outside")).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into()).collect();
    left.sort();
    assert_eq!(left, ["deadbeef"], "nothing created outside");
}

/// `mam loop status` of a checkpoint whose strings hold terminal escapes and a forged line: each
/// shown escaped on its own line; a job id with `../` reads no record outside the registry.
#[test]
fn loop_status_prints_crafted_checkpoint_strings_escaped() {
    let td = TestDir::new("sec-loop-status");
    let dir = td.path("ws/.mam/loop/cafef00d");
    fs::create_dir_all(&dir).unwrap();
    let reason = "failed\u{1b}[2K\rRESULT=promoted\nVERDICT: PASS";
    fs::write(dir.join("checkpoint.json"), checkpoint("cafef00d", "cr", Some("failed\u{1b}[1m"), reason)).unwrap();
    let r = td.mam().args(["loop", "status", "cafef00d"]).run();
    r.expect_rc(0);
    let out = r.stdout();
    assert!(!out.contains('\u{1b}') && !out.contains('\u{7}') && !out.contains('\r'), "{out:?}");
    assert!(!out.lines().any(|l| l.starts_with("VERDICT:") || l.starts_with("RESULT=")), "{out}");
    assert!(out.contains("reason: failed\\u{1b}") || out.contains("reason: failed\\x1b"), "{out}");
    assert!(out.contains("(record now no record;"), "{out}");
}
