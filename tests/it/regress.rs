//! Regression tests for the bugs of issue 10, each named after the bug it pins.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::*;

/// True while `pid` is a live (non-zombie) process.
fn alive(pid: i32) -> bool {
    matches!(mam::sys::proc_start_ticks(pid), Ok((_, false)))
}

/// Writes an executable shell script at `rel`.
fn script(td: &TestDir, rel: &str, body: &str) -> std::path::PathBuf {
    let p = td.write(rel, format!("#!/bin/sh\n{body}"));
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

#[test]
fn openssl_probe_that_hangs_fails_within_the_connect_timeout() {
    let td = TestDir::new("regress-probe");
    let pids = td.path("probe.pids");
    // `-help` hangs, in a child that holds the pipes too; a connect must not wait for it.
    let fake = script(&td, "hung-openssl", &format!("sleep 30 &\necho $$ $! > {}\nwait\n", pids.display()));
    let port = free_port().to_string();
    let ctx = mam::ctx::Ctx::with_env(
        [
            ("MQTT_TLS", "1"),
            ("MQTT_BROKER", "127.0.0.1"),
            ("MQTT_PORT", port.as_str()),
            ("MAM_MQTT_CONNECT_TIMEOUT_S", "1"),
            ("MAM_OPENSSL", fake.to_str().unwrap()),
            ("PATH", "/usr/bin:/bin"),
        ],
        Path::new("/"),
    );
    let cfg = mam::mqtt::MqttConfig::from_ctx(&ctx).unwrap();
    let started = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = mam::mqtt::Client::connect(&cfg, mam::mqtt::Role::Pub, &mam::mqtt::Stop::never()).map(|_| ());
        let _ = tx.send(r.map_err(|e| e.to_string()));
    });
    let r = rx.recv_timeout(Duration::from_secs(10)).expect("connect returned within 10 s");
    let took = started.elapsed();
    let e = r.expect_err("a hung openssl probe fails the connect");
    assert!(took < Duration::from_millis(2500), "took {took:?}: {e}");
    assert!(e.contains("openssl probe"), "the error names the phase: {e}");
    let text = std::fs::read_to_string(&pids).unwrap();
    for pid in text.split_whitespace().map(|s| s.parse::<i32>().unwrap()) {
        wait_until("the probe's processes to end", Duration::from_secs(5), || !alive(pid));
    }
}

#[test]
fn kill_refuses_a_planted_pid_of_one() {
    let td = TestDir::new("regress-kill");
    // A sentinel of ours that a kill(-1, SIGTERM) would take down.
    let mut sentinel = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    let spid = sentinel.id() as i32;
    let fake = td.path("fake-panes");
    for (pane, pid) in [("f000001", "1"), ("f000002", "0"), ("f000003", "-1")] {
        td.write(&format!("fake-panes/panes/{pane}/pid"), pid);
        td.write(&format!("fake-panes/panes/{pane}/workspace"), "w000001");
    }
    let close = |pane: &str| {
        td.mam()
            .args(["pane", "close", "--pane", pane])
            .env("MAM_PANE_BACKEND", "fake")
            .env("MAM_FAKE_PANES_DIR", &fake)
            .run()
    };
    let r = close("f000001");
    assert_ne!(r.rc(), 0, "a pid of 1 is refused\n{}", r.stderr());
    assert!(r.stderr().contains("refusing to send signal 15 to pid -1"), "{}", r.stderr());
    assert!(fake.join("panes/f000001").is_dir(), "the refused pane is kept");
    // 0 and -1 are not live agents: nothing signalled, the pane goes.
    close("f000002").expect_rc(0);
    close("f000003").expect_rc(0);
    assert!(alive(spid), "nothing was signalled");
    let _ = sentinel.kill();
    let _ = sentinel.wait();
}

#[test]
fn close_reason_has_no_error_prefix() {
    let td = TestDir::new("regress-reason");
    let task = td.write("task.md", "t\n");
    // A remote job with no broker: `mam remote dispatch` fails with an `ERROR:` line, and the job
    // closes broker_unavailable with a reason quoting it.
    let r = td
        .mam()
        .args(["delegate-job", "--session", "remote:r1", "--timeout", "60", "--brief-file"])
        .args([&task])
        .env("MQTT_PORT", free_port().to_string())
        .env("MAM_MQTT_CONNECT_TIMEOUT_S", "1")
        .env("MAM_DISPATCH_SECRET", rand_hex(16))
        .run();
    r.expect_rc(5);
    let ids: Vec<String> = std::fs::read_dir(td.ws().join(".mam/jobs"))
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().strip_suffix(".json").map(str::to_string))
        .collect();
    assert_eq!(ids.len(), 1, "{ids:?}");
    let rec = read_record(&td, &ids[0]);
    assert_eq!(rec["status"], "broker_unavailable", "{rec}");
    let text = rec.to_string();
    assert!(text.contains("dispatch failed ("), "{text}");
    assert!(!text.contains("ERROR:"), "the close reason carries no ERROR: prefix: {text}");
    for l in r.stderr().lines() {
        assert!(!l.get(1..).unwrap_or("").contains("ERROR:"), "one prefix per line: {l}");
    }
}

