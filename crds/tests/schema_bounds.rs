//! The CRD as a real API server would judge it, checked without one.
//!
//! The API server refuses a CRD whose schema is not structural, whose defaults do not
//! validate against their own schema, or whose CEL rules' estimated cost exceeds its
//! budget. It estimates a rule's cost from the `maxLength`, `maxItems` and
//! `maxProperties` of what the rule can reach, so one unbounded string or list makes
//! the estimate explode ("estimated rule cost exceeds budget … try adding maxItems,
//! maxProperties, and maxLength"). [`Walker`] walks the generated openAPIV3Schema and
//! names the path of every problem, in four kinds:
//!
//! - [`Kind::Bounds`]: a string without `maxLength` (and without an `enum` or a
//!   `format`), an array without `maxItems`, a map without `maxProperties`, anywhere in
//!   our own types; the embedded Kubernetes types of [`EMBEDDED`] are exempt, as
//!   kube-api-linter exempts them. Also a `min*` above its `max*`.
//! - [`Kind::Structure`]: the structural-schema rules: every node has a `type` (or
//!   `x-kubernetes-int-or-string` / `x-kubernetes-preserve-unknown-fields`), a single
//!   one; `x-kubernetes-int-or-string` without a `type`; no `additionalProperties`
//!   beside `properties` nor at the root; no `$ref`, `definitions` or other keys a
//!   CRD's JSONSchemaProps refuses; arrays have `items`; `required` names properties;
//!   no `uniqueItems: true`; list-type `map` keys are scalar and required or
//!   defaulted; nothing but value validations inside `anyOf`/`allOf`/`oneOf`/`not`.
//! - [`Kind::Default`]: a `default` that does not validate against its own node: type,
//!   `nullable`, `enum`, `minimum`/`maximum`, lengths, item and property counts,
//!   `required`, unknown (unpruned) fields, and the node's CEL rules (evaluated by
//!   kube-cel with `oldSelf` bound to the default, as the API server does). `pattern`
//!   is not checked (the schema has none).
//! - [`Kind::Cel`]: a rule that does not compile, that names an embedded unbounded
//!   subtree below its node, that applies a string function to the result of
//!   `string(…)` (whose size the API server's estimator cannot bound), a `fieldPath`
//!   that names no field, or anything kube-cel's cost heuristic
//!   (`kube::core::cel::estimate_rule_cost`) warns about.
//!
//! Paths read like `spec.data.mix[*].name`: `[*]` is an array's items, `{*}` a map's
//! values; `<root>` is the root.

use std::collections::BTreeSet;
use std::fmt;

use crds::TrainingRun;
use crds::types::bounds;
use kube::CustomResourceExt;
use kube::core::cel::{Validator, compile_schema, estimate_rule_cost};
use serde_json::{Map, Value, json};

/// Embedded Kubernetes types (k8s-openapi's schemas, which declare no bounds): the
/// bounds checks skip these subtrees, and no CEL rule may read into them. Our own
/// lists holding them (`spec.env`, `spec.topology.tolerations`, `status.conditions`)
/// are bounded all the same.
const EMBEDDED: &[&str] = &[
    // core/v1 EnvVar
    "spec.env[*]",
    // core/v1 ResourceRequirements
    "spec.topology.resources",
    // core/v1 Toleration
    "spec.topology.tolerations[*]",
    // core/v1 Affinity
    "spec.topology.affinity",
    // meta/v1 Condition
    "status.conditions[*]",
];

/// Known rules that defeat the API server's cost estimator, each a fragment of the rule
/// text. A listed fragment that matches no rule fails the test, so that a fix also
/// removes its entry.
const KNOWN_UNBOUNDED_RULES: &[&str] = &[];

/// The keys a CRD's JSONSchemaProps accepts. `$ref`, `$schema`, `id`, `definitions`,
/// `dependencies`, `additionalItems` and `patternProperties` are fields of
/// JSONSchemaProps too, but a CRD may not use them.
const SCHEMA_KEYS: &[&str] = &[
    "type",
    "format",
    "title",
    "description",
    "default",
    "enum",
    "nullable",
    "example",
    "externalDocs",
    "properties",
    "required",
    "items",
    "additionalProperties",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "uniqueItems",
    "minProperties",
    "maxProperties",
    "anyOf",
    "allOf",
    "oneOf",
    "not",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-embedded-resource",
    "x-kubernetes-int-or-string",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-list-type",
    "x-kubernetes-map-type",
    "x-kubernetes-validations",
];

