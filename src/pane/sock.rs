//! Whose server a backend talks to (issue 29 item 2): the socket path tmux (`-L NAME`) and herdr
//! (`HERDR_SESSION=NAME`) derive from a server name and the environment, the rule for server names
//! (a plain name: never a path that leads out of the user's socket directory), and the check that
//! the socket and every directory above it belong to the invoking user or root, so that mam never
//! types a prompt into, or reads agent state from, a server another local user planted there.
//!
//! It reads file metadata only (no socket is opened, nothing is written) and never prints; the
//! judgement of one entry is pure (`judge_entry`), the walk over the filesystem is `check`.

use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::ctx::Ctx;
use crate::text::{one_line, show_path};
use crate::trust::{self, Why};

/// Why a server name is not a plain name, or `None` when it is one: not empty, no `/` or control
/// character, not starting with `.` (`..` leads to the parent) or `-` (an option to the tool).
pub fn bad_name(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("is empty")
    } else if name.contains('/') {
        Some("contains '/' (a server name, not a path)")
    } else if name.starts_with('.') {
        Some("starts with '.'")
    } else if name.starts_with('-') {
        Some("starts with '-'")
    } else if name.chars().any(char::is_control) {
        Some("contains a control character")
    } else {
        None
    }
}

/// The socket of tmux's `-L name`: `${TMUX_TMPDIR:-/tmp}/tmux-<uid>/<name>` (tmux 3.x).
pub fn tmux_socket(ctx: &Ctx, name: &str) -> PathBuf {
    let base = ctx.var_nonempty("TMUX_TMPDIR").filter(|d| d.starts_with('/')).unwrap_or_else(|| "/tmp".into());
    Path::new(&base).join(format!("tmux-{}", crate::sys::getuid())).join(name)
}

/// The socket of herdr's session `name`: `<config dir>/herdr/sessions/<name>/herdr.sock`, the config
/// directory being `$XDG_CONFIG_HOME`, else `$HOME/.config` (herdr 0.8); `None` without either.
pub fn herdr_socket(ctx: &Ctx, name: &str) -> Option<PathBuf> {
    let config = match ctx.var_nonempty("XDG_CONFIG_HOME").filter(|d| d.starts_with('/')) {
        Some(d) => PathBuf::from(d),
        None => Path::new(&ctx.var_nonempty("HOME").filter(|d| d.starts_with('/'))?).join(".config"),
    };
    Some(config.join("herdr/sessions").join(name).join("herdr.sock"))
}

/// What a socket path failed, with the entry that failed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsafe {
    /// The socket the backend would use.
    pub socket: PathBuf,
    /// The entry judged: the socket itself or one of the directories above it.
    pub entry: PathBuf,
    pub why: Why,
    /// True when `entry` is the socket, else it is a directory.
    pub is_socket: bool,
}

impl fmt::Display for Unsafe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = if self.is_socket { "the socket" } else { "directory" };
        write!(
            f,
            "REFUSED: server socket {}: {what} {} is {}; another user could run the server mam would talk to \
             (remove it or use a directory only you can write)",
            show_path(&self.socket),
            show_path(&self.entry),
            one_line(&why_text(&self.why))
        )
    }
}

fn why_text(w: &Why) -> String {
    match w {
        Why::OwnedBy { owner, me } => format!("owned by uid {owner}, not you (uid {me}) or root"),
        other => other.to_string(),
    }
}

/// Where an entry stands in the path: the judgement differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// The socket itself: only its owner counts (a socket's mode says who may connect, and the
    /// tools choose it; whoever owns the socket runs the server).
    Socket,
    /// The directory holding the socket: owned by `me` or root, writable by nobody else.
    Dir,
    /// A directory above that: the same, except that a root-owned sticky directory (`/tmp`) is
    /// accepted, since nobody else may rename or remove what lies in it.
    Above,
}

/// The rule for one entry with `owner` and `mode` (`st_mode`) at `place`, for user `me`.
pub fn judge_entry(place: Place, me: u32, owner: u32, mode: u32, symlink: bool) -> Result<(), Why> {
    if symlink {
        return Err(Why::Symlink);
    }
    match place {
        Place::Socket if owner != me && owner != 0 => Err(Why::OwnedBy { owner, me }),
        Place::Socket => Ok(()),
        Place::Above if owner == 0 && mode & 0o1000 != 0 => Ok(()),
        Place::Dir | Place::Above => trust::judge(me, owner, mode),
    }
}

