//! Install and update (ORCH 7.1-7.4, A49-A53) with the legacy takeover (issue 16): the fresh install
//! (also how an interrupted one completes), the update and the takeover with their committed backup
//! (A66), local edits moved aside, dropped assets, the `install_state` merge, the legacy-path check
//! (never through a link, never over a file mam does not own), and the byte-exact restore (mode bits
//! kept) when anything fails, also after a SIGKILL.

use std::fs;
use std::path::Path;

use super::assets::{self, Asset};
use super::fsops::{self, Found, Steps, Tree};
use super::{gitignore, ledger, legacy, InstallError, Options, Report};
use crate::session::yaml;

/// The update backup (7.4 step 1): copies named `f<n>` and the `index` that commits it.
pub const BACKUP_DIR: &str = ".mam/install/update-backup";
const BACKUP_INDEX: &str = ".mam/install/update-backup/index";

/// Checks a target before anything changes (7.1: exit 2 when missing, not a directory, not
/// writable; also not a repository's top level, or a `.gitignore`/`.mam` that cannot be used).
pub fn check_target(target: &Tree) -> Result<(), InstallError> {
    let show = crate::text::show_path(target);
    let m =
        fs::metadata(target.path()).map_err(|_| InstallError::BadTarget(format!("target {show} does not exist")))?;
    if !m.is_dir() {
        return Err(InstallError::BadTarget(format!("target {show} is not a directory")));
    }
    if fs::symlink_metadata(target.join(".git")).is_err() {
        return Err(InstallError::BadTarget(format!(
            "target {show} is not a git repository's top level (no .git); mam installs into a repository"
        )));
    }
    for (name, want_dir) in [(".gitignore", false), (".mam", true), (".agents", true)] {
        match fs::symlink_metadata(target.join(name)) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(InstallError::BadTarget(format!(
                    "{show}/{name} is a symbolic link; not followed (docs/SECURITY.md)"
                )))
            }
            Ok(m) if want_dir && !m.is_dir() => {
                return Err(InstallError::BadTarget(format!("{show}/{name} is not a directory")))
            }
            Ok(m) if !want_dir && !m.is_file() => {
                return Err(InstallError::BadTarget(format!("{show}/{name} is not a regular file")))
            }
            _ => {}
        }
    }
    check_trust(target)?;
    // A real probe: root passes access(2) on a read-only mount, and a read-only bind mount passes
    // the mode bits.
    fsops::probe_writable(target).map_err(|e| InstallError::BadTarget(format!("target {show} is not writable ({e})")))
}

/// The trust rule of issue 29 before anything changes: `.mam/`, `.mam/install/`, every ledger,
/// the update backup directory, its index and its copies must be the user's or root's and not
/// writable by group or others (unless `MAM_TRUSTED_ROOTS` lists them), and `.gitignore` a regular
/// text file of the user's or root's. Every later read judges what it opens again, so a swap after
/// this check is refused too.
pub fn check_trust(t: &Tree) -> Result<(), InstallError> {
    fsops::read_gitignore(t)?;
    for l in ledger::ALL {
        fsops::read(t, l)?;
    }
    // The backup's every entry (index, copies, temps), each read through the judged directories.
    for name in fsops::list(t, BACKUP_DIR)? {
        fsops::read(t, &format!("{BACKUP_DIR}/{name}"))?;
    }
    Ok(())
}

/// True when the target holds a legacy install not yet taken over: a legacy stamp file, or the
/// legacy `scripts/` directory while mam's manifest is absent (once mam is installed that directory
/// holds mam's own legacy-path shims). Nothing is followed: a link on the way is no legacy install
/// (and `check_legacy_paths` refuses to write through it).
pub fn is_legacy(target: &Path) -> bool {
    let real = |rel: &str, dir: bool| {
        fs::symlink_metadata(target.join(rel)).is_ok_and(|m| if dir { m.is_dir() } else { m.is_file() })
    };
    if ![".agents", ".agents/skills", legacy::DIR].iter().all(|d| real(d, true)) {
        return false;
    }
    legacy::LEDGERS.iter().any(|l| real(&format!("{}/{l}", legacy::DIR), false))
        || (real(&format!("{}/scripts", legacy::DIR), true)
            && fs::symlink_metadata(target.join(ledger::MANIFEST)).is_err())
}

/// What one run does about the legacy install and the legacy paths, decided once before any change.
#[derive(Debug, Clone, Copy)]
struct Plan {
    /// A legacy install is taken over (its stamps moved aside, its sessions imported).
    legacy: bool,
    /// The legacy entry points are written at their legacy paths (a takeover, `--legacy-paths`, or
    /// `legacy_paths=1` recorded by an earlier run).
    legacy_paths: bool,
}

