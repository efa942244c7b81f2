//! The `TrainingRun` and `TrainingDataset` custom resources: the single source of truth
//! for the API.
//!
//! The `///` docs on fields are user documentation: `kubectl explain` shows them.

mod data;
mod dataset;
mod failure;
mod grpo;
mod spec;
mod status;

pub use data::*;
pub use dataset::*;
pub use failure::*;
pub use grpo::*;
pub use spec::*;
pub use status::*;

pub const GROUP: &str = "training.puretransformer.dev";
pub const VERSION: &str = "v1alpha1";
pub const KIND: &str = "TrainingRun";

/// Upper bounds on the CRD's strings, lists and maps (`maxLength`, `maxItems`,
/// `maxProperties`). The API server estimates every CEL rule's worst-case cost from
/// them, and refuses a CRD whose rules could cost too much; `tests/schema_bounds.rs`
/// checks that every string, list and map of our own types has one.
pub mod bounds {
    /// A name that is a DNS label (RFC 1123), or a label value.
    pub const DNS_LABEL: usize = 63;
    /// A name that is a DNS subdomain (RFC 1123): Secrets, PVCs, StorageClasses,
    /// PriorityClasses, schedulers, Jobs, pods, nodes.
    pub const DNS_SUBDOMAIN: usize = 253;
    /// A qualified name such as an extended resource name: a DNS-subdomain prefix, '/'
    /// and a name of at most 63 characters.
    pub const QUALIFIED_NAME: usize = DNS_SUBDOMAIN + 1 + DNS_LABEL;
    /// The longest TrainingRun name, what `resolve` accepts: children append suffixes
    /// such as `-a12-3`, and pod hostnames must stay within 63 characters.
    pub const TRAINING_RUN_NAME: usize = 48;
    /// A URI or a path: `s3://…`, `pvc://…`, `embedded:<name>`, a path in the pod, an
    /// endpoint URL.
    pub const URI: usize = 2048;
    /// A container image reference: registry/repository:tag@digest.
    pub const IMAGE: usize = 1024;
    /// A short value: a duration ("1h30m"), a quantity ("80Gi"), a region, an RFC 3339
    /// time, a display string ("42.1%", "3h12m", "4x2").
    pub const SHORT: usize = 64;
    /// A machine-readable reason, as metav1.Condition bounds its own.
    pub const REASON: usize = 1024;
    /// Source URIs of a TrainingDataset's `spec.source.uris`.
    pub const DATASET_URIS: usize = 64;
    /// Failed files listed in a TrainingDataset's `status.failedFiles`.
    pub const FAILED_FILES: usize = 32;
    /// Runs listed in a TrainingDataset's `status.usedBy`.
    pub const DATASET_USERS: usize = 256;
    /// Sources of `spec.data.mix`.
    pub const MIX_SOURCES: usize = 64;
    /// Extra question sets of `spec.grpo.evalDatasets` (and so of
    /// `status.metrics.evalDatasets`).
    pub const EVAL_DATASETS: usize = 16;
    /// Variables of `spec.env`.
    pub const ENV_VARS: usize = 128;
    /// Tolerations of `spec.topology.tolerations`.
    pub const TOLERATIONS: usize = 64;
    /// Labels of `spec.topology.nodeSelector`.
    pub const NODE_SELECTOR_LABELS: usize = 64;
    /// Conditions of `status.conditions`.
    pub const CONDITIONS: usize = 32;
    /// Rollbacks of `status.effective.rollbacks`; at most `spec.failurePolicy.maxRollbacks`
    /// are recorded.
    pub const ROLLBACKS: usize = 256;
}
