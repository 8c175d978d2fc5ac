#!/usr/bin/env bash
# Packages the crates a published `sandbox` needs (sandbox-engine and
# sandbox-host) the way `cargo publish` would, with the provider
# components inside sandbox-host's package: a package has no providers'
# sources for build.rs to build, so the workspace's release builds
# (./build.sh) go into sandbox-host/embedded/ with their crate versions.
#
#   sandbox-host/package.sh                       # cargo publish --dry-run of both
#   sandbox-host/package.sh cargo package         # or any cargo command that takes -p
#
# The dry run builds each package from its .crate file alone (sandbox-host
# against the packaged sandbox-engine), as crates.io users would.
set -euo pipefail
cd "$(dirname "$0")/.."
./build.sh >/dev/null
staged=sandbox-host/embedded
rm -rf "$staged" && mkdir -p "$staged"
: >"$staged/versions.txt"
for name in createos daytona; do
  cp "target/wasm32-wasip2/release/${name}_provider.wasm" "$staged/"
  version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "providers/$name/Cargo.toml" | head -1)
  echo "$name $version" >>"$staged/versions.txt"
done
# Cargo extracts each package of its local overlay registry once per
# version, into $CARGO_HOME/registry/src/-<hash of the overlay's path>/,
# and reuses that copy: a second dry run of the same version built the
# first run's sources (seen here). Those copies go first.
# Cargo also never rebuilds a registry package it built before (a
# registry version is taken to be immutable), so the previous run's build
# of the packaged engine goes too: the build whose sources were such a copy.
cargo_home=${CARGO_HOME:-$HOME/.cargo}
rm -rf "$cargo_home"/registry/src/-*/sandbox-engine-* "$cargo_home"/registry/src/-*/sandbox-host-*
for info in target/debug/deps/sandbox_engine-*.d; do
  [ -e "$info" ] || continue
  if grep -q 'registry/src/-[^/]*/sandbox-engine-' "$info"; then
    hash=${info##*/sandbox_engine-}
    hash=${hash%.d}
    rm -rf target/debug/deps/*sandbox_engine-"$hash"* target/debug/.fingerprint/sandbox-engine-"$hash"
  fi
done
if [ "$#" -eq 0 ]; then
  set -- cargo publish --dry-run
fi
# The staged components are build outputs git does not track, which cargo
# counts as uncommitted: --allow-dirty lets them in (and any uncommitted
# source change with them; `git status` says which).
"$@" --allow-dirty -p sandbox-engine -p sandbox-host
