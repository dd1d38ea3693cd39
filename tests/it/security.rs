//! Issue 12, "Trust what you load": each test performs one attack of the issue and checks that it
//! no longer gets through (docs/SECURITY.md). The other-user attacks run the attacker as uid 65534
//! through `setpriv` when the suite runs as root (A31); as a non-root user they say so and return.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::publish::{logs, mam_at, new_job, registry};
use crate::support::*;

const NOBODY: u32 = 65534;

/// True when the other-user attacks can run: as root with setpriv (MAM_REQUIRE_SETPRIV fails a
/// missing tool).
fn can_attack() -> bool {
    if mam::sys::getuid() != 0 {
        eprintln!("skipped: the other-user attacks need root (to act as uid {NOBODY})");
        return false;
    }
    have_tool("setpriv", "MAM_REQUIRE_SETPRIV")
}

fn chown_nobody(p: &Path) {
    let st = Command::new("chown").args(["-R", &format!("{NOBODY}:{NOBODY}")]).arg(p).status().unwrap();
    assert!(st.success(), "chown {}", p.display());
}

/// Runs `script` with `sh -c` as uid 65534 in `dir` (the attacker planting files).
fn as_attacker(td: &TestDir, dir: &Path, script: &str) {
    let r = td
        .command("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", script])
        .cwd(dir)
        .run();
    assert_eq!(r.rc(), 0, "attacker script failed: {}", r.stderr());
}

fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

fn chmod(p: &Path, m: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(m)).unwrap();
}

/// A victim file with known content and mode 0644, owned by root (the test's user).
fn victim(td: &TestDir, rel: &str) -> (PathBuf, Vec<u8>) {
    let content = format!("precious {}\n", rand_hex(4)).into_bytes();
    let p = td.write(rel, &content);
    chmod(&p, 0o644);
    (p, content)
}

// ---------------------------------------------------------------------------------------------
// 1. Env file trust

#[test]
fn env_file_of_another_user_in_the_cwd_is_refused_and_its_openssl_never_runs() {
    if !can_attack() {
        return;
    }
    let td = TestDir::new("sec-env-other");
    // The attacker's directory, where root happens to run `mam pub`.
    let dir = td.path("theirs");
    fs::create_dir_all(&dir).unwrap();
    chown_nobody(&dir);
    let marker = td.path("theirs/ran");
    let port = free_port();
    as_attacker(
        &td,
        &dir,
        &format!(
            "printf '#!/bin/sh\\ntouch {m}\\n' > evil.sh && chmod 755 evil.sh && \
             printf 'MQTT_TLS=1\\nMQTT_BROKER=127.0.0.1\\nMQTT_PORT={port}\\nMAM_OPENSSL={d}/evil.sh\\n' > .mam.env",
            m = marker.display(),
            d = dir.display()
        ),
    );
    let env = dir.join(".mam.env");
    assert_eq!(fs::metadata(&env).unwrap().uid(), NOBODY);
    let r = td.mam().env_remove("MAM_ENV_FILE").cwd(&dir).args(["pub", "-t", "x", "-m", "y"]).run();
    assert!(!marker.exists(), "root ran the attacker's MAM_OPENSSL\n{}", r.stderr());
    r.expect_rc(1);
    eqnice!(format!("ERROR: {}: refused: owned by uid {NOBODY}, not you (uid 0)\n", env.display()), r.stderr());
    // Refused by every command that loads it, not only pub.
    for args in [&["env", "--shell"][..], &["registry", "list"], &["paths"]] {
        let r = td.mam().env_remove("MAM_ENV_FILE").cwd(&dir).args(args).run();
        r.expect_rc(1);
        assert_eq!(r.stdout(), "", "{args:?}");
        assert!(r.stderr().contains(": refused: owned by uid 65534"), "{args:?}: {}", r.stderr());
    }
}

#[test]
fn env_file_of_another_user_in_workspace_root_is_refused() {
    if !can_attack() {
        return;
    }
    let td = TestDir::new("sec-env-ws");
    let f = td.write("shared/.mam.env", "MQTT_PORT=1\n");
    chown_nobody(&f);
    let r = td.mam().env_remove("MAM_ENV_FILE").env("WORKSPACE_ROOT", td.path("shared")).args(["env", "--shell"]).run();
    r.expect_rc(1);
    eqnice!(format!("ERROR: {}: refused: owned by uid {NOBODY}, not you (uid 0)\n", f.display()), r.stderr());
    assert_eq!(r.stdout(), "");
}

