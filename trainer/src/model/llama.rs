//! LLaMA-family block (also Qwen3, which adds per-head q/k RMSNorm).

use tch::nn::Path;
use tch::{TchError, Tensor};

use super::cache::Step;
use super::dims::{Dims, INIT_STD};
use super::documents::Documents;
use super::layers::{Linear, RmsNorm};
use crate::kernels::rope::Rope;

/// `self_attn`: GQA attention with RoPE and SDPA.
#[derive(Debug)]
pub struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    dims: Dims,
}

impl Attention {
    pub fn new(p: Path, dims: Dims, qk_norm: bool) -> Result<Self, TchError> {
        let Dims { d_model: d, n_head: hq, n_kv_head: hk, d_head: dh, .. } = dims;
        let (q_norm, k_norm) = if qk_norm {
            (Some(RmsNorm::new(&p / "q_norm", dh, dims.eps)?), Some(RmsNorm::new(&p / "k_norm", dh, dims.eps)?))
        } else {
            (None, None)
        };
        Ok(Attention {
            q_proj: Linear::new(&p / "q_proj", d, hq * dh, false, INIT_STD)?,
            k_proj: Linear::new(&p / "k_proj", d, hk * dh, false, INIT_STD)?,
            v_proj: Linear::new(&p / "v_proj", d, hk * dh, false, INIT_STD)?,
            o_proj: Linear::new(&p / "o_proj", hq * dh, d, false, dims.residual_std())?,
            q_norm,
            k_norm,
            dims,
        })
    }

    /// q (B, T, n_head, d_head), k and v (B, T, n_kv_head, d_head), q/k normed (Qwen3).
    fn project(&self, x: &Tensor) -> Result<(Tensor, Tensor, Tensor), TchError> {
        let Dims { n_head: hq, n_kv_head: hk, d_head: dh, .. } = self.dims;
        let (b, t) = (x.size()[0], x.size()[1]);
        let mut q = self.q_proj.forward(x)?.f_view([b, t, hq, dh])?; // (B, T, n_head, d_head)
        let mut k = self.k_proj.forward(x)?.f_view([b, t, hk, dh])?; // (B, T, n_kv_head, d_head)
        let v = self.v_proj.forward(x)?.f_view([b, t, hk, dh])?;
        if let (Some(qn), Some(kn)) = (&self.q_norm, &self.k_norm) {
            q = qn.forward(&q)?;
            k = kn.forward(&k)?;
        }
        Ok((q, k, v))
    }

    /// (B, n_head, T, d_head) attention output → (B, T, d_model).
    fn output(&self, y: &Tensor) -> Result<Tensor, TchError> {
        let (b, t) = (y.size()[0], y.size()[2]);
        let y = y.f_transpose(1, 2)?.f_reshape([b, t, self.dims.n_head * self.dims.d_head])?; // (B, T, n_head·d_head)
        self.o_proj.forward(&y)
    }

    /// Causal attention over the window, or within each of its `docs`.
    pub fn forward(&self, x: &Tensor, rope: &Rope, docs: Option<&Documents>) -> Result<Tensor, TchError> {
        let Dims { n_head: hq, n_kv_head: hk, .. } = self.dims;
        let (q, k, v) = self.project(x)?;
        let (q, k) = (q.f_transpose(1, 2)?, k.f_transpose(1, 2)?);
        let (q, mut k) = match docs {
            Some(d) => (rope.apply_at(&q, &d.positions)?, rope.apply_at(&k, &d.positions)?),
            None => (rope.apply(&q, 0)?, rope.apply(&k, 0)?), // (B, n_head | n_kv_head, T, d_head)
        };
        let mut v = v.f_transpose(1, 2)?;
        let mut gqa = hk != hq;
        if gqa && self.dims.expand_kv {
            k = k.f_repeat_interleave_self_int(hq / hk, 1, None)?; // (B, n_head, T, d_head)
            v = v.f_repeat_interleave_self_int(hq / hk, 1, None)?;
            gqa = false;
        }
        let y = match docs {
            Some(d) => d.attend(&q, &k, &v, gqa)?,
            None => Tensor::f_scaled_dot_product_attention(&q, &k, &v, None::<Tensor>, 0.0, true, None, gqa)?,
        };
        self.output(&y)
    }

