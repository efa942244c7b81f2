//! Values for property tests, generated from the API's own JSON schemas: every field a
//! type declares is generated, so a new field is covered without a new test.
//!
//! [`values`] draws any value a schema describes (and some it does not: wrong types,
//! out-of-range numbers, hostile strings), [`mutations`] keeps most of a valid
//! document and redraws some of its fields, so that generated specs get past the first
//! error and reach the deep checks.

use proptest::prelude::*;
use serde_json::{Map, Value};

/// How deep [`values`] builds objects and lists before it draws only scalars.
const MAX_DEPTH: u32 = 6;

/// Strings a TrainingRun's fields hold, valid and not: URIs of every scheme, quantities,
/// durations, memory sizes, preset and enum-like names, and hostile text.
const STRINGS: &[&str] = &[
    "",
    " ",
    "embedded:textbook",
    "embedded:mcq",
    "embedded:nope",
    "s3://bucket/prefix",
    "s3://bucket/a/../../x",
    "s3:///nobucket",
    "pvc://claim/path",
    "pvc://claim/../x",
    "/abs/path",
    "../relative",
    "gs://other/scheme",
    "1",
    "0",
    "-1",
    "64",
    "1K",
    "1.5B",
    "11B",
    "99999999999T",
    "0.0001K",
    "1e3",
    "10s",
    "1m",
    "30m",
    "1h30m",
    "soon",
    "48Gi",
    "80GB",
    "nano",
    "micro",
    "tiny",
    "small",
    "llama3-1b",
    "bf16",
    "f32",
    "pretrain",
    "grpo",
    "restart",
    "rollback",
    "fail",
    "nvidia.com/gpu",
    "a-very-long-name-that-is-longer-than-any-kubernetes-name-allows-to-be-used",
    "\u{0}",
    "ünïcødé ✓",
];

/// `T`'s JSON schema with every subschema inlined, as [`values`] reads it.
pub fn schema_of<T: schemars::JsonSchema>() -> Value {
    let generator =
        schemars::generate::SchemaSettings::draft2020_12().with(|s| s.inline_subschemas = true).into_generator();
    serde_json::to_value(generator.into_root_schema_for::<T>()).expect("a schema serializes")
}

/// Any value `schema` describes (inlined, without `$ref`s), and some near it.
pub fn values(schema: &Value, depth: u32) -> BoxedStrategy<Value> {
    let node = match schema.as_object() {
        Some(node) => node,
        None => return scalars().boxed(),
    };
    if let Some(constant) = node.get("const") {
        return prop_oneof![12 => Just(constant.clone()), 1 => scalars()].boxed();
    }
    if let Some(options) = node.get("enum").and_then(Value::as_array).filter(|o| !o.is_empty()) {
        let options = options.clone();
        return prop_oneof![8 => proptest::sample::select(options), 1 => strings()].boxed();
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(branches) = node.get(key).and_then(Value::as_array).filter(|b| !b.is_empty()) {
            let typed: Vec<BoxedStrategy<Value>> = branches
                .iter()
                .filter(|b| b.get("type").is_some() || b.get("const").is_some())
                .map(|b| values(b, depth))
                .collect();
            if !typed.is_empty() {
                return proptest::strategy::Union::new(typed).boxed();
            }
        }
    }
    if node.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        return prop_oneof![integers(), strings()].boxed();
    }
    let kind = match node.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(Value::Array(types)) => types.iter().filter_map(Value::as_str).find(|t| *t != "null").unwrap_or("null"),
        _ => "any",
    };
    let typed = match kind {
        "object" if depth < MAX_DEPTH => objects(node, depth),
        "array" if depth < MAX_DEPTH => {
            let items = node.get("items").cloned().unwrap_or(Value::Bool(true));
            proptest::collection::vec(values(&items, depth + 1), 0..4).prop_map(Value::Array).boxed()
        }
        "string" => strings().boxed(),
        "integer" => {
            let bound = |key: &str| node.get(key).and_then(Value::as_f64);
            let unsigned = node.get("format").and_then(Value::as_str).is_some_and(|f| f.starts_with("uint"));
            let wide = node.get("format").and_then(Value::as_str).is_some_and(|f| f.ends_with("64"));
            let lo = bound("minimum").map_or(if unsigned { 0 } else { -1_000 }, |m| m as i64);
            let hi = bound("maximum").map_or(if wide { 1 << 40 } else { i64::from(u32::MAX) }, |m| m as i64);
            prop_oneof![8 => (lo..=hi.max(lo)).prop_map(Value::from), 1 => integers()].boxed()
        }
        "number" => numbers().boxed(),
        "boolean" => any::<bool>().prop_map(Value::Bool).boxed(),
        _ => scalars().boxed(),
    };
    // Now and then, a value of the wrong type.
    prop_oneof![40 => typed, 1 => scalars()].boxed()
}

