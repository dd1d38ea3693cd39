//! `mam worktree prepare|remove|list` (ORCH 5): a creator's own linked worktree beside the control
//! root, removed only when nothing in it could be lost. Parsing validates only; the flows are
//! `crate::worktree::{prepare, remove, list}`.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::cli::{self, Failure, Parsed};
use crate::ctx::Ctx;
use crate::delegate::onboard;
use crate::session::Notes;
use crate::text::one_line;
use crate::worktree::check::Method;
use crate::worktree::prepare::{prepare, PrepareArgs};
use crate::worktree::remove::{remove, summary, Outcome, RemoveArgs};
use crate::worktree::{list, WorktreeError};

pub const USAGE: &str = "
Usage: mam worktree prepare <branch> [--path DIR] [--base REF] [--submodules]
                            [--creator AGENT [--name N] [--no-onboard] [--label L] [-- AGENT_ARGS...]]
       mam worktree remove <path> [--stop] [--dry-run] [--discard-ignored]
       mam worktree list

A creator works in its own git worktree beside the control root; `remove` removes one only when
nothing in it could be lost. See `mam worktree <verb> --help`.

Exit codes: those of each verb (`mam worktree <verb> --help`); 2 usage.
";

pub const PREPARE_USAGE: &str = "
Usage: mam worktree prepare <branch> [--path DIR] [--base REF] [--submodules]
                            [--creator AGENT [--name N] [--no-onboard] [--label L] [-- AGENT_ARGS...]]

