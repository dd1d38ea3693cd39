//! Issue 18, the user's path: errors that say what to do and state a person can read, at the CLI.

use crate::support::*;

/// A broker that is not running: the error says how to start one or which variable to set.
#[test]
fn broker_not_running_says_how_to_start_one() {
    let td = TestDir::new("nobroker");
    let port = free_port();
    let r = td.mam().args(["pub", "-t", "a/b", "-m", "x", "-p", &port.to_string()]).run();
    r.expect_rc(3);
    let last = r.stderr().lines().last().unwrap_or("").to_string();
    assert!(last.starts_with(&format!("ERROR: cannot connect to broker 127.0.0.1:{port}")), "{last}");
    assert!(last.contains("start one with `mam broker") && last.contains("MQTT_BROKER and MQTT_PORT"), "{last}");
}

/// `mam pub`/`mam sub` take the mosquitto flags people type (-L, -l, -i, -d, -u, -F, -N, -R), refuse
/// -P with "set MQTT_PASSWORD" (the password never shown), and `sub -W` says it timed out.
#[test]
fn pub_and_sub_take_mosquitto_flags() {
    let td = TestDir::new("mosqflags");
    let Some(b) = start_target(Target::Embedded, &td) else { return };
    let port = b.port().to_string();
    let mut sub = td
        .mam()
        .env("MQTT_PORT", &port)
        .args(["sub", "-t", "u/#", "-C", "3", "-F", "%t=%p(%l)", "-N", "-d", "-i", "mam-sub-test", "-W", "30"])
        .spawn_bg(&td, "sub");
    wait_until("sub subscribed", std::time::Duration::from_secs(20), || {
        sub.stderr().contains("NOTE: sub: subscribed to u/#")
    });
    let url = format!("mqtt://someone@127.0.0.1:{port}/u/a");
    td.mam().args(["pub", "-L", &url, "-m", "one", "-i", "mam-pub-test"]).run().expect_rc(0);
    let r = td.mam().env("MQTT_PORT", &port).args(["pub", "-t", "u/b", "-l", "-d"]).run_stdin(b"x\nyy\n");
    r.expect_rc(0);
    assert!(r.stderr().contains("NOTE: pub: sent 2 bytes to 'u/b'"), "{}", r.stderr());
    let (rc, _) = sub.wait(std::time::Duration::from_secs(20));
    assert_eq!(rc, 0, "{}", sub.stderr());
    assert_eq!(sub.stdout(), "u/a=one(3)u/b=x(1)u/b=yy(2)");

    let r = td.mam().env("MQTT_PORT", &port).args(["pub", "-t", "u/c", "-m", "x", "-P", "hunter2"]).run();
    r.expect_rc(2);
    assert!(r.stderr().contains("set MQTT_PASSWORD") && !r.stderr().contains("hunter2"), "{}", r.stderr());
    let r = td.mam().env("MQTT_PORT", &port).args(["sub", "-t", "u/none", "-W", "1"]).run();
    r.expect_rc(27);
    assert_eq!(r.stderr(), "NOTE: sub: timed out after 1 s (-W) with 0 message(s) received\n");
}

/// `mam status` and `mam reconcile` say "no sessions" / "nothing to do" instead of printing nothing;
/// `mam monitor` labels what it prints.
#[test]
fn empty_answers_are_sentences() {
    let td = TestDir::new("emptyans");
    let r = td.mam().env("MAM_PANE_BACKEND", "fake").args(["status"]).run();
    r.expect_rc(0);
    assert_eq!(r.stdout(), "no sessions (start one with `mam create <agent>`)\n");
    let r = td.mam().env("MAM_PANE_BACKEND", "fake").args(["status", "--json"]).run();
    assert_eq!(r.stdout(), "[]\n");
    let r = td.mam().env("MAM_PANE_BACKEND", "fake").args(["reconcile"]).run();
    r.expect_rc(0);
    assert_eq!(r.stdout(), "nothing to do: no sessions to reconcile\n");
    let r = td.mam().args(["monitor", "status"]).run();
    r.expect_rc(0);
    assert_eq!(
        r.stdout(),
        format!("daemon for {}: not running (start it with `mam monitor start`)\n", td.ws().display())
    );
}

