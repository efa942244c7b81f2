//! The verdicts of [`super::classify`], and the pods and Jobs other modules' tests build.

use super::*;
use crate::resources::testing::{GPU_SPEC, run};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;

pub fn pod(index: u32, status: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {
            "name": format!("llm-a1-{index}-x"),
            "annotations": {"batch.kubernetes.io/job-completion-index": index.to_string()},
            "creationTimestamp": "2026-01-01T00:00:00Z"
        },
        "spec": {"containers": [{"name": "trainer", "resources": {"limits": {"memory": "64Gi"}}}]},
        "status": status
    }))
    .unwrap()
}

pub fn running(index: u32) -> Pod {
    pod(index, json!({"phase": "Running"}))
}

pub fn exited(index: u32, code: i32, reason: &str, message: &str) -> Pod {
    pod(
        index,
        json!({"phase": if code == 0 { "Succeeded" } else { "Failed" }, "containerStatuses": [{
            "name": "trainer", "ready": false, "restartCount": 0, "image": "i", "imageID": "", "started": false,
            "state": {"terminated": {"exitCode": code, "reason": reason, "message": message, "finishedAt": "2026-01-01T01:00:00Z"}}
        }]}),
    )
}

pub fn job(conditions: serde_json::Value) -> Job {
    serde_json::from_value(json!({"metadata": {"name": "llm-a1"}, "status": {"conditions": conditions}})).unwrap()
}

fn now() -> Timestamp {
    "2026-01-01T02:00:00Z".parse().unwrap()
}

fn verdict(job_: &Job, pods: &[Pod]) -> Verdict {
    let cfg = crds::resolve(&run(GPU_SPEC)).unwrap();
    classify(job_, pods, &cfg, now(), &Settings::default())
}

fn nan_message() -> String {
    crds::contract::TerminationMessage {
        reason: FailureReason::NaNLoss,
        step: Some(1200),
        detail: "loss=NaN grad_norm=inf".into(),
        samples: Some(crds::contract::FailedSamples { from: 307_200, to: 307_456, checkpoint: 256_000 }),
    }
    .to_json()
}

#[test]
fn all_nodes_running() {
    assert_eq!(verdict(&job(json!([])), &[running(0), running(1)]), Verdict::Running);
    assert_eq!(verdict(&job(json!([])), &[running(0)]), Verdict::Pending { stuck: None });
    assert_eq!(verdict(&job(json!([])), &[]), Verdict::Pending { stuck: None });
    // The last step's all-reduce done, node 1 exits a moment before node 0.
    assert_eq!(verdict(&job(json!([])), &[running(0), exited(1, 0, "Completed", "")]), Verdict::Running);
}

#[test]
fn nan_exit_names_the_step_and_its_samples() {
    let v = verdict(&job(json!([])), &[running(0), exited(1, 86, "Error", &nan_message())]);
    let Verdict::NonFinite { message, at } = v else { panic!("{v:?}") };
    assert!(message.starts_with("NaNLoss at step 1200"), "{message}");
    assert!(message.contains("llm-a1-1-x (node rank 1)"), "{message}");
    assert!(message.contains("failurePolicy.onNaN: rollback"), "the hint names the policy: {message}");
    let samples = crds::contract::FailedSamples { from: 307_200, to: 307_456, checkpoint: 256_000 };
    assert_eq!(at, NonFinite { step: Some(1200), samples: Some(samples) });
}

#[test]
fn cuda_oom_and_host_oom_are_told_apart_with_different_hints() {
    let cuda = crds::contract::TerminationMessage {
        reason: FailureReason::OutOfMemory,
        step: Some(3),
        detail: "CUDA out of memory".into(),
        samples: None,
    };
    // The trainer's own OOM, which the failure policy may answer with a smaller
    // micro-batch; a host OOMKilled always fails.
    let v = verdict(&job(json!([])), &[exited(0, 87, "Error", &cuda.to_json())]);
    let Verdict::DeviceOutOfMemory { message } = v else { panic!("{v:?}") };
    assert!(
        message.contains("spec.batch.microBatch (now 8)") && message.contains("gradientCheckpointing"),
        "{message}"
    );
    let Verdict::Failed { reason, message } = verdict(&job(json!([])), &[exited(0, 137, "OOMKilled", "")]) else {
        panic!()
    };
    assert_eq!(reason, "OutOfMemory");
    assert!(
        message.contains("host memory (memory limit 64Gi)") && message.contains("resources.limits.memory"),
        "{message}"
    );
}

