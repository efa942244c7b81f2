//! §3.5 and issue 43's drill 5: the operator itself. The chart's two replicas, as its
//! Deployment on real nodes: one holds the real Lease; its process SIGKILLed with 51 runs
//! in flight (two training, 49 suspended, one of the two just failed), the other takes
//! over within the lease duration and goes on observing the same Jobs, with no spurious
//! restart, no duplicate Job and the one real restart counted once; the killed replica,
//! restarted by its kubelet once that is back, waits as the standby. And what the
//! operator writes, read from the API server's audit log (issue 63).

use std::time::{Duration, Instant};

use serde_yaml_ng::Value;

use crate::harness::*;
use crate::slots::cluster_slot;

/// The operator's Lease duration (`operator/src/main.rs`), plus its grace.
const LEASE: Duration = Duration::from_secs(15 + 5);

/// Runs suspended beside the two that train: 51 in flight.
const SUSPENDED: usize = 49;

/// The messages of the events about object `name`.
fn event_messages(c: &e2e::test_cluster::TestCluster, name: &str) -> Vec<String> {
    let selector = format!("involvedObject.name={name}");
    let jsonpath = "jsonpath={range .items[*]}{.message}{'\\n'}{end}";
    kubectl(c, &["-n", "ml", "get", "events", "--field-selector", &selector, "-o", jsonpath])
        .lines()
        .map(String::from)
        .collect()
}

