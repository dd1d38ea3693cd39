#!/usr/bin/env bash
# Registry benchmarks (docs/PERFORMANCE.md): whole-process latency of `mam registry status ID --set
# running` and of a metadata update, each against /bin/true measured alternately in the same run,
# engine throughput with 4 concurrent writer processes, and the cost of fsync (disk vs tmpfs).
#
# Usage: scripts/bench_registry.sh [RUNS (default 50)] [WRITES_PER_PROC (default 200)]
# Env: MAM_BIN (default: target/release/mam, built if missing), BENCH_DISK_DIR (default /var/tmp),
#      BENCH_TMPFS_DIR (default /dev/shm).
set -euo pipefail
runs=${1:-50}
per_proc=${2:-200}
here=$(cd "${BASH_SOURCE[0]%/*}/.." && pwd)
if [ -z "${MAM_BIN:-}" ]; then
  (cd "$here" && cargo build --release --quiet)
  MAM_BIN=$here/target/release/mam
fi
export MAM_ENV_FILE=/nonexistent/mam.env
unset MAM_JOBS_DIR DELEGATE_JOB_LOGS_DIR WORKSPACE_ROOT MAM_ENGINE_CAS

now_us() { local t=${EPOCHREALTIME/./}; echo "$t"; }

median() { sort -n | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "%.0f", m}'; }

# time_pair LABEL CMD... : runs CMD and /bin/true alternately $runs times; prints medians in µs.
time_pair() {
  local label=$1; shift
  local a=() b=() t0 t1 i
  for ((i = 0; i < runs; i++)); do
    t0=$(now_us); "$@" >/dev/null; t1=$(now_us); a+=($((t1 - t0)))
    t0=$(now_us); /bin/true; t1=$(now_us); b+=($((t1 - t0)))
  done
  local ma mb
  ma=$(printf '%s\n' "${a[@]}" | median)
  mb=$(printf '%s\n' "${b[@]}" | median)
  printf '  %-28s median %6d us   /bin/true %5d us   ratio %5.1fx\n' "$label" "$ma" "$mb" "$(awk "BEGIN{print $ma/$mb}")"
}

bench_in() {
  local base=$1 name=$2
  local dir
  dir=$(mktemp -d "$base/mam-bench.XXXXXX")
  local reg=$dir/jobs
  echo "== $name ($dir, $(df -T "$dir" | awk 'NR==2{print $2}'))"
  "$MAM_BIN" registry register --registry-dir "$reg" --session w1 --job-id b1 >/dev/null
  "$MAM_BIN" registry status b1 --set running --registry-dir "$reg" >/dev/null
  time_pair "status --set running (idem)" "$MAM_BIN" registry status b1 --set running --registry-dir "$reg"
  time_pair "set-meta (applied write)" "$MAM_BIN" registry set-meta b1 k:=1 --registry-dir "$reg"
  time_pair "status (read only)" "$MAM_BIN" registry status b1 --registry-dir "$reg"

  # Throughput: 4 processes x $per_proc metadata writes on one shared job, then on 4 own jobs.
  for mode in shared own; do
    local t0 t1 p pids=()
    for p in 0 1 2 3; do "$MAM_BIN" registry register --registry-dir "$reg" --session w1 --job-id "o$p" >/dev/null 2>&1 || true; done
    t0=$(now_us)
    for p in 0 1 2 3; do
      (
        job=b1; [ "$mode" = own ] && job=o$p
        for ((i = 0; i < per_proc; i++)); do "$MAM_BIN" registry set-meta "$job" "p$p:=$i" --registry-dir "$reg" >/dev/null; done
      ) &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
    t1=$(now_us)
    printf '  throughput, 4 procs, %-6s %6.0f transitions/s (%d in %.2f s)\n' "$mode:" \
      "$(awk "BEGIN{print 4*$per_proc/(($t1-$t0)/1e6)}")" $((4 * per_proc)) "$(awk "BEGIN{print ($t1-$t0)/1e6}")"
  done
  rm -rf "$dir"
}

echo "mam registry benchmarks: runs=$runs writes/proc=$per_proc cpus=$(nproc) $(uname -sr)"
bench_in "${BENCH_DISK_DIR:-/var/tmp}" disk
if [ -d "${BENCH_TMPFS_DIR:-/dev/shm}" ]; then
  bench_in "${BENCH_TMPFS_DIR:-/dev/shm}" "tmpfs (fsync is free)"
fi
