//! A run's world for plan tests: what a reconcile's gather would read, kept as plain
//! data, and each plan's writes made on it as the API server would make them. The test
//! plays the Job controller, the kubelet and rank 0's `/status`; time moves only when
//! it says.

use std::time::Duration;

use crds::contract::TrainerStatus;
use crds::types::TrainingRunStatus;
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use serde_json::json;

use super::plausible::plausible;
use super::{Child, Note, Plan, Step, admission, plan, poll_due};
use crate::observed::{Accepted, Admission, Datasets, Memory, Observed, Poll, PollError, rank0_running};
use crate::resources::{APPLIED_HASH, hash_of};
use crate::settings::Settings;
use crate::status::is_terminal;

pub(crate) struct World {
    /// What the next reconcile reads.
    pub(crate) o: Observed,
    pub(crate) settings: Settings,
    pub(crate) now: Timestamp,
    /// What rank 0's `/status` answers (`None`: nothing yet, an HTTP 503).
    pub(crate) rank0: Option<TrainerStatus>,
    /// Every event published, in order.
    pub(crate) events: Vec<Note>,
    /// The operator's gauges, as the status steps leave them.
    pub(crate) metrics: crate::metrics::Metrics,
}

impl World {
    /// A run of `spec` (the lines under `spec:`) named `llm` just applied, at 00:00.
    pub(crate) fn new(spec: &str) -> World {
        Self::named("llm", spec)
    }

    /// A world whose run is applied next ([`World::apply`]).
    pub(crate) fn empty() -> World {
        Self::new(super::lifecycle_tests::SPEC)
    }

    /// `kubectl apply` of a new run `name` of `spec`: what the world held of another
    /// run is gone, the clock and rank 0 stay.
    pub(crate) fn apply(&mut self, name: &str, spec: &str) {
        let fresh = Self::named(name, spec);
        self.o = fresh.o;
        self.rank0 = None;
    }

    /// [`World::apply`] of the lifecycle tests' run (`SPEC`), settled, its pods running
    /// and rank 0 at step 5.
    pub(crate) fn running(name: &str) -> World {
        let mut w = Self::named(name, super::lifecycle_tests::SPEC);
        w.settle();
        w.start_pods(&format!("{name}-a1"), "Running");
        w.report(5, 3.2);
        w.settle();
        assert_eq!(w.status().phase, Some(crds::types::RunPhase::Running));
        w
    }

    /// Every event published: (type, reason).
    pub(crate) fn events(&self) -> Vec<(String, String)> {
        let type_ = |n: &Note| if n.warning { "Warning" } else { "Normal" }.to_string();
        self.events.iter().map(|n| (type_(n), n.reason.clone())).collect()
    }

    /// Whether an event of `type_` and `reason` whose note contains `text` was published.
    pub(crate) fn event_note(&self, type_: &str, reason: &str, text: &str) -> bool {
        self.events.iter().any(|n| n.warning == (type_ == "Warning") && n.reason == reason && n.message.contains(text))
    }

    /// Both indices of `job` (a [`super::lifecycle_tests::SPEC`] run's) exit 0, rank 0
    /// leaving its final status at the end of the budget, and the Job completes.
    pub(crate) fn complete(&mut self, job: &str) {
        let mut done = self.rank0.clone().expect("rank 0 reported");
        (done.phase, done.step, done.tokens) = (crds::contract::TrainerPhase::Done, 100, 819200);
        self.pod_exits(&format!("{job}-0-abcde"), 0, "Completed", &serde_json::to_string(&done).expect("JSON"));
        self.pod_exits(&format!("{job}-1-abcde"), 0, "Completed", "");
        self.job_condition(job, "Complete");
    }

    /// The config the run's attempts run under: its ConfigMap's.
    pub(crate) fn config(&self) -> crds::RunConfig {
        self.o.accepted.config.clone().expect("the ConfigMap holds a config")
    }

    fn named(name: &str, spec: &str) -> World {
        let mut run = crate::resources::testing::run(spec);
        run.metadata.name = Some(name.into());
        let (datasets, accepted) = (Datasets::Unnamed, Accepted::default());
        let admission = admission(&run, &datasets, &accepted);
        World {
            o: Observed::new(run, datasets, accepted, admission, Memory::default()),
            settings: Settings::default(),
            now: "2026-01-01T00:00:00Z".parse().expect("a timestamp"),
            rank0: None,
            events: Vec::new(),
            metrics: crate::metrics::Metrics::new().expect("the metrics register"),
        }
    }

    /// One reconcile: what gather reads (the config admitted, rank 0 when a poll is
    /// due), the plan, and its writes made. The plan, to look at.
    pub(crate) fn reconcile(&mut self) -> Plan {
        self.reconcile_crashing_at(|_| false)
    }

