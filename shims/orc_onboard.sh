#!/usr/bin/env bash
# Legacy entry point `orc_onboard.sh [--agent KIND] [<uuid>] | --list | --remove <uuid>
# [--purge-conversation --yes] [--agent KIND]` -> `mam orc-onboard` (ORCH 6.5). Dumb by design
# (ORCH 0.5): find the binary ($MAM_BIN, then <shim dir>/../bin/mam, then mam on PATH) and exec it
# with the arguments untouched.
if [ -n "${MAM_BIN:-}" ]; then bin=$MAM_BIN
elif [ -x "${BASH_SOURCE[0]%/*}/../bin/mam" ]; then bin=${BASH_SOURCE[0]%/*}/../bin/mam
else bin=mam
fi
exec "$bin" orc-onboard "$@"
