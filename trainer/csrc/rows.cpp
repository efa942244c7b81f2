// The row kernels of row_kernels.h, launched: compiled with NVRTC for the device's
// architecture at first use (a CUBIN, or PTX for the driver to finish when NVRTC is older
// than the device), loaded with the driver API and launched on the current stream, so
// CUDA graphs capture them like any ATen kernel. The residual RMSNorm is one autograd
// node (ResidualRmsNormFn); the loss chunk is a plain in-place op the head's hand-written
// backward calls.
//
// libtorch keeps NVRTC and the driver behind its own lazily loaded table, whose layout
// the wheel's headers do not ship, so the shim loads both itself: libnvrtc from the
// wheel's nvidia/cu13/lib beside libtorch (where libtorch_cuda finds it), libcuda.so.1
// from the driver. Compiling needs no GPU, so the feature-cuda unit tests compile every
// kernel through this very path.

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#ifdef SHIM_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda.h>
#include <dlfcn.h>
#include <link.h>
#include <nvrtc.h>
#endif

#include "guarded.h"
#include "row_kernels.h"

#include <algorithm>
#include <filesystem>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

using shim::guarded;

namespace {

// The storage types a kernel is compiled for, as row_kernels.h names them.
struct RowTypes {
  at::ScalarType stream, branch, weight, out;
};

bool row_dtype(at::ScalarType t) { return t == at::kFloat || t == at::kBFloat16; }

const char* row_type_name(at::ScalarType t) { return t == at::kFloat ? "float" : "bf16"; }

void check_row_dtype(at::ScalarType t, const char* what) {
  TORCH_CHECK(row_dtype(t), what, " is ", t, "; the row kernels store Float or BFloat16");
}

// The CUDA source of one kernel: the prelude, the typedefs it names, the kernel, and the
// norm kernels' COLS_PER_THREAD when cols_per_thread > 0 (their own default otherwise).
std::string row_source(const char* kernel, const RowTypes& t, int cols_per_thread) {
  std::string s = row_kernels::kRowPrelude;
  if (cols_per_thread > 0) s += "\n#define COLS_PER_THREAD " + std::to_string(cols_per_thread);
  const std::pair<const char*, at::ScalarType> defs[] = {
      {"stream_t", t.stream}, {"branch_t", t.branch}, {"weight_t", t.weight}, {"out_t", t.out}, {"logits_t", t.out}};
  for (const auto& [name, type] : defs) s += std::string("\ntypedef ") + row_type_name(type) + " " + name + ";";
  s += "\n";
  s += kernel;
  return s;
}

#ifdef SHIM_CUDA

// dlsym of a named symbol, as the function type of its declaration in the headers.
template <typename F>
F symbol(void* lib, const char* name, const char* from) {
  void* p = dlsym(lib, name);
  TORCH_CHECK(p != nullptr, "row kernels: ", from, " has no ", name);
  return reinterpret_cast<F>(p);
}

// The directory of the loaded library whose file is named `name` ("" when none is).
std::string loaded_library_dir(const std::string& name) {
  struct Search {
    std::string name, dir;
  } search{"/" + name, ""};
  dl_iterate_phdr(
      [](struct dl_phdr_info* info, size_t, void* data) {
        auto* s = static_cast<Search*>(data);
        const std::string path = info->dlpi_name != nullptr ? info->dlpi_name : "";
        if (path.size() < s->name.size() || path.compare(path.size() - s->name.size(), s->name.size(), s->name) != 0) {
          return 0;
        }
        s->dir = path.substr(0, path.size() - s->name.size());
        return 1;
      },
      &search);
  return search.dir;
}

struct Nvrtc {
  decltype(&nvrtcCreateProgram) create;
  decltype(&nvrtcCompileProgram) compile;
  decltype(&nvrtcDestroyProgram) destroy;
  decltype(&nvrtcGetProgramLogSize) log_size;
  decltype(&nvrtcGetProgramLog) log;
  decltype(&nvrtcGetCUBINSize) cubin_size;
  decltype(&nvrtcGetCUBIN) cubin;
  decltype(&nvrtcGetPTXSize) ptx_size;
  decltype(&nvrtcGetPTX) ptx;
  decltype(&nvrtcGetNumSupportedArchs) num_archs;
  decltype(&nvrtcGetSupportedArchs) archs;
  decltype(&nvrtcGetErrorString) error;

