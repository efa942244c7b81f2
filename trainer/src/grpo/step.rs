//! One GRPO optimizer step on one rank: sample G completions of each of this rank's
//! prompts with the KV cache, score them, turn rewards into group-relative advantages,
//! then run forward and backward over the completions in micro-batches with the
//! clipped loss. A generated batch serves `iterations` steps.

use std::time::Instant;

use crds::config::{ResolvedGrpo, RunConfig};
use tch::{Device, Kind, Tensor};

use super::data::Questions;
use super::loss::{self, LossSettings, Normalizer};
use super::record::{BatchRecord, MicroOutputs, Rows};
use super::reward;
use super::stats::Sums;
use crate::Error;
use crate::data::tokenizer::Tokenizer;
use crate::dist::ReduceOp;
use crate::generate::{self, Sampling};
use crate::model::Model;
use crate::parallel::DataParallel;

/// What one step needs from the trainer.
pub struct StepContext<'a> {
    pub model: &'a Model,
    pub tokenizer: &'a Tokenizer,
    pub device: Device,
    pub autocast: bool,
    pub rank: u32,
    pub world_size: u32,
    /// How the gang shares the step: the gradient reducer and, with several ranks, the group.
    pub parallel: &'a dyn DataParallel,
    /// The optimizer step being computed (1-based).
    pub step: u64,
    /// The first prompt of its generated batch in the run's prompt order (ranks take
    /// consecutive shares from it).
    pub first_prompt: u64,
    /// Multiplies the loss (NaN under fault injection).
    pub scale: f64,
}

/// Rows `prompt ++ completion` packed for a forward pass: inputs and targets (B, L−1),
/// right-padded with `pad`, and a mask (B, L−1) f32 that is 1 where the target is a
/// completion token.
pub struct Packed {
    pub inputs: Tensor,
    pub targets: Tensor,
    pub mask: Tensor,
}

pub fn pack(rows: &[(&[i64], &[i64])], pad: i64, device: Device) -> Result<Packed, Error> {
    let width = rows.iter().map(|(p, c)| p.len() + c.len()).max().unwrap_or(2).max(2) - 1;
    let (mut inputs, mut targets, mut mask) = (Vec::new(), Vec::new(), Vec::new());
    for (p, c) in rows {
        let full: Vec<i64> = p.iter().chain(c.iter()).copied().collect();
        for j in 0..width {
            inputs.push(full.get(j).copied().unwrap_or(pad));
            targets.push(full.get(j + 1).copied().unwrap_or(pad));
            let completion = j + 1 >= p.len() && j + 1 < full.len();
            mask.push(if completion { 1.0f32 } else { 0.0 });
        }
    }
    let b = rows.len() as i64;
    let shape = [b, width as i64];
    Ok(Packed {
        inputs: Tensor::f_from_slice(&inputs)?.f_view(shape)?.f_to_device(device)?,
        targets: Tensor::f_from_slice(&targets)?.f_view(shape)?.f_to_device(device)?,
        mask: Tensor::f_from_slice(&mask)?.f_view(shape)?.f_to_device(device)?,
    })
}

/// Per-token log-probabilities (B, L−1) of `packed`'s targets under `model`, over the
/// sampler's support when `keep` (B, L−1, V) is given.
pub fn packed_logps(
    model: &Model,
    packed: &Packed,
    temperature: f64,
    autocast: bool,
    keep: Option<&Tensor>,
) -> Result<Tensor, Error> {
    let logits = crate::ffi::autocast(packed.inputs.device(), autocast, || model.logits(&packed.inputs))?;
    support_logps(&logits, &packed.targets, temperature, keep)
}

/// [`loss::token_logps`] renormalized over `keep` (B, L−1, V) when given.
fn support_logps(logits: &Tensor, targets: &Tensor, temperature: f64, keep: Option<&Tensor>) -> Result<Tensor, Error> {
    let masked;
    let logits = match keep {
        Some(k) => {
            masked = logits.f_to_kind(Kind::Float)?.f_masked_fill(&k.f_logical_not()?, f64::NEG_INFINITY)?;
            &masked
        }
        None => logits,
    };
    Ok(loss::token_logps(logits, targets, temperature)?)
}