#[test]
fn env_file_writable_by_group_or_others_is_refused() {
    let td = TestDir::new("sec-env-mode");
    let f = td.write("ws/.mam.env", "A=1\n");
    let ambient = |args: &[&str]| td.mam().env_remove("MAM_ENV_FILE").args(args).run();
    for (m, who) in [(0o666, "others"), (0o620, "group")] {
        chmod(&f, m);
        for args in [&["env", "--shell"][..], &["registry", "list"], &["pub", "-t", "x", "-m", "y"]] {
            let r = ambient(args);
            r.expect_rc(1);
            eqnice!(format!("ERROR: {}: refused: writable by {who} (mode {m:04o})\n", f.display()), r.stderr());
            assert_eq!(r.stdout(), "");
        }
    }
    // Its directory counts too: a 0600 file in a directory others may write.
    chmod(&f, 0o600);
    let dir = td.path("open");
    let g = td.write("open/x.env", "A=1\n");
    chmod(&g, 0o600);
    chmod(&dir, 0o777);
    let r = td.mam().env("MAM_ENV_FILE", &g).args(["env", "--shell"]).run();
    chmod(&dir, 0o755);
    r.expect_rc(1);
    eqnice!(
        format!("ERROR: {}: refused: directory {}: writable by others (mode 0777)\n", g.display(), dir.display()),
        r.stderr()
    );
    // A symlink is not followed.
    std::os::unix::fs::symlink(&f, td.path("link.env")).unwrap();
    let r = td.mam().env("MAM_ENV_FILE", td.path("link.env")).args(["env", "--shell"]).run();
    r.expect_rc(1);
    eqnice!(format!("ERROR: {}: refused: is a symbolic link\n", td.path("link.env").display()), r.stderr());
    // The good file still loads.
    let r = ambient(&["env", "--shell"]);
    r.expect_rc(0);
    eqnice!("export A='1'\n", r.stdout());
}

#[test]
fn program_paths_in_an_own_env_file_are_ignored_with_a_warning() {
    let td = TestDir::new("sec-env-prog");
    let marker = td.path("ran");
    let evil = td.write("evil.sh", format!("#!/bin/sh\ntouch {}\n", marker.display()));
    chmod(&evil, 0o755);
    let port = free_port();
    let f = td.write(
        "ws/.mam.env",
        format!(
            "MQTT_TLS=1\nMAM_OPENSSL={e}\nMQTT_BROKER=127.0.0.1\nMQTT_PORT={port}\nMAM_BIN={e}\nMAM_MQTT_CONNECT_TIMEOUT_S=2\n",
            e = evil.display()
        ),
    );
    chmod(&f, 0o600);
    let r = td.mam().env_remove("MAM_ENV_FILE").args(["pub", "-t", "x", "-m", "y"]).run();
    assert!(!marker.exists(), "mam ran MAM_OPENSSL from the env file\n{}", r.stderr());
    let err = r.stderr();
    let shown = f.display().to_string();
    for (n, key) in [(2, "MAM_OPENSSL"), (5, "MAM_BIN")] {
        let want = format!("WARNING: {shown}:{n}: {key} is taken from the environment only; line skipped");
        assert!(err.lines().any(|l| l == want), "missing {want:?} in\n{err}");
    }
    assert!(!err.contains(&evil.display().to_string()), "a value leaked into a diagnostic: {err}");
    let r = td.mam().env_remove("MAM_ENV_FILE").args(["env", "--shell"]).run();
    r.expect_rc(0);
    assert!(!r.stdout().contains("MAM_OPENSSL") && !r.stdout().contains("MAM_BIN"), "{}", r.stdout());
    assert!(r.stdout().contains("export MQTT_TLS='1'"), "{}", r.stdout());
    // The publish command line an agent is given never names the env file's MAM_BIN.
    let id = register_job(&td, &[("MAM_ENV_FILE", f.display().to_string())], &[]);
    let r = td.mam().env("MAM_ENV_FILE", &f).args(["registry", "publish-cmd", &id]).run();
    r.expect_rc(0);
    assert!(!r.stdout().contains(&evil.display().to_string()), "{}", r.stdout());
}

// ---------------------------------------------------------------------------------------------
// 2. Control root trust

/// `<td>/shared/.mam` owned by uid 65534, and a subdirectory of it to run in.
fn foreign_root(td: &TestDir) -> (PathBuf, PathBuf) {
    let shared = td.path("shared");
    fs::create_dir_all(shared.join(".mam")).unwrap();
    fs::create_dir_all(shared.join("src/deep")).unwrap();
    chown_nobody(&shared.join(".mam"));
    (shared.clone(), shared.join("src/deep"))
}

