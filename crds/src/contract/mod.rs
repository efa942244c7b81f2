//! The contract between operator and trainer: environment, ports, paths, exit
//! codes with their termination message, and the rank-0 `/status` document; and
//! between the operator and `trainer prepare` ([`prepare`]).

pub mod prepare;

use serde::{Deserialize, Serialize};

use crate::types::{CheckpointRef, RunMetrics};

/// Rendezvous (c10d TCPStore) port on rank 0.
pub const RENDEZVOUS_PORT: u16 = 29500;
/// The least time a rank waits at the rendezvous for the rest of its gang. A gang's
/// pods start apart by however long their volumes take to mount and their images to
/// pull, which a short `collectiveTimeout` (set so that a dead peer is noticed soon)
/// must not turn into a restart; torchrun's join timeout plays the same part.
pub const RENDEZVOUS_JOIN_FLOOR_SECONDS: u64 = 300;
/// Rank 0's HTTP port: `/status`, `/metrics`, `/healthz`; every pod's, `/healthz` and
/// [`LINK_PROBE_PATH`].
pub const STATUS_PORT: u16 = 8080;
/// On every pod's status port: [`LINK_PROBE_BYTES`] bytes that the operator times to
/// measure the pod's network link from its own seat.
pub const LINK_PROBE_PATH: &str = "/link-probe";
/// Large enough that a slow link shows in the time (256 KiB take 0.2 ms at 10 Gbit/s,
/// 0.2 s at 10 Mbit/s), small enough to fetch from every pod at every status poll.
pub const LINK_PROBE_BYTES: usize = 256 * 1024;
/// A link is slow only when its probe takes longer than this as well as
/// `failurePolicy.stragglerFactor` × the other pods' median: below it, what varies is
/// the machines' scheduling, not the link.
pub const LINK_PROBE_FLOOR_SECONDS: f64 = 0.05;

/// Where the ConfigMap's `run.json` is mounted.
pub const CONFIG_PATH: &str = "/etc/trainingrun/run.json";
/// ConfigMap key holding the RunConfig JSON.
pub const CONFIG_KEY: &str = "run.json";
/// Checkpoint PVC mount.
pub const CHECKPOINT_MOUNT: &str = "/checkpoints";
/// Where initial weights are mounted read-only: an `initFrom.trainingRun` run's checkpoint
/// PVC at `INIT_MOUNT/<run>`, an `initFrom.uri` claim at `INIT_MOUNT`.
pub const INIT_MOUNT: &str = "/init";
/// Kubernetes' default termination message path.
pub const TERMINATION_LOG: &str = "/dev/termination-log";
/// Claims named by `pvc://claim/path` URIs (data, tokenizer, GRPO questions) are
/// mounted read-only at `PVC_MOUNT_ROOT/<claim>`.
pub const PVC_MOUNT_ROOT: &str = "/mnt/pvc";

/// Names of the corpora compiled into the trainer (`embedded:<name>`), in the
/// trainer's order.
pub const EMBEDDED_SOURCES: [&str; 4] = ["textbook", "facts", "arithmetic", "mcq"];
/// Embedded GRPO question sets: `mcq-rules` (questions that name their answer's position,
/// which a small model learns from reward alone) and `mcq` (the pretraining `mcq`
/// source's questions: those plus questions about the synthetic world).
pub const EMBEDDED_QUESTION_SETS: [&str; 2] = ["mcq-rules", "mcq"];

/// At most `max` bytes of `s`, cut at a character boundary, with `...` after a cut:
/// a quoted message in an event, a status field or a termination message.
pub fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}...", &s[..cut])
}

/// Where `pvc://claim/path` is inside a trainer pod.
pub fn pvc_path(claim: &str, path: &str) -> String {
    let path = path.trim_matches('/');
    if path.is_empty() { format!("{PVC_MOUNT_ROOT}/{claim}") } else { format!("{PVC_MOUNT_ROOT}/{claim}/{path}") }
}

