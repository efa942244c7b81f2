//! Sampling (temperature, top-k, top-p) and generation: batched incremental decoding
//! with a KV cache, in steps a CUDA graph replays ([`graph`]) or eagerly, and the plain
//! full-prefix loop both are checked and benchmarked against.

pub mod graph;

use tch::{Kind, TchError, Tensor};

use crate::Error;
use crate::data::tokenizer::Tokenizer;
use crate::model::Model;

/// How to pick each next token. `temperature == 0` is greedy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    pub temperature: f64,
    /// Keep the k most likely tokens; 0 keeps all.
    pub top_k: i64,
    /// Keep the smallest set whose probability reaches p; 1.0 keeps all.
    pub top_p: f64,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling { temperature: 0.8, top_k: 0, top_p: 0.95 }
    }
}

/// Next-token ids (B) from last-position logits (B, V).
pub fn sample_next(logits: &Tensor, s: &Sampling) -> Result<Tensor, TchError> {
    if s.temperature <= 0.0 {
        return logits.f_argmax(-1, false);
    }
    sampled_logits(logits, s)?.f_softmax(-1, Kind::Float)?.f_multinomial(1, false)?.f_squeeze_dim(-1)
}

/// Next-token ids (B) from last-position logits (B, V), drawn from the distribution
/// [`sample_next`] draws from by the Gumbel-max trick: the argmax of the scaled and cut
/// logits minus the log of Exp(1) noise. It is elementwise ops, one random fill of a
/// fixed shape and an argmax, with no host synchronisation and no data-dependent shape,
/// so a CUDA graph can capture it (libtorch's Philox generator advances inside the
/// graph); `multinomial` cannot be captured.
pub fn sample_next_in_graph(logits: &Tensor, s: &Sampling) -> Result<Tensor, TchError> {
    if s.temperature <= 0.0 {
        return logits.f_argmax(-1, false);
    }
    let cut = sampled_logits(logits, s)?;
    let mut noise = cut.f_empty_like()?;
    let noise = noise.f_exponential_(1.0)?;
    cut.f_sub(&noise.f_log()?)?.f_argmax(-1, false)
}

/// `logits` (B, V) in f32 over the temperature, the tokens top-k and top-p leave out at −∞.
fn sampled_logits(logits: &Tensor, s: &Sampling) -> Result<Tensor, TchError> {
    let mut logits = logits.f_to_kind(Kind::Float)?.f_div_scalar(s.temperature)?;
    let v = *logits.size().last().expect("logits have a vocab dimension");
    if s.top_k > 0 && s.top_k < v {
        let (kth, _) = logits.f_topk(s.top_k, -1, true, true)?;
        let threshold = kth.f_narrow(-1, s.top_k - 1, 1)?; // (B, 1)
        logits = logits.f_masked_fill(&logits.f_lt_tensor(&threshold)?, f64::NEG_INFINITY)?;
    }
    if s.top_p < 1.0 {
        logits = logits.f_masked_fill(&nucleus_drop(&logits, s.top_p)?, f64::NEG_INFINITY)?;
    }
    Ok(logits)
}

/// The tokens top-p sampling leaves out of temperature-scaled `logits` (…, V): a token
/// goes when the more likely ones before it already reach `top_p`; the first stays.
pub fn nucleus_drop(logits: &Tensor, top_p: f64) -> Result<Tensor, TchError> {
    let (sorted, order) = logits.f_sort(-1, true)?;
    let probs = sorted.f_softmax(-1, Kind::Float)?;
    let before = probs.f_cumsum(-1, Kind::Float)?.f_sub(&probs)?;
    let drop_sorted = before.f_ge(top_p)?;
    drop_sorted.f_scatter(-1, &order, &drop_sorted)
}

/// Extends `prompt` (B, T) by up to `max_new` tokens, stopping early when every row
/// has produced `stop`. Recomputes the whole prefix each step; the context window
/// slides when the sequence outgrows the model.
pub fn generate(
    model: &Model,
    prompt: &Tensor,
    max_new: usize,
    s: &Sampling,
    stop: Option<i64>,
) -> Result<Tensor, TchError> {
    let ctx = model.config().max_seq_len as i64;
    tch::no_grad(|| {
        let mut seq = prompt.shallow_clone();
        let mut done = Tensor::f_zeros([prompt.size()[0]], (Kind::Bool, prompt.device()))?;
        for _ in 0..max_new {
            let t = seq.size()[1];
            let window = if t > ctx { seq.f_narrow(1, t - ctx, ctx)? } else { seq.shallow_clone() };
            let logits = model.logits(&window)?;
            let last = logits.f_select(1, window.size()[1] - 1)?; // (B, V)
            let next = sample_next(&last, s)?;
            seq = Tensor::f_cat(&[&seq, &next.f_unsqueeze(1)?], 1)?;
            if let Some(stop) = stop {
                done = done.f_logical_or(&next.f_eq(stop)?)?;
                if done.f_all()?.int64_value(&[]) != 0 {
                    break;
                }
            }
        }
        Ok(seq)
    })
}

