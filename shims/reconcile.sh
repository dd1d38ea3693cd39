#!/usr/bin/env bash
# Legacy entry point `reconcile.sh` -> `mam reconcile` (A19: plain, the one-shot session reconcile;
# `--subscribe`, the control root's subscriber daemon). Dumb by design (CORE 0.1): find the binary
# ($MAM_BIN, then <shim dir>/../bin/mam, then mam on PATH) and exec it with the arguments untouched.
if [ -n "${MAM_BIN:-}" ]; then bin=$MAM_BIN
elif [ -x "${BASH_SOURCE[0]%/*}/../bin/mam" ]; then bin=${BASH_SOURCE[0]%/*}/../bin/mam
else bin=mam
fi
exec "$bin" reconcile "$@"
