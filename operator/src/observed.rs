//! What a reconcile observed of a run's world, as plain data: the observe step fills it
//! in (the I/O, in `observe`), and the pure decision reads it.

use std::net::IpAddr;

use crds::contract::TrainerStatus;
use crds::types::RunPhase;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use crate::failure::completion_index;
use crate::resources::{ATTEMPT_LABEL, QueuedWorkload};

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
    /// The current attempt's pods' links, when they were timed in this reconcile (with
    /// rank 0's answer, several nodes).
    pub links: Option<Vec<LinkProbe>>,
    /// The Kueue Workload of the current attempt's Job, for a run with `queueName`
    /// (none before Kueue creates it, or where Kueue is not installed).
    pub workload: Option<QueuedWorkload>,
}

/// One pod's network link, timed from the operator's seat: what the slow-link policy
/// reads.
#[derive(Clone, Debug, PartialEq)]
pub struct LinkProbe {
    pub node_rank: u32,
    pub pod: String,
    pub node: Option<String>,
    /// Seconds to fetch the link probe, or the timeout when it did not arrive by then.
    pub seconds: f64,
}

/// The current attempt's running pods with an address, by node rank: whose links are
/// timed.
pub fn link_targets(obs: &Observed, attempt: u32) -> Vec<(u32, &Pod, IpAddr)> {
    let mut targets: Vec<_> = obs
        .pods
        .iter()
        .filter(|p| {
            p.labels().get(ATTEMPT_LABEL) == Some(&attempt.to_string())
                && p.metadata.deletion_timestamp.is_none()
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        })
        .filter_map(|p| {
            let ip = p.status.as_ref()?.pod_ip.as_deref()?.parse().ok()?;
            Some((completion_index(p)?, p, ip))
        })
        .collect();
    targets.sort_by_key(|t| t.0);
    targets
}

/// Whether rank 0 of `attempt` is running, so that its `/status` can answer.
pub fn rank0_running(obs: &Observed, attempt: u32) -> bool {
    obs.pods.iter().any(|p| {
        p.labels().get(ATTEMPT_LABEL) == Some(&attempt.to_string())
            && completion_index(p) == Some(0)
            && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
    })
}
