//! What autograd saves in one transformer block, per token, as the trainer's blocks
//! are written (`trainer/src/model/{llama,gpt2}.rs`, the composed SwiGLU and RoPE
//! kernels that save only their inputs, SDPA's flash kernels that save q, k, v, the
//! output and the log-sum-exp).

use crate::presets::{Arch, ModelConfig};
use crate::types::Precision;

/// Bytes per element of the tensors a block saves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dtypes {
    /// The residual stream and the norms' outputs.
    pub residual: u64,
    /// Matmul outputs (bf16 under autocast).
    pub matmul: u64,
    /// Autocast's bf16 copy of each norm output that feeds a matmul (0 without).
    pub cast: u64,
    pub autocast: bool,
}

impl Dtypes {
    pub fn of(precision: Precision, cuda: bool) -> Dtypes {
        match precision {
            Precision::Bf16 => Dtypes { residual: 2, matmul: 2, cast: 0, autocast: false },
            Precision::Bf16Mixed if cuda => Dtypes { residual: 4, matmul: 2, cast: 2, autocast: true },
            Precision::Bf16Mixed | Precision::F32 => Dtypes { residual: 4, matmul: 4, cast: 0, autocast: false },
        }
    }
}

/// Bytes one block saves for backward per token, its output included.
pub fn per_token(m: &ModelConfig, t: &Dtypes) -> u64 {
    let d = u64::from(m.d_model);
    let ff = u64::from(m.d_ff);
    let q = u64::from(m.n_head) * u64::from(m.d_head);
    let kv = u64::from(m.n_kv_head) * u64::from(m.d_head);
    let heads = u64::from(m.n_head);
    // Per-token statistics of a norm (f32), and the log-sum-exp per head.
    let stats = 4;
    let lse = 4 * heads;
    match m.arch {
        Arch::Llama | Arch::Qwen3 => {
            // Two norms: output (and autocast's cast), statistics.
            let norms = 2 * (d * (t.residual + t.cast) + stats);
            // Rotated q and k, v, the attention output and its transposed copy.
            let attention = (2 * q + 2 * kv) * t.matmul + lse;
            // Qwen3's q/k norms keep their inputs.
            let qk_norm = if m.arch == Arch::Qwen3 { (q + kv) * t.matmul + 2 * stats * heads } else { 0 };
            // gate, up (SwiGLU's inputs) and its output (down_proj's input).
            let mlp = 3 * ff * t.matmul;
            // The attention residual and the block output.
            let residual = 2 * d * t.residual;
            norms + attention + qk_norm + mlp + residual
        }
        Arch::Gpt2 => {
            // Two layer norms: output (and cast), mean and rstd.
            let norms = 2 * (d * (t.residual + t.cast) + 2 * stats);
            // c_attn's q, k, v (one tensor), the attention output and its copy.
            let attention = (3 * q + 2 * q) * t.matmul + lse;
            // c_fc's output (GELU's input) and GELU's output.
            let mlp = 2 * ff * t.matmul;
            let residual = 2 * d * t.residual;
            norms + attention + mlp + residual
        }
    }
}
