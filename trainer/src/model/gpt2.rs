//! GPT-2 block: LayerNorm, fused qkv projection with biases, tanh-GELU MLP.
//! Weights are stored `(d_out, d_in)`; `trainer export --hf` transposes them to
//! the Conv1D layout of Hugging Face GPT-2.

use tch::nn::Path;
use tch::{TchError, Tensor};

use super::cache::Step;
use super::dims::{Dims, INIT_STD};
use super::documents::Documents;
use super::layers::{LayerNorm, Linear};

/// `attn`: causal multi-head attention with a fused `c_attn`.
#[derive(Debug)]
pub struct Gpt2Attention {
    c_attn: Linear,
    c_proj: Linear,
    dims: Dims,
}

impl Gpt2Attention {
    pub fn new(p: Path, dims: Dims) -> Result<Self, TchError> {
        let inner = dims.n_head * dims.d_head;
        Ok(Gpt2Attention {
            c_attn: Linear::new(&p / "c_attn", dims.d_model, 3 * inner, true, INIT_STD)?,
            c_proj: Linear::new(&p / "c_proj", inner, dims.d_model, true, dims.residual_std())?,
            dims,
        })
    }

    /// q, k, v: 3 × (B, n_head, T, d_head).
    fn project(&self, x: &Tensor) -> Result<(Tensor, Tensor, Tensor), TchError> {
        let Dims { n_head: h, d_head: dh, .. } = self.dims;
        let (b, t) = (x.size()[0], x.size()[1]);
        let qkv = self.c_attn.forward(x)?.f_split(h * dh, 2)?; // 3 × (B, T, n_head·d_head)
        let heads = |z: &Tensor| z.f_view([b, t, h, dh])?.f_transpose(1, 2); // (B, n_head, T, d_head)
        Ok((heads(&qkv[0])?, heads(&qkv[1])?, heads(&qkv[2])?))
    }

    fn output(&self, y: &Tensor) -> Result<Tensor, TchError> {
        let (b, t) = (y.size()[0], y.size()[2]);
        self.c_proj.forward(&y.f_transpose(1, 2)?.f_reshape([b, t, self.dims.n_head * self.dims.d_head])?)
    }

    /// Causal attention over the window, or within each of its `docs`.
    pub fn forward(&self, x: &Tensor, docs: Option<&Documents>) -> Result<Tensor, TchError> {
        let (q, k, v) = self.project(x)?;
        let y = match docs {
            Some(d) => d.attend(&q, &k, &v, false)?,
            None => Tensor::f_scaled_dot_product_attention(&q, &k, &v, None::<Tensor>, 0.0, true, None, false)?,
        };
        self.output(&y)
    }

    /// Attention of new tokens over the cached keys and values, which it extends.
    pub fn forward_cached(&self, x: &Tensor, step: &Step, kv: &mut (Tensor, Tensor)) -> Result<Tensor, TchError> {
        let (q, k, v) = self.project(x)?;
        let (k, v) = super::cache::extend(kv, &k, &v, step)?;
        let y = Tensor::f_scaled_dot_product_attention(&q, &k, &v, Some(step.mask), 0.0, false, None, false)?;
        self.output(&y)
    }
}

/// `mlp`: `c_proj(gelu_tanh(c_fc(x)))`.
#[derive(Debug)]
pub struct Gpt2Mlp {
    c_fc: Linear,
    c_proj: Linear,
}

impl Gpt2Mlp {
    pub fn new(p: Path, dims: Dims) -> Result<Self, TchError> {
        Ok(Gpt2Mlp {
            c_fc: Linear::new(&p / "c_fc", dims.d_model, dims.d_ff, true, INIT_STD)?,
            c_proj: Linear::new(&p / "c_proj", dims.d_ff, dims.d_model, true, dims.residual_std())?,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor, TchError> {
        self.c_proj.forward(&self.c_fc.forward(x)?.f_gelu("tanh")?)
    }
}

/// `transformer.h.{i}`.
#[derive(Debug)]
pub struct Gpt2Block {
    ln_1: LayerNorm,
    attn: Gpt2Attention,
    ln_2: LayerNorm,
    mlp: Gpt2Mlp,
}

impl Gpt2Block {
    pub fn new(p: Path, dims: Dims) -> Result<Self, TchError> {
        Ok(Gpt2Block {
            ln_1: LayerNorm::new(&p / "ln_1", dims.d_model, dims.eps)?,
            attn: Gpt2Attention::new(&p / "attn", dims)?,
            ln_2: LayerNorm::new(&p / "ln_2", dims.d_model, dims.eps)?,
            mlp: Gpt2Mlp::new(&p / "mlp", dims)?,
        })
    }

    /// `x`: (B, T, d_model) → (B, T, d_model).
    pub fn forward(&self, x: &Tensor, docs: Option<&Documents>) -> Result<Tensor, TchError> {
        let x = x.f_add(&self.attn.forward(&self.ln_1.forward(x)?, docs)?)?;
        x.f_add(&self.mlp.forward(&self.ln_2.forward(&x)?)?)
    }

    /// [`Self::forward`] for new tokens against the KV cache.
    pub fn forward_cached(&self, x: &Tensor, step: &Step, kv: &mut (Tensor, Tensor)) -> Result<Tensor, TchError> {
        let x = x.f_add(&self.attn.forward_cached(&self.ln_1.forward(x)?, step, kv)?)?;
        x.f_add(&self.mlp.forward(&self.ln_2.forward(&x)?)?)
    }
}
