//! The env file (CORE 1), tested through `mam env` and the other entry points: E1-E14 and bad input.

use std::fs;
use std::os::unix::fs::PermissionsExt;

use crate::support::*;

/// `mam env --shell` on a file with `content`; returns the run.
fn shell(td: &TestDir, content: &[u8]) -> Run {
    let f = td.write("t.env", content);
    td.mam().env("MAM_ENV_FILE", &f).args(["env", "--shell"]).run()
}

#[test]
fn e1_comments_blanks_padding_quotes_crlf() {
    let td = TestDir::new("e1");
    let r = shell(&td, b"# comment\n\n   \n  A = 1  \r\nB='q'\r\nC=\"q\"\n\tD\t=\t x y \t\n");
    r.expect_rc(0);
    eqnice!("export A='1'\nexport B='q'\nexport C='q'\nexport D='x y'\n", r.stdout());
    assert_eq!(r.stderr(), "");
}

#[test]
fn e2_values_stay_literal() {
    let td = TestDir::new("e2");
    let r = shell(&td, b"A=$HOME/x\nB=`id`\nC=\"a'b\"\n");
    r.expect_rc(0);
    eqnice!("export A='$HOME/x'\nexport B='`id`'\nexport C='a'\\''b'\n", r.stdout());
}

#[test]
fn e3_export_prefix_is_skipped_with_line_number() {
    let td = TestDir::new("e3");
    let r = shell(&td, b"X=0\nexport FOO=1\n");
    r.expect_rc(0);
    eqnice!("export X='0'\n", r.stdout());
    let err = r.stderr();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("WARNING: ") && err.contains(":2: export prefix is not supported; line skipped"), "{err}");
    assert!(!err.contains("=1"), "the value leaked: {err}");
}

#[test]
fn e4_bash_owned_keys_are_skipped() {
    let td = TestDir::new("e4");
    let r = shell(&td, b"SHLVL=9\nBASH_ENV=/x\nOK=1\n");
    r.expect_rc(0);
    eqnice!("export OK='1'\n", r.stdout());
    let err = r.stderr();
    assert!(err.contains(":1: key is owned by bash; line skipped"), "{err}");
    assert!(err.contains(":2: key is owned by bash; line skipped"), "{err}");
    assert!(!err.contains("/x") || err.contains("t.env"), "{err}");
}

#[test]
fn e5_hash_after_start_is_part_of_value() {
    let td = TestDir::new("e5");
    eqnice!("export A='b # c'\n", shell(&td, b"A=b # c\n").stdout());
}

#[test]
fn e6_environment_wins_even_when_empty() {
    let td = TestDir::new("e6");
    let f = td.write("t.env", "A=file\nB=file\n");
    for a in ["", "env"] {
        let r = td.mam().env("MAM_ENV_FILE", &f).env("A", a).args(["env", "--shell"]).run();
        r.expect_rc(0);
        eqnice!("export B='file'\n", r.stdout());
    }
}

#[test]
fn e7_first_value_wins() {
    let td = TestDir::new("e7");
    let r = shell(&td, b"A=1\nA=2\n");
    eqnice!("export A='1'\n", r.stdout());
    assert!(r.stderr().contains(":2: duplicate key; first value kept; line skipped"), "{}", r.stderr());
    // The overlay agrees with --shell: in-process, one Ctx.
    let f = td.path("t.env");
    let mut ctx = mam::ctx::Ctx::with_env([("MAM_ENV_FILE", f.as_os_str())], &td.ws());
    mam::envfile::ensure_env_loaded(&mut ctx).unwrap();
    assert_eq!(ctx.var("A").as_deref(), Some("1"));
}

#[test]
fn e8_bom_is_stripped() {
    let td = TestDir::new("e8");
    let r = shell(&td, b"\xEF\xBB\xBFA=1\n");
    r.expect_rc(0);
    eqnice!("export A='1'\n", r.stdout());
    assert_eq!(r.stderr(), "");
}

#[test]
fn e9_nul_line_is_skipped() {
    let td = TestDir::new("e9");
    let r = shell(&td, b"A=1\nB=le\0ft\nC=3\n");
    r.expect_rc(0);
    eqnice!("export A='1'\nexport C='3'\n", r.stdout());
    assert!(r.stderr().contains(":2: contains NUL; line skipped"), "{}", r.stderr());
}

