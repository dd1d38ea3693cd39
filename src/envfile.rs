//! The `.mam.env` parser and loader (CORE 1): which file is read, the line format, the
//! unreadable-file error, and load-once-after-success into the `Ctx` overlay.
//!
//! It never prints and never exits: warnings come back as lines for the entry point to print, and
//! a file that cannot be read or decoded is an `EnvFileError`. Values never appear in a warning or
//! an error (A2).
//!
//! It loads only a file it can trust (issue 12, docs/SECURITY.md): opened without following a
//! symlink, then the open descriptors of the file and its directory must both be owned by the user
//! or root and not writable by group or others; and it never takes a program path from a file
//! (`ENV_ONLY`).

use std::fmt;
use std::fs;
use std::io;
use std::path::PathBuf;

use crate::ctx::Ctx;
use crate::text::show_path;
use crate::trust::{self, Why};

/// Why a present file could not be loaded; the legacy names are part of the output (CORE 1.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    Permission,
    IsADirectory,
    UnicodeDecode,
    Os,
    /// The file is not trusted (issue 12): someone else's, writable by others, or a symlink.
    Refused(Why),
    /// The file's directory is not trusted.
    RefusedDir(Why),
}

impl ErrorKind {
    /// The legacy name of a read failure (CORE 1.3); `None` for a refusal, which has its own words.
    pub fn legacy_name(self) -> Option<&'static str> {
        match self {
            ErrorKind::Permission => Some("PermissionError"),
            ErrorKind::IsADirectory => Some("IsADirectoryError"),
            ErrorKind::UnicodeDecode => Some("UnicodeDecodeError"),
            ErrorKind::Os => Some("OSError"),
            ErrorKind::Refused(_) | ErrorKind::RefusedDir(_) => None,
        }
    }

    fn from_io(e: &io::Error) -> ErrorKind {
        match e.raw_os_error() {
            Some(libc::EACCES) | Some(libc::EPERM) => ErrorKind::Permission,
            Some(libc::EISDIR) => ErrorKind::IsADirectory,
            // O_NOFOLLOW met a symlink as the last component.
            Some(libc::ELOOP) => ErrorKind::Refused(Why::Symlink),
            _ => ErrorKind::Os,
        }
    }
}

/// A present env file that cannot be opened, read or decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvFileError {
    pub path: PathBuf,
    pub kind: ErrorKind,
}

impl fmt::Display for EnvFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = show_path(&self.path);
        match self.kind {
            ErrorKind::Refused(why) => write!(f, "{shown}: refused: {why}"),
            ErrorKind::RefusedDir(why) => {
                let dir = self.path.parent().unwrap_or(std::path::Path::new("/"));
                write!(f, "{shown}: refused: directory {}: {why}", show_path(dir))
            }
            kind => write!(f, "{shown}: cannot read ({})", kind.legacy_name().unwrap_or("OSError")),
        }
    }
}

/// A parsed file: the entries to consider in file order (first occurrence only), and warnings.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    pub entries: Vec<(String, String)>,
    /// The 1-based line of each entry, in the same order.
    pub lines: Vec<usize>,
    pub warnings: Vec<String>,
}

const BASH_OWNED: &[&str] = &[
    "BASH",
    "BASHOPTS",
    "BASHPID",
    "EUID",
    "UID",
    "PPID",
    "PWD",
    "OLDPWD",
    "SHLVL",
    "SHELLOPTS",
    "GROUPS",
    "FUNCNAME",
    "LINENO",
    "RANDOM",
    "SRANDOM",
    "SECONDS",
    "EPOCHSECONDS",
    "EPOCHREALTIME",
    "HISTCMD",
    "PIPESTATUS",
    "DIRSTACK",
    "OPTIND",
    "OPTARG",
    "IFS",
    "PS1",
    "PS2",
    "PS3",
    "PS4",
    "HOSTTYPE",
    "MACHTYPE",
    "OSTYPE",
    "ENV",
];

/// Keys taken from the real environment only, never from an env file (issue 12): the programs mam
/// runs (`MAM_OPENSSL`, `MAM_BIN`, and `PATH` with the loader's variables, which pick the `tmux`,
/// `herdr`, `sh` and libraries its children run) and the trust list itself. A file line setting
/// one is skipped with a warning naming the line.
pub const ENV_ONLY: &[&str] = &["MAM_OPENSSL", "MAM_BIN", "MAM_TRUSTED_ROOTS", "PATH", "LD_PRELOAD", "LD_LIBRARY_PATH"];

fn is_bash_owned(key: &str) -> bool {
    key.starts_with("BASH_") || BASH_OWNED.contains(&key)
}

