//! Manifest loading: errors name the file and the field.

const GOOD: &str = "apiVersion: training.puretransformer.dev/v1alpha1\nkind: TrainingRun\nmetadata: {name: r}\nspec:\n  model: {preset: micro}\n  tokens: 1M\n  data: {mix: [{name: a, weight: 1.0, uri: embedded:facts}]}\n  batch: {globalTokens: 8192, microBatch: 8}\n";

fn err(text: &str) -> String {
    crds::manifest::from_yaml(text, "runs/r.yaml").unwrap_err().to_string()
}

#[test]
fn good_manifest_loads() {
    let r = crds::manifest::from_yaml(GOOD, "runs/r.yaml").unwrap();
    assert_eq!(r.spec.model.preset, "micro");
}

#[test]
fn unknown_fields_are_named() {
    let e = err(&GOOD.replace("microBatch: 8", "microBatch: 8, microbatch: 4"));
    assert!(e.starts_with("runs/r.yaml: ") && e.contains("unknown field spec.batch.microbatch"), "{e}");
}

#[test]
fn type_errors_name_the_field() {
    let e = err(&GOOD.replace("microBatch: 8", "microBatch: eight"));
    assert!(e.contains("runs/r.yaml") && e.contains("spec.batch.microBatch"), "{e}");
    let e = err(&GOOD.replace("{preset: micro}", "{preset: micro, layers: -2}"));
    assert!(e.contains("spec.model.layers"), "{e}");
    let e = err(&GOOD.replace("tokens: 1M", ""));
    assert!(e.contains("tokens"), "{e}");
}

#[test]
fn wrong_kind_and_bad_yaml_are_named() {
    let e = err(&GOOD.replace("kind: TrainingRun", "kind: Job"));
    assert!(e.contains("runs/r.yaml") && e.contains("kind \"Job\""), "{e}");
    let e = err("spec: [unclosed");
    assert!(e.starts_with("runs/r.yaml: "), "{e}");
}

#[test]
fn missing_file_is_named() {
    let e = crds::manifest::from_file(std::path::Path::new("/nonexistent/run.yaml")).unwrap_err().to_string();
    assert!(e.contains("/nonexistent/run.yaml"), "{e}");
}