#[test]
fn control_root_of_another_user_in_an_ancestor_is_refused_unless_trusted() {
    if !can_attack() {
        return;
    }
    let td = TestDir::new("sec-root");
    let (shared, deep) = foreign_root(&td);
    let dotmam = shared.join(".mam");
    let want = format!(
        "ERROR: {}: refused: owned by uid {NOBODY}, not you (uid 0); trust it with MAM_TRUSTED_ROOTS\n",
        dotmam.display()
    );
    let r = td.mam().cwd(&deep).args(["paths"]).run();
    r.expect_rc(1);
    eqnice!(want, r.stderr());
    assert_eq!(r.stdout(), "");
    let r = td.mam().cwd(&deep).args(["registry", "register", "--session", "s1", "--job-id", "j1"]).run();
    r.expect_rc(1);
    eqnice!(want, r.stderr());
    assert_eq!(tree(&dotmam), Vec::<String>::new(), "nothing written under the refused root");
    // Every command that writes there refuses the same way, the daemon first of all.
    for args in [
        &["daemon", "run", "--workspace", shared.to_str().unwrap(), "--idle-timeout", "1"][..],
        &["daemon", "ensure"],
        &["monitor", "start"],
        &["jobs"],
        &["publish", "--job-id", "j1", "--event", "started"],
    ] {
        let r = td.mam().cwd(&deep).env_remove("MAM_NO_SUBSCRIBER_DAEMON").args(args).run();
        r.expect_rc(1);
        assert!(
            r.stderr().contains(&format!("{}: refused: owned by uid {NOBODY}", dotmam.display())),
            "{args:?}: {}",
            r.stderr()
        );
        assert_eq!(tree(&dotmam), Vec::<String>::new(), "{args:?} wrote under the refused root");
    }
    // Trusted by name (or by `*`), it is used.
    for trusted in [shared.display().to_string(), format!("/nonexistent:{}", shared.display()), "*".to_string()] {
        let r = td.mam().cwd(&deep).env("MAM_TRUSTED_ROOTS", &trusted).args(["paths"]).run();
        r.expect_rc(0);
        assert!(r.stdout().contains(&format!("control_root={}\n", shared.display())), "{}", r.stdout());
    }
    let r = td
        .mam()
        .cwd(&deep)
        .env("MAM_TRUSTED_ROOTS", &shared)
        .args(["registry", "register", "--session", "s1", "--job-id", "j1"])
        .run();
    r.expect_rc(0);
    assert!(dotmam.join("jobs/j1.json").is_file());
    // MAM_TRUSTED_ROOTS is taken from the environment only: an env file cannot trust a root.
    let f = td.write("trust.env", format!("MAM_TRUSTED_ROOTS={}\n", shared.display()));
    chmod(&f, 0o600);
    let r = td.mam().cwd(&deep).env("MAM_ENV_FILE", &f).args(["paths"]).run();
    r.expect_rc(1);
    assert!(r.stderr().contains(":1: MAM_TRUSTED_ROOTS is taken from the environment only; line skipped"));
}

#[test]
fn registry_or_logs_writable_by_others_is_refused() {
    let td = TestDir::new("sec-root-mode");
    let open = td.path("open");
    fs::create_dir_all(open.join("jobs")).unwrap();
    chmod(&open.join("jobs"), 0o777);
    let r = td.mam().env("MAM_JOBS_DIR", open.join("jobs")).args(["registry", "register", "--session", "s1"]).run();
    r.expect_rc(1);
    eqnice!(
        format!(
            "ERROR: {}: refused: writable by others (mode 0777); trust it with MAM_TRUSTED_ROOTS\n",
            open.join("jobs").display()
        ),
        r.stderr()
    );
    assert_eq!(tree(&open), vec!["jobs".to_string()]);
    // A registry that does not exist yet is judged by the directory it would be created in.
    chmod(&open.join("jobs"), 0o755);
    chmod(&open, 0o775);
    let r = td
        .mam()
        .env("DELEGATE_JOB_LOGS_DIR", open.join("logs"))
        .args(["registry", "register", "--session", "s1"])
        .run();
    r.expect_rc(1);
    assert!(
        r.stderr().contains(&format!("{}: refused: writable by group (mode 0775)", open.display())),
        "{}",
        r.stderr()
    );
    assert!(!open.join("logs").exists());
    chmod(&open, 0o755);
}

// ---------------------------------------------------------------------------------------------
// 3. No symlink followed when writing

#[test]
fn planted_events_log_and_audit_symlinks_are_not_followed() {
    let td = TestDir::new("sec-link-log");
    let port = free_port();
    let id = new_job(&td, port, &[]);
    let (v1, c1) = victim(&td, "victim-events");
    let (v2, c2) = victim(&td, "victim-audit");
    let ev = registry(&td).join(&id).join("events.log");
    fs::create_dir_all(ev.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&v1, &ev).unwrap();
    let audit = logs(&td).join(&id).join("audit.jsonl");
    fs::remove_file(&audit).ok();
    std::os::unix::fs::symlink(&v2, &audit).unwrap();
    let r = mam_at(&td, port).args(["publish", "--job-id", &id, "--event", "started"]).run();
    assert_eq!(fs::read(&v1).unwrap(), c1, "events.log's victim was appended to\n{}", r.stderr());
    assert_eq!(fs::read(&v2).unwrap(), c2, "audit.jsonl's victim was appended to\n{}", r.stderr());
    r.expect_rc(1);
    assert!(r.stderr().contains("events.log"), "{}", r.stderr());
    // With events.log fixed, the engine's audit append is what meets the link.
    fs::remove_file(&ev).unwrap();
    let r = td.mam().args(["registry", "status", &id, "--set", "running"]).run();
    assert_eq!(fs::read(&v2).unwrap(), c2, "audit.jsonl's victim was appended to\n{}", r.stderr());
    assert!(fs::symlink_metadata(&audit).unwrap().file_type().is_symlink());
}

