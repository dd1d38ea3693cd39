//! The wrapper's judgement (ORCH 3.2 step 9, 3.4; A9, A11, A13, A14) as pure functions over explicit
//! inputs, `now` included (milliseconds since the job was registered): whether the job has started,
//! when the evidence last renewed the idle window, whether the broker is down, and which close, if
//! any, is due. Also the parsers of the two evidence sources: the subscriber's A10 lines and the
//! job's `events.log` lines.
//!
//! Nothing here reads a file, spawns, sleeps or looks at a clock; `delegate::run` feeds it.

use serde_json::Value;

/// A close the wrapper must request (through the engine, as operator `set`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Due {
    /// No `started` within T from the end of the injection (capped by the deadline).
    AgentBlocked { waited_s: u64, ack_s: u64, cut: bool },
    /// The job's deadline passed after it started (`deadline_timeout` reason `deadline`, or
    /// `wall_clock_timeout` under `--deadline-source wall-clock`).
    Deadline,
    /// No evidence from either source for IDLE after the last evidence.
    Unresponsive,
    /// No evidence for IDLE while the subscriber cannot reach the broker (A11).
    BrokerUnavailable,
    /// The agent's process ended with the job open (issue 30): seen `GONE_GRACE_MS` ago, so a
    /// terminal event it wrote on its way out is in. Before `started` it is `agent_blocked`.
    AgentGone { pid: i32, started: bool },
}

/// How long a job stays open after its agent's process was seen gone: a terminal event written
/// just before the exit lands first (issue 30: the close comes within N + 2 s of the death).
pub const GONE_GRACE_MS: u64 = 1_000;

impl Due {
    /// The engine's target status and reason for this close.
    pub fn status_reason(&self, wall_clock: bool) -> (&'static str, String) {
        match self {
            Due::AgentBlocked { .. } => ("agent_blocked", self.message()),
            Due::Deadline if wall_clock => ("wall_clock_timeout", "wall_clock".into()),
            Due::Deadline => ("deadline_timeout", "deadline".into()),
            Due::Unresponsive => ("deadline_timeout", "unresponsive".into()),
            Due::BrokerUnavailable => ("broker_unavailable", "broker unavailable".into()),
            Due::AgentGone { started: false, .. } => ("agent_blocked", self.message()),
            Due::AgentGone { started: true, .. } => ("deadline_timeout", crate::registry::AGENT_GONE.into()),
        }
    }

    /// The text of the diagnostic (3.2 step 9: the budget actually applied is named).
    pub fn message(&self) -> String {
        match self {
            Due::AgentBlocked { waited_s, ack_s, cut: true } => {
                format!("no started within {waited_s} s (ack timeout {ack_s} s cut by the job deadline)")
            }
            Due::AgentBlocked { waited_s, ack_s, .. } => {
                format!("no started within {waited_s} s (ack timeout {ack_s} s)")
            }
            Due::Deadline => "deadline reached".into(),
            Due::Unresponsive => "no evidence within the idle window (unresponsive)".into(),
            Due::BrokerUnavailable => "broker unreachable and no evidence on disk within the idle window".into(),
            Due::AgentGone { pid, started: false } => format!("the agent's process (pid {pid}) ended before started"),
            Due::AgentGone { pid, .. } => format!("the agent's process (pid {pid}) ended with the job open"),
        }
    }
}

/// The state of one wait: what has been seen, and when (ms since registration).
#[derive(Debug, Clone)]
pub struct Judge {
    /// The deadline (`--timeout`), `None` for no deadline.
    pub deadline_ms: Option<u64>,
    /// T.
    pub ack_ms: u64,
    /// IDLE (`idle_timeout_sec`).
    pub idle_ms: u64,
    inject_end_ms: Option<u64>,
    started_ms: Option<u64>,
    last_evidence_ms: Option<u64>,
    broker_down_since: Option<u64>,
    /// When the agent's process was first seen gone, and its pid.
    agent_gone: Option<(u64, i32)>,
}

