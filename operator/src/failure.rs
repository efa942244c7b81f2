//! Failure policy, pure: what the current attempt's Job and pods say happened.
//! NaN loss, OOM, bad config and bad data end the run; disruptions restart the gang
//! without counting; anything else restarts it and counts toward maxRestarts.

use crds::RunConfig;
use crds::contract::{ExitReport, FailureReason, RunReason, TrainerStatus};
use crds::rollback::NonFinite;
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ContainerStateTerminated, Pod};

use crate::clock::seconds_between;
use crate::resources::CONTAINER;
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

#[derive(Clone, Debug, PartialEq)]
enum Kind {
    Fatal,
    Disruption,
    Retriable,
}

#[derive(Clone, Debug)]
struct PodFailure {
    kind: Kind,
    /// Exit 87: the trainer's own out-of-memory (not a host OOMKilled).
    device_oom: bool,
    /// Exit 86: a non-finite step.
    non_finite: Option<NonFinite>,
    reason: String,
    message: String,
    at: Option<Timestamp>,
}

/// Completion index of an Indexed Job's pod.
pub fn completion_index(pod: &Pod) -> Option<u32> {
    const KEY: &str = "batch.kubernetes.io/job-completion-index";
    let m = &pod.metadata;
    m.annotations.as_ref().and_then(|a| a.get(KEY)).or_else(|| m.labels.as_ref().and_then(|l| l.get(KEY)))?.parse().ok()
}

fn pod_name(pod: &Pod) -> String {
    pod.metadata.name.clone().unwrap_or_default()
}

fn phase(pod: &Pod) -> &str {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending")
}

fn condition<'a>(pod: &'a Pod, type_: &str) -> Option<&'a k8s_openapi::api::core::v1::PodCondition> {
    pod.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == type_)
}

fn terminated(pod: &Pod) -> Option<&ContainerStateTerminated> {
    let status = pod.status.as_ref()?.container_statuses.as_ref()?.iter().find(|c| c.name == CONTAINER)?;
    status
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .or_else(|| status.last_state.as_ref()?.terminated.as_ref())
}

fn hint(reason: FailureReason, cfg: &RunConfig) -> String {
    match reason {
        FailureReason::OutOfMemory => {
            let (recomputed, blocks) = (cfg.recomputed_blocks(), cfg.model.n_layer);
            let more = if !cfg.gradient_checkpointing {
                " or set spec.gradientCheckpointing: true".to_string()
            } else if recomputed < blocks {
                format!(" or raise spec.checkpointedBlocks (now {recomputed} of {blocks})")
            } else {
                String::new()
            };
            format!("lower spec.batch.microBatch (now {}){more}", cfg.batch.micro_batch)
        }
        FailureReason::NaNLoss => {
            let rollback = if cfg.failure.on_nan == crds::types::OnNaN::Fail {
                ", or set spec.failurePolicy.onNaN: rollback to restart from it past this step's samples"
            } else {
                ""
            };
            format!(
                "lower spec.optimizer.lr or raise warmupTokens; the last checkpoint is before the divergence{rollback}"
            )
        }
        FailureReason::InvalidConfig => "fix the spec and create a new run".into(),
        FailureReason::DataError => "check the data sources in spec.data and their credentials".into(),
        FailureReason::CollectiveTimeout => {
            "a peer died or the network failed; restarting from the last checkpoint".into()
        }
        FailureReason::StorageFull => {
            let c = &cfg.checkpoint;
            let best = if c.keep_best > 0 { format!(" or keepBest (now {})", c.keep_best) } else { String::new() };
            format!(
                "a restart would fill it again: free space on it, raise spec.checkpoint.size (when its storage \
                 class allows expansion) or lower spec.checkpoint.keepLast (now {}){best}, then recreate the run",
                c.keep_last
            )
        }
    }
}

fn classify_pod(pod: &Pod, cfg: &RunConfig, now: Timestamp, settings: &Settings) -> Option<PodFailure> {
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
        let overdue = now > deleted && seconds_between(deleted, now) > settings.lost_node_timeout.as_secs();
        return (overdue && phase(pod) != "Succeeded").then(|| PodFailure {
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

fn cfg_memory_limit(pod: &Pod) -> Option<String> {
    let c = pod.spec.as_ref()?.containers.iter().find(|c| c.name == CONTAINER)?;
    Some(c.resources.as_ref()?.limits.as_ref()?.get("memory")?.0.clone())
}

/// The end of a log excerpt (FallbackToLogsOnError puts the log tail in the message).
fn last_line(text: &str) -> String {
    let line = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no termination message").trim();
    line.chars().take(300).collect()
}

fn job_condition<'a>(job: &'a Job, type_: &str) -> Option<&'a k8s_openapi::api::batch::v1::JobCondition> {
    job.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == type_ && c.status == "True")
}

