//! Routing of requests other than watches to their handlers, and the handlers of
//! get, list, create, update and (non-apply) patch requests.

use http::Method;
use http::header::CONTENT_TYPE;
use json_patch::PatchOperation;
use serde_json::{Value, json};

use super::error::{FakeError, invalid};
use super::json::{
    check_finalizers, check_name, check_rv, kind_str, merge_endpoint, parse_object, random_suffix, str_at,
};
use super::ownership::{Managers, retain_present, track_update};
use super::request::{Req, header};
use super::resource::Key;
use super::selectors::Filter;
use super::store::{Outcome, State, Stored};

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
