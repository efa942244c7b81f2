//! What a reconcile decides: the run's new status, the children to create, delete or
//! suspend, and the events to emit; and the outcome (phase, reason, message) each
//! policy reaches before it becomes status.

use crds::types::{RunPhase, TrainingRunStatus};

/// An event to emit on the run.
#[derive(Clone, Debug, PartialEq)]
pub struct Note {
    pub warning: bool,
    pub reason: String,
    pub message: String,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decision {
    pub status: TrainingRunStatus,
    /// Create the Job of `status.attempt`. That is always the attempt the reconcile
    /// started with (a restart's Job is created by a later reconcile), so the ConfigMap
    /// applied before deciding already holds it.
    pub create_job: bool,
    /// Jobs of earlier attempts (or the failed current one) to delete with their pods.
    pub delete_jobs: Vec<String>,
    /// Pods no live Job owns (their Job was deleted with orphan propagation): they
    /// would hold their hostnames and GPUs forever.
    pub delete_pods: Vec<String>,
    /// Set `spec.suspend` of the current Job.
    pub suspend_job: Option<bool>,
    /// Set `spec.active` of the current Job's Kueue Workload: how a queued run is
    /// suspended and resumed.
    pub workload_active: Option<bool>,
    pub notes: Vec<Note>,
}

/// Phase, reason and message of the run, before they become status and conditions.
pub(super) struct Outcome {
    pub(super) phase: RunPhase,
    pub(super) reason: String,
    pub(super) message: String,
}

impl Outcome {
    pub(super) fn new(phase: RunPhase, reason: impl Into<String>, message: impl Into<String>) -> Outcome {
        Outcome { phase, reason: reason.into(), message: message.into() }
    }
}