/// The keep-sampling mask (DeepSeek-V3.2): for each position, the tokens top-p sampling
/// could have drawn from the sampling policy's `logits` (B, L−1, V), plus the target
/// itself (which the sampler drew; recomputed logits may round it out of the set).
fn keep_mask(logits: &Tensor, targets: &Tensor, temperature: f64, top_p: f64) -> Result<Tensor, Error> {
    let scaled = logits.f_to_kind(Kind::Float)?.f_div_scalar(temperature)?;
    let keep = generate::nucleus_drop(&scaled, top_p)?.f_logical_not()?;
    let own = targets.f_unsqueeze(-1)?;
    let ones = Tensor::f_ones(own.size(), (Kind::Bool, keep.device()))?;
    Ok(keep.f_scatter(-1, &own, &ones)?)
}

/// One micro-batch of a generated batch, ready for the loss.
struct Micro {
    /// Its mask is 0 on a completion left out of the loss (a truncated one, when those
    /// are masked).
    packed: Packed,
    adv: Tensor,
    old: Option<Tensor>,
    reference: Option<Tensor>,
    /// The keep-sampling mask (B, L−1, V) when sampling truncates (topP < 1).
    support: Option<Tensor>,
}

/// A generated, scored batch of this rank's completions.
struct Rollout {
    generation: u64,
    micro: Vec<Micro>,
    norm: Normalizer,
    sums: Sums,
    sampling_seconds: f64,
    rows: Rows,
}

/// GRPO state across steps: questions, the frozen reference model, the batch in use.
pub struct Grpo {
    g: ResolvedGrpo,
    seed: u64,
    seq_len: usize,
    micro_batch: usize,
    questions: Questions,
    reference: Option<Model>,
    /// Keeps the reference model's parameters alive.
    _reference_store: Option<tch::nn::VarStore>,
    batch: Option<Rollout>,
    /// The last step's outputs, one per micro-batch of `batch`, and its metric sums.
    last: Vec<MicroOutputs>,
    last_sums: Sums,
    settings: LossSettings,
}

impl Grpo {
    /// `reference`: the frozen initial policy, present exactly when β > 0.
    pub fn new(
        cfg: &RunConfig,
        questions: Questions,
        reference: Option<(tch::nn::VarStore, Model)>,
    ) -> Result<Grpo, Error> {
        let g = cfg.grpo.clone().ok_or_else(|| Error::InvalidSpec("spec.grpo is required for phase grpo".into()))?;
        let settings = LossSettings {
            epsilon_low: g.clip_epsilon_low,
            epsilon_high: g.clip_epsilon_high,
            beta: g.beta,
            loss_type: g.loss_type,
            unbiased_kl: g.unbiased_kl,
            off_policy_threshold: g.off_policy_mask_threshold,
            max_completion_length: g.max_new_tokens as i64,
        };
        let (store, reference) = reference.map_or((None, None), |(vs, m)| (Some(vs), Some(m)));
        Ok(Grpo {
            seed: cfg.seed,
            seq_len: cfg.batch.seq_len as usize,
            micro_batch: cfg.batch.micro_batch as usize,
            questions,
            reference,
            _reference_store: store,
            batch: None,
            last: Vec::new(),
            last_sums: Sums::default(),
            settings,
            g,
        })
    }

    pub fn questions(&self) -> &Questions {
        &self.questions
    }

    /// Prompts of one generated batch, all ranks.
    pub fn prompts_per_step(&self) -> u64 {
        self.g.prompts_per_step as u64
    }

    /// Whether a run may stop (and checkpoint) after `step`: between generated batches.
    pub fn at_boundary(&self, step: u64) -> bool {
        step.is_multiple_of(self.g.iterations as u64)
    }

    /// The first step at or after `step` that ends a generated batch.
    pub fn boundary_at_or_after(&self, step: u64) -> u64 {
        step.next_multiple_of(self.g.iterations as u64)
    }

    /// The longest prompt, in tokens: the rest of seqLength is for the completion.
    pub fn max_prompt_tokens(&self) -> usize {
        self.seq_len - self.g.max_new_tokens as usize
    }