pub mod env {
    pub const MASTER_ADDR: &str = "MASTER_ADDR";
    pub const MASTER_PORT: &str = "MASTER_PORT";
    pub const NNODES: &str = "NNODES";
    pub const NODE_RANK: &str = "NODE_RANK";
    pub const NPROC_PER_NODE: &str = "NPROC_PER_NODE";
    pub const RANK: &str = "RANK";
    pub const LOCAL_RANK: &str = "LOCAL_RANK";
    pub const WORLD_SIZE: &str = "WORLD_SIZE";
    pub const JOB_COMPLETION_INDEX: &str = "JOB_COMPLETION_INDEX";
    /// Path of the RunConfig JSON.
    pub const TRAINER_CONFIG: &str = "TRAINER_CONFIG";
    /// Path the trainer writes its termination message to.
    pub const TERMINATION_LOG: &str = "TRAINER_TERMINATION_LOG";
    pub const STATUS_PORT: &str = "TRAINER_STATUS_PORT";
    /// Overrides the RunConfig's attempt in `trainer run` and `trainer worker`. A pod
    /// takes its attempt from the ConfigMap alone; reserved so that `spec.env` cannot
    /// change it.
    pub const ATTEMPT: &str = "TRAINER_ATTEMPT";
    /// Tokenizer and corpus cache directory.
    pub const CACHE: &str = "TRAINER_CACHE";

    /// Set by the operator from the topology and the Job; `spec.env` may not override them.
    pub const RESERVED: &[&str] = &[
        MASTER_ADDR,
        MASTER_PORT,
        NNODES,
        NODE_RANK,
        NPROC_PER_NODE,
        RANK,
        LOCAL_RANK,
        WORLD_SIZE,
        JOB_COMPLETION_INDEX,
        TRAINER_CONFIG,
        TERMINATION_LOG,
        STATUS_PORT,
        ATTEMPT,
    ];
}

/// NCCL defaults from seed 000, set on every trainer pod; `spec.env` overrides them.
pub const NCCL_DEFAULTS: &[(&str, &str)] =
    &[("NCCL_IB_DISABLE", "0"), ("NCCL_NET_GDR_LEVEL", "5"), ("CUDA_DEVICE_MAX_CONNECTIONS", "1")];

/// Why a trainer exited non-zero. Each reason has its own exit code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
pub enum FailureReason {
    /// Loss or gradient norm became NaN or Inf.
    NaNLoss,
    /// CUDA out of memory.
    OutOfMemory,
    /// A collective or the rendezvous timed out: a peer died or the network failed.
    CollectiveTimeout,
    /// The RunConfig cannot run (bad values, missing backend).
    InvalidConfig,
    /// Data could not be read or is corrupt.
    DataError,
    /// A write found its file system full (ENOSPC) or over quota (EDQUOT): the
    /// checkpoint claim, the metrics log or the data cache. Retrying fills it again.
    StorageFull,
}

impl FailureReason {
    pub const ALL: [FailureReason; 6] = [
        FailureReason::NaNLoss,
        FailureReason::OutOfMemory,
        FailureReason::CollectiveTimeout,
        FailureReason::InvalidConfig,
        FailureReason::DataError,
        FailureReason::StorageFull,
    ];

    /// Exit codes stay clear of 1-2 (generic), 126-128 (shell) and 128+N (signals).
    pub const fn exit_code(self) -> i32 {
        match self {
            FailureReason::InvalidConfig => 78,
            FailureReason::DataError => 65,
            FailureReason::NaNLoss => 86,
            FailureReason::OutOfMemory => 87,
            FailureReason::CollectiveTimeout => 88,
            FailureReason::StorageFull => 89,
        }
    }

    pub fn from_exit_code(code: i32) -> Option<FailureReason> {
        Self::ALL.into_iter().find(|r| r.exit_code() == code)
    }

    /// Whether a gang restart from the last checkpoint can help.
    pub const fn retriable(self) -> bool {
        matches!(self, FailureReason::CollectiveTimeout)
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            FailureReason::NaNLoss => "NaNLoss",
            FailureReason::OutOfMemory => "OutOfMemory",
            FailureReason::CollectiveTimeout => "CollectiveTimeout",
            FailureReason::InvalidConfig => "InvalidConfig",
            FailureReason::DataError => "DataError",
            FailureReason::StorageFull => "StorageFull",
        }
    }
}

/// A GRPO step has no learning signal when at least this fraction of its prompt
/// groups got equal rewards for every completion.
pub const NO_SIGNAL_FRACTION: f64 = 0.9;

