//! The agent adapter table (ORCH 6.1, A45-A48, A58): everything mam knows about one coding-agent CLI,
//! in one row per kind — executable basenames, herdr kind, session-id variables, runtime markers
//! (the bootstrap denylist of ORCH 1.3), start and resume arguments, how the conversation id is chosen
//! or learnt, where its conversation artifacts live, its ready line and start-up dialogs — plus the
//! rules every caller shares: the canonical uuid (A45), recognising an agent process by its argv
//! (CORE 7.6, A18, A58) and `nearest_agent_ancestor()`.
//!
//! The facts come from the real CLIs as observed on the project machine (`../shared/agents/README.md`,
//! A58); docs/AGENTS.md explains each row. `artifacts` owns the on-disk layouts and their purge,
//! `inuse` the `conversation_in_use` check of 6.3 and `purge` the flow of 6.4.
//!
//! A foundation for pane, heartbeat, session and delegate: it imports only `sys`, `ctx` and `text`,
//! never prints and never reads the process environment (the caller's variables come from `Ctx`).

pub mod allow;
pub mod artifacts;
pub mod inuse;
pub mod purge;

use crate::sys;

/// How a kind's conversation id becomes known to mam (ORCH 2.2, 6.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConversationId {
    /// mam chooses it: the start arguments carry `<flag> <uuid>`.
    Chosen(&'static str),
    /// Read back after start from the CLI's rollout files (codex: the uuid in
    /// `~/.codex/sessions/YYYY/MM/DD/rollout-<stamp>-<uuid>.jsonl`), or from herdr's `agent_session`.
    CodexRollout,
    /// Read back from herdr's `agent_session`, else from opencode's log: the `ses_` id of the newest
    /// `message=created` line for the pane's cwd (`artifacts::opencode_log_id`; the ids also live in
    /// its sqlite database, which mam does not read).
    OpencodeLog,
    /// Only herdr's `agent_session` reference can tell it.
    BackendOnly,
    /// The CLI has no resumable conversation (grok).
    None,
}

/// Where a kind's conversation artifacts live, when the layout is pinned by tests (6.1: the others
/// report none, so `auto` never resolves to them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// ORCH 6.2 under `~/.gemini/antigravity-cli` (`artifacts::agy_paths`).
    Agy,
    /// `~/.claude/projects/<cwd with / as ->/<uuid>.jsonl` and the live `~/.claude/sessions/<pid>.json`.
    Claude,
    /// Not pinned: purge exits 5 `no artifact (purge not supported for <kind>)` (A47).
    Unsupported,
}

/// One start-up dialog: while `screen` is visible the agent waits for `keys` (backend-neutral key
/// names: `enter`, or one printable character; each backend spells them its own way).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dialog {
    pub screen: &'static str,
    pub keys: &'static [&'static str],
}

/// One row of the adapter table (6.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Adapter {
    /// The kind a session row records (`create <kind>`).
    pub kind: &'static str,
    /// The executable mam starts (looked up on PATH; create fails fast without it).
    pub executable: &'static str,
    /// Basenames that identify a running process of this kind: argv[0], or for a node CLI the
    /// script argument after the interpreter and its flags (A58).
    pub process_names: &'static [&'static str],
    /// `herdr agent start --kind` (None: herdr has no such kind, so the herdr backend refuses it).
    pub herdr_kind: Option<&'static str>,
    /// Session-id variables the CLI exports to its children, then the legacy aliases (6.1, A58).
    pub session_vars: &'static [&'static str],
    /// Other per-session runtime markers a bootstrapped server must not inherit (1.3).
    pub markers: &'static [&'static str],
    /// Start arguments added on every start (before the conversation flag).
    pub start_args: &'static [&'static str],
    pub conversation: ConversationId,
    /// Resume arguments; the conversation id follows the last one (codex: `resume <id>`).
    pub resume_args: &'static [&'static str],
    pub layout: Layout,
    /// The CLI's own input line, in each form it takes: on a screen showing one of them the agent is
    /// ready (README "ready"). Empty: not known (the status rules apply).
    pub ready_lines: &'static [&'static str],
    /// How long the input line must stay on screen to count (codex draws it for about 0.4 s before
    /// its init shows the login chooser over it).
    pub ready_hold_ms: u64,
    /// Start-up dialogs in the order they appear, each with the keys that pass it.
    pub dialogs: &'static [Dialog],
    /// Screen text the CLI shows while it acts on an answer (gemini restarts itself after its trust
    /// dialog, which stays on screen meanwhile): below a dialog's text, the dialog is not answered again.
    pub startup_busy: &'static [&'static str],
    /// The npm package that installs the CLI (`scripts/install_agents.sh` installs these), when it
    /// comes from npm; the "not found on PATH" refusal names it (issue 32).
    pub npm: Option<&'static str>,
    /// Screen text that means the agent is busy (a model call, also one stuck in its network retry),
    /// matched with its case: gemini's key box says "Esc to cancel" and its remains can stay on
    /// screen under an idle input line, while its working line says "(esc to cancel, 4s)".
    pub working_marks: &'static [&'static str],
    /// In its default mode the CLI runs each command in a sandbox with its own PID namespace (codex's
    /// workspace-write): a timer armed from inside sees no agent among its ancestors and ends with the
    /// command, so the watcher beats for the job from outside (issue 30, docs/AGENTS.md "codex").
    pub commands_in_own_pid_namespace: bool,
}

