//! The fake agent (ORCH 1.8): follows a key=value script (`MAM_FAKE_AGENT_SCRIPT`), shows a start-up
//! dialog when asked, reads the brief a prompt names with the parser `delegate::brief` owns, and runs
//! the brief's command lines exactly as written, through `bash -c`, from `/`, without the workspace
//! variables. Any script key may be given per prompt as `key@N` (docs/DESIGN.md lists the keys),
//! so one script drives a creator through its implement and correction jobs or a reviewer through
//! its rounds.
//!
//! A stand-in for an agent CLI: like one, it writes its screen itself. Nothing in mam's own flows
//! calls it. It is also the engine of the pretend agent (`mam pretend-agent`, issue 32): `pretend`
//! runs it with a script made from that command's flags and the `pretend` key, which decides per
//! brief whether it is a review, the onboarding job or a job that changes a file.
//!
//! Two modes. With `MAM_FAKE_PANE_DIR` (the fake backend) it reports its state in files of that
//! directory. Without it (a real terminal: tmux, herdr) it prints to stdout, reads prompts as lines on
//! stdin, and shows its state the way claude does, so that herdr's bundled claude manifest classifies
//! it from the screen: an OSC window title starting with a braille spinner and a space while working,
//! one starting with `✳ ` when idle, and a "Do you want to proceed?" bash-permission dialog while a
//! start-up dialog blocks it. It never prints a working title when the script says `report_working=0`,
//! and holds it at least `min_working_s` (default 1 s) otherwise, long enough for herdr to see it.

use std::ffi::OsString;
use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::ctx::{ChildRole, Ctx};
use crate::delegate::brief::{parse_commands, parse_prompt, parse_report_path, parse_review_identity};
use crate::sys;

/// `MAM_FAKE_AGENT_SCRIPT` as written: its `key=value` pairs in order, a `key@N` key kept with its
/// suffix. Parsed once; `resolve` turns it into the `Script` of one prompt.
#[derive(Debug, Default, Clone)]
struct RawScript {
    pairs: Vec<(String, String)>,
}

/// What the script says for one prompt (or, for `startup_blocked` and `on_stop_write`, which act
/// before the first prompt and after the last, for the whole run).
#[derive(Debug, Clone)]
struct Script {
    ack_delay_s: f64,
    never_start: bool,
    /// Runs the start command, works, then returns to its input line without `completed`.
    no_completed: bool,
    work_s: f64,
    report_text: String,
    verdict: Option<String>,
    identity: Identity,
    report_working: bool,
    crash_after_s: Option<f64>,
    touch_during_review: Option<PathBuf>,
    edit: Option<PathBuf>,
    spawn_subjob: Option<String>,
    exit_after: u64,
    startup_blocked: u64,
    /// Exit 1 at once, saying so, when started with this argument (a CLI refusing `--resume` of a
    /// conversation it does not have).
    refuse_arg: Option<String>,
    /// Terminal mode: the shortest time the working title stays up (default `MIN_WORKING_S`).
    min_working_s: Option<f64>,
    /// The pretend agent's rules (`pretend`): `verdict` and the IDENTITY echo only for a review,
    /// `edit` only for a job that is neither a review, a plan nor the onboarding.
    pretend: bool,
    #[cfg(feature = "test-hooks")]
    on_stop_write: Option<PathBuf>,
}

/// The `IDENTITY:` line a report gets (ORCH 4.5 d). Available in every build, unlike ORCH 8 item 8's
/// listing: the review demo drives pinned rounds with fake reviewers, and a pinned round without an
/// `IDENTITY` line is NOT PASS.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Identity {
    /// No IDENTITY line.
    #[default]
    Omit,
    /// The tree of the brief's `[review identity]` block (nothing without a block).
    Echo,
    /// A well-formed tree id that differs from the block's tree in every digit.
    Wrong,
}

impl Default for Script {
    fn default() -> Script {
        Script {
            ack_delay_s: 0.0,
            never_start: false,
            no_completed: false,
            work_s: 0.0,
            report_text: "fake agent report".into(),
            verdict: None,
            identity: Identity::Omit,
            report_working: true,
            crash_after_s: None,
            touch_during_review: None,
            edit: None,
            spawn_subjob: None,
            exit_after: 0,
            startup_blocked: 0,
            refuse_arg: None,
            min_working_s: None,
            pretend: false,
            #[cfg(feature = "test-hooks")]
            on_stop_write: None,
        }
    }
}

