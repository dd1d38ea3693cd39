//! The one version value (ORCH 7.6, A54): the crate version and the source commit the binary was
//! built from (`MAM_SOURCE_COMMIT` at build time, else `unknown`). `mam --version`, lib.sh's
//! `MAM_VERSION`, the loop checkpoint's `framework_version`, `version.txt` and the `version:` line of
//! every installed SKILL.md all come from here. Reads nothing at run time.

/// The release version (`Cargo.toml`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The source commit, or `unknown` when the build did not say (`MAM_SOURCE_COMMIT=<sha> cargo build`).
pub const COMMIT: &str = match option_env!("MAM_SOURCE_COMMIT") {
    Some(c) if !c.is_empty() => c,
    _ => "unknown",
};

/// `<version> (<commit|unknown>)`, the text after `mam ` in `mam --version`.
pub fn long() -> String {
    format!("{VERSION} ({COMMIT})")
}

#[cfg(test)]
mod tests {
    #[test]
    fn long_is_version_then_commit_in_parentheses() {
        let l = super::long();
        assert!(l.starts_with(super::VERSION) && l.ends_with(')') && l.contains(" ("), "{l}");
    }
}
