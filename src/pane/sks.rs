//! `send_keys_safe` (ORCH 1.7, A24), written once over the `Backend` trait: the idle handshake
//! (skipped for backends without lifecycle), quiescence, one submission, and delivery confirmed only
//! by `working` or the caller's `Confirm` evidence.
//!
//! It knows no jobs and reads no files: confirmation beyond the agent's status is the caller's.

use std::time::{Duration, Instant};

use super::contract::{Accepted, Backend, InputLine, PromptOutcome, Status};
use super::knobs::Knobs;
use crate::sys;

/// Evidence besides the agent's `working` status that a submitted prompt was taken up (for a job, its
/// own `started` with the current token: `delegate::confirm::JobStarted`). `send_keys_safe` knows no
/// jobs; the caller brings this.
pub trait Confirm {
    /// Called once, right before the prompt is submitted.
    fn before_submit(&mut self) {}
    /// What confirms delivery (`job j1 started`), or `None` while nothing does.
    fn confirmed(&mut self) -> Option<String>;
}

/// The outcome of `send_keys_safe`, with its exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SksOutcome {
    /// rc 0: settled, or accepted and confirmed (the words say by what).
    Delivered(Delivery),
    /// rc 3: nothing submitted (agent busy, transport error, agent not running, unknown target).
    NotSubmitted(String),
    /// rc 4: accepted but not confirmed within the grace (fail closed).
    Unconfirmed(String),
}

/// How a prompt was delivered, in plain words, and whether that is worth a NOTE to someone who
/// only wants to know the job started (issue 32 item 5: the usual way of a backend is not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub how: String,
    /// The delivery took an unusual path: the agent's prompt stalled, or a backend that sees
    /// agents settle did not see this one.
    pub notable: bool,
}

impl SksOutcome {
    pub fn rc(&self) -> i32 {
        match self {
            SksOutcome::Delivered(_) => 0,
            SksOutcome::NotSubmitted(_) => 3,
            SksOutcome::Unconfirmed(_) => 4,
        }
    }
}

/// The longest prompt `send_keys_safe` accepts (1.7: longer content goes in a file the prompt names).
pub const MAX_PROMPT: usize = 4096;

/// Why `text` cannot be a prompt, or `None`: more than `MAX_PROMPT` bytes, or any control character.
/// A prompt is typed into a terminal, where `\r` submits early and ESC starts a sequence (a
/// bracketed-paste end `ESC [201~` would let the rest run as typed commands), so none gets through.
pub fn prompt_problem(text: &str) -> Option<String> {
    if text.len() > MAX_PROMPT {
        return Some(format!("the prompt is {} bytes; at most {MAX_PROMPT}", text.len()));
    }
    text.chars().find(|c| c.is_control()).map(|c| {
        format!(
            "the prompt holds a control character (U+{:04X}); put such content in a file the prompt names",
            c as u32
        )
    })
}

