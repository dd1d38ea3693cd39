//! The `mam` multi-call binary: picks the subcommand, dispatches through one `match`, and owns the
//! error policy (one stderr line, the documented exit code). All logic lives in the library.
//!
//! `#![no_main]`: the C `main` below is the entry, so the Rust runtime's start-up (the main
//! thread's stack guard read from /proc/self/maps, the stack-overflow handlers) is not paid by
//! every short command (issue 20: `mam --version` against `/bin/true`); `sys::process_start` does
//! the part mam relies on (docs/DESIGN.md).

// The test harness brings its own `main` to the (empty) unit-test build of this file.
#![cfg_attr(not(test), no_main)]

use std::ffi::OsString;

use mam::cli::{rc, Failure};
use mam::cmd;
use mam::ctx::Ctx;

const VERSION: &str = mam::version::VERSION;

/// Every subcommand with its one-line summary; `ready: false` entries belong to later work and say so.
const COMMANDS: &[(&str, &str, bool)] = &[
    ("env", "print the env file as shell exports, its path, or check an integer knob", true),
    ("paths", "print the control root, registry, audit-log root and sessions file", true),
    ("registry", "job records: register, submit, show, list, status, finalize, expire, set-meta, paths", true),
    ("publish", "report a signed job event (started, progress, completed, failed, error)", true),
    ("heartbeat", "the per-job heartbeat timer: start, stop, status, run", true),
    ("watch", "follow one job on the wire and on disk until it ends or goes silent", true),
    ("wait", "wait for the verdicts of several jobs (ids, sessions or all open), one line each", true),
    ("remote", "dispatch a job to a remote runner, or run one", true),
    ("daemon", "the workspace subscriber daemon: run, ensure, status, stop", true),
    ("reconcile", "reconcile job records once, or run the daemon with --subscribe", true),
    ("jobs", "one table of the jobs in a registry", true),
    ("broker", "the embedded MQTT 3.1.1 broker for one machine; `broker check` tests a broker list", true),
    ("pub", "publish one MQTT message (like mosquitto_pub)", true),
    ("sub", "print MQTT messages arriving on a filter (like mosquitto_sub)", true),
    ("pane", "pane backends (herdr, tmux, fake): ls, new-session, send-keys-safe, status, close", true),
    ("create", "start a named agent session in a pane", true),
    ("pretend-agent", "a pretend coding agent to try mam without one (`mam create pretend`)", true),
    ("attach", "go to an agent session's pane (tmux: switch or attach; herdr: focus or attach)", true),
    ("resume", "resume a stopped agent session", true),
    ("stop", "stop agent sessions and cancel their open jobs", true),
    ("status", "show agent sessions and their jobs", true),
    ("ui", "one live full-screen view of every session, job and loop, with keys to go to a pane", true),
    ("monitor", "start, stop or show the control root's subscriber daemon", true),
    ("notify", "the verdict hook (MAM_ON_VERDICT): test it, or its supervisor (run)", true),
    ("session", "sessions file maintenance: import-yaml (legacy YAML to JSON, once)", true),
    ("delegate-job", "hand a job to an agent and wait for its verdict and report", true),
    ("diff-collect", "the review loop's diff: a base commit against the working tree or a head commit", true),
    ("agents", "conversation artifacts of agent CLIs: purge one when nothing alive uses it", true),
    ("orc-onboard", "register, list or remove the orchestrator's conversation uuid", true),
    ("loop", "the review loop: a creator and reviewers to a pinned, promoted PASS; status, prune", true),
    ("worktree", "a creator's own git worktree: prepare, remove (only when nothing is lost), list", true),
    ("install", "install mam (binary, shims, skills, .gitignore block) into a repository", true),
    ("update", "update an installed (or legacy) repository, keeping local edits and state", true),
    ("remove", "take mam out of a repository; local edits kept aside, state kept", true),
    ("bench", "the performance table against its anchors on this machine (also loop-round)", true),
];

/// The entry points that load the env file before refusing as not yet available (CORE 1.3), so an
/// unreadable env file is reported the same way by every one of them.
const LOADS_ENV: &[&str] = &["publish", "heartbeat", "watch", "remote", "daemon", "bench"];

fn help() -> String {
    let mut s = format!(
        "mam {VERSION}: run coding agents in panes and know from evidence whether their jobs started,\n\
         are alive, finished or died.\n\nUsage: mam <command> [args...]\n       mam <command> --help\n\nCommands:\n"
    );
    for (name, summary, ready) in COMMANDS {
        let tag = if *ready { "" } else { " (not yet available)" };
        s.push_str(&format!("  {name:<13} {summary}{tag}\n"));
    }
    s.push_str(
        "\nExit codes: 0 ok, 1 runtime error, 2 usage or refused before any change; 3 and up say how a\n\
         command ended and are its own, listed in `mam <command> --help` and in README.md's table.\n",
    );
    s
}