/// Before any change (issue 32): every legacy entry point this run writes must be missing, a
/// regular file mam's manifest lists, or in a takeover the legacy install's own regular file, and
/// reached without a symlink. Anything else refuses the run (rc 2, nothing changed): the legacy
/// paths are never written through a link and never replace a file mam does not own.
fn check_legacy_paths(t: &Tree, takeover: bool, flag: bool) -> Result<(), InstallError> {
    let manifest =
        ledger::parse_manifest(&String::from_utf8_lossy(&fsops::read_bytes(t, ledger::MANIFEST)?.unwrap_or_default()))?;
    let why = if flag {
        "asked for by --legacy-paths"
    } else if takeover {
        "written by the legacy takeover"
    } else {
        "kept by legacy_paths=1 in install_state"
    };
    for e in legacy::ENTRY_POINTS {
        let rel = e.path();
        let show = crate::text::show_path(&fsops::abs(t, &rel));
        let found = fsops::read(t, &rel).map_err(|err| {
            InstallError::BadTarget(format!(
                "{err}; the legacy entry point {rel} ({why}) is not written there: make that path a plain directory or remove it, then run again"
            ))
        })?;
        match found {
            Found::Missing => {}
            Found::File { .. } if takeover || manifest.contains(&rel) => {}
            Found::File { .. } => {
                return Err(InstallError::BadTarget(format!(
                    "{show} exists and was not written by mam (not in {}); the legacy entry point ({why}) would replace it: move it away, then run again",
                    ledger::MANIFEST
                )))
            }
            Found::Other => {
                return Err(InstallError::BadTarget(format!(
                    "{show} is a symbolic link, directory or special file; the legacy entry point ({why}) is not written through it: remove it, then run again"
                )))
            }
        }
    }
    Ok(())
}

/// Every directory above an asset path, target-relative with a trailing `/`, `.mam/` excluded (it is
/// the state's root and outlives a remove).
fn dirs_of(paths: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for p in paths {
        let mut acc = String::new();
        let parts: Vec<&str> = p.trim_end_matches('/').split('/').collect();
        for c in &parts[..parts.len() - 1] {
            acc.push_str(c);
            acc.push('/');
            if acc != ".mam/" && !out.contains(&acc) {
                out.push(acc.clone());
            }
        }
    }
    out
}

/// Deepest first, so children go before their parents.
pub fn deepest_first(mut dirs: Vec<String>) -> Vec<String> {
    crate::sort::by(&mut dirs, |a, b| b.matches('/').count().cmp(&a.matches('/').count()).then(b.cmp(a)));
    dirs
}

fn fresh_state(o: &Options, gitignore_created: bool, legacy_paths: bool) -> Vec<u8> {
    let mut s = format!("version={}\ninstalled_at={}\nbinary={}\n", o.version, o.now_ts, assets::BINARY);
    if gitignore_created {
        s.push_str("gitignore_created=1\n");
    }
    if legacy_paths {
        s.push_str("legacy_paths=1\n");
    }
    s.into_bytes()
}

/// An old `install_state` without the `pending=` line (it belongs to the interrupted run only).
fn without_pending(state: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for l in state.split_inclusive(|b| *b == b'\n') {
        if !l.starts_with(b"pending=") {
            out.extend_from_slice(l);
        }
    }
    out
}

fn herdr_text(o: &Options) -> String {
    assets::herdr_shim(&o.target.join(assets::BINARY).to_string_lossy())
}

/// The manifest of an asset set: every asset, the generated herdr wrapper and its directory, and
/// every directory above them.
fn manifest_of(paths: &[String]) -> Vec<String> {
    let mut all: Vec<String> = paths.to_vec();
    all.push(assets::HERDR_SHIM.into());
    let mut m = dirs_of(&all);
    m.extend(all);
    crate::sort::natural(&mut m);
    m.dedup();
    m
}

/// Deletes the temp files an interrupted run can have left: in every asset directory, the install
/// directory, the herdr wrapper's, and the two target-level files.
fn clean_all_temps(o: &Options, r: &mut Report) {
    let all = assets::shipped(Vec::new(), &o.version, true);
    let paths: Vec<String> = all.iter().map(|a| a.path.clone()).collect();
    let mut dirs: Vec<String> =
        dirs_of(&manifest_of(&paths)).into_iter().map(|d| d.trim_end_matches('/').to_string()).collect();
    dirs.extend([".mam".to_string(), ledger::DIR.to_string(), BACKUP_DIR.to_string()]);
    let mut gone = fsops::clean_temps(&o.target, "", Some(&[".gitignore", assets::ENV_EXAMPLE, "mam-install-probe"]));
    for d in dirs {
        let only: Option<&[&str]> =
            if d == ".mam" { Some(&["agent_sessions.json", "agent_sessions.yaml.bak"]) } else { None };
        gone.extend(fsops::clean_temps(&o.target, &d, only));
    }
    for g in gone {
        r.note(format!("deleted {g}, a temp file of an interrupted run"));
    }
}

