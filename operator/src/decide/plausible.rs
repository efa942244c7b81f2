//! Whether rank 0's `/status` document could be true of the run, pure. The operator
//! copies it into the run's status, and a pod can answer anything: figures no trainer
//! of this run could report are refused rather than written.

use std::collections::BTreeSet;

use crds::RunConfig;
use crds::contract::TrainerStatus;
use crds::types::CheckpointRef;

/// A cross entropy starts near ln(vocabulary), about 11, and a diverging run goes
/// non-finite long before this; GRPO's loss is a scaled advantage, far smaller.
pub const MAX_LOSS: f64 = 1e6;
/// MFU is measured against an H100's bf16 peak: a faster GPU may pass 1, not tenfold.
pub const MAX_MFU: f64 = 10.0;
/// Tokens one process trains or samples per second: far past any accelerator.
pub const MAX_TOKENS_PER_SECOND_PER_PROCESS: u64 = 1_000_000_000;
/// The longest string copied into the run's status (a checkpoint's URI or time, an
/// evaluation set's name).
pub const MAX_TEXT_BYTES: usize = 4096;

/// `Ok` when `t` could be rank 0's report for the run under `cfg` (the attempt that
/// runs); otherwise what is wrong with it.
pub fn plausible(t: &TrainerStatus, cfg: &RunConfig) -> Result<(), String> {
    if t.attempt != cfg.attempt {
        return Err(format!("it is attempt {}'s report, and attempt {} runs", t.attempt, cfg.attempt));
    }
    if t.step > t.total_steps {
        return Err(format!("step {} is past its own totalSteps {}", t.step, t.total_steps));
    }
    if t.tokens > t.total_tokens {
        return Err(format!("tokens {} is past its own totalTokens {}", t.tokens, t.total_tokens));
    }
    let bound = Bound::of(cfg);
    bound.steps("step", t.step)?;
    bound.tokens("tokens", t.tokens)?;
    for (name, c) in [("lastCheckpoint", &t.last_checkpoint), ("bestCheckpoint", &t.best_checkpoint)] {
        if let Some(c) = c {
            checkpoint(name, c, &bound)?;
        }
    }
    metrics(t, cfg, &bound)?;
    ranks(t, cfg)
}

/// How far past the run's totals a report may go. A budget lowered to just above the
/// tokens trained (as last written to status) takes effect when the gang restarts,
/// and until then the trainer goes on under the old one: a tenth of the run more
/// covers that, and refuses absurd figures.
struct Bound<'a> {
    cfg: &'a RunConfig,
    max_steps: u64,
    max_tokens: u64,
}

impl Bound<'_> {
    fn of(cfg: &RunConfig) -> Bound<'_> {
        let s = &cfg.schedule;
        let slack = (s.total_steps / 10).max(1);
        let max_tokens = s.total_tokens.saturating_add(slack.saturating_mul(cfg.batch.tokens_per_step));
        Bound { cfg, max_steps: s.total_steps.saturating_add(slack), max_tokens }
    }

    fn steps(&self, name: &str, v: u64) -> Result<(), String> {
        if v > self.max_steps {
            return Err(format!("{name} {v} is past the run's {} steps", self.cfg.schedule.total_steps));
        }
        Ok(())
    }

    fn tokens(&self, name: &str, v: u64) -> Result<(), String> {
        if v > self.max_tokens {
            return Err(format!("{name} {v} is past the run's {} tokens", self.cfg.schedule.total_tokens));
        }
        Ok(())
    }
}

fn checkpoint(name: &str, c: &CheckpointRef, bound: &Bound) -> Result<(), String> {
    bound.steps(&format!("{name}.step"), c.step)?;
    bound.tokens(&format!("{name}.tokens"), c.tokens)?;
    text(&format!("{name}.uri"), &c.uri)?;
    if let Some(time) = &c.time {
        text(&format!("{name}.time"), time)?;
    }
    within(&format!("{name}.valLoss"), c.val_loss, 0.0, MAX_LOSS)
}

