//! `trainer prepare`: text (jsonl, Parquet, plain text, MedQA-USMLE jsonl) → tokenized
//! shards plus a manifest, with a deterministic held-out validation split.
//!
//! A reader thread parses the inputs into batches of documents while the main thread
//! encodes each batch on all cores (`tokenizers`' batch encoding) and appends the ids,
//! each document followed by EOS, to fixed-size train and validation shards.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::mpsc::sync_channel;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{Value, json};

use super::mcq::{McqRecord, medqa_json, parse_medqa};
use super::shard::{self, Dtype, MANIFEST_FORMAT, Manifest, ManifestTokenizer, RecordFiles, ShardEntry};
use super::tokenizer::Tokenizer;
use crate::{Error, io_err};

/// Input formats; `Auto` decides per file by its extension and first record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum InputFormat {
    Auto,
    /// One JSON object per line; the text is in `--field`.
    Jsonl,
    /// A Parquet file; the text is the `--field` column (Hugging Face datasets' layout).
    Parquet,
    /// Each file is one document.
    Text,
    /// MedQA-USMLE jsonl: `question`, `options{A..}`, `answer_idx`.
    Medqa,
}

/// Where the tokenizer comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenizerChoice {
    /// A Hugging Face `tokenizer.json`.
    File(PathBuf),
    /// The trainer's embedded byte-level BPE.
    Embedded,
    /// Train a byte-level BPE of this many tokens on (a sample of) the input first.
    Train { vocab_size: usize, sample_bytes: usize },
}

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

/// One document: its text, and the structured record it came from (MedQA).
struct Doc {
    text: String,
    record: Option<McqRecord>,
}

impl Doc {
    fn text(text: String) -> Doc {
        Doc { text, record: None }
    }

    fn mcq(record: McqRecord) -> Doc {
        Doc { text: record.text(), record: Some(record) }
    }
}

/// Documents are sent to the encoder in batches of about this many bytes.
const BATCH_BYTES: usize = 4 << 20;

fn data_err(path: &Path, message: impl Into<String>) -> Error {
    Error::Data { name: path.display().to_string(), message: message.into() }
}

/// The input files in order: files as given, directories walked recursively in name
/// order (hidden entries skipped), each with its format.
fn input_files(inputs: &[PathBuf], format: InputFormat) -> Result<Vec<(PathBuf, InputFormat)>, Error> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), Error> {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(io_err(dir))?
            .map(|e| e.map(|e| e.path()).map_err(io_err(dir)))
            .collect::<Result<_, _>>()?;
        entries.sort();
        for p in entries {
            if p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with('.')) {
                continue;
            }
            if p.is_dir() { walk(&p, out)? } else { out.push(p) }
        }
        Ok(())
    }
    let mut files = Vec::new();
    for input in inputs {
        if input.is_dir() {
            walk(input, &mut files)?;
        } else if input.is_file() {
            files.push(input.clone());
        } else {
            return Err(data_err(input, "--input: no such file or directory"));
        }
    }
    if files.is_empty() {
        return Err(Error::InvalidSpec("--input: no input files".into()));
    }
    files
        .into_iter()
        .map(|f| {
            let fmt = detect(&f, format)?;
            Ok((f, fmt))
        })
        .collect()
}

fn detect(path: &Path, format: InputFormat) -> Result<InputFormat, Error> {
    if format != InputFormat::Auto {
        return Ok(format);
    }
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
    Ok(match ext.as_str() {
        "parquet" => InputFormat::Parquet,
        "jsonl" | "json" | "ndjson" => {
            let file = std::fs::File::open(path).map_err(io_err(path))?;
            let first = BufReader::new(file).lines().find(|l| l.as_ref().map_or(true, |l| !l.trim().is_empty()));
            let first = first.transpose().map_err(io_err(path))?.unwrap_or_default();
            let v: Value = serde_json::from_str(&first).unwrap_or(Value::Null);
            if ["question", "options", "answer_idx"].iter().all(|k| v.get(k).is_some()) {
                InputFormat::Medqa
            } else {
                InputFormat::Jsonl
            }
        }
        _ => InputFormat::Text,
    })
}

