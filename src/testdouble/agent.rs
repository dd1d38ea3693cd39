//! The fake agent (ORCH 1.8): follows a key=value script (`MAM_FAKE_AGENT_SCRIPT`), shows a start-up
//! dialog when asked, reads the brief a prompt names with the parser `delegate::brief` owns, and runs
//! the brief's command lines exactly as written, through `bash -c`, from `/`, without the workspace
//! variables.
//!
//! A stand-in for an agent CLI: like one, it writes its screen itself. Nothing in mam's own flows
//! calls it.
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
use crate::delegate::brief::{parse_commands, parse_prompt, parse_report_path};
use crate::sys;

/// The parsed `MAM_FAKE_AGENT_SCRIPT`.
#[derive(Debug, Default, Clone)]
struct Script {
    ack_delay_s: f64,
    never_start: bool,
    work_s: f64,
    report_text: String,
    verdict: Option<String>,
    report_working: bool,
    crash_after_s: Option<f64>,
    touch_during_review: Option<PathBuf>,
    spawn_subjob: Option<String>,
    exit_after: u64,
    startup_blocked: u64,
    /// Terminal mode: the shortest time the working title stays up (default `MIN_WORKING_S`).
    min_working_s: Option<f64>,
}

/// herdr samples a pane's title a few times a second: a working title shown for less than about
/// 0.3 s is often never seen (observed on 0.8.0: 0.2 s missed 1 prompt in 3, 0.5 s none in 3),
/// and `agent prompt --wait` then reports `agent_prompt_stalled`. One second leaves a margin on a busy
/// machine, as a real claude turn lasts longer than that anyway.
const MIN_WORKING_S: f64 = 1.0;

fn parse_script(text: &str) -> Script {
    let mut s = Script { report_working: true, report_text: "fake agent report".into(), ..Script::default() };
    for line in text.lines() {
        let Some((k, v)) = line.split_once('=') else { continue };
        let (k, v) = (k.trim(), v.trim());
        let num = || v.parse::<f64>().unwrap_or(0.0);
        let yes = || matches!(v, "1" | "true" | "yes");
        match k {
            "ack_delay_s" => s.ack_delay_s = num(),
            "never_start" => s.never_start = yes(),
            "work_s" => s.work_s = num(),
            "report_text" => s.report_text = v.replace("\\n", "\n"),
            "verdict" => s.verdict = Some(v.to_string()).filter(|v| !v.is_empty()),
            "report_working" => s.report_working = yes(),
            "crash_after_s" => s.crash_after_s = Some(num()),
            "touch_during_review" => {
                s.touch_during_review = Some(PathBuf::from(v)).filter(|p| !p.as_os_str().is_empty())
            }
            "spawn_subjob" => s.spawn_subjob = Some(v.to_string()).filter(|v| !v.is_empty()),
            "exit_after" => s.exit_after = v.parse().unwrap_or(0),
            "startup_blocked" => s.startup_blocked = v.parse().unwrap_or(0),
            "min_working_s" => s.min_working_s = Some(num()),
            _ => {}
        }
    }
    s
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
/// look like claude's idle prompt box to the `live_prompt_box` rule.
pub const STARTUP_DIALOG: &str = "\
────────────────────────────────────────────────────────────
 Bash command

   fake-agent --trust-this-folder
   Start-up dialog of the fake agent

 Do you want to proceed?
   1. Yes
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

/// The fake agent's main: follow the script, answer prompts, run brief lines; returns the exit code.
pub fn run(ctx: &Ctx) -> Result<i32, String> {
    let script = ctx
        .path_var("MAM_FAKE_AGENT_SCRIPT")
        .and_then(|p| std::fs::read_to_string(p).ok())
        .map(|t| parse_script(&t))
        .unwrap_or_else(|| parse_script(""));
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
                        if handle_prompt(&agent, &script, line, &mut handled) {
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
                if handle_prompt(&agent, &script, &line, &mut handled) {
                    return Ok(0);
                }
            }
            Ok(0)
        }
    }
}

/// Handles one prompt; true when the script says to exit now.
fn handle_prompt(agent: &Agent, s: &Script, prompt: &str, handled: &mut u64) -> bool {
    let prompt = prompt.trim();
    if prompt.is_empty() {
        return false;
    }
    *handled += 1;
    let working_since = std::time::Instant::now();
    if s.report_working {
        agent.status("working");
    }
    agent.screen(&format!("prompt {}: {}", handled, prompt));
    if let Some(after) = s.crash_after_s {
        std::thread::spawn(move || {
            pause(after);
            let _ = sys::kill(std::process::id() as i32, libc::SIGKILL);
        });
    }
    pause(s.ack_delay_s);
    let (brief, job) = parse_prompt(prompt);
    if let Some(brief) = brief {
        let text = std::fs::read_to_string(&brief).unwrap_or_default();
        let cmds = parse_commands(&text);
        let job = job.unwrap_or_default();
        if !s.never_start {
            if let Some(l) = cmds.get("start") {
                agent.run_line(l, &[]);
            }
            if let Some(p) = &s.touch_during_review {
                let _ = sys::append_locked(p, b"touched by the fake agent during review\n");
            }
            if let Some(sub) = &s.spawn_subjob {
                agent.run_line(sub, &[("MAM_PARENT_JOB_ID", job.as_str())]);
            }
            pause(s.work_s);
            if s.verdict.as_deref().is_some_and(|v| v.eq_ignore_ascii_case("error")) {
                if let Some(l) = cmds.get("error") {
                    agent.run_line(l, &[]);
                }
            } else {
                if let Some(rp) = parse_report_path(&text) {
                    let mut body = s.report_text.clone();
                    if let Some(v) = &s.verdict {
                        body.push_str(&format!("\nVERDICT: {v}"));
                    }
                    body.push('\n');
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
    agent.screen(&format!("prompt {handled} done"));
    s.exit_after > 0 && *handled >= s.exit_after
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_defaults() {
        let s = parse_script("work_s=0.5\nverdict=PASS\nreport_working=0\n");
        assert!(!s.report_working);
        assert_eq!(s.verdict.as_deref(), Some("PASS"));
        assert!((s.work_s - 0.5).abs() < 1e-9);
        assert_eq!(s.min_working_s, None);
        assert_eq!(parse_script("min_working_s=0\n").min_working_s, Some(0.0));
    }
}
