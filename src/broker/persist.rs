//! The broker's state file (CORE 11.2 Persistence, issue 17): retained messages and persistent
//! sessions (subscriptions, QoS 1/2 messages in flight or queued, inbound QoS 2 ids awaiting
//! PUBREL) kept across a restart in `<control root>/.mam/broker.state`.
//!
//! `encode` and `decode` are pure and bounded: the encoder never produces more than `max_bytes`
//! (what does not fit is left out and counted, retained messages first in, queued messages last),
//! the decoder checks a SHA-256 trailer and every length against the bytes present, so a truncated
//! or damaged file is refused before anything is restored. `load` reads the file without following
//! a symlink, only when it is a regular file of this user closed to group and others and not
//! larger than `max_bytes`; anything else is set aside as `<name>.bad` with the reason. `Saver`
//! holds the file's lock for the broker's life and writes snapshots on its own thread (atomically:
//! temp file, fsync, rename, mode 0600), at most `interval` after a change and once more at
//! shutdown.
//!
//! It never touches a socket and decides nothing about routing; the loop thread only takes
//! snapshots (shared payloads, no copies) under the state lock.

use std::collections::HashMap;
use std::fmt;
use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, SyncSender};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::config::{BrokerConfig, Persist};
use super::route::{self, Retained};
use super::session::{Msg, Saved, SavedInflight, Session};
use super::state::{lock, Client, Shared, State};
use super::topic;
use crate::sys;
use crate::text::{count, show_path};

/// The file's first bytes: a name, then the format version.
const MAGIC: &[u8] = b"mam broker state\n";
const VERSION: u32 = 1;
const TRAILER: usize = 32;
/// A snapshot not yet written is retried this soon while the writer is still busy.
const BUSY_RETRY: Duration = Duration::from_millis(50);
/// The writer thread's stack: it only encodes and writes.
const WRITER_STACK: usize = 128 * 1024;

/// Where a message of a session stands (the record's kind byte).
const QUEUED: u8 = 0;
const PUBLISHED: u8 = 1;
const RELEASED: u8 = 2;

/// What the state file holds: retained messages by topic, persistent sessions by client id.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Snapshot {
    pub retained: Vec<(String, Retained)>,
    pub sessions: Vec<(String, Saved)>,
}

/// What `encode` could not fit under `max_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LeftOut {
    pub retained: usize,
    pub sessions: usize,
    pub messages: usize,
}

impl LeftOut {
    fn any(&self) -> bool {
        self.retained + self.sessions + self.messages > 0
    }
}

/// Why a file is not a state file this broker can restore; the text says what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corrupt(pub String);

impl fmt::Display for Corrupt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn corrupt(why: impl Into<String>) -> Corrupt {
    Corrupt(why.into())
}

/// The state the file keeps, taken under the state lock: retained messages and every persistent
/// session, connected or away (a connected one comes back as away). Payloads are shared, not copied.
pub(super) fn snapshot(st: &State) -> Snapshot {
    Snapshot {
        retained: st.retained.iter().map(|(t, r)| (t.clone(), r.clone())).collect(),
        sessions: st
            .clients
            .iter()
            .filter(|(_, c)| c.persistent)
            .map(|(id, c)| (id.clone(), c.session.save()))
            .collect(),
    }
}

fn put_u16(out: &mut Vec<u8>, n: u16) {
    out.extend_from_slice(&n.to_be_bytes());
}

fn put_u32(out: &mut Vec<u8>, n: usize) {
    // Every count and length here is bounded by `max_bytes` or a packet (< 256 MiB).
    out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes());
}

/// A topic, filter or client id: u16 length, then the bytes (MQTT strings are at most 65,535).
fn put_str(out: &mut Vec<u8>, s: &str) {
    let b = &s.as_bytes()[..s.len().min(u16::MAX as usize)];
    put_u16(out, b.len() as u16);
    out.extend_from_slice(b);
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_u32(out, b.len());
    out.extend_from_slice(b);
}

