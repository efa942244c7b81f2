//! What the endpoint serves: the operator's document, and what only `/metrics` shows.

use std::collections::{BTreeMap, HashMap};

use crds::config::RunConfig;
use crds::contract::{FailureReason, TrainerPhase, TrainerStatus};

use crate::train::report::GpuMemory;

/// Every phase, in the order `trainer_phase` lists them.
pub(super) const PHASES: [TrainerPhase; 6] = [
    TrainerPhase::Starting,
    TrainerPhase::Training,
    TrainerPhase::Evaluating,
    TrainerPhase::Checkpointing,
    TrainerPhase::Done,
    TrainerPhase::Failed,
];

/// The phase's name as it appears in `/status` JSON and in the `phase` label.
pub fn phase_name(phase: TrainerPhase) -> &'static str {
    match phase {
        TrainerPhase::Starting => "starting",
        TrainerPhase::Training => "training",
        TrainerPhase::Evaluating => "evaluating",
        TrainerPhase::Checkpointing => "checkpointing",
        TrainerPhase::Done => "done",
        TrainerPhase::Failed => "failed",
    }
}

/// Constant facts about the run, exported as the labels of `trainer_info`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunInfo {
    /// Model preset name.
    pub preset: String,
    /// Precision as written in the manifest (`bf16-mixed`, `bf16`, `f32`).
    pub precision: String,
    /// `cpu` or `cuda`.
    pub device: String,
    /// Trainer processes in the run.
    pub world_size: u32,
}

impl RunInfo {
    /// The info of a resolved run.
    pub fn from_config(config: &RunConfig) -> RunInfo {
        let name = |v: serde_json::Value| v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string());
        RunInfo {
            preset: config.model.preset.clone(),
            precision: name(serde_json::to_value(config.precision).expect("precision serializes")),
            device: name(serde_json::to_value(config.topology.device).expect("device serializes")),
            world_size: config.topology.world_size,
        }
    }
}

/// Everything the endpoint serves: the operator's document plus the counters that
/// only `/metrics` shows.
#[derive(Clone, Debug, PartialEq)]
pub struct StatusState {
    /// The `/status` document.
    pub status: TrainerStatus,
    /// Labels of `trainer_info`.
    pub info: RunInfo,
    /// Unix time of the last completed step.
    pub last_step_time: Option<f64>,
    /// Validation loss per data source at the latest evaluation.
    pub val_loss_by_source: BTreeMap<String, f64>,
    /// NaN/Inf loss or gradient-norm events.
    pub nonfinite_events: u64,
    /// Failures recorded, per reason.
    pub failures: HashMap<FailureReason, u64>,
    /// Rank 0's GPU memory at the last step (CUDA runs).
    pub gpu_memory: Option<GpuMemory>,
}

impl StatusState {
    /// Whether the training loop is still healthy: no failure recorded.
    pub fn healthy(&self) -> bool {
        self.status.phase != TrainerPhase::Failed
    }
}
