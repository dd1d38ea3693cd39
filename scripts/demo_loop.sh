#!/usr/bin/env bash
# The review loop, end to end (ORCH 4): an embedded broker, a throwaway git repository with a small task,
# and fake agents in REAL tmux panes: a creator and two reviewers.
#   run 1: round 1: one reviewer says NOT PASS with a finding; the creator gets the correction job and
#          changes the code; round 2: both PASS; the reports are promoted with identity sidecars.
#   run 2: a reviewer changes the source during round 1: the round is stale and re-reviewed (no
#          correction job); round 2 passes.
# Each step is printed with its time. The script checks its own outcome (every sidecar's tree is the tree
# of its snapshot commit; the pinning left the source's index and refs as they were), cleans up every
# pane, review tree and process, and exits 0 only when all is as expected.
#
# Usage: scripts/demo_loop.sh [--creator-agent KIND] [--reviewer-agent KIND] [--keep]
#   --creator-agent KIND   run the creator as a real installed agent of KIND (claude, codex ...)
#   --reviewer-agent KIND  run the first reviewer as a real installed agent of KIND
#                          (a real agent needs its model: offline it fails its job, and the loop says so)
#   --keep                 keep the temp directory (its path is printed)
# Env: MAM_BIN (use this mam binary; else, as scripts/demo.sh, a release build or an installed `mam` of this
# version newer than the sources, else the script builds a release binary with cargo), TMPDIR.
set -u -o pipefail

N=1 K=5 T=20
KEEP=0 CREATOR_AGENT='' REVIEWER_AGENT=''
while [ $# -gt 0 ]; do
    case "$1" in
    --creator-agent) CREATOR_AGENT=${2:?--creator-agent needs a kind}; shift 2 ;;
    --reviewer-agent) REVIEWER_AGENT=${2:?--reviewer-agent needs a kind}; shift 2 ;;
    --keep) KEEP=1; shift ;;
    -h | --help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "ERROR: demo_loop: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
t0=$(date +%s.%N)
say() { printf '[%5.1fs] %s\n' "$(echo "$(date +%s.%N) - $t0" | bc)" "$*"; }
die() { say "FAIL: $*"; exit 1; }

command -v bc >/dev/null || { echo "ERROR: demo_loop: bc is required" >&2; exit 1; }
command -v git >/dev/null || { echo "ERROR: demo_loop: git is required" >&2; exit 1; }
if ! command -v tmux >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "installing tmux (apt-get)..."
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux; } >/dev/null ||
            { echo "ERROR: demo_loop: cannot install tmux" >&2; exit 1; }
    else
        echo "ERROR: demo_loop: tmux is required (install it, or run as root with apt-get)" >&2; exit 1
    fi
fi
# The binary, as scripts/demo.sh picks it (scripts/demo_bin.sh).
. "$here/scripts/demo_bin.sh"
pick_mam demo_loop

