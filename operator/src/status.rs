//! Status, pure parts: conditions that keep their transition times, progress and
//! ETA from rank 0's report, and what counts as a change worth writing at once.

use crds::RunConfig;
use crds::contract::{RunReason, TrainerStatus};
use crds::types::{Progress, RunPhase, TrainingRunStatus};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Every condition, written from the first reconcile on.
pub const CONDITION_TYPES: [&str; 7] =
    ["Accepted", "Running", "Restarting", "Succeeded", "Failed", "Stalled", "Suspended"];

/// The conditions of failure policies, after those, on the runs they apply to: GRPO's
/// NoLearningSignal, RolledBack under `onNaN: rollback`, Straggler with several ranks.
pub const POLICY_CONDITION_TYPES: [&str; 3] = [NO_LEARNING_SIGNAL, ROLLED_BACK, STRAGGLER];
pub const NO_LEARNING_SIGNAL: &str = "NoLearningSignal";
pub const ROLLED_BACK: &str = "RolledBack";
pub const STRAGGLER: &str = "Straggler";
/// On runs with `spec.queueName`, last: whether the Job waits for Kueue to admit it.
pub const QUEUED: &str = "Queued";

/// One condition as the pipeline decided it.
#[derive(Clone, Debug, PartialEq)]
pub struct Cond {
    pub type_: &'static str,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

/// The new condition list: `lastTransitionTime` moves only when a status flips.
pub fn conditions(old: &[Condition], new: &[Cond], generation: Option<i64>, now: Timestamp) -> Vec<Condition> {
    new.iter()
        .map(|c| {
            let status = if c.status { "True" } else { "False" };
            let since =
                old.iter().find(|o| o.type_ == c.type_ && o.status == status).map(|o| o.last_transition_time.clone());
            Condition {
                type_: c.type_.into(),
                status: status.into(),
                reason: c.reason.clone(),
                message: c.message.clone(),
                observed_generation: generation,
                last_transition_time: since.unwrap_or(Time(now)),
            }
        })
        .collect()
}

pub fn condition<'a>(status: &'a TrainingRunStatus, type_: &str) -> Option<&'a Condition> {
    status.conditions.iter().find(|c| c.type_ == type_)
}

/// Progress at the start: nothing trained yet.
pub fn initial_progress(cfg: &RunConfig) -> Progress {
    Progress {
        tokens: 0,
        total_tokens: cfg.schedule.total_tokens,
        step: 0,
        total_steps: cfg.schedule.total_steps,
        percent: 0.0,
        eta_seconds: None,
        eta: None,
        display: Some("0.0%".into()),
        last_progress_time: None,
    }
}

/// "3h12m", "4m05s", "2d3h".
pub fn short_duration(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match () {
        _ if d > 0 => format!("{d}d{h}h"),
        _ if h > 0 => format!("{h}h{m:02}m"),
        _ if m > 0 => format!("{m}m{s:02}s"),
        _ => format!("{s}s"),
    }
}

/// Copies rank 0's report into status: progress (with ETA), metrics and the last checkpoint.
pub fn apply_report(status: &mut TrainingRunStatus, cfg: &RunConfig, t: &TrainerStatus) {
    let p = status.progress.get_or_insert_with(|| initial_progress(cfg));
    p.tokens = t.tokens;
    p.step = t.step;
    p.total_tokens = cfg.schedule.total_tokens;
    p.total_steps = cfg.schedule.total_steps;
    let fraction = if p.total_tokens == 0 { 0.0 } else { (t.tokens as f64 / p.total_tokens as f64).min(1.0) };
    p.percent = (fraction * 1000.0).round() / 10.0;
    p.display = Some(format!("{:.1}%", p.percent));
    p.eta_seconds = t
        .metrics
        .tokens_per_second
        .filter(|tps| *tps > 0)
        .map(|tps| p.total_tokens.saturating_sub(t.tokens).div_ceil(tps));
    p.eta = p.eta_seconds.map(short_duration);
    status.metrics = Some(t.metrics.clone());
    if t.best_checkpoint.is_some() {
        status.best_checkpoint = t.best_checkpoint.clone();
    }
    if t.last_checkpoint.is_some() {
        status.last_checkpoint = t.last_checkpoint.clone();
    }
}

