//! The review loop's evidence (ORCH 4.5 steps 3d and 3g, A34, A35): the `VERDICT:` and `IDENTITY:`
//! lines of a reviewer's report and the judgement they give a round (synthetic findings included),
//! the findings file a correction job carries, the creator's `FIXED` / `CHALLENGE` lines, the
//! reviewers' `SUSTAINED` / `WITHDRAWN` rulings, and the numbered findings a comply job quotes.
//!
//! Pure functions over `&str`: no file, clock, environment or process access, and nothing printed.
//! Reports are untrusted and may be megabytes long, so every function is one pass over its lines
//! (linear time, no re-scanning, no quadratic string building) and none of them panics on any input.
//! Every recognised line is an exact form after trimming ASCII whitespace; anything else is prose.

use std::collections::HashMap;

use crate::text::one_line;

/// A reviewer's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    NotPass,
}

impl Verdict {
    /// The spelling in a `VERDICT:` line, the checkpoint and the sidecar.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "PASS",
            Verdict::NotPass => "NOT PASS",
        }
    }
}

/// What a report says about itself: its last well-formed `VERDICT:` line and its last well-formed
/// `IDENTITY:` line (stored lowercase). `None` when the report has no such line.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Evidence {
    pub verdict: Option<Verdict>,
    pub identity: Option<String>,
}

/// The ASCII whitespace of the rest of mam (CORE 1.2): space, \t, \v, \f, \r, \n. Unicode spaces
/// (NBSP ...) and NUL are not whitespace, so a line carrying them is not an exact form.
fn trim(s: &str) -> &str {
    s.trim_matches(|c| matches!(c, ' ' | '\t' | '\x0b' | '\x0c' | '\r' | '\n'))
}

/// The trimmed lines of a report (split at `\n`; a CRLF's `\r` goes with the trim).
fn trimmed_lines(report: &str) -> impl Iterator<Item = &str> {
    report.split('\n').map(trim)
}

fn verdict_of(line: &str) -> Option<Verdict> {
    match line {
        "VERDICT: PASS" => Some(Verdict::Pass),
        "VERDICT: NOT PASS" => Some(Verdict::NotPass),
        _ => None,
    }
}

/// `IDENTITY: <40 or 64 hex>` (either case), the hex lowercased. A 39- or 41-digit value, a second
/// space or anything after the hex makes the line prose.
fn identity_of(line: &str) -> Option<String> {
    let hex = line.strip_prefix("IDENTITY: ")?;
    let ok = matches!(hex.len(), 40 | 64) && hex.bytes().all(|b| b.is_ascii_hexdigit());
    ok.then(|| hex.to_ascii_lowercase())
}

/// The evidence lines of a report: the last `VERDICT: PASS` / `VERDICT: NOT PASS` line and the last
/// `IDENTITY: <hex>` line win. `VERDICT: pass`, `VERDICT:PASS` or `**VERDICT: PASS**` do not count.
pub fn read(report: &str) -> Evidence {
    let mut ev = Evidence::default();
    for line in trimmed_lines(report) {
        if let Some(v) = verdict_of(line) {
            ev.verdict = Some(v);
        } else if let Some(id) = identity_of(line) {
            ev.identity = Some(id);
        }
    }
    ev
}

/// How one report counts in its round (ORCH 4.5 step 3d): the verdict that counts, the synthetic
/// finding(s) the loop adds (one `SYNTHETIC: ...` line each, joined by `\n`), and what the report said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judged {
    pub verdict: Verdict,
    pub synthetic: Option<String>,
    pub evidence: Evidence,
}

/// Judges a report. `want_tree` is the round's tree in a pinned round (`--worktree`/`--base`) and
/// `None` in an unpinned one, which checks the VERDICT line only (A25). `truncated` says the report
/// was cut by the report size limit (CORE 9.3): the synthetic line then says so, since the cut is the
/// likely reason a line is missing (A35).
///
/// A missing verdict is `SYNTHETIC: missing verdict`; in a pinned round an identity that differs or is
/// missing is `SYNTHETIC: identity mismatch <want> <got|none>`. Both may apply (two lines, verdict
/// first). Either makes the report NOT PASS; a plain `VERDICT: NOT PASS` has no synthetic line.
pub fn judge(report: &str, want_tree: Option<&str>, truncated: bool) -> Judged {
    let evidence = read(report);
    let cut = if truncated { " (report truncated)" } else { "" };
    let mut synthetic: Vec<String> = Vec::new();
    if evidence.verdict.is_none() {
        synthetic.push(format!("SYNTHETIC: missing verdict{cut}"));
    }
    if let Some(want) = want_tree {
        let want = want.to_ascii_lowercase();
        match &evidence.identity {
            Some(got) if *got == want => {}
            Some(got) => synthetic.push(format!("SYNTHETIC: identity mismatch {} {got}", one_line(&want))),
            None => synthetic.push(format!("SYNTHETIC: identity mismatch {} none{cut}", one_line(&want))),
        }
    }
    let verdict = match evidence.verdict {
        Some(Verdict::Pass) if synthetic.is_empty() => Verdict::Pass,
        _ => Verdict::NotPass,
    };
    let synthetic = (!synthetic.is_empty()).then(|| synthetic.join("\n"));
    Judged { verdict, synthetic, evidence }
}

