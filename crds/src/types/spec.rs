//! What a run asks for: the spec and every part of it but GRPO's.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, EnvVar, ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{DataSpec, FailurePolicy, GrpoSpec, TrainingRunStatus, bounds};
use crate::quantity::TokenQuantity;

/// Desired state of a TrainingRun.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "training.puretransformer.dev",
    version = "v1alpha1",
    kind = "TrainingRun",
    plural = "trainingruns",
    singular = "trainingrun",
    shortname = "tr",
    category = "all",
    namespaced,
    status = "TrainingRunStatus",
    doc = "TrainingRun declares one LLM training run: a model, a token budget, a weighted data mix and a GPU topology. The operator turns it into a ConfigMap, a headless Service, a checkpoint PVC and an Indexed Job with one pod per node, and keeps its status true.",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Model","type":"string","jsonPath":".spec.model.preset"}"#,
    printcolumn = r#"{"name":"Topology","type":"string","jsonPath":".status.topology"}"#,
    printcolumn = r#"{"name":"Progress","type":"string","jsonPath":".status.progress.display"}"#,
    printcolumn = r#"{"name":"Loss","type":"number","jsonPath":".status.metrics.loss","format":"float"}"#,
    printcolumn = r#"{"name":"Tokens/s","type":"integer","jsonPath":".status.metrics.tokensPerSecond"}"#,
    printcolumn = r#"{"name":"ETA","type":"string","jsonPath":".status.progress.eta"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Attempt","type":"integer","jsonPath":".status.attempt","priority":1}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.reason","priority":1}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.grpo) == (self.phase == 'grpo')").message("spec.grpo must be set exactly when spec.phase is grpo").field_path(".grpo"),
    validation = Rule::new("self.phase != 'pretrain' || has(self.data)").message("spec.data is required when spec.phase is pretrain").field_path(".data"),
    validation = Rule::new("self.phase != 'pretrain' || has(self.batch.globalTokens)").message("spec.batch.globalTokens is required when spec.phase is pretrain").field_path(".batch.globalTokens"),
)]
pub struct TrainingRunSpec {
    /// What this run does: `pretrain` (next-token prediction on the data mix) or
    /// `grpo` (GRPO fine-tuning on multiple-choice questions, see `grpo`).
    /// Immutable after creation.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self == oldSelf").message("phase is immutable"))]
    pub phase: Phase,

    /// The model architecture: a preset and optional overrides. Immutable after creation.
    #[x_kube(validation = Rule::new("self == oldSelf").message("model is immutable"))]
    pub model: ModelSpec,

    /// Token budget of the run: an integer or a string with a K, M, B or T
    /// suffix, e.g. "11B" or "600M". Training runs floor(tokens / batch.globalTokens) steps.
    /// May grow, or shrink to no less than what was trained, while the run trains (the
    /// gang restarts from its checkpoint under the new budget; the learning rate goes
    /// on from where it is), and may grow after it succeeded (it trains on).
    pub tokens: TokenQuantity,

    /// Training data: a weighted mix of sources and the validation schedule.
    /// Required for pretrain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<DataSpec>,

    /// GPU topology: nodes × GPUs per node, and where the pods may run. nodes and
    /// gpusPerNode may change while a pretraining run trains, when batch.globalTokens
    /// still divides over the new world: the gang restarts at the new size from its
    /// checkpoint, not counted against failurePolicy.maxRestarts.
    #[serde(default)]
    pub topology: Topology,

    /// Batch geometry. Gradient accumulation is derived from it, never given.
    pub batch: BatchSpec,

    /// AdamW and its learning-rate schedule.
    #[serde(default)]
    pub optimizer: OptimizerSpec,

    /// Numeric precision: `bf16-mixed` (f32 master weights, bf16 autocast on CUDA),
    /// `bf16` (everything in bf16) or `f32`.
    #[serde(default)]
    pub precision: Precision,

    /// How the data-parallel ranks hold the training state. `ddp`: every rank keeps
    /// the whole model, its gradients and both AdamW moments. `zero1` (ZeRO stage 1):
    /// the AdamW moments are sharded, each rank keeping 1/world of them and updating
    /// only its shard, after which the updated parameters are all-gathered; gradients
    /// are all-reduced as under ddp. `zero2` (ZeRO stage 2): as zero1, and gradients
    /// are reduce-scattered, so between steps each rank keeps only its 1/world of them
    /// too. `fsdp` (ZeRO stage 3, pretraining only): as zero2, and the parameters are
    /// sharded as well: a block's are all-gathered just before it runs, forward and
    /// again in backward, and freed after, the next block's gathered while one
    /// computes. The losses are ddp's, and checkpoints do not depend on it, so it may
    /// change when a run resumes.
    #[serde(default)]
    pub parallelism: Parallelism,

