//! One optimizer step: the micro-batches' forward and backward passes (pretraining or
//! GRPO), the gradient all-reduce, clipping and AdamW, queued on the device; and the
//! sync that reads queued steps back.

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crds::contract::FailedSamples;
use crds::presets::H100_PEAK_BF16_FLOPS;
use tch::{Device, Kind, Tensor};

use super::pending::{PendingStep, StepScalars};
use super::phase::Phase;
use super::state::Weights;
use super::timing::StepTiming;
use super::trainer::Trainer;
use crate::Error;
use crate::checkpoint::resume::sorted_variables;
use crate::data::loader::{BatchPlan, Loader};
use crate::dist::ReduceOp;
use crate::ffi::StreamMark;
use crate::grpo::stats::{GrpoStats, Sums};
use crate::grpo::step::StepContext;
use crate::model::Documents;
use crate::optim;
use crate::train::report::{GpuMemory, StepReport};

/// The layout of the f32 tensor a step all-reduces over ranks: the loss divided by
/// the world size, the number of ranks asking to stop, and GRPO's [`Sums`].
struct StepTotals;

impl StepTotals {
    const LOSS: i64 = 0;
    const STOP_VOTES: i64 = 1;
    const GRPO_SUMS: i64 = 2;
    const GRPO_SUMS_LEN: i64 = (std::mem::size_of::<Sums>() / std::mem::size_of::<f64>()) as i64;
}

impl Trainer {
    /// Keeps a GRPO step's metrics for its report, with the run of steps without
    /// learning signal they extend.
    fn record_grpo(&mut self, stats: GrpoStats) {
        if let Phase::Grpo(g) = &mut self.phase {
            let stats = stats.after(g.no_signal_steps);
            g.no_signal_steps = stats.no_signal_steps;
            g.last = Some(stats);
        }
    }

    fn batch_plan(&self) -> BatchPlan {
        BatchPlan {
            micro_batch: self.cfg.batch.micro_batch as u64,
            grad_accum: self.cfg.batch.grad_accum,
            world_size: self.cfg.topology.world_size,
            rank: self.opts.placement.rank,
        }
    }

    /// Micro-batch `m` of this rank at the current position: `(inputs, targets)` (B, T),
    /// from the prefetching loader (started here at the first call).
    fn micro_batch(&mut self, m: u32) -> Result<(Tensor, Tensor), Error> {
        let plan = self.batch_plan();
        let (position, device) = (self.data.position, self.device);
        let Phase::Pretrain(p) = &mut self.phase else {
            return Err(Error::InvalidSpec("spec.data: pretraining needs a data mix".into()));
        };
        let loader = match &mut p.loader {
            Some(loader) => loader,
            None => {
                let depth = 2 * self.cfg.batch.grad_accum as usize;
                let rollbacks = &self.cfg.rollbacks;
                p.loader.insert(Loader::start(p.mix.clone(), plan, rollbacks, position, device, depth)?)
            }
        };
        let waited = Instant::now();
        let b = loader.next(position, m)?;
        self.clock.data_wait += waited.elapsed().as_secs_f64();
        // From pinned memory the copies run asynchronously with respect to the host.
        let to = |t: &Tensor| t.f_to_device_(self.device, Kind::Int64, self.device.is_cuda(), false);
        Ok((to(&b.inputs)?, to(&b.targets)?))
    }

    /// Tokens each source has given, and logs (rank 0) a source starting a new epoch.
    fn track_sources(&mut self) -> Vec<(String, u64)> {
        let rank0 = self.rank0();
        let Some(train) = self.phase.mix().cloned() else { return Vec::new() };
        let mut counts = train.counts_at(self.data.position);
        let epochs = self.phase.epochs(&counts);
        let Phase::Pretrain(p) = &mut self.phase else { return Vec::new() };
        let seq = self.cfg.batch.seq_len as u64;
        for (s, epoch) in epochs.into_iter().enumerate() {
            if epoch > p.source_epochs[s] {
                p.source_epochs[s] = epoch;
                if rank0 {
                    tracing::info!(
                        source = %train.sources()[s].name,
                        epoch = epoch + 1,
                        samples_per_epoch = train.windows()[s],
                        "data source ran out; starting a new epoch in a new order"
                    );
                }
            }
        }
        // Samples a rollback skipped took their place in the order, but were not trained on.
        for skipped in crds::rollback::skipped_below(&self.cfg.rollbacks, self.data.position) {
            let (before, after) = (train.counts_at(skipped.start), train.counts_at(skipped.end));
            for (c, (b, a)) in counts.iter_mut().zip(before.iter().zip(&after)) {
                *c -= a - b;
            }
        }
        let names = train.sources().iter().map(|s| s.name.clone());
        names.zip(counts.iter().map(|c| c * seq)).collect()
    }

