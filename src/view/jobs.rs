//! One job as the live views show it (`mam jobs`, `mam ui`): its status, session, claim and finish
//! times, the newest evidence of life (record timestamps or the events.log mtime), the last
//! heartbeat (the record's `heartbeat_at`, else the last events.log line with `"heartbeat":true`),
//! its idle window, and whether it is silent past that window (issue 18); and the streamed listing
//! of a whole registry that `mam jobs` prints (issue 20: 100,000 records read one at a time).
//!
//! It reads files only (no lock, no broker) and creates nothing; reads are bounded (the record's
//! fields of interest, the last 64 KiB of events.log). It never holds or shows a token.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::clock;
use crate::daemon::sweep::{idle_ms, last_evidence_ms};
use crate::registry::record::{Fields, Picked};
use crate::registry::store::{Store, StoreError};
use crate::text;

/// The fields `mam ui` shows, read from each record (the rest is skipped unparsed: 10,000
/// records are read on every `mam jobs --follow` redraw). `mam jobs` reads the first `FIELDS`.
pub const UI_FIELDS: &[&str] = &[
    "job_id",
    "status",
    "attempt",
    "agent_session",
    "created_at",
    "last_event_at",
    "heartbeat_at",
    "claimed_at",
    "updated_at",
    "dispatched_at",
    "finished_at",
    "heartbeat_sec",
    "heartbeat_misses",
    "idle_timeout_sec",
    // Only the screen shows these: the type, why the job ended, where its report is.
    "type",
    "reason",
    "report_path",
];

/// The fields `mam jobs` shows.
pub const FIELDS: &[&str] = UI_FIELDS.split_at(UI_FIELDS.len() - 3).0;

/// A time in ms since the epoch, or none, in 8 bytes (a row is kept per job: 100,000 of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ms(u64);

impl Ms {
    pub const NONE: Ms = Ms(u64::MAX);

    pub fn get(self) -> Option<u64> {
        (self != Ms::NONE).then_some(self.0)
    }
}

impl From<Option<u64>> for Ms {
    fn from(v: Option<u64>) -> Ms {
        v.filter(|&ms| ms != u64::MAX).map_or(Ms::NONE, Ms)
    }
}

/// One job, kept small: a registry of 100,000 jobs holds 100,000 of these while they are sorted.
/// Its strings share one allocation.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// job_id, status, session, created_at, type, reason, report_path, one after the other.
    text: Box<str>,
    ends: [u32; 6],
    pub attempt: Option<u64>,
    pub evidence_ms: Ms,
    pub heartbeat_ms: Ms,
    /// The claim (else the registration) time.
    pub started_ms: Ms,
    pub finished_ms: Ms,
    /// The idle window (`sweep::idle_ms`).
    pub idle_ms: u64,
}

impl Row {
    /// A row of these strings, no times, and no type, reason or report path.
    pub fn new(job_id: &str, status: &str, session: &str, created_at: &str) -> Row {
        Row::of([job_id, status, session, created_at, "", "", ""])
    }

    /// This row with the record's type (`""` for none), reason and report path.
    pub fn with_details(self, job_type: &str, reason: Option<&str>, report_path: Option<&str>) -> Row {
        let n = Row::of([
            self.job_id(),
            self.status(),
            self.session(),
            self.created_at(),
            job_type,
            reason.unwrap_or(""),
            report_path.unwrap_or(""),
        ]);
        Row { text: n.text, ends: n.ends, ..self }
    }

    fn of(texts: [&str; 7]) -> Row {
        let mut ends = [0u32; 6];
        let mut end = 0;
        for (e, t) in ends.iter_mut().zip(texts) {
            end += t.len();
            *e = end as u32;
        }
        Row {
            text: texts.concat().into_boxed_str(),
            ends,
            attempt: None,
            evidence_ms: Ms::NONE,
            heartbeat_ms: Ms::NONE,
            started_ms: Ms::NONE,
            finished_ms: Ms::NONE,
            idle_ms: 0,
        }
    }

    /// The `i`th of the seven strings.
    fn part(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        let end = self.ends.get(i).map_or(self.text.len(), |&e| e as usize);
        &self.text[start..end]
    }