Makes (or reuses) a linked worktree of the control root's repository with <branch> checked out,
at <parent of control root>/<control root name>-<branch slug> (every character outside
[A-Za-z0-9._-] becomes `-`). A new branch starts at --base (default HEAD). For an existing branch
--base is no start point: BASE is the merge-base of the branch and --base (default the control
root's HEAD), and a warning says so. `.venv` becomes a link to the control root's `.venv` (when
that exists and the worktree has none); `/.venv` and `.pytest_cache/` are added once to the shared
info/exclude.

Options:
  --path DIR       the worktree's directory (not inside the control root)
  --base REF       start point of a new branch; merge-base partner of an existing one
  --submodules     initialise and check out the submodules, one at a time; on a failure the
                   submodules this attempt initialised are deinitialised and lose their git
                   directories, and the shared submodule.* config is restored exactly
  --creator AGENT  then start a session of AGENT in the worktree (`mam create`), recorded in the
                   control root's sessions file; a running one there is reused
  --name N         the session's name (default <agent>-NN)
  --no-onboard     skip the session's onboarding job
  --label L        the session's workspace label
  -h, --help       print this help

Stdout: WORKTREE=<abs>, BRANCH=<name>, BASE=<sha>, one a line (for `mam loop --worktree ...
--base ... --review-only`), then create's lines under --creator.

Exit codes: 0 ready, 1 git failure (after the rollback) or session create failure (the worktree
is kept), 2 bad input (a branch name git refuses, a path inside the control root or with a
control character, a --base that is no commit, a control root that is no git repository),
3 refused and nothing changed (the path is another worktree, a file or a non-empty directory,
the branch is checked out elsewhere, an uninitialised submodule path already holds files).
";

pub const REMOVE_USAGE: &str = "
Usage: mam worktree remove <path> [--stop] [--dry-run] [--discard-ignored]

Removes a linked worktree only when nothing in it could be lost. One check runs before anything
is touched and again right before the removal: a linked worktree (not the main one, not locked);
no running session in it (--stop stops them, cancelling their task jobs) and no other unfinished
job of theirs; a clean git status (submodules included, untracked files shown); no ignored file
or directory except a regenerable directory (a directory git ignores as a whole, or a link,
named .venv, venv, node_modules, target, build, dist, __pycache__, .pytest_cache, .mypy_cache,
.ruff_cache, .tox, .gradle or .next): `git worktree remove` would delete them; in every
initialised submodule no change (ignored files included), no commit outside the remotes (HEAD,
branches, tags, notes: HEAD --exclude=refs/stash --all --not --remotes) and no stash; the same
for every repository under the worktree's modules/ directory (deinitialised submodules), where a
partial repository counts as a finding; no running loop on it; its HEAD and HEAD reflog reachable
from some ref. The branch is never deleted.

Options:
  --stop      stop the sessions in the worktree first, then look again
  --dry-run   run the checks and print what would happen; change nothing
  --discard-ignored
              let the ignored files and directories go with the worktree (no `ignored` finding)
  -h, --help  print this help

Stdout: one FINDING=<token> <path>: <evidence>; <what to do> line per finding, and always, last:
RESULT=removed|refused|would-remove|failed METHOD=plain|force|none FINDINGS=<tokens|none>.
One FINDING=ignored line per ignored entry (100 shown, then a count).
Tokens: not-linked, main-worktree, locked, sessions-running, open-jobs, dirty, ignored, status-failed,
submodule-dirty, unpushed, stashes, uncheckable-repo, loop-active, unreachable-head.

Exit codes: 0 removed (or would be), 1 the stop or the removal failed (the worktree is kept),
2 usage, 3 refused (`nothing was changed`, or `sessions were stopped; the worktree was kept`).
";

pub const LIST_USAGE: &str = "
Usage: mam worktree list

One line per linked worktree of the control root's repository: BRANCH=<b> HEAD=<id>
TREE=clean|dirty|missing|unknown SESSIONS=<running sessions|-> JOBS=<their unfinished jobs|->
METHOD=<m> FINDINGS=<what a plain `remove` would refuse on|none> PATH=<path>.

Exit codes: 0 listed, 1 git failure, 2 the control root is no git repository.
";

enum Verb {
    Prepare(PrepareArgs),
    Remove(RemoveArgs),
    List,
}

fn parse_args(mut raw: Vec<OsString>) -> Result<Parsed<Verb>, Failure> {
    use lexopt::prelude::*;
    let verb = match raw.first().and_then(|v| v.to_str()) {
        Some("prepare" | "remove" | "list") => raw.remove(0).into_string().unwrap_or_default(),
        Some("-h" | "--help") | None => return Ok(Parsed::Help),
        Some(other) => {
            return Err(Failure::usage(format!(
                "mam worktree: unknown verb '{}' (prepare, remove, list; see mam worktree --help)",
                one_line(other)
            )))
        }
    };
    match verb.as_str() {
        "prepare" => parse_prepare(raw),
        "remove" => parse_remove(raw),
        _ => {
            let mut p = lexopt::Parser::from_args(raw);
            if let Some(arg) = p.next()? {
                return match arg {
                    Short('h') | Long("help") => Ok(Parsed::Help),
                    _ => Err(arg.unexpected().into()),
                };
            }
            Ok(Parsed::Run(Verb::List))
        }
    }
}

fn parse_prepare(mut raw: Vec<OsString>) -> Result<Parsed<Verb>, Failure> {
    use lexopt::prelude::*;
    let mut a = PrepareArgs { onboard: true, ..PrepareArgs::default() };
    let mut agent_args = None;
    if let Some(i) = raw.iter().position(|x| x == "--") {
        let mut v = Vec::new();
        for x in raw.split_off(i).into_iter().skip(1) {
            v.push(cli::utf8("AGENT_ARGS", x)?);
        }
        agent_args = Some(v);
    }
    let mut branch = None;
    let mut p = lexopt::Parser::from_args(raw);
    while let Some(arg) = p.next()? {
        match arg {
            Short('h') | Long("help") => return Ok(Parsed::Help),
            Value(v) if branch.is_none() => branch = Some(cli::utf8("branch", v)?),
            Long("path") => a.path = Some(PathBuf::from(p.value()?)),
            Long("base") => a.base = Some(cli::utf8("--base", p.value()?)?),
            Long("submodules") => a.submodules = true,
            Long("creator") => a.creator = Some(cli::utf8("--creator", p.value()?)?),
            Long("name") => a.name = Some(cli::utf8("--name", p.value()?)?),
            Long("no-onboard") => a.onboard = false,
            Long("onboard") => a.onboard = true,
            Long("label") => a.label = Some(cli::utf8("--label", p.value()?)?),
            _ => return Err(arg.unexpected().into()),
        }
    }
    let Some(branch) = branch else {
        return Err(Failure::usage("worktree prepare: give the branch (see mam worktree prepare --help)"));
    };
    a.branch = branch;
    if a.creator.is_none() && (a.name.is_some() || a.label.is_some() || agent_args.is_some() || !a.onboard) {
        return Err(Failure::usage("worktree prepare: --name, --label, --no-onboard and AGENT_ARGS need --creator"));
    }
    if a.path.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
        return Err(Failure::usage("worktree prepare: --path is empty"));
    }
    a.agent_args = agent_args.unwrap_or_default();
    Ok(Parsed::Run(Verb::Prepare(a)))
}

