//! The operator's Prometheus metrics: reconciles, and one set of gauges per run
//! (dropped when the run is deleted).

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use crds::types::{RunPhase, TrainingRunStatus};
use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};

const PHASES: [RunPhase; 7] = [
    RunPhase::Pending,
    RunPhase::Waiting,
    RunPhase::Running,
    RunPhase::Restarting,
    RunPhase::Succeeded,
    RunPhase::Failed,
    RunPhase::Suspended,
];

/// (namespace, name)
type RunKey = (String, String);

pub struct Metrics {
    registry: Registry,
    reconciles: IntCounterVec,
    reconcile_seconds: HistogramVec,
    phase: IntGaugeVec,
    progress: GaugeVec,
    loss: GaugeVec,
    tokens_per_second: GaugeVec,
    restarts: IntGaugeVec,
    rollbacks: IntGaugeVec,
    attempt: IntGaugeVec,
    condition: IntGaugeVec,
    last_checkpoint: GaugeVec,
    mfu: GaugeVec,
    checkpoint_every_tokens: GaugeVec,
    eval_accuracy: GaugeVec,
    /// Condition label sets exported per run, so stale ones can be removed.
    conditions: Mutex<HashMap<RunKey, BTreeSet<[String; 3]>>>,
}

fn phase_name(p: RunPhase) -> &'static str {
    match p {
        RunPhase::Pending => "Pending",
        RunPhase::Waiting => "Waiting",
        RunPhase::Running => "Running",
        RunPhase::Restarting => "Restarting",
        RunPhase::Succeeded => "Succeeded",
        RunPhase::Failed => "Failed",
        RunPhase::Suspended => "Suspended",
    }
}

impl Metrics {
    pub fn new() -> Result<Metrics, prometheus::Error> {
        let registry = Registry::new();
        let run = &["namespace", "name"];
        let m = Metrics {
            reconciles: IntCounterVec::new(
                Opts::new("trainingrun_reconcile_total", "Reconciles of TrainingRuns by result."),
                &["result"],
            )?,
            reconcile_seconds: HistogramVec::new(
                HistogramOpts::new("trainingrun_reconcile_duration_seconds", "Duration of one reconcile by result.")
                    .buckets(vec![0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0]),
                &["result"],
            )?,
            phase: IntGaugeVec::new(
                Opts::new("trainingrun_phase", "1 for the run's current phase, 0 for the others."),
                &["namespace", "name", "phase"],
            )?,
            progress: GaugeVec::new(
                Opts::new("trainingrun_progress_ratio", "Tokens trained over tokens planned, 0-1."),
                run,
            )?,
            loss: GaugeVec::new(Opts::new("trainingrun_loss", "Training loss last reported by rank 0."), run)?,
            tokens_per_second: GaugeVec::new(
                Opts::new("trainingrun_tokens_per_second", "Training throughput, all ranks."),
                run,
            )?,
            restarts: IntGaugeVec::new(
                Opts::new("trainingrun_restarts", "Gang restarts counted toward maxRestarts."),
                run,
            )?,
            rollbacks: IntGaugeVec::new(
                Opts::new("trainingrun_rollbacks", "Rollbacks after non-finite steps (failurePolicy.onNaN: rollback)."),
                run,
            )?,
            attempt: IntGaugeVec::new(Opts::new("trainingrun_attempt", "Current attempt, from 1."), run)?,
            condition: IntGaugeVec::new(
                Opts::new(
                    "trainingrun_condition",
                    "1 for each current condition of a run, by type, reason and status.",
                ),
                &["namespace", "name", "type", "reason", "status"],
            )?,
            last_checkpoint: GaugeVec::new(
                Opts::new(
                    "trainingrun_last_checkpoint_timestamp_seconds",
                    "Unix time of the newest complete checkpoint.",
                ),
                run,
            )?,
            mfu: GaugeVec::new(
                Opts::new("trainingrun_mfu", "Model FLOPs utilization (0-1) last reported by rank 0."),
                run,
            )?,
            checkpoint_every_tokens: GaugeVec::new(
                Opts::new(
                    "trainingrun_checkpoint_every_tokens",
                    "Tokens between periodic checkpoints (checkpoint.everySteps × tokens per step); over trainingrun_tokens_per_second, the expected checkpoint interval.",
                ),
                run,
            )?,
            eval_accuracy: GaugeVec::new(
                Opts::new(
                    "trainingrun_eval_accuracy",
                    "GRPO: held-out multiple-choice accuracy (0-1) by method and time (initial or latest).",
                ),
                &["namespace", "name", "method", "when"],
            )?,
            conditions: Mutex::new(HashMap::new()),
            registry,
        };
        m.registry.register(Box::new(m.reconciles.clone()))?;
        m.registry.register(Box::new(m.reconcile_seconds.clone()))?;
        m.registry.register(Box::new(m.phase.clone()))?;
        m.registry.register(Box::new(m.progress.clone()))?;
        m.registry.register(Box::new(m.loss.clone()))?;
        m.registry.register(Box::new(m.tokens_per_second.clone()))?;
        m.registry.register(Box::new(m.restarts.clone()))?;
        m.registry.register(Box::new(m.rollbacks.clone()))?;
        m.registry.register(Box::new(m.attempt.clone()))?;
        m.registry.register(Box::new(m.condition.clone()))?;
        m.registry.register(Box::new(m.last_checkpoint.clone()))?;
        m.registry.register(Box::new(m.mfu.clone()))?;
        m.registry.register(Box::new(m.checkpoint_every_tokens.clone()))?;
        m.registry.register(Box::new(m.eval_accuracy.clone()))?;
        Ok(m)
    }

