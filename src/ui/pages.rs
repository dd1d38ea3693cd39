//! What the `r` and `l` keys of `mam ui` show (issue 22): a job's report (at most `REPORT_MAX`
//! bytes of it) and the tail of its events.log (at most `EVENTS_TAIL` bytes from the end, through
//! the bounded backwards reader of `joblog`), one readable line per event. Read-only; tabs become
//! spaces and control characters are left to the drawing (which shows them as `?`).

use std::io::Read;
use std::path::Path;

use serde_json::Value;

use crate::clock;
use crate::joblog;

/// The most of a report that is read.
pub const REPORT_MAX: u64 = 1024 * 1024;

/// The most of the end of events.log that is read, and its longest line.
pub const EVENTS_TAIL: u64 = 256 * 1024;
const EVENT_LINE_MAX: usize = 64 * 1024;
/// The most events shown.
pub const EVENTS_MAX: usize = 2000;

fn untab(s: &str) -> String {
    s.replace('\t', "    ").replace('\r', "")
}

/// The report's lines, or why it cannot be shown.
pub fn report_lines(path: &Path) -> Result<Vec<String>, String> {
    let f = std::fs::File::open(path).map_err(|e| format!("cannot read {} ({e})", crate::text::show_path(path)))?;
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let mut buf = Vec::new();
    f.take(REPORT_MAX)
        .read_to_end(&mut buf)
        .map_err(|e| format!("cannot read {} ({e})", crate::text::show_path(path)))?;
    let mut lines: Vec<String> = String::from_utf8_lossy(&buf).lines().map(untab).collect();
    if len > REPORT_MAX {
        lines.push(format!("... (the first {} KiB of {} KiB shown)", REPORT_MAX / 1024, len / 1024));
    }
    Ok(lines)
}

/// One events.log line as text: `HH:MM:SS.mmm a<attempt> #<seq> <event> [heartbeat] <message>`;
/// a line that is not an event is shown as it is.
pub fn event_line(raw: &[u8]) -> String {
    let Ok(v) = serde_json::from_slice::<Value>(raw) else { return untab(&String::from_utf8_lossy(raw)) };
    let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("");
    let ts =
        v.get("ts").and_then(Value::as_str).and_then(clock::parse_ts).map(|t| clock::format_ts(t)[11..23].to_string());
    let mut out = format!(
        "{} a{} #{} {}",
        ts.as_deref().unwrap_or("?"),
        v.get("attempt").and_then(Value::as_u64).map_or("?".into(), |a| a.to_string()),
        v.get("seq").and_then(Value::as_u64).map_or("?".into(), |a| a.to_string()),
        if s("event").is_empty() { s("kind") } else { s("event") },
    );
    if v.get("heartbeat") == Some(&Value::Bool(true)) {
        out.push_str(" heartbeat");
    }
    if !s("message").is_empty() {
        out.push_str(": ");
        out.push_str(&untab(s("message")));
    }
    if let Some(r) = v.get("data").and_then(|d| d.get("report_path")).and_then(Value::as_str) {
        out.push_str(&format!(" (report {r})"));
    }
    out
}

/// The last events of `path`, oldest first (empty when there is no log yet).
pub fn event_lines(path: &Path) -> Result<Vec<String>, String> {
    let mut back: Vec<String> = Vec::new();
    joblog::scan_lines_back(path, EVENT_LINE_MAX, EVENTS_TAIL, |l| {
        back.push(event_line(l));
        back.len() >= EVENTS_MAX
    })
    .map_err(|e| format!("cannot read {} ({e})", crate::text::show_path(path)))?;
    back.reverse();
    Ok(back)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_read_as_text() {
        let l = event_line(br#"{"ts":"2024-05-01T10:20:30.456Z","attempt":1,"seq":3,"event":"progress","heartbeat":true,"message":"a\tb"}"#);
        assert_eq!(l, "10:20:30.456 a1 #3 progress heartbeat: a    b");
        assert_eq!(event_line(b"not json"), "not json");
    }
}