#[test]
fn planted_lock_file_symlinks_create_nothing() {
    let td = TestDir::new("sec-link-lock");
    let target = td.path("created-by-root");
    fs::create_dir_all(registry(&td)).unwrap();
    std::os::unix::fs::symlink(&target, registry(&td).join(".registry.lock")).unwrap();
    let r = td.mam().args(["registry", "register", "--session", "s1", "--job-id", "j1"]).run();
    assert!(!target.exists(), "the registry lock's link target was created");
    r.expect_rc(1);
    assert!(r.stderr().contains(".registry.lock"), "{}", r.stderr());
    fs::remove_file(registry(&td).join(".registry.lock")).unwrap();
    let port = free_port();
    let id = new_job(&td, port, &[]);
    std::os::unix::fs::symlink(&target, registry(&td).join(format!("{id}.publish.lock"))).unwrap();
    let r = mam_at(&td, port).args(["publish", "--job-id", &id, "--event", "progress"]).run();
    assert!(!target.exists(), "the in-flight lock's link target was created\n{}", r.stderr());
    r.expect_rc(1);
}

#[test]
fn planted_heartbeat_log_symlink_is_not_followed() {
    let td = TestDir::new("sec-link-hb");
    let port = free_port();
    let id = new_job(&td, port, &[]);
    let _timers = TimerGuard(id.clone());
    let (v, c) = victim(&td, "victim-hb");
    let dir = logs(&td).join(&id);
    fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink(&v, dir.join("heartbeat.log")).unwrap();
    let r =
        mam_at(&td, port).args(["heartbeat", "start", "--job-id", &id, "--interval", "1", "--watch-pid", "0"]).run();
    r.expect_rc(1);
    assert!(r.stderr().contains("heartbeat.log"), "{}", r.stderr());
    assert!(timer_pids(&id).is_empty(), "a timer was started with its output on the victim");
    assert_eq!(fs::read(&v).unwrap(), c);
}

#[test]
fn monitor_lock_symlink_to_a_root_file_keeps_its_content() {
    let td = TestDir::new("sec-link-monitor");
    let (v, c) = victim(&td, "victim-monitor");
    std::os::unix::fs::symlink(&v, td.ws().join(".mam/monitor.lock")).unwrap();
    let got = mam::daemon::lock::acquire(&td.ws());
    assert!(got.is_err(), "the monitor lock was taken through a symlink: {got:?}");
    assert_eq!(fs::read(&v).unwrap(), c, "the link's target was truncated or overwritten");
    // Through the CLI too.
    let r = td.mam().args(["daemon", "run", "--workspace", td.ws().to_str().unwrap(), "--idle-timeout", "1"]).run();
    r.expect_rc(1);
    assert_eq!(fs::read(&v).unwrap(), c);
}

#[test]
fn record_rewritten_over_a_symlink_to_a_0644_file_ends_0600() {
    let td = TestDir::new("sec-link-record");
    let id = register_job(&td, &[], &["--job-id", "jr1"]);
    let rec = registry(&td).join(format!("{id}.json"));
    let (v, _) = victim(&td, "victim.json");
    fs::copy(&rec, &v).unwrap();
    chmod(&v, 0o644);
    let c = fs::read(&v).unwrap();
    fs::remove_file(&rec).unwrap();
    std::os::unix::fs::symlink(&v, &rec).unwrap();
    td.mam().args(["registry", "set-meta", &id, "note=x"]).run().expect_rc(0);
    let meta = fs::symlink_metadata(&rec).unwrap();
    assert!(meta.file_type().is_file(), "the record is a plain file again");
    assert_eq!(mode(&rec), 0o600, "the record took the link target's mode");
    assert_eq!(fs::read(&v).unwrap(), c, "the link's target was changed");
    assert_eq!(mode(&v), 0o644);
    // A plain record someone made 0644 is rewritten 0600 as well: it holds auth_token.
    chmod(&rec, 0o644);
    td.mam().args(["registry", "set-meta", &id, "note=y"]).run().expect_rc(0);
    assert_eq!(mode(&rec), 0o600);
}

