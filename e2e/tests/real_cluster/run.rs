//! §3.2 and §3.3 on real nodes: the chart installed by Helm, the operator running as the
//! chart's Deployment (its image, ServiceAccount, probes and security context), and a
//! two-node run whose ranks are containers of the trainer image under real kubelets,
//! rendezvousing through CoreDNS's names, carried to Succeeded by the real Job
//! controller, scheduler and EndpointSlice controller; deleting it collects its children
//! through owner references. `kubectl port-forward` reaches the operator's metrics
//! through the kubelet, and the chart's NetworkPolicies are enforced.

use std::time::Duration;

use crds::contract::{RENDEZVOUS_PORT, STATUS_PORT};
use e2e::test_cluster::TestCluster;
use serde_yaml_ng::Value;

use crate::harness::*;
use crate::probe::{self, Probe};
use crate::slots::cluster_slot;

#[tokio::test]
async fn the_chart_installs_and_a_two_node_run_trains_end_to_end() {
    let _slot = cluster_slot().await;
    // A node offers its share of the CPUs (one of this machine's two), less the
    // operator's and CoreDNS's requests: a rank of half a CPU fits once per node, so the
    // scheduler must spread them.
    let started = std::time::Instant::now();
    let c = cluster_with(2, |_| {}).await;
    // Figures for docs/perf.md (printed, not asserted).
    eprintln!("real cluster of 2 nodes started in {:.1} s", started.elapsed().as_secs_f64());

    helm_install_in_cluster(&c, &["networkPolicy.enabled=true", "statusPollInterval=2s", "statusWriteInterval=2s"]);
    let objects = kubectl(
        &c,
        &["-n", OPERATOR_NS, "get", "serviceaccount,deployment,service,networkpolicy,role,rolebinding", "-o", "name"],
    );
    for want in [
        "serviceaccount/trainingrun-operator",
        "deployment.apps/trainingrun-operator",
        "service/trainingrun-operator",
        "networkpolicy.networking.k8s.io/trainingrun-operator",
    ] {
        assert!(objects.contains(want), "the chart did not create {want}:\n{objects}");
    }
    let cluster_roles = kubectl(&c, &["get", "clusterrole,clusterrolebinding", "-o", "name"]);
    assert!(cluster_roles.contains("clusterrole.rbac.authorization.k8s.io/trainingrun-operator"), "{cluster_roles}");

    namespace(&c, "ml").await;
    // A pod of the run's namespace that is none of its ranks, ready before the run starts.
    let outsider = Probe::start(&c, "ml", "outsider");
    let run = tiny_cluster("tiny-cluster", |d| {
        d["spec"]["topology"]["nodes"] = Value::from(2);
        d["spec"]["topology"]["resources"]["requests"]["cpu"] = Value::from("500m");
        // At least 30 s of steps (122 of them): the ranks still listen while the
        // NetworkPolicy probes below run. Small ones, that three clusters' trainers on
        // two cores still take in time.
        d["spec"]["env"] = serde_yaml_ng::from_str("[{name: TRAINER_INJECT_SLOW_STEP_MS, value: '250'}]").unwrap();
        d["spec"]["batch"]["globalTokens"] = Value::from(2048);
        d["spec"]["batch"]["microBatch"] = Value::from(4);
        d["spec"]["tokens"] = Value::from(122 * 2048);
    });
    let applied = std::time::Instant::now();
    apply(&c, "ml", &run);
    poll(&c, "ml", "a first step", Duration::from_secs(300), || {
        let step = run_field(&c, "ml", "tiny-cluster", "{.status.progress.step}");
        if step.parse::<u64>().is_ok_and(|s| s >= 1) { Ok(()) } else { Err(format!("step {step:?}")) }
    });
    eprintln!("kubectl apply to the first step: {:.1} s", applied.elapsed().as_secs_f64());

    // `kubectl port-forward` through the kubelet reaches each replica's metrics: the
    // leader's describe the run, the standby's say that it stands by.
    let leader = operator_leader(&c);
    let replicas = operator_pods(&c);
    assert!(replicas.len() == 2 && replicas.contains(&leader), "replicas {replicas:?}, leader {leader:?}");
    for pod in replicas {
        let (mut forward, local) = port_forward(&c, OPERATOR_NS, &format!("pod/{pod}"), OPERATOR_METRICS_PORT);
        let metrics = http_get_local(local, "/metrics");
        let _ = forward.kill();
        let _ = forward.wait();
        let leads = pod == leader;
        let status = format!("leader_election_master_status{{name=\"{RELEASE}\"}} {}", u8::from(leads));
        assert!(metrics.contains(&status), "{pod}'s metrics through port-forward (leader {leader}):\n{metrics}");
        assert_eq!(metrics.contains("trainingrun_phase{"), leads, "{pod}'s metrics (leader {leader}):\n{metrics}");
    }

    network_policies_hold(&c, &leader, outsider);

    wait_for(&c, "ml", "trainingrun/tiny-cluster", "condition=Succeeded", Duration::from_secs(600));

    let field = |p: &str| run_field(&c, "ml", "tiny-cluster", p);
    assert_eq!(field("{.status.progress.percent}"), "100", "progress: {}", field("{.status.progress}"));
    let loss: f64 =
        field("{.status.metrics.loss}").parse().unwrap_or_else(|_| panic!("no loss: {}", field("{.status}")));
    assert!(loss.is_finite() && loss < 6.0, "final loss {loss}");
    assert_eq!(field("{.status.restarts}"), "0");
    let table = kubectl(&c, &["-n", "ml", "get", "tr"]);
    eprintln!("{table}");
    let row = table.lines().find(|l| l.starts_with("tiny-cluster")).expect("a row for the run");
    assert!(row.contains("Succeeded") && row.contains("100.0%"), "kubectl get tr: {row}");

    // Both ranks ran, one on each node (the scheduler's doing), and rendezvoused
    // through the headless Service's names.
    let pods = kubectl(
        &c,
        &[
            "-n",
            "ml",
            "get",
            "pods",
            "-l",
            "job-name=tiny-cluster-a1",
            "-o",
            "jsonpath={range .items[*]}{.spec.nodeName} {.status.phase}{'\\n'}{end}",
        ],
    );
    let mut nodes: Vec<&str> = pods.lines().map(|l| l.split(' ').next().unwrap_or_default()).collect();
    nodes.sort();
    assert_eq!(nodes, ["node-0", "node-1"], "pods:\n{pods}");
    assert!(pods.lines().all(|l| l.ends_with("Succeeded")), "{pods}");

    let events = event_reasons(&c, "ml", "tiny-cluster");
    assert!(events.iter().any(|r| r == "JobCreated"), "the operator's events: {events:?}");

    // Deleting the run collects its children through owner references.
    let job = field("{.status.jobName}");
    assert_eq!(job, "tiny-cluster-a1");
    kubectl(&c, &["-n", "ml", "delete", "trainingrun", "tiny-cluster", "--wait=true", "--timeout=60s"]);
    for what in
        ["configmap/tiny-cluster-config", "service/tiny-cluster", "job/tiny-cluster-a1", "pvc/tiny-cluster-checkpoints"]
    {
        poll(&c, "ml", &format!("{what} collected"), Duration::from_secs(60), || {
            match c.kubectl_out(&["-n", "ml", "get", what, "--ignore-not-found", "-o", "name"]) {
                Ok(out) if out.trim().is_empty() => Ok(()),
                Ok(out) => Err(out),
                Err(e) => Err(e),
            }
        });
    }
    poll(&c, "ml", "the run's pods collected", Duration::from_secs(60), || {
        let left = c.kubectl_out(&["-n", "ml", "get", "pods", "-o", "name"])?;
        if left.trim().is_empty() { Ok(()) } else { Err(left) }
    });
}

