//! The `TrainingDataset` resource: raw documents the operator prepares into shards once,
//! in parallel and resumably, for every run whose mix names it.

use k8s_openapi::api::core::v1::{EnvVar, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{PullPolicy, bounds};
use crate::quantity::TokenQuantity;

/// Desired state of a TrainingDataset.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "training.puretransformer.dev",
    version = "v1alpha1",
    kind = "TrainingDataset",
    plural = "trainingdatasets",
    singular = "trainingdataset",
    shortname = "tds",
    category = "all",
    namespaced,
    status = "TrainingDatasetStatus",
    doc = "TrainingDataset declares raw documents (Parquet, JSONL, text, MedQA records) and how to tokenize them. The operator prepares them into shards once, with spec.workers pods in an Indexed Job, resumably, and a TrainingRun whose data.mix names the dataset waits until it is Ready, then reads its manifest.",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Progress","type":"string","jsonPath":".status.progress.display"}"#,
    printcolumn = r#"{"name":"Tokens","type":"string","jsonPath":".status.progress.tokensDisplay"}"#,
    printcolumn = r#"{"name":"Shards","type":"integer","jsonPath":".status.shards"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Workers","type":"integer","jsonPath":".spec.workers","priority":1}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.reason","priority":1}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.output.startsWith('s3://') || self.output.startsWith('pvc://')").message("output must be s3://bucket/prefix or pvc://claim/path").field_path(".output"),
)]
pub struct TrainingDatasetSpec {
    /// Where the raw documents are, and how to read them. Immutable: a dataset's
    /// manifest describes one input.
    #[x_kube(validation = Rule::new("self == oldSelf").message("source is immutable"))]
    pub source: DatasetSource,

    /// The tokenizer: a tokenizer.json, the trainer's embedded one, or one trained on a
    /// sample of the source first. Immutable.
    #[x_kube(validation = Rule::new("self == oldSelf").message("tokenizer is immutable"))]
    pub tokenizer: DatasetTokenizer,

    /// Where the shards and the manifest go: `s3://bucket/prefix` or `pvc://claim/path`
    /// (a claim every worker can mount, ReadWriteMany across nodes). Immutable.
    #[schemars(length(min = 1, max = bounds::URI))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("output is immutable"))]
    pub output: String,

    /// Pods preparing the files in parallel, each a share of the files balanced by size.
    /// May change while the dataset prepares: the files already prepared are kept.
    #[serde(default = "one")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 256").message("workers must be in [1, 256]"))]
    pub workers: u32,

    /// Share of documents held out for validation, in [0, 1), chosen per document by a
    /// seeded hash: the same documents whatever the worker count.
    #[serde(default = "default_validation_fraction")]
    #[x_kube(validation = Rule::new("self >= 0.0 && self < 1.0").message("validationFraction must be in [0, 1)"))]
    pub validation_fraction: f64,

    /// Seed of the validation split.
    #[serde(default)]
    pub seed: u64,

    /// Tokens per shard, e.g. "100M".
    #[serde(default = "default_shard_tokens")]
    pub shard_tokens: TokenQuantity,

    /// Input files that may fail (unreadable, a missing column, invalid UTF-8 beyond
    /// 0.1% of a text file), their documents left out and each named in
    /// status.failedFiles, before the dataset fails.
    #[serde(default)]
    pub max_failed_files: u32,

    /// Times a worker pod may fail (killed, evicted, out of memory) before the dataset
    /// fails. A retried worker skips the files it already prepared.
    #[serde(default = "default_max_retries")]
    pub max_retries: u32,

    /// CPU and memory of each worker pod. A worker encodes on every core it has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// Trainer container image. Defaults to the operator's configured trainer image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = bounds::IMAGE))]
    pub image: Option<String>,

    /// Image pull policy of the worker container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,

    /// Extra environment for every worker, e.g. AWS_ENDPOINT_URL and credentials from
    /// a Secret for an S3 source or output.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    #[schemars(length(max = bounds::ENV_VARS))]
    pub env: Vec<EnvVar>,
}

fn one() -> u32 {
    1
}

fn default_validation_fraction() -> f64 {
    0.005
}

fn default_shard_tokens() -> TokenQuantity {
    TokenQuantity::Text("100M".into())
}

fn default_max_retries() -> u32 {
    3
}

/// Where the raw documents are.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct DatasetSource {
    /// Files or directories: `s3://bucket/prefix` or `pvc://claim/path`, each ending in
    /// an optional glob of file names (`s3://fineweb/edu/*.parquet`,
    /// `pvc://raw/usmle/**/*.jsonl`), or `https://` URLs of single files. Listed once,
    /// sorted.
    #[schemars(length(min = 1, max = bounds::DATASET_URIS), inner(length(min = 1, max = bounds::URI)))]
    #[x_kube(validation = Rule::new("self.all(u, u.startsWith('s3://') || u.startsWith('pvc://') || u.startsWith('https://'))").message("each source uri must start with s3://, pvc:// or https://"))]
    pub uris: Vec<String>,
    /// How the files are read; `auto` decides per file (`.parquet`; `.jsonl`, `.json`,
    /// `.ndjson` with MedQA records detected by their fields; anything else as text).
    #[serde(default)]
    pub format: SourceFormat,
    /// The JSONL field or Parquet column holding the text.
    #[serde(default = "default_field")]
    #[schemars(length(min = 1, max = bounds::DNS_SUBDOMAIN))]
    pub field: String,
}

