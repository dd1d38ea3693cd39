//! Conversation artifacts on disk (ORCH 6.1, 6.2, A47): for each pinned layout the paths that carry
//! one conversation, split into what purge deletes first and what goes last (the presence lock; a
//! claude session file of a dead process), the pids a live claude session file names (holders),
//! the no-follow removal, and the residual walk.
//!
//! The agy layout (decided, docs/AGENTS.md) under `~/.gemini/antigravity-cli`:
//! `conversations/<uuid>.db` with `-wal`, `-shm`, `-journal`; `brain/<uuid>/`;
//! `annotations/<uuid>.pbtxt`; the presence lock `locks/<uuid>.lock`. Claude (A47, A58):
//! `~/.claude/projects/<cwd with / as ->/<uuid>.jsonl` (and a `<uuid>/` beside it), and
//! `~/.claude/sessions/<pid>.json` naming the uuid.
//!
//! Architecture Invariant: nothing here follows a symlink below an agent root or deletes through
//! one: every component from the root down is checked with `lstat` before a removal, a symlink is
//! left in place and reported, and the walk never descends into one. Paths are built only from a
//! uuid `canonical_uuid` returned. Never prints.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::Layout;
use crate::sys;
use crate::text::show_path;

/// One conversation's artifacts in one layout.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// The agent root: nothing outside it is touched, the residual walk starts here.
    pub root: PathBuf,
    /// Deleted first (database sidecars, database, brain, annotation; claude's transcripts).
    pub first: Vec<PathBuf>,
    /// Deleted last, after a second in-use check (agy's presence lock; dead claude session files).
    pub last: Vec<PathBuf>,
    /// Pids named by live-looking session files (claude `sessions/<pid>.json`): holders when alive.
    pub session_pids: Vec<i32>,
}

impl Plan {
    /// Every candidate path, first then last.
    pub fn all(&self) -> impl Iterator<Item = &PathBuf> {
        self.first.iter().chain(self.last.iter())
    }

    /// The candidates that exist (`lstat`: a dangling symlink exists).
    pub fn existing(&self) -> Vec<PathBuf> {
        self.all().filter(|p| lexists(p)).cloned().collect()
    }

    /// `has_artifacts` (6.1, 6.2): any single piece exists.
    pub fn has_artifacts(&self) -> bool {
        self.all().any(|p| lexists(p))
    }
}

fn lexists(p: &Path) -> bool {
    fs::symlink_metadata(p).is_ok()
}

/// The agy root under `home`.
pub fn agy_root(home: &Path) -> PathBuf {
    home.join(".gemini/antigravity-cli")
}

/// The claude root under `home`.
pub fn claude_root(home: &Path) -> PathBuf {
    home.join(".claude")
}

/// The plan of `layout` for `uuid` (already canonical) under `home`; `None` for an unpinned layout.
pub fn plan(layout: Layout, home: &Path, uuid: &str) -> Option<Plan> {
    match layout {
        Layout::Agy => Some(agy_plan(home, uuid)),
        Layout::Claude => Some(claude_plan(home, uuid)),
        Layout::Unsupported => None,
    }
}

fn agy_plan(home: &Path, uuid: &str) -> Plan {
    let root = agy_root(home);
    let db = root.join("conversations").join(format!("{uuid}.db"));
    let side = |s: &str| root.join("conversations").join(format!("{uuid}.db{s}"));
    Plan {
        first: vec![
            side("-wal"),
            side("-shm"),
            side("-journal"),
            db,
            root.join("brain").join(uuid),
            root.join("annotations").join(format!("{uuid}.pbtxt")),
        ],
        last: vec![root.join("locks").join(format!("{uuid}.lock"))],
        session_pids: Vec::new(),
        root,
    }
}

/// The entries of `dir` that are real directories (a symlinked one is not entered).
fn real_subdirs(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect();
    crate::sort::natural(&mut out);
    out
}