fn valid_key(key: &str) -> bool {
    let b = key.as_bytes();
    !b.is_empty()
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

fn trim_ascii_ws(s: &str) -> &str {
    // ASCII whitespace of CORE 1.2 rule 4: space, \t, \v, \f, \r (and \n, which cannot occur here).
    s.trim_matches(|c| matches!(c, ' ' | '\t' | '\x0b' | '\x0c' | '\r' | '\n'))
}

/// Parses the whole file (CORE 1.2). `shown` is the path used in warnings.
pub fn parse(shown: &str, bytes: &[u8]) -> Result<Parsed, ErrorKind> {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let text = std::str::from_utf8(bytes).map_err(|_| ErrorKind::UnicodeDecode)?;
    let mut parsed = Parsed::default();
    let mut seen = std::collections::HashSet::new();
    let warn = |n: usize, reason: &str| parsed_warn(shown, n, reason);
    let mut warnings = Vec::new();
    for (i, raw) in text.split('\n').enumerate() {
        let n = i + 1;
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        if line.contains('\0') {
            warnings.push(warn(n, "contains NUL"));
            continue;
        }
        let line = trim_ascii_ws(line);
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            warnings.push(warn(n, "no '=' found"));
            continue;
        };
        let key = trim_ascii_ws(key);
        let value = trim_ascii_ws(value);
        if !valid_key(key) {
            let reason = if key.starts_with("export ") || key.starts_with("export\t") {
                "export prefix is not supported"
            } else {
                "invalid key"
            };
            warnings.push(warn(n, reason));
            continue;
        }
        if is_bash_owned(key) {
            warnings.push(warn(n, "key is owned by bash"));
            continue;
        }
        if ENV_ONLY.contains(&key) {
            warnings.push(warn(n, &format!("{key} is taken from the environment only")));
            continue;
        }
        let value = unquote(value);
        if !seen.insert(key.to_string()) {
            warnings.push(warn(n, "duplicate key; first value kept"));
            continue;
        }
        parsed.entries.push((key.to_string(), value.to_string()));
        parsed.lines.push(n);
    }
    parsed.warnings = warnings;
    Ok(parsed)
}

fn parsed_warn(shown: &str, n: usize, reason: &str) -> String {
    format!("WARNING: {shown}:{n}: {reason}; line skipped")
}

/// Removes exactly one pair of matching outer `'` or `"` from a value of 2+ characters.
fn unquote(v: &str) -> &str {
    let b = v.as_bytes();
    if b.len() >= 2 && (b[0] == b'\'' || b[0] == b'"') && b[b.len() - 1] == b[0] {
        &v[1..v.len() - 1]
    } else {
        v
    }
}

/// The file to read (CORE 1.1): `Some(path)` to load, `None` for nothing. The ambient search is
/// `$WORKSPACE_ROOT/.mam.env`, `./.mam.env`, then the control root's `.mam.env` (issue 18).
pub fn resolve(ctx: &Ctx) -> Option<PathBuf> {
    if let Some(explicit) = ctx.path_var("MAM_ENV_FILE") {
        let p = crate::sys::absolutize(ctx.cwd(), &explicit);
        // symlink_metadata: a dangling symlink counts as "nothing exists" only if its target is
        // missing, which `metadata` reports as NotFound.
        return match fs::metadata(&p) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            _ => Some(p),
        };
    }
    let mut candidates = Vec::new();
    if let Some(ws) = ctx.path_var("WORKSPACE_ROOT") {
        candidates.push(crate::sys::absolutize(ctx.cwd(), &ws).join(".mam.env"));
    }
    candidates.push(ctx.cwd().join(".mam.env"));
    // Issue 18: from a subdirectory of the control root, its `.mam.env` is still the one meant
    // (the control root found without WORKSPACE_ROOT: `.mam/` above cwd, else the git top level).
    candidates.push(crate::paths::find_control_root(ctx).join(".mam.env"));
    candidates.into_iter().find(|p| !matches!(fs::metadata(p), Err(ref e) if e.kind() == io::ErrorKind::NotFound))
}

/// Reads and parses `path`, mapping failures to the legacy kinds, after the trust check of issue 12:
/// the file is opened without following a symlink, and the descriptors of the file and of its
/// directory are judged (fstat, so what is judged is what is read).
pub fn read(path: &std::path::Path) -> Result<Parsed, EnvFileError> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let err = |kind| EnvFileError { path: path.to_path_buf(), kind };
    let io_err = |e: io::Error| err(ErrorKind::from_io(&e));
    let (dir, mut file) = crate::sys::open_read_nofollow_with_dir(path).map_err(io_err)?;
    let meta = file.metadata().map_err(io_err)?;
    if meta.is_dir() {
        return Err(err(ErrorKind::IsADirectory));
    }
    let me = crate::sys::geteuid();
    trust::judge(me, meta.uid(), meta.mode()).map_err(|w| err(ErrorKind::Refused(w)))?;
    let dmeta = dir.metadata().map_err(io_err)?;
    trust::judge(me, dmeta.uid(), dmeta.mode()).map_err(|w| err(ErrorKind::RefusedDir(w)))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(io_err)?;
    parse(&show_path(path), &bytes).map_err(err)
}

/// The values that would be applied: absent from the real environment, first occurrence, file order.
pub fn applicable(ctx: &Ctx, parsed: &Parsed) -> Vec<(String, String)> {
    parsed.entries.iter().filter(|(k, _)| !ctx.in_real_env(k)).cloned().collect()
}

