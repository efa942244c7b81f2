//! What of the operator a plan test cannot show, against the stateful fake API until it
//! moves to the real control plane: the field manager of every child and no writes once
//! settled, deletion through the finalizer, the Controller's watches, leader election,
//! the CRD check at start. The lifecycles themselves are plan tests
//! (`operator/src/decide/*_tests.rs`).

use std::time::Duration;

use crds::TrainingRun;
use crds::types::RunPhase;
use e2e::fake_api::FakeApi;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::CustomResourceExt;
use operator::controller::{self};
use serde_json::json;

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
