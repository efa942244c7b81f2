//! What of the operator neither a plan test nor the real-cluster suite shows yet, against
//! the stateful fake API until it moves to the real control plane: the Controller's
//! graceful shutdown, leader election between two in-process replicas. The lifecycles
//! are plan tests (`operator/src/decide/*_tests.rs`); field ownership, no writes once
//! settled, deletion through the finalizer and the CRD check at start are the real
//! control plane's (`real_cluster::operator`).

use std::time::Duration;

use crds::types::RunPhase;
use e2e::fake_api::FakeApi;
use operator::controller::{self};

mod common;
use common::NS;
use common::harness::{Harness, SPEC};

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
