//! Pure builders: one function per Kubernetes kind, the run in, the object out.
//! Names, labels and owner references are defined here once.

pub mod configmap;
pub mod job;
pub mod networkpolicy;
pub mod pvc;
pub mod service;

use std::collections::BTreeMap;

use crds::{RunConfig, TrainingRun};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};

pub use configmap::configmap;
pub use job::{job, suspension};
pub use networkpolicy::network_policy;
pub use pvc::pvc;
pub use service::service;

pub const RUN_LABEL: &str = "training.puretransformer.dev/run";
pub const ATTEMPT_LABEL: &str = "training.puretransformer.dev/attempt";
pub const QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";
/// Hash of what the operator last applied, so an unchanged child is never re-applied.
pub const APPLIED_HASH: &str = "training.puretransformer.dev/applied-hash";
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
    fn meta(&self, name: String, component: &str, owned: bool) -> ObjectMeta {
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

/// Standard `app.kubernetes.io/*` labels plus the run label.
pub fn labels(run: &str, component: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".into(), "trainingrun".into()),
        ("app.kubernetes.io/instance".into(), run.into()),
        ("app.kubernetes.io/component".into(), component.into()),
        ("app.kubernetes.io/managed-by".into(), crate::MANAGER.into()),
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

#[cfg(test)]
pub(crate) mod testing {
    use crds::TrainingRun;

    /// A run as the API server would hand it over: namespace and uid set.
    pub fn run(yaml_spec: &str) -> TrainingRun {
        let text = format!(
            "apiVersion: training.puretransformer.dev/v1alpha1\nkind: TrainingRun\nmetadata: {{name: llm, namespace: ml, uid: 0d5c-uid, generation: 1}}\nspec:\n{yaml_spec}"
        );
        crds::manifest::from_yaml(&text, "test").unwrap_or_else(|e| panic!("{e}"))
    }

    /// GRPO from the final checkpoint of the run `base`.
    pub const GRPO_SPEC: &str = "  phase: grpo
  model: {preset: tiny}
  tokens: 1M
  topology: {nodes: 1, gpusPerNode: 1}
  batch: {microBatch: 16, seqLength: 512}
  initFrom: {trainingRun: base}
  grpo: {dataset: embedded:mcq, maxNewTokens: 64}
";

    pub const GPU_SPEC: &str = "  model: {preset: tiny}
  tokens: 64M
  data:
    mix:
      - {name: web, weight: 0.75, uri: embedded:textbook}
      - {name: qa, weight: 0.25, uri: pvc://datasets/usmle}
  topology: {nodes: 2, gpusPerNode: 4}
  batch: {globalTokens: 262144, microBatch: 8, seqLength: 1024}
";
}
