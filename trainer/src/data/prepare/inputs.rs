//! The inputs of `trainer prepare`: their formats, found and detected per file, and
//! their documents, read on a thread of their own in batches.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, sync_channel};
use std::thread::JoinHandle;

use serde_json::Value;

use crate::data::mcq::{McqRecord, parse_medqa};
use crate::{Error, io_err};

/// Input formats; `Auto` decides per file by its extension and first record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
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

/// One document: its text, and the structured record it came from (MedQA).
pub(super) struct Doc {
    pub(super) text: String,
    pub(super) record: Option<McqRecord>,
}

impl Doc {
    fn text(text: String) -> Doc {
        Doc { text, record: None }
    }

    fn mcq(record: McqRecord) -> Doc {
        Doc { text: record.text(), record: Some(record) }
    }
}

/// A batch of documents and the input bytes they consumed, or the reader's error.
pub(super) type DocBatch = Result<(Vec<Doc>, u64), Error>;

/// Documents are sent to the encoder in batches of about this many bytes.
const BATCH_BYTES: usize = 4 << 20;

fn data_err(path: &Path, message: impl Into<String>) -> Error {
    Error::Data { name: path.display().to_string(), message: message.into() }
}

/// The format of the file at `path`: `format`, or when that is `Auto`, decided by the
/// extension and (for JSON lines) the first record.
pub(super) fn detect(path: &Path, format: InputFormat) -> Result<InputFormat, Error> {
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
pub(super) fn read_docs(
    path: &Path,
    format: InputFormat,
    field: &str,
    f: &mut dyn FnMut(Doc, u64) -> Result<bool, Error>,
) -> Result<(), Error> {
    match format {
        InputFormat::Jsonl | InputFormat::Medqa => {
            let file = std::fs::File::open(path).map_err(io_err(path))?;
            for (n, line) in BufReader::new(file).lines().enumerate() {
                let line = line.map_err(|e| {
                    if e.kind() == std::io::ErrorKind::InvalidData {
                        data_err(path, format!("line {}: not UTF-8 text", n + 1))
                    } else {
                        io_err(path)(e)
                    }
                })?;
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
            let text = text_of(path, bytes)?;
            if !text.trim().is_empty() {
                f(Doc::text(text), len)?;
            }
        }
    }
    Ok(())
}

/// Invalid UTF-8 a text file may hold, as a share of its bytes: replaced by U+FFFD with a
/// warning, as a stray byte in a scraped page should be; beyond it the file fails.
const INVALID_UTF8_TOLERATED: f64 = 0.001;

fn text_of(path: &Path, bytes: Vec<u8>) -> Result<String, Error> {
    let bytes = match String::from_utf8(bytes) {
        Ok(text) => return Ok(text),
        Err(e) => e.into_bytes(),
    };
    let invalid: usize = bytes.utf8_chunks().map(|c| c.invalid().len()).sum();
    if invalid as f64 > INVALID_UTF8_TOLERATED * bytes.len() as f64 {
        return Err(data_err(
            path,
            format!(
                "not UTF-8 text: {invalid} invalid bytes of {} (at most {}% are replaced)",
                bytes.len(),
                INVALID_UTF8_TOLERATED * 100.0
            ),
        ));
    }
    tracing::warn!(file = %path.display(), invalid, "replaced invalid UTF-8 with U+FFFD");
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Spawns the reader: a thread that reads the documents of `files` in order and sends
/// them in batches of about [`BATCH_BYTES`], stopping at its first error.
pub(super) fn spawn_reader(files: Vec<(PathBuf, InputFormat)>, field: String) -> (Receiver<DocBatch>, JoinHandle<()>) {
    let (tx, rx) = sync_channel::<DocBatch>(2);
    let reader = std::thread::spawn(move || {
        let mut batch = Vec::new();
        let (mut batch_bytes, mut consumed) = (0usize, 0u64);
        let mut closed = false;
        for (path, format) in &files {
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
    (rx, reader)
}