const TYPES: &[&str] = &["object", "array", "string", "integer", "number", "boolean"];

/// CEL string functions whose cost grows with the string they read.
const STRING_FUNCTIONS: &[&str] = &[
    ".matches(",
    ".contains(",
    ".startsWith(",
    ".endsWith(",
    ".find(",
    ".findAll(",
    ".split(",
    ".replace(",
    ".indexOf(",
    ".lastIndexOf(",
    ".lowerAscii(",
    ".upperAscii(",
    ".substring(",
    ".trim(",
    " + ",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Bounds,
    Structure,
    Default,
    Cel,
}

#[derive(Debug)]
struct Problem {
    kind: Kind,
    path: String,
    message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = if self.path.is_empty() { "<root>" } else { &self.path };
        write!(f, "{path}: {}", self.message)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Level {
    Root,
    Field,
    Item,
}

struct Walker<'a> {
    embedded: &'a [&'a str],
    known_unbounded_rules: &'a [&'a str],
    problems: Vec<Problem>,
    embedded_seen: BTreeSet<&'a str>,
    known_seen: BTreeSet<&'a str>,
}

fn child(path: &str, key: &str) -> String {
    if path.is_empty() { key.to_string() } else { format!("{path}.{key}") }
}

fn is_true(node: &Map<String, Value>, key: &str) -> bool {
    node.get(key).and_then(Value::as_bool) == Some(true)
}