/// Calls `f` with every document of `path` and the input bytes it consumed, until it
/// returns `false`.
fn read_docs(
    path: &Path,
    format: InputFormat,
    field: &str,
    f: &mut dyn FnMut(Doc, u64) -> Result<bool, Error>,
) -> Result<(), Error> {
    match format {
        InputFormat::Jsonl | InputFormat::Medqa => {
            let file = std::fs::File::open(path).map_err(io_err(path))?;
            for (n, line) in BufReader::new(file).lines().enumerate() {
                let line = line.map_err(io_err(path))?;
                let bytes = line.len() as u64 + 1;
                if line.trim().is_empty() {
                    continue;
                }
                let at = |m: String| data_err(path, format!("line {}: {m}", n + 1));
                let mut v: Value = serde_json::from_str(&line).map_err(|e| at(format!("not JSON: {e}")))?;
                let doc = if format == InputFormat::Medqa {
                    Doc::mcq(parse_medqa(&v).map_err(at)?)
                } else {
                    match v.get_mut(field).map(Value::take) {
                        Some(Value::String(s)) => Doc::text(s),
                        Some(_) => return Err(at(format!("field `{field}` is not a string"))),
                        None => return Err(at(format!("no field `{field}` (choose another with --field)"))),
                    }
                };
                if !f(doc, bytes)? {
                    return Ok(());
                }
            }
        }
        InputFormat::Parquet => {
            use parquet::file::reader::{FileReader, SerializedFileReader};
            let file = std::fs::File::open(path).map_err(io_err(path))?;
            let reader =
                SerializedFileReader::new(file).map_err(|e| data_err(path, format!("not a Parquet file: {e}")))?;
            let schema = reader.metadata().file_metadata().schema_descr_ptr();
            let columns: Vec<String> = schema.columns().iter().map(|c| c.name().to_string()).collect();
            let idx = columns.iter().position(|c| c == field).ok_or_else(|| {
                data_err(
                    path,
                    format!("no column `{field}` (columns: {}); choose one with --field", columns.join(", ")),
                )
            })?;
            let rows = reader.metadata().file_metadata().num_rows().max(1) as u64;
            let per_row = std::fs::metadata(path).map_err(io_err(path))?.len() / rows;
            let projection = schema.root_schema().get_fields()[idx].clone();
            let projected = parquet::schema::types::Type::group_type_builder("schema")
                .with_fields(vec![projection])
                .build()
                .map_err(|e| data_err(path, e.to_string()))?;
            let iter = reader.get_row_iter(Some(projected)).map_err(|e| data_err(path, e.to_string()))?;
            for (n, row) in iter.enumerate() {
                let row = row.map_err(|e| data_err(path, format!("row {n}: {e}")))?;
                use parquet::record::RowAccessor;
                let text = row.get_string(0).map_err(|e| data_err(path, format!("row {n}: column `{field}`: {e}")))?;
                if !f(Doc::text(text.clone()), per_row)? {
                    return Ok(());
                }
            }
        }
        InputFormat::Text | InputFormat::Auto => {
            let bytes = std::fs::read(path).map_err(io_err(path))?;
            let len = bytes.len() as u64;
            let text = String::from_utf8(bytes).map_err(|e| data_err(path, format!("not UTF-8 text: {e}")))?;
            if !text.trim().is_empty() {
                f(Doc::text(text), len)?;
            }
        }
    }
    Ok(())
}

/// Appends documents to fixed-size shards `<prefix>-NNNNN.bin`.
struct ShardWriter<'a> {
    dir: &'a Path,
    prefix: &'static str,
    shard_tokens: usize,
    buf: Vec<u32>,
    entries: Vec<ShardEntry>,
    dtype: Dtype,
    eos: u32,
    hash: String,
    tokens: u64,
}

