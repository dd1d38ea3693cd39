#!/usr/bin/env bash
# Publish benchmarks (docs/PERFORMANCE.md): `mam publish --event progress` as a whole process
# (engine decision + seq in the record, events.log line, signed event + retained state over one
# connection, audit line) against `mosquitto_pub -q 1` publishing one message to the same
# mosquitto, run alternately in one session; medians and their ratio (target <= 1.25). Then the
# heartbeat timer: resident memory (target < 4 MB) and CPU time per beat.
#
# Usage: scripts/bench_publish.sh [RUNS (default 100)] [BEAT_SECONDS (default 20)]
# Env: MAM_BIN (default: target/release/mam, built if missing), BENCH_DIR (default /var/tmp; use
#      /dev/shm to take fsync out of the picture).
set -euo pipefail
runs=${1:-100}
beat_s=${2:-20}
here=$(cd "${BASH_SOURCE[0]%/*}/.." && pwd)
export PATH="$PATH:/usr/sbin:/sbin"
if [ -z "${MAM_BIN:-}" ]; then
  (cd "$here" && cargo build --release --quiet)
  MAM_BIN=$here/target/release/mam
fi
export MAM_ENV_FILE=/nonexistent/mam.env
unset MAM_JOBS_DIR DELEGATE_JOB_LOGS_DIR WORKSPACE_ROOT MAM_ENGINE_CAS MQTT_USERNAME MQTT_PASSWORD MQTT_TLS

now_us() { local t=${EPOCHREALTIME/./}; echo "$t"; }
median() { sort -n | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "%.0f", m}'; }

dir=$(mktemp -d "${BENCH_DIR:-/var/tmp}/mam-bench-pub.XXXXXX")
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
printf 'listener %s 127.0.0.1\nallow_anonymous true\npersistence false\n' "$port" >"$dir/mosq.conf"
[ "$(id -u)" -eq 0 ] && echo "user root" >>"$dir/mosq.conf"
mosquitto -c "$dir/mosq.conf" >/dev/null 2>&1 &
mosq=$!
timer=
cleanup() {
  [ -n "$timer" ] && kill "$timer" 2>/dev/null || true
  kill "$mosq" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.05; done

export MQTT_BROKER=127.0.0.1 MQTT_PORT=$port
reg=$dir/jobs
"$MAM_BIN" registry register --registry-dir "$reg" --session w1 --job-id bench >/dev/null
"$MAM_BIN" publish --registry-dir "$reg" --job-id bench --event started >/dev/null
# A payload the size of a signed progress event, so both sides move the same bytes.
payload=$(head -n1 "$reg/bench/events.log")

echo "== machine: $(nproc) cores, $(awk '/MemTotal/{printf "%.0f GiB", $2/1048576}' /proc/meminfo); registry on $(df -T "$dir" | awk 'NR==2{print $2}') ($dir)"
echo "== mam publish --event progress vs mosquitto_pub -q 1 (mosquitto $(mosquitto -h 2>/dev/null | awk 'NR==1{print $3}'), $runs runs each, alternating)"
a=() b=()
for ((i = 0; i < runs; i++)); do
  t0=$(now_us); "$MAM_BIN" publish --registry-dir "$reg" --job-id bench --event progress >/dev/null; t1=$(now_us)
  a+=($((t1 - t0)))
  t0=$(now_us); mosquitto_pub -h 127.0.0.1 -p "$port" -q 1 -t mam/jobs/bench/events -m "$payload"; t1=$(now_us)
  b+=($((t1 - t0)))
done
ma=$(printf '%s\n' "${a[@]}" | median)
mb=$(printf '%s\n' "${b[@]}" | median)
printf '  mam publish      median %6d us\n  mosquitto_pub    median %6d us\n  ratio            %.2fx (target <= 1.25)\n' \
  "$ma" "$mb" "$(awk "BEGIN{print $ma/$mb}")"

echo "== heartbeat timer (interval 1 s, persistent connection), ${beat_s}s"
"$MAM_BIN" heartbeat start --registry-dir "$reg" --job-id bench --interval 1 --watch-pid 0 >"$dir/pid"
timer=$(cat "$dir/pid")
sleep 2.5
beats0=$(grep -c '"heartbeat":true' "$reg/bench/events.log" || true)
read -r u0 s0 < <(awk '{print $14, $15}' "/proc/$timer/stat")
sleep "$beat_s"
beats1=$(grep -c '"heartbeat":true' "$reg/bench/events.log" || true)
read -r u1 s1 < <(awk '{print $14, $15}' "/proc/$timer/stat")
rss=$(awk '/VmRSS/{print $2}' "/proc/$timer/status")
hwm=$(awk '/VmHWM/{print $2}' "/proc/$timer/status")
tck=$(getconf CLK_TCK)
n=$((beats1 - beats0))
printf '  RSS %d KiB (peak %d KiB; target < 4096 KiB)\n' "$rss" "$hwm"
printf '  %d beats, CPU %.2f ms per beat (user+system, %d ticks/s)\n' "$n" \
  "$(awk "BEGIN{print (($u1+$s1)-($u0+$s0))*1000/$tck/($n>0?$n:1)}")" "$tck"
"$MAM_BIN" heartbeat stop --registry-dir "$reg" --job-id bench >/dev/null
timer=
