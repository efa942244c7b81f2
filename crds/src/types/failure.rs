//! What a run does when it fails: `spec.failurePolicy`, and the record of a rollback.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::bounds;

/// Restart, stall, out-of-memory and NaN policy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailurePolicy {
    /// Gang restarts allowed after retriable failures. Disruptions (preemption,
    /// eviction, node loss) do not count. NaN loss (unless onNaN says otherwise), OOM
    /// (unless onOutOfMemory says otherwise) and a full disk never restart.
    #[serde(default = "default_max_restarts")]
    pub max_restarts: u32,
    /// A Running run whose step has not advanced for this long is Stalled,
    /// e.g. "30m" or "1h30m".
    #[serde(default = "default_stall_timeout")]
    #[schemars(length(max = bounds::SHORT))]
    pub stall_timeout: String,
    /// What to do on a stall: `report` sets the Stalled condition and an event;
    /// `restart` also gang-restarts from the last checkpoint (counts as a restart).
    #[serde(default)]
    pub on_stall: OnStall,
    /// What to do when a trainer runs out of GPU memory (exit 87): `fail` the run, or
    /// `reduceMicroBatch`: restart the gang (not counted against maxRestarts) from the
    /// last checkpoint with half the micro-batch (the largest divisor of each rank's
    /// sequences at most half of it), the global batch unchanged through accumulation.
    /// The micro-batch in use is in status.effective.microBatch; at 1, the next OOM
    /// fails the run. A host OOMKilled pod always fails it.
    #[serde(default)]
    pub on_out_of_memory: OnOutOfMemory,
    /// What to do when a step's loss or gradient norm is NaN or infinite (exit 86):
    /// `fail` the run (NaNLoss), or `rollback`: restart the gang (not counted against
    /// maxRestarts) from the newest checkpoint before that step, never training again
    /// on the samples of `rollbackSkip`, at `rollbackLrFactor` times the learning rate
    /// for `rollbackLrSteps` steps past the failing one. Each rollback is recorded in
    /// status.effective.rollbacks and in the checkpoints, so later resumes keep it.
    #[serde(default, rename = "onNaN")]
    pub on_nan: OnNaN,
    /// Rollbacks allowed with `onNaN: rollback` (at most 256); the next non-finite
    /// step fails the run as NaNLoss.
    #[serde(default = "default_max_rollbacks")]
    #[schemars(range(max = super::bounds::ROLLBACKS))]
    pub max_rollbacks: u32,
    /// The learning rate's factor after a rollback, in (0, 1].
    #[serde(default = "default_rollback_lr_factor")]
    #[x_kube(validation = Rule::new("self > 0.0 && self <= 1.0").message("rollbackLrFactor must be in (0, 1]"))]
    pub rollback_lr_factor: f64,
    /// Steps past the failing one that keep the lowered learning rate (it applies
    /// from the checkpoint rolled back to). Default: one checkpoint interval
    /// (checkpoint.everySteps), so the next checkpoint is taken at the lowered rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_lr_steps: Option<u32>,
    /// Which samples a rollback skips: `failingStep`, the global batch of the step
    /// that was not finite, or `sinceCheckpoint`, every batch from the checkpoint
    /// rolled back to through that step.
    #[serde(default)]
    pub rollback_skip: RollbackSkip,
    /// A rank whose own work per step (before the gradient all-reduce) takes more than
    /// this many times the median rank's is a straggler, and so is a pod whose network
    /// link (timed by the operator) is this many times slower than the median pod's
    /// (and slower than 50 ms for its 256 KiB probe); above 1.
    #[serde(default = "default_straggler_factor")]
    #[x_kube(validation = Rule::new("self > 1.0").message("stragglerFactor must be above 1"))]
    pub straggler_factor: f64,
    /// Readings in a row that find the same straggler before the Straggler condition is
    /// set: of rank 0's status, each at a new step, for a slow rank; of every pod's link,
    /// each at a poll, for a slow link. Report only: nothing restarts.
    #[serde(default = "default_straggler_readings")]
    #[x_kube(validation = Rule::new("self >= 1").message("stragglerReadings must be at least 1"))]
    pub straggler_readings: u32,
}

fn default_max_restarts() -> u32 {
    3
}
fn default_stall_timeout() -> String {
    "30m".into()
}
fn default_max_rollbacks() -> u32 {
    2
}
fn default_rollback_lr_factor() -> f64 {
    0.5
}
pub(crate) fn default_straggler_factor() -> f64 {
    1.3
}
pub(crate) fn default_straggler_readings() -> u32 {
    3
}

impl Default for FailurePolicy {
    fn default() -> Self {
        FailurePolicy {
            max_restarts: default_max_restarts(),
            stall_timeout: default_stall_timeout(),
            on_stall: OnStall::default(),
            on_out_of_memory: OnOutOfMemory::default(),
            on_nan: OnNaN::default(),
            max_rollbacks: default_max_rollbacks(),
            rollback_lr_factor: default_rollback_lr_factor(),
            rollback_lr_steps: None,
            rollback_skip: RollbackSkip::default(),
            straggler_factor: default_straggler_factor(),
            straggler_readings: default_straggler_readings(),
        }
    }
}

/// Reaction to running out of GPU memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum OnOutOfMemory {
    #[default]
    Fail,
    ReduceMicroBatch,
}

/// Reaction to a stall.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OnStall {
    #[default]
    Report,
    Restart,
}

/// Reaction to a non-finite loss or gradient norm.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OnNaN {
    #[default]
    Fail,
    Rollback,
}

/// The samples a rollback never trains on again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum RollbackSkip {
    /// The global batch of the step that was not finite.
    #[default]
    FailingStep,
    /// Every global batch from the checkpoint rolled back to through the failing step.
    SinceCheckpoint,
}

/// One rollback after a non-finite step: the samples skipped from then on, and the
/// steps trained at a lowered learning rate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Rollback {
    /// The step whose loss or gradient norm was not finite.
    pub step: u64,
    /// The attempt it happened on.
    pub attempt: u32,
    /// First global sample skipped: a position in the run's sample order (sequences
    /// in pretraining, prompts in GRPO).
    pub skip_from: u64,
    /// The sample after the last one skipped.
    pub skip_to: u64,
    /// The learning rate is multiplied by this...
    pub lr_factor: f64,
    /// ...from the checkpoint rolled back to through this step.
    pub lr_until_step: u64,
    /// The step of the checkpoint the run rolled back to: written by the trainer when
    /// it resumes (absent until then; 0 when there was none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_step: Option<u64>,
}