/// Whether `text` names the identifier `ident` (not as a part of a longer one).
fn mentions(text: &str, ident: &str) -> bool {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(ident).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + ident.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

/// `anyOf: [{type: integer}, {type: string}]`, the one anyOf an int-or-string may carry.
fn is_int_or_string_any_of(v: Option<&Value>) -> bool {
    v == Some(&json!([{"type": "integer"}, {"type": "string"}]))
}

impl<'a> Walker<'a> {
    fn new(embedded: &'a [&'a str], known_unbounded_rules: &'a [&'a str]) -> Self {
        Walker {
            embedded,
            known_unbounded_rules,
            problems: Vec::new(),
            embedded_seen: BTreeSet::new(),
            known_seen: BTreeSet::new(),
        }
    }

    fn report(&mut self, kind: Kind, path: &str, message: impl Into<String>) {
        self.problems.push(Problem { kind, path: path.to_string(), message: message.into() });
    }

    /// Every problem of `schema`, an openAPIV3Schema.
    fn run(mut self, schema: &Value) -> Vec<Problem> {
        self.node(schema, "", Level::Root, false, None);
        for e in self.embedded {
            if !self.embedded_seen.contains(e) {
                self.report(Kind::Bounds, e, "is in EMBEDDED but not in the schema: remove it from the allowlist");
            }
        }
        for k in self.known_unbounded_rules {
            if !self.known_seen.contains(k) {
                self.report(
                    Kind::Cel,
                    "",
                    format!("no rule contains {k:?} any more: remove it from KNOWN_UNBOUNDED_RULES"),
                );
            }
        }
        self.problems
    }

    /// Checks one node and its subtree. `embedded`: inside an [`EMBEDDED`] subtree;
    /// `cel`: the nearest node at or above carrying CEL rules.
    fn node(&mut self, n: &Value, path: &str, level: Level, embedded: bool, cel: Option<&str>) {
        let Some(node) = n.as_object() else {
            self.report(Kind::Structure, path, format!("a schema must be an object, found {n}"));
            return;
        };
        let listed = self.embedded.iter().copied().find(|e| *e == path);
        if let Some(e) = listed {
            self.embedded_seen.insert(e);
        }
        let embedded = embedded || listed.is_some();
        for key in node.keys().filter(|k| !SCHEMA_KEYS.contains(&k.as_str())) {
            let hint = match key.as_str() {
                "$ref" | "definitions" | "$defs" => ": a CRD schema must be inlined",
                "const" => ": use a one-value enum",
                _ => "",
            };
            self.report(Kind::Structure, path, format!("`{key}` is not allowed in a CRD schema{hint}"));
        }
        let cel_here = if node.contains_key("x-kubernetes-validations") {
            self.rules(node, path);
            Some(path)
        } else {
            cel
        };
        self.structure(node, path, level);
        if !embedded {
            self.bounds(node, path, cel_here);
        }
        if let Some(default) = node.get("default") {
            self.default(n, default, path);
        }
        for junctor in ["anyOf", "allOf", "oneOf"] {
            let Some(branches) = node.get(junctor) else { continue };
            let Some(branches) = branches.as_array() else {
                self.report(Kind::Structure, path, format!("{junctor} must be a list"));
                continue;
            };
            let int_or_string = is_true(node, "x-kubernetes-int-or-string");
            for (i, b) in branches.iter().enumerate() {
                // The two int-or-string patterns the API server allows.
                let skip_any_of = int_or_string
                    && ((junctor == "anyOf" && is_int_or_string_any_of(node.get("anyOf")))
                        || (junctor == "allOf" && i == 0 && is_int_or_string_any_of(b.get("anyOf"))));
                self.nested(node, b, &format!("{path}({junctor}[{i}])"), skip_any_of);
            }
        }
        if let Some(not) = node.get("not") {
            self.nested(node, not, &format!("{path}(not)"), false);
        }
        if let Some(props) = node.get("properties").and_then(Value::as_object) {
            for (k, v) in props {
                self.node(v, &child(path, k), Level::Field, embedded, cel_here);
            }
        }
        if let Some(items) = node.get("items") {
            self.node(items, &format!("{path}[*]"), Level::Item, embedded, cel_here);
        }
        if let Some(values) = node.get("additionalProperties").filter(|v| v.is_object()) {
            self.node(values, &format!("{path}{{*}}"), Level::Field, embedded, cel_here);
        }
    }

    fn structure(&mut self, node: &Map<String, Value>, path: &str, level: Level) {
        let ty = node.get("type");
        let int_or_string = is_true(node, "x-kubernetes-int-or-string");
        let preserve = is_true(node, "x-kubernetes-preserve-unknown-fields");
        match ty {
            Some(Value::String(t)) if TYPES.contains(&t.as_str()) => {}
            Some(Value::Array(_)) => {
                self.report(Kind::Structure, path, "`type` must be one type (an optional field is `nullable: true`)")
            }
            Some(t) => self.report(Kind::Structure, path, format!("`type` {t} is not one of {TYPES:?}")),
            None if int_or_string || preserve => {}
            None => {
                let place = match level {
                    Level::Root => "at the root",
                    Level::Field => "for an object field",
                    Level::Item => "for array items",
                };
                self.report(Kind::Structure, path, format!("has no `type`, which must not be empty {place}"));
            }
        }
        if int_or_string {
            if ty.is_some() {
                self.report(Kind::Structure, path, "x-kubernetes-int-or-string must not have a `type`");
            }
            if preserve || is_true(node, "x-kubernetes-embedded-resource") {
                self.report(
                    Kind::Structure,
                    path,
                    "x-kubernetes-int-or-string excludes x-kubernetes-preserve-unknown-fields and x-kubernetes-embedded-resource",
                );
            }
            if node.contains_key("anyOf") && !is_int_or_string_any_of(node.get("anyOf")) {
                self.report(
                    Kind::Structure,
                    path,
                    "x-kubernetes-int-or-string allows only `anyOf: [{type: integer}, {type: string}]`",
                );
            }
        }
        if let Some(n) = node.get("nullable").filter(|n| !n.is_boolean()) {
            self.report(Kind::Structure, path, format!("`nullable` must be a boolean, found {n}"));
        }
        let ty = ty.and_then(Value::as_str);
        if level == Level::Root {
            if ty != Some("object") {
                self.report(Kind::Structure, path, "the root must be `type: object`");
            }
            if node.contains_key("additionalProperties") {
                self.report(Kind::Structure, path, "additionalProperties must not be used at the root");
            }
            if let Some(meta) = node.get("properties").and_then(|p| p.get("metadata")) {
                let fields = meta.get("properties").and_then(Value::as_object);
                if fields.is_some_and(|f| f.keys().any(|k| k != "name" && k != "generateName")) {
                    self.report(Kind::Structure, &child(path, "metadata"), "may restrict only name and generateName");
                }
            }
        }
        match node.get("additionalProperties") {
            Some(Value::Bool(b)) => self.report(
                Kind::Structure,
                path,
                format!("`additionalProperties: {b}`: give a schema, or use x-kubernetes-preserve-unknown-fields"),
            ),
            Some(_) if node.contains_key("properties") => self.report(
                Kind::Structure,
                path,
                "additionalProperties beside properties: the API server allows one or the other",
            ),
            _ => {}
        }
        if let Some(required) = node.get("required") {
            let props = node.get("properties").and_then(Value::as_object);
            for r in required.as_array().into_iter().flatten() {
                if !r.as_str().is_some_and(|r| props.is_some_and(|p| p.contains_key(r))) {
                    self.report(Kind::Structure, path, format!("requires {r}, which is not among its properties"));
                }
            }
        }
        if ty == Some("array") {
            match node.get("items") {
                None => self.report(Kind::Structure, path, "an array must have `items`"),
                Some(Value::Object(_)) => {}
                Some(_) => self.report(Kind::Structure, path, "`items` must be one schema"),
            }
        }
        if is_true(node, "uniqueItems") {
            self.report(
                Kind::Structure,
                path,
                "uniqueItems: true is refused (quadratic); use x-kubernetes-list-type: set",
            );
        }
        self.list_type(node, path);
    }

    fn list_type(&mut self, node: &Map<String, Value>, path: &str) {
        let list_type = node.get("x-kubernetes-list-type").and_then(Value::as_str);
        let keys = node.get("x-kubernetes-list-map-keys");
        if keys.is_some() && list_type != Some("map") {
            self.report(Kind::Structure, path, "x-kubernetes-list-map-keys needs x-kubernetes-list-type: map");
        }
        let items = node.get("items");
        let scalar = |s: Option<&Value>| {
            s.and_then(|s| s.get("type")).and_then(Value::as_str).is_some_and(|t| !matches!(t, "object" | "array"))
        };
        match list_type {
            None | Some("atomic") => {}
            Some("set") if scalar(items) => {}
            Some("set") => self.report(Kind::Structure, path, "x-kubernetes-list-type: set needs scalar items"),
            Some("map") => {
                let keys: Vec<&str> =
                    keys.and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
                if keys.is_empty() {
                    self.report(Kind::Structure, path, "x-kubernetes-list-type: map needs x-kubernetes-list-map-keys");
                }
                let required = items.and_then(|i| i.get("required")).and_then(Value::as_array);
                for key in keys {
                    let field = items.and_then(|i| i.get("properties")).and_then(|p| p.get(key));
                    if !scalar(field) {
                        self.report(
                            Kind::Structure,
                            path,
                            format!("list-map key {key:?} must be a scalar field of the items"),
                        );
                    }
                    let is_required = required.is_some_and(|r| r.iter().any(|r| r == key));
                    if !is_required && field.and_then(|f| f.get("default")).is_none() {
                        self.report(
                            Kind::Structure,
                            path,
                            format!("list-map key {key:?} must be required or defaulted"),
                        );
                    }
                }
            }
            Some(other) => self.report(Kind::Structure, path, format!("x-kubernetes-list-type {other:?} is unknown")),
        }
    }

    /// A branch of anyOf/allOf/oneOf/not: value validations only, of fields the node
    /// itself specifies.
    fn nested(&mut self, outer: &Map<String, Value>, v: &Value, path: &str, skip_any_of: bool) {
        let Some(branch) = v.as_object() else {
            self.report(Kind::Structure, path, "a branch must be a schema object");
            return;
        };
        for key in branch.keys() {
            let forbidden = matches!(
                key.as_str(),
                "type" | "default" | "description" | "title" | "nullable" | "additionalProperties"
            ) || key.starts_with("x-kubernetes-");
            if forbidden && !(skip_any_of && key == "type") {
                self.report(Kind::Structure, path, format!("`{key}` must not be used inside anyOf/allOf/oneOf/not"));
            }
        }
        let outer_props = outer.get("properties").and_then(Value::as_object);
        if let Some(props) = branch.get("properties").and_then(Value::as_object) {
            for (k, p) in props {
                if !outer_props.is_some_and(|o| o.contains_key(k)) {
                    self.report(Kind::Structure, path, format!("names field {k:?}, which the node does not specify"));
                }
                let inner = outer_props.and_then(|o| o.get(k)).and_then(Value::as_object).cloned().unwrap_or_default();
                self.nested(&inner, p, &child(path, k), false);
            }
        }
        if let Some(items) = branch.get("items") {
            let inner = outer.get("items").and_then(Value::as_object).cloned().unwrap_or_default();
            self.nested(&inner, items, &format!("{path}[*]"), false);
        }
        if !skip_any_of {
            for junctor in ["anyOf", "allOf", "oneOf"] {
                for (i, b) in branch.get(junctor).and_then(Value::as_array).into_iter().flatten().enumerate() {
                    self.nested(outer, b, &format!("{path}({junctor}[{i}])"), false);
                }
            }
        }
    }

    fn bounds(&mut self, node: &Map<String, Value>, path: &str, cel: Option<&str>) {
        let under = match cel {
            Some(at) => format!(" (in reach of the CEL rules at {})", if at.is_empty() { "<root>" } else { at }),
            None => String::new(),
        };
        let ty = node.get("type").and_then(Value::as_str);
        if ty == Some("string") && !["maxLength", "enum", "format"].iter().any(|k| node.contains_key(*k)) {
            self.report(Kind::Bounds, path, format!("string without maxLength{under}"));
        }
        if ty == Some("array") && !node.contains_key("maxItems") {
            self.report(Kind::Bounds, path, format!("array without maxItems{under}"));
        }
        if node.get("additionalProperties").is_some_and(Value::is_object) && !node.contains_key("maxProperties") {
            self.report(Kind::Bounds, path, format!("map without maxProperties{under}"));
        }
        for (min, max) in [("minLength", "maxLength"), ("minItems", "maxItems"), ("minProperties", "maxProperties")] {
            let (lo, hi) = (node.get(min).and_then(Value::as_u64), node.get(max).and_then(Value::as_u64));
            if let (Some(lo), Some(hi)) = (lo, hi)
                && lo > hi
            {
                self.report(Kind::Bounds, path, format!("{min} {lo} is above {max} {hi}"));
            }
        }
    }

    fn rules(&mut self, node: &Map<String, Value>, path: &str) {
        let Some(rules) = node["x-kubernetes-validations"].as_array() else {
            self.report(Kind::Cel, path, "x-kubernetes-validations must be a list");
            return;
        };
        let schema = Value::Object(node.clone());
        let compiled = compile_schema(&schema);
        for e in compiled.compilation_errors() {
            self.report(Kind::Cel, path, format!("a rule does not compile: {e}"));
        }
        for r in rules {
            let Some(rule) = r.get("rule").and_then(Value::as_str).filter(|r| !r.trim().is_empty()) else {
                self.report(Kind::Cel, path, format!("{r} has no rule"));
                continue;
            };
            for key in r.as_object().into_iter().flat_map(|r| r.keys()) {
                if !["rule", "message", "messageExpression", "reason", "fieldPath", "optionalOldSelf"]
                    .contains(&key.as_str())
                {
                    self.report(Kind::Cel, path, format!("rule `{rule}`: unknown key `{key}`"));
                }
            }
            if let Some(reason) = r.get("reason").and_then(Value::as_str)
                && !["FieldValueInvalid", "FieldValueForbidden", "FieldValueRequired", "FieldValueDuplicate"]
                    .contains(&reason)
            {
                self.report(
                    Kind::Cel,
                    path,
                    format!("rule `{rule}`: reason {reason:?} is not one the API server accepts"),
                );
            }
            if let Some(field_path) = r.get("fieldPath").and_then(Value::as_str) {
                let mut at = &schema;
                for part in field_path.strip_prefix('.').unwrap_or("<no leading dot>").split('.') {
                    at = &at["properties"][part];
                }
                if at.is_null() {
                    self.report(Kind::Cel, path, format!("rule `{rule}`: fieldPath {field_path:?} names no field"));
                }
            }
            // Its cost heuristic only: kube-cel 0.8's scope check (`analyze_rule`) takes a
            // comprehension's variables (`m` in `self.mix.map(m, …)`) for unknown ones.
            for w in estimate_rule_cost(rule, &compiled) {
                self.report(Kind::Cel, path, format!("rule `{rule}`: kube-cel: {}", w.message));
            }
            self.rule_reach(rule, path);
            if let Some(expr) = r.get("messageExpression").and_then(Value::as_str) {
                self.rule_reach(expr, path);
            }
        }
    }

    /// A rough cost check of one expression at `path`: it reads nothing unbounded.
    fn rule_reach(&mut self, expr: &str, path: &str) {
        let prefix = if path.is_empty() { String::new() } else { format!("{path}.") };
        for e in self.embedded {
            let Some(below) = e.strip_prefix(&prefix) else { continue };
            let field = below.split(['.', '[', '{']).next().unwrap_or(below);
            if mentions(expr, field) {
                self.report(
                    Kind::Cel,
                    path,
                    format!("`{expr}` reads `{field}`, which holds the unbounded embedded type at {e}"),
                );
            }
        }
        if expr.contains("string(") && STRING_FUNCTIONS.iter().any(|f| expr.contains(f)) {
            match self.known_unbounded_rules.iter().copied().find(|k| expr.contains(k)) {
                Some(k) => _ = self.known_seen.insert(k),
                None => self.report(
                    Kind::Cel,
                    path,
                    format!(
                        "`{expr}` applies a string function to string(…), whose size the API server's cost \
                         estimator cannot bound: test the type instead, e.g. `type(self) == string && self.matches(…)`"
                    ),
                ),
            }
        }
    }

    fn default(&mut self, schema: &Value, default: &Value, path: &str) {
        let mut errors = Vec::new();
        check_value(schema, default, "", &mut errors);
        for e in errors {
            self.report(Kind::Default, path, format!("default {default}: {e}"));
        }
        // The API server evaluates the node's rules on its default, with oldSelf bound
        // to the default too.
        if let Err(errs) = Validator::new().validate(schema, default, Some(default)) {
            self.report(Kind::Default, path, format!("default {default} fails its CEL rules: {errs}"));
        }
    }
}

