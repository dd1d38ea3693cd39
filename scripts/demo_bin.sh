# Sourced by scripts/demo.sh and scripts/demo_loop.sh (needs $here, the checkout): `pick_mam NAME`
# sets $mam to the binary the demo runs, and says which one on stdout and why:
#   1. MAM_BIN, when set;
#   2. the release build `${CARGO_TARGET_DIR:-$here/target}/release/mam`, when it is newer than every
#      source (src/, Cargo.toml, Cargo.lock);
#   3. an installed `mam` on PATH of this checkout's version, when it too is newer than every source;
#   4. else `cargo build --release` (once: the next run reuses it).
# A binary older than the sources may not be what they say, so it is passed over, with a line naming
# a source newer than it (docs/DESIGN.md, "The user's path").
# `start_broker` starts the demo's embedded broker (needs $mam, $tmp/out and `die`).

# The first source newer than $1 (nothing when $1 is newer than all of them).
newer_source() {
    find "$here/src" "$here/Cargo.toml" "$here/Cargo.lock" -newer "$1" -print -quit 2>/dev/null
}

pick_mam() { # demo name
    local who=$1 version release installed newer
    if [ -n "${MAM_BIN:-}" ]; then
        mam=$MAM_BIN
        echo "using $mam (MAM_BIN)"
    else
        mam=''
        version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$here/Cargo.toml" | head -n 1)
        release=${CARGO_TARGET_DIR:-$here/target}/release/mam
        if [ -x "$release" ]; then
            newer=$(newer_source "$release")
            if [ -z "$newer" ]; then
                mam=$release
                echo "using the release build $mam (newer than the sources)"
            else
                echo "not using the release build $release: ${newer#"$here"/} is newer"
            fi
        fi
        if [ -z "$mam" ] && installed=$(command -v mam); then
            newer=$(newer_source "$installed")
            if ! "$installed" --version 2>/dev/null | grep -q "^mam $version\b"; then
                echo "not using the installed $installed: it is not mam $version ($("$installed" --version 2>&1 | head -n 1))"
            elif [ -n "$newer" ]; then
                echo "not using the installed $installed: ${newer#"$here"/} is newer"
            else
                mam=$installed
                echo "using the installed $mam ($("$mam" --version), newer than the sources)"
            fi
        fi
        if [ -z "$mam" ]; then
            echo "building mam (cargo build --release, once; later runs reuse it)..."
            (cd "$here" && cargo build --release --quiet) || { echo "ERROR: $who: cargo build failed" >&2; exit 1; }
            mam=$release
        fi
    fi
    [ -x "$mam" ] || { echo "ERROR: $who: no mam binary at $mam" >&2; exit 1; }
    mam=$(cd "$(dirname "$mam")" && pwd)/$(basename "$mam")
}

# `$mam broker --port 0` in the background: its pid in $broker_pid, its output in
# $tmp/out/broker.{out,err}; $port and the exported MQTT_PORT are the port it listens on (else `die`).
start_broker() {
    "$mam" broker --port 0 >"$tmp/out/broker.out" 2>"$tmp/out/broker.err" &
    broker_pid=$!
    for _ in $(seq 100); do grep -q 'listening on' "$tmp/out/broker.out" && break; sleep 0.05; done
    port=$(sed -n 's/^mam broker listening on .*:\([0-9][0-9]*\)$/\1/p' "$tmp/out/broker.out")
    [ -n "$port" ] || die "the broker did not start: $(cat "$tmp/out/broker.err")"
    export MQTT_PORT=$port
}
