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
    match which.as_str() {
        "herdr" => Ok(testdouble::herdr::run(ctx, rest)),
        "agent" => testdouble::agent::run(ctx, &rest).map_err(Failure::runtime),
        "model" => testdouble::model::run(ctx, &rest).map_err(Failure::runtime),
        _ => Err(Failure::usage("test-double: give herdr, agent or model")),
    }
}
