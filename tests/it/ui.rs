//! `mam ui` (issue 22) in a real terminal: a pane of a private tmux server (the person's terminal)
//! runs it against the demo's setup (the embedded broker, fake agents in panes of another private
//! tmux server). Keys go in with `tmux send-keys`, the screen comes out with `capture-pane -p`.
//! Checked: a job going silent is marked within a second of its idle window running out; Enter
//! lands in the agent's pane and coming back finds the same place; q, SIGTERM, SIGHUP and a panic
//! restore the terminal (`stty -a` before and after, the alternate screen left); a resize redraws
//! to exactly the layout at the new size; 200 jobs scroll; idle CPU with 200 jobs; the plain table
//! when stdout is not a terminal.

use std::fs;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mam::registry::engine::{Authority, Kind, Request};
use mam::registry::store::Store;
use serde_json::Value;

use crate::support::*;

/// A private tmux server; killed (with everything in its panes) on drop.
struct Tmux {
    sock: String,
    conf: PathBuf,
}

impl Tmux {
    fn new(td: &TestDir, what: &str) -> Tmux {
        let sock = format!("mam-test-{what}-{}", rand_hex(4));
        let conf = td.write(
            &format!("{what}.tmux.conf"),
            "set -g status off\nset -g escape-time 0\nset -g history-limit 5000\n",
        );
        Tmux { sock, conf }
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new("tmux");
        c.args(["-L", &self.sock, "-f"]).arg(&self.conf);
        c.env_remove("TMUX").stdin(Stdio::null());
        c
    }