/// Validates `value` against `schema` as the API server validates a default; `at` is
/// the position inside the value.
fn check_value(schema: &Value, value: &Value, at: &str, errors: &mut Vec<String>) {
    let mut bad = |m: String| errors.push(if at.is_empty() { m } else { format!("{at}: {m}") });
    if value.is_null() {
        if schema.get("nullable").and_then(Value::as_bool) != Some(true) {
            bad("null, but the node is not nullable".into());
        }
        return;
    }
    if schema.get("x-kubernetes-int-or-string").and_then(Value::as_bool) == Some(true)
        && !(value.is_string() || value.is_i64() || value.is_u64())
    {
        bad(format!("{value} is neither an integer nor a string"));
    }
    let ty = schema.get("type").and_then(Value::as_str);
    let type_ok = match ty {
        None => true,
        Some("string") => value.is_string(),
        Some("integer") => value.is_i64() || value.is_u64(),
        Some("number") => value.is_number(),
        Some("boolean") => value.is_boolean(),
        Some("object") => value.is_object(),
        Some("array") => value.is_array(),
        Some(_) => false,
    };
    if !type_ok {
        bad(format!("{value} is not of type {}", ty.unwrap_or("?")));
        return;
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        bad(format!("{value} is not one of the enum {allowed:?}"));
    }
    let num = |k: &str| schema.get(k).and_then(Value::as_f64);
    let flag = |k: &str| schema.get(k).and_then(Value::as_bool) == Some(true);
    if let Some(x) = value.as_f64() {
        if let Some(min) = num("minimum")
            && (x < min || (flag("exclusiveMinimum") && x == min))
        {
            bad(format!("{x} is below the minimum {min}"));
        }
        if let Some(max) = num("maximum")
            && (x > max || (flag("exclusiveMaximum") && x == max))
        {
            bad(format!("{x} is above the maximum {max}"));
        }
    }
    let count = |k: &str| schema.get(k).and_then(Value::as_u64).map(|n| n as usize);
    let mut sized = |what: &str, len: usize, min: &str, max: &str| {
        if count(min).is_some_and(|m| len < m) {
            bad(format!("{len} {what} is below {min} {}", count(min).unwrap()));
        }
        if count(max).is_some_and(|m| len > m) {
            bad(format!("{len} {what} is above {max} {}", count(max).unwrap()));
        }
    };
    match value {
        Value::String(s) => sized("characters", s.chars().count(), "minLength", "maxLength"),
        Value::Array(a) => {
            sized("items", a.len(), "minItems", "maxItems");
            if let Some(items) = schema.get("items") {
                for (i, v) in a.iter().enumerate() {
                    check_value(items, v, &format!("{at}[{i}]"), errors);
                }
            }
        }
        Value::Object(o) => {
            sized("properties", o.len(), "minProperties", "maxProperties");
            for r in schema.get("required").and_then(Value::as_array).into_iter().flatten() {
                if !r.as_str().is_some_and(|r| o.contains_key(r)) {
                    errors.push(format!("{at}: required field {r} is missing"));
                }
            }
            let props = schema.get("properties").and_then(Value::as_object);
            let values = schema.get("additionalProperties").filter(|v| v.is_object());
            let preserve = schema.get("x-kubernetes-preserve-unknown-fields").and_then(Value::as_bool) == Some(true);
            for (k, v) in o {
                let at = child(at, k);
                match (props.and_then(|p| p.get(k)), values) {
                    (Some(s), _) | (None, Some(s)) => check_value(s, v, &at, errors),
                    (None, None) if preserve => {}
                    (None, None) => errors.push(format!("{at}: unknown field (a default must be pruned)")),
                }
            }
        }
        _ => {}
    }
}

