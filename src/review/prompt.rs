//! The review loop's prompts (ORCH 4.4, A37): the text of every job the loop delegates, and the two
//! fixed `key: value` blocks that open a prompt when the loop is pinned (`[worktree context]`,
//! `[review identity]`). Pure text: the caller writes the files and passes them by path.
//!
//! Every dispatch site builds its prompt through `Prompt`, which keeps the blocks apart from the
//! body: the body is byte-identical to the flag-less form (the golden fixtures under
//! `tests/fixtures/loop_prompts/`), and the blocks are the context file `delegate-job` renders
//! before the task, so no prompt can miss the block and none can carry it twice.

use std::fmt::Write as _;

/// One delegated prompt: the optional context (the blocks) and the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    pub context: Option<String>,
    pub body: String,
}

impl Prompt {
    /// The whole prompt as an agent reads it: the blocks, a blank line, the body.
    pub fn full(&self) -> String {
        match &self.context {
            Some(c) => format!("{}\n\n{}", c.trim_end(), self.body),
            None => self.body.clone(),
        }
    }
}

/// The facts of the `[worktree context]` block (4.4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Context {
    /// What the `path:` line names: the source root, the review tree, or a note.
    pub path: String,
    pub branch: Option<String>,
    pub head: String,
    pub base: String,
    /// Where the base came from: `--base <ref>` or the merge-base rule.
    pub base_origin: String,
    pub commits: u64,
    pub uncommitted: bool,
}

/// The `[review identity]` block (4.4, 4.6).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub loop_id: String,
    pub base: String,
    pub head: String,
    pub tree: String,
    pub snapshot_commit: String,
}

/// `[worktree context]`: fixed `key: value` lines, then a blank line.
pub fn context_block(c: &Context) -> String {
    let mut b = String::from("[worktree context]\n");
    let _ = writeln!(b, "path: {}", c.path);
    let _ = writeln!(b, "branch: {}", c.branch.as_deref().unwrap_or("(detached HEAD)"));
    let _ = writeln!(b, "head: {}", c.head);
    let _ = writeln!(b, "base: {}", c.base);
    let _ = writeln!(b, "base_origin: {}", c.base_origin);
    let _ = writeln!(b, "commits_since_base: {}", c.commits);
    let _ = writeln!(b, "uncommitted_changes: {}", if c.uncommitted { "yes" } else { "no" });
    b.push('\n');
    b
}

/// `[review identity]`: fixed `key: value` lines, then a blank line (the fake agent and a real
/// reviewer read `tree:` from here for their IDENTITY line).
pub fn identity_block(i: &Identity) -> String {
    format!(
        "[review identity]\nloop_id: {}\nbase: {}\nhead: {}\ntree: {}\nsnapshot_commit: {}\n\n",
        i.loop_id, i.base, i.head, i.tree, i.snapshot_commit
    )
}

fn task_section(b: &mut String, task: Option<&str>) {
    b.push_str("### The task\n\n");
    match task {
        Some(t) => {
            b.push_str(t.trim_end_matches(['\n', '\r']));
            b.push('\n');
        }
        None => b.push_str(
            "No task file was given: judge the diff against the base alone: is it correct, complete in \
             itself, tested, and free of regressions?\n",
        ),
    }
}

const VERDICT_LINES: &str = "VERDICT: PASS\nor\nVERDICT: NOT PASS\n";

const FINDINGS_RULE: &str = "Write your findings as a numbered list (`1.`, `2.`, ...), one finding per item, each \
     naming the file and what is wrong. A finding you number is one the creator must fix or \
     challenge.\n";

/// The planner job (4.5 step 1).
pub fn plan(task: &str) -> String {
    let mut b = String::from(
        "Write a plan for the task below. Do not change any file yet.\n\
         Your report is the plan: the steps, the files you will change, and how you will test the change.\n\n",
    );
    task_section(&mut b, Some(task));
    b
}