fn objects(node: &Map<String, Value>, depth: u32) -> BoxedStrategy<Value> {
    let required: Vec<&str> =
        node.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
    let fields: Vec<BoxedStrategy<Option<(String, Value)>>> = node
        .get("properties")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(name, schema)| {
            let present = if required.contains(&name.as_str()) { 0.97 } else { 0.5 };
            let name = name.clone();
            proptest::option::weighted(present, values(schema, depth + 1).prop_map(move |v| (name.clone(), v))).boxed()
        })
        .collect();
    let extra = match node.get("additionalProperties") {
        Some(schema @ Value::Object(_)) => {
            proptest::collection::btree_map("[a-z][a-z0-9-]{0,8}", values(schema, depth + 1), 0..3).boxed()
        }
        _ => Just(Default::default()).boxed(),
    };
    (fields, extra)
        .prop_map(|(fields, extra)| {
            let mut object: Map<String, Value> = extra.into_iter().collect();
            object.extend(fields.into_iter().flatten());
            Value::Object(object)
        })
        .boxed()
}

/// `base` with some of its fields (at any depth) redrawn from `schema`, some removed
/// and some added.
pub fn mutations(base: Value, schema: &Value, depth: u32) -> BoxedStrategy<Value> {
    let redraw = values(schema, depth);
    let keep = match (&base, schema.get("properties").and_then(Value::as_object)) {
        (Value::Object(fields), Some(properties)) if depth < MAX_DEPTH => {
            // Fields the schema leaves out (apiVersion, kind, metadata) are kept as they are.
            let unschemed: Vec<BoxedStrategy<Option<(String, Value)>>> = fields
                .iter()
                .filter(|(name, _)| !properties.contains_key(*name))
                .map(|(name, v)| Just(Some((name.clone(), v.clone()))).boxed())
                .collect();
            let each: Vec<BoxedStrategy<Option<(String, Value)>>> = properties
                .iter()
                .map(|(name, field_schema)| {
                    let name = name.clone();
                    let drawn = {
                        let name = name.clone();
                        values(field_schema, depth + 1).prop_map(move |v| Some((name.clone(), v)))
                    };
                    match fields.get(&name) {
                        Some(v) => {
                            let kept = mutations(v.clone(), field_schema, depth + 1)
                                .prop_map(move |v| Some((name.clone(), v)));
                            prop_oneof![150 => kept, 1 => Just(None), 1 => drawn].boxed()
                        }
                        None => prop_oneof![150 => Just(None), 1 => drawn].boxed(),
                    }
                })
                .chain(unschemed)
                .collect();
            each.prop_map(|fields| Value::Object(fields.into_iter().flatten().collect())).boxed()
        }
        (Value::Array(items), _) if depth < MAX_DEPTH => {
            let item_schema = schema.get("items").cloned().unwrap_or(Value::Bool(true));
            let each: Vec<BoxedStrategy<Value>> =
                items.iter().map(|v| mutations(v.clone(), &item_schema, depth + 1)).collect();
            each.prop_map(Value::Array).boxed()
        }
        _ => Just(base).boxed(),
    };
    prop_oneof![150 => keep, 1 => redraw].boxed()
}

fn strings() -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => proptest::sample::select(STRINGS).prop_map(|s| Value::String(s.into())),
        1 => "\\PC{0,24}".prop_map(Value::String),
        1 => "[0-9]{1,22}(\\.[0-9]{1,4})?[kKmMbBtTgGi]{0,2}".prop_map(Value::String),
    ]
}

fn integers() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => (0i64..5_000).prop_map(Value::from),
        1 => any::<i64>().prop_map(Value::from),
        1 => any::<u64>().prop_map(Value::from),
        1 => proptest::sample::select(vec![0i64, 1, -1, i64::from(u32::MAX), i64::from(u32::MAX) + 1, i64::MAX])
            .prop_map(Value::from),
    ]
}

fn numbers() -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => (0.0f64..1.0).prop_map(Value::from),
        1 => any::<f64>().prop_filter("JSON numbers are finite", |f| f.is_finite()).prop_map(Value::from),
        1 => proptest::sample::select(vec![0.0, -1.0, 1.0, 1e-300, 1e300, -0.0]).prop_map(Value::from),
    ]
}

fn scalars() -> impl Strategy<Value = Value> {
    prop_oneof![
        strings(),
        integers(),
        numbers(),
        any::<bool>().prop_map(Value::Bool),
        Just(Value::Null),
        Just(Value::Array(Vec::new())),
        Just(Value::Object(Map::new())),
    ]
}
