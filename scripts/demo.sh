#!/usr/bin/env bash
# The main job: `trainer run examples/tiny-local.yaml`, a local training run of the
# nano preset on the embedded corpus with two data-parallel CPU ranks (Gloo), a
# few minutes on 2 CPU cores. Installs
# PyTorch 2.11.0 (CPU) on first use and builds the trainer. Checkpoints and
# metrics.jsonl go to runs/tiny-local/; a rerun resumes from the newest checkpoint.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/env.sh
scripts/setup-debian.sh
LIBTORCH="$(scripts/setup-libtorch.sh cpu)"
export LIBTORCH
cargo build --release -p trainer --locked
trainer="$CARGO_TARGET_DIR/release/trainer"
"$trainer" run examples/tiny-local.yaml "$@"
"$trainer" plot runs/tiny-local/metrics.jsonl