/// One reviewer's section of `review/r<r>/findings.md` (A34):
///
/// ```text
/// ## <session> (<jid>)
///
/// <the report verbatim, ending with a newline>
/// <the synthetic line(s), if any>
///
/// ```
///
/// An empty report adds no line of its own. Session and job id are made one-line (they are
/// validated names; this only keeps a bad one from breaking the heading).
pub fn findings_section(session: &str, jid: &str, report: &str, synthetic: Option<&str>) -> String {
    let (session, jid) = (one_line(session), one_line(jid));
    let mut out = String::with_capacity(report.len() + session.len() + jid.len() + 64);
    out.push_str("## ");
    out.push_str(&session);
    out.push_str(" (");
    out.push_str(&jid);
    out.push_str(")\n\n");
    out.push_str(report);
    if !report.is_empty() && !report.ends_with('\n') {
        out.push('\n');
    }
    if let Some(s) = synthetic {
        out.push_str(s);
        if !s.ends_with('\n') {
            out.push('\n');
        }
    }
    out.push('\n');
    out
}

/// The header of every findings file; stable, the creator's brief refers to the file by path only.
pub const FINDINGS_HEADER: &str = "# Findings\n\n";

/// The whole findings file: [`FINDINGS_HEADER`] then the sections in the order given.
pub fn findings_file(sections: &[String]) -> String {
    let len = FINDINGS_HEADER.len() + sections.iter().map(String::len).sum::<usize>();
    let mut out = String::with_capacity(len);
    out.push_str(FINDINGS_HEADER);
    for s in sections {
        out.push_str(s);
    }
    out
}

/// One line of a creator's report answering a finding (A34).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreatorLine {
    Fixed { session: String, n: u32 },
    Challenge { session: String, n: u32, reason: String },
}

impl CreatorLine {
    fn key(&self) -> (&str, u32) {
        match self {
            CreatorLine::Fixed { session, n } | CreatorLine::Challenge { session, n, .. } => (session, *n),
        }
    }
}

/// `[a-z][a-z0-9_-]{0,31}`: a local session name (a finding's reviewer).
fn session_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 32
        && b[0].is_ascii_lowercase()
        && b[1..].iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'_' | b'-'))
}

/// A finding number: ASCII digits only (no sign, no space), at least 1, within u32.
fn finding_number(s: &str) -> Option<u32> {
    if s.is_empty() || s.len() > 10 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse::<u32>().ok().filter(|n| *n >= 1)
}

/// `<session>:<n>` exactly.
fn finding_ref(s: &str) -> Option<(&str, u32)> {
    let (session, n) = s.split_once(':')?;
    Some((session, finding_number(n)?)).filter(|_| session_name(session))
}

fn creator_line(line: &str) -> Option<CreatorLine> {
    if let Some(rest) = line.strip_prefix("FIXED ") {
        let (session, n) = finding_ref(rest)?;
        return Some(CreatorLine::Fixed { session: session.to_string(), n });
    }
    let rest = line.strip_prefix("CHALLENGE ")?;
    // `<session>:<n>: <reason>`: the session has no ':', so the ref ends at the second one.
    let first = rest.find(':')?;
    let second = first + 1 + rest[first + 1..].find(':')?;
    let (session, n) = finding_ref(&rest[..second])?;
    let reason = trim(&rest[second + 1..]);
    if reason.is_empty() {
        return None;
    }
    Some(CreatorLine::Challenge { session: session.to_string(), n, reason: reason.to_string() })
}

/// Keeps the last value per key in the order keys were first seen, in one pass.
fn last_wins<K: std::hash::Hash + Eq, V>(items: impl Iterator<Item = (K, V)>) -> Vec<V> {
    let mut at: HashMap<K, usize> = HashMap::new();
    let mut out: Vec<V> = Vec::new();
    for (k, v) in items {
        match at.get(&k) {
            Some(&i) => out[i] = v,
            None => {
                at.insert(k, out.len());
                out.push(v);
            }
        }
    }
    out
}

/// The creator's answers (A34): trimmed lines `FIXED <session>:<n>` and `CHALLENGE <session>:<n>:
/// <reason>` (reason non-empty), session `[a-z][a-z0-9_-]{0,31}`, n >= 1; any other line is prose.
/// A later line for the same finding replaces an earlier one, in the earlier one's place.
pub fn creator_lines(report: &str) -> Vec<CreatorLine> {
    last_wins(trimmed_lines(report).filter_map(creator_line).map(|l| ((l.key().0.to_string(), l.key().1), l)))
}

/// A reviewer's ruling on a challenged finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ruling {
    Sustained,
    Withdrawn,
}

fn ruling_line(line: &str) -> Option<(u32, Ruling)> {
    if let Some(n) = line.strip_prefix("SUSTAINED ") {
        return Some((finding_number(n)?, Ruling::Sustained));
    }
    Some((finding_number(line.strip_prefix("WITHDRAWN ")?)?, Ruling::Withdrawn))
}

