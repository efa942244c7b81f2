#!/usr/bin/env bash
# One lent-GPU call, prepared by bench/device-prepare.sh: the measurements still open
# (docs/perf.md, "Issue 42 measured on a lent H100"), most important first. Each step
# gets what is left of BUDGET seconds and is skipped when less than its estimate is
# left, so the call ends inside the device's limit with what it finished. Every step's
# output goes to one file, $OUT/session.txt (the device brings back at most 8 files).
#
#   run(command="bash bench/device-session.sh", carry=[".device"], timeout_s=600)
#   STEPS="kernels gpu-xl" bash bench/device-session.sh   # only these steps
#   STEPS=prepare PREPARE_ARGS="--cores 2,16 --workers 8" bash bench/device-session.sh
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
START=$(date +%s)
BUDGET="${BUDGET:-560}"
OUT="${OUT:-/tmp/device-session}"
mkdir -p "$OUT"
LOG="$OUT/session.txt"
STEPS="${STEPS:-documents prepare kernels gpu-xl generate parity memory gpu-ml}"
python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('.device/trainer.xz'), open('/tmp/trainer', 'wb'))"
chmod +x /tmp/trainer
export TRAINER=/tmp/trainer
torch_lib="$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
export LD_LIBRARY_PATH="$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
} >> "$LOG" 2>&1

left() { echo $((BUDGET - ($(date +%s) - START))); }
# step NAME ESTIMATE COMMAND...: runs COMMAND if ESTIMATE seconds are left.
step() {
  local name="$1" est="$2" l t0 rc
  shift 2
  case " $STEPS " in *" $name "*) ;; *) return ;; esac
  l=$(left)
  if [ "$l" -lt "$est" ]; then
    echo "== $name: skipped, $l s left of the ~$est it needs" >> "$LOG"
    return
  fi
  echo "== $name: $*" >> "$LOG"
  t0=$(date +%s)
  timeout "$l" "$@" >> "$LOG" 2>&1
  rc=$?
  echo "== $name: rc=$rc in $(($(date +%s) - t0)) s" >> "$LOG"
}
kernels() {
  "$TRAINER" bench-kernels --preset medium-large --micro-batch 8 --seq 2048 &&
    "$TRAINER" bench-kernels --preset xlarge --micro-batch 8 --seq 2048
}
generate() {
  "$TRAINER" bench-generate --device cuda --preset medium-large --batch 128 --prompt-tokens 512 \
    --new-tokens 512 --hf-dir /tmp/hf-ml &&
    python3 bench/suite.py peer-generate --threads 8 --dir /tmp/hf-ml --repeats 1 --device cuda \
      --dtype bfloat16 --cache static
}
# trainer prepare's scaling with a worker's cores and with workers on their own cores,
# on the corpus and tokenizer bench/device-prepare.sh packed (the 2-core VM's rows'
# corpus), and HF tokenizers on all cores: the paper model of docs/perf.md, measured.
prepare() {
  rm -rf /tmp/pscal && mkdir -p /tmp/pscal &&
    tar -C /tmp/pscal -xJf .device/prepare-corpus.tar.xz &&
    python3 bench/prepare_scaling.py run --trainer "$TRAINER" --corpus /tmp/pscal/corpus \
      --tokenizer .device/prepare-tokenizer.json --work /tmp/pscal/work \
      ${PREPARE_ARGS:---cores 1,2,4,8,16 --workers 1,2,4,8 --cores-per-worker 2 --peer}
}
# spec.data.packing: documents on the GPU: the varlen flash unit test (its output and
# q/k/v gradients against SDPA on each document alone, bf16, grouped K/V), then the
# step against concat on medium-large, whose packed logits are first checked against
# each document run alone (documents_max_rel_diff).
documents() {
  python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('.device/trainer-tests.xz'), open('/tmp/trainer-tests', 'wb'))" &&
    chmod +x /tmp/trainer-tests && /tmp/trainer-tests --test-threads 1 ffi::varlen &&
    "$TRAINER" bench --device cuda --preset medium-large --micro-batch 8 --seq 2048 --steps 10 --warmup 3 &&
    "$TRAINER" bench --device cuda --preset medium-large --micro-batch 8 --seq 2048 --steps 10 --warmup 3 \
      --documents 512
}
export -f kernels generate prepare documents
step documents 150 bash -c documents
step prepare 150 bash -c prepare
step kernels 40 bash -c kernels
step gpu-xl 280 env PRESETS="xlarge:8" GRAPH_PRESETS="" CHECK=0 STEPS=10 WARMUP=3 bench/gpu.sh
step generate 260 bash -c generate
step parity 20 "$TRAINER" bench-generate --device cuda --checkpoint .device/tiny-local --batch 128 \
  --prompt-tokens 128 --new-tokens 128
step memory 60 "$TRAINER" bench-memory --device cuda --presets medium-large,xlarge --micro-batches 8 --seq 2048 \
  --parallelism ddp --checkpointing false
step gpu-ml 170 env PRESETS="medium-large:8" GRAPH_PRESETS="" CHECK=0 STEPS=10 WARMUP=3 bench/gpu.sh
tail -n 60 "$LOG"