/// herdr samples a pane's title a few times a second: a working title shown for less than about
/// 0.3 s is often never seen (observed on 0.8.0: 0.2 s missed 1 prompt in 3, 0.5 s none in 3),
/// and `agent prompt --wait` then reports `agent_prompt_stalled`. One second leaves a margin on a busy
/// machine, as a real claude turn lasts longer than that anyway.
const MIN_WORKING_S: f64 = 1.0;

fn parse_script(text: &str) -> RawScript {
    let pairs = text
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    RawScript { pairs }
}

impl RawScript {
    /// The script of the `n`-th prompt (1-based): every plain `key` in order (the last one wins),
    /// then every `key@n` over it, so that a per-prompt value wins wherever it stands and an empty
    /// one (`verdict@2=`) clears the key for that prompt. `n = 0` gives the plain keys only.
    fn resolve(&self, n: u64) -> Script {
        let mut s = Script::default();
        for (k, v) in &self.pairs {
            if !k.contains('@') {
                s.set(k, v);
            }
        }
        for (k, v) in &self.pairs {
            let Some((base, at)) = k.split_once('@') else { continue };
            if n > 0 && at.trim().parse::<u64>() == Ok(n) {
                s.set(base.trim(), v);
            }
        }
        s
    }
}

impl Script {
    /// Applies one `key=value`; an unknown key is ignored, so are the test-hooks keys without the
    /// feature.
    fn set(&mut self, k: &str, v: &str) {
        let num = || v.parse::<f64>().unwrap_or(0.0);
        let yes = || matches!(v, "1" | "true" | "yes");
        let path = || Some(PathBuf::from(v)).filter(|p| !p.as_os_str().is_empty());
        match k {
            "ack_delay_s" => self.ack_delay_s = num(),
            "never_start" => self.never_start = yes(),
            "no_completed" => self.no_completed = yes(),
            "work_s" => self.work_s = num(),
            "report_text" => self.report_text = v.replace("\\n", "\n"),
            "verdict" => self.verdict = Some(v.to_string()).filter(|v| !v.is_empty()),
            "identity" => {
                self.identity = match v {
                    "echo" => Identity::Echo,
                    "wrong" => Identity::Wrong,
                    _ => Identity::Omit,
                }
            }
            "report_working" => self.report_working = yes(),
            "crash_after_s" => self.crash_after_s = Some(v).filter(|v| !v.is_empty()).map(|_| num()),
            "touch_during_review" => self.touch_during_review = path(),
            "edit" => self.edit = path(),
            "spawn_subjob" => self.spawn_subjob = Some(v.to_string()).filter(|v| !v.is_empty()),
            "exit_after" => self.exit_after = v.parse().unwrap_or(0),
            "startup_blocked" => self.startup_blocked = v.parse().unwrap_or(0),
            "refuse_arg" => self.refuse_arg = Some(v.to_string()).filter(|v| !v.is_empty()),
            "min_working_s" => self.min_working_s = Some(v).filter(|v| !v.is_empty()).map(|_| num()),
            "pretend" => self.pretend = yes(),
            #[cfg(feature = "test-hooks")]
            "on_stop_write" => self.on_stop_write = path(),
            _ => {}
        }
    }
}

/// The report the script writes for a brief: `report_text`, then the IDENTITY line (`identity`),
/// then the VERDICT line (`verdict`), each on its own line, ending in a newline.
fn compose_report(s: &Script, brief_text: &str) -> String {
    let mut body = s.report_text.clone();
    let identity = match (s.identity, parse_review_identity(brief_text)) {
        (Identity::Echo, Some(tree)) => Some(tree),
        (Identity::Wrong, tree) => Some(wrong_tree(tree.as_deref())),
        _ => None,
    };
    if let Some(id) = identity {
        body.push_str(&format!("\nIDENTITY: {id}"));
    }
    if let Some(v) = &s.verdict {
        body.push_str(&format!("\nVERDICT: {v}"));
    }
    body.push('\n');
    body
}

