//! kwok's nodes under the real control plane, with no real node (`e2e::kwok`): fifty
//! nodes Ready and untainted, then Jobs whose pods end as their marks say, judged by
//! the real Job controller: an Indexed Job of two pods that run 2 s completes; a pod
//! that exits 3 fails its Job (backoffLimit 0) with that code in its status; a running
//! pod deleted ends with 143, which a podFailurePolicy rule turns into the Job's
//! failure; and a pod asking for 8 GPUs is scheduled onto a kwok node. Needs neither
//! real nodes nor images.

use std::time::Duration;

use e2e::control_plane::{ControlPlane, Tuning, wait_until};
use e2e::kwok::{self, EXIT_CODE_ENV, Kwok, RUN_SECONDS_ENV, SIGTERM_EXIT_CODE};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

use crate::slots::cluster_slot;

const NS: &str = "kwok";
const NODES: usize = 50;
const WAIT: Duration = Duration::from_secs(60);

/// A control plane without real nodes, in a directory of its own under the clusters'
/// root, and kwok on it.
async fn start() -> (ControlPlane, Kwok, kube::Client) {
    let dir = crate::harness::clusters_root().join(format!("pt{}-kwok", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cp = ControlPlane::start_with(&dir.join("control-plane"), &[], None, &Tuning::default())
        .await
        .unwrap_or_else(|e| panic!("the control plane did not start: {e}"));
    let kwok = Kwok::start(&cp, &dir.join("kwok")).unwrap_or_else(|e| panic!("kwok did not start: {e}"));
    let client = cp.client().await.unwrap_or_else(|e| panic!("{e}"));
    (cp, kwok, client)
}

/// A Job of one container, `marks` in its env, `spec` merged over its spec.
fn job(name: &str, marks: &[(&str, &str)], spec: serde_json::Value) -> Job {
    let env: Vec<serde_json::Value> = marks.iter().map(|(k, v)| json!({"name": k, "value": v})).collect();
    let mut job = json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "trainer", "image": "trainer:kwok", "env": env}],
        }}},
    });
    for (key, value) in spec.as_object().expect("a spec object") {
        job["spec"][key] = value.clone();
    }
    serde_json::from_value(job).expect("a Job")
}

/// Creates `job` and waits until it has condition `condition` True; the Job then.
async fn run_until(client: &kube::Client, job: &Job, condition: &str) -> Job {
    let name = job.metadata.name.clone().expect("a name");
    let jobs: Api<Job> = Api::namespaced(client.clone(), NS);
    jobs.create(&PostParams::default(), job).await.unwrap_or_else(|e| panic!("creating Job {name}: {e}"));
    wait_job(client, &name, condition).await
}

/// Waits until Job `name` has condition `condition` True, printing its status if not.
async fn wait_job(client: &kube::Client, name: &str, condition: &str) -> Job {
    let jobs: Api<Job> = Api::namespaced(client.clone(), NS);
    let what = format!("Job {name} {condition}");
    let job = wait_until(&what, WAIT, || async {
        let job = jobs.get(name).await.map_err(|e| e.to_string())?;
        let status = job.status.clone().unwrap_or_default();
        let met = status.conditions.iter().flatten().any(|c| c.type_ == condition && c.status == "True");
        if met { Ok(job) } else { Err(format!("status: {status:?}")) }
    })
    .await;
    job.unwrap_or_else(|e| panic!("{e}"))
}

/// The pods of Job `name`.
async fn pods_of(client: &kube::Client, name: &str) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let selector = format!("job-name={name}");
    pods.list(&ListParams::default().labels(&selector)).await.unwrap_or_else(|e| panic!("pods of {name}: {e}")).items
}

/// The first container's exit code, once it has terminated.
fn exit_code(pod: &Pod) -> Option<i32> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    Some(statuses.first()?.state.as_ref()?.terminated.as_ref()?.exit_code)
}

fn phase(pod: &Pod) -> String {
    pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default()
}

