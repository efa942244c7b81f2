//! How a run comes back: the newest valid checkpoint (or the S3 mirror's), else
//! `spec.initFrom`'s weights; GRPO's frozen reference policy; and what a checkpoint
//! of this trainer holds.

use std::path::PathBuf;

use std::path::Path;

use crds::config::{Location, ResolvedInit, RunConfig};
use crds::types::Attention;
use tch::nn::VarStore;
use tch::{Device, Kind};

use super::options::RunOptions;
use super::state::{Stateful, Weights};
use super::trainer::Trainer;
use crate::Error;
use crate::checkpoint::resume::{copy_weights, resume_fingerprint};
use crate::checkpoint::{self, ConfigChange, Loaded, Payload, TrainState, mirror};
use crate::data::corpus;
use crate::dist::ProcessGroup;
use crate::model::Model;
use crate::rng::GLOBAL_RNG;

/// The checkpoint a run resumes from, checked against the run.
pub(super) struct Resume {
    loaded: Loaded,
    /// The spec's warmup, before the run kept its own.
    spec_warmup: u64,
}

/// Finds the newest valid checkpoint in `opts.output_dir` (or, when that is empty, the
/// S3 mirror's), checks that `cfg` may resume it, and continues `cfg` from it (a changed
/// budget continues the schedule; the generated data keeps its size). Runs before the
/// data is built, which depends on the continued config.
pub(super) fn find_resume(
    cfg: &mut RunConfig,
    opts: &RunOptions,
    group: Option<&ProcessGroup>,
) -> Result<Option<Resume>, Error> {
    let dir = &opts.output_dir;
    let rank0 = opts.placement.rank == 0;
    let mut found = checkpoint::latest_valid(dir)?;
    if found.is_none()
        && let Some(s3) = &cfg.checkpoint.s3
    {
        // An empty checkpoint directory (a new PVC) resumes from the S3 mirror.
        if rank0 {
            std::fs::create_dir_all(dir).map_err(crate::io_err(dir))?;
            if let Some(step) = mirror::restore(s3, dir)? {
                tracing::info!("the checkpoint directory was empty: resuming from the S3 mirror's step {step}");
            }
        }
        if let Some(g) = group {
            g.barrier()?;
        }
        found = checkpoint::latest_valid(dir)?;
    }
    let Some(loaded) = found else {
        log_rollbacks(cfg, 0, rank0);
        return Ok(None);
    };
    let fingerprint = resume_fingerprint(cfg);
    let state = &loaded.state;
    if state.config_hash != fingerprint && !state.config_hash.contains("-corpus") && fingerprint.contains("-corpus") {
        return Err(Error::IncompatibleCheckpoint {
            step: state.step,
            message: format!(
                "{} was trained on an older embedded corpus (this trainer's is version {}); \
                 remove the directory (or pass another --output) to train again",
                loaded.dir.display(),
                corpus::CORPUS_VERSION
            ),
        });
    }
    checkpoint::check_resumable(state, cfg, &fingerprint)?;
    let spec_warmup = cfg.schedule.warmup_tokens;
    if let Some(was) = &state.config {
        cfg.continue_from(was, state.tokens).map_err(|message| Error::IncompatibleCheckpoint {
            step: state.step,
            message: format!("{}: {message}", loaded.dir.display()),
        })?;
    }
    log_rollbacks(cfg, state.step, rank0);
    Ok(Some(Resume { loaded, spec_warmup }))
}

/// Records that the rollbacks not resumed from yet resume from the checkpoint of
/// `step` (0: none), and says what each one does.
fn log_rollbacks(cfg: &mut RunConfig, step: u64, rank0: bool) {
    for r in crds::rollback::resumed_at(&mut cfg.rollbacks, step) {
        if rank0 {
            tracing::warn!(
                "rolling back after the non-finite step {} of attempt {}: training again from step {step}, never on \
                 samples {}..{} of the run's order, at {}× the learning rate through step {}",
                r.step,
                r.attempt,
                r.skip_from,
                r.skip_to,
                r.lr_factor,
                r.lr_until_step
            );
        }
    }
}

