//! The memory planner: what one rank of a run holds at the peak of a training step,
//! from the resolved run alone, before anything is launched. `trainer plan` prints it;
//! with `spec.topology.gpuMemory` the resolver refuses a run that cannot fit.
//!
//! The model follows the trainer's step, phase by phase:
//! - **persistent:** parameters, the optimizer's moments (1/world of them under ZeRO),
//!   and the gradient reducer's buckets (ddp, zero1) or gradient shards (zero2);
//! - **forward:** the tensors autograd saves in each block ([`activations`]), or only
//!   each recomputed block's input under gradient checkpointing;
//! - **loss:** the chunked lm_head and cross-entropy ([`crate::presets::loss_chunk_tokens`]
//!   tokens at a time): the chunk's logits, their log-softmax and both gradients, the
//!   gradient of the hidden states and the lm_head's gradient;
//! - **backward:** gradients replace activations block by block (a recomputed block
//!   holds its activations again while it runs);
//! - **optimizer step:** the gradients, and under ZeRO a bucket's all-gather buffer.
//!
//! The step's peak is the largest of those phases. Checked against the allocator's
//! count on CPU (`trainer bench-memory`, docs/perf.md); on CUDA the CUDA context and
//! the caching allocator's slack come on top as a stated allowance.

pub mod activations;
mod estimate;
mod report;

pub use estimate::{CUDA_ALLOWANCE_BYTES, GIB, MemoryPlan, Phase, Usage, plan};
pub use report::{Remedy, gib, remedies, shortfall};

#[cfg(test)]
mod tests;
