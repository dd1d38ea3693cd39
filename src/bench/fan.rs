//! Fan-in and fan-out through a broker with the mosquitto command-line clients (issue 31): `pubs`
//! `mosquitto_pub -l -q 1` processes, each sending `n` lines of its own on a topic of its own, to
//! `subs` `mosquitto_sub -q 1` processes subscribed to all of them. Real clients, because the
//! fan-in stall this measures came from how they write (small writes without TCP_NODELAY), which a
//! generator of our own would not show.
//!
//! Each subscriber must see every line exactly once: the run counts what is missing and what came
//! twice. Its clock starts when every subscriber holds its subscription (each prints the retained
//! `ready` line first) and stops at the last line any subscriber read. Nothing here prints; every
//! child is killed and reaped on return, and every wait has a deadline.

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use super::measure::Guard;

/// The mosquitto clients and where the run keeps its line files.
pub struct Tools {
    pub publisher: PathBuf,
    pub subscriber: PathBuf,
    /// A directory of the caller's for the publishers' input files.
    pub dir: PathBuf,
    /// The environment the children get (nothing else).
    pub env: Vec<(String, String)>,
}

/// What one fan run measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fan {
    /// Deliveries due: `pubs x n x subs`.
    pub due: usize,
    /// Distinct lines delivered (over all subscribers).
    pub delivered: usize,
    /// Lines a subscriber got more than once (each extra copy counted).
    pub duplicates: usize,
    /// First publisher start to the last line any subscriber read.
    pub wall: Duration,
}

impl Fan {
    /// Distinct deliveries per second.
    pub fn per_s(&self) -> f64 {
        self.delivered as f64 / self.wall.as_secs_f64().max(1e-9)
    }
}

const TOPIC: &str = "bench/fan";

impl Tools {
    fn cmd(&self, program: &Path, addr: SocketAddr, args: &[&str]) -> Command {
        let mut c = Command::new(program);
        c.args(["-h", &addr.ip().to_string(), "-p", &addr.port().to_string(), "-q", "1"])
            .args(args)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c
    }
}

/// One run: `pubs` publishers of `n` lines each to `subs` subscribers, within `limit`.
pub fn fan(tools: &Tools, addr: SocketAddr, pubs: usize, subs: usize, n: usize, limit: Duration) -> io::Result<Fan> {
    let end = Instant::now() + limit;
    let timeout = |what: &str| io::Error::new(io::ErrorKind::TimedOut, format!("{what} within {} s", limit.as_secs()));
    // The retained line every subscriber reads first: it holds its subscription then.
    let mut ready = tools.cmd(&tools.publisher, addr, &["-r", "-t", &format!("{TOPIC}/ready"), "-m", "ready"]);
    let st = crate::sys::spawn(&mut ready)?.wait()?;
    if !st.success() {
        return Err(io::Error::other(format!("mosquitto_pub of the ready line failed ({st})")));
    }
    let per_sub = pubs * n + 1;
    let (tx, rx) = mpsc::channel::<(usize, Option<String>, Instant)>();
    let mut children: Vec<Guard> = Vec::new();
    let mut readers = Vec::new();
    for j in 0..subs {
        let wait_s = limit.as_secs().max(1).to_string();
        let mut c = tools.cmd(
            &tools.subscriber,
            addr,
            &[
                "-t",
                &format!("{TOPIC}/#"),
                "-C",
                &per_sub.to_string(),
                "-W",
                &wait_s,
                "-i",
                &format!("fansub-{j}-{}", addr.port()),
            ],
        );
        c.stdout(Stdio::piped());
        let mut child: Child = crate::sys::spawn(&mut c)?;
        let out = child.stdout.take().ok_or_else(|| io::Error::other("mosquitto_sub has no stdout"))?;
        children.push(Guard(child));
        let tx = tx.clone();
        readers.push(thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send((j, Some(line), Instant::now())).is_err() {
                    return;
                }
            }
            let _ = tx.send((j, None, Instant::now()));
        }));
    }
    drop(tx);
    let mut got: Vec<HashMap<String, usize>> = vec![HashMap::new(); subs];
    let mut open = subs;
    let mut readied = 0;
    let mut last = Instant::now();
    let next = |got: &mut Vec<HashMap<String, usize>>, open: &mut usize, last: &mut Instant| {
        let left = end.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((j, Some(line), at)) => {
                *got[j].entry(line.clone()).or_default() += 1;
                *last = at;
                Ok(Some((j, line)))
            }
            Ok((_, None, _)) => {
                *open -= 1;
                Ok(None)
            }
            Err(_) => Err(()),
        }
    };
    while readied < subs {
        match next(&mut got, &mut open, &mut last) {
            Ok(Some((_, l))) if l == "ready" => readied += 1,
            Ok(_) if open < subs => return Err(io::Error::other("a mosquitto_sub ended before its subscription")),
            Ok(_) => {}
            Err(()) => return Err(timeout("the subscribers did not subscribe")),
        }
    }
    let mut files = Vec::new();
    for i in 0..pubs {
        let path = tools.dir.join(format!("fan-{}-{i}.lines", addr.port()));
        let mut text = Vec::with_capacity(n * 12);
        for s in 0..n {
            writeln!(text, "p{i}-{s}")?;
        }
        crate::sys::atomic_write(&path, &text)?;
        files.push(path);
    }
    let start = Instant::now();
    let mut publishers = Vec::new();
    for (i, path) in files.iter().enumerate() {
        let mut c = tools.cmd(&tools.publisher, addr, &["-l", "-t", &format!("{TOPIC}/{i}")]);
        c.stdin(std::fs::File::open(path)?);
        publishers.push(Guard(crate::sys::spawn(&mut c)?));
    }
    while open > 0 {
        if next(&mut got, &mut open, &mut last).is_err() {
            break;
        }
    }
    let wall = last.saturating_duration_since(start);
    for p in &mut publishers {
        let _ = p.0.try_wait();
    }
    drop(publishers);
    drop(children);
    for r in readers {
        let _ = r.join();
    }
    for path in &files {
        let _ = std::fs::remove_file(path);
    }
    let mut delivered = 0;
    let mut duplicates = 0;
    for g in &got {
        for (line, k) in g {
            if line != "ready" && is_due(line, pubs, n) {
                delivered += 1;
                duplicates += k - 1;
            }
        }
    }
    Ok(Fan { due: pubs * n * subs, delivered, duplicates, wall })
}

/// True for a line `p<i>-<s>` that publisher `i < pubs` sent (`s < n`).
fn is_due(line: &str, pubs: usize, n: usize) -> bool {
    let Some((i, s)) = line.strip_prefix('p').and_then(|r| r.split_once('-')) else { return false };
    matches!((i.parse::<usize>(), s.parse::<usize>()), (Ok(i), Ok(s)) if i < pubs && s < n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fan_lines_due_are_the_publishers_own() {
        assert!(is_due("p0-0", 1, 1));
        assert!(is_due("p7-4999", 8, 5000));
        assert!(!is_due("p8-0", 8, 5000));
        assert!(!is_due("p0-5000", 8, 5000));
        assert!(!is_due("ready", 8, 5000));
    }
}
