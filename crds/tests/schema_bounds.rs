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

use crds::TrainingRun;
use crds::types::TrainingDataset;
use crds::types::bounds;
use kube::CustomResourceExt;
use serde_json::{Value, json};

mod common;

#[path = "schema_bounds/walker.rs"]
mod walker;
use walker::{Kind, Walker};

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

/// The embedded Kubernetes types of the TrainingDataset CRD, as [`EMBEDDED`].
const DATASET_EMBEDDED: &[&str] = &[
    // core/v1 EnvVar
    "spec.env[*]",
    // core/v1 ResourceRequirements
    "spec.resources",
    // meta/v1 Condition
    "status.conditions[*]",
];

fn crd_schema() -> Value {
    common::schema(&TrainingRun::crd())
}

/// The problems of both CRDs, each prefixed with its kind.
fn problems(kind: Kind) -> Vec<String> {
    let crds =
        [("TrainingRun", TrainingRun::crd(), EMBEDDED), ("TrainingDataset", TrainingDataset::crd(), DATASET_EMBEDDED)];
    let mut out = Vec::new();
    for (name, crd, embedded) in crds {
        let all = Walker::new(embedded, KNOWN_UNBOUNDED_RULES).run(&common::schema(&crd));
        out.extend(all.iter().filter(|p| p.kind == kind).map(|p| format!("{name}: {p}")));
    }
    out
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
