//! Multiple-choice accuracy on held-out questions, two ways: the answer letter the
//! model generates greedily, and the option letter with the highest log-likelihood
//! after the prompt.

use tch::{Device, Kind, Tensor};

use super::reward::parse_answer;
use super::step::{pack, packed_logps};
use crate::Error;
use crate::data::corpus::McqRecord;
use crate::data::tokenizer::Tokenizer;
use crate::dist::{ProcessGroup, ReduceOp};
use crate::generate::{self, Sampling};
use crate::model::Model;

/// Accuracy on a question set.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct McqScore {
    pub questions: u64,
    /// Greedy generation: the parsed letter is the gold one.
    pub greedy: f64,
    /// The gold letter has the highest log-likelihood of " A" … " D".
    pub log_likelihood: f64,
    /// Greedy answers with no parseable letter.
    pub unparsed: f64,
}

/// How to run the evaluation.
#[derive(Clone, Copy, Debug)]
pub struct EvalOptions {
    /// Prompt tokens kept (the end of a longer prompt).
    pub max_prompt_tokens: usize,
    /// Tokens generated for the greedy answer.
    pub max_new_tokens: usize,
    /// Questions per forward pass.
    pub batch: usize,
    pub device: Device,
    pub autocast: bool,
}

/// Scores `records`; with a group, rank r takes every world-th question and every rank
/// gets the totals.
pub fn evaluate(
    model: &Model,
    tok: &Tokenizer,
    records: &[McqRecord],
    o: &EvalOptions,
    group: Option<&ProcessGroup>,
) -> Result<McqScore, Error> {
    let (rank, world) = group.map_or((0, 1), |g| (g.rank() as usize, g.world_size() as usize));
    let mine: Vec<&McqRecord> = records.iter().skip(rank).step_by(world).collect();
    let eos = tok.eos_id();
    let letters: Vec<Vec<i64>> = (0..4).map(|i| ids(tok, &format!(" {}", McqRecord::letter(i)))).collect();
    let greedy = Sampling { temperature: 0.0, top_k: 0, top_p: 1.0 };
    let mut totals = [0.0f64; 4]; // questions, greedy correct, log-likelihood correct, unparsed
    tch::no_grad(|| -> Result<(), Error> {
        for chunk in mine.chunks(o.batch.max(1)) {
            let prompts: Vec<Vec<i64>> = chunk
                .iter()
                .map(|r| {
                    let p = ids(tok, &r.prompt());
                    p[p.len().saturating_sub(o.max_prompt_tokens)..].to_vec()
                })
                .collect();
            let out = crate::ffi::autocast(o.device, o.autocast, || {
                generate::generate_cached(model, &prompts, o.max_new_tokens, &greedy, Some(eos as i64), o.device)
            })?;
            for (r, c) in chunk.iter().zip(&out) {
                let text: Vec<u32> = c.iter().map(|&t| t as u32).take_while(|&t| t != eos).collect();
                let answer = parse_answer(&tok.decode(&text));
                totals[0] += 1.0;
                totals[1] += f64::from(u8::from(answer == Some(r.answer)));
                totals[3] += f64::from(u8::from(answer.is_none()));
            }
            let rows: Vec<(&[i64], &[i64])> =
                prompts.iter().flat_map(|p| letters.iter().map(move |l| (p.as_slice(), l.as_slice()))).collect();
            let packed = pack(&rows, eos as i64, o.device)?;
            let logps = packed_logps(model, &packed, 1.0, o.autocast, None)?;
            let per_option = logps.f_mul(&packed.mask)?.f_sum_dim_intlist(1, false, Kind::Float)?.f_view([-1, 4])?;
            let best = Vec::<i64>::try_from(per_option.f_argmax(1, false)?.f_to_device(Device::Cpu)?)?;
            totals[2] += chunk.iter().zip(best).filter(|(r, b)| r.answer as i64 == *b).count() as f64;
        }
        Ok(())
    })?;
    if let Some(g) = group {
        let t = Tensor::f_from_slice(&totals)?.f_to_device(o.device)?;
        g.allreduce(&t, ReduceOp::Sum)?.wait()?;
        totals.copy_from_slice(&Vec::<f64>::try_from(t.f_to_device(Device::Cpu)?)?);
    }
    let n = totals[0].max(1.0);
    Ok(McqScore {
        questions: totals[0] as u64,
        greedy: totals[1] / n,
        log_likelihood: totals[2] / n,
        unparsed: totals[3] / n,
    })
}

fn ids(tok: &Tokenizer, text: &str) -> Vec<i64> {
    tok.encode(text).into_iter().map(i64::from).collect()
}
