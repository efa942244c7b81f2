#!/usr/bin/env bash
# Builds the trainer with --features cuda against the full PyTorch 2.11.0 wheel
# (compile and link only; no GPU needed), so the GPU path never rots. Prints the
# binary's path. Extra arguments go to cargo, e.g. --release.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/env.sh
scripts/setup-debian.sh
# The same target directory and the same feature resolution as `make test`'s build
# (scripts/test.sh): the ~400 dependencies are shared, and torch-sys, tch and the
# trainer have a CUDA copy of their own (scripts/cargo-cuda.sh). Cargo resolves features
# from the packages an invocation selects, with dev-dependencies only when it builds a
# test target: `-p trainer`, or the binary alone, would enable different features in ~20
# shared packages (chrono, kube, ...) and compile their ~200 dependents again (~5 min on
# 2 cores). So this selects the workspace and one small test target of the trainer's.
scripts/cargo-cuda.sh build --workspace --features trainer/cuda --bin trainer --test libtorch --locked "$@" >&2
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
