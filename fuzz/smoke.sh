#!/usr/bin/env bash
# Builds the libFuzzer targets with plain stable cargo (the sancov flags
# cargo-fuzz would pass, no sanitizer, no nightly, no cargo-fuzz install)
# and runs each for a few seconds: the CI smoke run. Usage:
#   fuzz/smoke.sh [seconds per target, default 10]
# A long run: fuzz/smoke.sh with -runs, or `cargo +nightly fuzz run -O -s none TARGET`.
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-10}"
host="$(rustc -vV | sed -n 's/^host: //p')"
export RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares -Cdebug-assertions -Coverflow-checks"
# `--target` keeps the flags off build scripts and proc macros.
cargo build --release --bins --target "$host" --target-dir target/smoke
for target in frames envelope config; do
  mkdir -p "corpus/$target" "artifacts/$target"
  echo "fuzz smoke: $target for ${seconds}s"
  "target/smoke/$host/release/$target" "corpus/$target" \
    -artifact_prefix="artifacts/$target/" -max_total_time="$seconds" -print_final_stats=1 2>&1 \
    | grep -E '^(Done|stat::number_of_executed_units)|ERROR|panicked' || true
  # libFuzzer exits non-zero and writes an artifact on a crash.
  if compgen -G "artifacts/$target/*" >/dev/null; then
    echo "fuzz smoke: $target found a crash: $(ls artifacts/$target)" >&2
    exit 1
  fi
done
