//! Building blocks shared by every architecture.

use tch::nn::{Init, Path};
use tch::{TchError, Tensor};

use crate::kernels::norm::Normed;

/// `y = x Wᵀ + b`, weight stored `(d_out, d_in)` as `nn.Linear` and HF Llama store it.
#[derive(Debug)]
pub struct Linear {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
}

impl Linear {
    pub fn new(p: Path, d_in: i64, d_out: i64, bias: bool, std: f64) -> Result<Self, TchError> {
        let weight = p.f_var("weight", &[d_out, d_in], Init::Randn { mean: 0.0, stdev: std })?;
        let bias = if bias { Some(p.f_var("bias", &[d_out], Init::Const(0.0))?) } else { None };
        Ok(Linear { weight, bias })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor, TchError> {
        x.f_linear(&self.weight, self.bias.as_ref())
    }
}

/// Token or position embedding table `(n, d)`.
#[derive(Debug)]
pub struct Embedding {
    pub weight: Tensor,
}

impl Embedding {
    pub fn new(p: Path, n: i64, d: i64, std: f64) -> Result<Self, TchError> {
        Ok(Embedding { weight: p.f_var("weight", &[n, d], Init::Randn { mean: 0.0, stdev: std })? })
    }

    pub fn forward(&self, idx: &Tensor) -> Result<Tensor, TchError> {
        Tensor::f_embedding(&self.weight, idx, -1, false, false)
    }
}

/// RMSNorm: libtorch's `rms_norm` inside attention (Qwen3's per-head q/k norms); on the
/// residual stream, the process's kernels ([`crate::kernels::norm`]), which may add the
/// branch before it in the same kernel.
#[derive(Debug)]
pub struct RmsNorm {
    pub weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    pub fn new(p: Path, dim: i64, eps: f64) -> Result<Self, TchError> {
        Ok(RmsNorm { weight: p.f_var("weight", &[dim], Init::Const(1.0))?, eps })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor, TchError> {
        let dim = *x.size().last().expect("rms_norm input has a last dimension");
        x.f_rms_norm([dim], Some(&self.weight), self.eps)
    }

    /// The norm of the residual stream `x` (…, d_model).
    pub fn forward_stream(&self, x: &Tensor) -> Result<Tensor, TchError> {
        crate::kernels::norm::rms_norm(x, &self.weight, self.eps)
    }

    /// The stream `x + branch` and its norm.
    pub fn forward_residual(&self, x: &Tensor, branch: &Tensor) -> Result<Normed, TchError> {
        crate::kernels::norm::residual_rms_norm(x, branch, &self.weight, self.eps)
    }
}

/// LayerNorm with weight and bias (GPT-2).
#[derive(Debug)]
pub struct LayerNorm {
    pub weight: Tensor,
    pub bias: Tensor,
    eps: f64,
}

impl LayerNorm {
    pub fn new(p: Path, dim: i64, eps: f64) -> Result<Self, TchError> {
        Ok(LayerNorm {
            weight: p.f_var("weight", &[dim], Init::Const(1.0))?,
            bias: p.f_var("bias", &[dim], Init::Const(0.0))?,
            eps,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor, TchError> {
        let dim = *x.size().last().expect("layer_norm input has a last dimension");
        x.f_layer_norm([dim], Some(&self.weight), Some(&self.bias), self.eps, true)
    }
}
