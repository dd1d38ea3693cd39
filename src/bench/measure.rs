//! Whole processes timed as the user runs them: wall time from spawn to reaped exit and the peak
//! resident set (`ru_maxrss`), runs alternated between a command and its anchor so a change in the
//! machine's load falls on both, medians. Also the machine's load and the resident set of a live
//! process. Nothing here prints.

use std::io;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::sys;

/// One run of one command.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub wall: Duration,
    /// Peak resident set in KiB. Linux includes the spawner's resident set at the fork (see
    /// `sys::wait_rusage`), so values near the spawner's own (`floor_kib`) mean "at most that".
    pub maxrss_kib: u64,
    /// Exit code (128 + signal when killed).
    pub code: i32,
}

/// Runs `cmd` once (stdin, stdout and stderr on /dev/null unless the caller set them) and reaps it.
pub fn run(cmd: &mut Command) -> io::Result<Sample> {
    cmd.stdin(Stdio::null());
    let t = Instant::now();
    let child = sys::spawn(cmd)?;
    let (code, maxrss_kib) = sys::wait_rusage(child.id() as i32)?;
    Ok(Sample { wall: t.elapsed(), maxrss_kib, code })
}

/// `runs` rounds of every command once, the order reversed every other round; every run must exit
/// 0 (a failing command's numbers would mean nothing). Returns the samples per command.
pub fn alternate(runs: usize, cmds: &mut [&mut Command]) -> io::Result<Vec<Vec<Sample>>> {
    let mut out = vec![Vec::with_capacity(runs); cmds.len()];
    for round in 0..runs {
        let order: Vec<usize> =
            if round % 2 == 0 { (0..cmds.len()).collect() } else { (0..cmds.len()).rev().collect() };
        for i in order {
            let s = run(cmds[i])?;
            if s.code != 0 {
                return Err(io::Error::other(format!("{} exited with {}", shown(cmds[i]), s.code)));
            }
            out[i].push(s);
        }
    }
    Ok(out)
}

/// `program arg...` for messages.
pub fn shown(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    crate::text::one_line(&s)
}

/// The median of `xs` (the mean of the two middle values for an even count); 0 for none.
pub fn median(mut xs: Vec<f64>) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    crate::sort::by(&mut xs, f64::total_cmp);
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

/// Median wall time in milliseconds.
pub fn median_ms(samples: &[Sample]) -> f64 {
    median(samples.iter().map(|s| s.wall.as_secs_f64() * 1e3).collect())
}

/// Highest peak resident set of the samples, KiB.
pub fn max_rss_kib(samples: &[Sample]) -> u64 {
    samples.iter().map(|s| s.maxrss_kib).max().unwrap_or(0)
}

/// The 1, 5 and 15 minute load averages (/proc/loadavg).
pub fn loadavg() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut it = text.split_whitespace().map(|v| v.parse::<f64>().ok());
    Some([it.next()??, it.next()??, it.next()??])
}

/// A long-lived child (a broker, the anchor `sleep`): killed and reaped on drop.
#[derive(Debug)]
pub struct Guard(pub Child);

impl Guard {
    pub fn pid(&self) -> i32 {
        self.0.id() as i32
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `ready` every 10 ms until it holds or `limit` passes.
pub fn wait_until(limit: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    loop {
        if ready() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        sys::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(vec![]), 0.0);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
    }
}
