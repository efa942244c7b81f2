//! What a reconcile of a dataset reads: the live dataset, its Jobs and pods, the
//! `/status` of its running pods, and the live runs that name it (from the run
//! controller's cache when it is fresh).

use crds::TrainingRun;
use crds::contract::STATUS_PORT;
use crds::contract::prepare::PrepareReport;
use crds::types::{RunPhase, TrainingDataset};
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::{Resource, ResourceExt};

use super::build::DATASET_LABEL;
use super::decide::Observed;
use crate::context::Context;
use crate::{Error, Verb};

/// The live dataset and what its reconcile reads; `None` once it is gone.
pub async fn gather(ctx: &Context, cached: &TrainingDataset) -> Result<Option<(TrainingDataset, Observed)>, Error> {
    let (ns, name) = (cached.namespace().unwrap_or_default(), cached.name_any());
    let api: Api<TrainingDataset> = Api::namespaced(ctx.client.clone(), &ns);
    let Some(ds) = api.get_opt(&name).await.map_err(Error::kube(Verb::Get, "TrainingDataset", &ns, &name))? else {
        return Ok(None);
    };
    let selector = ListParams::default().labels(&format!("{DATASET_LABEL}={name}"));
    let jobs = Api::<Job>::namespaced(ctx.client.clone(), &ns)
        .list(&selector)
        .await
        .map_err(Error::kube(Verb::List, "Job", &ns, &name))?
        .items;
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), &ns)
        .list(&selector)
        .await
        .map_err(Error::kube(Verb::List, "Pod", &ns, &name))?
        .items;
    let live = reports(ctx, &ds, &pods).await;
    let users = users(ctx, &ns, &name).await?;
    Ok(Some((ds, Observed { jobs, pods, live, users })))
}

/// The `/status` of the dataset's running pods, by pod name; a pod that does not
/// answer is left out (logged).
async fn reports(
    ctx: &Context,
    ds: &TrainingDataset,
    pods: &[Pod],
) -> std::collections::BTreeMap<String, PrepareReport> {
    let running: Vec<(String, String)> = pods
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .filter_map(|p| Some((p.name_any(), p.status.as_ref()?.pod_ip.clone()?)))
        .collect();
    futures::stream::iter(running)
        .map(|(pod, ip)| async move {
            let url = format!("http://{}/status", std::net::SocketAddr::new(ip.parse().ok()?, STATUS_PORT));
            match ctx.status_client.get_json::<PrepareReport>(&url, "prepare report").await {
                Ok(r) => Some((pod, r)),
                Err(e) => {
                    tracing::debug!(dataset = %ds.name_any(), "{e}");
                    None
                }
            }
        })
        .buffer_unordered(16)
        .filter_map(|p| async { p })
        .collect()
        .await
}

/// The live (not Succeeded or Failed) runs in `ns` whose mix names dataset `name`: from
/// the run controller's cache when it is fresh, else listed.
pub(super) async fn users(ctx: &Context, ns: &str, name: &str) -> Result<Vec<String>, Error> {
    let uses = |r: &TrainingRun| {
        let phase = r.status.as_ref().and_then(|s| s.phase);
        r.namespace().as_deref() == Some(ns)
            && crds::resolve::named_datasets(r).iter().any(|d| d == name)
            && !matches!(phase, Some(RunPhase::Succeeded | RunPhase::Failed))
            && r.meta().deletion_timestamp.is_none()
    };
    let mut users: Vec<String> = match ctx.caches.get().filter(|c| c.runs.is_fresh()) {
        Some(c) => c.runs.store.state().iter().filter(|r| uses(r)).map(|r| r.name_any()).collect(),
        None => Api::<TrainingRun>::namespaced(ctx.client.clone(), ns)
            .list(&ListParams::default())
            .await
            .map_err(Error::kube(Verb::List, "TrainingRun", ns, name))?
            .items
            .iter()
            .filter(|r| uses(r))
            .map(|r| r.name_any())
            .collect(),
    };
    users.sort();
    Ok(users)
}
