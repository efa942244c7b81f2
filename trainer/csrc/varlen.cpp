// Variable-length flash attention for `spec.data.packing: documents` on CUDA: the
// documents of a packed batch as one run of tokens with their cumulative lengths, each
// attending causally within itself, through ATen's own `_flash_attention_forward` (its
// autograd node runs `_flash_attention_backward`). No (T, T) mask exists.

#include <ATen/ATen.h>

#include "guarded.h"

using shim::guarded;

extern "C" {

// q (tokens, n_head, d_head), k and v (tokens, n_kv_head, d_head), bf16 or f16 on CUDA;
// `cu_seqlens` (documents + 1) int32, from 0 to tokens; `max_seqlen` the longest
// document. Writes the output (tokens, n_head, d_head).
char* shim_flash_varlen(const at::Tensor* q, const at::Tensor* k, const at::Tensor* v, const at::Tensor* cu_seqlens,
                        int64_t max_seqlen, at::Tensor** out) {
  return guarded([&] {
    *out = nullptr;
    TORCH_CHECK(q->is_cuda(), "flash varlen attention runs on CUDA only, not on ", q->device());
    TORCH_CHECK(q->dim() == 3 && k->dim() == 3 && v->dim() == 3, "q, k, v must be (tokens, heads, d_head)");
    TORCH_CHECK(cu_seqlens->scalar_type() == at::kInt, "cu_seqlens must be int32, not ", cu_seqlens->scalar_type());
    auto result = at::_flash_attention_forward(*q, *k, *v, *cu_seqlens, *cu_seqlens, max_seqlen, max_seqlen,
                                               /*dropout_p=*/0.0, /*is_causal=*/true, /*return_debug_mask=*/false);
    *out = new at::Tensor(std::get<0>(result));
  });
}

}  // extern "C"