/// Why a run is where it is: `status.reason` and the reason of each of its conditions,
/// hence the `reason` label of `trainingrun_condition`. Alerts, dashboards and health
/// checks match on these names, so every reason the operator writes is one of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RunReason {
    /// The trainer exited with a [`FailureReason`]; the reason has its name.
    Trainer(FailureReason),
    /// The spec resolves (Accepted=True).
    Accepted,
    /// The spec does not resolve: Failed until it is fixed.
    InvalidSpec,
    /// Waiting for the run named by `initFrom.trainingRun` to succeed.
    WaitingForInitRun,
    /// Waiting for the TrainingDatasets its mix names to be Ready (and Waiting=True,
    /// naming them with their progress).
    WaitingForDataset,
    /// Waiting=False: every TrainingDataset the mix names is Ready.
    DatasetsReady,
    /// The Job waits for Kueue to admit it (and Queued=True, naming the LocalQueue).
    WaitingForQueue,
    /// Queued=False: Kueue admitted the run's Job (and it has not been evicted since).
    Admitted,
    /// Queued=False: the run's Job has not waited for Kueue (not yet created, or
    /// suspended by `spec.suspend` before it was admitted).
    NotQueued,
    /// A Job was created: the phase reason of a first attempt, and the event of each.
    JobCreated,
    /// The Job's pods are not all running yet.
    PodsPending,
    /// A pod cannot pull its image.
    ImagePullBackOff,
    /// A pod cannot be scheduled.
    Unschedulable,
    /// A pod's container cannot be configured (a missing Secret or ConfigMap key).
    CreateContainerConfigError,
    /// Every pod runs.
    Training,
    /// Every node's trainer finished.
    Completed,
    /// A restart whose cause is no longer known.
    Restarting,
    /// A pod was preempted, evicted or lost with its node; restarts without counting.
    Disruption,
    /// A pod failed without a trainer failure reason.
    PodFailed,
    /// The Job failed and its pods are gone.
    JobFailed,
    /// The step stopped advancing (restart with `onStall: restart`, and the event).
    Stalled,
    /// A counted failure with no restarts left.
    MaxRestartsExceeded,
    /// `spec.suspend` is set.
    Suspended,
    /// `spec.suspend` was cleared and the Job is resumed.
    Resuming,
    /// The Job was suspended by someone other than the operator.
    JobSuspended,
    /// Restarting=False on a later attempt.
    Resumed,
    /// Restarting=False on the first attempt.
    FirstAttempt,
    /// Succeeded=False.
    NotCompleted,
    /// Failed=False.
    NoFailure,
    /// Stalled=True.
    NoProgress,
    /// Stalled=False while running: the step advances.
    Progressing,
    /// Stalled=False when not running.
    NotRunning,
    /// Suspended=False.
    NotSuspended,
    /// The topology changed: the gang restarts at the new size (not counted).
    Resized,
    /// Another accepted change (the budget, a cadence, the sharding...): the gang
    /// restarts under it (not counted).
    Reconfigured,
    /// A change the run cannot take (Accepted=False); the running attempt goes on as
    /// it was.
    ChangeRefused,
    /// The current attempt's Job was deleted before it finished (by hand or by a TTL):
    /// a counted restart.
    JobDeleted,
    /// A trainer ran out of GPU memory and `failurePolicy.onOutOfMemory:
    /// reduceMicroBatch` restarts the gang at a smaller micro-batch (not counted).
    MicroBatchReduced,
    /// NoLearningSignal=True: GRPO's prompt groups have had equal rewards for
    /// `grpo.noSignalSteps` steps in a row.
    NoLearningSignal,
    /// NoLearningSignal=False: the rewards vary within groups.
    LearningSignal,
    /// A non-finite step with `failurePolicy.onNaN: rollback`: the gang restarts from
    /// the checkpoint before it (not counted), skipping its samples at a lowered
    /// learning rate; and RolledBack=True from then on.
    NaNRollback,
    /// RolledBack=False: the run never rolled back.
    NotRolledBack,
    /// Straggler=True: one rank's work per step stays over failurePolicy.stragglerFactor
    /// × the median rank's.
    Straggler,
    /// Straggler=False: the ranks keep pace (and the event when a straggler recovers).
    NoStraggler,
    /// Straggler=True: one pod's network link, timed by the operator, stays over
    /// failurePolicy.stragglerFactor × the other pods' median.
    SlowLink,
}

