#!/usr/bin/env bash
# Installs the real coding-agent CLIs the real-CLI tests drive (tests/it/agents_real.rs) from npm into
# one cache directory, idempotently: a second run with every CLI present does nothing. The install
# runs with a private HOME and npm prefix in a temp dir and self-updates off, as
# ../shared/agents/README.md says (claude and qwen otherwise `npm install -g` a newer version).
# Prints the directory whose node_modules/.bin holds the CLIs on stdout; exits non-zero (one line on
# stderr) when the install failed.
set -uo pipefail
dir=${MAM_AGENTS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/mam-agents}
packages=(@anthropic-ai/claude-code @openai/codex @google/gemini-cli @vibe-kit/grok-cli @qwen-code/qwen-code opencode-ai)
bins=(claude codex gemini grok qwen opencode)
have_all() {
  local b
  for b in "${bins[@]}"; do [ -x "$dir/node_modules/.bin/$b" ] || return 1; done
}
if ! have_all; then
  if ! command -v npm >/dev/null; then
    echo "install_agents.sh: npm not found; the real-CLI tests skip" >&2
    exit 1
  fi
  mkdir -p "$dir" || exit 1
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/mam-agents-install.XXXXXX") || exit 1
  mkdir -p "$tmp/home" "$tmp/prefix"
  log=$tmp/npm.log
  if ! env HOME="$tmp/home" NPM_CONFIG_PREFIX="$tmp/prefix" NPM_CONFIG_CACHE="$tmp/home/.npm" \
    DISABLE_AUTOUPDATER=1 NPM_CONFIG_UPDATE_NOTIFIER=false NPM_CONFIG_FUND=false NPM_CONFIG_AUDIT=false \
    timeout 600 npm install --prefix "$dir" --no-save --loglevel=error "${packages[@]}" >"$log" 2>&1; then
    echo "install_agents.sh: npm install of ${packages[*]} into $dir failed ($(tail -n 1 "$log")); the real-CLI tests skip" >&2
    rm -rf "$tmp"
    exit 1
  fi
  rm -rf "$tmp"
  if ! have_all; then
    echo "install_agents.sh: npm install finished but $dir/node_modules/.bin lacks some of ${bins[*]}; the real-CLI tests skip" >&2
    exit 1
  fi
fi
echo "$dir"
