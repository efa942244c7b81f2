//! Changing a running run, reconcile after reconcile on plans ([`World`]): a resize and a new budget restart the gang into a new attempt without
//! counting it; a failure policy change restarts nothing; a change no checkpoint
//! resumes under is refused, naming the field, and the running attempt goes on.

use crds::types::RunPhase;
use serde_json::json;

use super::lifecycle_tests::SPEC;
use super::world::World;

fn completions(w: &World, job: &str) -> i32 {
    w.job(job).spec.clone().unwrap().completions.unwrap()
}

/// The checkpoint claim's access modes.
fn claim_modes(w: &World) -> Vec<String> {
    w.o.accepted.claim.clone().expect("the claim exists")
}

#[test]
fn a_resize_restarts_the_gang_at_the_new_size_without_counting() {
    let mut w = World::running("llm");
    assert_eq!((completions(&w, "llm-a1"), w.status().topology.as_deref()), (2, Some("2x0")));
    w.edit_spec(|s| s["topology"]["nodes"] = json!(1));
    w.settle();
    let s = w.status();
    assert_eq!(
        (s.phase, s.reason.as_deref(), s.attempt, s.restarts),
        (Some(RunPhase::Restarting), Some("Resized"), 2, 0)
    );
    assert_eq!(s.topology.as_deref(), Some("1x0"));
    let (restarting, reason, message) = w.condition("Restarting");
    assert_eq!((restarting.as_str(), reason.as_str()), ("True", "Resized"));
    assert!(message.starts_with("resized 2x0 → 1x0") && message.contains("not counted"), "{message}");
    assert!(w.event_note("Normal", "Resized", "resized 2x0 → 1x0"), "{:?}", w.events());
    assert!(!w.events().iter().any(|(t, r)| t == "Warning" && r == "Resized"));
    // The old attempt is gone; the new one runs on one node with attempt 2's config.
    assert_eq!(w.jobs(), vec!["llm-a2"]);
    assert_eq!(completions(&w, "llm-a2"), 1);
    let cfg = w.config();
    assert_eq!((cfg.attempt, cfg.topology.nodes, cfg.topology.world_size, cfg.batch.grad_accum), (2, 1, 1, 16));
    // The checkpoint claim keeps its access mode: a ReadWriteMany claim serves one node.
    assert_eq!(claim_modes(&w), ["ReadWriteMany"]);
    assert_eq!(w.condition("Accepted").0, "True");
    w.start_pods("llm-a2", "Running");
    w.settle();
    assert_eq!(w.status().phase, Some(RunPhase::Running));
    assert_eq!(w.condition("Restarting").1, "Resumed");
    // Settled: nothing more to do.
    assert!(!w.reconcile().writes());
}

#[test]
fn a_new_budget_restarts_the_gang_under_it_and_a_failure_policy_change_restarts_nothing() {
    let mut w = World::running("llm");
    w.edit_spec(|s| s["failurePolicy"]["maxRestarts"] = json!(5));
    w.settle();
    let s = w.status();
    assert_eq!((s.phase, s.attempt), (Some(RunPhase::Running), 1));
    assert_eq!(w.config().failure.max_restarts, 5);
    assert!(w.event_note("Normal", "Reconfigured", "nothing restarts"), "{:?}", w.events());

    w.edit_spec(|s| s["tokens"] = json!(1_228_800));
    w.settle();
    let s = w.status();
    assert_eq!(
        (s.phase, s.reason.as_deref(), s.attempt, s.restarts),
        (Some(RunPhase::Restarting), Some("Reconfigured"), 2, 0)
    );
    let message = w.condition("Restarting").2;
    assert!(message.starts_with("reconfigured spec.tokens") && message.contains("not counted"), "{message}");
    assert!(w.has_event("Normal", "Reconfigured"));
    assert_eq!(s.progress.unwrap().total_steps, 150);
    let cfg = w.config();
    assert_eq!((cfg.attempt, cfg.schedule.total_steps), (2, 150));
    assert_eq!(w.jobs(), vec!["llm-a2"]);
}