/// A tree id as long as `tree` (40 digits without one) that differs from it in every digit.
fn wrong_tree(tree: Option<&str>) -> String {
    match tree {
        Some(t) => t.chars().map(|c| if c == '0' { '1' } else { '0' }).collect(),
        None => "0".repeat(40),
    }
}

/// The window title herdr's claude manifest reads as `idle` (`osc_title_idle`: `^\x{2733} `).
pub const TITLE_IDLE: &str = "\x1b]0;\u{2733} fake agent\x07";
/// The window title herdr's claude manifest reads as `working` (`osc_title_working`:
/// `^[\x{2800}-\x{28FF}] `); it outranks every screen rule, so it is never shown during a dialog.
pub const TITLE_WORKING: &str = "\x1b]0;\u{280b} fake agent\x07";
/// A title neither rule matches, shown with the start-up dialog: the terminal keeps the title of
/// whatever ran before in the pane, and a stale idle title must not speak for the dialog.
pub const TITLE_NEUTRAL: &str = "\x1b]0;fake agent\x07";
/// Clears the screen and its scrollback, so a dismissed dialog leaves no text herdr could still match.
const CLEAR: &str = "\x1b[H\x1b[2J\x1b[3J";

/// The start-up dialog of terminal mode, shaped like claude's bash permission prompt so that herdr's
/// `bash_permission_prompt` rule ("do you want to proceed?", "bash command", a "1. Yes" line) and
/// `live_blocked_form`-style cues ("esc to cancel") classify it as `blocked`. No `❯` marker: that would
/// look like claude's idle prompt box to the `live_prompt_box` rule. Its "Yes" line quotes claude's
/// trust dialog, so that the adapter table's claude row answers it on a backend that reads the screen
/// (tmux, and herdr through A58) the way it answers the real one.
pub const STARTUP_DIALOG: &str = "\
────────────────────────────────────────────────────────────
 Bash command

   fake-agent --trust-this-folder
   Start-up dialog of the fake agent

 Do you want to proceed?
   1. Yes, I trust this folder
   2. No

 Esc to cancel · Tab to amend · ctrl+e to explain
";

struct Agent {
    pane_dir: Option<PathBuf>,
    env: Vec<(OsString, OsString)>,
}

impl Agent {
    /// Reports `idle`, `working`, `blocked` or `done`: a status file in pane-dir mode, the window
    /// title in terminal mode (`done` reads as idle there, as it does for claude).
    fn status(&self, s: &str) {
        match &self.pane_dir {
            Some(d) => {
                let _ = sys::atomic_write(&d.join("status"), s.as_bytes());
            }
            None => match s {
                "working" => print_raw(TITLE_WORKING),
                "idle" | "done" => print_raw(TITLE_IDLE),
                _ => {}
            },
        }
    }

    fn screen(&self, line: &str) {
        match &self.pane_dir {
            Some(d) => {
                let _ = sys::append_locked(&d.join("screen"), format!("{line}\n").as_bytes());
            }
            None => println!("{line}"),
        }
    }

    /// Runs one brief line exactly as written through `bash -c` from `/` without the workspace
    /// variables; returns its exit code.
    fn run_line(&self, line: &str, extra: &[(&str, &str)]) -> i32 {
        let mut c = Command::new("bash");
        c.arg("-c").arg(line).current_dir("/").env_clear().envs(self.env.iter().cloned());
        for k in ["WORKSPACE_ROOT", "AGENT_SESSIONS_YAML", "MAM_JOBS_DIR", "DELEGATE_JOB_LOGS_DIR"] {
            c.env_remove(k);
        }
        c.envs(extra.iter().copied()).stdin(Stdio::null());
        match sys::spawn(&mut c).and_then(|mut ch| ch.wait()) {
            Ok(st) => st.code().unwrap_or(-1),
            Err(e) => {
                eprintln!("fake agent: cannot run bash: {e}");
                -1
            }
        }
    }
}

