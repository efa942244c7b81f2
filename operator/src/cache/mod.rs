//! What the watches have seen, for reconciles to read instead of the API: one
//! reflector store per kind the controller watches, each with whether it is fresh (it
//! has listed whole, and its watch has not failed since), and the operator's own writes
//! that a run's next reconcile must see ([`Expectations`]).
//!
//! A reconcile reads the caches only when every store is fresh and shows the run's last
//! writes. A store that lags a write (the watch's event is on its way) defers the
//! reconcile until it shows it, and the API is read only where one lags by more than
//! [`STORE_LAG_LIMIT`]; a watch that is re-listing after an outage, or a new leader whose
//! stores are still listing, reads the API, as it would with no cache. So no decision is
//! fed stale objects of the operator's own making, and a busy API server is not asked
//! again for what its watches are about to deliver.

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crds::TrainingRun;
use crds::types::TrainingDataset;
use futures::{Stream, StreamExt};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;

use crate::resources::RUN_LABEL;

mod expectations;
mod trim;
pub use expectations::{Expectations, Expected, Kind, Reading, STORE_LAG_LIMIT};
pub use trim::{LAST_APPLIED, Trim};

/// One kind's store, and whether it may be read.
#[derive(Clone)]
pub struct Cache<K: Resource<DynamicType = ()> + Clone + 'static> {
    pub store: Store<K>,
    fresh: Arc<AtomicBool>,
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Cache<K> {
    pub fn new(store: Store<K>) -> Cache<K> {
        Cache { store, fresh: Arc::new(AtomicBool::new(false)) }
    }

    /// Marks the cache as its watch's events pass: stale from a failure until the
    /// re-list that follows completes.
    pub fn track<S, E>(&self, events: S) -> impl Stream<Item = Result<watcher::Event<K>, E>> + use<S, E, K>
    where
        S: Stream<Item = Result<watcher::Event<K>, E>>,
    {
        let fresh = self.fresh.clone();
        events.inspect(move |event| match event {
            Ok(watcher::Event::InitDone) => fresh.store(true, Ordering::Release),
            Err(_) => fresh.store(false, Ordering::Release),
            Ok(_) => {}
        })
    }

    pub fn is_fresh(&self) -> bool {
        self.fresh.load(Ordering::Acquire)
    }

    pub fn get(&self, ns: &str, name: &str) -> Option<K> {
        self.store.get(&ObjectRef::new(name).within(ns)).map(|o| (*o).clone())
    }

    /// The objects of `ns` labelled as the run `run`'s.
    pub fn of_run(&self, ns: &str, run: &str) -> Vec<K> {
        self.store
            .state_filter(|o| {
                o.meta().namespace.as_deref() == Some(ns)
                    && o.meta().labels.as_ref().and_then(|l| l.get(RUN_LABEL)).map(String::as_str) == Some(run)
            })
            .into_iter()
            .map(|o| (*o).clone())
            .collect()
    }
}

/// The stores of everything a reconcile reads but a queued run's Kueue Workload.
#[derive(Clone)]
pub struct Caches {
    pub runs: Cache<TrainingRun>,
    pub datasets: Cache<TrainingDataset>,
    pub jobs: Cache<Job>,
    pub pods: Cache<Pod>,
    pub configmaps: Cache<ConfigMap>,
    pub claims: Cache<PersistentVolumeClaim>,
    pub services: Cache<Service>,
    /// Only with `--network-policy`.
    pub network_policies: Option<Cache<NetworkPolicy>>,
}

/// How long a reconcile waits for the stores' first lists (a new leader's start)
/// before it reads the API instead.
pub const FIRST_LIST_WAIT: Duration = Duration::from_secs(60);

