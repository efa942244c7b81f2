//! The kube-runtime Controller of TrainingRuns: its watches and triggers, the finalizer
//! that routes a live run to [`reconcile::pipeline`] and a deleted one to its cleanup,
//! and the error policy.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crds::TrainingRun;
use crds::types::TrainingDataset;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{self, finalizer};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};

use crate::cache::{Cache, Caches, Trim};
use crate::context::Context;
use crate::dependents::Dependents;
use crate::resources::{self, RUN_LABEL};
use crate::{Error, reconcile};

/// Finalizer on every TrainingRun: deletion drops the run's metrics series.
pub const FINALIZER: &str = "training.puretransformer.dev/cleanup";

/// Reconciles one TrainingRun. The finalizer routes deletion to [`cleanup`].
pub async fn reconcile(run: Arc<TrainingRun>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let ns = run.namespace().ok_or_else(|| Error::NoNamespace(run.name_any()))?;
    let api: Api<TrainingRun> = Api::namespaced(ctx.client.clone(), &ns);
    let result = finalizer(&api, FINALIZER, run.clone(), |event| async {
        match event {
            finalizer::Event::Apply(run) => reconcile::pipeline(run, ctx.clone()).await,
            finalizer::Event::Cleanup(run) => cleanup(run, ctx.clone()).await,
        }
    })
    .await
    .map_err(|e| match e {
        finalizer::Error::ApplyFailed(e) | finalizer::Error::CleanupFailed(e) => e,
        other => Error::Finalizer { name: run.name_any(), message: other.to_string() },
    });
    ctx.metrics.reconciled(result.is_ok(), started.elapsed().as_secs_f64());
    result
}

async fn cleanup(run: Arc<TrainingRun>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = run.namespace().unwrap_or_default();
    ctx.metrics.forget_run(&ns, &run.name_any());
    if let Some(uid) = run.uid() {
        ctx.forget(&uid);
    }
    let retained = run.spec.checkpoint.retain_on_delete;
    let note = if retained {
        format!("deleted; PVC {} is kept (checkpoint.retainOnDelete)", resources::pvc_name(&run.name_any()))
    } else {
        "deleted with its Job, Service, ConfigMap and checkpoint PVC".into()
    };
    ctx.publish(&*run, false, "Deleted", &note).await;
    Ok(Action::await_change())
}

/// Fails with the install command when the TrainingRun or TrainingDataset CRD is missing.
pub async fn check_crd(client: &Client) -> Result<(), Error> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::CustomResourceExt;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in [TrainingRun::crd_name(), crds::types::TrainingDataset::crd_name()] {
        api.get(crd).await.map_err(|source| Error::CrdMissing { crd: crd.to_string(), source })?;
    }
    Ok(())
}

/// Retries with backoff and reports the error on the run; a conflict (planned on an
/// older run) is planned again at once, unreported.
pub fn error_policy(run: Arc<TrainingRun>, err: &Error, ctx: Arc<Context>) -> Action {
    if err.is_conflict() {
        tracing::debug!(run = %run.name_any(), "planned on an older run; planning again: {err}");
        return Action::requeue(Duration::from_millis(200));
    }
    tracing::warn!(run = %run.name_any(), reason = err.reason(), "reconcile failed: {err}");
    let (run, ctx, reason, message) = (run.clone(), ctx.clone(), err.reason(), err.to_string());
    // Events are best effort; the error already went to the log.
    tokio::spawn(async move { ctx.publish(&*run, true, reason, &message).await });
    Action::requeue(Duration::from_secs(5))
}