/// The adapter of the CLI name this process was started under (argv[0]), if any.
fn own_adapter() -> Option<&'static crate::agents::Adapter> {
    let argv = sys::proc_cmdline(std::process::id() as i32).ok()?;
    crate::agents::agent_of_argv(&argv[..1.min(argv.len())])
}

/// Writes `s` to stdout and flushes it (a title carries no newline to flush the line buffer).
fn print_raw(s: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(s.as_bytes());
    let _ = out.flush();
}

fn pause(secs: f64) {
    if secs > 0.0 {
        sys::sleep(Duration::from_secs_f64(secs));
    }
}

/// The pretend agent's main (`mam pretend-agent`): the fake agent in terminal mode with a script of
/// `settings` (script keys) and the pretend rules; returns the exit code.
pub fn pretend(ctx: &Ctx, settings: &[(&str, String)]) -> Result<i32, String> {
    let mut pairs: Vec<(String, String)> = vec![("pretend".into(), "1".into())];
    pairs.extend(settings.iter().map(|(k, v)| (k.to_string(), v.clone())));
    println!("mam pretend-agent: a stand-in for a coding agent (see `mam pretend-agent --help`)");
    serve(ctx, &RawScript { pairs })
}

/// What the pretend agent makes of a brief: a review (a loop's review or plan review round), a job
/// that must change no file (a plan, the onboarding job), or a job to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PretendJob {
    Review,
    HandsOff,
    Work,
}

fn pretend_job(brief: &str) -> PretendJob {
    let round = |l: &str, head: &str| l.strip_prefix(head).is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()));
    if parse_review_identity(brief).is_some()
        || brief.lines().any(|l| round(l, "Review round ") || round(l, "Plan round "))
    {
        return PretendJob::Review;
    }
    if brief.contains("Do not change any file") || brief.lines().any(|l| l.starts_with("Onboarding of session ")) {
        return PretendJob::HandsOff;
    }
    PretendJob::Work
}

/// The script of one prompt under the pretend rules.
fn pretend_script(s: &Script, brief: &str) -> Script {
    let mut s = s.clone();
    match pretend_job(brief) {
        PretendJob::Review => {
            s.edit = None;
            s.identity = Identity::Echo;
            s.verdict = Some(s.verdict.unwrap_or_else(|| "PASS".into()));
        }
        PretendJob::HandsOff => {
            s.edit = None;
            s.verdict = None;
        }
        PretendJob::Work => s.verdict = None,
    }
    s
}

/// The fake agent's main: follow the script, answer prompts, run brief lines; returns the exit code.
pub fn run(ctx: &Ctx, args: &[String]) -> Result<i32, String> {
    let raw = ctx
        .path_var("MAM_FAKE_AGENT_SCRIPT")
        .and_then(|p| std::fs::read_to_string(p).ok())
        .map(|t| parse_script(&t))
        .unwrap_or_default();
    if let Some(refused) = raw.resolve(0).refuse_arg.filter(|r| args.contains(r)) {
        // Like a CLI, which needs a moment to start before it can refuse (a process gone within a
        // tmux poll is never seen to run at all).
        sys::sleep(Duration::from_millis(500));
        println!("No conversation found ({refused} refused by the fake agent)");
        return Ok(1);
    }
    #[cfg(feature = "test-hooks")]
    if let Some(p) = raw.resolve(0).on_stop_write {
        stop_hook::arm(p)?;
    }
    let rc = serve(ctx, &raw);
    #[cfg(feature = "test-hooks")]
    stop_hook::fire();
    rc
}

/// `on_stop_write=<path>` (ORCH 8 item 8, test-hooks only): `stopped` is appended to the path once, when
/// the agent returns from `serve` (stdin closed, pane directory gone, `exit_after`) or when SIGTERM,
/// SIGHUP or SIGINT arrives. A SIGKILL (`crash_after_s`) writes nothing.
#[cfg(feature = "test-hooks")]
mod stop_hook {
    use std::path::PathBuf;
    use std::sync::{Once, OnceLock};
    use std::time::Duration;

    use crate::sys;

    static PATH: OnceLock<PathBuf> = OnceLock::new();
    static WROTE: Once = Once::new();

