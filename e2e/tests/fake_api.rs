//! The fake API server, driven through kube's typed clients and runtime.

use std::sync::Arc;
use std::time::Duration;

use e2e::fake_api::FakeApi;
use futures::{Stream, StreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::api::events::v1::Event as K8sEvent;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, PartialObjectMeta, Patch, PatchParams, PostParams,
};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::timeout;

const WAIT: Duration = Duration::from_secs(10);

fn cm(name: &str, labels: Value, data: Value) -> ConfigMap {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": labels},
        "data": data,
    }))
    .expect("valid ConfigMap")
}

/// The code and reason of an API error.
fn api_err<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(status)) => (status.code, status.reason.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn job_json(name: &str, extra_meta: Value, spec_extra: Value) -> Value {
    let mut job = json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}},
        },
    });
    json_patch::merge(&mut job, &json!({"metadata": extra_meta, "spec": spec_extra}));
    job
}

fn verbs(fake: &FakeApi) -> Vec<String> {
    fake.writes().into_iter().map(|w| w.verb).collect()
}

#[tokio::test]
async fn crud_and_errors() {
    let fake = FakeApi::new();
    let cms: Api<ConfigMap> = Api::default_namespaced(fake.client());

    let created = cms.create(&PostParams::default(), &cm("a", json!({"x": "1"}), json!({"k": "v"}))).await.unwrap();
    assert_eq!(created.metadata.namespace.as_deref(), Some("default"));
    assert!(created.metadata.uid.is_some());
    assert!(created.metadata.creation_timestamp.is_some());
    assert_eq!(created.metadata.generation, Some(1));

    let (code, reason) = api_err(cms.create(&PostParams::default(), &cm("a", json!({}), json!({}))).await);
    assert_eq!((code, reason.as_str()), (409, "AlreadyExists"));
    let (code, reason) = api_err(cms.get("missing").await);
    assert_eq!((code, reason.as_str()), (404, "NotFound"));

    let got = cms.get("a").await.unwrap();
    assert_eq!(got.data.as_ref().unwrap()["k"], "v");
    assert_eq!(cms.list(&ListParams::default()).await.unwrap().items.len(), 1);

    let mut changed = got.clone();
    changed.data = Some([("k".to_string(), "w".to_string())].into());
    let replaced = cms.replace("a", &PostParams::default(), &changed).await.unwrap();
    assert_eq!(replaced.data.as_ref().unwrap()["k"], "w");
    assert_eq!(replaced.metadata.generation, Some(2), "data counts as spec for generation");
    assert_ne!(replaced.resource_version(), got.resource_version());

    // generateName
    let mut generated = cm("", json!({}), json!({}));
    generated.metadata.name = None;
    generated.metadata.generate_name = Some("gen-".into());
    let generated = cms.create(&PostParams::default(), &generated).await.unwrap();
    let name = generated.name_any();
    assert!(name.starts_with("gen-") && name.len() == 9, "{name}");

    // Injected failures answer with a Status, then the fault clears.
    fake.fail_next("GET", "/configmaps/a", 500, 1);
    let (code, reason) = api_err(cms.get("a").await);
    assert_eq!((code, reason.as_str()), (500, "InternalError"));
    cms.get("a").await.unwrap();
    assert!(fake.requests().iter().any(|r| r == "GET /api/v1/namespaces/default/configmaps/a"));

    cms.delete("a", &DeleteParams::default()).await.unwrap();
    assert_eq!(api_err(cms.get("a").await).0, 404);
    assert_eq!(verbs(&fake), ["create", "update", "create", "delete"]);
    assert_eq!(fake.writes()[3].path, "/api/v1/namespaces/default/configmaps/a");
    fake.reset_writes();
    assert!(fake.writes().is_empty());
}

