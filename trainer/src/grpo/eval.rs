//! Multiple-choice accuracy on held-out questions, two ways: the answer letter the
//! model generates greedily, and the option letter with the highest log-likelihood
//! after the prompt.

use tch::{Device, Kind};

use super::reward::parse_answer;
use super::stats::{McqScore, McqTally};
use super::step::{pack, packed_logps};
use crate::Error;
use crate::data::corpus::McqRecord;
use crate::data::tokenizer::Tokenizer;
use crate::dist::ProcessGroup;
use crate::generate::{self, Sampling};
use crate::model::Model;

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
    let mut totals = McqTally::default();
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
                totals.questions += 1.0;
                totals.greedy_correct += f64::from(u8::from(answer == Some(r.answer)));
                totals.unparsed += f64::from(u8::from(answer.is_none()));
            }
            let rows: Vec<(&[i64], &[i64])> =
                prompts.iter().flat_map(|p| letters.iter().map(move |l| (p.as_slice(), l.as_slice()))).collect();
            let packed = pack(&rows, eos as i64, o.device)?;
            let logps = packed_logps(model, &packed, 1.0, o.autocast, None)?;
            let per_option = logps.f_mul(&packed.mask)?.f_sum_dim_intlist(1, false, Kind::Float)?.f_view([-1, 4])?;
            let best = Vec::<i64>::try_from(per_option.f_argmax(1, false)?.f_to_device(Device::Cpu)?)?;
            totals.log_likelihood_correct +=
                chunk.iter().zip(best).filter(|(r, b)| r.answer as i64 == *b).count() as f64;
        }
        Ok(())
    })?;
    if let Some(g) = group {
        crate::dist::allreduce_sum(g, &mut totals, o.device)?;
    }
    Ok(totals.score())
}

fn ids(tok: &Tokenizer, text: &str) -> Vec<i64> {
    tok.encode(text).into_iter().map(i64::from).collect()
}
