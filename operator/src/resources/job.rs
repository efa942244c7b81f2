//! The Indexed Job: one pod per node, one trainer process per GPU inside it.

use std::collections::BTreeMap;

use crds::config::{Location, ResolvedInit};
use crds::contract::{
    self, CHECKPOINT_MOUNT, CONFIG_KEY, CONFIG_PATH, INIT_MOUNT, NCCL_DEFAULTS, RENDEZVOUS_PORT, STATUS_PORT, env,
};
use crds::types::PullPolicy;
use k8s_openapi::api::batch::v1::{
    Job, JobSpec, PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement, PodFailurePolicyOnPodConditionsPattern,
    PodFailurePolicyRule,
};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    HTTPGetAction, KeyToPath, ObjectFieldSelector, PersistentVolumeClaimVolumeSource, PodSecurityContext, PodSpec,
    PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile, SecretKeySelector, SecurityContext, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::meta::{
    ATTEMPT_LABEL, COMPLETION_INDEX, CONTAINER, Inputs, QUEUE_LABEL, SUSPENDED_BY_OPERATOR, configmap_name, job_name,
    labels, pvc_name, service_name,
};

/// UID and GID of the trainer: the image's `USER` (trainer/Dockerfile, checked by
/// scripts/check-image.sh), and the owner of files on the PVC.
pub const TRAINER_UID: i64 = 65532;

/// Exit codes that end the run at once: a restart would fail the same way.
pub fn fatal_exit_codes() -> Vec<i32> {
    let mut codes: Vec<i32> =
        contract::FailureReason::ALL.into_iter().filter(|r| !r.retriable()).map(|r| r.exit_code()).collect();
    codes.sort();
    codes
}

/// Long enough for the final checkpoint on SIGTERM: f32 weights and both AdamW
/// moments (12 bytes per parameter) written at a conservative 100 MB/s, plus a minute.
pub fn termination_grace_seconds(i: &Inputs) -> i64 {
    let bytes = i.cfg.params.total.saturating_mul(12);
    (60 + bytes / 100_000_000).max(120) as i64
}

fn var(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar { name: name.into(), value: Some(value.into()), ..Default::default() }
}

fn secret_var(name: &str, secret: &str, optional: bool) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector { name: secret.into(), key: name.into(), optional: Some(optional) }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The trainer's environment: the rendezvous contract, the seed's NCCL defaults,
/// S3 credentials from the Secret, then `spec.env` (which wins by name).
pub fn environment(i: &Inputs) -> Vec<EnvVar> {
    let name = i.name();
    let topo = &i.cfg.topology;
    let job = job_name(&name, i.cfg.attempt);
    let mut vars = vec![
        var(env::MASTER_ADDR, format!("{job}-0.{}", service_name(&name))),
        var(env::MASTER_PORT, RENDEZVOUS_PORT.to_string()),
        var(env::NNODES, topo.nodes.to_string()),
        EnvVar {
            name: env::NODE_RANK.into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: format!("metadata.annotations['{COMPLETION_INDEX}']"),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        },
        var(env::NPROC_PER_NODE, topo.procs_per_node.to_string()),
        var(env::TRAINER_CONFIG, CONFIG_PATH),
        var(env::STATUS_PORT, STATUS_PORT.to_string()),
        var(env::CACHE, "/tmp/trainingrun"),
    ];
    vars.extend(NCCL_DEFAULTS.iter().map(|(k, v)| var(k, *v)));
    if let Some(s3) = &i.cfg.checkpoint.s3 {
        vars.push(secret_var("AWS_ACCESS_KEY_ID", &s3.secret_name, false));
        vars.push(secret_var("AWS_SECRET_ACCESS_KEY", &s3.secret_name, false));
        vars.push(secret_var("AWS_SESSION_TOKEN", &s3.secret_name, true));
    }
    for user in &i.run.spec.env {
        match vars.iter_mut().find(|v| v.name == user.name) {
            Some(v) => *v = user.clone(),
            None => vars.push(user.clone()),
        }
    }
    vars
}