    /// (created_at, job_id, the whole text) as bytes, for the listing's sort: the strings' order
    /// (both compare byte by byte) without a char-boundary check per comparison.
    fn sort_key(&self) -> (&[u8], &[u8], &[u8]) {
        let b = self.text.as_bytes();
        let (id_end, created) = (self.ends[0] as usize, self.ends[2] as usize..self.ends[3] as usize);
        (&b[created], &b[..id_end], b)
    }

    pub fn job_id(&self) -> &str {
        self.part(0)
    }

    pub fn status(&self) -> &str {
        self.part(1)
    }

    pub fn session(&self) -> &str {
        self.part(2)
    }

    pub fn created_at(&self) -> &str {
        self.part(3)
    }

    /// The record's `type` (task when absent).
    pub fn job_type(&self) -> &str {
        Some(self.part(4)).filter(|t| !t.is_empty()).unwrap_or("task")
    }

    /// Why it ended (`reason`), when it says.
    pub fn reason(&self) -> Option<&str> {
        Some(self.part(5)).filter(|r| !r.is_empty())
    }

    /// Where its report is written (`report_path`), when it says.
    pub fn report_path(&self) -> Option<&str> {
        Some(self.part(6)).filter(|r| !r.is_empty())
    }

    pub fn finished(&self) -> bool {
        crate::registry::is_terminal(self.status())
    }

    /// How long a live job has been silent: `Some(ms since the last evidence)` when it is not
    /// finished, not pending, and that is longer than its idle window.
    pub fn silent_ms(&self, now_ms: u64) -> Option<u64> {
        if self.finished() || self.status() == "pending" {
            return None;
        }
        let since = now_ms.saturating_sub(self.evidence_ms.get().or(self.started_ms.get())?);
        (since > self.idle_ms).then_some(since)
    }

    /// When the job goes silent if nothing new arrives (for a live job with evidence).
    pub fn silent_at_ms(&self) -> Option<u64> {
        if self.finished() || self.status() == "pending" {
            return None;
        }
        Some(self.evidence_ms.get().or(self.started_ms.get())? + self.idle_ms + 1)
    }

    pub fn elapsed_ms(&self, now_ms: u64) -> Option<u64> {
        Some(self.finished_ms.get().unwrap_or(now_ms).saturating_sub(self.started_ms.get()?))
    }
}

/// The row of one record. The ages (evidence, heartbeat) are filled in for a live job, and for a
/// finished one only with `ages_of_finished` (its ages are `-` in `mam jobs`' table, so most of a
/// large registry's events.log files are not looked at). Then `events_mtime` gives the mtime of
/// its events.log, and `events_heartbeat` the `ts` of that file's last heartbeat line; the latter
/// is asked only when the file exists and the record has no `heartbeat_at`.
pub fn row(
    rec: &dyn Fields,
    ages_of_finished: bool,
    events_mtime: impl FnOnce() -> Option<u64>,
    events_heartbeat: impl FnOnce() -> Option<u64>,
) -> Row {
    let status = rec.status();
    let ts = |k: &str| rec.str(k).and_then(clock::parse_ts);
    let mut r = Row::of([
        rec.str("job_id").unwrap_or(""),
        status,
        rec.str("agent_session").unwrap_or(""),
        rec.str("created_at").unwrap_or(""),
        rec.str("type").unwrap_or(""),
        rec.str("reason").unwrap_or(""),
        rec.str("report_path").unwrap_or(""),
    ]);
    r.attempt = rec.u64("attempt");
    r.started_ms = ts("claimed_at").or_else(|| ts("created_at")).into();
    r.finished_ms = ts("finished_at").into();
    r.idle_ms = idle_ms(rec);
    if ages_of_finished || !crate::registry::is_terminal(status) {
        // One stat: most records of a large registry have no events.log, so nothing more is opened.
        let events_mtime = events_mtime();
        r.evidence_ms = last_evidence_ms(rec, events_mtime).into();
        r.heartbeat_ms = ts("heartbeat_at").or_else(|| events_mtime.and_then(|_| events_heartbeat())).into();
    }
    r
}