/// Where `spec.initFrom`'s weights are on this machine (`init_dir`: where
/// `initFrom.trainingRun` runs and PVCs are found).
fn init_source(cfg: &RunConfig, init_dir: &Path) -> Result<Option<PathBuf>, Error> {
    let source = match &cfg.init_from {
        None => return Ok(None),
        Some(ResolvedInit::TrainingRun { name }) => init_dir.join(name),
        Some(ResolvedInit::Checkpoint { location: Location::Path { path }, .. }) => PathBuf::from(path),
        Some(ResolvedInit::Checkpoint { location: Location::Pvc { path, .. }, .. }) => init_dir.join(path),
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
/// resumes from, in `kind` on `device`.
pub(super) fn reference_model(
    cfg: &RunConfig,
    init_dir: &Path,
    device: Device,
    attention: Attention,
    kind: Kind,
) -> Result<(VarStore, Model), Error> {
    let source = init_source(cfg, init_dir)?
        .ok_or_else(|| Error::InvalidSpec("spec.initFrom is required for phase grpo".into()))?;
    let mut vs = VarStore::new(Device::Cpu);
    let mut model = {
        let _rng = GLOBAL_RNG.lock().unwrap_or_else(|e| e.into_inner());
        Model::new(&vs.root(), &cfg.model, device)?
    };
    model.set_attention(attention);
    copy_weights(&vs, &checkpoint::load_weights(&source)?, &source)?;
    if kind == Kind::BFloat16 {
        vs.bfloat16();
    }
    vs.set_device(device);
    vs.freeze();
    Ok((vs, model))
}

impl Trainer {
    /// Loads the checkpoint found by [`find_resume`], or else `initFrom`'s weights;
    /// returns where weights came from, if anywhere.
    pub(super) fn restore(&mut self, resume: Option<Resume>) -> Result<Option<String>, Error> {
        if let Some(Resume { loaded, spec_warmup }) = resume {
            let state = &loaded.state;
            Weights { vs: &self.vs, parallel: &mut *self.parallel }.load(&loaded)?;
            self.opt.load(&loaded)?;
            self.progress.load(&loaded)?;
            self.data.load(&loaded)?;
            let changes = state.config.as_ref().map(|was| self.cfg.record_differences(was)).unwrap_or_default();
            if !changes.is_empty() {
                self.progress.history.push(ConfigChange {
                    step: state.step,
                    tokens: state.tokens,
                    attempt: self.cfg.attempt,
                    time: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
                    changes: changes.clone(),
                });
            }
            if self.rank0() {
                tracing::info!(
                    "resuming from {} at step {} ({} tokens)",
                    loaded.dir.display(),
                    self.progress.step,
                    self.progress.tokens
                );
                for change in &changes {
                    tracing::info!("changed since the checkpoint: {change}");
                }
                self.log_resume_effects(state, spec_warmup);
            }
            return Ok(Some(loaded.dir.display().to_string()));
        }
        let Some(source) = init_source(&self.cfg, &self.opts.init_dir)? else { return Ok(None) };
        let weights = checkpoint::load_weights(&source)?;
        copy_weights(&self.vs, &weights, &source)?;
        if self.rank0() {
            tracing::info!("initial weights from {}", source.display());
        }
        Ok(Some(source.display().to_string()))
    }

    /// What the accepted changes mean for the run, in words.
    fn log_resume_effects(&self, state: &TrainState, spec_warmup: u64) {
        let (cfg, was) = (&self.cfg, state.config.as_ref());
        if state.world_size != cfg.topology.world_size {
            tracing::info!(
                "world size {} → {}: each step's {} global sequences are split over {} rank{} with accumulation {}",
                state.world_size,
                cfg.topology.world_size,
                cfg.batch.global_sequences,
                cfg.topology.world_size,
                if cfg.topology.world_size == 1 { "" } else { "s" },
                cfg.batch.grad_accum
            );
        }
        let Some(was) = was else { return };
        let (s, w) = (&cfg.schedule, &was.schedule);
        if s.total_steps != w.total_steps {
            let rate = match s.anchor {
                Some(a) if w.anchor != s.anchor => format!(
                    "the learning rate goes on from {:.3e}, where the run had reached, to {:.3e} at the new end",
                    a.lr, s.min_lr
                ),
                _ => {
                    format!("the learning rate is unchanged at every token trained ({:.3e} now)", s.lr_at(state.tokens))
                }
            };
            tracing::info!(
                "budget {} → {} steps ({} → {} tokens), {} trained: {rate}",
                w.total_steps,
                s.total_steps,
                w.total_tokens,
                s.total_tokens,
                state.step
            );
        }
        if s.warmup_tokens != spec_warmup {
            tracing::info!(
                "warmup is history: the run keeps its {} warmup tokens (this spec's budget or \
                 optimizer.warmupTokens would give {spec_warmup})",
                s.warmup_tokens
            );
        }
        if let Some(size) = cfg.data_sized_for {
            tracing::info!(
                "the generated data keeps the size the run started with ({} tokens, {} steps)",
                size.tokens,
                size.steps
            );
        }
    }

    /// A checkpoint of the run as it is now, every part writing its own piece. Every
    /// rank calls this: a sharded optimizer's state and fsdp's parameters are gathered.
    pub(super) fn checkpoint(&mut self, loss: Option<f64>, val_loss: Option<f64>) -> Result<Payload, Error> {
        let state = TrainState {
            format_version: checkpoint::FORMAT_VERSION,
            step: 0,
            tokens: 0,
            data_position: 0,
            // Data order is a pure function of (seed, position); nothing else draws.
            rng: serde_json::json!({"seed": self.cfg.seed}),
            config_hash: resume_fingerprint(&self.cfg),
            config: Some(self.cfg.record_view()),
            history: Vec::new(),
            world_size: self.cfg.topology.world_size,
            attempt: self.cfg.attempt,
            preset: self.cfg.model.preset.clone(),
            loss,
            val_loss,
            time: String::new(),
            files: Default::default(),
        };
        let mut payload = Payload { model: Vec::new(), optimizer: Vec::new(), state };
        Weights { vs: &self.vs, parallel: &mut *self.parallel }.save(&mut payload)?;
        self.opt.save(&mut payload)?;
        self.progress.save(&mut payload)?;
        self.data.save(&mut payload)?;
        Ok(payload)
    }
}
