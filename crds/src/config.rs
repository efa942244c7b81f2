//! `RunConfig`: the resolved run, exactly what the trainer executes. The operator
//! writes it as JSON into the run's ConfigMap; `trainer run` builds it from a
//! manifest with the same [`crate::resolve`].

use serde::{Deserialize, Serialize};

use crate::presets::{ModelConfig, ParamCounts};
use crate::types::{
    Attention, DecayShape, GrpoTask, LossType, OnNaN, OnOutOfMemory, OnStall, Packing, Parallelism, Phase, Precision,
    Rollback, RollbackSkip, ScaleRewards, Schedule,
};

/// Bumped when the RunConfig layout changes incompatibly.
pub const RUN_CONFIG_VERSION: u32 = 1;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunConfig {
    pub version: u32,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub phase: Phase,
    pub seed: u64,
    /// Gang attempt, 1-based. The operator writes it to the run's ConfigMap before it
    /// creates the attempt's Job; the pods learn their attempt nowhere else.
    pub attempt: u32,
    pub model: ModelConfig,
    pub params: ParamCounts,
    pub tokenizer: Location,
    pub precision: Precision,
    /// `spec.parallelism`; absent means ddp, so configs written before it read the same.
    #[serde(default, skip_serializing_if = "Parallelism::is_ddp")]
    pub parallelism: Parallelism,
    pub attention: Attention,
    pub gradient_checkpointing: bool,
    /// With gradient checkpointing, the leading blocks recomputed in backward
    /// (`None`: all of them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpointed_blocks: Option<u32>,
    pub topology: ResolvedTopology,
    pub batch: ResolvedBatch,
    pub schedule: ResolvedSchedule,
    pub optimizer: ResolvedOptimizer,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<ResolvedData>,
    pub checkpoint: ResolvedCheckpoint,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_from: Option<ResolvedInit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpo: Option<ResolvedGrpo>,
    pub failure: ResolvedFailure,
    /// The budget the run's generated data (embedded sources and question sets) is
    /// sized for; absent: this schedule's. A run whose budget changed on resume keeps
    /// the size it started with, so it goes on training on the same data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_sized_for: Option<DataSize>,
    /// Rollbacks after non-finite steps (`status.effective.rollbacks`, joined with a
    /// checkpoint's): the samples the data order skips and the steps at a lowered
    /// learning rate ([`crate::rollback`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rollbacks: Vec<Rollback>,
}

/// A budget, in tokens and in steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DataSize {
    pub tokens: u64,
    pub steps: u64,
}

/// Where bytes live. Parsed from `s3://bucket/prefix`, `pvc://claim/path`,
/// `embedded:<name>` or a plain path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Location {
    S3 { bucket: String, prefix: String },
    Pvc { claim: String, path: String },
    Path { path: String },
    Embedded { name: String },
}

