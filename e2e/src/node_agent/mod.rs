//! A node agent: the part of the kubelet this machine can be. It registers a `Node`,
//! renews its `Lease`, watches the pods the real scheduler binds to it and runs each
//! container's command as a process in the pod's own network namespace
//! ([`crate::network`]), reporting what the kubelet reports. It authenticates as
//! `system:node:<name>`, so the Node authorizer and NodeRestriction judge what it does.
//!
//! There is no container runtime here: an image maps to a binary built from this
//! checkout (`--image trainer=/path/to/trainer`), and a volume is a directory the pod's
//! mount path links to (ConfigMaps written out, a claim's PersistentVolume `hostPath`,
//! an emptyDir). The ServiceAccount's files are bind-mounted at their real path
//! ([`service_account`]), so in-cluster clients work as in a pod.

mod config;
pub mod container;
pub mod node;
pub mod pods;
pub mod service_account;

pub use config::{Config, Error};

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::{WatchStreamExt, reflector, watcher};

/// How often the sync loop looks at its processes (the kubelet's PLEG relists every
/// second).
const SYNC: Duration = Duration::from_millis(200);
/// How often the agent renews its nodes' Leases (the kubelet's default).
pub const LEASE_RENEW: Duration = Duration::from_secs(10);
const STATUS: Duration = Duration::from_secs(60);

/// Runs the node until `stop` resolves; then kills its containers.
pub async fn run(client: kube::Client, cfg: Config, stop: impl std::future::Future<Output = ()>) -> Result<(), Error> {
    std::fs::create_dir_all(cfg.root.join("pods")).map_err(|e| Error::io(&cfg.root, e))?;
    node::register(&client, &cfg).await?;
    node::renew_lease(&client, &cfg).await?;
    let api: Api<Pod> = Api::all(client.clone());
    let (reader, writer) = reflector::store();
    let selector = format!("spec.nodeName={}", cfg.node);
    let stream = reflector(writer, watcher(api, watcher::Config::default().fields(&selector)))
        .default_backoff()
        .touched_objects();
    futures::pin_mut!(stream);
    futures::pin_mut!(stop);
    let mut pods = pods::Pods::default();
    let mut sync = tokio::time::interval(SYNC);
    let mut renew = tokio::time::interval(LEASE_RENEW);
    let mut status = tokio::time::interval(STATUS);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            event = stream.next() => {
                if let Some(Err(e)) = event {
                    tracing::debug!("pod watch: {e}");
                }
            }
            _ = sync.tick() => {}
            _ = renew.tick() => {
                if let Err(e) = node::renew_lease(&client, &cfg).await {
                    tracing::warn!("{e}");
                }
                continue;
            }
            _ = status.tick() => {
                if let Err(e) = node::report_status(&client, &cfg).await {
                    tracing::warn!("{e}");
                }
                continue;
            }
        }
        let bound: Vec<Pod> = reader.state().iter().map(|p| (**p).clone()).collect();
        pods.sync(&client, &cfg, &bound).await;
    }
    pods.kill_all(&cfg);
    Ok(())
}
