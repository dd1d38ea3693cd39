//! The diffed redraw of `mam ui` (issue 22): the terminal is told only about the lines that differ
//! from the last frame (cursor to the line, the line); a new size, or a frame after the terminal
//! was handed to another program, clears and draws everything. Every line is exactly the screen's
//! width (`cells::Line::render`) and autowrap is off, so nothing wraps or is left behind. The frame
//! is bracketed by the synchronized-output mode (terminals that lack it ignore it). Pure: it
//! returns bytes.

use crate::ui::cells::Line;

/// What the terminal shows, as far as the last frame went.
#[derive(Debug, Default)]
pub struct Screen {
    prev: Vec<String>,
    size: (usize, usize),
    stale: bool,
}

impl Screen {
    pub fn new() -> Screen {
        Screen { prev: Vec::new(), size: (0, 0), stale: true }
    }

    /// The next frame draws everything (after a resize, or after another program had the terminal).
    pub fn invalidate(&mut self) {
        self.stale = true;
    }

    /// The bytes that turn the terminal into `lines` at `w` x `h`; empty when nothing changed.
    pub fn frame(&mut self, lines: &[Line], w: usize, h: usize) -> Vec<u8> {
        let rendered: Vec<String> = lines.iter().take(h).map(|l| l.render(w)).collect();
        let mut out = String::new();
        if self.stale || self.size != (w, h) {
            out.push_str("\x1b[0m\x1b[H\x1b[2J");
            self.prev.clear();
        }
        for (i, r) in rendered.iter().enumerate() {
            if self.prev.get(i) != Some(r) {
                out.push_str(&format!("\x1b[{};1H", i + 1));
                out.push_str(r);
            }
        }
        self.prev = rendered;
        self.size = (w, h);
        self.stale = false;
        if out.is_empty() {
            return Vec::new();
        }
        format!("\x1b[?2026h{out}\x1b[?2026l").into_bytes()
    }

    /// The last frame's lines as rendered (with their escape sequences).
    pub fn lines(&self) -> &[String] {
        &self.prev
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_changed_lines_are_sent() {
        let mut s = Screen::new();
        let a = [Line::plain("one"), Line::plain("two"), Line::plain("three")];
        let first = String::from_utf8(s.frame(&a, 10, 3)).unwrap();
        assert!(first.contains("\x1b[2J") && first.contains("\x1b[1;1H") && first.contains("\x1b[3;1H"));
        assert!(s.frame(&a, 10, 3).is_empty(), "nothing changed, nothing sent");
        let b = [Line::plain("one"), Line::plain("TWO"), Line::plain("three")];
        let second = String::from_utf8(s.frame(&b, 10, 3)).unwrap();
        assert!(second.contains("\x1b[2;1H") && second.contains("TWO"));
        assert!(!second.contains("\x1b[1;1H") && !second.contains("\x1b[3;1H") && !second.contains("\x1b[2J"));
        let resized = String::from_utf8(s.frame(&b, 12, 3)).unwrap();
        assert!(resized.contains("\x1b[2J") && resized.contains("\x1b[1;1H"), "a new size redraws all");
        s.invalidate();
        assert!(String::from_utf8(s.frame(&b, 12, 3)).unwrap().contains("\x1b[2J"));
    }
}