    /// The samples optimizer step `step` trains on: the global batch at the data
    /// position (past any a rollback skips); for GRPO, its generated batch's prompts,
    /// which every step of that batch shares.
    fn step_window(&self, step: u64) -> Range<u64> {
        let start = |len: u64| {
            let from = crds::rollback::skip_past(&self.cfg.rollbacks, self.data.position);
            from..from + len
        };
        match (self.phase.grpo(), &self.data.window) {
            (None, _) => start(self.cfg.batch.global_sequences),
            (Some(g), Some(w)) if !g.at_boundary(step - 1) => w.clone(),
            (Some(g), _) => start(g.prompts_per_step()),
        }
    }

    /// The forward and backward passes of one optimizer step over `grad_accum`
    /// micro-batches: leaves every parameter's gradient averaged over micro-batches
    /// and ranks, and returns this step's mean loss over all ranks (0-dim, f32, on
    /// the device). With several ranks it also agrees on whether any wants to stop.
    pub fn compute_gradients(&mut self) -> Result<Tensor, Error> {
        let step = self.progress.step + 1;
        let accum = self.cfg.batch.grad_accum;
        let window = self.step_window(step);
        if self.phase.grpo().is_none() {
            self.data.position = window.start;
        }
        self.data.window = Some(window);
        let start = if self.in_gang() { Some(StreamMark::now(self.device)?) } else { None };
        self.clock.data_wait = 0.0;
        self.faults.before_step(step, self.opts.placement.rank, self.device)?;
        let (loss, grpo) = if self.phase.grpo().is_some() {
            let (loss, sums, sampling, training) = self.grpo_gradients(step, self.faults.loss_scale(step, 1.0))?;
            (loss, Some((sums, sampling, training)))
        } else {
            (self.pretrain_gradients(self.faults.loss_scale(step, 1.0 / accum as f64))?, None)
        };
        let Some(group) = self.parallel.group() else {
            if let Some((sums, s, t)) = grpo {
                self.record_grpo(GrpoStats::from_sums(&sums, s, t));
            }
            return Ok(loss);
        };
        self.clock.step_timing = start.map(|start| StepTiming {
            start,
            end: self.parallel.take_compute_end(),
            data_wait: self.clock.data_wait,
        });
        // The loss is averaged for reporting, and the stop flags and GRPO's sums ride along
        // in the same all-reduce: one f32 tensor laid out as [`StepTotals`].
        let stop = if self.stop.signal.load(Ordering::SeqCst) { 1.0 } else { 0.0 };
        let mut head =
            vec![loss.f_div_scalar(group.world_size() as f64)?, Tensor::f_full([], stop, (Kind::Float, self.device))?];
        if let Some((sums, _, _)) = &grpo {
            let fields = bytemuck::cast_slice::<Sums, f64>(std::slice::from_ref(sums));
            head.push(Tensor::f_from_slice(fields)?.f_to_kind(Kind::Float)?.f_to_device(self.device)?);
        }
        let totals = Tensor::f_cat(&head.iter().map(|t| t.f_reshape([-1])).collect::<Result<Vec<_>, _>>()?, 0)?;
        group.allreduce(&totals, ReduceOp::Sum)?.wait()?;
        // Read at the next sync, with the loss.
        self.stop.flags = Some(totals.f_get(StepTotals::STOP_VOTES)?);
        if let Some((_, sampling, training)) = grpo {
            let sums = totals.f_narrow(0, StepTotals::GRPO_SUMS, StepTotals::GRPO_SUMS_LEN)?;
            let all = Vec::<f64>::try_from(sums.f_to_kind(Kind::Double)?.f_to_device(Device::Cpu)?)?;
            let sums: Sums = bytemuck::pod_read_unaligned(bytemuck::cast_slice(&all));
            self.record_grpo(GrpoStats::from_sums(&sums, sampling, training));
        }
        Ok(totals.f_get(StepTotals::LOSS)?)
    }