/// Completions of `prompts` (token ids, any lengths), decoded together with a KV
/// cache: the prompts are left-padded into one batch, and each step feeds one token
/// per row. A row ends at `stop` (kept) or after `max_new` tokens; decoding ends when
/// every row has. Prompt plus completion must fit the model's context. The reference of
/// [`graph::generate_static`], which decodes the same way in steps a CUDA graph replays.
pub fn generate_cached(
    model: &Model,
    prompts: &[Vec<i64>],
    max_new: usize,
    s: &Sampling,
    stop: Option<i64>,
    device: tch::Device,
) -> Result<Vec<Vec<i64>>, TchError> {
    let batch = LeftPadded::new(model, prompts, max_new, device)?;
    tch::no_grad(|| {
        let mut cache = model.new_cache(batch.rows, batch.len + max_new as i64)?;
        let (mut x, mut r) = (batch.ids.shallow_clone(), batch.real.shallow_clone());
        let ones = Tensor::f_ones([batch.rows, 1], (Kind::Bool, device))?;
        let mut done = Tensor::f_zeros([batch.rows], (Kind::Bool, device))?;
        let mut out = Vec::with_capacity(max_new);
        for _ in 0..max_new {
            let logits = model.decode(&x, &r, &mut cache)?; // (B, V)
            let next = sample_next(&logits, s)?; // (B)
            out.push(next.shallow_clone());
            if let Some(stop) = stop {
                done = done.f_logical_or(&next.f_eq(stop)?)?;
                if done.f_all()?.int64_value(&[]) != 0 {
                    break;
                }
            }
            x = next.f_unsqueeze(1)?;
            r = ones.shallow_clone();
        }
        completions(&Tensor::f_stack(&out, 1)?, stop)
    })
}

/// Prompts left-padded into one batch for decoding with a KV cache.
struct LeftPadded {
    /// (B, T) token ids; padding repeats the row's first token.
    ids: Tensor,
    /// (B, T) false at padding.
    real: Tensor,
    rows: i64,
    /// T: the longest prompt.
    len: i64,
}

impl LeftPadded {
    /// Checks that every prompt has a token and fits the context with `max_new` more.
    fn new(model: &Model, prompts: &[Vec<i64>], max_new: usize, device: tch::Device) -> Result<Self, TchError> {
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
        if prompts.is_empty() || prompts.iter().any(Vec::is_empty) {
            return Err(TchError::Shape("generate: every prompt needs at least one token".into()));
        }
        let ctx = model.config().max_seq_len as usize;
        if longest + max_new > ctx {
            return Err(TchError::Shape(format!(
                "a prompt of {longest} tokens plus {max_new} new ones exceeds the model's context of {ctx}"
            )));
        }
        let mut ids = Vec::with_capacity(prompts.len() * longest);
        let mut real = Vec::with_capacity(ids.capacity());
        for p in prompts {
            let pad = longest - p.len();
            ids.extend(std::iter::repeat_n(p[0], pad).chain(p.iter().copied()));
            real.extend(std::iter::repeat_n(false, pad).chain(std::iter::repeat_n(true, p.len())));
        }
        let (rows, len) = (prompts.len() as i64, longest as i64);
        Ok(LeftPadded {
            ids: Tensor::f_from_slice(&ids)?.f_view([rows, len])?.f_to_device(device)?,
            real: Tensor::f_from_slice(&real)?.f_view([rows, len])?.f_to_device(device)?,
            rows,
            len,
        })
    }
}

/// Each row of `tokens` (B, n) up to and with its first `stop`.
fn completions(tokens: &Tensor, stop: Option<i64>) -> Result<Vec<Vec<i64>>, TchError> {
    let out = tokens.f_to_device(tch::Device::Cpu)?;
    (0..out.size()[0])
        .map(|row| {
            let row = Vec::<i64>::try_from(out.f_get(row)?)?;
            let end = stop.and_then(|s| row.iter().position(|&id| id == s)).map_or(row.len(), |i| i + 1);
            Ok(row[..end].to_vec())
        })
        .collect()
}

