use super::*;
use crate::change::Change;
use crate::observed::{Attempts, InitRun, LinkProbe};
use crate::resources::{ATTEMPT_LABEL, SUSPENDED_BY_OPERATOR};
use crate::settings::Settings;
use crate::status;
use k8s_openapi::api::core::v1::Pod;

use crate::failure::tests::{exited, job as job_with, running};
use crate::resources::testing::{GPU_SPEC, GRPO_SPEC, run};
use crds::contract::{FailureReason, TerminationMessage, TrainerStatus};
use k8s_openapi::api::batch::v1::Job;
use serde_json::json;

fn t(s: &str) -> Timestamp {
    format!("2026-01-01T{s}Z").parse().unwrap()
}

/// Decides for `r`, then stores the decided status on it, as the API would.
fn step(r: &mut TrainingRun, obs: &Attempts, now: Timestamp) -> Decision {
    let cfg = crate::validate::validate(r, r.status.as_ref().map_or(0, |s| s.attempt)).unwrap();
    let d =
        decide(&Situation { run: r, cfg: &cfg, obs, now, settings: &Settings::default(), change: &Change::Unchanged });
    if d.create_job {
        assert_eq!(d.status.attempt, cfg.attempt, "the ConfigMap built from cfg holds the new Job's attempt");
    }
    r.status = Some(d.status.clone());
    d
}

fn attempt_job(attempt: u32, conditions: serde_json::Value) -> Job {
    let mut j = job_with(conditions);
    j.metadata.name = Some(format!("llm-a{attempt}"));
    j.metadata.labels = Some([(ATTEMPT_LABEL.to_string(), attempt.to_string())].into());
    j
}

fn labelled(mut p: Pod, attempt: u32) -> Pod {
    p.metadata.labels = Some([(ATTEMPT_LABEL.to_string(), attempt.to_string())].into());
    p
}

/// Rank 0's report at `step` of attempt 1 of a [`GPU_SPEC`] run.
fn report(step: u64) -> TrainerStatus {
    TrainerStatus {
        phase: crds::contract::TrainerPhase::Training,
        attempt: 1,
        step,
        total_steps: 244,
        tokens: step * 262144,
        total_tokens: 244 * 262144,
        metrics: Default::default(),
        last_checkpoint: None,
        best_checkpoint: None,
        tokens_by_source: Default::default(),
        ranks: Vec::new(),
    }
}

fn cond(r: &TrainingRun, type_: &str) -> (String, String) {
    let c = status::condition(r.status.as_ref().unwrap(), type_).unwrap_or_else(|| panic!("no {type_}"));
    (c.status.clone(), c.reason.clone())
}

#[test]
fn first_decision_creates_the_job_and_writes_every_condition() {
    let mut r = run(GPU_SPEC);
    let d = step(&mut r, &Attempts::default(), t("00:00:00"));
    assert!(d.create_job);
    let reasons: Vec<&str> = d.notes.iter().map(|n| n.reason.as_str()).collect();
    assert_eq!(reasons, ["JobCreated"], "one event for the new Job");
    let s = &d.status;
    assert_eq!((s.phase, s.attempt, s.job_name.as_deref()), (Some(RunPhase::Pending), 1, Some("llm-a1")));
    assert_eq!(s.topology.as_deref(), Some("2x4"));
    assert_eq!(s.progress.as_ref().unwrap().display.as_deref(), Some("0.0%"));
    let types: Vec<&str> = s.conditions.iter().map(|c| c.type_.as_str()).collect();
    let two_by_four = [&status::CONDITION_TYPES[..], &["Straggler"]].concat();
    assert_eq!(types, two_by_four, "8 ranks: Straggler too");
    assert!(s.conditions.iter().all(|c| c.observed_generation == Some(1)));
    assert_eq!(cond(&r, "Accepted"), ("True".into(), "Accepted".into()));
    // Once the Job exists, deciding again on the same world asks for nothing
    // new and changes nothing.
    let obs = Attempts { jobs: vec![attempt_job(1, json!([]))], ..Default::default() };
    let d = step(&mut r, &obs, t("00:00:05"));
    assert_eq!((d.status.phase, d.status.reason.as_deref()), (Some(RunPhase::Pending), Some("PodsPending")));
    let before = r.status.clone().unwrap();
    let d = step(&mut r, &obs, t("00:00:10"));
    assert!(!d.create_job && d.delete_jobs.is_empty() && d.suspend_job.is_none() && d.notes.is_empty());
    assert_eq!(d.status, before);
}