impl<'a> ShardWriter<'a> {
    fn push(&mut self, ids: &[u32]) -> Result<(), Error> {
        self.buf.extend_from_slice(ids);
        self.buf.push(self.eos);
        self.tokens += ids.len() as u64 + 1;
        while self.buf.len() >= self.shard_tokens {
            let rest = self.buf.split_off(self.shard_tokens);
            let full = std::mem::replace(&mut self.buf, rest);
            self.flush(&full)?;
        }
        Ok(())
    }

    fn flush(&mut self, tokens: &[u32]) -> Result<(), Error> {
        let file = format!("{}-{:05}.bin", self.prefix, self.entries.len());
        let h = shard::write(&self.dir.join(&file), tokens, self.dtype, self.eos, &self.hash)?;
        self.entries.push(ShardEntry { file, tokens: h.tokens, documents: h.documents, crc32: h.crc32 });
        Ok(())
    }

    fn finish(mut self) -> Result<Vec<ShardEntry>, Error> {
        if !self.buf.is_empty() {
            let last = std::mem::take(&mut self.buf);
            self.flush(&last)?;
        }
        Ok(self.entries)
    }
}

/// Whether document `i` is held out: a seeded hash below the fraction.
fn held_out(seed: u64, i: u64, fraction: f64) -> bool {
    let h = crate::rng::splitmix64(crate::rng::splitmix64(seed ^ 0x7661_6c69_6461_7465) ^ i);
    (h as f64 / u64::MAX as f64) < fraction
}

fn load_tokenizer(o: &PrepareOptions, files: &[(PathBuf, InputFormat)]) -> Result<Tokenizer, Error> {
    match &o.tokenizer {
        TokenizerChoice::File(p) => Tokenizer::from_file(p),
        TokenizerChoice::Embedded => Tokenizer::embedded(),
        TokenizerChoice::Train { vocab_size, sample_bytes } => {
            let mut sample = Vec::new();
            let mut bytes = 0usize;
            for (path, format) in files {
                read_docs(path, *format, &o.field, &mut |doc, _| {
                    bytes += doc.text.len();
                    sample.push(doc.text);
                    Ok(bytes < *sample_bytes)
                })?;
                if bytes >= *sample_bytes {
                    break;
                }
            }
            let start = Instant::now();
            let tok = Tokenizer::train_bpe(sample.iter(), *vocab_size, "--train-tokenizer")?;
            tracing::info!(
                vocab = tok.vocab_size(),
                sample_mb = bytes as f64 / 1e6,
                seconds = start.elapsed().as_secs_f64(),
                "trained a byte-level BPE on the input"
            );
            Ok(tok)
        }
    }
}

