//! Sampling: temperature, top-k and top-p (nucleus) over the full prefix.

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
    let mut logits = logits.f_to_kind(Kind::Float)?.f_div_scalar(s.temperature)?;
    let v = *logits.size().last().expect("logits have a vocab dimension");
    if s.top_k > 0 && s.top_k < v {
        let (kth, _) = logits.f_topk(s.top_k, -1, true, true)?;
        let threshold = kth.f_narrow(-1, s.top_k - 1, 1)?; // (B, 1)
        logits = logits.f_masked_fill(&logits.f_lt_tensor(&threshold)?, f64::NEG_INFINITY)?;
    }
    if s.top_p < 1.0 {
        let (sorted, order) = logits.f_sort(-1, true)?;
        let cumulative = sorted.f_softmax(-1, Kind::Float)?.f_cumsum(-1, Kind::Float)?;
        // Drop a token when the tokens before it already reach top_p; the first always stays.
        let before = cumulative.f_sub(&sorted.f_softmax(-1, Kind::Float)?)?;
        let drop_sorted = before.f_ge(s.top_p)?;
        let drop = drop_sorted.f_scatter(-1, &order, &drop_sorted)?;
        logits = logits.f_masked_fill(&drop, f64::NEG_INFINITY)?;
    }
    logits.f_softmax(-1, Kind::Float)?.f_multinomial(1, false)?.f_squeeze_dim(-1)
}

/// Extends `prompt` (B, T) by up to `max_new` tokens, stopping early when every row
/// has produced `stop`. Recomputes the whole prefix each step; the context window
/// slides when the sequence outgrows the model.
pub fn generate(model: &Model, prompt: &Tensor, max_new: usize, s: &Sampling, stop: Option<i64>) -> Result<Tensor, TchError> {
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
    let t = ids.len() as i64;
    let x = Tensor::from_slice(&ids).f_to_device(device)?.f_unsqueeze(0)?.f_expand([n as i64, t], false)?.f_contiguous()?;
    let out = generate(model, &x, max_new, s, Some(tok.eos_id() as i64))?;
    let new = out.f_narrow(1, t, out.size()[1] - t)?.f_to_device(tch::Device::Cpu)?;
    (0..n as i64)
        .map(|row| {
            let row = Vec::<i64>::try_from(new.f_get(row)?)?;
            let row: Vec<u32> = row.into_iter().map(|id| id as u32).take_while(|&id| id != tok.eos_id()).collect();
            Ok(tok.decode(&row))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits() -> Tensor {
        // probabilities ∝ [0.5, 0.3, 0.15, 0.05]
        Tensor::from_slice(&[0.5f32, 0.3, 0.15, 0.05]).log().view([1, 4])
    }

    fn counts(s: Sampling, n: usize) -> [usize; 4] {
        tch::manual_seed(0);
        let mut c = [0; 4];
        let rows = logits().expand([n as i64, 4], false).contiguous();
        let picks = Vec::<i64>::try_from(sample_next(&rows, &s).unwrap()).unwrap();
        for p in picks {
            c[p as usize] += 1;
        }
        c
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
