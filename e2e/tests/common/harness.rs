//! The operator's real reconcile against the stateful fake API, with the test as the
//! job controller, the kubelet and rank 0's status endpoint.

use std::io::{Read, Write as _};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use crds::TrainingRun;
use crds::contract::{TrainerPhase, TrainerStatus};
use crds::types::{RunMetrics, RunPhase, TrainingRunStatus};
use e2e::fake_api::FakeApi;
use k8s_openapi::api::batch::v1::Job;
use kube::CustomResourceExt;
use kube::api::Api;
use operator::clock::ManualClock;
use operator::context::Context;
use operator::controller;
use operator::metrics::Metrics;
use operator::settings::Settings;
use serde_json::{Value, json};

use super::NS;

/// Rank 0's `/status`: answers every request with the current document.
#[derive(Clone)]
pub struct Rank0 {
    pub port: u16,
    pub doc: Arc<Mutex<Option<TrainerStatus>>>,
}

impl Rank0 {
    pub fn start() -> Rank0 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let doc: Arc<Mutex<Option<TrainerStatus>>> = Arc::new(Mutex::new(None));
        let served = doc.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf);
                let reply = match &*served.lock().unwrap() {
                    Some(d) => {
                        let body = serde_json::to_string(d).unwrap();
                        format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                            body.len()
                        )
                    }
                    None => {
                        "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_string()
                    }
                };
                let _ = conn.write_all(reply.as_bytes());
            }
        });
        Rank0 { port, doc }
    }

    /// Serves `edit` of the document being served (a test's hostile answer).
    pub fn tamper(&self, edit: impl FnOnce(&mut TrainerStatus)) {
        edit(self.doc.lock().unwrap().as_mut().expect("a report is being served"));
    }

    pub fn report(&self, step: u64, loss: f64) {
        *self.doc.lock().unwrap() = Some(TrainerStatus {
            phase: TrainerPhase::Training,
            attempt: 1,
            step,
            total_steps: 100,
            tokens: step * 8192,
            total_tokens: 100 * 8192,
            metrics: RunMetrics { loss: Some(loss), tokens_per_second: Some(4096), ..Default::default() },
            last_checkpoint: (step >= 10).then(|| crds::types::CheckpointRef {
                step: step / 10 * 10,
                tokens: step / 10 * 10 * 8192,
                uri: format!("/checkpoints/step-{:08}", step / 10 * 10),
                time: Some("2026-01-01T00:30:00Z".into()),
                val_loss: None,
            }),
            best_checkpoint: None,
            tokens_by_source: Default::default(),
            ranks: Vec::new(),
        });
    }
}

pub struct Harness {
    pub fake: FakeApi,
    pub clock: ManualClock,
    pub metrics: Arc<Metrics>,
    pub ctx: Arc<Context>,
    pub rank0: Rank0,
    /// `--network-policy` (the operator's namespace) when set.
    pub network_policy: Option<String>,
}

impl Harness {
    pub fn new() -> Harness {
        Self::with_network_policy(None)
    }

    pub fn with_network_policy(network_policy: Option<&str>) -> Harness {
        let fake = FakeApi::new();
        fake.insert(serde_json::to_value(TrainingRun::crd()).unwrap());
        fake.insert(serde_json::to_value(crds::types::TrainingDataset::crd()).unwrap());
        let clock = ManualClock::new("2026-01-01T00:00:00Z".parse().unwrap());
        let rank0 = Rank0::start();
        let metrics = Arc::new(Metrics::new().unwrap());
        let network_policy = network_policy.map(str::to_string);
        let ctx = Self::context(&fake, &clock, &metrics, &rank0, network_policy.clone());
        Harness { fake, clock, metrics, ctx, rank0, network_policy }
    }

    pub fn context(
        fake: &FakeApi,
        clock: &ManualClock,
        metrics: &Arc<Metrics>,
        rank0: &Rank0,
        network_policy: Option<String>,
    ) -> Arc<Context> {
        let settings = Settings {
            status_url: format!("http://127.0.0.1:{}/status", rank0.port),
            network_policy,
            ..Settings::default()
        };
        Context::new(fake.client(), settings, metrics.clone(), Arc::new(clock.clone()))
    }

    /// A new operator process: same cluster, fresh memory.
    pub fn restart_operator(&mut self) {
        self.ctx = Self::context(&self.fake, &self.clock, &self.metrics, &self.rank0, self.network_policy.clone());
    }

    /// `kubectl apply` of a TrainingRun.
    pub fn apply(&self, name: &str, spec: &str) {
        super::apply(&self.fake, name, spec);
    }

    pub fn edit_spec(&self, name: &str, f: impl FnOnce(&mut Value)) {
        super::edit_spec(&self.fake, name, f);
    }

    pub async fn reconcile(&self, name: &str) {
        let api: Api<TrainingRun> = Api::namespaced(self.fake.client(), NS);
        let run = api.get(name).await.unwrap();
        controller::reconcile(Arc::new(run), self.ctx.clone())
            .await
            .unwrap_or_else(|e| panic!("reconcile {name}: {e}"));
    }

