#!/usr/bin/env bash
# `trainer prepare` against Hugging Face `tokenizers` in Python (batch encode), on the
# same jsonl file and the same tokenizer, on this machine. The text is every
# /usr/share/doc/*/copyright file (~17 MB of real licence and copyright prose, one
# document each), repeated to --mb megabytes. Prints MB/s of both and the ratio.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/env.sh
mb="${1:-64}"
LIBTORCH="$(scripts/setup-libtorch.sh cpu)"
export LIBTORCH
python="$(scripts/setup-pytorch-ref.sh)"   # the full torch venv, which has `tokenizers`
cargo build -q --release --locked -p trainer
trainer="$CARGO_TARGET_DIR/release/trainer"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$python" - "$work/input.jsonl" "$mb" <<'PY'
import glob, json, sys
out, mb = sys.argv[1], float(sys.argv[2])
docs = [open(p, encoding="utf-8", errors="replace").read() for p in sorted(glob.glob("/usr/share/doc/*/copyright"))]
written = 0
with open(out, "w") as f:
    while written < mb * 1e6:
        for d in docs:
            line = json.dumps({"text": d})
            f.write(line + "\n")
            written += len(line) + 1
PY
# A BPE of 32K tokens trained on the first 16 MB, shared by both sides.
"$trainer" prepare -i "$work/input.jsonl" --train-tokenizer --vocab-size 32768 --tokenizer-sample-bytes 16M \
  --shard-tokens 1M --validation-fraction 0 -o "$work/tok" > /dev/null
rust_line="$("$trainer" prepare -i "$work/input.jsonl" --tokenizer "$work/tok/tokenizer.json" \
  --validation-fraction 0.005 -o "$work/out")"
echo "trainer prepare: $rust_line"
rust_mbs="$(echo "$rust_line" | sed -E 's/.*\(([0-9.]+) MB\/s\).*/\1/')"
"$python" - "$work/input.jsonl" "$work/tok/tokenizer.json" "$rust_mbs" <<'PY'
import json, os, sys, time
from tokenizers import Tokenizer
path, tok_path, rust = sys.argv[1], sys.argv[2], float(sys.argv[3])
tok = Tokenizer.from_file(tok_path)
start = time.perf_counter()
n_bytes, n_tokens, batch = 0, 0, []
def flush():
    global n_tokens
    for e in tok.encode_batch(batch, add_special_tokens=False):
        n_tokens += len(e.ids) + 1
    batch.clear()
with open(path) as f:
    for line in f:
        n_bytes += len(line)
        batch.append(json.loads(line)["text"])
        if len(batch) == 1000:
            flush()
flush()
dt = time.perf_counter() - start
py = n_bytes / 1e6 / dt
print(f"python tokenizers encode_batch: {n_bytes/1e6:.1f} MB in {dt:.1f} s ({py:.1f} MB/s), {n_tokens} tokens, {os.cpu_count()} cores")
print(f"trainer prepare / python tokenizers: {rust / py:.2f}x")
PY