/// Why a pending pod is not running, once it has been so for longer than the timeout.
fn stuck(pod: &Pod, now: Timestamp, settings: &Settings) -> Option<(String, String)> {
    let name = pod_name(pod);
    let created = pod.metadata.creation_timestamp.as_ref().map_or(now, |t| t.0);
    if seconds_between(created, now) < settings.pending_timeout.as_secs() {
        return None;
    }
    let waiting = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find_map(|c| c.state.as_ref()?.waiting.clone()));
    if let Some(w) = waiting {
        let reason = w.reason.unwrap_or_default();
        if matches!(reason.as_str(), "ImagePullBackOff" | "ErrImagePull" | "InvalidImageName" | "ErrImageNeverPull") {
            let msg = w.message.unwrap_or_default();
            return Some((
                RunReason::ImagePullBackOff.into(),
                format!("pod {name} cannot pull its image ({reason}): {msg}"),
            ));
        }
        if reason == "CreateContainerConfigError" {
            let reason = RunReason::CreateContainerConfigError.into();
            return Some((reason, format!("pod {name}: {}", w.message.unwrap_or_default())));
        }
    }
    let c = condition(pod, "PodScheduled").filter(|c| c.status == "False")?;
    let msg = c.message.clone().unwrap_or_default();
    Some((RunReason::Unschedulable.into(), format!("pod {name} cannot be scheduled: {msg}")))
}

/// Classifies the current attempt. `pods` are that attempt's pods only.
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

fn terminated_ok(pod: &Pod) -> Option<&ContainerStateTerminated> {
    terminated(pod).filter(|t| t.exit_code == 0)
}

/// A peer whose failure finished within this many seconds of a collective timeout
/// caused it (`finishedAt` has one-second resolution, so they often tie).
const SYMPTOM_WINDOW_SECS: u64 = 10;

