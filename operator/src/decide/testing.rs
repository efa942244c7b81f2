//! Scenes for the handlers' table tests: a run, its config and what was observed.

use crds::types::TrainingRunStatus;
use crds::{RunConfig, TrainingRun};
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};
use serde_json::json;

use super::context::{Ctx, Situation};
use crate::change::Change;
use crate::failure::tests::job;
use crate::observed::{Attempts, InitRun};
use crate::resources::ATTEMPT_LABEL;
use crate::resources::testing::run;
use crate::settings::Settings;

/// Everything a decision reads, owned.
pub(super) struct Scene {
    pub(super) run: TrainingRun,
    pub(super) cfg: RunConfig,
    pub(super) obs: Attempts,
    pub(super) settings: Settings,
    pub(super) change: Change,
    pub(super) now: Timestamp,
}

impl Scene {
    /// A new run of `spec` (the lines under `spec:`), resolved, with nothing observed.
    pub(super) fn new(spec: &str) -> Scene {
        let run = run(spec);
        let cfg = crate::validate::validate(&run, 1).expect("the scene's spec resolves");
        Scene {
            run,
            cfg,
            obs: Attempts::default(),
            settings: Settings::default(),
            change: Change::Unchanged,
            now: "2026-01-01T01:00:00Z".parse().expect("a timestamp"),
        }
    }

    pub(super) fn status(mut self, edit: impl FnOnce(&mut TrainingRunStatus)) -> Scene {
        edit(self.run.status.get_or_insert_default());
        self
    }

    pub(super) fn change(mut self, change: Change) -> Scene {
        self.change = change;
        self
    }

    pub(super) fn init_run(mut self, state: InitRun) -> Scene {
        self.obs.init_run = Some(state);
        self
    }

    /// The Job of `attempt`, running.
    pub(super) fn job(self, attempt: u32) -> Scene {
        self.job_with(attempt, json!([]))
    }

    /// The Job of `attempt` with these status conditions.
    pub(super) fn job_with(mut self, attempt: u32, conditions: serde_json::Value) -> Scene {
        let mut j: Job = job(conditions);
        j.metadata.name = Some(format!("llm-a{attempt}"));
        j.metadata.uid = Some(format!("uid-a{attempt}"));
        j.metadata.labels = Some([(ATTEMPT_LABEL.to_string(), attempt.to_string())].into());
        self.obs.jobs.push(j);
        self
    }

    pub(super) fn situation(&self) -> Situation<'_> {
        Situation {
            run: &self.run,
            cfg: &self.cfg,
            obs: &self.obs,
            now: self.now,
            settings: &self.settings,
            change: &self.change,
        }
    }

    pub(super) fn ctx(&self) -> Ctx<'_> {
        Ctx::new(&self.situation())
    }
}

/// A status condition as the API stores it.
pub(super) fn condition(type_: &str, status: &str, reason: &str, message: &str) -> Condition {
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: Time("2026-01-01T00:00:00Z".parse().expect("a timestamp")),
        observed_generation: Some(1),
    }
}

/// `pod` owned by the Job with `uid`, or by nothing.
pub(super) fn owned_by(mut pod: Pod, uid: Option<String>) -> Pod {
    pod.metadata.owner_references = uid.map(|uid| {
        vec![OwnerReference {
            api_version: "batch/v1".into(),
            kind: "Job".into(),
            name: "job".into(),
            uid,
            ..Default::default()
        }]
    });
    pod
}

/// A run restarting as attempt 2 after a pod of attempt 1 failed.
pub(super) fn restarting_after_pod_failed(s: &mut TrainingRunStatus) {
    s.attempt = 2;
    s.phase = Some(crds::types::RunPhase::Restarting);
    s.reason = Some("PodFailed".into());
    s.conditions.push(condition("Restarting", "True", "PodFailed", "attempt 1 failed"));
}