fn claude_plan(home: &Path, uuid: &str) -> Plan {
    let root = claude_root(home);
    let mut first = Vec::new();
    if !is_symlink(&root) && !is_symlink(&root.join("projects")) {
        for d in real_subdirs(&root.join("projects")) {
            first.push(d.join(format!("{uuid}.jsonl")));
            first.push(d.join(uuid));
        }
    }
    first.retain(|p| lexists(p));
    let mut last = Vec::new();
    let mut session_pids = Vec::new();
    let sessions = root.join("sessions");
    if !is_symlink(&root) && !is_symlink(&sessions) {
        for e in fs::read_dir(&sessions).into_iter().flatten().flatten() {
            let p = e.path();
            if !e.file_type().is_ok_and(|t| t.is_file()) || p.extension().is_none_or(|x| x != "json") {
                continue;
            }
            let Some(v) = read_json_nofollow(&p) else { continue };
            let names = v.get("sessionId").and_then(|s| s.as_str()).is_some_and(|s| s.eq_ignore_ascii_case(uuid));
            if names {
                if let Some(pid) = v.get("pid").and_then(|p| p.as_i64()).and_then(|p| i32::try_from(p).ok()) {
                    session_pids.push(pid);
                }
                last.push(p);
            }
        }
    }
    crate::sort::natural(&mut last);
    Plan { root, first, last, session_pids }
}

fn read_json_nofollow(p: &Path) -> Option<serde_json::Value> {
    use std::io::Read;
    let mut f = sys::open_nofollow_read(p).ok()?;
    let mut buf = Vec::new();
    f.by_ref().take(1 << 20).read_to_end(&mut buf).ok()?;
    serde_json::from_slice(&buf).ok()
}

fn is_symlink(p: &Path) -> bool {
    fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink())
}

/// The first symlink on the way from `root` (inclusive) down to `path` (inclusive), if any; a path
/// outside `root` is refused outright.
pub fn symlink_on_the_way(root: &Path, path: &Path) -> Result<Option<PathBuf>, String> {
    let rel = path.strip_prefix(root).map_err(|_| format!("{} is outside {}", show_path(path), show_path(root)))?;
    let mut cur = root.to_path_buf();
    if is_symlink(&cur) {
        return Ok(Some(cur));
    }
    for c in rel.components() {
        cur.push(c);
        if is_symlink(&cur) {
            return Ok(Some(cur));
        }
    }
    Ok(None)
}

/// Removes one artifact (a file, or a directory with everything in it) without following a
/// symlink: when `root`..=`path` holds one, nothing is removed and the error says where.
pub fn remove(root: &Path, path: &Path) -> Result<bool, String> {
    if let Some(link) = symlink_on_the_way(root, path)? {
        return Err(format!("{} is a symlink, not followed", show_path(&link)));
    }
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(format!("cannot stat {}: {e}", show_path(path))),
    };
    // remove_dir_all removes symlinks inside as entries and never descends through them.
    let r = if meta.is_dir() { fs::remove_dir_all(path) } else { fs::remove_file(path) };
    match r {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(format!("cannot remove {}: {e}", show_path(path))),
    }
}

/// `residual_artifacts` (6.2, 6.4): every path under `root` (inclusive of symlinks, never
/// descending into one) with a component below `root` that contains `uuid`, case-insensitive;
/// plus, for claude, the session files still naming it.
pub fn residual(layout: Layout, home: &Path, uuid: &str) -> Vec<PathBuf> {
    let Some(p) = plan(layout, home, uuid) else { return Vec::new() };
    let mut out = Vec::new();
    if !is_symlink(&p.root) {
        walk(&p.root, &uuid.to_ascii_lowercase(), false, &mut out, 0);
    }
    for l in p.last {
        if lexists(&l) && !out.contains(&l) {
            out.push(l);
        }
    }
    crate::sort::natural(&mut out);
    out
}

fn walk(dir: &Path, uuid: &str, carried: bool, out: &mut Vec<PathBuf>, depth: usize) {
    if depth > 32 {
        return;
    }
    let Ok(rd) = fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().to_ascii_lowercase();
        let here = carried || name.contains(uuid);
        if here {
            out.push(p.clone());
        }
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            walk(&p, uuid, here, out, depth + 1);
        }
    }
}

