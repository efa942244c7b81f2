//! §3.5 and issue 43's drill 5: the operator itself. The chart's two replicas, as its
//! Deployment on real nodes: one holds the real Lease; its process SIGKILLed with 51 runs
//! in flight (two training, 49 suspended, one of the two just failed), the other takes
//! over within the lease duration and goes on observing the same Jobs, with no spurious
//! restart, no duplicate Job and the one real restart counted once; the killed replica,
//! restarted by its kubelet once that is back, waits as the standby.

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
    let run = tiny_cluster("ha", |d| {
        d["spec"]["topology"]["nodes"] = Value::from(2);
        d["spec"]["tokens"] = Value::from("2M");
    });
    apply(&c, "ml", &run);
    apply(&c, "ml", &tiny_cluster("flaky", |_| {}));
    let suspended: Vec<String> = (0..SUSPENDED)
        .map(|i| tiny_cluster(&format!("queued-{i:02}"), |d| d["spec"]["suspend"] = Value::from(true)))
        .collect();
    apply(&c, "ml", &suspended.join("---\n"));
    let field = |c: &e2e::test_cluster::TestCluster, p: &str| run_field(c, "ml", "ha", p);
    poll(&c, "ml", "a first checkpoint", Duration::from_secs(300), || {
        field(&c, "{.status.lastCheckpoint.step}").parse::<u64>().map_err(|_| field(&c, "{.status}"))
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
