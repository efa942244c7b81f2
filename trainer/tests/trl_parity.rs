//! GRPO against TRL itself: the trainer generates and scores a batch and takes a step on
//! it; TRL's own `GRPOTrainer` (from PyPI, unmodified; `scripts/trl_parity.py`) takes the
//! same step on the same batch, model and settings. The advantages, per-token
//! log-probabilities (policy, old and reference), KL and losses, the step's loss, KL
//! and clip fractions, and every parameter's gradient must agree in f32: the loss within
//! 1e-5 relative, gradients within 1e-4 of each tensor's largest entry.
//!
//! Needs TRL in the test Python (`scripts/setup-pytorch-ref.sh`), as tests/hf_parity.rs
//! needs transformers.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;
use tch::{Kind, Tensor};
use trainer::dist::Placement;
use trainer::export::export_hf;
use trainer::train::{RunOptions, Trainer};

mod common;
use common::{config, python, trainer_bin};

/// One comparison: the trainer's spec.grpo and micro-batch, and the step compared (1:
/// a fresh batch; 2: its second use, off-policy).
struct Case {
    name: &'static str,
    loss_type: &'static str,
    scale_rewards: &'static str,
    beta: f64,
    step: u64,
    micro_batch: u32,
    clip_epsilon_high: f64,
    unbiased_kl: bool,
    mask_truncated: bool,
    off_policy_threshold: Option<f64>,
    max_new_tokens: u32,
}

const PROMPTS: u32 = 4;
const GROUP: u32 = 4;
const TEMPERATURE: f64 = 0.9;

const BASE_CASE: Case = Case {
    name: "",
    loss_type: "grpo",
    scale_rewards: "group",
    beta: 0.04,
    step: 1,
    micro_batch: 16,
    clip_epsilon_high: 0.2,
    unbiased_kl: false,
    mask_truncated: false,
    off_policy_threshold: None,
    max_new_tokens: 8,
};

/// Every loss type on a fresh batch, each scaling of rewards, micro-batches of 16, 8
/// and 4 (TRL's gradient accumulation), and on a reused batch the ratio clip with a
/// higher upper ε, the ratio-weighted KL, off-policy masking and truncation masking.
fn cases() -> Vec<Case> {
    vec![
        Case { name: "grpo", ..BASE_CASE },
        Case { name: "bnpo", loss_type: "bnpo", ..BASE_CASE },
        Case { name: "dr_grpo-batch", loss_type: "dr_grpo", scale_rewards: "batch", micro_batch: 8, ..BASE_CASE },
        Case {
            name: "dapo-none-truncated",
            loss_type: "dapo",
            scale_rewards: "none",
            micro_batch: 4,
            mask_truncated: true,
            max_new_tokens: 6,
            ..BASE_CASE
        },
        Case {
            name: "grpo-reused",
            step: 2,
            micro_batch: 8,
            clip_epsilon_high: 0.28,
            unbiased_kl: true,
            off_policy_threshold: Some(0.4),
            ..BASE_CASE
        },
        Case {
            name: "dapo-reused-truncated",
            loss_type: "dapo",
            step: 2,
            mask_truncated: true,
            max_new_tokens: 6,
            off_policy_threshold: Some(0.02),
            ..BASE_CASE
        },
        Case { name: "bnpo-reused", loss_type: "bnpo", step: 2, beta: 0.0, clip_epsilon_high: 0.28, ..BASE_CASE },
    ]
}

fn manifest(c: &Case) -> String {
    let threshold = c.off_policy_threshold.map_or(String::new(), |d| format!("\n    offPolicyMaskThreshold: {d}"));
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
    promptsPerStep: {PROMPTS}
    generationsPerPrompt: {GROUP}
    maxNewTokens: {}
    temperature: {TEMPERATURE}
    topP: 1.0
    beta: {}
    clipEpsilon: 0.2
    clipEpsilonHigh: {}
    lossType: {}
    scaleRewards: {}
    iterations: {}
    unbiasedKl: {}
    maskTruncatedCompletions: {}{threshold}
    evalQuestions: 0
  topology: {{nodes: 1, gpusPerNode: 0}}
  batch: {{microBatch: {}, seqLength: 128}}
  optimizer: {{lr: 1.0e-3, schedule: constant, warmupTokens: "1"}}
  precision: f32
"#,
        c.max_new_tokens,
        c.beta,
        c.clip_epsilon_high,
        c.loss_type,
        c.scale_rewards,
        c.step,
        c.unbiased_kl,
        c.mask_truncated,
        c.micro_batch,
    )
}

/// What the trainer computed for one case.
struct Ours {
    dir: PathBuf,
    batch: trainer::grpo::record::BatchRecord,
    grads: HashMap<String, Tensor>,
}

