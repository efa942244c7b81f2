//! Multiple-choice evaluation as lm-evaluation-harness's `multiple_choice` tasks do it:
//! each option's continuation is scored by its summed log-likelihood after the
//! question's context (`acc`), and per character (`acc_norm`). Beside it, the project's
//! own greedy-letter accuracy: the answer letter the model generates.

use tch::{Device, Kind, Tensor};

use super::answer::parse_answer;
use super::fewshot::Fewshot;
use super::score::{McqScore, Outcome};
use super::task::{self, TARGET_DELIMITER};
use crate::Error;
use crate::data::mcq::{McqFormat, McqRecord, McqSet};
use crate::data::tokenizer::Tokenizer;
use crate::dist::{ProcessGroup, ReduceOp};
use crate::generate::{self, Sampling};
use crate::model::Model;

/// How to run an evaluation.
#[derive(Clone, Copy, Debug)]
pub struct EvalOptions {
    /// Tokens generated for the greedy answer (0: no greedy answer).
    pub max_new_tokens: usize,
    /// Questions per greedy generation batch.
    pub batch: usize,
    pub device: Device,
    pub autocast: bool,
}

/// One question as it was scored, as lm-eval logs a sample: the context before the
/// continuations, the continuations (without the target delimiter), each one's summed
/// log-likelihood, and the outcomes.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Sample {
    /// The question's index in its set.
    pub doc_id: usize,
    pub subject: Option<String>,
    pub context: String,
    pub choices: Vec<String>,
    pub target: usize,
    pub loglikelihoods: Vec<f64>,
    pub acc: bool,
    pub acc_norm: bool,
}

/// One log-likelihood request: the context's tokens and the continuation's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub context: Vec<i64>,
    pub continuation: Vec<i64>,
}

impl Request {
    /// `context` then `continuation` split as lm-eval's `_encode_pair` does: trailing
    /// spaces of the context move to the continuation, the whole is encoded at once and
    /// the continuation is what follows the context's own tokens.
    pub fn new(tok: &Tokenizer, context: &str, continuation: &str) -> Request {
        Self::each(tok, context, &[continuation.to_string()]).remove(0)
    }

    /// [`Request::new`] for each of `continuations` after one context, which is encoded
    /// once.
    pub fn each(tok: &Tokenizer, context: &str, continuations: &[String]) -> Vec<Request> {
        let trimmed = context.trim_end_matches(' ');
        let spaces = &context[trimmed.len()..];
        let ids = |s: &str| tok.encode(s).into_iter().map(i64::from).collect::<Vec<_>>();
        let context_len = ids(trimmed).len();
        continuations
            .iter()
            .map(|c| {
                let whole = ids(&format!("{trimmed}{spaces}{c}"));
                let split = context_len.min(whole.len().saturating_sub(1));
                Request { continuation: whole[split..].to_vec(), context: whole[..split].to_vec() }
            })
            .collect()
    }
}

/// Logits held at once while scoring, bytes: bounds the rows of a forward pass.
const LOGITS_BUDGET: usize = 256 << 20;

