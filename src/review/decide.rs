//! The review round's decision (ORCH 4.5 step 3, 4.6, 4.8, A34): what a round's facts call for
//! (re-review a stale round, re-measure before promotion, promote, re-review a self-review, send the
//! creator a correction or a comply job, or stop the loop with a reason), and the one staleness
//! comparison. Pure: it never touches a file, a process, git or the clock; `review::run` gathers the
//! facts and performs the answer.

use super::evidence::{Judged, Verdict};
use super::git::Fingerprint;

/// What one review round observed, gathered by `review::run`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundFacts {
    /// 1-based.
    pub round: u32,
    pub max_rounds: u32,
    /// No `--reviewer`: the creator reviews itself (3h).
    pub self_review: bool,
    /// `--worktree`/`--base`: the round reviewed a pinned snapshot (4.6).
    pub pinned: bool,
    /// Each reviewer's verdict as it counts (after `hold`), in the order the jobs ended.
    pub verdicts: Vec<(String, Verdict)>,
    /// The source changed while the reviewers read it (3e): their approvals are void.
    pub stale: bool,
    /// A reviewer sustained a finding the creator challenged (A34): the creator complies.
    pub sustained: bool,
    /// After every reviewer passed: whether the source changed before promotion (4.8); `None` until
    /// the loop has measured it (the answer `Recheck` asks for it).
    pub changed_after_approval: Option<bool>,
}

impl RoundFacts {
    /// Every reviewer passed (a round with no verdict counts as passed, as it always did).
    pub fn all_pass(&self) -> bool {
        self.verdicts.iter().all(|(_, v)| *v == Verdict::Pass)
    }

    fn last_round(&self) -> bool {
        self.round >= self.max_rounds
    }
}

/// Why the loop stops after a round (rc 1, the loop job's reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The last round went stale.
    StaleLastRound,
    /// Every reviewer passed, then the source changed before promotion.
    ChangedAfterApproval,
    /// The last round did not pass.
    Exhausted,
}

impl Failure {
    /// The loop job's reason and the checkpoint's.
    pub fn reason(self) -> &'static str {
        match self {
            Failure::StaleLastRound => "stale_last_round",
            Failure::ChangedAfterApproval => "changed_after_approval",
            Failure::Exhausted => "rounds_exhausted",
        }
    }

    /// The `ERROR: loop:` line of round `round`.
    pub fn message(self, round: u32) -> String {
        match self {
            Failure::StaleLastRound => {
                format!("round {round} (the last) went stale: the source changed during the review")
            }
            Failure::ChangedAfterApproval => {
                "the source changed after the reviewers passed it; nothing promoted".to_string()
            }
            Failure::Exhausted => format!("no PASS from every reviewer in {round} rounds"),
        }
    }
}

/// What the loop does after a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoundDecision {
    /// Stale with rounds left: the next round re-reviews, no correction job (3e).
    ReReviewStale,
    /// Every reviewer passed: pause (the test hook), re-measure the source, decide again.
    Recheck,
    /// Every reviewer passed and the source is unchanged: promote (4.8).
    Promote,
    /// A pinned self-review did not pass: the next round re-reviews without a correction job (3h).
    ReReview,
    /// The creator gets the findings in a correction job (3g).
    Correct,
    /// The creator gets the sustained findings in a comply job (3g, A34).
    Comply,
    /// The loop stops.
    Fail(Failure),
}

/// The round's decision. The order of the questions is the rule: staleness first (a stale round's
/// verdicts do not count), then the verdicts, then whether a round is left, then who corrects.
pub fn decide(f: &RoundFacts) -> RoundDecision {
    if f.stale {
        return if f.last_round() {
            RoundDecision::Fail(Failure::StaleLastRound)
        } else {
            RoundDecision::ReReviewStale
        };
    }
    if f.all_pass() {
        return match f.changed_after_approval {
            None => RoundDecision::Recheck,
            Some(true) => RoundDecision::Fail(Failure::ChangedAfterApproval),
            Some(false) => RoundDecision::Promote,
        };
    }
    if f.last_round() {
        return RoundDecision::Fail(Failure::Exhausted);
    }
    if f.self_review && f.pinned {
        return RoundDecision::ReReview;
    }
    if f.sustained {
        RoundDecision::Comply
    } else {
        RoundDecision::Correct
    }
}

