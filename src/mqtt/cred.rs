//! The embedded broker's credential file (CORE 11.1, issue 12 item 4): `<control root>/.mam/broker.cred`,
//! written by `mam broker` and read by every mam client of the workspace that has no
//! `MQTT_USERNAME`/`MQTT_PASSWORD` and talks to a loopback broker without TLS.
//!
//! The file is also a mosquitto client options file (`-u`, `-P`, `-p` lines, `#` comments), so
//! third-party clients can use it without the password in their argv. It is read only through a
//! descriptor opened with `O_NOFOLLOW` that is a regular file owned by this user with no group or
//! other permission bits; anything else is ignored with a reason, so a password is never sent to
//! a broker named by a file someone else planted. Nothing here prints, and the password only leaves
//! in the file itself and inside a `Secret`.

use std::fmt;
use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::sys;

/// The file's name inside `<control root>/.mam/`.
pub const FILE_NAME: &str = "broker.cred";
/// The username `mam broker` generates.
pub const USERNAME: &str = "mam";
/// A credential file larger than this is not one of ours.
const MAX_LEN: u64 = 4096;

/// `<control root>/.mam/broker.cred`.
pub fn path(control_root: &Path) -> PathBuf {
    control_root.join(".mam").join(FILE_NAME)
}

/// The broker's credentials and the port it listens on. `config` turns the password into a
/// `Secret`; here it is a `Password` (this file stays below `config`).
#[derive(Clone, PartialEq, Eq)]
pub struct Creds {
    pub username: String,
    pub password: Password,
    pub port: u16,
}

/// The password: no Display, a redacting Debug.
#[derive(Clone, PartialEq, Eq)]
pub struct Password(String);

impl Password {
    pub fn new(s: impl Into<String>) -> Password {
        Password(s.into())
    }
    /// The raw value, for CONNECT and the file only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Debug for Creds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Creds")
            .field("username", &self.username)
            .field("password", &self.password)
            .field("port", &self.port)
            .finish()
    }
}

/// Why a credential file was not used.
#[derive(Debug)]
pub enum ReadError {
    /// There is no file: the broker runs without generated credentials, or elsewhere.
    Missing,
    /// The file is there but not trustworthy (a link, not ours, readable by others): the reason.
    Unsafe(String),
    /// The file is ours but not a credential file: the reason.
    Invalid(String),
    Io(io::Error),
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Missing => f.write_str("no credential file"),
            ReadError::Unsafe(why) | ReadError::Invalid(why) => f.write_str(why),
            ReadError::Io(e) => write!(f, "unreadable ({e})"),
        }
    }
}

impl Creds {
    /// Fresh credentials: username `mam`, 32 random bytes as hex for the password.
    pub fn generate(port: u16) -> io::Result<Creds> {
        Ok(Creds { username: USERNAME.to_string(), password: Password::new(sys::random_hex(32)?), port })
    }

    /// The file's bytes.
    pub fn encode(&self) -> Vec<u8> {
        format!(
            "# mam broker credentials (CORE 11.1). Keep this file 0600.\n\
             # Also a mosquitto client options file: copy it to ~/.config/mosquitto_sub (or _pub).\n\
             -u {}\n-P {}\n-p {}\n",
            self.username,
            self.password.expose(),
            self.port
        )
        .into_bytes()
    }

    /// Parses the file's bytes: `-u`, `-P` and `-p` lines are required, `#` lines and blank lines
    /// are skipped, anything else is an error. The error never quotes a line (it may be a password).
    pub fn parse(bytes: &[u8]) -> Result<Creds, String> {
        let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8".to_string())?;
        let (mut user, mut pass, mut port) = (None, None, None);
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() || line.starts_with('#') {
                continue;
            }
            let (key, value) = line.split_once(' ').ok_or_else(|| format!("line {} is not '-x value'", n + 1))?;
            let slot = match key {
                "-u" => &mut user,
                "-P" => &mut pass,
                "-p" => &mut port,
                _ => return Err(format!("line {}: unknown option", n + 1)),
            };
            if value.is_empty() || value.contains(char::is_whitespace) || slot.replace(value.to_string()).is_some() {
                return Err(format!("line {}: empty, spaced or repeated value", n + 1));
            }
        }
        let port =
            port.ok_or("no -p line")?.parse::<u16>().ok().filter(|p| *p > 0).ok_or("-p is not a port 1-65535")?;
        Ok(Creds { username: user.ok_or("no -u line")?, password: Password::new(pass.ok_or("no -P line")?), port })
    }
}

