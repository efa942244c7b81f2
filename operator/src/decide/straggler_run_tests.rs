//! Stragglers, reconcile after reconcile on plans ([`World`]): rank 0
//! reports every rank's work per step, and a rank over `failurePolicy.stragglerFactor`
//! × the others' median for `stragglerReadings` readings in a row (each at a new step)
//! sets `Straggler=True` naming the rank, its pod and its node, with a Warning event and
//! the condition's metric; a balanced run never does, and a recovered rank clears it.

use std::time::Duration;

use crds::contract::RankTiming;
use crds::types::RunPhase;

use super::lifecycle_tests::SPEC;
use super::world::World;

/// Rank 0's status at `step` with each rank's compute seconds per step.
fn report(w: &mut World, step: u64, compute: &[f64]) {
    w.report(step, 3.0);
    let ranks = compute
        .iter()
        .enumerate()
        .map(|(r, &c)| RankTiming { rank: r as u32, compute_seconds: c, data_wait_seconds: 0.002 })
        .collect();
    w.rank0.as_mut().unwrap().ranks = ranks;
}

/// The next poll of rank 0 reads the new report.
fn poll(w: &mut World) {
    w.advance(Duration::from_secs(31));
    w.settle();
}

#[test]
fn a_slow_rank_is_flagged_after_three_readings_and_cleared_when_it_recovers() {
    let mut w = World::empty();
    w.apply("llm", SPEC);
    w.settle();
    w.start_pods("llm-a1", "Running");
    for step in [5, 13, 21] {
        report(&mut w, step, &[0.40, 0.43]);
        poll(&mut w);
        let (slow, reason, _) = w.condition("Straggler");
        assert_eq!((slow.as_str(), reason.as_str()), ("False", "NoStraggler"), "balanced at step {step}");
        assert_eq!(w.status().straggler, None);
    }
    assert_eq!(w.status().phase, Some(RunPhase::Running));

    // Rank 1 at 2.25× rank 0: two readings count, the third sets the condition.
    for (step, readings) in [(29, 1), (37, 2)] {
        report(&mut w, step, &[0.40, 0.90]);
        poll(&mut w);
        assert_eq!(w.condition("Straggler").0, "False", "step {step}");
        assert_eq!(w.status().straggler.unwrap().readings, readings);
    }
    // The same reading polled again counts once.
    poll(&mut w);
    assert_eq!(w.status().straggler.unwrap().readings, 2);
    report(&mut w, 45, &[0.40, 0.90]);
    poll(&mut w);
    let (slow, reason, message) = w.condition("Straggler");
    assert_eq!((slow.as_str(), reason.as_str()), ("True", "Straggler"));
    assert!(
        message.starts_with(
            "rank 1 (llm-a1-1-abcde on node node-1) takes 2.25× the other ranks' median work per step (0.900 s \
             against 0.400 s) for 3 readings in a row"
        ),
        "{message}"
    );
    assert!(w.has_event("Warning", "Straggler"));
    assert!(w.metrics.render().contains(
        r#"trainingrun_condition{name="llm",namespace="ml",reason="Straggler",status="True",type="Straggler"} 1"#
    ));
    let s = w.status().straggler.unwrap();
    assert_eq!(
        (s.rank, s.pod.as_deref(), s.node.as_deref(), s.readings),
        (1, Some("llm-a1-1-abcde"), Some("node-1"), 3)
    );
    assert_eq!(w.status().phase, Some(RunPhase::Running), "report only: nothing restarts");

    // It keeps pace again: the condition clears with a Normal event.
    report(&mut w, 53, &[0.41, 0.42]);
    poll(&mut w);
    assert_eq!(w.condition("Straggler").0, "False");
    assert!(w.has_event("Normal", "NoStraggler"));
    assert_eq!(w.status().straggler, None);
}