/// Runs `trainer prepare`.
pub fn prepare(o: &PrepareOptions) -> Result<PrepareReport, Error> {
    if !(0.0..1.0).contains(&o.validation_fraction) {
        return Err(Error::InvalidSpec(format!("--validation-fraction {} must be in [0, 1)", o.validation_fraction)));
    }
    if o.shard_tokens < 1024 {
        return Err(Error::InvalidSpec(format!("--shard-tokens {} must be at least 1024", o.shard_tokens)));
    }
    let started = Instant::now();
    let files = input_files(&o.inputs, o.format)?;
    let tok = load_tokenizer(o, &files)?;
    std::fs::create_dir_all(&o.output).map_err(io_err(&o.output))?;
    let name =
        o.name.clone().unwrap_or_else(|| o.output.file_name().and_then(|n| n.to_str()).unwrap_or("source").to_string());
    let dtype = Dtype::for_vocab(tok.vocab_size());
    let writer = |prefix| ShardWriter {
        dir: &o.output,
        prefix,
        shard_tokens: o.shard_tokens as usize,
        buf: Vec::new(),
        entries: Vec::new(),
        dtype,
        eos: tok.eos_id(),
        hash: tok.hash(),
        tokens: 0,
    };
    let (mut train, mut val) = (writer("train"), writer("validation"));
    let medqa = files.iter().any(|(_, f)| *f == InputFormat::Medqa);
    let mut records: [Vec<String>; 2] = Default::default();

    let total_bytes: u64 = files.iter().map(|(p, _)| std::fs::metadata(p).map_or(0, |m| m.len())).sum();
    let bar = if o.progress {
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

    let (tx, rx) = sync_channel::<Result<(Vec<Doc>, u64), Error>>(2);
    let field = o.field.clone();
    let reader_files = files.clone();
    let reader = std::thread::spawn(move || {
        let mut batch = Vec::new();
        let (mut batch_bytes, mut consumed) = (0usize, 0u64);
        let mut closed = false;
        for (path, format) in &reader_files {
            let r = read_docs(path, *format, &field, &mut |doc, bytes| {
                batch_bytes += doc.text.len();
                consumed += bytes;
                batch.push(doc);
                if batch_bytes >= BATCH_BYTES {
                    let full = std::mem::take(&mut batch);
                    batch_bytes = 0;
                    // A closed channel means the encoder stopped (with an error of its own).
                    closed = tx.send(Ok((full, std::mem::take(&mut consumed)))).is_err();
                    return Ok(!closed);
                }
                Ok(true)
            });
            if closed {
                return;
            }
            if let Err(e) = r {
                let _ = tx.send(Err(e));
                return;
            }
        }
        let _ = tx.send(Ok((batch, consumed)));
    });

    let (mut documents, mut held) = (0u64, 0u64);
    let mut input_bytes = 0u64;
    for msg in rx {
        let (docs, bytes) = msg?;
        let (texts, mcq): (Vec<String>, Vec<Option<McqRecord>>) = docs.into_iter().map(|d| (d.text, d.record)).unzip();
        for (record, ids) in mcq.iter().zip(tok.encode_batch(&texts)) {
            let validation = held_out(o.seed, documents, o.validation_fraction);
            if validation {
                val.push(&ids)?
            } else {
                train.push(&ids)?
            }
            if let Some(r) = record {
                records[validation as usize].push(medqa_json(r).to_string());
            }
            documents += 1;
            held += validation as u64;
        }
        input_bytes += bytes;
        bar.inc(bytes);
    }
    reader.join().map_err(|_| Error::InvalidSpec("prepare: the input reader panicked".into()))?;
    bar.finish_and_clear();
    if documents == 0 {
        return Err(Error::InvalidSpec("--input: the inputs hold no documents".into()));
    }
    if held == 0 && o.validation_fraction > 0.0 {
        tracing::warn!(
            "{name}: no document fell into the {} validation split; raise --validation-fraction",
            o.validation_fraction
        );
    }
    let (train_tokens, validation_tokens) = (train.tokens, val.tokens);
    let (train, validation) = (train.finish()?, val.finish()?);
    let record_files = if medqa {
        let mut files =
            RecordFiles { train: "records-train.jsonl".into(), validation: "records-validation.jsonl".into() };
        for (recs, file) in records.iter().zip([&mut files.train, &mut files.validation]) {
            let path = o.output.join(&*file);
            crate::files::write_atomic(&path, (recs.join("\n") + "\n").as_bytes()).map_err(io_err(&path))?;
        }
        Some(files)
    } else {
        None
    };
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
        input: json!({
            "files": files.iter().map(|(p, f)| json!({"path": p.display().to_string(), "format": f})).collect::<Vec<_>>(),
            "field": o.field,
            "documents": documents,
            "validationDocuments": held,
            "validationFraction": o.validation_fraction,
            "seed": o.seed,
            "bytes": input_bytes,
        }),
    };
    manifest.write(&o.output)?;
    Ok(PrepareReport {
        documents,
        validation_documents: held,
        train_tokens,
        validation_tokens,
        input_bytes,
        seconds: started.elapsed().as_secs_f64(),
        shards,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::data::shard::ShardSet;
    use crate::files::test_util::TempDir;

    fn docs() -> Vec<String> {
        (0..40)
            .map(|i| {
                format!(
                    "Document {i}: the river Belmora runs {} miles past {} towns.\nSecond line, ünïcode ✓.",
                    i * 3,
                    i % 7
                )
            })
            .collect()
    }

    fn options(inputs: Vec<PathBuf>, output: PathBuf) -> PrepareOptions {
        PrepareOptions {
            inputs,
            output,
            name: None,
            format: InputFormat::Auto,
            field: "text".into(),
            tokenizer: TokenizerChoice::Embedded,
            shard_tokens: 1024,
            validation_fraction: 0.0,
            seed: 0,
            progress: false,
        }
    }

    fn train_tokens(dir: &Path) -> Vec<u32> {
        let m = Manifest::read(dir).unwrap();
        let set = ShardSet::open(dir, &m.train, &m).unwrap();
        set.shards.iter().flat_map(|s| s.tokens(0, s.len() as usize).into_owned()).collect()
    }

    fn write_parquet(path: &Path, texts: &[String]) {
        use parquet::basic::Compression;
        use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
        use parquet::file::properties::WriterProperties;
        use parquet::file::writer::SerializedFileWriter;
        let schema = Arc::new(
            parquet::schema::parser::parse_message_type(
                "message schema { REQUIRED INT64 id; REQUIRED BYTE_ARRAY text (UTF8); }",
            )
            .unwrap(),
        );
        let props = Arc::new(WriterProperties::builder().set_compression(Compression::SNAPPY).build());
        let mut w = SerializedFileWriter::new(std::fs::File::create(path).unwrap(), schema, props).unwrap();
        // Two row groups, as large datasets have.
        for chunk in texts.chunks(texts.len() / 2 + 1) {
            let mut rg = w.next_row_group().unwrap();
            let mut col = rg.next_column().unwrap().unwrap();
            let ids: Vec<i64> = (0..chunk.len() as i64).collect();
            col.typed::<Int64Type>().write_batch(&ids, None, None).unwrap();
            col.close().unwrap();
            let mut col = rg.next_column().unwrap().unwrap();
            let values: Vec<ByteArray> = chunk.iter().map(|t| ByteArray::from(t.as_str())).collect();
            col.typed::<ByteArrayType>().write_batch(&values, None, None).unwrap();
            col.close().unwrap();
            rg.close().unwrap();
        }
        w.close().unwrap();
    }

    #[test]
    fn jsonl_parquet_and_text_give_the_same_tokens() {
        let dir = TempDir::new("prep-formats");
        let docs = docs();
        let jsonl = dir.0.join("in.jsonl");
        let lines: Vec<String> = docs.iter().map(|d| json!({"id": 1, "body": d}).to_string()).collect();
        std::fs::write(&jsonl, lines.join("\n") + "\n\n").unwrap();
        let parquet = dir.0.join("in.parquet");
        write_parquet(&parquet, &docs);
        let text_dir = dir.0.join("texts");
        std::fs::create_dir_all(text_dir.join("sub")).unwrap();
        for (i, d) in docs.iter().enumerate() {
            // Path order is document order, and subdirectories are walked.
            let file = if i < 30 {
                text_dir.join(format!("{i:03}.txt"))
            } else {
                text_dir.join("sub").join(format!("{i:03}.txt"))
            };
            std::fs::write(file, d).unwrap();
        }
        std::fs::write(text_dir.join(".hidden.txt"), "skipped").unwrap();

        let mut o = options(vec![jsonl], dir.0.join("a"));
        o.field = "body".into();
        let ra = prepare(&o).unwrap();
        let mut o = options(vec![parquet], dir.0.join("b"));
        let rb = prepare(&o).unwrap();
        o = options(vec![text_dir], dir.0.join("c"));
        let rc = prepare(&o).unwrap();
        assert_eq!((ra.documents, rb.documents, rc.documents), (40, 40, 40));
        let a = train_tokens(&dir.0.join("a"));
        assert_eq!(a, train_tokens(&dir.0.join("b")));
        assert_eq!(a, train_tokens(&dir.0.join("c")));
        let tok = Tokenizer::embedded().unwrap();
        assert_eq!(a.iter().filter(|&&t| t == tok.eos_id()).count(), 40);
        let first_doc: Vec<u32> = a.iter().take_while(|&&t| t != tok.eos_id()).copied().collect();
        assert_eq!(tok.decode(&first_doc), docs[0]);
        // Fixed-size shards: all but the last hold exactly --shard-tokens.
        let m = Manifest::read(&dir.0.join("a")).unwrap();
        assert!(m.train.len() > 1);
        assert!(m.train[..m.train.len() - 1].iter().all(|e| e.tokens == 1024));
        assert_eq!(Manifest::tokens(&m.train), a.len() as u64);
    }

    #[test]
    fn the_validation_split_is_deterministic_and_near_its_fraction() {
        let dir = TempDir::new("prep-split");
        let input = dir.0.join("in.jsonl");
        let lines: Vec<String> = (0..2000).map(|i| json!({"text": format!("doc {i}")}).to_string()).collect();
        std::fs::write(&input, lines.join("\n")).unwrap();
        let mut o = options(vec![input.clone()], dir.0.join("a"));
        o.validation_fraction = 0.1;
        let r = prepare(&o).unwrap();
        assert!((150..=250).contains(&r.validation_documents), "{}", r.validation_documents);
        o.output = dir.0.join("b");
        prepare(&o).unwrap();
        let (a, b) = (Manifest::read(&dir.0.join("a")).unwrap(), Manifest::read(&dir.0.join("b")).unwrap());
        assert_eq!((&a.train, &a.validation), (&b.train, &b.validation));
        o.output = dir.0.join("c");
        o.seed = 1;
        prepare(&o).unwrap();
        assert_ne!(
            Manifest::read(&dir.0.join("c")).unwrap().validation,
            b.validation,
            "another seed holds out other documents"
        );
    }

    #[test]
    fn medqa_becomes_text_for_pretraining_and_records_for_grpo() {
        let dir = TempDir::new("prep-medqa");
        let input = dir.0.join("medqa.jsonl");
        let recs: Vec<McqRecord> = (0..60)
            .map(|i| {
                McqRecord::new(
                    format!("A {i}-year-old presents with fever. Next step?"),
                    vec!["Observe".into(), format!("Drug {i}"), "Surgery".into(), "Discharge".into()],
                    i % 4,
                )
            })
            .collect();
        let lines: Vec<String> = recs.iter().map(|r| medqa_json(r).to_string()).collect();
        std::fs::write(&input, lines.join("\n")).unwrap();
        let mut o = options(vec![input], dir.0.join("out"));
        o.validation_fraction = 0.2;
        let r = prepare(&o).unwrap();
        let m = Manifest::read(&dir.0.join("out")).unwrap();
        let files = m.records.clone().expect("MedQA keeps its records");
        let read = |f: &str| -> Vec<McqRecord> {
            std::fs::read_to_string(dir.0.join("out").join(f))
                .unwrap()
                .lines()
                .filter(|l| !l.is_empty())
                .map(|l| parse_medqa(&serde_json::from_str(l).unwrap()).unwrap())
                .collect()
        };
        let (train, val) = (read(&files.train), read(&files.validation));
        assert_eq!(val.len() as u64, r.validation_documents);
        assert_eq!(train.len() + val.len(), 60);
        let mut all: Vec<McqRecord> = train.into_iter().chain(val).collect();
        all.sort_by_key(|r| r.options[1].clone());
        let mut want = recs.clone();
        want.sort_by_key(|r| r.options[1].clone());
        assert_eq!(all, want);
        // The pretraining text is the prompt and the gold letter.
        let tok = Tokenizer::embedded().unwrap();
        let text = tok.decode(&train_tokens(&dir.0.join("out")));
        assert!(text.contains("Question: A 0-year-old presents with fever. Next step?\nA. Observe\nB. Drug 0\nC. Surgery\nD. Discharge\nAnswer: A"), "{text}");
    }

    #[test]
    fn a_trained_tokenizer_is_written_beside_the_shards() {
        let dir = TempDir::new("prep-bpe");
        let input = dir.0.join("in.txt");
        std::fs::write(&input, docs().join("\n\n")).unwrap();
        let mut o = options(vec![input], dir.0.join("out"));
        o.tokenizer = TokenizerChoice::Train { vocab_size: 300, sample_bytes: 1 << 20 };
        prepare(&o).unwrap();
        let m = Manifest::read(&dir.0.join("out")).unwrap();
        let tok = Tokenizer::from_file(dir.0.join("out/tokenizer.json")).unwrap();
        assert_eq!((tok.hash(), tok.vocab_size(), tok.eos_id()), (m.tokenizer.hash.clone(), m.tokenizer.vocab_size, 0));
        assert!(tok.vocab_size() <= 300);
        assert_eq!(m.dtype, Dtype::U16);
        assert_eq!(tok.decode(&train_tokens(&dir.0.join("out"))[..5]), tok.decode(&tok.encode(&docs()[0])[..5]));
    }

    #[test]
    fn bad_inputs_name_the_file_the_line_and_the_field() {
        let dir = TempDir::new("prep-bad");
        let err = |name: &str, body: &[u8], field: &str| {
            let path = dir.0.join(name);
            std::fs::write(&path, body).unwrap();
            let mut o = options(vec![path], dir.0.join(format!("out-{name}")));
            o.field = field.into();
            prepare(&o).unwrap_err().to_string()
        };
        let e = err("a.jsonl", b"{\"text\": \"ok\"}\n{\"body\": \"no text\"}\n", "text");
        assert!(e.contains("a.jsonl") && e.contains("line 2") && e.contains("no field `text`"), "{e}");
        let e = err("b.jsonl", b"{\"text\": 5}\n", "text");
        assert!(e.contains("b.jsonl") && e.contains("line 1") && e.contains("not a string"), "{e}");
        let e = err("c.jsonl", b"{not json\n", "text");
        assert!(e.contains("c.jsonl") && e.contains("not JSON"), "{e}");
        let e = err(
            "d.jsonl",
            br#"{"question": "q", "options": {"A": "a", "B": "b", "C": "c", "D": "d"}, "answer_idx": "E"}"#,
            "text",
        );
        assert!(e.contains("d.jsonl") && e.contains("answer_idx") && e.contains("\"E\""), "{e}");
        let e = err("e.jsonl", br#"{"question": "q", "options": {"A": "a", "C": "c"}, "answer_idx": "A"}"#, "text");
        assert!(e.contains("options.B"), "{e}");
        let e = err("f.txt", &[0x66, 0xff, 0xfe, 0x00], "text");
        assert!(e.contains("f.txt") && e.contains("not UTF-8"), "{e}");
        let path = dir.0.join("g.parquet");
        write_parquet(&path, &docs());
        let mut o = options(vec![path], dir.0.join("out-g"));
        o.field = "content".into();
        let e = prepare(&o).unwrap_err().to_string();
        assert!(e.contains("g.parquet") && e.contains("no column `content`") && e.contains("id, text"), "{e}");
        let e = err("h.parquet", b"PAR1 but not really", "text");
        assert!(e.contains("h.parquet") && e.contains("not a Parquet file"), "{e}");
        let mut o = options(vec![dir.0.join("missing.jsonl")], dir.0.join("out-m"));
        o.validation_fraction = 0.0;
        assert!(prepare(&o).unwrap_err().to_string().contains("missing.jsonl"));
    }
}
