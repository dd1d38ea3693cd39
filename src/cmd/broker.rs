//! `mam broker`: filled in by the MQTT transport work (issue 3).

use std::ffi::OsString;

use crate::cli::Failure;
use crate::ctx::Ctx;

pub fn run(_ctx: &mut Ctx, _args: Vec<OsString>) -> Result<i32, Failure> {
    Err(Failure::usage("mam broker: not yet available in this build"))
}