impl Judge {
    pub fn new(deadline_ms: Option<u64>, ack_ms: u64, idle_ms: u64) -> Judge {
        Judge {
            deadline_ms,
            ack_ms,
            idle_ms,
            inject_end_ms: None,
            started_ms: None,
            last_evidence_ms: None,
            broker_down_since: None,
            agent_gone: None,
        }
    }

    /// The injection (or the remote dispatch) ended: T starts counting.
    pub fn injected(&mut self, now: u64) {
        self.inject_end_ms.get_or_insert(now);
    }

    /// Proof that the agent received the job (`started`, or a terminal of this attempt).
    pub fn started(&mut self, now: u64) {
        self.started_ms.get_or_insert(now);
        self.evidence(now);
    }

    pub fn is_started(&self) -> bool {
        self.started_ms.is_some()
    }

    pub fn started_ms(&self) -> Option<u64> {
        self.started_ms
    }

    /// Any accepted message of this attempt on the wire, or a newer events.log record: renews the
    /// idle window (which runs only once the job has started).
    pub fn evidence(&mut self, now: u64) {
        self.last_evidence_ms = Some(self.last_evidence_ms.map_or(now, |l| l.max(now)));
    }

    pub fn last_evidence_ms(&self) -> Option<u64> {
        self.last_evidence_ms
    }

    pub fn broker_down(&mut self, now: u64) {
        self.broker_down_since.get_or_insert(now);
    }

    pub fn broker_up(&mut self) {
        self.broker_down_since = None;
    }

    pub fn is_broker_down(&self) -> bool {
        self.broker_down_since.is_some()
    }

    /// The agent's process `pid` was seen gone at `now` (the first sighting counts).
    pub fn agent_gone(&mut self, now: u64, pid: i32) {
        self.agent_gone.get_or_insert((now, pid));
    }

    /// The close due at `now`, if any. Before `started`: T from the end of the injection, cut by the
    /// deadline, gives `agent_blocked`. After: the deadline, then the idle window (A14: due exactly
    /// IDLE after the last evidence; `broker_unavailable` when the broker is down then, A11).
    pub fn due(&self, now: u64) -> Option<Due> {
        if let Some((seen, pid)) = self.agent_gone {
            if now >= seen + GONE_GRACE_MS {
                return Some(Due::AgentGone { pid, started: self.started_ms.is_some() });
            }
        }
        match self.started_ms {
            None => {
                let from = self.inject_end_ms?;
                let ack_end = from + self.ack_ms;
                let (end, cut) = match self.deadline_ms {
                    Some(d) if d < ack_end => (d, true),
                    _ => (ack_end, false),
                };
                (now >= end).then(|| Due::AgentBlocked {
                    waited_s: (end.saturating_sub(from) + 500) / 1000,
                    ack_s: self.ack_ms / 1000,
                    cut,
                })
            }
            Some(_) => {
                if self.deadline_ms.is_some_and(|d| now >= d) {
                    return Some(Due::Deadline);
                }
                let last = self.last_evidence_ms.unwrap_or(0);
                if now >= last + self.idle_ms {
                    return Some(if self.is_broker_down() { Due::BrokerUnavailable } else { Due::Unresponsive });
                }
                None
            }
        }
    }

    /// The next instant (ms) at which `due` can change without new input, for the pass's sleep.
    pub fn next_check(&self, now: u64) -> u64 {
        let mut next = u64::MAX;
        if let Some(d) = self.deadline_ms {
            next = next.min(d);
        }
        match (self.started_ms, self.inject_end_ms) {
            (None, Some(from)) => next = next.min(from + self.ack_ms),
            (Some(_), _) => next = next.min(self.last_evidence_ms.unwrap_or(0) + self.idle_ms),
            (None, None) => {}
        }
        if let Some((seen, _)) = self.agent_gone {
            next = next.min(seen + GONE_GRACE_MS);
        }
        next.max(now)
    }
}

