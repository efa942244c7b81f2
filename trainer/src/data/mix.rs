//! Token streams and the deterministic weighted mix.
//!
//! The mix is a pure function of the global sample index: sample `i` comes from the
//! source chosen by Megatron's BlendedDataset greedy rule and, within that source, from
//! a seeded per-epoch permutation of its non-overlapping windows. Resuming at global
//! sample `N` is therefore exact and needs only `N` (no replay of the data).

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use sha2::{Digest, Sha256};

use super::corpus::{self, CORPUS_VERSION, Split};
use super::remote::RemoteShards;
use super::shard::ShardSet;
use super::tokenizer::Tokenizer;
use crate::Error;
use crate::rng::splitmix64;

/// Generating and tokenizing a stream for longer than this caches it on disk.
const CACHE_IF_SLOWER_THAN_S: f64 = 1.0;

/// Documents are tokenized in batches of about this many bytes (one `encode_batch` each).
const ENCODE_BATCH_BYTES: usize = 1 << 20;

/// Tokens of the embedded `source` (`split`, document seed `seed`): its documents
/// tokenized and concatenated, each followed by EOS, stopping at the first document end
/// at or after `n_tokens_min` tokens. A longer request extends the same stream. Streams
/// that take more than a second to make are cached under [`super::cache_dir`].
pub fn embedded_source_tokens(
    tok: &Tokenizer,
    source: &str,
    seed: u64,
    split: Split,
    n_tokens_min: usize,
) -> Result<Vec<u32>, Error> {
    embedded_source_tokens_in(Some(&super::cache_dir()), tok, source, seed, split, n_tokens_min)
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

/// Entropy, in nats per token, of the unigram distribution of `tokens` (0 when empty):
/// the loss of a model that ignores context, which a trained model must beat.
pub fn unigram_entropy(tokens: &[u32]) -> f64 {
    let mut counts: HashMap<u32, u64> = HashMap::new();
    for t in tokens {
        *counts.entry(*t).or_default() += 1;
    }
    let n = tokens.len() as f64;
    -counts.values().map(|&c| (c as f64 / n) * (c as f64 / n).ln()).sum::<f64>()
}

/// One source of a mix: its tokens and its weight.
#[derive(Clone, Debug)]
pub struct SourceTokens {
    /// The mix entry's name, for logs and per-source losses.
    pub name: String,
    /// Positive; the mix normalises the weights to sum to 1.
    pub weight: f64,
    pub tokens: Tokens,
}

/// A source's token stream: one block in memory, memory-mapped local shards, or
/// shards in S3 behind a bounded cache. Samples never cross a block (shard) boundary.
#[derive(Clone, Debug)]
pub enum Tokens {
    Memory(Arc<[u32]>),
    Shards(Arc<ShardSet>),
    Remote(Arc<RemoteShards>),
}

impl From<Vec<u32>> for Tokens {
    fn from(v: Vec<u32>) -> Tokens {
        Tokens::Memory(v.into())
    }
}

impl Tokens {
    /// Token count of each block.
    pub fn blocks(&self) -> Vec<u64> {
        match self {
            Tokens::Memory(t) => vec![t.len() as u64],
            Tokens::Shards(s) => s.shards.iter().map(|s| s.len()).collect(),
            Tokens::Remote(r) => r.entries().iter().map(|e| e.tokens).collect(),
        }
    }

    pub fn len(&self) -> u64 {
        self.blocks().iter().sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tokens `start..start + len` of block `b` (fetching a remote shard if needed).
    pub fn slice(&self, b: usize, start: u64, len: usize) -> Result<Cow<'_, [u32]>, Error> {
        Ok(match self {
            Tokens::Memory(t) => Cow::Borrowed(&t[start as usize..start as usize + len]),
            Tokens::Shards(s) => s.shards[b].tokens(start, len),
            Tokens::Remote(r) => Cow::Owned(r.shard(b)?.tokens(start, len).into_owned()),
        })
    }
}

/// Row-major `[n, seq_len]` inputs and targets, and each sample's source index.
pub type Batch = (Vec<i64>, Vec<i64>, Vec<usize>);

/// The blocks (shards) of a source in one epoch's reading order, with the first window
/// of each in that order.
struct BlockOrder {
    blocks: Vec<usize>,
    starts: Vec<u64>,
}

/// The deterministic weighted mix of token sources, cut into samples of
/// `seq_len + 1` tokens (inputs and targets shifted by one).
///
/// Sample indices are global: sample `i` is the same on every rank and at every
/// resume. Data-parallel ranks take disjoint slices of each global batch (rank `r` of
/// `w`, micro-batch `m` of `n`: `first_sample = step * global + (m * w + r) * n`, or any
/// other partition the trainer fixes), so nothing here depends on the rank.
pub struct Mix {
    sources: Vec<SourceTokens>,
    weights: Vec<f64>,
    n_windows: Vec<u64>,
    /// Per source, the first window of each block (prefix sums of the blocks' windows).
    block_windows: Vec<Vec<u64>>,
    /// Per source, the windows of each block.
    block_counts: Vec<Vec<u64>>,
    /// (source, epoch) → the blocks in that epoch's reading order, with prefix sums.
    orders: Mutex<HashMap<(usize, u64), Arc<BlockOrder>>>,
    seq_len: usize,
    seed: u64,
    shuffle: bool,
    /// `snapshots[j]`: how many samples each source gave before global sample `j * SNAPSHOT_EVERY`.
    snapshots: Mutex<Vec<Vec<u64>>>,
}

impl std::fmt::Debug for Mix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.sources.iter().map(|s| s.name.as_str()).collect();
        f.debug_struct("Mix")
            .field("sources", &names)
            .field("weights", &self.weights)
            .field("windows", &self.n_windows)
            .field("seq_len", &self.seq_len)
            .field("shuffle", &self.shuffle)
            .finish()
    }
}

