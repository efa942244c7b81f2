//! `failurePolicy.onNaN: rollback`, reconcile after reconcile on plans ([`World`]): a trainer's NaNLoss exit becomes a rollback in `status.effective.rollbacks`
//! and the ConfigMap, a new attempt not counted toward maxRestarts, a Warning event,
//! `RolledBack=True` and its metric; after the last one the run fails as NaNLoss.

use crds::contract::{FailedSamples, FailureReason, TerminationMessage};
use crds::types::{Rollback, RunPhase};

use super::lifecycle_tests::SPEC;
use super::world::World;

fn nan(step: u64, samples: FailedSamples) -> String {
    TerminationMessage {
        reason: FailureReason::NaNLoss,
        step: Some(step),
        detail: "step 13: non-finite training signal (loss NaN, gradient norm NaN)".into(),
        samples: Some(samples),
    }
    .to_json()
}

#[test]
fn a_nan_rolls_back_until_the_rollbacks_are_spent() {
    let mut w = World::empty();
    let spec = SPEC.replace("stallTimeout: 10m}", "stallTimeout: 10m, onNaN: rollback, rollbackLrSteps: 20}");
    assert_ne!(spec, SPEC);
    w.apply("llm", &spec);
    w.settle();
    let (ok, reason, _) = w.condition("RolledBack");
    assert_eq!((ok.as_str(), reason.as_str()), ("False", "NotRolledBack"), "the policy's condition is there");
    w.start_pods("llm-a1", "Running");
    w.settle();
    // 32 sequences a step: step 13 trained 384..416, after step 10's checkpoint at 320.
    let first = FailedSamples { from: 384, to: 416, checkpoint: 320 };
    w.pod_exits("llm-a1-1-abcde", FailureReason::NaNLoss.exit_code(), "Error", &nan(13, first));
    w.settle();

    let s = w.status();
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
    let message = w.condition("Restarting").2;
    assert!(message.contains("rolling back (1 of 2, failurePolicy.onNaN: rollback)"), "{message}");
    assert!(message.contains("never training on samples 384..416 (that step's global batch) again"), "{message}");
    assert!(message.contains("at 0.5× the learning rate through step 33"), "{message}");
    assert!(w.has_event("Warning", "NaNRollback"));
    let (rolled, reason, listed) = w.condition("RolledBack");
    assert_eq!((rolled.as_str(), reason.as_str()), ("True", "NaNRollback"));
    assert!(listed.starts_with("1 of 2 rollbacks after non-finite steps: step 13 of attempt 1"), "{listed}");
    // Attempt 2's config carries the rollback to the trainer; the spec is untouched.
    let cfg = w.config();
    assert_eq!((cfg.attempt, cfg.rollbacks.clone()), (2, vec![want]));
    assert_eq!(w.condition("Accepted").0, "True");
    assert!(w.metrics.render().contains(r#"trainingrun_rollbacks{name="llm",namespace="ml"} 1"#));

    // A second non-finite step: the second and last rollback.
    w.start_pods("llm-a2", "Running");
    w.settle();
    let second = FailedSamples { from: 480, to: 512, checkpoint: 320 };
    w.pod_exits("llm-a2-0-abcde", FailureReason::NaNLoss.exit_code(), "Error", &nan(15, second));
    w.settle();
    let s = w.status();
    assert_eq!((s.phase, s.attempt, s.restarts), (Some(RunPhase::Restarting), 3, 0));
    assert_eq!(w.config().rollbacks.len(), 2);
    assert!(w.condition("RolledBack").2.starts_with("2 of 2 rollbacks"));

    // The third fails the run as NaNLoss: no new attempt, the alert's condition.
    w.start_pods("llm-a3", "Running");
    w.settle();
    w.pod_exits("llm-a3-0-abcde", FailureReason::NaNLoss.exit_code(), "Error", &nan(15, second));
    w.settle();
    let s = w.status();
    assert_eq!((s.phase, s.reason.as_deref(), s.attempt, s.restarts), (Some(RunPhase::Failed), Some("NaNLoss"), 3, 0));
    let failed = w.condition("Failed").2;
    assert!(failed.contains("no rollbacks left after 2 (failurePolicy.maxRollbacks 2)"), "{failed}");
    assert_eq!(w.jobs(), vec!["llm-a3"], "no attempt 4");
}

/// Without the policy a NaN fails the run at once, and the message says what the policy would do.
#[test]
fn without_the_policy_a_nan_fails_the_run() {
    let mut w = World::empty();
    w.apply("llm", SPEC);
    w.settle();
    let conditions = w.status().conditions;
    assert!(conditions.iter().all(|c| c.type_ != "RolledBack"), "no RolledBack condition without the policy");
    w.start_pods("llm-a1", "Running");
    w.settle();
    let samples = FailedSamples { from: 384, to: 416, checkpoint: 320 };
    w.pod_exits("llm-a1-0-abcde", FailureReason::NaNLoss.exit_code(), "Error", &nan(13, samples));
    w.settle();
    let s = w.status();
    assert_eq!((s.phase, s.reason.as_deref(), s.attempt), (Some(RunPhase::Failed), Some("NaNLoss"), 1));
    assert!(w.condition("Failed").2.contains("set spec.failurePolicy.onNaN: rollback"));
}