/// The URI a location was written as.
impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::S3 { bucket, prefix } => write!(f, "s3://{bucket}/{prefix}"),
            Location::Pvc { claim, path } => write!(f, "pvc://{claim}/{path}"),
            Location::Path { path } => f.write_str(path),
            Location::Embedded { name } => write!(f, "embedded:{name}"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    Cpu,
    Cuda,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedTopology {
    pub nodes: u32,
    pub gpus_per_node: u32,
    /// Trainer processes per pod: gpusPerNode, or 1 on CPU.
    pub procs_per_node: u32,
    pub world_size: u32,
    pub device: Device,
    /// "4x2"
    pub display: String,
    /// Gradient bucket size for the data-parallel all-reduce.
    #[serde(default = "default_bucket_cap_mb")]
    pub bucket_cap_mb: u32,
    /// How long a collective may take.
    #[serde(default = "default_collective_timeout_seconds")]
    pub collective_timeout_seconds: u64,
    /// `spec.topology.gpuMemory` in bytes: the run was planned to fit it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory_bytes: Option<u64>,
}

impl ResolvedTopology {
    /// How long a rank waits at the rendezvous for the rest of its gang: the collective
    /// timeout, and never less than [`crate::contract::RENDEZVOUS_JOIN_FLOOR_SECONDS`].
    pub fn rendezvous_timeout_seconds(&self) -> u64 {
        self.collective_timeout_seconds.max(crate::contract::RENDEZVOUS_JOIN_FLOOR_SECONDS)
    }
}

fn default_bucket_cap_mb() -> u32 {
    25
}

fn default_collective_timeout_seconds() -> u64 {
    600
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedBatch {
    /// Sequences per forward/backward pass per rank.
    pub micro_batch: u32,
    pub seq_len: u32,
    /// Micro-steps per optimizer step on every rank.
    pub grad_accum: u32,
    /// Sequences per optimizer step, all ranks.
    pub global_sequences: u64,
    /// Tokens per optimizer step, all ranks.
    pub tokens_per_step: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedSchedule {
    /// The spec's budget.
    pub budget_tokens: u64,
    /// Tokens actually trained: totalSteps × tokensPerStep (≤ budget).
    pub total_tokens: u64,
    pub total_steps: u64,
    pub warmup_tokens: u64,
    pub lr: f64,
    pub min_lr: f64,
    pub kind: Schedule,
    /// `schedule: wsd`'s decay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decay: Option<WsdDecay>,
    /// Set when the budget changed on resume and the schedule would otherwise have
    /// jumped: from `tokens` on it continues from the rate the run had reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anchor: Option<LrAnchor>,
}

/// Where a budget change re-anchored the schedule: from `tokens` on, cosine (or wsd's
/// decay) runs from `lr` to `min_lr` at the new end instead of from the peak.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LrAnchor {
    pub tokens: u64,
    pub lr: f64,
}

/// The decay of `schedule: wsd`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WsdDecay {
    /// Fraction of the tokens after warmup spent decaying.
    pub fraction: f64,
    pub shape: DecayShape,
}

/// `optimizer.decayFraction`'s default.
pub const DEFAULT_DECAY_FRACTION: f64 = 0.2;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedOptimizer {
    pub weight_decay: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// 0 disables clipping.
    pub grad_clip: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedData {
    pub mix: Vec<ResolvedSource>,
    /// 0 disables evaluation.
    pub eval_every_steps: u32,
    pub eval_tokens: u64,
    #[serde(default, skip_serializing_if = "Packing::is_concat")]
    pub packing: Packing,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedSource {
    pub name: String,
    pub weight: f64,
    pub uri: String,
    pub location: Location,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedCheckpoint {
    /// Checkpoint directory inside the pod (the PVC mount).
    pub dir: String,
    pub every_steps: u32,
    pub keep_last: u32,
    /// Checkpoints with the lowest validation loss kept besides the newest.
    #[serde(default)]
    pub keep_best: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<ResolvedS3>,
}

/// S3 mirror target. Credentials come from the standard AWS environment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedS3 {
    pub bucket: String,
    pub prefix: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Name of the Secret the operator maps into AWS_* env vars.
    pub secret_name: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum ResolvedInit {
    /// Final checkpoint of another run, mounted read-only at [`crate::contract::INIT_MOUNT`].
    TrainingRun {
        name: String,
    },
    Checkpoint {
        uri: String,
        location: Location,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedGrpo {
    pub dataset: Location,
    pub task: GrpoTask,
    pub prompts_per_step: u32,
    pub generations_per_prompt: u32,
    pub prompts_per_rank: u32,
    pub max_new_tokens: u32,
    pub temperature: f64,
    pub top_p: f64,
    pub beta: f64,
    pub clip_epsilon_low: f64,
    pub clip_epsilon_high: f64,
    pub length_penalty: f64,
    pub loss_type: LossType,
    pub scale_rewards: ScaleRewards,
    pub iterations: u32,
    pub unbiased_kl: bool,
    pub off_policy_mask_threshold: Option<f64>,
    pub mask_truncated_completions: bool,
    /// Held-out questions; `None`: the dataset's own validation split.
    pub eval_dataset: Option<Location>,
    /// More question sets scored before and after training.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub eval_datasets: Vec<Location>,
    pub eval_questions: u32,
    /// Steps in a row without learning signal before `NoLearningSignal`.
    #[serde(default = "default_no_signal_steps")]
    pub no_signal_steps: u32,
}

fn default_no_signal_steps() -> u32 {
    20
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedFailure {
    pub max_restarts: u32,
    pub stall_timeout_seconds: u64,
    pub on_stall: OnStall,
    #[serde(default)]
    pub on_out_of_memory: OnOutOfMemory,
    #[serde(default)]
    pub on_nan: OnNaN,
    #[serde(default)]
    pub max_rollbacks: u32,
    #[serde(default = "one")]
    pub rollback_lr_factor: f64,
    /// Steps past the failing one at the lowered rate.
    #[serde(default)]
    pub rollback_lr_steps: u64,
    #[serde(default)]
    pub rollback_skip: RollbackSkip,
    #[serde(default = "crate::types::default_straggler_factor")]
    pub straggler_factor: f64,
    #[serde(default = "crate::types::default_straggler_readings")]
    pub straggler_readings: u32,
}

fn one() -> f64 {
    1.0
}

impl RunConfig {
    /// Stable hash of [`Self::resume_view`], hex-encoded.
    pub fn fingerprint(&self) -> String {
        use sha2::{Digest, Sha256};
        let json = serde_json::to_vec(&self.resume_view()).expect("RunConfig serializes");
        let digest = Sha256::digest(&json);
        digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
    }

    /// Where this run's [`Self::resume_view`] differs from `other`'s, one
    /// `path: other's value → this run's` per field (JSON paths of the RunConfig).
    pub fn resume_differences(&self, other: &RunConfig) -> Vec<String> {
        let json = |c: &RunConfig| serde_json::to_value(c.resume_view()).expect("RunConfig serializes");
        let mut out = Vec::new();
        json_differences("", &json(other), &json(self), &mut out);
        out
    }

    /// Everything that must match for a checkpoint to be resumed.
    pub fn resume_view(&self) -> RunConfig {
        let mut c = self.clone();
        c.attempt = 0;
        c.failure = ResolvedFailure {
            max_restarts: 0,
            stall_timeout_seconds: 0,
            on_stall: OnStall::Report,
            on_out_of_memory: OnOutOfMemory::Fail,
            on_nan: OnNaN::Fail,
            max_rollbacks: 0,
            rollback_lr_factor: 1.0,
            rollback_lr_steps: 0,
            rollback_skip: RollbackSkip::FailingStep,
            straggler_factor: 0.0,
            straggler_readings: 0,
        };
        // Rollbacks are history the checkpoints carry forward: see `continue_from`.
        c.rollbacks = Vec::new();
        // How ranks talk does not change what they train, nor how many there are: every
        // step trains the same global samples, split over the ranks there are
        // (pretraining; GRPO's check refuses a change, see the trainer's resume).
        c.topology.bucket_cap_mb = 0;
        c.topology.collective_timeout_seconds = 0;
        c.topology.gpu_memory_bytes = None;
        (c.topology.nodes, c.topology.gpus_per_node, c.topology.procs_per_node, c.topology.world_size) = (0, 0, 0, 0);
        c.topology.display = String::new();
        // Nor does how the global batch is computed, so the remedies for running out of
        // memory (a smaller micro-batch, recomputation, another attention kernel) resume:
        // every micro-batch holds micro × seq counted tokens, so any split of the same
        // global batch averages to the same gradient.
        c.batch.micro_batch = 0;
        c.batch.grad_accum = 0;
        c.gradient_checkpointing = false;
        c.checkpointed_blocks = None;
        c.attention = Attention::Auto;
        // Checkpoints hold the consolidated state, whatever the sharding.
        c.parallelism = Parallelism::Ddp;
        // When to checkpoint and evaluate, and how many checkpoints to keep, change
        // nothing that is trained.
        (c.checkpoint.every_steps, c.checkpoint.keep_last, c.checkpoint.keep_best) = (0, 0, 0);
        if let Some(d) = &mut c.data {
            (d.eval_every_steps, d.eval_tokens) = (0, 0);
        }
        // The budget may grow, or shrink to what was trained: see `continue_from`.
        let s = &mut c.schedule;
        (s.budget_tokens, s.total_tokens, s.total_steps, s.warmup_tokens, s.anchor) = (0, 0, 0, 0, None);
        c.data_sized_for = None;
        c
    }

    /// What a checkpoint records of the run that wrote it: all of it but the attempt.
    pub fn record_view(&self) -> RunConfig {
        RunConfig { attempt: 0, ..self.clone() }
    }

    /// Every `path: was → now` between `was`'s [`Self::record_view`] and this run's.
    /// `was` may be an older trainer's record, which held only its resume view (no
    /// topology): then only what that view held is compared.
    pub fn record_differences(&self, was: &RunConfig) -> Vec<String> {
        if was.topology.world_size == 0 {
            return self.resume_differences(was);
        }
        let json = |c: &RunConfig| serde_json::to_value(c.record_view()).expect("RunConfig serializes");
        let mut out = Vec::new();
        json_differences("", &json(was), &json(self), &mut out);
        out
    }

    /// This run (a resolved spec) continuing one that trained `tokens` tokens under
    /// `was`: the schedule continues without a jump ([`ResolvedSchedule::continued`]),
    /// and the generated data keeps the size the run started with. Fails, naming
    /// `spec.tokens`, when the budget is below what was trained.
    pub fn continue_from(&mut self, was: &RunConfig, tokens: u64) -> Result<(), String> {
        self.schedule = self.schedule.continued(&was.schedule, tokens)?;
        let was_size = was.data_size();
        self.data_sized_for = (was_size != self.data_size()).then_some(was_size);
        self.rollbacks = crate::rollback::merge(&self.rollbacks, &was.rollbacks);
        Ok(())
    }

    /// The rollback this run's failure policy asks for after the non-finite step `at` of
    /// `attempt` (an unknown step is taken as the one after `trained`), given the
    /// rollbacks `done` so far; or why the run fails instead (empty under `onNaN: fail`).
    /// The operator and `trainer run` both decide with it; the arithmetic is
    /// [`crate::rollback`]'s.
    pub fn rollback_plan(
        &self,
        done: &[Rollback],
        attempt: u32,
        at: crate::rollback::NonFinite,
        trained: u64,
    ) -> Result<Rollback, String> {
        let f = &self.failure;
        if f.on_nan == OnNaN::Fail {
            return Err(String::new());
        }
        if done.len() as u64 >= u64::from(f.max_rollbacks) {
            return Err(format!(
                "; no rollbacks left after {} (failurePolicy.maxRollbacks {})",
                done.len(),
                f.max_rollbacks
            ));
        }
        let step = at.step.unwrap_or(trained + 1);
        let (skip_from, skip_to) = match (at.samples, f.rollback_skip) {
            (Some(s), RollbackSkip::FailingStep) => (s.from, s.to),
            (Some(s), RollbackSkip::SinceCheckpoint) => (s.checkpoint.min(s.from), s.to),
            (None, _) => (0, 0),
        };
        Ok(Rollback {
            step,
            attempt,
            skip_from,
            skip_to,
            lr_factor: f.rollback_lr_factor,
            lr_until_step: step + f.rollback_lr_steps,
            from_step: None,
        })
    }

    /// The learning rate of optimizer step `step` (1-based), taken after `tokens`
    /// tokens: the schedule's, times the factor of the rollbacks that lower it.
    pub fn lr_at(&self, step: u64, tokens: u64) -> f64 {
        self.schedule.lr_at(tokens) * crate::rollback::lr_factor_at(&self.rollbacks, step)
    }

    /// The budget the generated data is sized for: [`Self::data_sized_for`], else the
    /// schedule's.
    pub fn data_size(&self) -> DataSize {
        self.data_sized_for.unwrap_or(DataSize { tokens: self.schedule.total_tokens, steps: self.schedule.total_steps })
    }

    /// This run at micro-batch `micro`, the accumulation re-derived so that the global
    /// batch stays; fails, naming the numbers, when `micro` does not divide each rank's
    /// sequences.
    pub fn with_micro_batch(&self, micro: u32) -> Result<RunConfig, String> {
        let per_rank = self.batch.global_sequences / u64::from(self.topology.world_size.max(1));
        if micro == 0 || !per_rank.is_multiple_of(u64::from(micro)) {
            return Err(format!("micro-batch {micro} does not divide the {per_rank} sequences of each rank's step"));
        }
        let mut c = self.clone();
        c.batch.micro_batch = micro;
        c.batch.grad_accum = (per_rank / u64::from(micro)) as u32;
        Ok(c)
    }

    /// The micro-batch to try after running out of memory: the largest that divides
    /// each rank's sequences and is at most half the current one; `None` at 1.
    pub fn reduced_micro_batch(&self) -> Option<u32> {
        let per_rank = self.batch.global_sequences / u64::from(self.topology.world_size.max(1));
        (1..=self.batch.micro_batch / 2).rev().find(|m| per_rank.is_multiple_of(u64::from(*m)))
    }

    /// How many leading blocks backward recomputes: 0 without gradient checkpointing.
    pub fn recomputed_blocks(&self) -> u32 {
        recomputed_blocks(self.gradient_checkpointing, self.checkpointed_blocks, self.model.n_layer)
    }

    /// PVC claims the trainer reads data or initial weights from (besides its own).
    pub fn pvc_claims(&self) -> Vec<String> {
        let mut claims: Vec<String> = self
            .data
            .iter()
            .flat_map(|d| d.mix.iter().map(|s| &s.location))
            .chain(std::iter::once(&self.tokenizer))
            .chain(self.grpo.iter().map(|g| &g.dataset))
            .chain(self.init_from.iter().filter_map(|i| match i {
                ResolvedInit::Checkpoint { location, .. } => Some(location),
                ResolvedInit::TrainingRun { .. } => None,
            }))
            .filter_map(|l| match l {
                Location::Pvc { claim, .. } => Some(claim.clone()),
                _ => None,
            })
            .collect();
        claims.sort();
        claims.dedup();
        claims
    }
}

/// The spec field a RunConfig JSON path (as in [`RunConfig::resume_differences`]) is
/// resolved from, for messages that tell users what to change back.
pub fn spec_field(path: &str) -> &'static str {
    const FIELDS: [(&str, &str); 26] = [
        ("batch.globalSequences", "spec.batch.globalTokens"),
        ("batch.tokensPerStep", "spec.batch.globalTokens"),
        ("batch.seqLen", "spec.batch.seqLength"),
        ("batch", "spec.batch"),
        ("schedule.lr", "spec.optimizer.lr"),
        ("schedule.minLr", "spec.optimizer.minLr"),
        ("schedule.kind", "spec.optimizer.schedule"),
        ("schedule.decay", "spec.optimizer.decayFraction"),
        ("schedule.warmupTokens", "spec.optimizer.warmupTokens"),
        ("schedule", "spec.tokens"),
        ("optimizer", "spec.optimizer"),
        ("model", "spec.model"),
        ("params", "spec.model"),
        ("tokenizer", "spec.model.tokenizer"),
        ("phase", "spec.phase"),
        ("seed", "spec.seed"),
        ("precision", "spec.precision"),
        ("data.mix", "spec.data.mix"),
        ("data", "spec.data"),
        ("checkpoint.s3", "spec.checkpoint.s3"),
        ("checkpoint", "spec.checkpoint"),
        ("initFrom", "spec.initFrom"),
        ("grpo", "spec.grpo"),
        ("topology", "spec.topology"),
        ("failure", "spec.failurePolicy"),
        ("rollbacks", "status.effective.rollbacks"),
    ];
    FIELDS
        .iter()
        .find(|(prefix, _)| {
            path.strip_prefix(prefix).is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[', ':']))
        })
        .map_or("spec", |(_, field)| field)
}

/// How many of `n_layer` leading blocks backward recomputes, given
/// `gradientCheckpointing` and `checkpointedBlocks`.
pub fn recomputed_blocks(gradient_checkpointing: bool, checkpointed_blocks: Option<u32>, n_layer: u32) -> u32 {
    match (gradient_checkpointing, checkpointed_blocks) {
        (false, _) => 0,
        (true, Some(n)) => n.min(n_layer),
        (true, None) => n_layer,
    }
}

/// Appends `path: before → after` for every leaf where `before` and `after` differ.
fn json_differences(path: &str, before: &serde_json::Value, after: &serde_json::Value, out: &mut Vec<String>) {
    use serde_json::Value;
    let join = |key: &str| if path.is_empty() { key.to_string() } else { format!("{path}.{key}") };
    match (before, after) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                let (x, y) = (a.get(k).unwrap_or(&Value::Null), b.get(k).unwrap_or(&Value::Null));
                json_differences(&join(k), x, y, out);
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                json_differences(&format!("{path}[{i}]"), x, y, out);
            }
        }
        _ if before != after => out.push(format!("{path}: {before} → {after}")),
        _ => {}
    }
}
