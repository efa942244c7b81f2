//! Build, pure: the Jobs of a dataset's generation. The tokenizer (one pod, when the
//! spec trains one), the work (an Indexed Job of `spec.workers` pods, each its share of
//! the files), the merge (one pod writing the manifest). All run `trainer prepare` with
//! the same flags but `--step`, so each finds what the others published.

use std::collections::BTreeMap;

use crds::contract::prepare::PrepareStep;
use crds::contract::{FailureReason, STATUS_PORT, env};
use crds::types::{PullPolicy, TrainingDataset};
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EmptyDirVolumeSource, EnvVar, PersistentVolumeClaimVolumeSource, PodSpec,
    PodTemplateSpec, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};

use super::validate::{Prepared, mount_path};
use crate::resources::job::{container_security, failure_policy, pod_security};

pub const DATASET_LABEL: &str = "training.puretransformer.dev/dataset";
pub const STEP_LABEL: &str = "training.puretransformer.dev/prepare-step";
pub const GENERATION_LABEL: &str = "training.puretransformer.dev/generation";
/// The prepare pods' container.
pub const CONTAINER: &str = "prepare";

/// The Job of `step` for the dataset's `generation`: a new generation (a changed spec)
/// gets new Jobs, and the files its parts already hold are skipped.
pub fn job_name(dataset: &str, step: PrepareStep, generation: i64) -> String {
    format!("{dataset}-{}-g{generation}", step.as_str())
}

pub fn labels(dataset: &str, step: PrepareStep, generation: i64) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".into(), "trainingdataset".into()),
        ("app.kubernetes.io/instance".into(), dataset.into()),
        ("app.kubernetes.io/component".into(), format!("prepare-{}", step.as_str())),
        (crate::resources::MANAGED_BY.into(), crate::MANAGER.into()),
        (DATASET_LABEL.into(), dataset.into()),
        (STEP_LABEL.into(), step.as_str().into()),
        (GENERATION_LABEL.into(), generation.to_string()),
    ])
}

/// Exit codes no retry helps: an option the trainer refuses, or a full disk.
fn fatal_exit_codes() -> Vec<i32> {
    vec![FailureReason::InvalidConfig.exit_code(), FailureReason::StorageFull.exit_code()]
}

fn var(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar { name: name.into(), value: Some(value.into()), ..Default::default() }
}

/// `trainer prepare`'s arguments for `step`.
pub fn args(ds: &TrainingDataset, p: &Prepared, step: PrepareStep) -> Vec<String> {
    let spec = &ds.spec;
    let mut a: Vec<String> = vec!["prepare".into(), "--step".into(), step.as_str().into()];
    for input in &p.inputs {
        a.extend(["--input".into(), input.clone()]);
    }
    let format = serde_json::to_value(spec.source.format).expect("a format serializes");
    a.extend([
        "--output".into(),
        p.output.clone(),
        "--name".into(),
        ds.name_any(),
        "--format".into(),
        format.as_str().unwrap_or("auto").into(),
        "--field".into(),
        spec.source.field.clone(),
        "--shard-tokens".into(),
        p.shard_tokens.to_string(),
        "--validation-fraction".into(),
        spec.validation_fraction.to_string(),
        "--seed".into(),
        spec.seed.to_string(),
        "--max-failed-files".into(),
        spec.max_failed_files.to_string(),
    ]);
    a.extend(p.tokenizer.iter().cloned());
    if step == PrepareStep::Work {
        a.extend(["--workers".into(), spec.workers.to_string()]);
    }
    a
}

fn pull_policy(p: PullPolicy) -> String {
    serde_json::to_value(p).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
}

/// The container's environment: the status port, the cache, the log level, and the
/// spec's own variables, which win.
fn container_env(user: &[EnvVar]) -> Vec<EnvVar> {
    let mut env = vec![
        var(env::STATUS_PORT, STATUS_PORT.to_string()),
        var(env::CACHE, "/tmp/trainingrun"),
        var("RUST_LOG", "info"),
    ];
    for user in user {
        match env.iter_mut().find(|v| v.name == user.name) {
            Some(v) => *v = user.clone(),
            None => env.push(user.clone()),
        }
    }
    env
}