/// `mam publish --event started --heartbeat N` arms the timer as soon as the event is recorded,
/// while the wire is still retrying: a broker outage at start cannot make a healthy job miss its
/// idle window. A `--heartbeat` that disagrees with the record's N is not applied: the timer beats
/// at the record's N and a WARNING says so (never "the record keeps M" while beating at N).
#[test]
fn heartbeat_is_armed_while_the_wire_retries_and_the_record_s_n_wins() {
    use std::time::Duration;
    let td = TestDir::new("hbearly");
    let port = free_port();
    let id = crate::publish::new_job(&td, port, &[]);
    let _timers = TimerGuard(id.clone());
    let mut p = crate::publish::mam_at(&td, port)
        .env("MAM_PUBLISH_BUDGET_S", "8")
        .args(["publish", "--job-id", &id, "--event", "started", "--heartbeat", "5", "--watch-pid", "0"])
        .spawn_bg(&td, "publish");
    wait_until("the timer, while publish still retries", Duration::from_secs(5), || {
        !timer_pids(&id).is_empty() || p.exited()
    });
    assert!(!p.exited(), "publish ended before the timer was seen: {}", p.stderr());
    let (rc, _) = p.wait(Duration::from_secs(30));
    assert_eq!(rc, 3, "{}", p.stderr());
    let err = p.stderr();
    assert!(
        err.contains("WARNING: --heartbeat 5 is not this job's heartbeat_sec 1; the timer beats every 1 s"),
        "{err}"
    );
    assert!(!err.contains("the record keeps"), "{err}");
    // The timer beats at the record's N = 1 s: two beats land in events.log within a few seconds.
    let log = td.ws().join(".mam/jobs").join(&id).join("events.log");
    wait_until("two beats at 1 s", Duration::from_secs(10), || {
        std::fs::read_to_string(&log).unwrap_or_default().matches("\"heartbeat\":true").count() >= 2
    });
}

// ---- Issue 32: the user's path, round 2 -------------------------------------------------------

/// Issue 32 item 2: a command that starts agents or jobs, run outside any control root, is refused
/// before it changes anything and names `mam install` (it used to make the cwd a control root with
/// its own `.mam/` and daemon).
#[test]
fn i32_outside_a_control_root_is_refused_naming_mam_install() {
    let td = TestDir::new("noroot");
    let plain = td.path("plain");
    std::fs::create_dir_all(&plain).unwrap();
    td.write("plain/task.md", "hello\n");
    let cases: &[&[&str]] = &[
        &["create", "claude", "--name", "w"],
        &["resume", "w"],
        &["delegate-job", "--session", "w", "--brief-file", "task.md"],
        &["loop", "--creator", "w", "--reviewer", "r", "--task-file", "task.md"],
        &["worktree", "prepare", "x"],
    ];
    for args in cases {
        let r = td.mam().cwd(&plain).env("MAM_PANE_BACKEND", "fake").args(*args).run();
        assert_eq!(r.rc(), 2, "{args:?}: {}", r.stderr());
        let line = r.stderr();
        assert!(line.starts_with(&format!("REFUSED: {}", args[0])), "{args:?}: {line}");
        assert!(line.contains("not inside a control root") && line.contains("`mam install`"), "{line}");
        assert!(line.trim_end().ends_with("nothing changed"), "{line}");
        assert!(!plain.join(".mam").exists(), "{args:?} made a control root: {line}");
    }
    // Inside one (here: below the control root) the same create goes ahead.
    let sub = td.ws().join("sub");
    std::fs::create_dir_all(&sub).unwrap();
    let r = td
        .mam()
        .cwd(&sub)
        .env("MAM_PANE_BACKEND", "fake")
        .args(["create", "claude", "--name", "w", "--no-onboard"])
        .run();
    assert_eq!(r.rc(), 0, "{}", r.stderr());
    td.mam().env("MAM_PANE_BACKEND", "fake").args(["stop", "w"]).run();
}

/// Issue 32 item 8: `mam loop` without `--reviewer` is refused (rc 2, nothing started) unless
/// `--self-review` says the creator reviews itself; both together are refused too.
#[test]
fn i32_loop_without_reviewer_needs_self_review() {
    let td = TestDir::new("selfrev");
    td.write("ws/task.md", "hello\n");
    let r = td.mam().args(["loop", "--creator", "cr", "--task-file", "task.md"]).run();
    assert_eq!(r.rc(), 2, "{}", r.stderr());
    assert!(r.stderr().contains("--reviewer NAME") && r.stderr().contains("--self-review"), "{}", r.stderr());
    assert!(!td.ws().join(".mam/loop").exists(), "a loop dir was made");
    let r =
        td.mam().args(["loop", "--creator", "cr", "--reviewer", "rv", "--self-review", "--task-file", "task.md"]).run();
    assert_eq!(r.rc(), 2, "{}", r.stderr());
    assert!(r.stderr().contains("--self-review excludes --reviewer"), "{}", r.stderr());
    // With --self-review the flag check passes: the loop goes on to find no session cr (rc 2, another line).
    let r = td.mam().args(["loop", "--creator", "cr", "--self-review", "--task-file", "task.md"]).run();
    assert!(!r.stderr().contains("--self-review"), "{}", r.stderr());
}

