#!/usr/bin/env bash
# The one test command (README, .ci/run): installs what the suite needs on a bare Debian machine, then
# runs formatting, lints and the whole test suite with the real tools required (AMENDMENTS A30).
set -euo pipefail
cd "$(dirname "$0")/.."

# mosquitto lives in /usr/sbin, which a non-login PATH may lack.
export PATH="$PATH:/usr/sbin:/sbin"

missing=()
command -v mosquitto >/dev/null || missing+=(mosquitto)
command -v mosquitto_pub >/dev/null || missing+=(mosquitto-clients)
command -v tmux >/dev/null || missing+=(tmux)
command -v openssl >/dev/null || missing+=(openssl)
command -v git >/dev/null || missing+=(git)
command -v python3 >/dev/null || missing+=(python3)
# paho-mqtt as a real client of the broker tests (issue 17; tests/fixtures/paho_client.py runs on 1.6 and 2.x).
# The package serves the system python3; a python3 earlier on PATH (pyenv) may not see it.
paho_python() {
  local p
  for p in python3 /usr/bin/python3; do
    "$p" -c 'import paho.mqtt.client' 2>/dev/null && { command -v "$p"; return 0; }
  done
  return 1
}
paho_python >/dev/null || missing+=(python3-paho-mqtt)
command -v setpriv >/dev/null || missing+=(util-linux)
# The conversation in-use check (ORCH 6.3) asks ps and lsof; flock holds a presence lock in its tests.
command -v ps >/dev/null || missing+=(procps)
command -v lsof >/dev/null || missing+=(lsof)
command -v flock >/dev/null || missing+=(util-linux)
# The multinode tests (issue 19) run a 3-node NATS cluster with JetStream and the MQTT gateway.
command -v nats-server >/dev/null || missing+=(nats-server)
if ((${#missing[@]})); then
  echo "test.sh: installing ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "ERROR: test.sh: missing ${missing[*]} and not root; install them first" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The paho tests run it with the python3 that imports it (tests/it/broker/paho.rs).
MAM_PAHO_PYTHON=$(paho_python) || MAM_PAHO_PYTHON=python3
export MAM_PAHO_PYTHON
export MAM_REQUIRE_MOSQUITTO=1 MAM_REQUIRE_OPENSSL=1 MAM_REQUIRE_TMUX=1 MAM_REQUIRE_LSOF=1 MAM_REQUIRE_PYTHON3=1 MAM_REQUIRE_PAHO=1
export MAM_REQUIRE_NATS=1

# The real herdr (issue 11): HERDR_BIN (a path) or `herdr` on PATH, exported absolute for the tests.
# Not installable from a package, so it is required only when MAM_REQUIRE_HERDR=1 (.ci/run sets it).
herdr_found=
if [ -n "${HERDR_BIN:-}" ]; then
  if [ -f "$HERDR_BIN" ] && [ -x "$HERDR_BIN" ]; then
    herdr_found=$(cd "$(dirname "$HERDR_BIN")" && pwd)/$(basename "$HERDR_BIN")
  else
    echo "WARNING: test.sh: HERDR_BIN=$HERDR_BIN is not an executable file; looking on PATH" >&2
  fi
fi
if [ -z "$herdr_found" ] && command -v herdr >/dev/null; then
  herdr_found=$(command -v herdr)
  case $herdr_found in /*) ;; *) herdr_found=$PWD/$herdr_found ;; esac
fi
if [ -n "$herdr_found" ]; then
  export HERDR_BIN=$herdr_found
  echo "test.sh: real herdr: $HERDR_BIN"
elif [ "${MAM_REQUIRE_HERDR:-}" = 1 ]; then
  echo "ERROR: test.sh: MAM_REQUIRE_HERDR=1 but no herdr found (HERDR_BIN=${HERDR_BIN:-unset}, none on PATH)" >&2
  exit 1
else
  unset HERDR_BIN
  echo "test.sh: no herdr found (HERDR_BIN or PATH): the real-herdr tests skip"
fi
# The real agent CLIs (issue 15): installed from npm once into a cache directory (a private HOME,
# self-updates off); the real-CLI tests (tests/it/agents_real.rs) find them through MAM_AGENTS_BIN
# and are required only when the install succeeded. A failed install is one line, and they skip.
if agents_dir=$(scripts/install_agents.sh); then
  export MAM_AGENTS_BIN=$agents_dir/node_modules/.bin MAM_REQUIRE_AGENTS=1
  echo "test.sh: real agent CLIs: $MAM_AGENTS_BIN"
else
  unset MAM_AGENTS_BIN MAM_REQUIRE_AGENTS
fi
# No inherited control plane or broker may leak into the tests (AMENDMENTS A29).
unset WORKSPACE_ROOT AGENT_SESSIONS_YAML MAM_JOBS_DIR DELEGATE_JOB_LOGS_DIR MAM_ENV_FILE
# Nor the caller's own herdr server (each test runs its own, in a private HOME).
unset HERDR_SOCKET_PATH HERDR_SESSION
for v in $(compgen -e | grep '^MQTT_' || true); do unset "$v"; done

# Every test directory of this run lives under one fresh base, so the leak guard judges this run's
# processes only (other runs on the machine have their own base).
MAM_TEST_TMP=$(mktemp -d "${TMPDIR:-/tmp}/mam-t.XXXXXX")
# mktemp makes it 0700; tests that run a command as nobody (A31) must traverse it like /tmp.
chmod 755 "$MAM_TEST_TMP"
export MAM_TEST_TMP
tmux_before="$MAM_TEST_TMP/tmux-servers-before"
scripts/leak_check.sh --tmux-servers >"$tmux_before"
trap 'rc=$?; [ "$rc" -eq 0 ] && rm -rf "$MAM_TEST_TMP"; exit "$rc"' EXIT

step() { printf '\n== %s\n' "$*"; }
leak_check() {
  step "leak guard: no mam heartbeat/daemon/remote run, test tmux server or test herdr outlived the tests"
  scripts/leak_check.sh "$MAM_TEST_TMP" "$tmux_before"
}
step "cargo fmt --check"
cargo fmt --check
step "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets --quiet -- -D warnings
# One pass with every test feature: test-hooks (the loop's test hooks, ORCH 8 item 8), lockcheck (X8:
# a spawn, connect or sleep under the registry lock panics; it changes nothing else) and fault-inject
# (H9, H10: heartbeat spawn and pidfile failures, only where MAM_FAULT_INJECT asks). Separate passes
# ran the same tests two and three times for no finding one pass misses.
step "cargo test --features test-hooks,lockcheck,fault-inject"
MAM_REQUIRE_FAULT_INJECT=1 cargo test --features test-hooks,lockcheck,fault-inject
leak_check
