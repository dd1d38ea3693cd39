//! Keys from a raw-mode terminal (issue 22): bytes to `Key`s, with the escape sequences xterm,
//! tmux and the Linux console send for the arrows, Home/End and PgUp/PgDn (CSI and SS3 forms). A
//! lone ESC at the end of a read is the Escape key. Pure.

/// One key press.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    Char(char),
    Enter,
    Esc,
    Backspace,
    Up,
    Down,
    PageUp,
    PageDown,
    Home,
    End,
    Tab,
    /// Ctrl-C (raw mode turns it into a byte).
    Interrupt,
    /// Anything else (an unknown sequence, another control byte).
    Other,
}

/// The keys in `bytes` (one read's worth). Incomplete UTF-8 at the end is dropped.
pub fn decode(bytes: &[u8]) -> Vec<Key> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        i += 1;
        let key = match b {
            0x1b => {
                if i >= bytes.len() {
                    Key::Esc
                } else if bytes[i] == b'[' || bytes[i] == b'O' {
                    let ss3 = bytes[i] == b'O';
                    i += 1;
                    let start = i;
                    while i < bytes.len() && !(0x40..=0x7e).contains(&bytes[i]) {
                        i += 1;
                    }
                    if i >= bytes.len() {
                        out.push(Key::Other);
                        break;
                    }
                    let fin = bytes[i];
                    let params = &bytes[start..i];
                    i += 1;
                    match (fin, params, ss3) {
                        (b'A', _, _) => Key::Up,
                        (b'B', _, _) => Key::Down,
                        (b'H', _, _) => Key::Home,
                        (b'F', _, _) => Key::End,
                        (b'M', _, true) => Key::Enter, // keypad Enter
                        (b'~', b"1" | b"7", false) => Key::Home,
                        (b'~', b"4" | b"8", false) => Key::End,
                        (b'~', b"5", false) => Key::PageUp,
                        (b'~', b"6", false) => Key::PageDown,
                        _ => Key::Other,
                    }
                } else {
                    Key::Esc // ESC then a key: take the ESC, read the key on the next turn
                }
            }
            b'\r' | b'\n' => Key::Enter,
            0x7f | 0x08 => Key::Backspace,
            b'\t' => Key::Tab,
            0x03 => Key::Interrupt,
            0x00..=0x1f => Key::Other,
            _ => {
                let len = match b {
                    0xc0..=0xdf => 2,
                    0xe0..=0xef => 3,
                    0xf0..=0xf7 => 4,
                    0x80..=0xff => 1,
                    _ => 1,
                };
                let end = (i - 1 + len).min(bytes.len());
                let k = std::str::from_utf8(&bytes[i - 1..end]).ok().and_then(|s| s.chars().next());
                i = end;
                match k {
                    Some(c) if !c.is_control() => Key::Char(c),
                    _ => Key::Other,
                }
            }
        };
        out.push(key);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences() {
        assert_eq!(decode(b"jk\r"), [Key::Char('j'), Key::Char('k'), Key::Enter]);
        assert_eq!(decode(b"\x1b[A\x1b[B\x1bOA"), [Key::Up, Key::Down, Key::Up]);
        assert_eq!(decode(b"\x1b[5~\x1b[6~\x1b[H\x1b[4~"), [Key::PageUp, Key::PageDown, Key::Home, Key::End]);
        assert_eq!(decode(b"\x1b"), [Key::Esc]);
        assert_eq!(decode(b"\x1bq"), [Key::Esc, Key::Char('q')]);
        assert_eq!(decode(b"\x03\x7f"), [Key::Interrupt, Key::Backspace]);
        assert_eq!(decode("é/".as_bytes()), [Key::Char('é'), Key::Char('/')]);
        assert_eq!(decode(b"\x1b[1;5A"), [Key::Up]);
    }
}