fn default_field() -> String {
    "text".into()
}

/// How a source's files are read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SourceFormat {
    #[default]
    Auto,
    Jsonl,
    Parquet,
    Text,
    Medqa,
}

/// The tokenizer of a dataset. Exactly one field is set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("[has(self.uri), has(self.embedded) && self.embedded, has(self.train)].filter(x, x).size() == 1").message("set exactly one of tokenizer.uri, tokenizer.embedded and tokenizer.train"))]
pub struct DatasetTokenizer {
    /// A Hugging Face tokenizer.json: `s3://…`, `pvc://claim/path` or `https://…`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = bounds::URI))]
    pub uri: Option<String>,
    /// The trainer's embedded byte-level BPE (4,096 tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedded: Option<bool>,
    /// Train a byte-level BPE on the first documents of the source, in one pod, before
    /// the workers start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train: Option<TrainTokenizer>,
}

/// A tokenizer trained on the source.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrainTokenizer {
    /// Vocabulary size, special tokens included.
    #[x_kube(validation = Rule::new("self >= 260 && self <= 1048576").message("vocabSize must be in [260, 1048576]"))]
    pub vocab_size: u32,
    /// How much text, from the start of the sorted files, it is trained on, e.g. "256M"
    /// (bytes).
    #[serde(default = "default_sample_bytes")]
    pub sample_bytes: TokenQuantity,
}

fn default_sample_bytes() -> TokenQuantity {
    TokenQuantity::Text("256M".into())
}

/// Observed state of a TrainingDataset, written only by the operator.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrainingDatasetStatus {
    /// Pending, Preparing, Ready or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<DatasetPhase>,
    /// Reason of the latest phase change, e.g. TrainingTokenizer, Merging, FilesFailed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = bounds::REASON))]
    pub reason: Option<String>,
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Accepted, Preparing, Ready, Failed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    #[schemars(length(max = bounds::CONDITIONS))]
    pub conditions: Vec<Condition>,
    /// Preparation progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<DatasetProgress>,
    /// Shards in the manifest, once Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards: Option<u64>,
    /// The dataset's manifest, once Ready: what a run's mix entry resolves to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest: Option<DatasetManifest>,
    /// Input files that failed, each with its error (at most 32 are listed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = bounds::FAILED_FILES))]
    pub failed_files: Vec<FailedFile>,
    /// Worker pods that failed and were retried.
    #[serde(default)]
    pub retries: u32,
    /// The TrainingRuns whose mix names this dataset.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = bounds::DATASET_USERS), inner(length(max = bounds::TRAINING_RUN_NAME)))]
    pub used_by: Vec<String>,
}

/// Lifecycle phase of a dataset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum DatasetPhase {
    Pending,
    Preparing,
    Ready,
    Failed,
}

/// How far the preparation is.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct DatasetProgress {
    /// Input files prepared (or failed).
    pub files_done: u64,
    /// Input files listed.
    pub files_total: u64,
    /// Input bytes prepared.
    pub bytes_done: u64,
    /// Input bytes listed.
    pub bytes_total: u64,
    /// Tokens written so far, train and validation.
    pub tokens: u64,
    /// Tokens written per second, over the workers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_second: Option<f64>,
    /// Estimated seconds to completion at the current rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_seconds: Option<u64>,
    /// Progress for display, e.g. "42.1%".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = bounds::SHORT))]
    pub display: Option<String>,
    /// Tokens for display, e.g. "1.2B".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = bounds::SHORT))]
    pub tokens_display: Option<String>,
}

/// Where a Ready dataset's manifest is, and its digest.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct DatasetManifest {
    /// The prepared source's URI (the directory of manifest.json).
    #[schemars(length(max = bounds::URI))]
    pub uri: String,
    /// SHA-256 of manifest.json, hex.
    #[schemars(length(max = bounds::SHORT))]
    pub sha256: String,
    /// Train tokens in the manifest.
    pub train_tokens: u64,
    /// Validation tokens in the manifest.
    pub validation_tokens: u64,
    /// The tokenizer's hash: runs mixing datasets need one tokenizer.
    #[schemars(length(max = bounds::SHORT))]
    pub tokenizer_hash: String,
}

/// An input file that failed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailedFile {
    /// The file's path below its source URI.
    #[schemars(length(max = bounds::URI))]
    pub file: String,
    /// Why it failed.
    #[schemars(length(max = bounds::REASON))]
    pub error: String,
}