#[test]
fn other_failures_restart_and_count() {
    let v = verdict(&job(json!([])), &[exited(0, 1, "Error", "thread panicked\nsegfault in foo\n"), running(1)]);
    assert_eq!(
        v,
        Verdict::Restart {
            reason: "PodFailed".into(),
            message: "pod llm-a1-0-x (node rank 0) exited with code 1: segfault in foo".into(),
            counts: true
        }
    );
    let timeout = crds::contract::TerminationMessage {
        reason: FailureReason::CollectiveTimeout,
        step: Some(9),
        detail: "allreduce".into(),
        samples: None,
    };
    let Verdict::Restart { reason, counts, .. } =
        verdict(&job(json!([])), &[exited(1, 88, "Error", &timeout.to_json())])
    else {
        panic!()
    };
    assert_eq!((reason.as_str(), counts), ("CollectiveTimeout", true));
    let aborted = verdict(
        &job(json!([])),
        &[exited(1, 134, "Error", "terminate called after throwing an instance of 'c10::Error'\n")],
    );
    let Verdict::Restart { message, .. } = aborted else { panic!("{aborted:?}") };
    assert!(
        message
            .ends_with("exited with code 134 (SIGABRT): terminate called after throwing an instance of 'c10::Error'"),
        "{message}"
    );
}

#[test]
fn a_peer_crash_next_to_a_collective_timeout_is_reported_as_the_cause() {
    let timeout = crds::contract::TerminationMessage {
        reason: FailureReason::CollectiveTimeout,
        step: Some(9),
        detail: "a peer died".into(),
        samples: None,
    };
    let at = |p: Pod, t: &str| {
        let mut v = serde_json::to_value(p).unwrap();
        v["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"] = json!(t);
        serde_json::from_value::<Pod>(v).unwrap()
    };
    let waiting = |t: &str| at(exited(0, 88, "Error", &timeout.to_json()), t);
    let killed = |t: &str| at(exited(1, 137, "Error", ""), t);
    // The same second, the timeout listed first: the kill is the cause.
    for pods in [
        [waiting("2026-01-01T01:00:00Z"), killed("2026-01-01T01:00:00Z")],
        [killed("2026-01-01T01:00:03Z"), waiting("2026-01-01T01:00:00Z")],
    ] {
        let Verdict::Restart { reason, message, counts } = verdict(&job(json!([])), &pods) else { panic!() };
        assert_eq!((reason.as_str(), counts), ("PodFailed", true));
        assert!(message.contains("(node rank 1) exited with code 137 (SIGKILL)"), "{message}");
    }
    // A crash long after the timeout is a separate event: the first failure stands.
    let pods = [waiting("2026-01-01T01:00:00Z"), killed("2026-01-01T01:05:00Z")];
    let Verdict::Restart { reason, .. } = verdict(&job(json!([])), &pods) else { panic!() };
    assert_eq!(reason, "CollectiveTimeout");

    // The timeout exits first while its cause is still on its way out (now is 02:00:00).
    let full = crds::contract::TerminationMessage {
        reason: FailureReason::StorageFull,
        step: Some(8),
        detail: "No space left on device".into(),
        samples: None,
    };
    let cause = at(exited(1, 89, "Error", &full.to_json()), "2026-01-01T02:00:00Z");
    let cases: [(&str, &str, Option<Pod>, &str); 4] = [
        ("peer still exiting", "2026-01-01T01:59:58Z", Some(running(1)), "AwaitingCause"),
        ("peer hung past the window", "2026-01-01T01:59:40Z", Some(running(1)), "Restart"),
        ("peer exited fatally", "2026-01-01T01:59:59Z", Some(cause), "Failed"),
        ("no peer left", "2026-01-01T01:59:59Z", None, "Restart"),
    ];
    for (name, finished, peer, want) in cases {
        let pods: Vec<Pod> = [Some(waiting(finished)), peer].into_iter().flatten().collect();
        let v = verdict(&job(json!([])), &pods);
        let got = match &v {
            Verdict::AwaitingCause { message } => {
                assert!(message.contains("CollectiveTimeout") && message.contains("name the cause"), "{message}");
                "AwaitingCause"
            }
            Verdict::Restart { reason, .. } => {
                assert_eq!(reason, "CollectiveTimeout", "{name}");
                "Restart"
            }
            Verdict::Failed { reason, message } => {
                assert_eq!(reason, "StorageFull", "{name}");
                assert!(message.contains("StorageFull at step 8"), "{message}");
                "Failed"
            }
            other => panic!("{name}: {other:?}"),
        };
        assert_eq!(got, want, "{name}: {v:?}");
    }
}

