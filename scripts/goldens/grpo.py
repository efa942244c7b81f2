#!/usr/bin/env python3
"""Golden values for trainer::grpo::loss from a transcription of TRL's GRPOTrainer
(advantages in `_generate_and_score_completions`, the loss in `_compute_loss`) in
torch, f32 on CPU, plus DeepSeek-V3.2's two additions (the KL weighted by the
importance ratio, and off-policy sequence masking).

Inputs come from closed-form formulas (no RNG) that the Rust test rebuilds. Each loss
case gives the loss, its gradient with respect to the policy log-probabilities, the
summed KL and the clipped-token counts. Writes trainer/tests/goldens/grpo.json.

    python scripts/goldens/grpo.py           # regenerate the committed file
    python scripts/goldens/grpo.py --check   # exit 1 if torch disagrees with it
"""

import math
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from adamw import write_or_check  # noqa: E402

OUT = pathlib.Path(__file__).resolve().parents[2] / "trainer/tests/goldens/grpo.json"
CHECK_ATOL = 1e-6

B, T, G = 8, 5, 4
LENGTHS = [5, 3, 1, 4, 5, 2, 0, 3]
REWARDS = [0.99, 0.0, -0.02, 0.97, 0.0, 0.98, 0.0, -0.01]
# Three groups of four; the middle one has equal rewards.
ADV_REWARDS = [1.0, 0.0, 0.98, 0.0, 0.5, 0.5, 0.5, 0.5, 0.99, 0.0, 0.0, 0.96]
MAX_COMPLETION_LENGTH = 6
TEMPERATURE = 0.7


def grid(f, *shape):
    """A tensor of `shape` whose element at index (i, j, ...) is f(i, j, ...)."""
    idx = torch.cartesian_prod(*[torch.arange(n) for n in shape]).reshape(-1, len(shape)).tolist()
    return torch.tensor([f(*i) for i in idx], dtype=torch.float64).reshape(*shape).float()


def inputs():
    logp = grid(lambda b, t: -0.5 - 0.3 * abs(math.sin(0.7 * b + 1.1 * t)), B, T)
    old = grid(lambda b, t: 0.25 * math.sin(1.3 * b - 0.4 * t), B, T) + logp
    ref = grid(lambda b, t: 0.3 * math.cos(0.9 * b + 0.5 * t), B, T) + logp
    mask = grid(lambda b, t: 1.0 if t < LENGTHS[b] else 0.0, B, T)
    return logp, old, ref, mask


def trl_advantages(rewards, scale):
    """TRL: rewards − group mean, over (std + 1e-4) of the group or the batch."""
    rewards = torch.tensor(rewards, dtype=torch.float32)
    mean = rewards.view(-1, G).mean(dim=1).repeat_interleave(G, dim=0)
    adv = rewards - mean
    if scale == "group":
        std = rewards.view(-1, G).std(dim=1).repeat_interleave(G, dim=0)
    elif scale == "batch":
        std = rewards.std().expand_as(rewards)
    else:
        return adv
    return adv / (std + 1e-4)


def trl_loss(case, logp, old, ref, mask, adv):
    """TRL's _compute_loss, with DeepSeek-V3.2's options."""
    per_token_logps = logp
    old_per_token_logps = per_token_logps.detach() if not case["old"] else old
    coef_1 = torch.exp(per_token_logps - old_per_token_logps)
    coef_2 = torch.clamp(coef_1, 1 - case["eps_low"], 1 + case["eps_high"])
    a = adv.unsqueeze(1)
    per_token_loss = -torch.min(coef_1 * a, coef_2 * a)
    kl_sum = 0.0
    if case["beta"] != 0.0:
        per_token_kl = torch.exp(ref - per_token_logps) - (ref - per_token_logps) - 1
        if case["unbiased_kl"]:
            per_token_kl = per_token_kl * coef_1
        kl_sum = (per_token_kl.detach() * mask).sum().item()
        per_token_loss = per_token_loss + case["beta"] * per_token_kl
    keep = torch.ones(B)
    masked = 0.0
    if case["delta"] is not None:
        drift = ((old_per_token_logps - per_token_logps.detach()) * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        drop = (drift > case["delta"]) & (adv < 0)
        masked = drop.float().sum().item()
        keep = keep * (~drop).float()
    per_token_loss = per_token_loss * keep.unsqueeze(1)
    lt = case["loss_type"]
    if lt == "grpo":
        loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif lt == "bnpo":
        loss = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    else:
        loss = (per_token_loss * mask).sum() / (per_token_loss.size(0) * MAX_COMPLETION_LENGTH)
    low = ((coef_1 < 1 - case["eps_low"]) & (a < 0)).float()
    high = ((coef_1 > 1 + case["eps_high"]) & (a > 0)).float()
    return loss, kl_sum, (low * mask).sum().item(), (high * mask).sum().item(), masked


def cases():
    out = []
    for lt in ["grpo", "bnpo", "dr_grpo"]:
        out.append(dict(name=f"{lt}-fresh", loss_type=lt, beta=0.04, eps_low=0.2, eps_high=0.2, old=False))
        out.append(dict(name=f"{lt}-reused", loss_type=lt, beta=0.04, eps_low=0.2, eps_high=0.28, old=True))
        out.append(dict(name=f"{lt}-no-kl", loss_type=lt, beta=0.0, eps_low=0.2, eps_high=0.2, old=True))
    out.append(dict(name="grpo-unbiased-kl", loss_type="grpo", beta=0.04, eps_low=0.2, eps_high=0.2, old=True, unbiased_kl=True))
    out.append(dict(name="grpo-off-policy-mask", loss_type="grpo", beta=0.04, eps_low=0.2, eps_high=0.2, old=True, delta=0.05))
    for c in out:
        c.setdefault("unbiased_kl", False)
        c.setdefault("delta", None)
    return out


def generate():
    torch.set_grad_enabled(True)
    logp0, old, ref, mask = inputs()
    adv = trl_advantages(REWARDS, "group")
    doc = {"torch": torch.__version__, "advantages": {}, "loss": []}
    for scale in ["group", "batch", "none"]:
        doc["advantages"][scale] = trl_advantages(ADV_REWARDS, scale).tolist()
    for case in cases():
        logp = logp0.clone().requires_grad_(True)
        loss, kl_sum, low, high, masked = trl_loss(case, logp, old, ref, mask, adv)
        loss.backward()
        doc["loss"].append({
            **case,
            "loss": loss.item(),
            "grad": logp.grad.flatten().tolist(),
            "kl_sum": kl_sum,
            "clipped_low": low,
            "clipped_high": high,
            "off_policy_masked": masked,
        })
    logits = grid(lambda b, t, v: 2.0 * math.sin(0.3 * b + 0.7 * t + 1.1 * v), 2, 3, 7)
    targets = torch.tensor([[(b + 2 * t) % 7 for t in range(3)] for b in range(2)])
    logps = torch.log_softmax(logits / TEMPERATURE, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    doc["token_logps"] = logps.flatten().tolist()
    return doc


def main() -> int:
    return write_or_check(OUT, generate(), CHECK_ATOL, __doc__)


if __name__ == "__main__":
    sys.exit(main())