    /// Scaled-dot-product attention backend. `auto`: on CUDA the trainer times flash and
    /// cuDNN on the run's attention shapes at start-up, checks each against f32 math
    /// attention, and keeps the fastest (on CPU, PyTorch chooses). `flash`, `cudnn` or
    /// `math` force one, and the run fails if it cannot run.
    #[serde(default)]
    pub attention: Attention,

    /// Recompute each transformer block during backward, trading about a third more
    /// compute for much less activation memory.
    #[serde(default)]
    pub gradient_checkpointing: bool,

    /// With gradientCheckpointing: how many transformer blocks, counted from the first,
    /// recompute their activations in backward; the others keep them. Fewer blocks
    /// recompute less (about a third of a block's step time each) and hold more memory.
    /// Default: every block. May change when a run is recreated and resumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpointed_blocks: Option<u32>,

    /// Seed for weight initialization and the data order. Same seed, same run.
    #[serde(default = "default_seed")]
    pub seed: u64,

    /// Checkpointing: cadence, retention, the checkpoint PVC and an optional S3 mirror.
    #[serde(default)]
    pub checkpoint: CheckpointSpec,

    /// Start from existing weights: another TrainingRun's final checkpoint, or a
    /// checkpoint URI. Loads weights only; optimizer and data position start fresh.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_from: Option<InitFrom>,

    /// GRPO settings. Required when phase is grpo, forbidden otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpo: Option<GrpoSpec>,

    /// Trainer container image. Defaults to the operator's configured trainer image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = bounds::IMAGE))]
    pub image: Option<String>,

    /// Image pull policy of the trainer container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,

    /// Extra environment for every trainer process, e.g. NCCL settings. These
    /// override the defaults the operator sets (NCCL_IB_DISABLE=0,
    /// NCCL_NET_GDR_LEVEL=5, CUDA_DEVICE_MAX_CONNECTIONS=1).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    #[schemars(length(max = bounds::ENV_VARS))]
    pub env: Vec<EnvVar>,

    /// When a failed attempt is retried, and when a run counts as stalled.
    #[serde(default)]
    pub failure_policy: FailurePolicy,

    /// Suspend the run: the Job is suspended and its pods removed; resuming
    /// continues from the last checkpoint.
    #[serde(default)]
    pub suspend: bool,

    /// PriorityClass of the trainer pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = bounds::DNS_SUBDOMAIN))]
    pub priority_class_name: Option<String>,

    /// Scheduler of the trainer pods, e.g. a gang scheduler.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = bounds::DNS_SUBDOMAIN))]
    pub scheduler_name: Option<String>,

    /// Kueue LocalQueue. Copied to the Job's `kueue.x-k8s.io/queue-name` label; the
    /// Job is created suspended and Kueue admits (un-suspends) it when quota allows.
    /// Meanwhile the run is Pending (WaitingForQueue) with the Queued condition naming
    /// the queue. An eviction by Kueue (preemption) is a disruption, not a failure:
    /// the run waits in the queue again and resumes from its last checkpoint, with no
    /// restart counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = bounds::DNS_LABEL))]
    pub queue_name: Option<String>,

    /// Delete the finished Job this many seconds after the run ends. The
    /// TrainingRun and its checkpoints stay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0").message("must not be negative"))]
    pub ttl_seconds_after_finished: Option<i32>,
}

fn default_seed() -> u64 {
    1337
}

/// What a run does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    // Next-token prediction on the data mix.
    #[default]
    Pretrain,
    // GRPO fine-tuning on multiple-choice questions.
    Grpo,
}