    /// How the run's windows are packed (`spec.data.packing`).
    fn packing(&self) -> crds::types::Packing {
        self.cfg.data.as_ref().map_or(crds::types::Packing::Concat, |d| d.packing)
    }

    /// GRPO's step on this rank: this rank's loss, metric sums, and sampling and
    /// training seconds.
    fn grpo_gradients(&mut self, step: u64, scale: f64) -> Result<(Tensor, Sums, f64, f64), Error> {
        let Phase::Grpo(phase) = &mut self.phase else { unreachable!("grpo_gradients runs in phase grpo") };
        let ctx = StepContext {
            model: &self.model,
            tokenizer: &self.tokenizer,
            device: self.device,
            autocast: self.autocast,
            rank: self.opts.placement.rank,
            world_size: self.cfg.topology.world_size,
            parallel: self.parallel.as_ref(),
            step,
            first_prompt: self.data.window.as_ref().map_or(0, |w| w.start),
            scale,
        };
        phase.grpo.gradients(&ctx)
    }

    /// Pretraining's forward and backward passes over this rank's micro-batches, with
    /// the loss scaled by `scale`; returns this rank's mean loss.
    fn pretrain_gradients(&mut self, scale: f64) -> Result<Tensor, Error> {
        let accum = self.cfg.batch.grad_accum;
        let mut loss_sum = Tensor::f_zeros([], (Kind::Float, self.device))?;
        for m in 0..accum {
            let last = m + 1 == accum;
            self.parallel.begin_micro_step(last)?;
            let (x, y) = self.micro_batch(m)?;
            let (docs, y) = Documents::pack(self.packing(), &x, &y, i64::from(self.tokenizer.eos_id()))?;
            let recompute = self.cfg.recomputed_blocks() as usize;
            let (model, units) = (&self.model, self.parallel.residency());
            let loss = crate::ffi::autocast(self.device, self.autocast, || {
                model.backward_with(&x, &y, scale, model.loss_chunk(), recompute, units, docs.as_ref())
            })?;
            self.parallel.end_micro_step(last)?;
            loss_sum = loss_sum.f_add(&loss)?;
        }
        Ok(loss_sum.f_div_scalar(accum as f64)?)
    }

    /// Every parameter's gradient by name (copies), as [`Self::compute_gradients`] left them
    /// (whole gradients only: zero2 and fsdp keep each rank's shard).
    pub fn gradients(&self) -> Result<Vec<(String, Tensor)>, Error> {
        sorted_variables(&self.vs)
            .into_iter()
            .map(|(name, p)| {
                let g = p.f_grad()?;
                if !g.defined() {
                    return Err(Error::InvalidSpec(format!(
                        "{name} has no whole gradient (spec.parallelism {:?} shards gradients over the ranks)",
                        self.cfg.parallelism
                    )));
                }
                Ok((name, g.f_detach_copy()?))
            })
            .collect()
    }

    /// In phase grpo, this rank's generated batch in use and what the last step computed
    /// on it ([`crate::grpo::record::BatchRecord`]); `None` before the first step and in
    /// pretraining.
    pub fn grpo_batch(&self) -> Result<Option<crate::grpo::record::BatchRecord>, Error> {
        self.phase.grpo().map_or(Ok(None), |g| g.record())
    }

    /// Bytes of optimizer state this rank holds (1/world of it under zero1).
    pub fn optimizer_state_bytes(&self) -> usize {
        self.opt.state_bytes()
    }

    /// Every parameter by name, in checkpoint order (copies gathered from every rank
    /// under fsdp, where every rank calls this).
    pub fn parameters(&mut self) -> Result<Vec<(String, Tensor)>, Error> {
        Weights { vs: &self.vs, parallel: &mut *self.parallel }.whole()
    }

    /// One optimizer step over `grad_accum` micro-batches, read back from the device.
    pub fn train_step(&mut self) -> Result<StepReport, Error> {
        self.launch_step()?;
        Ok(self.sync()?.pop().expect("a step was queued"))
    }

