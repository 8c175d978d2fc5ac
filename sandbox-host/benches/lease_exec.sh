#!/bin/bash
# `sandbox lease exec L -- true` on a held lease against `sandbox engine`,
# side by side with a bare bwrap `true` (the sandbox's namespaces, as the
# unprivileged uid the engine uses when root), interleaved: ROUNDS rounds
# of N runs each; prints each round's medians and their ratio. With
# BASE_BIN (another build's `sandbox`) and BASE_PROVIDER (its component),
# that build runs interleaved too, on an engine of its own (A/B).
# Run from the repository root after `cargo build --release --workspace`
# and ./build.sh. SANDBOX_BIN, PROVIDER (a built component), N, ROUNDS.
set -euo pipefail
BIN=${SANDBOX_BIN:-target/release/sandbox}
PROVIDER=${PROVIDER:-target/wasm32-wasip2/release/createos_provider.wasm}
N=${N:-15}
ROUNDS=${ROUNDS:-3}
DIR=$(mktemp -d)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "$DIR"' EXIT

# start NAME BIN PROVIDER: an engine and a held lease; sets ENV_NAME, LEASE_NAME.
start() {
  local name=$1 bin=$2 provider=$3 data=$DIR/$1
  SANDBOX_DATA_DIR=$data SANDBOX_PROVIDER=$provider "$bin" engine > "$DIR/$name.out" 2> "$DIR/$name.err" &
  PIDS+=($!)
  for _ in $(seq 1 100); do grep -q '^export ' "$DIR/$name.out" && break; sleep 0.1; done
  local vars="SANDBOX_DATA_DIR=$data $(sed -n 's/^export //p' "$DIR/$name.out")"
  printf -v "ENV_$name" '%s' "$vars"
  local lease
  lease=$(env $vars "$bin" lease acquire)
  printf -v "LEASE_$name" '%s' "$lease"
  env $vars "$bin" lease exec "$lease" -- true  # warm: the machine and the component cache
}
# in_env NAME CMD...: CMD with engine NAME's variables, set by the shell
# itself (an `env` in front would be one more program start on our side).
ENV_none=
in_env() {
  local vars=ENV_$1
  shift
  (
    for v in ${!vars}; do export "${v?}"; done
    exec "$@"
  )
}
start new "$BIN" "$PROVIDER"
if [ -n "${BASE_BIN:-}" ]; then start base "$BASE_BIN" "${BASE_PROVIDER:?set with BASE_BIN}"; fi
BARE=(bwrap --unshare-user --unshare-pid --unshare-net --unshare-ipc --unshare-uts
      --ro-bind / / --proc /proc --dev /dev true)
if [ "$(id -u)" = 0 ]; then
  BARE=(setpriv --reuid 65534 --regid 65534 --clear-groups "${BARE[@]}")
fi
# Wall time of "$@" in ms, read from bash's own clock (no `date` started
# around the command, which added a few ms to both sides).
ms() {
  local t0=$EPOCHREALTIME t1
  "$@" > /dev/null
  t1=$EPOCHREALTIME
  echo "scale=2; (${t1/./} - ${t0/./}) / 1000" | bc
}
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
ratio() { echo "scale=2; $1 / $2" | bc; }
if [ -n "${BASE_BIN:-}" ]; then
  echo "| round | \`lease exec -- true\` | ratio | base build | ratio | bare \`bwrap true\` | load |"
  echo "|---|---|---|---|---|---|---|"
else
  echo "| round | \`lease exec -- true\` | bare \`bwrap true\` | ratio | load |"
  echo "|---|---|---|---|---|"
fi
for round in $(seq 1 "$ROUNDS"); do
  : > "$DIR/t.new"; : > "$DIR/t.base"; : > "$DIR/t.bare"
  for _ in $(seq 1 "$N"); do
    ms in_env new "$BIN" lease exec "$LEASE_new" -- true >> "$DIR/t.new"
    if [ -n "${BASE_BIN:-}" ]; then
      ms in_env base "$BASE_BIN" lease exec "$LEASE_base" -- true >> "$DIR/t.base"
    fi
    ms in_env none "${BARE[@]}" >> "$DIR/t.bare"  # the same subshell as ours
  done
  e=$(median < "$DIR/t.new"); b=$(median < "$DIR/t.bare"); load=$(cut -d' ' -f1 /proc/loadavg)
  if [ -n "${BASE_BIN:-}" ]; then
    o=$(median < "$DIR/t.base")
    echo "| $round | $e ms | $(ratio "$e" "$b")x | $o ms | $(ratio "$o" "$b")x | $b ms | $load |"
  else
    echo "| $round | $e ms | $b ms | $(ratio "$e" "$b")x | $load |"
  fi
done
env $ENV_new "$BIN" lease destroy "$LEASE_new" > /dev/null
if [ -n "${BASE_BIN:-}" ]; then env $ENV_base "$BASE_BIN" lease destroy "$LEASE_base" > /dev/null; fi
