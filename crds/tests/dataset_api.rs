//! The TrainingDataset CRD: names, columns, docs, and every CEL rule (evaluated
//! client-side with kube-cel; the real API server judges the same rules in e2e).

use crds::types::{DatasetPhase, TrainingDataset, TrainingDatasetSpec};
use kube::CustomResourceExt;
use serde_json::{Value, json};

mod common;

fn schema() -> Value {
    common::schema(&TrainingDataset::crd())
}

fn base() -> Value {
    json!({
        "apiVersion": "training.puretransformer.dev/v1alpha1",
        "kind": "TrainingDataset",
        "metadata": {"name": "fineweb-edu"},
        "spec": {
            "source": {"uris": ["s3://raw/fineweb-edu/sample-10BT/*.parquet"]},
            "tokenizer": {"embedded": true},
            "output": "s3://prepared/fineweb-edu",
            "workers": 4
        }
    })
}

fn cel(obj: &Value, old: Option<&Value>) -> Result<(), String> {
    kube::core::cel::Validator::new().validate(&schema(), obj, old).map_err(|e| e.to_string())
}

fn patched(patch: impl FnOnce(&mut Value)) -> Value {
    let mut v = base();
    patch(&mut v);
    v
}

fn rejects(obj: Value, old: Option<&Value>, needle: &str) {
    let err = cel(&obj, old).expect_err("the API server would reject this");
    assert!(err.contains(needle), "expected {needle:?} in {err}");
}

#[test]
fn names_scope_and_status_subresource() {
    let crd = TrainingDataset::crd();
    assert_eq!(crd.metadata.name.as_deref(), Some("trainingdatasets.training.puretransformer.dev"));
    assert_eq!(crd.spec.scope, "Namespaced");
    assert_eq!(crd.spec.names.kind, "TrainingDataset");
    assert_eq!(crd.spec.names.short_names.as_deref(), Some(&["tds".to_string()][..]));
    assert!(crd.spec.versions[0].subresources.as_ref().unwrap().status.is_some());
}

#[test]
fn printer_columns_read_status_fields_in_the_schema() {
    let crd = TrainingDataset::crd();
    let shown = common::shown_columns(&crd);
    let names: Vec<&str> = shown.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["PHASE", "PROGRESS", "TOKENS", "SHARDS", "AGE"]);
    common::assert_status_paths_exist(&crd, &shown);
}

#[test]
fn every_field_is_documented() {
    let missing = common::undocumented_fields(&schema());
    assert!(missing.is_empty(), "fields without docs (kubectl explain shows nothing): {missing:?}");
}

#[test]
fn the_base_object_passes_and_defaults_apply() {
    cel(&base(), None).unwrap();
    let d: TrainingDataset = serde_json::from_value(base()).unwrap();
    let TrainingDatasetSpec { workers, validation_fraction, max_failed_files, max_retries, .. } = d.spec;
    assert_eq!((workers, validation_fraction, max_failed_files, max_retries), (4, 0.005, 0, 3));
    assert_eq!(d.spec.source.field, "text");
    let status: crds::types::TrainingDatasetStatus =
        serde_json::from_value(json!({"phase": "Ready", "shards": 12})).unwrap();
    assert_eq!(status.phase, Some(DatasetPhase::Ready));
}

#[test]
fn output_and_source_uris_name_a_store() {
    rejects(
        patched(|v| v["spec"]["output"] = json!("/data/out")),
        None,
        "output must be s3://bucket/prefix or pvc://claim/path",
    );
    cel(&patched(|v| v["spec"]["output"] = json!("pvc://datasets/fineweb-edu")), None).unwrap();
    rejects(
        patched(|v| v["spec"]["source"]["uris"] = json!(["s3://raw/a/*.parquet", "ftp://x/y"])),
        None,
        "each source uri must start with s3://, pvc:// or https://",
    );
    cel(
        &patched(|v| {
            v["spec"]["source"]["uris"] = json!(["pvc://raw/usmle/**/*.jsonl", "https://example.org/a.jsonl"])
        }),
        None,
    )
    .unwrap();
}

#[test]
fn the_tokenizer_names_exactly_one_origin() {
    let msg = "set exactly one of tokenizer.uri, tokenizer.embedded and tokenizer.train";
    rejects(patched(|v| v["spec"]["tokenizer"] = json!({})), None, msg);
    rejects(patched(|v| v["spec"]["tokenizer"] = json!({"embedded": false})), None, msg);
    rejects(
        patched(|v| v["spec"]["tokenizer"] = json!({"uri": "s3://t/tokenizer.json", "train": {"vocabSize": 32000}})),
        None,
        msg,
    );
    cel(&patched(|v| v["spec"]["tokenizer"] = json!({"uri": "s3://t/tokenizer.json"})), None).unwrap();
    cel(&patched(|v| v["spec"]["tokenizer"] = json!({"train": {"vocabSize": 32000, "sampleBytes": "1B"}})), None)
        .unwrap();
    rejects(
        patched(|v| v["spec"]["tokenizer"] = json!({"train": {"vocabSize": 100}})),
        None,
        "vocabSize must be in [260, 1048576]",
    );
}

#[test]
fn workers_and_the_validation_fraction_are_bounded() {
    rejects(patched(|v| v["spec"]["workers"] = json!(0)), None, "workers must be in [1, 256]");
    rejects(patched(|v| v["spec"]["workers"] = json!(257)), None, "workers must be in [1, 256]");
    rejects(patched(|v| v["spec"]["validationFraction"] = json!(1.0)), None, "validationFraction must be in [0, 1)");
    cel(&patched(|v| v["spec"]["validationFraction"] = json!(0.0)), None).unwrap();
}

#[test]
fn what_the_manifest_describes_is_immutable_and_workers_may_change() {
    let old = base();
    rejects(patched(|v| v["spec"]["source"]["field"] = json!("content")), Some(&old), "source is immutable");
    rejects(
        patched(|v| v["spec"]["tokenizer"] = json!({"uri": "s3://t/tokenizer.json"})),
        Some(&old),
        "tokenizer is immutable",
    );
    rejects(patched(|v| v["spec"]["output"] = json!("s3://prepared/other")), Some(&old), "output is immutable");
    cel(&patched(|v| v["spec"]["workers"] = json!(8)), Some(&old)).unwrap();
}
