//! One input file prepared: its shards `part-NNNNN-{train,validation}-MMMMM.bin`, its
//! MedQA records, and its part manifest `part-NNNNN.json`, published last. A part that
//! can be read is complete, so a restarted worker skips its file; a file that fails is
//! recorded in its part with its error and no shards.

use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};

use super::inputs::{InputFormat, detect, spawn_reader};
use super::listing::{Clients, Unit};
use super::output::Output;
use super::writer::{ShardWriter, held_out};
use crate::Error;
use crate::data::mcq::medqa_json;
use crate::data::shard::{self, Dtype, RecordFiles, ShardEntry};
use crate::data::tokenizer::Tokenizer;

const PART_FORMAT: &str = "puretransformer-part";

/// Text handed to the encoder and not yet written, per core: enough that the cores stay
/// busy behind a document of a few megabytes, which one core encodes alone.
const ENCODE_WINDOW_PER_THREAD: usize = 4 << 20;

/// What decides a part's content besides its file. A part made under other settings is
/// prepared again, and the merge does not take it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PartSettings {
    /// The format asked for (`auto`, or one for every file).
    pub format: InputFormat,
    pub field: String,
    pub shard_tokens: u64,
    pub validation_fraction: f64,
    pub seed: u64,
    pub tokenizer_hash: String,
}

/// The part manifest of one input file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Part {
    pub format: String,
    pub version: u32,
    pub index: usize,
    pub key: String,
    pub input_format: InputFormat,
    /// The input file's size.
    pub bytes: u64,
    pub settings: PartSettings,
    pub documents: u64,
    pub validation_documents: u64,
    pub train: Vec<ShardEntry>,
    pub validation: Vec<ShardEntry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub records: Option<RecordFiles>,
    /// Why the file failed; none of its documents is in a shard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What the names of unit `index`'s files begin with.
fn stem(index: usize) -> String {
    format!("part-{index:05}")
}

/// The name of unit `index`'s part manifest.
pub fn part_name(index: usize) -> String {
    format!("{}.json", stem(index))
}

impl Part {
    /// The published part of `unit`, when there is one made from the same file (its key
    /// and size) under `settings`.
    pub fn published(out: &Output, unit: &Unit, settings: &PartSettings) -> Result<Option<Part>, Error> {
        let name = part_name(unit.index);
        let Some(bytes) = out.read(&name)? else {
            return Ok(None);
        };
        let part: Part = match serde_json::from_slice(&bytes) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(part = %name, "not a part manifest ({e}); preparing its file again");
                return Ok(None);
            }
        };
        let same = part.format == PART_FORMAT
            && part.version == shard::VERSION
            && part.index == unit.index
            && part.key == unit.key
            && part.bytes == unit.bytes
            && &part.settings == settings;
        Ok(same.then_some(part))
    }

    pub fn tokens(&self) -> (u64, u64) {
        (shard::Manifest::tokens(&self.train), shard::Manifest::tokens(&self.validation))
    }
}

/// Prepares `unit` in `out`'s work directory and publishes it. A data error of the file
/// (unreadable, a missing column, invalid UTF-8 beyond what is tolerated) fails the file,
/// not the call: its shards are discarded and its part records the error. Other errors
/// (the output's disk, S3, a URL) are returned.
pub fn prepare_unit(
    unit: &Unit,
    clients: &Clients,
    tok: &Tokenizer,
    settings: &PartSettings,
    out: &Output,
    bar: &ProgressBar,
) -> Result<Part, Error> {
    let dtype = Dtype::for_vocab(tok.vocab_size());
    let stem = stem(unit.index);
    let dir = out.work_dir();
    let writer =
        |split: &str| ShardWriter::new(dir, format!("{stem}-{split}"), settings.shard_tokens as usize, dtype, tok);
    let mut writers = [writer("train"), writer("validation")];
    let local = unit.fetch(clients, dir)?;
    let format = detect(&local.path, unit.format)?;
    let (rx, reader) = spawn_reader(vec![(local.path.clone(), format)], settings.field.clone());
    let seed = unit.split_seed(settings.seed);
    let (mut documents, mut held) = (0u64, 0u64);
    let mut records: [Vec<String>; 2] = Default::default();
    // The reader's error ends the documents; a data error of the file fails the file.
    let mut stopped = None;
    let docs = rx.iter().map_while(|msg| msg.map_err(|e| stopped = Some(e)).ok()).flat_map(|(docs, bytes)| {
        // The batch's input bytes count as done with its last document.
        let last = docs.len().checked_sub(1);
        if last.is_none() {
            bar.inc(bytes);
        }
        docs.into_iter().enumerate().map(move |(i, d)| (d.text, (d.record, if Some(i) == last { bytes } else { 0 })))
    });
    let window = ENCODE_WINDOW_PER_THREAD * rayon::current_num_threads();
    tok.encode_in_order(docs, window, |(record, bytes), ids| {
        let validation = held_out(seed, documents, settings.validation_fraction);
        writers[validation as usize].push(&ids)?;
        if let Some(r) = record {
            records[validation as usize].push(medqa_json(&r).to_string());
        }
        documents += 1;
        held += validation as u64;
        bar.inc(bytes);
        Ok::<(), Error>(())
    })?;
    let failure = match stopped {
        Some(e @ Error::Data { .. }) => Some(e.to_string()),
        Some(e) => return Err(e),
        None => None,
    };
    reader.join().map_err(|_| Error::InvalidSpec("prepare: the input reader panicked".into()))?;
    let mut part = Part {
        format: PART_FORMAT.into(),
        version: shard::VERSION,
        index: unit.index,
        key: unit.key.clone(),
        input_format: format,
        bytes: unit.bytes,
        settings: settings.clone(),
        documents: 0,
        validation_documents: 0,
        train: Vec::new(),
        validation: Vec::new(),
        records: None,
        error: None,
    };
    let mut files: Vec<String>;
    if let Some(error) = failure {
        files = writers.iter().flat_map(|w| w.written().map(str::to_string)).collect();
        out.discard(&files);
        tracing::warn!(file = %unit.location, "{error}");
        part.error = Some(error);
        files = Vec::new();
    } else {
        let [train, validation] = writers;
        (part.train, part.validation) = (train.finish()?, validation.finish()?);
        files = part.train.iter().chain(&part.validation).map(|e| e.file.clone()).collect();
        if format == InputFormat::Medqa {
            let names = RecordFiles {
                train: format!("{stem}-records-train.jsonl"),
                validation: format!("{stem}-records-validation.jsonl"),
            };
            write_records(out, [&names.train, &names.validation], &records)?;
            files.extend([names.train.clone(), names.validation.clone()]);
            part.records = Some(names);
        }
        (part.documents, part.validation_documents) = (documents, held);
    }
    let json = serde_json::to_vec_pretty(&part).expect("Part serializes");
    out.publish(&files, &part_name(unit.index), &json)?;
    Ok(part)
}

/// Writes the records of each split (train, validation) as jsonl files named `names` in
/// `out`'s work directory.
pub(super) fn write_records(out: &Output, names: [&str; 2], records: &[Vec<String>; 2]) -> Result<(), Error> {
    for (recs, name) in records.iter().zip(names) {
        let path = out.work_dir().join(name);
        let mut text = recs.join("\n");
        if !text.is_empty() {
            text.push('\n');
        }
        crate::files::write_atomic(&path, text.as_bytes()).map_err(crate::io_err(&path))?;
    }
    Ok(())
}
