//! What the operator test suites do to TrainingRuns as a user would: apply, edit,
//! read status.
#![allow(dead_code)]

pub mod harness;

use crds::types::TrainingRunStatus;
use e2e::fake_api::FakeApi;
use serde_json::{Value, json};

pub const NS: &str = "ml";
pub const TR: &str = "training.puretransformer.dev/v1alpha1";

/// `kubectl apply` of a TrainingRun; `spec` is YAML indented by two spaces.
pub fn apply(fake: &FakeApi, name: &str, spec: &str) {
    // Parsed as a whole manifest, so defaults and field names are the CRD crate's.
    let manifest = format!("apiVersion: {TR}\nkind: TrainingRun\nmetadata: {{name: {name}}}\nspec:\n{spec}");
    let run = crds::manifest::from_yaml(&manifest, name).unwrap_or_else(|e| panic!("{e}"));
    let spec = serde_json::to_value(run.spec).unwrap();
    fake.insert(
        json!({"apiVersion": TR, "kind": "TrainingRun", "metadata": {"name": name, "namespace": NS}, "spec": spec}),
    );
}

/// `kubectl edit`: changes the spec and bumps the generation.
pub fn edit_spec(fake: &FakeApi, name: &str, f: impl FnOnce(&mut Value)) {
    fake.update_with(TR, "TrainingRun", Some(NS), name, |o| {
        f(&mut o["spec"]);
        let g = o["metadata"]["generation"].as_i64().unwrap_or(1);
        o["metadata"]["generation"] = json!(g + 1);
    })
    .unwrap();
}

pub fn status(fake: &FakeApi, name: &str) -> TrainingRunStatus {
    let run = fake.get(TR, "TrainingRun", Some(NS), name).unwrap_or_else(|| panic!("TrainingRun {name} exists"));
    serde_json::from_value(run["status"].clone()).unwrap_or_default()
}

/// (status, reason, message) of a condition.
pub fn condition(fake: &FakeApi, name: &str, type_: &str) -> (String, String, String) {
    let s = status(fake, name);
    let c = s.conditions.iter().find(|c| c.type_ == type_).unwrap_or_else(|| panic!("{name} has no {type_} condition"));
    (c.status.clone(), c.reason.clone(), c.message.clone())
}
