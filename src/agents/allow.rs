//! The one approval rule mam owns (issue 30 "Approvals"): in claude's default permission mode every
//! Bash command not already allowed waits at "This command requires approval", mam's own publish
//! lines included, and its Write tool asks "Create file" for the report the brief names. `mam create
//! claude` (and `resume`) adds two project-local allow rules to `<cwd>/.claude/settings.local.json`:
//! `Bash(<abs mam> publish *)` and `Edit(/<abs registry>/*/report.md)`; `mam stop` and `mam remove`
//! take exactly those strings out again. Nothing else the agent does is approved by mam.
//!
//! Observed with claude 2.1.197 (docs/AGENTS.md "claude"): the rule matches the brief's lines, whose
//! binary is single-quoted (`'/p/mam' publish --registry-dir '…' …`): claude compares the command
//! with its quotes removed, and its own "don't ask again" offers this very form. A line that starts
//! with a `VAR=value` prefix matches no such rule, which is why the brief's lines have none.
//!
//! The file is the user's too: it is read without following a symlink (a link there is refused, not
//! replaced), the rule is merged into `permissions.allow` beside whatever is there, and the result is
//! written atomically; a file that is not a JSON object is refused, never overwritten. When taking
//! the rule out leaves nothing but an empty `permissions.allow`, the file mam created is removed.
//! Key order is not kept (serde_json's map is sorted); the content is.
//!
//! I/O on the project's file only; never prints.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use crate::sys;

/// The rule for the binary `mam` (its absolute path, as the brief's lines name it).
pub fn claude_rule(mam: &Path) -> String {
    format!("Bash({} publish *)", mam.display())
}

/// The rules mam owns for a claude working with `registry`: its publish lines (`claude_rule`) and the
/// report file each brief asks for, `<registry>/<jid>/report.md` (claude's Write tool asks "Create
/// file" for it in default mode; an `Edit` rule covers every file-editing tool, and `//` starts an
/// absolute path in its gitignore-style pattern).
pub fn claude_rules(mam: &Path, registry: &Path) -> Vec<String> {
    vec![claude_rule(mam), format!("Edit(/{}/*/report.md)", registry.display())]
}

/// claude's local settings file, relative to the directory it works in.
pub const SETTINGS: &str = ".claude/settings.local.json";

/// True when `<dir>/.claude/settings.local.json` holds nothing but allow rules of the shapes mam
/// writes (`Bash(<…/mam> publish *)`, `Edit(/<…>/*/report.md)`): a file mam made and `stop` removes,
/// not a user's work (a worktree check does not count it as an ignored file that would be lost).
pub fn only_mam_rules(dir: &Path) -> bool {
    let Ok(Some(m)) = read_settings(&claude_settings(dir)) else { return false };
    let Some(allow) = m.get("permissions").and_then(|p| p.get("allow")).and_then(Value::as_array) else {
        return false;
    };
    let ours = |r: &Value| {
        r.as_str().is_some_and(|r| {
            (r.starts_with("Bash(/") && r.ends_with("/mam publish *)"))
                || (r.starts_with("Edit(/") && r.ends_with("/*/report.md)"))
        })
    };
    m.len() == 1
        && m.get("permissions").and_then(Value::as_object).is_some_and(|p| p.len() == 1)
        && allow.iter().all(ours)
}

/// `<dir>/.claude/settings.local.json`.
pub fn claude_settings(dir: &Path) -> PathBuf {
    dir.join(".claude").join("settings.local.json")
}

/// Reads the settings object at `path`: `None` when there is no file.
fn read_settings(path: &Path) -> Result<Option<Map<String, Value>>, String> {
    let mut f = match sys::open_nofollow_read(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if sys::is_nofollow_error(&e) => {
            return Err(format!(
                "{} is a symlink; mam does not write through it (add the rule yourself)",
                path.display()
            ))
        }
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    if !f.metadata().map_err(|e| format!("cannot stat {}: {e}", path.display()))?.is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    let mut text = String::new();
    f.read_to_string(&mut text).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if text.trim().is_empty() {
        return Ok(Some(Map::new()));
    }
    match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(m)) => Ok(Some(m)),
        Ok(_) | Err(_) => {
            Err(format!("{} is not a JSON object; left as it is (fix it, then create again)", path.display()))
        }
    }
}

