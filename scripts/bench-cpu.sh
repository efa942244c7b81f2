#!/usr/bin/env bash
# CPU benchmark: `trainer bench` against ../shared/reference/torch_reference.py on the
# same preset, shape and machine, back to back, and their step-time ratio.
#   scripts/bench-cpu.sh [preset] [micro-batch] [seq] [steps]
# The reference has no nano/micro rows; they are added to its table from ours.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/env.sh
preset="${1:-micro}" mb="${2:-8}" seq="${3:-256}" steps="${4:-10}"
LIBTORCH="$(scripts/setup-libtorch.sh cpu)"
export LIBTORCH
python="$(scripts/setup-pytorch-ref.sh)"
reference="${TORCH_REFERENCE:-../shared/reference/torch_reference.py}"
cargo build --release -p trainer --locked -q
trainer="$CARGO_TARGET_DIR/release/trainer"
ours="$("$trainer" bench --device cpu --precision f32 --preset "$preset" --micro-batch "$mb" --seq "$seq" --steps "$steps" --warmup 3)"
theirs="$("$python" - "$reference" "$preset" "$mb" "$seq" "$steps" <<'PY'
import importlib.util, subprocess, sys, json
path, preset, mb, seq, steps = sys.argv[1:]
spec = importlib.util.spec_from_file_location("torch_reference", path)
ref = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ref)
# name: arch, layers, d_model, n_head, n_kv_head, d_head, d_ff, vocab, rope_theta, tied
ref.PRESETS.setdefault("nano", ("llama", 2, 128, 4, 2, 32, 384, 2048, 1e4, False))
ref.PRESETS.setdefault("micro", ("llama", 6, 384, 6, 2, 64, 768, 2048, 1e4, False))
sys.argv = ["torch_reference.py", "--device", "cpu", "--precision", "f32", "--preset", preset,
            "--micro-batch", mb, "--seq", seq, "--steps", steps, "--warmup", "3"]
ref.main()
PY
)"
echo "$ours"
echo "$theirs"
"$python" - "$ours" "$theirs" <<'PY'
import json, sys
ours, theirs = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(json.dumps({"preset": ours["preset"], "trainer_step_ms": round(ours["step_ms"], 1),
                  "reference_step_ms": round(theirs["step_ms"], 1),
                  "step_time_ratio": round(ours["step_ms"] / theirs["step_ms"], 3),
                  "loss_trainer": ours["final_loss"], "loss_reference": theirs["final_loss"]}))
PY
