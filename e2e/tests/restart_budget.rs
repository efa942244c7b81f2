//! The restart budget holds: restarts are counted on the TrainingRun's status and never
//! reset, whether Jobs are deleted by hand or by a TTL, the operator restarts in the
//! middle of a restart, or another replica takes the lead; and a Failed run stays
//! Failed (kubeflow/trainer #3779, #3737).

use std::time::Duration;

use crds::contract::{FailureReason, TerminationMessage};
use crds::types::RunPhase;

mod common;
use common::NS;
use common::harness::{Harness, running};

fn delete_job(h: &Harness, job: &str) {
    h.fake.delete("batch/v1", "Job", Some(NS), job).unwrap();
}

#[tokio::test]
async fn deleting_the_job_counts_as_a_restart_and_never_resets_the_budget() {
    let mut h = Harness::new();
    running(&h, "llm").await;
    delete_job(&h, "llm-a1");
    h.settle("llm").await;
    let s = h.status("llm");
    assert_eq!(
        (s.phase, s.reason.as_deref(), s.attempt, s.restarts),
        (Some(RunPhase::Restarting), Some("JobDeleted"), 2, 1)
    );
    let message = h.condition("llm", "Restarting").2;
    assert!(
        message.contains("Job llm-a1 was deleted before it finished") && message.contains("restart 1 of 2"),
        "{message}"
    );
    assert!(h.has_event("Warning", "JobDeleted"));
    // The Job was deleted as the API does by default for Jobs, orphaning its pods: the
    // operator deletes them, so attempt 2 never shares a hostname with them.
    assert!(h.pods().iter().all(|p| !p.starts_with("llm-a1-")), "{:?}", h.pods());
    assert_eq!(h.jobs(), vec!["llm-a2"]);

    // A new operator (a restart, or another replica taking the lead) counts on.
    h.restart_operator();
    h.start_pods("llm-a2", "Running");
    h.settle("llm").await;
    assert_eq!((h.status("llm").phase, h.status("llm").restarts), (Some(RunPhase::Running), 1));
    delete_job(&h, "llm-a2");
    h.restart_operator();
    h.settle("llm").await;
    assert_eq!((h.status("llm").attempt, h.status("llm").restarts), (3, 2));
    assert_eq!(h.jobs(), vec!["llm-a3"]);

    // Over the budget (maxRestarts 2): Failed, and nothing recreates a Job.
    h.start_pods("llm-a3", "Running");
    h.settle("llm").await;
    delete_job(&h, "llm-a3");
    h.settle("llm").await;
    let s = h.status("llm");
    assert_eq!(
        (s.phase, s.reason.as_deref(), s.attempt, s.restarts),
        (Some(RunPhase::Failed), Some("MaxRestartsExceeded"), 3, 2)
    );
    assert!(h.jobs().is_empty(), "{:?}", h.jobs());
    h.clock.advance(Duration::from_secs(3600));
    h.restart_operator();
    h.settle("llm").await;
    assert!(h.jobs().is_empty(), "a Failed run stays Failed: {:?}", h.jobs());
}

/// The Job failed and its TTL removed it before the operator looked: the failure is
/// still counted.
#[tokio::test]
async fn a_failed_job_removed_by_its_ttl_before_the_operator_saw_it_still_counts() {
    let h = Harness::new();
    running(&h, "llm").await;
    h.pod_exits("llm-a1-0-abcde", 1, "Error", "Segmentation fault");
    h.job_condition("llm-a1", "Failed");
    delete_job(&h, "llm-a1");
    h.settle("llm").await;
    let s = h.status("llm");
    assert_eq!((s.reason.as_deref(), s.attempt, s.restarts), (Some("JobDeleted"), 2, 1));
    assert_eq!(h.jobs(), vec!["llm-a2"]);
}

/// A Failed run whose Job is then deleted (by hand or by its TTL) is left alone.
#[tokio::test]
async fn a_failed_run_stays_failed_when_its_job_goes() {
    let h = Harness::new();
    running(&h, "llm").await;
    let msg =
        TerminationMessage { reason: FailureReason::NaNLoss, step: Some(7), detail: "loss=NaN".into(), samples: None }
            .to_json();
    h.pod_exits("llm-a1-0-abcde", FailureReason::NaNLoss.exit_code(), "Error", &msg);
    h.settle("llm").await;
    assert_eq!(h.status("llm").phase, Some(RunPhase::Failed));
    delete_job(&h, "llm-a1");
    h.clock.advance(Duration::from_secs(600));
    h.settle("llm").await;
    let s = h.status("llm");
    assert_eq!((s.phase, s.reason.as_deref(), s.attempt, s.restarts), (Some(RunPhase::Failed), Some("NaNLoss"), 1, 0));
    assert!(h.jobs().is_empty());
}
