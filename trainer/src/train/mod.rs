//! The training loop of one process: [`Trainer::new`] builds the model, data and
//! optimizer and restores the run ([`restore`]); [`Trainer::run`] steps ([`step`]),
//! evaluates ([`evaluate`]) and checkpoints on schedule, and tells its
//! [`Sinks`] what happened. Rank 0 alone writes checkpoints.

pub mod evaluate;
pub mod faults;
mod pending;
pub mod precision;
pub mod report;
pub mod restore;
pub mod step;
mod timing;
pub mod units;

pub use evaluate::HELD_OUT;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crds::config::{Device as RunDevice, RunConfig};
use crds::contract::TrainerPhase;
use crds::types::{Attention, CheckpointRef, Parallelism};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::Error;
use crate::checkpoint;
use crate::checkpoint::mirror::Mirror;
use crate::checkpoint::resume::{named_in_definition_order, sorted_variables};
use crate::checkpoint::writer::{Checkpointer, Snapshot};
use crate::data::corpus::Split;
use crate::data::loader::Loader;
use crate::data::mix::Mix;
use crate::data::sources;
use crate::data::tokenizer::Tokenizer;
use crate::dist::fsdp::ShardedParams;
use crate::dist::reducer::BucketItem;
use crate::dist::{self, GradReducer, Placement, ProcessGroup};
use crate::grpo::stats::GrpoStats;
use crate::grpo::step::Grpo;
use crate::kernels::choice::KernelRequest;
use crate::kernels::sdp;
use crate::kernels::tune::choose_kernels;
use crate::model::{Model, Unit};
use crate::optim::zero::{ShardedAdamW, ZeroStage};
use crate::optim::{AdamW, Optimizer};
use crate::rng::GLOBAL_RNG;
use faults::Faults;
use pending::PendingStep;
use precision::{matmul_kind, precision_plan};
use report::{Event, RunStart, Sinks};

/// How one process takes part in the run, and where it writes.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Checkpoints and `metrics.jsonl`.
    pub output_dir: PathBuf,
    /// Stop (with a checkpoint) after this many optimizer steps in total, before the budget.
    pub stop_after_steps: Option<u64>,
    /// Progress bar or log lines; `None` decides by whether stdout is a terminal.
    pub tty: Option<bool>,
    /// Print a sample generation at the end.
    pub sample: bool,
    /// Where `initFrom.trainingRun` runs are found (`/init` in a pod; their output
    /// directory locally).
    pub init_dir: PathBuf,
    /// This process's rank in the gang; a world size above 1 joins a c10d group.
    pub placement: Placement,
    /// Read losses and gradient norms back from the device once every this many
    /// steps (and at every checkpoint, evaluation and the last step); `None`:
    /// [`DEFAULT_CUDA_SYNC_EVERY`] on CUDA, 1 on CPU, always 1 for GRPO.
    pub sync_every: Option<u64>,
}

/// On CUDA, steps queued between host syncs by default: the device never waits for
/// the host between them, and status and the log lag by at most this many steps.
pub const DEFAULT_CUDA_SYNC_EVERY: u64 = 8;

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