/// Checks `socket` and every existing directory above it for user `me`: the socket when it exists
/// (a symlink, or a socket of another user, is refused), its directory and the ones above it as
/// their real paths (a symlinked directory is judged where it leads). Entries that do not exist yet
/// are skipped: the tool creates them, in a directory nobody else may write.
pub fn check(socket: &Path, me: u32) -> Result<(), Unsafe> {
    let fail = |entry: &Path, why: Why, is_socket: bool| Unsafe {
        socket: socket.to_path_buf(),
        entry: entry.to_path_buf(),
        why,
        is_socket,
    };
    if let Ok(m) = std::fs::symlink_metadata(socket) {
        // Something else than a socket makes the tool fail by itself; its owner still tells who
        // put it there.
        let symlink = m.file_type().is_symlink();
        judge_entry(Place::Socket, me, m.uid(), m.mode(), symlink).map_err(|w| fail(socket, w, true))?;
    }
    let Some(dir) = socket.parent() else { return Ok(()) };
    // The deepest existing directory, resolved; what lies below it does not exist yet.
    let mut existing = dir;
    let mut depth_below = 0;
    let real = loop {
        match std::fs::canonicalize(existing) {
            Ok(r) => break r,
            Err(_) => match existing.parent() {
                Some(p) => {
                    existing = p;
                    depth_below += 1;
                }
                None => return Ok(()),
            },
        }
    };
    for (i, d) in real.ancestors().enumerate() {
        let Ok(m) = std::fs::metadata(d) else { continue };
        let place = if i == 0 && depth_below == 0 { Place::Dir } else { Place::Above };
        judge_entry(place, me, m.uid(), m.mode(), false).map_err(|w| fail(d, w, false))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_plain_names() {
        for ok in ["mam", "multi-agent-mux", "mam-test-a1b2", "B", "x.y"] {
            assert_eq!(bad_name(ok), None, "{ok}");
        }
        for bad in ["", "../x", "a/b", "..", ".hidden", "-L", "a\nb", "/tmp/evil"] {
            assert!(bad_name(bad).is_some(), "{bad:?}");
        }
    }

    #[test]
    fn the_socket_counts_only_its_owner_and_the_directories_their_owner_and_mode() {
        // The socket: the tools choose its mode; its owner runs the server.
        assert_eq!(judge_entry(Place::Socket, 0, 0, 0o140660, false), Ok(()));
        assert_eq!(judge_entry(Place::Socket, 1000, 1000, 0o140777, false), Ok(()));
        assert_eq!(judge_entry(Place::Socket, 0, 65534, 0o140600, false), Err(Why::OwnedBy { owner: 65534, me: 0 }));
        assert_eq!(judge_entry(Place::Socket, 0, 0, 0o120777, true), Err(Why::Symlink));
        // Its directory: nobody else may write it, sticky or not.
        assert_eq!(judge_entry(Place::Dir, 0, 0, 0o40700, false), Ok(()));
        assert_eq!(judge_entry(Place::Dir, 0, 0, 0o41777, false), Err(Why::WritableByOthers { mode: 0o1777 }));
        assert_eq!(judge_entry(Place::Dir, 0, 0, 0o40770, false), Err(Why::WritableByGroup { mode: 0o770 }));
        assert_eq!(judge_entry(Place::Dir, 0, 65534, 0o40700, false), Err(Why::OwnedBy { owner: 65534, me: 0 }));
        // Above it: /tmp is fine, another user's sticky directory is not.
        assert_eq!(judge_entry(Place::Above, 1000, 0, 0o41777, false), Ok(()));
        assert_eq!(judge_entry(Place::Above, 0, 65534, 0o41777, false), Err(Why::OwnedBy { owner: 65534, me: 0 }));
        assert_eq!(judge_entry(Place::Above, 0, 0, 0o40777, false), Err(Why::WritableByOthers { mode: 0o777 }));
    }

    #[test]
    fn the_paths_follow_the_tools_rules() {
        let ctx = Ctx::with_env([("TMUX_TMPDIR", "/run/t"), ("HOME", "/home/u")], Path::new("/"));
        let uid = crate::sys::getuid();
        assert_eq!(tmux_socket(&ctx, "mam"), PathBuf::from(format!("/run/t/tmux-{uid}/mam")));
        assert_eq!(herdr_socket(&ctx, "s"), Some(PathBuf::from("/home/u/.config/herdr/sessions/s/herdr.sock")));
        let ctx = Ctx::with_env([("XDG_CONFIG_HOME", "/c"), ("HOME", "/home/u")], Path::new("/"));
        assert_eq!(tmux_socket(&ctx, "mam"), PathBuf::from(format!("/tmp/tmux-{uid}/mam")));
        assert_eq!(herdr_socket(&ctx, "s"), Some(PathBuf::from("/c/herdr/sessions/s/herdr.sock")));
    }
}
