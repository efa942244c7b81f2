//! What a reconcile observed of a run's world, as plain data: `reconcile::gather` fills
//! it in (the I/O), and the pure plan (`decide::plan`) reads it.

use std::net::IpAddr;

use crds::contract::TrainerStatus;
use crds::types::RunPhase;
use crds::{InvalidSpec, RunConfig, TrainingRun};
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use crate::change::Change;
use crate::failure::completion_index;
use crate::resources::{ATTEMPT_LABEL, QueuedWorkload};

/// Everything one reconcile of a run read, in one place.
#[derive(Clone, Debug)]
pub struct Observed {
    /// The live run (the reflector's copy may lag the operator's own status writes),
    /// with its TrainingDatasets' URIs in place of their names, or placeholders while
    /// it waits for them.
    pub run: TrainingRun,
    pub datasets: Datasets,
    /// What its attempts run under; not read for a run that failed.
    pub accepted: Accepted,
    /// What the config its attempts run under is, from the spec, `accepted` and
    /// `datasets` (`decide::admission`): what else is read depends on it.
    pub admission: Admission,
    /// The applied-hashes of the run's Service and NetworkPolicy (`None`: absent, or
    /// not read because the run has ended).
    pub service_hash: Option<String>,
    pub network_policy_hash: Option<String>,
    /// Its Jobs and pods, and what rank 0 said (empty once the run has ended).
    pub attempts: Attempts,
    /// What the operator remembered of the run, with this reconcile's poll.
    pub memory: Memory,
    /// What this reconcile's poll of rank 0 came to.
    pub poll: Poll,
}

impl Observed {
    /// What was read of a run before its attempts: nothing of them yet, no poll.
    pub fn new(run: TrainingRun, datasets: Datasets, accepted: Accepted, admission: Admission, memory: Memory) -> Self {
        Observed {
            run,
            datasets,
            accepted,
            admission,
            service_hash: None,
            network_policy_hash: None,
            attempts: Attempts::default(),
            memory,
            poll: Poll::NotAsked,
        }
    }
}

/// The TrainingDatasets a run's mix names.
#[derive(Clone, Debug, PartialEq)]
pub enum Datasets {
    /// It names none.
    Unnamed,
    /// Every one has a manifest, or the run has ended and waits for nothing.
    Ready,
    /// Why it waits for them.
    Waiting(String),
}

impl Datasets {
    pub fn waiting(&self) -> Option<&str> {
        match self {
            Datasets::Waiting(message) => Some(message),
            _ => None,
        }
    }
}

/// What the run's attempts run under: its ConfigMap's config, and its checkpoint
/// claim's access modes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Accepted {
    /// `None` before the ConfigMap exists (or when it does not parse, logged).
    pub config: Option<RunConfig>,
    /// `None` before the claim exists.
    pub claim: Option<Vec<String>>,
    /// The applied-hashes of the live ConfigMap and claim.
    pub configmap_hash: Option<String>,
    pub claim_hash: Option<String>,
}

/// The config a reconcile works under.
#[derive(Clone, Debug, PartialEq)]
pub enum Admission {
    /// The run waits for its TrainingDatasets (its spec resolves otherwise).
    Waiting(String),
    /// The spec does not resolve, and no accepted config runs.
    Invalid(InvalidSpec),
    /// `cfg`: the spec's config, or the accepted one when `change` is refused, with
    /// the current attempt; `change`: from the accepted config to the spec's.
    Admitted { cfg: Box<RunConfig>, change: Change },
}

/// What the operator remembers of a run between reconciles, in its memory only.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Memory {
    pub last_poll: Option<Timestamp>,
    pub last_write: Option<Timestamp>,
    /// The last Warning event about a refused answer of rank 0's.
    pub last_refusal_event: Option<Timestamp>,
}

/// Why a poll of rank 0 brought no document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PollError {
    /// No answer in time, or an HTTP error: usual while rank 0 starts or restarts.
    Unanswered(String),
    /// An answer the operator will not use: too large, not a status document, or one
    /// no trainer of the run could give.
    Refused(String),
}

impl std::fmt::Display for PollError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PollError::Unanswered(m) | PollError::Refused(m) => f.write_str(m),
        }
    }
}

/// What a poll of rank 0 came to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Poll {
    /// Not due, or rank 0 of the attempt is not running: nothing asked.
    #[default]
    NotAsked,
    /// The document is in `Attempts::trainer`.
    Answered,
    Failed(PollError),
}

impl Poll {
    pub fn asked(&self) -> bool {
        *self != Poll::NotAsked
    }
}

/// State of the run named by `initFrom.trainingRun`.
#[derive(Clone, Debug, PartialEq)]
pub enum InitRun {
    Missing,
    Phase(Option<RunPhase>),
}

/// The run's attempts as the cluster has them, and what rank 0 of the current one said.
#[derive(Clone, Debug, Default)]
pub struct Attempts {
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
pub fn link_targets(obs: &Attempts, attempt: u32) -> Vec<(u32, &Pod, IpAddr)> {
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
pub fn rank0_running(obs: &Attempts, attempt: u32) -> bool {
    obs.pods.iter().any(|p| {
        p.labels().get(ATTEMPT_LABEL) == Some(&attempt.to_string())
            && completion_index(p) == Some(0)
            && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
    })
}