/// Screen text of a CLI's approval dialog for one action of the agent (claude: "This command
/// requires approval", "Do you want to create …?" for its Write tool; codex: "Would you like to run the
/// following command?"). Such a dialog waits for the user: a "needs you" state (issue 30).
pub const APPROVAL_MARKS: &[&str] = &[
    "This command requires approval",
    "Do you want to proceed?",
    "Do you want to create",
    "Do you want to make this edit",
    "Would you like to run the following command?",
    "Would you like to make the following edits?",
];

/// When `screen` shows an approval dialog: what it asks about, as the dialog names it (claude's line
/// under "Bash command", else the mark itself), on one line.
pub fn approval_on(screen: &str) -> Option<String> {
    let (at, mark) = APPROVAL_MARKS.iter().filter_map(|m| screen.rfind(m).map(|at| (at, *m))).min()?;
    // claude names the action above its question: a "Bash command" / "Create file" head, then the line.
    let above: Vec<&str> = screen[..at].lines().collect();
    let claude =
        above.iter().rposition(|l| matches!(l.trim(), "Bash command" | "Create file" | "Edit file")).and_then(|i| {
            let named = above[i + 1..].iter().map(|l| l.trim()).find(|l| !l.is_empty())?;
            Some(format!("{}: {named}", above[i].trim()))
        });
    // codex below it: `$ <command>`.
    let codex =
        || screen[at..].lines().map(str::trim).find_map(|l| l.strip_prefix("$ ").map(|c| format!("command: {c}")));
    Some(crate::text::one_line(&claude.or_else(codex).unwrap_or_else(|| mark.to_string())))
}

#[cfg(test)]
mod approval_tests {
    #[test]
    fn the_waiting_action_is_named() {
        let claude = "● Bash(touch x)\n ⎿ Waiting…\n───\n Bash command\n\n   touch x\n   Run it\n This command requires approval\n Do you want to proceed?\n ❯ 1. Yes\n";
        assert_eq!(super::approval_on(claude).as_deref(), Some("Bash command: touch x"));
        let codex = "Would you like to run the following command?\n\n  $ touch x\n\n› 1. Yes, proceed\n";
        assert_eq!(super::approval_on(codex).as_deref(), Some("command: touch x"));
        assert_eq!(super::approval_on("❯ \n? for shortcuts"), None);
    }
}