#[tokio::test]
async fn apply_is_idempotent_and_prunes_omitted_fields() {
    let fake = FakeApi::new();
    let jobs: Api<Job> = Api::default_namespaced(fake.client());
    let pp = PatchParams::apply("operator");
    let job = job_json("j", json!({"labels": {"a": "1", "b": "2"}}), json!({"backoffLimit": 2}));

    let first = jobs.patch("j", &pp, &Patch::Apply(&job)).await.unwrap();
    let second = jobs.patch("j", &pp, &Patch::Apply(&job)).await.unwrap();
    assert_eq!(first.resource_version(), second.resource_version(), "a no-op apply keeps the resourceVersion");
    assert_eq!(verbs(&fake), ["apply"]);
    let managed = second.metadata.managed_fields.as_ref().unwrap();
    assert_eq!(managed[0].manager.as_deref(), Some("operator"));
    assert_eq!(managed[0].operation.as_deref(), Some("Apply"));

    let pruned = job_json("j", json!({"labels": {"a": "1"}}), json!({}));
    let third = jobs.patch("j", &pp, &Patch::Apply(&pruned)).await.unwrap();
    assert_eq!(third.labels().get("b"), None);
    assert_eq!(third.labels().get("a").map(String::as_str), Some("1"));
    assert_eq!(third.spec.as_ref().unwrap().backoff_limit, None);
    assert_eq!(third.metadata.generation, Some(2));
    assert_eq!(verbs(&fake), ["apply", "apply"]);

    // A field another manager set survives this manager's apply.
    jobs.patch("j", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"other": "x"}}})))
        .await
        .unwrap();
    let fourth = jobs.patch("j", &pp, &Patch::Apply(&pruned)).await.unwrap();
    assert_eq!(fourth.labels().get("other").map(String::as_str), Some("x"));
}

#[tokio::test]
async fn status_is_a_separate_endpoint() {
    let fake = FakeApi::new();
    let jobs: Api<Job> = Api::default_namespaced(fake.client());
    let pp = PatchParams::apply("operator");
    jobs.patch("j", &pp, &Patch::Apply(job_json("j", json!({}), json!({"backoffLimit": 1})))).await.unwrap();

    let with_status =
        jobs.patch_status("j", &PatchParams::default(), &Patch::Merge(json!({"status": {"active": 1}}))).await.unwrap();
    assert_eq!(with_status.status.as_ref().unwrap().active, Some(1));
    assert_eq!(with_status.metadata.generation, Some(1), "status changes do not bump generation");

    // The main endpoint ignores status, through apply and replace.
    let mut applied = job_json("j", json!({}), json!({"backoffLimit": 1}));
    applied["status"] = json!({"succeeded": 5});
    let after_apply = jobs.patch("j", &pp, &Patch::Apply(&applied)).await.unwrap();
    assert_eq!(after_apply.status.as_ref().unwrap().succeeded, None);
    assert_eq!(after_apply.status.as_ref().unwrap().active, Some(1));
    let mut replaced = after_apply.clone();
    replaced.status.as_mut().unwrap().active = Some(7);
    let after_replace = jobs.replace("j", &PostParams::default(), &replaced).await.unwrap();
    assert_eq!(after_replace.status.as_ref().unwrap().active, Some(1));

    // The status endpoint ignores everything but status.
    let patch = json!({"spec": {"backoffLimit": 9}, "metadata": {"labels": {"x": "y"}}, "status": {"failed": 1}});
    let after_status = jobs.patch_status("j", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    assert_eq!(after_status.spec.as_ref().unwrap().backoff_limit, Some(1));
    assert!(after_status.labels().is_empty());
    assert_eq!(after_status.status.as_ref().unwrap().failed, Some(1));
    assert_eq!(after_status.metadata.generation, Some(1));

    // Metadata changes do not bump generation; spec changes do.
    let labelled = jobs
        .patch("j", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})))
        .await
        .unwrap();
    assert_eq!(labelled.metadata.generation, Some(1));
    let respec =
        jobs.patch("j", &PatchParams::default(), &Patch::Merge(json!({"spec": {"backoffLimit": 3}}))).await.unwrap();
    assert_eq!(respec.metadata.generation, Some(2));

    // The cluster's view of status changes goes through set_status.
    let rv = respec.resource_version();
    let set = fake.set_status("batch/v1", "Job", Some("default"), "j", json!({"succeeded": 1})).unwrap();
    assert_ne!(set["metadata"]["resourceVersion"].as_str(), rv.as_deref());
    assert_eq!(jobs.get("j").await.unwrap().status.unwrap().succeeded, Some(1));
    assert!(fake.writes().iter().all(|w| w.name == "j"));
    assert_eq!(fake.writes().iter().filter(|w| w.subresource.as_deref() == Some("status")).count(), 2);
}

