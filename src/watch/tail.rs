//! Following a job's `events.log` (CORE 8.2's second source): complete lines appended since the last
//! poll, read from the start of the file on the first poll.
//!
//! It only reads: no lock is taken (appends are single `write(2)` calls, A20, so a line is either
//! whole or not yet there; an unterminated tail is kept until its newline arrives). It never judges a
//! line; the caller filters by attempt and token and hands the rest to the `Acceptor`.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Longest line kept while waiting for its newline; a longer one is dropped (no mam line comes close).
const MAX_LINE: usize = 4 * 1024 * 1024;

/// The read position in one events.log.
#[derive(Debug)]
pub struct Tail {
    path: PathBuf,
    offset: u64,
    partial: Vec<u8>,
}

impl Tail {
    pub fn new(path: &Path) -> Tail {
        Tail { path: path.to_path_buf(), offset: 0, partial: Vec::new() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The complete lines appended since the last poll (without their newline). A missing file has
    /// no lines; a file that shrank (replaced or truncated) is read again from its start.
    pub fn poll(&mut self) -> io::Result<Vec<Vec<u8>>> {
        let mut f = match File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let len = f.metadata()?.len();
        if len < self.offset {
            self.offset = 0;
            self.partial.clear();
        }
        if len == self.offset {
            return Ok(Vec::new());
        }
        f.seek(SeekFrom::Start(self.offset))?;
        let mut buf = Vec::new();
        f.take(len - self.offset).read_to_end(&mut buf)?;
        self.offset += buf.len() as u64;
        let mut lines = Vec::new();
        let mut rest = &buf[..];
        while let Some(i) = rest.iter().position(|&b| b == b'\n') {
            let mut line = std::mem::take(&mut self.partial);
            line.extend_from_slice(&rest[..i]);
            if !line.is_empty() {
                lines.push(line);
            }
            rest = &rest[i + 1..];
        }
        self.partial.extend_from_slice(rest);
        if self.partial.len() > MAX_LINE {
            self.partial.clear();
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
}
