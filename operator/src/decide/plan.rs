//! The plan of one reconcile, pure: from what was observed, the writes that take the
//! run where its decision says, in the one order they are made ([`Plan::steps`]).
//!
//! The order is what keeps a crash between two writes harmless:
//! 1. the children that hold no decision (ConfigMap, Service, claim, NetworkPolicy),
//!    each only when its applied-hash differs, so that a settled run writes nothing;
//! 2. the status, before anything it records happens: a restart is recorded before its
//!    Job goes, so that a crash in between cannot lose or double-count it, and the
//!    ConfigMap of the config a gang restarts for is written only after it;
//! 3. the events, after the status that says so;
//! 4. the Jobs and pods that go, the Job's suspension, the Kueue Workload's activation;
//! 5. the Job of the current attempt, last: the ConfigMap it mounts already holds it.

use std::time::Duration;

use crds::types::{RunPhase, TrainingRunStatus};
use crds::{RunConfig, TrainingRun};
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::ResourceExt;

use super::poll::{STATUS_REFUSED, refusal_event_due};
use super::{Decision, Note, Situation};
use crate::change::Change;
use crate::clock::seconds_between;
use crate::mix_datasets;
use crate::observed::{Admission, Datasets, Memory, Observed, Poll, PollError};
use crate::resources::{self, Inputs, applied_hash, hash_of};
use crate::settings::Settings;
use crate::status::{self, is_terminal};

/// What one reconcile writes, in order, and when it looks again.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub steps: Vec<Step>,
    pub requeue: Duration,
    /// What the operator remembers of the run once the status step is done.
    pub memory: Memory,
}

/// One write of a plan.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Server-side apply of a child whose applied-hash differs from the live one's.
    Apply(Child),
    /// The decided status. The operator's gauges always follow it; it is written to the
    /// API when `write` (a change of phase or condition at once, progress at most every
    /// `statusWriteInterval`).
    Status { status: Box<TrainingRunStatus>, write: bool, checkpoint_every_tokens: Option<u64> },
    /// An event on the run.
    Publish(Note),
    /// A Job of the run, with its pods.
    DeleteJob(String),
    /// A pod no live Job owns.
    DeletePod(String),
    /// The current attempt's Job's `spec.suspend`, merge-patched.
    SuspendJob(resources::Suspension),
    /// `spec.active` of the current Job's Kueue Workload.
    ActivateWorkload { name: String, active: bool },
}

/// A child the operator applies.
#[derive(Clone, Debug, PartialEq)]
pub enum Child {
    ConfigMap(Box<ConfigMap>),
    Service(Box<Service>),
    Claim(Box<PersistentVolumeClaim>),
    NetworkPolicy(Box<NetworkPolicy>),
    Job(Box<Job>),
}

impl Plan {
    /// Whether the plan writes anything to the API.
    pub fn writes(&self) -> bool {
        self.steps.iter().any(|s| !matches!(s, Step::Status { write: false, .. }))
    }
}

/// The plan for what `o` observed at `now`.
pub fn plan(o: &Observed, settings: &Settings, now: Timestamp) -> Plan {
    match &o.admission {
        Admission::Waiting(message) => {
            let d = super::waiting_for_datasets(&o.run, message, now);
            concluded(o, d, &o.datasets, None, At { settings, now })
        }
        // The spec's fields are what is wrong; whether its datasets are ready is moot.
        Admission::Invalid(invalid) => {
            let d = super::invalid(&o.run, invalid, now);
            concluded(o, d, &Datasets::Unnamed, None, At { settings, now })
        }
        Admission::Admitted { cfg, change } => admitted(o, cfg, change, settings, now),
    }
}

/// The plan of a run whose config was admitted: its children, the decision, and what
/// acts it out.
fn admitted(o: &Observed, cfg: &RunConfig, change: &Change, settings: &Settings, now: Timestamp) -> Plan {
    let run = &o.run;
    let restart = matches!(change, Change::Restart { .. });
    let inputs = Inputs { run, cfg, trainer_image: &settings.trainer_image };
    let mut steps = Vec::new();
    if !is_terminal(&run.status.clone().unwrap_or_default()) {
        steps.extend(children(o, &inputs, settings, restart));
    }
    let d = super::decide(&Situation { run, cfg, obs: &o.attempts, now, settings, change });
    let every_tokens = u64::from(cfg.checkpoint.every_steps) * cfg.batch.tokens_per_step;
    let mut plan = concluded(o, d.clone(), &o.datasets, Some(every_tokens), At { settings, now });
    if let Poll::Failed(PollError::Refused(message)) = &o.poll
        && refusal_event_due(o.memory.last_refusal_event, now)
    {
        let note = Note { warning: true, reason: STATUS_REFUSED.into(), message: message.clone() };
        plan.steps.push(Step::Publish(note));
        plan.memory.last_refusal_event = Some(now);
    }
    steps.append(&mut plan.steps);
    if restart {
        let configmap = resources::configmap(&inputs);
        steps.extend(apply_changed(o.accepted.configmap_hash.as_deref(), Child::ConfigMap(Box::new(configmap))));
    }
    steps.extend(acts(o, &inputs, &d));
    Plan { steps, ..plan }
}

