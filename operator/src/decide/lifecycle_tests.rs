//! Whole lifecycles of a run, reconcile after reconcile, on plans ([`World`]): the test
//! plays the Job controller, the kubelet and rank 0.

use std::time::Duration;

use crds::RunConfig;
use crds::contract::{CONFIG_KEY, FailureReason, TerminationMessage, TrainerPhase};
use crds::types::RunPhase;
use kube::ResourceExt;

use super::world::World;
use super::{Child, Step};

/// Two CPU nodes, 100 steps, a checkpoint every 10, two restarts allowed.
pub(super) const SPEC: &str = "  model: {preset: nano}
  tokens: 819200
  data:
    mix: [{name: textbook, weight: 1.0, uri: embedded:textbook}]
  topology: {nodes: 2, gpusPerNode: 0}
  batch: {globalTokens: 8192, microBatch: 2, seqLength: 256}
  checkpoint: {everySteps: 10}
  failurePolicy: {maxRestarts: 2, stallTimeout: 10m}
";

fn failure(reason: FailureReason, step: u64, detail: &str) -> String {
    TerminationMessage { reason, step: Some(step), detail: detail.into(), samples: None }.to_json()
}

#[test]
fn a_new_run_gets_every_child_and_once_settled_writes_nothing() {
    let mut w = World::new(SPEC);
    let writes = w.settle();
    let s = w.status();
    assert_eq!((s.phase, s.attempt, s.job_name.as_deref()), (Some(RunPhase::Pending), 1, Some("llm-a1")));
    assert_eq!(s.conditions.len(), 8, "two ranks: Straggler too");
    assert_eq!(w.condition("Accepted").0, "True");
    let cfg = w.config();
    assert_eq!((cfg.attempt, cfg.topology.world_size, cfg.schedule.total_steps), (1, 2, 100));
    let uid = w.o.run.uid();
    for step in &writes {
        let Step::Apply(child) = step else { continue };
        let (kind, owners) = match child {
            Child::ConfigMap(c) => ("ConfigMap", c.owner_references().to_vec()),
            Child::Service(s) => {
                assert_eq!(s.spec.as_ref().unwrap().cluster_ip.as_deref(), Some("None"));
                ("Service", s.owner_references().to_vec())
            }
            Child::Claim(c) => {
                assert_eq!(c.spec.as_ref().unwrap().access_modes, Some(vec!["ReadWriteMany".to_string()]));
                ("PersistentVolumeClaim", c.owner_references().to_vec())
            }
            Child::NetworkPolicy(p) => ("NetworkPolicy", p.owner_references().to_vec()),
            Child::Job(j) => {
                let spec = j.spec.clone().unwrap();
                assert_eq!(
                    (spec.completions, spec.parallelism, spec.completion_mode.as_deref()),
                    (Some(2), Some(2), Some("Indexed"))
                );
                ("Job", j.owner_references().to_vec())
            }
        };
        assert_eq!(owners.first().map(|o| Some(o.uid.clone())), Some(uid.clone()), "{kind}");
    }
    assert!(!writes.iter().any(|s| matches!(s, Step::Apply(Child::NetworkPolicy(_)))), "only with the setting");
    assert!(w.has_event("Normal", "JobCreated"));
    assert!(!w.reconcile().writes(), "a settled run writes nothing");
}

