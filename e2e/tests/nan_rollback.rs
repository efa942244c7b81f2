//! `failurePolicy.onNaN: rollback` through the operator's real reconcile against the
//! fake API: a trainer's NaNLoss exit becomes a rollback in `status.effective.rollbacks`
//! and the ConfigMap, a new attempt not counted toward maxRestarts, a Warning event,
//! `RolledBack=True` and its metric; after the last one the run fails as NaNLoss.

use crds::contract::{FailedSamples, FailureReason, TerminationMessage};
use crds::types::{Rollback, RunPhase};

mod common;
use common::NS;
use common::harness::{Harness, SPEC};

fn nan(step: u64, samples: FailedSamples) -> String {
    TerminationMessage {
        reason: FailureReason::NaNLoss,
        step: Some(step),
        detail: "step 13: non-finite training signal (loss NaN, gradient norm NaN)".into(),
        samples: Some(samples),
    }
    .to_json()
}

fn config(h: &Harness) -> crds::RunConfig {
    let cm = h.fake.get("v1", "ConfigMap", Some(NS), "llm-config").unwrap();
    serde_json::from_str(cm["data"]["run.json"].as_str().unwrap()).unwrap()
}

#[tokio::test]
async fn a_nan_rolls_back_until_the_rollbacks_are_spent() {
    let h = Harness::new();
    let spec = SPEC.replace("stallTimeout: 10m}", "stallTimeout: 10m, onNaN: rollback, rollbackLrSteps: 20}");
    assert_ne!(spec, SPEC);
    h.apply("llm", &spec);
    h.settle("llm").await;
    let (ok, reason, _) = h.condition("llm", "RolledBack");
    assert_eq!((ok.as_str(), reason.as_str()), ("False", "NotRolledBack"), "the policy's condition is there");
    h.start_pods("llm-a1", "Running");
    h.settle("llm").await;
    // 32 sequences a step: step 13 trained 384..416, after step 10's checkpoint at 320.
    let first = FailedSamples { from: 384, to: 416, checkpoint: 320 };
    h.pod_exits("llm-a1-1-abcde", FailureReason::NaNLoss.exit_code(), "Error", &nan(13, first));
    h.settle("llm").await;

    let s = h.status("llm");
    assert_eq!(
        (s.phase, s.reason.as_deref(), s.attempt, s.restarts),
        (Some(RunPhase::Restarting), Some("NaNRollback"), 2, 0)
    );
    let want = Rollback {
        step: 13,
        attempt: 1,
        skip_from: 384,
        skip_to: 416,
        lr_factor: 0.5,
        lr_until_step: 33,
        from_step: None,
    };
    assert_eq!(s.effective.as_ref().unwrap().rollbacks, std::slice::from_ref(&want));
    let message = h.condition("llm", "Restarting").2;
    assert!(message.contains("rolling back (1 of 2, failurePolicy.onNaN: rollback)"), "{message}");
    assert!(message.contains("never training on samples 384..416 (that step's global batch) again"), "{message}");
    assert!(message.contains("at 0.5× the learning rate through step 33"), "{message}");
    assert!(h.has_event("Warning", "NaNRollback"));
    let (rolled, reason, listed) = h.condition("llm", "RolledBack");
    assert_eq!((rolled.as_str(), reason.as_str()), ("True", "NaNRollback"));
    assert!(listed.starts_with("1 of 2 rollbacks after non-finite steps: step 13 of attempt 1"), "{listed}");
    // Attempt 2's config carries the rollback to the trainer; the spec is untouched.
    let cfg = config(&h);
    assert_eq!((cfg.attempt, cfg.rollbacks.clone()), (2, vec![want]));
    assert_eq!(h.condition("llm", "Accepted").0, "True");
    assert!(h.metrics.render().contains(r#"trainingrun_rollbacks{name="llm",namespace="ml"} 1"#));

    // A second non-finite step: the second and last rollback.
    h.start_pods("llm-a2", "Running");
    h.settle("llm").await;
    let second = FailedSamples { from: 480, to: 512, checkpoint: 320 };
    h.pod_exits("llm-a2-0-abcde", FailureReason::NaNLoss.exit_code(), "Error", &nan(15, second));
    h.settle("llm").await;
    let s = h.status("llm");
    assert_eq!((s.phase, s.attempt, s.restarts), (Some(RunPhase::Restarting), 3, 0));
    assert_eq!(config(&h).rollbacks.len(), 2);
    assert!(h.condition("llm", "RolledBack").2.starts_with("2 of 2 rollbacks"));

    // The third fails the run as NaNLoss: no new attempt, the alert's condition.
    h.start_pods("llm-a3", "Running");
    h.settle("llm").await;
    h.pod_exits("llm-a3-0-abcde", FailureReason::NaNLoss.exit_code(), "Error", &nan(15, second));
    h.settle("llm").await;
    let s = h.status("llm");
    assert_eq!((s.phase, s.reason.as_deref(), s.attempt, s.restarts), (Some(RunPhase::Failed), Some("NaNLoss"), 3, 0));
    let failed = h.condition("llm", "Failed").2;
    assert!(failed.contains("no rollbacks left after 2 (failurePolicy.maxRollbacks 2)"), "{failed}");
    assert_eq!(h.jobs(), vec!["llm-a3"], "no attempt 4");
}

/// Without the policy a NaN fails the run at once, and the message says what the policy would do.
#[tokio::test]
async fn without_the_policy_a_nan_fails_the_run() {
    let h = Harness::new();
    h.apply("llm", SPEC);
    h.settle("llm").await;
    let conditions = h.status("llm").conditions;
    assert!(conditions.iter().all(|c| c.type_ != "RolledBack"), "no RolledBack condition without the policy");
    h.start_pods("llm-a1", "Running");
    h.settle("llm").await;
    let samples = FailedSamples { from: 384, to: 416, checkpoint: 320 };
    h.pod_exits("llm-a1-0-abcde", FailureReason::NaNLoss.exit_code(), "Error", &nan(13, samples));
    h.settle("llm").await;
    let s = h.status("llm");
    assert_eq!((s.phase, s.reason.as_deref(), s.attempt), (Some(RunPhase::Failed), Some("NaNLoss"), 1));
    assert!(h.condition("llm", "Failed").2.contains("set spec.failurePolicy.onNaN: rollback"));
}
