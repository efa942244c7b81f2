// libtorch's own c10d for the trainer: TCPStore rendezvous, the Gloo (CPU) and
// NCCL (CUDA) backends, async collectives with timeouts, and a gradient reducer
// that all-reduces flat buckets from autograd hooks while backward still runs, as
// torch DDP's Reducer does. Every entry point is extern "C" and returns NULL or a
// malloc'd error message (see guarded.h); nothing unwinds across the FFI.
//
// Handles are opaque heap objects owned by Rust and freed through *_free.

#include "guarded.h"

#include <ATen/ATen.h>
#include <c10/core/ScalarType.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#ifdef SHIM_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

using shim::guarded;
using Ms = std::chrono::milliseconds;

namespace {

enum Op : int { kSum = 0, kAvg = 1, kMax = 2, kMin = 3 };

struct Group {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
  int rank = 0;
  int world = 1;
  Ms timeout{0};
  bool nccl = false;
};

// An in-flight collective. AVG on Gloo (which lacks it) is a SUM divided on wait.
// `input` keeps a separate source tensor alive until the collective is done.
struct Work {
  c10::intrusive_ptr<c10d::Work> work;
  at::Tensor tensor;
  at::Tensor input;
  int divide_by = 1;
  Ms timeout{0};
};

void wait_work(Work& w) {
  if (!w.work->wait(w.timeout)) {
    TORCH_CHECK(false, "collective timed out after ", w.timeout.count(), " ms");
  }
  if (w.divide_by > 1) w.tensor.div_(w.divide_by);
}

// The c10d op for `op`; AVG on Gloo becomes SUM and sets w.divide_by.
c10d::ReduceOp reduce_op(const Group& g, int op, Work& w) {
  switch (op) {
    case kSum: return c10d::ReduceOp::SUM;
    case kAvg:
      if (g.nccl) return c10d::ReduceOp::AVG;
      w.divide_by = g.world;
      return c10d::ReduceOp::SUM;
    case kMax: return c10d::ReduceOp::MAX;
    case kMin: return c10d::ReduceOp::MIN;
    default: break;
  }
  TORCH_CHECK(false, "unknown reduce op ", op);
}

Work start_allreduce(Group& g, at::Tensor t, int op) {
  c10d::AllreduceOptions o;
  o.timeout = g.timeout;
  Work w;
  w.tensor = t;
  w.timeout = g.timeout;
  o.reduceOp = reduce_op(g, op, w);
  std::vector<at::Tensor> ts{t};
  w.work = g.backend->allreduce(ts, o);
  return w;
}

// The tensors of a reduce-scatter or an all-gather: `all` holds world chunks of
// `chunk`'s size end to end; one dtype and device, both contiguous.
void check_chunks(const char* op, const Group& g, const at::Tensor& all, const at::Tensor& chunk) {
  TORCH_CHECK(all.numel() == chunk.numel() * g.world, op, ": the world-sized tensor has ", all.numel(),
              " elements, not ", chunk.numel(), " times the world size ", g.world);
  TORCH_CHECK(all.scalar_type() == chunk.scalar_type() && all.device() == chunk.device(), op,
              ": input and output differ in dtype or device");
  TORCH_CHECK(all.is_contiguous() && chunk.is_contiguous(), op, ": tensors must be contiguous");
}

// Reduce-scatter: `in` is world equal chunks end to end; rank r's `out` (one chunk)
// gets chunk r reduced over every rank.
Work start_reduce_scatter(Group& g, at::Tensor out, at::Tensor in, int op) {
  check_chunks("reduce_scatter", g, in, out);
  c10d::ReduceScatterOptions o;
  o.timeout = g.timeout;
  Work w;
  w.tensor = out;
  w.input = in;
  w.timeout = g.timeout;
  o.reduceOp = reduce_op(g, op, w);
  w.work = g.backend->_reduce_scatter_base(out, in, o);
  return w;
}

// All-gather: rank r's `in` lands as chunk r of every rank's `out` (world chunks end
// to end).
Work start_all_gather(Group& g, at::Tensor out, at::Tensor in) {
  check_chunks("all_gather", g, out, in);
  c10d::AllgatherOptions o;
  o.timeout = g.timeout;
  Work w;
  w.tensor = out;
  w.input = in;
  w.timeout = g.timeout;
  w.work = g.backend->_allgather_base(out, in, o);
  return w;
}

// Gradient reducer state. Hooks hold it weakly, so a freed reducer turns them into
// no-ops even if libtorch keeps the accumulator nodes alive.
//
// All-reduce mode keeps one flat buffer per bucket; an armed pass copies the gradients
// in, all-reduces each bucket as it fills, and writes the averages back to `.grad`.
// Scatter mode (ZeRO-2) is armed on every micro-step of an accumulation: each
// gradient is added into its bucket's buffer (allocated at the step's first gradient)
// and freed at once, so no parameter keeps a `.grad`. The accumulation sums in the
// order autograd's accumulation does, so the buffers hold what DDP's would. On the
// last micro-step (`sync`) each bucket is reduce-scattered as it fills, its buffer
// freed once sent, and this rank's shard of the average lands in `shard_grad`.
struct Bucket {
  std::vector<size_t> members;   // parameter indices, in launch order
  std::vector<int64_t> offsets;  // element offset of each member in flat
  int64_t len = 0;               // elements of flat, padding included
  at::TensorOptions options;
  at::Tensor flat;
  at::Tensor shard_grad;  // scatter mode: this rank's len / world elements
  size_t pending = 0;
  bool launched = false;
  Work work;
};

struct Reducer {
  std::mutex mu;
  Group* group = nullptr;
  bool scatter = false;
  std::vector<at::Tensor> params;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  std::vector<uintptr_t> hook_keys;
  std::vector<Bucket> buckets;
  std::vector<size_t> bucket_of, slot_of;
  std::vector<char> ready;
  size_t next_launch = 0;
  bool armed = false;
  bool sync = false;  // this pass sends the buckets

