#!/usr/bin/env bash
# The idle CPU of `mam ui` (issue 22): a temp control root with the embedded broker, JOBS running jobs
# (one registered and claimed through mam, the rest its record under new ids, each with an events.log)
# and SESSIONS fake agents on a private tmux server; `mam ui` in an 80x24 pane of another private tmux
# server; utime + stime of the mam ui process (and of its waited-for children: the pane listings) from
# /proc/<pid>/stat over SECONDS. Prints one line; leaves nothing behind.
#
# Usage: scripts/bench_ui.sh [JOBS [SECONDS [SESSIONS]]]    (defaults 200 60 0)
# Env: MAM_BIN (else target/release/mam, built when missing).
set -u -o pipefail
JOBS=${1:-200} SECONDS_=${2:-60} SESSIONS=${3:-0}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mam=${MAM_BIN:-${CARGO_TARGET_DIR:-$here/target}/release/mam}
[ -x "$mam" ] || (cd "$here" && cargo build --release --quiet) || exit 1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mam-bench-ui.XXXXXX")
ws=$tmp/ws ui=mam-bench-ui-$$ agents=mam-bench-agents-$$ broker=''
mkdir -p "$ws/.mam" "$tmp/bin" "$tmp/home"
cleanup() {
    tmux -L "$ui" kill-server 2>/dev/null
    tmux -L "$agents" kill-server 2>/dev/null
    [ -n "$broker" ] && kill "$broker" 2>/dev/null && wait "$broker" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
export HOME=$tmp/home MAM_ENV_FILE=$tmp/absent.env MAM_NO_SUBSCRIBER_DAEMON=1 PATH=$tmp/bin:$PATH
export MAM_PANE_BACKEND=tmux MAM_TMUX_SOCKET=$agents MAM_TMUX_STABLE_MS=200
unset WORKSPACE_ROOT MAM_JOBS_DIR TMUX
cd "$ws" || exit 1
"$mam" broker --port 0 >"$tmp/broker.out" 2>&1 &
broker=$!
for _ in $(seq 100); do grep -q 'listening on' "$tmp/broker.out" && break; sleep 0.05; done
export MQTT_PORT=$(sed -n 's/^mam broker listening on .*:\([0-9][0-9]*\)$/\1/p' "$tmp/broker.out")
ln -s "$mam" "$tmp/bin/claude"
for i in $(seq "$SESSIONS"); do
    "$mam" create claude --no-onboard --name "w$i" -- test-double agent >/dev/null 2>&1 || { echo "create w$i failed"; exit 1; }
done
id=$("$mam" registry register --session worker --heartbeat-sec 30)
reg=$ws/.mam/jobs
python3 - "$reg" "$id" "$JOBS" <<'EOF'
import json, os, sys, datetime
reg, id, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
r = json.load(open(f"{reg}/{id}.json"))
now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")
r.update(status="running", claimed_at=now, updated_at=now)
for i in range(n):
    j = f"b{i:07}"
    r["job_id"] = j
    json.dump(r, open(f"{reg}/{j}.json", "w"))
    os.makedirs(f"{reg}/{j}", exist_ok=True)
    open(f"{reg}/{j}/events.log", "w").write('{"ts":"%s"}\n' % now)
os.remove(f"{reg}/{id}.json")
EOF
tmux -L "$ui" new-session -d -x 80 -y 24 "cd '$ws' && exec '$mam' ui"
for _ in $(seq 100); do tmux -L "$ui" capture-pane -p | grep -q "$JOBS jobs" && break; sleep 0.1; done
pid=$(tmux -L "$ui" display -p '#{pane_pid}')
sleep 2 # the first listing and the broker connect are start-up, not idle
read -r a b c d < <(awk '{print $14, $15, $16, $17}' "/proc/$pid/stat")
sleep "$SECONDS_"
read -r e f g h < <(awk '{print $14, $15, $16, $17}' "/proc/$pid/stat")
hz=$(getconf CLK_TCK)
own=$((e + f - a - b)) kids=$((g + h - c - d))
printf 'mam ui idle, %s jobs, %s sessions, %s s: %s ticks = %s%% of a core; pane listings (children) %s%%\n' \
    "$JOBS" "$SESSIONS" "$SECONDS_" "$own" "$(echo "scale=3; $own * 100 / $hz / $SECONDS_" | bc)" \
    "$(echo "scale=3; $kids * 100 / $hz / $SECONDS_" | bc)"
tmux -L "$ui" capture-pane -p | head -1
