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
command -v setpriv >/dev/null || missing+=(util-linux)
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

export MAM_REQUIRE_MOSQUITTO=1 MAM_REQUIRE_OPENSSL=1 MAM_REQUIRE_TMUX=1
# No inherited control plane or broker may leak into the tests (AMENDMENTS A29).
unset WORKSPACE_ROOT AGENT_SESSIONS_YAML MAM_JOBS_DIR DELEGATE_JOB_LOGS_DIR MAM_ENV_FILE
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
  step "leak guard: no mam heartbeat/daemon/remote run or test tmux server outlived the tests"
  scripts/leak_check.sh "$MAM_TEST_TMP" "$tmux_before"
}
step "cargo fmt --check"
cargo fmt --check
step "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets --quiet -- -D warnings
step "cargo test"
cargo test
leak_check
if grep -q '^lockcheck' Cargo.toml; then
  step "cargo test --features lockcheck (X8: no spawn, connect or sleep under the registry lock)"
  cargo test --features lockcheck --test it
  leak_check
fi
step "cargo test --features fault-inject (H9, H10: heartbeat spawn and pidfile failures)"
MAM_REQUIRE_FAULT_INJECT=1 cargo test --features fault-inject --test it heartbeat::
leak_check