fn text(name: &str, s: &str) -> Result<(), String> {
    if s.len() > MAX_TEXT_BYTES {
        return Err(format!("{name} is {} bytes long, over {MAX_TEXT_BYTES}", s.len()));
    }
    Ok(())
}

/// `v`, when present, is finite and in `lo..=hi`.
fn within(name: &str, v: Option<f64>, lo: f64, hi: f64) -> Result<(), String> {
    match v {
        Some(x) if !x.is_finite() => Err(format!("{name} is {x}")),
        Some(x) if x < lo => Err(format!("{name} {} is below {}", show(x), show(lo))),
        Some(x) if x > hi => Err(format!("{name} {} is over {}", show(x), show(hi))),
        _ => Ok(()),
    }
}

/// `1e308` rather than its 309 digits.
fn show(x: f64) -> String {
    if x != 0.0 && !(1e-4..1e6).contains(&x.abs()) { format!("{x:e}") } else { x.to_string() }
}

fn metrics(t: &TrainerStatus, cfg: &RunConfig, bound: &Bound) -> Result<(), String> {
    let m = &t.metrics;
    // GRPO's loss is an advantage-weighted ratio: negative as often as not.
    let min_loss = if cfg.grpo.is_some() { -MAX_LOSS } else { 0.0 };
    within("loss", m.loss, min_loss, MAX_LOSS)?;
    within("valLoss", m.val_loss, 0.0, MAX_LOSS)?;
    within("mfu", m.mfu, 0.0, MAX_MFU)?;
    within("gradNorm", m.grad_norm, 0.0, f64::MAX)?;
    within("lr", m.lr, 0.0, f64::MAX)?;
    within("reward", m.reward, f64::MIN, f64::MAX)?;
    within("kl", m.kl, f64::MIN, f64::MAX)?;
    within("entropy", m.entropy, 0.0, f64::MAX)?;
    within("completionLength", m.completion_length, 0.0, f64::from(cfg.batch.seq_len))?;
    within("gpuMemoryPeakGiB", m.gpu_memory_peak_gib, 0.0, f64::MAX)?;
    within("gpuMemoryTotalGiB", m.gpu_memory_total_gib, 0.0, f64::MAX)?;
    let fractions = [
        ("accuracy", m.accuracy),
        ("unparsedFraction", m.unparsed_fraction),
        ("clipFraction", m.clip_fraction),
        ("fracRewardZeroStd", m.frac_reward_zero_std),
        ("initialEvalAccuracy", m.initial_eval_accuracy),
        ("evalAccuracy", m.eval_accuracy),
        ("evalAccuracyLogLikelihood", m.eval_accuracy_log_likelihood),
    ];
    for (name, v) in fractions {
        within(name, v, 0.0, 1.0)?;
    }
    let max_rate = u64::from(cfg.topology.world_size.max(1)).saturating_mul(MAX_TOKENS_PER_SECOND_PER_PROCESS);
    let rates = [
        ("tokensPerSecond", m.tokens_per_second),
        ("samplingTokensPerSecond", m.sampling_tokens_per_second),
        ("trainingTokensPerSecond", m.training_tokens_per_second),
    ];
    for (name, v) in rates {
        if let Some(v) = v.filter(|v| *v > max_rate) {
            return Err(format!("{name} {v} is over {max_rate} for {} processes", cfg.topology.world_size));
        }
    }
    if let Some(n) = m.no_signal_steps {
        bound.steps("noSignalSteps", n)?;
    }
    let sets = cfg.grpo.as_ref().map_or(0, |g| g.eval_datasets.len());
    if m.eval_datasets.len() > sets {
        return Err(format!("evalDatasets has {} entries, and the run scores {sets}", m.eval_datasets.len()));
    }
    for d in &m.eval_datasets {
        text("evalDatasets[].dataset", &d.dataset)?;
        let name = |field: &str| format!("evalDatasets[{}].{field}", d.dataset);
        within(&name("initialAccuracy"), d.initial_accuracy, 0.0, 1.0)?;
        within(&name("accuracy"), d.accuracy, 0.0, 1.0)?;
        within(&name("accuracyLogLikelihood"), d.accuracy_log_likelihood, 0.0, 1.0)?;
    }
    Ok(())
}

