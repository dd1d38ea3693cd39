//! What follows an operator close (A4, CORE 4.2, 7.4): once a write under L1 took a job to a terminal
//! status (`registry status --set`, `finalize`, `expire`, `mam stop`'s cancel), stop the job's
//! heartbeat timer with a drain, then publish the signed retained state with `last_event: "closed"`
//! and the seq that write allocated. One implementation for every command that closes a job.
//!
//! Runs after L1 is released (it takes L2 and L3 and may wait on the broker). Never prints: every
//! line, with its `WARNING: ` prefix, goes to the caller's `diag`; a failure never changes the
//! caller's exit code, because the record is already final.

use std::time::Duration;

use super::close_state;
use crate::ctx::Ctx;
use crate::heartbeat::timer;
use crate::registry::record::Record;
use crate::registry::store::Store;
use crate::wire::{self, Settings};

/// CORE 7.4: stop the job's timer with the drain of `MAM_HEARTBEAT_DRAIN_S` (1 s when that is
/// invalid, with a warning). Also used after an applied re-dispatch.
pub fn stop_job_timer(ctx: &Ctx, store: &Store, job_id: &str, diag: &mut dyn FnMut(String)) {
    let drain = match wire::drain_from_ctx(ctx) {
        Ok(d) => d,
        Err(f) => {
            diag(format!("WARNING: {f}; using 1s"));
            Duration::from_secs(1)
        }
    };
    match timer::stop_timer(store, job_id, drain) {
        Ok(s) => {
            if let Some(w) = timer::stopped_warning(&s, drain) {
                diag(w);
            }
        }
        Err(e) => diag(format!("WARNING: job {job_id}: cannot stop the heartbeat timer ({e})")),
    }
}

/// A4: the signed retained `closed` state of `record` (as written by the close, its seq included)
/// on the record's broker. A failure is one WARNING line.
pub fn publish_closed(ctx: &Ctx, store: &Store, record: &Record, diag: &mut dyn FnMut(String)) {
    let settings = match Settings::for_registry(ctx, Some(&store.registry)) {
        Ok(s) => s,
        Err(f) => {
            diag(format!("WARNING: close state not published ({f})"));
            return;
        }
    };
    if let Err(w) = close_state(store, &settings, record, diag) {
        diag(format!("WARNING: {w}"));
    }
}

/// Both steps, in the order of CORE 7.4 then A4: no beat of the closed attempt can follow the
/// closed state once the timer is gone. `publish: false` is `--no-publish`.
pub fn after_close(ctx: &Ctx, store: &Store, record: &Record, publish: bool, diag: &mut dyn FnMut(String)) {
    let job_id = record.str("job_id").unwrap_or_default().to_string();
    stop_job_timer(ctx, store, &job_id, diag);
    if publish {
        publish_closed(ctx, store, record, diag);
    }
}
