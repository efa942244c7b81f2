//! `trainer bench-generate`: GRPO's sampler, batched incremental decoding with the KV
//! cache (eagerly, and in static steps replayed from CUDA graphs on CUDA), against the
//! full-prefix loop that recomputes every position for every new token, on the same
//! model, prompts and device, with their greedy outputs compared.
//! On a trained checkpoint each row where the two part is explained: the logits' top-2
//! margin at the parting step against bf16's resolution there.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use crds::presets::ModelConfig;
use serde_json::{Value, json};
use tch::{Device, Kind, Tensor};

use crate::Error;
use crate::generate::graph::{StaticDecoding, generate_static};
use crate::generate::{self, Sampling};
use crate::model::Model;

#[derive(Debug)]
pub struct GenerateBenchOptions {
    pub model: ModelConfig,
    /// A trained model and its prompts; a seeded random initialisation and random
    /// prompts otherwise.
    pub trained: Option<Trained>,
    pub device: Device,
    pub batch: usize,
    pub prompt_tokens: usize,
    pub new_tokens: usize,
    /// bf16 weights (CUDA); f32 otherwise.
    pub bf16: bool,
    /// Times each KV-cache decoder this many times (the median counts).
    pub repeats: usize,
    /// The static decoder's bucket of cache slots (`generate::graph`).
    pub bucket: i64,
    /// Also time the full-prefix loop and compare its outputs.
    pub full_prefix: bool,
    /// Write the model as a Hugging Face directory here, with `generate.json` (the
    /// prompts and the KV-cache decoder's greedy tokens), for a peer to decode the same.
    pub hf_dir: Option<std::path::PathBuf>,
}

/// A checkpoint's weights and real prompts, each `prompt_tokens` long.
#[derive(Debug)]
pub struct Trained {
    pub weights: HashMap<String, Tensor>,
    /// Where the weights came from, for errors.
    pub source: PathBuf,
    pub prompts: Vec<Vec<i64>>,
}

/// A row where the full-prefix loop's greedy token differs from the KV cache's.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Parting {
    pub row: usize,
    /// Index of the first differing new token.
    pub step: usize,
    /// The full-prefix logits' top-1 minus top-2 at that step, computed in the
    /// benchmark's dtype and read in f32.
    pub margin: f64,
    /// The spacing of bf16 values at the top logit: a margin under it is a tie that
    /// rounding decides.
    pub bf16_spacing: f64,
}

/// The spacing between adjacent bf16 values at `v` (8 significant bits).
pub fn bf16_spacing(v: f64) -> f64 {
    if v == 0.0 || !v.is_finite() {
        return f64::MIN_POSITIVE;
    }
    2f64.powi(v.abs().log2().floor() as i32 - 7)
}

/// The first index where `a` and `b` differ, if any.
fn first_difference(a: &[i64], b: &[i64]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y).or((a.len() != b.len()).then(|| a.len().min(b.len())))
}

/// Top-1 minus top-2 of the model's next-token logits after `prefix`, and the top logit.
fn top2_margin(model: &Model, prefix: &[i64], device: Device) -> Result<(f64, f64), Error> {
    let x = Tensor::f_from_slice(prefix)?.f_view([1, prefix.len() as i64])?.f_to_device(device)?;
    let logits = tch::no_grad(|| model.logits(&x))?;
    let last = logits.f_select(1, prefix.len() as i64 - 1)?.f_to_kind(Kind::Float)?.f_view([-1])?;
    let (top, _) = last.f_topk(2, 0, true, true)?;
    let top = Vec::<f32>::try_from(top.f_to_device(Device::Cpu)?)?;
    Ok(((top[0] - top[1]) as f64, top[0] as f64))
}

