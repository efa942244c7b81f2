//! What a reconcile observed of a run's world, as plain data: the observe step fills it
//! in (the I/O, in `observe`), and the pure decision reads it.

use crds::contract::TrainerStatus;
use crds::types::RunPhase;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use crate::failure::completion_index;
use crate::resources::ATTEMPT_LABEL;

/// State of the run named by `initFrom.trainingRun`.
#[derive(Clone, Debug, PartialEq)]
pub enum InitRun {
    Missing,
    Phase(Option<RunPhase>),
}

/// What the observe step saw.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    /// Every Job of the run, all attempts.
    pub jobs: Vec<Job>,
    /// Every pod of the run, all attempts.
    pub pods: Vec<Pod>,
    pub init_run: Option<InitRun>,
    /// Rank 0's `/status`, when it was polled in this reconcile.
    pub trainer: Option<TrainerStatus>,
}

/// Whether rank 0 of `attempt` is running, so that its `/status` can answer.
pub fn rank0_running(obs: &Observed, attempt: u32) -> bool {
    obs.pods.iter().any(|p| {
        p.labels().get(ATTEMPT_LABEL) == Some(&attempt.to_string())
            && completion_index(p) == Some(0)
            && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
    })
}