fn dispatch(ctx: &mut Ctx, name: &str, args: Vec<OsString>) -> Result<i32, Failure> {
    // The test doubles of ORCH 1.8 are dispatched but hidden from COMMANDS (and so from --help).
    if name == "test-double" {
        return cmd::test_double::run(ctx, args);
    }
    if !COMMANDS.iter().any(|(n, _, ready)| *n == name && *ready) {
        return not_yet(ctx, name, args);
    }
    match name {
        "env" => cmd::env::run(ctx, args),
        "paths" => cmd::paths::run(ctx, args),
        "registry" => cmd::registry::run(ctx, args),
        "broker" => cmd::broker::run(ctx, args),
        "pub" => cmd::pub_::run(ctx, args),
        "sub" => cmd::sub::run(ctx, args),
        "pane" => cmd::pane::run(ctx, args),
        "publish" => cmd::publish::run(ctx, args),
        "heartbeat" => cmd::heartbeat::run(ctx, args),
        "watch" => cmd::watch::run(ctx, args),
        "wait" => cmd::wait::run(ctx, args),
        "remote" => cmd::remote::run(ctx, args),
        "daemon" => cmd::daemon::run(ctx, args),
        "reconcile" => cmd::reconcile::run(ctx, args),
        "jobs" => cmd::jobs::run(ctx, args),
        "agents" => cmd::agents::run(ctx, args),
        "orc-onboard" => cmd::orc_onboard::run(ctx, args),
        "create" => cmd::create::run(ctx, args),
        "pretend-agent" => cmd::pretend_agent::run(ctx, args),
        "attach" => cmd::attach::run(ctx, args),
        "resume" => cmd::resume::run(ctx, args),
        "stop" => cmd::stop::run(ctx, args),
        "status" => cmd::status::run(ctx, args),
        "ui" => cmd::ui::run(ctx, args),
        "monitor" => cmd::monitor::run(ctx, args),
        "notify" => cmd::notify::run(ctx, args),
        "session" => cmd::session::run(ctx, args),
        "delegate-job" => cmd::delegate_job::run(ctx, args),
        "diff-collect" => cmd::diff_collect::run(ctx, args),
        "loop" => cmd::loop_::run(ctx, args),
        "worktree" => cmd::worktree::run(ctx, args),
        "bench" => cmd::bench::run(ctx, args),
        "install" => cmd::install::run_install(ctx, args),
        "update" => cmd::install::run_update(ctx, args),
        "remove" => cmd::install::run_remove(ctx, args),
        _ => not_yet(ctx, name, args),
    }
}

fn not_yet(ctx: &mut Ctx, name: &str, args: Vec<OsString>) -> Result<i32, Failure> {
    let Some((_, summary, _)) = COMMANDS.iter().find(|(n, _, _)| *n == name) else {
        let hint = match mam::text::closest(name, COMMANDS.iter().map(|(n, _, _)| *n)) {
            Some(c) => format!("; did you mean 'mam {c}'?"),
            None => String::new(),
        };
        return Err(Failure::usage(format!("unknown command '{}'{hint} (see mam --help)", mam::text::one_line(name))));
    };
    if args.iter().any(|a| a == "--help" || a == "-h") {
        ctx.say(&format!("Usage: mam {name} ...\n\n{summary}.\n\nNot yet available in this build: exits 2."));
        return Ok(0);
    }
    if LOADS_ENV.contains(&name) {
        mam::cli::load_env(ctx)?;
    }
    Err(Failure::usage(format!("mam {name}: not yet available in this build")))
}

/// The process entry (see the module header). argv comes from `std::env::args_os`, which glibc
/// builds of std fill before `main` runs.
#[cfg(not(test))]
#[no_mangle]
pub extern "C" fn main(_argc: std::ffi::c_int, _argv: *const *const std::ffi::c_char) -> std::ffi::c_int {
    mam::sys::process_start();
    run()
}

#[cfg_attr(test, allow(dead_code))] // the entry above is not compiled into the test harness
fn run() -> ! {
    let mut argv = std::env::args_os().skip(1);
    let mut ctx = Ctx::from_process();
    let mut code = match argv.next() {
        None => {
            eprint!("{}", help());
            rc::USAGE
        }
        Some(first) => match first.to_str() {
            Some("-h" | "--help" | "help") => {
                ctx.say_raw(help().as_bytes());
                rc::OK
            }
            Some("-V" | "--version") => {
                ctx.say(&format!("mam {}", mam::version::long()));
                rc::OK
            }
            Some(name) => match dispatch(&mut ctx, name, argv.collect()) {
                Ok(code) => code,
                // A closed stdout pipe ended the command: the reader is gone, so nothing to report.
                Err(_) if ctx.out_broken_pipe() => rc::OK,
                Err(f) => {
                    ctx.diag(&f.line);
                    f.rc
                }
            },
            None => {
                ctx.diag("ERROR: command name is not UTF-8 (see mam --help)");
                rc::USAGE
            }
        },
    };
    // The command has returned (its children reaped, its connections closed): now the stdout
    // policy. A closed pipe exits 0; any other write error is a runtime failure.
    if let Some(e) = ctx.take_out_error() {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            code = rc::OK;
        } else {
            ctx.diag(&format!("ERROR: cannot write to stdout: {e}"));
            if code == rc::OK {
                code = rc::RUNTIME;
            }
        }
    }
    std::process::exit(code);
}
