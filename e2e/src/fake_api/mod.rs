//! A stateful, in-memory fake of the Kubernetes API server.
//!
//! [`FakeApi`] stores any resource as JSON, keyed by (group, version, plural,
//! namespace, name), and serves it over the REST layout kube-rs speaks: get,
//! list, watch (list+watch and streaming lists), create, replace, the four patch
//! types including server-side apply, delete and deletecollection, with the
//! `/status` subresource split. Hand [`FakeApi::client`] to the code under test
//! and use the other methods to act as "the cluster": inspect objects, set
//! status, delete things, count client writes and inject failures.
//!
//! What it emulates, and how closely:
//! - `resourceVersion` is one global counter; a write carrying a stale one is a
//!   409 Conflict. A write that changes nothing (ignoring `resourceVersion` and
//!   `managedFields`) is a no-op: same resourceVersion, no watch event, not
//!   counted in [`FakeApi::writes`].
//! - `metadata.generation` starts at 1 and is bumped when anything outside
//!   `metadata` and `status` changes.
//! - Main-endpoint writes keep the stored `status`; `/status` writes change only
//!   `status`.
//! - Deletion honours finalizers (`deletionTimestamp` first, removal when the last
//!   finalizer goes) and garbage-collects dependents through `ownerReferences`
//!   with Background, Foreground and Orphan propagation. `batch/v1` Jobs default
//!   to Orphan, as in the real API server.
//! - Server-side apply tracks field ownership per manager (leaf paths, lists are
//!   atomic): fields a manager applied before and omits now are removed, and a
//!   changed value owned by another manager is a 409 unless `force=true`.
//!   Strategic merge patches are treated as JSON merge patches, and list merge
//!   keys are not honoured (lists are replaced whole).
//! - A JSON Patch `test` of `null` against a missing path passes, as on the real
//!   server (kube's `finalizer()` helper relies on it).
//!
//! [`FakeApi::client`] must be called inside a tokio runtime (kube's client
//! spawns its buffer task).
//!
//! This module holds the public API. Below it, each module uses only those listed
//! after it: `routing` routes requests to the plain handlers, `watch` the watch
//! streams, `ssa` server-side apply, `store` the objects, change log and deletion,
//! `ownership` field ownership, `selectors` label and field selectors, `json` the
//! JSON helpers, `request` the parsed request, `error` the `Status` errors and
//! `resource` resource types, keys and the URL layout.

mod error;
mod json;
mod ownership;
mod request;
mod resource;
mod routing;
mod selectors;
mod ssa;
mod store;
mod watch;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use http::{Method, Request, Response};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tokio::sync::broadcast;

pub use error::FakeError;
pub use json::ResponseBody;
use json::{json_response, meta_mut, rv_of, set_meta, str_at, to_partial, version_info};
use ownership::{Managers, retain_present};
pub use request::Write;
use request::{Req, parse_query};
use resource::{Key, Res, Target};
use store::{Failure, Preconditions, State};

/// Watch events retained for resuming watches by default; older resourceVersions
/// get 410 Expired.
const LOG_CAPACITY: usize = 100_000;
/// Live watch fan-out; a watcher that lags this far behind has its stream ended.
const BROADCAST_CAPACITY: usize = 8192;

/// The fake API server. Cheap to clone; clones share the same cluster.
#[derive(Clone)]
pub struct FakeApi {
    state: Arc<Mutex<State>>,
}

/// The `tower::Service` that kube's `Client` talks to.
#[derive(Clone)]
pub struct FakeService {
    api: FakeApi,
}

impl Default for FakeApi {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeApi {
    pub fn new() -> FakeApi {
        Self::with_watch_history(LOG_CAPACITY)
    }

    /// A fake that keeps only the last `changes` changes for resuming watches, so
    /// tests can make a watch resume from an expired resourceVersion (410) and
    /// watchers re-list.
    pub fn with_watch_history(changes: usize) -> FakeApi {
        let (tx, _) = broadcast::channel(BROADCAST_CAPACITY);
        let state = State {
            log_capacity: changes,
            rv: 1,
            seq: 0,
            objects: BTreeMap::new(),
            log: VecDeque::new(),
            log_floor: 1,
            tx,
            writes: Vec::new(),
            requests: Vec::new(),
            methods: BTreeMap::new(),
            labelled: HashMap::new(),
            failures: Vec::new(),
        };
        FakeApi { state: Arc::new(Mutex::new(state)) }
    }

