#!/usr/bin/env python3
"""Golden values for trainer::optim::AdamW from torch.optim.AdamW (f32, CPU).

Params and grads come from closed-form formulas (no RNG) that the Rust test
rebuilds; each of 3 steps runs clip_grad_norm_(max_norm=1.0) then AdamW with
weight decay only on params with dim >= 2. One param never gets a grad and must
stay untouched. Writes trainer/tests/goldens/adamw.json.

    python scripts/goldens/adamw.py           # regenerate the committed file
    python scripts/goldens/adamw.py --check   # exit 1 if torch disagrees with it
"""

import argparse
import json
import math
import pathlib
import sys

import torch

OUT = pathlib.Path(__file__).resolve().parents[2] / "trainer/tests/goldens/adamw.json"
CHECK_ATOL = 1e-7

LR, BETAS, EPS, WEIGHT_DECAY, MAX_NORM = 1e-3, (0.9, 0.95), 1e-8, 0.1, 1.0
# Step 1 and 3 are clipped (norm ~5 and ~10); step 2 is not (norm ~0.25).
GRAD_SCALES = [1.0, 0.05, 2.0]

# name, shape, init(i) over the flat index i; values are computed in f64, then f32.
PARAMS = [
    ("proj.weight", [7, 5], lambda i: 0.5 * math.sin(0.37 * i + 0.1)),
    ("norm.weight", [5], lambda i: 1.0 + 0.1 * math.cos(0.5 * i)),
    ("proj.bias", [7], lambda i: 0.05 * i - 0.15),
    ("unused.weight", [3, 2], lambda i: 0.25 - 0.1 * i),
]


def grad_value(param_index: int, i: int, step: int) -> float:
    """Grad of flat element i of PARAMS[param_index] at step (1-based)."""
    return GRAD_SCALES[step - 1] * math.cos(0.23 * i + 0.7 * step + 1.3 * param_index)


def fill(shape, f) -> torch.Tensor:
    n = math.prod(shape)
    return torch.tensor([f(i) for i in range(n)], dtype=torch.float64).to(torch.float32).reshape(shape)


def flat(t: torch.Tensor) -> list:
    return [float(x) for x in t.detach().reshape(-1).tolist()]


def generate() -> dict:
    params = [torch.nn.Parameter(fill(shape, f)) for _, shape, f in PARAMS]
    used = [p for (name, _, _), p in zip(PARAMS, params) if name != "unused.weight"]
    opt = torch.optim.AdamW(
        [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": WEIGHT_DECAY},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=LR,
        betas=BETAS,
        eps=EPS,
        foreach=False,
    )
    doc = {
        "generator": "scripts/goldens/adamw.py",
        "torch": torch.__version__,
        "config": {
            "lr": LR,
            "beta1": BETAS[0],
            "beta2": BETAS[1],
            "eps": EPS,
            "weight_decay": WEIGHT_DECAY,
            "max_norm": MAX_NORM,
            "grad_scales": GRAD_SCALES,
        },
        "init": {name: {"shape": shape, "values": flat(p)} for (name, shape, _), p in zip(PARAMS, params)},
        "steps": [],
    }
    for step in range(1, len(GRAD_SCALES) + 1):
        for k, ((name, shape, _), p) in enumerate(zip(PARAMS, params)):
            p.grad = None if name == "unused.weight" else fill(shape, lambda i: grad_value(k, i, step))
        norm = torch.nn.utils.clip_grad_norm_(used, MAX_NORM)
        opt.step()
        doc["steps"].append(
            {
                "pre_clip_norm": float(norm),
                "params": {name: flat(p) for (name, _, _), p in zip(PARAMS, params)},
            }
        )
    return doc


def max_diff(a, b, path="") -> float:
    """Largest absolute difference between two JSON trees of the same structure."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            raise ValueError(f"{path}: keys differ: {sorted(a)} vs {sorted(b)}")
        return max([max_diff(a[k], b[k], f"{path}.{k}") for k in a] or [0.0])
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            raise ValueError(f"{path}: lengths differ: {len(a)} vs {len(b)}")
        return max([max_diff(x, y, f"{path}[{i}]") for i, (x, y) in enumerate(zip(a, b))] or [0.0])
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(float(a) - float(b))
    if a != b:
        raise ValueError(f"{path}: {a!r} vs {b!r}")
    return 0.0


def write_or_check(out: pathlib.Path, doc: dict, atol: float, description: str) -> int:
    """The golden scripts' command line: write `doc` to `out`, or with --check compare
    it with the committed file (numbers within `atol`, everything else equal)."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help=f"compare with {out.name} instead of writing it")
    args = ap.parse_args()
    if not args.check:
        out.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {out}")
        return 0
    committed = json.loads(out.read_text())
    # The torch version string may differ between the CPU and CUDA wheels; the numbers may not.
    committed.pop("torch", None)
    doc.pop("torch", None)
    try:
        diff = max_diff(committed, doc)
    except ValueError as e:
        print(f"{out}: structure differs from torch's output: {e}", file=sys.stderr)
        return 1
    if diff > atol:
        print(f"{out}: differs from torch {torch.__version__} by {diff:.3g} (> {atol}); regenerate", file=sys.stderr)
        return 1
    print(f"{out.name} matches torch {torch.__version__} (max abs diff {diff:.3g})")
    return 0


def main() -> int:
    return write_or_check(OUT, generate(), CHECK_ATOL, __doc__)


if __name__ == "__main__":
    sys.exit(main())