/// `mam install` (and `update` without `--from`): a fresh install, the completion of an interrupted
/// one, an update of an installed target, or the takeover of a legacy install.
pub fn install(o: &Options, r: &mut Report) -> Result<(), InstallError> {
    check_target(&o.target)?;
    let mut steps = Steps::new(o.hooks);
    clean_all_temps(o, r);
    if fsops::exists(&o.target, BACKUP_INDEX)? {
        r.note("an update was interrupted: restoring what it backed up first");
        let left = restore(o, &mut steps, r)?;
        if !left.is_empty() {
            return Err(InstallError::Restored {
                cause: Box::new(InstallError::BadTarget("interrupted update".into())),
                left,
            });
        }
    } else if fsops::exists(&o.target, BACKUP_DIR)? {
        // A backup that never got its index: the update had changed nothing yet.
        fsops::remove_tree(&o.target, BACKUP_DIR)?;
    }
    let state = fsops::read_bytes(&o.target, ledger::STATE)?.unwrap_or_default();
    let state_s = String::from_utf8_lossy(&state).into_owned();
    let pending = ledger::state_value(&state_s, "pending") == Some("install");
    let installed = fsops::exists(&o.target, ledger::MANIFEST)?;
    let legacy = is_legacy(&o.target);
    let plan = Plan {
        legacy,
        legacy_paths: o.legacy_paths || legacy || ledger::state_value(&state_s, "legacy_paths") == Some("1"),
    };
    if plan.legacy_paths {
        check_legacy_paths(&o.target, legacy, o.legacy_paths)?;
    }
    let stamp = ledger::stamp(&o.now_ts);
    if installed && !pending {
        update(o, &mut steps, r, plan, &stamp)
    } else if legacy {
        // A takeover moves and rewrites the legacy install's own files: like an update, it commits a
        // backup first and restores every path of it when anything fails (ORCH 7.4, issue 32).
        let files = touched(&[], true);
        guarded(o, &mut steps, r, &files, &stamp, |steps, r| fresh(o, steps, r, pending.then_some(state), plan, &stamp))
    } else {
        fresh(o, &mut steps, r, pending.then_some(state), plan, &stamp)
    }
}

/// Install into a target with no manifest (or an interrupted install, `pending` holding its state).
fn fresh(
    o: &Options,
    steps: &mut Steps,
    r: &mut Report,
    pending: Option<Vec<u8>>,
    plan: Plan,
    stamp: &str,
) -> Result<(), InstallError> {
    let t = &o.target;
    let legacy = plan.legacy;
    let prev = pending.clone().unwrap_or_default();
    let prev_s = String::from_utf8_lossy(&prev).into_owned();
    let legacy_state = if legacy {
        fsops::read_bytes(t, &format!("{}/install_state", legacy::DIR))?.unwrap_or_default()
    } else {
        Vec::new()
    };
    let gitignore_created = match &pending {
        Some(_) => ledger::state_value(&prev_s, "gitignore_created") == Some("1"),
        None => fsops::read_gitignore(t)?.is_none(),
    };
    let shipped = assets::shipped(o.binary.clone(), &o.version, plan.legacy_paths);
    let paths: Vec<String> = shipped.iter().map(|a| a.path.clone()).collect();
    let fresh = fresh_state(o, gitignore_created, plan.legacy_paths);
    let old_keys = ledger::merge_state(&without_pending(&prev), &without_pending(&legacy_state));

    // The pending state and the whole manifest come first: from here on every file this run can
    // write is in a ledger, and a second run knows it is completing this one.
    let mut pending_state = ledger::merge_state(&fresh, &old_keys);
    pending_state.extend_from_slice(b"pending=install\n");
    fsops::write(t, ledger::STATE, &pending_state, 0o644)?;
    steps.step()?;
    fsops::write(t, ledger::MANIFEST, &ledger::render_lines(manifest_of(&paths)), 0o644)?;
    steps.step()?;

    if legacy {
        take_over(o, steps, r, stamp)?;
    }
    for a in &shipped {
        put_asset(o, steps, r, a, None, stamp)?;
    }
    finish(o, steps, r, &shipped, &[], &fresh, &old_keys, gitignore_created)?;
    let what = if legacy { "took over the legacy install and installed" } else { "installed" };
    r.say(format!("{what} mam {} into {}", o.version, crate::text::show_path(t)));
    Ok(())
}

