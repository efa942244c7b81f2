//! `trainer prepare`: text (jsonl, Parquet, plain text, MedQA-USMLE jsonl) → tokenized
//! shards plus a manifest, with a deterministic held-out validation split.

mod inputs;
mod tokenizer_choice;
mod writer;

#[cfg(test)]
mod tests;

pub use inputs::InputFormat;
pub use tokenizer_choice::TokenizerChoice;

use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{Value, json};

use self::inputs::{DocBatch, input_files, spawn_reader};
use self::tokenizer_choice::load_tokenizer;
use self::writer::{ShardWriter, held_out};
use super::mcq::{McqRecord, medqa_json};
use super::shard::{self, Dtype, MANIFEST_FORMAT, Manifest, ManifestTokenizer, RecordFiles};
use super::tokenizer::Tokenizer;
use crate::{Error, io_err};

#[derive(Clone, Debug)]
pub struct PrepareOptions {
    pub inputs: Vec<PathBuf>,
    pub output: PathBuf,
    /// The source's name [default: the output directory's name].
    pub name: Option<String>,
    pub format: InputFormat,
    pub field: String,
    pub tokenizer: TokenizerChoice,
    pub shard_tokens: u64,
    pub validation_fraction: f64,
    pub seed: u64,
    pub progress: bool,
}

/// What `prepare` did.
#[derive(Clone, Debug, PartialEq)]
pub struct PrepareReport {
    pub documents: u64,
    pub validation_documents: u64,
    pub train_tokens: u64,
    pub validation_tokens: u64,
    pub input_bytes: u64,
    pub seconds: f64,
    pub shards: usize,
}

/// Runs `trainer prepare`: a reader thread parses the inputs into batches of documents
/// while this thread encodes each batch on all cores (`tokenizers`' batch encoding) and
/// appends the ids, each document followed by EOS, to fixed-size train and validation
/// shards.
pub fn prepare(o: &PrepareOptions) -> Result<PrepareReport, Error> {
    check(o)?;
    let started = Instant::now();
    let files = input_files(&o.inputs, o.format)?;
    let tok = load_tokenizer(&o.tokenizer, &o.field, &files)?;
    std::fs::create_dir_all(&o.output).map_err(io_err(&o.output))?;
    let name =
        o.name.clone().unwrap_or_else(|| o.output.file_name().and_then(|n| n.to_str()).unwrap_or("source").to_string());
    let dtype = Dtype::for_vocab(tok.vocab_size());
    let writer = |prefix| ShardWriter::new(&o.output, prefix, o.shard_tokens as usize, dtype, &tok);
    let mut writers = [writer("train"), writer("validation")];
    let medqa = files.iter().any(|(_, f)| *f == InputFormat::Medqa);

    let total_bytes: u64 = files.iter().map(|(p, _)| std::fs::metadata(p).map_or(0, |m| m.len())).sum();
    let bar = progress_bar(o.progress, total_bytes, &name);
    let (rx, reader) = spawn_reader(files.clone(), o.field.clone());
    let encoded = encode(rx, &tok, o, &mut writers, &bar)?;
    reader.join().map_err(|_| Error::InvalidSpec("prepare: the input reader panicked".into()))?;
    bar.finish_and_clear();
    if encoded.documents == 0 {
        return Err(Error::InvalidSpec("--input: the inputs hold no documents".into()));
    }
    if encoded.held == 0 && o.validation_fraction > 0.0 {
        tracing::warn!(
            "{name}: no document fell into the {} validation split; raise --validation-fraction",
            o.validation_fraction
        );
    }
    let [train, val] = writers;
    let (train_tokens, validation_tokens) = (train.tokens, val.tokens);
    let (train, validation) = (train.finish()?, val.finish()?);
    let record_files = if medqa { Some(write_records(&o.output, &encoded.records)?) } else { None };
    let tok_path = o.output.join("tokenizer.json");
    crate::files::write_atomic(&tok_path, tok.to_json()?.as_bytes()).map_err(io_err(&tok_path))?;
    let shards = train.len() + validation.len();
    let manifest = Manifest {
        format: MANIFEST_FORMAT.into(),
        version: shard::VERSION,
        name: name.clone(),
        tokenizer: ManifestTokenizer {
            hash: tok.hash(),
            vocab_size: tok.vocab_size(),
            eos_id: tok.eos_id(),
            file: Some("tokenizer.json".into()),
        },
        dtype,
        train,
        validation,
        records: record_files,
        input: input_summary(o, &files, &encoded),
    };
    manifest.write(&o.output)?;
    Ok(PrepareReport {
        documents: encoded.documents,
        validation_documents: encoded.held,
        train_tokens,
        validation_tokens,
        input_bytes: encoded.input_bytes,
        seconds: started.elapsed().as_secs_f64(),
        shards,
    })
}

