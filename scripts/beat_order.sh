#!/usr/bin/env bash
# Regenerates assets/beat.order (issue 20): the functions the heartbeat timer runs in its steady
# state, which build.rs lays out together in release builds. Builds the static and the dynamic
# release binary unstripped (in their own target directory), runs each one's timer under
# callgrind (valgrind), zeroes the counts after its start-up and keeps those of the next beats,
# and hands the dumps and the static link's map to scripts/beat_order.py.
# Needs valgrind, mosquitto and python3. Usage: scripts/beat_order.sh [target-dir]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tdir=${1:-$root/target/beat-order}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$root"
# Without the current list, so nothing already ordered is missed or kept for its own sake.
MAM_NO_BEAT_ORDER=1 MAM_LINK_MAP=$work/static.map CARGO_TARGET_DIR=$tdir \
    cargo build-static --config profile.release.strip=false
MAM_NO_BEAT_ORDER=1 CARGO_TARGET_DIR=$tdir cargo build --release --bin mam --config profile.release.strip=false

profile() { # binary dump-prefix
    local mam=$1 out=$2 dir port bpid vpid tok ticks
    dir=$(mktemp -d -p "$work")
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    printf 'listener %s 127.0.0.1\nallow_anonymous true\npersistence false\n' "$port" >"$dir/m.conf"
    mosquitto -c "$dir/m.conf" >/dev/null 2>&1 &
    bpid=$!
    for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/"$port") 2>/dev/null && break; sleep 0.1; done
    export MQTT_BROKER=127.0.0.1 MQTT_PORT=$port MAM_JOBS_DIR=$dir/jobs DELEGATE_JOB_LOGS_DIR=$dir/logs
    "$mam" registry register --session bench --job-id bench >/dev/null
    "$mam" publish --job-id bench --event started >/dev/null
    tok=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['dispatch_token'])" "$dir/jobs/bench.json")
    # What `heartbeat start` does, with valgrind in between: L2 held until the pidfile names it.
    exec 9>"$dir/jobs/bench.heartbeat.lock"
    flock 9
    valgrind --tool=callgrind --demangle=no --callgrind-out-file="$out.%p" "$mam" heartbeat run \
        --job-id bench --attempt 1 --dispatch-token "$tok" --interval 1 --watch-pid 0 --lifetime 600 \
        --registry-dir "$dir/jobs" >"$dir/hb.log" 2>&1 &
    vpid=$!
    sleep 0.5
    ticks=$(awk '{print $22}' "/proc/$vpid/stat")
    printf '{"pid":%s,"job_id":"bench","attempt":1,"dispatch_token":"%s","start_ticks":%s,"started_at":"-"}' \
        "$vpid" "$tok" "$ticks" >"$dir/jobs/bench.heartbeat.pid"
    flock -u 9
    exec 9>&-
    sleep 6
    callgrind_control -z "$vpid" >/dev/null
    sleep 10
    callgrind_control -d "$vpid" >/dev/null
    kill "$vpid"
    wait "$vpid" || true
    kill "$bpid"
    wait "$bpid" 2>/dev/null || true
}
profile "$tdir/x86_64-unknown-linux-gnu/release/mam" "$work/static"
profile "$tdir/release/mam" "$work/dynamic"
python3 scripts/beat_order.py assets/beat.order "$work/static.map" "$work"/static.*.1 "$work"/dynamic.*.1
