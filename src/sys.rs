//! The one home of `unsafe` and raw libc calls: random bytes, flock, signals, process probes, and the
//! file primitives every writer in mam uses (atomic write, locked append, lazy directory creation).
//!
//! Everything here returns `io::Result` and prints nothing. No other module may use `unsafe`
//! (the tidy test enforces it). With the `lockcheck` feature, `spawn`, `connect` and `sleep` panic
//! when the calling thread holds the registry lock L1 (CORE 0.6, X8).

use std::cell::Cell;
use std::ffi::OsStr;
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

// ---------------------------------------------------------------------------------------------
// Random bytes (CORE 0.4)

/// Fills `buf` from getrandom(2), falling back to /dev/urandom.
pub fn random_bytes(buf: &mut [u8]) -> io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        let rest = &mut buf[filled..];
        // SAFETY: `rest` is a valid, writable slice of `rest.len()` bytes for the whole call.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return File::open("/dev/urandom")?.read_exact(&mut buf[filled..]);
        }
        filled += n as usize;
    }
    Ok(())
}

/// `n` random bytes as lowercase hex (2n characters).
pub fn random_hex(n: usize) -> io::Result<String> {
    let mut buf = vec![0u8; n];
    random_bytes(&mut buf)?;
    Ok(hex(&buf))
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

// ---------------------------------------------------------------------------------------------
// Directories and files (CORE 0.5)

/// Creates `dir` and its missing parents with mode 0700. Existing directories keep their mode.
/// The last component must end up a real directory: a planted symlink there (to a directory of
/// someone else's choosing) is an error, never followed by the writes that come next (issue 12).
pub fn create_dir_all(dir: &Path) -> io::Result<()> {
    create_dir_all_mode(dir, 0o700)
}

/// `create_dir_all` with the mode of the directories it creates (installed asset directories are
/// 0755 so a repository's other users can read the skills, ORCH 7.2).
pub fn create_dir_all_mode(dir: &Path, mode: u32) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(mode).create(dir)?;
    if fs::symlink_metadata(dir)?.file_type().is_symlink() {
        return Err(symlink_refused());
    }
    Ok(())
}

fn symlink_refused() -> io::Error {
    io::Error::other("is a symbolic link; not followed")
}

/// ELOOP from an `O_NOFOLLOW` open means the last component is a symlink: say so.
fn nofollow_error(e: io::Error) -> io::Error {
    if e.raw_os_error() == Some(libc::ELOOP) {
        symlink_refused()
    } else {
        e
    }
}

/// Only regular files are written, appended to or locked: not a FIFO, device or directory that a
/// planted name might hold.
fn regular(f: File) -> io::Result<File> {
    if f.metadata()?.file_type().is_file() {
        Ok(f)
    } else {
        Err(io::Error::other("not a regular file; not written"))
    }
}

/// `OpenOptions` for every open that writes: `O_NOFOLLOW` (a symlink as last component fails with
/// ELOOP instead of being followed) and new files 0600 (CORE 0.5, issue 12).
fn write_options() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.mode(0o600).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
    o
}

/// Opens `path` for appending, creating it 0600; never follows a symlink (issue 12).
pub fn open_append(path: &Path) -> io::Result<File> {
    write_options().append(true).create(true).open(path).map_err(nofollow_error).and_then(regular)
}

/// Creates `path`, which must not exist yet (O_EXCL), 0600, for writing.
pub fn create_new(path: &Path) -> io::Result<File> {
    write_options().write(true).create_new(true).open(path).map_err(nofollow_error)
}

/// Writes `bytes` to `path` (created 0600 or truncated) without following a symlink. For files whose
/// readers tolerate a torn write (the fake backend's pane state); records use `atomic_write`.
pub fn write_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut f =
        write_options().write(true).create(true).truncate(true).open(path).map_err(nofollow_error).and_then(regular)?;
    f.write_all(bytes)
}

