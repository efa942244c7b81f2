//! What every reconcile of both controllers shares: the API client, the event recorder,
//! the settings, the metrics, the clock, the HTTP client for the pods' status ports, and
//! each run's memory between reconciles.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use kube::runtime::events::{Event, EventType, Reporter};
use kube::{Client, Resource, ResourceExt};

use crate::MANAGER;
use crate::cache::{Caches, Expectations, Reading, Source};
use crate::clock::Clock;
use crate::events::Recorder;
use crate::metrics::Metrics;
use crate::observe::StatusClient;
use crate::observed::Memory;
use crate::settings::Settings;

pub struct Context {
    pub client: Client,
    /// The watches' stores, once [`crate::controller::run`] has started them.
    pub caches: OnceLock<Caches>,
    /// The operator's writes that each run's next reconcile must see.
    pub expectations: Expectations,
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
            caches: OnceLock::new(),
            expectations: Expectations::default(),
            settings,
            metrics,
            clock,
            memory: Mutex::new(HashMap::new()),
        })
    }

    /// What the operator remembers of the run with this uid (lost on restart, which
    /// only means an early poll or status write).
    pub fn memory(&self, uid: &str) -> Memory {
        self.memory.lock().expect("memory lock").get(uid).cloned().unwrap_or_default()
    }

    pub fn remember(&self, uid: &str, memory: Memory) {
        self.memory.lock().expect("memory lock").insert(uid.to_string(), memory);
    }

    pub fn forget(&self, uid: &str) {
        self.memory.lock().expect("memory lock").remove(uid);
        self.expectations.forget(uid);
    }

    /// Where a reconcile of the run `uid` in `ns` reads: the caches when they are fresh
    /// and show the run's last writes, nowhere yet (`None`: a store is about to show
    /// one, so the reconcile is deferred), else the API ([`crate::cache`]).
    pub async fn source(&self, ns: &str, uid: &str) -> Option<Source<'_>> {
        let caches = self.caches.get();
        let reading = match caches {
            Some(c) if c.ready().await => self.expectations.reading(c, ns, uid, Instant::now()),
            _ => Reading::Api,
        };
        self.metrics.read_from(reading);
        match reading {
            Reading::Caches => Some(Source { caches, client: &self.client }),
            Reading::Deferred => None,
            Reading::Api => {
                self.expectations.read_live(uid);
                Some(Source { caches: None, client: &self.client })
            }
        }
    }

    /// Emits an event about `obj`, best effort: a failure is logged.
    pub async fn publish<K: Resource<DynamicType = ()>>(&self, obj: &K, warning: bool, reason: &str, note: &str) {
        let event = Event {
            type_: if warning { EventType::Warning } else { EventType::Normal },
            reason: reason.into(),
            note: Some(note.chars().take(1000).collect()),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &obj.object_ref(&()), self.clock.now()).await {
            tracing::warn!(kind = %K::kind(&()), name = %obj.name_any(), "publishing event {reason}: {e}");
        }
    }
}
