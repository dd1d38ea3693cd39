//! `mam loop` (ORCH 4; A32-A42): the review loop, `mam loop status` and `mam loop prune`. Parsing
//! and the knobs here; the loop is `crate::review`.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use crate::cli::{self, Failure, Parsed};
use crate::clock;
use crate::ctx::Ctx;
use crate::diffcollect;
use crate::knob;
use crate::paths;
use crate::review::admin::{self, Pruned};
use crate::review::checkpoint::Checkpoint;
use crate::review::run::{self as review, Isolation, LoopError, Options, Out, RemoteReview};
use crate::sys;
use crate::text::{one_line, show_path};

pub const USAGE: &str = "
Usage: mam loop --creator NAME --task-file PATH (--reviewer NAME... | --self-review) [options]
       mam loop --creator NAME --review-only --base REF [--worktree PATH]
                (--reviewer NAME... | --self-review)
       mam loop status [LOOP_ID] [--json]
       mam loop prune [--older-than SECONDS]

Runs a creator agent and reviewer agents through plan, implementation and review rounds until every
reviewer passes a pinned, verifiable snapshot of the change, then promotes the passing reports with
their identity to <control root>/.agents/reports/<session>/. Each job is a `mam delegate-job` of a
frozen copy of this binary (<control root>/.mam/loop/<loop id>/bin/mam); prompts are files under
the loop dir; the checkpoint is <loop dir>/checkpoint.json.

Options:
  --creator NAME          the creator: a running local session (required)
  --reviewer NAME         a reviewer session (repeatable); one of --reviewer or --self-review
                          is required
  --self-review           no reviewer: the creator reviews its own change (excludes --reviewer)
  --task-file PATH        the task (UTF-8 text, at most 1 MiB); required unless --review-only
  --plan                  write and review a plan first
  --plan-file PATH        use this plan (excludes --plan)
  --max-rounds N          review rounds, and plan rounds (default 3)
  --worktree PATH         the creator's git worktree (MAM_LOOP_WORKTREE); pins every round
  --base REF              the commit the change starts from (a flag only, never the environment)
  --review-only           review the change since --base; no implementation job
  --review-isolation tree|env
                          tree (default): reviewers get a detached worktree of the snapshot;
                          env: they work in the source root and are told not to change it
  --remote-review refuse|diff-only
                          a remote reviewer is refused (default) or gets the diff inline
  --wall-clock S          the loop's budget (MAM_LOOP_WALL_CLOCK_S, 14400); 0 = none
  --job-timeout S         each job's budget (MAM_DELEGATE_TIMEOUT_S, 1800)
  --stall-notify S        notify when a job shows no event but heartbeats for S seconds
                          (MAM_LOOP_STALL_S, 900); 0 = off
  --registry-dir D        the job registry (MAM_JOBS_DIR; default <control root>/.mam/jobs)
  --json                  print the final checkpoint before the last line
  -h, --help              print this help

Also read: MAM_LOOP_DIFF_MAX_BYTES (524288), MAM_HEARTBEAT_SEC, MAM_HEARTBEAT_MISSES,
MAM_ACK_TIMEOUT_S (passed to every delegation), MAM_PARENT_JOB_ID (the caller's job: every
delegation is its sub-job, through --parent; no child inherits the variable), MAM_LOOP_PY (ignored:
there is one runner).

Stdout: one line per phase and job, a summary, and last:
  LOOP_ID=<id> OUTCOME=<promoted|failed|refused|interrupted> RC=<n> REPORTS=<abs dir|none>

Exit codes: 0 promoted, 1 any failure (rounds exhausted, stale last round, empty change set,
refused round, failed delegation, wall clock, interrupted), 2 validation (nothing locked or
delegated), 3 another loop holds the creator's lock.
";

#[derive(Debug, Default)]
struct Args {
    creator: Option<String>,
    reviewers: Vec<String>,
    task_file: Option<PathBuf>,
    plan: bool,
    plan_file: Option<PathBuf>,
    max_rounds: Option<u32>,
    worktree: Option<PathBuf>,
    base: Option<String>,
    review_only: bool,
    isolation: Option<Isolation>,
    remote_review: Option<RemoteReview>,
    wall_clock: Option<u32>,
    job_timeout: Option<u32>,
    stall: Option<u32>,
    registry_dir: Option<PathBuf>,
    json: bool,
    self_review: bool,
}

