#!/usr/bin/env bash
# One-shot QoS 1 publish as a whole process (connect, PUBLISH, PUBACK, DISCONNECT): `mam pub -q 1`
# against `mosquitto_pub -q 1`, both against one local mosquitto, in one hyperfine run (issue 3).
# Usage: scripts/bench_pub.sh [RUNS]   Target: median ratio mam/mosquitto_pub <= 1.0.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-200}
export PATH="$PATH:/usr/sbin"
cargo build --release --quiet
bin=$PWD/target/release/mam
tmp=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
printf 'listener %s 127.0.0.1\nallow_anonymous true\npersistence false\nlog_type none\n' "$port" > "$tmp/m.conf"
mosquitto -c "$tmp/m.conf" & mpid=$!
trap 'kill $mpid 2>/dev/null; wait $mpid 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 100); do mosquitto_pub -p "$port" -t probe -m x 2>/dev/null && break; sleep 0.05; done
MQTT_PORT=$port MAM_ENV_FILE=/nonexistent hyperfine -N --warmup 20 --runs "$runs" --export-json "$tmp/h.json" \
  "$bin pub -t bench/x -m hello -q 1" "mosquitto_pub -p $port -t bench/x -m hello -q 1" >/dev/null 2>&1
python3 - "$tmp/h.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["results"]
a, b = r[0]["median"], r[1]["median"]
print(f"mam pub -q 1:        {a*1e3:.3f} ms (median)")
print(f"mosquitto_pub -q 1:  {b*1e3:.3f} ms (median)")
print(f"ratio mam/mosquitto_pub: {a/b:.2f}")
PY