/// Opens `path` read-only without following a symlink as its last component, together with its
/// directory, so the caller can fstat both descriptors (no check-then-open race): the directory is
/// opened first, then the file relative to it (`openat`, `O_NOFOLLOW`).
pub fn open_read_nofollow_with_dir(path: &Path) -> io::Result<(File, File)> {
    let dir_path = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?;
    let dir = OpenOptions::new().read(true).custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC).open(dir_path)?;
    let cname = std::ffi::CString::new(name.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `dir` is an open directory descriptor owned for the whole call and `cname` is a valid
    // NUL-terminated string; openat does not keep either pointer.
    let fd =
        unsafe { libc::openat(dir.as_raw_fd(), cname.as_ptr(), libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by openat, is valid, and nothing else owns it.
    let file = unsafe { File::from_raw_fd(fd) };
    Ok((dir, file))
}

/// An open directory whose entries are read by name relative to it (`openat`, `fstatat`): a scan
/// of a registry of 100,000 records resolves one name per file instead of every component of its
/// path. Symlinks are followed, as `fs::read` follows them.
#[derive(Debug)]
pub struct DirHandle(File);

impl DirHandle {
    pub fn open(path: &Path) -> io::Result<DirHandle> {
        OpenOptions::new().read(true).custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC).open(path).map(DirHandle)
    }

    /// Reads the file `name` (relative to the directory) into `buf`, which is cleared first;
    /// `Ok(false)` when it does not exist. Unlike `fs::read` it asks for no size first (one
    /// statx less per file, and no read for the EOF after a short one): `buf` is reused, so it
    /// grows only to the largest file read.
    pub fn read_into(&self, name: &OsStr, buf: &mut Vec<u8>) -> io::Result<bool> {
        buf.clear();
        let cname =
            std::ffi::CString::new(name.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: `self.0` is an open directory descriptor owned for the whole call and `cname` is a
        // valid NUL-terminated string; openat keeps neither pointer.
        let fd = unsafe { libc::openat(self.0.as_raw_fd(), cname.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::NotFound { Ok(false) } else { Err(e) };
        }
        // SAFETY: `fd` was just returned by openat, is valid, and nothing else owns it.
        let f = unsafe { File::from_raw_fd(fd) };
        loop {
            // Into the spare capacity, not zeroed first: a zero-fill of 8 KiB per file is a byte
            // loop at the release build's size-optimised level (docs/DESIGN.md "Release opt-level").
            buf.reserve(8192);
            let start = buf.len();
            let spare = buf.spare_capacity_mut();
            // SAFETY: `spare` is at least 8192 bytes of `buf`'s allocation past its length, owned
            // here for the call; read(2) writes at most that many bytes into it and keeps no pointer.
            let n = unsafe { libc::read(f.as_raw_fd(), spare.as_mut_ptr().cast(), 8192) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            let n = n as usize;
            // SAFETY: read(2) initialised the first `n` (<= 8192) bytes past the old length.
            unsafe { buf.set_len(start + n) };
            // A read of a regular file that returns less than asked has reached its end (the page
            // cache fills the whole request otherwise): no second read for the EOF.
            if n < 8192 {
                return Ok(true);
            }
        }
    }

    /// The modification time of `rel` (relative to the directory, symlinks followed) in ms since
    /// the epoch; `None` when it cannot be stat'ed.
    pub fn mtime_ms(&self, rel: &Path) -> Option<u64> {
        let cname = std::ffi::CString::new(rel.as_os_str().as_bytes()).ok()?;
        // SAFETY: an all-zero `stat` is a valid value for fstatat to overwrite.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: the directory descriptor is open, `cname` is NUL-terminated, and `st` is a valid
        // writable stat buffer; fstatat keeps no pointer.
        let rc = unsafe { libc::fstatat(self.0.as_raw_fd(), cname.as_ptr(), &mut st, 0) };
        if rc != 0 || st.st_mtime < 0 {
            return None;
        }
        Some(st.st_mtime as u64 * 1000 + st.st_mtime_nsec as u64 / 1_000_000)
    }
}

fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Writes `bytes` to `path` atomically: a temp file of its own in the same directory, fsync, rename
/// over the target, fsync the directory. A reader sees the old file or the new one, never a mix.
/// The result is always mode 0600; a symlink at `path` is replaced by the file, never written
/// through. The parent directory must exist (creation is the caller's decision, CORE 2.1 "lazy").
pub fn atomic_write(path: &Path, bytes: &[u8]) -> io::Result<()> {
    atomic_write_mode(path, bytes, 0o600)
}

/// `atomic_write` with the file mode given (permission bits only): installed assets are 0755 or
/// 0644, and a restored file gets back the mode it had (ORCH 7.4, A50). Like `atomic_write`, the
/// mode is never taken from the existing target or a link's target.
pub fn atomic_write_mode(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    replace_file(path, bytes, mode, true)
}

/// `atomic_write` without the directory fsync, for a file that mirrors another durable one
/// (status.json mirrors the record, CORE 5.5; issue 20): a reader sees the old file or the new
/// one, and the new one is fsynced before the rename, so a crash never leaves it torn or empty.
/// What a crash may lose is the rename itself, leaving the previous complete version, which the
/// next write moves forward.
pub fn atomic_write_mirror(path: &Path, bytes: &[u8]) -> io::Result<()> {
    replace_file(path, bytes, 0o600, false)
}

fn replace_file(path: &Path, bytes: &[u8], mode: u32, sync_dir: bool) -> io::Result<()> {
    let tmp = Staged::write(path, bytes, mode)?;
    tmp.commit(sync_dir)
}

/// The first half of an atomic write: the temp file written and fsynced, not yet renamed over its
/// target (issue 20: status.json is staged while the record is written). Dropped uncommitted, the
/// temp file is removed.
#[derive(Debug)]
pub struct Staged {
    tmp: PathBuf,
    path: PathBuf,
    done: bool,
}

impl Staged {
    /// Writes `bytes` to a temp name of its own beside `path` (mode `mode`) and fsyncs it.
    pub fn write(path: &Path, bytes: &[u8], mode: u32) -> io::Result<Staged> {
        let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let name =
            path.file_name().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?;
        let mut tmp_name = Vec::from(&b"."[..]);
        tmp_name.extend_from_slice(name.as_bytes());
        tmp_name.extend_from_slice(format!(".{}.{}.tmp", std::process::id(), random_hex(8)?).as_bytes());
        let staged = Staged { tmp: dir.join(OsStr::from_bytes(&tmp_name)), path: path.to_path_buf(), done: false };
        // O_EXCL|O_NOFOLLOW: a name planted in the directory is never opened. The mode is 0600
        // whatever the umask and whatever the target was (or pointed at): a record holds auth_token,
        // so its mode is never taken from an existing file or a link's target (issue 12).
        let mut f = create_new(&staged.tmp)?;
        {
            use std::os::unix::fs::PermissionsExt;
            f.set_permissions(fs::Permissions::from_mode(mode & 0o7777))?;
        }
        f.write_all(bytes)?;
        f.sync_all()?;
        Ok(staged)
    }

    /// The target this was staged for.
    pub fn target(&self) -> &Path {
        &self.path
    }

    /// Renames the temp file over the target, then fsyncs the directory when `sync_dir`.
    pub fn commit(mut self, sync_dir: bool) -> io::Result<()> {
        fs::rename(&self.tmp, &self.path)?;
        self.done = true;
        if sync_dir {
            let dir = self.path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
            fsync_dir(dir)?;
        }
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.done {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// True when `name` is one of mam's temp names (`.<name>.<pid>.<16hex>.tmp`).
pub fn is_temp_name(name: &OsStr) -> bool {
    let b = name.as_bytes();
    b.starts_with(b".") && b.ends_with(b".tmp")
}

/// Appends `line` (which must end in `\n`) to `path` in one write(2) on an O_APPEND descriptor
/// while holding flock on that descriptor (CORE 0.5, A20). Creates the file with mode 0600; a
/// symlink at `path` is an error, never followed.
pub fn append_locked(path: &Path, line: &[u8]) -> io::Result<()> {
    let f = open_append(path)?;
    let lock = Flock::acquire(f, LockMode::Exclusive)?;
    let mut written = 0;
    // One write(2) for the whole line; a short write (disk nearly full) continues rather than tears.
    while written < line.len() {
        match (&lock.file).write(&line[written..]) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "short append")),
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// flock (CORE 0.6)

/// Shared or exclusive flock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockMode {
    Shared,
    Exclusive,
}

/// A held flock; released when dropped (closing the descriptor releases it too).
#[derive(Debug)]
pub struct Flock {
    pub file: File,
    registry: bool,
}

fn flock_raw(file: &File, op: libc::c_int) -> io::Result<()> {
    loop {
        // SAFETY: the descriptor is owned by `file` and stays open for the duration of the call.
        let rc = unsafe { libc::flock(file.as_raw_fd(), op) };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

impl Flock {
    /// Blocks until the lock is held.
    pub fn acquire(file: File, mode: LockMode) -> io::Result<Flock> {
        let op = match mode {
            LockMode::Shared => libc::LOCK_SH,
            LockMode::Exclusive => libc::LOCK_EX,
        };
        flock_raw(&file, op)?;
        Ok(Flock { file, registry: false })
    }

    /// Returns `Ok(None)` when another descriptor holds a conflicting lock.
    pub fn try_acquire(file: File, mode: LockMode) -> io::Result<Option<Flock>> {
        let op = match mode {
            LockMode::Shared => libc::LOCK_SH,
            LockMode::Exclusive => libc::LOCK_EX,
        } | libc::LOCK_NB;
        match flock_raw(&file, op) {
            Ok(()) => Ok(Some(Flock { file, registry: false })),
            Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Opens (creating with mode 0600, never deleting) the lock file at `path` and locks it.
    pub fn lock_path(path: &Path, mode: LockMode) -> io::Result<Flock> {
        Flock::acquire(open_lock_file(path)?, mode)
    }

    /// Marks this lock as the registry lock L1 for the `lockcheck` feature.
    pub fn mark_registry(mut self) -> Flock {
        self.registry = true;
        L1_DEPTH.with(|d| d.set(d.get() + 1));
        self
    }
}

impl Drop for Flock {
    fn drop(&mut self) {
        if self.registry {
            L1_DEPTH.with(|d| d.set(d.get() - 1));
        }
        let _ = flock_raw(&self.file, libc::LOCK_UN);
    }
}

/// Opens a lock file for flock, creating it (0600) when missing. Lock files are never deleted. A
/// symlink at `path` is an error: a planted link must not make mam create or lock a file of
/// someone else's choosing (issue 12).
pub fn open_lock_file(path: &Path) -> io::Result<File> {
    write_options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(nofollow_error)
        .and_then(regular)
}

thread_local! {
    static L1_DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// True when the current thread holds the registry lock L1.
pub fn holds_registry_lock() -> bool {
    L1_DEPTH.with(|d| d.get() > 0)
}

fn lockcheck(what: &str) {
    if cfg!(feature = "lockcheck") && holds_registry_lock() {
        panic!("lockcheck: {what} while holding the registry lock L1 (CORE 0.6)");
    }
}

/// `Command::spawn`, checked against L1.
pub fn spawn(cmd: &mut Command) -> io::Result<Child> {
    lockcheck("spawn");
    cmd.spawn()
}

// ---------------------------------------------------------------------------------------------
// Readiness: epoll and a wake-up descriptor (the broker's loop, issue 17)

/// Readiness bits of `Epoll` (level-triggered).
pub const EPOLL_IN: u32 = libc::EPOLLIN as u32;
pub const EPOLL_OUT: u32 = libc::EPOLLOUT as u32;
/// Error or hang-up: reported whether asked for or not.
pub const EPOLL_ERR: u32 = (libc::EPOLLERR | libc::EPOLLHUP) as u32;

/// One epoll instance; each registered descriptor carries a caller-chosen token.
pub struct Epoll {
    fd: OwnedFd,
}

/// The buffer `Epoll::wait` fills: `(token, readiness bits)` per ready descriptor.
pub struct EpollEvents {
    raw: Vec<libc::epoll_event>,
    len: usize,
}

impl EpollEvents {
    pub fn with_capacity(n: usize) -> EpollEvents {
        EpollEvents { raw: vec![libc::epoll_event { events: 0, u64: 0 }; n.max(1)], len: 0 }
    }

    pub fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.raw[..self.len].iter().map(|e| (e.u64, e.events))
    }
}

impl Epoll {
    pub fn new() -> io::Result<Epoll> {
        // SAFETY: epoll_create1 takes no pointers; a non-negative result is a new descriptor we own.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by epoll_create1 and nothing else owns it.
        Ok(Epoll { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, token: u64, events: u32) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: `ev` is a valid epoll_event for the duration of the call; the kernel copies it.
        if unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), op, fd, &mut ev) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    pub fn add(&self, fd: &impl AsRawFd, token: u64, events: u32) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd.as_raw_fd(), token, events)
    }

    pub fn modify(&self, fd: &impl AsRawFd, token: u64, events: u32) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_MOD, fd.as_raw_fd(), token, events)
    }

    pub fn delete(&self, fd: &impl AsRawFd) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_DEL, fd.as_raw_fd(), 0, 0)
    }

    /// Waits up to `timeout` (None: no limit) for readiness; an interrupted wait returns no events.
    pub fn wait(&self, events: &mut EpollEvents, timeout: Option<Duration>) -> io::Result<()> {
        let ms = match timeout {
            None => -1,
            // Rounded up, so a wait for a timer that is 0.3 ms away does not spin.
            Some(d) => i32::try_from(d.as_micros().div_ceil(1000)).unwrap_or(i32::MAX),
        };
        let cap = i32::try_from(events.raw.len()).unwrap_or(i32::MAX);
        // SAFETY: `raw` holds `cap` writable epoll_event entries; the kernel writes at most `cap`.
        let n = unsafe { libc::epoll_wait(self.fd.as_raw_fd(), events.raw.as_mut_ptr(), cap, ms) };
        if n < 0 {
            events.len = 0;
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted { Ok(()) } else { Err(e) };
        }
        events.len = n as usize;
        Ok(())
    }
}

/// A descriptor another thread makes readable to wake a loop blocked in `Epoll::wait` (eventfd).
pub struct Waker {
    file: File,
}

impl Waker {
    pub fn new() -> io::Result<Waker> {
        // SAFETY: eventfd takes no pointers; a non-negative result is a new descriptor we own.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by eventfd and nothing else owns it.
        Ok(Waker { file: unsafe { File::from_raw_fd(fd) } })
    }

    /// Makes the descriptor readable (a full counter is readable already: the error is moot).
    pub fn wake(&self) {
        let _ = (&self.file).write(&1u64.to_ne_bytes());
    }

    /// Resets the descriptor to not readable.
    pub fn drain(&self) {
        let _ = (&self.file).read(&mut [0u8; 8]);
    }
}

impl AsRawFd for Waker {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

/// Sends the ACK the kernel holds back for `stream` now (TCP_QUICKACK, Linux): a peer whose small
/// writes wait on Nagle for that ACK sends them at once instead of after the delayed-ACK timer
/// (40 ms). The setting is not sticky: the kernel may delay ACKs again later.
pub fn tcp_quickack(stream: &impl AsRawFd) -> io::Result<()> {
    let one: libc::c_int = 1;
    // SAFETY: `stream` is an open socket descriptor for the call; `one` lives across it and the
    // length passed is its size.
    let r = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_QUICKACK,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `TcpStream::connect_timeout`, checked against L1.
pub fn connect(addr: &SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    lockcheck("connect");
    TcpStream::connect_timeout(addr, timeout)
}

/// `thread::sleep`, checked against L1.
pub fn sleep(d: Duration) {
    lockcheck("sleep");
    std::thread::sleep(d)
}

// ---------------------------------------------------------------------------------------------
// Signals

static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn record_signal(sig: libc::c_int) {
    SIGNAL.store(sig, Ordering::SeqCst);
}

/// Installs handlers for SIGTERM and SIGINT that only record the signal number; long-running
/// commands poll `pending_signal()` between blocking slices of at most 200 ms.
pub fn install_stop_handlers() -> io::Result<()> {
    install_signal_recorders(&[libc::SIGTERM, libc::SIGINT])
}

/// Installs, for each of `sigs`, the handler of `install_stop_handlers` that only records the
/// signal number for `pending_signal()` (the fake agent's `on_stop_write` also records SIGHUP).
pub fn install_signal_recorders(sigs: &[i32]) -> io::Result<()> {
    for &sig in sigs {
        // SAFETY: a zeroed sigaction is a valid starting point; the handler only stores to an
        // atomic, which is async-signal-safe.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = record_signal as *const () as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            sa.sa_flags = 0;
            if libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

/// The last recorded signal (SIGTERM/SIGINT after `install_stop_handlers`), or None.
pub fn pending_signal() -> Option<i32> {
    match SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// `SIGTERM` -> "SIGTERM" and so on, for the signal lines of watch and the daemon.
pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGKILL => "SIGKILL",
        libc::SIGHUP => "SIGHUP",
        _ => "SIGNAL",
    }
}

/// Sends `sig` to `pid` (or to a process group when `pid` is negative). Pids usually come from
/// files, so `-1` (every process), `0` (our own group) and `1` (init, or group 1 as `-1`) are refused
/// with `InvalidInput` naming the pid; only the existence probe (signal 0) may name them.
pub fn kill(pid: i32, sig: i32) -> io::Result<()> {
    if (-1..=1).contains(&pid) && sig != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("refusing to send signal {sig} to pid {pid} (not a single process or group above 1)"),
        ));
    }
    // SAFETY: kill(2) has no memory-safety preconditions.
    if unsafe { libc::kill(pid, sig) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// True when a process with this pid exists (zombies included) and may be signalled by us.
/// True when `p` is a regular file (links followed, as a reader would) holding at least one byte: a
/// job's report counts as written only then.
pub fn is_nonempty_file(p: &Path) -> bool {
    fs::metadata(p).is_ok_and(|m| m.is_file() && m.len() > 0)
}

pub fn process_exists(pid: i32) -> bool {
    pid > 0 && (kill(pid, 0).is_ok() || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM))
}

/// Start time of `pid` in clock ticks since boot (field 22 of /proc/<pid>/stat), and whether it
/// is a zombie.
pub fn proc_start_ticks(pid: i32) -> io::Result<(u64, bool)> {
    let fields = proc_stat_fields(pid)?;
    let ticks = fields.get(19).and_then(|s| s.parse::<u64>().ok()).ok_or_else(bad_stat)?;
    Ok((ticks, fields.first().map(String::as_str) == Some("Z")))
}

/// Fields 3.. of /proc/<pid>/stat (state first). The comm field may hold spaces and parentheses,
/// so the split starts after the last ')'.
fn proc_stat_fields(pid: i32) -> io::Result<Vec<String>> {
    let stat = fs::read(format!("/proc/{pid}/stat"))?;
    let close = stat.iter().rposition(|&b| b == b')').ok_or_else(bad_stat)?;
    Ok(String::from_utf8_lossy(&stat[close + 1..]).split_whitespace().map(str::to_string).collect())
}

fn bad_stat() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "bad /proc stat")
}

/// argv of `pid` from /proc/<pid>/cmdline.
pub fn proc_cmdline(pid: i32) -> io::Result<Vec<Vec<u8>>> {
    let raw = fs::read(format!("/proc/{pid}/cmdline"))?;
    let mut args: Vec<Vec<u8>> = raw.split(|&b| b == 0).map(|s| s.to_vec()).collect();
    if args.last().is_some_and(|a| a.is_empty()) {
        args.pop();
    }
    Ok(args)
}

/// Parent pid of `pid` (field 4 of /proc/<pid>/stat).
pub fn proc_ppid(pid: i32) -> io::Result<i32> {
    proc_stat_fields(pid)?.get(1).and_then(|s| s.parse().ok()).ok_or_else(bad_stat)
}

/// The foreground process group of `pid`'s controlling terminal (field 8 of /proc/<pid>/stat;
/// -1 without a terminal).
pub fn proc_tpgid(pid: i32) -> io::Result<i32> {
    proc_stat_fields(pid)?.get(5).and_then(|s| s.parse().ok()).ok_or_else(bad_stat)
}

/// The value of `name` in `pid`'s initial environment (/proc/<pid>/environ; our own user's
/// processes only).
pub fn proc_environ_var(pid: i32, name: &str) -> io::Result<Option<Vec<u8>>> {
    let raw = fs::read(format!("/proc/{pid}/environ"))?;
    let key = format!("{name}=");
    Ok(raw.split(|&b| b == 0).find_map(|e| e.strip_prefix(key.as_bytes()).map(<[u8]>::to_vec)))
}

/// Makes the child start in a new session (setsid), for detached timers, daemons and job groups.
pub fn set_new_session(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: setsid is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The current process's real user id.
pub fn getuid() -> u32 {
    // SAFETY: getuid cannot fail and has no preconditions.
    unsafe { libc::getuid() }
}

/// The current process's effective user id: the owner of the files it creates.
pub fn geteuid() -> u32 {
    // SAFETY: geteuid cannot fail and has no preconditions.
    unsafe { libc::geteuid() }
}

/// Absolute form of `p` against `base`, normalised lexically (no symlink resolution, CORE 2.1).
pub fn absolutize(base: &Path, p: &Path) -> PathBuf {
    let joined = if p.is_absolute() { p.to_path_buf() } else { base.join(p) };
    normalize(&joined)
}

/// Lexical normalisation: drops `.` components and folds `..` into its parent.
pub fn normalize(p: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            other => out.push(other.as_os_str()),
        }
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    out
}

// ---------------------------------------------------------------------------------------------
// watch/remote (issue 6): process-group liveness for the runner's killpg escalation (CORE 9.3).

/// True while process group `pgid` has a member that is not a zombie. A zombie (an exited member
/// nobody has reaped yet, e.g. an orphan whose new parent is slow to reap) cannot run or hold
/// anything, so it does not count.
pub fn group_alive(pgid: i32) -> bool {
    if pgid <= 0 {
        return false;
    }
    if let Err(e) = kill(-pgid, 0) {
        if e.raw_os_error() == Some(libc::ESRCH) {
            return false;
        }
    }
    let Ok(rd) = fs::read_dir("/proc") else { return true };
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let Ok(stat) = fs::read(format!("/proc/{pid}/stat")) else { continue };
        let Some(close) = stat.iter().rposition(|&b| b == b')') else { continue };
        let rest = String::from_utf8_lossy(&stat[close + 1..]);
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // fields[0] is field 3 (state), fields[2] is field 5 (pgrp).
        if fields.get(2).and_then(|p| p.parse::<i32>().ok()) == Some(pgid) && fields.first() != Some(&"Z") {
            return true;
        }
    }
    false
}

// ---------------------------------------------------------------------------------------------
// Directories by descriptor (issue 29): install, update and remove walk from the target one
// component at a time with `O_NOFOLLOW|O_DIRECTORY` and then act with the *at() calls on the
// directory they opened, so nothing swapped in after a check (a component turned into a symlink)
// can send a write or a delete elsewhere: there is no path left to re-resolve.

/// What `fstatat(AT_SYMLINK_NOFOLLOW)` says about one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryStat {
    pub kind: EntryKind,
    /// `st_mode & 0o7777`.
    pub mode: u32,
    pub uid: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Dir,
    Link,
    /// A FIFO, socket or device.
    Other,
}

fn entry_stat(st: &libc::stat) -> EntryStat {
    let kind = match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => EntryKind::File,
        libc::S_IFDIR => EntryKind::Dir,
        libc::S_IFLNK => EntryKind::Link,
        _ => EntryKind::Other,
    };
    EntryStat { kind, mode: st.st_mode & 0o7777, uid: st.st_uid }
}