/// The adapter table. The order is the order `create` lists kinds in and `auto` tries layouts in.
pub const ADAPTERS: &[Adapter] = &[
    Adapter {
        kind: "claude",
        executable: "claude",
        process_names: &["claude"],
        herdr_kind: Some("claude"),
        session_vars: &["CLAUDE_CODE_SESSION_ID"],
        markers: &[
            "CLAUDECODE",
            "CLAUDE_CODE_CHILD_SESSION",
            "CLAUDE_CODE_ENTRYPOINT",
            "CLAUDE_CODE_EXECPATH",
            "CLAUDE_CODE_SSE_PORT",
            "CLAUDE_CODE_PARENT_PID",
            "CLAUDE_CODE_IPC_SOCKET",
            "CLAUDE_CODE_BRIDGE_PORT",
        ],
        start_args: &[],
        conversation: ConversationId::Chosen("--session-id"),
        resume_args: &["--resume"],
        layout: Layout::Claude,
        // The footer under the input line: `? for shortcuts` in the default mode; a mode the user
        // chose replaces it (`⏵⏵ accept edits on`, `⏵⏵ bypass permissions on`, `⏸ plan mode on`).
        ready_lines: &["? for shortcuts", "accept edits on", "bypass permissions on", "plan mode on"],
        ready_hold_ms: 0,
        startup_busy: &[],
        // The bypass warning shows only when claude starts in bypass mode, which only the user's own
        // arguments or settings ask for (mam never adds a mode): "1. No, exit / 2. Yes, I accept".
        dialogs: &[
            Dialog { screen: "Yes, I trust this folder", keys: &["enter"] },
            Dialog { screen: "Detected a custom API key", keys: &["1"] },
            Dialog { screen: "running in Bypass Permissions mode", keys: &["2"] },
        ],
        npm: Some("@anthropic-ai/claude-code"),
        working_marks: &["esc to interrupt", "Retrying in"],
        commands_in_own_pid_namespace: false,
    },
    Adapter {
        kind: "codex",
        executable: "codex",
        process_names: &["codex"],
        herdr_kind: Some("codex"),
        session_vars: &["CODEX_THREAD_ID", "CODEX_SESSION_ID"],
        markers: &["CODEX_MANAGED_BY_NPM", "CODEX_VERSION"],
        // The detached app-server daemon would outlive the pane (README "codex: Process").
        start_args: &["--no-daemon"],
        conversation: ConversationId::CodexRollout,
        resume_args: &["resume"],
        layout: Layout::Unsupported,
        // The input line with its full footer: the screen codex flashes before its init shows the
        // login chooser has "› Ask Codex to do anything" and "? for shortcuts" but not "← for agents"
        // (on a loaded machine the flash outlasted the 1.5 s hold).
        ready_lines: &["← for agents"],
        ready_hold_ms: 1500,
        startup_busy: &[],
        dialogs: &[
            Dialog { screen: "Sign in another way", keys: &["3"] },
            Dialog { screen: "Use an OpenAI API key", keys: &["enter"] },
            Dialog { screen: "Detected OPENAI_API_KEY", keys: &["enter"] },
            Dialog { screen: "Trust and continue", keys: &["enter"] },
        ],
        npm: Some("@openai/codex"),
        working_marks: &["esc to interrupt", "Reconnecting..."],
        commands_in_own_pid_namespace: true,
    },
    Adapter {
        kind: "gemini",
        executable: "gemini",
        process_names: &["gemini"],
        herdr_kind: Some("gemini"),
        session_vars: &[],
        markers: &["GEMINI_CLI"],
        start_args: &[],
        conversation: ConversationId::Chosen("--session-id"),
        resume_args: &["--resume"],
        layout: Layout::Unsupported,
        ready_lines: &["Type your message or @path/to/file"],
        ready_hold_ms: 0,
        startup_busy: &["is restarting to apply the trust changes"],
        dialogs: &[
            Dialog { screen: "Do you trust the files in this folder?", keys: &["enter"] },
            Dialog { screen: "Use Gemini API Key", keys: &["enter"] },
            Dialog { screen: "Enter Gemini API Key", keys: &["enter"] },
        ],
        npm: Some("@google/gemini-cli"),
        working_marks: &["esc to cancel"],
        commands_in_own_pid_namespace: false,
    },
    Adapter {
        kind: "qwen",
        executable: "qwen",
        process_names: &["qwen"],
        herdr_kind: None,
        session_vars: &[],
        markers: &["QWEN_CODE"],
        start_args: &[],
        conversation: ConversationId::Chosen("--session-id"),
        resume_args: &["--resume"],
        layout: Layout::Unsupported,
        ready_lines: &["Type your message or @path/to/file"],
        ready_hold_ms: 0,
        startup_busy: &[],
        dialogs: &[],
        npm: Some("@qwen-code/qwen-code"),
        working_marks: &["esc to cancel"],
        commands_in_own_pid_namespace: false,
    },
    Adapter {
        kind: "grok",
        executable: "grok",
        process_names: &["grok"],
        herdr_kind: Some("grok"),
        session_vars: &["GROK_SESSION_ID"],
        markers: &[],
        start_args: &[],
        conversation: ConversationId::None,
        resume_args: &[],
        layout: Layout::Unsupported,
        ready_lines: &["Ask me anything..."],
        ready_hold_ms: 0,
        startup_busy: &[],
        dialogs: &[],
        npm: Some("@vibe-kit/grok-cli"),
        working_marks: &[],
        commands_in_own_pid_namespace: false,
    },
    Adapter {
        kind: "opencode",
        executable: "opencode",
        process_names: &["opencode"],
        herdr_kind: Some("opencode"),
        session_vars: &["OPENCODE_SESSION_ID"],
        markers: &["OPENCODE", "OPENCODE_PID"],
        start_args: &[],
        conversation: ConversationId::OpencodeLog,
        resume_args: &["--session"],
        layout: Layout::Unsupported,
        // Its footer: "Ask anything…" is only the placeholder of a new session's input (a resumed
        // one shows none); the footer's "ctrl+p commands" ("agents  commands" in a pane about 50
        // columns wide, herdr's headless one, with as many blanks as the cwd beside it leaves:
        // ready lines match any run of blanks) gives way to "esc interrupt" while it works.
        ready_lines: &["ctrl+p commands", "agents commands"],
        ready_hold_ms: 0,
        startup_busy: &[],
        dialogs: &[],
        // "[retrying in 2s attempt #2]", or "[retrying attempt #2]" in a narrow pane.
        npm: Some("opencode-ai"),
        working_marks: &["esc interrupt", "[retrying"],
        commands_in_own_pid_namespace: false,
    },
    Adapter {
        kind: "agy",
        executable: "agy",
        process_names: &["agy"],
        herdr_kind: Some("agy"),
        session_vars: &["ANTIGRAVITY_CONVERSATION_ID"],
        markers: &[],
        start_args: &[],
        conversation: ConversationId::BackendOnly,
        resume_args: &[],
        layout: Layout::Agy,
        ready_lines: &[],
        ready_hold_ms: 0,
        startup_busy: &[],
        dialogs: &[],
        npm: None,
        working_marks: &[],
        commands_in_own_pid_namespace: false,
    },
    Adapter {
        kind: "hermes",
        executable: "hermes",
        process_names: &["hermes"],
        herdr_kind: Some("hermes"),
        session_vars: &["HERMES_SESSION_ID"],
        markers: &[],
        start_args: &[],
        conversation: ConversationId::BackendOnly,
        resume_args: &[],
        layout: Layout::Unsupported,
        ready_lines: &[],
        ready_hold_ms: 0,
        startup_busy: &[],
        dialogs: &[],
        npm: None,
        working_marks: &[],
        commands_in_own_pid_namespace: false,
    },
    // The pretend agent (issue 32, docs/DESIGN.md "The pretend agent"): mam itself as
    // `mam pretend-agent`, for trying mam without an agent CLI or a network. It re-executes itself
    // under the name `pretend`, the name its process is recognised by.
    Adapter {
        kind: PRETEND,
        executable: BUILTIN_EXECUTABLE,
        process_names: &[PRETEND],
        herdr_kind: None,
        session_vars: &[],
        markers: &[],
        start_args: &[],
        conversation: ConversationId::None,
        resume_args: &[],
        layout: Layout::Unsupported,
        ready_lines: &[PRETEND_READY],
        ready_hold_ms: 0,
        startup_busy: &[],
        dialogs: &[],
        npm: None,
        working_marks: &[PRETEND_WORKING],
        commands_in_own_pid_namespace: false,
    },
];

