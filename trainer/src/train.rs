//! The training loop of one process: data, forward/backward with accumulation,
//! clipping, fused AdamW, evaluation, checkpoints, status and the failure contract.
//! Rank 0 alone logs, serves status and writes checkpoints.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crds::config::{Device as RunDevice, Location, ResolvedInit, ResolvedSource, RunConfig};
use crds::contract::TrainerPhase;
use crds::presets::H100_PEAK_BF16_FLOPS;
use crds::types::{Attention, CheckpointRef, Precision};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::Error;
use crate::checkpoint::{self, Checkpointer, Payload, TrainState};
use crate::data::corpus::{self, Split};
use crate::data::loader::{BatchPlan, Loader};
use crate::data::mix::{self, Mix, SourceTokens, Tokens};
use crate::data::remote::RemoteShards;
use crate::data::shard::{MANIFEST, Manifest, ShardEntry, ShardSet};
use crate::data::tokenizer::Tokenizer;
use crate::dist::{self, GradReducer, Placement, ProcessGroup, ReduceOp};
use crate::fused::{Kernels, Op};
use crate::generate::{self, Sampling};
use crate::grpo::eval::{EvalOptions, McqScore};
use crate::grpo::step::{Grpo, GrpoStats, StepContext, Sums};
use crate::metrics_log::MetricsLog;
use crate::mirror::{self, Mirror};
use crate::model::Model;
use crate::optim::{self, AdamW};
use crate::progress::Progress;
use crate::status::{SharedStatus, StatusServer, StepReport};
use crate::storage::{self, S3, S3Options};
use crate::trials::Choice;

/// Test-only fault injection: the loss of this optimizer step becomes NaN.
pub const INJECT_NAN_ENV: &str = "TRAINER_INJECT_NAN_AT_STEP";
/// Test-only fault injection: this step allocates far more memory than exists.
pub const INJECT_OOM_ENV: &str = "TRAINER_INJECT_OOM_AT_STEP";
/// Test-only fault injection: the process SIGKILLs itself at this step.
pub const INJECT_KILL_ENV: &str = "TRAINER_INJECT_KILL_AT_STEP";
/// Test-only: the injections above apply only to this global rank (default: all).
pub const INJECT_RANK_ENV: &str = "TRAINER_INJECT_RANK";

/// libtorch's default RNG is process-global: whoever seeds it and then draws (model
/// init) holds this lock, so two trainers (or tests) in one process cannot interleave.
pub static GLOBAL_RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Embedded sources never need more than this many tokens each; longer runs repeat epochs.
const MAX_EMBEDDED_TOKENS: usize = 16_000_000;

/// Validation loss: the mix-weighted mean and (source, loss) per source.
pub type Evaluation = (f64, Vec<(String, f64)>);

/// How one process takes part in the run, and where it writes.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Checkpoints and `metrics.jsonl`.
    pub output_dir: PathBuf,
    /// Where rank 0 serves `/status`, `/metrics` and `/healthz`; `None` serves nothing.
    pub status_addr: Option<SocketAddr>,
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

/// An optimizer step queued on the device whose results are not read yet.
struct PendingStep {
    step: u64,
    tokens: u64,
    lr: f64,
    /// [loss, pre-clip gradient norm, ranks asking to stop] (f32, on the device).
    values: Tensor,
    grpo: Option<GrpoStats>,
    started: Instant,
}

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
    /// GRPO: held-out accuracy before and after this run's training (the first when
    /// the run started from step 0).
    pub accuracy: Option<(Option<McqScore>, McqScore)>,
    /// Step the run resumed from, if it did.
    pub resumed_from: Option<u64>,
}

/// The device and dtype a precision runs with, and a plain description.
pub fn precision_plan(precision: Precision, device: Device) -> (Kind, bool, &'static str) {
    match (precision, device.is_cuda()) {
        (Precision::F32, _) => (Kind::Float, false, "f32"),
        (Precision::Bf16, _) => (Kind::BFloat16, false, "bf16 weights, gradients and optimizer state"),
        (Precision::Bf16Mixed, true) => (Kind::Float, true, "f32 master weights, bf16 autocast"),
        (Precision::Bf16Mixed, false) => (
            Kind::Float,
            false,
            "f32 (bf16-mixed autocasts on CUDA only: bf16 matmuls are slower than f32 on most CPUs)",
        ),
    }
}

/// The dtype the model's matmuls run in on `device`: the weights' `kind`, or what
/// autocast casts them to. Read from a probe matmul, so logs and benchmarks report what
/// libtorch does, and a `bf16-mixed` that would not run bf16 is an error.
pub fn matmul_kind(kind: Kind, autocast: bool, device: Device) -> Result<Kind, Error> {
    let a = Tensor::f_ones([2, 2], (kind, device))?;
    let got = crate::ffi::autocast(device, autocast, || a.f_matmul(&a))?.kind();
    if autocast && got != Kind::BFloat16 {
        return Err(Error::Shim(format!("bf16 autocast on {device:?} ran a probe matmul in {got:?}")));
    }
    Ok(got)
}

pub struct Trainer {
    cfg: RunConfig,
    opts: RunOptions,
    device: Device,
    autocast: bool,
    /// `spec.attention`, `auto` resolved on CUDA ([`choose_kernels`]).
    attention: Attention,
    vs: VarStore,
    model: Model,
    opt: AdamW,
    /// The pretraining mix (`None` in phase grpo).
    train: Option<Arc<Mix>>,
    /// Phase grpo's questions, reference model and generated batch.
    grpo: Option<Grpo>,
    /// The last GRPO step's metrics, for its report.
    last_grpo: Option<GrpoStats>,
    loader: Option<Loader>,
    /// The epoch each training source is in (for the log line when one wraps).
    source_epochs: Vec<u64>,
    /// One validation mix per source.
    val: Vec<Mix>,
    tokenizer: Tokenizer,
    step: u64,
    tokens: u64,
    data_position: u64,
    resumed_from: Option<u64>,
    status: SharedStatus,
    inject_nan: Option<u64>,
    inject_oom: Option<u64>,
    inject_kill: Option<u64>,
    /// The c10d group and gradient reducer when there is more than one rank.
    ddp: Option<(Arc<ProcessGroup>, GradReducer)>,
    /// Raised by SIGTERM in this process.
    stop: Arc<AtomicBool>,
    /// Whether any rank asked to stop, as of the last step read back (agreed with the loss).
    stop_agreed: bool,
    /// The number of ranks asking to stop at the last step (several ranks), on the device.
    stop_flags: Option<Tensor>,
    /// Steps queued since the last sync, oldest first.
    pending: Vec<PendingStep>,
    sync_every: u64,
}

