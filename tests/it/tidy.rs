//! Repository rules checked inside `cargo test`: the dependency list, module headers, where `unsafe`
//! and the process environment may be touched, shims, formatting, and no public broker in tests.

use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn dependencies_are_exactly_the_agreed_set() {
    let toml = fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let mut section = "";
    let mut deps = Vec::new();
    let mut dev = Vec::new();
    for line in toml.lines() {
        let t = line.trim();
        if t.starts_with('[') {
            section = t;
            continue;
        }
        let Some((name, _)) = t.split_once('=') else { continue };
        if t.starts_with('#') {
            continue;
        }
        match section {
            "[dependencies]" => deps.push(name.trim().to_string()),
            "[dev-dependencies]" | "[build-dependencies]" => dev.push(name.trim().to_string()),
            _ => {}
        }
    }
    deps.sort();
    assert_eq!(deps, ["hmac", "lexopt", "libc", "mqttrs", "serde", "serde_json", "sha2"]);
    assert!(dev.is_empty(), "dev/build dependencies need a case in docs/DESIGN.md: {dev:?}");
}

#[test]
fn every_source_file_starts_with_a_module_doc() {
    for f in rust_files(&root().join("src")).into_iter().chain(rust_files(&root().join("tests"))) {
        let text = fs::read_to_string(&f).unwrap();
        assert!(text.starts_with("//!"), "{} must start with a //! paragraph", f.display());
    }
}

#[test]
fn unsafe_lives_only_in_sys() {
    for f in rust_files(&root().join("src")) {
        if f.ends_with("src/sys.rs") {
            continue;
        }
        let text = fs::read_to_string(&f).unwrap();
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap();
            assert!(
                !code.contains("unsafe ") && !code.contains("unsafe{"),
                "{}:{}: unsafe outside sys.rs",
                f.display(),
                i + 1
            );
        }
    }
    let sys = fs::read_to_string(root().join("src/sys.rs")).unwrap();
    let lines: Vec<&str> = sys.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        if line.contains("unsafe {") || line.trim_start().starts_with("unsafe {") {
            let before = lines[..i].iter().rev().take(4).any(|l| l.contains("// SAFETY:"));
            assert!(before, "src/sys.rs:{}: unsafe block without a // SAFETY: comment", i + 1);
        }
    }
}

#[test]
fn only_main_and_ctx_read_the_process_environment() {
    for f in rust_files(&root().join("src")) {
        if f.ends_with("src/main.rs") || f.ends_with("src/ctx.rs") {
            continue;
        }
        let text = fs::read_to_string(&f).unwrap();
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap();
            for bad in ["env::var(", "env::var_os(", "env::vars(", "env::vars_os(", "env::set_var(", "env::remove_var("]
            {
                assert!(!code.contains(bad), "{}:{}: {bad} outside main/ctx (use Ctx)", f.display(), i + 1);
            }
        }
    }
}

#[test]
fn no_ignore_or_panic_attributes() {
    let (a, b) = (concat!("#[", "ignore"), concat!("should", "_panic"));
    for f in rust_files(&root().join("src")).into_iter().chain(rust_files(&root().join("tests"))) {
        let text = fs::read_to_string(&f).unwrap();
        assert!(!text.contains(a) && !text.contains(b), "{}", f.display());
    }
}

#[test]
fn tests_never_name_a_public_broker() {
    let hosts = [concat!("test.", "mosquitto.org"), concat!("broker.", "hivemq.com"), concat!("broker.", "emqx.io")];
    for f in rust_files(&root().join("tests")) {
        let text = fs::read_to_string(&f).unwrap();
        for h in hosts {
            assert!(!text.contains(h), "{} names public broker {h}", f.display());
        }
    }
}

#[test]
fn shims_are_dumb_executable_bash() {
    let dir = root().join("shims");
    let mut n = 0;
    for e in fs::read_dir(&dir).unwrap().flatten() {
        let p = e.path();
        let text = fs::read_to_string(&p).unwrap();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name == "lib.sh" {
            continue;
        }
        n += 1;
        use std::os::unix::fs::PermissionsExt;
        assert!(fs::metadata(&p).unwrap().permissions().mode() & 0o111 != 0, "{name} is not executable");
        assert!(text.starts_with("#!/usr/bin/env bash\n"), "{name}: shebang");
        assert!(text.contains("${MAM_BIN:-}") && text.contains("/../bin/mam"), "{name}: lookup rule of CORE 0.1");
        let exec_line = text.lines().find(|l| l.starts_with("exec ")).unwrap_or_else(|| panic!("{name}: no exec"));
        assert!(exec_line.ends_with(" \"$@\""), "{name}: arguments must pass untouched: {exec_line}");
    }
    assert!(n >= 1);
}

#[test]
fn formatting_is_clean() {
    // A missing rustfmt is a failure, not a skip: an unchecked tree must not pass as a formatted one.
    let fmt = |args: &[&str]| {
        std::process::Command::new("cargo")
            .arg("fmt")
            .args(args)
            .current_dir(root())
            .output()
            .unwrap_or_else(|e| panic!("cannot run `cargo fmt` (is cargo on PATH?): {e}"))
    };
    let version = fmt(&["--version"]);
    assert!(
        version.status.success(),
        "cannot run rustfmt: `cargo fmt --version` failed (install it with `rustup component add rustfmt`):\n{}",
        String::from_utf8_lossy(&version.stderr)
    );
    let out = fmt(&["--check"]);
    assert!(
        out.status.success(),
        "cargo fmt --check:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