/// The files under `path` (itself when it is a file), never through a symlink: what lsof and the
/// `/proc/*/fd` scan are asked about.
pub fn files_for_holders(path: &Path) -> Vec<PathBuf> {
    let Ok(m) = fs::symlink_metadata(path) else { return Vec::new() };
    if m.file_type().is_symlink() {
        return Vec::new();
    }
    let mut out = vec![path.to_path_buf()];
    if m.is_dir() {
        let mut stack = vec![path.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in fs::read_dir(&d).into_iter().flatten().flatten() {
                let t = e.file_type();
                if t.as_ref().is_ok_and(|t| t.is_dir()) {
                    stack.push(e.path());
                }
                if t.is_ok_and(|t| !t.is_symlink()) {
                    out.push(e.path());
                }
            }
            if out.len() > 10_000 {
                break;
            }
        }
    }
    out
}

/// codex's conversation id, learnt after start (6.1, A58): the uuid at the end of the newest
/// `~/.codex/sessions/YYYY/MM/DD/rollout-<stamp>-<uuid>.jsonl` modified since `since_ms` whose first
/// line (`session_meta`) records `cwd`. Never follows a symlink; reads at most 64 KiB of a file.
pub fn codex_rollout_id(home: &Path, cwd: &Path, since_ms: u64) -> Option<String> {
    use std::io::Read;
    let root = home.join(".codex/sessions");
    if is_symlink(&home.join(".codex")) || is_symlink(&root) {
        return None;
    }
    let want = cwd.to_string_lossy().into_owned();
    let want_canon = fs::canonicalize(cwd).map(|p| p.to_string_lossy().into_owned()).unwrap_or_else(|_| want.clone());
    let mut best: Option<(std::time::SystemTime, String)> = None;
    for y in real_subdirs(&root) {
        for m in real_subdirs(&y) {
            for d in real_subdirs(&m) {
                for e in fs::read_dir(&d).into_iter().flatten().flatten() {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let Some(stem) = name.strip_prefix("rollout-").and_then(|n| n.strip_suffix(".jsonl")) else {
                        continue;
                    };
                    let Some(id) = stem.len().checked_sub(36).and_then(|i| super::canonical_uuid(&stem[i..])) else {
                        continue;
                    };
                    let Ok(meta) = e.metadata() else { continue };
                    let Ok(mtime) = meta.modified() else { continue };
                    let ms = mtime.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
                    if !meta.is_file() || ms + 2000 < since_ms {
                        continue;
                    }
                    // Issue 30: a conversation begun before this start is another session's, however
                    // recently that one wrote to it (codex's ids are uuidv7: their first 48 bits are
                    // the creation time in ms).
                    if uuid_v7_ms(&id).is_some_and(|created| created + 2000 < since_ms) {
                        continue;
                    }
                    let Ok(mut f) = sys::open_nofollow_read(&e.path()) else { continue };
                    let mut buf = Vec::new();
                    let _ = f.by_ref().take(64 * 1024).read_to_end(&mut buf);
                    let first = buf.split(|b| *b == b'\n').next().unwrap_or(&[]);
                    let Ok(v) = serde_json::from_slice::<serde_json::Value>(first) else { continue };
                    let c = v.pointer("/payload/cwd").or_else(|| v.get("cwd")).and_then(|c| c.as_str()).unwrap_or("");
                    if c != want && c != want_canon {
                        continue;
                    }
                    if best.as_ref().is_none_or(|(t, _)| mtime > *t) {
                        best = Some((mtime, id));
                    }
                }
            }
        }
    }
    best.map(|(_, id)| id)
}

/// The creation time (ms since the epoch) a version-7 uuid carries in its first 48 bits.
fn uuid_v7_ms(id: &str) -> Option<u64> {
    let hex: String = id.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 || hex.as_bytes()[12] != b'7' {
        return None;
    }
    u64::from_str_radix(&hex[..12], 16).ok()
}

/// The uuid of the codex rollout one of `pids` holds open under `<home>/.codex/sessions` (codex keeps
/// its session's rollout file open while it runs): exact where several codex sessions work in one
/// directory and the newest rollout may be another's (issue 30).
pub fn codex_rollout_held_by(pids: &[i32], home: &Path) -> Option<String> {
    let root = home.join(".codex/sessions");
    for &pid in pids {
        let Ok(rd) = fs::read_dir(format!("/proc/{pid}/fd")) else { continue };
        for e in rd.flatten() {
            let Ok(target) = fs::read_link(e.path()) else { continue };
            if !target.starts_with(&root) {
                continue;
            }
            let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let Some(stem) = name.strip_prefix("rollout-").and_then(|n| n.strip_suffix(".jsonl")) else { continue };
            if let Some(id) = stem.len().checked_sub(36).and_then(|i| super::canonical_uuid(&stem[i..])) {
                return Some(id);
            }
        }
    }
    None
}

