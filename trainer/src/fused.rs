//! The elementwise parts of a LLaMA block, each one autograd node: SwiGLU's
//! `silu(gate) · up` ([`swiglu`]), which then keeps one (tokens, d_ff) activation less
//! per layer than eager's two nodes, and RoPE ([`rope`]), which then reads and writes
//! q and k about half as often. On ATen's kernels ("composed") both equal eager
//! PyTorch's values and gradients bit for bit. On CUDA a run also times jiterator-fused
//! kernels against them on its own shapes ([`tune`]) and keeps the faster exact one.

use std::sync::atomic::{AtomicU8, Ordering};

use crds::presets::ModelConfig;
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, TchError, Tensor};

use crate::dist::ProcessGroup;
use crate::model::layers::{Rope, RopeTables};
use crate::trials::{self, Candidate, Choice, Trial, relative_error};
use crate::{Error, ffi};

/// Which kernels compute an op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[repr(u8)]
pub enum Kernels {
    /// Eager PyTorch's graph of separate nodes (SwiGLU's also keeps silu(gate)): the
    /// baseline `trainer bench --swiglu eager` and `--rope eager` measure against.
    Eager,
    /// ATen's kernels in one autograd node: eager's values to the bit.
    Composed,
    /// One jiterator kernel each way, CUDA only: each input read once, rounded once.
    Fused,
}

impl Candidate for Kernels {
    fn name(self) -> &'static str {
        match self {
            Kernels::Eager => "eager",
            Kernels::Composed => "composed",
            Kernels::Fused => "fused",
        }
    }
}

/// The ops whose kernels a run chooses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Swiglu,
    Rope,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Swiglu => "swiglu",
            Op::Rope => "rope",
        }
    }
}

/// The kernels a CUDA run tries; the first wins a tie.
pub const CUDA_CANDIDATES: [Kernels; 2] = [Kernels::Composed, Kernels::Fused];

/// Every variant, in discriminant order.
const ALL: [Kernels; 3] = [Kernels::Eager, Kernels::Composed, Kernels::Fused];

/// Each op's kernels, by [`Op`]; process-wide, like the SDPA switches.
static CURRENT: [AtomicU8; 2] = [AtomicU8::new(Kernels::Composed as u8), AtomicU8::new(Kernels::Composed as u8)];

/// The rows (SwiGLU's tokens, RoPE's batch rows) of a trial's inputs checked against f32.
const REFERENCE_ROWS: [i64; 2] = [256, 1];

/// Sets the kernels `op` uses, for the whole process.
pub fn set(op: Op, k: Kernels) {
    CURRENT[op as usize].store(k as u8, Ordering::Relaxed);
}

/// The kernels `op` uses.
pub fn current(op: Op) -> Kernels {
    ALL[CURRENT[op as usize].load(Ordering::Relaxed) as usize]
}

/// `silu(gate) · up` with the process's kernels; both (…, d_ff), same dtype.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor, TchError> {
    swiglu_with(current(Op::Swiglu), gate, up)
}

fn swiglu_with(k: Kernels, gate: &Tensor, up: &Tensor) -> Result<Tensor, TchError> {
    match k {
        Kernels::Eager => gate.f_silu()?.f_mul(up),
        Kernels::Composed | Kernels::Fused => ffi::swiglu(gate, up, k == Kernels::Fused),
    }
}

/// RoPE of `x` (B, n_head, T, d_head) with the process's kernels and `tables` for its
/// positions, in x's dtype.
pub fn rope(x: &Tensor, tables: &RopeTables) -> Result<Tensor, TchError> {
    rope_with(current(Op::Rope), x, tables)
}

fn rope_with(k: Kernels, x: &Tensor, tables: &RopeTables) -> Result<Tensor, TchError> {
    match k {
        Kernels::Eager => tables.eager(x),
        Kernels::Composed | Kernels::Fused => ffi::rope(x, tables.maps(), k == Kernels::Fused),
    }
}

