//! Screen cells for `mam ui` (issue 22): the display width of a character (wide East Asian and
//! emoji take two cells, combining marks none, controls are shown as `?`), styled spans, and a line
//! cut or padded to exactly the screen's width, so a redraw never wraps and never leaves old cells.
//!
//! Pure: no terminal, no I/O.

/// Cells one character takes on a terminal.
pub fn char_width(c: char) -> usize {
    let u = c as u32;
    if (0x20..0x7f).contains(&u) {
        return 1; // printable ASCII: nearly every cell
    }
    if u < 0x20 || (0x7f..0xa0).contains(&u) {
        return 1; // shown as `?`
    }
    if (0x0300..=0x036f).contains(&u)
        || (0x200b..=0x200f).contains(&u)
        || (0xfe00..=0xfe0f).contains(&u)
        || (0x1ab0..=0x1aff).contains(&u)
        || (0x20d0..=0x20ff).contains(&u)
    {
        return 0;
    }
    let wide = (0x1100..=0x115f).contains(&u)
        || (0x2e80..=0x303e).contains(&u)
        || (0x3041..=0x33ff).contains(&u)
        || (0x3400..=0x4dbf).contains(&u)
        || (0x4e00..=0x9fff).contains(&u)
        || (0xa000..=0xa4cf).contains(&u)
        || (0xac00..=0xd7a3).contains(&u)
        || (0xf900..=0xfaff).contains(&u)
        || (0xfe30..=0xfe4f).contains(&u)
        || (0xff00..=0xff60).contains(&u)
        || (0xffe0..=0xffe6).contains(&u)
        || (0x1f300..=0x1f64f).contains(&u)
        || (0x1f900..=0x1f9ff).contains(&u)
        || (0x20000..=0x3fffd).contains(&u);
    if wide {
        2
    } else {
        1
    }
}

/// The character as it is drawn: a control character (or an escape) is `?`, so untrusted text can
/// never move the cursor or change the terminal.
fn shown(c: char) -> char {
    let u = c as u32;
    if u < 0x20 || (0x7f..0xa0).contains(&u) {
        '?'
    } else {
        c
    }
}

/// Display width of `s`.
pub fn width(s: &str) -> usize {
    if s.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return s.len();
    }
    s.chars().map(char_width).sum()
}

/// `s` cut to at most `w` cells; a cut ends in `~`. Controls become `?`.
pub fn clip(s: &str, w: usize) -> String {
    if width(s) <= w {
        return s.chars().map(shown).collect();
    }
    if w == 0 {
        return String::new();
    }
    let mut out = String::new();
    let mut used = 0;
    for c in s.chars() {
        let cw = char_width(c);
        if used + cw > w - 1 {
            break;
        }
        out.push(shown(c));
        used += cw;
    }
    out.push('~');
    out
}

/// `s` cut or padded with spaces to exactly `w` cells.
pub fn fit(s: &str, w: usize) -> String {
    let mut out = clip(s, w);
    let n = width(&out);
    out.extend(std::iter::repeat_n(' ', w.saturating_sub(n)));
    out
}

/// `s` cut from the left to at most `w` cells (for paths: the end is what tells them apart).
pub fn clip_left(s: &str, w: usize) -> String {
    if width(s) <= w {
        return s.chars().map(shown).collect();
    }
    if w == 0 {
        return String::new();
    }
    let mut kept: Vec<char> = Vec::new();
    let mut used = 0;
    for c in s.chars().rev() {
        let cw = char_width(c);
        if used + cw > w - 1 {
            break;
        }
        kept.push(shown(c));
        used += cw;
    }
    let mut out = String::from("~");
    out.extend(kept.into_iter().rev());
    out
}

/// How a span is drawn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Style {
    pub bold: bool,
    pub dim: bool,
    pub reverse: bool,
    /// An SGR foreground colour (31 red, 32 green, 33 yellow, 36 cyan).
    pub fg: Option<u8>,
}

impl Style {
    pub const PLAIN: Style = Style { bold: false, dim: false, reverse: false, fg: None };
    pub const BOLD: Style = Style { bold: true, dim: false, reverse: false, fg: None };
    pub const DIM: Style = Style { bold: false, dim: true, reverse: false, fg: None };

    pub fn fg(c: u8) -> Style {
        Style { fg: Some(c), ..Style::PLAIN }
    }

