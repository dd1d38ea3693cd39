//! The filesystem steps of install, update and remove, all through `crate::sys`: every step walks
//! from the target's directory (opened once per run) one component at a time with
//! `O_NOFOLLOW|O_DIRECTORY` and acts with the *at() calls on the directory it opened, so no symlink
//! is followed and no component swapped for one after a check can redirect a write or a delete
//! (issue 29, docs/SECURITY.md "install, update, remove"). Every directory under `.mam/` walked
//! through, and every file read under `.mam/install/` (ledgers, the update backup), must be the
//! user's or root's and not writable by group or others unless `MAM_TRUSTED_ROOTS` lists it;
//! `.gitignore` must be a regular text file of the user's or root's. Files are written by temp +
//! rename with a mode of at most 0o777, local edits are moved aside (never deleted), stray temp
//! files of an interrupted run are removed, and every change counts one step for the test hooks.
//! Paths here are target-relative ledger paths (checked by `ledger::check_path`); a path with an
//! empty, `.` or `..` component, or an absolute one, is refused here too.

use std::io::{self, Read};
use std::ops::Deref;
use std::path::{Path, PathBuf};

pub use super::tree::Tree;
use super::{Hooks, InstallError};
use crate::sys::{self, Dir, EntryKind, EntryStat};

/// The trust rule on one opened file or directory (`Tree::judge`), as an install refusal.
fn judge(t: &Tree, shown: &Path, st: EntryStat) -> Result<(), InstallError> {
    t.judge(shown, st).map_err(|why| InstallError::Untrusted { path: shown.to_path_buf(), why })
}

/// The change counter behind `MAM_TEST_INSTALL_FAIL_AFTER` / `MAM_TEST_INSTALL_KILL_AFTER`.
#[derive(Debug)]
pub struct Steps {
    n: u64,
    hooks: Hooks,
}

impl Steps {
    pub fn new(hooks: Hooks) -> Steps {
        Steps { n: 0, hooks }
    }

    /// One change is done: the hooks may end the run here.
    pub fn step(&mut self) -> Result<(), InstallError> {
        self.n += 1;
        if self.hooks.kill_after == Some(self.n) {
            // A real SIGKILL at a chosen point: nothing of ours runs after it.
            let _ = sys::kill(std::process::id() as i32, libc::SIGKILL);
        }
        if self.hooks.fail_after == Some(self.n) {
            return Err(InstallError::Injected(self.n));
        }
        Ok(())
    }

    /// The hooks stop counting (the restore after a failure must run to its end).
    pub fn disarm(&mut self) {
        self.hooks = Hooks::default();
    }
}

/// What is at a path, read without following a symlink.
#[derive(Debug, PartialEq, Eq)]
pub enum Found {
    Missing,
    File {
        bytes: Vec<u8>,
        mode: u32,
    },
    /// A symlink, directory or special file: never an asset of ours.
    Other,
}

/// `rel` under the target, for messages and the few path-based reads: a leading `/` is dropped, so
/// an absolute path never replaces the base.
pub fn abs(target: &Path, rel: &str) -> PathBuf {
    target.join(rel.trim_start_matches('/').trim_end_matches('/'))
}

/// The components of a target-relative path; an absolute path or an empty, `.` or `..` component
/// is refused (the walk must never leave the target).
fn components<'a>(t: &Tree, rel: &'a str) -> Result<Vec<&'a str>, InstallError> {
    let body = rel.strip_suffix('/').unwrap_or(rel);
    let parts: Vec<&str> = body.split('/').collect();
    if rel.starts_with('/') || parts.iter().any(|c| c.is_empty() || *c == "." || *c == "..") {
        return Err(InstallError::io(
            "use",
            &abs(t, rel),
            io::Error::other(format!("'{}' is not a plain path inside the target", crate::text::one_line(rel))),
        ));
    }
    Ok(parts)
}

fn walk_error(what: &'static str, p: &Path, e: io::Error) -> InstallError {
    let e = match e.raw_os_error() {
        Some(libc::ELOOP) => io::Error::other("is a symbolic link; not followed (docs/SECURITY.md)"),
        Some(libc::ENOTDIR) => io::Error::other("is not a directory"),
        _ => e,
    };
    InstallError::io(what, p, e)
}

/// A directory reached by a walk: the target's own, or one opened below it.
enum At<'a> {
    Root(&'a Dir),
    Sub(Dir),
}

impl Deref for At<'_> {
    type Target = Dir;
    fn deref(&self) -> &Dir {
        match self {
            At::Root(d) => d,
            At::Sub(d) => d,
        }
    }
}