/// Takes the case's step in the trainer from `root`'s base run and writes the case
/// directory `scripts/trl_parity.py` reads.
fn ours(root: &Path, base_hf: &Path, c: &Case) -> Ours {
    let cfg = config(&manifest(c));
    let dir = root.join(c.name);
    std::fs::create_dir_all(&dir).unwrap();
    let opts = RunOptions {
        output_dir: dir.join("run"),
        stop_after_steps: None,
        tty: Some(false),
        sample: false,
        init_dir: root.to_path_buf(),
        placement: Placement::single(),
        sync_every: None,
    };
    let mut t = Trainer::new(&cfg, opts).unwrap();
    if c.step == 2 {
        t.train_step().unwrap();
        let weights: HashMap<String, Tensor> = t.parameters().unwrap().into_iter().collect();
        export_hf(&cfg.model, &weights, None, &dir.join("policy")).unwrap();
    }
    let loss = t.compute_gradients().unwrap().double_value(&[]);
    let batch = t.grpo_batch().unwrap().expect("a GRPO step has a batch");
    assert!(
        (batch.loss - loss).abs() <= 1e-6 * loss.abs(),
        "{}: the step's loss {loss}, its batch's {}",
        c.name,
        batch.loss
    );
    batch.write(&dir.join("batch.safetensors")).unwrap();
    std::os::unix::fs::symlink(base_hf, dir.join("base")).unwrap();
    let case = json!({
        "num_generations": GROUP,
        "micro_batch": c.micro_batch,
        "step": c.step,
        "num_iterations": c.step,
        "loss_type": c.loss_type,
        "scale_rewards": c.scale_rewards,
        "beta": c.beta,
        "epsilon": 0.2,
        "epsilon_high": c.clip_epsilon_high,
        "temperature": TEMPERATURE,
        "max_completion_length": c.max_new_tokens,
        "mask_truncated_completions": c.mask_truncated,
        "off_policy_mask_threshold": c.off_policy_threshold,
        "use_bias_correction_kl": c.unbiased_kl,
    });
    std::fs::write(dir.join("case.json"), case.to_string()).unwrap();
    Ours { dir, batch, grads: t.gradients().unwrap().into_iter().collect() }
}

fn scalar(t: &HashMap<String, Tensor>, name: &str) -> f64 {
    t.get(name).unwrap_or_else(|| panic!("TRL wrote no {name}")).double_value(&[])
}

/// Largest |a − b| where `mask` is set, and the largest |b| there.
fn masked_diff(a: &Tensor, b: &Tensor, mask: &Tensor) -> (f64, f64) {
    let (a, b) = (a.to_kind(Kind::Double) * mask, b.to_kind(Kind::Double) * mask);
    ((&a - &b).abs().max().double_value(&[]), b.abs().max().double_value(&[]))
}