    /// Accumulates this step's gradients into the model's parameters and returns this
    /// rank's loss (0-dim, detached) and metric sums, and the seconds spent sampling
    /// (0 on a step that reuses its batch) and training.
    pub fn gradients(&mut self, ctx: &StepContext) -> Result<(Tensor, Sums, f64, f64), Error> {
        let generation = (ctx.step - 1) / self.g.iterations as u64;
        if self.batch.as_ref().map(|b| b.generation) != Some(generation) {
            self.batch = None;
            self.batch = Some(self.rollout(ctx, generation)?);
        }
        let fresh = self.batch.as_ref().is_some_and(|b| b.generation * self.g.iterations as u64 + 1 == ctx.step);
        let started = Instant::now();
        let batch = self.batch.as_ref().expect("generated above");
        let mut total = Tensor::f_zeros([], (Kind::Float, ctx.device))?;
        let mut kl = Tensor::f_zeros([], (Kind::Float, ctx.device))?;
        let mut clipped = Tensor::f_zeros([], (Kind::Float, ctx.device))?;
        let mut masked = Tensor::f_zeros([], (Kind::Float, ctx.device))?;
        let mut trained = 0.0;
        self.last.clear();
        let mut entropy = Tensor::f_zeros([], (Kind::Float, ctx.device))?;
        let mut entropy_tokens = Tensor::f_zeros([], (Kind::Float, ctx.device))?;
        for (i, m) in batch.micro.iter().enumerate() {
            let last = i + 1 == batch.micro.len();
            ctx.parallel.begin_micro_step(last)?;
            let logits = crate::ffi::autocast(ctx.device, ctx.autocast, || ctx.model.logits(&m.packed.inputs))?;
            if fresh {
                // The policy that sampled the batch: its spread over the completion tokens.
                let h = tch::no_grad(|| loss::masked_entropy_sum(&logits, &m.packed.mask, self.g.temperature))?;
                entropy = entropy.f_add(&h)?;
                entropy_tokens = entropy_tokens.f_add(&m.packed.mask.f_sum(Kind::Float)?)?;
            }
            let logp = support_logps(&logits, &m.packed.targets, self.g.temperature, m.support.as_ref())?;
            let parts = loss::policy_loss(
                &logp,
                m.old.as_ref(),
                m.reference.as_ref(),
                &m.adv,
                &m.packed.mask,
                &self.settings,
                batch.norm,
            )?;
            parts.loss.f_mul_scalar(ctx.scale)?.f_backward()?;
            ctx.parallel.end_micro_step(last)?;
            let loss = parts.loss.f_detach()?;
            total = total.f_add(&loss)?;
            kl = kl.f_add(&parts.kl_sum)?;
            clipped = clipped.f_add(&parts.clipped_low.f_add(&parts.clipped_high)?)?;
            masked = masked.f_add(&parts.off_policy_masked)?;
            trained += m.packed.inputs.numel() as f64;
            self.last.push(MicroOutputs {
                logp: logp.f_detach()?,
                per_token: parts.per_token,
                per_token_kl: parts.per_token_kl,
                loss,
                clipped_low: parts.clipped_low,
                clipped_high: parts.clipped_high,
            });
        }
        if fresh {
            let measured = (entropy.f_double_value(&[])?, entropy_tokens.f_double_value(&[])?);
            let b = self.batch.as_mut().expect("generated above");
            (b.sums.entropy, b.sums.entropy_tokens) = measured;
        }
        let batch = self.batch.as_ref().expect("generated above");
        let mut sums = Sums {
            kl: kl.f_double_value(&[])?,
            clipped: clipped.f_double_value(&[])?,
            off_policy_masked: masked.f_double_value(&[])?,
            trained_tokens: trained,
            ..batch.sums
        };
        if !fresh {
            sums.sampled_tokens = 0.0;
        }
        let sampling = if fresh { batch.sampling_seconds } else { 0.0 };
        self.last_sums = sums;
        Ok((total, sums, sampling, started.elapsed().as_secs_f64()))
    }

    /// The generated batch in use and what the last step computed on it; `None` before
    /// the first step.
    pub fn record(&self) -> Result<Option<BatchRecord>, Error> {
        let Some(batch) = self.batch.as_ref().filter(|b| b.micro.len() == self.last.len()) else {
            return Ok(None);
        };
        let old: Vec<Option<&Tensor>> = batch.micro.iter().map(|m| m.old.as_ref()).collect();
        let reference: Vec<Option<&Tensor>> = batch.micro.iter().map(|m| m.reference.as_ref()).collect();
        Ok(Some(BatchRecord::new(&batch.rows, &self.last, &old, &reference, self.last_sums)?))
    }