/// Spacing of the blend snapshots; locating sample `i` replays at most this many steps.
const SNAPSHOT_EVERY: u64 = 4096;

impl Mix {
    /// A training mix: windows are drawn in a fresh seeded order every epoch of each
    /// source (seed from `seed` and the source's index).
    pub fn new(sources: Vec<SourceTokens>, seq_len: usize, seed: u64) -> Result<Mix, Error> {
        Self::build(sources, seq_len, seed, true)
    }

    /// A validation mix: the same blend, but each source's windows in order.
    pub fn validation(sources: Vec<SourceTokens>, seq_len: usize) -> Result<Mix, Error> {
        Self::build(sources, seq_len, 0, false)
    }

    fn build(sources: Vec<SourceTokens>, seq_len: usize, seed: u64, shuffle: bool) -> Result<Mix, Error> {
        let bad = |name: &str, message: String| Error::Data { name: name.to_string(), message };
        if sources.is_empty() {
            return Err(bad("mix", "has no sources".into()));
        }
        if seq_len == 0 {
            return Err(bad("mix", "sequence length must be at least 1".into()));
        }
        for s in &sources {
            if !(s.weight.is_finite() && s.weight > 0.0) {
                return Err(bad(&s.name, format!("weight {} must be a positive number", s.weight)));
            }
        }
        let mut block_windows = Vec::new();
        let mut block_counts = Vec::new();
        let mut n_windows = Vec::new();
        for s in &sources {
            let mut starts = vec![0u64];
            let counts: Vec<u64> = s.tokens.blocks().iter().map(|b| b / (seq_len as u64 + 1)).collect();
            for c in &counts {
                starts.push(starts.last().expect("non-empty") + c);
            }
            block_counts.push(counts);
            let n = *starts.last().expect("non-empty");
            if n == 0 {
                return Err(bad(
                    &s.name,
                    format!(
                        "has {} tokens, fewer than one sample of {} tokens (in one shard)",
                        s.tokens.len(),
                        seq_len + 1
                    ),
                ));
            }
            starts.pop();
            block_windows.push(starts);
            n_windows.push(n);
        }
        let total: f64 = sources.iter().map(|s| s.weight).sum();
        let weights = sources.iter().map(|s| s.weight / total).collect();
        let snapshots = Mutex::new(vec![vec![0; sources.len()]]);
        let orders = Mutex::new(HashMap::new());
        Ok(Mix { sources, weights, n_windows, block_windows, block_counts, orders, seq_len, seed, shuffle, snapshots })
    }

    /// The sources, in the order their indices refer to.
    pub fn sources(&self) -> &[SourceTokens] {
        &self.sources
    }

