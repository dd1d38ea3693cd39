//! Text for people and shells: one-line display of untrusted strings and paths, and POSIX quoting.
//!
//! Pure functions over strings and bytes; nothing here reads the environment, a file or the clock.

use std::path::Path;

/// Text made safe for a one-line diagnostic: control characters become escapes.
pub fn one_line(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// A path for a one-line diagnostic.
pub fn show_path(p: &Path) -> String {
    one_line(&p.to_string_lossy())
}

/// POSIX single quoting: `'` becomes `'\''`. The result is one shell word under bash or sh.
pub fn shell_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        if c == '\'' {
            out.push_str("'\\''");
        } else {
            out.push(c);
        }
    }
    out.push('\'');
    out
}

/// Bytes-exact POSIX single quoting for paths that may not be UTF-8.
pub fn shell_quote_bytes(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(b.len() + 2);
    out.push(b'\'');
    for &c in b {
        if c == b'\'' {
            out.extend_from_slice(b"'\\''");
        } else {
            out.push(c);
        }
    }
    out.push(b'\'');
    out
}

/// `line` without a leading `ERROR: ` (a child's stderr line quoted inside a close reason).
pub fn without_error_prefix(line: &str) -> &str {
    line.strip_prefix("ERROR: ").unwrap_or(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_single_quotes() {
        assert_eq!(shell_quote("a'b"), "'a'\\''b'");
        assert_eq!(shell_quote(""), "''");
    }

    #[test]
    fn one_line_escapes_newlines() {
        assert_eq!(one_line("a\nb\0"), "a\\nb\\u{0}");
    }
}