    /// Samples, scores and packs this rank's share of generated batch `generation`.
    fn rollout(&self, ctx: &StepContext, generation: u64) -> Result<Rollout, Error> {
        let started = Instant::now();
        let g = &self.g;
        let group = g.generations_per_prompt as usize;
        let tok = ctx.tokenizer;
        let eos = tok.eos_id() as i64;
        let first = ctx.first_prompt + ctx.rank as u64 * g.prompts_per_rank as u64;
        let records: Vec<_> =
            (0..g.prompts_per_rank as u64).map(|k| self.questions.nth(first + k, self.seed)).collect();
        let max_prompt = self.max_prompt_tokens();
        let prompts: Vec<Vec<i64>> = records
            .iter()
            .map(|r| {
                let ids = tok.encode(&r.prompt());
                // A long question keeps its end: the options and "Answer:".
                ids[ids.len().saturating_sub(max_prompt)..].iter().map(|&t| t as i64).collect()
            })
            .collect();
        let rows: Vec<Vec<i64>> = prompts.iter().flat_map(|p| std::iter::repeat_n(p.clone(), group)).collect();
        let sampling = Sampling { temperature: g.temperature, top_k: 0, top_p: g.top_p };
        let completions = {
            let _rng = crate::rng::GLOBAL_RNG.lock().unwrap_or_else(|e| e.into_inner());
            let key =
                crate::rng::splitmix64(self.seed ^ crate::rng::splitmix64(generation ^ ((ctx.rank as u64) << 40)));
            tch::manual_seed((key >> 1) as i64);
            crate::ffi::autocast(ctx.device, ctx.autocast, || {
                sample_completions(ctx.model, &rows, g.max_new_tokens as usize, &sampling, eos, ctx.device)
            })?
        };
        let sampling_seconds = started.elapsed().as_secs_f64();

        let mut sums = Sums::default();
        let mut rewards = Vec::with_capacity(rows.len());
        let mut truncated = Vec::with_capacity(rows.len());
        for (i, c) in completions.iter().enumerate() {
            let ended = c.last() == Some(&eos);
            let text_ids: Vec<u32> = c.iter().take_while(|&&t| t != eos).map(|&t| t as u32).collect();
            let scored = reward::mcq_reward(
                &tok.decode(&text_ids),
                records[i / group].answer,
                records[i / group].options.len(),
                text_ids.len(),
                g.length_penalty,
                g.max_new_tokens as usize,
            );
            rewards.push(scored.reward);
            truncated.push(!ended);
            sums.completions += 1.0;
            sums.reward += scored.reward;
            sums.correct += f64::from(u8::from(scored.correct));
            sums.unparsed += f64::from(u8::from(scored.unparsed));
            sums.completion_tokens += c.len() as f64;
            sums.sampled_tokens += c.len() as f64;
        }
        let in_loss: Vec<bool> = truncated.iter().map(|&cut| !(cut && g.mask_truncated_completions)).collect();
        sums.loss_tokens =
            completions.iter().zip(&in_loss).filter(|&(_, &kept)| kept).map(|(c, _)| c.len() as f64).sum();
        // Over every rank: the reward spread (for batch scaling) and the tokens in the
        // loss (dapo divides by their global count).
        let mut global =
            [rewards.iter().sum::<f64>(), rewards.iter().map(|r| r * r).sum(), rewards.len() as f64, sums.loss_tokens];
        if let Some(grp) = ctx.parallel.group() {
            let t = Tensor::f_from_slice(&global)?.f_to_device(ctx.device)?;
            grp.allreduce(&t, ReduceOp::Sum)?.wait()?;
            global.copy_from_slice(&Vec::<f64>::try_from(t.f_to_device(Device::Cpu)?)?);
        }
        let [sum, sum_sq, n, tokens] = global;
        let batch_std = if n > 1.0 { ((sum_sq - sum * sum / n) / (n - 1.0)).max(0.0).sqrt() } else { 0.0 };
        let (adv, flat) = loss::advantages(&rewards, group, g.scale_rewards, batch_std);
        sums.groups = flat.chunks(group).count() as f64;
        sums.flat_groups = flat.chunks(group).filter(|c| c[0]).count() as f64;
        let norm = Normalizer {
            sequences: rows.len() as f64,
            tokens: tokens / ctx.world_size as f64,
            micro_batches: rows.len().div_ceil(self.micro_batch) as f64,
        };

        let mut micro = Vec::new();
        for start in (0..rows.len()).step_by(self.micro_batch) {
            let end = (start + self.micro_batch).min(rows.len());
            let pairs: Vec<(&[i64], &[i64])> =
                (start..end).map(|i| (rows[i].as_slice(), completions[i].as_slice())).collect();
            let floats = |v: &[f64]| -> Result<Tensor, Error> {
                Ok(Tensor::f_from_slice(v)?.f_to_kind(Kind::Float)?.f_to_device(ctx.device)?)
            };
            let mut packed = pack(&pairs, eos, ctx.device)?;
            let kept: Vec<f64> = in_loss[start..end].iter().map(|&k| f64::from(u8::from(k))).collect();
            packed.mask = packed.mask.f_mul(&floats(&kept)?.f_unsqueeze(1)?)?;
            let (old, reference, support) = tch::no_grad(|| -> Result<_, Error> {
                let truncated = g.top_p < 1.0;
                // The sampling policy's view of the batch: its support and, when the batch
                // serves several steps, its log-probabilities.
                let (old, support) = if g.iterations > 1 || truncated {
                    let logits = crate::ffi::autocast(ctx.device, ctx.autocast, || ctx.model.logits(&packed.inputs))?;
                    let support = if truncated {
                        Some(keep_mask(&logits, &packed.targets, g.temperature, g.top_p)?)
                    } else {
                        None
                    };
                    let old = if g.iterations > 1 {
                        Some(support_logps(&logits, &packed.targets, g.temperature, support.as_ref())?)
                    } else {
                        None
                    };
                    (old, support)
                } else {
                    (None, None)
                };
                let reference = match &self.reference {
                    Some(r) => Some(packed_logps(r, &packed, g.temperature, ctx.autocast, support.as_ref())?),
                    None => None,
                };
                Ok((old, reference, support))
            })?;
            micro.push(Micro { adv: floats(&adv[start..end])?, packed, old, reference, support });
        }
        let rows = Rows { prompts: rows, completions, rewards, advantages: adv, in_loss };
        Ok(Rollout { generation, micro, norm, sums, sampling_seconds, rows })
    }
}

