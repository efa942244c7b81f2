//! Commands that read a run's checkpoints: `trainer eval`, `generate` and `export`.

use std::path::{Path, PathBuf};

use crds::config::RunConfig;
use tch::Device;
use tch::nn::VarStore;

use super::train::RUN_FILE;
use crate::checkpoint::resume::copy_weights;
use crate::data::corpus::{self, Split};
use crate::data::mcq::{McqFormat, McqSet};
use crate::data::sources;
use crate::eval::{EvalOptions, Fewshot};
use crate::generate::Sampling;
use crate::model::Model;
use crate::{Error, io_err};

/// What `trainer eval` measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EvalTask {
    /// Validation loss and perplexity per data source (a pretraining run).
    Loss,
    /// Multiple-choice accuracy.
    Mcq,
}

#[derive(Debug, clap::Args)]
pub struct EvalArgs {
    /// A run's output directory or one checkpoint directory.
    pub checkpoint: PathBuf,
    #[arg(long, value_enum, default_value = "loss")]
    pub task: EvalTask,
    /// Questions for `--task mcq`: embedded:mcq-rules, embedded:mcq (their held-out
    /// questions), a MedQA, MMLU or ARC file (jsonl, JSON or Parquet), or a prepared
    /// directory (its validation records), as a path, pvc:// or s3:// URI [default: the
    /// GRPO run's held-out questions, else embedded:mcq].
    #[arg(long)]
    pub dataset: Option<String>,
    /// The question file's format: auto tells it by the first record's fields.
    #[arg(long, default_value = "auto")]
    pub format: McqFormat,
    /// Answered examples before each question, from `--fewshot-dataset`, drawn as
    /// lm-evaluation-harness draws them: for MMLU the first ones of the question's
    /// subject; otherwise Python's `random.Random(--seed).sample`, question after question.
    #[arg(long, default_value_t = 0)]
    pub fewshot: usize,
    /// Where the few-shot examples come from (e.g. MMLU's dev split), in the same forms
    /// as `--dataset`. The same as `--dataset`: a question is never its own example.
    #[arg(long)]
    pub fewshot_dataset: Option<String>,
    /// Seeds the choice of few-shot examples (lm-eval's `fewshot_random_seed`, 1234).
    #[arg(long, default_value_t = 1234)]
    pub seed: u64,
    /// Also write each question as it was scored to this file, one JSON object a line
    /// (lm-eval's `--log_samples`): its context, choices, target, each choice's summed
    /// log-likelihood, and acc and acc_norm.
    #[arg(long)]
    pub samples: Option<PathBuf>,
    /// Score at most this many questions [default: all of a file; 256 of an embedded
    /// set; the GRPO run's evalQuestions of its held-out set].
    #[arg(long)]
    pub questions: Option<usize>,
    /// Tokens generated for the greedy answer letter (0: skip it).
    #[arg(long, default_value_t = 16)]
    pub max_new_tokens: usize,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    /// A run's output directory or one checkpoint directory.
    pub checkpoint: PathBuf,
    /// Text to continue; defaults to a validation multiple-choice question.
    #[arg(long)]
    pub prompt: Option<String>,
    #[arg(long, default_value_t = 64)]
    pub max_new_tokens: usize,
    /// 0 is greedy.
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f64,
    /// Keep the k most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    pub top_k: i64,
    /// Nucleus sampling threshold.
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f64,
    /// Number of samples.
    #[arg(long, short, default_value_t = 1)]
    pub n: usize,
    #[arg(long, default_value_t = 1337)]
    pub seed: u64,
}

/// The resolved run of a run directory or of one of its checkpoints.
fn run_config(checkpoint: &Path) -> Result<RunConfig, Error> {
    let candidates = [checkpoint.join(RUN_FILE), checkpoint.parent().map(|p| p.join(RUN_FILE)).unwrap_or_default()];
    let path = candidates.iter().find(|p| p.is_file()).ok_or_else(|| Error::Checkpoint {
        path: checkpoint.to_path_buf(),
        message: format!("no {RUN_FILE} here or in the parent directory; is this a `trainer run` output?"),
    })?;
    let text = std::fs::read_to_string(path).map_err(io_err(path))?;
    serde_json::from_str(&text)
        .map_err(|e| Error::Checkpoint { path: path.clone(), message: format!("not a resolved run: {e}") })
}