/// Issue 32 items 1 and 10: a missing agent CLI is refused with the way to install it and the
/// pretend agent; `mam create --help` and the unknown-kind refusal list the same kinds, every kind
/// of the adapter table; the pretend agent and `mam test-double agent` print their help.
#[test]
fn i32_kinds_come_from_the_adapter_table_and_a_missing_cli_says_how_to_install_it() {
    let td = TestDir::new("kinds");
    let empty = td.path("emptybin");
    std::fs::create_dir_all(&empty).unwrap();
    let r =
        td.mam().env("PATH", &empty).env("MAM_PANE_BACKEND", "tmux").args(["create", "claude", "--name", "w"]).run();
    assert_eq!(r.rc(), 2, "{}", r.stderr());
    let line = r.stderr();
    assert!(line.contains("not found on PATH"), "{line}");
    assert!(
        line.contains("npm install -g @anthropic-ai/claude-code") && line.contains("scripts/install_agents.sh"),
        "{line}"
    );
    assert!(line.contains("`mam create pretend`"), "{line}");
    let help = td.mam().args(["create", "--help"]).run().stdout();
    let unknown = td.mam().args(["create", "nosuch"]).run().stderr();
    let kinds = mam::agents::kinds().join(", ");
    assert!(help.contains(&format!("Agents: {kinds}.")), "{help}");
    assert!(unknown.contains(&format!("(known: {kinds})")), "{unknown}");
    assert!(kinds.contains("pretend"), "{kinds}");
    let r = td.mam().args(["pretend-agent", "--help"]).run();
    assert_eq!(r.rc(), 0);
    assert!(r.stdout().starts_with("Usage: mam pretend-agent "), "{}", r.stdout());
    assert!(td.mam().args(["--help"]).run().stdout().contains("  pretend-agent "));
    let r = td.mam().args(["test-double", "agent", "--help"]).run_within(std::time::Duration::from_secs(5));
    assert_eq!(r.rc(), 0, "{}", r.stderr());
    assert!(r.stdout().starts_with("Usage: mam test-double ") && r.stdout().contains("mam pretend-agent --help"));
}

/// Issue 32 item 4: no broker running does not go unnoticed. `mam create` warns once, in one short
/// line that says how to start one; delegate-job's warnings are one message per line (never the
/// subscriber's retries joined into one).
#[test]
fn no_broker_is_one_short_warning_each() {
    use std::time::Duration;
    let td = TestDir::new("nobroker_create");
    let port = free_port().to_string();
    let script = td.write("w1.script", "work_s=4\nreport_text=done\n");
    let env = [
        ("MAM_PANE_BACKEND", "fake".to_string()),
        ("MAM_FAKE_PANES_DIR", td.path("panes").display().to_string()),
        ("MQTT_PORT", port.clone()),
        ("MAM_FAKE_AGENT_SCRIPT", script.display().to_string()),
    ];
    let mam = || {
        let mut c = td.mam();
        for (k, v) in &env {
            c = c.env(k, v);
        }
        c
    };
    let r = mam().args(["create", "claude", "--name", "w1", "--no-onboard", "--", "test-double", "agent"]).run();
    r.expect_rc(0);
    let pid: i32 = std::fs::read_to_string(td.path("panes/panes").join(kv(&r.stdout(), "PANE")).join("pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    struct Kill(i32);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = mam::sys::kill(-self.0, 9);
        }
    }
    let _agent = Kill(pid);
    let err = r.stderr();
    let warnings: Vec<&str> = err.lines().filter(|l| l.starts_with("WARNING:")).collect();
    assert_eq!(warnings.len(), 1, "{err}");
    let w = warnings[0];
    assert!(w.starts_with(&format!("WARNING: no broker answers at 127.0.0.1:{port} (")), "{w}");
    assert!(w.contains("start one with `mam broker &`") && w.len() < 220, "{} chars: {w}", w.len());

    let task = td.write("task.md", "Say hi.\n");
    let r = mam()
        .args(["delegate-job", "--session", "w1", "--brief-file"])
        .args([&task])
        .args(["--heartbeat", "1", "--heartbeat-misses", "10", "--ack-timeout", "5", "--timeout", "60"])
        .run_within(Duration::from_secs(60));
    r.expect_rc(0);
    let err = r.stderr();
    let id = kv(&r.stdout(), "JOB_ID");
    let _timers = TimerGuard(id.clone());
    assert!(err.contains(&format!("WARNING: job {id}: no broker answers (cannot connect to broker")), "{err}");
    for l in err.lines() {
        let prefixes = ["WARNING:", "ERROR:", "NOTE:"].iter().map(|p| l.matches(p).count()).sum::<usize>();
        assert!(prefixes == 1 && !l.contains(" | ") && l.len() < 300, "one message per line: {l}");
    }
}