/// The directory holding `rel`'s last component (opened component by component, never through a
/// link; with `create`, missing ones made 0755) and that name; `None` when a directory on the way
/// is missing. Every directory under `.mam/` is judged by the trust rule on its descriptor.
fn parent<'a, 'r>(t: &'a Tree, rel: &'r str, create: bool) -> Result<Option<(At<'a>, &'r str)>, InstallError> {
    let parts = components(t, rel)?;
    let (name, dirs) = parts.split_last().ok_or_else(|| InstallError::io("use", t, io::Error::other("empty path")))?;
    let mut at = At::Root(t.root());
    let mut shown = t.path().to_path_buf();
    let judged = parts.first() == Some(&".mam");
    for c in dirs {
        shown.push(c);
        let next = match at.open_dir(c.as_ref()) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound && create => {
                match at.make_dir(c.as_ref(), 0o755) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(walk_error("create", &shown, e)),
                }
                at.open_dir(c.as_ref()).map_err(|e| walk_error("use", &shown, e))?
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            // O_NOFOLLOW|O_DIRECTORY on a link to a directory is ENOTDIR: name what is there.
            Err(_) if at.stat(c.as_ref()).is_ok_and(|s| s.is_some_and(|s| s.kind == EntryKind::Link)) => {
                return Err(walk_error("use", &shown, io::Error::from_raw_os_error(libc::ELOOP)))
            }
            Err(e) => return Err(walk_error("use", &shown, e)),
        };
        if judged {
            let st = next.own_stat().map_err(|e| InstallError::io("use", &shown, e))?;
            judge(t, &shown, st)?;
        }
        at = At::Sub(next);
    }
    Ok(Some((at, name)))
}

pub fn read(t: &Tree, rel: &str) -> Result<Found, InstallError> {
    let p = abs(t, rel);
    let Some((dir, name)) = parent(t, rel, false)? else { return Ok(Found::Missing) };
    match dir.stat(name.as_ref()).map_err(|e| InstallError::io("read", &p, e))? {
        None => return Ok(Found::Missing),
        Some(st) if st.kind != EntryKind::File => return Ok(Found::Other),
        Some(_) => {}
    }
    let (mut f, st) = match dir.open_file(name.as_ref()) {
        Ok(x) => x,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Found::Missing),
        // Replaced by a link or something else since the stat: not ours either way.
        Err(_) => return Ok(Found::Other),
    };
    if rel.starts_with(".mam/install/") {
        judge(t, &p, st)?;
    }
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes).map_err(|e| InstallError::io("read", &p, e))?;
    Ok(Found::File { bytes, mode: st.mode })
}

/// The bytes of a regular file, `None` when missing (or not a regular file).
pub fn read_bytes(t: &Tree, rel: &str) -> Result<Option<Vec<u8>>, InstallError> {
    Ok(match read(t, rel)? {
        Found::File { bytes, .. } => Some(bytes),
        _ => None,
    })
}

/// True when something (of any kind) is at `rel`.
pub fn exists(t: &Tree, rel: &str) -> Result<bool, InstallError> {
    let Some((dir, name)) = parent(t, rel, false)? else { return Ok(false) };
    Ok(dir.stat(name.as_ref()).map_err(|e| InstallError::io("use", &abs(t, rel), e))?.is_some())
}

/// The target's `.gitignore` (issue 29): `None` when there is none; refused when it is not a regular
/// file, not the user's or root's (unless `MAM_TRUSTED_ROOTS` lists it), or not text (a NUL byte:
/// a program, not patterns). Returns its bytes and its mode without any bit above 0o777.
pub fn read_gitignore(t: &Tree) -> Result<Option<(Vec<u8>, u32)>, InstallError> {
    let p = abs(t, ".gitignore");
    let show = crate::text::show_path(&p);
    let (mut f, st) = match t.root().open_file(".gitignore".as_ref()) {
        Ok(x) => x,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(_) => return Err(InstallError::BadTarget(format!("{show} is not a regular file"))),
    };
    if let Err(why) = t.judge_owner(&p, st.uid) {
        return Err(InstallError::Untrusted { path: p, why });
    }
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes).map_err(|e| InstallError::io("read", &p, e))?;
    if let Some(at) = bytes.iter().position(|b| *b == 0) {
        return Err(InstallError::BadTarget(format!(
            "{show} is not text (a NUL byte at offset {at}); move it away and run again"
        )));
    }
    Ok(Some((bytes, st.mode & 0o777)))
}