  at::Tensor slot(size_t i) {
    auto& b = buckets[bucket_of[i]];
    return b.flat.narrow(0, b.offsets[slot_of[i]], params[i].numel()).view(params[i].sizes());
  }

  void ensure_flat(Bucket& b) {
    if (!b.flat.defined()) b.flat = at::zeros({b.len}, b.options);
  }

  // Called with mu held: param i's gradient into its slot. All-reduce mode copies it
  // (zeros when it got none); scatter mode adds it and frees it.
  void stage(size_t i) {
    auto& b = buckets[bucket_of[i]];
    at::Tensor& grad = params[i].mutable_grad();
    if (scatter) {
      if (grad.defined()) {
        ensure_flat(b);
        slot(i).add_(grad);
        grad.reset();
      }
    } else if (grad.defined()) {
      slot(i).copy_(grad);
    } else {
      slot(i).zero_();
    }
    ready[i] = 1;
    b.pending -= 1;
  }

  // Scatter mode: waits for bucket b's reduce-scatter and keeps this rank's average.
  void land(Bucket& b) {
    wait_work(b.work);
    b.shard_grad.copy_(b.work.tensor.div_(group->world));
    b.work = Work();
  }

  // Buckets go out strictly in index order on every rank, so collectives match.
  // Scatter mode keeps at most kInFlight buckets' buffers alive: before sending one it
  // lands the one sent kInFlight before.
  static constexpr size_t kInFlight = 2;
  void launch_ready() {
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0) {
      if (scatter && next_launch >= kInFlight) {
        auto& old = buckets[next_launch - kInFlight];
        if (old.work.work) land(old);
      }
      auto& b = buckets[next_launch++];
      if (scatter) {
        ensure_flat(b);
        b.work = start_reduce_scatter(*group, at::empty({b.len / group->world}, b.options), b.flat, kSum);
        b.flat = at::Tensor();  // the work keeps it until the collective is done
      } else {
        b.work = start_allreduce(*group, b.flat, kSum);
      }
      b.launched = true;
    }
  }

  void on_grad_ready(size_t i) {
    std::lock_guard<std::mutex> lock(mu);
    if (!armed) return;
    TORCH_CHECK(!ready[i], "gradient reducer: parameter ", i,
                " received a gradient twice in one synchronized backward pass; "
                "backpropagate each parameter's whole gradient in one accumulation");
    stage(i);
    if (sync) launch_ready();
  }
};

class ReadyHook : public torch::autograd::FunctionPostHook {
 public:
  ReadyHook(std::weak_ptr<Reducer> r, size_t i) : reducer_(std::move(r)), index_(i) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    if (auto r = reducer_.lock()) r->on_grad_ready(index_);
    return outputs;
  }

 private:
  std::weak_ptr<Reducer> reducer_;
  size_t index_;
};

}  // namespace

