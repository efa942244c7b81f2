//! The operator's event recorder against the fake API: repeats become a series, and
//! what it remembers is bounded.

use std::num::NonZeroUsize;

use e2e::fake_api::FakeApi;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Reporter};
use operator::events::Recorder;
use serde_json::Value;

fn at(s: &str) -> Timestamp {
    format!("2026-01-01T{s}Z").parse().unwrap()
}

fn run(name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("training.puretransformer.dev/v1alpha1".into()),
        kind: Some("TrainingRun".into()),
        namespace: Some("ml".into()),
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

fn recorder(fake: &FakeApi, remembered: usize) -> Recorder {
    let reporter = Reporter { controller: "trainingrun-operator".into(), instance: Some("op-0".into()) };
    Recorder::remembering(fake.client(), reporter, NonZeroUsize::new(remembered).unwrap())
}

fn events(fake: &FakeApi) -> Vec<Value> {
    fake.list("events.k8s.io/v1", "Event", Some("ml"))
}

fn event_verbs(fake: &FakeApi) -> Vec<String> {
    fake.writes().into_iter().filter(|w| w.kind == "Event").map(|w| w.verb).collect()
}

#[tokio::test]
async fn a_repeat_is_counted_in_the_first_events_series() {
    let fake = FakeApi::new();
    let rec = recorder(&fake, 16);
    let ev = warning("StorageFull", "the PVC is full");
    rec.publish(&ev, &run("llm"), at("00:00:00")).await.unwrap();
    rec.publish(&ev, &run("llm"), at("00:00:30")).await.unwrap();
    rec.publish(&ev, &run("llm"), at("00:01:00")).await.unwrap();
    let stored = events(&fake);
    assert_eq!(stored.len(), 1, "{stored:#?}");
    let e = &stored[0];
    assert_eq!(e["type"], "Warning");
    assert_eq!(e["reason"], "StorageFull");
    assert_eq!(e["note"], "the PVC is full");
    assert_eq!(e["regarding"]["name"], "llm");
    assert_eq!(e["reportingController"], "trainingrun-operator");
    assert_eq!(e["reportingInstance"], "op-0");
    assert_eq!(e["series"]["count"], 3);
    assert_eq!(e["series"]["lastObservedTime"], "2026-01-01T00:01:00.000000Z");
    assert_eq!(event_verbs(&fake), ["create", "patch", "patch"]);

    // Another message, another run, or a repeat after the window: new events.
    rec.publish(&warning("StorageFull", "the PVC is full again"), &run("llm"), at("00:01:01")).await.unwrap();
    rec.publish(&ev, &run("other"), at("00:01:02")).await.unwrap();
    rec.publish(&ev, &run("llm"), at("00:07:01")).await.unwrap();
    assert_eq!(events(&fake).len(), 4);
    assert_eq!(event_verbs(&fake)[3..], ["create", "create", "create"]);
}

#[tokio::test]
async fn a_series_whose_event_expired_starts_again() {
    let fake = FakeApi::new();
    let rec = recorder(&fake, 16);
    let ev = warning("TrainerStatusRefused", "step 10 is past the run's 5 steps");
    rec.publish(&ev, &run("llm"), at("00:00:00")).await.unwrap();
    let name = events(&fake)[0]["metadata"]["name"].as_str().unwrap().to_string();
    fake.delete("events.k8s.io/v1", "Event", Some("ml"), &name).unwrap();
    rec.publish(&ev, &run("llm"), at("00:00:10")).await.unwrap();
    let stored = events(&fake);
    assert_eq!(stored.len(), 1);
    assert!(stored[0]["series"].is_null(), "a new event, not a series: {}", stored[0]);
    // The new event is the one a third repeat counts in.
    rec.publish(&ev, &run("llm"), at("00:00:20")).await.unwrap();
    assert_eq!(events(&fake)[0]["series"]["count"], 2);
}

#[tokio::test]
async fn it_remembers_only_the_most_recent_events() {
    let fake = FakeApi::new();
    let rec = recorder(&fake, 2);
    let ev = warning("Stalled", "no step for 10m");
    for name in ["a", "b", "c"] {
        rec.publish(&ev, &run(name), at("00:00:00")).await.unwrap();
    }
    // "a" was forgotten: its repeat is a new event; "c" is still remembered.
    rec.publish(&ev, &run("a"), at("00:00:01")).await.unwrap();
    rec.publish(&ev, &run("c"), at("00:00:02")).await.unwrap();
    assert_eq!(event_verbs(&fake), ["create", "create", "create", "create", "patch"]);
}

#[tokio::test]
async fn events_at_the_same_instant_get_their_own_objects() {
    let fake = FakeApi::new();
    let rec = recorder(&fake, 16);
    rec.publish(&warning("Restarting", "pod exited"), &run("llm"), at("00:00:00")).await.unwrap();
    rec.publish(&warning("NaNRollback", "rolling back"), &run("llm"), at("00:00:00")).await.unwrap();
    let reasons: Vec<Value> = events(&fake).iter().map(|e| e["reason"].clone()).collect();
    assert_eq!(reasons.len(), 2, "{reasons:?}");
}
