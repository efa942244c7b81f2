//! The walker of `schema_bounds.rs`: every problem of a CRD's openAPIV3Schema that the
//! API server would refuse, named by its path (the kinds are described there).

use std::collections::BTreeSet;
use std::fmt;

use kube::core::cel::{Validator, compile_schema, estimate_rule_cost};
use serde_json::{Map, Value, json};

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
pub enum Kind {
    Bounds,
    Structure,
    Default,
    Cel,
}

#[derive(Debug)]
pub struct Problem {
    pub kind: Kind,
    pub path: String,
    pub message: String,
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

pub struct Walker<'a> {
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
    pub fn new(embedded: &'a [&'a str], known_unbounded_rules: &'a [&'a str]) -> Self {
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
    pub fn run(mut self, schema: &Value) -> Vec<Problem> {
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