/// The legacy takeover: the legacy ledgers go to `.mam/removed-<stamp>/` (their `install_state`
/// keys were merged), a legacy YAML sessions file is imported (the YAML stays byte for byte, with a
/// `.yaml.bak` copy), and the rest of the state is not touched. The legacy entry points themselves
/// are replaced by `put_asset` (their originals moved aside there too).
fn take_over(o: &Options, steps: &mut Steps, r: &mut Report, stamp: &str) -> Result<(), InstallError> {
    let t = &o.target;
    for l in legacy::LEDGERS {
        let rel = format!("{}/{l}", legacy::DIR);
        if fsops::read(t, &rel)? != Found::Missing {
            let to = fsops::move_aside(t, &rel, stamp)?;
            steps.step()?;
            r.say(format!("legacy ledger {rel} kept as {to}"));
        }
    }
    let yaml_rel = legacy::YAML_SESSIONS;
    let json_rel = ".mam/agent_sessions.json";
    let yaml_abs = fsops::abs(t, yaml_rel);
    if let Found::File { bytes, .. } = fsops::read(t, yaml_rel)? {
        if fsops::read(t, json_rel)? == Found::Missing {
            let bak = yaml::backup_path(&yaml_abs);
            // An import cut short between its backup and its JSON file left an identical backup.
            if fs::read(&bak).is_ok_and(|b| b == bytes) {
                let _ = fs::remove_file(&bak);
            }
            match yaml::import(&yaml_abs, &fsops::abs(t, json_rel)) {
                Ok(yaml::Imported::Converted { rows, backup }) => {
                    steps.step()?;
                    r.say(format!(
                        "imported the legacy sessions file {yaml_rel} ({rows} row(s)) into {json_rel}; the YAML is unchanged, copy kept as {}",
                        crate::text::show_path(&backup)
                    ));
                }
                Ok(yaml::Imported::AlreadyJson) => {}
                Err(e) => return Err(InstallError::Sessions(e.to_string())),
            }
        }
    }
    let lib_py = fsops::abs(t, &format!("{}/lib_py", legacy::DIR));
    if lib_py.is_dir() {
        r.note(format!("{}/lib_py (the legacy Python package) is left as it was; nothing of mam uses it", legacy::DIR));
    }
    r.say("legacy state taken over unchanged: .mam/jobs, .mam/delegate_job_logs, the sessions file and its orchestrator_uuids, .mam.env");
    Ok(())
}

/// Writes one asset. What is already there: our bytes → left; pristine per `old_hash` → replaced;
/// anything else (a local edit, a legacy file, a link, a directory) → moved to
/// `.mam/removed-<stamp>/` and listed first (A51).
fn put_asset(
    o: &Options,
    steps: &mut Steps,
    r: &mut Report,
    a: &Asset,
    old_hash: Option<&str>,
    stamp: &str,
) -> Result<(), InstallError> {
    let t = &o.target;
    match fsops::read(t, &a.path)? {
        Found::File { bytes, mode } if bytes == *a.bytes => {
            if mode != a.mode {
                fsops::write(t, &a.path, &a.bytes, a.mode)?;
                steps.step()?;
            }
            return Ok(());
        }
        Found::File { bytes, .. } if old_hash == Some(ledger::sha256_hex(&bytes).as_str()) => {}
        Found::Missing => {}
        _ => {
            let to = fsops::move_aside(t, &a.path, stamp)?;
            steps.step()?;
            r.say(format!("kept local edit: {} -> {to}", a.path));
        }
    }
    fsops::write(t, &a.path, &a.bytes, a.mode)?;
    steps.step()
}

