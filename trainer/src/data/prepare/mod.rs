//! `trainer prepare`: text (jsonl, Parquet, plain text, MedQA-USMLE jsonl) → tokenized
//! shards plus a manifest, with a deterministic held-out validation split.

mod inputs;
mod listing;
mod merge;
mod output;
mod part;
mod plan;
mod tokenizer_choice;
mod writer;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod worker_tests;

pub use inputs::InputFormat;
pub use tokenizer_choice::TokenizerChoice;

use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use self::listing::{Clients, Listing, Unit, list};
use self::merge::{MergeOptions, TOKENIZER_FILE, merge};
use self::output::Output;
use self::part::{Part, PartSettings, prepare_unit};
use self::plan::assign;
use self::tokenizer_choice::load_tokenizer;
use super::tokenizer::Tokenizer;
use crate::Error;

/// Which part of a preparation this process does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// All of it: the tokenizer, every file, the merge.
    All,
    /// Only train the tokenizer and publish it (`--train-tokenizer`; the cluster's first pod).
    Tokenizer,
    /// Worker `index` of `workers`: its share of the files ([`assign`]), no merge.
    Work { index: usize, workers: usize },
    /// Only the merge; every file's part must be published.
    Merge,
}

#[derive(Clone, Debug)]
pub struct PrepareOptions {
    /// Files, directories or `s3://bucket/prefix`es, each optionally ending in a glob,
    /// or `https://` URLs of single files.
    pub inputs: Vec<String>,
    /// A directory or `s3://bucket/prefix`.
    pub output: String,
    /// The source's name [default: the output's last path segment].
    pub name: Option<String>,
    pub format: InputFormat,
    pub field: String,
    pub tokenizer: TokenizerChoice,
    pub shard_tokens: u64,
    pub validation_fraction: f64,
    pub seed: u64,
    /// Input files that may fail (their documents left out) before the merge fails.
    pub max_failed_files: usize,
    pub step: Step,
    pub progress: bool,
    /// Kept current file by file, for a pod's `/status` (the operator's progress).
    pub live: Option<Live>,
}

/// A preparation's report as it goes, shared with whoever serves it.
pub type Live = std::sync::Arc<std::sync::Mutex<crds::contract::prepare::PrepareReport>>;

/// `f` applied to the live report, if there is one.
fn update(live: &Option<Live>, f: impl FnOnce(&mut crds::contract::prepare::PrepareReport)) {
    if let Some(l) = live {
        f(&mut l.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
    }
}

/// What `prepare` did: the counts are over the files this step covered (a worker's share,
/// or all of them), prepared now or found prepared.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PrepareReport {
    /// Input files this step covered.
    pub files: usize,
    /// Of them, prepared now.
    pub prepared: usize,
    /// Found prepared under the same settings, and skipped.
    pub skipped: usize,
    /// Failed, with their errors.
    pub failed: Vec<String>,
    pub documents: u64,
    pub validation_documents: u64,
    pub train_tokens: u64,
    pub validation_tokens: u64,
    pub input_bytes: u64,
    pub seconds: f64,
    pub shards: usize,
}

impl PrepareReport {
    fn add(&mut self, p: &Part) {
        let (train, validation) = p.tokens();
        self.files += 1;
        self.documents += p.documents;
        self.validation_documents += p.validation_documents;
        self.train_tokens += train;
        self.validation_tokens += validation;
        self.input_bytes += p.bytes;
        self.shards += p.train.len() + p.validation.len();
        if let Some(e) = &p.error {
            self.failed.push(format!("{}: {e}", p.key));
        }
    }
}

/// Runs `trainer prepare`'s `step`. Each input file is prepared on its own (a reader
/// thread parses it into batches of documents while this thread encodes each batch on
/// all cores, appending each document and its EOS to the file's train or validation
/// shards) into a part, skipped when its part is already published; the merge lists the
/// parts' shards in file order in the dataset's manifest.
pub fn prepare(o: &PrepareOptions) -> Result<PrepareReport, Error> {
    check(o)?;
    let started = Instant::now();
    let Listing { units, clients } = list(&o.inputs, o.format)?;
    let out = Output::parse(&o.output)?;
    let tok = tokenizer(o, &units, &clients, &out)?;
    let mut report = PrepareReport::default();
    if o.step == Step::Tokenizer {
        report.seconds = started.elapsed().as_secs_f64();
        return Ok(report);
    }
    let settings = PartSettings {
        format: o.format,
        field: o.field.clone(),
        shard_tokens: o.shard_tokens,
        validation_fraction: o.validation_fraction,
        seed: o.seed,
        tokenizer_hash: tok.hash(),
    };
    let name = o.name.clone().unwrap_or_else(|| default_name(&o.output));
    if let Step::All | Step::Work { .. } = o.step {
        let mine: Vec<&Unit> = match o.step {
            Step::Work { index, workers } => {
                let bytes: Vec<u64> = units.iter().map(|u| u.bytes).collect();
                assign(&bytes, workers)[index].iter().map(|&i| &units[i]).collect()
            }
            _ => units.iter().collect(),
        };
        let bar = progress_bar(o.progress, mine.iter().map(|u| u.bytes).sum(), &name);
        update(&o.live, |l| {
            l.files_total = mine.len() as u64;
            l.bytes_total = mine.iter().map(|u| u.bytes).sum();
        });
        for unit in mine {
            let (part, encoded) = match Part::published(&out, unit, &settings)? {
                Some(p) => {
                    bar.inc(unit.bytes);
                    report.skipped += 1;
                    (p, false)
                }
                None => {
                    inject_slow_file();
                    let p = prepare_unit(unit, &clients, &tok, &settings, &out, &bar)?;
                    report.prepared += 1;
                    (p, true)
                }
            };
            report.add(&part);
            update(&o.live, |l| record(l, &part, encoded, started));
        }
        bar.finish_and_clear();
    }
    if let Step::All | Step::Merge = o.step {
        let merge_options =
            MergeOptions { name: &name, settings: &settings, tokenizer: &tok, max_failed_files: o.max_failed_files };
        let (manifest, parts) = merge(&units, &out, &merge_options)?;
        if o.step == Step::Merge {
            parts.iter().for_each(|p| report.add(p));
            update(&o.live, |l| {
                l.files_total = parts.len() as u64;
                l.bytes_total = parts.iter().map(|p| p.bytes).sum();
                parts.iter().for_each(|p| record(l, p, false, started));
            });
        }
        update(&o.live, |l| l.manifest = Some(manifest));
    }
    report.seconds = started.elapsed().as_secs_f64();
    update(&o.live, |l| {
        l.seconds = report.seconds;
        l.done = true;
    });
    Ok(report)
}

