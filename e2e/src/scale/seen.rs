//! The runs as a watch shows them: each run's phase, observed generation and attempt,
//! and when its status last changed; on request, each run's Jobs too. Waits wake on
//! each event.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::control_plane::Error;
use crate::scale::cluster::RUNS_NS;
use crds::TrainingRun;
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use operator::resources::RUN_LABEL;
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
    /// The names of each run's Jobs that exist now, by run.
    jobs: BTreeMap<String, BTreeSet<String>>,
    /// When the watch last showed any run's status change.
    last_change: Option<Instant>,
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
                inner.last_change = Some(Instant::now());
                inner.runs.insert(name, state);
            }
            drop(inner);
            feeding.notify.notify_waiters();
        }
    });
    seen
}

impl Seen {
    /// Also watches the bench namespace's Jobs from now on, for [`Seen::wait_jobs`].
    pub fn watch_jobs(&self, client: kube::Client) {
        let feeding = self.clone();
        let api: Api<Job> = Api::namespaced(client, RUNS_NS);
        tokio::spawn(async move {
            let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
            let mut listing = BTreeMap::new();
            while let Some(event) = events.next().await {
                let Ok(event) = event else { continue };
                let mut inner = feeding.inner.lock().expect("the runs' lock");
                match event {
                    watcher::Event::Init => listing.clear(),
                    watcher::Event::InitApply(job) => add_job(&mut listing, &job),
                    watcher::Event::InitDone => inner.jobs = std::mem::take(&mut listing),
                    watcher::Event::Apply(job) => add_job(&mut inner.jobs, &job),
                    watcher::Event::Delete(job) => {
                        let run = job.labels().get(RUN_LABEL).cloned().unwrap_or_default();
                        if let Some(names) = inner.jobs.get_mut(&run) {
                            names.remove(&job.name_any());
                            if names.is_empty() {
                                inner.jobs.remove(&run);
                            }
                        }
                    }
                }
                drop(inner);
                feeding.notify.notify_waiters();
            }
        });
    }

    /// Waits until `check` of the runs is `Ok`, on each watch event, or fails after
    /// `limit` with the last state it described.
    pub async fn wait(
        &self,
        what: &str,
        limit: Duration,
        check: impl Fn(&HashMap<String, RunState>) -> Result<(), String>,
    ) -> Result<(), Error> {
        self.wait_on(what, limit, None, |inner| check(&inner.runs)).await
    }

    /// [`Seen::wait`] for as long as the runs' statuses keep changing: fails once none
    /// has changed for `stall`, or after `limit` whatever they do. For a wait whose
    /// length is what is measured.
    pub async fn wait_progressing(
        &self,
        what: &str,
        stall: Duration,
        limit: Duration,
        check: impl Fn(&HashMap<String, RunState>) -> Result<(), String>,
    ) -> Result<(), Error> {
        self.wait_on(what, limit, Some(stall), |inner| check(&inner.runs)).await
    }

    /// Waits until `check` of each run's Jobs (by run, from [`Seen::watch_jobs`]) is
    /// `Ok`, as [`Seen::wait`] does.
    pub async fn wait_jobs(
        &self,
        what: &str,
        limit: Duration,
        check: impl Fn(&BTreeMap<String, BTreeSet<String>>) -> Result<(), String>,
    ) -> Result<(), Error> {
        self.wait_on(what, limit, None, |inner| check(&inner.jobs)).await
    }

    async fn wait_on(
        &self,
        what: &str,
        limit: Duration,
        stall: Option<Duration>,
        check: impl Fn(&Inner) -> Result<(), String>,
    ) -> Result<(), Error> {
        let start = Instant::now();
        loop {
            let woken = self.notify.notified();
            let (state, last_change) = {
                let inner = self.inner.lock().expect("the runs' lock");
                match check(&inner) {
                    Ok(()) => return Ok(()),
                    Err(state) => (state, inner.last_change),
                }
            };
            let since_progress = last_change.filter(|t| *t > start).unwrap_or(start).elapsed();
            let stalled = stall.is_some_and(|s| since_progress >= s);
            if start.elapsed() >= limit || stalled {
                let state = if stalled { format!("{state} (no status changed for {since_progress:?})") } else { state };
                return Err(Error::NotReady { what: what.to_string(), waited: start.elapsed(), state });
            }
            let left = limit.saturating_sub(start.elapsed());
            let _ = tokio::time::timeout(left.min(Duration::from_secs(5)), woken).await;
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

fn add_job(jobs: &mut BTreeMap<String, BTreeSet<String>>, job: &Job) {
    let run = job.labels().get(RUN_LABEL).cloned().unwrap_or_default();
    jobs.entry(run).or_default().insert(job.name_any());
}