/// Writes a file by temp + rename inside its directory with `mode & 0o777`; a link at the name is
/// replaced, never followed; missing directories above it are made 0755.
pub fn write(t: &Tree, rel: &str, bytes: &[u8], mode: u32) -> Result<(), InstallError> {
    let p = abs(t, rel);
    let (dir, name) =
        parent(t, rel, true)?.ok_or_else(|| InstallError::io("write", &p, io::ErrorKind::NotFound.into()))?;
    swap_hook(t, rel);
    dir.write_file(name.as_ref(), bytes, mode & 0o777).map_err(|e| InstallError::io("write", &p, e))
}

#[cfg(feature = "test-hooks")]
fn swap_hook(t: &Tree, rel: &str) {
    let Some((d, to)) = &t.swap else { return };
    let here = abs(t, d);
    let under = rel.strip_prefix(d.as_str()).is_some_and(|r| r.starts_with('/'));
    if under && std::fs::symlink_metadata(&here).is_ok_and(|m| m.is_dir()) {
        let _ = std::fs::rename(&here, here.with_extension("orig"));
        let _ = std::os::unix::fs::symlink(to, &here);
    }
}

#[cfg(not(feature = "test-hooks"))]
fn swap_hook(_: &Tree, _: &str) {}

/// Deletes a file (or a link: the link itself). Missing is fine.
pub fn delete(t: &Tree, rel: &str) -> Result<bool, InstallError> {
    let Some((dir, name)) = parent(t, rel, false)? else { return Ok(false) };
    swap_hook(t, rel);
    match dir.unlink(name.as_ref()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(InstallError::io("delete", &abs(t, rel), e)),
    }
}

/// Removes a directory when it is empty; true when it is gone.
pub fn rmdir_if_empty(t: &Tree, rel: &str) -> bool {
    match parent(t, rel, false) {
        Ok(None) => true,
        Ok(Some((dir, name))) => match dir.remove_dir(name.as_ref()) {
            Ok(()) => true,
            Err(e) => e.kind() == io::ErrorKind::NotFound,
        },
        Err(_) => false,
    }
}

/// Deletes the directory `rel` and everything in it, never following a link (each level opened
/// `O_NOFOLLOW` from its parent's descriptor). Missing is fine.
pub fn remove_tree(t: &Tree, rel: &str) -> Result<(), InstallError> {
    fn empty(d: &Dir, shown: &Path) -> Result<(), InstallError> {
        for n in d.names().map_err(|e| InstallError::io("list", shown, e))? {
            let st = d.stat(&n).map_err(|e| InstallError::io("delete", &shown.join(&n), e))?;
            if st.is_some_and(|s| s.kind == EntryKind::Dir) {
                let sub = d.open_dir(&n).map_err(|e| walk_error("delete", &shown.join(&n), e))?;
                empty(&sub, &shown.join(&n))?;
                d.remove_dir(&n).map_err(|e| InstallError::io("delete", &shown.join(&n), e))?;
            } else {
                d.unlink(&n).map_err(|e| InstallError::io("delete", &shown.join(&n), e))?;
            }
        }
        Ok(())
    }
    let p = abs(t, rel);
    let Some((dir, name)) = parent(t, rel, false)? else { return Ok(()) };
    let d = match dir.open_dir(name.as_ref()) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(walk_error("delete", &p, e)),
    };
    empty(&d, &p)?;
    match dir.remove_dir(name.as_ref()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(InstallError::io("delete", &p, e)),
    }
}

/// Moves what is at `rel` (file, link or directory, never followed) to
/// `.mam/removed-<stamp>/<rel>`; returns the new target-relative path. An existing name there gets
/// a `.<n>` suffix, so nothing moved aside earlier is replaced.
pub fn move_aside(t: &Tree, rel: &str, stamp: &str) -> Result<String, InstallError> {
    let from = abs(t, rel);
    let (src, name) =
        parent(t, rel, false)?.ok_or_else(|| InstallError::io("move aside", &from, io::ErrorKind::NotFound.into()))?;
    let base = format!(".mam/removed-{stamp}/{}", rel.trim_end_matches('/'));
    let mut dest = base.clone();
    let mut n = 1;
    while exists(t, &dest)? {
        dest = format!("{base}.{n}");
        n += 1;
    }
    let (dst, dname) =
        parent(t, &dest, true)?.ok_or_else(|| InstallError::io("move aside", &from, io::ErrorKind::NotFound.into()))?;
    src.rename(name.as_ref(), &dst, dname.as_ref()).map_err(|e| InstallError::io("move aside", &from, e))?;
    Ok(dest)
}

