//! The kernels a run chooses by measurement: on CUDA, each op's composed and fused
//! kernels (SwiGLU, RoPE, the residual RMSNorm, the loss chunk) are timed on the run's
//! own shapes and dtypes ([`tune`]) and the faster exact one is kept; [`choose_kernels`]
//! also times the SDPA backends ([`super::attention::tune`]). Elsewhere ATen's composed
//! kernels run.

use crds::presets::{ModelConfig, loss_chunk_tokens};
use crds::types::Attention;
use tch::{Device, Kind, Tensor};

use super::choice::{KernelRequest, Kernels, Op, current, set};
use super::loss::{IGNORE_INDEX, cross_entropy_chunk_with};
use super::norm::residual_rms_norm_with;
use super::rope::{Rope, rope_with};
use super::swiglu::swiglu_with;
use super::trials::{self, Choice, Trial, relative_error};
use crate::dist::ProcessGroup;
use crate::{Error, ffi};

/// The kernels a CUDA run tries; the first wins a tie.
pub const CUDA_CANDIDATES: [Kernels; 2] = [Kernels::Composed, Kernels::Fused];
/// The rows (SwiGLU's tokens, RoPE's batch rows) of a trial's inputs checked against f32,
/// by [`Op`]. The norm's weight gradient and the chunk's loss sum over every row, so
/// those two are checked whole.
const REFERENCE_ROWS: [i64; Op::ALL.len()] = [256, 1, i64::MAX, i64::MAX];
/// The norm's epsilon in a trial (the presets' order of magnitude).
const TRIAL_EPS: f64 = 1e-5;

/// The dtypes a run trains in (the training loop's precision plan): the weights' (and
/// the residual stream's), the matmuls', and whether autocast casts between them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RunKinds {
    pub weights: Kind,
    pub matmuls: Kind,
    pub autocast: bool,
}

impl RunKinds {
    /// A run without autocast, everything in `kind`.
    pub fn uniform(kind: Kind) -> Self {
        RunKinds { weights: kind, matmuls: kind, autocast: false }
    }
}

/// Times `candidates` for `op` on the model's shapes at this micro-batch and sequence
/// (SwiGLU: tokens × d_ff; RoPE: q, B × n_head × T × d_head in the model's layout; the
/// norm: the residual stream, tokens × d_model; the loss: one chunk of logits), in the
/// run's dtypes on `device`, forward and backward, each checked against f32, and [`set`]s
/// the fastest exact one; composed when none is. With a `group`, every rank times and all
/// choose the same.
#[allow(clippy::too_many_arguments)]
pub fn tune(
    op: Op,
    m: &ModelConfig,
    micro_batch: i64,
    seq: i64,
    kinds: RunKinds,
    device: Device,
    candidates: &[Kernels],
    group: Option<&ProcessGroup>,
) -> Result<Choice<Kernels>, Error> {
    let prepared = Problem::new(op, m, micro_batch, seq, kinds, device).and_then(|p| {
        let reference = p.reference()?;
        Ok((p, reference))
    });
    let trial = |(p, reference): &(Problem, Vec<Tensor>), k| {
        Trial::measure(
            k,
            kinds.matmuls,
            device,
            || ffi::autocast(device, kinds.autocast, || p.forward_backward(&p.inputs, &p.grads, k)),
            |out| relative_error(&p.first_rows(&out)?, reference),
        )
    };
    let trials = trials::run_all(candidates, prepared, trial, group, device)?;
    let kernels = trials::fastest(&trials).unwrap_or(Kernels::Composed);
    set(op, kernels);
    Ok(Choice { chosen: kernels, trials })
}

/// One op's trial: random inputs of the run's shapes and the outputs' gradients.
struct Problem {
    op: Op,
    inputs: Vec<Tensor>,
    /// One for each output that takes a gradient (none for the loss, whose gradient is
    /// its output).
    grads: Vec<Tensor>,
    /// RoPE's tables for positions 0..T.
    rope: Option<Rope>,
    /// The loss chunk's targets (some ignored) and how many count.
    targets: Option<(Tensor, Tensor)>,
}