/// Every entry point that loads the env file, with the arguments that reach the loading step.
const LOADERS: &[&[&str]] = &[
    &["env", "--shell"],
    &["paths"],
    &["registry", "paths"],
    &["registry", "list"],
    &["registry", "register", "--session", "s1"],
    &["pub", "-t", "x", "-m", "y"],
    &["sub", "-t", "x"],
    &["publish", "--job-id", "j1", "--event", "started"],
    &["heartbeat", "status", "--job-id", "j1"],
    &["watch", "--job-id", "j1"],
    &["remote", "run", "--session", "s1", "--exec", "true"],
    &["remote", "dispatch", "--job-id", "j1"],
    &["daemon", "status"],
    &["daemon", "ensure"],
    &["reconcile", "--subscribe"],
    &["jobs"],
    &["bench", "loop-round", "--repo", ".", "--base", "HEAD"],
];

fn e10_check(td: &TestDir, file: &std::path::Path, kind: &str, unprivileged: bool) {
    for args in LOADERS {
        let mut cmd = if unprivileged {
            td.command("setpriv").args(["--reuid=65534", "--regid=65534", "--clear-groups"]).args([mam_bin()])
        } else {
            td.mam()
        };
        cmd = cmd.env("MAM_ENV_FILE", file).env("MAM_JOBS_DIR", td.path("reg/jobs"));
        let r = cmd.args(args.iter()).run();
        r.expect_rc(1);
        eqnice!(format!("ERROR: {}: cannot read ({kind})\n", file.display()), r.stderr());
        assert_eq!(r.stdout(), "", "{args:?}");
        assert!(!td.path("reg").exists(), "{args:?} created the registry");
        assert_eq!(tree(&td.ws()), vec![".mam".to_string()], "{args:?} wrote into the control root");
    }
}

#[test]
fn e10_unreadable_and_undecodable_files_fail_every_entry_point() {
    let td = TestDir::new("e10");
    let bad = td.write("bad.env", b"A=\xff\xfe\n");
    e10_check(&td, &bad, "UnicodeDecodeError", false);

    let locked = td.write("locked.env", b"A=1\n");
    fs::set_permissions(&locked, fs::Permissions::from_mode(0o000)).unwrap();
    if mam::sys::getuid() == 0 {
        // Root reads mode-000 files: run as nobody (A31). The test tree must be reachable for it.
        // setpriv is part of util-linux, which every Debian system has.
        let bin = mam_bin();
        let dirs = std::iter::successors(Some(td.root.as_path()), |p| p.parent())
            .chain(std::iter::successors(bin.parent(), |p| p.parent()));
        for dir in dirs {
            let mode = fs::metadata(dir).unwrap().permissions().mode();
            if mode & 0o001 == 0 {
                eprintln!("skipped: {} is not searchable by others", dir.display());
                return;
            }
        }
        e10_check(&td, &locked, "PermissionError", true);
    } else {
        e10_check(&td, &locked, "PermissionError", false);
    }
}

#[test]
fn e11_missing_explicit_file_disables_ambient_search() {
    let td = TestDir::new("e11");
    td.write("ws/.mam.env", "A=1\n");
    let r = td.mam().env("MAM_ENV_FILE", td.path("nope.env")).args(["env", "--shell"]).run();
    r.expect_rc(0);
    assert_eq!(r.stdout(), "");
    assert_eq!(r.stderr(), "");
    // Without MAM_ENV_FILE the ambient ./.mam.env is found, which proves the skip above mattered.
    let r = td.mam().env_remove("MAM_ENV_FILE").args(["env", "--shell"]).run();
    eqnice!("export A='1'\n", r.stdout());
    // A dangling symlink counts as missing.
    std::os::unix::fs::symlink(td.path("gone"), td.path("dangling.env")).unwrap();
    let r = td.mam().env("MAM_ENV_FILE", td.path("dangling.env")).args(["env", "--shell"]).run();
    r.expect_rc(0);
    assert_eq!(r.stdout(), "");
}

