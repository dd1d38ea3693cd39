//! `mam remove` (ORCH 7.5, A50, A53): refuses under running work, then per manifest entry deletes a
//! pristine file, moves a modified one to `.mam/removed-<stamp>/`, notes a missing one, deletes the
//! generated wrapper and emptied directories, takes the managed block out of `.gitignore` (deleting
//! the file only when install created it and nothing but whitespace is left), and deletes the four
//! ledgers last, the manifest the very last. The state (registry, audit logs, sessions file, loop
//! state) is kept and named. A ledger naming a path outside the target refuses the whole run.

use std::path::Path;

use super::fsops::{self, Found, Steps, Tree};
use super::run::deepest_first;
use super::{assets, gitignore, ledger, InstallError, Options, Report};
use crate::session;
use crate::sys::{Flock, LockMode};

/// What remove will do to one path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Delete,
    MoveAside,
    Missing,
    RemoveDirIfEmpty,
}

/// The plan: actions in order, then the `.gitignore` and ledger steps.
#[derive(Debug, Clone)]
pub struct Plan {
    pub entries: Vec<(String, Action)>,
    pub gitignore_created: bool,
}

/// The running work that blocks a remove (A53): `running` session rows and a held daemon lock.
pub fn running_work(target: &Path, sessions_file: &Path) -> Vec<String> {
    let mut found = Vec::new();
    if let Ok(doc) = session::load(sessions_file) {
        for row in doc.herdr_sessions.iter().filter(|r| r.status == "running") {
            found.push(format!("session {} is running", row.name));
        }
    }
    let lock = crate::daemon::lock::lock_path(target);
    if let Ok(f) = crate::sys::open_nofollow_read(&lock) {
        if let Ok(None) = Flock::try_acquire(f, LockMode::Exclusive) {
            let pid = crate::daemon::lock::read_info(target).map(|i| i.pid.to_string()).unwrap_or_else(|| "?".into());
            found.push(format!("the daemon holds {} (pid {pid})", crate::text::show_path(&lock)));
        }
    }
    found
}

/// Reads the ledgers and decides every step; changes nothing.
pub fn plan(target: &Tree) -> Result<Plan, InstallError> {
    let manifest = match fsops::read_bytes(target, ledger::MANIFEST)? {
        Some(m) => ledger::parse_manifest(&String::from_utf8_lossy(&m))?,
        None => return Err(InstallError::NotInstalled(target.to_path_buf())),
    };
    let hashes = ledger::parse_hashes(&String::from_utf8_lossy(
        &fsops::read_bytes(target, ledger::HASHES)?.unwrap_or_default(),
    ))?;
    let state = String::from_utf8_lossy(&fsops::read_bytes(target, ledger::STATE)?.unwrap_or_default()).into_owned();
    let mut entries = Vec::new();
    let mut dirs = Vec::new();
    for p in &manifest {
        if p.ends_with('/') {
            dirs.push(p.clone());
            continue;
        }
        let action = match fsops::read(target, p)? {
            Found::Missing => Action::Missing,
            Found::File { bytes, .. } => {
                let want = hashes.iter().find(|(_, q)| q == p).map(|(h, _)| h.as_str());
                match want {
                    Some(h) if ledger::sha256_hex(&bytes) == h => Action::Delete,
                    // Generated and unhashed (A50): the herdr wrapper.
                    None if p == assets::HERDR_SHIM => Action::Delete,
                    _ => Action::MoveAside,
                }
            }
            Found::Other => Action::MoveAside,
        };
        entries.push((p.clone(), action));
    }
    for d in deepest_first(dirs) {
        entries.push((d, Action::RemoveDirIfEmpty));
    }
    Ok(Plan { entries, gitignore_created: ledger::state_value(&state, "gitignore_created") == Some("1") })
}

/// The kept state, named in the output (7.5).
pub fn kept_state(target: &Path, sessions_file: &Path) -> Vec<String> {
    let mut v = Vec::new();
    for (what, rel) in
        [("job registry", ".mam/jobs"), ("audit logs", ".mam/delegate_job_logs"), ("loop state", ".mam/loop")]
    {
        let p = target.join(rel);
        let there = if p.exists() { "" } else { " (none yet)" };
        v.push(format!("kept {what}: {}{there}", crate::text::show_path(&p)));
    }
    let there = if sessions_file.exists() { "" } else { " (none yet)" };
    v.push(format!("kept sessions file: {}{there}", crate::text::show_path(sessions_file)));
    v
}

/// Runs the plan (or prints it with `dry_run`).
pub fn remove(o: &Options, sessions_file: &Path, dry_run: bool, r: &mut Report) -> Result<(), InstallError> {
    let t = &o.target;
    if !t.is_dir() {
        return Err(InstallError::BadTarget(format!("target {} is not a directory", crate::text::show_path(t))));
    }
    super::run::check_trust(t)?;
    let plan = plan(t)?;
    let running = running_work(t, sessions_file);
    if !running.is_empty() {
        return Err(InstallError::Running(running));
    }
    let stamp = ledger::stamp(&o.now_ts);
    if dry_run {
        for (p, a) in &plan.entries {
            let what = match a {
                Action::Delete => "delete".to_string(),
                Action::MoveAside => format!("move (locally modified) to .mam/removed-{stamp}/{p}"),
                Action::Missing => "already missing".to_string(),
                Action::RemoveDirIfEmpty => "remove when empty".to_string(),
            };
            r.say(format!("would {what}: {p}"));
        }
        r.say("would take the managed block out of .gitignore");
        for l in ledger::ALL {
            r.say(format!("would delete ledger: {l}"));
        }
        r.say("dry run: nothing changed");
        return Ok(());
    }
    let mut steps = Steps::new(o.hooks);
    let mut moved = Vec::new();
    for (p, a) in &plan.entries {
        match a {
            Action::Delete => {
                fsops::delete(t, p)?;
                steps.step()?;
            }
            Action::MoveAside => {
                let to = fsops::move_aside(t, p, &stamp)?;
                steps.step()?;
                moved.push(format!("kept local edit: {p} -> {to}"));
            }
            Action::Missing => r.note(format!("{p} was already missing")),
            Action::RemoveDirIfEmpty => {
                fsops::rmdir_if_empty(t, p);
            }
        }
    }
    if let Some((old, mode)) = fsops::read_gitignore(t)? {
        let new = gitignore::without_block(&old);
        if plan.gitignore_created && gitignore::is_blank(&new) {
            fsops::delete(t, ".gitignore")?;
            steps.step()?;
            r.say("deleted .gitignore (install created it and nothing else was in it)");
        } else if new != old {
            // `mode` has no bit above 0o777 (read_gitignore masks it).
            fsops::write(t, ".gitignore", &new, mode)?;
            steps.step()?;
        }
    }
    for l in ledger::ALL {
        fsops::delete(t, l)?;
        steps.step()?;
    }
    fsops::rmdir_if_empty(t, ledger::DIR);
    for m in moved {
        r.say(m);
    }
    r.say(format!("removed mam from {}", crate::text::show_path(t)));
    for k in kept_state(t, sessions_file) {
        r.say(k);
    }
    Ok(())
}
