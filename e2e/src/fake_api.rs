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

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::convert::Infallible;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{ACCEPT, CONTENT_TYPE, USER_AGENT};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use json_patch::PatchOperation;
use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

/// Response body of the fake service.
pub type ResponseBody = UnsyncBoxBody<Bytes, Infallible>;

/// Watch events retained for resuming watches by default; older resourceVersions
/// get 410 Expired.
const LOG_CAPACITY: usize = 100_000;
/// Live watch fan-out; a watcher that lags this far behind has its stream ended.
const BROADCAST_CAPACITY: usize = 8192;
/// Watch duration when the client sends no `timeoutSeconds`.
const DEFAULT_WATCH_SECONDS: u64 = 1800;
const FOREGROUND_FINALIZER: &str = "foregroundDeletion";
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// Plurals whose kind is needed before any object of theirs exists (empty lists,
/// bookmarks), and kinds whose plural is not the naive lowercase + "s".
const KNOWN_KINDS: &[(&str, &str)] = &[
    ("pods", "Pod"),
    ("jobs", "Job"),
    ("services", "Service"),
    ("configmaps", "ConfigMap"),
    ("persistentvolumeclaims", "PersistentVolumeClaim"),
    ("persistentvolumes", "PersistentVolume"),
    ("events", "Event"),
    ("leases", "Lease"),
    ("trainingruns", "TrainingRun"),
    ("customresourcedefinitions", "CustomResourceDefinition"),
    ("secrets", "Secret"),
    ("nodes", "Node"),
    ("namespaces", "Namespace"),
    ("networkpolicies", "NetworkPolicy"),
    ("endpoints", "Endpoints"),
    ("serviceaccounts", "ServiceAccount"),
    ("deployments", "Deployment"),
    ("statefulsets", "StatefulSet"),
    ("priorityclasses", "PriorityClass"),
];

/// An error of the fake, as the API server would report it (see [`FakeError::to_status`]).
#[derive(Clone, Debug, thiserror::Error)]
pub enum FakeError {
    #[error("{resource} \"{name}\" not found")]
    NotFound { resource: String, name: String },
    #[error("{resource} \"{name}\" already exists")]
    AlreadyExists { resource: String, name: String },
    #[error("{message}")]
    Conflict { resource: String, name: String, message: String, causes: Vec<Value> },
    #[error("{0}")]
    BadRequest(String),
    #[error("{resource} \"{name}\" is invalid: {message}")]
    Invalid { resource: String, name: String, message: String },
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("{0}")]
    MethodNotAllowed(String),
    #[error("{0}")]
    Expired(String),
    #[error("injected failure ({code})")]
    Injected { code: u16 },
}

impl FakeError {
    /// The HTTP status code.
    pub fn code(&self) -> u16 {
        match self {
            FakeError::NotFound { .. } => 404,
            FakeError::AlreadyExists { .. } | FakeError::Conflict { .. } => 409,
            FakeError::BadRequest(_) => 400,
            FakeError::Invalid { .. } => 422,
            FakeError::UnsupportedMediaType(_) => 415,
            FakeError::MethodNotAllowed(_) => 405,
            FakeError::Expired(_) => 410,
            FakeError::Injected { code } => *code,
        }
    }

    /// The `Status.reason`.
    pub fn reason(&self) -> &'static str {
        match self {
            FakeError::AlreadyExists { .. } => "AlreadyExists",
            e => reason_for_code(e.code()),
        }
    }

    /// The `meta/v1` `Status` body the API server would answer with.
    pub fn to_status(&self) -> Value {
        let details = match self {
            FakeError::NotFound { resource, name }
            | FakeError::AlreadyExists { resource, name }
            | FakeError::Invalid { resource, name, .. } => Some(details(resource, name, &[])),
            FakeError::Conflict { resource, name, causes, .. } => Some(details(resource, name, causes)),
            _ => None,
        };
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.to_string(),
            "reason": self.reason(),
            "code": self.code(),
        });
        if let (Some(d), Some(map)) = (details, status.as_object_mut()) {
            map.insert("details".into(), d);
        }
        status
    }
}

/// `details` of a Status; `resource` is `plural[.group]`.
fn details(resource: &str, name: &str, causes: &[Value]) -> Value {
    let (kind, group) = resource.split_once('.').unwrap_or((resource, ""));
    let mut d = json!({"name": name, "kind": kind});
    if let Some(map) = d.as_object_mut() {
        if !group.is_empty() {
            map.insert("group".into(), json!(group));
        }
        if !causes.is_empty() {
            map.insert("causes".into(), Value::Array(causes.to_vec()));
        }
    }
    d
}

fn reason_for_code(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        410 => "Expired",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    }
}

/// A client write that changed something.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Write {
    /// `create`, `update`, `patch`, `apply` or `delete`.
    pub verb: String,
    /// The request path, without the query.
    pub path: String,
    pub kind: String,
    pub name: String,
    pub subresource: Option<String>,
}

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
        self.lock()
            .objects
            .iter()
            .filter(|(k, _)| k.res == res && (namespace.is_none() || k.namespace.as_deref() == namespace))
            .map(|(_, s)| s.obj.clone())
            .collect()
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

// ---------------------------------------------------------------------------
// Resources, keys and URL layout

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Res {
    group: String,
    version: String,
    plural: String,
}

impl Res {
    fn of_type(api_version: &str, kind: &str) -> Res {
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        Res { group: group.to_string(), version: version.to_string(), plural: plural_of(kind) }
    }

    fn api_version(&self) -> String {
        if self.group.is_empty() { self.version.clone() } else { format!("{}/{}", self.group, self.version) }
    }

    /// `plural[.group]`, as Status messages name resources.
    fn qualified(&self) -> String {
        if self.group.is_empty() { self.plural.clone() } else { format!("{}.{}", self.plural, self.group) }
    }

    /// Custom resources answer a completed DELETE with the object, built-ins with a Status.
    fn is_builtin(&self) -> bool {
        self.group.is_empty() || !self.group.contains('.') || self.group.ends_with(".k8s.io")
    }

    fn default_propagation(&self) -> Propagation {
        // batch/v1 Jobs orphan their pods unless told otherwise (legacy default).
        if self.group == "batch" && self.plural == "jobs" { Propagation::Orphan } else { Propagation::Background }
    }
}

fn plural_of(kind: &str) -> String {
    if let Some((plural, _)) = KNOWN_KINDS.iter().find(|(_, k)| *k == kind) {
        return plural.to_string();
    }
    let lower = kind.to_ascii_lowercase();
    if lower.ends_with('s') || lower.ends_with('x') || lower.ends_with("ch") || lower.ends_with("sh") {
        format!("{lower}es")
    } else if lower.ends_with('y') && !lower.ends_with("ey") && !lower.ends_with("ay") && !lower.ends_with("oy") {
        format!("{}ies", &lower[..lower.len() - 1])
    } else {
        format!("{lower}s")
    }
}