/// The kind of the pretend agent.
pub const PRETEND: &str = "pretend";
/// The executable of a kind mam runs itself (the pretend agent): the running mam binary, with
/// `PRETEND_SUBCOMMAND`.
pub const BUILTIN_EXECUTABLE: &str = "mam";
/// The subcommand the pretend agent runs as.
pub const PRETEND_SUBCOMMAND: &str = "pretend-agent";
/// The pretend agent's input line.
pub const PRETEND_READY: &str = "pretend agent: ready for a prompt";
/// The line the pretend agent shows instead of its input line while it works on a prompt.
pub const PRETEND_WORKING: &str = "pretend agent: working on a prompt";

/// Interpreters whose script argument names the CLI (CORE 7.6).
const INTERPRETERS: &[&str] = &["node", "bun", "deno", "python", "python3"];

/// The adapter of `kind`.
pub fn adapter(kind: &str) -> Option<&'static Adapter> {
    ADAPTERS.iter().find(|a| a.kind == kind)
}

/// The adapter a backend was asked to start under `kind`: a kind of the table or its herdr kind.
pub fn adapter_of_started(kind: &str) -> Option<&'static Adapter> {
    adapter(kind).or_else(|| ADAPTERS.iter().find(|a| a.herdr_kind == Some(kind)))
}