fn c_name(name: &OsStr) -> io::Result<std::ffi::CString> {
    let b = name.as_bytes();
    // One component only: a `/` would let the kernel walk (and follow) more than the one name, and
    // `..` would leave the directory.
    if b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a single path component"));
    }
    std::ffi::CString::new(b).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn check_rc(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// An open directory; every name given to its methods is one component (no `/`), never followed
/// when it is a symlink.
#[derive(Debug)]
pub struct Dir(File);

impl Dir {
    /// Opens `path` (symlinks in it followed: this is the directory the caller named).
    pub fn open(path: &Path) -> io::Result<Dir> {
        OpenOptions::new().read(true).custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC).open(path).map(Dir)
    }

    fn openat(&self, name: &OsStr, flags: libc::c_int, mode: libc::c_uint) -> io::Result<File> {
        self.openat_c(&c_name(name)?, flags, mode)
    }

    fn openat_c(&self, c: &std::ffi::CStr, flags: libc::c_int, mode: libc::c_uint) -> io::Result<File> {
        // SAFETY: `self.0` is an open directory descriptor owned for the whole call and `c` is a
        // valid NUL-terminated string; openat keeps neither pointer.
        let fd = unsafe { libc::openat(self.0.as_raw_fd(), c.as_ptr(), flags | libc::O_CLOEXEC, mode) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by openat, is valid, and nothing else owns it.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// The subdirectory `name`; a symlink there fails (ELOOP), a non-directory fails (ENOTDIR).
    pub fn open_dir(&self, name: &OsStr) -> io::Result<Dir> {
        self.openat(name, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW, 0).map(Dir)
    }

    /// Creates the subdirectory `name` with `mode` (permission bits only, umask applies).
    pub fn make_dir(&self, name: &OsStr, mode: u32) -> io::Result<()> {
        let c = c_name(name)?;
        // SAFETY: as in `openat`: a valid descriptor and NUL-terminated string, neither kept.
        check_rc(unsafe { libc::mkdirat(self.0.as_raw_fd(), c.as_ptr(), (mode & 0o777) as libc::mode_t) })
    }

    /// The entry `name` itself (a symlink is reported as one), `None` when there is none.
    pub fn stat(&self, name: &OsStr) -> io::Result<Option<EntryStat>> {
        let c = c_name(name)?;
        // SAFETY: an all-zero `stat` is a valid value for fstatat to overwrite.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a valid descriptor, a NUL-terminated string and a writable stat buffer; fstatat
        // keeps no pointer.
        let rc = unsafe { libc::fstatat(self.0.as_raw_fd(), c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
        match check_rc(rc) {
            Ok(()) => Ok(Some(entry_stat(&st))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// This directory's own owner and mode (fstat on the descriptor: the directory opened, not
    /// whatever its path names now).
    pub fn own_stat(&self) -> io::Result<EntryStat> {
        use std::os::unix::fs::MetadataExt;
        let m = self.0.metadata()?;
        Ok(EntryStat { kind: EntryKind::Dir, mode: m.mode() & 0o7777, uid: m.uid() })
    }

    /// Opens the regular file `name` for reading: `O_NOFOLLOW` (a symlink fails), `O_NONBLOCK` (a
    /// planted FIFO cannot block), and the descriptor must be a regular file. Returns it with its
    /// owner and mode from fstat.
    pub fn open_file(&self, name: &OsStr) -> io::Result<(File, EntryStat)> {
        use std::os::unix::fs::MetadataExt;
        let f = self.openat(name, libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK, 0).map_err(nofollow_error)?;
        let m = f.metadata()?;
        if !m.file_type().is_file() {
            return Err(io::Error::other("not a regular file"));
        }
        Ok((f, EntryStat { kind: EntryKind::File, mode: m.mode() & 0o7777, uid: m.uid() }))
    }

    /// Writes `bytes` as `name` by temp + rename inside this directory: the temp is created
    /// `O_EXCL|O_NOFOLLOW` 0600, set to `mode & 0o777` (never a setuid, setgid or sticky bit),
    /// fsynced, renamed over `name` (a link there is replaced, not followed), and the directory
    /// fsynced. The temp is named `.<name>.<pid>.<16 hex>.tmp` as `atomic_write`'s.
    pub fn write_file(&self, name: &OsStr, bytes: &[u8], mode: u32) -> io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let mut tmp = Vec::from(&b"."[..]);
        tmp.extend_from_slice(name.as_bytes());
        tmp.extend_from_slice(format!(".{}.{}.tmp", std::process::id(), random_hex(8)?).as_bytes());
        let tmp = OsStr::from_bytes(&tmp);
        let mut f = self.openat(tmp, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW, 0o600)?;
        let done = (|| {
            f.set_permissions(fs::Permissions::from_mode(mode & 0o777))?;
            f.write_all(bytes)?;
            f.sync_all()?;
            self.rename(tmp, self, name)
        })();
        if done.is_err() {
            let _ = self.unlink(tmp);
        }
        done?;
        self.0.sync_all()
    }

    /// renameat(2): `from` here to `to` in `to_dir`; neither name is followed.
    pub fn rename(&self, from: &OsStr, to_dir: &Dir, to: &OsStr) -> io::Result<()> {
        let (a, b) = (c_name(from)?, c_name(to)?);
        // SAFETY: two valid directory descriptors and two NUL-terminated strings; renameat keeps
        // no pointer.
        check_rc(unsafe { libc::renameat(self.0.as_raw_fd(), a.as_ptr(), to_dir.0.as_raw_fd(), b.as_ptr()) })
    }

    /// unlinkat(2) of a non-directory (a symlink itself, never its target).
    pub fn unlink(&self, name: &OsStr) -> io::Result<()> {
        let c = c_name(name)?;
        // SAFETY: a valid descriptor and a NUL-terminated string, neither kept.
        check_rc(unsafe { libc::unlinkat(self.0.as_raw_fd(), c.as_ptr(), 0) })
    }

    /// unlinkat(2, AT_REMOVEDIR) of an empty directory.
    pub fn remove_dir(&self, name: &OsStr) -> io::Result<()> {
        let c = c_name(name)?;
        // SAFETY: a valid descriptor and a NUL-terminated string, neither kept.
        check_rc(unsafe { libc::unlinkat(self.0.as_raw_fd(), c.as_ptr(), libc::AT_REMOVEDIR) })
    }

    /// The names in this directory (`.` and `..` left out), read through the descriptor.
    pub fn names(&self) -> io::Result<Vec<std::ffi::OsString>> {
        // The stream gets its own descriptor (closedir closes it): a fresh open of "." through ours.
        let own = self.openat_c(c".", libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
        let fd = std::os::fd::IntoRawFd::into_raw_fd(own);
        // SAFETY: `fd` is an open directory descriptor we own; on success fdopendir takes it over.
        let dirp = unsafe { libc::fdopendir(fd) };
        if dirp.is_null() {
            let e = io::Error::last_os_error();
            // SAFETY: fdopendir failed, so `fd` is still ours to close.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        let mut out = Vec::new();
        loop {
            // SAFETY: `dirp` is a valid stream until closedir below; readdir's entry is valid until
            // the next call on it, and its name is copied out before that.
            let ent = unsafe { libc::readdir(dirp) };
            if ent.is_null() {
                break;
            }
            // SAFETY: `d_name` of a returned entry is a NUL-terminated string inside `*ent`.
            let name = unsafe { std::ffi::CStr::from_ptr((*ent).d_name.as_ptr()) }.to_bytes();
            if name != b"." && name != b".." {
                out.push(OsStr::from_bytes(name).to_os_string());
            }
        }
        // SAFETY: `dirp` came from fdopendir and is closed once.
        unsafe { libc::closedir(dirp) };
        Ok(out)
    }
}

// ---------------------------------------------------------------------------------------------
// daemon (issue 6 part 2): the monitor lock's in-place content (A20) and process listing for the
// daemon selector (CORE 10.3). std's `set_len` and `write_all_at` are ftruncate(2) and pwrite(2),
// so these need no `unsafe` of their own.

/// Replaces the whole content of `file` in place: ftruncate to 0, then pwrite at offset 0 (A20: the
/// monitor lock's JSON is written through the locked descriptor, never by rename). A reader between
/// the two calls sees an empty file, which it treats as "pid not yet known".
pub fn write_in_place(file: &File, bytes: &[u8]) -> io::Result<()> {
    use std::os::unix::fs::{FileExt, MetadataExt};
    // Truncating a file that has another name too would change that other file (issue 12).
    let meta = file.metadata()?;
    if !meta.file_type().is_file() || meta.nlink() != 1 {
        return Err(io::Error::other("not a plain file with one link; not overwritten"));
    }
    file.set_len(0)?;
    file.write_all_at(bytes, 0)?;
    file.sync_data()
}

/// `(st_dev, st_ino)` of an open descriptor (fstat).
pub fn file_identity(file: &File) -> io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = file.metadata()?;
    Ok((m.dev(), m.ino()))
}

/// `(st_dev, st_ino)` of a path (stat, following symlinks).
pub fn path_identity(path: &Path) -> io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = fs::metadata(path)?;
    Ok((m.dev(), m.ino()))
}

/// Every pid listed in /proc (processes that exit meanwhile are simply missing from later reads).
pub fn list_pids() -> io::Result<Vec<i32>> {
    let mut out = Vec::new();
    for e in fs::read_dir("/proc")?.flatten() {
        if let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) {
            out.push(pid);
        }
    }
    Ok(out)
}

/// The cwd of `pid` (readlink /proc/<pid>/cwd).
pub fn proc_cwd(pid: i32) -> io::Result<PathBuf> {
    fs::read_link(format!("/proc/{pid}/cwd"))
}

/// Resident set size of `pid` in KiB (`VmRSS` of /proc/<pid>/status), for benchmarks.
pub fn proc_rss_kib(pid: i32) -> io::Result<u64> {
    proc_status_kib(pid, "VmRSS")
}

/// A KiB field of /proc/<pid>/status (`VmRSS`, `VmHWM`, `RssAnon`, `RssFile`), for benchmarks.
pub fn proc_status_kib(pid: i32, key: &str) -> io::Result<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/status"))?;
    text.lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(':')))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("no {key} in /proc/{pid}/status")))
}