/// opencode's conversation id, learnt without its sqlite database (A58): opencode logs every session
/// it creates to `<data home>/opencode/log/*.log` as a `key=value` line, `timestamp=<ISO> … message=created
/// id=ses_<alnum> … directory=<cwd> … parentID=undefined` (a sub-agent's session names its parent).
/// The id of the newest such line for `cwd` at or after `since_ms` (2 s of slack), from the last
/// 1 MiB of each log file modified since then. Never follows a symlink.
pub fn opencode_log_id(data_home: &Path, cwd: &Path, since_ms: u64) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    let root = data_home.join("opencode");
    let dir = root.join("log");
    if is_symlink(&root) || is_symlink(&dir) {
        return None;
    }
    let want = cwd.to_string_lossy().into_owned();
    let want_canon = fs::canonicalize(cwd).map(|p| p.to_string_lossy().into_owned()).unwrap_or_else(|_| want.clone());
    let since = since_ms.saturating_sub(2000);
    let mut best: Option<(u64, String)> = None;
    for e in fs::read_dir(&dir).into_iter().flatten().flatten() {
        if !e.file_name().to_string_lossy().ends_with(".log") {
            continue;
        }
        let Ok(meta) = fs::symlink_metadata(e.path()) else { continue };
        let mtime = meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
        if !meta.is_file() || mtime.is_none_or(|t| (t.as_millis() as u64) < since) {
            continue;
        }
        let Ok(mut f) = sys::open_nofollow_read(&e.path()) else { continue };
        const TAIL: u64 = 1 << 20;
        if meta.len() > TAIL && f.seek(SeekFrom::Start(meta.len() - TAIL)).is_err() {
            continue;
        }
        let mut buf = Vec::new();
        let _ = f.take(TAIL).read_to_end(&mut buf);
        for line in String::from_utf8_lossy(&buf).lines() {
            let Some((at, id)) = opencode_created(line, &want, &want_canon) else { continue };
            if at >= since && best.as_ref().is_none_or(|(t, _)| at >= *t) {
                best = Some((at, id));
            }
        }
    }
    best.map(|(_, id)| id)
}

/// `(timestamp ms, id)` of one opencode log line announcing a top-level session created in `cwd`
/// (either spelling of it).
fn opencode_created(line: &str, cwd: &str, cwd_canon: &str) -> Option<(u64, String)> {
    let fields = log_fields(line);
    let get = |k: &str| fields.iter().find(|(key, _)| *key == k).map(|(_, v)| v.as_str());
    if get("message") != Some("created") || get("parentID").is_some_and(|p| p != "undefined") {
        return None;
    }
    let dir = get("directory")?;
    if dir != cwd && dir != cwd_canon {
        return None;
    }
    let id = get("id")?;
    let tail = id.strip_prefix("ses_")?;
    if tail.is_empty() || tail.len() > 64 || !tail.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return None;
    }
    Some((crate::clock::parse_ts(get("timestamp")?)?, id.to_string()))
}

