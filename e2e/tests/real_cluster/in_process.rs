//! The operator's parts run in this test process against the real API server, on the
//! cluster of `operator::the_operator_owns_its_children…` once its chart's operator is
//! scaled to nothing: the event recorder's series, leader election between two
//! replicas, and the Controller on the watches through to its graceful shutdown.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use e2e::test_cluster::TestCluster;
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use kube::Api;
use kube::api::DeleteParams;
use kube::runtime::events::{Event, EventType, Reporter};
use operator::events::Recorder;

use crate::harness::*;

/// The admin, as the audit log names the test's own requests.
const ADMIN: &str = "kubernetes-admin";

fn at(s: &str) -> Timestamp {
    format!("2026-01-01T{s}Z").parse().expect("a timestamp")
}

fn run_ref(ns: &str, name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("training.puretransformer.dev/v1alpha1".into()),
        kind: Some("TrainingRun".into()),
        namespace: Some(ns.into()),
        name: Some(name.into()),
        uid: Some(format!("{name}-uid")),
        ..Default::default()
    }
}

fn warning(reason: &str, note: &str) -> Event {
    Event {
        type_: EventType::Warning,
        reason: reason.into(),
        note: Some(note.into()),
        action: "Reconcile".into(),
        secondary: None,
    }
}

/// A namespace of its own for each case, so the audit log's event writes in it are the
/// case's alone.
async fn case(c: &TestCluster, ns: &str, remembered: usize) -> (Recorder, Api<K8sEvent>) {
    kubectl(c, &["create", "namespace", ns]);
    let client = c.cp.client().await.unwrap_or_else(|e| panic!("the admin's client: {e}"));
    let reporter = Reporter { controller: "trainingrun-operator".into(), instance: Some("op-0".into()) };
    let capacity = NonZeroUsize::new(remembered).expect("remembers one or more");
    (Recorder::remembering(client.clone(), reporter, capacity), Api::namespaced(client, ns))
}

async fn stored(events: &Api<K8sEvent>) -> Vec<K8sEvent> {
    events.list(&Default::default()).await.unwrap_or_else(|e| panic!("listing events: {e}")).items
}

/// The creates and patches of events in `ns`, as the API server's audit log has them once
/// it holds `n` of them (it writes each when the request completes).
fn event_verbs(c: &TestCluster, ns: &str, n: usize) -> Vec<String> {
    poll(c, ns, &format!("{n} event writes in the audit log"), Duration::from_secs(30), || {
        let all = c.cp.audit().map_err(|e| e.to_string())?;
        let verbs: Vec<String> = all
            .into_iter()
            .filter(|r| r.user.username == ADMIN && matches!(r.verb.as_str(), "create" | "patch"))
            .filter(|r| r.resource() == "events")
            .filter(|r| r.object_ref.as_ref().is_some_and(|o| o.namespace == ns))
            .map(|r| r.verb)
            .collect();
        if verbs.len() >= n { Ok(verbs) } else { Err(format!("{verbs:?}")) }
    })
}

/// A repeat within the window is counted in the first event's series (one create, then
/// patches), with the reporter's names; another message, another object or a repeat
/// after the window is a new event.
async fn a_repeat_is_counted_in_the_first_events_series(c: &TestCluster) {
    let ns = "ev-series";
    let (rec, events) = case(c, ns, 16).await;
    let ev = warning("StorageFull", "the PVC is full");
    for t in ["00:00:00", "00:00:30", "00:01:00"] {
        rec.publish(&ev, &run_ref(ns, "llm"), at(t)).await.unwrap_or_else(|e| panic!("publish: {e}"));
    }
    let one = stored(&events).await;
    assert_eq!(one.len(), 1, "{one:#?}");
    let e = &one[0];
    assert_eq!((e.type_.as_deref(), e.reason.as_deref()), (Some("Warning"), Some("StorageFull")));
    assert_eq!(e.note.as_deref(), Some("the PVC is full"));
    assert_eq!(e.regarding.as_ref().and_then(|r| r.name.as_deref()), Some("llm"));
    assert_eq!(e.reporting_controller.as_deref(), Some("trainingrun-operator"));
    assert_eq!(e.reporting_instance.as_deref(), Some("op-0"));
    let series = e.series.as_ref().expect("a series");
    assert_eq!((series.count, series.last_observed_time.0), (3, at("00:01:00")));
    assert_eq!(event_verbs(c, ns, 3), ["create", "patch", "patch"]);

    rec.publish(&warning("StorageFull", "the PVC is full again"), &run_ref(ns, "llm"), at("00:01:01")).await.unwrap();
    rec.publish(&ev, &run_ref(ns, "other"), at("00:01:02")).await.unwrap();
    rec.publish(&ev, &run_ref(ns, "llm"), at("00:07:01")).await.unwrap();
    assert_eq!(stored(&events).await.len(), 4);
    assert_eq!(event_verbs(c, ns, 6)[3..], ["create", "create", "create"]);
}

