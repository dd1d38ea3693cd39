//! `mam loop` (ORCH 4): validation before the lock (4.2, `review::validate`), the loop dir, the
//! per-creator lock and the frozen binary (4.3), the plan / implement / review phases (4.5) with pinning, isolation,
//! staleness (4.6), budgets and the stall watcher (4.7), promotion (4.8). It never prints: every
//! line goes through the caller's `say`.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use serde_json::json;

use super::checkpoint::{self, Checkpoint, JobRow, ReviewerRow, Round, RoundIdentity};
use super::decide::{self, RoundDecision, RoundFacts};
use super::dispatch::{self, Budget, ChildSpec};
use super::evidence::{self, CreatorLine, Ruling, Verdict};
use super::git::{self, Fingerprint, Guard, PinError, Repo, Snapshot};
use super::prompt::{self, Change, Prompt};
use super::validate::{validate, Plan};
pub use super::validate::{Isolation, LoopError, Options, RemoteReview};
use crate::clock;
use crate::ctx::{ChildRole, Ctx};
use crate::diffcollect;
use crate::notify;
use crate::ops;
use crate::registry::engine::Kind;
use crate::registry::is_terminal;
use crate::registry::store::Store;
use crate::session;
use crate::sys::{self, Flock, LockMode};
use crate::text::{one_line, show_path};

/// How much of a report the evidence check reads; a longer report counts as cut (A35).
pub const MAX_REPORT_BYTES: u64 = 1024 * 1024;
/// The poll interval of every wait.
const POLL: Duration = Duration::from_millis(100);

/// How a loop ended.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub loop_id: String,
    pub outcome: String,
    pub rc: i32,
    pub reports: Option<PathBuf>,
    pub checkpoint: PathBuf,
    pub reason: Option<String>,
}

/// Where a line goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Out {
    Stdout,
    Stderr,
}

/// Why the loop stopped early.
#[derive(Debug)]
enum Stop {
    /// rc 1 with a reason for the loop job (`rounds_exhausted`, ...).
    Fail { reason: String, msg: String },
    /// A refused round (A39): rc 1, `refused:<cause>`.
    Refused { round: u32, cause: String, msg: String },
    /// SIGTERM/SIGINT.
    Interrupted(i32),
    /// The wall clock ran out.
    WallClock(String),
}

fn fail(reason: &str, msg: impl Into<String>) -> Stop {
    Stop::Fail { reason: reason.into(), msg: msg.into() }
}

/// One job to dispatch.
struct Spec {
    session: String,
    remote: bool,
    jid: String,
    role: &'static str,
    round: u32,
    prompt: Prompt,
    /// The file stem under `prompts/`.
    name: String,
    /// Where the report is copied when the job ends.
    copy_to: PathBuf,
}

/// A job that ended.
struct Done {
    session: String,
    jid: String,
    report: String,
    truncated: bool,
    copy: PathBuf,
}

/// Per reviewer: the findings the creator challenged, by number with the reason (for the next prompt).
type Challenged = HashMap<String, Vec<(u32, String)>>;

/// What the review rounds carry from one round to the next.
#[derive(Default)]
struct Carry {
    /// The challenges of the creator's last correction or comply job.
    challenged: Challenged,
    /// Each reviewer's last report (a comply job quotes the findings it sustained).
    last_reports: HashMap<String, String>,
}

/// The gathered inputs of one round's review jobs.
struct RoundInput<'a> {
    round: u32,
    pin: Option<&'a Snapshot>,
    diff: Option<String>,
    diff_path: PathBuf,
    tree_path: Option<PathBuf>,
    isolation: &'static str,
    /// The creator's sub-job table (3a), when it had sub-jobs.
    table: Option<String>,
}

/// The evidence check of a round (3d).
#[derive(Default)]
struct Judgement {
    verdicts: Vec<(String, Verdict)>,
    /// The findings section of each report that did not pass.
    sections: Vec<String>,
    /// (reviewer, its previous report, the finding numbers it sustained).
    sustained: Vec<(String, String, Vec<u32>)>,
}

/// A round observed: the facts the decision reads, and what acting on it needs.
struct Seen {
    facts: RoundFacts,
    /// What the re-measure compares with (`decide::changed`).
    baseline: Option<Fingerprint>,
    pin: Option<Snapshot>,
    dones: Vec<Done>,
    sections: Vec<String>,
    sustained: Vec<(String, String, Vec<u32>)>,
}

/// The comply job's list: each sustained finding as `- <reviewer>:<n>: <its text>`.
fn sustained_items(sustained: &[(String, String, Vec<u32>)]) -> String {
    let mut text = String::new();
    for (session, prev, ns) in sustained {
        let items = evidence::numbered_findings(prev);
        for n in ns {
            let item = items.iter().find(|(k, _)| k == n).map(|(_, t)| t.as_str()).unwrap_or("(text not found)");
            let _ = writeln!(text, "- {session}:{n}: {}", item.trim());
        }
    }
    text
}

struct InFlight {
    spec: Spec,
    child: Child,
    row: usize,
    dispatched_ms: u64,
    stdout: PathBuf,
    stderr: PathBuf,
    last_stall_ms: Option<u64>,
}

struct Loop<'a> {
    ctx: &'a Ctx,
    /// The context of the loop's own git runs: TMPDIR is `<loop dir>/tmp`, so the temporary indexes
    /// of pin and re-measure do not depend on the user's TMPDIR (only the review trees live there).
    gctx: Ctx,
    o: &'a Options,
    say: &'a mut dyn FnMut(Out, &str),
    p: Plan,
    cp: Checkpoint,
    cp_path: PathBuf,
    dir: PathBuf,
    frozen: PathBuf,
    store: Store,
    started: Instant,
    inflight: Vec<InFlight>,
    trees: Vec<PathBuf>,
    creator_jid: String,
    creator_registered: bool,
    /// The creator's latest report (copy in the loop dir).
    creator_report: Option<PathBuf>,
    seq: u32,
    exclude: Vec<PathBuf>,
    /// The caller's orchestrator (A42), passed to every delegation.
    orchestrator: Option<String>,
    /// Each reviewer's loop record (and the creator's self-review record), drawn once (A32).
    reviewer_ids: HashMap<String, String>,
}