    /// A reconcile whose operator dies just before the first step that `crash` matches:
    /// the steps before it were made, none after; the next operator remembers nothing.
    pub(crate) fn reconcile_crashing_at(&mut self, crash: impl Fn(&Step) -> bool) -> Plan {
        let o = &mut self.o;
        o.admission = admission(&o.run, &o.datasets, &o.accepted);
        (o.attempts.trainer, o.attempts.links, o.poll) = (None, None, Poll::NotAsked);
        if let Admission::Admitted { cfg, .. } = &o.admission
            && !is_terminal(&o.run.status.clone().unwrap_or_default())
            && poll_due(&o.memory, self.now, &self.settings)
            && rank0_running(&o.attempts, cfg.attempt)
        {
            o.poll = match &self.rank0 {
                None => Poll::Failed(PollError::Unanswered("GET /status: HTTP 503".into())),
                Some(doc) => match plausible(doc, cfg) {
                    Ok(()) => {
                        o.attempts.trainer = Some(doc.clone());
                        Poll::Answered
                    }
                    Err(why) => Poll::Failed(PollError::Refused(format!("refused: implausible status: {why}"))),
                },
            };
            o.memory.last_poll = Some(self.now);
        }
        let mut plan = plan(o, &self.settings, self.now);
        if let Some(at) = plan.steps.iter().position(crash) {
            let made = Plan { steps: plan.steps[..at].to_vec(), ..plan.clone() };
            self.execute(&made);
            self.o.memory = Memory::default();
            plan.steps.truncate(at);
            return plan;
        }
        self.execute(&plan);
        plan
    }

    /// Reconciles until a plan writes nothing (at most 6 times); the writes made.
    pub(crate) fn settle(&mut self) -> Vec<Step> {
        let mut writes = Vec::new();
        for _ in 0..6 {
            let plan = self.reconcile();
            if !plan.writes() {
                return writes;
            }
            writes.extend(plan.steps.into_iter().filter(|s| !matches!(s, Step::Status { write: false, .. })));
        }
        panic!("the run does not settle: {writes:#?}");
    }

    /// `kubectl edit`: `f` changes the spec (as JSON), the generation goes up.
    pub(crate) fn edit_spec(&mut self, f: impl FnOnce(&mut serde_json::Value)) {
        let mut spec = serde_json::to_value(&self.o.run.spec).expect("a spec serializes");
        f(&mut spec);
        self.o.run.spec = serde_json::from_value(spec).expect("the edited spec is a spec");
        self.o.run.metadata.generation = Some(self.o.run.metadata.generation.unwrap_or(1) + 1);
    }

