#!/usr/bin/env python3
"""Runs TRL's own GRPOTrainer (the pin is in scripts/setup-pytorch-ref.sh) on GRPO
batches the trainer generated, and writes what TRL computed, for
trainer/tests/trl_parity.rs to compare.

    trl_parity.py CASE_DIR...

Each CASE_DIR holds:
- case.json: the GRPOConfig fields of the trainer's spec.grpo, the micro-batch, and
  `step`: 1 for a fresh batch, 2 for its second use (num_iterations 2);
- batch.safetensors: the trainer's batch (`BatchRecord::write`): prompt and completion
  ids, rewards;
- base/: the initial policy, exported with `trainer export --hf`. It sampled the batch,
  it is the reference model, and TRL's trainer starts from it;
- policy/ (step 2): the trainer's policy after step 1, exported. TRL's own optimizer step
  is replaced by it, so that both compute step 2 from the same weights.

TRL runs unmodified through `GRPOTrainer.train()`. `rollout_func` hands it the trainer's
prompt and completion ids instead of sampling, a reward function hands it the
trainer's rewards, and a callback reads every parameter's gradient before the optimizer
step. A profiler hook reads `_compute_loss`'s locals as it returns (the per-token log
probabilities, ratios, KL and losses); it changes no code.

Writes CASE_DIR/trl.safetensors. Per-row values are in the trainer's row order, and
per-token values are (rows, longest completion), 0 past a completion's end. It holds
advantages, logps, old_logps, ref_logps, coef_1, per_token_kl, per_token_loss,
entropies and completion_mask. It also holds the step's loss (the sum of what each
micro-batch backpropagated), num_items_in_batch, TRL's logged kl, entropy and
clip_ratio/{low,high,region}_mean (token-weighted over micro-batches as over ranks),
and grad.<HF key> for every parameter.
"""

import collections
import json
import os
import pathlib
import sys
import tempfile
import types

os.environ.update(
    HF_HUB_OFFLINE="1",
    HF_DATASETS_OFFLINE="1",
    HF_HUB_DISABLE_TELEMETRY="1",
    TRL_EXPERIMENTAL_SILENCE="1",
    TOKENIZERS_PARALLELISM="false",
)

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import AutoTokenizer, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

