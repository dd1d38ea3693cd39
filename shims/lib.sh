# shellcheck shell=bash
# Sourceable library of the legacy scripts (ORCH 0.5, A27). Every function is a one-line wrapper
# around a mam subcommand and takes the legacy argument forms (issue 16); the binary is found like
# the shims find it ($MAM_BIN, then <lib dir>/../bin/mam, then mam on PATH; none: one ERROR line
# naming the three places, rc 127). Defines MAM_VERSION. Its one side effect when sourced: write
# $WORKSPACE_ROOT/.mam/shim/herdr (the herdr wrapper of `mam install --print-herdr-shim`, which
# stores the binary's absolute path) when it is missing or different, at the control root resolved
# at source time (tests pin WORKSPACE_ROOT first).

case "${BASH_SOURCE[0]}" in */*) _MAM_LIB_DIR=${BASH_SOURCE[0]%/*} ;; *) _MAM_LIB_DIR=. ;; esac
_MAM_LIB_DIR=$(cd "$_MAM_LIB_DIR" && pwd)

_mam_bin() {
  local b
  if [ -n "${MAM_BIN:-}" ]; then b=$MAM_BIN
  elif [ -x "$_MAM_LIB_DIR/../bin/mam" ]; then b=$_MAM_LIB_DIR/../bin/mam
  else b=$(command -v mam) || b=
  fi
  if [ -z "$b" ] || ! [ -x "$b" ]; then
    echo "ERROR: lib.sh: mam binary not found (looked at MAM_BIN=${MAM_BIN:-<unset>}, $_MAM_LIB_DIR/../bin/mam, mam on PATH)" >&2
    return 127
  fi
  printf '%s\n' "$b"
}

# send_keys_safe TARGET PROMPT [JOB_ID [REGISTRY_DIR]] (legacy), or the flags of
# `mam pane send-keys-safe`. The prompt travels in a temp file, never in an argv.
send_keys_safe() {
  local b f rc args
  b=$(_mam_bin) || return 127
  case "${1:-}" in -* | '') "$b" pane send-keys-safe "$@"; return ;; esac
  f=$(mktemp "${TMPDIR:-/tmp}/mam-sks.XXXXXX") || return 1
  printf '%s' "${2-}" >"$f"
  args=(--target "$1" --prompt-file "$f")
  if [ -n "${3:-}" ]; then
    args+=(--job "$3" --registry-dir "${4:-$("$b" paths | sed -n 's/^registry=//p')}")
  fi
  "$b" pane send-keys-safe "${args[@]}"
  rc=$?
  rm -f "$f"
  return "$rc"
}

mam_int() { local b; b=$(_mam_bin) || return 127; "$b" env --check-int "$1"; }

# mam_abs_workspace [PATH]: PATH made absolute (a missing PATH is returned unchanged, as the legacy
# helper did); without PATH, the control root.
mam_abs_workspace() {
  local b p
  if [ -z "${1:-}" ]; then
    b=$(_mam_bin) || return 127
    "$b" paths | sed -n 's/^control_root=//p'
    return
  fi
  case "$1" in /*) p=$1 ;; *) p=$PWD/$1 ;; esac
  if [ -d "$p" ]; then (cd "$p" && pwd); else printf '%s\n' "$1"; fi
}

mam_control_plane_json() { local b; b=$(_mam_bin) || return 127; "$b" paths --control-plane-json; }
mam_control_plane_prefix() { local b; b=$(_mam_bin) || return 127; "$b" paths --control-plane-prefix; }
delegate_publish_cmd() { local b; b=$(_mam_bin) || return 127; "$b" registry publish-cmd "$@"; }

# delegate_logs_dir [REGISTRY_DIR]: the audit-log root (DELEGATE_JOB_LOGS_DIR, else beside the
# registry: REGISTRY_DIR when given).
delegate_logs_dir() {
  local b
  b=$(_mam_bin) || return 127
  if [ -n "${1:-}" ]; then "$b" paths --registry-dir "$1"; else "$b" paths; fi | sed -n 's/^logs=//p'
}

# start_watchdog [WORKSPACE [REGISTRY_DIR]] (legacy), or the flags of `mam daemon ensure`.
start_watchdog() {
  local b ws
  b=$(_mam_bin) || return 127
  case "${1:-}" in
    '') "$b" daemon ensure --workspace "$(mam_abs_workspace)" ;;
    -*)
      case " $* " in *" --workspace "*) "$b" daemon ensure "$@" ;; *) "$b" daemon ensure --workspace "$(mam_abs_workspace)" "$@" ;; esac ;;
    *)
      ws=$(mam_abs_workspace "$1")
      if [ -n "${2:-}" ]; then "$b" daemon ensure --workspace "$ws" --registry-dir "$2"; else "$b" daemon ensure --workspace "$ws"; fi ;;
  esac
}

MAM_VERSION=$("$(_mam_bin 2>/dev/null || echo false)" --version 2>/dev/null | sed -n 's/^mam \([^ ]*\).*/\1/p')

_mam_write_herdr_shim() {
  local root b dir want tmp
  b=$(_mam_bin 2>/dev/null) || return 0
  root=$(mam_abs_workspace) && [ -n "$root" ] || return 0
  want=$("$b" install --print-herdr-shim) || return 0
  dir="$root/.mam/shim"
  [ "$(cat "$dir/herdr" 2>/dev/null)" = "$want" ] && return 0
  mkdir -p "$dir" || return 0
  tmp="$dir/.herdr.$$.tmp"
  printf '%s\n' "$want" >"$tmp" && chmod 755 "$tmp" && mv -f "$tmp" "$dir/herdr" || rm -f "$tmp"
}
_mam_write_herdr_shim
unset -f _mam_write_herdr_shim