/// CPU time the calling thread has used (`CLOCK_THREAD_CPUTIME_ID`, nanosecond resolution), for
/// the load generator's own cost.
pub fn thread_cpu_time() -> Duration {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(t.tv_sec.max(0) as u64, t.tv_nsec.clamp(0, 999_999_999) as u32)
}

/// CPU time of every thread of `pid` so far, in nanoseconds: the sum of the first field of
/// /proc/<pid>/task/*/schedstat (the scheduler's own accounting, nanoseconds, where /proc/<pid>/stat
/// counts 10 ms ticks). A thread that ended before the call is not counted.
pub fn proc_cpu_ns(pid: i32) -> io::Result<u64> {
    let mut total = 0u64;
    for e in fs::read_dir(format!("/proc/{pid}/task"))? {
        let text = match fs::read_to_string(e?.path().join("schedstat")) {
            Ok(t) => t,
            // The thread ended between the listing and the read.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        total += text.split_whitespace().next().and_then(|n| n.parse::<u64>().ok()).ok_or_else(bad_stat)?;
    }
    Ok(total)
}

/// How many descriptors `pid` has open (the entries of /proc/<pid>/fd).
pub fn proc_fd_count(pid: i32) -> io::Result<usize> {
    Ok(fs::read_dir(format!("/proc/{pid}/fd"))?.count())
}

/// Waits for the child `pid` (wait4) and returns its exit code (128 + the signal when killed) and
/// its peak resident set in KiB (`ru_maxrss`, for `mam bench`). Linux counts in `ru_maxrss` the
/// resident set the child had before its exec too, that is the spawner's: the caller knows its own.
pub fn wait_rusage(pid: i32) -> io::Result<(i32, u64)> {
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to overwrite.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: `status` and `ru` are valid writable locations for the duration of the call.
        let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
        if rc == pid {
            break;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    let code = if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { 128 + libc::WTERMSIG(status) };
    Ok((code, ru.ru_maxrss.max(0) as u64))
}

// ---------------------------------------------------------------------------------------------
// delegate (issue 7): the wrapper's subscriber child must not outlive the wrapper, also when the
// wrapper is killed with SIGKILL and cannot reap it.

/// Makes the child receive `sig` when the thread that spawned it exits (Linux `PR_SET_PDEATHSIG`;
/// elsewhere a no-op, and the caller's own reaping is the only guarantee).
pub fn set_parent_death_signal(cmd: &mut Command, sig: i32) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no memory of the parent.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, sig as libc::c_ulong, 0, 0, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (cmd, sig);
    }
}

