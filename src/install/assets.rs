//! What `mam install` puts into a repository (ORCH 7.2, A49): every asset is embedded in the binary
//! at build time (`include_bytes!`), so an installed tree is exactly what this binary ships; the
//! binary itself is the running executable. Pure: returns bytes and modes, writes nothing.

use std::borrow::Cow;

use super::legacy;

/// One file install writes: its target-relative path, its bytes and its mode.
#[derive(Debug, Clone)]
pub struct Asset {
    pub path: String,
    pub bytes: Cow<'static, [u8]>,
    pub mode: u32,
}

/// Where the binary goes (A49: copied from the running executable by temp + rename).
pub const BINARY: &str = ".mam/bin/mam";
/// The shims' directory; `<shims>/../bin/mam` is the binary (ORCH 0.5).
pub const SHIMS_DIR: &str = ".mam/shims";
/// The generated herdr wrapper's directory and file (ORCH 0.5, A28): in the manifest, not hashed.
pub const HERDR_SHIM_DIR: &str = ".mam/shim/";
pub const HERDR_SHIM: &str = ".mam/shim/herdr";
/// The env-file example (secrets go into `.mam.env`, which the managed block ignores).
pub const ENV_EXAMPLE: &str = ".mam.env.example";

/// The eight skills of ORCH 7.2, `.agents/skills/<name>/SKILL.md`.
pub const SKILLS: &[(&str, &str)] = &[
    ("create", include_str!("../../assets/skills/create/SKILL.md")),
    ("delegate-job", include_str!("../../assets/skills/delegate-job/SKILL.md")),
    ("loop", include_str!("../../assets/skills/loop/SKILL.md")),
    ("monitor", include_str!("../../assets/skills/monitor/SKILL.md")),
    ("orc-onboard", include_str!("../../assets/skills/orc-onboard/SKILL.md")),
    ("resume", include_str!("../../assets/skills/resume/SKILL.md")),
    ("status", include_str!("../../assets/skills/status/SKILL.md")),
    ("stop", include_str!("../../assets/skills/stop/SKILL.md")),
];

/// Every file of `shims/`, installed under `.mam/shims/` (the table A49 asks for lives in
/// docs/DESIGN.md, "Install, update, remove"). `lib.sh` is sourced, not run: 0644.
pub const SHIMS: &[(&str, &[u8])] = &[
    ("create_session.sh", include_bytes!("../../shims/create_session.sh")),
    ("delegate_job.sh", include_bytes!("../../shims/delegate_job.sh")),
    ("diff_collect.sh", include_bytes!("../../shims/diff_collect.sh")),
    ("envfile", include_bytes!("../../shims/envfile")),
    ("heartbeat", include_bytes!("../../shims/heartbeat")),
    ("install.sh", include_bytes!("../../shims/install.sh")),
    ("job_subscriber", include_bytes!("../../shims/job_subscriber")),
    ("lib.sh", include_bytes!("../../shims/lib.sh")),
    ("orc_onboard.sh", include_bytes!("../../shims/orc_onboard.sh")),
    ("publish_event", include_bytes!("../../shims/publish_event")),
    ("reconcile.sh", include_bytes!("../../shims/reconcile.sh")),
    ("registry", include_bytes!("../../shims/registry")),
    ("remote", include_bytes!("../../shims/remote")),
    ("remove.sh", include_bytes!("../../shims/remove.sh")),
    ("resume_session.sh", include_bytes!("../../shims/resume_session.sh")),
    ("run_loop.sh", include_bytes!("../../shims/run_loop.sh")),
    ("status.sh", include_bytes!("../../shims/status.sh")),
    ("stop_session.sh", include_bytes!("../../shims/stop_session.sh")),
    ("update.sh", include_bytes!("../../shims/update.sh")),
    ("worktree_prepare.sh", include_bytes!("../../shims/worktree_prepare.sh")),
    ("worktree_remove.sh", include_bytes!("../../shims/worktree_remove.sh")),
];

pub const ENV_EXAMPLE_TEXT: &str = include_str!("../../assets/mam.env.example");

/// A SKILL.md with its `version:` frontmatter line set to `version` (the release's own value unless
/// the test hook `MAM_TEST_ASSET_VERSION` names another, ORCH 8 item 8).
pub fn skill_text(text: &str, version: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_front = false;
    for (i, line) in text.split_inclusive('\n').enumerate() {
        let bare = line.trim_end_matches(['\n', '\r']);
        if i == 0 && bare == "---" {
            in_front = true;
        } else if in_front && bare == "---" {
            in_front = false;
        } else if in_front && bare.starts_with("version:") {
            out.push_str(&format!("version: {version}\n"));
            continue;
        }
        out.push_str(line);
    }
    out
}