/// An event gone from the API server (events expire there) starts a new one, in whose
/// series the next repeat is counted.
async fn a_series_whose_event_expired_starts_again(c: &TestCluster) {
    let ns = "ev-expired";
    let (rec, events) = case(c, ns, 16).await;
    let ev = warning("TrainerStatusRefused", "step 10 is past the run's 5 steps");
    rec.publish(&ev, &run_ref(ns, "llm"), at("00:00:00")).await.unwrap();
    let name = stored(&events).await[0].metadata.name.clone().expect("a name");
    events.delete(&name, &DeleteParams::default()).await.unwrap_or_else(|e| panic!("deleting {name}: {e}"));
    rec.publish(&ev, &run_ref(ns, "llm"), at("00:00:10")).await.unwrap();
    let again = stored(&events).await;
    assert_eq!(again.len(), 1, "{again:#?}");
    assert!(again[0].series.is_none(), "a new event, not a series: {:?}", again[0]);
    rec.publish(&ev, &run_ref(ns, "llm"), at("00:00:20")).await.unwrap();
    assert_eq!(stored(&events).await[0].series.as_ref().map(|s| s.count), Some(2));
    // The patch of the deleted event was refused (404); the other writes went through.
    assert_eq!(event_verbs(c, ns, 4), ["create", "patch", "create", "patch"]);
}

/// What it remembers is bounded: a forgotten event's repeat is a new event.
async fn it_remembers_only_the_most_recent_events(c: &TestCluster) {
    let ns = "ev-remembered";
    let (rec, _) = case(c, ns, 2).await;
    let ev = warning("Stalled", "no step for 10m");
    for name in ["a", "b", "c"] {
        rec.publish(&ev, &run_ref(ns, name), at("00:00:00")).await.unwrap();
    }
    rec.publish(&ev, &run_ref(ns, "a"), at("00:00:01")).await.unwrap();
    rec.publish(&ev, &run_ref(ns, "c"), at("00:00:02")).await.unwrap();
    assert_eq!(event_verbs(c, ns, 5), ["create", "create", "create", "create", "patch"]);
}

/// Two events of one object at the same instant are two objects (their names differ).
async fn events_at_the_same_instant_get_their_own_objects(c: &TestCluster) {
    let ns = "ev-instant";
    let (rec, events) = case(c, ns, 16).await;
    rec.publish(&warning("Restarting", "pod exited"), &run_ref(ns, "llm"), at("00:00:00")).await.unwrap();
    rec.publish(&warning("NaNRollback", "rolling back"), &run_ref(ns, "llm"), at("00:00:00")).await.unwrap();
    let mut reasons: Vec<String> = stored(&events).await.into_iter().filter_map(|e| e.reason).collect();
    reasons.sort();
    assert_eq!(reasons, ["NaNRollback", "Restarting"]);
}

/// The event recorder on the real API server, which stores the events and logs each
/// create and patch.
pub async fn the_recorder_folds_repeats_into_series(c: &TestCluster) {
    a_repeat_is_counted_in_the_first_events_series(c).await;
    a_series_whose_event_expired_starts_again(c).await;
    it_remembers_only_the_most_recent_events(c).await;
    events_at_the_same_instant_get_their_own_objects(c).await;
}

