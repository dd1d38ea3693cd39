//! Integration tests: `mam loop` (ORCH 4, 4.9 tests 1-29; A32-A42, A55-A57) with real git
//! repositories, the fake pane backend, fake agents whose verdicts, identity lines, edits during
//! review and crashes are scripted per prompt (`key@N`, ORCH 1.8), and the embedded broker.
//!
//! A `World` is one control root that is a git repository (one commit: `app.txt`, and a
//! `.gitignore` of `/.mam/` and `/.agents/`), a broker, and the sessions a test creates. Times are
//! scaled down: N = 1 s, K = 5, T = 10 s; every wait has a deadline.

#![allow(dead_code)] // shared by the test files below, each using a part of it

use std::cell::RefCell;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::support::*;

mod demo;
mod jobs;
mod rounds;
mod validate;

/// How long one loop run may take in a test.
pub const LOOP_LIMIT: Duration = Duration::from_secs(120);

pub struct World {
    pub td: TestDir,
    broker: Broker,
    pub root: PathBuf,
    pub env: Vec<(String, OsString)>,
    /// The fake agents started (each leads its own process group), killed on drop.
    agents: RefCell<Vec<i32>>,
    base: String,
}

impl Drop for World {
    fn drop(&mut self) {
        // Each loop froze a copy of the binary (tens of MB in a debug build): a suite of loops
        // would otherwise fill a small disk. Everything else stays for a look after a failure.
        for id in self.loop_ids() {
            let _ = fs::remove_file(self.loop_dir(&id).join("bin/mam"));
        }
        for pid in self.agents.borrow().iter() {
            let _ = mam::sys::kill(-pid, 9);
        }
        let reg = self.registry();
        if let Ok(rd) = fs::read_dir(&reg) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(id) = name.strip_suffix(".json") {
                    for pid in timer_pids(id) {
                        let _ = mam::sys::kill(pid, 9);
                    }
                }
            }
        }
    }
}

impl World {
    pub fn new(name: &str) -> World {
        let td = TestDir::new(name);
        let broker = start_target(Target::Embedded, &td).expect("embedded broker");
        let root = td.ws();
        fs::create_dir_all(td.path("tmp")).unwrap();
        git_in(&root, &["init", "-q", "-b", "main"]);
        fs::write(root.join("app.txt"), "version 1\n").unwrap();
        fs::write(root.join(".gitignore"), "/.mam/\n/.agents/\n").unwrap();
        git_in(&root, &["add", "-A"]);
        git_in(&root, &["commit", "-q", "-m", "initial"]);
        let base = git_in(&root, &["rev-parse", "HEAD"]);
        let mut env: Vec<(String, OsString)> = vec![
            ("MAM_PANE_BACKEND".into(), "fake".into()),
            ("MAM_FAKE_PANES_DIR".into(), td.path("panes").into()),
            ("MQTT_PORT".into(), broker.port().to_string().into()),
            ("MAM_SKS_POLL_MS".into(), "50".into()),
            ("MAM_SKS_QUIESCE_GAP_MS".into(), "50".into()),
            ("MAM_WATCH_POLL_MS".into(), "100".into()),
            ("MAM_MQTT_CONNECT_TIMEOUT_S".into(), "2".into()),
            ("MAM_AGENT_START_TIMEOUT_MS".into(), "20000".into()),
            ("MAM_HEARTBEAT_SEC".into(), "1".into()),
            ("MAM_HEARTBEAT_MISSES".into(), "5".into()),
            ("MAM_ACK_TIMEOUT_S".into(), "10".into()),
            ("TMPDIR".into(), td.path("tmp").into()),
            // The fake agent shows no start-up dialog here: no settle wait after each start.
            ("MAM_STARTUP_DIALOG_SETTLE_MS".into(), "0".into()),
        ];
        for (k, v) in GIT_ENV {
            env.push(((*k).into(), (*v).into()));
        }
        World { td, broker, root, env, agents: RefCell::new(Vec::new()), base }
    }

    /// The initial commit.
    pub fn base(&self) -> String {
        self.base.clone()
    }

    pub fn git(&self, args: &[&str]) -> String {
        git_in(&self.root, args)
    }

    pub fn mam(&self) -> Cmd {
        let mut c = self.td.mam().cwd(&self.root);
        for (k, v) in &self.env {
            c = c.env(k, v);
        }
        c
    }

