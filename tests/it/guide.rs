//! docs/GUIDE.md runs (issue 18): its `sh guide` blocks, in order, as one bash script in a temp world
//! where a fake agent named `claude` stands in for the real one, on a private tmux server and the
//! embedded broker on a free port. `sh guide-interactive` lines run the way a script can:
//! `mam attach NAME` with `--print`, `mam jobs --follow` for two seconds and then SIGINT, `mam ui`
//! as one 80x24 screen (`--snapshot`).

use std::fs;
use std::path::Path;
use std::time::Duration;

use crate::support::*;

/// The guide's runnable blocks as one script: (tag, text) in order.
fn blocks(md: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut cur: Option<(String, String)> = None;
    for line in md.lines() {
        match (&mut cur, line.strip_prefix("```")) {
            (None, Some(tag)) if tag.starts_with("sh guide") => cur = Some((tag.to_string(), String::new())),
            (Some(_), Some("")) => out.push(cur.take().unwrap()),
            (Some((_, text)), _) => {
                text.push_str(line);
                text.push('\n');
            }
            _ => {}
        }
    }
    out
}

/// The script's text: the port substituted, interactive lines made runnable.
fn script(md: &str, port: u16) -> String {
    let mut s = String::new();
    for (tag, text) in blocks(md) {
        for line in text.lines() {
            let line = line.replace("1883", &port.to_string());
            let cmd = line.split('#').next().unwrap_or("").trim().to_string();
            if tag == "sh guide-interactive" && cmd.starts_with("mam attach ") {
                s.push_str(&format!("{cmd} --print\n"));
            } else if tag == "sh guide-interactive" && cmd == "mam jobs --follow" {
                s.push_str("timeout --preserve-status -s INT 2 mam jobs --follow >/dev/null\n");
            } else if tag == "sh guide-interactive" && cmd == "mam ui" {
                s.push_str("mam ui --snapshot 80x24\n");
            } else if tag == "sh guide-interactive" {
                panic!("an interactive line the test cannot run: {line}");
            } else {
                s.push_str(&line);
                s.push('\n');
            }
        }
    }
    s
}

#[test]
fn guide_blocks_are_extracted() {
    let md = "a\n```sh guide\nmam paths\n```\n```sh\nnot run\n```\n```sh guide-interactive\nmam attach w # x\n```\n";
    let b = blocks(md);
    assert_eq!(b.len(), 2);
    assert_eq!(script(md, 5), "mam paths\nmam attach w --print\n");
}

#[test]
fn the_guide_runs_with_the_fake_agent() {
    if !have_tool("tmux", "MAM_REQUIRE_TMUX") || !have_tool("git", "MAM_REQUIRE_TMUX") {
        return;
    }
    let md = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/GUIDE.md")).unwrap();
    let td = TestDir::new("guide");
    let home = td.path("home");
    let project = home.join("src/myproject");
    fs::create_dir_all(&project).unwrap();
    let git = std::process::Command::new("git").args(["init", "-q"]).current_dir(&project).status().unwrap();
    assert!(git.success());
    // The fake agent as `claude`: it reads its brief, works a second and reports.
    let agent_script = td.write("agent.script", "work_s=1\nreport_text=Hello.\\nHello again.\n");
    let bin = td.path("bin");
    fs::create_dir_all(&bin).unwrap();
    let mam = mam_bin();
    td.write(
        "bin/claude",
        format!(
            "#!/usr/bin/env bash\nexport MAM_FAKE_AGENT_SCRIPT='{}'\nexec -a claude '{}' test-double agent \"$@\"\n",
            agent_script.display(),
            mam.display()
        ),
    );
    fs::write(bin.join("mam"), format!("#!/bin/sh\nexec '{}' \"$@\"\n", mam.display())).unwrap();
    use std::os::unix::fs::PermissionsExt;
    for f in ["claude", "mam"] {
        fs::set_permissions(bin.join(f), fs::Permissions::from_mode(0o755)).unwrap();
    }
    let sock = format!("guide-{}", rand_hex(4));
    let port = free_port();
    // Whatever happens, nothing outlives the script: the broker, the daemon, the tmux server.
    let prologue = format!(
        "set -euo pipefail\ntrap 'rc=$?; set +e; [ -n \"${{broker:-}}\" ] && kill \"$broker\" 2>/dev/null; \
         (cd {p} && mam monitor stop >/dev/null 2>&1); tmux -L {sock} kill-server 2>/dev/null; exit $rc' EXIT\n",
        p = project.display()
    );
    let body = script(&md, port);
    let text = format!("{prologue}{body}");
    td.write("guide.sh", &text);
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let r = td
        .command("bash")
        .args([td.path("guide.sh")])
        .env("PATH", path)
        .env("HOME", &home)
        .env_remove("MAM_ENV_FILE")
        .env_remove("MAM_NO_SUBSCRIBER_DAEMON")
        .env("MAM_PANE_BACKEND", "tmux")
        .env("MAM_TMUX_SOCKET", &sock)
        .env("MAM_TMUX_STABLE_MS", "300")
        .env("MAM_SKS_QUIESCE_GAP_MS", "300")
        .env("SKS_DELIVERY_GRACE_S", "1")
        .run_within(Duration::from_secs(120));
    let out = r.stdout();
    assert_eq!(r.rc(), 0, "guide script failed\n--- script\n{text}--- stdout\n{out}--- stderr\n{}", r.stderr());
    assert!(out.contains("STATUS=completed"), "{out}");
    assert!(out.contains("Hello.") && out.contains("Hello again."), "the report is read: {out}");
    assert!(out.contains(&format!("tmux -L {sock} attach-session -t ")), "{out}");
    assert!(out.contains("NAME\tAGENT\t"), "mam status: {out}");
    assert!(out.contains("mam ui  1 session  ") && out.contains("JOBS     STATUS"), "mam ui: {out}");
    assert!(out.lines().any(|l| l.starts_with("> worker ") && l.contains("claude")), "mam ui: {out}");
    // The job's subscriber reached the broker with the workspace's credentials (no re-probing).
    assert!(!r.stderr().contains("subscriber exited"), "{}", r.stderr());
    // Nothing is left: no tmux server, no daemon.
    let alive = std::process::Command::new("tmux").args(["-L", &sock, "list-sessions"]).output().unwrap();
    assert!(!alive.status.success(), "the tmux server is still there");
    assert!(
        !project.join(".mam/monitor.lock").exists() || {
            let r = td
                .mam()
                .cwd(&project)
                .env_remove("MAM_ENV_FILE")
                .args(["daemon", "status", "--workspace"])
                .args([&project])
                .run();
            r.stdout().trim().is_empty()
        }
    );
}
