//! Runs for the builders' and the pipeline's unit tests.

use crds::TrainingRun;

/// A run as the API server would hand it over: namespace and uid set.
pub fn run(yaml_spec: &str) -> TrainingRun {
    let text = format!(
        "apiVersion: training.puretransformer.dev/v1alpha1\nkind: TrainingRun\nmetadata: {{name: llm, namespace: ml, uid: 0d5c-uid, generation: 1}}\nspec:\n{yaml_spec}"
    );
    crds::manifest::from_yaml(&text, "test").unwrap_or_else(|e| panic!("{e}"))
}

/// GRPO from the final checkpoint of the run `base`.
pub const GRPO_SPEC: &str = "  phase: grpo
  model: {preset: tiny}
  tokens: 1M
  topology: {nodes: 1, gpusPerNode: 1}
  batch: {microBatch: 16, seqLength: 512}
  initFrom: {trainingRun: base}
  grpo: {dataset: embedded:mcq, maxNewTokens: 64}
";

pub const GPU_SPEC: &str = "  model: {preset: tiny}
  tokens: 64M
  data:
    mix:
      - {name: web, weight: 0.75, uri: embedded:textbook}
      - {name: qa, weight: 0.25, uri: pvc://datasets/usmle}
  topology: {nodes: 2, gpusPerNode: 4}
  batch: {globalTokens: 262144, microBatch: 8, seqLength: 1024}
";
