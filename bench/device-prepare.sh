#!/usr/bin/env bash
# Prepares .device/ (git-ignored; carried with `carry: [".device"]`) for one lent-GPU
# session of bench/device-session.sh: the release --features cuda trainer xz'd (41 MB →
# 9 MB: the device's carry limit is 64 MiB), and the demo's trained checkpoint with its
# model weights only (bench-generate --checkpoint reads nothing else). The device's
# Python has torch and transformers, so no wheels travel. Prints what it wrote.
#
#   bench/device-prepare.sh        # ~17 min on 2 cores from empty, ~1 min warm
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/env.sh
trainer="$(scripts/build-cuda.sh --release)"
mkdir -p .device
xz -T2 -6 -c "$trainer" > .device/trainer.xz
if [ ! -f runs/tiny-local/latest ]; then
  LD_LIBRARY_PATH="$(scripts/setup-libtorch.sh cuda)/lib" "$trainer" run examples/tiny-local.yaml >&2
fi
step="$(cat runs/tiny-local/latest)"
rm -rf .device/tiny-local
mkdir -p ".device/tiny-local/$step"
cp runs/tiny-local/run.json runs/tiny-local/latest .device/tiny-local/
cp "runs/tiny-local/$step/model.safetensors" "runs/tiny-local/$step/state.json" ".device/tiny-local/$step/"
du -sh .device/*
