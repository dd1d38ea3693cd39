//! The filesystem steps of install, update and remove, all through `crate::sys`: no symlink is
//! followed when writing (every directory between the target and a path is checked, docs/SECURITY.md),
//! files are written by temp + rename with their mode, local edits are moved aside (never deleted),
//! stray temp files of an interrupted run are removed, and every change counts one step for the
//! test hooks. Paths here are target-relative ledger paths (checked by `ledger::check_path`).

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::{Hooks, InstallError};
use crate::sys;

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

pub fn abs(target: &Path, rel: &str) -> PathBuf {
    target.join(rel.trim_end_matches('/'))
}

/// Refuses a path whose directories between the target and it include a symlink (writing or
/// deleting through it would touch a place outside the target).
pub fn check_no_link(target: &Path, rel: &str) -> Result<(), InstallError> {
    let rel = rel.trim_end_matches('/');
    let mut p = target.to_path_buf();
    let parts: Vec<&str> = rel.split('/').collect();
    for c in &parts[..parts.len().saturating_sub(1)] {
        p.push(c);
        match fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(InstallError::io(
                    "use",
                    &p,
                    io::Error::other("is a symbolic link; not followed (docs/SECURITY.md)"),
                ))
            }
            Ok(m) if !m.is_dir() => {
                return Err(InstallError::io("use", &p, io::Error::other("is not a directory")));
            }
            _ => {}
        }
    }
    Ok(())
}

pub fn read(target: &Path, rel: &str) -> Result<Found, InstallError> {
    check_no_link(target, rel)?;
    let p = abs(target, rel);
    let m = match fs::symlink_metadata(&p) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Found::Missing),
        Err(e) => return Err(InstallError::io("read", &p, e)),
    };
    if !m.is_file() {
        return Ok(Found::Other);
    }
    let mut f = sys::open_nofollow_read(&p).map_err(|e| InstallError::io("read", &p, e))?;
    let mut bytes = Vec::new();
    io::Read::read_to_end(&mut f, &mut bytes).map_err(|e| InstallError::io("read", &p, e))?;
    Ok(Found::File { bytes, mode: m.permissions().mode() & 0o7777 })
}

/// The bytes of a regular file, `None` when missing (or not a regular file).
pub fn read_bytes(target: &Path, rel: &str) -> Result<Option<Vec<u8>>, InstallError> {
    Ok(match read(target, rel)? {
        Found::File { bytes, .. } => Some(bytes),
        _ => None,
    })
}

/// Creates the directories above `rel` (0755), none of them through a link.
pub fn make_parents(target: &Path, rel: &str) -> Result<(), InstallError> {
    check_no_link(target, rel)?;
    if let Some(parent) = abs(target, rel).parent() {
        sys::create_dir_all_mode(parent, 0o755).map_err(|e| InstallError::io("create", parent, e))?;
    }
    Ok(())
}

/// Writes a file by temp + rename with `mode`; a link at the name is replaced, never followed.
pub fn write(target: &Path, rel: &str, bytes: &[u8], mode: u32) -> Result<(), InstallError> {
    make_parents(target, rel)?;
    let p = abs(target, rel);
    sys::atomic_write_mode(&p, bytes, mode).map_err(|e| InstallError::io("write", &p, e))
}

/// Deletes a file (or a link: the link itself). Missing is fine.
pub fn delete(target: &Path, rel: &str) -> Result<bool, InstallError> {
    check_no_link(target, rel)?;
    let p = abs(target, rel);
    match fs::remove_file(&p) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(InstallError::io("delete", &p, e)),
    }
}

/// Removes a directory when it is empty; true when it is gone.
pub fn rmdir_if_empty(target: &Path, rel: &str) -> bool {
    if check_no_link(target, rel).is_err() {
        return false;
    }
    let p = abs(target, rel);
    match fs::symlink_metadata(&p) {
        Ok(m) if m.is_dir() => fs::remove_dir(&p).is_ok(),
        Ok(_) => false,
        Err(_) => true,
    }
}

/// Moves what is at `rel` (file, link or directory, never followed) to
/// `.mam/removed-<stamp>/<rel>`; returns the new target-relative path. An existing name there gets
/// a `.<n>` suffix, so nothing moved aside earlier is replaced.
pub fn move_aside(target: &Path, rel: &str, stamp: &str) -> Result<String, InstallError> {
    check_no_link(target, rel)?;
    let base = format!(".mam/removed-{stamp}/{}", rel.trim_end_matches('/'));
    let mut dest = base.clone();
    let mut n = 1;
    while fs::symlink_metadata(abs(target, &dest)).is_ok() {
        dest = format!("{base}.{n}");
        n += 1;
    }
    make_parents(target, &dest)?;
    let (from, to) = (abs(target, rel), abs(target, &dest));
    fs::rename(&from, &to).map_err(|e| InstallError::io("move aside", &from, e))?;
    Ok(dest)
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
pub fn clean_temps(target: &Path, dir: &str, only: Option<&[&str]>) -> Vec<String> {
    let mut gone = Vec::new();
    if !dir.is_empty() && check_no_link(target, &format!("{dir}/x")).is_err() {
        return gone;
    }
    let d = if dir.is_empty() { target.to_path_buf() } else { abs(target, dir) };
    let Ok(rd) = fs::read_dir(&d) else { return gone };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !is_our_temp(&name) || !e.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        if let Some(only) = only {
            if !only.iter().any(|o| name.starts_with(&format!(".{o}."))) {
                continue;
            }
        }
        if fs::remove_file(e.path()).is_ok() {
            gone.push(if dir.is_empty() { name } else { format!("{dir}/{name}") });
        }
    }
    gone
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
}
