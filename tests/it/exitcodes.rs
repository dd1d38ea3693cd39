//! Issue 32 item 10: one exit-code table that every command follows. README.md's "Exit codes" table
//! and every `mam <command> --help` are parsed and must list the same codes 3 and up (a drift on
//! either side fails), and every code of the table, with 0, 1 and 2 of each command in it, is
//! provoked for real. Cases that need a harness of their own live beside it (`session`, `pane`,
//! `delegate`: `exit_code_cases`) and report here through `Codes`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use crate::support::*;

/// The codes seen, by command: each `saw` asserts the exit code and records it.
#[derive(Default)]
pub(crate) struct Codes(Mutex<BTreeMap<String, BTreeSet<i32>>>);

impl Codes {
    /// Asserts that `r` ended with `want` (what: the case, for the failure message); records it.
    pub(crate) fn saw(&self, cmd: &str, what: &str, r: &Run, want: i32) {
        assert_eq!(r.rc(), want, "mam {cmd}: {what}: exit code\n--- stdout\n{}--- stderr\n{}", r.stdout(), r.stderr());
        self.rc(cmd, want);
    }

    /// Records an exit code the caller asserted itself.
    pub(crate) fn rc(&self, cmd: &str, rc: i32) {
        self.0.lock().unwrap().entry(cmd.to_string()).or_default().insert(rc);
    }

    fn seen(&self) -> BTreeMap<String, BTreeSet<i32>> {
        self.0.lock().unwrap().clone()
    }
}

