//! The CRD: freshness, shape, and every CEL rule (evaluated client-side with kube-cel,
//! schema defaults applied as the API server applies them).

use crds::TrainingRun;
use kube::CustomResourceExt;
use serde_json::{Value, json};

mod common;

fn schema() -> Value {
    common::schema(&TrainingRun::crd())
}

fn base() -> Value {
    json!({
        "apiVersion": "training.puretransformer.dev/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": "r"},
        "spec": {
            "model": {"preset": "micro"},
            "tokens": "1M",
            "data": {"mix": [
                {"name": "a", "weight": 0.45, "uri": "embedded:textbook"},
                {"name": "b", "weight": 0.25, "uri": "embedded:facts"},
                {"name": "c", "weight": 0.2, "uri": "embedded:arithmetic"},
                {"name": "d", "weight": 0.1, "uri": "embedded:mcq"}
            ]},
            "batch": {"globalTokens": 8192, "microBatch": 8, "seqLength": 256}
        }
    })
}

fn cel(obj: &Value, old: Option<&Value>) -> Result<(), String> {
    kube::core::cel::Validator::new().validate(&schema(), obj, old).map_err(|e| e.to_string())
}

fn with(mut v: Value, pointer: &str, new: Value) -> Value {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    let target = v.pointer_mut(parent).unwrap();
    match target {
        Value::Array(a) => a[key.parse::<usize>().unwrap()] = new,
        Value::Object(o) if new.is_null() => {
            o.remove(key);
        }
        Value::Object(o) => {
            o.insert(key.to_string(), new);
        }
        _ => panic!("{pointer}"),
    }
    v
}

fn rejects(obj: Value, old: Option<&Value>, needle: &str) {
    let err = cel(&obj, old).expect_err("the API server would reject this");
    assert!(err.contains(needle), "expected {needle:?} in {err}");
}

/// What `make crds` writes is what `crdgen` prints: the committed file must be its output.
#[test]
fn committed_crd_is_fresh() {
    let committed = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/trainingruns.yaml")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_crdgen")).output().expect("crdgen runs");
    assert!(out.status.success(), "crdgen failed: {}", String::from_utf8_lossy(&out.stderr));
    let printed = String::from_utf8(out.stdout).expect("crdgen prints UTF-8");
    assert_eq!(printed, crds::manifest::crd_yaml(), "crdgen prints the CRD");
    assert!(
        committed == printed,
        "crds/trainingruns.yaml is stale: run `make crds` (cargo run -p crds --bin crdgen > crds/trainingruns.yaml)"
    );
}

#[test]
fn committed_dataset_crd_is_fresh() {
    let committed = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/trainingdatasets.yaml")).unwrap();
    let out =
        std::process::Command::new(env!("CARGO_BIN_EXE_crdgen")).arg("trainingdatasets").output().expect("crdgen runs");
    assert!(out.status.success(), "crdgen failed: {}", String::from_utf8_lossy(&out.stderr));
    let printed = String::from_utf8(out.stdout).expect("crdgen prints UTF-8");
    assert_eq!(printed, crds::manifest::dataset_crd_yaml(), "crdgen prints the TrainingDataset CRD");
    assert!(committed == printed, "crds/trainingdatasets.yaml is stale: run `make crds`");
    let unknown = std::process::Command::new(env!("CARGO_BIN_EXE_crdgen")).arg("jobs").output().unwrap();
    assert_eq!(unknown.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no CRD named \"jobs\""));
}

#[test]
fn the_helm_chart_ships_the_same_crd() {
    let chart = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../charts/trainingrun-operator/crds/trainingruns.yaml"
    ))
    .unwrap();
    assert!(
        chart == crds::manifest::crd_yaml(),
        "charts/trainingrun-operator/crds/trainingruns.yaml differs from the CRD: run `make crds`"
    );
}

#[test]
fn crd_names_scope_and_subresource() {
    let crd = TrainingRun::crd();
    assert_eq!(crd.metadata.name.as_deref(), Some("trainingruns.training.puretransformer.dev"));
    assert_eq!(crd.spec.group, "training.puretransformer.dev");
    assert_eq!(crd.spec.scope, "Namespaced");
    assert_eq!(crd.spec.names.kind, "TrainingRun");
    assert_eq!(crd.spec.names.plural, "trainingruns");
    assert_eq!(crd.spec.names.short_names.as_deref(), Some(&["tr".to_string()][..]));
    let v = &crd.spec.versions[0];
    assert_eq!(v.name, "v1alpha1");
    assert!(v.subresources.as_ref().unwrap().status.is_some());
}

#[test]
fn printer_columns_read_status_fields() {
    let crd = TrainingRun::crd();
    let shown = common::shown_columns(&crd);
    let names: Vec<&str> = shown.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["PHASE", "MODEL", "TOPOLOGY", "PROGRESS", "LOSS", "TOKENS/S", "ETA", "AGE"]);
    for (name, path) in &shown {
        assert!(!path.contains("conditions"), "{name} reads conditions");
        if !matches!(name.as_str(), "MODEL" | "AGE") {
            assert!(path.starts_with(".status."), "{name} reads {path}");
        }
    }
    common::assert_status_paths_exist(&crd, &shown);
}

#[test]
fn every_field_is_documented() {
    let missing = common::undocumented_fields(&schema());
    assert!(missing.is_empty(), "fields without docs (kubectl explain shows nothing): {missing:?}");
}