/// Encodes `s` in at most `max_bytes` (at least the empty file's size). Sections in order:
/// retained messages, sessions (id, next packet id, subscriptions, inbound QoS 2 ids), messages of
/// the sessions (in flight in send order, then queued), each message's topic and payload written
/// once however many sessions hold it. Past the limit the rest of a section is left out (a
/// session's messages from the first one that does not fit), counted in the `LeftOut`.
pub fn encode(s: &Snapshot, max_bytes: usize) -> (Vec<u8>, LeftOut) {
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    put_u32(&mut out, VERSION as usize);
    // Room kept for the counts still to come and the trailer.
    let fits = |out: &Vec<u8>, more: usize, after: usize| out.len() + more + after + TRAILER <= max_bytes;
    let mut left = LeftOut::default();
    let mut entry = Vec::new();

    let at = out.len();
    put_u32(&mut out, 0);
    let mut n = 0;
    for (t, r) in &s.retained {
        entry.clear();
        put_str(&mut entry, t);
        entry.push(r.qos);
        put_bytes(&mut entry, &r.payload);
        if fits(&out, entry.len(), 8) {
            out.extend_from_slice(&entry);
            n += 1;
        } else {
            left.retained += 1;
        }
    }
    out[at..at + 4].copy_from_slice(&(n as u32).to_be_bytes());

    let at = out.len();
    put_u32(&mut out, 0);
    let mut written = Vec::new();
    for (id, saved) in &s.sessions {
        entry.clear();
        put_str(&mut entry, id);
        put_u16(&mut entry, saved.next_pid);
        put_u32(&mut entry, saved.subs.len());
        for (f, q) in &saved.subs {
            put_str(&mut entry, f);
            entry.push(*q);
        }
        put_u32(&mut entry, saved.incoming.len());
        for &p in &saved.incoming {
            put_u16(&mut entry, p);
        }
        if fits(&out, entry.len(), 4) {
            out.extend_from_slice(&entry);
            written.push(saved);
        } else {
            left.sessions += 1;
            left.messages += saved.inflight.len() + saved.queued.len();
        }
    }
    out[at..at + 4].copy_from_slice(&(written.len() as u32).to_be_bytes());

    let at = out.len();
    put_u32(&mut out, 0);
    let mut n = 0;
    // (topic, payload) pointers -> index of the message written first.
    let mut defined: HashMap<(usize, usize), u32> = HashMap::new();
    for (i, saved) in written.iter().enumerate() {
        let msgs = saved.inflight.iter().map(|m| (if m.released { RELEASED } else { PUBLISHED }, m.pid, &m.msg));
        let msgs = msgs.chain(saved.queued.iter().map(|m| (QUEUED, 0, m)));
        let mut full = false;
        for (kind, pid, m) in msgs {
            if full {
                left.messages += 1;
                continue;
            }
            entry.clear();
            put_u32(&mut entry, i);
            entry.extend_from_slice(&[kind, m.qos, u8::from(m.retain)]);
            put_u16(&mut entry, pid);
            let key = (Arc::as_ptr(&m.topic) as *const u8 as usize, Arc::as_ptr(&m.payload) as *const u8 as usize);
            let next = defined.len() as u32;
            let def = match defined.get(&key) {
                Some(&r) => {
                    entry.extend_from_slice(&r.to_be_bytes());
                    false
                }
                None => {
                    entry.extend_from_slice(&next.to_be_bytes());
                    put_str(&mut entry, &m.topic);
                    put_bytes(&mut entry, &m.payload);
                    true
                }
            };
            if fits(&out, entry.len(), 0) {
                out.extend_from_slice(&entry);
                n += 1;
                if def {
                    defined.insert(key, next);
                }
            } else {
                full = true;
                left.messages += 1;
            }
        }
    }
    out[at..at + 4].copy_from_slice(&(n as u32).to_be_bytes());
    let sum = Sha256::digest(&out);
    out.extend_from_slice(&sum);
    (out, left)
}