#[test]
fn running_then_succeeded() {
    let mut r = run(GPU_SPEC);
    step(&mut r, &Attempts::default(), t("00:00:00"));
    let pods = vec![labelled(running(0), 1), labelled(running(1), 1)];
    let obs = Attempts { jobs: vec![attempt_job(1, json!([]))], pods, ..Default::default() };
    let d = step(&mut r, &obs, t("00:01:00"));
    assert_eq!(d.status.phase, Some(RunPhase::Running));
    assert_eq!(d.notes.last().unwrap().reason, "Training");
    assert_eq!(cond(&r, "Running"), ("True".into(), "Training".into()));
    let obs =
        Attempts { jobs: vec![attempt_job(1, json!([{"type": "Complete", "status": "True"}]))], ..Default::default() };
    let d = step(&mut r, &obs, t("05:00:00"));
    assert_eq!(d.status.phase, Some(RunPhase::Succeeded));
    assert_eq!(d.status.progress.as_ref().unwrap().percent, 100.0);
    assert!(d.status.completion_time.is_some());
    assert_eq!(cond(&r, "Succeeded").0, "True");
    assert_eq!(cond(&r, "Running"), ("False".into(), "Completed".into()));
    // Terminal: nothing more happens, even with the Job gone.
    let d = step(&mut r, &Attempts::default(), t("06:00:00"));
    assert!(!d.create_job && d.notes.is_empty());
}

#[test]
fn nan_fails_without_a_new_attempt() {
    let mut r = run(GPU_SPEC);
    step(&mut r, &Attempts::default(), t("00:00:00"));
    let nan =
        TerminationMessage { reason: FailureReason::NaNLoss, step: Some(7), detail: "loss=nan".into(), samples: None }
            .to_json();
    let obs = Attempts {
        jobs: vec![attempt_job(1, json!([]))],
        pods: vec![labelled(exited(1, 86, "Error", &nan), 1)],
        ..Default::default()
    };
    let d = step(&mut r, &obs, t("00:10:00"));
    assert_eq!(
        (d.status.phase, d.status.reason.as_deref(), d.status.attempt),
        (Some(RunPhase::Failed), Some("NaNLoss"), 1)
    );
    assert!(!d.create_job && d.delete_jobs.is_empty());
    assert!(d.notes[0].warning);
    assert_eq!(cond(&r, "Failed"), ("True".into(), "NaNLoss".into()));
}

#[test]
fn transient_failures_restart_until_max_restarts() {
    let mut r = run(&format!("{GPU_SPEC}  failurePolicy: {{maxRestarts: 1}}\n"));
    step(&mut r, &Attempts::default(), t("00:00:00"));
    let crash = |a| Attempts {
        jobs: vec![attempt_job(a, json!([]))],
        pods: vec![labelled(exited(0, 1, "Error", "boom"), a)],
        ..Default::default()
    };
    let d = step(&mut r, &crash(1), t("00:10:00"));
    assert_eq!((d.status.phase, d.status.attempt, d.status.restarts), (Some(RunPhase::Restarting), 2, 1));
    assert_eq!(d.delete_jobs, vec!["llm-a1"]);
    assert_eq!(d.status.job_name.as_deref(), Some("llm-a2"));
    assert_eq!(cond(&r, "Restarting"), ("True".into(), "PodFailed".into()));
    // While attempt 1's pods terminate, attempt 2 waits.
    let old = Attempts { jobs: vec![], pods: vec![labelled(running(0), 1)], ..Default::default() };
    let d = step(&mut r, &old, t("00:10:05"));
    assert!(!d.create_job);
    assert_eq!(d.status.phase, Some(RunPhase::Restarting));
    let d = step(&mut r, &Attempts::default(), t("00:10:30"));
    assert!(d.create_job);
    // Attempt 2 runs, then fails too: no restarts left.
    let pods = vec![labelled(running(0), 2), labelled(running(1), 2)];
    let d =
        step(&mut r, &Attempts { jobs: vec![attempt_job(2, json!([]))], pods, ..Default::default() }, t("00:11:00"));
    assert_eq!(d.status.phase, Some(RunPhase::Running));
    assert_eq!(cond(&r, "Restarting"), ("False".into(), "Resumed".into()));
    let d = step(&mut r, &crash(2), t("00:20:00"));
    assert_eq!((d.status.phase, d.status.reason.as_deref()), (Some(RunPhase::Failed), Some("MaxRestartsExceeded")));
    assert!(d.delete_jobs.is_empty());
}