/// The whole loop. `Err` only before the loop dir exists (validation, lock, preparation).
pub fn run(ctx: &Ctx, o: &Options, say: &mut dyn FnMut(Out, &str)) -> Result<Outcome, LoopError> {
    let p = validate(ctx, o)?;
    // Lock (A39 start order: validate -> lock -> loop dir -> freeze -> checkpoint).
    let loop_root = p.control.join(".mam").join("loop");
    sys::create_dir_all(&loop_root)
        .map_err(|e| LoopError::Failed(format!("loop: cannot create {} ({e})", show_path(&loop_root))))?;
    let lock = lock_creator(&loop_root, &o.creator)?;
    let loop_id = sys::random_hex(4).map_err(|e| LoopError::Failed(format!("loop: no random bytes ({e})")))?;
    let _ = sys::write_in_place(&lock.file, format!("{loop_id}\n").as_bytes());
    let dir = loop_root.join(&loop_id);
    for d in [dir.clone(), dir.join("prompts"), dir.join("review"), dir.join("bin"), dir.join("tmp")] {
        sys::create_dir_all(&d)
            .map_err(|e| LoopError::Failed(format!("loop: cannot create {} ({e})", show_path(&d))))?;
    }
    let frozen = dir.join("bin").join("mam");
    freeze(&frozen).map_err(|e| LoopError::Failed(format!("loop: cannot copy mam to {} ({e})", show_path(&frozen))))?;
    let creator_jid = clock::new_job_id().map_err(|e| LoopError::Failed(format!("loop: no job id ({e})")))?;
    let now = clock::now_ts();
    let cp = Checkpoint {
        loop_id: loop_id.clone(),
        framework_version: crate::version::VERSION.to_string(),
        pid: std::process::id(),
        control_root: p.control.display().to_string(),
        source_root: p.source.display().to_string(),
        registry: p.resolved.registry.display().to_string(),
        base: p.base.as_ref().map(|b| b.0.clone()),
        base_origin: p.base.as_ref().map(|b| b.1.clone()),
        creator: o.creator.clone(),
        creator_jid: creator_jid.clone(),
        reviewers: o.reviewers.clone(),
        phase: if o.plan { "plan" } else { "implement" }.into(),
        round: 0,
        max_rounds: o.max_rounds,
        plan_path: p.plan_file.as_ref().map(|p| p.display().to_string()),
        collector: frozen.display().to_string(),
        started_at: now.clone(),
        updated_at: now,
        wall_clock_s: o.wall_clock_s,
        jobs: Vec::new(),
        review_rounds: Vec::new(),
        promoted: Vec::new(),
        outcome: None,
        reason: None,
        rc: None,
    };
    let cp_path = dir.join("checkpoint.json");
    cp.write(&cp_path).map_err(|e| LoopError::Failed(format!("loop: {e}")))?;
    let store = Store::from_resolved(&p.resolved);
    let mut exclude = vec![p.control.join(".mam"), p.resolved.registry.clone(), p.resolved.logs.clone()];
    if p.source != p.control {
        exclude.push(p.source.join(".mam"));
    }
    let mut gctx = ctx.clone();
    gctx.set_var("TMPDIR", Some(dir.join("tmp").as_os_str()));
    let mut lp = Loop {
        ctx,
        gctx,
        o,
        say,
        p,
        cp,
        cp_path,
        dir,
        frozen,
        store,
        started: Instant::now(),
        inflight: Vec::new(),
        trees: Vec::new(),
        creator_jid,
        creator_registered: false,
        creator_report: None,
        seq: 0,
        exclude,
        reviewer_ids: HashMap::new(),
        orchestrator: None,
    };
    lp.orchestrator = crate::delegate::orchestrator_for(ctx, &lp.p.resolved, &lp.store, o.parent.as_deref());
    lp.line(&format!(
        "loop {loop_id}: creator {}, reviewers {}, control root {}, source {}{}",
        o.creator,
        if o.reviewers.is_empty() { "none (self-review)".to_string() } else { o.reviewers.join(", ") },
        show_path(&lp.p.control),
        show_path(&lp.p.source),
        match &lp.p.base {
            Some((b, origin)) => format!(", base {} ({origin})", &b[..12.min(b.len())]),
            None => String::new(),
        }
    ));
    let result = lp.drive();
    let out = lp.finish(result);
    drop(lock);
    Ok(out)
}

/// The creator's loop lock (4.3): one loop per creator; a held lock names the loop that holds it.
fn lock_creator(loop_root: &Path, creator: &str) -> Result<Flock, LoopError> {
    let lock_path = loop_root.join(format!("{creator}.lock"));
    let file = sys::open_lock_file(&lock_path)
        .map_err(|e| LoopError::Failed(format!("loop: cannot open the lock {} ({e})", show_path(&lock_path))))?;
    match Flock::try_acquire(file, LockMode::Exclusive) {
        Ok(Some(l)) => Ok(l),
        Ok(None) => {
            let holder = std::fs::read_to_string(&lock_path).unwrap_or_default();
            let holder = holder.trim();
            Err(LoopError::Busy(format!(
                "loop: creator {creator} is busy: loop {} holds {}; wait for it or stop it",
                if holder.is_empty() { "(unknown)" } else { holder },
                show_path(&lock_path)
            )))
        }
        Err(e) => Err(LoopError::Failed(format!("loop: cannot lock {} ({e})", show_path(&lock_path)))),
    }
}

/// Copies this executable to `dest` (0755), so a rebuild in the tree under review cannot change
/// the running loop (4.3).
fn freeze(dest: &Path) -> std::io::Result<()> {
    use std::io::Read;
    let exe = std::env::current_exe()?;
    let mut bytes = Vec::new();
    std::fs::File::open(&exe)?.read_to_end(&mut bytes)?;
    sys::atomic_write(dest, &bytes)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dest, std::fs::Permissions::from_mode(0o755))
}

