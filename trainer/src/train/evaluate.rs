//! Validation loss per source, GRPO's accuracy on its evaluation sets, and a sample
//! answer.

use crds::config::RunConfig;
use crds::contract::TrainerPhase;
use crds::types::Packing;
use tch::{Device, Tensor};

use super::trainer::Trainer;
use crate::Error;
use crate::data::corpus::{self, Split};
use crate::data::mix::Mix;
use crate::dist::{ProcessGroup, ReduceOp};
use crate::eval::{EvalOptions, McqScore};
use crate::generate::{self, Sampling};
use crate::model::{Documents, Model};
use crate::train::report::{Event, Sinks};

/// Validation loss: the mix-weighted mean and (source, loss) per source.
pub type Evaluation = (f64, Vec<(String, f64)>);

impl Trainer {
    /// Validation loss per source over `evalTokens`, and their mix-weighted mean.
    pub fn evaluate(&self) -> Result<Option<Evaluation>, Error> {
        if self.val.is_empty() {
            return Ok(None);
        }
        let group = self.group();
        let eos = self.tokenizer.eos_id();
        evaluate(&self.model, &self.cfg, &self.val, eos, self.device, self.autocast, group).map(Some)
    }

    /// Greedy answer to a validation multiple-choice question: (prompt, completion).
    pub fn sample(&self) -> Result<(String, String), Error> {
        let record = corpus::mcq_records(self.cfg.seed, 1, Split::Validation).remove(0);
        let prompt = record.prompt();
        let greedy = Sampling { temperature: 0.0, top_k: 0, top_p: 1.0 };
        let mut out = crate::ffi::autocast(self.device, self.autocast, || {
            generate::complete(&self.model, &self.tokenizer, &prompt, 1, 24, &greedy, self.device)
        })?;
        let gold = corpus::McqRecord::letter(record.answer);
        Ok((prompt, format!("{} (gold: {gold})", out.remove(0))))
    }

    /// GRPO: scores the policy on the held-out questions and on each of
    /// `evalDatasets` (every rank takes part) and reports each to the sinks.
    pub(super) fn report_accuracy(&self, sinks: &mut Sinks, initial: bool) -> Result<Vec<SetScore>, Error> {
        let Some(g) = self.phase.grpo() else { return Ok(Vec::new()) };
        let settings = self.cfg.grpo.as_ref().expect("phase grpo");
        let questions = g.questions();
        let sets = std::iter::once((HELD_OUT, &questions.held_out))
            .chain(questions.eval_sets.iter().map(|s| (s.name.as_str(), &s.set)))
            .filter(|(_, set)| !set.records.is_empty())
            .collect::<Vec<_>>();
        if sets.is_empty() {
            return Ok(Vec::new());
        }
        sinks.emit(Event::Phase(TrainerPhase::Evaluating))?;
        let options = EvalOptions {
            max_new_tokens: settings.max_new_tokens as usize,
            batch: (self.cfg.batch.micro_batch as usize).max(8),
            device: self.device,
            autocast: self.autocast,
        };
        let group = self.group();
        let mut scores = Vec::with_capacity(sets.len());
        for (name, set) in sets {
            let score = crate::eval::evaluate(&self.model, &self.tokenizer, set, None, &options, group)?;
            let (step, tokens) = (self.progress.step, self.progress.tokens);
            sinks.emit(Event::Accuracy { step, tokens, set: name, score: &score, initial })?;
            scores.push(SetScore { name: name.to_string(), score });
        }
        sinks.emit(Event::Phase(TrainerPhase::Training))?;
        Ok(scores)
    }
}

/// The name GRPO's held-out set is reported under.
pub const HELD_OUT: &str = "held-out";

/// A question set's score at one evaluation.
#[derive(Clone, Debug, PartialEq)]
pub struct SetScore {
    pub name: String,
    pub score: McqScore,
}

/// A question set's score before training (when the run started from step 0) and
/// after.
#[derive(Clone, Debug, PartialEq)]
pub struct SetChange {
    pub name: String,
    pub before: Option<McqScore>,
    pub after: McqScore,
}

impl SetChange {
    /// Each set of `after` with its score in `before`, if there.
    pub fn pair(before: Vec<SetScore>, after: Vec<SetScore>) -> Vec<SetChange> {
        after
            .into_iter()
            .map(|a| SetChange {
                before: before.iter().find(|b| b.name == a.name).map(|b| b.score.clone()),
                name: a.name,
                after: a.score,
            })
            .collect()
    }
}

/// Validation loss of each one-source mix in `val` over the run's `evalTokens`
/// (split evenly), and their mean weighted by the mix weights. With a group, the
/// ranks split the batches and every rank gets the totals.
pub fn evaluate(
    model: &Model,
    cfg: &RunConfig,
    val: &[Mix],
    eos: u32,
    device: Device,
    autocast: bool,
    group: Option<&ProcessGroup>,
) -> Result<Evaluation, Error> {
    let (rank, world) = group.map_or((0, 1), |g| (g.rank() as u64, g.world_size() as u64));
    let b = cfg.batch.micro_batch as u64;
    let t = cfg.batch.seq_len as u64;
    let per_source_samples = (cfg.data.as_ref().map_or(0, |d| d.eval_tokens) / val.len().max(1) as u64 / t).max(1);
    let weights: f64 = val.iter().map(|m| m.sources()[0].weight).sum();
    let counts: Vec<u64> = val.iter().map(|mix| per_source_samples.min(mix.windows()[0]).max(1)).collect();
    let mut totals = vec![0.0f64; val.len()];
    tch::no_grad(|| -> Result<(), Error> {
        for ((mix, &n), total) in val.iter().zip(&counts).zip(&mut totals) {
            // Batch k of this source is rank k mod world's.
            for (k, first) in (0..n).step_by(b as usize).enumerate() {
                if k as u64 % world != rank {
                    continue;
                }
                let take = (n - first).min(b) as usize;
                let (x, y, _) = mix.batch_tensors(first, take)?;
                let (x, y) = (x.f_to_device(device)?, y.f_to_device(device)?);
                let packing = cfg.data.as_ref().map_or(Packing::Concat, |d| d.packing);
                let (docs, y) = Documents::pack(packing, &x, &y, i64::from(eos))?;
                let loss = crate::ffi::autocast(device, autocast, || model.loss(&x, &y, docs.as_ref()))?;
                *total += loss.f_double_value(&[])? * take as f64;
            }
        }
        Ok(())
    })?;
    if let Some(g) = group {
        let t = Tensor::f_from_slice(&totals)?.f_to_device(device)?;
        g.allreduce(&t, ReduceOp::Sum)?.wait()?;
        totals = Vec::<f64>::try_from(t.f_to_device(Device::Cpu)?)?;
    }
    let mut mean = 0.0;
    let mut per_source = Vec::new();
    for ((mix, &n), total) in val.iter().zip(&counts).zip(totals) {
        let src = &mix.sources()[0];
        let loss = total / n as f64;
        mean += loss * src.weight / weights;
        per_source.push((src.name.clone(), loss));
    }
    Ok((mean, per_source))
}
