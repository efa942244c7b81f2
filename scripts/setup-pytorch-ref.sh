#!/usr/bin/env bash
# A Python with an importable torch 2.11.0, transformers and tensorboard, for the
# proofs against PyTorch (AdamW goldens, Hugging Face logits parity,
# torch_reference.py) and TensorBoard's own event-file reader. It is the
# full torch wheel's venv (the small CPU venv cannot import torch). Prints its python.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/env.sh"
"$here/setup-libtorch.sh" cuda >/dev/null
if ! "$PT_VENV_CUDA/bin/python" -c "import transformers, numpy, safetensors, tensorboard" 2>/dev/null; then
  "$PT_VENV_CUDA/bin/pip" install --quiet --disable-pip-version-check "transformers==5.23.0" numpy "tensorboard==2.20.0" >&2
fi
echo "$PT_VENV_CUDA/bin/python"