fn parse_remove(raw: Vec<OsString>) -> Result<Parsed<Verb>, Failure> {
    use lexopt::prelude::*;
    let mut a = RemoveArgs::default();
    let mut path = None;
    let mut p = lexopt::Parser::from_args(raw);
    while let Some(arg) = p.next()? {
        match arg {
            Short('h') | Long("help") => return Ok(Parsed::Help),
            Value(v) if path.is_none() => path = Some(PathBuf::from(v)),
            Long("stop") => a.stop = true,
            Long("dry-run") => a.dry_run = true,
            Long("discard-ignored") => a.discard_ignored = true,
            _ => return Err(arg.unexpected().into()),
        }
    }
    match path {
        Some(p) if !p.as_os_str().is_empty() => a.path = p,
        _ => return Err(Failure::usage("worktree remove: give the worktree's path (see mam worktree remove --help)")),
    }
    Ok(Parsed::Run(Verb::Remove(a)))
}

pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let verb = args.first().and_then(|v| v.to_str()).unwrap_or("").to_string();
    let usage = match verb.as_str() {
        "prepare" => PREPARE_USAGE,
        "remove" => REMOVE_USAGE,
        "list" => LIST_USAGE,
        _ => USAGE,
    };
    let parsed = match parse_args(args) {
        Ok(p) => p,
        // The summary line is printed on every path of remove, a usage error included.
        Err(f) if verb == "remove" => {
            ctx.say(&summary(Outcome::Refused, Method::None, "none"));
            return Err(f);
        }
        Err(f) => return Err(f),
    };
    let a = match parsed {
        Parsed::Help => {
            ctx.say_raw(usage.trim_start_matches('\n').as_bytes());
            return Ok(0);
        }
        Parsed::Run(a) => a,
    };
    if let Err(f) = cli::load_env(ctx) {
        if verb == "remove" {
            ctx.say(&summary(Outcome::Failed, Method::None, "none"));
        }
        return Err(f);
    }
    match a {
        Verb::Prepare(a) => run_prepare(ctx, &a),
        Verb::Remove(a) => run_remove(ctx, &a),
        Verb::List => {
            let lines = list::list(ctx).map_err(|e| failure("list", e))?;
            for l in lines {
                ctx.say(&l);
            }
            Ok(0)
        }
    }
}

/// The stderr line and exit code of a worktree error (ORCH 5.1 exit codes).
fn failure(verb: &str, e: WorktreeError) -> Failure {
    match e {
        WorktreeError::Usage(m) => {
            Failure::new(2, format!("REFUSED: worktree {verb}: {}; nothing was changed", one_line(&m)))
        }
        WorktreeError::Refused(m) => {
            Failure::new(3, format!("REFUSED: worktree {verb}: {}; nothing was changed", one_line(&m)))
        }
        WorktreeError::Failed(m) => Failure::runtime(format!("worktree {verb}: {}", one_line(&m))),
    }
}

fn run_prepare(ctx: &Ctx, a: &PrepareArgs) -> Result<i32, Failure> {
    cli::need_control_root(ctx, "worktree prepare")?;
    let mut notes = Notes::default();
    let done = prepare(ctx, a, &mut notes, &mut onboard::onboard);
    for n in &notes.0 {
        ctx.diag(n);
    }
    for l in &done.lines {
        ctx.say(l);
    }
    match done.error {
        None => Ok(0),
        Some(e) => Err(failure("prepare", e)),
    }
}

fn run_remove(ctx: &Ctx, a: &RemoveArgs) -> Result<i32, Failure> {
    let mut notes = Notes::default();
    let r = remove(ctx, a, &mut notes);
    for n in &notes.0 {
        ctx.diag(n);
    }
    for l in &r.lines {
        ctx.say(l);
    }
    ctx.say(&r.summary());
    let rc = r.outcome.rc();
    let line = match (&r.reason, r.outcome) {
        (Some(m), Outcome::Refused) => Some(format!("REFUSED: worktree remove: {}", one_line(m))),
        (Some(m), _) => Some(format!("ERROR: worktree remove: {}", one_line(m))),
        (None, _) => None,
    };
    if let Some(p) = &r.prune {
        // The refusal line first, then the prune hint (A44); main prints the failure line last,
        // so on a refusal both are printed here.
        if let Some(l) = &line {
            ctx.diag(l);
        }
        ctx.diag(&format!("NOTE: {p}"));
        return Ok(rc);
    }
    match line {
        Some(l) if rc != 0 => Err(Failure::new(rc, l)),
        _ => Ok(rc),
    }
}