/// The group's completions: on CUDA by the static decoder's CUDA graphs
/// ([`generate::graph`]), falling back to the eager KV cache (with a warning) if they
/// fail; elsewhere by the eager KV cache, which is also their reference.
fn sample_completions(
    model: &crate::model::Model,
    rows: &[Vec<i64>],
    max_new: usize,
    sampling: &Sampling,
    eos: i64,
    device: tch::Device,
) -> Result<Vec<Vec<i64>>, tch::TchError> {
    if device.is_cuda() && crate::ffi::shim_built_with_cuda() {
        let how = generate::graph::StaticDecoding::default();
        match generate::graph::generate_static(model, rows, max_new, sampling, Some(eos), device, how) {
            Ok(done) => return Ok(done),
            Err(e) => tracing::warn!("GRPO sampling: the CUDA-graph decoder failed ({e}); decoding eagerly"),
        }
    }
    generate::generate_cached(model, rows, max_new, sampling, Some(eos), device)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Top-p 0.8 over probabilities (0.5, 0.3, 0.15, 0.05) keeps the first two; a target
    /// outside the set joins it; log-probabilities renormalize over the kept tokens.
    #[test]
    fn keep_sampling_mask_renormalizes_over_the_sampler_support() {
        let logits = Tensor::from_slice(&[0.5f32, 0.3, 0.15, 0.05]).log().view([1, 1, 4]).repeat([1, 2, 1]);
        let targets = Tensor::from_slice(&[0i64, 3]).view([1, 2]);
        let keep = keep_mask(&logits, &targets, 1.0, 0.8).unwrap();
        assert_eq!(
            Vec::<bool>::try_from(keep.view([-1])).unwrap(),
            [true, true, false, false, true, true, false, true]
        );
        let got = Vec::<f64>::try_from(
            support_logps(&logits, &targets, 1.0, Some(&keep)).unwrap().view([-1]).to_kind(Kind::Double),
        )
        .unwrap();
        let want = [(0.5f64 / 0.8).ln(), (0.05f64 / 0.85).ln()];
        assert!((got[0] - want[0]).abs() < 1e-6 && (got[1] - want[1]).abs() < 1e-6, "{got:?} vs {want:?}");
    }

    #[test]
    fn packing_marks_exactly_the_completion_targets() {
        let p = pack(&[(&[1, 2, 3], &[4, 5]), (&[6], &[7, 8, 9])], 0, Device::Cpu).unwrap();
        assert_eq!(Vec::<i64>::try_from(p.inputs.view([-1])).unwrap(), [1, 2, 3, 4, 6, 7, 8, 9]);
        assert_eq!(Vec::<i64>::try_from(p.targets.view([-1])).unwrap(), [2, 3, 4, 5, 7, 8, 9, 0]);
        assert_eq!(Vec::<f32>::try_from(p.mask.view([-1])).unwrap(), [0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0]);
    }
}
