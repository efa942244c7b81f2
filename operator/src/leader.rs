//! Leader election on a coordination.k8s.io Lease (kube-lease-manager), so two
//! replicas can run: one reconciles, the other waits to take over.

use kube::Client;
use kube_lease_manager::LeaseManagerBuilder;
use tokio::sync::watch;

use crate::{Error, MANAGER};

pub struct Election {
    pub lease: String,
    pub namespace: String,
    pub identity: String,
    /// Seconds a lease is held without renewal.
    pub duration: u64,
}

/// Starts the election. The receiver turns true while this replica leads.
pub async fn start(
    client: Client,
    e: &Election,
) -> Result<(watch::Receiver<bool>, tokio::task::JoinHandle<()>), Error> {
    let fail = |message: String| Error::Leader { lease: format!("{}/{}", e.namespace, e.lease), message };
    let manager = LeaseManagerBuilder::new(client, &e.lease)
        .with_namespace(&e.namespace)
        .with_identity(&e.identity)
        .with_duration(e.duration)
        .with_grace(e.duration / 3)
        // One field manager a replica: under a shared one, server-side apply lets a second
        // replica take a held Lease without a conflict, and both lead until a renewal.
        .with_field_manager(format!("{MANAGER}-{}", e.identity))
        .build()
        .await
        .map_err(|err| fail(err.to_string()))?;
    let (rx, task) = manager.watch().await;
    let task = tokio::spawn(async move {
        match task.await {
            Ok(Ok(_)) => {}
            Ok(Err(err)) => tracing::error!("leader election stopped: {err}"),
            Err(err) => tracing::error!("leader election task: {err}"),
        }
    });
    Ok((rx, task))
}