/// Fault injection for tests that act while a preparation runs (kill a worker between
/// two files): milliseconds slept before each file prepared (a build with the
/// `fault-injection` feature only: [`crate::fault_injection`]).
pub const INJECT_SLOW_FILE_ENV: &str = "TRAINER_INJECT_SLOW_FILE_MS";

fn inject_slow_file() {
    if let Some(ms) = crate::fault_injection::knob(INJECT_SLOW_FILE_ENV).and_then(|v| v.parse::<u64>().ok()) {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

/// `part`, done, counted in the live report.
fn record(l: &mut crds::contract::prepare::PrepareReport, part: &Part, encoded: bool, started: Instant) {
    let (train, validation) = part.tokens();
    l.files_done += 1;
    l.bytes_done += part.bytes;
    l.tokens += train + validation;
    if encoded {
        l.tokens_encoded += train + validation;
    }
    if let Some(e) = &part.error {
        l.failed.push(crds::contract::prepare::FailedInput { file: part.key.clone(), error: e.clone() });
        l.failed_count += 1;
    }
    l.seconds = started.elapsed().as_secs_f64();
}

/// The options' bounds.
fn check(o: &PrepareOptions) -> Result<(), Error> {
    if !(0.0..1.0).contains(&o.validation_fraction) {
        return Err(Error::InvalidSpec(format!("--validation-fraction {} must be in [0, 1)", o.validation_fraction)));
    }
    if o.shard_tokens < 1024 {
        return Err(Error::InvalidSpec(format!("--shard-tokens {} must be at least 1024", o.shard_tokens)));
    }
    if let Step::Work { index, workers } = o.step
        && (workers == 0 || index >= workers)
    {
        return Err(Error::InvalidSpec(format!("--worker {index} must be below --workers {workers}")));
    }
    if o.step == Step::Tokenizer && !matches!(o.tokenizer, TokenizerChoice::Train { .. }) {
        return Err(Error::InvalidSpec("--step tokenizer trains one: give --train-tokenizer --vocab-size N".into()));
    }
    Ok(())
}

/// The tokenizer of every part. A trained one is trained once, by the step that may
/// (all, tokenizer), and published before any part; every later step and a resumed one
/// reads the published one.
fn tokenizer(o: &PrepareOptions, units: &[Unit], clients: &Clients, out: &Output) -> Result<Tokenizer, Error> {
    if !matches!(o.tokenizer, TokenizerChoice::Train { .. }) {
        return load_tokenizer(&o.tokenizer, &o.field, units, clients, out.work_dir());
    }
    if let Some(bytes) = out.read(TOKENIZER_FILE)? {
        let origin = format!("{}/{TOKENIZER_FILE}", out.uri());
        let text =
            String::from_utf8(bytes).map_err(|e| Error::Tokenizer { path: origin.clone(), message: e.to_string() })?;
        return Tokenizer::from_json(&text, &origin);
    }
    if let Step::Work { .. } | Step::Merge = o.step {
        return Err(Error::InvalidSpec(format!(
            "--train-tokenizer: {}/{TOKENIZER_FILE} does not exist; train it first with --step tokenizer",
            out.uri()
        )));
    }
    let tok = load_tokenizer(&o.tokenizer, &o.field, units, clients, out.work_dir())?;
    out.publish(&[], TOKENIZER_FILE, tok.to_json()?.as_bytes())?;
    Ok(tok)
}

/// The output's last path segment (`s3://b/web/` → `web`), or `source`.
fn default_name(output: &str) -> String {
    let path = output.strip_prefix("s3://").map_or(output, |rest| rest.split_once('/').map_or("", |(_, p)| p));
    path.trim_end_matches('/').rsplit('/').next().filter(|n| !n.is_empty() && *n != ".").unwrap_or("source").to_string()
}

/// The progress bar over the inputs' `total_bytes` (hidden unless `shown`).
fn progress_bar(shown: bool, total_bytes: u64, name: &str) -> ProgressBar {
    let bar = if shown {
        ProgressBar::with_draw_target(Some(total_bytes), ProgressDrawTarget::stderr())
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:30}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    bar.set_message(format!("prepare {name}"));
    bar
}
