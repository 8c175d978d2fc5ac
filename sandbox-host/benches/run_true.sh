#!/bin/bash
# `sandbox run -- true` on the embedded engine (the whole lifecycle: the
# engine's start, a sandbox with its disk and machine, the command, the
# proof of its end, the delete, the engine's stop) side by side with a
# bare bwrap `true` (the sandbox's namespaces, as the unprivileged uid the
# engine uses when root), interleaved: ROUNDS rounds of N runs each;
# prints each round's medians and their ratio (issue 41 item 2). With
# BASE_BIN (another build's `sandbox`), that build runs interleaved too.
# Run from the repository root after `cargo build --release -p
# sandbox-host`. SANDBOX_BIN, N, ROUNDS.
set -euo pipefail
BIN=${SANDBOX_BIN:-target/release/sandbox}
N=${N:-9}
ROUNDS=${ROUNDS:-3}
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
# The embedded engine and its built-in provider: nothing of a running
# engine's may leak in from the caller's environment.
unset SANDBOX_CONFIG SANDBOX_API_KEY_FILE SANDBOX_PROVIDER SANDBOX_STORE
BARE=(bwrap --unshare-user --unshare-pid --unshare-net --unshare-ipc --unshare-uts
      --ro-bind / / --proc /proc --dev /dev true)
if [ "$(id -u)" = 0 ]; then
  BARE=(setpriv --reuid 65534 --regid 65534 --clear-groups "${BARE[@]}")
fi
# in_data NAME CMD...: CMD with a data directory of its own per build.
in_data() {
  local name=$1
  shift
  (
    export SANDBOX_DATA_DIR=$DIR/$name
    exec "$@"
  )
}
# Wall time of "$@" in ms, from bash's own clock.
ms() {
  local t0=$EPOCHREALTIME t1
  "$@" > /dev/null
  t1=$EPOCHREALTIME
  echo "scale=2; (${t1/./} - ${t0/./}) / 1000" | bc
}
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
ratio() { echo "scale=2; $1 / $2" | bc; }
# Warm: the component cache and the data directories.
in_data new "$BIN" run -- true
if [ -n "${BASE_BIN:-}" ]; then in_data base "$BASE_BIN" run -- true; fi
if [ -n "${BASE_BIN:-}" ]; then
  echo "| round | \`run -- true\` | ratio | base build | ratio | bare \`bwrap true\` | load |"
  echo "|---|---|---|---|---|---|---|"
else
  echo "| round | \`run -- true\` | bare \`bwrap true\` | ratio | load |"
  echo "|---|---|---|---|---|"
fi
for round in $(seq 1 "$ROUNDS"); do
  : > "$DIR/t.new"; : > "$DIR/t.base"; : > "$DIR/t.bare"
  for _ in $(seq 1 "$N"); do
    ms in_data new "$BIN" run -- true >> "$DIR/t.new"
    if [ -n "${BASE_BIN:-}" ]; then
      ms in_data base "$BASE_BIN" run -- true >> "$DIR/t.base"
    fi
    ms in_data none "${BARE[@]}" >> "$DIR/t.bare"  # the same subshell as ours
  done
  e=$(median < "$DIR/t.new"); b=$(median < "$DIR/t.bare"); load=$(cut -d' ' -f1 /proc/loadavg)
  if [ -n "${BASE_BIN:-}" ]; then
    o=$(median < "$DIR/t.base")
    echo "| $round | $e ms | $(ratio "$e" "$b")x | $o ms | $(ratio "$o" "$b")x | $b ms | $load |"
  else
    echo "| $round | $e ms | $b ms | $(ratio "$e" "$b")x | $load |"
  fi
done