/// The `ts` of the last events.log line with `"heartbeat":true`, looking at the last 64 KiB only.
pub fn last_heartbeat_line_ms(path: &Path) -> Option<u64> {
    const TAIL: u64 = 64 * 1024;
    let mut f = File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    let start = len.saturating_sub(TAIL);
    f.seek(SeekFrom::Start(start)).ok()?;
    let mut buf = Vec::with_capacity((len - start) as usize);
    f.take(TAIL).read_to_end(&mut buf).ok()?;
    let needle = b"\"heartbeat\":true";
    buf.split(|&b| b == b'\n').rev().filter(|l| l.windows(needle.len()).any(|w| w == needle)).find_map(|l| {
        let v: Value = serde_json::from_slice(l).ok()?;
        (v.get("heartbeat") == Some(&Value::Bool(true))).then(|| v.get("ts")?.as_str().and_then(clock::parse_ts))?
    })
}

/// Every job of `store`, sorted by created_at then id, read one record at a time (only `FIELDS`
/// parsed). Unreadable records come back as warnings. `ages_of_finished`: see `row`.
pub fn rows(store: &Store, ages_of_finished: bool) -> Result<(Vec<Row>, Vec<String>), StoreError> {
    let parts = store.scan_records(
        crate::registry::store::listing_threads(),
        || (Vec::new(), Vec::new(), PathBuf::new()),
        |(out, warnings, rel): &mut (Vec<Row>, Vec<String>, PathBuf), e| {
            let path = || text::show_path(&store.record_path(e.id));
            match e.bytes {
                Ok(bytes) => match Picked::parse(bytes, FIELDS) {
                    Ok(r) => {
                        let id = r.str("job_id").unwrap_or("");
                        let events_mtime = || {
                            rel.clear();
                            rel.push(id);
                            rel.push("events.log");
                            e.mtime_ms(rel)
                        };
                        let heartbeat = || last_heartbeat_line_ms(&store.registry.join(id).join("events.log"));
                        out.push(row(&r, ages_of_finished, events_mtime, heartbeat))
                    }
                    Err(_) => warnings.push(format!("WARNING: {}: not a valid job record; skipped", path())),
                },
                Err(StoreError::Io { err, .. }) => {
                    warnings.push(format!("WARNING: {}: cannot read record ({err}); skipped", path()))
                }
                Err(other) => warnings.push(format!("WARNING: {other}; skipped")),
            }
        },
    )?;
    let (mut out, mut warnings) = (Vec::new(), Vec::new());
    for (rows, w, _) in parts {
        if out.is_empty() {
            out = rows;
        } else {
            out.extend(rows);
        }
        warnings.extend(w);
    }
    // The whole text last: records that agree on both keys still come in one order.
    out.sort_unstable_by(|a, b| a.sort_key().cmp(&b.sort_key()));
    Ok((out, warnings))
}

