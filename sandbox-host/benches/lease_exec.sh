#!/bin/bash
# `sandbox lease exec L -- true` on a held lease against `sandbox engine`,
# side by side with a bare bwrap `true` (the sandbox's namespaces, as the
# unprivileged uid the engine uses when root), interleaved: ROUNDS rounds
# of N runs each; prints each round's medians and their ratio.
# Run from the repository root after `cargo build --release --workspace`
# and ./build.sh. SANDBOX_BIN, PROVIDER (createos|daytona), N, ROUNDS.
set -euo pipefail
BIN=${SANDBOX_BIN:-target/release/sandbox}
PROVIDER=${PROVIDER:-createos}
N=${N:-15}
ROUNDS=${ROUNDS:-3}
DIR=$(mktemp -d)
export SANDBOX_DATA_DIR=$DIR/data
"$BIN" --provider "$PROVIDER" engine > "$DIR/engine.out" 2> "$DIR/engine.err" &
ENGINE=$!
trap 'kill -TERM $ENGINE 2>/dev/null; wait $ENGINE 2>/dev/null; rm -rf "$DIR"' EXIT
for _ in $(seq 1 100); do grep -q '^export ' "$DIR/engine.out" && break; sleep 0.1; done
eval "$(head -1 "$DIR/engine.out")"
LEASE=$("$BIN" lease acquire)
BARE=(bwrap --unshare-user --unshare-pid --unshare-net --unshare-ipc --unshare-uts
      --ro-bind / / --proc /proc --dev /dev true)
if [ "$(id -u)" = 0 ]; then
  BARE=(setpriv --reuid 65534 --regid 65534 --clear-groups "${BARE[@]}")
fi
ms() { local t0 t1; t0=$(date +%s%N); "$@" > /dev/null; t1=$(date +%s%N); echo "scale=2; ($t1 - $t0) / 1000000" | bc; }
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
"$BIN" lease exec "$LEASE" -- true  # warm: the machine and the component cache
echo "| round | \`lease exec -- true\` ($PROVIDER) | bare \`bwrap true\` | ratio | load |"
echo "|---|---|---|---|---|"
for round in $(seq 1 "$ROUNDS"); do
  : > "$DIR/exec"; : > "$DIR/bare"
  for _ in $(seq 1 "$N"); do
    ms "$BIN" lease exec "$LEASE" -- true >> "$DIR/exec"
    ms "${BARE[@]}" >> "$DIR/bare"
  done
  e=$(median < "$DIR/exec"); b=$(median < "$DIR/bare")
  echo "| $round | $e ms | $b ms | $(echo "scale=2; $e / $b" | bc)x | $(cut -d' ' -f1 /proc/loadavg) |"
done
"$BIN" lease destroy "$LEASE" > /dev/null
