//! §3.5: the operator itself. Two replicas as the chart's ServiceAccount: one holds the
//! real Lease; SIGKILLed mid-run, the other takes over within the lease duration and
//! goes on observing the same Job, with no spurious restart and no duplicate Job; the
//! killed replica, started again, waits as the standby.

use std::time::{Duration, Instant};

use serde_yaml_ng::Value;

use crate::harness::*;

/// The operator's Lease duration (`operator/src/main.rs`), plus its grace.
const LEASE: Duration = Duration::from_secs(15 + 5);

fn holder(c: &e2e::test_cluster::TestCluster) -> String {
    c.kubectl_out(&["-n", OPERATOR_NS, "get", "lease", RELEASE, "-o", "jsonpath={.spec.holderIdentity}"])
        .unwrap_or_default()
}

#[tokio::test]
async fn a_killed_leader_hands_over_without_a_spurious_restart() {
    let _slot = cluster_slot().await;
    let mut c = cluster_with(2, |o| o.cpu = "1500m".into()).await;
    helm_install(&c, &["statusPollInterval=2s", "statusWriteInterval=2s"]);
    start_chart_operator(&mut c, "trainingrun-operator-0");
    start_chart_operator(&mut c, "trainingrun-operator-1");
    let leader = poll(&c, OPERATOR_NS, "a leader", Duration::from_secs(60), || {
        let h = holder(&c);
        if h.starts_with("trainingrun-operator-") { Ok(h) } else { Err(format!("holder {h:?}")) }
    });
    namespace(&c, "ml").await;
    let run = tiny_cluster("ha", |d| {
        d["spec"]["topology"]["nodes"] = Value::from(2);
        d["spec"]["tokens"] = Value::from("2M");
    });
    apply(&c, "ml", &run);
    let field = |c: &e2e::test_cluster::TestCluster, p: &str| run_field(c, "ml", "ha", p);
    poll(&c, "ml", "a first checkpoint", Duration::from_secs(300), || {
        field(&c, "{.status.lastCheckpoint.step}").parse::<u64>().map_err(|_| field(&c, "{.status}"))
    });

    // SIGKILL the leader: no chance to release the Lease.
    let index: usize = leader.rsplit('-').next().and_then(|i| i.parse().ok()).expect("the leader's index");
    let killed = Instant::now();
    c.operators[index].daemon.kill();
    let standby = format!("trainingrun-operator-{}", 1 - index);
    poll(&c, OPERATOR_NS, "the standby takes the Lease", LEASE + Duration::from_secs(10), || {
        let h = holder(&c);
        if h == standby { Ok(()) } else { Err(format!("holder {h:?}")) }
    });
    let handover = killed.elapsed();
    eprintln!("lease handover after SIGKILL: {:.1} s (lease duration 15 s)", handover.as_secs_f64());
    assert!(handover <= LEASE + Duration::from_secs(2), "handover took {handover:?}");

    // The killed replica comes back (as its Deployment would restart it) as the standby.
    start_chart_operator(&mut c, &leader);
    wait_for(&c, "ml", "trainingrun/ha", "condition=Succeeded", Duration::from_secs(600));
    assert_eq!(field(&c, "{.status.attempt}"), "1", "no spurious restart");
    assert_eq!(field(&c, "{.status.restarts}"), "0");
    let jobs = kubectl(&c, &["-n", "ml", "get", "jobs", "-o", "name"]);
    assert_eq!(jobs.trim(), "job.batch/ha-a1", "one Job, never a duplicate");
    let events = kubectl(
        &c,
        &["-n", "ml", "get", "events", "--field-selector", "involvedObject.name=ha,reason=JobCreated", "-o", "name"],
    );
    assert_eq!(events.lines().count(), 1, "one JobCreated event: {events}");
    assert_eq!(holder(&c), standby, "the restarted replica waits while the other leads");
}
