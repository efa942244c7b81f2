"""Where a training step's GPU time goes, in PyTorch eager and under torch.compile: the
reference model of bench/torch_reference.py, a few steps under torch.profiler, the
kernels' time per step grouped by what they do (matmuls, attention, norms, elementwise,
casts, the loss, the optimizer, compile's fused Triton kernels). The difference between
the two columns is what compile's fusion buys, group by group: the list issue 42's
fused kernels work from.

Usage: python bench/profile_step.py --preset medium-large --micro-batch 8 --seq 2048
Prints one JSON line per implementation (and a table on stderr).
"""

import argparse
import collections
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_reference as ref  # noqa: E402

# First match wins; names are CUDA kernel names (lower-cased) as Kineto records them.
GROUPS = [
    ("optimizer", ("multi_tensor", "fused_adam", "adamw", "foreach")),
    ("attention", ("flash", "fmha", "cudnn", "sdpa", "attention", "efficient")),
    ("triton (compile's fusions)", ("triton",)),
    ("matmul", ("gemm", "cutlass", "sm90_xmma", "sm80_xmma", "nvjet", "cublas", "gemv")),
    ("norm", ("rms_norm", "layer_norm", "norm_kernel", "rowwisemoments")),
    ("loss (log_softmax, nll)", ("softmax", "nll_loss", "cross_entropy")),
    ("reduction", ("reduce_kernel", "reduction")),
    ("cast / copy", ("copy_kernel", "direct_copy", "to_copy", "bfloat16_copy", "unrolled_elementwise_kernel<at::native::copy")),
    ("embedding", ("embedding", "index_select", "indexselect", "scatter", "gather", "index_add")),
    ("elementwise", ("elementwise", "vectorized", "unrolled")),
]


def group_of(name):
    low = name.lower()
    for group, keys in GROUPS:
        if any(k in low for k in keys):
            return group
    return "other"


def profile(args, compile_):
    torch.manual_seed(0)
    dev = torch.device(args.device)
    cfg = ref.Cfg(args.preset, args.seq)
    model = ref.Model(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=dev.type == "cuda")
    step_fn = torch.compile(model) if compile_ else model
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=args.precision == "bf16-mixed")

    def step():
        idx = torch.randint(0, cfg.vocab, (args.micro_batch, cfg.seq + 1), device=dev)
        with autocast:
            loss = step_fn(idx[:, :-1], idx[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    for _ in range(args.warmup):
        step()
    sync()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if dev.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(args.steps):
            step()
        sync()
    if dev.type == "cuda":
        table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=args.top)
        print(f"== {'compile' if compile_ else 'eager'}, {args.steps} steps\n{table}", file=sys.stderr)
    per_group = collections.Counter()
    per_kernel = collections.Counter()
    count = collections.Counter()
    for e in prof.events():
        # Device kernels on CUDA; on CPU (a dry run) the ATen ops without children's time.
        if dev.type == "cuda":
            # GPU-side ranges of user annotations (`Optimizer.step#AdamW.step`) span
            # kernels already counted.
            if e.device_type != torch.autograd.DeviceType.CUDA or getattr(e, "is_user_annotation", False) or "#" in e.name:
                continue
            us = e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        else:
            if not e.name.startswith("aten::"):
                continue
            us = e.self_cpu_time_total
        per_group[group_of(e.name)] += us
        per_kernel[e.name] += us
        count[e.name] += 1
    total = sum(per_group.values())
    ms = lambda us: round(us / 1000 / args.steps, 3)  # noqa: E731
    return {
        "impl": "torch-compile" if compile_ else "torch-eager",
        "preset": args.preset, "micro_batch": args.micro_batch, "seq": args.seq,
        "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "kernel_ms_per_step": ms(total),
        "groups_ms_per_step": {g: ms(us) for g, us in per_group.most_common()},
        "top_kernels": [{"name": n[:160], "ms_per_step": ms(us), "launches_per_step": count[n] / args.steps}
                        for n, us in per_kernel.most_common(args.top)],
        "launches_per_step": sum(count.values()) / args.steps,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="tiny", choices=sorted(ref.PRESETS))
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=3, help="profiled steps")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--precision", default="bf16-mixed", choices=["bf16-mixed", "f32"])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no-compile", action="store_true", help="eager only")
    ap.add_argument("--top", type=int, default=30, help="kernels listed")
    args = ap.parse_args()
    rows = [profile(args, False)]
    if not args.no_compile:
        rows.append(profile(args, True))
    for r in rows:
        print(json.dumps(r), flush=True)
    groups = list(dict.fromkeys(g for r in rows for g in r["groups_ms_per_step"]))
    print(f"{'ms per step':<28}" + "".join(f"{r['impl']:>16}" for r in rows), file=sys.stderr)
    for g in groups + ["total"]:
        vals = [r["kernel_ms_per_step"] if g == "total" else r["groups_ms_per_step"].get(g, 0.0) for r in rows]
        print(f"{g:<28}" + "".join(f"{v:>16.3f}" for v in vals), file=sys.stderr)


if __name__ == "__main__":
    main()
