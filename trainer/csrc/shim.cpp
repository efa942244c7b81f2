// ATen entry points that tch 0.24 does not expose: backward from several roots with
// given gradients, fused AdamW, foreach gradient clipping, the SDPA backend switches,
// bf16 autocast, SwiGLU and RoPE as one autograd node each and, with CUDA, the caching
// allocator's counters and cap, CUDA graphs and jiterator-fused SwiGLU and RoPE kernels.
// Every function is extern "C", catches every C++ exception and returns it as a malloc'd
// message (NULL on success) that Rust frees with shim_free_string; nothing may unwind
// across the FFI boundary.
//
// Tensors cross as tch's C_tensor, which is an at::Tensor*.

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/ExpandUtils.h>
#include <ATen/SDPBackend.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#ifdef SHIM_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/cuda/jiterator.h>
#include <c10/core/Event.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "guarded.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

using shim::guarded;

namespace {

std::vector<at::Tensor> to_list(at::Tensor* const* ts, size_t n, const char* what) {
  std::vector<at::Tensor> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    TORCH_CHECK(ts[i] != nullptr && ts[i]->defined(), what, "[", i, "] is undefined");
    out.push_back(*ts[i]);
  }
  return out;
}

// Fused and foreach kernels want one device and one dtype per call, as torch's
// _group_tensors_by_device_and_dtype arranges in Python.
std::map<std::pair<std::string, int>, std::vector<size_t>> group_by_device_dtype(
    const std::vector<at::Tensor>& ts) {
  std::map<std::pair<std::string, int>, std::vector<size_t>> groups;
  for (size_t i = 0; i < ts.size(); ++i) {
    groups[{ts[i].device().str(), static_cast<int>(ts[i].scalar_type())}].push_back(i);
  }
  return groups;
}

std::vector<at::Tensor> pick(const std::vector<at::Tensor>& ts, const std::vector<size_t>& idx) {
  std::vector<at::Tensor> out;
  out.reserve(idx.size());
  for (size_t i : idx) out.push_back(ts[i]);
  return out;
}

// SwiGLU's elementwise part, silu(a)·b. As one autograd node it saves only a and b;
// silu(a) then b·silu(a) as two nodes also keep silu(a), one (tokens, d_ff) activation
// more per layer. The composed kernels are the ATen ops eager runs, so values and
// gradients equal eager's bit for bit; the fused ones (CUDA, jiterator) read each
// input once and round once.
#ifdef SHIM_CUDA
const char* const kSwigluForward = R"(
template <typename T> T swiglu_forward(T a, T b) {
  float x = a;
  float y = b;
  return T(x / (1.0f + expf(-x)) * y);
})";

const char* const kSwigluBackward = R"(
template <typename T> void swiglu_backward(T g, T a, T b, T& grad_a, T& grad_b) {
  float x = a;
  float s = 1.0f / (1.0f + expf(-x));
  float dg = g;
  grad_b = T(dg * x * s);
  grad_a = T(dg * float(b) * s * (1.0f + x * (1.0f - s)));
})";
#endif

void require_fusable(const at::Tensor& a) {
#ifdef SHIM_CUDA
  TORCH_CHECK(a.is_cuda(), "the fused kernels run on CUDA only, not on ", a.device().str());
#else
  TORCH_CHECK(false, "the fused kernels need the trainer built with the cuda feature");
#endif
}

at::Tensor swiglu_forward(const at::Tensor& a, const at::Tensor& b, bool fused) {
  if (!fused) return at::silu(a).mul_(b);
  require_fusable(a);
#ifdef SHIM_CUDA
  return at::cuda::CompileAndLaunchKernel(kSwigluForward, "swiglu_forward", 1, {a, b}, {}, false)[0];
#else
  return {};
#endif
}

// (grad_a, grad_b) for the output's gradient g.
std::pair<at::Tensor, at::Tensor> swiglu_backward(const at::Tensor& g, const at::Tensor& a, const at::Tensor& b,
                                                  bool fused) {
  if (!fused) {
    // As eager's mul and silu nodes: grad_b = g·silu(a), grad_a = silu'(a)·(g·b).
    at::Tensor grad_b = g * at::silu(a);
    return {at::silu_backward(g * b, a), std::move(grad_b)};
  }
  require_fusable(a);
#ifdef SHIM_CUDA
  auto r = at::cuda::CompileAndLaunchKernel(kSwigluBackward, "swiglu_backward", 2, {g, a, b}, {}, true);
  return {r[0], r[1]};
#else
  return {};
#endif
}

