//! The operator's Prometheus metrics: reconciles, and one set of gauges per run
//! (dropped when the run is deleted).
//!
//! The per-run gauges are not prometheus-rs metric vectors: those keep a child with
//! its own descriptor and label pairs for every series, about 12 KB a run. A run keeps
//! one compact [`RunSample`] here, and a scrape turns the samples into series.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use crds::types::{RunPhase, TrainingRunStatus};
use prometheus::core::{Collector, Desc};
use prometheus::proto::{Gauge, LabelPair, Metric, MetricFamily, MetricType};
use prometheus::{Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder};

const PHASES: [RunPhase; 7] = [
    RunPhase::Pending,
    RunPhase::Waiting,
    RunPhase::Running,
    RunPhase::Restarting,
    RunPhase::Succeeded,
    RunPhase::Failed,
    RunPhase::Suspended,
];

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

/// The per-run gauge families. Every series also has the labels `namespace` and `name`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Family {
    Phase,
    Progress,
    Loss,
    TokensPerSecond,
    Restarts,
    Rollbacks,
    Attempt,
    Condition,
    LastCheckpoint,
    Mfu,
    CheckpointEveryTokens,
    EvalAccuracy,
}

impl Family {
    const ALL: [Family; 12] = [
        Family::Phase,
        Family::Progress,
        Family::Loss,
        Family::TokensPerSecond,
        Family::Restarts,
        Family::Rollbacks,
        Family::Attempt,
        Family::Condition,
        Family::LastCheckpoint,
        Family::Mfu,
        Family::CheckpointEveryTokens,
        Family::EvalAccuracy,
    ];

    fn name(self) -> &'static str {
        match self {
            Family::Phase => "trainingrun_phase",
            Family::Progress => "trainingrun_progress_ratio",
            Family::Loss => "trainingrun_loss",
            Family::TokensPerSecond => "trainingrun_tokens_per_second",
            Family::Restarts => "trainingrun_restarts",
            Family::Rollbacks => "trainingrun_rollbacks",
            Family::Attempt => "trainingrun_attempt",
            Family::Condition => "trainingrun_condition",
            Family::LastCheckpoint => "trainingrun_last_checkpoint_timestamp_seconds",
            Family::Mfu => "trainingrun_mfu",
            Family::CheckpointEveryTokens => "trainingrun_checkpoint_every_tokens",
            Family::EvalAccuracy => "trainingrun_eval_accuracy",
        }
    }

    fn help(self) -> &'static str {
        match self {
            Family::Phase => "1 for the run's current phase, 0 for the others.",
            Family::Progress => "Tokens trained over tokens planned, 0-1.",
            Family::Loss => "Training loss last reported by rank 0.",
            Family::TokensPerSecond => "Training throughput, all ranks.",
            Family::Restarts => "Gang restarts counted toward maxRestarts.",
            Family::Rollbacks => "Rollbacks after non-finite steps (failurePolicy.onNaN: rollback).",
            Family::Attempt => "Current attempt, from 1.",
            Family::Condition => "1 for each current condition of a run, by type, reason and status.",
            Family::LastCheckpoint => "Unix time of the newest complete checkpoint.",
            Family::Mfu => "Model FLOPs utilization (0-1) last reported by rank 0.",
            Family::CheckpointEveryTokens => {
                "Tokens between periodic checkpoints (checkpoint.everySteps × tokens per step); over trainingrun_tokens_per_second, the expected checkpoint interval."
            }
            Family::EvalAccuracy => {
                "GRPO: held-out multiple-choice accuracy (0-1) by method and time (initial or latest)."
            }
        }
    }

    /// Labels besides `namespace` and `name`.
    fn labels(self) -> &'static [&'static str] {
        match self {
            Family::Phase => &["phase"],
            Family::Condition => &["type", "reason", "status"],
            Family::EvalAccuracy => &["method", "when"],
            _ => &[],
        }
    }
}

/// A condition's labels: type, reason and status.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct ConditionLabels {
    type_: String,
    reason: String,
    status: String,
}

