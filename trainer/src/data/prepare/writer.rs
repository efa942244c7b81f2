//! The shards `trainer prepare` writes, and which documents it holds out for validation.

use std::path::Path;

use crate::Error;
use crate::data::shard::{self, Dtype, ShardEntry};
use crate::data::tokenizer::Tokenizer;

/// Appends documents to fixed-size shards `<prefix>-NNNNN.bin`.
pub(super) struct ShardWriter<'a> {
    dir: &'a Path,
    prefix: String,
    shard_tokens: usize,
    buf: Vec<u32>,
    entries: Vec<ShardEntry>,
    dtype: Dtype,
    eos: u32,
    hash: String,
}

impl<'a> ShardWriter<'a> {
    /// A writer of `<prefix>-NNNNN.bin` shards of `shard_tokens` tokens each in `dir`.
    pub(super) fn new(
        dir: &'a Path,
        prefix: String,
        shard_tokens: usize,
        dtype: Dtype,
        tok: &Tokenizer,
    ) -> ShardWriter<'a> {
        ShardWriter {
            dir,
            prefix,
            shard_tokens,
            buf: Vec::new(),
            entries: Vec::new(),
            dtype,
            eos: tok.eos_id(),
            hash: tok.hash(),
        }
    }

    pub(super) fn push(&mut self, ids: &[u32]) -> Result<(), Error> {
        self.buf.extend_from_slice(ids);
        self.buf.push(self.eos);
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

    /// The names of the shards written so far.
    pub(super) fn written(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|e| e.file.as_str())
    }

    pub(super) fn finish(mut self) -> Result<Vec<ShardEntry>, Error> {
        if !self.buf.is_empty() {
            let last = std::mem::take(&mut self.buf);
            self.flush(&last)?;
        }
        Ok(self.entries)
    }
}

/// Whether document `i` (of a file whose split seed is `seed`) is held out: a seeded hash
/// below the fraction.
pub(super) fn held_out(seed: u64, i: u64, fraction: f64) -> bool {
    let h = crate::rng::splitmix64(crate::rng::splitmix64(seed ^ 0x7661_6c69_6461_7465) ^ i);
    (h as f64 / u64::MAX as f64) < fraction
}