    /// A kube client backed by this fake, with default namespace `default`.
    /// Must be called inside a tokio runtime.
    pub fn client(&self) -> kube::Client {
        kube::Client::new(self.service(), "default")
    }

    pub fn service(&self) -> FakeService {
        FakeService { api: self.clone() }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking test thread must not wedge every other user of the fake.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stores an object directly, as the cluster (nothing is counted). `apiVersion`,
    /// `kind` and `metadata.name` must be set (and `metadata.namespace` for namespaced
    /// kinds). Status and any given `uid` are kept. An existing object is replaced.
    ///
    /// # Panics
    /// If `apiVersion`, `kind` or `metadata.name` is missing.
    pub fn insert(&self, mut obj: Value) -> Value {
        let api_version = str_at(&obj, "/apiVersion").expect("insert: apiVersion is required").to_string();
        let kind = str_at(&obj, "/kind").expect("insert: kind is required").to_string();
        let name = str_at(&obj, "/metadata/name").expect("insert: metadata.name is required").to_string();
        let namespace = str_at(&obj, "/metadata/namespace").map(str::to_string);
        let key = Key { res: Res::of_type(&api_version, &kind), namespace, name };
        let mut state = self.lock();
        match state.objects.get(&key).cloned() {
            Some(old) => {
                let meta = meta_mut(&mut obj);
                for field in ["uid", "creationTimestamp", "generation"] {
                    if !meta.contains_key(field)
                        && let Some(v) = old.obj.pointer(&format!("/metadata/{field}"))
                    {
                        meta.insert(field.into(), v.clone());
                    }
                }
                set_meta(&mut obj, "resourceVersion", json!(rv_of(&old.obj)));
                state.write_object(&key, obj, old.managers).0
            }
            None => {
                state.prepare_new(&mut obj, &key, true);
                state.write_object(&key, obj, Managers::new()).0
            }
        }
    }

    pub fn get(&self, api_version: &str, kind: &str, namespace: Option<&str>, name: &str) -> Option<Value> {
        let key = Key::of_type(api_version, kind, namespace, name);
        self.lock().objects.get(&key).map(|s| s.obj.clone())
    }

    /// Objects of a type, in one namespace or (with `None`) in all of them.
    pub fn list(&self, api_version: &str, kind: &str, namespace: Option<&str>) -> Vec<Value> {
        let res = Res::of_type(api_version, kind);
        self.lock().of_type(&res, namespace).map(|(_, s)| s.obj.clone()).collect()
    }

    /// How many objects of a type (in one namespace, or in all with `None`) satisfy
    /// `pred`; unlike [`Self::list`], clones nothing.
    pub fn count(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        pred: impl Fn(&Value) -> bool,
    ) -> usize {
        let res = Res::of_type(api_version, kind);
        self.lock().of_type(&res, namespace).filter(|(_, s)| pred(&s.obj)).count()
    }

    /// Replaces an object's status as the cluster would (job controller, kubelet):
    /// bumps the resourceVersion and emits MODIFIED unless nothing changed; not
    /// counted as a client write.
    pub fn set_status(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        status: Value,
    ) -> Result<Value, FakeError> {
        self.update_with(api_version, kind, namespace, name, move |obj| {
            if let Some(map) = obj.as_object_mut() {
                map.insert("status".into(), status);
            }
        })
    }

    /// Mutates an object as the cluster (not counted). Anything may change except
    /// the resourceVersion; removing the last finalizer of an object being
    /// deleted removes it.
    pub fn update_with(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        f: impl FnOnce(&mut Value),
    ) -> Result<Value, FakeError> {
        let key = Key::of_type(api_version, kind, namespace, name);
        let mut state = self.lock();
        let old = state.stored(&key)?.clone();
        let mut obj = old.obj.clone();
        f(&mut obj);
        if !obj.is_object() {
            return Err(FakeError::BadRequest("update_with: the object must stay a JSON object".into()));
        }
        set_meta(&mut obj, "resourceVersion", json!(rv_of(&old.obj)));
        let mut managers = old.managers;
        retain_present(&mut managers, &obj);
        Ok(state.write_object(&key, obj, managers).0)
    }

    /// Deletes as the cluster (not counted), with the default propagation policy,
    /// honouring finalizers and cascading to dependents.
    pub fn delete(&self, api_version: &str, kind: &str, namespace: Option<&str>, name: &str) -> Result<(), FakeError> {
        let key = Key::of_type(api_version, kind, namespace, name);
        self.lock().delete(&key, None, &Preconditions::default()).map(|_| ())
    }

    /// Client writes so far that changed something, in order.
    pub fn writes(&self) -> Vec<Write> {
        self.lock().writes.clone()
    }

    pub fn reset_writes(&self) {
        self.lock().writes.clear();
    }

    /// Every request received, as `METHOD /path?query` (query as sent, percent-encoded).
    pub fn requests(&self) -> Vec<String> {
        self.lock().requests.clone()
    }

    /// How many requests were received per HTTP method (`"GET"`, `"PATCH"`, ...), writes
    /// that changed nothing and failed requests included; cheaper than [`Self::requests`].
    pub fn request_counts(&self) -> BTreeMap<String, u64> {
        self.lock().methods.clone()
    }

    /// Makes the next `n` requests whose method matches `method` (case-insensitive;
    /// `""` or `"*"` for any) and whose `/path?query` contains `path_contains`
    /// answer `code` with a `Status` body.
    pub fn fail_next(&self, method: &str, path_contains: &str, code: u16, n: usize) {
        self.lock().failures.push(Failure {
            method: method.to_string(),
            path_contains: path_contains.to_string(),
            code,
            remaining: n,
        });
    }

    /// Serves one request. Everything but the watch stream happens under the lock.
    fn handle(&self, parts: &http::request::Parts, body: &[u8]) -> Response<ResponseBody> {
        let path = parts.uri.path();
        let raw_query = parts.uri.query();
        let line = match raw_query {
            Some(q) => format!("{} {path}?{q}", parts.method),
            None => format!("{} {path}", parts.method),
        };
        let mut state = self.lock();
        state.requests.push(line.clone());
        *state.methods.entry(parts.method.as_str().to_string()).or_default() += 1;
        if let Some(code) = state.take_failure(&parts.method, &line) {
            let err = FakeError::Injected { code };
            return json_response(code, &err.to_status());
        }
        if path == "/version" {
            return json_response(200, &version_info());
        }
        let Some(target) = Target::parse(path) else {
            let err = FakeError::NotFound { resource: String::new(), name: String::new() };
            let mut status = err.to_status();
            if let Some(map) = status.as_object_mut() {
                map.insert("message".into(), json!("the server could not find the requested resource"));
                map.remove("details");
            }
            return json_response(404, &status);
        };
        let req =
            Req { method: &parts.method, path, query: parse_query(raw_query), headers: &parts.headers, body, target };
        let result = if req.method == Method::GET && req.is_watch() {
            state.watch(&req).map(|watch| watch.into_response())
        } else {
            state.serve(&req).map(|(code, obj)| {
                let obj = if req.wants_metadata() { to_partial(&obj) } else { obj };
                json_response(code, &obj)
            })
        };
        drop(state);
        result.unwrap_or_else(|e| json_response(e.code(), &e.to_status()))
    }
}

impl tower::Service<Request<kube::client::Body>> for FakeService {
    type Response = Response<ResponseBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<kube::client::Body>) -> Self::Future {
        let api = self.api.clone();
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            Ok(match body.collect().await {
                Ok(collected) => api.handle(&parts, &collected.to_bytes()),
                Err(e) => {
                    let err = FakeError::BadRequest(format!("reading the request body: {e}"));
                    json_response(400, &err.to_status())
                }
            })
        })
    }
}
