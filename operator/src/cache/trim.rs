//! What a store keeps of each object: what reconciles read, and nothing else. The
//! stores hold every run and every child of every run, so at 10,000 runs the fields no
//! reconcile reads are most of the operator's memory: `managedFields` on every kind, a
//! Job's pod template, a pod's containers but the trainer's resources, a Service's
//! spec, a ConfigMap's other keys, and the labels and annotations of a child that are
//! for people and other controllers.

use crds::TrainingRun;
use crds::contract::CONFIG_KEY;
use crds::types::TrainingDataset;
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, PersistentVolumeClaim, PersistentVolumeClaimSpec, Pod, PodSpec, Service,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Resource;

use crate::resources::{COMPLETION_INDEX, CONTAINER, JOB_NAME_LABEL, KEY_PREFIX};

/// The annotation `kubectl apply` (client-side) and Argo CD write: the whole manifest again.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops what no reconcile reads from an object before its store keeps it.
pub trait Trim: Resource + Sized {
    /// By default: the managed fields and `kubectl apply`'s copy of the manifest.
    fn trim(&mut self) {
        trim_meta(self);
    }
}

/// Its spec and status stay: reconciles plan on them.
impl Trim for TrainingRun {}

impl Trim for TrainingDataset {}

/// Its applied-hash and its access modes (which never change once it is created).
impl Trim for PersistentVolumeClaim {
    fn trim(&mut self) {
        trim_child_meta(self);
        self.spec =
            self.spec.take().map(|s| PersistentVolumeClaimSpec { access_modes: s.access_modes, ..Default::default() });
        self.status = None;
    }
}

/// Its applied-hash is all a reconcile reads of it.
impl Trim for NetworkPolicy {
    fn trim(&mut self) {
        trim_child_meta(self);
        self.spec = None;
    }
}

/// Its applied-hash is all a reconcile reads of it.
impl Trim for Service {
    fn trim(&mut self) {
        trim_child_meta(self);
        self.spec = None;
        self.status = None;
    }
}

/// The accepted config (without the indentation it is written with), and the
/// applied-hash.
impl Trim for ConfigMap {
    fn trim(&mut self) {
        trim_child_meta(self);
        self.binary_data = None;
        if let Some(data) = self.data.as_mut() {
            data.retain(|k, _| k == CONFIG_KEY);
            for text in data.values_mut() {
                if let Ok(value) = serde_json::from_str::<serde_json::Value>(text) {
                    *text = value.to_string();
                }
            }
        }
    }
}

/// Its metadata, `spec.suspend` and status. A suspension patches the live Job
/// (`resources::suspension`), so no reconcile reads its pod template.
impl Trim for Job {
    fn trim(&mut self) {
        trim_child_meta(self);
        self.spec = self.spec.take().map(|s| JobSpec { suspend: s.suspend, ..Default::default() });
    }
}

/// Its status, its node, and the trainer container's resources (an OOM names its
/// memory limit).
impl Trim for Pod {
    fn trim(&mut self) {
        trim_child_meta(self);
        self.spec = self.spec.take().map(|s| PodSpec {
            node_name: s.node_name,
            containers: s
                .containers
                .into_iter()
                .filter(|c| c.name == CONTAINER)
                .map(|c| Container { name: c.name, resources: c.resources, ..Default::default() })
                .collect(),
            ..Default::default()
        });
    }
}

/// Of a child's labels and annotations, the keys reconciles read: the operator's own and
/// the Job controller's completion index and Job name. The rest (the recommended
/// `app.kubernetes.io/*` labels, the Job controller's uid labels, the volume
/// controllers' annotations on a claim, Kueue's) are for people and other controllers.
fn read_by_reconciles(key: &str) -> bool {
    key.starts_with(KEY_PREFIX) || key == COMPLETION_INDEX || key == JOB_NAME_LABEL
}

fn trim_child_meta<K: Resource>(obj: &mut K) {
    trim_meta(obj);
    let meta = obj.meta_mut();
    for keys in [&mut meta.labels, &mut meta.annotations].into_iter().flatten() {
        keys.retain(|k, _| read_by_reconciles(k));
    }
}

