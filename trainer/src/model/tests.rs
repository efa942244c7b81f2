use std::collections::BTreeMap;

use crds::presets::{Arch, ModelConfig, PRESETS, preset};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use super::*;

/// A small config of each family, with GQA where the family has it.
pub(crate) fn small(arch: Arch, tied: bool) -> ModelConfig {
    let mut cfg = ModelConfig::from(preset("nano").expect("nano preset"));
    cfg.arch = arch;
    cfg.n_layer = 2;
    cfg.d_model = 64;
    cfg.n_head = 4;
    cfg.n_kv_head = if arch == Arch::Gpt2 { 4 } else { 2 };
    cfg.d_head = 16;
    cfg.d_ff = 96;
    cfg.vocab_size = 97;
    cfg.max_seq_len = 32;
    cfg.tied_embeddings = tied;
    cfg
}

fn build(cfg: &ModelConfig, seed: i64) -> (VarStore, Model) {
    tch::manual_seed(seed);
    let vs = VarStore::new(Device::Cpu);
    let model = Model::new(&vs.root(), cfg, Device::Cpu).expect("model builds");
    (vs, model)
}

fn shapes(vs: &VarStore) -> BTreeMap<String, Vec<i64>> {
    vs.variables().into_iter().map(|(k, v)| (k, v.size())).collect()
}

#[test]
fn parameter_counts_equal_the_preset_table() {
    for cfg in [
        small(Arch::Llama, false),
        small(Arch::Qwen3, false),
        small(Arch::Gpt2, false),
        small(Arch::Gpt2, true),
        ModelConfig::from(preset("nano").unwrap()),
        ModelConfig::from(preset("micro").unwrap()),
    ] {
        let (vs, _) = build(&cfg, 0);
        let vars = vs.variables();
        let total: i64 = vars.values().map(|t| t.numel() as i64).sum();
        let norms: i64 =
            vars.iter().filter(|(k, _)| k.contains("norm") || k.contains(".ln_")).map(|(_, t)| t.numel() as i64).sum();
        let matmul: i64 = vars
            .iter()
            .filter(|(k, t)| t.dim() == 2 && !k.contains("embed_tokens") && !k.contains("wte") && !k.contains("wpe"))
            .map(|(_, t)| t.numel() as i64)
            .sum::<i64>()
            + if cfg.tied_embeddings { vars["transformer.wte.weight"].numel() as i64 } else { 0 };
        let want = cfg.param_counts();
        assert_eq!(total as u64, want.total, "{:?} total", cfg.arch);
        assert_eq!((total - norms) as u64, want.without_norms, "{:?} without norms", cfg.arch);
        assert_eq!(matmul as u64, want.matmul, "{:?} matmul", cfg.arch);
    }
    assert!(PRESETS.iter().any(|p| p.name == "micro"));
}

#[test]
fn parameter_names_are_hugging_face_names() {
    let (vs, _) = build(&small(Arch::Qwen3, false), 0);
    let s = shapes(&vs);
    for (name, shape) in [
        ("model.embed_tokens.weight", vec![97, 64]),
        ("model.layers.1.input_layernorm.weight", vec![64]),
        ("model.layers.1.self_attn.q_proj.weight", vec![64, 64]),
        ("model.layers.1.self_attn.k_proj.weight", vec![32, 64]),
        ("model.layers.1.self_attn.v_proj.weight", vec![32, 64]),
        ("model.layers.1.self_attn.o_proj.weight", vec![64, 64]),
        ("model.layers.1.self_attn.q_norm.weight", vec![16]),
        ("model.layers.1.self_attn.k_norm.weight", vec![16]),
        ("model.layers.1.post_attention_layernorm.weight", vec![64]),
        ("model.layers.1.mlp.gate_proj.weight", vec![96, 64]),
        ("model.layers.1.mlp.up_proj.weight", vec![96, 64]),
        ("model.layers.1.mlp.down_proj.weight", vec![64, 96]),
        ("model.norm.weight", vec![64]),
        ("lm_head.weight", vec![97, 64]),
    ] {
        assert_eq!(s.get(name), Some(&shape), "{name}");
    }
    assert_eq!(s.len(), 2 * 11 + 3);

    let (vs, _) = build(&small(Arch::Gpt2, true), 0);
    let s = shapes(&vs);
    for (name, shape) in [
        ("transformer.wte.weight", vec![97, 64]),
        ("transformer.wpe.weight", vec![32, 64]),
        ("transformer.h.0.ln_1.weight", vec![64]),
        ("transformer.h.0.ln_1.bias", vec![64]),
        ("transformer.h.0.attn.c_attn.weight", vec![192, 64]),
        ("transformer.h.0.attn.c_attn.bias", vec![192]),
        ("transformer.h.0.attn.c_proj.weight", vec![64, 64]),
        ("transformer.h.0.mlp.c_fc.weight", vec![96, 64]),
        ("transformer.h.0.mlp.c_proj.bias", vec![64]),
        ("transformer.ln_f.bias", vec![64]),
    ] {
        assert_eq!(s.get(name), Some(&shape), "{name}");
    }
    assert!(!s.contains_key("lm_head.weight"), "tied GPT-2 has no separate lm_head");
}

