//! The loop: [`Trainer::run`] steps to the budget, reading back at sync points,
//! evaluating and checkpointing on schedule, and ends with a last checkpoint, the
//! accuracy change and a sample. Rank 0 alone writes checkpoints.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crds::contract::TrainerPhase;
use crds::types::CheckpointRef;

use super::checkpoints::Checkpoints;
use super::evaluate::{self, SetScore};
use super::report::{Event, RunStart, Sinks};
use super::trainer::Trainer;
use crate::Error;
use crate::checkpoint;

/// What a finished (or stopped) run reports.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub step: u64,
    pub tokens: u64,
    /// (step, loss) of every step this process ran.
    pub losses: Vec<(u64, f64)>,
    pub val_loss: Option<f64>,
    pub last_checkpoint: Option<CheckpointRef>,
    /// Entropy of the training stream's unigram distribution, nats/token: the loss
    /// of a model that learned only token frequencies (pretraining).
    pub unigram_entropy: Option<f64>,
    /// GRPO: each evaluation set's accuracy (the held-out set first) before this run's
    /// training, when it started from step 0, and after.
    pub accuracy: Vec<evaluate::SetChange>,
    /// Step the run resumed from, if it did.
    pub resumed_from: Option<u64>,
    /// GRPO: steps in a row, up to the last, without learning signal.
    pub no_signal_steps: Option<u64>,
}

/// What the loop carries from step to step.
struct Lap {
    /// The step the loop ends after (the budget, or `stop_after_steps`).
    last_step: u64,
    checkpoints: Checkpoints,
    unigram_entropy: Option<f64>,
    /// GRPO's accuracy before training (a run from step 0).
    initial: Vec<SetScore>,
    losses: Vec<(u64, f64)>,
    last_loss: Option<f64>,
    val_loss: Option<f64>,
    evaluated_at: Option<u64>,
}

impl Lap {
    /// The validation loss, when it was measured at `step`.
    fn val_loss_at(&self, step: u64) -> Option<f64> {
        self.val_loss.filter(|_| self.evaluated_at == Some(step))
    }
}

/// What is due after a step was launched.
struct Due {
    eval: bool,
    checkpoint: bool,
    sync: bool,
}

impl Trainer {
    /// Trains to the budget (or `stop_after_steps`), checkpointing on schedule, at the
    /// end and on SIGTERM.
    pub fn run(mut self, stop: Arc<AtomicBool>, sinks: &mut Sinks) -> Result<Outcome, Error> {
        self.stop.signal = stop;
        let mut lap = self.begin(sinks)?;
        loop {
            let more = self.progress.step < lap.last_step && !self.may_stop();
            if !more && self.pending.is_empty() {
                break;
            }
            if more && let Err(e) = self.launch_step() {
                return Err(self.failed(sinks, e.at_step(self.progress.step + 1)));
            }
            let due = self.due(more, lap.last_step);
            if due.sync {
                self.after_sync(&mut lap, &due, sinks)?;
            }
        }
        self.end(lap, sinks)
    }

    /// Checks the checkpoint directory can hold the run, starts the S3 mirror, and
    /// reports the start (and GRPO's accuracy before training).
    fn begin(&mut self, sinks: &mut Sinks) -> Result<Lap, Error> {
        let total_steps = self.cfg.schedule.total_steps;
        let mut last_step = self.opts.stop_after_steps.map_or(total_steps, |s| s.min(total_steps));
        if let Some(g) = self.phase.grpo() {
            // A generated batch is never split by a stop: resuming must regenerate it.
            last_step = g.boundary_at_or_after(last_step).min(total_steps);
        }
        let checkpoints = Checkpoints::start(
            &self.cfg,
            self.checkpoint_dir(),
            self.rank0(),
            self.checkpoint_estimate(),
            &self.faults,
        )
        .map_err(|e| self.failed(sinks, e))?;
        let unigram_entropy = self.phase.mix().map(|m| m.unigram_entropy()).transpose()?;
        let data = match (unigram_entropy, self.phase.grpo()) {
            (Some(h), _) => format!("unigram entropy of the data {h:.3} nats/token"),
            (None, Some(g)) => format!("GRPO on {} questions", g.questions().train.len()),
            (None, None) => String::new(),
        };
        let (step, tokens) = (self.progress.step, self.progress.tokens);
        sinks.emit(Event::Started(RunStart { step, tokens, cfg: &self.cfg, data: &data }))?;
        // GRPO measures the policy it starts from, to compare with the one it ends with.
        let initial = if step == 0 { self.report_accuracy(sinks, true)? } else { Vec::new() };
        sinks.emit(Event::Phase(TrainerPhase::Training))?;
        if self.rank0()
            && self.cfg.checkpoint.keep_best > 0
            && let Some(best) = checkpoint::best(self.checkpoint_dir())
        {
            sinks.emit(Event::Best(&best))?;
        }
        Ok(Lap {
            last_step,
            checkpoints,
            unigram_entropy,
            initial,
            losses: Vec::new(),
            last_loss: None,
            val_loss: None,
            evaluated_at: None,
        })
    }

