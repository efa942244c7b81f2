//! The model preset table shared by the resolver and the trainer, and the
//! parameter and FLOP counts that `torch_reference.py` uses.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Peak dense bf16 throughput of one H100 SXM, the MFU denominator of `torch_reference.py`.
pub const H100_PEAK_BF16_FLOPS: f64 = 989e12;

/// Block family of a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    /// RMSNorm, RoPE, GQA attention, SwiGLU MLP, no biases.
    Llama,
    /// Llama plus per-head RMSNorm on queries and keys.
    Qwen3,
    /// LayerNorm, learned positions, biases, tanh-GELU MLP.
    Gpt2,
}

/// A named architecture from the preset table.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Preset {
    pub name: &'static str,
    pub arch: Arch,
    pub n_layer: u32,
    pub d_model: u32,
    pub n_head: u32,
    pub n_kv_head: u32,
    pub d_head: u32,
    pub d_ff: u32,
    pub vocab_size: u32,
    /// RoPE base; 0 for GPT-2, which has learned positions.
    pub rope_theta: f64,
    pub tied_embeddings: bool,
    /// Default context length when the spec gives none.
    pub seq_len: u32,
}

const fn p(
    name: &'static str,
    arch: Arch,
    dims: [u32; 7],
    rope_theta: f64,
    tied_embeddings: bool,
    seq_len: u32,
) -> Preset {
    let [n_layer, d_model, n_head, n_kv_head, d_head, d_ff, vocab_size] = dims;
    Preset {
        name,
        arch,
        n_layer,
        d_model,
        n_head,
        n_kv_head,
        d_head,
        d_ff,
        vocab_size,
        rope_theta,
        tied_embeddings,
        seq_len,
    }
}

/// f32 logits per chunk of the trainer's chunked lm_head and cross-entropy: 8,192
/// tokens at a 50,304 vocabulary, 1.6 GB, against 3.3 GB for micro-batch 8 × 2048 at
/// once.
pub const LOSS_CHUNK_BYTES: i64 = 8192 * 50304 * 4;

/// Tokens per loss chunk at vocabulary `vocab`: as many as keep a chunk's f32 logits
/// within [`LOSS_CHUNK_BYTES`], in multiples of 256 (at least 256), so that LLaMA-3's
/// and Qwen3's 128K–152K vocabularies hold no more than GPT-2's 50K.
pub fn loss_chunk_tokens(vocab: i64) -> i64 {
    (LOSS_CHUNK_BYTES / (4 * vocab.max(1)) / 256 * 256).max(256)
}

/// Vocabulary of the embedded byte-level BPE tokenizer; `nano` and `micro` match it.
pub const EMBEDDED_VOCAB_SIZE: u32 = 2048;

use Arch::{Gpt2, Llama, Qwen3};

/// Every preset. Dimensions: layers, d_model, heads, kv_heads, d_head, d_ff, vocab.
pub const PRESETS: &[Preset] = &[
    // Laptop and test sizes, with the embedded tokenizer's vocabulary.
    p("nano", Llama, [2, 128, 4, 2, 32, 384, EMBEDDED_VOCAB_SIZE], 1e4, false, 256),
    p("micro", Llama, [6, 384, 6, 2, 64, 768, EMBEDDED_VOCAB_SIZE], 1e4, false, 256),
    // Seed 000's table.
    p("tiny", Llama, [12, 512, 8, 2, 64, 1408, 50304], 1e4, false, 2048),
    p("small", Llama, [16, 768, 12, 3, 64, 2112, 50304], 1e4, false, 2048),
    p("medium", Llama, [24, 1024, 16, 4, 64, 2816, 50304], 1e4, false, 2048),
    p("medium-large", Llama, [20, 1152, 16, 4, 72, 3168, 50304], 1e4, false, 2048),
    p("large", Llama, [24, 1536, 24, 6, 64, 4224, 50304], 1e4, false, 2048),
    p("xlarge", Llama, [32, 1920, 16, 4, 120, 5280, 50304], 1e4, false, 2048),
    // Seed 003's families.
    p("llama2-1.36b", Llama, [18, 2304, 18, 18, 128, 6144, 32000], 1e4, false, 2048),
    p("llama3-1.5b", Llama, [18, 2048, 16, 8, 128, 7168, 128256], 5e5, false, 2048),
    p("llama3-2.2b", Llama, [30, 2048, 16, 8, 128, 7168, 128256], 5e5, false, 2048),
    p("qwen3-1.8b", Qwen3, [24, 2048, 16, 8, 128, 6144, 151936], 1e6, false, 2048),
    p("gpt2-1.36b", Gpt2, [18, 2304, 18, 18, 128, 9216, 50304], 0.0, false, 2048),
    // Seed 004's GPT-2 1B.
    p("gpt2-1b", Gpt2, [24, 1536, 24, 24, 64, 6144, 50304], 0.0, true, 2048),
];