    pub fn registry(&self) -> PathBuf {
        self.root.join(".mam/jobs")
    }

    /// A session running the fake agent with this script (key=value lines; `key@N` per prompt).
    pub fn session(&self, name: &str, script: &str) {
        let sp = self.td.write(&format!("{name}.script"), script);
        let r = self
            .mam()
            .args(["create", "claude", "--name", name, "--no-onboard", "--", "test-double", "agent"])
            .env("MAM_FAKE_AGENT_SCRIPT", &sp)
            .run();
        r.expect_rc(0);
        let pane = kv(&r.stdout(), "PANE");
        let pid: i32 =
            fs::read_to_string(self.td.path("panes/panes").join(&pane).join("pid")).unwrap().trim().parse().unwrap();
        self.agents.borrow_mut().push(pid);
    }

    /// A creator that appends a line to `app.txt` on every job (so there is a change to review).
    pub fn creator(&self, name: &str, extra: &str) {
        let app = self.root.join("app.txt");
        self.session(name, &format!("work_s=0.2\nedit={}\n{extra}", app.display()));
    }

    /// A reviewer that echoes the round's identity and says `verdict` (extra lines may override
    /// per prompt).
    pub fn reviewer(&self, name: &str, verdict: &str, extra: &str) {
        self.session(name, &format!("work_s=0.2\nidentity=echo\nverdict={verdict}\n{extra}"));
    }

    pub fn task(&self, text: &str) -> PathBuf {
        self.td.write(&format!("task-{}.md", rand_hex(3)), text)
    }

    /// `mam loop <args>` to its end.
    pub fn run_loop(&self, args: &[&str]) -> Run {
        self.mam().args(["loop"]).args(args).run_within(LOOP_LIMIT)
    }

    /// `mam loop <args>` in the background.
    pub fn spawn_loop(&self, args: &[&str]) -> Background {
        self.mam().args(["loop"]).args(args).spawn_bg(&self.td, "loop")
    }

    pub fn loop_dir(&self, id: &str) -> PathBuf {
        self.root.join(".mam/loop").join(id)
    }

    pub fn checkpoint(&self, id: &str) -> Value {
        serde_json::from_slice(&fs::read(self.loop_dir(id).join("checkpoint.json")).unwrap()).unwrap()
    }

    pub fn record(&self, jid: &str) -> Value {
        serde_json::from_slice(&fs::read(self.registry().join(format!("{jid}.json"))).unwrap()).unwrap()
    }

    /// Every loop dir under the control root.
    pub fn loop_ids(&self) -> Vec<String> {
        let Ok(rd) = fs::read_dir(self.root.join(".mam/loop")) else { return Vec::new() };
        let mut v: Vec<String> =
            rd.flatten().filter(|e| e.path().is_dir()).map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    /// The job records in the registry.
    pub fn job_ids(&self) -> Vec<String> {
        let Ok(rd) = fs::read_dir(self.registry()) else { return Vec::new() };
        rd.flatten().filter_map(|e| e.file_name().to_string_lossy().strip_suffix(".json").map(str::to_string)).collect()
    }

    /// The review trees left under this world's TMPDIR.
    pub fn review_trees(&self) -> Vec<String> {
        fs::read_dir(self.td.path("tmp"))
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with("mam-review-"))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// `LOOP_ID=<id> OUTCOME=<o> RC=<n> REPORTS=<r>`: (id, outcome, rc, reports).
pub fn last_line(stdout: &str) -> (String, String, i32, String) {
    let l = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with("LOOP_ID="))
        .unwrap_or_else(|| panic!("no LOOP_ID line:\n{stdout}"));
    let field = |k: &str| l.split(' ').find_map(|w| w.strip_prefix(k)).unwrap_or_default().to_string();
    (field("LOOP_ID="), field("OUTCOME="), field("RC=").parse().unwrap_or(-1), field("REPORTS="))
}

/// Every prompt file (body and context) the loop wrote, by name.
pub fn prompts(dir: &Path) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = fs::read_dir(dir.join("prompts"))
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".md"))
                .map(|e| (e.file_name().to_string_lossy().into_owned(), fs::read_to_string(e.path()).unwrap()))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}