#[tokio::test]
async fn stale_resource_version_conflicts() {
    let fake = FakeApi::new();
    let cms: Api<ConfigMap> = Api::default_namespaced(fake.client());
    let original = cms.create(&PostParams::default(), &cm("a", json!({}), json!({"k": "1"}))).await.unwrap();
    let mut first = original.clone();
    first.data = Some([("k".to_string(), "2".to_string())].into());
    cms.replace("a", &PostParams::default(), &first).await.unwrap();

    let (code, reason) = api_err(cms.replace("a", &PostParams::default(), &first).await);
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    let stale = json!({"metadata": {"resourceVersion": original.resource_version()}, "data": {"k": "3"}});
    assert_eq!(api_err(cms.patch("a", &PatchParams::default(), &Patch::Merge(&stale)).await).0, 409);
    let pre = DeleteParams {
        preconditions: Some(kube::api::Preconditions { resource_version: original.resource_version(), uid: None }),
        ..Default::default()
    };
    assert_eq!(api_err(cms.delete("a", &pre).await).0, 409);
    assert_eq!(cms.get("a").await.unwrap().data.unwrap()["k"], "2");
}

#[tokio::test]
async fn finalizers_hold_deletion() {
    let fake = FakeApi::new();
    let cms: Api<ConfigMap> = Api::default_namespaced(fake.client());
    cms.create(&PostParams::default(), &cm("a", json!({}), json!({}))).await.unwrap();

    // As kube's finalizer() helper adds its first finalizer.
    let add: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/finalizers", "value": null},
        {"op": "add", "path": "/metadata/finalizers", "value": ["example.com/cleanup"]},
    ]))
    .unwrap();
    let with_fin = cms.patch("a", &PatchParams::default(), &Patch::Json::<()>(add.clone())).await.unwrap();
    assert_eq!(with_fin.finalizers(), ["example.com/cleanup"]);
    // Now the path exists, so the same test fails.
    assert_eq!(api_err(cms.patch("a", &PatchParams::default(), &Patch::Json::<()>(add)).await).0, 422);

    let deleting = cms.delete("a", &DeleteParams::default()).await.unwrap();
    let deleting = deleting.left().expect("a pending deletion returns the object");
    assert!(deleting.metadata.deletion_timestamp.is_some());
    assert!(cms.get("a").await.unwrap().metadata.deletion_timestamp.is_some());
    // Deleting again changes nothing, and no finalizer may be added now.
    cms.delete("a", &DeleteParams::default()).await.unwrap();
    assert_eq!(verbs(&fake), ["create", "patch", "delete"]);
    let more = json!({"metadata": {"finalizers": ["example.com/cleanup", "late"]}});
    assert_eq!(api_err(cms.patch("a", &PatchParams::default(), &Patch::Merge(&more)).await).0, 422);

    let remove: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/finalizers/0", "value": "example.com/cleanup"},
        {"op": "remove", "path": "/metadata/finalizers/0"},
    ]))
    .unwrap();
    cms.patch("a", &PatchParams::default(), &Patch::Json::<()>(remove)).await.unwrap();
    assert_eq!(api_err(cms.get("a").await).0, 404);
    assert!(fake.get("v1", "ConfigMap", Some("default"), "a").is_none());
}

