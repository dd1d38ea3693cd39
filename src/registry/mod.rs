//! The job registry and the transition engine (CORE 4, 5): the record format (`record`), the pure
//! transition table (`engine`), the locked read-decide-write transaction (`store`) and the audit log
//! with its status mirror (`audit`).
//!
//! Architecture Invariant: `store::apply` is the only code that writes a job record. Nothing here
//! prints, spawns, connects or sleeps; callers (the `mam registry` CLI, publish, heartbeat, watch,
//! the runner) turn outcomes into lines and exit codes.

pub mod audit;
pub mod engine;
pub mod record;
pub mod store;

/// Non-terminal statuses (CORE 5.1, A7).
pub const NON_TERMINAL: &[&str] = &["pending", "running"];

/// Terminal statuses (CORE 5.1, A7).
pub const TERMINAL: &[&str] = &[
    "completed",
    "failed",
    "error",
    "cancelled",
    "agent_blocked",
    "deadline_timeout",
    "wall_clock_timeout",
    "broker_unavailable",
];

/// Job types (A6).
pub const TYPES: &[&str] = &["task", "loop", "discuss"];

/// True for a status of the vocabulary (pre-check 1).
pub fn valid_status(s: &str) -> bool {
    NON_TERMINAL.contains(&s) || TERMINAL.contains(&s)
}

pub fn is_terminal(s: &str) -> bool {
    TERMINAL.contains(&s)
}

/// The reasons of a `deadline_timeout` the watcher or daemon closes for lack of life: no evidence
/// for the idle window, or the agent's process seen gone (issue 30, closed within N + 2 s).
pub const UNRESPONSIVE: &str = "unresponsive";
pub const AGENT_GONE: &str = "agent_gone";

/// The verdict word of a terminal status and its reason, the one rule wait, notify, the board and
/// the ui share: a job closed for lack of life (`deadline_timeout` with reason `unresponsive` or
/// `agent_gone`) is `unresponsive`; every other status is its own word.
pub fn verdict_word<'a>(status: &'a str, reason: &str) -> &'a str {
    if status == "deadline_timeout" && (reason == UNRESPONSIVE || reason == AGENT_GONE) {
        UNRESPONSIVE
    } else {
        status
    }
}

/// `pending, running, completed, ...` for the invalid-status line of CORE 4.2.
pub fn status_list() -> String {
    let all: Vec<&str> = NON_TERMINAL.iter().chain(TERMINAL.iter()).copied().collect();
    all.join(", ")
}

/// The auth token of a remote job (CORE 9.2):
/// `hex(HMAC-SHA256(MAM_DISPATCH_SECRET, "mam-auth\n<job_id>\n<attempt>\n<dispatch_token>"))`.
/// Both the orchestrator and the runner compute it, so the event key never crosses the broker.
pub fn remote_auth_token(secret: &[u8], job_id: &str, attempt: u64, dispatch_token: &str) -> String {
    crate::sign::derive_remote_auth_token(secret, job_id, attempt, dispatch_token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vocabulary_is_disjoint_and_complete() {
        assert_eq!(NON_TERMINAL.len() + TERMINAL.len(), 10);
        for s in NON_TERMINAL {
            assert!(!is_terminal(s));
            assert!(valid_status(s));
        }
        assert!(!valid_status("bogus"));
        assert!(status_list().starts_with("pending, running, completed"));
    }

    #[test]
    fn remote_auth_token_is_hmac_of_the_identity() {
        // Expected value computed independently with
        // `printf 'mam-auth\nj1\n2\ntok' | openssl dgst -sha256 -hmac s3cret`.
        let t = remote_auth_token(b"s3cret", "j1", 2, "tok");
        assert_eq!(t, "94866d1b3659c3590ad0e2065a37e9d39cf1beafabf9b82025db5c3ed7a08558");
        assert_eq!(t, remote_auth_token(b"s3cret", "j1", 2, "tok"));
        assert_ne!(t, remote_auth_token(b"s3cret", "j1", 3, "tok"));
        assert_ne!(t, remote_auth_token(b"other", "j1", 2, "tok"));
    }
}
