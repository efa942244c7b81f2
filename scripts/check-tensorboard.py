#!/usr/bin/env python3
"""Reads a run's TensorBoard event files with TensorBoard's own reader and checks them
against the run's metrics.jsonl.

    check-tensorboard.py RUN_DIR   RUN_DIR holds metrics.jsonl and tensorboard/

Every scalar the trainer logs must have exactly the steps and values of its
metrics.jsonl counterpart: one point per step (a resume duplicates none), values
equal to float32 precision. The resolved config must be there as text at each
attempt's first step. Prints one JSON line of what it checked; exits 1 on the first
disagreement, naming the tag and step.
"""
import json
import math
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

# metrics.jsonl step fields → TensorBoard tags.
STEP_TAGS = {
    "loss": "train/loss",
    "lr": "train/learning_rate",
    "gradNorm": "train/grad_norm",
    "tokensPerSecond": "train/tokens_per_second",
    "tokens": "train/tokens",
    "mfu": "train/mfu",
    "gpuMemoryPeakGiB": "gpu/peak_memory_gib",
}
ACCURACY_FIELDS = ("questions", "acc", "accStderr", "accNorm", "accNormStderr", "greedy", "unparsed")


def fail(message):
    print(f"check-tensorboard: {message}", file=sys.stderr)
    sys.exit(1)


def expected(records):
    """tag → [(step, value)] from metrics.jsonl, and the steps the config is due at."""
    want, config_steps = {}, []

    def add(tag, step, value):
        if value is not None:
            want.setdefault(tag, []).append((step, float(value)))

    for r in records:
        kind, step = r["kind"], r["step"]
        if kind in ("start", "resume"):
            config_steps.append(step)
        elif kind == "step":
            for field, tag in STEP_TAGS.items():
                add(tag, step, r.get(field))
            for field, value in (r.get("grpo") or {}).items():
                add(f"grpo/{field}", step, value)
        elif kind == "eval":
            add("val/loss", step, r["valLoss"])
            add("val/perplexity", step, r["perplexity"])
            for source, loss in r["perSource"].items():
                add(f"val/loss/{source}", step, loss)
                add(f"val/perplexity/{source}", step, math.exp(loss))
        elif kind == "accuracy":
            name = r.get("set", "held-out")
            prefix = "heldout" if name == "held-out" else "eval/" + name.replace("://", "/")
            for field in ACCURACY_FIELDS:
                add(f"{prefix}/{field}", step, r[field])
    return want, config_steps


def main():
    run = sys.argv[1]
    with open(f"{run}/metrics.jsonl") as f:
        records = [json.loads(line) for line in f if line.strip()]
    want, config_steps = expected(records)
    acc = EventAccumulator(f"{run}/tensorboard", size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    got_scalars = set(tags["scalars"])
    for tag in sorted(want):
        if tag not in got_scalars:
            fail(f"{tag}: in metrics.jsonl, missing from the event files")
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        steps = [s for s, _ in got]
        if steps != [s for s, _ in want[tag]]:
            fail(f"{tag}: steps {steps} in the event files, {[s for s, _ in want[tag]]} in metrics.jsonl")
        for (step, value), (_, expect) in zip(got, want[tag]):
            # The event files hold float32.
            both_nan = math.isnan(value) and math.isnan(expect)
            if not (both_nan or math.isclose(value, expect, rel_tol=1e-6, abs_tol=1e-37)):
                fail(f"{tag} at step {step}: {value} in the event files, {expect} in metrics.jsonl")
    extra = sorted(t for t in got_scalars - set(want) if not t.startswith("data/tokens/"))
    if extra:
        fail(f"scalars with no metrics.jsonl counterpart: {extra}")
    step_points = [s for s, _ in want.get("train/loss", [])]
    for tag in sorted(t for t in got_scalars if t.startswith("data/tokens/")):
        got = acc.Scalars(tag)
        if [e.step for e in got] != step_points:
            fail(f"{tag}: steps {[e.step for e in got]}, not the training steps")
        values = [e.value for e in got]
        if values != sorted(values):
            fail(f"{tag}: tokens per source go down: {values}")
    if "config" not in tags["tensors"]:
        fail("the resolved config is missing (tag 'config')")
    config = acc.Tensors("config")
    if [e.step for e in config] != config_steps:
        fail(f"config at steps {[e.step for e in config]}, attempts started at {config_steps}")
    text = config[-1].tensor_proto.string_val[0].decode()
    if '"schedule"' not in text:
        fail(f"the config text is not the resolved config: {text[:200]}")
    print(json.dumps({
        "dir": run,
        "scalar_tags": len(got_scalars),
        "points": sum(len(acc.Scalars(t)) for t in got_scalars),
        "configs": config_steps,
        "tags": sorted(got_scalars),
    }))


if __name__ == "__main__":
    main()
