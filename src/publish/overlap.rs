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

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::mqtt::{Client, MqttConfig, MqttError, Role, Stop};
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
    /// The flush handed over (`Some`), and whether the worker may stop waiting.
    slot: std::sync::Arc<std::sync::Mutex<(Option<AuditFlush>, bool)>>,
    handle: Option<JoinHandle<Option<String>>>,
}

impl AuditWorker {
    /// `None` when no thread could be started (`PendingAudit::start` then starts one, or flushes).
    pub fn spawn() -> Option<AuditWorker> {
        let slot = std::sync::Arc::new(std::sync::Mutex::new((None, false)));
        let theirs = slot.clone();
        let handle = std::thread::Builder::new()
            .name("publish-audit".into())
            .stack_size(STACK)
            .spawn(move || loop {
                let (flush, ended) = {
                    let mut g = theirs.lock().unwrap_or_else(|e| e.into_inner());
                    (g.0.take(), g.1)
                };
                if flush.is_some() || ended {
                    return flush.and_then(AuditFlush::flush);
                }
                std::thread::park();
            })
            .ok()?;
        Some(AuditWorker { slot, handle: Some(handle) })
    }

    /// Hands `flush` to the waiting thread.
    pub fn start(mut self, flush: AuditFlush) -> PendingAudit {
        self.hand(Some(flush));
        PendingAudit { handle: self.handle.take(), done: None }
    }

    fn hand(&self, flush: Option<AuditFlush>) {
        {
            let mut g = self.slot.lock().unwrap_or_else(|e| e.into_inner());
            g.0 = flush;
            g.1 = true;
        }
        if let Some(h) = &self.handle {
            h.thread().unpark();
        }
    }
}

impl Drop for AuditWorker {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            self.handle = Some(h);
            self.hand(None);
            if let Some(h) = self.handle.take() {
                let _ = h.join();
            }
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
