//! `failurePolicy.onNaN: rollback` in `trainer run`: a non-finite step rolls the run back
//! to the checkpoint before it, past the step's samples, at a lowered learning rate;
//! the result is the run that never saw those samples.

use std::path::Path;

use crds::contract::{FailedSamples, FailureReason, TerminationMessage};
use crds::types::Rollback;

mod common;
use common::{config, last_state, manifest_yaml, max_rel_loss_diff, scratch, step_rates, train_in_process};

/// One rank, 16 sequences of 64 tokens a step, 12 steps, a checkpoint every 4, NaN
/// rollback with the lowered rate for 3 steps past the failing one.
fn manifest(max_rollbacks: u32) -> String {
    manifest_yaml(1, 4, 1024, "12288").replace(
        "  precision: f32\n",
        &format!("  precision: f32\n  failurePolicy: {{onNaN: rollback, maxRollbacks: {max_rollbacks}, rollbackLrSteps: 3}}\n"),
    )
}

/// `trainer run` of `yaml` into `dir/out` with `env`: exit code, termination message, stderr.
fn run_bin(dir: &Path, yaml: &str, env: &[(&str, &str)]) -> (i32, Option<TerminationMessage>, String) {
    let env: Vec<(&str, &str)> = [("RUST_LOG", "info")].into_iter().chain(env.iter().copied()).collect();
    let (out, log) = common::run_logged(dir, yaml, &env);
    let msg = log.and_then(|t| TerminationMessage::parse(&t));
    (out.status.code().unwrap_or(-1), msg, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// NaN at step 7 of attempt 1: attempt 2 resumes from the checkpoint of step 4, never
/// trains on step 7's 16 sequences (96..112), and trains steps 5-10 at half the rate.
/// Its losses and rates are those of an uninterrupted run given the same rollback from
/// the start; the checkpoints carry the rollback for later resumes.
#[test]
fn a_nan_rolls_back_past_its_samples_and_trains_as_the_run_that_skipped_them() {
    let dir = scratch("rollback");
    let yaml = manifest(2);
    let (code, _, stderr) =
        run_bin(&dir, &yaml, &[("TRAINER_INJECT_NAN_AT_STEP", "7"), ("TRAINER_INJECT_ATTEMPT", "1")]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("rolling back (1 of 2, failurePolicy.onNaN: rollback) as attempt 2"), "{stderr}");
    let want = Rollback {
        step: 7,
        attempt: 1,
        skip_from: 96,
        skip_to: 112,
        lr_factor: 0.5,
        lr_until_step: 10,
        from_step: Some(4),
    };
    let state = last_state(&dir.join("out"));
    assert_eq!(state.config.as_ref().unwrap().rollbacks, std::slice::from_ref(&want), "the checkpoint records it");
    assert_eq!(state.data_position, 12 * 16 + 16, "12 steps of 16 sequences, and the 16 skipped");
    let rolled = step_rates(&dir.join("out"));
    assert_eq!(rolled.iter().map(|s| s.0).collect::<Vec<_>>(), (1..=12).collect::<Vec<_>>());

    // The run that was given the rollback from the start, and the one without it.
    let mut skipping = config(&yaml);
    skipping.rollbacks = vec![want];
    train_in_process(&skipping, &dir.join("skipping"), None).unwrap();
    let skipped = step_rates(&dir.join("skipping"));
    train_in_process(&config(&yaml), &dir.join("plain"), None).unwrap();
    let plain = step_rates(&dir.join("plain"));

    let losses = |s: &[(u64, f64, f64)]| s.iter().map(|s| s.1).collect::<Vec<_>>();
    let diff = max_rel_loss_diff(&losses(&rolled), &losses(&skipped));
    assert!(diff < 1e-6, "rolled back vs skipping from the start: {diff}\n{rolled:?}\n{skipped:?}");
    for ((step, _, lr), (_, _, plain_lr)) in rolled.iter().zip(&plain) {
        let factor = if (5..=10).contains(step) { 0.5 } else { 1.0 };
        assert!((lr - factor * plain_lr).abs() <= 1e-12 * plain_lr, "step {step}: lr {lr} vs {plain_lr}");
    }
    // A step's loss is taken before its update: step 5's is the last the lower rate leaves alone.
    let before = max_rel_loss_diff(&losses(&rolled)[..5], &losses(&plain)[..5]);
    assert!(before < 1e-6, "steps 1-5 saw the same weights and samples: {before}");
    assert!(
        max_rel_loss_diff(&losses(&rolled)[5..], &losses(&plain)[5..]) > 1e-3,
        "from step 6 on the lower rate and the skipped samples change the losses"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A non-finite step after the last rollback fails the run as NaNLoss, naming where in
/// the sample order the failing step was.
#[test]
fn after_the_last_rollback_the_run_fails_as_nan_loss() {
    let dir = scratch("rollback-spent");
    let (code, msg, stderr) = run_bin(&dir, &manifest(1), &[("TRAINER_INJECT_NAN_AT_STEP", "7")]);
    assert_eq!(code, FailureReason::NaNLoss.exit_code(), "{stderr}");
    assert!(stderr.contains("no rollbacks left after 1 (failurePolicy.maxRollbacks 1)"), "{stderr}");
    let msg = msg.expect("a termination message");
    // Attempt 2's step 7 comes after the skipped 96..112; the checkpoint is step 4's.
    assert_eq!(msg.step, Some(7));
    assert_eq!(msg.samples, Some(FailedSamples { from: 112, to: 128, checkpoint: 64 }));
    std::fs::remove_dir_all(&dir).unwrap();
}
