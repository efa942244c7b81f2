//! Names, labels and owner references shared by every builder, and the [`Inputs`]
//! the builders take.

use std::collections::BTreeMap;

use crds::{RunConfig, TrainingRun};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};

/// The prefix of every label and annotation key of the operator's own.
pub const KEY_PREFIX: &str = "training.puretransformer.dev/";
/// The Job controller's mark of a pod's completion index (an annotation, and a label).
pub const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";
/// The Job controller's label naming a pod's Job.
pub const JOB_NAME_LABEL: &str = "job-name";
pub const RUN_LABEL: &str = "training.puretransformer.dev/run";
pub const ATTEMPT_LABEL: &str = "training.puretransformer.dev/attempt";
pub const QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";
/// Hash of what the operator last applied, so an unchanged child is never re-applied.
pub const APPLIED_HASH: &str = "training.puretransformer.dev/applied-hash";
/// The applied-hash a live child carries.
pub fn applied_hash<K: Resource>(live: &K) -> Option<String> {
    live.annotations().get(APPLIED_HASH).cloned()
}

/// The applied-hash of a desired child: what it carries once applied.
pub fn hash_of<K: serde::Serialize>(obj: &K) -> String {
    use sha2::{Digest, Sha256};
    let json = serde_json::to_vec(obj).expect("Kubernetes objects serialize");
    Sha256::digest(&json).iter().take(12).map(|b| format!("{b:02x}")).collect()
}

/// On a Job the operator suspended for `spec.suspend`; a Job suspended without it
/// (by Kueue) is never un-suspended by the operator.
pub const SUSPENDED_BY_OPERATOR: &str = "training.puretransformer.dev/suspended-by-operator";
/// Name of the trainer container, used by the Job's podFailurePolicy.
pub const CONTAINER: &str = "trainer";

/// What every builder needs: the run, its resolved config and the operator's settings.
pub struct Inputs<'a> {
    pub run: &'a TrainingRun,
    /// The resolved run, with `attempt` set to the current attempt.
    pub cfg: &'a RunConfig,
    pub trainer_image: &'a str,
}

impl Inputs<'_> {
    pub fn name(&self) -> String {
        self.run.name_any()
    }

    pub fn namespace(&self) -> Option<String> {
        self.run.namespace()
    }

    /// Metadata shared by every child: name, namespace, labels and (unless
    /// `owned` is false) a controller owner reference to the run.
    pub(super) fn meta(&self, name: String, component: &str, owned: bool) -> ObjectMeta {
        ObjectMeta {
            name: Some(name),
            namespace: self.namespace(),
            labels: Some(labels(&self.name(), component)),
            owner_references: owned.then(|| owner_reference(self.run)).flatten().map(|o| vec![o]),
            ..Default::default()
        }
    }
}

pub fn service_name(run: &str) -> String {
    run.to_string()
}

pub fn configmap_name(run: &str) -> String {
    format!("{run}-config")
}

pub fn pvc_name(run: &str) -> String {
    format!("{run}-checkpoints")
}

/// One Job per attempt, so a gang restart never waits on a name.
pub fn job_name(run: &str, attempt: u32) -> String {
    format!("{run}-a{attempt}")
}

/// The label on every object the operator creates, with [`crate::MANAGER`] as its value.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";

/// The label selector of every object the operator creates (its stores' watches).
pub fn owned_selector() -> String {
    format!("{MANAGED_BY}={}", crate::MANAGER)
}

/// Standard `app.kubernetes.io/*` labels plus the run label.
pub fn labels(run: &str, component: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".into(), "trainingrun".into()),
        ("app.kubernetes.io/instance".into(), run.into()),
        ("app.kubernetes.io/component".into(), component.into()),
        (MANAGED_BY.into(), crate::MANAGER.into()),
        (RUN_LABEL.into(), run.into()),
    ])
}

/// The label selector of every pod of a run, all attempts.
pub fn run_selector(run: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(RUN_LABEL.into(), run.into())])
}

/// Foreground deletion of the run waits for its children.
fn owner_reference(run: &TrainingRun) -> Option<OwnerReference> {
    run.controller_owner_ref(&()).map(|o| OwnerReference { block_owner_deletion: Some(true), ..o })
}

/// Whether `obj` is controlled by `run` (by uid).
pub fn owned_by<K: Resource>(obj: &K, run: &TrainingRun) -> bool {
    let uid = run.meta().uid.as_deref();
    uid.is_some() && obj.owner_references().iter().any(|o| Some(o.uid.as_str()) == uid && o.controller == Some(true))
}
