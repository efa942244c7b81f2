#!/usr/bin/env bash
# Runs cargo against the full PyTorch 2.11.0 wheel's libtorch (--features cuda builds).
#
# The CPU and CUDA builds share one target directory, and torch-sys's build script reads
# $LIBTORCH: were both one unit, each build would recompile torch-sys, tch and the trainer
# after the other (~4.5 min on 2 cores, twice a `.ci/run`). A profile setting of
# torch-sys's own gives the CUDA builds their own torch-sys unit (cargo keys a unit by its
# profile), so both stay compiled and switching costs a relink. The value itself does not
# matter; it only has to differ from the CPU builds'.
#   scripts/cargo-cuda.sh test --workspace --features trainer/cuda --lib
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/env.sh
LIBTORCH="$(scripts/setup-libtorch.sh cuda)"
export LIBTORCH
exec cargo \
  --config 'profile.dev.package.torch-sys.codegen-units=17' \
  --config 'profile.release.package.torch-sys.codegen-units=17' \
  "$@"