/// The children that hold no decision, each where it differs from the live one. The
/// ConfigMap of a config the gang restarts for waits for the status that records the
/// restart.
fn children(o: &Observed, inputs: &Inputs, settings: &Settings, restart: bool) -> Vec<Step> {
    let mut steps = Vec::new();
    if !restart {
        let configmap = Child::ConfigMap(Box::new(resources::configmap(inputs)));
        steps.extend(apply_changed(o.accepted.configmap_hash.as_deref(), configmap));
    }
    steps.extend(apply_changed(o.service_hash.as_deref(), Child::Service(Box::new(resources::service(inputs)))));
    let mut pvc = resources::pvc(inputs);
    if let (Some(modes), Some(spec)) = (&o.accepted.claim, pvc.spec.as_mut()) {
        // A claim's access modes never change; a ReadWriteMany claim serves one node too.
        spec.access_modes = Some(modes.clone());
    }
    steps.extend(apply_changed(o.accepted.claim_hash.as_deref(), Child::Claim(Box::new(pvc))));
    if let Some(operator_ns) = &settings.network_policy {
        let policy = resources::network_policy(inputs, operator_ns, settings.scrape_namespace.as_deref());
        steps.extend(apply_changed(o.network_policy_hash.as_deref(), Child::NetworkPolicy(Box::new(policy))));
    }
    steps
}

/// What acts the decision out after its status: the Jobs and pods that go, the
/// suspension, the Workload's activation, and the current attempt's Job.
fn acts(o: &Observed, inputs: &Inputs, d: &Decision) -> Vec<Step> {
    let mut steps: Vec<Step> = d.delete_jobs.iter().cloned().map(Step::DeleteJob).collect();
    steps.extend(d.delete_pods.iter().cloned().map(Step::DeletePod));
    let run = inputs.run;
    let queued = run.spec.queue_name.is_some();
    let live_job = |name: &str| o.attempts.jobs.iter().find(|j| j.name_any() == name);
    if let Some(suspend) = d.suspend_job
        && let Some(live) = live_job(&resources::job_name(&run.name_any(), d.status.attempt))
    {
        steps.push(Step::SuspendJob(resources::suspension(&live.name_any(), suspend, queued)));
    }
    if let (Some(active), Some(w)) = (d.workload_active, &o.attempts.workload) {
        steps.push(Step::ActivateWorkload { name: w.name.clone(), active });
    }
    if d.create_job {
        let job = resources::job(inputs, run.spec.suspend || queued);
        let live_hash = live_job(&job.name_any()).and_then(applied_hash);
        steps.extend(apply_changed(live_hash.as_deref(), Child::Job(Box::new(job))));
    }
    steps
}

/// The settings and the time a plan is made at.
#[derive(Clone, Copy)]
struct At<'a> {
    settings: &'a Settings,
    now: Timestamp,
}

/// `child` applied, unless the live object carries its applied-hash.
fn apply_changed(live_hash: Option<&str>, child: Child) -> Option<Step> {
    let hash = match &child {
        Child::ConfigMap(c) => hash_of(c),
        Child::Service(s) => hash_of(s),
        Child::Claim(c) => hash_of(c),
        Child::NetworkPolicy(p) => hash_of(p),
        Child::Job(j) => hash_of(j),
    };
    (live_hash != Some(hash.as_str())).then_some(Step::Apply(child))
}

/// The decided status (with the Waiting condition of a run whose mix names datasets),
/// whether it is written now, its events, and the requeue: the plan of a decision
/// that acts on no child.
fn concluded(o: &Observed, mut d: Decision, datasets: &Datasets, checkpoint_every_tokens: Option<u64>, at: At) -> Plan {
    let At { settings, now } = at;
    let run: &TrainingRun = &o.run;
    let old = run.status.clone().unwrap_or_default();
    let waiting = match datasets {
        Datasets::Unnamed => None,
        Datasets::Ready => Some(None),
        Datasets::Waiting(message) => Some(Some(message.as_str())),
    };
    if let Some(waiting) = waiting {
        mix_datasets::with_waiting_condition(&old, &mut d.status, waiting, run.metadata.generation, now);
    }
    let significant = status::significant_change(&old, &d.status);
    let progressed = old != d.status;
    let write_due =
        o.memory.last_write.is_none_or(|t| seconds_between(t, now) >= settings.status_write_interval.as_secs());
    let write = significant || (progressed && write_due);
    let mut memory = o.memory.clone();
    if write {
        memory.last_write = Some(now);
    }
    let requeue = match d.status.phase {
        Some(RunPhase::Running) => settings.status_poll_interval,
        Some(RunPhase::Succeeded | RunPhase::Failed) if is_terminal(&d.status) => settings.requeue_interval,
        _ if progressed && !significant => settings.status_write_interval,
        Some(RunPhase::Pending) => settings.pending_timeout.min(Duration::from_secs(60)),
        _ => Duration::from_secs(30).min(settings.requeue_interval),
    };
    let mut steps = vec![Step::Status { status: Box::new(d.status), write, checkpoint_every_tokens }];
    steps.extend(d.notes.into_iter().map(Step::Publish));
    Plan { steps, requeue, memory }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