/// A model preset plus optional overrides.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelSpec {
    /// Preset name: nano, micro, tiny, small, medium, medium-large, large, xlarge,
    /// llama2-1.36b, llama3-1.5b, llama3-2.2b, qwen3-1.8b, gpt2-1.36b or gpt2-1b.
    /// `trainer presets` lists their sizes.
    #[schemars(length(max = bounds::DNS_LABEL))]
    pub preset: String,
    /// Override the number of transformer blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers: Option<u32>,
    /// Override the residual width.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub d_model: Option<u32>,
    /// Override the number of query heads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heads: Option<u32>,
    /// Override the number of key/value heads (grouped-query attention). Must divide heads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_heads: Option<u32>,
    /// Override the head width. Defaults to dModel / heads when dModel or heads is overridden.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub d_head: Option<u32>,
    /// Override the MLP hidden width.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub d_ff: Option<u32>,
    /// Override the vocabulary size. Must hold every id of the tokenizer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocab_size: Option<u32>,
    /// Override the RoPE base θ (llama and qwen3 only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    /// Override the context length: the RoPE table or the number of learned positions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq_length: Option<u32>,
    /// Tokenizer: `embedded` (the byte-level BPE compiled into the trainer), or the
    /// URI of a Hugging Face tokenizer.json (s3://, pvc://claim/path or a path).
    #[serde(default = "default_tokenizer")]
    #[schemars(length(max = bounds::URI))]
    pub tokenizer: String,
}

fn default_tokenizer() -> String {
    "embedded".into()
}

/// Nodes × GPUs per node, and pod placement.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Topology {
    /// Number of nodes: one pod per node, in an Indexed Job.
    #[serde(default = "one")]
    #[x_kube(validation = Rule::new("self >= 1").message("nodes must be at least 1"))]
    pub nodes: u32,
    /// GPUs per node, one trainer process each. 0 runs one process per pod on CPU
    /// (Gloo); locally, `trainer run` starts max(gpusPerNode, 1) processes.
    #[serde(default = "one")]
    pub gpus_per_node: u32,
    /// Extended resource name of a GPU.
    #[serde(default = "default_gpu_resource")]
    #[schemars(length(max = bounds::QUALIFIED_NAME))]
    pub gpu_resource_name: String,
    /// CPU and memory of each pod. GPU limits are added from gpusPerNode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Node labels the pods require.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend(
        "maxProperties" = bounds::NODE_SELECTOR_LABELS,
        "additionalProperties" = {"type": "string", "maxLength": bounds::DNS_LABEL}
    ))]
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations of the pods, e.g. for tainted GPU nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = bounds::TOLERATIONS))]
    pub tolerations: Vec<Toleration>,
    /// Affinity of the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Size of the flat gradient buckets that data parallelism all-reduces while
    /// backward runs, in MiB (torch DDP's bucket_cap_mb).
    #[serde(default = "default_bucket_cap_mb", rename = "bucketCapMB")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 1024").message("bucketCapMB must be between 1 and 1024"))]
    pub bucket_cap_mb: u32,
    /// Memory of each GPU, as a Kubernetes quantity (e.g. "48Gi" for an A6000, "80Gi"
    /// for an A100 or H100). When set, the run is planned per rank before anything
    /// starts (what `trainer plan` prints) and refused if it cannot fit, naming the
    /// changes that would make it fit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = bounds::SHORT))]
    pub gpu_memory: Option<String>,
    /// How long each collective may take before the ranks give up with reason
    /// CollectiveTimeout (a retriable failure), e.g. "10m". A rank that dies makes the
    /// others fail within this time. The rendezvous at the start of each attempt waits
    /// for the whole gang this long, and never less than 5m, so that pods that start
    /// apart are not a failure.
    #[serde(default = "default_collective_timeout")]
    #[schemars(length(max = bounds::SHORT))]
    pub collective_timeout: String,
}

fn default_bucket_cap_mb() -> u32 {
    25
}

fn default_collective_timeout() -> String {
    "10m".into()
}

fn one() -> u32 {
    1
}

fn default_gpu_resource() -> String {
    "nvidia.com/gpu".into()
}

impl Default for Topology {
    fn default() -> Self {
        Topology {
            nodes: 1,
            gpus_per_node: 1,
            gpu_resource_name: default_gpu_resource(),
            resources: None,
            node_selector: BTreeMap::new(),
            tolerations: Vec::new(),
            affinity: None,
            bucket_cap_mb: default_bucket_cap_mb(),
            gpu_memory: None,
            collective_timeout: default_collective_timeout(),
        }
    }
}

