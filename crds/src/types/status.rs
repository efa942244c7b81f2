//! What the operator observes and writes: the run's status.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Rollback, bounds};

/// Observed state of a TrainingRun, written only by the operator.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrainingRunStatus {
    /// Pending, Waiting, Running, Restarting, Succeeded, Failed or Suspended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<RunPhase>,
    /// Reason of the latest phase change, e.g. NaNLoss or WaitingForInitRun.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = bounds::REASON))]
    pub reason: Option<String>,
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Accepted, Running, Restarting, Succeeded, Failed, Stalled, Suspended; with
    /// GRPO, NoLearningSignal; with failurePolicy.onNaN: rollback, RolledBack; with
    /// several ranks, Straggler.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    #[schemars(length(max = bounds::CONDITIONS))]
    pub conditions: Vec<Condition>,
    /// Training progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
    /// Latest training metrics reported by rank 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<RunMetrics>,
    /// The newest complete checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_checkpoint: Option<CheckpointRef>,
    /// The kept checkpoint with the lowest validation loss (`spec.checkpoint.keepBest`):
    /// what `trainer export --best` exports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_checkpoint: Option<CheckpointRef>,
    /// Gang restarts so far (disruptions excluded).
    #[serde(default)]
    pub restarts: u32,
    /// Current attempt, starting at 1; every gang restart creates a new attempt.
    #[serde(default)]
    pub attempt: u32,
    /// Name of the current attempt's Job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = bounds::DNS_SUBDOMAIN))]
    pub job_name: Option<String>,
    /// The attempt whose Job the operator has seen. A Job of the current attempt that
    /// is gone before it finished was deleted (by hand, or by a TTL), which counts as a
    /// restart: deleting Jobs never resets the restart budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seen_job_attempt: Option<u32>,
    /// When the first attempt started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the run succeeded or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// Settings a failure policy changed from the spec's; the run's attempts use them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effective: Option<EffectiveSettings>,
    /// The rank whose work per step is slowest, while it is over
    /// failurePolicy.stragglerFactor × the median rank's (several ranks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub straggler: Option<Straggler>,
    /// The pod whose network link is slowest, while the time the operator takes to fetch
    /// a fixed probe from it is over failurePolicy.stragglerFactor × the other pods'
    /// median (several nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slow_link: Option<SlowLink>,
    /// Topology for display, nodes x GPUs per node, e.g. "4x2".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = bounds::SHORT))]
    pub topology: Option<String>,
}

/// Lifecycle phase of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum RunPhase {
    Pending,
    Waiting,
    Running,
    Restarting,
    Succeeded,
    Failed,
    Suspended,
}

/// Training progress.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    /// Tokens trained on so far.
    pub tokens: u64,
    /// Tokens the run will train on.
    pub total_tokens: u64,
    /// Optimizer steps done.
    pub step: u64,
    /// Optimizer steps of the whole run.
    pub total_steps: u64,
    /// Percent done, 0-100.
    pub percent: f64,
    /// Estimated seconds to completion at the current throughput.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_seconds: Option<u64>,
    /// ETA for display, e.g. "3h12m".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = bounds::SHORT))]
    pub eta: Option<String>,
    /// Progress for display, e.g. "42.1%".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = bounds::SHORT))]
    pub display: Option<String>,
    /// When `step` last advanced, or when the current attempt started running. A
    /// Running run whose step has not advanced for failurePolicy.stallTimeout is Stalled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_progress_time: Option<Time>,
}

