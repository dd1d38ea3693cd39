//! `with_retry` (CORE 3.3, A8): up to 3 attempts waiting 1 s then 2 s, only for retryable errors,
//! within an optional total wire budget. Each failed attempt that will be retried produces the
//! warning line `WARNING: publish attempt 1/3 failed (<error>); retrying in 1s`, handed to the
//! caller's callback (this module never prints). Waits are sliced so a `Stop` is honoured; the
//! caller must not hold a lock while calling this (CORE 3.3).

use std::time::{Duration, Instant};

use super::error::MqttError;
use super::stop::Stop;
use crate::sys;

/// How many attempts, the waits between them, and the total budget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The wait before attempt 2, 3, ...; attempts = delays + 1.
    pub delays: Vec<Duration>,
    /// Total wall time across all attempts and waits (A8's `MAM_PUBLISH_BUDGET_S`); `None` for none.
    pub budget: Option<Duration>,
    /// The word in the warning: `publish`, `subscribe`, `connect`.
    pub what: &'static str,
}

impl RetryPolicy {
    /// CORE 3.3: 3 attempts, waiting 1 s and then 2 s.
    pub fn standard(what: &'static str) -> RetryPolicy {
        RetryPolicy { delays: vec![Duration::from_secs(1), Duration::from_secs(2)], budget: None, what }
    }

    /// One attempt, no retries.
    pub fn once(what: &'static str) -> RetryPolicy {
        RetryPolicy { delays: Vec::new(), budget: None, what }
    }

    pub fn with_budget(mut self, budget: Duration) -> RetryPolicy {
        self.budget = Some(budget);
        self
    }

    pub fn attempts(&self) -> u32 {
        self.delays.len() as u32 + 1
    }
}

/// `1s`, `2s`, or `250ms` for waits that are not whole seconds (tests).
pub fn show_delay(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// Runs `op(attempt)` (attempt counts from 1) until it succeeds, fails with a non-retryable error,
/// the attempts run out, or the next wait would exceed the budget. Returns the last error.
pub fn with_retry<T>(
    policy: &RetryPolicy,
    stop: &Stop,
    mut warn: impl FnMut(String),
    mut op: impl FnMut(u32) -> Result<T, MqttError>,
) -> Result<T, MqttError> {
    let started = Instant::now();
    let attempts = policy.attempts();
    let mut attempt = 1;
    loop {
        let err = match op(attempt) {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if !err.retryable() || attempt >= attempts || stop.is_set() {
            return Err(err);
        }
        let delay = policy.delays[attempt as usize - 1];
        if let Some(budget) = policy.budget {
            if started.elapsed() + delay >= budget {
                return Err(err);
            }
        }
        warn(format!(
            "WARNING: {} attempt {attempt}/{attempts} failed ({err}); retrying in {}",
            policy.what,
            show_delay(delay)
        ));
        let until = Instant::now() + delay;
        loop {
            if stop.is_set() {
                return Err(err);
            }
            let now = Instant::now();
            if now >= until {
                break;
            }
            sys::sleep((until - now).min(Duration::from_millis(100)));
        }
        attempt += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lost() -> MqttError {
        MqttError::NotConnected { addr: "h:1".into() }
    }

    fn fast(what: &'static str) -> RetryPolicy {
        RetryPolicy { delays: vec![Duration::from_millis(1), Duration::from_millis(2)], budget: None, what }
    }

    #[test]
    fn retries_retryable_then_succeeds() {
        let mut warnings = Vec::new();
        let mut seen = Vec::new();
        let r = with_retry(
            &fast("publish"),
            &Stop::never(),
            |w| warnings.push(w),
            |a| {
                seen.push(a);
                if a < 3 {
                    Err(lost())
                } else {
                    Ok(a)
                }
            },
        );
        assert_eq!(r.unwrap(), 3);
        assert_eq!(seen, [1, 2, 3]);
        assert_eq!(
            warnings,
            [
                "WARNING: publish attempt 1/3 failed (not connected to broker h:1 (connection dropped; reconnecting)); \
                 retrying in 1ms",
                "WARNING: publish attempt 2/3 failed (not connected to broker h:1 (connection dropped; reconnecting)); \
                 retrying in 2ms",
            ]
        );
        assert_eq!(show_delay(Duration::from_secs(1)), "1s");
    }

    #[test]
    fn non_retryable_is_one_attempt() {
        for e in [
            MqttError::ConnackRefused { addr: "h".into(), code: 4 },
            MqttError::ConnackRefused { addr: "h".into(), code: 5 },
            MqttError::TlsVerify { addr: "h".into(), line: "verify error:num=19".into() },
            MqttError::OpensslNotFound { program: "/nonexistent".into() },
            MqttError::SubackRefused { filter: "a/#".into() },
        ] {
            let mut n = 0;
            let mut e = Some(e);
            let r: Result<(), _> = with_retry(
                &fast("publish"),
                &Stop::never(),
                |_| panic!("no warning"),
                |_| {
                    n += 1;
                    Err(e.take().unwrap())
                },
            );
            assert!(r.is_err());
            assert_eq!(n, 1);
        }
        assert!(MqttError::ConnackRefused { addr: "h".into(), code: 3 }.retryable());
        assert!(MqttError::NoConnack { addr: "h".into(), phase: "connack" }.retryable());
        assert!(MqttError::Tcp { addr: "h".into(), source: std::io::ErrorKind::ConnectionRefused.into() }.retryable());
        assert!(!MqttError::Tcp { addr: "h".into(), source: std::io::ErrorKind::PermissionDenied.into() }.retryable());
    }

    #[test]
    fn gives_up_after_three_and_within_budget() {
        let mut n = 0;
        let r: Result<(), _> = with_retry(
            &fast("publish"),
            &Stop::never(),
            |_| {},
            |_| {
                n += 1;
                Err(lost())
            },
        );
        assert!(r.is_err());
        assert_eq!(n, 3);
        let policy = RetryPolicy::standard("publish").with_budget(Duration::from_millis(500));
        let mut n = 0;
        let t = Instant::now();
        let r: Result<(), _> = with_retry(
            &policy,
            &Stop::never(),
            |_| {},
            |_| {
                n += 1;
                Err(lost())
            },
        );
        assert!(r.is_err());
        assert_eq!(n, 1, "a 1 s wait does not fit a 0.5 s budget");
        assert!(t.elapsed() < Duration::from_millis(400));
    }
}
