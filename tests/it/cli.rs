//! The command-line frame: help, version, unknown commands and flags, shims.

use crate::support::*;

const READY: &[&str] = &["env", "paths", "registry", "pub", "sub", "daemon", "reconcile", "jobs"];

#[test]
fn help_lists_every_subcommand_with_one_line() {
    let td = TestDir::new("help");
    let r = td.mam().args(["--help"]).run();
    r.expect_rc(0);
    let out = r.stdout();
    for name in
        ["env", "paths", "registry", "publish", "heartbeat", "watch", "remote", "daemon", "broker", "delegate-job"]
    {
        assert!(out.lines().any(|l| l.trim_start().starts_with(&format!("{name} "))), "{name} missing:\n{out}");
    }
    // No arguments: help on stderr, usage exit code.
    let r = td.mam().run();
    r.expect_rc(2);
    assert!(r.stderr().contains("Usage: mam <command>"));
}

#[test]
fn version_prints_the_crate_version() {
    let td = TestDir::new("version");
    let r = td.mam().args(["--version"]).run();
    r.expect_rc(0);
    // ORCH 7.6 (A54): `mam <version> (<commit|unknown>)`.
    assert_eq!(r.stdout(), format!("mam {} ({})\n", env!("CARGO_PKG_VERSION"), mam::version::COMMIT));
}

#[test]
fn every_subcommand_has_help() {
    let td = TestDir::new("subhelp");
    let listing = td.mam().args(["--help"]).run().stdout();
    let names: Vec<String> = listing
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.is_empty())
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect();
    assert!(names.len() >= 10, "{names:?}");
    for name in &names {
        let r = td.mam().args([name.as_str(), "--help"]).run();
        r.expect_rc(0);
        assert!(r.stdout().contains("Usage: mam"), "{name}: {}", r.stdout());
        assert!(r.stderr().is_empty(), "{name}: {}", r.stderr());
    }
}

#[test]
fn unknown_flag_is_one_line_and_rc_2() {
    let td = TestDir::new("badflag");
    for cmd in READY {
        let r = td.mam().args([*cmd, "--no-such-flag"]).run();
        r.expect_rc(2);
        let err = r.stderr();
        assert_eq!(err.lines().count(), 1, "{cmd}: {err}");
        assert!(err.starts_with("ERROR: ") && err.contains("--no-such-flag"), "{cmd}: {err}");
    }
}

#[test]
fn unknown_command_is_rc_2() {
    let td = TestDir::new("badcmd");
    let r = td.mam().args(["frobnicate"]).run();
    r.expect_rc(2);
    assert_eq!(r.stderr(), "ERROR: unknown command 'frobnicate' (see mam --help)\n");
    // Issue 18: a slip gets the closest command.
    let r = td.mam().args(["stauts"]).run();
    r.expect_rc(2);
    assert_eq!(r.stderr(), "ERROR: unknown command 'stauts'; did you mean 'mam status'? (see mam --help)\n");
}

/// Issue 18: an unknown flag names the command, the closest flag and the help.
#[test]
fn unknown_flag_names_command_closest_flag_and_help() {
    let td = TestDir::new("flaghint");
    let r = td.mam().args(["create", "claude", "--nmae", "w1"]).run();
    r.expect_rc(2);
    assert_eq!(
        r.stderr(),
        "ERROR: mam create: unknown flag '--nmae'; did you mean '--name'? (see mam create --help)\n"
    );
    let r = td.mam().args(["jobs", "--zzzzzzzzzz"]).run();
    r.expect_rc(2);
    assert_eq!(r.stderr(), "ERROR: mam jobs: unknown flag '--zzzzzzzzzz' (see mam jobs --help)\n");
}

#[test]
fn unfinished_commands_say_so_and_exit_2() {
    let td = TestDir::new("notyet");
    let listing = td.mam().args(["--help"]).run().stdout();
    let pending: Vec<&str> = listing
        .lines()
        .filter(|l| l.ends_with("(not yet available)"))
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    for name in pending {
        let r = td.mam().args([name]).run();
        r.expect_rc(2);
        assert!(r.stderr().contains("not yet available"), "{name}: {}", r.stderr());
        assert!(r.stdout().is_empty());
    }
}

