#!/usr/bin/env bash
# The main job, end to end (ORCH 3): an embedded broker, fake agents in REAL tmux (or herdr) panes, and three
# delegations judged from evidence on disk and on the wire:
#   1. an agent that works and completes with a report       -> completed (exit 0)
#   2. an agent that crashes mid-work (its process ends)     -> deadline_timeout/agent_gone within N + 2 s (exit 4)
#   3. an agent that never runs the start command            -> agent_blocked after T (exit 3)
# with N=1 s, K=3, T=5 s. Each verdict is printed as it happens, then `mam jobs`.
#
# Unattended (no terminal needed), under a minute, leaves nothing behind (trap EXIT: the private tmux
# server, the broker, the delegate-job processes, the heartbeat timers, the temp directory). Exit 0 only
# when every verdict is the expected one.
#
# Usage: scripts/demo.sh [--backend tmux|herdr] [--agent KIND] [--keep]
#   --backend B   the pane backend: tmux (default) or herdr (a private herdr server with its own HOME)
#   --agent KIND  job 1 goes to a real agent of KIND (claude, codex ...) when it is installed; jobs 2 and
#                 3 always use the fake agent. claude and codex talk to mam's scripted model on loopback
#                 (`mam test-double model`, docs/AGENTS.md): offline, in their default permission and
#                 sandbox modes, they read the brief and run its commands through their own shell tool;
#                 the agent's screen is shown at the end. The CLI is taken from PATH, else from
#                 MAM_AGENTS_BIN, else from scripts/install_agents.sh's cache
#   --keep        keep the temp directory and the agents' panes (their server stays up); prints how to
#                 attach to them and how to clean up afterwards
# Env: MAM_BIN (use this mam binary; else a release build in the target directory that is newer than the
# sources, else an installed `mam` of this version on PATH that is newer than the sources, else the script
# builds a release binary with cargo; a binary older than the sources is passed over), HERDR_BIN (the herdr
# to use with --backend herdr; else herdr on PATH, else ../shared/herdr/herdr beside the repository),
# TMPDIR, MAM_AGENTS_BIN.
set -u -o pipefail

N=1 K=3 T=5
AGENT=fake KEEP=0 BACKEND=tmux
while [ $# -gt 0 ]; do
    case "$1" in
    --backend) BACKEND=${2:?--backend needs tmux or herdr}; shift 2 ;;
    --agent) AGENT=${2:?--agent needs a kind}; shift 2 ;;
    --keep) KEEP=1; shift ;;
    -h | --help) sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "ERROR: demo: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

case "$BACKEND" in tmux | herdr) ;; *) echo "ERROR: demo: --backend $BACKEND: expected tmux or herdr" >&2; exit 2 ;; esac
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
t0=$(date +%s.%N)
say() { printf '[%5.1fs] %s\n' "$(echo "$(date +%s.%N) - $t0" | bc)" "$*"; }
die() { say "FAIL: $*"; exit 1; }

# --- set-up: tools and the binary -------------------------------------------------------------------
command -v bc >/dev/null || { echo "ERROR: demo: bc is required" >&2; exit 1; }
if ! command -v tmux >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "installing tmux (apt-get)..."
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux; } >/dev/null ||
            { echo "ERROR: demo: cannot install tmux" >&2; exit 1; }
    else
        echo "ERROR: demo: tmux is required (install it, or run as root with apt-get)" >&2; exit 1
    fi
fi
herdr=''
if [ "$BACKEND" = herdr ]; then
    herdr=${HERDR_BIN:-$(command -v herdr || true)}
    [ -z "$herdr" ] && [ -x "$here/../shared/herdr/herdr" ] && herdr=$here/../shared/herdr/herdr
    [ -n "$herdr" ] && [ -x "$herdr" ] ||
        { echo "ERROR: demo: --backend herdr needs herdr (set HERDR_BIN or put herdr on PATH)" >&2; exit 1; }
    herdr=$(cd "$(dirname "$herdr")" && pwd)/$(basename "$herdr")
