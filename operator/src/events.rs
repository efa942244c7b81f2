//! The operator's one event recorder (events.k8s.io/v1).
//!
//! As with kube's `Recorder`, an event repeated within [`SERIES_WINDOW`] updates the
//! first one's `series` rather than creating another object. Unlike it, what the
//! recorder remembers is bounded, as client-go's correlator is (an LRU of
//! [`REMEMBERED`] events), and holds only what a repeat needs: kube's keeps every event
//! of the last six minutes in full, about 3 KB each, which grows with every run that
//! starts in that window (a burst of 10,000 new runs is 60 MB).

use std::num::NonZeroUsize;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};
use kube::{Client, ResourceExt};
use lru::LruCache;
use serde_json::json;

/// How long a repeat counts toward the first event's series (kube and client-go: 6 minutes).
pub const SERIES_WINDOW: SignedDuration = SignedDuration::from_mins(6);

/// How many recent events the recorder remembers (client-go's correlator: 4,096).
pub const REMEMBERED: usize = 4096;

/// What makes two events the same event: who reports it, about which object, and what
/// it says. The note is kept as a hash: a different message is a different event.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    warning: bool,
    reason: String,
    action: String,
    kind: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    uid: Option<String>,
    note: u64,
}

impl Key {
    fn new(ev: &Event, regarding: &ObjectReference) -> Key {
        use std::hash::{BuildHasher, BuildHasherDefault};
        let note = BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(&ev.note);
        Key {
            warning: matches!(ev.type_, EventType::Warning),
            reason: ev.reason.clone(),
            action: ev.action.clone(),
            kind: regarding.kind.clone(),
            namespace: regarding.namespace.clone(),
            name: regarding.name.clone(),
            uid: regarding.uid.clone(),
            note,
        }
    }
}

/// The event object a repeat updates.
#[derive(Clone, Debug, PartialEq)]
struct Published {
    namespace: String,
    name: String,
    count: i32,
    last: Timestamp,
}

/// Publishes events, and folds repeats into series.
pub struct Recorder {
    client: Client,
    reporter: Reporter,
    recent: Mutex<LruCache<Key, Published>>,
    /// The suffix of the last event name: nanoseconds of the wall clock, as client-go
    /// names events, but never repeated within the process.
    last_suffix: AtomicU64,
}

impl Recorder {
    pub fn new(client: Client, reporter: Reporter) -> Recorder {
        Recorder::remembering(client, reporter, NonZeroUsize::new(REMEMBERED).expect("REMEMBERED > 0"))
    }

    /// A recorder that remembers at most `capacity` recent events.
    pub fn remembering(client: Client, reporter: Reporter, capacity: NonZeroUsize) -> Recorder {
        Recorder { client, reporter, recent: Mutex::new(LruCache::new(capacity)), last_suffix: AtomicU64::new(0) }
    }

