#!/usr/bin/env bash
# Legacy entry point `reconcile.sh` -> `mam reconcile` (A19: plain, the one-shot session reconcile;
# `--subscribe`, the control root's subscriber daemon). Dumb by design (CORE 0.1): find the binary
# ($MAM_BIN, then <shim dir>/../bin/mam, then mam on PATH) and exec it with the arguments untouched.
case "${BASH_SOURCE[0]}" in */*) dir=${BASH_SOURCE[0]%/*} ;; *) dir=. ;; esac
if [ -n "${MAM_BIN:-}" ]; then bin=$MAM_BIN
elif [ -x "$dir/../bin/mam" ]; then bin=$dir/../bin/mam
else bin=$(command -v mam) || bin=
fi
if [ -z "$bin" ] || ! [ -x "$bin" ]; then
  echo "ERROR: reconcile.sh: mam binary not found (looked at MAM_BIN=${MAM_BIN:-<unset>}, $dir/../bin/mam, mam on PATH)" >&2
  exit 127
fi
# The legacy trap exited 143 on SIGTERM (130 on SIGINT); the daemon does too when asked (issue 32).
export MAM_LEGACY_SIGNAL_RC=1
exec "$bin" reconcile "$@"