    /// Reconciles until nothing more is written (at most 6 times).
    pub async fn settle(&self, name: &str) {
        for _ in 0..6 {
            self.fake.reset_writes();
            self.reconcile(name).await;
            if self.fake.writes().is_empty() {
                return;
            }
        }
        panic!("{name} does not settle: {:?}", self.fake.writes());
    }

    pub fn status(&self, name: &str) -> TrainingRunStatus {
        super::status(&self.fake, name)
    }

    pub fn condition(&self, name: &str, type_: &str) -> (String, String, String) {
        super::condition(&self.fake, name, type_)
    }

    pub fn job(&self, name: &str) -> Option<Job> {
        self.fake.get("batch/v1", "Job", Some(NS), name).map(|j| serde_json::from_value(j).unwrap())
    }

    pub fn jobs(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .fake
            .list("batch/v1", "Job", Some(NS))
            .iter()
            .map(|j| j["metadata"]["name"].as_str().unwrap().to_string())
            .collect();
        names.sort();
        names
    }

    /// The job controller: one pod per index, labelled from the template, owned by the Job.
    pub fn start_pods(&self, job: &str, phase: &str) {
        let j = self.fake.get("batch/v1", "Job", Some(NS), job).expect("job exists");
        let n = j["spec"]["completions"].as_i64().unwrap();
        for i in 0..n {
            let pod = json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {
                    "name": format!("{job}-{i}-abcde"), "namespace": NS,
                    "labels": j["spec"]["template"]["metadata"]["labels"],
                    "annotations": {"batch.kubernetes.io/job-completion-index": i.to_string()},
                    "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": j["metadata"]["uid"], "controller": true}],
                    "creationTimestamp": "2026-01-01T00:00:00Z",
                },
                "spec": j["spec"]["template"]["spec"],
                "status": {"phase": phase},
            });
            let mut pod = pod;
            // The scheduler's choice.
            pod["spec"]["nodeName"] = json!(format!("node-{i}"));
            self.fake.insert(pod);
        }
    }

    pub fn pod_status(&self, pod: &str, status: Value) {
        self.fake.set_status("v1", "Pod", Some(NS), pod, status).unwrap();
    }

    pub fn pod_exits(&self, pod: &str, code: i32, reason: &str, message: &str) {
        self.pod_status(
            pod,
            json!({"phase": if code == 0 { "Succeeded" } else { "Failed" }, "containerStatuses": [{
                "name": "trainer", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
                "state": {"terminated": {"exitCode": code, "reason": reason, "message": message, "finishedAt": "2026-01-01T01:00:00Z"}}
            }]}),
        );
    }

    pub fn job_condition(&self, job: &str, type_: &str) {
        self.fake
            .set_status("batch/v1", "Job", Some(NS), job, json!({"conditions": [{"type": type_, "status": "True"}]}))
            .unwrap();
    }

    /// Both indices of `job` (a [`SPEC`] run's) exit 0, rank 0 leaving its final status
    /// at the end of the budget, and the Job completes.
    pub fn complete(&self, job: &str) {
        let done = TrainerStatus {
            phase: TrainerPhase::Done,
            step: 100,
            tokens: 819200,
            ..self.rank0.doc.lock().unwrap().clone().expect("rank 0 reported")
        };
        self.pod_exits(&format!("{job}-0-abcde"), 0, "Completed", &serde_json::to_string(&done).unwrap());
        self.pod_exits(&format!("{job}-1-abcde"), 0, "Completed", "");
        self.job_condition(job, "Complete");
    }

    pub fn pods(&self) -> Vec<String> {
        self.fake
            .list("v1", "Pod", Some(NS))
            .iter()
            .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    }

    /// Events on the run: (type, reason).
    pub fn events(&self) -> Vec<(String, String)> {
        self.fake
            .list("events.k8s.io/v1", "Event", Some(NS))
            .iter()
            .map(|e| {
                (
                    e["type"].as_str().unwrap_or_default().to_string(),
                    e["reason"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect()
    }

    pub fn has_event(&self, type_: &str, reason: &str) -> bool {
        self.events().contains(&(type_.to_string(), reason.to_string()))
    }
}

pub const SPEC: &str = "  model: {preset: nano}
  tokens: 819200
  data:
    mix: [{name: textbook, weight: 1.0, uri: embedded:textbook}]
  topology: {nodes: 2, gpusPerNode: 0}
  batch: {globalTokens: 8192, microBatch: 2, seqLength: 256}
  checkpoint: {everySteps: 10}
  failurePolicy: {maxRestarts: 2, stallTimeout: 10m}
";

/// create → children; pods run; progress; second reconcile writes nothing.
pub async fn running(h: &Harness, name: &str) {
    h.apply(name, SPEC);
    h.settle(name).await;
    h.start_pods(&format!("{name}-a1"), "Running");
    h.rank0.report(5, 3.2);
    h.settle(name).await;
    assert_eq!(h.status(name).phase, Some(RunPhase::Running));
}
