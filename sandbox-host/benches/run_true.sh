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
# in_data NAME CMD...: CMD with a data directory of its own per build.
in_data() {
  local name=$1
  shift
  (
    export SANDBOX_DATA_DIR=$DIR/$name
    exec "$@"
  )
}
# shellcheck source=side_by_side.sh
source "$(dirname "$0")/side_by_side.sh"
ours() { in_data new "$BIN" run -- true; }
base() { in_data base "$BASE_BIN" run -- true; }
# Warm: the component cache and the data directories.
in_data new "$BIN" run -- true
if [ -n "${BASE_BIN:-}" ]; then in_data base "$BASE_BIN" run -- true; fi
compare "run -- true"
