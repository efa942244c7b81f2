//! Every example parses, resolves, passes the CRD's CEL rules, and resolves to the
//! seed's figures.

use std::path::{Path, PathBuf};

use crds::TrainingRun;
use crds::config::{Device, RunConfig};
use kube::CustomResourceExt;

fn examples() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

fn resolved(name: &str) -> RunConfig {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples").join(name);
    crds::resolve(&crds::manifest::from_file(&path).unwrap()).unwrap()
}

/// Every TrainingDataset of `examples/datasets/`, checked against its CRD's schema and
/// CEL rules, by name.
fn datasets() -> std::collections::BTreeMap<String, crds::types::TrainingDataset> {
    use crds::types::TrainingDataset;
    let crd = TrainingDataset::crd();
    let schema =
        serde_json::to_value(crd.spec.versions[0].schema.as_ref().unwrap().open_api_v3_schema.as_ref().unwrap())
            .unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/datasets");
    let mut found = std::collections::BTreeMap::new();
    let mut dirs = vec![root];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let raw: serde_json::Value = serde_yaml_ng::from_str(&text).unwrap();
            kube::core::cel::Validator::new()
                .validate(&schema, &raw, None)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let ds: TrainingDataset =
                serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let name = ds.metadata.name.clone().unwrap();
            assert!(found.insert(name, ds).is_none(), "{}: a second dataset of its name", path.display());
        }
    }
    found
}

#[test]
fn every_example_parses_resolves_and_passes_cel() {
    let datasets = datasets();
    assert!(datasets.len() >= 4, "the seed-002 mix's four datasets: {:?}", datasets.keys());
    let crd = TrainingRun::crd();
    let schema =
        serde_json::to_value(crd.spec.versions[0].schema.as_ref().unwrap().open_api_v3_schema.as_ref().unwrap())
            .unwrap();
    let files = examples();
    assert!(files.len() >= 12, "expected an example per seed configuration, found {files:?}");
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let run = crds::manifest::from_yaml(&text, &file.display().to_string()).unwrap_or_else(|e| panic!("{e}"));
        // What the operator does once each dataset is Ready: its output holds the manifest.
        let run = crds::resolve::with_datasets(&run, |n| datasets.get(n).map(|d| d.spec.output.clone()))
            .unwrap_or_else(|missing| panic!("{}: no dataset example named {missing:?}", file.display()));
        crds::resolve(&run).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let raw: serde_json::Value = serde_yaml_ng::from_str(&text).unwrap();
        kube::core::cel::Validator::new()
            .validate(&schema, &raw, None)
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let name = file.file_name().unwrap().to_string_lossy().to_string();
        if let Some(seed) = name.strip_prefix("seed").and_then(|s| s.get(..3)) {
            assert!(text.starts_with(&format!("# Seed {seed}")), "{name} must open with a comment naming seed {seed}");
        }
    }
}

#[test]
fn seed_000_xlarge_on_8_gpus() {
    let c = resolved("seed000-xlarge-8xa100.yaml");
    assert_eq!(c.params.total, 1_461_413_760);
    assert_eq!((c.topology.world_size, c.batch.grad_accum, c.batch.tokens_per_step), (8, 1, 131_072));
    assert_eq!(c.schedule.total_steps, 83_923);
    assert_eq!(c.schedule.warmup_tokens, 100_000_000);
    let weights: Vec<f64> = c.data.unwrap().mix.iter().map(|s| s.weight).collect();
    assert_eq!(weights, [0.45, 0.25, 0.20, 0.10]);
}

#[test]
fn seed_000_as_written_is_rejected_with_a_fix() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/seed000-xlarge-8xa100.yaml");
    let mut run = crds::manifest::from_file(&path).unwrap();
    run.spec.batch.micro_batch = 16;
    let err = crds::resolve(&run).unwrap_err();
    assert!(err.names("spec.batch.globalTokens"), "{err}");
    assert!(err.to_string().contains("use e.g. 262144"), "{err}");
}

#[test]
fn seed_001_four_nodes_by_two() {
    let c = resolved("seed001-xlarge-4x2a100.yaml");
    assert_eq!((c.topology.nodes, c.topology.procs_per_node, c.topology.world_size), (4, 2, 8));
    assert_eq!(c.topology.display, "4x2");
    assert_eq!(c.batch.grad_accum, 2);
    assert_eq!(c.schedule.total_steps, 190_734);
}

#[test]
fn seed_002_both_phases() {
    let p = resolved("seed002-medium-large-pretrain.yaml");
    assert_eq!(p.params.without_norms, 401_227_776);
    assert_eq!(p.schedule.total_steps, 61_035);
    assert_eq!(p.schedule.warmup_tokens, 50_000_000);
    assert!(p.gradient_checkpointing);
    let g = resolved("seed002-medium-large-grpo.yaml");
    let grpo = g.grpo.as_ref().unwrap();
    assert_eq!((grpo.prompts_per_step, grpo.generations_per_prompt, grpo.length_penalty), (8, 16, 0.01));
    assert_eq!(g.schedule.lr, 1e-5);
    assert_eq!(g.batch.grad_accum, 8);
    assert_eq!(g.schedule.total_steps, 4_577);
    assert_eq!(g.init_from, Some(crds::config::ResolvedInit::TrainingRun { name: "medqa-pretrain".into() }));
}

