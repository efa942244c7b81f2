#!/usr/bin/env python3
"""Uses `trainer export --hf` directories as a transformers user would, without the run:
AutoTokenizer, AutoModelForCausalLM and pipeline("text-generation") load them, and
greedy generation continues a prompt exactly as `trainer generate --temperature 0`.

    hf_export_check.py CASES.json   a list of {"dir", "prompt", "max_new_tokens",
                                    "expected"}, where expected is what
                                    `trainer generate` printed (prompt + continuation)

Prints one JSON line per directory; exits 1 when any check fails.
"""
import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline


def check(case):
    path, prompt, new = case["dir"], case["prompt"], case["max_new_tokens"]
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    problems = []
    eos = model.generation_config.eos_token_id
    if tok.eos_token_id != eos or tok.pad_token_id != eos:
        problems.append(f"tokenizer EOS/PAD {tok.eos_token_id}/{tok.pad_token_id}, generation config EOS {eos}")
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False)
    continuation = out[0, ids.shape[1]:].tolist()
    if eos in continuation:
        continuation = continuation[: continuation.index(eos)]
    text = prompt + tok.decode(continuation, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    if text != case["expected"]:
        problems.append(f"greedy: transformers {text!r}, trainer {case['expected']!r}")
    generator = pipeline("text-generation", model=path, dtype=torch.float32)
    piped = generator(prompt, max_new_tokens=new, do_sample=False)[0]["generated_text"]
    if piped != case["expected"]:
        problems.append(f"pipeline: {piped!r}, trainer {case['expected']!r}")
    return {
        "dir": path,
        "class": type(model).__name__,
        "tokenizer": type(tok).__name__,
        "fast": tok.is_fast,
        "new_tokens": len(continuation),
        "ok": not problems,
        "problems": problems,
    }


def main():
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    results = [check(c) for c in cases]
    for r in results:
        print(json.dumps(r))
    sys.exit(0 if results and all(r["ok"] for r in results) else 1)


if __name__ == "__main__":
    main()