# --- a private world --------------------------------------------------------------------------------
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mam-loop-demo.XXXXXX")
ws=$tmp/ws
mkdir -p "$ws" "$tmp/bin" "$tmp/home" "$tmp/out" "$tmp/tmp"
sock=mam-loop-demo-$$-$RANDOM
broker_pid='' loop_pid=''

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    [ -n "$loop_pid" ] && kill -TERM "$loop_pid" 2>/dev/null && wait "$loop_pid" 2>/dev/null
    tmux -L "$sock" kill-server 2>/dev/null
    rm -f "${TMUX_TMPDIR:-/tmp}/tmux-$(id -u)/$sock"
    for f in "$ws"/.mam/jobs/*.heartbeat.pid; do
        [ -e "$f" ] || continue
        "$mam" heartbeat stop --job-id "$(basename "$f" .heartbeat.pid)" --registry-dir "$ws/.mam/jobs" >/dev/null 2>&1
    done
    [ -n "$broker_pid" ] && kill -TERM "$broker_pid" 2>/dev/null && wait "$broker_pid" 2>/dev/null
    if [ "$KEEP" = 1 ]; then echo "kept $tmp"; else rm -rf "$tmp"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

export HOME=$tmp/home WORKSPACE_ROOT=$ws MAM_ENV_FILE=$tmp/absent.env MAM_BIN=$mam TMPDIR=$tmp/tmp
export MAM_NO_SUBSCRIBER_DAEMON=1 MAM_PANE_BACKEND=tmux MAM_TMUX_SOCKET=$sock
export MAM_TMUX_STABLE_MS=300 MAM_SKS_QUIESCE_GAP_MS=300 SKS_DELIVERY_GRACE_S=1
export GIT_AUTHOR_NAME=demo GIT_AUTHOR_EMAIL=demo@localhost GIT_COMMITTER_NAME=demo GIT_COMMITTER_EMAIL=demo@localhost
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null
export PATH=$tmp/bin:$PATH
unset AGENT_SESSIONS_YAML MAM_JOBS_DIR DELEGATE_JOB_LOGS_DIR MQTT_BROKER MQTT_HOST MQTT_TLS MQTT_USERNAME \
    MQTT_PASSWORD MQTT_CA_FILE MQTT_TOPIC_ROOT TMUX MAM_LOOP_WORKTREE MAM_PARENT_JOB_ID

# --- the repository: a small task -------------------------------------------------------------------
git -C "$ws" init -q -b main
printf '#!/bin/sh\necho hello\n' >"$ws/greet.sh"
printf '/.mam/\n/.agents/\n' >"$ws/.gitignore"
git -C "$ws" add -A && git -C "$ws" commit -q -m "greet: the first version"
base=$(git -C "$ws" rev-parse HEAD)
mkdir -p "$ws/.mam"
printf 'Make greet.sh greet the user by name: `greet.sh NAME` prints `hello NAME`.\n' >"$tmp/task.md"
say "repository $ws at $(git -C "$ws" rev-parse --short HEAD) (the base); task: $(cat "$tmp/task.md")"

# --- the broker ---------------------------------------------------------------------------------------
start_broker
say "embedded broker on 127.0.0.1:$port; tmux server $sock"

# --- the agents: the fake agent as `claude`, its script the first argument ---------------------------
cat >"$tmp/bin/claude" <<EOF
#!/usr/bin/env bash
export MAM_FAKE_AGENT_SCRIPT="\$1"
shift
exec -a claude '$mam' test-double agent "\$@"
EOF
chmod +x "$tmp/bin/claude"
# The creator edits greet.sh on every job; its correction report answers the finding.
cat >"$tmp/creator.script" <<EOF
work_s=1
edit=$ws/greet.sh
report_text=Implemented: greet.sh now takes NAME. Tested by running it.
report_text@2=Fixed the quoting of NAME.\nFIXED rev-a:1
EOF
# Reviewer a: NOT PASS with one finding in its first review, PASS after.
cat >"$tmp/rev-a.script" <<EOF
work_s=1
identity=echo
verdict@1=NOT PASS
report_text@1=Findings:\n1. greet.sh: NAME is not quoted, so a name with spaces is split.
verdict=PASS
report_text=No findings: NAME is quoted now.
EOF
printf 'work_s=1\nidentity=echo\nverdict=PASS\nreport_text=No findings.\n' >"$tmp/rev-b.script"
# Run 2: reviewer c changes the source during its first review.
cat >"$tmp/rev-c.script" <<EOF
work_s=1
identity=echo
verdict=PASS
report_text=No findings.
touch_during_review@1=$ws/greet.sh
EOF

create() { # name kind [args...]
    local name=$1 kind=$2
    shift 2
    (cd "$ws" && "$mam" create "$kind" --name "$name" --no-onboard -- "$@") >"$tmp/out/create-$name.out" 2>&1 ||
        die "create $name: $(tail -n 3 "$tmp/out/create-$name.out")"
    say "session $name ($kind) in tmux pane $(sed -n 's/.*PANE=\([^ ]*\).*/\1/p' "$tmp/out/create-$name.out")"
}
if [ -n "$CREATOR_AGENT" ]; then
    command -v "$CREATOR_AGENT" >/dev/null || die "--creator-agent $CREATOR_AGENT: not installed"
    create creator "$CREATOR_AGENT"
else
    create creator claude "$tmp/creator.script"
fi
if [ -n "$REVIEWER_AGENT" ]; then
    command -v "$REVIEWER_AGENT" >/dev/null || die "--reviewer-agent $REVIEWER_AGENT: not installed"
    create rev-a "$REVIEWER_AGENT"
else
    create rev-a claude "$tmp/rev-a.script"
fi
create rev-b claude "$tmp/rev-b.script"
create creator2 claude "$tmp/creator.script"
create rev-c claude "$tmp/rev-c.script"

fails=0
check() { # description command...
    local what=$1
    shift
    if "$@"; then say "OK   $what"; else say "BAD  $what"; fails=$((fails + 1)); fi
}
refs() { git -C "$ws" for-each-ref --format='%(refname) %(objectname)'; git -C "$ws" rev-parse HEAD; }
knobs=(--heartbeat "$N" --heartbeat-misses "$K" --ack-timeout "$T")