  // libnvrtc from the torch wheel's nvidia/cu13/lib (torch/lib/../../nvidia/cu13/lib),
  // else wherever the loader finds it.
  static const Nvrtc& get() {
    static const Nvrtc n = [] {
      const std::string dir = loaded_library_dir("libtorch_cuda.so");
      const std::string cu13 = dir + "/../../nvidia/cu13/lib";
      const std::string beside = cu13 + "/libnvrtc.so.13";
      // NVRTC loads its builtins by name when it compiles, and finds them only where
      // the library that loaded it looks (libtorch_cuda's RPATH does; the trainer's
      // does not): loaded first by path, they are found by their soname.
      std::error_code ec;
      for (const auto& entry : std::filesystem::directory_iterator(cu13, ec)) {
        const std::string name = entry.path().filename().string();
        if (name.rfind("libnvrtc-builtins.so.", 0) == 0) dlopen(entry.path().c_str(), RTLD_NOW | RTLD_GLOBAL);
      }
      void* lib = dir.empty() ? nullptr : dlopen(beside.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib == nullptr) lib = dlopen("libnvrtc.so.13", RTLD_NOW | RTLD_LOCAL);
      TORCH_CHECK(lib != nullptr, "row kernels: cannot load NVRTC from ", beside,
                  " or as libnvrtc.so.13: ", dlerror());
      const char* from = "libnvrtc.so.13";
      return Nvrtc{symbol<decltype(&nvrtcCreateProgram)>(lib, "nvrtcCreateProgram", from),
                   symbol<decltype(&nvrtcCompileProgram)>(lib, "nvrtcCompileProgram", from),
                   symbol<decltype(&nvrtcDestroyProgram)>(lib, "nvrtcDestroyProgram", from),
                   symbol<decltype(&nvrtcGetProgramLogSize)>(lib, "nvrtcGetProgramLogSize", from),
                   symbol<decltype(&nvrtcGetProgramLog)>(lib, "nvrtcGetProgramLog", from),
                   symbol<decltype(&nvrtcGetCUBINSize)>(lib, "nvrtcGetCUBINSize", from),
                   symbol<decltype(&nvrtcGetCUBIN)>(lib, "nvrtcGetCUBIN", from),
                   symbol<decltype(&nvrtcGetPTXSize)>(lib, "nvrtcGetPTXSize", from),
                   symbol<decltype(&nvrtcGetPTX)>(lib, "nvrtcGetPTX", from),
                   symbol<decltype(&nvrtcGetNumSupportedArchs)>(lib, "nvrtcGetNumSupportedArchs", from),
                   symbol<decltype(&nvrtcGetSupportedArchs)>(lib, "nvrtcGetSupportedArchs", from),
                   symbol<decltype(&nvrtcGetErrorString)>(lib, "nvrtcGetErrorString", from)};
    }();
    return n;
  }

  void check(nvrtcResult r, const char* what) const {
    TORCH_CHECK(r == NVRTC_SUCCESS, "row kernels: ", what, ": ", error(r));
  }
};

struct Driver {
  decltype(&cuCtxGetCurrent) ctx_get_current;
  decltype(&cuCtxSetCurrent) ctx_set_current;
  decltype(&cuDeviceGet) device_get;
  decltype(&cuDevicePrimaryCtxRetain) primary_ctx_retain;
  decltype(&cuModuleLoadData) module_load_data;
  decltype(&cuModuleGetFunction) module_get_function;
  decltype(&cuLaunchKernel) launch_kernel;
  decltype(&cuGetErrorString) error_string;