    pub fn reconciled(&self, ok: bool, seconds: f64) {
        let result = if ok { "success" } else { "error" };
        self.reconciles.with_label_values(&[result]).inc();
        self.reconcile_seconds.with_label_values(&[result]).observe(seconds);
    }

    /// Sets every per-run gauge from the run's status; `checkpoint_every_tokens` comes
    /// from the resolved spec (absent when it does not resolve).
    pub fn observe_run(&self, ns: &str, name: &str, s: &TrainingRunStatus, checkpoint_every_tokens: Option<u64>) {
        let run = [ns, name];
        for p in PHASES {
            self.phase.with_label_values(&[ns, name, phase_name(p)]).set(i64::from(s.phase == Some(p)));
        }
        if let Some(p) = &s.progress {
            self.progress.with_label_values(&run).set(p.percent / 100.0);
        }
        let metrics = s.metrics.clone().unwrap_or_default();
        match metrics.loss {
            Some(l) => self.loss.with_label_values(&run).set(l),
            None => drop(self.loss.remove_label_values(&run)),
        }
        match metrics.tokens_per_second {
            Some(t) => self.tokens_per_second.with_label_values(&run).set(t as f64),
            None => drop(self.tokens_per_second.remove_label_values(&run)),
        }
        match metrics.mfu {
            Some(v) => self.mfu.with_label_values(&run).set(v),
            None => drop(self.mfu.remove_label_values(&run)),
        }
        if let Some(t) = checkpoint_every_tokens {
            self.checkpoint_every_tokens.with_label_values(&run).set(t as f64);
        }
        for (method, when, v) in [
            ("greedy", "latest", metrics.eval_accuracy),
            ("log_likelihood", "latest", metrics.eval_accuracy_log_likelihood),
            ("greedy", "initial", metrics.initial_eval_accuracy),
        ] {
            if let Some(v) = v {
                self.eval_accuracy.with_label_values(&[ns, name, method, when]).set(v);
            }
        }
        self.restarts.with_label_values(&run).set(i64::from(s.restarts));
        let rollbacks = s.effective.as_ref().map_or(0, |e| e.rollbacks.len());
        self.rollbacks.with_label_values(&run).set(rollbacks as i64);
        self.attempt.with_label_values(&run).set(i64::from(s.attempt));
        let ckpt_time =
            s.last_checkpoint.as_ref().and_then(|c| c.time.as_deref()).and_then(|t| t.parse::<jiff::Timestamp>().ok());
        if let Some(t) = ckpt_time {
            self.last_checkpoint.with_label_values(&run).set(t.as_millisecond() as f64 / 1000.0);
        }
        let now: BTreeSet<[String; 3]> =
            s.conditions.iter().map(|c| [c.type_.clone(), c.reason.clone(), c.status.clone()]).collect();
        let mut exported = self.conditions.lock().expect("metrics lock");
        let before = exported.entry((ns.to_string(), name.to_string())).or_default();
        for gone in before.difference(&now) {
            let _ = self.condition.remove_label_values(&[ns, name, &gone[0], &gone[1], &gone[2]]);
        }
        for c in &now {
            self.condition.with_label_values(&[ns, name, &c[0], &c[1], &c[2]]).set(1);
        }
        *before = now;
    }

