//! Training data: the embedded synthetic corpus ([`corpus`]), the tokenizer
//! ([`tokenizer`]), the deterministic, exactly resumable weighted mix ([`mix`]), a
//! run's sources ([`sources`]), and sources prepared by `trainer prepare`
//! ([`prepare`], [`shard`], [`remote`]).
//!
//! Derived artefacts (the embedded tokenizer, large token streams) are cached on disk
//! under [`cache_dir`], keyed by everything they depend on and written atomically.

pub mod corpus;
pub mod loader;
pub mod mcq;
pub mod mix;
pub mod prepare;
pub mod remote;
pub mod shard;
pub mod sources;
pub mod split;
pub mod tokenizer;

use std::path::PathBuf;

pub use mcq::McqRecord;
pub use mix::{Mix, SourceTokens, Tokens, embedded_source_tokens, unigram_entropy};
pub use split::Split;
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

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
