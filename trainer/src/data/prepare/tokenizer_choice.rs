//! Where `trainer prepare`'s tokenizer comes from: a file, the embedded one, or one
//! trained on the input.

use std::path::PathBuf;
use std::time::Instant;

use super::inputs::{InputFormat, read_docs};
use crate::Error;
use crate::data::tokenizer::Tokenizer;

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

/// The tokenizer `choice` names, trained on the first `sample_bytes` of the inputs' documents
/// (`field` of each record) when it asks for a new one.
pub(super) fn load_tokenizer(
    choice: &TokenizerChoice,
    field: &str,
    files: &[(PathBuf, InputFormat)],
) -> Result<Tokenizer, Error> {
    match choice {
        TokenizerChoice::File(p) => Tokenizer::from_file(p),
        TokenizerChoice::Embedded => Tokenizer::embedded(),
        TokenizerChoice::Train { vocab_size, sample_bytes } => {
            let mut sample = Vec::new();
            let mut bytes = 0usize;
            for (path, format) in files {
                read_docs(path, *format, field, &mut |doc, _| {
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