#[test]
fn attacker_cannot_reach_a_victims_file_through_a_trusted_looking_registry() {
    // The same symlink planted by uid 65534 in a registry it owns, which root was told to trust:
    // root's write still does not follow it.
    if !can_attack() {
        return;
    }
    let td = TestDir::new("sec-link-nobody");
    let (v, c) = victim(&td, "victim-nobody");
    let reg = td.path("theirs/jobs");
    fs::create_dir_all(&reg).unwrap();
    chown_nobody(&td.path("theirs"));
    as_attacker(&td, &reg, &format!("ln -s {} .registry.lock", v.display()));
    let r = td
        .mam()
        .env("MAM_JOBS_DIR", &reg)
        .env("MAM_TRUSTED_ROOTS", td.path("theirs"))
        .args(["registry", "register", "--session", "s1", "--job-id", "j1"])
        .run();
    r.expect_rc(1);
    assert_eq!(fs::read(&v).unwrap(), c);
}

// ---------------------------------------------------------------------------------------------
// Issue 29: install, update and remove in a repository another user can write

/// A repository of uid 65534's (`<td>/repo`, `.git` a plain directory) in which it ran `script`.
fn attacker_repo(td: &TestDir, script: &str) -> PathBuf {
    let repo = td.path("repo");
    fs::create_dir_all(&repo).unwrap();
    chown_nobody(&repo);
    as_attacker(td, &repo, &format!("set -e; mkdir .git; {script}"));
    repo
}

/// Every file under `dir` that has a setuid or setgid bit.
fn setid_files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).unwrap().flatten() {
        let m = fs::symlink_metadata(e.path()).unwrap();
        if m.is_dir() {
            out.extend(setid_files(&e.path()));
        } else if m.mode() & 0o6000 != 0 && m.uid() == 0 {
            out.push(e.path().display().to_string());
        }
    }
    out
}

#[test]
fn planted_update_backup_index_never_writes_deletes_or_setuids_outside_the_repo() {
    if !can_attack() {
        return;
    }
    for (n, line) in ["absent VICTIM", "file 0 644 ../written-outside", "file 0 6755 .mam/evil", "stamp ../../x"]
        .into_iter()
        .enumerate()
    {
        let td = TestDir::new("sec-i-index");
        let (v, c) = victim(&td, "victim.txt");
        let line = line.replace("VICTIM", &v.display().to_string());
        let index = format!("stamp 20260101T000000Z\n{line}\n");
        let repo = attacker_repo(
            &td,
            &format!(
                "mkdir -p .mam/install/update-backup; printf '.mam/bin/mam\\n' > .mam/install/manifest.txt; printf 'evil' > .mam/install/update-backup/f0; printf '{}' > .mam/install/update-backup/index",
                index.replace('\n', "\\n")
            ),
        );
        let index_path = repo.join(".mam/install/update-backup/index");
        assert!(index_path.is_file(), "{n}");
        let before = tree(&td.path(""));
        // Untrusted: refused at the first directory that is not root's, which is named.
        for cmd in ["install", "update"] {
            let r = td.mam().args([cmd, "--target"]).args([&repo]).run();
            r.expect_rc(2);
            let want =
                format!("REFUSED: {cmd}: {}: owned by uid {NOBODY}, not you (uid 0);", repo.join(".mam").display());
            assert!(r.stderr().starts_with(&want), "{line}: {}", r.stderr());
            assert!(r.stderr().contains("MAM_TRUSTED_ROOTS"), "{}", r.stderr());
        }
        // Trusted by name: the index itself is still checked, and refused as a whole.
        let r = td.mam().env("MAM_TRUSTED_ROOTS", &repo).args(["install", "--target"]).args([&repo]).run();
        r.expect_rc(1);
        assert!(
            r.stderr().contains("\nREFUSED: install: .mam/install/update-backup/index line 2: "),
            "{line}: {}",
            r.stderr()
        );
        assert_eq!(fs::read(&v).unwrap(), c, "{line}: the victim outside the repository was changed");
        assert!(!td.path("written-outside").exists(), "{line}: wrote outside the repository");
        assert_eq!(setid_files(&td.path("")), Vec::<String>::new(), "{line}");
        assert_eq!(before, tree(&td.path("")), "{line}: something changed");
    }
}

