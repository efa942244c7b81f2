//! The runs as a watch shows them: each run's phase, observed generation and attempt,
//! and when its status last changed; waits wake on each event.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::control_plane::Error;
use crate::scale::cluster::RUNS_NS;
use crds::TrainingRun;
use futures::StreamExt;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use tokio::sync::Notify;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunState {
    pub phase: String,
    pub observed_generation: i64,
    pub attempt: u32,
}

#[derive(Default)]
struct Inner {
    runs: HashMap<String, RunState>,
    changed: HashMap<String, Instant>,
}

#[derive(Clone)]
pub struct Seen {
    inner: Arc<Mutex<Inner>>,
    notify: Arc<Notify>,
}

/// Watches the bench's runs from now on.
pub fn start(client: kube::Client) -> Seen {
    let seen = Seen { inner: Arc::default(), notify: Arc::new(Notify::new()) };
    let feeding = seen.clone();
    let api: Api<TrainingRun> = Api::namespaced(client, RUNS_NS);
    tokio::spawn(async move {
        let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff().applied_objects());
        while let Some(event) = events.next().await {
            let Ok(run) = event else { continue };
            let status = run.status.clone().unwrap_or_default();
            let state = RunState {
                phase: status.phase.map(|p| format!("{p:?}")).unwrap_or_default(),
                observed_generation: status.observed_generation.unwrap_or_default(),
                attempt: status.attempt,
            };
            let mut inner = feeding.inner.lock().expect("the runs' lock");
            let name = run.name_any();
            if inner.runs.get(&name) != Some(&state) {
                inner.changed.insert(name.clone(), Instant::now());
                inner.runs.insert(name, state);
            }
            drop(inner);
            feeding.notify.notify_waiters();
        }
    });
    seen
}

impl Seen {
    /// Waits until `check` of the runs is `Ok`, on each watch event, or fails after
    /// `limit` with the last state it described.
    pub async fn wait(
        &self,
        what: &str,
        limit: Duration,
        check: impl Fn(&HashMap<String, RunState>) -> Result<(), String>,
    ) -> Result<(), Error> {
        let start = Instant::now();
        loop {
            let woken = self.notify.notified();
            let state = match check(&self.inner.lock().expect("the runs' lock").runs) {
                Ok(()) => return Ok(()),
                Err(state) => state,
            };
            let left = limit.saturating_sub(start.elapsed());
            if left.is_zero()
                || tokio::time::timeout(left.min(Duration::from_secs(5)), woken).await.is_err()
                    && start.elapsed() >= limit
            {
                return Err(Error::NotReady { what: what.to_string(), waited: start.elapsed(), state });
            }
        }
    }

    pub fn get(&self, name: &str) -> RunState {
        self.inner.lock().expect("the runs' lock").runs.get(name).cloned().unwrap_or_default()
    }

    /// When the watch last showed `name`'s status change.
    pub fn when(&self, name: &str) -> Option<Instant> {
        self.inner.lock().expect("the runs' lock").changed.get(name).copied()
    }
}