/// A plan revision after a NOT PASS plan round.
pub fn plan_revision(task: &str, round: u32, findings: &str) -> String {
    let mut b = format!(
        "Plan round {round}: the reviewers did not pass your plan. Their findings are in {findings}.\n\
         Revise the plan for the task below and write the complete revised plan as your report.\n\n"
    );
    task_section(&mut b, Some(task));
    b
}

/// A plan review (VERDICT only, no IDENTITY).
pub fn plan_review(task: &str, round: u32, plan: &str, own: bool) -> String {
    let whose = if own { "your own plan" } else { "the plan" };
    let mut b = format!(
        "Plan round {round}: review {whose} in {plan} for the task below. Do not change any file.\n\
         {FINDINGS_RULE}End your report with the line\n{VERDICT_LINES}\n"
    );
    task_section(&mut b, Some(task));
    b
}

/// The implementation job (4.5 step 2).
pub fn implement(task: &str, plan: Option<&str>) -> String {
    let follow = match plan {
        Some(p) => format!(", following the plan in {p}"),
        None => String::new(),
    };
    let mut b = format!(
        "Implement the task below{follow}.\n\
         Your report says what you changed and how you tested it.\n\n"
    );
    task_section(&mut b, Some(task));
    b
}

/// How a reviewer sees the change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A local reviewer: the diff by path, and where the tree under review is.
    DiffFile { diff: String, tree: String },
    /// A remote reviewer: the diff inline; the SHAs and the diff are its only evidence.
    Inline { diff: String },
    /// An unpinned round: the working tree and the creator's report.
    Unpinned { root: String, creator_report: String },
}

/// A review job (4.5 step 3c) and everything it may carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Review<'a> {
    pub round: u32,
    pub task: Option<&'a str>,
    pub change: Change,
    /// The sub-job table of step 3a, when the creator's jobs had sub-jobs.
    pub subjobs: Option<&'a str>,
    /// The findings of this reviewer the creator challenged: (n, reason).
    pub challenged: &'a [(u32, String)],
    /// A pinned round: the report must carry the IDENTITY line.
    pub pinned: bool,
    /// The creator reviewing its own change.
    pub own: bool,
    /// `env` isolation: the reviewer works in the source root and must not change it.
    pub env_tmpdir: Option<&'a str>,
}

pub fn review(r: &Review<'_>) -> String {
    let whose = if r.own { "your own change" } else { "the change" };
    let mut b = format!("Review round {}: review {whose} made for the task below.\n", r.round);
    match &r.change {
        Change::DiffFile { diff, tree } => {
            let _ = writeln!(
                b,
                "The change is the diff in {diff}. The tree under review is {tree}; read files there, \
                 do not modify anything in it."
            );
        }
        Change::Inline { diff } => {
            b.push_str(
                "You see no checkout: the SHAs in the [review identity] block and the diff below are your \
                 only evidence.\n\n```diff\n",
            );
            b.push_str(diff.trim_end_matches('\n'));
            b.push_str("\n```\n");
        }
        Change::Unpinned { root, creator_report } => {
            let _ = writeln!(
                b,
                "The change is in the working tree of {root}; the creator's report is {creator_report}. Do \
                 not modify anything there."
            );
        }
    }
    if let Some(t) = r.env_tmpdir {
        let _ = writeln!(b, "Use {t} as your TMPDIR for any scratch file.");
    }
    if let Some(t) = r.subjobs {
        b.push_str("\nThe creator's jobs ran these sub-jobs:\n\n");
        b.push_str(t.trim_end());
        b.push('\n');
    }
    if !r.challenged.is_empty() {
        b.push_str(
            "\nThe creator challenged these findings of yours from the last round. For each, write one line \
             `SUSTAINED <n>` (it must still be implemented) or `WITHDRAWN <n>`:\n",
        );
        for (n, reason) in r.challenged {
            let _ = writeln!(b, "- {n}: {reason}");
        }
    }
    b.push('\n');
    b.push_str(FINDINGS_RULE);
    if r.pinned {
        b.push_str(
            "End your report with these two lines, in this order: the IDENTITY line with the `tree:` value \
             of the [review identity] block, then your verdict:\nIDENTITY: <tree>\n",
        );
        b.push_str(VERDICT_LINES);
    } else {
        b.push_str("End your report with the line\n");
        b.push_str(VERDICT_LINES);
    }
    b.push('\n');
    task_section(&mut b, r.task);
    b
}