/// Training metrics.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunMetrics {
    /// Training loss (mean over the last step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<f64>,
    /// Validation loss at the latest evaluation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_loss: Option<f64>,
    /// Tokens per second, all ranks together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_second: Option<u64>,
    /// Model FLOPs utilization (0-1) against 989 TFLOP/s bf16 per GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mfu: Option<f64>,
    /// Global gradient norm before clipping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grad_norm: Option<f64>,
    /// Current learning rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr: Option<f64>,
    /// GRPO: mean reward of the last step's completions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward: Option<f64>,
    /// GRPO: fraction of the last step's completions that answered correctly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<f64>,
    /// GRPO: fraction of the last step's completions with no parseable answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unparsed_fraction: Option<f64>,
    /// GRPO: mean KL to the reference model per completion token (k3 estimate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kl: Option<f64>,
    /// GRPO: fraction of completion tokens whose ratio was clipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clip_fraction: Option<f64>,
    /// GRPO: mean completion length in tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_length: Option<f64>,
    /// GRPO: fraction of the last step's prompt groups whose completions all got the
    /// same reward: they have no advantage and teach nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frac_reward_zero_std: Option<f64>,
    /// GRPO: mean entropy (nats) of the policy over the completion tokens of the last
    /// generated batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entropy: Option<f64>,
    /// GRPO: steps in a row, up to the last, in which fracRewardZeroStd was at least 0.9.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_signal_steps: Option<u64>,
    /// GRPO: tokens generated per second while sampling, all ranks together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling_tokens_per_second: Option<u64>,
    /// GRPO: prompt and completion tokens trained on per second, all ranks together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training_tokens_per_second: Option<u64>,
    /// GRPO: held-out accuracy before training (greedy answer letter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_eval_accuracy: Option<f64>,
    /// GRPO: held-out accuracy at the latest evaluation, by greedy generation of the
    /// answer letter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_accuracy: Option<f64>,
    /// GRPO: held-out accuracy at the latest evaluation, by the log-likelihood of the
    /// options (lm-evaluation-harness's acc).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_accuracy_log_likelihood: Option<f64>,
    /// GRPO: each of spec.grpo.evalDatasets, scored before training and at the latest
    /// evaluation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = bounds::EVAL_DATASETS))]
    pub eval_datasets: Vec<EvalDatasetAccuracy>,
    /// Peak GPU memory held by tensors on rank 0's GPU since the trainer started, GiB
    /// (CUDA runs). Against `gpuMemoryTotalGiB`, the headroom for a larger
    /// `batch.microBatch`.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "gpuMemoryPeakGiB")]
    pub gpu_memory_peak_gib: Option<f64>,
    /// Memory of rank 0's GPU, GiB (CUDA runs).
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "gpuMemoryTotalGiB")]
    pub gpu_memory_total_gib: Option<f64>,
}

/// A GRPO run's accuracy on one of its extra evaluation sets.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct EvalDatasetAccuracy {
    /// The question set, as spec.grpo.evalDatasets names it.
    #[schemars(length(max = bounds::URI))]
    pub dataset: String,
    /// Questions scored.
    pub questions: u64,
    /// Greedy answer-letter accuracy before training.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_accuracy: Option<f64>,
    /// Greedy answer-letter accuracy at the latest evaluation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<f64>,
    /// Accuracy by the log-likelihood of the options (lm-evaluation-harness's acc) at
    /// the latest evaluation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accuracy_log_likelihood: Option<f64>,
}

/// A complete checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointRef {
    /// Optimizer step of the checkpoint.
    pub step: u64,
    /// Tokens trained on at the checkpoint.
    pub tokens: u64,
    /// Where it is: a path on the checkpoint PVC, or its S3 mirror.
    #[schemars(length(max = bounds::URI))]
    pub uri: String,
    /// When it was completed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = bounds::SHORT))]
    pub time: Option<String>,
    /// The mix's validation loss at the checkpoint's step, when validation ran there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_loss: Option<f64>,
}

/// A rank slower than the others, from rank 0's per-rank step times.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Straggler {
    /// Its global rank.
    pub rank: u32,
    /// Its pod, when it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = bounds::DNS_SUBDOMAIN))]
    pub pod: Option<String>,
    /// The node of its pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = bounds::DNS_SUBDOMAIN))]
    pub node: Option<String>,
    /// Its compute seconds per step.
    pub compute_seconds: f64,
    /// The median rank's.
    pub median_seconds: f64,
    /// Readings in a row, up to the last, that found it over the factor.
    pub readings: u32,
    /// The step of the last reading: a reading counts once per new step.
    pub step: u64,
}

/// A pod whose network link is slower than the other pods', timed by the operator.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SlowLink {
    /// Its pod's completion index: ranks nodeRank × GPUs per node onwards.
    pub node_rank: u32,
    /// Its pod.
    #[schemars(length(max = bounds::DNS_SUBDOMAIN))]
    pub pod: String,
    /// The node of its pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = bounds::DNS_SUBDOMAIN))]
    pub node: Option<String>,
    /// Seconds the operator took to fetch the link probe (256 KiB) from its pod.
    pub probe_seconds: f64,
    /// The other pods' median.
    pub median_seconds: f64,
    /// Readings in a row, up to the last, that found it over the factor.
    pub readings: u32,
}

/// Settings a failure policy changed from the spec's.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EffectiveSettings {
    /// The micro-batch in use after `failurePolicy.onOutOfMemory: reduceMicroBatch`
    /// halved it (a smaller spec.batch.microBatch wins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub micro_batch: Option<u32>,
    /// The rollbacks of `failurePolicy.onNaN: rollback`, oldest first: the samples
    /// each one skips and the steps it trains at a lowered learning rate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = bounds::ROLLBACKS))]
    pub rollbacks: Vec<Rollback>,
}