/// Volumes and their mounts: checkpoints, the run config, shared memory for NCCL,
/// a writable /tmp, the init run's checkpoints and every `pvc://` claim read-only.
fn volumes(i: &Inputs) -> (Vec<Volume>, Vec<VolumeMount>) {
    let name = i.name();
    let claim = |claim: String, read_only: bool| PersistentVolumeClaimVolumeSource {
        claim_name: claim,
        read_only: Some(read_only),
    };
    let mount = |volume: &str, path: &str, read_only: bool| VolumeMount {
        name: volume.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..Default::default()
    };
    let mut volumes = vec![
        Volume {
            name: "checkpoints".into(),
            persistent_volume_claim: Some(claim(pvc_name(&name), false)),
            ..Default::default()
        },
        Volume {
            name: "config".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: configmap_name(&name),
                items: Some(vec![KeyToPath { key: CONFIG_KEY.into(), path: CONFIG_KEY.into(), mode: None }]),
                ..Default::default()
            }),
            ..Default::default()
        },
        Volume {
            name: "dshm".into(),
            empty_dir: Some(EmptyDirVolumeSource { medium: Some("Memory".into()), size_limit: None }),
            ..Default::default()
        },
        Volume { name: "tmp".into(), empty_dir: Some(EmptyDirVolumeSource::default()), ..Default::default() },
    ];
    let config_dir = std::path::Path::new(CONFIG_PATH).parent().expect("config path has a directory");
    let mut mounts = vec![
        mount("checkpoints", CHECKPOINT_MOUNT, false),
        mount("config", &config_dir.display().to_string(), true),
        mount("dshm", "/dev/shm", false),
        mount("tmp", "/tmp", false),
    ];
    // The trainer reads a run's checkpoints at `INIT_MOUNT/<run>` and a claim's path
    // under `INIT_MOUNT`, as `trainer run` reads `runs/<run>` locally.
    let init = match &i.cfg.init_from {
        Some(ResolvedInit::TrainingRun { name }) => Some((pvc_name(name), format!("{INIT_MOUNT}/{name}"))),
        Some(ResolvedInit::Checkpoint { location: Location::Pvc { claim, .. }, .. }) => {
            Some((claim.clone(), INIT_MOUNT.to_string()))
        }
        _ => None,
    };
    let init_claim = init.as_ref().map(|(c, _)| c.clone());
    if let Some((c, path)) = init {
        volumes.push(Volume {
            name: "init".into(),
            persistent_volume_claim: Some(claim(c, true)),
            ..Default::default()
        });
        mounts.push(mount("init", &path, true));
    }
    let data_claims = i.cfg.pvc_claims().into_iter().filter(|c| Some(c) != init_claim.as_ref());
    for (n, c) in data_claims.enumerate() {
        let volume = format!("data-{n}");
        mounts.push(mount(&volume, &contract::pvc_path(&c, ""), true));
        volumes.push(Volume { name: volume, persistent_volume_claim: Some(claim(c, true)), ..Default::default() });
    }
    (volumes, mounts)
}

fn resources(i: &Inputs) -> ResourceRequirements {
    let topo = &i.run.spec.topology;
    let mut r = topo.resources.clone().unwrap_or_default();
    let gpus = i.cfg.topology.gpus_per_node;
    if gpus > 0 {
        r.limits.get_or_insert_with(BTreeMap::new).insert(topo.gpu_resource_name.clone(), Quantity(gpus.to_string()));
    }
    r
}

fn pull_policy(p: PullPolicy) -> String {
    match p {
        PullPolicy::Always => "Always",
        PullPolicy::IfNotPresent => "IfNotPresent",
        PullPolicy::Never => "Never",
    }
    .into()
}

/// The Job of the current attempt (`cfg.attempt`). `suspend` is the Job's initial
/// suspension: the run's `spec.suspend`, or true for a Kueue-queued run, which
/// Kueue un-suspends on admission.
/// The trainer container's port of `/status`, `/metrics` and `/healthz`: the readiness
/// probe and the chart's PodMonitor name it.
pub const STATUS_PORT_NAME: &str = "status";

