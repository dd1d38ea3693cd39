//! `mam session import-yaml` (ORCH 0.6): converts a legacy YAML sessions file to the JSON document of
//! 2.2 once, keeping the original beside it as `<stem>.yaml.bak`.
//!
//! serde_json is the only serialiser, so this holds a small reader for the YAML the legacy scripts
//! wrote: block mappings and sequences by indentation, plain/single/double-quoted scalars, `null`
//! `~` `true` `false` integers, `[]`/`{}` and flow lists of scalars, `#` comments and a leading
//! `---`. Anything else (anchors, aliases, tags, block scalars, nested flow collections) is refused
//! with the line number rather than guessed at. Never prints.

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{Map, Number, Value};

use super::{SessionError, Sessions};
use crate::text::show_path;

/// One meaningful line: its 1-based number, indentation and text without comment.
#[derive(Debug, Clone)]
struct Line {
    no: usize,
    indent: usize,
    text: String,
}

fn strip_comment(s: &str) -> &str {
    let (mut single, mut double) = (false, false);
    let b = s.as_bytes();
    for (i, &c) in b.iter().enumerate() {
        match c {
            b'\'' if !double => single = !single,
            b'"' if !single => double = !double,
            b'#' if !single && !double && (i == 0 || b[i - 1] == b' ' || b[i - 1] == b'\t') => return &s[..i],
            _ => {}
        }
    }
    s
}

fn lines(text: &str) -> Result<Vec<Line>, String> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let no = i + 1;
        let body = strip_comment(raw).trim_end();
        if body.trim().is_empty() || (out.is_empty() && body.trim() == "---") {
            continue;
        }
        if body.trim() == "..." {
            break;
        }
        let indent = body.len() - body.trim_start_matches(' ').len();
        if body[indent..].starts_with('\t') {
            return Err(format!("line {no}: tab indentation is not YAML"));
        }
        out.push(Line { no, indent, text: body[indent..].to_string() });
    }
    Ok(out)
}

/// A reader over the meaningful lines.
struct Reader {
    lines: Vec<Line>,
    pos: usize,
}

impl Reader {
    fn peek(&self) -> Option<&Line> {
        self.lines.get(self.pos)
    }

    /// A block starting at the current line with exactly `indent`.
    fn block(&mut self, indent: usize) -> Result<Value, String> {
        let Some(first) = self.peek() else { return Ok(Value::Null) };
        if first.text == "-" || first.text.starts_with("- ") {
            self.sequence(indent)
        } else {
            self.mapping(indent, None)
        }
    }

    /// The value of a key or item whose inline part was empty: a deeper block, a sequence at the
    /// same indentation (`key:\n- a`, for mappings only), or null.
    fn nested(&mut self, indent: usize, seq_same_level: bool) -> Result<Value, String> {
        match self.peek() {
            Some(l) if l.indent > indent => {
                let i = l.indent;
                self.block(i)
            }
            Some(l) if seq_same_level && l.indent == indent && (l.text == "-" || l.text.starts_with("- ")) => {
                self.sequence(indent)
            }
            _ => Ok(Value::Null),
        }
    }

    fn sequence(&mut self, indent: usize) -> Result<Value, String> {
        let mut items = Vec::new();
        while let Some(l) = self.peek().cloned() {
            if l.indent < indent {
                break;
            }
            if l.indent > indent {
                return Err(format!("line {}: unexpected indentation", l.no));
            }
            let rest = if l.text == "-" {
                ""
            } else if let Some(r) = l.text.strip_prefix("- ") {
                r
            } else {
                break;
            };
            self.pos += 1;
            let rest = rest.trim_start();
            if rest.is_empty() {
                items.push(self.nested(indent, false)?);
            } else if key_split(rest).is_some() {
                // `- key: value` opens a mapping whose later keys sit under the first one.
                let inner = indent + (l.text.len() - rest.len());
                items.push(self.mapping(inner, Some((l.no, rest.to_string())))?);
            } else {
                items.push(scalar(rest, l.no)?);
            }
        }
        Ok(Value::Array(items))
    }