// ---------------------------------------------------------------------------------------------
// broker credentials (issue 12 item 4): a private file read without following a planted link and
// written without ever looking at (or through) what the target name points to; the descriptor limit
// the broker's connection cap is kept under.

/// Opens `path` for reading with `O_NOFOLLOW` (a symlink fails with ELOOP) and `O_NONBLOCK` (a
/// planted FIFO cannot block the open). The caller checks the owner and mode on the descriptor.
pub fn open_nofollow_read(path: &Path) -> io::Result<File> {
    OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path)
}

/// True for the error `O_NOFOLLOW` gives when the last component is a symlink (ELOOP).
pub fn is_nofollow_error(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ELOOP)
}

/// The soft `RLIMIT_NOFILE` (None when unlimited or unknown).
pub fn nofile_limit() -> Option<u64> {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `r` is a valid, writable rlimit for the duration of the call.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) };
    (rc == 0 && r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (the broker's start, issue 17); returns the
/// soft limit in force afterwards (None when unlimited). An unlimited hard limit is left alone:
/// Linux refuses an infinite descriptor limit.
pub fn raise_nofile_limit() -> io::Result<Option<u64>> {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `r` is a valid, writable rlimit for the duration of the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if r.rlim_cur < r.rlim_max && r.rlim_max != libc::RLIM_INFINITY {
        let raised = libc::rlimit { rlim_cur: r.rlim_max, rlim_max: r.rlim_max };
        // SAFETY: `raised` is a valid rlimit; lowering nothing, raising soft to hard is allowed.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(nofile_limit())
}

/// What the Rust runtime's start-up would do before `main` and mam relies on, for a binary that
/// skips it (`#![no_main]`, src/main.rs): SIGPIPE ignored (a closed pipe is an EPIPE write error,
/// which `main` maps to rc 0), and descriptors 0-2 open (a closed one is reopened on /dev/null, so
/// a file opened later never becomes stdout). Skipped from the runtime: reading /proc/self/maps for
/// the main thread's stack guard and the stack-overflow signal handlers (a stack overflow is then a
/// plain SIGSEGV, where panic = "abort" would have aborted with a message).
pub fn process_start() {
    // SAFETY: setting a signal's disposition to SIG_IGN has no memory-safety requirement.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    let mut fds = [0, 1, 2].map(|fd| libc::pollfd { fd, events: 0, revents: 0 });
    // SAFETY: `fds` is a valid array of 3 pollfd for the duration of the call.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), 3, 0) };
    if rc < 0 {
        return;
    }
    for p in fds {
        if p.revents & libc::POLLNVAL != 0 {
            // SAFETY: the path is a NUL-terminated literal; the descriptor it returns is the lowest
            // free one, the closed standard descriptor, and is kept open for the process's life.
            unsafe {
                libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
            }
        }
    }
}

/// Host names are looked up in /etc/hosts and DNS only, in a build with glibc linked in statically
/// (`cargo build-static`, docs/DESIGN.md): its libc.a has those two sources built in and would
/// dlopen any other module `/etc/nsswitch.conf` names (mdns, myhostname, resolve, sss) from the
/// system's glibc, which need not be the version linked in. Called once before the first lookup;
/// a dynamic build follows nsswitch.conf and this does nothing.
pub fn builtin_host_lookup_only() {
    #[cfg(all(target_env = "gnu", target_feature = "crt-static"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            extern "C" {
                // glibc, <nss.h>: replaces the nsswitch.conf line of one database.
                fn __nss_configure_lookup(db: *const libc::c_char, service_line: *const libc::c_char) -> libc::c_int;
            }
            // SAFETY: both arguments are NUL-terminated literals; the call runs once, before this
            // process's first name lookup (the Once is passed before any lookup thread starts).
            unsafe {
                __nss_configure_lookup(c"hosts".as_ptr(), c"files dns".as_ptr());
            }
        });
    }
}

