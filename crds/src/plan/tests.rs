use super::activations::{Dtypes, per_token};
use super::*;
use crate::config::RunConfig;
use crate::presets::{ModelConfig, preset};
use crate::types::{Parallelism, Precision};

const GI: u64 = 1 << 30;

fn run(yaml_spec: &str) -> RunConfig {
    let yaml = format!(
        "apiVersion: training.puretransformer.dev/v1alpha1\nkind: TrainingRun\nmetadata: {{name: p}}\nspec:\n{yaml_spec}"
    );
    crate::resolve(&crate::manifest::from_yaml(&yaml, "plan test").unwrap()).unwrap()
}

/// LLaMA-3 2.2B on 2 GPUs at seed 003's batch, with `extra` spec lines.
fn llama3(extra: &str) -> RunConfig {
    run(&format!(
        "  model: {{preset: llama3-2.2b, tokenizer: embedded}}\n  tokens: 1B\n  data: {{mix: [{{name: a, weight: 1, uri: \"embedded:textbook\"}}]}}\n  topology: {{nodes: 1, gpusPerNode: 2}}\n  batch: {{globalTokens: 524288, microBatch: 4, seqLength: 2048}}\n{extra}"
    ))
}

#[test]
fn a_block_saves_what_its_layers_keep_per_token() {
    let f32 = Dtypes::of(Precision::F32, false);
    let nano = ModelConfig::from(preset("nano").unwrap());
    // d 128, 4 heads × 32, 2 KV heads, ff 384: norms 2·(128·4 + 4), rotated q and k, v,
    // output and its copy (2·128 + 2·64)·4 + lse 4·4, gate, up and SwiGLU 3·384·4,
    // residuals 2·128·4.
    assert_eq!(per_token(&nano, &f32), 2 * (512 + 4) + 384 * 4 + 16 + 3 * 384 * 4 + 1024);
    // Autocast keeps matmul outputs in bf16 and a bf16 copy of each norm output.
    let mixed = Dtypes::of(Precision::Bf16Mixed, true);
    assert_eq!(per_token(&nano, &mixed), 2 * (128 * 6 + 4) + 384 * 2 + 16 + 3 * 384 * 2 + 1024);
}

#[test]
fn each_stage_of_sharding_holds_less_per_rank() {
    let table: [(&str, u64); 4] = [("ddp", 2), ("zero1", 1), ("zero2", 1), ("fsdp", 1)];
    let plans: Vec<MemoryPlan> = table
        .iter()
        .map(|(p, _)| plan(&llama3(&format!("  parallelism: {p}\n  gradientCheckpointing: true\n"))))
        .collect();
    let weights = plans[0].peak.parameters;
    assert_eq!(weights, 4 * llama3("").params.total);
    for ((name, moments_per_weight), p) in table.iter().zip(&plans) {
        assert_eq!(p.peak.optimizer_state, moments_per_weight * weights, "{name}");
    }
    assert!(plans.windows(2).all(|w| w[0].needed() > w[1].needed()), "ddp > zero1 > zero2 > fsdp");
    // fsdp keeps half the parameters, and gathers the units that run.
    assert!(plans[3].peak.parameters < weights && plans[3].peak.parameters > weights / 2);
    // One rank shards nothing.
    let alone = run(
        "  model: {preset: nano, tokenizer: embedded}\n  tokens: 1M\n  data: {mix: [{name: a, weight: 1, uri: \"embedded:textbook\"}]}\n  topology: {nodes: 1, gpusPerNode: 1}\n  batch: {globalTokens: 2048, microBatch: 8, seqLength: 256}\n  parallelism: zero1\n",
    );
    assert_eq!(plan(&alone).parallelism, Parallelism::Ddp);
}

