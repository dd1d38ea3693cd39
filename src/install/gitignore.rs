//! The managed `.gitignore` block (ORCH 7.3, A52): its exact text, recognising the legacy marker
//! pair, unterminated and duplicate blocks, CRLF files and a missing final newline. Pure: bytes in,
//! bytes and warnings out.

pub const START: &str = "# >>> mam managed >>>";
pub const END: &str = "# <<< mam managed <<<";
/// `/.venv` without a slash ignores a `.venv` directory, symlink or file (later fix wins over
/// `/.venv/`); `/.mam.env` holds secrets.
pub const BODY: &[&str] = &["/.venv", "/.mam/", "/.mam.env"];

fn names_us(mid: &str) -> bool {
    mid.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
        .any(|w| w.eq_ignore_ascii_case("mam") || w.eq_ignore_ascii_case("multi-agent-mux"))
}

/// `# >>> ... >>>` naming mam or multi-agent-mux (ours or the legacy installer's).
fn is_start(line: &str) -> bool {
    let l = line.trim();
    l.len() >= 10 && l.starts_with("# >>>") && l.ends_with(">>>") && names_us(&l[5..l.len() - 3])
}

fn is_end(line: &str) -> bool {
    let l = line.trim();
    l.len() >= 10 && l.starts_with("# <<<") && l.ends_with("<<<") && names_us(&l[5..l.len() - 3])
}

/// The file's lines with their endings, and whether it uses CRLF.
fn lines(text: &[u8]) -> (Vec<&[u8]>, bool) {
    let crlf = text.windows(2).any(|w| w == b"\r\n");
    (text.split_inclusive(|b| *b == b'\n').collect(), crlf)
}

fn bare(line: &[u8]) -> String {
    let mut l = line;
    while let [rest @ .., b'\n' | b'\r'] = l {
        l = rest;
    }
    String::from_utf8_lossy(l).into_owned()
}

/// The complete blocks (start index, end index inclusive) and the lines of unterminated starts.
fn blocks(ls: &[&[u8]]) -> (Vec<(usize, usize)>, Vec<usize>) {
    let mut found = Vec::new();
    let mut open = Vec::new();
    let mut start: Option<usize> = None;
    for (i, l) in ls.iter().enumerate() {
        let b = bare(l);
        if is_start(&b) {
            if let Some(s) = start {
                open.push(s); // a second start before an end: the first never ended
            }
            start = Some(i);
        } else if is_end(&b) {
            if let Some(s) = start.take() {
                found.push((s, i));
            }
        }
    }
    open.extend(start);
    (found, open)
}

/// The block's text in the file's line ending.
pub fn block(crlf: bool) -> Vec<u8> {
    let nl = if crlf { "\r\n" } else { "\n" };
    let mut out = String::new();
    for l in std::iter::once(START).chain(BODY.iter().copied()).chain(std::iter::once(END)) {
        out.push_str(l);
        out.push_str(nl);
    }
    out.into_bytes()
}

/// The file after install/update: the first block rewritten as a whole, later ones dropped, lines
/// outside kept byte for byte; no block: appended (after a line ending when the file lacks a final
/// one). `old` is `None` when there is no `.gitignore`.
pub fn with_block(old: Option<&[u8]>) -> (Vec<u8>, Vec<String>) {
    let old = old.unwrap_or(b"");
    let (ls, crlf) = lines(old);
    let (found, open) = blocks(&ls);
    let warnings: Vec<String> = open
        .iter()
        .map(|i| format!(".gitignore line {}: a managed-block start without an end; left as it is", i + 1))
        .collect();
    let mut out = Vec::with_capacity(old.len() + 64);
    if found.is_empty() {
        out.extend_from_slice(old);
        if !out.is_empty() && !out.ends_with(b"\n") {
            out.extend_from_slice(if crlf { b"\r\n" } else { b"\n" });
        }
        out.extend_from_slice(&block(crlf));
        return (out, warnings);
    }
    let mut i = 0;
    for (n, (s, e)) in found.iter().enumerate() {
        for l in &ls[i..*s] {
            out.extend_from_slice(l);
        }
        if n == 0 {
            if !out.is_empty() && !out.ends_with(b"\n") {
                out.extend_from_slice(if crlf { b"\r\n" } else { b"\n" });
            }
            out.extend_from_slice(&block(crlf));
        }
        i = e + 1;
    }
    for l in &ls[i..] {
        out.extend_from_slice(l);
    }
    (out, warnings)
}

/// The file after remove: every complete block dropped, the rest byte for byte.
pub fn without_block(old: &[u8]) -> Vec<u8> {
    let (ls, _) = lines(old);
    let (found, _) = blocks(&ls);
    let mut out = Vec::with_capacity(old.len());
    for (i, l) in ls.iter().enumerate() {
        if !found.iter().any(|(s, e)| (*s..=*e).contains(&i)) {
            out.extend_from_slice(l);
        }
    }
    out
}

/// Nothing but whitespace.
pub fn is_blank(text: &[u8]) -> bool {
    text.iter().all(|b| b.is_ascii_whitespace())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(b: &[u8]) -> &str {
        std::str::from_utf8(b).unwrap()
    }

    #[test]
    fn a_missing_file_gets_the_block() {
        let (t, w) = with_block(None);
        assert_eq!(s(&t), "# >>> mam managed >>>\n/.venv\n/.mam/\n/.mam.env\n# <<< mam managed <<<\n");
        assert!(w.is_empty());
    }

    #[test]
    fn no_final_newline_is_terminated_before_the_block() {
        let (t, _) = with_block(Some(b"target"));
        assert!(s(&t).starts_with("target\n# >>> mam managed >>>\n"), "{}", s(&t));
    }

    #[test]
    fn the_legacy_block_is_replaced_and_user_lines_stay() {
        let old = b"a\n# >>> multi-agent-mux managed >>>\n/.venv/\n/.mam/\n# <<< multi-agent-mux managed <<<\nb\n";
        let (t, _) = with_block(Some(old));
        assert_eq!(s(&t), format!("a\n{}b\n", s(&block(false))));
    }

    #[test]
    fn duplicates_are_dropped_and_crlf_is_kept() {
        let old = b"x\r\n# >>> mam managed >>>\r\nold\r\n# <<< mam managed <<<\r\ny\r\n# >>> mam managed >>>\r\n# <<< mam managed <<<\r\n";
        let (t, _) = with_block(Some(old));
        assert_eq!(s(&t), format!("x\r\n{}y\r\n", s(&block(true))));
        assert_eq!(s(&without_block(&t)), "x\r\ny\r\n");
    }

    #[test]
    fn an_unterminated_start_is_left_and_warned_about() {
        let old = b"# >>> mam managed >>>\nkeep\n";
        let (t, w) = with_block(Some(old));
        assert_eq!(s(&t), format!("# >>> mam managed >>>\nkeep\n{}", s(&block(false))));
        assert_eq!(w.len(), 1);
        assert!(!is_start("# >>> conda initialize >>>"));
    }
}