/// Looks a preset up by name.
pub fn preset(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name)
}

/// Names of every preset, for error messages.
pub fn preset_names() -> Vec<&'static str> {
    PRESETS.iter().map(|p| p.name).collect()
}

/// A model's exact architecture after the preset and the spec's overrides.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelConfig {
    pub preset: String,
    pub arch: Arch,
    pub n_layer: u32,
    pub d_model: u32,
    pub n_head: u32,
    pub n_kv_head: u32,
    pub d_head: u32,
    pub d_ff: u32,
    pub vocab_size: u32,
    pub rope_theta: f64,
    pub tied_embeddings: bool,
    /// Context length: the RoPE table size, or the number of learned positions.
    pub max_seq_len: u32,
    pub norm_eps: f64,
}

/// Parameter counts, defined as `torch_reference.py --list` defines them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ParamCounts {
    /// Every parameter, a tied embedding counted once.
    pub total: u64,
    /// Total minus the norm weights and biases.
    pub without_norms: u64,
    /// Weights of every Linear layer, lm_head included, input embedding excluded.
    pub matmul: u64,
}

impl From<&Preset> for ModelConfig {
    fn from(p: &Preset) -> Self {
        ModelConfig {
            preset: p.name.to_string(),
            arch: p.arch,
            n_layer: p.n_layer,
            d_model: p.d_model,
            n_head: p.n_head,
            n_kv_head: p.n_kv_head,
            d_head: p.d_head,
            d_ff: p.d_ff,
            vocab_size: p.vocab_size,
            rope_theta: p.rope_theta,
            tied_embeddings: p.tied_embeddings,
            max_seq_len: p.seq_len,
            norm_eps: 1e-5,
        }
    }
}

impl ModelConfig {
    pub fn param_counts(&self) -> ParamCounts {
        let [l, d, hq, hk, dh, ff, v] =
            [self.n_layer, self.d_model, self.n_head, self.n_kv_head, self.d_head, self.d_ff, self.vocab_size]
                .map(u64::from);
        let embed = v * d;
        let lm_head = v * d;
        let (layer_matmul, layer_bias, layer_norms, final_norm, positions) = match self.arch {
            Arch::Llama | Arch::Qwen3 => {
                let attn = d * hq * dh + 2 * d * hk * dh + hq * dh * d;
                let mlp = 3 * d * ff;
                let qk_norm = if self.arch == Arch::Qwen3 { 2 * dh } else { 0 };
                (attn + mlp, 0, 2 * d + qk_norm, d, 0)
            }
            Arch::Gpt2 => {
                let attn = d * 3 * hq * dh + hq * dh * d;
                let mlp = 2 * d * ff;
                let bias = 3 * hq * dh + d + ff + d;
                (attn + mlp, bias, 4 * d, 2 * d, u64::from(self.max_seq_len) * d)
            }
        };
        let norms = l * layer_norms + final_norm;
        let total = embed
            + positions
            + l * (layer_matmul + layer_bias)
            + norms
            + if self.tied_embeddings { 0 } else { lm_head };
        ParamCounts { total, without_norms: total - norms, matmul: l * layer_matmul + lm_head }
    }

