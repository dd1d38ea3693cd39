# shellcheck shell=bash
# Sourceable library of the legacy scripts (ORCH 0.5, A27). Every function is a one-line wrapper
# around a mam subcommand; the binary is found like the shims find it ($MAM_BIN, then
# <lib dir>/../bin/mam, then mam on PATH). Defines MAM_VERSION. Its one side effect when sourced:
# write $WORKSPACE_ROOT/.mam/shim/herdr (two lines that exec `mam pane "$@"`) when it is missing or
# different, at the control root resolved at source time (tests pin WORKSPACE_ROOT first).

case "${BASH_SOURCE[0]}" in */*) _MAM_LIB_DIR=${BASH_SOURCE[0]%/*} ;; *) _MAM_LIB_DIR=. ;; esac
_MAM_LIB_DIR=$(cd "$_MAM_LIB_DIR" && pwd)

_mam_bin() { if [ -n "${MAM_BIN:-}" ]; then printf '%s\n' "$MAM_BIN"; elif [ -x "$_MAM_LIB_DIR/../bin/mam" ]; then printf '%s\n' "$_MAM_LIB_DIR/../bin/mam"; else printf '%s\n' mam; fi; }

send_keys_safe() { "$(_mam_bin)" pane send-keys-safe "$@"; }
mam_int() { "$(_mam_bin)" env --check-int "$1"; }
mam_abs_workspace() { "$(_mam_bin)" paths | sed -n 's/^control_root=//p'; }
mam_control_plane_json() { "$(_mam_bin)" paths --control-plane-json; }
mam_control_plane_prefix() { "$(_mam_bin)" paths --control-plane-prefix; }
delegate_publish_cmd() { "$(_mam_bin)" registry publish-cmd "$@"; }
delegate_logs_dir() { "$(_mam_bin)" paths | sed -n 's/^logs=//p'; }
start_watchdog() { "$(_mam_bin)" daemon ensure --workspace "$(mam_abs_workspace)" "$@"; }

MAM_VERSION=$("$(_mam_bin)" --version 2>/dev/null | sed -n 's/^mam //p')

_mam_write_herdr_shim() {
  local root bin dir want tmp
  root=$(mam_abs_workspace) && [ -n "$root" ] || return 0
  bin=$(_mam_bin)
  case "$bin" in /*) ;; */*) bin="$(cd "${bin%/*}" && pwd)/${bin##*/}" ;; esac
  want=$(printf '#!/usr/bin/env bash\nexec '\''%s'\'' pane "$@"' "${bin//\'/\'\\\'\'}")
  dir="$root/.mam/shim"
  [ "$(cat "$dir/herdr" 2>/dev/null)" = "$want" ] && return 0
  mkdir -p "$dir" || return 0
  tmp="$dir/.herdr.$$.tmp"
  printf '%s\n' "$want" >"$tmp" && chmod 755 "$tmp" && mv -f "$tmp" "$dir/herdr" || rm -f "$tmp"
}
_mam_write_herdr_shim
unset -f _mam_write_herdr_shim