/// Held-out accuracies, each exported with its `method` and `when` labels.
#[derive(Clone, Debug, Default, PartialEq)]
struct EvalAccuracy {
    greedy_latest: Option<f64>,
    log_likelihood_latest: Option<f64>,
    greedy_initial: Option<f64>,
}

/// What one run exports; a gauge whose value is None has no series.
#[derive(Clone, Debug, Default, PartialEq)]
struct RunSample {
    phase: Option<RunPhase>,
    progress_ratio: Option<f64>,
    loss: Option<f64>,
    tokens_per_second: Option<f64>,
    restarts: u32,
    rollbacks: usize,
    attempt: u32,
    conditions: Vec<ConditionLabels>,
    last_checkpoint_seconds: Option<f64>,
    mfu: Option<f64>,
    checkpoint_every_tokens: Option<u64>,
    eval_accuracy: EvalAccuracy,
}

impl RunSample {
    fn new(s: &TrainingRunStatus, checkpoint_every_tokens: Option<u64>) -> RunSample {
        let metrics = s.metrics.as_ref();
        let checkpoint_time =
            s.last_checkpoint.as_ref().and_then(|c| c.time.as_deref()).and_then(|t| t.parse::<jiff::Timestamp>().ok());
        let mut conditions: Vec<ConditionLabels> = s
            .conditions
            .iter()
            .map(|c| ConditionLabels { type_: c.type_.clone(), reason: c.reason.clone(), status: c.status.clone() })
            .collect();
        // A repeated label set would make the scrape invalid.
        conditions.sort();
        conditions.dedup();
        RunSample {
            phase: s.phase,
            progress_ratio: s.progress.as_ref().map(|p| p.percent / 100.0),
            loss: metrics.and_then(|m| m.loss),
            tokens_per_second: metrics.and_then(|m| m.tokens_per_second).map(|t| t as f64),
            restarts: s.restarts,
            rollbacks: s.effective.as_ref().map_or(0, |e| e.rollbacks.len()),
            attempt: s.attempt,
            conditions,
            last_checkpoint_seconds: checkpoint_time.map(|t| t.as_millisecond() as f64 / 1000.0),
            mfu: metrics.and_then(|m| m.mfu),
            checkpoint_every_tokens,
            eval_accuracy: EvalAccuracy {
                greedy_latest: metrics.and_then(|m| m.eval_accuracy),
                log_likelihood_latest: metrics.and_then(|m| m.eval_accuracy_log_likelihood),
                greedy_initial: metrics.and_then(|m| m.initial_eval_accuracy),
            },
        }
    }

    /// Calls `emit` once per series: family, labels besides namespace and name, value.
    fn series(&self, mut emit: impl FnMut(Family, &[&str], f64)) {
        for p in PHASES {
            emit(Family::Phase, &[phase_name(p)], f64::from(u8::from(self.phase == Some(p))));
        }
        let optional = [
            (Family::Progress, self.progress_ratio),
            (Family::Loss, self.loss),
            (Family::TokensPerSecond, self.tokens_per_second),
            (Family::LastCheckpoint, self.last_checkpoint_seconds),
            (Family::Mfu, self.mfu),
            (Family::CheckpointEveryTokens, self.checkpoint_every_tokens.map(|t| t as f64)),
        ];
        for (family, value) in optional {
            if let Some(v) = value {
                emit(family, &[], v);
            }
        }
        emit(Family::Restarts, &[], f64::from(self.restarts));
        emit(Family::Rollbacks, &[], self.rollbacks as f64);
        emit(Family::Attempt, &[], f64::from(self.attempt));
        for c in &self.conditions {
            emit(Family::Condition, &[&c.type_, &c.reason, &c.status], 1.0);
        }
        let eval = &self.eval_accuracy;
        for (method, when, value) in [
            ("greedy", "latest", eval.greedy_latest),
            ("log_likelihood", "latest", eval.log_likelihood_latest),
            ("greedy", "initial", eval.greedy_initial),
        ] {
            if let Some(v) = value {
                emit(Family::EvalAccuracy, &[method, when], v);
            }
        }
    }
}

/// (namespace, name)
type RunKey = (String, String);

/// The per-run gauges, as a collector of the operator's registry.
#[derive(Clone)]
struct RunGauges {
    descs: Arc<Vec<Desc>>,
    runs: Arc<Mutex<HashMap<RunKey, RunSample>>>,
}