/// The end of install and update: the herdr wrapper, the `.gitignore` block, then the ledgers
/// (hashes, version, manifest, and the merged `install_state` last, which ends a pending install).
#[allow(clippy::too_many_arguments)] // one call site per procedure; a struct would only rename them
fn finish(
    o: &Options,
    steps: &mut Steps,
    r: &mut Report,
    shipped: &[Asset],
    carried: &[(String, String)],
    fresh: &[u8],
    old_state: &[u8],
    _gitignore_created: bool,
) -> Result<(), InstallError> {
    let t = &o.target;
    let herdr = herdr_text(o);
    if fsops::read_bytes(t, assets::HERDR_SHIM)?.as_deref() != Some(herdr.as_bytes()) {
        fsops::write(t, assets::HERDR_SHIM, herdr.as_bytes(), 0o755)?;
        steps.step()?;
    }
    let old_gi = fsops::read_gitignore(t)?;
    let (gi, warnings) = gitignore::with_block(old_gi.as_ref().map(|(b, _)| b.as_slice()));
    for w in warnings {
        r.warn(w);
    }
    if old_gi.as_ref().map(|(b, _)| b.as_slice()) != Some(gi.as_slice()) {
        // The old mode without any bit above 0o777 (read_gitignore masks it): a setuid file named
        // .gitignore never becomes root's setuid file.
        let mode = old_gi.as_ref().map_or(0o644, |(_, m)| *m);
        fsops::write(t, ".gitignore", &gi, mode)?;
        steps.step()?;
    }
    let mut hashes: Vec<(String, String)> =
        shipped.iter().map(|a| (ledger::sha256_hex(&a.bytes), a.path.clone())).collect();
    hashes.extend(carried.iter().cloned());
    fsops::write(t, ledger::HASHES, &ledger::render_hashes(&hashes), 0o644)?;
    steps.step()?;
    fsops::write(t, ledger::VERSION, format!("{} {}\n", o.version, o.commit).as_bytes(), 0o644)?;
    steps.step()?;
    let paths: Vec<String> = hashes.iter().map(|(_, p)| p.clone()).collect();
    fsops::write(t, ledger::MANIFEST, &ledger::render_lines(manifest_of(&paths)), 0o644)?;
    steps.step()?;
    fsops::write(t, ledger::STATE, &ledger::merge_state(fresh, &without_pending(old_state)), 0o644)?;
    steps.step()
}

/// One backed-up path of the update: its copy's number and mode, or absent before the update.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Saved {
    rel: String,
    copy: Option<(usize, u32)>,
}

/// A parsed backup index: the run's stamp, every backed-up path, the paths that held a link or a
/// directory (`other` lines: moved back from `.mam/removed-<stamp>/` if the run moved them), and the
/// directories that did not exist before the run (`nodir` lines: a takeover makes `.mam/install/`,
/// even `.mam/`).
#[derive(Debug)]
struct Index {
    stamp: String,
    saved: Vec<Saved>,
    others: Vec<String>,
    nodirs: Vec<String>,
}

/// The directories a guarded run may create before its backup is committed that a restore must
/// take away again when they were not there (deepest first).
const MADE_DIRS: [&str; 2] = [".mam/install/", ".mam/"];

/// The backup index (issue 29): every line must be one the backup writes. A path passes the ledger
/// path rule (relative, no `..`, no absolute path; the ledgers and `.gitignore` are allowed here),
/// a mode has no bit above 0o777 (a backup never records one), the stamp is digits, `T` and `Z`, a
/// `nodir` line names one of `MADE_DIRS`; anything else refuses the whole restore before anything is
/// written or deleted.
fn parse_index(text: &str) -> Result<Index, ledger::BadEntry> {
    let mut stamp = None;
    let mut out = Vec::new();
    let mut nodirs = Vec::new();
    let mut others = Vec::new();
    for (i, l) in text.lines().enumerate() {
        let bad = |reason: String| ledger::BadEntry {
            ledger: BACKUP_INDEX,
            line: i + 1,
            reason: format!("{reason} (not a line mam writes: delete {BACKUP_DIR} if you did not make it)"),
        };
        let path = |rel: &str| -> Result<String, ledger::BadEntry> {
            if ledger::ALL.contains(&rel) || rel == ".gitignore" {
                return Ok(rel.to_string());
            }
            ledger::check_path(rel).map_err(bad)?;
            if rel.ends_with('/') {
                return Err(bad(format!("'{}' is a directory", crate::text::one_line(rel))));
            }
            Ok(rel.to_string())
        };
        if let Some(s) = l.strip_prefix("stamp ") {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit() || b == b'T' || b == b'Z') {
                return Err(bad(format!("stamp '{}' is not a stamp", crate::text::one_line(s))));
            }
            stamp = Some(s.to_string());
        } else if let Some(rel) = l.strip_prefix("absent ") {
            out.push(Saved { rel: path(rel)?, copy: None });
        } else if let Some(rel) = l.strip_prefix("other ") {
            others.push(path(rel)?);
        } else if let Some(d) = l.strip_prefix("nodir ") {
            if !MADE_DIRS.contains(&d) {
                return Err(bad(format!("'{}' is not a directory a run makes", crate::text::one_line(d))));
            }
            nodirs.push(d.to_string());
        } else if let Some(rest) = l.strip_prefix("file ") {
            let mut it = rest.splitn(3, ' ');
            let (Some(n), Some(mode), Some(rel)) = (it.next(), it.next(), it.next()) else {
                return Err(bad("expected 'file <n> <mode> <path>'".into()));
            };
            let n: usize =
                n.parse().map_err(|_| bad(format!("'{}' is not a copy number", crate::text::one_line(n))))?;
            let mode = u32::from_str_radix(mode, 8).ok().filter(|m| *m <= 0o777).ok_or_else(|| {
                bad(format!(
                    "mode '{}' is not one of 0..=0777 (no setuid, setgid or sticky bit is ever restored)",
                    crate::text::one_line(mode)
                ))
            })?;
            out.push(Saved { rel: path(rel)?, copy: Some((n, mode)) });
        } else if !l.is_empty() {
            return Err(bad("unknown line".into()));
        }
    }
    let stamp = stamp.ok_or(ledger::BadEntry { ledger: BACKUP_INDEX, line: 0, reason: "no stamp line".into() })?;
    Ok(Index { stamp, saved: out, others, nodirs })
}