pub fn job(i: &Inputs, suspend: bool) -> Job {
    let name = i.name();
    let spec = &i.run.spec;
    let attempt = i.cfg.attempt;
    let nodes = i.cfg.topology.nodes as i32;
    let mut pod_labels = labels(&name, "trainer");
    pod_labels.insert(ATTEMPT_LABEL.into(), attempt.to_string());
    let mut meta = i.meta(job_name(&name, attempt), "trainer", true);
    let job_labels = meta.labels.get_or_insert_with(BTreeMap::new);
    job_labels.insert(ATTEMPT_LABEL.into(), attempt.to_string());
    if let Some(q) = &spec.queue_name {
        job_labels.insert(QUEUE_LABEL.into(), q.clone());
    }
    if suspend && spec.suspend {
        meta.annotations = Some(BTreeMap::from([(SUSPENDED_BY_OPERATOR.to_string(), "true".to_string())]));
    }
    let (volumes, mounts) = volumes(i);
    let port = |name: &str, port: u16| ContainerPort {
        name: Some(name.into()),
        container_port: port.into(),
        protocol: Some("TCP".into()),
        ..Default::default()
    };
    let container = Container {
        name: CONTAINER.into(),
        image: Some(spec.image.clone().unwrap_or_else(|| i.trainer_image.to_string())),
        image_pull_policy: spec.image_pull_policy.map(pull_policy),
        command: Some(vec!["trainer".into(), "launch".into()]),
        env: Some(environment(i)),
        ports: Some(vec![port("rendezvous", RENDEZVOUS_PORT), port(STATUS_PORT_NAME, STATUS_PORT)]),
        readiness_probe: Some(Probe {
            http_get: Some(HTTPGetAction {
                path: Some("/healthz".into()),
                port: IntOrString::String(STATUS_PORT_NAME.into()),
                ..Default::default()
            }),
            period_seconds: Some(10),
            failure_threshold: Some(3),
            ..Default::default()
        }),
        resources: Some(resources(i)),
        security_context: Some(container_security()),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        volume_mounts: Some(mounts),
        ..Default::default()
    };
    let topo = &spec.topology;
    let pod = PodSpec {
        restart_policy: Some("Never".into()),
        subdomain: Some(service_name(&name)),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        termination_grace_period_seconds: Some(termination_grace_seconds(i)),
        priority_class_name: spec.priority_class_name.clone(),
        scheduler_name: spec.scheduler_name.clone(),
        node_selector: (!topo.node_selector.is_empty()).then(|| topo.node_selector.clone()),
        tolerations: (!topo.tolerations.is_empty()).then(|| topo.tolerations.clone()),
        affinity: topo.affinity.clone(),
        security_context: Some(pod_security()),
        containers: vec![container],
        volumes: Some(volumes),
        ..Default::default()
    };
    Job {
        metadata: meta,
        spec: Some(JobSpec {
            completion_mode: Some("Indexed".into()),
            completions: Some(nodes),
            parallelism: Some(nodes),
            backoff_limit: Some(0),
            // A replacement pod starts only after the old one is gone: hostnames stay unique.
            pod_replacement_policy: Some("Failed".into()),
            suspend: Some(suspend),
            ttl_seconds_after_finished: spec.ttl_seconds_after_finished,
            // Preemption, eviction, node loss: the operator gang-restarts without counting it.
            pod_failure_policy: Some(failure_policy(CONTAINER, fatal_exit_codes())),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta { labels: Some(pod_labels), ..Default::default() }),
                spec: Some(pod),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Every pod the operator creates runs as the trainer's non-root user, with the
/// runtime's default seccomp profile.
pub fn pod_security() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(TRAINER_UID),
        run_as_group: Some(TRAINER_UID),
        fs_group: Some(TRAINER_UID),
        seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), localhost_profile: None }),
        ..Default::default()
    }
}

/// Its container: no capabilities, no privilege escalation, a read-only root.
pub fn container_security() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), add: None }),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        ..Default::default()
    }
}