#[test]
fn planted_setuid_gitignore_is_refused_and_never_becomes_roots() {
    if !can_attack() {
        return;
    }
    // A program owned by uid 65534, setuid, named .gitignore; no .mam at all.
    let td = TestDir::new("sec-i-gi");
    let repo = attacker_repo(&td, "cp /bin/true .gitignore; chmod 6755 .gitignore");
    for cmd in ["install", "remove"] {
        let r = td.mam().args([cmd, "--target"]).args([&repo]).run();
        let gi = repo.join(".gitignore");
        assert!(
            r.stderr().contains(&format!("{}: owned by uid {NOBODY}, not you (uid 0)", gi.display())),
            "{cmd}: {}",
            r.stderr()
        );
        assert_eq!(r.rc(), 2, "{cmd}: {}", r.stderr());
        assert_eq!(fs::metadata(&gi).unwrap().uid(), NOBODY);
    }
    // Trusted, it is still no text file.
    let r = td.mam().env("MAM_TRUSTED_ROOTS", &repo).args(["install", "--target"]).args([&repo]).run();
    r.expect_rc(2);
    assert!(r.stderr().contains(".gitignore is not text (a NUL byte at offset"), "{}", r.stderr());
    assert_eq!(setid_files(&repo), Vec::<String>::new());
    assert!(!repo.join(".mam").exists(), "nothing installed");
    // A text .gitignore with setuid bits, trusted: installed, and rewritten without them.
    let td = TestDir::new("sec-i-gi2");
    let repo = attacker_repo(&td, "printf 'target\\n' > .gitignore; chmod 6755 .gitignore");
    let r = td.mam().env("MAM_TRUSTED_ROOTS", &repo).args(["install", "--target"]).args([&repo]).run();
    r.expect_rc(0);
    let gi = repo.join(".gitignore");
    assert!(fs::read_to_string(&gi).unwrap().starts_with("target\n# >>> mam managed >>>\n"));
    assert_eq!(mode(&gi), 0o755);
    assert_eq!(setid_files(&repo), Vec::<String>::new());
}

#[test]
fn install_race_a_directory_swapped_for_a_symlink_after_its_check_writes_nothing_outside() {
    // The test hook swaps `.agents/skills/create` for a symlink to a directory outside the
    // repository after the walk reached it and before the SKILL.md is written (the window a
    // check-then-write leaves); the write lands in the directory that was checked, never outside.
    let td = TestDir::new("sec-i-race");
    let repo = td.path("repo");
    fs::create_dir_all(repo.join(".git")).unwrap();
    let outside = td.path("outside");
    fs::create_dir_all(&outside).unwrap();
    let r = td
        .mam()
        .env("MAM_TEST_INSTALL_SWAP", format!(".agents/skills/create:{}", outside.display()))
        .args(["install", "--target"])
        .args([&repo])
        .run();
    assert!(fs::symlink_metadata(repo.join(".agents/skills/create")).unwrap().file_type().is_symlink(), "hook ran");
    assert_eq!(tree(&outside), Vec::<String>::new(), "wrote through the swapped-in link: {}", r.stderr());
    assert!(repo.join(".agents/skills/create.orig/SKILL.md").is_file(), "{}", r.stderr());
}

#[test]
fn remove_race_a_directory_swapped_for_a_symlink_after_its_check_deletes_nothing_outside() {
    // As above for remove: the pristine SKILL.md is planned for deletion, then its directory is
    // swapped for a link to a directory holding a file of the same name; that file stays.
    let td = TestDir::new("sec-r-race");
    let repo = td.path("repo");
    fs::create_dir_all(repo.join(".git")).unwrap();
    td.mam().args(["install", "--target"]).args([&repo]).run().expect_rc(0);
    let outside = td.path("outside");
    fs::create_dir_all(&outside).unwrap();
    let skill = fs::read(repo.join(".agents/skills/create/SKILL.md")).unwrap();
    fs::write(outside.join("SKILL.md"), &skill).unwrap();
    let r = td
        .mam()
        .env("MAM_TEST_INSTALL_SWAP", format!(".agents/skills/create:{}", outside.display()))
        .args(["remove", "--target"])
        .args([&repo])
        .run();
    assert!(fs::symlink_metadata(repo.join(".agents/skills/create")).unwrap().file_type().is_symlink(), "hook ran");
    assert_eq!(
        fs::read(outside.join("SKILL.md")).unwrap(),
        skill,
        "deleted through the swapped-in link: {}",
        r.stderr()
    );
    assert!(!repo.join(".agents/skills/create.orig/SKILL.md").exists(), "{}", r.stderr());
}