#[test]
fn init_scales_residual_projections() {
    let cfg = ModelConfig { n_layer: 8, d_model: 256, d_ff: 512, ..small(Arch::Llama, false) };
    let (vs, _) = build(&cfg, 1);
    let vars = vs.variables();
    let std = |n: &str| vars[n].f_std(true).unwrap().double_value(&[]);
    let resid = 0.02 / 16f64.sqrt();
    assert!((std("model.layers.3.mlp.gate_proj.weight") - 0.02).abs() < 0.001);
    assert!((std("model.layers.3.mlp.down_proj.weight") - resid).abs() < 0.0005);
    assert!((std("model.layers.3.self_attn.o_proj.weight") - resid).abs() < 0.0005);
    assert_eq!(vars["model.norm.weight"].f_sum(Kind::Float).unwrap().double_value(&[]), 256.0);
}

#[test]
fn future_tokens_leave_past_logits_unchanged() {
    for arch in [Arch::Llama, Arch::Qwen3, Arch::Gpt2] {
        let (_vs, model) = build(&small(arch, false), 2);
        let a = Tensor::randint(97, [2, 16], (Kind::Int64, Device::Cpu));
        let b = a.copy();
        let _ = b.narrow(1, 10, 6).fill_(5);
        let la = model.logits(&a).unwrap();
        let lb = model.logits(&b).unwrap();
        let past = (la.narrow(1, 0, 10) - lb.narrow(1, 0, 10)).abs().max().double_value(&[]);
        let future = (la.narrow(1, 10, 6) - lb.narrow(1, 10, 6)).abs().max().double_value(&[]);
        assert!(past < 1e-6, "{arch:?}: past logits moved by {past}");
        assert!(future > 1e-4, "{arch:?}: the change must be visible at later positions");
    }
}

#[test]
fn sequences_longer_than_the_context_are_an_error() {
    let (_vs, model) = build(&small(Arch::Gpt2, false), 0);
    let idx = Tensor::zeros([1, 33], (Kind::Int64, Device::Cpu));
    let err = model.logits(&idx).unwrap_err().to_string();
    assert!(err.contains("seqLength"), "{err}");
}

fn grads(vs: &VarStore) -> BTreeMap<String, Tensor> {
    vs.variables().into_iter().map(|(k, v)| (k, v.grad().copy())).collect()
}

fn max_diff(a: &BTreeMap<String, Tensor>, b: &BTreeMap<String, Tensor>) -> f64 {
    a.iter().map(|(k, g)| (g - &b[k]).abs().max().double_value(&[])).fold(0.0, f64::max)
}

#[test]
fn checkpointed_backward_gives_the_same_gradients() {
    for arch in [Arch::Llama, Arch::Gpt2] {
        let mut cfg = small(arch, arch == Arch::Gpt2);
        cfg.n_layer = 3;
        let (vs, model) = build(&cfg, 3);
        let idx = Tensor::randint(97, [3, 12], (Kind::Int64, Device::Cpu));
        let tgt = Tensor::randint(97, [3, 12], (Kind::Int64, Device::Cpu));
        let loss = model.loss(&idx, &tgt, None).unwrap();
        (&loss * 0.5).backward();
        let plain = grads(&vs);
        // One chunk and six chunks of the loss (36 tokens); none, some or all blocks
        // recomputed (and more than there are).
        for chunk in [4096, 7] {
            for recompute in 0..=cfg.n_layer as usize + 1 {
                vs.variables().values().for_each(|v| {
                    let _ = v.grad().zero_();
                });
                let ck_loss = model.backward_checkpointed(&idx, &tgt, 0.5, chunk, recompute).unwrap();
                assert!((loss.double_value(&[]) - ck_loss.double_value(&[])).abs() < 1e-6);
                let diff = max_diff(&plain, &grads(&vs));
                assert!(diff < 1e-6, "{arch:?} chunk {chunk}, {recompute} recomputed: gradients differ by {diff}");
            }
        }
    }
}