#[test]
fn e11b_workspace_root_file_before_cwd_file() {
    let td = TestDir::new("e11b");
    td.write("ws/.mam.env", "A=cwd\n");
    td.write("other/.mam.env", "A=ws\n");
    let r = td.mam().env_remove("MAM_ENV_FILE").env("WORKSPACE_ROOT", td.path("other")).args(["env", "--shell"]).run();
    eqnice!("export A='ws'\n", r.stdout());
    let r = td.mam().env_remove("MAM_ENV_FILE").env("WORKSPACE_ROOT", td.path("other")).args(["env", "--path"]).run();
    eqnice!(format!("{}\n", td.path("other/.mam.env").display()), r.stdout());
}

#[test]
fn e12_shell_output_round_trips_through_bash_eval() {
    let td = TestDir::new("e12");
    let values = ["a b  c", "it's", "\"dq\"", "$HOME and ${X}", "back\\slash", "`id`", "tab\there", "semi;colon|&"];
    let mut file = String::new();
    for (i, v) in values.iter().enumerate() {
        file.push_str(&format!("V{i}='{v}'\n"));
    }
    let f = td.write("t.env", &file);
    let mut script = String::from("eval \"$(\"$MAM\" env --shell)\" || exit 9\n");
    for i in 0..values.len() {
        script.push_str(&format!("printf '%s\\0' \"$V{i}\"\n"));
    }
    let r = td.command("bash").env("MAM", mam_bin()).env("MAM_ENV_FILE", &f).args(["-c", &script]).run();
    r.expect_rc(0);
    let want: Vec<u8> = values.iter().flat_map(|v| v.bytes().chain([0])).collect();
    assert_eq!(r.out.stdout, want, "{}", r.stdout());
}

/// Load once, after success (CORE 1.4): in one process and one Ctx, a failure applies nothing and is
/// retried; a success is never read again.
#[test]
fn e13_load_once_after_success() {
    let td = TestDir::new("e13");
    let f = td.write("t.env", b"A=\xff\n");
    let mut ctx = mam::ctx::Ctx::with_env([("MAM_ENV_FILE", f.as_os_str())], &td.ws());
    for _ in 0..2 {
        let e = mam::cli::load_env(&mut ctx).unwrap_err();
        assert_eq!(e.rc, 1);
        assert_eq!(e.line, format!("ERROR: {}: cannot read (UnicodeDecodeError)", f.display()));
        assert_eq!(ctx.var("A"), None);
        assert!(!ctx.env_loaded());
    }
    fs::write(&f, "A=1\n").unwrap();
    mam::cli::load_env(&mut ctx).unwrap();
    assert_eq!(ctx.var("A").as_deref(), Some("1"));
    fs::write(&f, "A=2\nB=3\n").unwrap();
    mam::cli::load_env(&mut ctx).unwrap();
    assert_eq!(ctx.var("A").as_deref(), Some("1"));
    assert_eq!(ctx.var("B"), None);
}

/// E13 as the spec words it: `registry register` twice in one process and one Ctx on an undecodable
/// file, then repaired; a later edit is not read.
#[test]
fn e13_registry_register_loads_once_after_success() {
    let td = TestDir::new("e13reg");
    let f = td.write("t.env", b"MAM_HEARTBEAT_SEC=\xff\n");
    let jobs = td.path("jobs");
    let mut ctx =
        mam::ctx::Ctx::with_env([("MAM_ENV_FILE", f.as_os_str()), ("MAM_JOBS_DIR", jobs.as_os_str())], &td.ws());
    let register = |ctx: &mut mam::ctx::Ctx, id: &str| {
        let args = ["register", "--session", "s1", "--job-id", id].map(std::ffi::OsString::from).to_vec();
        mam::cmd::registry::run(ctx, args)
    };
    for id in ["j1", "j2"] {
        let e = register(&mut ctx, id).unwrap_err();
        assert_eq!((e.rc, e.line.clone()), (1, format!("ERROR: {}: cannot read (UnicodeDecodeError)", f.display())));
        assert!(!jobs.exists(), "a failed load registered something");
    }
    fs::write(&f, "MAM_HEARTBEAT_SEC=7\n").unwrap();
    assert_eq!(register(&mut ctx, "j3"), Ok(0));
    fs::write(&f, "MAM_HEARTBEAT_SEC=9\n").unwrap();
    assert_eq!(register(&mut ctx, "j4"), Ok(0));
    for (id, n) in [("j3", 7), ("j4", 7)] {
        let rec: serde_json::Value =
            serde_json::from_slice(&fs::read(jobs.join(format!("{id}.json"))).unwrap()).unwrap();
        assert_eq!(rec["heartbeat_sec"], n, "{id}");
    }
}

