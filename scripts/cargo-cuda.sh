#!/usr/bin/env bash
# Runs cargo against the full PyTorch 2.11.0 wheel's libtorch (--features cuda builds).
#
# The CPU and CUDA builds share one target directory, but torch-sys's build script reads
# $LIBTORCH: with the same unit for both, each build after the other recompiled torch-sys,
# tch and the trainer (~4.5 min on 2 cores, twice per `.ci/run`). A profile setting of
# torch-sys's own gives the CUDA builds their own torch-sys unit (cargo keys a unit by its
# profile), so both stay compiled and switching costs a relink. The value itself does not
# matter; it only has to differ from the CPU builds'.
#   scripts/cargo-cuda.sh build -p trainer --features cuda
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/env.sh
LIBTORCH="$(scripts/setup-libtorch.sh cuda)"
export LIBTORCH
exec cargo \
  --config 'profile.dev.package.torch-sys.codegen-units=17' \
  --config 'profile.release.package.torch-sys.codegen-units=17' \
  "$@"