    pub fn set_expand_kv(&mut self, expand: bool) {
        self.dims.expand_kv = expand;
    }

    /// Attention of new tokens over the cached keys and values, which it extends.
    pub fn forward_cached(
        &self,
        x: &Tensor,
        rope: &Rope,
        step: &Step,
        kv: &mut (Tensor, Tensor),
    ) -> Result<Tensor, TchError> {
        let gqa = self.dims.n_kv_head != self.dims.n_head;
        let (q, k, v) = self.project(x)?;
        let q = rope.apply_at(&q.f_transpose(1, 2)?, step.positions)?;
        let k = rope.apply_at(&k.f_transpose(1, 2)?, step.positions)?;
        let (k, v) = super::cache::extend(kv, &k, &v.f_transpose(1, 2)?, step)?; // (B, n_kv_head, keys, d_head)
        let y = Tensor::f_scaled_dot_product_attention(&q, &k, &v, Some(step.mask), 0.0, false, None, gqa)?;
        self.output(&y)
    }
}

/// `mlp`: SwiGLU, `down(silu(gate(x)) · up(x))`.
#[derive(Debug)]
pub struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl Mlp {
    pub fn new(p: Path, dims: Dims) -> Result<Self, TchError> {
        Ok(Mlp {
            gate_proj: Linear::new(&p / "gate_proj", dims.d_model, dims.d_ff, false, INIT_STD)?,
            up_proj: Linear::new(&p / "up_proj", dims.d_model, dims.d_ff, false, INIT_STD)?,
            down_proj: Linear::new(&p / "down_proj", dims.d_ff, dims.d_model, false, dims.residual_std())?,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor, TchError> {
        let h = crate::kernels::swiglu::swiglu(&self.gate_proj.forward(x)?, &self.up_proj.forward(x)?)?; // (B, T, d_ff)
        self.down_proj.forward(&h)
    }
}

/// `model.layers.{i}`: pre-norm attention and MLP with residuals.
#[derive(Debug)]
pub struct LlamaBlock {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: Mlp,
}

impl LlamaBlock {
    pub fn new(p: Path, dims: Dims, qk_norm: bool) -> Result<Self, TchError> {
        Ok(LlamaBlock {
            input_layernorm: RmsNorm::new(&p / "input_layernorm", dims.d_model, dims.eps)?,
            self_attn: Attention::new(&p / "self_attn", dims, qk_norm)?,
            post_attention_layernorm: RmsNorm::new(&p / "post_attention_layernorm", dims.d_model, dims.eps)?,
            mlp: Mlp::new(&p / "mlp", dims)?,
        })
    }

    pub fn set_expand_kv(&mut self, expand: bool) {
        self.self_attn.set_expand_kv(expand);
    }

    /// `x`: (B, T, d_model) → (B, T, d_model). The attention's residual add and the norm
    /// after it are one op ([`RmsNorm::forward_residual`]).
    pub fn forward(&self, x: &Tensor, rope: &Rope, docs: Option<&Documents>) -> Result<Tensor, TchError> {
        let attn = self.self_attn.forward(&self.input_layernorm.forward_stream(x)?, rope, docs)?;
        let h = self.post_attention_layernorm.forward_residual(x, &attn)?;
        h.stream.f_add(&self.mlp.forward(&h.out)?)
    }

    /// [`Self::forward`] for new tokens against the KV cache.
    pub fn forward_cached(
        &self,
        x: &Tensor,
        rope: &Rope,
        step: &Step,
        kv: &mut (Tensor, Tensor),
    ) -> Result<Tensor, TchError> {
        let attn = self.self_attn.forward_cached(&self.input_layernorm.forward_stream(x)?, rope, step, kv)?;
        let h = self.post_attention_layernorm.forward_residual(x, &attn)?;
        h.stream.f_add(&self.mlp.forward(&h.out)?)
    }
}
