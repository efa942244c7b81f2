//! The loss of one chunk of logits and its gradient, without autograd: the lm_head's
//! hand-written backward (`Model::head_chunk`) turns the chunk's logits into their
//! gradient in place, so one (rows, vocab) buffer holds both. Composed: ATen's ops on
//! an f32 copy of the logits, a pass over it each. Fused (CUDA): one row kernel reads the
//! logits twice and writes the gradient over them in their own dtype.

use tch::{Kind, TchError, Tensor};

use super::choice::{Kernels, Op, current};
use crate::ffi;

/// The target that does not count (PyTorch's `ignore_index`).
pub const IGNORE_INDEX: i64 = -100;

/// One chunk's loss and gradient.
#[derive(Debug)]
pub struct ChunkLoss {
    /// Σ over the chunk's counted rows of `logsumexp − logit[target]`, divided by
    /// `counted`: a 0-dim f32 tensor.
    pub loss: Tensor,
    /// d(scale · loss)/d logits = (softmax − one-hot)·scale/counted, zero where the target
    /// is ignored; in f32 (composed) or the logits' dtype (fused).
    pub grad: Tensor,
}

/// [`ChunkLoss`] of `logits` (rows, vocab) against `targets` (rows), with the process's
/// kernels. `counted` is the number of counted targets of the whole batch (a 0-dim f32
/// tensor on the device, so nothing waits for the host).
pub fn cross_entropy_chunk(
    logits: Tensor,
    targets: &Tensor,
    counted: &Tensor,
    scale: f64,
) -> Result<ChunkLoss, TchError> {
    cross_entropy_chunk_with(current(Op::Loss), logits, targets, counted, scale)
}

pub(crate) fn cross_entropy_chunk_with(
    k: Kernels,
    logits: Tensor,
    targets: &Tensor,
    counted: &Tensor,
    scale: f64,
) -> Result<ChunkLoss, TchError> {
    let _no_grad = tch::no_grad_guard();
    match k {
        Kernels::Eager | Kernels::Composed => composed(logits, targets, counted, scale),
        Kernels::Fused => {
            let mut grad = logits.f_contiguous()?;
            let grad_scale = counted.f_reciprocal()?.f_mul_scalar(scale)?.f_to_kind(Kind::Float)?;
            let rows = ffi::rows::cross_entropy_chunk(&mut grad, targets, IGNORE_INDEX, &grad_scale)?;
            let loss = rows.f_sum(Kind::Float)?.f_div(counted)?;
            Ok(ChunkLoss { loss, grad })
        }
    }
}

/// llm.c's fused classifier in ATen's ops, in place on one f32 buffer: log-softmax by
/// hand (logsumexp would allocate a (rows, vocab) exp), then softmax − one-hot over it.
fn composed(logits: Tensor, targets: &Tensor, counted: &Tensor, scale: f64) -> Result<ChunkLoss, TchError> {
    let mut logits = logits.f_to_kind(Kind::Float)?; // (rows, vocab)
    let counts = targets.f_ne(IGNORE_INDEX)?;
    let picked_at = targets.f_clamp_min(0)?.f_unsqueeze(1)?; // (rows, 1); ignored rows read column 0
    let weight = counts.f_to_kind(Kind::Float)?.f_unsqueeze(1)?; // (rows, 1): 1 where the target counts
    let _ = logits.f_sub_(&logits.f_amax([-1], true)?)?; // shifted by each row's max
    let picked = logits.f_gather(1, &picked_at, false)?;
    let _ = logits.f_exp_()?;
    let sums = logits.f_sum_dim_intlist([-1i64].as_slice(), true, Kind::Float)?; // (rows, 1)
    let loss = sums.f_log()?.f_sub(&picked)?.f_mul(&weight)?.f_sum(Kind::Float)?.f_div(counted)?;
    let _ = logits.f_div_(&sums)?;
    let _ = logits.f_scatter_add_(1, &picked_at, &weight.f_neg()?)?;
    let _ = logits.f_mul_(&weight.f_mul(&counted.f_reciprocal()?.f_mul_scalar(scale)?)?)?;
    Ok(ChunkLoss { loss, grad: logits })
}