    /// Records the path, turns the stop signals into recorded ones and starts the watcher. The
    /// watcher is detached on purpose: it lives as long as the process and is what ends it after a
    /// signal (terminal mode blocks on stdin, and a brief line may be running).
    pub fn arm(path: PathBuf) -> Result<(), String> {
        let _ = PATH.set(path);
        sys::install_signal_recorders(&[libc::SIGTERM, libc::SIGHUP, libc::SIGINT])
            .map_err(|e| format!("fake agent: cannot install signal handlers: {e}"))?;
        std::thread::spawn(|| loop {
            if let Some(sig) = sys::pending_signal() {
                fire();
                std::process::exit(128 + sig);
            }
            sys::sleep(Duration::from_millis(50));
        });
        Ok(())
    }

    /// Appends `stopped` once; a second caller waits for the first to finish writing.
    pub fn fire() {
        if let Some(p) = PATH.get() {
            WROTE.call_once(|| {
                let _ = sys::append_locked(p, b"stopped\n");
            });
        }
    }
}

fn serve(ctx: &Ctx, raw: &RawScript) -> Result<i32, String> {
    let script = raw.resolve(0);
    let agent = Agent { pane_dir: ctx.path_var("MAM_FAKE_PANE_DIR"), env: ctx.child_env_for(ChildRole::Agent) };
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    // Start-up dialog: blocked until enough `enter` keys arrived.
    if script.startup_blocked > 0 {
        match &agent.pane_dir {
            Some(d) => {
                agent.status("blocked");
                loop {
                    let n = std::fs::read_to_string(d.join("keys")).map(|t| t.lines().count() as u64).unwrap_or(0);
                    if n >= script.startup_blocked || !d.is_dir() {
                        break;
                    }
                    sys::sleep(Duration::from_millis(20));
                }
            }
            None => {
                // An Enter on a canonical-mode tty ends a line ("\r" becomes "\n"): one line per key.
                print_raw(TITLE_NEUTRAL);
                print_raw(STARTUP_DIALOG);
                for n in 1..=script.startup_blocked {
                    match lines.next() {
                        Some(Ok(_)) => {}
                        _ => return Ok(0),
                    }
                    // Shows that a key arrived while the dialog stays (a test waits on it).
                    if n < script.startup_blocked {
                        println!(" {n} of {} confirmations received", script.startup_blocked);
                    }
                }
                print_raw(CLEAR);
            }
        }
    }
    agent.status("idle");
    agent.screen("fake agent ready");
    // The input line of the CLI this fake stands in for (started as `claude`: claude's footer), so
    // that readiness is detected the way it is for the real CLI (A58).
    if agent.pane_dir.is_none() {
        if let Some(line) = own_adapter().and_then(|a| a.ready_lines.first()) {
            agent.screen(&format!("  {line}"));
        }
    }
    let mut handled = 0u64;
    match &agent.pane_dir {
        Some(d) => {
            let inbox = d.join("inbox");
            let mut offset = 0usize;
            loop {
                if !d.is_dir() {
                    return Ok(0);
                }
                let data = std::fs::read(&inbox).unwrap_or_default();
                if data.len() > offset {
                    let chunk = String::from_utf8_lossy(&data[offset..]).into_owned();
                    let Some(end) = chunk.rfind('\n') else {
                        sys::sleep(Duration::from_millis(20));
                        continue;
                    };
                    offset += end + 1;
                    for line in chunk[..end].lines() {
                        if handle_prompt(&agent, raw, line, &mut handled) {
                            return Ok(0);
                        }
                    }
                } else {
                    sys::sleep(Duration::from_millis(20));
                }
            }
        }
        None => {
            for line in lines {
                let Ok(line) = line else { break };
                if handle_prompt(&agent, raw, &line, &mut handled) {
                    return Ok(0);
                }
            }
            Ok(0)
        }
    }
}

