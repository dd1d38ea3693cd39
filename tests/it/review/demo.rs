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
    // Issue 18: a release build newer than the sources is run as it is; cargo is never asked.
    let bins = DemoBins::new(&td);
    let release = bins.release(true);
    let r = bins.demo(&td, "demo_loop.sh", &[]).run_within(Duration::from_secs(120));
    r.expect_rc(0);
    let out = r.stdout();
    assert!(out.contains(&format!("using the release build {} (newer than the sources)", release.display())), "{out}");
    assert_eq!(bins.cargo_calls(), "", "the demo built again");
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

/// Issue 18: the loop demo picks its binary as `scripts/demo.sh` does: a release build older than
/// the sources (and no installed mam) is passed over and cargo builds a release binary in the
/// checkout (the recording cargo fails, and the demo says so); a fresh installed mam is used.
#[test]
fn demo_loop_script_builds_over_a_stale_binary_and_reuses_a_fresh_one() {
    let td = TestDir::new("demo-loop-bin");
    let bins = DemoBins::new(&td);
    let release = bins.release(false);
    let r = bins.demo(&td, "demo_loop.sh", &[]).run_within(Duration::from_secs(30));
    r.expect_rc(1);
    let out = r.stdout();
    assert!(out.contains(&format!("not using the release build {}: ", release.display())), "{out}");
    assert!(out.contains("building mam (cargo build --release"), "{out}");
    assert!(r.stderr().ends_with("\nERROR: demo_loop: cargo build failed\n"), "{}", r.stderr());
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).canonicalize().unwrap();
    assert_eq!(bins.cargo_calls(), format!("{}: build --release --quiet\n", here.display()));
    // A fresh installed mam: used (a creator kind that is not installed ends the run right after).
    let installed = bins.installed(true);
    let r = bins
        .demo(&td, "demo_loop.sh", &["--creator-agent", "mam-test-no-such-agent"])
        .run_within(Duration::from_secs(30));
    r.expect_rc(1);
    let out = r.stdout();
    assert!(out.contains(&format!("using the installed {} (mam ", installed.display())), "{out}");
    assert!(out.contains("--creator-agent mam-test-no-such-agent: not installed"), "{out}");
    assert_eq!(bins.cargo_calls().lines().count(), 1, "no second build");
}
