// CUDA events that time the work of a stream: what a rank's step took on its GPU,
// where the host only enqueues it. Built with SHIM_CUDA only. Through c10's
// device-generic Event and guard (virtual calls into libc10_cuda), so the shim itself
// calls no CUDA runtime function: at::cuda::CUDAEvent's inline ones would need the
// binary to link libcudart.

#include "guarded.h"

#ifdef SHIM_CUDA
#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

using shim::guarded;

extern "C" {

// An event that keeps time (BACKEND_DEFAULT: cudaEventDefault; PyTorch's default
// disables timing).
char* shim_cuda_event_new(c10::Event** out) {
  return guarded([&] {
    *out = nullptr;
    *out = new c10::Event(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
  });
}

void shim_cuda_event_free(c10::Event* e) { delete e; }

// Records the event on the current stream of CUDA device `device`.
char* shim_cuda_event_record(c10::Event* e, int device) {
  return guarded([&] {
    c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
    e->record(impl.getStream(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device))));
  });
}

// Milliseconds from `start` to `end`, both recorded and completed (an error otherwise).
char* shim_cuda_event_elapsed_ms(c10::Event* start, c10::Event* end, double* out) {
  return guarded([&] { *out = start->elapsedTime(*end); });
}

}  // extern "C"
#endif
