//! The model of a rank's step, phase by phase (see the module above).

use super::activations::{Dtypes, per_token};
use crate::config::{Device, RunConfig};
use crate::presets::loss_chunk_tokens;
use crate::types::{Packing, Parallelism, Precision};

/// Bytes in a GiB.
pub const GIB: u64 = 1 << 30;

/// What the CUDA context, cuBLAS/cuDNN workspaces, NCCL's buffers and the caching
/// allocator's fragmentation take on a GPU beyond the tensors: a flat allowance, as
/// PyTorch's own guidance sizes it (the context alone is 0.5–1 GiB).
pub const CUDA_ALLOWANCE_BYTES: u64 = 3 * GIB / 2;

/// Buckets zero2's reducer keeps in flight at once (`kInFlight` in the shim).
const IN_FLIGHT_BUCKETS: u64 = 2;

/// Where in the step the peak falls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The loss of the last micro-step: every saved activation, and the chunk's logits.
    Loss,
    /// A recomputed block's backward under gradient checkpointing.
    Recompute,
    /// The end of backward: every gradient.
    Backward,
    /// The optimizer step.
    Optimizer,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Loss => "loss",
            Phase::Recompute => "recomputed block",
            Phase::Backward => "end of backward",
            Phase::Optimizer => "optimizer step",
        }
    }
}

/// Bytes one rank holds at one moment, by what holds them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub parameters: u64,
    /// Gradients, whole or sharded, with the reducer's buckets.
    pub gradients: u64,
    pub optimizer_state: u64,
    /// bf16 copies of the weights autocast caches for one forward and backward.
    pub autocast_weights: u64,
    /// Saved for backward.
    pub activations: u64,
    /// The loss chunk's logits (which become their gradient in place), and the hidden
    /// states' gradient.
    pub loss: u64,
    /// ZeRO's all-gather buffers.
    pub buffers: u64,
}

impl Usage {
    pub fn total(&self) -> u64 {
        self.parameters
            + self.gradients
            + self.optimizer_state
            + self.autocast_weights
            + self.activations
            + self.loss
            + self.buffers
    }
}

/// A run's memory per rank.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryPlan {
    pub world_size: u32,
    pub parallelism: Parallelism,
    pub device: Device,
    pub micro_batch: u32,
    pub seq_len: u32,
    pub recomputed_blocks: u32,
    /// The step's peak and where it falls.
    pub phase: Phase,
    pub peak: Usage,
    /// Saved activations of one micro-step with every block keeping its own, and with
    /// every block recomputed: what gradient checkpointing trades.
    pub activations_without_checkpointing: u64,
    pub activations_with_checkpointing: u64,
    /// [`CUDA_ALLOWANCE_BYTES`] on CUDA; 0 on CPU.
    pub allowance: u64,
}

impl MemoryPlan {
    /// The step's peak of tensor memory.
    pub fn step_peak(&self) -> u64 {
        self.peak.total()
    }

    /// What a device needs: the peak and the allowance.
    pub fn needed(&self) -> u64 {
        self.step_peak() + self.allowance
    }
}

/// Parameter bytes of fsdp's units.
struct Units {
    /// The token (and position) embedding.
    embedding: u64,
    /// The embedding again where the head reads it (tied), else 0.
    tied_embedding: u64,
    /// The final norm and an untied lm_head.
    head: u64,
    block: u64,
}

impl Units {
    fn of(m: &crate::presets::ModelConfig, bytes: u64) -> Units {
        let (v, d) = (u64::from(m.vocab_size), u64::from(m.d_model));
        let positions = if m.arch == crate::presets::Arch::Gpt2 { u64::from(m.max_seq_len) * d } else { 0 };
        let embedding = (v * d + positions) * bytes;
        let norm = if m.arch == crate::presets::Arch::Gpt2 { 2 * d } else { d };
        let head = (norm + if m.tied_embeddings { 0 } else { v * d }) * bytes;
        let total = m.param_counts().total * bytes;
        let block = total.saturating_sub(embedding + head) / u64::from(m.n_layer.max(1));
        Units { embedding, tied_embedding: if m.tied_embeddings { embedding } else { 0 }, head, block }
    }
}