fn crd_schema() -> Value {
    let crd = TrainingRun::crd();
    let version = &crd.spec.versions[0];
    serde_json::to_value(version.schema.as_ref().unwrap().open_api_v3_schema.as_ref().unwrap()).unwrap()
}

fn problems(kind: Kind) -> Vec<String> {
    let all = Walker::new(EMBEDDED, KNOWN_UNBOUNDED_RULES).run(&crd_schema());
    all.iter().filter(|p| p.kind == kind).map(|p| p.to_string()).collect()
}

fn assert_none(kind: Kind, what: &str) {
    let found = problems(kind);
    assert!(found.is_empty(), "{what}:\n  {}", found.join("\n  "));
}

#[test]
fn every_string_list_and_map_of_our_types_is_bounded() {
    assert_none(
        Kind::Bounds,
        "unbounded strings, lists or maps (add a bound from crds::types::bounds; an embedded \
         Kubernetes type goes in EMBEDDED)",
    );
}

#[test]
fn the_schema_is_structural() {
    assert_none(Kind::Structure, "the API server would refuse this schema");
}

#[test]
fn every_default_validates_against_its_own_schema() {
    assert_none(Kind::Default, "the API server refuses a CRD whose defaults do not validate");
}

#[test]
fn every_cel_rule_compiles_and_reads_only_bounded_inputs() {
    assert_none(Kind::Cel, "CEL rules the API server would refuse or could not bound");
}

