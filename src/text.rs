//! Text for people and shells: one-line display of untrusted strings and paths, and POSIX quoting.
//!
//! Pure functions over strings and bytes; nothing here reads the environment, a file or the clock.

use std::path::Path;

/// Text made safe for a one-line diagnostic: control characters become escapes.
pub fn one_line(s: &str) -> String {
    // Most text has no control character (C0, DEL, and C1, which UTF-8 starts with 0xC2): one
    // copy then, not a push per char (a listing calls this for cells of 100,000 rows).
    if !s.bytes().any(|b| b < 0x20 || b == 0x7f || b == 0xc2) {
        return s.to_string();
    }
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

/// `one_line` of at most the first 100 characters of an untrusted value, with its length when cut
/// (issue 29: a 100 KB id is named, not echoed).
pub fn one_line_clipped(s: &str) -> String {
    const MAX: usize = 100;
    match s.char_indices().nth(MAX) {
        None => one_line(s),
        Some((i, _)) => format!("{}... ({} bytes)", one_line(&s[..i]), s.len()),
    }
}

/// Untrusted text for another program's display (herdr's sidebar, a tmux pane title and border,
/// issue 29): every control character (ESC of a terminal sequence, a newline, C1) becomes a space,
/// at most `max` characters (cut with `…`), and never a leading `-`, so that passed as the value of
/// a flag it cannot be read as another flag.
pub fn display_value(s: &str, max: usize) -> String {
    let mut out: String = s.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    if out.starts_with('-') {
        out.insert(0, ' ');
    }
    if out.chars().count() > max {
        out = out.chars().take(max.saturating_sub(1)).collect();
        out.push('…');
    }
    out
}

/// A path for a one-line diagnostic.
pub fn show_path(p: &Path) -> String {
    one_line(&p.to_string_lossy())
}

/// `n` and a noun, plural unless `n` is 1 ("1 session", "3 retained messages").
pub fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// The edit distance (insertions, deletions, substitutions) between two short words.
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The candidate closest to `word` when it is close enough to be a slip (at most a third of the
/// word's length, at least 1, edits away), or one that `word` is a prefix of; ties go to the first.
pub fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let limit = (word.chars().count() / 3).max(1);
    let mut best: Option<(usize, &str)> = None;
    for c in candidates {
        let d = if c.len() > word.len() && c.starts_with(word) && word.len() >= 3 { 1 } else { edit_distance(word, c) };
        if d <= limit && best.is_none_or(|(bd, _)| d < bd) {
            best = Some((d, c));
        }
    }
    best.map(|(_, c)| c)
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

/// The last `n` non-blank lines of a terminal screen, trimmed, joined with ` | ` on one line (a
/// CLI's last words before it exited: its error, then the shell prompt it left), or `(blank)`.
pub fn screen_tail(screen: &str, n: usize) -> String {
    let mut lines: Vec<&str> = screen.lines().rev().map(str::trim).filter(|l| !l.is_empty()).take(n).collect();
    if lines.is_empty() {
        return "(blank)".into();
    }
    lines.reverse();
    one_line(&lines.join(" | "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clipped_values_name_their_length() {
        assert_eq!(one_line_clipped("ab\x1b"), "ab\\u{1b}");
        let long = "é".repeat(150);
        assert_eq!(one_line_clipped(&long), format!("{}... (300 bytes)", "é".repeat(100)));
    }

    #[test]
    fn screen_tails() {
        assert_eq!(screen_tail("a\n\n  b  \nc\n\n", 2), "b | c");
        assert_eq!(screen_tail("x\ty", 3), "x\\ty");
        assert_eq!(screen_tail(" \n", 3), "(blank)");
    }

    #[test]
    fn quotes_single_quotes() {
        assert_eq!(shell_quote("a'b"), "'a'\\''b'");
        assert_eq!(shell_quote(""), "''");
    }

    #[test]
    fn closest_suggests_slips_only() {
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        let flags = ["--name", "--workspace", "--onboard", "--no-onboard", "--label"];
        assert_eq!(closest("--nmae", flags), Some("--name"));
        assert_eq!(closest("--work", flags), Some("--workspace"));
        assert_eq!(closest("--label", flags), Some("--label"));
        assert_eq!(closest("--zzzzzzzz", flags), None);
        assert_eq!(closest("stauts", ["status", "stop", "sub"]), Some("status"));
    }

    #[test]
    fn one_line_escapes_newlines() {
        assert_eq!(one_line("a\nb\0"), "a\\nb\\u{0}");
        // DEL and the C1 controls too; other text as it is, non-ASCII included.
        assert_eq!(one_line("x\u{7f}\u{85}\u{9f}y"), "x\\u{7f}\\u{85}\\u{9f}y");
        assert_eq!(one_line("\u{a0}\u{bf}\u{e9}t\u{e9} \u{1f600}"), "\u{a0}\u{bf}\u{e9}t\u{e9} \u{1f600}");
    }
}
