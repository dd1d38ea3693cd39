//! Time and identifiers (CORE 0.4): UTC timestamps formatted by hand, and the random ids mam hands
//! out (job ids, dispatch tokens, auth tokens, client-id suffixes).
//!
//! Wall-clock time is only read through `now_ms()` so callers can inject `now` into pure logic.

use std::io;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::sys;

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` for the current time.
pub fn now_ts() -> String {
    format_ts(now_ms())
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` for `ms` since the epoch (UTC, proleptic Gregorian).
pub fn format_ts(ms: u64) -> String {
    let secs = ms / 1000;
    let millis = ms % 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z", rem / 3600, (rem % 3600) / 60, rem % 60)
}

/// Parses `YYYY-MM-DDTHH:MM:SS[.mmm]Z` back to milliseconds since the epoch.
pub fn parse_ts(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[13] != b':' || b[16] != b':' {
        return None;
    }
    // Bytes, no allocation: a listing parses several of these per record over 100,000 records.
    let num = |r: std::ops::Range<usize>| -> Option<u64> {
        b.get(r)?.iter().try_fold(0u64, |n, &c| c.is_ascii_digit().then(|| n * 10 + u64::from(c - b'0')))
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut millis = 0;
    let tail = &b[19..];
    let tail = if let Some(frac) = tail.strip_prefix(b".") {
        let digits = frac.iter().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 {
            return None;
        }
        // The first three digits, padded to three (".5" is 500 ms); the rest are dropped.
        let kept = digits.min(3);
        millis = num(20..20 + kept)? * 10u64.pow(3 - kept as u32);
        &frac[digits..]
    } else {
        tail
    };
    if tail != b"Z" {
        return None;
    }
    let days = days_from_civil(y as i64, mo as u32, d as u32);
    if days < 0 {
        return None;
    }
    Some(((days as u64) * 86_400 + h * 3600 + mi * 60 + sec) * 1000 + millis)
}

// Howard Hinnant's civil calendar algorithms.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 } as i64;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// A generated job id: 8 lowercase hex characters.
pub fn new_job_id() -> io::Result<String> {
    sys::random_hex(4)
}

/// A dispatch token: 32 hex characters.
pub fn new_dispatch_token() -> io::Result<String> {
    sys::random_hex(16)
}

/// A local auth token: 64 hex characters.
pub fn new_auth_token() -> io::Result<String> {
    sys::random_hex(32)
}

/// `^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$` (CORE 0.4): safe in topics and file names.
pub fn valid_job_id(id: &str) -> bool {
    let b = id.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && b[0].is_ascii_alphanumeric()
        && b[1..].iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

/// `^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$` (CORE 0.4).
pub fn valid_session(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && b[0].is_ascii_alphanumeric()
        && b[1..].iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b':' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(format_ts(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_ts(1_757_725_323_456), "2025-09-13T01:02:03.456Z");
        assert_eq!(format_ts(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn parse_inverts_format() {
        for ms in [0, 1, 951_782_400_000, 1_757_725_323_456, 4_102_444_799_999] {
            assert_eq!(parse_ts(&format_ts(ms)), Some(ms));
        }
        assert_eq!(parse_ts("2025-09-13T01:02:03Z"), Some(1_757_725_323_000));
        assert_eq!(parse_ts("2025-13-13T01:02:03Z"), None);
        assert_eq!(parse_ts("garbage"), None);
        // Fractions of any length: the first three digits, padded.
        assert_eq!(parse_ts("2025-09-13T01:02:03.5Z"), Some(1_757_725_323_500));
        assert_eq!(parse_ts("2025-09-13T01:02:03.04Z"), Some(1_757_725_323_040));
        assert_eq!(parse_ts("2025-09-13T01:02:03.123456Z"), Some(1_757_725_323_123));
        for bad in [
            "2025-09-13T01:02:03.Z",
            "2025-09-13T01:02:03.5",
            "2025-09-13T01:02:03.5ZZ",
            "2025-09-13T01:0x:03Z",
            "2025-09-13T01:02:03+00:00",
            "2025-09-13T01:02:\u{e9}Z",
        ] {
            assert_eq!(parse_ts(bad), None, "{bad}");
        }
    }

    #[test]
    fn ids_follow_the_grammar() {
        assert!(valid_job_id("5ee3fbcf"));
        assert!(valid_job_id(&"a".repeat(64)));
        for bad in ["", "a/b", "..", ".a", "a+b", "a#", "a\nb", &"a".repeat(65)] {
            assert!(!valid_job_id(bad), "{bad:?}");
        }
        assert!(valid_session("remote:box-1"));
        assert!(!valid_session("a b"));
        let id = new_job_id().unwrap();
        assert_eq!(id.len(), 8);
        assert!(valid_job_id(&id));
    }
}
