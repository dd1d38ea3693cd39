//! The real herdr (issue 11): the per-test herdr world of `support::HerdrHome` (its own HOME and XDG
//! directories, a server stopped by the test, nothing left behind), and the fake agent as herdr's
//! bundled claude manifest sees it from the screen (idle and working window titles, a blocking
//! start-up dialog, a prompt that never shows working).
//!
//! Each test skips when herdr is absent and fails when `MAM_REQUIRE_HERDR=1`; none drives mam's herdr
//! backend (that is the contract tests' job): these pin the ground the backend tests stand on.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::*;

/// A world with a server up and `claude` linked to the mam binary (the fake agent's kind).
fn world(td: &TestDir) -> Option<HerdrHome> {
    let mut h = HerdrHome::new(td)?;
    h.link("claude", &mam_bin());
    h.start_server();
    Some(h)
}

/// A new workspace whose root pane's processes see `MAM_FAKE_AGENT_SCRIPT=<script>`; its pane id.
fn pane_with_script(h: &HerdrHome, td: &TestDir, name: &str, script: &str) -> String {
    let path = td.write(&format!("{name}.script"), script);
    let v = h.herdr_json(&[
        "workspace".as_ref(),
        "create".as_ref(),
        "--cwd".as_ref(),
        td.ws().as_os_str(),
        "--env".as_ref(),
        format!("MAM_FAKE_AGENT_SCRIPT={}", path.display()).as_ref(),
    ]);
    v["result"]["root_pane"]["pane_id"].as_str().unwrap_or_else(|| panic!("no root pane: {v}")).to_string()
}

/// `herdr agent start NAME --kind claude --pane PANE -- test-double agent`, which must succeed.
fn start_fake(h: &HerdrHome, name: &str, pane: &str) {
    let r = h.herdr(&["agent", "start", name, "--kind", "claude", "--pane", pane, "--", "test-double", "agent"]);
    r.expect_rc(0);
}

/// `agent_status` of `name` as `herdr agent get` reports it.
fn status(h: &HerdrHome, name: &str) -> String {
    let v = h.herdr_json(&["agent", "get", name]);
    v["result"]["agent"]["agent_status"].as_str().unwrap_or_else(|| panic!("no agent_status: {v}")).to_string()
}

/// Waits until herdr reports `want` for `name`, showing the live evaluation on timeout.
fn wait_status(h: &HerdrHome, name: &str, want: &str, limit: Duration) {
    if poll(limit, || (status(h, name) == want).then_some(())).is_none() {
        let explain = h.herdr(&["agent", "explain", name, "--verbose"]);
        panic!("agent {name} not {want} within {limit:?} (now {}):\n{}", status(h, name), explain.stdout());
    }
}

/// The state herdr's detector evaluates from the screen at this moment (`agent explain`).
fn live_state(h: &HerdrHome, name: &str) -> String {
    let v: Value = h.herdr_json(&["agent", "explain", name, "--json"]);
    v["state"].as_str().or(v["result"]["state"].as_str()).unwrap_or_else(|| panic!("no state: {v}")).to_string()
}

fn screen(h: &HerdrHome, pane: &str) -> String {
    let r = h.herdr(&["pane", "read", pane]);
    r.expect_rc(0);
    r.stdout()
}

const WAIT: Duration = Duration::from_secs(15);

#[test]
fn herdr_home_runs_a_private_server_and_leaves_no_process() {
    let td = TestDir::new("hr_home");
    let Some(mut h) = HerdrHome::new(&td) else { return };
    h.start_server();
    let v = h.herdr_json(&["workspace", "create", "--cwd", td.ws().to_str().unwrap()]);
    assert_eq!(v["result"]["type"], "workspace_created", "{v}");
    // The server's socket is the private world's, under the run's base.
    let sock = h.config.join("herdr/sessions").join(&h.session).join("herdr.sock");
    assert!(sock.exists(), "no socket at {}", sock.display());
    assert!(h.config.starts_with(base_dir()) && h.home.starts_with(&td.root));
    // A second server started the way mam bootstraps one (detached, not the test's child) under
    // another session name of the same world: the drop must find and stop it too.
    let other = format!("{}-b", h.session);
    let mut c = td.command("setsid");
    for (k, v) in h.env() {
        c = c.env(k, v);
    }
    let r = c
        .args(["-f", "bash", "-c", "exec herdr --session \"$0\" server </dev/null >/dev/null 2>&1", other.as_str()])
        .run();
    r.expect_rc(0);
    let other_up = || h.herdr(&["--session", other.as_str(), "agent", "list"]).rc() == 0;
    wait_until("the second herdr server to answer", WAIT, other_up);
    let live = h.processes();
    let servers: Vec<&(i32, String)> = live.iter().filter(|(_, a)| a.contains(" server")).collect();
    assert_eq!(servers.len(), 2, "both servers carry the world's HOME: {live:?}");
    assert!(live.iter().any(|(_, a)| a.contains("bash")), "the pane shell too: {live:?}");
    let marks = h.marks();
    drop(h);
    assert_eq!(marks.processes(), Vec::<(i32, String)>::new(), "nothing of the world outlives the drop");
}

