//! RMSNorm with the residual add before it. Eager runs the add and the norm as separate
//! nodes, and under autocast stores the norm in f32 for the next matmul to cast again;
//! the fused row kernels (CUDA) read the stream and the branch once, keep one float a row
//! for the backward, and store the norm once in the matmuls' dtype.

use tch::{Kind, TchError, Tensor};

use super::choice::{Kernels, Op, current};
use crate::ffi;

/// RMSNorm's output and the residual stream it normed.
#[derive(Debug)]
pub struct Normed {
    /// RMSNorm(stream)·weight.
    pub out: Tensor,
    /// `x + branch`: what the next layer adds its output to.
    pub stream: Tensor,
}

/// RMSNorm of `x` (…, d) with `weight` (d), with the process's kernels.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor, TchError> {
    Ok(residual_rms_norm_with(current(Op::Norm), x, None, weight, eps)?.out)
}

/// `x + branch` (both (…, d)) and RMSNorm of it with `weight` (d), with the process's
/// kernels.
pub fn residual_rms_norm(x: &Tensor, branch: &Tensor, weight: &Tensor, eps: f64) -> Result<Normed, TchError> {
    residual_rms_norm_with(current(Op::Norm), x, Some(branch), weight, eps)
}

/// [`residual_rms_norm`] (or [`rms_norm`] without a branch, where `stream` is `x`) with
/// kernels `k`.
pub(crate) fn residual_rms_norm_with(
    k: Kernels,
    x: &Tensor,
    branch: Option<&Tensor>,
    weight: &Tensor,
    eps: f64,
) -> Result<Normed, TchError> {
    match k {
        Kernels::Eager | Kernels::Composed => {
            let stream = match branch {
                Some(b) => x.f_add(b)?,
                None => x.shallow_clone(),
            };
            let d = *x.size().last().expect("rms_norm input has a last dimension");
            let out = stream.f_rms_norm([d], Some(weight), eps)?;
            Ok(Normed { out, stream })
        }
        Kernels::Fused => {
            let out = norm_output_kind(x)?;
            let r = ffi::rows::residual_rms_norm(x, branch, weight, eps, out)?;
            Ok(Normed { out: r.out, stream: r.sum.unwrap_or_else(|| x.shallow_clone()) })
        }
    }
}

/// The dtype the fused norm stores: autocast's on x's device when it is on (what the next
/// matmul would cast to), else x's.
fn norm_output_kind(x: &Tensor) -> Result<Kind, TchError> {
    match ffi::autocast_kind(x.device()) {
        Ok(low) => Ok(low.unwrap_or(x.kind())),
        Err(e) => Err(TchError::Torch(e.to_string())),
    }
}