impl Loop<'_> {
    fn line(&mut self, s: &str) {
        (self.say)(Out::Stdout, s);
    }
    fn diag(&mut self, s: &str) {
        (self.say)(Out::Stderr, s);
    }
    fn elapsed(&self) -> String {
        format!("{:.1} s", self.started.elapsed().as_secs_f64())
    }
    fn save(&mut self) {
        self.cp.updated_at = clock::now_ts();
        if let Err(e) = self.cp.write(&self.cp_path) {
            let l = format!("WARNING: {e}");
            self.diag(&l);
        }
    }
    fn pinned(&self) -> bool {
        self.p.base.is_some()
    }
    fn repo(&self) -> Repo {
        Repo { root: self.p.source.clone(), exclude: self.exclude.clone() }
    }
    /// Whole seconds of wall clock left; None = no wall clock (A36).
    fn remaining(&self) -> Option<u64> {
        if self.o.wall_clock_s == 0 {
            return None;
        }
        Some((self.o.wall_clock_s as u64).saturating_sub(self.started.elapsed().as_secs()))
    }
    fn check_signal(&self) -> Result<(), Stop> {
        match sys::pending_signal() {
            Some(s) => Err(Stop::Interrupted(s)),
            None => Ok(()),
        }
    }

    fn drive(&mut self) -> Result<(), Stop> {
        let plan = self.plan_phase()?;
        self.implement_phase(plan.as_deref())?;
        self.review_rounds()
    }

    // ---- plan (4.5 step 1) ----

    fn plan_phase(&mut self) -> Result<Option<String>, Stop> {
        if let Some(p) = &self.p.plan_file {
            let s = p.display().to_string();
            self.line(&format!("plan: using {} (--plan-file)", show_path(p)));
            return Ok(Some(s));
        }
        if !self.o.plan {
            return Ok(None);
        }
        self.cp.phase = "plan".into();
        let task = self.p.task.clone().unwrap_or_default();
        let creator = self.o.creator.clone();
        let mut body = prompt::plan(&task);
        let mut role = "planner";
        for round in 1..=self.o.max_rounds {
            let name = format!("plan{round}-{creator}");
            let copy = self.dir.join("review").join(format!("p{round}")).join(format!("{creator}.plan.md"));
            // With --worktree/--base every prompt opens with the context block (4.4), plan jobs too.
            let context = self.creator_context()?;
            let spec =
                self.creator_spec(role, round, Prompt { context: context.clone(), body: body.clone() }, &name, copy);
            let done = self.dispatch(vec![spec])?.remove(0);
            if done.report.trim().is_empty() {
                return Err(fail("empty_plan", format!("plan round {round}: the planner's report is empty")));
            }
            let plan_copy = done.copy.display().to_string();
            // Reviewers (or the creator itself) judge the plan: VERDICT only.
            let specs = self.plan_review_specs(round, &task, &plan_copy, &context)?;
            let dones = self.dispatch(specs)?;
            let mut sections = Vec::new();
            let mut rows = Vec::new();
            for d in &dones {
                let j = evidence::judge(&d.report, None, d.truncated);
                self.line(&format!(
                    "plan round {round} · plan-reviewer {} · job {} · VERDICT: {} · {}",
                    d.session,
                    d.jid,
                    j.verdict.as_str(),
                    self.elapsed()
                ));
                if j.verdict != Verdict::Pass {
                    sections.push(evidence::findings_section(&d.session, &d.jid, &d.report, j.synthetic.as_deref()));
                }
                rows.push(ReviewerRow {
                    session: d.session.clone(),
                    jid: d.jid.clone(),
                    transport: "local".into(),
                    evidence: "plan".into(),
                    verdict: Some(j.verdict.as_str().into()),
                    synthetic: j.synthetic.clone(),
                    report: Some(d.copy.display().to_string()),
                });
            }
            self.cp.review_rounds.push(Round {
                round,
                kind: "plan".into(),
                identity: None,
                snapshot_commit: None,
                isolation: "none".into(),
                stale: false,
                diff: None,
                reviewers: rows,
            });
            self.save();
            if sections.is_empty() {
                let dest = self.reports_dir().join(&creator).join(format!("plan-{}.md", self.creator_jid));
                self.promote_file(&done.copy, &dest)
                    .map_err(|e| fail("promotion_failed", format!("cannot promote the plan: {e}")))?;
                self.line(&format!("plan: passed in round {round}; promoted to {}", show_path(&dest)));
                let s = dest.display().to_string();
                self.cp.plan_path = Some(s.clone());
                self.save();
                return Ok(Some(s));
            }
            if round == self.o.max_rounds {
                break;
            }
            let findings = self.dir.join("review").join(format!("p{round}")).join("findings.md");
            sys::atomic_write(&findings, evidence::findings_file(&sections).as_bytes())
                .map_err(|e| fail("delegation_failed", format!("cannot write {}: {e}", show_path(&findings))))?;
            body = prompt::plan_revision(&task, round, &findings.display().to_string());
            role = "planner";
        }
        Err(fail("plan_rounds_exhausted", format!("the plan did not pass in {} rounds", self.o.max_rounds)))
    }

    /// One plan-review job per reviewer (or the creator's own), in the reviewers' order.
    fn plan_review_specs(
        &mut self,
        round: u32,
        task: &str,
        plan_copy: &str,
        context: &Option<String>,
    ) -> Result<Vec<Spec>, Stop> {
        let mut specs = Vec::new();
        for (session, remote, own) in &self.reviewer_list() {
            let jid = self.reviewer_jid(session, own.then_some("self"))?;
            let text = prompt::plan_review(task, round, plan_copy, *own);
            let copy = self.dir.join("review").join(format!("p{round}")).join(format!("{session}.md"));
            specs.push(Spec {
                session: self.address(session, *remote),
                remote: *remote,
                jid,
                role: "plan-reviewer",
                round,
                prompt: Prompt { context: context.clone(), body: text },
                name: format!("plan{round}-review-{session}"),
                copy_to: copy,
            });
        }
        Ok(specs)
    }

    // ---- implement (4.5 step 2) ----

    fn implement_phase(&mut self, plan: Option<&str>) -> Result<(), Stop> {
        self.cp.phase = "implement".into();
        self.save();
        if self.o.review_only {
            self.line("implement: skipped (--review-only); the creator still gets correction and comply jobs");
            return Ok(());
        }
        let task = self.p.task.clone().unwrap_or_default();
        let body = prompt::implement(&task, plan);
        let context = self.creator_context()?;
        let creator = self.o.creator.clone();
        let copy = self.dir.join("review").join("implement").join(format!("{creator}.md"));
        let spec = self.creator_spec("implementer", 0, Prompt { context, body }, &format!("implement-{creator}"), copy);
        self.dispatch(vec![spec])?;
        Ok(())
    }

    // ---- review rounds (4.5 step 3) ----

    /// Gather, decide, act: each round is observed (`review_round`), `decide::decide` says what it
    /// calls for, and the answer is performed here; a re-measure before promotion is one more fact.
    fn review_rounds(&mut self) -> Result<(), Stop> {
        self.cp.phase = "review".into();
        let mut carry = Carry::default();
        for round in 1..=self.o.max_rounds {
            let mut seen = self.review_round(round, &mut carry)?;
            loop {
                match decide::decide(&seen.facts) {
                    RoundDecision::Recheck => {
                        self.pause_before_promote();
                        seen.facts.changed_after_approval = Some(self.changed(seen.baseline.as_ref()));
                    }
                    RoundDecision::Promote => return self.promote(round, seen.pin.as_ref(), &seen.dones),
                    RoundDecision::Fail(f) => return Err(fail(f.reason(), f.message(round))),
                    RoundDecision::ReReviewStale | RoundDecision::ReReview => break,
                    RoundDecision::Correct => {
                        carry.challenged = self.correct(round, false, &seen)?;
                        break;
                    }
                    RoundDecision::Comply => {
                        carry.challenged = self.correct(round, true, &seen)?;
                        break;
                    }
                }
            }
        }
        // Not reached while max_rounds >= 1 (4.2): the last round's decision always ends the loop.
        Err(fail("rounds_exhausted", format!("no PASS from every reviewer in {} rounds", self.o.max_rounds)))
    }

    /// One round up to its facts (3a-3e): the creator's sub-jobs waited for, the pin and the guard,
    /// the isolation and the diff, the reviewers dispatched and judged, the re-measure; the round is
    /// recorded in the checkpoint (and a stale one said) before anything is decided.
    fn review_round(&mut self, round: u32, carry: &mut Carry) -> Result<Seen, Stop> {
        self.cp.round = round;
        self.save();
        let subjobs = self.wait_subjobs()?;
        let table = subjobs.as_ref().map(|rows| subjob_table(rows));
        // Pin (4.6) and the fail-closed guard (3b); what the re-measure compares with: the snapshot,
        // or, unpinned, the source once the sub-jobs ended (no sub-jobs: nothing to compare).
        let pin = if self.pinned() { Some(self.pin_round(round)?) } else { None };
        let baseline = match &pin {
            Some(s) => Some(Fingerprint { head: s.head.clone(), tree: s.tree.clone() }),
            None if subjobs.is_some() => self.repo().fingerprint(&self.gctx).ok(),
            None => None,
        };
        // Isolation and the diff (3c).
        let (evidence_kind, isolation, tree_path) = self.open_isolation(round, pin.as_ref())?;
        let diff = match &pin {
            Some(s) => Some(self.collect_diff(round, s)?),
            None => None,
        };
        let diff_path = self.dir.join("review").join(format!("r{round}.diff"));
        let mut row = self.round_row(round, pin.as_ref(), isolation, diff.as_ref().map(|_| &diff_path));
        let input = RoundInput { round, pin: pin.as_ref(), diff, diff_path, tree_path, isolation, table };
        let specs = self.review_specs(&input, &carry.challenged)?;
        let dones = match self.dispatch(specs) {
            Ok(d) => d,
            Err(e) => {
                self.cp.review_rounds.push(row);
                self.close_trees();
                return Err(e);
            }
        };
        // Evidence check (3d).
        let judged = self.judge_round(round, pin.as_ref(), evidence_kind, &dones, carry, &mut row);
        // Re-measure (3e).
        let stale = self.changed(baseline.as_ref());
        row.stale = stale;
        self.cp.review_rounds.push(row);
        self.close_trees();
        self.save();
        if stale {
            self.line(&format!("round {round}: STALE: the source changed during the review; its approvals are void"));
        }
        let facts = RoundFacts {
            round,
            max_rounds: self.o.max_rounds,
            self_review: self.o.reviewers.is_empty(),
            pinned: pin.is_some(),
            verdicts: judged.verdicts,
            stale,
            sustained: !judged.sustained.is_empty(),
            changed_after_approval: None,
        };
        Ok(Seen { facts, baseline, pin, dones, sections: judged.sections, sustained: judged.sustained })
    }

    /// The checkpoint row of a review round, before its reviewers report.
    fn round_row(&self, round: u32, pin: Option<&Snapshot>, isolation: &str, diff: Option<&PathBuf>) -> Round {
        Round {
            round,
            kind: "review".into(),
            identity: pin.map(|s| RoundIdentity {
                loop_id: self.cp.loop_id.clone(),
                base: self.p.base.as_ref().map(|b| b.0.clone()).unwrap_or_default(),
                head: s.head.clone(),
                tree: s.tree.clone(),
            }),
            snapshot_commit: pin.map(|s| s.commit.clone()),
            isolation: isolation.into(),
            stale: false,
            diff: diff.map(|p| p.display().to_string()),
            reviewers: Vec::new(),
        }
    }

    /// One review job per reviewer (or the creator's self-review), in the reviewers' order.
    fn review_specs(&mut self, r: &RoundInput, challenged: &Challenged) -> Result<Vec<Spec>, Stop> {
        let round = r.round;
        let mut specs = Vec::new();
        for (session, remote, own) in &self.reviewer_list() {
            let jid = self.reviewer_jid(session, own.then_some("self"))?;
            let change = match (r.pin, *remote) {
                (Some(_), true) => Change::Inline { diff: r.diff.clone().unwrap_or_default() },
                (Some(_), false) => Change::DiffFile {
                    diff: r.diff_path.display().to_string(),
                    tree: r
                        .tree_path
                        .as_ref()
                        .map(|t| t.display().to_string())
                        .unwrap_or_else(|| format!("{} (the source root, env isolation)", self.p.source.display())),
                },
                (None, _) => Change::Unpinned {
                    root: self.p.source.display().to_string(),
                    creator_report: self
                        .creator_report
                        .as_ref()
                        .map(|p| p.display().to_string())
                        .unwrap_or_else(|| "none".into()),
                },
            };
            let env_tmp = if r.isolation == "env" && !remote {
                let t = self.dir.join("tmp").join(format!("r{round}"));
                let _ = sys::create_dir_all(&t);
                Some(t.display().to_string())
            } else {
                None
            };
            let ch = challenged.get(session).cloned().unwrap_or_default();
            let body = prompt::review(&prompt::Review {
                round,
                task: self.p.task.as_deref(),
                change,
                subjobs: r.table.as_deref(),
                challenged: &ch,
                pinned: r.pin.is_some(),
                own: *own,
                env_tmpdir: env_tmp.as_deref(),
            });
            let context = r.pin.map(|s| self.review_context(s, *remote, r.tree_path.as_ref()));
            let copy = self.dir.join("review").join(format!("r{round}")).join(format!("{session}.md"));
            specs.push(Spec {
                session: self.address(session, *remote),
                remote: *remote,
                jid,
                role: if *own { "self-reviewer" } else { "reviewer" },
                round,
                prompt: Prompt { context, body },
                name: format!("r{round}-review-{session}"),
                copy_to: copy,
            });
        }
        Ok(specs)
    }

    /// A pinned reviewer's `[worktree context]` and `[review identity]` blocks (4.4, 4.6).
    fn review_context(&self, s: &Snapshot, remote: bool, tree_path: Option<&PathBuf>) -> String {
        let path = match (remote, tree_path) {
            (true, _) => "none (diff-only)".to_string(),
            (false, Some(t)) => t.display().to_string(),
            (false, None) => format!("{} (source root, env isolation)", self.p.source.display()),
        };
        let mut c = self.context_block_for(path);
        c.push_str(&prompt::identity_block(&prompt::Identity {
            loop_id: self.cp.loop_id.clone(),
            base: self.p.base.as_ref().map(|b| b.0.clone()).unwrap_or_default(),
            head: s.head.clone(),
            tree: s.tree.clone(),
            snapshot_commit: s.commit.clone(),
        }));
        c
    }

    /// 3d: each report judged (a finding sustained after a challenge is not passed, A34), its line
    /// said, its row added to the round; the verdicts, findings and sustained findings returned.
    fn judge_round(
        &mut self,
        round: u32,
        pin: Option<&Snapshot>,
        evidence_kind: &'static str,
        dones: &[Done],
        carry: &mut Carry,
        row: &mut Round,
    ) -> Judgement {
        let evidence_of: BTreeMap<String, &'static str> = crate::sort::ordered(
            self.reviewer_list()
                .into_iter()
                .map(|(s, remote, _)| (s, if remote { "diff-only" } else { evidence_kind })),
        );
        let want = pin.map(|s| s.tree.clone());
        let mut out = Judgement::default();
        for d in dones {
            let mut j = evidence::judge(&d.report, want.as_deref(), d.truncated);
            let held: Vec<u32> = if carry.challenged.contains_key(&d.session) {
                evidence::rulings(&d.report)
                    .into_iter()
                    .filter(|(_, r)| *r == Ruling::Sustained)
                    .map(|(n, _)| n)
                    .collect()
            } else {
                Vec::new()
            };
            decide::hold(&mut j, &held);
            if !held.is_empty() {
                let prev = carry.last_reports.get(&d.session).cloned().unwrap_or_default();
                out.sustained.push((d.session.clone(), prev, held));
            }
            let transport = if self.p.remote.contains(&d.session) { "remote" } else { "local" };
            self.line(&format!(
                "round {round} · {} {} · job {} · VERDICT: {}{} · {}",
                if d.session == self.o.creator { "self-reviewer" } else { "reviewer" },
                d.session,
                d.jid,
                j.verdict.as_str(),
                j.synthetic.as_deref().map(|s| format!(" ({s})")).unwrap_or_default(),
                self.elapsed()
            ));
            if j.verdict != Verdict::Pass {
                out.sections.push(evidence::findings_section(&d.session, &d.jid, &d.report, j.synthetic.as_deref()));
            }
            out.verdicts.push((d.session.clone(), j.verdict));
            row.reviewers.push(ReviewerRow {
                session: d.session.clone(),
                jid: d.jid.clone(),
                transport: transport.into(),
                evidence: if pin.is_some() {
                    evidence_of.get(&d.session).copied().unwrap_or("review-tree").into()
                } else {
                    "unpinned".into()
                },
                verdict: Some(j.verdict.as_str().into()),
                synthetic: j.synthetic.clone(),
                report: Some(d.copy.display().to_string()),
            });
            carry.last_reports.insert(d.session.clone(), d.report.clone());
        }
        out
    }

    /// The re-measure (3e, 4.8): whether the source moved from `baseline` (nothing measured: no).
    fn changed(&self, baseline: Option<&Fingerprint>) -> bool {
        if baseline.is_none() {
            return false;
        }
        let now = self.repo().fingerprint(&self.gctx).ok();
        decide::changed(baseline, now.as_ref())
    }

    /// 3g: the creator's correction job (the round's findings) or comply job (the sustained
    /// findings); returns the findings its report challenged, per reviewer, for the next round.
    fn correct(&mut self, round: u32, comply: bool, seen: &Seen) -> Result<Challenged, Stop> {
        let findings = self.dir.join("review").join(format!("r{round}")).join("findings.md");
        let _ = sys::create_dir_all(findings.parent().unwrap_or(&self.dir));
        sys::atomic_write(&findings, evidence::findings_file(&seen.sections).as_bytes())
            .map_err(|e| fail("delegation_failed", format!("cannot write {}: {e}", show_path(&findings))))?;
        let findings_s = findings.display().to_string();
        let (role, body) = if comply {
            let text = sustained_items(&seen.sustained);
            ("complier", prompt::comply(self.p.task.as_deref(), round, &text, Some(&findings_s)))
        } else {
            ("corrector", prompt::correction(self.p.task.as_deref(), round, &findings_s))
        };
        let context = self.creator_context()?;
        let creator = self.o.creator.clone();
        let copy = self.dir.join("review").join(format!("r{round}")).join(format!("{creator}.{role}.md"));
        let spec =
            self.creator_spec(role, round, Prompt { context, body }, &format!("r{round}-{role}-{creator}"), copy);
        let done = self.dispatch(vec![spec])?.remove(0);
        let mut challenged = Challenged::new();
        for l in evidence::creator_lines(&done.report) {
            if let CreatorLine::Challenge { session, n, reason } = l {
                challenged.entry(session).or_default().push((n, reason));
            }
        }
        Ok(challenged)
    }

    /// (session, remote, own): the reviewers, or the creator itself.
    fn reviewer_list(&self) -> Vec<(String, bool, bool)> {
        if self.o.reviewers.is_empty() {
            return vec![(self.o.creator.clone(), false, true)];
        }
        self.o.reviewers.iter().map(|r| (r.clone(), self.p.remote.contains(r), false)).collect()
    }

    fn address(&self, session: &str, remote: bool) -> String {
        if remote {
            format!("remote:{session}")
        } else {
            session.to_string()
        }
    }

    /// A reviewer's loop record, drawn once and re-dispatched each round (A32).
    fn reviewer_jid(&mut self, session: &str, own: Option<&str>) -> Result<String, Stop> {
        let key = format!("{session}{}", own.map(|o| format!("-{o}")).unwrap_or_default());
        if let Some(j) = self.reviewer_ids.get(&key) {
            return Ok(j.clone());
        }
        let j = clock::new_job_id().map_err(|e| fail("delegation_failed", format!("no job id ({e})")))?;
        self.reviewer_ids.insert(key, j.clone());
        Ok(j)
    }

    fn creator_spec(&self, role: &'static str, round: u32, prompt: Prompt, name: &str, copy: PathBuf) -> Spec {
        Spec {
            session: self.o.creator.clone(),
            remote: false,
            jid: self.creator_jid.clone(),
            role,
            round,
            prompt,
            name: name.to_string(),
            copy_to: copy,
        }
    }

    fn context_facts(&self) -> Option<prompt::Context> {
        let (base, origin) = self.p.base.clone()?;
        let ctx = self.ctx;
        let src = &self.p.source;
        let head = git::head(ctx, src).unwrap_or_default();
        Some(prompt::Context {
            path: src.display().to_string(),
            branch: git::branch(ctx, src).ok().flatten(),
            commits: git::count_commits(ctx, src, &base, &head).unwrap_or(0),
            head,
            base,
            base_origin: origin,
            uncommitted: self.repo().has_uncommitted(&self.gctx).unwrap_or(true),
        })
    }

    /// The creator's `[worktree context]` block (with `--worktree`/`--base`), else none.
    fn creator_context(&self) -> Result<Option<String>, Stop> {
        Ok(self.context_facts().map(|c| prompt::context_block(&c)))
    }

    fn context_block_for(&self, path: String) -> String {
        match self.context_facts() {
            Some(mut c) => {
                c.path = path;
                prompt::context_block(&c)
            }
            None => String::new(),
        }
    }

    /// 3a: waits until every sub-job of the creator's record (transitively) is terminal; returns
    /// the rows, or None when there were none.
    fn wait_subjobs(&mut self) -> Result<Option<Vec<SubJob>>, Stop> {
        let mut noted = false;
        loop {
            self.check_signal()?;
            let rows = subjobs(&self.store, &self.creator_jid);
            if rows.is_empty() {
                return Ok(None);
            }
            let open: Vec<&SubJob> = rows.iter().filter(|r| !is_terminal(&r.status)).collect();
            if open.is_empty() {
                return Ok(Some(rows));
            }
            if self.remaining() == Some(0) {
                let list = open.iter().map(|r| format!("{} ({})", r.jid, r.status)).collect::<Vec<_>>().join(", ");
                return Err(Stop::WallClock(format!(
                    "loop wall clock exhausted while sub-jobs still run: {list} (left running)"
                )));
            }
            if !noted {
                let l = format!("round {}: waiting for {} sub-job(s) of the creator to end", self.cp.round, open.len());
                self.line(&l);
                noted = true;
            }
            sys::sleep(Duration::from_millis(300));
        }
    }

    fn pin_round(&mut self, round: u32) -> Result<Snapshot, Stop> {
        let base = self.p.base.as_ref().map(|b| b.0.clone()).unwrap_or_default();
        let snap = match self.repo().pin(&self.gctx, &self.cp.loop_id) {
            Ok(s) => s,
            Err(e) => {
                let cause = match &e {
                    PinError::NestedRepo(_) => "nested_repository",
                    PinError::DirtySubmodule(_) => "dirty_submodule",
                    _ => "pin_failed",
                };
                return Err(Stop::Refused { round, cause: cause.into(), msg: e.to_string() });
            }
        };
        match self.repo().guard(&self.gctx, &base, &snap.commit) {
            Guard::Changes => {}
            Guard::Empty => {
                return Err(fail(
                    "empty_change_set",
                    format!("round {round}: nothing changed from the base {base} to the snapshot {}", snap.commit),
                ))
            }
            Guard::Undeterminable(why) => {
                return Err(fail(
                    "empty_change_set",
                    format!("round {round}: cannot tell whether anything changed ({why})"),
                ))
            }
        }
        self.line(&format!(
            "round {round} · pinned · head {} · tree {} · snapshot {} · {}",
            short(&snap.head),
            short(&snap.tree),
            short(&snap.commit),
            self.elapsed()
        ));
        Ok(snap)
    }

    /// (evidence, isolation name, review tree): opens the round's isolation (4.6).
    fn open_isolation(
        &mut self,
        round: u32,
        pin: Option<&Snapshot>,
    ) -> Result<(&'static str, &'static str, Option<PathBuf>), Stop> {
        let Some(s) = pin else { return Ok(("unpinned", "none", None)) };
        let locals = self.reviewer_list().iter().filter(|r| !r.1).count();
        if locals == 0 {
            return Ok(("diff-only", "diff-only", None));
        }
        match self.p.isolation {
            Isolation::Env => Ok(("source-tree", "env", None)),
            Isolation::Tree => {
                let tmp = self.ctx.path_var("TMPDIR").unwrap_or_else(|| PathBuf::from("/tmp"));
                let path = tmp.join(format!("mam-review-{}-r{round}", self.cp.loop_id));
                match git::add_review_tree(self.ctx, &self.p.source, &path, &s.commit) {
                    Ok(()) => {
                        self.trees.push(path.clone());
                        self.exclude.push(path.clone());
                        Ok(("review-tree", "tree", Some(path)))
                    }
                    Err(e) => Err(Stop::Refused {
                        round,
                        cause: "review_tree".into(),
                        msg: format!("cannot create the review tree {} ({e}); no fallback to env", show_path(&path)),
                    }),
                }
            }
        }
    }

    fn close_trees(&mut self) {
        for t in std::mem::take(&mut self.trees) {
            if let Err(e) = git::remove_review_tree(self.ctx, &self.p.source, &t) {
                let l = format!("WARNING: loop: cannot remove the review tree {} ({e})", show_path(&t));
                self.diag(&l);
            }
        }
    }

    /// `mam diff-collect <source> <base> <snapshot>` from the frozen binary into `review/r<r>.diff`.
    fn collect_diff(&mut self, round: u32, s: &Snapshot) -> Result<String, Stop> {
        let base = self.p.base.as_ref().map(|b| b.0.clone()).unwrap_or_default();
        let tmp = self.dir.join("tmp");
        let child = diffcollect::Child {
            exe: &self.frozen,
            control: &self.p.control,
            source: &self.p.source,
            base: &base,
            snapshot: &s.commit,
            registry: &self.p.resolved.registry,
            logs: &self.p.resolved.logs,
            tmp: &tmp,
            max_bytes: self.o.diff_max,
        };
        let out = diffcollect::child_command(self.ctx, &child)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_else(|e| format!("[mam diff UNAVAILABLE: cannot run {} ({e})]\n", show_path(&self.frozen)));
        let out =
            if out.is_empty() { "[mam diff UNAVAILABLE: diff-collect printed nothing]\n".to_string() } else { out };
        let path = self.dir.join("review").join(format!("r{round}.diff"));
        let _ = sys::atomic_write(&path, out.as_bytes());
        let cut =
            out.lines().any(|l| l.starts_with("[mam diff TRUNCATED after ") || l.starts_with("[mam diff UNAVAILABLE"));
        if cut && !self.p.remote.is_empty() {
            self.close_trees();
            return Err(Stop::Refused {
                round,
                cause: "diff_incomplete".into(),
                msg: "the diff is truncated or unavailable and a remote reviewer sees nothing else".into(),
            });
        }
        Ok(out)
    }

    #[cfg(feature = "test-hooks")]
    fn pause_before_promote(&mut self) {
        // MAM_TEST_LOOP_PAUSE=before-promote:<fifo> (ORCH 8 item 8): blocks until the test has written and
        // closed the fifo.
        if let Some(v) = self.ctx.var("MAM_TEST_LOOP_PAUSE") {
            if let Some(fifo) = v.strip_prefix("before-promote:") {
                use std::io::Read;
                if let Ok(mut f) = std::fs::File::open(fifo) {
                    let mut sink = Vec::new();
                    let _ = f.read_to_end(&mut sink);
                }
            }
        }
    }

    #[cfg(not(feature = "test-hooks"))]
    fn pause_before_promote(&mut self) {}

    fn reports_dir(&self) -> PathBuf {
        self.p.control.join(".agents").join("reports")
    }

    fn promote_file(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        let bytes = checkpoint::read_bounded(from, 64 * 1024 * 1024)?;
        if let Some(d) = to.parent() {
            sys::create_dir_all(d)?;
        }
        sys::atomic_write(to, &bytes)
    }

    /// 4.8: the PASS reports of this round with their sidecars, and the creator's final report.
    fn promote(&mut self, round: u32, pin: Option<&Snapshot>, dones: &[Done]) -> Result<(), Stop> {
        let now = clock::now_ts();
        let rows = self.cp.review_rounds.last().map(|r| r.reviewers.clone()).unwrap_or_default();
        for d in dones {
            let dest = self.reports_dir().join(&d.session).join(format!("report-{}.md", d.jid));
            self.promote_file(&d.copy, &dest)
                .map_err(|e| fail("promotion_failed", format!("cannot promote {}: {e}", show_path(&dest))))?;
            self.cp.promoted.push(dest.display().to_string());
            if let Some(s) = pin {
                let row = rows.iter().find(|r| r.session == d.session);
                let side = json!({
                    "loop_id": self.cp.loop_id,
                    "round": round,
                    "session": d.session,
                    "jid": d.jid,
                    "transport": row.map(|r| r.transport.clone()).unwrap_or_else(|| "local".into()),
                    "evidence": row.map(|r| r.evidence.clone()).unwrap_or_default(),
                    "base": self.p.base.as_ref().map(|b| b.0.clone()),
                    "head": s.head,
                    "tree": s.tree,
                    "snapshot_commit": s.commit,
                    "verdict": "PASS",
                    "promoted_at": now,
                });
                let sp = self.reports_dir().join(&d.session).join(format!("report-{}.identity.json", d.jid));
                let mut bytes = serde_json::to_vec_pretty(&side).unwrap_or_default();
                bytes.push(b'\n');
                sys::atomic_write(&sp, &bytes)
                    .map_err(|e| fail("promotion_failed", format!("cannot write {}: {e}", show_path(&sp))))?;
                self.cp.promoted.push(sp.display().to_string());
            }
        }
        if let Some(c) = self.creator_report.clone() {
            let dest = self.reports_dir().join(&self.o.creator).join(format!("report-{}.md", self.creator_jid));
            self.promote_file(&c, &dest)
                .map_err(|e| fail("promotion_failed", format!("cannot promote {}: {e}", show_path(&dest))))?;
            self.cp.promoted.push(dest.display().to_string());
        }
        let l = format!(
            "round {round}: every reviewer passed; promoted {} file(s) to {}",
            self.cp.promoted.len(),
            show_path(&self.reports_dir())
        );
        self.line(&l);
        Ok(())
    }

    // ---- delegations ----

    fn dispatch(&mut self, specs: Vec<Spec>) -> Result<Vec<Done>, Stop> {
        for spec in specs {
            self.check_signal()?;
            let left = self.remaining();
            if left.is_some_and(|l| l < 1) {
                return Err(Stop::WallClock("loop wall clock exhausted before a delegation".into()));
            }
            let budget = dispatch::budget(self.o.job_timeout_s, left);
            self.start_job(spec, budget)?;
        }
        let mut done = Vec::new();
        let mut failure: Option<Stop> = None;
        while !self.inflight.is_empty() {
            self.check_signal()?;
            let mut i = 0;
            while i < self.inflight.len() {
                match self.inflight[i].child.try_wait() {
                    Ok(Some(st)) => {
                        let f = self.inflight.remove(i);
                        match self.job_ended(f, st.code().unwrap_or(-1)) {
                            Ok(d) => done.push(d),
                            Err(e) => {
                                failure.get_or_insert(e);
                            }
                        }
                    }
                    Ok(None) => i += 1,
                    Err(_) => i += 1,
                }
            }
            if failure.is_some() {
                // 4.4: a failed delegation cancels the round's other in-flight jobs.
                self.cancel_inflight("loop: a sibling delegation failed");
                break;
            }
            self.stall_watch();
            sys::sleep(POLL);
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(done),
        }
    }

    fn start_job(&mut self, spec: Spec, budget: Budget) -> Result<(), Stop> {
        self.seq += 1;
        let prompts = self.dir.join("prompts");
        let body = prompts.join(format!("{:02}-{}.md", self.seq, spec.name));
        let ctxf = prompts.join(format!("{:02}-{}.context.md", self.seq, spec.name));
        let stdout = prompts.join(format!("{:02}-{}.out", self.seq, spec.name));
        let stderr = prompts.join(format!("{:02}-{}.err", self.seq, spec.name));
        let werr =
            |p: &Path, e: std::io::Error| fail("delegation_failed", format!("cannot write {}: {e}", show_path(p)));
        sys::atomic_write(&body, spec.prompt.body.as_bytes()).map_err(|e| werr(&body, e))?;
        if let Some(c) = &spec.prompt.context {
            sys::atomic_write(&ctxf, c.as_bytes()).map_err(|e| werr(&ctxf, e))?;
        }
        let cs = ChildSpec {
            frozen: &self.frozen,
            control_root: &self.p.control,
            registry: &self.p.resolved.registry,
            session: &spec.session,
            jid: &spec.jid,
            body: &body,
            context: spec.prompt.context.as_ref().map(|_| ctxf.as_path()),
            budget,
            heartbeat_sec: self.o.heartbeat_sec,
            heartbeat_misses: self.o.heartbeat_misses,
            ack_timeout_s: self.o.ack_timeout_s,
            orchestrator: self.orchestrator.as_deref(),
            parent: self.o.parent.as_deref(),
            stdout: &stdout,
            stderr: &stderr,
        };
        let child = dispatch::spawn(self.ctx, &cs).map_err(|e| {
            fail("delegation_failed", format!("cannot start {} delegate-job: {e}", show_path(&self.frozen)))
        })?;
        if spec.jid == self.creator_jid {
            self.creator_registered = true;
        }
        let row = self.cp.jobs.len();
        self.cp.jobs.push(JobRow {
            jid: spec.jid.clone(),
            role: spec.role.into(),
            kind: "loop".into(),
            session: spec.session.clone(),
            round: spec.round,
            status: "dispatched".into(),
            report: None,
            dispatched_at: clock::now_ts(),
        });
        self.save();
        let l = format!(
            "{} · {} {} · job {} · dispatched (timeout {} s{}) · {}",
            if spec.round == 0 { "implement".to_string() } else { format!("round {}", spec.round) },
            spec.role,
            spec.session,
            spec.jid,
            budget.timeout_s,
            if budget.wall_clock { ", the wall clock's" } else { "" },
            self.elapsed()
        );
        self.line(&l);
        self.inflight.push(InFlight {
            spec,
            child,
            row,
            dispatched_ms: clock::now_ms(),
            stdout,
            stderr,
            last_stall_ms: None,
        });
        Ok(())
    }

    fn job_ended(&mut self, f: InFlight, rc: i32) -> Result<Done, Stop> {
        let out = std::fs::read_to_string(&f.stdout).unwrap_or_default();
        let err = std::fs::read_to_string(&f.stderr).unwrap_or_default();
        let status = dispatch::status_of(&out)
            .or_else(|| self.store.read(&f.spec.jid).ok().flatten().map(|r| r.status().to_string()))
            .unwrap_or_else(|| "unknown".into());
        self.cp.jobs[f.row].status = status.clone();
        if rc != 0 && !is_terminal(&status) {
            // delegate-job stopped waiting and left the job open (an interrupted delegate-job, A15):
            // the loop gives up on it, so it closes it; no job of the loop is left open.
            let c = ops::Close { reason: Some(format!("loop: delegate-job ended rc {rc}")), ..ops::Close::default() };
            if ops::operator_close(self.ctx, &self.store, &f.spec.jid, Kind::Set, Some("cancelled"), &c).is_ok() {
                self.cp.jobs[f.row].status = "cancelled".into();
            }
        }
        // The report of this dispatch, copied before the next one reuses the path (A32).
        let report_path = self.p.resolved.registry.join(&f.spec.jid).join("report.md");
        let (report, truncated) = match checkpoint::read_bounded(&report_path, MAX_REPORT_BYTES) {
            Ok(b) => (String::from_utf8_lossy(&b).into_owned(), false),
            Err(_) => match read_prefix(&report_path, MAX_REPORT_BYTES) {
                Some(b) => (String::from_utf8_lossy(&b).into_owned(), true),
                None => (String::new(), false),
            },
        };
        if let Some(d) = f.spec.copy_to.parent() {
            let _ = sys::create_dir_all(d);
        }
        if rc == 0 {
            let _ = sys::atomic_write(&f.spec.copy_to, report.as_bytes());
            self.cp.jobs[f.row].report = Some(f.spec.copy_to.display().to_string());
            if f.spec.jid == self.creator_jid {
                self.creator_report = Some(f.spec.copy_to.clone());
            }
        }
        self.save();
        let l = format!(
            "{} · {} {} · job {} · {} (rc {rc}) · {}",
            if f.spec.round == 0 { "implement".to_string() } else { format!("round {}", f.spec.round) },
            f.spec.role,
            f.spec.session,
            f.spec.jid,
            status,
            self.elapsed()
        );
        self.line(&l);
        if rc != 0 {
            let why = dispatch::last_line(&err);
            let msg = format!(
                "the {} job {} for {} ended {status} (delegate-job rc {rc}){}",
                f.spec.role,
                f.spec.jid,
                f.spec.session,
                if why.is_empty() { String::new() } else { format!(": {}", one_line(&why)) }
            );
            if status == "wall_clock_timeout" {
                return Err(Stop::WallClock(format!("loop wall clock exhausted: {msg}")));
            }
            return Err(fail("delegation_failed", msg));
        }
        let _ = f.spec.remote;
        Ok(Done {
            session: f.spec.session.trim_start_matches("remote:").to_string(),
            jid: f.spec.jid,
            report,
            truncated,
            copy: f.spec.copy_to,
        })
    }

    /// Sets every in-flight job `cancelled` through the engine, then reaps its delegate-job child
    /// (which sees the terminal status and exits on its own).
    fn cancel_inflight(&mut self, reason: &str) {
        for f in &self.inflight {
            let c = ops::Close { reason: Some(reason.to_string()), ..ops::Close::default() };
            let _ = ops::operator_close(self.ctx, &self.store, &f.spec.jid, Kind::Set, Some("cancelled"), &c);
        }
        for mut f in std::mem::take(&mut self.inflight) {
            dispatch::reap(&mut f.child, Duration::from_secs(10));
            self.cp.jobs[f.row].status = "cancelled".into();
            let l = format!(
                "round {} · {} {} · job {} · cancelled ({reason})",
                f.spec.round, f.spec.role, f.spec.session, f.spec.jid
            );
            self.line(&l);
        }
        self.save();
    }

    /// 4.7: one STALL line per job and per S seconds of no event but heartbeats.
    fn stall_watch(&mut self) {
        if self.o.stall_s == 0 {
            return;
        }
        let s_ms = self.o.stall_s as u64 * 1000;
        let now = clock::now_ms();
        let mut lines = Vec::new();
        for f in &mut self.inflight {
            let last = dispatch::last_non_heartbeat_ms(&self.p.resolved.registry, &f.spec.jid)
                .filter(|&t| t >= f.dispatched_ms)
                .unwrap_or(f.dispatched_ms);
            let quiet = now.saturating_sub(last);
            let due = quiet >= s_ms && f.last_stall_ms.is_none_or(|t| now.saturating_sub(t) >= s_ms);
            if due {
                f.last_stall_ms = Some(now);
                lines.push((
                    dispatch::stall_line(now, &f.spec.jid, &f.spec.session, quiet / 1000),
                    f.spec.session.clone(),
                ));
            }
        }
        for (l, session) in lines {
            let _ = sys::append_locked(&self.dir.join("stall.log"), format!("{l}\n").as_bytes());
            self.diag(&l);
            self.notify(&session, &l);
        }
    }

    /// On herdr, `herdr notification show`; tmux and fake get none (4.7).
    fn notify(&self, session: &str, line: &str) {
        let Ok(doc) = session::load(&self.p.resolved.sessions) else { return };
        let Some(row) = doc.row(session) else { return };
        if row.backend.as_deref() != Some("herdr") {
            return;
        }
        let bin = self.ctx.path_var("HERDR_BIN").unwrap_or_else(|| PathBuf::from("herdr"));
        let mut c = std::process::Command::new(bin);
        c.args(["notification", "show", line])
            .env_clear()
            .envs(self.ctx.child_env_for(ChildRole::Agent))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        if let Ok(mut ch) = sys::spawn(&mut c) {
            dispatch::reap(&mut ch, Duration::from_secs(5));
        }
    }

    /// Issue 21: the loop's promotion or stop runs the verdict hook once (`notify`); a hook that
    /// cannot start is a WARNING, never the loop's failure.
    fn notify_verdict(&mut self, outcome: &str, reason: &str) {
        let report = if outcome == "promoted" { self.reports_dir() } else { self.cp_path.clone() };
        let v = notify::Verdict::of_loop(
            &self.cp.loop_id,
            &self.creator_jid,
            &self.o.creator,
            outcome,
            reason,
            Some(&report),
        );
        if let Err(e) = notify::start(self.ctx, &v, &notify::loop_marker(&self.dir), &self.store.logs, "loop") {
            let l = format!("WARNING: loop: {e}");
            self.diag(&l);
        }
    }

    /// Every exit path: in-flight jobs cancelled on a signal, trees removed, the loop job
    /// finalized, the checkpoint's outcome, the empty `review/` removed.
    fn finish(&mut self, result: Result<(), Stop>) -> Outcome {
        // Ctrl-C signals the loop's whole process group: a child it killed (diff-collect) makes a
        // failure of its own, which is the interruption (A39).
        let result = match (result, sys::pending_signal()) {
            (Err(_), Some(sig)) => Err(Stop::Interrupted(sig)),
            (r, _) => r,
        };
        let (outcome, rc, reason, msg) = match result {
            Ok(()) => ("promoted", 0, None, None),
            Err(Stop::Fail { reason, msg }) => ("failed", 1, Some(reason), Some(msg)),
            Err(Stop::Refused { round, cause, msg }) => {
                let l = format!("REFUSED: loop: round {round}: {cause}: {msg}");
                self.diag(&l);
                ("refused", 1, Some(format!("refused:{cause}")), None)
            }
            Err(Stop::WallClock(msg)) => ("failed", 1, Some("wall_clock".to_string()), Some(msg)),
            Err(Stop::Interrupted(sig)) => {
                ("interrupted", 1, None, Some(format!("interrupted by {}", sys::signal_name(sig))))
            }
        };
        if outcome == "interrupted" {
            self.cancel_inflight("loop interrupted");
        } else if !self.inflight.is_empty() {
            self.cancel_inflight("loop ended");
        }
        self.close_trees();
        // The loop job: completed after promotion (the creator's last job completed it), else
        // failed with the reason, or cancelled on a signal (A32).
        if self.creator_registered && rc != 0 {
            let (target, why) = match outcome {
                "interrupted" => ("cancelled", "loop interrupted".to_string()),
                _ => ("failed", reason.clone().unwrap_or_else(|| "failed".into())),
            };
            let c = ops::Close { reason: Some(why), ..ops::Close::default() };
            if let Err(e) =
                ops::operator_close(self.ctx, &self.store, &self.creator_jid, Kind::Finalize, Some(target), &c)
            {
                let l = format!("WARNING: loop: cannot finalize the loop job {}: {e}", self.creator_jid);
                self.diag(&l);
            }
        }
        if let Some(m) = &msg {
            let l = format!("ERROR: loop: {m}");
            self.diag(&l);
        }
        let review = self.dir.join("review");
        let _ = std::fs::remove_dir(&review);
        // A promoted loop is `done`; any other keeps the phase (and round) where it stopped (A39).
        if rc == 0 {
            self.cp.phase = "done".into();
        }
        self.cp.outcome = Some(outcome.into());
        self.cp.reason = reason.clone().or(msg.clone());
        self.cp.rc = Some(rc);
        self.save();
        self.notify_verdict(outcome, reason.as_deref().or(msg.as_deref()).unwrap_or(""));
        let rounds = self.cp.review_rounds.iter().filter(|r| r.kind == "review").count();
        let mut verdicts = Vec::new();
        if let Some(last) = self.cp.review_rounds.iter().rev().find(|r| r.kind == "review") {
            for r in &last.reviewers {
                verdicts.push(format!("{}: {}", r.session, r.verdict.as_deref().unwrap_or("none")));
            }
        }
        let summary = format!(
            "summary: {rounds} review round(s); last verdicts: {}; {}",
            if verdicts.is_empty() { "none".to_string() } else { verdicts.join(", ") },
            match outcome {
                "promoted" =>
                    format!("promoted {} file(s) under {}", self.cp.promoted.len(), show_path(&self.reports_dir())),
                _ => format!("stopped: {}", msg.clone().or(reason.clone()).unwrap_or_default()),
            }
        );
        self.line(&summary);
        Outcome {
            loop_id: self.cp.loop_id.clone(),
            outcome: outcome.into(),
            rc,
            reports: (rc == 0).then(|| self.reports_dir()),
            checkpoint: self.cp_path.clone(),
            reason,
        }
    }
}