/// A bounds-checked reader over the file's bytes.
struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], Corrupt> {
        if self.b.len() - self.pos < n {
            return Err(corrupt(format!("{what} runs past the end at byte {}", self.pos)));
        }
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn u8(&mut self, what: &str) -> Result<u8, Corrupt> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16, Corrupt> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self, what: &str) -> Result<u32, Corrupt> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn str(&mut self, what: &str) -> Result<&'a str, Corrupt> {
        let n = self.u16(what)? as usize;
        std::str::from_utf8(self.take(n, what)?).map_err(|_| corrupt(format!("{what} is not UTF-8")))
    }
    fn bytes(&mut self, what: &str) -> Result<&'a [u8], Corrupt> {
        let n = self.u32(what)? as usize;
        self.take(n, what)
    }
}

fn qos_byte(q: u8, what: &str) -> Result<u8, Corrupt> {
    if q > 2 {
        return Err(corrupt(format!("{what}: QoS {q}")));
    }
    Ok(q)
}

/// Decodes a state file. Refused (nothing restored): another file, another format version, a
/// checksum that does not match (truncated or damaged), any record that is not well formed.
pub fn decode(b: &[u8]) -> Result<Snapshot, Corrupt> {
    if !b.starts_with(MAGIC) {
        return Err(corrupt("not a mam broker state file"));
    }
    if b.len() < MAGIC.len() + 4 + 12 + TRAILER {
        return Err(corrupt(format!("truncated ({} bytes)", b.len())));
    }
    let body = &b[..b.len() - TRAILER];
    let version = u32::from_be_bytes(body[MAGIC.len()..MAGIC.len() + 4].try_into().unwrap_or_default());
    if version != VERSION {
        return Err(corrupt(format!("format version {version}; this mam reads version {VERSION}")));
    }
    if Sha256::digest(body).as_slice() != &b[body.len()..] {
        return Err(corrupt(format!("checksum mismatch: truncated or damaged ({} bytes)", b.len())));
    }
    let mut c = Cursor { b: body, pos: MAGIC.len() + 4 };
    let mut snap = Snapshot::default();
    for _ in 0..c.u32("retained count")? {
        let t = c.str("retained topic")?;
        if !topic::valid_topic_name(t) {
            return Err(corrupt(format!("retained topic {:?} is not a topic name", crate::text::one_line(t))));
        }
        let qos = qos_byte(c.u8("retained QoS")?, "retained message")?;
        let payload = c.bytes("retained payload")?;
        snap.retained.push((t.to_string(), Retained { payload: payload.into(), qos }));
    }
    for _ in 0..c.u32("session count")? {
        let id = c.str("client id")?;
        if id.is_empty() {
            return Err(corrupt("a session with an empty client id"));
        }
        let mut saved = Saved { next_pid: c.u16("next packet id")?, ..Saved::default() };
        for _ in 0..c.u32("subscription count")? {
            let f = c.str("filter")?;
            if !topic::valid_filter(f) {
                return Err(corrupt(format!("filter {:?} is not valid", crate::text::one_line(f))));
            }
            saved.subs.push((f.to_string(), qos_byte(c.u8("granted QoS")?, "subscription")?));
        }
        for _ in 0..c.u32("inbound id count")? {
            saved.incoming.push(c.u16("inbound packet id")?);
        }
        snap.sessions.push((id.to_string(), saved));
    }
    let mut defs: Vec<(Arc<str>, Arc<[u8]>)> = Vec::new();
    for _ in 0..c.u32("message count")? {
        let i = c.u32("session index")? as usize;
        let kind = c.u8("message kind")?;
        let qos = c.u8("message QoS")?;
        let retain = c.u8("retain flag")? == 1;
        let pid = c.u16("packet id")?;
        let r = c.u32("message reference")? as usize;
        if !(1..=2).contains(&qos) || kind > RELEASED || (kind == RELEASED && qos != 2) {
            return Err(corrupt(format!("message of kind {kind} at QoS {qos}")));
        }
        let (topic, payload) = match r {
            r if r < defs.len() => defs[r].clone(),
            r if r == defs.len() => {
                let t = c.str("message topic")?;
                if !topic::valid_topic_name(t) {
                    return Err(corrupt(format!("message topic {:?} is not a topic name", crate::text::one_line(t))));
                }
                let p = c.bytes("message payload")?;
                defs.push((t.into(), p.into()));
                defs[r].clone()
            }
            r => return Err(corrupt(format!("message reference {r} ahead of the {} defined", defs.len()))),
        };
        let Some((_, saved)) = snap.sessions.get_mut(i) else {
            return Err(corrupt(format!("message for session {i} of {}", snap.sessions.len())));
        };
        let msg = Msg { topic, payload, qos, retain };
        if kind == QUEUED {
            saved.queued.push(msg);
        } else {
            saved.inflight.push(SavedInflight { pid, msg, released: kind == RELEASED });
        }
    }
    if c.pos != body.len() {
        return Err(corrupt(format!("{} bytes after the last record", body.len() - c.pos)));
    }
    Ok(snap)
}