/// Attention with K/V repeated per query head (the cuDNN path) equals SDPA's grouped
/// path, for the logits and the gradients.
#[test]
fn expanded_kv_equals_grouped_query_attention() {
    let cfg = small(Arch::Llama, false);
    assert_ne!(cfg.n_kv_head, cfg.n_head);
    let (vs, mut model) = build(&cfg, 6);
    let idx = Tensor::randint(97, [2, 12], (Kind::Int64, Device::Cpu));
    let tgt = Tensor::randint(97, [2, 12], (Kind::Int64, Device::Cpu));
    let grouped_logits = model.logits(&idx).unwrap();
    model.loss(&idx, &tgt, None).unwrap().backward();
    let grouped = grads(&vs);
    model.set_attention(crds::types::Attention::Cudnn);
    vs.variables().values().for_each(|v| {
        let _ = v.grad().zero_();
    });
    let expanded_logits = model.logits(&idx).unwrap();
    model.loss(&idx, &tgt, None).unwrap().backward();
    let d = (&grouped_logits - &expanded_logits).abs().max().double_value(&[]);
    assert!(d < 1e-6, "logits differ by {d}");
    let diff = max_diff(&grouped, &grads(&vs));
    assert!(diff < 1e-6, "gradients differ by {diff}");
    assert!(!crate::kernels::sdp::expands_kv(crds::types::Attention::Flash, &cfg));
    assert!(!crate::kernels::sdp::expands_kv(crds::types::Attention::Cudnn, &small(Arch::Gpt2, false)));
}

/// The chunked lm_head + cross-entropy gives the full loss and every gradient within
/// 1e-5 (f32, CPU), with a chunk that does not divide the tokens and ignored targets.
#[test]
fn chunked_loss_equals_the_full_loss_and_gradients() {
    for (arch, tied) in [(Arch::Llama, false), (Arch::Qwen3, false), (Arch::Gpt2, true)] {
        let cfg = small(arch, tied);
        let (vs, model) = build(&cfg, 5);
        let idx = Tensor::randint(97, [3, 16], (Kind::Int64, Device::Cpu));
        let tgt = Tensor::randint(97, [3, 16], (Kind::Int64, Device::Cpu));
        let _ = tgt.get(1).narrow(0, 10, 6).fill_(-100);
        let loss = model.loss(&idx, &tgt, None).unwrap();
        (&loss * 0.25).backward();
        let full = grads(&vs);
        for chunk in [7, 16, 48, 4096] {
            vs.variables().values().for_each(|v| {
                let _ = v.grad().zero_();
            });
            let chunked = model.backward_chunked(&idx, &tgt, 0.25, chunk, None).unwrap();
            let dl = (loss.double_value(&[]) - chunked.double_value(&[])).abs();
            assert!(dl < 1e-5, "{arch:?} chunk {chunk}: loss differs by {dl}");
            let diff = max_diff(&full, &grads(&vs));
            assert!(diff < 1e-5, "{arch:?} chunk {chunk}: gradients differ by {diff}");
        }
    }
}

#[test]
fn two_micro_batches_accumulated_equal_one_batch_of_four() {
    let (vs, model) = build(&small(Arch::Llama, false), 4);
    let idx = Tensor::randint(97, [4, 12], (Kind::Int64, Device::Cpu));
    let tgt = Tensor::randint(97, [4, 12], (Kind::Int64, Device::Cpu));
    model.loss(&idx, &tgt, None).unwrap().backward();
    let whole = grads(&vs);
    vs.variables().values().for_each(|v| {
        let _ = v.grad().zero_();
    });
    for m in 0..2 {
        let loss = model.loss(&idx.narrow(0, 2 * m, 2), &tgt.narrow(0, 2 * m, 2), None).unwrap();
        (loss / 2.0).backward();
    }
    let diff = max_diff(&whole, &grads(&vs));
    assert!(diff < 1e-7, "accumulated gradients differ by {diff}");
}

/// The loss chunk holds the same f32 logits at every vocabulary: 8,192 tokens at GPT-2's
/// 50,304, fewer at LLaMA-3's and Qwen3's, none smaller than 256.
#[test]
fn the_loss_chunk_shrinks_with_the_vocabulary() {
    assert_eq!(loss_chunk_tokens(50304), 8192);
    assert_eq!(loss_chunk_tokens(32000), 12800);
    assert_eq!(loss_chunk_tokens(128256), 3072);
    assert_eq!(loss_chunk_tokens(151936), 2560);
    assert_eq!(loss_chunk_tokens(1 << 30), 256);
    for name in ["xlarge", "llama3-1.5b", "qwen3-1.8b", "gpt2-1b"] {
        let cfg = ModelConfig::from(preset(name).unwrap());
        let chunk = loss_chunk_tokens(cfg.vocab_size as i64);
        assert!(chunk % 256 == 0 && chunk * cfg.vocab_size as i64 * 4 <= LOSS_CHUNK_BYTES, "{name}: {chunk}");
    }
}