#[test]
fn fake_agent_is_idle_then_working_then_idle_on_real_herdr() {
    let td = TestDir::new("hr_idle");
    let Some(h) = world(&td) else { return };
    let pane = pane_with_script(&h, &td, "a1", "");
    start_fake(&h, "a1", &pane);
    wait_status(&h, "a1", "idle", WAIT);
    let v = h.herdr_json(&["agent", "get", "a1"]);
    assert_eq!(v["result"]["agent"]["agent"], "claude", "{v}");
    assert_eq!(v["result"]["agent"]["terminal_title"], "\u{2733} fake agent", "{v}");
    // A prompt: the braille title (held 1 s) reads as working, the star title after it as idle.
    h.herdr(&["agent", "prompt", "a1", "first"]).expect_rc(0);
    wait_status(&h, "a1", "working", WAIT);
    wait_status(&h, "a1", "idle", WAIT);
    wait_until("the prompt's end on the screen", WAIT, || screen(&h, &pane).contains("prompt 1 done"));
    assert!(screen(&h, &pane).contains("prompt 1: first"), "{}", screen(&h, &pane));
    // `agent prompt --wait` sees the state change (what delegate-job relies on) and does not stall.
    let r = h.herdr_within(&["agent", "prompt", "a1", "second", "--wait"], Duration::from_secs(30));
    r.expect_rc(0);
    assert!(r.stdout().contains("\"agent_prompted\""), "{}", r.stdout());
    assert!(screen(&h, &pane).contains("prompt 2 done"), "{}", screen(&h, &pane));
}

#[test]
fn fake_agent_startup_dialog_blocks_until_n_enters_on_real_herdr() {
    let td = TestDir::new("hr_blocked");
    let Some(h) = world(&td) else { return };
    let pane = pane_with_script(&h, &td, "b1", "startup_blocked=2\n");
    start_fake(&h, "b1", &pane);
    wait_status(&h, "b1", "blocked", WAIT);
    assert!(screen(&h, &pane).contains("Do you want to proceed?"), "{}", screen(&h, &pane));
    // One enter of two: the agent took it (it says so) and the dialog still blocks.
    h.herdr(&["pane", "send-keys", &pane, "enter"]).expect_rc(0);
    wait_until("the first enter to arrive", WAIT, || screen(&h, &pane).contains("1 of 2 confirmations received"));
    assert_eq!(live_state(&h, "b1"), "blocked");
    assert_eq!(status(&h, "b1"), "blocked");
    // The second enter dismisses it: idle, and the dialog is gone from the screen.
    h.herdr(&["pane", "send-keys", &pane, "enter"]).expect_rc(0);
    wait_status(&h, "b1", "idle", WAIT);
    let s = screen(&h, &pane);
    assert!(!s.contains("Do you want to proceed?") && s.contains("fake agent ready"), "{s}");
}

#[test]
fn fake_agent_without_working_makes_prompt_wait_stall_on_real_herdr() {
    let td = TestDir::new("hr_stall");
    let Some(h) = world(&td) else { return };
    let pane = pane_with_script(&h, &td, "c1", "report_working=0\n");
    start_fake(&h, "c1", &pane);
    wait_status(&h, "c1", "idle", WAIT);
    let started = Instant::now();
    let r = h.herdr_within(&["agent", "prompt", "c1", "unseen", "--wait"], Duration::from_secs(30));
    let took = started.elapsed();
    // herdr's stall rule: no observed state change within 5 s; the error is on stderr, stdout empty.
    r.expect_rc(1);
    assert_eq!(r.stdout(), "");
    assert!(r.stderr().contains("\"agent_prompt_stalled\""), "{}", r.stderr());
    assert!(took >= Duration::from_millis(4500), "stalled after {took:?}");
    // Although herdr calls it stalled, the text was typed and handled.
    assert!(screen(&h, &pane).contains("prompt 1: unseen"), "{}", screen(&h, &pane));
    assert_eq!(status(&h, "c1"), "idle");
}