/// The failure to report for a restart: `first`, unless it is a collective timeout
/// (the symptom on the ranks left waiting) and another pod failed for another reason
/// within moments of it (the cause: a crash, a killed process).
fn cause_of<'f>(first: &'f PodFailure, failures: &'f [PodFailure]) -> &'f PodFailure {
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
fn awaiting_cause(f: &PodFailure, pods: &[Pod], now: Timestamp) -> bool {
    let exiting = pods.iter().any(|p| terminated(p).is_none() && !matches!(phase(p), "Succeeded" | "Failed"));
    f.reason == FailureReason::CollectiveTimeout.as_str()
        && exiting
        && f.at.is_some_and(|at| now <= at || seconds_between(at, now) <= SYMPTOM_WINDOW_SECS)
}

/// "… failed with exit code 86 …" → 86.
fn exit_code_in(message: &str) -> Option<i32> {
    let rest = &message[message.find("exit code ")? + "exit code ".len()..];
    rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::resources::testing::{GPU_SPEC, run};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    pub fn pod(index: u32, status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {
                "name": format!("llm-a1-{index}-x"),
                "annotations": {"batch.kubernetes.io/job-completion-index": index.to_string()},
                "creationTimestamp": "2026-01-01T00:00:00Z"
            },
            "spec": {"containers": [{"name": "trainer", "resources": {"limits": {"memory": "64Gi"}}}]},
            "status": status
        }))
        .unwrap()
    }

    pub fn running(index: u32) -> Pod {
        pod(index, json!({"phase": "Running"}))
    }

    pub fn exited(index: u32, code: i32, reason: &str, message: &str) -> Pod {
        pod(
            index,
            json!({"phase": if code == 0 { "Succeeded" } else { "Failed" }, "containerStatuses": [{
                "name": "trainer", "ready": false, "restartCount": 0, "image": "i", "imageID": "", "started": false,
                "state": {"terminated": {"exitCode": code, "reason": reason, "message": message, "finishedAt": "2026-01-01T01:00:00Z"}}
            }]}),
        )
    }

    pub fn job(conditions: serde_json::Value) -> Job {
        serde_json::from_value(json!({"metadata": {"name": "llm-a1"}, "status": {"conditions": conditions}})).unwrap()
    }

    fn now() -> Timestamp {
        "2026-01-01T02:00:00Z".parse().unwrap()
    }

    fn verdict(job_: &Job, pods: &[Pod]) -> Verdict {
        let cfg = crds::resolve(&run(GPU_SPEC)).unwrap();
        classify(job_, pods, &cfg, now(), &Settings::default())
    }

    fn nan_message() -> String {
        crds::contract::TerminationMessage {
            reason: FailureReason::NaNLoss,
            step: Some(1200),
            detail: "loss=NaN grad_norm=inf".into(),
            samples: Some(crds::contract::FailedSamples { from: 307_200, to: 307_456, checkpoint: 256_000 }),
        }
        .to_json()
    }

    #[test]
    fn all_nodes_running() {
        assert_eq!(verdict(&job(json!([])), &[running(0), running(1)]), Verdict::Running);
        assert_eq!(verdict(&job(json!([])), &[running(0)]), Verdict::Pending { stuck: None });
        assert_eq!(verdict(&job(json!([])), &[]), Verdict::Pending { stuck: None });
        // The last step's all-reduce done, node 1 exits a moment before node 0.
        assert_eq!(verdict(&job(json!([])), &[running(0), exited(1, 0, "Completed", "")]), Verdict::Running);
    }

    #[test]
    fn nan_exit_names_the_step_and_its_samples() {
        let v = verdict(&job(json!([])), &[running(0), exited(1, 86, "Error", &nan_message())]);
        let Verdict::NonFinite { message, at } = v else { panic!("{v:?}") };
        assert!(message.starts_with("NaNLoss at step 1200"), "{message}");
        assert!(message.contains("llm-a1-1-x (node rank 1)"), "{message}");
        assert!(message.contains("failurePolicy.onNaN: rollback"), "the hint names the policy: {message}");
        let samples = crds::contract::FailedSamples { from: 307_200, to: 307_456, checkpoint: 256_000 };
        assert_eq!(at, NonFinite { step: Some(1200), samples: Some(samples) });
    }

    #[test]
    fn cuda_oom_and_host_oom_are_told_apart_with_different_hints() {
        let cuda = crds::contract::TerminationMessage {
            reason: FailureReason::OutOfMemory,
            step: Some(3),
            detail: "CUDA out of memory".into(),
            samples: None,
        };
        // The trainer's own OOM, which the failure policy may answer with a smaller
        // micro-batch; a host OOMKilled always fails.
        let v = verdict(&job(json!([])), &[exited(0, 87, "Error", &cuda.to_json())]);
        let Verdict::DeviceOutOfMemory { message } = v else { panic!("{v:?}") };
        assert!(
            message.contains("spec.batch.microBatch (now 8)") && message.contains("gradientCheckpointing"),
            "{message}"
        );
        let Verdict::Failed { reason, message } = verdict(&job(json!([])), &[exited(0, 137, "OOMKilled", "")]) else {
            panic!()
        };
        assert_eq!(reason, "OutOfMemory");
        assert!(
            message.contains("host memory (memory limit 64Gi)") && message.contains("resources.limits.memory"),
            "{message}"
        );
    }

    #[test]
    fn the_out_of_memory_hint_names_the_next_memory_knob() {
        let mut cfg = crds::resolve(&run(GPU_SPEC)).unwrap();
        let blocks = cfg.model.n_layer;
        cfg.gradient_checkpointing = false;
        assert!(hint(FailureReason::OutOfMemory, &cfg).ends_with(" or set spec.gradientCheckpointing: true"));
        cfg.gradient_checkpointing = true;
        cfg.checkpointed_blocks = Some(2);
        let h = hint(FailureReason::OutOfMemory, &cfg);
        assert!(h.ends_with(&format!(" or raise spec.checkpointedBlocks (now 2 of {blocks})")), "{h}");
        cfg.checkpointed_blocks = None;
        let h = hint(FailureReason::OutOfMemory, &cfg);
        assert!(h.starts_with("lower spec.batch.microBatch (now ") && !h.contains(" or "), "{h}");
    }

    #[test]
    fn other_failures_restart_and_count() {
        let v = verdict(&job(json!([])), &[exited(0, 1, "Error", "thread panicked\nsegfault in foo\n"), running(1)]);
        assert_eq!(
            v,
            Verdict::Restart {
                reason: "PodFailed".into(),
                message: "pod llm-a1-0-x (node rank 0) exited with code 1: segfault in foo".into(),
                counts: true
            }
        );
        let timeout = crds::contract::TerminationMessage {
            reason: FailureReason::CollectiveTimeout,
            step: Some(9),
            detail: "allreduce".into(),
            samples: None,
        };
        let Verdict::Restart { reason, counts, .. } =
            verdict(&job(json!([])), &[exited(1, 88, "Error", &timeout.to_json())])
        else {
            panic!()
        };
        assert_eq!((reason.as_str(), counts), ("CollectiveTimeout", true));
        let aborted = verdict(
            &job(json!([])),
            &[exited(1, 134, "Error", "terminate called after throwing an instance of 'c10::Error'\n")],
        );
        let Verdict::Restart { message, .. } = aborted else { panic!("{aborted:?}") };
        assert!(
            message.ends_with(
                "exited with code 134 (SIGABRT): terminate called after throwing an instance of 'c10::Error'"
            ),
            "{message}"
        );
    }

    #[test]
    fn a_peer_crash_next_to_a_collective_timeout_is_reported_as_the_cause() {
        let timeout = crds::contract::TerminationMessage {
            reason: FailureReason::CollectiveTimeout,
            step: Some(9),
            detail: "a peer died".into(),
            samples: None,
        };
        let at = |p: Pod, t: &str| {
            let mut v = serde_json::to_value(p).unwrap();
            v["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"] = json!(t);
            serde_json::from_value::<Pod>(v).unwrap()
        };
        let waiting = |t: &str| at(exited(0, 88, "Error", &timeout.to_json()), t);
        let killed = |t: &str| at(exited(1, 137, "Error", ""), t);
        // The same second, the timeout listed first: the kill is the cause.
        for pods in [
            [waiting("2026-01-01T01:00:00Z"), killed("2026-01-01T01:00:00Z")],
            [killed("2026-01-01T01:00:03Z"), waiting("2026-01-01T01:00:00Z")],
        ] {
            let Verdict::Restart { reason, message, counts } = verdict(&job(json!([])), &pods) else { panic!() };
            assert_eq!((reason.as_str(), counts), ("PodFailed", true));
            assert!(message.contains("(node rank 1) exited with code 137 (SIGKILL)"), "{message}");
        }
        // A crash long after the timeout is a separate event: the first failure stands.
        let pods = [waiting("2026-01-01T01:00:00Z"), killed("2026-01-01T01:05:00Z")];
        let Verdict::Restart { reason, .. } = verdict(&job(json!([])), &pods) else { panic!() };
        assert_eq!(reason, "CollectiveTimeout");

        // The timeout exits first while its cause is still on its way out (now is 02:00:00).
        let full = crds::contract::TerminationMessage {
            reason: FailureReason::StorageFull,
            step: Some(8),
            detail: "No space left on device".into(),
            samples: None,
        };
        let cause = at(exited(1, 89, "Error", &full.to_json()), "2026-01-01T02:00:00Z");
        let cases: [(&str, &str, Option<Pod>, &str); 4] = [
            ("peer still exiting", "2026-01-01T01:59:58Z", Some(running(1)), "AwaitingCause"),
            ("peer hung past the window", "2026-01-01T01:59:40Z", Some(running(1)), "Restart"),
            ("peer exited fatally", "2026-01-01T01:59:59Z", Some(cause), "Failed"),
            ("no peer left", "2026-01-01T01:59:59Z", None, "Restart"),
        ];
        for (name, finished, peer, want) in cases {
            let pods: Vec<Pod> = [Some(waiting(finished)), peer].into_iter().flatten().collect();
            let v = verdict(&job(json!([])), &pods);
            let got = match &v {
                Verdict::AwaitingCause { message } => {
                    assert!(message.contains("CollectiveTimeout") && message.contains("name the cause"), "{message}");
                    "AwaitingCause"
                }
                Verdict::Restart { reason, .. } => {
                    assert_eq!(reason, "CollectiveTimeout", "{name}");
                    "Restart"
                }
                Verdict::Failed { reason, message } => {
                    assert_eq!(reason, "StorageFull", "{name}");
                    assert!(message.contains("StorageFull at step 8"), "{message}");
                    "Failed"
                }
                other => panic!("{name}: {other:?}"),
            };
            assert_eq!(got, want, "{name}: {v:?}");
        }
    }

    #[test]
    fn disruptions_restart_without_counting_even_when_peers_time_out() {
        let preempted = pod(
            0,
            json!({"phase": "Failed", "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler", "message": "preempted by high-prio", "lastTransitionTime": "2026-01-01T00:59:00Z"}]}),
        );
        let timeout = crds::contract::TerminationMessage {
            reason: FailureReason::CollectiveTimeout,
            step: None,
            detail: "peer gone".into(),
            samples: None,
        };
        let v = verdict(&job(json!([])), &[preempted, exited(1, 88, "Error", &timeout.to_json())]);
        let Verdict::Restart { reason, message, counts } = v else { panic!("{v:?}") };
        assert_eq!((reason.as_str(), counts), ("Disruption", false));
        assert!(message.contains("PreemptionByScheduler"), "{message}");
    }

    #[test]
    fn a_pod_stuck_terminating_on_a_lost_node_is_a_disruption() {
        let mut p = running(1);
        p.metadata.deletion_timestamp = Some(Time("2026-01-01T01:58:30Z".parse().unwrap()));
        let Verdict::Restart { counts, message, .. } = verdict(&job(json!([])), &[running(0), p.clone()]) else {
            panic!()
        };
        assert!(!counts && message.contains("node is lost"), "{message}");
        // Just deleted (within the timeout): not yet.
        p.metadata.deletion_timestamp = Some(Time("2026-01-01T01:59:30Z".parse().unwrap()));
        assert_eq!(verdict(&job(json!([])), &[running(0), p]), Verdict::Pending { stuck: None });
    }

    #[test]
    fn completion_reads_rank_zeros_final_report() {
        let done = TrainerStatus {
            phase: crds::contract::TrainerPhase::Done,
            attempt: 1,
            step: 244,
            total_steps: 244,
            tokens: 1000,
            total_tokens: 1000,
            metrics: crds::types::RunMetrics { loss: Some(0.64), ..Default::default() },
            last_checkpoint: None,
            best_checkpoint: None,
            tokens_by_source: Default::default(),
            ranks: Vec::new(),
        };
        let pods = [exited(0, 0, "Completed", &serde_json::to_string(&done).unwrap()), exited(1, 0, "Completed", "")];
        let v = verdict(&job(json!([{"type": "Complete", "status": "True"}])), &pods);
        assert_eq!(v, Verdict::Succeeded { report: Some(Box::new(done)) });
        assert_eq!(
            verdict(&job(json!([{"type": "Complete", "status": "True"}])), &[]),
            Verdict::Succeeded { report: None }
        );
    }

    #[test]
    fn a_failed_job_without_pods_is_read_from_its_condition() {
        let j = job(
            json!([{"type": "Failed", "status": "True", "reason": "PodFailurePolicy", "message": "Container trainer for pod ml/llm-a1-0 failed with exit code 86 matching FailJob rule at index 1"}]),
        );
        let Verdict::NonFinite { message, at } = verdict(&j, &[]) else { panic!() };
        assert!(message.contains("exit code 86"), "{message}");
        assert_eq!(at, NonFinite::default(), "the pods are gone, and what they said with them");
        let j = job(
            json!([{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"}]),
        );
        let Verdict::Restart { counts, reason, .. } = verdict(&j, &[]) else { panic!() };
        assert_eq!((counts, reason.as_str()), (true, "JobFailed"));
    }

    #[test]
    fn pods_stuck_pending_are_reported_after_the_timeout() {
        let pull = pod(
            0,
            json!({"phase": "Pending", "containerStatuses": [{"name": "trainer", "ready": false, "restartCount": 0, "image": "i", "imageID": "", "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"nope\""}}}]}),
        );
        let Verdict::Pending { stuck: Some((reason, message)) } = verdict(&job(json!([])), std::slice::from_ref(&pull))
        else {
            panic!()
        };
        assert_eq!(reason, "ImagePullBackOff");
        assert!(message.contains("nope"));
        let unsched = pod(
            1,
            json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/4 nodes have nvidia.com/gpu"}]}),
        );
        let Verdict::Pending { stuck: Some((reason, _)) } = verdict(&job(json!([])), &[running(0), unsched.clone()])
        else {
            panic!()
        };
        assert_eq!(reason, "Unschedulable");
        // Young pods are not stuck yet.
        let mut young = unsched;
        young.metadata.creation_timestamp = Some(Time("2026-01-01T01:59:00Z".parse().unwrap()));
        assert_eq!(verdict(&job(json!([])), &[young]), Verdict::Pending { stuck: None });
    }
}