fi
# The binary (scripts/demo_bin.sh): MAM_BIN; else a release build newer than every source; else an
# installed mam of this version newer than every source; else build one (release, once).
. "$here/scripts/demo_bin.sh"
pick_mam demo

# --- a private world --------------------------------------------------------------------------------
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mam-demo.XXXXXX")
ws=$tmp/ws
mkdir -p "$ws/.mam" "$tmp/bin" "$tmp/home" "$tmp/out"
sock=mam-demo-$$-$RANDOM
broker_pid='' pids=()

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
    if [ "$KEEP" = 1 ]; then
        : # --keep: the panes stay; the lines printed at the end say how to reach and remove them
    elif [ "$BACKEND" = herdr ]; then
        timeout 10 "$herdr" --session "$sock" server stop >/dev/null 2>&1
        pkill -KILL -f "herdr --session $sock server" 2>/dev/null
    else
        tmux -L "$sock" kill-server 2>/dev/null
        rm -f "${TMUX_TMPDIR:-/tmp}/tmux-$(id -u)/$sock"
    fi
    # Timers watch their agent and end within N s of its death; stop any that is still there.
    for f in "$ws"/.mam/jobs/*.heartbeat.pid; do
        [ -e "$f" ] || continue
        j=$(basename "$f" .heartbeat.pid)
        "$mam" heartbeat stop --job-id "$j" --registry-dir "$ws/.mam/jobs" >/dev/null 2>&1
    done
    [ -n "$broker_pid" ] && kill -TERM "$broker_pid" 2>/dev/null && wait "$broker_pid" 2>/dev/null
    if [ "$KEEP" = 1 ]; then
        echo "kept $tmp and the agents' panes. Look at one (worker-ok, worker-crash, worker-silent):"
        echo "  WORKSPACE_ROOT=$ws MAM_ENV_FILE=$tmp/absent.env MAM_PANE_BACKEND=$BACKEND MAM_TMUX_SOCKET=$sock MAM_HERDR_SESSION=$sock $mam attach worker-ok"
        if [ "$BACKEND" = herdr ]; then
            echo "clean up: HERDR_SESSION=$sock XDG_CONFIG_HOME=$tmp/c $herdr --session $sock server stop; rm -rf $tmp"
        else
            echo "  (or directly: tmux -L $sock attach)"
            echo "clean up: tmux -L $sock kill-server; rm -rf $tmp"
        fi
    else
        rm -rf "$tmp"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# scripts/install_agents.sh's cache, under the caller's HOME (before HOME becomes the demo's own).
agents_bin=${MAM_AGENTS_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/mam-agents/node_modules/.bin}
# The environment of every mam call (and, through the tmux server, of every pane).
export HOME=$tmp/home WORKSPACE_ROOT=$ws MAM_ENV_FILE=$tmp/absent.env MAM_BIN=$mam
export MAM_NO_SUBSCRIBER_DAEMON=1
if [ "$BACKEND" = herdr ]; then
    # A private herdr: its own config, state and socket under $tmp, a server named after the demo.
    # herdr's sockets live under XDG_CONFIG_HOME, and a socket path holds at most 107 bytes: keep it short.
    export XDG_CONFIG_HOME=$tmp/c XDG_STATE_HOME=$tmp/home/.local/state XDG_CACHE_HOME=$tmp/home/.cache \
        XDG_DATA_HOME=$tmp/home/.local/share XDG_RUNTIME_DIR=$tmp/run HERDR_DISABLE_SOUND=1
    mkdir -p "$XDG_CONFIG_HOME/herdr" "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"
    printf 'onboarding = false\n[terminal]\ndefault_shell = "/bin/bash"\n[update]\nversion_check = false\nmanifest_check = false\n' \
        >"$XDG_CONFIG_HOME/herdr/config.toml"
    longest=$XDG_CONFIG_HOME/herdr/sessions/$sock/herdr-client.sock
    [ "${#longest}" -le 107 ] || die "herdr's socket path would be ${#longest} bytes (over 107): use a shorter TMPDIR"
    ln -s "$herdr" "$tmp/bin/herdr"
    export MAM_PANE_BACKEND=herdr MAM_HERDR_SESSION=$sock
    unset HERDR_SOCKET_PATH HERDR_SESSION
else
    export MAM_PANE_BACKEND=tmux MAM_TMUX_SOCKET=$sock
fi
real_agent='' model=''
if [ "$AGENT" != fake ]; then
    real_agent=$(command -v "$AGENT" || { [ -x "$agents_bin/$AGENT" ] && echo "$agents_bin/$AGENT"; }) ||
        die "--agent $AGENT: not installed (scripts/install_agents.sh installs it)"
    ln -s "$real_agent" "$tmp/bin/$AGENT"
fi
if [ "$AGENT" = claude ] || [ "$AGENT" = codex ]; then
    # The scripted model: the CLI's model calls go to it, on loopback, with a made-up key; the CLI's
    # private HOME holds what a user with network would have (claude's onboarding done, codex's provider).
    "$mam" test-double model --log "$tmp/out/model.log" >"$tmp/out/model.url" 2>"$tmp/out/model.err" &
    pids+=($!)
    for _ in $(seq 100); do grep -q http "$tmp/out/model.url" && break; sleep 0.05; done
    model=$(head -n 1 "$tmp/out/model.url")
    [ -n "$model" ] || die "the scripted model did not start: $(cat "$tmp/out/model.err")"
    export ANTHROPIC_BASE_URL=$model ANTHROPIC_API_KEY=sk-ant-demo-not-a-key OPENAI_API_KEY=sk-demo-not-a-key \
        DISABLE_AUTOUPDATER=1 NPM_CONFIG_PREFIX=$tmp/npm NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost
    printf '{"hasCompletedOnboarding":true,"theme":"dark"}\n' >"$HOME/.claude.json"
    mkdir -p "$HOME/.codex"
    printf 'model_provider = "mam"\nmodel = "mam-scripted-model"\n[model_providers.mam]\nname = "mam"\nbase_url = "%s/v1"\nwire_api = "responses"\nenv_key = "OPENAI_API_KEY"\n' \
        "$model" >"$HOME/.codex/config.toml"
fi
# The fake agents' kind: claude, unless the real agent is a claude (then codex).
fake=claude
[ "$AGENT" = claude ] && fake=codex
export PATH=$tmp/bin:$PATH
export MAM_TMUX_STABLE_MS=300 MAM_SKS_QUIESCE_GAP_MS=300 SKS_DELIVERY_GRACE_S=1
unset AGENT_SESSIONS_YAML MAM_JOBS_DIR DELEGATE_JOB_LOGS_DIR MQTT_BROKER MQTT_HOST MQTT_TLS MQTT_USERNAME \
    MQTT_PASSWORD MQTT_CA_FILE MQTT_TOPIC_ROOT TMUX

# --- the broker --------------------------------------------------------------------------------------
start_broker
say "embedded broker on 127.0.0.1:$port; control root $ws; $BACKEND server $sock"

# --- the agents --------------------------------------------------------------------------------------
# `$fake` on PATH is the fake agent with argv[0] $fake (A18), driven by the script named as its first
# argument (a tmux pane inherits the server's environment, not the creator's, so the script travels in argv).
cat >"$tmp/bin/$fake" <<EOF
#!/usr/bin/env bash
export MAM_FAKE_AGENT_SCRIPT="\$1"
shift
exec -a $fake '$mam' test-double agent "\$@"
EOF
chmod +x "$tmp/bin/$fake"
printf 'work_s=2\nreport_text=All done: the task was read and answered.\n' >"$tmp/ok.script"
printf 'crash_after_s=2\nwork_s=60\n' >"$tmp/crash.script"
printf 'never_start=1\n' >"$tmp/never.script"

create() { # name kind [args...]
    local name=$1 kind=$2
    shift 2
    (cd "$ws" && "$mam" create "$kind" --name "$name" --no-onboard -- "$@") >"$tmp/out/create-$name.out" 2>&1 ||
        die "create $name: $(tail -n 3 "$tmp/out/create-$name.out")"
    local who="a real $kind"
    [ "$kind" = "$fake" ] && who="the fake agent, standing in for $kind"
    say "session $name ($who) in $BACKEND pane $(sed -n 's/.*PANE=\([^ ]*\).*/\1/p' "$tmp/out/create-$name.out")"
}
ok_session=worker-ok
if [ -n "$real_agent" ]; then
    create "$ok_session" "$AGENT"
