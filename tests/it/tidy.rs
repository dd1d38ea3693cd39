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

/// Issue 12: every open that writes, appends or locks goes through `sys` (O_NOFOLLOW, 0600), so no
/// writer outside it can follow a planted symlink. Unit tests (after `#[cfg(test)]`) set up fixtures.
#[test]
fn every_write_open_goes_through_sys() {
    for f in rust_files(&root().join("src")) {
        if f.ends_with("src/sys.rs") {
            continue;
        }
        let text = fs::read_to_string(&f).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap();
        for (i, line) in code.lines().enumerate() {
            let code = line.split("//").next().unwrap();
            for bad in ["OpenOptions", "File::create", "fs::write(", "fs::copy(", "fs::create_dir", "DirBuilder"] {
                assert!(!code.contains(bad), "{}:{}: {bad} outside sys.rs (use the sys helpers)", f.display(), i + 1);
            }
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

// ---------------------------------------------------------------------------------------------
// Layering: the file-level import graph of src/ (docs/ARCHITECTURE.md "Code map").

/// A source file's module path (`src/registry/ops.rs` -> `["registry", "ops"]`, `mod.rs` and
/// `lib.rs` name their directory's module).
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut segs: Vec<String> = rel.iter().map(|s| s.to_string_lossy().into_owned()).collect();
    if segs.last().is_some_and(|s| s == "mod" || s == "lib") {
        segs.pop();
    }
    segs
}

/// The text of a file without comments and string literals (doc comments name paths in prose), split
/// at its `#[cfg(test)]` module: (code, test code).
fn code_of(text: &str) -> (String, String) {
    let mut out = String::with_capacity(text.len());
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' && b.get(i + 2) == Some(&b'\'') {
            i += 3; // a char literal such as '"' or '{'
        } else if b[i] == b'\'' && b.get(i + 1) == Some(&b'\\') {
            i += 2;
            while i < b.len() && b[i] != b'\'' {
                i += 1;
            }
            i += 1;
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    match out.find("#[cfg(test)]\nmod tests") {
        Some(at) => (out[..at].to_string(), out[at..].to_string()),
        None => (out, String::new()),
    }
}

/// The paths a use-tree (or an expression path) starting at `s` names: `a::{b, c::d}` gives
/// `[a, b]` and `[a, c, d]`.
fn path_tree(s: &str) -> Vec<Vec<String>> {
    fn tokens(s: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut cs = s.chars().peekable();
        while let Some(&c) = cs.peek() {
            if c.is_alphanumeric() || c == '_' {
                let mut w = String::new();
                while let Some(&c) = cs.peek().filter(|c| c.is_alphanumeric() || **c == '_') {
                    w.push(c);
                    cs.next();
                }
                out.push(w);
            } else if c.is_whitespace() {
                cs.next();
            } else if c == ':' {
                cs.next();
                if cs.peek() != Some(&':') {
                    break;
                }
                cs.next();
                out.push("::".into());
            } else if "{},*".contains(c) {
                out.push(c.to_string());
                cs.next();
            } else {
                break;
            }
        }
        out
    }
    fn tree(t: &[String], i: &mut usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
        let mut segs = prefix;
        while *i < t.len() {
            match t[*i].as_str() {
                "::" | "*" => *i += 1,
                "as" => *i += 2,
                "{" => {
                    *i += 1;
                    while *i < t.len() && t[*i] != "}" {
                        tree(t, i, segs.clone(), out);
                        if *i < t.len() && t[*i] == "," {
                            *i += 1;
                        }
                    }
                    *i += 1;
                    out.push(segs);
                    return;
                }
                "," | "}" => break,
                w => {
                    // A path ends where the next token is not `::` (an expression path `f(..)`).
                    segs.push(w.to_string());
                    *i += 1;
                    if t.get(*i).map(String::as_str) != Some("::") {
                        if t.get(*i).map(String::as_str) == Some("as") {
                            *i += 2;
                        }
                        break;
                    }
                }
            }
        }
        out.push(segs);
    }
    let t = tokens(s);
    let mut out = Vec::new();
    let mut i = 0;
    tree(&t, &mut i, Vec::new(), &mut out);
    out
}

/// Every `crate::`/`super::` path in `code` (and, in a `mod.rs`, every path through a child module
/// it declares), resolved to the longest module prefix that is a file of `files`.
fn imports_of(
    code: &str,
    me: &[String],
    is_mod_file: bool,
    files: &std::collections::BTreeMap<Vec<String>, PathBuf>,
) -> std::collections::BTreeSet<PathBuf> {
    let mut found = std::collections::BTreeSet::new();
    let mut resolve = |base: Vec<String>, rest: &str| {
        for segs in path_tree(rest) {
            let full: Vec<String> = base.iter().cloned().chain(segs).collect();
            if let Some(f) = (1..=full.len()).rev().find_map(|n| files.get(&full[..n])) {
                found.insert(f.clone());
            }
        }
    };
    let ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
    let mut roots: Vec<(String, Vec<String>)> = vec![("crate::".into(), Vec::new())];
    // `super` is the module above this file's module (for `a/mod.rs` and `a/b.rs` alike).
    roots.push(("super::".into(), me[..me.len().saturating_sub(1)].to_vec()));
    if is_mod_file {
        for line in code.lines() {
            let t = line.trim().trim_start_matches("pub ").trim_start_matches("pub(crate) ");
            if let Some(name) = t.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) {
                roots.push((format!("{name}::"), me.iter().cloned().chain([name.to_string()]).collect()));
            }
        }
    }
    for (root, base) in roots {
        let mut from = 0;
        while let Some(at) = code[from..].find(&root) {
            let at = from + at;
            from = at + root.len();
            if ident(code[..at].chars().next_back()) {
                continue;
            }
            let mut b = base.clone();
            if root != "crate::" && root != "super::" {
                b.pop(); // the child's name is the first segment of the rest
                resolve(b, &code[at..]);
            } else {
                resolve(b, &code[from..]);
            }
        }
    }
    found
}

/// The import graph of the library's files (`main.rs` is the binary and sits above everything).
fn import_graph(include_tests: bool) -> Graph {
    let src = root().join("src");
    let all: Vec<PathBuf> = rust_files(&src).into_iter().filter(|f| !f.ends_with("src/main.rs")).collect();
    let files: std::collections::BTreeMap<Vec<String>, PathBuf> =
        all.iter().map(|f| (module_path(&src, f), f.clone())).filter(|(m, _)| !m.is_empty()).collect();
    let mut graph = std::collections::BTreeMap::new();
    for f in &all {
        let (code, tests) = code_of(&fs::read_to_string(f).unwrap());
        let me = module_path(&src, f);
        let is_mod = f.ends_with("mod.rs") || f.ends_with("lib.rs");
        let mut deps = imports_of(&code, &me, is_mod, &files);
        if include_tests {
            // Inside `mod tests`, `super` is the file's own module.
            let mut inner = me.clone();
            inner.push("tests".into());
            deps.extend(imports_of(&tests, &inner, false, &files));
        }
        deps.remove(f);
        graph.insert(
            f.strip_prefix(root()).unwrap().to_path_buf(),
            deps.iter().map(|d| d.strip_prefix(root()).unwrap().to_path_buf()).collect(),
        );
    }
    graph
}

type Graph = std::collections::BTreeMap<PathBuf, std::collections::BTreeSet<PathBuf>>;

/// Every circle a depth-first search meets, each as `a -> b -> a`.
fn circles_of(graph: &Graph) -> Vec<String> {
    fn visit(
        n: &Path,
        g: &Graph,
        state: &mut std::collections::BTreeMap<PathBuf, u8>,
        stack: &mut Vec<PathBuf>,
        circles: &mut Vec<String>,
    ) {
        state.insert(n.to_path_buf(), 1);
        stack.push(n.to_path_buf());
        for d in g.get(n).into_iter().flatten() {
            match state.get(d).copied().unwrap_or(0) {
                0 => visit(d, g, state, stack, circles),
                1 => {
                    let at = stack.iter().position(|s| s == d).unwrap();
                    let mut c: Vec<String> = stack[at..].iter().map(|p| p.display().to_string()).collect();
                    c.push(d.display().to_string());
                    circles.push(c.join(" -> "));
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.to_path_buf(), 2);
    }
    let mut state = std::collections::BTreeMap::new();
    let mut circles = Vec::new();
    for n in graph.keys() {
        if !state.contains_key(n) {
            visit(n, graph, &mut state, &mut Vec::new(), &mut circles);
        }
    }
    circles
}

#[test]
fn no_two_top_level_modules_import_each_other() {
    // One floor up from the file graph: `src/ops.rs` sits above registry and publish because
    // `ops -> publish::close` and `publish -> registry::store` would otherwise make registry and
    // publish a circle although no two files import each other. Each top-level module (`src/x.rs`
    // or `src/x/`) is one node; lib.rs only declares them.
    let top = |p: &Path| PathBuf::from(p.iter().nth(1).unwrap().to_string_lossy().trim_end_matches(".rs").to_string());
    let mut graph = Graph::new();
    for (file, deps) in import_graph(false) {
        if file.ends_with("src/lib.rs") {
            continue;
        }
        let from = top(&file);
        let entry = graph.entry(from.clone()).or_default();
        entry.extend(deps.iter().map(|d| top(d)).filter(|d| *d != from));
    }
    assert!(graph.len() > 20, "the module graph found too few modules: {graph:?}");
    let circles = circles_of(&graph);
    assert!(
        circles.is_empty(),
        "top-level modules that import each other, directly or around a loop:\n{}",
        circles.join("\n")
    );
}

#[test]
fn library_never_imports_cmd() {
    // Tests included: a test module importing the command layer is the same inversion.
    let mut bad = Vec::new();
    for (file, deps) in import_graph(true) {
        let lib = !file.starts_with("src/cmd");
        for d in deps.iter().filter(|d| lib && d.starts_with("src/cmd")) {
            bad.push(format!("{} imports {}", file.display(), d.display()));
        }
    }
    assert!(bad.is_empty(), "library files import the command layer (the layers run one way):\n{}", bad.join("\n"));
}

#[test]
fn no_two_source_files_import_each_other() {
    // Test modules are leaves (nothing imports them), so they cannot close a circle; they are left out.
    let graph = import_graph(false);
    assert!(graph.len() > 40, "the graph found too few files: {graph:?}");
    assert!(
        graph[Path::new("src/publish/mod.rs")].contains(Path::new("src/heartbeat/timer.rs")),
        "the graph misses a known edge (publish -> heartbeat timer): {:?}",
        graph[Path::new("src/publish/mod.rs")]
    );
    let circles = circles_of(&graph);
    assert!(
        circles.is_empty(),
        "source files that import each other, directly or around a loop:\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_import_graph_reads_use_trees_and_child_modules() {
    let p = path_tree("a::{b, c::{d, e as f}, g}::x;");
    assert!(
        p.contains(&vec!["a".into(), "b".into()]) && p.contains(&vec!["a".into(), "c".into(), "e".into()]),
        "{p:?}"
    );
    assert_eq!(path_tree("f(x)"), vec![vec!["f".to_string()]]);
    let (code, tests) = code_of("//! crate::cmd in a doc\nuse crate::x; // crate::y\nlet s = \"crate::z\";\n#[cfg(test)]\nmod tests { use crate::w; }");
    assert!(
        code.contains("crate::x")
            && !code.contains("crate::y")
            && !code.contains("crate::z")
            && !code.contains("crate::cmd")
    );
    assert!(tests.contains("crate::w"));
}

#[test]
fn library_errors_are_typed() {
    // `cli::Failure` (a rendered line and an exit code) belongs to the command layer: library code
    // returns typed errors and `cmd` renders them. Test modules may check a rendering.
    let src = root().join("src");
    let mut bad = Vec::new();
    for f in rust_files(&src) {
        let rel = f.strip_prefix(root()).unwrap();
        if rel.starts_with("src/cmd") || rel.ends_with("main.rs") || rel.ends_with("cli.rs") {
            continue;
        }
        let (code, _) = code_of(&fs::read_to_string(&f).unwrap());
        if code.contains("crate::cli") {
            bad.push(rel.display().to_string());
        }
    }
    assert!(bad.is_empty(), "library files use the command layer's cli (Failure, rc): {bad:?}");
}

#[test]
fn the_code_map_names_every_module() {
    let map = fs::read_to_string(root().join("docs/ARCHITECTURE.md")).unwrap();
    let map = &map[map.find("## Code map").expect("ARCHITECTURE.md has a code map")..];
    let map = &map[..map[3..].find("\n## ").map_or(map.len(), |i| i + 3)];
    let src = root().join("src");
    let mut missing = Vec::new();
    for f in rust_files(&src) {
        let m = module_path(&src, &f);
        let name = match m.first().map(String::as_str) {
            None => f.file_stem().unwrap().to_string_lossy().into_owned(), // lib, main
            Some("cmd") => continue,                                       // the map names the layer
            Some(_) => m.join("::"),
        };
        if !map.contains(&format!("`{name}`")) {
            missing.push(name);
        }
    }
    assert!(missing.is_empty(), "docs/ARCHITECTURE.md's code map does not name: {missing:?}");
}

/// Issue 20: every std sort call site of a new element type or comparator is its own copy of
/// std's driftsort (7-9 KB of code), so library code sorts through `crate::sort`; only the
/// listings over a whole registry and the broker's per-message path keep std's sort inline.
#[test]
fn std_sorts_only_on_the_measured_hot_paths() {
    let hot = [
        "src/sort.rs",
        "src/cmd/jobs.rs",
        "src/cmd/registry.rs",
        "src/broker/conn.rs",
        "src/view/jobs.rs",
        "src/view/world.rs",
    ];
    let mut found = Vec::new();
    for f in rust_files(&root().join("src")) {
        if hot.iter().any(|h| f.ends_with(h)) {
            continue;
        }
        let (code, _tests) = code_of(&fs::read_to_string(&f).unwrap());
        for line in code.lines() {
            if [".sort(", ".sort_by(", ".sort_by_key(", ".sort_unstable", ".sort_by_cached_key("]
                .iter()
                .any(|s| line.contains(s))
            {
                found.push(format!("{}: {}", f.strip_prefix(root()).unwrap().display(), line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "std sorts outside the hot paths (use crate::sort::by, by_key or natural):\n{}",
        found.join("\n")
    );
}

/// The string literals of Rust source `text` outside comments (raw strings included), with the
/// byte offset where each starts.
fn string_literals(text: &str) -> Vec<(usize, String)> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
            i += 2;
            while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                i += 1;
            }
            i += 2;
        } else if b[i] == b'r' && matches!(b.get(i + 1), Some(b'"' | b'#')) && !is_ident(b, i) {
            let start = i;
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                i += 1;
                continue;
            }
            let close = format!("\"{}", "#".repeat(hashes));
            let body = j + 1;
            let end = text[body..].find(&close).map_or(b.len(), |e| body + e);
            out.push((start, text[body..end].to_string()));
            i = end + close.len();
        } else if b[i] == b'"' {
            let start = i;
            let mut s = Vec::new();
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    s.push(b[i]);
                    i += 1;
                }
                if i < b.len() {
                    s.push(b[i]);
                }
                i += 1;
            }
            i += 1;
            out.push((start, String::from_utf8_lossy(&s).into_owned()));
        } else if b[i] == b'\'' && b.get(i + 2) == Some(&b'\'') {
            i += 3; // a char literal such as '"'
        } else if b[i] == b'\'' && b.get(i + 1) == Some(&b'\\') {
            i += 2;
            while i < b.len() && b[i] != b'\'' {
                i += 1;
            }
            i += 1;
        } else {
            i += 1;
        }
    }
    out
}

/// `b[i]` continues an identifier (so an `r` there is no raw-string prefix).
fn is_ident(b: &[u8], i: usize) -> bool {
    i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')
}

/// A literal that names the git program (`git`, `/usr/bin/git`).
fn names_git(lit: &str) -> bool {
    let lit = lit.trim();
    lit == "git" || lit.ends_with("/git")
}

/// Issue 29: every git run goes through `src/git.rs` (hooks, filters, external diff and textconv
/// off), so no other library file names the git program. Unit tests (after `#[cfg(test)]`) set up
/// fixtures with their own git.
#[test]
fn only_the_git_module_spawns_git() {
    let sample =
        "// Command::new(\"git\")\nlet a = r#\"x\"#; let c = '\"'; f(\"a\\\"b\"); Command::new(r\"/usr/bin/git\")";
    let lits: Vec<String> = string_literals(sample).into_iter().map(|(_, s)| s).collect();
    assert_eq!(lits, ["x", "a\\\"b", "/usr/bin/git"], "the literal scanner");
    let mut bad = Vec::new();
    for f in rust_files(&root().join("src")) {
        if f.ends_with("src/git.rs") {
            continue;
        }
        let text = fs::read_to_string(&f).unwrap();
        let code = match text.find("#[cfg(test)]\nmod tests") {
            Some(at) => &text[..at],
            None => &text[..],
        };
        for (at, lit) in string_literals(code) {
            if names_git(&lit) {
                bad.push(format!("{}:{}", f.display(), code[..at].lines().count()));
            }
        }
    }
    assert!(bad.is_empty(), "git spawned outside src/git.rs (use crate::git::Git): {bad:?}");
}
