#!/usr/bin/env bash
# `mam publish` (a progress event and its retained state, registry and events.log included) and
# `mam pub -q 1` against `mosquitto_pub -q 1`, all to one node of a local 3-node NATS cluster
# (JetStream + MQTT), in one run, alternating the commands round by round (issue 19).
# Usage: scripts/bench_nats.sh [ROUNDS]   Prints the medians and the ratios to mosquitto_pub.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-50}
export PATH="$PATH:/usr/sbin"
cargo build --release --quiet
bin=${CARGO_TARGET_DIR:-$PWD/target}/release/mam
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT
free() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
declare -a cl mq
for i in 0 1 2; do cl[$i]=$(free); mq[$i]=$(free); done
routes="nats://127.0.0.1:${cl[0]}, nats://127.0.0.1:${cl[1]}, nats://127.0.0.1:${cl[2]}"
for i in 0 1 2; do
  mkdir -p "$tmp/s$i"
  printf 'server_name: n%s\nlisten: 127.0.0.1:%s\njetstream { store_dir: "%s" }\ncluster { name: bench\n listen: 127.0.0.1:%s\n routes: [%s] }\nmqtt { listen: 127.0.0.1:%s }\n' \
    "$i" "$(free)" "$tmp/s$i" "${cl[$i]}" "$routes" "${mq[$i]}" > "$tmp/n$i.conf"
  nats-server -c "$tmp/n$i.conf" >"$tmp/n$i.log" 2>&1 & pids+=($!)
done
port=${mq[0]}
for _ in $(seq 300); do mosquitto_pub -p "$port" -t probe -m x -q 1 2>/dev/null && break; sleep 0.1; done
ws=$tmp/ws; mkdir -p "$ws/.mam"
export MAM_ENV_FILE=/nonexistent MQTT_BROKER=127.0.0.1:$port WORKSPACE_ROOT=$ws
id=$("$bin" registry register --session bench --heartbeat-sec 30)
"$bin" publish --job-id "$id" --event started >/dev/null
python3 - "$rounds" "$bin" "$port" "$id" <<'PY'
import statistics, subprocess, sys, time
rounds, mam, port, job = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
cmds = {
    "mam publish (event + state)": [mam, "publish", "--job-id", job, "--event", "progress", "--message", "bench"],
    "mam pub -q 1": [mam, "pub", "-t", "bench/x", "-m", "hello", "-q", "1"],
    "mosquitto_pub -q 1": ["mosquitto_pub", "-p", port, "-t", "bench/x", "-m", "hello", "-q", "1"],
}
times = {k: [] for k in cmds}
names = list(cmds)
for r in range(rounds):
    for k in (names if r % 2 == 0 else names[::-1]):
        t = time.perf_counter()
        subprocess.run(cmds[k], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times[k].append(time.perf_counter() - t)
base = statistics.median(times["mosquitto_pub -q 1"])
for k in names:
    m = statistics.median(times[k])
    print(f"{k:30s} {m*1e3:8.2f} ms (median of {rounds})  ratio to mosquitto_pub {m/base:.2f}")
PY