/// Makes every thread of this process allocate from one malloc arena (glibc gives each new
/// thread its own, with its own heap pages): for a long-lived process of two threads that
/// allocate a few KiB at a time, the heartbeat timer.
pub fn one_malloc_arena() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets an allocator parameter; M_ARENA_MAX with 1 is a valid value.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Gives freed heap memory back to the system (glibc keeps it in its arenas otherwise): the
/// broker calls it when its last connection has ended, so its RSS falls after clients leave.
/// Fixes glibc's mmap and trim thresholds at their defaults (128 KiB). Left dynamic, each large
/// buffer freed (a table of thousands of clients) raises both, so later large buffers land in a
/// thread's heap and the free space on its top (which `malloc_trim` does not return for a thread's
/// arena) stays resident: 3 MB after 5,000 clients left. `mam broker` calls it at start.
pub fn fix_malloc_thresholds() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets allocator parameters; the values are valid sizes.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 128 * 1024);
    }
}

pub fn release_free_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks the allocator's own free lists; 0 keeps no padding.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Drops this process's resident pages of read-only file mappings (mam's code and constants and,
/// dynamically linked, the shared libraries'): `madvise(MADV_DONTNEED)` only removes the page table
/// entries of clean file pages, which the next access maps again from the page cache, so nothing
/// is lost but the resident set. For a long-lived process whose steady state runs little code (the
/// heartbeat timer, issue 20) after start-up ran much. A mapping is dropped only when it is
/// private, not writable, backed by a file and holds no anonymous (copied-on-write) page: the
/// relocated read-only data of a position-independent binary (RELRO) is such a copy and is kept.
/// Returns the bytes advised. The mappings are all found first and then advised in one loop: code
/// that ran between two advices (the parsing, when a size-optimised build does not inline it)
/// would be mapped again, 64 KiB around each page it touches (the kernel's fault-around), and stay.
pub fn drop_file_pages() -> io::Result<u64> {
    let smaps = fs::read("/proc/self/smaps")?;
    let mut ranges = Vec::new();
    // The current mapping's range when it is a candidate.
    let mut candidate: Option<(usize, usize)> = None;
    for line in smaps.split(|&b| b == b'\n') {
        let Ok(line) = std::str::from_utf8(line) else { continue };
        let mut f = line.split_ascii_whitespace();
        let Some(first) = f.next() else { continue };
        if let Some(range) = first.split_once('-').filter(|(a, _)| !a.is_empty() && !a.ends_with(':')) {
            // A mapping header: `start-end perms offset dev inode path`.
            let perms = f.next().unwrap_or("");
            let path = f.nth(3);
            candidate = None;
            if (perms == "r-xp" || perms == "r--p") && path.is_some_and(|p| p.starts_with('/')) {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(range.0, 16), usize::from_str_radix(range.1, 16)) {
                    candidate = Some((a, b));
                }
            }
            continue;
        }
        if first == "Anonymous:" {
            let Some((a, b)) = candidate.take() else { continue };
            if f.next() != Some("0") {
                continue;
            }
            ranges.push((a, b));
        }
    }
    let mut total = 0;
    for (a, b) in ranges {
        // SAFETY: [a, b) is one whole private, read-only file mapping of this process as the
        // kernel lists it, with no page copied on write (so none this process changed, and
        // being read-only, none it can change); MADV_DONTNEED on it discards no data (its
        // pages are clean file pages, fetched again on the next access) and keeps the mapping.
        if unsafe { libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_DONTNEED) } == 0 {
            total += (b - a) as u64;
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropped_file_pages_come_back_and_written_pages_stay() {
        // A private read-only copy-on-write page with data in it (what RELRO is) is kept: the
        // mapping is written once while writable, then made read-only.
        let path = std::env::temp_dir().join(format!(".mam-drop-test-{}", std::process::id()));
        fs::write(&path, [7u8; 4096]).unwrap();
        let f = File::open(&path).unwrap();
        // SAFETY: a fresh private mapping of one page of a file this test owns.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: p is the writable page mapped above; then it is made read-only.
        unsafe {
            *(p as *mut u8) = 42;
            assert_eq!(libc::mprotect(p, 4096, libc::PROT_READ), 0);
        }
        let _ = fs::remove_file(&path);
        let dropped = drop_file_pages().unwrap();
        assert!(dropped > 0, "this test binary's own code is a read-only file mapping");
        // SAFETY: p is still mapped (read-only); its copied page must have kept the write.
        assert_eq!(unsafe { *(p as *const u8) }, 42);
        // SAFETY: unmapping the page mapped above.
        unsafe { libc::munmap(p, 4096) };
        // The code runs on from the page cache.
        assert_eq!(hex(&[0xab]), "ab");
    }

    #[test]
    fn raising_the_descriptor_limit_reaches_the_hard_limit() {
        let got = raise_nofile_limit().unwrap();
        let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: as in `nofile_limit`.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) }, 0);
        if r.rlim_max != libc::RLIM_INFINITY {
            assert_eq!((r.rlim_cur, got), (r.rlim_max, Some(r.rlim_max)));
        }
    }

    #[test]
    fn kill_refuses_pids_at_most_one_and_group_one() {
        // SIGCONT: harmless should the refusal ever be missing.
        for pid in [-1, 0, 1] {
            let e = kill(pid, libc::SIGCONT).expect_err("refused");
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{pid}: {e}");
            assert!(e.to_string().contains(&format!("pid {pid} ")), "{e}");
        }
        // The existence probe still works, and a real pid is signalled.
        assert!(kill(1, 0).is_ok() || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM));
        assert!(kill(std::process::id() as i32, libc::SIGCONT).is_ok());
    }
}