    /// `tmux ARGS` that must succeed; its stdout.
    fn run(&self, args: &[&str]) -> String {
        let out = self.cmd().args(args).output().unwrap();
        assert!(out.status.success(), "tmux {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The visible screen of `target`, one line per row, trailing spaces off.
    fn capture(&self, target: &str) -> String {
        let out = self.cmd().args(["capture-pane", "-p", "-t", target]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines().map(|l| l.trim_end().to_string()).collect::<Vec<_>>().join("\n") + "\n"
    }

    fn keys(&self, target: &str, keys: &[&str]) {
        let mut a = vec!["send-keys", "-t", target];
        a.extend_from_slice(keys);
        self.run(&a);
    }

    fn display(&self, target: &str, format: &str) -> String {
        self.run(&["display-message", "-p", "-t", target, format]).trim().to_string()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd().args(["kill-server"]).output();
        let dir = std::env::var_os("TMUX_TMPDIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/tmp"));
        let _ = fs::remove_file(dir.join(format!("tmux-{}", mam::sys::getuid())).join(&self.sock));
    }
}

/// The world of one test: a control root, the environment every mam command and the screen get,
/// and (optionally) the embedded broker and the agents' tmux server.
struct World {
    td: TestDir,
    env: Vec<(String, String)>,
    broker: Option<Background>,
    agents: Option<Tmux>,
}

impl World {
    fn new(name: &str) -> Option<World> {
        if !have_tool("tmux", "MAM_REQUIRE_TMUX") {
            return None;
        }
        let td = TestDir::new(name);
        // The fake agent as `claude` (A18): the mam binary, `-- test-double agent` in its arguments.
        let (_, path) = claude_is_mam(&td);
        let env = vec![
            ("PATH".to_string(), path),
            ("HOME".to_string(), td.path("home").display().to_string()),
            ("MAM_ENV_FILE".to_string(), td.path("absent.env").display().to_string()),
            ("MAM_NO_SUBSCRIBER_DAEMON".to_string(), "1".to_string()),
            ("MAM_PANE_BACKEND".to_string(), "tmux".to_string()),
            ("MAM_TMUX_STABLE_MS".to_string(), "200".to_string()),
            ("MAM_STARTUP_DIALOG_SETTLE_MS".to_string(), "50".to_string()),
            ("MAM_FAKE_AGENT_SCRIPT".to_string(), td.path("agent.script").display().to_string()),
            ("MAM_PUBLISH_BUDGET_S".to_string(), "1".to_string()),
            ("MQTT_PORT".to_string(), "1".to_string()),
        ];
        td.write("agent.script", "");
        Some(World { td, env, broker: None, agents: None })
    }

    fn set(&mut self, k: &str, v: &str) {
        self.env.retain(|(a, _)| a != k);
        self.env.push((k.to_string(), v.to_string()));
    }

    fn mam<I: IntoIterator<Item = S>, S: AsRef<std::ffi::OsStr>>(&self, args: I) -> Cmd {
        let mut c = self.td.mam().args(args);
        for (k, v) in &self.env {
            c = c.env(k, v);
        }
        c
    }

    /// `mam broker --port 0` in the control root (it writes .mam/broker.cred, which the screen and
    /// every command find), as the demo does.
    fn broker(&mut self) {
        let mut b = self.mam(["broker", "--port", "0"]).spawn_bg(&self.td, "broker");
        b.wait_stdout("listening on", Duration::from_secs(10));
        let out = b.stdout();
        let line = out.lines().find(|l| l.contains("listening on")).unwrap();
        let port = line.trim().rsplit(':').next().unwrap().to_string();
        self.set("MQTT_PORT", &port);
        self.broker = Some(b);
    }

    /// A fake agent session `name` on the agents' tmux server; its pane id.
    fn session(&mut self, name: &str) -> String {
        if self.agents.is_none() {
            let t = Tmux::new(&self.td, "agents");
            self.set("MAM_TMUX_SOCKET", &t.sock);
            self.agents = Some(t);
        }
        let r = self.mam(["create", "claude", "--no-onboard", "--name", name, "--", "test-double", "agent"]).run();
        r.expect_rc(0);
        kv(&r.stdout(), "PANE")
    }

    fn store(&self) -> Store {
        Store::new(self.td.ws().join(".mam/jobs"), self.td.ws().join(".mam/delegate_job_logs"))
    }

    /// Registers a job for `session` with `flags`; its id.
    fn job(&self, session: &str, flags: &[&str]) -> String {
        let r = self.mam(["registry", "register", "--session", session]).args(flags).run();
        r.expect_rc(0);
        r.stdout().trim().to_string()
    }

    /// The agent's side of one transition, through the engine (as `mam publish` would).
    fn agent(&self, kind: Kind, id: &str) {
        let rec = read_record(&self.td, id);
        let mut req = Request::new(kind, Authority::Agent, id);
        req.attempt = rec["attempt"].as_u64();
        req.dispatch_token = rec["dispatch_token"].as_str().map(String::from);
        req.alloc_seq = true;
        self.store().apply(&req, mam::clock::now_ms()).unwrap();
    }

    /// The script a screen pane runs: the environment, `stty -a` before and after, the exit code.
    fn screen_script(&self, extra: &str, inside_tmux: bool) -> PathBuf {
        let mut s = String::from("#!/usr/bin/env bash\n");
        for (k, v) in &self.env {
            s.push_str(&format!("export {k}='{v}'\n"));
        }
        if !inside_tmux {
            s.push_str("unset TMUX\n");
        }
        let d = self.td.root.display();
        s.push_str(&format!(
            "cd '{ws}'\nstty -a >'{d}/stty.before'\n{extra}'{mam}' ui\necho $? >'{d}/ui.rc'\nstty -a >'{d}/stty.after'\nexec sleep 60\n",
            ws = self.td.ws().display(),
            mam = mam_bin().display(),
        ));
        let p = self.td.write(&format!("screen-{}.sh", rand_hex(3)), s);
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    /// A terminal of `cols` x `rows` running `mam ui`; the tmux server and the target pane.
    fn screen(&self, cols: u16, rows: u16, extra: &str, inside_tmux: bool) -> (Tmux, String) {
        let t = Tmux::new(&self.td, "screen");
        let script = self.screen_script(extra, inside_tmux);
        let (c, r) = (cols.to_string(), rows.to_string());
        t.run(&["new-session", "-d", "-s", "ui", "-x", &c, "-y", &r, &script.display().to_string()]);
        let pane = t.display("ui", "#{pane_id}");
        (t, pane)
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.td.path(rel)
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if let Some(b) = &mut self.broker {
            b.signal(libc::SIGTERM);
            let _ = b.wait(Duration::from_secs(5));
        }
    }
}

/// Waits until the screen shows `needle`; the screen.
fn wait_screen(t: &Tmux, pane: &str, what: &str, limit: Duration, cond: impl Fn(&str) -> bool) -> String {
    let mut last = String::new();
    let got = poll(limit, || {
        last = t.capture(pane);
        cond(&last).then(|| last.clone())
    });
    got.unwrap_or_else(|| panic!("timed out after {limit:?} waiting for {what}; the screen:\n{last}"))
}

/// The pid of the `mam ui` the pane's shell runs.
fn ui_pid(t: &Tmux, pane: &str) -> i32 {
    let shell: i32 = t.display(pane, "#{pane_pid}").parse().unwrap();
    wait_for("the mam ui process", Duration::from_secs(5), || {
        mam::sys::list_pids().unwrap_or_default().into_iter().find(|&p| {
            mam::sys::proc_ppid(p).ok() == Some(shell)
                && mam::sys::proc_cmdline(p).is_ok_and(|a| a.get(1).map(|x| x.as_slice()) == Some(b"ui"))
        })
    })
}

/// Issue 22: a running job whose evidence stops is marked SILENT within a second of its idle window
/// running out, on a screen that reads the demo's embedded broker (footer: connected).
#[test]
fn ui_marks_a_job_silent_within_a_second_of_its_idle_window() {
    let Some(mut w) = World::new("ui-silent") else { return };
    w.broker();
    w.session("worker-ok");
    let done = w.job("worker-ok", &[]);
    w.agent(Kind::Claim, &done);
    w.mam(["registry", "status", &done, "--set", "completed", "--no-publish"]).run().expect_rc(0);
    let busy = w.job("worker-ok", &[]);
    w.agent(Kind::Claim, &busy);
    w.agent(Kind::Beat, &busy);
    let id = w.job("worker-crash", &["--heartbeat-sec", "1", "--idle-timeout", "3"]);
    let (t, pane) = w.screen(80, 24, "", true);
    wait_screen(&t, &pane, "the jobs, the session, a connected broker", Duration::from_secs(10), |s| {
        s.contains(&id) && s.contains("connected  registry") && s.contains(" idle ")
    });
    w.agent(Kind::Claim, &id);
    let rec = mam::registry::record::Record::parse(&fs::read(w.store().record_path(&id)).unwrap()).unwrap();
    let evidence = mam::daemon::sweep::last_evidence_ms(&rec, None).unwrap();
    let deadline = evidence + 3_000;
    let row = |s: &str| s.lines().find(|l| l.len() > 2 && l[2..].starts_with(&id)).unwrap_or("").to_string();
    let alive = wait_screen(&t, &pane, "the claimed job alive", Duration::from_secs(3), |s| row(s).contains("alive"));
    assert!(mam::clock::now_ms() < deadline, "alive was only seen after the window: {alive}");
    let screen = wait_screen(&t, &pane, "the job marked SILENT", Duration::from_secs(6), |s| row(s).contains("SILENT"));
    let seen = mam::clock::now_ms();
    let late = seen as i64 - deadline as i64;
    eprintln!("SILENT shown {late} ms after the idle window ran out\n{screen}");
    assert!((0..1000).contains(&late), "SILENT {late} ms after the window ran out:\n{screen}");
    assert!(row(&screen).contains("running") && row(&screen).contains("!!!!!!"), "{screen}");
    assert!(screen.lines().next().unwrap().contains("1 silent"), "{screen}");
    let busy_row = screen.lines().find(|l| l[2..].starts_with(&busy)).unwrap();
    assert!(busy_row.contains("alive") && !busy_row.contains("SILENT"), "{screen}");
    let session = screen.lines().find(|l| l.contains("worker-ok") && l.contains("claude")).unwrap();
    assert!(session.contains(&format!("{busy} running")), "the session's open job: {screen}");
    assert!(screen
        .contains(&format!("broker 127.0.0.1:{} connected", w.env.iter().find(|(k, _)| k == "MQTT_PORT").unwrap().1)));
}

/// Issue 22: Enter takes the person to the agent's pane and back to the same place: from inside
/// tmux (a new window of theirs with a client of the agents' server), and from a plain terminal
/// (the screen hands the terminal to `tmux attach` and takes it back when the person detaches).
#[test]
fn ui_enter_lands_in_the_agents_pane_and_comes_back_to_the_same_place() {
    let Some(mut w) = World::new("ui-enter") else { return };
    let _p1 = w.session("w1");
    let p2 = w.session("w2");
    let agents_tmux = || w.agents.as_ref().unwrap();
    let client_pane = || {
        let out = agents_tmux().cmd().args(["list-clients", "-F", "#{client_tty} #{pane_id}"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).lines().next().map(|l| {
            let (tty, pane) = l.split_once(' ').unwrap();
            (tty.to_string(), pane.to_string())
        })
    };
    for inside in [true, false] {
        let (t, pane) = w.screen(100, 24, "", inside);
        let before = wait_screen(&t, &pane, "both sessions listed", Duration::from_secs(10), |s| {
            s.contains("w1") && s.contains("w2") && s.lines().filter(|l| l.contains("idle")).count() == 2
        });
        t.keys(&pane, &["j"]);
        assert!(before.contains("> w1"), "the first session is selected: {before}");
        let before = wait_screen(&t, &pane, "w2 selected", Duration::from_secs(5), |s| s.contains("> w2"));
        t.keys(&pane, &["Enter"]);
        let (tty, at) = wait_for("a client on the agents' server", Duration::from_secs(10), client_pane);
        assert_eq!(at, p2, "the client shows w2's pane");
        if inside {
            // The person's own server switched to the new window of the nested client.
            assert_eq!(t.display("ui", "#{window_name}"), "mam:w2");
        } else {
            // The screen's own terminal now shows the agent (the fake claude's input line).
            wait_screen(&t, &pane, "the agent's screen in the terminal", Duration::from_secs(5), |s| {
                !s.contains("> w2")
            });
            assert_eq!(t.display(&pane, "#{alternate_on}"), "1", "tmux attach draws on its own alternate screen");
        }
        agents_tmux().run(&["detach-client", "-t", &tty]);
        let after = wait_screen(&t, &pane, "the screen back", Duration::from_secs(10), |s| s.contains("> w2"));
        if inside {
            let active = t.display("ui", "#{window_name}");
            assert!(!active.starts_with("mam:"), "the nested client's window closed: {active}");
        } else {
            assert!(after.contains("back from w2"), "{after}");
        }
        // The same place: the selection, and the same rows above it.
        let upto = |s: &str| s.lines().take_while(|l| !l.starts_with("> ")).map(str::to_string).collect::<Vec<_>>();
        assert_eq!(upto(&after), upto(&before), "before:\n{before}\nafter:\n{after}");
        t.keys(&pane, &["q"]);
        wait_until("the screen quits", Duration::from_secs(5), || w.path("ui.rc").exists());
        fs::remove_file(w.path("ui.rc")).unwrap();
    }
    w.mam(["stop", "w1", "w2"]).run().expect_rc(0);
}

/// Issue 22: q, SIGTERM, SIGHUP and a panic all give the terminal back as it was: the same
/// `stty -a`, the alternate screen left, the cursor shown.
#[test]
fn ui_restores_the_terminal_on_every_way_out() {
    let Some(w) = World::new("ui-restore") else { return };
    w.job("w1", &[]);
    for how in ["q", "ctrl-c", "TERM", "HUP", "panic"] {
        let extra = if how == "panic" { "export MAM_TEST_UI_PANIC_KEY=P\n" } else { "" };
        let (t, pane) = w.screen(80, 24, extra, true);
        wait_screen(&t, &pane, "the screen", Duration::from_secs(10), |s| s.starts_with("mam ui"));
        assert_eq!(t.display(&pane, "#{alternate_on}"), "1", "{how}: the screen is on the alternate screen");
        assert_eq!(t.display(&pane, "#{cursor_flag}"), "0", "{how}: the cursor is hidden");
        let mode_during = Command::new("stty")
            .arg("-a")
            .stdin(fs::File::open(t.display(&pane, "#{pane_tty}")).unwrap())
            .output()
            .unwrap();
        let during = String::from_utf8_lossy(&mode_during.stdout).into_owned();
        assert!(during.contains("-icanon") && during.contains("-echo "), "{how}: raw mode: {during}");
        match how {
            "q" => t.keys(&pane, &["q"]),
            "ctrl-c" => t.keys(&pane, &["C-c"]),
            "panic" => t.keys(&pane, &["P"]),
            sig => {
                let pid = ui_pid(&t, &pane);
                mam::sys::kill(pid, if sig == "TERM" { libc::SIGTERM } else { libc::SIGHUP }).unwrap();
            }
        }
        wait_until(&format!("{how}: the screen exits"), Duration::from_secs(5), || w.path("stty.after").exists());
        let rc = fs::read_to_string(w.path("ui.rc")).unwrap().trim().to_string();
        // The test hook panics where it cannot unwind: the hook alone restores, then SIGABRT
        // (what a release build, `panic = "abort"`, does on any panic).
        let want = if how == "panic" { "134" } else { "0" };
        assert_eq!(rc, want, "{how}: exit code");
        let before = fs::read_to_string(w.path("stty.before")).unwrap();
        wait_until("stty -a written", Duration::from_secs(2), || {
            fs::read_to_string(w.path("stty.after")).is_ok_and(|s| s.contains("eol2"))
        });
        let after = fs::read_to_string(w.path("stty.after")).unwrap();
        assert_eq!(before, after, "{how}: stty -a before and after differ");
        assert_eq!(t.display(&pane, "#{alternate_on}"), "0", "{how}: the alternate screen is left");
        assert_eq!(t.display(&pane, "#{cursor_flag}"), "1", "{how}: the cursor is shown");
        if how == "panic" {
            // The message, then the backtrace of the abort: the whole history of the pane.
            let out = t.cmd().args(["capture-pane", "-p", "-S", "-", "-t", &pane]).output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(text.contains("MAM_TEST_UI_PANIC_KEY pressed"), "the panic message is readable: {text}");
        }
        for f in ["stty.before", "stty.after", "ui.rc"] {
            fs::remove_file(w.path(f)).unwrap();
        }
    }
}

/// The screen of `mam ui --snapshot COLSxROWS` (the same data, drawn once as text).
fn snapshot(w: &World, cols: u16, rows: u16) -> String {
    let r = w.mam(["ui", "--snapshot", &format!("{cols}x{rows}")]).run();
    r.expect_rc(0);
    r.stdout()
}

/// Issue 22: after a resize the screen is exactly the layout at the new size (what `--snapshot`
/// draws for that size), with nothing left of the old one: smaller, then larger.
#[test]
fn ui_redraws_to_the_new_size_without_garbage() {
    let Some(w) = World::new("ui-resize") else { return };
    // Data that does not change with the clock: finished jobs only.
    for (s, st) in [("worker-a", "completed"), ("worker-b", "failed"), ("worker-c", "cancelled")] {
        for _ in 0..4 {
            let id = w.job(s, &[]);
            w.agent(Kind::Claim, &id);
            w.mam(["registry", "status", &id, "--set", st, "--no-publish"]).run().expect_rc(0);
        }
    }
    let (t, pane) = w.screen(120, 30, "", true);
    let want = snapshot(&w, 120, 30);
    wait_screen(&t, &pane, "the 120x30 layout", Duration::from_secs(10), |s| s == want);
    for (c, r) in [(80u16, 24u16), (100, 40), (60, 12)] {
        let want = snapshot(&w, c, r);
        assert_eq!(want.lines().count(), r as usize);
        t.run(&["resize-window", "-t", "ui", "-x", &c.to_string(), "-y", &r.to_string()]);
        let got = poll(Duration::from_secs(5), || {
            let s = t.capture(&pane);
            (s == want).then_some(s)
        });
        let now = t.capture(&pane);
        assert!(got.is_some(), "at {c}x{r} the screen is not the layout:\n--- want\n{want}--- got\n{now}");
    }
    t.keys(&pane, &["q"]);
}

/// Writes `n` running jobs into the registry: one registered and claimed through mam, the others
/// its record under new ids (and an events.log each), created in id order.
fn clone_jobs(w: &World, n: usize, prefix: &str) -> Vec<String> {
    let id = w.job("worker", &["--heartbeat-sec", "30"]);
    w.agent(Kind::Claim, &id);
    let rec: Value = read_record(&w.td, &id);
    let reg = w.td.ws().join(".mam/jobs");
    let mut ids = Vec::new();
    for i in 0..n {
        let nid = format!("{prefix}{i:05}");
        let mut r = rec.clone();
        r["job_id"] = Value::String(nid.clone());
        fs::write(reg.join(format!("{nid}.json")), serde_json::to_vec(&r).unwrap()).unwrap();
        fs::create_dir_all(reg.join(&nid)).unwrap();
        fs::write(reg.join(&nid).join("events.log"), b"{\"ts\":\"x\"}\n").unwrap();
        ids.push(nid);
    }
    fs::remove_file(reg.join(format!("{id}.json"))).unwrap();
    ids
}

/// Issue 22: 200 jobs scroll: the selection moves past the first screen and the rows follow it.
#[test]
fn ui_scrolls_through_200_jobs() {
    let Some(w) = World::new("ui-scroll") else { return };
    let ids = clone_jobs(&w, 200, "a");
    let (t, pane) = w.screen(80, 24, "", true);
    let first = wait_screen(&t, &pane, "200 jobs", Duration::from_secs(10), |s| s.contains("200 jobs"));
    assert!(first.contains(&format!("> {}", ids[0])), "{first}");
    assert!(first.contains("of 200"), "{first}");
    let mut keys = vec!["j"; 30];
    keys.push("Down");
    t.keys(&pane, &keys);
    let s = wait_screen(&t, &pane, "the 32nd job selected", Duration::from_secs(5), |s| {
        s.contains(&format!("> {}", ids[31]))
    });
    assert!(!s.contains(&ids[0]), "the first rows scrolled away:\n{s}");
    t.keys(&pane, &["G"]);
    let s = wait_screen(&t, &pane, "the last job selected", Duration::from_secs(5), |s| {
        s.contains(&format!("> {}", ids[199]))
    });
    assert!(s.lines().any(|l| l.contains("of 200") && l.contains("-200 ")), "{s}");
    t.keys(&pane, &["/", "a0019", "Enter"]);
    // The whole filtered frame (a capture may catch the redraw half done).
    let filtered = |s: &str| s.lines().filter(|l| l.starts_with("  a0019") || l.starts_with("> a0019")).count();
    let s = wait_screen(&t, &pane, "the filter", Duration::from_secs(5), |s| {
        s.contains("filter: a0019") && filtered(s) == 10
    });
    let rows = filtered(&s);
    assert_eq!(rows, 10, "{s}");
    t.keys(&pane, &["q"]);
}

/// Issue 22 done-means: an idle `mam ui` with 200 jobs on the screen uses under 1% of a core
/// (utime + stime of the process from /proc/<pid>/stat over 10 s; docs/PERFORMANCE.md).
#[test]
fn ui_idle_cpu_with_200_jobs_is_under_one_percent() {
    let Some(mut w) = World::new("ui-cpu") else { return };
    w.broker();
    clone_jobs(&w, 200, "c");
    let (t, pane) = w.screen(80, 24, "", true);
    wait_screen(&t, &pane, "200 jobs, broker connected", Duration::from_secs(10), |s| {
        s.contains("200 jobs") && s.contains(" connected  ")
    });
    let pid = ui_pid(&t, &pane);
    let (own0, kids0, hz) = mam::sys::proc_cpu_ticks(pid).unwrap();
    let t0 = Instant::now();
    pause_until(t0 + Duration::from_secs(10)); // the measurement window, not a synchronisation
    let (own1, kids1, _) = mam::sys::proc_cpu_ticks(pid).unwrap();
    let secs = t0.elapsed().as_secs_f64();
    let pct = (own1 - own0) as f64 / hz as f64 / secs * 100.0;
    let kids = (kids1 - kids0) as f64 / hz as f64 / secs * 100.0;
    eprintln!(
        "mam ui idle with 200 jobs: {pct:.2}% of a core over {secs:.1} s ({} ticks at {hz} Hz; children {kids:.2}%)",
        own1 - own0
    );
    assert!(pct < 1.0, "idle mam ui used {pct:.2}% of a core");
    assert!(t.capture(&pane).contains("200 jobs"));
    t.keys(&pane, &["q"]);
}

/// Issue 22: when stdout is not a terminal, `mam ui` is the plain `mam jobs --follow` table.
#[test]
fn ui_prints_the_plain_table_when_stdout_is_not_a_terminal() {
    let Some(w) = World::new("ui-plain") else { return };
    let id = w.job("w1", &[]);
    let mut bg = w.mam(["ui"]).spawn_bg(&w.td, "ui-plain");
    bg.wait_stdout(&id, Duration::from_secs(10));
    // Issue 32: plain text, one table per refresh, no clear-screen codes.
    wait_until("two redraws", Duration::from_secs(5), || bg.stdout().matches("registry ").count() >= 2);
    let out = bg.stdout();
    assert!(!out.contains('\x1b'), "{out:?}");
    let frame = &out[out.rfind("registry ").unwrap()..];
    let lines: Vec<&str> = frame.lines().collect();
    assert!(
        lines[0].starts_with(&format!("registry {}: 1 job(s) at ", w.td.ws().join(".mam/jobs").display())),
        "{frame}"
    );
    let head: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(head, ["JOB", "STATUS", "ATTEMPT", "SESSION", "ELAPSED", "FINISHED", "EVIDENCE", "HEARTBEAT"]);
    assert!(lines[2].starts_with(&id), "{frame}");
    assert!(!out.contains("\x1b[?1049h"), "no alternate screen on a pipe");
    bg.signal(libc::SIGTERM);
    assert_eq!(bg.wait(Duration::from_secs(3)).0, 0);
}

/// Issue 22: `r` shows the job's report, `l` its events.log and follows it as it grows, `s` asks
/// first and then cancels the job (`mam registry status --set cancelled`) or stops the session
/// (`mam stop`): the records and the pane change only through those commands.
#[test]
fn ui_report_events_and_stop_keys() {
    let Some(mut w) = World::new("ui-keys") else { return };
    w.session("w1");
    let report = w.path("report.md");
    fs::write(&report, "All done: the task was read and answered.\nSecond line.\n").unwrap();
    let job = w.job("w1", &["--report-path", &report.display().to_string()]);
    w.agent(Kind::Claim, &job);
    let rec = read_record(&w.td, &job);
    append_events_log(&w.td, &job, &signed_event(&rec, "started", 1, false));
    let (t, pane) = w.screen(100, 24, "", true);
    wait_screen(&t, &pane, "the session idle and its job", Duration::from_secs(10), |s| {
        s.contains(&format!("{job} running")) && s.contains(" idle ")
    });
    // The session row is selected: its newest job's report.
    t.keys(&pane, &["r"]);
    let s = wait_screen(&t, &pane, "the report", Duration::from_secs(5), |s| s.contains("All done: the task"));
    assert!(s.starts_with(&format!("report of job {job} (running): {}", report.display())), "{s}");
    assert!(s.contains("Second line.") && s.contains("q back"), "{s}");
    t.keys(&pane, &["q", "j", "l"]);
    let s = wait_screen(&t, &pane, "the events", Duration::from_secs(5), |s| s.contains("a1 #1 started"));
    assert!(s.contains("following"), "{s}");
    append_events_log(&w.td, &job, &signed_event(&rec, "progress", 2, true));
    wait_screen(&t, &pane, "the new event", Duration::from_secs(5), |s| s.contains("a1 #2 progress heartbeat"));
    t.keys(&pane, &["Escape"]);
    wait_screen(&t, &pane, "the list", Duration::from_secs(5), |s| s.contains(&format!("> {job}")));
    // s on the job: asked, refused with n, then done with y.
    t.keys(&pane, &["s"]);
    let s = wait_screen(&t, &pane, "the question", Duration::from_secs(5), |s| s.contains("[y/N]"));
    assert!(s.contains(&format!("Cancel job {job}?")), "{s}");
    t.keys(&pane, &["n"]);
    wait_screen(&t, &pane, "not stopped", Duration::from_secs(5), |s| s.contains("not stopped"));
    assert_eq!(read_record(&w.td, &job)["status"], "running", "n changes nothing");
    t.keys(&pane, &["s", "y"]);
    let s = wait_screen(&t, &pane, "the job cancelled", Duration::from_secs(15), |s| {
        s.contains(&format!("`mam registry status {job} --set cancelled` (exit 0)"))
    });
    assert!(s.contains(&format!("{job} running -> cancelled")), "{s}");
    let rec = read_record(&w.td, &job);
    assert_eq!((rec["status"].as_str(), rec["reason"].as_str()), (Some("cancelled"), Some("cancelled in mam ui")));
    // s on the session: mam stop.
    t.keys(&pane, &["k", "s"]);
    let s = wait_screen(&t, &pane, "the question", Duration::from_secs(5), |s| s.contains("[y/N]"));
    assert!(s.contains("Stop session w1?"), "{s}");
    t.keys(&pane, &["y"]);
    let s = wait_screen(&t, &pane, "the session stopped", Duration::from_secs(20), |s| {
        s.contains("`mam stop w1` (exit 0): SESSION=w1 STATUS=stopped")
    });
    wait_screen(&t, &pane, "its row stopped", Duration::from_secs(5), |s| {
        s.lines().any(|l| l.starts_with("> w1") && l.contains("stopped"))
    });
    let _ = s;
    t.keys(&pane, &["q"]);
    wait_until("the screen quits", Duration::from_secs(5), || w.path("ui.rc").exists());
}

/// A world on the real herdr (a private one) with the fake claude session `w1` in a pane; the
/// world, herdr's home and the agent's pane.
fn herdr_world(name: &str) -> Option<(World, HerdrHome, String)> {
    let mut w = World::new(name)?;
    let home = HerdrHome::new(&w.td)?;
    home.link("claude", &mam_bin());
    for (k, v) in home.env() {
        w.set(&k, &v.to_string_lossy());
    }
    w.set("MAM_PANE_BACKEND", "herdr");
    w.set("MAM_STARTUP_DIALOG_SETTLE_MS", "1000");
    w.mam(["pane", "server-start"]).run().expect_rc(0);
    let r = w.mam(["create", "claude", "--no-onboard", "--name", "w1", "--", "test-double", "agent"]).run();
    r.expect_rc(0);
    let agent = kv(&r.stdout(), "PANE");
    Some((w, home, agent))
}

/// Issue 22: on herdr, Enter from a plain terminal attaches to the agent (`herdr agent attach`, the
/// real herdr in a private world) and ctrl+b q comes back to the same place.
#[test]
fn ui_enter_attaches_to_a_herdr_agent_and_comes_back() {
    let Some((w, home, _)) = herdr_world("ui-herdr") else { return };
    let (t, pane) = w.screen(100, 30, "", false);
    let before = wait_screen(&t, &pane, "the herdr session listed", Duration::from_secs(15), |s| {
        s.lines().any(|l| l.starts_with("> w1") && l.contains("herdr:"))
    });
    t.keys(&pane, &["Enter"]);
    // herdr's client draws the agent's pane (the fake claude's banner and input line) here.
    wait_screen(&t, &pane, "the agent's pane in the terminal", Duration::from_secs(10), |s| {
        !s.contains("> w1") && s.contains("fake agent ready") && s.contains("? for shortcuts")
    });
    t.keys(&pane, &["C-b", "q"]);
    let after = wait_screen(&t, &pane, "the screen back", Duration::from_secs(10), |s| s.contains("back from w1"));
    let upto = |s: &str| s.lines().take_while(|l| !l.starts_with("> ")).map(str::to_string).collect::<Vec<_>>();
    assert_eq!(upto(&after), upto(&before), "before:\n{before}\nafter:\n{after}");
    t.keys(&pane, &["q"]);
    wait_until("the screen quits", Duration::from_secs(5), || w.path("ui.rc").exists());
    w.mam(["stop", "w1"]).run().expect_rc(0);
    drop(t);
    drop(home);
}

/// Issue 22: inside a herdr pane, Enter focuses the agent's pane (`herdr agent focus`, the real
/// herdr in a private world) and `mam ui` goes on in its own pane.
#[test]
fn ui_enter_inside_herdr_focuses_the_agents_pane() {
    let Some((w, home, agent)) = herdr_world("ui-herdr-focus") else { return };
    let focused = || {
        let v = home.herdr_json(&["pane", "layout", "--pane", &agent]);
        v["result"]["layout"]["focused_pane_id"].as_str().unwrap_or_default().to_string()
    };
    // The person's pane beside the agent's, focused, running `mam ui`.
    let ws = w.td.ws().display().to_string();
    let split = home.herdr_json(&["pane", "split", &agent, "--direction", "down", "--cwd", &ws, "--focus"]);
    let ui = split["result"]["pane"]["pane_id"].as_str().unwrap_or_else(|| panic!("no pane: {split}")).to_string();
    assert_eq!(focused(), ui);
    let script = w.screen_script("", false);
    home.herdr(&["pane", "run", &ui, &script.display().to_string()]).expect_rc(0);
    let read = || home.herdr(&["pane", "read", &ui, "--source", "visible"]).stdout();
    let mut last = String::new();
    let listed = poll(Duration::from_secs(15), || {
        last = read();
        last.lines().any(|l| l.starts_with("> w1") && l.contains("herdr:")).then_some(())
    });
    assert!(listed.is_some(), "the session never listed:\n{last}");
    home.herdr(&["pane", "send-keys", &ui, "enter"]).expect_rc(0);
    wait_until("herdr focuses the agent's pane", Duration::from_secs(10), || focused() == agent);
    // The screen is still there (nothing took its terminal) and still answers keys.
    assert!(!w.path("ui.rc").exists(), "mam ui ended");
    assert!(read().lines().any(|l| l.starts_with("> w1")), "{}", read());
    home.herdr(&["pane", "send-keys", &ui, "q"]).expect_rc(0);
    wait_until("the screen quits", Duration::from_secs(5), || w.path("ui.rc").exists());
    assert_eq!(fs::read_to_string(w.path("ui.rc")).unwrap().trim(), "0");
    w.mam(["stop", "w1"]).run().expect_rc(0);
    drop(home);
}

/// Issue 32 item 5: a successful delegation on tmux says that the job started, and no note that
/// reads like a failure (tmux never sees an agent settle; typing the prompt and the job's own
/// `started` is its usual way).
#[test]
fn a_tmux_delegation_that_works_prints_no_timeout_note() {
    let Some(mut w) = World::new("tmux_note") else { return };
    w.broker();
    w.td.write("agent.script", "work_s=0.2\nreport_text=done\n");
    w.session("w1");
    let task = w.td.write("task.md", "Say hi.\n");
    let r = w
        .mam(["delegate-job", "--session", "w1", "--heartbeat", "1", "--ack-timeout", "20", "--timeout", "60"])
        .args(["--brief-file"])
        .args([&task])
        .env("MAM_PUBLISH_BUDGET_S", "20")
        .run_within(Duration::from_secs(90));
    r.expect_rc(0);
    let err = r.stderr();
    let id = kv(&r.stdout(), "JOB_ID");
    let _timers = TimerGuard(id.clone());
    assert!(err.contains(&format!("NOTE: job {id}: started ")), "{err}");
    assert!(!err.contains("settle") && !err.contains("(timeout)") && !err.contains("prompt timeout"), "{err}");
    assert!(!err.contains("prompt delivered"), "nothing unusual to say about the delivery: {err}");
}