#[tokio::test]
async fn owner_references_cascade() {
    let fake = FakeApi::new();
    let client = fake.client();
    let runs: Api<DynamicObject> =
        Api::default_namespaced_with(client.clone(), &ApiResource::erase::<crds::TrainingRun>(&()));
    let jobs: Api<Job> = Api::default_namespaced(client.clone());
    let pods: Api<Pod> = Api::default_namespaced(client);
    let run = |name: &str| {
        fake.insert(json!({
            "apiVersion": "training.puretransformer.dev/v1alpha1",
            "kind": "TrainingRun",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {},
        }))
    };
    let owner = |obj: &Value, block: bool| {
        json!({"ownerReferences": [{
            "apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": true, "blockOwnerDeletion": block,
        }]})
    };
    let job_owned_by = |name: &str, obj: &Value, block: bool| job_json(name, owner(obj, block), json!({}));
    let pod_owned_by = |name: &str, obj: &Value| {
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"}});
        json_patch::merge(&mut pod, &json!({"metadata": owner(obj, true)}));
        pod
    };
    let pp = PatchParams::apply("operator");

    // Background: the run's Job goes, and the Job's pod with it.
    let r1 = run("r1");
    let j1 = jobs.patch("j1", &pp, &Patch::Apply(job_owned_by("j1", &r1, true))).await.unwrap();
    fake.insert(pod_owned_by("p1", &serde_json::to_value(&j1).unwrap()));
    runs.delete("r1", &DeleteParams::background()).await.unwrap();
    assert_eq!(api_err(jobs.get("j1").await).0, 404);
    assert_eq!(api_err(pods.get("p1").await).0, 404);

    // Orphan: the Job stays, without its owner reference.
    let r2 = run("r2");
    jobs.patch("j2", &pp, &Patch::Apply(job_owned_by("j2", &r2, true))).await.unwrap();
    runs.delete("r2", &DeleteParams::orphan()).await.unwrap();
    let j2 = jobs.get("j2").await.unwrap();
    assert!(j2.owner_references().is_empty());
    assert!(fake.get("training.puretransformer.dev/v1alpha1", "TrainingRun", Some("default"), "r2").is_none());

    // A Job deleted without a policy orphans its pods, as batch/v1 does.
    fake.insert(pod_owned_by("p2", &serde_json::to_value(&j2).unwrap()));
    jobs.delete("j2", &DeleteParams::default()).await.unwrap();
    assert!(pods.get("p2").await.unwrap().owner_references().is_empty());

    // Foreground: the owner waits for a blocking dependent's finalizer.
    let r3 = run("r3");
    let mut j3 = job_owned_by("j3", &r3, true);
    j3["metadata"]["finalizers"] = json!(["hold"]);
    jobs.patch("j3", &pp, &Patch::Apply(&j3)).await.unwrap();
    runs.delete("r3", &DeleteParams::foreground()).await.unwrap();
    let r3_now = runs.get("r3").await.unwrap();
    assert!(r3_now.metadata.deletion_timestamp.is_some());
    assert!(r3_now.finalizers().iter().any(|f| f == "foregroundDeletion"));
    assert!(jobs.get("j3").await.unwrap().metadata.deletion_timestamp.is_some());
    fake.update_with("batch/v1", "Job", Some("default"), "j3", |job| {
        job["metadata"]["finalizers"] = json!([]);
    })
    .unwrap();
    assert_eq!(api_err(jobs.get("j3").await).0, 404);
    assert_eq!(api_err(runs.get("r3").await).0, 404);

    // The cluster deletes too, with the same cascade.
    let r4 = run("r4");
    jobs.patch("j4", &pp, &Patch::Apply(job_owned_by("j4", &r4, true))).await.unwrap();
    fake.delete("training.puretransformer.dev/v1alpha1", "TrainingRun", Some("default"), "r4").unwrap();
    assert!(fake.get("batch/v1", "Job", Some("default"), "j4").is_none());
}

