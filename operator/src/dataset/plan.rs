//! The plan of one reconcile of a dataset, pure: its status first, so that the Job it
//! names is never created unrecorded; then its events, the stale Jobs that go, and the
//! Job of the current step where the live one differs.

use std::time::Duration;

use crds::types::{DatasetPhase, TrainingDataset, TrainingDatasetStatus};
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;

use super::decide::{self, Observed};
use super::{build, validate};
use crate::decide::Note;
use crate::resources::{applied_hash, hash_of};
use crate::settings::Settings;

/// What one reconcile of a dataset writes, in order, and when it looks again.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub steps: Vec<Step>,
    pub requeue: Duration,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// The decided status, where it differs from the live one.
    Status(Box<TrainingDatasetStatus>),
    Publish(Note),
    /// A Job of an earlier generation, with its pods.
    DeleteJob(String),
    /// Server-side apply of the current step's Job.
    ApplyJob(Box<Job>),
}

pub fn plan(ds: &TrainingDataset, obs: &Observed, settings: &Settings, now: Timestamp) -> Plan {
    let prepared = validate::validate(ds);
    let d = decide::decide(ds, &prepared, obs, now);
    let mut steps = Vec::new();
    if ds.status.clone().unwrap_or_default() != d.status {
        steps.push(Step::Status(Box::new(d.status.clone())));
    }
    steps.extend(d.notes.into_iter().map(Step::Publish));
    steps.extend(d.delete_jobs.into_iter().map(Step::DeleteJob));
    if let (Some(step), Ok(prepared)) = (d.create, &prepared) {
        let job = build::job(ds, prepared, step, &settings.trainer_image);
        let live = obs.jobs.iter().find(|j| j.name_any() == job.name_any()).and_then(applied_hash);
        if live != Some(hash_of(&job)) {
            steps.push(Step::ApplyJob(Box::new(job)));
        }
    }
    let requeue = match d.status.phase {
        Some(DatasetPhase::Preparing) => settings.status_poll_interval,
        _ => settings.requeue_interval,
    };
    Plan { steps, requeue }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dataset() -> TrainingDataset {
        let mut ds: TrainingDataset = serde_yaml_ng::from_str(
            "apiVersion: training.puretransformer.dev/v1alpha1\nkind: TrainingDataset\n\
             metadata: {name: web, namespace: ml, generation: 1, uid: u}\n\
             spec: {source: {uris: ['pvc://raw/web']}, tokenizer: {embedded: true}, output: 'pvc://prepared/web'}\n",
        )
        .unwrap();
        ds.status = None;
        ds
    }

    fn now() -> Timestamp {
        Timestamp::from_second(1_000_000).unwrap()
    }

    /// `plan`'s writes made on the dataset and its Jobs, as the API server makes them.
    fn made(ds: &mut TrainingDataset, jobs: &mut Vec<Job>, plan: &Plan) {
        for step in &plan.steps {
            match step {
                Step::Status(status) => ds.status = Some((**status).clone()),
                Step::ApplyJob(job) => {
                    let mut live = (**job).clone();
                    live.annotations_mut().insert(crate::resources::APPLIED_HASH.into(), hash_of(&**job));
                    jobs.retain(|j| j.name_any() != live.name_any());
                    jobs.push(live);
                }
                Step::DeleteJob(name) => jobs.retain(|j| j.name_any() != *name),
                Step::Publish(_) => {}
            }
        }
    }

    /// A new dataset: its status (naming the Job) before the Job; planned again on what
    /// the writes left, it settles, and then nothing is written.
    #[test]
    fn the_status_is_written_before_the_job_it_names_and_a_settled_dataset_writes_nothing() {
        let settings = Settings::default();
        let (mut ds, mut jobs) = (dataset(), Vec::new());
        let first = plan(&ds, &Observed::default(), &settings, now());
        let status_at = first.steps.iter().position(|s| matches!(s, Step::Status(_)));
        let job_at = first.steps.iter().position(|s| matches!(s, Step::ApplyJob(_)));
        assert!(status_at.is_some() && job_at.is_some(), "{first:#?}");
        assert!(status_at < job_at, "the status first: {first:#?}");
        made(&mut ds, &mut jobs, &first);
        for _ in 0..3 {
            let next = plan(&ds, &Observed { jobs: jobs.clone(), ..Observed::default() }, &settings, now());
            if next.steps.is_empty() {
                assert_eq!(next.requeue, settings.status_poll_interval, "a preparing dataset is polled");
                return;
            }
            made(&mut ds, &mut jobs, &next);
        }
        panic!("the dataset does not settle: {:#?}", ds.status);
    }
}
