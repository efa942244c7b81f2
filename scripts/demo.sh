#!/usr/bin/env bash
# The main job: a local run of examples/tiny-local.yaml on the embedded corpus.
# Installs PyTorch 2.11.0 (CPU) on first use, builds the trainer, and runs it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/env.sh
LIBTORCH="$(scripts/setup-libtorch.sh cpu)"
export LIBTORCH
cargo build --release -p trainer --locked
trainer="$CARGO_TARGET_DIR/release/trainer"
"$trainer" info
"$trainer" resolve examples/tiny-local.yaml