/// The summed log-probability of each request's continuation after its context. The
/// inputs keep the last `max_seq_len` tokens (the context is cut from the left), and
/// requests of similar length share forward passes.
pub fn loglikelihoods(model: &Model, requests: &[Request], device: Device, autocast: bool) -> Result<Vec<f64>, Error> {
    let ctx = model.config().max_seq_len as usize;
    let vocab = model.config().vocab_size as usize;
    // Each row: the input tokens and the positions (in the input) whose next token is scored.
    let rows: Vec<(Vec<i64>, Vec<i64>, usize)> = requests
        .iter()
        .map(|r| {
            let whole: Vec<i64> = r.context.iter().chain(&r.continuation).copied().collect();
            let keep = whole.len().min(ctx + 1);
            let whole = &whole[whole.len() - keep..];
            let n = r.continuation.len().min(keep - 1);
            (whole[..keep - 1].to_vec(), whole[keep - n..].to_vec(), n)
        })
        .collect();
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(rows[i].0.len()));
    let mut out = vec![0.0; rows.len()];
    let mut at = 0;
    tch::no_grad(|| -> Result<(), Error> {
        while at < order.len() {
            let width = rows[order[at]].0.len().max(1);
            let take = (LOGITS_BUDGET / (width * vocab * 4)).clamp(1, order.len() - at);
            let batch = &order[at..at + take];
            let mut inputs = Vec::with_capacity(take * width);
            for &i in batch {
                let x = &rows[i].0;
                inputs.extend(x.iter().copied().chain(std::iter::repeat_n(0, width - x.len())));
            }
            let x = Tensor::f_from_slice(&inputs)?.f_view([take as i64, width as i64])?.f_to_device(device)?;
            let logits = crate::ffi::autocast(device, autocast, || model.logits(&x))?;
            let logps = logits.f_log_softmax(-1, Kind::Float)?;
            // Each row's continuation, gathered on the device; only the sums come back.
            let mut sums = Vec::with_capacity(take);
            for (row, &i) in batch.iter().enumerate() {
                let (x, targets, n) = &rows[i];
                let first = (x.len() - n) as i64;
                let span = logps.f_get(row as i64)?.f_narrow(0, first, *n as i64)?;
                let index = Tensor::f_from_slice(targets)?.f_unsqueeze(1)?.f_to_device(device)?;
                sums.push(span.f_gather(1, &index, false)?.f_sum(Kind::Double)?);
            }
            let sums = Vec::<f64>::try_from(Tensor::f_stack(&sums, 0)?.f_to_device(Device::Cpu)?)?;
            for (&i, ll) in batch.iter().zip(sums) {
                out[i] = ll;
            }
            at += take;
        }
        Ok(())
    })?;
    Ok(out)
}

/// The first index of the largest value (numpy's `argmax`).
fn argmax(xs: impl Iterator<Item = f64>) -> usize {
    xs.enumerate().fold((0, f64::NEG_INFINITY), |best, (i, x)| if x > best.1 { (i, x) } else { best }).0
}

/// Scores `set`; with a group, rank r takes every world-th question and every rank
/// gets the whole score.
pub fn evaluate(
    model: &Model,
    tok: &Tokenizer,
    set: &McqSet,
    fewshot: Option<Fewshot>,
    o: &EvalOptions,
    group: Option<&ProcessGroup>,
) -> Result<McqScore, Error> {
    Ok(evaluate_samples(model, tok, set, fewshot, o, group)?.0)
}

/// [`evaluate`], and each of this rank's questions as it was scored.
pub fn evaluate_samples(
    model: &Model,
    tok: &Tokenizer,
    set: &McqSet,
    fewshot: Option<Fewshot>,
    o: &EvalOptions,
    group: Option<&ProcessGroup>,
) -> Result<(McqScore, Vec<Sample>), Error> {
    let (rank, world) = group.map_or((0, 1), |g| (g.rank() as usize, g.world_size() as usize));
    let mine: Vec<usize> = (rank..set.records.len()).step_by(world).collect();
    let drawn = fewshot.map_or_else(|| vec![Vec::new(); set.records.len()], |f| f.draw(set.format, &set.records));
    let shots = |i: usize| drawn[i].clone();
    // Log-likelihood: a request per option of each question.
    let mut requests = Vec::new();
    let mut samples = Vec::with_capacity(mine.len());
    for &i in &mine {
        let r = &set.records[i];
        let context = task::context(set.format, r, &shots(i));
        let choices = task::choices(set.format, r);
        let continuations: Vec<String> = choices.iter().map(|c| format!("{TARGET_DELIMITER}{c}")).collect();
        requests.extend(Request::each(tok, &context, &continuations));
        samples.push(Sample {
            doc_id: i,
            subject: r.subject.clone(),
            context,
            choices,
            target: r.answer,
            loglikelihoods: Vec::new(),
            acc: false,
            acc_norm: false,
        });
    }
    let mut lls = loglikelihoods(model, &requests, o.device, o.autocast)?.into_iter();
    let mut outcomes = vec![Outcome::default(); set.records.len()];
    for s in &mut samples {
        s.loglikelihoods = lls.by_ref().take(s.choices.len()).collect();
        // lm-eval's acc_norm: per character of the choice, without the delimiter.
        let per_char = s.loglikelihoods.iter().zip(&s.choices).map(|(l, c)| l / c.chars().count().max(1) as f64);
        s.acc = argmax(s.loglikelihoods.iter().copied()) == s.target;
        s.acc_norm = argmax(per_char) == s.target;
        (outcomes[s.doc_id].acc, outcomes[s.doc_id].acc_norm) = (s.acc, s.acc_norm);
    }
    if o.max_new_tokens > 0 {
        greedy(model, tok, set, &mine, &shots, o, &mut outcomes)?;
    }
    if let Some(g) = group {
        let flat: Vec<f64> = outcomes.iter().flat_map(|o| o.to_array()).collect();
        let t = Tensor::f_from_slice(&flat)?.f_to_device(o.device)?;
        g.allreduce(&t, ReduceOp::Sum)?.wait()?;
        let all = Vec::<f64>::try_from(t.f_to_device(Device::Cpu)?)?;
        outcomes = all.chunks_exact(Outcome::FIELDS).map(Outcome::from_array).collect();
    }
    let with_subjects: Vec<(Outcome, Option<&str>)> =
        outcomes.into_iter().zip(&set.records).map(|(o, r)| (o, r.subject.as_deref())).collect();
    Ok((McqScore::of(&with_subjects), samples))
}