/// The pod's volumes and the container's mounts: `/tmp`, and each claim the dataset
/// reads or writes.
fn volumes(p: &Prepared) -> (Vec<Volume>, Vec<VolumeMount>) {
    let mut volumes =
        vec![Volume { name: "tmp".into(), empty_dir: Some(EmptyDirVolumeSource::default()), ..Default::default() }];
    let mut mounts = vec![VolumeMount { name: "tmp".into(), mount_path: "/tmp".into(), ..Default::default() }];
    for (i, m) in p.mounts.iter().enumerate() {
        let volume = format!("claim-{i}");
        volumes.push(Volume {
            name: volume.clone(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: m.claim.clone(),
                read_only: Some(m.read_only),
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name: volume,
            mount_path: mount_path(&m.claim),
            read_only: m.read_only.then_some(true),
            ..Default::default()
        });
    }
    (volumes, mounts)
}

/// The Job of `step` for the dataset's current generation.
pub fn job(ds: &TrainingDataset, p: &Prepared, step: PrepareStep, trainer_image: &str) -> Job {
    let name = ds.name_any();
    let generation = ds.metadata.generation.unwrap_or_default();
    let spec = &ds.spec;
    let pods = if step == PrepareStep::Work { spec.workers as i32 } else { 1 };
    let (volumes, mounts) = volumes(p);
    let container = Container {
        name: CONTAINER.into(),
        image: Some(spec.image.clone().unwrap_or_else(|| trainer_image.to_string())),
        image_pull_policy: spec.image_pull_policy.map(pull_policy),
        command: Some(vec!["trainer".into()]),
        args: Some(args(ds, p, step)),
        env: Some(container_env(&spec.env)),
        ports: Some(vec![ContainerPort {
            name: Some("status".into()),
            container_port: STATUS_PORT.into(),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        resources: spec.resources.clone(),
        security_context: Some(container_security()),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        volume_mounts: Some(mounts),
        ..Default::default()
    };
    let pod = PodSpec {
        restart_policy: Some("Never".into()),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        security_context: Some(pod_security()),
        containers: vec![container],
        volumes: Some(volumes),
        ..Default::default()
    };
    let owner = ds.controller_owner_ref(&()).map(|o| OwnerReference { block_owner_deletion: Some(true), ..o });
    Job {
        metadata: ObjectMeta {
            name: Some(job_name(&name, step, generation)),
            namespace: ds.namespace(),
            labels: Some(labels(&name, step, generation)),
            owner_references: owner.map(|o| vec![o]),
            ..Default::default()
        },
        spec: Some(JobSpec {
            completion_mode: Some(if step == PrepareStep::Work { "Indexed" } else { "NonIndexed" }.into()),
            completions: Some(pods),
            parallelism: Some(pods),
            // Each retried pod skips the files it already published.
            backoff_limit: Some(spec.max_retries as i32),
            pod_replacement_policy: Some("Failed".into()),
            // Preempted, evicted or on a lost node: retried without counting.
            pod_failure_policy: Some(failure_policy(CONTAINER, fatal_exit_codes())),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta { labels: Some(labels(&name, step, generation)), ..Default::default() }),
                spec: Some(pod),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::validate::validate;

    /// The operator's stores keep of a child only the keys of its own prefix (and the
    /// Job controller's), so every label the dataset controller reads carries it.
    #[test]
    fn the_labels_read_back_carry_the_operators_prefix() {
        for key in [DATASET_LABEL, STEP_LABEL, GENERATION_LABEL] {
            assert!(key.starts_with(crate::resources::KEY_PREFIX), "{key}");
        }
    }

    fn dataset() -> TrainingDataset {
        let mut ds: TrainingDataset = serde_yaml_ng::from_str(
            "apiVersion: training.puretransformer.dev/v1alpha1\nkind: TrainingDataset\nmetadata: {name: web, namespace: ml, uid: u1, generation: 3}\n\
             spec:\n  source: {uris: ['pvc://raw/web/*.jsonl'], format: jsonl, field: body}\n  tokenizer: {embedded: true}\n  \
             output: s3://prepared/web\n  workers: 3\n  maxRetries: 2\n  maxFailedFiles: 1\n  env: [{name: AWS_ENDPOINT_URL, value: 'http://s3:9000'}]\n",
        )
        .unwrap();
        ds.metadata.uid = Some("u1".into());
        ds
    }

    #[test]
    fn the_work_is_an_indexed_job_of_one_pod_per_worker_with_the_shared_flags() {
        let ds = dataset();
        let p = validate(&ds).unwrap();
        let j = job(&ds, &p, PrepareStep::Work, "trainer:dev");
        assert_eq!(j.metadata.name.as_deref(), Some("web-work-g3"));
        let s = j.spec.as_ref().unwrap();
        assert_eq!((s.completion_mode.as_deref(), s.completions, s.parallelism), (Some("Indexed"), Some(3), Some(3)));
        assert_eq!(s.backoff_limit, Some(2), "maxRetries pod failures");
        let rules = &s.pod_failure_policy.as_ref().unwrap().rules;
        assert_eq!(rules[1].on_exit_codes.as_ref().unwrap().values, [78, 89]);
        let c = &s.template.spec.as_ref().unwrap().containers[0];
        let args = c.args.clone().unwrap().join(" ");
        assert_eq!(
            args,
            "prepare --step work --input /mnt/pvc/raw/web/*.jsonl --output s3://prepared/web --name web --format jsonl \
             --field body --shard-tokens 100000000 --validation-fraction 0.005 --seed 0 --max-failed-files 1 \
             --tokenizer embedded --workers 3"
        );
        let env: Vec<_> = c.env.clone().unwrap().into_iter().map(|v| v.name).collect();
        assert!(env.contains(&"TRAINER_STATUS_PORT".into()) && env.contains(&"AWS_ENDPOINT_URL".into()), "{env:?}");
        let mounts: Vec<_> =
            c.volume_mounts.clone().unwrap().into_iter().map(|m| (m.mount_path, m.read_only)).collect();
        assert_eq!(mounts, [("/tmp".into(), None), ("/mnt/pvc/raw".into(), Some(true))]);
        assert_eq!(j.metadata.owner_references.unwrap()[0].kind, "TrainingDataset");
    }

    #[test]
    fn the_merge_is_one_pod_without_a_worker_count() {
        let ds = dataset();
        let p = validate(&ds).unwrap();
        let j = job(&ds, &p, PrepareStep::Merge, "trainer:dev");
        assert_eq!(j.metadata.name.as_deref(), Some("web-merge-g3"));
        let s = j.spec.unwrap();
        assert_eq!((s.completions, s.parallelism), (Some(1), Some(1)));
        let args = s.template.spec.unwrap().containers[0].args.clone().unwrap();
        assert!(args.starts_with(&["prepare".into(), "--step".into(), "merge".into()]), "{args:?}");
        assert!(!args.contains(&"--workers".into()));
    }
}
