//! The reconcile pipeline and the kube-runtime Controller that drives it:
//! validate → build → apply → observe → decide → status.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crds::types::RunPhase;
use crds::types::TrainingDataset;
use crds::{RunConfig, TrainingRun};
use futures::{StreamExt, TryStreamExt};
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DynamicObject, Patch};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Reporter};
use kube::runtime::finalizer::{self, finalizer};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use crate::change::{self, Change, Claim};
use crate::clock::{Clock, seconds_between};
use crate::decide::{self, Decision};
use crate::dependents::Dependents;
use crate::events::Recorder;
use crate::metrics::Metrics;
use crate::mix_datasets::{self, Gate};
use crate::observe::{self, Observed, Poll, PollError, StatusClient};
use crate::resources::{self, Inputs, RUN_LABEL, workload};
use crate::settings::Settings;
use crate::status::{self, is_terminal};
use crate::{Error, MANAGER, Verb, apply, validate};

/// Finalizer on every TrainingRun: deletion drops the run's metrics series.
pub const FINALIZER: &str = "training.puretransformer.dev/cleanup";

/// Per-run memory between reconciles (lost on restart, which only means an early poll).
#[derive(Clone, Debug, Default)]
struct Memory {
    last_poll: Option<Timestamp>,
    last_write: Option<Timestamp>,
    /// The last Warning event about a refused answer of rank 0's.
    last_refusal_event: Option<Timestamp>,
}

pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub settings: Settings,
    pub metrics: Arc<Metrics>,
    pub clock: Arc<dyn Clock>,
    pub status_client: StatusClient,
    memory: Mutex<HashMap<String, Memory>>,
}

impl Context {
    pub fn new(client: Client, settings: Settings, metrics: Arc<Metrics>, clock: Arc<dyn Clock>) -> Arc<Context> {
        let reporter = Reporter { controller: MANAGER.into(), instance: std::env::var("POD_NAME").ok() };
        Arc::new(Context {
            recorder: Recorder::new(client.clone(), reporter),
            status_client: StatusClient::new(settings.status_timeout),
            client,
            settings,
            metrics,
            clock,
            memory: Mutex::new(HashMap::new()),
        })
    }

    fn memory(&self, uid: &str) -> Memory {
        self.memory.lock().expect("memory lock").get(uid).cloned().unwrap_or_default()
    }

    fn remember(&self, uid: &str, f: impl FnOnce(&mut Memory)) {
        f(self.memory.lock().expect("memory lock").entry(uid.to_string()).or_default());
    }

    fn forget(&self, uid: &str) {
        self.memory.lock().expect("memory lock").remove(uid);
    }

    async fn publish(&self, run: &TrainingRun, warning: bool, reason: &str, note: &str) {
        let event = Event {
            type_: if warning { EventType::Warning } else { EventType::Normal },
            reason: reason.into(),
            note: Some(note.chars().take(1000).collect()),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &run.object_ref(&()), self.clock.now()).await {
            tracing::warn!(run = %run.name_any(), "publishing event {reason}: {e}");
        }
    }
}