else
    create "$ok_session" $fake "$tmp/ok.script"
fi
create worker-crash $fake "$tmp/crash.script"
create worker-silent $fake "$tmp/never.script"

# --- the three delegations, in parallel ---------------------------------------------------------------
printf 'Write a two-line report saying hello, then run the success command.\n' >"$tmp/task.md"
# The scripted model does the job this phrase names (docs/AGENTS.md); the fake agents ignore it.
[ -n "$model" ] && printf 'This agent does the job: write a two-line report saying hello, then run the success command.\n' >"$tmp/task.md"
declare -A want_status want_rc launched
delegate() { # label session status rc [knobs...]
    local label=$1 session=$2
    want_status[$label]=$3 want_rc[$label]=$4
    shift 4
    launched[$label]=$(date +%s.%N)
    (cd "$ws" && exec "$mam" delegate-job --session "$session" --brief-file "$tmp/task.md" "$@") \
        >"$tmp/out/$label.out" 2>"$tmp/out/$label.err" &
    pids+=($!)
    echo $! >"$tmp/out/$label.pid"
}
fast=(--heartbeat $N --heartbeat-misses $K --ack-timeout $T --timeout 120)
if [ -n "$model" ]; then
    # The scripted model answers at once: the default N and K, T of 60 s, two minutes in all.
    delegate completes "$ok_session" completed 0 --ack-timeout 60 --timeout 120
