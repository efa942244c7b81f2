//! `trainer export --hf` as a transformers user meets it: for LLaMA, Qwen3 and GPT-2
//! runs on the embedded tokenizer, the export loads with `AutoTokenizer` and
//! `AutoModelForCausalLM`, runs in `pipeline("text-generation")`, and continues a
//! prompt greedily exactly as `trainer generate --temperature 0` does (the prepared
//! tokenizer's case is in `data.rs`). Needs the Python of `common::python`.

mod common;
use common::{check_hf_export, run_logged, scratch};

/// A few steps of a small model of `preset`'s family on the embedded data.
fn manifest(preset: &str, shape: &str) -> String {
    format!(
        r#"
apiVersion: training.puretransformer.dev/v1alpha1
kind: TrainingRun
metadata: {{name: export}}
spec:
  model: {{preset: {preset}, tokenizer: embedded, vocabSize: 2048, seqLength: 64, {shape}}}
  tokens: "2048"
  data:
    mix:
      - {{name: textbook, weight: 1, uri: "embedded:textbook"}}
    validation: {{everySteps: 0}}
  topology: {{nodes: 1, gpusPerNode: 0}}
  batch: {{globalTokens: 512, microBatch: 8, seqLength: 64}}
  optimizer: {{lr: 3.0e-3, warmupTokens: "512"}}
  precision: f32
"#
    )
}

#[test]
fn every_family_exports_for_transformers_with_its_tokenizer() {
    let dir = scratch("hf-export");
    let families = [
        ("llama", "nano", "layers: 2"),
        ("qwen3", "qwen3-1.8b", "layers: 2, dModel: 64, heads: 4, kvHeads: 2, dFf: 128"),
        ("gpt2", "gpt2-1b", "layers: 2, dModel: 64, heads: 4, dFf: 256"),
    ];
    let mut runs = Vec::new();
    for (family, preset, shape) in families {
        let run_dir = dir.join(family);
        std::fs::create_dir_all(&run_dir).unwrap();
        let (out, _) = run_logged(&run_dir, &manifest(preset, shape), &[]);
        assert!(out.status.success(), "{family}: {}", String::from_utf8_lossy(&out.stderr));
        runs.push(run_dir.join("out"));
    }
    let results = check_hf_export(&runs.iter().map(|p| p.as_path()).collect::<Vec<_>>(), "The cell", 24);
    let classes: Vec<&str> = results.iter().map(|r| r["class"].as_str().unwrap()).collect();
    assert_eq!(classes, ["LlamaForCausalLM", "Qwen3ForCausalLM", "GPT2LMHeadModel"]);
    for r in &results {
        assert_eq!(r["fast"], true, "the tokenizer.json loads as a fast tokenizer: {r}");
        assert!(r["new_tokens"].as_u64().unwrap() > 0, "{r}");
    }
    let files: Vec<String> = std::fs::read_dir(runs[0].with_file_name("hf-0"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "generation_config.json",
    ] {
        assert!(files.contains(&f.to_string()), "{f} missing: {files:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
