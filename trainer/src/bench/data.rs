//! `trainer bench-data`: how fast one core serves training batches from mmap shards
//! through the weighted mix (the loader thread's work), against the target of 50M
//! tokens/s per core, and against a plain sequential copy of the same bytes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};

use crate::Error;
use crate::data::mix::{Mix, SourceTokens, Tokens};
use crate::data::shard::{self, Dtype, MANIFEST_FORMAT, Manifest, ManifestTokenizer, ShardEntry, ShardSet};

#[derive(Clone, Debug)]
pub struct DataBenchOptions {
    /// Prepared source directories; none: synthetic shards in a temporary directory.
    pub data: Vec<PathBuf>,
    pub seq: usize,
    pub micro_batch: usize,
    pub batches: usize,
    /// Synthetic tokens per source.
    pub synthetic_tokens: u64,
}

/// Four synthetic u16 sources (45/25/20/10) in `dir`, shards of 16M tokens.
fn synthetic(dir: &Path, tokens: u64) -> Result<Vec<PathBuf>, Error> {
    let mut dirs = Vec::new();
    for (i, name) in ["web", "textbooks", "pdfs", "mcq"].iter().enumerate() {
        let d = dir.join(name);
        let mut entries = Vec::new();
        let mut left = tokens;
        let mut x = 0x1234_5678_u64 ^ i as u64;
        while left > 0 {
            let n = left.min(16 << 20);
            let toks: Vec<u32> = (0..n)
                .map(|_| {
                    x = crate::rng::splitmix64(x);
                    (x % 50_000) as u32 + 1
                })
                .collect();
            let file = format!("train-{:05}.bin", entries.len());
            let h = shard::write(&d.join(&file), &toks, Dtype::U16, 0, "synthetic")?;
            entries.push(ShardEntry { file, tokens: h.tokens, documents: h.documents, crc32: h.crc32 });
            left -= n;
        }
        Manifest {
            format: MANIFEST_FORMAT.into(),
            version: shard::VERSION,
            name: name.to_string(),
            tokenizer: ManifestTokenizer { hash: "synthetic".into(), vocab_size: 50_001, eos_id: 0, file: None },
            dtype: Dtype::U16,
            train: entries,
            validation: vec![],
            records: None,
            input: Value::Null,
        }
        .write(&d)?;
        dirs.push(d);
    }
    Ok(dirs)
}

pub fn run(o: &DataBenchOptions) -> Result<Value, Error> {
    let scratch = std::env::temp_dir().join(format!("trainer-bench-data-{}", std::process::id()));
    let dirs = if o.data.is_empty() { synthetic(&scratch, o.synthetic_tokens)? } else { o.data.clone() };
    let weights = [0.45, 0.25, 0.20, 0.10];
    let mut sources = Vec::new();
    let mut bytes = 0u64;
    for (i, d) in dirs.iter().enumerate() {
        let m = Manifest::read(d)?;
        let set = ShardSet::open(d, &m.train, &m)?;
        bytes += Manifest::tokens(&m.train) * m.dtype.bytes() as u64;
        let weight = if o.data.is_empty() { weights[i] } else { 1.0 };
        sources.push(SourceTokens { name: m.name, weight, tokens: Tokens::Shards(Arc::new(set)) });
    }
    let mix = Mix::new(sources, o.seq, 1)?;
    // Warm the page cache, as a long run has.
    let _ = mix.batch(0, o.micro_batch)?;
    let tokens = (o.batches * o.micro_batch * o.seq) as f64;

    let start = Instant::now();
    let mut check = 0i64;
    for b in 0..o.batches {
        let (x, _, _) = mix.batch((b * o.micro_batch) as u64, o.micro_batch)?;
        check = check.wrapping_add(x[0]);
    }
    let vecs = tokens / start.elapsed().as_secs_f64();

    let start = Instant::now();
    for b in 0..o.batches {
        let (x, _, _) = mix.batch_tensors((b * o.micro_batch) as u64, o.micro_batch)?;
        check = check.wrapping_add(x.int64_value(&[0, 0]));
    }
    let tensors = tokens / start.elapsed().as_secs_f64();

    // The floor: converting the same number of u16 tokens to i64 in one sequential pass.
    let first = mix.sources()[0]
        .tokens
        .slice(0, 0, (tokens as usize).min(mix.sources()[0].tokens.blocks()[0] as usize))?
        .into_owned();
    let start = Instant::now();
    let widened: Vec<i64> = first.iter().map(|&t| t as i64).collect();
    let copy = widened.len() as f64 / start.elapsed().as_secs_f64();
    check = check.wrapping_add(widened[widened.len() / 2]);

    let _ = std::fs::remove_dir_all(&scratch);
    eprintln!(
        "one core, seq {} × micro-batch {}, {} batches over {:.0} MB of shards: mix → i64 {:.1}M tokens/s, → tensors {:.1}M tokens/s \
         (target 50M; a plain sequential u16→i64 pass {:.1}M/s)",
        o.seq,
        o.micro_batch,
        o.batches,
        bytes as f64 / 1e6,
        vecs / 1e6,
        tensors / 1e6,
        copy / 1e6
    );
    Ok(json!({
        "seq": o.seq,
        "micro_batch": o.micro_batch,
        "batches": o.batches,
        "shard_bytes": bytes,
        "tokens_per_s_vec": vecs,
        "tokens_per_s_tensor": tensors,
        "tokens_per_s_sequential_copy": copy,
        "target_tokens_per_s": 50e6,
        "ratio_to_target": tensors / 50e6,
        "checksum": check,
    }))
}
