//! `mam attach`'s decision (issue 18): which commands bring a person to an agent's pane, from where
//! they are. A pure function over the row's backend, server and pane and the caller's terminal
//! (inside tmux, on which socket; inside herdr; neither), so every cell is tested without a server.
//!
//! It never runs anything and never prints: `cmd::attach` prints the plan (`--print`) or runs it.

use std::fmt;

use crate::text::shell_quote;

/// Where the agent is: its session name, backend, server (tmux socket or herdr session) and pane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub name: String,
    pub backend: String,
    pub server: String,
    pub pane: String,
}

/// Where the person is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Here {
    /// Inside a tmux client; `socket` is the server's socket name (the basename of `$TMUX`'s path).
    Tmux { socket: String },
    /// Inside a herdr pane (`HERDR_ENV=1`).
    Herdr,
    /// A plain terminal.
    Outside,
}

impl Here {
    /// From the values of `TMUX` and `HERDR_ENV` (`$TMUX` is `<socket path>,<pid>,<index>`).
    pub fn from_vars(tmux: Option<&str>, herdr_env: Option<&str>) -> Here {
        if let Some(t) = tmux.filter(|t| !t.is_empty()) {
            let path = t.split(',').next().unwrap_or("");
            let socket = path.rsplit('/').next().unwrap_or("").to_string();
            return Here::Tmux { socket };
        }
        if herdr_env == Some("1") {
            return Here::Herdr;
        }
        Here::Outside
    }
}

/// One command: variables to set, then the argv.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub env: Vec<(String, String)>,
    pub argv: Vec<String>,
}

impl fmt::Display for Step {
    /// As a shell line a person can type.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut words: Vec<String> = Vec::new();
        for (k, v) in &self.env {
            words.push(format!("{k}={}", word(v)));
        }
        words.extend(self.argv.iter().map(|a| word(a)));
        f.write_str(&words.join(" "))
    }
}

/// A shell word: as it is when it needs no quoting, else POSIX-quoted.
fn word(s: &str) -> String {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"%@:/._-=+,".contains(&b)) {
        s.to_string()
    } else {
        shell_quote(s)
    }
}

fn step(argv: &[&str]) -> Step {
    Step { env: Vec::new(), argv: argv.iter().map(|s| s.to_string()).collect() }
}

/// The plan: the steps to run in order (the last one is the one that brings the person there), and
/// a note for the person when there is something to know (a nested tmux client's prefix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub steps: Vec<Step>,
    /// True when the last step takes over this terminal (exec it); false when it returns at once.
    pub takes_terminal: bool,
    pub note: Option<String>,
}

/// Why there is no plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoPane(pub String);