/// The `key=value` fields of a log line; a value in double quotes may hold spaces (`\"` escapes).
fn log_fields(line: &str) -> Vec<(&str, String)> {
    let mut out = Vec::new();
    let mut rest = line.trim_start();
    while let Some(eq) = rest.find('=') {
        let key = &rest[..eq];
        if key.is_empty() || key.contains(' ') {
            // A stray word: skip it.
            let skip = rest.find(' ').map(|i| i + 1).unwrap_or(rest.len());
            rest = rest[skip..].trim_start();
            continue;
        }
        let v = &rest[eq + 1..];
        let (value, next) = if let Some(q) = v.strip_prefix('"') {
            let mut val = String::new();
            let mut end = q.len();
            let mut esc = false;
            for (i, c) in q.char_indices() {
                match (esc, c) {
                    (true, c) => {
                        val.push(c);
                        esc = false;
                    }
                    (false, '\\') => esc = true,
                    (false, '"') => {
                        end = i + 1;
                        break;
                    }
                    (false, c) => val.push(c),
                }
            }
            (val, &q[end.min(q.len())..])
        } else {
            let end = v.find(' ').unwrap_or(v.len());
            (v[..end].to_string(), &v[end..])
        };
        out.push((key, value));
        rest = next.trim_start();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uuid_v7_carries_its_creation_time() {
        assert_eq!(uuid_v7_ms("01a247f7-1eed-74b0-a0da-109b0876b3cb"), Some(0x01a2_47f7_1eed));
        assert_eq!(uuid_v7_ms("01a247f7-1eed-44b0-a0da-109b0876b3cb"), None, "version 4");
        assert_eq!(uuid_v7_ms("nonsense"), None);
    }

    #[test]
    fn opencode_ids_come_from_its_log() {
        let data = tmp();
        let ws = tmp();
        let log = data.join("opencode/log");
        sys::create_dir_all(&log).unwrap();
        let w = ws.to_string_lossy().into_owned();
        let line = |ts: &str, id: &str, dir: &str, parent: &str| {
            format!(
                "timestamp={ts} level=INFO run=d6b73e33 message=created id={id} slug=eager-panda version=1.18.33 \
                 projectID=global directory={dir} path=x workspaceID=undefined parentID={parent} \
                 title=\"New session - {ts}\" agent=build\n"
            )
        };
        let text = [
            "timestamp=2026-12-01T20:24:31.919Z level=INFO run=d6b73e33 message=\"creating instance\" directory=/x\n"
                .to_string(),
            line("2026-12-01T20:24:43.060Z", "ses_dccb80ccbffeF4Vmhk9CLHfYZG", &w, "undefined"),
            line("2026-12-01T20:24:50.000Z", "ses_child1", &w, "ses_dccb80ccbffeF4Vmhk9CLHfYZG"),
            line("2026-12-01T20:24:51.000Z", "ses_otherdir", "/elsewhere", "undefined"),
            line("2026-12-01T20:24:52.000Z", "ses_bad/../x", &w, "undefined"),
        ]
        .concat();
        sys::write_file(&log.join("opencode.log"), text.as_bytes()).unwrap();
        let at = crate::clock::parse_ts("2026-12-01T20:24:40.000Z").unwrap();
        assert_eq!(opencode_log_id(&data, &ws, at).as_deref(), Some("ses_dccb80ccbffeF4Vmhk9CLHfYZG"));
        // Created before the row started (2 s of slack): not this row's.
        let late = crate::clock::parse_ts("2026-12-01T20:24:46.000Z").unwrap();
        assert_eq!(opencode_log_id(&data, &ws, late), None);
        assert_eq!(opencode_log_id(&data, &data, at), None);
        // A symlinked log directory is never read.
        let real = tmp();
        let data2 = tmp();
        sys::create_dir_all(&data2.join("opencode")).unwrap();
        std::os::unix::fs::symlink(&log, data2.join("opencode/log")).unwrap();
        assert_eq!(opencode_log_id(&data2, &ws, at), None);
        for d in [data, ws, real, data2] {
            let _ = fs::remove_dir_all(d);
        }
    }

    fn tmp() -> PathBuf {
        let d = std::env::temp_dir().join(format!("mam-art-{}", sys::random_hex(6).unwrap()));
        sys::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn removal_never_goes_through_a_symlink() {
        let home = tmp();
        let outside = home.join("outside");
        sys::create_dir_all(&outside).unwrap();
        sys::write_file(&outside.join("victim.db"), b"x").unwrap();
        let root = agy_root(&home);
        sys::create_dir_all(&root).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("conversations")).unwrap();
        let p = root.join("conversations/victim.db");
        let e = remove(&root, &p).unwrap_err();
        assert!(e.contains("is a symlink, not followed"), "{e}");
        assert!(outside.join("victim.db").exists());
        assert!(remove(&root, &home.join("elsewhere")).is_err(), "outside the root");
        fs::remove_dir_all(&home).unwrap();
    }
}