/// What `restore` put back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Restored {
    pub retained: usize,
    pub sessions: usize,
    pub messages: usize,
    /// Left out to keep this start's caps (a smaller `--max-retained-*` or `--max-sessions`).
    pub dropped_retained: usize,
    pub dropped_sessions: usize,
}

/// Puts a decoded snapshot into an empty state, within `cfg`'s retained caps and `max_sessions`.
pub(super) fn restore(st: &mut State, snap: Snapshot, cfg: &BrokerConfig) -> Restored {
    let mut r = Restored::default();
    let limits = route::RetainLimits { max_message: cfg.max_retained_message, max_total: cfg.max_retained_bytes };
    let State { retained, retained_bytes, clients, index, away, .. } = st;
    for (t, m) in snap.retained {
        match route::apply_retain(retained, retained_bytes, &t, route::RetainOp::Set(m), &limits) {
            Ok(()) => r.retained += 1,
            Err(_) => r.dropped_retained += 1,
        }
    }
    for (id, saved) in snap.sessions {
        if clients.len() >= cfg.max_sessions || clients.contains_key(&id) {
            r.dropped_sessions += 1;
            continue;
        }
        let session = Session::restore(saved);
        r.messages += session.pending();
        // Restored whole, even past `max_queued_*` (they were within the caps of the broker
        // that saved them): only new messages for away clients are refused until it drains.
        away.add(&session);
        r.sessions += 1;
        for (f, _) in &session.subs {
            index.add(f, &id);
        }
        clients.insert(id, Box::new(Client { link: None, session, persistent: true }));
    }
    r
}

/// Why a file at the state path was not restored, and where it went.
#[derive(Debug)]
pub struct Rejected {
    pub why: String,
    /// `<path>.bad`, or why it could not be moved there.
    pub moved: Result<PathBuf, io::Error>,
}

/// The path a rejected state file is moved to (an older one there is replaced).
pub fn bad_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".bad");
    path.with_file_name(name)
}

/// Reads the state file: `Ok(None)` when there is none; a file that is a symlink, not a regular
/// file, not this user's, open to group or others, larger than `max_bytes` or not a valid state
/// file is moved aside to `bad_path` (never followed, never deleted) and reported.
pub fn load(path: &Path, max_bytes: usize) -> Result<Option<Snapshot>, Rejected> {
    let why = match read_checked(path, max_bytes) {
        Ok(None) => return Ok(None),
        Ok(Some(bytes)) => match decode(&bytes) {
            Ok(s) => return Ok(Some(s)),
            Err(e) => e.0,
        },
        Err(why) => why,
    };
    let bad = bad_path(path);
    // rename(2) moves a symlink itself, never its target.
    let moved = fs::rename(path, &bad).map(|()| bad);
    Err(Rejected { why, moved })
}

fn read_checked(path: &Path, max_bytes: usize) -> Result<Option<Vec<u8>>, String> {
    let f = match sys::open_nofollow_read(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if sys::is_nofollow_error(&e) => return Err("is a symbolic link (not followed)".into()),
        Err(e) => return Err(format!("cannot be opened ({e})")),
    };
    let meta = f.metadata().map_err(|e| format!("cannot be examined ({e})"))?;
    if !meta.file_type().is_file() {
        return Err("is not a regular file".into());
    }
    if meta.uid() != sys::geteuid() {
        return Err(format!("is owned by uid {}, not by uid {}", meta.uid(), sys::geteuid()));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(format!("has mode {:04o}: open to group or others (the broker writes 0600)", meta.mode() & 0o7777));
    }
    if meta.len() > max_bytes as u64 {
        return Err(format!("{} bytes exceed max-state-bytes {max_bytes}", meta.len()));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    f.take(max_bytes as u64 + 1).read_to_end(&mut bytes).map_err(|e| format!("cannot be read ({e})"))?;
    if bytes.len() > max_bytes {
        return Err(format!("grew past max-state-bytes {max_bytes} while read"));
    }
    Ok(Some(bytes))
}

/// The lock file that keeps a second broker of the same control root off the state file.
pub fn lock_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".lock");
    path.with_file_name(name)
}