/// The shim is found from another directory and passes its arguments through untouched.
#[test]
fn shim_execs_binary_with_arguments_untouched() {
    let td = TestDir::new("shim");
    let shim = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("shims/envfile");
    // A stand-in binary that prints its argv one per line, found through MAM_BIN.
    let fake = td.write("bin/fake-mam", "#!/bin/sh\nfor a in \"$@\"; do printf '<%s>\\n' \"$a\"; done\n");
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let weird = ["--shell", "a b", "it's", "\"q\"", "", "$HOME", "*", "x\ny"];
    let r = td.command(&shim).env("MAM_BIN", &fake).cwd("/").args(weird).run();
    r.expect_rc(0);
    let want: String = std::iter::once("env").chain(weird).map(|a| format!("<{a}>\n")).collect();
    eqnice!(want, r.stdout());

    // Without MAM_BIN: <shim dir>/../bin/mam is used.
    let shims = td.path("inst/shims");
    std::fs::create_dir_all(&shims).unwrap();
    std::fs::create_dir_all(td.path("inst/bin")).unwrap();
    std::fs::copy(&shim, shims.join("envfile")).unwrap();
    std::fs::copy(&fake, td.path("inst/bin/mam")).unwrap();
    let r = td.command(shims.join("envfile")).cwd("/").args(["--path", "two words"]).run();
    r.expect_rc(0);
    eqnice!("<env>\n<--path>\n<two words>\n", r.stdout());
}

/// The real binary behind the shim: `envfile --shell` prints the same exports as `mam env --shell`.
#[test]
fn shim_envfile_runs_mam_env() {
    let td = TestDir::new("shimreal");
    let f = td.write("x.env", "A=1\n");
    let shim = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("shims/envfile");
    let r = td.command(&shim).env("MAM_BIN", mam_bin()).env("MAM_ENV_FILE", &f).cwd("/").args(["--shell"]).run();
    r.expect_rc(0);
    eqnice!("export A='1'\n", r.stdout());
}

/// Issue 32 item 10: an extra argument names the command and its help (it said only
/// `ERROR: unexpected argument "extra"`).
#[test]
fn an_unexpected_argument_names_the_command_and_its_help() {
    let td = TestDir::new("extra-arg");
    let r = td.mam().args(["jobs", "extra"]).run();
    r.expect_rc(2);
    assert_eq!(r.stderr(), "ERROR: mam jobs: unexpected argument \"extra\" (see mam jobs --help)\n");
}

/// Issue 32 item 10: built from a git checkout, `mam --version` carries the commit.
#[test]
fn the_version_carries_the_commit_of_a_git_build() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    if !root.join(".git").exists() || std::env::var_os("MAM_SOURCE_COMMIT").is_some() {
        return;
    }
    let out = std::process::Command::new("git").arg("-C").arg(root).args(["rev-parse", "--short=12", "HEAD"]).output();
    let Some(out) = out.ok().filter(|o| o.status.success()) else { return };
    let head = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let td = TestDir::new("version-commit");
    let v = td.mam().args(["--version"]).run().stdout();
    assert_eq!(v, format!("mam {} ({head})\n", env!("CARGO_PKG_VERSION")));
}

/// Issue 32 item 10: every command of `mam --help` prints its help with exit codes (rc 0) and
/// refuses an unknown flag with rc 2 on one line naming `mam <command>` and its `--help`; the README's
/// exit-code table names every command whose codes go past 2.
#[test]
fn every_command_documents_its_exit_codes_and_names_itself_in_usage_errors() {
    let td = TestDir::new("every-cmd");
    let top = td.mam().args(["--help"]).run().stdout();
    let cmds: Vec<String> = top
        .split("Commands:\n")
        .nth(1)
        .unwrap()
        .lines()
        .take_while(|l| !l.is_empty())
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect();
    assert!(cmds.len() > 30, "{cmds:?}");
    let readme = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let table = readme.split("### Exit codes").nth(1).expect("README's exit-code table");
    for c in &cmds {
        let r = td.mam().args([c.as_str(), "--help"]).run();
        assert_eq!(r.rc(), 0, "{c}");
        assert!(r.stdout().contains("Exit codes"), "mam {c} --help lists no exit codes");
        let beyond = r
            .stdout()
            .split("Exit codes")
            .nth(1)
            .unwrap()
            .split([',', ';'])
            .any(|p| p.split_whitespace().any(|w| w.parse::<u32>().is_ok_and(|n| (3..100).contains(&n))));
        if beyond && !["bench", "install", "update", "resume", "worktree"].contains(&c.as_str()) {
            assert!(table.contains(&format!("`{c}`")), "README's exit-code table lacks `{c}`");
        }
        let r = td.mam().args([c.as_str(), "--no-such-flag"]).run();
        assert_eq!(r.rc(), 2, "{c}: {}", r.stderr());
        let line = r.stderr();
        assert_eq!(line.lines().count(), 1, "{line}");
        assert!(line.contains(&format!("mam {c}")) && line.contains("--help"), "{line}");
    }
}
