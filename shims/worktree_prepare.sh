#!/usr/bin/env bash
# Legacy entry point `worktree_prepare.sh <branch> [--path DIR] [--base REF] [--submodules]
# [--creator AGENT [--name N]]` -> `mam worktree prepare` (ORCH 5.1), same argument order. Dumb by
# design (ORCH 0.5): find the binary ($MAM_BIN, then <shim dir>/../bin/mam, then mam on PATH) and exec
# it with the arguments untouched.
if [ -n "${MAM_BIN:-}" ]; then bin=$MAM_BIN
elif [ -x "${BASH_SOURCE[0]%/*}/../bin/mam" ]; then bin=${BASH_SOURCE[0]%/*}/../bin/mam
else bin=mam
fi
exec "$bin" worktree prepare "$@"
