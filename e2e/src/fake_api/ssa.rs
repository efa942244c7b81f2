//! Server-side apply.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use super::error::{FakeError, invalid, not_found, stale};
use super::json::{check_finalizers, check_name, kind_str, merge_endpoint, now, rv_of, str_at};
use super::ownership::{FieldPath, ManagerKey, Managers, Owned, Scope, leaves, retain_present, value_at};
use super::request::Req;
use super::resource::Key;
use super::store::{Outcome, State};

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
