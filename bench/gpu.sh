#!/usr/bin/env bash
# GPU throughput, one job: the trainer against ../shared/reference/torch_reference.py
# (PyTorch eager and torch.compile) on the same GPU, presets, micro-batch and sequence,
# back to back, with a correctness check first. Prints a table of tokens/s, MFU and peak
# memory with the ratios of issue 10 (≥ 1.2× eager, ≥ 1.0× compile, MFU ≥ 50% on xlarge)
# and writes every JSON line to $OUT/gpu-bench.jsonl when $OUT is set.
#
#   bench/gpu.sh                          # builds the cuda trainer here (scripts/build-cuda.sh)
#   TRAINER=path/to/trainer bench/gpu.sh  # a prebuilt one (LD_LIBRARY_PATH to torch/lib)
#   PRESETS="medium-large:8 xlarge:8" SEQ=2048 STEPS=20 bench/gpu.sh
#   GRAPH_PRESETS="tiny:8 small:8"        # also the trainer with --cuda-graph ("" for none)
#   MAX_MB_PRESETS="xlarge:8" MEM_LIMIT_GIB=80 bench/gpu.sh   # the largest micro-batch that
#                                          # fits 80 GiB, trainer and eager (doubling from 8, then bisecting)
#   MAX_MB_RECOMPUTE=1                     # the search also for the trainer with --gradient-checkpointing
#   CHECK=0 bench/gpu.sh                   # skip the correctness check (a later call of a split job)
#   DEVICE=cpu COMPILE=0 CHECK_ARGS="..."   # a dry run of this script without a GPU (bench/gpu-test.sh;
#                                          # its figures mean nothing, and --compile is skipped)
# The reference is bench/torch_reference.py, a verbatim copy of ../shared/reference/torch_reference.py
# (bench/gpu-test.sh fails when they differ), so that the job runs where ../shared is not.
# One device command may run 10 minutes: split the presets over calls (docs/perf.md, runbook).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PRESETS="${PRESETS-medium-large:8 xlarge:8}"
GRAPH_PRESETS="${GRAPH_PRESETS-tiny:8 small:8}"
MAX_MB_PRESETS="${MAX_MB_PRESETS:-}" MEM_LIMIT_GIB="${MEM_LIMIT_GIB:-80}" CHECK="${CHECK:-1}"
MAX_MB_RECOMPUTE="${MAX_MB_RECOMPUTE:-0}"
SEQ="${SEQ:-2048}" STEPS="${STEPS:-20}" WARMUP="${WARMUP:-5}"
DEVICE="${DEVICE:-cuda}" COMPILE="${COMPILE:-1}"
CHECK_ARGS="${CHECK_ARGS:---preset tiny --micro-batch 4 --seq 512 --steps 10 --warmup 2}"
PYTHON="${PYTHON:-python3}"
REFERENCE="${TORCH_REFERENCE:-bench/torch_reference.py}"
if [ -z "${TRAINER:-}" ]; then
  TRAINER="$(scripts/build-cuda.sh --release)"
fi
torch_lib="$("$PYTHON" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
export LD_LIBRARY_PATH="$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Each row is written as soon as it is measured, so a call cut off at the device's limit
# still brings back what it finished.
if [ -n "${OUT:-}" ]; then
  results="$OUT/gpu-bench.jsonl"
else
  results="$(mktemp)"
  trap 'rm -f "$results"' EXIT
fi
if [ "$DEVICE" = cuda ]; then
  "$PYTHON" -c 'import torch; assert torch.cuda.is_available(), "no CUDA device"; print("GPU:", torch.cuda.get_device_name(), "torch", torch.__version__)'
else
  echo "a dry run on $DEVICE: these figures say nothing about issue 10's goals"
fi
dev=(--device "$DEVICE")

run() { # label, command...
  local label="$1"; shift
  echo "== $label: $*" >&2
  local line
  if line="$("$@" | tail -n 1)" &&
    echo "$line" | "$PYTHON" -c 'import json,sys; d=json.loads(sys.stdin.read()); d["label"]=sys.argv[1]; print(json.dumps(d))' "$label" >> "$results"; then
    return
  fi
  echo "{\"label\": \"$label\", \"failed\": true}" >> "$results"
}