#[tokio::test]
async fn label_and_field_selectors() {
    let fake = FakeApi::new();
    let cms: Api<ConfigMap> = Api::default_namespaced(fake.client());
    for (name, labels) in [
        ("ab", json!({"a": "b"})),
        ("ab-cd", json!({"a": "b", "c": "d"})),
        ("ab-ce", json!({"a": "b", "c": "e"})),
        ("ax", json!({"a": "x"})),
        ("none", json!({})),
    ] {
        cms.create(&PostParams::default(), &cm(name, labels, json!({}))).await.unwrap();
    }
    let names = |selector: &'static str| {
        let cms = cms.clone();
        async move {
            let list = cms.list(&ListParams::default().labels(selector)).await.unwrap();
            list.items.iter().map(|c| c.name_any()).collect::<Vec<_>>()
        }
    };
    assert_eq!(names("a=b,c!=d").await, ["ab", "ab-ce"]);
    assert_eq!(names("a==b,c").await, ["ab-cd", "ab-ce"]);
    assert_eq!(names("a in (b, x),!c").await, ["ab", "ax"]);
    assert_eq!(names("a notin (b)").await, ["ax", "none"]);
    let by_name = cms.list(&ListParams::default().fields("metadata.name=ax")).await.unwrap();
    assert_eq!(by_name.items.len(), 1);
    let other_ns = cms.list(&ListParams::default().fields("metadata.namespace=elsewhere")).await.unwrap();
    assert!(other_ns.items.is_empty());
    let bad = cms.list(&ListParams::default().labels("a in b")).await;
    assert_eq!(api_err(bad).0, 400);
}

async fn next<S: Stream<Item = Result<watcher::Event<ConfigMap>, watcher::Error>> + Unpin>(
    stream: &mut S,
) -> watcher::Event<ConfigMap> {
    timeout(WAIT, stream.next()).await.expect("watch event in time").expect("stream open").expect("no watch error")
}

fn applied_name(event: &watcher::Event<ConfigMap>) -> String {
    match event {
        watcher::Event::Apply(o) | watcher::Event::InitApply(o) | watcher::Event::Delete(o) => o.name_any(),
        _ => String::new(),
    }
}

async fn watch_sequence(config: watcher::Config) {
    let fake = FakeApi::new();
    let cms: Api<ConfigMap> = Api::default_namespaced(fake.client());
    cms.create(&PostParams::default(), &cm("old", json!({}), json!({}))).await.unwrap();
    let mut stream = watcher(cms.clone(), config).boxed();
    assert!(matches!(next(&mut stream).await, watcher::Event::Init));
    let first = next(&mut stream).await;
    assert!(matches!(first, watcher::Event::InitApply(_)) && applied_name(&first) == "old");
    assert!(matches!(next(&mut stream).await, watcher::Event::InitDone));

    cms.create(&PostParams::default(), &cm("new", json!({}), json!({"k": "1"}))).await.unwrap();
    let created = next(&mut stream).await;
    assert!(matches!(created, watcher::Event::Apply(_)) && applied_name(&created) == "new");
    cms.patch("new", &PatchParams::default(), &Patch::Merge(json!({"data": {"k": "2"}}))).await.unwrap();
    match next(&mut stream).await {
        watcher::Event::Apply(o) => assert_eq!(o.data.unwrap()["k"], "2"),
        other => panic!("expected a modification, got {other:?}"),
    }
    // A no-op write is invisible to watchers: the next event is the deletion.
    cms.patch("new", &PatchParams::default(), &Patch::Merge(json!({"data": {"k": "2"}}))).await.unwrap();
    cms.delete("new", &DeleteParams::default()).await.unwrap();
    let deleted = next(&mut stream).await;
    assert!(matches!(deleted, watcher::Event::Delete(_)) && applied_name(&deleted) == "new");
}