/// One subscriber line (A10): `<ts> attempt=<a> token=<8hex> <what>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubLine {
    Subscribed,
    Accepted { seq: u64, event: String },
    AcceptedState { seq: u64, status: String },
    Advanced { status: String },
    Dropped,
    BrokerDown,
    BrokerUp,
    Result(String),
}

/// Parses a subscriber line of this attempt and token; lines of any other attempt or token, and
/// anything unrecognised, are `None` (A10: readers ignore them).
pub fn parse_sub_line(line: &str, attempt: u64, token8: &str) -> Option<SubLine> {
    let mut it = line.splitn(4, ' ');
    let _ts = it.next()?;
    let a = it.next()?.strip_prefix("attempt=")?;
    let t = it.next()?.strip_prefix("token=")?;
    let what = it.next()?.trim_end();
    if a.parse::<u64>().ok()? != attempt || t != token8 {
        return None;
    }
    let field = |k: &str| what.split(' ').find_map(|w| w.strip_prefix(k)).map(str::to_string);
    let seq = || field("seq=").and_then(|s| s.parse::<u64>().ok());
    Some(match what.split(' ').next()? {
        "subscribed" => SubLine::Subscribed,
        "accepted" => SubLine::Accepted { seq: seq()?, event: field("event=")? },
        "accepted-state" => SubLine::AcceptedState { seq: seq()?, status: field("status=")? },
        "advanced" => SubLine::Advanced { status: field("status=")? },
        "dropped" => SubLine::Dropped,
        "broker" if what == "broker down" => SubLine::BrokerDown,
        "broker" if what == "broker up" => SubLine::BrokerUp,
        "result" => SubLine::Result(what.strip_prefix("result ")?.to_string()),
        _ => return None,
    })
}

/// An events.log record of this attempt and token: `(seq, event)`. Others are `None` (loop jobs
/// share one events.log, so a token mismatch is history, not evidence).
pub fn parse_log_line(line: &[u8], attempt: u64, token: &str) -> Option<(u64, String)> {
    let v: Value = serde_json::from_slice(line).ok()?;
    if v.get("attempt").and_then(Value::as_u64) != Some(attempt)
        || v.get("dispatch_token").and_then(Value::as_str) != Some(token)
    {
        return None;
    }
    Some((v.get("seq")?.as_u64()?, v.get("event")?.as_str()?.to_string()))
}

