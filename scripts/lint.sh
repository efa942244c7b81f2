#!/usr/bin/env bash
# Clippy on every target of the workspace and of tools/modcycles, warnings denied, as
# .ci/run runs it. Prints how long it took.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/env.sh
start=$SECONDS
LIBTORCH="$(scripts/setup-libtorch.sh cpu)"
export LIBTORCH
# `--all-targets` leaves out test targets with `test = false` (e2e's real_cluster).
cargo clippy --workspace --all-targets --test real_cluster --locked -- -D warnings
(cd tools/modcycles && cargo fmt --check &&
  CARGO_TARGET_DIR="$PT_CACHE/target-tools" cargo clippy --all-targets --locked -q -- -D warnings)
echo "lint: clippy clean in $((SECONDS - start)) s" >&2