extern "C" {

// Rendezvous through a TCPStore (rank 0 hosts it at host:port) and create the Gloo
// or NCCL backend. The store waits join_timeout_ms for every rank; each collective
// then has timeout_ms. gloo_iface/gloo_host pick the Gloo transport device (interface
// name, or hostname/address to bind); both empty: libtorch's default device.
char* shim_pg_new(const char* backend, const char* host, int port, int rank, int world, int64_t join_timeout_ms,
                  int64_t timeout_ms, const char* gloo_iface, const char* gloo_host, int cuda_device, void** out) {
  return guarded([&] {
    *out = nullptr;
    TORCH_CHECK(world >= 1 && rank >= 0 && rank < world, "rank ", rank, " of world size ", world);
    auto g = std::make_unique<Group>();
    g->rank = rank;
    g->world = world;
    g->timeout = Ms(timeout_ms);
    c10d::TCPStoreOptions so;
    so.port = static_cast<std::uint16_t>(port);
    so.isServer = rank == 0;
    so.numWorkers = static_cast<std::size_t>(world);
    so.waitWorkers = true;
    so.timeout = Ms(join_timeout_ms);
    g->store = c10::make_intrusive<c10d::TCPStore>(std::string(host), so);
    std::string name(backend);
    if (name == "gloo") {
      auto opts = c10d::ProcessGroupGloo::Options::create(g->timeout);
      std::string iface(gloo_iface), ghost(gloo_host);
      if (!iface.empty()) {
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(iface));
      } else if (!ghost.empty()) {
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(ghost));
      } else {
        opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      }
      g->backend = c10::make_intrusive<c10d::ProcessGroupGloo>(g->store, rank, world, opts);
    } else if (name == "nccl") {
#ifdef SHIM_NCCL
      c10::cuda::set_device(static_cast<c10::DeviceIndex>(cuda_device));
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = g->timeout;
      g->backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(g->store, rank, world, opts);
      g->nccl = true;
#else
      TORCH_CHECK(false, "this trainer was built without the `cuda` feature, so it has no NCCL");
#endif
    } else {
      TORCH_CHECK(false, "unknown c10d backend '", name, "' (gloo or nccl)");
    }
    *out = g.release();
  });
}

void shim_pg_free(void* g) { delete static_cast<Group*>(g); }

// Starts an all-reduce of t in place (op: 0 sum, 1 avg, 2 max, 3 min).
char* shim_pg_allreduce(void* g, at::Tensor* t, int op, void** work) {
  return guarded([&] {
    *work = nullptr;
    TORCH_CHECK(t != nullptr && t->defined(), "allreduce: undefined tensor");
    *work = new Work(start_allreduce(*static_cast<Group*>(g), *t, op));
  });
}

// Starts a reduce-scatter of in (world chunks) into out (op as in allreduce).
char* shim_pg_reduce_scatter(void* g, at::Tensor* out, at::Tensor* in, int op, void** work) {
  return guarded([&] {
    *work = nullptr;
    TORCH_CHECK(out != nullptr && out->defined() && in != nullptr && in->defined(), "reduce_scatter: undefined tensor");
    *work = new Work(start_reduce_scatter(*static_cast<Group*>(g), *out, *in, op));
  });
}

// Starts an all-gather of in into out (world chunks).
char* shim_pg_all_gather(void* g, at::Tensor* out, at::Tensor* in, void** work) {
  return guarded([&] {
    *work = nullptr;
    TORCH_CHECK(out != nullptr && out->defined() && in != nullptr && in->defined(), "all_gather: undefined tensor");
    *work = new Work(start_all_gather(*static_cast<Group*>(g), *out, *in));
  });
}

// Starts a broadcast of t in place from root.
char* shim_pg_broadcast(void* gp, at::Tensor* t, int root, void** work) {
  return guarded([&] {
    *work = nullptr;
    auto& g = *static_cast<Group*>(gp);
    TORCH_CHECK(t != nullptr && t->defined(), "broadcast: undefined tensor");
    c10d::BroadcastOptions o;
    o.rootRank = root;
    o.timeout = g.timeout;
    std::vector<at::Tensor> ts{*t};
    auto w = std::make_unique<Work>();
    w->tensor = *t;
    w->timeout = g.timeout;
    w->work = g.backend->broadcast(ts, o);
    *work = w.release();
  });
}