    /// Creates the event, or counts it in the series of the same event published less
    /// than [`SERIES_WINDOW`] ago. Events about cluster-scoped objects go to `default`.
    pub async fn publish(&self, ev: &Event, regarding: &ObjectReference, now: Timestamp) -> Result<(), kube::Error> {
        let key = Key::new(ev, regarding);
        let repeat = self.recent.lock().expect("events lock").get(&key).and_then(|p| repeat_of(p, now));
        if let Some(series) = repeat {
            let events: Api<K8sEvent> = Api::namespaced(self.client.clone(), &series.namespace);
            let patch = json!({"series": {"count": series.count, "lastObservedTime": MicroTime(now)}});
            match events.patch(&series.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => {
                    self.recent.lock().expect("events lock").put(key, series);
                    return Ok(());
                }
                // Gone from the API server (events expire there): start a new one.
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let event = self.event(ev, regarding, now);
        let namespace = event.namespace().unwrap_or_default();
        let events: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
        events.create(&PostParams::default(), &event).await?;
        let published = Published { namespace, name: event.name_any(), count: 1, last: now };
        self.recent.lock().expect("events lock").put(key, published);
        Ok(())
    }

    fn unique_suffix(&self) -> u64 {
        let wall = u64::try_from(Timestamp::now().as_nanosecond()).unwrap_or_default();
        let next = |last: u64| Some(wall.max(last + 1));
        let last = self.last_suffix.fetch_update(Ordering::Relaxed, Ordering::Relaxed, next).unwrap_or_default();
        wall.max(last + 1)
    }

    fn event(&self, ev: &Event, regarding: &ObjectReference, now: Timestamp) -> K8sEvent {
        let controller = &self.reporter.controller;
        let about = regarding.name.as_deref().unwrap_or(controller);
        K8sEvent {
            metadata: ObjectMeta {
                namespace: Some(regarding.namespace.clone().unwrap_or_else(|| "default".into())),
                name: Some(format!("{about}.{:x}", self.unique_suffix())),
                ..Default::default()
            },
            action: Some(ev.action.clone()),
            reason: Some(ev.reason.clone()),
            note: ev.note.clone(),
            type_: Some(if matches!(ev.type_, EventType::Warning) { "Warning" } else { "Normal" }.into()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            related: ev.secondary.clone(),
            reporting_controller: Some(controller.clone()),
            reporting_instance: Some(self.reporter.instance.clone().unwrap_or_else(|| controller.clone())),
            ..Default::default()
        }
    }
}

/// The series a repeat at `now` continues, if the last one is recent enough.
fn repeat_of(last: &Published, now: Timestamp) -> Option<Published> {
    (now.duration_since(last.last) < SERIES_WINDOW).then(|| Published {
        count: last.count.saturating_add(1),
        last: now,
        ..last.clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        format!("2026-01-01T{s}Z").parse().unwrap()
    }

    fn published(last: Timestamp, count: i32) -> Published {
        Published { namespace: "ml".into(), name: "llm.1".into(), count, last }
    }

    #[test]
    fn a_repeat_within_the_window_continues_the_series() {
        let table = [
            ("a second later", "00:00:01", Some(2)),
            ("just inside six minutes", "00:05:59", Some(2)),
            ("six minutes later", "00:06:00", None),
            ("an hour later", "01:00:00", None),
        ];
        for (what, now, count) in table {
            let got = repeat_of(&published(at("00:00:00"), 1), at(now));
            assert_eq!(got.as_ref().map(|p| p.count), count, "{what}");
            if let Some(p) = got {
                assert_eq!((p.last, p.name.as_str()), (at(now), "llm.1"), "{what}");
            }
        }
        let many = repeat_of(&published(at("00:00:00"), i32::MAX), at("00:00:01")).unwrap();
        assert_eq!(many.count, i32::MAX, "the count saturates");
    }

    #[test]
    fn events_are_the_same_when_reporter_object_reason_and_note_are() {
        let ev = |reason: &str, note: &str| Event {
            type_: EventType::Normal,
            reason: reason.into(),
            note: Some(note.into()),
            action: "Reconcile".into(),
            secondary: None,
        };
        let object = |uid: &str, rv: &str| ObjectReference {
            kind: Some("TrainingRun".into()),
            namespace: Some("ml".into()),
            name: Some("llm".into()),
            uid: Some(uid.into()),
            resource_version: Some(rv.into()),
            ..Default::default()
        };
        let base = Key::new(&ev("JobCreated", "created Job llm-a1"), &object("u1", "1"));
        assert_eq!(base, Key::new(&ev("JobCreated", "created Job llm-a1"), &object("u1", "7")), "any version");
        assert_ne!(base, Key::new(&ev("JobCreated", "created Job llm-a2"), &object("u1", "1")), "another note");
        assert_ne!(base, Key::new(&ev("Running", "created Job llm-a1"), &object("u1", "1")), "another reason");
        assert_ne!(base, Key::new(&ev("JobCreated", "created Job llm-a1"), &object("u2", "1")), "a new run");
    }
}