pub struct Trainer {
    cfg: RunConfig,
    opts: RunOptions,
    device: Device,
    autocast: bool,
    /// `spec.attention`, `auto` resolved on CUDA ([`crate::kernels::tune::choose_kernels`]).
    attention: Attention,
    vs: VarStore,
    model: Model,
    opt: Optimizer,
    /// The pretraining mix (`None` in phase grpo).
    train: Option<Arc<Mix>>,
    /// Phase grpo's questions, reference model and generated batch.
    grpo: Option<Grpo>,
    /// The last GRPO step's metrics, for its report.
    last_grpo: Option<GrpoStats>,
    /// GRPO steps in a row, up to the last, without learning signal.
    no_signal_steps: u64,
    loader: Option<Loader>,
    /// The epoch each training source is in (for the log line when one wraps).
    source_epochs: Vec<u64>,
    /// One validation mix per source.
    val: Vec<Mix>,
    tokenizer: Tokenizer,
    step: u64,
    tokens: u64,
    /// Where the next step's samples start in the run's sample order (before any a
    /// rollback skips).
    data_position: u64,
    /// The samples of the step in progress (GRPO: of its generated batch).
    window: Option<std::ops::Range<u64>>,
    /// The data position of the newest checkpoint, for a rollback.
    checkpoint_position: u64,
    resumed_from: Option<u64>,
    /// Changes accepted on resume, carried into every checkpoint.
    history: Vec<crate::checkpoint::ConfigChange>,
    /// Test-only fault injection.
    faults: Faults,
    /// The c10d group and gradient reducer when there is more than one rank.
    ddp: Option<(Arc<ProcessGroup>, GradReducer)>,
    /// `parallelism: fsdp`: the parameters, sharded and gathered a unit at a time.
    fsdp: Option<ShardedParams>,
    /// Raised by SIGTERM in this process.
    stop: Arc<AtomicBool>,
    /// Whether any rank asked to stop, as of the last step read back (agreed with the loss).
    stop_agreed: bool,
    /// The number of ranks asking to stop at the last step (several ranks), on the device.
    stop_flags: Option<Tensor>,
    /// Steps queued since the last sync, oldest first.
    pending: Vec<PendingStep>,
    /// A background checkpoint's copy of the parameters and optimizer state, which the
    /// next optimizer step waits for before it changes them.
    snapshot: Option<Snapshot>,
    /// Seconds the step in progress has waited for the data loader.
    data_wait: f64,
    /// The step in progress's marks before the collectives, until it is queued.
    step_timing: Option<timing::StepTiming>,
    /// This rank's step times since the last sync (several ranks).
    rank_totals: timing::RankTotals,
    /// Every rank's step times, gathered at the last sync, until they are reported.
    rank_timings: Option<Vec<crds::contract::RankTiming>>,
    sync_every: u64,
}