    fn mapping(&mut self, indent: usize, first: Option<(usize, String)>) -> Result<Value, String> {
        let mut map = Map::new();
        let mut pending = first;
        loop {
            let (no, text) = match pending.take() {
                Some(p) => p,
                None => match self.peek().cloned() {
                    Some(l) if l.indent == indent && !(l.text == "-" || l.text.starts_with("- ")) => {
                        self.pos += 1;
                        (l.no, l.text)
                    }
                    Some(l) if l.indent > indent => return Err(format!("line {}: unexpected indentation", l.no)),
                    _ => break,
                },
            };
            let (k, v) = key_split(&text).ok_or_else(|| format!("line {no}: expected `key: value`"))?;
            let key = match scalar(k, no)? {
                Value::String(s) => s,
                other => other.to_string(),
            };
            let value = if v.is_empty() { self.nested(indent, true)? } else { scalar(v, no)? };
            if map.insert(key.clone(), value).is_some() {
                return Err(format!("line {no}: duplicate key '{key}'"));
            }
        }
        Ok(Value::Object(map))
    }
}

/// Splits `key: value` at the first `: ` (or a trailing `:`) outside quotes.
fn key_split(s: &str) -> Option<(&str, &str)> {
    let (mut single, mut double) = (false, false);
    let b = s.as_bytes();
    for i in 0..b.len() {
        match b[i] {
            b'\'' if !double => single = !single,
            b'"' if !single => double = !double,
            b':' if !single && !double && (i + 1 == b.len() || b[i + 1] == b' ') => {
                return Some((s[..i].trim(), s[i + 1..].trim()));
            }
            _ => {}
        }
    }
    None
}

fn scalar(s: &str, no: usize) -> Result<Value, String> {
    let s = s.trim();
    if let Some(inner) = s.strip_prefix('\'') {
        let body = inner.strip_suffix('\'').ok_or_else(|| format!("line {no}: unterminated quote"))?;
        return Ok(Value::String(body.replace("''", "'")));
    }
    if let Some(inner) = s.strip_prefix('"') {
        let body = inner.strip_suffix('"').ok_or_else(|| format!("line {no}: unterminated quote"))?;
        return unescape(body).map(Value::String).ok_or_else(|| format!("line {no}: unsupported escape"));
    }
    if s.starts_with(['&', '*', '!', '|', '>', '%', '@', '`']) {
        return Err(format!("line {no}: unsupported YAML construct '{}'", crate::text::one_line(s)));
    }
    if s == "{}" {
        return Ok(Value::Object(Map::new()));
    }
    if let Some(inner) = s.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
        if inner.trim().is_empty() {
            return Ok(Value::Array(Vec::new()));
        }
        if inner.contains(['[', '{']) {
            return Err(format!("line {no}: nested flow collections are not supported"));
        }
        return inner.split(',').map(|p| scalar(p, no)).collect::<Result<Vec<_>, _>>().map(Value::Array);
    }
    if s.starts_with(['[', '{']) {
        return Err(format!("line {no}: unsupported flow collection"));
    }
    Ok(match s {
        "" | "~" | "null" | "Null" | "NULL" => Value::Null,
        "true" | "True" | "TRUE" => Value::Bool(true),
        "false" | "False" | "FALSE" => Value::Bool(false),
        _ => match s.parse::<i64>() {
            Ok(n) if !(s.starts_with('+') || (s.len() > 1 && s.starts_with('0'))) => Value::Number(Number::from(n)),
            _ => Value::String(s.to_string()),
        },
    })
}

fn unescape(s: &str) -> Option<String> {
    let mut out = String::new();
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        out.push(match it.next()? {
            'n' => '\n',
            't' => '\t',
            'r' => '\r',
            '0' => '\0',
            '"' => '"',
            '\\' => '\\',
            '/' => '/',
            ' ' => ' ',
            _ => return None,
        });
    }
    Some(out)
}

/// Parses the supported YAML subset into a JSON value.
pub fn parse(text: &str) -> Result<Value, String> {
    let ls = lines(text)?;
    if ls.is_empty() {
        return Ok(Value::Null);
    }
    let indent = ls[0].indent;
    let mut r = Reader { lines: ls, pos: 0 };
    let v = r.block(indent)?;
    if let Some(l) = r.peek() {
        return Err(format!("line {}: unexpected content", l.no));
    }
    Ok(v)
}

