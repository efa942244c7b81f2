//! What a pod's or a Job's state says, read from its status: phase, conditions, the
//! trainer container's termination.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ContainerStateTerminated, Pod};

use crate::resources::{COMPLETION_INDEX, CONTAINER};

/// Completion index of an Indexed Job's pod.
pub fn completion_index(pod: &Pod) -> Option<u32> {
    let m = &pod.metadata;
    m.annotations
        .as_ref()
        .and_then(|a| a.get(COMPLETION_INDEX))
        .or_else(|| m.labels.as_ref().and_then(|l| l.get(COMPLETION_INDEX)))?
        .parse()
        .ok()
}

/// The pod's name (empty when it has none).
pub(super) fn pod_name(pod: &Pod) -> String {
    pod.metadata.name.clone().unwrap_or_default()
}

/// The pod's phase, `Pending` until it has one.
pub(super) fn phase(pod: &Pod) -> &str {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending")
}

/// The pod's condition of type `type_`.
pub(super) fn condition<'a>(pod: &'a Pod, type_: &str) -> Option<&'a k8s_openapi::api::core::v1::PodCondition> {
    pod.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == type_)
}

/// How the trainer container last terminated: its current state, else its last one.
pub(super) fn terminated(pod: &Pod) -> Option<&ContainerStateTerminated> {
    let status = pod.status.as_ref()?.container_statuses.as_ref()?.iter().find(|c| c.name == CONTAINER)?;
    status
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .or_else(|| status.last_state.as_ref()?.terminated.as_ref())
}

/// [`terminated`], when the container exited 0.
pub(super) fn terminated_ok(pod: &Pod) -> Option<&ContainerStateTerminated> {
    terminated(pod).filter(|t| t.exit_code == 0)
}

/// The Job's condition of type `type_`, when it is `True`.
pub(super) fn job_condition<'a>(job: &'a Job, type_: &str) -> Option<&'a k8s_openapi::api::batch::v1::JobCondition> {
    job.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == type_ && c.status == "True")
}

/// "… failed with exit code 86 …" → 86.
pub(super) fn exit_code_in(message: &str) -> Option<i32> {
    let rest = &message[message.find("exit code ")? + "exit code ".len()..];
    rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// The end of a log excerpt (FallbackToLogsOnError puts the log tail in the message).
pub(super) fn last_line(text: &str) -> String {
    let line = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no termination message").trim();
    line.chars().take(300).collect()
}

/// The trainer container's memory limit, as written in the pod spec.
pub(super) fn cfg_memory_limit(pod: &Pod) -> Option<String> {
    let c = pod.spec.as_ref()?.containers.iter().find(|c| c.name == CONTAINER)?;
    Some(c.resources.as_ref()?.limits.as_ref()?.get("memory")?.0.clone())
}