struct SwiGlu : public torch::autograd::Function<SwiGlu> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b,
                            bool fused) {
    ctx->save_for_backward({a, b});
    ctx->saved_data["fused"] = fused;
    return swiglu_forward(a, b, fused);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto [grad_a, grad_b] = swiglu_backward(grads[0], saved[0], saved[1], ctx->saved_data["fused"].toBool());
    return {grad_a, grad_b, at::Tensor()};
  }
};


// RoPE (rotate-half, HF Llama) as one autograd node. With x (…, d) viewed (…, 2, d/2),
// its halves x1, x2 broadcast over the pair dimension as lo and hi, and the tables
// a = (cos, sin), b = (−sin, cos): rope(x) = lo·a + hi·b = (x1·cos − x2·sin, x2·cos + x1·sin).
// It is linear in x, so its gradient is the same map with the inverse rotation's tables,
// (cos, −sin) and (sin, cos), and it saves no activation. Composed, each product is rounded
// to x's dtype and then summed, as eager's x·cos + cat(−x2, x1)·sin does, so values and
// gradients equal eager's bit for bit (negation is exact, addition commutes).
#ifdef SHIM_CUDA
const char* const kRope = R"(
template <typename T> T rope(T lo, T hi, T a, T b) {
  return lo * a + hi * b;
})";
#endif

at::Tensor rope_map(const at::Tensor& x, const at::Tensor& a, const at::Tensor& b, bool fused) {
  std::vector<int64_t> pairs = x.sizes().vec();
  const int64_t d = pairs.back();
  pairs.back() = 2;
  pairs.push_back(d / 2);
  const at::Tensor x5 = x.view(pairs);  // splitting the last dimension is always a view
  const at::Tensor lo = x5.narrow(-2, 0, 1).expand(pairs);
  const at::Tensor hi = x5.narrow(-2, 1, 1).expand(pairs);
  at::Tensor out;
  if (fused) {
    require_fusable(x);
#ifdef SHIM_CUDA
    out = at::cuda::CompileAndLaunchKernel(kRope, "rope", 1, {lo, hi, a, b}, {}, false)[0];
#endif
  } else {
    out = at::empty_like(x5);  // x's layout, so the reshape below is a view
    at::mul_out(out, lo, a);
    out.add_(hi * b);
  }
  return out.reshape(x.sizes());
}