/// The options' bounds.
fn check(o: &PrepareOptions) -> Result<(), Error> {
    if !(0.0..1.0).contains(&o.validation_fraction) {
        return Err(Error::InvalidSpec(format!("--validation-fraction {} must be in [0, 1)", o.validation_fraction)));
    }
    if o.shard_tokens < 1024 {
        return Err(Error::InvalidSpec(format!("--shard-tokens {} must be at least 1024", o.shard_tokens)));
    }
    Ok(())
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

/// What the encoder counted, and the MedQA records of each split (train, validation).
struct Encoded {
    documents: u64,
    /// Documents held out for validation.
    held: u64,
    input_bytes: u64,
    records: [Vec<String>; 2],
}

/// Encodes the reader's batches on all cores and appends each document to the train or
/// the validation writer (`writers[0]` or `writers[1]`), as [`held_out`] decides.
fn encode(
    rx: Receiver<DocBatch>,
    tok: &Tokenizer,
    o: &PrepareOptions,
    writers: &mut [ShardWriter<'_>; 2],
    bar: &ProgressBar,
) -> Result<Encoded, Error> {
    let mut e = Encoded { documents: 0, held: 0, input_bytes: 0, records: Default::default() };
    for msg in rx {
        let (docs, bytes) = msg?;
        let (texts, mcq): (Vec<String>, Vec<Option<McqRecord>>) = docs.into_iter().map(|d| (d.text, d.record)).unzip();
        for (record, ids) in mcq.iter().zip(tok.encode_batch(&texts)) {
            let validation = held_out(o.seed, e.documents, o.validation_fraction);
            writers[validation as usize].push(&ids)?;
            if let Some(r) = record {
                e.records[validation as usize].push(medqa_json(r).to_string());
            }
            e.documents += 1;
            e.held += validation as u64;
        }
        e.input_bytes += bytes;
        bar.inc(bytes);
    }
    Ok(e)
}

/// Writes the MedQA records of each split (train, validation) as jsonl files in `dir`.
fn write_records(dir: &Path, records: &[Vec<String>; 2]) -> Result<RecordFiles, Error> {
    let mut files = RecordFiles { train: "records-train.jsonl".into(), validation: "records-validation.jsonl".into() };
    for (recs, file) in records.iter().zip([&mut files.train, &mut files.validation]) {
        let path = dir.join(&*file);
        crate::files::write_atomic(&path, (recs.join("\n") + "\n").as_bytes()).map_err(io_err(&path))?;
    }
    Ok(files)
}

/// The manifest's record of the input: its files, the options that read them, and the counts.
fn input_summary(o: &PrepareOptions, files: &[(PathBuf, InputFormat)], e: &Encoded) -> Value {
    json!({
        "files": files.iter().map(|(p, f)| json!({"path": p.display().to_string(), "format": f})).collect::<Vec<_>>(),
        "field": o.field,
        "documents": e.documents,
        "validationDocuments": e.held,
        "validationFraction": o.validation_fraction,
        "seed": o.seed,
        "bytes": e.input_bytes,
    })
}
