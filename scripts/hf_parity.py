#!/usr/bin/env python3
"""Loads `trainer export --hf` directories with Hugging Face transformers and checks
their logits against the trainer's.

    hf_parity.py DIR...   each DIR holds config.json, model.safetensors and
                          parity.safetensors (input_ids, logits from the trainer)
                          and optionally packed.safetensors (below)

packed.safetensors is a window of several documents (`spec.data.packing: documents`):
`window` (B, T + 1) token ids, each document ending at `eos`; `logits` (B, T, vocab)
of its first T tokens with per-document attention; and `loss`, the trainer's
training loss of the window. Each document is run alone through transformers: its
logits must equal the packed ones, and the token-weighted mean of the documents'
next-token losses must equal the trainer's (the prediction from an `eos` crosses into
the next document and counts for none).

Prints one JSON line per directory; exits 1 when any max |Δlogit| exceeds 1e-4 or a
loss differs by more than 1e-5 relative.
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

TOLERANCE = 1e-4
LOSS_TOLERANCE = 1e-5


def packed(model, path):
    ref = load_file(f"{path}/packed.safetensors")
    window, eos = ref["window"], int(ref["eos"])
    t = window.size(1) - 1
    worst, total, count, docs = 0.0, 0.0, 0, 0
    with torch.no_grad():
        for row in range(window.size(0)):
            s = window[row]
            start = 0
            for p in range(t):
                if s[p] != eos and p + 1 < t:
                    continue
                doc = s[start : p + 1]
                logits = model(doc.unsqueeze(0)).logits[0]  # the document alone
                worst = max(worst, (logits - ref["logits"][row, start : p + 1]).abs().max().item())
                logp = torch.log_softmax(logits.double(), dim=-1)
                for q in range(start, p + 1):
                    if s[q] != eos:
                        total -= logp[q - start, s[q + 1]].item()
                        count += 1
                docs += 1
                start = p + 1
    loss = total / count
    rel = abs(loss - float(ref["loss"])) / abs(loss)
    return {
        "documents": docs,
        "packed_max_abs_diff": worst,
        "loss": float(ref["loss"]),
        "hf_loss": loss,
        "loss_rel_diff": rel,
        "packed_ok": worst <= TOLERANCE and rel <= LOSS_TOLERANCE,
    }


def check(path):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    ref = load_file(f"{path}/parity.safetensors")
    with torch.no_grad():
        logits = model(ref["input_ids"]).logits
    diff = (logits - ref["logits"]).abs().max().item()
    result = {"dir": path, "class": type(model).__name__, "max_abs_diff": diff, "ok": diff <= TOLERANCE}
    if not os.path.exists(f"{path}/packed.safetensors"):
        return result
    extra = packed(model, path)
    result.update(extra)
    result["ok"] = result["ok"] and extra["packed_ok"]
    return result


def main():
    results = [check(p) for p in sys.argv[1:]]
    for r in results:
        print(json.dumps(r))
    sys.exit(0 if results and all(r["ok"] for r in results) else 1)


if __name__ == "__main__":
    main()
