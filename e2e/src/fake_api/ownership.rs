//! Field ownership: which manager owns which fields of an object, tracked on every
//! write and rendered as `managedFields`.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use super::json::{as_map, meta_mut, now, str_at};

/// Who owns which fields, keyed by manager, operation and subresource.
pub(super) type Managers = BTreeMap<ManagerKey, Owned>;
/// A field: the keys from the object root to a leaf (lists are leaves).
pub(super) type FieldPath = Vec<String>;

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct ManagerKey {
    pub(super) manager: String,
    pub(super) apply: bool,
    pub(super) subresource: Option<String>,
}

#[derive(Clone, Debug)]
pub(super) struct Owned {
    pub(super) paths: BTreeSet<FieldPath>,
    pub(super) time: String,
    pub(super) api_version: String,
}

/// Which part of an object a write may touch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Scope {
    /// Everything but `status` (and the server-owned metadata).
    Main,
    /// Only `status`.
    Status,
}

impl Scope {
    pub(super) fn of(subresource: Option<&str>) -> Scope {
        if subresource == Some("status") { Scope::Status } else { Scope::Main }
    }

    /// The part of an applied configuration this endpoint honours.
    pub(super) fn filter(self, applied: &Value) -> Value {
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
pub(super) fn leaves(obj: &Value, scope: Scope) -> BTreeMap<FieldPath, Value> {
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

pub(super) fn value_at<'v>(obj: &'v Value, path: &[String]) -> Option<&'v Value> {
    path.iter().try_fold(obj, |v, seg| v.as_object()?.get(seg))
}

/// Ownership after a non-apply write: changed fields move to the writer.
pub(super) fn track_update(
    managers: &mut Managers,
    old: Option<&Value>,
    new: &Value,
    manager: &str,
    sub: Option<&str>,
) {
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
pub(super) fn retain_present(managers: &mut Managers, obj: &Value) {
    for owned in managers.values_mut() {
        owned.paths.retain(|p| value_at(obj, p).is_some());
    }
    managers.retain(|_, owned| !owned.paths.is_empty());
}

pub(super) fn render_managed_fields(obj: &mut Value, managers: &Managers) {
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
