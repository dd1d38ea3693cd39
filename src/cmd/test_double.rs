//! `mam test-double herdr|agent|model` (ORCH 1.8): the thin, hidden entry to the test doubles in
//! `crate::testdouble`. Not listed in `mam --help`.

use std::ffi::OsString;

use crate::cli::Failure;
use crate::ctx::Ctx;
use crate::testdouble;

pub fn run(ctx: &mut Ctx, args: Vec<OsString>) -> Result<i32, Failure> {
    let mut it = args.into_iter();
    let which = it.next().and_then(|s| s.into_string().ok()).unwrap_or_default();
    let rest: Vec<String> = it.map(|a| a.to_string_lossy().into_owned()).collect();
    // Issue 32: `agent --help` printed nothing and started an agent. Flags after `--` are the agent's.
    let asks_help = |a: &String| a == "--help" || a == "-h";
    let agent_help = which == "agent" && rest.iter().take_while(|a| *a != "--").any(asks_help);
    if agent_help || matches!(which.as_str(), "--help" | "-h") {
        ctx.say(
            "Usage: mam test-double herdr|agent|model [args...]\n\nThe test doubles of mam's own test suite (ORCH \
             1.8), not a user feature: `agent` reads MAM_FAKE_AGENT_SCRIPT (docs/DESIGN.md lists its keys). To \
             try mam without an agent CLI use the pretend agent: `mam pretend-agent --help`.",
        );
        return Ok(0);
    }
    match which.as_str() {
        "herdr" => Ok(testdouble::herdr::run(ctx, rest)),
        "agent" => testdouble::agent::run(ctx, &rest).map_err(Failure::runtime),
        "model" => testdouble::model::run(ctx, &rest).map_err(Failure::runtime),
        _ => Err(Failure::usage("test-double: give herdr, agent or model (see mam test-double --help)")),
    }
}
