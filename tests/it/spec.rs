//! The spec lives in `docs/spec/`: every `CORE x.y`, `ORCH x.y` and amendment id (`A15`) cited in the
//! sources, tests, shims, scripts and docs must name a section heading of `docs/spec/CORE.md` /
//! `ORCH.md` or an entry of `docs/spec/AMENDMENTS.md`.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// One citation found in a line: the document (`CORE`, `ORCH` or `A` for an amendment) and the id.
#[derive(Debug, PartialEq)]
struct Cite {
    doc: &'static str,
    id: String,
}

fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// `\d+(\.\d+)*` at `i`; returns the end. A trailing `.` that ends a sentence is not taken.
fn number(b: &[u8], mut i: usize) -> Option<usize> {
    let start = i;
    while i < b.len() && b[i].is_ascii_digit() {
        i += 1;
    }
    if i == start {
        return None;
    }
    while i + 1 < b.len() && b[i] == b'.' && b[i + 1].is_ascii_digit() {
        i += 1;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
    }
    Some(i)
}

/// Skips a qualifier after a section number: ` step 5`, ` steps 3 and 5`, ` tests 1-10`, `#4`.
fn qualifier(b: &[u8], i: usize) -> usize {
    if b.get(i) == Some(&b'#') {
        return number(b, i + 1).unwrap_or(i);
    }
    for word in [" steps ", " step ", " tests ", " test ", " items ", " item "] {
        if b[i..].starts_with(word.as_bytes()) {
            let Some(mut j) = number(b, i + word.len()) else { return i };
            for joint in ["-", " and "] {
                if b[j..].starts_with(joint.as_bytes()) {
                    if let Some(k) = number(b, j + joint.len()) {
                        j = k;
                    }
                }
            }
            return j;
        }
    }
    i
}

/// The citations in one line. `CORE`/`ORCH` are followed by a section list such as `6.2, 6.3 step 5, 7.5`
/// or a range `7.3-7.5` (both ends are checked); an amendment is `A<n>` as a word (`A12-A15` gives both
/// ends). A quoted `"A1"` is a string value in a test, not a citation.
fn citations(line: &str) -> Vec<Cite> {
    let b = line.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let boundary = i == 0 || !is_word(b[i - 1]);
        if boundary && (b[i..].starts_with(b"CORE ") || b[i..].starts_with(b"ORCH ")) {
            let doc = if b[i] == b'C' { "CORE" } else { "ORCH" };
            let mut j = i + 5;
            while let Some(end) = number(b, j) {
                out.push(Cite { doc, id: line[j..end].to_string() });
                j = end;
                if b.get(j) == Some(&b'-') {
                    if let Some(end) = number(b, j + 1) {
                        out.push(Cite { doc, id: line[j + 1..end].to_string() });
                        j = end;
                    }
                }
                j = qualifier(b, j);
                if b[j..].starts_with(b", ") && b.get(j + 2).is_some_and(u8::is_ascii_digit) {
                    j += 2;
                } else {
                    break;
                }
            }
            i = j.max(i + 1);
            continue;
        }
        if boundary && b[i] == b'A' && b.get(i + 1).is_some_and(u8::is_ascii_digit) {
            let mut j = i + 1;
            while j < b.len() && b[j].is_ascii_digit() {
                j += 1;
            }
            let word_ends = j == b.len() || !is_word(b[j]);
            let quoted = i > 0 && b[i - 1] == b'"' && b.get(j) == Some(&b'"');
            if word_ends && !quoted {
                out.push(Cite { doc: "A", id: line[i + 1..j].to_string() });
            }
            i = j;
            continue;
        }
        i += 1;
    }
    out
}

/// Section numbers of a spec document: headings `## 7. Title` and `### 7.4 Title`.
fn sections(path: &Path) -> BTreeSet<String> {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("## ").or_else(|| line.strip_prefix("### ")) else { continue };
        if let Some(end) = number(rest.as_bytes(), 0) {
            out.insert(rest[..end].to_string());
        }
    }
    out
}

/// Amendment ids of the history: entries `**A15. Title.** ...`.
fn amendments(path: &Path) -> BTreeSet<String> {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("**A") else { continue };
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        if !digits.is_empty() && rest[digits.len()..].starts_with('.') {
            out.insert(digits);
        }
    }
    out
}

/// Every text file under the cited trees, minus `docs/spec` itself and build output.
fn cited_files() -> Vec<PathBuf> {
    let r = root();
    let mut out = vec![r.join("README.md")];
    let mut stack: Vec<PathBuf> = ["src", "tests", "docs", "shims", "scripts"].iter().map(|d| r.join(d)).collect();
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            if p == r.join("docs").join("spec") {
                continue;
            }
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn spec_citations_resolve() {
    let spec = root().join("docs").join("spec");
    let core = sections(&spec.join("CORE.md"));
    let orch = sections(&spec.join("ORCH.md"));
    let amend = amendments(&spec.join("AMENDMENTS.md"));
    assert!(core.contains("7.4") && orch.contains("3.7") && amend.contains("15"), "spec headings not found");
    let mut checked = 0;
    let mut bad = Vec::new();
    for f in cited_files() {
        // Binary files (none expected) are not text citations.
        let Ok(text) = fs::read_to_string(&f) else { continue };
        let shown = f.strip_prefix(root()).unwrap_or(&f).display().to_string();
        for (n, line) in text.lines().enumerate() {
            for c in citations(line) {
                checked += 1;
                let ok = match c.doc {
                    "CORE" => core.contains(&c.id),
                    "ORCH" => orch.contains(&c.id),
                    _ => amend.contains(&c.id),
                };
                if !ok {
                    let name = if c.doc == "A" { format!("A{}", c.id) } else { format!("{} {}", c.doc, c.id) };
                    bad.push(format!("{shown}:{}: {name}", n + 1));
                }
            }
        }
    }
    assert!(checked > 300, "only {checked} citations found; is the extractor broken?");
    assert!(bad.is_empty(), "{} unresolved spec citation(s):\n{}", bad.len(), bad.join("\n"));
}

#[test]
fn citation_forms_used_in_the_repository_are_read() {
    let ids = |s: &str| citations(s).into_iter().map(|c| format!("{} {}", c.doc, c.id)).collect::<Vec<_>>();
    assert_eq!(ids("(CORE 6.2, 6.3 step 5, 7.5, A4, A8)"), ["CORE 6.2", "CORE 6.3", "CORE 7.5", "A 4", "A 8"]);
    assert_eq!(ids("CORE 7.3-7.5; ORCH 2.3 step 8, 2.8 test 10."), ["CORE 7.3", "CORE 7.5", "ORCH 2.3", "ORCH 2.8"]);
    assert_eq!(ids("CORE 10.2 steps 3 and 5, A12-A15"), ["CORE 10.2", "A 12", "A 15"]);
    assert_eq!(ids("see CORE 4, 5). AMENDMENTS A30"), ["CORE 4", "CORE 5", "A 30"]);
    assert_eq!(ids(r#"SPEC_CORE 1 names ["A1", "0xA1", "A1B"]"#), Vec::<String>::new());
}
