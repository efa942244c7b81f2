//! Where `trainer prepare`'s tokenizer comes from: a file, the embedded one, or one
//! trained on the input.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::inputs::{detect, read_docs};
use super::listing::Unit;
use crate::Error;
use crate::data::tokenizer::Tokenizer;
use crate::storage::S3;

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

/// The tokenizer `choice` names, trained when it asks for a new one on the first
/// `sample_bytes` of the inputs' documents (`field` of each record) in listing order,
/// skipping files that fail to read.
pub(super) fn load_tokenizer(
    choice: &TokenizerChoice,
    field: &str,
    units: &[Unit],
    s3: Option<&S3>,
    scratch: &Path,
) -> Result<Tokenizer, Error> {
    match choice {
        TokenizerChoice::File(p) => Tokenizer::from_file(p),
        TokenizerChoice::Embedded => Tokenizer::embedded(),
        TokenizerChoice::Train { vocab_size, sample_bytes } => {
            let mut sample = Vec::new();
            let mut bytes = 0usize;
            for unit in units {
                let mut file = Vec::new();
                let mut file_bytes = 0usize;
                let local = unit.fetch(s3, scratch)?;
                let format = detect(&local.path, unit.format)?;
                let read = read_docs(&local.path, format, field, &mut |doc, _| {
                    file_bytes += doc.text.len();
                    file.push(doc.text);
                    Ok(bytes + file_bytes < *sample_bytes)
                });
                match read {
                    Ok(()) => {
                        sample.append(&mut file);
                        bytes += file_bytes;
                    }
                    // A bad file is the parts' to report; the sample goes on without it.
                    Err(Error::Data { .. }) => continue,
                    Err(e) => return Err(e),
                }
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
