//! Following a job's `events.log` (CORE 8.2's second source): complete lines appended since the last
//! poll, read from the start of the file on the first poll, or from its last `START_WINDOW` bytes
//! when it is larger (issue 12 item 8: the current attempt's lines are at the end, and a huge log
//! must not hold the watch up).
//!
//! It only reads: no lock is taken (appends are single `write(2)` calls, A20, so a line is either
//! whole or not yet there; an unterminated tail is kept until its newline arrives). One poll reads
//! at most `POLL_BYTES`; `more` says there is more to read, so the caller can poll again at once
//! after checking its deadlines. A line longer than `joblog::MAX_LINE` is skipped whole. It never
//! judges a line; the caller filters by attempt and token and hands the rest to the `Acceptor`.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::joblog::MAX_LINE;

/// How far before the end of an existing log the first poll starts.
pub const START_WINDOW: u64 = 8 * 1024 * 1024;
/// The most one poll reads.
pub const POLL_BYTES: u64 = 1024 * 1024;

/// The read position in one events.log.
#[derive(Debug)]
pub struct Tail {
    path: PathBuf,
    /// `None` until the first poll chose where to start.
    offset: Option<u64>,
    partial: Vec<u8>,
    /// The bytes up to the next newline belong to a line that is cut or too long: skip them.
    skipping: bool,
    more: bool,
}

impl Tail {
    pub fn new(path: &Path) -> Tail {
        Tail { path: path.to_path_buf(), offset: None, partial: Vec::new(), skipping: false, more: false }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True when the last poll stopped at `POLL_BYTES` with more of the file unread.
    pub fn more(&self) -> bool {
        self.more
    }

    /// The complete lines appended since the last poll (without their newline), from at most
    /// `POLL_BYTES` read. A missing file has no lines; a file that shrank (replaced or truncated) is
    /// read again as a new file.
    pub fn poll(&mut self) -> io::Result<Vec<Vec<u8>>> {
        self.more = false;
        let mut f = match File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let len = f.metadata()?.len();
        if self.offset.is_some_and(|o| len < o) {
            self.offset = None;
            self.partial.clear();
            self.skipping = false;
        }
        let offset = match self.offset {
            Some(o) => o,
            None if len > START_WINDOW => {
                // Start one byte early: if that byte is a newline, the first line is whole.
                self.skipping = true;
                len - START_WINDOW - 1
            }
            None => 0,
        };
        self.offset = Some(offset);
        if len == offset {
            return Ok(Vec::new());
        }
        f.seek(SeekFrom::Start(offset))?;
        let want = (len - offset).min(POLL_BYTES);
        let mut buf = Vec::with_capacity(want as usize);
        f.take(want).read_to_end(&mut buf)?;
        self.offset = Some(offset + buf.len() as u64);
        self.more = offset + (buf.len() as u64) < len;
        let mut lines = Vec::new();
        let mut rest = &buf[..];
        while let Some(i) = rest.iter().position(|&b| b == b'\n') {
            if std::mem::take(&mut self.skipping) {
                self.partial.clear();
            } else {
                let mut line = std::mem::take(&mut self.partial);
                line.extend_from_slice(&rest[..i]);
                if !line.is_empty() && line.len() <= MAX_LINE {
                    lines.push(line);
                }
            }
            rest = &rest[i + 1..];
        }
        if !self.skipping {
            self.partial.extend_from_slice(rest);
            if self.partial.len() > MAX_LINE {
                self.partial = Vec::new();
                self.skipping = true;
            }
        }
        Ok(lines)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn reads_complete_lines_incrementally_and_restarts_after_truncation() {
        let dir = std::env::temp_dir().join(format!("mam-tail-{}", crate::sys::random_hex(6).unwrap()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("events.log");
        let mut t = Tail::new(&p);
        assert!(t.poll().unwrap().is_empty(), "a missing file has no lines");
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&p).unwrap();
        f.write_all(b"one\ntw").unwrap();
        assert_eq!(t.poll().unwrap(), vec![b"one".to_vec()]);
        f.write_all(b"o\n\nthree\n").unwrap();
        assert_eq!(t.poll().unwrap(), vec![b"two".to_vec(), b"three".to_vec()]);
        assert!(t.poll().unwrap().is_empty());
        std::fs::write(&p, b"new\n").unwrap();
        assert_eq!(t.poll().unwrap(), vec![b"new".to_vec()]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_huge_log_is_read_from_its_last_window_in_bounded_polls() {
        let dir = std::env::temp_dir().join(format!("mam-tail-{}", crate::sys::random_hex(6).unwrap()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("events.log");
        // A sparse 64 MiB of NULs (one endless line), then two real lines.
        let f = std::fs::OpenOptions::new().create(true).append(true).open(&p).unwrap();
        f.set_len(64 * 1024 * 1024).unwrap();
        let mut f = f;
        f.write_all(b"\nreal one\nreal two\n").unwrap();
        let mut t = Tail::new(&p);
        let mut got = Vec::new();
        let mut polls = 0;
        loop {
            got.extend(t.poll().unwrap());
            polls += 1;
            if !t.more() {
                break;
            }
        }
        assert_eq!(got, vec![b"real one".to_vec(), b"real two".to_vec()]);
        assert_eq!(polls, (START_WINDOW + 1).div_ceil(POLL_BYTES) as usize, "the window read in POLL_BYTES pieces");
        // A line longer than MAX_LINE that arrives later is skipped, the next one kept.
        f.write_all(&vec![b'x'; MAX_LINE + 10]).unwrap();
        f.write_all(b"\nafter\n").unwrap();
        let mut got = Vec::new();
        loop {
            got.extend(t.poll().unwrap());
            if !t.more() {
                break;
            }
        }
        assert_eq!(got, vec![b"after".to_vec()]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
