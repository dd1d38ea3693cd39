//! What an agent's pane shows for its job (issue 21), as pure functions over the job's facts and
//! `now`: the state (working while evidence is fresh, blocked when the job is silent past its idle
//! window or was closed for silence, idle when it finished, unknown while it waits for `started`),
//! a one-line message naming the evidence and where the state came from (`signed`: a signed event
//! of the job's agent; `inferred`: mam's conclusion from the absence of one; `operator`: somebody
//! closed it), and the instant at which the state would change without new evidence.
//!
//! No files, no clocks: `board` reads the registry and events.log and hands the facts in.

use crate::pane::Status;
use crate::registry::is_terminal;

/// Where a shown state came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Signed,
    Inferred,
    Operator,
    /// The agent's screen (an approval dialog, its empty input line): issue 30's "needs you".
    Screen,
}

impl Source {
    pub fn word(self) -> &'static str {
        match self {
            Source::Signed => "signed",
            Source::Inferred => "inferred",
            Source::Operator => "operator",
            Source::Screen => "screen",
        }
    }
}

/// The newest evidence of life from the job's agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evidence {
    /// Milliseconds since the epoch.
    pub at_ms: u64,
    /// `beat`, `progress`, `started`, or a terminal event.
    pub what: String,
}

/// What the board knows of one job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    pub job_id: String,
    pub status: String,
    pub reason: Option<String>,
    /// The record's `last_event` (set by the agent's own events only).
    pub last_event: Option<String>,
    pub dispatched_ms: Option<u64>,
    pub finished_ms: Option<u64>,
    /// The idle window (`idle_timeout_sec`, else K x N).
    pub idle_ms: u64,
    /// T, the budget for `started`.
    pub ack_ms: u64,
    pub last: Option<Evidence>,
    /// What the agent's screen says it waits for while the job is open (read by the board).
    pub needs_you: Option<NeedsYou>,
}

/// An open job whose agent waits for a person (issue 30).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NeedsYou {
    /// An approval dialog is on screen, asking about this action.
    Approval(String),
    /// The agent is back at its empty input line, first seen so at `since_ms`; after `after_ms` of
    /// that with the job still open, the job waits for you.
    AtInputLine { since_ms: u64, after_ms: u64 },
}

/// The state a pane shows for one job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shown {
    pub state: Status,
    /// `job 1abbcdef: beat 3 s ago (signed)`.
    pub message: String,
    pub source: Source,
    /// The job is not finished: its message ages and is refreshed.
    pub open: bool,
    /// When the state changes unless new evidence arrives (ms since the epoch).
    pub until_ms: Option<u64>,
}

/// `3 s`, `2m10s`, `1h05m`, `3d04h`.
pub fn duration(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..=59 => format!("{s} s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86_400, (s % 86_400) / 3600),
    }
}

fn shown(state: Status, text: String, source: Source, open: bool, until_ms: Option<u64>) -> Shown {
    Shown { state, message: format!("{text} ({})", source.word()), source, open, until_ms }
}

/// Since when the agent of `f`'s open job waits for a person at `now_ms` (an approval dialog, or
/// its input line held past the wait), or `None`.
pub fn waiting_since(f: &Facts, now_ms: u64) -> Option<u64> {
    if is_terminal(&f.status) {
        return None;
    }
    match &f.needs_you {
        Some(NeedsYou::Approval(_)) => Some(now_ms),
        Some(NeedsYou::AtInputLine { since_ms, after_ms }) if now_ms >= since_ms + after_ms => Some(*since_ms),
        _ => None,
    }
}

/// The state of `f` at `now_ms`.
pub fn judge(f: &Facts, now_ms: u64) -> Shown {
    let id = &f.job_id;
    if is_terminal(&f.status) {
        return finished(f);
    }
    match &f.needs_you {
        Some(NeedsYou::Approval(what)) => {
            let text = format!("job {id}: waiting for you: approve {what}?");
            return shown(Status::Blocked, text, Source::Screen, true, None);
        }
        Some(NeedsYou::AtInputLine { since_ms, after_ms }) if now_ms >= since_ms + after_ms => {
            let text = format!("job {id}: waiting for you: idle at its input line for {}", duration(now_ms - since_ms));
            return shown(Status::Blocked, text, Source::Screen, true, None);
        }
        _ => {}
    }
    let Some(ev) = &f.last else {
        // Not started yet: unknown within T of the dispatch, blocked past it.
        let since = f.dispatched_ms.map_or(0, |d| now_ms.saturating_sub(d));
        let due = f.dispatched_ms.map(|d| d + f.ack_ms);
        if due.is_some_and(|d| now_ms >= d) {
            return shown(
                Status::Blocked,
                format!("job {id}: no started for {}", duration(since)),
                Source::Inferred,
                true,
                None,
            );
        }
        return shown(
            Status::Unknown,
            format!("job {id}: waiting for started ({})", duration(since)),
            Source::Inferred,
            true,
            due,
        );
    };
    let quiet = now_ms.saturating_sub(ev.at_ms);
    if quiet < f.idle_ms {
        let text = format!("job {id}: {} {} ago", ev.what, duration(quiet));
        return shown(Status::Working, text, Source::Signed, true, Some(ev.at_ms + f.idle_ms));
    }
    shown(Status::Blocked, format!("job {id}: no evidence for {}", duration(quiet)), Source::Inferred, true, None)
}