/// The one staleness comparison (4.6, 3e, 4.8): `baseline` is what the round started from (the
/// pinned snapshot's head and tree, or an unpinned round's fingerprint; `None` when nothing was
/// measured, which is never stale), `now` the re-measure (`None` when it failed, which counts as
/// changed).
pub fn changed(baseline: Option<&Fingerprint>, now: Option<&Fingerprint>) -> bool {
    match (baseline, now) {
        (None, _) => false,
        (Some(_), None) => true,
        (Some(b), Some(n)) => b.head != n.head || b.tree != n.tree,
    }
}

/// A34: a finding the reviewer sustained after the creator's challenge is not passed, so a PASS
/// with one counts as NOT PASS with a synthetic line.
pub fn hold(j: &mut Judged, held: &[u32]) {
    if !held.is_empty() && j.verdict == Verdict::Pass {
        j.verdict = Verdict::NotPass;
        j.synthetic = Some(format!("SYNTHETIC: sustained finding(s) {held:?}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table cell: `None` is "any value".
    type Cell = Option<bool>;

    /// One row of the decision table: stale, all pass, changed after approval (`Some(None)` = not
    /// measured yet), last round, self-review, pinned, sustained; and the answer.
    struct Row {
        stale: Cell,
        pass: Cell,
        after: Option<Option<bool>>,
        last: Cell,
        own: Cell,
        pinned: Cell,
        sustained: Cell,
        then: RoundDecision,
    }

    const ANY: Cell = None;
    const T: Cell = Some(true);
    const F: Cell = Some(false);

    #[allow(clippy::too_many_arguments)] // a table row reads best as one call
    const fn row(
        stale: Cell,
        pass: Cell,
        after: Option<Option<bool>>,
        last: Cell,
        own: Cell,
        pinned: Cell,
        sustained: Cell,
        then: RoundDecision,
    ) -> Row {
        Row { stale, pass, after, last, own, pinned, sustained, then }
    }

    use RoundDecision as D;

    /// The decision table. The rows do not overlap: every cell of the input space matches exactly
    /// one row (the test checks that too).
    const TABLE: &[Row] = &[
        row(T, ANY, None, F, ANY, ANY, ANY, D::ReReviewStale),
        row(T, ANY, None, T, ANY, ANY, ANY, D::Fail(Failure::StaleLastRound)),
        row(F, T, Some(None), ANY, ANY, ANY, ANY, D::Recheck),
        row(F, T, Some(Some(true)), ANY, ANY, ANY, ANY, D::Fail(Failure::ChangedAfterApproval)),
        row(F, T, Some(Some(false)), ANY, ANY, ANY, ANY, D::Promote),
        row(F, F, None, T, ANY, ANY, ANY, D::Fail(Failure::Exhausted)),
        row(F, F, None, F, T, T, ANY, D::ReReview),
        row(F, F, None, F, T, F, F, D::Correct),
        row(F, F, None, F, T, F, T, D::Comply),
        row(F, F, None, F, F, ANY, F, D::Correct),
        row(F, F, None, F, F, ANY, T, D::Comply),
    ];

    fn fits(c: Cell, v: bool) -> bool {
        c.is_none_or(|c| c == v)
    }

    fn matches(r: &Row, cell: &(bool, bool, Option<bool>, bool, bool, bool, bool)) -> bool {
        let &(stale, pass, after, last, own, pinned, sustained) = cell;
        fits(r.stale, stale)
            && fits(r.pass, pass)
            && r.after.is_none_or(|a| a == after)
            && fits(r.last, last)
            && fits(r.own, own)
            && fits(r.pinned, pinned)
            && fits(r.sustained, sustained)
    }

    fn facts(cell: &(bool, bool, Option<bool>, bool, bool, bool, bool)) -> RoundFacts {
        let &(stale, pass, after, last, own, pinned, sustained) = cell;
        let verdicts = if pass {
            vec![("r1".to_string(), Verdict::Pass), ("r2".to_string(), Verdict::Pass)]
        } else {
            vec![("r1".to_string(), Verdict::Pass), ("r2".to_string(), Verdict::NotPass)]
        };
        RoundFacts {
            round: if last { 3 } else { 2 },
            max_rounds: 3,
            self_review: own,
            pinned,
            verdicts,
            stale,
            sustained,
            changed_after_approval: after,
        }
    }

    /// Every cell (2 x 2 x 3 x 2 x 2 x 2 x 2 = 192) against the table.
    #[test]
    fn decide_walks_every_cell_of_the_table() {
        let b = [false, true];
        let mut cells = 0;
        let mut used = vec![0; TABLE.len()];
        for stale in b {
            for pass in b {
                for after in [None, Some(false), Some(true)] {
                    for last in b {
                        for own in b {
                            for pinned in b {
                                for sustained in b {
                                    let cell = (stale, pass, after, last, own, pinned, sustained);
                                    let rows: Vec<usize> =
                                        (0..TABLE.len()).filter(|&i| matches(&TABLE[i], &cell)).collect();
                                    assert_eq!(rows.len(), 1, "cell {cell:?} matches rows {rows:?}");
                                    used[rows[0]] += 1;
                                    assert_eq!(decide(&facts(&cell)), TABLE[rows[0]].then, "cell {cell:?}");
                                    cells += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(cells, 192);
        assert!(used.iter().all(|&n| n > 0), "a row no cell reaches: {used:?}");
    }

    #[test]
    fn decide_counts_a_round_without_verdicts_as_passed_and_one_not_pass_as_not_passed() {
        let mut f = facts(&(false, true, None, false, false, true, false));
        f.verdicts.clear();
        assert_eq!(decide(&f), RoundDecision::Recheck);
        f.verdicts = vec![("r1".into(), Verdict::NotPass)];
        assert_eq!(decide(&f), RoundDecision::Correct);
    }

    #[test]
    fn decide_the_last_round_is_round_equal_to_max() {
        let mut f = facts(&(false, false, None, false, false, true, false));
        f.round = 1;
        f.max_rounds = 1;
        assert_eq!(decide(&f), RoundDecision::Fail(Failure::Exhausted));
        f.max_rounds = 2;
        assert_eq!(decide(&f), RoundDecision::Correct);
    }

    #[test]
    fn failure_reasons_and_messages() {
        let all = [Failure::StaleLastRound, Failure::ChangedAfterApproval, Failure::Exhausted];
        let reasons: Vec<&str> = all.iter().map(|f| f.reason()).collect();
        assert_eq!(reasons, ["stale_last_round", "changed_after_approval", "rounds_exhausted"]);
        assert_eq!(
            Failure::StaleLastRound.message(4),
            "round 4 (the last) went stale: the source changed during the review"
        );
        assert_eq!(
            Failure::ChangedAfterApproval.message(4),
            "the source changed after the reviewers passed it; nothing promoted"
        );
        assert_eq!(Failure::Exhausted.message(4), "no PASS from every reviewer in 4 rounds");
    }

    fn fp(head: &str, tree: &str) -> Fingerprint {
        Fingerprint { head: head.into(), tree: tree.into() }
    }

    /// Baseline (none, some) x re-measure (failed, same, other head, other tree).
    #[test]
    fn changed_walks_every_cell() {
        let b = fp("h", "t");
        let nows = [None, Some(fp("h", "t")), Some(fp("h2", "t")), Some(fp("h", "t2"))];
        let got: Vec<bool> = nows.iter().map(|n| changed(None, n.as_ref())).collect();
        assert_eq!(got, [false, false, false, false]);
        let got: Vec<bool> = nows.iter().map(|n| changed(Some(&b), n.as_ref())).collect();
        assert_eq!(got, [true, false, true, true]);
    }

    #[test]
    fn hold_turns_a_pass_with_a_sustained_finding_into_not_pass() {
        let judged = |r: &str| super::super::evidence::judge(r, None, false);
        let mut j = judged("VERDICT: PASS\n");
        hold(&mut j, &[]);
        assert_eq!((j.verdict, j.synthetic.as_deref()), (Verdict::Pass, None));
        hold(&mut j, &[2, 5]);
        assert_eq!(
            (j.verdict, j.synthetic.as_deref()),
            (Verdict::NotPass, Some("SYNTHETIC: sustained finding(s) [2, 5]"))
        );
        // A NOT PASS keeps its own (absent) synthetic line.
        let mut j = judged("VERDICT: NOT PASS\n");
        hold(&mut j, &[1]);
        assert_eq!((j.verdict, j.synthetic.as_deref()), (Verdict::NotPass, None));
    }
}
