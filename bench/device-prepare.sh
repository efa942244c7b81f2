#!/usr/bin/env bash
# Prepares .device/ (git-ignored; carried with `carry: [".device"]`) for one lent-GPU
# session of bench/device-session.sh: the release --features cuda trainer xz'd (41 MB →
# 9 MB: the device's carry limit is 64 MiB), and the demo's trained checkpoint with its
# model weights only (bench-generate --checkpoint reads nothing else), and
# bench/prepare_scaling.py's corpus and tokenizer, and the library's CUDA unit tests. The device's
# Python has torch and transformers, so no wheels travel. Prints what it wrote.
#
#   bench/device-prepare.sh        # ~17 min on 2 cores from empty, ~1 min warm
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/env.sh
trainer="$(scripts/build-cuda.sh --release)"
mkdir -p .device
xz -T2 -6 -c "$trainer" > .device/trainer.xz
if [ ! -f runs/tiny-local/latest ]; then
  LD_LIBRARY_PATH="$(scripts/setup-libtorch.sh cuda)/lib" "$trainer" run examples/tiny-local.yaml >&2
fi
# bench/prepare_scaling.py's corpus (licence prose, 16 jsonl files) and a 32K BPE trained on
# 16 MB of it, as bench/suite.py's prepare row trains one; 143 MB xz'd to about 2.8 MB.
if [ ! -f .device/prepare-corpus.tar.xz ] || [ ! -f .device/prepare-tokenizer.json ]; then
  scratch="$(mktemp -d)"
  python3 bench/prepare_scaling.py corpus --out "$scratch/corpus" --mb 128 --files 16 >&2
  LD_LIBRARY_PATH="$(scripts/setup-libtorch.sh cuda)/lib" "$trainer" prepare -i "$scratch/corpus" \
    --step tokenizer --train-tokenizer --vocab-size 32768 --tokenizer-sample-bytes 16M \
    -o "$scratch/tok" >&2
  cp "$scratch/tok/tokenizer.json" .device/prepare-tokenizer.json
  tar -C "$scratch" -cf - corpus | xz -T2 -6 > .device/prepare-corpus.tar.xz
  rm -rf "$scratch"
fi
# The library's unit tests built with --features cuda, for the GPU-only ones
# (ffi::varlen's varlen flash attention against SDPA per document).
# The workspace, as scripts/build-cuda.sh selects it, so the two share one feature resolution.
scripts/cargo-cuda.sh test --workspace --features trainer/cuda --release --locked --lib --no-run \
  --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["lib"] and m["target"]["name"] == "trainer":
        print(m["executable"])' > /tmp/trainer-tests-path
strip -o /tmp/trainer-tests "$(cat /tmp/trainer-tests-path)"
xz -T2 -6 -c /tmp/trainer-tests > .device/trainer-tests.xz
step="$(cat runs/tiny-local/latest)"
rm -rf .device/tiny-local
mkdir -p ".device/tiny-local/$step"
cp runs/tiny-local/run.json runs/tiny-local/latest .device/tiny-local/
cp "runs/tiny-local/$step/model.safetensors" "runs/tiny-local/$step/state.json" ".device/tiny-local/$step/"
du -sh .device/*