    /// Queues one optimizer step without waiting for the device. Clipping, the
    /// non-finite check and the skip of a non-finite update all happen on the
    /// device; [`Self::sync`] reads the results.
    pub(super) fn launch_step(&mut self) -> Result<(), Error> {
        let started = Instant::now();
        let step = self.progress.step + 1;
        let lr = self.cfg.lr_at(step, self.progress.tokens);
        let loss = self.compute_gradients()?;
        let samples = self.data.window.clone().expect("set by compute_gradients");
        let norm = self.parallel.grad_norm()?;
        if let Some(snapshot) = self.snapshot.take() {
            let waited = snapshot.wait();
            tracing::debug!(step, waited_ms = waited.as_secs_f64() * 1e3, "checkpoint snapshot taken");
        }
        let (grad_norm, _skipped) =
            self.opt.clip_and_step(&loss, self.cfg.optimizer.grad_clip, optim::Lr::Value(lr), norm)?;
        self.opt.zero_grad()?;
        let stop = match self.stop.flags.take() {
            Some(flags) => flags,
            None => Tensor::f_zeros([], (Kind::Float, self.device))?,
        };
        let values =
            StepScalars::on_device(&loss.f_to_kind(Kind::Float)?, &grad_norm.f_to_device(self.device)?, &stop)?;
        self.progress.step = step;
        self.progress.tokens += self.cfg.batch.tokens_per_step;
        self.data.position = samples.end;
        let tokens_by_source = self.track_sources();
        self.pending.push(PendingStep {
            step,
            tokens: self.progress.tokens,
            lr,
            values,
            grpo: match &mut self.phase {
                Phase::Grpo(g) => g.last.take(),
                Phase::Pretrain(_) => None,
            },
            tokens_by_source,
            samples,
            timing: self.clock.step_timing.take(),
            started,
        });
        Ok(())
    }

    /// Waits for the queued steps and reads their losses and gradient norms in one
    /// transfer. Fails at the first step whose loss or norm is not finite (the
    /// device skipped its update). Throughput is the average over the queued steps.
    pub(super) fn sync(&mut self) -> Result<Vec<StepReport>, Error> {
        let pending = std::mem::take(&mut self.pending);
        let Some(first) = pending.first() else { return Ok(Vec::new()) };
        let (first_step, started) = (first.step, first.started);
        let read = || -> Result<Vec<f64>, Error> {
            let all = Tensor::f_stack(&pending.iter().map(|p| p.values.shallow_clone()).collect::<Vec<_>>(), 0)?;
            Ok(Vec::<f64>::try_from(all.f_to_kind(Kind::Double)?.f_to_device(Device::Cpu)?.f_reshape([-1])?)?)
        };
        let values = read().map_err(|e| e.at_step(first_step))?;
        // The read completed every queued step's work, and so its timing marks.
        for t in pending.iter().filter_map(|p| p.timing.as_ref()) {
            self.clock.rank_totals.add(t)?;
        }
        let seconds = started.elapsed().as_secs_f64();
        let tokens_per_second = (pending.len() as u64 * self.cfg.batch.tokens_per_step) as f64 / seconds;
        let mfu = self.device.is_cuda().then(|| {
            let per_gpu = tokens_per_second / self.cfg.topology.world_size as f64;
            self.cfg.model.mfu(self.cfg.batch.seq_len, per_gpu, H100_PEAK_BF16_FLOPS)
        });
        let gpu_memory = crate::ffi::device_memory(self.device)?
            .map(|m| GpuMemory { peak_bytes: m.peak_allocated, total_bytes: m.total });
        let mut reports = Vec::with_capacity(pending.len());
        for (p, v) in pending.into_iter().zip(bytemuck::cast_slice::<f64, StepScalars>(&values)) {
            let (loss, grad_norm) = (v.loss, v.grad_norm);
            if !loss.is_finite() || !grad_norm.is_finite() {
                let samples = FailedSamples {
                    from: p.samples.start,
                    to: p.samples.end,
                    checkpoint: self.data.checkpoint_position,
                };
                return Err(Error::NonFinite { step: p.step, loss, grad_norm, samples: Some(samples) });
            }
            if self.in_gang() {
                self.stop.agreed = v.stop_votes > 0.0;
            }
            reports.push(StepReport {
                step: p.step,
                tokens: p.tokens,
                loss,
                lr: p.lr,
                grad_norm,
                tokens_per_second,
                mfu,
                grpo: p.grpo,
                gpu_memory,
                tokens_by_source: p.tokens_by_source,
            });
        }
        if let Some(group) = self.parallel.group() {
            self.clock.rank_timings = Some(self.clock.rank_totals.gather(group, self.device)?);
        }
        Ok(reports)
    }
}