#[test]
fn disruptions_do_not_count() {
    let mut r = run(&format!("{GPU_SPEC}  failurePolicy: {{maxRestarts: 0}}\n"));
    step(&mut r, &Attempts::default(), t("00:00:00"));
    let evicted = crate::failure::tests::pod(
        0,
        json!({"phase": "Failed", "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}]}),
    );
    let obs =
        Attempts { jobs: vec![attempt_job(1, json!([]))], pods: vec![labelled(evicted, 1)], ..Default::default() };
    let d = step(&mut r, &obs, t("00:10:00"));
    assert_eq!((d.status.phase, d.status.attempt, d.status.restarts), (Some(RunPhase::Restarting), 2, 0));
}

#[test]
fn suspend_and_resume_never_unsuspending_kueue() {
    let mut r = run(&format!("{GPU_SPEC}  suspend: true\n"));
    let d = step(&mut r, &Attempts::default(), t("00:00:00"));
    assert!(d.create_job);
    assert_eq!(d.status.phase, Some(RunPhase::Suspended));
    let mut job = attempt_job(1, json!([]));
    job.spec = Some(k8s_openapi::api::batch::v1::JobSpec { suspend: Some(true), ..Default::default() });
    job.metadata.annotations = Some([(SUSPENDED_BY_OPERATOR.to_string(), "true".to_string())].into());
    r.spec.suspend = false;
    let d = step(&mut r, &Attempts { jobs: vec![job.clone()], ..Default::default() }, t("00:01:00"));
    assert_eq!(d.suspend_job, Some(false));
    assert_eq!(cond(&r, "Suspended").0, "False");
    // Suspended by someone else (Kueue): left alone.
    job.metadata.annotations = None;
    r.spec.queue_name = Some("team".into());
    let d = step(&mut r, &Attempts { jobs: vec![job.clone()], ..Default::default() }, t("00:02:00"));
    assert_eq!(d.suspend_job, None);
    assert_eq!((d.status.phase, d.status.reason.as_deref()), (Some(RunPhase::Pending), Some("WaitingForQueue")));
    // A running Job is suspended when the run is (a queued run's, through its Kueue
    // Workload: `suspension`'s table).
    r.spec.queue_name = None;
    r.spec.suspend = true;
    job.spec = None;
    let d = step(&mut r, &Attempts { jobs: vec![job], ..Default::default() }, t("00:03:00"));
    assert_eq!(d.suspend_job, Some(true));
    assert_eq!(cond(&r, "Suspended"), ("True".into(), "Suspended".into()));
}

#[test]
fn a_queued_run_is_queued_until_kueue_admits_it_and_again_when_evicted() {
    let mut r = run(&format!("{GPU_SPEC}  queueName: team\n"));
    let queued = |r: &TrainingRun| status::condition(r.status.as_ref().unwrap(), status::QUEUED).cloned().unwrap();
    let d = step(&mut r, &Attempts::default(), t("00:00:00"));
    assert!(d.create_job);
    let q = queued(&r);
    assert_eq!((q.status.as_str(), q.reason.as_str()), ("True", "WaitingForQueue"));
    assert!(q.message.contains("LocalQueue team"), "{}", q.message);
    let mut job = attempt_job(1, json!([]));
    job.spec = Some(k8s_openapi::api::batch::v1::JobSpec { suspend: Some(true), ..Default::default() });
    step(&mut r, &Attempts { jobs: vec![job.clone()], ..Default::default() }, t("00:00:05"));
    assert_eq!(queued(&r).status, "True", "held by Kueue");
    // Admitted: Kueue un-suspends the Job and its pods run.
    job.spec = None;
    let pods = vec![labelled(running(0), 1), labelled(running(1), 1)];
    let d = step(&mut r, &Attempts { jobs: vec![job.clone()], pods, ..Default::default() }, t("00:01:00"));
    assert_eq!(d.status.phase, Some(RunPhase::Running));
    let q = queued(&r);
    assert_eq!((q.status.as_str(), q.reason.as_str()), ("False", "Admitted"));
    assert!(q.message.contains("LocalQueue team"), "{}", q.message);
    // Evicted (preempted): Kueue suspends it again; a wait, not a failure.
    job.spec = Some(k8s_openapi::api::batch::v1::JobSpec { suspend: Some(true), ..Default::default() });
    let d = step(&mut r, &Attempts { jobs: vec![job], ..Default::default() }, t("00:02:00"));
    assert_eq!((d.status.phase, d.status.reason.as_deref()), (Some(RunPhase::Pending), Some("WaitingForQueue")));
    assert_eq!((d.status.attempt, d.status.restarts), (1, 0));
    assert_eq!(queued(&r).status, "True");
    // A run without a queue has no Queued condition.
    let mut plain = run(GPU_SPEC);
    step(&mut plain, &Attempts::default(), t("00:00:00"));
    assert!(status::condition(plain.status.as_ref().unwrap(), status::QUEUED).is_none());
}

#[test]
fn stall_is_reported_once_then_clears() {
    let mut r = run(&format!("{GPU_SPEC}  failurePolicy: {{stallTimeout: 10m}}\n"));
    step(&mut r, &Attempts::default(), t("00:00:00"));
    let obs = |step| Attempts {
        jobs: vec![attempt_job(1, json!([]))],
        pods: vec![labelled(running(0), 1), labelled(running(1), 1)],
        trainer: Some(report(step)),
        ..Default::default()
    };
    step(&mut r, &obs(1), t("00:01:00"));
    let d = step(&mut r, &obs(1), t("00:11:00"));
    assert_eq!(cond(&r, "Stalled").0, "False", "exactly the timeout");
    assert!(d.notes.is_empty());
    let d = step(&mut r, &obs(1), t("00:11:01"));
    assert_eq!(cond(&r, "Stalled"), ("True".into(), "NoProgress".into()));
    assert_eq!(d.notes.iter().map(|n| n.reason.as_str()).collect::<Vec<_>>(), vec!["Stalled"]);
    assert_eq!(d.status.phase, Some(RunPhase::Running));
    let d = step(&mut r, &obs(1), t("00:12:00"));
    assert!(d.notes.is_empty(), "reported once");
    let d = step(&mut r, &obs(2), t("00:13:00"));
    assert_eq!(cond(&r, "Stalled").0, "False");
    assert_eq!(d.notes[0].reason, "Progressing");
}

#[test]
fn a_slow_link_is_a_straggler_after_its_readings_and_clears_when_healed() {
    let mut r = run(GPU_SPEC);
    step(&mut r, &Attempts::default(), t("00:00:00"));
    let probe = |node_rank: u32, seconds| LinkProbe {
        node_rank,
        pod: format!("llm-a1-{node_rank}-x"),
        node: Some(format!("n{node_rank}")),
        seconds,
    };
    let obs = |links: Option<Vec<LinkProbe>>| Attempts {
        jobs: vec![attempt_job(1, json!([]))],
        pods: vec![labelled(running(0), 1), labelled(running(1), 1)],
        trainer: Some(report(5)),
        links,
        ..Default::default()
    };
    let slow = || Some(vec![probe(0, 0.004), probe(1, 0.6)]);
    step(&mut r, &obs(slow()), t("00:01:00"));
    let d = step(&mut r, &obs(slow()), t("00:01:20"));
    assert_eq!(cond(&r, "Straggler").0, "False", "2 readings of 3");
    assert!(d.notes.is_empty());
    let d = step(&mut r, &obs(None), t("00:01:30"));
    assert_eq!(d.status.slow_link.as_ref().map(|l| l.readings), Some(2), "no probe, no reading");
    let d = step(&mut r, &obs(slow()), t("00:01:40"));
    assert_eq!(cond(&r, "Straggler"), ("True".into(), "SlowLink".into()));
    let l = d.status.slow_link.as_ref().unwrap();
    assert_eq!((l.node_rank, l.pod.as_str(), l.node.as_deref(), l.readings), (1, "llm-a1-1-x", Some("n1"), 3));
    assert_eq!(d.notes.len(), 1, "{:?}", d.notes);
    assert!(d.notes[0].warning && d.notes[0].reason == "SlowLink", "{:?}", d.notes);
    assert!(d.notes[0].message.starts_with("the network link of pod llm-a1-1-x (node rank 1 on node n1)"));
    let d = step(&mut r, &obs(Some(vec![probe(0, 0.004), probe(1, 0.005)])), t("00:02:00"));
    assert_eq!(cond(&r, "Straggler"), ("False".into(), "NoStraggler".into()));
    assert_eq!(d.status.slow_link, None);
    assert_eq!(d.notes.iter().map(|n| (n.warning, n.reason.as_str())).collect::<Vec<_>>(), [(false, "NoStraggler")]);
}

#[test]
fn stall_can_restart_the_gang() {
    let mut r = run(&format!("{GPU_SPEC}  failurePolicy: {{stallTimeout: 10m, onStall: restart}}\n"));
    step(&mut r, &Attempts::default(), t("00:00:00"));
    let obs = Attempts {
        jobs: vec![attempt_job(1, json!([]))],
        pods: vec![labelled(running(0), 1), labelled(running(1), 1)],
        ..Default::default()
    };
    step(&mut r, &obs, t("00:01:00"));
    let d = step(&mut r, &obs, t("00:20:00"));
    assert_eq!(
        (d.status.phase, d.status.reason.as_deref(), d.status.attempt, d.status.restarts),
        (Some(RunPhase::Restarting), Some("Stalled"), 2, 1)
    );
    assert_eq!(d.delete_jobs, vec!["llm-a1"]);
}

#[test]
fn waits_for_the_init_run() {
    let mut r = run(GRPO_SPEC);
    let waiting = |state| Attempts { init_run: Some(state), ..Default::default() };
    let d = step(&mut r, &waiting(InitRun::Phase(Some(RunPhase::Running))), t("00:00:00"));
    assert!(!d.create_job);
    assert_eq!((d.status.phase, d.status.reason.as_deref()), (Some(RunPhase::Waiting), Some("WaitingForInitRun")));
    assert!(status::condition(&d.status, "Running").unwrap().message.contains("base"));
    let d = step(&mut r, &waiting(InitRun::Phase(Some(RunPhase::Succeeded))), t("00:05:00"));
    assert!(d.create_job);
    assert_eq!(d.status.phase, Some(RunPhase::Pending));
}

#[test]
fn invalid_spec_is_not_accepted() {
    let r = run(&GPU_SPEC.replace("microBatch: 8", "microBatch: 7"));
    let err = crate::validate::validate(&r, 0).unwrap_err();
    let d = invalid(&r, &err, t("00:00:00"));
    assert!(!d.create_job);
    assert_eq!((d.status.phase, d.status.reason.as_deref()), (Some(RunPhase::Failed), Some("InvalidSpec")));
    let accepted = status::condition(&d.status, "Accepted").unwrap();
    assert_eq!((accepted.status.as_str(), accepted.reason.as_str()), ("False", "InvalidSpec"));
    assert!(accepted.message.contains("spec.batch.globalTokens"), "{}", accepted.message);
    assert!(!status::is_terminal(&d.status), "a fixed spec is accepted again");
}

/// A run planned not to fit `topology.gpuMemory` is refused before any pod starts.
#[test]
fn a_run_that_cannot_fit_its_gpus_is_not_accepted() {
    let fits = run(&GPU_SPEC.replace("gpusPerNode: 4}", "gpusPerNode: 4, gpuMemory: 80Gi}"));
    assert!(crate::validate::validate(&fits, 0).is_ok());
    let r = run(&GPU_SPEC.replace("gpusPerNode: 4}", "gpusPerNode: 4, gpuMemory: 2Gi}"));
    let err = crate::validate::validate(&r, 0).unwrap_err();
    let d = invalid(&r, &err, t("00:00:00"));
    assert!(!d.create_job);
    let accepted = status::condition(&d.status, "Accepted").unwrap();
    assert_eq!((accepted.status.as_str(), accepted.reason.as_str()), ("False", "InvalidSpec"));
    for part in ["spec.topology.gpuMemory", "per GPU, has 2.0 GiB", "spec.gradientCheckpointing: true saves"] {
        assert!(accepted.message.contains(part), "{part}: {}", accepted.message);
    }
}