impl Trainer {
    /// Builds everything and resumes from the newest valid checkpoint in the output
    /// directory, or loads `initFrom` weights.
    pub fn new(cfg: &RunConfig, opts: RunOptions, status: SharedStatus) -> Result<Trainer, Error> {
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
        let tokenizer = load_tokenizer(cfg)?;
        let train = match cfg.grpo {
            Some(_) => None,
            None => Some(Arc::new(Mix::new(
                source_tokens(cfg, &tokenizer, Split::Train)?,
                cfg.batch.seq_len as usize,
                cfg.seed,
            )?)),
        };
        let eval_every = cfg.data.as_ref().map_or(0, |d| d.eval_every_steps);
        let val = if eval_every > 0 { validation_mixes(cfg, &tokenizer)? } else { Vec::new() };

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
        let opt = AdamW::new(sorted_variables(&vs), &cfg.optimizer)?;

        optim::set_sdp_backend(attention)?;
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
            loader: None,
            val,
            tokenizer,
            step: 0,
            tokens: 0,
            data_position: 0,
            resumed_from: None,
            status,
            inject_nan: injected(INJECT_NAN_ENV, p.rank),
            inject_oom: injected(INJECT_OOM_ENV, p.rank),
            inject_kill: injected(INJECT_KILL_ENV, p.rank),
            ddp: None,
            stop: Arc::new(AtomicBool::new(false)),
            stop_agreed: false,
            stop_flags: None,
            pending: Vec::new(),
            sync_every: match (cfg.grpo.is_some(), opts_sync_every) {
                // A GRPO step reads its rewards on the host anyway.
                (true, _) => 1,
                (false, Some(n)) => n.max(1),
                (false, None) if device.is_cuda() => DEFAULT_CUDA_SYNC_EVERY,
                (false, None) => 1,
            },
        };
        trainer.check_attention(matmuls)?;
        let loaded = trainer.restore(group.as_deref())?;
        if let Some(t) = &trainer.train {
            trainer.source_epochs = trainer.epochs(&t.counts_at(trainer.data_position));
        }
        if let Some(g) = &cfg.grpo {
            let questions = crate::grpo::data::load(cfg, g)?;
            if p.rank == 0 {
                tracing::info!(
                    "GRPO: {} training questions, {} held out",
                    questions.train.len(),
                    questions.held_out.len()
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
            let cap = trainer.cfg.topology.bucket_cap_mb as usize * 1024 * 1024;
            let reducer = GradReducer::new(group.clone(), &params, cap)?;
            if trainer.opts.placement.rank == 0 {
                tracing::info!(
                    "data parallel: {} ranks, {} gradient buckets of up to {} MiB",
                    group.world_size(),
                    reducer.n_buckets(),
                    trainer.cfg.topology.bucket_cap_mb
                );
            }
            trainer.ddp = Some((group, reducer));
        }
        Ok(trainer)
    }

    fn rank0(&self) -> bool {
        self.opts.placement.rank == 0
    }

    /// Logs the SDPA backend libtorch picks for the run's shapes with activations of
    /// `kind`, and fails when a forced `spec.attention` backend cannot run them.
    fn check_attention(&self, kind: Kind) -> Result<(), Error> {
        let b = &self.cfg.batch;
        let backend = attention_backend(
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

    fn checkpoint_dir(&self) -> &Path {
        &self.opts.output_dir
    }

    /// Resumes or loads initial weights; returns where weights came from, if anywhere.
    fn restore(&mut self, group: Option<&ProcessGroup>) -> Result<Option<String>, Error> {
        let mut found = checkpoint::latest_valid(self.checkpoint_dir())?;
        if found.is_none()
            && let Some(s3) = &self.cfg.checkpoint.s3
        {
            // An empty checkpoint directory (a new PVC) resumes from the S3 mirror.
            if self.rank0() {
                std::fs::create_dir_all(self.checkpoint_dir()).map_err(crate::io_err(self.checkpoint_dir()))?;
                if let Some(step) = mirror::restore(s3, self.checkpoint_dir())? {
                    tracing::info!("the checkpoint directory was empty: resuming from the S3 mirror's step {step}");
                }
            }
            if let Some(g) = group {
                g.barrier()?;
            }
            found = checkpoint::latest_valid(self.checkpoint_dir())?;
        }
        if let Some(loaded) = found {
            let fingerprint = resume_fingerprint(&self.cfg);
            if loaded.state.config_hash != fingerprint
                && !loaded.state.config_hash.contains("-corpus")
                && fingerprint.contains("-corpus")
            {
                return Err(Error::IncompatibleCheckpoint {
                    step: loaded.state.step,
                    message: format!(
                        "{} was trained on an older embedded corpus (this trainer's is version {}); \
                         remove the directory (or pass another --output) to train again",
                        loaded.dir.display(),
                        corpus::CORPUS_VERSION
                    ),
                });
            }
            checkpoint::check_resumable(&loaded.state, &self.cfg, &fingerprint)?;
            copy_weights(&self.vs, &loaded.model, &loaded.dir)?;
            self.opt.load_state(&loaded.optimizer)?;
            self.step = loaded.state.step;
            self.tokens = loaded.state.tokens;
            self.data_position = loaded.state.data_position;
            self.resumed_from = Some(self.step);
            if self.rank0() {
                tracing::info!("resuming from {} at step {} ({} tokens)", loaded.dir.display(), self.step, self.tokens);
            }
            return Ok(Some(loaded.dir.display().to_string()));
        }
        let Some(source) = self.init_source()? else { return Ok(None) };
        let weights = checkpoint::load_weights(&source)?;
        copy_weights(&self.vs, &weights, &source)?;
        if self.rank0() {
            tracing::info!("initial weights from {}", source.display());
        }
        Ok(Some(source.display().to_string()))
    }

    /// Where `spec.initFrom`'s weights are on this machine.
    fn init_source(&self) -> Result<Option<PathBuf>, Error> {
        let source = match &self.cfg.init_from {
            None => return Ok(None),
            Some(ResolvedInit::TrainingRun { name }) => self.opts.init_dir.join(name),
            Some(ResolvedInit::Checkpoint { location: Location::Path { path }, .. }) => PathBuf::from(path),
            Some(ResolvedInit::Checkpoint { location: Location::Pvc { path, .. }, .. }) => {
                self.opts.init_dir.join(path)
            }
            Some(ResolvedInit::Checkpoint { uri, .. }) => {
                return Err(Error::Data {
                    name: "spec.initFrom.uri".into(),
                    message: format!("{uri}: this build reads initial weights from a path or a PVC only"),
                });
            }
        };
        Ok(Some(source))
    }

    /// GRPO's frozen reference policy: `spec.initFrom`'s weights, whatever the policy
    /// resumed from.
    fn reference_model(&self, kind: Kind) -> Result<(VarStore, Model), Error> {
        let source =
            self.init_source()?.ok_or_else(|| Error::InvalidSpec("spec.initFrom is required for phase grpo".into()))?;
        let mut vs = VarStore::new(Device::Cpu);
        let mut model = {
            let _rng = GLOBAL_RNG.lock().unwrap_or_else(|e| e.into_inner());
            Model::new(&vs.root(), &self.cfg.model, self.device)?
        };
        model.set_attention(self.attention);
        copy_weights(&vs, &checkpoint::load_weights(&source)?, &source)?;
        if kind == Kind::BFloat16 {
            vs.bfloat16();
        }
        vs.set_device(self.device);
        vs.freeze();
        Ok((vs, model))
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
        if self.loader.is_none() {
            let depth = 2 * self.cfg.batch.grad_accum as usize;
            let train = self
                .train
                .clone()
                .ok_or_else(|| Error::InvalidSpec("spec.data: pretraining needs a data mix".into()))?;
            self.loader = Some(Loader::start(train, self.batch_plan(), self.data_position, self.device, depth)?);
        }
        let b = self.loader.as_mut().expect("started above").next(self.data_position, m)?;
        // From pinned memory the copies run asynchronously with respect to the host.
        let to = |t: &Tensor| t.f_to_device_(self.device, Kind::Int64, self.device.is_cuda(), false);
        Ok((to(&b.inputs)?, to(&b.targets)?))
    }

    /// The epoch of each source after it gave `counts` samples.
    fn epochs(&self, counts: &[u64]) -> Vec<u64> {
        let Some(train) = &self.train else { return Vec::new() };
        counts.iter().enumerate().map(|(s, &k)| if k == 0 { 0 } else { train.epoch_of(s, k - 1) }).collect()
    }

    /// Tokens each source has given, and logs (rank 0) a source starting a new epoch.
    fn track_sources(&mut self) {
        let Some(train) = self.train.clone() else { return };
        let counts = train.counts_at(self.data_position);
        let seq = self.cfg.batch.seq_len as u64;
        for (s, epoch) in self.epochs(&counts).into_iter().enumerate() {
            if epoch > self.source_epochs[s] {
                self.source_epochs[s] = epoch;
                if self.rank0() {
                    tracing::info!(
                        source = %train.sources()[s].name,
                        epoch = epoch + 1,
                        samples_per_epoch = train.windows()[s],
                        "data source ran out; starting a new epoch in a new order"
                    );
                }
            }
        }
        let names = train.sources().iter().map(|s| s.name.clone());
        self.status.record_source_tokens(names.zip(counts.iter().map(|c| c * seq)));
    }

    /// The forward and backward passes of one optimizer step over `grad_accum`
    /// micro-batches: leaves every parameter's gradient averaged over micro-batches
    /// and ranks, and returns this step's mean loss over all ranks (0-dim, f32, on
    /// the device). With several ranks it also agrees on whether any wants to stop.
    pub fn compute_gradients(&mut self) -> Result<Tensor, Error> {
        let step = self.step + 1;
        let accum = self.cfg.batch.grad_accum;
        if self.inject_oom == Some(step) {
            // A real allocation failure through libtorch's allocator.
            let _ = Tensor::f_empty([1 << 40], (Kind::Float, self.device))?;
        }
        if self.inject_kill == Some(step) {
            tracing::warn!(rank = self.opts.placement.rank, "{INJECT_KILL_ENV}: killing this process");
            // SAFETY: raise(3) on this process; SIGKILL cannot be caught.
            unsafe { libc::raise(libc::SIGKILL) };
        }
        // An injected NaN enters through the loss scale, so every gradient is NaN.
        let nan = self.inject_nan == Some(step);
        let (loss, grpo) = if self.grpo.is_some() {
            let (loss, sums, sampling, training) = self.grpo_gradients(step, if nan { f64::NAN } else { 1.0 })?;
            (loss, Some((sums, sampling, training)))
        } else {
            (self.pretrain_gradients(if nan { f64::NAN } else { 1.0 / accum as f64 })?, None)
        };
        let Some((group, reducer)) = &self.ddp else {
            self.last_grpo = grpo.map(|(sums, s, t)| GrpoStats::from_sums(&sums, s, t));
            return Ok(loss);
        };
        reducer.finish()?;
        // The loss is averaged for reporting, and the stop flags and GRPO's sums ride along.
        let stop = if self.stop.load(Ordering::SeqCst) { 1.0 } else { 0.0 };
        let mut head =
            vec![loss.f_div_scalar(group.world_size() as f64)?, Tensor::f_full([], stop, (Kind::Float, self.device))?];
        if let Some((sums, _, _)) = &grpo {
            head.push(Tensor::f_from_slice(&sums.to_vec())?.f_to_kind(Kind::Float)?.f_to_device(self.device)?);
        }
        let stats = Tensor::f_cat(&head.iter().map(|t| t.f_reshape([-1])).collect::<Result<Vec<_>, _>>()?, 0)?;
        group.allreduce(&stats, ReduceOp::Sum)?.wait()?;
        // Read at the next sync, with the loss.
        self.stop_flags = Some(stats.f_get(1)?);
        if let Some((_, sampling, training)) = grpo {
            let all = Vec::<f64>::try_from(
                stats.f_narrow(0, 2, Sums::LEN as i64)?.f_to_kind(Kind::Double)?.f_to_device(Device::Cpu)?,
            )?;
            self.last_grpo = Some(GrpoStats::from_sums(&Sums::from_slice(&all), sampling, training));
        }
        Ok(stats.f_get(0)?)
    }

    /// GRPO's step on this rank: this rank's loss, metric sums, and sampling and
    /// training seconds.
    fn grpo_gradients(&mut self, step: u64, scale: f64) -> Result<(Tensor, Sums, f64, f64), Error> {
        let mut grpo = self.grpo.take().expect("phase grpo");
        let ctx = StepContext {
            model: &self.model,
            tokenizer: &self.tokenizer,
            device: self.device,
            autocast: self.autocast,
            rank: self.opts.placement.rank,
            world_size: self.cfg.topology.world_size,
            group: self.ddp.as_ref().map(|(g, _)| g.as_ref()),
            reducer: self.ddp.as_ref().map(|(_, r)| r),
            step,
            scale,
        };
        let out = grpo.gradients(&ctx);
        self.grpo = Some(grpo);
        out
    }

    /// Pretraining's forward and backward passes over this rank's micro-batches, with
    /// the loss scaled by `scale`; returns this rank's mean loss.
    fn pretrain_gradients(&mut self, scale: f64) -> Result<Tensor, Error> {
        let accum = self.cfg.batch.grad_accum;
        let mut loss_sum = Tensor::f_zeros([], (Kind::Float, self.device))?;
        for m in 0..accum {
            if m + 1 == accum
                && let Some((_, reducer)) = &self.ddp
            {
                reducer.prepare()?;
            }
            let (x, y) = self.micro_batch(m)?;
            let recompute = self.cfg.recomputed_blocks() as usize;
            let loss = crate::ffi::autocast(self.device, self.autocast, || {
                self.model.backward_checkpointed(&x, &y, scale, self.model.loss_chunk(), recompute)
            })?;
            loss_sum = loss_sum.f_add(&loss)?;
        }
        Ok(loss_sum.f_div_scalar(accum as f64)?)
    }

    /// Every parameter's gradient by name (copies), as [`Self::compute_gradients`] left them.
    pub fn gradients(&self) -> Result<Vec<(String, Tensor)>, Error> {
        sorted_variables(&self.vs).into_iter().map(|(name, p)| Ok((name, p.f_grad()?.f_detach_copy()?))).collect()
    }

    /// Every parameter by name, in checkpoint order.
    pub fn parameters(&self) -> Vec<(String, Tensor)> {
        sorted_variables(&self.vs)
    }

    /// One optimizer step over `grad_accum` micro-batches, read back from the device.
    pub fn train_step(&mut self) -> Result<StepReport, Error> {
        self.launch_step()?;
        Ok(self.sync()?.pop().expect("a step was queued"))
    }

    /// Queues one optimizer step without waiting for the device. Clipping, the
    /// non-finite check and the skip of a non-finite update all happen on the
    /// device; [`Self::sync`] reads the results.
    fn launch_step(&mut self) -> Result<(), Error> {
        let started = Instant::now();
        let step = self.step + 1;
        let lr = self.cfg.schedule.lr_at(self.tokens);
        let loss = self.compute_gradients()?;
        let (grad_norm, _skipped) =
            self.opt.clip_and_step(&loss, self.cfg.optimizer.grad_clip, optim::Lr::Value(lr))?;
        self.opt.zero_grad()?;
        let stop = match self.stop_flags.take() {
            Some(flags) => flags,
            None => Tensor::f_zeros([], (Kind::Float, self.device))?,
        };
        let values = Tensor::f_stack(&[loss.f_to_kind(Kind::Float)?, grad_norm.f_to_device(self.device)?, stop], 0)?;
        self.step = step;
        self.tokens += self.cfg.batch.tokens_per_step;
        self.data_position = match &self.grpo {
            Some(g) => g.prompts_consumed(step),
            None => self.data_position + self.cfg.batch.global_sequences,
        };
        self.track_sources();
        self.pending.push(PendingStep { step, tokens: self.tokens, lr, values, grpo: self.last_grpo.take(), started });
        Ok(())
    }

    /// Waits for the queued steps and reads their losses and gradient norms in one
    /// transfer. Fails at the first step whose loss or norm is not finite (the
    /// device skipped its update). Throughput is the average over the queued steps.
    fn sync(&mut self) -> Result<Vec<StepReport>, Error> {
        let pending = std::mem::take(&mut self.pending);
        let Some(first) = pending.first() else { return Ok(Vec::new()) };
        let (first_step, started) = (first.step, first.started);
        let read = || -> Result<Vec<f64>, Error> {
            let all = Tensor::f_stack(&pending.iter().map(|p| p.values.shallow_clone()).collect::<Vec<_>>(), 0)?;
            Ok(Vec::<f64>::try_from(all.f_to_kind(Kind::Double)?.f_to_device(Device::Cpu)?.f_reshape([-1])?)?)
        };
        let values = read().map_err(|e| e.at_step(first_step))?;
        let seconds = started.elapsed().as_secs_f64();
        let tokens_per_second = (pending.len() as u64 * self.cfg.batch.tokens_per_step) as f64 / seconds;
        let mfu = self.device.is_cuda().then(|| {
            let per_gpu = tokens_per_second / self.cfg.topology.world_size as f64;
            self.cfg.model.mfu(self.cfg.batch.seq_len, per_gpu, H100_PEAK_BF16_FLOPS)
        });
        let gpu_memory = crate::ffi::device_memory(self.device)?
            .map(|m| crate::status::GpuMemory { peak_bytes: m.peak_allocated, total_bytes: m.total });
        let mut reports = Vec::with_capacity(pending.len());
        for (p, v) in pending.into_iter().zip(values.chunks(3)) {
            let (loss, grad_norm) = (v[0], v[1]);
            if !loss.is_finite() || !grad_norm.is_finite() {
                self.status.record_nonfinite();
                return Err(Error::NonFinite { step: p.step, loss, grad_norm });
            }
            if self.ddp.is_some() {
                self.stop_agreed = v[2] > 0.0;
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
            });
        }
        Ok(reports)
    }

    /// Validation loss per source over `evalTokens`, and their mix-weighted mean.
    pub fn evaluate(&self) -> Result<Option<Evaluation>, Error> {
        if self.val.is_empty() {
            return Ok(None);
        }
        let group = self.ddp.as_ref().map(|(g, _)| g.as_ref());
        evaluate(&self.model, &self.cfg, &self.val, self.device, self.autocast, group).map(Some)
    }

    fn payload(&self, loss: Option<f64>) -> Payload {
        Payload {
            model: sorted_variables(&self.vs),
            optimizer: self.opt.state_tensors(),
            state: TrainState {
                format_version: checkpoint::FORMAT_VERSION,
                step: self.step,
                tokens: self.tokens,
                data_position: self.data_position,
                // Data order is a pure function of (seed, position); nothing else draws.
                rng: serde_json::json!({"seed": self.cfg.seed}),
                config_hash: resume_fingerprint(&self.cfg),
                config: Some(self.cfg.resume_view()),
                world_size: self.cfg.topology.world_size,
                attempt: self.cfg.attempt,
                preset: self.cfg.model.preset.clone(),
                loss,
                time: String::new(),
                files: Default::default(),
            },
        }
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

    /// Trains to the budget (or `stop_after_steps`), checkpointing on schedule, at the
    /// end and on SIGTERM.
    pub fn run(mut self, stop: Arc<AtomicBool>) -> Result<Outcome, Error> {
        let rank0 = self.rank0();
        self.stop = stop;
        let total_steps = self.cfg.schedule.total_steps;
        let mut last_step = self.opts.stop_after_steps.map_or(total_steps, |s| s.min(total_steps));
        if let Some(g) = &self.grpo {
            // A generated batch is never split by a stop: resuming must regenerate it.
            last_step = g.boundary_at_or_after(last_step).min(total_steps);
        }
        let mut log = if rank0 {
            Some(MetricsLog::open(
                self.checkpoint_dir(),
                self.step,
                self.tokens,
                Some(&self.cfg.name),
                self.cfg.attempt,
            )?)
        } else {
            None
        };
        let _server = match (rank0, self.opts.status_addr) {
            (true, Some(addr)) => {
                let server = StatusServer::start(addr, self.status.clone())?;
                tracing::info!("status on http://{}/status", server.addr());
                Some(server)
            }
            _ => None,
        };
        let mut checkpointer = Checkpointer::new(self.checkpoint_dir(), self.cfg.checkpoint.keep_last)?;
        let mirror = match &self.cfg.checkpoint.s3 {
            Some(s3) if rank0 => Some(Mirror::start(s3)?),
            _ => None,
        };
        let unigram_entropy = match &self.train {
            Some(t) => Some(t.unigram_entropy()?),
            None => None,
        };
        self.status.update(|s| {
            s.step = self.step;
            s.tokens = self.tokens;
        });
        let mut progress =
            rank0.then(|| Progress::new(total_steps, self.cfg.schedule.total_tokens, self.step, self.opts.tty));
        if let Some(p) = progress.as_mut() {
            let data = match (unigram_entropy, &self.grpo) {
                (Some(h), _) => format!("unigram entropy of the data {h:.3} nats/token"),
                (None, Some(g)) => format!("GRPO on {} questions", g.questions().train.len()),
                (None, None) => String::new(),
            };
            p.println(format!(
                "{}: {} ({} params) on {}, {} steps of {} tokens; {data}",
                self.cfg.name,
                self.cfg.model.preset,
                crate::progress::human_count(self.cfg.params.total as f64),
                self.cfg.topology.display,
                total_steps,
                self.cfg.batch.tokens_per_step,
            ));
        }
        // GRPO measures the policy it starts from, to compare with the one it ends with.
        let initial = if self.step == 0 { self.report_accuracy(log.as_mut(), progress.as_mut(), true)? } else { None };
        self.status.set_phase(TrainerPhase::Training);
        let mut losses = Vec::new();
        let mut val_loss = None;
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
                return Err(self.failed(e.at_step(self.step + 1)));
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
                Err(e) => return Err(self.failed(e)),
            };
            for report in reports {
                losses.push((report.step, report.loss));
                last_loss = Some(report.loss);
                self.status.record_step(&report);
                if let Some(log) = log.as_mut() {
                    log.step(&report)?;
                }
                if let Some(p) = progress.as_mut() {
                    p.on_step(&report);
                }
            }
            if eval_due {
                self.status.set_phase(TrainerPhase::Evaluating);
                if let Some((v, per_source)) = self.evaluate()? {
                    val_loss = Some(v);
                    self.status.record_eval(v, per_source.clone());
                    if let Some(log) = log.as_mut() {
                        log.eval(self.step, self.tokens, v, &per_source)?;
                    }
                    if let Some(p) = progress.as_mut() {
                        p.on_eval(self.step, v, &per_source);
                    }
                }
                self.status.set_phase(TrainerPhase::Training);
            }
            let stopping = self.step == last_step || self.may_stop();
            if checkpoint_due && !stopping {
                // Training goes on while the background thread writes.
                if rank0 && let Some(done) = checkpointer.save_async(self.payload(last_loss))? {
                    self.checkpoint_written(&done, log.as_mut(), mirror.as_ref())?;
                    last_checkpoint = Some(done);
                }
                self.barrier()?;
            }
        }
        if rank0 {
            if let Some(done) = checkpointer.wait()? {
                self.checkpoint_written(&done, log.as_mut(), mirror.as_ref())?;
                last_checkpoint = Some(done);
            }
            if last_checkpoint.as_ref().map(|c| c.step) != Some(self.step) && self.step > 0 {
                self.status.set_phase(TrainerPhase::Checkpointing);
                let done = checkpointer.save(self.payload(last_loss))?;
                self.checkpoint_written(&done, log.as_mut(), mirror.as_ref())?;
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
            None
        } else {
            self.report_accuracy(log.as_mut(), progress.as_mut(), false)?.map(|last| (initial, last))
        };
        if rank0 && self.opts.sample && !interrupted {
            let (prompt, text) = self.sample()?;
            if let Some(log) = log.as_mut() {
                log.sample(self.step, self.tokens, Some(&prompt), &text)?;
            }
            if let Some(p) = progress.as_mut() {
                p.println(format!("sample after {} steps:\n{prompt} {text}", self.step));
            }
        }
        if let Some(p) = progress {
            p.finish();
        }
        if interrupted {
            return Err(Error::Terminated { step: self.step });
        }
        self.status.set_phase(TrainerPhase::Done);
        Ok(Outcome {
            step: self.step,
            tokens: self.tokens,
            losses,
            val_loss,
            last_checkpoint,
            unigram_entropy,
            accuracy,
            resumed_from: self.resumed_from,
        })
    }

    /// GRPO: scores the policy on the held-out questions (every rank takes part) and
    /// reports it to status, the log and the progress display.
    fn report_accuracy(
        &self,
        log: Option<&mut MetricsLog>,
        progress: Option<&mut Progress>,
        initial: bool,
    ) -> Result<Option<McqScore>, Error> {
        let Some(g) = &self.grpo else { return Ok(None) };
        let settings = self.cfg.grpo.as_ref().expect("phase grpo");
        let n = (settings.eval_questions as usize).min(g.questions().held_out.len());
        if n == 0 {
            return Ok(None);
        }
        self.status.set_phase(TrainerPhase::Evaluating);
        let options = EvalOptions {
            max_prompt_tokens: g.max_prompt_tokens(),
            max_new_tokens: settings.max_new_tokens as usize,
            batch: (self.cfg.batch.micro_batch as usize).max(8),
            device: self.device,
            autocast: self.autocast,
        };
        let group = self.ddp.as_ref().map(|(g, _)| g.as_ref());
        let score =
            crate::grpo::eval::evaluate(&self.model, &self.tokenizer, &g.questions().held_out[..n], &options, group)?;
        self.status.record_accuracy(&score, initial);
        if let Some(log) = log {
            log.accuracy(self.step, self.tokens, &score)?;
        }
        if let Some(p) = progress {
            p.println(format!(
                "{} accuracy on {} held-out questions after {} steps: {:.1}% greedy, {:.1}% by log-likelihood ({:.1}% unanswered; chance 25%)",
                if initial { "initial" } else { "final" },
                score.questions,
                self.step,
                100.0 * score.greedy,
                100.0 * score.log_likelihood,
                100.0 * score.unparsed,
            ));
        }
        self.status.set_phase(TrainerPhase::Training);
        Ok(Some(score))
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

    /// Records a failure's reason in status before it is returned.
    fn failed(&self, e: Error) -> Error {
        if let Some(reason) = e.reason() {
            self.status.record_failure(reason);
        }
        e
    }

    fn barrier(&self) -> Result<(), Error> {
        self.ddp.as_ref().map_or(Ok(()), |(group, _)| group.barrier())
    }

    fn checkpoint_written(
        &self,
        done: &CheckpointRef,
        log: Option<&mut MetricsLog>,
        mirror: Option<&Mirror>,
    ) -> Result<(), Error> {
        self.status.record_checkpoint(done.clone());
        if let Some(m) = mirror {
            m.push(Path::new(&done.uri));
        }
        if let Some(log) = log {
            log.checkpoint(done)?;
        }
        Ok(())
    }
}

/// Validation loss of each one-source mix in `val` over the run's `evalTokens`
/// (split evenly), and their mean weighted by the mix weights. With a group, the
/// ranks split the batches and every rank gets the totals.
pub fn evaluate(
    model: &Model,
    cfg: &RunConfig,
    val: &[Mix],
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
                let loss = crate::ffi::autocast(device, autocast, || {
                    model.loss(&x.f_to_device(device)?, &y.f_to_device(device)?)
                })?;
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

/// The run's tokenizer (`spec.model.tokenizer`).
pub fn load_tokenizer(cfg: &RunConfig) -> Result<Tokenizer, Error> {
    let tokenizer = match &cfg.tokenizer {
        Location::Embedded { .. } => Tokenizer::embedded()?,
        Location::Path { path } => Tokenizer::from_file(path)?,
        Location::Pvc { claim, path } => Tokenizer::from_file(crds::contract::pvc_path(claim, path))?,
        Location::S3 { bucket, prefix } => {
            // A tokenizer.json object, or the one beside a prepared source's manifest.
            let key = if prefix.ends_with(".json") { prefix.clone() } else { storage::join(prefix, "tokenizer.json") };
            let local = crate::data::cache_dir().join("s3").join(bucket).join(&key);
            data_store(cfg)?.get_file(bucket, &key, &local)?;
            Tokenizer::from_file(&local)?
        }
    };
    if tokenizer.vocab_size() > cfg.model.vocab_size as usize {
        return Err(Error::InvalidSpec(format!(
            "spec.model.vocabSize {} is smaller than the tokenizer's vocabulary of {}",
            cfg.model.vocab_size,
            tokenizer.vocab_size()
        )));
    }
    Ok(tokenizer)
}

/// One single-source validation mix per data source, in mix order.
pub fn validation_mixes(cfg: &RunConfig, tok: &Tokenizer) -> Result<Vec<Mix>, Error> {
    source_tokens(cfg, tok, Split::Validation)?
        .into_iter()
        .map(|s| Mix::validation(vec![s], cfg.batch.seq_len as usize))
        .collect()
}

/// Token streams of the run's data sources: for training, each source's share of the
/// budget (epochs repeat past [`MAX_EMBEDDED_TOKENS`]); for validation, its share of
/// `evalTokens`.
fn source_tokens(cfg: &RunConfig, tok: &Tokenizer, split: Split) -> Result<Vec<SourceTokens>, Error> {
    let data = cfg.data.as_ref().ok_or_else(|| Error::InvalidSpec("spec.data: pretraining needs a data mix".into()))?;
    let total_weight: f64 = data.mix.iter().map(|s| s.weight).sum();
    let sample = cfg.batch.seq_len as usize + 1;
    // One S3 client (and its runtime) for every S3 source of the mix.
    let store = std::cell::OnceCell::new();
    let s3 = || -> Result<Arc<S3>, Error> {
        if let Some(s) = store.get() {
            return Ok(Arc::clone(s));
        }
        let s = Arc::new(data_store(cfg)?);
        let _ = store.set(Arc::clone(&s));
        Ok(s)
    };
    data.mix
        .iter()
        .map(|src| {
            let name = match &src.location {
                Location::Embedded { name } => name,
                Location::Path { path } => return prepared_source(src, Path::new(path), tok, split),
                Location::Pvc { claim, path } => {
                    return prepared_source(src, Path::new(&crds::contract::pvc_path(claim, path)), tok, split);
                }
                Location::S3 { bucket, prefix } => return remote_source(s3()?, src, bucket, prefix, tok, split),
            };
            let need = match split {
                Split::Train => {
                    let share = src.weight / total_weight;
                    ((cfg.schedule.total_tokens as f64 * share * 1.02) as usize + 16 * sample).min(MAX_EMBEDDED_TOKENS)
                }
                Split::Validation => (data.eval_tokens as usize / data.mix.len()).max(2 * sample) + sample,
            };
            let tokens = mix::embedded_source_tokens(tok, name, cfg.seed, split, need)?;
            Ok(SourceTokens { name: src.name.clone(), weight: src.weight, tokens: tokens.into() })
        })
        .collect()
}

/// A source prepared by `trainer prepare`: its manifest's shards of `split`, checked
/// against the run's tokenizer.
fn prepared_source(src: &ResolvedSource, dir: &Path, tok: &Tokenizer, split: Split) -> Result<SourceTokens, Error> {
    let manifest = Manifest::read(dir)?;
    let entries = split_entries(src, &manifest, tok, split)?;
    let shards = ShardSet::open(dir, entries, &manifest)?;
    Ok(SourceTokens { name: src.name.clone(), weight: src.weight, tokens: Tokens::Shards(Arc::new(shards)) })
}

/// A source prepared to `s3://bucket/prefix`: shards fetched on demand into a bounded cache.
fn remote_source(
    s3: Arc<S3>,
    src: &ResolvedSource,
    bucket: &str,
    prefix: &str,
    tok: &Tokenizer,
    split: Split,
) -> Result<SourceTokens, Error> {
    let key = storage::join(prefix, MANIFEST);
    let text = s3.get_bytes(bucket, &key)?;
    let origin = storage::uri(bucket, &key);
    let manifest = Manifest::parse(&String::from_utf8_lossy(&text), Path::new(&origin))?;
    let entries = split_entries(src, &manifest, tok, split)?;
    let remote = RemoteShards::new(s3, bucket, prefix, &manifest, entries, &crate::data::cache_dir());
    Ok(SourceTokens { name: src.name.clone(), weight: src.weight, tokens: Tokens::Remote(Arc::new(remote)) })
}

/// The S3 client for data: the standard AWS chain, with the checkpoint mirror's endpoint
/// and region as defaults (data and checkpoints usually share a store).
pub(crate) fn data_store(cfg: &RunConfig) -> Result<S3, Error> {
    let env_endpoint = ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"].iter().any(|v| std::env::var_os(v).is_some());
    let mirror = cfg.checkpoint.s3.as_ref();
    S3::with(&S3Options {
        endpoint: if env_endpoint { None } else { mirror.and_then(|m| m.endpoint.clone()) },
        credentials: None,
        region: if std::env::var_os("AWS_REGION").is_some() { None } else { mirror.and_then(|m| m.region.clone()) },
    })
}

/// The manifest's shards of `split`, after checking its tokenizer against the run's.
fn split_entries<'m>(
    src: &ResolvedSource,
    manifest: &'m Manifest,
    tok: &Tokenizer,
    split: Split,
) -> Result<&'m [ShardEntry], Error> {
    let bad = |message: String| Error::Data { name: src.name.clone(), message: format!("{}: {message}", src.uri) };
    if manifest.tokenizer.hash != tok.hash() {
        return Err(bad(format!(
            "prepared with tokenizer {} ({} tokens), but the run's spec.model.tokenizer is {} ({} tokens); \
             train with the tokenizer.json beside the manifest or prepare again",
            &manifest.tokenizer.hash[..16.min(manifest.tokenizer.hash.len())],
            manifest.tokenizer.vocab_size,
            &tok.hash()[..16],
            tok.vocab_size()
        )));
    }
    let entries = match split {
        Split::Train => &manifest.train,
        Split::Validation => &manifest.validation,
    };
    if entries.is_empty() {
        return Err(bad(format!("has no {} shards; prepare it with --validation-fraction above 0", split.name())));
    }
    Ok(entries)
}

/// The kernels a run or `trainer bench` asks for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KernelRequest {
    /// `spec.attention`; `auto` is timed on CUDA.
    pub attention: Attention,
    /// SwiGLU's kernels; `None`: timed on CUDA, composed elsewhere.
    pub swiglu: Option<Kernels>,
    /// RoPE's kernels; `None`: timed on CUDA, composed elsewhere.
    pub rope: Option<Kernels>,
}

impl KernelRequest {
    /// `attention`, and SwiGLU's and RoPE's kernels chosen by the run.
    pub fn auto(attention: Attention) -> Self {
        KernelRequest { attention, swiglu: None, rope: None }
    }

