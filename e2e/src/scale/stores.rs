//! What the operator's stores hold, by kind: each kind the operator watches, listed
//! with the operator's selectors and put into a reflector store as the API server
//! returns it and as `operator::cache::Trim` keeps it, counted on this thread's heap.
//!
//! The count comes from [`Counting`], which the bench binary installs as its global
//! allocator; without it every figure would be zero, and [`measure`] says so.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Service};
use kube::api::{Api, ListParams};
use kube::runtime::{reflector, watcher};
use operator::cache::Trim;

use crate::control_plane::Error;

/// A global allocator that counts, per thread, the bytes allocated less those freed.
pub struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
}

fn count(bytes: isize) {
    // `try_with`: a thread being torn down has no counter left.
    let _ = LIVE.try_with(|l| l.set(l.get() + bytes));
}

// SAFETY: every call is passed to `System` unchanged; the counting touches only a
// thread-local `Cell`, which allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as isize));
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size as isize - layout.size() as isize);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

fn live() -> isize {
    LIVE.with(Cell::get)
}

/// One kind's store: its objects, and its bytes whole and trimmed.
#[derive(Clone, Debug)]
pub struct KindBytes {
    pub kind: &'static str,
    pub objects: usize,
    pub whole: usize,
    pub trimmed: usize,
}

/// Each kind's store as the operator's selectors list it in `namespace`.
pub async fn measure(client: &kube::Client, namespace: &str) -> Result<Vec<KindBytes>, Error> {
    let owned = ListParams::default().labels(&operator::resources::owned_selector());
    let pods = ListParams::default().labels(operator::resources::RUN_LABEL);
    let all = ListParams::default();
    let kinds = vec![
        kind::<crds::TrainingRun>(client, namespace, "TrainingRun", &all).await?,
        kind::<Job>(client, namespace, "Job", &owned).await?,
        kind::<Pod>(client, namespace, "Pod", &pods).await?,
        kind::<ConfigMap>(client, namespace, "ConfigMap", &owned).await?,
        kind::<PersistentVolumeClaim>(client, namespace, "PersistentVolumeClaim", &owned).await?,
        kind::<Service>(client, namespace, "Service", &owned).await?,
    ];
    if kinds.iter().any(|k| k.objects > 0) && kinds.iter().all(|k| k.whole == 0) {
        return Err(Error::Setup(
            "store bytes: nothing counted; install scale::stores::Counting as the allocator".into(),
        ));
    }
    Ok(kinds)
}

async fn kind<K>(
    client: &kube::Client,
    namespace: &str,
    name: &'static str,
    lp: &ListParams,
) -> Result<KindBytes, Error>
where
    K: Trim
        + kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + 'static,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let mut texts = Vec::new();
    let mut lp = lp.clone().limit(500);
    loop {
        let page = api.list(&lp).await.map_err(|e| Error::Setup(format!("listing {name}s: {e}")))?;
        for item in &page.items {
            texts.push(serde_json::to_vec(item).expect("a listed object serializes"));
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => lp = lp.continue_token(&token),
            None => break,
        }
    }
    let (whole, trimmed) = (store_bytes::<K>(&texts, false), store_bytes::<K>(&texts, true));
    Ok(KindBytes { kind: name, objects: texts.len(), whole, trimmed })
}

/// The heap a reflector store of `texts` (objects as JSON) takes, each trimmed or not.
fn store_bytes<K>(texts: &[Vec<u8>], trim: bool) -> usize
where
    K: Trim + kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + 'static,
{
    let before = live();
    let (store, mut writer) = reflector::store::<K>();
    for text in texts {
        let mut obj: K = serde_json::from_slice(text).expect("a listed object deserializes");
        if trim {
            obj.trim();
        }
        writer.apply_watcher_event(&watcher::Event::Apply(obj));
    }
    let bytes = (live() - before).max(0) as usize;
    drop((store, writer));
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    #[global_allocator]
    static ALLOCATOR: Counting = Counting;

    #[test]
    fn a_store_of_trimmed_jobs_is_counted_and_smaller_than_of_whole_ones() {
        let job = |i: usize| {
            let template = serde_json::json!({"spec": {"containers": [{"name": "trainer", "image": "t", "env": (0..40)
                .map(|e| serde_json::json!({"name": format!("VAR_{e}"), "value": "x".repeat(40)})).collect::<Vec<_>>()}]}});
            serde_json::to_vec(&Job {
                metadata: ObjectMeta {
                    name: Some(format!("run-{i}-a1")),
                    namespace: Some("ml".into()),
                    ..Default::default()
                },
                spec: Some(
                    serde_json::from_value(serde_json::json!({"template": template, "suspend": false})).unwrap(),
                ),
                status: None,
            })
            .unwrap()
        };
        let texts: Vec<Vec<u8>> = (0..100).map(job).collect();
        let (whole, trimmed) = (store_bytes::<Job>(&texts, false), store_bytes::<Job>(&texts, true));
        let text: usize = texts.iter().map(Vec::len).sum();
        assert!(whole > text, "a typed Job takes more than its JSON: {whole} bytes of {text}");
        assert!(trimmed > 0 && trimmed * 4 < whole, "trimmed {trimmed} of {whole} bytes");
    }
}
