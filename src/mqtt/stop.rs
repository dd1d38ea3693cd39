//! A caller's stop condition for blocking MQTT calls: never, a flag, the pending SIGTERM/SIGINT, or
//! any predicate. Checked between read slices; it never blocks.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A caller's stop condition, checked between read slices of at most 200 ms.
#[derive(Clone, Default)]
pub struct Stop(Option<Arc<dyn Fn() -> bool + Send + Sync>>);

impl Stop {
    /// Never stops.
    pub fn never() -> Stop {
        Stop(None)
    }
    /// Stops once `flag` is set.
    pub fn flag(flag: Arc<AtomicBool>) -> Stop {
        Stop(Some(Arc::new(move || flag.load(Ordering::SeqCst))))
    }
    /// Stops once SIGTERM or SIGINT arrived (after `sys::install_stop_handlers`).
    pub fn signals() -> Stop {
        Stop(Some(Arc::new(|| crate::sys::pending_signal().is_some())))
    }
    pub fn from_fn(f: impl Fn() -> bool + Send + Sync + 'static) -> Stop {
        Stop(Some(Arc::new(f)))
    }
    pub fn is_set(&self) -> bool {
        self.0.as_ref().is_some_and(|f| f())
    }
}

impl fmt::Debug for Stop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() { "Stop(fn)" } else { "Stop(never)" })
    }
}
