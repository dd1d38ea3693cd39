//! `mam install`, `mam update`, `mam remove` (ORCH 7.1): parsing, the target (default: the control
//! root), the running binary's bytes, the test hooks of ORCH 8 item 8 (only in a `test-hooks`
//! build), `update --from` (the other binary's own `install` does the work, A49), and the rendering
//! of `install::Report` and `InstallError`.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;

use crate::cli::{self, Failure, Parsed};
use crate::ctx::{ChildRole, Ctx};
use crate::install::{self, assets, InstallError, Options, Report};
use crate::text::show_path;
use crate::{clock, paths, sys, version};

pub const INSTALL_USAGE: &str = "
Usage: mam install [--target DIR] [--legacy-paths]
       mam install --print-herdr-shim

Installs mam into the git repository DIR (default: the control root): the running binary as
.mam/bin/mam (temp + rename), the legacy entry points and lib.sh in .mam/shims/, the eight skills
.agents/skills/<skill>/SKILL.md (create, resume, stop, status, monitor, delegate-job, loop,
orc-onboard), .mam.env.example, the generated .mam/shim/herdr, and the managed .gitignore block
(/.venv, /.mam/, /.mam.env). Four ledgers record it in .mam/install/: asset_hashes.txt,
version.txt, install_state, manifest.txt. On an installed target this is `mam update`; on a
legacy install it takes the legacy one over (see `mam update --help`). An interrupted install is
completed by the next one.

