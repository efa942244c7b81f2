#!/usr/bin/env bash
# A Python with an importable torch 2.11.0, transformers and tensorboard, for the
# proofs against PyTorch (AdamW goldens, Hugging Face logits parity,
# torch_reference.py) and TensorBoard's own event-file reader, and with the reference
# tools themselves: TRL (tests/trl_parity.rs) and lm-evaluation-harness
# (tests/lm_eval_parity.rs). It is the full torch wheel's venv (the small CPU venv
# cannot import torch). Prints its python. The pins are named in the README; TRL and
# lm_eval resolve against the installed torch and transformers without moving them.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/env.sh"
"$here/setup-libtorch.sh" cuda >/dev/null
pins=("transformers==5.23.0" numpy "tensorboard==2.20.0" "trl==1.16.0" "lm_eval[hf]==0.4.13")
check='
import sys
from importlib.metadata import version
for pin in sys.argv[1:]:
    name, _, want = pin.partition("==")
    assert not want or version(name.split("[")[0]) == want, pin
import numpy, safetensors, tensorboard, transformers, trl, lm_eval
'
if ! "$PT_VENV_CUDA/bin/python" -c "$check" "${pins[@]}" 2>/dev/null; then
  "$PT_VENV_CUDA/bin/pip" install --quiet --disable-pip-version-check "${pins[@]}" >&2
fi
echo "$PT_VENV_CUDA/bin/python"
