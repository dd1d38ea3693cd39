//! Who may have written what mam loads (issue 12, docs/SECURITY.md): the ownership and mode rule
//! shared by the env file (CORE 1) and the control root (CORE 2), and the `MAM_TRUSTED_ROOTS` list
//! that exempts named roots from it, like git's `safe.directory`.
//!
//! Pure: it judges the owner and mode it is given and the list it is given; it never reads the
//! filesystem or the environment, and never prints.

use std::fmt;
use std::path::Path;

use crate::sys::absolutize;

/// Why a file or directory is not trusted. The wording is part of the diagnostics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// Owned by someone who is neither the invoking user nor root.
    OwnedBy {
        owner: u32,
        me: u32,
    },
    WritableByOthers {
        mode: u32,
    },
    WritableByGroup {
        mode: u32,
    },
    /// A symlink where a file was expected (the env file is opened with `O_NOFOLLOW`).
    Symlink,
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Why::OwnedBy { owner, me } => write!(f, "owned by uid {owner}, not you (uid {me})"),
            Why::WritableByOthers { mode } => write!(f, "writable by others (mode {mode:04o})"),
            Why::WritableByGroup { mode } => write!(f, "writable by group (mode {mode:04o})"),
            Why::Symlink => f.write_str("is a symbolic link"),
        }
    }
}

/// The rule (OpenSSH's StrictModes): owned by `me` or by root, and not writable by group or others.
/// Root's files are accepted for every user because root can change any file anyway; someone else's
/// are not, because they could change what mam loads or where it writes.
pub fn judge(me: u32, owner: u32, mode: u32) -> Result<(), Why> {
    let mode = mode & 0o7777;
    if owner != me && owner != 0 {
        return Err(Why::OwnedBy { owner, me });
    }
    if mode & 0o002 != 0 {
        return Err(Why::WritableByOthers { mode });
    }
    if mode & 0o020 != 0 {
        return Err(Why::WritableByGroup { mode });
    }
    Ok(())
}

/// True when `path` is a listed root or lies beneath one. `list` is `MAM_TRUSTED_ROOTS`: absolute
/// paths separated by `:`; `*` trusts everything; empty and relative entries are ignored.
/// Components are compared lexically, so `/a/b` does not cover `/a/bc`.
pub fn listed(list: &str, path: &Path) -> bool {
    let path = absolutize(Path::new("/"), path);
    list.split(':')
        .any(|e| e == "*" || (e.starts_with('/') && path.starts_with(absolutize(Path::new("/"), Path::new(e)))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn judge_accepts_own_and_root_files_without_group_or_other_write() {
        assert_eq!(judge(1000, 1000, 0o100600), Ok(()));
        assert_eq!(judge(1000, 0, 0o40755), Ok(()));
        assert_eq!(judge(0, 0, 0o644), Ok(()));
        assert_eq!(judge(0, 65534, 0o600), Err(Why::OwnedBy { owner: 65534, me: 0 }));
        assert_eq!(judge(1000, 1000, 0o666), Err(Why::WritableByOthers { mode: 0o666 }));
        assert_eq!(judge(1000, 1000, 0o41777), Err(Why::WritableByOthers { mode: 0o1777 }));
        assert_eq!(judge(1000, 1000, 0o620), Err(Why::WritableByGroup { mode: 0o620 }));
        assert_eq!(Why::WritableByGroup { mode: 0o620 }.to_string(), "writable by group (mode 0620)");
        assert_eq!(Why::OwnedBy { owner: 65534, me: 0 }.to_string(), "owned by uid 65534, not you (uid 0)");
    }

    #[test]
    fn listed_matches_roots_and_what_lies_beneath() {
        let p = Path::new("/srv/shared/.mam/jobs");
        assert!(listed("/srv/shared", p));
        assert!(listed("/x:/srv/shared/", p));
        assert!(listed("*", p));
        assert!(listed("/srv/shared/.mam/jobs", p));
        assert!(!listed("/srv/share", p), "components, not string prefixes");
        assert!(!listed("", p));
        assert!(!listed("srv/shared", p), "relative entries are ignored");
        assert!(!listed("/srv/shared/other", p));
        assert!(listed("/srv/x/..", Path::new("/srv/shared")), "entries are normalised");
    }
}