/// A finished job: idle when its agent ended it (or an operator cancelled it), blocked when mam
/// closed it for silence, a missed start, a deadline or an unreachable broker.
fn finished(f: &Facts) -> Shown {
    let id = &f.job_id;
    let status = f.status.as_str();
    let reason = f.reason.as_deref().unwrap_or("");
    let by_agent = f.last_event.as_deref() == Some(status);
    let silence = match (&f.last, f.finished_ms) {
        (Some(ev), Some(end)) => Some(end.saturating_sub(ev.at_ms)),
        _ => None,
    };
    let (state, text, source) = match status {
        "completed" | "failed" | "error" if by_agent => (Status::Idle, format!("job {id}: {status}"), Source::Signed),
        "cancelled" => (Status::Idle, format!("job {id}: cancelled ({reason})"), Source::Operator),
        "deadline_timeout" if reason == crate::registry::AGENT_GONE => {
            (Status::Blocked, format!("job {id}: closed, the agent's process ended"), Source::Inferred)
        }
        "deadline_timeout" if reason == crate::registry::UNRESPONSIVE => {
            let gap = silence.map_or_else(String::new, |s| format!(", no evidence for {}", duration(s)));
            (Status::Blocked, format!("job {id}: closed unresponsive{gap}"), Source::Inferred)
        }
        "agent_blocked" => (Status::Blocked, format!("job {id}: never started (agent_blocked)"), Source::Inferred),
        "deadline_timeout" | "wall_clock_timeout" => {
            (Status::Blocked, format!("job {id}: deadline reached ({status})"), Source::Inferred)
        }
        "broker_unavailable" => (Status::Blocked, format!("job {id}: broker unavailable"), Source::Inferred),
        // An operator's `set completed|failed|error`.
        _ if reason.is_empty() => (Status::Idle, format!("job {id}: {status}"), Source::Operator),
        _ => (Status::Idle, format!("job {id}: {status} ({reason})"), Source::Operator),
    };
    shown(state, text, source, false, None)
}

/// The job a session's pane shows: its newest open job (by dispatch), else its newest finished one.
pub fn pick<'a>(jobs: impl IntoIterator<Item = &'a Facts>) -> Option<&'a Facts> {
    let mut best: Option<&Facts> = None;
    let key = |f: &Facts| (!is_terminal(&f.status), f.dispatched_ms.max(f.finished_ms).unwrap_or(0));
    for f in jobs {
        if best.is_none_or(|b| key(f) > key(b)) {
            best = Some(f);
        }
    }
    best
}

