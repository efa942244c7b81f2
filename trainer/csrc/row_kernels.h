// Row kernels: what torch.compile fuses around the attention and the MLP and the
// jiterator cannot express, because each reduces along a row. The residual add with the
// RMSNorm after it (forward and backward), and the loss's chunk (logits to loss and
// gradient in one kernel). They are CUDA C sources for NVRTC, compiled at a CUDA run's
// start for the dtypes it trains in (csrc/rows.cpp): each source is kRowPrelude, then a
// typedef of float or bf16 for each type the kernel names (stream_t, branch_t, weight_t,
// out_t; logits_t), then the kernel. Arithmetic is in float; the types are only how
// values are stored. scripts/check-jiterator.py compiles every one for sm_80 and sm_90
// in the dtype mixes the trainer runs, and scripts/check-row-kernels.py runs each on the
// CPU under an emulation of CUDA's threads, at the shim's launch geometry (below),
// against PyTorch's composed ops; both without a GPU.
#pragma once

namespace row_kernels {

// bf16 as its 16 bits, conversions to and from float (round to nearest even, as
// ATen's), and block-wide sum and max (blockDim.x a multiple of 32, at most 1024;
// every thread of the block must call them, and every thread gets the result).
const char* const kRowPrelude = R"(
struct bf16 { unsigned short bits; };
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(bf16 v) { return __uint_as_float(((unsigned int)v.bits) << 16); }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(bf16* p, float v) {
  unsigned short h;
  asm("{ cvt.rn.bf16.f32 %0, %1;}\n" : "=h"(h) : "f"(v));
  p->bits = h;
}
// v as a tensor of p's dtype holds it: what eager reads back after writing it.
__device__ __forceinline__ float rounded(float v, const float*) { return v; }
__device__ __forceinline__ float rounded(float v, const bf16*) {
  bf16 b;
  store(&b, v);
  return to_float(b);
}
__device__ __forceinline__ float minus_infinity() { return __int_as_float(0xff800000); }

__device__ float block_reduce(float v, bool is_max) {
  __shared__ float warps[32];
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, other) : v + other;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // a previous call's readers are done with warps[]
  if (lane == 0) warps[warp] = v;
  __syncthreads();
  const float none = is_max ? minus_infinity() : 0.0f;
  v = lane < (int)(blockDim.x >> 5) ? warps[lane] : none;
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, other) : v + other;
  }
  return v;
}
__device__ __forceinline__ float block_sum(float v) { return block_reduce(v, false); }
__device__ __forceinline__ float block_max(float v) { return block_reduce(v, true); }
)";

// One block a row of `cols`. With a branch: h = x + branch, rounded to stream_t as
// eager's add stores it (the residual stream the next layer adds to) and stored in sum;
// without one (branch null, sum unused): h = x. out = h·rstd·weight with
// rstd = 1/sqrt(mean(h²) + eps) in float, stored once as out_t where eager under autocast
// stores the f32 norm and casts it again for the next matmul. rstd (one float a row) is
// saved for the backward. Types: stream_t (x, sum), branch_t, weight_t, out_t.
const char* const kResidualRmsNormForward = R"(
#ifndef COLS_PER_THREAD
#define COLS_PER_THREAD 16
#endif
extern "C" __global__ void __launch_bounds__(1024) residual_rms_norm_forward(
    const stream_t* __restrict__ x, const branch_t* __restrict__ branch,
    const weight_t* __restrict__ weight, out_t* __restrict__ out, stream_t* __restrict__ sum,
    float* __restrict__ rstd, int cols, float eps) {
  const long long base = (long long)blockIdx.x * cols;
  // The row's values stay in registers between the sum of squares and the output.
  float hs[COLS_PER_THREAD];
  float squares = 0.0f;
  #pragma unroll
  for (int k = 0, c = threadIdx.x; k < COLS_PER_THREAD && c < cols; ++k, c += blockDim.x) {
    float h = to_float(x[base + c]);
    if (branch != 0) {
      h = rounded(h + to_float(branch[base + c]), sum);
      store(&sum[base + c], h);
    }
    hs[k] = h;
    squares += h * h;
  }
  const float r = rsqrtf(block_sum(squares) / (float)cols + eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
  #pragma unroll
  for (int k = 0, c = threadIdx.x; k < COLS_PER_THREAD && c < cols; ++k, c += blockDim.x) {
    store(&out[base + c], hs[k] * r * to_float(weight[c]));
  }
})";

