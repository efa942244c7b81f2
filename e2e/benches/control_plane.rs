//! `cargo bench -p e2e --bench control_plane --profile dev` (run by `make
//! bench-control-plane`): one 2-node run of `examples/tiny-cluster.yaml` (2M tokens) on
//! the real control plane and real nodes, with the chart's operator as its Deployment
//! (status polled and written every 2 s), and three figures:
//! - **apply → first step**: from `kubectl apply` to the first step record rank 0
//!   writes on the checkpoint claim, split at rank 0's container start into what
//!   Kubernetes takes (the operator's children, the Job controller, the scheduler, the
//!   kubelet and containerd) and what the trainer takes alone (launch, rendezvous, data, step 1):
//!   the second part is the peer, the same trainer without Kubernetes around it;
//! - **rank death → the new attempt's first step**: rank 0's worker SIGKILLed, until
//!   attempt 2's first step record (the Job's pod failure policy, the operator's gang
//!   restart, new pods, the resume from the checkpoint), with the same split;
//! - **API requests per steady-state reconcile**: `apiserver_request_total` (the API
//!   server's own metrics) over a window of `RECONCILES` reconciles of the Running run
//!   (`trainingrun_reconcile_total` from the operator's `/metrics`), by verb and
//!   resource. The window has no other writer of those resources: the kubelets and the
//!   controllers watch, and nothing changes.
//!
//! The last line printed is `BENCH_JSON {...}`. Needs root, the node stack and the
//! images (`scripts/setup-node.sh`, `scripts/setup-images.sh`).

#[path = "common/claim.rs"]
mod claim;
#[allow(dead_code)]
#[path = "../tests/real_cluster/harness.rs"]
mod harness;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use claim::{claim_dir, records, unix_now, until};
use e2e::test_cluster::TestCluster;
use harness::*;
use serde_json::json;
use serde_yaml_ng::Value as Yaml;

const NS: &str = "bench";
const RUN: &str = "bench";
const RECONCILES: u64 = 20;
/// Resources a run's reconcile reads or writes (leases are the leader election's and
/// the nodes', on their own clocks).
const RUN_RESOURCES: [&str; 8] =
    ["trainingruns", "configmaps", "services", "persistentvolumeclaims", "jobs", "pods", "events", "networkpolicies"];

/// The time of attempt `attempt`'s first step record.
fn first_step(dir: &Path, attempt: u64) -> Result<f64, String> {
    let all = records(dir);
    let began = all
        .iter()
        .position(|r| (r["kind"] == "start" || r["kind"] == "resume") && r["attempt"].as_u64() == Some(attempt))
        .ok_or_else(|| format!("no start record of attempt {attempt} yet ({} records)", all.len()))?;
    let step = all[began..].iter().find(|r| r["kind"] == "step").ok_or("no step of the attempt yet")?;
    step["time"].as_f64().ok_or_else(|| "a step record without a time".to_string())
}

/// When rank 0's container of `attempt` started, as its node's runtime records it.
fn container_started(c: &TestCluster, attempt: u32) -> f64 {
    let pod = rank0_pod(c, attempt);
    c.container_started_at(NS, &pod).unwrap_or_else(|e| panic!("{e}"))
}

/// `apiserver_request_total` summed by "VERB resource[/subresource]" over the run's
/// resources.
fn requests(c: &TestCluster) -> BTreeMap<String, f64> {
    let text = kubectl(c, &["get", "--raw", "/metrics"]);
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("apiserver_request_total{")) {
        let Some((labels, value)) = line.rsplit_once(' ') else { continue };
        let label = |k: &str| {
            labels.split(&format!("{k}=\"")).nth(1).and_then(|r| r.split('"').next()).unwrap_or_default().to_string()
        };
        let resource = label("resource");
        if !RUN_RESOURCES.contains(&resource.as_str()) {
            continue;
        }
        let sub = label("subresource");
        let key = if sub.is_empty() {
            format!("{} {resource}", label("verb"))
        } else {
            format!("{} {resource}/{sub}", label("verb"))
        };
        *out.entry(key).or_insert(0.0) += value.parse::<f64>().unwrap_or(0.0);
    }
    out
}

fn reconciles(c: &TestCluster) -> u64 {
    let pod = operator_pods(c).into_iter().next().expect("the operator's pod");
    let text = operator_metrics(c, &pod).unwrap_or_else(|e| panic!("{e}"));
    text.lines()
        .filter(|l| l.starts_with("trainingrun_reconcile_total{"))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum::<f64>() as u64
}

