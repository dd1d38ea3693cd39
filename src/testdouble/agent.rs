//! The fake agent (ORCH 1.8): follows a key=value script (`MAM_FAKE_AGENT_SCRIPT`), shows a start-up
//! dialog when asked, reads the brief a prompt names with the parser `delegate::brief` owns, and runs
//! the brief's command lines exactly as written, through `bash -c`, from `/`, without the workspace
//! variables.
//!
//! A stand-in for an agent CLI: like one, it writes its screen itself. Nothing in mam's own flows
//! calls it.

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
}

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
            _ => {}
        }
    }
    s
}

struct Agent {
    pane_dir: Option<PathBuf>,
    env: Vec<(OsString, OsString)>,
}

impl Agent {
    fn status(&self, s: &str) {
        if let Some(d) = &self.pane_dir {
            let _ = sys::atomic_write(&d.join("status"), s.as_bytes());
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
    // Start-up dialog: blocked until enough `enter` keys arrived.
    if script.startup_blocked > 0 {
        if let Some(d) = &agent.pane_dir {
            agent.status("blocked");
            loop {
                let n = std::fs::read_to_string(d.join("keys")).map(|t| t.lines().count() as u64).unwrap_or(0);
                if n >= script.startup_blocked || !d.is_dir() {
                    break;
                }
                sys::sleep(Duration::from_millis(20));
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
            for line in std::io::stdin().lock().lines() {
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
                    let _ = std::fs::write(&rp, body);
                }
                if let Some(l) = cmds.get("success") {
                    agent.run_line(l, &[]);
                }
            }
        }
    } else {
        pause(s.work_s);
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
    }
}