#[tokio::test]
async fn watcher_lists_then_watches() {
    watch_sequence(watcher::Config::default()).await;
}

#[tokio::test]
async fn watcher_streaming_list() {
    watch_sequence(watcher::Config::default().streaming_lists()).await;
}

#[tokio::test]
async fn watch_timeout_ends_stream_and_watcher_resumes() {
    let fake = FakeApi::new();
    let cms: Api<ConfigMap> = Api::default_namespaced(fake.client());
    let mut stream = watcher(cms.clone(), watcher::Config::default().timeout(1)).boxed();
    assert!(matches!(next(&mut stream).await, watcher::Event::Init));
    assert!(matches!(next(&mut stream).await, watcher::Event::InitDone));
    // Keep polling past the server's 1 s watch timeout, so the watcher re-watches.
    assert!(timeout(Duration::from_millis(1500), stream.next()).await.is_err());
    cms.create(&PostParams::default(), &cm("late", json!({}), json!({}))).await.unwrap();
    let created = next(&mut stream).await;
    assert_eq!(applied_name(&created), "late");
    let watches = fake.requests().iter().filter(|r| r.contains("watch=true")).count();
    assert!(watches >= 2, "the watch should have been re-opened: {:?}", fake.requests());
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct ReconcileError(String);

#[tokio::test]
async fn controller_reconciles_with_finalizer() {
    let fake = FakeApi::new();
    let cms: Api<ConfigMap> = Api::default_namespaced(fake.client());
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();

    let reconcile = |obj: Arc<ConfigMap>, ctx: Arc<(Api<ConfigMap>, mpsc::UnboundedSender<String>)>| async move {
        let (api, tx) = &*ctx;
        finalizer(api, "example.com/cleanup", obj, |event| async move {
            match event {
                FinalizerEvent::Apply(o) => tx.send(format!("apply {}", o.name_any())),
                FinalizerEvent::Cleanup(o) => tx.send(format!("cleanup {}", o.name_any())),
            }
            .map_err(|e| ReconcileError(e.to_string()))?;
            Ok::<_, ReconcileError>(Action::await_change())
        })
        .await
        .map_err(|e| ReconcileError(e.to_string()))
    };
    let error_policy = |_: Arc<ConfigMap>, _: &ReconcileError, _: Arc<_>| Action::requeue(Duration::from_millis(100));
    let controller = Controller::new(cms.clone(), watcher::Config::default())
        .run(reconcile, error_policy, Arc::new((cms.clone(), tx)))
        .for_each(|_| async {});
    let handle = tokio::spawn(controller);

    // Create only once the controller is watching.
    timeout(WAIT, async {
        while !fake.requests().iter().any(|r| r.contains("/configmaps?") && r.contains("watch=true")) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the controller watches");
    cms.create(&PostParams::default(), &cm("late", json!({}), json!({}))).await.unwrap();
    assert_eq!(timeout(WAIT, rx.recv()).await.unwrap().unwrap(), "apply late");
    assert_eq!(cms.get("late").await.unwrap().finalizers(), ["example.com/cleanup"]);

    cms.delete("late", &DeleteParams::default()).await.unwrap();
    assert_eq!(timeout(WAIT, rx.recv()).await.unwrap().unwrap(), "cleanup late");
    timeout(WAIT, async {
        while fake.get("v1", "ConfigMap", Some("default"), "late").is_some() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the finalizer is removed and the object goes");
    // Settled: no hot loop of writes.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(verbs(&fake), ["create", "patch", "delete", "patch"]);
    handle.abort();
}

#[tokio::test]
async fn recorder_events_are_stored() {
    let fake = FakeApi::new();
    let client = fake.client();
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let target = cms.create(&PostParams::default(), &cm("a", json!({}), json!({}))).await.unwrap();
    let recorder = Recorder::new(client.clone(), Reporter { controller: "x".into(), instance: None });
    let event = Event {
        type_: EventType::Normal,
        reason: "Created".into(),
        note: Some("made it".into()),
        action: "Create".into(),
        secondary: None,
    };
    let reference = target.object_ref(&());
    recorder.publish(&event, &reference).await.unwrap();
    recorder.publish(&event, &reference).await.unwrap();

    let events: Api<K8sEvent> = Api::default_namespaced(client);
    let list = events.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1, "a repeated event is a series on the same object");
    let stored = &list.items[0];
    assert_eq!(stored.reason.as_deref(), Some("Created"));
    assert_eq!(stored.regarding.as_ref().and_then(|r| r.name.as_deref()), Some("a"));
    assert_eq!(stored.series.as_ref().map(|s| s.count), Some(2));
    let event_writes: Vec<_> = fake.writes().into_iter().filter(|w| w.kind == "Event").map(|w| w.verb).collect();
    assert_eq!(event_writes, ["create", "patch"]);
}

#[tokio::test]
async fn lease_apply_conflicts() {
    let fake = FakeApi::new();
    let leases: Api<Lease> = Api::default_namespaced(fake.client());
    let lease = |holder: &str| {
        json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "leader"},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15},
        })
    };
    let taken = leases.patch("leader", &PatchParams::apply("a").force(), &Patch::Apply(lease("a"))).await.unwrap();
    assert_eq!(taken.spec.as_ref().unwrap().holder_identity.as_deref(), Some("a"));

    // Another manager may not take fields it does not own without force.
    let (code, reason) = api_err(leases.patch("leader", &PatchParams::apply("b"), &Patch::Apply(lease("b"))).await);
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    // Applying the same values is shared ownership, not a conflict.
    leases.patch("leader", &PatchParams::apply("b"), &Patch::Apply(lease("a"))).await.unwrap();

    // A resourceVersion in the applied object is a precondition.
    let mut stale = lease("a");
    stale["metadata"]["resourceVersion"] = json!("1");
    let (code, _) = api_err(leases.patch("leader", &PatchParams::apply("a").force(), &Patch::Apply(&stale)).await);
    assert_eq!(code, 409);
    let current = leases.get("leader").await.unwrap();
    let mut fresh = lease("a");
    fresh["spec"]["leaseDurationSeconds"] = json!(30);
    fresh["metadata"]["resourceVersion"] = json!(current.resource_version());
    let renewed = leases.patch("leader", &PatchParams::apply("a").force(), &Patch::Apply(&fresh)).await.unwrap();
    assert_eq!(renewed.spec.unwrap().lease_duration_seconds, Some(30));

    // Released as kube-lease-manager does (strategic merge of nulls), another holder may apply.
    let release = json!({"spec": {"holderIdentity": null, "leaseDurationSeconds": null}});
    let as_a = PatchParams { field_manager: Some("a".into()), ..Default::default() };
    let released = leases.patch("leader", &as_a, &Patch::Strategic(&release)).await.unwrap();
    assert_eq!(released.spec.as_ref().and_then(|s| s.holder_identity.as_deref()), None);
    let b = leases.patch("leader", &PatchParams::apply("b"), &Patch::Apply(lease("b"))).await.unwrap();
    assert_eq!(b.spec.unwrap().holder_identity.as_deref(), Some("b"));

    // And with force, a may take over from b.
    leases.patch("leader", &PatchParams::apply("a").force(), &Patch::Apply(lease("a"))).await.unwrap();
    assert_eq!(leases.get("leader").await.unwrap().spec.unwrap().holder_identity.as_deref(), Some("a"));
}

