//! The Prometheus text of `/metrics`, built per scrape from a snapshot of the state.

use crds::contract::{FailureReason, RankTiming};
use prometheus::core::Collector;
use prometheus::{Gauge, GaugeVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

use super::state::{PHASES, StatusState, phase_name};

/// A registry holding the metrics of one scrape, built from a snapshot so that every
/// change to the state, however made, shows on the next scrape.
pub(super) fn metrics_registry(state: &StatusState) -> Registry {
    let registry = Registry::new();
    let add = |c: Box<dyn Collector>| registry.register(c).expect("metric names are unique");
    let status = &state.status;

    let int_gauge = |name: &str, help: &str, v: i64| {
        let g = IntGauge::with_opts(Opts::new(name, help)).expect("valid metric");
        g.set(v);
        add(Box::new(g));
    };
    let gauge = |name: &str, help: &str, v: Option<f64>| {
        if let Some(v) = v {
            let g = Gauge::with_opts(Opts::new(name, help)).expect("valid metric");
            g.set(v);
            add(Box::new(g));
        }
    };
    let as_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);

    int_gauge("trainer_step", "Optimizer steps completed.", as_i64(status.step));
    int_gauge("trainer_total_steps", "Optimizer steps the run will take.", as_i64(status.total_steps));
    int_gauge("trainer_total_tokens", "Tokens the run will train on.", as_i64(status.total_tokens));
    int_gauge("trainer_attempt", "Gang attempt of this trainer, starting at 1.", i64::from(status.attempt));

    let tokens = IntCounter::with_opts(Opts::new("trainer_tokens_total", "Tokens trained on, all ranks together."))
        .expect("valid metric");
    tokens.inc_by(status.tokens);
    add(Box::new(tokens));

    let m = &status.metrics;
    gauge("trainer_loss", "Training loss of the last step.", m.loss);
    gauge("trainer_val_loss", "Mean validation loss at the latest evaluation.", m.val_loss);
    gauge("trainer_learning_rate", "Learning rate of the last step.", m.lr);
    gauge("trainer_grad_norm", "Global gradient norm before clipping, last step.", m.grad_norm);
    gauge(
        "trainer_tokens_per_second",
        "Training throughput, all ranks together.",
        m.tokens_per_second.map(|t| t as f64),
    );
    gauge("trainer_mfu", "Model FLOPs utilization (0-1) against the device's bf16 peak.", m.mfu);
    gauge(
        "trainer_gpu_memory_peak_bytes",
        "Most GPU memory rank 0's tensors have held since the trainer started.",
        state.gpu_memory.map(|g| g.peak_bytes as f64),
    );
    gauge("trainer_gpu_memory_total_bytes", "Memory of rank 0's GPU.", state.gpu_memory.map(|g| g.total_bytes as f64));
    gauge("trainer_grpo_reward", "GRPO: mean reward of the last step's completions.", m.reward);
    gauge("trainer_grpo_accuracy", "GRPO: fraction of the last step's completions answering correctly.", m.accuracy);
    gauge(
        "trainer_grpo_unparsed_fraction",
        "GRPO: fraction of the last step's completions with no answer letter.",
        m.unparsed_fraction,
    );
    gauge("trainer_grpo_kl", "GRPO: mean k3 KL to the reference model per completion token.", m.kl);
    gauge(
        "trainer_grpo_clip_fraction",
        "GRPO: fraction of completion tokens whose ratio was clipped.",
        m.clip_fraction,
    );
    gauge("trainer_grpo_completion_tokens", "GRPO: mean completion length in tokens.", m.completion_length);
    gauge(
        "trainer_grpo_frac_reward_zero_std",
        "GRPO: fraction of the last step's prompt groups whose completions all got the same reward.",
        m.frac_reward_zero_std,
    );
    gauge(
        "trainer_grpo_entropy",
        "GRPO: mean entropy (nats) of the policy over the last batch's completion tokens.",
        m.entropy,
    );
    gauge(
        "trainer_grpo_no_signal_steps",
        "GRPO: steps in a row, up to the last, in which at least 90% of the prompt groups had equal rewards.",
        m.no_signal_steps.map(|n| n as f64),
    );
    gauge(
        "trainer_grpo_sampling_tokens_per_second",
        "GRPO: tokens generated per second while sampling, all ranks together.",
        m.sampling_tokens_per_second.map(|t| t as f64),
    );
    gauge(
        "trainer_grpo_training_tokens_per_second",
        "GRPO: tokens trained on per second, all ranks together.",
        m.training_tokens_per_second.map(|t| t as f64),
    );
    if m.eval_accuracy.is_some() {
        let acc = GaugeVec::new(
            Opts::new(
                "trainer_eval_accuracy",
                "Held-out multiple-choice accuracy (0-1) by method, at the latest evaluation.",
            ),
            &["method"],
        )
        .expect("valid metric");
        for (method, v) in [
            ("greedy", m.eval_accuracy),
            ("log_likelihood", m.eval_accuracy_log_likelihood),
            ("initial_greedy", m.initial_eval_accuracy),
        ] {
            if let Some(v) = v {
                acc.with_label_values(&[method]).set(v);
            }
        }
        add(Box::new(acc));
    }
    gauge(
        "trainer_last_checkpoint_step",
        "Optimizer step of the newest complete checkpoint.",
        status.last_checkpoint.as_ref().map(|c| c.step as f64),
    );
    gauge(
        "trainer_last_step_timestamp_seconds",
        "Unix time at which the last optimizer step completed.",
        state.last_step_time,
    );

    if !status.tokens_by_source.is_empty() {
        let by_source = GaugeVec::new(
            Opts::new("trainer_source_tokens", "Tokens trained on from each data source so far."),
            &["source"],
        )
        .expect("valid metric");
        for (source, tokens) in &status.tokens_by_source {
            by_source.with_label_values(&[source.as_str()]).set(*tokens as f64);
        }
        add(Box::new(by_source));
    }
    if !state.val_loss_by_source.is_empty() {
        let by_source = GaugeVec::new(
            Opts::new("trainer_val_loss_by_source", "Validation loss of each data source at the latest evaluation."),
            &["source"],
        )
        .expect("valid metric");
        for (source, loss) in &state.val_loss_by_source {
            by_source.with_label_values(&[source.as_str()]).set(*loss);
        }
        add(Box::new(by_source));
    }

    let nonfinite = IntCounter::with_opts(Opts::new(
        "trainer_nonfinite_total",
        "Steps whose loss or gradient norm was NaN or infinite.",
    ))
    .expect("valid metric");
    nonfinite.inc_by(state.nonfinite_events);
    add(Box::new(nonfinite));

    let failures =
        IntCounterVec::new(Opts::new("trainer_failures_total", "Training failures, by contract reason."), &["reason"])
            .expect("valid metric");
    for reason in FailureReason::ALL {
        failures.with_label_values(&[reason.as_str()]).inc_by(state.failures.get(&reason).copied().unwrap_or(0));
    }
    add(Box::new(failures));

    let phase = IntGaugeVec::new(
        Opts::new("trainer_phase", "1 for the trainer's current phase, 0 for the others."),
        &["phase"],
    )
    .expect("valid metric");
    for p in PHASES {
        phase.with_label_values(&[phase_name(p)]).set(i64::from(p == status.phase));
    }
    add(Box::new(phase));

    let info = IntGaugeVec::new(
        Opts::new("trainer_info", "Constant 1, labelled with the run's preset, precision, device and world size."),
        &["preset", "precision", "device", "world_size"],
    )
    .expect("valid metric");
    let world_size = state.info.world_size.to_string();
    info.with_label_values(&[
        state.info.preset.as_str(),
        state.info.precision.as_str(),
        state.info.device.as_str(),
        world_size.as_str(),
    ])
    .set(1);
    add(Box::new(info));

    let per_rank = |name: &str, help: &str, value: fn(&RankTiming) -> f64| {
        let g = GaugeVec::new(Opts::new(name, help), &["rank"]).expect("valid metric");
        for r in &status.ranks {
            g.with_label_values(&[r.rank.to_string().as_str()]).set(value(r));
        }
        add(Box::new(g));
    };
    per_rank(
        "trainer_rank_compute_seconds",
        "Each rank's own work per step (forward, backward; GRPO's sampling) before the gradient all-reduce, over the last sync interval.",
        |r| r.compute_seconds,
    );
    per_rank(
        "trainer_rank_data_wait_seconds",
        "Each rank's wait for the data loader per step, over the last sync interval.",
        |r| r.data_wait_seconds,
    );

    registry
}