/// Every path an update can change: the files of the old manifest, the four ledgers,
/// `.gitignore`, every path any asset set of this binary writes (legacy ones included), and what a
/// legacy takeover moves or writes. The backup records each one, present or absent, so a restore
/// puts back exactly what was there.
fn touched(manifest: &[String], legacy: bool) -> Vec<String> {
    let mut v: Vec<String> = manifest.iter().filter(|p| !p.ends_with('/')).cloned().collect();
    v.extend(ledger::ALL.iter().map(|s| s.to_string()));
    v.push(".gitignore".into());
    v.extend(assets::shipped(Vec::new(), crate::version::VERSION, true).into_iter().map(|a| a.path));
    v.push(assets::HERDR_SHIM.into());
    if legacy {
        v.extend(legacy::LEDGERS.iter().map(|l| format!("{}/{l}", legacy::DIR)));
        // The sessions import writes the JSON file under its lock file, and the YAML's copy.
        v.extend(
            [".mam/agent_sessions.json", ".mam/agent_sessions.json.lock", ".mam/agent_sessions.yaml.bak"]
                .map(String::from),
        );
    }
    let mut seen = Vec::new();
    v.retain(|p| {
        let new = !seen.contains(p);
        seen.push(p.clone());
        new
    });
    v
}

/// 7.4 step 1: every file the old manifest names, the four ledgers and `.gitignore` are copied into
/// the backup directory; the `index` written last commits it. `nodirs` (of `MADE_DIRS`) were not
/// there before.
fn backup(o: &Options, steps: &mut Steps, files: &[String], stamp: &str, nodirs: &[&str]) -> Result<(), InstallError> {
    let t = &o.target;
    let mut index = format!("stamp {stamp}\n");
    for d in nodirs {
        index.push_str(&format!("nodir {d}\n"));
    }
    for (n, rel) in files.iter().enumerate() {
        match fsops::read(t, rel)? {
            Found::File { bytes, mode } => {
                // Never a bit above 0o777 (issue 29): a restore writes none either.
                let mode = mode & 0o777;
                fsops::write(t, &format!("{BACKUP_DIR}/f{n}"), &bytes, 0o600)?;
                index.push_str(&format!("file {n} {mode:o} {rel}\n"));
            }
            Found::Missing => index.push_str(&format!("absent {rel}\n")),
            // A link or directory where a file goes: never copied (nor followed); put_asset moves it
            // aside and the restore moves it back from there.
            Found::Other => index.push_str(&format!("other {rel}\n")),
        }
    }
    fsops::write(t, BACKUP_INDEX, index.as_bytes(), 0o600)?;
    steps.step()
}