    /// Tokens per sample fed to the model (a sample holds one more, for the targets).
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }

    /// Number of distinct samples (non-overlapping windows) of each source.
    pub fn windows(&self) -> &[u64] {
        &self.n_windows
    }

    /// Samples each source contributes to global samples `0..i`.
    pub fn counts_at(&self, i: u64) -> Vec<u64> {
        let j = (i / SNAPSHOT_EVERY) as usize;
        let mut snaps = self.snapshots.lock().unwrap_or_else(|p| p.into_inner());
        while snaps.len() <= j {
            let mut c = snaps.last().expect("snapshot 0 exists").clone();
            let from = (snaps.len() as u64 - 1) * SNAPSHOT_EVERY;
            for k in from..from + SNAPSHOT_EVERY {
                let s = self.choose(k, &c);
                c[s] += 1;
            }
            snaps.push(c);
        }
        let mut c = snaps[j].clone();
        drop(snaps);
        for k in j as u64 * SNAPSHOT_EVERY..i {
            let s = self.choose(k, &c);
            c[s] += 1;
        }
        c
    }

    /// Megatron's greedy blend: the source furthest behind its share after sample `i`.
    fn choose(&self, i: u64, counts: &[u64]) -> usize {
        let mut best = 0;
        let mut best_err = f64::NEG_INFINITY;
        for (s, (w, c)) in self.weights.iter().zip(counts).enumerate() {
            let err = w * (i + 1) as f64 - *c as f64;
            if err > best_err {
                best = s;
                best_err = err;
            }
        }
        best
    }

    /// Source `s`'s `k`-th draw as (block, window within the block).
    ///
    /// One block (in memory): a seeded permutation of all windows per epoch. Several
    /// blocks (shards): each epoch reads the shards in a seeded order and each shard's
    /// windows in a seeded order, so a reader needs about one shard of each source at a
    /// time, which keeps a bounded cache of remote shards useful.
    fn window(&self, s: usize, k: u64) -> (usize, u64) {
        let n = self.n_windows[s];
        let (epoch, j) = (k / n, k % n);
        let locate = |starts: &[u64], j: u64| starts.partition_point(|&first| first <= j) - 1;
        if !self.shuffle {
            let b = locate(&self.block_windows[s], j);
            return (b, j - self.block_windows[s][b]);
        }
        let key = splitmix64(splitmix64(self.seed ^ splitmix64(s as u64)) ^ epoch);
        let counts = &self.block_counts[s];
        if counts.len() == 1 {
            return (0, permute(j, n, key));
        }
        let order = self.order(s, epoch, key);
        let (blocks, starts) = (&order.blocks, &order.starts);
        let p = locate(starts, j);
        let b = blocks[p];
        let local = j - starts[p];
        if local == 0
            && let (Tokens::Remote(r), Some(&next)) = (&self.sources[s].tokens, blocks.get(p + 1))
        {
            r.prefetch(next);
        }
        (b, permute(local, counts[b], splitmix64(key ^ splitmix64(b as u64 + 1))))
    }

    /// The blocks of source `s` in the reading order of `epoch`, with prefix sums.
    fn order(&self, s: usize, epoch: u64, key: u64) -> Arc<BlockOrder> {
        let mut orders = self.orders.lock().unwrap_or_else(|p| p.into_inner());
        if orders.len() > 64 {
            orders.clear();
        }
        orders
            .entry((s, epoch))
            .or_insert_with(|| {
                let counts = &self.block_counts[s];
                let n = counts.len() as u64;
                let blocks: Vec<usize> =
                    (0..n).map(|i| permute(i, n, splitmix64(key ^ 0x5348_4152_4453)) as usize).collect();
                let mut starts = Vec::with_capacity(blocks.len());
                let mut total = 0;
                for &b in &blocks {
                    starts.push(total);
                    total += counts[b];
                }
                Arc::new(BlockOrder { blocks, starts })
            })
            .clone()
    }

    fn window_tokens(&self, s: usize, (b, w): (usize, u64)) -> Result<Cow<'_, [u32]>, Error> {
        let len = self.seq_len + 1;
        self.sources[s].tokens.slice(b, w * len as u64, len)
    }

    /// Which epoch of source `s` its `k`-th draw belongs to (0-based).
    pub fn epoch_of(&self, s: usize, k: u64) -> u64 {
        k / self.n_windows[s]
    }

    /// Global sample `i`: its source index and its `seq_len + 1` tokens.
    pub fn sample(&self, i: u64) -> Result<(usize, Cow<'_, [u32]>), Error> {
        let counts = self.counts_at(i);
        let s = self.choose(i, &counts);
        Ok((s, self.window_tokens(s, self.window(s, counts[s]))?))
    }

    /// Global samples `first_sample..first_sample + n` as row-major `[n, seq_len]` inputs
    /// and targets (inputs shifted by one), with the source index of each sample.
    pub fn batch(&self, first_sample: u64, n: usize) -> Result<Batch, Error> {
        let mut counts = self.counts_at(first_sample);
        let mut inputs = Vec::with_capacity(n * self.seq_len);
        let mut targets = Vec::with_capacity(n * self.seq_len);
        let mut which = Vec::with_capacity(n);
        for i in first_sample..first_sample + n as u64 {
            let s = self.choose(i, &counts);
            let w = self.window_tokens(s, self.window(s, counts[s]))?;
            counts[s] += 1;
            inputs.extend(w[..self.seq_len].iter().map(|&t| t as i64));
            targets.extend(w[1..].iter().map(|&t| t as i64));
            which.push(s);
        }
        Ok((inputs, targets, which))
    }

    /// [`Mix::batch`] as `[n, seq_len]` int64 CPU tensors.
    pub fn batch_tensors(&self, first_sample: u64, n: usize) -> Result<(tch::Tensor, tch::Tensor, Vec<usize>), Error> {
        let (x, y, which) = self.batch(first_sample, n)?;
        let shape = [n as i64, self.seq_len as i64];
        Ok((tch::Tensor::f_from_slice(&x)?.f_view(shape)?, tch::Tensor::f_from_slice(&y)?.f_view(shape)?, which))
    }

    /// Unigram entropy (nats/token) of the mixed stream: of the weighted mixture of the
    /// sources' token distributions, from up to the first 4M tokens of each source.
    pub fn unigram_entropy(&self) -> Result<f64, Error> {
        const SAMPLE: u64 = 4 << 20;
        let mut p: HashMap<u32, f64> = HashMap::new();
        for (s, w) in self.sources.iter().zip(&self.weights) {
            let mut seen = Vec::new();
            for (b, len) in s.tokens.blocks().into_iter().enumerate() {
                let take = len.min(SAMPLE - seen.len() as u64) as usize;
                seen.extend_from_slice(&s.tokens.slice(b, 0, take)?);
                if seen.len() as u64 >= SAMPLE {
                    break;
                }
            }
            let share = w / seen.len() as f64;
            for t in seen {
                *p.entry(t).or_default() += share;
            }
        }
        Ok(-p.values().map(|q| q * q.ln()).sum::<f64>())
    }
}

