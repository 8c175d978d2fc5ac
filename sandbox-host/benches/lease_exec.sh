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

# shellcheck source=held_lease.sh
source "$(dirname "$0")/held_lease.sh"
start new "$BIN" "$PROVIDER"
if [ -n "${BASE_BIN:-}" ]; then start base "$BASE_BIN" "${BASE_PROVIDER:?set with BASE_BIN}"; fi
# shellcheck source=side_by_side.sh
source "$(dirname "$0")/side_by_side.sh"
ours() { in_env new "$BIN" lease exec "$LEASE_new" -- true; }
base() { in_env base "$BASE_BIN" lease exec "$LEASE_base" -- true; }
compare "lease exec -- true"
env $ENV_new "$BIN" lease destroy "$LEASE_new" > /dev/null
if [ -n "${BASE_BIN:-}" ]; then env $ENV_base "$BASE_BIN" lease destroy "$LEASE_base" > /dev/null; fi
