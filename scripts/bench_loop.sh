#!/usr/bin/env bash
# The review loop's own cost per round (issue 13, docs/PERFORMANCE.md) against the git commands that
# are its floor, on a throwaway repository of DIRS x FILES small committed text files with a small
# dirty change (EDITS files edited, one untracked file added). Both run REPS times, alternately (the
# order swapped every repetition), in the same run; the medians and their ratio are printed, then a
# table row for docs/PERFORMANCE.md.
#   floor: the shell sequence below (git only, one fork per command).
#   loop:  `mam bench loop-round --reps 1` (the loop's library code for one pinned round: pin,
#          guard, review tree, diff-collect child, prompt, evidence check, re-measure, tree removal,
#          checkpoint writes), timed inside the process; the target (<= 1.5x) applies to this one.
#   whole: (BENCH_WHOLE=1, the default) a whole `mam loop --review-only --base` process with one
#          instant fake reviewer on the fake pane backend and the embedded broker: the loop's cost
#          plus delegate-job, the broker, the agent's start and the poll intervals.
#
# Usage: scripts/bench_loop.sh [REPS (default 15)]
# Env: MAM_BIN (default: a release build, built with cargo), BENCH_DIR (where the repository, the
#      temporary indexes and the review trees live; default /tmp, e.g. /dev/shm for tmpfs),
#      DIRS (50), FILES (100), EDITS (3), BENCH_WHOLE (1; 0 skips the whole-loop line),
#      BENCH_VERBOSE (0; 1 prints every repetition: the floor, then the loop round's steps),
#      BENCH_PAUSE_S (0): seconds of idle before every timed run, so that one run's 5,000 deletions
#      do not slow the next run's checkout (seen on ext4 mounted with `discard`).
set -euo pipefail
reps=${1:-15}
dirs=${DIRS:-50} files=${FILES:-100} edits=${EDITS:-3}
here=$(cd "${BASH_SOURCE[0]%/*}/.." && pwd)
if [ -z "${MAM_BIN:-}" ]; then
  (cd "$here" && cargo build --release --quiet)
  MAM_BIN=${CARGO_TARGET_DIR:-$here/target}/release/mam
fi
mam=$MAM_BIN
[ -x "$mam" ] || { echo "ERROR: bench_loop: no mam binary at $mam" >&2; exit 1; }
command -v python3 >/dev/null || { echo "ERROR: bench_loop: python3 is required" >&2; exit 1; }

