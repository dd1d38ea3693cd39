//! `scripts/demo_loop.sh` (issue 13, "A second demo"): passes in real tmux panes on the embedded
//! broker, checks its own outcome, and leaves nothing behind.

use std::fs;
use std::path::Path;
use std::time::Duration;

use crate::support::*;

#[test]
fn demo_loop_script_passes() {
    if !have_tool("tmux", "MAM_REQUIRE_TMUX") || !have_tool("bc", "MAM_REQUIRE_TMUX") {
        return;
    }
    let td = TestDir::new("demo-loop");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/demo_loop.sh");
    let r = td
        .command("bash")
        .args([script.as_os_str()])
        .env("MAM_BIN", mam_bin())
        .env("TMPDIR", td.path(""))
        .run_within(Duration::from_secs(120));
    r.expect_rc(0);
    let out = r.stdout();
    assert!(out.contains("PASS: both loops ended as expected"), "{out}");
    assert!(!out.contains("BAD "), "{out}");
    for step in ["VERDICT: NOT PASS", "corrector creator", "round 1: STALE", "OUTCOME=promoted RC=0"] {
        assert!(out.contains(step), "{step}: {out}");
    }
    let left: Vec<_> = fs::read_dir(td.path(""))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("mam-loop-demo."))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
