//! The terminal while `mam ui` runs (issue 22): raw mode (termios through `sys`), the alternate
//! screen, the cursor hidden and autowrap off; and the way back on every exit path: `Drop` (q,
//! Ctrl-C, SIGTERM, SIGHUP: the loop returns and the guard drops) and a panic hook that restores
//! the saved mode before the panic message prints (release builds abort on panic, so no `Drop`
//! runs there). `suspend`/`resume` hand the terminal to another program (an attach) and take it
//! back.
//!
//! It writes only the terminal's own control sequences, straight to the descriptor.

use std::io;
use std::os::fd::RawFd;
use std::sync::{Mutex, Once};

use crate::sys::{self, TermMode};

/// Alternate screen, cursor hidden, autowrap off, screen cleared.
const ENTER: &[u8] = b"\x1b[?1049h\x1b[?25l\x1b[?7l\x1b[0m\x1b[H\x1b[2J";
/// Attributes reset, autowrap on, cursor shown, main screen back.
const LEAVE: &[u8] = b"\x1b[0m\x1b[?7h\x1b[?25h\x1b[?1049l";

/// The mode to restore on a panic: (input fd, output fd, mode).
static SAVED: Mutex<Option<(RawFd, RawFd, TermMode)>> = Mutex::new(None);
static HOOK: Once = Once::new();

fn restore_saved() {
    // try_lock: a panic while the lock is held must not deadlock in its own hook.
    if let Ok(mut g) = SAVED.try_lock() {
        if let Some((fd_in, fd_out, mode)) = g.take() {
            let _ = sys::write_all_fd(fd_out, LEAVE);
            let _ = sys::set_term_mode(fd_in, &mode);
        }
    }
}

/// The terminal in `mam ui`'s mode; restored on drop.
#[derive(Debug)]
pub struct Term {
    fd_in: RawFd,
    fd_out: RawFd,
    saved: TermMode,
    active: bool,
}

impl Term {
    /// Saves the mode of `fd_in`, makes it raw and switches `fd_out` to the alternate screen.
    pub fn enter(fd_in: RawFd, fd_out: RawFd) -> io::Result<Term> {
        let saved = sys::term_mode(fd_in)?;
        HOOK.call_once(|| {
            let prev = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                restore_saved();
                prev(info);
            }));
        });
        let mut t = Term { fd_in, fd_out, saved, active: false };
        t.resume()?;
        Ok(t)
    }

    /// (columns, rows); 80 x 24 when the terminal does not say.
    pub fn size(&self) -> (usize, usize) {
        match sys::window_size(self.fd_out).or_else(|_| sys::window_size(self.fd_in)) {
            Ok((c, r)) if c > 0 && r > 0 => (c as usize, r as usize),
            _ => (80, 24),
        }
    }

    pub fn write(&self, bytes: &[u8]) -> io::Result<()> {
        sys::write_all_fd(self.fd_out, bytes)
    }

    /// Gives the terminal back as it was (before another program uses it).
    pub fn suspend(&mut self) -> io::Result<()> {
        if !self.active {
            return Ok(());
        }
        self.active = false;
        *SAVED.lock().unwrap_or_else(|e| e.into_inner()) = None;
        let w = sys::write_all_fd(self.fd_out, LEAVE);
        sys::set_term_mode(self.fd_in, &self.saved)?;
        w
    }

    /// Takes the terminal again: raw mode, alternate screen (the caller redraws everything).
    pub fn resume(&mut self) -> io::Result<()> {
        if self.active {
            return Ok(());
        }
        *SAVED.lock().unwrap_or_else(|e| e.into_inner()) = Some((self.fd_in, self.fd_out, self.saved));
        sys::set_term_mode(self.fd_in, &self.saved.raw())?;
        self.active = true;
        sys::write_all_fd(self.fd_out, ENTER)
    }
}

impl Drop for Term {
    fn drop(&mut self) {
        let _ = self.suspend();
    }
}
