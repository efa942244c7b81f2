//! Issue 44, part 2: Kueue admits our Jobs. Kueue v0.17.0's controller, built from the
//! Go module proxy (`e2e::kueue`), beside the chart's operator on the real control
//! plane: two nodes of one GPU each (`nvidia.com/gpu` in their capacity), ClusterQueue
//! `gpus` with a quota of 2 GPUs that preempts lower priorities within it, LocalQueue
//! `team` in the runs' namespace. Each run's pods request one GPU per node through
//! `topology.resources` while their trainers run on the CPU (`gpusPerNode: 0`), so the
//! scheduler and Kueue count GPUs as they do on a GPU cluster.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crds::contract::RunReason;
use crds::types::RunPhase;
use e2e::kueue::Kueue;
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};

use crate::harness::*;
use crate::scenario::{MINUTES, NS, Scenario};
use crate::scenarios::paced;

const QUEUE: &str = "team";

/// The quota: one flavor, 2 GPUs, lower priorities preempted within the queue; and the
/// PriorityClass of the run that preempts.
const QUEUES: &str = r#"
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {name: default-flavor}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: gpus}
spec:
  namespaceSelector: {}
  preemption: {withinClusterQueue: LowerPriority}
  resourceGroups:
  - coveredResources: [nvidia.com/gpu]
    flavors:
    - name: default-flavor
      resources:
      - {name: nvidia.com/gpu, nominalQuota: 2}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {name: team, namespace: ml}
spec: {clusterQueue: gpus}
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: urgent}
value: 1000
description: a run that may preempt the queue's others
"#;

/// A paced run of `steps` steps on `nodes` nodes of one GPU each, in LocalQueue `team`.
fn queued(nodes: u32, steps: u64, extra: &str) -> String {
    let topology = "topology: {nodes: 2, gpusPerNode: 0, collectiveTimeout: 5m}";
    let spec = paced(&format!("  queueName: {QUEUE}\n{extra}"))
        .replace(
            topology,
            &format!(
                "topology: {{nodes: {nodes}, gpusPerNode: 0, collectiveTimeout: 5m, \
                 resources: {{requests: {{nvidia.com/gpu: \"1\"}}, limits: {{nvidia.com/gpu: \"1\"}}}}}}"
            ),
        )
        .replace("tokens: 40960", &format!("tokens: {}", steps * 1024));
    assert!(spec.contains("nvidia.com/gpu") && spec.contains(&format!("tokens: {}", steps * 1024)), "{spec}");
    spec
}

/// Every value of `spec.suspend` each Job has had, in order, by Job name.
type Suspensions = Arc<Mutex<BTreeMap<String, Vec<bool>>>>;

/// [`Suspensions`] of the namespace's Jobs, from a watch started before the first Job:
/// who suspends and un-suspends, and how often.
fn record_suspension(sim: &Scenario) -> (Suspensions, tokio::task::JoinHandle<()>) {
    let seen: Suspensions = Arc::default();
    let out = seen.clone();
    let jobs: Api<Job> = Api::namespaced(sim.c.client.clone(), NS);
    let task = tokio::spawn(async move {
        let mut events = watcher(jobs, watcher::Config::default()).default_backoff().boxed();
        while let Some(ev) = events.next().await {
            if let Ok(watcher::Event::Apply(j) | watcher::Event::InitApply(j)) = ev {
                let name = j.metadata.name.clone().unwrap_or_default();
                let suspended = j.spec.as_ref().and_then(|s| s.suspend) == Some(true);
                let mut all = seen.lock().expect("the suspension recorder");
                let list = all.entry(name).or_default();
                if list.last() != Some(&suspended) {
                    list.push(suspended);
                }
            }
        }
    });
    (out, task)
}

/// The field managers of Job `name` that own `spec.suspend`, with their operation.
async fn suspend_owners(sim: &Scenario, name: &str) -> Vec<(String, String)> {
    let job = Api::<Job>::namespaced(sim.c.client.clone(), NS).get(name).await.unwrap_or_else(|e| panic!("{e}"));
    job.metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m.fields_v1.as_ref().is_some_and(|f| f.0["f:spec"].get("f:suspend").is_some()))
        .map(|m| (m.manager.unwrap_or_default(), m.operation.unwrap_or_default()))
        .collect()
}