fn write_settings(path: &Path, m: &Map<String, Value>) -> Result<(), String> {
    let mut text = serde_json::to_string_pretty(&Value::Object(m.clone())).map_err(|e| e.to_string())?;
    text.push('\n');
    sys::atomic_write_mode(path, text.as_bytes(), 0o644).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Adds `rules` to `permissions.allow` of `<dir>/.claude/settings.local.json`, creating the file (and
/// `.claude`) when missing. Returns whether the file changed.
pub fn add(dir: &Path, rules: &[String]) -> Result<bool, String> {
    let claude_dir = dir.join(".claude");
    match std::fs::symlink_metadata(&claude_dir) {
        Ok(m) if m.file_type().is_symlink() => {
            return Err(format!("{} is a symlink; mam does not write through it", claude_dir.display()))
        }
        Ok(m) if !m.is_dir() => return Err(format!("{} is not a directory", claude_dir.display())),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => sys::create_dir_all_mode(&claude_dir, 0o755)
            .map_err(|e| format!("cannot create {}: {e}", claude_dir.display()))?,
        Err(e) => return Err(format!("cannot stat {}: {e}", claude_dir.display())),
    }
    let path = claude_settings(dir);
    let mut m = read_settings(&path)?.unwrap_or_default();
    let perms = m.entry("permissions").or_insert_with(|| json!({}));
    let Some(perms) = perms.as_object_mut() else {
        return Err(format!("{}: `permissions` is not an object; left as it is", path.display()));
    };
    let allow = perms.entry("allow").or_insert_with(|| json!([]));
    let Some(allow) = allow.as_array_mut() else {
        return Err(format!("{}: `permissions.allow` is not a list; left as it is", path.display()));
    };
    let before = allow.len();
    for rule in rules {
        if !allow.iter().any(|r| r.as_str() == Some(rule)) {
            allow.push(Value::String(rule.clone()));
        }
    }
    if allow.len() == before {
        return Ok(false);
    }
    write_settings(&path, &m)?;
    Ok(true)
}

/// Takes exactly `rules` out of `permissions.allow` of `<dir>/.claude/settings.local.json`. Returns
/// whether the file changed; a missing file or rule is no change.
pub fn remove(dir: &Path, rules: &[String]) -> Result<bool, String> {
    let path = claude_settings(dir);
    if std::fs::symlink_metadata(dir.join(".claude")).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(format!("{} is a symlink; mam does not write through it", dir.join(".claude").display()));
    }
    let Some(mut m) = read_settings(&path)? else { return Ok(false) };
    let Some(allow) = m.get_mut("permissions").and_then(|p| p.get_mut("allow")).and_then(Value::as_array_mut) else {
        return Ok(false);
    };
    let before = allow.len();
    allow.retain(|r| !rules.iter().any(|x| r.as_str() == Some(x)));
    if allow.len() == before {
        return Ok(false);
    }
    let only_ours = allow.is_empty()
        && m.len() == 1
        && m.get("permissions").and_then(Value::as_object).is_some_and(|p| p.len() == 1);
    if only_ours {
        std::fs::remove_file(&path).map_err(|e| format!("cannot remove {}: {e}", path.display()))?;
        // `.claude` too when that leaves it empty (mam created it; an empty one holds nothing of anyone's).
        let _ = std::fs::remove_dir(dir.join(".claude"));
        return Ok(true);
    }
    write_settings(&path, &m)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("mam-allow-{tag}-{}", sys::random_hex(4).unwrap()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn the_rule_is_merged_with_the_users_and_taken_out_exactly() {
        let d = dir("merge");
        std::fs::create_dir_all(d.join(".claude")).unwrap();
        let user = r#"{"permissions":{"allow":["Bash(npm test)"],"deny":["Bash(rm *)"]},"env":{"A":"1"}}"#;
        std::fs::write(claude_settings(&d), user).unwrap();
        let rule = claude_rules(Path::new("/opt/mam/mam"), Path::new("/w/.mam/jobs"));
        assert_eq!(rule, ["Bash(/opt/mam/mam publish *)", "Edit(//w/.mam/jobs/*/report.md)"]);
        assert!(add(&d, &rule).unwrap());
        assert!(!add(&d, &rule).unwrap(), "added once");
        let v: Value = serde_json::from_str(&std::fs::read_to_string(claude_settings(&d)).unwrap()).unwrap();
        assert_eq!(v["permissions"]["allow"], json!(["Bash(npm test)", rule[0], rule[1]]));
        assert_eq!(v["permissions"]["deny"], json!(["Bash(rm *)"]));
        assert_eq!(v["env"]["A"], "1");
        assert!(remove(&d, &rule).unwrap());
        let v: Value = serde_json::from_str(&std::fs::read_to_string(claude_settings(&d)).unwrap()).unwrap();
        assert_eq!(v, serde_json::from_str::<Value>(user).unwrap());
        assert!(!remove(&d, &rule).unwrap());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_file_mam_created_goes_with_its_rule() {
        let d = dir("own");
        let rule = claude_rules(Path::new("/m"), Path::new("/r"));
        assert!(add(&d, &rule).unwrap());
        assert!(claude_settings(&d).is_file());
        assert!(remove(&d, &rule).unwrap());
        assert!(!claude_settings(&d).exists());
        assert!(!d.join(".claude").exists(), "the directory mam created goes too");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_symlink_or_a_bad_file_is_refused_and_left() {
        let d = dir("link");
        std::fs::create_dir_all(d.join(".claude")).unwrap();
        let target = d.join("elsewhere.json");
        std::fs::write(&target, "{}").unwrap();
        std::os::unix::fs::symlink(&target, claude_settings(&d)).unwrap();
        assert!(add(&d, &["Bash(x)".to_string()]).unwrap_err().contains("symlink"));
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "{}");
        std::fs::remove_file(claude_settings(&d)).unwrap();
        std::fs::write(claude_settings(&d), "[1]").unwrap();
        assert!(add(&d, &["Bash(x)".to_string()]).unwrap_err().contains("not a JSON object"));
        assert_eq!(std::fs::read_to_string(claude_settings(&d)).unwrap(), "[1]");
        let _ = std::fs::remove_dir_all(&d);
    }
}