impl RunGauges {
    fn new() -> Result<RunGauges, prometheus::Error> {
        let descs = Family::ALL
            .iter()
            .map(|f| {
                let labels = ["namespace", "name"].iter().chain(f.labels()).map(|l| l.to_string()).collect();
                Desc::new(f.name().into(), f.help().into(), labels, HashMap::new())
            })
            .collect::<Result<_, _>>()?;
        Ok(RunGauges { descs: Arc::new(descs), runs: Arc::default() })
    }
}

impl Collector for RunGauges {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut families: BTreeMap<Family, MetricFamily> = Family::ALL
            .iter()
            .map(|&f| {
                let mut mf = MetricFamily::default();
                mf.set_name(f.name().into());
                mf.set_help(f.help().into());
                mf.set_field_type(MetricType::GAUGE);
                (f, mf)
            })
            .collect();
        let runs = self.runs.lock().expect("metrics lock");
        for ((ns, name), sample) in runs.iter() {
            sample.series(|family, values, value| {
                let mut labels: Vec<LabelPair> = ["namespace", "name"]
                    .iter()
                    .chain(family.labels())
                    .zip([ns.as_str(), name.as_str()].iter().chain(values))
                    .map(|(label, value)| {
                        let mut pair = LabelPair::default();
                        pair.set_name(label.to_string());
                        pair.set_value(value.to_string());
                        pair
                    })
                    .collect();
                // The text format lists labels by name, as prometheus-rs' own vectors do.
                labels.sort_by(|a, b| a.name().cmp(b.name()));
                let mut gauge = Gauge::default();
                gauge.set_value(value);
                let mut metric = Metric::from_label(labels);
                metric.set_gauge(gauge);
                if let Some(mf) = families.get_mut(&family) {
                    mf.mut_metric().push(metric);
                }
            });
        }
        families.into_values().collect()
    }
}

pub struct Metrics {
    registry: Registry,
    reconciles: IntCounterVec,
    reconcile_seconds: HistogramVec,
    reads: IntCounterVec,
    leading: IntGaugeVec,
    runs: RunGauges,
}

impl Metrics {
    pub fn new() -> Result<Metrics, prometheus::Error> {
        let m = Metrics {
            registry: Registry::new(),
            reconciles: IntCounterVec::new(
                Opts::new("trainingrun_reconcile_total", "Reconciles of TrainingRuns by result."),
                &["result"],
            )?,
            reconcile_seconds: HistogramVec::new(
                HistogramOpts::new("trainingrun_reconcile_duration_seconds", "Duration of one reconcile by result.")
                    .buckets(vec![0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0]),
                &["result"],
            )?,
            reads: IntCounterVec::new(
                Opts::new(
                    "trainingrun_reconcile_reads_total",
                    "Reconciles of TrainingRuns by where they read the run and its children: the watches' caches, the API, or nowhere yet (deferred until a store shows the operator's last write).",
                ),
                &["source"],
            )?,
            // controller-runtime's name, so dashboards built for other operators apply.
            leading: IntGaugeVec::new(
                Opts::new("leader_election_master_status", "1 while this replica holds the leader Lease, else 0."),
                &["name"],
            )?,
            runs: RunGauges::new()?,
        };
        m.registry.register(Box::new(m.reconciles.clone()))?;
        m.registry.register(Box::new(m.reconcile_seconds.clone()))?;
        m.registry.register(Box::new(m.reads.clone()))?;
        m.registry.register(Box::new(m.leading.clone()))?;
        m.registry.register(Box::new(m.runs.clone()))?;
        Ok(m)
    }

    /// Where a reconcile read: the caches, the API, or nowhere yet (deferred).
    pub fn read_from(&self, reading: crate::cache::Reading) {
        self.reads.with_label_values(&[reading.label()]).inc();
    }

    pub fn reconciled(&self, ok: bool, seconds: f64) {
        let result = if ok { "success" } else { "error" };
        self.reconciles.with_label_values(&[result]).inc();
        self.reconcile_seconds.with_label_values(&[result]).observe(seconds);
    }

