//! What a reconcile reads, and only that, from the watches' caches or the API
//! ([`crate::cache`]): the run, the TrainingDatasets its mix
//! names, what its attempts run under (ConfigMap and claim), its Service and
//! NetworkPolicy's applied-hashes, its Jobs and pods, its init run, its Kueue Workload,
//! and rank 0's `/status` when a poll is due. What to read next depends on the config
//! admitted, which the pure `decide::admission` says.

use crds::config::ResolvedInit;
use crds::contract::CONFIG_KEY;
use crds::types::{RunPhase, TrainingDataset};
use crds::{RunConfig, TrainingRun};
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DynamicObject, ListParams};
use kube::{Client, ResourceExt};

use crate::cache::{Cached, Source};
use crate::context::Context;
use crate::decide::{admission, poll_due, reads_accepted};
use crate::mix_datasets::{self, Gate};
use crate::observe;
use crate::observed::{Accepted, Admission, Attempts, Datasets, InitRun, Observed, Poll};
use crate::resources::{self, QueuedWorkload, applied_hash, workload};
use crate::status::is_terminal;
use crate::{Error, Verb};

/// What one reconcile reads.
pub enum Gathered {
    Observed(Box<Observed>),
    /// The run is gone.
    Gone,
    /// A store has yet to show one of the operator's writes of the run.
    Deferred,
}

/// What one reconcile of `cached` at `now` reads.
pub async fn gather(ctx: &Context, cached: &TrainingRun, now: Timestamp) -> Result<Gathered, Error> {
    let (ns, name) = (cached.namespace().unwrap_or_default(), cached.name_any());
    let Some(source) = ctx.source(&ns, &cached.uid().unwrap_or_default()).await else {
        return Ok(Gathered::Deferred);
    };
    let Some(live) = get::<TrainingRun>(&source, &ns, &name).await? else {
        return Ok(Gathered::Gone);
    };
    let (run, datasets) = datasets(&source, live).await?;
    let accepted = if reads_accepted(&run) { read_accepted(&source, &run).await? } else { Accepted::default() };
    let admission = admission(&run, &datasets, &accepted);
    let memory = ctx.memory(&run.uid().unwrap_or_default());
    let mut o = Observed::new(run, datasets, accepted, admission, memory);
    // A run that waits, is invalid or has ended has no attempts to read.
    let cfg = match &o.admission {
        Admission::Admitted { cfg, .. } if !is_terminal(&o.run.status.clone().unwrap_or_default()) => {
            cfg.as_ref().clone()
        }
        _ => return Ok(Gathered::Observed(Box::new(o))),
    };
    o.service_hash = live_hash::<Service>(&source, &ns, &resources::service_name(&name)).await?;
    if ctx.settings.network_policy.is_some() {
        o.network_policy_hash = live_hash::<NetworkPolicy>(&source, &ns, &resources::service_name(&name)).await?;
    }
    o.attempts = attempts(&source, &o.run, &cfg).await?;
    poll(ctx, &mut o, &cfg, now).await;
    Ok(Gathered::Observed(Box::new(o)))
}

/// The run with its TrainingDatasets' URIs in place, and whether it waits for them. A
/// run that ended waits for nothing: it keeps its status, with placeholders where its
/// datasets are gone.
async fn datasets(source: &Source<'_>, run: TrainingRun) -> Result<(TrainingRun, Datasets), Error> {
    if crds::resolve::named_datasets(&run).is_empty() {
        return Ok((run, Datasets::Unnamed));
    }
    let old = run.status.clone().unwrap_or_default();
    let ended = matches!(old.phase, Some(RunPhase::Succeeded | RunPhase::Failed));
    let ns = run.namespace().unwrap_or_default();
    let mut found = std::collections::BTreeMap::new();
    for name in crds::resolve::named_datasets(&run) {
        let ds = get::<TrainingDataset>(source, &ns, &name).await?;
        found.insert(name, ds);
    }
    Ok(match mix_datasets::judge(&run, &found, old.attempt > 0) {
        Gate::Ready(ready) => (ready, Datasets::Ready),
        Gate::Waiting { run, .. } if ended => (run, Datasets::Ready),
        Gate::Waiting { run, message } => (run, Datasets::Waiting(message)),
    })
}