enum Job {
    Save(Snapshot),
    /// The shutdown's save: logged when written.
    Last(Snapshot),
}

/// Writes the state file, at most `interval` after a change and once more at shutdown (from
/// the loop thread's `tick` and `finish`; the writing itself on a thread of its own, joined by
/// `finish`). Holds the state file's lock until dropped.
pub(super) struct Saver {
    interval: Duration,
    tx: Option<SyncSender<Job>>,
    busy: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// The change count of the last snapshot handed to the writer.
    saved: u64,
    /// When the pending changes are to be written.
    due: Option<Instant>,
    _lock: sys::Flock,
}

/// What `Saver::open` found.
pub(super) enum Opened {
    /// The lock is held and the file read (restored or set aside): the broker persists.
    Ready(Saver, Result<Option<Snapshot>, Rejected>),
    /// Another broker holds the lock (or it could not be taken): this one runs without persistence.
    Unlocked(String),
}

impl Saver {
    /// Takes the lock, reads the file, starts the writer thread.
    pub(super) fn open(shared: &Arc<Shared>, p: &Persist) -> io::Result<Opened> {
        let lock_file = lock_path(&p.path);
        let lock =
            match sys::open_lock_file(&lock_file).and_then(|f| sys::Flock::try_acquire(f, sys::LockMode::Exclusive)) {
                Ok(Some(l)) => l,
                Ok(None) => {
                    return Ok(Opened::Unlocked(format!(
                        "is in use by another mam broker (lock {} held)",
                        show_path(&lock_file)
                    )))
                }
                Err(e) => return Ok(Opened::Unlocked(format!("cannot be locked ({}: {e})", show_path(&lock_file)))),
            };
        let loaded = load(&p.path, p.max_bytes);
        let (tx, rx) = mpsc::sync_channel::<Job>(1);
        let busy = Arc::new(AtomicBool::new(false));
        let (b2, sh, path, max) = (busy.clone(), shared.clone(), p.path.clone(), p.max_bytes);
        let thread = thread::Builder::new()
            .name("broker-state".into())
            .stack_size(WRITER_STACK)
            .spawn(move || write_loop(&sh, &path, max, &rx, &b2))?;
        let saver =
            Saver { interval: p.interval, tx: Some(tx), busy, thread: Some(thread), saved: 0, due: None, _lock: lock };
        Ok(Opened::Ready(saver, loaded))
    }

    /// The wait until a pending save is due (None: nothing pending).
    pub(super) fn next_timeout(&self, now: Instant) -> Option<Duration> {
        self.due.map(|d| d.saturating_duration_since(now))
    }

    /// Called after every loop round: arms the timer on a change, hands a snapshot to the writer
    /// when it is due and the writer is idle.
    pub(super) fn tick(&mut self, shared: &Shared, now: Instant) {
        let changes = shared.changes.load(Ordering::Relaxed);
        if changes == self.saved {
            return;
        }
        let due = *self.due.get_or_insert(now + self.interval);
        if now < due {
            return;
        }
        if self.busy.load(Ordering::Acquire) {
            self.due = Some(now + BUSY_RETRY);
            return;
        }
        let snap = snapshot(&lock(&shared.state));
        let Some(tx) = &self.tx else { return };
        self.busy.store(true, Ordering::Release);
        if tx.try_send(Job::Save(snap)).is_ok() {
            self.saved = changes;
            self.due = None;
        } else {
            self.busy.store(false, Ordering::Release);
            self.due = Some(now + BUSY_RETRY);
        }
    }