/// True for an event or status that proves the agent received the job: `started`/`running` or any
/// terminal (a retained terminal proves delivery just as well, 3.2 step 9).
pub fn proves_start(word: &str) -> bool {
    matches!(word, "started" | "running") || crate::registry::is_terminal(word)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_blocked_after_t_from_the_injection() {
        let mut j = Judge::new(Some(1_800_000), 5000, 3000);
        assert_eq!(j.due(100_000), None, "T does not run before the injection ends");
        j.injected(2000);
        assert_eq!(j.due(6999), None);
        assert_eq!(j.due(7000), Some(Due::AgentBlocked { waited_s: 5, ack_s: 5, cut: false }));
        assert_eq!(j.next_check(3000), 7000);
    }

    #[test]
    fn the_deadline_cuts_t_and_the_message_says_so() {
        let mut j = Judge::new(Some(42_000), 300_000, 120_000);
        j.injected(0);
        let d = j.due(42_000).unwrap();
        assert_eq!(d, Due::AgentBlocked { waited_s: 42, ack_s: 300, cut: true });
        assert_eq!(d.message(), "no started within 42 s (ack timeout 300 s cut by the job deadline)");
        assert_eq!(d.status_reason(false).0, "agent_blocked");
    }

    #[test]
    fn a14_idle_close_exactly_one_window_after_the_last_evidence() {
        let mut j = Judge::new(None, 5000, 3000);
        j.injected(1000);
        j.started(1500);
        j.evidence(4000);
        assert_eq!(j.due(6999), None);
        assert_eq!(j.due(7000), Some(Due::Unresponsive));
        assert_eq!(j.next_check(5000), 7000);
        j.evidence(6500);
        assert_eq!(j.due(7000), None, "evidence renews the window");
        j.broker_down(8000);
        assert_eq!(j.due(9500), Some(Due::BrokerUnavailable));
        j.broker_up();
        assert_eq!(j.due(9500), Some(Due::Unresponsive));
    }

    #[test]
    fn a_gone_agent_closes_the_job_one_grace_after_it_was_seen() {
        let mut j = Judge::new(None, 60_000, 120_000);
        j.injected(0);
        j.started(500);
        j.agent_gone(3000, 42);
        j.agent_gone(3500, 43);
        assert_eq!(j.next_check(3000), 3000 + GONE_GRACE_MS);
        assert_eq!(j.due(3000 + GONE_GRACE_MS - 1), None, "the grace lets a last terminal event land");
        let d = j.due(3000 + GONE_GRACE_MS).unwrap();
        assert_eq!(d, Due::AgentGone { pid: 42, started: true });
        assert_eq!(d.status_reason(false), ("deadline_timeout", "agent_gone".into()));
        assert_eq!(d.message(), "the agent's process (pid 42) ended with the job open");
        let mut j = Judge::new(None, 60_000, 120_000);
        j.injected(0);
        j.agent_gone(100, 7);
        let d = j.due(100 + GONE_GRACE_MS).unwrap();
        assert_eq!(d.status_reason(false).0, "agent_blocked", "it never started");
    }

    #[test]
    fn the_deadline_wins_after_start_and_names_the_source() {
        let mut j = Judge::new(Some(10_000), 5000, 60_000);
        j.injected(0);
        j.started(100);
        assert_eq!(j.due(10_000), Some(Due::Deadline));
        assert_eq!(Due::Deadline.status_reason(true), ("wall_clock_timeout", "wall_clock".into()));
        assert_eq!(Due::Deadline.status_reason(false), ("deadline_timeout", "deadline".into()));
        assert_eq!(Due::Unresponsive.status_reason(false), ("deadline_timeout", "unresponsive".into()));
    }

    #[test]
    fn a10_lines_of_another_attempt_or_token_are_ignored() {
        let l = "2026-01-01T00:00:00.000Z attempt=2 token=abcdef01 accepted seq=7 event=progress";
        assert_eq!(parse_sub_line(l, 2, "abcdef01"), Some(SubLine::Accepted { seq: 7, event: "progress".into() }));
        assert_eq!(parse_sub_line(l, 1, "abcdef01"), None);
        assert_eq!(parse_sub_line(l, 2, "00000000"), None);
        let t = "ts attempt=1 token=x";
        for (what, want) in [
            ("accepted-state seq=3 status=running", SubLine::AcceptedState { seq: 3, status: "running".into() }),
            ("advanced status=completed", SubLine::Advanced { status: "completed".into() }),
            ("broker down", SubLine::BrokerDown),
            ("broker up", SubLine::BrokerUp),
            ("result unresponsive", SubLine::Result("unresponsive".into())),
            ("subscribed topic=a/b", SubLine::Subscribed),
            ("dropped seq=? reason=bad_sig", SubLine::Dropped),
        ] {
            assert_eq!(parse_sub_line(&format!("{t} {what}"), 1, "x"), Some(want), "{what}");
        }
        assert_eq!(parse_sub_line("garbage", 1, "x"), None);
    }

    #[test]
    fn log_lines_need_this_attempt_and_token() {
        let l = br#"{"attempt":1,"dispatch_token":"tok","seq":4,"event":"started"}"#;
        assert_eq!(parse_log_line(l, 1, "tok"), Some((4, "started".into())));
        assert_eq!(parse_log_line(l, 1, "other"), None);
        assert_eq!(parse_log_line(l, 2, "tok"), None);
        assert_eq!(parse_log_line(b"not json", 1, "tok"), None);
        assert!(proves_start("started") && proves_start("completed") && !proves_start("progress"));
    }
}