/// Every kind, in table order.
pub fn kinds() -> Vec<&'static str> {
    ADAPTERS.iter().map(|a| a.kind).collect()
}

/// Every session-id variable of every kind (6.3 rule 1, A42), in table order.
pub fn session_id_vars() -> Vec<&'static str> {
    ADAPTERS.iter().flat_map(|a| a.session_vars.iter().copied()).collect()
}

/// True when `name` is a per-session runtime marker (a session-id variable or another marker) a
/// bootstrapped server must not inherit (1.3). Exact names, no prefix match.
pub fn is_runtime_marker(name: &str) -> bool {
    ADAPTERS.iter().any(|a| a.session_vars.contains(&name) || a.markers.contains(&name))
}

impl Adapter {
    /// The arguments `create` appends to the user's: the fixed start arguments, then the chosen
    /// conversation id when this kind lets mam choose it.
    pub fn start_with(&self, conversation: Option<&str>) -> Vec<String> {
        let mut v: Vec<String> = self.start_args.iter().map(|s| s.to_string()).collect();
        if let (ConversationId::Chosen(flag), Some(c)) = (self.conversation, conversation) {
            v.push(flag.to_string());
            v.push(c.to_string());
        }
        v
    }

    /// The arguments `resume` appends to the user's for a known conversation, in the CLI's own form
    /// (claude `--resume <id>`, codex `resume <id>`, gemini and qwen `--resume <id>`, opencode
    /// `--session <id>`). Empty when the kind cannot resume one.
    pub fn resume_with(&self, conversation: &str) -> Vec<String> {
        if self.resume_args.is_empty() {
            return Vec::new();
        }
        let mut v: Vec<String> = self.start_args.iter().map(|s| s.to_string()).collect();
        v.extend(self.resume_args.iter().map(|s| s.to_string()));
        v.push(conversation.to_string());
        v
    }

    /// True when mam runs this kind itself (the pretend agent): no executable to look up on PATH.
    pub fn is_builtin(&self) -> bool {
        self.executable == BUILTIN_EXECUTABLE
    }

    /// What to do when the executable is not on PATH: install it, or try the pretend agent.
    pub fn install_hint(&self) -> String {
        let how = match self.npm {
            Some(pkg) => format!(
                "install it with `npm install -g {pkg}` (or run scripts/install_agents.sh from the mam checkout, \
                 which installs the npm CLIs into the directory it prints, and put its node_modules/.bin on PATH)"
            ),
            None => format!("install {} the way its vendor says (docs/AGENTS.md)", self.executable),
        };
        format!("{how}; to try mam without an agent CLI: `mam create {PRETEND}`")
    }

    /// True when mam picks the conversation id at start.
    pub fn chooses_id(&self) -> bool {
        matches!(self.conversation, ConversationId::Chosen(_))
    }

