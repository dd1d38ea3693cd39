//! What a one-shot publish does while its record and events.log are written (issue 20): the broker
//! connection (TCP, CONNECT, CONNACK) opened on a second thread, and the audit half of the engine
//! transaction (audit.jsonl, status.json, their fsyncs) finished on a second thread while the event
//! goes out. Neither carries a byte of the event: the event is still on disk (the record fsynced,
//! the line in events.log) before its PUBLISH is written, and the `published` audit entry still
//! follows the transition's entries (the flush holds L5 until it is done).
//!
//! Every thread started here is joined: the audit flush always (local disk), the connection when it
//! is used, or on drop for at most `ABANDON_WAIT` (a broker that does not answer must not hold up a
//! refused publish; the process ends right after). Nothing here prints.

use std::path::Path;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::mqtt::{Client, MqttConfig, MqttError, Role, Stop};
use crate::registry::audit;
use crate::registry::store::AuditFlush;
use crate::sys;
use crate::trace;

/// How long an unused connection is waited for before the process goes on without it.
pub const ABANDON_WAIT: Duration = Duration::from_millis(200);

/// A connection being opened for the first wire attempt.
#[derive(Debug)]
pub struct Preconnect {
    handle: Option<JoinHandle<Result<Client, MqttError>>>,
    addr: String,
}

impl Preconnect {
    /// Starts connecting to `cfg`'s broker within `budget`; `None` when no thread could be started
    /// (the first attempt then connects itself, as before).
    pub fn start(cfg: &MqttConfig, budget: Duration) -> Option<Preconnect> {
        let cfg = cfg.clone();
        let addr = cfg.addr();
        let handle = std::thread::Builder::new()
            .name("publish-connect".into())
            .stack_size(STACK)
            .spawn(move || {
                let t = Instant::now();
                let deadline = t + budget;
                let r = Client::connect(&cfg, Role::Pub, &Stop::from_fn(move || Instant::now() >= deadline));
                trace::span("connect", t);
                r
            })
            .ok()?;
        Some(Preconnect { handle: Some(handle), addr })
    }

    /// The connection (or why it failed) for the first attempt to `addr`; `None` when it was opened
    /// to another broker (never expected: the engine does not change a record's broker block).
    pub fn take(mut self, addr: &str) -> Option<Result<Client, MqttError>> {
        if self.addr != addr {
            return None;
        }
        let h = self.handle.take()?;
        Some(h.join().unwrap_or_else(|_| Err(MqttError::Internal("the connecting thread panicked".into()))))
    }
}

impl Drop for Preconnect {
    fn drop(&mut self) {
        let Some(h) = self.handle.take() else { return };
        let end = Instant::now() + ABANDON_WAIT;
        while !h.is_finished() && Instant::now() < end {
            sys::sleep(Duration::from_millis(1));
        }
        if h.is_finished() {
            if let Ok(Ok(c)) = h.join() {
                c.disconnect();
            }
        }
    }
}

/// The audit half of the transaction, running.
#[derive(Debug)]
pub struct PendingAudit {
    handle: Option<JoinHandle<Option<String>>>,
    /// The warning of a flush done on the calling thread.
    done: Option<String>,
}

/// The stack of the threads started here: they connect, or append and write small files.
const STACK: usize = 256 * 1024;

/// A thread started before the record is written, waiting for the transition's audit flush: handing
/// the flush over then costs a wake-up instead of a thread start (about 0.2 ms on this machine,
/// issue 20). Dropped unused, its thread ends at once.
#[derive(Debug)]
pub struct AuditWorker {
    slot: std::sync::Arc<std::sync::Mutex<Slot>>,
    handle: Option<JoinHandle<Option<String>>>,
}

/// What the worker is handed: the mirror to stage, then the flush (or the end).
#[derive(Debug, Default)]
struct Slot {
    mirror: Option<serde_json::Value>,
    flush: Option<AuditFlush>,
    ended: bool,
}

impl AuditWorker {
    /// A worker for `job_id`'s audit in `logs`; `None` when no thread could be started
    /// (`PendingAudit::start` then starts one, or flushes).
    pub fn spawn(logs: &Path, job_id: &str) -> Option<AuditWorker> {
        let slot = std::sync::Arc::new(std::sync::Mutex::new(Slot::default()));
        let theirs = slot.clone();
        let (logs, job_id) = (logs.to_path_buf(), job_id.to_string());
        let handle = std::thread::Builder::new()
            .name("publish-audit".into())
            .stack_size(STACK)
            .spawn(move || {
                let mut staged = None;
                loop {
                    // The mirror first: a flush handed over meanwhile stays in the slot.
                    let (mirror, flush, ended) = {
                        let mut g = theirs.lock().unwrap_or_else(|e| e.into_inner());
                        match g.mirror.take() {
                            Some(m) => (Some(m), None, false),
                            None => (None, g.flush.take(), g.ended),
                        }
                    };
                    if let Some(m) = mirror {
                        // A failure here only means the flush writes status.json itself.
                        staged = audit::stage_mirror(&logs, &job_id, m).ok();
                        continue;
                    }
                    if let Some(f) = flush {
                        return f.flush_staged(staged);
                    }
                    if ended {
                        return None;
                    }
                    std::thread::park();
                }
            })
            .ok()?;
        Some(AuditWorker { slot, handle: Some(handle) })
    }