#[tokio::test]
async fn cluster_scoped_and_crd_lookup() {
    let fake = FakeApi::new();
    fake.insert(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "trainingruns.training.puretransformer.dev"},
        "spec": {
            "group": "training.puretransformer.dev",
            "names": {"kind": "TrainingRun", "plural": "trainingruns"},
            "scope": "Namespaced",
            "versions": [],
        },
    }));
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(fake.client());
    let crd = crds.get("trainingruns.training.puretransformer.dev").await.unwrap();
    assert_eq!(crd.spec.names.kind, "TrainingRun");
    let raw = crds.get_metadata("trainingruns.training.puretransformer.dev").await.unwrap();
    assert_eq!(raw.metadata.name.as_deref(), Some("trainingruns.training.puretransformer.dev"));
    assert!(raw.metadata.namespace.is_none());
    assert_eq!(fake.list("apiextensions.k8s.io/v1", "CustomResourceDefinition", None).len(), 1);
    // Cluster-wide list across namespaces.
    let client = fake.client();
    Api::<ConfigMap>::namespaced(client.clone(), "one")
        .create(&PostParams::default(), &cm("a", json!({}), json!({})))
        .await
        .unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), "two")
        .create(&PostParams::default(), &cm("a", json!({}), json!({})))
        .await
        .unwrap();
    assert_eq!(Api::<ConfigMap>::all(client).list(&ListParams::default()).await.unwrap().items.len(), 2);
}

