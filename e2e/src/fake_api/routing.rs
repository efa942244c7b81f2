//! Resources, keys and the URL layout, and the handlers of get, list, create, update
//! and (non-apply) patch requests.

use std::collections::BTreeMap;

use http::header::{ACCEPT, CONTENT_TYPE, USER_AGENT};
use http::{HeaderMap, Method};
use json_patch::PatchOperation;
use serde_json::{Value, json};

use super::Write;
use super::error::{FakeError, invalid};
use super::json::{
    check_finalizers, check_name, check_rv, kind_str, merge_endpoint, parse_object, random_suffix, str_at,
};
use super::selectors::Filter;
use super::ssa::{retain_present, track_update};
use super::store::{Managers, Outcome, Propagation, State, Stored};

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

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct Res {
    group: String,
    version: String,
    pub(super) plural: String,
}

impl Res {
    pub(super) fn of_type(api_version: &str, kind: &str) -> Res {
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        Res { group: group.to_string(), version: version.to_string(), plural: plural_of(kind) }
    }

    pub(super) fn api_version(&self) -> String {
        if self.group.is_empty() { self.version.clone() } else { format!("{}/{}", self.group, self.version) }
    }

    /// `plural[.group]`, as Status messages name resources.
    pub(super) fn qualified(&self) -> String {
        if self.group.is_empty() { self.plural.clone() } else { format!("{}.{}", self.plural, self.group) }
    }

    /// Custom resources answer a completed DELETE with the object, built-ins with a Status.
    pub(super) fn is_builtin(&self) -> bool {
        self.group.is_empty() || !self.group.contains('.') || self.group.ends_with(".k8s.io")
    }

    pub(super) fn default_propagation(&self) -> Propagation {
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

pub(super) fn kind_of_plural(plural: &str) -> String {
    if let Some((_, kind)) = KNOWN_KINDS.iter().find(|(p, _)| *p == plural) {
        return kind.to_string();
    }
    let singular = plural.strip_suffix('s').unwrap_or(plural);
    let mut chars = singular.chars();
    chars.next().map(|c| c.to_ascii_uppercase().to_string() + chars.as_str()).unwrap_or_default()
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct Key {
    pub(super) res: Res,
    pub(super) namespace: Option<String>,
    pub(super) name: String,
}

impl Key {
    pub(super) fn of_type(api_version: &str, kind: &str, namespace: Option<&str>, name: &str) -> Key {
        Key { res: Res::of_type(api_version, kind), namespace: namespace.map(str::to_string), name: name.to_string() }
    }
}

/// What a request path addresses.
#[derive(Clone, Debug)]
pub(super) struct Target {
    pub(super) res: Res,
    pub(super) namespace: Option<String>,
    pub(super) name: Option<String>,
    pub(super) subresource: Option<String>,
}

impl Target {
    /// `/api/v1/...` or `/apis/{group}/{version}/...`, then
    /// `namespaces/{ns}/{plural}[/{name}[/{sub}]]` or `{plural}[/{name}[/{sub}]]`.
    pub(super) fn parse(path: &str) -> Option<Target> {
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

    pub(super) fn key(&self, name: &str) -> Key {
        Key { res: self.res.clone(), namespace: self.namespace.clone(), name: name.to_string() }
    }
}

pub(super) struct Req<'a> {
    pub(super) method: &'a Method,
    pub(super) path: &'a str,
    pub(super) query: BTreeMap<String, String>,
    pub(super) headers: &'a HeaderMap,
    pub(super) body: &'a [u8],
    pub(super) target: Target,
}

impl Req<'_> {
    pub(super) fn q(&self, name: &str) -> Option<&str> {
        self.query.get(name).map(String::as_str).filter(|v| !v.is_empty())
    }

    pub(super) fn flag(&self, name: &str) -> bool {
        matches!(self.q(name), Some("true" | "1"))
    }

    pub(super) fn is_watch(&self) -> bool {
        self.flag("watch")
    }

    pub(super) fn wants_metadata(&self) -> bool {
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

    pub(super) fn write(&self, verb: &str, key: &Key, kind: &str) -> Write {
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

pub(super) fn parse_query(query: Option<&str>) -> BTreeMap<String, String> {
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

impl State {
    /// Routes a request other than a watch to its handler. Each handler returns the
    /// HTTP code and body.
    pub(super) fn serve(&mut self, req: &Req) -> Result<(u16, Value), FakeError> {
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
}