# fits MB CMD...: CMD --micro-batch MB runs (0), runs out of memory (1), or fails
# otherwise (2, with its stderr's tail).
fits() {
  local mb="$1"; shift
  local err
  if err="$("$@" --micro-batch "$mb" 2>&1 >/dev/null)"; then return 0; fi
  if grep -qiE "out of memory|OutOfMemoryError" <<<"$err"; then return 1; fi
  echo "$err" | tail -n 5 >&2
  return 2
}

# largest LABEL START CMD...: the largest micro-batch that fits, doubling from START
# until one does not (up to 4096), then bisecting; recorded as a JSON line.
largest() {
  local label="$1" mb="$2"; shift 2
  local good=0 bad=0 rc
  echo "== $label: largest micro-batch from $mb" >&2
  while :; do
    rc=0; fits "$mb" "$@" || rc=$?
    case $rc in
      0) good=$mb; mb=$((mb * 2)); [ "$mb" -le 4096 ] || break ;;
      1) bad=$mb; break ;;
      *) echo "{\"label\": \"$label\", \"failed\": true}" >> "$results"; return ;;
    esac
  done
  while [ "$bad" -gt 0 ] && [ $((bad - good)) -gt 1 ]; do
    mb=$(((good + bad) / 2))
    rc=0; fits "$mb" "$@" || rc=$?
    case $rc in
      0) good=$mb ;;
      1) bad=$mb ;;
      *) echo "{\"label\": \"$label\", \"failed\": true}" >> "$results"; return ;;
    esac
  done
  echo "{\"label\": \"$label\", \"largest_micro_batch\": $good, \"first_oom\": $bad, \"memory_limit_gib\": $MEM_LIMIT_GIB}" >> "$results"
}

# The reference under the same cap (torch.cuda.set_per_process_memory_fraction; none on CPU).
capped_reference() {
  "$PYTHON" -c 'import runpy, sys, torch
limit = float(sys.argv[1]) * 2**30
if sys.argv[2] == "cuda":
    torch.cuda.set_per_process_memory_fraction(min(1.0, limit / torch.cuda.get_device_properties(0).total_memory))
sys.argv = sys.argv[3:]
runpy.run_path(sys.argv[0], run_name="__main__")' "$MEM_LIMIT_GIB" "$DEVICE" "$REFERENCE" "$@"
}

# Correctness: both sides train a small model on random tokens to a similar loss.
if [ "$CHECK" = 1 ]; then
  read -ra check <<<"$CHECK_ARGS"
  run check-trainer "$TRAINER" bench "${check[@]}" "${dev[@]}" --precision bf16-mixed
  run check-reference "$PYTHON" "$REFERENCE" "${check[@]}" "${dev[@]}"
fi

for pm in $PRESETS $GRAPH_PRESETS; do
  preset="${pm%%:*}" mb="${pm##*:}"
  common=(--preset "$preset" --micro-batch "$mb" --seq "$SEQ" --steps "$STEPS" --warmup "$WARMUP" "${dev[@]}")
  run "$preset trainer" "$TRAINER" bench "${common[@]}" --precision bf16-mixed
  case " $GRAPH_PRESETS " in
    *" $pm "*) run "$preset graph" "$TRAINER" bench "${common[@]}" --precision bf16-mixed --cuda-graph ;;
  esac
  run "$preset eager" "$PYTHON" "$REFERENCE" "${common[@]}"
  if [ "$COMPILE" = 1 ]; then
    run "$preset compile" "$PYTHON" "$REFERENCE" "${common[@]}" --compile
  fi
done

