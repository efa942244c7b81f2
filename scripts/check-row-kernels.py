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

# Host entry points, one per kernel: extern "C" wrappers ctypes calls with raw pointers.
HOSTS = r"""
extern "C" void host_forward(unsigned grid, unsigned block, const scalar_t* x, const scalar_t* r,
    const scalar_t* w, scalar_t* out, scalar_t* sum, float* rstd, int cols, float eps) {
  launch(grid, block, [=] { residual_rms_norm_forward(x, r, w, out, sum, rstd, cols, eps); });
}
extern "C" void host_backward(unsigned grid, unsigned block, const scalar_t* g, const scalar_t* gs,
    const scalar_t* sum, const scalar_t* w, const float* rstd, scalar_t* gi, float* partial,
    long long rows, int cols, int rows_per_block) {
  launch(grid, block, [=] { residual_rms_norm_backward(g, gs, sum, w, rstd, gi, partial, rows, cols, rows_per_block); });
}
extern "C" void host_cross_entropy(unsigned grid, unsigned block, scalar_t* logits,
    const long long* targets, float* loss, int vocab, long long ignore_index, float grad_scale) {
  launch(grid, block, [=] { cross_entropy_chunk(logits, targets, loss, vocab, ignore_index, grad_scale); });
}
"""

DTYPES = {"float": torch.float32, "bf16": torch.bfloat16}


def source(name: str) -> str:
    m = re.search(rf'const char\* const {name} = R"\((.*?)\)";', HEADER.read_text(), re.S)
    if not m:
        sys.exit(f"check-row-kernels: {HEADER}: no raw string constant {name}")
    return m.group(1)


def build(scalar: str, work: pathlib.Path) -> ctypes.CDLL:
    kernels = "".join(source(n) for n in ["kResidualRmsNormForward", "kResidualRmsNormBackward", "kCrossEntropyChunk"])
    code = EMULATION + f"typedef {scalar} scalar_t;\n" + kernels.replace('extern "C" ', "") + HOSTS
    src, lib = work / f"row_{scalar}.cpp", work / f"row_{scalar}.so"
    src.write_text(code)
    cmd = ["g++", "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-Wall", "-Werror", "-o", str(lib), str(src)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"check-row-kernels: the {scalar} emulation does not compile:\n{r.stderr}")
    return ctypes.CDLL(str(lib))


def ptr(t: torch.Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr())


def close(what: str, got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    err = ((got.float() - want.float()).abs() / (want.float().abs() + 1.0)).max().item()
    if not err <= tol:
        sys.exit(f"check-row-kernels: {what}: off by {err:.3e} (tolerance {tol:.1e})")


def check_norm(lib: ctypes.CDLL, scalar: str, rows: int, cols: int, block: int) -> None:
    dtype = DTYPES[scalar]
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    label = f"{scalar}, {rows}×{cols}, block {block}"
    g = torch.Generator().manual_seed(rows * 131 + cols)
    x = torch.randn(rows, cols, generator=g).to(dtype)
    r = torch.randn(rows, cols, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(cols, generator=g)).to(dtype)
    eps = 1e-5
    out, total, rstd = torch.empty_like(x), torch.empty_like(x), torch.empty(rows)
    lib.host_forward(rows, block, ptr(x), ptr(r), ptr(w), ptr(out), ptr(total), ptr(rstd), cols, ctypes.c_float(eps))
    # What eager computes: the add in the dtype, the norm in f32 (autocast's policy for it).
    want_sum = x + r
    if not torch.equal(total, want_sum):
        sys.exit(f"check-row-kernels: residual_rms_norm_forward ({label}): the sum differs from eager's add")
    h = want_sum.float().requires_grad_()
    wf = w.float().requires_grad_()
    ref = torch.nn.functional.rms_norm(h, [cols], wf, eps)
    close(f"residual_rms_norm_forward ({label}) out", out, ref, tol)
    close(f"residual_rms_norm_forward ({label}) rstd", rstd, torch.rsqrt(h.detach().pow(2).mean(-1) + eps), 1e-5)

    grad_out = torch.randn(rows, cols, generator=g).to(dtype)
    grad_sum = torch.randn(rows, cols, generator=g).to(dtype)
    ref.backward(grad_out.float())
    rows_per_block = 3
    grid = (rows + rows_per_block - 1) // rows_per_block
    for with_sum in (False, True):
        grad_in, partial = torch.empty_like(x), torch.empty(grid, cols)
        gs = ptr(grad_sum) if with_sum else ctypes.c_void_p(0)
        lib.host_backward(grid, block, ptr(grad_out), gs, ptr(total), ptr(w), ptr(rstd), ptr(grad_in), ptr(partial),
                          ctypes.c_longlong(rows), cols, rows_per_block)
        want = h.grad + (grad_sum.float() if with_sum else 0)
        close(f"residual_rms_norm_backward ({label}, grad_sum {with_sum}) grad_input", grad_in, want, tol)
        close(f"residual_rms_norm_backward ({label}) grad_weight", partial.sum(0), wf.grad, tol * 4)


def check_cross_entropy(lib: ctypes.CDLL, scalar: str, rows: int, vocab: int, block: int) -> None:
    dtype = DTYPES[scalar]
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    label = f"{scalar}, {rows}×{vocab}, block {block}"
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
    chunk, loss = logits.clone(), torch.empty(rows)
    lib.host_cross_entropy(rows, block, ptr(chunk), ptr(targets), ptr(loss), vocab, ctypes.c_longlong(ignore),
                           ctypes.c_float(scale))
    close(f"cross_entropy_chunk ({label}) loss", loss, ref.detach(), tol)
    close(f"cross_entropy_chunk ({label}) gradient", chunk, ref_in.grad, tol)
    if loss[1].item() != 0 or chunk[1].abs().max().item() != 0:
        sys.exit(f"check-row-kernels: cross_entropy_chunk ({label}): the ignored row has a loss or a gradient")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for scalar in DTYPES:
            lib = build(scalar, pathlib.Path(tmp))
            # Columns that fill the block, leave threads idle, and need several per thread.
            for rows, cols, block in [(5, 64, 32), (7, 37, 64), (4, 300, 32)]:
                check_norm(lib, scalar, rows, cols, block)
            for rows, vocab, block in [(4, 50, 32), (3, 1000, 64)]:
                check_cross_entropy(lib, scalar, rows, vocab, block)
    print("check-row-kernels: residual RMSNorm (forward, backward) and the loss chunk agree with PyTorch in float and bf16")


if __name__ == "__main__":
    main()