impl fmt::Display for NoPane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The decision table.
/// - tmux, inside tmux on the agent's own server: select its window and pane, `switch-client`.
/// - tmux, inside tmux on another server (the default: agents live on `-L mam`, docs/DESIGN.md):
///   a new window of the person's server running a nested client of the agent's server.
/// - tmux, outside tmux: select the window and pane, then `attach-session` (takes the terminal).
/// - herdr, inside herdr: `herdr agent focus <pane>` on the agent's session.
/// - herdr, outside: `herdr agent attach <pane>` (takes the terminal; detach with ctrl+b q).
/// - fake (the test double): there is no pane to look at.
pub fn plan(t: &Target, here: &Here) -> Result<Plan, NoPane> {
    match t.backend.as_str() {
        "tmux" => {
            let srv = t.server.as_str();
            let select = [
                step(&["tmux", "-L", srv, "select-window", "-t", &t.pane]),
                step(&["tmux", "-L", srv, "select-pane", "-t", &t.pane]),
            ];
            let mut steps = select.to_vec();
            match here {
                Here::Tmux { socket } if socket == srv => {
                    steps.push(step(&["tmux", "-L", srv, "switch-client", "-t", &t.pane]));
                    Ok(Plan { steps, takes_terminal: false, note: None })
                }
                Here::Tmux { socket } => {
                    let inner = format!("env -u TMUX tmux -L {} attach-session -t {}", word(srv), word(&t.pane));
                    steps.push(step(&["tmux", "new-window", "-n", &format!("mam:{}", t.name), &inner]));
                    Ok(Plan {
                        steps,
                        takes_terminal: false,
                        note: Some(format!(
                            "NOTE: attach: {} is on tmux server '{srv}', not yours ('{socket}'): it opens in a new window \
                             of yours as a nested client; press your prefix twice to reach the inner one (prefix prefix d \
                             detaches it)",
                            t.name
                        )),
                    })
                }
                _ => {
                    steps.push(step(&["tmux", "-L", srv, "attach-session", "-t", &t.pane]));
                    Ok(Plan { steps, takes_terminal: true, note: None })
                }
            }
        }
        "herdr" => {
            let with_session = |argv: &[&str]| Step {
                env: vec![("HERDR_SESSION".into(), t.server.clone())],
                argv: argv.iter().map(|s| s.to_string()).collect(),
            };
            match here {
                Here::Herdr => Ok(Plan {
                    steps: vec![with_session(&["herdr", "agent", "focus", &t.pane])],
                    takes_terminal: false,
                    note: None,
                }),
                _ => Ok(Plan {
                    steps: vec![with_session(&["herdr", "agent", "attach", &t.pane])],
                    takes_terminal: true,
                    note: Some("NOTE: attach: detach with ctrl+b q (herdr agent attach)".into()),
                }),
            }
        }
        "fake" => Err(NoPane(format!(
            "session {} runs on the fake pane backend (a test double): there is no pane to look at",
            t.name
        ))),
        other => Err(NoPane(format!("session {}: backend '{other}' has no way to attach", t.name))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmux() -> Target {
        Target { name: "w1".into(), backend: "tmux".into(), server: "mam".into(), pane: "%3".into() }
    }

    fn lines(p: &Plan) -> Vec<String> {
        p.steps.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn here_from_vars() {
        assert_eq!(
            Here::from_vars(Some("/tmp/tmux-1000/default,123,0"), None),
            Here::Tmux { socket: "default".into() }
        );
        assert_eq!(Here::from_vars(Some(""), Some("1")), Here::Herdr);
        assert_eq!(Here::from_vars(None, None), Here::Outside);
    }

    #[test]
    fn tmux_outside_attaches() {
        let p = plan(&tmux(), &Here::Outside).unwrap();
        assert_eq!(
            lines(&p),
            ["tmux -L mam select-window -t %3", "tmux -L mam select-pane -t %3", "tmux -L mam attach-session -t %3"]
        );
        assert!(p.takes_terminal);
    }

    #[test]
    fn tmux_inside_the_same_server_switches_client() {
        let p = plan(&tmux(), &Here::Tmux { socket: "mam".into() }).unwrap();
        assert_eq!(lines(&p)[2], "tmux -L mam switch-client -t %3");
        assert!(!p.takes_terminal && p.note.is_none());
    }

    #[test]
    fn tmux_inside_another_server_opens_a_nested_client_in_a_new_window() {
        let p = plan(&tmux(), &Here::Tmux { socket: "default".into() }).unwrap();
        assert_eq!(lines(&p)[2], "tmux new-window -n mam:w1 'env -u TMUX tmux -L mam attach-session -t %3'");
        assert!(p.note.as_deref().unwrap().contains("prefix twice"));
    }

    #[test]
    fn herdr_focuses_inside_and_attaches_outside() {
        let t =
            Target { name: "w1".into(), backend: "herdr".into(), server: "multi-agent-mux".into(), pane: "p_1".into() };
        assert_eq!(lines(&plan(&t, &Here::Herdr).unwrap()), ["HERDR_SESSION=multi-agent-mux herdr agent focus p_1"]);
        let p = plan(&t, &Here::Outside).unwrap();
        assert_eq!(lines(&p), ["HERDR_SESSION=multi-agent-mux herdr agent attach p_1"]);
        assert!(p.takes_terminal);
    }

    #[test]
    fn fake_has_no_pane() {
        let t = Target { backend: "fake".into(), ..tmux() };
        assert!(plan(&t, &Here::Outside).unwrap_err().0.contains("no pane to look at"));
    }
}