#[test]
fn a_refused_change_names_the_field_and_leaves_the_running_attempt_alone() {
    let mut w = World::running("llm");
    let before = w.config();
    w.edit_spec(|s| s["batch"]["globalTokens"] = json!(16384));
    w.settle();
    let (accepted, reason, message) = w.condition("Accepted");
    assert_eq!((accepted.as_str(), reason.as_str()), ("False", "ChangeRefused"));
    assert!(message.contains("spec.batch.globalTokens (batch.globalSequences: 32 → 64"), "{message}");
    assert!(w.event_note("Warning", "ChangeRefused", "spec.batch.globalTokens"), "{:?}", w.events());
    let s = w.status();
    assert_eq!((s.phase, s.attempt, s.restarts), (Some(RunPhase::Running), 1, 0));
    assert_eq!(w.jobs(), vec!["llm-a1"]);
    assert_eq!(w.config(), before, "the ConfigMap keeps the accepted config");
    // A failure restarts the gang under the accepted config.
    w.pod_exits("llm-a1-0-abcde", 1, "Error", "Segmentation fault");
    w.settle();
    assert_eq!((w.status().attempt, w.status().restarts), (2, 1));
    assert_eq!(w.config().batch, before.batch);
    assert_eq!(w.condition("Accepted").1, "ChangeRefused");
    // A model change (immutable by the CRD's rules, should one get through) is refused too.
    w.edit_spec(|s| s["model"]["preset"] = json!("micro"));
    w.settle();
    let message = w.condition("Accepted").2;
    assert!(message.contains("spec.model") && message.contains("spec.batch.globalTokens"), "{message}");
    // Changed back: accepted again, and nothing restarts.
    w.edit_spec(|s| {
        s["batch"]["globalTokens"] = json!(8192);
        s["model"]["preset"] = json!("nano");
    });
    w.settle();
    assert_eq!(w.condition("Accepted").0, "True");
    assert_eq!(w.status().attempt, 2);
}

#[test]
fn growing_past_one_node_on_a_read_write_once_claim_is_refused() {
    let mut w = World::empty();
    w.apply("llm", &SPEC.replace("nodes: 2", "nodes: 1"));
    w.settle();
    w.start_pods("llm-a1", "Running");
    w.report(5, 3.2);
    w.settle();
    assert_eq!(claim_modes(&w), ["ReadWriteOnce"]);
    w.edit_spec(|s| s["topology"]["nodes"] = json!(2));
    w.settle();
    let (accepted, reason, message) = w.condition("Accepted");
    assert_eq!((accepted.as_str(), reason.as_str()), ("False", "ChangeRefused"));
    assert!(
        message.contains("spec.topology.nodes (1 → 2)") && message.contains("llm-checkpoints is ReadWriteOnce"),
        "{message}"
    );
    assert_eq!((w.status().attempt, w.jobs()), (1, vec!["llm-a1".to_string()]));
    assert_eq!(w.config().topology.nodes, 1);
    assert_eq!(claim_modes(&w), ["ReadWriteOnce"]);
}

#[test]
fn a_finished_run_given_more_tokens_trains_on_from_its_final_checkpoint() {
    let mut w = World::running("llm");
    w.complete("llm-a1");
    w.settle();
    assert_eq!(w.status().phase, Some(RunPhase::Succeeded));
    // A cadence or failure policy change on a finished run does nothing.
    w.edit_spec(|s| {
        s["checkpoint"]["everySteps"] = json!(5);
        s["failurePolicy"]["maxRestarts"] = json!(4);
    });
    w.settle();
    let s = w.status();
    assert_eq!((s.phase, s.attempt), (Some(RunPhase::Succeeded), 1));
    // More tokens: it trains on.
    w.edit_spec(|s| s["tokens"] = json!(1_228_800));
    w.settle();
    let s = w.status();
    assert_eq!(
        (s.phase, s.reason.as_deref(), s.attempt, s.restarts),
        (Some(RunPhase::Restarting), Some("Reconfigured"), 2, 0)
    );
    assert!(s.completion_time.is_none());
    let message = w.condition("Restarting").2;
    assert!(message.contains("training on from the final checkpoint (step 100 of 150)"), "{message}");
    assert_eq!(w.jobs(), vec!["llm-a2"]);
    let cfg = w.config();
    assert_eq!((cfg.attempt, cfg.schedule.total_steps, cfg.checkpoint.every_steps), (2, 150, 5));
    w.start_pods("llm-a2", "Running");
    w.settle();
    assert_eq!(w.status().phase, Some(RunPhase::Running));
}
