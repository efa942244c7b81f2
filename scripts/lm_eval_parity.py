#!/usr/bin/env python3
"""Runs lm-evaluation-harness's own `hf` model (the pin is in
scripts/setup-pytorch-ref.sh) on local multiple-choice tasks, and writes what it
computed, for trainer/tests/lm_eval_parity.rs to compare with `trainer eval`.

    lm_eval_parity.py MODEL_DIR TASKS_DIR OUT.json TASK...

MODEL_DIR is a model exported with `trainer export --hf`. TASKS_DIR holds the task
YAMLs the test wrote from the fixture files. lm_eval runs them unmodified: on the CPU,
in f32, one request at a time, with its default few-shot seed (1234).

OUT.json maps each task to its `acc` and `acc_norm`, and to its samples in doc order.
Each sample has the doc, the context, the continuation and log-likelihood of every
choice, the target, acc and acc_norm.
"""

import json
import os
import sys

os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1")

import lm_eval  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402


def main():
    model_dir, tasks_dir, out, *tasks = sys.argv[1:]
    results = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={model_dir},dtype=float32,device=cpu",
        tasks=tasks,
        task_manager=TaskManager(include_path=tasks_dir, include_defaults=False),
        batch_size=1,
        log_samples=True,
        bootstrap_iters=0,
    )
    report = {}
    for task in tasks:
        samples = sorted(results["samples"][task], key=lambda s: s["doc_id"])
        report[task] = {
            "acc": results["results"][task]["acc,none"],
            "acc_norm": results["results"][task]["acc_norm,none"],
            "samples": [
                {
                    "doc_id": s["doc_id"],
                    "doc": s["doc"],
                    "context": s["arguments"][0][0],
                    "contexts": [a[0] for a in s["arguments"]],
                    "continuations": [a[1] for a in s["arguments"]],
                    "loglikelihoods": [float(r[0]) for r in s["filtered_resps"]],
                    "target": int(s["target"]),
                    "acc": s["acc"],
                    "acc_norm": s["acc_norm"],
                }
                for s in samples
            ],
        }
    with open(out, "w") as f:
        json.dump(report, f)
    print(" ".join(f"{t}: acc {r['acc']:.4f} acc_norm {r['acc_norm']:.4f}" for t, r in report.items()))


if __name__ == "__main__":
    main()