tmp=$(mktemp -d "${BENCH_DIR:-/tmp}/mam-bench-loop.XXXXXX")
repo=$tmp/repo
broker_pid=''
cleanup() {
  local rc=$?
  trap - EXIT
  for f in "$tmp"/panes/panes/*/pid; do
    [ -e "$f" ] && kill -KILL -- "-$(cat "$f")" 2>/dev/null
  done
  for f in "$repo"/.mam/jobs/*.heartbeat.pid; do
    [ -e "$f" ] && "$mam" heartbeat stop --job-id "$(basename "$f" .heartbeat.pid)" >/dev/null 2>&1
  done
  [ -n "$broker_pid" ] && kill -TERM "$broker_pid" 2>/dev/null && wait "$broker_pid" 2>/dev/null
  git -C "$repo" worktree prune 2>/dev/null
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT

mkdir -p "$repo" "$tmp/tmp" "$tmp/home" "$tmp/out"
export HOME=$tmp/home TMPDIR=$tmp/tmp WORKSPACE_ROOT=$repo MAM_ENV_FILE=$tmp/absent.env LC_ALL=C
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null
export GIT_AUTHOR_NAME=bench GIT_AUTHOR_EMAIL=bench@localhost GIT_COMMITTER_NAME=bench GIT_COMMITTER_EMAIL=bench@localhost
unset GIT_DIR GIT_WORK_TREE GIT_INDEX_FILE MAM_JOBS_DIR DELEGATE_JOB_LOGS_DIR AGENT_SESSIONS_YAML MAM_LOOP_WORKTREE \
  MQTT_BROKER MQTT_HOST MQTT_TLS MQTT_USERNAME MQTT_PASSWORD MQTT_TOPIC_ROOT MAM_PARENT_JOB_ID TMUX

# --- the repository -----------------------------------------------------------------------------------
git -C "$repo" init -q -b main
python3 - "$repo" "$dirs" "$files" <<'PY'
import os, sys, time
root, dirs, files = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
# Dated two minutes back, so the index written next holds no racily clean entry that every later
# `git status` would have to hash again (as in a repository whose files are not all brand new).
past = time.time() - 120
for d in range(dirs):
    os.mkdir(os.path.join(root, f"d{d:03d}"))
    for f in range(files):
        path = os.path.join(root, f"d{d:03d}", f"f{f:03d}.txt")
        with open(path, "w") as fh:
            fh.write(f"directory {d} file {f}\n" + "".join(f"line {i} of a small text file\n" for i in range(20)))
        os.utime(path, (past, past))
PY
printf '/.mam/\n/.agents/\n*.log\n' >"$repo/.gitignore"
git -C "$repo" add -A
git -C "$repo" commit -q -m base
base=$(git -C "$repo" rev-parse HEAD)
for ((i = 0; i < edits; i++)); do
  echo "an edit" >>"$repo/d$(printf %03d $((i * dirs / edits)))/f050.txt"
done
echo "a new file" >"$repo/d000/untracked.txt"
nfiles=$(git -C "$repo" ls-files | wc -l)
echo "repository: $nfiles tracked files, $(git -C "$repo" status --porcelain | wc -l) changed (${BENCH_DIR:-/tmp})"

# --- the floor: what one round must do at least, with git alone -----------------------------------------
idx=$tmp/floor-index wt=$tmp/tmp/floor-tree
floor_round() {
  cd "$repo"
  GIT_INDEX_FILE=$idx git read-tree HEAD
  GIT_INDEX_FILE=$idx git add -A
  local tree commit
  tree=$(GIT_INDEX_FILE=$idx git write-tree)
  commit=$(git commit-tree "$tree" -p HEAD -m floor)
  git worktree add -q --detach "$wt" "$commit"
  git diff "$base" "$commit" >"$tmp/floor.diff"
  rm -f "$idx"
  GIT_INDEX_FILE=$idx git read-tree HEAD
  GIT_INDEX_FILE=$idx git add -A
  GIT_INDEX_FILE=$idx git write-tree >/dev/null
  git worktree remove --force "$wt"
  rm -f "$idx"
}

# --- the whole loop (optional) ---------------------------------------------------------------------------
whole=${BENCH_WHOLE:-1}
if [ "$whole" = 1 ]; then
  export MAM_PANE_BACKEND=fake MAM_FAKE_PANES_DIR=$tmp/panes MAM_NO_SUBSCRIBER_DAEMON=1
  export MAM_SKS_POLL_MS=50 MAM_SKS_QUIESCE_GAP_MS=50 MAM_WATCH_POLL_MS=100 MAM_HEARTBEAT_SEC=1 \
    MAM_HEARTBEAT_MISSES=5 MAM_ACK_TIMEOUT_S=10
  "$mam" broker --port 0 >"$tmp/out/broker.out" 2>"$tmp/out/broker.err" &
  broker_pid=$!
  for _ in $(seq 100); do grep -qs "listening on" "$tmp/out/broker.out" && break; sleep 0.05; done
  MQTT_PORT=$(sed -n 's/^mam broker listening on .*:\([0-9][0-9]*\)$/\1/p' "$tmp/out/broker.out")
  [ -n "$MQTT_PORT" ] || { echo "ERROR: bench_loop: the broker did not start" >&2; exit 1; }
  export MQTT_PORT
  printf 'work_s=0\n' >"$tmp/creator.script"
  printf 'work_s=0\nidentity=echo\nverdict=PASS\nreport_text=No findings.\n' >"$tmp/reviewer.script"
  for who in creator reviewer; do
    (cd "$repo" && MAM_FAKE_AGENT_SCRIPT=$tmp/$who.script "$mam" create claude --name "$who" --no-onboard \
      -- test-double agent) >"$tmp/out/create-$who.out" 2>&1 ||
      { echo "ERROR: bench_loop: create $who: $(tail -n 2 "$tmp/out/create-$who.out")" >&2; exit 1; }
  done
fi
whole_loop() {
  (cd "$repo" && "$mam" loop --creator creator --reviewer reviewer --review-only --base "$base" --max-rounds 1 \
    --stall-notify 0 --job-timeout 60) >"$tmp/out/loop.out" 2>"$tmp/out/loop.err" ||
    { echo "ERROR: bench_loop: mam loop failed: $(tail -n 2 "$tmp/out/loop.out" "$tmp/out/loop.err")" >&2; exit 1; }
  grep -q 'OUTCOME=promoted' "$tmp/out/loop.out"
}

# --- the runs, alternating --------------------------------------------------------------------------------
ms() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.1f\n", (b - a) * 1000}'; }
for f in floor.ms loop.lines whole.ms; do : >"$tmp/$f"; done
floor_round # one warm-up each: the page cache, git's first object reads
"$mam" bench loop-round --repo "$repo" --base "$base" --reps 1 >/dev/null
[ "$whole" = 1 ] && whole_loop
pause=${BENCH_PAUSE_S:-0}
run_floor() { sleep "$pause"; t0=$EPOCHREALTIME; floor_round; t1=$EPOCHREALTIME; ms "$t0" "$t1" >>"$tmp/floor.ms"; }
run_loop() { sleep "$pause"; "$mam" bench loop-round --repo "$repo" --base "$base" --reps 1 | grep '^rep=' >>"$tmp/loop.lines"; }
for ((i = 1; i <= reps; i++)); do
  # The order is swapped every repetition: a run can slow the one right after it (the page cache's
  # writeback, the disk's discards), and that must not always fall on the same side.
  if ((i % 2)); then run_floor; run_loop; else run_loop; run_floor; fi
  if [ "$whole" = 1 ]; then sleep "$pause"; t0=$EPOCHREALTIME; whole_loop; t1=$EPOCHREALTIME; ms "$t0" "$t1" >>"$tmp/whole.ms"; fi
done
[ "$(git -C "$repo" worktree list | wc -l)" = 1 ] || { echo "ERROR: bench_loop: a worktree was left" >&2; exit 1; }

where="$(df --output=fstype "$tmp" | tail -n 1) ${BENCH_DIR:-/tmp}"
python3 - "$tmp" "$reps" "$nfiles" "$(date -u +%Y-%m-%d)" "$(nproc)" "${BENCH_VERBOSE:-0}" "$where" <<'PY'
import statistics as st, sys
tmp, reps, nfiles, day, cores, verbose, where = sys.argv[1:]
floor = [float(x) for x in open(f"{tmp}/floor.ms").read().split()]
steps = {}
for line in open(f"{tmp}/loop.lines"):
    for kv in line.split()[1:]:
        k, v = kv.split("=")
        steps.setdefault(k, []).append(float(v))
whole = [float(x) for x in open(f"{tmp}/whole.ms").read().split()]
mf, ml = st.median(floor), st.median(steps["total_ms"])
print(f"floor (git only)      median {mf:8.1f} ms   (min {min(floor):.1f}, max {max(floor):.1f}, {len(floor)} runs)")
print(f"loop round (mam)      median {ml:8.1f} ms   (min {min(steps['total_ms']):.1f}, max {max(steps['total_ms']):.1f})"
      f"   ratio {ml / mf:.2f}x (target <= 1.5x)")
if verbose == "1":
    for i, f in enumerate(floor):
        print(f"rep {i + 1:2d}: floor {f:7.1f} ms | loop " + " ".join(f"{k}={v[i]:.1f}" for k, v in steps.items()))
pairs = sorted(l / f for l, f in zip(steps["total_ms"], floor))
print(f"  paired: median of the {len(pairs)} per-repetition ratios {st.median(pairs):.2f}x"
      f" (each loop round against the floor run next to it)")
print("  steps (medians, ms): " + " ".join(f"{k}={st.median(v):.1f}" for k, v in steps.items() if k != "total_ms"))
row = f"| {where}, {day}, {nfiles} files | {mf:,.0f} ms | {ml:,.0f} ms | {ml / mf:.2f}x | {st.median(pairs):.2f}x |"
if whole:
    mw = st.median(whole)
    print(f"whole mam loop        median {mw:8.1f} ms   ratio {mw / mf:.2f}x (delegate-job, broker, agent start included)")
    row += f" {mw:,.0f} ms ({mw / mf:.2f}x) |"
else:
    row += " |"
print(f"docs/PERFORMANCE.md row ({reps} reps, {cores} cores; run | floor | loop round | ratio | paired | whole loop):")
print(row)
PY
