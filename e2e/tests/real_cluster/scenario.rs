//! A cluster of real nodes with the chart's operator running as its Deployment, and a
//! watch that records every phase each run passes through: the harness of
//! `scenarios.rs`. It does to runs what a user does (apply, edit, delete), to pods and
//! nodes what their failures do (a killed worker, a hung container, a cut or lost node),
//! and reads what a user reads (status, conditions, events, the operator's `/metrics`,
//! the files on the checkpoint claim).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crds::TrainingRun;
use crds::types::{RunPhase, TrainingRunStatus};
use e2e::test_cluster::{Options, TestCluster};
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use operator::resources::{RUN_LABEL, pvc_name};
use serde_json::{Value, json};

use crate::harness::*;
use crate::slots::{ClusterSlot, cluster_slot};

pub const NS: &str = "ml";
pub const TR: &str = "training.puretransformer.dev/v1alpha1";

pub const MINUTES: fn(u64) -> Duration = |m| Duration::from_secs(60 * m);

/// Runs `f` to completion from a synchronous method (the tests' runtime has worker
/// threads to spare).
fn block<F: std::future::Future>(f: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
}

pub struct Scenario {
    pub c: TestCluster,
    /// The operator's pod (one replica: a crashed container restarts in the same pod),
    /// and its container's restarts when it was last killed.
    operator: String,
    killed_at_restarts: Option<u32>,
    /// Every phase each run has been seen in, in order (from a watch).
    phases: Arc<Mutex<BTreeMap<String, Vec<RunPhase>>>>,
    recorder: tokio::task::JoinHandle<()>,
    /// Each run's checkpoint claim's directory, once bound (it outlives the claim).
    claims: Mutex<BTreeMap<String, PathBuf>>,
    _slot: ClusterSlot,
}

impl Scenario {
    /// A 2-node cluster, the chart installed, its operator running, namespace `ml`.
    pub async fn new() -> Scenario {
        Scenario::with_nodes(2).await
    }

    /// [`Scenario::new`] with `nodes` nodes.
    pub async fn with_nodes(nodes: usize) -> Scenario {
        Scenario::with_cluster(nodes, |_| {}).await
    }

