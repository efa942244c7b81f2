//! GRPO end to end: the two local examples chained (pretrain, then GRPO raises held-out
//! accuracy), exact resume on two ranks with a reused batch and a reference model,
//! micro-batch invariance of the gradient, and the NaN contract.

use std::path::Path;

use crds::contract::{ExitReport, FailureReason, TerminationMessage};
use trainer::dist::Placement;
use trainer::telemetry::metrics_log::{self, Record};
use trainer::train::{RunOptions, Trainer};

mod common;
use common::{config, scratch, trainer_bin};

fn run(manifest: &Path, out: &Path, extra: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = trainer_bin();
    cmd.args(["run", "--no-sample", "-o"]).arg(out).arg(manifest).args(extra);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn ok(out: &std::process::Output) -> String {
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// GRPO on `embedded:mcq-rules` from `base`: 4 prompts × 4 completions of up to 8
/// tokens per step with top-p 0.9 (so the keep-sampling mask acts), 6 steps, a
/// reference model (β > 0).
fn grpo_yaml(nodes: u32, micro_batch: u32, iterations: u32) -> String {
    format!(
        r#"
apiVersion: training.puretransformer.dev/v1alpha1
kind: TrainingRun
metadata: {{name: g}}
spec:
  phase: grpo
  model: {{preset: nano, tokenizer: embedded}}
  tokens: "12288"
  initFrom: {{trainingRun: base}}
  grpo:
    dataset: "embedded:mcq-rules"
    promptsPerStep: 4
    generationsPerPrompt: 4
    maxNewTokens: 8
    topP: 0.9
    beta: 0.04
    iterations: {iterations}
    evalQuestions: 16
  topology: {{nodes: {nodes}, gpusPerNode: 0}}
  batch: {{microBatch: {micro_batch}, seqLength: 128}}
  optimizer: {{lr: 1.0e-3, schedule: constant, warmupTokens: "1"}}
  precision: f32
  checkpoint: {{everySteps: 2, keepLast: 3}}
"#
    )
}

/// (step, loss, reward, kl) of every step record.
fn steps(log: &Path) -> Vec<(u64, f64, f64, f64)> {
    metrics_log::read(log)
        .unwrap()
        .into_iter()
        .filter_map(|r| match r {
            Record::Step(s) => {
                let g = s.grpo.expect("a GRPO step record has GRPO metrics");
                Some((s.step, s.loss, g.reward, g.kl))
            }
            _ => None,
        })
        .collect()
}

/// The README's two phases: tiny-local pretrains, tiny-grpo-local starts from its final
/// checkpoint, and GRPO lifts held-out accuracy well above where it started and above
/// chance; the run reports both in its log and its final status.
#[test]
fn pretrain_then_grpo_raises_held_out_accuracy() {
    let dir = scratch("two-phases");
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    ok(&run(&examples.join("tiny-local.yaml"), &dir.join("tiny-local"), &[], &[]));
    let report = dir.join("termination-log");
    let stdout = ok(&run(
        &examples.join("tiny-grpo-local.yaml"),
        &dir.join("tiny-grpo-local"),
        &[],
        &[("TRAINER_TERMINATION_LOG", report.to_str().unwrap())],
    ));
    assert!(stdout.contains("held-out accuracy"), "{stdout}");

    let records = metrics_log::read(&dir.join("tiny-grpo-local/metrics.jsonl")).unwrap();
    let scores = |set: &str| -> Vec<_> {
        records
            .iter()
            .filter_map(|r| if let Record::Accuracy(a) = r { Some(a.clone()) } else { None })
            .filter(|a| a.set == set)
            .collect()
    };
    let accuracy = scores("held-out");
    assert_eq!(accuracy.len(), 2, "one evaluation before and one after");
    let (before, after) = (&accuracy[0], &accuracy[1]);
    assert_eq!((before.step, after.step), (0, 146));
    assert_eq!((before.score.all.questions, after.score.all.questions), (256, 256));
    assert!(
        after.score.all.greedy >= before.score.all.greedy + 0.20 && after.score.all.greedy >= 0.50,
        "GRPO must raise held-out accuracy clearly: {:.3} → {:.3}",
        before.score.all.greedy,
        after.score.all.greedy
    );
    // The batch accuracy climbs too: the last 20 steps beat the first 20.
    let batch: Vec<f64> = records
        .iter()
        .filter_map(|r| if let Record::Step(s) = r { s.grpo.map(|g| g.accuracy) } else { None })
        .collect();
    let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len() as f64;
    assert!(mean(&batch[batch.len() - 20..]) > mean(&batch[..20]) + 0.1, "{batch:?}");
    // The policy keeps answering: it has not learned to stop before the letter.
    let unparsed: Vec<f64> = records
        .iter()
        .filter_map(|r| if let Record::Step(s) = r { s.grpo.map(|g| g.unparsed_fraction) } else { None })
        .collect();
    assert!(mean(&unparsed[unparsed.len() - 20..]) < 0.1, "{unparsed:?}");
    common::check_tensorboard(&dir.join("tiny-local"));
    let heldout = common::check_tensorboard(&dir.join("tiny-grpo-local"))["tags"].to_string();
    assert!(heldout.contains("heldout/greedy") && heldout.contains("heldout/accNorm"), "{heldout}");

    let Some(ExitReport::Success(status)) = ExitReport::parse(&std::fs::read_to_string(&report).unwrap()) else {
        panic!("the final report is a status document")
    };
    assert_eq!(status.metrics.initial_eval_accuracy, Some(before.score.all.greedy));
    assert_eq!(status.metrics.eval_accuracy, Some(after.score.all.greedy));
    assert_eq!(status.metrics.eval_accuracy_log_likelihood, Some(after.score.all.acc));
    assert!(status.metrics.reward.is_some() && status.metrics.sampling_tokens_per_second.unwrap() > 0);
    // evalDatasets: [embedded:mcq] is scored before and after too, and reported beside.
    let mcq = scores("embedded:mcq");
    assert_eq!(mcq.iter().map(|a| (a.step, a.score.all.questions)).collect::<Vec<_>>(), [(0, 256), (146, 256)]);
    assert_eq!(
        status.metrics.eval_datasets,
        [crds::types::EvalDatasetAccuracy {
            dataset: "embedded:mcq".into(),
            questions: 256,
            initial_accuracy: Some(mcq[0].score.all.greedy),
            accuracy: Some(mcq[1].score.all.greedy),
            accuracy_log_likelihood: Some(mcq[1].score.all.acc),
        }]
    );
    assert!(stdout.contains("embedded:mcq accuracy (greedy answer letter): "), "{stdout}");
    assert!(heldout.contains("eval/embedded:mcq/greedy"), "{heldout}");

    // `trainer eval` measures the same checkpoint the same way.
    let out =
        trainer_bin().args(["eval", "--task", "mcq", "--json"]).arg(dir.join("tiny-grpo-local")).output().unwrap();
    let score: serde_json::Value = serde_json::from_str(&ok(&out)).unwrap();
    assert_eq!(score["greedy"].as_f64(), Some(after.score.all.greedy));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Two ranks, each generated batch serving two steps: stopped after step 3 (which
/// finishes the batch, at step 4) and resumed, the run repeats the uninterrupted loss,
/// reward and KL sequence exactly.
#[test]
fn grpo_on_two_ranks_resumes_exactly() {
    let dir = common::grpo_base("resume");
    let manifest = dir.join("g.yaml");
    std::fs::write(&manifest, grpo_yaml(2, 4, 2)).unwrap();
    ok(&run(&manifest, &dir.join("full"), &[], &[]));
    let full = steps(&dir.join("full/metrics.jsonl"));
    assert_eq!(full.len(), 6);
    assert!(full.iter().any(|s| s.3 > 0.0), "the policy moves away from the reference: {full:?}");

    let out = dir.join("g");
    ok(&run(&manifest, &out, &["--stop-after-steps", "3"], &[]));
    assert_eq!(steps(&out.join("metrics.jsonl")).len(), 4, "a stop waits for the batch's last step");
    ok(&run(&manifest, &out, &[], &[]));
    assert_eq!(steps(&out.join("metrics.jsonl")), full);
    let summary = common::check_tensorboard(&out);
    assert_eq!(summary["configs"], serde_json::json!([0, 4]), "{summary}");
    for tag in ["grpo/reward", "grpo/kl", "grpo/clipFraction", "grpo/completionLength", "grpo/accuracy"] {
        assert!(summary["tags"].to_string().contains(tag), "{tag} missing from {summary}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The learning signal. Sampling at a temperature near 0, every completion of a prompt
/// is the same, so every group's rewards are equal (fracRewardZeroStd 1, entropy near
/// 0) and after noSignalSteps steps in a row the run says it taught nothing. The rule
/// task at its own temperature varies: entropy well above 0, and never that many flat
/// steps in a row.
#[test]
fn a_grpo_run_whose_groups_all_agree_reports_no_learning_signal() {
    let dir = common::grpo_base("signal");
    let warm = grpo_yaml(1, 16, 1).replace("    evalQuestions: 16", "    evalQuestions: 0\n    noSignalSteps: 2");
    let cold = warm.replace("    topP: 0.9", "    topP: 1.0\n    temperature: 1.0e-4");
    assert!(warm.contains("noSignalSteps: 2") && cold.contains("temperature: 1.0e-4"));
    for (name, yaml, silent) in [("warm", warm, false), ("cold", cold, true)] {
        let manifest = dir.join(format!("{name}.yaml"));
        std::fs::write(&manifest, yaml).unwrap();
        let out = dir.join(name);
        let stdout = ok(&run(&manifest, &out, &[], &[]));
        let stats: Vec<_> = metrics_log::read(&out.join("metrics.jsonl"))
            .unwrap()
            .into_iter()
            .filter_map(|r| match r {
                Record::Step(s) => s.grpo,
                _ => None,
            })
            .collect();
        assert_eq!(stats.len(), 6, "{name}");
        let streak = stats.iter().map(|g| g.no_signal_steps).max().unwrap();
        let entropy = stats.iter().map(|g| g.entropy).sum::<f64>() / stats.len() as f64;
        if silent {
            assert!(stats.iter().all(|g| g.frac_reward_zero_std == 1.0), "{name}: {stats:?}");
            assert_eq!(stats.iter().map(|g| g.no_signal_steps).collect::<Vec<_>>(), (1..=6).collect::<Vec<u64>>());
            assert!(entropy < 0.01, "{name}: entropy {entropy}");
        } else {
            assert!(streak < 2, "{name}: {stats:?}");
            assert!(entropy > 0.1, "{name}: entropy {entropy}");
        }
        assert_eq!(stdout.contains("no learning signal: for the last 6 steps"), silent, "{name}: {stdout}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The loss is normalized over the rank's whole step, so micro-batches of 4 give the
/// gradient of micro-batches of 16.
#[test]
fn micro_batch_size_does_not_change_the_gradient() {
    let dir = common::grpo_base("micro");
    let grads = |micro: u32| {
        let cfg = config(&grpo_yaml(1, micro, 1));
        let out = dir.join(format!("m{micro}"));
        let opts = RunOptions {
            output_dir: out,
            stop_after_steps: None,
            tty: Some(false),
            sample: false,
            init_dir: dir.clone(),
            placement: Placement::single(),
            sync_every: None,
        };
        let mut t = Trainer::new(&cfg, opts).unwrap();
        let loss = t.compute_gradients().unwrap().double_value(&[]);
        (loss, t.gradients().unwrap())
    };
    let (l4, g4) = grads(4);
    let (l16, g16) = grads(16);
    assert!((l4 - l16).abs() < 1e-6, "{l4} vs {l16}");
    let mut nonzero = 0;
    for ((name, a), (_, b)) in g4.iter().zip(&g16) {
        let diff = (a - b).abs().max().double_value(&[]);
        assert!(diff < 1e-5, "{name}: {diff}");
        nonzero += usize::from(a.abs().max().double_value(&[]) > 0.0);
    }
    assert!(nonzero > g4.len() / 2, "the step has a learning signal");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A NaN in a GRPO step fails the run with the NaNLoss contract.
#[test]
fn nan_in_a_grpo_step_fails_with_nan_loss() {
    let dir = common::grpo_base("nan");
    let manifest = dir.join("g.yaml");
    std::fs::write(&manifest, grpo_yaml(1, 8, 1)).unwrap();
    let log = dir.join("termination-log");
    let out = run(
        &manifest,
        &dir.join("g"),
        &[],
        &[("TRAINER_INJECT_NAN_AT_STEP", "2"), ("TRAINER_TERMINATION_LOG", log.to_str().unwrap())],
    );
    assert_eq!(out.status.code(), Some(FailureReason::NaNLoss.exit_code()), "{}", String::from_utf8_lossy(&out.stderr));
    let msg = TerminationMessage::parse(&std::fs::read_to_string(&log).unwrap()).unwrap();
    assert_eq!((msg.reason, msg.step), (FailureReason::NaNLoss, Some(2)));
    // GRPO's sample order is its prompts: step 2 generated prompts 4..8, and no checkpoint came before.
    let samples = crds::contract::FailedSamples { from: 4, to: 8, checkpoint: 0 };
    assert_eq!(msg.samples, Some(samples));

    // With onNaN: rollback, a NaN at step 3 rolls back to step 2's checkpoint, past prompts 8..12.
    std::fs::write(
        &manifest,
        grpo_yaml(1, 8, 1).replace("  precision: f32\n", "  precision: f32\n  failurePolicy: {onNaN: rollback}\n"),
    )
    .unwrap();
    let out = run(
        &manifest,
        &dir.join("rolled"),
        &[],
        &[("TRAINER_INJECT_NAN_AT_STEP", "3"), ("TRAINER_INJECT_ATTEMPT", "1")],
    );
    ok(&out);
    let state = common::last_state(&dir.join("rolled"));
    let r = &state.config.as_ref().unwrap().rollbacks;
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!((r[0].step, r[0].skip_from, r[0].skip_to, r[0].from_step), (3, 8, 12, Some(2)));
    assert_eq!(state.data_position, state.step * 4 + 4, "every generated batch's 4 prompts, and the 4 skipped");
    std::fs::remove_dir_all(&dir).unwrap();
}