    /// The broker is stopping (every connection closed): writes what changed since the last save,
    /// then waits for the writer.
    pub(super) fn finish(&mut self, shared: &Shared) {
        let changes = shared.changes.load(Ordering::Relaxed);
        if let Some(tx) = self.tx.take() {
            if changes != self.saved {
                let snap = snapshot(&lock(&shared.state));
                let _ = tx.send(Job::Last(snap));
                self.saved = changes;
            }
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Saver {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The writer thread: encodes each snapshot and writes it atomically; a failure is logged once
/// until a write succeeds again, and so is a snapshot that did not fit `max_bytes`.
fn write_loop(shared: &Shared, path: &Path, max: usize, rx: &mpsc::Receiver<Job>, busy: &AtomicBool) {
    let mut failing = false;
    let mut trimmed = false;
    while let Ok(job) = rx.recv() {
        let (snap, last) = match job {
            Job::Save(s) => (s, false),
            Job::Last(s) => (s, true),
        };
        let (bytes, left) = encode(&snap, max);
        let (retained, sessions) = (snap.retained.len() - left.retained, snap.sessions.len() - left.sessions);
        drop(snap);
        if left.any() && !trimmed {
            shared.log(format!(
                "WARNING: broker: state file {}: max-state-bytes {max} reached; left out {}, {} and {} of \
                 the sessions' QoS 1/2 messages (raise --max-state-bytes to keep them)",
                show_path(path),
                count(left.retained, "retained message"),
                count(left.sessions, "session"),
                left.messages
            ));
        }
        trimmed = left.any();
        match sys::atomic_write(path, &bytes) {
            Ok(()) => {
                if failing {
                    shared.log(format!("NOTE: broker: state file {} written again", show_path(path)));
                }
                failing = false;
                if last {
                    shared.log(format!(
                        "NOTE: broker: saved {} and {} to {}",
                        count(retained, "retained message"),
                        count(sessions, "session"),
                        show_path(path)
                    ));
                }
            }
            Err(e) => {
                if !failing || last {
                    shared.log(format!(
                        "WARNING: broker: cannot write state file {} ({}); the state is kept in memory only until a write succeeds",
                        show_path(path),
                        crate::text::one_line(&e.to_string())
                    ));
                }
                failing = true;
            }
        }
        busy.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(t: &str, p: &str, qos: u8) -> Msg {
        Msg { topic: t.into(), payload: p.as_bytes().into(), qos, retain: false }
    }

    fn sample() -> Snapshot {
        let shared = msg("a/b", "shared payload", 1);
        Snapshot {
            retained: vec![
                ("r/1".into(), Retained { payload: b"one"[..].into(), qos: 1 }),
                ("r/2".into(), Retained { payload: b"two"[..].into(), qos: 0 }),
            ],
            sessions: vec![
                (
                    "c1".into(),
                    Saved {
                        subs: vec![("a/#".into(), 2), ("b".into(), 1)],
                        next_pid: 9,
                        inflight: vec![
                            SavedInflight { pid: 7, msg: shared.clone(), released: false },
                            SavedInflight { pid: 8, msg: msg("a/c", "q2", 2), released: true },
                        ],
                        queued: vec![shared.clone(), msg("a/d", "later", 2)],
                        incoming: vec![3, 4],
                    },
                ),
                (
                    "c2".into(),
                    Saved { subs: vec![("a/b".into(), 1)], next_pid: 1, queued: vec![shared], ..Saved::default() },
                ),
            ],
        }
    }

    #[test]
    fn a_snapshot_comes_back_as_it_was_and_a_shared_message_is_written_once() {
        let s = sample();
        let (bytes, left) = encode(&s, 1 << 20);
        assert_eq!(left, LeftOut::default());
        assert_eq!(decode(&bytes).unwrap(), s);
        let once = bytes.windows(b"shared payload".len()).filter(|w| w == b"shared payload").count();
        assert_eq!(once, 1, "one message held by three entries is written once");
        let back = decode(&bytes).unwrap();
        let (a, b) = (&back.sessions[0].1.inflight[0].msg.payload, &back.sessions[1].1.queued[0].payload);
        assert!(Arc::ptr_eq(a, b), "and shared again when read back");
        assert_eq!(decode(&encode(&Snapshot::default(), 1 << 20).0).unwrap(), Snapshot::default());
    }

    #[test]
    fn a_truncated_or_damaged_file_is_refused_with_a_reason() {
        let (bytes, _) = encode(&sample(), 1 << 20);
        for cut in [0, 5, MAGIC.len() + 2, bytes.len() / 2, bytes.len() - 1] {
            let e = decode(&bytes[..cut]).unwrap_err();
            assert!(e.0.contains("truncated") || e.0.contains("not a mam broker state file"), "cut {cut}: {e}");
        }
        let mut flipped = bytes.clone();
        flipped[MAGIC.len() + 10] ^= 1;
        assert!(decode(&flipped).unwrap_err().0.contains("checksum mismatch"));
        let mut v2 = bytes.clone();
        v2[MAGIC.len() + 3] = 2;
        assert!(decode(&v2).unwrap_err().0.contains("format version 2"));
        assert_eq!(decode(b"{\"json\": 1}").unwrap_err().0, "not a mam broker state file");
    }

    /// A well-formed checksum over bad records (as a buggy or hostile writer would make).
    fn signed(body: &[u8]) -> Vec<u8> {
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&VERSION.to_be_bytes());
        b.extend_from_slice(body);
        let sum = Sha256::digest(&b);
        b.extend_from_slice(&sum);
        b
    }

    #[test]
    fn records_are_checked_even_under_a_good_checksum() {
        let cases: &[(&[u8], &str)] = &[
            (&[0, 0, 0, 1, 0, 200, b'a', 0, 0, 0, 0, 0], "retained topic runs past the end"),
            (&[0, 0, 0, 1, 0, 3, b'a', b'/', b'#', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], "not a topic name"),
            (&[0, 0, 0, 1, 0, 1, b'a', 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], "QoS 3"),
            (
                &[
                    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, // no retained, no sessions, one message
                    0, 0, 0, 0, 0, 1, 0, 0, 0, // session 0, queued, QoS 1, no retain, pid 0
                    0, 0, 0, 0, 0, 1, b'a', 0, 0, 0, 0, // defined here: topic "a", empty payload
                ],
                "message for session 0 of 0",
            ),
            (&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7], "1 bytes after the last record"),
        ];
        for (body, want) in cases {
            let e = decode(&signed(body)).unwrap_err();
            assert!(e.0.contains(want), "{body:?}: {e} (want {want})");
        }
    }

    #[test]
    fn past_max_bytes_retained_go_first_and_a_session_keeps_a_prefix_of_its_messages() {
        let s = sample();
        let (full, _) = encode(&s, 1 << 20);
        // Room for everything but the last queued message of c1 and c2's copy of the shared one.
        let (bytes, left) = encode(&s, full.len() - 1);
        assert!(bytes.len() < full.len());
        assert_eq!((left.retained, left.sessions), (0, 0));
        assert!(left.messages >= 1);
        let back = decode(&bytes).unwrap();
        let c1 = &back.sessions[0].1;
        assert_eq!(c1.inflight.len(), 2);
        let kept = c1.queued.len() + back.sessions[1].1.queued.len();
        assert_eq!(kept + left.messages, 3, "every message is kept or counted");
        // A tiny limit: the empty file's shape, everything counted.
        let (bytes, left) = encode(&s, 0);
        assert_eq!(decode(&bytes).unwrap(), Snapshot::default());
        assert_eq!(left, LeftOut { retained: 2, sessions: 2, messages: 5 });
    }

    #[test]
    fn restore_keeps_this_starts_caps() {
        let cfg = BrokerConfig { max_sessions: 1, max_retained_message: 3, ..BrokerConfig::default() };
        let mut s = sample();
        s.retained.push(("r/3".into(), Retained { payload: b"four"[..].into(), qos: 0 }));
        let mut st = State::default();
        let r = restore(&mut st, s, &cfg);
        assert_eq!(r, Restored { retained: 2, sessions: 1, messages: 4, dropped_retained: 1, dropped_sessions: 1 });
        assert_eq!(st.retained_bytes, 3 + 3 + 3 + 3);
        let c1 = &st.clients["c1"];
        assert!(c1.persistent && c1.link.is_none());
    }
}