/// The shape of the computation the planner needs from a run.
struct Shape {
    params: u64,
    /// Bytes of one parameter element (f32, or bf16 under `precision: bf16`).
    param_bytes: u64,
    world: u64,
    tokens: u64,
    n_layer: u64,
    recomputed: u64,
    d_model: u64,
    vocab: u64,
    /// Elements of the largest parameter (the embedding or lm_head).
    largest_param: u64,
    bucket_bytes: u64,
    accumulates: bool,
    dtypes: Dtypes,
}

/// The per-rank plan of `cfg`'s training step.
pub fn plan(cfg: &RunConfig) -> MemoryPlan {
    let m = &cfg.model;
    let cuda = cfg.topology.device == Device::Cuda;
    let param_bytes = if cfg.precision == Precision::Bf16 { 2 } else { 4 };
    let s = Shape {
        params: cfg.params.total,
        param_bytes,
        world: u64::from(cfg.topology.world_size.max(1)),
        tokens: u64::from(cfg.batch.micro_batch) * u64::from(cfg.batch.seq_len),
        n_layer: u64::from(m.n_layer),
        recomputed: u64::from(cfg.recomputed_blocks()),
        d_model: u64::from(m.d_model),
        vocab: u64::from(m.vocab_size),
        largest_param: u64::from(m.vocab_size) * u64::from(m.d_model),
        bucket_bytes: u64::from(cfg.topology.bucket_cap_mb) << 20,
        accumulates: cfg.batch.grad_accum > 1,
        dtypes: Dtypes::of(cfg.precision, cuda),
    };
    let parallelism = if s.world > 1 { cfg.parallelism } else { Parallelism::Ddp };
    let weights = s.params * s.param_bytes;
    let sharded = |bytes: u64| bytes.div_ceil(s.world);

    // Persistent: parameters, moments, the reducer's buckets or shards.
    let moments = 2 * weights;
    let optimizer_state = match parallelism {
        Parallelism::Ddp => moments,
        _ => sharded(moments),
    };
    let reducer = match (s.world > 1, parallelism) {
        (false, _) => 0,
        (true, Parallelism::Ddp | Parallelism::Zero1) => weights,
        (true, Parallelism::Zero2 | Parallelism::Fsdp) => sharded(weights),
    };
    // fsdp keeps a shard of every parameter and gathers a unit (the embedding, a block,
    // the head) while it runs, with the next one prefetched.
    let fsdp = parallelism == Parallelism::Fsdp;
    let units = Units::of(m, s.param_bytes);
    // Buckets never span units and hold at least one parameter: the largest is capped
    // by the unit, and at least the largest parameter.
    let largest_bucket = s
        .bucket_bytes
        .min(units.block.max(units.embedding).max(units.head))
        .max(s.largest_param * s.param_bytes)
        .min(weights);
    let resident_params = if fsdp { sharded(weights) } else { weights };
    let gathered = |bytes: u64| if fsdp { bytes } else { 0 };
    // Gradients while a step runs: `.grad` (ddp, zero1), or zero2's buckets, which hold
    // the local sum through an accumulation and otherwise only while in flight (two at
    // most), each with its reduce-scattered shard and, on Gloo, the collective's copy.
    let step_grads = match parallelism {
        Parallelism::Ddp | Parallelism::Zero1 => weights,
        Parallelism::Zero2 | Parallelism::Fsdp => {
            let in_flight = (IN_FLIGHT_BUCKETS * largest_bucket).min(weights);
            let local = if s.accumulates { weights } else { in_flight };
            let gloo = if cuda { 0 } else { in_flight };
            local + gloo + sharded(in_flight)
        }
    };
    let carried = if s.accumulates { step_grads } else { 0 };
    let autocast_weights = if s.dtypes.autocast { s.params * 2 } else { 0 };
    let base = Usage { parameters: resident_params, gradients: reducer, optimizer_state, ..Usage::default() };

    let block = per_token(m, &s.dtypes) * s.tokens;
    let kept = s.n_layer - s.recomputed;
    let embedding = s.tokens * s.d_model * s.dtypes.residual;
    let full = embedding + s.n_layer * block;
    let checkpointed = embedding + s.n_layer * s.tokens * s.d_model * s.dtypes.residual;
    let saved = embedding + s.recomputed * s.tokens * s.d_model * s.dtypes.residual + kept * block;
    let documents = documents_bytes(cfg, &s.dtypes);

    // The loss chunk: one f32 buffer of logits that becomes their gradient in place
    // (the trainer's fused classifier), with a 16-bit copy beside it where the matmuls
    // run in bf16; the hidden states' gradient; the lm_head's gradient from the chunk.
    let chunk = (loss_chunk_tokens(s.vocab as i64) as u64).min(s.tokens);
    let low_precision = if s.dtypes.autocast || s.dtypes.residual < 4 { 2 } else { 0 };
    let loss = chunk * s.vocab * (4 + low_precision) + s.tokens * s.d_model * s.dtypes.residual;
    let head_grad = s.largest_param * s.param_bytes;

    let phases = [
        (
            Phase::Loss,
            Usage {
                // The head (and a tied embedding), the blocks that keep their
                // activations, and the next block prefetched.
                parameters: base.parameters
                    + gathered(units.head + units.tied_embedding + (kept + 1).min(s.n_layer) * units.block),
                gradients: base.gradients + carried + head_grad,
                autocast_weights,
                activations: saved + documents,
                loss,
                ..base
            },
        ),
        (
            Phase::Recompute,
            Usage {
                parameters: base.parameters + gathered(units.tied_embedding + 2 * units.block),
                gradients: base.gradients + step_grads,
                autocast_weights,
                // Every recomputed block's input stays until backward ends; one block's
                // activations again, and about half as much again in its gradients.
                activations: if s.recomputed > 0 {
                    embedding + s.recomputed * s.tokens * s.d_model * s.dtypes.residual + block + block / 2 + documents
                } else {
                    0
                },
                ..base
            },
        ),
        (
            Phase::Backward,
            Usage {
                parameters: base.parameters + gathered(units.embedding + units.block),
                gradients: base.gradients + step_grads,
                autocast_weights,
                ..base
            },
        ),
        (
            Phase::Optimizer,
            Usage {
                gradients: base.gradients
                    + match parallelism {
                        Parallelism::Zero2 | Parallelism::Fsdp => 0,
                        _ => weights,
                    },
                // A bucket's gathered copy and this rank's shard of it; Gloo's
                // all-gather gathers into a buffer of its own and copies out. fsdp
                // steps its shards and gathers nothing until the next forward.
                buffers: match parallelism {
                    Parallelism::Ddp | Parallelism::Fsdp => 0,
                    _ => {
                        let bucket = largest_bucket;
                        let gloo = if cuda { 0 } else { bucket };
                        bucket + sharded(bucket) + gloo
                    }
                },
                ..base
            },
        ),
    ];
    let (phase, peak) = phases.into_iter().max_by_key(|(_, u)| u.total()).expect("phases");
    MemoryPlan {
        world_size: s.world as u32,
        parallelism,
        device: cfg.topology.device,
        micro_batch: cfg.batch.micro_batch,
        seq_len: cfg.batch.seq_len,
        recomputed_blocks: s.recomputed as u32,
        phase,
        peak,
        activations_without_checkpointing: full,
        activations_with_checkpointing: checkpointed,
        allowance: if cuda { CUDA_ALLOWANCE_BYTES } else { 0 },
    }
}

/// What `spec.data.packing: documents` holds through a micro-step: each token's position
/// and document (int64), and where varlen flash attention cannot run (off CUDA, in f32,
/// heads not a multiple of 8 up to 256) the (B, T, T) attention mask as a bool and as
/// SDPA's additive bias in the activations' dtype, which every block's attention saves
/// (one tensor, shared).
pub fn documents_bytes(cfg: &RunConfig, dtypes: &Dtypes) -> u64 {
    if cfg.data.as_ref().is_none_or(|d| d.packing == Packing::Concat) {
        return 0;
    }
    let (b, t) = (u64::from(cfg.batch.micro_batch), u64::from(cfg.batch.seq_len));
    let d_head = cfg.model.d_head;
    let varlen = cfg.topology.device == Device::Cuda && dtypes.matmul == 2 && d_head.is_multiple_of(8) && d_head <= 256;
    let mask = if varlen { 0 } else { b * t * t * (1 + dtypes.matmul) };
    2 * 8 * b * t + mask
}