/// A disrupted pod (preempted, evicted, its node lost) is not a failure of the Job;
/// `container` exiting with one of `fatal` fails the Job at once.
pub fn failure_policy(container: &str, fatal: Vec<i32>) -> PodFailurePolicy {
    PodFailurePolicy {
        rules: vec![
            PodFailurePolicyRule {
                action: "Ignore".into(),
                on_pod_conditions: Some(vec![PodFailurePolicyOnPodConditionsPattern {
                    type_: "DisruptionTarget".into(),
                    status: "True".into(),
                }]),
                on_exit_codes: None,
            },
            PodFailurePolicyRule {
                action: "FailJob".into(),
                on_exit_codes: Some(PodFailurePolicyOnExitCodesRequirement {
                    container_name: Some(container.into()),
                    operator: "In".into(),
                    values: fatal,
                }),
                on_pod_conditions: None,
            },
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::RUN_LABEL;
    use crate::resources::testing::{GPU_SPEC, GRPO_SPEC, run};
    use crds::TrainingRun;

    fn build_with(r: &TrainingRun, attempt: u32, suspend: bool) -> Job {
        let mut cfg = crds::resolve(r).unwrap_or_else(|e| panic!("{e}"));
        cfg.attempt = attempt;
        job(&Inputs { run: r, cfg: &cfg, trainer_image: "registry/trainer:1" }, suspend)
    }

    fn pod(j: &Job) -> PodSpec {
        j.spec.clone().unwrap().template.spec.unwrap()
    }

    fn env_map(j: &Job) -> BTreeMap<String, EnvVar> {
        pod(j).containers[0].env.clone().unwrap().into_iter().map(|e| (e.name.clone(), e)).collect()
    }

    fn value(env: &BTreeMap<String, EnvVar>, name: &str) -> String {
        env[name].value.clone().unwrap_or_else(|| panic!("{name} has no value"))
    }

    #[test]
    fn indexed_gang_of_one_pod_per_node() {
        let j = build_with(&run(GPU_SPEC), 2, false);
        assert_eq!(j.metadata.name.as_deref(), Some("llm-a2"));
        let s = j.spec.clone().unwrap();
        assert_eq!(s.completion_mode.as_deref(), Some("Indexed"));
        assert_eq!((s.completions, s.parallelism, s.backoff_limit), (Some(2), Some(2), Some(0)));
        assert_eq!(s.suspend, Some(false));
        let p = pod(&j);
        assert_eq!(p.restart_policy.as_deref(), Some("Never"));
        assert_eq!(p.subdomain.as_deref(), Some("llm"));
        let labels = s.template.metadata.unwrap().labels.unwrap();
        assert_eq!(labels["training.puretransformer.dev/run"], "llm");
        assert_eq!(labels["training.puretransformer.dev/attempt"], "2");
        assert_eq!(labels["app.kubernetes.io/name"], "trainingrun");
        assert_eq!(labels["app.kubernetes.io/managed-by"], "trainingrun-operator");
        let owner = &j.metadata.owner_references.unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller, owner.block_owner_deletion),
            ("TrainingRun", Some(true), Some(true))
        );
        let c = &p.containers[0];
        assert_eq!(c.name, "trainer");
        assert_eq!(c.image.as_deref(), Some("registry/trainer:1"));
        assert_eq!(c.command.clone().unwrap(), vec!["trainer", "launch"]);
        assert_eq!(c.termination_message_policy.as_deref(), Some("FallbackToLogsOnError"));
        assert!(p.termination_grace_period_seconds.unwrap() >= 120);
    }

    #[test]
    fn environment_is_the_rendezvous_contract() {
        let env = env_map(&build_with(&run(GPU_SPEC), 2, false));
        assert_eq!(value(&env, "MASTER_ADDR"), "llm-a2-0.llm");
        assert_eq!(value(&env, "MASTER_PORT"), "29500");
        assert_eq!(value(&env, "NNODES"), "2");
        assert_eq!(value(&env, "NPROC_PER_NODE"), "4");
        assert_eq!(value(&env, "TRAINER_CONFIG"), "/etc/trainingrun/run.json");
        assert!(!env.contains_key("TRAINER_ATTEMPT"), "the attempt reaches the pod through the ConfigMap alone");
        assert_eq!(value(&env, "TRAINER_STATUS_PORT"), "8080");
        let rank = env["NODE_RANK"].value_from.clone().unwrap().field_ref.unwrap();
        assert_eq!(rank.field_path, "metadata.annotations['batch.kubernetes.io/job-completion-index']");
        assert_eq!(value(&env, "NCCL_IB_DISABLE"), "0");
        assert_eq!(value(&env, "NCCL_NET_GDR_LEVEL"), "5");
        assert_eq!(value(&env, "CUDA_DEVICE_MAX_CONNECTIONS"), "1");
        assert!(!env.contains_key("AWS_ACCESS_KEY_ID"));
    }

    #[test]
    fn spec_env_overrides_nccl_defaults_and_s3_credentials_come_from_the_secret() {
        let r = run(&format!(
            "{GPU_SPEC}  env:\n    - {{name: NCCL_IB_DISABLE, value: \"1\"}}\n    - {{name: NCCL_DEBUG, value: INFO}}\n  checkpoint:\n    s3: {{uri: s3://ckpt/llm, secretRef: {{name: s3-creds}}}}\n"
        ));
        let j = build_with(&r, 1, false);
        let env = env_map(&j);
        assert_eq!(value(&env, "NCCL_IB_DISABLE"), "1");
        assert_eq!(value(&env, "NCCL_DEBUG"), "INFO");
        let names: Vec<String> = pod(&j).containers[0].env.clone().unwrap().into_iter().map(|e| e.name).collect();
        assert_eq!(names.iter().filter(|n| *n == "NCCL_IB_DISABLE").count(), 1);
        let key = env["AWS_SECRET_ACCESS_KEY"].value_from.clone().unwrap().secret_key_ref.unwrap();
        assert_eq!(
            (key.name.as_str(), key.key.as_str(), key.optional),
            ("s3-creds", "AWS_SECRET_ACCESS_KEY", Some(false))
        );
        assert_eq!(env["AWS_SESSION_TOKEN"].value_from.clone().unwrap().secret_key_ref.unwrap().optional, Some(true));
    }

    #[test]
    fn gpus_ports_probe_and_volumes() {
        let r = run(&format!("{GPU_SPEC}  topology:\n    nodes: 2\n    gpusPerNode: 4\n    gpuResourceName: amd.com/gpu\n    resources: {{limits: {{memory: 512Gi}}, requests: {{cpu: \"32\"}}}}\n").replace("  topology: {nodes: 2, gpusPerNode: 4}\n", ""));
        let j = build_with(&r, 1, false);
        let p = pod(&j);
        let c = &p.containers[0];
        let res = c.resources.clone().unwrap();
        assert_eq!(res.limits.clone().unwrap()["amd.com/gpu"].0, "4");
        assert_eq!(res.limits.unwrap()["memory"].0, "512Gi");
        assert_eq!(res.requests.unwrap()["cpu"].0, "32");
        let ports: Vec<(String, i32)> =
            c.ports.clone().unwrap().into_iter().map(|p| (p.name.unwrap(), p.container_port)).collect();
        assert_eq!(ports, vec![("rendezvous".into(), 29500), ("status".into(), 8080)]);
        let probe = c.readiness_probe.clone().unwrap().http_get.unwrap();
        assert_eq!((probe.path.as_deref(), probe.port), (Some("/healthz"), IntOrString::String("status".into())));
        let mounts: BTreeMap<String, (String, Option<bool>)> =
            c.volume_mounts.clone().unwrap().into_iter().map(|m| (m.name, (m.mount_path, m.read_only))).collect();
        assert_eq!(mounts["checkpoints"], ("/checkpoints".into(), None));
        assert_eq!(mounts["config"], ("/etc/trainingrun".into(), Some(true)));
        assert_eq!(mounts["dshm"].0, "/dev/shm");
        // The qa source lives on pvc://datasets/usmle.
        assert_eq!(mounts["data-0"], ("/mnt/pvc/datasets".into(), Some(true)));
        let vols: BTreeMap<String, Volume> = p.volumes.unwrap().into_iter().map(|v| (v.name.clone(), v)).collect();
        assert_eq!(vols["checkpoints"].persistent_volume_claim.clone().unwrap().claim_name, "llm-checkpoints");
        assert_eq!(vols["dshm"].empty_dir.clone().unwrap().medium.as_deref(), Some("Memory"));
        assert_eq!(vols["config"].config_map.clone().unwrap().name, "llm-config");
        assert_eq!(vols["data-0"].persistent_volume_claim.clone().unwrap().claim_name, "datasets");
    }

    #[test]
    fn cpu_runs_ask_for_no_gpus() {
        let r = run(&GPU_SPEC.replace("gpusPerNode: 4", "gpusPerNode: 0"));
        let j = build_with(&r, 1, false);
        let res = pod(&j).containers[0].resources.clone().unwrap();
        assert!(res.limits.unwrap_or_default().is_empty());
        assert_eq!(value(&env_map(&j), "NPROC_PER_NODE"), "1");
    }

    #[test]
    fn restricted_security() {
        let p = pod(&build_with(&run(GPU_SPEC), 1, false));
        assert_eq!(p.automount_service_account_token, Some(false));
        let psc = p.security_context.unwrap();
        assert_eq!(psc.run_as_non_root, Some(true));
        assert_eq!(psc.seccomp_profile.unwrap().type_, "RuntimeDefault");
        let sc = p.containers[0].security_context.clone().unwrap();
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.capabilities.unwrap().drop.unwrap(), vec!["ALL"]);
        assert_eq!(sc.run_as_non_root, Some(true));
    }

    #[test]
    fn failure_policy_fails_fast_on_fatal_codes_and_ignores_disruptions() {
        let policy = build_with(&run(GPU_SPEC), 1, false).spec.unwrap().pod_failure_policy.unwrap();
        assert_eq!(policy.rules[0].action, "Ignore");
        assert_eq!(policy.rules[0].on_pod_conditions.clone().unwrap()[0].type_, "DisruptionTarget");
        assert_eq!(policy.rules[1].action, "FailJob");
        let codes = policy.rules[1].on_exit_codes.clone().unwrap();
        assert_eq!(codes.container_name.as_deref(), Some("trainer"));
        assert_eq!(codes.operator, "In");
        for reason in [contract::FailureReason::NaNLoss, contract::FailureReason::OutOfMemory] {
            assert!(codes.values.contains(&reason.exit_code()), "{reason:?}");
        }
        assert!(!codes.values.contains(&contract::FailureReason::CollectiveTimeout.exit_code()));
    }

    #[test]
    fn kueue_label_scheduling_and_suspension() {
        let r = run(&format!(
            "{GPU_SPEC}  queueName: team-a\n  priorityClassName: high\n  schedulerName: volcano\n  suspend: true\n  ttlSecondsAfterFinished: 3600\n  imagePullPolicy: Always\n  image: my/trainer:2\n"
        ));
        let j = build_with(&r, 1, true);
        assert_eq!(j.metadata.labels.clone().unwrap()["kueue.x-k8s.io/queue-name"], "team-a");
        assert_eq!(j.metadata.annotations.clone().unwrap()[SUSPENDED_BY_OPERATOR], "true");
        let s = j.spec.clone().unwrap();
        assert_eq!(s.suspend, Some(true));
        assert_eq!(s.ttl_seconds_after_finished, Some(3600));
        let p = pod(&j);
        assert_eq!(p.priority_class_name.as_deref(), Some("high"));
        assert_eq!(p.scheduler_name.as_deref(), Some("volcano"));
        assert_eq!(p.containers[0].image.as_deref(), Some("my/trainer:2"));
        assert_eq!(p.containers[0].image_pull_policy.as_deref(), Some("Always"));
        // Queued but not suspended by the user: created suspended for Kueue, without the operator's mark.
        let r = run(&format!("{GPU_SPEC}  queueName: team-a\n"));
        let j = build_with(&r, 1, true);
        assert_eq!(j.metadata.annotations, None);
        assert_eq!(
            build_with(&run(GPU_SPEC), 1, false).metadata.labels.unwrap().get("kueue.x-k8s.io/queue-name"),
            None
        );
    }

    #[test]
    fn init_from_a_run_mounts_its_checkpoints_read_only() {
        let r = run(GRPO_SPEC);
        let p = pod(&build_with(&r, 1, false));
        let vols: BTreeMap<String, Volume> = p.volumes.unwrap().into_iter().map(|v| (v.name.clone(), v)).collect();
        let init = vols["init"].persistent_volume_claim.clone().unwrap();
        assert_eq!((init.claim_name.as_str(), init.read_only), ("base-checkpoints", Some(true)));
        let m = p.containers[0].volume_mounts.clone().unwrap().into_iter().find(|m| m.name == "init").unwrap();
        assert_eq!(
            (m.mount_path.as_str(), m.read_only),
            ("/init/base", Some(true)),
            "where the trainer reads <init-dir>/<run>"
        );
    }

    /// The chart's PodMonitor selects what this Job's pods carry: the run label, node
    /// rank 0's completion index, and the status port by name.
    #[test]
    fn the_charts_pod_monitor_names_the_trainer_pods_labels_and_port() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../charts/trainingrun-operator/templates/podmonitor.yaml");
        let template = std::fs::read_to_string(path).unwrap();
        let sanitized: String = RUN_LABEL.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
        for needle in [
            format!("key: {RUN_LABEL}"),
            format!("[__meta_kubernetes_pod_label_{sanitized}]"),
            "batch.kubernetes.io/job-completion-index: \"0\"".to_string(),
            format!("port: {STATUS_PORT_NAME}"),
            "path: /metrics".to_string(),
        ] {
            assert!(template.contains(&needle), "{path} lacks {needle:?}");
        }
        let r = run(GPU_SPEC);
        let cfg = crds::resolve(&r).unwrap();
        let pod = job(&Inputs { run: &r, cfg: &cfg, trainer_image: "img" }, false).spec.unwrap().template;
        assert!(pod.metadata.unwrap().labels.unwrap().contains_key(RUN_LABEL));
    }
}
