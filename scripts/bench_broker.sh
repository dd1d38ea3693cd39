#!/usr/bin/env bash
# The embedded broker against mosquitto, same machine, same run (docs/PERFORMANCE.md, issue 17):
# RSS with 1,000 and 5,000 idle clients and after they left; throughput, p50/p99 latency and the
# broker's CPU per message of one publisher to one subscriber at QoS 0, 1 and 2 (BENCH_REPEAT
# rounds), then QoS 0 and 1 again with BENCH_IDLE (5,000) idle subscribed clients connected. Load
# generator: scripts/bench_broker.py (python3, standard library only).
# Usage: scripts/bench_broker.sh [CLIENTS...] (default 1000 5000).
set -euo pipefail
export PATH="$PATH:/usr/sbin"
here=$(cd "$(dirname "$0")/.." && pwd)
counts=("${@:-1000}")
[ $# -eq 0 ] && counts=(1000 5000)
ulimit -n "$(ulimit -Hn)"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$here/target}
cargo build --release --quiet --manifest-path "$here/Cargo.toml"
mam=$CARGO_TARGET_DIR/release/mam
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 100); do python3 -c "import socket,sys; socket.create_connection(('127.0.0.1',$1),1)" 2>/dev/null && return; sleep 0.1; done; echo "no listener on $1" >&2; exit 1; }
start_mam() {  # $1 (mosquitto's extra config) is not used
  port=$(free_port)
  # Its default configuration, persistence on: the state file (written only on a change) in $tmp.
  WORKSPACE_ROOT=$tmp "$mam" broker --allow-anonymous --port "$port" --max-connections 20000 >"$tmp/mam.out" 2>"$tmp/mam.err" &
  pid=$!; pids+=("$pid"); wait_port "$port"
}
start_mosquitto() {
  port=$(free_port)
  printf 'listener %s 127.0.0.1\nallow_anonymous true\nmax_connections -1\n%b' "$port" "${1:-}" >"$tmp/m.conf"
  mosquitto -c "$tmp/m.conf" >"$tmp/m.log" 2>&1 &
  pid=$!; pids+=("$pid"); wait_port "$port"
}
stop() { kill "$pid"; wait "$pid" 2>/dev/null || true; }
echo "machine: $(nproc) cores, $(uname -sr), $(mosquitto -h | head -1)"
for n in "${counts[@]}"; do
  for b in mam mosquitto; do
    "start_$b"; echo "$b $(python3 "$here/scripts/bench_broker.py" rss "$port" "$pid" "$n")"; stop
  done
done
# BENCH_REPEAT=N: N alternating rounds of the delivery runs (one generator run is noisy).
# BENCH_IDLE=N (default 5000, 0 skips): QoS 0 and 1 again with N idle subscribed clients connected.
idle=${BENCH_IDLE:-5000}
for _ in $(seq "${BENCH_REPEAT:-1}"); do
  for q in 0 1 2; do
    for b in mam mosquitto; do
      # mosquitto's defaults cannot run the QoS 2 round: it answers the 21st unacknowledged QoS 2
      # PUBLISH of a 3.1.1 client with PUBREC 0x97 (a 5.0 reason code) and closes the connection,
      # and drops past 1000 queued messages. It gets the generator's window and no queue limit.
      extra=
      [ "$b" = mosquitto ] && [ "$q" = 2 ] && extra='max_inflight_messages 100\nmax_queued_messages 0\n'
      "start_$b" "$extra"; echo "$b $(python3 "$here/scripts/bench_broker.py" thr "$port" "$q" 20000 "$pid" || true)"; stop
    done
  done
  if [ "$idle" -gt 0 ]; then
    for q in 0 1; do
      for b in mam mosquitto; do
        "start_$b"; echo "$b $(python3 "$here/scripts/bench_broker.py" thr "$port" "$q" 20000 "$pid" "$idle" || true)"; stop
      done
    done
  fi
done