// ---------------------------------------------------------------------------------------------
// Terminals (`mam ui`, issue 22): the termios mode, the window size, raw reads and writes on a
// descriptor (no std buffer between a key and poll(2)), and signals delivered through a self-pipe.

/// A terminal's mode as tcgetattr(3) reads it; restore it with `set_term_mode`.
#[derive(Clone, Copy)]
pub struct TermMode(libc::termios);

impl std::fmt::Debug for TermMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TermMode(lflag {:#x})", self.0.c_lflag)
    }
}

impl TermMode {
    /// This mode made raw (cfmakeraw(3)): no echo, no line editing, no signal keys, no output
    /// processing; a read returns after one byte.
    pub fn raw(&self) -> TermMode {
        let mut t = self.0;
        // SAFETY: `t` is a valid termios copied from tcgetattr; cfmakeraw only edits its flags.
        unsafe { libc::cfmakeraw(&mut t) };
        t.c_cc[libc::VMIN] = 1;
        t.c_cc[libc::VTIME] = 0;
        TermMode(t)
    }
}

/// True when `fd` is a terminal.
pub fn is_tty(fd: RawFd) -> bool {
    // SAFETY: isatty takes a descriptor number only.
    unsafe { libc::isatty(fd) == 1 }
}

/// The terminal mode of `fd` (tcgetattr).
pub fn term_mode(fd: RawFd) -> io::Result<TermMode> {
    // SAFETY: a zeroed termios is a valid buffer that tcgetattr fills in.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: `t` is a valid, writable termios.
    if unsafe { libc::tcgetattr(fd, &mut t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(TermMode(t))
}

/// Sets the terminal mode of `fd` once the output written so far has been sent (TCSADRAIN).
pub fn set_term_mode(fd: RawFd, mode: &TermMode) -> io::Result<()> {
    loop {
        // SAFETY: `mode.0` is a termios read by tcgetattr (possibly made raw).
        if unsafe { libc::tcsetattr(fd, libc::TCSADRAIN, &mode.0) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// The window size of the terminal `fd`: (columns, rows).
pub fn window_size(fd: RawFd) -> io::Result<(u16, u16)> {
    // SAFETY: a zeroed winsize is a valid buffer for TIOCGWINSZ.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ writes one winsize into the pointed-to buffer.
    if unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((ws.ws_col, ws.ws_row))
}

/// One read(2) from `fd` (after poll said it is readable, so it does not block).
pub fn read_fd(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: `buf` is valid for `buf.len()` writable bytes.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Writes all of `bytes` to `fd` with write(2), taking no lock (a panic hook may run while the
/// panicking thread holds std's stdout lock).
pub fn write_all_fd(fd: RawFd, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        // SAFETY: `bytes` is valid for `bytes.len()` readable bytes.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                // A terminal someone left non-blocking: wait (at most 2 s) until it takes more.
                io::ErrorKind::WouldBlock => {
                    let mut p = libc::pollfd { fd, events: libc::POLLOUT, revents: 0 };
                    // SAFETY: `p` is one valid pollfd.
                    if unsafe { libc::poll(&mut p, 1, 2_000) } <= 0 {
                        return Err(e);
                    }
                    continue;
                }
                _ => return Err(e),
            }
        }
        bytes = &bytes[n as usize..];
    }
    Ok(())
}

/// The write end of the signal pipe (-1: none installed).
static SIGNAL_PIPE: AtomicI32 = AtomicI32::new(-1);

extern "C" fn pipe_signal(sig: libc::c_int) {
    let fd = SIGNAL_PIPE.load(Ordering::SeqCst);
    if fd >= 0 {
        let b = sig as u8;
        // SAFETY: write(2) is async-signal-safe; the pipe is non-blocking, so a full pipe drops the
        // byte (the reader is behind by then and wakes anyway). errno is saved and restored.
        unsafe {
            let saved = *libc::__errno_location();
            libc::write(fd, (&b as *const u8).cast(), 1);
            *libc::__errno_location() = saved;
        }
    }
}

/// Signals delivered as bytes on a pipe (the self-pipe trick), so a loop blocked in `Epoll::wait`
/// wakes for them. One per process; dropping it puts the default handlers back.
pub struct SignalPipe {
    read: File,
    write: File,
    sigs: Vec<i32>,
}

impl SignalPipe {
    /// A non-blocking pipe and, for each of `sigs`, a handler that writes the signal number to it.
    pub fn install(sigs: &[i32]) -> io::Result<SignalPipe> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 returns.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just returned by pipe2 and nothing else owns them.
        let (read, write) = unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
        SIGNAL_PIPE.store(write.as_raw_fd(), Ordering::SeqCst);
        let pipe = SignalPipe { read, write, sigs: sigs.to_vec() };
        for &sig in sigs {
            // SAFETY: a zeroed sigaction is a valid start; the handler only calls write(2) on a
            // descriptor that stays open while it is installed (Drop restores SIG_DFL first).
            unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = pipe_signal as *const () as libc::sighandler_t;
                libc::sigemptyset(&mut sa.sa_mask);
                sa.sa_flags = libc::SA_RESTART;
                if libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
        }
        Ok(pipe)
    }

    /// The signals received since the last call, in order.
    pub fn drain(&self) -> Vec<i32> {
        let mut out = Vec::new();
        let mut buf = [0u8; 64];
        while let Ok(n) = read_fd(self.read.as_raw_fd(), &mut buf) {
            if n == 0 {
                break;
            }
            out.extend(buf[..n].iter().map(|&b| b as i32));
            if n < buf.len() {
                break;
            }
        }
        out
    }
}

impl AsRawFd for SignalPipe {
    fn as_raw_fd(&self) -> RawFd {
        self.read.as_raw_fd()
    }
}

impl Drop for SignalPipe {
    fn drop(&mut self) {
        for &sig in &self.sigs {
            // SAFETY: restoring the default disposition has no memory preconditions.
            unsafe { libc::signal(sig, libc::SIG_DFL) };
        }
        SIGNAL_PIPE.store(-1, Ordering::SeqCst);
        let _ = &self.write; // closed with the struct, after the handlers are gone
    }
}

/// utime + stime of `pid` and of its waited-for children, in clock ticks (`/proc/<pid>/stat` fields
/// 14-17), and the ticks per second (`sysconf(_SC_CLK_TCK)`).
pub fn proc_cpu_ticks(pid: i32) -> io::Result<(u64, u64, u64)> {
    let f = proc_stat_fields(pid)?;
    let n = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok()).ok_or_else(bad_stat);
    // SAFETY: sysconf has no memory preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    // Fields 14-17 are at 11-14 here (the list starts at field 3, the state).
    Ok((n(11)? + n(12)?, n(13)? + n(14)?, hz))
}
