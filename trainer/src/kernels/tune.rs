//! The kernels a run chooses by measurement: on CUDA, SwiGLU's and RoPE's composed
//! and jiterator-fused kernels are timed on the run's own shapes ([`tune`]) and the
//! faster exact one is kept; [`choose_kernels`] also times the SDPA backends
//! ([`super::attention::tune`]). Elsewhere ATen's composed kernels run.

use crds::presets::ModelConfig;
use crds::types::Attention;
use tch::{Device, Kind, Tensor};

use super::choice::{KernelRequest, Kernels, Op, current, set};
use super::rope::{Rope, rope_with};
use super::swiglu::swiglu_with;
use super::trials::{self, Choice, Trial, relative_error};
use crate::dist::ProcessGroup;
use crate::{Error, ffi};

/// The kernels a CUDA run tries; the first wins a tie.
pub const CUDA_CANDIDATES: [Kernels; 2] = [Kernels::Composed, Kernels::Fused];
/// The rows (SwiGLU's tokens, RoPE's batch rows) of a trial's inputs checked against f32.
const REFERENCE_ROWS: [i64; 2] = [256, 1];
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

/// The kernels a run chooses between, and on CUDA what was timed to choose them.
pub struct ChosenKernels {
    /// `spec.attention`, `auto` resolved on CUDA ([`super::attention::tune`]).
    pub attention: Attention,
    pub attention_trials: Option<Choice<Attention>>,
    /// SwiGLU's and RoPE's kernels, set for the process ([`set`]); empty
    /// for GPT-2, which has neither.
    pub fused: Vec<FusedChoice>,
}

/// One op's kernels, and on CUDA what was timed to choose them.
pub struct FusedChoice {
    pub op: Op,
    pub kernels: Kernels,
    pub trials: Option<Choice<Kernels>>,
}

impl ChosenKernels {
    /// One log line per timed choice.
    pub fn log(&self, micro_batch: u32, seq: u32) {
        use super::trials::Candidate;
        let at = format!("one layer's forward and backward at micro-batch {micro_batch} × {seq} tokens");
        if let Some(t) = &self.attention_trials {
            tracing::info!("attention: auto timed {at} ({}) and chose {}", t.summary(), t.chosen.name());
        }
        for f in &self.fused {
            if let Some(t) = &f.trials {
                tracing::info!("{}: timed {at} ({}) and chose {}", f.op.name(), t.summary(), t.chosen.name());
            }
        }
    }
}

/// The SDPA backend (`auto` on CUDA timed on the model's attention at this micro-batch
/// and sequence) and SwiGLU's and RoPE's kernels (timed on CUDA when not requested,
/// ATen's composed ones elsewhere; GPT-2 has neither), with what was timed. With a
/// `group`, every rank chooses the same.
pub fn choose_kernels(
    requested: KernelRequest,
    m: &ModelConfig,
    micro_batch: i64,
    seq: i64,
    kind: Kind,
    device: Device,
    group: Option<&ProcessGroup>,
) -> Result<ChosenKernels, Error> {
    let attention_trials = if requested.attention == Attention::Auto && device.is_cuda() {
        Some(super::attention::tune(m, micro_batch, seq, kind, device, &super::attention::CUDA_CANDIDATES, group)?)
    } else {
        None
    };
    let mut fused = Vec::new();
    if m.arch != crds::presets::Arch::Gpt2 {
        for op in [Op::Swiglu, Op::Rope] {
            let trials = match requested.fused(op) {
                None if device.is_cuda() => Some(tune(op, m, micro_batch, seq, kind, device, &CUDA_CANDIDATES, group)?),
                k => {
                    set(op, k.unwrap_or(Kernels::Composed));
                    None
                }
            };
            fused.push(FusedChoice { op, kernels: current(op), trials });
        }
    }
    Ok(ChosenKernels {
        attention: attention_trials.as_ref().map_or(requested.attention, |c| c.chosen),
        attention_trials,
        fused,
    })
}