/// A reviewer's rulings (A34): trimmed lines `SUSTAINED <n>` / `WITHDRAWN <n>`; the last line per n
/// wins, in first-seen order.
pub fn rulings(report: &str) -> Vec<(u32, Ruling)> {
    last_wins(trimmed_lines(report).filter_map(ruling_line).map(|r| (r.0, r)))
}

/// The findings a creator challenged for one reviewer, as (n, reason), in the creator's order.
pub fn challenged_for(lines: &[CreatorLine], session: &str) -> Vec<(u32, String)> {
    lines
        .iter()
        .filter_map(|l| match l {
            CreatorLine::Challenge { session: s, n, reason } if s == session => Some((*n, reason.clone())),
            _ => None,
        })
        .collect()
}

/// The number and the rest of a numbered list item's first line: `<n>.` or `<n>)`, optionally after a
/// `- ` or `* ` bullet, then whitespace or the end of the line (so `1.5 s` is not item 1).
fn numbered_item(line: &str) -> Option<(u32, &str)> {
    let line = line.strip_prefix("- ").or_else(|| line.strip_prefix("* ")).map_or(line, trim);
    let digits = line.bytes().take_while(u8::is_ascii_digit).count();
    let n = finding_number(&line[..digits])?;
    let rest = line[digits..].strip_prefix(['.', ')'])?;
    if !rest.is_empty() && !rest.starts_with([' ', '\t']) {
        return None;
    }
    Some((n, trim(rest)))
}

/// A line that ends the findings list: the evidence lines (any `VERDICT:` / `IDENTITY:` line, well
/// formed or not) and markdown headings.
fn ends_items(trimmed: &str) -> bool {
    trimmed.starts_with("VERDICT:")
        || trimmed.starts_with("IDENTITY:")
        || trimmed == "#"
        || (trimmed.starts_with('#') && trimmed.trim_start_matches('#').starts_with(' '))
}

/// Best effort: the reviewer's findings as numbered items (trimmed lines starting `<n>.`, `<n>)`,
/// `- <n>.` ...), each with its text: the rest of its first line and the lines after it (their
/// indentation kept, `\r` dropped, trailing blank lines dropped) up to the next numbered item, a
/// `VERDICT:` / `IDENTITY:` line or a heading. Inside a ``` or ~~~ fence nothing starts or ends an
/// item; a numbered line indented deeper than the open item is part of it (a sub-list). A number that
/// appears twice gives two items, in report order.
pub fn numbered_findings(report: &str) -> Vec<(u32, String)> {
    let mut out: Vec<(u32, String)> = Vec::new();
    // The open item's indentation; `None` when no item is open.
    let mut open: Option<usize> = None;
    let mut fence = false;
    for raw in report.split('\n') {
        let raw = raw.strip_suffix('\r').unwrap_or(raw);
        let t = trim(raw);
        let is_fence = t.starts_with("```") || t.starts_with("~~~");
        if !fence && !is_fence {
            let indent = raw.len() - raw.trim_start_matches([' ', '\t']).len();
            if let Some((n, first)) = numbered_item(t).filter(|_| open.is_none_or(|o| indent <= o)) {
                finish(&mut out, open.is_some());
                out.push((n, first.to_string()));
                open = Some(indent);
                continue;
            }
            if ends_items(t) {
                finish(&mut out, open.is_some());
                open = None;
                continue;
            }
        }
        if is_fence {
            fence = !fence;
        }
        if open.is_some() {
            if let Some((_, text)) = out.last_mut() {
                let line = raw.trim_end_matches([' ', '\t', '\x0b', '\x0c', '\r']);
                // An item whose first line is only its number starts at its first non-blank line.
                if !text.is_empty() {
                    text.push('\n');
                }
                text.push_str(line);
            }
        }
    }
    finish(&mut out, open.is_some());
    out
}

