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

#[cfg(test)]
mod tests {
    use tch::{Device, Kind, Tensor};

    use super::*;
    use crate::ffi::rope as rope_fn;
    use crate::ffi::shim_built_with_cuda;
    use crate::ffi::tests::{assert_bitwise, value_and_grads};

    /// q as the model has it, (B, T, n_head, d_head) transposed to (B, n_head, T, d_head),
    /// scaled so products round in bf16.
    fn q_like(seed: i64, [b, h, t, d]: [i64; 4], kind: Kind, device: Device) -> Tensor {
        tch::manual_seed(seed);
        (Tensor::randn([b, t, h, d], (Kind::Float, device)) * 3).to_kind(kind).transpose(1, 2)
    }

    /// Composed, one node gives eager rotate-half's value and gradient to the bit, in f32
    /// and bf16, at an offset and at per-row positions (decoding), keeps x's layout (so
    /// no copy), and runs without autograd.
    #[test]
    fn rope_equals_rotate_half_bit_for_bit() {
        let shape = [2, 3, 10, 16];
        let rope = Rope::new(16, 64, 1e4, Device::Cpu).unwrap();
        let positions =
            Tensor::from_slice(&[7i64, 8, 9, 10, 11, 12, 13, 14, 15, 16, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9]).view([2, 10]);
        for kind in [Kind::Float, Kind::BFloat16] {
            let (x, g) = (q_like(1, shape, kind, Device::Cpu), q_like(2, shape, kind, Device::Cpu));
            for (what, tables) in [
                ("offset 5", rope.tables(kind, 5, 10).unwrap()),
                ("per-row", rope.tables_at(kind, &positions).unwrap()),
            ] {
                let got = value_and_grads(&[&x], &g, |x| rope_fn(&x[0], tables.maps(), false).unwrap());
                let want = value_and_grads(&[&x], &g, |x| tables.eager(&x[0]).unwrap());
                assert_bitwise(&got, &want, kind, &format!("rope {what}"));
                assert_eq!(got[0].stride(), x.stride(), "rope {what} keeps x's layout");
            }
            // Each row of the per-row tables is that row's own offset.
            let per_row = rope_fn(&x, rope.tables_at(kind, &positions).unwrap().maps(), false).unwrap();
            for (row, offset) in [(0, 7), (1, 0)] {
                let one = rope_fn(&x.narrow(0, row, 1), rope.tables(kind, offset, 10).unwrap().maps(), false).unwrap();
                assert!(one.equal(&per_row.narrow(0, row, 1)), "{kind:?} row {row}");
            }
            let y = tch::no_grad(|| {
                rope_fn(&x.detach().requires_grad_(true), rope.tables(kind, 0, 10).unwrap().maps(), false).unwrap()
            });
            assert!(!y.requires_grad(), "{kind:?} under no_grad");
        }
    }

    #[test]
    fn rope_rejects_bad_tables_and_fused_kernels_off_cuda() {
        let rope = Rope::new(16, 64, 1e4, Device::Cpu).unwrap();
        let x = q_like(1, [2, 3, 10, 16], Kind::Float, Device::Cpu);
        let err = |x: &Tensor, t: &RopeTables, fused| rope_fn(x, t.maps(), fused).unwrap_err().to_string();
        let e = err(
            &Tensor::ones([2, 10, 15], (Kind::Float, Device::Cpu)),
            &rope.tables(Kind::Float, 0, 10).unwrap(),
            false,
        );
        assert!(e.contains("rope: the head dimension 15 is odd"), "{e}");
        let e = err(&x.to_kind(Kind::BFloat16), &rope.tables(Kind::Float, 0, 10).unwrap(), false);
        assert!(e.contains("rope: table a is Float, x is BFloat16"), "{e}");
        let e = err(&x, &rope.tables(Kind::Float, 0, 12).unwrap(), false);
        assert!(e.contains("rope: table a [12, 2, 8] does not broadcast to [2, 3, 10, 2, 8]"), "{e}");
        let e = err(&x, &rope.tables(Kind::Float, 0, 10).unwrap(), true);
        let why = if shim_built_with_cuda() {
            "rope: the fused kernels run on CUDA only, not on cpu"
        } else {
            "rope: the fused kernels need the trainer built with the cuda feature"
        };
        assert!(e.contains(why), "{e}");
    }

    /// On a GPU the fused kernel agrees with the composed ones to rounding (it rounds once
    /// where they round each product and the sum), at an offset and per row, and its
    /// output keeps x's layout, so the reshape back to (B, n_head, T, d_head) copies nothing.
    #[cfg(feature = "cuda")]
    #[test]
    fn fused_rope_matches_the_composed_kernels_on_cuda() {
        if !tch::Cuda::is_available() {
            return;
        }
        let (shape, device) = ([4, 16, 33, 120], Device::Cuda(0));
        let rope = Rope::new(120, 128, 1e4, device).unwrap();
        let positions = Tensor::arange(33, (Kind::Int64, device))
            + Tensor::from_slice(&[0i64, 5, 50, 95]).to_device(device).view([4, 1]); // (4, 33)
        for (kind, tol) in [(Kind::Float, 1e-5), (Kind::BFloat16, 2e-2)] {
            let (x, g) = (q_like(1, shape, kind, device), q_like(2, shape, kind, device));
            for tables in [rope.tables(kind, 7, 33).unwrap(), rope.tables_at(kind, &positions).unwrap()] {
                let fused = value_and_grads(&[&x], &g, |x| rope_fn(&x[0], tables.maps(), true).unwrap());
                let composed = value_and_grads(&[&x], &g, |x| rope_fn(&x[0], tables.maps(), false).unwrap());
                crate::ffi::tests::assert_close(&fused, &composed, tol, &format!("rope {kind:?}"));
                assert_eq!(fused[0].stride(), x.stride(), "{kind:?}: the fused output keeps x's layout");
            }
        }
    }
}