/// The chart's NetworkPolicy and the run's, enforced by kube-router on each node, both
/// ways: `outsider`, a pod of the run's namespace that is none of its ranks, reaches
/// neither rank 0's rendezvous port nor its status port, but does reach the operator's
/// metrics (open to scrapers); rank 1 reaches both of rank 0's ports before and after
/// (they are listening all along), and the operator, from its own namespace, goes on
/// reading rank 0's `/status`.
fn network_policies_hold(c: &TestCluster, leader: &str, outsider: Probe) {
    let rank = |index: u32| {
        let selector = format!("job-name=tiny-cluster-a1,batch.kubernetes.io/job-completion-index={index}");
        let name =
            kubectl(c, &["-n", "ml", "get", "pods", "-l", &selector, "-o", "jsonpath={.items[0].metadata.name}"]);
        let ip = c.pod_ip("ml", &name).unwrap_or_else(|e| panic!("rank {index}'s address: {e}"));
        (name, ip)
    };
    let ((_, rank0), (rank1, _)) = (rank(0), rank(1));
    let operator = c.pod_ip(OPERATOR_NS, leader).expect("the operator's address");
    let peers_connect = |when: &str| {
        for port in [RENDEZVOUS_PORT, STATUS_PORT] {
            assert!(probe::reaches(c, "ml", &rank1, rank0, port), "{when}: rank 1 could not reach rank 0 on {port}");
        }
    };
    peers_connect("before the probes");
    // The policy applies once kube-router has seen the run's pods: wait for that event
    // in the data path itself.
    poll(c, "ml", "rank 0's rendezvous port closed to a pod outside the run", Duration::from_secs(60), || {
        if outsider.reaches(rank0, RENDEZVOUS_PORT) { Err("the outsider connects".into()) } else { Ok(()) }
    });
    assert!(!outsider.reaches(rank0, STATUS_PORT), "a pod outside the run reached rank 0's status port");
    assert!(outsider.reaches(operator, OPERATOR_METRICS_PORT), "the outsider could not reach the operator's metrics");
    peers_connect("after the probes");
    drop(outsider);
    let step = || run_field(c, "ml", "tiny-cluster", "{.status.progress.step}").parse::<u64>().unwrap_or(0);
    let seen = step();
    poll(c, "ml", "the operator reading rank 0's /status", Duration::from_secs(120), || {
        let now = step();
        if now > seen { Ok(()) } else { Err(format!("step {now}, {seen} before the probes")) }
    });
}