impl Trainer {
    /// Builds everything and resumes from the newest valid checkpoint in the output
    /// directory, or loads `initFrom` weights.
    pub fn new(cfg: &RunConfig, opts: RunOptions) -> Result<Trainer, Error> {
        let mut cfg = cfg.clone();
        let p = opts.placement.clone();
        let opts_sync_every = opts.sync_every;
        if p.world_size != cfg.topology.world_size {
            return Err(Error::InvalidSpec(format!(
                "this process is rank {} of {} but spec.topology asks for {} processes",
                p.rank, p.world_size, cfg.topology.world_size
            )));
        }
        let device = match cfg.topology.device {
            RunDevice::Cuda if (p.local_rank as i64) < tch::Cuda::device_count() => Device::Cuda(p.local_rank as usize),
            RunDevice::Cuda if tch::Cuda::is_available() => {
                return Err(Error::InvalidSpec(format!(
                    "local rank {} needs CUDA device {} but only {} are visible",
                    p.local_rank,
                    p.local_rank,
                    tch::Cuda::device_count()
                )));
            }
            RunDevice::Cuda => {
                return Err(Error::InvalidSpec(
                    "spec.topology.gpusPerNode > 0 but no CUDA device is visible (or this trainer was built without the `cuda` feature)".into(),
                ));
            }
            RunDevice::Cpu => Device::Cpu,
        };
        let (kind, autocast, what) = precision_plan(cfg.precision, device);
        let matmuls = matmul_kind(kind, autocast, device)?;
        if p.rank == 0 {
            tracing::info!("precision: {what}; matmuls run in {matmuls:?}");
        }
        // Join first: a rank that cannot meet the others should fail before the slow setup.
        let group = if p.world_size > 1 {
            let timeout = std::time::Duration::from_secs(cfg.topology.collective_timeout_seconds);
            let group = Arc::new(p.join(device, timeout)?);
            if p.rank == 0 {
                tracing::info!(
                    "joined a {:?} group of {} ranks at {}:{}",
                    group.backend(),
                    p.world_size,
                    p.master_addr,
                    p.master_port
                );
            }
            Some(group)
        } else {
            None
        };
        let resume = restore::find_resume(&mut cfg, &opts, group.as_deref())?;
        let cfg = &cfg;

        let b = &cfg.batch;
        let kernels = choose_kernels(
            KernelRequest::auto(cfg.attention),
            &cfg.model,
            b.micro_batch as i64,
            b.seq_len as i64,
            matmuls,
            device,
            group.as_deref(),
        )?;
        if p.rank == 0 {
            kernels.log(b.micro_batch, b.seq_len);
        }
        let attention = kernels.attention;
        let tokenizer = sources::load_tokenizer(cfg)?;
        let train = match cfg.grpo {
            Some(_) => None,
            None => Some(Arc::new(Mix::new(
                sources::source_tokens(cfg, &tokenizer, Split::Train)?,
                cfg.batch.seq_len as usize,
                cfg.seed,
            )?)),
        };
        let eval_every = cfg.data.as_ref().map_or(0, |d| d.eval_every_steps);
        let val = if eval_every > 0 { sources::validation_mixes(cfg, &tokenizer)? } else { Vec::new() };

        let mut vs = VarStore::new(Device::Cpu);
        let mut model = {
            let _rng = GLOBAL_RNG.lock().unwrap_or_else(|e| e.into_inner());
            tch::manual_seed(cfg.seed as i64);
            Model::new(&vs.root(), &cfg.model, device)?
        };
        model.set_attention(attention);
        if kind == Kind::BFloat16 {
            vs.bfloat16();
        }
        vs.set_device(device);
        // Every strategy buckets the same way, a bucket never spanning two of fsdp's
        // units, so each sums every gradient over the ranks in the same order.
        let named = named_in_definition_order(&vs);
        let units: Vec<usize> =
            named.iter().map(|(name, _)| Unit::of(name).backward_index(cfg.model.n_layer as usize)).collect();
        let cap = (cfg.topology.bucket_cap_mb as usize * 1024 * 1024).max(1);
        let opt = match (&group, cfg.parallelism) {
            (Some(group), Parallelism::Zero1 | Parallelism::Zero2 | Parallelism::Fsdp) => {
                let items: Vec<BucketItem> =
                    named.iter().zip(&units).map(|((_, p), &u)| BucketItem::of(p, u)).collect();
                let bucket_of = dist::reducer::assign_buckets(&items, cap);
                let stage = match cfg.parallelism {
                    Parallelism::Zero1 => ZeroStage::One,
                    Parallelism::Zero2 => ZeroStage::Two,
                    _ => ZeroStage::Three,
                };
                Optimizer::Sharded(ShardedAdamW::new(named, &bucket_of, group.clone(), &cfg.optimizer, stage)?)
            }
            _ => Optimizer::Replicated(AdamW::new(sorted_variables(&vs), &cfg.optimizer)?),
        };

        sdp::set_sdp_backend(attention)?;
        let mut trainer = Trainer {
            cfg: cfg.clone(),
            opts,
            device,
            autocast,
            attention,
            vs,
            model,
            opt,
            source_epochs: vec![0; train.as_ref().map_or(0, |t| t.sources().len())],
            train,
            grpo: None,
            last_grpo: None,
            no_signal_steps: 0,
            loader: None,
            val,
            tokenizer,
            step: 0,
            tokens: 0,
            data_position: 0,
            window: None,
            checkpoint_position: 0,
            resumed_from: None,
            history: Vec::new(),
            faults: Faults::from_env(p.rank, cfg.attempt),
            ddp: None,
            fsdp: None,
            stop: Arc::new(AtomicBool::new(false)),
            stop_agreed: false,
            stop_flags: None,
            pending: Vec::new(),
            snapshot: None,
            data_wait: 0.0,
            step_timing: None,
            rank_totals: timing::RankTotals::default(),
            rank_timings: None,
            sync_every: match (cfg.grpo.is_some(), opts_sync_every) {
                // A GRPO step reads its rewards on the host anyway.
                (true, _) => 1,
                (false, Some(n)) => n.max(1),
                (false, None) if device.is_cuda() => DEFAULT_CUDA_SYNC_EVERY,
                (false, None) => 1,
            },
        };
        trainer.check_attention(matmuls)?;
        let loaded = trainer.restore(resume)?;
        if let Some(t) = &trainer.train {
            trainer.source_epochs = trainer.epochs(&t.counts_at(trainer.data_position));
        }
        if let Some(g) = &cfg.grpo {
            let questions = crate::grpo::data::load(cfg, g)?;
            if p.rank == 0 {
                tracing::info!(
                    "GRPO: {} training questions, {} held out",
                    questions.train.len(),
                    questions.held_out.records.len()
                );
            }
            let reference = if g.beta > 0.0 { Some(trainer.reference_model(kind)?) } else { None };
            trainer.grpo = Some(Grpo::new(cfg, questions, reference)?);
        }
        if let Some(group) = group {
            // Definition order: the reducer buckets it in reverse, as backward runs.
            let params = trainer.vs.trainable_variables();
            if let Some(origin) = loaded {
                dist::check_parameters_agree(&group, &params, &origin)?;
            }
            dist::broadcast_parameters(&group, &params)?;
            let reducer = match trainer.opt.gradient_reducer()? {
                Some(scattering) => scattering,
                None => GradReducer::new(group.clone(), &params, &units, cap)?,
            };
            if trainer.opts.placement.rank == 0 {
                tracing::info!(
                    "data parallel: {} ranks, {} gradient buckets of up to {} MiB",
                    group.world_size(),
                    reducer.n_buckets(),
                    trainer.cfg.topology.bucket_cap_mb
                );
            }
            if let Some((layout, shards)) = trainer.opt.fsdp_shards() {
                // After the reducer, whose hooks capture the parameters' whole shapes.
                let params = named_in_definition_order(&trainer.vs);
                trainer.fsdp = Some(ShardedParams::new(group.clone(), params, &units, layout, shards)?);
            }
            trainer.ddp = Some((group, reducer));
        }
        Ok(trainer)
    }