#[test]
fn checkpointing_trades_activations_for_a_recomputed_block() {
    let kept = plan(&llama3("  parallelism: zero1\n"));
    let recomputed = plan(&llama3("  parallelism: zero1\n  gradientCheckpointing: true\n"));
    let half = plan(&llama3("  parallelism: zero1\n  gradientCheckpointing: true\n  checkpointedBlocks: 15\n"));
    assert_eq!(kept.peak.activations, kept.activations_without_checkpointing);
    assert!(recomputed.needed() < half.needed() && half.needed() < kept.needed());
    assert!(kept.activations_without_checkpointing > 10 * kept.activations_with_checkpointing);
    assert_eq!(kept.allowance, CUDA_ALLOWANCE_BYTES);
}

#[test]
fn remedies_name_spec_fields_and_save_what_they_say() {
    let c = llama3("");
    let needed = plan(&c).needed();
    let fixes = remedies(&c);
    let changes: Vec<&str> = fixes.iter().map(|r| r.change.as_str()).collect();
    for want in [
        "spec.parallelism: zero1",
        "spec.parallelism: zero2",
        "spec.gradientCheckpointing: true",
        "spec.batch.microBatch: 2",
    ] {
        assert!(changes.contains(&want), "{changes:?}");
    }
    assert!(fixes.windows(2).all(|w| w[0].saves >= w[1].saves), "largest first");
    let mut zero1 = c.clone();
    zero1.parallelism = Parallelism::Zero1;
    let saves = fixes.iter().find(|r| r.change == "spec.parallelism: zero1").unwrap().saves;
    assert_eq!(saves, needed - plan(&zero1).needed());
    let why = shortfall(&c, 48 * GI).unwrap();
    assert!(why.starts_with(&format!("needs {} per GPU, has 48.0 GiB; ", gib(needed))), "{why}");
    assert_eq!(shortfall(&c, 1024 * GI), None);
}

#[test]
fn the_table_lists_every_part_and_the_verdict() {
    let p = plan(&llama3("  parallelism: zero1\n  gradientCheckpointing: true\n"));
    let table = p.table(Some(48 * GI));
    for row in [
        "parameters",
        "gradients",
        "optimizer state",
        "autocast weights",
        "activations",
        "loss chunk",
        "all-gather buffers",
        "step peak",
        "CUDA allowance",
        "needed",
    ] {
        assert!(table.contains(&format!("  {row} ")), "{row}:\n{table}");
    }
    assert!(table.contains("of 48.0 GiB per GPU: fits"), "{table}");
    assert!(p.table(Some(8 * GI)).contains("does not fit"));
}

/// `packing: documents` holds each token's position and document, and where varlen
/// flash attention cannot run, the (B, T, T) mask as a bool and as an additive bias in
/// the activations' dtype: on a GPU in bf16 nothing of T².
#[test]
fn document_packing_holds_a_mask_only_off_flash() {
    let with = |device: &str, precision: &str, packing: &str| {
        plan(&run(&format!(
            "  model: {{preset: nano, tokenizer: embedded}}\n  tokens: 1M\n  data: {{mix: [{{name: a, weight: 1, uri: \"embedded:textbook\"}}], packing: {packing}}}\n  topology: {{nodes: 1, gpusPerNode: {}}}\n  batch: {{globalTokens: 2048, microBatch: 8, seqLength: 256}}\n  precision: {precision}\n",
            if device == "cuda" { 1 } else { 0 }
        )))
    };
    let (b, t) = (8u64, 256u64);
    let cpu = with("cpu", "f32", "documents").peak.activations - with("cpu", "f32", "concat").peak.activations;
    assert_eq!(cpu, 16 * b * t + b * t * t * (1 + 4));
    let gpu = with("cuda", "bf16-mixed", "documents").peak.activations
        - with("cuda", "bf16-mixed", "concat").peak.activations;
    assert_eq!(gpu, 16 * b * t, "varlen flash: no mask");
    let f32_gpu = with("cuda", "f32", "documents").peak.activations - with("cuda", "f32", "concat").peak.activations;
    assert_eq!(f32_gpu, 16 * b * t + b * t * t * (1 + 4), "flash takes no f32: the mask");
}