/// Times `candidates` for `op` on the model's shapes at this micro-batch and sequence
/// (SwiGLU: tokens × d_ff; RoPE: q, B × n_head × T × d_head in the model's layout), in
/// `kind` on `device`, forward and backward, each checked against f32 on the first rows,
/// and [`set`]s the fastest exact one; composed when none is. With a `group`, every rank
/// times and all choose the same.
#[allow(clippy::too_many_arguments)]
pub fn tune(
    op: Op,
    m: &ModelConfig,
    micro_batch: i64,
    seq: i64,
    kind: Kind,
    device: Device,
    candidates: &[Kernels],
    group: Option<&ProcessGroup>,
) -> Result<Choice<Kernels>, Error> {
    let prepared = Problem::new(op, m, micro_batch, seq, kind, device).and_then(|p| {
        let reference = p.reference()?;
        Ok((p, reference))
    });
    let trial = |(p, reference): &(Problem, Vec<Tensor>), k| {
        Trial::measure(
            k,
            kind,
            device,
            || p.forward_backward(&p.inputs, &p.g, k),
            |out| relative_error(&p.first_rows(&out)?, reference),
        )
    };
    let trials = trials::run_all(candidates, prepared, trial, group, device)?;
    let kernels = trials::fastest(&trials).unwrap_or(Kernels::Composed);
    set(op, kernels);
    Ok(Choice { chosen: kernels, trials })
}

/// One op's trial: random inputs of the run's shapes and the output's gradient `g`.
struct Problem {
    op: Op,
    inputs: Vec<Tensor>,
    g: Tensor,
    /// RoPE's tables for positions 0..T.
    rope: Option<Rope>,
}

impl Problem {
    fn new(op: Op, m: &ModelConfig, b: i64, t: i64, kind: Kind, device: Device) -> Result<Problem, Error> {
        let randn = |shape: &[i64]| Tensor::f_randn(shape, (kind, device));
        Ok(match op {
            Op::Swiglu => {
                let shape = [b * t, m.d_ff as i64];
                // gate spread wider than N(0, 1), so silu's curved part is exercised.
                Problem {
                    op,
                    inputs: vec![randn(&shape)?.f_mul_scalar(3.0)?, randn(&shape)?],
                    g: randn(&shape)?,
                    rope: None,
                }
            }
            Op::Rope => {
                let (h, d) = (m.n_head as i64, m.d_head as i64);
                // q as the model has it: (B, T, n_head, d_head) transposed.
                let q = randn(&[b, t, h, d])?.f_transpose(1, 2)?; // (B, n_head, T, d_head)
                Problem {
                    op,
                    inputs: vec![q],
                    g: randn(&[b, h, t, d])?,
                    rope: Some(Rope::new(d, t, m.rope_theta, device)?),
                }
            }
        })
    }

    /// The op on `inputs` with kernels `k`, and the inputs' gradients for the output's
    /// gradient `g`: [y, d(input)…].
    fn forward_backward(&self, inputs: &[Tensor], g: &Tensor, k: Kernels) -> Result<Vec<Tensor>, Error> {
        let xs = inputs.iter().map(|x| x.f_detach()?.f_requires_grad_(true)).collect::<Result<Vec<_>, _>>()?;
        let y = match (self.op, &self.rope) {
            (Op::Swiglu, _) => swiglu_with(k, &xs[0], &xs[1])?,
            (Op::Rope, Some(rope)) => rope_with(k, &xs[0], &rope.tables(xs[0].kind(), 0, xs[0].size()[2])?)?,
            (Op::Rope, None) => return Err(Error::Shim("rope trial: no tables".into())),
        };
        ffi::backward(std::slice::from_ref(&y), std::slice::from_ref(g))?;
        let mut out = vec![y.f_detach()?];
        out.extend(xs.iter().map(Tensor::grad));
        Ok(out)
    }

    /// `ts` cut to the rows the reference holds.
    fn first_rows(&self, ts: &[Tensor]) -> Result<Vec<Tensor>, Error> {
        Ok(ts
            .iter()
            .map(|t| t.f_narrow(0, 0, t.size()[0].min(REFERENCE_ROWS[self.op as usize])))
            .collect::<Result<_, _>>()?)
    }

    /// The composed kernels in f32 on the first rows: the answer every candidate is held to.
    fn reference(&self) -> Result<Vec<Tensor>, Error> {
        let f32 = |ts: &[Tensor]| -> Result<Vec<Tensor>, Error> {
            Ok(self.first_rows(ts)?.iter().map(|t| t.f_to_kind(Kind::Float)).collect::<Result<_, _>>()?)
        };
        self.forward_backward(&f32(&self.inputs)?, &f32(std::slice::from_ref(&self.g))?[0], Kernels::Composed)
    }
}