impl Caches {
    /// The kinds whose stores may not be read now.
    fn stale(&self) -> Vec<&'static str> {
        let np = self.network_policies.as_ref().is_none_or(Cache::is_fresh);
        [
            ("TrainingRun", self.runs.is_fresh()),
            ("TrainingDataset", self.datasets.is_fresh()),
            ("Job", self.jobs.is_fresh()),
            ("Pod", self.pods.is_fresh()),
            ("ConfigMap", self.configmaps.is_fresh()),
            ("PersistentVolumeClaim", self.claims.is_fresh()),
            ("Service", self.services.is_fresh()),
            ("NetworkPolicy", np),
        ]
        .into_iter()
        .filter(|(_, fresh)| !fresh)
        .map(|(kind, _)| kind)
        .collect()
    }

    fn all_fresh(&self) -> bool {
        self.stale().is_empty()
    }

    /// Whether the caches may be read now: once, at the start, it waits for every
    /// store's first list; a store re-listing later is read around, not waited for.
    pub async fn ready(&self) -> bool {
        if self.all_fresh() {
            return true;
        }
        let first = async {
            let _ = self.runs.store.wait_until_ready().await;
            let _ = self.datasets.store.wait_until_ready().await;
            let _ = self.jobs.store.wait_until_ready().await;
            let _ = self.pods.store.wait_until_ready().await;
            let _ = self.configmaps.store.wait_until_ready().await;
            let _ = self.claims.store.wait_until_ready().await;
            let _ = self.services.store.wait_until_ready().await;
            if let Some(np) = &self.network_policies {
                let _ = np.store.wait_until_ready().await;
            }
        };
        if tokio::time::timeout(FIRST_LIST_WAIT, first).await.is_err() {
            tracing::warn!(
                "the watches of {:?} have not listed within {FIRST_LIST_WAIT:?}; reading the API",
                self.stale()
            );
        }
        self.all_fresh()
    }

    /// Whether `expected` shows in the stores.
    pub(super) fn shows(&self, ns: &str, expected: &Expected) -> bool {
        match expected {
            Expected::Live => false,
            Expected::Written { kind, name, version } => {
                let rv = match kind {
                    Kind::Run => self.runs.get(ns, name).and_then(|o| o.resource_version()),
                    Kind::Job => self.jobs.get(ns, name).and_then(|o| o.resource_version()),
                    Kind::ConfigMap => self.configmaps.get(ns, name).and_then(|o| o.resource_version()),
                    Kind::Claim => self.claims.get(ns, name).and_then(|o| o.resource_version()),
                    Kind::Service => self.services.get(ns, name).and_then(|o| o.resource_version()),
                    Kind::NetworkPolicy => {
                        self.network_policies.as_ref().and_then(|c| c.get(ns, name)).and_then(|o| o.resource_version())
                    }
                    Kind::Pod => self.pods.get(ns, name).and_then(|o| o.resource_version()),
                };
                rv.and_then(|rv| rv.parse::<u64>().ok()).is_some_and(|rv| rv >= *version)
            }
            Expected::Gone { kind, name } => match kind {
                Kind::Job => self.jobs.get(ns, name).is_none_or(|j| j.metadata.deletion_timestamp.is_some()),
                Kind::Pod => self.pods.get(ns, name).is_none_or(|p| p.metadata.deletion_timestamp.is_some()),
                _ => false,
            },
        }
    }
}

/// Where a reconcile reads: the caches (`caches`, where they hold the kind), or the API.
#[derive(Clone, Copy)]
pub struct Source<'a> {
    pub caches: Option<&'a Caches>,
    pub client: &'a kube::Client,
}

/// A kind a reconcile reads, and its store.
pub trait Cached:
    Resource<DynamicType = (), Scope = NamespaceResourceScope> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
    fn cache(caches: &Caches) -> Option<&Cache<Self>>;
}

macro_rules! cached {
    ($($kind:ty => $field:ident),* $(,)?) => {
        $(impl Cached for $kind {
            fn cache(caches: &Caches) -> Option<&Cache<Self>> {
                Some(&caches.$field)
            }
        })*
    };
}

cached!(TrainingRun => runs, TrainingDataset => datasets, Job => jobs, Pod => pods, ConfigMap => configmaps,
    PersistentVolumeClaim => claims, Service => services);

impl Cached for NetworkPolicy {
    fn cache(caches: &Caches) -> Option<&Cache<Self>> {
        caches.network_policies.as_ref()
    }
}

impl Source<'_> {
    pub fn is_cache(&self) -> bool {
        self.caches.is_some()
    }

    fn cache<K: Cached>(&self) -> Option<&Cache<K>> {
        self.caches.and_then(K::cache)
    }

    /// The object `name` in `ns`, `None` where it does not exist.
    pub async fn get<K: Cached>(&self, ns: &str, name: &str) -> Result<Option<K>, kube::Error> {
        match self.cache::<K>() {
            Some(cache) => Ok(cache.get(ns, name)),
            None => kube::Api::<K>::namespaced(self.client.clone(), ns).get_opt(name).await,
        }
    }

    /// The objects of `ns` labelled as the run `run`'s.
    pub async fn of_run<K: Cached>(&self, ns: &str, run: &str) -> Result<Vec<K>, kube::Error> {
        match self.cache::<K>() {
            Some(cache) => Ok(cache.of_run(ns, run)),
            None => {
                let lp = kube::api::ListParams::default().labels(&format!("{RUN_LABEL}={run}"));
                Ok(kube::Api::<K>::namespaced(self.client.clone(), ns).list(&lp).await?.items)
            }
        }
    }
}