/// The model of a checkpoint, on CPU in f32 (or the checkpoint's bf16).
fn load_model(checkpoint: &Path) -> Result<(RunConfig, VarStore, Model), Error> {
    let cfg = run_config(checkpoint)?;
    let weights = crate::checkpoint::load_weights(checkpoint)?;
    let vs = VarStore::new(Device::Cpu);
    let model = Model::new(&vs.root(), &cfg.model, Device::Cpu)?;
    copy_weights(&vs, &weights, checkpoint)?;
    Ok((cfg, vs, model))
}

/// A checkpoint's weights and `batch` prompts for `bench-generate`: the run's
/// validation questions, each after as many answered ones as fill `prompt_tokens`
/// (few-shot, as an evaluation prompts), cut to its last `prompt_tokens` tokens, so that
/// every prompt ends where an answer begins.
pub(super) fn trained_prompts(
    checkpoint: &Path,
    batch: usize,
    prompt_tokens: usize,
) -> Result<(RunConfig, crate::bench::generate::Trained), Error> {
    /// Answered questions before one, at most: 64 fill a context of several thousand tokens.
    const MAX_SHOTS: usize = 64;
    let cfg = run_config(checkpoint)?;
    let weights = crate::checkpoint::load_weights(checkpoint)?;
    let tokenizer = sources::load_tokenizer(&cfg)?;
    let questions = corpus::mcq_records(cfg.seed, batch.max(MAX_SHOTS + 1), Split::Validation);
    let prompts = (0..batch)
        .map(|row| {
            let mut text = questions[row].prompt();
            for shot in 1..=MAX_SHOTS + 1 {
                let ids = tokenizer.encode(&text);
                if let Some(start) = ids.len().checked_sub(prompt_tokens) {
                    return Ok(ids[start..].iter().map(|&t| i64::from(t)).collect());
                }
                text = format!("{}\n\n{text}", questions[(row + shot) % questions.len()].text());
            }
            Err(Error::InvalidSpec(format!(
                "--prompt-tokens {prompt_tokens}: validation question {row} after {MAX_SHOTS} answered ones is \
                 still shorter"
            )))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let source = checkpoint.to_path_buf();
    Ok((cfg, crate::bench::generate::Trained { weights, source, prompts }))
}

pub fn eval(args: &EvalArgs) -> Result<(), Error> {
    if args.task == EvalTask::Mcq {
        return eval_mcq(args);
    }
    let (cfg, _vs, model) = load_model(&args.checkpoint)?;
    let tokenizer = sources::load_tokenizer(&cfg)?;
    let val = sources::validation_mixes(&cfg, &tokenizer)?;
    let eos = tokenizer.eos_id();
    let (mean, per_source) = crate::train::evaluate::evaluate(&model, &cfg, &val, eos, Device::Cpu, false, None)?;
    for (name, loss) in &per_source {
        println!("{name:<16} val loss {loss:.4}  perplexity {:.2}", loss.exp());
    }
    println!("{:<16} val loss {mean:.4}  perplexity {:.2}", "mix", mean.exp());
    Ok(())
}

/// Questions for `--task mcq` and its few-shot examples: an embedded set, a file or a
/// prepared directory named by `uri`, at most `n`.
fn question_set(cfg: &RunConfig, flag: &str, uri: &str, format: McqFormat, n: Option<usize>) -> Result<McqSet, Error> {
    let location = match uri.strip_prefix("embedded:") {
        Some(name) => crds::config::Location::Embedded { name: name.into() },
        None => crds::resolve::parse_location_str(uri).map_err(|m| Error::InvalidSpec(format!("{flag}: {m}")))?,
    };
    let embedded = matches!(location, crds::config::Location::Embedded { .. });
    let n = n.unwrap_or(if embedded { DEFAULT_EMBEDDED_QUESTIONS } else { usize::MAX });
    crate::grpo::data::eval_set(cfg, &location, format, n)
}

/// Questions scored from an embedded set when `--questions` is not given.
const DEFAULT_EMBEDDED_QUESTIONS: usize = 256;

/// `trainer eval --task mcq`.
fn eval_mcq(args: &EvalArgs) -> Result<(), Error> {
    let (cfg, _vs, model) = load_model(&args.checkpoint)?;
    let tokenizer = sources::load_tokenizer(&cfg)?;
    let (name, set) = match (&args.dataset, &cfg.grpo) {
        // The run's own held-out split, exactly as it evaluated itself.
        (None, Some(g)) => {
            let mut held_out = crate::grpo::data::load(&cfg, g)?.held_out;
            held_out.records.truncate(args.questions.unwrap_or(usize::MAX));
            (crate::train::HELD_OUT.to_string(), held_out)
        }
        (Some(uri), _) => (uri.clone(), question_set(&cfg, "--dataset", uri, args.format, args.questions)?),
        (None, None) => {
            let uri = "embedded:mcq";
            (uri.to_string(), question_set(&cfg, "--dataset", uri, McqFormat::Auto, args.questions)?)
        }
    };
    if set.records.is_empty() {
        return Err(Error::Data { name: name.clone(), message: "has no questions to evaluate".into() });
    }
    let pool = match (&args.fewshot_dataset, args.fewshot) {
        (Some(uri), _) => question_set(&cfg, "--fewshot-dataset", uri, args.format, None)?.records,
        (None, 0) => Vec::new(),
        (None, _) => {
            return Err(Error::InvalidSpec(
                "--fewshot: name the examples' question set with --fewshot-dataset (e.g. MMLU's dev split)".into(),
            ));
        }
    };
    let pool_is_set = args.fewshot_dataset.is_some() && args.fewshot_dataset == args.dataset;
    let fewshot = (args.fewshot > 0).then_some(Fewshot { pool: &pool, k: args.fewshot, seed: args.seed, pool_is_set });
    let options = EvalOptions { max_new_tokens: args.max_new_tokens, batch: 16, device: Device::Cpu, autocast: false };
    let (score, samples) = crate::eval::evaluate_samples(&model, &tokenizer, &set, fewshot, &options, None)?;
    if let Some(path) = &args.samples {
        let lines: String =
            samples.iter().map(|s| serde_json::to_string(s).expect("samples serialize") + "\n").collect();
        std::fs::write(path, lines).map_err(crate::io_err(path))?;
    }
    if args.json {
        let mut report = serde_json::to_value(&score).expect("scores serialize");
        report["dataset"] = name.into();
        report["format"] = set.format.name().into();
        report["fewshot"] = args.fewshot.into();
        println!("{report}");
    } else {
        println!("{} ({}, {}-shot)", name, set.format, args.fewshot);
        print!("{}", score.table("all"));
    }
    Ok(())
}

pub fn generate(args: &GenerateArgs) -> Result<(), Error> {
    let (cfg, _vs, model) = load_model(&args.checkpoint)?;
    let tokenizer = sources::load_tokenizer(&cfg)?;
    let prompt = match &args.prompt {
        Some(p) => p.clone(),
        None => corpus::mcq_records(cfg.seed, 1, Split::Validation).remove(0).prompt(),
    };
    let sampling = Sampling { temperature: args.temperature, top_k: args.top_k, top_p: args.top_p };
    tch::manual_seed(args.seed as i64);
    let samples =
        crate::generate::complete(&model, &tokenizer, &prompt, args.n, args.max_new_tokens, &sampling, Device::Cpu)?;
    println!("{}", samples.iter().map(|s| format!("{prompt}{s}")).collect::<Vec<_>>().join("\n---\n"));
    Ok(())
}

pub fn export(checkpoint: &Path, hf: &Path, best: bool) -> Result<(), Error> {
    let best_dir;
    let checkpoint = if best {
        let b = crate::checkpoint::best(checkpoint).ok_or_else(|| Error::Checkpoint {
            path: checkpoint.join(crate::checkpoint::BEST_FILE),
            message: "--best: this run directory has no best checkpoint; spec.checkpoint.keepBest (with \
                      validation at every checkpoint) keeps one"
                .into(),
        })?;
        let loss = b.val_loss.map_or(String::new(), |v| format!(", validation loss {v:.4}"));
        println!("the best checkpoint: step {}{loss}", b.step);
        best_dir = PathBuf::from(b.uri);
        &best_dir
    } else {
        checkpoint
    };
    let (cfg, vs, _model) = load_model(checkpoint)?;
    let tokenizer = sources::load_tokenizer(&cfg)?;
    crate::export::export_hf(&cfg.model, &vs.variables(), Some(&tokenizer), hf)?;
    println!(
        "wrote {} (config.json, model.safetensors, generation_config.json and the run's tokenizer: tokenizer.json, \
         tokenizer_config.json, special_tokens_map.json)",
        hf.display()
    );
    Ok(())
}