/// Marks the run complete: all tokens trained.
pub fn complete_progress(status: &mut TrainingRunStatus, cfg: &RunConfig) {
    let p = status.progress.get_or_insert_with(|| initial_progress(cfg));
    p.tokens = cfg.schedule.total_tokens;
    p.step = cfg.schedule.total_steps;
    p.percent = 100.0;
    p.display = Some("100.0%".into());
    p.eta_seconds = None;
    p.eta = None;
}

/// Whether `new` differs from `old` in more than progress and metrics, which are
/// written at a bounded rate.
pub fn significant_change(old: &TrainingRunStatus, new: &TrainingRunStatus) -> bool {
    let strip = |s: &TrainingRunStatus| TrainingRunStatus { progress: None, metrics: None, ..s.clone() };
    strip(old) != strip(new)
}

pub fn is_terminal(status: &TrainingRunStatus) -> bool {
    match status.phase {
        Some(RunPhase::Succeeded) => true,
        // A spec that failed validation may be fixed.
        Some(RunPhase::Failed) => status.reason.as_deref() != Some(RunReason::InvalidSpec.as_str()),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::testing::{GPU_SPEC, run};

    fn t(s: &str) -> Timestamp {
        format!("2026-01-01T{s}Z").parse().unwrap()
    }

    fn cond(type_: &'static str, status: bool, reason: &str) -> Cond {
        Cond { type_, status, reason: reason.into(), message: String::new() }
    }

    #[test]
    fn transition_time_moves_only_when_status_flips() {
        let first = conditions(&[], &[cond("Running", false, "Pending")], Some(1), t("00:00:00"));
        assert_eq!(first[0].last_transition_time.0, t("00:00:00"));
        let same = conditions(&first, &[cond("Running", false, "PodsPending")], Some(2), t("00:05:00"));
        assert_eq!(same[0].last_transition_time.0, t("00:00:00"), "reason changed, status did not");
        assert_eq!((same[0].reason.as_str(), same[0].observed_generation), ("PodsPending", Some(2)));
        let flipped = conditions(&same, &[cond("Running", true, "Training")], Some(2), t("00:10:00"));
        assert_eq!(flipped[0].last_transition_time.0, t("00:10:00"));
        assert_eq!(flipped[0].status, "True");
    }

    #[test]
    fn report_sets_progress_eta_and_metrics() {
        let cfg = crds::resolve(&run(GPU_SPEC)).unwrap();
        let mut s = TrainingRunStatus::default();
        let total = cfg.schedule.total_tokens;
        let report = TrainerStatus {
            phase: crds::contract::TrainerPhase::Training,
            attempt: 1,
            step: 61,
            total_steps: cfg.schedule.total_steps,
            tokens: total / 4,
            total_tokens: total,
            metrics: crds::types::RunMetrics { loss: Some(2.5), tokens_per_second: Some(1000), ..Default::default() },
            last_checkpoint: Some(crds::types::CheckpointRef {
                step: 50,
                tokens: 1,
                uri: "/checkpoints/step-00000050".into(),
                time: None,
                val_loss: Some(3.5),
            }),
            best_checkpoint: Some(crds::types::CheckpointRef {
                step: 40,
                uri: "/checkpoints/step-00000040".into(),
                val_loss: Some(3.25),
                ..Default::default()
            }),
            tokens_by_source: Default::default(),
            ranks: Vec::new(),
        };
        apply_report(&mut s, &cfg, &report);
        let p = s.progress.clone().unwrap();
        assert_eq!((p.step, p.percent, p.display.as_deref()), (61, 25.0, Some("25.0%")));
        assert_eq!(p.eta_seconds, Some((total - total / 4).div_ceil(1000)));
        assert_eq!(s.metrics.unwrap().loss, Some(2.5));
        assert_eq!(s.last_checkpoint.unwrap().step, 50);
        let best = s.best_checkpoint.unwrap();
        assert_eq!((best.step, best.val_loss), (40, Some(3.25)));
        assert_eq!(short_duration(3 * 3600 + 12 * 60 + 5), "3h12m");
        assert_eq!(short_duration(245), "4m05s");
        assert_eq!(short_duration(2 * 86400 + 3 * 3600), "2d3h");
    }

    #[test]
    fn progress_alone_is_not_significant() {
        let old = TrainingRunStatus { phase: Some(RunPhase::Running), ..Default::default() };
        let mut new = old.clone();
        new.progress = Some(Progress { step: 9, ..Default::default() });
        assert!(!significant_change(&old, &new));
        new.restarts = 1;
        assert!(significant_change(&old, &new));
    }
}
