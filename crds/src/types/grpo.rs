//! GRPO fine-tuning settings (`spec.grpo`).

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::bounds;

/// GRPO fine-tuning settings (TRL's formulas).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct GrpoSpec {
    /// Question set: MedQA-USMLE jsonl (question, options A-D, answer_idx) at
    /// s3://, pvc:// or a path, or `embedded:mcq` for the synthetic task.
    #[schemars(length(max = bounds::URI))]
    pub dataset: String,
    /// Task format and reward.
    #[serde(default)]
    pub task: GrpoTask,
    /// Prompts per optimizer step, split across ranks.
    #[serde(default = "default_prompts")]
    #[x_kube(validation = Rule::new("self >= 1").message("promptsPerStep must be at least 1"))]
    pub prompts_per_step: u32,
    /// Completions sampled per prompt (the group size G).
    #[serde(default = "default_generations")]
    #[x_kube(validation = Rule::new("self >= 2").message("generationsPerPrompt must be at least 2"))]
    pub generations_per_prompt: u32,
    /// Longest completion, in tokens.
    #[serde(default = "default_max_new_tokens")]
    pub max_new_tokens: u32,
    /// Sampling temperature; log-probabilities are taken from logits / temperature.
    #[serde(default = "default_temperature")]
    pub temperature: f64,
    /// Nucleus sampling threshold. Below 1, the loss's log-probabilities (policy and
    /// reference) are renormalized over the tokens the sampler could draw (the
    /// keep-sampling mask of DeepSeek-V3.2), so both see the same action space.
    #[serde(default = "default_top_p")]
    pub top_p: f64,
    /// KL coefficient β against the frozen reference model (k3 estimator). 0 skips the
    /// reference model entirely.
    #[serde(default = "default_beta")]
    pub beta: f64,
    /// Lower clip ε of the probability ratio.
    #[serde(default = "default_clip")]
    pub clip_epsilon: f64,
    /// Upper clip ε of the ratio; defaults to clipEpsilon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clip_epsilon_high: Option<f64>,
    /// Reward subtracted per completion token. A completion with no answer is charged
    /// for maxNewTokens + 1 tokens, so that it never outscores a wrong answer.
    #[serde(default = "default_length_penalty")]
    pub length_penalty: f64,
    /// Loss aggregation, as TRL's `loss_type`: `grpo` (each completion's token mean,
    /// averaged over completions), `bnpo` (the token mean of each micro-batch, averaged
    /// over micro-batches), `dr_grpo` (the token sum over completions × maxNewTokens) or
    /// `dapo` (the token sum over every completion token of the step on all ranks, so
    /// micro-batch size and rank count do not change the gradient).
    #[serde(default)]
    pub loss_type: LossType,
    /// Advantage scaling: `group` (by the group's std), `batch` (by the batch std) or `none`.
    #[serde(default)]
    pub scale_rewards: ScaleRewards,
    /// Optimizer steps taken on each generated batch (μ). Above 1, later steps are
    /// off-policy and the ratio clip and off-policy masking take effect;
    /// checkpoint.everySteps must then be a multiple of it.
    #[serde(default = "default_iterations")]
    #[x_kube(validation = Rule::new("self >= 1").message("iterations must be at least 1"))]
    pub iterations: u32,
    /// Weight the KL term by the importance ratio π_θ/π_old, which keeps its gradient
    /// unbiased when a batch is reused (DeepSeek-V3.2; TRL's `use_bias_correction_kl`,
    /// on by default there). Off: the plain k3.
    #[serde(default)]
    pub unbiased_kl: bool,
    /// Off-policy sequence masking (DeepSeek-V3.2): a completion with a negative
    /// advantage whose mean log(π_old/π_θ) per token exceeds this is left out of the
    /// policy term of the loss (its β·KL term stays, as in TRL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub off_policy_mask_threshold: Option<f64>,
    /// Leave completions that hit maxNewTokens without ending out of the loss and out of
    /// its token counts (TRL's `mask_truncated_completions`).
    #[serde(default)]
    pub mask_truncated_completions: bool,
    /// Held-out questions for the accuracy evaluation before and after training:
    /// embedded:mcq-rules, embedded:mcq (their held-out questions), or a MedQA, MMLU or
    /// ARC file (jsonl, a JSON array or Parquet; the format is told by its fields) at
    /// s3://, pvc:// or a path. Default: the dataset's validation split (a prepared
    /// dataset's validation records; else one question in 8 by hash, which training
    /// then skips).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = bounds::URI))]
    pub eval_dataset: Option<String>,
    /// More question sets, at most 16, in the same forms as evalDataset, each scored
    /// before and after training beside it: what the RL phase costs on other questions
    /// (e.g. `[embedded:mcq]` for a run trained on embedded:mcq-rules).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = bounds::EVAL_DATASETS), inner(length(max = bounds::URI)))]
    pub eval_datasets: Vec<String>,
    /// Questions the evaluation scores (at most the held-out set's size); 0 skips it.
    #[serde(default = "default_eval_questions")]
    pub eval_questions: u32,
    /// Steps in a row in which at least 90% of the prompt groups got equal rewards for
    /// every completion (so advantage 0: the reward teaches nothing) before the run is
    /// flagged `NoLearningSignal`: the questions are too easy or too hard for the
    /// policy, or the sampling too cold to vary.
    #[serde(default = "default_no_signal_steps")]
    pub no_signal_steps: u32,
}

fn default_no_signal_steps() -> u32 {
    20
}
fn default_iterations() -> u32 {
    1
}
fn default_eval_questions() -> u32 {
    256
}

fn default_prompts() -> u32 {
    8
}
fn default_generations() -> u32 {
    16
}
fn default_max_new_tokens() -> u32 {
    256
}
fn default_temperature() -> f64 {
    1.0
}
fn default_top_p() -> f64 {
    1.0
}
fn default_beta() -> f64 {
    0.04
}
fn default_clip() -> f64 {
    0.2
}
fn default_length_penalty() -> f64 {
    0.01
}

impl GrpoSpec {
    pub fn new(dataset: impl Into<String>) -> Self {
        GrpoSpec {
            dataset: dataset.into(),
            task: GrpoTask::default(),
            prompts_per_step: default_prompts(),
            generations_per_prompt: default_generations(),
            max_new_tokens: default_max_new_tokens(),
            temperature: default_temperature(),
            top_p: default_top_p(),
            beta: default_beta(),
            clip_epsilon: default_clip(),
            clip_epsilon_high: None,
            length_penalty: default_length_penalty(),
            loss_type: LossType::default(),
            scale_rewards: ScaleRewards::default(),
            iterations: default_iterations(),
            unbiased_kl: false,
            off_policy_mask_threshold: None,
            mask_truncated_completions: false,
            eval_dataset: None,
            eval_datasets: Vec::new(),
            eval_questions: default_eval_questions(),
            no_signal_steps: default_no_signal_steps(),
        }
    }
}

/// GRPO task.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum GrpoTask {
    // Four-option multiple choice: reward 1 when the parsed answer letter is the
    // gold letter, minus lengthPenalty per completion token (maxNewTokens + 1 tokens
    // when no letter parses).
    #[default]
    Mcq,
}

/// GRPO loss aggregation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LossType {
    #[default]
    Grpo,
    Bnpo,
    DrGrpo,
    Dapo,
}

/// GRPO advantage scaling.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ScaleRewards {
    #[default]
    Group,
    Batch,
    None,
}
