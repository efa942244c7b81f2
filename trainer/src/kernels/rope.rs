//! RoPE as one autograd node, which reads and writes q and k about half as often as
//! eager's rotate-half; on ATen's kernels ("composed") it equals eager PyTorch's values
//! and gradients bit for bit. [`Rope`] owns the tables of a model's positions.

use tch::{Kind, TchError, Tensor};

use super::choice::{Kernels, Op, current};
use crate::ffi;

/// RoPE (rotate-half, HF Llama) tables for positions `0..max_seq`, in f32 and bf16, the
/// dtypes the model's q and k come in; RoPE itself runs as one autograd node
/// ([`rope`]).
#[derive(Debug)]
pub struct Rope {
    f32: RopeTables,
    bf16: RopeTables,
}

/// The maps of [`crate::ffi::rope`], each `(…, T, 2, d_head/2)` with `c`, `s` the cosine
/// and sine of the half-width frequencies: `a = (c, s)` and `b = (−s, c)` rotate,
/// `a_back = (c, −s)` and `b_back = (s, c)` rotate back (the gradient).
#[derive(Debug)]
pub struct RopeTables {
    pub a: Tensor,
    pub b: Tensor,
    pub a_back: Tensor,
    pub b_back: Tensor,
}

impl Rope {
    pub fn new(d_head: i64, max_seq: i64, theta: f64, device: tch::Device) -> Result<Self, TchError> {
        let opts = (Kind::Float, device);
        let exponents = Tensor::f_arange_start_step(0, d_head, 2, opts)?.f_div_scalar(d_head as f64)?;
        // inv_freq = 1 / θ^(2i/d)
        let inv_freq = Tensor::f_full([1], theta, opts)?.f_pow(&exponents)?.f_reciprocal()?;
        let t = Tensor::f_arange(max_seq, opts)?;
        let freqs = t.f_outer(&inv_freq)?; // (T, d_head/2)
        let (c, s) = (freqs.f_cos()?, freqs.f_sin()?);
        let (neg_s, pair) = (s.f_neg()?, |x: &Tensor, y: &Tensor| Tensor::f_stack(&[x, y], 1)); // (T, 2, d_head/2)
        let f32 =
            RopeTables { a: pair(&c, &s)?, b: pair(&neg_s, &c)?, a_back: pair(&c, &neg_s)?, b_back: pair(&s, &c)? };
        let bf16 = f32.map(|t| t.f_to_kind(Kind::BFloat16))?;
        Ok(Rope { f32, bf16 })
    }

    /// The tables in `kind`: shared for f32 and bf16, a copy for any other.
    fn of_kind(&self, kind: Kind) -> Result<RopeTables, TchError> {
        match kind {
            Kind::Float => self.f32.map(|t| Ok(t.shallow_clone())),
            Kind::BFloat16 => self.bf16.map(|t| Ok(t.shallow_clone())),
            _ => self.f32.map(|t| t.f_to_kind(kind)),
        }
    }

    /// The tables in `kind` for positions `offset..offset+t`: (t, 2, d_head/2).
    pub fn tables(&self, kind: Kind, offset: i64, t: i64) -> Result<RopeTables, TchError> {
        self.of_kind(kind)?.map(|m| m.f_narrow(0, offset, t))
    }

    /// Rotates `x` of shape `(B, n_head, T, d_head)` by positions `offset..offset+T`.
    pub fn apply(&self, x: &Tensor, offset: i64) -> Result<Tensor, TchError> {
        rope(x, &self.tables(x.kind(), offset, x.size()[2])?)
    }

    /// The tables in `kind` for per-row positions `(B, T)`: (B, 1, T, 2, d_head/2).
    pub fn tables_at(&self, kind: Kind, positions: &Tensor) -> Result<RopeTables, TchError> {
        let (b, t) = (positions.size()[0], positions.size()[1]);
        let flat = positions.f_reshape([-1])?;
        self.of_kind(kind)?.map(|m| {
            let (_, pair, half) = m.size3()?;
            m.f_index_select(0, &flat)?.f_view([b, 1, t, pair, half])
        })
    }

    /// Rotates `x` `(B, n_head, T, d_head)` by per-row positions `(B, T)`.
    pub fn apply_at(&self, x: &Tensor, positions: &Tensor) -> Result<Tensor, TchError> {
        rope(x, &self.tables_at(x.kind(), positions)?)
    }
}

impl RopeTables {
    fn map(&self, f: impl Fn(&Tensor) -> Result<Tensor, TchError>) -> Result<RopeTables, TchError> {
        Ok(RopeTables { a: f(&self.a)?, b: f(&self.b)?, a_back: f(&self.a_back)?, b_back: f(&self.b_back)? })
    }

    /// What [`crate::ffi::rope`] takes.
    pub fn maps(&self) -> [&Tensor; 4] {
        [&self.a, &self.b, &self.a_back, &self.b_back]
    }

    /// Eager PyTorch's rotate-half, `x·cos + cat(−x2, x1)·sin` with full-width tables, as
    /// separate autograd nodes: the baseline `trainer bench --rope eager` measures.
    pub fn eager(&self, x: &Tensor) -> Result<Tensor, TchError> {
        let d = *x.size().last().expect("x has a head dimension");
        let full = |i: i64| -> Result<Tensor, TchError> {
            let half = self.a.f_select(-2, i)?; // (…, T, d_head/2)
            Tensor::f_cat(&[&half, &half], -1) // (…, T, d_head)
        };
        let (cos, sin) = (full(0)?, full(1)?);
        let x1 = x.f_narrow(-1, 0, d / 2)?;
        let x2 = x.f_narrow(-1, d / 2, d / 2)?;
        let rotated = Tensor::f_cat(&[&x2.f_neg()?, &x1], -1)?;
        x.f_mul(&cos)?.f_add(&rotated.f_mul(&sin)?)
    }
}

/// RoPE of `x` (B, n_head, T, d_head) with the process's kernels and `tables` for its
/// positions, in x's dtype.
pub fn rope(x: &Tensor, tables: &RopeTables) -> Result<Tensor, TchError> {
    rope_with(current(Op::Rope), x, tables)
}

pub(crate) fn rope_with(k: Kernels, x: &Tensor, tables: &RopeTables) -> Result<Tensor, TchError> {
    match k {
        Kernels::Eager => tables.eager(x),
        Kernels::Composed | Kernels::Fused => ffi::rope(x, tables.maps(), k == Kernels::Fused),
    }
}