/// Loads the env file into the overlay once (CORE 1.4). Returns the warnings to print. On failure
/// nothing is applied and the next call tries again.
pub fn ensure_env_loaded(ctx: &mut Ctx) -> Result<Vec<String>, EnvFileError> {
    if ctx.env_loaded() {
        return Ok(Vec::new());
    }
    let Some(path) = resolve(ctx) else {
        ctx.apply_overlay(Vec::new());
        return Ok(Vec::new());
    };
    let parsed = read(&path)?;
    let values = applicable(ctx, &parsed);
    let shown = show_path(&path);
    let origins =
        parsed.entries.iter().zip(&parsed.lines).map(|((k, _), n)| (k.clone(), format!("{shown}:{n}"))).collect();
    ctx.apply_overlay(values);
    ctx.note_origins(origins);
    Ok(parsed.warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Parsed {
        parse("f", text.as_bytes()).unwrap()
    }

    #[test]
    fn e1_basic_format() {
        let got = p("# c\n\n  A = 1 \r\nB='q'\nC=\"q\"\n\tD\t=\tx y\t\r\n");
        let want: Vec<(String, String)> = [("A", "1"), ("B", "q"), ("C", "q"), ("D", "x y")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(got.entries, want);
        assert!(got.warnings.is_empty(), "{:?}", got.warnings);
    }

    #[test]
    fn e2_literal_values() {
        let got = p("A=$HOME/x\nB=`id`\nC=\"a'b\"\nD='\nE=''\n");
        assert_eq!(got.entries[0].1, "$HOME/x");
        assert_eq!(got.entries[1].1, "`id`");
        assert_eq!(got.entries[2].1, "a'b");
        assert_eq!(got.entries[3].1, "'");
        assert_eq!(got.entries[4].1, "");
    }

    #[test]
    fn e3_export_prefix_warns_without_value() {
        let got = p("X=0\nexport FOO=1\n");
        assert_eq!(got.entries.len(), 1);
        assert_eq!(got.warnings, vec!["WARNING: f:2: export prefix is not supported; line skipped"]);
    }

    #[test]
    fn e5_hash_is_part_of_value() {
        assert_eq!(p("A=b # c").entries[0].1, "b # c");
    }

    #[test]
    fn e7_first_value_wins() {
        let got = p("A=1\nA=2\n");
        assert_eq!(got.entries, vec![("A".into(), "1".into())]);
        assert_eq!(got.warnings, vec!["WARNING: f:2: duplicate key; first value kept; line skipped"]);
    }

    #[test]
    fn e8_bom_stripped_and_lines_not_shifted() {
        let got = parse("f", b"\xEF\xBB\xBFA=1\nnoeq\n").unwrap();
        assert_eq!(got.entries, vec![("A".into(), "1".into())]);
        assert_eq!(got.warnings, vec!["WARNING: f:2: no '=' found; line skipped"]);
    }

    #[test]
    fn e9_nul_line_is_skipped() {
        let got = parse("f", b"A=1\nB=le\0ft\nC=3\n").unwrap();
        assert_eq!(got.entries.iter().map(|e| e.0.as_str()).collect::<Vec<_>>(), ["A", "C"]);
        assert_eq!(got.warnings, vec!["WARNING: f:2: contains NUL; line skipped"]);
    }

    #[test]
    fn program_paths_and_the_trust_list_are_never_taken_from_a_file() {
        let got = p("A=1\nMAM_OPENSSL=/x/evil\nMAM_BIN=/x/evil\nMAM_TRUSTED_ROOTS=*\nPATH=/x\nB=2\n");
        assert_eq!(got.entries.iter().map(|e| e.0.as_str()).collect::<Vec<_>>(), ["A", "B"]);
        assert_eq!(got.warnings[0], "WARNING: f:2: MAM_OPENSSL is taken from the environment only; line skipped");
        assert_eq!(got.warnings.len(), 4);
        assert!(got.warnings.iter().all(|w| !w.contains("/x")), "{:?}", got.warnings);
    }

    #[test]
    fn refusals_name_the_file_and_why() {
        let e = |kind| EnvFileError { path: "/x/.mam.env".into(), kind }.to_string();
        assert_eq!(
            e(ErrorKind::Refused(Why::OwnedBy { owner: 65534, me: 0 })),
            "/x/.mam.env: refused: owned by uid 65534, not you (uid 0)"
        );
        assert_eq!(
            e(ErrorKind::RefusedDir(Why::WritableByOthers { mode: 0o777 })),
            "/x/.mam.env: refused: directory /x: writable by others (mode 0777)"
        );
        assert_eq!(e(ErrorKind::Permission), "/x/.mam.env: cannot read (PermissionError)");
    }

    #[test]
    fn invalid_utf8_is_undecodable() {
        assert_eq!(parse("f", b"A=\xff\n"), Err(ErrorKind::UnicodeDecode));
    }
}
