#!/usr/bin/env bash
# The main job, the seeds' two phases on a laptop: `trainer run examples/tiny-local.yaml`
# pretrains the nano preset on the embedded corpus with two data-parallel CPU ranks
# (Gloo), then `trainer run examples/tiny-grpo-local.yaml` fine-tunes its checkpoint
# with GRPO on the embedded rule questions; a few minutes on 2 CPU cores. Installs
# PyTorch 2.11.0 (CPU) on first use and builds the trainer. Checkpoints and
# metrics.jsonl go to runs/tiny-local/ and runs/tiny-grpo-local/; a rerun resumes each
# phase from its newest checkpoint.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/env.sh
scripts/claim-target.sh
scripts/setup-debian.sh
LIBTORCH="$(scripts/setup-libtorch.sh cpu)"
export LIBTORCH
# The dev profile, as `make test` builds it: one build serves both, and the demo's time
# is libtorch's (dependencies are built with opt-level 2; see docs/perf.md).
cargo build -p trainer --locked
trainer="$CARGO_TARGET_DIR/debug/trainer"
"$trainer" run examples/tiny-local.yaml "$@"
"$trainer" plot runs/tiny-local/metrics.jsonl
"$trainer" run examples/tiny-grpo-local.yaml