    /// The resolved run this trainer executes.
    pub fn config(&self) -> &RunConfig {
        &self.cfg
    }

    pub fn options(&self) -> &RunOptions {
        &self.opts
    }

    /// Optimizer steps done (the checkpoint's step after a resume).
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Tokens trained on, all ranks together.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    fn rank0(&self) -> bool {
        self.opts.placement.rank == 0
    }

    /// Logs the SDPA backend libtorch picks for the run's shapes with activations of
    /// `kind`, and fails when a forced `spec.attention` backend cannot run them.
    fn check_attention(&self, kind: Kind) -> Result<(), Error> {
        let b = &self.cfg.batch;
        let backend = sdp::attention_backend(
            &self.cfg.model,
            self.attention,
            b.micro_batch as i64,
            b.seq_len as i64,
            kind,
            self.device,
        )?;
        if self.rank0() && (self.device.is_cuda() || self.attention != Attention::Auto) {
            tracing::info!("attention: SDPA runs the {backend:?} backend in {kind:?}");
        }
        Ok(())
    }

    /// About how many bytes one checkpoint takes: the weights in their kind and the
    /// whole (consolidated) optimizer state.
    fn checkpoint_estimate(&self) -> u64 {
        let weight_bytes = self.vs.trainable_variables().first().map_or(4, |t| t.kind().elt_size_in_bytes()) as u64;
        let optimizer = match &self.opt {
            Optimizer::Sharded(o) => o.state_bytes() * self.cfg.topology.world_size as usize,
            Optimizer::Replicated(o) => o.state_bytes(),
        };
        self.cfg.params.total * weight_bytes + optimizer as u64
    }

    fn checkpoint_dir(&self) -> &Path {
        &self.opts.output_dir
    }