impl RunReason {
    /// The reasons that are the operator's own, not the trainer's.
    pub const OPERATOR: [RunReason; 44] = [
        RunReason::Accepted,
        RunReason::InvalidSpec,
        RunReason::WaitingForInitRun,
        RunReason::WaitingForDataset,
        RunReason::DatasetsReady,
        RunReason::WaitingForQueue,
        RunReason::Admitted,
        RunReason::NotQueued,
        RunReason::JobCreated,
        RunReason::PodsPending,
        RunReason::ImagePullBackOff,
        RunReason::Unschedulable,
        RunReason::CreateContainerConfigError,
        RunReason::Training,
        RunReason::Completed,
        RunReason::Restarting,
        RunReason::Disruption,
        RunReason::PodFailed,
        RunReason::JobFailed,
        RunReason::Stalled,
        RunReason::MaxRestartsExceeded,
        RunReason::Suspended,
        RunReason::Resuming,
        RunReason::JobSuspended,
        RunReason::Resumed,
        RunReason::FirstAttempt,
        RunReason::NotCompleted,
        RunReason::NoFailure,
        RunReason::NoProgress,
        RunReason::Progressing,
        RunReason::NotRunning,
        RunReason::NotSuspended,
        RunReason::Resized,
        RunReason::Reconfigured,
        RunReason::ChangeRefused,
        RunReason::JobDeleted,
        RunReason::MicroBatchReduced,
        RunReason::NoLearningSignal,
        RunReason::LearningSignal,
        RunReason::NaNRollback,
        RunReason::NotRolledBack,
        RunReason::Straggler,
        RunReason::NoStraggler,
        RunReason::SlowLink,
    ];

    /// Every reason: the trainer's failure reasons, then the operator's.
    pub fn all() -> impl Iterator<Item = RunReason> {
        FailureReason::ALL.into_iter().map(RunReason::Trainer).chain(Self::OPERATOR)
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            RunReason::Trainer(r) => r.as_str(),
            RunReason::Accepted => "Accepted",
            RunReason::InvalidSpec => "InvalidSpec",
            RunReason::WaitingForInitRun => "WaitingForInitRun",
            RunReason::WaitingForDataset => "WaitingForDataset",
            RunReason::DatasetsReady => "DatasetsReady",
            RunReason::WaitingForQueue => "WaitingForQueue",
            RunReason::Admitted => "Admitted",
            RunReason::NotQueued => "NotQueued",
            RunReason::JobCreated => "JobCreated",
            RunReason::PodsPending => "PodsPending",
            RunReason::ImagePullBackOff => "ImagePullBackOff",
            RunReason::Unschedulable => "Unschedulable",
            RunReason::CreateContainerConfigError => "CreateContainerConfigError",
            RunReason::Training => "Training",
            RunReason::Completed => "Completed",
            RunReason::Restarting => "Restarting",
            RunReason::Disruption => "Disruption",
            RunReason::PodFailed => "PodFailed",
            RunReason::JobFailed => "JobFailed",
            RunReason::Stalled => "Stalled",
            RunReason::MaxRestartsExceeded => "MaxRestartsExceeded",
            RunReason::Suspended => "Suspended",
            RunReason::Resuming => "Resuming",
            RunReason::JobSuspended => "JobSuspended",
            RunReason::Resumed => "Resumed",
            RunReason::FirstAttempt => "FirstAttempt",
            RunReason::NotCompleted => "NotCompleted",
            RunReason::NoFailure => "NoFailure",
            RunReason::NoProgress => "NoProgress",
            RunReason::Progressing => "Progressing",
            RunReason::NotRunning => "NotRunning",
            RunReason::NotSuspended => "NotSuspended",
            RunReason::Resized => "Resized",
            RunReason::Reconfigured => "Reconfigured",
            RunReason::ChangeRefused => "ChangeRefused",
            RunReason::JobDeleted => "JobDeleted",
            RunReason::MicroBatchReduced => "MicroBatchReduced",
            RunReason::NoLearningSignal => "NoLearningSignal",
            RunReason::LearningSignal => "LearningSignal",
            RunReason::NaNRollback => "NaNRollback",
            RunReason::NotRolledBack => "NotRolledBack",
            RunReason::Straggler => "Straggler",
            RunReason::NoStraggler => "NoStraggler",
            RunReason::SlowLink => "SlowLink",
        }
    }

    /// The reason of that name.
    pub fn parse(name: &str) -> Option<RunReason> {
        Self::all().find(|r| r.as_str() == name)
    }
}

impl From<FailureReason> for RunReason {
    fn from(r: FailureReason) -> RunReason {
        RunReason::Trainer(r)
    }
}

