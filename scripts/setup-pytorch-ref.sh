#!/usr/bin/env bash
# A Python with an importable torch 2.11.0 and transformers, for the proofs against
# PyTorch (AdamW goldens, Hugging Face logits parity, torch_reference.py). It is the
# full torch wheel's venv (the small CPU venv cannot import torch). Prints its python.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/env.sh"
"$here/setup-libtorch.sh" cuda >/dev/null
if ! "$PT_VENV_CUDA/bin/python" -c "import transformers, numpy, safetensors" 2>/dev/null; then
  "$PT_VENV_CUDA/bin/pip" install --quiet --disable-pip-version-check "transformers==5.23.0" numpy >&2
fi
echo "$PT_VENV_CUDA/bin/python"
