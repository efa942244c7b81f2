//! `trainer bench-generate`: GRPO's sampler, batched incremental decoding with the KV
//! cache, against the full-prefix loop that recomputes every position for every new
//! token, on the same model, prompts and device, with their greedy outputs compared.

use std::time::Instant;

use crds::presets::ModelConfig;
use serde_json::{Value, json};
use tch::{Device, Kind, Tensor};

use crate::Error;
use crate::generate::{self, Sampling};
use crate::model::Model;

#[derive(Clone, Debug)]
pub struct GenerateBenchOptions {
    pub model: ModelConfig,
    pub device: Device,
    pub batch: usize,
    pub prompt_tokens: usize,
    pub new_tokens: usize,
    /// bf16 weights (CUDA); f32 otherwise.
    pub bf16: bool,
    /// Times the KV-cache decoder this many times (the median counts).
    pub repeats: usize,
    /// Also time the full-prefix loop and compare its outputs.
    pub full_prefix: bool,
    /// Write the model as a Hugging Face directory here, with `generate.json` (the
    /// prompts and the KV-cache decoder's greedy tokens), for a peer to decode the same.
    pub hf_dir: Option<std::path::PathBuf>,
}

/// Times both decoders once after a short warm-up and returns the JSON summary.
pub fn run(o: &GenerateBenchOptions) -> Result<Value, Error> {
    let ctx = o.model.max_seq_len as usize;
    if o.prompt_tokens + o.new_tokens > ctx {
        return Err(Error::InvalidSpec(format!(
            "--prompt-tokens {} + --new-tokens {} exceed the preset's context of {ctx}",
            o.prompt_tokens, o.new_tokens
        )));
    }
    let mut vs = tch::nn::VarStore::new(Device::Cpu);
    let model = {
        let _rng = crate::rng::GLOBAL_RNG.lock().unwrap_or_else(|e| e.into_inner());
        tch::manual_seed(0);
        Model::new(&vs.root(), &o.model, o.device)?
    };
    if o.bf16 {
        vs.bfloat16();
    }
    vs.set_device(o.device);
    let vocab = o.model.vocab_size as i64;
    let prompts: Vec<Vec<i64>> = (0..o.batch as u64)
        .map(|b| {
            (0..o.prompt_tokens as u64).map(|i| (crate::rng::splitmix64(b * 7919 + i) % vocab as u64) as i64).collect()
        })
        .collect();
    let flat: Vec<i64> = prompts.concat();
    let x = Tensor::f_from_slice(&flat)?.f_view([o.batch as i64, o.prompt_tokens as i64])?.f_to_device(o.device)?;
    let greedy = Sampling { temperature: 0.0, top_k: 0, top_p: 1.0 };
    let sync = || {
        if let Device::Cuda(i) = o.device {
            tch::Cuda::synchronize(i as i64);
        }
    };
    // Warm-up: allocator, kernels, thread pools.
    generate::generate_cached(&model, &prompts, 4.min(o.new_tokens), &greedy, None, o.device)?;
    let _ = generate::generate(&model, &x, 4.min(o.new_tokens), &greedy, None)?;
    sync();

    let mut cached_times = Vec::new();
    let mut cached = Vec::new();
    for _ in 0..o.repeats.max(1) {
        let started = Instant::now();
        cached = generate::generate_cached(&model, &prompts, o.new_tokens, &greedy, None, o.device)?;
        sync();
        cached_times.push(started.elapsed().as_secs_f64());
    }
    let cached_s = super::step::median(&cached_times).unwrap_or(f64::NAN);
    let (full_s, same) = if o.full_prefix {
        let started = Instant::now();
        let full = generate::generate(&model, &x, o.new_tokens, &greedy, None)?;
        let full = full
            .f_narrow(1, o.prompt_tokens as i64, o.new_tokens as i64)?
            .f_to_kind(Kind::Int64)?
            .f_to_device(Device::Cpu)?;
        sync();
        let full_s = started.elapsed().as_secs_f64();
        let same = cached
            .iter()
            .enumerate()
            .filter(|(b, row)| Vec::<i64>::try_from(full.get(*b as i64)).is_ok_and(|f| f == **row))
            .count();
        (Some(full_s), Some(same))
    } else {
        (None, None)
    };
    if let Some(dir) = &o.hf_dir {
        let weights = vs.variables();
        crate::export::export_hf(&o.model, &weights, None, dir)?;
        let decoded = json!({"prompts": prompts, "outputs": cached});
        let path = dir.join("generate.json");
        std::fs::write(&path, decoded.to_string()).map_err(crate::io_err(&path))?;
    }

    let tokens = (o.batch * o.new_tokens) as f64;
    let summary = json!({
        "preset": o.model.preset,
        "device": format!("{:?}", o.device),
        "dtype": if o.bf16 { "bf16" } else { "f32" },
        "batch": o.batch,
        "prompt_tokens": o.prompt_tokens,
        "new_tokens": o.new_tokens,
        "threads": tch::get_num_threads(),
        "kv_cache_tokens_per_s": tokens / cached_s,
        "kv_cache_runs_s": cached_times,
        "full_prefix_tokens_per_s": full_s.map(|f| tokens / f),
        "speedup": full_s.map(|f| f / cached_s),
        "greedy_rows_identical": same.map(|same| format!("{same}/{}", o.batch)),
    });
    eprintln!(
        "{} on {:?} ({}), {} rows × ({} prompt + {} new tokens):\n  KV cache     {:>10.0} tok/s",
        o.model.preset,
        o.device,
        if o.bf16 { "bf16" } else { "f32" },
        o.batch,
        o.prompt_tokens,
        o.new_tokens,
        tokens / cached_s,
    );
    if let (Some(full_s), Some(same)) = (full_s, same) {
        eprintln!(
            "  full prefix  {:>10.0} tok/s\n  speedup      {:>10.2}×   greedy outputs identical in {same}/{} rows",
            tokens / full_s,
            full_s / cached_s,
            o.batch
        );
    }
    Ok(summary)
}
