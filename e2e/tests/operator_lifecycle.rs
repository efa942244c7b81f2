//! Full lifecycles through the operator's real reconcile against the stateful fake
//! API. The test plays the job controller and the kubelet (it creates pods and sets
//! their states) and rank 0's status endpoint (a small HTTP server).

use std::sync::Arc;
use std::time::Duration;

use crds::TrainingRun;
use crds::contract::{FailureReason, TerminationMessage};
use crds::types::RunPhase;
use e2e::fake_api::FakeApi;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::CustomResourceExt;
use kube::api::Api;
use operator::controller::{self};
use serde_json::{Value, json};

mod common;
use common::harness::{Harness, SPEC, running};
use common::{NS, TR};

#[tokio::test]
async fn create_builds_every_child_and_a_second_reconcile_writes_nothing() {
    let h = Harness::new();
    h.apply("llm", SPEC);
    h.reconcile("llm").await; // adds the finalizer
    h.reconcile("llm").await;
    // Conditions from the first pipeline run on.
    let s = h.status("llm");
    assert_eq!((s.phase, s.attempt, s.job_name.as_deref()), (Some(RunPhase::Pending), 1, Some("llm-a1")));
    assert_eq!(s.conditions.len(), 8, "two ranks: Straggler too");
    assert_eq!(h.condition("llm", "Accepted").0, "True");
    let cm: ConfigMap = serde_json::from_value(h.fake.get("v1", "ConfigMap", Some(NS), "llm-config").unwrap()).unwrap();
    let cfg: crds::RunConfig = serde_json::from_str(&cm.data.unwrap()["run.json"]).unwrap();
    assert_eq!((cfg.attempt, cfg.topology.world_size, cfg.schedule.total_steps), (1, 2, 100));
    let svc = h.fake.get("v1", "Service", Some(NS), "llm").unwrap();
    assert_eq!(svc["spec"]["clusterIP"], "None");
    let pvc = h.fake.get("v1", "PersistentVolumeClaim", Some(NS), "llm-checkpoints").unwrap();
    assert_eq!(pvc["spec"]["accessModes"], json!(["ReadWriteMany"]));
    let job = h.job("llm-a1").unwrap();
    let spec = job.spec.clone().unwrap();
    assert_eq!(
        (spec.completions, spec.parallelism, spec.completion_mode.as_deref()),
        (Some(2), Some(2), Some("Indexed"))
    );
    let uid = h.fake.get(TR, "TrainingRun", Some(NS), "llm").unwrap()["metadata"]["uid"].clone();
    for (kind, api, child) in [
        ("Job", "batch/v1", "llm-a1"),
        ("ConfigMap", "v1", "llm-config"),
        ("Service", "v1", "llm"),
        ("PersistentVolumeClaim", "v1", "llm-checkpoints"),
    ] {
        let o = h.fake.get(api, kind, Some(NS), child).unwrap();
        assert_eq!(o["metadata"]["ownerReferences"][0]["uid"], uid, "{kind} {child}");
        let managers: Vec<&str> = o["metadata"]["managedFields"]
            .as_array()
            .map_or(vec![], |m| m.iter().filter_map(|f| f["manager"].as_str()).collect());
        assert!(managers.iter().all(|m| *m == "trainingrun-operator"), "{kind}: {managers:?}");
    }
    assert!(h.has_event("Normal", "JobCreated"));
    h.settle("llm").await;
    // Settled: one more reconcile makes no API write at all.
    h.fake.reset_writes();
    h.reconcile("llm").await;
    assert_eq!(h.fake.writes(), vec![]);
    // The operator never wrote the spec.
    assert!(h.fake.writes().iter().all(|w| w.subresource.is_some() || w.kind != "TrainingRun"));
}

