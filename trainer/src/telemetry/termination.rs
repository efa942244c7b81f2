//! The termination message: Kubernetes reads a container's last words from a file
//! (`terminationMessagePath`), and the operator reads them from the pod's status.

use crds::contract::TrainerStatus;

/// Where the termination message goes: `TRAINER_TERMINATION_LOG`, else Kubernetes'
/// `/dev/termination-log` when it exists.
pub fn termination_log() -> Option<std::path::PathBuf> {
    match std::env::var_os(crds::contract::env::TERMINATION_LOG) {
        Some(p) if !p.is_empty() => Some(p.into()),
        _ => Some(std::path::PathBuf::from(crds::contract::TERMINATION_LOG)).filter(|p| p.exists()),
    }
}

/// After success, the final status becomes the termination message, so the
/// operator learns the last loss and checkpoint even if it never polled.
pub fn write_final_report(status: &TrainerStatus) {
    if let Some(path) = termination_log() {
        let json = serde_json::to_string(status).expect("TrainerStatus serializes");
        if let Err(e) = std::fs::write(&path, json) {
            tracing::warn!("writing the final report to {}: {e}", path.display());
        }
    }
}