/// The pane title: `mam <state>: <message>`, at most 80 characters (herdr's cap).
pub fn title(s: &Shown) -> String {
    let t = format!("mam {}: {}", s.state.word(), s.message);
    if t.chars().count() <= 80 {
        return t;
    }
    let mut cut: String = t.chars().take(79).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000_000;

    fn facts(status: &str, last: Option<(u64, &str)>) -> Facts {
        Facts {
            needs_you: None,
            job_id: "1abbcdef".into(),
            status: status.into(),
            reason: None,
            last_event: None,
            dispatched_ms: Some(NOW - 60_000),
            finished_ms: None,
            idle_ms: 6_000,
            ack_ms: 30_000,
            last: last.map(|(ago, w)| Evidence { at_ms: NOW - ago, what: w.into() }),
        }
    }

    #[test]
    fn working_while_fresh_then_blocked_past_the_idle_window() {
        let f = facts("running", Some((3_000, "beat")));
        let s = judge(&f, NOW);
        assert_eq!((s.state, s.message.as_str()), (Status::Working, "job 1abbcdef: beat 3 s ago (signed)"));
        assert_eq!(s.until_ms, Some(NOW + 3_000));
        let s = judge(&f, NOW + 3_000);
        assert_eq!((s.state, s.source), (Status::Blocked, Source::Inferred));
        assert_eq!(s.message, "job 1abbcdef: no evidence for 6 s (inferred)");
        let s = judge(&f, NOW + 127_000);
        assert_eq!(s.message, "job 1abbcdef: no evidence for 2m10s (inferred)");
    }

    #[test]
    fn an_open_job_waits_for_you_at_an_approval_or_long_enough_at_the_input_line() {
        let mut f = facts("running", Some((1_000, "beat")));
        f.needs_you = Some(NeedsYou::Approval("Bash command: touch x".into()));
        let s = judge(&f, NOW);
        assert_eq!((s.state, s.source), (Status::Blocked, Source::Screen));
        assert_eq!(s.message, "job 1abbcdef: waiting for you: approve Bash command: touch x? (screen)");
        f.needs_you = Some(NeedsYou::AtInputLine { since_ms: NOW - 9_000, after_ms: 10_000 });
        assert_eq!(judge(&f, NOW).state, Status::Working, "not yet: 9 s at the input line");
        let s = judge(&f, NOW + 3_000);
        assert_eq!((s.state, s.source), (Status::Blocked, Source::Screen));
        assert_eq!(s.message, "job 1abbcdef: waiting for you: idle at its input line for 12 s (screen)");
        f.status = "completed".into();
        assert_ne!(judge(&f, NOW + 3_000).source, Source::Screen, "a finished job waits for nobody");
    }

    #[test]
    fn before_started_unknown_then_blocked_after_t() {
        let mut f = facts("pending", None);
        f.dispatched_ms = Some(NOW - 4_000);
        let s = judge(&f, NOW);
        assert_eq!((s.state, s.until_ms), (Status::Unknown, Some(NOW + 26_000)));
        assert_eq!(s.message, "job 1abbcdef: waiting for started (4 s) (inferred)");
        assert_eq!(judge(&f, NOW + 26_000).state, Status::Blocked);
    }

    #[test]
    fn finished_jobs_by_who_ended_them() {
        let mut f = facts("completed", Some((1_000, "completed")));
        f.last_event = Some("completed".into());
        let s = judge(&f, NOW);
        assert_eq!((s.state, s.message.as_str(), s.open), (Status::Idle, "job 1abbcdef: completed (signed)", false));
        let mut f = facts("deadline_timeout", Some((9_000, "beat")));
        f.reason = Some("unresponsive".into());
        f.finished_ms = Some(NOW);
        let s = judge(&f, NOW + 50_000);
        assert_eq!(s.state, Status::Blocked);
        assert_eq!(s.message, "job 1abbcdef: closed unresponsive, no evidence for 9 s (inferred)");
        let mut f = facts("cancelled", None);
        f.reason = Some("session stopped".into());
        assert_eq!(judge(&f, NOW).message, "job 1abbcdef: cancelled (session stopped) (operator)");
        assert_eq!(judge(&facts("agent_blocked", None), NOW).state, Status::Blocked);
        // An operator's completed is idle, but not the agent's signed word.
        assert_eq!(judge(&facts("completed", None), NOW).source, Source::Operator);
    }

    #[test]
    fn a_session_shows_its_newest_open_job_else_its_newest_finished_one() {
        let mut old_open = facts("running", None);
        old_open.dispatched_ms = Some(1);
        let mut done = facts("completed", None);
        done.finished_ms = Some(NOW);
        assert_eq!(pick([&done, &old_open]), Some(&old_open));
        let mut newer = done.clone();
        newer.finished_ms = Some(NOW + 1);
        assert_eq!(pick([&done, &newer]), Some(&newer));
        assert_eq!(pick(std::iter::empty()), None);
    }

    #[test]
    fn durations_and_titles() {
        assert_eq!(duration(59_999), "59 s");
        assert_eq!(duration(130_000), "2m10s");
        assert_eq!(duration(3_900_000), "1h05m");
        assert_eq!(duration(90_000_000), "1d01h");
        let s = judge(&facts("running", Some((0, "started"))), NOW);
        assert_eq!(title(&s), "mam working: job 1abbcdef: started 0 s ago (signed)");
        let long = Shown { message: "x".repeat(200), ..s };
        assert_eq!(title(&long).chars().count(), 80);
    }
}