    /// [`Scenario::new`] with `nodes` nodes and `edit` applied to the cluster's options.
    pub async fn with_cluster(nodes: usize, edit: impl FnOnce(&mut Options)) -> Scenario {
        let slot = cluster_slot().await;
        let c = cluster_with(nodes, edit).await;
        helm_install_in_cluster(
            &c,
            &["replicas=1", "statusPollInterval=1s", "statusWriteInterval=1s", "requeueInterval=10s"],
        );
        let operator = operator_pods(&c).into_iter().next().expect("the operator's pod, rolled out");
        namespace(&c, NS).await;
        let phases: Arc<Mutex<BTreeMap<String, Vec<RunPhase>>>> = Arc::default();
        let seen = phases.clone();
        let api: Api<TrainingRun> = Api::namespaced(c.client.clone(), NS);
        let recorder = tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default()).default_backoff().boxed();
            while let Some(ev) = events.next().await {
                if let Ok(watcher::Event::Apply(r) | watcher::Event::InitApply(r)) = ev {
                    let name = r.metadata.name.clone().unwrap_or_default();
                    if let Some(p) = r.status.and_then(|s| s.phase) {
                        let mut all = seen.lock().expect("the phase recorder");
                        let list = all.entry(name).or_default();
                        if list.last() != Some(&p) {
                            list.push(p);
                        }
                    }
                }
            }
        });
        Scenario { c, operator, killed_at_restarts: None, phases, recorder, claims: Mutex::default(), _slot: slot }
    }

    /// SIGKILLs the operator's process mid-flight through its node's runtime, as a crash.
    pub fn kill_operator(&mut self) {
        assert!(self.killed_at_restarts.is_none(), "the operator is already down");
        self.killed_at_restarts = Some(operator_restarts(&self.c, &self.operator));
        kill_operator(&self.c, &self.operator);
    }

    /// Waits until the kubelet has restarted the killed operator's container and it is
    /// Ready.
    pub fn operator_restarted(&mut self) {
        let restarts = self.killed_at_restarts.take().expect("the operator was killed");
        wait_operator_restarted(&self.c, &self.operator, restarts);
    }

    fn runs(&self) -> Api<TrainingRun> {
        Api::namespaced(self.c.client.clone(), NS)
    }

    /// `kubectl apply` of a TrainingRun; `spec` is YAML indented by two spaces.
    pub fn apply(&self, name: &str, spec: &str) {
        let manifest = format!("apiVersion: {TR}\nkind: TrainingRun\nmetadata: {{name: {name}}}\nspec:\n{spec}");
        apply(&self.c, NS, &manifest);
    }

    /// A user's edit of the spec (a merge patch of the edited spec).
    pub fn edit_spec(&self, name: &str, f: impl FnOnce(&mut Value)) {
        let run = block(self.runs().get(name)).unwrap_or_else(|e| panic!("TrainingRun {name}: {e}"));
        let mut spec = serde_json::to_value(run.spec).expect("the spec as JSON");
        f(&mut spec);
        block(self.runs().patch(name, &PatchParams::default(), &Patch::Merge(json!({ "spec": spec }))))
            .unwrap_or_else(|e| panic!("editing TrainingRun {name}: {e}"));
    }

    /// `kubectl delete trainingrun`.
    pub fn delete(&self, name: &str) {
        kubectl(&self.c, &["-n", NS, "delete", "trainingrun", name, "--wait=false"]);
    }

    /// Whether `kubectl get <resource> <name>` finds it.
    pub fn exists(&self, resource: &str, name: &str) -> bool {
        !kubectl(&self.c, &["-n", NS, "get", resource, name, "--ignore-not-found", "-o", "name"]).trim().is_empty()
    }

    pub fn status(&self, name: &str) -> TrainingRunStatus {
        let run = block(self.runs().get(name)).unwrap_or_else(|e| panic!("TrainingRun {name}: {e}"));
        run.status.unwrap_or_default()
    }

    /// (status, reason, message) of a condition.
    pub fn condition(&self, name: &str, type_: &str) -> (String, String, String) {
        let s = self.status(name);
        let c =
            s.conditions.iter().find(|c| c.type_ == type_).unwrap_or_else(|| panic!("{name} has no {type_} condition"));
        (c.status.clone(), c.reason.clone(), c.message.clone())
    }

    pub fn phases(&self, name: &str) -> Vec<RunPhase> {
        self.phases.lock().expect("the phase recorder").get(name).cloned().unwrap_or_default()
    }

    /// The phases recorded for `name` once the recorder has seen `last`, which the status
    /// already shows: the recorder is a watch, so it can trail a status read.
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
        let jobs: Api<Job> = Api::namespaced(self.c.client.clone(), NS);
        let list = block(jobs.list(&ListParams::default().labels(&format!("{RUN_LABEL}={run}"))))
            .unwrap_or_else(|e| panic!("listing Jobs: {e}"));
        let mut names: Vec<String> = list.items.into_iter().filter_map(|j| j.metadata.name).collect();
        names.sort();
        names
    }

    /// Whether Job `name` is suspended (`spec.suspend`).
    pub fn job_suspended(&self, name: &str) -> bool {
        let jobs: Api<Job> = Api::namespaced(self.c.client.clone(), NS);
        let job = block(jobs.get(name)).unwrap_or_else(|e| panic!("Job {name}: {e}"));
        job.spec.and_then(|s| s.suspend) == Some(true)
    }

    /// (status, reason) of the Job controller's condition `type_` on Job `name`.
    pub fn job_condition(&self, name: &str, type_: &str) -> Option<(String, String)> {
        let jobs: Api<Job> = Api::namespaced(self.c.client.clone(), NS);
        let job = block(jobs.get(name)).unwrap_or_else(|e| panic!("Job {name}: {e}"));
        let conditions = job.status.and_then(|s| s.conditions).unwrap_or_default();
        conditions.into_iter().find(|c| c.type_ == type_).map(|c| (c.status, c.reason.unwrap_or_default()))
    }

    fn pods(&self) -> Vec<Pod> {
        let pods: Api<Pod> = Api::namespaced(self.c.client.clone(), NS);
        block(pods.list(&ListParams::default())).unwrap_or_else(|e| panic!("listing pods: {e}")).items
    }

    /// The names of the namespace's pods.
    pub fn pod_names(&self) -> Vec<String> {
        self.pods().into_iter().filter_map(|p| p.metadata.name).collect()
    }

    /// The pods whose containers run (phase Running).
    pub fn running(&self) -> Vec<String> {
        self.pods()
            .into_iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .filter_map(|p| p.metadata.name)
            .collect()
    }

    /// The node pod `name` is bound to.
    pub fn node_of(&self, pod: &str) -> String {
        let pods: Api<Pod> = Api::namespaced(self.c.client.clone(), NS);
        let p = block(pods.get(pod)).unwrap_or_else(|e| panic!("pod {pod}: {e}"));
        p.spec.and_then(|s| s.node_name).unwrap_or_else(|| panic!("pod {pod} is not bound"))
    }

    /// (status, reason) of node `node`'s condition `type_`.
    pub fn node_condition(&self, node: &str, type_: &str) -> (String, String) {
        let nodes: Api<Node> = Api::all(self.c.client.clone());
        let n = block(nodes.get(node)).unwrap_or_else(|e| panic!("node {node}: {e}"));
        let conditions = n.status.and_then(|s| s.conditions).unwrap_or_default();
        let c = conditions.into_iter().find(|c| c.type_ == type_).unwrap_or_else(|| panic!("{node} has no {type_}"));
        (c.status, c.reason.unwrap_or_default())
    }

    /// The keys of node `node`'s taints.
    pub fn node_taints(&self, node: &str) -> Vec<String> {
        let nodes: Api<Node> = Api::all(self.c.client.clone());
        let n = block(nodes.get(node)).unwrap_or_else(|e| panic!("node {node}: {e}"));
        n.spec.and_then(|s| s.taints).unwrap_or_default().into_iter().map(|t| t.key).collect()
    }

    /// Events about a run: (type, reason, note).
    pub fn events(&self, run: &str) -> Vec<(String, String, String)> {
        let events: Api<Event> = Api::namespaced(self.c.client.clone(), NS);
        let list = block(events.list(&ListParams::default())).unwrap_or_else(|e| panic!("listing events: {e}"));
        list.items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(run))
            .map(|e| (e.type_.unwrap_or_default(), e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
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
        loop {
            let metrics = operator_metrics(&self.c, &self.operator).unwrap_or_else(|e| e);
            if metrics.lines().any(&found) {
                return;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "no metric line {what}:\n{metrics}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The directory of the run's checkpoint claim: the hostPath of the volume the PV
    /// controller bound it to.
    pub fn checkpoint_dir(&self, run: &str) -> PathBuf {
        if let Some(dir) = self.claims.lock().expect("claims").get(run) {
            return dir.clone();
        }
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.c.client.clone(), NS);
        let claim = block(claims.get(&pvc_name(run))).unwrap_or_else(|e| panic!("the claim of {run}: {e}"));
        let volume = claim.spec.and_then(|s| s.volume_name).unwrap_or_else(|| panic!("the claim of {run} is unbound"));
        let volumes: Api<PersistentVolume> = Api::all(self.c.client.clone());
        let pv = block(volumes.get(&volume)).unwrap_or_else(|e| panic!("PV {volume}: {e}"));
        let dir = PathBuf::from(
            pv.spec.and_then(|s| s.host_path).map(|h| h.path).unwrap_or_else(|| panic!("PV {volume} has no hostPath")),
        );
        self.claims.lock().expect("claims").insert(run.to_string(), dir.clone());
        dir
    }

    /// The run's metrics.jsonl on its claim.
    pub fn records(&self, run: &str) -> Vec<Value> {
        let path = self.checkpoint_dir(run).join("metrics.jsonl");
        std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: {e}: {l}", path.display())))
            .collect()
    }

    /// (step, loss) of every step record.
    pub fn step_losses(&self, run: &str) -> Vec<(u64, f64)> {
        self.records(run)
            .iter()
            .filter(|r| r["kind"] == "step")
            .map(|r| (r["step"].as_u64().expect("a step"), r["loss"].as_f64().expect("a loss")))
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

    /// What to print when a wait times out: the run's status, events and phases, its
    /// pods' log ends, and the cluster's objects.
    pub fn diagnose(&self, run: &str) -> String {
        let status = block(self.runs().get(run)).map(|r| r.status);
        let mut out =
            format!("status of {run}: {status:#?}\nevents: {:#?}\nphases: {:?}\n", self.events(run), self.phases(run));
        for pod in self.pod_names().into_iter().filter(|p| p.starts_with(run)) {
            let log = self.c.pod_log(NS, &pod).unwrap_or_else(|e| e.to_string());
            let tail: Vec<&str> = log.lines().rev().take(15).collect();
            out += &format!("--- {pod} log (end):\n{}\n", tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
        }
        out + &self.c.dump(NS)
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

    /// Waits for `job`'s pod of completion index `index` to run its container.
    pub async fn pod(&self, job: &str, index: u32) -> String {
        let start = Instant::now();
        loop {
            let found = self.pods().into_iter().find(|p| {
                let labels = p.metadata.labels.clone().unwrap_or_default();
                labels.get("job-name").map(String::as_str) == Some(job)
                    && labels.get("batch.kubernetes.io/job-completion-index") == Some(&index.to_string())
                    && p.metadata.deletion_timestamp.is_none()
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            });
            if let Some(name) = found.and_then(|p| p.metadata.name)
                && self.c.container_pid(NS, &name).is_ok()
            {
                return name;
            }
            assert!(
                start.elapsed() < Duration::from_secs(180),
                "no running pod for {job} index {index}\n{}",
                self.c.dump(NS)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The node the operator runs on.
    pub fn operator_node(&self) -> String {
        let path = "jsonpath={.spec.nodeName}";
        kubectl(&self.c, &["-n", OPERATOR_NS, "get", "pod", &self.operator, "-o", path]).trim().to_string()
    }

    /// A running rank of `job` on a node the operator does not run on, for a fault that
    /// takes its node down without the operator: (node rank, pod, node).
    pub async fn rank_off_operator_node(&self, job: &str, ranks: u32) -> (u32, String, String) {
        let operator = self.operator_node();
        for index in (0..ranks).rev() {
            let pod = self.pod(job, index).await;
            let node = self.node_of(&pod);
            if node != operator {
                return (index, pod, node);
            }
        }
        panic!("every rank of {job} runs on the operator's node {operator}\n{}", self.c.dump(NS))
    }

    /// SIGKILLs the trainer's worker processes in `pod`; how many.
    pub fn kill_workers(&self, pod: &str) -> usize {
        self.c.kill_workers(NS, pod).unwrap_or_else(|e| panic!("{e}"))
    }

    /// SIGSTOP to every process of `pod`'s container (a hung node); how many.
    pub fn pause(&self, pod: &str) -> usize {
        self.c.signal_pod(NS, pod, libc::SIGSTOP).unwrap_or_else(|e| panic!("{e}"))
    }

    /// SIGCONT to every process of `pod`'s container.
    pub fn resume(&self, pod: &str) -> usize {
        self.c.signal_pod(NS, pod, libc::SIGCONT).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Cuts node `node`'s link (`cut`) or heals it; the links it set.
    pub fn partition(&self, node: &str, cut: bool) -> Vec<String> {
        self.c.partition_node(node, cut).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Caps node `node`'s link at `rate` each way, or lifts the cap.
    pub fn slow_node(&self, node: &str, rate: Option<&str>) -> Vec<String> {
        self.c.slow_node(node, rate).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Node `node`'s link, and whether it is up.
    pub fn links(&self, node: &str) -> Vec<(String, bool)> {
        self.c.node_links(node).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Node `node` lost as to a power failure: silent, then its daemons and containers
    /// gone.
    pub fn lose_node(&mut self, node: &str) {
        self.c.lose_node(node).unwrap_or_else(|e| panic!("{e}"));
    }

    /// `pod`'s container log.
    pub fn log(&self, pod: &str) -> String {
        self.c.pod_log(NS, pod).unwrap_or_else(|e| panic!("{e}"))
    }
}

impl Drop for Scenario {
    fn drop(&mut self) {
        self.recorder.abort();
    }
}

pub fn step(s: &TrainingRunStatus) -> u64 {
    s.progress.as_ref().map_or(0, |p| p.step)
}

pub fn checkpoint_step(s: &TrainingRunStatus) -> u64 {
    s.last_checkpoint.as_ref().map_or(0, |c| c.step)
}