#[test]
fn e14_integer_grammar_on_the_cli() {
    let td = TestDir::new("e14");
    for ok in ["30", " 30 ", "\t30"] {
        let r = td.mam().args(["env", "--check-int", ok]).run();
        r.expect_rc(0);
        assert_eq!(r.stdout(), "30\n");
    }
    for bad in ["\u{2003} 30\u{2003}", "３０", "+30", "-1", "3x", "", "99999999999"] {
        let r = td.mam().args(["env", &format!("--check-int={bad}")]).run();
        r.expect_rc(2);
        assert_eq!(r.stderr().lines().count(), 1);
        assert!(r.stderr().starts_with("ERROR: --check-int: invalid value '"), "{}", r.stderr());
    }
}

#[test]
fn bad_input_large_random_file_is_undecodable() {
    let td = TestDir::new("rand10m");
    // 10 MB of xorshift bytes: not UTF-8 with overwhelming certainty (checked below).
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let bytes: Vec<u8> = (0..10 * 1024 * 1024)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    assert!(std::str::from_utf8(&bytes).is_err());
    let r = shell(&td, &bytes);
    r.expect_rc(1);
    assert_eq!(r.stderr(), format!("ERROR: {}: cannot read (UnicodeDecodeError)\n", td.path("t.env").display()));
    assert_eq!(r.stdout(), "");
}

#[test]
fn bad_input_one_megabyte_line_is_a_value() {
    let td = TestDir::new("bigline");
    let big = "v".repeat(1024 * 1024);
    let r = shell(&td, format!("A={big}\nB=2\n").as_bytes());
    r.expect_rc(0);
    assert_eq!(r.stdout(), format!("export A='{big}'\nexport B='2'\n"));
}

#[test]
fn bad_input_directory_instead_of_file() {
    let td = TestDir::new("isdir");
    let d = td.path("dir.env");
    fs::create_dir_all(&d).unwrap();
    let r = td.mam().env("MAM_ENV_FILE", &d).args(["env", "--shell"]).run();
    r.expect_rc(1);
    eqnice!(format!("ERROR: {}: cannot read (IsADirectoryError)\n", d.display()), r.stderr());
}

#[test]
fn bad_input_path_with_spaces_and_newline_stays_one_line() {
    let td = TestDir::new("weirdpath");
    let f = td.write("a b\nc.env", b"\xff");
    let r = td.mam().env("MAM_ENV_FILE", &f).args(["env", "--shell"]).run();
    r.expect_rc(1);
    let want = format!("ERROR: {}/a b\\nc.env: cannot read (UnicodeDecodeError)\n", td.root.display());
    eqnice!(want, r.stderr());
    // The same file, readable: values load and the path is one argv element.
    fs::write(&f, "A=1\n").unwrap();
    let r = td.mam().env("MAM_ENV_FILE", &f).args(["env", "--shell"]).run();
    r.expect_rc(0);
    eqnice!("export A='1'\n", r.stdout());
}

#[test]
fn relative_env_file_is_taken_against_cwd() {
    let td = TestDir::new("relenv");
    td.write("ws/sub/x.env", "A=rel\n");
    let r = td.mam().env("MAM_ENV_FILE", "sub/x.env").args(["env", "--shell"]).run();
    eqnice!("export A='rel'\n", r.stdout());
}

