//! ORCH 4.9: validation before the lock (tests 1-3, 14, 23, 27, 28), bad input, and a first
//! promoted loop.

use std::fs;

use super::*;

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