/// `n` completions of `prompt`, each decoded up to its first end-of-text token.
pub fn complete(
    model: &Model,
    tok: &Tokenizer,
    prompt: &str,
    n: usize,
    max_new: usize,
    s: &Sampling,
    device: tch::Device,
) -> Result<Vec<String>, Error> {
    let ids: Vec<i64> = tok.encode(prompt).into_iter().map(i64::from).collect();
    if ids.is_empty() {
        return Err(Error::InvalidSpec("--prompt: encodes to no tokens".into()));
    }
    let ctx = model.config().max_seq_len as usize;
    // Keep the end of a prompt too long for the context (the question's tail matters most).
    let ids = ids[ids.len().saturating_sub(ctx.saturating_sub(max_new).max(1))..].to_vec();
    let max_new = max_new.min(ctx - ids.len());
    let eos = tok.eos_id();
    let rows = generate_cached(model, &vec![ids; n], max_new, s, Some(eos as i64), device)?;
    Ok(rows
        .iter()
        .map(|row| tok.decode(&row.iter().map(|&id| id as u32).take_while(|&id| id != eos).collect::<Vec<_>>()))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits() -> Tensor {
        // probabilities ∝ [0.5, 0.3, 0.15, 0.05]
        Tensor::from_slice(&[0.5f32, 0.3, 0.15, 0.05]).log().view([1, 4])
    }

    fn counts(s: Sampling, n: usize) -> [usize; 4] {
        counts_of(sample_next, s, n)
    }

    fn counts_of(sampler: fn(&Tensor, &Sampling) -> Result<Tensor, TchError>, s: Sampling, n: usize) -> [usize; 4] {
        tch::manual_seed(0);
        let mut c = [0; 4];
        let rows = logits().expand([n as i64, 4], false).contiguous();
        let picks = Vec::<i64>::try_from(sampler(&rows, &s).unwrap()).unwrap();
        for p in picks {
            c[p as usize] += 1;
        }
        c
    }

    /// Greedy decoding of prompts of different lengths, batched with the KV cache,
    /// gives exactly the tokens of the full-prefix loop run on each prompt alone.
    #[test]
    fn kv_cache_greedy_equals_the_full_prefix_loop() {
        use crds::presets::Arch;
        let greedy = Sampling { temperature: 0.0, top_k: 0, top_p: 1.0 };
        for arch in [Arch::Llama, Arch::Qwen3, Arch::Gpt2] {
            let cfg = crate::model::tests::small(arch, arch == Arch::Gpt2);
            tch::manual_seed(7);
            let vs = tch::nn::VarStore::new(tch::Device::Cpu);
            let model = Model::new(&vs.root(), &cfg, tch::Device::Cpu).unwrap();
            let prompts: Vec<Vec<i64>> = vec![vec![5, 17, 3], vec![9], vec![40, 41, 42, 43, 44, 45, 46], vec![2, 2]];
            let cached = generate_cached(&model, &prompts, 12, &greedy, None, tch::Device::Cpu).unwrap();
            for (p, got) in prompts.iter().zip(&cached) {
                let x = Tensor::from_slice(p).view([1, -1]);
                let full = generate(&model, &x, 12, &greedy, None).unwrap();
                let want = Vec::<i64>::try_from(full.get(0)).unwrap()[p.len()..].to_vec();
                assert_eq!(got, &want, "{arch:?}, prompt {p:?}");
            }
            // The logits, not just their argmax, agree.
            let mut cache = model.new_cache(2, 16).unwrap();
            let x = Tensor::from_slice(&[1i64, 5, 17, 3, 8, 9, 10, 11]).view([2, 4]);
            let real = Tensor::from_slice(&[false, true, true, true, true, true, true, true]).view([2, 4]);
            let last = tch::no_grad(|| model.decode(&x, &real, &mut cache)).unwrap();
            let alone = model.logits(&Tensor::from_slice(&[5i64, 17, 3]).view([1, 3])).unwrap().get(0).get(2);
            assert!(f64::try_from(last.get(0).f_sub(&alone).unwrap().abs().max()).unwrap() < 1e-5, "{arch:?}");
            let next = Tensor::from_slice(&[4i64, 4]).view([2, 1]);
            let step =
                tch::no_grad(|| model.decode(&next, &Tensor::ones([2, 1], (Kind::Bool, tch::Device::Cpu)), &mut cache))
                    .unwrap();
            let alone = model.logits(&Tensor::from_slice(&[8i64, 9, 10, 11, 4]).view([1, 5])).unwrap().get(0).get(4);
            assert!(f64::try_from(step.get(1).f_sub(&alone).unwrap().abs().max()).unwrap() < 1e-5, "{arch:?}");
        }
    }

    /// A stop token ends its row (kept), and the other rows go on.
    #[test]
    fn rows_end_at_the_stop_token() {
        let cfg = crate::model::tests::small(crds::presets::Arch::Llama, false);
        tch::manual_seed(3);
        let vs = tch::nn::VarStore::new(tch::Device::Cpu);
        let model = Model::new(&vs.root(), &cfg, tch::Device::Cpu).unwrap();
        let greedy = Sampling { temperature: 0.0, top_k: 0, top_p: 1.0 };
        let prompts = vec![vec![1i64, 2, 3], vec![7, 8]];
        let free = generate_cached(&model, &prompts, 10, &greedy, None, tch::Device::Cpu).unwrap();
        let stop = free[0][3];
        let cut = generate_cached(&model, &prompts, 10, &greedy, Some(stop), tch::Device::Cpu).unwrap();
        let end = free[0].iter().position(|&t| t == stop).unwrap();
        assert_eq!(cut[0], free[0][..=end]);
        let end1 = free[1].iter().position(|&t| t == stop).map_or(free[1].len(), |i| i + 1);
        assert_eq!(cut[1], free[1][..end1]);
        assert!(
            generate_cached(&model, &[vec![1; 30]], 5, &greedy, None, tch::Device::Cpu).is_err(),
            "past the context"
        );
    }

    /// The graph-capturable sampler draws from the same distribution as `multinomial`:
    /// the frequencies of 20,000 draws per setting within 0.015 of the cut and
    /// renormalised probabilities, and the cut tokens never.
    #[test]
    fn the_gumbel_max_sampler_draws_from_the_same_distribution() {
        let n = 20_000;
        // (temperature, top_k, top_p, expected probabilities)
        let settings = [
            (Sampling { temperature: 1.0, top_k: 0, top_p: 1.0 }, [0.5, 0.3, 0.15, 0.05]),
            (Sampling { temperature: 1.0, top_k: 2, top_p: 1.0 }, [0.625, 0.375, 0.0, 0.0]),
            (Sampling { temperature: 1.0, top_k: 0, top_p: 0.9 }, [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0]),
            // T = 0.5 squares the probabilities before renormalising.
            (
                Sampling { temperature: 0.5, top_k: 0, top_p: 1.0 },
                [0.25 / 0.365, 0.09 / 0.365, 0.0225 / 0.365, 0.0025 / 0.365],
            ),
        ];
        for (s, want) in settings {
            let got = counts_of(sample_next_in_graph, s, n);
            for (token, (&g, &w)) in got.iter().zip(&want).enumerate() {
                let f = g as f64 / n as f64;
                assert!((f - w).abs() < 0.015, "{s:?}: token {token} drawn {f:.4}, expected {w:.4} ({got:?})");
                if w == 0.0 {
                    assert_eq!(g, 0, "{s:?}: token {token} is cut");
                }
            }
        }
        let greedy = Sampling { temperature: 0.0, top_k: 0, top_p: 1.0 };
        assert_eq!(sample_next_in_graph(&logits(), &greedy).unwrap().int64_value(&[0]), 0);
    }

    #[test]
    fn greedy_takes_the_argmax() {
        let s = Sampling { temperature: 0.0, top_k: 0, top_p: 1.0 };
        assert_eq!(sample_next(&logits(), &s).unwrap().int64_value(&[0]), 0);
    }

    #[test]
    fn top_k_and_top_p_cut_the_tail() {
        let k2 = counts(Sampling { temperature: 1.0, top_k: 2, top_p: 1.0 }, 4000);
        assert_eq!((k2[2], k2[3]), (0, 0));
        assert!((k2[0] as f64 / 4000.0 - 0.625).abs() < 0.03, "{k2:?}");
        // 0.5 + 0.3 reaches 0.8: the third token is kept only while the first two stay below p.
        let p8 = counts(Sampling { temperature: 1.0, top_k: 0, top_p: 0.8 }, 4000);
        assert_eq!((p8[2], p8[3]), (0, 0), "{p8:?}");
        let p9 = counts(Sampling { temperature: 1.0, top_k: 0, top_p: 0.9 }, 4000);
        assert!(p9[2] > 0 && p9[3] == 0, "{p9:?}");
        let all = counts(Sampling { temperature: 1.0, top_k: 0, top_p: 1.0 }, 4000);
        assert!(all[3] > 100, "{all:?}");
    }
}