/// The exit codes a text lists: a number that starts an item (the text's start, or after `| `,
/// `; `, `: `, `, ` or a line break) and is followed by a blank, `/` joining two (`130/143`).
fn listed_codes(text: &str) -> BTreeSet<i32> {
    let b = text.as_bytes();
    let mut out = BTreeSet::new();
    let mut i = 0;
    while i < b.len() {
        let starts = i == 0
            || b[i - 1] == b'\n'
            || (i >= 2 && b[i - 1] == b' ' && matches!(b[i - 2], b'|' | b';' | b':' | b','));
        if starts && b[i].is_ascii_digit() {
            let mut nums = Vec::new();
            let mut j = i;
            loop {
                let s = j;
                while j < b.len() && b[j].is_ascii_digit() {
                    j += 1;
                }
                nums.push(text[s..j].parse::<i32>().unwrap());
                if j + 1 < b.len() && b[j] == b'/' && b[j + 1].is_ascii_digit() {
                    j += 1;
                    continue;
                }
                break;
            }
            if j < b.len() && (b[j] == b' ' || b[j] == b'\n') {
                out.extend(nums);
            }
            i = j.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

/// README.md's table: command (`broker check` with its verb) -> its codes 3 and up.
fn readme_table() -> BTreeMap<String, BTreeSet<i32>> {
    let readme = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let at = readme.find("### Exit codes").expect("README.md has an `### Exit codes` section");
    let mut table = BTreeMap::new();
    for line in readme[at..].lines().skip_while(|l| !l.starts_with("| command |")).skip(2) {
        let Some(row) = line.strip_prefix("| ") else { break };
        let (cmd, codes) = row.split_once(" | ").unwrap_or_else(|| panic!("README row without two cells: {line}"));
        let cmd = cmd.trim().trim_matches('`').to_string();
        let codes: BTreeSet<i32> = listed_codes(codes.trim_end_matches('|').trim()).into_iter().collect();
        assert!(codes.iter().all(|c| *c >= 3), "README row {cmd}: codes below 3 belong to every command: {line}");
        assert!(!codes.is_empty(), "README row {cmd} names no code: {line}");
        assert!(table.insert(cmd.clone(), codes).is_none(), "README names {cmd} twice");
    }
    assert!(table.len() > 10, "README's table was not found whole: {table:?}");
    table
}

/// The "Exit codes" paragraph of `mam ARGS --help`.
fn help_exit_codes(td: &TestDir, args: &[&str]) -> String {
    let r = td.mam().args(args).arg_help().run();
    r.expect_rc(0);
    let out = r.stdout();
    let at = out.find("\nExit codes").unwrap_or_else(|| panic!("mam {args:?} --help lists no exit codes:\n{out}"));
    let para = &out[at + 1..];
    para[..para.find("\n\n").unwrap_or(para.len())].to_string()
}

trait HelpArg {
    fn arg_help(self) -> Cmd;
}

impl HelpArg for Cmd {
    fn arg_help(self) -> Cmd {
        self.args(["--help"])
    }
}

/// Every command of `mam --help`, plus `broker check` (its own table row and help).
fn commands(td: &TestDir) -> Vec<String> {
    let out = td.mam().args(["--help"]).run().stdout();
    let list = &out[out.find("Commands:\n").unwrap() + 10..];
    let mut v: Vec<String> = list
        .lines()
        .take_while(|l| l.starts_with("  "))
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect();
    v.push("broker check".into());
    v
}

/// The help texts a command's codes are listed in: its own, and for `worktree` each verb's.
fn help_codes(td: &TestDir, cmd: &str) -> (String, BTreeSet<i32>) {
    let words: Vec<&str> = cmd.split(' ').collect();
    let mut texts = vec![help_exit_codes(td, &words)];
    if cmd == "worktree" {
        for verb in ["prepare", "remove", "list"] {
            texts.push(help_exit_codes(td, &["worktree", verb]));
        }
    }
    let all = texts.join("\n");
    let codes = texts.iter().flat_map(|t| listed_codes(t)).collect();
    (all, codes)
}

#[test]
fn listed_codes_reads_items_only() {
    let t = "Exit codes: 0 ok, 1 env, 2 usage (not a canonical\n8-4-4-4-12 uuid), 3 after 4 tries; 5 x,\n130/143 y.";
    assert_eq!(listed_codes(t), BTreeSet::from([0, 1, 2, 3, 5, 130, 143]));
    assert_eq!(listed_codes("| 3 a; 27 the `-W` (MAM_X=1) |"), BTreeSet::from([3, 27]));
}

/// The README's table and every `--help` list the same codes 3 and up; every help lists 0, 1 and 2.
#[test]
fn exit_codes_of_the_readme_and_of_every_help_agree() {
    let td = TestDir::new("codes-help");
    let table = readme_table();
    let mut drift = Vec::new();
    let all = commands(&td);
    for cmd in &all {
        let (text, codes) = help_codes(&td, cmd);
        let high: BTreeSet<i32> = codes.iter().copied().filter(|c| *c >= 3).collect();
        let want = table.get(cmd).cloned().unwrap_or_default();
        if high != want {
            drift.push(format!("{cmd}: --help lists {high:?}, README.md {want:?}\n  {}", text.replace('\n', "\n  ")));
        }
        for low in [0, 1, 2] {
            if !codes.contains(&low) {
                drift.push(format!("{cmd}: --help does not list {low}\n  {}", text.replace('\n', "\n  ")));
            }
        }
    }
    for cmd in table.keys() {
        assert!(all.contains(cmd), "README.md's table names `{cmd}`, which is no command");
    }
    assert!(drift.is_empty(), "exit codes drift:\n{}", drift.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// The cases

/// A process that holds `path` flock'ed (exclusively) while it runs; killed on drop.
struct LockHolder(Child);

impl LockHolder {
    fn start(path: &Path) -> LockHolder {
        let child = Command::new("sh")
            .args(["-c", "exec 9<>\"$LOCKP\"; flock 9; echo held > \"$LOCKP.held\"; exec sleep 120"])
            .env("LOCKP", path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let held = PathBuf::from(format!("{}.held", path.display()));
        wait_until("the lock to be held", Duration::from_secs(10), || held.exists());
        LockHolder(child)
    }
}

impl Drop for LockHolder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// True once process `pid` has a handler for signal `sig` (its `SigCgt` mask): a signal sent
/// now is the command's to answer, not the default action's.
fn catches(pid: i32, sig: i32) -> bool {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let mask = status.lines().find_map(|l| l.strip_prefix("SigCgt:")).map(str::trim).unwrap_or("0");
    u64::from_str_radix(mask, 16).is_ok_and(|m| m & (1u64 << (sig - 1)) != 0)
}

/// A directory given as the env file: every command that loads it ends 1 (its arguments valid).
fn unreadable_env(c: Cmd, td: &TestDir) -> Cmd {
    c.env("MAM_ENV_FILE", td.path(""))
}

const GIT_ENV: &[(&str, &str)] = &[
    ("GIT_AUTHOR_NAME", "t"),
    ("GIT_AUTHOR_EMAIL", "t@example.invalid"),
    ("GIT_COMMITTER_NAME", "t"),
    ("GIT_COMMITTER_EMAIL", "t@example.invalid"),
    ("GIT_CONFIG_NOSYSTEM", "1"),
];

fn git(td: &TestDir, dir: &Path, args: &[&str]) {
    let mut c = td.command("git").cwd(dir).args(args);
    for (k, v) in GIT_ENV {
        c = c.env(k, v);
    }
    c.run().expect_rc(0);
}

/// Every code of README.md's table, and 0, 1 and 2 of each command in it, happens for real.
#[test]
fn exit_codes_every_documented_case_happens() {
    let codes = Codes::default();
    let td = TestDir::new("codes-cases");
    let Some(broker) = start_target(Target::Embedded, &td) else { return };
    let port = broker.port().to_string();
    let dead = free_port().to_string();
    let mam = || td.mam().env("MQTT_PORT", &port).env("MAM_PUBLISH_BUDGET_S", "1");

    // -- pub, sub
    codes.saw("pub", "published", &mam().args(["pub", "-t", "c/a", "-m", "x", "-r"]).run(), 0);
    codes.saw("pub", "payload file unreadable", &mam().args(["pub", "-t", "c/a", "-f", "/nonexistent/f"]).run(), 1);
    codes.saw("pub", "unknown flag", &mam().args(["pub", "--no-such"]).run(), 2);
    codes.saw("pub", "no broker", &mam().env("MQTT_PORT", &dead).args(["pub", "-t", "c/a", "-m", "x"]).run(), 3);
    codes.saw("sub", "count reached", &mam().args(["sub", "-t", "c/a", "-C", "1", "-W", "20"]).run(), 0);
    codes.saw("sub", "env unreadable", &unreadable_env(mam(), &td).args(["sub", "-t", "c/a"]).run(), 1);
    codes.saw("sub", "unknown flag", &mam().args(["sub", "--no-such"]).run(), 2);
    codes.saw("sub", "no broker", &mam().env("MQTT_PORT", &dead).args(["sub", "-t", "c/a"]).run(), 3);
    codes.saw("sub", "-W expired", &mam().args(["sub", "-t", "c/none", "-W", "1"]).run(), 27);

    // -- registry, publish, heartbeat: one job
    let register = |session: &str, timing: &[&str]| {
        let r = mam().args(["registry", "register", "--session", session]).args(timing).run();
        codes.saw("registry", "register", &r, 0);
        r.stdout().trim().to_string()
    };
    let j = register("s1", &[]);
    codes.saw("registry", "unknown job", &mam().args(["registry", "show", "0badc0de"]).run(), 1);
    codes.saw("registry", "unknown flag", &mam().args(["registry", "show", &j, "--no-such"]).run(), 2);
    codes.saw("publish", "started", &mam().args(["publish", "--job-id", &j, "--event", "started"]).run(), 0);
    codes.saw(
        "publish",
        "unknown job",
        &mam().args(["publish", "--job-id", "0badc0de", "--event", "started"]).run(),
        1,
    );
    codes.saw("publish", "unknown flag", &mam().args(["publish", "--no-such"]).run(), 2);
    // A job whose record names a broker that is down (the record's broker is the one published to).
    let r = mam().env("MQTT_PORT", &dead).args(["registry", "register", "--session", "s0"]).run();
    let j0 = r.stdout().trim().to_string();
    let r = mam().env("MQTT_PORT", &dead).args(["publish", "--job-id", &j0, "--event", "started"]).run();
    codes.saw("publish", "recorded locally, broker down", &r, 3);
    codes.saw("heartbeat", "status", &mam().args(["heartbeat", "status", "--job-id", &j]).run(), 0);
    codes.saw("heartbeat", "unknown job", &mam().args(["heartbeat", "start", "--job-id", "0badc0de"]).run(), 1);
    codes.saw("heartbeat", "unknown flag", &mam().args(["heartbeat", "status", "--no-such"]).run(), 2);
    let r = mam().args(["registry", "status", &j, "--set", "completed", "--no-publish"]).run();
    codes.saw("registry", "completed", &r, 0);
    let r = mam().args(["registry", "status", &j, "--set", "running", "--no-publish"]).run();
    codes.saw("registry", "running after completed", &r, 4);
    let r = mam().args(["publish", "--job-id", &j, "--event", "progress"]).run();
    codes.saw("publish", "progress after completed", &r, 4);
    codes.saw("heartbeat", "start after the end", &mam().args(["heartbeat", "start", "--job-id", &j]).run(), 4);

    // -- watch and wait: verdicts from records and events
    let failed = register("s2", &[]);
    mam().args(["registry", "status", &failed, "--set", "failed", "--no-publish"]).run().expect_rc(0);
    let silent = register("s3", &["--heartbeat-sec", "1", "--heartbeat-misses", "1"]);
    append_events_log(&td, &silent, &signed_event(&read_record(&td, &silent), "started", 1, false));
    let never = register("s4", &["--ack-timeout", "1", "--idle-timeout", "1"]);
    let open = register("s5", &[]);
    let watch = |id: &str, extra: &[&str]| mam().args(["watch", "--job-id", id]).args(extra);
    codes.saw("watch", "completed", &watch(&j, &[]).run(), 0);
    codes.saw("watch", "unknown job", &watch("0badc0de", &[]).run(), 1);
    codes.saw("watch", "unknown flag", &watch(&j, &["--no-such"]).run(), 2);
    codes.saw("watch", "no broker", &watch(&j0, &["--ack-timeout", "30"]).run_within(Duration::from_secs(60)), 3);
    codes.saw("watch", "failed", &watch(&failed, &[]).run(), 10);
    codes.saw("watch", "silent", &watch(&silent, &["--idle-timeout", "1"]).run_within(Duration::from_secs(30)), 11);
    codes.saw(
        "watch",
        "never started",
        &watch(&never, &["--ack-timeout", "1"]).run_within(Duration::from_secs(30)),
        12,
    );
    codes.saw("watch", "--timeout", &watch(&open, &["--ack-timeout", "30", "--timeout", "1"]).run(), 13);
    let wait = |extra: &[&str]| mam().args(["wait"]).args(extra);
    codes.saw("wait", "completed", &wait(&[&j]).run(), 0);
    codes.saw("wait", "unknown job", &wait(&["0badc0de"]).run(), 1);
    codes.saw("wait", "no selection", &wait(&[]).run(), 2);
    codes.saw("wait", "failed", &wait(&[&failed]).run(), 10);
    codes.saw("wait", "silent", &wait(&[&silent, "--timeout", "20"]).run_within(Duration::from_secs(30)), 11);
    codes.saw("wait", "never started", &wait(&[&never, "--timeout", "20"]).run_within(Duration::from_secs(30)), 12);
    codes.saw("wait", "--timeout", &wait(&[&open, "--timeout", "1"]).run(), 13);
    codes.saw("wait", "nothing open", &wait(&["--session", "nobody"]).run(), 14);
    for (sig, rc) in [(2, 130), (15, 143)] {
        for (cmd, c) in [("watch", watch(&open, &["--ack-timeout", "60"])), ("wait", wait(&[&open]))] {
            let mut bg = c.spawn_bg(&td, cmd);
            wait_until(&format!("{cmd} to catch signal {sig}"), Duration::from_secs(20), || catches(bg.pid(), sig));
            bg.signal(sig);
            let (got, _) = bg.wait(Duration::from_secs(10));
            assert_eq!(got, rc, "{cmd} on signal {sig}: {}", bg.stderr());
            codes.rc(cmd, rc);
        }
    }

    // -- remote: a dispatch published, refused, or its broker down
    let secret = rand_hex(16);
    let remote_job = |port: &str| {
        let args = ["registry", "register", "--session", "remote:r1", "--transport", "remote"];
        let r = mam().env("MQTT_PORT", port).env("MAM_DISPATCH_SECRET", &secret).args(args).run();
        r.expect_rc(0);
        r.stdout().trim().to_string()
    };
    let dispatch = |id: &str| mam().env("MAM_DISPATCH_SECRET", &secret).args(["remote", "dispatch", "--job-id", id]);
    codes.saw("remote", "dispatched", &dispatch(&remote_job(&port)).run(), 0);
    let r = dispatch(&remote_job(&dead)).run_within(Duration::from_secs(60));
    codes.saw("remote", "broker down", &r, 3);
    let r = mam().args(["remote", "dispatch", "--job-id", &open]).env_remove("MAM_DISPATCH_SECRET").run();
    codes.saw("remote", "no secret", &r, 1);
    codes.saw("remote", "unknown flag", &mam().args(["remote", "dispatch", "--no-such"]).run(), 2);

    // -- daemon and reconcile --subscribe: the lock
    let daemon = |args: &[&str]| mam().args(["daemon"]).args(args).env_remove("MAM_NO_SUBSCRIBER_DAEMON");
    codes.saw("daemon", "status", &daemon(&["status"]).run(), 0);
    codes.saw("daemon", "env unreadable", &unreadable_env(daemon(&["status"]), &td).run(), 1);
    codes.saw("daemon", "unknown verb", &daemon(&["restart"]).run(), 2);
    let lock = td.ws().join(".mam/monitor.lock");
    {
        let _held = LockHolder::start(&lock);
        let ws = td.ws().display().to_string();
        codes.saw("daemon", "lock held", &daemon(&["run", "--workspace", &ws]).run(), 5);
        codes.saw("reconcile", "--subscribe, lock held", &mam().args(["reconcile", "--subscribe"]).run(), 5);
    }
    for (sig, rc) in [(2, 130), (15, 143)] {
        let mut bg = mam().args(["reconcile", "--subscribe"]).env("MAM_LEGACY_SIGNAL_RC", "1").spawn_bg(&td, "rec");
        wait_until("the daemon's lock", Duration::from_secs(20), || {
            fs::read_to_string(&lock).is_ok_and(|t| t.contains(&bg.pid().to_string())) && catches(bg.pid(), sig)
        });
        bg.signal(sig);
        let (got, _) = bg.wait(Duration::from_secs(10));
        assert_eq!(got, rc, "reconcile --subscribe on signal {sig}: {}", bg.stderr());
        codes.rc("reconcile", rc);
    }
    codes.saw("monitor", "status", &mam().args(["monitor", "status"]).run(), 0);
    codes.saw("monitor", "env unreadable", &unreadable_env(mam(), &td).args(["monitor", "status"]).run(), 1);
    codes.saw("monitor", "unknown verb", &mam().args(["monitor", "restart"]).run(), 2);

    // -- orc-onboard and agents: conversations
    let u = "123e4567-e89b-42d3-8456-426614174abc";
    codes.saw("orc-onboard", "list", &mam().args(["orc-onboard", "--list"]).run(), 0);
    codes.saw("orc-onboard", "env unreadable", &unreadable_env(mam(), &td).args(["orc-onboard", "--list"]).run(), 1);
    codes.saw("orc-onboard", "not a uuid", &mam().args(["orc-onboard", "not-a-uuid"]).run(), 2);
    codes.saw("orc-onboard", "remove unregistered", &mam().args(["orc-onboard", "--remove", u]).run(), 3);
    let r = mam().args(["orc-onboard", "--remove", u, "--purge-conversation"]).run();
    codes.saw("orc-onboard", "purge without --yes", &r, 4);
    mam().args(["orc-onboard", u]).run().expect_rc(0);
    let r = mam().args(["orc-onboard", "--remove", u, "--purge-conversation", "--yes", "--agent", "agy"]).run();
    codes.saw("orc-onboard", "purge of no artifact", &r, 5);
    let conv = td.path(&format!("home/.claude/projects/-work-proj/{u}.jsonl"));
    fs::create_dir_all(conv.parent().unwrap()).unwrap();
    fs::write(&conv, "x").unwrap();
    codes.saw("agents", "purged", &mam().args(["agents", "purge", "claude", u]).run(), 0);
    // A copy the purge does not own still carries the uuid: a residual.
    for rel in [format!("conversations/{u}.db"), format!("exports/copy-of-{u}.txt")] {
        let p = td.path(&format!("home/.gemini/antigravity-cli/{rel}"));
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, "x").unwrap();
    }
    codes.saw("agents", "a residual left", &mam().args(["agents", "purge", "agy", u]).run(), 1);
    codes.saw("agents", "not a uuid", &mam().args(["agents", "purge", "claude", "nope"]).run(), 2);
    codes.saw("agents", "no artifact", &mam().args(["agents", "purge", "claude", u]).run(), 5);

    // -- broker check
    let check = |brokers: &str| mam().env("MQTT_BROKER", brokers).env_remove("MQTT_PORT").args(["broker", "check"]);
    let up = format!("127.0.0.1:{port}");
    let down = format!("127.0.0.1:{dead}");
    let r = check(&up).env("MQTT_PORT", &port).run_within(Duration::from_secs(60));
    codes.saw("broker check", "passed", &r, 0);
    codes.saw("broker check", "env unreadable", &unreadable_env(check(&up), &td).run(), 1);
    codes.saw("broker check", "unknown flag", &check(&up).args(["--no-such"]).run(), 2);
    codes.saw("broker check", "none passed", &check(&down).run_within(Duration::from_secs(60)), 3);
    let r = check(&format!("{up},{down}")).run_within(Duration::from_secs(60));
    codes.saw("broker check", "one of two", &r, 6);

    // -- loop, remove: a repository with sessions on the fake backend
    let fake = |c: Cmd| c.env("MAM_PANE_BACKEND", "fake").env("MAM_FAKE_PANES_DIR", td.path("panes"));
    git(&td, &td.ws(), &["init", "-q", "-b", "main"]);
    td.write("ws/README.md", "x\n");
    git(&td, &td.ws(), &["add", "README.md"]);
    git(&td, &td.ws(), &["commit", "-q", "-m", "first"]);
    codes.saw("remove", "not installed", &mam().args(["remove"]).run(), 2);
    mam().args(["install"]).run().expect_rc(0);
    codes.saw("remove", "planned", &mam().args(["remove", "--dry-run"]).run(), 0);
    codes.saw("remove", "env unreadable", &unreadable_env(mam(), &td).args(["remove", "--dry-run"]).run(), 1);
    // The sessions end with the test, also when it fails (their pane directories go).
    struct Panes(PathBuf);
    impl Drop for Panes {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }
    let _panes = Panes(td.path("panes"));
    for name in ["cr", "rv"] {
        let r = fake(mam()).args(["create", "pretend", "--name", name, "--no-onboard"]).run();
        r.expect_rc(0);
    }
    codes.saw("remove", "a session runs", &fake(mam()).args(["remove"]).run(), 3);
    td.write("ws/task.md", "Say hello.\n");
    let lp = |extra: &[&str]| {
        fake(mam()).args(["loop", "--creator", "cr", "--reviewer", "rv", "--task-file", "task.md"]).args(extra)
    };
    codes.saw("loop", "help", &mam().args(["loop", "--help"]).run(), 0);
    codes.saw("loop", "env unreadable", &unreadable_env(lp(&[]), &td).run(), 1);
    codes.saw("loop", "no reviewer", &fake(mam()).args(["loop", "--creator", "cr", "--task-file", "task.md"]).run(), 2);
    {
        fs::create_dir_all(td.ws().join(".mam/loop")).unwrap();
        let _held = LockHolder::start(&td.ws().join(".mam/loop/cr.lock"));
        codes.saw("loop", "creator busy", &lp(&[]).run(), 3);
    }
    fake(mam()).args(["stop", "cr", "rv"]).run().expect_rc(0);
    codes.saw("worktree", "list", &mam().args(["worktree", "list"]).run(), 0);
    codes.saw("worktree", "env unreadable", &unreadable_env(mam(), &td).args(["worktree", "list"]).run(), 1);
    codes.saw("worktree", "unknown verb", &mam().args(["worktree", "prune"]).run(), 2);
    let ws = td.ws().display().to_string();
    codes.saw("worktree", "remove the main worktree", &fake(mam()).args(["worktree", "remove", &ws]).run(), 3);

    // -- status, reconcile, stop, pane (their harnesses), delegate-job (its own)
    crate::session::exit_code_cases(&codes);
    crate::pane::exit_code_cases(&codes);
    crate::delegate::exit_code_cases(&codes);

    // Every documented case was seen.
    let seen = codes.seen();
    let mut missing = Vec::new();
    for (cmd, high) in readme_table() {
        let got = seen.get(&cmd).cloned().unwrap_or_default();
        for c in [0, 1, 2].into_iter().chain(high) {
            if !got.contains(&c) {
                missing.push(format!("{cmd} {c}"));
            }
        }
    }
    assert!(missing.is_empty(), "documented exit codes never provoked: {missing:?}");
    drop(broker);
}