/// The bounds a user meets first, and the ones `resolve` checks as well: `trainer run`
/// must accept what the API server accepts, and refuse no less.
#[test]
fn bounds_agree_with_what_resolve_accepts() {
    let schema = crd_schema();
    let spec = &schema["properties"]["spec"]["properties"];
    let max =
        |node: &Value, key: &str| node[key].as_u64().unwrap_or_else(|| panic!("{key} missing in {node}")) as usize;
    assert_eq!(max(&spec["data"]["properties"]["mix"], "maxItems"), bounds::MIX_SOURCES);
    assert_eq!(bounds::MIX_SOURCES, 64);
    assert_eq!(max(&spec["queueName"], "maxLength"), bounds::DNS_LABEL);
    assert_eq!(max(&spec["initFrom"]["properties"]["trainingRun"], "maxLength"), crds::resolve::MAX_NAME_LEN);

    let run = |patch: &dyn Fn(&mut Value)| {
        let mut v = json!({
            "apiVersion": "training.puretransformer.dev/v1alpha1",
            "kind": "TrainingRun",
            "metadata": {"name": "r"},
            "spec": {
                "model": {"preset": "micro"},
                "tokens": "1M",
                "data": {"mix": [{"name": "a", "weight": 1.0, "uri": "embedded:textbook"}]},
                "batch": {"globalTokens": 8192, "microBatch": 8, "seqLength": 256}
            }
        });
        patch(&mut v);
        crds::resolve(&serde_json::from_value::<TrainingRun>(v).unwrap())
    };
    let names = |field: &str, patch: &dyn Fn(&mut Value)| run(patch).err().is_some_and(|e| e.names(field));
    assert!(run(&|_| {}).is_ok(), "{:?}", run(&|_| {}).err());

    // A full mix: as many sources as the schema allows.
    let full: Vec<Value> = (0..bounds::MIX_SOURCES)
        .map(|i| json!({"name": format!("s{i}"), "weight": 1.0 / bounds::MIX_SOURCES as f64, "uri": "embedded:textbook"}))
        .collect();
    assert!(
        !names("spec.data", &|v| v["spec"]["data"]["mix"] = Value::Array(full.clone())),
        "resolve refuses a full mix"
    );

    // queueName: a label value, at most 63 characters.
    let queue = |n: usize| move |v: &mut Value| v["spec"]["queueName"] = json!("q".repeat(n));
    assert!(!names("spec.queueName", &queue(bounds::DNS_LABEL)));
    assert!(names("spec.queueName", &queue(bounds::DNS_LABEL + 1)));

    // initFrom.trainingRun: a TrainingRun's name.
    let init = |n: usize| move |v: &mut Value| v["spec"]["initFrom"] = json!({"trainingRun": "i".repeat(n)});
    assert!(!names("spec.initFrom.trainingRun", &init(bounds::TRAINING_RUN_NAME)));
    assert!(names("spec.initFrom.trainingRun", &init(bounds::TRAINING_RUN_NAME + 1)));
}

