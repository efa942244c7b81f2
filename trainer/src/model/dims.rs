//! The sizes every layer is built from, and the init scale.

use crds::presets::ModelConfig;

/// Standard deviation of every weight at init (GPT-2 / nanoGPT).
pub const INIT_STD: f64 = 0.02;

/// The sizes every layer needs, as i64 for tch.
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    pub n_layer: i64,
    pub d_model: i64,
    pub n_head: i64,
    pub n_kv_head: i64,
    pub d_head: i64,
    pub d_ff: i64,
    pub vocab: i64,
    pub max_seq: i64,
    pub eps: f64,
    /// Repeat K/V to every query head before SDPA instead of passing `enable_gqa`:
    /// cuDNN attention runs only on expanded K/V.
    pub expand_kv: bool,
}

impl Dims {
    pub fn of(cfg: &ModelConfig) -> Dims {
        Dims {
            n_layer: cfg.n_layer.into(),
            d_model: cfg.d_model.into(),
            n_head: cfg.n_head.into(),
            n_kv_head: cfg.n_kv_head.into(),
            d_head: cfg.d_head.into(),
            d_ff: cfg.d_ff.into(),
            vocab: cfg.vocab_size.into(),
            max_seq: cfg.max_seq_len.into(),
            eps: cfg.norm_eps,
            expand_kv: false,
        }
    }

    /// Residual output projections start smaller so the residual stream's variance
    /// does not grow with depth: 0.02 / √(2·layers).
    pub fn residual_std(&self) -> f64 {
        INIT_STD / (2.0 * self.n_layer as f64).sqrt()
    }
}