    /// Whether this replica holds Lease `lease`: a standby's `/metrics` says so rather
    /// than being empty.
    pub fn set_leading(&self, lease: &str, leading: bool) {
        self.leading.with_label_values(&[lease]).set(i64::from(leading));
    }

    /// Sets every per-run gauge from the run's status; `checkpoint_every_tokens` comes
    /// from the resolved spec (absent when it does not resolve).
    pub fn observe_run(&self, ns: &str, name: &str, s: &TrainingRunStatus, checkpoint_every_tokens: Option<u64>) {
        let sample = RunSample::new(s, checkpoint_every_tokens);
        self.runs.runs.lock().expect("metrics lock").insert((ns.to_string(), name.to_string()), sample);
    }

    /// Drops every series of a deleted run.
    pub fn forget_run(&self, ns: &str, name: &str) {
        self.runs.runs.lock().expect("metrics lock").remove(&(ns.to_string(), name.to_string()));
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

    #[test]
    fn a_standby_says_it_is_one_and_the_leader_that_it_leads() {
        let m = Metrics::new().unwrap();
        m.set_leading("trainingrun-operator", false);
        let text = m.render();
        assert!(text.contains(r#"leader_election_master_status{name="trainingrun-operator"} 0"#), "{text}");
        m.set_leading("trainingrun-operator", true);
        let text = m.render();
        assert!(text.contains(r#"leader_election_master_status{name="trainingrun-operator"} 1"#), "{text}");
    }

    #[test]
    fn one_run_exports_exactly_these_series() {
        let m = Metrics::new().unwrap();
        assert!(!m.render().contains("trainingrun_phase"), "no run, no per-run series");
        let s = TrainingRunStatus {
            phase: Some(RunPhase::Pending),
            attempt: 1,
            conditions: vec![cond("Ready", "Waiting", "False"), cond("Ready", "Waiting", "False")],
            ..Default::default()
        };
        m.observe_run("ml", "a", &s, None);
        let text = m.render();
        let per_run: Vec<&str> = text.lines().filter(|l| l.contains(r#"name="a""#)).collect();
        assert_eq!(
            per_run,
            [
                r#"trainingrun_attempt{name="a",namespace="ml"} 1"#,
                r#"trainingrun_condition{name="a",namespace="ml",reason="Waiting",status="False",type="Ready"} 1"#,
                r#"trainingrun_phase{name="a",namespace="ml",phase="Failed"} 0"#,
                r#"trainingrun_phase{name="a",namespace="ml",phase="Pending"} 1"#,
                r#"trainingrun_phase{name="a",namespace="ml",phase="Restarting"} 0"#,
                r#"trainingrun_phase{name="a",namespace="ml",phase="Running"} 0"#,
                r#"trainingrun_phase{name="a",namespace="ml",phase="Succeeded"} 0"#,
                r#"trainingrun_phase{name="a",namespace="ml",phase="Suspended"} 0"#,
                r#"trainingrun_phase{name="a",namespace="ml",phase="Waiting"} 0"#,
                r#"trainingrun_restarts{name="a",namespace="ml"} 0"#,
                r#"trainingrun_rollbacks{name="a",namespace="ml"} 0"#,
            ]
        );
        for family in ["trainingrun_phase", "trainingrun_condition", "trainingrun_attempt"] {
            assert!(text.contains(&format!("# TYPE {family} gauge")), "{text}");
        }
        // A second run sorts with the first within each family.
        m.observe_run("ml", "b", &TrainingRunStatus { phase: Some(RunPhase::Running), ..s.clone() }, None);
        let text = m.render();
        let attempts: Vec<&str> = text.lines().filter(|l| l.starts_with("trainingrun_attempt{")).collect();
        assert_eq!(
            attempts,
            [r#"trainingrun_attempt{name="a",namespace="ml"} 1"#, r#"trainingrun_attempt{name="b",namespace="ml"} 1"#]
        );
        m.forget_run("ml", "a");
        assert!(!m.render().contains(r#"name="a""#));
        assert!(m.render().contains(r#"trainingrun_phase{name="b",namespace="ml",phase="Running"} 1"#));
    }
}
