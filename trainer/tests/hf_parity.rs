//! Exported checkpoints load in Hugging Face transformers with the same logits.
//! Needs a Python with torch and transformers: `TRAINER_TEST_PYTHON`, else the
//! project's CUDA venv (`scripts/test.sh` installs both).

use std::collections::HashMap;
use std::process::Command;

use crds::presets::{Arch, ModelConfig, preset};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};
use trainer::export::export_hf;
use trainer::model::Model;

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
    std::fs::remove_dir_all(&root).ok();
}
