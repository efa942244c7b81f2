//! The run's token streams: each source of `spec.data.mix` (embedded, prepared on a
//! path or PVC, or prepared on S3) for training and validation, and the run's
//! tokenizer.

use std::path::Path;
use std::sync::Arc;

use crds::config::{Location, ResolvedSource, RunConfig};

use super::corpus::Split;
use super::mix::{self, Mix, SourceTokens, Tokens};
use super::remote::RemoteShards;
use super::shard::{MANIFEST, Manifest, ShardEntry, ShardSet};
use super::tokenizer::Tokenizer;
use crate::Error;
use crate::storage::{self, S3};

/// Embedded sources never need more than this many tokens each; longer runs repeat epochs.
const MAX_EMBEDDED_TOKENS: usize = 16_000_000;

/// The run's tokenizer (`spec.model.tokenizer`).
pub fn load_tokenizer(cfg: &RunConfig) -> Result<Tokenizer, Error> {
    let tokenizer = match &cfg.tokenizer {
        Location::Embedded { .. } => Tokenizer::embedded()?,
        Location::Path { path } => Tokenizer::from_file(path)?,
        Location::Pvc { claim, path } => Tokenizer::from_file(crds::contract::pvc_path(claim, path))?,
        Location::S3 { bucket, prefix } => {
            // A tokenizer.json object, or the one beside a prepared source's manifest.
            let key = if prefix.ends_with(".json") { prefix.clone() } else { storage::join(prefix, "tokenizer.json") };
            let local = crate::files::under(&super::cache_dir().join("s3"), &format!("{bucket}/{key}"))
                .map_err(|message| Error::Tokenizer { path: storage::uri(bucket, &key), message })?;
            storage::for_data(cfg)?.get_file(bucket, &key, &local, crate::files::limits::TOKENIZER_BYTES)?;
            Tokenizer::from_file(&local)?
        }
    };
    if tokenizer.vocab_size() > cfg.model.vocab_size as usize {
        return Err(Error::InvalidSpec(format!(
            "spec.model.vocabSize {} is smaller than the tokenizer's vocabulary of {}",
            cfg.model.vocab_size,
            tokenizer.vocab_size()
        )));
    }
    Ok(tokenizer)
}

/// One single-source validation mix per data source, in mix order.
pub fn validation_mixes(cfg: &RunConfig, tok: &Tokenizer) -> Result<Vec<Mix>, Error> {
    source_tokens(cfg, tok, Split::Validation)?
        .into_iter()
        .map(|s| Mix::validation(vec![s], cfg.batch.seq_len as usize))
        .collect()
}

/// Token streams of the run's data sources: for training, each source's share of the
/// budget (epochs repeat past [`MAX_EMBEDDED_TOKENS`]); for validation, its share of
/// `evalTokens`.
pub fn source_tokens(cfg: &RunConfig, tok: &Tokenizer, split: Split) -> Result<Vec<SourceTokens>, Error> {
    let data = cfg.data.as_ref().ok_or_else(|| Error::InvalidSpec("spec.data: pretraining needs a data mix".into()))?;
    let total_weight: f64 = data.mix.iter().map(|s| s.weight).sum();
    let sample = cfg.batch.seq_len as usize + 1;
    data.mix
        .iter()
        .map(|src| {
            let name = match &src.location {
                Location::Embedded { name } => name,
                Location::Path { path } => return prepared_source(src, Path::new(path), tok, split),
                Location::Pvc { claim, path } => {
                    return prepared_source(src, Path::new(&crds::contract::pvc_path(claim, path)), tok, split);
                }
                Location::S3 { bucket, prefix } => {
                    return remote_source(storage::for_data(cfg)?, src, bucket, prefix, tok, split);
                }
            };
            let need = match split {
                Split::Train => {
                    let share = src.weight / total_weight;
                    ((cfg.data_size().tokens as f64 * share * 1.02) as usize + 16 * sample).min(MAX_EMBEDDED_TOKENS)
                }
                Split::Validation => (data.eval_tokens as usize / data.mix.len()).max(2 * sample) + sample,
            };
            let tokens = mix::embedded_source_tokens(tok, name, cfg.seed, split, need)?;
            Ok(SourceTokens { name: src.name.clone(), weight: src.weight, tokens: tokens.into() })
        })
        .collect()
}

/// A source prepared by `trainer prepare`: its manifest's shards of `split`, checked
/// against the run's tokenizer.
fn prepared_source(src: &ResolvedSource, dir: &Path, tok: &Tokenizer, split: Split) -> Result<SourceTokens, Error> {
    let manifest = Manifest::read(dir)?;
    let entries = split_entries(src, &manifest, tok, split)?;
    let shards = ShardSet::open(dir, entries, &manifest)?;
    Ok(SourceTokens { name: src.name.clone(), weight: src.weight, tokens: Tokens::Shards(Arc::new(shards)) })
}

/// A source prepared to `s3://bucket/prefix`: shards fetched on demand into a bounded cache.
fn remote_source(
    s3: Arc<S3>,
    src: &ResolvedSource,
    bucket: &str,
    prefix: &str,
    tok: &Tokenizer,
    split: Split,
) -> Result<SourceTokens, Error> {
    let key = storage::join(prefix, MANIFEST);
    let text = s3.get_bytes(bucket, &key, crate::files::limits::MANIFEST_BYTES)?;
    let origin = storage::uri(bucket, &key);
    let manifest = Manifest::parse(&String::from_utf8_lossy(&text), Path::new(&origin))?;
    let entries = split_entries(src, &manifest, tok, split)?;
    let remote = RemoteShards::new(s3, bucket, prefix, &manifest, entries, &super::cache_dir())?;
    Ok(SourceTokens { name: src.name.clone(), weight: src.weight, tokens: Tokens::Remote(Arc::new(remote)) })
}

/// The manifest's shards of `split`, after checking its tokenizer against the run's.
fn split_entries<'m>(
    src: &ResolvedSource,
    manifest: &'m Manifest,
    tok: &Tokenizer,
    split: Split,
) -> Result<&'m [ShardEntry], Error> {
    let bad = |message: String| Error::Data { name: src.name.clone(), message: format!("{}: {message}", src.uri) };
    if manifest.tokenizer.hash != tok.hash() {
        return Err(bad(format!(
            "prepared with tokenizer {} ({} tokens), but the run's spec.model.tokenizer is {} ({} tokens); \
             train with the tokenizer.json beside the manifest or prepare again",
            &manifest.tokenizer.hash[..16.min(manifest.tokenizer.hash.len())],
            manifest.tokenizer.vocab_size,
            &tok.hash()[..16],
            tok.vocab_size()
        )));
    }
    let entries = match split {
        Split::Train => &manifest.train,
        Split::Validation => &manifest.validation,
    };
    if entries.is_empty() {
        return Err(bad(format!("has no {} shards; prepare it with --validation-fraction above 0", split.name())));
    }
    Ok(entries)
}