enum Sub {
    Run(Args),
    Status { id: Option<String>, json: bool },
    Prune { older_than: u32 },
}

fn parse_args(args: Vec<OsString>) -> Result<Parsed<Sub>, Failure> {
    use lexopt::prelude::*;
    let first = args.first().and_then(|a| a.to_str()).map(str::to_string);
    match first.as_deref() {
        Some("status") => {
            let mut p = lexopt::Parser::from_args(args.into_iter().skip(1));
            let (mut id, mut json) = (None, false);
            while let Some(arg) = p.next()? {
                match arg {
                    Short('h') | Long("help") => return Ok(Parsed::Help),
                    Long("json") => json = true,
                    Value(v) if id.is_none() => {
                        let v = cli::utf8("LOOP_ID", v)?;
                        if v.len() != 8 || !v.bytes().all(|b| b.is_ascii_hexdigit()) {
                            return Err(Failure::usage(format!(
                                "loop status: invalid loop id '{}' (expected 8 hex digits)",
                                one_line(&v)
                            )));
                        }
                        id = Some(v);
                    }
                    _ => return Err(arg.unexpected().into()),
                }
            }
            return Ok(Parsed::Run(Sub::Status { id, json }));
        }
        Some("prune") => {
            let mut p = lexopt::Parser::from_args(args.into_iter().skip(1));
            let mut older_than = 7 * 24 * 3600;
            while let Some(arg) = p.next()? {
                match arg {
                    Short('h') | Long("help") => return Ok(Parsed::Help),
                    Long("older-than") => older_than = knob::flag("--older-than", &p.value()?, 0)?,
                    _ => return Err(arg.unexpected().into()),
                }
            }
            return Ok(Parsed::Run(Sub::Prune { older_than }));
        }
        _ => {}
    }
    let mut p = lexopt::Parser::from_args(args);
    let mut a = Args::default();
    while let Some(arg) = p.next()? {
        match arg {
            Short('h') | Long("help") => return Ok(Parsed::Help),
            Long("creator") => a.creator = Some(cli::utf8("--creator", p.value()?)?),
            Long("reviewer") => a.reviewers.push(cli::utf8("--reviewer", p.value()?)?),
            Long("self-review") => a.self_review = true,
            Long("task-file") => a.task_file = Some(PathBuf::from(p.value()?)),
            Long("plan") => a.plan = true,
            Long("plan-file") => a.plan_file = Some(PathBuf::from(p.value()?)),
            Long("max-rounds") => a.max_rounds = Some(knob::flag("--max-rounds", &p.value()?, 1)?),
            Long("worktree") => a.worktree = Some(PathBuf::from(p.value()?)),
            Long("base") => {
                let v = cli::utf8("--base", p.value()?)?;
                if v.is_empty() {
                    return Err(Failure::usage("loop: --base: empty value"));
                }
                a.base = Some(v);
            }
            Long("review-only") => a.review_only = true,
            Long("review-isolation") => {
                a.isolation = Some(match cli::utf8("--review-isolation", p.value()?)?.as_str() {
                    "tree" => Isolation::Tree,
                    "env" => Isolation::Env,
                    other => {
                        return Err(Failure::usage(format!(
                            "--review-isolation: invalid value '{}' (expected tree or env)",
                            one_line(other)
                        )))
                    }
                })
            }
            Long("remote-review") => {
                a.remote_review = Some(match cli::utf8("--remote-review", p.value()?)?.as_str() {
                    "refuse" => RemoteReview::Refuse,
                    "diff-only" => RemoteReview::DiffOnly,
                    other => {
                        return Err(Failure::usage(format!(
                            "--remote-review: invalid value '{}' (expected refuse or diff-only)",
                            one_line(other)
                        )))
                    }
                })
            }
            Long("wall-clock") => a.wall_clock = Some(knob::flag("--wall-clock", &p.value()?, 0)?),
            Long("job-timeout") => a.job_timeout = Some(knob::flag("--job-timeout", &p.value()?, 0)?),
            Long("stall-notify") => a.stall = Some(knob::flag("--stall-notify", &p.value()?, 0)?),
            Long("registry-dir") => a.registry_dir = Some(PathBuf::from(p.value()?)),
            Long("json") => a.json = true,
            _ => return Err(arg.unexpected().into()),
        }
    }
    match &a.creator {
        None => return Err(Failure::usage("loop: --creator NAME is required (see mam loop --help)")),
        Some(c) if !crate::pane::valid_name(c) => {
            return Err(Failure::usage(format!(
                "loop: --creator: invalid session name '{}' (expected [a-z][a-z0-9_-]{{0,31}})",
                one_line(c)
            )))
        }
        _ => {}
    }
    // Issue 32: a loop without a reviewer used to make the creator its own reviewer silently.
    match (a.reviewers.is_empty(), a.self_review) {
        (true, false) => {
            return Err(Failure::usage(
                "loop: name a reviewer (--reviewer NAME) or say --self-review to have the creator review its own \
                 change (see mam loop --help)",
            ))
        }
        (false, true) => return Err(Failure::usage("loop: --self-review excludes --reviewer")),
        _ => {}
    }
    for r in &a.reviewers {
        if !crate::pane::valid_name(r) {
            return Err(Failure::usage(format!(
                "loop: --reviewer: invalid session name '{}' (expected [a-z][a-z0-9_-]{{0,31}}; a remote row is named \
                 without remote:)",
                one_line(r)
            )));
        }
    }
    Ok(Parsed::Run(Sub::Run(a)))
}

pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let Some(sub) = cli::parse_or_help(ctx, USAGE, args, parse_args)? else {
        return Ok(0);
    };
    cli::load_env(ctx)?;
    match sub {
        Sub::Run(a) => {
            cli::need_control_root(ctx, "loop")?;
            run_loop(ctx, a)
        }
        Sub::Status { id, json } => status(ctx, id, json),
        Sub::Prune { older_than } => prune(ctx, older_than),
    }
}

fn run_loop(ctx: &mut Ctx, a: Args) -> Result<i32, Failure> {
    let (worktree, from_env) = match (&a.worktree, ctx.path_var("MAM_LOOP_WORKTREE")) {
        (Some(w), _) => (Some(w.clone()), false),
        (None, Some(w)) if !w.as_os_str().is_empty() => {
            ctx.diag(&format!("NOTE: loop: the worktree {} comes from MAM_LOOP_WORKTREE", show_path(&w)));
            (Some(w), true)
        }
        _ => (None, false),
    };
    if ctx.var_nonempty("MAM_LOOP_PY").is_some_and(|v| v == "0") {
        ctx.diag("NOTE: loop: MAM_LOOP_PY=0 selects nothing: mam has one loop runner");
    }
    let o = Options {
        creator: a.creator.clone().unwrap_or_default(),
        reviewers: a.reviewers.clone(),
        task_file: a.task_file.clone(),
        plan: a.plan,
        plan_file: a.plan_file.clone(),
        max_rounds: a.max_rounds.unwrap_or(3),
        worktree,
        worktree_from_env: from_env,
        base: a.base.clone(),
        review_only: a.review_only,
        isolation: a.isolation,
        remote_review: a.remote_review,
        wall_clock_s: match a.wall_clock {
            Some(v) => v,
            None => knob::env_or(ctx, "MAM_LOOP_WALL_CLOCK_S", 0, 14400)?,
        },
        job_timeout_s: match a.job_timeout {
            Some(v) => v,
            None => knob::env_or(ctx, "MAM_DELEGATE_TIMEOUT_S", 0, 1800)?,
        },
        stall_s: match a.stall {
            Some(v) => v,
            None => knob::env_or(ctx, "MAM_LOOP_STALL_S", 0, 900)?,
        },
        registry_dir: a.registry_dir.clone(),
        diff_max: knob::env_or(ctx, "MAM_LOOP_DIFF_MAX_BYTES", 1, diffcollect::DEFAULT_MAX_BYTES)?,
        heartbeat_sec: knob::env_or(ctx, "MAM_HEARTBEAT_SEC", 1, 30)?,
        heartbeat_misses: knob::env_or(ctx, "MAM_HEARTBEAT_MISSES", 1, 4)?,
        ack_timeout_s: knob::env_or(ctx, "MAM_ACK_TIMEOUT_S", 1, 300)?,
        parent: match ctx.var_nonempty("MAM_PARENT_JOB_ID") {
            Some(p) if clock::valid_job_id(&p) => Some(p),
            Some(p) => {
                return Err(Failure::usage(format!("loop: MAM_PARENT_JOB_ID: invalid job id '{}'", one_line(&p))))
            }
            None => None,
        },
    };
    sys::install_stop_handlers().map_err(|e| Failure::runtime(format!("cannot install signal handlers: {e}")))?;
    let sink = ctx.clone();
    let mut say = |to: Out, l: &str| match to {
        Out::Stdout => sink.say(l),
        Out::Stderr => sink.diag(l),
    };
    let out = match review::run(ctx, &o, &mut say) {
        Ok(o) => o,
        Err(LoopError::Invalid(m)) => return Err(Failure::usage(m)),
        Err(LoopError::Busy(m)) => return Err(Failure::new(3, format!("ERROR: {m}"))),
        Err(LoopError::Failed(m)) => return Err(Failure::runtime(m)),
    };
    if a.json {
        if let Ok(cp) = Checkpoint::read(&out.checkpoint) {
            ctx.say(&serde_json::to_string_pretty(&cp).unwrap_or_default());
        }
    }
    ctx.say(&format!(
        "LOOP_ID={} OUTCOME={} RC={} REPORTS={}",
        out.loop_id,
        out.outcome,
        out.rc,
        out.reports.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "none".into())
    ));
    Ok(out.rc)
}

