//! `mam diff-collect` (ORCH 4.6): prints the change set of a repository since a base commit, for the
//! review loop and for the legacy `diff_collect.sh`; renders a failure as the UNAVAILABLE marker.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::cli::{self, Failure, Parsed};
use crate::ctx::Ctx;
use crate::diffcollect::{self, Request};
use crate::knob;
use crate::paths;
use crate::sys::absolutize;

pub const USAGE: &str = "
Usage: mam diff-collect <root> <base> [<head>]

Prints the diff of the git repository <root> (its top level) from the commit <base>:
  two arguments:   against the working tree, untracked files included (ignored ones are not);
                   nothing in the index, the status or the refs of <root> is changed
  three arguments: against the commit <head>
Output: a header line `# mam diff-collect: <base id>..WORKTREE` (or `..<head id>`), then git's
diff; the single line `(no changes since base commit)` when there is nothing to show. <root>/.mam,
the control root's .mam, the registry and the audit-log root are left out where they lie under
<root>. Output longer than MAM_LOOP_DIFF_MAX_BYTES (default 524288) is cut and ends with the line
`[mam diff TRUNCATED after <n> bytes]`. The format is described in docs/DESIGN.md.

Options:
  -h, --help   print this help

Exit codes: 0 ok (also when truncated), 1 no diff: stdout has `[mam diff UNAVAILABLE: <reason>]` and
stderr one ERROR line (not a repository's top level, a base or head that is no commit, git missing
or failing), 2 usage or an invalid MAM_LOOP_DIFF_MAX_BYTES.
";

#[derive(Debug)]
struct Args {
    root: PathBuf,
    base: OsString,
    head: Option<OsString>,
}

fn parse_args(args: Vec<OsString>) -> Result<Parsed<Args>, Failure> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let mut pos: Vec<OsString> = Vec::new();
    while let Some(arg) = p.next()? {
        match arg {
            Value(v) if pos.len() < 3 => pos.push(v),
            Short('h') | Long("help") => return Ok(Parsed::Help),
            _ => return Err(arg.unexpected().into()),
        }
    }
    let mut it = pos.into_iter();
    match (it.next(), it.next(), it.next()) {
        (Some(root), Some(base), head)
            if !root.is_empty() && !base.is_empty() && head.as_ref().is_none_or(|h| !h.is_empty()) =>
        {
            Ok(Parsed::Run(Args { root: root.into(), base, head }))
        }
        _ => Err(Failure::usage("diff-collect: give <root> <base> [<head>], none of them empty (see --help)")),
    }
}

pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let Some(a) = cli::parse_or_help(ctx, USAGE, args, parse_args)? else {
        return Ok(0);
    };
    cli::load_env(ctx)?;
    let max = knob::env_or(ctx, "MAM_LOOP_DIFF_MAX_BYTES", 1, diffcollect::DEFAULT_MAX_BYTES)?;
    let root = absolutize(ctx.cwd(), &a.root);
    let r = paths::resolve_unchecked(ctx, None);
    let exclude = vec![root.join(".mam"), r.control_root.join(".mam"), r.registry, r.logs];
    let req = Request { root, base: a.base, head: a.head, exclude };
    match diffcollect::collect(ctx, &req) {
        Ok(out) => {
            ctx.say_raw(&diffcollect::limit(out, max as usize));
            Ok(0)
        }
        Err(e) => {
            ctx.say(&diffcollect::unavailable(&e));
            Err(Failure::runtime(format!("diff-collect: {e}")))
        }
    }
}