/// Times both decoders once after a short warm-up and returns the JSON summary.
pub fn run(o: &GenerateBenchOptions) -> Result<Value, Error> {
    if o.bucket < 1 {
        return Err(Error::InvalidSpec(format!("--bucket {}: must be at least 1", o.bucket)));
    }
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
    if let Some(t) = &o.trained {
        crate::checkpoint::resume::copy_weights(&vs, &t.weights, &t.source)?;
    }
    if o.bf16 {
        vs.bfloat16();
    }
    vs.set_device(o.device);
    let vocab = o.model.vocab_size as i64;
    let prompts: Vec<Vec<i64>> = match &o.trained {
        Some(t) => {
            if let Some((row, p)) = t.prompts.iter().enumerate().find(|(_, p)| p.len() != o.prompt_tokens) {
                return Err(Error::InvalidSpec(format!(
                    "--prompt-tokens {}: prompt {row} has {} tokens",
                    o.prompt_tokens,
                    p.len()
                )));
            }
            t.prompts.clone()
        }
        None => (0..o.batch as u64)
            .map(|b| {
                (0..o.prompt_tokens as u64)
                    .map(|i| (crate::rng::splitmix64(b * 7919 + i) % vocab as u64) as i64)
                    .collect()
            })
            .collect(),
    };
    let batch = prompts.len();
    let flat: Vec<i64> = prompts.concat();
    let x = Tensor::f_from_slice(&flat)?.f_view([batch as i64, o.prompt_tokens as i64])?.f_to_device(o.device)?;
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
    // The static decoder: CUDA graphs on CUDA, its eager steps elsewhere. Its first run
    // also captures the graphs.
    let how = StaticDecoding { bucket: o.bucket, ..StaticDecoding::default() };
    let graphs = how.graphs && o.device.is_cuda() && crate::ffi::shim_built_with_cuda();
    let mut static_times = Vec::new();
    let mut decoded = Vec::new();
    for repeat in 0..o.repeats.max(1) + 1 {
        let started = Instant::now();
        decoded = generate_static(&model, &prompts, o.new_tokens, &greedy, None, o.device, how)?;
        sync();
        if repeat > 0 {
            static_times.push(started.elapsed().as_secs_f64());
        }
    }
    let static_s = super::step::median(&static_times).unwrap_or(f64::NAN);
    let static_same = cached.iter().zip(&decoded).filter(|(a, b)| a == b).count();
    let (full_s, partings) = if o.full_prefix {
        let started = Instant::now();
        let full = generate::generate(&model, &x, o.new_tokens, &greedy, None)?;
        let full = full
            .f_narrow(1, o.prompt_tokens as i64, o.new_tokens as i64)?
            .f_to_kind(Kind::Int64)?
            .f_to_device(Device::Cpu)?;
        sync();
        let full_s = started.elapsed().as_secs_f64();
        let mut partings = Vec::new();
        for (row, ours) in cached.iter().enumerate() {
            let theirs = Vec::<i64>::try_from(full.f_get(row as i64)?)?;
            if let Some(step) = first_difference(ours, &theirs) {
                let prefix: Vec<i64> = prompts[row].iter().chain(&ours[..step]).copied().collect();
                let (margin, top) = top2_margin(&model, &prefix, o.device)?;
                partings.push(Parting { row, step, margin, bf16_spacing: bf16_spacing(top) });
            }
        }
        (Some(full_s), Some(partings))
    } else {
        (None, None)
    };
    let same = partings.as_ref().map(|p| batch - p.len());
    if let Some(dir) = &o.hf_dir {
        let weights = vs.variables();
        crate::export::export_hf(&o.model, &weights, None, dir)?;
        let decoded = json!({"prompts": prompts, "outputs": cached});
        let path = dir.join("generate.json");
        std::fs::write(&path, decoded.to_string()).map_err(crate::io_err(&path))?;
    }

    let tokens = (batch * o.new_tokens) as f64;
    let summary = json!({
        "preset": o.model.preset,
        "device": format!("{:?}", o.device),
        "dtype": if o.bf16 { "bf16" } else { "f32" },
        "weights": o.trained.as_ref().map_or("random".to_string(), |t| t.source.display().to_string()),
        "batch": batch,
        "prompt_tokens": o.prompt_tokens,
        "new_tokens": o.new_tokens,
        "threads": tch::get_num_threads(),
        "kv_cache_tokens_per_s": tokens / cached_s,
        "kv_cache_runs_s": cached_times,
        "static_decoder": if graphs { "cuda graphs" } else { "eager steps" },
        "static_bucket": o.bucket,
        "static_tokens_per_s": tokens / static_s,
        "static_runs_s": static_times,
        "static_vs_kv_cache": cached_s / static_s,
        "static_vs_full_prefix": full_s.map(|f| f / static_s),
        "static_rows_identical_to_kv_cache": format!("{static_same}/{batch}"),
        "full_prefix_tokens_per_s": full_s.map(|f| tokens / f),
        "speedup": full_s.map(|f| f / cached_s),
        "greedy_rows_identical": same.map(|same| format!("{same}/{batch}")),
        "greedy_agreement": same.map(|same| same as f64 / batch as f64),
        "partings": partings,
        "partings_within_bf16_spacing": partings.as_ref().map(|p| p.iter().filter(|p| p.margin <= p.bf16_spacing).count()),
    });
    eprintln!(
        "{} on {:?} ({}), {} rows × ({} prompt + {} new tokens):\n  KV cache     {:>10.0} tok/s\n  static ({})  {:>10.0} tok/s ({:.2}× the KV cache; greedy outputs identical to it in {static_same}/{batch} rows)",
        o.model.preset,
        o.device,
        if o.bf16 { "bf16" } else { "f32" },
        batch,
        o.prompt_tokens,
        o.new_tokens,
        tokens / cached_s,
        if graphs { "graphs" } else { "eager" },
        tokens / static_s,
        cached_s / static_s,
    );
    if let (Some(full_s), Some(same)) = (full_s, same) {
        eprintln!(
            "  full prefix  {:>10.0} tok/s\n  speedup      {:>10.2}×   greedy outputs identical in {same}/{} rows",
            tokens / full_s,
            full_s / cached_s,
            batch
        );
    }
    for p in partings.iter().flatten() {
        eprintln!(
            "  row {:>4} parts at new token {:>4}: top-2 margin {:.3e}, bf16 spacing {:.3e}",
            p.row, p.step, p.margin, p.bf16_spacing
        );
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_spacing_is_one_part_in_128_of_the_leading_power_of_two() {
        let table =
            [(1.0, 1.0 / 128.0), (1.5, 1.0 / 128.0), (2.0, 1.0 / 64.0), (-12.0, 8.0 / 128.0), (0.3, 0.25 / 128.0)];
        for (v, want) in table {
            assert_eq!(bf16_spacing(v), want, "at {v}");
        }
    }

    #[test]
    fn first_difference_finds_the_parting_token() {
        let table: [(&[i64], &[i64], Option<usize>); 4] = [
            (&[1, 2, 3], &[1, 2, 3], None),
            (&[1, 2, 3], &[1, 5, 3], Some(1)),
            (&[4], &[5], Some(0)),
            (&[1, 2], &[1, 2, 3], Some(2)),
        ];
        for (a, b, want) in table {
            assert_eq!(first_difference(a, b), want, "{a:?} vs {b:?}");
        }
    }
}