  static const Driver& get() {
    static const Driver d = [] {
      void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
      TORCH_CHECK(lib != nullptr, "row kernels: cannot load the CUDA driver (libcuda.so.1): ", dlerror());
      const char* from = "libcuda.so.1";
      return Driver{symbol<decltype(&cuCtxGetCurrent)>(lib, "cuCtxGetCurrent", from),
                    symbol<decltype(&cuCtxSetCurrent)>(lib, "cuCtxSetCurrent", from),
                    symbol<decltype(&cuDeviceGet)>(lib, "cuDeviceGet", from),
                    symbol<decltype(&cuDevicePrimaryCtxRetain)>(lib, "cuDevicePrimaryCtxRetain", from),
                    symbol<decltype(&cuModuleLoadData)>(lib, "cuModuleLoadData", from),
                    symbol<decltype(&cuModuleGetFunction)>(lib, "cuModuleGetFunction", from),
                    symbol<decltype(&cuLaunchKernel)>(lib, "cuLaunchKernel", from),
                    symbol<decltype(&cuGetErrorString)>(lib, "cuGetErrorString", from)};
    }();
    return d;
  }

  void check(CUresult r, const char* what) const {
    if (r == CUDA_SUCCESS) return;
    const char* msg = nullptr;
    error_string(r, &msg);
    TORCH_CHECK(false, "row kernels: ", what, ": ", msg != nullptr ? msg : "unknown CUDA driver error");
  }
};

// A compiled kernel: a CUBIN for `arch` (sm_XY) or, when NVRTC does not know the
// device's architecture, PTX for the newest one it knows, which the driver compiles.
struct Binary {
  std::vector<char> image;
  std::string target;
};

// Compiles `source` for compute capability `capability` (major·10 + minor).
Binary compile_row_kernel(const std::string& source, const char* name, int capability) {
  const Nvrtc& n = Nvrtc::get();
  int count = 0;
  n.check(n.num_archs(&count), "nvrtcGetNumSupportedArchs");
  std::vector<int> archs(static_cast<size_t>(std::max(count, 0)));
  if (count > 0) n.check(n.archs(archs.data()), "nvrtcGetSupportedArchs");
  TORCH_CHECK(!archs.empty(), "row kernels: NVRTC supports no architecture");
  const bool sass = std::find(archs.begin(), archs.end(), capability) != archs.end();
  int target = capability;
  if (!sass) {
    // The newest architecture NVRTC knows that the device runs.
    int best = -1;
    for (int a : archs) {
      if (a <= capability) best = std::max(best, a);
    }
    TORCH_CHECK(best >= 0, "row kernels: NVRTC knows no architecture at or below sm_", capability);
    target = best;
  }
  const std::string arch = std::string("--gpu-architecture=") + (sass ? "sm_" : "compute_") + std::to_string(target);
  const char* options[] = {"--std=c++17", arch.c_str(), "-DNDEBUG"};
  nvrtcProgram program = nullptr;
  n.check(n.create(&program, source.c_str(), name, 0, nullptr, nullptr), "nvrtcCreateProgram");
  struct Destroy {
    const Nvrtc& n;
    nvrtcProgram* p;
    ~Destroy() { n.destroy(p); }
  } destroy{n, &program};
  const nvrtcResult compiled = n.compile(program, 3, options);
  if (compiled != NVRTC_SUCCESS) {
    size_t size = 0;
    n.log_size(program, &size);
    std::string log(size, '\0');
    if (size > 0) n.log(program, log.data());
    TORCH_CHECK(false, "row kernels: ", name, " does not compile for ", arch, ": ", log);
  }
  Binary b;
  b.target = (sass ? "sm_" : "compute_") + std::to_string(target);
  size_t size = 0;
  if (sass) {
    n.check(n.cubin_size(program, &size), "nvrtcGetCUBINSize");
    b.image.resize(size);
    n.check(n.cubin(program, b.image.data()), "nvrtcGetCUBIN");
  } else {
    n.check(n.ptx_size(program, &size), "nvrtcGetPTXSize");
    b.image.resize(size);
    n.check(n.ptx(program, b.image.data()), "nvrtcGetPTX");
  }
  return b;
}

// The kernel `name` (its source `kernel`) for `types` and `cols_per_thread` (0: the
// source's default) on `device`: compiled and loaded once per process and all of these.
CUfunction row_function(const char* name, const char* kernel, const RowTypes& types, int cols_per_thread,
                        c10::DeviceIndex device) {
  static std::mutex mutex;
  static std::map<std::tuple<std::string, int, int, int, int, int, int>, CUfunction> functions;
  const auto key = std::make_tuple(std::string(name), static_cast<int>(device), static_cast<int>(types.stream),
                                   static_cast<int>(types.branch), static_cast<int>(types.weight),
                                   static_cast<int>(types.out), cols_per_thread);
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = functions.find(key); it != functions.end()) return it->second;
  const auto* props = at::cuda::getDeviceProperties(device);
  const Binary binary = compile_row_kernel(row_source(kernel, types, cols_per_thread), name, props->major * 10 + props->minor);
  const Driver& d = Driver::get();
  // The module belongs to the device's primary context, which the runtime makes current
  // with the device; a thread that has not touched the device gets it here.
  struct RestoreDevice {
    c10::DeviceIndex previous = c10::cuda::current_device();
    ~RestoreDevice() {
      try {
        c10::cuda::set_device(previous);
      } catch (...) {
      }
    }
  } restore;
  c10::cuda::set_device(device);
  CUcontext ctx = nullptr;
  d.check(d.ctx_get_current(&ctx), "cuCtxGetCurrent");
  if (ctx == nullptr) {
    CUdevice dev = 0;
    d.check(d.device_get(&dev, device), "cuDeviceGet");
    d.check(d.primary_ctx_retain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    d.check(d.ctx_set_current(ctx), "cuCtxSetCurrent");
  }
  CUmodule module = nullptr;
  d.check(d.module_load_data(&module, binary.image.data()), "cuModuleLoadData");
  CUfunction f = nullptr;
  d.check(d.module_get_function(&f, module, name), "cuModuleGetFunction");
  functions.emplace(key, f);
  return f;
}

void launch_row_kernel(CUfunction f, const row_kernels::Launch& l, c10::DeviceIndex device, void** args) {
  if (l.grid == 0) return;
  const auto stream = c10::cuda::getCurrentCUDAStream(device);
  Driver::get().check(
      Driver::get().launch_kernel(f, l.grid, 1, 1, l.threads, 1, 1, 0, stream.stream(), args, nullptr),
      "cuLaunchKernel");
}

#endif  // SHIM_CUDA

void require_cuda(const at::Tensor& t) {
#ifdef SHIM_CUDA
  TORCH_CHECK(t.is_cuda(), "the row kernels run on CUDA only, not on ", t.device().str());
#else
  TORCH_CHECK(false, "the row kernels need the trainer built with the cuda feature");
#endif
}

struct NormForward {
  at::Tensor out, sum, rstd;
};

// residual_rms_norm_forward over x's rows; `sum` is undefined without a branch.
NormForward norm_forward(const at::Tensor& x, const at::Tensor& branch, const at::Tensor& weight, double eps,
                         at::ScalarType out_type) {
  const int64_t cols = x.size(-1);
  const int64_t rows = x.numel() / std::max<int64_t>(cols, 1);
  NormForward r;
  r.out = at::empty(x.sizes(), x.options().dtype(out_type));
  r.rstd = at::empty({rows}, x.options().dtype(at::kFloat));
  if (branch.defined()) r.sum = at::empty_like(x, at::MemoryFormat::Contiguous);
#ifdef SHIM_CUDA
  const auto xc = x.contiguous();
  const auto bc = branch.defined() ? branch.contiguous() : at::Tensor();
  const auto wc = weight.contiguous();
  const RowTypes types{x.scalar_type(), bc.defined() ? bc.scalar_type() : x.scalar_type(), weight.scalar_type(),
                       out_type};
  const auto device = x.device().index();
  CUfunction f =
      row_function("residual_rms_norm_forward", row_kernels::kResidualRmsNormForward, types,
                   row_kernels::norm_cols_per_thread(cols), device);
  void* px = xc.data_ptr();
  void* pb = bc.defined() ? bc.data_ptr() : nullptr;
  void* pw = wc.data_ptr();
  void* po = r.out.data_ptr();
  void* ps = r.sum.defined() ? r.sum.data_ptr() : nullptr;
  void* pr = r.rstd.data_ptr();
  int c = static_cast<int>(cols);
  float e = static_cast<float>(eps);
  void* args[] = {&px, &pb, &pw, &po, &ps, &pr, &c, &e};
  launch_row_kernel(f, row_kernels::norm_forward_launch(rows, c), device, args);
#endif
  return r;
}

// residual_rms_norm_backward: (gradient of x and of the branch, gradient of weight).
std::pair<at::Tensor, at::Tensor> norm_backward(const at::Tensor& grad_out, const at::Tensor& grad_sum,
                                                const at::Tensor& normed, const at::Tensor& weight,
                                                const at::Tensor& rstd) {
  at::Tensor grad_input = at::empty_like(normed, at::MemoryFormat::Contiguous);
  at::Tensor grad_weight;
#ifdef SHIM_CUDA
  const int64_t cols = normed.size(-1);
  const int64_t rows = normed.numel() / std::max<int64_t>(cols, 1);
  const auto device = normed.device().index();
  const int sms = at::cuda::getDeviceProperties(device)->multiProcessorCount;
  const auto l = row_kernels::norm_backward_launch(rows, static_cast<int>(cols), sms);
  at::Tensor partial = at::empty({static_cast<int64_t>(l.grid), cols}, normed.options().dtype(at::kFloat));
  const auto go = grad_out.contiguous();
  check_row_dtype(go.scalar_type(), "the output's gradient");
  const auto gs = grad_sum.defined() ? grad_sum.to(normed.scalar_type()).contiguous() : at::Tensor();
  const auto nc = normed.contiguous();
  const auto wc = weight.contiguous();
  const RowTypes types{normed.scalar_type(), normed.scalar_type(), weight.scalar_type(), go.scalar_type()};
  CUfunction f =
      row_function("residual_rms_norm_backward", row_kernels::kResidualRmsNormBackward, types,
                   row_kernels::norm_cols_per_thread(cols), device);
  void* pg = go.data_ptr();
  void* ps = gs.defined() ? gs.data_ptr() : nullptr;
  void* pn = nc.data_ptr();
  void* pw = wc.data_ptr();
  void* pr = rstd.data_ptr();
  void* pi = grad_input.data_ptr();
  void* pp = partial.data_ptr();
  long long r = rows;
  int c = static_cast<int>(cols);
  int per_block = l.rows_per_block;
  void* args[] = {&pg, &ps, &pn, &pw, &pr, &pi, &pp, &r, &c, &per_block};
  launch_row_kernel(f, l, device, args);
  grad_weight = partial.sum(0).to(weight.scalar_type());
#endif
  return {grad_input, grad_weight};
}

// RMSNorm of x + branch as one autograd node: outputs the norm in `out_type` and the sum
// (the residual stream the next layer adds to); saves the sum, the weight and one float
// a row.
struct ResidualRmsNormFn : public torch::autograd::Function<ResidualRmsNormFn> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                                                const at::Tensor& branch, const at::Tensor& weight, double eps,
                                                int64_t out_type) {
    auto r = norm_forward(x, branch, weight, eps, static_cast<at::ScalarType>(out_type));
    ctx->save_for_backward({r.sum, weight, r.rstd});
    return {r.out, r.sum};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    at::Tensor grad_out = grads[0].defined() ? grads[0] : at::zeros_like(saved[0]);
    auto [grad_input, grad_weight] = norm_backward(grad_out, grads[1], saved[0], saved[1], saved[2]);
    return {grad_input, grad_input, grad_weight, at::Tensor(), at::Tensor()};
  }
};

