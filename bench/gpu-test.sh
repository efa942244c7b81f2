#!/usr/bin/env bash
# Tests bench/gpu.sh without a GPU, so that a lent device's minutes are not spent on the
# script's own bugs:
#  1. bench/torch_reference.py is still a verbatim copy of ../shared/reference (when present);
#  2. a dry run on CPU of the real trainer against the real reference (tiny, 32 tokens):
#     the JSON both print is what the table reads, and the ratio line comes out;
#  3. with stand-ins that run out of memory above a known micro-batch: the search finds
#     exactly that micro-batch for the trainer, the trainer with recompute and the reference;
#  4. a failure that is not out of memory, and a correctness check whose losses differ,
#     make the job fail and say so.
#   TRAINER=target/debug/trainer PYTHON=venv/bin/python bench/gpu-test.sh   (scripts/test.sh runs it)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TRAINER="${TRAINER:-${CARGO_TARGET_DIR:-target}/debug/trainer}"
PYTHON="${PYTHON:-${TRAINER_TEST_PYTHON:-python3}}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "bench/gpu-test.sh: $*" >&2; exit 1; }

shared=../shared/reference/torch_reference.py
if [ -f "$shared" ]; then
  cmp -s "$shared" bench/torch_reference.py || fail "bench/torch_reference.py differs from $shared: copy it again"
fi

# 2. The real programs on CPU.
mkdir "$tmp/real"
DEVICE=cpu COMPILE=0 PRESETS="tiny:1" GRAPH_PRESETS="" SEQ=32 STEPS=2 WARMUP=1 \
  CHECK_ARGS="--preset tiny --micro-batch 1 --seq 32 --steps 3 --warmup 1" \
  TRAINER="$TRAINER" PYTHON="$PYTHON" OUT="$tmp/real" bench/gpu.sh >"$tmp/real.txt" 2>"$tmp/real.err" ||
  { cat "$tmp/real.txt" "$tmp/real.err"; fail "the dry run on CPU failed"; }
grep -q '^correctness: tiny on random tokens' "$tmp/real.txt" || fail "no correctness line: $(cat "$tmp/real.txt")"
grep -qE '^ +trainer / eager [0-9.]+ \(goal ≥ 1.2\)$' "$tmp/real.txt" || fail "no ratio line: $(cat "$tmp/real.txt")"
"$PYTHON" - "$tmp/real/gpu-bench.jsonl" <<'PY' || fail "the dry run's JSON lines"
import json, sys
rows = {r["label"]: r for r in map(json.loads, open(sys.argv[1]))}
assert sorted(rows) == ["check-reference", "check-trainer", "tiny eager", "tiny trainer"], sorted(rows)
for label, r in rows.items():
    assert not r.get("failed") and r["tokens_per_s"] > 0 and r["preset"] == "tiny", r
    assert r["device"] == "cpu" and r["seq"] == 32, r
assert rows["tiny trainer"]["micro_batch"] == 1 and rows["tiny trainer"]["attention_backend"], rows["tiny trainer"]
# bf16-mixed autocasts on CUDA only (train::precision_plan); the reference autocasts on CPU too.
assert rows["tiny trainer"]["matmul_dtype"] == "Float", rows["tiny trainer"]
# auto is timed on CUDA only.
assert rows["tiny trainer"]["attention"] == "auto" and rows["tiny trainer"]["attention_trials"] is None, rows["tiny trainer"]
for op in ("swiglu", "rope"):
    assert rows["tiny trainer"][op] == "composed" and rows["tiny trainer"][f"{op}_trials"] is None, rows["tiny trainer"]
PY

# 3. and 4. Stand-ins: out of memory above FITS (the trainer's is FITS_RECOMPUTE with
# --gradient-checkpointing), another failure above BREAK, and a final loss of LOSS.
cat >"$tmp/trainer" <<'SH'
#!/usr/bin/env bash
[ "$1" = bench ] || exit 64
mb=8 fits=$FITS
while [ $# -gt 0 ]; do
  case "$1" in
    --micro-batch) mb="$2"; shift ;;
    --gradient-checkpointing) fits=$FITS_RECOMPUTE ;;
  esac
  shift