/// Batch geometry.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct BatchSpec {
    /// Tokens per optimizer step across all ranks, e.g. 131072 or "512K". Must be a
    /// multiple of microBatch × seqLength × world size; the quotient is the gradient
    /// accumulation. Pretrain only: a GRPO step is grpo.promptsPerStep ×
    /// grpo.generationsPerPrompt completions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_tokens: Option<TokenQuantity>,
    /// Sequences per forward/backward pass on each GPU.
    #[x_kube(validation = Rule::new("self >= 1").message("microBatch must be at least 1"))]
    pub micro_batch: u32,
    /// Tokens per training sequence (for GRPO: prompt plus completion). Defaults to the
    /// model's context length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq_length: Option<u32>,
}

/// AdamW with linear warmup and a decay schedule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct OptimizerSpec {
    /// Peak learning rate. Default 3e-4 for pretrain, 1e-5 for grpo.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr: Option<f64>,
    /// Final learning rate of the cosine decay. Default lr / 10 for pretrain (3e-5 with
    /// the default lr), lr for grpo.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_lr: Option<f64>,
    /// Tokens of linear warmup from 0 to lr. Default: min(100M, tokens / 20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup_tokens: Option<TokenQuantity>,
    /// Decoupled weight decay, applied to 2-D weights only (not norms, biases or embeddings' norms).
    #[serde(default = "default_weight_decay")]
    pub weight_decay: f64,
    /// Adam β1 and β2.
    #[serde(default = "default_betas")]
    #[schemars(length(min = 2, max = 2))]
    pub betas: Vec<f64>,
    /// Adam ε.
    #[serde(default = "default_eps")]
    pub eps: f64,
    /// Clip the global gradient norm to this value; 0 disables clipping.
    #[serde(default = "default_grad_clip")]
    pub grad_clip: f64,
    /// Learning-rate schedule after warmup: `cosine` decays to minLr at the token
    /// budget; `constant` stays at lr; `wsd` (warmup–stable–decay) stays at lr and then
    /// decays to minLr over the last `decayFraction` of the tokens after warmup, so a
    /// budget grown before the decay begins changes nothing already trained.
    #[serde(default)]
    pub schedule: Schedule,
    /// With `schedule: wsd`: the fraction of the tokens after warmup spent decaying
    /// (default 0.2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decay_fraction: Option<f64>,
    /// With `schedule: wsd`: `linear` (default) or `1-sqrt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decay_shape: Option<DecayShape>,
}

fn default_weight_decay() -> f64 {
    0.1
}
fn default_betas() -> Vec<f64> {
    vec![0.9, 0.95]
}
fn default_eps() -> f64 {
    1e-8
}
fn default_grad_clip() -> f64 {
    1.0
}

impl Default for OptimizerSpec {
    fn default() -> Self {
        OptimizerSpec {
            lr: None,
            min_lr: None,
            warmup_tokens: None,
            weight_decay: default_weight_decay(),
            betas: default_betas(),
            eps: default_eps(),
            grad_clip: default_grad_clip(),
            schedule: Schedule::default(),
            decay_fraction: None,
            decay_shape: None,
        }
    }
}

/// Learning-rate schedule after warmup.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Schedule {
    #[default]
    Cosine,
    Constant,
    /// Warmup, stable at lr, then a decay to minLr over the last `decayFraction` of the
    /// tokens after warmup.
    Wsd,
}

/// How `schedule: wsd` decays from lr to minLr.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum DecayShape {
    /// Linearly in the tokens of the decay.
    #[default]
    #[serde(rename = "linear")]
    Linear,
    /// lr − (lr − minLr)·√p after a fraction p of the decay (the "1-sqrt" cooldown).
    #[serde(rename = "1-sqrt")]
    OneMinusSqrt,
}

/// Numeric precision.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Precision {
    // f32 master weights and optimizer, bf16 autocast for matmuls on CUDA.
    #[default]
    #[serde(rename = "bf16-mixed")]
    Bf16Mixed,
    // Weights, gradients and optimizer state in bf16.
    #[serde(rename = "bf16")]
    Bf16,
    // Everything in f32.
    #[serde(rename = "f32")]
    F32,
}

/// How data-parallel ranks hold the training state; see `spec.parallelism`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Parallelism {
    /// Replicated: every rank holds everything.
    #[default]
    Ddp,
    /// ZeRO stage 1: the optimizer state is sharded over the ranks.
    Zero1,
    /// ZeRO stage 2: the optimizer state and the gradients are sharded over the ranks.
    Zero2,
    /// Fully sharded (ZeRO stage 3): the parameters too, gathered a block at a time.
    Fsdp,
}

