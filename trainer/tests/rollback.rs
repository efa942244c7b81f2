//! `failurePolicy.onNaN: rollback` in `trainer run`: a non-finite step rolls the run back
//! to the checkpoint before it, past the step's samples, at a lowered learning rate;
//! the result is the run that never saw those samples.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use crds::config::RunConfig;
use crds::contract::{FailedSamples, FailureReason, TerminationMessage};
use crds::types::Rollback;
use trainer::checkpoint::TrainState;
use trainer::telemetry;
use trainer::telemetry::metrics_log::{self, Record};
use trainer::telemetry::server::SharedStatus;
use trainer::train::{RunOptions, Trainer};

mod common;
use common::{manifest_yaml, max_rel_loss_diff, scratch};

/// One rank, 16 sequences of 64 tokens a step, 12 steps, a checkpoint every 4, NaN
/// rollback with the lowered rate for 3 steps past the failing one.
fn manifest(max_rollbacks: u32) -> String {
    manifest_yaml(1, 4, 1024, "12288").replace(
        "  precision: f32\n",
        &format!("  precision: f32\n  failurePolicy: {{onNaN: rollback, maxRollbacks: {max_rollbacks}, rollbackLrSteps: 3}}\n"),
    )
}

fn config(yaml: &str) -> RunConfig {
    crds::resolve(&crds::manifest::from_yaml(yaml, "test manifest").unwrap()).unwrap()
}

/// `trainer run` of `yaml` into `dir/out` with `env`: exit code, termination message, stderr.
fn run_bin(dir: &Path, yaml: &str, env: &[(&str, &str)]) -> (i32, Option<TerminationMessage>, String) {
    let env: Vec<(&str, &str)> = [("RUST_LOG", "info")].into_iter().chain(env.iter().copied()).collect();
    let (out, log) = common::run_logged(dir, yaml, &env);
    let msg = log.and_then(|t| TerminationMessage::parse(&t));
    (out.status.code().unwrap_or(-1), msg, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Trains `cfg` in this process into `dir`, uninterrupted.
fn train(cfg: &RunConfig, dir: &Path) {
    let opts = RunOptions {
        output_dir: dir.to_path_buf(),
        stop_after_steps: None,
        tty: Some(false),
        sample: false,
        init_dir: dir.to_path_buf(),
        placement: trainer::dist::Placement::single(),
        sync_every: None,
    };
    let trainer = Trainer::new(cfg, opts).unwrap();
    telemetry::run(trainer, &SharedStatus::from_config(cfg), Arc::new(AtomicBool::new(false))).unwrap();
}

/// (step, loss, lr) of every step in `dir`'s metrics.jsonl.
fn steps(dir: &Path) -> Vec<(u64, f64, f64)> {
    metrics_log::read(&dir.join("metrics.jsonl"))
        .unwrap()
        .into_iter()
        .filter_map(|r| match r {
            Record::Step(s) => Some((s.step, s.loss, s.lr)),
            _ => None,
        })
        .collect()
}

fn last_state(dir: &Path) -> TrainState {
    let latest = std::fs::read_to_string(dir.join(trainer::checkpoint::LATEST_FILE)).unwrap();
    serde_json::from_str(&std::fs::read_to_string(dir.join(latest.trim()).join("state.json")).unwrap()).unwrap()
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
    let rolled = steps(&dir.join("out"));
    assert_eq!(rolled.iter().map(|s| s.0).collect::<Vec<_>>(), (1..=12).collect::<Vec<_>>());

    // The run that was given the rollback from the start, and the one without it.
    let mut skipping = config(&yaml);
    skipping.rollbacks = vec![want];
    train(&skipping, &dir.join("skipping"));
    let skipped = steps(&dir.join("skipping"));
    train(&config(&yaml), &dir.join("plain"));
    let plain = steps(&dir.join("plain"));

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
