//! Each failed pod's cause, and which pod's failure the run reports: the cause of a
//! collective timeout rather than the symptom.

use crds::RunConfig;
use crds::contract::{ExitReport, FailureReason, RunReason};
use crds::rollback::NonFinite;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;

use super::hints::hint;
use super::lost::left_on_lost_node;
use super::pods::{cfg_memory_limit, completion_index, condition, last_line, phase, pod_name, terminated};
use crate::clock::seconds_between;
use crate::settings::Settings;

/// How a pod's failure bears on the run.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Kind {
    Fatal,
    Disruption,
    Retriable,
}

/// One pod's failure, as the run's verdict weighs it.
#[derive(Clone, Debug)]
pub(super) struct PodFailure {
    pub(super) kind: Kind,
    /// Exit 87: the trainer's own out-of-memory (not a host OOMKilled).
    pub(super) device_oom: bool,
    /// Exit 86: a non-finite step.
    pub(super) non_finite: Option<NonFinite>,
    pub(super) reason: String,
    pub(super) message: String,
    pub(super) at: Option<Timestamp>,
}

/// What `pod`'s state says went wrong with it, if anything.
pub(super) fn classify_pod(pod: &Pod, cfg: &RunConfig, now: Timestamp, settings: &Settings) -> Option<PodFailure> {
    let name = pod_name(pod);
    let rank = completion_index(pod).map_or(String::new(), |i| format!(" (node rank {i})"));
    if let Some(c) = condition(pod, "DisruptionTarget").filter(|c| c.status == "True") {
        let why = c.reason.clone().unwrap_or_else(|| "Disrupted".into());
        let detail = c.message.as_deref().map_or(String::new(), |m| format!(": {m}"));
        return Some(PodFailure {
            device_oom: false,
            non_finite: None,
            kind: Kind::Disruption,
            reason: RunReason::Disruption.into(),
            message: format!("pod {name}{rank} was disrupted ({why}{detail})"),
            at: c.last_transition_time.as_ref().map(|t| t.0),
        });
    }
    let status = pod.status.as_ref();
    if phase(pod) == "Failed" && status.and_then(|s| s.reason.as_deref()) == Some("Evicted") {
        let detail = status.and_then(|s| s.message.clone()).unwrap_or_default();
        return Some(PodFailure {
            device_oom: false,
            non_finite: None,
            kind: Kind::Disruption,
            reason: RunReason::Disruption.into(),
            message: format!("pod {name}{rank} was evicted: {detail}"),
            at: None,
        });
    }
    let term = terminated(pod).filter(|t| t.exit_code != 0);
    if phase(pod) != "Failed" && term.is_none() {
        // A pod on a lost node stays Terminating forever.
        let deleted = pod.metadata.deletion_timestamp.as_ref()?.0;
        return (left_on_lost_node(pod, now, settings) && phase(pod) != "Succeeded").then(|| PodFailure {
            device_oom: false,
            non_finite: None,
            kind: Kind::Disruption,
            reason: RunReason::Disruption.into(),
            message: format!("pod {name}{rank} is stuck terminating; its node is lost"),
            at: Some(deleted),
        });
    }
    let Some(t) = term else {
        let detail = status.and_then(|s| s.message.clone()).unwrap_or_else(|| "no container status".into());
        return Some(PodFailure {
            device_oom: false,
            non_finite: None,
            kind: Kind::Retriable,
            reason: RunReason::PodFailed.into(),
            message: format!("pod {name}{rank} failed: {detail}"),
            at: None,
        });
    };
    let at = t.finished_at.as_ref().map(|f| f.0);
    if t.reason.as_deref() == Some("OOMKilled") {
        let limit = cfg_memory_limit(pod).map_or("no memory limit".into(), |l| format!("memory limit {l}"));
        return Some(PodFailure {
            device_oom: false,
            non_finite: None,
            kind: Kind::Fatal,
            reason: FailureReason::OutOfMemory.as_str().into(),
            message: format!(
                "pod {name}{rank} was OOMKilled: it ran out of host memory ({limit}); raise spec.topology.resources.limits.memory or lower spec.batch.microBatch (now {})",
                cfg.batch.micro_batch
            ),
            at,
        });
    }
    let text = t.message.clone().unwrap_or_default();
    let report = ExitReport::parse(&text);
    if let Some(reason) = FailureReason::from_exit_code(t.exit_code) {
        let (step, detail, samples) = match &report {
            Some(ExitReport::Failure(m)) => (m.step, m.detail.clone(), m.samples),
            _ => (None, last_line(&text), None),
        };
        let at_step = step.map_or(String::new(), |s| format!(" at step {s}"));
        let message = format!("{}{at_step} on pod {name}{rank}: {detail}; {}", reason.as_str(), hint(reason, cfg));
        let kind = if reason.retriable() { Kind::Retriable } else { Kind::Fatal };
        let device_oom = reason == FailureReason::OutOfMemory;
        let non_finite = (reason == FailureReason::NaNLoss).then_some(NonFinite { step, samples });
        return Some(PodFailure { kind, device_oom, non_finite, reason: reason.as_str().into(), message, at });
    }
    let signal = match t.exit_code {
        134 => " (SIGABRT)",
        137 => " (SIGKILL)",
        143 => " (SIGTERM)",
        139 => " (SIGSEGV)",
        _ => "",
    };
    Some(PodFailure {
        device_oom: false,
        non_finite: None,
        kind: Kind::Retriable,
        reason: RunReason::PodFailed.into(),
        message: format!("pod {name}{rank} exited with code {}{signal}: {}", t.exit_code, last_line(&text)),
        at,
    })
}

/// A peer whose failure finished within this many seconds of a collective timeout
/// caused it (`finishedAt` has one-second resolution, so they often tie).
pub(super) const SYMPTOM_WINDOW_SECS: u64 = 10;

/// The failure to report for a restart: `first`, unless it is a collective timeout
/// (the symptom on the ranks left waiting) and another pod failed for another reason
/// within moments of it (the cause: a crash, a killed process).
pub(super) fn cause_of<'f>(first: &'f PodFailure, failures: &'f [PodFailure]) -> &'f PodFailure {
    if first.reason != FailureReason::CollectiveTimeout.as_str() {
        return first;
    }
    let near = |at: Option<Timestamp>| match (first.at, at) {
        (Some(a), Some(b)) => seconds_between(a.min(b), a.max(b)) <= SYMPTOM_WINDOW_SECS,
        _ => false,
    };
    failures.iter().find(|f| f.kind == Kind::Retriable && f.reason != first.reason && near(f.at)).unwrap_or(first)
}

/// Whether `f` is a collective timeout with no cause in sight yet, while other pods
/// are still exiting: the rank that broke the collective is often the last to leave
/// (a launcher stops its workers before it exits), so its fatal reason would be lost
/// to a restart. Bounded by the symptom window, so a hung peer still restarts.
pub(super) fn awaiting_cause(f: &PodFailure, pods: &[Pod], now: Timestamp) -> bool {
    let exiting = pods.iter().any(|p| terminated(p).is_none() && !matches!(phase(p), "Succeeded" | "Failed"));
    f.reason == FailureReason::CollectiveTimeout.as_str()
        && exiting
        && f.at.is_some_and(|at| now <= at || seconds_between(at, now) <= SYMPTOM_WINDOW_SECS)
}