fn status(ctx: &mut Ctx, id: Option<String>, json: bool) -> Result<i32, Failure> {
    let r = paths::resolve(ctx, None)?;
    let loops = admin::list(&r.control_root);
    let pick = match &id {
        Some(id) => loops.into_iter().find(|(d, _)| d.file_name().is_some_and(|n| n == id.as_str())),
        None => loops.into_iter().rev().find(|(_, c)| c.is_ok()),
    };
    let Some((dir, cp)) = pick else {
        return Err(Failure::runtime(match id {
            Some(id) => format!("loop status: no loop {id} under {}", show_path(&admin::loop_root(&r.control_root))),
            None => format!("loop status: no loop under {}", show_path(&admin::loop_root(&r.control_root))),
        }));
    };
    let cp = cp.map_err(|e| Failure::runtime(format!("loop status: {e}")))?;
    if json {
        ctx.say(&serde_json::to_string_pretty(&cp).unwrap_or_default());
    } else {
        ctx.say_raw(admin::render(&r.control_root, &cp, clock::now_ms()).as_bytes());
        ctx.say(&format!("  checkpoint: {}", show_path(&dir.join("checkpoint.json"))));
    }
    Ok(0)
}

fn prune(ctx: &mut Ctx, older_than: u32) -> Result<i32, Failure> {
    let r = paths::resolve(ctx, None)?;
    let mut rc = 0;
    let done = admin::prune(&r.control_root, Duration::from_secs(older_than as u64), clock::now_ms());
    for p in &done {
        match p {
            Pruned::Removed(d) => ctx.say(&format!("removed {}", show_path(d))),
            Pruned::KeptRunning(d) => ctx.say(&format!("kept {} (the loop is running)", show_path(d))),
            Pruned::Failed(d, e) => {
                ctx.diag(&format!("ERROR: loop prune: cannot remove {} ({})", show_path(d), one_line(e)));
                rc = 1;
            }
        }
    }
    if done.is_empty() {
        ctx.say(&format!("nothing to prune: no loop dir older than {older_than} s"));
    }
    Ok(rc)
}