/// E14 on the real timing flags of `registry register` (`--heartbeat` itself belongs to publish,
/// whose suite checks it): accepted values register, refused ones are rc 2 and register nothing.
#[test]
fn e14_integer_grammar_on_timing_flags() {
    let td = TestDir::new("e14flags");
    let flags = [
        ("--heartbeat-sec", 1),
        ("--heartbeat-misses", 1),
        ("--ack-timeout", 1),
        ("--idle-timeout", 0),
        ("--timeout", 0),
    ];
    for (flag, min) in flags {
        for ok in ["30", " 30 "] {
            td.mam().args(["registry", "register", "--session", "s1", flag, ok]).run().expect_rc(0);
        }
        for bad in ["\u{2003} 30\u{2003}", "３０", "+30", "-1", "3x", ""] {
            let r = td.mam().args(["registry", "register", "--session", "s1", &format!("{flag}={bad}")]).run();
            r.expect_rc(2);
            let want = format!("ERROR: {flag}: invalid value '{bad}' (expected a decimal integer >= {min})\n");
            eqnice!(want, r.stderr());
        }
    }
    // Env knobs: an invalid value is rc 2 and named with its origin (issue 18); an empty one counts
    // as absent.
    let r = td.mam().env("MAM_HEARTBEAT_SEC", "3x").args(["registry", "register", "--session", "s1"]).run();
    r.expect_rc(2);
    eqnice!(
        "ERROR: MAM_HEARTBEAT_SEC: '3x' from the environment is not a whole number (expected digits only, at least 1)\n",
        r.stderr()
    );
    td.mam().env("MAM_HEARTBEAT_SEC", "").args(["registry", "register", "--session", "s1"]).run().expect_rc(0);
    let listed = td.mam().args(["registry", "list"]).run().stdout();
    assert_eq!(listed.lines().count(), 11, "{listed}");
}

/// Issue 18: from a subdirectory of the control root, after `$WORKSPACE_ROOT/.mam.env` and
/// `./.mam.env`, the control root's `.mam.env` is read (CORE 1.1), still under the trust checks.
#[test]
fn control_root_env_file_is_found_from_a_subdirectory() {
    let td = TestDir::new("e11c");
    td.write("ws/.mam.env", "A=root\n");
    fs::create_dir_all(td.path("ws/sub/deeper")).unwrap();
    let sub = td.path("ws/sub/deeper");
    let r = td.mam().env_remove("MAM_ENV_FILE").cwd(&sub).args(["env", "--path"]).run();
    r.expect_rc(0);
    eqnice!(format!("{}\n", td.path("ws/.mam.env").display()), r.stdout());
    let r = td.mam().env_remove("MAM_ENV_FILE").cwd(&sub).args(["env", "--shell"]).run();
    eqnice!("export A='root'\n", r.stdout());
    // ./.mam.env still comes first.
    td.write("ws/sub/deeper/.mam.env", "A=cwd\n");
    let r = td.mam().env_remove("MAM_ENV_FILE").cwd(&sub).args(["env", "--shell"]).run();
    eqnice!("export A='cwd'\n", r.stdout());
    fs::remove_file(td.path("ws/sub/deeper/.mam.env")).unwrap();
    // The control root's file is judged like any other: writable by others is refused.
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(td.path("ws/.mam.env"), fs::Permissions::from_mode(0o666)).unwrap();
    let r = td.mam().env_remove("MAM_ENV_FILE").cwd(&sub).args(["env", "--shell"]).run();
    r.expect_rc(1);
    assert!(r.stderr().contains("refused: writable by others"), "{}", r.stderr());
}

/// Issue 18: a knob from the env file is named with its value, file and line; a secret never shows.
#[test]
fn knob_error_names_value_file_and_line() {
    let td = TestDir::new("knobsrc");
    let f = td
        .write("ws/.mam.env", "# broker\nMQTT_BROKER=127.0.0.1\nMQTT_PORT=33581 # my broker\nMQTT_PASSWORD=hunter2\n");
    let r = td.mam().env("MAM_ENV_FILE", &f).args(["pub", "-t", "a/b", "-m", "x"]).run();
    r.expect_rc(2);
    eqnice!(
        format!(
            "ERROR: MQTT_PORT: '33581 # my broker' from {}:3 is not a port (expected digits only, 1-65535; comments must be on their own line)\n",
            f.display()
        ),
        r.stderr()
    );
    assert!(!r.stderr().contains("hunter2"));
}
