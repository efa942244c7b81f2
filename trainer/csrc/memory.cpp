// An allocator-level count of host (CPU) tensor memory, per thread: the bytes a
// thread's allocations hold now and at most since the last reset, as
// torch.cuda.max_memory_allocated counts device memory. Ranks that are threads of one
// process each count their own. A thread may also cap what it holds: an allocation
// past its cap fails as out of memory, as a smaller machine's would. Once asked for, a wrapper around libtorch's CPU
// allocator is installed for the whole process (benchmarks and tests only; training
// never installs it); it counts only for threads that turned counting on, and a free
// is charged to the thread that allocated.

#include "guarded.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

using shim::guarded;

namespace {

struct Counter {
  std::atomic<int64_t> current{0};
  std::atomic<int64_t> peak{0};
  std::atomic<int64_t> limit{0};  // 0: none

  void add(int64_t n) {
    int64_t now = current.fetch_add(n) + n;
    int64_t seen = peak.load();
    while (now > seen && !peak.compare_exchange_weak(seen, now)) {
    }
  }
};

thread_local std::shared_ptr<Counter> tls_counter;

// Every allocation of the wrapper is a plain pointer (data == context) freed by
// free_any, so libtorch's raw_allocate/raw_deallocate keep working; the counted ones
// are in a table with their size and the counter of the thread that allocated them.
struct Counted {
  int64_t bytes;
  std::shared_ptr<Counter> counter;
};

std::mutex table_mu;
std::unordered_map<void*, Counted>& table() {
  static auto* t = new std::unordered_map<void*, Counted>();  // outlives every tensor
  return *t;
}
c10::DeleterFnPtr base_free = nullptr;

void free_any(void* ptr) {
  std::shared_ptr<Counter> counter;
  int64_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(table_mu);
    auto it = table().find(ptr);
    if (it != table().end()) {
      bytes = it->second.bytes;
      counter = std::move(it->second.counter);
      table().erase(it);
    }
  }
  if (counter) counter->current.fetch_sub(bytes);
  base_free(ptr);
}

struct CountingAllocator final : c10::Allocator {
  c10::Allocator* base = nullptr;

  c10::DataPtr allocate(size_t n) override {
    if (const auto& c = tls_counter) {
      const int64_t limit = c->limit.load();
      const int64_t held = c->current.load();
      TORCH_CHECK_WITH(OutOfMemoryError, limit == 0 || held + static_cast<int64_t>(n) <= limit,
                       "host memory limit: allocating ", n, " bytes with ", held, " held would pass the cap of ",
                       limit, " bytes");
    }
    c10::DataPtr inner = base->allocate(n);
    auto device = inner.device();
    void* data = inner.get();
    TORCH_CHECK(data == inner.get_context() && inner.get_deleter() == base_free,
                "host memory counting: the CPU allocator returned a pointer it cannot count");
    inner.release_context();
    const auto& counter = tls_counter;
    if (counter && n > 0) {
      {
        std::lock_guard<std::mutex> lock(table_mu);
        table()[data] = Counted{static_cast<int64_t>(n), counter};
      }
      counter->add(static_cast<int64_t>(n));
    }
    return c10::DataPtr(data, data, &free_any, device);
  }

  c10::DeleterFnPtr raw_deleter() const override { return &free_any; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

void install() {
  static bool installed = [] {
    c10::Allocator* base = c10::GetAllocator(c10::DeviceType::CPU);
    TORCH_CHECK(base->raw_deleter() != nullptr,
                "host memory counting needs libtorch's default CPU allocator (one with a raw deleter)");
    base_free = base->raw_deleter();
    auto* a = new CountingAllocator();  // lives as long as the process
    a->base = base;
    c10::SetAllocator(c10::DeviceType::CPU, a, /*priority=*/100);
    return true;
  }();
  (void)installed;
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

// Caps what this thread may hold at `bytes` (0: no cap); it must be counting.
char* shim_host_memory_limit(int64_t bytes) {
  return guarded([&] {
    TORCH_CHECK(tls_counter, "host memory limit: this thread is not counting");
    tls_counter->limit.store(bytes);
  });
}

// Makes the peak what is held now.
char* shim_host_memory_reset_peak() {
  return guarded([&] {
    if (tls_counter) tls_counter->peak.store(tls_counter->current.load());
  });
}

}  // extern "C"
