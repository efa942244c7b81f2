//! The busy API server: the operator's binary against a kube-apiserver that admits
//! three requests at a time, one of them a write (`--max-requests-inflight=3`,
//! `--max-mutating-requests-inflight=1`, priority and fairness off), on kwok's nodes,
//! with 60 runs created at once.
//! The server refuses some of the operator's requests with 429 and the operator backs
//! off and retries: no decision is lost, every run ends where its fate says (training,
//! failed after exactly one restart, suspended), with one Job of its current attempt.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crds::TrainingRun;
use e2e::scale::cluster::{Cluster, OPERATOR_USER, RUNS_NS};
use e2e::scale::load::{Fate, Shape};
use e2e::scale::seen;
use e2e::scale::stub::Stub;
use kube::Api;
use kube::api::PostParams;

use crate::harness::{clusters_root, workspace_binary};
use crate::slots::cluster_slot;

/// 10 training, 5 failing, 45 suspended.
fn shapes() -> Vec<Shape> {
    (0..60)
        .map(|i| {
            let fate = match i {
                0..10 => Fate::Training,
                10..15 => Fate::Failing,
                _ => Fate::Suspended,
            };
            Shape { name: format!("busy-{i:02}"), nodes: 1, grpo: i % 4 == 3, fate }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_api_server_refuses_requests_and_no_decision_is_lost() {
    let _slot = cluster_slot().await;
    let dir = clusters_root().join(format!("pt{}-pushback", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // The classic in-flight limits, which refuse at once what is over them; priority and
    // fairness would queue the operator's requests instead. The admin (this test, kwok)
    // is exempt from them, as system:masters is.
    let busy =
        ["--enable-priority-and-fairness=false", "--max-requests-inflight=3", "--max-mutating-requests-inflight=1"];
    let cluster = Cluster::start(&dir, 16, &busy).await.unwrap_or_else(|e| panic!("the busy cluster: {e}"));
    let stub = Stub::start().await.expect("the status stub");
    let shapes = shapes();
    for s in &shapes {
        let run: TrainingRun = serde_json::from_value(s.manifest(RUNS_NS)).expect("a TrainingRun");
        let run = TrainingRun { metadata: kube::api::ObjectMeta { uid: Some("u".into()), ..run.metadata }, ..run };
        stub.add(RUNS_NS, &s.name, operator::validate::validate(&run, 1).expect("a valid run"));
    }
    let env = [
        ("STATUS_URL", stub.status_url()),
        ("STATUS_POLL_INTERVAL", "2s".to_string()),
        ("STATUS_WRITE_INTERVAL", "2s".to_string()),
    ];
    let _operator = cluster
        .operator(&workspace_binary("operator"), "operator-0", &env, &dir.join("operator.log"))
        .unwrap_or_else(|e| panic!("the operator: {e}"));
    let watched = seen::start(cluster.client.clone());
    watched.watch_jobs(cluster.client.clone());
    let api: Api<TrainingRun> = Api::namespaced(cluster.client.clone(), RUNS_NS);
    let start = Instant::now();
    // At once: every create in flight together (the admin is exempt from the limits).
    let creates = shapes.iter().map(|s| {
        let run: TrainingRun = serde_json::from_value(s.manifest(RUNS_NS)).expect("a TrainingRun");
        let api = api.clone();
        async move { api.create(&PostParams::default(), &run).await.map(|_| ()) }
    });
    for created in futures::future::join_all(creates).await {
        created.unwrap_or_else(|e| panic!("creating a run: {e}"));
    }
    let ended = |runs: &std::collections::HashMap<String, seen::RunState>| {
        let off: Vec<String> = shapes
            .iter()
            .filter_map(|s| {
                let r = runs.get(&s.name).cloned().unwrap_or_default();
                let attempt = if s.fate == Fate::Failing { 2 } else { 1 };
                (r.phase != s.fate.settled_phase() || r.attempt != attempt)
                    .then(|| format!("{} ({}): {} attempt {}", s.name, s.fate, r.phase, r.attempt))
            })
            .collect();
        if off.is_empty() { Ok(()) } else { Err(format!("{} not yet: {off:?}", off.len())) }
    };
    watched
        .wait("every run where its fate says", Duration::from_secs(420), ended)
        .await
        .unwrap_or_else(|e| panic!("{e}\nthe operator's log: {}", dir.join("operator.log").display()));
    let took = start.elapsed();

    let audit = cluster.cp.audit().expect("the audit log");
    let ours: Vec<_> = audit.iter().filter(|r| r.user.username == OPERATOR_USER && r.verb != "watch").collect();
    let refused = ours.iter().filter(|r| r.response_status.as_ref().is_some_and(|s| s.code == 429)).count();
    eprintln!(
        "busy API server: {refused} of the operator's {} requests refused with 429; every run ended right in {:.0} s",
        ours.len(),
        took.as_secs_f64()
    );
    assert!(refused > 0, "the server never pushed back: {} requests, none refused", ours.len());
    // Exactly one restart of each failing run, and one Job a run, of its current attempt.
    let runs = api.list(&Default::default()).await.expect("the runs").items;
    for r in
        runs.iter().filter(|r| r.metadata.name.as_deref().is_some_and(|n| shapes[10..15].iter().any(|s| s.name == n)))
    {
        assert_eq!(r.status.as_ref().map(|s| s.restarts), Some(1), "{:?}", r.status);
    }
    // A run's status is written before its Job is applied, so the last Jobs may still be
    // on their way (retried after a 429) when the last status shows.
    let one_job_each = |jobs: &BTreeMap<String, BTreeSet<String>>| {
        let off: Vec<String> = shapes
            .iter()
            .filter_map(|s| {
                let attempt = if s.fate == Fate::Failing { 2 } else { 1 };
                let want = BTreeSet::from([format!("{}-a{attempt}", s.name)]);
                let has = jobs.get(&s.name).cloned().unwrap_or_default();
                (has != want).then(|| format!("{}: {has:?}, not {want:?}", s.name))
            })
            .collect();
        if off.is_empty() { Ok(()) } else { Err(format!("{} runs off: {off:?}", off.len())) }
    };
    watched
        .wait_jobs("one Job of each run's current attempt", Duration::from_secs(180), one_job_each)
        .await
        .unwrap_or_else(|e| panic!("{e}\nthe operator's log: {}", dir.join("operator.log").display()));
}
