//! Building blocks shared by every architecture.

use tch::nn::{Init, Path};
use tch::{Kind, TchError, Tensor};

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

/// RMSNorm through libtorch's fused `rms_norm`.
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

/// RoPE tables for the rotate-half convention (HF Llama): cos/sin of shape
/// `(max_seq, d_head)`, the half-width frequencies repeated twice.
#[derive(Debug)]
pub struct Rope {
    cos: Tensor,
    sin: Tensor,
}

impl Rope {
    pub fn new(d_head: i64, max_seq: i64, theta: f64, device: tch::Device) -> Result<Self, TchError> {
        let opts = (Kind::Float, device);
        let exponents = Tensor::f_arange_start_step(0, d_head, 2, opts)?.f_div_scalar(d_head as f64)?;
        // inv_freq = 1 / θ^(2i/d)
        let inv_freq = Tensor::f_full([1], theta, opts)?.f_pow(&exponents)?.f_reciprocal()?;
        let t = Tensor::f_arange(max_seq, opts)?;
        let freqs = t.f_outer(&inv_freq)?; // (T, d_head/2)
        let emb = Tensor::f_cat(&[&freqs, &freqs], -1)?; // (T, d_head)
        Ok(Rope { cos: emb.f_cos()?, sin: emb.f_sin()? })
    }

    /// Rotates `x` of shape `(B, n_head, T, d_head)` by positions `offset..offset+T`.
    pub fn apply(&self, x: &Tensor, offset: i64) -> Result<Tensor, TchError> {
        let t = x.size()[2];
        let cos = self.cos.f_narrow(0, offset, t)?; // (T, d_head)
        let sin = self.sin.f_narrow(0, offset, t)?;
        rotate(x, &cos, &sin)
    }

    /// Rotates `x` `(B, n_head, T, d_head)` by per-row positions `(B, T)`.
    pub fn apply_at(&self, x: &Tensor, positions: &Tensor) -> Result<Tensor, TchError> {
        let (b, t, d) = (x.size()[0], x.size()[2], x.size()[3]);
        let flat = positions.f_reshape([-1])?;
        let cos = self.cos.f_index_select(0, &flat)?.f_view([b, 1, t, d])?; // (B, 1, T, d_head)
        let sin = self.sin.f_index_select(0, &flat)?.f_view([b, 1, t, d])?;
        rotate(x, &cos, &sin)
    }
}

/// The rotate-half RoPE of `x` with tables broadcastable to it.
fn rotate(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor, TchError> {
    let d = *x.size().last().expect("x has a head dimension");
    let kind = x.kind();
    let (cos, sin) = (cos.f_to_kind(kind)?, sin.f_to_kind(kind)?);
    let x1 = x.f_narrow(-1, 0, d / 2)?;
    let x2 = x.f_narrow(-1, d / 2, d / 2)?;
    let rotated = Tensor::f_cat(&[&x2.f_neg()?, &x1], -1)?;
    x.f_mul(&cos)?.f_add(&rotated.f_mul(&sin)?)
}
