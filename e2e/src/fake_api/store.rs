//! The store: objects with their field managers, the change log that watches resume
//! from, and deletion with finalizers, propagation and garbage collection.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use http::Method;
use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::error::{FakeError, conflict, details, not_found};
use super::json::{
    as_map, comparable, finalizers, kind_str, mark_deleting, meta_mut, now, owner_refs, rv_of, set_meta, str_at,
    without_meta_and_status,
};
use super::ownership::{Managers, render_managed_fields, retain_present};
use super::request::{Req, Write};
use super::resource::{Key, Propagation, Res, kind_of_plural};
use super::selectors::Filter;

const FOREGROUND_FINALIZER: &str = "foregroundDeletion";

#[derive(Clone, Debug)]
pub(super) struct Stored {
    pub(super) obj: Value,
    pub(super) managers: Managers,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

/// One stored change, replayed to watchers that resume from an older resourceVersion.
#[derive(Debug)]
pub(super) struct Change {
    pub(super) rv: u64,
    pub(super) kind: ChangeKind,
    pub(super) key: Key,
    pub(super) obj: Value,
    /// The object before the change, so label-filtered watches see objects enter and leave.
    pub(super) old: Option<Value>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Outcome {
    Unchanged,
    Created,
    Modified,
    Removed,
}

#[derive(Default)]
pub(super) struct Preconditions {
    uid: Option<String>,
    resource_version: Option<String>,
}

pub(super) struct Failure {
    pub(super) method: String,
    pub(super) path_contains: String,
    pub(super) code: u16,
    pub(super) remaining: usize,
}

pub(super) struct State {
    /// The last resourceVersion handed out.
    pub(super) rv: u64,
    /// Counter for uids and generated names.
    pub(super) seq: u64,
    pub(super) objects: BTreeMap<Key, Stored>,
    pub(super) log: VecDeque<Arc<Change>>,
    pub(super) log_capacity: usize,
    /// Every change with a resourceVersion above this is still in `log`.
    pub(super) log_floor: u64,
    pub(super) tx: broadcast::Sender<Arc<Change>>,
    pub(super) writes: Vec<Write>,
    pub(super) requests: Vec<String>,
    /// Requests received per HTTP method.
    pub(super) methods: BTreeMap<String, u64>,
    /// The keys of the objects of each type carrying each label (`key=value`), so that a
    /// list selecting by label (as an operator's per-owner lists do) tests only those.
    pub(super) labelled: HashMap<(Res, String), BTreeSet<Key>>,
    pub(super) failures: Vec<Failure>,
}

impl State {
    pub(super) fn take_failure(&mut self, method: &Method, line: &str) -> Option<u16> {
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

    pub(super) fn stored(&self, key: &Key) -> Result<&Stored, FakeError> {
        self.objects.get(key).ok_or_else(|| not_found(key))
    }

    pub(super) fn kind_for(&self, res: &Res) -> String {
        self.of_type(res, None)
            .next()
            .and_then(|(_, s)| str_at(&s.obj, "/kind"))
            .map(str::to_string)
            .unwrap_or_else(|| kind_of_plural(&res.plural))
    }

    pub(super) fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Fills in what the server sets on create. With `keep_given`, an existing
    /// uid, creationTimestamp and status survive (for [`FakeApi::insert`]).
    pub(super) fn prepare_new(&mut self, obj: &mut Value, key: &Key, keep_given: bool) {
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
    pub(super) fn write_object(&mut self, key: &Key, mut new: Value, managers: Managers) -> (Value, Outcome) {
        render_managed_fields(&mut new, &managers);
        let Some(old) = self.objects.get(key).cloned() else {
            self.rv += 1;
            set_meta(&mut new, "resourceVersion", json!(self.rv.to_string()));
            self.put(key, Stored { obj: new.clone(), managers });
            self.emit(ChangeKind::Added, key, new.clone(), None);
            return (new, Outcome::Created);
        };
        if comparable(&old.obj) == comparable(&new) {
            let stored = Stored { obj: new, managers };
            let obj = stored.obj.clone();
            self.put(key, stored);
            return (obj, Outcome::Unchanged);
        }
        if new.pointer("/metadata/deletionTimestamp").is_some() && finalizers(&new).is_empty() {
            self.put(key, Stored { obj: new, managers });
            let removed = self.remove(key).unwrap_or_default();
            return (removed, Outcome::Removed);
        }
        if without_meta_and_status(&old.obj) != without_meta_and_status(&new) {
            let generation = old.obj.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(0);
            set_meta(&mut new, "generation", json!(generation + 1));
        }
        self.rv += 1;
        set_meta(&mut new, "resourceVersion", json!(self.rv.to_string()));
        self.put(key, Stored { obj: new.clone(), managers });
        self.emit(ChangeKind::Modified, key, new.clone(), Some(old.obj));
        (new, Outcome::Modified)
    }

    /// Stores an object, keeping the label index.
    fn put(&mut self, key: &Key, stored: Stored) {
        let new = labels_of(&stored.obj);
        let old = self.objects.insert(key.clone(), stored).map(|s| labels_of(&s.obj)).unwrap_or_default();
        self.reindex(key, old, new);
    }

    /// Takes an object out of the store, keeping the label index.
    fn take(&mut self, key: &Key) -> Option<Stored> {
        let stored = self.objects.remove(key)?;
        self.reindex(key, labels_of(&stored.obj), BTreeSet::new());
        Some(stored)
    }

    fn reindex(&mut self, key: &Key, old: BTreeSet<String>, new: BTreeSet<String>) {
        for label in old.difference(&new) {
            let index = (key.res.clone(), label.clone());
            if let Some(keys) = self.labelled.get_mut(&index) {
                keys.remove(key);
                if keys.is_empty() {
                    self.labelled.remove(&index);
                }
            }
        }
        for label in new.difference(&old) {
            self.labelled.entry((key.res.clone(), label.clone())).or_default().insert(key.clone());
        }
    }

    /// Removes an object now, then garbage-collects its dependents and lets
    /// foreground-deleting owners waiting on it finish.
    fn remove(&mut self, key: &Key) -> Option<Value> {
        let stored = self.take(key)?;
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
    pub(super) fn delete(
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

    /// The objects of one type, in one namespace or (with `None`) in all of them, in key
    /// order: a range of the map, so that a list does not scan every other type.
    pub(super) fn of_type<'s>(
        &'s self,
        res: &Res,
        namespace: Option<&str>,
    ) -> impl Iterator<Item = (&'s Key, &'s Stored)> + 's {
        // `None` sorts before any namespace and "" before any name: the first key of the range.
        let start = Key { res: res.clone(), namespace: namespace.map(str::to_string), name: String::new() };
        let (res, namespace) = (res.clone(), namespace.map(str::to_string));
        self.objects
            .range(start..)
            .take_while(move |(k, _)| k.res == res && (namespace.is_none() || k.namespace == namespace))
    }

    /// Objects a list or watch request selects, in key order.
    pub(super) fn selected(&self, filter: &Filter) -> Vec<(Key, Value)> {
        let selected = |(k, s): (&Key, &Stored)| filter.matches(k, &s.obj).then(|| (k.clone(), s.obj.clone()));
        match filter.label_equal() {
            // Only the objects carrying one label the selector requires.
            Some(label) => match self.labelled.get(&(filter.res.clone(), label)) {
                Some(keys) => keys.iter().filter_map(|k| self.objects.get_key_value(k)).filter_map(selected).collect(),
                None => Vec::new(),
            },
            None => self.of_type(&filter.res, filter.namespace.as_deref()).filter_map(selected).collect(),
        }
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

    pub(super) fn delete_one(&mut self, req: &Req, name: &str) -> Result<(u16, Value), FakeError> {
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

    pub(super) fn delete_collection(&mut self, req: &Req) -> Result<(u16, Value), FakeError> {
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
}

/// An object's labels, as `key=value`.
fn labels_of(obj: &Value) -> BTreeSet<String> {
    let labels = obj.get("metadata").and_then(|m| m.get("labels")).and_then(Value::as_object);
    labels.into_iter().flatten().filter_map(|(k, v)| Some(format!("{k}={}", v.as_str()?))).collect()
}
