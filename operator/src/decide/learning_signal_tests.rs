//! GRPO's learning signal, reconcile after reconcile on plans ([`World`]):
//! rank 0 reports how many steps in a row had no learning signal, and at
//! `grpo.noSignalSteps` the run gets `NoLearningSignal=True`, a Warning event and its
//! metric, until the rewards vary again.

use std::time::Duration;

use crds::contract::{TrainerPhase, TrainerStatus};
use crds::types::{RunMetrics, RunPhase};

use super::world::World;

const GRPO: &str = "  phase: grpo
  model: {preset: nano}
  tokens: 65536
  topology: {nodes: 1, gpusPerNode: 0}
  batch: {microBatch: 16, seqLength: 256}
  initFrom: {uri: pvc://models/base}
  grpo: {dataset: embedded:mcq, promptsPerStep: 2, generationsPerPrompt: 8, maxNewTokens: 32, noSignalSteps: 10}
";

/// Rank 0's status after `step` steps, the last `silent` of them without signal.
fn report(w: &mut World, step: u64, silent: u64, flat: f64) {
    w.rank0 = Some(TrainerStatus {
        phase: TrainerPhase::Training,
        attempt: 1,
        step,
        total_steps: 16,
        tokens: step * 4096,
        total_tokens: 65536,
        metrics: RunMetrics {
            loss: Some(0.0),
            reward: Some(1.0),
            frac_reward_zero_std: Some(flat),
            entropy: Some(0.02),
            no_signal_steps: Some(silent),
            ..Default::default()
        },
        last_checkpoint: None,
        best_checkpoint: None,
        tokens_by_source: Default::default(),
        ranks: Vec::new(),
    });
}

#[test]
fn a_grpo_run_without_learning_signal_is_flagged_until_it_learns_again() {
    let mut w = World::empty();
    w.apply("tune", GRPO);
    w.settle();
    w.start_pods("tune-a1", "Running");
    report(&mut w, 4, 4, 1.0);
    w.settle();
    assert_eq!(w.status().phase, Some(RunPhase::Running));
    let (silent, reason, _) = w.condition("NoLearningSignal");
    assert_eq!((silent.as_str(), reason.as_str()), ("False", "LearningSignal"));
    assert_eq!(w.status().conditions.len(), 8, "GRPO runs carry the condition");

    report(&mut w, 10, 10, 0.95);
    w.advance(Duration::from_secs(31));
    w.settle();
    let (silent, reason, message) = w.condition("NoLearningSignal");
    assert_eq!((silent.as_str(), reason.as_str()), ("True", "NoLearningSignal"));
    assert!(message.contains("for 10 steps in a row at least 90%") && message.contains("(now 95%)"), "{message}");
    assert!(w.has_event("Warning", "NoLearningSignal"));
    assert!(w.metrics.render().contains(
        r#"trainingrun_condition{name="tune",namespace="ml",reason="NoLearningSignal",status="True",type="NoLearningSignal"} 1"#
    ));
    assert_eq!(w.status().metrics.unwrap().frac_reward_zero_std, Some(0.95));

    report(&mut w, 12, 0, 0.25);
    w.advance(Duration::from_secs(31));
    w.settle();
    assert_eq!(w.condition("NoLearningSignal").0, "False");
    assert!(w.has_event("Normal", "LearningSignal"));
}