fn trim_meta<K: Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.managed_fields = None;
    if let Some(a) = meta.annotations.as_mut() {
        a.remove(LAST_APPLIED);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MANAGER;
    use crate::controller::FINALIZER;
    use crate::resources::testing::{GRPO_SPEC, run};
    use crate::resources::{self, APPLIED_HASH, ATTEMPT_LABEL, Inputs, RUN_LABEL};
    use k8s_openapi::api::batch::v1::JobStatus;
    use k8s_openapi::api::core::v1::{ContainerStatus, PersistentVolumeClaimStatus, PodStatus};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, Time};
    use kube::ResourceExt;

    /// The children the builders make of [`GRPO_SPEC`]'s run.
    fn built() -> (Job, ConfigMap, Service) {
        let r = run(GRPO_SPEC);
        let cfg = crds::resolve(&r).unwrap_or_else(|e| panic!("{e}"));
        let i = Inputs { run: &r, cfg: &cfg, trainer_image: "registry/trainer:1" };
        (resources::job(&i, false), resources::configmap(&i), resources::service(&i))
    }

    fn managed() -> Option<Vec<ManagedFieldsEntry>> {
        Some(vec![ManagedFieldsEntry { manager: Some(MANAGER.into()), ..Default::default() }])
    }

    #[test]
    fn the_cache_keeps_of_a_run_what_reconciles_read() {
        let mut r = run(GRPO_SPEC);
        r.metadata.managed_fields = managed();
        r.metadata.annotations =
            Some([(LAST_APPLIED.to_string(), "{...}".to_string()), ("team".to_string(), "nlp".to_string())].into());
        r.metadata.finalizers = Some(vec![FINALIZER.into()]);
        r.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        r.metadata.resource_version = Some("42".into());
        r.status = Some(crds::types::TrainingRunStatus { attempt: 3, ..Default::default() });
        let spec = serde_json::to_value(&r.spec).unwrap();

        r.trim();

        assert!(r.managed_fields().is_empty());
        assert_eq!(r.annotations().keys().collect::<Vec<_>>(), ["team"]);
        assert_eq!(r.status.as_ref().map(|s| s.attempt), Some(3), "reconciles plan on the cached status");
        assert_eq!(r.finalizers(), [FINALIZER]);
        assert!(r.metadata.deletion_timestamp.is_some());
        assert_eq!((r.name_any(), r.namespace(), r.uid()), ("llm".into(), Some("ml".into()), Some("0d5c-uid".into())));
        assert_eq!(r.resource_version().as_deref(), Some("42"));
        assert_eq!(serde_json::to_value(&r.spec).unwrap(), spec);
        assert_eq!(r.spec.init_from.and_then(|i| i.training_run).as_deref(), Some("base"));
    }

    #[test]
    fn every_key_of_the_operators_own_is_kept_of_a_child() {
        for key in [RUN_LABEL, ATTEMPT_LABEL, APPLIED_HASH, resources::SUSPENDED_BY_OPERATOR] {
            assert!(read_by_reconciles(key), "{key}");
        }
        for key in ["app.kubernetes.io/name", resources::MANAGED_BY, resources::QUEUE_LABEL, LAST_APPLIED] {
            assert!(!read_by_reconciles(key), "{key}");
        }
    }

    #[test]
    fn the_cache_keeps_of_a_job_its_metadata_suspension_and_status_not_its_template() {
        let (mut job, ..) = built();
        job.metadata.managed_fields = managed();
        job.annotations_mut().insert(APPLIED_HASH.into(), "h".into());
        let spec = job.spec.as_mut().unwrap();
        spec.suspend = Some(true);
        job.status = Some(JobStatus { failed: Some(2), ..Default::default() });
        job.labels_mut().insert("batch.kubernetes.io/controller-uid".into(), "u".into());
        let owners = job.owner_references().to_vec();
        assert!(!owners.is_empty());
        assert!(job.labels().contains_key("app.kubernetes.io/name"));

        job.trim();

        assert!(job.managed_fields().is_empty());
        let labels: Vec<&str> = job.labels().keys().map(String::as_str).collect();
        assert_eq!(labels, [ATTEMPT_LABEL, RUN_LABEL], "the labels reconciles read");
        assert_eq!(job.owner_references(), &owners[..]);
        assert_eq!(job.annotations().get(APPLIED_HASH).map(String::as_str), Some("h"));
        assert_eq!(job.status.as_ref().and_then(|s| s.failed), Some(2));
        let spec = job.spec.unwrap();
        assert_eq!(spec.suspend, Some(true));
        assert_eq!(spec.template, Default::default(), "no reconcile reads it: a suspension patches the live Job");
    }

    #[test]
    fn the_cache_keeps_of_a_pod_its_status_node_and_the_trainers_memory_limit() {
        let (job, ..) = built();
        let template = job.spec.unwrap().template;
        let mut pod = Pod {
            metadata: template.metadata.unwrap_or_default(),
            spec: template.spec.map(|s| PodSpec { node_name: Some("gpu-7".into()), ..s }),
            status: Some(PodStatus {
                container_statuses: Some(vec![ContainerStatus { name: CONTAINER.into(), ..Default::default() }]),
                ..Default::default()
            }),
        };
        pod.metadata.managed_fields = managed();
        pod.annotations_mut().insert(COMPLETION_INDEX.into(), "1".into());
        for (k, v) in [(COMPLETION_INDEX, "1"), (JOB_NAME_LABEL, "llm-a1"), ("batch.kubernetes.io/controller-uid", "u")]
        {
            pod.labels_mut().insert(k.into(), v.into());
        }
        let trainer = pod.spec.as_mut().unwrap().containers.iter_mut().find(|c| c.name == CONTAINER).unwrap();
        trainer.resources.get_or_insert_default().limits =
            Some([("memory".to_string(), Quantity("8Gi".into()))].into());
        let limits = |p: &Pod| {
            p.spec.as_ref().unwrap().containers.iter().find(|c| c.name == CONTAINER).unwrap().resources.clone()
        };
        let resources = limits(&pod);
        assert!(resources.as_ref().is_some_and(|r| r.limits.as_ref().is_some_and(|l| l.contains_key("memory"))));

        pod.trim();

        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("gpu-7"));
        assert_eq!(limits(&pod), resources);
        let trainer = &spec.containers[0];
        assert!(trainer.env.is_none() && trainer.volume_mounts.is_none() && trainer.command.is_none());
        assert!(spec.volumes.is_none() && spec.init_containers.is_none());
        assert_eq!(pod.status.as_ref().and_then(|s| s.container_statuses.as_ref()).map(Vec::len), Some(1));
        assert!(pod.managed_fields().is_empty());
        let labels: Vec<&str> = pod.labels().keys().map(String::as_str).collect();
        assert_eq!(labels, [COMPLETION_INDEX, JOB_NAME_LABEL, ATTEMPT_LABEL, RUN_LABEL]);
        assert_eq!(crate::failure::completion_index(&pod), Some(1), "a rank is still read from its pod");
    }

    #[test]
    fn the_cache_keeps_of_a_configmap_the_config_and_of_a_service_its_hash() {
        let (_, mut cm, mut svc) = built();
        cm.data.get_or_insert_default().insert("notes".into(), "x".repeat(1000));
        cm.annotations_mut().insert(LAST_APPLIED.into(), "{...}".into());
        let config = cm.data.as_ref().unwrap()[CONFIG_KEY].clone();

        cm.trim();

        assert_eq!(cm.data.as_ref().unwrap().keys().collect::<Vec<_>>(), [CONFIG_KEY]);
        let kept = &cm.data.as_ref().unwrap()[CONFIG_KEY];
        assert!(kept.len() < config.len(), "kept compact: {} bytes of {}", kept.len(), config.len());
        let parsed = |t: &str| serde_json::from_str::<crds::RunConfig>(t).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(serde_json::to_value(parsed(kept)).unwrap(), serde_json::to_value(parsed(&config)).unwrap());
        assert!(!cm.annotations().contains_key(LAST_APPLIED));

        svc.annotations_mut().insert(APPLIED_HASH.into(), "h".into());
        svc.trim();
        assert!(svc.spec.is_none());
        assert_eq!(svc.annotations().get(APPLIED_HASH).map(String::as_str), Some("h"));
    }

    #[test]
    fn the_cache_keeps_of_a_claim_its_hash_and_access_modes() {
        let r = run(GRPO_SPEC);
        let cfg = crds::resolve(&r).unwrap_or_else(|e| panic!("{e}"));
        let mut pvc = resources::pvc(&Inputs { run: &r, cfg: &cfg, trainer_image: "registry/trainer:1" });
        pvc.annotations_mut().insert(APPLIED_HASH.into(), "h".into());
        pvc.annotations_mut().insert("volume.kubernetes.io/selected-node".into(), "gpu-7".into());
        pvc.status = Some(PersistentVolumeClaimStatus { phase: Some("Bound".into()), ..Default::default() });
        let modes = pvc.spec.as_ref().and_then(|s| s.access_modes.clone());
        assert!(modes.as_ref().is_some_and(|m| !m.is_empty()));

        pvc.trim();

        assert_eq!(
            pvc.annotations().keys().collect::<Vec<_>>(),
            [APPLIED_HASH],
            "the volume controllers' are not read"
        );
        assert_eq!(pvc.labels().keys().collect::<Vec<_>>(), [RUN_LABEL]);
        let spec = pvc.spec.unwrap();
        assert_eq!((spec.access_modes, spec.resources, pvc.status), (modes, None, None));
    }
}