    fn fused(&self, op: Op) -> Option<Kernels> {
        match op {
            Op::Swiglu => self.swiglu,
            Op::Rope => self.rope,
        }
    }
}

/// The kernels a run chooses between, and on CUDA what was timed to choose them.
pub struct ChosenKernels {
    /// `spec.attention`, `auto` resolved on CUDA ([`crate::attention::tune`]).
    pub attention: Attention,
    pub attention_trials: Option<Choice<Attention>>,
    /// SwiGLU's and RoPE's kernels, set for the process ([`crate::fused::set`]); empty
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
        use crate::trials::Candidate;
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
    m: &crds::presets::ModelConfig,
    micro_batch: i64,
    seq: i64,
    kind: Kind,
    device: Device,
    group: Option<&crate::dist::ProcessGroup>,
) -> Result<ChosenKernels, Error> {
    let attention_trials = if requested.attention == Attention::Auto && device.is_cuda() {
        Some(crate::attention::tune(m, micro_batch, seq, kind, device, &crate::attention::CUDA_CANDIDATES, group)?)
    } else {
        None
    };
    let mut fused = Vec::new();
    if m.arch != crds::presets::Arch::Gpt2 {
        for op in [Op::Swiglu, Op::Rope] {
            let trials = match requested.fused(op) {
                None if device.is_cuda() => Some(crate::fused::tune(
                    op,
                    m,
                    micro_batch,
                    seq,
                    kind,
                    device,
                    &crate::fused::CUDA_CANDIDATES,
                    group,
                )?),
                k => {
                    crate::fused::set(op, k.unwrap_or(Kernels::Composed));
                    None
                }
            };
            fused.push(FusedChoice { op, kernels: crate::fused::current(op), trials });
        }
    }
    Ok(ChosenKernels {
        attention: attention_trials.as_ref().map_or(requested.attention, |c| c.chosen),
        attention_trials,
        fused,
    })
}

/// The SDPA backend libtorch picks for the model's attention at this batch shape,
/// under `attention`; an error names `spec.attention` when it cannot run.
pub fn attention_backend(
    m: &crds::presets::ModelConfig,
    attention: Attention,
    micro_batch: i64,
    seq: i64,
    kind: Kind,
    device: Device,
) -> Result<optim::SdpBackend, Error> {
    let q = Tensor::f_zeros([micro_batch, m.n_head as i64, seq, m.d_head as i64], (kind, device))?;
    // Expanded K/V (cuDNN) have a head per query head and need no GQA path.
    let expand = crate::model::expands_kv(attention, m);
    let kv_heads = if expand { m.n_head } else { m.n_kv_head };
    let k = Tensor::f_zeros([micro_batch, kv_heads as i64, seq, m.d_head as i64], (kind, device))?;
    optim::check_sdp_backend(attention, &q, &k, &k, true, !expand && m.n_kv_head != m.n_head)
}

/// Variables by name, sorted, so every rank and every checkpoint sees one order.
pub fn sorted_variables(vs: &VarStore) -> Vec<(String, Tensor)> {
    let mut vars: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    vars
}

/// Copies `weights` into the model's variables; every variable must be present with
/// its shape. Errors name the checkpoint and the parameter.
pub fn copy_weights(vs: &VarStore, weights: &HashMap<String, Tensor>, origin: &Path) -> Result<(), Error> {
    let bad = |message: String| Error::Checkpoint { path: origin.to_path_buf(), message };
    tch::no_grad(|| {
        for (name, mut var) in sorted_variables(vs) {
            let src = weights.get(&name).ok_or_else(|| bad(format!("parameter {name} is missing")))?;
            if src.size() != var.size() {
                return Err(bad(format!(
                    "parameter {name} has shape {:?}, the model needs {:?}",
                    src.size(),
                    var.size()
                )));
            }
            var.f_copy_(&src.f_to_kind(var.kind())?)?;
        }
        Ok(())
    })
}

/// What a checkpoint must match to be resumed: the resolved run's fingerprint, plus the
/// embedded corpus version when the run reads embedded data or the embedded tokenizer
/// (a checkpoint of an older corpus would resume at a position in different data).
pub fn resume_fingerprint(cfg: &RunConfig) -> String {
    let embedded = |l: &Location| matches!(l, Location::Embedded { .. });
    let uses_embedded = embedded(&cfg.tokenizer)
        || cfg.data.as_ref().is_some_and(|d| d.mix.iter().any(|s| embedded(&s.location)))
        || cfg.grpo.as_ref().is_some_and(|g| embedded(&g.dataset));
    if uses_embedded { format!("{}-corpus{}", cfg.fingerprint(), corpus::CORPUS_VERSION) } else { cfg.fingerprint() }
}

/// The step of a fault injection knob, if it applies to `rank`.
fn injected(name: &str, rank: u32) -> Option<u64> {
    let for_rank = std::env::var(INJECT_RANK_ENV).ok().and_then(|r| r.parse::<u32>().ok());
    if for_rank.is_some_and(|r| r != rank) {
        return None;
    }
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolved(yaml: &str) -> RunConfig {
        crds::resolve(&crds::manifest::from_yaml(yaml, "test").unwrap()).unwrap()
    }

    /// A new embedded corpus makes old checkpoints of embedded runs incompatible, and
    /// leaves runs on prepared data alone.
    #[test]
    fn the_embedded_corpus_version_is_part_of_the_resume_fingerprint() {
        let embedded = resolved(include_str!("../../examples/tiny-local.yaml"));
        assert_eq!(
            resume_fingerprint(&embedded),
            format!("{}-corpus{}", embedded.fingerprint(), corpus::CORPUS_VERSION)
        );
        let prepared = resolved(include_str!("../../examples/seed002-medium-large-pretrain.yaml"));
        assert_eq!(resume_fingerprint(&prepared), prepared.fingerprint());
    }
}