/// One cluster, four runs on a 2-GPU quota. `first` takes the whole quota and is
/// admitted; its Job was created suspended and Kueue, not the operator, owns
/// `spec.suspend` from then on. `second` waits past its 1-minute stall timeout with
/// `Queued=True` naming the LocalQueue, and is never Stalled. `urgent`, of a higher
/// priority, preempts `first`: Kueue suspends its Job, the trainers checkpoint on
/// SIGTERM, the run waits in the queue (a disruption: no restart counted, the same
/// attempt and Job), and resumes from its checkpoint when readmitted. `paused`, admitted,
/// is suspended by its user: the operator deactivates its Workload, Kueue evicts it and
/// leaves it suspended (suspending the Job itself would start a tug of war: Kueue
/// un-suspends the Job of an admitted Workload), and resuming activates it again. Every
/// run succeeds; no Job's suspension flips more often than admissions and evictions do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kueue_admits_queues_and_preempts_our_runs() {
    let sim = Scenario::with_cluster(2, |o| o.gpus = 1).await;
    let kueue = Kueue::start(&sim.c).await.unwrap_or_else(|e| panic!("Kueue did not start: {e}"));
    apply(&sim.c, NS, QUEUES);
    wait_for(&sim.c, NS, "clusterqueue/gpus", "condition=Active", MINUTES(1));
    let (suspension, recorder) = record_suspension(&sim);

    // --- Admission; the queue's second run waits past its stall timeout.
    sim.apply("first", &queued(2, 320, ""));
    // Kueue admits in its own order whatever it sees first; second is applied once
    // first's Workload holds the quota, or second could be admitted ahead of it.
    sim.wait("first", "first admitted by Kueue", MINUTES(2), |s| {
        s.conditions.iter().any(|c| c.type_ == "Queued" && c.status == "False" && c.reason == "Admitted")
    })
    .await;
    let applied_second = Instant::now();
    sim.apply("second", &queued(1, 40, "  failurePolicy: {stallTimeout: 1m}\n"));
    sim.wait("second", "second waiting for the queue", MINUTES(1), |s| s.reason.as_deref() == Some("WaitingForQueue"))
        .await;
    sim.wait_phase("first", RunPhase::Running, MINUTES(3)).await;
    let owners = suspend_owners(&sim, "first-a1").await;
    assert!(
        owners.len() == 1 && owners[0].0 != operator::MANAGER && owners[0].1 == "Update",
        "spec.suspend of an admitted Job belongs to Kueue alone (the operator applied it once, at creation): {owners:?}"
    );
    let kueue_manager = owners[0].0.clone();
    let mut polls = 0;
    while applied_second.elapsed() < Duration::from_secs(65) {
        let s = sim.status("second");
        assert_eq!(
            (s.phase, s.reason.as_deref()),
            (Some(RunPhase::Pending), Some("WaitingForQueue")),
            "second waits while first holds the quota: {}",
            sim.diagnose("second")
        );
        let (queued, reason, message) = sim.condition("second", "Queued");
        assert_eq!((queued.as_str(), reason.as_str()), ("True", "WaitingForQueue"), "{message}");
        assert!(message.contains(&format!("LocalQueue {QUEUE}")), "Queued names the queue: {message}");
        assert_ne!(sim.condition("second", "Stalled").0, "True", "waiting is not a stall");
        assert_eq!(sim.status("first").phase, Some(RunPhase::Running), "first must outlast second's wait");
        polls += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(polls > 60, "second was watched for its whole wait ({polls} polls)");
    let waited = applied_second.elapsed();
    let (phase, health, message) = argo_cd_health(&sim.c, NS, "second").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((phase.as_str(), health.as_str()), ("Pending", "Progressing"), "a queued run: {message}");
    assert!(message.contains(&format!("LocalQueue {QUEUE}")), "Argo CD shows the queue: {message}");

    // --- Preemption: urgent needs one GPU, and only first, of a lower priority, has any.
    let step_before = sim.status("first").progress.map_or(0, |p| p.step);
    sim.apply("urgent", &queued(1, 40, "  priorityClassName: urgent\n"));
    let evicted = sim
        .wait("first", "first evicted back to its queue", MINUTES(2), |s| {
            s.phase == Some(RunPhase::Pending) && s.reason.as_deref() == Some("WaitingForQueue")
        })
        .await;
    assert_eq!((evicted.attempt, evicted.restarts), (1, 0), "an eviction is not a failure: {evicted:?}");
    sim.wait_phase("urgent", RunPhase::Succeeded, MINUTES(3)).await;
    sim.wait_phase("second", RunPhase::Succeeded, MINUTES(3)).await;
    // ~220 paced steps left: 4 minutes at ~1 s a step, twice that on a loaded machine.
    let done = sim.wait_phase("first", RunPhase::Succeeded, MINUTES(8)).await;

    // first: one attempt, one Job, no restart counted, resumed from its checkpoint.
    assert_eq!((done.attempt, done.restarts), (1, 0), "{done:?}");
    assert_eq!(sim.jobs("first"), ["first-a1"], "readmitted in the same Job");
    assert_eq!(
        sim.phases("first"),
        [RunPhase::Pending, RunPhase::Running, RunPhase::Pending, RunPhase::Running, RunPhase::Succeeded]
    );
    let resumed: Vec<serde_json::Value> = sim.records("first").into_iter().filter(|r| r["kind"] == "resume").collect();
    assert_eq!(resumed.len(), 1, "one resume, when readmitted: {resumed:?}");
    assert_eq!(resumed[0]["attempt"], 1, "the same attempt: {resumed:?}");
    let from = resumed[0]["step"].as_u64().unwrap_or_default();
    assert!(
        from >= step_before,
        "resumed from the checkpoint its trainers wrote on SIGTERM (step {from}), not an older one: status had step {step_before} before urgent"
    );
    let steps: std::collections::BTreeSet<u64> = sim.step_losses("first").into_iter().map(|(s, _)| s).collect();
    assert_eq!(steps, (1..=320).collect(), "every step of first trained and recorded");
    let (admitted, reason, message) = sim.condition("first", "Queued");
    assert_eq!((admitted.as_str(), reason.as_str()), ("False", "Admitted"), "{message}");
    // A Straggler or SlowLink warning is a report that restarts nothing, and ranks on
    // one-CPU nodes, each shared by several paced trainers, can drift past its factor
    // (a starved node answers the operator's link probe late as well): the detectors
    // are proved by scenarios' `slow` run and network_faults' slowed link, not here.
    let reports = [RunReason::Straggler.as_str(), RunReason::SlowLink.as_str()];
    for run in ["first", "second", "urgent"] {
        let warnings: Vec<_> = sim
            .events(run)
            .into_iter()
            .filter(|(t, reason, _)| t == "Warning" && !reports.contains(&reason.as_str()))
            .collect();
        assert!(warnings.is_empty(), "{run}: no failure, restart or stall: {warnings:?}");
    }

    // --- A user suspends an admitted run, and resumes it.
    sim.apply("paused", &queued(1, 40, ""));
    sim.wait("paused", "paused training", MINUTES(3), |s| s.progress.as_ref().is_some_and(|p| p.step >= 2)).await;
    patch_run(&sim.c, NS, "paused", r#"{"spec": {"suspend": true}}"#);
    sim.wait_phase("paused", RunPhase::Suspended, MINUTES(2)).await;
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_secs(15) {
        let s = sim.status("paused");
        assert_eq!(s.phase, Some(RunPhase::Suspended), "stays suspended: {}", sim.diagnose("paused"));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let while_suspended = suspension.lock().expect("the suspension recorder").get("paused-a1").cloned();
    assert_eq!(
        while_suspended.as_deref(),
        Some(&[true, false, true][..]),
        "suspended once, by Kueue evicting the deactivated Workload, and left so"
    );
    let (phase, health, message) = argo_cd_health(&sim.c, NS, "paused").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((phase.as_str(), health.as_str()), ("Suspended", "Suspended"), "{message}");
    let step_paused = sim.status("paused").progress.map_or(0, |p| p.step);
    patch_run(&sim.c, NS, "paused", r#"{"spec": {"suspend": false}}"#);
    let paused = sim.wait_phase("paused", RunPhase::Succeeded, MINUTES(3)).await;
    assert_eq!((paused.attempt, paused.restarts), (1, 0), "{paused:?}");
    let resumed: Vec<serde_json::Value> = sim.records("paused").into_iter().filter(|r| r["kind"] == "resume").collect();
    assert!(
        resumed.len() == 1 && resumed[0]["step"].as_u64().unwrap_or_default() >= step_paused,
        "resumed once, from the checkpoint written when it was suspended at step {step_paused}: {resumed:?}"
    );

    // The suspension of each Job: created suspended, then only Kueue's admissions and
    // evictions.
    recorder.abort();
    let suspension = suspension.lock().expect("the suspension recorder").clone();
    eprintln!(
        "Jobs' suspension: {suspension:?}; spec.suspend's manager: {kueue_manager}; second waited {waited:?}; first preempted at status step {step_before}, resumed from step {from}"
    );
    assert_eq!(
        suspension["paused-a1"],
        [true, false, true, false],
        "suspended by its user once, resumed once: {suspension:?}"
    );
    assert_eq!(suspension["first-a1"], [true, false, true, false], "admitted, evicted, readmitted: {suspension:?}");
    assert_eq!(suspension["second-a1"], [true, false], "{suspension:?}");
    assert_eq!(suspension["urgent-a1"], [true, false], "{suspension:?}");
    let owners = suspend_owners(&sim, "first-a1").await;
    assert_eq!(owners, [(kueue_manager, "Update".to_string())], "the operator never took spec.suspend back");
    drop(kueue);
}
