# Sourced by the Makefile and .ci/run: where the project's caches live.
# Everything heavy (venvs, cargo target dirs) sits under ~/.cache so a reused
# machine rebuilds incrementally, and a fresh one builds from empty.
PT_CACHE="${PT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/puretransformer}"
PT_VENV_CPU="$PT_CACHE/venv-cpu"
PT_VENV_CUDA="$PT_CACHE/venv-cuda"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PT_CACHE/target}"