/// Moves what `move_aside` moved to `from` back to `to` (both target-relative, nothing followed);
/// `to` must be free or a file (replaced).
pub fn move_back(t: &Tree, from: &str, to: &str) -> Result<(), InstallError> {
    let p = abs(t, from);
    let missing = || InstallError::io("move back", &p, io::ErrorKind::NotFound.into());
    let (src, name) = parent(t, from, false)?.ok_or_else(missing)?;
    let (dst, dname) = parent(t, to, true)?.ok_or_else(missing)?;
    src.rename(name.as_ref(), &dst, dname.as_ref()).map_err(|e| InstallError::io("move back", &p, e))
}

/// `.<name>.<pid>.<16 hex>.tmp`: the temp name of `sys::atomic_write`, and nothing else.
pub fn is_our_temp(name: &str) -> bool {
    let Some(body) = name.strip_prefix('.').and_then(|n| n.strip_suffix(".tmp")) else { return false };
    let mut parts = body.rsplitn(3, '.');
    let (Some(hex), Some(pid), Some(stem)) = (parts.next(), parts.next(), parts.next()) else { return false };
    hex.len() == 16
        && hex.bytes().all(|b| b.is_ascii_hexdigit())
        && !pid.is_empty()
        && pid.bytes().all(|b| b.is_ascii_digit())
        && !stem.is_empty()
}

/// Deletes the temp files an interrupted write left in `dir` (target-relative; `""` is the target).
/// With `only`, just the temps of those file names. Returns what was deleted.
pub fn clean_temps(t: &Tree, dir: &str, only: Option<&[&str]>) -> Vec<String> {
    let mut gone = Vec::new();
    let probe = format!("{dir}/x");
    let d = if dir.is_empty() {
        At::Root(t.root())
    } else {
        match parent(t, &probe, false) {
            Ok(Some((d, _))) => d,
            _ => return gone,
        }
    };
    let Ok(names) = d.names() else { return gone };
    for n in names {
        let name = n.to_string_lossy().into_owned();
        if !is_our_temp(&name) || !d.stat(&n).is_ok_and(|s| s.is_some_and(|s| s.kind == EntryKind::File)) {
            continue;
        }
        if let Some(only) = only {
            if !only.iter().any(|o| name.starts_with(&format!(".{o}."))) {
                continue;
            }
        }
        if d.unlink(&n).is_ok() {
            gone.push(if dir.is_empty() { name } else { format!("{dir}/{name}") });
        }
    }
    gone
}

/// The names in the directory `rel` (empty when it is missing), reached through a judged walk.
pub fn list(t: &Tree, rel: &str) -> Result<Vec<String>, InstallError> {
    let p = abs(t, rel);
    let Some((dir, name)) = parent(t, rel, false)? else { return Ok(Vec::new()) };
    let d = match dir.open_dir(name.as_ref()) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(walk_error("list", &p, e)),
    };
    if rel.starts_with(".mam") {
        judge(t, &p, d.own_stat().map_err(|e| InstallError::io("list", &p, e))?)?;
    }
    Ok(d.names()
        .map_err(|e| InstallError::io("list", &p, e))?
        .iter()
        .map(|n| n.to_string_lossy().into_owned())
        .collect())
}

/// Creates and deletes a probe file in the target (7.1 "not writable": root passes access(2) on a
/// read-only mount).
pub fn probe_writable(t: &Tree) -> io::Result<()> {
    let name = format!(".mam-install-probe.{}.{}.tmp", std::process::id(), sys::random_hex(8)?);
    t.root().write_file(name.as_ref(), b"", 0o600)?;
    t.root().unlink(name.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_atomic_write_temps_are_ours() {
        assert!(is_our_temp(".SKILL.md.123.0123456789abcdef.tmp"));
        assert!(is_our_temp("..gitignore.9.0123456789abcdef.tmp"));
        assert!(!is_our_temp(".notes.tmp"));
        assert!(!is_our_temp(".a.12.xyz.tmp"));
        assert!(!is_our_temp("a.1.0123456789abcdef.tmp"));
    }

    #[test]
    fn abs_never_replaces_the_base() {
        assert_eq!(abs(Path::new("/t"), "/etc/passwd"), Path::new("/t/etc/passwd"));
        assert_eq!(abs(Path::new("/t"), ".mam/"), Path::new("/t/.mam"));
    }
}