/// Handles one prompt with the script resolved for it; true when the script says to exit now.
fn handle_prompt(agent: &Agent, raw: &RawScript, prompt: &str, handled: &mut u64) -> bool {
    let prompt = prompt.trim();
    if prompt.is_empty() {
        return false;
    }
    *handled += 1;
    let resolved = raw.resolve(*handled);
    let mut s = &resolved;
    let working_since = std::time::Instant::now();
    if s.report_working {
        agent.status("working");
    }
    // The pretend agent redraws its screen like a CLI does (issue 32): while it works its input
    // line is replaced by its working line, so the screen tells `working` from `idle`.
    let redraw = s.pretend && agent.pane_dir.is_none();
    if redraw {
        print_raw(CLEAR);
    }
    agent.screen(&format!("prompt {}: {}", handled, prompt));
    if redraw {
        agent.screen(&format!("  {}", crate::agents::PRETEND_WORKING));
    }
    if let Some(after) = s.crash_after_s {
        std::thread::spawn(move || {
            pause(after);
            let _ = sys::kill(std::process::id() as i32, libc::SIGKILL);
        });
    }
    pause(s.ack_delay_s);
    let (brief, job) = parse_prompt(prompt);
    let pretended;
    if let Some(brief) = brief {
        let text = std::fs::read_to_string(&brief).unwrap_or_default();
        if s.pretend {
            pretended = pretend_script(s, &text);
            s = &pretended;
        }
        let cmds = parse_commands(&text);
        let job = job.unwrap_or_default();
        if !s.never_start {
            if let Some(l) = cmds.get("start") {
                agent.run_line(l, &[]);
            }
            if let Some(p) = &s.edit {
                let who = if s.pretend { "the pretend agent" } else { "the fake agent" };
                let _ = sys::append_locked(p, format!("edited by {who} (prompt {handled})\n").as_bytes());
            }
            if let Some(p) = &s.touch_during_review {
                let _ = sys::append_locked(p, b"touched by the fake agent during review\n");
            }
            if let Some(sub) = &s.spawn_subjob {
                agent.run_line(sub, &[("MAM_PARENT_JOB_ID", job.as_str())]);
            }
            pause(s.work_s);
            if s.no_completed {
                // Back at the input line with the job open (issue 30: "waiting for you").
            } else if s.verdict.as_deref().is_some_and(|v| v.eq_ignore_ascii_case("error")) {
                if let Some(l) = cmds.get("error") {
                    agent.run_line(l, &[]);
                }
            } else {
                if let Some(rp) = parse_report_path(&text) {
                    let body = compose_report(s, &text);
                    if let Some(parent) = rp.parent() {
                        let _ = sys::create_dir_all(parent);
                    }
                    let _ = sys::write_file(&rp, body.as_bytes());
                }
                if let Some(l) = cmds.get("success") {
                    agent.run_line(l, &[]);
                }
            }
        }
    } else {
        pause(s.work_s);
    }
    if s.report_working && agent.pane_dir.is_none() {
        let min = s.min_working_s.unwrap_or(MIN_WORKING_S);
        pause(min - working_since.elapsed().as_secs_f64());
    }
    agent.status("done");
    if redraw {
        print_raw(CLEAR);
        agent.screen(&format!("prompt {}: {}", handled, prompt));
    }
    agent.screen(&format!("prompt {handled} done"));
    // Back at its input line, like the CLI it stands in for redraws it: the line must stay on the
    // visible screen after any number of prompts (mam types a prompt only there, issue 30 item 5).
    if agent.pane_dir.is_none() {
        if let Some(line) = own_adapter().and_then(|a| a.ready_lines.first()) {
            agent.screen(&format!("  {line}"));
        }
    }
    s.exit_after > 0 && *handled >= s.exit_after
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_defaults() {
        let s = parse_script("work_s=0.5\nverdict=PASS\nreport_working=0\n").resolve(1);
        assert!(!s.report_working);
        assert_eq!(s.verdict.as_deref(), Some("PASS"));
        assert!((s.work_s - 0.5).abs() < 1e-9);
        assert_eq!(s.min_working_s, None);
        assert_eq!(s.identity, Identity::Omit);
        assert_eq!(s.report_text, "fake agent report");
        assert_eq!(parse_script("min_working_s=0\n").resolve(1).min_working_s, Some(0.0));
        assert_eq!(RawScript::default().resolve(1).verdict, None);
    }

    #[test]
    fn a_per_prompt_key_wins_over_the_plain_key_wherever_it_stands() {
        let raw = parse_script("verdict@2=PASS\nverdict=NOT PASS\nwork_s@3=2\nedit@1=/w/src.rs\nidentity=echo\n");
        let v = |n: u64| raw.resolve(n).verdict;
        assert_eq!(v(1).as_deref(), Some("NOT PASS"));
        assert_eq!(v(2).as_deref(), Some("PASS"));
        assert_eq!(v(3).as_deref(), Some("NOT PASS"));
        assert!((raw.resolve(3).work_s - 2.0).abs() < 1e-9);
        assert_eq!(raw.resolve(2).work_s, 0.0);
        assert_eq!(raw.resolve(1).edit, Some(PathBuf::from("/w/src.rs")));
        assert_eq!(raw.resolve(2).edit, None);
        assert_eq!(raw.resolve(2).identity, Identity::Echo);
        // Before the first prompt only the plain keys count.
        assert_eq!(raw.resolve(0).verdict.as_deref(), Some("NOT PASS"));
        assert_eq!(parse_script("exit_after@0=1\n").resolve(0).exit_after, 0);
    }

    #[test]
    fn an_empty_value_clears_the_key() {
        let raw = parse_script(
            "verdict=PASS\nverdict@2=\nspawn_subjob=echo x\nspawn_subjob@1=\ncrash_after_s=1\ncrash_after_s@3=\n",
        );
        assert_eq!(raw.resolve(1).verdict.as_deref(), Some("PASS"));
        assert_eq!(raw.resolve(2).verdict, None);
        assert_eq!(raw.resolve(1).spawn_subjob, None);
        assert_eq!(raw.resolve(2).spawn_subjob.as_deref(), Some("echo x"));
        assert_eq!(raw.resolve(3).crash_after_s, None);
        assert_eq!(raw.resolve(2).crash_after_s, Some(1.0));
        assert_eq!(parse_script("verdict=PASS\nverdict=\n").resolve(1).verdict, None);
    }

    #[test]
    fn the_report_carries_identity_then_verdict() {
        let tree = "0123456789abcdef0123456789abcdef01234567";
        let brief = format!("# Job j1\n\n## Task\n\n[review identity]\nloop_id: l\ntree: {tree}\n\nreview it\n");
        let raw = parse_script(
            "report_text=found nothing\\nat all\nverdict=PASS\nidentity@1=echo\nidentity@2=wrong\nverdict@4=\n",
        );
        assert_eq!(
            compose_report(&raw.resolve(1), &brief),
            format!("found nothing\nat all\nIDENTITY: {tree}\nVERDICT: PASS\n")
        );
        let wrong = compose_report(&raw.resolve(2), &brief);
        let id = wrong.lines().find_map(|l| l.strip_prefix("IDENTITY: ")).unwrap();
        assert_eq!(id.len(), 40);
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
        assert!(id.bytes().zip(tree.bytes()).all(|(a, b)| a != b), "{id} differs from {tree} in every digit");
        assert!(wrong.ends_with("\nVERDICT: PASS\n"));
        assert_eq!(compose_report(&raw.resolve(3), &brief), "found nothing\nat all\nVERDICT: PASS\n");
        assert_eq!(compose_report(&raw.resolve(4), &brief), "found nothing\nat all\n");
        // Without a block, echo writes no IDENTITY line and wrong still writes one that is well formed.
        assert_eq!(compose_report(&raw.resolve(1), "## Task\n\nno block\n"), "found nothing\nat all\nVERDICT: PASS\n");
        assert_eq!(
            compose_report(&raw.resolve(2), "no block"),
            format!("found nothing\nat all\nIDENTITY: {}\nVERDICT: PASS\n", "0".repeat(40))
        );
        let sha256 = "0".repeat(64);
        assert_eq!(wrong_tree(Some(&sha256)), "1".repeat(64));
    }

    #[cfg(feature = "test-hooks")]
    #[test]
    fn on_stop_write_is_a_test_hook_key() {
        assert_eq!(
            parse_script("on_stop_write=/t/stopped\n").resolve(0).on_stop_write,
            Some(PathBuf::from("/t/stopped"))
        );
    }
}
