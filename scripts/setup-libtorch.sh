#!/usr/bin/env bash
# Installs PyTorch 2.11.0 from PyPI into a project-local venv and prints the
# LIBTORCH path that tch =0.24.0 builds against. Idempotent: a venv that
# already has the right torch is reused.
#
#   scripts/setup-libtorch.sh cpu    # ~550 MB: torch without its CUDA deps (enough for CPU)
#   scripts/setup-libtorch.sh cuda   # ~4.6 GB: full torch + NCCL/CUDA headers, for --features cuda
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$here/env.sh"
kind="${1:-cpu}"
TORCH_VERSION=2.11.0
case "$kind" in
  cpu)  venv="$PT_VENV_CPU"
        # libtorch_cpu.so needs libcudart and libcupti even on CPU; it finds them by its own RPATH.
        pkgs=(--no-deps "torch==$TORCH_VERSION" nvidia-cuda-runtime==13.0.96 nvidia-cuda-cupti==13.0.85) ;;
  cuda) venv="$PT_VENV_CUDA"
        # crt/host_config.h and nv/target are needed by the NCCL headers of c10d.
        pkgs=("torch==$TORCH_VERSION" "nvidia-cuda-crt==13.0.88.*" "nvidia-cuda-cccl==13.0.85.*") ;;
  *) echo "usage: $0 cpu|cuda" >&2; exit 2 ;;
esac
mkdir -p "$(dirname "$venv")"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
if ! "$venv/bin/python" -c "import importlib.metadata as m,sys; sys.exit(m.version('torch').split('+')[0] != '$TORCH_VERSION')" 2>/dev/null \
   || { [ "$kind" = cuda ] && ! "$venv/bin/python" -c "import importlib.metadata as m; m.version('nvidia-cuda-cccl')" 2>/dev/null; }; then
  "$venv/bin/pip" install --quiet --disable-pip-version-check "${pkgs[@]}" >&2
fi
"$venv/bin/python" - <<'PY'
import pathlib, sysconfig
print(pathlib.Path(sysconfig.get_paths()["purelib"]) / "torch")
PY
