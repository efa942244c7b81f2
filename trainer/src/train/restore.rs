//! How a run comes back: the newest valid checkpoint (or the S3 mirror's), else
//! `spec.initFrom`'s weights; GRPO's frozen reference policy; and what a checkpoint
//! of this trainer holds.

use std::path::PathBuf;

use crds::config::{Location, ResolvedInit};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use super::Trainer;
use crate::Error;
use crate::checkpoint::resume::{copy_weights, resume_fingerprint};
use crate::checkpoint::{self, Payload, TrainState, mirror};
use crate::data::corpus;
use crate::dist::ProcessGroup;
use crate::model::Model;
use crate::rng::GLOBAL_RNG;

impl Trainer {
    /// Resumes or loads initial weights; returns where weights came from, if anywhere.
    pub(super) fn restore(&mut self, group: Option<&ProcessGroup>) -> Result<Option<String>, Error> {
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
                if loaded.state.world_size != self.cfg.topology.world_size {
                    tracing::info!(
                        "world size {} → {}: each step's {} global sequences are split over {} rank{} with \
                         accumulation {}",
                        loaded.state.world_size,
                        self.cfg.topology.world_size,
                        self.cfg.batch.global_sequences,
                        self.cfg.topology.world_size,
                        if self.cfg.topology.world_size == 1 { "" } else { "s" },
                        self.cfg.batch.grad_accum
                    );
                }
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
    pub(super) fn reference_model(&self, kind: Kind) -> Result<(VarStore, Model), Error> {
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

    /// What a checkpoint holds; `model` is [`Trainer::checkpoint_model`] and `optimizer`
    /// [`crate::optim::Optimizer::checkpoint_state`], which every rank takes part in.
    pub(super) fn payload(
        &self,
        model: Vec<(String, Tensor)>,
        loss: Option<f64>,
        optimizer: Vec<(String, Tensor)>,
    ) -> Payload {
        Payload {
            model,
            optimizer,
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
}