/// A keyed pseudo-random permutation of `0..n` evaluated at `j` in O(1): a balanced
/// four-round Feistel network on the smallest even-bit power of two ≥ n, cycle-walked
/// back into range (at most 4 expected rounds trips).
pub(crate) fn permute(j: u64, n: u64, key: u64) -> u64 {
    debug_assert!(j < n);
    let bits = (64 - (n - 1).leading_zeros()).max(2).div_ceil(2);
    let mask = (1u64 << bits) - 1;
    let mut x = j;
    loop {
        let (mut l, mut r) = (x >> bits, x & mask);
        for round in 0..4u64 {
            let f = splitmix64(key ^ splitmix64(round ^ (r << 8))) & mask;
            (l, r) = (r, l ^ f);
        }
        x = (l << bits) | r;
        if x < n {
            return x;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn synthetic(name: &str, weight: f64, len: usize, base: u32) -> SourceTokens {
        SourceTokens { name: name.into(), weight, tokens: (0..len as u32).map(|t| base + t).collect::<Vec<_>>().into() }
    }

    fn four() -> Vec<SourceTokens> {
        vec![
            synthetic("textbook", 0.45, 9 * 1000, 0),
            synthetic("facts", 0.25, 9 * 300, 100_000),
            synthetic("arithmetic", 0.20, 9 * 77, 200_000),
            synthetic("mcq", 0.10, 9 * 5, 300_000),
        ]
    }

    #[test]
    fn permutation_is_a_bijection_and_changes_per_key() {
        for n in [1u64, 2, 3, 5, 16, 17, 100, 1000, 4097] {
            let p: Vec<u64> = (0..n).map(|j| permute(j, n, 42)).collect();
            let set: BTreeSet<u64> = p.iter().copied().collect();
            assert_eq!(set.len() as u64, n);
            assert!(p.iter().all(|&x| x < n));
            if n >= 16 {
                let q: Vec<u64> = (0..n).map(|j| permute(j, n, 43)).collect();
                assert_ne!(p, q, "n = {n}");
                assert_ne!(p, (0..n).collect::<Vec<_>>(), "n = {n}");
            }
        }
    }

    #[test]
    fn proportions_track_weights_at_every_prefix() {
        let mix = Mix::new(four(), 8, 1).unwrap();
        let (_, _, which) = mix.batch(0, 100_000).unwrap();
        let mut counts = [0f64; 4];
        let mut worst = 0f64;
        for (n, s) in which.iter().enumerate() {
            counts[*s] += 1.0;
            let n = (n + 1) as f64;
            for (c, w) in counts.iter().zip([0.45, 0.25, 0.20, 0.10]) {
                worst = worst.max((c / n - w).abs() * n);
            }
        }
        // The greedy rule keeps every count within one sample of its share.
        assert!(worst <= 1.0, "worst deviation {worst} samples");
        assert_eq!(mix.counts_at(100_000), counts.map(|c| c as u64).to_vec());
    }

    #[test]
    fn batch_at_any_position_equals_iteration() {
        let mix = Mix::new(four(), 8, 7).unwrap();
        let (x, y, which) = mix.batch(0, 30_000).unwrap();
        for first in [0u64, 1, 4095, 4096, 4097, 12_345, 29_990] {
            let fresh = Mix::new(four(), 8, 7).unwrap();
            let (bx, by, bw) = fresh.batch(first, 10).unwrap();
            let r = first as usize * 8..(first as usize + 10) * 8;
            assert_eq!(
                (&bx[..], &by[..], &bw[..]),
                (&x[r.clone()], &y[r], &which[first as usize..first as usize + 10])
            );
            let (s, toks) = fresh.sample(first).unwrap();
            assert_eq!(s, which[first as usize]);
            assert_eq!(toks[..8].iter().map(|&t| t as i64).collect::<Vec<_>>(), x[first as usize * 8..][..8]);
        }
        // Targets are the inputs shifted by one within each window.
        assert_eq!(x[1..8], y[..7]);
    }

    #[test]
    fn resuming_far_into_the_stream_is_cheap_and_consistent() {
        let n = 10_000_000u64;
        let start = Instant::now();
        let far = Mix::new(four(), 8, 5).unwrap();
        let at_n = far.batch(n, 4).unwrap();
        eprintln!("positioned at sample {n} in {:.2?}", start.elapsed());
        let counts = far.counts_at(n);
        assert_eq!(counts.iter().sum::<u64>(), n);
        for (c, w) in counts.iter().zip([0.45, 0.25, 0.20, 0.10]) {
            assert!((*c as f64 - w * n as f64).abs() <= 1.0, "{counts:?}");
        }
        // Reached from a nearby position of another instance: the same samples.
        let near = Mix::new(four(), 8, 5).unwrap();
        let (x, y, which) = near.batch(n - 3, 7).unwrap();
        assert_eq!((x[24..].to_vec(), y[24..].to_vec(), which[3..].to_vec()), at_n);
    }

    #[test]
    fn each_epoch_visits_every_window_once_in_a_new_order() {
        let mix = Mix::new(four(), 8, 3).unwrap();
        let n = mix.windows()[3] as usize; // mcq: 5 windows, 10% of samples
        let (x, _, which) = mix.batch(0, 200).unwrap();
        let firsts: Vec<i64> = which.iter().enumerate().filter(|(_, s)| **s == 3).map(|(i, _)| x[i * 8]).collect();
        let epochs: Vec<BTreeSet<i64>> = firsts.chunks(n).take(3).map(|c| c.iter().copied().collect()).collect();
        for e in &epochs {
            assert_eq!(e.len(), n);
            assert_eq!(e, &epochs[0]);
        }
        // With seed-dependent orders, two seeds give different streams.
        let other = Mix::new(four(), 8, 4).unwrap();
        assert_ne!(other.batch(0, 200).unwrap().0, x);
        // Validation reads windows in order.
        let val = Mix::validation(four(), 8).unwrap();
        let (vx, _, vw) = val.batch(0, 50).unwrap();
        let textbook: Vec<i64> = vw.iter().enumerate().filter(|(_, s)| **s == 0).map(|(i, _)| vx[i * 8]).collect();
        assert_eq!(textbook, (0..textbook.len() as i64).map(|k| k * 9).collect::<Vec<_>>());
    }

    #[test]
    fn sharded_sources_never_cut_a_sample_across_shards_and_visit_every_window() {
        use crate::data::shard::{self, Dtype, Manifest, ManifestTokenizer, ShardEntry, ShardSet};
        let dir = crate::files::test_util::TempDir::new("mix-shards");
        // Three shards of 100, 45 and 81 tokens; token value = global position.
        let mut entries = Vec::new();
        let mut start = 0u32;
        for (i, len) in [100u32, 45, 81].into_iter().enumerate() {
            let toks: Vec<u32> = (start..start + len).collect();
            let file = format!("train-{i:05}.bin");
            let h = shard::write(&dir.0.join(&file), &toks, Dtype::U16, 0, "h").unwrap();
            entries.push(ShardEntry { file, tokens: h.tokens, documents: h.documents, crc32: h.crc32 });
            start += len;
        }
        let manifest = Manifest {
            format: shard::MANIFEST_FORMAT.into(),
            version: shard::VERSION,
            name: "s".into(),
            tokenizer: ManifestTokenizer { hash: "h".into(), vocab_size: 1000, eos_id: 0, file: None },
            dtype: Dtype::U16,
            train: entries.clone(),
            validation: vec![],
            records: None,
            input: serde_json::Value::Null,
        };
        let set = ShardSet::open(&dir.0, &entries, &manifest).unwrap();
        let src = SourceTokens { name: "s".into(), weight: 1.0, tokens: Tokens::Shards(Arc::new(set)) };
        // Windows of 9 tokens: 11 + 5 + 9 = 25 (a plain concatenation would give 25 too,
        // but with windows straddling the 100 and 145 boundaries).
        let mix = Mix::new(vec![src], 8, 1).unwrap();
        assert_eq!(mix.windows(), &[25]);
        let (x, y, _) = mix.batch(0, 50).unwrap();
        let mut firsts = BTreeSet::new();
        for (i, row) in x.chunks(8).enumerate() {
            let first = row[0];
            // Contiguous, and inside one shard.
            assert!(row.iter().zip(&row[1..]).all(|(a, b)| b - a == 1), "{row:?}");
            assert_eq!(y[i * 8 + 7], first + 8);
            let shard_of = |t: i64| [100, 145, 226].iter().position(|&end| t < end).unwrap();
            assert_eq!(shard_of(first), shard_of(first + 8), "sample {i} crosses a shard: {first}..{}", first + 8);
            if i < 25 {
                firsts.insert(first);
            }
        }
        assert_eq!(firsts.len(), 25, "the first epoch visits every window once");
        assert_eq!(mix.epoch_of(0, 24), 0);
        assert_eq!(mix.epoch_of(0, 25), 1);
    }

    #[test]
    fn rejects_bad_sources() {
        let e = Mix::new(vec![synthetic("tiny", 1.0, 5, 0)], 8, 0).unwrap_err().to_string();
        assert!(e.contains("tiny"), "{e}");
        let e = Mix::new(vec![synthetic("zero", 0.0, 100, 0)], 8, 0).unwrap_err().to_string();
        assert!(e.contains("zero"), "{e}");
    }

    #[test]
    fn entropy() {
        assert_eq!(unigram_entropy(&[]), 0.0);
        assert!((unigram_entropy(&[1, 2, 3, 4]) - 4f64.ln()).abs() < 1e-12);
        let mix = Mix::new(vec![synthetic("a", 0.5, 90, 0), synthetic("b", 0.5, 90, 0)], 8, 0).unwrap();
        assert!((mix.unigram_entropy().unwrap() - 90f64.ln()).abs() < 1e-9);
    }

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
