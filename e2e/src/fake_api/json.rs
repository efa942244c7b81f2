//! JSON helpers: object metadata, write checks, responses.

use std::convert::Infallible;
use std::hash::{BuildHasher, Hasher};

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use serde_json::{Map, Value, json};

use super::error::{FakeError, invalid, stale};
use super::resource::Key;

pub(super) fn as_map(v: &mut Value) -> &mut Map<String, Value> {
    if !v.is_object() {
        *v = Value::Object(Map::new());
    }
    match v {
        Value::Object(map) => map,
        _ => unreachable!("made an object above"),
    }
}

pub(super) fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    as_map(as_map(obj).entry("metadata").or_insert_with(|| json!({})))
}

pub(super) fn set_meta(obj: &mut Value, field: &str, value: Value) {
    meta_mut(obj).insert(field.to_string(), value);
}

pub(super) fn str_at<'v>(obj: &'v Value, pointer: &str) -> Option<&'v str> {
    obj.pointer(pointer).and_then(Value::as_str)
}

pub(super) fn rv_of(obj: &Value) -> String {
    str_at(obj, "/metadata/resourceVersion").unwrap_or_default().to_string()
}

pub(super) fn kind_str(obj: &Value) -> String {
    str_at(obj, "/kind").unwrap_or_default().to_string()
}

pub(super) fn finalizers(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default()
}

pub(super) fn owner_refs(obj: &Value) -> Vec<Value> {
    obj.pointer("/metadata/ownerReferences").and_then(Value::as_array).cloned().unwrap_or_default()
}

pub(super) fn mark_deleting(obj: &mut Value) {
    let meta = meta_mut(obj);
    if !meta.contains_key("deletionTimestamp") {
        meta.insert("deletionTimestamp".into(), json!(now()));
        meta.insert("deletionGracePeriodSeconds".into(), json!(0));
    }
}

/// The object as compared for no-op detection.
pub(super) fn comparable(obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("resourceVersion");
        meta.remove("managedFields");
    }
    v
}

/// The object as compared for generation bumps.
pub(super) fn without_meta_and_status(obj: &Value) -> Value {
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
pub(super) fn merge_endpoint(old: &Value, candidate: Value, subresource: Option<&str>) -> Value {
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

pub(super) fn parse_object(body: &[u8]) -> Result<Value, FakeError> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| FakeError::BadRequest(format!("invalid JSON body: {e}")))?;
    if !v.is_object() || v.get("metadata").is_some_and(|m| !m.is_object()) {
        return Err(FakeError::BadRequest("the body must be a JSON object with object metadata".into()));
    }
    Ok(v)
}

pub(super) fn check_name(body: &Value, name: &str) -> Result<(), FakeError> {
    match str_at(body, "/metadata/name") {
        Some(n) if !n.is_empty() && n != name => Err(FakeError::BadRequest(format!(
            "the name of the object ({n}) does not match the name on the URL ({name})"
        ))),
        _ => Ok(()),
    }
}

/// A write carrying a resourceVersion must carry the current one.
pub(super) fn check_rv(key: &Key, stored: &Value, candidate: &Value) -> Result<(), FakeError> {
    match str_at(candidate, "/metadata/resourceVersion") {
        Some(rv) if !rv.is_empty() && rv != rv_of(stored) => Err(stale(key)),
        _ => Ok(()),
    }
}

/// No new finalizers on an object being deleted.
pub(super) fn check_finalizers(key: &Key, old: &Value, new: &Value) -> Result<(), FakeError> {
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

/// `meta.k8s.io/v1` PartialObjectMetadata, for metadata-only requests.
pub(super) fn to_partial(obj: &Value) -> Value {
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

/// Response body of the fake service.
pub type ResponseBody = UnsyncBoxBody<Bytes, Infallible>;

pub(super) fn json_response(code: u16, body: &Value) -> Response<ResponseBody> {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut response = Response::new(Full::new(Bytes::from(bytes)).boxed_unsync());
    *response.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

pub(super) fn version_info() -> Value {
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
pub(super) fn now() -> String {
    let now = jiff::Timestamp::now();
    jiff::Timestamp::from_second(now.as_second()).unwrap_or(now).to_string()
}

/// Five characters from Kubernetes' generateName alphabet.
pub(super) fn random_suffix(seq: u64) -> String {
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
