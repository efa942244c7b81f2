//! One rank's generated batch and what its last step computed on it, laid out per
//! completion: what another implementation of the loss needs to repeat the step, and
//! what it must agree with (TRL's `GRPOTrainer`, in `tests/trl_parity.rs`).

use std::path::Path;

use tch::{Device, Kind, Tensor};

use super::stats::Sums;
use crate::Error;

/// The rows of a generated batch on one rank, in sampling order (a prompt's group is
/// consecutive).
pub(super) struct Rows {
    pub prompts: Vec<Vec<i64>>,
    pub completions: Vec<Vec<i64>>,
    pub rewards: Vec<f64>,
    pub advantages: Vec<f64>,
    /// Whether each completion is in the loss (maskTruncatedCompletions leaves the
    /// truncated ones out).
    pub in_loss: Vec<bool>,
}

/// What the last step computed on one micro-batch, detached: per-token (B, L−1) and
/// the loss and clip counts.
pub(super) struct MicroOutputs {
    pub logp: Tensor,
    pub per_token: Tensor,
    pub per_token_kl: Tensor,
    pub loss: Tensor,
    pub clipped_low: Tensor,
    pub clipped_high: Tensor,
}

/// A generated batch and its last step, per completion. Per-token tensors are
/// (rows, longest completion) f32 on the CPU, 0 past a completion's end.
pub struct BatchRecord {
    pub prompts: Vec<Vec<i64>>,
    pub completions: Vec<Vec<i64>>,
    pub rewards: Vec<f64>,
    pub advantages: Vec<f64>,
    pub in_loss: Vec<bool>,
    /// log π_θ of each completion token at logits / temperature.
    pub logps: Tensor,
    /// The sampling policy's, when the batch serves several steps.
    pub old_logps: Option<Tensor>,
    /// The reference model's, when β > 0.
    pub ref_logps: Option<Tensor>,
    pub per_token_loss: Tensor,
    pub per_token_kl: Tensor,
    /// The step's loss on this rank: the sum of its micro-batches' losses, which is
    /// what the backward passes differentiate.
    pub loss: f64,
    pub clipped_low: f64,
    pub clipped_high: f64,
    /// The generated batch's metric sums; `kl`, `clipped` and `off_policy_masked` are
    /// the last step's.
    pub sums: Sums,
}

/// Per-row slices `[start_j, start_j + len_j)` of the micro-batches' (B, L−1) tensors,
/// stacked into (rows, longest) and zero-padded.
fn per_completion(parts: &[&Tensor], starts: &[usize], lengths: &[usize]) -> Result<Tensor, Error> {
    let width = lengths.iter().copied().max().unwrap_or(0) as i64;
    let mut rows = Vec::with_capacity(lengths.len());
    let mut i = 0;
    for t in parts {
        let t = t.f_to_kind(Kind::Float)?.f_to_device(Device::Cpu)?;
        for j in 0..t.size()[0] {
            let row = t.f_get(j)?.f_narrow(0, starts[i] as i64, lengths[i] as i64)?;
            rows.push(row.f_constant_pad_nd([0, width - lengths[i] as i64])?);
            i += 1;
        }
    }
    Ok(Tensor::f_stack(&rows, 0)?)
}

impl BatchRecord {
    pub(super) fn new(
        rows: &Rows,
        outputs: &[MicroOutputs],
        old: &[Option<&Tensor>],
        reference: &[Option<&Tensor>],
        sums: Sums,
    ) -> Result<BatchRecord, Error> {
        // A row's completion targets start at the last prompt position.
        let starts: Vec<usize> = rows.prompts.iter().map(|p| p.len() - 1).collect();
        let lengths: Vec<usize> = rows.completions.iter().map(Vec::len).collect();
        let gather = |pick: &dyn Fn(&MicroOutputs) -> &Tensor| {
            per_completion(&outputs.iter().map(pick).collect::<Vec<_>>(), &starts, &lengths)
        };
        let optional = |parts: &[Option<&Tensor>]| -> Result<Option<Tensor>, Error> {
            match parts.iter().copied().collect::<Option<Vec<&Tensor>>>() {
                Some(parts) if !parts.is_empty() => Ok(Some(per_completion(&parts, &starts, &lengths)?)),
                _ => Ok(None),
            }
        };
        let total = |pick: &dyn Fn(&MicroOutputs) -> &Tensor| -> Result<f64, Error> {
            outputs.iter().map(|o| Ok(pick(o).f_double_value(&[])?)).sum()
        };
        Ok(BatchRecord {
            prompts: rows.prompts.clone(),
            completions: rows.completions.clone(),
            rewards: rows.rewards.clone(),
            advantages: rows.advantages.clone(),
            in_loss: rows.in_loss.clone(),
            logps: gather(&|o| &o.logp)?,
            old_logps: optional(old)?,
            ref_logps: optional(reference)?,
            per_token_loss: gather(&|o| &o.per_token)?,
            per_token_kl: gather(&|o| &o.per_token_kl)?,
            loss: total(&|o| &o.loss)?,
            clipped_low: total(&|o| &o.clipped_low)?,
            clipped_high: total(&|o| &o.clipped_high)?,
            sums,
        })
    }

    /// Writes the record as safetensors: ids right-padded with −1, per-token tensors,
    /// and scalars as 0-dim f64 tensors named as the fields.
    pub fn write(&self, path: &Path) -> Result<(), Error> {
        let ids = |rows: &[Vec<i64>]| -> Result<Tensor, Error> {
            let width = rows.iter().map(Vec::len).max().unwrap_or(0);
            let flat: Vec<i64> =
                rows.iter().flat_map(|r| r.iter().copied().chain(std::iter::repeat_n(-1, width - r.len()))).collect();
            Ok(Tensor::f_from_slice(&flat)?.f_view([rows.len() as i64, width as i64])?)
        };
        let f64s = |v: &[f64]| Tensor::f_from_slice(v);
        let scalar = |x: f64| Tensor::f_from_slice(&[x])?.f_squeeze();
        let s = &self.sums;
        let in_loss: Vec<i64> = self.in_loss.iter().map(|&k| i64::from(k)).collect();
        let mut named = vec![
            ("prompt_ids", ids(&self.prompts)?),
            ("completion_ids", ids(&self.completions)?),
            ("rewards", f64s(&self.rewards)?),
            ("advantages", f64s(&self.advantages)?),
            ("in_loss", Tensor::f_from_slice(&in_loss)?),
            ("logps", self.logps.shallow_clone()),
            ("per_token_loss", self.per_token_loss.shallow_clone()),
            ("per_token_kl", self.per_token_kl.shallow_clone()),
            ("loss", scalar(self.loss)?),
            ("clipped_low", scalar(self.clipped_low)?),
            ("clipped_high", scalar(self.clipped_high)?),
            ("kl_sum", scalar(s.kl)?),
            ("off_policy_masked", scalar(s.off_policy_masked)?),
            ("loss_tokens", scalar(s.loss_tokens)?),
            ("entropy_sum", scalar(s.entropy)?),
            ("entropy_tokens", scalar(s.entropy_tokens)?),
        ];
        if let Some(t) = &self.old_logps {
            named.push(("old_logps", t.shallow_clone()));
        }
        if let Some(t) = &self.ref_logps {
            named.push(("ref_logps", t.shallow_clone()));
        }
        Ok(Tensor::write_safetensors(&named, path)?)
    }
}
