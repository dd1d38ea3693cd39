#!/usr/bin/env bash
# Legacy entry point `worktree_prepare.sh <branch> [--path DIR] [--base REF] [--submodules]
# [--creator AGENT [--name N]]` -> `mam worktree prepare` (ORCH 5.1), same argument order. Dumb by
# design (ORCH 0.5): find the binary ($MAM_BIN, then <shim dir>/../bin/mam, then mam on PATH) and exec
# it with the arguments untouched.
case "${BASH_SOURCE[0]}" in */*) dir=${BASH_SOURCE[0]%/*} ;; *) dir=. ;; esac
if [ -n "${MAM_BIN:-}" ]; then bin=$MAM_BIN
elif [ -x "$dir/../bin/mam" ]; then bin=$dir/../bin/mam
else bin=$(command -v mam) || bin=
fi
if [ -z "$bin" ] || ! [ -x "$bin" ]; then
  echo "ERROR: worktree_prepare.sh: mam binary not found (looked at MAM_BIN=${MAM_BIN:-<unset>}, $dir/../bin/mam, mam on PATH)" >&2
  exit 127
fi
exec "$bin" worktree prepare "$@"
