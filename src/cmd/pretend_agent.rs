//! `mam pretend-agent` (issue 32): the pretend agent, a documented stand-in for a coding-agent CLI
//! that lets a newcomer walk docs/GUIDE.md without an agent CLI or a network. `mam create pretend`
//! starts it in a tmux pane; its engine is the fake agent's (`testdouble::agent::pretend`). This file
//! parses its flags and gives the process the name `pretend`, the name its adapter row recognises.

use std::ffi::OsString;

use crate::agents;
use crate::cli::{self, Failure, Parsed};
use crate::ctx::Ctx;
use crate::knob;
use crate::sys;
use crate::testdouble;

pub const USAGE: &str = "
Usage: mam pretend-agent [--work S] [--edit FILE | --no-edit] [--verdict WORD] [--report TEXT]

A pretend coding agent, to try mam without an agent CLI or a network: `mam create pretend --name
NAME [-- FLAGS]` starts it in a tmux pane (herdr starts only its own agent kinds). It thinks about
nothing: for each prompt `Job <id>: read and follow <brief>` it runs the brief's start command,
takes S seconds, then
  - a review (a `mam loop` review or plan-review round): writes a report with the round's
    IDENTITY line and `VERDICT: WORD`;
  - a plan or the onboarding job of `mam create`: writes a report and changes no file;
  - any other job: appends one line to FILE (relative to its working directory) and writes a report;
and runs the brief's success command. It reads prompts as lines on stdin and prints what it does.

Options:
  --work S        seconds each job takes (default 1)
  --edit FILE     the file a job appends its line to (default notes.txt)
  --no-edit       change no file
  --verdict WORD  the verdict of a review: PASS (default) or NOT PASS
  --report TEXT   the report's text (default: what the pretend agent did)
  -h, --help      print this help

Exit codes: 0 its input ended, 1 runtime error, 2 usage.
";

#[derive(Debug)]
struct Args {
    work_s: u32,
    edit: Option<String>,
    verdict: String,
    report: Option<String>,
}

fn parse_args(args: Vec<OsString>) -> Result<Parsed<Args>, Failure> {
    use lexopt::prelude::*;
    let mut p = lexopt::Parser::from_args(args);
    let mut a = Args { work_s: 1, edit: Some("notes.txt".into()), verdict: "PASS".into(), report: None };
    while let Some(arg) = p.next()? {
        match arg {
            Short('h') | Long("help") => return Ok(Parsed::Help),
            Long("work") => a.work_s = knob::flag("--work", &p.value()?, 0)?,
            Long("edit") => a.edit = Some(cli::utf8("--edit", p.value()?)?).filter(|e| !e.is_empty()),
            Long("no-edit") => a.edit = None,
            Long("verdict") => {
                a.verdict = match cli::utf8("--verdict", p.value()?)?.as_str() {
                    v @ ("PASS" | "NOT PASS") => v.to_string(),
                    other => {
                        return Err(Failure::usage(format!(
                            "pretend-agent: --verdict: invalid value '{}' (expected PASS or NOT PASS)",
                            crate::text::one_line(other)
                        )))
                    }
                }
            }
            Long("report") => a.report = Some(cli::utf8("--report", p.value()?)?),
            _ => return Err(arg.unexpected().into()),
        }
    }
    Ok(Parsed::Run(a))
}

pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let Some(a) = cli::parse_or_help(ctx, USAGE, args, parse_args)? else {
        return Ok(0);
    };
    // Run under the name `pretend` (argv[0]), as a CLI runs under its own name: tmux shows it as the
    // pane's command and the adapter table recognises the process by it.
    let argv = sys::proc_cmdline(std::process::id() as i32).unwrap_or_default();
    let named = argv.first().is_some_and(|a0| a0.rsplit(|&b| b == b'/').next() == Some(agents::PRETEND.as_bytes()));
    if !named {
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::process::CommandExt;
        let exe = std::env::current_exe().map_err(|e| Failure::runtime(format!("cannot find the mam binary: {e}")))?;
        let rest = argv.iter().skip(1).map(|a| std::ffi::OsStr::from_bytes(a).to_os_string());
        let e = std::process::Command::new(exe).arg0(agents::PRETEND).args(rest).exec();
        return Err(Failure::runtime(format!("pretend-agent: cannot run as {}: {e}", agents::PRETEND)));
    }
    let edit_line = match &a.edit {
        Some(f) => format!("appended a line to {f}"),
        None => "changed no file".to_string(),
    };
    let mut settings = vec![
        ("work_s", a.work_s.to_string()),
        ("report_text", a.report.unwrap_or_else(|| format!("The pretend agent did the job: it {edit_line}."))),
        ("verdict", a.verdict),
    ];
    if let Some(f) = a.edit {
        settings.push(("edit", f));
    }
    testdouble::agent::pretend(ctx, &settings).map_err(Failure::runtime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags() {
        let Parsed::Run(a) = parse_args(cli::argv(&[])).unwrap() else { panic!("help") };
        assert_eq!((a.work_s, a.edit.as_deref(), a.verdict.as_str()), (1, Some("notes.txt"), "PASS"));
        let Parsed::Run(a) = parse_args(cli::argv(&["--no-edit", "--verdict", "NOT PASS", "--work", "0"])).unwrap()
        else {
            panic!("help")
        };
        assert_eq!((a.work_s, a.edit, a.verdict.as_str()), (0, None, "NOT PASS"));
        assert!(matches!(parse_args(cli::argv(&["--help"])), Ok(Parsed::Help)));
        assert_eq!(parse_args(cli::argv(&["--verdict", "maybe"])).unwrap_err().rc, 2);
        assert_eq!(parse_args(cli::argv(&["x"])).unwrap_err().rc, 2);
    }
}