// Blocks the host until every rank arrives (an all-reduce of one element, read back).
char* shim_pg_barrier(void* gp, int cuda_device) {
  return guarded([&] {
    auto& g = *static_cast<Group*>(gp);
    auto device = g.nccl ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(cuda_device)) : at::Device(at::kCPU);
    auto t = at::ones({1}, at::TensorOptions().dtype(at::kFloat).device(device));
    auto w = start_allreduce(g, t, kSum);
    wait_work(w);
    auto arrived = t.item<float>();
    TORCH_CHECK(arrived == static_cast<float>(g.world), "barrier: ", arrived, " of ", g.world, " ranks arrived");
  });
}

// Waits for a collective (host-blocking on Gloo; on NCCL the current stream waits).
char* shim_work_wait(void* w) {
  return guarded([&] { wait_work(*static_cast<Work*>(w)); });
}

void shim_work_free(void* w) { delete static_cast<Work*>(w); }

// A gradient reducer over n leaf parameters. bucket_of[i] is param i's bucket and
// offset_of[i] its element offset in the bucket's flat buffer of bucket_len[b]
// elements; buckets are launched in index order, so index 0 should hold the
// parameters whose gradients backward produces first. Every bucket's params share
// dtype and device. Buckets go out from AccumulateGrad hooks as they fill, so each
// param must get its whole gradient in one accumulation per armed pass.
// shard_grads NULL: all-reduce mode. Otherwise scatter mode: shard_grads[b] holds
// bucket_len[b] / world elements, to which each pass adds this rank's shard.
char* shim_reducer_new(void* gp, at::Tensor* const* params, const int64_t* bucket_of, const int64_t* offset_of,
                       size_t n, const int64_t* bucket_len, at::Tensor* const* shard_grads, size_t n_buckets,
                       void** out) {
  return guarded([&] {
    *out = nullptr;
    auto r = std::make_shared<Reducer>();
    r->group = static_cast<Group*>(gp);
    r->scatter = shard_grads != nullptr;
    r->buckets.resize(n_buckets);
    r->bucket_of.resize(n);
    r->slot_of.resize(n);
    r->ready.assign(n, 0);
    for (size_t i = 0; i < n; ++i) {
      TORCH_CHECK(params[i] != nullptr && params[i]->defined(), "reducer: params[", i, "] is undefined");
      const at::Tensor& p = *params[i];
      TORCH_CHECK(p.requires_grad() && p.is_leaf(), "reducer: params[", i, "] is not a leaf that requires grad");
      TORCH_CHECK(bucket_of[i] >= 0 && static_cast<size_t>(bucket_of[i]) < n_buckets, "reducer: bucket of param ",
                  i, " out of range");
      auto b = static_cast<size_t>(bucket_of[i]);
      auto& bucket = r->buckets[b];
      if (!bucket.members.empty()) {
        const auto& first = r->params[bucket.members[0]];
        TORCH_CHECK(first.scalar_type() == p.scalar_type() && first.device() == p.device(), "reducer: bucket ", b,
                    " mixes dtypes or devices");
      }
      TORCH_CHECK(offset_of[i] >= 0 && offset_of[i] + p.numel() <= bucket_len[b], "reducer: param ", i,
                  " does not fit its bucket");
      r->params.push_back(p);
      r->bucket_of[i] = b;
      r->slot_of[i] = bucket.members.size();
      bucket.members.push_back(i);
      bucket.offsets.push_back(offset_of[i]);
    }
    for (size_t b = 0; b < n_buckets; ++b) {
      auto& bucket = r->buckets[b];
      TORCH_CHECK(!bucket.members.empty(), "reducer: bucket ", b, " is empty");
      bucket.len = bucket_len[b];
      bucket.options = r->params[bucket.members[0]].options().requires_grad(false);
      if (r->scatter) {
        TORCH_CHECK(bucket.len % r->group->world == 0, "reducer: bucket ", b, " of ", bucket.len,
                    " elements does not split over ", r->group->world, " ranks");
        TORCH_CHECK(shard_grads[b] != nullptr && shard_grads[b]->numel() == bucket.len / r->group->world &&
                        shard_grads[b]->is_contiguous() &&
                        shard_grads[b]->scalar_type() == bucket.options.dtype().toScalarType() &&
                        shard_grads[b]->device() == bucket.options.device(),
                    "reducer: the gradient shard of bucket ", b, " is not a contiguous ", bucket.len / r->group->world,
                    "-element tensor of its parameters' dtype and device");
        bucket.shard_grad = *shard_grads[b];
      } else {
        bucket.flat = at::zeros({bucket.len}, bucket.options);
      }
    }
    std::weak_ptr<Reducer> weak = r;
    for (size_t i = 0; i < n; ++i) {
      auto acc = torch::autograd::impl::grad_accumulator(r->params[i]);
      TORCH_CHECK(acc != nullptr, "reducer: params[", i, "] has no gradient accumulator");
      r->hook_keys.push_back(acc->add_post_hook(std::make_unique<ReadyHook>(weak, i)));
      r->accumulators.push_back(std::move(acc));
    }
    *out = new std::shared_ptr<Reducer>(std::move(r));
  });
}

