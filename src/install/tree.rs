//! The target of one install, update or remove run (issue 29): its canonical path, its directory
//! opened once (every walk of `install::fsops` starts from that descriptor) and the trust rule's
//! inputs (the user, `MAM_TRUSTED_ROOTS`). Owns no filesystem step and never prints.

use std::io;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::sys::{self, Dir, EntryStat};
use crate::trust;

/// The target of one run: its canonical path (for messages), its directory opened once (every
/// walk starts from this descriptor, so a target path swapped midway changes nothing), and the
/// inputs of the trust rule.
#[derive(Debug, Clone)]
pub struct Tree {
    path: PathBuf,
    root: Arc<Dir>,
    me: u32,
    /// `MAM_TRUSTED_ROOTS` (real environment only).
    trusted_roots: String,
    /// Test hook (`MAM_TEST_INSTALL_SWAP=<dir>:<link target>`, `test-hooks` builds only): right
    /// before a write or delete below `<dir>`, after its directory was opened, `<dir>` is renamed away and a
    /// symlink to `<link target>` put in its place: the race of a check and a write, made certain.
    pub swap: Option<(String, PathBuf)>,
}

impl Tree {
    /// Opens `path` (canonical, a directory) for one run.
    pub fn open(path: PathBuf, trusted_roots: String) -> io::Result<Tree> {
        let root = Arc::new(Dir::open(&path)?);
        Ok(Tree { path, root, me: sys::geteuid(), trusted_roots, swap: None })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The trust rule (issue 12 and 29) on one opened file or directory: the user's or root's, not
    /// writable by group or others, unless `MAM_TRUSTED_ROOTS` lists it.
    pub fn judge(&self, shown: &Path, st: EntryStat) -> Result<(), trust::Why> {
        if trust::listed(&self.trusted_roots, shown) {
            return Ok(());
        }
        trust::judge(self.me, st.uid, st.mode)
    }

    /// The owner half of the rule only (`.gitignore`: its mode is the user's choice).
    pub fn judge_owner(&self, shown: &Path, uid: u32) -> Result<(), trust::Why> {
        if uid == self.me || uid == 0 || trust::listed(&self.trusted_roots, shown) {
            return Ok(());
        }
        Err(trust::Why::OwnedBy { owner: uid, me: self.me })
    }

    /// The target's directory, where every walk starts.
    pub fn root(&self) -> &Dir {
        &self.root
    }
}

impl Deref for Tree {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}