/// Reads the credential file at `path` if it is a regular file of this user with no permission
/// bits for group or others, opened without following a symlink.
pub fn read(path: &Path) -> Result<Creds, ReadError> {
    let f = match sys::open_nofollow_read(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(ReadError::Missing),
        Err(e) if sys::is_nofollow_error(&e) => return Err(ReadError::Unsafe("a symlink".into())),
        Err(e) => return Err(ReadError::Io(e)),
    };
    let meta = f.metadata().map_err(ReadError::Io)?;
    if !meta.is_file() {
        return Err(ReadError::Unsafe("not a regular file".into()));
    }
    let me = sys::getuid();
    if meta.uid() != me {
        return Err(ReadError::Unsafe(format!("owned by uid {}, not by uid {me}", meta.uid())));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(ReadError::Unsafe(format!("mode {mode:04o}, not 0600")));
    }
    if meta.len() > MAX_LEN {
        return Err(ReadError::Invalid(format!("larger than {MAX_LEN} bytes")));
    }
    let mut bytes = Vec::new();
    f.take(MAX_LEN + 1).read_to_end(&mut bytes).map_err(ReadError::Io)?;
    Creds::parse(&bytes).map_err(ReadError::Invalid)
}

/// Why the directory of a credential file may not hold one: it must be a real directory (not a
/// symlink) of this user that nobody else can write to. Creates a missing one (0700).
pub fn check_dir(dir: &Path) -> Result<(), String> {
    if !dir.exists() {
        sys::create_dir_all(dir).map_err(|e| format!("cannot create {} ({e})", dir.display()))?;
    }
    let meta = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !meta.is_dir() {
        return Err(format!("{} is not a directory (a symlink?)", dir.display()));
    }
    let me = sys::getuid();
    if meta.uid() != me {
        return Err(format!("{} is owned by uid {}, not by uid {me}", dir.display(), meta.uid()));
    }
    if meta.permissions().mode() & 0o022 != 0 {
        return Err(format!("{} is writable by group or others", dir.display()));
    }
    Ok(())
}

/// Writes `creds` to `path` (0600, atomically, never through a link) after `check_dir` on its
/// directory.
pub fn write(path: &Path, creds: &Creds) -> Result<(), String> {
    let dir = path.parent().unwrap_or(Path::new("."));
    check_dir(dir)?;
    sys::atomic_write(path, &creds.encode()).map_err(|e| format!("cannot write {} ({e})", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_parse_round_trip_and_strictness() {
        let c = Creds::generate(1999).unwrap();
        assert_eq!(c.password.expose().len(), 64);
        assert_eq!(Creds::parse(&c.encode()).unwrap(), c);
        assert!(!format!("{c:?}").contains(c.password.expose()));
        for bad in [
            &b"-u mam\n-P x\n"[..],
            b"-u mam\n-P x\n-p 0\n",
            b"-u mam\n-P x\n-p 70000\n",
            b"-u mam\n-P x y\n-p 1\n",
            b"-u mam\n-P x\n-P y\n-p 1\n",
            b"-u mam\n-P x\n-p 1\n-h evil\n",
            b"\xff",
        ] {
            let e = Creds::parse(bad).unwrap_err();
            assert!(!e.contains("evil") && !e.contains(" y"), "{e}");
        }
    }

    #[test]
    fn only_a_private_regular_file_of_ours_is_read() {
        let dir = std::env::temp_dir().join(format!("mam-cred-{}", sys::random_hex(6).unwrap()));
        let mam = dir.join(".mam");
        check_dir(&mam).unwrap();
        let p = path(&dir);
        assert!(matches!(read(&p), Err(ReadError::Missing)));
        let c = Creds::generate(1883).unwrap();
        write(&p, &c).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(read(&p).unwrap(), c);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(read(&p), Err(ReadError::Unsafe(ref w)) if w.contains("0644")));
        // A symlink in its place is not followed on read, and replaced (not written through) on write.
        let target = dir.join("target");
        std::fs::write(&target, c.encode()).unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::remove_file(&p).unwrap();
        std::os::unix::fs::symlink(&target, &p).unwrap();
        assert!(matches!(read(&p), Err(ReadError::Unsafe(ref w)) if w.contains("symlink")));
        let c2 = Creds::generate(1884).unwrap();
        write(&p, &c2).unwrap();
        assert_eq!(read(&p).unwrap(), c2);
        assert_eq!(Creds::parse(&std::fs::read(&target).unwrap()).unwrap(), c, "the link's target is untouched");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