done
if [ "$mb" -gt "${BREAK:-100000}" ]; then echo "thread 'main' panicked: index out of bounds" >&2; exit 101; fi
if [ "$mb" -gt "$fits" ]; then echo "Error: torch: CUDA out of memory. Tried to allocate 2.00 GiB" >&2; exit 1; fi
echo "{\"preset\": \"tiny\", \"tokens_per_s\": 1200.0, \"mfu\": 0.5, \"peak_mem_gib\": 1.0, \"final_loss\": ${LOSS:-10.0}, \"attention_backend\": \"CuDnn\", \"attention\": \"cudnn\", \"attention_trials\": [{\"candidate\": \"flash\", \"ms\": 3.41, \"error\": 0.004}, {\"candidate\": \"cudnn\", \"ms\": 1.83, \"error\": 0.005}], \"swiglu\": \"composed\", \"swiglu_trials\": [{\"candidate\": \"composed\", \"ms\": 0.52, \"error\": 0.0}, {\"candidate\": \"fused\", \"ms\": null, \"error\": null, \"rejected\": \"failed: nvrtc\"}], \"rope\": \"fused\", \"rope_trials\": [{\"candidate\": \"composed\", \"ms\": 0.31, \"error\": 0.0}, {\"candidate\": \"fused\", \"ms\": 0.09, \"error\": 0.004}]}"
SH
cat >"$tmp/reference.py" <<'PY'
import argparse, json
ap = argparse.ArgumentParser()
for a in ("--preset", "--seq", "--steps", "--warmup", "--device"):
    ap.add_argument(a)
ap.add_argument("--micro-batch", type=int)
ap.add_argument("--compile", action="store_true")
args = ap.parse_args()
if args.micro_batch > 21:
    raise SystemExit("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB")
print(json.dumps({"preset": args.preset, "tokens_per_s": 1000.0 if not args.compile else 1500.0,
                  "mfu": 0.4, "peak_mem_gib": 2.0, "final_loss": 10.0}))
PY
chmod +x "$tmp/trainer"
fake() { # bench/gpu.sh with the stand-ins on CPU; the environment picks the case
  DEVICE=cpu GRAPH_PRESETS="" TRAINER="$tmp/trainer" TORCH_REFERENCE="$tmp/reference.py" PYTHON="$PYTHON" \
    FITS=37 FITS_RECOMPUTE=100 env "$@" bench/gpu.sh 2>/dev/null
}

out="$(fake CHECK=0 PRESETS="tiny:8" MAX_MB_PRESETS="tiny:8" MAX_MB_RECOMPUTE=1)" || fail "the stand-in run failed: $out"
for want in \
  "tiny          trainer 1,200 50.0% 1.00 CuDnn" \
  "attention auto chose cudnn: flash 3.410 ms; cudnn 1.830 ms" \
  "swiglu auto chose composed: composed 0.520 ms; fused rejected (failed: nvrtc)" \
  "rope auto chose fused: composed 0.310 ms; fused 0.090 ms" \
  "trainer / eager 1.200 (goal ≥ 1.2), / compile 0.800 (goal ≥ 1.0), peak memory 1.00 vs 2.00 GiB (goal ≤ eager)" \
  "tiny max-mb trainer: largest micro-batch 37 under 80 GiB (first out of memory: 38)" \
  "tiny max-mb trainer-recompute: largest micro-batch 100 under 80 GiB (first out of memory: 101)" \
  "tiny max-mb eager: largest micro-batch 21 under 80 GiB (first out of memory: 22)"; do
  tr -s ' ' <<<"$out" | grep -qF -- "$(tr -s ' ' <<<"$want")" || fail "missing '$want' in:
$out"
done

if out="$(fake CHECK=0 PRESETS="" MAX_MB_PRESETS="tiny:8" BREAK=16)"; then fail "a crash that is not out of memory passed: $out"; fi
grep -qF "tiny max-mb trainer: FAILED (not an out-of-memory error)" <<<"$out" || fail "no FAILED line: $out"
# PRESETS="" measures no preset (the runbook's calls that only search or only graph).
if grep -qE "^(medium-large|xlarge) " <<<"$out"; then fail "PRESETS=\"\" still ran the default presets: $out"; fi

if out="$(fake PRESETS="" LOSS=12.5)"; then fail "losses 12.5 vs 10.0 passed the correctness check: $out"; fi
grep -qF "correctness check FAILED: losses 12.500 vs 10.000" <<<"$out" || fail "no correctness failure: $out"

# bench/profile_step.py (the runbook's profile of eager and compile), eager on CPU: it runs
# and groups every op it profiled.
out="$("$PYTHON" bench/profile_step.py --device cpu --no-compile --preset tiny --micro-batch 1 --seq 32 --steps 1 --warmup 1 \
  --precision f32 2>/dev/null)" || fail "bench/profile_step.py failed"
"$PYTHON" -c 'import json,sys; r=json.loads(sys.stdin.read()); g=r["groups_ms_per_step"]
assert r["impl"] == "torch-eager" and r["kernel_ms_per_step"] > 0 and abs(sum(g.values()) - r["kernel_ms_per_step"]) < 0.01 * len(g), r
assert "matmul" in g or "other" in g, g' <<<"$out" || fail "bench/profile_step.py printed: $out"

echo "bench/gpu.sh: dry run on CPU, micro-batch search and failure reports ok; bench/profile_step.py runs"