fn rank0_pod(c: &TestCluster, attempt: u32) -> String {
    let selector = format!("job-name={RUN}-a{attempt},batch.kubernetes.io/job-completion-index=0");
    kubectl(c, &["-n", NS, "get", "pods", "-l", &selector, "-o", "jsonpath={.items[0].metadata.name}"])
}

fn main() {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
    let c = runtime.block_on(cluster(2));
    helm_install_in_cluster(&c, &["replicas=1", "statusPollInterval=2s", "statusWriteInterval=2s"]);
    runtime.block_on(namespace(&c, NS));
    let run = tiny_cluster(RUN, |d| {
        d["spec"]["topology"]["nodes"] = Yaml::from(2);
        d["spec"]["tokens"] = Yaml::from("2M");
    });

    // apply → first step.
    let applied = unix_now();
    apply(&c, NS, &run);
    let dir = claim_dir(&c, NS, &format!("{RUN}-checkpoints"));
    let stepped = until("attempt 1's first step", Duration::from_secs(300), || first_step(&dir, 1));
    let started = container_started(&c, 1);
    let to_first_step = stepped - applied;
    println!(
        "apply → first step: {to_first_step:.1} s = {:.1} s until rank 0's container starts (the operator's children, the Job controller, the scheduler, the kubelet) + {:.1} s the trainer alone (launch, rendezvous, data, step 1): Kubernetes takes {:.2} of it",
        started - applied,
        stepped - started,
        (started - applied) / to_first_step
    );

    // Steady state: a checkpoint written, the run Running; RECONCILES reconciles.
    until("a first checkpoint", Duration::from_secs(300), || {
        let s = run_field(&c, NS, RUN, "{.status.lastCheckpoint.step}");
        if s.parse::<u64>().is_ok() { Ok(()) } else { Err(run_field(&c, NS, RUN, "{.status.phase}")) }
    });
    let (r0, q0, t0) = (reconciles(&c), requests(&c), Instant::now());
    let r1 = until("the steady-state window's reconciles", Duration::from_secs(300), || {
        let r = reconciles(&c);
        if r >= r0 + RECONCILES { Ok(r) } else { Err(format!("{} reconciles", r - r0)) }
    });
    let q1 = requests(&c);
    let window = t0.elapsed().as_secs_f64();
    assert_eq!(run_field(&c, NS, RUN, "{.status.phase}"), "Running", "the window must be steady");
    let n = (r1 - r0) as f64;
    let mut per_reconcile: BTreeMap<String, f64> = BTreeMap::new();
    for (k, v) in &q1 {
        let d = v - q0.get(k).copied().unwrap_or(0.0);
        if d > 0.0 {
            per_reconcile.insert(k.clone(), d / n);
        }
    }
    let total: f64 = per_reconcile.values().sum();
    println!("API requests per steady-state reconcile: {total:.2} over {n} reconciles in {window:.0} s");
    for (k, v) in &per_reconcile {
        println!("  {k:<40} {v:.2}");
    }

    // Rank 0's worker dies → attempt 2's first step.
    let pod = rank0_pod(&c, 1);
    let killed = unix_now();
    let workers = c.kill_workers(NS, &pod).unwrap_or_else(|e| panic!("{e}"));
    assert!(workers > 0, "pod {pod} has no workers");
    let stepped2 = until("attempt 2's first step", Duration::from_secs(300), || first_step(&dir, 2));
    let started2 = container_started(&c, 2);
    let recovery = stepped2 - killed;
    println!(
        "rank death → attempt 2's first step: {recovery:.1} s = {:.1} s until rank 0's new container starts (the pod failure policy, the gang restart, new pods) + {:.1} s the trainer's start and resume",
        started2 - killed,
        stepped2 - started2
    );
    println!(
        "BENCH_JSON {}",
        json!({
            "apply_to_first_step_s": to_first_step,
            "apply_to_container_start_s": started - applied,
            "container_start_to_first_step_s": stepped - started,
            "rank_death_to_first_step_s": recovery,
            "rank_death_to_container_start_s": started2 - killed,
            "requests_per_reconcile": total,
            "requests_per_reconcile_by_kind": per_reconcile,
            "reconciles": n,
        })
    );
}
