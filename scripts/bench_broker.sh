#!/usr/bin/env bash
# Benchmarks `mam broker` (release build) against mosquitto in one run (CORE 11, docs/PERFORMANCE.md):
#   throughput: P publishers x N QoS 1 messages of SIZE bytes (mosquitto_pub -l) to one QoS 1
#               subscriber on `mam/#` (mosquitto_sub -C); messages/s from the first publisher start
#               to the subscriber's last message.
#   idle RSS:   the broker's VmRSS with C idle connected clients (python3 opens them).
# Prints each run and the medians; targets: throughput ratio >= 0.7, mam RSS with 200 idle < 32 MB.
#
# Usage: scripts/bench_broker.sh [RUNS]   (env: PUBS=8 MSGS=5000 SIZE=256 IDLE=200 MAM_BIN=path)
set -euo pipefail

RUNS=${1:-3}
PUBS=${PUBS:-8}
MSGS=${MSGS:-5000}
SIZE=${SIZE:-256}
IDLE=${IDLE:-200}
cd "$(dirname "$0")/.."

for tool in mosquitto mosquitto_pub mosquitto_sub python3; do
    command -v "$tool" >/dev/null || [ -x "/usr/sbin/$tool" ] || { echo "ERROR: $tool not found" >&2; exit 2; }
done
MOSQUITTO=$(command -v mosquitto || echo /usr/sbin/mosquitto)
if [ -z "${MAM_BIN:-}" ]; then
    cargo build --release --quiet
    MAM_BIN=target/release/mam
fi