/// Runs the controller until `shutdown` resolves. `namespace` limits it to one namespace.
/// Every watch feeds a store of [`crate::cache`] before it triggers reconciles, which
/// read those stores.
pub async fn run(
    ctx: Arc<Context>,
    namespace: Option<String>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let owned = watcher::Config::default().labels(&resources::owned_selector());
    let (runs_store, writer) = reflector::store();
    let runs = Cache::new(runs_store);
    // A run waiting on `initFrom.trainingRun` wakes when that run changes.
    let (wake, woken) = futures::channel::mpsc::unbounded();
    let mut dependents = Dependents::default();
    let run_events = watcher(api::<TrainingRun>(&client, &namespace), watcher::Config::default().any_semantic())
        .default_backoff()
        .map_ok(move |event| {
            for run in dependents.observe(&event) {
                // Err: the controller has stopped, and wakes nobody.
                let _ = wake.unbounded_send(run);
            }
            event
        })
        .modify(Trim::trim)
        .reflect(writer);
    let triggers = runs.track(run_events).applied_objects();
    let (jobs, job_events) = cached(api::<Job>(&client, &namespace), owned.clone());
    let (configmaps, configmap_events) = cached(api::<ConfigMap>(&client, &namespace), owned.clone());
    let (services, service_events) = cached(api::<Service>(&client, &namespace), owned.clone());
    let (claims, claim_events) = cached(api::<PersistentVolumeClaim>(&client, &namespace), owned.clone());
    let (pods, pod_events) = cached(api::<Pod>(&client, &namespace), watcher::Config::default().labels(RUN_LABEL));
    let (datasets, dataset_events) = cached(api::<TrainingDataset>(&client, &namespace), watcher::Config::default());
    // Only with --network-policy: the chart grants access to NetworkPolicies only then.
    let (network_policies, policy_events) = match ctx.settings.network_policy {
        Some(_) => {
            let (cache, events) = cached(api::<NetworkPolicy>(&client, &namespace), owned);
            (Some(cache), Some(events))
        }
        None => (None, None),
    };
    let caches = Caches { runs: runs.clone(), datasets, jobs, pods, configmaps, claims, services, network_policies };
    let by_dataset = runs.store.clone();
    let _ = ctx.caches.set(caches);
    let mut controller = Controller::for_stream(triggers, runs.store.clone())
        .reconcile_on(woken)
        .with_config(kube::runtime::controller::Config::default().concurrency(ctx.settings.concurrency))
        .owns_stream(job_events)
        .owns_stream(configmap_events)
        .owns_stream(service_events)
        .owns_stream(claim_events);
    if let Some(events) = policy_events {
        controller = controller.owns_stream(events);
    }
    controller
        .watches_stream(pod_events, |pod: Pod| {
            let run = pod.labels().get(RUN_LABEL).cloned();
            run.map(|r| ObjectRef::<TrainingRun>::new(&r).within(&pod.namespace().unwrap_or_default()))
        })
        // A run waiting for TrainingDatasets wakes when one of them changes.
        .watches_stream(dataset_events, move |ds: TrainingDataset| {
            let (ns, name) = (ds.namespace().unwrap_or_default(), ds.name_any());
            by_dataset
                .state()
                .into_iter()
                .filter(|r| r.namespace().as_deref() == Some(ns.as_str()))
                .filter(|r| crds::resolve::named_datasets(r).contains(&name))
                .map(|r| ObjectRef::from_obj(&*r))
                .collect::<Vec<_>>()
        })
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            match res {
                Ok((obj, _)) => tracing::debug!(run = %obj.name, "reconciled"),
                Err(e) => tracing::debug!("reconcile: {e}"),
            }
        })
        .await;
}

fn api<K: Resource<Scope = k8s_openapi::NamespaceResourceScope>>(c: &Client, ns: &Option<String>) -> Api<K>
where
    K::DynamicType: Default,
{
    match ns {
        Some(ns) => Api::namespaced(c.clone(), ns),
        None => Api::all(c.clone()),
    }
}

/// A watch of `api` feeding a store of its own, of objects trimmed to what reconciles
/// read ([`Trim`]), and its objects as triggers.
fn cached<K>(
    api: Api<K>,
    config: watcher::Config,
) -> (Cache<K>, impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static)
where
    K: Trim
        + Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    let cache = Cache::new(store);
    let events = watcher(api, config).default_backoff().modify(K::trim).reflect(writer);
    let triggers = cache.track(events).applied_objects();
    (cache, triggers)
}