    /// Appends the SGR sequence of this style (attributes reset first).
    fn write_sgr(self, out: &mut String) {
        out.push_str("\x1b[0");
        if self.bold {
            out.push_str(";1");
        }
        if self.dim {
            out.push_str(";2");
        }
        if self.reverse {
            out.push_str(";7");
        }
        if let Some(c) = self.fg {
            out.push(';');
            out.push(char::from(b'0' + c / 10 % 10));
            out.push(char::from(b'0' + c % 10));
        }
        out.push('m');
    }
}

/// Appends `s` as drawn (controls as `?`).
fn push_shown(out: &mut String, s: &str) {
    if s.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        out.push_str(s);
    } else {
        out.extend(s.chars().map(shown));
    }
}

/// A line of styled spans.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Line {
    pub spans: Vec<(Style, String)>,
    /// Drawn over the whole width in reverse (the selection).
    pub reverse: bool,
}

impl Line {
    pub fn plain(s: impl Into<String>) -> Line {
        Line { spans: vec![(Style::PLAIN, s.into())], reverse: false }
    }

    pub fn styled(style: Style, s: impl Into<String>) -> Line {
        Line { spans: vec![(style, s.into())], reverse: false }
    }

    pub fn push(&mut self, style: Style, s: impl Into<String>) -> &mut Line {
        self.spans.push((style, s.into()));
        self
    }

    /// The text without styles.
    pub fn text(&self) -> String {
        self.spans.iter().map(|(_, s)| s.as_str()).collect()
    }

    /// Exactly `w` cells: the spans cut where the width runs out, the rest padded with spaces,
    /// each span in its style, ending with the attributes reset.
    pub fn render(&self, w: usize) -> String {
        let mut out = String::with_capacity(w + 16 * self.spans.len() + 16);
        let mut used = 0;
        let total: usize = self.spans.iter().map(|(_, s)| width(s)).sum();
        let cut = total > w;
        for (style, s) in &self.spans {
            if used >= w {
                break;
            }
            let room = w - used;
            let sw = width(s);
            let st = Style { reverse: style.reverse || self.reverse, ..*style };
            st.write_sgr(&mut out);
            if sw < room || (sw == room && !cut) {
                push_shown(&mut out, s);
                used += sw;
            } else {
                // The span that reaches the edge: the whole line's cut marker goes here.
                let piece = clip(&format!("{s}\u{0}"), room);
                used += width(&piece);
                out.push_str(&piece);
            }
        }
        if used < w {
            Style { reverse: self.reverse, ..Style::PLAIN }.write_sgr(&mut out);
            out.extend(std::iter::repeat_n(' ', w - used));
        }
        out.push_str("\x1b[0m");
        out
    }
}

/// `render`'s text with the escape sequences taken out (what a terminal shows).
pub fn strip(rendered: &str) -> String {
    let mut out = String::new();
    let mut it = rendered.chars().peekable();
    while let Some(c) = it.next() {
        if c == '\x1b' {
            if it.peek() == Some(&'[') {
                it.next();
                for d in it.by_ref() {
                    if d.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widths_and_cuts() {
        assert_eq!(width("abc"), 3);
        assert_eq!(width("日本"), 4);
        assert_eq!(width("e\u{301}"), 1);
        assert_eq!(clip("abcdef", 4), "abc~");
        assert_eq!(clip("abc", 4), "abc");
        assert_eq!(clip("日本語", 4), "日~");
        assert_eq!(fit("ab", 4), "ab  ");
        assert_eq!(fit("a\x1b[2Jb", 6), "a?[2Jb", "an escape cannot reach the terminal");
        assert_eq!(clip_left("/very/long/path/jobs", 10), "~path/jobs");
    }

    #[test]
    fn a_line_is_exactly_the_width() {
        let mut l = Line::plain("ab");
        l.push(Style::fg(31), "cdef");
        let r = l.render(4);
        assert_eq!(strip(&r), "abc~");
        assert_eq!(strip(&l.render(8)), "abcdef  ");
        assert!(r.ends_with("\x1b[0m"));
        let sel = Line { reverse: true, ..Line::plain("x") };
        assert!(sel.render(3).contains(";7m"));
        assert_eq!(strip(&Line::plain("日本語").render(5)), "日本~");
    }
}