/// A tiny run of `steps` steps of 4,096 tokens on `nodes` nodes, each step at least a
/// second long (`TRAINER_INJECT_SLOW_STEP_MS`).
fn paced_run(name: &str, nodes: u32, steps: u64) -> String {
    tiny_cluster(name, |d| {
        d["spec"]["topology"]["nodes"] = Value::from(nodes);
        d["spec"]["batch"]["globalTokens"] = Value::from(4096);
        d["spec"]["tokens"] = Value::from(steps * 4096);
        d["spec"]["env"] =
            serde_yaml_ng::from_str(r#"[{name: TRAINER_INJECT_SLOW_STEP_MS, value: "1000"}]"#).expect("the env's YAML");
    })
}

#[tokio::test]
async fn a_killed_leader_hands_over_without_a_spurious_restart() {
    let _slot = cluster_slot().await;
    let mut c = cluster(3).await;
    helm_install_in_cluster(&c, &["statusPollInterval=2s", "statusWriteInterval=2s"]);
    let replicas = operator_pods(&c);
    assert_eq!(replicas.len(), 2, "the chart's two replicas: {replicas:?}");
    let leader = poll(&c, OPERATOR_NS, "a leader", Duration::from_secs(60), || {
        let h = operator_leader(&c);
        if replicas.contains(&h) { Ok(h) } else { Err(format!("holder {h:?}")) }
    });
    namespace(&c, "ml").await;
    // ha trains through the hand-over; flaky restarts once. Their steps are small and
    // paced: a second each whatever the machine, so that ha is mid-run at the hand-over
    // and both still end in time with three clusters' trainers on two cores.
    apply(&c, "ml", &paced_run("ha", 2, 100));
    apply(&c, "ml", &paced_run("flaky", 1, 60));
    let suspended: Vec<String> = (0..SUSPENDED)
        .map(|i| tiny_cluster(&format!("queued-{i:02}"), |d| d["spec"]["suspend"] = Value::from(true)))
        .collect();
    apply(&c, "ml", &suspended.join("---\n"));
    let field = |c: &e2e::test_cluster::TestCluster, p: &str| run_field(c, "ml", "ha", p);
    poll(&c, "ml", "ha training", Duration::from_secs(480), || {
        let step = field(&c, "{.status.progress.step}");
        if step.parse::<u64>().is_ok_and(|s| s >= 3) { Ok(()) } else { Err(field(&c, "{.status}")) }
    });
    poll(&c, "ml", "every suspended run's Job", Duration::from_secs(120), || {
        let phases = kubectl(&c, &["-n", "ml", "get", "trainingruns", "-o", "jsonpath={.items[*].status.phase}"]);
        let n = phases.split_whitespace().filter(|p| *p == "Suspended").count();
        if n == SUSPENDED { Ok(()) } else { Err(format!("{n} Suspended: {phases}")) }
    });
    poll(&c, "ml", "flaky training", Duration::from_secs(300), || {
        let step = run_field(&c, "ml", "flaky", "{.status.progress.step}");
        if step.parse::<u64>().is_ok_and(|s| s >= 1) { Ok(()) } else { Err(format!("step {step:?}")) }
    });

    // flaky's worker dies, and at once the leader: the restart straddles the hand-over.
    let pod = kubectl(
        &c,
        &["-n", "ml", "get", "pods", "-l", "job-name=flaky-a1", "-o", "jsonpath={.items[0].metadata.name}"],
    );
    assert_eq!(c.kill_workers("ml", pod.trim()).unwrap_or_else(|e| panic!("{e}")), 1);
    // SIGKILL the leader's process: no chance to release the Lease. Its kubelet, down
    // first, cannot restart it at once (a restarted process of the same pod is the same
    // holder, and would keep the Lease).
    let restarts = operator_restarts(&c, &leader);
    let leader_node = kubectl(&c, &["-n", OPERATOR_NS, "get", "pod", &leader, "-o", "jsonpath={.spec.nodeName}"]);
    c.kill_kubelet(leader_node.trim()).unwrap_or_else(|e| panic!("{e}"));
    let killed = Instant::now();
    kill_operator(&c, &leader);
    let standby = replicas.iter().find(|r| **r != leader).expect("the other replica").clone();
    poll(&c, OPERATOR_NS, "the standby takes the Lease", LEASE + Duration::from_secs(10), || {
        let h = operator_leader(&c);
        if h == standby { Ok(()) } else { Err(format!("holder {h:?}")) }
    });
    let handover = killed.elapsed();
    eprintln!("lease handover after SIGKILL: {:.1} s (lease duration 15 s)", handover.as_secs_f64());
    assert!(handover <= LEASE + Duration::from_secs(2), "handover took {handover:?}");

    // Its kubelet, back, restarts the container; it comes back as the standby.
    c.start_kubelet(leader_node.trim()).unwrap_or_else(|e| panic!("{e}"));
    wait_operator_restarted(&c, &leader, restarts);
    wait_for(&c, "ml", "trainingrun/ha", "condition=Succeeded", Duration::from_secs(600));
    assert_eq!(field(&c, "{.status.attempt}"), "1", "no spurious restart");
    assert_eq!(field(&c, "{.status.restarts}"), "0");
    let jobs = kubectl(&c, &["-n", "ml", "get", "jobs", "-o", "name"]);
    let ha: Vec<&str> = jobs.lines().filter(|j| j.starts_with("job.batch/ha-")).collect();
    assert_eq!(ha, ["job.batch/ha-a1"], "one Job, never a duplicate");
    let events = kubectl(
        &c,
        &["-n", "ml", "get", "events", "--field-selector", "involvedObject.name=ha,reason=JobCreated", "-o", "name"],
    );
    assert_eq!(events.lines().count(), 1, "one JobCreated event: {events}");
    assert_eq!(operator_leader(&c), standby, "the restarted replica waits while the other leads");

    // The restart that straddled the hand-over, counted once.
    wait_for(&c, "ml", "trainingrun/flaky", "condition=Succeeded", Duration::from_secs(600));
    let flaky = |p: &str| run_field(&c, "ml", "flaky", p);
    assert_eq!((flaky("{.status.attempt}"), flaky("{.status.restarts}")), ("2".into(), "1".into()));
    let restarts: Vec<String> =
        event_messages(&c, "flaky").into_iter().filter(|m| m.contains("restarting the gang")).collect();
    assert_eq!(restarts.len(), 1, "one restart event: {restarts:?}");
    assert!(restarts[0].contains("restart 1 of"), "{restarts:?}");
    // Every suspended run: one suspended Job of attempt 1, nothing counted.
    let all_jobs = kubectl(
        &c,
        &["-n", "ml", "get", "jobs", "-o", "jsonpath={range .items[*]}{.metadata.name} {.spec.suspend}{'\\n'}{end}"],
    );
    let mut names: Vec<&str> = all_jobs.lines().map(|l| l.split(' ').next().unwrap_or_default()).collect();
    names.sort();
    let mut want: Vec<String> = (0..SUSPENDED).map(|i| format!("queued-{i:02}-a1")).collect();
    want.extend(["flaky-a2".to_string(), "ha-a1".to_string()]);
    want.sort();
    assert_eq!(names, want, "one Job a run, of its current attempt");
    assert!(all_jobs.lines().filter(|l| l.starts_with("queued-")).all(|l| l.ends_with(" true")), "{all_jobs}");
    let attempts = kubectl(
        &c,
        &[
            "-n",
            "ml",
            "get",
            "trainingruns",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.status.attempt} {.status.restarts}{'\\n'}{end}",
        ],
    );
    for line in attempts.lines().filter(|l| l.starts_with("queued-")) {
        assert!(line.ends_with(" 1 0"), "a suspended run restarted: {line}");
    }
}