/// The namespace, once its default ServiceAccount (which admits pods) exists.
async fn namespace(client: &kube::Client) {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NS}})).expect("a Namespace");
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await.expect("the namespace");
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), NS);
    wait_until("the default ServiceAccount", WAIT, || async {
        sas.get_opt("default").await.map_err(|e| e.to_string())?.ok_or_else(|| "absent".to_string())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
}

/// Two pods of 2 s each: both succeed with exit code 0, the Job completes.
async fn an_indexed_job_completes(client: &kube::Client) {
    let spec = json!({"completionMode": "Indexed", "completions": 2, "parallelism": 2});
    let done = run_until(client, &job("two", &[(RUN_SECONDS_ENV, "2")], spec), "Complete").await;
    assert_eq!(done.status.and_then(|s| s.succeeded), Some(2));
    let pods = pods_of(client, "two").await;
    let ends: Vec<(String, Option<i32>)> = pods.iter().map(|p| (phase(p), exit_code(p))).collect();
    assert_eq!(ends, vec![("Succeeded".to_string(), Some(0)); 2], "{pods:?}");
}

/// A pod that exits 3 fails, and with backoffLimit 0 so does its Job.
async fn an_exit_code_fails_its_job(client: &kube::Client) {
    let marks = [(RUN_SECONDS_ENV, "1"), (EXIT_CODE_ENV, "3")];
    let failed = run_until(client, &job("three", &marks, json!({"backoffLimit": 0})), "Failed").await;
    let reason = failed.status.and_then(|s| s.conditions?.into_iter().find(|c| c.type_ == "Failed")?.reason);
    assert_eq!(reason.as_deref(), Some("BackoffLimitExceeded"));
    let pods = pods_of(client, "three").await;
    let ends: Vec<(String, Option<i32>)> = pods.iter().map(|p| (phase(p), exit_code(p))).collect();
    assert_eq!(ends, vec![("Failed".to_string(), Some(3))], "{pods:?}");
}

/// A running pod (no end of its own) deleted exits 143; the rule `FailJob` on 143
/// fails the Job at once, though its backoffLimit would allow retries.
async fn a_deleted_pod_fails_its_job_by_policy(client: &kube::Client) {
    let policy =
        json!({"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [SIGTERM_EXIT_CODE]}}]});
    let job = job("sigterm", &[], json!({"backoffLimit": 6, "podFailurePolicy": policy}));
    Api::<Job>::namespaced(client.clone(), NS).create(&PostParams::default(), &job).await.expect("the Job");
    let running = wait_until("the sigterm Job's pod Running", WAIT, || async {
        let pods = pods_of(client, "sigterm").await;
        let phases: Vec<String> = pods.iter().map(phase).collect();
        match pods.into_iter().find(|p| phase(p) == "Running") {
            Some(pod) => Ok(pod),
            None => Err(format!("pods' phases: {phases:?}")),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let name = running.metadata.name.clone().expect("a name");
    Api::<Pod>::namespaced(client.clone(), NS).delete(&name, &DeleteParams::default()).await.expect("the delete");
    let failed = wait_job(client, "sigterm", "Failed").await;
    let reason = failed.status.and_then(|s| s.conditions?.into_iter().find(|c| c.type_ == "Failed")?.reason);
    assert_eq!(reason.as_deref(), Some("PodFailurePolicy"));
}

/// A pod asking for a whole node's 8 GPUs runs on a kwok node.
async fn a_gpu_pod_schedules(client: &kube::Client) {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "gpus", "namespace": NS},
        "spec": {"containers": [{"name": "trainer", "image": "trainer:kwok",
            "resources": {"limits": {"nvidia.com/gpu": "8"}}}]},
    }))
    .expect("a Pod");
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.create(&PostParams::default(), &pod).await.expect("the GPU pod");
    let node = wait_until("the GPU pod Running", WAIT, || async {
        let pod = pods.get("gpus").await.map_err(|e| e.to_string())?;
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        match (phase(&pod), node) {
            (p, Some(node)) if p == "Running" => Ok(node),
            (p, node) => Err(format!("phase {p:?} on {node:?}: {:?}", pod.status)),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let labels =
        Api::<Node>::all(client.clone()).get(&node).await.expect("its node").metadata.labels.unwrap_or_default();
    assert_eq!(labels.get(kwok::NODE_LABEL.0).map(String::as_str), Some(kwok::NODE_LABEL.1), "{node}: {labels:?}");
}

#[tokio::test]
async fn kwok_nodes_run_job_pods_to_the_ends_their_marks_say() {
    let _slot = cluster_slot().await;
    let (_cp, _kwok, client) = start().await;
    let names = kwok::create_nodes(&client, "kwok-", NODES, 8).await.unwrap_or_else(|e| panic!("{e}"));
    kwok::wait_nodes_ready(&client, &names, Duration::from_secs(120)).await.unwrap_or_else(|e| panic!("{e}"));
    namespace(&client).await;
    an_indexed_job_completes(&client).await;
    an_exit_code_fails_its_job(&client).await;
    a_deleted_pod_fails_its_job_by_policy(&client).await;
    a_gpu_pod_schedules(&client).await;
}
