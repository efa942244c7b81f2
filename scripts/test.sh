#!/usr/bin/env bash
# Runs every test on a fresh machine: installs PyTorch 2.11.0 (CPU) and the Python
# validators into ~/.cache/puretransformer, then runs the Rust tests and validates the
# CRD and the examples. `make test` runs this.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/env.sh
LIBTORCH="$(scripts/setup-libtorch.sh cpu)"
export LIBTORCH
scripts/setup-pytools.sh
cargo test --workspace --locked
"$PT_VENV_CPU/bin/python" scripts/validate-manifests.py