/// The correction job after a NOT PASS round (4.5 step 3g, A34).
pub fn correction(task: Option<&str>, round: u32, findings: &str) -> String {
    let mut b = format!(
        "Review round {round}: the reviewers did not pass your change. Their findings are in {findings}; \
         each is numbered within its reviewer's section.\n\
         For each finding either fix it or challenge it with your reasons. End your report with one line \
         per finding:\nFIXED <session>:<n>\nCHALLENGE <session>:<n>: <reason>\n\n"
    );
    task_section(&mut b, task);
    b
}

/// The comply job: sustained findings verbatim, plus any new findings (A34).
pub fn comply(task: Option<&str>, round: u32, sustained: &str, findings: Option<&str>) -> String {
    let mut b = format!(
        "Review round {round}: after your challenge the reviewers sustained these findings. Implement them; \
         no further challenge:\n\n{}\n\n",
        sustained.trim_end()
    );
    if let Some(f) = findings {
        let _ = write!(
            b,
            "New findings are in {f}: fix or challenge each of them, and end your report with one line per \
             new finding:\nFIXED <session>:<n>\nCHALLENGE <session>:<n>: <reason>\n\n"
        );
    }
    task_section(&mut b, task);
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> Context {
        Context {
            path: "/w/src".into(),
            branch: Some("feature".into()),
            head: "a".repeat(40),
            base: "b".repeat(40),
            base_origin: "--base main".into(),
            commits: 2,
            uncommitted: true,
        }
    }

    #[test]
    fn blocks_are_key_value_lines_ending_in_a_blank_line() {
        let c = context_block(&ctx());
        assert!(c.starts_with("[worktree context]\npath: /w/src\nbranch: feature\n"));
        assert!(c.ends_with("uncommitted_changes: yes\n\n"));
        let i = identity_block(&Identity {
            loop_id: "0123abcd".into(),
            base: "b".into(),
            head: "h".into(),
            tree: "t".into(),
            snapshot_commit: "s".into(),
        });
        assert_eq!(i, "[review identity]\nloop_id: 0123abcd\nbase: b\nhead: h\ntree: t\nsnapshot_commit: s\n\n");
    }

    #[test]
    fn the_full_prompt_is_the_blocks_then_the_flagless_body() {
        let body = implement("do it", None);
        let p = Prompt { context: Some(context_block(&ctx())), body: body.clone() };
        assert_eq!(p.full(), format!("{}{}", context_block(&ctx()), body));
        assert_eq!(Prompt { context: None, body: body.clone() }.full(), body);
    }

    #[test]
    fn pinned_reviews_ask_for_identity_then_verdict() {
        let r = Review {
            round: 1,
            task: Some("t"),
            change: Change::DiffFile { diff: "/d".into(), tree: "/tree".into() },
            subjobs: None,
            challenged: &[],
            pinned: true,
            own: false,
            env_tmpdir: None,
        };
        let text = review(&r);
        let id = text.find("IDENTITY: <tree>").unwrap();
        let v = text.find("VERDICT: PASS").unwrap();
        assert!(id < v);
        assert!(!review(&Review { pinned: false, ..r.clone() }).contains("IDENTITY"));
    }

    #[test]
    fn a_remote_review_carries_the_diff_inline_and_no_path() {
        let r = Review {
            round: 2,
            task: None,
            change: Change::Inline { diff: "+x\n".into() },
            subjobs: None,
            challenged: &[(1, "not a bug".into())],
            pinned: true,
            own: false,
            env_tmpdir: None,
        };
        let text = review(&r);
        assert!(text.contains("only evidence") && text.contains("```diff\n+x\n```"));
        assert!(text.contains("- 1: not a bug") && text.contains("SUSTAINED <n>"));
        assert!(text.contains("judge the diff against the base alone"));
        assert!(!text.contains('/'), "{text}");
    }
}