#[test]
fn install_and_remove_against_a_looping_link_swapper_change_nothing_outside() {
    // A real attacker for a bounded time: uid 65534 owns `.agents` and swaps root's
    // `.agents/skills` for a symlink to a directory of root's in a loop while root installs and
    // removes; whatever step the swap lands between, nothing in that directory is written or deleted.
    if !can_attack() {
        return;
    }
    let td = TestDir::new("sec-i-loop");
    let repo = td.path("repo");
    fs::create_dir_all(repo.join(".git")).unwrap();
    fs::create_dir_all(repo.join(".agents")).unwrap();
    chown_nobody(&repo.join(".agents"));
    td.mam().args(["install", "--target"]).args([&repo]).run().expect_rc(0);
    // The victim directory: root's, holding the very files install writes and remove deletes.
    let outside = td.path("outside");
    let st = Command::new("cp").arg("-a").arg(repo.join(".agents/skills")).arg(&outside).status().unwrap();
    assert!(st.success());
    let before: Vec<(String, Vec<u8>)> =
        tree(&outside).into_iter().map(|p| (p.clone(), fs::read(outside.join(&p)).unwrap_or_default())).collect();
    td.mam().args(["remove", "--target"]).args([&repo]).run().expect_rc(0);
    // remove took the emptied `.agents` too: the attacker's again.
    fs::create_dir_all(repo.join(".agents")).unwrap();
    // A file of the attacker's keeps `.agents` from ever being empty, so no remove takes it.
    fs::write(repo.join(".agents/keep"), "").unwrap();
    chown_nobody(&repo.join(".agents"));
    let script = format!(
        "while :; do mv skills s.x 2>/dev/null && ln -s {} skills && rm -f skills && mv s.x skills; done",
        outside.display()
    );
    let mut attacker = td
        .command("timeout")
        .args(["120", "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", &script])
        .cwd(repo.join(".agents"))
        .spawn_bg(&td, "swapper");
    for _ in 0..6 {
        let _ = td.mam().args(["install", "--target"]).args([&repo]).run();
        let _ = td.mam().args(["remove", "--target"]).args([&repo]).run();
    }
    attacker.kill();
    let after: Vec<(String, Vec<u8>)> =
        tree(&outside).into_iter().map(|p| (p.clone(), fs::read(outside.join(&p)).unwrap_or_default())).collect();
    assert_eq!(before, after, "the directory behind the swapped-in link changed");
}

// ---------------------------------------------------------------------------------------------
// Issue 29 item 2: another user's tmux or herdr server

/// The attacker's own tmux server (uid 65534) on `sock`, killed on drop.
struct AttackerTmux<'a> {
    td: &'a TestDir,
    sock: PathBuf,
}

impl<'a> AttackerTmux<'a> {
    /// Creates `sock`'s directory (mode 0777, the attacker's) and starts a server with one session.
    fn start(td: &'a TestDir, sock: PathBuf) -> AttackerTmux<'a> {
        let dir = sock.parent().unwrap().to_path_buf();
        let parent = dir.parent().unwrap();
        as_attacker(
            td,
            parent,
            &format!(
                // SHELL: nobody's login shell is nologin, which would end the session at once.
                "mkdir -p -m 777 {d} && SHELL=/bin/sh tmux -S {s} new-session -d -s bait 'sleep 120'",
                d = dir.display(),
                s = sock.display()
            ),
        );
        assert_eq!(fs::symlink_metadata(&sock).unwrap().uid(), NOBODY, "the attacker's socket");
        let r = td.command("tmux").args(["-S"]).args([&sock]).args(["list-sessions", "-F", "#{session_name}"]).run();
        assert_eq!(r.stdout(), "bait\n", "the attacker's server answers root: {}", r.stderr());
        AttackerTmux { td, sock }
    }
}

impl Drop for AttackerTmux<'_> {
    fn drop(&mut self) {
        let _ = self
            .td
            .command("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "tmux", "-S"])
            .args([&self.sock])
            .args(["kill-server"])
            .run();
    }
}

/// A server name that leads out of root's tmux socket directory (`-L ../../<path>`) reaches the
/// attacker's server: refused as a name before tmux runs. A `TMUX_TMPDIR` where the attacker made
/// `tmux-0/` first and runs a server: refused with the path and its owner (tmux refuses that
/// directory too, but with no word of whose it is).
#[test]
fn i29_root_never_talks_to_another_users_tmux_server() {
    if !can_attack() || !have_tool("tmux", "MAM_REQUIRE_TMUX") {
        return;
    }
    let td = TestDir::new("i29-tmux");
    let shared = td.path("shared");
    fs::create_dir_all(&shared).unwrap();
    chmod(&shared, 0o1777);
    let pane = |server: Option<&str>, tmpdir: &Path, sock: &str| {
        let mut c = td
            .mam()
            .env("MAM_PANE_BACKEND", "tmux")
            .env("MAM_NO_AUTOSTART", "1")
            .env("TMUX_TMPDIR", tmpdir)
            .env("MAM_TMUX_SOCKET", sock)
            .args(["pane", "ls"]);
        if let Some(s) = server {
            c = c.args(["--server", s]);
        }
        c.run()
    };
    // 1. The traversal: `-L ../../<the attacker's socket>` from /tmp/tmux-0.
    let evil = AttackerTmux::start(&td, shared.join("evil/sock"));
    let name = format!("../..{}", evil.sock.display());
    let r = pane(Some(&name), Path::new("/tmp"), "mam");
    // `pane ls` exits 3 (state unknown) when it cannot list; 0 would be the attacker's list.
    assert_eq!(r.rc(), 3, "root's mam reached the attacker's server:\n{}{}", r.stdout(), r.stderr());
    assert!(r.stderr().contains("tmux server name '../..") && r.stderr().contains("contains '/'"), "{}", r.stderr());
    drop(evil);
    // 2. The attacker's tmux-0 in a shared TMUX_TMPDIR.
    let uid = mam::sys::getuid();
    let sock = shared.join(format!("tmux-{uid}/mam-i29"));
    let _evil = AttackerTmux::start(&td, sock.clone());
    let r = pane(None, &shared, "mam-i29");
    r.expect_rc(3);
    let line = r.stderr();
    assert!(
        line.contains(&format!("REFUSED: server socket {}:", sock.display()))
            && line.contains(&format!("owned by uid {NOBODY}, not you (uid 0) or root")),
        "{line}"
    );
    assert_eq!(line.lines().count(), 1, "one line: {line}");
    // 3. `mam attach` to a session recorded on that server runs and prints nothing for it.
    fs::create_dir_all(td.ws().join(".mam")).unwrap();
    fs::write(
        td.ws().join(".mam/agent_sessions.json"),
        r#"{"herdr_sessions":[{"name":"w","agent":"claude","status":"running","backend":"tmux","pane":{"id":"%0","server":"mam-i29"}}]}"#,
    )
    .unwrap();
    let r = td.mam().env("TMUX_TMPDIR", &shared).env_remove("TMUX").args(["attach", "w", "--print"]).run();
    assert_ne!(r.rc(), 0, "{}{}", r.stdout(), r.stderr());
    assert!(r.stdout().is_empty(), "printed a way to the attacker's server: {}", r.stdout());
    assert!(r.stderr().contains(&format!("owned by uid {NOBODY}")), "{}", r.stderr());
}

/// The attacker's own herdr server (uid 65534) for session `name` under the config directory
/// `config` it made in a shared directory; stopped and reaped on drop.
struct AttackerHerdr<'a> {
    td: &'a TestDir,
    env: Vec<(&'static str, PathBuf)>,
    herdr: PathBuf,
    name: String,
    server: Option<Background>,
}

impl AttackerHerdr<'_> {
    fn command(&self) -> Cmd {
        let mut c = self.td.command("setpriv").args(["--reuid=65534", "--regid=65534", "--clear-groups"]);
        for (k, v) in &self.env {
            c = c.env(k, v);
        }
        c.env("HERDR_DISABLE_SOUND", "1")
            .env("SHELL", "/bin/sh")
            .args([self.herdr.as_os_str()])
            .args(["--session", &self.name])
    }
}