struct RopeFn : public torch::autograd::Function<RopeFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& a,
                            const at::Tensor& b, const at::Tensor& a_back, const at::Tensor& b_back, bool fused) {
    ctx->saved_data["a_back"] = a_back;
    ctx->saved_data["b_back"] = b_back;
    ctx->saved_data["fused"] = fused;
    return rope_map(x, a, b, fused);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto grad = rope_map(grads[0], ctx->saved_data["a_back"].toTensor(), ctx->saved_data["b_back"].toTensor(),
                         ctx->saved_data["fused"].toBool());
    return {grad, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

extern "C" {

void shim_free_string(char* s) { std::free(s); }

// torch.autograd.backward(roots, grads): one engine pass from n roots (leaves
// allowed) that accumulates into every reached leaf's .grad. A leaf reached along
// several paths gets their sum in one AccumulateGrad call, which is what the gradient
// reducer's hooks count on.
char* shim_backward(at::Tensor* const* roots, at::Tensor* const* grads, size_t n) {
  return guarded([&] {
    torch::autograd::backward(to_list(roots, n, "roots"), to_list(grads, n, "grads"));
  });
}

// One AdamW step over n parameters (torch.optim.AdamW with fused=True, amsgrad and
// maximize off). steps are f32 0-dim tensors on each param's device. The learning
// rate is lr_tensor when given (a 0-dim f32 tensor, which a CUDA graph can replay
// with new values), else lr. found_inf, when given, is a 0-dim f32 tensor: at 1 the
// kernel leaves params and moments alone and the step counts are restored, as
// torch's GradScaler skip does; it is read on the device, so nothing syncs.
char* shim_fused_adamw(at::Tensor* const* params, at::Tensor* const* grads, at::Tensor* const* exp_avgs,
                       at::Tensor* const* exp_avg_sqs, at::Tensor* const* steps, size_t n,
                       const at::Tensor* lr_tensor, double lr, double beta1, double beta2, double weight_decay,
                       double eps, const at::Tensor* found_inf) {
  return guarded([&] {
    at::NoGradGuard no_grad;
    auto p = to_list(params, n, "params");
    auto g = to_list(grads, n, "grads");
    auto m = to_list(exp_avgs, n, "exp_avgs");
    auto v = to_list(exp_avg_sqs, n, "exp_avg_sqs");
    auto s = to_list(steps, n, "state_steps");
    // The CPU kernel indexes all four tensors by the param's numel.
    for (size_t i = 0; i < n; ++i) {
      for (const auto* t : {&g[i], &m[i], &v[i]}) {
        TORCH_CHECK(t->sizes() == p[i].sizes() && t->scalar_type() == p[i].scalar_type() &&
                        t->device() == p[i].device(),
                    "param ", i, " is ", p[i].sizes(), " ", p[i].scalar_type(), " on ", p[i].device(),
                    " but its grad or state is ", t->sizes(), " ", t->scalar_type(), " on ", t->device());
      }
      TORCH_CHECK(s[i].dim() == 0 && s[i].scalar_type() == at::kFloat, "state_steps[", i,
                  "] must be a 0-dim float tensor");
    }
    for (const auto* t : {lr_tensor, found_inf}) {
      TORCH_CHECK(t == nullptr || (t->defined() && t->dim() == 0 && t->scalar_type() == at::kFloat),
                  t == lr_tensor ? "lr" : "found_inf", " must be a 0-dim float tensor");
    }
    for (const auto& [key, idx] : group_by_device_dtype(p)) {
      auto gs = pick(s, idx);
      const auto device = p[idx[0]].device();
      std::optional<at::Tensor> inf;
      if (found_inf != nullptr) inf = found_inf->to(device);
      // The step must be counted before the fused kernel reads it: step 0 makes the
      // bias correction 1 - beta^0 = 0 and the update NaN.
      at::_foreach_add_(gs, 1);
      if (lr_tensor != nullptr) {
        at::_fused_adamw_(pick(p, idx), pick(g, idx), pick(m, idx), pick(v, idx), {}, gs, lr_tensor->to(device),
                          beta1, beta2, weight_decay, eps, /*amsgrad=*/false, /*maximize=*/false, std::nullopt, inf);
      } else {
        at::_fused_adamw_(pick(p, idx), pick(g, idx), pick(m, idx), pick(v, idx), {}, gs, lr, beta1, beta2,
                          weight_decay, eps, /*amsgrad=*/false, /*maximize=*/false, std::nullopt, inf);
      }
      if (inf) at::_foreach_sub_(gs, std::vector<at::Tensor>(gs.size(), *inf));
    }
  });
}

// torch.nn.utils.clip_grad_norm_(grads, max_norm, norm_type=2) with the norms
// accumulated in f32. Writes the pre-clip total norm (0-dim f32 on the first grad's
// device) to *out_norm; a non-finite norm is returned as is and scales the grads
// to non-finite values, as torch does with error_if_nonfinite=False.
namespace {
// Scales every gradient by min(1, max_norm / (total + 1e-6)), as clip_grad_norm_ does.
void scale_by_norm(const std::vector<at::Tensor>& g, const at::Tensor& total, double max_norm) {
  at::Tensor coef = at::clamp_max(max_norm / (total + 1e-6), 1.0);
  for (const auto& [key, idx] : group_by_device_dtype(g)) {
    auto gs = pick(g, idx);
    at::_foreach_mul_(gs, coef.to(gs[0].device()));
  }
}
}  // namespace

char* shim_clip_grad_norm(at::Tensor* const* grads, size_t n, double max_norm, at::Tensor** out_norm) {
  return guarded([&] {
    at::NoGradGuard no_grad;
    *out_norm = nullptr;
    auto g = to_list(grads, n, "grads");
    TORCH_CHECK(!g.empty(), "clip_grad_norm needs at least one gradient");
    auto first_device = g[0].device();
    std::vector<at::Tensor> norms;
    for (const auto& [key, idx] : group_by_device_dtype(g)) {
      for (auto& t : at::_foreach_norm(pick(g, idx), 2, at::kFloat)) norms.push_back(t.to(first_device));
    }
    at::Tensor total = at::linalg_vector_norm(at::stack(norms), 2);
    scale_by_norm(g, total, max_norm);
    *out_norm = new at::Tensor(std::move(total));
  });
}

// clip_grad_norm_'s scaling by a norm computed elsewhere (over the ranks' shards).
char* shim_clip_grads_by_norm(at::Tensor* const* grads, size_t n, const at::Tensor* norm, double max_norm) {
  return guarded([&] {
    at::NoGradGuard no_grad;
    auto g = to_list(grads, n, "grads");
    TORCH_CHECK(norm != nullptr && norm->defined() && norm->numel() == 1, "clip_grads_by_norm: the norm is not a scalar");
    if (!g.empty()) scale_by_norm(g, *norm, max_norm);
  });
}

// SDPA backend switches in at::globalContext(); they are process-wide.
char* shim_sdp_set_enabled(int flash, int mem_efficient, int math, int cudnn) {
  return guarded([&] {
    auto& ctx = at::globalContext();
    ctx.setSDPUseFlash(flash != 0);
    ctx.setSDPUseMemEfficient(mem_efficient != 0);
    ctx.setSDPUseMath(math != 0);
    ctx.setSDPUseCuDNN(cudnn != 0);
  });
}

char* shim_sdp_get_enabled(int* flash, int* mem_efficient, int* math, int* cudnn) {
  return guarded([&] {
    auto& ctx = at::globalContext();
    *flash = ctx.userEnabledFlashSDP();
    *mem_efficient = ctx.userEnabledMemEfficientSDP();
    *math = ctx.userEnabledMathSDP();
    *cudnn = ctx.userEnabledCuDNNSDP();
  });
}

// The backend scaled_dot_product_attention would pick (no mask, no dropout,
// default scale), as an at::SDPBackend value.
char* shim_sdp_choice(const at::Tensor* q, const at::Tensor* k, const at::Tensor* v, int is_causal, int enable_gqa,
                      int64_t* out) {
  return guarded([&] {
    TORCH_CHECK(q != nullptr && k != nullptr && v != nullptr, "sdp_choice: null tensor");
    *out = at::_fused_sdp_choice(*q, *k, *v, std::nullopt, 0.0, is_causal != 0, std::nullopt, enable_gqa != 0);
  });
}

// Drops each parameter's .grad (optimizer.zero_grad(set_to_none=True)): the memory
// returns to the allocator until backward produces the next gradients.
char* shim_clear_grads(at::Tensor* const* params, size_t n) {
  return guarded([&] {
    for (auto& p : to_list(params, n, "params")) {
      if (p.grad().defined()) p.mutable_grad().reset();
    }
  });
}

// silu(a)·b as one autograd node (see SwiGlu), with the fused CUDA kernels when `fused`.
char* shim_swiglu(const at::Tensor* a, const at::Tensor* b, int fused, at::Tensor** out) {
  return guarded([&] {
    *out = nullptr;
    TORCH_CHECK(a != nullptr && a->defined() && b != nullptr && b->defined(), "undefined tensor");
    TORCH_CHECK(a->sizes() == b->sizes(), "gate ", a->sizes(), " and up ", b->sizes(), " differ in shape");
    TORCH_CHECK(a->scalar_type() == b->scalar_type(), "gate ", a->scalar_type(), " and up ",
                b->scalar_type(), " differ in dtype");
    *out = new at::Tensor(SwiGlu::apply(*a, *b, fused != 0));
  });
}

// RoPE of x (…, d) as one autograd node (see RopeFn): `tables` are a, b, a_back, b_back,
// each broadcastable to (…, 2, d/2) and of x's dtype; the fused CUDA kernels when `fused`.
char* shim_rope(const at::Tensor* x, const at::Tensor* const* tables, int fused, at::Tensor** out) {
  return guarded([&] {
    *out = nullptr;
    TORCH_CHECK(x != nullptr && x->defined() && x->dim() >= 1, "undefined or 0-d input");
    const int64_t d = x->size(-1);
    TORCH_CHECK(d % 2 == 0, "the head dimension ", d, " is odd");
    std::vector<int64_t> pairs = x->sizes().vec();
    pairs.back() = 2;
    pairs.push_back(d / 2);
    const char* names[] = {"a", "b", "a_back", "b_back"};
    for (int i = 0; i < 4; ++i) {
      const at::Tensor* t = tables[i];
      TORCH_CHECK(t != nullptr && t->defined(), "table ", names[i], " is undefined");
      TORCH_CHECK(t->scalar_type() == x->scalar_type(), "table ", names[i], " is ", t->scalar_type(),
                  ", x is ", x->scalar_type());
      TORCH_CHECK(at::is_expandable_to(t->sizes(), pairs), "table ", names[i], " ", t->sizes(),
                  " does not broadcast to ", c10::IntArrayRef(pairs));
    }
    *out = new at::Tensor(RopeFn::apply(*x, *tables[0], *tables[1], *tables[2], *tables[3], fused != 0));
  });
}

// Tensor.pin_memory() without the device argument, which tch always passes and which
// libtorch deprecates with a warning on every call (four log lines per micro-batch).
char* shim_pin_memory(const at::Tensor* t, at::Tensor** out) {
  return guarded([&] {
    *out = nullptr;
    TORCH_CHECK(t != nullptr && t->defined(), "pin_memory: undefined tensor");
    *out = new at::Tensor(t->pin_memory());
  });
}

// Autocast to bf16 for one device type (CUDA when `cuda`, else CPU), as
// torch.autocast(device, dtype=torch.bfloat16). tch's autocast switches CUDA autocast
// on with CUDA's default lower-precision type, float16. Autocast state is thread-local;
// enter writes the previous state for exit to restore.
char* shim_autocast_enter(int cuda, int* prev_enabled, int* prev_dtype) {
  return guarded([&] {
    auto t = cuda != 0 ? at::kCUDA : at::kCPU;
    *prev_enabled = at::autocast::is_autocast_enabled(t);
    *prev_dtype = static_cast<int>(at::autocast::get_autocast_dtype(t));
    at::autocast::set_autocast_dtype(t, at::kBFloat16);
    at::autocast::set_autocast_enabled(t, true);
    at::autocast::increment_nesting();
  });
}

// Leaves autocast: the outermost exit drops the cached bf16 copies of the weights.
char* shim_autocast_exit(int cuda, int prev_enabled, int prev_dtype) {
  return guarded([&] {
    auto t = cuda != 0 ? at::kCUDA : at::kCPU;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(t, prev_enabled != 0);
    at::autocast::set_autocast_dtype(t, static_cast<at::ScalarType>(prev_dtype));
  });
}

// This thread's autocast state for one device type.
char* shim_autocast_state(int cuda, int* enabled, int* dtype) {
  return guarded([&] {
    auto t = cuda != 0 ? at::kCUDA : at::kCPU;
    *enabled = at::autocast::is_autocast_enabled(t);
    *dtype = static_cast<int>(at::autocast::get_autocast_dtype(t));
  });
}

// 1 when the shim was built with the CUDA code paths (feature "cuda").
int shim_built_with_cuda() {
#ifdef SHIM_CUDA
  return 1;
#else
  return 0;
#endif
}

#ifdef SHIM_CUDA
// Bytes held by tensors, bytes reserved by the caching allocator, and the peak of
// the former since the last reset, for one CUDA device.
char* shim_cuda_memory_stats(int device, int64_t* allocated, int64_t* reserved, int64_t* peak_allocated,
                             int64_t* total) {
  return guarded([&] {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device));
    const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    *allocated = stats.allocated_bytes[agg].current;
    *reserved = stats.reserved_bytes[agg].current;
    *peak_allocated = stats.allocated_bytes[agg].peak;
    *total = static_cast<int64_t>(at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(device))->totalGlobalMem);
  });
}