    /// What the step just launched (or, with `more` false, the end) makes due. Every
    /// rank reads back at the same steps; one rank alone may read early to stop sooner.
    fn due(&self, more: bool, last_step: u64) -> Due {
        let step = self.progress.step;
        let every = self.cfg.checkpoint.every_steps as u64;
        let eval_every = self.cfg.data.as_ref().map_or(0, |d| d.eval_every_steps) as u64;
        let eval = eval_every > 0 && (step.is_multiple_of(eval_every) || step == self.cfg.schedule.total_steps);
        let checkpoint = every > 0 && step.is_multiple_of(every);
        let sync = !more
            || self.pending.len() as u64 >= self.sync_every
            || step == last_step
            || eval
            || checkpoint
            || (!self.in_gang() && self.stopping());
        Due { eval, checkpoint, sync }
    }

    /// Reads the queued steps back and reports them, then evaluates and checkpoints
    /// when due.
    fn after_sync(&mut self, lap: &mut Lap, due: &Due, sinks: &mut Sinks) -> Result<(), Error> {
        let reports = match self.sync() {
            Ok(reports) => reports,
            Err(e) => return Err(self.failed(sinks, e)),
        };
        for report in reports {
            lap.losses.push((report.step, report.loss));
            lap.last_loss = Some(report.loss);
            sinks.emit(Event::Step(&report))?;
        }
        if let Some(ranks) = self.clock.rank_timings.take() {
            sinks.emit(Event::Ranks(&ranks))?;
        }
        self.report_finished_checkpoint(&mut lap.checkpoints, sinks)?;
        if due.eval {
            sinks.emit(Event::Phase(TrainerPhase::Evaluating))?;
            if let Some((v, per_source)) = self.whole_model(|t| t.evaluate())? {
                let (step, tokens) = (self.progress.step, self.progress.tokens);
                (lap.val_loss, lap.evaluated_at) = (Some(v), Some(step));
                sinks.emit(Event::Eval { step, tokens, val_loss: v, per_source: &per_source })?;
            }
            sinks.emit(Event::Phase(TrainerPhase::Training))?;
        }
        let stopping = self.progress.step == lap.last_step || self.may_stop();
        if due.checkpoint && !stopping {
            self.data.checkpoint_position = self.data.position;
            let step = self.progress.step;
            let payload = self.checkpoint(lap.last_loss, lap.val_loss_at(step))?;
            self.checkpoint_in_background(&mut lap.checkpoints, payload, sinks)?;
        }
        Ok(())
    }

    /// The last checkpoint, the accuracy after training, a sample, and the outcome.
    fn end(mut self, mut lap: Lap, sinks: &mut Sinks) -> Result<Outcome, Error> {
        let step = self.progress.step;
        let last = if step > 0 { Some(self.checkpoint(lap.last_loss, lap.val_loss_at(step))?) } else { None };
        self.last_checkpoint(&mut lap.checkpoints, last, sinks)?;
        lap.checkpoints.finish()?;
        let interrupted = self.may_stop() && step < lap.last_step;
        let accuracy = if interrupted || step < self.cfg.schedule.total_steps {
            Vec::new()
        } else {
            evaluate::SetChange::pair(std::mem::take(&mut lap.initial), self.report_accuracy(sinks, false)?)
        };
        if self.opts.sample && !interrupted {
            // Every rank gathers fsdp's parameters; rank 0 samples.
            let rank0 = self.rank0();
            if let Some((prompt, text)) = self.whole_model(|t| if rank0 { t.sample().map(Some) } else { Ok(None) })? {
                let tokens = self.progress.tokens;
                sinks.emit(Event::Sample { step, tokens, prompt: &prompt, text: &text })?;
            }
        }
        sinks.finish();
        if interrupted {
            return Err(Error::Terminated { step });
        }
        sinks.emit(Event::Phase(TrainerPhase::Done))?;
        Ok(Outcome {
            step,
            tokens: self.progress.tokens,
            losses: lap.losses,
            val_loss: lap.val_loss,
            last_checkpoint: lap.checkpoints.last,
            unigram_entropy: lap.unigram_entropy,
            accuracy,
            resumed_from: self.progress.resumed_from,
            no_signal_steps: match &self.phase {
                super::phase::Phase::Grpo(g) => Some(g.no_signal_steps),
                super::phase::Phase::Pretrain(_) => None,
            },
        })
    }

    /// Whether to stop now: [`Self::stopping`], and for GRPO only between generated batches.
    pub(super) fn may_stop(&self) -> bool {
        self.stopping() && self.phase.grpo().is_none_or(|g| g.at_boundary(self.progress.step))
    }

    /// Whether to stop: SIGTERM here, or (with several ranks) on any rank, as agreed
    /// at the last step so that every rank stops after the same step.
    fn stopping(&self) -> bool {
        if self.in_gang() { self.stop.agreed } else { self.stop.signal.load(Ordering::SeqCst) }
    }

    /// Records a failure's reason before it is returned.
    pub(super) fn failed(&self, sinks: &mut Sinks, e: Error) -> Error {
        if let Error::NonFinite { step, .. } = e {
            let _ = sinks.emit(Event::NonFinite { step });
        }
        if let Some(reason) = e.reason() {
            let _ = sinks.emit(Event::Failure(reason));
        }
        e
    }

    /// Runs `f` with every parameter whole: fsdp gathers them all first (every rank
    /// calls this) and frees them after.
    fn whole_model<T>(&mut self, f: impl FnOnce(&Trainer) -> Result<T, Error>) -> Result<T, Error> {
        self.parallel.gather_all()?;
        let out = f(self);
        self.parallel.release_all()?;
        out
    }
}