run_loop() { # label creator reviewers...
    local label=$1 creator=$2
    shift 2
    local args=(loop --creator "$creator" --task-file "$tmp/task.md" --base "$base" --max-rounds 3
        --job-timeout 300 --wall-clock 600 --stall-notify 0)
    for r in "$@"; do args+=(--reviewer "$r"); done
    [ $# -gt 0 ] || args+=(--self-review)
    [ $# -gt 0 ] || args+=(--self-review)
    refs >"$tmp/out/$label.refs-before"
    git -C "$ws" diff --cached --stat >"$tmp/out/$label.index-before"
    say "run $label: mam ${args[*]}"
    (cd "$ws" && MAM_HEARTBEAT_SEC=$N MAM_HEARTBEAT_MISSES=$K MAM_ACK_TIMEOUT_S=$T exec "$mam" "${args[@]}") \
        >"$tmp/out/$label.out" 2>"$tmp/out/$label.err" &
    loop_pid=$!
    local shown=0
    while kill -0 "$loop_pid" 2>/dev/null; do
        local n
        n=$(wc -l <"$tmp/out/$label.out")
        if [ "$n" -gt "$shown" ]; then sed -n "$((shown + 1)),${n}p" "$tmp/out/$label.out" | sed 's/^/       /'; shown=$n; fi
        sleep 0.2
    done
    wait "$loop_pid"
    local rc=$?
    loop_pid=''
    sed -n "$((shown + 1)),\$p" "$tmp/out/$label.out" | sed 's/^/       /'
    [ "$rc" = 0 ] || sed 's/^/  err: /' "$tmp/out/$label.err"
    echo "$rc" >"$tmp/out/$label.rc"
}

sidecars_match() { # every sidecar's tree is its snapshot commit's tree
    local f ok=1 n=0
    for f in "$ws"/.agents/reports/*/report-*.identity.json; do
        [ -e "$f" ] || continue
        n=$((n + 1))
        local tree commit
        tree=$(sed -n 's/^ *"tree": "\([0-9a-f]*\)".*/\1/p' "$f")
        commit=$(sed -n 's/^ *"snapshot_commit": "\([0-9a-f]*\)".*/\1/p' "$f")
        [ -n "$tree" ] && [ "$(git -C "$ws" rev-parse "$commit^{tree}")" = "$tree" ] || ok=0
    done
    [ "$ok" = 1 ] && [ "$n" -ge 2 ]
}

# --- run 1: NOT PASS, correction, PASS ----------------------------------------------------------------
run_loop one creator rev-a rev-b
out1=$tmp/out/one.out
check "run 1 exits 0 and says OUTCOME=promoted" grep -q 'OUTCOME=promoted RC=0' "$out1"
check "run 1: round 1 rev-a said NOT PASS" grep -q 'round 1 · reviewer rev-a · .*VERDICT: NOT PASS' "$out1"
check "run 1: the creator got a correction job" grep -q 'round 1 · corrector creator' "$out1"
check "run 1: round 2 both PASS" bash -c "grep -q 'round 2 · reviewer rev-a · .*VERDICT: PASS' '$out1' && grep -q 'round 2 · reviewer rev-b · .*VERDICT: PASS' '$out1'"
check "run 1: every identity sidecar's tree is its snapshot commit's tree" sidecars_match
refs >"$tmp/out/one.refs-after"
git -C "$ws" diff --cached --stat >"$tmp/out/one.index-after"
check "run 1: the source's refs and index are as before (pinning wrote none)" \
    bash -c "cmp -s '$tmp/out/one.refs-before' '$tmp/out/one.refs-after' && cmp -s '$tmp/out/one.index-before' '$tmp/out/one.index-after'"
say "promoted:"
find "$ws/.agents/reports" -type f | sort | sed "s|^$ws/|       |"

# --- run 2: the source changes during review -> stale -> re-reviewed -------------------------------------
run_loop two creator2 rev-c rev-b
out2=$tmp/out/two.out
check "run 2 exits 0 and says OUTCOME=promoted" grep -q 'OUTCOME=promoted RC=0' "$out2"
check "run 2: round 1 is stale" grep -q 'round 1: STALE' "$out2"
check "run 2: no correction job after the stale round" bash -c "! grep -q 'corrector creator2' '$out2'"
check "run 2: round 2 re-reviewed and passed" grep -q 'round 2 · reviewer rev-c · .*VERDICT: PASS' "$out2"
check "run 2: every identity sidecar's tree is its snapshot commit's tree" sidecars_match

# --- nothing left behind ------------------------------------------------------------------------------
check "no review tree left under TMPDIR" bash -c "! ls -d '$tmp/tmp'/mam-review-* 2>/dev/null | grep -q ."
check "git lists no leftover worktree" bash -c "[ \$(git -C '$ws' worktree list | wc -l) = 1 ]"
say "mam loop status (the last loop):"
(cd "$ws" && "$mam" loop status) | sed 's/^/       /'
if [ "$fails" -ne 0 ]; then
    say "FAIL: $fails check(s) not as expected"
    exit 1
fi
say "PASS: both loops ended as expected"