fn kind_of_plural(plural: &str) -> String {
    if let Some((_, kind)) = KNOWN_KINDS.iter().find(|(p, _)| *p == plural) {
        return kind.to_string();
    }
    let singular = plural.strip_suffix('s').unwrap_or(plural);
    let mut chars = singular.chars();
    chars.next().map(|c| c.to_ascii_uppercase().to_string() + chars.as_str()).unwrap_or_default()
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Key {
    res: Res,
    namespace: Option<String>,
    name: String,
}

impl Key {
    fn of_type(api_version: &str, kind: &str, namespace: Option<&str>, name: &str) -> Key {
        Key { res: Res::of_type(api_version, kind), namespace: namespace.map(str::to_string), name: name.to_string() }
    }
}

/// What a request path addresses.
#[derive(Clone, Debug)]
struct Target {
    res: Res,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

impl Target {
    /// `/api/v1/...` or `/apis/{group}/{version}/...`, then
    /// `namespaces/{ns}/{plural}[/{name}[/{sub}]]` or `{plural}[/{name}[/{sub}]]`.
    fn parse(path: &str) -> Option<Target> {
        let segs: Vec<&str> = path.trim_matches('/').split('/').filter(|s| !s.is_empty()).collect();
        let (group, version, rest) = match segs.as_slice() {
            ["api", version, rest @ ..] => ("", *version, rest),
            ["apis", group, version, rest @ ..] => (*group, *version, rest),
            _ => return None,
        };
        let (namespace, rest) = match rest {
            ["namespaces", ns, plural, tail @ ..] if !matches!(*plural, "status" | "finalize") => {
                (Some(ns.to_string()), std::iter::once(plural).chain(tail.iter()).copied().collect::<Vec<_>>())
            }
            _ => (None, rest.to_vec()),
        };
        let (plural, name, subresource) = match rest.as_slice() {
            [plural] => (*plural, None, None),
            [plural, name] => (*plural, Some(name.to_string()), None),
            [plural, name, sub] => (*plural, Some(name.to_string()), Some(sub.to_string())),
            _ => return None,
        };
        let res = Res { group: group.to_string(), version: version.to_string(), plural: plural.to_string() };
        Some(Target { res, namespace, name, subresource })
    }

    fn key(&self, name: &str) -> Key {
        Key { res: self.res.clone(), namespace: self.namespace.clone(), name: name.to_string() }
    }
}

struct Req<'a> {
    method: &'a Method,
    path: &'a str,
    query: BTreeMap<String, String>,
    headers: &'a HeaderMap,
    body: &'a [u8],
    target: Target,
}

impl Req<'_> {
    fn q(&self, name: &str) -> Option<&str> {
        self.query.get(name).map(String::as_str).filter(|v| !v.is_empty())
    }

    fn flag(&self, name: &str) -> bool {
        matches!(self.q(name), Some("true" | "1"))
    }

    fn is_watch(&self) -> bool {
        self.flag("watch")
    }

    fn wants_metadata(&self) -> bool {
        header(self.headers, ACCEPT).is_some_and(|a| a.contains("as=PartialObjectMetadata"))
    }

    /// Field manager of a non-apply write: the query parameter, else the user
    /// agent's product name, as the real server does.
    fn manager(&self) -> String {
        if let Some(m) = self.q("fieldManager") {
            return m.to_string();
        }
        header(self.headers, USER_AGENT)
            .and_then(|ua| ua.split('/').next())
            .filter(|s| !s.is_empty())
            .unwrap_or("unknown")
            .to_string()
    }

    fn write(&self, verb: &str, key: &Key, kind: &str) -> Write {
        Write {
            verb: verb.to_string(),
            path: self.path.to_string(),
            kind: kind.to_string(),
            name: key.name.clone(),
            subresource: self.target.subresource.clone(),
        }
    }
}

