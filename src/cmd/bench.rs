//! `mam bench` (docs/PERFORMANCE.md): benchmarks that time library paths from inside the process,
//! where a whole-process timing would measure something else. `loop-round` runs the review loop's
//! own steps of one pinned round (everything but the agents) through the code `mam loop` runs.
//! It never changes the repository's index, status or refs (the snapshots are ref-less commits).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::cli::{self, Failure, Parsed};
use crate::clock;
use crate::ctx::Ctx;
use crate::diffcollect::{self, TempDir};
use crate::knob;
use crate::paths;
use crate::review::checkpoint::{self, Checkpoint, JobRow, ReviewerRow, Round, RoundIdentity};
use crate::review::evidence::{self, Verdict};
use crate::review::git::{self, Guard, Repo};
use crate::review::prompt;
use crate::sys;
use crate::text::show_path;

pub const USAGE: &str = "
Usage: mam bench loop-round --repo PATH --base REF [--reps N]

Times the review loop's own work in one pinned review round with one local reviewer and tree
isolation, N times (default 15), through the library code `mam loop` runs, in the loop's order:
  pin         the snapshot (refusal checks, temporary index, add -A, write-tree, commit-tree)
  guard       the empty-change guard (git diff --quiet <base> <snapshot>)
  tree        git worktree add --detach of the snapshot under TMPDIR (the review tree)
  diff        `<this binary> diff-collect <repo> <base> <snapshot>` as a child, into a file
  prompt      the context facts (head, branch, commit count, uncommitted changes), the context,
              identity and review text, written as the prompt files
  judge       the reviewer's report read back and judged (a PASS with the round's identity)
  remeasure   the fingerprint (staleness)
  remove      git worktree remove of the review tree
  checkpoint  the round's four checkpoint writes and the report copy
No agent, broker, registry record or delegate-job is involved. The control plane is resolved as by
every command (run with WORKSPACE_ROOT=<repo> for a loop whose control root is the source); its
paths are left out as the loop leaves them out. The change since <base> must not be empty.

Stdout: one line per repetition,
  rep=<i> total_ms=<t> pin=<ms> guard=<ms> tree=<ms> diff=<ms> prompt=<ms> judge=<ms> ...
then `median_ms=<m> reps=<n>`.

Exit codes: 0 ok, 1 a step failed (the line names it), 2 usage.
";

#[derive(Debug)]
struct Args {
    repo: PathBuf,
    base: String,
    reps: u32,
}

fn parse_args(args: Vec<OsString>) -> Result<Parsed<Args>, Failure> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let (mut which, mut repo, mut base, mut reps) = (None, None, None, 15);
    while let Some(arg) = p.next()? {
        match arg {
            Short('h') | Long("help") => return Ok(Parsed::Help),
            Value(v) if which.is_none() => which = Some(cli::utf8("benchmark", v)?),
            Long("repo") => repo = Some(PathBuf::from(p.value()?)),
            Long("base") => base = Some(cli::utf8("--base", p.value()?)?),
            Long("reps") => reps = knob::flag("--reps", &p.value()?, 1)?,
            _ => return Err(arg.unexpected().into()),
        }
    }
    match (which.as_deref(), repo, base) {
        (Some("loop-round"), Some(repo), Some(base)) if !base.is_empty() => Ok(Parsed::Run(Args { repo, base, reps })),
        (Some("loop-round") | None, _, _) => {
            Err(Failure::usage("bench: give loop-round --repo PATH --base REF (see mam bench --help)"))
        }
        (Some(other), _, _) => Err(Failure::usage(format!(
            "bench: unknown benchmark '{}' (expected loop-round)",
            crate::text::one_line(other)
        ))),
    }
}

pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let Some(a) = cli::parse_or_help(ctx, USAGE, args, parse_args)? else {
        return Ok(0);
    };
    cli::load_env(ctx)?;
    let bench = Bench::new(ctx, &a)?;
    let mut totals = Vec::new();
    for rep in 1..=a.reps {
        let steps = bench.round(rep)?;
        let total: f64 = steps.iter().map(|(_, ms)| ms).sum();
        let mut line = format!("rep={rep} total_ms={total:.1}");
        for (name, ms) in &steps {
            line.push_str(&format!(" {name}={ms:.1}"));
        }
        ctx.say(&line);
        totals.push(total);
    }
    totals.sort_by(f64::total_cmp);
    let median = totals[totals.len() / 2];
    ctx.say(&format!("median_ms={median:.1} reps={}", a.reps));
    Ok(0)
}

/// What every repetition shares: the repository, the base, the control plane left out, the
/// binary whose diff-collect runs, the loop dir (a temp dir), and the checkpoint of a loop that
/// has dispatched its creator.
struct Bench<'a> {
    ctx: &'a Ctx,
    root: PathBuf,
    control: PathBuf,
    base: String,
    exclude: Vec<PathBuf>,
    exe: PathBuf,
    /// The registry and audit-log root, which the diff leaves out (as the loop's do).
    registry: PathBuf,
    logs: PathBuf,
    /// `MAM_LOOP_DIFF_MAX_BYTES`, read as `mam loop` reads it.
    diff_max: u32,
    dir: TempDir,
    cp: Checkpoint,
}

fn fail(step: &str, detail: impl std::fmt::Display) -> Failure {
    Failure::runtime(format!("bench loop-round: {step}: {detail}"))
}