/// Straggler detection reads these and names the pod of a rank.
fn ranks(t: &TrainerStatus, cfg: &RunConfig) -> Result<(), String> {
    let world = cfg.topology.world_size;
    let mut seen = BTreeSet::new();
    for r in &t.ranks {
        if r.rank >= world {
            return Err(format!("ranks names rank {}, and the run has {world} processes", r.rank));
        }
        if !seen.insert(r.rank) {
            return Err(format!("ranks names rank {} twice", r.rank));
        }
        let name = |field: &str| format!("ranks[{}].{field}", r.rank);
        within(&name("computeSeconds"), Some(r.compute_seconds), 0.0, f64::MAX)?;
        within(&name("dataWaitSeconds"), Some(r.data_wait_seconds), 0.0, f64::MAX)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::testing::{GPU_SPEC, GRPO_SPEC, run};
    use crds::contract::{RankTiming, TrainerPhase};
    use crds::types::{EvalDatasetAccuracy, RunMetrics};

    fn cfg(spec: &str) -> RunConfig {
        let mut cfg = crds::resolve(&run(spec)).unwrap();
        cfg.attempt = 2;
        cfg
    }

    /// A report a trainer of `cfg` could give: a quarter through, with every metric.
    fn report(cfg: &RunConfig) -> TrainerStatus {
        let s = &cfg.schedule;
        let ckpt = CheckpointRef {
            step: s.total_steps / 5,
            tokens: s.total_tokens / 5,
            uri: "/checkpoints/step-00000010".into(),
            time: Some("2026-01-01T00:30:00Z".into()),
            val_loss: Some(3.1),
        };
        TrainerStatus {
            phase: TrainerPhase::Training,
            attempt: cfg.attempt,
            step: s.total_steps / 4,
            total_steps: s.total_steps,
            tokens: s.total_tokens / 4,
            total_tokens: s.total_tokens,
            metrics: RunMetrics {
                loss: Some(2.9),
                val_loss: Some(3.1),
                tokens_per_second: Some(400_000),
                mfu: Some(0.41),
                grad_norm: Some(0.8),
                lr: Some(3e-4),
                gpu_memory_peak_gib: Some(61.5),
                gpu_memory_total_gib: Some(79.6),
                ..Default::default()
            },
            last_checkpoint: Some(ckpt.clone()),
            best_checkpoint: Some(ckpt),
            tokens_by_source: Default::default(),
            ranks: (0..cfg.topology.world_size)
                .map(|rank| RankTiming { rank, compute_seconds: 0.4, data_wait_seconds: 0.002 })
                .collect(),
        }
    }

    fn grpo_report(cfg: &RunConfig) -> TrainerStatus {
        let mut t = report(cfg);
        t.ranks.clear();
        t.metrics = RunMetrics {
            loss: Some(-0.03),
            reward: Some(-0.5),
            accuracy: Some(0.25),
            unparsed_fraction: Some(0.0),
            kl: Some(0.001),
            clip_fraction: Some(0.02),
            completion_length: Some(31.5),
            frac_reward_zero_std: Some(0.5),
            entropy: Some(0.7),
            no_signal_steps: Some(3),
            eval_accuracy: Some(1.0),
            ..Default::default()
        };
        t
    }

    #[test]
    fn a_report_the_trainer_could_give_is_plausible() {
        let gpu = cfg(GPU_SPEC);
        assert_eq!(plausible(&report(&gpu), &gpu), Ok(()));
        let grpo = cfg(GRPO_SPEC);
        assert_eq!(plausible(&grpo_report(&grpo), &grpo), Ok(()));
        // The end of the run, and a lowered budget's slack past it, are plausible too.
        let mut done = report(&gpu);
        (done.step, done.tokens) = (gpu.schedule.total_steps, gpu.schedule.total_tokens);
        assert_eq!(plausible(&done, &gpu), Ok(()));
        let mut old_budget = report(&gpu);
        old_budget.total_steps *= 10;
        old_budget.total_tokens *= 10;
        old_budget.step = gpu.schedule.total_steps + gpu.schedule.total_steps / 10;
        old_budget.tokens = old_budget.step * gpu.batch.tokens_per_step;
        assert_eq!(plausible(&old_budget, &gpu), Ok(()));
    }

    #[test]
    fn implausible_reports_are_refused_naming_what_is_wrong() {
        let gpu = cfg(GPU_SPEC);
        let (steps, tokens) = (gpu.schedule.total_steps, gpu.schedule.total_tokens);
        type Edit = fn(&mut TrainerStatus, u64, u64);
        let cases: [(&str, Edit, &str); 26] = [
            ("another attempt", |t, _, _| t.attempt = 1, "attempt 1's report, and attempt 2 runs"),
            ("step past its total", |t, s, _| t.step = s + 1, "past its own totalSteps"),
            ("tokens past its total", |t, _, n| t.tokens = n + 1, "past its own totalTokens"),
            ("step far past the run", |t, s, _| (t.step, t.total_steps) = (10 * s, u64::MAX), "is past the run's"),
            (
                "tokens far past the run",
                |t, _, _| (t.tokens, t.total_tokens) = (u64::MAX - 1, u64::MAX),
                "is past the run's",
            ),
            (
                "a checkpoint past the run",
                |t, s, _| t.last_checkpoint.as_mut().unwrap().step = 2 * s,
                "lastCheckpoint.step",
            ),
            (
                "a checkpoint's tokens past the run",
                |t, _, n| t.best_checkpoint.as_mut().unwrap().tokens = 2 * n,
                "bestCheckpoint.tokens",
            ),
            (
                "a checkpoint URI of a megabyte",
                |t, _, _| t.last_checkpoint.as_mut().unwrap().uri = "x".repeat(1 << 20),
                "lastCheckpoint.uri is 1048576 bytes long",
            ),
            (
                "a negative checkpoint validation loss",
                |t, _, _| t.best_checkpoint.as_mut().unwrap().val_loss = Some(-1.0),
                "bestCheckpoint.valLoss -1",
            ),
            ("a loss of 1e308", |t, _, _| t.metrics.loss = Some(1e308), "loss 1e308 is over 1e6"),
            ("a negative loss", |t, _, _| t.metrics.loss = Some(-0.5), "loss -0.5 is below 0"),
            ("an infinite loss", |t, _, _| t.metrics.loss = Some(f64::INFINITY), "loss is inf"),
            ("a NaN validation loss", |t, _, _| t.metrics.val_loss = Some(f64::NAN), "valLoss is NaN"),
            ("MFU of 50", |t, _, _| t.metrics.mfu = Some(50.0), "mfu 50 is over 10"),
            ("a negative gradient norm", |t, _, _| t.metrics.grad_norm = Some(-1.0), "gradNorm -1"),
            ("a negative learning rate", |t, _, _| t.metrics.lr = Some(-3e-4), "lr -0.0003 is below 0"),
            ("an accuracy over 1", |t, _, _| t.metrics.accuracy = Some(1.5), "accuracy 1.5 is over 1"),
            ("negative GPU memory", |t, _, _| t.metrics.gpu_memory_peak_gib = Some(-2.0), "gpuMemoryPeakGiB -2"),
            (
                "a throughput no cluster has",
                |t, _, _| t.metrics.tokens_per_second = Some(u64::MAX),
                "tokensPerSecond 18446744073709551615 is over 8000000000 for 8 processes",
            ),
            ("negative entropy", |t, _, _| t.metrics.entropy = Some(-0.1), "entropy -0.1"),
            (
                "completions longer than the sequence",
                |t, _, _| t.metrics.completion_length = Some(1e9),
                "completionLength 1e9 is over 1024",
            ),
            (
                "evaluation sets the run does not score",
                |t, _, _| t.metrics.eval_datasets = vec![EvalDatasetAccuracy::default(); 3],
                "evalDatasets has 3 entries, and the run scores 0",
            ),
            ("a rank past the world", |t, _, _| t.ranks[0].rank = 8, "rank 8, and the run has 8 processes"),
            ("a rank twice", |t, _, _| t.ranks[1].rank = 0, "rank 0 twice"),
            ("negative compute time", |t, _, _| t.ranks[3].compute_seconds = -4.0, "ranks[3].computeSeconds -4"),
            ("a no-signal streak past the run", |t, s, _| t.metrics.no_signal_steps = Some(s * 100), "noSignalSteps"),
        ];
        for (case, edit, expected) in cases {
            let mut t = report(&gpu);
            edit(&mut t, steps, tokens);
            let err = plausible(&t, &gpu).expect_err(case);
            assert!(err.contains(expected), "{case}: {err}");
        }
    }

    #[test]
    fn grpo_losses_may_be_negative_pretraining_losses_may_not() {
        let grpo = cfg(GRPO_SPEC);
        let mut t = grpo_report(&grpo);
        t.metrics.loss = Some(-2.0);
        assert_eq!(plausible(&t, &grpo), Ok(()));
        t.metrics.loss = Some(-1e300);
        assert!(plausible(&t, &grpo).unwrap_err().contains("loss -1e300 is below -1e6"));
        let gpu = cfg(GPU_SPEC);
        let mut t = report(&gpu);
        t.metrics.loss = Some(-2.0);
        assert!(plausible(&t, &gpu).is_err());
    }

    /// The status document's every field, from its schema: whatever rank 0 sends,
    /// `plausible` does not panic, and a refusal names the field it is about.
    mod properties {
        use proptest::prelude::*;

        use super::*;

        /// The field names of the status document, as its JSON spells them.
        fn field_names() -> Vec<String> {
            let schema = schemars::schema_for!(TrainerStatus);
            let json = serde_json::to_value(schema).unwrap();
            let mut names = vec!["attempt".to_string()];
            fn walk(v: &serde_json::Value, names: &mut Vec<String>) {
                match v {
                    serde_json::Value::Object(o) => {
                        if let Some(p) = o.get("properties").and_then(|p| p.as_object()) {
                            names.extend(p.keys().cloned());
                        }
                        o.values().for_each(|v| walk(v, names));
                    }
                    serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, names)),
                    _ => {}
                }
            }
            walk(&json, &mut names);
            names
        }

        fn cases() -> u32 {
            std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(512)
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

            #[test]
            fn any_document_is_judged_and_refusals_name_their_field(
                doc in crds::arbitrary::mutations(serde_json::to_value(report(&cfg(GPU_SPEC))).unwrap(), &crds::arbitrary::schema_of::<TrainerStatus>(), 0)
            ) {
                let Ok(status) = serde_json::from_value::<TrainerStatus>(doc) else { return Ok(()) };
                if let Err(why) = plausible(&status, &cfg(GPU_SPEC)) {
                    let names = field_names();
                    prop_assert!(
                        names.iter().any(|n| why.contains(n.as_str())) || why.contains("rank"),
                        "a refusal that names no field: {why}"
                    );
                }
            }

            #[test]
            fn any_bytes_are_refused_or_read(body in proptest::collection::vec(any::<u8>(), 0..512)) {
                if let Ok(status) = serde_json::from_slice::<TrainerStatus>(&body) {
                    let _ = plausible(&status, &cfg(GRPO_SPEC));
                }
            }
        }
    }
}