    /// Drops every series of a deleted run.
    pub fn forget_run(&self, ns: &str, name: &str) {
        let run = [ns, name];
        for p in PHASES {
            let _ = self.phase.remove_label_values(&[ns, name, phase_name(p)]);
        }
        for g in [
            &self.progress,
            &self.loss,
            &self.tokens_per_second,
            &self.last_checkpoint,
            &self.mfu,
            &self.checkpoint_every_tokens,
        ] {
            let _ = g.remove_label_values(&run);
        }
        for (method, when) in [("greedy", "latest"), ("log_likelihood", "latest"), ("greedy", "initial")] {
            let _ = self.eval_accuracy.remove_label_values(&[ns, name, method, when]);
        }
        let _ = self.restarts.remove_label_values(&run);
        let _ = self.rollbacks.remove_label_values(&run);
        let _ = self.attempt.remove_label_values(&run);
        if let Some(set) = self.conditions.lock().expect("metrics lock").remove(&(ns.to_string(), name.to_string())) {
            for c in set {
                let _ = self.condition.remove_label_values(&[ns, name, &c[0], &c[1], &c[2]]);
            }
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut buf).expect("text encoding cannot fail");
        String::from_utf8(buf).expect("Prometheus text is UTF-8")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    fn cond(type_: &str, reason: &str, status: &str) -> Condition {
        Condition {
            type_: type_.into(),
            reason: reason.into(),
            status: status.into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: Time(jiff::Timestamp::UNIX_EPOCH),
        }
    }

    #[test]
    fn per_run_series_follow_the_status_and_go_with_the_run() {
        let m = Metrics::new().unwrap();
        let mut s = TrainingRunStatus { phase: Some(RunPhase::Running), restarts: 1, attempt: 2, ..Default::default() };
        s.metrics = Some(crds::types::RunMetrics {
            loss: Some(2.5),
            tokens_per_second: Some(1200),
            mfu: Some(0.41),
            eval_accuracy: Some(0.5),
            ..Default::default()
        });
        s.conditions = vec![cond("Stalled", "NoProgress", "True")];
        m.observe_run("ml", "llm", &s, Some(819200));
        let text = m.render();
        assert!(text.contains(r#"trainingrun_phase{name="llm",namespace="ml",phase="Running"} 1"#), "{text}");
        assert!(text.contains(r#"trainingrun_phase{name="llm",namespace="ml",phase="Failed"} 0"#));
        assert!(text.contains(r#"trainingrun_loss{name="llm",namespace="ml"} 2.5"#));
        assert!(text.contains(r#"trainingrun_tokens_per_second{name="llm",namespace="ml"} 1200"#));
        assert!(text.contains(r#"trainingrun_restarts{name="llm",namespace="ml"} 1"#));
        assert!(text.contains(r#"trainingrun_rollbacks{name="llm",namespace="ml"} 0"#));
        assert!(text.contains(r#"trainingrun_mfu{name="llm",namespace="ml"} 0.41"#));
        assert!(text.contains(r#"trainingrun_checkpoint_every_tokens{name="llm",namespace="ml"} 819200"#));
        assert!(
            text.contains(r#"trainingrun_eval_accuracy{method="greedy",name="llm",namespace="ml",when="latest"} 0.5"#)
        );
        assert!(text.contains(
            r#"trainingrun_condition{name="llm",namespace="ml",reason="NoProgress",status="True",type="Stalled"} 1"#
        ));
        s.conditions = vec![cond("Stalled", "Progressing", "False")];
        let rollback = crds::types::Rollback {
            step: 13,
            attempt: 1,
            skip_from: 96,
            skip_to: 104,
            lr_factor: 0.5,
            lr_until_step: 33,
            from_step: None,
        };
        s.effective = Some(crds::types::EffectiveSettings { micro_batch: None, rollbacks: vec![rollback] });
        m.observe_run("ml", "llm", &s, Some(819200));
        let text = m.render();
        assert!(!text.contains("NoProgress"), "stale condition series must go: {text}");
        assert!(text.contains(r#"trainingrun_rollbacks{name="llm",namespace="ml"} 1"#));
        m.forget_run("ml", "llm");
        let text = m.render();
        assert!(!text.contains(r#"name="llm""#), "{text}");
    }
}