// The backward of residual_rms_norm_forward, `rows_per_block` rows a block; `normed` is
// what the forward normed (its sum, or x without a branch). With n = h·rstd and
// gn = grad_out·weight: grad_h = rstd·(gn − n·mean(gn·n)), plus grad_sum, the gradient
// the sum receives as the next layer's residual (null when none). It is the gradient of
// x and of the branch. weight's gradient, Σ grad_out·n over the rows, is summed per
// block into weight_partial[blockIdx.x][cols] in float; the caller sums the blocks. A
// thread keeps the sums of its columns c = threadIdx.x + k·blockDim.x in registers, so
// cols ≤ COLS_PER_THREAD·blockDim.x.
const char* const kResidualRmsNormBackward = R"(
#ifndef COLS_PER_THREAD
#define COLS_PER_THREAD 16
#endif
extern "C" __global__ void __launch_bounds__(1024) residual_rms_norm_backward(
    const out_t* __restrict__ grad_out, const stream_t* __restrict__ grad_sum,
    const stream_t* __restrict__ normed, const weight_t* __restrict__ weight,
    const float* __restrict__ rstd, stream_t* __restrict__ grad_input,
    float* __restrict__ weight_partial, long long rows, int cols, int rows_per_block) {
  float grad_weight[COLS_PER_THREAD];
#pragma unroll
  for (int k = 0; k < COLS_PER_THREAD; ++k) grad_weight[k] = 0.0f;
  const long long first = (long long)blockIdx.x * rows_per_block;
  const long long end = first + rows_per_block < rows ? first + rows_per_block : rows;
  // A row's normed values and output gradients stay in registers between its two passes.
  float ns[COLS_PER_THREAD], gs[COLS_PER_THREAD];
  for (long long row = first; row < end; ++row) {
    const long long base = row * cols;
    const float r = rstd[row];
    float dot = 0.0f;
    #pragma unroll
    for (int k = 0, c = threadIdx.x; k < COLS_PER_THREAD && c < cols; ++k, c += blockDim.x) {
      ns[k] = to_float(normed[base + c]) * r;
      gs[k] = to_float(grad_out[base + c]);
      dot += gs[k] * to_float(weight[c]) * ns[k];
    }
    const float mean = block_sum(dot) / (float)cols;
    #pragma unroll
    for (int k = 0, c = threadIdx.x; k < COLS_PER_THREAD && c < cols; ++k, c += blockDim.x) {
      const float n = ns[k];
      const float g = gs[k];
      float grad_h = r * (g * to_float(weight[c]) - n * mean);
      if (grad_sum != 0) grad_h += to_float(grad_sum[base + c]);
      store(&grad_input[base + c], grad_h);
      grad_weight[k] += g * n;
    }
  }
  #pragma unroll
  for (int k = 0, c = threadIdx.x; k < COLS_PER_THREAD && c < cols; ++k, c += blockDim.x) {
    weight_partial[(long long)blockIdx.x * cols + c] = grad_weight[k];
  }
})";

