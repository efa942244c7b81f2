//! Training data: the embedded synthetic corpus ([`corpus`]), the tokenizer
//! ([`tokenizer`]), the deterministic, exactly resumable weighted mix ([`mix`]), a
//! run's sources ([`sources`]), and sources prepared by `trainer prepare`
//! ([`prepare`], [`shard`], [`remote`]).
//!
//! Derived artefacts (the embedded tokenizer, large token streams) are cached on disk
//! under [`cache_dir`], keyed by everything they depend on and written atomically.

pub mod corpus;
pub mod loader;
pub mod mix;
pub mod prepare;
pub mod remote;
pub mod shard;
pub mod sources;
pub mod tokenizer;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

pub use corpus::{McqRecord, Split};
pub use mix::{Mix, SourceTokens, Tokens, embedded_source_tokens, unigram_entropy};
pub use tokenizer::Tokenizer;

/// The cache directory: `$TRAINER_CACHE` if set, else `$XDG_CACHE_HOME/trainingrun`,
/// else `~/.cache/trainingrun` (the system temp directory when there is no home).
pub fn cache_dir() -> PathBuf {
    let var = |name| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = var("TRAINER_CACHE") {
        return dir;
    }
    if let Some(xdg) = var("XDG_CACHE_HOME") {
        return xdg.join("trainingrun");
    }
    match var("HOME") {
        Some(home) => home.join(".cache").join("trainingrun"),
        None => std::env::temp_dir().join("trainingrun"),
    }
}

/// Writes `bytes` to `path` through a temporary file in the same directory and a rename,
/// so readers (other ranks, later runs) never see a partial file.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let file_name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dir.join(format!(".{file_name}.{}.{}.tmp", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed)));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// SplitMix64: a fast, well-mixed 64-bit hash used for seeded, position-addressable
/// randomness (window orders, validation splits).
pub(crate) fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
pub(crate) mod test_util {
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A fresh, empty directory for one test, removed when dropped.
    pub struct TempDir(pub PathBuf);

    impl TempDir {
        pub fn new(tag: &str) -> TempDir {
            static N: AtomicU64 = AtomicU64::new(0);
            let dir = std::env::temp_dir().join(format!(
                "trainer-data-test-{tag}-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_atomic_replaces_and_leaves_no_temp_files() {
        let dir = test_util::TempDir::new("atomic");
        let path = dir.0.join("sub").join("x.json");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let names: Vec<_> =
            std::fs::read_dir(path.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("x.json")]);
    }
}