impl Problem {
    fn new(op: Op, m: &ModelConfig, b: i64, t: i64, kinds: RunKinds, device: Device) -> Result<Problem, Error> {
        let kind = kinds.matmuls;
        let randn = |shape: &[i64], kind: Kind| Tensor::f_randn(shape, (kind, device));
        let (d, tokens) = (m.d_model as i64, b * t);
        let plain = |inputs, grads| Problem { op, inputs, grads, rope: None, targets: None };
        Ok(match op {
            Op::Swiglu => {
                let shape = [tokens, m.d_ff as i64];
                // gate spread wider than N(0, 1), so silu's curved part is exercised.
                plain(vec![randn(&shape, kind)?.f_mul_scalar(3.0)?, randn(&shape, kind)?], vec![randn(&shape, kind)?])
            }
            Op::Rope => {
                let (h, dh) = (m.n_head as i64, m.d_head as i64);
                // q as the model has it: (B, T, n_head, d_head) transposed.
                let q = randn(&[b, t, h, dh], kind)?.f_transpose(1, 2)?; // (B, n_head, T, d_head)
                Problem {
                    rope: Some(Rope::new(dh, t, m.rope_theta, device)?),
                    ..plain(vec![q], vec![randn(&[b, h, t, dh], kind)?])
                }
            }
            Op::Norm => {
                // As in a block: the stream in the weights' dtype, the attention's output
                // (the branch) in the matmuls'.
                let stream = kinds.weights;
                let weight = randn(&[d], stream)?.f_mul_scalar(0.1)?.f_add_scalar(1.0)?;
                plain(
                    vec![randn(&[tokens, d], stream)?, randn(&[tokens, d], kind)?, weight],
                    vec![randn(&[tokens, d], kind)?, randn(&[tokens, d], stream)?, randn(&[tokens, d], kind)?],
                )
            }
            Op::Loss => {
                let (rows, vocab) = (tokens.min(loss_chunk_tokens(m.vocab_size as i64)), m.vocab_size as i64);
                // Logits spread as a trained model's, every seventh target ignored.
                let logits = randn(&[rows, vocab], kind)?.f_mul_scalar(3.0)?;
                let targets = Tensor::f_randint(vocab, [rows], (Kind::Int64, device))?;
                let ignored = Tensor::f_arange(rows, (Kind::Int64, device))?.f_remainder(7)?.f_eq(0)?;
                let targets = targets.f_masked_fill(&ignored, IGNORE_INDEX)?;
                let counted = targets.f_ne(IGNORE_INDEX)?.f_sum(Kind::Float)?.f_clamp_min(1.0)?;
                Problem { targets: Some((targets, counted)), ..plain(vec![logits], Vec::new()) }
            }
        })
    }

    /// The op on `inputs` with kernels `k`, and the inputs' gradients for the outputs'
    /// gradients `grads`: [outputs…, d(input)…] (the loss: [loss, d(logits)]).
    fn forward_backward(&self, inputs: &[Tensor], grads: &[Tensor], k: Kernels) -> Result<Vec<Tensor>, Error> {
        if let (Op::Loss, Some((targets, counted))) = (self.op, &self.targets) {
            // The chunk is overwritten by its gradient: each run gets its own copy.
            let mut logits = inputs[0].f_empty_like()?;
            logits.f_copy_(&inputs[0])?;
            let chunk = cross_entropy_chunk_with(k, logits, targets, counted, 1.0)?;
            return Ok(vec![chunk.loss, chunk.grad]);
        }
        let xs = inputs.iter().map(|x| x.f_detach()?.f_requires_grad_(true)).collect::<Result<Vec<_>, _>>()?;
        let ys = match (self.op, &self.rope) {
            (Op::Swiglu, _) => vec![swiglu_with(k, &xs[0], &xs[1])?],
            (Op::Rope, Some(rope)) => vec![rope_with(k, &xs[0], &rope.tables(xs[0].kind(), 0, xs[0].size()[2])?)?],
            (Op::Norm, _) => {
                // Both forms a block runs: input_layernorm on the stream alone, then the
                // attention's residual add with post_attention_layernorm.
                let alone = residual_rms_norm_with(k, &xs[0], None, &xs[2], TRIAL_EPS)?;
                let normed = residual_rms_norm_with(k, &xs[0], Some(&xs[1]), &xs[2], TRIAL_EPS)?;
                vec![normed.out, normed.stream, alone.out]
            }
            (op, _) => return Err(Error::Shim(format!("{} trial: its inputs are missing", op.name()))),
        };
        // Each gradient in its output's dtype, as autograd hands it on.
        let grads = ys.iter().zip(grads).map(|(y, g)| g.f_to_kind(y.kind())).collect::<Result<Vec<_>, _>>()?;
        ffi::backward(&ys, &grads)?;
        let mut out = ys.iter().map(Tensor::f_detach).collect::<Result<Vec<_>, _>>()?;
        out.extend(xs.iter().map(Tensor::grad));
        Ok(out)
    }

