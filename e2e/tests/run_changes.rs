//! Changing a running run, through the operator's real reconcile against the stateful
//! fake API: a resize and a new budget restart the gang into a new attempt without
//! counting it; a failure policy change restarts nothing; a change no checkpoint
//! resumes under is refused, naming the field, and the running attempt goes on.

use crds::RunConfig;
use crds::types::RunPhase;
use serde_json::json;

mod common;
use common::NS;
use common::harness::{Harness, SPEC, running};

/// The config the run's attempts run under: its ConfigMap's.
fn config(h: &Harness) -> RunConfig {
    let cm = h.fake.get("v1", "ConfigMap", Some(NS), "llm-config").unwrap();
    serde_json::from_str(cm["data"]["run.json"].as_str().unwrap()).unwrap()
}

fn completions(h: &Harness, job: &str) -> i32 {
    h.job(job).unwrap().spec.unwrap().completions.unwrap()
}

/// A warning or normal event of `reason` whose note contains `text`.
fn event_note(h: &Harness, type_: &str, reason: &str, text: &str) -> bool {
    h.fake
        .list("events.k8s.io/v1", "Event", Some(NS))
        .iter()
        .any(|e| e["type"] == type_ && e["reason"] == reason && e["note"].as_str().is_some_and(|n| n.contains(text)))
}

#[tokio::test]
async fn a_resize_restarts_the_gang_at_the_new_size_without_counting() {
    let h = Harness::new();
    running(&h, "llm").await;
    assert_eq!((completions(&h, "llm-a1"), h.status("llm").topology.as_deref()), (2, Some("2x0")));
    h.edit_spec("llm", |s| s["topology"]["nodes"] = json!(1));
    h.settle("llm").await;
    let s = h.status("llm");
    assert_eq!(
        (s.phase, s.reason.as_deref(), s.attempt, s.restarts),
        (Some(RunPhase::Restarting), Some("Resized"), 2, 0)
    );
    assert_eq!(s.topology.as_deref(), Some("1x0"));
    let (restarting, reason, message) = h.condition("llm", "Restarting");
    assert_eq!((restarting.as_str(), reason.as_str()), ("True", "Resized"));
    assert!(message.starts_with("resized 2x0 → 1x0") && message.contains("not counted"), "{message}");
    assert!(event_note(&h, "Normal", "Resized", "resized 2x0 → 1x0"), "{:?}", h.events());
    assert!(!h.events().iter().any(|(t, r)| t == "Warning" && r == "Resized"));
    // The old attempt is gone; the new one runs on one node with attempt 2's config.
    assert_eq!(h.jobs(), vec!["llm-a2"]);
    assert_eq!(completions(&h, "llm-a2"), 1);
    let cfg = config(&h);
    assert_eq!((cfg.attempt, cfg.topology.nodes, cfg.topology.world_size, cfg.batch.grad_accum), (2, 1, 1, 16));
    // The checkpoint claim keeps its access mode: a ReadWriteMany claim serves one node.
    let pvc = h.fake.get("v1", "PersistentVolumeClaim", Some(NS), "llm-checkpoints").unwrap();
    assert_eq!(pvc["spec"]["accessModes"], json!(["ReadWriteMany"]));
    assert_eq!(h.condition("llm", "Accepted").0, "True");
    h.start_pods("llm-a2", "Running");
    h.settle("llm").await;
    assert_eq!(h.status("llm").phase, Some(RunPhase::Running));
    assert_eq!(h.condition("llm", "Restarting").1, "Resumed");
    // Settled: nothing more to do.
    h.fake.reset_writes();
    h.reconcile("llm").await;
    assert_eq!(h.fake.writes(), vec![]);
}

#[tokio::test]
async fn a_new_budget_restarts_the_gang_under_it_and_a_failure_policy_change_restarts_nothing() {
    let h = Harness::new();
    running(&h, "llm").await;
    h.edit_spec("llm", |s| s["failurePolicy"]["maxRestarts"] = json!(5));
    h.settle("llm").await;
    let s = h.status("llm");
    assert_eq!((s.phase, s.attempt), (Some(RunPhase::Running), 1));
    assert_eq!(config(&h).failure.max_restarts, 5);
    assert!(event_note(&h, "Normal", "Reconfigured", "nothing restarts"), "{:?}", h.events());

    h.edit_spec("llm", |s| s["tokens"] = json!(1_228_800));
    h.settle("llm").await;
    let s = h.status("llm");
    assert_eq!(
        (s.phase, s.reason.as_deref(), s.attempt, s.restarts),
        (Some(RunPhase::Restarting), Some("Reconfigured"), 2, 0)
    );
    let message = h.condition("llm", "Restarting").2;
    assert!(message.starts_with("reconfigured spec.tokens") && message.contains("not counted"), "{message}");
    assert!(h.has_event("Normal", "Reconfigured"));
    assert_eq!(s.progress.unwrap().total_steps, 150);
    let cfg = config(&h);
    assert_eq!((cfg.attempt, cfg.schedule.total_steps), (2, 150));
    assert_eq!(h.jobs(), vec!["llm-a2"]);
}

