//! Which kernels compute SwiGLU, RoPE, the residual RMSNorm and the loss chunk: the
//! process-wide registry the model reads
//! ([`set`], [`current`]) and what a run or `trainer bench` asks for
//! ([`KernelRequest`]).

use std::sync::atomic::{AtomicU8, Ordering};

use crds::types::Attention;
use serde::{Deserialize, Serialize};

use super::trials::Candidate;

/// Which kernels compute an op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[repr(u8)]
pub enum Kernels {
    /// Eager PyTorch's graph of separate nodes (SwiGLU's also keeps silu(gate)): the
    /// baseline `trainer bench --swiglu eager` and `--rope eager` measure against.
    Eager,
    /// ATen's kernels in one autograd node: eager's values to the bit. For the norm and
    /// the loss, eager's own ops, which are already as few.
    Composed,
    /// One kernel each way, CUDA only: each input read once, rounded once (jiterator for
    /// SwiGLU and RoPE, the row kernels for the norm and the loss).
    Fused,
}

impl Candidate for Kernels {
    fn name(self) -> &'static str {
        match self {
            Kernels::Eager => "eager",
            Kernels::Composed => "composed",
            Kernels::Fused => "fused",
        }
    }
}

/// The ops whose kernels a run chooses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Swiglu,
    Rope,
    /// The residual add with the RMSNorm after it (and the model's other RMSNorms).
    Norm,
    /// The loss chunk: logits to loss and gradient.
    Loss,
}

impl Op {
    /// Every op, in discriminant order.
    pub const ALL: [Op; 4] = [Op::Swiglu, Op::Rope, Op::Norm, Op::Loss];

    pub fn name(self) -> &'static str {
        match self {
            Op::Swiglu => "swiglu",
            Op::Rope => "rope",
            Op::Norm => "norm",
            Op::Loss => "loss",
        }
    }
}
/// Every variant, in discriminant order.
const ALL: [Kernels; 3] = [Kernels::Eager, Kernels::Composed, Kernels::Fused];

/// Each op's kernels, by [`Op`]; process-wide, like the SDPA switches.
static CURRENT: [AtomicU8; Op::ALL.len()] = [const { AtomicU8::new(Kernels::Composed as u8) }; Op::ALL.len()];
/// Sets the kernels `op` uses, for the whole process.
pub fn set(op: Op, k: Kernels) {
    CURRENT[op as usize].store(k as u8, Ordering::Relaxed);
}

/// The kernels `op` uses.
pub fn current(op: Op) -> Kernels {
    ALL[CURRENT[op as usize].load(Ordering::Relaxed) as usize]
}
/// The kernels a run or `trainer bench` asks for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KernelRequest {
    /// `spec.attention`; `auto` is timed on CUDA.
    pub attention: Attention,
    /// SwiGLU's kernels; `None`: timed on CUDA, composed elsewhere.
    pub swiglu: Option<Kernels>,
    /// RoPE's kernels; `None`: timed on CUDA, composed elsewhere.
    pub rope: Option<Kernels>,
    /// The residual RMSNorm's kernels; `None`: timed on CUDA, composed elsewhere.
    pub norm: Option<Kernels>,
    /// The loss chunk's kernels; `None`: timed on CUDA, composed elsewhere.
    pub loss: Option<Kernels>,
}

impl KernelRequest {
    /// `attention`, and every op's kernels chosen by the run.
    pub fn auto(attention: Attention) -> Self {
        KernelRequest { attention, swiglu: None, rope: None, norm: None, loss: None }
    }

    pub fn fused(&self, op: Op) -> Option<Kernels> {
        match op {
            Op::Swiglu => self.swiglu,
            Op::Rope => self.rope,
            Op::Norm => self.norm,
            Op::Loss => self.loss,
        }
    }
}