// One block a row of a chunk of logits (rows, vocab) of logits_t: loss[row] =
// logsumexp(row) − row[target], and the row overwritten by its gradient
// (softmax(row) − onehot(target)) · *grad_scale, so the chunk's logits are read twice and
// never copied. grad_scale is a device scalar (the loss's scale over the targets that
// count), so nothing waits for the host. A row whose target is ignore_index gets loss 0
// and a zero gradient. The max and the sum of exponentials are taken in one pass (the
// running sum rescaled when the max grows).
const char* const kCrossEntropyChunk = R"(
extern "C" __global__ void cross_entropy_chunk(
    logits_t* __restrict__ logits, const long long* __restrict__ targets,
    float* __restrict__ loss, int vocab, long long ignore_index, const float* __restrict__ grad_scale) {
  logits_t* row = logits + (long long)blockIdx.x * vocab;
  const long long target = targets[blockIdx.x];
  const float scale = *grad_scale;
  float m = minus_infinity(), s = 0.0f;
  for (int c = threadIdx.x; c < vocab; c += blockDim.x) {
    const float v = to_float(row[c]);
    if (v == minus_infinity()) continue;
    if (v > m) {
      s = s * expf(m - v) + 1.0f;
      m = v;
    } else {
      s += expf(v - m);
    }
  }
  const float block_m = block_max(m);
  const float total = block_sum(m == minus_infinity() ? 0.0f : s * expf(m - block_m));
  const float lse = block_m + logf(total);
  const bool ignored = target == ignore_index || target < 0 || target >= vocab;
  if (threadIdx.x == 0) loss[blockIdx.x] = ignored ? 0.0f : lse - to_float(row[target]);
  __syncthreads();  // row[target] is read before any thread overwrites it
  for (int c = threadIdx.x; c < vocab; c += blockDim.x) {
    float grad = 0.0f;
    if (!ignored) grad = (expf(to_float(row[c]) - lse) - (c == target ? 1.0f : 0.0f)) * scale;
    store(&row[c], grad);
  }
})";

// How the shim launches each kernel: threads a block and blocks a grid, for a problem of
// `rows` rows. Host code, shared with scripts/check-row-kernels.py's emulation, which
// launches with the same geometry.
struct Launch {
  unsigned grid;
  unsigned threads;
  int rows_per_block;
};

// Threads for a row of `cols` columns, `per_thread` of them each: a multiple of a warp,
// 32 to 1024.
inline unsigned threads_for(long long cols, int per_thread) {
  long long warps = (cols + 32LL * per_thread - 1) / (32LL * per_thread);
  if (warps < 1) warps = 1;
  if (warps > 32) warps = 32;
  return static_cast<unsigned>(warps * 32);
}

// The widest row the backward's registers hold: COLS_PER_THREAD (16) columns for each of
// 1024 threads.
constexpr long long kMaxNormCols = 16LL * 1024;

// Columns a thread of the norm kernels holds in registers (their COLS_PER_THREAD, defined
// when the shim compiles them): the fewest that cover a row at the launch's threads. A
// fixed 16 kept three arrays of 16 floats a thread in the backward, more registers than a
// multiprocessor has for 512 threads (xlarge's 2,048 columns: "too many resources
// requested for launch", H200).
inline int norm_cols_per_thread(long long cols) {
  const long long threads = threads_for(cols, 4);
  return static_cast<int>((cols + threads - 1) / threads);
}

// The forward: a block a row, about 4 columns a thread (at most COLS_PER_THREAD).
inline Launch norm_forward_launch(long long rows, int cols) {
  return Launch{static_cast<unsigned>(rows), threads_for(cols, 4), 1};
}

// The backward: as the forward's threads, about eight blocks a multiprocessor, each over
// consecutive rows. A block's rows run one after another, each waiting on its loads and
// its block sum, so the rows in flight are the blocks resident; the weight partials,
// (grid, cols) floats, stay a few MB. Two blocks a multiprocessor ran the backward at
// 0.70 ms a residual norm where ATen's composed ops took 0.51 (H100, medium-large).
inline Launch norm_backward_launch(long long rows, int cols, int multiprocessors) {
  const long long blocks = 8LL * (multiprocessors > 0 ? multiprocessors : 1);
  long long per_block = (rows + blocks - 1) / blocks;
  if (per_block < 1) per_block = 1;
  const long long grid = (rows + per_block - 1) / per_block;
  return Launch{static_cast<unsigned>(grid), threads_for(cols, 4), static_cast<int>(per_block)};
}

// The loss chunk: a block a row, about 8 columns a thread.
inline Launch cross_entropy_launch(long long rows, int vocab) {
  return Launch{static_cast<unsigned>(rows), threads_for(vocab, 8), 1};
}

}  // namespace row_kernels
