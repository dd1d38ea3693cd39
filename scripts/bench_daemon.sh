#!/usr/bin/env bash
# Daemon and `mam jobs` benchmarks (docs/PERFORMANCE.md):
#  1. RSS of `mam daemon run` while it mirrors JOBS jobs: JOBS records (cloned from one registered
#     record, each with its own ids and tokens), the embedded broker from `mam broker --port 0`, a
#     signed `started` then `completed` event per job published with `mam pub -q 1` (payloads signed
#     here with Python's json.dumps + hmac, the CORE 6.2 oracle, standing in for `mam publish`).
#     VmRSS is read from /proc after all jobs are running, after all are completed, and VmHWM at the end.
#  2. `mam jobs` over a registry of TABLE records: whole-process wall time, median of RUNS, measured
#     alternately with /bin/true in the same run.
#
# Usage: scripts/bench_daemon.sh [JOBS (default 1000)] [TABLE (default 10000)] [RUNS (default 11)]
# Env: MAM_BIN (default: target/release/mam, built if missing), BENCH_DIR (default /var/tmp),
#      BENCH_KEEP=1 keeps the generated files (the processes are always stopped).
set -euo pipefail
jobs_n=${1:-1000}
table_n=${2:-10000}
runs=${3:-11}
here=$(cd "${BASH_SOURCE[0]%/*}/.." && pwd)
if [ -z "${MAM_BIN:-}" ]; then
  (cd "$here" && cargo build --release --quiet)
  MAM_BIN=$here/target/release/mam
fi
export MAM_ENV_FILE=/nonexistent/mam.env
unset MAM_JOBS_DIR DELEGATE_JOB_LOGS_DIR WORKSPACE_ROOT MAM_ENGINE_CAS
for v in $(compgen -e | grep '^MQTT_' || true); do unset "$v"; done

dir=$(mktemp -d "${BENCH_DIR:-/var/tmp}/mam-bench-daemon.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "${BENCH_KEEP:-}" ]; then echo "kept $dir"; else rm -rf "$dir"; fi
}
trap cleanup EXIT

now_us() { local t=${EPOCHREALTIME/./}; echo "$t"; }
median() { sort -n | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "%.0f", m}'; }
wait_for() { # wait_for SECONDS DESCRIPTION CMD...
  local limit=$1 what=$2; shift 2
  local end=$((SECONDS + limit))
  until "$@"; do
    if ((SECONDS >= end)); then echo "ERROR: timed out waiting for $what" >&2; exit 1; fi
    sleep 0.05
  done
}
rss() { awk '/^VmRSS:/{print $2}' "/proc/$1/status"; }
hwm() { awk '/^VmHWM:/{print $2}' "/proc/$1/status"; }

# clone_records REGISTRY N: N records like the registered template `tmpl`, each with fresh ids/tokens.
clone_records() {
  python3 - "$1" "$2" <<'PY'
import json, os, secrets, sys
reg, n = sys.argv[1], int(sys.argv[2])
tmpl = json.load(open(os.path.join(reg, "tmpl.json")))
root = tmpl["topic_prefix"].rsplit("/jobs/", 1)[0]
for i in range(n):
    r = dict(tmpl)
    jid = "b%06d" % i
    r.update(job_id=jid, dispatch_token=secrets.token_hex(16), auth_token=secrets.token_hex(32),
             topic_prefix="%s/jobs/%s" % (root, jid), agent_session="w%d" % (i % 8))
    with open(os.path.join(reg, jid + ".json"), "w") as f:
        json.dump(r, f, indent=2)
        f.write("\n")
PY
}

