"""Runs the row kernels of trainer/csrc/row_kernels.h on the CPU and checks their values
against PyTorch's composed ops, in f32 and bf16; no GPU needed.

Each kernel's own source is compiled by g++ under an emulation of the CUDA execution
model it relies on: a block's threads are real threads (threadIdx, blockDim), the
blocks of a grid run one after another (blockIdx), __syncthreads is a barrier, and the
prelude's block-wide sum and max are provided here (every thread of the block gets the
total, as the CUDA prelude's warp shuffles give it). scripts/check-jiterator.py checks
that the same sources, with the CUDA prelude, compile for the GPU; this checks what
they compute: indexing, the reductions, the in-place gradient and the ignored rows.

Usage: python scripts/check-row-kernels.py   (a python with torch)
"""

import ctypes
import dataclasses
import pathlib
import re
import subprocess
import sys
import tempfile

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
HEADER = ROOT / "trainer/csrc/row_kernels.h"

EMULATION = r"""
#include <barrier>
#include <cmath>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(threads)
struct Dim { unsigned x; };
thread_local Dim threadIdx, blockIdx;
Dim blockDim;
static std::barrier<>* block_barrier;
static std::vector<float> exchange;
inline void __syncthreads() { block_barrier->arrive_and_wait(); }
inline float rsqrtf(float v) { return 1.0f / std::sqrt(v); }
inline float expf(float v) { return std::exp(v); }
inline float logf(float v) { return std::log(v); }
inline float fmaxf(float a, float b) { return std::fmax(a, b); }

struct bf16 { unsigned short bits; };
inline float to_float(float v) { return v; }
inline float to_float(bf16 v) { unsigned int u = ((unsigned int)v.bits) << 16; float f; std::memcpy(&f, &u, 4); return f; }
inline void store(float* p, float v) { *p = v; }
inline void store(bf16* p, float v) {
  unsigned int u; std::memcpy(&u, &v, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) { p->bits = 0x7fc0; return; }
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even, as cvt.rn.bf16.f32
  p->bits = (unsigned short)(u >> 16);
}
inline float rounded(float v, const float*) { return v; }
inline float rounded(float v, const bf16*) { bf16 b; store(&b, v); return to_float(b); }
inline float minus_infinity() { return -INFINITY; }
inline float block_reduce(float v, bool is_max) {
  __syncthreads();
  exchange[threadIdx.x] = v;
  __syncthreads();
  float r = is_max ? -INFINITY : 0.0f;
  for (unsigned i = 0; i < blockDim.x; ++i) r = is_max ? std::fmax(r, exchange[i]) : r + exchange[i];
  return r;
}
inline float block_sum(float v) { return block_reduce(v, false); }
inline float block_max(float v) { return block_reduce(v, true); }

static void launch(unsigned grid, unsigned block, const std::function<void()>& kernel) {
  blockDim.x = block;
  exchange.assign(block, 0.0f);
  for (unsigned b = 0; b < grid; ++b) {
    std::barrier<> bar(block);
    block_barrier = &bar;
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < block; ++t) {
      threads.emplace_back([&, t] { threadIdx.x = t; blockIdx.x = b; kernel(); });
    }
    for (auto& th : threads) th.join();
  }
}
"""

# Host entry points, one per kernel: extern "C" wrappers ctypes calls with raw pointers,
# each launching at the geometry the shim launches with (row_kernels.h's *_launch).
HOSTS = r"""
extern "C" void host_forward(long long rows, int cols, const stream_t* x, const branch_t* b,
    const weight_t* w, out_t* out, stream_t* sum, float* rstd, float eps) {
  const auto l = row_kernels::norm_forward_launch(rows, cols);
  launch(l.grid, l.threads, [=] { residual_rms_norm_forward(x, b, w, out, sum, rstd, cols, eps); });
}
extern "C" int host_norm_cols_per_thread(long long cols) { return row_kernels::norm_cols_per_thread(cols); }
extern "C" unsigned host_backward_grid(long long rows, int cols, int sms) {
  return row_kernels::norm_backward_launch(rows, cols, sms).grid;
}
extern "C" void host_backward(long long rows, int cols, int sms, const out_t* g, const stream_t* gs,
    const stream_t* normed, const weight_t* w, const float* rstd, stream_t* gi, float* partial) {
  const auto l = row_kernels::norm_backward_launch(rows, cols, sms);
  launch(l.grid, l.threads, [=] {
    residual_rms_norm_backward(g, gs, normed, w, rstd, gi, partial, rows, cols, l.rows_per_block);
  });
}
extern "C" void host_cross_entropy(long long rows, int vocab, logits_t* logits,
    const long long* targets, float* loss, long long ignore_index, const float* grad_scale) {
  const auto l = row_kernels::cross_entropy_launch(rows, vocab);
  launch(l.grid, l.threads, [=] { cross_entropy_chunk(logits, targets, loss, vocab, ignore_index, grad_scale); });
}
"""

