//! Where one command's time goes (issue 20): named spans (start and length, from when tracing was
//! switched on), recorded only after `enable_at`, for `MAM_TRACE=1 mam publish` and
//! `mam bench publish`. Off, a span costs one atomic load. It never prints: the command turns the
//! spans into its one stderr line (`line`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

static ON: AtomicBool = AtomicBool::new(false);
static ORIGIN: OnceLock<Instant> = OnceLock::new();
static SPANS: Mutex<Vec<Span>> = Mutex::new(Vec::new());

/// One timed step, relative to `enable_at`'s origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub name: &'static str,
    pub start: Duration,
    pub len: Duration,
}

/// Starts recording; the origin of every span is `origin` (the command's start).
pub fn enable_at(origin: Instant) {
    let _ = ORIGIN.set(origin);
    ON.store(true, Ordering::Relaxed);
}

pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Records the span `name` from `since` to now (on any thread).
pub fn span(name: &'static str, since: Instant) {
    if !on() {
        return;
    }
    let Some(origin) = ORIGIN.get() else { return };
    let s = Span { name, start: since.saturating_duration_since(*origin), len: since.elapsed() };
    SPANS.lock().unwrap_or_else(|e| e.into_inner()).push(s);
}

/// The spans recorded so far, in the order they ended.
pub fn take() -> Vec<Span> {
    std::mem::take(&mut *SPANS.lock().unwrap_or_else(|e| e.into_inner()))
}

/// `mam-trace: <name>=<start ms>+<length ms> ...` (microsecond precision).
pub fn line(spans: &[Span]) -> String {
    let mut s = String::from("mam-trace:");
    for x in spans {
        s.push_str(&format!(" {}={:.3}+{:.3}", x.name, x.start.as_secs_f64() * 1e3, x.len.as_secs_f64() * 1e3));
    }
    s
}

/// Parses `line`'s output back: `(name, start ms, length ms)`.
pub fn parse(line: &str) -> Option<Vec<(String, f64, f64)>> {
    let rest = line.trim().strip_prefix("mam-trace:")?;
    rest.split_whitespace()
        .map(|f| {
            let (name, v) = f.split_once('=')?;
            let (a, b) = v.split_once('+')?;
            Some((name.to_string(), a.parse().ok()?, b.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_parses_back() {
        let spans = [
            Span { name: "parse", start: Duration::from_micros(0), len: Duration::from_micros(210) },
            Span { name: "events.log", start: Duration::from_micros(2500), len: Duration::from_micros(40) },
        ];
        let l = line(&spans);
        assert_eq!(l, "mam-trace: parse=0.000+0.210 events.log=2.500+0.040");
        assert_eq!(parse(&l), Some(vec![("parse".into(), 0.0, 0.21), ("events.log".into(), 2.5, 0.04)]));
        assert_eq!(parse("nope"), None);
    }
}