#[tokio::test]
async fn a_refused_change_names_the_field_and_leaves_the_running_attempt_alone() {
    let h = Harness::new();
    running(&h, "llm").await;
    let before = config(&h);
    h.edit_spec("llm", |s| s["batch"]["globalTokens"] = json!(16384));
    h.settle("llm").await;
    let (accepted, reason, message) = h.condition("llm", "Accepted");
    assert_eq!((accepted.as_str(), reason.as_str()), ("False", "ChangeRefused"));
    assert!(message.contains("spec.batch.globalTokens (batch.globalSequences: 32 → 64"), "{message}");
    assert!(event_note(&h, "Warning", "ChangeRefused", "spec.batch.globalTokens"), "{:?}", h.events());
    let s = h.status("llm");
    assert_eq!((s.phase, s.attempt, s.restarts), (Some(RunPhase::Running), 1, 0));
    assert_eq!(h.jobs(), vec!["llm-a1"]);
    assert_eq!(config(&h), before, "the ConfigMap keeps the accepted config");
    // A failure restarts the gang under the accepted config.
    h.pod_exits("llm-a1-0-abcde", 1, "Error", "Segmentation fault");
    h.settle("llm").await;
    assert_eq!((h.status("llm").attempt, h.status("llm").restarts), (2, 1));
    assert_eq!(config(&h).batch, before.batch);
    assert_eq!(h.condition("llm", "Accepted").1, "ChangeRefused");
    // A model change (immutable by the CRD's rules, should one get through) is refused too.
    h.edit_spec("llm", |s| s["model"]["preset"] = json!("micro"));
    h.settle("llm").await;
    let message = h.condition("llm", "Accepted").2;
    assert!(message.contains("spec.model") && message.contains("spec.batch.globalTokens"), "{message}");
    // Changed back: accepted again, and nothing restarts.
    h.edit_spec("llm", |s| {
        s["batch"]["globalTokens"] = json!(8192);
        s["model"]["preset"] = json!("nano");
    });
    h.settle("llm").await;
    assert_eq!(h.condition("llm", "Accepted").0, "True");
    assert_eq!(h.status("llm").attempt, 2);
}

#[tokio::test]
async fn growing_past_one_node_on_a_read_write_once_claim_is_refused() {
    let h = Harness::new();
    h.apply("llm", &SPEC.replace("nodes: 2", "nodes: 1"));
    h.settle("llm").await;
    h.start_pods("llm-a1", "Running");
    h.rank0.report(5, 3.2);
    h.settle("llm").await;
    let pvc = h.fake.get("v1", "PersistentVolumeClaim", Some(NS), "llm-checkpoints").unwrap();
    assert_eq!(pvc["spec"]["accessModes"], json!(["ReadWriteOnce"]));
    h.edit_spec("llm", |s| s["topology"]["nodes"] = json!(2));
    h.settle("llm").await;
    let (accepted, reason, message) = h.condition("llm", "Accepted");
    assert_eq!((accepted.as_str(), reason.as_str()), ("False", "ChangeRefused"));
    assert!(
        message.contains("spec.topology.nodes (1 → 2)") && message.contains("llm-checkpoints is ReadWriteOnce"),
        "{message}"
    );
    assert_eq!((h.status("llm").attempt, h.jobs()), (1, vec!["llm-a1".to_string()]));
    assert_eq!(config(&h).topology.nodes, 1);
    let pvc = h.fake.get("v1", "PersistentVolumeClaim", Some(NS), "llm-checkpoints").unwrap();
    assert_eq!(pvc["spec"]["accessModes"], json!(["ReadWriteOnce"]));
}

#[tokio::test]
async fn a_finished_run_given_more_tokens_trains_on_from_its_final_checkpoint() {
    let h = Harness::new();
    running(&h, "llm").await;
    h.complete("llm-a1");
    h.settle("llm").await;
    assert_eq!(h.status("llm").phase, Some(RunPhase::Succeeded));
    // A cadence or failure policy change on a finished run does nothing.
    h.edit_spec("llm", |s| {
        s["checkpoint"]["everySteps"] = json!(5);
        s["failurePolicy"]["maxRestarts"] = json!(4);
    });
    h.settle("llm").await;
    let s = h.status("llm");
    assert_eq!((s.phase, s.attempt), (Some(RunPhase::Succeeded), 1));
    // More tokens: it trains on.
    h.edit_spec("llm", |s| s["tokens"] = json!(1_228_800));
    h.settle("llm").await;
    let s = h.status("llm");
    assert_eq!(
        (s.phase, s.reason.as_deref(), s.attempt, s.restarts),
        (Some(RunPhase::Restarting), Some("Reconfigured"), 2, 0)
    );
    assert!(s.completion_time.is_none());
    let message = h.condition("llm", "Restarting").2;
    assert!(message.contains("training on from the final checkpoint (step 100 of 150)"), "{message}");
    assert_eq!(h.jobs(), vec!["llm-a2"]);
    let cfg = config(&h);
    assert_eq!((cfg.attempt, cfg.schedule.total_steps, cfg.checkpoint.every_steps), (2, 150, 5));
    h.start_pods("llm-a2", "Running");
    h.settle("llm").await;
    assert_eq!(h.status("llm").phase, Some(RunPhase::Running));
}