    /// Trains to the budget (or `stop_after_steps`), checkpointing on schedule, at the
    /// end and on SIGTERM.
    pub fn run(mut self, stop: Arc<AtomicBool>, sinks: &mut Sinks) -> Result<Outcome, Error> {
        let rank0 = self.rank0();
        self.stop = stop;
        let total_steps = self.cfg.schedule.total_steps;
        let mut last_step = self.opts.stop_after_steps.map_or(total_steps, |s| s.min(total_steps));
        if let Some(g) = &self.grpo {
            // A generated batch is never split by a stop: resuming must regenerate it.
            last_step = g.boundary_at_or_after(last_step).min(total_steps);
        }
        let mut checkpointer = Checkpointer::new(self.checkpoint_dir(), self.cfg.checkpoint.keep_last)?
            .keeping_best(self.cfg.checkpoint.keep_best);
        if rank0 {
            // A run that cannot keep its checkpoints fails now, not after an interval of training.
            checkpoint::space::preflight(
                self.checkpoint_dir(),
                self.cfg.checkpoint.keep_last,
                self.cfg.checkpoint.keep_best,
                self.checkpoint_estimate(),
            )
            .map_err(|e| self.failed(sinks, e))?;
        }
        let mirror = match &self.cfg.checkpoint.s3 {
            Some(s3) if rank0 => Some(Mirror::start(s3)?),
            _ => None,
        };
        let unigram_entropy = match &self.train {
            Some(t) => Some(t.unigram_entropy()?),
            None => None,
        };
        let data = match (unigram_entropy, &self.grpo) {
            (Some(h), _) => format!("unigram entropy of the data {h:.3} nats/token"),
            (None, Some(g)) => format!("GRPO on {} questions", g.questions().train.len()),
            (None, None) => String::new(),
        };
        sinks.emit(Event::Started(RunStart { step: self.step, tokens: self.tokens, cfg: &self.cfg, data: &data }))?;
        // GRPO measures the policy it starts from, to compare with the one it ends with.
        let initial = if self.step == 0 { self.report_accuracy(sinks, true)? } else { Vec::new() };
        sinks.emit(Event::Phase(TrainerPhase::Training))?;
        let mut losses = Vec::new();
        let mut val_loss = None;
        let mut evaluated_at = None;
        if rank0
            && self.cfg.checkpoint.keep_best > 0
            && let Some(best) = checkpoint::best(self.checkpoint_dir())
        {
            sinks.emit(Event::Best(&best))?;
        }
        let mut last_checkpoint = None;
        let mut last_loss = None;
        let every = self.cfg.checkpoint.every_steps as u64;
        let eval_every = self.cfg.data.as_ref().map_or(0, |d| d.eval_every_steps) as u64;
        loop {
            let more = self.step < last_step && !self.may_stop();
            if !more && self.pending.is_empty() {
                break;
            }
            if more && let Err(e) = self.launch_step() {
                return Err(self.failed(sinks, e.at_step(self.step + 1)));
            }
            let eval_due = eval_every > 0 && (self.step.is_multiple_of(eval_every) || self.step == total_steps);
            let checkpoint_due = every > 0 && self.step.is_multiple_of(every);
            // Every rank reads back at the same steps; one rank alone may read early
            // to stop sooner.
            let sync_due = !more
                || self.pending.len() as u64 >= self.sync_every
                || self.step == last_step
                || eval_due
                || checkpoint_due
                || (self.ddp.is_none() && self.stopping());
            if !sync_due {
                continue;
            }
            let reports = match self.sync() {
                Ok(reports) => reports,
                Err(e) => return Err(self.failed(sinks, e)),
            };
            for report in reports {
                losses.push((report.step, report.loss));
                last_loss = Some(report.loss);
                sinks.emit(Event::Step(&report))?;
            }
            if let Some(ranks) = self.rank_timings.take() {
                sinks.emit(Event::Ranks(&ranks))?;
            }
            if eval_due {
                sinks.emit(Event::Phase(TrainerPhase::Evaluating))?;
                if let Some((v, per_source)) = self.whole_model(|t| t.evaluate())? {
                    (val_loss, evaluated_at) = (Some(v), Some(self.step));
                    let (step, tokens) = (self.step, self.tokens);
                    sinks.emit(Event::Eval { step, tokens, val_loss: v, per_source: &per_source })?;
                }
                sinks.emit(Event::Phase(TrainerPhase::Training))?;
            }
            let stopping = self.step == last_step || self.may_stop();
            if checkpoint_due && !stopping {
                self.checkpoint_position = self.data_position;
                let (model, optimizer) = (self.checkpoint_model()?, self.opt.checkpoint_state()?);
                // Training goes on while the background thread writes.
                let here = val_loss.filter(|_| evaluated_at == Some(self.step));
                let payload = self.payload(model, last_loss, here, optimizer);
                let saved = match self.faults.before_checkpoint(self.step, self.checkpoint_dir()) {
                    Err(e) => Err(checkpoint::space::explain(e, self.checkpoint_dir(), self.checkpoint_estimate())),
                    Ok(()) if rank0 => checkpointer.save_async(payload).map(|(previous, snapshot)| {
                        self.snapshot = Some(snapshot);
                        previous
                    }),
                    Ok(()) => Ok(None),
                };
                if let Some(done) = saved.map_err(|e| self.failed(sinks, e.at_step(self.step)))? {
                    self.checkpoint_written(&done, sinks, mirror.as_ref())?;
                    last_checkpoint = Some(done);
                }
                self.barrier()?;
            }
        }
        // A sharded optimizer's state (and fsdp's parameters) are gathered by every
        // rank, whether rank 0 then writes them or already has.
        let last = if self.step > 0 { Some((self.checkpoint_model()?, self.opt.checkpoint_state()?)) } else { None };
        if rank0 {
            if let Some(done) = checkpointer.wait().map_err(|e| self.failed(sinks, e.at_step(self.step)))? {
                self.checkpoint_written(&done, sinks, mirror.as_ref())?;
                last_checkpoint = Some(done);
            }
            if let Some((model, optimizer)) = last
                && last_checkpoint.as_ref().map(|c| c.step) != Some(self.step)
            {
                sinks.emit(Event::Phase(TrainerPhase::Checkpointing))?;
                let here = val_loss.filter(|_| evaluated_at == Some(self.step));
                let done = checkpointer
                    .save(self.payload(model, last_loss, here, optimizer))
                    .map_err(|e| self.failed(sinks, e.at_step(self.step)))?;
                self.checkpoint_written(&done, sinks, mirror.as_ref())?;
                last_checkpoint = Some(done);
            }
        }
        // Nobody leaves before rank 0's last checkpoint is on disk.
        self.barrier()?;
        if let Some(m) = mirror {
            // The last checkpoint must reach S3 before the run reports success.
            m.finish()?;
        }
        let interrupted = self.may_stop() && self.step < last_step;
        let accuracy = if interrupted || self.step < total_steps {
            Vec::new()
        } else {
            evaluate::SetChange::pair(initial, self.report_accuracy(sinks, false)?)
        };
        if self.opts.sample && !interrupted {
            // Every rank gathers fsdp's parameters; rank 0 samples.
            if let Some((prompt, text)) = self.whole_model(|t| if rank0 { t.sample().map(Some) } else { Ok(None) })? {
                let (step, tokens) = (self.step, self.tokens);
                sinks.emit(Event::Sample { step, tokens, prompt: &prompt, text: &text })?;
            }
        }
        sinks.finish();
        if interrupted {
            return Err(Error::Terminated { step: self.step });
        }
        sinks.emit(Event::Phase(TrainerPhase::Done))?;
        Ok(Outcome {
            step: self.step,
            tokens: self.tokens,
            losses,
            val_loss,
            last_checkpoint,
            unigram_entropy,
            accuracy,
            resumed_from: self.resumed_from,
            no_signal_steps: self.grpo.as_ref().map(|_| self.no_signal_steps),
        })
    }

