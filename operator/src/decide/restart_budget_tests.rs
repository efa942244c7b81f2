//! The restart budget holds: restarts are counted on the TrainingRun's status and never
//! reset, whether Jobs are deleted by hand or by a TTL, or the operator restarts (or
//! another replica takes the lead) in between; and a Failed run stays Failed
//! (kubeflow/trainer #3779, #3737). On plans ([`World`]).

use std::time::Duration;

use crds::contract::{FailureReason, TerminationMessage};
use crds::types::RunPhase;
use kube::ResourceExt;

use super::world::World;

/// `kubectl delete job`, as the API does by default for Jobs: its pods are orphaned.
fn delete_job(w: &mut World, job: &str) {
    w.o.attempts.jobs.retain(|j| j.name_any() != job);
    for pod in &mut w.o.attempts.pods {
        pod.metadata.owner_references = None;
    }
}

/// A new operator process, or another replica taking the lead: nothing remembered.
fn new_operator(w: &mut World) {
    w.o.memory = Default::default();
}

#[test]
fn deleting_the_job_counts_as_a_restart_and_never_resets_the_budget() {
    let mut w = World::running("llm");
    delete_job(&mut w, "llm-a1");
    w.settle();
    let s = w.status();
    assert_eq!(
        (s.phase, s.reason.as_deref(), s.attempt, s.restarts),
        (Some(RunPhase::Restarting), Some("JobDeleted"), 2, 1)
    );
    let message = crate::status::condition(&s, "Restarting").unwrap().message.clone();
    assert!(
        message.contains("Job llm-a1 was deleted before it finished") && message.contains("restart 1 of 2"),
        "{message}"
    );
    assert!(w.has_event("Warning", "JobDeleted"));
    // The orphaned pods go, so that attempt 2 never shares a hostname with them.
    assert!(w.o.attempts.pods.iter().all(|p| !p.name_any().starts_with("llm-a1-")));
    assert_eq!(w.jobs(), vec!["llm-a2"]);

    new_operator(&mut w);
    w.start_pods("llm-a2", "Running");
    w.settle();
    assert_eq!((w.status().phase, w.status().restarts), (Some(RunPhase::Running), 1));
    delete_job(&mut w, "llm-a2");
    new_operator(&mut w);
    w.settle();
    assert_eq!((w.status().attempt, w.status().restarts), (3, 2));
    assert_eq!(w.jobs(), vec!["llm-a3"]);

    // Over the budget (maxRestarts 2): Failed, and nothing recreates a Job.
    w.start_pods("llm-a3", "Running");
    w.settle();
    delete_job(&mut w, "llm-a3");
    w.settle();
    let s = w.status();
    assert_eq!(
        (s.phase, s.reason.as_deref(), s.attempt, s.restarts),
        (Some(RunPhase::Failed), Some("MaxRestartsExceeded"), 3, 2)
    );
    assert!(w.jobs().is_empty(), "{:?}", w.jobs());
    w.advance(Duration::from_secs(3600));
    new_operator(&mut w);
    w.settle();
    assert!(w.jobs().is_empty(), "a Failed run stays Failed: {:?}", w.jobs());
}

/// The Job failed and its TTL removed it before the operator looked: the failure is
/// still counted.
#[test]
fn a_failed_job_removed_by_its_ttl_before_the_operator_saw_it_still_counts() {
    let mut w = World::running("llm");
    w.pod_exits("llm-a1-0-abcde", 1, "Error", "Segmentation fault");
    w.job_condition("llm-a1", "Failed");
    delete_job(&mut w, "llm-a1");
    w.settle();
    let s = w.status();
    assert_eq!((s.reason.as_deref(), s.attempt, s.restarts), (Some("JobDeleted"), 2, 1));
    assert_eq!(w.jobs(), vec!["llm-a2"]);
}

/// A Failed run whose Job is then deleted (by hand or by its TTL) is left alone.
#[test]
fn a_failed_run_stays_failed_when_its_job_goes() {
    let mut w = World::running("llm");
    let msg =
        TerminationMessage { reason: FailureReason::NaNLoss, step: Some(7), detail: "loss=NaN".into(), samples: None }
            .to_json();
    w.pod_exits("llm-a1-0-abcde", FailureReason::NaNLoss.exit_code(), "Error", &msg);
    w.settle();
    assert_eq!(w.status().phase, Some(RunPhase::Failed));
    delete_job(&mut w, "llm-a1");
    w.advance(Duration::from_secs(600));
    w.settle();
    let s = w.status();
    assert_eq!((s.phase, s.reason.as_deref(), s.attempt, s.restarts), (Some(RunPhase::Failed), Some("NaNLoss"), 1, 0));
    assert!(w.jobs().is_empty());
}