elif [ -n "$real_agent" ]; then
    # A real agent reads its brief at its own pace: the default N, K and T, ten minutes in all.
    delegate completes "$ok_session" completed 0 --timeout 600
else
    delegate completes "$ok_session" completed 0 "${fast[@]}"
fi
delegate crashes worker-crash deadline_timeout 4 "${fast[@]}"
delegate never-starts worker-silent agent_blocked 3 "${fast[@]}"
say "delegated 3 jobs (N=${N}s K=$K T=${T}s): completes, crashes, never-starts"

ts_s() { date -d "$1" +%s.%N; } # UTC record timestamp -> epoch seconds
field() { "$mam" registry show "$1" --registry-dir "$ws/.mam/jobs" | sed -n "s/^  \"$2\": \"\{0,1\}\([^\",]*\)\"\{0,1\},\{0,1\}$/\1/p"; }

fails=0 ndone=0
declare -A done_=([none]=1)
limit=50
[ -n "$real_agent" ] && limit=620
[ -n "$model" ] && limit=140
deadline=$(($(date +%s) + limit))
while [ "$ndone" -lt 3 ]; do
    [ "$(date +%s)" -lt "$deadline" ] || die "jobs still running after $limit s"
    for label in completes crashes never-starts; do
        [ -n "${done_[$label]:-}" ] && continue
        pid=$(cat "$tmp/out/$label.pid")
        kill -0 "$pid" 2>/dev/null && continue
        wait "$pid"
        rc=$?
        done_[$label]=1 ndone=$((ndone + 1))
        last=$(tail -n 1 "$tmp/out/$label.out")
        jid=$(sed -n 's/^JOB_ID=\([^ ]*\) .*/\1/p' <<<"$last")
        status=$(sed -n 's/.* STATUS=\([^ ]*\) .*/\1/p' <<<"$last")
        took=$(echo "$(date +%s.%N) - ${launched[$label]}" | bc)
        reason=$([ -n "$jid" ] && field "$jid" reason)
        [ "$reason" = null ] && reason=
        verdict="job $jid ($label): $status${reason:+ ($reason)}, exit $rc, after $(printf '%.1f' "$took") s"
        if [ "$status" = "${want_status[$label]}" ] && [ "$rc" = "${want_rc[$label]}" ]; then
            say "OK   $verdict"
        else
            say "BAD  $verdict; expected ${want_status[$label]}, exit ${want_rc[$label]}"
            sed 's/^/       /' "$tmp/out/$label.err"
            fails=$((fails + 1))
        fi
        case "$label" in
        completes)
            report=$(sed -n 's/.* REPORT=\(.*\)$/\1/p' <<<"$last")
            [ -s "$report" ] && say "     the agent's report ($report): $(head -n 1 "$report")" ||
                { say "BAD  no report at $report"; fails=$((fails + 1)); }
            if [ -n "$model" ] && [ "$BACKEND" = tmux ]; then
                say "     what $AGENT shows (its model is mam's scripted model; every command ran through its own shell):"
                tmux -L "$sock" capture-pane -p -t "$(sed -n 's/.*PANE=\([^ ]*\).*/\1/p' "$tmp/out/create-$ok_session.out")" |
                    grep -v '^[[:space:]]*$' | tail -n 14 | cut -c1-150 | sed 's/^/       | /'
            fi
            claimed=$(field "$jid" claimed_at)
            [ -n "$claimed" ] && say "     the agent published 'started' $(printf '%.2f' "$(echo "$(ts_s "$claimed") - ${launched[$label]}" | bc)") s after delegate-job began (that is what confirmed the prompt arrived)"
            ;;
        crashes)
            [ "$reason" = agent_gone ] || { say "BAD  reason '$reason', expected agent_gone"; fails=$((fails + 1)); }
            ev=$ws/.mam/jobs/$jid/events.log
            first=$(head -n 1 "$ev" | sed -n 's/.*"ts":"\([^"]*\)".*/\1/p')
            lastbeat=$(tail -n 1 "$ev" | sed -n 's/.*"ts":"\([^"]*\)".*/\1/p')
            fin=$(field "$jid" finished_at)
            if [ -n "$first" ] && [ -n "$fin" ]; then
                crash=$(echo "$(ts_s "$first") + 2" | bc) # crash_after_s=2 after the prompt (= started)
                r1=$(echo "($(ts_s "$fin") - $crash) / ($K * $N)" | bc -l)
                r2=$(echo "($(ts_s "$fin") - $(ts_s "$lastbeat")) / ($K * $N)" | bc -l)
                d1=$(echo "$(ts_s "$fin") - $crash" | bc -l)
                d2=$(echo "$(ts_s "$fin") - $(ts_s "$lastbeat")" | bc -l)
                say "     the agent crashed about 2 s after it started; delegate-job saw its process gone and closed the job"
                say "     $(printf '%.1f' "$d1") s later ($(printf '%.2f' "$r1") times the idle window K x N = $K x ${N} s, which it did not wait for),"
                say "     $(printf '%.1f' "$d2") s ($(printf '%.2f' "$r2") x K x N) after the last heartbeat it sent"
            fi
            ;;
        esac
        case "$label" in
        never-starts)
            say "     the agent never ran the start command, so no 'started' came within T = ${T} s: blocked" ;;
        esac
    done
    sleep 0.1
done

say "mam jobs (ELAPSED: claim to finish; EVIDENCE and HEARTBEAT: age of the last sign of life, '-' once finished):"
(cd "$ws" && "$mam" jobs) | sed 's/^/       /'
if [ "$fails" -ne 0 ]; then
    say "FAIL: $fails verdict(s) not as expected"
    exit 1
fi
say "PASS: every verdict as expected"