impl Drop for AttackerHerdr<'_> {
    fn drop(&mut self) {
        let _ = self.command().args(["server", "stop"]).run();
        drop(self.server.take());
    }
}

/// Root's herdr config directory lies in a shared directory where uid 65534 made
/// `cfg/herdr/sessions/<name>/` first and runs its own herdr server: root's mam refuses it, naming
/// the path and its owner, where it listed the attacker's server before.
#[test]
fn i29_root_never_talks_to_another_users_herdr_server() {
    if !can_attack() {
        return;
    }
    let td = TestDir::new("i29-herdr");
    let Some(h) = HerdrHome::new(&td) else { return };
    let shared = base_dir().join(format!("hs-{}", rand_hex(2)));
    fs::create_dir_all(&shared).unwrap();
    chmod(&shared, 0o1777);
    as_attacker(
        &td,
        &shared,
        "mkdir -p cfg/herdr home run && chmod 700 run && printf 'onboarding = false\\n[terminal]\\n\
         default_shell = \"/bin/sh\"\\n[update]\\nversion_check = false\\nmanifest_check = false\\n' \
         > cfg/herdr/config.toml",
    );
    let config = shared.join("cfg");
    let mut attacker = AttackerHerdr {
        td: &td,
        env: vec![
            ("HOME", shared.join("home")),
            ("XDG_CONFIG_HOME", config.clone()),
            ("XDG_RUNTIME_DIR", shared.join("run")),
        ],
        herdr: h.herdr.clone(),
        name: "evil".into(),
        server: None,
    };
    attacker.server = Some(attacker.command().args(["server"]).spawn_bg(&td, "attacker-herdr"));
    let sock = config.join("herdr/sessions/evil/herdr.sock");
    wait_until("the attacker's herdr socket", std::time::Duration::from_secs(15), || sock.exists());
    assert_eq!(fs::symlink_metadata(&sock).unwrap().uid(), NOBODY);
    let r = h
        .apply(td.mam())
        .env("XDG_CONFIG_HOME", &config)
        .env("MAM_PANE_BACKEND", "herdr")
        .env("MAM_NO_AUTOSTART", "1")
        .env("MAM_HERDR_SESSION", "evil")
        .args(["pane", "ls"])
        .run();
    // `pane ls` exits 3 (state unknown) when it cannot list; 0 would be the attacker's list.
    assert_eq!(r.rc(), 3, "root's mam reached the attacker's herdr:\n{}{}", r.stdout(), r.stderr());
    let err = r.stderr();
    assert!(
        err.contains(&format!("REFUSED: server socket {}:", sock.display()))
            && err.contains(&format!("owned by uid {NOBODY}, not you (uid 0) or root")),
        "{err}"
    );
}
