#!/bin/bash
# 50 MB of base64 through `sandbox lease exec` on a held lease (against
# `sandbox engine`, each provider) and through `sandbox run` (embedded
# engine), side by side with the same command under a bare bubblewrap
# writing to a pipe (issue 41 item 3): ROUNDS rounds of N interleaved runs
# each, every side's stdout read to the end by this script; prints each
# round's medians, throughput and the ratio of throughputs.
# Byte-exact: every timed run's byte count is checked (random input of a
# fixed size gives base64 of a fixed size), and once per side a
# deterministic command's output is compared with the bare one's by
# SHA-256.
# Run from the repository root after `cargo build --release -p
# sandbox-host` and ./build.sh. SANDBOX_BIN, COMPONENTS, N, ROUNDS.
set -euo pipefail
BIN=${SANDBOX_BIN:-target/release/sandbox}
COMPONENTS=${COMPONENTS:-target/wasm32-wasip2/release}
N=${N:-5}
ROUNDS=${ROUNDS:-3}
DIR=$(mktemp -d)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "$DIR"' EXIT
unset SANDBOX_CONFIG SANDBOX_API_KEY_FILE SANDBOX_PROVIDER SANDBOX_STORE

# 37 500 000 random bytes are 50 000 000 base64 characters in lines of 76
# (657 895 newlines).
SCRIPT='head -c 37500000 /dev/urandom | base64'
BYTES=50657895
# The exactness check: deterministic text, its base64 compared whole.
EXACT='seq 1 3000000 | base64'

# The baseline: side_by_side.sh's bubblewrap running the script.
# shellcheck source=side_by_side.sh
source "$(dirname "$0")/side_by_side.sh"
unset 'BARE[${#BARE[@]}-1]'
bare_sh() { ( exec "${BARE[@]}" /bin/sh -c "$1" ); }

# shellcheck source=held_lease.sh
source "$(dirname "$0")/held_lease.sh"
start createos "$BIN" "$COMPONENTS/createos_provider.wasm"
start daytona "$BIN" "$COMPONENTS/daytona_provider.wasm"
createos() { in_env createos "$BIN" lease exec "$LEASE_createos" -- /bin/sh -c "$1"; }
daytona() { in_env daytona "$BIN" lease exec "$LEASE_daytona" -- /bin/sh -c "$1"; }
run() { ( export SANDBOX_DATA_DIR=$DIR/run; exec "$BIN" run -- /bin/sh -c "$1" ); }
SIDES=(bare_sh createos daytona run)
LABELS=("bare \`bwrap sh -c ...\` to a pipe" "\`lease exec\`, CreateOS" "\`lease exec\`, Daytona" "\`run\` (embedded engine, CreateOS)")

want=$(bare_sh "$EXACT" | sha256sum)
for side in "${SIDES[@]:1}"; do
  got=$("$side" "$EXACT" | sha256sum)
  if [ "$got" != "$want" ]; then
    echo "$side: the output differs from the bare command's" >&2
    exit 1
  fi
done

# timed SIDE: one run's wall time in ms, its byte count checked.
timed() {
  local t0=$EPOCHREALTIME t1 n
  n=$("$1" "$SCRIPT" | wc -c)
  t1=$EPOCHREALTIME
  if [ "$n" != "$BYTES" ]; then
    echo "$1: $n bytes, not $BYTES" >&2
    exit 1
  fi
  echo "scale=2; (${t1/./} - ${t0/./}) / 1000" | bc
}
echo "| round | side | median | throughput | ratio | load |"
echo "|---|---|---|---|---|---|"
for round in $(seq 1 "$ROUNDS"); do
  for side in "${SIDES[@]}"; do : > "$DIR/t.$side"; done
  for _ in $(seq 1 "$N"); do
    for side in "${SIDES[@]}"; do timed "$side" >> "$DIR/t.$side"; done
  done
  load=$(cut -d' ' -f1 /proc/loadavg)
  bare=$(median < "$DIR/t.bare_sh")
  for i in "${!SIDES[@]}"; do
    m=$(median < "$DIR/t.${SIDES[$i]}")
    mbps=$(echo "scale=0; $BYTES / 1000 / $m" | bc)
    echo "| $round | ${LABELS[$i]} | $m ms | $mbps MB/s | $(ratio "$bare" "$m")x | $load |"
  done
done
for name in createos daytona; do
  lease=LEASE_$name
  in_env "$name" "$BIN" lease destroy "${!lease}" > /dev/null
done