fn max_abs(a: &BTreeMap<String, Tensor>) -> f64 {
    a.values().map(|g| g.abs().max().double_value(&[])).fold(0.0, f64::max)
}

/// Under bf16 autocast (run here on CPU: the same switch as CUDA's, another device
/// type) the chunked and the checkpointed backward give plain backward's loss and
/// gradients up to bf16 rounding, and recomputing any number of blocks changes nothing,
/// so the recomputed blocks run in bf16 as their first forward did. The loss and the
/// gradients of the f32 master weights stay f32.
#[test]
fn the_backward_passes_agree_under_bf16_autocast() {
    let bf16 = |f: &mut dyn FnMut() -> Result<Tensor, TchError>| crate::ffi::autocast(Device::Cpu, true, f).unwrap();
    for (arch, tied) in [(Arch::Llama, false), (Arch::Gpt2, true)] {
        let mut cfg = small(arch, tied);
        cfg.n_layer = 3;
        let (vs, model) = build(&cfg, 8);
        let idx = Tensor::randint(97, [3, 12], (Kind::Int64, Device::Cpu));
        let tgt = Tensor::randint(97, [3, 12], (Kind::Int64, Device::Cpu));
        let zero = || {
            vs.variables().values().for_each(|v| {
                let _ = v.grad().zero_();
            })
        };
        model.loss(&idx, &tgt, None).unwrap().backward();
        let f32_grads = grads(&vs);
        zero();
        let loss = bf16(&mut || model.loss(&idx, &tgt, None));
        assert_eq!(loss.kind(), Kind::Float);
        (&loss * 0.5).backward();
        let plain = grads(&vs);
        assert!(plain.values().all(|g| g.kind() == Kind::Float));
        let scale = max_abs(&plain);
        // bf16 really ran: the gradients moved from f32's by rounding.
        let rounding = max_diff(&plain, &f32_grads.iter().map(|(k, g)| (k.clone(), g * 0.5)).collect()) / scale;
        assert!(rounding > 1e-4 && rounding < 0.1, "{arch:?}: bf16 against f32 gradients: {rounding}");
        for chunk in [4096, 7] {
            zero();
            let chunked_loss = bf16(&mut || model.backward_chunked(&idx, &tgt, 0.5, chunk, None));
            assert!((loss.double_value(&[]) - chunked_loss.double_value(&[])).abs() < 1e-2);
            let chunked = grads(&vs);
            let d = max_diff(&plain, &chunked) / scale;
            assert!(d < 0.02, "{arch:?} chunk {chunk}: chunked against plain gradients: {d}");
            for recompute in 1..=cfg.n_layer as usize {
                zero();
                let ck_loss = bf16(&mut || model.backward_checkpointed(&idx, &tgt, 0.5, chunk, recompute));
                assert!((ck_loss.double_value(&[]) - chunked_loss.double_value(&[])).abs() < 1e-6);
                let d = max_diff(&chunked, &grads(&vs)) / scale;
                assert!(
                    d < rounding / 100.0,
                    "{arch:?} chunk {chunk}, {recompute} recomputed: gradients differ by {d}"
                );
            }
        }
    }
}

/// Under autocast the KV cache is allocated in bf16 (attention would re-cast an f32
/// cache on every step) and decoding still gives the full forward's logits.
#[test]
fn under_autocast_the_kv_cache_is_bf16_and_decodes_as_the_full_forward() {
    let cfg = small(Arch::Llama, false);
    let (_vs, model) = build(&cfg, 9);
    assert_eq!(model.new_cache(1, 8).unwrap().layers[0].0.kind(), Kind::Float);
    let x = Tensor::from_slice(&[5i64, 17, 3, 8]).view([1, 4]);
    let (cached, full) = crate::ffi::autocast(Device::Cpu, true, || -> Result<_, TchError> {
        let mut cache = model.new_cache(1, 8)?;
        assert!(cache.layers.iter().all(|(k, v)| k.kind() == Kind::BFloat16 && v.kind() == Kind::BFloat16));
        let real = Tensor::ones([1, 3], (Kind::Bool, Device::Cpu));
        let _ = tch::no_grad(|| model.decode(&x.narrow(1, 0, 3), &real, &mut cache))?;
        let last = tch::no_grad(|| model.decode(&x.narrow(1, 3, 1), &real.narrow(1, 0, 1), &mut cache))?;
        let full = tch::no_grad(|| model.logits(&x))?.get(0).get(3);
        Ok((last.get(0).to_kind(Kind::Float), full.to_kind(Kind::Float)))
    })
    .unwrap();
    let d = (&cached - &full).abs().max().double_value(&[]);
    let scale = full.abs().max().double_value(&[]);
    assert!(d <= 0.01 * scale, "cached logits differ from the full forward's by {d} (scale {scale})");
}