    /// Rank 0 reports `step` of [`super::lifecycle_tests::SPEC`]'s 100 with `loss`.
    pub(crate) fn report(&mut self, step: u64, loss: f64) {
        self.rank0 = Some(TrainerStatus {
            phase: crds::contract::TrainerPhase::Training,
            attempt: self.status().attempt.max(1),
            step,
            total_steps: 100,
            tokens: step * 8192,
            total_tokens: 100 * 8192,
            metrics: crds::types::RunMetrics { loss: Some(loss), tokens_per_second: Some(4096), ..Default::default() },
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

    pub(crate) fn advance(&mut self, by: Duration) {
        self.now += by;
    }

    pub(crate) fn status(&self) -> TrainingRunStatus {
        self.o.run.status.clone().unwrap_or_default()
    }

    /// (status, reason, message) of condition `type_`.
    pub(crate) fn condition(&self, type_: &str) -> (String, String, String) {
        let s = self.status();
        let c = crate::status::condition(&s, type_).unwrap_or_else(|| panic!("no {type_} condition in {s:#?}"));
        (c.status.clone(), c.reason.clone(), c.message.clone())
    }

    /// Whether an event of `type_` (Normal or Warning) and `reason` was published.
    pub(crate) fn has_event(&self, type_: &str, reason: &str) -> bool {
        self.events.iter().any(|n| n.warning == (type_ == "Warning") && n.reason == reason)
    }

    pub(crate) fn jobs(&self) -> Vec<String> {
        self.o.attempts.jobs.iter().map(|j| j.name_any()).collect()
    }

    pub(crate) fn job(&self, name: &str) -> &Job {
        self.o.attempts.jobs.iter().find(|j| j.name_any() == name).unwrap_or_else(|| panic!("no Job {name}"))
    }

    /// The Job controller and the scheduler: one pod per index of Job `job`, labelled
    /// from its template, owned by it, on node `node-<index>`, in `phase`.
    pub(crate) fn start_pods(&mut self, job: &str, phase: &str) {
        let j = serde_json::to_value(self.job(job)).expect("a Job serializes");
        for i in 0..j["spec"]["completions"].as_i64().expect("completions") {
            let pod = json!({
                "metadata": {
                    "name": format!("{job}-{i}-abcde"), "namespace": j["metadata"]["namespace"],
                    "labels": j["spec"]["template"]["metadata"]["labels"],
                    "annotations": {"batch.kubernetes.io/job-completion-index": i.to_string()},
                    "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job,
                        "uid": j["metadata"]["uid"], "controller": true}],
                    "creationTimestamp": "2026-01-01T00:00:00Z",
                },
                "spec": {"nodeName": format!("node-{i}"), "containers": j["spec"]["template"]["spec"]["containers"]},
                "status": {"phase": phase},
            });
            self.o.attempts.pods.push(serde_json::from_value(pod).expect("a pod"));
        }
    }

    /// The kubelet (or the scheduler, or the node lifecycle controller): pod `pod`'s
    /// status, as the API server would store it.
    pub(crate) fn pod_status(&mut self, pod: &str, status: serde_json::Value) {
        self.pod_mut(pod).status = Some(serde_json::from_value(status).expect("a pod status"));
    }

    /// The kubelet: pod `pod`'s trainer container exited with `code`, leaving `message`
    /// as its termination message.
    pub(crate) fn pod_exits(&mut self, pod: &str, code: i32, reason: &str, message: &str) {
        let status = json!({"phase": if code == 0 { "Succeeded" } else { "Failed" }, "containerStatuses": [{
            "name": "trainer", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
            "state": {"terminated": {"exitCode": code, "reason": reason, "message": message,
                "finishedAt": "2026-01-01T01:00:00Z"}}
        }]});
        let p = self.pod_mut(pod);
        p.status = Some(serde_json::from_value(status).expect("a pod status"));
    }

    /// The Job controller: condition `type_` True on Job `job`.
    pub(crate) fn job_condition(&mut self, job: &str, type_: &str) {
        let status = json!({"conditions": [{"type": type_, "status": "True"}]});
        let j = self.o.attempts.jobs.iter_mut().find(|j| j.name_any() == job).expect("the Job");
        j.status = Some(serde_json::from_value(status).expect("a Job status"));
    }

    fn pod_mut(&mut self, name: &str) -> &mut Pod {
        self.o.attempts.pods.iter_mut().find(|p| p.name_any() == name).unwrap_or_else(|| panic!("no pod {name}"))
    }

    /// `plan`'s writes, made as the API server makes them.
    fn execute(&mut self, plan: &Plan) {
        for step in &plan.steps {
            match step {
                Step::Apply(child) => self.apply_child(child),
                Step::Status { status, write, checkpoint_every_tokens } => {
                    if *write {
                        self.o.run.status = Some((**status).clone());
                    }
                    self.o.memory = plan.memory.clone();
                    let (ns, name) = (self.o.run.namespace().unwrap_or_default(), self.o.run.name_any());
                    self.metrics.observe_run(&ns, &name, status, *checkpoint_every_tokens);
                }
                Step::Publish(note) => self.events.push(note.clone()),
                Step::DeleteJob(name) => {
                    // Background propagation: the Job and its pods go.
                    self.o.attempts.jobs.retain(|j| j.name_any() != *name);
                    self.o.attempts.pods.retain(|p| !p.owner_references().iter().any(|r| r.name == *name));
                }
                Step::DeletePod(name) => self.o.attempts.pods.retain(|p| p.name_any() != *name),
                Step::SuspendJob(s) => {
                    // Merge-patched, as the API server patches it (RFC 7386).
                    let live = self.o.attempts.jobs.iter_mut().find(|j| j.name_any() == s.job).expect("a live Job");
                    let mut value = serde_json::to_value(&*live).expect("a Job serializes");
                    json_patch::merge(&mut value, &s.patch());
                    *live = serde_json::from_value(value).expect("a patched Job");
                }
                Step::ActivateWorkload { .. } => {}
            }
        }
    }

    fn apply_child(&mut self, child: &Child) {
        let o = &mut self.o;
        match child {
            Child::ConfigMap(c) => {
                o.accepted.configmap_hash = Some(hash_of(c));
                let text = &c.data.as_ref().expect("data")[crds::contract::CONFIG_KEY];
                o.accepted.config = Some(serde_json::from_str(text).expect("the ConfigMap holds a config"));
            }
            Child::Service(s) => o.service_hash = Some(hash_of(s)),
            Child::Claim(c) => {
                o.accepted.claim_hash = Some(hash_of(c));
                o.accepted.claim = c.spec.as_ref().and_then(|s| s.access_modes.clone());
            }
            Child::NetworkPolicy(p) => o.network_policy_hash = Some(hash_of(p)),
            Child::Job(j) => {
                let mut live = (**j).clone();
                live.annotations_mut().insert(APPLIED_HASH.into(), hash_of(j));
                live.metadata.uid = Some(format!("uid-{}", live.name_any()));
                self.put_job(live);
            }
        }
    }

    /// Job `job` created, or its spec and metadata replaced (its status kept).
    fn put_job(&mut self, mut job: Job) {
        let jobs = &mut self.o.attempts.jobs;
        match jobs.iter_mut().find(|j| j.name_any() == job.name_any()) {
            Some(live) => {
                job.status = live.status.take();
                job.metadata.uid = live.metadata.uid.clone();
                *live = job;
            }
            None => jobs.push(job),
        }
    }
}
