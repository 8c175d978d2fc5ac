#!/usr/bin/env bash
# Builds the CreateOS provider component (release, size-tuned) and prints
# its path and size.
set -euo pipefail
cd "$(dirname "$0")"
target=wasm32-wasip2
if ! rustup target list --installed | grep -qx "$target"; then
  echo "installing Rust target $target" >&2
  rustup target add "$target"
fi
# Size settings for the component only (goal <= 400 KiB); the host's
# release build keeps the workspace's plain release profile.
CARGO_PROFILE_RELEASE_OPT_LEVEL=s \
CARGO_PROFILE_RELEASE_LTO=true \
CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1 \
CARGO_PROFILE_RELEASE_PANIC=abort \
  cargo build --release --target "$target" -p createos-provider --lib
wasm="target/$target/release/createos_provider.wasm"
size=$(stat -c %s "$wasm")
echo "component: $PWD/$wasm"
echo "size: $size bytes ($((size / 1024)) KiB)"
