//! Exported checkpoints load in Hugging Face transformers with the same logits.
//! Needs a Python with torch and transformers: `TRAINER_TEST_PYTHON`, else the
//! project's CUDA venv (`scripts/test.sh` installs both).

use std::collections::HashMap;
use std::process::Command;

use crds::presets::{Arch, ModelConfig, preset};
use crds::types::Packing;
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};
use trainer::export::export_hf;
use trainer::model::{Documents, Model};

mod common;
use common::python;

fn config(arch: Arch, tied: bool) -> ModelConfig {
    let mut cfg = ModelConfig::from(preset("nano").expect("nano preset"));
    cfg.arch = arch;
    cfg.n_layer = 2;
    cfg.d_model = 64;
    cfg.n_head = 4;
    cfg.n_kv_head = if arch == Arch::Gpt2 { 4 } else { 2 };
    cfg.d_head = 16;
    cfg.d_ff = 96;
    cfg.vocab_size = 101;
    cfg.max_seq_len = 32;
    cfg.rope_theta = 5e5;
    cfg.tied_embeddings = tied;
    cfg
}

#[test]
fn transformers_reproduces_the_logits_of_every_family() {
    let root = std::env::temp_dir().join(format!("hf-parity-{}", std::process::id()));
    let mut dirs = Vec::new();
    for (name, arch, tied) in [
        ("llama", Arch::Llama, false),
        ("qwen3", Arch::Qwen3, false),
        ("gpt2", Arch::Gpt2, true),
        ("gpt2-untied", Arch::Gpt2, false),
    ] {
        let cfg = config(arch, tied);
        tch::manual_seed(7);
        let vs = VarStore::new(Device::Cpu);
        let model = Model::new(&vs.root(), &cfg, Device::Cpu).unwrap();
        // Norm weights and biases start at 1 and 0; perturb them so a swapped or
        // dropped parameter cannot go unnoticed.
        tch::no_grad(|| {
            for (_, mut v) in vs.variables() {
                if v.dim() == 1 {
                    let noise = Tensor::randn_like(&v) * 0.1;
                    let _ = v.g_add_(&noise);
                }
            }
        });
        let ids = Tensor::randint(101, [2, 24], (Kind::Int64, Device::Cpu));
        let logits = tch::no_grad(|| model.logits(&ids)).unwrap();
        let dir = root.join(name);
        let weights: HashMap<String, Tensor> = vs.variables();
        export_hf(&cfg, &weights, None, &dir).unwrap();
        Tensor::write_safetensors(&[("input_ids", ids), ("logits", logits)], dir.join("parity.safetensors")).unwrap();
        if tied || arch != Arch::Gpt2 {
            packed_window(&model, &dir);
        }
        dirs.push(dir);
    }
    let out = Command::new(python()).arg("../scripts/hf_parity.py").args(&dirs).output().expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "transformers disagrees:\n{stdout}\n{stderr}");
    assert_eq!(stdout.lines().count(), 4, "{stdout}");
    for class in ["LlamaForCausalLM", "Qwen3ForCausalLM", "GPT2LMHeadModel"] {
        assert!(stdout.contains(class), "{class} missing from {stdout}");
    }
    // Packed windows of several documents, for LLaMA, Qwen3 and GPT-2.
    let packed: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|r: &serde_json::Value| r["documents"].is_u64())
        .collect();
    assert_eq!(packed.len(), 3, "{stdout}");
    for r in &packed {
        assert!(r["documents"].as_u64().unwrap() >= 6, "{r}");
        println!("{r}");
    }
    std::fs::remove_dir_all(&root).ok();
}

/// A window of documents for `packing: documents` (`window` (2, 25) ids, each document
/// ending at the end-of-text id 0; documents of 1 to 9 tokens, one cut by the window's
/// start and one by its end), its logits with per-document attention, and its training
/// loss through the training path (the chunked loss, with recomputation), written to
/// `dir/packed.safetensors` for `scripts/hf_parity.py`.
fn packed_window(model: &Model, dir: &std::path::Path) {
    let eos = 0i64;
    let ids = Tensor::randint_low(1, 101, [2, 25], (Kind::Int64, Device::Cpu));
    for (row, ends) in [(0i64, [2i64, 3, 9, 17, 18]), (1, [6, 7, 15, 16, 22])] {
        for end in ends {
            let _ = ids.get(row).get(end).fill_(eos);
        }
    }
    let (x, y) = (ids.narrow(1, 0, 24), ids.narrow(1, 1, 24));
    let (docs, targets) = Documents::pack(Packing::Documents, &x, &y, eos).unwrap();
    let logits = tch::no_grad(|| model.logits_of(&x, docs.as_ref())).unwrap();
    let loss = model
        .backward_with(&x, &targets, 1.0, 7, 1, &trainer::model::Resident, docs.as_ref())
        .unwrap()
        .to_kind(Kind::Double);
    let named = [("window", ids), ("logits", logits), ("loss", loss), ("eos", Tensor::from(eos))];
    Tensor::write_safetensors(&named, dir.join("packed.safetensors")).unwrap();
}