/// The legacy row layout to the row of 2.2: pane fields kept at the top level of a row
/// (`pane_id`, `herdr_pane`, `server`/`herdr_session`, `workspace_id`, `cwd`, `cmd_full`) move into
/// `pane`; a bare `orchestrator_uuid` joins `orchestrator_uuids`; everything else stays verbatim.
pub fn convert(v: Value) -> Result<Sessions, String> {
    let mut top = match v {
        Value::Object(m) => m,
        Value::Null => Map::new(),
        _ => return Err("the document is not a mapping".into()),
    };
    let rows = match top.shift_remove("herdr_sessions") {
        Some(Value::Array(a)) => a,
        Some(Value::Null) | None => Vec::new(),
        Some(_) => return Err("herdr_sessions is not a list".into()),
    };
    let mut out_rows = Vec::new();
    for (i, r) in rows.into_iter().enumerate() {
        let Value::Object(mut m) = r else { return Err(format!("herdr_sessions[{i}] is not a mapping")) };
        let mut pane = match m.shift_remove("pane") {
            Some(Value::Object(p)) => p,
            Some(Value::String(id)) => Map::from_iter([("id".to_string(), Value::String(id))]),
            _ => Map::new(),
        };
        for (legacy, field) in [
            ("pane_id", "id"),
            ("herdr_pane", "id"),
            ("server", "server"),
            ("herdr_session", "server"),
            ("workspace_id", "workspace_id"),
            ("cwd", "cwd"),
            ("cmd_full", "cmd_full"),
        ] {
            if let Some(v) = m.shift_remove(legacy) {
                pane.entry(field.to_string()).or_insert(v);
            }
        }
        for v in pane.values_mut() {
            if let Value::Number(n) = v {
                *v = Value::String(n.to_string());
            }
        }
        if !pane.is_empty() {
            m.insert("pane".into(), Value::Object(pane));
        }
        out_rows.push(Value::Object(m));
    }
    let mut uuids: Vec<Value> = match top.shift_remove("orchestrator_uuids") {
        Some(Value::Array(a)) => a,
        Some(Value::Null) | None => Vec::new(),
        Some(v @ Value::String(_)) => vec![v],
        Some(_) => return Err("orchestrator_uuids is not a list".into()),
    };
    if let Some(u @ Value::String(_)) = top.shift_remove("orchestrator_uuid") {
        if !uuids.contains(&u) {
            uuids.push(u);
        }
    }
    top.insert("version".into(), Value::from(1));
    top.insert("herdr_sessions".into(), Value::Array(out_rows));
    top.insert("orchestrator_uuids".into(), Value::Array(uuids));
    serde_json::from_value(Value::Object(top)).map_err(|e| format!("rows do not fit the sessions layout: {e}"))
}

/// The backup name: the file's stem with `.yaml.bak` (`agent_sessions.json` and `agent_sessions.yaml`
/// both keep their original as `agent_sessions.yaml.bak`).
pub fn backup_path(file: &Path) -> PathBuf {
    let stem = file.file_stem().map(|s| s.to_os_string()).unwrap_or_default();
    let mut name = stem;
    name.push(".yaml.bak");
    file.with_file_name(name)
}

/// What an import did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Imported {
    /// The file already is JSON: nothing to do.
    AlreadyJson,
    /// Converted: the row count and the backup.
    Converted { rows: usize, backup: PathBuf },
}

/// Converts `source` (default: the sessions file itself) into the JSON sessions file `target`, under
/// the sessions lock. Refused (rc 2, nothing changed) when the source cannot be read as the YAML
/// subset, when the backup already exists, or when a different target already holds rows.
pub fn import(source: &Path, target: &Path) -> Result<Imported, SessionError> {
    let text = match fs::read(source) {
        Ok(b) => b,
        Err(e) => return Err(SessionError::Refused(format!("cannot read {}: {e}", show_path(source)))),
    };
    let doc = match Sessions::parse(source, &text) {
        Ok(_) if source == target => return Ok(Imported::AlreadyJson),
        Ok(doc) => doc,
        Err(_) => {
            let text = String::from_utf8(text)
                .map_err(|_| SessionError::Refused(format!("{} is not UTF-8 text", show_path(source))))?;
            let value = parse(&text).map_err(|e| SessionError::Refused(format!("{}: {e}", show_path(source))))?;
            convert(value).map_err(|e| SessionError::Refused(format!("{}: {e}", show_path(source))))?
        }
    };
    let backup = backup_path(source);
    if fs::symlink_metadata(&backup).is_ok() {
        return Err(SessionError::Refused(format!("backup {} already exists", show_path(&backup))));
    }
    let rows = doc.herdr_sessions.len();
    update_raw(target, source, &backup, doc)?;
    Ok(Imported::Converted { rows, backup })
}

