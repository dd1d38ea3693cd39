//! The legacy install (issue 16): the layout the legacy installer left in a repository, the
//! legacy-path map (every legacy entry point, at its legacy relative path, and the shim that
//! replaces it), and the text of those replacements. Pure: paths and bytes, no I/O.
//!
//! The seeds name the pieces but no single tree; the decided layout (docs/DESIGN.md, "Install,
//! update, remove") is the legacy skill directory `.agents/skills/multi-agent-mux/` ("SKILL_DIR")
//! holding `scripts/` (the shell and Python entry points) and `lib_py/` (the Python package), the
//! three stamp files and the install manifest beside them, the eight `SKILL.md` files under
//! `.agents/skills/<skill>/`, and the state under `.mam/` with the YAML sessions file
//! `.mam/agent_sessions.yaml`.

/// The legacy skill directory, target-relative.
pub const DIR: &str = ".agents/skills/multi-agent-mux";

/// The legacy ledgers inside `DIR`: three stamp files and the install manifest.
pub const LEDGERS: &[&str] = &["asset_hashes.txt", "version.txt", "install_state", "install_manifest.txt"];

/// The legacy YAML sessions file (the default of `AGENT_SESSIONS_YAML` before the JSON file).
pub const YAML_SESSIONS: &str = ".mam/agent_sessions.yaml";

/// How a legacy entry point is used, which decides the text that replaces it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A bash script run directly or with `bash`.
    Shell,
    /// A Python script: run directly, with `bash`, or with `python3` (the replacement is valid
    /// bash and valid Python and only execs the shim).
    Python,
    /// Sourced (`lib.sh`).
    Sourced,
}

/// One row of the legacy-path map.
#[derive(Debug, Clone, Copy)]
pub struct EntryPoint {
    /// The path inside `DIR`.
    pub rel: &'static str,
    /// The shim in `.mam/shims/` that does its work.
    pub shim: &'static str,
    /// The mam command behind it (for the listing and the docs).
    pub command: &'static str,
    pub kind: Kind,
}

impl EntryPoint {
    /// The target-relative path.
    pub fn path(&self) -> String {
        format!("{DIR}/{}", self.rel)
    }
}

const fn e(rel: &'static str, shim: &'static str, command: &'static str, kind: Kind) -> EntryPoint {
    EntryPoint { rel, shim, command, kind }
}

/// The legacy-path map: every legacy entry point the seeds name, sorted by path.
pub const ENTRY_POINTS: &[EntryPoint] = &[
    e("lib_py/delegation/envfile.py", "envfile", "mam env", Kind::Python),
    e("scripts/create_session.sh", "create_session.sh", "mam create", Kind::Shell),
    e("scripts/delegate_job.sh", "delegate_job.sh", "mam delegate-job", Kind::Shell),
    e("scripts/diff_collect.sh", "diff_collect.sh", "mam diff-collect", Kind::Shell),
    e("scripts/envfile.py", "envfile", "mam env", Kind::Python),
    e("scripts/heartbeat.py", "heartbeat", "mam heartbeat", Kind::Python),
    e("scripts/install.sh", "install.sh", "mam install", Kind::Shell),
    e("scripts/job_subscriber.py", "job_subscriber", "mam watch", Kind::Python),
    e("scripts/lib.sh", "lib.sh", "(sourced library)", Kind::Sourced),
    e("scripts/orc_onboard.sh", "orc_onboard.sh", "mam orc-onboard", Kind::Shell),
    e("scripts/publish_event.py", "publish_event", "mam publish", Kind::Python),
    e("scripts/reconcile.sh", "reconcile.sh", "mam reconcile", Kind::Shell),
    e("scripts/registry.py", "registry", "mam registry", Kind::Python),
    e("scripts/remote.py", "remote", "mam remote", Kind::Python),
    e("scripts/remove.sh", "remove.sh", "mam remove", Kind::Shell),
    e("scripts/resume_session.sh", "resume_session.sh", "mam resume", Kind::Shell),
    e("scripts/run_loop.sh", "run_loop.sh", "mam loop", Kind::Shell),
    e("scripts/status.sh", "status.sh", "mam status", Kind::Shell),
    e("scripts/stop_session.sh", "stop_session.sh", "mam stop", Kind::Shell),
    e("scripts/update.sh", "update.sh", "mam update", Kind::Shell),
    e("scripts/worktree_prepare.sh", "worktree_prepare.sh", "mam worktree prepare", Kind::Shell),
    e("scripts/worktree_remove.sh", "worktree_remove.sh", "mam worktree remove", Kind::Shell),
];

/// `../` once per directory between the entry point and the target.
fn up(e: &EntryPoint) -> String {
    "../".repeat(e.path().matches('/').count())
}

/// The replacement text of a legacy entry point: it finds `.mam/shims/<shim>` relative to itself
/// (so a moved checkout keeps working) and execs it with the arguments untouched; the shim then
/// finds the binary (ORCH 0.5).
pub fn shim_text(e: &EntryPoint) -> String {
    let shim = format!("{}.mam/shims/{}", up(e), e.shim);
    let head = format!(
        "# Legacy entry point {} -> {} (issue 16), written by mam install: runs\n# .mam/shims/{} with the arguments untouched.\n",
        e.path(),
        e.command,
        e.shim
    );
    let find = "case \"${BASH_SOURCE[0]}\" in */*) _mam_d=${BASH_SOURCE[0]%/*} ;; *) _mam_d=. ;; esac\n";
    match e.kind {
        Kind::Shell => format!("#!/usr/bin/env bash\n{head}{find}exec \"$_mam_d/{shim}\" \"$@\"\n"),
        Kind::Sourced => {
            format!("# shellcheck shell=bash\n{head}{find}. \"$_mam_d/{shim}\"\nunset _mam_d\n")
        }
        // Bash reads line 2 as `true '\'` and execs before the closing quotes; Python reads lines
        // 2 to the closing quotes as one string and runs the rest.
        Kind::Python => format!(
            "#!/usr/bin/env bash\n\"true\" '''\\'\n{head}# Valid bash and valid Python: run directly, with bash or with python3.\n{find}exec \"$_mam_d/{shim}\" \"$@\"\n'''\nimport os, sys\nshim = os.path.join(os.path.dirname(os.path.abspath(__file__)), \"{shim}\")\nos.execvp(\"bash\", [\"bash\", shim] + sys.argv[1:])\n"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_map_is_sorted_and_every_shim_is_shipped() {
        let paths: Vec<String> = ENTRY_POINTS.iter().map(|e| e.path()).collect();
        assert!(paths.windows(2).all(|w| w[0] < w[1]), "{paths:?}");
        for e in ENTRY_POINTS {
            assert!(super::super::assets::SHIMS.iter().any(|(n, _)| *n == e.shim), "{}", e.shim);
        }
    }

    #[test]
    fn the_replacement_points_at_the_target_shims() {
        let e = ENTRY_POINTS.iter().find(|e| e.rel == "scripts/registry.py").unwrap();
        let t = shim_text(e);
        assert!(t.contains("\"$_mam_d/../../../../.mam/shims/registry\" \"$@\""), "{t}");
        assert!(!t[t.find("'''").unwrap() + 3..t.rfind("'''").unwrap()].contains("'''"));
    }
}