#[tokio::test]
async fn expired_resource_version_makes_the_watcher_relist() {
    let fake = FakeApi::with_watch_history(2);
    let cms: Api<ConfigMap> = Api::default_namespaced(fake.client());
    cms.create(&PostParams::default(), &cm("old", json!({}), json!({}))).await.unwrap();
    let mut stream = watcher(cms.clone(), watcher::Config::default()).boxed();
    assert!(matches!(next(&mut stream).await, watcher::Event::Init));
    assert!(matches!(next(&mut stream).await, watcher::Event::InitApply(_)));
    assert!(matches!(next(&mut stream).await, watcher::Event::InitDone));
    // The watch opens lazily, after these pushed the listed version out of history.
    for name in ["a", "b", "c"] {
        cms.create(&PostParams::default(), &cm(name, json!({}), json!({}))).await.unwrap();
    }
    match timeout(WAIT, stream.next()).await.unwrap().unwrap() {
        Err(watcher::Error::WatchError(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"))
        }
        other => panic!("expected 410 Expired, got {other:?}"),
    }
    assert!(matches!(next(&mut stream).await, watcher::Event::Init));
    let mut names = Vec::new();
    loop {
        match next(&mut stream).await {
            watcher::Event::InitApply(o) => names.push(o.name_any()),
            watcher::Event::InitDone => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(names, ["a", "b", "c", "old"]);
}

#[tokio::test]
async fn label_filtered_metadata_watch_sees_objects_enter_and_leave() {
    let fake = FakeApi::new();
    let cms: Api<ConfigMap> = Api::default_namespaced(fake.client());
    let metas: Api<PartialObjectMeta<ConfigMap>> = Api::default_namespaced(fake.client());
    let mut stream = watcher(metas, watcher::Config::default().labels("a=b")).boxed();
    let mut next_meta = async || timeout(WAIT, stream.next()).await.unwrap().unwrap().unwrap();
    assert!(matches!(next_meta().await, watcher::Event::Init));
    assert!(matches!(next_meta().await, watcher::Event::InitDone));
    cms.create(&PostParams::default(), &cm("x", json!({"a": "x"}), json!({}))).await.unwrap();
    let label = |v: &str| json!({"metadata": {"labels": {"a": v}}});
    cms.patch("x", &PatchParams::default(), &Patch::Merge(label("b"))).await.unwrap();
    match next_meta().await {
        watcher::Event::Apply(meta) => assert_eq!(meta.metadata.name.as_deref(), Some("x")),
        other => panic!("expected x to enter the selection, got {other:?}"),
    }
    cms.patch("x", &PatchParams::default(), &Patch::Merge(label("c"))).await.unwrap();
    match next_meta().await {
        watcher::Event::Delete(meta) => assert_eq!(meta.metadata.name.as_deref(), Some("x")),
        other => panic!("expected x to leave the selection, got {other:?}"),
    }
}
