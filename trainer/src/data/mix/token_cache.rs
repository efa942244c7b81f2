//! The embedded corpus's token streams, cached on disk in the `TRTOKv01` format when
//! they are slow to make.

use std::path::{Path, PathBuf};
use std::time::Instant;

use sha2::{Digest, Sha256};

use crate::Error;
use crate::data::corpus::{self, CORPUS_VERSION, Split};
use crate::data::tokenizer::Tokenizer;

/// Generating and tokenizing a stream for longer than this caches it on disk.
const CACHE_IF_SLOWER_THAN_S: f64 = 1.0;

/// Documents are tokenized in batches of about this many bytes (one `encode_batch` each).
const ENCODE_BATCH_BYTES: usize = 1 << 20;

/// Tokens of the embedded `source` (`split`, document seed `seed`): its documents
/// tokenized and concatenated, each followed by EOS, stopping at the first document end
/// at or after `n_tokens_min` tokens. A longer request extends the same stream. Streams
/// that take more than a second to make are cached under [`crate::data::cache_dir`].
pub fn embedded_source_tokens(
    tok: &Tokenizer,
    source: &str,
    seed: u64,
    split: Split,
    n_tokens_min: usize,
) -> Result<Vec<u32>, Error> {
    embedded_source_tokens_in(Some(&crate::data::cache_dir()), tok, source, seed, split, n_tokens_min)
}

