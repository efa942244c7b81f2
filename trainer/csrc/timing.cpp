// CUDA events that time the work of a stream: what a rank's step took on its GPU,
// where the host only enqueues it. Built with SHIM_CUDA only.

#include "guarded.h"

#ifdef SHIM_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>

using shim::guarded;

extern "C" {

// An event that keeps time (cudaEventDefault; CUDAEvent's own default does not).
char* shim_cuda_event_new(at::cuda::CUDAEvent** out) {
  return guarded([&] {
    *out = nullptr;
    *out = new at::cuda::CUDAEvent(cudaEventDefault);
  });
}

void shim_cuda_event_free(at::cuda::CUDAEvent* e) { delete e; }

// Records the event on the current stream of CUDA device `device`.
char* shim_cuda_event_record(at::cuda::CUDAEvent* e, int device) {
  return guarded([&] { e->record(c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device))); });
}

// Milliseconds from `start` to `end`, both recorded and completed (an error otherwise).
char* shim_cuda_event_elapsed_ms(at::cuda::CUDAEvent* start, at::cuda::CUDAEvent* end, double* out) {
  return guarded([&] { *out = static_cast<double>(start->elapsed_time(*end)); });
}

}  // extern "C"
#endif