/// Kills the fake agents' process groups and stops the control root's daemon on drop.
struct FakeWorld<'a> {
    td: &'a TestDir,
}

impl FakeWorld<'_> {
    fn mam(&self) -> Cmd {
        self.td
            .mam()
            .env("MAM_PANE_BACKEND", "fake")
            .env("MAM_FAKE_PANES_DIR", self.td.path("panes"))
            .env("MQTT_PORT", "1")
            .env("MAM_AGENT_START_TIMEOUT_MS", "20000")
            .env("MAM_PUBLISH_BUDGET_S", "1")
    }
}

impl Drop for FakeWorld<'_> {
    fn drop(&mut self) {
        let _ = self.mam().args(["daemon", "stop", "--workspace"]).args([self.td.ws()]).run();
        for e in std::fs::read_dir(self.td.path("panes/panes")).into_iter().flatten().flatten() {
            if let Some(pid) = std::fs::read_to_string(e.path().join("pid")).ok().and_then(|s| s.trim().parse().ok()) {
                let pid: i32 = pid;
                if pid > 1 {
                    let _ = mam::sys::kill(-pid, 9);
                }
            }
        }
    }
}

#[test]
fn create_prints_daemon_pid_of_the_running_daemon() {
    let td = TestDir::new("regress-daemon-pid");
    let w = FakeWorld { td: &td };
    let r = w
        .mam()
        .args(["create", "claude", "--name", "s1", "--no-onboard", "--", "test-double", "agent"])
        .env_remove("MAM_NO_SUBSCRIBER_DAEMON")
        .run();
    r.expect_rc(0);
    let line = r.stdout().lines().find(|l| l.starts_with("DAEMON_PID=")).map(str::to_string);
    let line = line.unwrap_or_else(|| panic!("no DAEMON_PID= line\n{}--- stderr\n{}", r.stdout(), r.stderr()));
    let pid: i32 = line["DAEMON_PID=".len()..].parse().unwrap_or_else(|_| panic!("bad line {line:?}"));
    assert!(alive(pid), "DAEMON_PID={pid} is running");
    let st = w.mam().args(["daemon", "status", "--workspace"]).args([td.ws()]).run();
    st.expect_rc(0);
    assert_eq!(st.stdout().trim(), pid.to_string(), "the printed pid is the control root's daemon");
}

/// Waits for `child` within `limit` (killed and failed otherwise); returns its exit code.
fn wait_rc(child: &mut std::process::Child, limit: Duration) -> i32 {
    wait_exit("the command to exit", child, limit).code().unwrap_or(-1)
}

#[test]
fn stdout_write_error_other_than_epipe_fails() {
    let td = TestDir::new("regress-devfull");
    register_job(&td, &[], &[]);
    let mut c = td.mam().args(["registry", "list"]);
    c.cmd.stdout(std::fs::File::create("/dev/full").unwrap()).stderr(std::process::Stdio::piped());
    let mut child = c.cmd.spawn().unwrap();
    let rc = wait_rc(&mut child, Duration::from_secs(30));
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(rc, 1, "a full stdout is a runtime failure: {err}");
    assert!(err.starts_with("ERROR: cannot write to stdout: "), "{err}");
}

#[test]
fn stdout_closed_early_ends_sub_cleanly_with_disconnect() {
    if !have_tool("mosquitto", "MAM_REQUIRE_MOSQUITTO") {
        return;
    }
    let td = TestDir::new("regress-epipe");
    let m = Mosquitto::start(&td, anonymous);
    let mut c = td.mam().args(["sub", "-t", "epipe/x"]).env("MQTT_PORT", m.port.to_string());
    c.cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::null());
    let mut child = c.cmd.spawn().unwrap();
    // The reader goes away before anything is printed.
    drop(child.stdout.take());
    let mut id = String::new();
    wait_until("mam sub to subscribe", Duration::from_secs(10), || {
        let log = m.log_text();
        match log.lines().find_map(|l| l.split("Received SUBSCRIBE from ").nth(1)) {
            Some(i) => {
                id = i.trim().to_string();
                true
            }
            None => false,
        }
    });
    publish_raw(m.port, "epipe/x", b"hello", false);
    let rc = wait_rc(&mut child, Duration::from_secs(10));
    assert_eq!(rc, 0, "a closed pipe ends the command with 0");
    wait_until("the sub's DISCONNECT", Duration::from_secs(5), || {
        m.log_text().contains(&format!("Received DISCONNECT from {id}"))
    });
}