/// 1.7 with A24: idle handshake (skipped for backends without lifecycle), quiescence, submit, and
/// delivery confirmed only by `working` or the job's own `started` with the current token.
pub fn send_keys_safe(
    b: &dyn Backend,
    target: &str,
    text: &str,
    mut confirm: Option<&mut dyn Confirm>,
    k: &Knobs,
) -> SksOutcome {
    if let Some(why) = prompt_problem(text) {
        return SksOutcome::NotSubmitted(format!("{why}; nothing submitted"));
    }
    let poll = Duration::from_millis(k.poll_ms);
    let deadline = Instant::now() + Duration::from_millis(k.idle_wait_ms);
    // 1. Idle handshake.
    if b.has_lifecycle() {
        loop {
            match b.agent_status(target) {
                Status::Idle | Status::Done => break,
                Status::Absent => return SksOutcome::NotSubmitted(format!("agent {target} is not running")),
                _ => {}
            }
            if Instant::now() >= deadline {
                return SksOutcome::NotSubmitted(format!(
                    "agent busy: {target} not idle within {} s (MAM_SKS_IDLE_WAIT_S); nothing submitted",
                    k.idle_wait_ms / 1000
                ));
            }
            sys::sleep(poll.min(remaining(deadline)).max(Duration::from_millis(1)));
        }
    } else if b.agent_status(target) == Status::Absent {
        return SksOutcome::NotSubmitted(format!("agent {target} is not running"));
    }
    // 1b. The screen, on every backend that has one (issue 30 item 5): a prompt is typed only at the
    // agent's empty input line. Typed into a working CLI it is queued (claude runs it after the
    // current turn, a closed job's prompt included); typed behind half-typed words it becomes one
    // line with them. The job waits, as for the idle handshake, within the same budget.
    loop {
        match b.input_line(target) {
            InputLine::Ready | InputLine::Unknown => break,
            InputLine::Busy(what) if Instant::now() >= deadline => {
                return SksOutcome::NotSubmitted(format!(
                    "agent busy: the screen of {target} {what} for {} s (MAM_SKS_IDLE_WAIT_S); nothing submitted",
                    k.idle_wait_ms / 1000
                ));
            }
            InputLine::Busy(_) => sys::sleep(poll.min(remaining(deadline)).max(Duration::from_millis(1))),
        }
    }
    // 2. Quiescence: two identical reads a gap apart, tried for a while, then submit anyway.
    let deadline = Instant::now() + Duration::from_millis(k.quiesce_max_ms);
    let mut last = match b.read_detection(target) {
        Ok(t) => t,
        Err(e) => return SksOutcome::NotSubmitted(format!("cannot read {target}: {e}")),
    };
    while Instant::now() < deadline {
        sys::sleep(Duration::from_millis(k.quiesce_gap_ms).min(remaining(deadline)));
        let now = match b.read_detection(target) {
            Ok(t) => t,
            Err(e) => return SksOutcome::NotSubmitted(format!("cannot read {target}: {e}")),
        };
        if now == last {
            break;
        }
        last = now;
    }
    // The confirmer notes what it needs (a job's current token) before the submission, so a later
    // re-dispatch cannot be mistaken for ours.
    if let Some(c) = confirm.as_deref_mut() {
        c.before_submit();
    }
    // 3-6. Submit and judge.
    let why = match b.prompt(target, text, k.prompt_timeout_ms) {
        PromptOutcome::Settled => {
            return SksOutcome::Delivered(Delivery {
                how: "the agent took the prompt and settled".into(),
                notable: false,
            })
        }
        PromptOutcome::TransportError(e) => return SksOutcome::NotSubmitted(format!("{e}; nothing submitted")),
        PromptOutcome::Accepted(Accepted::Timeout) => "timeout",
        PromptOutcome::Accepted(Accepted::Stalled) => "agent_prompt_stalled",
    };
    // Issue 18, issue 32 item 5: what happened, in plain words, and what confirmed it. A backend
    // without lifecycle (tmux) never sees an agent settle: the prompt is typed and the job's own
    // evidence confirms it, the usual way there, not worth a NOTE.
    let (took, notable) = match why {
        "timeout" if !b.has_lifecycle() => ("the prompt was typed into the pane", false),
        "timeout" => ("the pane took the prompt but the agent was not seen to take it within the prompt timeout", true),
        _ => ("the pane took the prompt but the agent's prompt stalled (agent_prompt_stalled)", true),
    };
    let deadline = Instant::now() + Duration::from_millis(k.grace_ms);
    loop {
        if b.agent_status(target) == Status::Working {
            let how = format!("{took}; the agent then started working, which confirms delivery");
            return SksOutcome::Delivered(Delivery { how, notable });
        }
        if let Some(by) = confirm.as_deref_mut().and_then(|c| c.confirmed()) {
            return SksOutcome::Delivered(Delivery { how: format!("{took}; {by}, which confirms delivery"), notable });
        }
        if Instant::now() >= deadline {
            return SksOutcome::Unconfirmed(format!(
                "prompt to {target} accepted ({why}) but delivery not confirmed within {} s (SKS_DELIVERY_GRACE_S)",
                k.grace_ms / 1000
            ));
        }
        sys::sleep(poll.min(remaining(deadline)).max(Duration::from_millis(1)));
    }
}

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pane::contract::{Created, Dir, ListOutcome, PaneError, PaneResult, Workspace};
    use std::path::Path;

    /// A scripted backend for the decision logic of `send_keys_safe`.
    struct Scripted {
        lifecycle: bool,
        status: Status,
        after_prompt: Status,
        outcome: PromptOutcome,
        prompts: std::cell::Cell<u32>,
        /// Looks at the screen that still show the agent busy (`u32::MAX`: always); then ready.
        busy_looks: std::cell::Cell<u32>,
    }

    impl Backend for Scripted {
        fn name(&self) -> &'static str {
            "scripted"
        }
        fn server(&self) -> String {
            "s".into()
        }
        fn ensure_server(&self) -> PaneResult<()> {
            Ok(())
        }
        fn list_agents(&self) -> ListOutcome {
            ListOutcome::NoServer
        }
        fn list_workspaces(&self, _: &Path) -> PaneResult<Vec<Workspace>> {
            Ok(Vec::new())
        }
        fn create_workspace(&self, _: &Path, _: Option<&str>, _: &[(String, String)]) -> PaneResult<Created> {
            Err(PaneError::Failed("no".into()))
        }
        fn split(&self, _: &str, _: Dir, _: &Path, _: &[(String, String)]) -> PaneResult<String> {
            Err(PaneError::Failed("no".into()))
        }
        fn rename_workspace(&self, _: &str, _: &str) -> PaneResult<()> {
            Ok(())
        }
        fn start_agent(&self, _: &str, _: &str, _: &str, _: &[String]) -> PaneResult<()> {
            Ok(())
        }
        fn prompt(&self, _: &str, _: &str, _: u32) -> PromptOutcome {
            self.prompts.set(self.prompts.get() + 1);
            self.outcome.clone()
        }
        fn agent_status(&self, _: &str) -> Status {
            if self.prompts.get() > 0 {
                self.after_prompt
            } else {
                self.status
            }
        }
        fn read_detection(&self, _: &str) -> PaneResult<String> {
            Ok("same".into())
        }
        fn send_keys(&self, _: &str, _: &str) -> PaneResult<()> {
            Ok(())
        }
        fn close_pane(&self, _: &str) -> PaneResult<()> {
            Ok(())
        }
        fn close_workspace(&self, _: &str) -> PaneResult<()> {
            Ok(())
        }
        fn has_lifecycle(&self) -> bool {
            self.lifecycle
        }
        fn input_line(&self, _: &str) -> InputLine {
            match self.busy_looks.get() {
                0 => InputLine::Ready,
                n => {
                    self.busy_looks.set(n.saturating_sub(u32::from(n != u32::MAX)));
                    InputLine::Busy("works (a working mark is on screen)")
                }
            }
        }
    }

    /// A confirmer whose evidence shows on look `at`.
    struct Evidence {
        noted: u32,
        at: Option<u32>,
        polls: u32,
    }

    impl Confirm for Evidence {
        fn before_submit(&mut self) {
            self.noted += 1;
        }
        fn confirmed(&mut self) -> Option<String> {
            self.polls += 1;
            (Some(self.polls) >= self.at && self.at.is_some()).then(|| "job j1 reported started".to_string())
        }
    }

    fn fast() -> Knobs {
        Knobs {
            idle_wait_ms: 100,
            grace_ms: 150,
            poll_ms: 10,
            quiesce_gap_ms: 10,
            quiesce_max_ms: 50,
            ..Knobs::default()
        }
    }

    fn scripted(lifecycle: bool, status: Status, after: Status, outcome: PromptOutcome) -> Scripted {
        Scripted {
            lifecycle,
            status,
            after_prompt: after,
            outcome,
            prompts: std::cell::Cell::new(0),
            busy_looks: std::cell::Cell::new(0),
        }
    }

    #[test]
    fn prompts_with_control_characters_are_never_typed() {
        for bad in ["hi\rrm -rf ~", "paste\x1b[201~touch /tmp/owned", "a\nb", "tab\there", "del\x7f", "c1\u{9b}x"] {
            let b = scripted(true, Status::Idle, Status::Working, PromptOutcome::Settled);
            let o = send_keys_safe(&b, "a", bad, None, &fast());
            assert!(matches!(&o, SksOutcome::NotSubmitted(m) if m.contains("control character")), "{bad:?}: {o:?}");
            assert_eq!(b.prompts.get(), 0, "{bad:?} reached the backend");
        }
        let b = scripted(true, Status::Idle, Status::Working, PromptOutcome::Settled);
        assert_eq!(send_keys_safe(&b, "a", &"x".repeat(MAX_PROMPT + 1), None, &fast()).rc(), 3);
        assert_eq!(
            send_keys_safe(&b, "a", "Job j1: read and follow /a b/brief.md. Run first: x", None, &fast()).rc(),
            0
        );
    }

    #[test]
    fn a24_busy_agent_is_rc3_and_nothing_is_submitted() {
        let b = scripted(true, Status::Working, Status::Working, PromptOutcome::Settled);
        let o = send_keys_safe(&b, "a", "hi", None, &fast());
        assert_eq!(o.rc(), 3);
        assert!(matches!(&o, SksOutcome::NotSubmitted(m) if m.contains("agent busy")));
        assert_eq!(b.prompts.get(), 0);
    }

    #[test]
    fn a24_backend_without_lifecycle_skips_the_idle_wait_and_needs_started() {
        let accepted = PromptOutcome::Accepted(Accepted::Timeout);
        // Status only `unknown`: submitted anyway, and not confirmed without the caller's evidence.
        let b = scripted(false, Status::Unknown, Status::Unknown, accepted.clone());
        let mut never = Evidence { noted: 0, at: None, polls: 0 };
        assert_eq!(send_keys_safe(&b, "a", "hi", Some(&mut never), &fast()).rc(), 4);
        assert_eq!(b.prompts.get(), 1);
        assert_eq!(never.noted, 1, "noted once, before the submission");
        assert!(never.polls > 0);
        // The confirmer's evidence (here on its third look) confirms it and names itself.
        let mut later = Evidence { noted: 0, at: Some(3), polls: 0 };
        let o = send_keys_safe(&b, "a", "hi", Some(&mut later), &fast());
        assert_eq!(
            o,
            SksOutcome::Delivered(Delivery {
                how: "the prompt was typed into the pane; job j1 reported started, which confirms delivery".into(),
                notable: false
            })
        );
        // `working` after an accepted submission confirms delivery.
        let b = scripted(true, Status::Idle, Status::Working, PromptOutcome::Accepted(Accepted::Stalled));
        assert_eq!(send_keys_safe(&b, "a", "hi", None, &fast()).rc(), 0);
        // A transport error submits nothing.
        let b = scripted(true, Status::Idle, Status::Idle, PromptOutcome::TransportError("x".into()));
        assert_eq!(send_keys_safe(&b, "a", "hi", None, &fast()).rc(), 3);
    }

    /// Issue 30 item 5: on a backend without lifecycle (tmux) the prompt waits until the screen shows
    /// the agent at its empty input line; a screen that stays busy submits nothing.
    #[test]
    fn a_prompt_is_typed_only_at_the_empty_input_line() {
        let accepted = PromptOutcome::Accepted(Accepted::Timeout);
        let b = scripted(false, Status::Working, Status::Working, accepted.clone());
        b.busy_looks.set(3);
        assert_eq!(send_keys_safe(&b, "a", "hi", None, &fast()).rc(), 0, "typed once the screen is ready");
        assert_eq!((b.prompts.get(), b.busy_looks.get()), (1, 0));
        let b = scripted(false, Status::Working, Status::Working, accepted);
        b.busy_looks.set(u32::MAX);
        let o = send_keys_safe(&b, "a", "hi", None, &fast());
        assert_eq!(
            o,
            SksOutcome::NotSubmitted(
                "agent busy: the screen of a works (a working mark is on screen) for 0 s (MAM_SKS_IDLE_WAIT_S); \
                 nothing submitted"
                    .into()
            )
        );
        assert_eq!(b.prompts.get(), 0, "nothing typed into a busy agent");
    }
}