/// Issue 32 item 6: `mam status` shows each session's latest jobs (every open one and the latest
/// three finished, oldest first), not only its onboarding job; `--help` explains every state word.
#[test]
fn status_shows_each_session_s_latest_jobs() {
    let td = TestDir::new("status_latest");
    let script = td.write("w1.script", "");
    let mam = || {
        td.mam()
            .env("MAM_PANE_BACKEND", "fake")
            .env("MAM_FAKE_PANES_DIR", td.path("panes"))
            .env("MAM_FAKE_AGENT_SCRIPT", &script)
            .env("MQTT_PORT", "1")
    };
    let r = mam().args(["create", "claude", "--name", "w1", "--no-onboard", "--", "test-double", "agent"]).run();
    r.expect_rc(0);
    let pid: i32 = std::fs::read_to_string(td.path("panes/panes").join(kv(&r.stdout(), "PANE")).join("pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    struct Kill(i32);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = mam::sys::kill(-self.0, 9);
        }
    }
    let _agent = Kill(pid);
    let mut ids = Vec::new();
    for n in 0..5 {
        let r = mam().args(["registry", "register", "--session", "w1"]).run();
        r.expect_rc(0);
        let id = r.stdout().trim().to_string();
        if n < 4 {
            mam().args(["registry", "finalize", &id, "--status", "cancelled", "--no-publish"]).run().expect_rc(0);
        }
        ids.push(id);
        // created_at has millisecond resolution: keep the order unambiguous.
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let out = mam().args(["status"]).run().stdout();
    let jobs: Vec<&str> = out.lines().filter(|l| l.starts_with("  job ")).collect();
    let want: Vec<String> = vec![
        format!("  job {} task cancelled", ids[1]),
        format!("  job {} task cancelled", ids[2]),
        format!("  job {} task cancelled", ids[3]),
        format!("  job {} task pending", ids[4]),
    ];
    assert_eq!(jobs, want, "{out}");
    let help = mam().args(["status", "--help"]).run().stdout();
    for word in ["running:", "gone:", "unknown:", "working:", "idle:", "done:", "blocked:", "stopped"] {
        assert!(help.contains(word), "--help explains `{word}`: {help}");
    }
}

/// Issue 32 item 3, the second half: a second `mam broker` in the same repository is refused in
/// one line (exit 2, nothing started) naming the running broker's pid and port; it used to move
/// to a free port and take the repository's clients with it. Once that broker is dead (kill -9:
/// no clean shutdown), the next `mam broker` starts as usual.
#[test]
fn i32_a_second_broker_of_one_repository_is_refused_unless_the_first_is_dead() {
    use std::time::Duration;
    let td = TestDir::new("onebroker");
    let cred = td.ws().join(".mam/broker.cred");
    let start = || {
        let mut b = td.mam().args(["broker"]).spawn_bg(&td, "broker");
        b.wait_stdout("mam broker listening on 127.0.0.1:", Duration::from_secs(20));
        let port: u16 = b.stdout().lines().next().unwrap().rsplit(':').next().unwrap().parse().unwrap();
        (b, port)
    };
    let (mut first, port) = start();
    let before = std::fs::read(&cred).unwrap();
    let r = td.mam().args(["broker"]).run_within(Duration::from_secs(20));
    r.expect_rc(2);
    let err = r.stderr();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("REFUSED: mam broker: this repository's broker already runs"), "{err}");
    assert!(err.contains(&format!("pid {}, port {port}", first.pid())) && err.contains("nothing started"), "{err}");
    assert!(r.stdout().is_empty(), "{}", r.stdout());
    assert_eq!(std::fs::read(&cred).unwrap(), before, "the refused broker changed the credential file");
    // The first one still serves the repository.
    td.mam().args(["pub", "-t", "x/y", "-m", "still here"]).run().expect_rc(0);
    first.signal(9);
    first.wait(Duration::from_secs(10));
    let (mut again, _) = start();
    assert!(!again.stderr().contains("REFUSED"), "{}", again.stderr());
    td.mam().args(["pub", "-t", "x/y", "-m", "the new one"]).run().expect_rc(0);
    again.signal(15);
    again.wait(Duration::from_secs(10));
}
