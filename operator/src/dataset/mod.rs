//! The TrainingDataset controller: validate (pure) → build (pure) → observe → decide
//! (pure) → apply and status. A dataset is prepared by `trainer prepare` in Jobs of its
//! generation (tokenizer, work, merge); everything it knows lives in those Jobs, their
//! pods' termination messages and its status, so an operator restart loses nothing.
//! A finalizer keeps a dataset that live runs name until they end.

pub mod build;
pub mod decide;
pub mod validate;

use std::sync::Arc;
use std::time::Duration;

use crds::TrainingRun;
use crds::contract::STATUS_PORT;
use crds::contract::prepare::{DatasetReason, PrepareReport};
use crds::types::{DatasetPhase, RunPhase, TrainingDataset};
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType};
use kube::runtime::finalizer::{self, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde_json::json;

use self::build::DATASET_LABEL;
use self::decide::{Decision, Observed};
use crate::controller::Context;
use crate::{Error, Verb, apply};

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
    let users = users(&ctx, &ns, &ds.name_any()).await?;
    if users.is_empty() {
        publish(&ctx, &ds, false, "Deleted", "deleted with its preparation Jobs; the prepared shards are kept").await;
        return Ok(Action::await_change());
    }
    let message = format!(
        "deletion waits for the TrainingRuns that use it to end: {} (delete them, or let them finish)",
        users.join(", ")
    );
    let told = ds.status.as_ref().is_some_and(|s| s.reason.as_deref() == Some(DatasetReason::InUse.as_str()));
    if !told {
        publish(&ctx, &ds, true, DatasetReason::InUse.as_str(), &message).await;
        let mut status = ds.status.clone().unwrap_or_default();
        status.reason = Some(DatasetReason::InUse.into());
        status.used_by = users.clone();
        write_status(&ctx, &ds, &status).await?;
    }
    Err(Error::InUse { name: ds.name_any(), runs: users })
}

async fn pipeline(cached: Arc<TrainingDataset>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = cached.namespace().unwrap_or_default();
    let name = cached.name_any();
    let api: Api<TrainingDataset> = Api::namespaced(ctx.client.clone(), &ns);
    let Some(ds) = api.get_opt(&name).await.map_err(Error::kube(Verb::Get, "TrainingDataset", &ns, &name))? else {
        return Ok(Action::await_change());
    };
    // 1. validate
    let plan = validate::validate(&ds);
    // 2. observe
    let obs = observe(&ctx, &ds).await?;
    // 3. decide
    let now = ctx.clock.now();
    let d: Decision = decide::decide(&ds, &plan, &obs, now);
    // 4. status first, so the Job it names is never created unrecorded; then act.
    let old = ds.status.clone().unwrap_or_default();
    if old != d.status {
        write_status(&ctx, &ds, &d.status).await?;
    }
    for note in &d.notes {
        publish(&ctx, &ds, note.warning, &note.reason, &note.message).await;
    }
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
    for stale in &d.delete_jobs {
        apply::delete(&jobs, &ns, stale).await?;
    }
    if let (Some(step), Ok(plan)) = (d.create, &plan) {
        apply::ensure(&jobs, build::job(&ds, plan, step, &ctx.settings.trainer_image)).await?;
    }
    let every = ctx.settings.status_poll_interval;
    Ok(match d.status.phase {
        Some(DatasetPhase::Preparing) => Action::requeue(every),
        _ => Action::requeue(ctx.settings.requeue_interval),
    })
}

/// Jobs and pods of the dataset, running pods' `/status`, and the runs that use it.
async fn observe(ctx: &Context, ds: &TrainingDataset) -> Result<Observed, Error> {
    let ns = ds.namespace().unwrap_or_default();
    let name = ds.name_any();
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
    let running: Vec<(String, String)> = pods
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .filter_map(|p| Some((p.name_any(), p.status.as_ref()?.pod_ip.clone()?)))
        .collect();
    let polls = futures::stream::iter(running)
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
        .await;
    Ok(Observed { jobs, pods, live: polls, users: users(ctx, &ns, &name).await? })
}

/// The live (not Succeeded or Failed) runs in `ns` whose mix names dataset `name`.
async fn users(ctx: &Context, ns: &str, name: &str) -> Result<Vec<String>, Error> {
    let runs = Api::<TrainingRun>::namespaced(ctx.client.clone(), ns)
        .list(&ListParams::default())
        .await
        .map_err(Error::kube(Verb::List, "TrainingRun", ns, name))?;
    let mut users: Vec<String> = runs
        .items
        .iter()
        .filter(|r| crds::resolve::named_datasets(r).iter().any(|d| d == name))
        .filter(|r| {
            let phase = r.status.as_ref().and_then(|s| s.phase);
            !matches!(phase, Some(RunPhase::Succeeded | RunPhase::Failed)) && r.meta().deletion_timestamp.is_none()
        })
        .map(|r| r.name_any())
        .collect();
    users.sort();
    Ok(users)
}

async fn write_status(
    ctx: &Context,
    ds: &TrainingDataset,
    status: &crds::types::TrainingDatasetStatus,
) -> Result<(), Error> {
    let (ns, name) = (ds.namespace().unwrap_or_default(), ds.name_any());
    let patch = json!({
        "apiVersion": TrainingDataset::api_version(&()),
        "kind": TrainingDataset::kind(&()),
        "metadata": {"name": name, "resourceVersion": ds.resource_version()},
        "status": status,
    });
    Api::<TrainingDataset>::namespaced(ctx.client.clone(), &ns)
        .patch_status(&name, &apply::params(), &Patch::Apply(&patch))
        .await
        .map_err(Error::kube(Verb::ApplyStatus, "TrainingDataset", &ns, &name))?;
    Ok(())
}

async fn publish(ctx: &Context, ds: &TrainingDataset, warning: bool, reason: &str, note: &str) {
    let event = Event {
        type_: if warning { EventType::Warning } else { EventType::Normal },
        reason: reason.into(),
        note: Some(note.chars().take(1000).collect()),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &ds.object_ref(&()), ctx.clock.now()).await {
        tracing::warn!(dataset = %ds.name_any(), "publishing event {reason}: {e}");
    }
}

/// Retries with backoff; a refused deletion waits quietly for its runs (the event was
/// published once).
pub fn error_policy(ds: Arc<TrainingDataset>, err: &Error, ctx: Arc<Context>) -> Action {
    if let Error::InUse { .. } = err {
        return Action::requeue(Duration::from_secs(15));
    }
    tracing::warn!(dataset = %ds.name_any(), reason = err.reason(), "reconcile failed: {err}");
    let (reason, message) = (err.reason(), err.to_string());
    tokio::spawn(async move { publish(&ctx, &ds, true, reason, &message).await });
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
