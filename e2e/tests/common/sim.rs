//! The simulated cluster with the real operator running in it: the harness of
//! `simulated_cluster.rs`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crds::TrainingRun;
use crds::types::{RunPhase, TrainingRunStatus};
use e2e::cluster::{Options, SimulatedCluster};
use e2e::fake_api::FakeApi;
use futures::StreamExt;
use kube::CustomResourceExt;
use kube::api::Api;
use kube::runtime::watcher;
use operator::clock::SystemClock;
use operator::controller::{self, Context};
use operator::metrics::Metrics;
use operator::resources::{RUN_LABEL, pvc_name};
use operator::settings::Settings;
use serde_json::Value;

use super::{NS, TR};

pub fn trainer_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("TRAINER_BIN") {
        return PathBuf::from(p);
    }
    // target/<profile>/deps/<this test> → target/<profile>/trainer
    let exe = std::env::current_exe().expect("test executable");
    let bin = exe.parent().and_then(|d| d.parent()).expect("target dir").join("trainer");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build -p trainer` (or `cargo test --workspace`), or set TRAINER_BIN",
        bin.display()
    );
    bin
}

pub struct Operator {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

/// One simulated cluster with the operator running in it.
pub struct Sim {
    pub fake: FakeApi,
    pub cluster: SimulatedCluster,
    pub metrics: Arc<Metrics>,
    pub operator: Option<Operator>,
    /// Every phase each run has been seen in, in order (from a watch).
    pub phases: Arc<Mutex<BTreeMap<String, Vec<RunPhase>>>>,
    pub dir: PathBuf,
}

impl Sim {
    pub async fn new(test: &str) -> Sim {
        let dir = std::env::temp_dir().join(format!("e2e-sim-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let fake = FakeApi::new();
        fake.insert(serde_json::to_value(TrainingRun::crd()).unwrap());
        let cluster = SimulatedCluster::start(
            fake.clone(),
            Options {
                namespace: NS.into(),
                trainer: trainer_bin(),
                root: dir.clone(),
                max_grace: Duration::from_secs(30),
            },
        );
        let phases: Arc<Mutex<BTreeMap<String, Vec<RunPhase>>>> = Arc::default();
        let seen = phases.clone();
        let api: Api<TrainingRun> = Api::namespaced(fake.client(), NS);
        tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default()).boxed();
            while let Some(Ok(ev)) = events.next().await {
                if let watcher::Event::Apply(r) | watcher::Event::InitApply(r) = ev {
                    let name = r.metadata.name.clone().unwrap_or_default();
                    if let Some(p) = r.status.and_then(|s| s.phase) {
                        let mut all = seen.lock().unwrap();
                        let list = all.entry(name).or_default();
                        if list.last() != Some(&p) {
                            list.push(p);
                        }
                    }
                }
            }
        });
        let mut sim = Sim { fake, cluster, metrics: Arc::new(Metrics::new().unwrap()), operator: None, phases, dir };
        sim.start_operator();
        sim
    }

    /// A new operator process: fresh memory, same cluster.
    pub fn start_operator(&mut self) {
        assert!(self.operator.is_none(), "one operator at a time");
        let settings = Settings {
            status_url: self.cluster.status_url(),
            status_poll_interval: Duration::from_secs(1),
            status_write_interval: Duration::from_secs(1),
            requeue_interval: Duration::from_secs(10),
            status_timeout: Duration::from_secs(3),
            ..Settings::default()
        };
        let ctx = Context::new(self.fake.client(), settings, self.metrics.clone(), Arc::new(SystemClock));
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(controller::run(ctx, Some(NS.into()), async move {
            let _ = stopped.wait_for(|s| *s).await;
        }));
        self.operator = Some(Operator { stop, task });
    }

    /// Kills the operator: its task is aborted mid-flight, as a crashed process.
    pub async fn kill_operator(&mut self) {
        let op = self.operator.take().expect("an operator is running");
        op.task.abort();
        let _ = op.task.await;
        drop(op.stop);
    }

    pub fn apply(&self, name: &str, spec: &str) {
        super::apply(&self.fake, name, spec);
    }

    pub fn edit_spec(&self, name: &str, f: impl FnOnce(&mut Value)) {
        super::edit_spec(&self.fake, name, f);
    }

    /// `kubectl delete trainingrun`.
    pub fn delete(&self, name: &str) {
        self.fake.delete(TR, "TrainingRun", Some(NS), name).unwrap();
    }

    pub fn exists(&self, api_version: &str, kind: &str, name: &str) -> bool {
        self.fake.get(api_version, kind, Some(NS), name).is_some()
    }

    pub fn status(&self, name: &str) -> TrainingRunStatus {
        super::status(&self.fake, name)
    }

    pub fn condition(&self, name: &str, type_: &str) -> (String, String, String) {
        super::condition(&self.fake, name, type_)
    }

    pub fn phases(&self, name: &str) -> Vec<RunPhase> {
        self.phases.lock().unwrap().get(name).cloned().unwrap_or_default()
    }

    /// The phases recorded for `name` once the recorder has seen `last`, which the status
    /// already shows: the recorder is a watch, so on a busy machine it can trail a status
    /// read straight from the API.
    pub async fn phases_through(&self, name: &str, last: RunPhase) -> Vec<RunPhase> {
        let start = Instant::now();
        loop {
            let phases = self.phases(name);
            if phases.last() == Some(&last) {
                return phases;
            }
            assert!(
                start.elapsed() < MINUTES(1),
                "{name}: the watch never recorded {last:?}: {phases:?}\n{}",
                self.diagnose(name)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Jobs of a run, by name.
    pub fn jobs(&self, run: &str) -> Vec<String> {
        let mut names: Vec<String> = self
            .fake
            .list("batch/v1", "Job", Some(NS))
            .iter()
            .filter(|j| j["metadata"]["labels"][RUN_LABEL] == run)
            .map(|j| j["metadata"]["name"].as_str().unwrap().to_string())
            .collect();
        names.sort();
        names
    }

    /// Events about a run: (type, reason, note).
    pub fn events(&self, run: &str) -> Vec<(String, String, String)> {
        self.fake
            .list("events.k8s.io/v1", "Event", Some(NS))
            .iter()
            .filter(|e| e["regarding"]["name"] == run)
            .map(|e| {
                let s = |k: &str| e[k].as_str().unwrap_or_default().to_string();
                (s("type"), s("reason"), s("note"))
            })
            .collect()
    }

    pub fn has_event(&self, run: &str, type_: &str, reason: &str) -> bool {
        self.events(run).iter().any(|(t, r, _)| t == type_ && r == reason)
    }

    /// Events and metrics follow the status write, so they are waited for.
    pub async fn expect_event(&self, run: &str, type_: &str, reason: &str) {
        let start = Instant::now();
        while !self.has_event(run, type_, reason) {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no {type_} {reason} event about {run}: {:#?}",
                self.events(run)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits for a line of the operator's /metrics.
    pub async fn expect_metric(&self, line: &str) {
        self.expect_metric_where(line, |l| l == line).await;
    }

    /// Waits for `series` (name and labels) to have a value, whatever it is.
    pub async fn expect_series(&self, series: &str) {
        self.expect_metric_where(series, |l| l.strip_prefix(series).is_some_and(|v| v.starts_with(' '))).await;
    }

    async fn expect_metric_where(&self, what: &str, found: impl Fn(&str) -> bool) {
        let start = Instant::now();
        while !self.metrics.render().lines().any(&found) {
            assert!(start.elapsed() < Duration::from_secs(30), "no metric line {what}:\n{}", self.metrics.render());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn checkpoint_dir(&self, run: &str) -> PathBuf {
        self.cluster.claim_dir(&pvc_name(run))
    }

    /// The run's metrics.jsonl on its PVC.
    pub fn records(&self, run: &str) -> Vec<Value> {
        let path = self.checkpoint_dir(run).join("metrics.jsonl");
        std::fs::read_to_string(&path).unwrap_or_default().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    /// (step, loss) of every step record.
    pub fn step_losses(&self, run: &str) -> Vec<(u64, f64)> {
        self.records(run)
            .iter()
            .filter(|r| r["kind"] == "step")
            .map(|r| (r["step"].as_u64().unwrap(), r["loss"].as_f64().unwrap()))
            .collect()
    }

    pub fn checkpoints(&self, run: &str) -> Vec<String> {
        let mut found: Vec<String> = std::fs::read_dir(self.checkpoint_dir(run))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().to_string())
                    .filter(|n| n.starts_with("step-"))
                    .collect()
            })
            .unwrap_or_default();
        found.sort();
        found
    }

    /// What to print when a wait times out: status, events and the pods' log tails.
    pub fn diagnose(&self, run: &str) -> String {
        let status = self.fake.get(TR, "TrainingRun", Some(NS), run).map(|r| r["status"].clone());
        let mut out =
            format!("status of {run}: {status:#?}\nevents: {:#?}\nphases: {:?}\n", self.events(run), self.phases(run));
        let pods_dir = self.dir.join("pods");
        for e in std::fs::read_dir(&pods_dir).map(|d| d.flatten().collect::<Vec<_>>()).unwrap_or_default() {
            let name = e.file_name().to_string_lossy().to_string();
            if name.starts_with(run) {
                let log = std::fs::read_to_string(e.path().join("log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(15).collect();
                out += &format!("--- {name} log (end):\n{}\n", tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
            }
        }
        out
    }

    /// Waits until `ok` holds for the run's status.
    pub async fn wait(
        &self,
        run: &str,
        what: &str,
        timeout: Duration,
        ok: impl Fn(&TrainingRunStatus) -> bool,
    ) -> TrainingRunStatus {
        let start = Instant::now();
        loop {
            let s = self.status(run);
            if ok(&s) {
                return s;
            }
            if start.elapsed() > timeout {
                panic!("{run}: timed out after {timeout:?} waiting for {what}\n{}", self.diagnose(run));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub async fn wait_phase(&self, run: &str, phase: RunPhase, timeout: Duration) -> TrainingRunStatus {
        self.wait(run, &format!("{phase:?}"), timeout, |s| s.phase == Some(phase)).await
    }

    /// Waits for the run's pod of `index` to be running a container.
    pub async fn pod(&self, job: &str, index: u32) -> String {
        let start = Instant::now();
        loop {
            if let Some(p) = self.cluster.pod_of(job, index) {
                return p;
            }
            assert!(start.elapsed() < Duration::from_secs(180), "no running pod for {job} index {index}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        if let Some(op) = self.operator.take() {
            op.task.abort();
        }
        if std::thread::panicking() {
            let runs: Vec<String> = self.phases.lock().map(|p| p.keys().cloned().collect()).unwrap_or_default();
            for run in runs {
                eprintln!("{}", self.diagnose(&run));
            }
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

pub fn step(s: &TrainingRunStatus) -> u64 {
    s.progress.as_ref().map_or(0, |p| p.step)
}

pub fn checkpoint_step(s: &TrainingRunStatus) -> u64 {
    s.last_checkpoint.as_ref().map_or(0, |c| c.step)
}

pub const MINUTES: fn(u64) -> Duration = |m| Duration::from_secs(60 * m);
