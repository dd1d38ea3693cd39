#!/usr/bin/env bash
# The heartbeat timer's memory (issue 20): one registered, started job on a private mosquitto (or
# `mam broker` when mosquitto is missing), `mam heartbeat start --interval 1 --watch-pid 0`, then
# VmRSS and smaps_rollup's Rss/Anonymous after each of the beat counts given (default 5 30).
# Usage: MAM_BIN=path/to/mam scripts/bench_timer.sh [beats...]
set -euo pipefail
MAM=${MAM_BIN:-mam}
beats=("$@")
[ ${#beats[@]} -gt 0 ] || beats=(5 30)
dir=$(mktemp -d)
broker_pid=
timer_pid=
cleanup() {
    [ -n "$timer_pid" ] && "$MAM" heartbeat stop --registry-dir "$dir/jobs" --job-id bench >/dev/null 2>&1 || true
    [ -n "$broker_pid" ] && kill "$broker_pid" 2>/dev/null && wait "$broker_pid" 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
if command -v mosquitto >/dev/null; then
    printf 'listener %s 127.0.0.1\nallow_anonymous true\npersistence false\n' "$port" >"$dir/m.conf"
    mosquitto -c "$dir/m.conf" >/dev/null 2>&1 &
else
    "$MAM" broker --port "$port" >/dev/null 2>&1 &
fi
broker_pid=$!
for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/"$port") 2>/dev/null && break; sleep 0.1; done
export MQTT_BROKER=127.0.0.1 MQTT_PORT=$port MAM_JOBS_DIR=$dir/jobs DELEGATE_JOB_LOGS_DIR=$dir/logs
unset WORKSPACE_ROOT MAM_HEARTBEAT_SEC
"$MAM" registry register --session bench --job-id bench >/dev/null
"$MAM" publish --job-id bench --event started >/dev/null
timer_pid=$("$MAM" heartbeat start --job-id bench --interval 1 --watch-pid 0)
start=$(date +%s.%N)
linkage=$(file -L "$(command -v "$MAM")" | grep -o 'static-pie linked\|statically linked\|dynamically linked' || true)
echo "mam: $MAM ($linkage); load: $(cut -d' ' -f1-3 /proc/loadavg)"
for n in "${beats[@]}"; do
    # Half a period after beat n (due at start + n s).
    python3 -c "import time; t=$start+$n+0.5-time.time(); time.sleep(max(t,0))"
    kb() { awk -v k="$1:" '$1==k {print $2}' "/proc/$timer_pid/$2"; }
    seq=$(grep -c '"heartbeat":true' "$dir/jobs/bench/events.log" || true)
    printf 'after %3s s (%s beats in events.log): VmRSS %s KiB; Rss %s = RssFile %s + RssAnon %s KiB; Private_Clean %s\n' \
        "$n" "$seq" "$(kb VmRSS status)" "$(kb Rss smaps_rollup)" "$(kb RssFile status)" "$(kb RssAnon status)" \
        "$(kb Private_Clean smaps_rollup)"
done
# BENCH_TIMER_MAPS=1: the resident set per mapping at the end, and the text pages present.
if [ -n "${BENCH_TIMER_MAPS:-}" ]; then
    awk '/^[0-9a-f]+-[0-9a-f]+ / {m=$1" "$2" "$6} $1=="Rss:" && $2>0 {print $2" KiB "m}' "/proc/$timer_pid/smaps"
    for s in ${BENCH_TIMER_PAGEMAP:-}; do python3 "$s" "$timer_pid"; done
fi