/// Compares one case; returns a line of its figures.
fn compare(c: &Case, ours: &Ours) -> String {
    let trl: HashMap<String, Tensor> =
        Tensor::read_safetensors(ours.dir.join("trl.safetensors")).unwrap().into_iter().collect();
    let b = &ours.batch;
    let name = c.name;
    let rows = b.completions.len() as i64;
    assert_eq!(rows, i64::from(PROMPTS * GROUP), "{name}");

    // The mask: TRL's, built from its own completion lengths and truncation rule.
    let lengths: Vec<i64> = b.completions.iter().map(|c| c.len() as i64).collect();
    let width = *lengths.iter().max().unwrap();
    let ours_mask: Vec<f32> = (0..rows as usize)
        .flat_map(|r| (0..width).map(move |t| (r, t)))
        .map(|(r, t)| if t < lengths[r] && b.in_loss[r] { 1.0 } else { 0.0 })
        .collect();
    let mask = Tensor::from_slice(&ours_mask).view([rows, width]);
    assert_eq!(
        Vec::<f32>::try_from(trl["completion_mask"].reshape([-1])).unwrap(),
        ours_mask,
        "{name}: the completions in the loss"
    );
    let tokens = mask.sum(Kind::Double).double_value(&[]);
    assert_eq!(b.sums.loss_tokens, tokens, "{name}");
    assert_eq!(scalar(&trl, "num_items_in_batch"), tokens, "{name}");

    let adv = Tensor::from_slice(&b.advantages);
    let adv_diff = (&adv - &trl["advantages"]).abs().max().double_value(&[]);
    assert!(adv_diff <= 1e-5, "{name}: advantages differ by {adv_diff}");

    let mut worst_token = 0.0f64;
    let mut per_token = |what: &str, ours: &Tensor, theirs: &str, tol: f64| {
        let (diff, scale) = masked_diff(ours, &trl[theirs], &mask);
        assert!(diff <= tol * scale.max(1.0), "{name}: {what} differs by {diff} (largest {scale})");
        worst_token = worst_token.max(diff / scale.max(1.0));
    };
    per_token("log π_θ", &b.logps, "logps", 1e-5);
    if let Some(old) = &b.old_logps {
        per_token("log π_old", old, "old_logps", 1e-5);
    }
    if let Some(reference) = &b.ref_logps {
        per_token("log π_ref", reference, "ref_logps", 1e-5);
    }
    per_token("per-token loss", &b.per_token_loss, "per_token_loss", 1e-5);
    if c.beta > 0.0 {
        per_token("per-token KL", &b.per_token_kl, "per_token_kl", 1e-5);
        let kl = b.sums.kl / tokens;
        let their = scalar(&trl, "kl");
        assert!((kl - their).abs() <= 1e-5 * their.abs().max(1e-6), "{name}: KL {kl} vs TRL {their}");
    }

    // A fresh batch's loss is a sum of advantages that cancel to about 0 in a group, so
    // its relative error is measured against the size of its terms: the loss itself or
    // the mean |per-token loss|, whichever is larger.
    let (loss, their_loss) = (b.loss, scalar(&trl, "loss"));
    let terms = (b.per_token_loss.abs() * &mask).sum(Kind::Double).double_value(&[]) / tokens;
    let loss_rel = (loss - their_loss).abs() / their_loss.abs().max(terms);
    assert!(loss_rel <= 1e-5, "{name}: loss {loss} vs TRL {their_loss} (terms {terms})");

    let fractions = [
        ("low", b.clipped_low / tokens, "clip_ratio.low_mean"),
        ("high", b.clipped_high / tokens, "clip_ratio.high_mean"),
        ("region", (b.clipped_low + b.clipped_high) / tokens, "clip_ratio.region_mean"),
    ];
    for (what, ours, theirs) in fractions {
        assert!((ours - scalar(&trl, theirs)).abs() <= 1e-6, "{name}: clip fraction {what} {ours} vs TRL");
    }
    if c.step == 1 {
        let entropy = b.sums.entropy / b.sums.entropy_tokens;
        let their = scalar(&trl, "entropy");
        assert!((entropy - their).abs() <= 1e-5 * their, "{name}: entropy {entropy} vs TRL {their}");
    }

    let mut worst_grad = 0.0f64;
    for (key, g) in &ours.grads {
        let theirs = trl.get(&format!("grad.{key}")).unwrap_or_else(|| panic!("{name}: TRL has no gradient of {key}"));
        let scale = theirs.abs().max().double_value(&[]);
        let diff = (g - theirs).abs().max().double_value(&[]);
        assert!(scale > 0.0, "{name}: {key} has no gradient in TRL");
        assert!(diff <= 1e-4 * scale, "{name}: ∂/∂{key} differs by {diff} (largest {scale})");
        worst_grad = worst_grad.max(diff / scale);
    }
    assert_eq!(trl.keys().filter(|k| k.starts_with("grad.")).count(), ours.grads.len(), "{name}");
    format!(
        "{name}: loss {loss:.6e} (rel. diff {loss_rel:.1e}), tokens {tokens}, clipped {}/{}, off-policy masked {}, \
         largest per-token diff {worst_token:.1e}, largest gradient diff {worst_grad:.1e} of the tensor's largest",
        b.clipped_low, b.clipped_high, b.sums.off_policy_masked
    )
}

#[test]
fn trl_grpo_trainer_computes_the_same_step() {
    let root = common::grpo_base("trl-parity");
    let base_hf = root.join("base-hf");
    let out = trainer_bin().arg("export").arg(root.join("base")).arg("--hf").arg(&base_hf).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let cases = cases();
    let computed: Vec<Ours> = cases.iter().map(|c| ours(&root, &base_hf, c)).collect();

    // Each case exercises what it names.
    for (c, o) in cases.iter().zip(&computed) {
        let b = &o.batch;
        let signal = b.advantages.iter().filter(|a| a.abs() > 1e-3).count();
        assert!(signal >= 4, "{}: only {signal} completions with an advantage", c.name);
        if c.mask_truncated {
            let out = b.in_loss.iter().filter(|k| !**k).count();
            assert!(out > 0 && out < b.in_loss.len(), "{}: {out} truncated completions", c.name);
        }
        if c.step == 2 {
            assert!(b.clipped_low + b.clipped_high > 0.0, "{}: nothing clipped", c.name);
        }
        if c.off_policy_threshold.is_some() && c.step == 2 {
            let negative = b.advantages.iter().filter(|a| **a < 0.0).count() as f64;
            let masked = b.sums.off_policy_masked;
            assert!(masked > 0.0 && masked < negative, "{}: {masked} of {negative} off-policy masked", c.name);
        }
    }

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/trl_parity.py");
    let out = Command::new(python()).arg(script).args(computed.iter().map(|o| &o.dir)).output().expect("python runs");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "TRL failed:\n{stdout}\n{stderr}");
    for (c, o) in cases.iter().zip(&computed) {
        println!("{}", compare(c, o));
    }
    std::fs::remove_dir_all(&root).unwrap();
}
