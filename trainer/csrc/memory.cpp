// An allocator-level count of host (CPU) tensor memory, per thread: the bytes a
// thread's allocations hold now and at most since the last reset, as
// torch.cuda.max_memory_allocated counts device memory. Ranks that are threads of one
// process each count their own. Once asked for, a wrapper around libtorch's CPU
// allocator is installed for the whole process; it counts only for threads that turned
// counting on, and a free is charged to the thread that allocated.

#include "guarded.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

using shim::guarded;

namespace {

struct Counter {
  std::atomic<int64_t> current{0};
  std::atomic<int64_t> peak{0};

  void add(int64_t n) {
    int64_t now = current.fetch_add(n) + n;
    int64_t seen = peak.load();
    while (now > seen && !peak.compare_exchange_weak(seen, now)) {
    }
  }
};

thread_local std::shared_ptr<Counter> tls_counter;

// What a counted allocation carries to its deleter.
struct Counted {
  c10::DataPtr inner;
  int64_t bytes;
  std::shared_ptr<Counter> counter;
};

void free_counted(void* ctx) {
  auto* c = static_cast<Counted*>(ctx);
  c->counter->current.fetch_sub(c->bytes);
  delete c;
}

struct CountingAllocator final : c10::Allocator {
  c10::Allocator* base = nullptr;

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = base->allocate(n);
    const auto& counter = tls_counter;
    if (!counter || n == 0) return inner;
    counter->add(static_cast<int64_t>(n));
    void* data = inner.get();
    auto device = inner.device();
    auto* ctx = new Counted{std::move(inner), static_cast<int64_t>(n), counter};
    return c10::DataPtr(data, ctx, &free_counted, device);
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

CountingAllocator* install() {
  static CountingAllocator* allocator = [] {
    auto* a = new CountingAllocator();  // lives as long as the process
    a->base = c10::GetAllocator(c10::DeviceType::CPU);
    c10::SetAllocator(c10::DeviceType::CPU, a, /*priority=*/100);
    return a;
  }();
  return allocator;
}

}  // namespace

extern "C" {

// Starts (on != 0, from zero) or stops counting this thread's host allocations.
char* shim_host_memory_count(int on) {
  return guarded([&] {
    install();
    tls_counter = on ? std::make_shared<Counter>() : nullptr;
  });
}

// This thread's counted bytes: held now, and the most held since counting started or
// the peak was last reset. Zeros when the thread is not counting.
char* shim_host_memory(int64_t* current, int64_t* peak) {
  return guarded([&] {
    *current = tls_counter ? tls_counter->current.load() : 0;
    *peak = tls_counter ? tls_counter->peak.load() : 0;
  });
}

// Makes the peak what is held now.
char* shim_host_memory_reset_peak() {
  return guarded([&] {
    if (tls_counter) tls_counter->peak.store(tls_counter->current.load());
  });
}

}  // extern "C"