/// Writes `doc` to `target` under its lock after keeping `source` as `backup`. The target is read
/// raw (it may be the YAML source itself, which `update` would refuse).
fn update_raw(target: &Path, source: &Path, backup: &Path, doc: Sessions) -> Result<(), SessionError> {
    use crate::sys::{self, Flock, LockMode};
    if let Some(dir) = target.parent() {
        sys::create_dir_all(dir).map_err(|e| super::io_failed("create", dir, e))?;
    }
    let lp = super::lock_path(target);
    let _lock = Flock::lock_path(&lp, LockMode::Exclusive).map_err(|e| super::io_failed("lock", &lp, e))?;
    if target != source {
        if let Ok(b) = fs::read(target) {
            let existing = Sessions::parse(target, &b)?;
            if !existing.herdr_sessions.is_empty() {
                return Err(SessionError::Refused(format!(
                    "{} already holds {} row(s); import into an empty sessions file",
                    show_path(target),
                    existing.herdr_sessions.len()
                )));
            }
        }
    }
    fs::read(source)
        .and_then(|b| sys::atomic_write(backup, &b))
        .map_err(|e| super::io_failed("back up to", backup, e))?;
    sys::atomic_write(target, &doc.to_bytes()).map_err(|e| super::io_failed("write", target, e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_the_legacy_layout() {
        let text = "---\n# sessions\nherdr_sessions:\n  - name: claude-01   # first\n    agent: claude\n    status: running\n    pane_id: '3'\n    cwd: \"/w/a b\"\n    control_plane:\n      workspace_root: /w\n      mam_jobs_dir: /w/.mam/jobs\n    herdr_confirmed: true\n    tags: [a, 'b c']\n    port: 12\n  - name: x\n    empty:\norchestrator_uuids:\n- 123e4567-e89b-12d3-a456-426614174000\n";
        let v = parse(text).unwrap();
        assert_eq!(v["herdr_sessions"][0]["cwd"], "/w/a b");
        assert_eq!(v["herdr_sessions"][0]["pane_id"], "3");
        assert_eq!(v["herdr_sessions"][0]["port"], 12);
        assert_eq!(v["herdr_sessions"][0]["tags"], json!(["a", "b c"]));
        assert_eq!(v["herdr_sessions"][1]["empty"], Value::Null);
        assert_eq!(v["orchestrator_uuids"][0], "123e4567-e89b-12d3-a456-426614174000");
        let doc = convert(v).unwrap();
        let r = doc.row("claude-01").unwrap();
        assert_eq!(r.pane_id(), Some("3"));
        assert_eq!(r.cwd(), Some("/w/a b"));
        assert_eq!(r.control_plane.as_ref().unwrap().mam_jobs_dir.as_deref(), Some("/w/.mam/jobs"));
        assert_eq!(r.extra["tags"], json!(["a", "b c"]));
        assert_eq!(doc.orchestrator_uuids.len(), 1);
    }

    #[test]
    fn refuses_what_it_does_not_know() {
        for bad in ["a: &x 1\n", "a: *x\n", "a: |\n  text\n", "a: [1, [2]]\n", "a: 1\n  b: 2\n", "a: 'open\n"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        assert!(convert(json!({"herdr_sessions": 3})).is_err());
        assert!(convert(json!([1])).is_err());
    }

    #[test]
    fn backup_name() {
        assert_eq!(backup_path(Path::new("/a/agent_sessions.json")), PathBuf::from("/a/agent_sessions.yaml.bak"));
        assert_eq!(backup_path(Path::new("/a/agent_sessions.yaml")), PathBuf::from("/a/agent_sessions.yaml.bak"));
    }
}