/// The operator's ServiceAccount, as the API server's audit log names it.
const OPERATOR_USER: &str = "system:serviceaccount:trainingrun-system:trainingrun-operator";

/// The operator's own requests in the API server's audit log, from the `from`th on.
fn operator_requests(c: &e2e::test_cluster::TestCluster, from: usize) -> Vec<e2e::control_plane::audit::Request> {
    let all = c.cp.audit().unwrap_or_else(|e| panic!("the audit log: {e}"));
    all.into_iter().skip(from).filter(|r| r.user.username == OPERATOR_USER).collect()
}

/// The leaves of a managed-fields set (`f:metadata` → `f:labels` → `f:team`), each as
/// its path.
fn field_paths(fields: &serde_json::Value) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    fn walk(v: &serde_json::Value, at: String, out: &mut std::collections::BTreeSet<String>) {
        match v.as_object() {
            Some(o) if !o.is_empty() => {
                for (k, child) in o.iter().filter(|(k, _)| k.as_str() != ".") {
                    walk(child, format!("{at}/{k}"), out);
                }
            }
            _ => {
                out.insert(at);
            }
        }
    }
    walk(fields, String::new(), &mut out);
    out
}

/// `trainingrun_reconcile_reads_total{source="cache"}` of the operator's one replica:
/// how many reconciles read the watches' caches instead of the API.
fn cache_reads(c: &e2e::test_cluster::TestCluster, pod: &str) -> Result<u64, String> {
    let text = operator_metrics(c, pod)?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with(r#"trainingrun_reconcile_reads_total{source="cache"}"#))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum::<f64>() as u64)
}

/// The operator refuses to start without its CRDs, naming the one missing and the fix.
/// What it writes, read from the API server's audit log: the children it builds, owned
/// by the run and applied by its field manager alone, no field of them managed by
/// another as well (the Job's status is the Job controller's, the claim's binding the PV
/// binder's); never a spec; once the run has settled, a reconcile reads its caches and
/// makes no request at all;
/// and a deleted run is cleaned up through the finalizer (its series dropped, a
/// `Deleted` event), its children collected by the garbage collector. Then, on the same
/// cluster, the operator's parts in this process (`in_process`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_owns_its_children_writes_nothing_once_settled_and_cleans_up() {
    let _slot = cluster_slot().await;
    let c = cluster(1).await;
    // Without its CRDs the operator does not start, naming what is missing and the fix.
    let client = c.cp.client().await.unwrap_or_else(|e| panic!("the admin's client: {e}"));
    let crds_installed = async || operator::controller::check_crd(&client).await.map_err(|e| e.to_string());
    let err = crds_installed().await.expect_err("no CRD installed");
    assert!(
        err.contains("trainingruns.training.puretransformer.dev is not installed")
            && err.contains("kubectl apply -f crds/"),
        "{err}"
    );
    let crd = repo().join("crds/trainingruns.yaml");
    kubectl(&c, &["apply", "--server-side", "-f", &crd.display().to_string()]);
    wait_established(&c, "trainingruns");
    let err = crds_installed().await.expect_err("the TrainingDataset CRD missing");
    assert!(err.contains("trainingdatasets.training.puretransformer.dev is not installed"), "{err}");
    helm_install_in_cluster(&c, &["replicas=1", "statusPollInterval=1s", "statusWriteInterval=1s"]);
    crds_installed().await.unwrap_or_else(|e| panic!("the chart installs both CRDs: {e}"));
    namespace(&c, "ml").await;
    // Four steps of 8K tokens.
    let run = tiny_cluster("own", |d| {
        d["spec"]["tokens"] = Value::from("32K");
        d["spec"]["optimizer"]["warmupTokens"] = Value::from("8K");
    });
    apply(&c, "ml", &run);
    poll(&c, "ml", "the run Succeeded", Duration::from_secs(300), || {
        match run_field(&c, "ml", "own", "{.status.phase}").as_str() {
            "Succeeded" => Ok(()),
            "Failed" => panic!("the run failed: {}", run_field(&c, "ml", "own", "{.status}")),
            _ => Err(run_field(&c, "ml", "own", "{.status}")),
        }
    });

    let uid = run_field(&c, "ml", "own", "{.metadata.uid}");
    for (kind, name) in [
        ("job", "own-a1"),
        ("configmap", "own-config"),
        ("service", "own"),
        ("persistentvolumeclaim", "own-checkpoints"),
    ] {
        let o: serde_json::Value =
            serde_json::from_str(&kubectl(&c, &["-n", "ml", "get", kind, name, "-o", "json", "--show-managed-fields"]))
                .expect("JSON");
        assert_eq!(o["metadata"]["ownerReferences"][0]["uid"], uid.as_str(), "{kind} {name}: {}", o["metadata"]);
        let fields = o["metadata"]["managedFields"].as_array().cloned().unwrap_or_default();
        let applied: Vec<&serde_json::Value> = fields.iter().filter(|f| f["operation"] == "Apply").collect();
        assert!(
            applied.len() == 1 && applied[0]["manager"] == "trainingrun-operator",
            "{kind} {name} is applied by the operator alone: {fields:#?}"
        );
        // Others (the PV binder, the Job controller) manage fields of their own only.
        let ours = field_paths(&applied[0]["fieldsV1"]);
        for other in fields.iter().filter(|f| f["operation"] != "Apply") {
            let theirs = field_paths(&other["fieldsV1"]);
            let shared: Vec<&String> = theirs.intersection(&ours).collect();
            assert!(shared.is_empty(), "{kind} {name}: {} also manages {shared:?}", other["manager"]);
        }
    }
    let spec_writes: Vec<_> = operator_requests(&c, 0)
        .into_iter()
        .filter(|r| r.is_write() && r.resource() == "trainingruns")
        .filter(|r| r.request_object.as_ref().is_some_and(|b| b.to_string().contains("spec")))
        .collect();
    assert!(spec_writes.is_empty(), "the operator wrote a TrainingRun's spec: {spec_writes:#?}");

    // Settled: an annotation (not a change of spec) wakes the operator, whose reconcile
    // reads its caches and makes no request at all (its Lease and watches aside).
    let pod = operator_pods(&c).into_iter().next().expect("the operator's pod");
    let before = cache_reads(&c, &pod).unwrap_or_else(|e| panic!("the operator's metrics: {e}"));
    let audited = c.cp.audit().expect("the audit log").len();
    kubectl(&c, &["-n", "ml", "annotate", "trainingrun", "own", "team=nlp"]);
    poll(&c, OPERATOR_NS, "a reconcile of the annotated run from the caches", Duration::from_secs(60), || {
        let n = cache_reads(&c, &pod)?;
        if n > before { Ok(()) } else { Err(format!("{n} reconciles read the caches ({before} before)")) }
    });
    let requests: Vec<String> = operator_requests(&c, audited)
        .iter()
        .filter(|r| !matches!(r.verb.as_str(), "watch") && r.resource() != "leases")
        .map(|r| format!("{} {} {:?}", r.verb, r.resource(), r.object_ref.as_ref().map(|o| &o.name)))
        .collect();
    assert!(requests.is_empty(), "a settled run's reconcile made requests: {requests:#?}");

    // Deleted: the finalizer's cleanup, then the garbage collector.
    kubectl(&c, &["-n", "ml", "delete", "trainingrun", "own", "--wait=false"]);
    poll(&c, "ml", "the run and its children gone", Duration::from_secs(120), || {
        let left = kubectl(&c, &["-n", "ml", "get", "trainingruns,jobs,configmaps,services,pvc", "-o", "name"]);
        let left: Vec<&str> = left.lines().filter(|l| l.contains("own") && !l.contains("kube-root-ca")).collect();
        if left.is_empty() { Ok(()) } else { Err(format!("{left:?}")) }
    });
    let metrics = operator_metrics(&c, &pod).unwrap_or_else(|e| panic!("the operator's metrics: {e}"));
    assert!(!metrics.contains(r#"name="own""#), "the deleted run's series are dropped");
    let reasons = event_reasons(&c, "ml", "own");
    assert!(reasons.iter().any(|r| r == "Deleted"), "the cleanup's Deleted event: {reasons:?}");

    // The operator's parts in this process, with the chart's operator scaled to nothing.
    let instance = format!("app.kubernetes.io/instance={RELEASE}");
    kubectl(&c, &["-n", OPERATOR_NS, "scale", "deployment", "-l", &instance, "--replicas=0"]);
    poll(&c, OPERATOR_NS, "the chart's operator gone", Duration::from_secs(120), || {
        let left = kubectl(&c, &["-n", OPERATOR_NS, "get", "pods", "-l", &instance, "-o", "name"]);
        if left.trim().is_empty() { Ok(()) } else { Err(left) }
    });
    crate::in_process::the_recorder_folds_repeats_into_series(&c).await;
    crate::in_process::one_of_two_replicas_leads(&c).await;
    crate::in_process::the_controller_runs_on_watches_and_stops_gracefully(&c).await;
}