impl From<RunReason> for String {
    fn from(r: RunReason) -> String {
        r.as_str().into()
    }
}

impl std::fmt::Display for RunReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// JSON written to the termination-message file before a failing exit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TerminationMessage {
    pub reason: FailureReason,
    /// Optimizer step at the failure, if training had started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    pub detail: String,
    /// NaNLoss: the samples of the failing step, for a rollback to skip.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples: Option<FailedSamples>,
}

/// Where in the run's sample order (global sequences in pretraining, prompts in GRPO)
/// a non-finite step was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailedSamples {
    /// The failing step's first sample.
    pub from: u64,
    /// The sample after its last.
    pub to: u64,
    /// The position of the newest checkpoint before it (0: none).
    pub checkpoint: u64,
}

impl TerminationMessage {
    /// Kubernetes keeps at most 4096 bytes of a termination message.
    pub const MAX_BYTES: usize = 4096;

    /// The JSON, with `detail` shortened so the whole fits in [`Self::MAX_BYTES`].
    pub fn to_json(&self) -> String {
        let mut msg = self.clone();
        loop {
            let json = serde_json::to_string(&msg).expect("termination message serializes");
            if json.len() <= Self::MAX_BYTES || msg.detail.is_empty() {
                return json;
            }
            let keep = msg.detail.len().saturating_sub(json.len() - Self::MAX_BYTES + 3);
            let mut cut = keep.min(msg.detail.len());
            while !msg.detail.is_char_boundary(cut) {
                cut -= 1;
            }
            msg.detail.truncate(cut);
            msg.detail.push_str("...");
        }
    }

    pub fn parse(text: &str) -> Option<TerminationMessage> {
        serde_json::from_str(text.trim()).ok()
    }
}

/// What a trainer pod's termination message says: a [`TerminationMessage`] after a
/// failure, or the final [`TrainerStatus`] after success (so the operator learns
/// the last loss and checkpoint even if it never polled rank 0).
#[derive(Clone, Debug, PartialEq)]
pub enum ExitReport {
    Failure(TerminationMessage),
    Success(Box<TrainerStatus>),
}

impl ExitReport {
    pub fn parse(text: &str) -> Option<ExitReport> {
        if let Some(m) = TerminationMessage::parse(text) {
            return Some(ExitReport::Failure(m));
        }
        serde_json::from_str(text.trim()).ok().map(|s| ExitReport::Success(Box::new(s)))
    }
}

/// Phase reported by the trainer on `/status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TrainerPhase {
    Starting,
    Training,
    Evaluating,
    Checkpointing,
    Done,
    Failed,
}

/// Rank 0's `GET /status` document, which the operator copies into the run's status.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrainerStatus {
    pub phase: TrainerPhase,
    pub attempt: u32,
    pub step: u64,
    pub total_steps: u64,
    pub tokens: u64,
    pub total_tokens: u64,
    /// Loss, valLoss, tokensPerSecond, mfu, gradNorm and lr: the same fields the
    /// run's `status.metrics` shows.
    #[serde(flatten)]
    pub metrics: RunMetrics,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_checkpoint: Option<CheckpointRef>,
    /// The kept checkpoint with the lowest validation loss (`checkpoint.keepBest`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_checkpoint: Option<CheckpointRef>,
    /// Tokens trained on from each data source so far, by mix entry name: the weighted
    /// mix's exact counts.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub tokens_by_source: std::collections::BTreeMap<String, u64>,
    /// Every rank's time per step before the collectives, over the last sync interval
    /// (several ranks): what finds a straggler.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<RankTiming>,
}