/// 7.4 step 4: every backed-up path back as it was (a file byte for byte with its mode, an absent
/// one deleted, so what the failed run added goes), its copies in `.mam/removed-<stamp>/` and the
/// directories it made removed, then the backup itself. Returns what could not be restored.
fn restore(o: &Options, steps: &mut Steps, r: &mut Report) -> Result<Vec<String>, InstallError> {
    steps.disarm();
    let t = &o.target;
    let text = fsops::read_bytes(t, BACKUP_INDEX)?.unwrap_or_default();
    let Index { stamp, saved, others, nodirs } = parse_index(&String::from_utf8_lossy(&text))?;
    let mut left = Vec::new();
    for s in &saved {
        let res = match s.copy {
            Some((n, mode)) => match fsops::read_bytes(t, &format!("{BACKUP_DIR}/f{n}")) {
                Ok(Some(bytes)) => {
                    let same = matches!(fsops::read(t, &s.rel), Ok(Found::File { bytes: ref b, mode: m }) if *b == bytes && m == mode);
                    // The copy the failed run moved aside is the same bytes: it goes.
                    let aside = format!(".mam/removed-{stamp}/{}", s.rel);
                    if fsops::read_bytes(t, &aside).ok().flatten().as_deref() == Some(bytes.as_slice()) {
                        let _ = fsops::delete(t, &aside);
                    }
                    if same {
                        Ok(())
                    } else {
                        fsops::write(t, &s.rel, &bytes, mode)
                    }
                }
                _ => Err(InstallError::BadTarget(format!("backup copy f{n} missing"))),
            },
            None => fsops::delete(t, &s.rel).map(|_| ()),
        };
        if let Err(e) = res {
            left.push(format!("{} ({e})", s.rel));
        }
    }
    for rel in &others {
        // Nothing aside: the run never moved it, it is still in place.
        let aside = format!(".mam/removed-{stamp}/{rel}");
        if !fsops::exists(t, &aside).unwrap_or(false) {
            continue;
        }
        if let Err(e) = fsops::delete(t, rel).and_then(|_| fsops::move_back(t, &aside, rel)) {
            left.push(format!("{rel} ({e})"));
        }
    }
    let old_dirs: Vec<String> = fsops::read_bytes(t, ledger::MANIFEST)?
        .and_then(|m| ledger::parse_manifest(&String::from_utf8_lossy(&m)).ok())
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.ends_with('/'))
        .collect();
    let all: Vec<String> = saved.iter().map(|s| s.rel.clone()).chain(others.iter().cloned()).collect();
    let mut dirs = dirs_of(&all);
    let aside_root = format!(".mam/removed-{stamp}/");
    dirs.extend(dirs_of(&all.iter().map(|p| format!("{aside_root}{p}")).collect::<Vec<_>>()));
    for d in deepest_first(dirs) {
        if !old_dirs.contains(&d) {
            fsops::rmdir_if_empty(t, &d);
        }
    }
    if left.is_empty() {
        fsops::remove_tree(t, BACKUP_DIR)?;
        for d in &nodirs {
            fsops::rmdir_if_empty(t, d);
        }
        r.note("restored every file the update had backed up, byte for byte");
    }
    Ok(left)
}

/// 7.4 steps 1 and 4 around `body` (an update, or a takeover of a legacy install): the backup of
/// `files` is committed before the first change; on success it goes; on any failure every
/// backed-up path is restored (`restore`) and the cause is returned as `Restored`.
fn guarded<T>(
    o: &Options,
    steps: &mut Steps,
    r: &mut Report,
    files: &[String],
    stamp: &str,
    body: impl FnOnce(&mut Steps, &mut Report) -> Result<T, InstallError>,
) -> Result<T, InstallError> {
    let t = &o.target;
    let mut nodirs = Vec::new();
    for d in MADE_DIRS {
        if !fsops::exists(t, d)? {
            nodirs.push(d);
        }
    }
    match backup(o, steps, files, stamp, &nodirs).and_then(|()| body(steps, r)) {
        Ok(v) => {
            fsops::delete(t, BACKUP_INDEX)?;
            let _ = fsops::remove_tree(t, BACKUP_DIR);
            Ok(v)
        }
        Err(cause) if fsops::exists(t, BACKUP_INDEX).unwrap_or(false) => {
            let left = restore(o, steps, r)?;
            Err(InstallError::Restored { cause: Box::new(cause), left })
        }
        Err(cause) => {
            // The backup never got its index: nothing else had changed yet.
            let _ = fsops::remove_tree(t, BACKUP_DIR);
            for d in nodirs {
                fsops::rmdir_if_empty(t, d);
            }
            Err(InstallError::Restored { cause: Box::new(cause), left: Vec::new() })
        }
    }
}

/// 7.4 on an installed target: backup, install with local edits moved aside, dropped assets, the
/// merged state; any failure restores.
fn update(o: &Options, steps: &mut Steps, r: &mut Report, plan: Plan, stamp: &str) -> Result<(), InstallError> {
    let t = &o.target;
    let manifest =
        ledger::parse_manifest(&String::from_utf8_lossy(&fsops::read_bytes(t, ledger::MANIFEST)?.unwrap_or_default()))?;
    let old_hashes =
        ledger::parse_hashes(&String::from_utf8_lossy(&fsops::read_bytes(t, ledger::HASHES)?.unwrap_or_default()))?;
    let old_state = fsops::read_bytes(t, ledger::STATE)?.unwrap_or_default();
    let old_version = fsops::read_bytes(t, ledger::VERSION)?
        .map(|v| String::from_utf8_lossy(&v).split_whitespace().next().unwrap_or("unknown").to_string())
        .unwrap_or_else(|| "unknown".into());
    let binary_changed = guarded(o, steps, r, &touched(&manifest, plan.legacy), stamp, |steps, r| {
        update_steps(o, steps, r, &old_hashes, &old_state, stamp, plan)
    })?;
    r.say(format!("updated mam {old_version} -> {} in {}", o.version, crate::text::show_path(t)));
    if binary_changed {
        r.note("the binary .mam/bin/mam was replaced; restart the daemon (mam monitor stop, then mam monitor start) so it runs the new one");
    }
    Ok(())
}

