//! Server-side apply and field ownership (`managedFields`).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use super::error::{FakeError, invalid, not_found, stale};
use super::json::{as_map, check_finalizers, check_name, kind_str, merge_endpoint, meta_mut, now, rv_of, str_at};
use super::routing::{Key, Req};
use super::store::{FieldPath, ManagerKey, Managers, Outcome, Owned, State};

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

impl State {
    /// Server-side apply.
    pub(super) fn apply(&mut self, req: &Req, name: &str) -> Result<(u16, Value), FakeError> {
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
}