char* shim_cuda_reset_peak_memory(int device) {
  return guarded([&] {
    c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device));
  });
}

// Caps what the caching allocator may hold on one device at `bytes` (as
// torch.cuda.set_per_process_memory_fraction does; beyond it allocations fail with
// "CUDA out of memory"), and writes the device's total memory.
char* shim_cuda_limit_memory(int device, double bytes, int64_t* total) {
  return guarded([&] {
    TORCH_CHECK(device >= 0 && device < c10::cuda::device_count(), "CUDA device ", device, " does not exist");
    const auto d = static_cast<c10::DeviceIndex>(device);
    *total = static_cast<int64_t>(at::cuda::getDeviceProperties(d)->totalGlobalMem);
    TORCH_CHECK(bytes > 0, "the memory limit must be positive");
    c10::cuda::CUDACachingAllocator::setMemoryFraction(std::min(1.0, bytes / static_cast<double>(*total)), d);
  });
}

// A CUDA graph with its own side stream, as torch.cuda.graph uses: work is warmed up
// and captured on the side stream (capture needs a stream other than the default),
// and replay runs on the stream that is current then.
// `waiter` waits on the device for the work queued on `stream` so far. (c10::Event
// goes through c10_cuda, so the shim needs no CUDA runtime symbols of its own.)
void stream_wait(const c10::cuda::CUDAStream& waiter, const c10::cuda::CUDAStream& stream) {
  c10::Event done(c10::DeviceType::CUDA);
  done.record(stream.unwrap());
  done.block(waiter.unwrap());
}