#[tokio::test]
async fn runs_reports_progress_and_succeeds() {
    let h = Harness::new();
    running(&h, "llm").await;
    let s = h.status("llm");
    let p = s.progress.clone().unwrap();
    assert_eq!((p.step, p.total_steps, p.display.as_deref()), (5, 100, Some("5.0%")));
    assert_eq!(s.metrics.unwrap().loss, Some(3.2));
    assert_eq!(h.condition("llm", "Running").0, "True");
    // Polling is rate-limited: no new poll, no write, until the interval passes.
    h.rank0.report(20, 2.1);
    h.fake.reset_writes();
    h.reconcile("llm").await;
    assert_eq!(h.fake.writes(), vec![]);
    h.clock.advance(Duration::from_secs(31));
    h.reconcile("llm").await;
    let s = h.status("llm");
    assert_eq!(s.progress.unwrap().step, 20);
    assert_eq!(s.last_checkpoint.unwrap().uri, "/checkpoints/step-00000020");
    let text = h.metrics.render();
    assert!(text.contains(r#"trainingrun_loss{name="llm",namespace="ml"} 2.1"#), "{text}");
    assert!(text.contains(r#"trainingrun_last_checkpoint_timestamp_seconds{name="llm",namespace="ml"}"#));
    // Every index completes.
    h.complete("llm-a1");
    h.settle("llm").await;
    let s = h.status("llm");
    assert_eq!((s.phase, s.reason.as_deref()), (Some(RunPhase::Succeeded), Some("Completed")));
    assert_eq!(s.progress.unwrap().percent, 100.0);
    assert!(s.completion_time.is_some());
    assert_eq!(h.condition("llm", "Succeeded").0, "True");
    assert!(h.has_event("Normal", "Completed"));
    assert!(h.metrics.render().contains(r#"trainingrun_phase{name="llm",namespace="ml",phase="Succeeded"} 1"#));
}

/// A rank 0 that answers nonsense: its report is refused, the status keeps what was
/// last believed, and one Warning says why, not one per poll.
#[tokio::test]
async fn an_implausible_status_is_refused_with_one_warning() {
    let h = Harness::new();
    running(&h, "llm").await;
    h.rank0.tamper(|t| {
        t.step = 1_000_000_000;
        t.total_steps = 2_000_000_000;
    });
    for _ in 0..3 {
        h.clock.advance(Duration::from_secs(31));
        h.reconcile("llm").await;
    }
    let s = h.status("llm");
    assert_eq!(s.progress.unwrap().step, 5, "the refused report must not reach status");
    // One event object, never repeated (the recorder would count a repeat in `series`).
    let refusals: Vec<Value> = h
        .fake
        .list("events.k8s.io/v1", "Event", Some("ml"))
        .into_iter()
        .filter(|e| e["reason"] == "TrainerStatusRefused")
        .collect();
    assert_eq!(refusals.len(), 1, "{:?}", h.events());
    assert_eq!(refusals[0]["type"], "Warning");
    assert!(refusals[0]["series"].is_null(), "published more than once: {}", refusals[0]);
    let note = refusals[0]["note"].as_str().unwrap_or_default();
    assert!(note.contains("step 1000000000 is past the run's 100 steps"), "{note}");
    assert_eq!(h.status("llm").phase, Some(RunPhase::Running));
}

#[tokio::test]
async fn nan_fails_the_run_without_a_second_job() {
    let h = Harness::new();
    running(&h, "llm").await;
    let msg =
        TerminationMessage { reason: FailureReason::NaNLoss, step: Some(42), detail: "loss=NaN".into(), samples: None }
            .to_json();
    h.pod_exits("llm-a1-1-abcde", FailureReason::NaNLoss.exit_code(), "Error", &msg);
    h.settle("llm").await;
    let s = h.status("llm");
    assert_eq!((s.phase, s.reason.as_deref(), s.attempt, s.restarts), (Some(RunPhase::Failed), Some("NaNLoss"), 1, 0));
    let (status, reason, message) = h.condition("llm", "Failed");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "NaNLoss"));
    assert!(message.contains("at step 42"), "{message}");
    assert_eq!(h.jobs(), vec!["llm-a1"]);
    assert!(h.has_event("Warning", "NaNLoss"));
    assert!(h.metrics.render().contains(
        r#"trainingrun_condition{name="llm",namespace="ml",reason="NaNLoss",status="True",type="Failed"} 1"#
    ));
    // Failed is final.
    h.clock.advance(Duration::from_secs(3600));
    h.settle("llm").await;
    assert_eq!(h.jobs(), vec!["llm-a1"]);
}

/// A full checkpoint claim fails the run at once (a restart would fill it again), with
/// the trainer's numbers and the knobs that make room.
#[tokio::test]
async fn a_full_disk_fails_the_run_without_a_restart() {
    let h = Harness::new();
    running(&h, "llm").await;
    let msg = TerminationMessage {
        reason: FailureReason::StorageFull,
        step: Some(20),
        detail: "/checkpoints: the file system is full: writing a checkpoint of 10.5 MiB failed, 2.0 MiB free".into(),
        samples: None,
    }
    .to_json();
    h.pod_exits("llm-a1-0-abcde", FailureReason::StorageFull.exit_code(), "Error", &msg);
    h.settle("llm").await;
    let s = h.status("llm");
    assert_eq!(
        (s.phase, s.reason.as_deref(), s.attempt, s.restarts),
        (Some(RunPhase::Failed), Some("StorageFull"), 1, 0)
    );
    let message = h.condition("llm", "Failed").2;
    assert!(
        message.contains("StorageFull at step 20")
            && message.contains("10.5 MiB failed, 2.0 MiB free")
            && message.contains("raise spec.checkpoint.size")
            && message.contains("lower spec.checkpoint.keepLast (now 3)"),
        "{message}"
    );
    assert!(h.has_event("Warning", "StorageFull"));
    h.clock.advance(Duration::from_secs(3600));
    h.settle("llm").await;
    assert_eq!((h.jobs(), h.status("llm").restarts), (vec!["llm-a1".to_string()], 0));
}

#[tokio::test]
async fn cuda_oom_and_host_oom_are_out_of_memory() {
    let h = Harness::new();
    running(&h, "cuda").await;
    let msg = TerminationMessage {
        reason: FailureReason::OutOfMemory,
        step: Some(1),
        detail: "CUDA out of memory. Tried to allocate 2.00 GiB".into(),
        samples: None,
    }
    .to_json();
    h.pod_exits("cuda-a1-0-abcde", FailureReason::OutOfMemory.exit_code(), "Error", &msg);
    h.settle("cuda").await;
    let (_, reason, message) = h.condition("cuda", "Failed");
    assert_eq!(reason, "OutOfMemory");
    assert!(message.contains("microBatch") && message.contains("gradientCheckpointing"), "{message}");

    running(&h, "host").await;
    h.pod_exits("host-a1-1-abcde", 137, "OOMKilled", "");
    h.settle("host").await;
    let (status, reason, message) = h.condition("host", "Failed");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "OutOfMemory"));
    assert!(message.contains("host memory"), "{message}");
    assert_eq!(h.status("host").attempt, 1);
}

/// `onOutOfMemory: reduceMicroBatch`: each CUDA OOM restarts the gang (not counted) at
/// half the micro-batch, recorded in status and reaching the trainer through the
/// ConfigMap, until at 1 the next one fails the run; a host OOMKilled still fails it.
#[tokio::test]
async fn reduce_micro_batch_on_out_of_memory_until_it_is_one() {
    let h = Harness::new();
    let spec = SPEC.replace("stallTimeout: 10m}", "stallTimeout: 10m, onOutOfMemory: reduceMicroBatch}");
    assert_ne!(spec, SPEC);
    h.apply("llm", &spec);
    h.settle("llm").await;
    let oom = |step| {
        TerminationMessage {
            reason: FailureReason::OutOfMemory,
            step: Some(step),
            detail: "CUDA out of memory. Tried to allocate 2.00 GiB".into(),
            samples: None,
        }
        .to_json()
    };
    let config = |h: &Harness| -> crds::RunConfig {
        let cm = h.fake.get("v1", "ConfigMap", Some(NS), "llm-config").unwrap();
        serde_json::from_str(cm["data"]["run.json"].as_str().unwrap()).unwrap()
    };
    // 32 sequences a step over 2 ranks: micro-batch 2 × accumulation 8 per rank.
    assert_eq!((config(&h).batch.micro_batch, config(&h).batch.grad_accum), (2, 8));
    h.start_pods("llm-a1", "Running");
    h.settle("llm").await;
    h.pod_exits("llm-a1-0-abcde", FailureReason::OutOfMemory.exit_code(), "Error", &oom(12));
    h.settle("llm").await;
    let s = h.status("llm");
    assert_eq!(
        (s.phase, s.reason.as_deref(), s.attempt, s.restarts),
        (Some(RunPhase::Restarting), Some("MicroBatchReduced"), 2, 0)
    );
    assert_eq!(s.effective.and_then(|e| e.micro_batch), Some(1));
    let message = h.condition("llm", "Restarting").2;
    assert!(message.contains("with micro-batch 1 (was 2; accumulation 8 → 16"), "{message}");
    assert!(h.has_event("Warning", "MicroBatchReduced"));
    let cfg = config(&h);
    assert_eq!((cfg.attempt, cfg.batch.micro_batch, cfg.batch.grad_accum, cfg.batch.global_sequences), (2, 1, 16, 32));
    assert_eq!(h.condition("llm", "Accepted").0, "True", "the spec did not change");
    // At micro-batch 1 the next OOM fails the run.
    h.start_pods("llm-a2", "Running");
    h.settle("llm").await;
    h.pod_exits("llm-a2-1-abcde", FailureReason::OutOfMemory.exit_code(), "Error", &oom(20));
    h.settle("llm").await;
    let s = h.status("llm");
    assert_eq!((s.phase, s.reason.as_deref(), s.attempt), (Some(RunPhase::Failed), Some("OutOfMemory"), 2));
    assert!(h.condition("llm", "Failed").2.contains("nothing is left to reduce"));

    // A host OOMKilled is not the trainer's: it fails the run.
    h.apply("host", &spec);
    h.settle("host").await;
    h.start_pods("host-a1", "Running");
    h.settle("host").await;
    h.pod_exits("host-a1-1-abcde", 137, "OOMKilled", "");
    h.settle("host").await;
    assert_eq!((h.status("host").phase, h.status("host").attempt), (Some(RunPhase::Failed), 1));
}

#[tokio::test]
async fn a_transient_failure_restarts_the_gang_until_max_restarts() {
    let h = Harness::new();
    running(&h, "llm").await;
    h.pod_exits("llm-a1-0-abcde", 1, "Error", "Segmentation fault");
    h.settle("llm").await;
    let s = h.status("llm");
    assert_eq!((s.attempt, s.restarts, s.job_name.as_deref()), (2, 1, Some("llm-a2")));
    // The old Job and its pods are gone (cascade), attempt 2 runs with attempt 2's config.
    assert_eq!(h.jobs(), vec!["llm-a2"]);
    assert!(h.pods().is_empty(), "{:?}", h.pods());
    let cm: ConfigMap = serde_json::from_value(h.fake.get("v1", "ConfigMap", Some(NS), "llm-config").unwrap()).unwrap();
    assert!(cm.data.unwrap()["run.json"].contains("\"attempt\": 2"));
    let env = h.job("llm-a2").unwrap().spec.unwrap().template.spec.unwrap().containers[0].env.clone().unwrap();
    assert!(env.iter().all(|e| e.name != "TRAINER_ATTEMPT"), "the ConfigMap alone carries the attempt");
    assert_eq!(env.iter().find(|e| e.name == "MASTER_ADDR").unwrap().value.as_deref(), Some("llm-a2-0.llm"));
    assert!(h.has_event("Warning", "PodFailed"));
    assert_eq!(h.condition("llm", "Restarting").0, "True");
    h.start_pods("llm-a2", "Running");
    h.settle("llm").await;
    assert_eq!(h.status("llm").phase, Some(RunPhase::Running));
    assert_eq!(h.condition("llm", "Restarting").1, "Resumed");
    // Two more failures: the second one is over maxRestarts (2).
    let timeout = TerminationMessage {
        reason: FailureReason::CollectiveTimeout,
        step: Some(30),
        detail: "allreduce timed out".into(),
        samples: None,
    }
    .to_json();
    h.pod_exits("llm-a2-1-abcde", FailureReason::CollectiveTimeout.exit_code(), "Error", &timeout);
    h.settle("llm").await;
    // Rank 0 is still running: its exit may name the cause, so the operator waits up
    // to 10 s past the timeout's exit (at 01:00:00) before restarting.
    let (_, reason, message) = h.condition("llm", "Running");
    assert_eq!((h.status("llm").attempt, reason.as_str()), (2, "Training"));
    assert!(message.contains("CollectiveTimeout") && message.contains("to name the cause"), "{message}");
    h.clock.advance(Duration::from_secs(2 * 3600));
    h.settle("llm").await;
    assert_eq!((h.status("llm").attempt, h.status("llm").restarts), (3, 2));
    h.start_pods("llm-a3", "Running");
    h.settle("llm").await;
    h.pod_exits("llm-a3-0-abcde", 1, "Error", "boom");
    h.settle("llm").await;
    let s = h.status("llm");
    assert_eq!(
        (s.phase, s.reason.as_deref(), s.attempt, s.restarts),
        (Some(RunPhase::Failed), Some("MaxRestartsExceeded"), 3, 2)
    );
    assert_eq!(h.jobs(), vec!["llm-a3"]);
    assert!(h.metrics.render().contains(r#"trainingrun_restarts{name="llm",namespace="ml"} 2"#));
}

#[tokio::test]
async fn a_disruption_restarts_without_counting() {
    let h = Harness::new();
    running(&h, "llm").await;
    h.pod_status(
        "llm-a1-1-abcde",
        json!({"phase": "Failed", "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler", "message": "preempted", "lastTransitionTime": "2026-01-01T00:10:00Z"}]}),
    );
    h.settle("llm").await;
    let s = h.status("llm");
    assert_eq!((s.phase, s.attempt, s.restarts), (Some(RunPhase::Restarting), 2, 0));
    let (_, reason, message) = h.condition("llm", "Restarting");
    assert_eq!(reason, "Disruption");
    assert!(message.contains("PreemptionByScheduler") && message.contains("not counted"), "{message}");
    assert_eq!(h.jobs(), vec!["llm-a2"]);
}

#[tokio::test]
async fn suspend_and_resume() {
    let h = Harness::new();
    running(&h, "llm").await;
    h.edit_spec("llm", |s| s["suspend"] = json!(true));
    h.settle("llm").await;
    let job = h.job("llm-a1").unwrap();
    assert_eq!(job.spec.unwrap().suspend, Some(true));
    assert_eq!(h.status("llm").phase, Some(RunPhase::Suspended));
    assert_eq!(h.condition("llm", "Suspended").0, "True");
    // The job controller removes the pods of a suspended Job.
    for p in h.pods() {
        h.fake.delete("v1", "Pod", Some(NS), &p).unwrap();
    }
    h.settle("llm").await;
    h.edit_spec("llm", |s| s["suspend"] = json!(false));
    h.settle("llm").await;
    let job = h.job("llm-a1").unwrap();
    assert_eq!(job.spec.unwrap().suspend, Some(false));
    assert!(
        !job.metadata
            .annotations
            .unwrap_or_default()
            .contains_key("training.puretransformer.dev/suspended-by-operator")
    );
    assert_eq!(h.condition("llm", "Suspended").0, "False");
    h.start_pods("llm-a1", "Running");
    h.settle("llm").await;
    let s = h.status("llm");
    assert_eq!((s.phase, s.attempt, s.restarts), (Some(RunPhase::Running), 1, 0));
}

#[tokio::test]
async fn network_policies_only_with_the_setting() {
    let h = Harness::with_network_policy(Some("trainingrun-system"));
    h.apply("llm", SPEC);
    h.settle("llm").await;
    let np = h.fake.get("networking.k8s.io/v1", "NetworkPolicy", Some(NS), "llm").expect("the run's NetworkPolicy");
    let uid = h.fake.get(TR, "TrainingRun", Some(NS), "llm").unwrap()["metadata"]["uid"].clone();
    assert_eq!(np["metadata"]["ownerReferences"][0]["uid"], uid);
    assert_eq!(np["spec"]["podSelector"]["matchLabels"]["training.puretransformer.dev/run"], "llm");
    assert_eq!(np["spec"]["ingress"][1]["ports"][0]["port"], 8080);
    let plain = Harness::new();
    plain.apply("llm", SPEC);
    plain.settle("llm").await;
    assert!(plain.fake.get("networking.k8s.io/v1", "NetworkPolicy", Some(NS), "llm").is_none());
}

#[tokio::test]
async fn a_run_without_progress_is_stalled() {
    let h = Harness::new();
    running(&h, "llm").await;
    for _ in 0..10 {
        h.clock.advance(Duration::from_secs(61));
        h.settle("llm").await;
    }
    let (status, reason, message) = h.condition("llm", "Stalled");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "NoProgress"));
    assert!(message.contains("step 5"), "{message}");
    assert!(h.has_event("Warning", "Stalled"));
    assert!(h.metrics.render().contains(r#"reason="NoProgress",status="True",type="Stalled"} 1"#));
    assert_eq!(h.status("llm").phase, Some(RunPhase::Running));
    h.rank0.report(6, 3.0);
    h.clock.advance(Duration::from_secs(31));
    h.settle("llm").await;
    assert_eq!(h.condition("llm", "Stalled").0, "False");
}

#[tokio::test]
async fn an_invalid_spec_is_not_accepted_and_gets_no_children() {
    let h = Harness::new();
    h.apply("bad", &SPEC.replace("microBatch: 2", "microBatch: 3"));
    h.settle("bad").await;
    let (status, reason, message) = h.condition("bad", "Accepted");
    assert_eq!((status.as_str(), reason.as_str()), ("False", "InvalidSpec"));
    assert!(message.contains("spec.batch.globalTokens"), "{message}");
    assert_eq!(h.status("bad").phase, Some(RunPhase::Failed));
    assert!(h.jobs().is_empty());
    assert!(h.fake.list("v1", "ConfigMap", Some(NS)).is_empty());
    assert!(h.fake.list("v1", "PersistentVolumeClaim", Some(NS)).is_empty());
    assert!(h.has_event("Warning", "InvalidSpec"));
    // Fixed: accepted and started.
    h.edit_spec("bad", |s| s["batch"]["microBatch"] = json!(2));
    h.settle("bad").await;
    assert_eq!(h.condition("bad", "Accepted").0, "True");
    assert_eq!(h.jobs(), vec!["bad-a1"]);
}

#[tokio::test]
async fn init_from_waits_for_the_base_run() {
    let h = Harness::new();
    h.apply(
        "tune",
        "  phase: grpo
  model: {preset: nano}
  tokens: 65536
  topology: {nodes: 1, gpusPerNode: 0}
  batch: {microBatch: 16, seqLength: 256}
  initFrom: {trainingRun: base}
  grpo: {dataset: embedded:mcq, promptsPerStep: 2, generationsPerPrompt: 8, maxNewTokens: 32}
",
    );
    h.settle("tune").await;
    let s = h.status("tune");
    assert_eq!((s.phase, s.reason.as_deref()), (Some(RunPhase::Waiting), Some("WaitingForInitRun")));
    let waiting = h.condition("tune", "Running").2;
    assert!(waiting.contains("base to succeed; it does not exist"), "{waiting}");
    assert!(h.jobs().is_empty());
    running(&h, "base").await;
    h.settle("tune").await;
    assert!(h.condition("tune", "Running").2.contains("is Running"));
    h.job_condition("base-a1", "Complete");
    h.settle("base").await;
    h.settle("tune").await;
    assert_eq!(h.status("tune").phase, Some(RunPhase::Pending));
    let pod = h.job("tune-a1").unwrap().spec.unwrap().template.spec.unwrap();
    let init = pod.volumes.unwrap().into_iter().find(|v| v.name == "init").unwrap().persistent_volume_claim.unwrap();
    assert_eq!((init.claim_name.as_str(), init.read_only), ("base-checkpoints", Some(true)));
}

#[tokio::test]
async fn delete_removes_children_unless_checkpoints_are_retained() {
    let h = Harness::new();
    running(&h, "gone").await;
    h.apply(
        "kept",
        &SPEC.replace("checkpoint: {everySteps: 10}", "checkpoint: {everySteps: 10, retainOnDelete: true}"),
    );
    h.settle("kept").await;
    for name in ["gone", "kept"] {
        h.fake.delete(TR, "TrainingRun", Some(NS), name).unwrap();
        // The finalizer holds the run until the operator has cleaned up.
        assert!(h.fake.get(TR, "TrainingRun", Some(NS), name).unwrap()["metadata"]["deletionTimestamp"].is_string());
        h.reconcile(name).await;
        assert!(h.fake.get(TR, "TrainingRun", Some(NS), name).is_none(), "{name} is still there");
    }
    assert!(h.jobs().is_empty());
    assert!(h.pods().is_empty());
    assert!(h.fake.list("v1", "ConfigMap", Some(NS)).is_empty());
    let pvcs: Vec<String> = h
        .fake
        .list("v1", "PersistentVolumeClaim", Some(NS))
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(pvcs, vec!["kept-checkpoints"]);
    assert!(!h.metrics.render().contains(r#"name="gone""#), "the run's series are dropped");
}

#[tokio::test]
async fn an_operator_restart_mid_restart_leaves_no_duplicates_or_orphans() {
    let mut h = Harness::new();
    running(&h, "llm").await;
    h.pod_exits("llm-a1-0-abcde", 1, "Error", "boom");
    // The status write lands, then the operator dies before deleting the Job.
    h.fake.fail_next("DELETE", "/jobs/llm-a1", 503, 1);
    let api: Api<TrainingRun> = Api::namespaced(h.fake.client(), NS);
    let run = api.get("llm").await.unwrap();
    assert!(controller::reconcile(Arc::new(run), h.ctx.clone()).await.is_err());
    assert_eq!((h.status("llm").attempt, h.status("llm").restarts), (2, 1));
    assert_eq!(h.jobs(), vec!["llm-a1"]);
    h.restart_operator();
    h.settle("llm").await;
    let s = h.status("llm");
    assert_eq!((s.attempt, s.restarts), (2, 1), "the restart is counted once");
    assert_eq!(h.jobs(), vec!["llm-a2"]);
    assert!(h.pods().is_empty());
    // A second operator restart changes nothing.
    h.restart_operator();
    h.fake.reset_writes();
    h.settle("llm").await;
    assert_eq!(h.jobs(), vec!["llm-a2"]);
}

#[tokio::test]
async fn the_controller_drives_a_run_through_watches() {
    let h = Harness::new();
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let ctx = h.ctx.clone();
    let task = tokio::spawn(controller::run(ctx, Some(NS.into()), async move {
        let _ = stop_rx.wait_for(|s| *s).await;
    }));
    h.apply("llm", SPEC);
    let wait = |what: &'static str, f: Box<dyn Fn(&Harness) -> bool>| {
        let h = &h;
        async move {
            for _ in 0..200 {
                if f(h) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            panic!("timed out waiting for {what}; status {:?}", h.status("llm"));
        }
    };
    wait("the Job", Box::new(|h| h.job("llm-a1").is_some())).await;
    h.start_pods("llm-a1", "Running");
    wait("Running", Box::new(|h| h.status("llm").phase == Some(RunPhase::Running))).await;
    h.pod_exits("llm-a1-0-abcde", 0, "Completed", "");
    h.pod_exits("llm-a1-1-abcde", 0, "Completed", "");
    h.job_condition("llm-a1", "Complete");
    wait("Succeeded", Box::new(|h| h.status("llm").phase == Some(RunPhase::Succeeded))).await;
    stop_tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(10), task).await.expect("graceful shutdown").unwrap();
}

#[tokio::test]
async fn only_one_replica_leads() {
    let fake = FakeApi::new();
    let election = |id: &str| operator::leader::Election {
        lease: "trainingrun-operator".into(),
        namespace: "ops".into(),
        identity: id.into(),
        duration: 5,
    };
    let (mut a, _ta) = operator::leader::start(fake.client(), &election("a")).await.unwrap();
    let (mut b, _tb) = operator::leader::start(fake.client(), &election("b")).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), async {
        while !*a.borrow_and_update() && !*b.borrow_and_update() {
            tokio::select! { _ = a.changed() => {}, _ = b.changed() => {} }
        }
    })
    .await
    .expect("someone leads");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_ne!(*a.borrow(), *b.borrow(), "exactly one leader");
    let lease = fake.get("coordination.k8s.io/v1", "Lease", Some("ops"), "trainingrun-operator").unwrap();
    let holder = lease["spec"]["holderIdentity"].as_str().unwrap();
    assert_eq!(holder, if *a.borrow() { "a" } else { "b" });
}

#[tokio::test]
async fn startup_requires_the_crd() {
    let fake = FakeApi::new();
    let err = controller::check_crd(&fake.client()).await.unwrap_err().to_string();
    assert!(
        err.contains("trainingruns.training.puretransformer.dev is not installed")
            && err.contains("kubectl apply -f crds/"),
        "{err}"
    );
    fake.insert(serde_json::to_value(TrainingRun::crd()).unwrap());
    let err = controller::check_crd(&fake.client()).await.unwrap_err().to_string();
    assert!(err.contains("trainingdatasets.training.puretransformer.dev is not installed"), "{err}");
    fake.insert(serde_json::to_value(crds::types::TrainingDataset::crd()).unwrap());
    controller::check_crd(&fake.client()).await.unwrap();
}
