//! SwiGLU's `silu(gate) · up` as one autograd node, which keeps one (tokens, d_ff)
//! activation less per layer than eager's two nodes. On ATen's kernels ("composed")
//! it equals eager PyTorch's values and gradients bit for bit.

use tch::{TchError, Tensor};

use super::choice::{Kernels, Op, current};
use crate::ffi;

/// `silu(gate) · up` with the process's kernels; both (…, d_ff), same dtype.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor, TchError> {
    swiglu_with(current(Op::Swiglu), gate, up)
}

pub(crate) fn swiglu_with(k: Kernels, gate: &Tensor, up: &Tensor) -> Result<Tensor, TchError> {
    match k {
        Kernels::Eager => gate.f_silu()?.f_mul(up),
        Kernels::Composed | Kernels::Fused => ffi::swiglu(gate, up, k == Kernels::Fused),
    }
}
