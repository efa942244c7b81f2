#!/usr/bin/env python3
"""Loads `trainer export --hf` directories with Hugging Face transformers and checks
their logits against the trainer's.

    hf_parity.py DIR...   each DIR holds config.json, model.safetensors and
                          parity.safetensors (input_ids, logits from the trainer)

Prints one JSON line per directory; exits 1 when any max |Δlogit| exceeds 1e-4.
"""
import json
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

TOLERANCE = 1e-4


def check(path):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    ref = load_file(f"{path}/parity.safetensors")
    with torch.no_grad():
        logits = model(ref["input_ids"]).logits
    diff = (logits - ref["logits"]).abs().max().item()
    return {"dir": path, "class": type(model).__name__, "max_abs_diff": diff, "ok": diff <= TOLERANCE}


def main():
    results = [check(p) for p in sys.argv[1:]]
    for r in results:
        print(json.dumps(r))
    sys.exit(0 if results and all(r["ok"] for r in results) else 1)


if __name__ == "__main__":
    main()
