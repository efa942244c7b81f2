//! Kueue's Workload of a queued run's Job: how the operator suspends and resumes a run
//! that Kueue admits. Kueue un-suspends every suspended Job whose Workload it has
//! admitted, so suspending such a Job would start a tug of war; Kueue's own way to stop
//! a workload is `spec.active: false`, which it answers by evicting it (suspending the
//! Job), and `spec.active: true` queues it again.

use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::json;

use super::SUSPENDED_BY_OPERATOR;

/// The label Kueue puts on the Workload of a Job: the Job's uid.
pub const JOB_UID_LABEL: &str = "kueue.x-k8s.io/job-uid";

/// Kueue's Workload API (`kueue.x-k8s.io/v1beta2`, its storage version since v0.15).
pub fn api_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta2", "Workload"), "workloads")
}

/// What the operator reads of a Workload.
#[derive(Clone, Debug, PartialEq)]
pub struct QueuedWorkload {
    pub name: String,
    /// `spec.active`: false while deactivated (Kueue keeps it out of the queue).
    pub active: bool,
    /// Deactivated by the operator, for `spec.suspend`, which it then reactivates.
    pub deactivated_by_operator: bool,
}

impl QueuedWorkload {
    pub fn read(w: &DynamicObject) -> QueuedWorkload {
        QueuedWorkload {
            name: w.metadata.name.clone().unwrap_or_default(),
            // Kueue defaults `active` to true.
            active: w.data["spec"]["active"].as_bool().unwrap_or(true),
            deactivated_by_operator: w
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(SUSPENDED_BY_OPERATOR)),
        }
    }
}

/// The server-side apply body that sets `spec.active`: deactivating marks the Workload
/// as the operator's doing; activating drops the mark (the field manager no longer
/// applies it).
pub fn activation(name: &str, namespace: &str, active: bool) -> DynamicObject {
    let mut metadata = json!({"name": name, "namespace": namespace});
    if !active {
        metadata["annotations"][SUSPENDED_BY_OPERATOR] = json!("true");
    }
    let object = json!({
        "apiVersion": api_resource().api_version,
        "kind": "Workload",
        "metadata": metadata,
        "spec": {"active": active},
    });
    serde_json::from_value(object).expect("a Workload")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deactivation_marks_the_workload_and_activation_drops_the_mark() {
        let off = activation("job-llm-a1-x", "ml", false);
        let read = QueuedWorkload::read(&off);
        assert_eq!(read, QueuedWorkload { name: "job-llm-a1-x".into(), active: false, deactivated_by_operator: true });
        let on = serde_json::to_value(activation("job-llm-a1-x", "ml", true)).unwrap();
        assert_eq!(on["apiVersion"], "kueue.x-k8s.io/v1beta2");
        assert_eq!(on["spec"], json!({"active": true}), "only spec.active: Kueue owns the rest");
        assert!(on["metadata"].get("annotations").is_none(), "{on}");
    }

    #[test]
    fn a_workload_without_spec_active_is_active() {
        let w: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": "w", "namespace": "ml"}, "spec": {"queueName": "team"}
        }))
        .unwrap();
        assert!(QueuedWorkload::read(&w).active);
    }
}