// Makes `stream` and its device current until destroyed, then restores both: a
// CUDAStreamGuard without its inline guard implementation, which would call the CUDA
// runtime from the shim (everything here goes through c10_cuda).
class CurrentStream {
 public:
  explicit CurrentStream(const c10::cuda::CUDAStream& stream)
      : device_(c10::cuda::current_device()), prev_(c10::cuda::getCurrentCUDAStream(stream.device_index())) {
    c10::cuda::set_device(stream.device_index());
    c10::cuda::setCurrentCUDAStream(stream);
  }
  ~CurrentStream() {
    try {
      c10::cuda::setCurrentCUDAStream(prev_);
      c10::cuda::set_device(device_);
    } catch (...) {
    }
  }
  CurrentStream(const CurrentStream&) = delete;
  CurrentStream& operator=(const CurrentStream&) = delete;

 private:
  c10::DeviceIndex device_;
  c10::cuda::CUDAStream prev_;
};

struct ShimGraph {
  explicit ShimGraph(c10::DeviceIndex d) : device(d), side(c10::cuda::getStreamFromPool(false, d)) {}
  c10::DeviceIndex device;
  c10::cuda::CUDAStream side;
  at::cuda::CUDAGraph graph;
  // Set while the side stream is current (between side_begin and side_end).
  std::optional<CurrentStream> on_side;
  bool autocast_cache = true;
  bool capturing = false;
  bool captured = false;
};

