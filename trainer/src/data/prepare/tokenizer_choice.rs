//! Where `trainer prepare`'s tokenizer comes from: a file, the embedded one, or one
//! trained on the input.

use std::path::Path;
use std::time::Instant;

use super::inputs::{detect, read_docs};
use super::listing::{Clients, Unit};
use crate::Error;
use crate::data::tokenizer::Tokenizer;
use crate::files::limits::TOKENIZER_BYTES;
use crate::https::{self, Https};
use crate::storage::{self, S3};

/// Where the tokenizer comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenizerChoice {
    /// A Hugging Face `tokenizer.json`: a path, `s3://bucket/key` or an `https://` URL.
    Uri(String),
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
    clients: &Clients,
    scratch: &Path,
) -> Result<Tokenizer, Error> {
    match choice {
        TokenizerChoice::Uri(uri) => tokenizer_at(uri, clients),
        TokenizerChoice::Embedded => Tokenizer::embedded(),
        TokenizerChoice::Train { vocab_size, sample_bytes } => {
            let mut sample = Vec::new();
            let mut bytes = 0usize;
            for unit in units {
                let mut file = Vec::new();
                let mut file_bytes = 0usize;
                let local = unit.fetch(clients, scratch)?;
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

/// The tokenizer.json at `uri`, with the listing's client for its scheme or a new one.
fn tokenizer_at(uri: &str, clients: &Clients) -> Result<Tokenizer, Error> {
    let text = |bytes: Vec<u8>| {
        String::from_utf8(bytes).map_err(|e| Error::Tokenizer { path: uri.to_string(), message: e.to_string() })
    };
    if let Some((bucket, key)) = storage::parse_uri(uri) {
        let made;
        let s3 = match &clients.s3 {
            Some(s3) => s3,
            None => {
                made = S3::from_env()?;
                &made
            }
        };
        return Tokenizer::from_json(&text(s3.get_bytes(&bucket, &key, TOKENIZER_BYTES)?)?, uri);
    }
    if https::is_url(uri) {
        let made;
        let client = match &clients.https {
            Some(c) => c,
            None => {
                made = Https::new()?;
                &made
            }
        };
        return Tokenizer::from_json(&text(client.get_bytes(uri, TOKENIZER_BYTES)?)?, uri);
    }
    Tokenizer::from_file(uri)
}
