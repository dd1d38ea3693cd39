//! The four ledgers of an installed target (ORCH 7.2, A28, A50): `.mam/install/asset_hashes.txt`,
//! `version.txt`, `install_state`, `manifest.txt`. Their formats, the path rule every entry must
//! pass (target-relative, no `..`, no absolute path: a ledger naming a path outside the target is
//! refused, never acted on), the `install_state` merge of 7.4 step 3 and the stamp format. Pure.

use sha2::{Digest, Sha256};

pub const DIR: &str = ".mam/install";
pub const HASHES: &str = ".mam/install/asset_hashes.txt";
pub const VERSION: &str = ".mam/install/version.txt";
pub const STATE: &str = ".mam/install/install_state";
pub const MANIFEST: &str = ".mam/install/manifest.txt";
/// The four, in the order remove deletes them: the manifest last, since it is what "installed"
/// means (A50) and so what lets an interrupted remove run again.
pub const ALL: [&str; 4] = [HASHES, VERSION, STATE, MANIFEST];

pub fn sha256_hex(bytes: &[u8]) -> String {
    crate::sys::hex(&Sha256::digest(bytes))
}

/// Why a ledger line is not usable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadEntry {
    pub ledger: &'static str,
    pub line: usize,
    pub reason: String,
}

/// A target-relative path a ledger may name: non-empty, relative, no `.`/`..`/empty component, no
/// control character, not a ledger itself, and never `.git` or `.gitignore`.
pub fn check_path(p: &str) -> Result<(), String> {
    let body = p.strip_suffix('/').unwrap_or(p);
    if body.is_empty() {
        return Err("empty path".into());
    }
    if p.starts_with('/') {
        return Err(format!("'{}' is absolute: outside the target", crate::text::one_line(p)));
    }
    if p.chars().any(|c| c.is_control()) {
        return Err("a control character in the path".into());
    }
    for c in body.split('/') {
        match c {
            "" | "." => return Err(format!("'{}' is not a plain relative path", crate::text::one_line(p))),
            ".." => return Err(format!("'{}' climbs out of the target", crate::text::one_line(p))),
            _ => {}
        }
    }
    if body == ".git" || body.starts_with(".git/") || body == ".gitignore" {
        return Err(format!("'{}' is never a ledger entry", crate::text::one_line(p)));
    }
    if ALL.contains(&body) {
        return Err(format!("'{}' is a ledger; the ledgers never list themselves", crate::text::one_line(p)));
    }
    Ok(())
}

/// `manifest.txt`: one path per line, directories end in `/`.
pub fn parse_manifest(text: &str) -> Result<Vec<String>, BadEntry> {
    let mut out = Vec::new();
    for (i, l) in text.lines().enumerate() {
        if l.is_empty() {
            continue;
        }
        check_path(l).map_err(|reason| BadEntry { ledger: MANIFEST, line: i + 1, reason })?;
        out.push(l.to_string());
    }
    Ok(out)
}

/// `asset_hashes.txt`: `<sha256>  <path>` lines.
pub fn parse_hashes(text: &str) -> Result<Vec<(String, String)>, BadEntry> {
    let mut out = Vec::new();
    for (i, l) in text.lines().enumerate() {
        if l.is_empty() {
            continue;
        }
        let bad = |reason: String| BadEntry { ledger: HASHES, line: i + 1, reason };
        let (h, p) = l.split_once("  ").ok_or_else(|| bad("expected '<sha256>  <path>'".into()))?;
        if h.len() != 64 || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad("not a sha256".into()));
        }
        check_path(p).map_err(bad)?;
        out.push((h.to_ascii_lowercase(), p.to_string()));
    }
    Ok(out)
}

/// Sorted lines, each ending in `\n`.
pub fn render_lines(mut lines: Vec<String>) -> Vec<u8> {
    crate::sort::natural(&mut lines);
    lines.dedup();
    let mut out = String::new();
    for l in lines {
        out.push_str(&l);
        out.push('\n');
    }
    out.into_bytes()
}

pub fn render_hashes(entries: &[(String, String)]) -> Vec<u8> {
    let mut v: Vec<&(String, String)> = entries.iter().collect();
    crate::sort::by(&mut v, |a, b| a.1.cmp(&b.1));
    let mut out = String::new();
    for (h, p) in v {
        out.push_str(&format!("{h}  {p}\n"));
    }
    out.into_bytes()
}

/// The value of `key` in `install_state` (the first `key=` line).
pub fn state_value<'a>(state: &'a str, key: &str) -> Option<&'a str> {
    state.lines().find_map(|l| l.split_once('=').filter(|(k, _)| *k == key).map(|(_, v)| v))
}

/// ORCH 7.4 step 3: every old line holding `=` whose key (the bytes before the first `=`, compared
/// exactly, no pattern) the fresh file lacks is appended; lines without `=` are skipped; a
/// non-empty fresh file without a final newline gets one first.
pub fn merge_state(fresh: &[u8], old: &[u8]) -> Vec<u8> {
    let key = |l: &[u8]| l.iter().position(|b| *b == b'=').map(|i| l[..i].to_vec());
    let have: Vec<Vec<u8>> = fresh.split(|b| *b == b'\n').filter_map(key).collect();
    let mut out = fresh.to_vec();
    let mut added: Vec<Vec<u8>> = Vec::new();
    for l in old.split(|b| *b == b'\n') {
        let Some(k) = key(l) else { continue };
        if have.contains(&k) || added.contains(&k) {
            continue;
        }
        if !out.is_empty() && !out.ends_with(b"\n") {
            out.push(b'\n');
        }
        out.extend_from_slice(l);
        out.push(b'\n');
        added.push(k);
    }
    out
}

/// `YYYYMMDDTHHMMSSZ` (A50) from a `YYYY-MM-DDTHH:MM:SS.mmmZ` timestamp.
pub fn stamp(ts: &str) -> String {
    let digits: String = ts.chars().take(19).filter(|c| c.is_ascii_digit() || *c == 'T').collect();
    format!("{digits}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_outside_the_target_are_refused() {
        for bad in ["/etc/passwd", "../x", "a/../../b", "a//b", "./a", "", ".git/config", ".gitignore", MANIFEST] {
            assert!(check_path(bad).is_err(), "{bad}");
        }
        for good in [".mam/bin/mam", ".agents/skills/", "a b/c"] {
            assert!(check_path(good).is_ok(), "{good}");
        }
        let e = parse_manifest(".mam/bin/mam\n../../etc/x\n").unwrap_err();
        assert_eq!(e.line, 2);
    }

    #[test]
    fn t4_install_state_merge_is_literal() {
        // A regex-looking key is matched literally: `a.c` is not `abc`.
        let fresh = b"version=2\nabc=1";
        let old = b"version=1\na.c=9\nno equals here\ngitignore_created=1\nabc=7\n";
        let m = merge_state(fresh, old);
        assert_eq!(String::from_utf8(m).unwrap(), "version=2\nabc=1\na.c=9\ngitignore_created=1\n");
        assert_eq!(merge_state(b"", b"k=v"), b"k=v\n");
    }

    #[test]
    fn stamp_format() {
        assert_eq!(stamp("2026-01-02T03:04:05.678Z"), "20260102T030405Z");
    }
}