    /// The dialog `screen` shows, if any (the last one listed that matches wins: later dialogs quote
    /// nothing of earlier ones). A dialog's text above the CLI's input line is what is left of a dialog
    /// already passed, not one that waits: while a dialog waits, no CLI draws its input line below it
    /// (gemini redraws its UI under the remains of its auth box after the key box closes).
    pub fn dialog_on(&self, screen: &str) -> Option<&'static Dialog> {
        let input_at = self.input_line_at(screen);
        self.dialogs.iter().rev().find(|d| screen.rfind(d.screen).is_some_and(|at| input_at.is_none_or(|i| at > i)))
    }

    /// True when `screen` shows, below dialog `d`'s text, that the CLI is still acting on an answer.
    pub fn busy_after(&self, screen: &str, d: &Dialog) -> bool {
        let at = screen.rfind(d.screen).unwrap_or(0);
        self.startup_busy.iter().any(|b| screen.rfind(b).is_some_and(|b| b > at))
    }

    /// Where the last of the CLI's input lines starts in `screen`, if it shows one.
    pub fn input_line_at(&self, screen: &str) -> Option<usize> {
        self.ready_lines.iter().filter_map(|l| rfind_blanks(screen, l)).max()
    }

    /// True when `screen` shows the CLI's own input line and no dialog.
    pub fn ready_on(&self, screen: &str) -> bool {
        self.input_line_at(screen).is_some() && self.dialog_on(screen).is_none()
    }

    /// True when the table knows the CLI's input line (start-up then waits for it, A58).
    pub fn has_ready_line(&self) -> bool {
        !self.ready_lines.is_empty()
    }

    /// The input line for a message: its forms joined with ` or `.
    pub fn ready_text(&self) -> String {
        self.ready_lines.iter().map(|l| format!("'{l}'")).collect::<Vec<_>>().join(" or ")
    }

    /// The agent state a screen shows (for backends that only have the screen, tmux): `blocked`
    /// while a dialog waits, `working` while a working mark shows (with its case), `idle` at the input
    /// line, else `None` (not known from the screen).
    pub fn state_on(&self, screen: &str) -> Option<&'static str> {
        if self.dialog_on(screen).is_some() {
            return Some("blocked");
        }
        if self.working_marks.iter().any(|m| screen.contains(m)) {
            return Some("working");
        }
        if self.ready_on(screen) {
            return Some("idle");
        }
        None
    }
}

/// Where `needle` last starts in `screen`, a blank of `needle` matching any run of one or more blanks
/// (a footer's columns are padded to the pane's width, and what sits beside them varies).
fn rfind_blanks(screen: &str, needle: &str) -> Option<usize> {
    let mut words = needle.split(' ').filter(|w| !w.is_empty());
    let first = words.next()?;
    let rest: Vec<&str> = words.collect();
    screen.rmatch_indices(first).map(|(at, _)| at).find(|&at| {
        let mut tail = &screen[at + first.len()..];
        rest.iter().all(|w| {
            let gap = tail.len() - tail.trim_start_matches(' ').len();
            tail = &tail[gap..];
            match tail.strip_prefix(w) {
                Some(t) if gap > 0 => {
                    tail = t;
                    true
                }
                _ => false,
            }
        })
    })
}

// ---------------------------------------------------------------------------------------------
// Canonical uuids (A45)

/// A canonical 8-4-4-4-12 hex uuid, returned lowercase; anything else (a `/`, `..`, a glob, a
/// newline, braces, another length) is `None`. Paths are built only from the returned value.
pub fn canonical_uuid(s: &str) -> Option<String> {
    let b = s.as_bytes();
    if b.len() != 36 {
        return None;
    }
    for (i, c) in b.iter().enumerate() {
        let dash = matches!(i, 8 | 13 | 18 | 23);
        if dash != (*c == b'-') || (!dash && !c.is_ascii_hexdigit()) {
            return None;
        }
    }
    Some(s.to_ascii_lowercase())
}

/// A fresh random (version 4) uuid, for the conversation id `create` chooses.
pub fn new_uuid() -> std::io::Result<String> {
    let mut b = [0u8; 16];
    sys::random_bytes(&mut b)?;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = sys::hex(&b);
    Ok(format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..]))
}