WORK=$(mktemp -d)
PIDS=()
cleanup() {
    for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

# One payload file per publisher: MSGS lines of SIZE bytes (the newline is not sent).
python3 - "$WORK" "$PUBS" "$MSGS" "$SIZE" <<'PY'
import sys
work, pubs, msgs, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
for p in range(pubs):
    with open(f"{work}/payload{p}", "w") as f:
        for i in range(msgs):
            head = f"p{p}m{i}:"
            f.write(head + "x" * (size - len(head)) + "\n")
PY

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

start_mam() {
    # Anonymous: mosquitto runs anonymous too, and the load clients are python and mosquitto_pub.
    "$MAM_BIN" broker --port 0 --allow-anonymous >"$WORK/mam.out" 2>"$WORK/mam.err" &
    BPID=$!
    PIDS+=("$BPID")
    for _ in $(seq 100); do
        grep -q "listening on" "$WORK/mam.out" 2>/dev/null && break
        sleep 0.05
    done
    PORT=$(sed -n 's/^mam broker listening on .*:\([0-9]*\)$/\1/p' "$WORK/mam.out")
    [ -n "$PORT" ] || { echo "ERROR: mam broker did not start: $(cat "$WORK/mam.err")" >&2; exit 1; }
}

start_mosquitto() {
    PORT=$(free_port)
    # max_queued_messages 0: mosquitto's default (1000 queued beyond 20 in flight) silently drops
    # QoS 1 messages under this load, so the subscriber would never see them all.
    printf 'listener %s 127.0.0.1\nallow_anonymous true\nuser root\npersistence false\nlog_dest none\nmax_queued_messages 0\n' \
        "$PORT" >"$WORK/mosq.conf"
    "$MOSQUITTO" -c "$WORK/mosq.conf" >/dev/null 2>&1 &
    BPID=$!
    PIDS+=("$BPID")
    for _ in $(seq 100); do
        python3 -c "import socket,sys; socket.create_connection(('127.0.0.1',$PORT),0.2)" 2>/dev/null && return
        sleep 0.05
    done
    echo "ERROR: mosquitto did not start" >&2
    exit 1
}

stop_broker() { kill "$BPID" 2>/dev/null || true; wait "$BPID" 2>/dev/null || true; }

# Prints messages per second for one broker on $PORT.
throughput() {
    local total=$((PUBS * MSGS)) ready="mam/ready-$RANDOM"
    mosquitto_pub -p "$PORT" -q 1 -r -t "$ready" -m ready
    rm -f "$WORK/sub.out"
    mosquitto_sub -p "$PORT" -q 1 -t 'mam/#' -C $((total + 1)) -W 120 >"$WORK/sub.out" &
    local sub=$!
    # The retained "ready" message shows the subscription is active.
    for _ in $(seq 200); do [ -s "$WORK/sub.out" ] && break; sleep 0.01; done
    local t0 t1
    t0=$(date +%s.%N)
    local pubs=()
    for p in $(seq 0 $((PUBS - 1))); do
        mosquitto_pub -p "$PORT" -q 1 -t "mam/bench/$p" -l <"$WORK/payload$p" &
        pubs+=($!)
    done
    wait "${pubs[@]}"
    wait "$sub" || { echo "ERROR: subscriber did not get all $total messages ($(wc -l <"$WORK/sub.out") lines)" >&2; exit 1; }
    t1=$(date +%s.%N)
    mosquitto_pub -p "$PORT" -q 1 -r -t "$ready" -n
    python3 -c "print(round($total / ($t1 - $t0)))"
}

# Prints the broker's VmRSS in kB with $IDLE idle clients connected.
idle_rss() {
    python3 - "$PORT" "$IDLE" "$BPID" <<'PY'
import socket, struct, sys
port, n, pid = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
def connect_packet(cid):
    cid = cid.encode()
    body = b"\x00\x04MQTT\x04\x02" + struct.pack(">H", 600) + struct.pack(">H", len(cid)) + cid
    return bytes([0x10, len(body)]) + body
socks = []
for i in range(n):
    s = socket.create_connection(("127.0.0.1", port), 5)
    s.sendall(connect_packet(f"idle-{i}"))
    socks.append(s)
for s in socks:
    ack = s.recv(4)
    assert ack[:1] == b"\x20" and ack[3:4] == b"\x00", ack
with open(f"/proc/{pid}/status") as f:
    rss = next(l for l in f if l.startswith("VmRSS:")).split()[1]
print(rss)
for s in socks:
    s.close()
PY
}

median() { sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

echo "load: $PUBS publishers x $MSGS QoS 1 messages of $SIZE bytes -> 1 subscriber on mam/#; idle: $IDLE clients"
echo "machine: $(nproc) cores, $(uname -sr); mosquitto $("$MOSQUITTO" -h 2>/dev/null | sed -n 's/.*version \([0-9.]*\).*/\1/p' | head -1)"
: >"$WORK/mam.tp"; : >"$WORK/mosq.tp"; : >"$WORK/mam.rss"; : >"$WORK/mosq.rss"
for run in $(seq "$RUNS"); do
    start_mam
    mt=$(throughput); stop_broker
    start_mam
    mr=$(idle_rss); stop_broker
    start_mosquitto
    qt=$(throughput); stop_broker
    start_mosquitto
    qr=$(idle_rss); stop_broker
    echo "run $run: mam $mt msg/s, mosquitto $qt msg/s; idle RSS mam ${mr} kB, mosquitto ${qr} kB"
    echo "$mt" >>"$WORK/mam.tp"; echo "$qt" >>"$WORK/mosq.tp"
    echo "$mr" >>"$WORK/mam.rss"; echo "$qr" >>"$WORK/mosq.rss"
done
mt=$(median <"$WORK/mam.tp"); qt=$(median <"$WORK/mosq.tp")
mr=$(median <"$WORK/mam.rss"); qr=$(median <"$WORK/mosq.rss")
ratio=$(python3 -c "print(round($mt / $qt, 2))")
echo "median: mam $mt msg/s, mosquitto $qt msg/s, ratio $ratio (target >= 0.7)"
echo "median idle RSS ($IDLE clients): mam $mr kB, mosquitto $qr kB (target mam < 32768 kB)"
