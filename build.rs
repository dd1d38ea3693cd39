//! Link layout of the release binary (issue 20): the functions the heartbeat timer runs in its
//! steady state, listed in `assets/beat.order`, are laid out together in one output section before
//! `.text` (a linker script of one `INSERT BEFORE .text` section, written to `OUT_DIR`), so the
//! timer's resident code after it drops its start-up pages is a few 64 KiB fault-around windows
//! instead of windows all over the binary.
//!
//! The list holds symbol names without their hash (which changes with the build's metadata: strip,
//! target, features) as glob patterns, so one list serves the static and the dynamic build; a name
//! the build does not have matches nothing, so a stale list costs memory, never a build.
//!
//! Only for release builds of x86_64 Linux with glibc linked by rustc's own lld (the default since
//! Rust 1.90); an older rustc or a configured linker gets the plain layout. `MAM_NO_BEAT_ORDER=1`
//! turns it off; `MAM_LINK_MAP=<file>` also writes the linker's map (`scripts/beat_order.sh`).
//! The same script leaves the unwind tables out (`DISCARD_UNWIND_TABLES`).
//! It never changes what is compiled, only where the linker puts it.
//!
//! It also names the source commit (issue 32): `MAM_SOURCE_COMMIT` for `version::COMMIT`, from the
//! environment when set, else `git rev-parse HEAD` of the checkout when it is one (a tarball without
//! `.git`, or no git, leaves it unset: `unknown`). Uncommitted changes are not marked: watching the
//! index would rebuild the crate on every `git add`.

use std::env;
use std::fs;
use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=assets/beat.order");
    println!("cargo:rerun-if-env-changed=MAM_LINK_MAP");
    println!("cargo:rerun-if-env-changed=MAM_NO_BEAT_ORDER");
    println!("cargo:rerun-if-env-changed=MAM_KEEP_EH_FRAME");
    let var = |k: &str| env::var(k).unwrap_or_default();
    source_commit(&var("CARGO_MANIFEST_DIR"));
    let lld = var("TARGET") == "x86_64-unknown-linux-gnu"
        && env::var_os("RUSTC_LINKER").is_none()
        && !var("CARGO_ENCODED_RUSTFLAGS").contains("link")
        && rustc_minor(&var("RUSTC")).is_some_and(|m| m >= 90);
    if !lld || var("PROFILE") != "release" {
        return;
    }
    let mut script = String::new();
    if env::var_os("MAM_NO_BEAT_ORDER").is_none() {
        let order = Path::new(&var("CARGO_MANIFEST_DIR")).join("assets/beat.order");
        script.push_str(&linker_script(&fs::read_to_string(&order).unwrap_or_default()));
    }
    if env::var_os("MAM_KEEP_EH_FRAME").is_none() {
        script.push_str(DISCARD_UNWIND_TABLES);
        println!("cargo:rustc-link-arg-bins=-Wl,--no-eh-frame-hdr");
    }
    let path = Path::new(&var("OUT_DIR")).join("mam.ld");
    if !script.is_empty() && fs::write(&path, script).is_ok() {
        println!("cargo:rustc-link-arg-bins=-Wl,-T,{}", path.display());
    }
    if let Some(map) = env::var_os("MAM_LINK_MAP") {
        println!("cargo:rustc-link-arg-bins=-Wl,-Map={}", map.to_string_lossy());
    }
}

/// `cargo:rustc-env=MAM_SOURCE_COMMIT=<sha>` from git when the variable is not set, with
/// rerun triggers on HEAD and the branch it points to (a new commit rebuilds the version).
fn source_commit(dir: &str) {
    println!("cargo:rerun-if-env-changed=MAM_SOURCE_COMMIT");
    if env::var_os("MAM_SOURCE_COMMIT").is_some() {
        return;
    }
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git").arg("-C").arg(dir).args(args).output().ok()?;
        let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
        (out.status.success() && !text.is_empty()).then_some(text)
    };
    let Some(sha) = git(&["rev-parse", "--short=12", "HEAD"]) else { return };
    if let Some(d) = git(&["rev-parse", "--path-format=absolute", "--git-dir"]) {
        println!("cargo:rerun-if-changed={d}/HEAD");
    }
    if let (Some(d), Some(head)) =
        (git(&["rev-parse", "--path-format=absolute", "--git-common-dir"]), git(&["symbolic-ref", "-q", "HEAD"]))
    {
        println!("cargo:rerun-if-changed={d}/{head}");
    }
    println!("cargo:rustc-env=MAM_SOURCE_COMMIT={sha}");
}

/// The unwind tables left out of the release binary (about 0.24 MB, issue 20): with `panic =
/// "abort"` nothing unwinds, and std's precompiled code brings its tables whatever the crate's
/// flags say (`-C force-unwind-tables=no` changed nothing). What goes with them: the frames of a
/// `RUST_BACKTRACE=1` panic report (the message and its location stay) and a debugger's unwinding
/// of a stripped binary. `MAM_KEEP_EH_FRAME=1` keeps them.
const DISCARD_UNWIND_TABLES: &str =
    "SECTIONS\n{\n  /DISCARD/ : { *(.eh_frame) *(.eh_frame.*) }\n}\nINSERT AFTER .text;\n";

/// One output section `.text.beat` before `.text` holding the listed input sections: a Rust symbol's
/// function section by its name up to the hash (`_ZN..17h`), a whole `_R` (v0) or `__` name
/// (compiler-builtins), or a glibc object's code (`libc.a:<object>`, `libgcc.a:<object>`). Lines with characters a script pattern cannot hold are
/// skipped.
fn linker_script(list: &str) -> String {
    let mut s = String::from("SECTIONS\n{\n  .text.beat : {\n");
    for line in list.lines().map(str::trim) {
        let ok = |c: char| c.is_ascii_alphanumeric() || "_$.-*".contains(c);
        if line.is_empty() || line.starts_with('#') || !line.chars().all(|c| ok(c) || c == ':') {
            continue;
        }
        if let Some((lib @ ("libc.a" | "libgcc.a"), obj)) = line.split_once(':') {
            s.push_str(&format!("    *{lib}:{obj}(.text .text.*)\n"));
        } else if line.starts_with("_ZN") && line.ends_with("17h") {
            s.push_str(&format!("    *(.text.{line}* .text.unlikely.{line}*)\n"));
        } else if (line.starts_with("_R") || line.starts_with("__")) && line.chars().all(ok) {
            s.push_str(&format!("    *(.text.{line} .text.{line}.* .text.unlikely.{line} .text.unlikely.{line}.*)\n"));
        }
    }
    s.push_str("  }\n}\nINSERT BEFORE .text;\n");
    s
}

/// The minor version of `rustc -V` (`rustc 1.95.0 (...)`), when it is 1.x.
fn rustc_minor(rustc: &str) -> Option<u32> {
    let out = Command::new(if rustc.is_empty() { "rustc" } else { rustc }).arg("-V").output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let version = text.split_whitespace().nth(1)?;
    let mut parts = version.split('.');
    (parts.next()? == "1").then_some(())?;
    parts.next()?.parse().ok()
}