#[test]
fn base_object_passes() {
    cel(&base(), None).unwrap();
}

#[test]
fn mix_weights_must_be_positive_and_sum_to_one() {
    rejects(with(base(), "/spec/data/mix/3/weight", json!(0.0)), None, "weight must be in (0, 1]");
    rejects(with(base(), "/spec/data/mix/3/weight", json!(-0.1)), None, "weight must be in (0, 1]");
    rejects(with(base(), "/spec/data/mix/3/weight", json!(0.2)), None, "mix weights must sum to 1");
    rejects(with(base(), "/spec/data/mix/0/weight", json!(0.4)), None, "mix weights must sum to 1");
    cel(&with(base(), "/spec/data/mix/3/weight", json!(0.1000005)), None).expect("within 1e-6");
}

#[test]
fn nodes_and_micro_batch_at_least_one() {
    rejects(with(base(), "/spec/topology", json!({"nodes": 0})), None, "nodes must be at least 1");
    cel(&with(base(), "/spec/topology", json!({"nodes": 4, "gpusPerNode": 2})), None).unwrap();
    rejects(with(base(), "/spec/batch/microBatch", json!(0)), None, "microBatch must be at least 1");
}

#[test]
fn grpo_present_exactly_when_phase_is_grpo() {
    let grpo = json!({"dataset": "embedded:mcq"});
    rejects(with(base(), "/spec/grpo", grpo.clone()), None, "spec.grpo must be set exactly when spec.phase is grpo");
    let phase_only = with(base(), "/spec/phase", json!("grpo"));
    rejects(phase_only.clone(), None, "spec.grpo must be set exactly when spec.phase is grpo");
    let ok = with(with(phase_only, "/spec/grpo", grpo), "/spec/batch/globalTokens", Value::Null);
    cel(&with(ok, "/spec/data", Value::Null), None).unwrap();
}

#[test]
fn pretrain_needs_data_and_global_tokens() {
    rejects(with(base(), "/spec/data", Value::Null), None, "spec.data is required");
    rejects(with(base(), "/spec/batch/globalTokens", Value::Null), None, "spec.batch.globalTokens is required");
}

#[test]
fn model_and_phase_are_immutable() {
    let old = base();
    rejects(with(base(), "/spec/model/preset", json!("tiny")), Some(&old), "model is immutable");
    rejects(with(base(), "/spec/model/layers", json!(3)), Some(&old), "model is immutable");
    let grpo = with(
        with(
            with(with(base(), "/spec/phase", json!("grpo")), "/spec/grpo", json!({"dataset": "embedded:mcq"})),
            "/spec/data",
            Value::Null,
        ),
        "/spec/batch/globalTokens",
        Value::Null,
    );
    rejects(grpo, Some(&old), "phase is immutable");
    // Everything else may change, e.g. the token budget.
    cel(&with(base(), "/spec/tokens", json!("2M")), Some(&old)).unwrap();
}

#[test]
fn token_quantities_are_checked() {
    // The API server applies `pattern` to strings and `minimum` to numbers of an
    // int-or-string node; kube's validator runs only CEL, so these are applied here.
    let accepts = |pointer: &str, v: &Value| {
        let node = schema().pointer(pointer).unwrap_or_else(|| panic!("{pointer}")).clone();
        assert_eq!(node["x-kubernetes-int-or-string"], true, "{pointer}");
        match v {
            Value::String(s) => {
                s.len() as u64 <= node["maxLength"].as_u64().unwrap()
                    && regex::Regex::new(node["pattern"].as_str().unwrap()).unwrap().is_match(s)
            }
            Value::Number(n) => n.as_f64().unwrap() >= node["minimum"].as_f64().unwrap(),
            _ => false,
        }
    };
    let fields = [
        "/properties/spec/properties/tokens",
        "/properties/spec/properties/batch/properties/globalTokens",
        "/properties/spec/properties/data/properties/validation/properties/tokens",
        "/properties/spec/properties/optimizer/properties/warmupTokens",
    ];
    for field in fields {
        for bad in
            [json!("11X"), json!(0), json!(-5), json!("8k tokens"), json!("0.0K"), json!("0"), json!("1."), json!("")]
        {
            assert!(!accepts(field, &bad), "{field} accepts {bad}");
        }
        for good in [json!("1.5B"), json!(1000000), json!("600M"), json!("0.5K"), json!("131072"), json!(1)] {
            assert!(accepts(field, &good), "{field} refuses {good}");
        }
    }
    cel(&with(base(), "/spec/tokens", json!("1.5B")), None).unwrap();
}

#[test]
fn init_from_names_exactly_one_source() {
    rejects(with(base(), "/spec/initFrom", json!({})), None, "exactly one of initFrom.trainingRun and initFrom.uri");
    rejects(
        with(base(), "/spec/initFrom", json!({"trainingRun": "a", "uri": "s3://b/c"})),
        None,
        "exactly one of initFrom.trainingRun and initFrom.uri",
    );
    cel(&with(base(), "/spec/initFrom", json!({"trainingRun": "a"})), None).unwrap();
}

#[test]
fn s3_mirror_needs_an_s3_uri() {
    let s3 = json!({"uri": "gs://bucket/x", "secretRef": {"name": "creds"}});
    rejects(with(base(), "/spec/checkpoint", json!({"s3": s3})), None, "uri must start with s3://");
}