#[test]
fn a_run_reports_progress_at_the_poll_interval_and_succeeds() {
    let mut w = World::running("llm");
    let s = w.status();
    let p = s.progress.clone().unwrap();
    assert_eq!((p.step, p.total_steps, p.display.as_deref()), (5, 100, Some("5.0%")));
    assert_eq!(s.metrics.unwrap().loss, Some(3.2));
    assert_eq!(w.condition("Running").0, "True");
    // Polling is rate-limited: no new poll, no write, until the interval passes.
    w.report(20, 2.1);
    assert!(!w.reconcile().writes());
    w.advance(Duration::from_secs(31));
    w.settle();
    let s = w.status();
    assert_eq!(s.progress.unwrap().step, 20);
    assert_eq!(s.last_checkpoint.unwrap().uri, "/checkpoints/step-00000020");
    let text = w.metrics.render();
    assert!(text.contains(r#"trainingrun_loss{name="llm",namespace="ml"} 2.1"#), "{text}");
    assert!(text.contains(r#"trainingrun_last_checkpoint_timestamp_seconds{name="llm",namespace="ml"}"#));
    // Every index completes, rank 0 leaving its final status as its message.
    let mut done = w.rank0.clone().unwrap();
    (done.phase, done.step, done.tokens) = (TrainerPhase::Done, 100, 819200);
    w.pod_exits("llm-a1-0-abcde", 0, "Completed", &serde_json::to_string(&done).unwrap());
    w.pod_exits("llm-a1-1-abcde", 0, "Completed", "");
    w.job_condition("llm-a1", "Complete");
    w.settle();
    let s = w.status();
    assert_eq!((s.phase, s.reason.as_deref()), (Some(RunPhase::Succeeded), Some("Completed")));
    assert_eq!(s.progress.unwrap().percent, 100.0);
    assert!(s.completion_time.is_some());
    assert_eq!(w.condition("Succeeded").0, "True");
    assert!(w.has_event("Normal", "Completed"));
    assert!(w.metrics.render().contains(r#"trainingrun_phase{name="llm",namespace="ml",phase="Succeeded"} 1"#));
}

/// A rank 0 that answers nonsense: its report is refused, the status keeps what was
/// last believed, and one Warning says why, not one per poll.
#[test]
fn an_implausible_status_is_refused_with_one_warning() {
    let mut w = World::running("llm");
    let doc = w.rank0.as_mut().unwrap();
    (doc.step, doc.total_steps) = (1_000_000_000, 2_000_000_000);
    for _ in 0..3 {
        w.advance(Duration::from_secs(31));
        w.settle();
    }
    assert_eq!(w.status().progress.unwrap().step, 5, "the refused report must not reach status");
    let refusals: Vec<_> = w.events.iter().filter(|n| n.reason == super::STATUS_REFUSED).collect();
    assert_eq!(refusals.len(), 1, "{:?}", w.events);
    assert!(refusals[0].warning);
    assert!(refusals[0].message.contains("step 1000000000 is past the run's 100 steps"), "{}", refusals[0].message);
    assert_eq!(w.status().phase, Some(RunPhase::Running));
}

/// NaN and a full checkpoint claim fail the run at once, without a second Job, and
/// Failed is final an hour later.
#[test]
fn nan_and_a_full_disk_fail_the_run_without_a_restart() {
    let cases = [
        (FailureReason::NaNLoss, "llm-a1-1-abcde", failure(FailureReason::NaNLoss, 42, "loss=NaN"), "at step 42"),
        (
            FailureReason::StorageFull,
            "llm-a1-0-abcde",
            failure(
                FailureReason::StorageFull,
                20,
                "/checkpoints: the file system is full: writing a checkpoint of 10.5 MiB failed, 2.0 MiB free",
            ),
            "lower spec.checkpoint.keepLast (now 3)",
        ),
    ];
    for (reason, pod, message, says) in cases {
        let mut w = World::running("llm");
        w.pod_exits(pod, reason.exit_code(), "Error", &message);
        w.settle();
        let s = w.status();
        assert_eq!(
            (s.phase, s.reason.as_deref(), s.attempt, s.restarts),
            (Some(RunPhase::Failed), Some(reason.as_str()), 1, 0)
        );
        let (status, why, failed) = w.condition("Failed");
        assert_eq!((status.as_str(), why.as_str()), ("True", reason.as_str()));
        assert!(failed.contains(says), "{failed}");
        assert!(w.has_event("Warning", reason.as_str()));
        let gauge = format!(
            r#"trainingrun_condition{{name="llm",namespace="ml",reason="{}",status="True",type="Failed"}} 1"#,
            reason.as_str()
        );
        assert!(w.metrics.render().contains(&gauge), "{gauge}");
        w.advance(Duration::from_secs(3600));
        w.settle();
        assert_eq!((w.jobs(), w.status().restarts), (vec!["llm-a1".to_string()], 0), "Failed is final");
    }
}

/// A CUDA OOM and a host OOMKilled are both OutOfMemory, with the remedies each needs.
#[test]
fn cuda_and_host_oom_are_out_of_memory() {
    let mut cuda = World::running("llm");
    let oom = failure(FailureReason::OutOfMemory, 1, "CUDA out of memory. Tried to allocate 2.00 GiB");
    cuda.pod_exits("llm-a1-0-abcde", FailureReason::OutOfMemory.exit_code(), "Error", &oom);
    cuda.settle();
    assert_eq!(cuda.condition("Failed").1, "OutOfMemory");
    let message = crate::status::condition(&cuda.status(), "Failed").unwrap().message.clone();
    assert!(message.contains("microBatch") && message.contains("gradientCheckpointing"), "{message}");

    let mut host = World::running("llm");
    host.pod_exits("llm-a1-1-abcde", 137, "OOMKilled", "");
    host.settle();
    assert_eq!(host.condition("Failed").0, "True");
    assert_eq!(host.condition("Failed").1, "OutOfMemory");
    let message = crate::status::condition(&host.status(), "Failed").unwrap().message.clone();
    assert!(message.contains("host memory"), "{message}");
    assert_eq!(host.status().attempt, 1);
}

/// `onOutOfMemory: reduceMicroBatch`: a CUDA OOM restarts the gang (not counted) at half
/// the micro-batch, recorded in status and reaching the trainer through the ConfigMap,
/// until at 1 the next one fails the run.
#[test]
fn the_micro_batch_is_halved_on_out_of_memory_until_it_is_one() {
    let spec = SPEC.replace("stallTimeout: 10m}", "stallTimeout: 10m, onOutOfMemory: reduceMicroBatch}");
    let mut w = World::new(&spec);
    w.settle();
    assert_eq!((w.config().batch.micro_batch, w.config().batch.grad_accum), (2, 8));
    w.start_pods("llm-a1", "Running");
    w.settle();
    let oom = |step| failure(FailureReason::OutOfMemory, step, "CUDA out of memory. Tried to allocate 2.00 GiB");
    w.pod_exits("llm-a1-0-abcde", FailureReason::OutOfMemory.exit_code(), "Error", &oom(12));
    w.settle();
    let s = w.status();
    assert_eq!(
        (s.phase, s.reason.as_deref(), s.attempt, s.restarts),
        (Some(RunPhase::Restarting), Some("MicroBatchReduced"), 2, 0)
    );
    assert_eq!(s.effective.and_then(|e| e.micro_batch), Some(1));
    assert!(w.has_event("Warning", "MicroBatchReduced"));
    let cfg = w.config();
    assert_eq!((cfg.attempt, cfg.batch.micro_batch, cfg.batch.grad_accum, cfg.batch.global_sequences), (2, 1, 16, 32));
    assert_eq!(w.condition("Accepted").0, "True", "the spec did not change");
    w.start_pods("llm-a2", "Running");
    w.settle();
    w.pod_exits("llm-a2-1-abcde", FailureReason::OutOfMemory.exit_code(), "Error", &oom(20));
    w.settle();
    let s = w.status();
    assert_eq!((s.phase, s.reason.as_deref(), s.attempt), (Some(RunPhase::Failed), Some("OutOfMemory"), 2));
}

/// A transient failure restarts the gang under the next attempt's config, the old Job
/// going with its pods, until the restarts are spent.
#[test]
fn a_transient_failure_restarts_the_gang_until_max_restarts() {
    let mut w = World::running("llm");
    w.pod_exits("llm-a1-0-abcde", 1, "Error", "Segmentation fault");
    w.settle();
    let s = w.status();
    assert_eq!((s.attempt, s.restarts, s.job_name.as_deref()), (2, 1, Some("llm-a2")));
    assert_eq!(w.jobs(), vec!["llm-a2"]);
    assert!(w.o.attempts.pods.is_empty());
    let text = &w.o.accepted.config.clone().map(|c| c.attempt);
    assert_eq!(*text, Some(2), "the ConfigMap carries the attempt");
    let env = w.job("llm-a2").spec.clone().unwrap().template.spec.unwrap().containers[0].env.clone().unwrap();
    assert!(env.iter().all(|e| e.name != "TRAINER_ATTEMPT"), "the ConfigMap alone carries the attempt");
    assert_eq!(env.iter().find(|e| e.name == "MASTER_ADDR").unwrap().value.as_deref(), Some("llm-a2-0.llm"));
    assert!(w.has_event("Warning", "PodFailed"));
    w.start_pods("llm-a2", "Running");
    w.settle();
    assert_eq!(w.status().phase, Some(RunPhase::Running));
    assert_eq!(w.condition("Restarting").1, "Resumed");
    // A collective timeout while rank 0 still runs: its exit may name the cause, so the
    // operator waits up to 10 s past the timeout's exit (at 01:00:00) before restarting.
    let timeout = failure(FailureReason::CollectiveTimeout, 30, "allreduce timed out");
    w.pod_exits("llm-a2-1-abcde", FailureReason::CollectiveTimeout.exit_code(), "Error", &timeout);
    w.settle();
    let running = crate::status::condition(&w.status(), "Running").unwrap().clone();
    assert_eq!((w.status().attempt, running.reason.as_str()), (2, "Training"));
    assert!(running.message.contains("CollectiveTimeout") && running.message.contains("to name the cause"));
    w.advance(Duration::from_secs(2 * 3600));
    w.settle();
    assert_eq!((w.status().attempt, w.status().restarts), (3, 2));
    w.start_pods("llm-a3", "Running");
    w.settle();
    w.pod_exits("llm-a3-0-abcde", 1, "Error", "boom");
    w.settle();
    let s = w.status();
    assert_eq!(
        (s.phase, s.reason.as_deref(), s.attempt, s.restarts),
        (Some(RunPhase::Failed), Some("MaxRestartsExceeded"), 3, 2)
    );
    assert_eq!(w.jobs(), vec!["llm-a3"]);
    assert!(w.metrics.render().contains(r#"trainingrun_restarts{name="llm",namespace="ml"} 2"#));
}

/// The ConfigMap written at a restart holds the new attempt before its Job is created.
#[test]
fn each_attempts_job_is_created_after_the_configmap_that_holds_it() {
    let mut w = World::running("llm");
    w.pod_exits("llm-a1-0-abcde", 1, "Error", "Segmentation fault");
    let mut plans = Vec::new();
    for _ in 0..6 {
        let p = w.reconcile();
        if !p.writes() {
            break;
        }
        plans.push(p);
    }
    let created = plans.iter().find(|p| p.steps.iter().any(|s| matches!(s, Step::Apply(Child::Job(_))))).unwrap();
    let configmap = created.steps.iter().position(|s| matches!(s, Step::Apply(Child::ConfigMap(_))));
    let job = created.steps.iter().position(|s| matches!(s, Step::Apply(Child::Job(_))));
    if let Some(Step::Apply(Child::ConfigMap(c))) = configmap.map(|i| &created.steps[i]) {
        let cfg: RunConfig = serde_json::from_str(&c.data.as_ref().unwrap()[CONFIG_KEY]).unwrap();
        assert_eq!(cfg.attempt, 2);
        assert!(configmap < job);
    } else {
        // Written by an earlier reconcile of the restart.
        assert_eq!(w.config().attempt, 2);
    }
}

/// A pod the scheduler preempted: the gang restarts, not counted against maxRestarts.
#[test]
fn a_disruption_restarts_without_counting() {
    let mut w = World::running("llm");
    w.pod_status(
        "llm-a1-1-abcde",
        serde_json::json!({"phase": "Failed", "conditions": [{"type": "DisruptionTarget", "status": "True",
            "reason": "PreemptionByScheduler", "message": "preempted", "lastTransitionTime": "2026-01-01T00:10:00Z"}]}),
    );
    w.settle();
    let s = w.status();
    assert_eq!((s.phase, s.attempt, s.restarts), (Some(RunPhase::Restarting), 2, 0));
    let restarting = crate::status::condition(&s, "Restarting").unwrap().clone();
    assert_eq!(restarting.reason, "Disruption");
    assert!(restarting.message.contains("PreemptionByScheduler") && restarting.message.contains("not counted"));
    assert_eq!(w.jobs(), vec!["llm-a2"]);
}

/// `spec.suspend` suspends the Job, marked as the operator's; clearing it resumes the
/// same attempt.
#[test]
fn suspend_and_resume() {
    let mut w = World::running("llm");
    w.edit_spec(|s| s["suspend"] = serde_json::json!(true));
    w.settle();
    assert_eq!(w.job("llm-a1").spec.as_ref().unwrap().suspend, Some(true));
    assert_eq!(w.status().phase, Some(RunPhase::Suspended));
    assert_eq!(w.condition("Suspended").0, "True");
    // The Job controller removes the pods of a suspended Job.
    w.o.attempts.pods.clear();
    w.settle();
    w.edit_spec(|s| s["suspend"] = serde_json::json!(false));
    w.settle();
    let job = w.job("llm-a1");
    assert_eq!(job.spec.as_ref().unwrap().suspend, Some(false));
    assert!(!job.annotations().contains_key(crate::resources::SUSPENDED_BY_OPERATOR));
    assert_eq!(w.condition("Suspended").0, "False");
    w.start_pods("llm-a1", "Running");
    w.settle();
    let s = w.status();
    assert_eq!((s.phase, s.attempt, s.restarts), (Some(RunPhase::Running), 1, 0));
}

/// With `--network-policy`, each run gets a NetworkPolicy owned by it, admitting its own
/// pods and, on the status port, the operator's.
#[test]
fn a_network_policy_only_with_the_setting() {
    let mut w = World::new(SPEC);
    w.settings.network_policy = Some("trainingrun-system".into());
    let writes = w.settle();
    let policy = writes
        .iter()
        .find_map(|s| match s {
            Step::Apply(Child::NetworkPolicy(p)) => Some(serde_json::to_value(p).unwrap()),
            _ => None,
        })
        .expect("the run's NetworkPolicy");
    assert_eq!(policy["metadata"]["ownerReferences"][0]["uid"], "0d5c-uid");
    assert_eq!(policy["spec"]["podSelector"]["matchLabels"]["training.puretransformer.dev/run"], "llm");
    assert_eq!(policy["spec"]["ingress"][1]["ports"][0]["port"], 8080);
}

/// No new step for ten minutes: Stalled, reported and alerted, not restarted; a new
/// step clears it.
#[test]
fn a_run_without_progress_is_stalled() {
    let mut w = World::running("llm");
    for _ in 0..10 {
        w.advance(Duration::from_secs(61));
        w.settle();
    }
    let stalled = crate::status::condition(&w.status(), "Stalled").unwrap().clone();
    assert_eq!((stalled.status.as_str(), stalled.reason.as_str()), ("True", "NoProgress"));
    assert!(stalled.message.contains("step 5"), "{}", stalled.message);
    assert!(w.has_event("Warning", "Stalled"));
    assert!(w.metrics.render().contains(r#"reason="NoProgress",status="True",type="Stalled"} 1"#));
    assert_eq!(w.status().phase, Some(RunPhase::Running));
    w.report(6, 3.0);
    w.advance(Duration::from_secs(31));
    w.settle();
    assert_eq!(w.condition("Stalled").0, "False");
}

/// A spec that does not resolve gets no child and says which field; fixed, it starts.
#[test]
fn an_invalid_spec_is_not_accepted_and_gets_no_children() {
    let mut w = World::new(&SPEC.replace("microBatch: 2", "microBatch: 3"));
    let writes = w.settle();
    assert!(!writes.iter().any(|s| matches!(s, Step::Apply(_))), "{writes:#?}");
    let accepted = crate::status::condition(&w.status(), "Accepted").unwrap().clone();
    assert_eq!((accepted.status.as_str(), accepted.reason.as_str()), ("False", "InvalidSpec"));
    assert!(accepted.message.contains("spec.batch.globalTokens"), "{}", accepted.message);
    assert_eq!(w.status().phase, Some(RunPhase::Failed));
    assert!(w.has_event("Warning", "InvalidSpec"));
    w.edit_spec(|s| s["batch"]["microBatch"] = serde_json::json!(2));
    w.settle();
    assert_eq!(w.condition("Accepted").0, "True");
    assert_eq!(w.jobs(), vec!["llm-a1"]);
}

/// A run that starts from another waits for it to succeed, then mounts its checkpoints
/// read-only.
#[test]
fn init_from_waits_for_the_base_run() {
    use crate::observed::InitRun;
    let mut w = World::new(
        "  phase: grpo
  model: {preset: nano}
  tokens: 65536
  topology: {nodes: 1, gpusPerNode: 0}
  batch: {microBatch: 16, seqLength: 256}
  initFrom: {trainingRun: base}
  grpo: {dataset: embedded:mcq, promptsPerStep: 2, generationsPerPrompt: 8, maxNewTokens: 32}
",
    );
    w.o.attempts.init_run = Some(InitRun::Missing);
    w.settle();
    let s = w.status();
    assert_eq!((s.phase, s.reason.as_deref()), (Some(RunPhase::Waiting), Some("WaitingForInitRun")));
    let waiting = crate::status::condition(&s, "Running").unwrap().message.clone();
    assert!(waiting.contains("base to succeed; it does not exist"), "{waiting}");
    assert!(w.jobs().is_empty());
    w.o.attempts.init_run = Some(InitRun::Phase(Some(RunPhase::Running)));
    w.settle();
    assert!(crate::status::condition(&w.status(), "Running").unwrap().message.contains("is Running"));
    w.o.attempts.init_run = Some(InitRun::Phase(Some(RunPhase::Succeeded)));
    w.settle();
    assert_eq!(w.status().phase, Some(RunPhase::Pending));
    let pod = w.job("llm-a1").spec.clone().unwrap().template.spec.unwrap();
    let init = pod.volumes.unwrap().into_iter().find(|v| v.name == "init").unwrap().persistent_volume_claim.unwrap();
    assert_eq!((init.claim_name.as_str(), init.read_only), ("base-checkpoints", Some(true)));
}

/// The operator dies after the status that records a restart and before the old Job
/// goes; the next one, remembering nothing, finishes the restart once: no second
/// count, no duplicate Job, no orphan.
#[test]
fn an_operator_restart_mid_restart_leaves_no_duplicates_or_orphans() {
    let mut w = World::running("llm");
    w.pod_exits("llm-a1-0-abcde", 1, "Error", "boom");
    let made = w.reconcile_crashing_at(|s| matches!(s, Step::DeleteJob(_)));
    assert!(made.steps.iter().any(|s| matches!(s, Step::Status { write: true, .. })), "{:#?}", made.steps);
    assert_eq!((w.status().attempt, w.status().restarts), (2, 1));
    assert_eq!(w.jobs(), vec!["llm-a1"]);
    w.settle();
    let s = w.status();
    assert_eq!((s.attempt, s.restarts), (2, 1), "the restart is counted once");
    assert_eq!(w.jobs(), vec!["llm-a2"]);
    assert!(w.o.attempts.pods.is_empty());
    w.o.memory = Default::default();
    assert!(w.settle().is_empty(), "a second operator restart changes nothing");
}
