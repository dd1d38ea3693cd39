#!/usr/bin/env bash
# The leak guard over a whole test run (STYLE: "no process outlives the test run"), run by test.sh
# after each `cargo test`. Fails (exit 1, one line per leak) when, after a short grace for processes
# that are just ending:
#   - a `mam heartbeat run`, `mam daemon run`, `mam remote run` or `mam notify run` process is alive whose argv or cwd
#     lies under BASE (the run's MAM_TEST_TMP, which holds every test's `mam-it-<pid>` directory);
#   - a tmux server on a `mam-test-*` socket is alive that was not alive before the run (the names
#     tests give their tmux sockets; BEFORE is the file `tmux_servers` wrote before the run);
#   - a nats-server is alive whose config file (argv) lies under BASE (tests/it/multinode's cluster);
#   - a herdr server is alive whose HOME or XDG directories (from /proc/PID/environ, readable for the
#     same user) or argv lie under BASE: a test's private herdr (tests/it/support.rs `HerdrHome`).
# Usage: leak_check.sh BASE [BEFORE]      leak_check.sh --tmux-servers (lists live test servers)
set -uo pipefail

tmux_servers() {
  local dir="${TMUX_TMPDIR:-/tmp}/tmux-$(id -u)" s
  command -v tmux >/dev/null || return 0
  for s in "$dir"/mam-test-*; do
    [ -S "$s" ] || continue
    # A socket file can outlive its server; only a server that answers counts.
    tmux -L "${s##*/}" list-sessions >/dev/null 2>&1 && echo "${s##*/}"
  done
  return 0
}

if [ "${1:-}" = --tmux-servers ]; then
  tmux_servers
  exit 0
fi

base=${1:?usage: leak_check.sh BASE [BEFORE]}
before=${2:-/dev/null}

mam_leaks() {
  local d pid cmd cwd
  for d in /proc/[0-9]*; do
    pid=${d#/proc/}
    # A zombie has an empty cmdline and is skipped with the unreadable ones.
    cmd=$({ tr '\0' ' ' <"$d/cmdline"; } 2>/dev/null) || continue
    case " $cmd" in
      *" heartbeat run "* | *" daemon run "* | *" remote run "* | *" notify run "*) ;;
      *"nats-server -c $base/"*) ;;
      *) continue ;;
    esac
    cwd=$(readlink "$d/cwd" 2>/dev/null || true)
    case "$cmd $cwd/" in
      *"$base/"*) echo "pid $pid: $cmd(cwd $cwd)" ;;
    esac
  done
}

herdr_leaks() {
  local d pid cmd kv hit home
  for d in /proc/[0-9]*; do
    pid=${d#/proc/}
    cmd=$({ tr '\0' ' ' <"$d/cmdline"; } 2>/dev/null) || continue
    # argv[0] is herdr (any path) and the command is its server (`herdr [--session N] server`).
    case "${cmd%% *}" in herdr | */herdr) ;; *) continue ;; esac
    case " $cmd" in *" server "*) ;; *) continue ;; esac
    case " $cmd" in *" server stop "* | *" server reload-config "*) continue ;; esac
    hit=
    case "$cmd" in *"$base/"*) hit=argv ;; esac
    home=
    while IFS= read -r kv; do
      case $kv in
        HOME=* | XDG_CONFIG_HOME=* | XDG_STATE_HOME=* | XDG_CACHE_HOME=* | XDG_DATA_HOME=* | XDG_RUNTIME_DIR=*)
          [ "${kv%%=*}" = HOME ] && home=${kv#*=}
          case "${kv#*=}/" in "$base/"*) hit=${hit:-env} ;; esac
          ;;
      esac
    done < <({ tr '\0' '\n' <"$d/environ"; } 2>/dev/null)
    [ -n "$hit" ] && echo "herdr server pid $pid: $cmd(HOME $home)"
  done
  return 0
}

tmux_leaks() {
  local s
  while read -r s; do
    grep -qxF "$s" "$before" 2>/dev/null || echo "tmux server on socket $s"
  done < <(tmux_servers)
}

deadline=$((SECONDS + 5))
while :; do
  leaks=$( (mam_leaks; tmux_leaks; herdr_leaks) | sed '/^$/d')
  [ -z "$leaks" ] && exit 0
  [ "$SECONDS" -ge "$deadline" ] && break
  sleep 0.2
done
echo "ERROR: leak_check: processes outlived the test run:" >&2
printf '%s\n' "$leaks" >&2
exit 1