/// One rank's seconds per optimizer step, averaged over a sync interval, measured
/// before the collectives (after them every rank looks as slow as the slowest).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RankTiming {
    pub rank: u32,
    /// Its own work: forward and backward (and GRPO's sampling), up to the wait for
    /// the gradient all-reduce.
    pub compute_seconds: f64,
    /// Waiting for the data loader.
    pub data_wait_seconds: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_are_distinct_and_round_trip() {
        let mut codes: Vec<i32> = FailureReason::ALL.iter().map(|r| r.exit_code()).collect();
        codes.sort();
        codes.dedup();
        assert_eq!(codes.len(), FailureReason::ALL.len());
        for r in FailureReason::ALL {
            assert_eq!(FailureReason::from_exit_code(r.exit_code()), Some(r));
            let c = r.exit_code();
            assert!(c > 2 && c < 126, "{c} collides with shell or signal codes");
        }
        assert_eq!(FailureReason::from_exit_code(1), None);
        assert_eq!(FailureReason::from_exit_code(137), None);
    }

    #[test]
    fn only_collective_timeouts_are_retriable() {
        let retriable: Vec<_> = FailureReason::ALL.into_iter().filter(|r| r.retriable()).collect();
        assert_eq!(retriable, vec![FailureReason::CollectiveTimeout]);
    }

    #[test]
    fn termination_message_round_trips_and_fits() {
        let m = TerminationMessage {
            reason: FailureReason::NaNLoss,
            step: Some(1200),
            detail: "loss=nan".into(),
            samples: None,
        };
        let json = m.to_json();
        assert_eq!(json, r#"{"reason":"NaNLoss","step":1200,"detail":"loss=nan"}"#);
        assert_eq!(TerminationMessage::parse(&json), Some(m));
        let long = TerminationMessage {
            reason: FailureReason::DataError,
            step: None,
            detail: "é".repeat(5000),
            samples: Some(FailedSamples { from: 96, to: 104, checkpoint: 80 }),
        };
        let json = long.to_json();
        assert!(json.len() <= TerminationMessage::MAX_BYTES, "{}", json.len());
        let parsed = TerminationMessage::parse(&json).unwrap();
        assert_eq!(parsed.reason, FailureReason::DataError);
        assert_eq!(parsed.samples, long.samples, "the samples survive the shortening");
        assert_eq!(TerminationMessage::parse("Traceback: ..."), None);
    }

    #[test]
    fn status_document_is_flat_json() {
        let s = TrainerStatus {
            phase: TrainerPhase::Training,
            attempt: 2,
            step: 10,
            total_steps: 100,
            tokens: 81920,
            total_tokens: 819200,
            metrics: RunMetrics { loss: Some(3.5), tokens_per_second: Some(4096), ..Default::default() },
            last_checkpoint: None,
            best_checkpoint: None,
            tokens_by_source: Default::default(),
            ranks: Vec::new(),
        };
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["loss"], 3.5);
        assert_eq!(v["tokensPerSecond"], 4096);
        assert_eq!(v["totalSteps"], 100);
        assert_eq!(serde_json::from_value::<TrainerStatus>(v).unwrap(), s);
    }

    #[test]
    fn exit_report_tells_failure_from_success() {
        let fail = TerminationMessage {
            reason: FailureReason::OutOfMemory,
            step: Some(3),
            detail: "CUDA out of memory".into(),
            samples: None,
        };
        assert_eq!(ExitReport::parse(&fail.to_json()), Some(ExitReport::Failure(fail)));
        let done = TrainerStatus {
            phase: TrainerPhase::Done,
            attempt: 1,
            step: 100,
            total_steps: 100,
            tokens: 800,
            total_tokens: 800,
            metrics: RunMetrics { loss: Some(1.5), ..Default::default() },
            last_checkpoint: None,
            best_checkpoint: None,
            tokens_by_source: Default::default(),
            ranks: Vec::new(),
        };
        let json = serde_json::to_string(&done).unwrap();
        assert_eq!(ExitReport::parse(&json), Some(ExitReport::Success(Box::new(done))));
        assert_eq!(ExitReport::parse("panicked at src/main.rs"), None);
    }

    #[test]
    fn pvc_paths() {
        assert_eq!(pvc_path("data", "/fineweb/"), "/mnt/pvc/data/fineweb");
        assert_eq!(pvc_path("data", ""), "/mnt/pvc/data");
    }

    #[test]
    fn run_reasons_have_distinct_names_that_parse_back() {
        let names: std::collections::BTreeSet<&str> = RunReason::all().map(RunReason::as_str).collect();
        assert_eq!(names.len(), FailureReason::ALL.len() + RunReason::OPERATOR.len());
        for r in RunReason::all() {
            assert_eq!(RunReason::parse(r.as_str()), Some(r));
            assert_eq!(r.to_string(), r.as_str());
        }
        assert!(RunReason::OPERATOR.iter().all(|r| !matches!(r, RunReason::Trainer(_))));
        assert_eq!(RunReason::parse("RestartLimitExceeded"), None);
    }

    #[test]
    fn reason_names_match_serde() {
        for r in FailureReason::ALL {
            assert_eq!(serde_json::to_value(r).unwrap(), serde_json::json!(r.as_str()));
        }
    }
}