# Each micro-batch's metrics, token-weighted as TRL's global_masked_mean weights ranks.
METRICS = ["kl", "entropy", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"]


def unpad(row):
    return [int(t) for t in row if t >= 0]


def key(prompt, completion, pad):
    """A row's identity: its prompt and completion, padding stripped as TRL pads."""
    while prompt and prompt[0] == pad:
        prompt = prompt[1:]
    while completion and completion[-1] == pad:
        completion = completion[:-1]
    return tuple(prompt), tuple(completion)


class Spy:
    """Reads `_compute_loss`'s locals as it returns, and the metrics it logged."""

    def __init__(self, trainer):
        self.calls = []
        original = GRPOTrainer._compute_loss
        spy = self

        def compute_loss(self, model, inputs):
            seen = {}

            def profile(frame, event, arg):
                if event == "return" and frame.f_code is original.__code__:
                    seen.update(frame.f_locals)

            logged = {m: len(self._metrics["train"][m]) for m in METRICS}
            sys.setprofile(profile)
            try:
                loss = original(self, model, inputs)
            finally:
                sys.setprofile(None)
            copy = {k: v.detach().clone() for k, v in seen.items() if isinstance(v, torch.Tensor)}
            copy["inputs"] = {k: v.detach().clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
            copy["metrics"] = {m: self._metrics["train"][m][logged[m]:] for m in METRICS}
            copy["step"] = self.state.global_step
            spy.calls.append(copy)
            return loss

        trainer._compute_loss = types.MethodType(compute_loss, trainer)


class Steps(TrainerCallback):
    """Reads the gradients of step `step`, and puts the trainer's policy in place of
    TRL's own update after step 1."""

    def __init__(self, step, policy):
        self.step, self.policy, self.grads = step, policy, None

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if state.global_step + 1 == self.step:
            self.grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.policy is not None and state.global_step == 1:
            weights = load_file(self.policy / "model.safetensors")
            missing, unexpected = model.load_state_dict(weights, strict=False)
            tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
            if set(missing) - tied or unexpected:
                sys.exit(f"{self.policy}: missing {missing}, unexpected {unexpected}")


def run(case_dir):
    case = json.loads((case_dir / "case.json").read_text())
    batch = load_file(case_dir / "batch.safetensors")
    prompts = [unpad(r) for r in batch["prompt_ids"].tolist()]
    completions = [unpad(r) for r in batch["completion_ids"].tolist()]
    rewards = batch["rewards"].tolist()
    group = case["num_generations"]
    rows = len(prompts)
    base = case_dir / "base"
    tokenizer = AutoTokenizer.from_pretrained(base, padding_side="left")
    pad = tokenizer.pad_token_id

    def rollout(texts, trainer):
        taken = collections.Counter()
        order = []
        for text in texts:
            prompt = int(text.split()[-1])
            order.append(prompt * group + taken[prompt])
            taken[prompt] += 1
        return {
            "prompt_ids": [prompts[r] for r in order],
            "completion_ids": [completions[r] for r in order],
            "logprobs": None,
            "row": order,
        }

    def trainer_reward(completions, row, **kwargs):
        return [rewards[r] for r in row]

    step = case["step"]
    steps = Steps(step, case_dir / "policy" if step == 2 else None)
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out,
            use_cpu=True,
            bf16=False,
            gradient_checkpointing=False,
            per_device_train_batch_size=case["micro_batch"],
            gradient_accumulation_steps=rows // case["micro_batch"],
            num_generations=group,
            num_iterations=case["num_iterations"],
            loss_type=case["loss_type"],
            scale_rewards=case["scale_rewards"],
            beta=case["beta"],
            epsilon=case["epsilon"],
            epsilon_high=case["epsilon_high"],
            temperature=case["temperature"],
            top_p=1.0,
            max_completion_length=case["max_completion_length"],
            mask_truncated_completions=case["mask_truncated_completions"],
            off_policy_mask_threshold=case["off_policy_mask_threshold"],
            use_bias_correction_kl=case["use_bias_correction_kl"],
            max_steps=step,
            max_grad_norm=0.0,
            learning_rate=1e-3,
            lr_scheduler_type="constant",
            disable_dropout=True,
            save_strategy="no",
            logging_steps=1,
            report_to="none",
            seed=0,
        )
        trainer = GRPOTrainer(
            model=str(base),
            reward_funcs=trainer_reward,
            args=args,
            train_dataset=Dataset.from_dict({"prompt": [f"prompt {p}" for p in range(rows // group)]}),
            processing_class=tokenizer,
            rollout_func=rollout,
            callbacks=[steps],
        )
        spy = Spy(trainer)
        trainer.train()
    calls = [c for c in spy.calls if c["step"] == step - 1]
    if steps.grads is None or len(calls) != rows // case["micro_batch"]:
        sys.exit(f"{case_dir}: expected step {step}'s {rows // case['micro_batch']} micro-batches, got {len(calls)}")

    # TRL's rows (shuffled after scoring) back in the trainer's order.
    where = collections.defaultdict(list)
    for r in range(rows):
        where[key(prompts[r], completions[r], pad)].append(r)
    width = max(len(c) for c in completions)
    per_row = {}
    per_token = collections.defaultdict(lambda: torch.zeros(rows, width, dtype=torch.float32))
    placed = 0
    for call in calls:
        inputs = call["inputs"]
        for i in range(inputs["prompt_ids"].size(0)):
            prompt = inputs["prompt_ids"][i][inputs["prompt_mask"][i].bool()].tolist()
            r = where[key(prompt, inputs["completion_ids"][i].tolist(), pad)].pop()
            n = len(completions[r])
            per_row.setdefault("advantages", torch.zeros(rows, dtype=torch.float64))[r] = float(inputs["advantages"][i])
            tensors = {
                "logps": call["per_token_logps"],
                "per_token_loss": call["per_token_loss"],
                "coef_1": call["coef_1"].expand_as(call["per_token_logps"]),
                "entropies": call["entropies"],
                "completion_mask": inputs["completion_mask"].float(),
            }
            for name, source in [("old_logps", "old_per_token_logps"), ("ref_logps", "ref_per_token_logps")]:
                if source in inputs:
                    tensors[name] = inputs[source]
            if "per_token_kl" in call:
                tensors["per_token_kl"] = call["per_token_kl"]
            for name, t in tensors.items():
                per_token[name][r, :n] = t[i, :n].float()
            placed += 1
    if placed != rows:
        sys.exit(f"{case_dir}: matched {placed} of {rows} rows")

    out = {**per_row, **dict(per_token)}
    out["loss"] = torch.tensor(sum(float(c["loss"]) for c in calls), dtype=torch.float64)
    out["num_items_in_batch"] = torch.tensor(float(calls[0]["inputs"]["num_items_in_batch"]), dtype=torch.float64)
    tokens = [float(c["mask"].sum()) for c in calls]
    for m in METRICS:
        values = [c["metrics"][m] for c in calls]
        if all(len(v) == 1 for v in values):
            weighted = sum(v[0] * t for v, t in zip(values, tokens)) / max(sum(tokens), 1.0)
            out[m.replace("/", ".")] = torch.tensor(weighted, dtype=torch.float64)
    for name, g in steps.grads.items():
        out[f"grad.{name}"] = g.float().contiguous()
    save_file({k: v.contiguous() for k, v in out.items()}, str(case_dir / "trl.safetensors"))
    print(f"{case_dir.name}: TRL loss {float(out['loss']):.8g}, {len(steps.grads)} gradients")


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    for case_dir in sys.argv[1:]:
        run(pathlib.Path(case_dir).resolve())


if __name__ == "__main__":
    main()
