#!/usr/bin/env bash
# Builds every provider component (release, size-tuned: providers/*) and
# prints each one's path and size.
set -euo pipefail
cd "$(dirname "$0")"
target=wasm32-wasip2
# The sandbox CLI's embedded backend confines every command with
# bubblewrap and refuses to run without it (see sandbox-engine/README.md,
# "Isolation"). Checked here so that a new machine learns it first.
if ! command -v bwrap >/dev/null 2>&1; then
  echo "warning: bubblewrap (bwrap) is not installed: 'sandbox run' will refuse to run commands." >&2
  echo "         install it with: apt-get install bubblewrap   (Fedora: dnf install bubblewrap)" >&2
else
  # As root the backend runs bwrap as an unprivileged uid: probe that way.
  probe=(bwrap --unshare-user --unshare-pid --unshare-net --ro-bind / / true)
  if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null 2>&1; then
    probe=(setpriv --reuid 65534 --regid 65534 --clear-groups "${probe[@]}")
  fi
  if ! "${probe[@]}" 2>/dev/null; then
    echo "warning: bwrap cannot create namespaces here (unprivileged user namespaces disabled?):" >&2
    echo "         'sandbox run' will refuse to run commands (see sandbox-engine/README.md, Isolation)" >&2
  fi
fi
if ! rustup target list --installed | grep -qx "$target"; then
  echo "installing Rust target $target" >&2
  rustup target add "$target"
fi
# Size settings for the component only (budget 480 KiB, BENCHMARKS.md,
# "Component size: contract 0.7.0"); the host's
# release build keeps the workspace's plain release profile. opt-level "z"
# rather than "s": 20 KB smaller, and the output path measured no slower
# (BENCHMARKS.md, "Component size: opt-level z").
providers=(createos-provider daytona-provider)
CARGO_PROFILE_RELEASE_OPT_LEVEL=z \
CARGO_PROFILE_RELEASE_LTO=true \
CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1 \
CARGO_PROFILE_RELEASE_PANIC=abort \
  cargo build --release --target "$target" --lib "${providers[@]/#/-p}"
for provider in "${providers[@]}"; do
  wasm="target/$target/release/${provider//-/_}.wasm"
  size=$(stat -c %s "$wasm")
  echo "component: $PWD/$wasm"
  echo "size: $size bytes ($((size / 1024)) KiB)"
  if [ "$size" -gt $((480 * 1024)) ]; then
    echo "error: $wasm is over the 480 KiB budget (BENCHMARKS.md, 'Component size')" >&2
    exit 1
  fi
done
# The README's example provider ("Write your own provider"), loaded by
# crates/provider-sdk/tests/minimal_provider.rs.
cargo build --release --target "$target" -p provider-sdk --example minimal_provider
echo "example: $PWD/target/$target/release/examples/minimal_provider.wasm"