/// Issue 62's RBAC finding: the operator deletes the pods that no Job owns (a Job deleted
/// with `--cascade=orphan` leaves its ranks running, holding their hostnames and
/// GPUs). Under the chart's own ClusterRole, as the chart's Deployment, the orphans go
/// and the run goes on.
#[tokio::test]
async fn ranks_orphaned_by_their_job_are_deleted_under_the_charts_rbac() {
    let _slot = cluster_slot().await;
    let c = cluster_with(1, |_| {}).await;
    helm_install_in_cluster(&c, &["statusPollInterval=2s", "statusWriteInterval=2s"]);
    namespace(&c, "ml").await;
    let run = tiny_cluster("orphans", |d| {
        d["spec"]["topology"]["resources"]["requests"]["cpu"] = Value::from("500m");
        // About 49 steps on one rank: time to orphan it mid-run, without a million tokens
        // more after (the example's budget took this test 4 minutes).
        d["spec"]["tokens"] = Value::from("400K");
    });
    apply(&c, "ml", &run);
    poll(&c, "ml", "a first step", Duration::from_secs(300), || {
        let step = run_field(&c, "ml", "orphans", "{.status.progress.step}");
        if step.parse::<u64>().is_ok_and(|s| s >= 1) { Ok(()) } else { Err(format!("step {step:?}")) }
    });
    let rank = kubectl(&c, &["-n", "ml", "get", "pods", "-l", "job-name=orphans-a1", "-o", "name"]);
    assert_eq!(rank.lines().count(), 1, "one rank: {rank}");
    kubectl(&c, &["-n", "ml", "delete", "job", "orphans-a1", "--cascade=orphan", "--wait=true"]);
    // Orphaned: the pod runs on with no owner, until the operator deletes it.
    let owners = kubectl(&c, &["-n", "ml", "get", rank.trim(), "-o", "jsonpath={.metadata.ownerReferences}"]);
    assert!(owners.trim().is_empty(), "the Job's garbage collection left the pod its owner: {owners}");
    poll(&c, "ml", "the orphaned rank deleted by the operator", Duration::from_secs(120), || {
        let left = c.kubectl_out(&["-n", "ml", "get", rank.trim(), "--ignore-not-found", "-o", "name"])?;
        let deleting = c.kubectl_out(&[
            "-n",
            "ml",
            "get",
            rank.trim(),
            "--ignore-not-found",
            "-o",
            "jsonpath={.metadata.deletionTimestamp}",
        ])?;
        if left.trim().is_empty() || !deleting.trim().is_empty() { Ok(()) } else { Err(format!("{left} still there")) }
    });
    wait_for(&c, "ml", "trainingrun/orphans", "condition=Succeeded", Duration::from_secs(600));
}

/// `GET path` from 127.0.0.1:`port`: the whole response.
fn http_get_local(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("the forwarded port");
    stream.set_read_timeout(Some(Duration::from_secs(20))).expect("a timeout");
    write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").expect("the request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("the response");
    response
}