fn header(headers: &HeaderMap, name: http::header::HeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn parse_query(query: Option<&str>) -> BTreeMap<String, String> {
    query
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match std::str::from_utf8(&bytes[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

// ---------------------------------------------------------------------------
// The store

/// Who owns which fields, keyed by manager, operation and subresource.
type Managers = BTreeMap<ManagerKey, Owned>;
/// A field: the keys from the object root to a leaf (lists are leaves).
type FieldPath = Vec<String>;

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct ManagerKey {
    manager: String,
    apply: bool,
    subresource: Option<String>,
}

#[derive(Clone, Debug)]
struct Owned {
    paths: BTreeSet<FieldPath>,
    time: String,
    api_version: String,
}

#[derive(Clone, Debug)]
struct Stored {
    obj: Value,
    managers: Managers,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

/// One stored change, replayed to watchers that resume from an older resourceVersion.
#[derive(Debug)]
struct Change {
    rv: u64,
    kind: ChangeKind,
    key: Key,
    obj: Value,
    /// The object before the change, so label-filtered watches see objects enter and leave.
    old: Option<Value>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Unchanged,
    Created,
    Modified,
    Removed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Propagation {
    Orphan,
    Background,
    Foreground,
}

#[derive(Default)]
struct Preconditions {
    uid: Option<String>,
    resource_version: Option<String>,
}

struct Failure {
    method: String,
    path_contains: String,
    code: u16,
    remaining: usize,
}

struct State {
    /// The last resourceVersion handed out.
    rv: u64,
    /// Counter for uids and generated names.
    seq: u64,
    objects: BTreeMap<Key, Stored>,
    log: VecDeque<Arc<Change>>,
    log_capacity: usize,
    /// Every change with a resourceVersion above this is still in `log`.
    log_floor: u64,
    tx: broadcast::Sender<Arc<Change>>,
    writes: Vec<Write>,
    requests: Vec<String>,
    failures: Vec<Failure>,
}

impl State {
    fn take_failure(&mut self, method: &Method, line: &str) -> Option<u16> {
        let f = self.failures.iter_mut().find(|f| {
            f.remaining > 0
                && (f.method.is_empty() || f.method == "*" || f.method.eq_ignore_ascii_case(method.as_str()))
                && line.contains(&f.path_contains)
        })?;
        f.remaining -= 1;
        let code = f.code;
        self.failures.retain(|f| f.remaining > 0);
        Some(code)
    }

    fn stored(&self, key: &Key) -> Result<&Stored, FakeError> {
        self.objects.get(key).ok_or_else(|| not_found(key))
    }

    fn kind_for(&self, res: &Res) -> String {
        self.objects
            .iter()
            .find(|(k, _)| &k.res == res)
            .and_then(|(_, s)| str_at(&s.obj, "/kind"))
            .map(str::to_string)
            .unwrap_or_else(|| kind_of_plural(&res.plural))
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Fills in what the server sets on create. With `keep_given`, an existing
    /// uid, creationTimestamp and status survive (for [`FakeApi::insert`]).
    fn prepare_new(&mut self, obj: &mut Value, key: &Key, keep_given: bool) {
        let seq = self.next_seq();
        let map = as_map(obj);
        map.entry("apiVersion").or_insert_with(|| json!(key.res.api_version()));
        if !map.get("kind").is_some_and(Value::is_string) {
            map.insert("kind".into(), json!(self.kind_for(&key.res)));
        }
        if !keep_given {
            map.remove("status");
        }
        let meta = meta_mut(obj);
        meta.insert("name".into(), json!(key.name));
        match &key.namespace {
            Some(ns) => meta.insert("namespace".into(), json!(ns)),
            None => meta.remove("namespace"),
        };
        for field in ["resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "managedFields", "selfLink"]
        {
            meta.remove(field);
        }
        if !keep_given || !meta.get("uid").is_some_and(Value::is_string) {
            meta.insert("uid".into(), json!(format!("00000000-fake-4000-8000-{seq:012x}")));
        }
        if !keep_given || !meta.contains_key("creationTimestamp") {
            meta.insert("creationTimestamp".into(), json!(now()));
        }
        if !keep_given || !meta.contains_key("generation") {
            meta.insert("generation".into(), json!(1));
        }
    }

    /// Stores `new` at `key`: creates, modifies, or (an object being deleted whose
    /// last finalizer went) removes it. A change that alters nothing but field
    /// ownership keeps the resourceVersion and emits nothing.
    fn write_object(&mut self, key: &Key, mut new: Value, managers: Managers) -> (Value, Outcome) {
        render_managed_fields(&mut new, &managers);
        let Some(old) = self.objects.get(key).cloned() else {
            self.rv += 1;
            set_meta(&mut new, "resourceVersion", json!(self.rv.to_string()));
            self.objects.insert(key.clone(), Stored { obj: new.clone(), managers });
            self.emit(ChangeKind::Added, key, new.clone(), None);
            return (new, Outcome::Created);
        };
        if comparable(&old.obj) == comparable(&new) {
            let stored = Stored { obj: new, managers };
            let obj = stored.obj.clone();
            self.objects.insert(key.clone(), stored);
            return (obj, Outcome::Unchanged);
        }
        if new.pointer("/metadata/deletionTimestamp").is_some() && finalizers(&new).is_empty() {
            self.objects.insert(key.clone(), Stored { obj: new, managers });
            let removed = self.remove(key).unwrap_or_default();
            return (removed, Outcome::Removed);
        }
        if without_meta_and_status(&old.obj) != without_meta_and_status(&new) {
            let generation = old.obj.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(0);
            set_meta(&mut new, "generation", json!(generation + 1));
        }
        self.rv += 1;
        set_meta(&mut new, "resourceVersion", json!(self.rv.to_string()));
        self.objects.insert(key.clone(), Stored { obj: new.clone(), managers });
        self.emit(ChangeKind::Modified, key, new.clone(), Some(old.obj));
        (new, Outcome::Modified)
    }

    /// Removes an object now, then garbage-collects its dependents and lets
    /// foreground-deleting owners waiting on it finish.
    fn remove(&mut self, key: &Key) -> Option<Value> {
        let stored = self.objects.remove(key)?;
        let old = stored.obj;
        let mut obj = old.clone();
        self.rv += 1;
        set_meta(&mut obj, "resourceVersion", json!(self.rv.to_string()));
        self.emit(ChangeKind::Deleted, key, obj.clone(), Some(old));
        if let Some(uid) = str_at(&obj, "/metadata/uid") {
            for dependent in self.dependents(uid) {
                // Already-terminating or vanished dependents are fine.
                let _ = self.delete(&dependent, Some(Propagation::Background), &Preconditions::default());
            }
        }
        let owner_uids: Vec<String> =
            owner_refs(&obj).iter().filter_map(|r| str_at(r, "/uid")).map(str::to_string).collect();
        for uid in owner_uids {
            if let Some(owner) = self.key_of_uid(&uid) {
                self.finish_foreground(&owner);
            }
        }
        Some(obj)
    }

    fn dependents(&self, uid: &str) -> Vec<Key> {
        self.objects
            .iter()
            .filter(|(_, s)| owner_refs(&s.obj).iter().any(|r| str_at(r, "/uid") == Some(uid)))
            .map(|(k, _)| k.clone())
            .collect()
    }

    fn key_of_uid(&self, uid: &str) -> Option<Key> {
        self.objects.iter().find(|(_, s)| str_at(&s.obj, "/metadata/uid") == Some(uid)).map(|(k, _)| k.clone())
    }

    /// Deletes an object: marks it (finalizers) or removes it, after applying the
    /// propagation policy to its dependents.
    fn delete(
        &mut self,
        key: &Key,
        policy: Option<Propagation>,
        pre: &Preconditions,
    ) -> Result<(Value, Outcome), FakeError> {
        let stored = self.stored(key)?.clone();
        let uid = str_at(&stored.obj, "/metadata/uid").unwrap_or_default().to_string();
        if let Some(want) = &pre.uid
            && *want != uid
        {
            return Err(conflict(
                key,
                format!("Precondition failed: UID in precondition: {want}, UID in object meta: {uid}"),
            ));
        }
        if let Some(want) = &pre.resource_version {
            let have = rv_of(&stored.obj);
            if *want != have {
                return Err(conflict(
                    key,
                    format!(
                        "Precondition failed: ResourceVersion in precondition: {want}, ResourceVersion in object meta: {have}"
                    ),
                ));
            }
        }
        let policy = policy.unwrap_or_else(|| key.res.default_propagation());
        if policy == Propagation::Orphan {
            self.orphan_dependents(&uid);
        }
        let dependents = self.dependents(&uid);
        let mut obj = stored.obj.clone();
        let marked = obj.pointer("/metadata/deletionTimestamp").is_some();
        if policy == Propagation::Foreground && !dependents.is_empty() {
            let mut fins = finalizers(&obj);
            if !fins.iter().any(|f| f == FOREGROUND_FINALIZER) {
                fins.push(FOREGROUND_FINALIZER.to_string());
            }
            set_meta(&mut obj, "finalizers", json!(fins));
            mark_deleting(&mut obj);
            let (_, first) = self.write_object(key, obj, stored.managers);
            for dependent in dependents {
                let _ = self.delete(&dependent, Some(Propagation::Foreground), &Preconditions::default());
            }
            self.finish_foreground(key);
            return Ok(match self.objects.get(key) {
                Some(s) => {
                    (s.obj.clone(), if first == Outcome::Unchanged { Outcome::Unchanged } else { Outcome::Modified })
                }
                None => (stored.obj, Outcome::Removed),
            });
        }
        if finalizers(&obj).is_empty() {
            let removed = self.remove(key).unwrap_or_default();
            return Ok((removed, Outcome::Removed));
        }
        if marked {
            return Ok((obj, Outcome::Unchanged));
        }
        mark_deleting(&mut obj);
        Ok(self.write_object(key, obj, stored.managers))
    }

    /// Orphan propagation: dependents lose their owner reference to `uid`.
    fn orphan_dependents(&mut self, uid: &str) {
        for dependent in self.dependents(uid) {
            let Some(stored) = self.objects.get(&dependent).cloned() else {
                continue;
            };
            let mut obj = stored.obj;
            let refs: Vec<Value> = owner_refs(&obj).into_iter().filter(|r| str_at(r, "/uid") != Some(uid)).collect();
            let meta = meta_mut(&mut obj);
            if refs.is_empty() {
                meta.remove("ownerReferences");
            } else {
                meta.insert("ownerReferences".into(), Value::Array(refs));
            }
            let mut managers = stored.managers;
            retain_present(&mut managers, &obj);
            self.write_object(&dependent, obj, managers);
        }
    }

    /// Drops the `foregroundDeletion` finalizer once no dependent with
    /// `blockOwnerDeletion` remains.
    fn finish_foreground(&mut self, key: &Key) {
        let Some(stored) = self.objects.get(key).cloned() else {
            return;
        };
        let fins = finalizers(&stored.obj);
        if !fins.iter().any(|f| f == FOREGROUND_FINALIZER) {
            return;
        }
        let uid = str_at(&stored.obj, "/metadata/uid").unwrap_or_default();
        let blocked = self.objects.values().any(|s| {
            owner_refs(&s.obj).iter().any(|r| {
                str_at(r, "/uid") == Some(uid) && r.get("blockOwnerDeletion").and_then(Value::as_bool) == Some(true)
            })
        });
        if blocked {
            return;
        }
        let mut obj = stored.obj.clone();
        let rest: Vec<String> = fins.into_iter().filter(|f| f != FOREGROUND_FINALIZER).collect();
        set_meta(&mut obj, "finalizers", json!(rest));
        let mut managers = stored.managers;
        retain_present(&mut managers, &obj);
        self.write_object(key, obj, managers);
    }

    fn emit(&mut self, kind: ChangeKind, key: &Key, obj: Value, old: Option<Value>) {
        let change = Arc::new(Change { rv: self.rv, kind, key: key.clone(), obj, old });
        self.log.push_back(change.clone());
        while self.log.len() > self.log_capacity {
            if let Some(dropped) = self.log.pop_front() {
                self.log_floor = dropped.rv;
            }
        }
        // No receivers is fine.
        let _ = self.tx.send(change);
    }

    // -----------------------------------------------------------------------
    // Request handlers. Each returns the HTTP code and body.

    fn serve(&mut self, req: &Req) -> Result<(u16, Value), FakeError> {
        let t = &req.target;
        match t.subresource.as_deref() {
            None | Some("status") => {}
            Some(other) => {
                return Err(FakeError::NotFound {
                    resource: format!("{}/{other}", t.res.qualified()),
                    name: t.name.clone().unwrap_or_default(),
                });
            }
        }
        match (req.method.clone(), t.name.clone()) {
            (Method::GET, Some(name)) => Ok((200, self.stored(&t.key(&name))?.obj.clone())),
            (Method::GET, None) => self.list_response(req),
            (Method::POST, None) => self.create(req),
            (Method::PUT, Some(name)) => self.replace(req, &name),
            (Method::PATCH, Some(name)) => self.patch(req, &name),
            (Method::DELETE, Some(name)) => self.delete_one(req, &name),
            (Method::DELETE, None) => self.delete_collection(req),
            (m, _) => Err(FakeError::MethodNotAllowed(format!("{m} is not supported on {}", req.path))),
        }
    }

    /// Objects a list or watch request selects, in key order.
    fn selected(&self, filter: &Filter) -> Vec<(Key, Value)> {
        self.objects
            .iter()
            .filter(|(k, s)| filter.matches(k, &s.obj))
            .map(|(k, s)| (k.clone(), s.obj.clone()))
            .collect()
    }

    fn list_response(&self, req: &Req) -> Result<(u16, Value), FakeError> {
        let filter = Filter::new(&req.target, req)?;
        let items: Vec<Value> = self.selected(&filter).into_iter().map(|(_, obj)| obj).collect();
        let res = &req.target.res;
        let list = json!({
            "kind": format!("{}List", self.kind_for(res)),
            "apiVersion": res.api_version(),
            "metadata": {"resourceVersion": self.rv.to_string()},
            "items": items,
        });
        Ok((200, list))
    }

    fn create(&mut self, req: &Req) -> Result<(u16, Value), FakeError> {
        let t = &req.target;
        let mut obj = parse_object(req.body)?;
        if let Some(ns) = str_at(&obj, "/metadata/namespace")
            && !ns.is_empty()
            && Some(ns) != t.namespace.as_deref()
        {
            return Err(FakeError::BadRequest(
                "the namespace of the provided object does not match the namespace sent on the request".into(),
            ));
        }
        let name = match str_at(&obj, "/metadata/name").filter(|n| !n.is_empty()) {
            Some(name) => name.to_string(),
            None => {
                let prefix = str_at(&obj, "/metadata/generateName").filter(|g| !g.is_empty()).ok_or_else(|| {
                    FakeError::Invalid {
                        resource: t.res.qualified(),
                        name: String::new(),
                        message: "metadata.name: Required value: name or generateName is required".into(),
                    }
                })?;
                let prefix = prefix.to_string();
                loop {
                    let seq = self.next_seq();
                    let candidate = format!("{prefix}{}", random_suffix(seq));
                    if !self.objects.contains_key(&t.key(&candidate)) {
                        break candidate;
                    }
                }
            }
        };
        let key = t.key(&name);
        if self.objects.contains_key(&key) {
            return Err(FakeError::AlreadyExists { resource: t.res.qualified(), name });
        }
        self.prepare_new(&mut obj, &key, false);
        let mut managers = Managers::new();
        track_update(&mut managers, None, &obj, &req.manager(), None);
        let (obj, _) = self.write_object(&key, obj, managers);
        let write = req.write("create", &key, &kind_str(&obj));
        self.writes.push(write);
        Ok((201, obj))
    }

    fn replace(&mut self, req: &Req, name: &str) -> Result<(u16, Value), FakeError> {
        let key = req.target.key(name);
        let stored = self.stored(&key)?.clone();
        let body = parse_object(req.body)?;
        check_name(&body, name)?;
        check_rv(&key, &stored.obj, &body)?;
        let sub = req.target.subresource.as_deref();
        let new = merge_endpoint(&stored.obj, body, sub);
        self.commit_update(req, &key, stored, new, "update")
    }

    fn patch(&mut self, req: &Req, name: &str) -> Result<(u16, Value), FakeError> {
        let content_type = header(req.headers, CONTENT_TYPE).unwrap_or("");
        let media = content_type.split(';').next().unwrap_or("").trim();
        if media == "application/apply-patch+yaml" {
            return self.apply(req, name);
        }
        let key = req.target.key(name);
        let stored = self.stored(&key)?.clone();
        let mut doc = stored.obj.clone();
        match media {
            "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
                let patch: Value = serde_json::from_slice(req.body)
                    .map_err(|e| FakeError::BadRequest(format!("invalid merge patch: {e}")))?;
                json_patch::merge(&mut doc, &patch);
            }
            "application/json-patch+json" => {
                let patch: json_patch::Patch = serde_json::from_slice(req.body)
                    .map_err(|e| FakeError::BadRequest(format!("invalid JSON patch: {e}")))?;
                for op in &patch.0 {
                    // The real server treats `test` of null as true for a missing path.
                    if let PatchOperation::Test(test) = op
                        && test.value.is_null()
                        && doc.pointer(test.path.as_str()).is_none()
                    {
                        continue;
                    }
                    json_patch::patch(&mut doc, std::slice::from_ref(op)).map_err(|e| FakeError::Invalid {
                        resource: key.res.qualified(),
                        name: name.to_string(),
                        message: format!("the JSON patch failed: {e}"),
                    })?;
                }
            }
            other => {
                return Err(FakeError::UnsupportedMediaType(format!(
                    "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {other:?})"
                )));
            }
        }
        if !doc.is_object() || doc.get("metadata").is_some_and(|m| !m.is_object()) {
            return Err(invalid(&key, "the patched object is not a valid object"));
        }
        check_rv(&key, &stored.obj, &doc)?;
        let sub = req.target.subresource.as_deref();
        let new = merge_endpoint(&stored.obj, doc, sub);
        self.commit_update(req, &key, stored, new, "patch")
    }

    /// The common tail of PUT and non-apply PATCH.
    fn commit_update(
        &mut self,
        req: &Req,
        key: &Key,
        stored: Stored,
        new: Value,
        verb: &str,
    ) -> Result<(u16, Value), FakeError> {
        check_finalizers(key, &stored.obj, &new)?;
        let mut managers = stored.managers;
        track_update(&mut managers, Some(&stored.obj), &new, &req.manager(), req.target.subresource.as_deref());
        retain_present(&mut managers, &new);
        let (obj, outcome) = self.write_object(key, new, managers);
        if outcome != Outcome::Unchanged {
            let write = req.write(verb, key, &kind_str(&obj));
            self.writes.push(write);
        }
        Ok((200, obj))
    }

    /// Server-side apply.
    fn apply(&mut self, req: &Req, name: &str) -> Result<(u16, Value), FakeError> {
        let t = &req.target;
        let key = t.key(name);
        let manager = req
            .q("fieldManager")
            .map(str::to_string)
            .ok_or_else(|| invalid(&key, "fieldManager: Required value: is required for apply patch"))?;
        let force = req.flag("force");
        let applied: Value = serde_json::from_slice(req.body).map_err(|e| {
            FakeError::BadRequest(format!("apply patch must be JSON (the fake does not parse YAML): {e}"))
        })?;
        if !applied.is_object() || applied.get("metadata").is_some_and(|m| !m.is_object()) {
            return Err(FakeError::BadRequest("apply patch must be an object".into()));
        }
        check_name(&applied, name)?;
        let existing = self.objects.get(&key).cloned();
        if let Some(want) = str_at(&applied, "/metadata/resourceVersion").filter(|rv| !rv.is_empty()) {
            let have = existing.as_ref().map(|s| rv_of(&s.obj)).unwrap_or_default();
            if want != have {
                return Err(stale(&key));
            }
        }
        let sub = t.subresource.as_deref();
        if sub.is_some() && existing.is_none() {
            return Err(not_found(&key));
        }
        let scope = Scope::of(sub);
        let filtered = scope.filter(&applied);
        let applied_paths: BTreeSet<FieldPath> =
            leaves(&filtered, scope).into_iter().filter(|(_, v)| !v.is_null()).map(|(p, _)| p).collect();
        let (mut base, mut managers) = match &existing {
            Some(s) => (s.obj.clone(), s.managers.clone()),
            None => (json!({"metadata": {}}), Managers::new()),
        };
        let me = ManagerKey { manager: manager.clone(), apply: true, subresource: sub.map(str::to_string) };

        // Conflicts: another manager owns a field this apply sets to a different value.
        let mut conflicts: Vec<(String, FieldPath)> = Vec::new();
        for (mk, owned) in &managers {
            if mk.manager == manager {
                continue;
            }
            for a in &applied_paths {
                // Owning a map that contains the field is not owning the field.
                let contested = owned.paths.iter().any(|p| p.starts_with(a));
                if contested && value_at(&base, a) != value_at(&filtered, a) {
                    conflicts.push((mk.manager.clone(), a.clone()));
                }
            }
        }
        if !conflicts.is_empty() {
            if !force {
                return Err(apply_conflict(&key, &conflicts, &t.res.api_version()));
            }
            for (mk, owned) in managers.iter_mut() {
                if mk.manager != manager {
                    owned.paths.retain(|p| !conflicts.iter().any(|(_, c)| p.starts_with(c)));
                }
            }
        }

        // Fields this manager applied last time and omits now go, unless someone else owns them.
        if let Some(previous) = managers.get(&me) {
            for p in &previous.paths {
                let shared = managers.iter().any(|(mk, o)| *mk != me && o.paths.iter().any(|q| q.starts_with(p)));
                if !applied_paths.contains(p) && !shared {
                    remove_path(&mut base, p);
                }
            }
        }
        json_patch::merge(&mut base, &filtered);
        let api_version = str_at(&applied, "/apiVersion").map(str::to_string).unwrap_or_else(|| t.res.api_version());
        managers.insert(me, Owned { paths: applied_paths, time: now(), api_version });

        let (new, created) = match &existing {
            Some(s) => (merge_endpoint(&s.obj, base, sub), false),
            None => {
                self.prepare_new(&mut base, &key, false);
                (base, true)
            }
        };
        if let Some(s) = &existing {
            check_finalizers(&key, &s.obj, &new)?;
        }
        retain_present(&mut managers, &new);
        let (obj, outcome) = self.write_object(&key, new, managers);
        if outcome != Outcome::Unchanged {
            let write = req.write("apply", &key, &kind_str(&obj));
            self.writes.push(write);
        }
        Ok((if created { 201 } else { 200 }, obj))
    }

    fn delete_options(req: &Req) -> Result<(Option<Propagation>, Preconditions), FakeError> {
        let body: Value = if req.body.iter().all(u8::is_ascii_whitespace) {
            json!({})
        } else {
            serde_json::from_slice(req.body)
                .map_err(|e| FakeError::BadRequest(format!("invalid DeleteOptions: {e}")))?
        };
        let policy_name = req
            .q("propagationPolicy")
            .map(str::to_string)
            .or_else(|| str_at(&body, "/propagationPolicy").map(str::to_string))
            .or_else(|| match body.get("orphanDependents").and_then(Value::as_bool) {
                Some(true) => Some("Orphan".into()),
                Some(false) => Some("Background".into()),
                None => None,
            });
        let policy = match policy_name.as_deref() {
            None => None,
            Some("Orphan") => Some(Propagation::Orphan),
            Some("Background") => Some(Propagation::Background),
            Some("Foreground") => Some(Propagation::Foreground),
            Some(other) => {
                return Err(FakeError::BadRequest(format!("unknown propagationPolicy {other:?}")));
            }
        };
        let pre = Preconditions {
            uid: str_at(&body, "/preconditions/uid").map(str::to_string),
            resource_version: str_at(&body, "/preconditions/resourceVersion").map(str::to_string),
        };
        Ok((policy, pre))
    }

    fn delete_one(&mut self, req: &Req, name: &str) -> Result<(u16, Value), FakeError> {
        let key = req.target.key(name);
        let (policy, pre) = Self::delete_options(req)?;
        let (obj, outcome) = self.delete(&key, policy, &pre)?;
        if outcome != Outcome::Unchanged {
            let write = req.write("delete", &key, &kind_str(&obj));
            self.writes.push(write);
        }
        if outcome != Outcome::Removed || !key.res.is_builtin() {
            return Ok((200, obj));
        }
        let mut d = details(&key.res.qualified(), name, &[]);
        if let (Some(map), Some(uid)) = (d.as_object_mut(), str_at(&obj, "/metadata/uid")) {
            map.insert("uid".into(), json!(uid));
        }
        Ok((200, json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": d})))
    }

    fn delete_collection(&mut self, req: &Req) -> Result<(u16, Value), FakeError> {
        let filter = Filter::new(&req.target, req)?;
        let (policy, pre) = Self::delete_options(req)?;
        let mut items = Vec::new();
        for (key, _) in self.selected(&filter) {
            // An earlier deletion may have cascaded to this one.
            if !self.objects.contains_key(&key) {
                continue;
            }
            let (obj, outcome) = self.delete(&key, policy, &pre)?;
            if outcome != Outcome::Unchanged {
                let write = req.write("delete", &key, &kind_str(&obj));
                self.writes.push(write);
            }
            items.push(obj);
        }
        let res = &req.target.res;
        let list = json!({
            "kind": format!("{}List", self.kind_for(res)),
            "apiVersion": res.api_version(),
            "metadata": {"resourceVersion": self.rv.to_string()},
            "items": items,
        });
        Ok((200, list))
    }

    // -----------------------------------------------------------------------
    // Watch

    fn watch(&self, req: &Req) -> Result<Watch, FakeError> {
        let filter = Filter::new(&req.target, req)?;
        let timeout = req.q("timeoutSeconds").and_then(|s| s.parse::<u64>().ok()).unwrap_or(DEFAULT_WATCH_SECONDS);
        let send_initial = req.flag("sendInitialEvents");
        let rx = self.tx.subscribe();
        let mut lines = VecDeque::new();
        let mut expired = false;
        let as_meta = req.wants_metadata();
        // Without a resourceVersion (or with "0") a watch starts with the current state.
        match req.q("resourceVersion").filter(|rv| *rv != "0" && !send_initial) {
            None => {
                for (_, obj) in self.selected(&filter) {
                    lines.push_back(event_line("ADDED", &obj, as_meta));
                }
                if send_initial {
                    let bookmark = json!({
                        "kind": self.kind_for(&filter.res),
                        "apiVersion": filter.res.api_version(),
                        "metadata": {
                            "resourceVersion": self.rv.to_string(),
                            "annotations": {INITIAL_EVENTS_END: "true"},
                        },
                    });
                    lines.push_back(event_line("BOOKMARK", &bookmark, false));
                }
            }
            Some(rv) => {
                let from: u64 =
                    rv.parse().map_err(|_| FakeError::BadRequest(format!("invalid resourceVersion {rv:?}")))?;
                if from < self.log_floor {
                    // In-stream 410, so kube's watcher re-lists instead of retrying the same version.
                    let gone = FakeError::Expired(format!("too old resource version: {from} ({})", self.log_floor));
                    lines.push_back(event_line("ERROR", &gone.to_status(), false));
                    expired = true;
                } else {
                    for change in self.log.iter().filter(|c| c.rv > from) {
                        if let Some((ty, obj)) = filter.event(change) {
                            lines.push_back(event_line(ty, obj, as_meta));
                        }
                    }
                }
            }
        }
        Ok(Watch {
            lines,
            rx,
            last_rv: self.rv,
            deadline: tokio::time::Instant::now() + std::time::Duration::from_secs(timeout),
            filter,
            as_meta,
            done: expired,
        })
    }
}

// ---------------------------------------------------------------------------
// Watch streams

struct Watch {
    /// Events to send before live ones.
    lines: VecDeque<Bytes>,
    rx: broadcast::Receiver<Arc<Change>>,
    /// Changes up to this resourceVersion were covered by `lines`.
    last_rv: u64,
    deadline: tokio::time::Instant,
    filter: Filter,
    as_meta: bool,
    /// End after `lines` (expired resourceVersion).
    done: bool,
}

impl Watch {
    async fn next_line(&mut self) -> Option<Bytes> {
        if let Some(line) = self.lines.pop_front() {
            return Some(line);
        }
        // The server closes the stream at the deadline, whatever is pending.
        if self.done || tokio::time::Instant::now() >= self.deadline {
            return None;
        }
        loop {
            match tokio::time::timeout_at(self.deadline, self.rx.recv()).await {
                // timeoutSeconds elapsed, the fake was dropped, or this watcher lagged:
                // end the stream and let the client resume or re-list.
                Err(_) | Ok(Err(_)) => return None,
                Ok(Ok(change)) => {
                    if change.rv <= self.last_rv {
                        continue;
                    }
                    self.last_rv = change.rv;
                    if let Some((ty, obj)) = self.filter.event(&change) {
                        return Some(event_line(ty, obj, self.as_meta));
                    }
                }
            }
        }
    }

    fn into_response(self) -> Response<ResponseBody> {
        let stream = futures::stream::unfold(self, |mut watch| async move {
            let line = watch.next_line().await?;
            // `Full::frame` is the way to a data frame without naming `http_body::Frame`.
            let frame = Full::new(line).frame().await?;
            Some((frame, watch))
        });
        let mut response = Response::new(StreamBody::new(stream).boxed_unsync());
        response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        response
    }
}

fn event_line(ty: &str, obj: &Value, as_meta: bool) -> Bytes {
    let obj = if as_meta { to_partial(obj) } else { obj.clone() };
    let mut line = serde_json::to_vec(&json!({"type": ty, "object": obj})).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

// ---------------------------------------------------------------------------
// Selectors

/// What a list, watch or deletecollection selects.
struct Filter {
    res: Res,
    namespace: Option<String>,
    name: Option<String>,
    labels: Vec<LabelReq>,
    fields: Vec<FieldReq>,
}

impl Filter {
    fn new(t: &Target, req: &Req) -> Result<Filter, FakeError> {
        let labels = match req.q("labelSelector") {
            Some(s) => parse_label_selector(s).map_err(FakeError::BadRequest)?,
            None => Vec::new(),
        };
        let fields = match req.q("fieldSelector") {
            Some(s) => parse_field_selector(s).map_err(FakeError::BadRequest)?,
            None => Vec::new(),
        };
        Ok(Filter { res: t.res.clone(), namespace: t.namespace.clone(), name: t.name.clone(), labels, fields })
    }

    fn matches(&self, key: &Key, obj: &Value) -> bool {
        key.res == self.res
            && (self.namespace.is_none() || key.namespace == self.namespace)
            && self.name.as_ref().is_none_or(|n| *n == key.name)
            && self.labels.iter().all(|r| r.matches(obj))
            && self.fields.iter().all(|r| r.matches(obj))
    }

    /// The event a watcher with this filter sees for a change, if any: objects
    /// that start matching are ADDED, those that stop matching DELETED.
    fn event<'c>(&self, change: &'c Change) -> Option<(&'static str, &'c Value)> {
        let now = self.matches(&change.key, &change.obj);
        let before = change.old.as_ref().is_some_and(|o| self.matches(&change.key, o));
        match change.kind {
            ChangeKind::Added => now.then_some(("ADDED", &change.obj)),
            ChangeKind::Deleted => (now || before).then_some(("DELETED", &change.obj)),
            ChangeKind::Modified => match (before, now) {
                (true, true) => Some(("MODIFIED", &change.obj)),
                (false, true) => Some(("ADDED", &change.obj)),
                (true, false) => Some(("DELETED", &change.obj)),
                (false, false) => None,
            },
        }
    }
}

#[derive(Debug)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

impl LabelReq {
    fn matches(&self, obj: &Value) -> bool {
        let label = |k: &str| obj.pointer("/metadata/labels").and_then(|l| l.get(k)).and_then(Value::as_str);
        match self {
            LabelReq::Eq(k, v) => label(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => label(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            LabelReq::NotIn(k, vs) => label(k).is_none_or(|l| !vs.iter().any(|v| v == l)),
            LabelReq::Exists(k) => label(k).is_some(),
            LabelReq::NotExists(k) => label(k).is_none(),
        }
    }
}

/// Splits on commas outside parentheses.
fn split_terms(s: &str) -> Vec<&str> {
    let mut terms = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                terms.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&s[start..]);
    terms.into_iter().map(str::trim).filter(|t| !t.is_empty()).collect()
}

fn valid_label_key(k: &str) -> bool {
    !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn parse_label_selector(s: &str) -> Result<Vec<LabelReq>, String> {
    let bad = |term: &str| format!("unable to parse requirement: {term:?} in label selector {s:?}");
    let mut reqs = Vec::new();
    for term in split_terms(s) {
        let req = if let Some((head, rest)) = term.split_once('(') {
            let values: Vec<String> = rest
                .strip_suffix(')')
                .ok_or_else(|| bad(term))?
                .split(',')
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
                .collect();
            match head.split_whitespace().collect::<Vec<_>>().as_slice() {
                [k, "in"] if valid_label_key(k) => LabelReq::In(k.to_string(), values),
                [k, "notin"] if valid_label_key(k) => LabelReq::NotIn(k.to_string(), values),
                _ => return Err(bad(term)),
            }
        } else if let Some((k, v)) = term.split_once("!=") {
            LabelReq::NotEq(k.trim().to_string(), v.trim().to_string())
        } else if let Some((k, v)) = term.split_once("==") {
            LabelReq::Eq(k.trim().to_string(), v.trim().to_string())
        } else if let Some((k, v)) = term.split_once('=') {
            LabelReq::Eq(k.trim().to_string(), v.trim().to_string())
        } else if let Some(k) = term.strip_prefix('!') {
            LabelReq::NotExists(k.trim().to_string())
        } else {
            LabelReq::Exists(term.to_string())
        };
        let key = match &req {
            LabelReq::Eq(k, _)
            | LabelReq::NotEq(k, _)
            | LabelReq::In(k, _)
            | LabelReq::NotIn(k, _)
            | LabelReq::Exists(k)
            | LabelReq::NotExists(k) => k,
        };
        if !valid_label_key(key) {
            return Err(bad(term));
        }
        reqs.push(req);
    }
    Ok(reqs)
}

#[derive(Debug)]
struct FieldReq {
    /// JSON pointer of the field (`metadata.name` → `/metadata/name`).
    pointer: String,
    value: String,
    equal: bool,
}

impl FieldReq {
    fn matches(&self, obj: &Value) -> bool {
        let actual = match obj.pointer(&self.pointer) {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
        };
        (actual == self.value) == self.equal
    }
}

fn parse_field_selector(s: &str) -> Result<Vec<FieldReq>, String> {
    split_terms(s)
        .into_iter()
        .map(|term| {
            let (field, value, equal) = if let Some((k, v)) = term.split_once("!=") {
                (k, v, false)
            } else if let Some((k, v)) = term.split_once("==") {
                (k, v, true)
            } else if let Some((k, v)) = term.split_once('=') {
                (k, v, true)
            } else {
                return Err(format!("invalid field selector term {term:?}"));
            };
            let field = field.trim();
            if field.is_empty() {
                return Err(format!("invalid field selector term {term:?}"));
            }
            Ok(FieldReq { pointer: format!("/{}", field.replace('.', "/")), value: value.trim().to_string(), equal })
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Field ownership (server-side apply and managedFields)

/// Which part of an object a write may touch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scope {
    /// Everything but `status` (and the server-owned metadata).
    Main,
    /// Only `status`.
    Status,
}

impl Scope {
    fn of(subresource: Option<&str>) -> Scope {
        if subresource == Some("status") { Scope::Status } else { Scope::Main }
    }

    /// The part of an applied configuration this endpoint honours.
    fn filter(self, applied: &Value) -> Value {
        let mut out = applied.clone();
        let map = as_map(&mut out);
        match self {
            Scope::Main => {
                map.remove("status");
            }
            Scope::Status => map.retain(|k, _| k == "status"),
        }
        if let Some(meta) = map.get_mut("metadata").and_then(Value::as_object_mut) {
            for field in
                ["resourceVersion", "managedFields", "uid", "creationTimestamp", "generation", "deletionTimestamp"]
            {
                meta.remove(field);
            }
        }
        out
    }
}

/// The fields of an object that managers can own, with their values.
fn leaves(obj: &Value, scope: Scope) -> BTreeMap<FieldPath, Value> {
    fn walk(v: &Value, path: &mut FieldPath, out: &mut BTreeMap<FieldPath, Value>) {
        match v {
            Value::Object(map) if !map.is_empty() => {
                for (k, child) in map {
                    path.push(k.clone());
                    walk(child, path, out);
                    path.pop();
                }
            }
            _ => {
                out.insert(path.clone(), v.clone());
            }
        }
    }
    let mut out = BTreeMap::new();
    let Some(map) = obj.as_object() else {
        return out;
    };
    for (k, v) in map {
        let mut path = vec![k.clone()];
        match (k.as_str(), scope) {
            ("apiVersion" | "kind", _) => {}
            ("metadata", Scope::Main) => {
                for field in ["labels", "annotations", "finalizers", "ownerReferences"] {
                    if let Some(child) = v.get(field) {
                        path.push(field.to_string());
                        if matches!(field, "labels" | "annotations") {
                            walk(child, &mut path, &mut out);
                        } else {
                            out.insert(path.clone(), child.clone());
                        }
                        path.pop();
                    }
                }
            }
            ("status", Scope::Status) => walk(v, &mut path, &mut out),
            ("metadata" | "status", _) | (_, Scope::Status) => {}
            (_, Scope::Main) => walk(v, &mut path, &mut out),
        }
    }
    out
}

fn value_at<'v>(obj: &'v Value, path: &[String]) -> Option<&'v Value> {
    path.iter().try_fold(obj, |v, seg| v.as_object()?.get(seg))
}

/// Removes a field, and the maps it leaves empty below the top level.
fn remove_path(obj: &mut Value, path: &[String]) {
    fn go(v: &mut Value, path: &[String], depth: usize) {
        let Some(map) = v.as_object_mut() else { return };
        match path {
            [] => {}
            [last] => {
                map.remove(last);
            }
            [head, rest @ ..] => {
                if let Some(child) = map.get_mut(head) {
                    go(child, rest, depth + 1);
                    if depth >= 1 && child.as_object().is_some_and(Map::is_empty) {
                        map.remove(head);
                    }
                }
            }
        }
    }
    go(obj, path, 0);
}

/// Ownership after a non-apply write: changed fields move to the writer.
fn track_update(managers: &mut Managers, old: Option<&Value>, new: &Value, manager: &str, sub: Option<&str>) {
    let scope = Scope::of(sub);
    let before = old.map(|o| leaves(o, scope)).unwrap_or_default();
    let changed: BTreeSet<FieldPath> =
        leaves(new, scope).into_iter().filter(|(p, v)| before.get(p) != Some(v)).map(|(p, _)| p).collect();
    if changed.is_empty() {
        return;
    }
    let me = ManagerKey { manager: manager.to_string(), apply: false, subresource: sub.map(str::to_string) };
    for (mk, owned) in managers.iter_mut() {
        if *mk != me {
            owned.paths.retain(|p| !changed.iter().any(|c| p.starts_with(c)));
        }
    }
    let api_version = str_at(new, "/apiVersion").unwrap_or_default().to_string();
    let entry = managers.entry(me).or_insert_with(|| Owned {
        paths: BTreeSet::new(),
        time: now(),
        api_version: api_version.clone(),
    });
    entry.paths.extend(changed);
    entry.time = now();
    entry.api_version = api_version;
}

/// Forgets ownership of fields that no longer exist.
fn retain_present(managers: &mut Managers, obj: &Value) {
    for owned in managers.values_mut() {
        owned.paths.retain(|p| value_at(obj, p).is_some());
    }
    managers.retain(|_, owned| !owned.paths.is_empty());
}

fn render_managed_fields(obj: &mut Value, managers: &Managers) {
    let entries: Vec<Value> = managers
        .iter()
        .filter(|(_, owned)| !owned.paths.is_empty())
        .map(|(mk, owned)| {
            let mut fields = Map::new();
            for path in &owned.paths {
                let mut cursor = &mut fields;
                for seg in path {
                    let next = cursor.entry(format!("f:{seg}")).or_insert_with(|| json!({}));
                    cursor = as_map(next);
                }
            }
            let mut entry = json!({
                "manager": mk.manager,
                "operation": if mk.apply { "Apply" } else { "Update" },
                "apiVersion": owned.api_version,
                "time": owned.time,
                "fieldsType": "FieldsV1",
                "fieldsV1": fields,
            });
            if let (Some(sub), Some(map)) = (&mk.subresource, entry.as_object_mut()) {
                map.insert("subresource".into(), json!(sub));
            }
            entry
        })
        .collect();
    let meta = meta_mut(obj);
    if entries.is_empty() {
        meta.remove("managedFields");
    } else {
        meta.insert("managedFields".into(), Value::Array(entries));
    }
}

fn apply_conflict(key: &Key, conflicts: &[(String, FieldPath)], api_version: &str) -> FakeError {
    let causes: Vec<Value> = conflicts
        .iter()
        .map(|(manager, path)| {
            let field = format!(".{}", path.join("."));
            json!({
                "type": "FieldManagerConflict",
                "message": format!("conflict with \"{manager}\" using {api_version}"),
                "field": field,
            })
        })
        .collect();
    let list: Vec<String> = conflicts
        .iter()
        .map(|(manager, path)| format!("conflict with \"{manager}\" using {api_version}: .{}", path.join(".")))
        .collect();
    let noun = if conflicts.len() == 1 { "conflict" } else { "conflicts" };
    FakeError::Conflict {
        resource: key.res.qualified(),
        name: key.name.clone(),
        message: format!("Apply failed with {} {noun}: {}", conflicts.len(), list.join("\n")),
        causes,
    }
}

// ---------------------------------------------------------------------------
// JSON helpers

fn as_map(v: &mut Value) -> &mut Map<String, Value> {
    if !v.is_object() {
        *v = Value::Object(Map::new());
    }
    match v {
        Value::Object(map) => map,
        _ => unreachable!("made an object above"),
    }
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    as_map(as_map(obj).entry("metadata").or_insert_with(|| json!({})))
}

fn set_meta(obj: &mut Value, field: &str, value: Value) {
    meta_mut(obj).insert(field.to_string(), value);
}

fn str_at<'v>(obj: &'v Value, pointer: &str) -> Option<&'v str> {
    obj.pointer(pointer).and_then(Value::as_str)
}

fn rv_of(obj: &Value) -> String {
    str_at(obj, "/metadata/resourceVersion").unwrap_or_default().to_string()
}

fn kind_str(obj: &Value) -> String {
    str_at(obj, "/kind").unwrap_or_default().to_string()
}

fn finalizers(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default()
}

fn owner_refs(obj: &Value) -> Vec<Value> {
    obj.pointer("/metadata/ownerReferences").and_then(Value::as_array).cloned().unwrap_or_default()
}

fn mark_deleting(obj: &mut Value) {
    let meta = meta_mut(obj);
    if !meta.contains_key("deletionTimestamp") {
        meta.insert("deletionTimestamp".into(), json!(now()));
        meta.insert("deletionGracePeriodSeconds".into(), json!(0));
    }
}

/// The object as compared for no-op detection.
fn comparable(obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("resourceVersion");
        meta.remove("managedFields");
    }
    v
}

/// The object as compared for generation bumps.
fn without_meta_and_status(obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Some(map) = v.as_object_mut() {
        map.remove("metadata");
        map.remove("status");
    }
    v
}

/// Applies the `/status` split to a candidate object written to an endpoint:
/// the main endpoint keeps the stored status and server-owned metadata, `/status`
/// takes only the status.
fn merge_endpoint(old: &Value, candidate: Value, subresource: Option<&str>) -> Value {
    if subresource == Some("status") {
        let mut new = old.clone();
        let map = as_map(&mut new);
        match candidate.get("status") {
            Some(status) => map.insert("status".into(), status.clone()),
            None => map.remove("status"),
        };
        return new;
    }
    let mut new = candidate;
    let map = as_map(&mut new);
    for field in ["apiVersion", "kind", "status"] {
        match old.get(field) {
            Some(v) => map.insert(field.into(), v.clone()),
            None => map.remove(field),
        };
    }
    let old_meta = old.get("metadata").and_then(Value::as_object).cloned().unwrap_or_default();
    let meta = meta_mut(&mut new);
    for field in [
        "name",
        "namespace",
        "generateName",
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "resourceVersion",
        "managedFields",
        "selfLink",
    ] {
        match old_meta.get(field) {
            Some(v) => meta.insert(field.into(), v.clone()),
            None => meta.remove(field),
        };
    }
    new
}

fn parse_object(body: &[u8]) -> Result<Value, FakeError> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| FakeError::BadRequest(format!("invalid JSON body: {e}")))?;
    if !v.is_object() || v.get("metadata").is_some_and(|m| !m.is_object()) {
        return Err(FakeError::BadRequest("the body must be a JSON object with object metadata".into()));
    }
    Ok(v)
}

fn check_name(body: &Value, name: &str) -> Result<(), FakeError> {
    match str_at(body, "/metadata/name") {
        Some(n) if !n.is_empty() && n != name => Err(FakeError::BadRequest(format!(
            "the name of the object ({n}) does not match the name on the URL ({name})"
        ))),
        _ => Ok(()),
    }
}

/// A write carrying a resourceVersion must carry the current one.
fn check_rv(key: &Key, stored: &Value, candidate: &Value) -> Result<(), FakeError> {
    match str_at(candidate, "/metadata/resourceVersion") {
        Some(rv) if !rv.is_empty() && rv != rv_of(stored) => Err(stale(key)),
        _ => Ok(()),
    }
}

/// No new finalizers on an object being deleted.
fn check_finalizers(key: &Key, old: &Value, new: &Value) -> Result<(), FakeError> {
    if old.pointer("/metadata/deletionTimestamp").is_none() {
        return Ok(());
    }
    let before = finalizers(old);
    match finalizers(new).into_iter().find(|f| !before.contains(f)) {
        Some(f) => Err(invalid(
            key,
            &format!(
                "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers [{f:?}]"
            ),
        )),
        None => Ok(()),
    }
}

fn not_found(key: &Key) -> FakeError {
    FakeError::NotFound { resource: key.res.qualified(), name: key.name.clone() }
}

fn invalid(key: &Key, message: &str) -> FakeError {
    FakeError::Invalid { resource: key.res.qualified(), name: key.name.clone(), message: message.to_string() }
}

fn conflict(key: &Key, message: String) -> FakeError {
    FakeError::Conflict { resource: key.res.qualified(), name: key.name.clone(), message, causes: Vec::new() }
}

fn stale(key: &Key) -> FakeError {
    conflict(
        key,
        format!(
            "Operation cannot be fulfilled on {} \"{}\": the object has been modified; please apply your changes to the latest version and try again",
            key.res.qualified(),
            key.name
        ),
    )
}

/// `meta.k8s.io/v1` PartialObjectMetadata, for metadata-only requests.
fn to_partial(obj: &Value) -> Value {
    if let Some(items) = obj.get("items").and_then(Value::as_array) {
        let items: Vec<Value> = items.iter().map(to_partial).collect();
        return json!({
            "kind": "PartialObjectMetadataList",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
            "items": items,
        });
    }
    if str_at(obj, "/kind") == Some("Status") {
        return obj.clone();
    }
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

fn json_response(code: u16, body: &Value) -> Response<ResponseBody> {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut response = Response::new(Full::new(Bytes::from(bytes)).boxed_unsync());
    *response.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn version_info() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": "v1.33.0-fake",
        "gitCommit": "fake",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.24",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// Now, to the second, as Kubernetes writes times.
fn now() -> String {
    let now = jiff::Timestamp::now();
    jiff::Timestamp::from_second(now.as_second()).unwrap_or(now).to_string()
}

/// Five characters from Kubernetes' generateName alphabet.
fn random_suffix(seq: u64) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(seq);
    let mut x = hasher.finish();
    (0..5)
        .map(|_| {
            let c = ALPHABET[(x % ALPHABET.len() as u64) as usize];
            x /= ALPHABET.len() as u64;
            c as char
        })
        .collect()
}
