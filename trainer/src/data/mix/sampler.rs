//! The sampler: the deterministic weighted mix of token sources ([`Mix`]), a pure
//! function of the global sample index, cut into samples and batches.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::permutation::permute;
use super::tokens::{SourceTokens, Tokens};
use crate::Error;
use crate::rng::splitmix64;

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
/// The mix is a pure function of the global sample index: sample `i` comes from the
/// source chosen by Megatron's BlendedDataset greedy rule and, within that source, from
/// a seeded per-epoch permutation of its non-overlapping windows. Resuming at global
/// sample `N` is therefore exact and needs only `N` (no replay of the data).
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::time::Instant;

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
    fn mix_entropy() {
        let mix = Mix::new(vec![synthetic("a", 0.5, 90, 0), synthetic("b", 0.5, 90, 0)], 8, 0).unwrap();
        assert!((mix.unigram_entropy().unwrap() - 90f64.ln()).abs() < 1e-9);
    }
}