#[test]
fn disruptions_restart_without_counting_even_when_peers_time_out() {
    let preempted = pod(
        0,
        json!({"phase": "Failed", "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler", "message": "preempted by high-prio", "lastTransitionTime": "2026-01-01T00:59:00Z"}]}),
    );
    let timeout = crds::contract::TerminationMessage {
        reason: FailureReason::CollectiveTimeout,
        step: None,
        detail: "peer gone".into(),
        samples: None,
    };
    let v = verdict(&job(json!([])), &[preempted, exited(1, 88, "Error", &timeout.to_json())]);
    let Verdict::Restart { reason, message, counts } = v else { panic!("{v:?}") };
    assert_eq!((reason.as_str(), counts), ("Disruption", false));
    assert!(message.contains("PreemptionByScheduler"), "{message}");
}

#[test]
fn a_pod_stuck_terminating_on_a_lost_node_is_a_disruption() {
    let mut p = running(1);
    p.metadata.deletion_timestamp = Some(Time("2026-01-01T01:58:30Z".parse().unwrap()));
    let Verdict::Restart { counts, message, .. } = verdict(&job(json!([])), &[running(0), p.clone()]) else { panic!() };
    assert!(!counts && message.contains("node is lost"), "{message}");
    // Just deleted (within the timeout): not yet.
    p.metadata.deletion_timestamp = Some(Time("2026-01-01T01:59:30Z".parse().unwrap()));
    assert_eq!(verdict(&job(json!([])), &[running(0), p]), Verdict::Pending { stuck: None });
}

#[test]
fn completion_reads_rank_zeros_final_report() {
    let done = TrainerStatus {
        phase: crds::contract::TrainerPhase::Done,
        attempt: 1,
        step: 244,
        total_steps: 244,
        tokens: 1000,
        total_tokens: 1000,
        metrics: crds::types::RunMetrics { loss: Some(0.64), ..Default::default() },
        last_checkpoint: None,
        best_checkpoint: None,
        tokens_by_source: Default::default(),
        ranks: Vec::new(),
    };
    let pods = [exited(0, 0, "Completed", &serde_json::to_string(&done).unwrap()), exited(1, 0, "Completed", "")];
    let v = verdict(&job(json!([{"type": "Complete", "status": "True"}])), &pods);
    assert_eq!(v, Verdict::Succeeded { report: Some(Box::new(done)) });
    assert_eq!(
        verdict(&job(json!([{"type": "Complete", "status": "True"}])), &[]),
        Verdict::Succeeded { report: None }
    );
}

#[test]
fn a_failed_job_without_pods_is_read_from_its_condition() {
    let j = job(
        json!([{"type": "Failed", "status": "True", "reason": "PodFailurePolicy", "message": "Container trainer for pod ml/llm-a1-0 failed with exit code 86 matching FailJob rule at index 1"}]),
    );
    let Verdict::NonFinite { message, at } = verdict(&j, &[]) else { panic!() };
    assert!(message.contains("exit code 86"), "{message}");
    assert_eq!(at, NonFinite::default(), "the pods are gone, and what they said with them");
    let j = job(
        json!([{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"}]),
    );
    let Verdict::Restart { counts, reason, .. } = verdict(&j, &[]) else { panic!() };
    assert_eq!((counts, reason.as_str()), (true, "JobFailed"));
}

#[test]
fn pods_stuck_pending_are_reported_after_the_timeout() {
    let pull = pod(
        0,
        json!({"phase": "Pending", "containerStatuses": [{"name": "trainer", "ready": false, "restartCount": 0, "image": "i", "imageID": "", "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"nope\""}}}]}),
    );
    let Verdict::Pending { stuck: Some((reason, message)) } = verdict(&job(json!([])), std::slice::from_ref(&pull))
    else {
        panic!()
    };
    assert_eq!(reason, "ImagePullBackOff");
    assert!(message.contains("nope"));
    let unsched = pod(
        1,
        json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/4 nodes have nvidia.com/gpu"}]}),
    );
    let Verdict::Pending { stuck: Some((reason, _)) } = verdict(&job(json!([])), &[running(0), unsched.clone()]) else {
        panic!()
    };
    assert_eq!(reason, "Unschedulable");
    // Young pods are not stuck yet.
    let mut young = unsched;
    young.metadata.creation_timestamp = Some(Time("2026-01-01T01:59:00Z".parse().unwrap()));
    assert_eq!(verdict(&job(json!([])), &[young]), Verdict::Pending { stuck: None });
}