void shim_reducer_free(void* rp) {
  auto* holder = static_cast<std::shared_ptr<Reducer>*>(rp);
  {
    auto& r = **holder;
    std::lock_guard<std::mutex> lock(r.mu);
    for (size_t i = 0; i < r.accumulators.size(); ++i) r.accumulators[i]->del_post_hook(r.hook_keys[i]);
  }
  delete holder;
}

// Arms the reducer for the next backward pass. sync: the pass sends the buckets (an
// all-reduce mode reducer is armed only for such passes).
char* shim_reducer_prepare(void* rp, int sync) {
  return guarded([&] {
    auto& r = **static_cast<std::shared_ptr<Reducer>*>(rp);
    std::lock_guard<std::mutex> lock(r.mu);
    TORCH_CHECK(!r.armed, "reducer: prepare called twice without finish");
    TORCH_CHECK(sync || r.scatter, "reducer: only a scattering reducer accumulates without sending");
    std::fill(r.ready.begin(), r.ready.end(), 0);
    for (auto& b : r.buckets) {
      b.pending = b.members.size();
      b.launched = false;
      b.work = Work();
    }
    r.next_launch = 0;
    r.sync = sync != 0;
    r.armed = true;
  });
}

// After the armed backward: stages what the hooks did not (params without a gradient
// count as zeros). A sync pass then waits for every bucket: all-reduce mode writes the
// rank-averaged gradients back, scatter mode this rank's averaged shards.
char* shim_reducer_finish(void* rp) {
  return guarded([&] {
    auto& r = **static_cast<std::shared_ptr<Reducer>*>(rp);
    std::lock_guard<std::mutex> lock(r.mu);
    TORCH_CHECK(r.armed, "reducer: finish without prepare");
    r.armed = false;
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < r.params.size(); ++i) {
      if (!r.ready[i]) r.stage(i);
    }
    if (!r.sync) return;
    r.launch_ready();
    const auto world = r.group->world;
    for (auto& b : r.buckets) {
      if (r.scatter) {
        if (b.work.work) r.land(b);
      } else {
        wait_work(b.work);
        b.flat.div_(world);
        for (size_t i : b.members) {
          at::Tensor& grad = r.params[i].mutable_grad();
          if (grad.defined()) {
            grad.copy_(r.slot(i));
          } else {
            grad = r.slot(i).clone();
          }
        }
      }
      b.work = Work();
    }
  });
}

// The global gradient norm's parts after a sync pass: out is a float [buckets, world]
// table of the norms of each rank's shard of each bucket's averaged gradients. All-reduce
// mode holds every shard and fills the table; scatter mode fills its own column and
// leaves zeros for the ranks to sum. Every strategy computes each entry with the same
// kernel on the same values, so the norm of the table rounds the same under all.
char* shim_reducer_shard_norms(void* rp, at::Tensor** out) {
  return guarded([&] {
    *out = nullptr;
    auto& r = **static_cast<std::shared_ptr<Reducer>*>(rp);
    std::lock_guard<std::mutex> lock(r.mu);
    TORCH_CHECK(!r.armed, "reducer: shard norms asked for during a pass");
    at::NoGradGuard no_grad;
    const auto world = r.group->world;
    const auto n_buckets = static_cast<int64_t>(r.buckets.size());
    auto device = r.buckets.empty() ? at::Device(at::kCPU) : r.buckets[0].options.device();
    auto table = at::zeros({n_buckets, world}, at::TensorOptions().dtype(at::kFloat).device(device));
    std::vector<at::Tensor> shards;
    for (auto& b : r.buckets) {
      if (r.scatter) {
        shards.push_back(b.shard_grad);
      } else {
        for (auto& chunk : b.flat.chunk(world)) shards.push_back(chunk);
      }
    }
    if (!shards.empty()) {
      auto norms = at::stack(at::_foreach_norm(shards, 2, at::kFloat)).to(device);
      if (r.scatter) {
        table.select(1, r.group->rank).copy_(norms);
      } else {
        table.copy_(norms.view({n_buckets, world}));
      }
    }
    *out = new at::Tensor(std::move(table));
  });
}

}  // extern "C"