/// Reconciles one TrainingRun. The finalizer routes deletion to [`cleanup`].
pub async fn reconcile(run: Arc<TrainingRun>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let ns = run.namespace().ok_or_else(|| Error::NoNamespace(run.name_any()))?;
    let api: Api<TrainingRun> = Api::namespaced(ctx.client.clone(), &ns);
    let result = finalizer(&api, FINALIZER, run.clone(), |event| async {
        match event {
            finalizer::Event::Apply(run) => pipeline(run, ctx.clone()).await,
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
    ctx.publish(&run, false, "Deleted", &note).await;
    Ok(Action::await_change())
}

/// The pipeline for a live run.
async fn pipeline(cached: Arc<TrainingRun>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = cached.namespace().unwrap_or_default();
    let name = cached.name_any();
    let runs: Api<TrainingRun> = Api::namespaced(ctx.client.clone(), &ns);
    // The reflector may lag our own status writes; decide on the live object.
    let Some(run) = runs.get_opt(&name).await.map_err(Error::kube(Verb::Get, "TrainingRun", &ns, &name))? else {
        return Ok(Action::await_change());
    };
    let uid = run.uid().unwrap_or_default();
    let now = ctx.clock.now();
    let old = run.status.clone().unwrap_or_default();

    // 0. the TrainingDatasets its mix names: their manifests, or why it waits.
    // A run that ended waits for nothing: it keeps its status (with placeholders where
    // its datasets are gone).
    let names_datasets = !crds::resolve::named_datasets(&run).is_empty();
    let ended = matches!(old.phase, Some(RunPhase::Succeeded | RunPhase::Failed));
    let (run, waiting) = if names_datasets {
        let found = mix_datasets::look_up(&ctx.client, &run).await?;
        match mix_datasets::judge(&run, &found, old.attempt > 0) {
            Gate::Ready(ready) => (ready, None),
            Gate::Waiting { run, message } => (run, (!ended).then_some(message)),
        }
    } else {
        (run, None)
    };

    // 1. validate
    let wanted = validate::validate(&run, old.attempt);
    if let (Some(message), Ok(_)) = (&waiting, &wanted) {
        let d = decide::waiting_for_datasets(&run, message, now);
        return finish(&ctx, &runs, &run, d, None, Some(Some(message)), now).await;
    }
    let s = &ctx.settings;
    // What the run's attempts run under, and whether the spec may change it (a run that
    // failed is final; one that succeeded may be given more tokens).
    let ended = is_terminal(&old) && old.phase != Some(RunPhase::Succeeded);
    let live = if ended { observe::Accepted::default() } else { observe::accepted(&ctx.client, &run).await? };
    let (wanted, change) = match (wanted, &live.config) {
        (Ok(wanted), _) => {
            let claim = live.claim.clone().map(|modes| Claim {
                name: resources::pvc_name(&name),
                modes,
                wanted: resources::access_mode(&run.spec, &wanted),
            });
            let trained = old.progress.as_ref().map_or(0, |p| p.tokens);
            let change = change::admit(live.config.as_ref(), &wanted, claim.as_ref(), trained);
            (wanted, change)
        }
        // An edit that no longer resolves is refused while an accepted config runs.
        (Err(invalid), Some(accepted)) if !is_terminal(&old) => {
            (RunConfig { attempt: old.attempt.max(1), ..accepted.clone() }, change::unresolvable(&invalid, accepted))
        }
        (Err(invalid), _) => {
            let d = decide::invalid(&run, &invalid, now);
            return finish(&ctx, &runs, &run, d, None, None, now).await;
        }
    };
    // A refused change leaves the run under the accepted config.
    let cfg = match (&change, live.config) {
        (Change::Refused { .. }, Some(accepted)) => RunConfig { attempt: wanted.attempt, ..accepted },
        _ => wanted,
    };
    let restart = matches!(change, Change::Restart { .. });
    if !is_terminal(&old) {
        // 2. build, 3. apply. A config the gang restarts for is written once the
        // restart is recorded (below), so a crash in between cannot lose it.
        let inputs = Inputs { run: &run, cfg: &cfg, trainer_image: &s.trainer_image };
        // The ConfigMap and the claim were read by `observe::accepted` above.
        if !restart {
            let configmaps = Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns);
            apply::ensure_over(&configmaps, live.configmap_hash.clone(), resources::configmap(&inputs)).await?;
        }
        apply::ensure(&Api::<Service>::namespaced(ctx.client.clone(), &ns), resources::service(&inputs)).await?;
        let mut pvc = resources::pvc(&inputs);
        if let (Some(modes), Some(spec)) = (&live.claim, pvc.spec.as_mut()) {
            // A claim's access modes never change; a ReadWriteMany claim serves one node too.
            spec.access_modes = Some(modes.clone());
        }
        let claims = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &ns);
        apply::ensure_over(&claims, live.claim_hash.clone(), pvc).await?;
        if let Some(operator_ns) = &s.network_policy {
            let policies = Api::<NetworkPolicy>::namespaced(ctx.client.clone(), &ns);
            let scraper = s.scrape_namespace.as_deref();
            apply::ensure(&policies, resources::network_policy(&inputs, operator_ns, scraper)).await?;
        }
    }

    // 4. observe
    let mut obs: Observed =
        if is_terminal(&old) { Observed::default() } else { observe::observe(&ctx.client, &run, &cfg).await? };
    let poll_due =
        ctx.memory(&uid).last_poll.is_none_or(|t| seconds_between(t, now) >= s.status_poll_interval.as_secs());
    if poll_due {
        let job_name = resources::job_name(&name, cfg.attempt);
        let url = s.status_url_for(&name, &ns, &job_name, &resources::service_name(&name));
        let poll = observe::poll_rank0(&ctx.status_client, &mut obs, &cfg, &url, &name).await;
        if poll.asked() {
            ctx.remember(&uid, |m| m.last_poll = Some(now));
        }
        if poll == Poll::Answered && cfg.topology.nodes > 1 {
            obs.links = Some(observe::probe_links(&ctx.status_client, &obs, cfg.attempt).await);
        }
        if let Poll::Failed(PollError::Refused(message)) = &poll
            && observe::refusal_event_due(ctx.memory(&uid).last_refusal_event, now)
        {
            ctx.remember(&uid, |m| m.last_refusal_event = Some(now));
            ctx.publish(&run, true, observe::STATUS_REFUSED, message).await;
        }
    }

    // 5. decide, then act
    let d = decide::decide(&decide::Situation { run: &run, cfg: &cfg, obs: &obs, now, settings: s, change: &change });
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
    // Status first: a restart is recorded before its Job goes, so a crash in between
    // cannot lose or double-count it.
    let checkpoint_every_tokens = u64::from(cfg.checkpoint.every_steps) * cfg.batch.tokens_per_step;
    let datasets = names_datasets.then_some(waiting.as_deref());
    let action = finish(&ctx, &runs, &run, d.clone(), Some(checkpoint_every_tokens), datasets, now).await?;
    if restart {
        let inputs = Inputs { run: &run, cfg: &cfg, trainer_image: &s.trainer_image };
        apply::ensure(&Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns), resources::configmap(&inputs)).await?;
    }
    for stale in &d.delete_jobs {
        apply::delete(&jobs, &ns, stale).await?;
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    for orphan in &d.delete_pods {
        apply::delete(&pods, &ns, orphan).await?;
    }
    let queued = run.spec.queue_name.is_some();
    if let Some(suspend) = d.suspend_job {
        let current = resources::job_name(&name, d.status.attempt);
        if let Some(live) = obs.jobs.iter().find(|j| j.name_any() == current) {
            apply::write(&jobs, resources::suspension(live, suspend, queued)).await?;
        }
    }
    if let (Some(active), Some(w)) = (d.workload_active, &obs.workload) {
        let workloads = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &ns, &workload::api_resource());
        workloads
            .patch(&w.name, &apply::params(), &Patch::Apply(workload::activation(&w.name, &ns, active)))
            .await
            .map_err(Error::kube(Verb::Apply, "Workload", &ns, &w.name))?;
    }
    if d.create_job {
        // The ConfigMap applied above already holds this attempt: see `Decision::create_job`.
        let inputs = Inputs { run: &run, cfg: &cfg, trainer_image: &s.trainer_image };
        apply::ensure(&jobs, resources::job(&inputs, run.spec.suspend || queued)).await?;
    }
    Ok(action)
}