    /// `ts` cut to the rows the reference holds.
    fn first_rows(&self, ts: &[Tensor]) -> Result<Vec<Tensor>, Error> {
        let rows = REFERENCE_ROWS[self.op as usize];
        Ok(ts
            .iter()
            .map(|t| if t.dim() == 0 || t.size()[0] <= rows { Ok(t.shallow_clone()) } else { t.f_narrow(0, 0, rows) })
            .collect::<Result<_, _>>()?)
    }

    /// The composed kernels in f32 on the first rows, without autocast: the answer every
    /// candidate is held to.
    fn reference(&self) -> Result<Vec<Tensor>, Error> {
        let f32 = |ts: &[Tensor]| -> Result<Vec<Tensor>, Error> {
            Ok(self.first_rows(ts)?.iter().map(|t| t.f_to_kind(Kind::Float)).collect::<Result<_, _>>()?)
        };
        self.forward_backward(&f32(&self.inputs)?, &f32(&self.grads)?, Kernels::Composed)
    }
}

/// The kernels a run chooses between, and on CUDA what was timed to choose them.
pub struct ChosenKernels {
    /// `spec.attention`, `auto` resolved on CUDA ([`super::attention::tune`]).
    pub attention: Attention,
    pub attention_trials: Option<Choice<Attention>>,
    /// Each op's kernels, set for the process ([`set`]); for GPT-2, which has neither
    /// SwiGLU, RoPE nor RMSNorm, only the loss's.
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

/// The ops a model runs whose kernels are chosen: GPT-2 has no SwiGLU, RoPE or RMSNorm.
pub fn ops_of(m: &ModelConfig) -> Vec<Op> {
    match m.arch {
        crds::presets::Arch::Gpt2 => vec![Op::Loss],
        _ => Op::ALL.to_vec(),
    }
}

/// The SDPA backend (`auto` on CUDA timed on the model's attention at this micro-batch
/// and sequence) and each op's kernels ([`ops_of`]; timed on CUDA when not requested,
/// ATen's composed ones elsewhere), with what was timed. With a `group`, every rank
/// chooses the same.
pub fn choose_kernels(
    requested: KernelRequest,
    m: &ModelConfig,
    micro_batch: i64,
    seq: i64,
    kinds: RunKinds,
    device: Device,
    group: Option<&ProcessGroup>,
) -> Result<ChosenKernels, Error> {
    let attention_trials = if requested.attention == Attention::Auto && device.is_cuda() {
        let candidates = &super::attention::CUDA_CANDIDATES;
        Some(super::attention::tune(m, micro_batch, seq, kinds.matmuls, device, candidates, group)?)
    } else {
        None
    };
    let mut fused = Vec::new();
    for op in ops_of(m) {
        let trials = match requested.fused(op) {
            None if device.is_cuda() => Some(tune(op, m, micro_batch, seq, kinds, device, &CUDA_CANDIDATES, group)?),
            k => {
                set(op, k.unwrap_or(Kernels::Composed));
                None
            }
        };
        fused.push(FusedChoice { op, kernels: current(op), trials });
    }
    Ok(ChosenKernels {
        attention: attention_trials.as_ref().map_or(requested.attention, |c| c.chosen),
        attention_trials,
        fused,
    })
}
