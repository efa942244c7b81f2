//! The stuck-pod policy: why a pod still pending after the timeout will not start.

use crds::contract::RunReason;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;

use super::pods::{condition, pod_name};
use crate::clock::seconds_between;
use crate::settings::Settings;

/// Why a pending pod is not running, once it has been so for longer than the timeout.
pub(super) fn stuck(pod: &Pod, now: Timestamp, settings: &Settings) -> Option<(String, String)> {
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