fn short(s: &str) -> &str {
    &s[..12.min(s.len())]
}

/// Reads the first `max` bytes of a file (no symlink followed).
fn read_prefix(path: &Path, max: u64) -> Option<Vec<u8>> {
    use std::io::Read;
    let f = sys::open_nofollow_read(path).ok()?;
    let mut out = Vec::new();
    f.take(max).read_to_end(&mut out).ok()?;
    Some(out)
}

/// A record whose parent is one of the creator's jobs, transitively (A33).
#[derive(Debug, Clone)]
pub struct SubJob {
    pub jid: String,
    pub session: String,
    pub status: String,
    pub start: String,
    pub end: String,
    pub report: String,
}

fn subjobs(store: &Store, root: &str) -> Vec<SubJob> {
    let Ok(ids) = store.job_ids() else { return Vec::new() };
    let mut recs = Vec::new();
    for id in ids {
        if let Ok(Some(r)) = store.read(&id) {
            recs.push(r);
        }
    }
    let mut parents = vec![root.to_string()];
    let mut out = Vec::new();
    let mut grew = true;
    while grew {
        grew = false;
        for r in &recs {
            let id = r.str("job_id").unwrap_or_default().to_string();
            if parents.contains(&id) {
                continue;
            }
            if r.str("parent_job_id").is_some_and(|p| parents.iter().any(|q| q == p)) {
                parents.push(id.clone());
                let report = r.str("report_path").filter(|p| Path::new(p).is_file()).unwrap_or("none").to_string();
                out.push(SubJob {
                    jid: id,
                    session: r.str("agent_session").unwrap_or("?").to_string(),
                    status: r.status().to_string(),
                    start: r.str("dispatched_at").unwrap_or("-").to_string(),
                    end: r.str("finished_at").unwrap_or("-").to_string(),
                    report,
                });
                grew = true;
            }
        }
    }
    out
}

/// The sub-job table of 3a.
pub fn subjob_table(rows: &[SubJob]) -> String {
    let mut t = String::from("| job | session | status | start | end | report |\n|---|---|---|---|---|---|\n");
    for r in rows {
        let _ = writeln!(t, "| {} | {} | {} | {} | {} | {} |", r.jid, r.session, r.status, r.start, r.end, r.report);
    }
    t
}
