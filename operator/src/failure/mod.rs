//! Failure policy, pure: what the current attempt's Job and pods say happened, as one
//! [`Verdict`].

mod cause;
mod hints;
mod lost;
mod pods;
mod stuck;

#[cfg(test)]
pub(crate) mod tests;

pub use lost::left_on_lost_node;
pub use pods::completion_index;

use crds::RunConfig;
use crds::contract::{ExitReport, FailureReason, RunReason, TrainerStatus};
use crds::rollback::NonFinite;
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;

use self::cause::{Kind, PodFailure, SYMPTOM_WINDOW_SECS, awaiting_cause, cause_of, classify_pod};
use self::hints::hint;
use self::pods::{exit_code_in, job_condition, phase, terminated_ok};
use self::stuck::stuck;
use crate::settings::Settings;

/// What the current attempt amounts to.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Every index completed. The report is rank 0's final status, when it left one.
    Succeeded { report: Option<Box<TrainerStatus>> },
    /// The run cannot succeed by retrying.
    Failed { reason: String, message: String },
    /// A trainer ran out of GPU memory (exit 87): fatal, unless the failure policy
    /// reduces the micro-batch.
    DeviceOutOfMemory { message: String },
    /// A step's loss or gradient norm was not finite (exit 86): fatal, unless the
    /// failure policy rolls back.
    NonFinite { message: String, at: NonFinite },
    /// Restart the gang from the last checkpoint; `counts` toward maxRestarts.
    Restart { reason: String, message: String, counts: bool },
    /// A rank reported a collective timeout and the pods that could name its cause
    /// are still exiting: wait a few seconds for them before restarting.
    AwaitingCause { message: String },
    /// Every node's pod is running.
    Running,
    /// Pods are missing or not yet running; `stuck` says why, once it has lasted
    /// longer than the pending timeout.
    Pending { stuck: Option<(String, String)> },
}

/// Classifies the current attempt. `pods` are that attempt's pods only. NaN loss, OOM,
/// bad config and bad data end the run; disruptions restart the gang without counting;
/// anything else restarts it and counts toward maxRestarts.
pub fn classify(job: &Job, pods: &[Pod], cfg: &RunConfig, now: Timestamp, settings: &Settings) -> Verdict {
    if job_condition(job, "Complete").is_some() || job_condition(job, "SuccessCriteriaMet").is_some() {
        let report = pods.iter().filter(|p| completion_index(p) == Some(0)).find_map(|p| {
            match ExitReport::parse(terminated_ok(p)?.message.as_deref()?) {
                Some(ExitReport::Success(s)) => Some(s),
                _ => None,
            }
        });
        return Verdict::Succeeded { report };
    }
    let mut failures: Vec<PodFailure> = pods.iter().filter_map(|p| classify_pod(p, cfg, now, settings)).collect();
    failures.sort_by_key(|f| f.at.unwrap_or(Timestamp::MAX));
    let first = |kind: Kind| failures.iter().find(|f| f.kind == kind);
    if let Some(f) = first(Kind::Fatal) {
        if f.device_oom {
            return Verdict::DeviceOutOfMemory { message: f.message.clone() };
        }
        if let Some(at) = &f.non_finite {
            return Verdict::NonFinite { message: f.message.clone(), at: *at };
        }
        return Verdict::Failed { reason: f.reason.clone(), message: f.message.clone() };
    }
    if let Some(f) = first(Kind::Disruption) {
        return Verdict::Restart { reason: f.reason.clone(), message: f.message.clone(), counts: false };
    }
    if let Some(f) = first(Kind::Retriable) {
        let f = cause_of(f, &failures);
        if awaiting_cause(f, pods, now) {
            return Verdict::AwaitingCause {
                message: format!(
                    "{}; waiting up to {SYMPTOM_WINDOW_SECS}s for the other pods' exit to name the cause",
                    f.message
                ),
            };
        }
        return Verdict::Restart { reason: f.reason.clone(), message: f.message.clone(), counts: true };
    }
    if let Some(c) = job_condition(job, "Failed").or_else(|| job_condition(job, "FailureTarget")) {
        // The pods are gone; the Job's condition is all that is left.
        let message = c.message.clone().unwrap_or_default();
        if let Some(reason) = exit_code_in(&message).and_then(FailureReason::from_exit_code).filter(|r| !r.retriable())
        {
            if reason == FailureReason::OutOfMemory {
                return Verdict::DeviceOutOfMemory { message: format!("{message}; {}", hint(reason, cfg)) };
            }
            if reason == FailureReason::NaNLoss {
                let message = format!("{message}; {}", hint(reason, cfg));
                return Verdict::NonFinite { message, at: NonFinite::default() };
            }
            return Verdict::Failed {
                reason: reason.as_str().into(),
                message: format!("{message}; {}", hint(reason, cfg)),
            };
        }
        let reason = c.reason.clone().unwrap_or_else(|| "JobFailed".into());
        return Verdict::Restart {
            reason: RunReason::JobFailed.into(),
            message: format!("Job failed ({reason}): {message}"),
            counts: true,
        };
    }
    let nodes = cfg.topology.nodes as usize;
    // A node that finished before the others is done, not pending: the Job is
    // Complete only once every index has succeeded.
    let mut running: Vec<u32> = pods
        .iter()
        .filter(|p| matches!(phase(p), "Running" | "Succeeded") && p.metadata.deletion_timestamp.is_none())
        .filter_map(completion_index)
        .collect();
    running.sort();
    running.dedup();
    if running.len() >= nodes {
        return Verdict::Running;
    }
    Verdict::Pending { stuck: pods.iter().filter(|p| phase(p) == "Pending").find_map(|p| stuck(p, now, settings)) }
}
