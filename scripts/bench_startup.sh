#!/usr/bin/env bash
# Startup cost of the mam binary as a whole process, against /bin/true in the same run (issue 2):
# `mam --version` and `mam env --shell` on a 50-line env file. Prints hyperfine's medians and the
# ratios, and the stripped release binary size. Usage: scripts/bench_startup.sh [runs]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-300}
command -v hyperfine >/dev/null || { apt-get update -qq && apt-get install -y -qq hyperfine >/dev/null; }
cargo build --release --quiet
bin=$PWD/target/release/mam
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 50); do echo "KEY_$i='value number $i with some text'"; done > "$tmp/50.env"
# hyperfine's own environment carries MAM_ENV_FILE to every command, so no wrapper process is timed.
MAM_ENV_FILE=$tmp/50.env hyperfine -N --warmup 20 --runs "$runs" --export-json "$tmp/h.json" \
  /bin/true "$bin --version" "$bin env --shell" >/dev/null 2>&1
python3 - "$tmp/h.json" "$bin" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["results"]
med = {x["command"]: x["median"] for x in r}
base = r[0]["median"]
print(f"{'command':<60} {'median':>10} {'ratio':>7}")
for x in r[:3]:
    print(f"{x['command'].replace(sys.argv[2], 'mam'):<60} {x['median']*1e6:>8.0f}us {x['median']/base:>6.2f}x")
PY
echo "stripped release binary: $(stat -c %s "$bin") bytes"