With --legacy-paths the legacy entry points (.agents/skills/multi-agent-mux/scripts/*.sh and
*.py, lib_py/delegation/envfile.py) are written at their legacy paths in any repository, each a
small script that runs .mam/shims/<shim>, so a caller of the legacy system finds them; they are
recorded in the ledgers (later updates keep them, remove takes them). A path there that is a
symlink, or a file mam did not write, refuses the install (nothing changed).

Options:
  --target DIR         the repository's top level (default: the control root)
  --legacy-paths       also write the legacy entry points at their legacy paths
  --print-herdr-shim   print the .mam/shim/herdr wrapper for this binary and exit (lib.sh uses it)
  -h, --help           print this help

Exit codes: 0 installed, 1 failure (an update or a legacy takeover restored every file first), 2
usage or a target that cannot take an install (missing, not a directory, not a repository, not
writable, a .gitignore that is not a regular file, a legacy path that is a symlink or not mam's);
nothing changed.
";

pub const UPDATE_USAGE: &str = "
Usage: mam update [--target DIR] [--from PATH]

Updates the mam install in DIR (default: the control root) to this binary's release, or with
--from to the release of the mam binary PATH (which runs `PATH install --target DIR`). Every file
of the old manifest, the four ledgers and .gitignore are backed up first; an asset you changed
since the install is moved to .mam/removed-<stamp>/<path> and listed before it is replaced; assets
no longer shipped are deleted when untouched and kept when modified; install_state keeps the old
keys the new release does not write (gitignore_created). Any failure, or a run killed midway and
run again, restores every backed-up file byte for byte. A replaced binary gets a NOTE: restart the
daemon.

A legacy install (.agents/skills/multi-agent-mux/ with its stamp files, or with scripts/ where mam
is not installed) is taken over: its state (.mam/jobs, .mam/delegate_job_logs, the sessions file
with its orchestrator uuids, .mam.env) is not changed, a legacy .mam/agent_sessions.yaml is
imported into .mam/agent_sessions.json (the YAML stays, with a .yaml.bak copy), its stamp files
are kept in .mam/removed-<stamp>/, and every legacy entry point is replaced at its legacy path by
a shim (a .py one runs directly, with bash or with python3). The takeover is backed up like an
update: a failed one restores every legacy file and leaves no ledger of mam.

Options:
  --target DIR   the repository's top level (default: the control root)
  --from PATH    another mam binary whose release to install
  -h, --help     print this help

Exit codes: 0 updated, 1 failure (every file restored), 2 usage, not installed (and no legacy
install), or a target that cannot take an install; the exit code of PATH with --from.
";

pub const REMOVE_USAGE: &str = "
Usage: mam remove [--target DIR] [--dry-run]

Takes mam out of DIR (default: the control root). Refused while a session row is running or the
daemon lock is held (each one named; nothing changed). Per manifest entry: unchanged since the
install -> deleted; changed -> moved to .mam/removed-<stamp>/<path> and listed as a local edit;
missing -> a note. The generated .mam/shim/ and emptied directories go; the managed block leaves
.gitignore, which is deleted only when install created it and nothing but whitespace is left; the
four ledgers go last. The job registry, audit logs, sessions file and loop state are kept and
named. A ledger naming a path outside DIR refuses the whole remove (nothing deleted).

Options:
  --target DIR   the repository's top level (default: the control root)
  --dry-run      print the plan; change nothing
  -h, --help     print this help

Exit codes: 0 removed (or planned), 1 failure or an unusable ledger, 2 usage or not installed,
3 refused: running work (nothing changed).
";

#[derive(Debug, Default)]
struct Args {
    target: Option<PathBuf>,
    from: Option<PathBuf>,
    dry_run: bool,
    print_herdr: bool,
    legacy_paths: bool,
}

fn parse(args: Vec<OsString>, from: bool, dry_run: bool, print: bool) -> Result<Parsed<Args>, Failure> {
    use lexopt::prelude::*;
    let mut a = Args::default();
    let mut p = lexopt::Parser::from_args(args);
    while let Some(arg) = p.next()? {
        match arg {
            Short('h') | Long("help") => return Ok(Parsed::Help),
            Long("target") => a.target = Some(non_empty("--target", p.value()?)?),
            Long("from") if from => a.from = Some(non_empty("--from", p.value()?)?),
            Long("dry-run") if dry_run => a.dry_run = true,
            Long("print-herdr-shim") if print => a.print_herdr = true,
            Long("legacy-paths") if print => a.legacy_paths = true,
            _ => return Err(arg.unexpected().into()),
        }
    }
    if a.print_herdr && (a.target.is_some() || a.legacy_paths) {
        return Err(Failure::usage("install: --print-herdr-shim takes no --target or --legacy-paths"));
    }
    Ok(Parsed::Run(a))
}

fn non_empty(flag: &str, v: OsString) -> Result<PathBuf, Failure> {
    if v.is_empty() {
        return Err(Failure::usage(format!("{flag} needs a non-empty value")));
    }
    Ok(PathBuf::from(v))
}

/// The target: `--target` made absolute against the cwd, else the control root; canonical, so the
/// herdr wrapper and the ledgers name the same directory however it was reached.
fn target(ctx: &Ctx, flag: Option<PathBuf>) -> Result<PathBuf, Failure> {
    let t = match flag {
        Some(t) => sys::absolutize(ctx.cwd(), &t),
        None => paths::control_root(ctx)?,
    };
    std::fs::canonicalize(&t).map_err(|_| {
        Failure::new(cli::rc::USAGE, format!("REFUSED: target {} does not exist; nothing changed", show_path(&t)))
    })
}

fn hooks(ctx: &Ctx) -> Result<(install::Hooks, Option<String>), Failure> {
    #[cfg(feature = "test-hooks")]
    {
        let n = |k: &str| -> Result<Option<u64>, Failure> { Ok(crate::knob::env(ctx, k, 1)?.map(u64::from)) };
        let h = install::Hooks {
            fail_after: n("MAM_TEST_INSTALL_FAIL_AFTER")?,
            kill_after: n("MAM_TEST_INSTALL_KILL_AFTER")?,
        };
        Ok((h, ctx.var_nonempty("MAM_TEST_ASSET_VERSION")))
    }
    #[cfg(not(feature = "test-hooks"))]
    {
        let _ = ctx;
        Ok((install::Hooks::default(), None))
    }
}

fn options(ctx: &Ctx, target: PathBuf, cmd: &str, legacy_paths: bool) -> Result<Options, Failure> {
    let (hooks, asset_version) = hooks(ctx)?;
    let roots = ctx.env_only("MAM_TRUSTED_ROOTS").map(|l| l.to_string_lossy().into_owned()).unwrap_or_default();
    let show = show_path(&target);
    #[allow(unused_mut)] // the swap hook exists in test-hooks builds only
    let mut target = install::tree::Tree::open(target, roots).map_err(|e| {
        let why = if e.raw_os_error() == Some(libc::ENOTDIR) {
            "is not a directory".to_string()
        } else {
            format!("cannot be opened ({e})")
        };
        failure(cmd, &InstallError::BadTarget(format!("target {show} {why}")))
    })?;
    #[cfg(feature = "test-hooks")]
    if let Some(v) = ctx.var_nonempty("MAM_TEST_INSTALL_SWAP") {
        if let Some((d, to)) = v.split_once(':') {
            target.swap = Some((d.to_string(), PathBuf::from(to)));
        }
    }
    let exe =
        std::env::current_exe().map_err(|e| Failure::runtime(format!("{cmd}: cannot find the running binary: {e}")))?;
    let binary = std::fs::read(&exe)
        .map_err(|e| Failure::runtime(format!("{cmd}: cannot read the running binary {}: {e}", show_path(&exe))))?;
    Ok(Options {
        target,
        binary,
        version: asset_version.unwrap_or_else(|| version::VERSION.to_string()),
        commit: version::COMMIT.to_string(),
        now_ts: clock::now_ts(),
        hooks,
        legacy_paths,
    })
}

fn failure(cmd: &str, e: &InstallError) -> Failure {
    match e {
        InstallError::BadTarget(_) | InstallError::Untrusted { .. } => {
            Failure::new(cli::rc::USAGE, format!("REFUSED: {cmd}: {e}"))
        }
        InstallError::NotInstalled(_) => Failure::usage(format!("{cmd}: {e}")),
        InstallError::Running(_) => Failure::new(3, format!("REFUSED: {cmd}: {e}")),
        InstallError::Ledger(_) => Failure::new(cli::rc::RUNTIME, format!("REFUSED: {cmd}: {e}")),
        _ => Failure::runtime(format!("{cmd}: {e}")),
    }
}

fn render(ctx: &Ctx, cmd: &str, r: Report, res: Result<(), InstallError>) -> Result<i32, Failure> {
    for n in &r.notes {
        ctx.diag(&n.replacen("NOTE: ", &format!("NOTE: {cmd}: "), 1).replacen(
            "WARNING: ",
            &format!("WARNING: {cmd}: "),
            1,
        ));
    }
    for l in &r.out {
        ctx.say(l);
    }
    res.map(|()| 0).map_err(|e| failure(cmd, &e))
}

pub fn run_install(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let Some(a) = cli::parse_or_help(ctx, INSTALL_USAGE, args, |v| parse(v, false, false, true))? else {
        return Ok(0);
    };
    if a.print_herdr {
        let exe = std::env::current_exe()
            .map_err(|e| Failure::runtime(format!("install: cannot find the running binary: {e}")))?;
        ctx.say_raw(assets::herdr_shim(&exe.to_string_lossy()).as_bytes());
        return Ok(0);
    }
    cli::load_env(ctx)?;
    let t = target(ctx, a.target)?;
    let o = options(ctx, t, "install", a.legacy_paths)?;
    let mut r = Report::default();
    let res = install::run::install(&o, &mut r);
    render(ctx, "install", r, res)
}

pub fn run_update(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let Some(a) = cli::parse_or_help(ctx, UPDATE_USAGE, args, |v| parse(v, true, false, false))? else {
        return Ok(0);
    };
    cli::load_env(ctx)?;
    let t = target(ctx, a.target)?;
    if let Some(from) = a.from {
        // A49: the other release's own install does the work, with its own assets.
        let from = sys::absolutize(ctx.cwd(), &from);
        let mut c = Command::new(&from);
        c.arg("install")
            .arg("--target")
            .arg(&t)
            .env_clear()
            .envs(ctx.child_env_for(ChildRole::Agent))
            .current_dir(ctx.cwd());
        let status =
            c.status().map_err(|e| Failure::runtime(format!("update: cannot run --from {}: {e}", show_path(&from))))?;
        return Ok(status.code().unwrap_or(cli::rc::RUNTIME));
    }
    let installed = t.join(install::ledger::MANIFEST).exists();
    if !installed && !install::run::is_legacy(&t) {
        return Err(failure("update", &InstallError::NotInstalled(t)));
    }
    let o = options(ctx, t, "update", false)?;
    let mut r = Report::default();
    let res = install::run::install(&o, &mut r);
    render(ctx, "update", r, res)
}

pub fn run_remove(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let Some(a) = cli::parse_or_help(ctx, REMOVE_USAGE, args, |v| parse(v, false, true, false))? else {
        return Ok(0);
    };
    cli::load_env(ctx)?;
    let t = target(ctx, a.target)?;
    // The target's own sessions file; AGENT_SESSIONS_YAML when the target is the control root.
    let r0 = paths::resolve_unchecked(ctx, None);
    let sessions = if r0.control_root == t { r0.sessions } else { t.join(".mam").join("agent_sessions.json") };
    let o = options(ctx, t, "remove", false)?;
    let mut r = Report::default();
    let res = install::remove::remove(&o, &sessions, a.dry_run, &mut r);
    if res.is_ok() && !a.dry_run {
        revoke_approvals(ctx, &o.target, &sessions, &mut r);
    }
    render(ctx, "remove", r, res)
}

/// Issue 30: what is left of mam's claude allow rule (`agents::allow`) goes with mam: from the
/// repository's own `.claude/settings.local.json` and from the directory of each session it recorded
/// (`stop` removes it too; this catches a rule a crash left behind).
fn revoke_approvals(ctx: &Ctx, t: &std::path::Path, sessions: &std::path::Path, r: &mut Report) {
    let Ok(mam) = crate::ops::mam_exe(ctx) else { return };
    let own = paths::resolve_unchecked(ctx, None).registry;
    let mut places = vec![(t.to_path_buf(), own.clone()), (t.to_path_buf(), t.join(".mam").join("jobs"))];
    if let Ok(doc) = crate::session::load(sessions) {
        for row in doc.herdr_sessions.iter().filter(|row| row.agent == "claude") {
            if let Some(cwd) = row.cwd() {
                places.push((std::path::PathBuf::from(cwd), crate::session::stop::row_store(ctx, row).registry));
            }
        }
    }
    crate::sort::natural(&mut places);
    places.dedup();
    for (d, registry) in places {
        let rule = crate::agents::allow::claude_rules(&mam, &registry);
        match crate::agents::allow::remove(&d, &rule) {
            Ok(true) => r.note(format!(
                "removed {} from {}",
                rule.join(" and "),
                crate::agents::allow::claude_settings(&d).display()
            )),
            Ok(false) => {}
            Err(e) => r.warn(format!("mam's allow rule not removed: {e}")),
        }
    }
}
