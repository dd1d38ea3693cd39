//! docs/GUIDE.md runs (issues 18, 32): every `sh` block of the file, in order, as one bash script in a
//! temp world with no agent CLI: the agents are mam's own pretend agent (`mam create pretend`), on a
//! private tmux server, with the embedded broker on a free port: a delegation (waited for and
//! detached), a review loop, a worktree prepared, reviewed, listed and removed, the stop and the
//! verdict hook. `sh interactive` lines run the way a script can: `mam attach NAME` with `--print`,
//! `mam jobs --follow` for two seconds and then SIGINT, `mam ui` as one 80x24 screen (`--snapshot`).
//! `sh not-tested` blocks are the guide's documented exceptions (at most two). The script runs under
//! `set -euo pipefail`, so a block edited to a wrong command fails the test.

use std::fs;
use std::path::Path;
use std::time::Duration;

use crate::support::*;

/// The tags a `sh` block may carry: run as written, run the way a script can, not run.
const TAGS: &[&str] = &["sh", "sh interactive", "sh not-tested"];

/// Every `sh` block of the guide: (tag, text) in order. A tag the convention does not know fails.
fn blocks(md: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut cur: Option<(String, String)> = None;
    let mut in_other = false;
    for line in md.lines() {
        match (&mut cur, line.strip_prefix("```")) {
            // Inside another block only a bare fence closes it (CommonMark).
            (None, Some(tag)) if in_other => in_other = !tag.is_empty(),
            (None, Some(tag)) if tag == "sh" || tag.starts_with("sh ") => {
                assert!(TAGS.contains(&tag), "docs/GUIDE.md: unknown block tag `{tag}` (known: {TAGS:?})");
                cur = Some((tag.to_string(), String::new()))
            }
            (None, Some(_)) => in_other = true,
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

/// The script's text: the port substituted, interactive lines made runnable, `not-tested` blocks left out.
fn script(md: &str, port: u16) -> String {
    let mut s = String::new();
    for (tag, text) in blocks(md) {
        if tag == "sh not-tested" {
            continue;
        }
        for line in text.lines() {
            let line = line.replace("1883", &port.to_string());
            let cmd = line.split('#').next().unwrap_or("").trim().to_string();
            if tag == "sh interactive" && cmd.starts_with("mam attach ") {
                s.push_str(&format!("{cmd} --print\n"));
            } else if tag == "sh interactive" && cmd == "mam jobs --follow" {
                s.push_str("timeout --preserve-status -s INT 2 mam jobs --follow >/dev/null\n");
            } else if tag == "sh interactive" && cmd == "mam ui" {
                s.push_str("mam ui --snapshot 80x24\n");
            } else if tag == "sh interactive" {
                panic!("an interactive line the test cannot run: {line}");
            } else {
                s.push_str(&line);
                s.push('\n');
            }
        }
    }
    s
}

/// The agent kinds the runnable blocks start (`mam create KIND`, `mam worktree prepare ... --creator
/// KIND`), in order.
fn kinds_used(script: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in script.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        for w in words.windows(3) {
            let starts = (w[0].ends_with("mam") && w[1] == "create")
                || (w[1] == "--creator" && line.contains("mam worktree prepare "));
            if starts {
                out.push(w[2].trim_end_matches(')').to_string());
            }
        }
    }
    out
}

fn guide() -> String {
    fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/GUIDE.md")).unwrap()
}

#[test]
fn guide_blocks_are_extracted() {
    let md = "a\n```sh\nmam paths\n```\n```sh not-tested\nnot run\n```\n```text\n```sh\n```\n```sh interactive\nmam attach w # x\n```\n";
    let b = blocks(md);
    assert_eq!(b.len(), 3);
    assert_eq!(script(md, 5), "mam paths\nmam attach w --print\n");
    let used = kinds_used("mam create claude --name a\nout=$(mam worktree prepare b --creator codex --name c)\n");
    assert_eq!(used, ["claude", "codex"]);
}

/// The guide's runnable blocks start the pretend agent only (a newcomer needs no agent CLI), the
/// exceptions stay at two, and the blocks cover the whole path: a delegation, a detached one and
/// its wait, a review loop, and a worktree prepared, listed and removed (dropping a part from the
/// guide fails here, not silently).
#[test]
fn the_guide_covers_the_path_with_the_pretend_agent() {
    let md = guide();
    let text = script(&md, 1883);
    let used = kinds_used(&text);
    assert!(used.len() >= 4, "{used:?}");
    for k in &used {
        assert_eq!(k, mam::agents::PRETEND, "the guide starts '{k}', which needs an agent CLI");
    }
    let skipped: Vec<String> = blocks(&md).into_iter().filter(|(t, _)| t == "sh not-tested").map(|(_, b)| b).collect();
    assert!(skipped.len() <= 2, "more exceptions than the two documented: {skipped:?}");
    // Section 2 names every kind there is.
    let kinds_line = md.split("The kinds are the agent CLIs").nth(1).and_then(|t| t.split("(always").next());
    let kinds_line = kinds_line.expect("section 2's list of kinds").replace('\n', " ");
    for k in mam::agents::kinds() {
        assert!(kinds_line.contains(&format!("`{k}`")), "section 2's list of kinds lacks `{k}`: {kinds_line}");
    }
    for cmd in [
        "mam broker ",
        "mam broker check",
        "mam create ",
        "mam delegate-job ",
        "--detach",
        "mam wait ",
        "mam jobs",
        "mam stop ",
        "mam loop --creator ",
        "mam worktree prepare ",
        "mam worktree list",
        "mam worktree remove ",
        "--review-only",
        "mam notify test",
    ] {
        assert!(text.contains(cmd), "the guide's runnable blocks lost `{cmd}`");
    }
}

#[test]
fn the_guide_runs_with_the_pretend_agent() {
    if !have_tool("tmux", "MAM_REQUIRE_TMUX") || !have_tool("git", "MAM_REQUIRE_TMUX") {
        return;
    }
    let md = guide();
    let td = TestDir::new("guide");
    let home = td.path("home");
    let project = home.join("src/myproject");
    fs::create_dir_all(&project).unwrap();
    let tmp = td.path("tmp");
    fs::create_dir_all(&tmp).unwrap();
    // "Your repository": one commit.
    fs::write(project.join("README.md"), "my project\n").unwrap();
    for args in [&["init", "-q", "-b", "main"][..], &["add", "-A"], &["commit", "-q", "-m", "first"]] {
        git_in(&project, args);
    }
    // No agent CLI: only `mam` itself is put on PATH (the one built for this test run).
    let bin = td.path("bin");
    fs::create_dir_all(&bin).unwrap();
    let mam = mam_bin();
    use std::os::unix::fs::PermissionsExt;
    fs::write(bin.join("mam"), format!("#!/bin/sh\nexec '{}' \"$@\"\n", mam.display())).unwrap();
    fs::set_permissions(bin.join("mam"), fs::Permissions::from_mode(0o755)).unwrap();
    let sock = format!("guide-{}", rand_hex(4));
    // The script's trap ends the server; its socket file goes with this guard, whatever happens.
    struct Socket(String);
    impl Drop for Socket {
        fn drop(&mut self) {
            kill_tmux(&self.0);
        }
    }
    let _socket = Socket(sock.clone());
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
    let mut c = td
        .command("bash")
        .args([td.path("guide.sh")])
        .env("PATH", path)
        .env("HOME", &home)
        .env("TMPDIR", &tmp)
        .env_remove("MAM_ENV_FILE")
        .env_remove("MAM_NO_SUBSCRIBER_DAEMON")
        .env_remove("MAM_PANE_BACKEND")
        .env("MAM_TMUX_SOCKET", &sock)
        .env("MAM_TMUX_STABLE_MS", "300")
        .env("MAM_SKS_QUIESCE_GAP_MS", "300")
        .env("SKS_DELIVERY_GRACE_S", "1");
    for (k, v) in GIT_ENV {
        c = c.env(k, v);
    }
    let r = c.run_within(Duration::from_secs(150));
    let out = r.stdout();
    assert_eq!(r.rc(), 0, "guide script failed\n--- script\n{text}--- stdout\n{out}--- stderr\n{}", r.stderr());
    assert!(out.contains("STATUS=completed"), "{out}");
    assert!(
        out.contains("The pretend agent did the job: it appended a line to notes.txt."),
        "the report is read: {out}"
    );
    // The detached delegation returned before its verdict, which `mam wait` then gave.
    let detached = out.lines().find(|l| l.starts_with("JOB_ID=") && !l.contains("STATUS=completed"));
    let jid = detached.and_then(|l| l.strip_prefix("JOB_ID=")).and_then(|l| l.split(' ').next());
    let jid = jid.unwrap_or_else(|| panic!("no detached JOB_ID line: {out}"));
    assert!(out.contains(&format!("JOB_ID={jid} SESSION=worker VERDICT=completed")), "{out}");
    assert!(out.contains(&format!("tmux -L {sock} attach-session -t ")), "{out}");
    assert!(out.contains("NAME\tAGENT\t"), "mam status: {out}");
    assert!(out.contains("mam ui  1 session  ") && out.contains("JOBS     STATUS"), "mam ui: {out}");
    assert!(out.lines().any(|l| l.starts_with("> worker ") && l.contains("pretend")), "mam ui: {out}");
    // The job's subscriber reached the broker with the workspace's credentials (no re-probing).
    assert!(!r.stderr().contains("subscriber exited") && !r.stderr().contains("no broker answers"), "{}", r.stderr());
    // Both loops promoted; the reviewer's reports carry identity sidecars.
    assert_eq!(out.matches(" OUTCOME=promoted RC=0 ").count(), 2, "{out}");
    let reports: Vec<String> = fs::read_dir(project.join(".agents/reports/rev-a"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(reports.iter().filter(|n| n.ends_with(".identity.json")).count(), 2, "{reports:?}");
    // The worktree: prepared beside the control root, listed, removed; its change kept on `greet`.
    let wt = home.join("src/myproject-greet");
    assert!(out.contains(&format!("WORKTREE={}", wt.display())), "{out}");
    assert!(out.contains("BRANCH=greet HEAD=") && out.contains("SESSIONS=greeter"), "{out}");
    assert!(out.contains("SESSION=greeter STATUS=stopped") && out.contains("RESULT=removed METHOD=plain"), "{out}");
    assert!(!wt.exists(), "the worktree is removed");
    let notes = git_in(&project, &["show", "greet:notes.txt"]);
    assert!(notes.contains("edited by the pretend agent"), "{notes}");
    // The verdict hook ran (`mam notify test`).
    let verdicts = fs::read_to_string(project.join(".mam/verdicts.txt")).unwrap_or_default();
    assert!(verdicts.starts_with("mam: "), "{verdicts}");
    // Nothing is left: no tmux server, no daemon, no review tree.
    let alive = std::process::Command::new("tmux").args(["-L", &sock, "list-sessions"]).output().unwrap();
    assert!(!alive.status.success(), "the tmux server is still there");
    let trees: Vec<_> = fs::read_dir(&tmp).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(!trees.iter().any(|n| n.to_string_lossy().starts_with("mam-review-")), "{trees:?}");
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