    /// Training FLOPs per token at context `seq`: 6·N_matmul + 12·L·H·d_head·T.
    pub fn flops_per_token(&self, seq: u32) -> f64 {
        let attn = 12.0 * f64::from(self.n_layer) * f64::from(self.n_head) * f64::from(self.d_head) * f64::from(seq);
        6.0 * self.param_counts().matmul as f64 + attn
    }

    /// Model FLOPs utilization of `tokens_per_second` against `peak_flops`.
    pub fn mfu(&self, seq: u32, tokens_per_second: f64, peak_flops: f64) -> f64 {
        tokens_per_second * self.flops_per_token(seq) / peak_flops
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `python3 torch_reference.py --list` (torch 2.11.0, seq 2048): total, without norms, matmul.
    const REFERENCE: &[(&str, u64, u64, u64)] = &[
        ("tiny", 85_340_672, 85_327_872, 59_572_224),
        ("small", 178_742_016, 178_716_672, 140_083_200),
        ("medium", 373_605_376, 373_555_200, 322_043_904),
        ("medium-large", 401_275_008, 401_227_776, 343_277_568),
        ("large", 763_307_520, 763_232_256, 685_965_312),
        ("xlarge", 1_461_413_760, 1_461_288_960, 1_364_705_280),
        ("llama2-1.36b", 1_294_159_104, 1_294_073_856, 1_220_345_856),
        ("llama3-1.5b", 1_544_628_224, 1_544_552_448, 1_281_884_160),
        ("llama3-2.2b", 2_224_154_624, 2_224_029_696, 1_961_361_408),
        ("qwen3-1.8b", 1_830_395_904, 1_830_289_408, 1_519_124_480),
        ("gpt2-1.36b", 1_383_681_024, 1_383_510_528, 1_262_518_272),
        ("gpt2-1b", 760_372_224, 760_221_696, 756_744_192),
    ];

    #[test]
    fn counts_equal_the_pytorch_reference() {
        for &(name, total, without_norms, matmul) in REFERENCE {
            let counts = ModelConfig::from(preset(name).unwrap()).param_counts();
            assert_eq!(counts, ParamCounts { total, without_norms, matmul }, "{name}");
        }
    }

    #[test]
    fn medium_large_matches_seed_002() {
        let c = ModelConfig::from(preset("medium-large").unwrap()).param_counts();
        assert_eq!(c.without_norms, 401_227_776);
    }

    #[test]
    fn laptop_presets_are_about_1m_and_10m() {
        let nano = ModelConfig::from(preset("nano").unwrap()).param_counts().total;
        let micro = ModelConfig::from(preset("micro").unwrap()).param_counts().total;
        assert!((800_000..1_500_000).contains(&nano), "nano has {nano}");
        assert!((8_000_000..13_000_000).contains(&micro), "micro has {micro}");
    }

    #[test]
    fn every_preset_is_consistent() {
        for p in PRESETS {
            assert_eq!(p.n_head % p.n_kv_head, 0, "{}", p.name);
            assert_eq!(p.d_head % 2, 0, "{}", p.name);
            assert_eq!((p.rope_theta == 0.0), (p.arch == Arch::Gpt2), "{}", p.name);
        }
        let mut names = preset_names();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), PRESETS.len(), "duplicate preset names");
    }

    #[test]
    fn flops_follow_the_reference_formula() {
        let m = ModelConfig::from(preset("xlarge").unwrap());
        let expected = 6.0 * 1_364_705_280.0 + 12.0 * 32.0 * 16.0 * 120.0 * 2048.0;
        assert_eq!(m.flops_per_token(2048), expected);
        assert!((m.mfu(2048, 1e4, H100_PEAK_BF16_FLOPS) - 1e4 * expected / 989e12).abs() < 1e-12);
    }
}