/// Drops the trailing blank lines of the item just closed (amortised linear: each byte is pushed
/// once and popped at most once).
fn finish(out: &mut [(u32, String)], was_open: bool) {
    if let Some((_, text)) = out.last_mut().filter(|_| was_open) {
        let keep = text.trim_end_matches(['\n', ' ', '\t']).len();
        text.truncate(keep);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TREE: &str = "0123456789abcdef0123456789abcdef01234567";
    const TREE64: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn pinned(id: &str, verdict: &str) -> String {
        format!("Looks fine.\n\nIDENTITY: {id}\nVERDICT: {verdict}\n")
    }

    // --- read: VERDICT ---

    #[test]
    fn verdict_strings_are_the_spec_spelling() {
        assert_eq!(Verdict::Pass.as_str(), "PASS");
        assert_eq!(Verdict::NotPass.as_str(), "NOT PASS");
    }

    #[test]
    fn a_pass_line_is_read() {
        assert_eq!(read("all good\nVERDICT: PASS\n").verdict, Some(Verdict::Pass));
    }

    #[test]
    fn a_not_pass_line_is_read() {
        assert_eq!(read("VERDICT: NOT PASS").verdict, Some(Verdict::NotPass));
    }

    #[test]
    fn the_last_verdict_line_wins() {
        assert_eq!(read("VERDICT: PASS\nVERDICT: NOT PASS\n").verdict, Some(Verdict::NotPass));
        assert_eq!(read("VERDICT: NOT PASS\nx\nVERDICT: PASS\n").verdict, Some(Verdict::Pass));
    }

    #[test]
    fn a_malformed_verdict_line_after_a_good_one_does_not_override_it() {
        assert_eq!(read("VERDICT: NOT PASS\nVERDICT: pass\n").verdict, Some(Verdict::NotPass));
    }

    #[test]
    fn verdict_lines_are_trimmed_of_ascii_whitespace() {
        assert_eq!(read("  \tVERDICT: PASS \t\x0b\x0c\n").verdict, Some(Verdict::Pass));
    }

    #[test]
    fn crlf_line_endings_are_accepted() {
        let ev = read(&format!("text\r\nIDENTITY: {TREE}\r\nVERDICT: PASS\r\n"));
        assert_eq!(ev.verdict, Some(Verdict::Pass));
        assert_eq!(ev.identity.as_deref(), Some(TREE));
    }

    #[test]
    fn near_miss_verdict_lines_do_not_count() {
        for line in [
            "VERDICT: pass",
            "VERDICT:PASS",
            "**VERDICT: PASS**",
            "VERDICT:  PASS",
            "VERDICT: PASS.",
            "verdict: PASS",
            "VERDICT: NOT  PASS",
            "VERDICT: NOTPASS",
            "> VERDICT: PASS",
            "`VERDICT: PASS`",
            "VERDICT: PASS\0",
            "\0VERDICT: PASS",
            "VERDICT: PASS\u{a0}",
            "VERDICT: PASS VERDICT: PASS",
            "The VERDICT: PASS",
        ] {
            assert_eq!(read(line).verdict, None, "{line:?}");
        }
    }

    #[test]
    fn a_report_without_lines_has_no_evidence() {
        assert_eq!(read(""), Evidence::default());
        assert_eq!(read("\n\n   \n\t\r\n"), Evidence::default());
    }

    // --- read: IDENTITY ---

    #[test]
    fn a_40_hex_identity_is_read() {
        assert_eq!(read(&format!("IDENTITY: {TREE}")).identity.as_deref(), Some(TREE));
    }

    #[test]
    fn a_64_hex_identity_is_read() {
        assert_eq!(read(&format!("IDENTITY: {TREE64}")).identity.as_deref(), Some(TREE64));
    }

    #[test]
    fn identity_hex_is_stored_lowercase() {
        let mixed = "0123456789ABCDEF0123456789abcdef0123456A";
        assert_eq!(read(&format!("IDENTITY: {mixed}")).identity.unwrap(), mixed.to_ascii_lowercase());
    }

    #[test]
    fn identity_of_the_wrong_length_does_not_count() {
        for hex in [&TREE[..39], &format!("{TREE}0")[..], &TREE64[..63], &format!("{TREE64}0")[..], ""] {
            assert_eq!(read(&format!("IDENTITY: {hex}")).identity, None, "{} digits", hex.len());
        }
    }

    #[test]
    fn near_miss_identity_lines_do_not_count() {
        let g = "0123456789abcdef0123456789abcdef0123456g";
        for line in [
            format!("IDENTITY:{TREE}"),
            format!("IDENTITY:  {TREE}"),
            format!("identity: {TREE}"),
            format!("IDENTITY: {g}"),
            format!("IDENTITY: {TREE} extra"),
            format!("IDENTITY: `{TREE}`"),
            format!("IDENTITY: 0x{}", &TREE[..38]),
            format!("IDENTITY: {TREE}\0"),
        ] {
            assert_eq!(read(&line).identity, None, "{line:?}");
        }
    }

    #[test]
    fn the_last_identity_line_wins() {
        let ev = read(&format!("IDENTITY: {TREE}\nIDENTITY: {TREE64}\n"));
        assert_eq!(ev.identity.as_deref(), Some(TREE64));
    }

    #[test]
    fn identity_and_verdict_are_read_in_either_order() {
        let ev = read(&format!("VERDICT: PASS\nIDENTITY: {TREE}\n"));
        assert_eq!(ev, Evidence { verdict: Some(Verdict::Pass), identity: Some(TREE.into()) });
    }

    // --- judge ---

    #[test]
    fn an_unpinned_round_judges_the_verdict_only() {
        let j = judge("VERDICT: PASS\n", None, false);
        assert_eq!((j.verdict, j.synthetic), (Verdict::Pass, None));
        let j = judge(&pinned(TREE64, "PASS"), None, false);
        assert_eq!(j.verdict, Verdict::Pass);
    }

    #[test]
    fn a_plain_not_pass_has_no_synthetic_finding() {
        let j = judge("1. a bug\nVERDICT: NOT PASS\n", None, false);
        assert_eq!((j.verdict, j.synthetic), (Verdict::NotPass, None));
        let j = judge(&pinned(TREE, "NOT PASS"), Some(TREE), false);
        assert_eq!((j.verdict, j.synthetic), (Verdict::NotPass, None));
    }

    #[test]
    fn a_missing_verdict_is_not_pass_with_a_synthetic_finding() {
        let j = judge("I think it is fine.\nVERDICT: pass\n", None, false);
        assert_eq!(j.verdict, Verdict::NotPass);
        assert_eq!(j.synthetic.as_deref(), Some("SYNTHETIC: missing verdict"));
        assert_eq!(j.evidence.verdict, None);
    }

    #[test]
    fn identity_must_equal_the_round_tree() {
        let j = judge(&pinned(TREE, "PASS"), Some(TREE), false);
        assert_eq!((j.verdict, j.synthetic.as_deref()), (Verdict::Pass, None));
    }

    #[test]
    fn a_different_identity_is_a_mismatch_naming_both_trees() {
        let other = "f".repeat(40);
        let j = judge(&pinned(&other, "PASS"), Some(TREE), false);
        assert_eq!(j.verdict, Verdict::NotPass);
        assert_eq!(j.synthetic.unwrap(), format!("SYNTHETIC: identity mismatch {TREE} {other}"));
        assert_eq!(j.evidence.verdict, Some(Verdict::Pass));
    }

    #[test]
    fn a_missing_identity_in_a_pinned_round_is_a_mismatch_with_none() {
        let j = judge("VERDICT: PASS\n", Some(TREE), false);
        assert_eq!(j.verdict, Verdict::NotPass);
        assert_eq!(j.synthetic.unwrap(), format!("SYNTHETIC: identity mismatch {TREE} none"));
    }

    #[test]
    fn a_39_hex_identity_counts_as_missing() {
        let j = judge(&pinned(&TREE[..39], "PASS"), Some(TREE), false);
        assert_eq!(j.verdict, Verdict::NotPass);
        assert_eq!(j.synthetic.unwrap(), format!("SYNTHETIC: identity mismatch {TREE} none"));
    }

    #[test]
    fn identity_matching_ignores_hex_case() {
        let j = judge(&pinned(&TREE.to_ascii_uppercase(), "PASS"), Some(TREE), false);
        assert_eq!(j.verdict, Verdict::Pass);
        let j = judge(&pinned(TREE, "PASS"), Some(&TREE.to_ascii_uppercase()), false);
        assert_eq!(j.verdict, Verdict::Pass);
    }

    #[test]
    fn a_prefix_of_the_tree_is_a_mismatch() {
        let j = judge(&pinned(TREE, "PASS"), Some(TREE64), false);
        assert_eq!(j.verdict, Verdict::NotPass);
        assert_eq!(j.synthetic.unwrap(), format!("SYNTHETIC: identity mismatch {TREE64} {TREE}"));
    }

    #[test]
    fn the_last_identity_line_is_the_one_judged() {
        let other = "e".repeat(40);
        let report = format!("IDENTITY: {TREE}\nIDENTITY: {other}\nVERDICT: PASS\n");
        assert_eq!(judge(&report, Some(TREE), false).verdict, Verdict::NotPass);
        let report = format!("IDENTITY: {other}\nIDENTITY: {TREE}\nVERDICT: PASS\n");
        assert_eq!(judge(&report, Some(TREE), false).verdict, Verdict::Pass);
    }

    #[test]
    fn a_truncated_report_that_lost_its_identity_says_so() {
        let j = judge("VERDICT: PASS\nlots of text that was cu", Some(TREE), true);
        assert_eq!(j.verdict, Verdict::NotPass);
        assert_eq!(j.synthetic.unwrap(), format!("SYNTHETIC: identity mismatch {TREE} none (report truncated)"));
    }

    #[test]
    fn a_truncated_report_that_kept_a_matching_identity_and_verdict_passes() {
        let j = judge(&pinned(TREE, "PASS"), Some(TREE), true);
        assert_eq!((j.verdict, j.synthetic), (Verdict::Pass, None));
    }

    #[test]
    fn a_truncated_report_with_a_wrong_identity_is_a_plain_mismatch() {
        let other = "a".repeat(64);
        let j = judge(&pinned(&other, "PASS"), Some(TREE), true);
        assert_eq!(j.synthetic.unwrap(), format!("SYNTHETIC: identity mismatch {TREE} {other}"));
    }

    #[test]
    fn a_truncated_report_that_lost_its_verdict_says_so() {
        let j = judge("findings: 1. x ... cu", None, true);
        assert_eq!(j.verdict, Verdict::NotPass);
        assert_eq!(j.synthetic.as_deref(), Some("SYNTHETIC: missing verdict (report truncated)"));
    }

    #[test]
    fn truncation_alone_is_no_finding_in_an_unpinned_round() {
        let j = judge("VERDICT: PASS\n", None, true);
        assert_eq!((j.verdict, j.synthetic), (Verdict::Pass, None));
    }

    #[test]
    fn missing_verdict_and_identity_give_two_synthetic_lines() {
        let j = judge("nothing useful", Some(TREE), true);
        assert_eq!(j.verdict, Verdict::NotPass);
        assert_eq!(
            j.synthetic.unwrap(),
            format!(
                "SYNTHETIC: missing verdict (report truncated)\n\
                 SYNTHETIC: identity mismatch {TREE} none (report truncated)"
            )
        );
    }

    #[test]
    fn a_want_tree_with_a_newline_stays_one_line() {
        let j = judge("VERDICT: PASS", Some("ab\ncd"), false);
        assert_eq!(j.synthetic.unwrap(), "SYNTHETIC: identity mismatch ab\\ncd none");
    }

    // --- findings ---

    #[test]
    fn a_findings_section_is_heading_blank_report_synthetic_blank() {
        let s = findings_section("rev-a", "j1", "1. bug\nVERDICT: pass\n", Some("SYNTHETIC: missing verdict"));
        assert_eq!(s, "## rev-a (j1)\n\n1. bug\nVERDICT: pass\nSYNTHETIC: missing verdict\n\n");
    }

    #[test]
    fn a_findings_section_without_synthetic_ends_with_a_blank_line() {
        let s = findings_section("rev-a", "j1", "1. bug\nVERDICT: NOT PASS\n", None);
        assert_eq!(s, "## rev-a (j1)\n\n1. bug\nVERDICT: NOT PASS\n\n");
    }

    #[test]
    fn a_report_without_a_final_newline_gets_one() {
        let s = findings_section("r", "j", "VERDICT: NOT PASS", None);
        assert_eq!(s, "## r (j)\n\nVERDICT: NOT PASS\n\n");
    }

    #[test]
    fn the_report_is_copied_verbatim() {
        let report = "  a\r\n\n## inner heading\n\0\t\r\n";
        let s = findings_section("r", "j", report, None);
        assert_eq!(s, format!("## r (j)\n\n{report}\n"));
    }

    #[test]
    fn an_empty_report_adds_no_line() {
        let s = findings_section("r", "j", "", Some("SYNTHETIC: missing verdict"));
        assert_eq!(s, "## r (j)\n\nSYNTHETIC: missing verdict\n\n");
    }

    #[test]
    fn two_synthetic_lines_both_land_in_the_section() {
        let j = judge("x", Some(TREE), false);
        let s = findings_section("r", "j", "x", j.synthetic.as_deref());
        assert_eq!(
            s,
            format!("## r (j)\n\nx\nSYNTHETIC: missing verdict\nSYNTHETIC: identity mismatch {TREE} none\n\n")
        );
    }

    #[test]
    fn the_section_heading_stays_one_line() {
        let s = findings_section("a\nb", "j\r", "x\n", None);
        assert_eq!(s.lines().next().unwrap(), "## a\\nb (j\\r)");
    }

    #[test]
    fn the_findings_file_is_the_header_then_the_sections() {
        let a = findings_section("a", "j1", "1. x\n", None);
        let b = findings_section("b", "j2", "2. y\n", Some("SYNTHETIC: missing verdict"));
        let f = findings_file(&[a.clone(), b.clone()]);
        assert_eq!(f, format!("# Findings\n\n{a}{b}"));
        assert_eq!(f, "# Findings\n\n## a (j1)\n\n1. x\n\n## b (j2)\n\n2. y\nSYNTHETIC: missing verdict\n\n");
        assert_eq!(findings_file(&[]), FINDINGS_HEADER);
    }

    // --- creator lines ---

    fn fixed(s: &str, n: u32) -> CreatorLine {
        CreatorLine::Fixed { session: s.into(), n }
    }
    fn challenge(s: &str, n: u32, r: &str) -> CreatorLine {
        CreatorLine::Challenge { session: s.into(), n, reason: r.into() }
    }

    #[test]
    fn fixed_and_challenge_lines_are_read() {
        let r = "Done.\nFIXED rev-a:1\nCHALLENGE rev_b2:3: the spec says otherwise: see 4.5\n";
        assert_eq!(
            creator_lines(r),
            vec![fixed("rev-a", 1), challenge("rev_b2", 3, "the spec says otherwise: see 4.5")]
        );
    }

    #[test]
    fn creator_lines_are_trimmed_and_crlf_is_accepted() {
        let r = "  FIXED a:1 \r\n\tCHALLENGE a:2:   because  \r\n";
        assert_eq!(creator_lines(r), vec![fixed("a", 1), challenge("a", 2, "because")]);
    }

    #[test]
    fn a_challenge_needs_a_reason() {
        assert_eq!(creator_lines("CHALLENGE a:1:\nCHALLENGE a:2:   \nCHALLENGE a:3\n"), vec![]);
    }

    #[test]
    fn a_challenge_reason_may_follow_the_colon_without_a_space() {
        assert_eq!(creator_lines("CHALLENGE a:1:wrong"), vec![challenge("a", 1, "wrong")]);
    }

    #[test]
    fn creator_line_sessions_must_be_local_session_names() {
        let long = format!("a{}", "b".repeat(32));
        let ok32 = format!("a{}", "b".repeat(31));
        for bad in ["Rev:1", "1rev:1", "-a:1", "a.b:1", "a b:1", ":1", "remote:x:1", &format!("{long}:1")] {
            assert_eq!(creator_lines(&format!("FIXED {bad}")), vec![], "{bad}");
        }
        assert_eq!(creator_lines(&format!("FIXED {ok32}:1")), vec![fixed(&ok32, 1)]);
    }

    #[test]
    fn creator_line_numbers_must_be_positive_integers() {
        for bad in ["a:0", "a:", "a:-1", "a:+1", "a:1.", "a: 1", "a:1x", "a:4294967296", "a:99999999999"] {
            assert_eq!(creator_lines(&format!("FIXED {bad}")), vec![], "{bad}");
        }
        assert_eq!(creator_lines("FIXED a:4294967295"), vec![fixed("a", u32::MAX)]);
        assert_eq!(creator_lines("FIXED a:007"), vec![fixed("a", 7)]);
    }

    #[test]
    fn near_miss_creator_lines_are_ignored() {
        for bad in [
            "fixed a:1",
            "FIXED  a:1",
            "FIXED a:1 and more",
            "- FIXED a:1",
            "**FIXED a:1**",
            "FIXED a 1",
            "FIXEDa:1",
            "Challenge a:1: x",
            "CHALLENGE a 1: x",
            "CHALLENGE a:x: y",
        ] {
            assert_eq!(creator_lines(bad), vec![], "{bad:?}");
        }
    }

    #[test]
    fn the_last_creator_line_per_finding_wins_in_first_seen_order() {
        let r = "FIXED a:1\nFIXED b:1\nCHALLENGE a:1: no\nFIXED a:2\nFIXED a:1\nCHALLENGE b:1: later\n";
        assert_eq!(creator_lines(r), vec![fixed("a", 1), challenge("b", 1, "later"), fixed("a", 2)]);
        let r = "FIXED a:1\nCHALLENGE a:1: no\n";
        assert_eq!(creator_lines(r), vec![challenge("a", 1, "no")]);
    }

    #[test]
    fn the_same_number_for_two_reviewers_is_two_findings() {
        assert_eq!(creator_lines("FIXED a:1\nFIXED b:1\n"), vec![fixed("a", 1), fixed("b", 1)]);
    }

    #[test]
    fn challenged_for_lists_one_reviewers_challenges() {
        let lines = creator_lines("CHALLENGE a:2: x\nFIXED a:1\nCHALLENGE b:1: y\nCHALLENGE a:5: z\n");
        assert_eq!(challenged_for(&lines, "a"), vec![(2, "x".to_string()), (5, "z".to_string())]);
        assert_eq!(challenged_for(&lines, "b"), vec![(1, "y".to_string())]);
        assert_eq!(challenged_for(&lines, "c"), vec![]);
    }

    // --- rulings ---

    #[test]
    fn sustained_and_withdrawn_lines_are_read() {
        let r = "I looked again.\nSUSTAINED 2\n  WITHDRAWN 3\r\nVERDICT: NOT PASS\n";
        assert_eq!(rulings(r), vec![(2, Ruling::Sustained), (3, Ruling::Withdrawn)]);
    }

    #[test]
    fn the_last_ruling_per_finding_wins_in_first_seen_order() {
        let r = "SUSTAINED 1\nWITHDRAWN 2\nWITHDRAWN 1\n";
        assert_eq!(rulings(r), vec![(1, Ruling::Withdrawn), (2, Ruling::Withdrawn)]);
    }

    #[test]
    fn near_miss_rulings_are_ignored() {
        for bad in [
            "SUSTAINED 0",
            "SUSTAINED",
            "SUSTAINED ",
            "SUSTAINED  1",
            "SUSTAINED 1.",
            "SUSTAINED a:1",
            "sustained 1",
            "WITHDRAWN -1",
            "WITHDRAWN 1 because",
            "- WITHDRAWN 1",
            "WITHDRAWN 4294967296",
        ] {
            assert_eq!(rulings(bad), vec![], "{bad:?}");
        }
    }

    // --- numbered findings ---

    fn items(v: &[(u32, &str)]) -> Vec<(u32, String)> {
        v.iter().map(|(n, s)| (*n, s.to_string())).collect()
    }

    #[test]
    fn numbered_findings_are_split_at_each_item() {
        let r = "Review of x.\n\n1. The parser panics.\n   It indexes past the end.\n2) Missing test.\n- 3. Typo in README.\n\nIDENTITY: abc\nVERDICT: NOT PASS\n";
        assert_eq!(
            numbered_findings(r),
            items(&[
                (1, "The parser panics.\n   It indexes past the end."),
                (2, "Missing test."),
                (3, "Typo in README.")
            ])
        );
    }

    #[test]
    fn the_verdict_line_ends_the_last_finding() {
        let r = "1. bug\nVERDICT: NOT PASS\nafter the verdict\n";
        assert_eq!(numbered_findings(r), items(&[(1, "bug")]));
    }

    #[test]
    fn a_heading_ends_a_finding() {
        let r = "## Findings\n1. bug\n\n## Summary\nall in all bad\n";
        assert_eq!(numbered_findings(r), items(&[(1, "bug")]));
    }

    #[test]
    fn a_number_without_a_following_space_is_not_an_item() {
        let r = "1. slow\n1.5 seconds is too long\n2.x is not an item\n";
        assert_eq!(numbered_findings(r), items(&[(1, "slow\n1.5 seconds is too long\n2.x is not an item")]));
    }

    #[test]
    fn zero_is_not_a_finding_number() {
        assert_eq!(numbered_findings("0. nothing\n"), vec![]);
    }

    #[test]
    fn fenced_code_does_not_start_or_end_findings() {
        let r = "1. bad shell:\n```sh\n# comment\n2. not an item\nVERDICT: PASS\n```\n2. next\n";
        assert_eq!(
            numbered_findings(r),
            items(&[(1, "bad shell:\n```sh\n# comment\n2. not an item\nVERDICT: PASS\n```"), (2, "next")])
        );
    }

    #[test]
    fn an_indented_sub_list_belongs_to_its_finding() {
        let r = "1. two problems:\n   1. first\n   2. second\n2. other\n";
        assert_eq!(numbered_findings(r), items(&[(1, "two problems:\n   1. first\n   2. second"), (2, "other")]));
    }

    #[test]
    fn findings_keep_crlf_out_and_trailing_blanks_off() {
        let r = "1. a\r\n  more\r\n\r\n\r\n2. b\r\n";
        assert_eq!(numbered_findings(r), items(&[(1, "a\n  more"), (2, "b")]));
    }

    #[test]
    fn text_before_the_first_finding_is_not_a_finding() {
        assert_eq!(numbered_findings("intro\nmore intro\n"), vec![]);
        assert_eq!(numbered_findings("intro\n* 4) x\n"), items(&[(4, "x")]));
    }

    #[test]
    fn a_repeated_number_gives_two_findings_in_order() {
        let r = "1. a\n1. b\n";
        assert_eq!(numbered_findings(r), items(&[(1, "a"), (1, "b")]));
    }

    #[test]
    fn a_bare_number_takes_the_lines_below_it() {
        assert_eq!(numbered_findings("1.\n\n  text\n"), items(&[(1, "  text")]));
    }

    // --- robustness ---

    #[test]
    fn odd_input_never_panics() {
        let odd = [
            "",
            "\n",
            "\r",
            "\r\n\r\n",
            " \t \x0b\x0c ",
            "\0",
            "VERDICT:",
            "IDENTITY:",
            "IDENTITY: ",
            "CHALLENGE ",
            "CHALLENGE a:",
            "CHALLENGE :",
            "CHALLENGE ::",
            "FIXED :",
            "1",
            "1.",
            "- ",
            "-",
            "* 1)",
            "```",
            "é1. ü\nVERDICT: ü",
            "1. \u{1F600}\n# \u{1F600}",
            "SUSTAINED \u{0663}",
        ];
        for s in odd {
            let _ = judge(s, Some(TREE), true);
            let _ = creator_lines(s);
            let _ = rulings(s);
            let _ = numbered_findings(s);
            let _ = findings_section(s, s, s, Some(s));
        }
        assert_eq!(rulings("SUSTAINED \u{0663}"), vec![]);
    }

    #[test]
    fn a_very_long_line_is_handled() {
        let long = "x".repeat(2_000_000);
        let r = format!("1. {long}\nIDENTITY: {TREE}\nVERDICT: PASS\n");
        let j = judge(&r, Some(TREE), false);
        assert_eq!(j.verdict, Verdict::Pass);
        assert_eq!(numbered_findings(&r)[0].1.len(), long.len());
        assert_eq!(read(&format!("VERDICT: PASS{long}")).verdict, None);
    }

    #[test]
    fn a_ten_megabyte_report_is_read_in_linear_time() {
        // Many short lines and many items: a quadratic pass would take minutes here.
        let mut r = String::with_capacity(11 << 20);
        let mut i = 1u32;
        while r.len() < 10 << 20 {
            r.push_str(&format!("{i}. finding {i}\n   detail\nFIXED a:{i}\nSUSTAINED {i}\n"));
            i += 1;
        }
        r.push_str(&format!("IDENTITY: {TREE}\nVERDICT: NOT PASS\n"));
        let t = std::time::Instant::now();
        assert_eq!(judge(&r, Some(TREE), false).verdict, Verdict::NotPass);
        assert_eq!(numbered_findings(&r).len(), (i - 1) as usize);
        assert_eq!(creator_lines(&r).len(), (i - 1) as usize);
        assert_eq!(rulings(&r).len(), (i - 1) as usize);
        let section = findings_section("a", "j", &r, None);
        assert_eq!(findings_file(&[section]).len(), FINDINGS_HEADER.len() + "## a (j)\n\n".len() + r.len() + 1);
        // Generous even for a debug build on a slow machine; quadratic work is far beyond it.
        assert!(t.elapsed() < std::time::Duration::from_secs(60), "took {:?}", t.elapsed());
    }
}