/// Writes the decided status (rate-limited when only progress moved), emits the
/// decision's events, updates metrics and picks the requeue.
/// `checkpoint_every_tokens` is None for a spec that does not resolve. `datasets` is
/// None for a run whose mix names no TrainingDataset, else why it waits for them (None:
/// they are Ready).
async fn finish(
    ctx: &Context,
    runs: &Api<TrainingRun>,
    run: &TrainingRun,
    d: Decision,
    checkpoint_every_tokens: Option<u64>,
    datasets: Option<Option<&str>>,
    now: Timestamp,
) -> Result<Action, Error> {
    let ns = run.namespace().unwrap_or_default();
    let name = run.name_any();
    let uid = run.uid().unwrap_or_default();
    let old = run.status.clone().unwrap_or_default();
    let s = &ctx.settings;
    let mut d = d;
    if let Some(waiting) = datasets {
        mix_datasets::with_waiting_condition(&old, &mut d.status, waiting, run.metadata.generation, now);
    }
    let significant = status::significant_change(&old, &d.status);
    let progressed = old != d.status;
    let last_write = ctx.memory(&uid).last_write;
    let write_due = last_write.is_none_or(|t| seconds_between(t, now) >= s.status_write_interval.as_secs());
    if significant || (progressed && write_due) {
        let patch = json!({
            "apiVersion": TrainingRun::api_version(&()),
            "kind": TrainingRun::kind(&()),
            "metadata": {"name": name, "resourceVersion": run.resource_version()},
            "status": d.status,
        });
        runs.patch_status(&name, &apply::params(), &Patch::Apply(&patch)).await.map_err(Error::kube(
            Verb::ApplyStatus,
            "TrainingRun",
            &ns,
            &name,
        ))?;
        ctx.remember(&uid, |m| m.last_write = Some(now));
    }
    // The gauges follow the status just written, before the events take their round trips.
    ctx.metrics.observe_run(&ns, &name, &d.status, checkpoint_every_tokens);
    for note in &d.notes {
        ctx.publish(run, note.warning, &note.reason, &note.message).await;
    }
    let requeue = match d.status.phase {
        Some(RunPhase::Running) => s.status_poll_interval,
        Some(RunPhase::Succeeded | RunPhase::Failed) if is_terminal(&d.status) => s.requeue_interval,
        _ if progressed && !significant => s.status_write_interval,
        Some(RunPhase::Pending) => s.pending_timeout.min(Duration::from_secs(60)),
        _ => Duration::from_secs(30).min(s.requeue_interval),
    };
    Ok(Action::requeue(requeue))
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

/// Retries with backoff and reports the error on the run.
pub fn error_policy(run: Arc<TrainingRun>, err: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(run = %run.name_any(), reason = err.reason(), "reconcile failed: {err}");
    let (run, ctx, reason, message) = (run.clone(), ctx.clone(), err.reason(), err.to_string());
    // Events are best effort; the error already went to the log.
    tokio::spawn(async move { ctx.publish(&run, true, reason, &message).await });
    Action::requeue(Duration::from_secs(5))
}

/// Drops from a cached run what no trigger or finalizer step reads: a reconcile works
/// on the live object it GETs, and the cache only routes events, carries the finalizer
/// and deletion state, and `spec` (for `initFrom` and the cleanup note). `managedFields`,
/// the client-side-apply annotation (a second copy of the spec) and `status` are most of
/// a run's bytes, and the cache holds every run.
pub fn trim_for_cache(run: &mut TrainingRun) {
    run.managed_fields_mut().clear();
    run.annotations_mut().remove(LAST_APPLIED);
    run.status = None;
}

/// The annotation `kubectl apply` (client-side) and Argo CD write: the whole manifest again.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Runs the controller until `shutdown` resolves. `namespace` limits it to one namespace.
pub async fn run(
    ctx: Arc<Context>,
    namespace: Option<String>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    fn api<K: Resource<Scope = k8s_openapi::NamespaceResourceScope>>(c: &Client, ns: &Option<String>) -> Api<K>
    where
        K::DynamicType: Default,
    {
        match ns {
            Some(ns) => Api::namespaced(c.clone(), ns),
            None => Api::all(c.clone()),
        }
    }
    let runs: Api<TrainingRun> = api(&client, &namespace);
    let owned = watcher::Config::default().labels("app.kubernetes.io/managed-by=trainingrun-operator");
    let (store, writer) = reflector::store();
    // A run waiting on `initFrom.trainingRun` wakes when that run changes.
    let (wake, woken) = futures::channel::mpsc::unbounded();
    let mut dependents = Dependents::default();
    let triggers = watcher(runs, watcher::Config::default().any_semantic())
        .default_backoff()
        .map_ok(move |event| {
            for run in dependents.observe(&event) {
                // Err: the controller has stopped, and wakes nobody.
                let _ = wake.unbounded_send(run);
            }
            event
        })
        .modify(trim_for_cache)
        .reflect(writer)
        .applied_objects();
    let cached = store.clone();
    let controller = Controller::for_stream(triggers, store)
        .reconcile_on(woken)
        .with_config(kube::runtime::controller::Config::default().concurrency(ctx.settings.concurrency));
    let mut controller = controller
        .owns(api::<Job>(&client, &namespace), owned.clone())
        .owns(api::<ConfigMap>(&client, &namespace), owned.clone())
        .owns(api::<Service>(&client, &namespace), owned.clone())
        .owns(api::<PersistentVolumeClaim>(&client, &namespace), owned.clone());
    // Only with --network-policy: the chart grants access to NetworkPolicies only then.
    if ctx.settings.network_policy.is_some() {
        controller = controller.owns(api::<NetworkPolicy>(&client, &namespace), owned);
    }
    controller
        .watches(api::<Pod>(&client, &namespace), watcher::Config::default().labels(RUN_LABEL), |pod: Pod| {
            let run = pod.labels().get(RUN_LABEL).cloned();
            run.map(|r| ObjectRef::<TrainingRun>::new(&r).within(&pod.namespace().unwrap_or_default()))
        })
        // A run waiting for TrainingDatasets wakes when one of them changes.
        .watches(api::<TrainingDataset>(&client, &namespace), watcher::Config::default(), move |ds: TrainingDataset| {
            let (ns, name) = (ds.namespace().unwrap_or_default(), ds.name_any());
            cached
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::testing::{GRPO_SPEC, run};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, Time};

    #[test]
    fn the_cache_keeps_what_triggers_and_the_finalizer_read() {
        let mut r = run(GRPO_SPEC);
        r.metadata.managed_fields =
            Some(vec![ManagedFieldsEntry { manager: Some(MANAGER.into()), ..Default::default() }]);
        r.metadata.annotations =
            Some([(LAST_APPLIED.to_string(), "{...}".to_string()), ("team".to_string(), "nlp".to_string())].into());
        r.metadata.finalizers = Some(vec![FINALIZER.into()]);
        r.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        r.metadata.resource_version = Some("42".into());
        r.status = Some(crds::types::TrainingRunStatus { attempt: 3, ..Default::default() });
        let spec = serde_json::to_value(&r.spec).unwrap();

        trim_for_cache(&mut r);

        assert!(r.managed_fields().is_empty());
        assert_eq!(r.annotations().keys().collect::<Vec<_>>(), ["team"]);
        assert_eq!(r.status, None, "reconciles read the status of the live object");
        assert_eq!(r.finalizers(), [FINALIZER]);
        assert!(r.metadata.deletion_timestamp.is_some());
        assert_eq!((r.name_any(), r.namespace(), r.uid()), ("llm".into(), Some("ml".into()), Some("0d5c-uid".into())));
        assert_eq!(r.resource_version().as_deref(), Some("42"));
        assert_eq!(serde_json::to_value(&r.spec).unwrap(), spec);
        assert_eq!(r.spec.init_from.and_then(|i| i.training_run).as_deref(), Some("base"));
    }
}