    /// Whether to stop now: [`Self::stopping`], and for GRPO only between generated batches.
    fn may_stop(&self) -> bool {
        self.stopping() && self.grpo.as_ref().is_none_or(|g| g.at_boundary(self.step))
    }

    /// Whether to stop: SIGTERM here, or (with several ranks) on any rank, as agreed
    /// at the last step so that every rank stops after the same step.
    fn stopping(&self) -> bool {
        if self.ddp.is_some() { self.stop_agreed } else { self.stop.load(Ordering::SeqCst) }
    }

    /// Records a failure's reason before it is returned.
    fn failed(&self, sinks: &mut Sinks, e: Error) -> Error {
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
        if let Some(p) = &mut self.fsdp {
            p.gather_all()?;
        }
        let out = f(self);
        if let Some(p) = &mut self.fsdp {
            p.release_all()?;
        }
        out
    }

    /// The parameters for a checkpoint, by name: copies gathered from every rank under
    /// fsdp (every rank calls this), the variables themselves otherwise.
    fn checkpoint_model(&mut self) -> Result<Vec<(String, Tensor)>, Error> {
        match &mut self.fsdp {
            Some(p) => p.full_parameters(),
            None => Ok(sorted_variables(&self.vs)),
        }
    }

    fn barrier(&self) -> Result<(), Error> {
        self.ddp.as_ref().map_or(Ok(()), |(group, _)| group.barrier())
    }

    fn checkpoint_written(
        &self,
        done: &CheckpointRef,
        sinks: &mut Sinks,
        mirror: Option<&Mirror>,
    ) -> Result<(), Error> {
        if let Some(m) = mirror {
            m.push(Path::new(&done.uri));
        }
        sinks.emit(Event::Checkpoint(done))?;
        if self.cfg.checkpoint.keep_best == 0 {
            return Ok(());
        }
        match checkpoint::best(self.checkpoint_dir()) {
            Some(best) => sinks.emit(Event::Best(&best)),
            None => Ok(()),
        }
    }
}