/// Two replicas elect one leader on the real Lease, never both at once, and through two
/// renewals it stays the one, and the Lease's holder.
pub async fn one_of_two_replicas_leads(c: &TestCluster) {
    let ns = "in-process-lease";
    kubectl(c, &["create", "namespace", ns]);
    let client = c.cp.client().await.unwrap_or_else(|e| panic!("the admin's client: {e}"));
    let election = |id: &str| operator::leader::Election {
        lease: "trainingrun-operator".into(),
        namespace: ns.into(),
        identity: id.into(),
        duration: 5,
    };
    let (mut a, _ta) = operator::leader::start(client.clone(), &election("a")).await.expect("a's election");
    let (mut b, _tb) = operator::leader::start(client.clone(), &election("b")).await.expect("b's election");
    let leases: Api<Lease> = Api::namespaced(client, ns);
    let renewed = |l: &Lease| l.spec.as_ref().and_then(|s| s.renew_time.clone()).map(|t| t.0);
    let mut renewals = 0;
    let mut last = None;
    let mut leaders = Vec::new();
    // Every change of either replica's view, for two renewals past the first lead.
    let watched = tokio::time::timeout(Duration::from_secs(40), async {
        while renewals < 3 {
            tokio::select! {
                _ = a.changed() => {}
                _ = b.changed() => {}
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
            let (a_leads, b_leads) = (*a.borrow_and_update(), *b.borrow_and_update());
            assert!(!(a_leads && b_leads), "both replicas lead at once (after {leaders:?})");
            if a_leads || b_leads {
                leaders.push(if a_leads { "a" } else { "b" });
                let lease = leases.get("trainingrun-operator").await.expect("the Lease");
                if renewed(&lease) != last {
                    last = renewed(&lease);
                    renewals += 1;
                }
            }
        }
    })
    .await;
    assert!(watched.is_ok(), "a leader and two renewals within 40 s: leaders seen {leaders:?}, {renewals} renewals");
    leaders.dedup();
    assert_eq!(leaders.len(), 1, "one leader throughout: {leaders:?}");
    let lease = leases.get("trainingrun-operator").await.expect("the Lease");
    assert_eq!(lease.spec.and_then(|s| s.holder_identity).as_deref(), Some(leaders[0]));
}

/// The Controller in process, driven by the watches alone: a suspended run gets its
/// suspended Job and the Suspended phase; deleted, it goes through the finalizer; then
/// the Controller stops within 10 s of being told.
pub async fn the_controller_runs_on_watches_and_stops_gracefully(c: &TestCluster) {
    let ns = "in-process";
    namespace(c, ns).await;
    let client = c.cp.client().await.unwrap_or_else(|e| panic!("the admin's client: {e}"));
    let metrics = Arc::new(operator::metrics::Metrics::new().expect("the metrics"));
    let clock = Arc::new(operator::clock::SystemClock);
    let ctx = operator::context::Context::new(client, Default::default(), metrics, clock);
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(operator::controller::run(ctx, Some(ns.into()), async move {
        let _ = stopped.wait_for(|s| *s).await;
    }));
    apply(c, ns, &tiny_cluster("held", |d| d["spec"]["suspend"] = serde_yaml_ng::Value::from(true)));
    poll(c, ns, "Suspended, with its suspended Job", Duration::from_secs(60), || {
        let phase = run_field(c, ns, "held", "{.status.phase}");
        let suspended = c.kubectl_out(&["-n", ns, "get", "job", "held-a1", "-o", "jsonpath={.spec.suspend}"]);
        if phase == "Suspended" && suspended.as_deref() == Ok("true") {
            Ok(())
        } else {
            Err(format!("phase {phase:?}, the Job suspended: {suspended:?}"))
        }
    });
    kubectl(c, &["-n", ns, "delete", "trainingrun", "held", "--wait=false"]);
    poll(c, ns, "the run gone through its finalizer", Duration::from_secs(60), || {
        let left = kubectl(c, &["-n", ns, "get", "trainingruns", "-o", "name"]);
        if left.trim().is_empty() { Ok(()) } else { Err(left) }
    });
    stop.send(true).expect("the controller listens");
    tokio::time::timeout(Duration::from_secs(10), task).await.expect("a graceful shutdown within 10 s").unwrap();
}