/// The frontmatter value of `key` in a SKILL.md (`name`, `description`, `version`).
pub fn frontmatter(text: &str, key: &str) -> Option<String> {
    let mut lines = text.lines();
    if lines.next()? != "---" {
        return None;
    }
    for l in lines {
        if l == "---" {
            return None;
        }
        if let Some(v) = l.strip_prefix(key).and_then(|r| r.strip_prefix(':')) {
            return Some(v.trim().to_string());
        }
    }
    None
}

/// Every asset of this release, sorted by path: the binary (`binary` is the running executable's
/// bytes), the shims, the skills, `.mam.env.example`, and with `legacy_paths` the legacy entry
/// points at their legacy relative paths (ORCH 7.4, issue 16).
pub fn shipped(binary: Vec<u8>, version: &str, legacy_paths: bool) -> Vec<Asset> {
    let mut out = vec![Asset { path: BINARY.into(), bytes: Cow::Owned(binary), mode: 0o755 }];
    for (name, bytes) in SHIMS {
        let mode = if *name == "lib.sh" { 0o644 } else { 0o755 };
        out.push(Asset { path: format!("{SHIMS_DIR}/{name}"), bytes: Cow::Borrowed(bytes), mode });
    }
    for (name, text) in SKILLS {
        let bytes = skill_text(text, version).into_bytes();
        out.push(Asset { path: format!(".agents/skills/{name}/SKILL.md"), bytes: Cow::Owned(bytes), mode: 0o644 });
    }
    out.push(Asset { path: ENV_EXAMPLE.into(), bytes: Cow::Borrowed(ENV_EXAMPLE_TEXT.as_bytes()), mode: 0o644 });
    if legacy_paths {
        for e in legacy::ENTRY_POINTS {
            let path = e.path();
            let mode = if e.kind == legacy::Kind::Sourced { 0o644 } else { 0o755 };
            out.push(Asset { bytes: Cow::Owned(legacy::shim_text(e).into_bytes()), path, mode });
        }
    }
    crate::sort::by(&mut out, |a, b| a.path.cmp(&b.path));
    out
}

/// The generated `.mam/shim/herdr`: the legacy herdr wrapper over `mam pane` (ORCH 0.5, 1.1),
/// storing the binary's absolute path. `shims/lib.sh` writes the same bytes when sourced (a test
/// pins that), so an installed wrapper is never rewritten by it.
pub fn herdr_shim(binary_abs: &str) -> String {
    let q = crate::text::shell_quote(binary_abs);
    format!(
        r#"#!/usr/bin/env bash
# Generated by mam (lib.sh, mam install): the legacy herdr wrapper over `mam pane` (ORCH 0.5, 1.1).
# new-session K=V... turns the leading K=V words into --env K=V; ls, new-session, send-keys-safe,
# status, close and server-start go to `mam pane`; any other verb goes to the real herdr
# (HERDR_BIN, else the first herdr on PATH that is not this file).
mam={q}
case "${{1:-}}" in
  new-session)
    shift
    env=()
    while [ $# -gt 0 ] && [[ $1 =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; do env+=(--env "$1"); shift; done
    exec "$mam" pane new-session "${{env[@]}}" "$@" ;;
  ls | send-keys-safe | status | close | server-start | --help | -h) exec "$mam" pane "$@" ;;
esac
self=$(cd "${{BASH_SOURCE[0]%/*}}" && pwd -P)
if [ -n "${{HERDR_BIN:-}}" ]; then exec "$HERDR_BIN" "$@"; fi
IFS=: read -r -a dirs <<<"$PATH"
for d in "${{dirs[@]}}"; do
  [ -n "$d" ] && [ -x "$d/herdr" ] || continue
  [ "$(cd "$d" 2>/dev/null && pwd -P)" = "$self" ] && continue
  exec "$d/herdr" "$@"
done
echo "ERROR: herdr wrapper: verb '${{1:-}}' needs the real herdr: not found in HERDR_BIN or on PATH" >&2
exit 127
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skill_version_is_rewritten_only_in_the_frontmatter() {
        let t = "---\nname: x\nversion: 0.0.1\n---\nversion: body\n";
        assert_eq!(skill_text(t, "9.9"), "---\nname: x\nversion: 9.9\n---\nversion: body\n");
        assert_eq!(frontmatter(&skill_text(t, "9.9"), "version").as_deref(), Some("9.9"));
    }

    #[test]
    fn every_skill_carries_the_release_version() {
        for (name, text) in SKILLS {
            assert_eq!(frontmatter(text, "name").as_deref(), Some(*name), "{name}");
            assert!(frontmatter(text, "description").is_some_and(|d| !d.is_empty()), "{name}");
            assert_eq!(frontmatter(text, "version").as_deref(), Some(crate::version::VERSION), "{name}");
        }
    }

    #[test]
    fn shipped_is_sorted_and_unique() {
        let a = shipped(vec![1], "1", true);
        let mut paths: Vec<&str> = a.iter().map(|a| a.path.as_str()).collect();
        let n = paths.len();
        paths.dedup();
        assert_eq!(paths.len(), n);
        assert!(paths.windows(2).all(|w| w[0] < w[1]));
    }
}