// ---------------------------------------------------------------------------------------------
// Recognising an agent process (CORE 7.6, A18, A58)

fn basename(arg: &[u8]) -> &[u8] {
    arg.rsplit(|&b| b == b'/').next().unwrap_or(arg)
}

/// The adapter whose process `args` is: argv[0]'s basename is a process name, or argv[0] is an
/// interpreter and its script argument — the first argument that is not a flag, so node flags such
/// as gemini's `--max-old-space-size=N` may come first (A58) — has such a basename.
pub fn agent_of_argv(args: &[Vec<u8>]) -> Option<&'static Adapter> {
    let named = |a: &[u8]| ADAPTERS.iter().find(|ad| ad.process_names.iter().any(|n| n.as_bytes() == basename(a)));
    let (first, rest) = args.split_first()?;
    if let Some(a) = named(first) {
        return Some(a);
    }
    if !INTERPRETERS.iter().any(|i| i.as_bytes() == basename(first)) {
        return None;
    }
    let script = rest.iter().find(|a| !a.starts_with(b"-"))?;
    named(script)
}

/// True when `args` is an agent CLI's argv (CORE 7.6).
pub fn argv_is_agent(args: &[Vec<u8>]) -> bool {
    agent_of_argv(args).is_some()
}

/// `nearest_agent_ancestor()` (A18): the nearest ancestor of `pid` (exclusive) that is an agent CLI,
/// with its adapter. Serves the heartbeat default, purge's in-use check and orc-onboard.
pub fn nearest_agent_ancestor(pid: i32) -> Option<(i32, &'static Adapter)> {
    let mut cur = sys::proc_ppid(pid).ok()?;
    for _ in 0..64 {
        if cur <= 1 {
            return None;
        }
        if let Some(a) = sys::proc_cmdline(cur).ok().and_then(|args| agent_of_argv(&args)) {
            return Some((cur, a));
        }
        cur = sys::proc_ppid(cur).ok()?;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &[&str]) -> Vec<Vec<u8>> {
        s.iter().map(|a| a.as_bytes().to_vec()).collect()
    }

    #[test]
    fn ready_lines_match_any_run_of_blanks() {
        let oc = adapter("opencode").unwrap();
        // herdr's narrow pane, the footer's columns beside a wrapped cwd (seen on a resume).
        let screen = "┃  Build · Claude Sonnet 4.6\n/tmp/mam-ittab      ctrl+p\n12435/ws-agents   commands\n0/ws";
        assert!(oc.ready_on(screen));
        assert!(oc.ready_on("x\nagents  commands\n"));
        assert!(oc.ready_on("tab  ctrl+p commands"));
        assert!(!oc.ready_on("agentscommands"), "a blank needs at least one blank");
        assert!(!oc.ready_on("agents\ncommands"), "not across lines");
        assert_eq!(rfind_blanks("a b xa  b", "a b"), Some(5));
        assert_eq!(rfind_blanks("ab", "a b"), None);
        assert_eq!(rfind_blanks("", "a"), None);
    }

    #[test]
    fn uuids_are_canonical_or_refused() {
        let u = "0123ABCD-89ab-4def-8123-456789abcdef";
        assert_eq!(canonical_uuid(u).unwrap(), u.to_ascii_lowercase());
        for bad in [
            "",
            "0123abcd-89ab-4def-8123-456789abcde",
            "0123abcd-89ab-4def-8123-456789abcdeff",
            "0123abcd/89ab-4def-8123-456789abcdef",
            "../3abcd-89ab-4def-8123-456789abcdef",
            "0123abcd-89ab-4def-8123-456789abcde*",
            "0123abcd-89ab-4def-8123-456789abcde\n",
            "{123abcd-89ab-4def-8123-456789abcde}",
            "0123abcd889ab-4def-8123-456789abcdef",
            "0123abcg-89ab-4def-8123-456789abcdef",
        ] {
            assert_eq!(canonical_uuid(bad), None, "{bad:?}");
        }
        let n = new_uuid().unwrap();
        assert_eq!(canonical_uuid(&n).as_deref(), Some(n.as_str()));
        assert_eq!(&n[14..15], "4");
    }

    #[test]
    fn agent_argv_forms() {
        let kind = |s: &[&str]| agent_of_argv(&argv(s)).map(|a| a.kind);
        assert_eq!(kind(&["claude", "--resume"]), Some("claude"));
        assert_eq!(kind(&["/usr/local/bin/codex"]), Some("codex"));
        assert_eq!(kind(&["node", "/opt/lib/node_modules/.bin/codex", "x"]), Some("codex"));
        // gemini relaunches itself with node flags before the script (A58).
        assert_eq!(kind(&["/usr/bin/node", "--max-old-space-size=12052", "/x/.bin/gemini"]), Some("gemini"));
        assert_eq!(kind(&["/usr/bin/node", "/x/.bin/qwen"]), Some("qwen"));
        assert_eq!(kind(&["/usr/bin/python3", "/home/u/bin/hermes"]), Some("hermes"));
        assert_eq!(kind(&["node", "server.js"]), None);
        assert_eq!(kind(&["bash", "claude"]), None);
        assert_eq!(kind(&["claudette"]), None);
        assert_eq!(kind(&[]), None);
    }

    #[test]
    fn start_and_resume_arguments_in_each_clis_form() {
        let a = |k| adapter(k).unwrap();
        let u = "0123abcd-89ab-4def-8123-456789abcdef";
        assert_eq!(a("claude").start_with(Some(u)), ["--session-id", u]);
        assert_eq!(a("claude").resume_with(u), ["--resume", u]);
        assert_eq!(a("codex").start_with(Some(u)), ["--no-daemon"]);
        assert_eq!(a("codex").resume_with(u), ["--no-daemon", "resume", u]);
        assert_eq!(a("gemini").resume_with(u), ["--resume", u]);
        assert_eq!(a("qwen").start_with(Some(u)), ["--session-id", u]);
        assert_eq!(a("opencode").resume_with("ses_1"), ["--session", "ses_1"]);
        assert!(a("grok").resume_with(u).is_empty());
        assert!(adapter("nope").is_none());
    }

    #[test]
    fn session_vars_and_markers() {
        let vars = session_id_vars();
        for v in [
            "CLAUDE_CODE_SESSION_ID",
            "CODEX_THREAD_ID",
            "CODEX_SESSION_ID",
            "ANTIGRAVITY_CONVERSATION_ID",
            "HERMES_SESSION_ID",
            "GROK_SESSION_ID",
            "OPENCODE_SESSION_ID",
        ] {
            assert!(vars.contains(&v), "{v}");
            assert!(is_runtime_marker(v));
        }
        assert!(is_runtime_marker("CLAUDECODE"));
        assert!(!is_runtime_marker("CLAUDE_PROJECT_DIR"));
        assert!(!is_runtime_marker("CLAUDECODE_X"));
    }

    #[test]
    fn screen_states() {
        let c = adapter("claude").unwrap();
        assert_eq!(c.state_on("Accessing workspace\n❯ 1. Yes, I trust this folder"), Some("blocked"));
        assert_eq!(c.state_on("──\n❯ \n──\n? for shortcuts"), Some("idle"));
        assert_eq!(c.state_on("✻ Unable to connect · Retrying in 4s · esc to interrupt"), Some("working"));
        assert_eq!(c.state_on("garbage"), None);
        assert_eq!(c.dialog_on("Detected a custom API key … 1. Yes ❯ 2. No").unwrap().keys, ["1"]);
        // The remains of a dialog passed, above the input line drawn again below them, are no dialog.
        let g = adapter("gemini").unwrap();
        let left =
            "│   ● 2. Use Gemini API Key   │\n╰──────╯\n ? for shortcuts\n >   Type your message or @path/to/file\n";
        assert_eq!(g.dialog_on(left), None);
        assert_eq!(g.state_on(left), Some("idle"));
        let waiting = " >   Type your message or @path/to/file\n╭──╮\n│ Enter Gemini API Key │\n";
        assert_eq!(g.dialog_on(waiting).map(|d| d.screen), Some("Enter Gemini API Key"));
    }
}