/// `45s`, `3m07s`, `2h05m`, `3d04h`; `-` for none.
pub fn age(then_ms: Option<u64>, now_ms: u64) -> String {
    let Some(t) = then_ms else { return "-".into() };
    let s = now_ms.saturating_sub(t) / 1000;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86_400, (s % 86_400) / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::record::Record;

    #[test]
    fn only_objects_are_read_and_only_the_shown_fields() {
        for fields in [FIELDS, UI_FIELDS] {
            assert!(Picked::parse(b"[1,2,3,4,5,6,7,8,9,10]", fields).is_err());
            assert!(Picked::parse(b"{", fields).is_err());
        }
        let src = br#" {"job_id":"a","status":"running","attempt":2,"type":"review","x":{"deep":[1]}}"#;
        let r = Picked::parse(src, FIELDS).unwrap();
        assert_eq!((r.str("job_id"), r.status(), r.u64("attempt")), (Some("a"), "running", Some(2)));
        assert!(r.get("x").is_none() && r.get("type").is_none());
        let r = Record::parse_only(src, UI_FIELDS).unwrap();
        assert_eq!(r.str("type"), Some("review"));
        assert!(r.get("x").is_none());
    }

    #[test]
    fn the_details_come_from_the_record() {
        let rec = Record::parse(br#"{"job_id":"a","status":"failed","agent_session":"w","created_at":"c","reason":"boom","report_path":""}"#).unwrap();
        let r = row(&rec, true, || None, || None);
        assert_eq!((r.job_id(), r.status(), r.session(), r.created_at()), ("a", "failed", "w", "c"));
        assert_eq!((r.job_type(), r.reason(), r.report_path()), ("task", Some("boom"), None));
        let r = r.with_details("loop", None, Some("/r.md"));
        assert_eq!(
            (r.job_id(), r.created_at(), r.job_type(), r.reason(), r.report_path()),
            ("a", "c", "loop", None, Some("/r.md"))
        );
    }

    /// A finished job's events.log is not looked at for the table (its ages show `-`), only for
    /// `--json` and the screen, which show them; the heartbeat line only without `heartbeat_at`.
    #[test]
    fn finished_rows_skip_the_events_stat_unless_asked() {
        let done =
            Record::parse(br#"{"job_id":"a","status":"completed","created_at":"2026-01-01T00:00:00.000Z"}"#).unwrap();
        let r = row(&done, false, || panic!("stat asked for a finished job"), || panic!("read asked"));
        assert_eq!((r.job_id(), r.status(), r.evidence_ms.get()), ("a", "completed", None));
        let r = row(&done, true, || Some(1_767_225_600_500), || Some(9));
        assert_eq!((r.evidence_ms.get(), r.heartbeat_ms.get()), (Some(1_767_225_600_500), Some(9)));
        let open = Record::parse(br#"{"job_id":"b","status":"running"}"#).unwrap();
        assert_eq!(row(&open, false, || Some(7), || None).evidence_ms.get(), Some(7));
        assert_eq!(row(&open, false, || None, || panic!("no events.log to read")).heartbeat_ms.get(), None);
        let beat =
            Record::parse(br#"{"job_id":"b","status":"running","heartbeat_at":"2026-01-01T00:00:00.000Z"}"#).unwrap();
        assert_eq!(
            row(&beat, false, || Some(7), || panic!("heartbeat_at says")).heartbeat_ms.get(),
            Some(1_767_225_600_000)
        );
    }

    #[test]
    fn ages() {
        assert_eq!(age(None, 10), "-");
        assert_eq!(age(Some(1_000), 46_999), "45s");
        assert_eq!(age(Some(0), 187_000), "3m07s");
        assert_eq!(age(Some(0), 7_500_000), "2h05m");
        assert_eq!(age(Some(0), (3 * 86_400 + 4 * 3600) * 1000), "3d04h");
        assert_eq!(age(Some(5_000), 1_000), "0s", "a future timestamp is not negative");
    }

    #[test]
    fn silent_after_the_window() {
        let rec = Record::parse(
            br#"{"job_id":"a","status":"running","claimed_at":"2024-01-01T00:00:00.000Z","idle_timeout_sec":2}"#,
        )
        .unwrap();
        let r = row(&rec, true, || None, || None);
        let t0 = clock::parse_ts("2024-01-01T00:00:00.000Z").unwrap();
        assert_eq!(r.silent_ms(t0 + 2_000), None);
        assert_eq!(r.silent_ms(t0 + 2_001), Some(2_001));
        assert_eq!(r.silent_at_ms(), Some(t0 + 2_001));
    }

    /// Issue 18: a live job silent past its idle window says so, with how long, daemon or not.
    #[test]
    fn silent_jobs_are_silent_only_while_live() {
        let like = |status: &str| Row {
            attempt: Some(1),
            evidence_ms: Some(0).into(),
            started_ms: Some(0).into(),
            idle_ms: 120_000,
            ..Row::new("a", status, "w", "")
        };
        let r = like("running");
        assert_eq!(r.silent_ms(120_000), None, "inside the window");
        assert_eq!(r.silent_ms(302_000), Some(302_000));
        assert_eq!(like("completed").silent_ms(999_000), None);
        assert_eq!(like("pending").silent_ms(999_000), None);
    }
}