# signed_events REGISTRY EVENT SEQ: `topic<TAB>payload` lines for every b* record.
signed_events() {
  python3 - "$1" "$2" "$3" <<'PY'
import glob, hashlib, hmac, json, os, sys, time
reg, event, seq = sys.argv[1], sys.argv[2], int(sys.argv[3])
ts = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
for p in sorted(glob.glob(os.path.join(reg, "b*.json"))):
    r = json.load(open(p))
    m = {"v": 1, "kind": "event", "job_id": r["job_id"], "attempt": r["attempt"],
         "dispatch_token": r["dispatch_token"], "agent_session": r["agent_session"], "event": event,
         "seq": seq, "ts": ts, "heartbeat": False, "message": "", "data": {}}
    canon = json.dumps(m, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    m["sig"] = hmac.new(r["auth_token"].encode(), canon.encode(), hashlib.sha256).hexdigest()
    print(r["topic_prefix"] + "/events\t" + json.dumps(m, separators=(",", ":")))
PY
}

# all_status STATUS: every b* record has STATUS (polled every 0.5 s: grep over the registry is not free).
all_status() { sleep 0.5; test "$(grep -l "\"status\": \"$1\"" "$reg"/b*.json 2>/dev/null | wc -l)" -eq "$jobs_n"; }

echo "mam daemon/jobs benchmarks: jobs=$jobs_n table=$table_n runs=$runs cpus=$(nproc) $(uname -sr)"
echo "binary: $MAM_BIN ($(stat -c %s "$MAM_BIN") bytes)"

# 1. Daemon RSS while mirroring.
ws=$dir/ws
reg=$ws/.mam/jobs
mkdir -p "$ws/.mam"
# Anonymous: the benchmark measures the daemon, and its publishers run from other directories.
"$MAM_BIN" broker --port 0 --allow-anonymous >"$dir/broker.out" 2>"$dir/broker.err" &
pids+=($!)
wait_for 10 "the broker" grep -q 'listening on' "$dir/broker.out"
MQTT_PORT=$(sed -n 's/.*listening on .*:\([0-9]*\)$/\1/p' "$dir/broker.out")
export MQTT_PORT MQTT_TOPIC_ROOT=bench
"$MAM_BIN" registry register --registry-dir "$reg" --session w0 --job-id tmpl >/dev/null
clone_records "$reg" "$jobs_n"
rm -f "$reg/tmpl.json"
"$MAM_BIN" daemon run --workspace "$ws" >"$dir/daemon.log" 2>&1 &
dpid=$!
pids+=("$dpid")
wait_for 10 "the daemon to subscribe" grep -q 'subscribed ' "$dir/daemon.log"
rss_idle=$(rss "$dpid")

publish_all() { # publish_all EVENT SEQ
  local t0 t1 topic payload
  signed_events "$reg" "$1" "$2" >"$dir/$1.lines"
  t0=$(now_us)
  while IFS=$'\t' read -r topic payload; do
    "$MAM_BIN" pub -q 1 -t "$topic" -m "$payload"
  done <"$dir/$1.lines"
  t1=$(now_us)
  printf '  published %d %s events in %.1f s\n' "$jobs_n" "$1" "$(awk "BEGIN{print ($t1-$t0)/1e6}")"
}
publish_all started 1
wait_for 60 "all jobs running" all_status running
rss_running=$(rss "$dpid")
publish_all completed 2
wait_for 60 "all jobs completed" all_status completed
rss_done=$(rss "$dpid")
peak=$(hwm "$dpid")
printf '  daemon RSS: idle %d KiB, %d jobs running %d KiB, all completed %d KiB, peak (VmHWM) %d KiB\n' \
  "$rss_idle" "$jobs_n" "$rss_running" "$rss_done" "$peak"
kill "$dpid"
wait "$dpid" || true

# 2. `mam jobs` over a large registry.
treg=$dir/table/jobs
mkdir -p "$treg"
"$MAM_BIN" registry register --registry-dir "$treg" --session w0 --job-id tmpl >/dev/null
clone_records "$treg" "$table_n"
rm -f "$treg/tmpl.json"
a=() b=()
for ((i = 0; i < runs; i++)); do
  t0=$(now_us); "$MAM_BIN" jobs --registry-dir "$treg" >/dev/null; t1=$(now_us); a+=($((t1 - t0)))
  t0=$(now_us); /bin/true; t1=$(now_us); b+=($((t1 - t0)))
done
ma=$(printf '%s\n' "${a[@]}" | median)
mb=$(printf '%s\n' "${b[@]}" | median)
printf '  mam jobs, %d records: median %d us (%.1f us/record)   /bin/true %d us   ratio %.0fx\n' \
  "$table_n" "$ma" "$(awk "BEGIN{print $ma/$table_n}")" "$mb" "$(awk "BEGIN{print $ma/$mb}")"
