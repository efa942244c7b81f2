#!/usr/bin/env bash
# `make bench`: bench/suite.py, every performance row against its peer in one run, with
# what it needs: the release trainer, the full torch venv (transformers, tokenizers),
# trainer/csrc/memory.cpp built against that torch for the peers' allocator count, and
# the operator's benchmark.
#   bench/suite.sh [--smoke] [--only step,memory,generate,checkpoint,prepare,loader,operator] [--json FILE]
# TRAINER=path and OPERATOR_BENCH='command' replace the builds (scripts/test.sh runs
# --smoke with the debug binaries).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/env.sh
LIBTORCH="$(scripts/setup-libtorch.sh cpu)"
export LIBTORCH
python="$(scripts/setup-pytorch-ref.sh)"
if [ -z "${TRAINER:-}" ]; then
  cargo build -q --release --locked -p trainer
  TRAINER="$CARGO_TARGET_DIR/release/trainer"
fi
OPERATOR_BENCH="${OPERATOR_BENCH:-cargo build -q --release --locked -p operator && cargo bench -q --locked -p e2e --bench operator}"

# The allocator count the trainer links (trainer/csrc/memory.cpp), built as a library
# against the peers' torch, keyed by its sources.
torch_dir="$("$python" -c 'import os, torch; print(os.path.dirname(torch.__file__))')"
abi="$("$python" -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')"
key="$(cat trainer/csrc/memory.cpp trainer/csrc/guarded.h | sha256sum | cut -c1-16)"
hostmem="$PT_CACHE/bench/libhostmem-$key.so"
if [ ! -f "$hostmem" ]; then
  mkdir -p "$PT_CACHE/bench"
  g++ -O2 -std=c++17 -shared -fPIC -D_GLIBCXX_USE_CXX11_ABI="$abi" -I"$torch_dir/include" \
    trainer/csrc/memory.cpp -L"$torch_dir/lib" -lc10 -Wl,-rpath,"$torch_dir/lib" -o "$hostmem.tmp"
  mv "$hostmem.tmp" "$hostmem"
fi
exec "$python" bench/suite.py run --trainer "$TRAINER" --hostmem "$hostmem" --operator-bench "$OPERATOR_BENCH" "$@"