fn update_steps(
    o: &Options,
    steps: &mut Steps,
    r: &mut Report,
    old_hashes: &[(String, String)],
    old_state: &[u8],
    stamp: &str,
    plan: Plan,
) -> Result<bool, InstallError> {
    let t = &o.target;
    let Plan { legacy, legacy_paths } = plan;
    let shipped = assets::shipped(o.binary.clone(), &o.version, legacy_paths);
    let old_hash = |p: &str| old_hashes.iter().find(|(_, q)| q == p).map(|(h, _)| h.as_str());
    let binary_changed = old_hash(assets::BINARY) != Some(ledger::sha256_hex(&o.binary).as_str());
    let gitignore_created = fsops::read_gitignore(t)?.is_none();
    let mut old_keys = old_state.to_vec();
    if legacy {
        let ls = fsops::read_bytes(t, &format!("{}/install_state", legacy::DIR))?.unwrap_or_default();
        old_keys = ledger::merge_state(&old_keys, &ls);
        take_over(o, steps, r, stamp)?;
    }
    for a in &shipped {
        put_asset(o, steps, r, a, old_hash(&a.path), stamp)?;
    }
    let mut carried = Vec::new();
    for (h, p) in old_hashes {
        if shipped.iter().any(|a| a.path == *p) {
            continue;
        }
        match fsops::read(t, p)? {
            Found::File { bytes, .. } if ledger::sha256_hex(&bytes) == *h => {
                fsops::delete(t, p)?;
                steps.step()?;
                r.say(format!("removed {p} (no longer shipped)"));
            }
            Found::Missing => {}
            _ => {
                carried.push((h.clone(), p.clone()));
                r.say(format!("kept {p}: modified locally and no longer shipped"));
            }
        }
    }
    let fresh = fresh_state(o, gitignore_created, legacy_paths);
    finish(o, steps, r, &shipped, &carried, &fresh, &old_keys, gitignore_created)?;
    Ok(binary_changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dirs_are_listed_once_without_the_state_root() {
        let d = dirs_of(&[".mam/bin/mam".into(), ".agents/skills/a/SKILL.md".into(), ".mam/shim/herdr".into()]);
        assert_eq!(d, vec![".mam/bin/", ".agents/", ".agents/skills/", ".agents/skills/a/", ".mam/shim/"]);
        assert_eq!(deepest_first(vec!["a/".into(), "a/b/".into()]), vec!["a/b/", "a/"]);
    }

    #[test]
    fn the_index_round_trips() {
        let Index { stamp: s, saved: v, others, nodirs } = parse_index(
            "stamp 20260101T000000Z\nnodir .mam/install/\nfile 3 755 .mam/bin/mam\nabsent .gitignore\nother .mam/shims/x\n",
        )
        .unwrap();
        assert_eq!(nodirs, vec![".mam/install/"]);
        assert_eq!(others, vec![".mam/shims/x"]);
        for bad in [
            "stamp 1Z\nfile 1 644 /etc/x\n",
            "stamp 1Z\nabsent ../x\n",
            "stamp 1Z\nfile 1 6755 .mam/bin/mam\n",
            "stamp 1Z\nfile 1 4755 .mam/bin/mam\n",
            "stamp ../../x\nabsent .mam/bin/mam\n",
            "stamp 1Z\nabsent .git/config\n",
            "stamp 1Z\nbogus\n",
            "stamp 1Z\nnodir .agents/\n",
            "stamp 1Z\nother ../x\n",
            "stamp 1Z\nnodir /etc/\n",
            "absent .mam/bin/mam\n",
        ] {
            assert!(parse_index(bad).is_err(), "{bad}");
        }
        assert_eq!(s, "20260101T000000Z");
        assert_eq!(v[0], Saved { rel: ".mam/bin/mam".into(), copy: Some((3, 0o755)) });
        assert_eq!(v[1], Saved { rel: ".gitignore".into(), copy: None });
    }
}
