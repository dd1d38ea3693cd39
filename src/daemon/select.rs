//! The daemon selector of CORE 10.3: which processes are `<mam binary> daemon run --workspace <root>`
//! for a given root, judged from `/proc/<pid>/cmdline` where every argv element is separate.
//!
//! It never selects a wrapper that merely quotes those words inside one element (`bash -c "... daemon
//! run --workspace <root>"`), nor a daemon of a sibling root sharing a prefix (`<root>-other`). It
//! only reads /proc; signalling is the caller's business.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::sys;

/// True when `args` has the daemon shape: argv[0] is the mam binary (its basename is `mam`, or it
/// names an existing file), followed directly by `daemon run`.
pub fn argv_is_daemon_run(args: &[Vec<u8>]) -> bool {
    if args.len() < 3 || args[1] != b"daemon" || args[2] != b"run" {
        return false;
    }
    let argv0 = Path::new(OsStr::from_bytes(&args[0]));
    argv0.file_name().is_some_and(|n| n == "mam") || argv0.is_file()
}

/// The `--workspace` value of a `daemon run` argv (`--workspace DIR` or `--workspace=DIR`).
pub fn workspace_arg(args: &[Vec<u8>]) -> Option<&[u8]> {
    let mut i = 3;
    while i < args.len() {
        let a = &args[i];
        if a == b"--" {
            return None;
        }
        if a == b"--workspace" {
            return args.get(i + 1).map(Vec::as_slice);
        }
        if let Some(v) = a.strip_prefix(b"--workspace=") {
            return Some(v);
        }
        i += 1;
    }
    None
}

/// True when `args` is a daemon for exactly `root` (byte-equal element; no prefix matching).
pub fn argv_is_daemon(args: &[Vec<u8>], root: &Path) -> bool {
    argv_is_daemon_run(args) && workspace_arg(args) == Some(root.as_os_str().as_bytes())
}

/// Like `argv_is_daemon`, but a relative `--workspace` is resolved against the process's `cwd`
/// (for `daemon stop` of a daemon someone started by hand with a relative path).
pub fn argv_names_workspace(args: &[Vec<u8>], root: &Path, cwd: &Path) -> bool {
    if !argv_is_daemon_run(args) {
        return false;
    }
    let Some(ws) = workspace_arg(args) else { return false };
    let ws = Path::new(OsStr::from_bytes(ws));
    sys::absolutize(cwd, ws) == sys::normalize(root)
}

/// Every live process that is `<mam binary> daemon run --workspace <root>` (CORE 10.3).
pub fn select_daemons(root: &Path) -> Vec<i32> {
    let me = std::process::id() as i32;
    let Ok(pids) = sys::list_pids() else { return Vec::new() };
    pids.into_iter()
        .filter(|&pid| pid != me)
        .filter(|&pid| sys::proc_cmdline(pid).is_ok_and(|args| argv_is_daemon(&args, root)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(words: &[&str]) -> Vec<Vec<u8>> {
        words.iter().map(|w| w.as_bytes().to_vec()).collect()
    }

    #[test]
    fn d7_shape() {
        let root = Path::new("/tmp/a b/ws");
        assert!(argv_is_daemon(&argv(&["/opt/bin/mam", "daemon", "run", "--workspace", "/tmp/a b/ws"]), root));
        assert!(argv_is_daemon(
            &argv(&["mam", "daemon", "run", "--registry-dir", "/r", "--workspace", "/tmp/a b/ws", "--interval", "1"]),
            root
        ));
        assert!(argv_is_daemon(&argv(&["mam", "daemon", "run", "--workspace=/tmp/a b/ws"]), root));
        // A sibling root that shares a prefix, a wrapper quoting the words, other subcommands.
        assert!(!argv_is_daemon(&argv(&["mam", "daemon", "run", "--workspace", "/tmp/a b/ws-other"]), root));
        assert!(!argv_is_daemon(&argv(&["mam", "daemon", "run", "--workspace", "/tmp/a b"]), root));
        assert!(!argv_is_daemon(&argv(&["bash", "-c", "mam daemon run --workspace /tmp/a b/ws; sleep 9"]), root));
        assert!(!argv_is_daemon(&argv(&["sudo", "mam", "daemon", "run", "--workspace", "/tmp/a b/ws"]), root));
        assert!(!argv_is_daemon(&argv(&["mam", "daemon", "status", "--workspace", "/tmp/a b/ws"]), root));
        assert!(!argv_is_daemon(&argv(&["/nonexistent/xmam", "daemon", "run", "--workspace", "/tmp/a b/ws"]), root));
        assert!(!argv_is_daemon(&argv(&["mam", "daemon", "run", "--", "--workspace", "/tmp/a b/ws"]), root));
    }

    #[test]
    fn relative_workspace_resolves_against_the_process_cwd() {
        let args = argv(&["mam", "daemon", "run", "--workspace", "ws"]);
        assert!(argv_names_workspace(&args, Path::new("/tmp/x/ws"), Path::new("/tmp/x")));
        assert!(!argv_names_workspace(&args, Path::new("/tmp/x/ws"), Path::new("/tmp/y")));
        assert!(!argv_is_daemon(&args, Path::new("/tmp/x/ws")));
    }
}