/// The greedy answer letter of each of `mine`: generated after the question asked with
/// its options lettered, as GRPO's prompts ask it (and the examples answered likewise).
fn greedy<'a>(
    model: &Model,
    tok: &Tokenizer,
    set: &McqSet,
    mine: &[usize],
    shots: &dyn Fn(usize) -> Vec<&'a McqRecord>,
    o: &EvalOptions,
    outcomes: &mut [Outcome],
) -> Result<(), Error> {
    let ctx = model.config().max_seq_len as usize;
    let max_new = o.max_new_tokens.min(ctx.saturating_sub(1)).max(1);
    let eos = tok.eos_id();
    let greedy = Sampling { temperature: 0.0, top_k: 0, top_p: 1.0 };
    for chunk in mine.chunks(o.batch.max(1)) {
        let prompts: Vec<Vec<i64>> = chunk
            .iter()
            .map(|&i| {
                let text = task::context(McqFormat::Medqa, &set.records[i], &shots(i));
                let p: Vec<i64> = tok.encode(&text).into_iter().map(i64::from).collect();
                p[p.len().saturating_sub(ctx - max_new)..].to_vec()
            })
            .collect();
        let out = tch::no_grad(|| {
            crate::ffi::autocast(o.device, o.autocast, || {
                generate::generate_cached(model, &prompts, max_new, &greedy, Some(eos as i64), o.device)
            })
        })?;
        for (&i, c) in chunk.iter().zip(&out) {
            let r = &set.records[i];
            let text: Vec<u32> = c.iter().map(|&t| t as u32).take_while(|&t| t != eos).collect();
            let answer = parse_answer(&tok.decode(&text), r.options.len());
            outcomes[i].greedy = answer == Some(r.answer);
            outcomes[i].unparsed = answer.is_none();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_takes_the_first_of_equals() {
        assert_eq!(argmax([1.0, 3.0, 3.0, 2.0].into_iter()), 1);
        assert_eq!(argmax([-5.0, -1.0].into_iter()), 1);
    }

    fn tiny() -> (Tokenizer, tch::nn::VarStore, Model) {
        let tok = Tokenizer::embedded().unwrap();
        let mut cfg = crate::model::tests::small(crds::presets::Arch::Llama, false);
        cfg.vocab_size = tok.vocab_size() as u32;
        cfg.max_seq_len = 48;
        let _rng = crate::rng::GLOBAL_RNG.lock().unwrap_or_else(|e| e.into_inner());
        tch::manual_seed(11);
        let vs = tch::nn::VarStore::new(Device::Cpu);
        let model = Model::new(&vs.root(), &cfg, Device::Cpu).unwrap();
        (tok, vs, model)
    }

    /// The log-likelihood of a request worked out one request at a time, in f64: the
    /// last `max_seq_len + 1` tokens, one forward pass over all but the last, and the
    /// log-softmax at each position before a continuation token, summed.
    fn by_hand(model: &Model, r: &Request) -> f64 {
        let ctx = model.config().max_seq_len as usize;
        let whole: Vec<i64> = r.context.iter().chain(&r.continuation).copied().collect();
        let whole = &whole[whole.len().saturating_sub(ctx + 1)..];
        let x = Tensor::from_slice(&whole[..whole.len() - 1]).view([1, -1]);
        let logps = tch::no_grad(|| model.logits(&x).unwrap()).to_kind(Kind::Double).log_softmax(-1, Kind::Double);
        let n = r.continuation.len().min(whole.len() - 1);
        (whole.len() - 1 - n..whole.len() - 1).map(|pos| logps.double_value(&[0, pos as i64, whole[pos + 1]])).sum()
    }

    #[test]
    fn a_continuation_is_split_from_its_context_as_lm_eval_does() {
        let tok = Tokenizer::embedded().unwrap();
        let ids = |s: &str| tok.encode(s).into_iter().map(i64::from).collect::<Vec<_>>();
        let r = Request::new(&tok, "Question: What is 2 + 3?\nAnswer: ", "5");
        assert_eq!(r.context, ids("Question: What is 2 + 3?\nAnswer:"), "the trailing space moves");
        let whole = ids("Question: What is 2 + 3?\nAnswer: 5");
        assert_eq!([r.context.clone(), r.continuation.clone()].concat(), whole);
        assert!(!r.continuation.is_empty());
    }

    #[test]
    fn log_likelihoods_equal_a_hand_computation_across_batches_and_truncation() {
        let (tok, _vs, model) = tiny();
        let texts = [
            ("Question: Which color is the sky?\nAnswer:", " blue"),
            ("Q:", " a much longer continuation of several words"),
            ("Question: What is 11 * 6?\nA. 66\nB. 67\nAnswer:", " A"),
            // Longer than the model's context of 48 tokens: cut from the left.
            (&"The towns of the north are old and their rivers are wide. ".repeat(6), " Yes"),
        ];
        let requests: Vec<Request> = texts.iter().map(|(c, x)| Request::new(&tok, c, x)).collect();
        assert!(requests[3].context.len() + requests[3].continuation.len() > 49, "the long one is truncated");
        let got = loglikelihoods(&model, &requests, Device::Cpu, false).unwrap();
        for (r, got) in requests.iter().zip(&got) {
            let want = by_hand(&model, r);
            assert!((got - want).abs() < 1e-4 * want.abs().max(1.0), "{got} vs {want} for {r:?}");
            assert!(*got < 0.0);
        }
    }

    #[test]
    fn acc_and_acc_norm_pick_the_options_lm_eval_would() {
        let (tok, _vs, model) = tiny();
        // ARC scores the option texts, whose lengths differ: per character a long
        // option can win where its summed log-likelihood loses.
        let options = ["red", "a pale shade of green", "blue", "the colour of the evening sky over the sea"];
        let questions = ["Which color is grass?", "Which color is the sky?", "What is 2 + 3?", "Which is a fruit?"];
        let mut records = Vec::new();
        let mut want = Vec::new();
        let mut disagreements = 0;
        for q in questions {
            let r = McqRecord::new(q, options.map(String::from).to_vec(), 0);
            let context = task::context(McqFormat::Arc, &r, &[]);
            let lls: Vec<f64> =
                options.iter().map(|o| by_hand(&model, &Request::new(&tok, &context, &format!(" {o}")))).collect();
            let best = argmax(lls.iter().copied());
            let best_norm = argmax(lls.iter().zip(options).map(|(l, o)| l / o.len() as f64));
            disagreements += usize::from(best != best_norm);
            // Gold: the per-character winner, so acc is right only where both agree.
            let answer = best_norm;
            want.push((answer == best, answer == best_norm));
            records.push(McqRecord { answer, ..r });
        }
        assert!(disagreements > 0, "the lengths make acc and acc_norm choose differently somewhere");
        let set = McqSet { format: McqFormat::Arc, records };
        let o = EvalOptions { max_new_tokens: 0, batch: 4, device: Device::Cpu, autocast: false };
        let score = evaluate(&model, &tok, &set, None, &o, None).unwrap();
        let n = want.len() as f64;
        assert_eq!(score.all.questions, 4);
        assert_eq!(score.all.acc, want.iter().filter(|w| w.0).count() as f64 / n);
        assert_eq!(score.all.acc_norm, want.iter().filter(|w| w.1).count() as f64 / n);
        assert_eq!((score.all.acc_norm, score.all.acc), (1.0, 1.0 - disagreements as f64 / n));
    }
}