char* shim_cuda_graph_new(int device, ShimGraph** out) {
  return guarded([&] {
    *out = nullptr;
    TORCH_CHECK(device >= 0 && device < c10::cuda::device_count(), "CUDA device ", device, " does not exist (",
                static_cast<int>(c10::cuda::device_count()), " visible)");
    *out = new ShimGraph(static_cast<c10::DeviceIndex>(device));
  });
}

void shim_cuda_graph_free(ShimGraph* g) { delete g; }

// Makes the graph's side stream current, after it waits for the current stream's work.
char* shim_cuda_graph_side_begin(ShimGraph* g) {
  return guarded([&] {
    TORCH_CHECK(!g->on_side, "already on the graph's side stream");
    auto current = c10::cuda::getCurrentCUDAStream(g->device);
    stream_wait(g->side, current);
    g->on_side.emplace(g->side);
  });
}

// Makes the previous stream current again; it waits for the side stream's work.
char* shim_cuda_graph_side_end(ShimGraph* g) {
  return guarded([&] {
    TORCH_CHECK(g->on_side, "not on the graph's side stream");
    g->on_side.reset();
    stream_wait(c10::cuda::getCurrentCUDAStream(g->device), g->side);
  });
}

// Starts capturing on the side stream. Like torch.cuda.graph, it syncs the device
// first, and turns autocast's weight cache off (cached casts would be captured).
char* shim_cuda_graph_capture_begin(ShimGraph* g) {
  return guarded([&] {
    TORCH_CHECK(!g->captured && !g->capturing, "this graph was already captured");
    c10::cuda::device_synchronize();
    TORCH_CHECK(!g->on_side, "capture_begin inside side_begin/side_end");
    g->on_side.emplace(g->side);
    g->autocast_cache = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_cache_enabled(false);
    g->capturing = true;
    try {
      g->graph.capture_begin();
    } catch (...) {
      g->capturing = false;
      at::autocast::set_autocast_cache_enabled(g->autocast_cache);
      g->on_side.reset();
      throw;
    }
  });
}

// Ends the capture (also after the captured work failed, so the stream and autocast
// state are restored either way).
char* shim_cuda_graph_capture_end(ShimGraph* g) {
  return guarded([&] {
    TORCH_CHECK(g->capturing, "capture_end without capture_begin");
    g->capturing = false;
    struct Restore {
      ShimGraph* g;
      ~Restore() {
        at::autocast::set_autocast_cache_enabled(g->autocast_cache);
        g->on_side.reset();
      }
    } restore{g};
    g->graph.capture_end();
    g->captured = true;
  });
}

// Launches the captured work on the current stream.
char* shim_cuda_graph_replay(ShimGraph* g) {
  return guarded([&] {
    TORCH_CHECK(g->captured, "replay before a capture");
    g->graph.replay();
  });
}
#endif

}  // extern "C"