DTYPES = {"float": torch.float32, "bf16": torch.bfloat16}


@dataclasses.dataclass(frozen=True)
class Mix:
    """The storage types of one precision: the residual stream (x, its sum with the
    branch, their gradient), the branch added to it, the norm's weight, the norm's output
    (and the loss chunk's logits)."""

    name: str
    stream: str
    branch: str
    weight: str
    out: str

    def typedefs(self) -> str:
        return "".join(
            f"typedef {t} {n}_t;\n"
            for n, t in [("stream", self.stream), ("branch", self.branch), ("weight", self.weight),
                         ("out", self.out), ("logits", self.out)]
        )


# What the trainer's precisions store (spec.precision): f32; bf16; bf16-mixed's f32
# master weights and residual stream with the matmuls' bf16 branches and norm outputs.
MIXES = [
    Mix("f32", "float", "float", "float", "float"),
    Mix("bf16", "bf16", "bf16", "bf16", "bf16"),
    Mix("bf16-mixed", "float", "bf16", "float", "bf16"),
]


def source(name: str) -> str:
    m = re.search(rf'const char\* const {name} = R"\((.*?)\)";', HEADER.read_text(), re.S)
    if not m:
        sys.exit(f"check-row-kernels: {HEADER}: no raw string constant {name}")
    return m.group(1)


def build(mix: Mix, work: pathlib.Path, cols_per_thread: int | None = None) -> ctypes.CDLL:
    """The emulation of mix's kernels; the norm kernels with the COLS_PER_THREAD the shim
    defines for a row width (row_kernels::norm_cols_per_thread), or their default."""
    kernels = "".join(source(n) for n in ["kResidualRmsNormForward", "kResidualRmsNormBackward", "kCrossEntropyChunk"])
    code = EMULATION + f'#include "{HEADER}"\n' + mix.typedefs() + kernels.replace('extern "C" ', "") + HOSTS
    tag = f"{mix.name}_{cols_per_thread or 'default'}"
    src, lib = work / f"row_{tag}.cpp", work / f"row_{tag}.so"
    src.write_text(code)
    define = [f"-DCOLS_PER_THREAD={cols_per_thread}"] if cols_per_thread else []
    cmd = ["g++", "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-Wall", "-Werror", "-Wno-unknown-pragmas", *define, "-o", str(lib), str(src)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"check-row-kernels: the {mix.name} emulation does not compile:\n{r.stderr}")
    return ctypes.CDLL(str(lib))


def ptr(t: torch.Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr())