for pm in $MAX_MB_PRESETS; do
  preset="${pm%%:*}" mb="${pm##*:}"
  short=(--preset "$preset" --seq "$SEQ" --steps 1 --warmup 1 "${dev[@]}")
  largest "$preset max-mb trainer" "$mb" "$TRAINER" bench "${short[@]}" --precision bf16-mixed --memory-limit-gib "$MEM_LIMIT_GIB"
  if [ "$MAX_MB_RECOMPUTE" = 1 ]; then
    largest "$preset max-mb trainer-recompute" "$mb" "$TRAINER" bench "${short[@]}" --precision bf16-mixed \
      --memory-limit-gib "$MEM_LIMIT_GIB" --gradient-checkpointing
  fi
  largest "$preset max-mb eager" "$mb" capped_reference "${short[@]}"
done

"$PYTHON" - "$results" <<'PY'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {r["label"]: r for r in rows}
ok = True
a, b = by.get("check-trainer", {}), by.get("check-reference", {})
if not a and not b:
    print("correctness check skipped (CHECK=0)")
elif a.get("failed") or b.get("failed") or not all(math.isfinite(x.get("final_loss", float("nan"))) for x in (a, b)):
    print("correctness check FAILED: a run failed or its loss is not finite"); ok = False
elif abs(a["final_loss"] - b["final_loss"]) > 0.5:
    print(f"correctness check FAILED: losses {a['final_loss']:.3f} vs {b['final_loss']:.3f}"); ok = False
else:
    print(f"correctness: tiny on random tokens, final loss {a['final_loss']:.3f} (trainer) vs {b['final_loss']:.3f} (eager)")
print(f"{'preset':<14}{'impl':<10}{'tokens/s':>12}{'MFU':>8}{'peak GiB':>10}{'backend':>12}")
presets = [l.split()[0] for l in by if l.endswith(" trainer") and " max-mb " not in l]
for p in dict.fromkeys(presets):
    for impl in ("trainer", "graph", "eager", "compile"):
        if impl in ("graph", "compile") and f"{p} {impl}" not in by:
            continue
        r = by.get(f"{p} {impl}", {})
        if r.get("failed") or not r:
            print(f"{p:<14}{impl:<10}{'failed':>12}"); ok = False; continue
        print(f"{p:<14}{impl:<10}{r['tokens_per_s']:>12,.0f}{100*r['mfu']:>7.1f}%{(r.get('peak_mem_gib') or 0):>10.2f}{r.get('attention_backend', ''):>12}")
        for key in ("attention", "swiglu", "rope", "norm", "loss"):
            if r.get(f"{key}_trials"):
                print(f"{'':<14}{key} auto chose {r[key]}: " + "; ".join(
                    f"{t['candidate']} {t['ms']:.3f} ms" if t["ms"] is not None else f"{t['candidate']} rejected ({t.get('rejected')})"
                    for t in r[f"{key}_trials"]))
    t, e, c = (by.get(f"{p} {i}", {}) for i in ("trainer", "eager", "compile"))
    if all(x and not x.get("failed") for x in (t, e)):
        ratios = [f"trainer / eager {t['tokens_per_s']/e['tokens_per_s']:.3f} (goal ≥ 1.2)"]
        if c and not c.get("failed"):
            ratios.append(f"/ compile {t['tokens_per_s']/c['tokens_per_s']:.3f} (goal ≥ 1.0)")
        if t.get("peak_mem_gib") is not None and e.get("peak_mem_gib") is not None:
            ratios.append(f"peak memory {t['peak_mem_gib']:.2f} vs {e['peak_mem_gib']:.2f} GiB (goal ≤ eager)")
        print(f"{'':<14}" + ", ".join(ratios))
    g = by.get(f"{p} graph", {})
    if g and not g.get("failed") and t and not t.get("failed"):
        print(f"{'':<14}CUDA graph / plain trainer {g['tokens_per_s']/t['tokens_per_s']:.3f}, "
              f"final loss {g['final_loss']:.3f} vs {t['final_loss']:.3f}")
for label, r in by.items():
    if " max-mb " in label:
        if r.get("failed"):
            print(f"{label}: FAILED (not an out-of-memory error)"); ok = False
        else:
            print(f"{label}: largest micro-batch {r['largest_micro_batch']} under {r['memory_limit_gib']} GiB "
                  f"(first out of memory: {r['first_oom'] or 'none up to 4096'})")
sys.exit(0 if ok else 1)
PY