impl<'a> Bench<'a> {
    fn new(ctx: &'a Ctx, a: &Args) -> Result<Bench<'a>, Failure> {
        let root = git::toplevel(ctx, &a.repo).map_err(|e| fail("repo", e))?;
        let base = git::resolve_commit(ctx, &root, &a.base).map_err(|e| fail("base", e))?;
        let r = paths::resolve_unchecked(ctx, None);
        // As `mam loop` leaves them out (review::run).
        let mut exclude = vec![r.control_root.join(".mam"), r.registry.clone(), r.logs.clone()];
        if root != r.control_root {
            exclude.push(root.join(".mam"));
        }
        let exe = std::env::current_exe().map_err(|e| fail("this binary", e))?;
        let dir = TempDir::create(ctx, "mam-bench").map_err(|e| fail("loop dir", show_path(&e.path)))?;
        for sub in ["review", "prompts", "tmp"] {
            sys::create_dir_all(&dir.path.join(sub)).map_err(|e| fail("loop dir", e))?;
        }
        let now = clock::now_ts();
        let cp = Checkpoint {
            loop_id: "0bench00".into(),
            framework_version: env!("CARGO_PKG_VERSION").into(),
            pid: std::process::id(),
            control_root: r.control_root.display().to_string(),
            source_root: root.display().to_string(),
            registry: r.registry.display().to_string(),
            base: Some(base.clone()),
            base_origin: Some(format!("--base {}", a.base)),
            creator: "creator".into(),
            creator_jid: "j-bench-creator".into(),
            reviewers: vec!["reviewer".into()],
            phase: "review".into(),
            round: 1,
            max_rounds: 3,
            plan_path: None,
            collector: exe.display().to_string(),
            started_at: now.clone(),
            updated_at: now.clone(),
            wall_clock_s: 14400,
            jobs: vec![job_row("j-bench-creator", "implementer", 0, &now)],
            review_rounds: Vec::new(),
            promoted: Vec::new(),
            outcome: None,
            reason: None,
            rc: None,
        };
        let diff_max = knob::env_or(ctx, "MAM_LOOP_DIFF_MAX_BYTES", 1, diffcollect::DEFAULT_MAX_BYTES)?;
        Ok(Bench {
            ctx,
            root,
            control: r.control_root,
            base,
            exclude,
            exe,
            registry: r.registry,
            logs: r.logs,
            diff_max,
            dir,
            cp,
        })
    }

    /// One round's steps, each as (name, milliseconds).
    fn round(&self, rep: u32) -> Result<Vec<(&'static str, f64)>, Failure> {
        let ctx = self.ctx;
        let mut cp = self.cp.clone();
        let mut laps = Laps { t: Instant::now(), steps: Vec::new(), checkpoint_ms: 0.0 };
        self.save(&mut laps, &mut cp)?;
        let mut repo = Repo { root: self.root.clone(), exclude: self.exclude.clone() };
        let snap = repo.pin(ctx, &cp.loop_id).map_err(|e| fail("pin", e))?;
        laps.lap("pin");
        match repo.guard(ctx, &self.base, &snap.commit) {
            Guard::Changes => {}
            Guard::Empty => return Err(fail("guard", "nothing changed since the base")),
            Guard::Undeterminable(why) => return Err(fail("guard", why)),
        }
        laps.lap("guard");
        let tmp = ctx.path_var("TMPDIR").unwrap_or_else(|| PathBuf::from("/tmp"));
        let tree = tmp.join(format!("mam-review-{}-{}-r{rep}", cp.loop_id, std::process::id()));
        git::add_review_tree(ctx, &self.root, &tree, &snap.commit).map_err(|e| fail("tree", e))?;
        repo.exclude.push(tree.clone());
        laps.lap("tree");
        let result = self.in_tree(rep, &repo, &snap, &tree, &mut laps, &mut cp);
        laps.t = Instant::now();
        let removed = git::remove_review_tree(ctx, &self.root, &tree).map_err(|e| fail("remove", e));
        laps.lap("remove");
        result?;
        removed?;
        laps.steps.push(("checkpoint", laps.checkpoint_ms));
        Ok(laps.steps)
    }

    /// A checkpoint write, timed apart from the step around it.
    fn save(&self, laps: &mut Laps, cp: &mut Checkpoint) -> Result<(), Failure> {
        let t = Instant::now();
        cp.updated_at = clock::now_ts();
        cp.write(&self.dir.path.join("checkpoint.json")).map_err(|e| fail("checkpoint", e))?;
        laps.checkpoint_ms += ms_since(t);
        laps.t = Instant::now();
        Ok(())
    }

    /// The steps while the review tree exists (the caller removes it whatever they return).
    fn in_tree(
        &self,
        rep: u32,
        repo: &Repo,
        snap: &git::Snapshot,
        tree: &Path,
        laps: &mut Laps,
        cp: &mut Checkpoint,
    ) -> Result<(), Failure> {
        let ctx = self.ctx;
        let dir = &self.dir.path;

        // The diff, from a child, as the loop runs its frozen copy.
        let diff_path = dir.join("review").join(format!("r{rep}.diff"));
        let tmp = dir.join("tmp");
        let child = diffcollect::Child {
            exe: &self.exe,
            control: &self.control,
            source: &self.root,
            base: &self.base,
            snapshot: &snap.commit,
            registry: &self.registry,
            logs: &self.logs,
            tmp: &tmp,
            max_bytes: self.diff_max,
        };
        let out = diffcollect::child_command(ctx, &child).output().map_err(|e| fail("diff", e))?;
        if !out.status.success() || !out.stdout.starts_with(b"# mam diff-collect: ") {
            let first = String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or("no output").to_string();
            return Err(fail("diff", first));
        }
        sys::atomic_write(&diff_path, &out.stdout).map_err(|e| fail("diff", e))?;
        laps.lap("diff");

        // The reviewer's prompt: the context facts, the blocks, the body, and the dispatch's files.
        let head = git::head(ctx, &self.root).unwrap_or_default();
        let facts = prompt::Context {
            path: tree.display().to_string(),
            branch: git::branch(ctx, &self.root).ok().flatten(),
            commits: git::count_commits(ctx, &self.root, &self.base, &head).unwrap_or(0),
            head,
            base: self.base.clone(),
            base_origin: "--base".into(),
            uncommitted: repo.has_uncommitted(ctx).unwrap_or(true),
        };
        let mut context = prompt::context_block(&facts);
        context.push_str(&prompt::identity_block(&prompt::Identity {
            loop_id: cp.loop_id.clone(),
            base: self.base.clone(),
            head: snap.head.clone(),
            tree: snap.tree.clone(),
            snapshot_commit: snap.commit.clone(),
        }));
        let body = prompt::review(&prompt::Review {
            round: rep,
            task: None,
            change: prompt::Change::DiffFile {
                diff: diff_path.display().to_string(),
                tree: tree.display().to_string(),
            },
            subjobs: None,
            challenged: &[],
            pinned: true,
            own: false,
            env_tmpdir: None,
        });
        let prompts = dir.join("prompts");
        for (name, text) in [(format!("{rep:02}-review.md"), &body), (format!("{rep:02}-review.context.md"), &context)]
        {
            sys::atomic_write(&prompts.join(name), text.as_bytes()).map_err(|e| fail("prompt", e))?;
        }
        laps.lap("prompt");
        let jid = format!("j-bench-r{rep}");
        cp.jobs.push(job_row(&jid, "reviewer", rep, &clock::now_ts()));
        self.save(laps, cp)?;

        // The agent would run here; its report is written untimed, then read back and judged.
        let report_path = dir.join(format!("{jid}.report.md"));
        let report = format!("Looked at the diff.\n\nIDENTITY: {}\nVERDICT: PASS\n", snap.tree);
        sys::atomic_write(&report_path, report.as_bytes()).map_err(|e| fail("judge", e))?;
        laps.t = Instant::now();
        let bytes = checkpoint::read_bounded(&report_path, 1 << 20).map_err(|e| fail("judge", e))?;
        let report = String::from_utf8_lossy(&bytes).into_owned();
        let j = evidence::judge(&report, Some(&snap.tree), false);
        if j.verdict != Verdict::Pass {
            return Err(fail("judge", j.synthetic.unwrap_or_default()));
        }
        laps.lap("judge");
        let t = Instant::now();
        let copy = dir.join("review").join(format!("r{rep}-reviewer.md"));
        sys::atomic_write(&copy, report.as_bytes()).map_err(|e| fail("checkpoint", e))?;
        laps.checkpoint_ms += ms_since(t);
        if let Some(row) = cp.jobs.last_mut() {
            row.status = "completed".into();
            row.report = Some(copy.display().to_string());
        }
        self.save(laps, cp)?;

        // Re-measure: the source must not have changed during the review.
        let now = repo.fingerprint(ctx).map_err(|e| fail("remeasure", e))?;
        if now.head != snap.head || now.tree != snap.tree {
            return Err(fail("remeasure", "the repository changed during the benchmark"));
        }
        laps.lap("remeasure");
        cp.review_rounds.push(Round {
            round: rep,
            kind: "review".into(),
            identity: Some(RoundIdentity {
                loop_id: cp.loop_id.clone(),
                base: self.base.clone(),
                head: snap.head.clone(),
                tree: snap.tree.clone(),
            }),
            snapshot_commit: Some(snap.commit.clone()),
            isolation: "tree".into(),
            stale: false,
            diff: Some(diff_path.display().to_string()),
            reviewers: vec![ReviewerRow {
                session: "reviewer".into(),
                jid,
                transport: "local".into(),
                evidence: "review-tree".into(),
                verdict: Some(j.verdict.as_str().into()),
                synthetic: None,
                report: Some(copy.display().to_string()),
            }],
        });
        self.save(laps, cp)
    }
}

/// The steps timed so far; `t` is where the current step began. Checkpoint writes are summed apart.
struct Laps {
    t: Instant,
    steps: Vec<(&'static str, f64)>,
    checkpoint_ms: f64,
}

impl Laps {
    fn lap(&mut self, name: &'static str) {
        self.steps.push((name, ms_since(self.t)));
        self.t = Instant::now();
    }
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn job_row(jid: &str, role: &str, round: u32, now: &str) -> JobRow {
    JobRow {
        jid: jid.into(),
        role: role.into(),
        kind: "loop".into(),
        session: if role == "implementer" { "creator" } else { "reviewer" }.into(),
        round,
        status: "dispatched".into(),
        report: None,
        dispatched_at: now.into(),
    }
}