// RMSNorm of x alone, the same kernels without a branch. A node of its own rather than
// ResidualRmsNormFn with an undefined branch: autograd records every tensor input's
// device, and an undefined tensor has none.
struct RmsNormFn : public torch::autograd::Function<RmsNormFn> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                                                const at::Tensor& weight, double eps, int64_t out_type) {
    auto r = norm_forward(x, at::Tensor(), weight, eps, static_cast<at::ScalarType>(out_type));
    ctx->save_for_backward({x, weight, r.rstd});
    return {r.out};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    at::Tensor grad_out = grads[0].defined() ? grads[0] : at::zeros_like(saved[0]);
    auto [grad_input, grad_weight] = norm_backward(grad_out, at::Tensor(), saved[0], saved[1], saved[2]);
    return {grad_input, grad_weight, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

extern "C" {

// RMSNorm of x + branch (branch may be null: of x alone) over the last dimension, as one
// autograd node with the fused row kernels (CUDA only): *out in out_dtype (an
// at::ScalarType), *sum the residual stream x + branch in x's dtype (null without a
// branch).
char* shim_residual_rms_norm(const at::Tensor* x, const at::Tensor* branch, const at::Tensor* weight, double eps,
                             int out_dtype, at::Tensor** out, at::Tensor** sum) {
  return guarded([&] {
    *out = nullptr;
    *sum = nullptr;
    TORCH_CHECK(x != nullptr && x->defined() && x->dim() >= 1, "x is undefined or 0-d");
    TORCH_CHECK(weight != nullptr && weight->defined(), "weight is undefined");
    check_row_dtype(x->scalar_type(), "x");
    check_row_dtype(weight->scalar_type(), "weight");
    const auto out_type = static_cast<at::ScalarType>(out_dtype);
    check_row_dtype(out_type, "the output dtype");
    const int64_t cols = x->size(-1);
    TORCH_CHECK(cols >= 1 && cols <= row_kernels::kMaxNormCols, "x's last dimension ", cols,
                " is outside the row kernels' 1 to ", row_kernels::kMaxNormCols);
    TORCH_CHECK(weight->dim() == 1 && weight->size(0) == cols, "weight ", weight->sizes(), " is not (", cols,
                ") as x's last dimension");
    const bool has_branch = branch != nullptr && branch->defined();
    if (has_branch) {
      check_row_dtype(branch->scalar_type(), "branch");
      TORCH_CHECK(branch->sizes() == x->sizes(), "branch ", branch->sizes(), " and x ", x->sizes(),
                  " differ in shape");
      TORCH_CHECK(branch->device() == x->device(), "branch is on ", branch->device().str(), ", x on ",
                  x->device().str());
    }
    TORCH_CHECK(weight->device() == x->device(), "weight is on ", weight->device().str(), ", x on ",
                x->device().str());
    require_cuda(*x);
    const auto type = static_cast<int64_t>(out_type);
    auto r = has_branch ? ResidualRmsNormFn::apply(*x, *branch, *weight, eps, type)
                        : RmsNormFn::apply(*x, *weight, eps, type);
    *out = new at::Tensor(r[0]);
    if (has_branch) *sum = new at::Tensor(r[1]);
  });
}

// The loss chunk in place (CUDA only, no autograd): logits (rows, vocab), contiguous,
// become their gradient (softmax − one-hot)·grad_scale; *loss is each row's loss (f32,
// 0 where the target is ignore_index). grad_scale is a 0-dim f32 tensor on the device.
char* shim_cross_entropy_chunk(at::Tensor* logits, const at::Tensor* targets, int64_t ignore_index,
                               const at::Tensor* grad_scale, at::Tensor** loss) {
  return guarded([&] {
    *loss = nullptr;
    TORCH_CHECK(logits != nullptr && logits->defined() && logits->dim() == 2, "logits must be (rows, vocab)");
    check_row_dtype(logits->scalar_type(), "logits");
    TORCH_CHECK(logits->is_contiguous(), "logits must be contiguous: they are overwritten by their gradient");
    const int64_t rows = logits->size(0), vocab = logits->size(1);
    TORCH_CHECK(vocab >= 1 && vocab <= INT32_MAX, "vocab ", vocab, " is outside 1 to 2^31 − 1");
    TORCH_CHECK(targets != nullptr && targets->defined() && targets->scalar_type() == at::kLong &&
                    targets->dim() == 1 && targets->size(0) == rows,
                "targets must be int64 (", rows, "), one a row of logits");
    TORCH_CHECK(grad_scale != nullptr && grad_scale->defined() && grad_scale->dim() == 0 &&
                    grad_scale->scalar_type() == at::kFloat,
                "grad_scale must be a 0-dim float tensor");
    TORCH_CHECK(targets->device() == logits->device() && grad_scale->device() == logits->device(),
                "targets and grad_scale must be on the logits' device, ", logits->device().str());
    require_cuda(*logits);
    at::Tensor out = at::empty({rows}, logits->options().dtype(at::kFloat));
#ifdef SHIM_CUDA
    at::NoGradGuard no_grad;
    const auto device = logits->device().index();
    const auto tc = targets->contiguous();
    const RowTypes types{logits->scalar_type(), logits->scalar_type(), logits->scalar_type(), logits->scalar_type()};
    CUfunction f = row_function("cross_entropy_chunk", row_kernels::kCrossEntropyChunk, types, 0, device);
    void* pl = logits->data_ptr();
    void* pt = tc.data_ptr();
    void* po = out.data_ptr();
    int v = static_cast<int>(vocab);
    long long ignore = ignore_index;
    void* ps = grad_scale->data_ptr();
    void* args[] = {&pl, &pt, &po, &v, &ignore, &ps};
    launch_row_kernel(f, row_kernels::cross_entropy_launch(rows, v), device, args);
#endif
    *loss = new at::Tensor(std::move(out));
  });
}

#ifdef SHIM_CUDA
// Compiles one row kernel ("residual_rms_norm_forward", "residual_rms_norm_backward" or
// "cross_entropy_chunk") for the given dtypes (at::ScalarType values) and compute
// capability (major·10 + minor) through the launch path's own NVRTC, without a GPU;
// writes the binary's size and its target (sm_XY for a CUBIN, compute_XY for PTX).
char* shim_row_kernel_compile(const char* name, int stream, int branch, int weight, int out, int capability,
                              size_t* bytes, char* target, size_t target_len) {
  return guarded([&] {
    const std::map<std::string, const char*> kernels = {
        {"residual_rms_norm_forward", row_kernels::kResidualRmsNormForward},
        {"residual_rms_norm_backward", row_kernels::kResidualRmsNormBackward},
        {"cross_entropy_chunk", row_kernels::kCrossEntropyChunk}};
    const auto it = kernels.find(name);
    TORCH_CHECK(it != kernels.end(), "no row kernel named ", name);
    const RowTypes types{static_cast<at::ScalarType>(stream), static_cast<at::ScalarType>(branch),
                         static_cast<at::ScalarType>(weight), static_cast<at::ScalarType>(out)};
    for (auto t : {types.stream, types.branch, types.weight, types.out}) check_row_dtype(t, "a dtype");
    const Binary b = compile_row_kernel(row_source(it->second, types, 0), name, capability);
    *bytes = b.image.size();
    TORCH_CHECK(target_len > b.target.size(), "the target buffer is too short");
    std::copy(b.target.begin(), b.target.end(), target);
    target[b.target.size()] = '\0';
  });
}
#endif

}  // extern "C"
