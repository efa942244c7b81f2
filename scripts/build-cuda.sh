#!/usr/bin/env bash
# Builds the trainer with --features cuda against the full PyTorch 2.11.0 wheel
# (compile and link only; no GPU needed), so the GPU path never rots. Prints the
# binary's path. Extra arguments go to cargo, e.g. --release.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/env.sh
scripts/setup-debian.sh
LIBTORCH="$(scripts/setup-libtorch.sh cuda)"
export LIBTORCH
# The same target directory as the CPU build: only torch-sys, tch and the trainer are
# rebuilt against the CUDA libtorch; the other ~400 dependencies are shared.
cargo build -p trainer --features cuda --locked "$@" >&2
profile=debug
for a in "$@"; do [ "$a" = --release ] && profile=release; done
bin="$CARGO_TARGET_DIR/$profile/trainer"
if ! readelf -d "$bin" | grep -q 'NEEDED.*libtorch_cuda.so'; then
  echo "error: $bin does not link libtorch_cuda.so" >&2
  exit 1
fi
# It must load and run on a machine without a GPU too.
"$bin" info > /dev/null
echo "$bin"