def close(what: str, got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    err = ((got.float() - want.float()).abs() / (want.float().abs() + 1.0)).max().item()
    if not err <= tol:
        sys.exit(f"check-row-kernels: {what}: off by {err:.3e} (tolerance {tol:.1e})")


def tolerance(mix: Mix) -> float:
    return 1e-5 if mix.out == "float" and mix.stream == "float" else 2e-2


def check_norm(lib: ctypes.CDLL, mix: Mix, rows: int, cols: int, sms: int, with_branch: bool) -> None:
    stream, branch, weight, out_t = (DTYPES[t] for t in (mix.stream, mix.branch, mix.weight, mix.out))
    tol = tolerance(mix)
    label = f"{mix.name}, {rows}×{cols}, {sms} SMs, {'with' if with_branch else 'no'} branch"
    g = torch.Generator().manual_seed(rows * 131 + cols)
    x = torch.randn(rows, cols, generator=g).to(stream)
    b = torch.randn(rows, cols, generator=g).to(branch)
    w = (1 + 0.1 * torch.randn(cols, generator=g)).to(weight)
    eps = 1e-5
    out, total, rstd = torch.empty(rows, cols, dtype=out_t), torch.empty_like(x), torch.empty(rows)
    null = ctypes.c_void_p(0)
    lib.host_forward(ctypes.c_longlong(rows), cols, ptr(x), ptr(b) if with_branch else null, ptr(w), ptr(out),
                     ptr(total) if with_branch else null, ptr(rstd), ctypes.c_float(eps))
    # What eager computes: the add with torch's type promotion, the norm in f32.
    normed = x + b if with_branch else x
    if with_branch and not torch.equal(total, normed):
        sys.exit(f"check-row-kernels: residual_rms_norm_forward ({label}): the sum differs from eager's add")
    h = normed.float().requires_grad_()
    wf = w.float().requires_grad_()
    ref = torch.nn.functional.rms_norm(h, [cols], wf, eps)
    close(f"residual_rms_norm_forward ({label}) out", out, ref.to(out_t), tol)
    close(f"residual_rms_norm_forward ({label}) rstd", rstd, torch.rsqrt(h.detach().pow(2).mean(-1) + eps), 1e-5)

    grad_out = torch.randn(rows, cols, generator=g).to(out_t)
    grad_sum = torch.randn(rows, cols, generator=g).to(stream)
    ref.backward(grad_out.float())
    grid = lib.host_backward_grid(ctypes.c_longlong(rows), cols, sms)
    for with_sum in (False, True):
        grad_in, partial = torch.empty_like(x), torch.full((grid, cols), float("nan"))
        gs = ptr(grad_sum) if with_sum else null
        lib.host_backward(ctypes.c_longlong(rows), cols, sms, ptr(grad_out), gs, ptr(normed), ptr(w), ptr(rstd),
                          ptr(grad_in), ptr(partial))
        want = h.grad + (grad_sum.float() if with_sum else 0)
        close(f"residual_rms_norm_backward ({label}, grad_sum {with_sum}) grad_input", grad_in, want, tol)
        close(f"residual_rms_norm_backward ({label}) grad_weight", partial.sum(0), wf.grad, tol * 4)


def check_cross_entropy(lib: ctypes.CDLL, mix: Mix, rows: int, vocab: int) -> None:
    dtype = DTYPES[mix.out]
    tol = tolerance(mix)
    label = f"{mix.name}, {rows}×{vocab}"
    g = torch.Generator().manual_seed(rows * 7 + vocab)
    logits = (3 * torch.randn(rows, vocab, generator=g)).to(dtype)
    logits[0, 5] = float("-inf")  # a masked logit
    targets = torch.randint(0, vocab, (rows,), generator=g)
    ignore = -100
    targets[1] = ignore
    scale = 1.0 / (rows - 1)
    ref_in = logits.float().requires_grad_()
    ref = torch.nn.functional.cross_entropy(ref_in, targets, ignore_index=ignore, reduction="none")
    (ref.sum() * scale).backward()
    chunk, loss, grad_scale = logits.clone(), torch.empty(rows), torch.tensor(scale, dtype=torch.float32)
    lib.host_cross_entropy(ctypes.c_longlong(rows), vocab, ptr(chunk), ptr(targets), ptr(loss),
                           ctypes.c_longlong(ignore), ptr(grad_scale))
    close(f"cross_entropy_chunk ({label}) loss", loss, ref.detach(), tol)
    close(f"cross_entropy_chunk ({label}) gradient", chunk, ref_in.grad, tol)
    if loss[1].item() != 0 or chunk[1].abs().max().item() != 0:
        sys.exit(f"check-row-kernels: cross_entropy_chunk ({label}): the ignored row has a loss or a gradient")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for mix in MIXES:
            lib = build(mix, pathlib.Path(tmp))
            by_cols_per_thread: dict[int, ctypes.CDLL] = {}
            # Columns that fill a warp, leave threads idle, take several a thread, and (5000)
            # fill 1024 threads; SMs that give one row a block, several, and a short last block.
            for rows, cols, sms in [(5, 64, 8), (7, 37, 1), (4, 300, 1), (9, 300, 2), (2, 5000, 1)]:
                cols_per_thread = lib.host_norm_cols_per_thread(ctypes.c_longlong(cols))
                if cols_per_thread not in by_cols_per_thread:
                    by_cols_per_thread[cols_per_thread] = build(mix, pathlib.Path(tmp), cols_per_thread)
                for with_branch in (True, False):
                    check_norm(by_cols_per_thread[cols_per_thread], mix, rows, cols, sms, with_branch)
            for rows, vocab in [(4, 50), (3, 1000), (3, 10000)]:
                check_cross_entropy(lib, mix, rows, vocab)
    print(
        "check-row-kernels: residual RMSNorm (forward, backward) and the loss chunk agree with PyTorch in "
        + ", ".join(m.name for m in MIXES)
    )


if __name__ == "__main__":
    main()