/// The walker finds what it is meant to find, each problem by its path.
#[test]
fn the_walker_reports_each_kind_of_problem() {
    let bad = json!({
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "x-kubernetes-validations": [
                    {"rule": "self.name.startsWith('x')"},
                    {"rule": "has(self.pod.x)"},
                    {"rule": "string(self.count).matches('^[0-9]+$')", "fieldPath": ".nope"}
                ],
                "properties": {
                    "name": {"type": "string"},
                    "count": {"type": "integer", "default": 0, "minimum": 1},
                    "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}},
                    "labels": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 8}},
                    "mixed": {
                        "type": "object",
                        "properties": {"a": {"type": "integer"}},
                        "additionalProperties": {"type": "integer"},
                        "maxProperties": 4
                    },
                    "mode": {"type": "string", "enum": ["a", "b"], "default": "c"},
                    "size": {"type": "string", "x-kubernetes-int-or-string": true, "maxLength": 8},
                    "typeless": {"description": "no type"},
                    "other": {"$ref": "#/definitions/Other"},
                    "list": {"type": "array", "maxItems": 2},
                    "pod": {"type": "object", "properties": {"x": {"type": "string"}}}
                }
            }
        }
    });
    let found: Vec<String> = Walker::new(&["spec.pod", "spec.gone"], &["never.matches("])
        .run(&bad)
        .iter()
        .map(|p| format!("{:?} {p}", p.kind))
        .collect();
    let expect = [
        "Bounds spec.name: string without maxLength (in reach of the CEL rules at spec)",
        "Bounds spec.tags: array without maxItems (in reach of the CEL rules at spec)",
        "Bounds spec.labels: map without maxProperties (in reach of the CEL rules at spec)",
        "Structure spec.mixed: additionalProperties beside properties",
        "Default spec.mode: default \"c\": \"c\" is not one of the enum",
        "Default spec.count: default 0: 0 is below the minimum 1",
        "Structure spec.size: x-kubernetes-int-or-string must not have a `type`",
        "Structure spec.typeless: has no `type`",
        "Structure spec.other: `$ref` is not allowed in a CRD schema: a CRD schema must be inlined",
        "Structure spec.other: has no `type`",
        "Structure spec.list: an array must have `items`",
        "Cel spec: `has(self.pod.x)` reads `pod`, which holds the unbounded embedded type at spec.pod",
        "Cel spec: `string(self.count).matches('^[0-9]+$')` applies a string function to string(…)",
        "Cel spec: rule `string(self.count).matches('^[0-9]+$')`: fieldPath \".nope\" names no field",
        "Bounds spec.gone: is in EMBEDDED but not in the schema",
        "Cel <root>: no rule contains \"never.matches(\" any more",
    ];
    for e in expect {
        assert!(found.iter().any(|f| f.starts_with(e)), "expected {e:?} among:\n  {}", found.join("\n  "));
    }
    // Nothing under the embedded subtree is a bounds problem.
    assert!(!found.iter().any(|f| f.starts_with("Bounds spec.pod")), "{found:#?}");
    assert_eq!(found.len(), expect.len(), "unexpected extra problems:\n  {}", found.join("\n  "));
}

/// No false alarms: a schema that follows every rule passes.
#[test]
fn a_bounded_structural_schema_passes() {
    let good = json!({
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "x-kubernetes-validations": [{"rule": "self.items.all(i, i.name.size() > 0)", "fieldPath": ".items"}],
                "required": ["items"],
                "properties": {
                    "items": {
                        "type": "array",
                        "maxItems": 4,
                        "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["name"],
                        "items": {
                            "type": "object",
                            "required": ["name"],
                            "properties": {"name": {"type": "string", "maxLength": 8}}
                        }
                    },
                    "size": {"x-kubernetes-int-or-string": true, "default": "1Gi"},
                    "labels": {
                        "type": "object",
                        "maxProperties": 4,
                        "additionalProperties": {"type": "string", "maxLength": 8},
                        "default": {"a": "b"}
                    },
                    "when": {"type": "string", "format": "date-time"},
                    "mode": {"type": "string", "enum": ["a", "b"], "default": "a"},
                    "opt": {"type": "integer", "nullable": true, "minimum": 0, "default": 3}
                }
            }
        }
    });
    let found: Vec<String> = Walker::new(&[], &[]).run(&good).iter().map(|p| p.to_string()).collect();
    assert!(found.is_empty(), "{found:#?}");
}