/// The run's ConfigMap and checkpoint claim.
async fn read_accepted(source: &Source<'_>, run: &TrainingRun) -> Result<Accepted, Error> {
    let (ns, name) = (run.namespace().unwrap_or_default(), run.name_any());
    let cm_name = resources::configmap_name(&name);
    let cm = get::<ConfigMap>(source, &ns, &cm_name).await?;
    let configmap_hash = cm.as_ref().and_then(applied_hash);
    let text = cm.and_then(|c| c.data).and_then(|mut d| d.remove(CONFIG_KEY));
    let config = text.and_then(|t| match serde_json::from_str::<RunConfig>(&t) {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!(run = %name, "ConfigMap {cm_name} does not hold a config this operator reads ({e}); rewriting it");
            None
        }
    });
    let live_claim = get::<PersistentVolumeClaim>(source, &ns, &resources::pvc_name(&name)).await?;
    let claim_hash = live_claim.as_ref().and_then(applied_hash);
    let claim = live_claim.map(|c| c.spec.and_then(|s| s.access_modes).unwrap_or_default());
    Ok(Accepted { config, claim, configmap_hash, claim_hash })
}

/// The run's Jobs and pods (every attempt), the state of its init run, and the Kueue
/// Workload of its current Job.
async fn attempts(source: &Source<'_>, run: &TrainingRun, cfg: &RunConfig) -> Result<Attempts, Error> {
    let (ns, name) = (run.namespace().unwrap_or_default(), run.name_any());
    let jobs = source.of_run::<Job>(&ns, &name).await.map_err(Error::kube(Verb::List, "Job", &ns, &name))?;
    let pods = source.of_run::<Pod>(&ns, &name).await.map_err(Error::kube(Verb::List, "Pod", &ns, &name))?;
    let init_run = match &cfg.init_from {
        Some(ResolvedInit::TrainingRun { name: init }) => Some(match get::<TrainingRun>(source, &ns, init).await? {
            None => InitRun::Missing,
            Some(o) => InitRun::Phase(o.status.and_then(|s| s.phase)),
        }),
        _ => None,
    };
    let workload = match &run.spec.queue_name {
        Some(_) => {
            let current = jobs.iter().find(|j| j.name_any() == resources::job_name(&name, cfg.attempt));
            queued_workload(source.client, &ns, current).await?
        }
        None => None,
    };
    Ok(Attempts { jobs, pods, init_run, trainer: None, links: None, workload })
}

/// The Kueue Workload of the current attempt's Job, by the label Kueue gives it. None
/// before the Job or its Workload exist, and where Kueue's API is not served.
async fn queued_workload(client: &Client, ns: &str, current: Option<&Job>) -> Result<Option<QueuedWorkload>, Error> {
    let Some(uid) = current.and_then(|j| j.metadata.uid.clone()) else { return Ok(None) };
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &workload::api_resource());
    let lp = ListParams::default().labels(&format!("{}={uid}", workload::JOB_UID_LABEL));
    match api.list(&lp).await {
        Ok(list) => Ok(list.items.first().map(QueuedWorkload::read)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(Error::kube(Verb::List, "Workload", ns, &uid)(e)),
    }
}

/// Rank 0's `/status` into `o.attempts.trainer` when a poll is due and rank 0 runs, and,
/// when it answered for a gang of several nodes, the links of its pods. A poll asked is
/// remembered at once: a failed reconcile still waits the poll interval.
async fn poll(ctx: &Context, o: &mut Observed, cfg: &RunConfig, now: Timestamp) {
    if !poll_due(&o.memory, now, &ctx.settings) {
        return;
    }
    let (ns, name) = (o.run.namespace().unwrap_or_default(), o.run.name_any());
    let job = resources::job_name(&name, cfg.attempt);
    let url = ctx.settings.status_url_for(&name, &ns, &job, &resources::service_name(&name));
    o.poll = observe::poll_rank0(&ctx.status_client, &mut o.attempts, cfg, &url, &name).await;
    if o.poll.asked() {
        o.memory.last_poll = Some(now);
        ctx.remember(&o.run.uid().unwrap_or_default(), o.memory.clone());
    }
    if o.poll == Poll::Answered && cfg.topology.nodes > 1 {
        o.attempts.links = Some(observe::probe_links(&ctx.status_client, &o.attempts, cfg.attempt).await);
    }
}

/// The object `name` in `ns`, `None` where it does not exist.
async fn get<K: Cached>(source: &Source<'_>, ns: &str, name: &str) -> Result<Option<K>, Error> {
    source.get::<K>(ns, name).await.map_err(Error::kube(Verb::Get, K::kind(&()), ns, name))
}

/// The applied-hash of the object `name` in `ns`.
async fn live_hash<K: Cached>(source: &Source<'_>, ns: &str, name: &str) -> Result<Option<String>, Error> {
    Ok(get::<K>(source, ns, name).await?.as_ref().and_then(applied_hash))
}