/// [`embedded_source_tokens`] with an explicit cache directory (`None`: no caching).
pub fn embedded_source_tokens_in(
    cache_dir: Option<&Path>,
    tok: &Tokenizer,
    source: &str,
    seed: u64,
    split: Split,
    n_tokens_min: usize,
) -> Result<Vec<u32>, Error> {
    corpus::source_index(source)?;
    let path = cache_dir.map(|dir| tokens_cache_path(dir, tok, source, seed, split, n_tokens_min));
    if let Some(path) = path.as_deref().filter(|p| p.exists()) {
        match read_tokens(path) {
            Some(tokens) if tokens.len() >= n_tokens_min && tokens.last() == Some(&tok.eos_id()) => return Ok(tokens),
            _ => tracing::warn!("discarding the corrupt token cache {}; tokenizing again", path.display()),
        }
    }
    let start = Instant::now();
    let mut tokens = Vec::with_capacity(n_tokens_min + 1024);
    let mut docs = corpus::stream(source, seed, split)?;
    while tokens.len() < n_tokens_min {
        // Tokenize in batches but keep only whole documents up to the first one that
        // reaches the target, so the result does not depend on the batch size.
        let mut batch = Vec::new();
        let mut bytes = 0;
        let want_bytes = ((n_tokens_min - tokens.len()) * 3).clamp(4096, ENCODE_BATCH_BYTES);
        while bytes < want_bytes {
            let doc = docs.next().expect("document streams are endless");
            bytes += doc.len();
            batch.push(doc);
        }
        for ids in tok.encode_batch(&batch) {
            if tokens.len() >= n_tokens_min {
                break;
            }
            tokens.extend_from_slice(&ids);
            tokens.push(tok.eos_id());
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    tracing::debug!(source, tokens = tokens.len(), seconds, "tokenized an embedded source");
    if let Some(path) = path.filter(|_| seconds > CACHE_IF_SLOWER_THAN_S)
        && let Err(e) = crate::files::write_atomic(&path, &encode_tokens(&tokens))
    {
        tracing::warn!("could not cache tokens at {}: {e}", path.display());
    }
    Ok(tokens)
}

fn tokens_cache_path(dir: &Path, tok: &Tokenizer, source: &str, seed: u64, split: Split, n: usize) -> PathBuf {
    let name = format!("{source}-{}-seed{seed}-corpus{CORPUS_VERSION}-tok{}-{n}.bin", split.name(), &tok.hash()[..16]);
    dir.join("tokens").join(name)
}

const TOKENS_MAGIC: &[u8; 8] = b"TRTOKv01";

/// Cache format: magic, count (u64 LE), SHA-256 of the payload, payload (u32 LE each).
fn encode_tokens(tokens: &[u32]) -> Vec<u8> {
    let payload: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    let mut out = Vec::with_capacity(48 + payload.len());
    out.extend_from_slice(TOKENS_MAGIC);
    out.extend_from_slice(&(tokens.len() as u64).to_le_bytes());
    out.extend_from_slice(&Sha256::digest(&payload));
    out.extend_from_slice(&payload);
    out
}

fn read_tokens(path: &Path) -> Option<Vec<u32>> {
    let bytes = std::fs::read(path).ok()?;
    let (head, payload) = bytes.split_at_checked(48)?;
    let count = u64::from_le_bytes(head[8..16].try_into().ok()?) as usize;
    if &head[..8] != TOKENS_MAGIC || payload.len() != count * 4 || Sha256::digest(payload)[..] != head[16..48] {
        return None;
    }
    Some(payload.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes"))).collect())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::data::mix::{Mix, SourceTokens, unigram_entropy};

    /// Held-out cross-entropy (nats/token) of an interpolated bigram model fitted on `train`.
    fn bigram_cross_entropy(train: &[u32], held_out: &[u32]) -> f64 {
        let mut uni: HashMap<u32, f64> = HashMap::new();
        let mut bi: HashMap<(u32, u32), f64> = HashMap::new();
        for w in train.windows(2) {
            *uni.entry(w[0]).or_default() += 1.0;
            *bi.entry((w[0], w[1])).or_default() += 1.0;
        }
        let n = (train.len() - 1) as f64;
        let vocab = 4096.0;
        let total: f64 = held_out
            .windows(2)
            .map(|w| {
                let p_uni = (uni.get(&w[1]).copied().unwrap_or(0.0) + 1.0) / (n + vocab);
                let p_bi = match uni.get(&w[0]) {
                    Some(c) => bi.get(&(w[0], w[1])).copied().unwrap_or(0.0) / c,
                    None => 0.0,
                };
                -(0.9 * p_bi + 0.1 * p_uni).ln()
            })
            .sum();
        total / (held_out.len() - 1) as f64
    }

    #[test]
    fn the_corpus_is_learnable_from_context() {
        // Even a bigram model beats the unigram entropy by a wide margin on held-out data;
        // a transformer with 256 tokens of context does much better.
        let dir = crate::files::test_util::TempDir::new("learn");
        let tok = Tokenizer::embedded_in(&dir.0).unwrap();
        let (mut unigram, mut bigram) = (0.0, 0.0);
        for (name, weight) in [("textbook", 0.45), ("facts", 0.25), ("arithmetic", 0.20), ("mcq", 0.10)] {
            let train = embedded_source_tokens_in(None, &tok, name, 0, Split::Train, 200_000).unwrap();
            let val = embedded_source_tokens_in(None, &tok, name, 0, Split::Validation, 20_000).unwrap();
            let (u, b) = (unigram_entropy(&train), bigram_cross_entropy(&train, &val));
            eprintln!("{name}: unigram entropy {u:.3}, held-out bigram cross-entropy {b:.3} nats");
            unigram += weight * u;
            bigram += weight * b;
        }
        eprintln!("weighted: unigram {unigram:.3}, bigram {bigram:.3} nats");
        assert!(bigram < unigram - 1.5, "bigram {bigram:.3} vs unigram {unigram:.3}");
    }

    fn big_prefix(tok: &Tokenizer, source: &str, n: usize) -> Vec<u32> {
        embedded_source_tokens_in(None, tok, source, 0, Split::Train, n).unwrap()
    }

    #[test]
    fn embedded_tokens_cache_and_report() {
        let dir = crate::files::test_util::TempDir::new("mix");
        let tok = Tokenizer::embedded_in(&dir.0.join("cache")).unwrap();
        let mut sources = Vec::new();
        for (name, weight) in [("textbook", 0.45), ("facts", 0.25), ("arithmetic", 0.20), ("mcq", 0.10)] {
            let start = Instant::now();
            let docs = corpus::documents(name, 0, Split::Train, 1 << 20).unwrap();
            let gen_s = start.elapsed().as_secs_f64();
            let tokens = embedded_source_tokens_in(None, &tok, name, 0, Split::Train, 100_000).unwrap();
            assert!(tokens.len() >= 100_000 && tokens.last() == Some(&0));
            let per_mb = tok.encode_batch(&docs).iter().map(Vec::len).sum::<usize>() as f64;
            eprintln!(
                "{name}: 1 MB generated in {gen_s:.3}s, {per_mb:.0} tokens/MB, unigram entropy {:.3} nats",
                unigram_entropy(&tokens)
            );
            // A longer request extends the same stream.
            let shorter = embedded_source_tokens_in(None, &tok, name, 0, Split::Train, 50_000).unwrap();
            assert_eq!(shorter[..], tokens[..shorter.len()]);
            sources.push(SourceTokens { name: name.into(), weight, tokens: tokens.into() });
        }
        let mix = Mix::new(sources, 256, 0).unwrap();
        eprintln!("mixed unigram entropy {:.3} nats", mix.unigram_entropy().unwrap());

        // The tiny-local run's textbook share, through the on-disk cache.
        let cache = dir.0.join("cache");
        let start = Instant::now();
        let big = embedded_source_tokens_in(Some(&cache), &tok, "textbook", 0, Split::Train, 450_000).unwrap();
        eprintln!("450K textbook tokens made in {:.2?}", start.elapsed());
        // A valid cache file is used as is; a corrupt one is replaced.
        let path = tokens_cache_path(&cache, &tok, "arithmetic", 0, Split::Train, 1000);
        let fake: Vec<u32> = [vec![9; 1000], vec![0]].concat();
        crate::files::write_atomic(&path, &encode_tokens(&fake)).unwrap();
        assert_eq!(embedded_source_tokens_in(Some(&cache), &tok, "arithmetic", 0, Split::Train, 1000).unwrap(), fake);
        std::fs::write(&path, b"TRTOKv01 truncated").unwrap();
        let fresh = embedded_source_tokens_in(Some(&cache), &tok, "arithmetic", 0, Split::Train, 1000).unwrap();
        assert_eq!(fresh[..], big_prefix(&tok, "arithmetic", fresh.len())[..]);
        assert!(big.len() >= 450_000);

        let tokens = vec![5u32, 6, 7, 0];
        let path = dir.0.join("t.bin");
        std::fs::write(&path, encode_tokens(&tokens)).unwrap();
        assert_eq!(read_tokens(&path), Some(tokens.clone()));
        let mut bytes = encode_tokens(&tokens);
        *bytes.last_mut().unwrap() ^= 1;
        std::fs::write(&path, bytes).unwrap();
        assert_eq!(read_tokens(&path), None);
    }
}