    /// Hands over the mirror of the decision, to be staged while the record is written (called
    /// under L1: it does no I/O, `Store::apply_deferred_staging`).
    pub fn stage(&self, mirror: serde_json::Value) {
        self.hand(|s| s.mirror = Some(mirror));
    }

    /// Hands `flush` to the waiting thread.
    pub fn start(mut self, flush: AuditFlush) -> PendingAudit {
        self.hand(|s| s.flush = Some(flush));
        PendingAudit { handle: self.handle.take(), done: None }
    }

    /// `stage` and `start` in one hand-over, so the worker finds both in its slot at its next
    /// look (what a slow wake-up does by chance).
    #[cfg(test)]
    fn stage_and_start(mut self, mirror: serde_json::Value, flush: AuditFlush) -> PendingAudit {
        self.hand(|s| {
            s.mirror = Some(mirror);
            s.flush = Some(flush);
        });
        PendingAudit { handle: self.handle.take(), done: None }
    }

    fn hand(&self, f: impl FnOnce(&mut Slot)) {
        f(&mut self.slot.lock().unwrap_or_else(|e| e.into_inner()));
        if let Some(h) = &self.handle {
            h.thread().unpark();
        }
    }
}

impl Drop for AuditWorker {
    fn drop(&mut self) {
        if self.handle.is_some() {
            self.hand(|s| s.ended = true);
        }
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl PendingAudit {
    /// Flushes on a second thread, or on this one when no thread can be started (then the
    /// flush is done when this returns).
    pub fn start(flush: AuditFlush) -> PendingAudit {
        let slot = std::sync::Arc::new(std::sync::Mutex::new(Some(flush)));
        let theirs = slot.clone();
        let spawned = std::thread::Builder::new().name("publish-audit".into()).stack_size(STACK).spawn(move || {
            let f = theirs.lock().unwrap_or_else(|e| e.into_inner()).take();
            f.and_then(AuditFlush::flush)
        });
        match spawned {
            Ok(handle) => PendingAudit { handle: Some(handle), done: None },
            Err(_) => {
                let f = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
                PendingAudit { handle: None, done: f.and_then(AuditFlush::flush) }
            }
        }
    }

    /// Waits for the flush; its warning, if any.
    pub fn finish(mut self) -> Option<String> {
        self.join()
    }

    fn join(&mut self) -> Option<String> {
        let Some(h) = self.handle.take() else { return self.done.take() };
        h.join().unwrap_or_else(|_| Some("audit not written (the flushing thread panicked)".into()))
    }
}

impl Drop for PendingAudit {
    fn drop(&mut self) {
        let _ = self.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::engine::{Authority, Kind, Request};
    use crate::registry::record::NewRecord;
    use crate::registry::store::Store;

    /// The mirror and the flush handed over before the worker has looked even once (it has just
    /// been started): the flush must not be lost with the mirror's turn (it was, once: the worker
    /// then waited forever and `mam publish` with it), and status.json ends as the flush says.
    #[test]
    fn a_worker_handed_the_mirror_and_the_flush_at_once_flushes_the_staged_mirror() {
        let dir = std::env::temp_dir().join(format!("mam-overlap-{}", sys::random_hex(4).unwrap()));
        let store = Store::new(dir.join("jobs"), dir.join("logs"));
        let mut reg = Request::new(Kind::Register, Authority::Operator, "j1");
        reg.record = Some(
            NewRecord { dispatch_token: "d".into(), auth_token: "k".repeat(64), ..NewRecord::local_task("j1") }
                .fields(1_000),
        );
        store.apply(&reg, 1_000).unwrap();
        for round in 0..20u64 {
            let worker = AuditWorker::spawn(&store.logs, "j1").unwrap();
            let mut meta = Request::new(Kind::Metadata, Authority::Operator, "j1");
            meta.fields.insert("round".into(), round.into());
            let mut mirror = None;
            let (_, flush) = store.apply_deferred_staging(&meta, 2_000 + round, &mut |m| mirror = Some(m)).unwrap();
            let mirror = mirror.expect("an applied decision hands its mirror over");
            let pending = if round % 2 == 0 {
                worker.stage_and_start(mirror, flush)
            } else {
                worker.stage(mirror);
                worker.start(flush)
            };
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || tx.send(pending.finish()).unwrap());
            let warning = rx.recv_timeout(Duration::from_secs(10)).expect("the flush finished");
            assert_eq!(warning, None);
            let status: serde_json::Value =
                serde_json::from_slice(&std::fs::read(dir.join("logs/j1/status.json")).unwrap()).unwrap();
            let rec = store.read("j1").unwrap().unwrap();
            assert_eq!(status["transition_seq"], rec.get("transition_seq").cloned().unwrap(), "round {round}");
            let temps: Vec<_> = std::fs::read_dir(dir.join("logs/j1"))
                .unwrap()
                .flatten()
                .filter(|e| sys::is_temp_name(&e.file_name()))
                .collect();
            assert!(temps.is_empty(), "no temp file left: {temps:?}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
