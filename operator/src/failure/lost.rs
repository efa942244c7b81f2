//! Pods left on a lost node: deleted, but never confirmed gone, because no kubelet is
//! left to confirm it. Such a pod holds nothing the next attempt needs (its node is
//! tainted, so nothing is scheduled there, and each attempt's pods have their own
//! names), so a gang restart does not wait for it.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;

use super::pods::condition;
use crate::clock::seconds_between;
use crate::settings::Settings;

/// The reason the taint-eviction controller gives a pod it deletes for a NoExecute
/// taint its tolerations do not outlast: `node.kubernetes.io/unreachable` or
/// `not-ready` when the node stops renewing its Lease.
pub const EVICTED_FOR_TAINT: &str = "DeletionByTaintManager";

/// Whether `pod` is terminating on a lost node: evicted for its node's NoExecute taint,
/// or still there `lost_node_timeout` after its grace period ran out.
pub fn left_on_lost_node(pod: &Pod, now: Timestamp, settings: &Settings) -> bool {
    let Some(deleted) = pod.metadata.deletion_timestamp.as_ref().map(|t| t.0) else {
        return false;
    };
    let evicted = condition(pod, "DisruptionTarget")
        .is_some_and(|c| c.status == "True" && c.reason.as_deref() == Some(EVICTED_FOR_TAINT));
    evicted || (now > deleted && seconds_between(deleted, now) > settings.lost_node_timeout.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    fn pod(deleted: Option<&str>, disruption: Option<&str>) -> Pod {
        let conditions: Vec<_> = disruption
            .map(|r| json!({"type": "DisruptionTarget", "status": "True", "reason": r}))
            .into_iter()
            .collect();
        let mut p: Pod = serde_json::from_value(
            json!({"metadata": {"name": "p"}, "status": {"phase": "Running", "conditions": conditions}}),
        )
        .unwrap();
        p.metadata.deletion_timestamp = deleted.map(|t| Time(t.parse().unwrap()));
        p
    }

    #[test]
    fn only_a_deleted_pod_evicted_for_its_nodes_taint_or_long_overdue_is_left_behind() {
        let settings = Settings::default();
        let now: Timestamp = "2026-01-01T01:00:00Z".parse().unwrap();
        // (deletion deadline, DisruptionTarget reason, left on a lost node)
        let cases = [
            (None, None, false),
            (None, Some(EVICTED_FOR_TAINT), false),
            (Some("2026-01-01T00:59:50Z"), None, false),
            (Some("2026-01-01T00:59:50Z"), Some(EVICTED_FOR_TAINT), true),
            (Some("2026-01-01T00:59:50Z"), Some("EvictionByEvictionAPI"), false),
            (Some("2026-01-01T00:58:59Z"), None, true),
            (Some("2026-01-01T01:00:30Z"), None, false),
        ];
        for (deleted, reason, want) in cases {
            assert_eq!(left_on_lost_node(&pod(deleted, reason), now, &settings), want, "{deleted:?} {reason:?}");
        }
    }
}