#[test]
fn seed_003_families() {
    for (file, preset, accum) in [
        ("seed003-gpt2-1.36b.yaml", "gpt2-1.36b", 32),
        ("seed003-llama2-1.36b.yaml", "llama2-1.36b", 32),
        ("seed003-llama3-1.5b.yaml", "llama3-1.5b", 24),
        ("seed003-llama3-2.2b.yaml", "llama3-2.2b", 32),
        ("seed003-qwen3-1.8b.yaml", "qwen3-1.8b", 32),
    ] {
        let c = resolved(file);
        assert_eq!(c.model.preset, preset);
        assert_eq!(c.batch.grad_accum, accum, "{file}");
        assert_eq!(c.schedule.warmup_tokens, 2000 * c.batch.tokens_per_step, "{file}");
    }
    assert_eq!(resolved("seed003-llama3-1.5b.yaml").schedule.budget_tokens, 101_909_000_000);
}

#[test]
fn seed_004_gpt2_1b_on_8_h100() {
    let c = resolved("seed004-gpt2-1b-8xh100.yaml");
    assert!(c.model.tied_embeddings);
    assert_eq!((c.batch.micro_batch, c.batch.grad_accum, c.batch.global_sequences), (4, 16, 512));
    assert_eq!(c.schedule.total_steps, 100_000);
    let s3 = c.checkpoint.s3.unwrap();
    assert_eq!((s3.bucket.as_str(), s3.prefix.as_str()), ("refocused-ai", "checkpoints"));
}

#[test]
fn local_examples_run_on_cpu_with_embedded_data() {
    let c = resolved("tiny-local.yaml");
    assert_eq!(c.topology.device, Device::Cpu);
    assert_eq!(c.topology.world_size, 2);
    assert!(c.data.unwrap().mix.iter().all(|s| matches!(s.location, crds::config::Location::Embedded { .. })));
    let g = resolved("tiny-grpo-local.yaml");
    assert_eq!(g.init_from, Some(crds::config::ResolvedInit::TrainingRun { name: "tiny-local".into() }));
}

/// Each seed example is planned against its seed's GPU and fits it, under the sharding
/// its seed used; without that sharding and recomputation it would not.
#[test]
fn every_seed_example_fits_its_seeds_gpu() {
    use crds::types::Parallelism;
    const GI: u64 = 1 << 30;
    for (file, gpu, parallelism) in [
        ("seed003-gpt2-1.36b.yaml", 48 * GI, Parallelism::Zero1),
        ("seed003-llama2-1.36b.yaml", 48 * GI, Parallelism::Zero1),
        ("seed003-llama3-1.5b.yaml", 48 * GI, Parallelism::Zero1),
        ("seed003-llama3-2.2b.yaml", 48 * GI, Parallelism::Zero1),
        ("seed003-qwen3-1.8b.yaml", 48 * GI, Parallelism::Zero1),
        ("seed004-gpt2-1b-8xh100.yaml", 80 * GI, Parallelism::Fsdp),
    ] {
        let c = resolved(file);
        assert_eq!((c.topology.gpu_memory_bytes, c.parallelism), (Some(gpu), parallelism), "{file}");
        let plan = crds::plan::plan(&c);
        assert!(plan.fits(gpu), "{file}: {}", plan.table(Some(gpu)));
        assert_eq!(crds::plan::shortfall(&c, gpu), None, "{file}");
    }
    // The 2.2B as seed 003's flags alone would run it here: plain DDP, no recomputation.
    let mut ddp = resolved("seed003-llama3-2.2b.yaml");
    (ddp.parallelism, ddp.gradient_checkpointing) = (Parallelism::Ddp, false);
    let why = crds::plan::shortfall(&ddp, 48 * GI).expect("plain DDP does not fit 48 GiB");
    assert!(
        why.contains("spec.parallelism: zero1 saves") && why.contains("spec.gradientCheckpointing: true saves"),
        "{why}"
    );
}

/// A spec whose plan does not fit its `gpuMemory` is refused at validation, naming the
/// field, what it needs and what would make it fit.
#[test]
fn a_run_that_cannot_fit_its_gpus_is_refused_naming_the_field_and_the_remedies() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/seed003-llama3-2.2b.yaml");
    let mut run = crds::manifest::from_file(&path).unwrap();
    run.spec.topology.gpu_memory = Some("24Gi".into());
    let err = crds::resolve(&run).unwrap_err();
    assert!(err.names("spec.topology.gpuMemory"), "{err}");
    let text = err.to_string();
    assert!(text.contains("needs 44.0 GiB per GPU, has 24.0 GiB"), "{text}");
    assert!(text.contains("spec.parallelism: zero2 saves"), "{text}");
    // `trainer plan` still sees it.
    assert!(crds::resolve::resolve_unplanned(&run).is_ok());

    for (memory, gpus, message) in
        [("48 apples", 2, "is not an amount of memory"), ("48Gi", 0, "needs gpusPerNode of at least 1")]
    {
        let mut bad = run.clone();
        bad.spec.topology.gpu_memory = Some(memory.into());
        bad.spec.topology.gpus_per_node = gpus;
        let err = crds::resolve(&bad).unwrap_err();
        assert!(err.names("spec.topology.gpuMemory") && err.to_string().contains(message), "{memory}: {err}");
    }
}
