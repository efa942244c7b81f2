//! Shards of a source prepared to `s3://`: fetched on first use with parallel ranged
//! GETs into a bounded local cache (least recently used shards are evicted beyond
//! `TRAINER_S3_CACHE_BYTES`, default 8 GiB), verified like local shards, read through
//! mmap. The next shard in reading order is fetched in the background, so a pod never
//! holds the whole dataset and rarely waits for it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::shard::{HEADER_BYTES, Manifest, Shard, ShardEntry};
use crate::Error;
use crate::storage::{self, S3};

/// Default bound of the local shard cache.
pub const DEFAULT_CACHE_BYTES: u64 = 8 << 30;

/// Ranged GETs of this size, this many at once.
const CHUNK_BYTES: u64 = 16 << 20;

struct Cached {
    shard: Arc<Shard>,
    bytes: u64,
    used: Instant,
}

/// The shards of one split of an S3 source.
pub struct RemoteShards {
    s3: Arc<S3>,
    bucket: String,
    prefix: String,
    entries: Vec<ShardEntry>,
    tokenizer_hash: String,
    dtype_bytes: u64,
    dir: PathBuf,
    budget: u64,
    open: Mutex<HashMap<usize, Cached>>,
    /// One lock per shard, so a shard is fetched once even when asked for twice.
    fetching: Vec<Mutex<()>>,
}

impl std::fmt::Debug for RemoteShards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteShards")
            .field("uri", &storage::uri(&self.bucket, &self.prefix))
            .field("shards", &self.entries.len())
            .finish()
    }
}

impl RemoteShards {
    /// `entries` of the manifest at `s3://bucket/prefix`, cached under `cache_dir`.
    pub fn new(
        s3: Arc<S3>,
        bucket: &str,
        prefix: &str,
        manifest: &Manifest,
        entries: &[ShardEntry],
        cache_dir: &Path,
    ) -> Result<RemoteShards, Error> {
        let source = storage::uri(bucket, prefix);
        let dir = crate::files::under(&cache_dir.join("s3"), &format!("{bucket}/{prefix}"))
            .map_err(|message| Error::Data { name: source, message: format!("cannot be cached locally: {message}") })?;
        let budget =
            std::env::var("TRAINER_S3_CACHE_BYTES").ok().and_then(|v| v.parse().ok()).unwrap_or(DEFAULT_CACHE_BYTES);
        Ok(RemoteShards {
            s3,
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
            entries: entries.to_vec(),
            tokenizer_hash: manifest.tokenizer.hash.clone(),
            dtype_bytes: manifest.dtype.bytes() as u64,
            dir,
            budget,
            open: Mutex::new(HashMap::new()),
            fetching: entries.iter().map(|_| Mutex::new(())).collect(),
        })
    }

    pub fn entries(&self) -> &[ShardEntry] {
        &self.entries
    }

    /// Shard `b`, fetched and verified if it is not in the cache.
    pub fn shard(&self, b: usize) -> Result<Arc<Shard>, Error> {
        if let Some(c) = self.open.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&b) {
            c.used = Instant::now();
            return Ok(c.shard.clone());
        }
        let _one_fetch = self.fetching[b].lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = self.open.lock().unwrap_or_else(|p| p.into_inner()).get(&b) {
            return Ok(c.shard.clone());
        }
        let e = &self.entries[b];
        let path = self.dir.join(&e.file);
        let shard = match Shard::open(&path) {
            Ok(s) if s.header().crc32 == e.crc32 => s,
            _ => {
                self.fetch(e, &path)?;
                Shard::open(&path)?
            }
        };
        if shard.header().crc32 != e.crc32 || shard.header().tokenizer_hash != self.tokenizer_hash {
            return Err(Error::Data {
                name: storage::uri(&self.bucket, &storage::join(&self.prefix, &e.file)),
                message: "does not match its manifest (CRC or tokenizer)".into(),
            });
        }
        let shard = Arc::new(shard);
        let bytes = std::fs::metadata(&path).map_or(0, |m| m.len());
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.insert(b, Cached { shard: shard.clone(), bytes, used: Instant::now() });
        self.evict(&mut open, b);
        Ok(shard)
    }

    /// Fetches shard `b` on a background thread, if it is not cached yet.
    pub fn prefetch(self: &Arc<Self>, b: usize) {
        if b >= self.entries.len() || self.open.lock().unwrap_or_else(|p| p.into_inner()).contains_key(&b) {
            return;
        }
        let me = Arc::clone(self);
        let _ = std::thread::Builder::new().name("shard-prefetch".into()).spawn(move || {
            if let Err(e) = me.shard(b) {
                tracing::warn!("prefetching a shard failed (it will be fetched again when needed): {e}");
            }
        });
    }

    /// Drops the least recently used shards (never `keep`) until the cache fits its budget.
    fn evict(&self, open: &mut HashMap<usize, Cached>, keep: usize) {
        loop {
            let total: u64 = open.values().map(|c| c.bytes).sum();
            if total <= self.budget || open.len() <= 1 {
                return;
            }
            let Some((&old, _)) = open.iter().filter(|(b, _)| **b != keep).min_by_key(|(_, c)| c.used) else { return };
            open.remove(&old);
            let _ = std::fs::remove_file(self.dir.join(&self.entries[old].file));
        }
    }

    /// Downloads one shard with parallel ranged GETs into a temporary file, then renames it.
    fn fetch(&self, e: &ShardEntry, path: &Path) -> Result<(), Error> {
        let key = storage::join(&self.prefix, &e.file);
        let size = self.s3.size(&self.bucket, &key)?.ok_or_else(|| Error::Storage {
            uri: storage::uri(&self.bucket, &key),
            message: "listed in the manifest but missing from the bucket".into(),
            permanent: true,
        })?;
        // The manifest's token count fixes the shard's size: an object of another size is
        // refused before anything is allocated for it.
        let expected = e.tokens.saturating_mul(self.dtype_bytes).saturating_add(HEADER_BYTES as u64);
        if size != expected {
            return Err(Error::Data {
                name: storage::uri(&self.bucket, &key),
                message: format!(
                    "{size} bytes in the bucket, but its manifest entry ({} tokens) makes it {expected} bytes",
                    e.tokens
                ),
            });
        }
        let started = Instant::now();
        let bytes = self.s3.get_ranged_parallel(&self.bucket, &key, size, CHUNK_BYTES)?;
        crate::files::write_atomic(path, &bytes).map_err(crate::io_err(path))?;
        tracing::info!(
            shard = %storage::uri(&self.bucket, &key),
            mb = size as f64 / 1e6,
            seconds = started.elapsed().as_secs_f64(),
            "fetched a shard"
        );
        Ok(())
    }
}
