//! §3.4: failures the real way, on real nodes. A running run edited into a spec that no longer
//! resolves is refused (Accepted=False naming the field) while its attempt goes on; a
//! rank's process killed (exit 137) goes through the Job's pod failure policy and the
//! operator's gang restart to attempt 2, which resumes from the last checkpoint. (A NaN,
//! an OOM kill, a full disk, suspend and resize are in `scenarios.rs`.)

use std::time::Duration;

use serde_yaml_ng::Value;

use crate::harness::*;
use crate::slots::cluster_slot;

/// The pod of `job`'s completion index `index`.
fn pod_of(c: &e2e::test_cluster::TestCluster, ns: &str, job: &str, index: u32) -> String {
    let selector = format!("job-name={job},batch.kubernetes.io/job-completion-index={index}");
    kubectl(c, &["-n", ns, "get", "pods", "-l", &selector, "-o", "jsonpath={.items[0].metadata.name}"])
}

#[tokio::test]
async fn a_refused_edit_leaves_the_attempt_alone_and_a_killed_rank_restarts_the_gang_from_its_checkpoint() {
    let _slot = cluster_slot().await;
    let c = cluster_with(2, |_| {}).await;
    helm_install_in_cluster(&c, &["statusPollInterval=2s", "statusWriteInterval=2s"]);
    namespace(&c, "ml").await;
    let run = tiny_cluster("restart", |d| {
        d["spec"]["topology"]["nodes"] = Value::from(2);
        d["spec"]["topology"]["resources"]["requests"]["cpu"] = Value::from("500m");
        d["spec"]["tokens"] = Value::from("1M");
    });
    apply(&c, "ml", &run);
    let field = |c: &e2e::test_cluster::TestCluster, p: &str| run_field(c, "ml", "restart", p);
    let step = poll(&c, "ml", "a first checkpoint", Duration::from_secs(300), || {
        field(&c, "{.status.lastCheckpoint.step}").parse::<u64>().map_err(|_| field(&c, "{.status}"))
    });

    // An edit that no longer resolves: refused, naming the field; attempt 1 goes on.
    patch_run(&c, "ml", "restart", r#"{"spec":{"batch":{"globalTokens":10000}}}"#);
    wait_for(&c, "ml", "trainingrun/restart", "condition=Accepted=false", Duration::from_secs(60));
    let message = field(&c, "{.status.conditions[?(@.type==\"Accepted\")].message}");
    assert!(message.contains("spec.batch.globalTokens"), "Accepted=False must name the field: {message}");
    assert_eq!(field(&c, "{.status.phase}"), "Running", "the running attempt is left alone");
    assert_eq!(field(&c, "{.status.attempt}"), "1");
    let active = kubectl(&c, &["-n", "ml", "get", "job", "restart-a1", "-o", "jsonpath={.status.active}"]);
    assert_eq!(active, "2", "attempt 1's pods keep running");
    patch_run(&c, "ml", "restart", r#"{"spec":{"batch":{"globalTokens":8192}}}"#);
    wait_for(&c, "ml", "trainingrun/restart", "condition=Accepted=true", Duration::from_secs(60));

    // Rank 0's trainer worker dies (SIGKILL, exit 137): the real Job controller fails
    // the Job by its pod failure policy, the operator restarts the gang.
    let pod = pod_of(&c, "ml", "restart-a1", 0);
    let killed = c.kill_workers("ml", &pod).unwrap_or_else(|e| panic!("{e}"));
    assert!(killed > 0, "pod {pod}'s launcher has no workers");
    poll(&c, "ml", "attempt 2", Duration::from_secs(180), || match field(&c, "{.status.attempt}").as_str() {
        "2" => Ok(()),
        other => Err(format!("attempt {other}; {}", field(&c, "{.status.conditions}"))),
    });
    assert_eq!(field(&c, "{.status.restarts}"), "1");
    wait_for(&c, "ml", "trainingrun/restart", "condition=Succeeded", Duration::from_secs(600));
    assert_eq!(field(&c, "{.status.restarts}"), "1");

    // Attempt 2 resumed from a checkpoint at least as new as the one seen before the kill.
    let pod = pod_of(&c, "ml", "restart-a2", 0);
    let log = kubectl(&c, &["-n", "ml", "logs", &pod]);
    let resumed: u64 = log
        .lines()
        .find_map(|l| l.split("resuming from ").nth(1)?.split(" at step ").nth(1)?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("attempt 2 did not resume from a checkpoint:\n{log}"));
    assert!(resumed >= step && resumed > 0, "attempt 2 resumed at step {resumed}; a checkpoint of step {step} existed");
    let events = event_reasons(&c, "ml", "restart");
    assert!(events.iter().any(|r| r == "ChangeRefused"), "events: {events:?}");
}