impl Parallelism {
    pub fn is_ddp(&self) -> bool {
        *self == Parallelism::Ddp
    }
}

/// SDPA backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Attention {
    #[default]
    Auto,
    Flash,
    Cudnn,
    Math,
}

/// Checkpointing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointSpec {
    /// Save every this many optimizer steps; a checkpoint is also saved at the end
    /// and on SIGTERM. May change while the run trains, as may keepLast.
    #[serde(default = "default_every_steps")]
    #[x_kube(validation = Rule::new("self >= 1").message("everySteps must be at least 1"))]
    pub every_steps: u32,
    /// Keep this many most recent checkpoints; older ones are deleted.
    #[serde(default = "default_keep_last")]
    #[x_kube(validation = Rule::new("self >= 1").message("keepLast must be at least 1"))]
    pub keep_last: u32,
    /// Also keep the this many checkpoints with the lowest validation loss (the mix's,
    /// measured at the checkpoint's step), besides the newest keepLast: rotation never
    /// deletes them. The lowest is `best` beside `latest` in the checkpoint directory
    /// and `status.bestCheckpoint`; resuming still starts from the newest. Needs
    /// validation at every checkpoint (data.validation.everySteps dividing everySteps)
    /// and phase pretrain. 0 keeps none. May change while the run trains.
    #[serde(default)]
    pub keep_best: u32,
    /// Keep the checkpoint PVC when the TrainingRun is deleted.
    #[serde(default)]
    pub retain_on_delete: bool,
    /// Size of the checkpoint PVC.
    #[serde(default = "default_pvc_size")]
    pub size: Quantity,
    /// StorageClass of the checkpoint PVC; the cluster default when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = bounds::DNS_SUBDOMAIN))]
    pub storage_class_name: Option<String>,
    /// Access mode of the checkpoint PVC. Default ReadWriteMany when nodes > 1,
    /// else ReadWriteOnce.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_mode: Option<AccessMode>,
    /// Mirror every finished checkpoint to S3, and resume from it when the PVC is empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Mirror>,
}

fn default_every_steps() -> u32 {
    1000
}
fn default_keep_last() -> u32 {
    3
}
fn default_pvc_size() -> Quantity {
    Quantity("100Gi".into())
}

impl Default for CheckpointSpec {
    fn default() -> Self {
        CheckpointSpec {
            every_steps: default_every_steps(),
            keep_last: default_keep_last(),
            keep_best: 0,
            retain_on_delete: false,
            size: default_pvc_size(),
            storage_class_name: None,
            access_mode: None,
            s3: None,
        }
    }
}

/// PersistentVolumeClaim access mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum AccessMode {
    ReadWriteOnce,
    ReadWriteMany,
    ReadWriteOncePod,
}

/// An S3 (or S3-compatible) checkpoint mirror.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct S3Mirror {
    /// Destination prefix, `s3://bucket/prefix`.
    #[x_kube(validation = Rule::new("self.startsWith('s3://')").message("uri must start with s3://"))]
    #[schemars(length(max = bounds::URI))]
    pub uri: String,
    /// Endpoint of an S3-compatible store, e.g. https://minio.example:9000.
    /// Path-style addressing is used when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = bounds::URI))]
    pub endpoint: Option<String>,
    /// Region of the bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = bounds::SHORT))]
    pub region: Option<String>,
    /// Secret holding AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and optionally
    /// AWS_SESSION_TOKEN). Credentials are never written inline.
    pub secret_ref: SecretRef,
}

/// A Secret in the run's namespace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretRef {
    /// Name of the Secret.
    #[schemars(length(min = 1, max = bounds::DNS_SUBDOMAIN))]
    pub name: String,
}

/// Where initial weights come from. Exactly one field is set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.trainingRun) != has(self.uri)").message("set exactly one of initFrom.trainingRun and initFrom.uri"))]
pub struct InitFrom {
    /// Name of a TrainingRun in the same namespace. This run waits until it has
    /// Succeeded, then mounts its checkpoint PVC read-only and loads its final weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = bounds::TRAINING_RUN_NAME))]
    pub training_run: Option<String>,
    /// A checkpoint directory: `s3://bucket/prefix/step-000100`, `pvc://claim/path` or a path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = bounds::URI))]
    pub uri: Option<String>,
}

/// Image pull policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}
