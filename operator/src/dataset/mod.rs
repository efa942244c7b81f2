//! The TrainingDataset controller, with the TrainingRun controller's skeleton: gather
//! (reads only) → plan (pure: validate, decide, build) → execute (the plan's writes, in
//! its order). A dataset is prepared by `trainer prepare` in Jobs of its
//! generation (tokenizer, work, merge); everything it knows lives in those Jobs, their
//! pods' termination messages and its status, so an operator restart loses nothing.
//! A finalizer keeps a dataset that live runs name until they end.

pub mod build;
pub mod decide;
mod execute;
mod gather;
pub mod plan;
pub mod validate;

use std::sync::Arc;
use std::time::Duration;

use crds::TrainingRun;
use crds::contract::prepare::DatasetReason;
use crds::types::TrainingDataset;
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{self, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use self::build::DATASET_LABEL;
use crate::context::Context;
use crate::{Error, apply};

/// Finalizer on every TrainingDataset: deletion waits for the runs that use it.
pub const FINALIZER: &str = "training.puretransformer.dev/dataset-in-use";

/// Reconciles one TrainingDataset. The finalizer routes deletion to [`cleanup`].
pub async fn reconcile(ds: Arc<TrainingDataset>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = ds.namespace().ok_or_else(|| Error::NoNamespace(ds.name_any()))?;
    let api: Api<TrainingDataset> = Api::namespaced(ctx.client.clone(), &ns);
    finalizer(&api, FINALIZER, ds.clone(), |event| async {
        match event {
            finalizer::Event::Apply(ds) => pipeline(ds, ctx.clone()).await,
            finalizer::Event::Cleanup(ds) => cleanup(ds, ctx.clone()).await,
        }
    })
    .await
    .map_err(|e| match e {
        finalizer::Error::ApplyFailed(e) | finalizer::Error::CleanupFailed(e) => e,
        other => Error::Finalizer { name: ds.name_any(), message: other.to_string() },
    })
}

/// Deletion: refused (the finalizer stays, an event names the runs) while live runs
/// name the dataset.
async fn cleanup(ds: Arc<TrainingDataset>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = ds.namespace().unwrap_or_default();
    let users = gather::users(&ctx, &ns, &ds.name_any()).await?;
    if users.is_empty() {
        ctx.publish(&*ds, false, "Deleted", "deleted with its preparation Jobs; the prepared shards are kept").await;
        return Ok(Action::await_change());
    }
    let message = format!(
        "deletion waits for the TrainingRuns that use it to end: {} (delete them, or let them finish)",
        users.join(", ")
    );
    let told = ds.status.as_ref().is_some_and(|s| s.reason.as_deref() == Some(DatasetReason::InUse.as_str()));
    if !told {
        ctx.publish(&*ds, true, DatasetReason::InUse.as_str(), &message).await;
        let mut status = ds.status.clone().unwrap_or_default();
        status.reason = Some(DatasetReason::InUse.into());
        status.used_by = users.clone();
        apply::write_status(&ctx.client, &*ds, &status).await?;
    }
    Err(Error::InUse { name: ds.name_any(), runs: users })
}

async fn pipeline(cached: Arc<TrainingDataset>, ctx: Arc<Context>) -> Result<Action, Error> {
    let Some((ds, observed)) = gather::gather(&ctx, &cached).await? else {
        return Ok(Action::await_change());
    };
    let plan = plan::plan(&ds, &observed, &ctx.settings, ctx.clock.now());
    execute::execute(&ctx, &ds, &plan).await
}

/// Retries with backoff; a refused deletion waits quietly for its runs (the event was
/// published once).
pub fn error_policy(ds: Arc<TrainingDataset>, err: &Error, ctx: Arc<Context>) -> Action {
    if let Error::InUse { .. } = err {
        return Action::requeue(Duration::from_secs(15));
    }
    tracing::warn!(dataset = %ds.name_any(), reason = err.reason(), "reconcile failed: {err}");
    let (reason, message) = (err.reason(), err.to_string());
    tokio::spawn(async move { ctx.publish(&*ds, true, reason, &message).await });
    Action::requeue(Duration::from_secs(5))
}

/// Runs the dataset controller until `shutdown` resolves.
pub async fn run(
    ctx: Arc<Context>,
    namespace: Option<String>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let (datasets, jobs, pods, runs) = match &namespace {
        Some(ns) => (
            Api::<TrainingDataset>::namespaced(client.clone(), ns),
            Api::<Job>::namespaced(client.clone(), ns),
            Api::<Pod>::namespaced(client.clone(), ns),
            Api::<TrainingRun>::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone()), Api::all(client.clone()), Api::all(client)),
    };
    let labelled = watcher::Config::default().labels(DATASET_LABEL);
    Controller::new(datasets, watcher::Config::default().any_semantic())
        .with_config(kube::runtime::controller::Config::default().concurrency(ctx.settings.concurrency))
        .owns(jobs, labelled.clone())
        .watches(pods, labelled, |pod: Pod| {
            let ds = pod.labels().get(DATASET_LABEL).cloned();
            ds.map(|d| ObjectRef::<TrainingDataset>::new(&d).within(&pod.namespace().unwrap_or_default()))
        })
        // A run that starts, ends or goes names its datasets: their usedBy and finalizer.
        .watches(runs, watcher::Config::default(), |run: TrainingRun| {
            let ns = run.namespace().unwrap_or_default();
            crds::resolve::named_datasets(&run)
                .into_iter()
                .map(move |d| ObjectRef::<TrainingDataset>::new(&d).within(&ns))
        })
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            match res {
                Ok((obj, _)) => tracing::debug!(dataset = %obj.name, "reconciled"),
                Err(e) => tracing::debug!("reconcile: {e}"),
            }
        })
        .await;
}
